"""Compiled code whose sizes are parameters: one build serves every size of a symbolic
module whose tile programs have the same structure (C++ for CPUs; CUDA, `cuda_unit_source`).

The code generators decide with integers (extents, strides, rows per block, grids): a
symbolic module's CPU code is generated for the sizes a run binds (`tilekit.ir.dims
.instantiate`). Generating is cheap (a fraction of a second for a 2-layer GPT-2); building
the C++ is not (about 10 s). So the build is shared across sizes instead:

- **abstract** a generated module: every kernel's tile program (lowered, as printed) with
  each *size leaf* taken out: an integer or float constant of an expression (not a template
  argument of the micro-kernels: `gemm_micro<mr, nr>`), and the grid. What is left, the
  *structure*, keeps everything else: statements, loop kinds, buffers and their shapes, types,
  whether a kernel has one block, which thread runs it (the program entry runs a kernel of
  one block, or of little work, on the team's first thread with no barrier: sharing such a
  kernel out whatever its grid made a 2-layer BERT 8% slower on one thread). The code
  generators keep the structure the same across sizes where they can: given the axes
  whose extents vary (`tilekit.runtime.family.varying_axes`), no decision that shapes the
  code reads those extents, and sizes that may be 0 or 1 are named constants, so the
  arithmetic around them keeps its form (`tilekit.schedule.cpu.CpuTiles.varying`).
- a **template** is one structure with, per leaf, a constant or a *hole*: the leaves whose
  values differ between the sizes it was made from (the sizes asked for and a few more of
  the symbols' ranges, kept when their structure is the same). Printed by the C++ printer
  with each hole read from the unit's size tables (`tk_iz`, `tk_fz`: tilekit.tile.cpp
  `size_tables`), filled by `tk_set_sizes` before a run.
- a size **matches** a template when its structure is the template's and every leaf that is
  no hole has the template's value; its holes' values are then its own leaves. A matched size
  runs the template's build with those values, which computes what its own program would: the
  same statements, the same numbers. A size that matches none makes a new template (and a
  build, cached by its source like any other).

On CUDA the same templates print with the CUDA printer, the tables in constant memory
(`cuda_unit_source`); a kernel's grid is its launch's (each size's own record) and is no
leaf, and the CUDA generators are told the varying axes too (`tilekit.schedule.shape.Target
.varying`: lane groups along a varying reduction are a warp).

This is what DietCode's shape-generic kernels are for the code that tilekit's schedules
make: the variants are the structures, the dispatch rule is the match, and the number of
builds grows with the structures a run meets, not with its sizes (docs/dims.md).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from tilekit.errors import InternalError
from tilekit.tile.cstyle import SIZE_TABLES
from tilekit.tile.expr import FLOAT_DTYPES, INT_DTYPES, Call, Cast, Const, Expr, Load, Var
from tilekit.tile.functions import FUNCTIONS
from tilekit.tile.nodes import Buffer, Comment, Kernel, Let, seq

#: The unit's size tables (printed by tilekit.tile.cpp `size_tables`): names and types.
(INT_SIZES, INT_TYPE), (FLOAT_SIZES, FLOAT_TYPE) = SIZE_TABLES
#: Calls some of whose arguments must be constants of the printed code (template arguments,
#: PTX immediates): the positions of those arguments. They are no leaves (a size that changes
#: one has another structure).
CONSTANT_ARGUMENTS = {
    # the C++ runtime's templates (tilekit.tile.cpp): their leading template arguments
    **{f.name: tuple(range(f.templated)) for f in FUNCTIONS.values() if f.templated},
    # the CUDA intrinsics (tilekit.tile.cuda)
    "warp_sum": (1,), "warp_prod": (1,), "warp_max": (1,), "warp_min": (1,),
    "cp_async_wait": (0,), "bulk_wait": (0,), "bulk_wait_read": (0,), "wgmma_wait": (1,),
    "setmaxnreg_inc": (0,), "setmaxnreg_dec": (0,),
    **{f: (3, 4, 5) for f in ("wgmma_f16", "wgmma_bf16", "wgmma_tf32")}}


# -- leaves: one traversal, used both to read them and to replace them --------------------

def _is_leaf(e: Const) -> bool:
    """A constant a size may change: a number (not a truth value)."""
    return e.dtype in INT_DTYPES or e.dtype in FLOAT_DTYPES


class _Walk:
    """Rebuilds a tile program with `leaf(value, dtype)` in place of every size leaf, in one
    fixed order. Comments and the shapes of global (flat) buffers are no part of the
    structure: a comment may name a size, and the printer never reads a flat shape."""

    def __init__(self, leaf: Callable[[Any, str], Any], blank: bool) -> None:
        self.leaf = leaf
        self.blank = blank          # comments and flat shapes out (a structure), else kept

    def kernel(self, k: Kernel) -> Kernel:
        grid = self.leaf(k.grid, "grid")
        self.leaf(k.smem_bytes, "smem")      # its block memory: a leaf, no field of its own
        shared = tuple(dataclasses.replace(b, offset=self.leaf(b.offset, "dim"),
                                           shape=tuple(self.leaf(d, "dim") for d in b.shape))
                       for b in k.shared)
        k = dataclasses.replace(k, shared=shared, body=self.node(k.body), grid=grid,
                                calls=tuple(self.kernel(c) for c in k.calls))
        if not self.blank:
            return k
        return dataclasses.replace(
            k, params=tuple(dataclasses.replace(b, shape=(0,), comment="") for b in k.params),
            shared=tuple(dataclasses.replace(b, comment="") for b in k.shared), comments=())

    def node(self, x: Any) -> Any:
        if isinstance(x, Const):
            return self.leaf(x.value, x.dtype) if _is_leaf(x) else x
        if isinstance(x, Comment):
            return Comment("") if self.blank else x
        if isinstance(x, Buffer):
            return dataclasses.replace(x, comment="") if self.blank else x
        if isinstance(x, Call) and x.fn in CONSTANT_ARGUMENTS:
            kept = CONSTANT_ARGUMENTS[x.fn]
            return dataclasses.replace(x, args=tuple(a if n in kept else self.node(a)
                                                     for n, a in enumerate(x.args)))
        if isinstance(x, tuple):
            return tuple(self.node(i) for i in x)
        if dataclasses.is_dataclass(x) and not isinstance(x, type):
            changes = {}
            for f in dataclasses.fields(x):
                v = getattr(x, f.name)
                if isinstance(v, (tuple, Expr)) or dataclasses.is_dataclass(v):
                    new = self.node(v)
                    if new is not v:
                        changes[f.name] = new
            return dataclasses.replace(x, **changes) if changes else x
        return x


@dataclass(frozen=True)
class Abstract:
    """A generated module's structure (`kernels`: each tile program with its leaves zeroed,
    and what the unit prints from its record) and its leaves, in walk order."""

    structure: tuple
    leaves: tuple


def abstract(kernels: Sequence[Any]) -> Abstract:
    """The structure and leaves of generated kernels (`GeneratedKernel`s, of one target)."""
    leaves: list = []
    # the C++ entries print a grid of one block differently; a CUDA kernel's grid is its
    # launch's (the runtime takes each size's own), never printed: no leaf that differs. A
    # CUDA kernel's shared memory is declared by its size (static or dynamic, and how
    # much), so its buffers' offsets and shapes are part of its structure.
    cpu = any(g.target == "cpu" for g in kernels)

    def leaf(value, dtype):
        if dtype == "grid":
            leaves.append(value if cpu else 0)
            return (1 if value == 1 else 2) if cpu else 0
        leaves.append(value)
        if not cpu and dtype in ("smem", "dim"):
            return value
        return 0 if dtype in ("smem", "dim") else Const(0, dtype)

    walk = _Walk(leaf, blank=True)
    structure = tuple(
        (g.name, g.entry, g.ops, g.shape, g.args, g.writes, g.block,
         bool(g.schedule.get("one_thread")), walk.kernel(g.program))
        for g in kernels)
    return Abstract(structure, tuple(leaves))


@dataclass(frozen=True)
class Template:
    """A structure with holes: `holes` are leaf positions (in walk order) whose values a size
    gives; every other leaf is `constants`'s value. `slots` (one per hole, in order) groups
    holes that were equal at every size the template was made from (the same size: a
    sequence length as an extent, a loop bound and a divisor), which must be equal at a size
    that matches: one table entry and one local constant each, so that the compiler sees a
    remainder and a quotient by the same value (one division)."""

    structure: tuple
    constants: tuple
    holes: tuple[int, ...]
    slots: tuple[int, ...]

    def match(self, a: Abstract) -> bool:
        if a.structure != self.structure:
            return False
        holes = set(self.holes)
        if not all(i in holes or x == y for i, (x, y) in enumerate(zip(a.leaves,
                                                                       self.constants))):
            return False
        first: dict[int, Any] = {}
        return all(first.setdefault(slot, a.leaves[i]) == a.leaves[i]
                   for i, slot in zip(self.holes, self.slots))

    def widened(self, a: Abstract) -> "Template":
        """This template with holes also where `a` (of its structure) differs, and a slot's
        holes apart where `a` gives them different values."""
        holes = sorted(set(self.holes) | {i for i, (x, y) in enumerate(zip(a.leaves,
                                                                           self.constants))
                                          if x != y})
        slot_of = dict(zip(self.holes, self.slots))
        keys = [(slot_of.get(i, ("new", i)), a.leaves[i]) for i in holes]
        return Template(self.structure, self.constants, tuple(holes), _numbered(keys))

    def values(self, a: Abstract) -> tuple[tuple[int, ...], tuple[float, ...]]:
        """The size tables of a matched size: one value per slot, integers and floats
        apart."""
        ints, floats, seen = [], [], set()
        for i, slot in zip(self.holes, self.slots):
            if slot not in seen:
                seen.add(slot)
                (floats if isinstance(a.leaves[i], float) else ints).append(a.leaves[i])
        return tuple(int(v) for v in ints), tuple(float(v) for v in floats)


def _numbered(keys: Sequence[Any]) -> tuple[int, ...]:
    """Slots numbered in order of first appearance: equal keys, one slot."""
    index: dict[Any, int] = {}
    return tuple(index.setdefault(k, len(index)) for k in keys)


def template(samples: Sequence[Abstract]) -> Template:
    """The template of samples of one structure: a hole wherever their leaves differ, holes
    equal at every sample (and of one kind) in one slot."""
    first = samples[0]
    assert all(s.structure == first.structure for s in samples[1:])
    holes = tuple(i for i, v in enumerate(first.leaves)
                  if any(s.leaves[i] != v for s in samples[1:]))
    keys = [(type(first.leaves[i]).__name__, tuple(s.leaves[i] for s in samples))
            for i in holes]
    return Template(first.structure, first.leaves, holes, _numbered(keys))


def programs(t: Template) -> list[tuple[Kernel, Expr | int]]:
    """The tile programs of template `t` (its structure's, so the same text for every size
    it serves: no comment of one size) with every hole a read of the size tables (grids and
    shared buffers' offsets and shapes included), and each kernel's block memory (a hole's
    read, or the constant)."""
    holes = set(t.holes)
    kinds: dict[int, tuple[str, int]] = {}      # hole position -> (table, entry)
    entries: dict[int, tuple[str, int]] = {}    # slot -> (table, entry)
    counts = {"i": 0, "f": 0}
    for pos, slot in zip(t.holes, t.slots):
        if slot not in entries:
            kind = "f" if isinstance(t.constants[pos], float) else "i"
            entries[slot] = (kind, counts[kind])
            counts[kind] += 1
        kinds[pos] = entries[slot]
    position = [0]
    memory: list = [0]                # the kernel's block memory (its "smem" leaf)
    hoisted: dict[str, Let] = {}      # the body's hole values, read once at its start

    def leaf(_, dtype):
        pos = position[0]
        position[0] += 1
        value = t.constants[pos]
        plain = dtype in ("grid", "smem", "dim")       # no expression's constant
        if pos not in holes:
            made = value if plain else Const(value, dtype)
            if dtype == "smem":
                memory[0] = made
            return made
        kind, slot = kinds[pos]
        table = FLOAT_SIZES if kind == "f" else INT_SIZES
        read = Load(table, (Const(slot, "int32"),), FLOAT_TYPE if kind == "f" else INT_TYPE)
        target = "int32" if plain else dtype
        read = read if read.dtype == target else Cast(read, target)
        if dtype == "smem":
            memory[0] = read
        if plain:
            return read
        # a local constant: the compiler knows it for the whole body (a table read inside a
        # loop may be read again after every store it cannot tell apart from the table)
        var = Var(f"tk_z{kind}{slot}" + ("" if target in ("int32", "float32") else
                                          f"_{target}"), target)
        hoisted[var.name] = Let(var, read)
        return var

    walk = _Walk(leaf, blank=False)
    out = []
    for entry in t.structure:
        hoisted.clear()
        made = walk.kernel(entry[-1])
        if made.calls:
            raise InternalError(f"kernel {made.name} composes others: its sizes cannot be "
                                "parameters")
        made = dataclasses.replace(
            made, body=seq(*(hoisted[n] for n in sorted(hoisted)), made.body),
            comments=("sizes are parameters: read from the size tables",))
        out.append((made, memory[0]))
    return out


@dataclass(frozen=True)
class Unit:
    """A template's translation unit (kernels, size tables; a CPU unit's program entries
    too) and the size tables of one size that matches it: a CPU unit's integer table ends
    with the program's block memory."""

    source: str
    ints: tuple[int, ...]
    floats: tuple[float, ...]


