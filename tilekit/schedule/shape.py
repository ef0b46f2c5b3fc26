"""The one decision of a kernel's shape, read by the cost model and the code generator alike.

Given an op (its axes, its distinct reads, three facts about its body) and a tile, which
kernel runs it, with which threads and which shared memory:

- `wgmma`: on Hopper (sm_90), an fp16/bf16 contraction of two plain strided operands whose
  tile is one or two consumer warpgroups of 64-row wgmma instructions by one instruction's N
  with steps of 64 (`tilekit.schedule.mma.wgmma_plan`): TMA, mbarriers, wgmma;
- `mma`: a contraction (a sum of products of two reads: matmul, batched matmul, convolution
  as implicit GEMM) whose compute type has an `mma.sync` instruction on the profile (fp16,
  bf16; fp32 only with the explicit precision `tf32`) and whose tile maps onto whole warps of
  instruction tiles (`tilekit.schedule.mma.mma_plan`);
- `simt`: on CUDA, a float32 contraction on CUDA cores (a matmul, a batched matmul, a
  convolution as implicit GEMM) not split in K whose tile has the SIMT GEMM's form
  (`tilekit.schedule.simt.simt_plan`: thread tiles of 4 or 8 per axis group, steps of 4-32
  or of whole windows, double-buffered shared memory);
- `staged`: a reduction whose reads are all affine, whose body uses no axis value and no
  `select` guard, and where some read's per-step box is used at least `MIN_REUSE` times per
  element (points of the block tile x step >= MIN_REUSE x box volume), unless the reads used
  once are `STREAM_RATIO` times the reused ones' bytes and walk the reduction contiguously
  (then `default` with lanes streams them). Every distinct read's
  box (halo included, not clamped: boxes of boundary tiles overhang the tensor and load
  padding) is staged in shared memory per reduction step, **in the tensor's own storage type**
  (a float16 box takes 2 bytes an element), each buffer rounded up to 16 bytes.
- `default` with lanes: a reduction that is not staged and whose innermost reduction axis walks
  a tensor's contiguous dimension for at least `LANE_MIN_EXTENT` elements (a row sum, a
  softmax max): a warp per output point reads the row coalesced, and the tile is set aside;
- `tiled`: any other op with a tile (a block tile per block, a register tile per thread);
- `default`: an op without a tile.

`decide` is the scalar form (codegen, reports, the agreement test); the cost model evaluates
the same rules over arrays of candidate tiles (`tilekit.roll.cost`), and the agreement test
(tests/unit/test_shape_agreement.py) checks both against what codegen generates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Collection, Mapping

from tilekit.expr.ast import Access, Axis, Call, Node, children, walk
from tilekit.expr.box import Span, map_box
from tilekit.ir.payloads import Tile
from tilekit.tile.nodes import SMEM_ALIGN
from tilekit.schedule.defaults import (DEFAULT_THREADS, LANE_MIN_EXTENT, STATIC_SMEM_LIMIT,
                                       WARP, default_grid, lane_count)
from tilekit.schedule.cpu import CpuTiles, cpu_tiles
from tilekit.schedule.simt import SimtPlan, simt_plan
from tilekit.schedule.mma import (Contraction, MmaPlan, WgmmaPlan, compute_type, contraction,
                                  mma_plan, offered, wgmma_offered, wgmma_plan)

#: A read is worth staging when each element of its box is used this many times per step.
MIN_REUSE = 2
#: ... unless the reads that staging reuses are this many times smaller (bytes per step)
#: than the reads used once, and those walk the innermost reduction axis contiguously: then
#: a warp per output point streams them coalesced, with every SM busy, where a staged kernel
#: would have a block per output tile (a GEMV, a batch-1 fully connected layer: few blocks,
#: each pulling a weight strip through one SM; measured 3x slower on AlexNet, H100).
STREAM_RATIO = 8
#: Bytes of one element of each IR dtype, in memory and in a staged buffer.
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int64": 8, "int32": 4,
            "int16": 2, "int8": 1, "uint8": 1, "bool": 1}
#: Every shared buffer starts on a 16-byte boundary (vector loads, `cp.async`).


def buffer_bytes(count: int, dtype: str) -> int:
    """Bytes of a shared buffer of `count` elements of `dtype`, rounded up to `SMEM_ALIGN`."""
    return align_smem(count * ITEMSIZE[dtype])


def align_smem(nbytes: int) -> int:
    """`nbytes` rounded up to `SMEM_ALIGN` (where the next shared buffer may start)."""
    return -(-nbytes // SMEM_ALIGN) * SMEM_ALIGN


@dataclass(frozen=True)
class ReadFacts:
    """One distinct read (tensor and index maps) of an op."""

    tensor: str
    dtype: str
    shape: tuple[int, ...]
    maps: tuple                       # tilekit.expr.IndexMap per dimension

    @property
    def affine(self) -> bool:
        return all(m.affine for m in self.maps)

    @property
    def key(self) -> tuple:
        return (self.tensor, tuple(str(m) for m in self.maps))


@dataclass(frozen=True)
class OpFacts:
    """What the shape decision needs to know of an op."""

    spatial: tuple[tuple[str, int], ...]
    reduction: tuple[tuple[str, int], ...]
    reads: tuple[ReadFacts, ...]      # distinct, in body order
    uses_axis_values: bool
    guarded: bool                     # the body holds select() (masks, inlined padding)
    contiguous_reduction: bool
    contraction: Contraction | str = "not analysed"   # the GEMM view, or why there is none
    #: the axes whose extents vary with a symbol (a symbolic module's size:
    #: `Target.varying`): lanes along a varying innermost reduction are a warp, not a
    #: function of this size's extent; a SIMT GEMM's rows along one are loaded element by
    #: element (whether they are 16-byte units changes with the size)
    varying: frozenset[str] = frozenset()

    @property
    def stageable(self) -> str | None:
        """Why no tile can make this op `staged` (None: some tile can)."""
        if not self.reduction:
            return "not a reduction"
        if not self.reads:
            return "no reads"
        if not all(r.affine for r in self.reads):
            return "a read is not affine"
        if self.uses_axis_values:
            return "the body uses an axis value"
        if self.guarded:
            return "the body has guarded reads (select)"
        return None

    @property
    def lanes(self) -> int:
        return lane_count(self.reduction, self.contiguous_reduction,
                          bool(self.reduction) and self.reduction[-1][0] in self.varying)


def body_uses_axis_values(body: Node, axes: Collection[str] | None = None) -> bool:
    """Does the body use an axis (one of `axes`, when given) as a value (outside indices)?"""
    def visit(node) -> bool:
        if isinstance(node, Axis):
            return axes is None or node.name in axes
        if isinstance(node, Access):
            return False
        return any(visit(c) for c in children(node))
    return visit(body)


def body_has_select(body: Node) -> bool:
    return any(isinstance(n, Call) and n.fn == "select" for n in walk(body))


def walks_contiguously(reduction, reads) -> bool:
    """Does the innermost reduction axis walk the last (contiguous) dimension of some read
    with unit stride? Then consecutive lanes read consecutive addresses."""
    if not reduction:
        return False
    axis = reduction[-1][0]
    return any(r.maps and r.maps[-1].affine and dict(r.maps[-1].terms) == {axis: 1}
               for r in reads)


def distinct_reads(reads) -> tuple[ReadFacts, ...]:
    """Reads with different (tensor, maps), in order; repeated reads share one buffer."""
    seen: dict[tuple, ReadFacts] = {}
    for r in reads:
        facts = ReadFacts(r.tensor, r.dtype, tuple(r.shape), tuple(r.maps))
        seen.setdefault(facts.key, facts)
    return tuple(seen.values())


def facts_of(spatial, reduction, body: Node, reads, assign: str,
             varying: frozenset[str] = frozenset()) -> OpFacts:
    """OpFacts of a body and its reads (objects with tensor, dtype, shape, maps); `varying`:
    OpFacts.varying."""
    reads = list(reads)
    distinct = distinct_reads(reads)
    guarded = body_has_select(body)
    uses_axes = body_uses_axis_values(body)
    gemm = contraction(spatial, reduction, assign, body, distinct) \
        if not (guarded or uses_axes) else "the body has guards or axis values"
    return OpFacts(tuple(spatial), tuple(reduction), distinct, uses_axes, guarded,
                   walks_contiguously(reduction, reads), gemm, varying)


def analysis_facts(analysis, dtypes) -> OpFacts:
    """OpFacts of an analysed statement on its own (what tk-roll sees of an op)."""
    reads = [ReadFacts(a.tensor, dtypes.get(a.tensor, "float32"), a.shape, a.maps)
             for a in analysis.accesses]
    return facts_of(analysis.spatial, analysis.reduction, analysis.stmt.body, reads,
                    analysis.assign)


# -- boxes ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class StagedBox:
    """One read's box per reduction step, staged in shared memory."""

    read: ReadFacts
    extents: tuple[int, ...]          # per tensor dimension, halo included, not clamped
    adjust: tuple[int, ...]           # how far below each map's constant the box starts

    @property
    def volume(self) -> int:
        return math.prod(self.extents)

    @property
    def bytes(self) -> int:
        return buffer_bytes(self.volume, self.read.dtype)


