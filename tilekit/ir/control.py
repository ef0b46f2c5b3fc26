"""Control flow in the tile IR: loops, branches and scans whose bodies are regions.

A control op is an op of kind `control` in an op list (the module's or a region's); what it
does is its record in the `control` section of the same scope, keyed by the op's name:

    ops:
      - {name: lstm, kind: control, origin: Loop_3}
    control:
      lstm:
        kind: loop                 # loop | if | scan
        trip_count: M              # int64 scalar tensor (optional)
        cond: c0                   # bool scalar tensor (optional)
        carried: [h0, c0]          # initial values of the loop-carried tensors
        outputs: [hT, cT]          # their final values
        scans: [ys]                # per-iteration results, stacked on axis 0: [max_trips, ...]
        max_trips: 16              # the declared maximum (required with scans)
        count: ys_len              # int64 scalar: iterations run (when it is data-dependent)
        body: {inputs: [i, ci, h, c], outputs: [co, h2, c2, y], tensors: {...}, ops: [...]}

A **region** is a small module: `inputs` (bound per run), `outputs`, its own `tensors` (roles
input, output, intermediate; never weights), `ops`, optional `kernels` and a nested `control`
section. Its ops may also read any tensor of an enclosing scope (a *capture*): a name read in a
region that the region does not declare. Names are unique across all scopes (a region never
shadows an outer tensor or op), so a name means one thing everywhere and the module analysis
can see a control op's reads (explicit inputs plus captures) and writes.

`region_module(scope_tensors, region)` turns a region into a `Module` (captures and inputs as
role input), so the verifier, the module analysis, the executors, tk-roll and codegen run on a
region exactly as on a module. Records are read and written only here (`read_control`,
`ControlOp.record()`); `verify_control` holds the rules of docs/grind.md (located by IR path,
e.g. `control.lstm.body.ops[2].expr`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Iterator, Mapping

from tilekit.errors import IRError, TilekitError, excerpt
from tilekit.expr import parse
from tilekit.expr.ast import body_accesses
from tilekit.ir.keys import key_path, key_problem, read_list, read_mapping, type_name, where
from tilekit.ir.model import Kernel, Module, Op, Tensor

KINDS = ("loop", "if", "scan")
LOOP_KEYS = ("kind", "trip_count", "cond", "carried", "outputs", "scans", "max_trips", "count",
             "body", "grind")
#: Where tk-grind places a control op.
GRIND_RUNS = ("device", "host")
IF_KEYS = ("kind", "cond", "outputs", "then", "else", "grind")
SCAN_KEYS = ("kind", "carried", "scan_inputs", "outputs", "scans", "input_axes",
             "input_reverse", "output_axes", "output_reverse", "body", "grind")
REGION_KEYS = ("inputs", "outputs", "tensors", "ops", "kernels", "control")
REGION_ROLES = ("input", "output", "intermediate")


@dataclass(frozen=True)
class Region:
    """An op list with its own tensors (see the module docstring)."""

    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    tensors: Mapping[str, Tensor]
    ops: tuple[Op, ...]
    kernels: tuple[Kernel, ...] = ()
    control: Mapping[str, Any] | None = None

    def record(self) -> dict[str, Any]:
        from tilekit.ir.parts import kernel_document, op_document, tensor_document

        out: dict[str, Any] = {"inputs": list(self.inputs), "outputs": list(self.outputs),
                               "tensors": {n: tensor_document(t) for n, t in self.tensors.items()},
                               "ops": [op_document(op) for op in self.ops]}
        if self.kernels:
            out["kernels"] = [kernel_document(k) for k in self.kernels]
        if self.control:
            out["control"] = dict(self.control)
        return out

    @staticmethod
    def read(payload: Any, path: str) -> "Region":
        from tilekit.ir.parts import decode_kernel, decode_op, decode_tensor

        p = read_mapping(payload, path, "a region")
        _keys(p, path, REGION_KEYS, ("inputs", "outputs", "tensors", "ops"))
        tensors = read_mapping(p["tensors"], f"{path}.tensors", "a region's 'tensors'")
        ops = read_list(p["ops"], f"{path}.ops", "a region's 'ops'")
        kernels = p.get("kernels")
        control = p.get("control")
        if control is not None:
            read_mapping(control, f"{path}.control", "a region's 'control'")
        return Region(
            inputs=_names(p["inputs"], f"{path}.inputs"),
            outputs=_names(p["outputs"], f"{path}.outputs"),
            tensors={n: decode_tensor(t, key_path(f"{path}.tensors", n))
                     for n, t in tensors.items()},
            ops=tuple(decode_op(o, f"{path}.ops[{i}]") for i, o in enumerate(ops)),
            kernels=() if kernels is None else tuple(
                decode_kernel(k, f"{path}.kernels[{i}]")
                for i, k in enumerate(read_list(kernels, f"{path}.kernels", "'kernels'"))),
            control=control)


@dataclass(frozen=True)
class ControlOp:
    """One control op's record. Fields not used by a kind stay empty.

    - loop: `body.inputs = [iteration, cond_in, *carried]`, `body.outputs = [cond_out,
      *carried results, *scan results]`;
    - scan: `body.inputs = [*carried, *scan_input slices]`, `body.outputs = [*carried
      results, *scan results]`; the trip count is the scan inputs' extent on their axis;
    - if: `regions = (then, else)`, each with no inputs and one output per `outputs`.
    """

    name: str
    kind: str
    regions: tuple[Region, ...]
    outputs: tuple[str, ...] = ()
    carried: tuple[str, ...] = ()
    scans: tuple[str, ...] = ()
    cond: str | None = None
    trip_count: str | None = None
    max_trips: int | None = None
    count: str | None = None
    scan_inputs: tuple[str, ...] = ()
    input_axes: tuple[int, ...] = ()
    input_reverse: tuple[bool, ...] = ()
    output_axes: tuple[int, ...] = ()
    output_reverse: tuple[bool, ...] = ()
    grind: Mapping[str, Any] | None = None

    @property
    def body(self) -> Region:
        return self.regions[0]

    def region_names(self) -> tuple[str, ...]:
        return ("then", "else") if self.kind == "if" else ("body",)

    def explicit_reads(self) -> tuple[str, ...]:
        """Outer tensors the op names as inputs (captures come on top)."""
        names = [self.trip_count, self.cond, *self.carried, *self.scan_inputs]
        return tuple(dict.fromkeys(n for n in names if n))

    def writes(self) -> tuple[str, ...]:
        return tuple(n for n in (*self.outputs, *self.scans, self.count) if n)

    def record(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind}
        if self.kind == "if":
            out.update({"cond": self.cond, "outputs": list(self.outputs),
                        "then": self.regions[0].record(), "else": self.regions[1].record()})
        else:
            out.update({"carried": list(self.carried), "outputs": list(self.outputs),
                        "body": self.body.record()})
            if self.scans:
                out["scans"] = list(self.scans)
        if self.kind == "loop":
            for key in ("trip_count", "cond", "max_trips", "count"):
                if getattr(self, key) is not None:
                    out[key] = getattr(self, key)
        if self.kind == "scan":
            out.update({"scan_inputs": list(self.scan_inputs),
                        "input_axes": list(self.input_axes),
                        "input_reverse": list(self.input_reverse),
                        "output_axes": list(self.output_axes),
                        "output_reverse": list(self.output_reverse)})
        if self.grind is not None:
            out["grind"] = dict(self.grind)
        return out

    @staticmethod
    def read(name: str, payload: Any, path: str) -> "ControlOp":
        p = read_mapping(payload, path, "a control record")
        kind = p.get("kind")
        if kind not in KINDS:
            raise IRError(f"unknown control kind {kind!r}", where(None, f"{path}.kind"),
                          f"one of: {', '.join(KINDS)}")
        known = {"loop": LOOP_KEYS, "if": IF_KEYS, "scan": SCAN_KEYS}[kind]
        required = {"loop": ("kind", "carried", "outputs", "body"),
                    "if": ("kind", "cond", "outputs", "then", "else"),
                    "scan": ("kind", "carried", "scan_inputs", "outputs", "body")}[kind]
        _keys(p, path, known, required)
        grind = p.get("grind")
        if grind is not None:
            read_mapping(grind, f"{path}.grind", "'grind'")
            if grind.get("run") not in GRIND_RUNS:
                raise _fail(f"{path}.grind.run", f"must be one of {', '.join(GRIND_RUNS)}, got "
                            f"{excerpt(grind.get('run'))}", "re-run tk-grind")
            estimate = grind.get("estimate")
            if estimate is not None:   # its grid sizes a device loop's launch (codegen)
                read_mapping(estimate, f"{path}.grind.estimate", "'estimate'")
                grid = estimate.get("grid")
                if grid is not None and (type(grid) is not int or grid < 1):
                    raise _fail(f"{path}.grind.estimate.grid", "must be a positive whole "
                                f"number of blocks, got {excerpt(grid)}", "re-run tk-grind")
        common = dict(name=name, kind=kind, outputs=_names(p["outputs"], f"{path}.outputs"),
                      grind=grind)
        if kind == "if":
            return ControlOp(regions=(Region.read(p["then"], f"{path}.then"),
                                      Region.read(p["else"], f"{path}.else")),
                             cond=_name(p["cond"], f"{path}.cond"), **common)
        body = Region.read(p["body"], f"{path}.body")
        carried = _names(p["carried"], f"{path}.carried")
        scans = _names(p.get("scans", []), f"{path}.scans")
        if kind == "loop":
            max_trips = p.get("max_trips")
            if max_trips is not None and (type(max_trips) is not int or max_trips < 1):
                raise IRError(f"max_trips must be a positive integer, got "
                              f"{type_name(max_trips)} {max_trips!r}",
                              f"{path}.max_trips")
            return ControlOp(regions=(body,), carried=carried, scans=scans,
                             trip_count=_opt_name(p.get("trip_count"), f"{path}.trip_count"),
                             cond=_opt_name(p.get("cond"), f"{path}.cond"),
                             max_trips=max_trips,
                             count=_opt_name(p.get("count"), f"{path}.count"), **common)
        scan_inputs = _names(p["scan_inputs"], f"{path}.scan_inputs")
        return ControlOp(regions=(body,), carried=carried, scans=scans,
                         scan_inputs=scan_inputs,
                         input_axes=_per_item(p.get("input_axes"), len(scan_inputs),
                                              f"{path}.input_axes", 0, int),
                         input_reverse=_per_item(p.get("input_reverse"), len(scan_inputs),
                                                 f"{path}.input_reverse", False, bool),
                         output_axes=_per_item(p.get("output_axes"), len(scans),
                                               f"{path}.output_axes", 0, int),
                         output_reverse=_per_item(p.get("output_reverse"), len(scans),
                                                  f"{path}.output_reverse", False, bool),
                         **common)

    def with_regions(self, regions: tuple[Region, ...]) -> "ControlOp":
        return replace(self, regions=regions)


# -- small readers ---------------------------------------------------------------------------

def _fail(path: str, what: str, hint: str | None = None) -> IRError:
    return IRError(what, path, hint)


def _keys(value: Mapping[str, Any], path: str, known, required) -> None:
    problem = key_problem(value, path, tuple(known), tuple(required))
    if problem:
        raise _fail(*problem)


def _name(value: Any, path: str) -> str:
    if not isinstance(value, str) or not value:
        raise _fail(path, f"expected a tensor name, got {type_name(value)} {value!r}")
    return value


def _opt_name(value: Any, path: str) -> str | None:
    return None if value is None else _name(value, path)


def _names(value: Any, path: str) -> tuple[str, ...]:
    return tuple(_name(v, f"{path}[{i}]") for i, v in enumerate(read_list(value, path, "a list")))


def _per_item(value: Any, n: int, path: str, default, kind: type) -> tuple:
    """`n` values of type `kind` (int or bool), `default` each when absent."""
    if value is None:
        return (default,) * n
    items = read_list(value, path, "a list")
    if len(items) != n or any(type(v) is not kind for v in items):
        raise _fail(path, f"expected {n} {kind.__name__}s, got {items!r}")
    return tuple(items)


# -- reading a scope's control section ------------------------------------------------------

def read_control(control: Mapping[str, Any] | None, path: str = "control"
                 ) -> dict[str, ControlOp]:
    """The records of a `control` section (the module's or a region's), by op name."""
    if not control:
        return {}
    read_mapping(control, path, "'control'")
    return {name: ControlOp.read(name, rec, key_path(path, name))
            for name, rec in control.items()}


def module_control(module: Module) -> dict[str, ControlOp]:
    """The module's own control records (`tilekit.ir.graph.control_records` caches them)."""
    return read_control(module.control)


