"""The IR codec: format detection, the YAML dialect, determinism, versions, file I/O."""

from __future__ import annotations

import io
import json
from dataclasses import replace
from pathlib import Path

import pytest

from tilekit.errors import IRError, TilekitError
from tilekit.ir import (InvalidOutputError, Kernel, Module, Op, Tensor, detect_format, dumps,
                        loads, read_module, verify, write_module)

DATA = Path(__file__).resolve().parent.parent / "data" / "ir"
GOOD = sorted((DATA / "good").iterdir())


def small_module(**changes) -> Module:
    m = Module(
        model="tiny",
        tensors={"x": Tensor((4, 8), "float32", "input"),
                 "y": Tensor((4, 8), "float32", "output")},
        ops=(Op(name="relu", expr="y[i,j] = max(x[i,j], 0.0)"),),
        inputs=("x",), outputs=("y",))
    return replace(m, **changes)


@pytest.mark.parametrize("path", GOOD, ids=lambda p: p.name)
@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_good_fixtures_round_trip(path: Path, fmt: str) -> None:
    module = read_module(str(path))
    text = dumps(module, fmt)
    assert detect_format(text) == fmt
    again = loads(text, origin="<test>")
    assert again == module
    assert dumps(again, fmt) == text


def test_canonical_fixture_is_byte_stable() -> None:
    """scheduled.yaml was written by dumps: reading and writing it changes no byte."""
    text = (DATA / "good" / "scheduled.yaml").read_text()
    assert dumps(loads(text)) == text


def test_written_key_order_and_omitted_defaults() -> None:
    text = dumps(small_module(hardware="h100").with_stage("import"))
    keys = [line.split(":")[0] for line in text.splitlines() if not line.startswith(" ")]
    assert keys == ["tilekit", "model", "hardware", "stages", "inputs", "outputs", "tensors",
                    "ops"]
    assert text.startswith("tilekit: 1\n")
    assert "kind:" not in text and "kernels" not in text and "axes" not in text
    assert "  x: {shape: [4, 8], dtype: float32, role: input}\n" in text


def test_payload_keys_sorted_whatever_the_insertion_order() -> None:
    a = small_module(codegen={"b": 1, "a": {"z": 1, "y": [1, 2]}})
    b = small_module(codegen={"a": {"y": [1, 2], "z": 1}, "b": 1})
    assert dumps(a) == dumps(b)
    assert dumps(a, "json") == dumps(b, "json")
    assert dumps(a).index("  a:") < dumps(a).index("  b:")


def test_empty_payload_mapping_survives() -> None:
    m = small_module(control={}, ops=(replace(small_module().ops[0], tile={}),))
    assert loads(dumps(m)) == m
    assert loads(dumps(m, "json")) == m


def test_no_anchors_for_shared_objects() -> None:
    shared = {"block": [4, 8]}
    m = small_module(ops=(replace(small_module().ops[0], tile=shared),),
                     kernels=(Kernel("k0", ("relu",), tile=shared),))
    text = dumps(m)
    assert "&" not in text and "*id" not in text
    assert loads(text) == m


@pytest.mark.parametrize("value", [0.1, 1e-05, 5e-324, 1.7976931348623157e308, -0.0, 1e16,
                                   123456789.123456789, 2.5e-300, 3.0])
@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_floats_round_trip_exactly(value: float, fmt: str) -> None:
    m = small_module(codegen={"v": value})
    back = loads(dumps(m, fmt)).codegen["v"]
    assert type(back) is float and repr(back) == repr(value)


@pytest.mark.parametrize("text", ["yes", "no", "on", "null", "~", "true", "1e5", "010",
                                  "0x1F", "1.5", "-inf", ".inf", "2020-01-01", "", " lead",
                                  "a: b", "# not a comment", "- item", "[1]", "{a}", "'q'",
                                  'say "hi"', "multi\nline", "tab\there", "ünïcödé ✓", "@x",
                                  "%x", "!tag", "*star", "&amp", "|pipe", ">gt", "=", "1_000"])
def test_strings_that_look_like_other_things_stay_strings(text: str) -> None:
    m = small_module(codegen={"s": text, text: "key"})
    for fmt in ("yaml", "json"):
        back = loads(dumps(m, fmt)).codegen
        assert back == {"s": text, text: "key"}


def test_yaml_dialect_is_yaml_12_core() -> None:
    doc = dumps(small_module()).replace("tilekit: 1\n", "tilekit: 1\ncodegen: {a: yes, "
                                        "b: 1e-5, c: 010, d: 2020-01-01, e: .inf, f: ~}\n")
    assert loads(doc).codegen == {"a": "yes", "b": 1e-5, "c": 10, "d": "2020-01-01",
                                  "e": float("inf"), "f": None}


def test_json_detected_after_whitespace() -> None:
    text = "\n  " + dumps(small_module(), "json")
    assert detect_format(text) == "json"
    assert loads(text) == small_module()


