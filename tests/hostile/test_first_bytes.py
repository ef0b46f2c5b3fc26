"""Class 1b: an input that cannot be what it should is refused from its first bytes, and an
output FIFO without a reader is given up on.

`/dev/zero`, `/dev/urandom` or an endless stream given as a model or an IR document were read
to their budget (2 GiB for a model) before the parser refused them. Now a model's top-level
protobuf fields and a document's UTF-8 text are checked block by block as they arrive
(`tilekit.fileio.StartCheck`): the tests count what a producer managed to push into the
command before it gave up, and require that to be a few blocks, not the budget. A model
made of real ONNX files still passes the check (every ONNX file onnx ships with its tests).

`-o FIFO` with no reader blocked forever: a FIFO is opened without blocking and given
`TILEKIT_MAX_FIFO_WAIT` seconds for a reader (docs/limits.md).
"""

from __future__ import annotations

import os
import random
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hostile_support import BIN, assert_refused, run, spawn, temporaries, tiny_onnx, write_mlp
from tilekit import limits
from tilekit.errors import TilekitError
from tilekit.fileio import ProtobufStart, TextStart

#: What a producer may have pushed before the command refused: the first blocks it read
#: (1 MiB each) and the pipe's buffer, far below any budget.
PUSHED_AT_MOST = 16 * 2**20


