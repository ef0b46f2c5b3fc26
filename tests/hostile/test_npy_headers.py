"""Class 3b: `.npy` headers are untrusted text that numpy parses as a Python literal.

numpy reads the header with `tokenize` and `ast.literal_eval`, which raise more than
ValueError on malformed text (a lone triple quote made tokenize's `TokenError`, an internal
error with exit 1). A seeded fuzz of malformed headers (mutated, truncated, random, deeply
nested, odd shapes and dtypes) goes through the header reader: every one is read or refused
with a located error that names the file; none raises anything else. Through the commands, a
bad header in an `--input` file, an `--inputs` archive or the weights sidecar exits 2 with the
file named.
"""

from __future__ import annotations

import io
import random
import struct
import zipfile

import numpy as np
import pytest

from hostile_support import assert_refused, run, sha256, write_mlp
from tilekit.errors import TilekitError
from tilekit.runtime.arrays import read_npy, read_npz

GOOD = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 4), }"
INSERTS = ["'''", '"""', "(", ")", "[", "{", "\\", "#", "\n", "L", "1e999", "*", "lambda",
           "'", "\x00", "\u00e9", "0x", "_"]
SHAPES = ["(-1,)", "(2.5,)", "('a',)", "(True,)", "(10**30,)", "[2,4]", "2", "None",
          "(1,)*100", "()", "(2, 4", "(" * 200 + ")" * 200]
DESCRS = ["<f4", "|O", "V0", "<U", "S0", "<f99", "xyz", "(('a','<f4'),)", "<M8[D]", "<m8", "",
          "<f4'", "|V2", "<c8", "|b1"]


def npy(text: str, version: int = 1) -> bytes:
    raw = text.encode("utf-8", "surrogatepass")
    if version == 1:
        return b"\x93NUMPY\x01\x00" + struct.pack("<H", min(len(raw), 65535)) + raw
    return b"\x93NUMPY" + bytes([version, 0]) + struct.pack("<I", len(raw)) + raw


def malformed_headers(count: int = 400, seed: int = 24) -> list[bytes]:
    """Seeded malformed `.npy` files: each a header and 32 bytes of data."""
    rng = random.Random(seed)
    cases = [npy("{'descr': '<f4', 'fortran_order': False, 'shape': ('''2, 4), }"),  # TokenError
             npy('{"descr": "<f4", """'), npy("(" * 5000), npy(""), b"\x93NUMPY", b"\x93NUM",
             npy(GOOD, 9)]
    while len(cases) < count:
        text = list(GOOD)
        kind = rng.randrange(6)
        if kind == 0:
            text = text[:rng.randrange(len(text))]
        elif kind == 1:
            for _ in range(rng.randrange(1, 5)):
                text[rng.randrange(len(text))] = chr(rng.randrange(256))
        elif kind == 2:
            for _ in range(rng.randrange(1, 5)):
                text.insert(rng.randrange(len(text) + 1), rng.choice(INSERTS))
        elif kind == 3:
            text = list(rng.choice("([{") * rng.randrange(1, 3000))
        elif kind == 4:
            text = [chr(rng.randrange(256)) for _ in range(rng.randrange(100))]
        else:
            text = list(GOOD.replace("(2, 4)", rng.choice(SHAPES))
                        .replace("<f4", rng.choice(DESCRS)))
        cases.append(npy("".join(text), rng.choice([1, 2, 3])) + b"\0" * 32)
    return cases


def _accept_any(name, shape, dtype, where) -> None:
    """The header check of a caller that would take any array (the fuzz looks at parsing)."""


def test_fuzzed_headers_are_read_or_refused_with_the_file_named(tmp_path):
    path = tmp_path / "fuzz.npy"
    refused = 0
    for index, data in enumerate(malformed_headers()):
        path.write_bytes(data)
        try:
            array = read_npy(path, "--input x", "x", _accept_any)
        except TilekitError as exc:
            refused += 1
            message = exc.message()
            assert "fuzz.npy" in message and message.startswith("--input x: "), (index,
                                                                                   message)
            assert "\n" not in message
        else:  # a header that happens to be valid: a real array of its own shape
            assert isinstance(array, np.ndarray), index
    assert refused > 300


def test_fuzzed_headers_as_archive_members(tmp_path):
    path = tmp_path / "fuzz.npz"
    for index, data in enumerate(malformed_headers(120, seed=7)):
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as zf:
            zf.writestr("x.npy", data)
        path.write_bytes(buffer.getvalue())
        try:
            read_npz(path, "--inputs fuzz.npz", ["x"], _accept_any)
        except TilekitError as exc:
            assert "fuzz.npz" in exc.message() and "x.npy" in exc.message(), index


TOKEN_ERROR = npy("{'descr': '<f4', 'fortran_order': False, 'shape': ('''2, 4), }") + b"\0" * 32
NESTED = npy("(" * 3000) + b"\0" * 32
DATES = npy("{'descr': '<M8[D]', 'fortran_order': False, 'shape': (2, 4), }") + b"\0" * 64


@pytest.mark.parametrize("data", [TOKEN_ERROR, NESTED, DATES], ids=["tokenize", "nested",
                                                                   "datetime"])
def test_commands_refuse_a_bad_input_header(tmp_path, data):
    ir = write_mlp(tmp_path)
    (tmp_path / "bad.npy").write_bytes(data)
    assert_refused(run("tk-run", ir, "--input", f"x=@{tmp_path / 'bad.npy'}"), "tk-run",
                   "--input x", "bad.npy")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        zf.writestr("x.npy", data)
    (tmp_path / "bad.npz").write_bytes(buffer.getvalue())
    assert_refused(run("tk-run", ir, "--inputs", tmp_path / "bad.npz"), "tk-run",
                   "--inputs", "bad.npz", "x.npy")


def test_bad_header_in_the_weights_sidecar(tmp_path):
    ir = write_mlp(tmp_path)
    sidecar = tmp_path / "mlp.weights.npz"
    with zipfile.ZipFile(sidecar) as zf:
        members = {n: zf.read(n) for n in zf.namelist()}
    members["w1.npy"] = TOKEN_ERROR
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    sidecar.write_bytes(buffer.getvalue())
    ir.write_text(ir.read_text().replace(
        __import__("json").loads(ir.read_text())["weights"]["sha256"], sha256(sidecar)))
    assert_refused(run("tk-run", ir, "--seed", "0"), "tk-run", "mlp.weights.npz", "w1.npy")