def test_pad_zero_written_as_integer_is_accepted() -> None:
    text = dumps(small_module()).replace("    expr:", "    pad: 0\n    expr:")
    assert loads(text).ops[0].pad == "0"


def test_version_checks() -> None:
    good = dumps(small_module())
    with pytest.raises(IRError, match=r"m\.yaml: tilekit: tile IR format 7 is newer than this "
                                      r"tilekit \(reads 1\.\.2\); upgrade tilekit"):
        loads(good.replace("tilekit: 1", "tilekit: 7"), origin="m.yaml")
    with pytest.raises(IRError, match="missing the 'tilekit' format version key"):
        loads(good.replace("tilekit: 1\n", ""))
    with pytest.raises(IRError, match="must be an integer, got boolean"):
        loads(good.replace("tilekit: 1", "tilekit: true"))


def test_version_checked_before_other_keys() -> None:
    """A newer document may have keys we do not know: say 'upgrade', not 'unknown key'."""
    text = "tilekit: 3\nmodel: m\nfancy_new_section: {}\n"
    with pytest.raises(IRError, match="newer than this tilekit"):
        loads(text)


def test_unknown_key_suggests_the_known_one() -> None:
    text = dumps(small_module()).replace("outputs:", "output:")
    with pytest.raises(IRError) as info:
        loads(text, origin="m.yaml")
    assert info.value.message().startswith("m.yaml: output: unknown key 'output'; "
                                           "did you mean 'outputs'?")


def test_yaml_syntax_error_has_line_and_column() -> None:
    with pytest.raises(IRError) as info:
        loads("tilekit: 1\nmodel: [a\n", origin="m.yaml")
    assert info.value.message().startswith("m.yaml:3:1: YAML syntax error")
    assert "\n" not in info.value.message()


def test_json_duplicate_key() -> None:
    with pytest.raises(IRError, match="duplicate key 'model'"):
        loads('{"tilekit": 1, "model": "a", "model": "b"}')


def test_dumps_rejects_unknown_format() -> None:
    with pytest.raises(ValueError, match="unknown IR format"):
        dumps(small_module(), "toml")


def test_output_ends_with_one_newline_and_no_trailing_spaces() -> None:
    for fmt in ("yaml", "json"):
        text = dumps(read_module(str(DATA / "good" / "scheduled.yaml")), fmt)
        assert text.endswith("\n") and not text.endswith("\n\n")
        assert all(line == line.rstrip() for line in text.splitlines())


def test_json_output_is_plain_json() -> None:
    m = read_module(str(DATA / "good" / "scheduled.yaml"))
    doc = json.loads(dumps(m, "json"))
    assert list(doc)[:2] == ["tilekit", "model"]
    assert doc["tensors"]["x"] == {"shape": [4, 8], "dtype": "float32", "role": "input"}


# -- files ---------------------------------------------------------------------------------

def test_write_module_writes_a_file_atomically(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    write_module(small_module(), str(out), "json")
    assert loads(out.read_text()) == small_module()
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_write_module_defaults_to_yaml_on_stdout(capsys: pytest.CaptureFixture) -> None:
    write_module(small_module())
    assert capsys.readouterr().out == dumps(small_module())


def test_write_module_refuses_an_invalid_module(tmp_path: Path) -> None:
    bad = small_module(tensors={"x": Tensor((4, 8), "float32", "input"),
                                "y": Tensor((4, 8), "float99", "output")})
    with pytest.raises(InvalidOutputError, match=r"<output>: tensors\.y\.dtype: unknown dtype"):
        write_module(bad, str(tmp_path / "out.yaml"))
    assert not list(tmp_path.iterdir())


def test_write_module_refuses_to_overwrite_its_input(tmp_path: Path) -> None:
    src = tmp_path / "m.yaml"
    src.write_text(dumps(small_module()))
    with pytest.raises(TilekitError, match="refusing to overwrite the input"):
        write_module(small_module(), str(src), input_path=str(src))


def test_read_module_from_stdin(monkeypatch: pytest.MonkeyPatch) -> None:
    data = dumps(small_module(), "json").encode()
    fake = io.TextIOWrapper(io.BytesIO(data))
    monkeypatch.setattr("sys.stdin", fake)
    assert read_module("-") == small_module()


def test_read_module_verifies(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(dumps(small_module()).replace("max(x[i,j], 0.0)", "max(q[i,j], 0.0)"))
    with pytest.raises(TilekitError) as info:
        read_module(str(path))
    assert info.value.message().startswith(f"{path}: ops[0].expr: ")


def test_loads_alone_does_not_judge_values() -> None:
    """loads checks structure; values are verify's (so tools can report both the same way)."""
    text = dumps(small_module()).replace("dtype: float32, role: input", "dtype: f7, role: input")
    m = loads(text)
    assert m.tensors["x"].dtype == "f7"
    with pytest.raises(IRError, match="unknown dtype 'f7'"):
        verify(m)
