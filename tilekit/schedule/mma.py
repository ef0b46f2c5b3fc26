"""Tensor cores as data: which contractions run on `mma.sync`, and how a tile maps onto warps.

A **contraction** is a sum over reduction axes of a product of two reads (times constants):
`c[i,j] += a[i,k] * b[k,j]`, a batched matmul, a convolution (`x[n,c,h*s+kh-p,...] *
w[f,c,kh,kw]` is an implicit GEMM). Its spatial axes that only the first read uses are **M**,
those only the second uses are **N**, those both use are **batch**; its reduction axes are
**K** and both reads must use each of them. A tile (block sizes per spatial axis, steps per
reduction axis) then gives a block GEMM of `BM = prod(block[M]) x BN = prod(block[N])` over
`BK = prod(step[K])` per step, with every batch axis' block 1.

`MMA` is the table of instructions the code generator emits (PTX ISA shapes): fp16 and bf16
inputs with fp32 accumulation on m16n8k16, fp32 inputs as TF32 on m16n8k8, the latter only
when the user asked for it (`tk-roll --precision tf32`: TF32 keeps 10 of fp32's 23 mantissa
bits, so it is never chosen silently). A profile offers an instruction when its
`compute.mma` lists `mma.sync` for that dtype (hw profiles).

`mma_plan(...)` is the one decision of how a tile runs on tensor cores: the warps' arrangement
(`wm x wn` warps, each a `WM x WN` warp tile of `MT x NT` instructions), each operand's layout
in shared memory (`[mn][k]` or `[k][mn]`, rows padded by 16 bytes so that `ldmatrix` rows
fall in distinct banks) and whether it is copied with `cp.async` (its rows are contiguous
16-byte chunks of the tensor), the pipeline depth and the shared memory. The cost model prices
it and codegen (tilekit.codegen.mma) emits it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

from tilekit.expr.analysis import index_map
from tilekit.expr.ast import Access, Binary, Call, Node, Num
from tilekit.schedule.residency import blocks_per_sm
from tilekit.tile.passes.layout import conflict_free_pad

#: Instruction per compute type: (name, m, n, k, profile dtype key, element bytes in smem).
MMA = {
    "float16": ("m16n8k16.f16", 16, 8, 16, "fp16", 2),
    "bfloat16": ("m16n8k16.bf16", 16, 8, 16, "bf16", 2),
    "tf32": ("m16n8k8.tf32", 16, 8, 8, "tf32", 4),
}
#: Precision settings of fp32 contractions: "fp32" (CUDA cores) or "tf32" (tensor cores).
PRECISIONS = ("fp32", "tf32")
WARP = 32


@dataclass(frozen=True)
class Operand:
    """One read of a contraction, as a block GEMM operand."""

    index: int                      # position in OpFacts.reads
    mn_axes: tuple[str, ...]        # M axes (A) or N axes (B), output order
    k_inner: bool                   # stored [mn][k] (k contiguous), else [k][mn]
    async_axis: str | None          # cp.async along this axis (the global rows' axis), or None
    #: the axis indexing each dimension of the tensor when every index is a plain axis (one
    #: axis, coefficient 1, no constant, each axis once): a strided matrix (or a batch of
    #: them) that a TMA box copies; None for gathers (convolution windows), strided or
    #: offset reads
    dim_axes: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Contraction:
    """The GEMM view of an op (see the module docstring)."""

    a: Operand
    b: Operand
    m_axes: tuple[str, ...]
    n_axes: tuple[str, ...]
    batch_axes: tuple[str, ...]
    k_axes: tuple[str, ...]
    scale: float
    dtype: str                      # of both reads: float16, bfloat16, float32


def product_factors(body: Node) -> tuple[list[Access], float] | None:
    """A body that is a product of reads and numbers: (the reads, the numbers' product)."""
    if isinstance(body, Access):
        return [body], 1.0
    if isinstance(body, Num):
        return [], float(body.value)
    if isinstance(body, Binary) and body.op == "*":
        lhs, rhs = product_factors(body.lhs), product_factors(body.rhs)
        if lhs is None or rhs is None:
            return None
        return lhs[0] + rhs[0], lhs[1] * rhs[1]
    if isinstance(body, Binary) and body.op == "/" and isinstance(body.rhs, Num) \
            and float(body.rhs.value) != 0.0:
        lhs = product_factors(body.lhs)
        return None if lhs is None else (lhs[0], lhs[1] / float(body.rhs.value))
    if isinstance(body, Call) and body.fn == "float32" and len(body.args) == 1:
        return product_factors(body.args[0])  # a widening cast of an fp16 product
    return None


def contraction(spatial, reduction, assign: str, body: Node, reads) -> Contraction | str:
    """The op as a contraction, or why it is not one. `reads` are the op's distinct reads
    (tilekit.schedule.shape.ReadFacts) in body order."""
    if assign != "+=" or not reduction:
        return "not a sum over reduction axes"
    factors = product_factors(body)
    if factors is None or len(factors[0]) != 2:
        return "the body is not a product of two reads"
    (x, y), scale = factors
    by_key = {(r.tensor, tuple(str(m) for m in r.maps)): i for i, r in enumerate(reads)}

    def key(node: Access):
        return (node.tensor, tuple(str(index_map(i)) for i in node.indices))

    if key(x) not in by_key or key(y) not in by_key or key(x) == key(y):
        return "the two factors are not two distinct reads"
    ia, ib = by_key[key(x)], by_key[key(y)]
    ra, rb = reads[ia], reads[ib]
    if not (ra.affine and rb.affine):
        return "a read is not affine"
    if ra.dtype != rb.dtype:
        return "the two reads have different dtypes"
    used_a = {a for m in ra.maps for a in m.axes}
    used_b = {a for m in rb.maps for a in m.axes}
    names = [a for a, _ in spatial]
    k_axes = tuple(a for a, _ in reduction)
    if any(a not in used_a or a not in used_b for a in k_axes):
        return "a reduction axis is not read by both factors"
    m_axes = tuple(a for a in names if a in used_a and a not in used_b)
    n_axes = tuple(a for a in names if a in used_b and a not in used_a)
    batch = tuple(a for a in names if a in used_a and a in used_b)
    if len(m_axes) + len(n_axes) + len(batch) != len(names):
        return "an output axis is read by neither factor"
    if not m_axes or not n_axes:
        return "no M or no N axis (a matrix-vector product)"
    return Contraction(_operand(ia, ra, m_axes, k_axes), _operand(ib, rb, n_axes, k_axes),
                       m_axes, n_axes, batch, k_axes, scale, ra.dtype)


def _operand(index: int, read, mn_axes, k_axes) -> Operand:
    last = read.maps[-1]
    inner = {a for a, _ in last.terms}
    k_inner = bool(inner & set(k_axes)) and not (inner & set(mn_axes))
    group = k_axes if k_inner else mn_axes
    # cp.async copies whole rows of the shared tile: the tensor's last dimension must be
    # exactly the group's innermost axis (coefficient 1) and no other dimension may use it.
    axis = group[-1]
    plain = dict(last.terms) == {axis: 1} and last.const == 0
    alone = all(axis not in m.axes for m in read.maps[:-1])
    return Operand(index, tuple(mn_axes), k_inner, axis if plain and alone else None,
                   _plain_axes(read.maps))


def _plain_axes(maps) -> tuple[str, ...] | None:
    """The axis of each index when every index is one axis with coefficient 1 and no
    constant, each axis once (Operand.dim_axes); else None."""
    axes = tuple(m.plain_axis for m in maps)
    return axes if None not in axes and len(set(axes)) == len(axes) else None


# -- the plan of a tile ---------------------------------------------------------------------

@dataclass(frozen=True)
class MmaPlan:
    """How a tile of a contraction runs on tensor cores (see the module docstring)."""

    contraction: Contraction
    compute: str                    # float16 | bfloat16 | tf32 (a key of MMA)
    bm: int
    bn: int
    bk: int
    wm: int                         # warps along M
    wn: int                         # warps along N
    stages: int
    a_async: bool
    b_async: bool
    smem_bytes: int

    @property
    def instruction(self) -> tuple:
        return MMA[self.compute]

    @property
    def warps(self) -> int:
        return self.wm * self.wn

    @property
    def warp_m(self) -> int:
        return self.bm // self.wm

    @property
    def warp_n(self) -> int:
        return self.bn // self.wn

    @property
    def mt(self) -> int:
        return self.warp_m // 16

    @property
    def nt(self) -> int:
        return self.warp_n // 8

    def tile_shape(self, operand: Operand) -> tuple[int, int]:
        """(rows, row length before padding) of an operand's shared tile."""
        mn = self.bm if operand is self.contraction.a else self.bn
        return (mn, self.bk) if operand.k_inner else (self.bk, mn)

    def row_pad(self, operand: Operand) -> int:
        """Elements of padding per row of an operand's tile (the layout pass's rule)."""
        return conflict_free_pad(self.tile_shape(operand)[1], self.instruction[5])

    def record(self) -> dict:
        c = self.contraction
        return {"instruction": f"mma.sync.{self.instruction[0]}", "warps": [self.wm, self.wn],
                "block_gemm": [self.bm, self.bn, self.bk], "stages": self.stages,
                "layout": {"a": "mk" if c.a.k_inner else "km",
                           "b": "nk" if c.b.k_inner else "kn"},
                "cp_async": [n for n, on in (("a", self.a_async), ("b", self.b_async)) if on]}


# -- Hopper: warpgroup MMA (wgmma) with TMA ----------------------------------------------------

#: wgmma.mma_async per compute type: (PTX type, profile dtype key, element bytes, K of one
#: instruction: 32 bytes of elements). tf32 (fp32 contractions rolled with `--precision
#: tf32`, never otherwise) reads both operands K-major from shared memory: a contraction with
#: an M- or N-major operand keeps mma.sync for tf32.
WGMMA = {"float16": ("f16", "fp16", 2, 16), "bfloat16": ("bf16", "bf16", 2, 16),
         "tf32": ("tf32", "tf32", 4, 8)}
#: Reduction points per step: one 128-byte swizzle row of 16-bit elements (two rows of 32
#: for tf32: a K-major tile is then two swizzle atoms along K).
WGMMA_BK = 64
#: wgmma's M per instruction, and a warpgroup's threads.
WGMMA_M = 64
WARPGROUP = 128
#: The block GEMM's N is one instruction's N (a multiple of 64: whole swizzle rows).
WGMMA_N = (64, 128, 256)
#: Accumulators per consumer thread at most (M-instructions x N / 2): beyond, registers spill.
WGMMA_MAX_ACC = 128
#: Register budgets of the warpgroups after `setmaxnreg` (two consumers: 40 x 128 + 232 x 256
#: of the 64 K registers; the producer only issues copies).
PRODUCER_REGS = 40
CONSUMER_REGS = 232
#: Pipeline depth bounds (stages of shared memory).
WGMMA_STAGES = (2, 4)
#: The shared base is rounded up to this (a 128-byte swizzle repeats every 1024 bytes).
SWIZZLE_ALIGN = 1024
#: Registers of a wgmma kernel's threads (occupancy: the cost model and the persistent grid):
#: with two consumers, what __launch_bounds__(384, 1) gives every thread at launch (65536 /
#: 384, rounded down to 8; setmaxnreg moves them from the producer to the consumers); with
#: one, the accumulators and this much more, in units of 8 (ptxas 13.0, sm_90a: 128
#: accumulators took 168 registers).
WGMMA_TWO_CONSUMER_REGS = 168
WGMMA_BASE_REGS = 40
#: The tile order: consecutive pieces of work walk `RASTER_GROUP` tiles down M, then the
#: next N column of that group (Triton's "GROUP_M", CUTLASS's swizzled rasterisation), so a
#: wave of blocks shares a few A row panels and B column panels in L2 instead of sweeping
#: all of B for each row of tiles.
RASTER_GROUP = 8


@dataclass(frozen=True)
class WgmmaPlan:
    """How a tile of a contraction runs as a Hopper kernel (tilekit.codegen.wgmma): a
    producer warpgroup issues TMA box copies of the A and B tiles (128-byte swizzle) into
    `stages` shared buffers, completing on mbarriers; `consumers` warpgroups each own
    `BM / consumers` rows of the block GEMM and run `mt` wgmma.m64nBNkK per k-slice of K
    (16; tf32 8),
    reading both operands from shared memory through descriptors, fp32 accumulators in
    registers; the epilogue maps each accumulator back through the stage's chain."""

    contraction: Contraction
    compute: str                    # float16 | bfloat16 | tf32 (a key of WGMMA)
    bm: int
    bn: int
    bk: int
    consumers: int
    stages: int
    smem_bytes: int
    #: split-K: the reduction cut into `split` slices of `steps_per_split` steps, a block per
    #: output tile and slice writing fp32 partial sums; a second kernel adds them in slice
    #: order (deterministic) and runs the chain (1: no split)
    split: int = 1
    steps_per_split: int = 0
    #: output tiles (blocks of the block GEMM over the output); with `split` slices each,
    #: `units` = tiles x split pieces of work
    tiles: int = 1
    #: blocks launched: `units` (a block per piece of work), or fewer (persistent: each block
    #: loops over pieces `blockIdx + i x gridDim`; `persistent_blocks`)
    grid: int = 1
    #: the epilogue stores through shared memory with TMA (`tma_store_reason`) when > 0:
    #: this many strip buffers of `BM` rows of 128 bytes, each consumer warpgroup staging its
    #: rows in column strips (2: one filled while the other is stored; `store_buffers`)
    store_buffers: int = 0

    @property
    def threads(self) -> int:
        return WARPGROUP * (self.consumers + 1)

    @property
    def units(self) -> int:
        """Pieces of work: an output tile and a slice of the reduction each."""
        return self.tiles * self.split

    @property
    def persistent(self) -> bool:
        """Fewer blocks than pieces of work: each block loops over several."""
        return self.grid < self.units

    @property
    def tma_store(self) -> bool:
        return self.store_buffers > 0

    @property
    def registers(self) -> int:
        """Registers per thread the occupancy assumes (`wgmma_registers`)."""
        return wgmma_registers(self.consumers, self.mt * self.bn // 2)

    @property
    def mt(self) -> int:
        """M-instructions (64 rows each) per consumer warpgroup."""
        return self.bm // (WGMMA_M * self.consumers)

    @property
    def item(self) -> int:
        return WGMMA[self.compute][2]

    @property
    def ik(self) -> int:
        """Reduction points of one wgmma instruction (16, tf32 8)."""
        return WGMMA[self.compute][3]

    @property
    def row(self) -> int:
        """Elements of one 128-byte swizzle row (64, tf32 32)."""
        return 128 // self.item

    @property
    def atoms(self) -> int:
        """Swizzle rows per K-major tile row of a step (1, tf32 2)."""
        return self.bk // self.row

    def tile_bytes(self, operand: Operand) -> int:
        mn = self.bm if operand is self.contraction.a else self.bn
        return mn * self.bk * self.item

    @property
    def stage_bytes(self) -> int:
        return (self.bm + self.bn) * self.bk * self.item

    @property
    def setmaxnreg(self) -> tuple[int, int] | None:
        """(producer, consumer) registers after setmaxnreg: with two consumers, whose
        accumulators need more than the 168 registers 384 threads get at launch."""
        return (PRODUCER_REGS, CONSUMER_REGS) if self.consumers == 2 else None

    def record(self) -> dict:
        c = self.contraction
        out = {"instruction": f"wgmma.mma_async.m64n{self.bn}k{self.ik}.f32."
                              f"{WGMMA[self.compute][0]}",
               "warpgroups": {"producer": 1, "consumers": self.consumers},
               "block_gemm": [self.bm, self.bn, self.bk], "stages": self.stages,
               "layout": {"a": "mk" if c.a.k_inner else "km",
                          "b": "nk" if c.b.k_inner else "kn"},
               "tma": ["a", "b"], "swizzle": 128,
               "epilogue": "tma_store" if self.tma_store else "direct"}
        if self.tma_store:
            out["store_buffers"] = self.store_buffers
        if self.split > 1:
            out["split_k"] = {"slices": self.split, "steps": self.steps_per_split,
                              "reduce": "a second kernel, slices added in order"}
        out["schedule"] = {"blocks": self.grid, "tiles": self.units,
                           "persistent": self.persistent,
                           "order": f"groups of {RASTER_GROUP} tiles along M"}
        return out


def wgmma_offered(profile, arch: str | None = None) -> frozenset[str]:
    """The compute types the profile runs on wgmma (its `compute.mma` lists
    `wgmma.mma_async` for the dtype), when the arch is Hopper's (sm_90 or sm_90a: the
    kernels are built for sm_90a)."""
    from tilekit.hw.profile import compute_capability

    if profile is None or profile.kind != "simt":
        return frozenset()
    if compute_capability(arch or profile.arch) != (9, 0):
        return frozenset()
    keys = {s.dtype for s in profile.mma_shapes if s.instruction == "wgmma.mma_async"}
    return frozenset(c for c, entry in WGMMA.items() if entry[1] in keys)


def tma_operand(op: Operand, c: Contraction, shape: Sequence[int], item: int) -> str | None:
    """Why a TMA box cannot load this operand's tiles (None: it can): a plain strided tensor
    (every index one axis), one M or N axis and one K axis, its contiguous dimension either,
    its rows whole 16-byte units (TMA's stride rule), at most 5 dimensions."""
    if op.dim_axes is None:
        return "a read that is not a plain strided tensor (a gather, an offset or a stride)"
    if len(op.mn_axes) != 1 or len(c.k_axes) != 1:
        return "several M, N or K axes"
    if op.dim_axes[-1] not in (op.mn_axes[0], c.k_axes[0]):
        return "the contiguous dimension is neither its M/N axis nor its K axis"
    if len(shape) > 5:
        return "more than 5 dimensions"
    if (shape[-1] * item) % 16:
        return f"rows of {shape[-1] * item} bytes, not whole 16-byte units"
    if any(d >= 2 ** 31 for d in shape):
        return "a dimension of 2^31 elements or more"
    return None


def wgmma_registers(consumers: int, accumulators: int) -> int:
    """Registers per thread of a wgmma kernel with this many consumers and accumulators per
    consumer thread (`WGMMA_TWO_CONSUMER_REGS`, `WGMMA_BASE_REGS`)."""
    if consumers == 2:
        return WGMMA_TWO_CONSUMER_REGS
    return -(-(accumulators + WGMMA_BASE_REGS) // 8) * 8


def persistent_blocks(threads: int, registers: int, smem_bytes: int, units: int,
                      profile) -> int:
    """Blocks to launch for `units` pieces of work: one per piece while they fit in one
    wave of resident blocks (the profile's SMs x the blocks an SM holds:
    tilekit.schedule.residency.blocks_per_sm), else that wave, each block looping over
    pieces (persistent). Without a profile (or a non-SIMT one): a block per piece."""
    if profile is None or getattr(profile, "kind", None) != "simt":
        return units
    per_sm, _ = blocks_per_sm(profile, threads, registers, smem_bytes)
    slots = int(profile.sm_count) * max(int(per_sm), 1)
    return units if units <= slots else slots


def wgmma_smem(bm: int, bn: int, stages: int, item: int = 2, buffers: int = 0) -> int:
    """Shared memory of a wgmma block (tilekit.codegen.wgmma's layout): the stages of A and
    B, the TMA store's `buffers` strip buffers (`BM` rows of `STORE_STRIP` bytes each),
    2 x stages mbarriers, the slack that aligns the base."""
    return (stages * (bm + bn) * WGMMA_BK * item + buffers * bm * STORE_STRIP
            + 16 * stages + (SWIZZLE_ALIGN - 16))


def store_buffer_choices(bn: int) -> tuple[int, ...]:
    """Strip buffer counts a TMA-store epilogue with an N block of `bn` may take, preferred
    first: two when a tile has an even number of strips for every output dtype (`bn` >= 128:
    2 or more of 64 16-bit columns, 4 or more of 32 fp32), so that a warpgroup fills one
    while the other is being stored (the buffer alternates strip by strip across tiles);
    else one."""
    return (2, 1) if bn >= 128 else (1,)


#: Bytes of a row of the TMA store's strip buffer: one 128-byte swizzle row (32 fp32 or 64
#: 16-bit outputs per strip).
STORE_STRIP = 128


def tma_store_reason(c: Contraction, spatial, split: int) -> str | None:
    """Why the epilogue of this contraction cannot store its tile with TMA (None: it can):
    the output (an op's output is row-major over its spatial axes) must end with the M axis
    then the N axis (batch axes before), N a multiple of 8 (rows of whole 16-byte units for
    any 16- or 32-bit output; the code generator checks the stored tensor's dtype), no split-K
    (the partial sums go to a scratch buffer)."""
    if split > 1:
        return "split-K stores partial sums"
    names = [a for a, _ in spatial]
    if len(c.m_axes) != 1 or len(c.n_axes) != 1 or names[-2:] != [c.m_axes[0], c.n_axes[0]]:
        return "the output's last two axes are not M then N"
    extents = dict(spatial)
    if extents[c.n_axes[0]] % 8:
        return f"N = {extents[c.n_axes[0]]} is not a multiple of 8"
    if len(spatial) > 5 or any(n >= 2 ** 31 for _, n in spatial):
        return "more than 5 dimensions or one of 2^31 elements"
    return None


#: Split-K factors tk-roll tries for contractions whose output tiles leave SMs idle.
SPLIT_K = (2, 4, 8, 16, 32)


def split_steps(k_extent: int, split: int) -> tuple[int, int]:
    """(slices, steps per slice) of a split-K over `k_extent` reduction points in steps of
    `WGMMA_BK`: every slice has at least one step (fewer slices when `split` asks more)."""
    steps = -(-k_extent // WGMMA_BK)
    per = -(-steps // max(1, split))
    return -(-steps // per), per


def wgmma_plan(c: Contraction, spatial, reduction, block: Sequence[int], step: Sequence[int],
               threads: int, compute: str, smem_limit: int, extents_of, split: int = 1,
               profile=None) -> WgmmaPlan | str:
    """The Hopper plan of this tile, or why it has none: the tile's threads are its
    consumer warpgroups (128 or 256; the producer warpgroup is added), its block a whole
    number of 64-row instructions per consumer by one instruction's N (64, 128 or 256), its
    step 64 along the one K axis, both operands loaded by TMA (`tma_operand`); `split`:
    split-K slices (`split_steps`); `profile`: the blocks to launch (`persistent_blocks`;
    without one, a block per tile and slice)."""
    item = WGMMA[compute][2]
    size = {a: b for (a, _), b in zip(spatial, block)}
    size.update({a: s for (a, _), s in zip(reduction, step)})
    for op in (c.a, c.b):
        why = tma_operand(op, c, extents_of(op.index), item)
        if why is not None:
            return f"TMA: {why}"
    if compute == "tf32" and not (c.a.k_inner and c.b.k_inner):
        return "tf32 wgmma reads K-major operands only (an operand is M- or N-major)"
    if any(size[a] != 1 for a in c.batch_axes):
        return "a batch axis has a block of more than 1"
    bm, bn, bk = size[c.m_axes[0]], size[c.n_axes[0]], size[c.k_axes[0]]
    k_extent = dict(reduction)[c.k_axes[0]]
    if bk != WGMMA_BK and not bk == k_extent < WGMMA_BK:   # a short K is one (padded) step
        return f"the reduction step is {bk}, not {WGMMA_BK}"
    if threads % WARPGROUP or threads // WARPGROUP not in (1, 2):
        return f"{threads} threads are not one or two consumer warpgroups"
    consumers = threads // WARPGROUP
    if bn not in WGMMA_N:
        return f"N block {bn} is not one of {WGMMA_N}"
    if bm % (WGMMA_M * consumers) or bm // (WGMMA_M * consumers) not in (1, 2):
        return f"M block {bm} is not 1 or 2 instructions of {WGMMA_M} rows per consumer"
    if bm // (WGMMA_M * consumers) * bn // 2 > WGMMA_MAX_ACC:
        return f"{bm // consumers}x{bn} accumulators per warpgroup exceed the registers"
    slices, per = split_steps(k_extent, split)
    # the most stages first, then the most strip buffers of the TMA store (if any) with them
    choices = store_buffer_choices(bn) if tma_store_reason(c, spatial, slices) is None \
        else (0,)
    best = None
    for buffers in choices:
        fits = [n for n in range(WGMMA_STAGES[1], WGMMA_STAGES[0] - 1, -1)
                if wgmma_smem(bm, bn, n, item, buffers) <= smem_limit]
        if fits and (best is None or fits[0] > best[0]):
            best = (fits[0], buffers)
    if best is None:
        return (f"{WGMMA_STAGES[0]} stages of {(bm + bn) * bk * item} bytes do not fit "
                f"{smem_limit} bytes")
    stages, buffers = best
    tiles = math.prod(-(-n // size[a]) for a, n in spatial)
    plan = WgmmaPlan(c, compute, bm, bn, WGMMA_BK, consumers, stages,
                     wgmma_smem(bm, bn, stages, item, buffers), slices, per, tiles,
                     tiles * slices, buffers)
    return replace(plan, grid=persistent_blocks(plan.threads, plan.registers,
                                                plan.smem_bytes, plan.units, profile))


def compute_type(dtype: str, precision: str) -> str | None:
    if dtype in ("float16", "bfloat16"):
        return dtype
    if dtype == "float32" and precision == "tf32":
        return "tf32"
    return None


def offered(profile) -> frozenset[str]:
    """The compute types whose mma.sync instruction the profile lists (none without one)."""
    if profile is None or profile.kind != "simt":
        return frozenset()
    keys = {s.dtype for s in profile.mma_shapes if s.instruction == "mma.sync"}
    return frozenset(c for c, entry in MMA.items() if entry[4] in keys)


def mma_plan(c: Contraction, spatial, reduction, block: Sequence[int], step: Sequence[int],
             threads: int, compute: str, smem_limit: int, extents_of) -> MmaPlan | str:
    """The plan of this tile, or why the tile cannot run on tensor cores. `extents_of(read
    index)` gives a read's tensor shape (for the cp.async alignment rules)."""
    extent = dict(spatial) | dict(reduction)
    name, im, inn, ik, _, item = MMA[compute]
    size = {a: b for (a, _), b in zip(spatial, block)}
    size.update({a: s for (a, _), s in zip(reduction, step)})
    if any(size[a] != 1 for a in c.batch_axes):
        return "a batch axis has a block of more than 1"
    bm = math.prod(size[a] for a in c.m_axes)
    bn = math.prod(size[a] for a in c.n_axes)
    bk = math.prod(size[a] for a in c.k_axes)
    if bk % ik:
        return f"the reduction step ({bk}) is not a multiple of {ik}"
    if threads % WARP:
        return "the block is not whole warps"
    warps = threads // WARP
    shapes = [(wm, warps // wm) for wm in range(1, warps + 1) if warps % wm == 0]
    fits = [(wm, wn) for wm, wn in shapes if bm % (im * wm) == 0 and bn % (2 * inn * wn) == 0]
    if not fits:
        return (f"{warps} warps cannot split a {bm}x{bn} block into warp tiles of whole "
                f"{im}x{2 * inn} instruction pairs")
    wm, wn = min(fits, key=lambda s: (abs(math.log2((bm / s[0]) / (bn / s[1]))), s))
    a_async = _async_ok(c.a, c, size, extent, extents_of(c.a.index), item)
    b_async = _async_ok(c.b, c, size, extent, extents_of(c.b.index), item)
    per_stage = sum(rows * (length + conflict_free_pad(length, item)) * item
                    for rows, length in ((bm, bk) if c.a.k_inner else (bk, bm),
                                         (bn, bk) if c.b.k_inner else (bk, bn)))
    stages = 3 if (a_async or b_async) and 3 * per_stage <= smem_limit else 2
    if stages * per_stage > smem_limit:
        return f"{stages} stages of {per_stage} bytes do not fit {smem_limit} bytes"
    return MmaPlan(c, compute, bm, bn, bk, wm, wn, stages, a_async, b_async,
                   stages * per_stage)


def _async_ok(op: Operand, c: Contraction, size, extent, shape, item: int) -> bool:
    """cp.async of whole 16-byte chunks: the row axis is the only one of its group with a
    block larger than 1, and the tile's rows, the tensor's rows and the axis' extent are whole
    chunks (a chunk is then wholly inside or wholly outside the tensor, and aligned)."""
    if op.async_axis is None:
        return False
    group = c.k_axes if op.k_inner else op.mn_axes
    if any(size[a] != 1 for a in group if a != op.async_axis):
        return False
    chunk = 16 // item
    return (size[op.async_axis] % chunk == 0 and shape[-1] % chunk == 0
            and extent[op.async_axis] % chunk == 0)


def recorded_precision(module) -> str:
    """The fp32 precision the module was rolled with (`tk-roll --precision`; "fp32" unless
    the roll stage records another)."""
    for stage in reversed(module.stages):
        if stage.get("name") == "roll":
            return str((stage.get("options") or {}).get("precision", "fp32"))
    return "fp32"
