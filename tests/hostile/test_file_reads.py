"""Class 2: no file is read through the IR (or a flag) beyond what tilekit means to read.

A profile reference resolves by name among the profile folders, or as a path that must be a
regular file within `limits.PROFILE_BYTES`; an IR's `hardware` path is relative, ends in
`.yaml`/`.yml`, and resolves from the IR's folder. Sidecars (weights, source model) must be
regular files within their budget. No message quotes a file beyond a short escaped excerpt.
"""

from __future__ import annotations

import os

import pytest

from hostile_support import assert_refused, mlp_doc, run, write_mlp

SECRET = "TOPSECRET" * 40


@pytest.fixture
def traps(tmp_path):
    """Files an attacker would point a reference at, in `tmp_path`."""
    os.symlink("/dev/zero", tmp_path / "zero.yaml")
    os.mkfifo(tmp_path / "fifo.yaml")
    (tmp_path / "dir.yaml").mkdir()
    with open(tmp_path / "big.yaml", "wb") as fh:
        fh.truncate(10 * 2**30)  # sparse: 10 GiB that cost nothing
    (tmp_path / "secret.yaml").write_text(f"password: {SECRET}\n")
    (tmp_path / "passwd.yaml").write_text("root:x:0:0:" + SECRET + ":/root:/bin/bash\n")
    return tmp_path


IR_HARDWARE = [
    ("/etc/passwd", "absolute path"),
    ("/dev/zero", "absolute path"),
    ("../../../../../../../../etc/passwd", "does not end in .yaml"),
    ("../../../../../../../../dev/zero", "does not end in .yaml"),
    ("zero.yaml", "not a regular file"),
    ("fifo.yaml", "not a regular file"),
    ("dir.yaml", "is a directory"),
    ("big.yaml", "profile size limit"),
    ("secret.yaml", "secret.yaml"),
    ("passwd.yaml", "passwd.yaml"),
    ("missing.yaml", "not found"),
    ("./sub/../zero.yaml", "not a regular file"),
    ("h100\n", "not a profile name"),
    ("h100; rm -rf /", "does not end in .yaml"),
    ("h100; rm -rf", "not a profile name"),
    ("no-such-gpu", "unknown hardware profile"),
    ("x" * 2000 + ".yaml", "too long"),
    ("a\x00.yaml", "control character"),
    ("C:\\profiles\\h100.yaml", "absolute path"),
]


@pytest.mark.parametrize("tool, extra", [("tk-codegen", []), ("tk-roll", [])])
@pytest.mark.parametrize("value, words", IR_HARDWARE, ids=lambda v: ascii(v)[:30])
def test_ir_hardware_references(traps, tool, extra, value, words):
    (traps / "sub").mkdir(exist_ok=True)
    doc = mlp_doc()
    doc["hardware"] = value
    line = assert_refused(run(tool, write_mlp(traps, doc), *extra), tool, words)
    assert SECRET[:60] not in line and "TOPSECRETTOPSECRETTOPSECRETTOPSECRETTOPSECRET" not in line


HW_FLAG = [
    ("/dev/zero", "not a regular file"),
    ("{d}/zero.yaml", "not a regular file"),
    ("{d}/fifo.yaml", "not a regular file"),
    ("{d}/dir.yaml", "is a directory"),
    ("{d}/big.yaml", "profile size limit"),
    ("{d}/secret.yaml", "secret.yaml"),
    ("{d}/passwd.yaml", "passwd.yaml"),
    ("/etc/passwd", "/etc/passwd"),
    ("{d}/none.yaml", "no such file"),
    ("{d}/" + "y" * 300 + ".yaml", "too long"),
    ("/" + "d/" * 3000 + "x.yaml", "too long"),
]


@pytest.mark.parametrize("tool, args", [("tk-roll", ["{ir}", "--hw"]),
                                        ("tk-codegen", ["{ir}", "--hw"]),
                                        ("tk-hw", ["show"]), ("tk-hw", ["validate"])])
@pytest.mark.parametrize("value, words", HW_FLAG, ids=lambda v: ascii(v)[:30])
def test_hw_flag_paths(traps, tool, args, value, words):
    ir = write_mlp(traps)
    argv = [a.format(ir=ir) for a in args] + [value.format(d=traps)]
    line = assert_refused(run(tool, *argv), tool, words)
    assert "TOPSECRETTOPSECRETTOPSECRETTOPSECRETTOPSECRET" not in line


