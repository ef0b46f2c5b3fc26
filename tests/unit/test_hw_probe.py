"""tk-hw probe without a GPU: measurements -> profile, the kernels' compilation, the CLI's
refusal where CuPy or a GPU is missing.

The measuring itself needs a GPU (tests/gpu/test_probe.py). Here the measurements are written
by hand with H100-like numbers, and the CUDA sources are compiled (and their PTX read) to prove
that every benchmark's loop survives the compiler.
"""

from __future__ import annotations

import copy
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tilekit.cli.tk_hw import main
from tilekit.errors import ProfileError
from tilekit.hw import ENV_VAR, load_profile
from tilekit.runtime import probe
from tilekit.hw.edit import ProfileText, number_text
from tilekit.hw.probe_profile import (ATTRIBUTE_FIGURES, default_base, measurement_rows,
                                      probed_profile)
from tilekit.hw.registry import read_profile_text

REPO = Path(__file__).resolve().parents[2]
H100_TEXT = (REPO / "hwprofiles" / "h100.yaml").read_text()
WHEN = "NVIDIA H100 80GB HBM3, 2025-06-01"


def result(value: float, what: str) -> dict:
    return {"value": value, "what": what}


H100 = {
    "device": "NVIDIA H100 80GB HBM3", "arch": "sm_90", "date": "2025-06-01",
    "attributes": {
        "MultiProcessorCount": 132, "WarpSize": 32, "MaxThreadsPerBlock": 1024,
        "MaxThreadsPerMultiProcessor": 2048, "MaxBlocksPerMultiprocessor": 32,
        "MaxRegistersPerMultiprocessor": 65536, "MaxRegistersPerBlock": 65536,
        "MaxSharedMemoryPerMultiprocessor": 233472, "MaxSharedMemoryPerBlock": 49152,
        "MaxSharedMemoryPerBlockOptin": 232448, "L2CacheSize": 52428800,
        "ClockRate": 1980000, "MemoryClockRate": 2619000, "GlobalMemoryBusWidth": 5120,
        "CooperativeLaunch": 1, "ComputeCapabilityMajor": 9, "ComputeCapabilityMinor": 0},
    "memory_bytes": 81559 * 2**20,
    "results": {
        "dram_copy": result(3.012e12, "device-to-device copy of 2 GiB, bytes read + written"),
        "dram_read": result(3.21e12, "read-only streaming kernel over 2 GiB"),
        "l2_read": result(7.93e12, "repeated ld.global.cg reads of 8 MiB"),
        "smem_read": result(2.31e11, "conflict-free 16-byte shared-memory loads"),
        "fp32_fma": result(6.1e13, "8 independent FMA chains per thread"),
        "mma_fp16": result(6.62e14, "mma.sync m16n8k16 fp16"),
        "mma_bf16": result(6.6e14, "mma.sync m16n8k16 bf16"),
        "mma_tf32": result(3.3e14, "mma.sync m16n8k8 tf32"),
        "launch_events": result(2.2e-6, "2000 empty kernels, CUDA events"),
        "launch_wall": result(5.1e-6, "2000 empty kernels, wall clock"),
    },
    "notes": [],
}
#: The figures an H100 probe changes on h100.yaml, every other one keeps value and source.
H100_CHANGED = set(ATTRIBUTE_FIGURES) | {
    "parallelism.max_warps_per_sm", "memory[registers].capacity", "memory[dram].capacity",
    "compute.clock", "memory[dram].bandwidth", "memory[l2].bandwidth", "achievable.dram",
    "achievable.smem", "achievable.compute", "launch.overhead"}


@pytest.fixture(autouse=True)
def no_env(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)


def probed(measurements=H100, base_text=H100_TEXT, origin="hwprofiles/h100.yaml"):
    text = probed_profile(measurements, base_text, origin)
    return text, read_profile_text(text, "<probed>")


# -- measurements -> profile --------------------------------------------------------------------

def test_the_probed_profile_validates():
    text, _ = probed()
    got = CliRunner().invoke(main, ["validate", "-"], input=text)
    assert got.exit_code == 0, got.output
    assert got.stdout == "ok: -\n"


def test_measured_figures_name_the_probe_device_and_date():
    _, p = probed()
    base = load_profile("h100")
    changed = {path for path in base.sources
               if p.sources[path] != base.sources[path] or p.figure(path) != base.figure(path)}
    assert changed == H100_CHANGED
    for path in changed:
        source = p.sources[path]
        assert source.startswith(("measured: tk-hw probe (", "derived: ")), (path, source)
        assert source.endswith(WHEN), (path, source)
    assert p.sources["parallelism.sm_count"] == (
        f"measured: tk-hw probe (device attribute MultiProcessorCount) on {WHEN}")


