"""Class 6: no command writes over a file it read.

One check serves every output path (`tilekit.fileio.check_not_input`, called by
`tilekit.outputs` for every staged file): the inputs of the running command are the files it
read (the IR, the model, a profile, `--input` arrays, stdin when it is a file) and the files
an IR it read refers to (weights sidecar, source model, a profile path), compared by resolved
path and by inode, so links and other spellings of a path are caught too.
"""

from __future__ import annotations

import os
import shutil

import pytest

from hostile_support import (assert_refused, mlp_doc, run, sha256, spawn, tiny_onnx, write_mlp)


@pytest.fixture
def setup(tmp_path):
    """An IR with weights, a source model and an input array; returns named paths."""
    import numpy as np
    model = tiny_onnx(tmp_path / "src.onnx")
    doc = mlp_doc()
    doc["source"] = {"onnx": "src.onnx", "sha256": sha256(model)}
    ir = write_mlp(tmp_path, doc)
    np.save(tmp_path / "x.npy", np.zeros((2, 4), np.float32))
    np.savez(tmp_path / "in.npz", x=np.zeros((2, 4), np.float32))
    from tilekit.hw import builtin_dir
    shutil.copy(builtin_dir() / "h100.yaml", tmp_path / "prof.yaml")
    paths = {"ir": ir, "weights": tmp_path / "mlp.weights.npz", "source": model,
             "npy": tmp_path / "x.npy", "npz": tmp_path / "in.npz",
             "profile": tmp_path / "prof.yaml"}
    return tmp_path, paths


def _spellings(folder, path):
    """Other names of `path`: relative with dots, a symlink, a hard link."""
    os.symlink(path, folder / "sym")
    os.link(path, folder / "hard")
    sub = folder / "sub"
    sub.mkdir(exist_ok=True)
    return {"same": path, "dotted": sub / ".." / path.name, "symlink": folder / "sym",
            "hardlink": folder / "hard"}


RUN_TARGETS = ["ir", "weights", "source", "npy", "npz"]


@pytest.mark.parametrize("spelling", ["same", "dotted", "symlink", "hardlink"])
@pytest.mark.parametrize("target", RUN_TARGETS)
def test_tk_run_never_writes_over_what_it_reads(setup, target, spelling):
    folder, paths = setup
    out = _spellings(folder, paths[target])[spelling]
    before = {k: p.read_bytes() for k, p in paths.items()}
    args = [paths["ir"], "--input", f"x=@{paths['npy']}", "--inputs", paths["npz"], "-o", out]
    assert_refused(run("tk-run", *args), "tk-run", "refusing to overwrite the input file")
    assert {k: p.read_bytes() for k, p in paths.items()} == before


@pytest.mark.parametrize("target", ["ir", "weights", "source"])
def test_tk_run_source_model_is_protected_without_check(setup, target):
    """The source model is named by the IR: protected even when --check does not read it."""
    folder, paths = setup
    assert_refused(run("tk-run", paths["ir"], "--seed", "0", "-o", paths[target]), "tk-run",
                   "refusing to overwrite")


@pytest.mark.parametrize("target", ["ir", "weights", "source", "profile"])
@pytest.mark.parametrize("spelling", ["same", "symlink", "hardlink"])
def test_tk_roll_never_writes_over_what_it_reads(setup, target, spelling):
    folder, paths = setup
    out = _spellings(folder, paths[target])[spelling]
    before = paths[target].read_bytes()
    assert_refused(run("tk-roll", paths["ir"], "--hw", paths["profile"], "-o", out), "tk-roll",
                   "refusing to overwrite")
    assert paths[target].read_bytes() == before


