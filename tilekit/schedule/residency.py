"""Co-residency: how many blocks of a kernel body an SM holds at once, and why.

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


def residency(profile, threads: int, registers: int, smem_bytes: int) -> Residency:
    """The co-residency of a body with these resources on `profile` (a `tilekit.hw.Profile`).

    `registers` are per thread (ptxas' figure, or the cost model's estimate before compiling);
    `smem_bytes` all shared memory per block, static and dynamic. A body that exceeds a
    per-block limit gets `per_sm == 0`, limited by that resource.
    """
    if threads < 1 or registers < 0 or smem_bytes < 0:
        raise ValueError(f"bad resources: {threads} threads, {registers} registers, "
                         f"{smem_bytes} B")
    warp = profile.warp_size
    warps = -(-threads // warp)
    per_warp_regs = -(-max(registers, 1) * warp // REGISTER_UNIT) * REGISTER_UNIT
    smem = -(-smem_bytes // SMEM_UNIT) * SMEM_UNIT
    bounds = {
        "threads": profile.max_threads_per_sm // (warps * warp)
        if threads <= profile.max_threads_per_block else 0,
        "registers": (profile.regs_per_sm // per_warp_regs) // warps
        if registers <= profile.max_regs_per_thread
        and registers * threads <= profile.regs_per_block else 0,
        "shared memory": profile.smem_per_sm // (smem + SMEM_RESERVED)
        if smem_bytes <= profile.smem_per_block else 0,
        "blocks per SM": profile.max_blocks_per_sm,
    }
    limited_by = min(bounds, key=lambda k: (bounds[k], list(bounds).index(k)))
    return Residency(per_sm=max(0, bounds[limited_by]), limited_by=limited_by,
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