def tile_lengths(facts: OpFacts, tile: Tile) -> dict[str, int]:
    out = {a: b for (a, _), b in zip(facts.spatial, tile.block)}
    out.update({a: s for (a, _), s in zip(facts.reduction, tile.step)})
    return out


def staged_box(read: ReadFacts, lengths: dict[str, int]) -> StagedBox:
    """The read's box for a tile at the origin (tilekit.expr.box)."""
    spans = map_box(read.maps, {a: Span.of(0, n) for a, n in lengths.items()}, read.shape)
    return StagedBox(read, tuple(s.length for s in spans),
                     tuple(m.const - s.lo.const for m, s in zip(read.maps, spans)))


def staged_boxes(facts: OpFacts, tile: Tile) -> tuple[StagedBox, ...]:
    lengths = tile_lengths(facts, tile)
    return tuple(staged_box(r, lengths) for r in facts.reads)


def reuse_reason(facts: OpFacts, tile: Tile) -> str | None:
    """Why `tile` does not make `facts` staged (None: it does)."""
    why = facts.stageable
    if why is not None:
        return why
    points = math.prod(tile.block) * math.prod(tile.step)
    boxes = staged_boxes(facts, tile)
    reused = [points >= MIN_REUSE * b.volume for b in boxes]
    if not any(reused):
        return "no read is reused within a block tile"
    once = [b for b, r in zip(boxes, reused) if not r]
    reused_bytes = sum(b.bytes for b, r in zip(boxes, reused) if r)
    if (once and facts.lanes >= WARP
            and all(walks_contiguously(facts.reduction, [b.read]) for b in once)
            and STREAM_RATIO * reused_bytes <= sum(b.bytes for b in once)):
        return ("the reads used once dominate every step and walk the reduction "
                "contiguously: streamed by lanes")
    return None