def control_section(records: Mapping[str, ControlOp]) -> dict[str, Any] | None:
    """A `control` section (JSON data) from typed records; None when there are none."""
    return {name: rec.record() for name, rec in records.items()} or None


def with_control(module_or_region, records: Mapping[str, ControlOp]):
    """`module_or_region` with its `control` section rewritten from typed records."""
    return replace(module_or_region, control=control_section(records))


# -- regions as modules -----------------------------------------------------------------------

def free_names(region: Region) -> tuple[str, ...]:
    """Tensors a region reads that it does not declare (its captures), in first-use order,
    including what its nested control ops read."""
    nested = read_control(region.control)
    seen: dict[str, None] = {}
    for op in region.ops:
        if op.kind == "control":
            rec = nested.get(op.name)
            reads = control_reads(rec) if rec is not None else ()
        else:
            try:
                reads = _op_reads(op)
            except TilekitError:
                continue  # the verifier reports the expression, located
        for name in reads:
            if name not in region.tensors:
                seen.setdefault(name, None)
    return tuple(seen)


def _op_reads(op: Op) -> tuple[str, ...]:
    """What an expr or opaque op reads, from its text alone (tilekit.ir.graph.op_tensors
    without the analysis, which sits above this module)."""
    if op.kind == "opaque":   # a malformed record reads nothing here: the verifier names it
        inputs = op.opaque.get("inputs") if isinstance(op.opaque, Mapping) else None
        return tuple(n for n in inputs if isinstance(n, str) and n) \
            if isinstance(inputs, (list, tuple)) else ()
    if not isinstance(op.expr, str):
        return ()
    return tuple(a.tensor for a in body_accesses(parse(op.expr).body))


