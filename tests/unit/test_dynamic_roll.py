"""One roll for a range of sizes on a CPU (tilekit.roll.dynamic): the pricing sizes, the
micro-kernel candidates and their efficiency. End to end (a symbolic module rolled once and
run at several sizes): tests/e2e/test_dynamic_shapes.py."""

from __future__ import annotations

from tilekit.hw import load_profile
from tilekit.ir.dims import Dim
from tilekit.roll.dynamic import (FMA_IN_FLIGHT, MAX_PRICED, micro_candidates,
                                  micro_efficiency, pricing_sizes)
from tilekit.schedule.cpu import cpu_tiles, machine_of


def test_pricing_sizes_are_the_likely_values_else_the_range():
    assert pricing_sizes({"seq": Dim(1, 2048, (1, 128, 512))}) == [
        {"seq": 1}, {"seq": 128}, {"seq": 512}]
    assert pricing_sizes({"seq": Dim(1, 4096, ())}) == [{"seq": 1}, {"seq": 64},
                                                        {"seq": 4096}]
    both = pricing_sizes({"batch": Dim(1, 8, (1, 8)), "seq": Dim(16, 16 * 64, ())})
    assert len(both) == 6 and {"batch": 8, "seq": 1024} in both


def test_many_symbols_are_priced_along_the_diagonal():
    dims = {f"s{i}": Dim(1, 4096, ()) for i in range(4)}
    sizes = pricing_sizes(dims)
    assert len(sizes) <= MAX_PRICED
    assert sizes[0] == {f"s{i}": 1 for i in range(4)}


def test_micro_candidates_fit_the_registers_and_start_with_the_profile_s():
    profile = load_profile("milan")
    m = machine_of(profile)
    candidates = micro_candidates(profile)
    assert candidates[0] == cpu_tiles(profile)
    assert len({(t.mr, t.nr) for t in candidates}) == len(candidates) > 3
    for t in candidates:
        vectors = -(-t.nr // m.f32_lanes)
        assert t.mr * vectors + vectors + 1 <= m.vector_registers


def test_a_micro_kernel_of_few_chains_is_priced_below_the_peak():
    profile = load_profile("milan")
    by_tile = {(t.mr, t.nr): t for t in micro_candidates(profile)}
    lanes = machine_of(profile).f32_lanes
    assert micro_efficiency(by_tile[(6, 16)]) == 1.0
    assert micro_efficiency(by_tile[(1, 16)]) == (16 // lanes) / FMA_IN_FLIGHT