def test_tk_roll_protects_a_recorded_profile_path(setup):
    folder, paths = setup
    assert run("tk-roll", paths["ir"], "--hw", paths["profile"], "-o",
               folder / "r.yaml").exit_code == 0
    # the profile is h100's under another file name, which its name `h100` finds in the
    # shipped folder, so tk-roll recorded a name; record the path as a hand-made IR may
    text = (folder / "r.yaml").read_text()
    (folder / "r.yaml").write_text(text.replace("hardware:\n  name: h100\n",
                                                "hardware:\n  name: prof.yaml\n"))
    assert "hardware:\n  name: prof.yaml\n" in (folder / "r.yaml").read_text()
    before = paths["profile"].read_bytes()
    assert_refused(run("tk-codegen", folder / "r.yaml", "-o", paths["profile"]), "tk-codegen",
                   "refusing to overwrite")
    assert paths["profile"].read_bytes() == before


@pytest.mark.parametrize("target", ["ir", "weights", "source"])
def test_tk_codegen_output_is_not_an_input(setup, target):
    folder, paths = setup
    assert_refused(run("tk-codegen", paths["ir"], "-o", paths[target]), "tk-codegen",
                   "refusing to overwrite")


@pytest.mark.parametrize("victim", ["tk_k_fc1.cu", "runtime.cuh", "tk_k_relu1.cu"])
def test_emit_dir_never_writes_over_the_input_ir(tmp_path, victim):
    folder = tmp_path / "cu"
    folder.mkdir()
    ir = write_mlp(folder, name=victim)
    # the weights sidecar lives beside the IR, in the emit folder
    before = ir.read_bytes()
    out = tmp_path / "c.yaml"
    assert_refused(run("tk-codegen", ir, "--emit-dir", folder, "-o", out), "tk-codegen",
                   "refusing to overwrite the input file")
    assert ir.read_bytes() == before and not out.exists()
    assert sorted(p.name for p in folder.iterdir()) == sorted([victim, "mlp.weights.npz"])


def test_emit_dir_never_writes_over_the_weights(tmp_path):
    folder = tmp_path / "cu"
    folder.mkdir()
    doc = mlp_doc()
    doc["weights"]["file"] = "cu/tk_k_fc2.cu"
    ir = write_mlp(tmp_path, doc)
    assert_refused(run("tk-codegen", ir, "--emit-dir", folder), "tk-codegen",
                   "refusing to overwrite")


@pytest.mark.parametrize("flags", [["-o", "{m}"], ["--weights", "{m}"], ["-o", "{link}"],
                                   ["--weights", "{hard}"], ["-o", "{dotted}"]])
def test_tk_import_never_writes_over_the_model(tmp_path, flags):
    model = tiny_onnx(tmp_path / "m.onnx")
    os.symlink(model, tmp_path / "link")
    os.link(model, tmp_path / "hard")
    (tmp_path / "sub").mkdir()
    names = {"m": model, "link": tmp_path / "link", "hard": tmp_path / "hard",
             "dotted": tmp_path / "sub" / ".." / "m.onnx"}
    args = [f.format(**names) for f in flags]
    if "--weights" in args:
        args += ["-o", str(tmp_path / "o.yaml")]
    before = model.read_bytes()
    assert_refused(run("tk-import", model, *args), "tk-import", "refusing to overwrite")
    assert model.read_bytes() == before


@pytest.mark.parametrize("tool, extra", [("tk-roll", ["--hw", "h100"]), ("tk-codegen", []),
                                         ("tk-run", ["--seed", "0"])])
def test_stdin_redirected_from_the_output_file(tmp_path, tool, extra):
    """`tool -o in.json < in.json`: stdin is a file, and it is an input too."""
    ir = write_mlp(tmp_path)
    before = ir.read_bytes()
    flag_out = tmp_path / "mlp.json"
    with open(ir, "rb") as fh:
        proc = spawn(tool, *extra, "-o", flag_out, stdin=fh, capture_output=True,
                     folder=tmp_path)
    assert_refused(proc, tool, "refusing to overwrite the input file <stdin>")
    assert ir.read_bytes() == before


def test_hw_validate_reads_but_never_writes(tmp_path):
    from tilekit.hw import builtin_dir
    path = tmp_path / "p.yaml"
    shutil.copy(builtin_dir() / "a100.yaml", path)
    before = path.read_bytes()
    assert run("tk-hw", "validate", path).exit_code == 0
    assert path.read_bytes() == before