def _feed_and_count(tool: str, args, chunk: bytes | None, seed: int | None = None):
    """Run `tool` with a pipe on stdin that a thread fills with `chunk` (or seeded random
    bytes) until the command stops reading; returns (process result, bytes pushed)."""
    proc = subprocess.Popen([sys.executable, str(BIN / tool), *map(str, args)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    pushed = [0]
    rng = random.Random(seed)

    def produce() -> None:
        try:
            while pushed[0] < 2**31:
                block = chunk if chunk is not None else rng.randbytes(1 << 16)
                proc.stdin.write(block)
                pushed[0] += len(block)
        except (BrokenPipeError, ValueError, OSError):
            pass
    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    out, err = proc.stdout.read(), proc.stderr.read()
    proc.wait(timeout=120)
    thread.join(60)
    with __import__("contextlib").suppress(OSError):
        proc.stdin.close()
    result = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    return result, pushed[0]


@pytest.mark.parametrize("source, words", [(b"\0" * 65536, "byte 0 (0x00)"),
                                           (None, "not an ONNX model"),
                                           (b"y\n" * 32768, "looks like text")],
                         ids=["zeros", "random", "text"])
def test_endless_junk_as_a_model_is_refused_from_its_first_bytes(source, words):
    result, pushed = _feed_and_count("tk-import", [], source, seed=3)
    assert_refused(result, "tk-import", "<stdin>", "not an ONNX model", words)
    assert pushed < PUSHED_AT_MOST


@pytest.mark.parametrize("source, words", [(b"\0" * 65536, "control character"),
                                           (None, "not UTF-8 text")],
                         ids=["zeros", "random"])
def test_endless_junk_as_a_document_is_refused_from_its_first_bytes(source, words):
    result, pushed = _feed_and_count("tk-roll", ["--hw", "h100"], source, seed=4)
    assert_refused(result, "tk-roll", "<stdin>", words)
    assert pushed < PUSHED_AT_MOST


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_devices_as_model_and_document(device):
    """At the default budgets (2 GiB, 256 MiB): refused by what the bytes are, not by size."""
    if not os.path.exists(device):
        pytest.skip(f"no {device}")
    assert_refused(run("tk-import", device), "tk-import", device, "not an ONNX model")
    line = assert_refused(run("tk-codegen", device), "tk-codegen", device)
    if device == "/dev/zero":
        assert "control character" in line, line
    else:   # random bytes: not UTF-8 text, or, one run in 256, a first byte of 0x08, which
        # is how a serialised ONNX model starts (the message then says to run tk-import)
        assert "not UTF-8" in line or "is an ONNX model, not tile IR" in line, line


def _onnx_files() -> list[Path]:
    import onnx

    root = Path(onnx.__file__).parent / "backend" / "test" / "data"
    return sorted(root.rglob("*.onnx"))


def test_every_onnx_file_passes_the_model_check():
    files = _onnx_files()
    if not files:
        pytest.skip("onnx ships no test models here")
    for path in files:
        data = path.read_bytes()
        check = ProtobufStart(str(path), "ONNX model", limits.MODEL_BYTES)
        for start in range(0, len(data), 4093):  # blocks that split tags and lengths
            check.feed(data[start:start + 4093])
        check.end()


def test_the_model_check_in_pieces_of_one_byte(tmp_path):
    data = tiny_onnx(tmp_path / "m.onnx", size=300).read_bytes()
    check = ProtobufStart("m", "ONNX model", limits.MODEL_BYTES)
    for byte in data:
        check.feed(bytes([byte]))
    bad = ProtobufStart("m", "ONNX model", limits.MODEL_BYTES)
    with pytest.raises(TilekitError, match=r"byte 0 \(0x08\)"):
        bad.feed(b"\x08\x80\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01")  # an 11-byte varint


def test_a_field_longer_than_the_model_budget():
    """A field over the budget is the budget's error (raise it if trusted); one over what
    any protobuf message holds (2 GiB) is not an ONNX model, whatever the budget (random
    bytes, /dev/urandom, declared 44 PB at byte 0 once)."""
    from dataclasses import replace
    small = replace(limits.MODEL_BYTES, env="A_TESTS_SMALL_BUDGET", default=4096)
    check = ProtobufStart("m", "ONNX model", small)
    with pytest.raises(TilekitError, match="model size limit"):
        check.feed(b"\x3a\x80\x40")  # graph, 8,192 bytes
    check = ProtobufStart("m", "ONNX model", limits.MODEL_BYTES)
    with pytest.raises(TilekitError, match=r"not an ONNX model: the field at byte 0 declares "
                                           r"34,359,738,367 bytes, more than a protobuf"):
        check.feed(b"\x3a\xff\xff\xff\xff\x7f")  # graph, 2^35 - 1 bytes


def test_text_check_across_blocks():
    check = TextStart("d", "IR")
    text = "model: caf\u00e9 \u2603\n".encode() * 3
    for byte in text:  # multi-byte characters split between blocks
        check.feed(bytes([byte]))
    check.end()
    with pytest.raises(TilekitError, match=r"byte 4\)"):
        TextStart("d", "IR").feed(b"abcd\xff")
    with pytest.raises(TilekitError, match="byte 2"):
        broken = TextStart("d", "IR")
        broken.feed(b"ab\xc3")
        broken.end()


def test_a_document_with_valid_text_still_reaches_its_parser(tmp_path):
    path = tmp_path / "d.yaml"
    path.write_text("tilekit: 1\nmodel: [unclosed\n")
    assert_refused(run("tk-roll", path, "--hw", "h100"), "tk-roll", "d.yaml")


# -- an output FIFO without a reader --------------------------------------------------------

def test_fifo_without_a_reader_is_given_up(tmp_path):
    ir = write_mlp(tmp_path)
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    proc = spawn("tk-roll", ir, "--hw", "h100", "-o", fifo,
                 env={"TILEKIT_MAX_FIFO_WAIT": "1"}, timeout=60)
    assert_refused(proc, "tk-roll", "no reader opened the FIFO within 1 s",
                   "TILEKIT_MAX_FIFO_WAIT", str(fifo))
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and temporaries(tmp_path) == []


def test_fifo_whose_reader_comes_late_gets_the_data(tmp_path):
    ir = write_mlp(tmp_path)
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    proc = subprocess.Popen([sys.executable, str(BIN / "tk-roll"), str(ir), "--hw", "h100",
                             "-o", str(fifo)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    time.sleep(1)  # the command may be waiting already: that is what is tested
    with open(fifo, "rb") as reader:
        data = reader.read()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert data.startswith(b"tilekit: 1\n")


def test_fifo_wait_in_process(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEKIT_MAX_FIFO_WAIT", "1")
    limits.reset()
    fifo = tmp_path / "w.fifo"
    os.mkfifo(fifo)
    model = tiny_onnx(tmp_path / "m.onnx")
    result = run("tk-import", model, "-o", tmp_path / "m.yaml", "--weights", fifo)
    assert_refused(result, "tk-import", "no reader", "--weights")
    assert not (tmp_path / "m.yaml").exists() and temporaries(tmp_path) == []
