"""Class 1: no code injection into generated CUDA through names.

Every name that reaches generated code, a file name or an archive member is an identifier
(`tilekit.ir.names`), checked by the verifier in every name field; the emitters print names
only as identifiers and comment text only through `comment_text`, and refuse any line that
could end a comment early or add a line. The last tests build modules with hostile names in
every field *without* the verifier and check what the code generator prints.
"""

from __future__ import annotations

import copy
import re
from dataclasses import replace

import pytest

from hostile_support import (HOSTILE_NAMES, assert_refused, mlp_doc, run, tiny_onnx, write_doc,
                             write_mlp)
from tilekit.tile.emit import Emitter, UnsafeText, check_line, comment_text
from tilekit.codegen.module import generate
from tilekit.ir.model import Kernel, Module, Op, Tensor
from tilekit.ir.names import MAX_NAME_LENGTH, is_identifier

#: Where a name can sit in an IR document, as a function doc, name -> doc.


def _rename_tensor(doc: dict, old: str, new: str) -> dict:
    doc["tensors"] = {new if k == old else k: v for k, v in doc["tensors"].items()}
    doc["inputs"] = [new if n == old else n for n in doc["inputs"]]
    for op in doc["ops"]:
        op["expr"] = op["expr"].replace(f"{old}[", f"{new}[")
    return doc


def _set(path: tuple, value):
    def edit(doc: dict) -> dict:
        target = doc
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        return doc
    return edit


FIELDS = {
    "model": lambda doc, n: _set(("model",), n)(doc),
    "tensor": lambda doc, n: _rename_tensor(doc, "x", n),
    "op": lambda doc, n: _set(("ops", 0, "name"), n)(doc),
    "kernel": lambda doc, n: {**doc, "kernels": [{"name": n, "ops": ["fc1"]},
                                                 {"name": "k1", "ops": ["relu1"]},
                                                 {"name": "k2", "ops": ["fc2"]}]},
    "axis": lambda doc, n: _set(("ops", 1, "axes"), {n: 2})(doc),
}


@pytest.mark.parametrize("field", sorted(FIELDS))
@pytest.mark.parametrize("name", HOSTILE_NAMES, ids=lambda n: ascii(n)[:24])
def test_verifier_refuses_hostile_names_in_every_field(tmp_path, field, name):
    doc = FIELDS[field](mlp_doc(), name)
    ir = write_mlp(tmp_path, doc)
    line = assert_refused(run("tk-codegen", ir, "--emit-dir", tmp_path / "cu"), "tk-codegen")
    assert line.isprintable() and len(line) < 600  # quoted only as a short escaped excerpt
    assert not (tmp_path / "cu").exists()


@pytest.mark.parametrize("name", ["x", "_", "X1", "a_b_c", "k" * MAX_NAME_LENGTH])
def test_identifiers_at_the_limit_are_accepted(tmp_path, name):
    doc = mlp_doc()
    doc["model"] = name
    doc["ops"][0]["name"] = name
    result = run("tk-codegen", write_mlp(tmp_path, doc), "--emit-dir", tmp_path / "cu")
    assert result.exit_code == 0, result.stderr
    assert all(is_identifier(p.stem) or p.name == "runtime.cuh"
               for p in (tmp_path / "cu").iterdir())


@pytest.mark.parametrize("value", ["Gather\nint PWNED;", "gather", "../Gather", "G\u00e4ther"])
def test_unknown_or_hostile_opaque_types_are_refused(tmp_path, value):
    doc = {"tilekit": 1, "model": "m", "inputs": ["ids"], "outputs": ["y"],
           "weights": {"file": "w.npz", "sha256": "0" * 64},
           "tensors": {"ids": {"shape": [2], "dtype": "int64", "role": "input"},
                       "t": {"shape": [4, 3], "dtype": "float32", "role": "weight"},
                       "y": {"shape": [2, 3], "dtype": "float32", "role": "output"}},
           "ops": [{"name": "g", "kind": "opaque",
                    "opaque": {"type": value, "inputs": ["t", "ids"], "outputs": ["y"]}}]}
    assert_refused(run("tk-codegen", write_doc(tmp_path / "m.json", doc)), "tk-codegen",
                   "opaque")


# -- the importer makes identifiers of whatever names a model has ------------------------

@pytest.mark.parametrize("node_name, tensor", [
    ('mul\n#include "x"', "in\nint PWNED;"),
    ("n*/", "a/b:0"),
    ("\u00fcber", "\u0442\u0435\u043d\u0437\u043e\u0440"),
    ("x" * 500, "y" * 500),
    ("a.b", "a_b"),            # two names that sanitise alike stay distinct
    ("", "1234"),
    ("\\", "??/"),
])
def test_imported_names_are_identifiers_and_code_generates(tmp_path, node_name, tensor):
    model = tiny_onnx(tmp_path / "m.onnx", node_name=node_name, x=tensor, w=tensor + "_w")
    ir = tmp_path / "m.yaml"
    result = run("tk-import", model, "-o", ir)
    assert result.exit_code == 0, result.stderr
    out = run("tk-codegen", ir, "--emit-dir", tmp_path / "cu", "-o", tmp_path / "c.yaml")
    assert out.exit_code == 0, out.stderr
    from tilekit.ir import read_module
    module = read_module(str(ir))
    names = [module.model, *module.tensors, *(op.name for op in module.ops),
             *(k.name for k in module.kernels)]
    assert all(is_identifier(n) for n in names), names
    for source in (tmp_path / "cu").glob("*.cu"):
        for line in source.read_text().splitlines():
            check_line(line)
            assert "PWNED;" not in line and '#include "x"' not in line