def test_profile_folder_with_traps_still_lists_and_resolves(traps, monkeypatch):
    (traps / "big.yaml").unlink()
    monkeypatch.setenv("TILEKIT_HWPROFILES", str(traps))
    assert run("tk-hw", "show", "h100").exit_code == 0  # shipped names still resolve
    # the traps are no profiles: listing skips devices, FIFOs and YAML without profile keys
    result = run("tk-hw", "list")
    assert result.exit_code == 0 and "Traceback" not in result.stderr
    assert "TOPSECRET" not in result.stdout + result.stderr
    assert "secret" not in result.stdout and "passwd" not in result.stdout
    # a trap named by its stem is loaded as a profile and refused without quoting it
    result = run("tk-hw", "show", "secret")
    assert result.exit_code == 2 and "TOPSECRET" not in result.stderr


def test_huge_profile_in_a_folder_is_refused_not_read(traps, monkeypatch):
    monkeypatch.setenv("TILEKIT_HWPROFILES", str(traps))
    assert run("tk-hw", "show", "h100").exit_code == 0
    assert_refused(run("tk-hw", "show", "big"), "tk-hw", "profile size limit")


def test_profile_path_recorded_by_roll_still_resolves(tmp_path):
    """tk-roll records a path for a profile given by path; later stages read it back."""
    from tilekit.hw import builtin_dir
    profile = tmp_path / "prof" / "mygpu.yaml"
    profile.parent.mkdir()
    profile.write_text((builtin_dir() / "v100.yaml").read_text().replace(
        "name: v100", "name: mygpu").replace("aliases: [v100-sxm2, v100-sxm2-32gb, V100]",
                                             "aliases: []"))
    ir = write_mlp(tmp_path)
    rolled = tmp_path / "out" / "r.yaml"
    rolled.parent.mkdir()
    assert run("tk-roll", ir, "--hw", profile, "-o", rolled).exit_code == 0
    assert "hardware:\n  name: ../prof/mygpu.yaml\n  sha256: " in rolled.read_text()
    result = run("tk-codegen", rolled, "-o", tmp_path / "c.yaml")
    assert result.exit_code == 0, result.stderr


# -- sidecars ----------------------------------------------------------------------------

@pytest.mark.parametrize("value, words", [
    ("zero.yaml", "not a regular file"),
    ("fifo.yaml", "not a regular file"),
    ("dir.yaml", "is a directory"),
    ("big.yaml", "total size limit"),
    ("../../../../../../../../../dev/zero", "not a regular file"),
    ("missing.npz", "not found"),
    ("/dev/zero", "absolute path"),
    ("w\n.npz", "control character"),
])
def test_weights_file_references(traps, value, words):
    doc = mlp_doc()
    ir = write_mlp(traps, doc)
    text = ir.read_text().replace('"mlp.weights.npz"', '"' + value.replace("\n", "\\n") + '"')
    ir.write_text(text)
    assert_refused(run("tk-run", ir, "--seed", "0"), "tk-run", words)


@pytest.mark.parametrize("value, words", [
    ("fifo.yaml", "not a regular file"),
    ("zero.yaml", "not a regular file"),
    ("dir.yaml", "is a directory"),
    ("big.yaml", "model size limit"),
])
def test_source_model_references(traps, value, words):
    doc = mlp_doc()
    doc["source"] = {"onnx": value, "sha256": "1" * 64}
    ir = write_mlp(traps, doc)
    assert_refused(run("tk-run", ir, "--seed", "0", "--check"), "tk-run", words)


@pytest.mark.parametrize("content", [
    "name: " + SECRET,
    "schema: 1\nname: " + SECRET,
    SECRET,
    "- " + SECRET,
    "{a: " + SECRET + "}",
    "schema: " + SECRET,
])
def test_profile_errors_quote_only_a_short_excerpt(tmp_path, content):
    path = tmp_path / "p.yaml"
    path.write_text(content)
    line = assert_refused(run("tk-hw", "validate", path), "tk-hw")
    assert SECRET[:90] not in line
