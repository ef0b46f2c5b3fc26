"""Class 4: special files named as outputs are streamed to or refused, never replaced.

stdout, a FIFO or a character device is written in place; a symlink is followed (its target
written, the link kept); a directory, block device, socket or symlink loop is refused. Only a
regular file (or a new name) goes through the temporary file and the rename. Device nodes are
made in a temporary folder (`mknod`, as root), never the system's own `/dev/null`.
"""

from __future__ import annotations

import os
import socket
import stat
import threading

import pytest

from hostile_support import assert_refused, run, spawn, tiny_onnx, write_mlp

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")


def _writers(tmp_path):
    """(tool, args before the output path, flag) for every output flag of every command."""
    ir = write_mlp(tmp_path)
    model = tiny_onnx(tmp_path / "m.onnx")
    return {
        "tk-roll -o": ("tk-roll", [ir, "--hw", "h100", "-o"]),
        "tk-codegen -o": ("tk-codegen", [ir, "-o"]),
        "tk-import -o": ("tk-import", [model, "--weights", tmp_path / "w.npz", "-o"]),
        "tk-import --weights": ("tk-import", [model, "-o", tmp_path / "i.yaml", "--weights"]),
        "tk-run -o": ("tk-run", [ir, "--seed", "0", "-o"]),
    }


WRITERS = ["tk-roll -o", "tk-codegen -o", "tk-import -o", "tk-import --weights", "tk-run -o"]


def _drain(path, sink: list):
    def read():
        with open(path, "rb") as fh:
            sink.append(fh.read())
    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


@root_only
@pytest.mark.parametrize("writer", WRITERS)
@pytest.mark.parametrize("via_link", [False, True])
def test_character_device_is_written_in_place(tmp_path, writer, via_link):
    tool, args = _writers(tmp_path)[writer]
    null = tmp_path / "null"
    os.mknod(null, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # what /dev/null is
    target = null
    if via_link:
        target = tmp_path / "out.link"
        os.symlink(null, target)
    result = run(tool, *args, target)
    assert result.exit_code == 0, result.stderr
    assert stat.S_ISCHR(os.lstat(null).st_mode) and os.stat(null).st_rdev == os.makedev(1, 3)
    assert os.path.islink(target) == via_link


@pytest.mark.parametrize("writer", WRITERS)
@pytest.mark.parametrize("via_link", [False, True])
def test_fifo_receives_the_data(tmp_path, writer, via_link):
    tool, args = _writers(tmp_path)[writer]
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    target = fifo
    if via_link:
        target = tmp_path / "pipe.link"
        os.symlink(fifo, target)
    got: list[bytes] = []
    reader = _drain(fifo, got)
    result = run(tool, *args, target)
    reader.join(20)
    assert result.exit_code == 0, result.stderr
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and got and got[0]
    assert os.path.islink(target) == via_link


@pytest.mark.parametrize("writer", WRITERS)
def test_symlink_to_a_regular_file_is_followed(tmp_path, writer):
    tool, args = _writers(tmp_path)[writer]
    real = tmp_path / "real.out"
    real.write_text("old")
    link = tmp_path / "out.link"
    os.symlink(real, link)
    assert run(tool, *args, link).exit_code == 0
    assert os.path.islink(link) and os.readlink(link) == str(real)
    assert real.read_bytes() != b"old" and real.stat().st_size > 0


@pytest.mark.parametrize("writer", WRITERS)
def test_dangling_symlink_creates_its_target(tmp_path, writer):
    tool, args = _writers(tmp_path)[writer]
    link = tmp_path / "out.link"
    os.symlink(tmp_path / "made.out", link)
    assert run(tool, *args, link).exit_code == 0
    assert os.path.islink(link) and (tmp_path / "made.out").stat().st_size > 0


@pytest.mark.parametrize("writer", WRITERS)
@pytest.mark.parametrize("kind", ["loop", "directory", "socket", "missing_folder",
                                  "link_to_directory"])
def test_unwritable_kinds_are_refused(tmp_path, writer, kind):
    tool, args = _writers(tmp_path)[writer]
    target = tmp_path / "t"
    if kind == "loop":
        os.symlink(tmp_path / "t2", target)
        os.symlink(target, tmp_path / "t2")
        words = ("cannot write",)
    elif kind == "directory":
        target.mkdir()
        words = ("is a directory",)
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(target))
        words = ("not a regular file, a FIFO or a character device",)
    elif kind == "missing_folder":
        target = tmp_path / "nowhere" / "t"
        words = ("does not exist",)
    else:
        (tmp_path / "d").mkdir()
        os.symlink(tmp_path / "d", target)
        words = ("is a directory",)
    before = sorted(p.name for p in tmp_path.iterdir())
    assert_refused(run(tool, *args, target), tool, *words)
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@root_only
@pytest.mark.parametrize("writer", WRITERS)
def test_block_device_is_refused(tmp_path, writer):
    tool, args = _writers(tmp_path)[writer]
    disk = tmp_path / "disk"
    os.mknod(disk, stat.S_IFBLK | 0o600, os.makedev(7, 250))
    assert_refused(run(tool, *args, disk), tool, "not a regular file")
    assert stat.S_ISBLK(os.lstat(disk).st_mode)


