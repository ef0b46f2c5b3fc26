"""tk-codegen end to end: IR out, files, warnings, exit codes.

Most cases run the command in process (tests/clirun.py: the same entry point, exit code,
stdout and stderr, without a Python start-up each); the first two start bin/tk-codegen (the
IR on a real stdout, and read from a real stdin)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tilekit.codegen.nvcc import find_nvcc
from tilekit.ir.codec import loads

from clirun import completed
from codegen_support import DATA
from tilekit.cli import tk_codegen as tk_codegen_command

ROOT = Path(__file__).resolve().parents[2]
TK_CODEGEN = ROOT / "bin" / "tk-codegen"


def tk_codegen(*args, stdin: bytes | None = None, env=None) -> subprocess.CompletedProcess:
    """`tk-codegen args` in process."""
    return completed(tk_codegen_command.main, args, None, stdin, env)


def tk_codegen_process(*args, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    """`bin/tk-codegen args` as a process."""
    return subprocess.run([sys.executable, str(TK_CODEGEN), *map(str, args)], input=stdin,
                          capture_output=True, timeout=300)


def test_writes_the_codegen_section_to_stdout():
    proc = tk_codegen_process(DATA / "softmax.yaml")
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stderr == b""
    module = loads(proc.stdout.decode())
    assert module.codegen["arch"] == "sm_90"
    assert [k["entry"] for k in module.codegen["kernels"]] == ["tk_softmax"]
    assert module.kernels[0].launch["entries"] == ["tk_softmax"]
    assert module.stages[-1] == {"name": "codegen", "options": {"arch": "sm_90",
                                                                 "compile": False}}


def test_stdin_json_and_the_output_file(tmp_path):
    out = tmp_path / "out.json"
    proc = tk_codegen_process("-", "--format", "json", "-o", out, "--arch", "sm_80",
                              stdin=(DATA / "matmul_aligned.yaml").read_bytes())
    assert proc.returncode == 0, proc.stderr.decode()
    text = out.read_text()
    assert text.startswith("{") and loads(text).codegen["arch"] == "sm_80"


def test_hw_profile_sets_the_arch():
    proc = tk_codegen(DATA / "bmm.yaml", "--hw", "a100")
    assert proc.returncode == 0, proc.stderr.decode()
    module = loads(proc.stdout.decode())
    assert module.codegen["arch"] == "sm_80"
    assert module.stages[-1]["options"]["hw"] == "a100"


def test_emit_dir(tmp_path):
    proc = tk_codegen(DATA / "gather.yaml", "--emit-dir", tmp_path / "cu", "-o", tmp_path / "o.yaml")
    assert proc.returncode == 0, proc.stderr.decode()
    names = sorted(p.name for p in (tmp_path / "cu").iterdir())
    assert names == ["runtime.cuh", "tk_k_lookup.cu", "tk_k_lookup.tile", "tk_k_scale.cu",
                     "tk_k_scale.tile"]
    assert (tmp_path / "cu" / "tk_k_lookup.cu").read_text().count('#include "runtime.cuh"') == 1


def test_unknown_opaque_type_exits_2(tmp_path):
    ir = tmp_path / "resize.yaml"
    ir.write_text("""tilekit: 1
model: r
inputs: [x]
outputs: [y]
tensors:
  x: {shape: [2, 2], dtype: float32, role: input}
  y: {shape: [4, 4], dtype: float32, role: output}
ops:
  - name: up
    kind: opaque
    opaque: {type: Resize, inputs: [x], outputs: [y], attrs: {sizes: [4, 4], mode: nearest}}
