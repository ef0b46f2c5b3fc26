"""How kernels run on a CPU: register tiles, cache tiles and parallel blocks, from the profile.

Roller's construction with a CPU's alignment (no search): a contraction runs as the BLIS
algorithm does, so its tiles follow from three memory levels.

- **Registers.** The micro-kernel keeps an `mr x nr` tile of accumulators in vector registers
  (`nr / lanes` vectors per row) and needs `nr / lanes` more for a row of B and one for a
  broadcast value of A: the largest `mr` with `mr * v + v + 1 <= registers`. `nr` is two
  vectors, and a multiple of 16 float32 lanes, so that the same C++ compiles for AVX2 (8
  lanes), AVX-512 (16) and NEON (4) (runtime_cpu.h picks the vectors at compile time).
- **L1.** One step of the reduction streams a `kc x nr` micro-panel of B from L1 for every
  `mr` rows: `kc * nr * 4` bytes take half of L1.
- **L2.** The block's packed A panel (`mc x kc`), B panel (`kc x nc`) and output tile
  (`mc x nc`) share L2: A and the output tile a quarter each, B half.
- **Cores.** A block (`mc x nc` outputs) is the unit of parallel work; the tiles shrink (to
  whole micro-tiles) until there are at least `blocks_per_core` blocks per core.

Loop nests (everything that is not a contraction) run in blocks of rows of about
`block_work` element operations each, their innermost loop in vector lanes.

Without a CPU profile (`tk-codegen --target cpu` on a module rolled for a GPU, or not rolled)
the figures are those of a common AVX2 server core: 16 vector registers of 8 float32 lanes,
32 KiB of L1 and 512 KiB of L2 per core, 2 cores (`HOST_DEFAULTS`).
"""

from __future__ import annotations

from dataclasses import dataclass

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
                      l2_bytes=profile.cache("l2").per_core_bytes)


def cpu_tiles(profile=None) -> CpuTiles:
    """Register and cache tiles from the machine's figures (see the module docstring)."""
    m = machine_of(profile)
    vectors = max(1, -(-NR_ALIGN // m.f32_lanes))
    vectors = max(vectors, 2 if m.f32_lanes * 2 <= 2 * NR_ALIGN else 1)
    nr = max(NR_ALIGN, vectors * m.f32_lanes)
    nr = -(-nr // NR_ALIGN) * NR_ALIGN
    v = nr // m.f32_lanes
    mr = max(1, min(16, (m.vector_registers - v - 1) // v))
    kc = _floor_to(m.l1_bytes // 2 // (nr * 4), 16, lowest=16)
    mc = _floor_to(m.l2_bytes // 4 // (kc * 4), mr, lowest=mr)
    nc = _floor_to(m.l2_bytes // 2 // (kc * 4), nr, lowest=nr)
    nc = max(nr, min(nc, _floor_to(m.l2_bytes // 4 // (mc * 4), nr, lowest=nr)))
    return CpuTiles(m, mr, nr, kc, mc, nc)


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
    n_row: int = 1                  # nc is a whole number of rows of this many points


def gemm_blocks(tiles: CpuTiles, m: int, n: int, k: int, batch: int, n_row: int = 1
                ) -> GemmBlocks:
    """The cache tiles shrunk to the problem (never past a micro-tile) and, while there are
    fewer blocks than `blocks_per_core` per core, halved: N first (the B panel is re-packed
    per block of M), then M. Blocks are even (128 rows in blocks of at most 126 are two of
    66, not 126 and 2). With `n_row` > 1 (the extent of the output's contiguous axis, when N
    has more axes: a convolution's pixels) and a row fitting the N tile, `nc` is a whole
    number of rows, so that a block's outputs are whole rows of the output."""
    mr, nr = tiles.mr, tiles.nr
    n_step = n_row if 1 < n_row <= tiles.nc and n % n_row == 0 else 1
    unit = nr if n_step == 1 else n_step
    mc = min(tiles.mc, -(-m // mr) * mr)
    nc = min(max(tiles.nc // unit, 1) * unit, -(-n // unit) * unit)
    kc = min(tiles.kc, k)
    want = tiles.machine.cores * tiles.blocks_per_core

    def count(mc_: int, nc_: int) -> int:
        return batch * -(-m // mc_) * -(-n // nc_)

    while count(mc, nc) < want:
        if nc > unit and nc >= mc:
            nc = max(unit, (nc // 2) // unit * unit)
        elif mc > mr:
            mc = max(mr, (mc // 2) // mr * mr)
        elif nc > unit:
            nc = max(unit, (nc // 2) // unit * unit)
        else:
            break
    mc = -(-(-(-m // -(-m // mc))) // mr) * mr
    nc = -(-(-(-n // -(-n // nc))) // unit) * unit
    kc = -(-k // -(-k // kc))
    return GemmBlocks(mc, nc, kc, -(-m // mc), -(-n // nc), -(-k // kc), n_step)


def rows_per_block(rows: int, work_per_row: int, tiles: CpuTiles) -> int:
    """Rows of a loop nest per parallel block: about `block_work` operations each, and at
    least `blocks_per_core` blocks per core while the rows allow."""
    per = max(1, tiles.block_work // max(1, work_per_row))
    want = tiles.machine.cores * tiles.blocks_per_core
    per = min(per, max(1, -(-rows // want)))
    return max(1, min(per, rows))


__all__ = ["CpuMachine", "CpuTiles", "GemmBlocks", "HOST_DEFAULTS", "NR_ALIGN", "cpu_tiles",
           "gemm_blocks", "machine_of", "rows_per_block"]
