"""The tile IR verifier: every rule a document must keep between two tools.

`verify(module)` checks values (names, shapes, dtypes, roles, pad, axes), the data flow
(each tensor written once, ops in topological order, inputs and outputs consistent), every
expression against the tensor shapes (through `tilekit.expr`), kernels and the generic form
of stage payloads (JSON data: mappings with string keys, lists, strings, finite numbers,
booleans, null). What a stage puts *inside* its payloads is checked by that stage's tool.

The first broken rule raises `IRError` (or `ExprError` for an expression) located by IR
path: `model.yaml: ops[3].expr col 12: unknown function 'foo'; <hint>`.
"""

from __future__ import annotations

import difflib
import math
import re
from typing import Any, Mapping

from tilekit import limits
from tilekit.errors import ExprError, IRError, TilekitError, excerpt
from tilekit.ir.graph import op_analysis
from tilekit.ir.keys import (OPAQUE_KEYS, STAGE_KEYS, WEIGHTS_KEYS, key_path, key_problem,
                             type_name, where)
from tilekit.ir.model import DTYPES, OP_KINDS, PAD_VALUES, ROLES, Kernel, Module, Op, Tensor
from tilekit.ir.names import (check_name, hardware_problem, is_absolute_path,  # noqa: F401
                              path_problem)
from tilekit.expr.literals import check_expr_limits

SHA256 = re.compile(r"[0-9a-f]{64}\Z")
#: Roles whose tensors are given to the module rather than computed by an op.
GIVEN_ROLES = ("input", "weight")