def test_unmeasured_figures_are_unchanged():
    _, p = probed()
    base = load_profile("h100")
    for path in set(base.sources) - H100_CHANGED:
        assert p.figure(path) == base.figure(path), path
        assert p.sources[path] == base.sources[path], path
    assert p.references == base.references
    assert p.mma_shapes == base.mma_shapes and p.features == base.features


def test_rates_become_fractions_of_the_peaks_and_the_rest_is_written_as_measured():
    _, p = probed()
    assert p.dram_bandwidth == pytest.approx(3.352e12)  # 2 x 2619 MHz x 5120 bit / 8
    assert p.achievable.dram == round(3.012e12 / 3.352e12, 3)
    assert p.achievable.smem == round(2.31e11 / 253.44e9, 3)  # per SM over per SM
    assert p.achievable.compute == round(6.1e13 / 66.9e12, 3)
    assert p.l2_bandwidth == 7.93e12
    assert p.launch_overhead == pytest.approx(2.2e-6)
    assert p.sources["achievable.dram"].startswith(
        "derived: 3.012 TB/s / 3.352 TB/s (memory[dram].bandwidth)")
    # h100 lists wgmma, which mma.sync does not match: the GEMM-measured fraction stays.
    assert p.achievable.compute_tensor == 0.81


def test_identity_says_probed_and_drops_the_aliases():
    text, p = probed()
    assert p.name == "h100-probed" and p.aliases == ()
    assert "NVIDIA H100 80GB HBM3" in p.description and "2025-06-01" in p.description
    assert p.arch == "sm_90"
    # Probing a probed profile does not stack suffixes.
    again = probed_profile(H100, text, "h100-probed.yaml")
    assert read_profile_text(again, "<again>").name == "h100-probed"


def test_layout_and_comments_survive():
    text, _ = probed()
    comments = [ln for ln in H100_TEXT.splitlines() if ln.lstrip().startswith("#")]
    assert all(c in text.splitlines() for c in comments)
    assert "arch: sm_90            # nvcc target; wgmma/TMA code needs sm_90a" in text
    # A figure is rewritten on its own line, aligned as it was.
    assert re.search(r"^  sm_count:              \{value: 132, source: \"measured: ", text, re.M)
    assert len(text.splitlines()) == len(H100_TEXT.splitlines()) + 3 - 1  # header; aliases


def test_deterministic():
    again = copy.deepcopy(H100)
    again["results"] = dict(reversed(list(again["results"].items())))
    again["attributes"] = dict(reversed(list(again["attributes"].items())))
    assert probed()[0] == probed(again)[0]


def test_what_is_not_measured_stays():
    partial = copy.deepcopy(H100)
    for name in ("mma_fp16", "mma_bf16", "mma_tf32", "launch_events", "launch_wall",
                 "l2_read"):
        del partial["results"][name]
    _, p = probed(partial)
    base = load_profile("h100")
    for path in ("achievable.compute_tensor", "launch.overhead", "memory[l2].bandwidth"):
        assert (p.figure(path), p.sources[path]) == (base.figure(path), base.sources[path])


def test_tensor_fraction_where_mma_sync_is_the_fastest_instruction():
    a100 = copy.deepcopy(H100)
    a100.update(device="NVIDIA A100-SXM4-80GB", arch="sm_80")
    a100["attributes"].update(MultiProcessorCount=108, ClockRate=1410000,
                              MemoryClockRate=1593000, MaxSharedMemoryPerMultiprocessor=167936,
                              MaxSharedMemoryPerBlockOptin=166912, L2CacheSize=41943040)
    a100["results"].update(mma_fp16=result(2.9e14, "f"), mma_bf16=result(2.88e14, "b"),
                           mma_tf32=result(1.40e14, "t"))
    text, p = probed(a100, (REPO / "hwprofiles" / "a100.yaml").read_text(), "a100.yaml")
    assert p.achievable.compute_tensor == round(1.40e14 / 156e12, 3)  # the lowest: tf32
    assert p.sources["achievable.compute_tensor"].startswith(
        "derived: 140 TFLOP/s / 156 TFLOP/s (compute.tensor_core.tf32)")
    assert "fp16 290 TFLOP/s" in text  # every dtype in the note