def _dev_stdout_named(tmp_path, how: str) -> str:
    """`/dev/stdout` itself, or a name that reaches it through links: a link, a chain of two
    links, a link to the folder /dev."""
    if how == "direct":
        return "/dev/stdout"
    if how == "link":
        os.symlink("/dev/stdout", tmp_path / "out.link")
        return str(tmp_path / "out.link")
    if how == "chain":
        os.symlink("/dev/stdout", tmp_path / "hop2")
        os.symlink("hop2", tmp_path / "hop1")
        return str(tmp_path / "hop1")
    os.symlink("/dev", tmp_path / "devices")
    return str(tmp_path / "devices" / "stdout")


@pytest.mark.parametrize("how", ["direct", "link", "chain", "folder_link"])
@pytest.mark.parametrize("tool, args", [("tk-roll", ["--hw", "h100"]), ("tk-codegen", []),
                                        ("tk-run", ["--seed", "0"])])
def test_dev_stdout_streams_to_a_file_redirect(tmp_path, tool, args, how):
    """`-o /dev/stdout` with stdout redirected to a file: the file is written, not replaced
    (the shell's descriptor keeps pointing at the same inode); the same when -o names a
    symlink that leads to /dev/stdout (it wrote a new file over the redirect's, so the shell
    went on writing into a deleted one)."""
    ir = write_mlp(tmp_path)
    target = _dev_stdout_named(tmp_path, how)
    out = tmp_path / "captured"
    with open(out, "wb") as fh:
        inode = os.fstat(fh.fileno()).st_ino
        proc = spawn(tool, ir, *args, "-o", target, stdout=fh, stderr=None)
        assert os.fstat(fh.fileno()).st_nlink == 1  # not deleted
    assert proc.returncode == 0
    assert out.stat().st_ino == inode and out.stat().st_size > 0
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_dev_stdout_streams_to_a_pipe(tmp_path):
    proc = spawn("tk-roll", write_mlp(tmp_path), "--hw", "h100", "-o", "/dev/stdout")
    assert proc.returncode == 0 and proc.stdout.startswith(b"tilekit: 1\n")


def test_emit_dir_entries_are_special_files(tmp_path):
    """An emitted source whose name is a FIFO in the folder is streamed to, not replaced."""
    ir = write_mlp(tmp_path)
    folder = tmp_path / "cu"
    folder.mkdir()
    fifo = folder / "tk_k_fc1.cu"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = _drain(fifo, got)
    result = run("tk-codegen", ir, "--emit-dir", folder, "-o", tmp_path / "c.yaml")
    reader.join(20)
    assert result.exit_code == 0, result.stderr
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and b"__global__" in got[0]


@pytest.mark.parametrize("planted", ["tk_k_fc1.cu", "runtime.cuh"])
def test_links_planted_where_codegen_names_files_are_refused(tmp_path, planted):
    """Files tk-codegen names itself are never written through a symlink: a link planted in
    a shared folder cannot redirect the write (here, onto a victim file)."""
    ir = write_mlp(tmp_path)
    folder = tmp_path / "cu"
    folder.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("precious")
    os.symlink(victim, folder / planted)
    assert_refused(run("tk-codegen", ir, "--emit-dir", folder, "-o", tmp_path / "c.yaml"),
                   "tk-codegen", "symbolic link")
    assert victim.read_text() == "precious" and not (tmp_path / "c.yaml").exists()


def test_link_planted_at_the_default_weights_name_is_refused(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    os.symlink(victim, tmp_path / "m.weights.npz")
    model = tiny_onnx(tmp_path / "model.onnx")
    assert_refused(run("tk-import", model, "-o", tmp_path / "m.yaml"), "tk-import",
                   "symbolic link")
    assert victim.read_text() == "precious"
    # named explicitly, the link is the user's choice and is followed
    assert run("tk-import", model, "-o", tmp_path / "m.yaml", "--weights",
               tmp_path / "m.weights.npz").exit_code == 0
    assert os.path.islink(tmp_path / "m.weights.npz") and victim.read_bytes()[:2] == b"PK"
