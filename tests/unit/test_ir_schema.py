"""specs/tile-ir.schema.json agrees with the verifier on every fixture in tests/data/ir.

Good documents are valid by both. A bad document is, by its kind:
- structural: invalid by both (the default for a case not listed below);
- verifier-only: schema-valid but verifier-invalid, for rules a JSON Schema cannot express
  (uniqueness across list items, data flow, expressions against shapes, JSON-only values);
- unparsable: rejected before there is a document to validate (syntax, encoding, duplicate
  keys, several documents), so the schema has no say.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from tilekit.cli.common import read_input_text
from tilekit.errors import TilekitError
from tilekit.ir import read_module
from tilekit.ir.codec import parse_document

ROOT = Path(__file__).resolve().parent.parent.parent
SCHEMA = json.loads((ROOT / "specs" / "tile-ir.schema.json").read_text())
DATA = ROOT / "tests" / "data" / "ir"
GOOD = sorted((DATA / "good").iterdir())
BAD = sorted(p for p in (DATA / "bad").iterdir() if p.suffix != ".expect")

UNPARSABLE = {
    "binary_garbage", "control_character", "duplicate_tensor", "json_missing_comma",
    "json_nan", "json_trailing_comma", "json_truncated", "two_documents", "yaml_bad_indent",
    "yaml_truncated", "yaml_unclosed_flow",
}
VERIFIER_ONLY = {
    # data flow and names across entries
    "duplicate_op_name", "input_role_mismatch", "output_not_listed", "not_topological",
    "output_never_written", "two_writers", "writes_input", "reads_own_output",
    "opaque_undefined_input", "weights_missing",
    # opaque records against the registry (tilekit.opaque)
    "opaque_unknown_type", "opaque_output_shape",
    # expressions against shapes
    "undefined_tensor", "expr_syntax", "expr_unknown_function", "expr_extent_mismatch",
    "expr_rank_mismatch", "expr_out_of_range", "expr_assign_with_reduction",
    "expr_unknown_axis_extent",
    # kernels against ops
    "kernel_unknown_op", "kernel_op_twice", "kernel_missing_op", "kernel_order",
    "kernel_ops_out_of_order", "kernel_duplicate_name",
    # values YAML can hold but JSON cannot
    "payload_not_finite", "payload_integer_key",
}

validator = jsonschema.Draft202012Validator(SCHEMA)


def parse(path: Path):
    return parse_document(*read_input_text(str(path)))


def schema_errors(path: Path) -> list[str]:
    doc = parse(path)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
            for e in validator.iter_errors(doc)]


def test_schema_is_a_valid_2020_12_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


def test_every_listed_case_exists() -> None:
    names = {p.stem for p in BAD}
    assert (UNPARSABLE | VERIFIER_ONLY) <= names
    assert not UNPARSABLE & VERIFIER_ONLY


@pytest.mark.parametrize("path", GOOD, ids=lambda p: p.name)
def test_good_documents_are_valid_by_both(path: Path) -> None:
    assert schema_errors(path) == []
    read_module(str(path))


@pytest.mark.parametrize("path", BAD, ids=lambda p: p.name)
def test_bad_documents(path: Path) -> None:
    with pytest.raises(TilekitError):
        read_module(str(path))
    if path.stem in UNPARSABLE:
        with pytest.raises(TilekitError):
            parse(path)
    elif path.stem in VERIFIER_ONLY:
        assert schema_errors(path) == [], "the schema catches it: take it out of VERIFIER_ONLY"
    else:
        assert schema_errors(path), "schema-valid: list it in VERIFIER_ONLY if no schema can tell"
