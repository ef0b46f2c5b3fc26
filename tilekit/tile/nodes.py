"""Tile programs: a kernel as data, between the schedule (tiles) and the code (printers).

A `Kernel` is what one block of a grid computes, written once for every target:

- **launch**: a grid of `grid` blocks, `threads` threads per block (a CPU runs the threads of
  a block one after another), the block's index and the grid's size as the values `BLOCK`
  and `NBLOCKS` (tilekit.tile.expr), so that a persistent kernel (tk-ram's programs, tk-grind's
  device loops) can run the same body as block `b` of its own grid (`CallBody`);
- **buffers** (`Buffer`) with a memory scope: `global` (the kernel's parameters, flat),
  `shared` (one block's fast memory: byte offsets from one base, a layout with padding or a
  swizzle), `local` (per thread: registers or, on a CPU, an array per thread);
- **statements** (`Stmt`): block-level code (the same for every thread: tile origins, the
  reduction-step loop, barriers) and **thread regions** (`Threads`): code each thread of the
  block runs with its own index. Barriers sit between regions, never inside one; a local
  buffer may live across regions (an accumulator of a register tile across reduction steps),
  a scalar declared outside a region is never assigned inside one;
- **tile operations** that lowering passes turn into loops (`Copy`), loops with a kind
  (`serial`, `unroll`: wholly or by `unroll` iterations, `parallel`: spread over the block's
  threads, `pipelined`: copies overlapped with compute over `stages` buffers);
- synchronisation: `Barrier` (the block), warp collectives and intrinsics by name
  (tilekit.tile.functions), `CallBody` of another kernel's body, grid barriers and progress
  counters through intrinsics.

Nodes are frozen and compare structurally: a lowering pass is a function kernel -> kernel,
tested by comparing its result with an expected kernel (tests/unit/test_tile_passes.py).
Nothing here is text: `tilekit.tile.text` prints the IR for people, `tilekit.tile.cuda` and
`tilekit.tile.cpp` print it for compilers.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Iterator

from tilekit.tile.expr import ITEMSIZE, Const, Expr, Var, as_expr, linear

SCOPES = ("global", "shared", "local")
LOOP_KINDS = ("serial", "unroll", "parallel", "pipelined", "simd")
#: Every shared buffer starts at a multiple of this many bytes.
SMEM_ALIGN = 16
#: Static shared memory a CUDA kernel may declare without opting in (every NVIDIA arch).
STATIC_SMEM_LIMIT = 48 * 1024


@dataclass(frozen=True)
class Layout:
    """How a buffer's logical index maps to its storage (shared memory): `pad` extra elements
    after every row (the innermost dimension), so that a warp's column reads fall in
    different banks; or `swizzle` bytes (an XOR of the 16-byte chunk index with the row,
    over rows of `swizzle` bytes: CUTLASS's 128-byte swizzle is `swizzle=128`)."""

    pad: int = 0
    swizzle: int = 0

    def row_length(self, shape: tuple[int, ...]) -> int:
        return (shape[-1] if shape else 1) + self.pad


@dataclass(frozen=True)
class Buffer:
    name: str
    scope: str
    dtype: str
    shape: tuple[int, ...]
    layout: Layout = Layout()
    offset: int = 0                  # shared: bytes from the block's shared base
    comment: str = ""
    access: str = "read"             # global: read | write (a written one is not const)
    align: int = 0                   # local: bytes its storage is aligned to (vector
                                     # accesses to it; 0: its dtype's alignment)

    def __post_init__(self) -> None:
        if self.scope not in SCOPES:
            raise ValueError(f"buffer {self.name}: unknown scope {self.scope!r}")

    @property
    def elements(self) -> int:
        """Elements of storage (padding included)."""
        n = 1
        for d in self.shape[:-1]:
            n *= d
        return n * self.layout.row_length(self.shape)

    @property
    def nbytes(self) -> int:
        return self.elements * ITEMSIZE[self.dtype]

    @property
    def aligned_bytes(self) -> int:
        return -(-self.nbytes // SMEM_ALIGN) * SMEM_ALIGN

    def flat(self, index: tuple[Expr, ...]) -> Expr:
        """The element offset of `index` in storage (row-major, padded rows, swizzled)."""
        if len(index) != len(self.shape):
            raise ValueError(f"buffer {self.name} has {len(self.shape)} dimension(s), indexed "
                             f"with {len(index)}")
        if not self.shape:
            return Const(0, "int32")
        row = self.layout.row_length(self.shape)
        strides, acc = [], 1
        for k in range(len(self.shape) - 1, -1, -1):
            strides.append(acc)
            acc = acc * (row if k == len(self.shape) - 1 else self.shape[k])
        strides.reverse()
        dtype = "int64" if any(i.dtype == "int64" for i in index) else "int32"
        if all(isinstance(s, int) for s in strides):
            return linear(zip(strides, index), 0, dtype)
        # sizes read at run time (tilekit.codegen.parametric): the same sum, unsimplified
        out: Expr = Const(0, dtype)
        for stride, i in zip(strides, index):
            out = out + stride * i
        return out


# -- statements -----------------------------------------------------------------------------

class Stmt:
    __slots__ = ()


@dataclass(frozen=True)
class Seq(Stmt):
    body: tuple[Stmt, ...]
    scoped: bool = False           # printed as a `{ ... }` block of its own


@dataclass(frozen=True)
class Comment(Stmt):
    text: str


@dataclass(frozen=True)
class Let(Stmt):
    """`var = value`, constant for the rest of the enclosing sequence."""

    var: Var
    value: Expr


@dataclass(frozen=True)
class Decl(Stmt):
    """A mutable scalar, `init` (or undefined until assigned)."""

    var: Var
    init: Expr | None = None


@dataclass(frozen=True)
class Assign(Stmt):
    var: Var
    value: Expr


@dataclass(frozen=True)
class Alloc(Stmt):
    """A local buffer, declared here (each thread's own: registers, a register tile)."""

    buffer: Buffer


@dataclass(frozen=True)
class Store(Stmt):
    buffer: str
    index: tuple[Expr, ...]
    value: Expr
    lanes: int = 1                 # a vector store of `lanes` consecutive elements


@dataclass(frozen=True)
class Evaluate(Stmt):
    """A call for its effect (an intrinsic)."""

    call: Expr


@dataclass(frozen=True)
class For(Stmt):
    var: Var
    start: Expr
    stop: Expr
    body: Stmt
    step: Expr = Const(1, "int32")
    kind: str = "serial"
    stages: int = 0                # pipelined: buffers in flight
    unroll: int = 0                # unroll: by this many iterations (0: all of them)

    def __post_init__(self) -> None:
        if self.kind not in LOOP_KINDS:
            raise ValueError(f"unknown loop kind {self.kind!r}")


@dataclass(frozen=True)
class While(Stmt):
    cond: Expr
    body: Stmt


@dataclass(frozen=True)
class Break(Stmt):
    pass


@dataclass(frozen=True)
class Continue(Stmt):
    pass


@dataclass(frozen=True)
class If(Stmt):
    cond: Expr
    then: Stmt
    other: Stmt | None = None


@dataclass(frozen=True)
class Switch(Stmt):
    """`cases[k][1]` where `value == cases[k][0]` (nothing when no case matches)."""

    value: Expr
    cases: tuple[tuple[int, Stmt], ...]


@dataclass(frozen=True)
class Threads(Stmt):
    """A thread region: `body` runs once per thread `var` in [0, count) of the block."""

    var: Var
    count: int
    body: Stmt


@dataclass(frozen=True)
class Barrier(Stmt):
    """Every thread of the block meets here (block-level code only)."""


@dataclass(frozen=True)
class CallBody(Stmt):
    """Run kernel `kernel`'s body (a kernel of the enclosing kernel's `calls`) as block
    `block` of a grid of `nblocks` blocks, with the caller's shared base and threads: the
    caller's tensors named by `args` in the callee's parameter order."""

    kernel: str
    args: tuple[str, ...]
    block: Expr
    nblocks: Expr


@dataclass(frozen=True)
class Copy(Stmt):
    """Tile operation: every element `l` of a tile of `dst` (its dimensions after the fixed
    leading indices `dst_prefix`, one variable of `local` each) gets `src[offset]` where
    `valid` holds and `pad` elsewhere, all the block's threads together. `offset` and `valid`
    are expressions in `local` (and block-level values): a box of a tensor, or a gathered
    tile (an implicit GEMM's convolution window).

    Lowered by `tilekit.tile.passes.lower_copies` (the local index bound to the threads);
    `vector` (elements per access: `tilekit.tile.passes.vectorize` proves when 4 float32
    elements move as one 16-byte access) and `asynchronous` (cp.async 16-byte chunks, sm_80+)
    choose the instructions."""

    dst: str
    dst_prefix: tuple[Expr, ...]
    local: tuple[Var, ...]
    src: str
    offset: Expr
    valid: Expr
    pad: Expr
    vector: int = 1
    asynchronous: bool = False


@dataclass(frozen=True)
class Table:
    """A constant integer table in device memory (a program's work lists)."""

    name: str
    values: tuple[int, ...]


@dataclass(frozen=True)
class TensorMap:
    """A TMA descriptor of a global buffer, passed by value as a kernel parameter (`name`,
    read by the `tma_load_<r>d` intrinsics as the variable `Var(name, "ptr")`): the tensor
    `buffer` seen as `dims` elements (innermost first, TMA's order) with byte `strides` for
    the dimensions after the first, copied in `box`es (innermost first) into shared memory
    with a `swizzle`-byte swizzle (0: none). The host encodes it before the launch
    (`cuTensorMapEncodeTiled`), from the kernel record's copy of these fields."""

    name: str
    buffer: str
    dtype: str
    dims: tuple[int, ...]
    strides: tuple[int, ...]
    box: tuple[int, ...]
    swizzle: int = 128

    @property
    def box_bytes(self) -> int:
        n = ITEMSIZE[self.dtype]
        for b in self.box:
            n *= b
        return n


@dataclass(frozen=True)
class Kernel:
    """One kernel (see the module docstring). `params` are global buffers in parameter
    order; `counters` > 0 adds the progress-counter workspace (uint32 words) as a last
    parameter; `min_blocks` is the launch bounds' blocks per SM (None: the compiler's own
    heuristic, 1: the register tile decides the registers)."""

    name: str
    params: tuple[Buffer, ...]
    shared: tuple[Buffer, ...]
    body: Stmt
    threads: int
    grid: int
    min_blocks: int | None = None
    comments: tuple[str, ...] = ()
    calls: tuple["Kernel", ...] = ()
    tables: tuple[Table, ...] = ()
    counters: int = 0
    grid_sync: bool = False        # uses grid barriers: a cooperative launch
    #: TMA descriptors passed after the other parameters (sm_90)
    tensor_maps: tuple[TensorMap, ...] = ()
    #: the shared base's alignment in bytes: above SMEM_ALIGN the entry rounds its shared
    #: memory up to it at run time (128-byte swizzled tiles need 1024), from that much more
    smem_align: int = SMEM_ALIGN

    def buffer(self, name: str) -> Buffer:
        for b in self.params + self.shared:
            if b.name == name:
                return b
        for s in walk(self.body):
            if isinstance(s, Alloc) and s.buffer.name == name:
                return s.buffer
        raise KeyError(name)

    def buffers(self) -> dict[str, Buffer]:
        out = {b.name: b for b in self.params + self.shared}
        out.update({s.buffer.name: s.buffer for s in walk(self.body) if isinstance(s, Alloc)})
        return out

    @property
    def smem_bytes(self) -> int:
        """Shared memory the body uses (its own buffers; a composing kernel: the largest of
        its callees', which all start at the one base)."""
        own = max((b.offset + b.aligned_bytes for b in self.shared), default=0)
        called = max((k.smem_bytes for k in self.calls), default=0)
        end = max(own, called)
        return -(-end // SMEM_ALIGN) * SMEM_ALIGN + self.smem_slack

    @property
    def smem_slack(self) -> int:
        """Bytes declared beyond the buffers so that the base can be rounded up to
        `smem_align` (the declared memory is SMEM_ALIGN-aligned already)."""
        return max(self.smem_align - SMEM_ALIGN, 0)

    def callee(self, name: str) -> "Kernel":
        for k in self.calls:
            if k.name == name:
                return k
        raise KeyError(name)


# -- walking ---------------------------------------------------------------------------------

def children(s: Stmt) -> tuple[Stmt, ...]:
    if isinstance(s, Seq):
        return s.body
    if isinstance(s, Switch):
        return tuple(body for _, body in s.cases)
    if isinstance(s, (For, While, Threads)):
        return (s.body,)
    if isinstance(s, If):
        return (s.then,) if s.other is None else (s.then, s.other)
    return ()


def walk(s: Stmt) -> Iterator[Stmt]:
    """Every statement under `s` (itself first), depth first, in program order."""
    stack = [s]
    while stack:
        x = stack.pop()
        yield x
        stack.extend(reversed(children(x)))


def exprs(s: Stmt) -> Iterator[Expr]:
    """The expressions a statement holds directly (not its children's)."""
    if isinstance(s, (Let, Assign)):
        yield s.value
    elif isinstance(s, Decl):
        if s.init is not None:
            yield s.init
    elif isinstance(s, Store):
        yield from s.index
        yield s.value
    elif isinstance(s, Evaluate):
        yield s.call
    elif isinstance(s, For):
        yield from (s.start, s.stop, s.step)
    elif isinstance(s, (While, If)):
        yield s.cond
    elif isinstance(s, Switch):
        yield s.value
    elif isinstance(s, CallBody):
        yield from (s.block, s.nblocks)
    elif isinstance(s, Copy):
        yield from s.dst_prefix
        yield from (s.offset, s.valid, s.pad)


def rebuild(s: Stmt, kids: tuple[Stmt, ...]) -> Stmt:
    """`s` with its children replaced (in `children` order)."""
    if isinstance(s, Seq):
        return replace(s, body=kids)
    if isinstance(s, Switch):
        return replace(s, cases=tuple((v, k) for (v, _), k in zip(s.cases, kids)))
    if isinstance(s, (For, While, Threads)):
        return replace(s, body=kids[0])
    if isinstance(s, If):
        return replace(s, then=kids[0], other=kids[1] if len(kids) > 1 else None)
    return s


def transform(s: Stmt, fn) -> Stmt:
    """Bottom-up rewrite: `fn(node)` is applied to every statement after its children were
    rewritten; it returns the replacement (or the node itself)."""
    kids = children(s)
    if kids:
        new = tuple(transform(k, fn) for k in kids)
        if new != kids:
            s = rebuild(s, new)
    return fn(s)


def seq(*stmts: Stmt | None) -> Stmt:
    """A sequence, nested sequences flattened, `None`s dropped."""
    out: list[Stmt] = []
    for s in stmts:
        if s is None:
            continue
        if isinstance(s, Seq) and not s.scoped:
            out.extend(s.body)
        else:
            out.append(s)
    return out[0] if len(out) == 1 else Seq(tuple(out))


def uses_barriers(k: Kernel) -> bool:
    """Does the body meet at block barriers (its own or a callee's)?"""
    return any(isinstance(s, Barrier) for s in walk(k.body)) or any(
        uses_barriers(c) for c in k.calls)


def calls_any(k: Kernel, fns) -> bool:
    """Does the body (or a callee's) call one of the functions `fns`?"""
    from tilekit.tile.expr import Call, children as expr_children

    for s in walk(k.body):
        for e in exprs(s):
            stack = [e]
            while stack:
                x = stack.pop()
                if isinstance(x, Call) and x.fn in fns:
                    return True
                stack.extend(expr_children(x))
    return any(calls_any(c, fns) for c in k.calls)


def uses_warp_collectives(k: Kernel) -> bool:
    from tilekit.tile.functions import WARP_COLLECTIVES

    return calls_any(k, WARP_COLLECTIVES)


def threads_independent(k: Kernel) -> bool:
    """No block barrier and no warp collective: its threads never exchange values, so it
    runs on blocks of any size (thread-strided, or guarded to its own threads)."""
    return not uses_barriers(k) and not uses_warp_collectives(k)


__all__ = [
    "LOOP_KINDS", "SCOPES", "SMEM_ALIGN", "STATIC_SMEM_LIMIT", "Alloc", "Assign", "Barrier", "Break", "Buffer",
    "CallBody", "Comment", "Continue", "Copy", "Decl", "Evaluate", "For", "If", "Kernel",
    "Layout", "Let", "Seq", "Stmt", "Store", "Switch", "Table", "TensorMap", "Threads", "While",
    "as_expr",
    "calls_any", "children", "exprs", "rebuild", "seq", "threads_independent", "transform",
    "uses_barriers", "uses_warp_collectives", "walk",
]