@pytest.mark.parametrize("stem", ["my model", "m\u00f6del", "1st", "a;b", "x" * 200])
def test_model_file_names_become_identifier_model_names(tmp_path, stem):
    model = tiny_onnx(tmp_path / f"{stem}.onnx")
    result = run("tk-import", model, "-o", tmp_path / "m.yaml")
    assert result.exit_code == 0, result.stderr
    from tilekit.ir import read_module
    assert is_identifier(read_module(str(tmp_path / "m.yaml")).model)


# -- the emitters themselves -------------------------------------------------------------

@pytest.mark.parametrize("text", ["a\nb", "a\r\nb", "a\\", "a??/", "x*/y", "\u00e9", "\x00",
                                  "tab\there", "ok: [1, 2] x:3 (from roll)"])
def test_comment_text_is_one_safe_line(text):
    out = comment_text(text)
    assert re.fullmatch(r"[A-Za-z0-9 _.,:;=+\-*/%<>!&|^~#@$'\"()\[\]{}]*", out)
    assert "\\" not in out and "?" not in out and "\n" not in out and "\r" not in out
    e = Emitter()
    e.comment(text)
    assert e.text().count("\n") == max(1, len(text.splitlines()))


@pytest.mark.parametrize("line", ["int x;\nint y;", "int x; // a\\", "// a\rb", "x = 'é';",
                                  "// a??/", "int x;\\"])
def test_check_line_refuses_lines_that_change_the_code(line):
    with pytest.raises(UnsafeText):
        check_line(line)
    with pytest.raises(UnsafeText):
        Emitter().line(line)


_ALLOWED_DIRECTIVES = {'#include "runtime.cuh"', "#define TK_USE_HALF 1", "#pragma unroll"}


def _hostile_module(name: str) -> Module:
    """A module whose model, op, kernel and (opaque) tensor names are all `name`-derived,
    built without the verifier: an expr op and an opaque Gather with CUDA code."""
    tensors = {
        "x": Tensor((4, 8), "float32", "input"),
        f"ids{name}": Tensor((3,), "int64", "input"),
        "h": Tensor((4, 8), "float32"),
        f"table{name}": Tensor((10, 8), "float32", "weight"),
        f"emb{name}": Tensor((3, 8), "float32", "output"),
        "y": Tensor((4, 8), "float32", "output"),
    }
    ops = (Op(name=f"relu{name}", expr="h[i,j] = max(x[i,j], 0.0)", origin=name),
           Op(name=f"neg{name}", expr="y[i,j] = -h[i,j]"),
           Op(name=f"gather{name}", kind="opaque",
              opaque={"type": "Gather", "inputs": [f"table{name}", f"ids{name}"],
                      "outputs": [f"emb{name}"], "attrs": {"axis": 0}}))
    kernels = (Kernel(name=f"k{name}", ops=(f"relu{name}", f"neg{name}")),
               Kernel(name=f"g{name}", ops=(f"gather{name}",)))
    return Module(model=f"m{name}", tensors=tensors, ops=ops, inputs=("x", f"ids{name}"),
                  outputs=("y", f"emb{name}"), kernels=kernels,
                  weights={"file": "w.npz", "sha256": "0" * 64})


@pytest.mark.parametrize("name", [n for n in HOSTILE_NAMES if n], ids=lambda n: ascii(n)[:24])
def test_emitters_print_no_unvalidated_name(name):
    """No byte of generated code outside an identifier or an escaped comment comes from a
    name: every line is printable ASCII, comments are `comment_text`, and with comments
    removed the code holds nothing of the payload but identifier characters."""
    result = generate(_hostile_module(name))
    payload_words = {w for w in re.findall(r"[A-Za-z]{4,}", name)} | {"PWNED", "system"}
    for kernel in result.kernels:
        source = kernel.source
        assert source.isascii()
        for line in source.splitlines():
            check_line(line)
            code = line.split("//", 1)[0]
            if code.lstrip().startswith("#"):
                assert code.strip() in _ALLOWED_DIRECTIVES, line
                continue
            for word in payload_words - {"ids", "table", "relu", "gather"}:
                assert word not in code or re.search(rf"[A-Za-z0-9_]{word}|{word}[A-Za-z0-9_]",
                                                     code), (word, line)
        # identifiers made from names hold identifier characters only
        for ident in re.findall(r"\bt_\w+|\btk_\w+", source):
            assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", ident)
        assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", kernel.entry)


def test_emitters_keep_the_module_valid_for_valid_names():
    module = replace(_hostile_module("_ok"), weights={"file": "w.npz", "sha256": "0" * 64})
    from tilekit.ir.verify import verify
    verify(module)
    assert len(generate(module).kernels) == 2