""")
    proc = tk_codegen(ir)
    assert proc.returncode == 2
    err = proc.stderr.decode()
    assert err.startswith("tk-codegen: error: ops[0] (up): opaque op type 'Resize' has no "
                          "kernel implementation; kernels exist for: ArgMax, ArgMin, Gather")
    assert proc.stdout == b""


def test_strict_needs_compile():
    proc = tk_codegen(DATA / "softmax.yaml", "--strict")
    assert proc.returncode == 2
    assert b"--strict needs --compile" in proc.stderr


def test_split_note_is_a_warning(tmp_path):
    text = (DATA / "gather.yaml").read_text()
    text += "kernels:\n  - {name: all, ops: [lookup, scale]}\n"
    ir = tmp_path / "g.yaml"
    ir.write_text(text)
    (tmp_path / "gather.weights.npz").write_bytes((DATA / "gather.weights.npz").read_bytes())
    proc = tk_codegen(ir, "-o", tmp_path / "o.yaml")
    assert proc.returncode == 0, proc.stderr.decode()
    assert "tk-codegen: warning: kernels[0] (all): split into one kernel per op" in \
        proc.stderr.decode()


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc not on PATH")
def test_compile_records_resources(tmp_path):
    proc = tk_codegen(DATA / "matmul_bias_relu.yaml", "--compile", "--strict", "--hw", "h100",
                      env={"TILEKIT_CACHE": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr.decode()
    module = loads(proc.stdout.decode())
    (record,) = module.codegen["kernels"]
    assert record["resources"]["registers"] > 0
    assert record["resources"]["smem_static"] == 2048
    assert module.codegen["compiled"]["arch"] == "sm_90"


def test_deterministic_bytes():
    a = tk_codegen(DATA / "conv_chain.yaml").stdout
    b = tk_codegen(DATA / "conv_chain.yaml").stdout
    assert a == b and a


@pytest.mark.parametrize("output", ["same", "nodir/x.yaml"])
def test_emit_dir_writes_nothing_when_the_ir_cannot_be_written(tmp_path, output):
    ir = tmp_path / "r.yaml"
    ir.write_bytes((DATA / "softmax.yaml").read_bytes())
    target = ir if output == "same" else tmp_path / output
    proc = tk_codegen(ir, "--emit-dir", tmp_path / "cu", "-o", target)
    assert proc.returncode == 2, proc.stderr.decode()
    assert not (tmp_path / "cu").exists()
    assert ir.read_bytes() == (DATA / "softmax.yaml").read_bytes()


@pytest.mark.parametrize("arch", ["sm_xx", "compute_90", "90", "sm_"])
def test_a_bad_arch_is_refused_without_compile(arch):
    proc = tk_codegen(DATA / "softmax.yaml", "--arch", arch)
    assert proc.returncode == 2
    assert proc.stdout == b""
    assert f"'{arch}' is not an NVIDIA arch" in proc.stderr.decode()


def fake_nvcc(tmp_path: Path, stderr: str) -> Path:
    """An nvcc that reports version 13.0 and rejects every compile with `stderr`."""
    script = tmp_path / "nvcc"
    script.write_text("#!/bin/sh\n"
                      'case "$1" in --version) echo "Cuda compilation tools, release 13.0, '
                      'V13.0.88"; exit 0;; esac\n'
                      f"echo '{stderr}' >&2\nexit 1\n")
    script.chmod(0o755)
    return script


def test_generated_code_that_nvcc_rejects_is_an_internal_error(tmp_path):
    """A code generator fault is tilekit's (exit 1), named with the command reproducing it;
    not a bad-input exit 2."""
    nvcc = fake_nvcc(tmp_path, "unit.cu(12): error: identifier \"tk_oops\" is undefined")
    proc = tk_codegen(DATA / "softmax.yaml", "--compile",
                      env={"TILEKIT_NVCC": str(nvcc), "TILEKIT_CACHE": str(tmp_path / "c")})
    err = proc.stderr.decode()
    assert proc.returncode == 1, err
    assert "internal error" in err and "tk_oops" in err and "reproduce with: cd " in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_an_arch_nvcc_does_not_know_is_bad_input(tmp_path):
    nvcc = fake_nvcc(tmp_path, "nvcc fatal   : Unsupported gpu architecture 'compute_20'")
    proc = tk_codegen(DATA / "softmax.yaml", "--compile", "--arch", "sm_20",
                      env={"TILEKIT_NVCC": str(nvcc), "TILEKIT_CACHE": str(tmp_path / "c")})
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert "does not support sm_20" in err and "--arch" in err