def unit_source(t: Template, records: Sequence[Any]) -> str:
    """The translation unit of template `t` (the same for every size that matches it;
    `records`: such a size's codegen records, for the entries and the argument table): the
    kernels and the program entries printed as for any module (tilekit.codegen.cpu_program),
    with the holes, the grids and the block memory read from the size tables."""
    from tilekit.codegen.cpu_program import program_calls
    from tilekit.codegen.cxx import RUNTIME_TAIL
    from tilekit.tile import cpp

    made = programs(t)
    ints, floats = _table_lengths(t)
    memory = Cast(Load(INT_SIZES, (Const(ints, "int32"),), INT_TYPE), "int32")
    source = cpp.unit_text([cpp.kernel_text(p, smem) for p, smem in made],
                           sizes=(ints + 1, floats)) + RUNTIME_TAIL
    calls = program_calls(records, [p.grid for p, _ in made])
    return source + cpp.program_entries(calls, memory)


def _table_lengths(t: Template) -> tuple[int, int]:
    """How many integers and floats template `t`'s size tables hold (one per slot)."""
    ints = len({slot for pos, slot in zip(t.holes, t.slots)
                if not isinstance(t.constants[pos], float)})
    return ints, len(set(t.slots)) - ints


def cuda_unit_source(t: Template, kernels: Sequence[Any]) -> str:
    """The CUDA translation unit of template `t` (the same for every size that matches it;
    `kernels`: such a size's generated kernels, for the defines and half types their files
    need): every kernel printed as tk-codegen prints it, its holes read from the size tables
    in constant memory. Grids, block memory and TMA descriptors are not in the unit: the
    runtime launches each size with its own kernels' records."""
    from tilekit.tile import cuda

    return cuda.unit_text([cuda.kernel_text(p) for p, _ in programs(t)],
                          [g.defines for g in kernels], any(g.uses_half for g in kernels),
                          sizes=_table_lengths(t))


def cuda_unit(t: Template, a: Abstract, kernels: Sequence[Any],
              source: str | None = None) -> Unit:
    """The CUDA unit that runs a size matching template `t` (`a`: the size's abstract,
    `kernels`: its generated kernels): the template's source (`cuda_unit_source`, printed here
    unless given) and the size's tables."""
    ints, floats = t.values(a)
    return Unit(source if source is not None else cuda_unit_source(t, kernels), ints, floats)


def unit(t: Template, a: Abstract, records: Sequence[Any], source: str | None = None) -> Unit:
    """The unit that runs a size matching template `t` (`a`: the size's abstract, `records`
    its codegen records): the template's source (`unit_source`, printed here unless given)
    and the size's tables, the integers ending with the program's block memory."""
    from tilekit.codegen.cpu_program import block_memory

    ints, floats = t.values(a)
    return Unit(source if source is not None else unit_source(t, records),
                ints + (block_memory(records),), floats)


__all__ = ["Abstract", "CONSTANT_ARGUMENTS", "FLOAT_SIZES", "INT_SIZES", "Template", "Unit",
           "abstract", "cuda_unit", "cuda_unit_source", "programs", "template", "unit",
           "unit_source"]