def test_peaks_follow_sm_count_and_clock():
    pcie = copy.deepcopy(H100)
    pcie["device"] = "NVIDIA H100 PCIe"
    pcie["attributes"].update(MultiProcessorCount=114, ClockRate=1755000)
    pcie["results"]["fp32_fma"] = result(4.8e13, "fma")
    _, p = probed(pcie)
    scale = 114 * 1.755 / (132 * 1.98)
    assert p.peak_flops("fp32") == pytest.approx(66.9e12 * scale, rel=1e-3)
    assert p.peak_flops("bf16", tensor_core=True) == pytest.approx(989.4e12 * scale, rel=1e-3)
    assert p.sources["compute.simt.fp32"].startswith(
        "derived: h100's 66.9 TFLOP/s x (114 SMs x 1.755 GHz) / (132 SMs x 1.98 GHz)")
    assert p.smem_bandwidth_per_sm == pytest.approx(128 * 1.755e9, rel=1e-3)
    # The fractions are of the scaled peaks.
    assert p.achievable.compute == round(4.8e13 / p.peak_flops("fp32"), 3)


def test_another_arch_gets_its_own_features():
    ada = copy.deepcopy(H100)
    ada.update(device="NVIDIA L40S", arch="sm_89")
    _, p = probed(ada)
    assert p.arch == "sm_89"
    assert (p.features.async_copy, p.features.tma, p.features.clusters) == (True, False, False)
    assert p.sources["features"].startswith("derived: compute capability 8.9")


def test_capped_fraction_says_so():
    fast = copy.deepcopy(H100)
    fast["results"]["fp32_fma"] = result(7.0e13, "fma")
    _, p = probed(fast)
    assert p.achievable.compute == 1.0
    assert "capped at 1" in p.sources["achievable.compute"]


def test_a_base_written_otherwise_is_edited_too():
    """Block-style figures, trailing comments, and no launch section."""
    text = H100_TEXT.replace(
        "    bandwidth:   {value: 3.35, unit: TB/s, source: datasheet}\n",
        "    bandwidth:\n      value: 3.35\n      unit: TB/s\n      source: datasheet\n")
    text = text.replace("{value: 132, source: whitepaper}",
                        "{value: 132, source: whitepaper}   # GH100 has 144")
    text = text[:text.index("\nlaunch:")] + "\n"
    out, p = probed(base_text=text)
    assert p.dram_bandwidth == pytest.approx(3.352e12)
    assert "    bandwidth: {value: 3.352, unit: TB/s, source: \"derived: 2 transfers" in out
    assert re.search(r"sm_count: .*\}   # GH100 has 144$", out, re.M)
    assert p.launch_overhead == pytest.approx(2.2e-6)
    assert out.endswith("\nlaunch:\n  overhead: {value: 2.2, unit: us, source: \"measured: "
                        "tk-hw probe (2000 empty kernels, CUDA events) on " + WHEN
                        + "\", note: \"wall clock per launch on the host: 5.1 us\"}\n")


def test_a_non_nvidia_base_is_refused():
    with pytest.raises(ProfileError, match="tk-hw probe measures NVIDIA GPUs"):
        probed(base_text=(REPO / "hwprofiles" / "ipu.yaml").read_text(), origin="ipu.yaml")


def test_a_broken_base_is_refused_with_its_line():
    with pytest.raises(ProfileError, match=r"h100.yaml:\d+: parallelism.sm_count"):
        probed(base_text=H100_TEXT.replace("{value: 132, source: whitepaper}", "132"))


def test_measurement_rows():
    rows = measurement_rows(H100)
    assert rows[0] == ("DRAM copy", "3.012 TB/s",
                       "device-to-device copy of 2 GiB, bytes read + written")
    assert ("kernel launch, CUDA events", "2.2 us", "2000 empty kernels, CUDA events") in rows
    assert len(rows) == len(H100["results"])


@pytest.mark.parametrize("arch, stem", [("sm_90", "h100"), ("sm_90a", "h100"), ("sm_80", "a100"),
                                        ("sm_89", "rtx4090"), ("sm_70", "v100"),
                                        ("sm_120", "h100")])
def test_default_base(arch, stem):
    assert default_base(arch).stem == stem


def test_numbers_are_written_without_exponents():
    assert [number_text(x) for x in (4.1e-6, 3.0123e12, 66.9, 132, 0.899)] == [
        "0.0000041", "3012000000000", "66.9", "132", "0.899"]


def test_profile_text_edits():
    doc = ProfileText("a: 1  # one\nb:\n  c: {value: 2}\n  d: 3\nlist: [x]\n", "t.yaml")
    doc.set("a", "10")
    doc.set("b.c", "{value: 20}")
    doc.set("b.e", "5")
    doc.set("z.y", "6")
    doc.delete("list")
    assert doc.text() == "a: 10  # one\nb:\n  c: {value: 20}\n  d: 3\n  e: 5\n\nz:\n  y: 6\n"


# -- the kernels ------------------------------------------------------------------------------

ENTRIES = re.compile(r'extern "C" __global__ void\s+(?:__launch_bounds__\(\w+\)\s+)?(\w+)\(')
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")


