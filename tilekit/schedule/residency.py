"""Occupancy and co-residency: how many blocks of a kernel an SM holds at once, and why.

`blocks_per_sm` is the one occupancy function: the cost model reads it for every candidate
(waves, saturation, latency hiding), and the co-residency bound below is the same figure.

A persistent program (tk-ram) or a device loop (tk-grind) launches a grid whose blocks wait on
each other (progress counters, grid barriers). That is correct only when every block of the
grid is resident at the same time; a grid larger than that can deadlock. This module is the
one place that computes the bound at compile time, from a body's resources (threads per block,
registers per thread as ptxas reports them, shared memory per block) and the profile. The
launcher checks it again against the driver's occupancy query before launching
(`tilekit.runtime.occupancy`), because the driver is the authority.

The computation follows the CUDA occupancy rules for sm_80/sm_90, on the conservative side:

- threads: `max_threads_per_sm // (warps x warp size)` (a partial warp occupies a whole one);
- registers: allocated per warp in units of `REGISTER_UNIT` registers, so a warp holds
  `ceil(regs x 32 / 256) x 256`; blocks by registers `(regs_per_sm // per_warp) // warps`;
- shared memory: each block's bytes rounded up to `SMEM_UNIT` plus the `SMEM_RESERVED` bytes
  the runtime keeps per block (cudaDevAttrReservedSharedMemoryPerBlock, 1 KiB since sm_80);
- the profile's `max_blocks_per_sm`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Registers are allocated per warp in units of this many (sm_50 and later).
REGISTER_UNIT = 256
#: Shared memory is allocated per block in units of this many bytes (sm_80, sm_90).
SMEM_UNIT = 128
#: Shared memory the CUDA runtime reserves per resident block (sm_80 and later).
SMEM_RESERVED = 1024


@dataclass(frozen=True)
class Residency:
    """Blocks of one body an SM can hold, the resource that bounds it, and the grid bound."""

    per_sm: int
    limited_by: str          # "threads", "registers", "shared memory" or "blocks per SM"
    sm_count: int
    threads: int
    registers: int
    smem_bytes: int

    @property
    def grid(self) -> int:
        """The largest grid whose blocks are all resident at once (0: the body cannot run)."""
        return self.per_sm * self.sm_count

    def why(self) -> str:
        """One line: the bound and what sets it (for reports, the IR and error messages)."""
        return (f"{self.per_sm} block(s)/SM x {self.sm_count} SMs = {self.grid} "
                f"(limited by {self.limited_by}: {self.threads} threads, "
                f"{self.registers} registers/thread, {self.smem_bytes} B shared memory)")


#: The resources in the order `blocks_per_sm` reports the one that bounds a kernel.
LIMITS = ("threads", "registers", "shared memory", "blocks per SM")


def blocks_per_sm(profile, threads, registers, smem_bytes):
    """Blocks of a kernel with these resources one SM holds at once, and the index in
    `LIMITS` of the resource that bounds it: **the one occupancy function**, which the cost
    model (every candidate tile of tk-roll, tk-weld's groups, tk-ram's slots), tk-grind's
    placements and the co-residency checks all use. Arrays (one value per candidate) or
    scalars; a kernel over a per-block limit holds 0."""
    threads = np.asarray(threads, dtype=np.int64)
    registers = np.asarray(registers, dtype=np.int64)
    smem_bytes = np.asarray(smem_bytes, dtype=np.int64)
    warp = profile.warp_size
    # CUDA's allocation granules; a distributed machine (no warps, no runtime reserve)
    # allocates exactly what a block asks for
    cuda = profile.kind == "simt"
    reg_unit, smem_unit, reserved = ((REGISTER_UNIT, SMEM_UNIT, SMEM_RESERVED) if cuda
                                     else (1, 1, 0))
    warps = -(-np.maximum(threads, 1) // warp)
    per_warp_regs = -(-np.maximum(registers, 1) * warp // reg_unit) * reg_unit
    smem = -(-smem_bytes // smem_unit) * smem_unit
    by_threads = np.where(threads <= profile.max_threads_per_block,
                          profile.max_threads_per_sm // (warps * warp), 0)
    by_regs = np.where((registers <= profile.max_regs_per_thread)
                       & (registers * threads <= profile.regs_per_block),
                       (profile.regs_per_sm // per_warp_regs) // warps, 0)
    by_smem = np.where(smem_bytes <= profile.smem_per_block,
                       profile.smem_per_sm // np.maximum(smem + reserved, 1), 0)
    bounds = np.stack(np.broadcast_arrays(by_threads, by_regs, by_smem,
                                          np.asarray(profile.max_blocks_per_sm)))
    return np.maximum(bounds.min(axis=0), 0), bounds.argmin(axis=0)


def residency(profile, threads: int, registers: int, smem_bytes: int) -> Residency:
    """The co-residency of a body with these resources on `profile` (a `tilekit.hw.Profile`).

    `registers` are per thread (ptxas' figure, or the cost model's estimate before compiling);
    `smem_bytes` all shared memory per block, static and dynamic. A body that exceeds a
    per-block limit gets `per_sm == 0`, limited by that resource.
    """
    if threads < 1 or registers < 0 or smem_bytes < 0:
        raise ValueError(f"bad resources: {threads} threads, {registers} registers, "
                         f"{smem_bytes} B")
    per_sm, limit = blocks_per_sm(profile, threads, registers, smem_bytes)
    return Residency(per_sm=int(per_sm), limited_by=LIMITS[int(limit)],
                     sm_count=profile.sm_count, threads=threads, registers=registers,
                     smem_bytes=smem_bytes)


def common_residency(profile, bodies) -> Residency:
    """The co-residency of a slot that must fit every body in `bodies` (pairs or triples
    `(threads, registers, smem_bytes)`): the slot takes the most of each resource, as a
    persistent block does that may run any of them."""
    bodies = list(bodies)
    if not bodies:
        raise ValueError("no bodies")
    threads = max(b[0] for b in bodies)
    registers = max(b[1] for b in bodies)
    smem = max(b[2] for b in bodies)
    return residency(profile, threads, registers, smem)