def fit_steps(facts: OpFacts, tile: Tile, limit: int) -> Tile | None:
    """`tile` with reduction steps halved (largest first) until the staged buffers fit
    `limit` bytes; None when even steps of 1 do not."""
    step = list(tile.step)
    while True:
        t = Tile(tile.block, tile.thread, tuple(step), tile.source)
        if sum(b.bytes for b in staged_boxes(facts, t)) <= limit:
            return t
        k = max(range(len(step)), key=lambda i: step[i]) if step else None
        if k is None or step[k] == 1:
            return None
        step[k] = max(1, step[k] // 2)


# -- the decision ---------------------------------------------------------------------------

@dataclass(frozen=True)
class KernelShape:
    """How one op (or one stage of a group) runs."""

    shape: str                        # wgmma | mma | simt | staged | tiled | default
    tile: Tile | None                 # as run (staged: steps fitted to shared memory)
    threads: int
    lanes: int = 1
    staged: tuple[StagedBox, ...] = ()
    note: str = ""                    # why the tile was set aside or changed
    mma: MmaPlan | None = None
    wgmma: WgmmaPlan | None = None
    simt: SimtPlan | None = None
    split: "StagedSplit | None" = None   # a staged kernel's split-K (staged_split)

    @property
    def smem_bytes(self) -> int:
        if self.simt is not None:
            return self.simt.smem_bytes
        if self.mma is not None:
            return self.mma.smem_bytes
        if self.wgmma is not None:
            return self.wgmma.smem_bytes
        return sum(b.bytes for b in self.staged) + (SPLIT_FLAG_BYTES if self.split else 0)

    def record(self) -> dict:
        """The `kernel` entry of a rolled tile (what codegen will generate)."""
        out = {"shape": self.shape, "threads": self.threads, "smem_bytes": self.smem_bytes}
        if self.mma is not None:
            out["mma"] = self.mma.record()
        if self.wgmma is not None:
            out["wgmma"] = self.wgmma.record()
        if self.simt is not None:
            out["simt"] = self.simt.record()
        if self.lanes > 1:
            out["lanes"] = self.lanes
        if self.staged:
            out["staged"] = [{"tensor": b.read.tensor, "box": list(b.extents)}
                             for b in self.staged]
        if self.tile is not None and self.shape == "staged":
            out["step"] = list(self.tile.step)
        if self.split is not None:
            out["split_k"] = self.split.record()
        return out


#: Shared memory a split-K staged block adds: its "last of the tile" flag, one aligned unit.
SPLIT_FLAG_BYTES = SMEM_ALIGN


@dataclass(frozen=True)
class StagedSplit:
    """A staged kernel's split-K: the reduction axis `axis` (index among the reduction
    axes: the outermost with more than one step) cut into `slices` slices of `steps` steps
    each (the last may be shorter); the block of tile `t` and slice `s` is block
    `s x tiles + t`. Each block writes its register tile's partial sums to a scratch buffer;
    the last block of a tile to finish (a counter per tile) adds the slices in slice order
    and runs the epilogue, so the result does not depend on the order blocks finish in."""

    axis: int
    name: str
    slices: int
    steps: int            # steps of `step[axis]` per slice
    span: int             # reduction points of the axis per slice (steps x step)

    def record(self) -> dict:
        return {"axis": self.name, "slices": self.slices, "steps": self.steps}


def staged_split(reduction, step, split: int) -> StagedSplit | None:
    """The split-K of a staged tile into at most `split` slices (`reduction`: (axis,
    extent) pairs; `step`: the tile's step per reduction axis), or None when the split
    gives fewer than 2 slices (`split` 1, or no reduction axis with more than one step).
    The slices are whole steps of the outermost reduction axis that has several, each
    slice at least one step (fewer slices than asked when there are not enough)."""
    if split <= 1:
        return None
    for r, ((name, n), st) in enumerate(zip(reduction, step)):
        steps = -(-n // st)
        if steps > 1:
            per = -(-steps // split)
            slices = -(-steps // per)
            if slices < 2:
                return None
            return StagedSplit(r, name, slices, per, per * st)
    return None


def default_shape(facts: OpFacts, lanes_allowed: bool = True) -> KernelShape:
    lanes = facts.lanes if facts.reduction and lanes_allowed else 1
    return KernelShape("default", None, DEFAULT_THREADS, lanes)


#: Kinds of code a target runs: CUDA on NVIDIA GPUs, C++ on CPUs.
TARGET_KINDS = ("cuda", "cpu")


@dataclass(frozen=True)
class Target:
    """What the decision may use: the per-block shared memory, the tensor-core compute types
    the profile offers (tilekit.schedule.mma.offered), the fp32 precision setting, and the
    kind of code: a CPU runs a block's threads one after another, so its kernels use no warp
    collectives (no lane groups, no tensor cores)."""

    smem_limit: int
    mma: frozenset[str] = frozenset()
    precision: str = "fp32"
    kind: str = "cuda"
    cpu: CpuTiles | None = None     # the CPU kernels' tiles (kind cpu)
    #: the compute types that run on wgmma (Hopper: tilekit.schedule.mma.wgmma_offered)
    wgmma: frozenset[str] = frozenset()
    #: the hardware profile (a wgmma kernel's persistent grid: its SMs and occupancy)
    profile: object = field(default=None, compare=False, repr=False)
    #: code for one size of a symbolic module: the (op, axis) pairs whose extents move with
    #: its symbols (tilekit.runtime.family.varying_axes); no decision that shapes the code
    #: reads them, so that the sizes share one structure (tilekit.codegen.parametric)
    varying: frozenset[tuple[str, str]] = frozenset()

    @property
    def lanes(self) -> bool:
        """Lane groups combined by warp shuffles."""
        return self.kind == "cuda"

    def varies(self, op: str, reduction) -> bool:
        """Does the innermost of `reduction`'s (axis, extent) pairs of op `op` vary?"""
        return bool(reduction) and (op, reduction[-1][0]) in self.varying

    def any_varying(self, op: str, axes) -> bool:
        """Does the extent of any of op `op`'s `axes` vary (a symbolic module's size)?"""
        return any((op, a) in self.varying for a in axes)

    def axes_varying(self, op: str) -> frozenset[str]:
        """The axes of op `op` whose extents vary (OpFacts.varying)."""
        return frozenset(a for o, a in self.varying if o == op)

    def ragged(self, op: str, axis: str, extent: int, size: int) -> bool:
        """Do tiles or steps of `size` overhang axis `axis` (of `extent`) of op `op`: at
        this extent, or at some size of the range when the extent varies (the code keeps
        its guards and remainder whatever this size's extent is)."""
        return extent % size != 0 or (op, axis) in self.varying

    @staticmethod
    def of(profile, precision: str = "fp32", kind: str = "cuda", arch: str | None = None
           ) -> "Target":
        """The target of `profile` (its arch, or `arch` when codegen is asked for another:
        wgmma needs an sm_90 family arch)."""
        limit = int(profile.smem_per_block) if profile is not None else STATIC_SMEM_LIMIT
        if kind == "cpu":
            return Target(limit, frozenset(), precision, "cpu", cpu_tiles(profile))
        return Target(limit, offered(profile), precision, kind,
                      wgmma=wgmma_offered(profile, arch), profile=profile)


def mma_shape(facts: OpFacts, tile: Tile, target: Target, split_k: int = 1
              ) -> KernelShape | str:
    """The `wgmma` or `mma` shape of this tile, or why neither (`split_k`: the split-K slices
    tk-roll chose, wgmma only)."""
    c = facts.contraction
    if isinstance(c, str):
        return c
    compute = compute_type(c.dtype, target.precision)
    if compute is not None and compute in target.wgmma:
        hopper = wgmma_plan(c, facts.spatial, facts.reduction, tile.block, tile.step,
                            tile.threads, compute, target.smem_limit,
                            lambda i: facts.reads[i].shape, split_k, target.profile)
        if not isinstance(hopper, str):
            return KernelShape("wgmma", tile, hopper.threads, wgmma=hopper)
    if compute is None or compute not in target.mma:
        return f"no tensor-core instruction for {c.dtype} at precision {target.precision}"
    plan = mma_plan(c, facts.spatial, facts.reduction, tile.block, tile.step, tile.threads,
                    compute, target.smem_limit, lambda i: facts.reads[i].shape)
    if isinstance(plan, str):
        return plan
    return KernelShape("mma", tile, tile.threads, mma=plan)


def simt_shape(facts: OpFacts, tile: Tile, target: Target, split_k: int = 1
               ) -> KernelShape | str:
    """The `simt` shape of this tile (a float32 contraction on CUDA cores), or why not
    (`split_k` slices asked for: the SIMT GEMM has no split, such a tile runs staged)."""
    c = facts.contraction
    if isinstance(c, str):
        return c
    if target.kind != "cuda":
        return "the SIMT GEMM is a CUDA kernel"
    if split_k > 1:
        return "split in K (the staged shape splits)"
    plan = simt_plan(c, facts.spatial, facts.reduction, tile.block, tile.thread, tile.step,
                     target.smem_limit, lambda i: facts.reads[i].shape, facts.varying)
    if isinstance(plan, str):
        return plan
    return KernelShape("simt", tile, plan.threads, simt=plan)


def decide(facts: OpFacts, tile: Tile | None, target: Target | int, split_k: int = 1
           ) -> KernelShape:
    """The kernel shape of an op with `tile` (None: no stage chose one) for `target` (a
    `Target`, or just a shared-memory limit: no tensor cores), `split_k` the split-K slices
    tk-roll chose (`tile.split_k`: a wgmma tile's, or a staged tile's on CUDA:
    `staged_split`); the rules in order are the module
    docstring's."""
    if not isinstance(target, Target):
        target = Target(int(target))
    smem_limit = target.smem_limit
    if tile is None:
        return default_shape(facts, target.lanes)
    tensor = mma_shape(facts, tile, target, split_k)
    if not isinstance(tensor, str):
        return tensor
    cores = simt_shape(facts, tile, target, split_k)
    if not isinstance(cores, str):
        return cores
    why = reuse_reason(facts, tile)
    if why is not None and facts.lanes >= WARP and target.lanes:
        return KernelShape("default", None, DEFAULT_THREADS, facts.lanes,
                           note="reduction over a contiguous axis without reuse: lanes")
    if why is None:
        fitted = fit_steps(facts, tile, smem_limit)
        if fitted is not None:
            note = "" if fitted.step == tile.step else (
                f"reduction step shrunk from {list(tile.step)} to {list(fitted.step)} to fit "
                f"{smem_limit} bytes of shared memory")
            split = staged_split(facts.reduction, fitted.step, split_k) \
                if target.kind == "cuda" else None
            return KernelShape("staged", fitted, tile.threads, 1,
                               staged_boxes(facts, fitted), note, split=split)
        return KernelShape("tiled", tile, tile.threads,
                           note=f"staged buffers do not fit {smem_limit} bytes even with step "
                                "1; using the tiled shape")
    return KernelShape("tiled", tile, tile.threads)


def kept_default(op_tile) -> bool:
    """tk-roll kept the default schedule for the op whose `tile` this is: the model estimated
    it faster than every tile (`tile.rolled_estimate` holds the best tile's estimate), so
    codegen and tk-ram run the default shape, not the tile's."""
    return isinstance(op_tile, Mapping) and op_tile.get("rolled_estimate") is not None


def default_blocks(facts: OpFacts, shape: KernelShape) -> int:
    """Blocks of a default-shape kernel (grid-stride loop)."""
    points = math.prod(e for _, e in facts.spatial)
    return default_grid(points, DEFAULT_THREADS // max(shape.lanes, 1))


__all__ = ["ITEMSIZE", "KernelShape", "TARGET_KINDS", "Target", "LANE_MIN_EXTENT", "MIN_REUSE", "OpFacts", "ReadFacts",
           "SPLIT_FLAG_BYTES", "STREAM_RATIO", "StagedBox", "StagedSplit", "analysis_facts",
           "buffer_bytes", "decide", "default_shape", "facts_of", "fit_steps", "kept_default",
           "reuse_reason", "simt_shape", "staged_boxes", "staged_split"]