def kernel_entries() -> set[str]:
    return set(ENTRIES.findall(probe.KERNELS.read_text()))


def test_every_kernel_the_probe_launches_is_in_the_source():
    source = Path(probe.__file__).read_text()
    launched = set(re.findall(r'"(tk_probe_[a-z0-9_]+)"', source))
    launched |= {f"tk_probe_mma_{dtype}" for dtype in probe.MMA_OPERANDS}
    assert len(launched) == 8 and launched == kernel_entries()


@needs_nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_kernels_compile(arch):
    from tilekit.codegen.nvcc import compile_unit

    compiled = compile_unit(probe.KERNELS.read_text(), arch)
    assert set(compiled.resources) == kernel_entries()
    for entry, res in compiled.resources.items():
        assert res.spills == 0 and res.stack == 0, entry
    # Eight accumulators of four registers each are live in every mma loop.
    assert compiled.resources["tk_probe_mma_fp16"].registers >= 32


#: entry -> (PTX instruction, how many the kernel must hold at least: one loop trip's worth).
LOOP_BODIES = {
    "tk_probe_fma": ("fma.rn.f32", probe.kernel_constant("TK_PROBE_FMA_CHAINS")
                     * probe.kernel_constant("TK_PROBE_FMA_UNROLL")),
    "tk_probe_smem_read": ("ld.shared.v4.f32", probe.kernel_constant("TK_PROBE_SMEM_LOADS")),
    "tk_probe_mma_fp16": ("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
                          probe.kernel_constant("TK_PROBE_MMA_CHAINS")),
    "tk_probe_mma_bf16": ("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
                          probe.kernel_constant("TK_PROBE_MMA_CHAINS")),
    "tk_probe_mma_tf32": ("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32",
                          probe.kernel_constant("TK_PROBE_MMA_CHAINS")),
    "tk_probe_l2_read": ("ld.global.cg.v4.f32", 4),
    "tk_probe_dram_read": ("ld.global.nc.v4.f32", 4),
}


@needs_nvcc
def test_the_loops_survive_the_compiler(tmp_path):
    """Dead-code elimination would leave a fast, empty kernel and a wrong figure: the PTX must
    hold every loop's work, and the guarded store that keeps it live."""
    ptx = tmp_path / "probe.ptx"
    subprocess.run(["nvcc", "-ptx", "-O3", "-std=c++17", "-arch=sm_80", "-o", str(ptx),
                    str(probe.KERNELS)], check=True, capture_output=True, text=True)
    text = ptx.read_text()
    bodies = dict(re.findall(r"\.entry (\w+)\((.*?)\n}\n", text, re.S))
    assert set(bodies) == kernel_entries()
    for entry, (instruction, count) in LOOP_BODIES.items():
        assert bodies[entry].count(instruction + " ") >= count, entry
        assert "st.global.f32" in bodies[entry], entry


# -- the command without a GPU ------------------------------------------------------------------

FAKE_CUPY = {
    "missing": "raise ImportError('no CuPy in this test')\n",
    "no device": "class cuda:\n    class runtime:\n"
                 "        @staticmethod\n        def getDeviceCount():\n            return 0\n",
}


@pytest.mark.parametrize("case, message", [
    ("missing", "probe: CuPy is not importable (ImportError: no CuPy in this test); "),
    ("no device", "probe: no CUDA device is visible; "),
])
def test_without_cupy_or_gpu_one_line_and_exit_2(tmp_path, case, message):
    """--gpu insists on a GPU (without it, a machine without one probes its CPU:
    test_hw_probe_cpu.py)."""
    (tmp_path / "cupy").mkdir()
    (tmp_path / "cupy" / "__init__.py").write_text(FAKE_CUPY[case])
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    out = tmp_path / "probed.yaml"
    proc = subprocess.run([sys.executable, str(REPO / "bin" / "tk-hw"), "probe", "--gpu", "-o",
                           str(out)], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == "" and not out.exists()
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("tk-hw: error: " + message), lines[0]
    assert "run it on a machine with an NVIDIA GPU" in lines[0]


@pytest.mark.parametrize("base, message", [
    ("no-such-profile", "no-such-profile: unknown hardware profile"),
    ("ipu", "hwprofiles/ipu.yaml: 'ipu' is a graphcore distributed profile; tk-hw probe "
            "measures NVIDIA GPUs"),
])
def test_a_bad_base_fails_before_looking_for_a_gpu(base, message, monkeypatch):
    monkeypatch.chdir(REPO)
    got = CliRunner().invoke(main, ["probe", "--base", base])
    assert got.exit_code == 2
    assert got.stderr.startswith("tk-hw: error: " + message), got.stderr