def control_reads(rec: ControlOp) -> tuple[str, ...]:
    """Everything a control op reads: its explicit inputs, then its regions' captures."""
    names = list(rec.explicit_reads())
    for region in rec.regions:
        names.extend(free_names(region))
    return tuple(dict.fromkeys(names))


def region_module(scope: Mapping[str, Tensor], region: Region, name: str) -> Module:
    """The region as a module: captures (declared in `scope`, the tensors visible from the
    enclosing scopes) and the region's inputs as role input, its outputs as outputs. A capture
    that `scope` does not declare is left out (the verifier reports it first)."""
    captures = tuple(n for n in free_names(region) if n in scope)
    tensors: dict[str, Tensor] = {n: replace(scope[n], role="input") for n in captures}
    tensors.update(region.tensors)
    return Module(model=name, tensors=tensors, ops=region.ops,
                  inputs=tuple(region.inputs) + captures, outputs=tuple(region.outputs),
                  kernels=region.kernels, control=region.control)


def region_scope(scope: Mapping[str, Tensor], region: Region) -> dict[str, Tensor]:
    """The tensors visible inside `region`: the enclosing scope's and its own."""
    return {**scope, **region.tensors}


def walk(module: Module) -> Iterator[tuple[str, ControlOp, Mapping[str, Tensor]]]:
    """Every control op of the module, nested ones too, outermost first:
    (IR path of its record, the record, the tensors visible where it sits)."""

    def visit(control, tensors, path):
        for name, rec in read_control(control, path).items():
            rpath = key_path(path, name)
            yield rpath, rec, tensors
            for rname, region in zip(rec.region_names(), rec.regions):
                yield from visit(region.control, region_scope(tensors, region),
                                 f"{rpath}.{rname}.control")

    yield from visit(module.control, dict(module.tensors), "control")


