"""How kernels run on a CPU: register tiles, cache tiles and parallel blocks, from the profile.

Roller's construction with a CPU's alignment (no search): a contraction runs as the BLIS
algorithm does, so its tiles follow from three memory levels.

- **Registers.** The micro-kernel keeps an `mr x nr` tile of accumulators in vector registers
  (`nr / lanes` vectors per row) and needs `nr / lanes` more for a row of B and one for a
  broadcast value of A: the largest `mr` with `mr * v + v + 1 <= registers`, and at most
  half the integer registers (a pointer per row of A read in place: 8 on x86-64). `nr` is two
  vectors, and a multiple of 16 float32 lanes, so that the same C++ compiles for AVX2 (8
  lanes), AVX-512 (16) and NEON (4) (runtime_cpu.h picks the vectors at compile time).
- **L1.** One step of the reduction streams a `kc x nr` micro-panel of B from L1 for every
  `mr` rows: `kc * nr * 4` bytes take half of L1.
- **L2.** A slice of A (`mc x kc`: read in place, or a packed panel), the B panel (`kc x
  nc`) and an `mc x nc` piece of the output tile share L2: A and the output a quarter each,
  B half. `mc` is the slice of rows a block runs at a time (a block may hold more rows).
- **Cores.** A block (`mc x nc` outputs) is the unit of parallel work. Its split of M and N
  is priced (`gemm_blocks`): rounds of blocks over the cores times one block's micro-tiles,
  B packing and reads of A, so that every core gets the same work and splitting M (which
  re-packs B) or N (which re-reads A) is paid for. A block runs its rows in `mc`-row slices
  (the A slice in L2) on one packed B panel per step.

Loop nests (everything that is not a contraction) run in blocks of rows of about
`block_work` element operations each, their innermost loop in vector lanes.

Without a CPU profile (`tk-codegen --target cpu` on a module rolled for a GPU, or not rolled)
the figures are those of a common AVX2 server core: 16 vector registers of 8 float32 lanes,
32 KiB of L1 and 512 KiB of L2 per core, 2 cores (`HOST_DEFAULTS`).

**Which read is A** (`gemm_roles`): B holds the output's contiguous axis, so that a row of
the output tile is contiguous in the output, unless N is ragged where M is not: a 7 x 7
image's 49 pixels as N fill 64 columns of micro-tiles, as M 54 rows, so a 1 x 1
convolution there takes its filters as N where that saves enough (`SWAP_WORK`).

**Which kernel** (`cpu_shape`, the one decision: tk-roll records it for a CPU profile, codegen
generates it): `cpu_gemm` for a float32 contraction whose output is contiguous along an M or
N axis and whose operands are each used at least `GEMM_MIN_REUSE` times (a matrix-vector
product streams its matrix once: packing it would read and write it twice more), else
`cpu_loops` (rows in blocks, the output's last axis in vector lanes, a reduction as lane
partials, an accumulator row, or none). The decision with its blocks is a `CpuShape`; its
`record()` is the `kernel` of a CPU op tile (docs/roll.md, "CPU profiles"), and
`recorded_tiles` reads the register and cache tiles of one back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Mapping

from tilekit.errors import IRError
from tilekit.hw.cpu import ISA_INTEGER_REGISTERS
from tilekit.schedule.mma import Contraction

#: float32 lanes every micro-kernel width is a multiple of (AVX-512's vector; 2 of AVX2's).
NR_ALIGN = 16


@dataclass(frozen=True)
class CpuMachine:
    """The figures the CPU tiles are derived from."""

    name: str
    cores: int
    f32_lanes: int                  # float32 lanes of one vector register
    vector_registers: int
    l1_bytes: int                   # per core (data)
    l2_bytes: int                   # per core
    integer_registers: int = 16     # general-purpose (x86-64's 16; AArch64's 31)


HOST_DEFAULTS = CpuMachine("generic AVX2 core (no CPU profile)", cores=2, f32_lanes=8,
                           vector_registers=16, l1_bytes=32 * 1024, l2_bytes=512 * 1024)


@dataclass(frozen=True)
class CpuTiles:
    """The tiles of CPU kernels (see the module docstring)."""

    machine: CpuMachine
    mr: int
    nr: int
    kc: int
    mc: int
    nc: int
    block_work: int = 32768          # element operations per block of a loop nest
    blocks_per_core: int = 4
    vector_chunk: int = 256          # output points per accumulator row of a reduction
    #: Code for one size of a symbolic module (None: a static module's): the (op, axis)
    #: pairs whose extents change with the module's symbols. Its sizes share a build only
    #: where the code's structure is the same (tilekit.runtime.family), so no decision that
    #: shapes the code reads such an extent (`free`), and a GEMM keeps one micro-tile
    #: whatever its M pads (no `gemm_mr`).
    varying: frozenset[tuple[str, str]] | None = None

    @property
    def generic(self) -> bool:
        return self.varying is not None

    def free(self, op: str) -> frozenset[str]:
        """The axes of op `op` whose extents vary with the symbols."""
        return frozenset(a for o, a in self.varying or () if o == op)

    def record(self) -> dict:
        return {"micro": [self.mr, self.nr], "cache": {"mc": self.mc, "nc": self.nc,
                                                       "kc": self.kc},
                "machine": self.machine.name}


def machine_of(profile) -> CpuMachine:
    """The CPU figures of a `kind: cpu` profile; the defaults for anything else."""
    if profile is None or not profile.is_cpu:
        return HOST_DEFAULTS
    return CpuMachine(profile.name, cores=profile.cores,
                      f32_lanes=profile.simd_lanes("float32"),
                      vector_registers=profile.vector_registers,
                      l1_bytes=profile.cache("l1").per_core_bytes,
                      l2_bytes=profile.cache("l2").per_core_bytes,
                      integer_registers=ISA_INTEGER_REGISTERS[profile.cpu.isa])


def cpu_tiles(profile=None) -> CpuTiles:
    """Register and cache tiles from the machine's figures (see the module docstring)."""
    m = machine_of(profile)
    vectors = max(1, -(-NR_ALIGN // m.f32_lanes))
    vectors = max(vectors, 2 if m.f32_lanes * 2 <= 2 * NR_ALIGN else 1)
    nr = max(NR_ALIGN, vectors * m.f32_lanes)
    nr = -(-nr // NR_ALIGN) * NR_ALIGN
    return tiles_for(m, register_rows(m, nr), nr)


def max_mr(m: CpuMachine, nr: int) -> int:
    """The most rows of a micro-tile `nr` columns wide whose accumulators, B vectors and one
    broadcast of A fit the vector registers (0: none fits), and whose row pointers fit half
    the integer registers: the micro-kernel reading A in place (`tk_gemm_micro_rows`) keeps
    a pointer per row there, beside B's, C's and the loop's. With AVX-512's 32 vector
    registers 14 rows fit, but on x86-64's 16 integer registers GCC kept two row pointers in
    vector registers, moved back on every step of K: 8 x 32 tiles ran the BERT layer's
    feed-forward GEMM (128 x 3072 x 768) in 4.95 ms on one Xeon core (AVX-512), 13 x 32 in
    5.41 ms, 10 x 32 in 5.17 ms; the micro-kernel alone 182 against 168 GFLOP/s."""
    v = -(-nr // m.f32_lanes)
    return max(0, min(16, (m.vector_registers - v - 1) // v, m.integer_registers // 2))


def tiles_for(m: CpuMachine, mr: int, nr: int) -> CpuTiles:
    """The cache tiles of an `mr x nr` micro-tile on `m`: a `kc x nr` B micro-panel in half
    of L1, an `mc x kc` A block in a quarter of L2, a `kc x nc` B panel in half of it."""
    mr = max(1, mr)
    kc = _floor_to(m.l1_bytes // 2 // (nr * 4), 16, lowest=16)
    mc = _floor_to(m.l2_bytes // 4 // (kc * 4), mr, lowest=mr)
    nc = b_panel_panels(m, kc, nr) * nr
    nc = max(nr, min(nc, _floor_to(m.l2_bytes // 4 // (mc * 4), nr, lowest=nr)))
    return CpuTiles(m, mr, nr, kc, mc, nc)


def b_panel_panels(m: CpuMachine, kc: int, nr: int) -> int:
    """Micro-panels of `nr` columns in a `kc`-step B panel that takes half of L2 (at least
    one)."""
    return max(1, m.l2_bytes // 2 // (kc * 4) // nr)


def register_rows(m: CpuMachine, nr: int) -> int:
    """The most rows of an `mr x nr` register tile: its accumulators, a row of B and a
    broadcast of A in the vector registers (at most 16; at least 1)."""
    return max(1, max_mr(m, nr))


#: A GEMM whose M pads the register tile's rows takes fewer rows per micro-tile (down to two
#: thirds of them: their accumulators still cover the FMA pipes' latency) when that leaves
#: at most this share of the padded rows: 32 rows are 36 in tiles of 6, 32 in tiles of 4.
MR_PADDING = 0.95


def gemm_mr(mr: int, m: int) -> int:
    """The micro-tile's rows for a GEMM of `m` rows, `mr` the register tile's most
    (`MR_PADDING`): on Zen 3, one core, the LSTM's input projection (M = 32) took 0.37 ms in
    tiles of 4 rows against 0.41 ms in tiles of 6."""
    def padded(r: int) -> int:
        return -(-m // r) * r

    best = mr
    for r in range(mr - 1, max(1, -(-2 * mr // 3)) - 1, -1):
        if padded(r) < padded(best) and padded(r) <= MR_PADDING * padded(mr):
            best = r
    return best


def _floor_to(x: int, multiple: int, lowest: int) -> int:
    return max(lowest, x // multiple * multiple)


@dataclass(frozen=True)
class GemmBlocks:
    """One contraction's blocks: `mc x nc` outputs each, `kc` reduction points per step."""

    mc: int
    nc: int
    kc: int
    m_blocks: int
    n_blocks: int
    k_steps: int


#: The price of packing one element of B, in FMA-pipe cycles: a load through the operand's
#: index maps (an im2col gather with its bounds checks) and a store into the panel; measured
#: at about one cycle per element on Zen 3 for a convolution's window, less for a copy.
PACK_CYCLES = 1.0
#: The price of reading one element of A in place (the micro-kernel streams a block's rows of
#: A once per step; a layer's weights come from L3 or DRAM): half a cycle per element, about
#: 8 bytes per cycle, between one core's L3 and DRAM figures. Splitting N re-reads A.
A_CYCLES = 0.5
#: The fixed price of a block in the same cycles: its offset tables, loop set-up, its share
#: of the fork/join.
BLOCK_CYCLES = 3000.0
#: How many bytes a block's output tile may take when K takes several steps (the tile holds
#: the sums between steps: read and written once per step). With one step there is no tile:
#: each micro-tile goes from its buffer to the epilogue (tilekit.codegen.cpu).
C_TILE_BYTES = 512 * 1024


#: A K of at most this many steps of `tiles.kc` takes one step (tilekit.codegen.cpu): no
#: output tile read and written per step, and the epilogue runs on each strip of micro-tiles
#: while it is in L1, though each micro-tile then streams its B micro-panel (up to 1.5x L1)
#: from L2. ResNet-50's layers with K = 256 0.87-0.90x, K = 512 and 576 0.92-0.94x as long as
#: in steps of 192 (one core of an AVX-512 Xeon, 48 KiB of L1); with K up to 1152 its 3 x 3
#: layers on 28 x 28 gained 5% more and its K = 1024 layers lost as much.
ONE_STEP_MOST = 3


def gemm_blocks(tiles: CpuTiles, m: int, n: int, k: int, batch: int,
                k_varies: bool = False) -> GemmBlocks:
    """The blocks of an `m x n x k` GEMM (`batch` of them): the split of M and N into
    `m_blocks x n_blocks` parallel blocks with the least time on the machine's cores, priced
    as rounds of blocks (ceil(blocks / cores), every core taking one block per round) times
    one block's micro-tiles (padded to `mr x nr`), its B panel packing (`PACK_CYCLES` per
    element: each block packs its B panel once per step and runs all its rows on it, so
    splitting M re-packs B), its reading of A (`A_CYCLES` per element: splitting N re-reads
    A) and `BLOCK_CYCLES`. A block's B panel (`kc x nc`, `nc` whole micro-panels of `nr`)
    keeps to half of L2 for this GEMM's `kc` (`b_panel_panels`; not `tiles.nc`, which also
    bounds an output tile of `tiles.mc` rows: with it ResNet-50's 14 x 14 layers split their
    196 pixels into blocks of 4 and 3 micro-panels over two cores, where half of M each with
    all 7 balance; the network 0.87x on two cores of an AVX-512 Xeon, 0.94x on one), its
    output tile (when K takes several steps) to `C_TILE_BYTES`; A is read in `tiles.mc`-row
    slices that stay in L2 (gemm_kernel's inner loop). K goes in even steps of at most
    `tiles.kc`, or in one when it is at most `ONE_STEP_MOST` of them. Ties go to fewer
    blocks. Blocks are even (128 rows in two blocks are two of 66, not 126 and 2).
    `k_varies`: K's extent changes with a symbolic module's sizes, so K goes in steps of at
    most `tiles.kc` and the code keeps the output tile of several steps even where this K
    takes one (tilekit.codegen.cpu), and the tile's bound holds."""
    mr, nr = tiles.mr, tiles.nr
    kc = k if k <= ONE_STEP_MOST * tiles.kc and not k_varies else min(tiles.kc, k)
    kc = -(-k // -(-k // kc))
    cores = tiles.machine.cores
    macs = 2 * tiles.machine.f32_lanes         # multiply-adds per cycle: two FMA pipes
    panels = -(-n // nr)
    most = b_panel_panels(tiles.machine, kc, nr)   # micro-panels per block

    def up(x: int, step: int) -> int:
        return -(-x // step) * step

    best = None
    for nb in range(-(-panels // most), panels + 1):
        nc = -(-panels // nb) * nr
        if -(-panels // (nc // nr)) != nb:
            continue                            # the same blocks as a smaller nb
        m_least = 1 if k <= kc and not k_varies \
            else max(1, -(-(-(-m // mr) * mr * nc * 4) // C_TILE_BYTES))
        for mb in range(m_least, -(-m // mr) + 1):
            mc = min(m, up(-(-m // mb), mr))
            if -(-m // mc) != mb:
                continue
            blocks = batch * mb * nb
            one = (up(mc, mr) * nc * k / macs + nc * k * PACK_CYCLES
                   + mc * k * A_CYCLES + BLOCK_CYCLES)
            cost = (-(-blocks // cores) * one, blocks)
            if best is None or cost < best[0]:
                best = (cost, mc, nc)
            if blocks >= 4 * cores * tiles.blocks_per_core:
                break
        if batch * m_least * nb >= 4 * cores * tiles.blocks_per_core:
            break
    _, mc, nc = best
    return GemmBlocks(mc, nc, kc, -(-m // mc), -(-n // nc), -(-k // kc))


def rows_per_block(rows: int, work_per_row: int, tiles: CpuTiles) -> int:
    """Rows of a loop nest per parallel block: about `block_work` operations each, and at
    least `blocks_per_core` blocks per core while the rows allow."""
    per = max(1, tiles.block_work // max(1, work_per_row))
    want = tiles.machine.cores * tiles.blocks_per_core
    per = min(per, max(1, -(-rows // want)))
    return max(1, min(per, rows))


#: The most output rows an accumulator row computes side by side when its window reads
#: overlapping input rows (tilekit.codegen.cpu: a 3 x 3 window's rows stage once for 8
#: output rows, 10 input rows, where row by row they stage 24).
WINDOW_ROWS = 8


def window_rows(extent: int, per: int | None = None) -> int:
    """The output rows side by side along a row axis of `extent` points: the largest
    divisor of `extent` of at most `WINDOW_ROWS` (so no group crosses into the next outer
    row), and of `per`, the rows of a block, when given (so no group crosses a block)."""
    return max(r for r in range(1, WINDOW_ROWS + 1)
               if extent % r == 0 and (per is None or per % r == 0))


def one_thread(work: int, tiles: CpuTiles) -> bool:
    """Run a kernel of `work` element operations on one thread of the team rather than
    sharing its blocks out? When it is at most one block's work (`block_work`, about a
    microsecond on a core): shared out, it would cost a team barrier after it (several
    microseconds; on a loaded machine, where a waiting thread sleeps, a wake-up), more than
    the work. The program entry runs such a kernel's blocks on the team's first thread, so a
    run of them needs no barrier (tilekit.codegen.cpu_program)."""
    return work <= tiles.block_work


# -- the kernel decision -----------------------------------------------------------------------

#: Uses of each operand element below which packing costs more than it saves.
GEMM_MIN_REUSE = 4
#: The CPU kernel shapes.
CPU_SHAPES = ("cpu_gemm", "cpu_loops")
#: How a `cpu_loops` kernel treats its reduction (per row of its blocks).
LOOP_MODES = ("lane partials", "accumulator row", "pointwise", "scalar")


#: The roles are swapped (the output's contiguous axis in M) when N is ragged and the swap
#: leaves at most this share of the padded micro-tiles' work: strided stores of the output
#: tile and a packed A cost a little, a ragged N (a 7 x 7 image's 49 pixels in 64 columns)
#: costs every step. How little: on Zen 3 (16-column tiles) the 7 x 7's 1x1 convolutions of
#: ResNet-50 gained from a swap that left 84% of the work (54 rows against 64 columns); on
#: an AVX-512 Xeon (32-column tiles) swaps that left 87.5% (7 x 7: 56 rows against 64
#: columns) and 89% (14 x 14: 200 against 224) lost, 1.19x and 1.15x as long on one core,
#: the whole network 3.6% slower. A whole N is never swapped for M's padding in rows of
#: `mr`: the swap would save about 10% of padded work (32 rows in 36) and cost more
#: (measured on Zen 3, one core: the LSTM's input projection, 32 steps x 2048 gates x 256,
#: 0.51 ms swapped against 0.42 ms with its weight as B packed once; the MobileNet block's
#: 1 x 1 projection to 32 filters, 3136 pixels as M with the input packed by a strided
#: gather, 1.22 ms against 0.77 ms with the filters read in place).
SWAP_WORK = 0.85
#: ... and when the read that becomes A is a window (a 3 x 3 convolution's im2col, packed by
#: gathers with bounds checks), at most this share: a late layer of a small image, 2 x 2
#: pixels in 32 columns of micro-tiles against 64 filters in 8-row tiles, does an eighth of
#: its padded work useful as it stands and half swapped (a corpus ResNet's last 3 x 3 layers,
#: 64 x 4 x 576, 28 and 25 us on one AVX-512 core, onnxruntime 5 us).
SWAP_WINDOW_WORK = 0.5


def gemm_roles(c: Contraction, spatial, tiles: CpuTiles | None = None, reads=None,
               free: frozenset[str] = frozenset()) -> tuple[str, str] | None:
    """Which read is A (its axes are the GEMM's M) and which is B (N, the micro-kernel's
    vector direction): B holds the output's innermost axis, so that a row of the output tile
    is contiguous in the output. With `tiles` and the op's `reads` (ReadFacts), the other
    way round when N is not whole micro-panels of `nr` columns and M is, the micro-tiles
    padded to `mr x nr` do at most `SWAP_WORK` of the work so (N = 49 pixels take 64
    columns, as M they take 54 rows; 512 filters as N take 512); where the read that becomes
    A is a window (an index sums two axes: a 3 x 3 convolution's im2col, whose packing into
    `mr`-row panels is a gather with bounds checks per element: measured slower than the
    padding it saves on Zen 3 at 7 x 7), only where the swap leaves at most
    `SWAP_WINDOW_WORK` of it. None when that axis is a batch axis (no GEMM view pays). No
    swap where an M or N axis is `free` (its extent varies with a symbol)."""
    last = spatial[-1][0]
    if last in c.n_axes:
        roles = ("a", "b")
    elif last in c.m_axes:
        roles = ("b", "a")
    else:
        return None
    ops = {"a": c.a, "b": c.b}
    if tiles is not None and reads is not None and not free & {*c.m_axes, *c.n_axes}:
        extent = dict(spatial)
        m = math.prod(extent[a] for a in ops[roles[0]].mn_axes)
        n = math.prod(extent[a] for a in ops[roles[1]].mn_axes)

        mr = register_rows(tiles.machine, tiles.nr)   # not a GEMM's own (`gemm_mr`)

        def padded(rows: int, cols: int) -> int:
            return -(-rows // mr) * mr * -(-cols // tiles.nr) * tiles.nr

        window = any(len(m.terms) > 1 for m in reads[ops[roles[1]].index].maps)
        if n % tiles.nr and m % tiles.nr == 0 and padded(n, m) <= (
                SWAP_WINDOW_WORK if window else SWAP_WORK) * padded(m, n):
            roles = roles[::-1]
    return roles


def gemm_reuse(c: Contraction, spatial) -> int:
    """How many times the less-reused operand's elements are used: min(M, N)."""
    extent = dict(spatial)
    return min(math.prod(extent[a] for a in c.m_axes), math.prod(extent[a] for a in c.n_axes))


@dataclass(frozen=True)
class CpuGemm:
    """A contraction as a GEMM on the CPU: A's axes are M, B's are N (the output's contiguous
    axis among them, unless the roles are swapped: `gemm_roles`), and the blocks."""

    roles: tuple[str, str]          # (the read that is A, the one that is B): "a"/"b"
    m_axes: tuple[str, ...]
    n_axes: tuple[str, ...]
    k_axes: tuple[str, ...]
    batch_axes: tuple[str, ...]
    m: int
    n: int
    k: int
    batch: int
    blocks: GemmBlocks

    @property
    def grid(self) -> int:
        return self.batch * self.blocks.m_blocks * self.blocks.n_blocks


@dataclass(frozen=True)
class CpuLoops:
    """A loop nest: the output's rows (every spatial axis but `vector_axis`) in blocks of
    `rows_per_block`, the vector axis in lanes, the reduction per `mode`; with
    `columns_per_block`, each block also a run of that many points of the vector axis (a
    loop nest of few rows: `column_width`)."""

    vector_axis: str | None
    mode: str
    rows: int
    rows_per_block: int
    work_per_row: int
    vector_length: int = 1
    columns_per_block: int | None = None

    @property
    def lane_partials(self) -> bool:
        return self.mode == "lane partials"

    @property
    def column_blocks(self) -> int:
        """Blocks along the vector axis (1: each block takes whole rows)."""
        if self.columns_per_block is None:
            return 1
        return -(-self.vector_length // self.columns_per_block)

    @property
    def grid(self) -> int:
        return -(-self.rows // self.rows_per_block) * self.column_blocks


@dataclass(frozen=True)
class CpuShape:
    """The CPU kernel of one op (or one stage: its main op) with its tiles and blocks."""

    shape: str                      # cpu_gemm | cpu_loops
    tiles: CpuTiles
    gemm: CpuGemm | None = None
    loops: CpuLoops | None = None
    why: str = ""                   # why cpu_loops (for a contraction)

    @property
    def grid(self) -> int:
        """Parallel blocks: the units the cores share."""
        return self.gemm.grid if self.gemm is not None else self.loops.grid

    def record(self) -> dict[str, Any]:
        """The `kernel` of a CPU op tile (docs/roll.md, "CPU profiles")."""
        if self.gemm is not None:
            g = self.gemm
            return {"shape": self.shape, "m": list(g.m_axes), "n": list(g.n_axes),
                    "k": list(g.k_axes), "batch": list(g.batch_axes),
                    "blocks": [g.blocks.mc, g.blocks.nc, g.blocks.kc]}
        lp = self.loops
        out = {"shape": self.shape, "rows": lp.rows, "rows_per_block": lp.rows_per_block,
               "vector_axis": lp.vector_axis, "reduction": lp.mode}
        if lp.columns_per_block is not None:
            out["columns_per_block"] = lp.columns_per_block
        if self.why:
            out["why"] = self.why
        return out


def cpu_shape(facts, tiles: CpuTiles, recorded: Mapping[str, Any] | None = None,
              where: str = "tile", free: frozenset[str] = frozenset()) -> CpuShape:
    """The CPU kernel of an op (`facts`: a `tilekit.schedule.shape.OpFacts`, its spatial and
    reduction axes, its contraction and whether its innermost reduction walks a read
    contiguously) with `tiles`: the module docstring's decision, blocks from `gemm_blocks` or
    `rows_per_block`. With `recorded` (a CPU op tile's `kernel`, as tk-roll wrote it), the
    decision must be the recorded one and the blocks are the recorded ones, checked to cover
    the op (IRError at `where` otherwise). `free`: the op's axes whose extents vary with a
    symbolic module's symbols (`CpuTiles.varying`), which the decision does not read."""
    c = facts.contraction
    why = ""
    if isinstance(c, str):
        why = c
    elif c.dtype != "float32":
        why = f"a {c.dtype} contraction (the micro-kernel is float32)"
    elif gemm_roles(c, facts.spatial) is None:
        why = "the output's contiguous axis is a batch axis"
    elif gemm_reuse(c, facts.spatial) < GEMM_MIN_REUSE:
        why = f"operands used fewer than {GEMM_MIN_REUSE} times (no packing pays)"
    if not why:
        if recorded is None:
            tiles = _gemm_tiles(c, facts.spatial, facts.reads, tiles)
        shape = CpuShape("cpu_gemm", tiles, gemm=_gemm(c, facts.spatial, facts.reduction,
                                                       facts.reads, tiles, free))
    else:
        shape = CpuShape("cpu_loops", tiles, loops=_loops(facts, tiles, free), why=why)
    if recorded is None:
        return shape
    return _with_recorded(shape, recorded, where)


def _gemm_tiles(c: Contraction, spatial, reads, tiles: CpuTiles) -> CpuTiles:
    """`tiles` with the micro-tile's rows for this GEMM's M (`gemm_mr`), `mc` a whole number
    of them."""
    if tiles.generic:
        return tiles
    roles = gemm_roles(c, spatial, tiles, reads)
    extent = dict(spatial)
    m = math.prod(extent[a] for a in {"a": c.a, "b": c.b}[roles[0]].mn_axes)
    mr = gemm_mr(tiles.mr, m)
    if mr == tiles.mr:
        return tiles
    return replace(tiles, mr=mr, mc=_floor_to(tiles.mc, mr, lowest=mr))


def _gemm(c: Contraction, spatial, reduction, reads, tiles: CpuTiles,
          free: frozenset[str] = frozenset()) -> CpuGemm:
    extent = dict(spatial) | dict(reduction)
    roles = gemm_roles(c, spatial, tiles, reads, free)
    ops = {"a": c.a, "b": c.b}
    m_axes, n_axes = ops[roles[0]].mn_axes, ops[roles[1]].mn_axes
    m = math.prod(extent[a] for a in m_axes)
    n = math.prod(extent[a] for a in n_axes)
    k = math.prod(extent[a] for a in c.k_axes)
    batch = math.prod(extent[a] for a in c.batch_axes)
    return CpuGemm(roles, tuple(m_axes), tuple(n_axes), tuple(c.k_axes), tuple(c.batch_axes),
                   m, n, k, batch,
                   gemm_blocks(tiles, m, n, k, batch, k_varies=bool(free & set(c.k_axes))))


def _loops(facts, tiles: CpuTiles, free: frozenset[str] = frozenset()) -> CpuLoops:
    axes = [a for a, _ in facts.spatial]
    extents = [n for _, n in facts.spatial]
    reduces = bool(facts.reduction)
    reduce_size = math.prod(n for _, n in facts.reduction) if reduces else 1
    # Lane partials need a long contiguous innermost reduction (a depthwise window's 3
    # points would all be the tail): otherwise the output's last axis takes the lanes. An
    # extent that varies with a symbol counts as long (the partials' tail loop takes a short
    # one) and a varying last axis as more than one point.
    inner = facts.reduction[-1] if reduces else None
    lanes_red = reduces and facts.contiguous_reduction and (
        inner[1] >= tiles.nr or inner[0] in free or not axes
        or (extents[-1] == 1 and axes[-1] not in free)) and not (
        axes and extents[-1] > 1 and _strided_in_reduction(facts.reads, inner[0], axes[-1]))
    vec = None if lanes_red or not axes else len(axes) - 1
    rows = math.prod(n for k, n in enumerate(extents) if k != vec)
    vlen = extents[vec] if vec is not None else 1
    mode = ("lane partials" if lanes_red else "accumulator row" if reduces
            else "pointwise") if vec is not None or lanes_red else "scalar"
    work = vlen * reduce_size
    per = rows_per_block(rows, work, tiles)
    if mode == "accumulator row" and len(axes) > 1 and axes[-2] not in free:
        group = window_rows(extents[-2])      # blocks of whole groups of rows
        per = min(rows, -(-per // group) * group)
    columns = None
    if mode in ("pointwise", "accumulator row") and not free & set(axes):
        columns = column_width(rows, per, vlen, work, tiles)
    return CpuLoops(axes[vec] if vec is not None else None, mode, rows, per, work, vlen,
                    columns)


def column_width(rows: int, per: int, vlen: int, work_per_row: int,
                 tiles: CpuTiles) -> int | None:
    """Points of the vector axis per block when a loop nest has fewer row blocks than the
    cores want (`blocks_per_core` each) and its rows are long: a matrix-vector product's
    one output row (a recurrent step's gates, a decode step's projection), a long 1-D
    elementwise op. Whole vectors of `nr` lanes per block, about `block_work` operations
    each at least; None: blocks of whole rows."""
    want = tiles.machine.cores * tiles.blocks_per_core
    row_blocks = -(-rows // per)
    if row_blocks >= want or vlen < 2 * tiles.nr:
        return None
    pieces = min(-(-want // row_blocks), vlen // tiles.nr,
                 per * work_per_row // max(1, tiles.block_work))
    if pieces < 2:
        return None
    width = -(-vlen // pieces)
    return -(-width // tiles.nr) * tiles.nr


def _strided_in_reduction(reads, inner: str, last: str) -> bool:
    """Would lanes along the innermost reduction `inner` gather some read that lanes along
    the output's last axis `last` read contiguously? A matrix-vector product `x[k] W[k, j]`
    (a MatMul's weight stored K x N, as exporters write it): with lanes along k every lane
    of W is a row apart; along j a vector of W is one load and x[k] a broadcast (one step of
    a 256 x 1024 product on an AVX-512 core: about 200 us against a few)."""
    def unit(m, axis: str) -> bool:
        return m.affine and dict(m.terms) == {axis: 1}

    return any(r.maps and unit(r.maps[-1], last)
               and any(inner in dict(m.terms) for m in r.maps if m.affine)
               for r in reads)


def _with_recorded(shape: CpuShape, rec: Mapping[str, Any], where: str) -> CpuShape:
    """`shape` with the recorded blocks, after checking that the record is this decision."""
    hint = "re-run tk-roll with this module's CPU profile"
    if rec.get("shape") != shape.shape:
        raise IRError(f"records the CPU kernel {rec.get('shape')!r}, but this op is a "
                      f"{shape.shape} kernel" + (f" ({shape.why})" if shape.why else ""),
                      f"{where}.kernel.shape", hint)
    if shape.gemm is not None:
        g = shape.gemm
        for key, axes in (("m", g.m_axes), ("n", g.n_axes), ("k", g.k_axes),
                          ("batch", g.batch_axes)):
            if list(rec.get(key) or []) != list(axes):
                raise IRError(f"'{key}' is {rec.get(key)!r}, the op's GEMM view has "
                              f"{list(axes)}", f"{where}.kernel.{key}", hint)
        blocks = rec.get("blocks")
        if not (isinstance(blocks, list) and len(blocks) == 3
                and all(type(x) is int and x >= 1 for x in blocks)):
            raise IRError(f"'blocks' must be [mc, nc, kc], positive integers, got {blocks!r}",
                          f"{where}.kernel.blocks", hint)
        mc, nc, kc = blocks
        mc, nc, kc = min(mc, g.m), min(nc, g.n), min(kc, g.k)   # one block covers the axis
        b = GemmBlocks(mc, nc, kc, -(-g.m // mc), -(-g.n // nc), -(-g.k // kc))
        return CpuShape(shape.shape, shape.tiles, gemm=replace(g, blocks=b))
    lp = shape.loops
    for key, want in (("vector_axis", lp.vector_axis), ("reduction", lp.mode),
                      ("rows", lp.rows)):
        if rec.get(key) != want:
            raise IRError(f"'{key}' is {rec.get(key)!r}, the op's loop nest has {want!r}",
                          f"{where}.kernel.{key}", hint)
    per = rec.get("rows_per_block")
    if type(per) is not int or not 1 <= per <= lp.rows:
        raise IRError(f"'rows_per_block' must be an integer from 1 to {lp.rows}, got {per!r}",
                      f"{where}.kernel.rows_per_block", hint)
    columns = rec.get("columns_per_block")
    if columns is not None and (lp.mode not in ("pointwise", "accumulator row")
                                or type(columns) is not int
                                or not 1 <= columns <= lp.vector_length):
        raise IRError(f"'columns_per_block' must be absent or an integer from 1 to "
                      f"{lp.vector_length} (a pointwise or accumulator-row nest), got "
                      f"{columns!r}", f"{where}.kernel.columns_per_block", hint)
    return CpuShape(shape.shape, shape.tiles, loops=CpuLoops(
        lp.vector_axis, lp.mode, lp.rows, per, lp.work_per_row, lp.vector_length, columns),
        why=shape.why)


#: The bounds on a recorded micro-tile: the micro-kernel's rows, and its columns in whole
#: `NR_ALIGN` vectors (runtime_cpu.h's tk_gemm_micro).
MAX_MR = 32
MAX_NR = 4 * NR_ALIGN


def recorded_tiles(payload: Mapping[str, Any], machine: CpuMachine, where: str) -> CpuTiles:
    """The register and cache tiles of a CPU op tile (`micro: [mr, nr]`, `cache: {mc, nc,
    kc}`) on `machine`: IRError at `where` when they are not sizes the kernels take."""
    hint = "re-run tk-roll with this module's CPU profile"
    micro = payload.get("micro")
    if not (isinstance(micro, list) and len(micro) == 2
            and all(type(x) is int for x in micro)):
        raise IRError(f"'micro' must be [mr, nr], integers, got {micro!r}", f"{where}.micro",
                      hint)
    mr, nr = micro
    if not 1 <= mr <= MAX_MR or nr % NR_ALIGN or not NR_ALIGN <= nr <= MAX_NR:
        raise IRError(f"micro-tile {mr}x{nr}: mr from 1 to {MAX_MR}, nr a multiple of "
                      f"{NR_ALIGN} up to {MAX_NR}", f"{where}.micro", hint)
    cache = payload.get("cache")
    sizes = {}
    for key in ("mc", "nc", "kc"):
        value = cache.get(key) if isinstance(cache, Mapping) else None
        if type(value) is not int or value < 1:
            raise IRError(f"'cache.{key}' must be a positive integer, got {value!r}",
                          f"{where}.cache.{key}", hint)
        sizes[key] = value
    return CpuTiles(machine, mr, nr, sizes["kc"], sizes["mc"], sizes["nc"])


__all__ = ["CPU_SHAPES", "CpuGemm", "CpuLoops", "CpuMachine", "CpuShape", "CpuTiles",
           "GEMM_MIN_REUSE", "GemmBlocks", "HOST_DEFAULTS", "LOOP_MODES", "MR_PADDING",
           "NR_ALIGN", "column_width", "cpu_shape", "cpu_tiles", "gemm_blocks", "gemm_mr",
           "gemm_reuse", "gemm_roles", "machine_of", "max_mr", "one_thread", "recorded_tiles",
           "register_rows", "rows_per_block", "tiles_for"]
