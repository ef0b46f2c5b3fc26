"""fp32 contractions on CUDA cores as a CUTLASS-SIMT-class block GEMM: whether a tile runs so,
and how (read by the shape decision, the cost model and tilekit.codegen.simt).

A contraction (tilekit.schedule.mma.Contraction) of two float32 operands runs, for a tile of
`BM x BN` outputs per block, `TM x TN` per thread and `BK` reduction points per step, as a
block GEMM over its M, N and K axis groups: `BM` is the product of the block over the M
axes, `BN` over the N axes, `BK` of the step over the K axes, each flattened row-major (a
matmul has one axis per group; a convolution is an implicit GEMM: M or N the output
pixels `(n, h, w)`, K the window `(c, kh, kw)`, the input gathered through its index maps,
padding read as zero; a MatMul of 3-D activations has M = `(batch, rows)`). Then:

- **threads**: `(BM / TM) x (BN / TN)`, thread `t` at `(t / (BN / TN), t % (BN / TN))`: a
  thread's register tile is `TM / 4 x TN / 4` sub-tiles of 4 consecutive (flat) positions,
  strided by `BM / (TM / 4)` rows and `BN / (TN / 4)` columns (an 8 x 8 tile of a 128 x 128
  block: 2 x 2 sub-tiles 64 apart), so that each sub-tile's operand values are one 16-byte
  shared load; a group's register tile lies on its innermost axes (`thread` per axis);
- **shared memory**: two buffers per operand (double buffering), each `BK` rows of the M (or
  N) extent: A is stored K-major (`[k][m]`), transposed on the way when the tensor is
  K-contiguous, so that both fragments are 16-byte loads along M and N. A transposed
  operand's rows are padded by 4 floats (`TRANSPOSED_PAD`): its scalar stores then fall in 32
  distinct banks (16 rows x 2 four-wide k chunks per warp request);
- **bank behaviour**: a warp holds `32 / (BN / TN)` rows of threads whose 8-lane quarters
  (the phases of a 16-byte shared access) read one A sub-tile (a broadcast) and 8
  consecutive B sub-tiles (32 distinct banks): conflict-free. Hence `BN / TN` must be a
  multiple of 8;
- **global loads**: per step each thread loads `BM x BK / 4 / threads` chunks of 4 elements
  of A (and of B), 16-byte vector loads when four consecutive positions of the group are
  four consecutive elements of whole 16-byte units (`vector`: the tensor's indices plain,
  its last dimension the group's innermost axis, whose block or step is a multiple of 4),
  else element by element, guarded (at most `MAX_SCALAR_LOADS` per thread), padding and
  halo reads of a window as zero; chunks are assigned so that a warp request reads whole
  32-byte sectors (for a K-contiguous operand: two chunks of one row, then the next row);
- **steps**: `BK` one of `STEPS`, or, where K has several axes, a step whole over every K
  axis after the first (a window: `c x kh x kw` = 9, 18 or 36 for 3 x 3) of at most
  `MAX_WINDOW_STEP` points;
- **pipeline**: the next step's chunks are loaded into registers while the current step
  computes from the other buffer; stored after the compute, then one barrier per step.

`simt_plan` returns the plan or why the tile does not have this form; anything else keeps
the `staged` shape.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tilekit.schedule.mma import Contraction, Operand

#: Register-tile edges along M and N: sub-tiles of 4 (one 16-byte load each), one or two.
THREAD_SIZES = (4, 8)
#: Reduction points per step.
STEPS = (4, 8, 16, 32)
#: A step whole over the K axes after the first (a convolution's window) takes at most this
#: many points: each is an unrolled round of `TM x TN` multiply-adds, and a 128 x 128 block's
#: two buffers of 36 rows take 74 KiB.
MAX_WINDOW_STEP = 36
#: Floats of padding per row of a buffer filled by transposing scalar stores.
TRANSPOSED_PAD = 4
#: Threads per block (at least one warp, at most what the register tile leaves room for).
MIN_THREADS, MAX_THREADS = 32, 512
#: Thread columns (along N) per warp row must fill the 8 lanes of a 16-byte shared access.
PHASE = 8
ITEM = 4
#: Elements per thread and step an operand without 16-byte loads may take: each is a load of
#: its own address and guard (ptxas 13.0, sm_90: 64x128x32 with both operands scalar, 32
#: elements of B per thread, spilled 8 bytes at 255 registers; 16 stayed under 240).
MAX_SCALAR_LOADS = 16


@dataclass(frozen=True)
class SimtPlan:
    """How a tile of a float32 contraction runs on CUDA cores (module docstring)."""

    contraction: Contraction
    bm: int
    bn: int
    bk: int
    tm: int
    tn: int
    #: 16-byte global loads of A's and B's chunks (their rows are whole 16-byte units)
    a_vector: bool
    b_vector: bool

    @property
    def threads_m(self) -> int:
        return self.bm // self.tm

    @property
    def threads_n(self) -> int:
        return self.bn // self.tn

    @property
    def threads(self) -> int:
        return self.threads_m * self.threads_n

    def extent(self, operand: Operand) -> int:
        """The operand's M (A) or N (B) extent in the block."""
        return self.bm if operand is self.contraction.a else self.bn

    def pad(self, operand: Operand) -> int:
        """Row padding of the operand's buffers: K-contiguous operands are transposed."""
        return TRANSPOSED_PAD if operand.k_inner else 0

    def buffer_bytes(self, operand: Operand) -> int:
        return 2 * self.bk * (self.extent(operand) + self.pad(operand)) * ITEM

    @property
    def smem_bytes(self) -> int:
        c = self.contraction
        return self.buffer_bytes(c.a) + self.buffer_bytes(c.b)

    def chunks(self, operand: Operand) -> int:
        """Four-element chunks of the operand per step."""
        return self.extent(operand) * self.bk // 4

    def loads_per_thread(self, operand: Operand) -> int:
        return -(-self.chunks(operand) // self.threads)

    @property
    def registers(self) -> int:
        """Registers the tile holds: accumulators, two fragments, the next step's chunks."""
        c = self.contraction
        return (self.tm * self.tn + self.tm + self.tn
                + 4 * (self.loads_per_thread(c.a) + self.loads_per_thread(c.b)))

    def record(self) -> dict:
        c = self.contraction
        return {"block_gemm": [self.bm, self.bn, self.bk], "thread": [self.tm, self.tn],
                "buffers": 2,
                "layout": {"a": "mk" if c.a.k_inner else "km",
                           "b": "nk" if c.b.k_inner else "kn"},
                "vector": [n for n, on in (("a", self.a_vector), ("b", self.b_vector)) if on]}


def simt_plan(c: Contraction, spatial, reduction, block, thread, step, smem_limit: int,
              shape_of, varying: frozenset[str] = frozenset()) -> SimtPlan | str:
    """The SIMT plan of a tile (per spatial axis `block` and `thread`, per reduction axis
    `step`), or why it has none. `shape_of(i)` is the shape of the contraction's read `i`;
    `varying` the axes whose extents vary (OpFacts.varying)."""
    if c.dtype != "float32":
        return f"{c.dtype} operands (the SIMT GEMM is built for float32)"
    names = [a for a, _ in spatial]
    size = dict(zip(names, block))
    per_thread = dict(zip(names, thread))
    steps = dict(zip([a for a, _ in reduction], step))
    extent = dict(spatial) | dict(reduction)
    if any(size[a] != 1 or per_thread[a] != 1 for a in c.batch_axes):
        return "a batch axis' block is not 1"
    bm, bn = math.prod(size[a] for a in c.m_axes), math.prod(size[a] for a in c.n_axes)
    tm = math.prod(per_thread[a] for a in c.m_axes)
    tn = math.prod(per_thread[a] for a in c.n_axes)
    bk = math.prod(steps[a] for a in c.k_axes)
    if tm not in THREAD_SIZES or tn not in THREAD_SIZES:
        return f"thread tile {tm}x{tn}: the SIMT GEMM takes 4 or 8 per axis"
    for axes in (c.m_axes, c.n_axes):
        if len(axes) > 1 and not _inner_register_tile(axes, size, per_thread):
            return "a register tile not on its group's innermost axes"
    if bm % tm or bn % tn:
        return "the thread tile does not divide the block"
    window = len(c.k_axes) > 1 and all(steps[a] == extent[a] for a in c.k_axes[1:])
    if bk not in STEPS and not (window and 4 <= bk <= MAX_WINDOW_STEP):
        return (f"step {bk}: the SIMT GEMM takes steps of {', '.join(map(str, STEPS))}, or a "
                f"whole window of at most {MAX_WINDOW_STEP}")
    if len(c.k_axes) > 1 and any(a in varying for a in c.k_axes):
        return "a reduction axis of several varies with a symbol"
    threads = (bm // tm) * (bn // tn)
    if (bn // tn) % PHASE:
        return f"{bn // tn} thread columns: a multiple of {PHASE} reads B without conflicts"
    if threads % 32 or not MIN_THREADS <= threads <= MAX_THREADS:
        return f"{threads} threads: whole warps, {MIN_THREADS}-{MAX_THREADS}"
    if bm < 32 or bn < 32:
        return "a block extent under 32"

    def vector(op: Operand) -> bool:
        group = c.k_axes if op.k_inner else op.mn_axes
        return _vector(op, group, (steps if op.k_inner else size)[group[-1]], shape_of, varying)

    plan = SimtPlan(c, bm, bn, bk, tm, tn, vector(c.a), vector(c.b))
    for op, vec in ((c.a, plan.a_vector), (c.b, plan.b_vector)):
        if not vec and 4 * plan.loads_per_thread(op) > MAX_SCALAR_LOADS:
            return (f"{4 * plan.loads_per_thread(op)} scalar loads per thread and step (rows "
                    f"not 16-byte units): at most {MAX_SCALAR_LOADS}")
    if plan.smem_bytes > smem_limit:
        return f"{plan.smem_bytes} bytes of shared memory > {smem_limit}"
    return plan


def _inner_register_tile(axes, size, per_thread) -> bool:
    """A group's register tile is on its innermost axes: every axis whose thread tile is over
    1 is whole in it from there inwards (the flat positions of a sub-tile are the axes'
    row-major positions)."""
    inner = True
    for a in reversed(axes):
        if per_thread[a] > 1 and not inner:
            return False
        inner = inner and per_thread[a] == size[a]
    return True


def _vector(op: Operand, group: tuple[str, ...], inner_size: int, shape_of,
            varying: frozenset[str] = frozenset()) -> bool:
    """16-byte loads: four consecutive positions of the operand's group (K for a
    K-contiguous operand, else its M or N axes) are four consecutive elements of whole
    16-byte units: the tensor's indices are plain, its last dimension is indexed by the
    group's innermost axis, whose block (or step) is a multiple of 4 and whose extent is a
    multiple of 4 (every other dimension's stride is then one too, and a block's and a step's
    origins on it are multiples of 4), and it does not vary with a symbol (`varying`, a
    symbolic module's size)."""
    return (op.dim_axes is not None and op.dim_axes[-1] == group[-1] and inner_size % 4 == 0
            and shape_of(op.index)[-1] % 4 == 0 and group[-1] not in varying)


__all__ = ["MAX_SCALAR_LOADS", "MAX_WINDOW_STEP", "STEPS", "SimtPlan", "THREAD_SIZES",
           "TRANSPOSED_PAD", "simt_plan"]