def all_tensors(module: Module) -> dict[str, Tensor]:
    """The module's tensors and every region's (names are unique across scopes)."""
    out = dict(module.tensors)
    for _, rec, _ in walk(module):
        for region in rec.regions:
            out.update(region.tensors)
    return out


__all__ = ["ControlOp", "KINDS", "Region", "all_tensors", "control_reads", "control_section",
           "free_names",
           "module_control", "read_control", "region_module", "region_scope", "walk",
           "with_control"]


# -- verifier rules ----------------------------------------------------------------------------

def control_op_tensors(module: Module, op: Op, path: str, origin: str | None
                       ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(reads, writes) of control op `op` of `module` for the verifier's data-flow rules:
    its record must exist; reads are its explicit inputs and its regions' captures."""
    if op.expr is not None or op.opaque is not None:
        raise IRError("a control op has an expression or an opaque record",
                      where(origin, path), "a control op's meaning is its record under "
                      f"control.{op.name}; remove expr/opaque")
    try:
        records = module_control(module)
    except IRError as exc:
        raise IRError(exc.what, where(origin, exc.where or "control"), exc.hint) from None
    rec = records.get(op.name)
    if rec is None:
        raise IRError(f"control op '{op.name}' has no record in 'control'",
                      where(origin, path), f"add control.{op.name}: {{kind: loop|if|scan, ...}}")
    reads = control_reads(rec)
    for name in reads:
        if name not in module.tensors:
            raise IRError(f"reads '{name}', which neither its regions nor an enclosing scope "
                          "declares", where(origin, key_path("control", op.name)),
                          "declare it in the region's tensors, or compute it outside")
    return reads, rec.writes()


def verify_control(module: Module, origin: str | None, verify, prefix: str = "",
                   op_names: set[str] | None = None) -> None:
    """The rules of control flow (docs/grind.md), for `module` and, recursively, every
    region (each checked by `verify`, tilekit.ir.verify's, as a module); raises `IRError`
    located by IR path (`control.lstm.body.ops[2]`)."""
    op_names = set() if op_names is None else op_names
    here = (lambda p: where(origin, f"{prefix}{p}"))
    for i, op in enumerate(module.ops):
        if op.name in op_names:
            raise IRError(f"op name '{op.name}' is also used in another scope",
                          here(f"ops[{i}].name"), "op names are unique across regions")
        op_names.add(op.name)
    control_ops = {op.name for op in module.ops if op.kind == "control"}
    records = read_control(module.control, f"{prefix}control") if module.control else {}
    for name in records:
        if name not in control_ops:
            raise IRError(f"'{name}' is not a control op of this scope",
                          here(key_path("control", name)),
                          "every record belongs to an op of kind control with that name")
    for name, rec in records.items():
        path = key_path(f"{prefix}control", name)
        _check_interface(rec, module.tensors, lambda p, path=path: where(origin, f"{path}.{p}"))
        for rname, region in zip(rec.region_names(), rec.regions):
            rpath = f"{path}.{rname}"
            _check_region_names(region, module.tensors, rpath, origin)
            sub = region_module(module.tensors, region, name)
            try:
                verify(sub)
            except TilekitError as exc:
                inner = exc.where or ""
                raise type(exc)(exc.what, where(origin, f"{rpath}.{inner}" if inner else rpath),
                                exc.hint) from None
            verify_control(sub, origin, verify, f"{rpath}.", op_names)
        _check_shapes(rec, module.tensors, lambda p, path=path: where(origin, f"{path}.{p}"))


def _check_region_names(region: Region, scope: Mapping[str, Tensor], rpath: str,
                        origin: str | None) -> None:
    for name, t in region.tensors.items():
        if name in scope:
            raise IRError(f"region tensor '{name}' shadows a tensor of the enclosing scope",
                          where(origin, key_path(f"{rpath}.tensors", name)),
                          "names are unique across scopes: rename it")
        if t.role not in REGION_ROLES:
            raise IRError(f"a region tensor has role '{t.role}'",
                          where(origin, key_path(f"{rpath}.tensors", name)),
                          "regions hold inputs, outputs and intermediates; weights are "
                          "declared by the module and captured")
    for name in free_names(region):
        if name not in scope:
            raise IRError(f"reads '{name}', which neither the region nor an enclosing scope "
                          "declares", where(origin, rpath),
                          "declare it in the region's tensors, or compute it outside")


def _check_interface(rec: ControlOp, scope: Mapping[str, Tensor], at) -> None:
    """Every tensor the record names is declared in its scope, with the right type."""
    def declared(name: str, key: str) -> Tensor:
        if name not in scope:
            raise IRError(f"'{name}' is not a declared tensor", at(key),
                          "control ops read and write tensors of their own scope")
        return scope[name]

    for key in ("trip_count", "count"):
        name = getattr(rec, key)
        if name is not None:
            t = declared(name, key)
            if t.dtype != "int64" or t.size != 1:
                raise IRError(f"'{name}' is {t.dtype}{list(t.shape)}; {key} is an int64 "
                              "scalar", at(key))
    if rec.cond is not None:
        t = declared(rec.cond, "cond")
        if t.dtype != "bool" or t.size != 1:
            raise IRError(f"'{rec.cond}' is {t.dtype}{list(t.shape)}; a condition is a bool "
                          "with one element", at("cond"))
    for key in ("carried", "outputs", "scans", "scan_inputs"):
        for i, name in enumerate(getattr(rec, key)):
            declared(name, f"{key}[{i}]")
    if rec.kind in ("loop", "scan") and len(rec.carried) != len(rec.outputs):
        raise IRError(f"{len(rec.carried)} carried tensors but {len(rec.outputs)} outputs",
                      at("outputs"), "each carried tensor has one final value")
    if rec.kind == "loop" and rec.scans and rec.max_trips is None:
        raise IRError("a loop with scan outputs needs max_trips", at("max_trips"),
                      "scan outputs are stacked on a leading axis of that length")


def _agree(what: str, a: Tensor, b: Tensor, at_key: str, at, hint: str) -> None:
    if a.shape != b.shape or a.dtype != b.dtype:
        raise IRError(f"{what}: {a.dtype}{list(a.shape)} against {b.dtype}{list(b.shape)}",
                      at(at_key), hint)


def _check_shapes(rec: ControlOp, scope: Mapping[str, Tensor], at) -> None:
    """Carried shapes stay the same, scans stack, both branches agree."""
    if rec.kind == "if":
        for rname, region in zip(("then", "else"), rec.regions):
            if region.inputs or len(region.outputs) != len(rec.outputs):
                raise IRError(f"the {rname} branch has {len(region.inputs)} inputs and "
                              f"{len(region.outputs)} outputs", at(f"{rname}.outputs"),
                              f"a branch takes no inputs and gives {len(rec.outputs)} outputs")
            for i, (mine, outer) in enumerate(zip(region.outputs, rec.outputs)):
                _agree(f"the {rname} branch's output {i} and '{outer}' differ",
                       region.tensors[mine], scope[outer], f"{rname}.outputs[{i}]", at,
                       "both branches give the outputs' shapes and dtypes")
        return
    body = rec.body
    lead = 2 if rec.kind == "loop" else 0
    n_carry, n_scan = len(rec.carried), len(rec.scans)
    want_in = lead + n_carry + len(rec.scan_inputs)
    want_out = (1 if rec.kind == "loop" else 0) + n_carry + n_scan
    if len(body.inputs) != want_in or len(body.outputs) != want_out:
        raise IRError(f"the body has {len(body.inputs)} inputs and {len(body.outputs)} "
                      f"outputs, the {rec.kind} needs {want_in} and {want_out}",
                      at("body"), "see docs/grind.md for the body's interface")
    t = body.tensors
    if rec.kind == "loop":
        for key, name, dtype in (("inputs[0]", body.inputs[0], "int64"),
                                 ("inputs[1]", body.inputs[1], "bool"),
                                 ("outputs[0]", body.outputs[0], "bool")):
            if t[name].dtype != dtype or t[name].size != 1 or (key != "outputs[0]"
                                                                and t[name].shape != ()):
                raise IRError(f"'{name}' is {t[name].dtype}{list(t[name].shape)}, expected a "
                              f"{dtype} scalar" + (" (or one element)" if key[0] == "o" else ""),
                              at(f"body.{key}"))
    out0 = 1 if rec.kind == "loop" else 0
    for i, outer in enumerate(rec.carried):
        param, result = body.inputs[lead + i], body.outputs[out0 + i]
        _agree(f"carried '{outer}' and body input '{param}' differ", scope[outer], t[param],
               f"body.inputs[{lead + i}]", at, "the body's carried inputs take the initial "
               "values' shapes")
        _agree(f"body input '{param}' and its next value '{result}' differ", t[param],
               t[result], f"body.outputs[{out0 + i}]", at,
               "a carried tensor keeps its shape on every iteration")
        _agree(f"final value '{rec.outputs[i]}' and carried '{outer}' differ",
               scope[rec.outputs[i]], scope[outer], f"outputs[{i}]", at, "")
    trips = rec.max_trips
    if rec.kind == "scan":
        trips = _scan_trips(rec, scope, body, lead + n_carry, at)
    for j, outer in enumerate(rec.scans):
        result = t[body.outputs[out0 + n_carry + j]]
        axis = rec.output_axes[j] if rec.kind == "scan" else 0
        if not 0 <= axis <= len(result.shape):
            raise IRError(f"output axis {axis} is out of range", at(f"output_axes[{j}]"))
        shape = result.shape[:axis] + (trips,) + result.shape[axis:]
        _agree(f"scan output '{outer}' does not stack its body result", scope[outer],
               Tensor(shape, result.dtype), f"scans[{j}]", at,
               "a scan output is the body's result stacked on the iteration axis")


def _scan_trips(rec: ControlOp, scope, body: Region, first: int, at) -> int:
    trips = None
    for k, outer in enumerate(rec.scan_inputs):
        src, axis = scope[outer], rec.input_axes[k]
        if not 0 <= axis < len(src.shape):
            raise IRError(f"scan axis {axis} is out of range for '{outer}'",
                          at(f"input_axes[{k}]"))
        if trips is not None and src.shape[axis] != trips:
            raise IRError(f"scan inputs disagree on the number of iterations "
                          f"({src.shape[axis]} against {trips})", at(f"scan_inputs[{k}]"))
        trips = src.shape[axis]
        param = body.tensors[body.inputs[first + k]]
        _agree(f"the body's slice of '{outer}' differs", param,
               Tensor(src.shape[:axis] + src.shape[axis + 1:], src.dtype),
               f"body.inputs[{first + k}]", at, "a scan input's slice drops its scan axis")
    if trips is None:
        raise IRError("a scan needs at least one scan input", at("scan_inputs"))
    return trips
