"""Co-residency: the compile-time bound (schedule/residency.py) and the launch-time check
(runtime/occupancy.py) against a fake driver."""

from __future__ import annotations

import pytest

from tilekit.errors import TilekitError
from tilekit.hw import load_profile
from tilekit.runtime.occupancy import FixedOccupancy, check_coresident
from tilekit.schedule.residency import common_residency, residency


@pytest.fixture(scope="session")
def h100():
    return load_profile("h100")


def test_threads_bound(h100):
    r = residency(h100, threads=1024, registers=32, smem_bytes=0)
    assert (r.per_sm, r.limited_by) == (2, "threads")
    assert r.grid == 2 * h100.sm_count


def test_registers_bound_rounds_per_warp(h100):
    # 255 registers x 32 lanes = 8160, allocated as 8192 per warp: 8 warps per SM.
    r = residency(h100, threads=256, registers=255, smem_bytes=0)
    assert (r.per_sm, r.limited_by) == (1, "registers")
    # 128 registers: 4096 per warp, 16 warps, two blocks of 8 warps.
    assert residency(h100, threads=256, registers=128, smem_bytes=0).per_sm == 2


def test_shared_memory_counts_the_reserved_kilobyte(h100):
    # 228 KiB per SM; 114 KiB blocks would fit twice without the 1 KiB reserve, not with it.
    r = residency(h100, threads=128, registers=32, smem_bytes=114 * 1024)
    assert (r.per_sm, r.limited_by) == (1, "shared memory")
    assert "shared memory" in r.why() and str(r.grid) in r.why()


def test_over_a_per_block_limit_cannot_run(h100):
    assert residency(h100, threads=2048, registers=32, smem_bytes=0).per_sm == 0
    assert residency(h100, threads=128, registers=32,
                     smem_bytes=h100.smem_per_block + 1).per_sm == 0


def test_a_slot_fits_every_body(h100):
    r = common_residency(h100, [(128, 64, 0), (256, 32, 40 * 1024)])
    assert (r.threads, r.registers, r.smem_bytes) == (256, 64, 40 * 1024)


def test_launch_check_refuses_a_grid_that_is_not_coresident():
    assert check_coresident("k", 264, 256, 0, None, FixedOccupancy(2, 132), "program") == 264
    with pytest.raises(TilekitError) as err:
        check_coresident("k", 265, 256, 0, None, FixedOccupancy(2, 132), "program.segments[0]")
    assert "264" in str(err.value) and "not launched" in str(err.value)
    assert err.value.where == "program.segments[0]"
