"""The launch-time co-residency check of a grid whose blocks wait on each other.

A persistent program (tk-ram) or a device loop (tk-grind) is planned with the compile-time
bound of `tilekit.schedule.residency`; before launching, the runtime asks the driver how many
blocks of the compiled function an SM holds (cuOccupancyMaxActiveBlocksPerMultiprocessor) and
refuses a grid larger than that times the SM count. A refused launch raises `TilekitError`
naming the kernel, the grid, the limit and its parts; it never launches (a grid that is not
co-resident can hang the device).

The driver is reached through `Occupancy`, an interface with one method, so tests replace it
with `FixedOccupancy` on a machine without a GPU (tests/unit/test_residency.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from tilekit.errors import TilekitError


class Occupancy(Protocol):
    """What the check needs from the device."""

    def blocks_per_sm(self, function: Any, threads: int, dynamic_smem: int) -> int: ...

    def sm_count(self) -> int: ...


@dataclass(frozen=True)
class CupyOccupancy:
    """The driver's answer through CuPy (`function` is a `cupy.RawModule` function)."""

    cupy: Any

    def blocks_per_sm(self, function: Any, threads: int, dynamic_smem: int) -> int:
        driver = self.cupy.cuda.driver
        # a RawKernel's driver function is its `kernel` (loaded on first use)
        handle = getattr(function, "kernel", function)
        return int(driver.occupancyMaxActiveBlocksPerMultiprocessor(
            handle.ptr, int(threads), int(dynamic_smem)))

    def sm_count(self) -> int:
        device = self.cupy.cuda.Device()
        return int(device.attributes["MultiProcessorCount"])


@dataclass(frozen=True)
class FixedOccupancy:
    """A device that answers `per_sm` blocks per SM on `sms` SMs, whatever the kernel (tests,
    and planning against stated figures without a device)."""

    per_sm: int
    sms: int = 1

    def blocks_per_sm(self, function: Any, threads: int, dynamic_smem: int) -> int:
        return self.per_sm

    def sm_count(self) -> int:
        return self.sms


def check_coresident(entry: str, grid: int, threads: int, dynamic_smem: int, function: Any,
                     occupancy: Occupancy, where: str) -> int:
    """Raise unless `grid` blocks of `function` can all be resident at once; return the
    limit. `where` is the IR path of the launch (for the message)."""
    per_sm = occupancy.blocks_per_sm(function, threads, dynamic_smem)
    sms = occupancy.sm_count()
    limit = per_sm * sms
    if grid > limit:
        raise TilekitError(
            f"kernel {entry} would launch {grid} co-operating blocks, but this device holds "
            f"only {limit} at once ({per_sm} block(s)/SM x {sms} SMs at {threads} threads and "
            f"{dynamic_smem} B dynamic shared memory): not launched, it could hang",
            where, "re-run the stage with this device's profile (--hw), or a smaller grid")
    return limit