def test_hostile_names_in_a_codegen_section_are_not_trusted(tmp_path):
    """A document that carries kernel sources is verified like any other: a hostile op
    name is refused before anything reads the sources."""
    doc = copy.deepcopy(mlp_doc())
    doc["ops"][0]["name"] = 'a\n#include "/etc/shadow"'
    doc["codegen"] = {"arch": "sm_90", "kernels": [{"source": '#include "/etc/shadow"\n'}]}
    for tool, extra in (("tk-run", ["--seed", "0"]), ("tk-codegen", []),
                        ("tk-roll", ["--hw", "h100"])):
        assert_refused(run(tool, write_mlp(tmp_path, copy.deepcopy(doc)), *extra), tool,
                       "bad op name")


# -- kernel sources recorded in an IR ------------------------------------------------------

@pytest.fixture
def generated(tmp_path):
    ir = write_mlp(tmp_path)
    out = tmp_path / "c.yaml"
    assert run("tk-codegen", ir, "--hw", "a100", "-o", out).exit_code == 0
    from tilekit.ir import read_module
    return read_module(str(out))


def test_recorded_kernels_that_tk_codegen_wrote_pass(generated):
    from tilekit.codegen.recorded import check_recorded_kernels
    check_recorded_kernels(generated)


@pytest.mark.parametrize("key, value", [
    ("source", 'extern "C" __global__ void tk_k_fc1() { asm("trap;"); }\n'),
    ("grid", [1 << 30, 1, 1]),
    ("block", [1024, 1, 1]),
    ("smem_bytes", 1 << 20),
    ("args", ["w1", "x", "t1"]),
    ("entry", "tk_other"),
])
def test_tampered_recorded_kernels_are_refused(generated, key, value):
    """What the CUDA runtime would compile and launch must be what tk-codegen writes for
    the IR: a hand-edited source or launch geometry is refused before anything runs."""
    from tilekit.codegen.recorded import check_recorded_kernels
    from tilekit.errors import TilekitError
    kernels = [dict(k) for k in generated.codegen["kernels"]]
    kernels[0][key] = value
    tampered = replace(generated, codegen={**generated.codegen, "kernels": kernels})
    with pytest.raises(TilekitError, match=f"codegen.kernels.0.?.{key}|records"):
        check_recorded_kernels(tampered)


def test_tampered_launch_entries_and_placements_are_refused(generated):
    """The runtime finds each group's kernels by `kernels[].launch.entries` and each control
    op's by `codegen.control`: a renamed entry would launch another kernel, or none."""
    from tilekit.codegen.recorded import check_recorded_kernels
    from tilekit.errors import TilekitError
    kernels = list(generated.kernels)
    kernels[0] = replace(kernels[0], launch={**kernels[0].launch, "entries": ["tk_bogus"]})
    with pytest.raises(TilekitError, match=r"kernels\[0\] \(.*\)\.launch\.entries"):
        check_recorded_kernels(replace(generated, kernels=tuple(kernels)))
    with pytest.raises(TilekitError, match="codegen.control"):
        check_recorded_kernels(replace(generated, codegen={
            **generated.codegen, "control": {"loop": {"run": "device", "entry": "tk_x"}}}))


def test_recorded_kernels_with_another_arch_or_count(generated):
    from tilekit.codegen.recorded import check_recorded_kernels
    from tilekit.errors import TilekitError
    with pytest.raises(TilekitError, match="records 2 kernels"):
        check_recorded_kernels(replace(generated, codegen={
            **generated.codegen, "kernels": generated.codegen["kernels"][:2]}))


def test_kernels_generated_by_a_library_call_for_a_profile_pass(tmp_path):
    """`generate(module, profile)` records no codegen stage: the check finds the profile."""
    from tilekit.codegen.recorded import check_recorded_kernels
    from tilekit.hw import load_profile
    from tilekit.ir import read_module
    module = read_module(str(write_mlp(tmp_path)))
    check_recorded_kernels(generate(module, load_profile("v100")).module)


def test_a_view_added_to_a_recorded_cpu_kernel_is_refused(tmp_path):
    """The compiled CPU runtime gives a kernel marked `view` in its schedule its input's
    memory and skips it: a `view` written into another kernel's record would alias two
    tensors, so it must be what tk-codegen generates (and a removed one too)."""
    from tilekit.codegen.recorded import check_recorded_kernels
    from tilekit.errors import TilekitError
    from tilekit.ir import read_module

    out = tmp_path / "c.yaml"
    assert run("tk-codegen", write_mlp(tmp_path), "--target", "cpu", "-o", out).exit_code == 0
    generated = read_module(str(out))
    check_recorded_kernels(generated)
    kernels = [dict(k) for k in generated.codegen["kernels"]]
    kernels[0]["schedule"] = {**kernels[0]["schedule"], "view": kernels[0]["args"][0]}
    tampered = replace(generated, codegen={**generated.codegen, "kernels": kernels})
    with pytest.raises(TilekitError, match=r"codegen.kernels.0.?.schedule.view"):
        check_recorded_kernels(tampered)