class _Verifier:
    def __init__(self, module: Module, origin: str | None):
        self.m = module
        self.origin = origin

    def fail(self, path: str, what: str, hint: str | None = None) -> IRError:
        return IRError(what, where(self.origin, path), hint)

    # -- generic value checks ------------------------------------------------------------
    def string(self, value: Any, path: str, what: str) -> str:
        if not isinstance(value, str) or not value:
            got = "an empty string" if value == "" else f"{type_name(value)} {value!r}"
            raise self.fail(path, f"{what} must be a non-empty string, got {got}")
        return value

    def relative_path(self, value: Any, path: str, what: str) -> None:
        self.string(value, path, what)
        problem = path_problem(value, what)
        if problem is not None:
            raise self.fail(path, problem,
                            "the IR records paths relative to the document so that it "
                            "does not depend on the machine; write a relative path")

    def name(self, value: Any, path: str, what: str) -> str:
        """An identifier (tilekit.ir.names): every name that can reach generated code."""
        return check_name(value, where(self.origin, path), what)

    def payload(self, value: Any, path: str) -> None:
        """JSON data: what YAML and JSON both write and read back unchanged."""
        if isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, str):
                    raise self.fail(path, f"mapping key {key!r} is not a string",
                                    "keys are strings in JSON; quote the key")
                self.payload(item, key_path(path, key))
        elif isinstance(value, list):
            for i, item in enumerate(value):
                self.payload(item, f"{path}[{i}]")
        elif isinstance(value, float):
            if type(value) is not float:
                raise self.fail(path, f"value is a {type(value).__name__}",
                                "convert NumPy scalars with float()")
            if not math.isfinite(value):
                raise self.fail(path, f"number {value!r} is not finite",
                                "JSON cannot hold it; use null or a string")
        elif isinstance(value, tuple):
            raise self.fail(path, "value is a tuple", "payloads are JSON data: use a list "
                            "(a tuple would read back as a list)")
        elif value is not None and type(value) not in (str, int, bool):
            raise self.fail(path, f"value of type {type(value).__name__} is not JSON data",
                            "payloads hold mappings, lists, strings, numbers, booleans "
                            "and null (convert NumPy scalars with int() or float())")

    def payload_mapping(self, value: Any, path: str, what: str) -> None:
        if value is None:
            return
        if not isinstance(value, dict):
            raise self.fail(path, f"{what} must be a mapping, got {type_name(value)}")
        self.payload(value, path)

    def unique_name(self, name: Any, index: int, seen: dict[str, int], what: str,
                    section: str) -> None:
        """`section[index].name` is a string not used by an earlier entry; records it."""
        path = f"{section}[{index}].name"
        self.string(name, path, f"a{'n' if what[0] in 'aeio' else ''} {what} name")
        self.name(name, path, f"{what} name")
        if name in seen:
            raise self.fail(path, f"duplicate {what} name '{name}' (also "
                            f"{section}[{seen[name]}])", f"{what} names must be unique")
        seen[name] = index

    def known_keys(self, value: Mapping[str, Any], path: str, known: tuple[str, ...],
                   required: tuple[str, ...]) -> None:
        problem = key_problem(value, path, known, required)
        if problem:
            raise self.fail(*problem)

    def name_list(self, value: Any, path: str, what: str) -> tuple[str, ...]:
        if not isinstance(value, (tuple, list)):
            raise self.fail(path, f"{what} must be a list, got {type_name(value)}")
        seen: set[str] = set()
        for i, name in enumerate(value):
            self.string(name, f"{path}[{i}]", "a name")
            if name in seen:
                raise self.fail(f"{path}[{i}]", f"'{name}' is listed twice")
            seen.add(name)
        return tuple(value)

    # -- module ----------------------------------------------------------------------------
    def run(self) -> None:
        m = self.m
        self.string(m.model, "model", "'model'")
        self.name(m.model, "model", "model name")
        self.payload_mapping(m.source, "source", "'source'")
        if m.source and "onnx" in m.source:
            self.relative_path(m.source["onnx"], "source.onnx", "the source model")
        self.weights()
        if m.hardware is not None:
            at = "hardware" if m.hardware_sha256 is None else "hardware.name"
            self.string(m.hardware, at, "'hardware'")
            problem = hardware_problem(m.hardware)
            if problem is not None:
                raise self.fail(at, problem, "a profile name (tk-hw list), or a "
                                "relative path to a profile's .yaml file")
        if m.hardware_sha256 is not None:
            digest = m.hardware_sha256
            if m.hardware is None or not isinstance(digest, str) or not SHA256.match(digest):
                raise self.fail("hardware.sha256", f"not a SHA-256 digest: {excerpt(digest)}",
                                "64 lowercase hex digits: the profile's content hash, as "
                                "tk-hw show prints it under 'identity'")
        self.stages()
        self.tensors()
        self.interface()
        writers, reads = self.ops()
        self.dataflow(writers, reads)
        self.kernels(writers, reads)
        for key in ("program", "control", "codegen"):
            self.payload_mapping(getattr(m, key), key, f"'{key}'")
        if m.program is not None:  # tk-ram's plan: complete, in data-flow order, deadlock-free
            self.program()
        if m.control is not None or any(op.kind == "control" for op in m.ops):
            from tilekit.ir.control import verify_control
            verify_control(m, self.origin, verify)

    def weights(self) -> None:
        w = self.m.weights
        if w is None:
            for name, t in self.m.tensors.items():
                if getattr(t, "role", None) == "weight":
                    raise self.fail(key_path("tensors", name), "a weight tensor needs the "
                                    "module's 'weights' file, and there is none",
                                    "add weights: {file: <name>.weights.npz, sha256: <hex>}")
            return
        if not isinstance(w, Mapping):
            raise self.fail("weights", f"'weights' must be a mapping, got {type_name(w)}")
        self.known_keys(w, "weights", WEIGHTS_KEYS, WEIGHTS_KEYS)
        self.relative_path(w["file"], "weights.file", "the weights file")
        digest = w["sha256"]
        if not isinstance(digest, str):
            raise self.fail("weights.sha256", f"the digest must be a string, got "
                            f"{type_name(digest)} {digest!r}", "quote it in YAML")
        if not SHA256.match(digest):
            raise self.fail("weights.sha256", f"not a SHA-256 digest: {digest!r}",
                            "64 lowercase hex digits, as 'sha256sum' prints")

    def stages(self) -> None:
        if not isinstance(self.m.stages, (tuple, list)):
            raise self.fail("stages", f"'stages' must be a list, got {type_name(self.m.stages)}")
        for i, stage in enumerate(self.m.stages):
            path = f"stages[{i}]"
            if not isinstance(stage, Mapping):
                raise self.fail(path, f"a stage entry must be a mapping, got "
                                f"{type_name(stage)}", "write {name: <tool stage>, options: {...}}")
            self.known_keys(stage, path, STAGE_KEYS, ("name",))
            self.string(stage["name"], f"{path}.name", "a stage name")
            self.payload_mapping(stage.get("options"), f"{path}.options", "stage options")

    def tensors(self) -> None:
        tensors = self.m.tensors
        if not isinstance(tensors, Mapping):
            raise self.fail("tensors", f"'tensors' must be a mapping, got {type_name(tensors)}")
        for name, t in tensors.items():
            path = key_path("tensors", str(name))
            self.name(name, path, "tensor name")
            if not isinstance(t, Tensor):
                raise self.fail(path, f"expected a Tensor, got {type(t).__name__}")
            if not isinstance(t.shape, tuple):
                raise self.fail(f"{path}.shape", f"shape must be a tuple of integers, got "
                                f"{type(t.shape).__name__}")
            for i, d in enumerate(t.shape):
                if type(d) is not int or d < 1:
                    raise self.fail(f"{path}.shape[{i}]", f"dimension must be a positive "
                                    f"integer, got {type_name(d)} {d!r}",
                                    "shapes are static and non-empty: dynamic sizes and "
                                    "zero-size tensors are not supported")
            limits.elements(t.shape, where(self.origin, f"{path}.shape"))
            if t.dtype not in DTYPES:
                raise self.fail(f"{path}.dtype", f"unknown dtype {t.dtype!r}",
                                _choices(t.dtype, DTYPES))
            if t.role not in ROLES:
                raise self.fail(f"{path}.role", f"unknown role {t.role!r}",
                                _choices(t.role, ROLES))

    def interface(self) -> None:
        """`inputs`/`outputs` list exactly the tensors with those roles."""
        for key, role in (("inputs", "input"), ("outputs", "output")):
            names = self.name_list(getattr(self.m, key), key, f"'{key}'")
            for i, name in enumerate(names):
                t = self.m.tensors.get(name)
                if t is None:
                    raise self.fail(f"{key}[{i}]", f"'{name}' is not a declared tensor",
                                    _choices(name, tuple(self.m.tensors)))
                if t.role != role:
                    raise self.fail(f"{key}[{i}]", f"'{name}' is listed in {key} but its role "
                                    f"is '{t.role}'", f"give tensors.{name} role: {role}")
            for name, t in self.m.tensors.items():
                if t.role == role and name not in names:
                    raise self.fail(key_path("tensors", name), f"has role '{role}' but is "
                                    f"not listed in {key}", f"add it to {key}")
        if not self.m.outputs:
            raise self.fail("outputs", "the module has no outputs",
                            "list the tensors the model returns")

    # -- ops ---------------------------------------------------------------------------
    def ops(self) -> tuple[dict[str, int], list[tuple[str, ...]]]:
        """Check each op; return {tensor: index of the op writing it} and each op's reads."""
        ops = self.m.ops
        if not isinstance(ops, (tuple, list)):
            raise self.fail("ops", f"'ops' must be a list, got {type_name(ops)}")
        names: dict[str, int] = {}
        writers: dict[str, int] = {}
        reads: list[tuple[str, ...]] = []
        for i, op in enumerate(ops):
            path = f"ops[{i}]"
            if not isinstance(op, Op):
                raise self.fail(path, f"expected an Op, got {type(op).__name__}")
            self.unique_name(op.name, i, names, "op", "ops")
            op_reads, op_writes = self.op(op, path, i)
            for out in op_writes:
                t = self.m.tensors.get(out)
                if t is None:
                    raise self.fail(path, f"writes '{out}', which is not a declared tensor",
                                    _choices(out, tuple(self.m.tensors)))
                if t.role in GIVEN_ROLES:
                    raise self.fail(path, f"writes '{out}', which is a model {t.role}",
                                    "ops write intermediates and outputs only")
                if out in writers:
                    raise self.fail(path, f"writes '{out}', which ops[{writers[out]}] "
                                    f"('{ops[writers[out]].name}') already writes",
                                    "each tensor is written by exactly one op")
                if out in op_reads:
                    raise self.fail(path, f"reads its own output '{out}'",
                                    "write the result to a new tensor")
                writers[out] = i
            reads.append(op_reads)
        return writers, reads

    def op(self, op: Op, path: str, index: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Check one op's fields; return (tensors read, tensors written)."""
        if op.kind not in OP_KINDS:
            raise self.fail(f"{path}.kind", f"unknown op kind {op.kind!r}",
                            _choices(op.kind, OP_KINDS))
        if op.pad is not None and op.pad not in PAD_VALUES:
            raise self.fail(f"{path}.pad", f"unknown pad value {op.pad!r}",
                            "pad is one of " + ", ".join(f"'{p}'" for p in PAD_VALUES) +
                            " (quoted), or absent when no read leaves its tensor")
        if not isinstance(op.axes, Mapping):
            raise self.fail(f"{path}.axes", f"'axes' must be a mapping, got "
                            f"{type_name(op.axes)}")
        for axis, extent in op.axes.items():
            self.name(axis, key_path(f"{path}.axes", str(axis)), "axis name")
            if type(extent) is int:
                limits.TENSOR_ELEMENTS.check(extent, where(self.origin, key_path(
                    f"{path}.axes", axis)), "the extent")
            if type(extent) is not int or extent < 1:
                raise self.fail(key_path(f"{path}.axes", str(axis)), f"axis extent must be a "
                                f"positive integer, got {type_name(extent)} {extent!r}")
        if op.origin is not None:
            self.string(op.origin, f"{path}.origin", "'origin'")
        self.payload_mapping(op.tile, f"{path}.tile", "'tile'")
        if op.kind == "opaque":
            return self.opaque_op(op, path)
        if op.kind == "control":
            from tilekit.ir.control import control_op_tensors
            return control_op_tensors(self.m, op, path, self.origin)
        if op.opaque is not None:
            raise self.fail(f"{path}.opaque", "an expr op has an 'opaque' section",
                            "set kind: opaque, or remove it")
        if not isinstance(op.expr, str) or not op.expr.strip():
            raise self.fail(f"{path}.expr", "an expr op needs an expression",
                            "write a statement like 'y[i] = x[i] + 1' (specs/expressions.md)")
        try:
            analysis = op_analysis(self.m, index, f"{path}.expr")
        except ExprError as exc:
            raise ExprError(exc.what, where(self.origin, exc.where), exc.hint) from None
        try:
            check_expr_limits(analysis.stmt, analysis,
                              {n: t.dtype for n, t in self.m.tensors.items()})
        except ExprError as exc:
            col = f" {exc.where}" if exc.where and exc.where.startswith("col ") else ""
            raise ExprError(exc.what, where(self.origin, f"{path}.expr{col}"),
                            exc.hint) from None
        return analysis.inputs, (analysis.output,)

    def opaque_op(self, op: Op, path: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """An opaque record: a known registry type, its tensors, and the output shapes and
        dtypes the registry derives from the inputs. `""` is an absent optional input."""
        from tilekit import opaque as registry

        if op.expr is not None:
            raise self.fail(f"{path}.expr", "an opaque op has an expression",
                            "remove expr, or make it an expr op")
        o = op.opaque
        opath = f"{path}.opaque"
        if not isinstance(o, Mapping):
            raise self.fail(opath, "an opaque op needs an 'opaque' mapping",
                            "write opaque: {type: <registry name>, inputs: [...], "
                            "outputs: [...]}")
        self.known_keys(o, opath, OPAQUE_KEYS, ("type", "inputs", "outputs"))
        self.string(o["type"], f"{opath}.type", "the opaque type")
        if o["type"] not in registry.REGISTRY:
            raise self.fail(f"{opath}.type", f"unknown opaque op type '{o['type']}'",
                            _choices(o["type"], tuple(registry.known())))
        ins = o["inputs"]
        if not isinstance(ins, (list, tuple)):
            raise self.fail(f"{opath}.inputs", f"opaque inputs must be a list, got "
                            f"{type_name(ins)}")
        for i, name in enumerate(ins):
            if not isinstance(name, str):
                raise self.fail(f"{opath}.inputs[{i}]", f"a tensor name must be a string, got "
                                f"{type_name(name)} {name!r}",
                                "write '' for an absent optional input")
            if name and name not in self.m.tensors:
                raise self.fail(f"{opath}.inputs[{i}]", f"reads '{name}', which is not a "
                                "declared tensor", _choices(name, tuple(self.m.tensors)))
        outs = self.name_list(o["outputs"], f"{opath}.outputs", "opaque outputs")
        if not outs:
            raise self.fail(f"{opath}.outputs", "an opaque op writes no tensor")
        attrs = o.get("attrs")
        self.payload_mapping(attrs, f"{opath}.attrs", "opaque attrs")
        for i, name in enumerate(outs):
            if name not in self.m.tensors:
                raise self.fail(f"{opath}.outputs[{i}]", f"writes '{name}', which is not a "
                                "declared tensor", _choices(name, tuple(self.m.tensors)))
        self.opaque_shapes(registry.REGISTRY[o["type"]], ins, outs, attrs or {}, opath)
        return tuple(dict.fromkeys(n for n in ins if n)), outs

    def opaque_shapes(self, entry: Any, ins: Any, outs: tuple[str, ...],
                      attrs: Mapping[str, Any], opath: str) -> None:
        specs = [(self.m.tensors[n].shape, self.m.tensors[n].dtype) if n else None for n in ins]
        from tilekit.opaque import attrs_problem

        problem = attrs_problem(entry.name, specs, attrs)
        if problem is not None:
            raise self.fail(key_path(f"{opath}.attrs", problem[0]),
                            f"{entry.name} attribute '{problem[0]}' {problem[1]}")
        try:
            derived = entry.shapes(specs, attrs)
        except TilekitError as exc:
            raise IRError(exc.what, where(self.origin, opath), exc.hint) from None
        except Exception as exc:  # noqa: BLE001 - a registry shape rule that cannot apply
            raise self.fail(opath, f"{entry.name} cannot derive its output shapes from these "
                            f"inputs and attrs ({type(exc).__name__}: {exc})",
                            "check the inputs' ranks and the attrs") from None
        if len(derived) != len(outs):
            raise self.fail(f"{opath}.outputs", f"{entry.name} writes {len(derived)} "
                            f"tensor(s), the op lists {len(outs)}")
        for i, (name, (shape, dtype)) in enumerate(zip(outs, derived)):
            t = self.m.tensors[name]
            if tuple(shape) != t.shape or dtype != t.dtype:
                raise self.fail(f"{opath}.outputs[{i}]", f"{entry.name} writes "
                                f"{dtype}{list(shape)} but '{name}' is declared "
                                f"{t.dtype}{list(t.shape)}", f"fix tensors.{name}")

    def dataflow(self, writers: dict[str, int], reads: list[tuple[str, ...]]) -> None:
        """Reads see only given tensors or earlier writes; every computed tensor is written."""
        for i, op_reads in enumerate(reads):
            for name in op_reads:
                role = self.m.tensors[name].role
                if role in GIVEN_ROLES:
                    continue
                w = writers.get(name)
                if w is None:
                    raise self.fail(f"ops[{i}]", f"reads '{name}', which no op writes",
                                    f"'{name}' has role '{role}': compute it in an earlier op, "
                                    "or make it a model input or weight")
                if w > i:
                    raise self.fail(f"ops[{i}]", f"reads '{name}' before ops[{w}] "
                                    f"('{self.m.ops[w].name}') writes it",
                                    "ops must be in topological order")
        for name, t in self.m.tensors.items():
            if t.role not in GIVEN_ROLES and name not in writers:
                raise self.fail(key_path("tensors", name), f"{t.role} tensor '{name}' is "
                                "never written by any op",
                                "remove the tensor or add the op that computes it")

    # -- kernels -----------------------------------------------------------------------
    def program(self) -> None:
        """The `program` section (tilekit.ir.program: format, placement, barriers,
        deadlock freedom), located in this document."""
        from tilekit.ir.program import parse_program, verify_program

        try:
            verify_program(self.m, parse_program(self.m.program))
        except IRError as exc:
            raise self.fail(exc.where or "program", exc.what, exc.hint) from None

    def kernels(self, writers: dict[str, int], reads: list[tuple[str, ...]]) -> None:
        kernels = self.m.kernels
        if not isinstance(kernels, (tuple, list)):
            raise self.fail("kernels", f"'kernels' must be a list, got {type_name(kernels)}")
        if not kernels:
            return
        index = self.m.op_index()
        names: dict[str, int] = {}
        owner: dict[str, int] = {}  # op name -> kernel index
        for k, kernel in enumerate(kernels):
            path = f"kernels[{k}]"
            if not isinstance(kernel, Kernel):
                raise self.fail(path, f"expected a Kernel, got {type(kernel).__name__}")
            self.unique_name(kernel.name, k, names, "kernel", "kernels")
            ops = self.name_list(kernel.ops, f"{path}.ops", "a kernel's 'ops'")
            if not ops:
                raise self.fail(f"{path}.ops", "a kernel has no ops")
            last = -1
            for j, name in enumerate(ops):
                if name not in index:
                    raise self.fail(f"{path}.ops[{j}]", f"'{name}' is not an op of this module",
                                    _choices(name, tuple(index)))
                if name in owner:
                    raise self.fail(f"{path}.ops[{j}]", f"op '{name}' is already in "
                                    f"kernels[{owner[name]}] ('{kernels[owner[name]].name}')",
                                    "each op runs in exactly one kernel")
                if index[name] < last:
                    raise self.fail(f"{path}.ops[{j}]", f"op '{name}' comes before "
                                    f"'{ops[j - 1]}' in the module but after it here",
                                    "list a kernel's ops in module (topological) order")
                last = index[name]
                owner[name] = k
            for key in ("tile", "estimate", "launch"):
                self.payload_mapping(getattr(kernel, key), f"{path}.{key}", f"'{key}'")
        for op in self.m.ops:
            if op.name not in owner:
                raise self.fail("kernels", f"op '{op.name}' is in no kernel",
                                "when kernels are listed, every op belongs to one")
        # Kernels run in list order, so a kernel may read only what earlier ones wrote.
        for k, kernel in enumerate(kernels):
            for name in kernel.ops:
                for tensor in reads[index[name]]:
                    w = writers.get(tensor)
                    if w is not None and owner[self.m.ops[w].name] > k:
                        later = owner[self.m.ops[w].name]
                        raise self.fail(f"kernels[{k}]", f"reads '{tensor}', which "
                                        f"kernels[{later}] ('{kernels[later].name}') writes "
                                        "later", "kernels must be in topological order")


def _choices(word: Any, known: tuple[str, ...]) -> str:
    listed = ", ".join(known) if len(known) <= 12 else ", ".join(known[:12]) + ", ..."
    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.6) if isinstance(
        word, str) else []
    return f"did you mean '{close[0]}'? one of: {listed}" if close else f"one of: {listed}"


def verify(module: Module, origin: str | None = None) -> None:
    """Check every rule of the tile IR; raise `IRError`/`ExprError` at the first broken one.

    `origin` (a file name, `<stdin>`) prefixes the IR path in messages.
    """
    if not isinstance(module, Module):
        raise IRError(f"expected a Module, got {type(module).__name__}", origin)
    if module.dims:
        # Its largest sizes may be over the size budgets, which apply to the sizes a run
        # binds (the run verifies its instance again).
        with limits.lifted(limits.TENSOR_ELEMENTS, limits.TOTAL_BYTES):
            for instance in _symbolic_instances(module, origin):
                _Verifier(instance, origin).run()
        return
    _Verifier(module, origin).run()


def _symbolic_instances(module: Module, origin: str | None) -> list[Module]:
    """A symbolic module's own rules (its shape entries are dimension expressions over its
    symbols, positive over the whole ranges; every symbol an input's whole dimension; no
    control ops), then the static modules at its ranges' ends and its likely values, which
    `verify` checks as any module: index maps in range at the smallest and largest sizes."""
    from itertools import product

    from tilekit.ir.dims import (SYMBOL_REF, instantiate, named_symbols, parse_dim_expr,
                                 symbolic_inputs)

    dims = module.dims
    if not isinstance(module.tensors, Mapping):
        raise IRError(f"'tensors' must be a mapping, got {type_name(module.tensors)}",
                      where(origin, "tensors"))
    corners = [dict(zip(dims, c)) for c in product(*((d.min, d.max) for d in dims.values()))]
    for name, t in module.tensors.items():
        path = key_path("tensors", str(name))
        if not isinstance(t, Tensor) or not isinstance(t.shape, tuple):
            continue  # the instances' checks say what is wrong
        for i, d in enumerate(t.shape):
            if type(d) is int:
                continue
            at = where(origin, f"{path}.shape[{i}]")
            try:
                e = parse_dim_expr(d)
            except ValueError as exc:
                raise IRError(f"dimension {excerpt(d)} is neither a positive integer nor a "
                              f"dimension expression ({exc})", at,
                              "an integer, or a polynomial in the module's dims such as "
                              "'2*seq + 1'") from None
            unknown = sorted(named_symbols(d) - set(dims))
            if unknown:
                raise IRError(f"dimension {excerpt(d)} names '{unknown[0]}', which is not "
                              "declared in 'dims'", at, "declare it: dims: {NAME: {min: "
                              "1, max: N}}")
            low = min(e.evaluate(c) for c in corners)
            if low < 1:
                raise IRError(f"dimension {excerpt(d)} is {low} somewhere in the dims' "
                              "ranges", at, "sizes are positive over the whole range: "
                              "narrow the range")
    for index, op in enumerate(module.ops if isinstance(module.ops, tuple) else ()):
        refs = set(SYMBOL_REF.findall(op.expr)) if isinstance(op, Op) and isinstance(
            op.expr, str) else set()
        if refs - set(dims):
            raise IRError(f"the expression names ${sorted(refs - set(dims))[0]}, which is not "
                          "declared in 'dims'", where(origin, f"ops[{index}].expr"),
                          "declare the symbol, or write the size")
    if module.control is not None or any(op.kind == "control" for op in module.ops):
        raise IRError("a module with symbolic dimensions has no control ops", where(
            origin, "dims"), "import a model with loops or branches for one size "
            "(tk-import --dim NAME=SIZE)")
    bound = {sym for _, _, sym in symbolic_inputs(module)
             if all(isinstance(n, str) for n in module.inputs)}
    for sym in dims:
        if sym not in bound:
            raise IRError(f"symbol {sym} is not a whole dimension of any input, so no run can "
                          "bind it", where(origin, f"dims.{sym}"),
                          "give it a static size, or an input dimension of its own")
    bindings = [{s: d.min for s, d in dims.items()}, {s: d.max for s, d in dims.items()}]
    likely = {s: d.likely[0] for s, d in dims.items() if d.likely}
    if likely:
        bindings.append({s: likely.get(s, d.min) for s, d in dims.items()})
    return [instantiate(module, b) for b in bindings]
