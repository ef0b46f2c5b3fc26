"""The micro performance model: its properties over profile variants and problem sizes."""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest

from tilekit.expr import analyze, parse
from tilekit.hw import load_profile
from tilekit.roll.construct import construct_tiles, roll_problem
from tilekit.ir.payloads import round_sig
from tilekit.roll.cost import (Estimate, combine_estimates, cost_tiles, estimate_bytes, machine,
                               wave_efficiency)
from tilekit.roll.problem import problem_from_analysis
from tilekit.roll.workloads import load_workloads

#: A spread of the suite: conv (strided, depthwise, 1x1), GEMMs, pooling, elementwise,
#: reductions, a reshape with // and %.
SAMPLE = ("resnet50_conv1", "resnet50_l1_3x3_64", "resnet50_l4_1x1_2048_512",
          "mobilenetv2_dw_96_s2", "bert_base_ffn1", "bert_base_scores", "gemm_4096",
          "gemv_4096", "resnet50_maxpool", "resnet50_relu_112", "bert_base_softmax_max",
          "reduce_sum_1m", "flatten_resnet", "transpose_2d", "bert_large_ffn1_fp16")


@functools.lru_cache(maxsize=None)
def workload_problem(name):
    w = next(w for w in load_workloads() if w.name == name)
    m = w.module()
    op = m.ops[0]
    an = analyze(parse(op.expr), {k: t.shape for k, t in m.tensors.items()},
                 axes=op.axes or None, pad=op.pad, dtypes={k: t.dtype for k, t in
                                                          m.tensors.items()})
    return problem_from_analysis(an, {k: t.dtype for k, t in m.tensors.items()})


def columns(problem, tiles):
    ns, nr, n = problem.n_spatial, len(problem.axes) - problem.n_spatial, len(tiles)
    return (np.array([t.block for t in tiles], dtype=np.int64).T.reshape(ns, n),
            np.array([t.thread for t in tiles], dtype=np.int64).T.reshape(ns, n),
            np.array([t.step for t in tiles], dtype=np.int64).T.reshape(nr, n))


def times(problem, profile, tiles):
    return cost_tiles(problem, machine(profile, problem.dtype), *columns(problem, tiles)).time_s


def scaled(profile, **factors):
    """A profile variant with some figures multiplied (validated like a file)."""
    changes = {k: type(getattr(profile, k))(getattr(profile, k) * f) for k, f in factors.items()}
    return dataclasses.replace(profile, **changes)


def more_sms(profile, factor):
    """`factor` times the SMs, each as before: what belongs to an SM grows with the count
    (device-wide peaks, and the L2 or exchange bandwidth that is the sum of the SMs' ports;
    shared-memory bandwidth is per SM already); DRAM stays as it is."""
    extra = {}
    if profile.l2_bandwidth:
        extra["l2_bandwidth"] = profile.l2_bandwidth * factor
    if profile.exchange_bandwidth:
        extra["exchange_bandwidth"] = profile.exchange_bandwidth * factor
    return dataclasses.replace(
        profile, sm_count=profile.sm_count * factor,
        peaks={k: v * factor for k, v in profile.peaks.items()},
        tensor_peaks={k: v * factor for k, v in profile.tensor_peaks.items()}, **extra)


@pytest.mark.parametrize("hw", ["h100", "v100", "ipu"])
def test_more_bandwidth_is_never_slower(hw):
    base = load_profile(hw)
    variants = [scaled(base, dram_bandwidth=2.0), scaled(base, smem_bandwidth_per_sm=2.0)]
    if base.l2_bandwidth:
        variants.append(scaled(base, l2_bandwidth=2.0))
    if base.exchange_bandwidth:
        variants.append(scaled(base, exchange_bandwidth=2.0))
    for name in SAMPLE:
        p = workload_problem(name)
        tiles = construct_tiles(p, base)
        before = times(p, base, tiles)
        for v in variants:
            assert np.all(times(p, v, tiles) <= before * (1 + 1e-12)), name


@pytest.mark.parametrize("hw", ["h100", "v100", "ipu"])
@pytest.mark.parametrize("factor", [2, 3])
def test_more_sms_is_never_slower(hw, factor):
    base = load_profile(hw)
    big = more_sms(base, factor)
    for name in SAMPLE:
        p = workload_problem(name)
        tiles = construct_tiles(p, base)
        assert np.all(times(p, big, tiles) <= times(p, base, tiles) * (1 + 1e-12)), name
        # The rolled best is no slower either.
        assert roll_problem(p, big)[0].estimate.time_us <= \
            roll_problem(p, base)[0].estimate.time_us * (1 + 1e-9), name


def gemm(m, k, n):
    shapes = {"a": (m, k), "b": (k, n), "y": (m, n)}
    return problem_from_analysis(analyze(parse("y[i,j] += a[i,k] * b[k,j]"), shapes))


@pytest.mark.parametrize("hw", ["h100", "v100"])
def test_twice_the_work_takes_twice_the_time_when_compute_bound(hw):
    prof = load_profile(hw)
    small = gemm(4096, 4096, 4096)
    (best,) = roll_problem(small, prof)
    assert best.estimate.bound in ("compute", "smem")
    # Twice the reduction: the same grid, so exactly twice the time.
    t1 = times(small, prof, [best.tile])[0]
    assert times(gemm(4096, 8192, 4096), prof, [best.tile])[0] / t1 == pytest.approx(2, rel=0.01)
    # Twice the rows: twice the blocks, up to the last wave's quantization.
    assert times(gemm(8192, 4096, 4096), prof, [best.tile])[0] / t1 == pytest.approx(2, rel=0.15)
    # Rolled afresh, the bigger problems take about twice as long too.
    for big in (gemm(4096, 8192, 4096), gemm(8192, 4096, 4096)):
        ratio = roll_problem(big, prof)[0].estimate.time_us / best.estimate.time_us
        assert ratio == pytest.approx(2, rel=0.15)


def without_launch(profile):
    """The profile without its launch overhead: a constant per kernel that hides ratios."""
    import dataclasses
    return dataclasses.replace(profile, launch_overhead=None)


def test_memory_bound_time_scales_with_bytes():
    h100 = without_launch(load_profile("h100"))
    one = problem_from_analysis(analyze(parse("y[i] = x[i] + 1.0"), {"x": (1 << 22,),
                                                                       "y": (1 << 22,)}))
    two = problem_from_analysis(analyze(parse("y[i] = x[i] + 1.0"), {"x": (1 << 23,),
                                                                       "y": (1 << 23,)}))
    a, b = roll_problem(one, h100)[0].estimate, roll_problem(two, h100)[0].estimate
    assert a.bound == b.bound == "dram"
    assert 1.9 < b.time_us / a.time_us < 2.1
    # 32 MiB moved at 0.9 x 3.35 TB/s.
    assert b.time_us == pytest.approx(2 * (1 << 23) * 4 / (3.35e12 * 0.9) * 1e6, rel=0.05)


def test_wave_efficiency():
    eff, waves = wave_efficiency(np.array([132, 133, 264, 1]), 132)
    assert list(waves) == [1, 2, 2, 1]
    np.testing.assert_allclose(eff, [1.0, 133 / 264, 1.0, 1 / 132])


def test_a_tile_breaking_a_limit_is_invalid():
    h100 = load_profile("h100")
    p = workload_problem("gemm_4096")
    m = machine(h100)
    costs = cost_tiles(p, m, np.array([[64, 64, 2048, 128], [64, 2048, 64, 128]]),
                       np.array([[8, 1, 8, 16], [8, 1, 8, 16]]),
                       np.array([[32, 32, 32, 32]]))
    # fine; 2048 threads per block; 2048x32x4x2 B of shared memory; 16x16 accumulators
    assert list(costs.valid) == [True, False, False, False]


def test_estimates_round_to_four_significant_digits():
    e = Estimate(time_us=12.345678, flops=123456789.0, dram_bytes=4096.0, smem_bytes=0.0,
                 bound="dram", waves=3, wave_efficiency=0.987654)
    assert e.as_dict() == {"time_us": 12.35, "flops": 123500000, "dram_bytes": 4096,
                           "smem_bytes": 0, "bound": "dram", "waves": 3,
                           "wave_efficiency": 0.9877}
    assert round_sig(0.0) == 0.0 and round_sig(1.23456e-7) == 1.235e-7


def test_bytes_only_and_combined_estimates():
    h100 = without_launch(load_profile("h100"))
    e = estimate_bytes(h100, 4 << 20, 4 << 20, 256, 1 << 20)
    assert e.bound == "dram" and e.flops == 0
    assert e.time_us == pytest.approx((8 << 20) / (3.35e12 * 0.9) * 1e6, rel=0.05)
    both = combine_estimates(h100, [e, e], saved_dram_bytes=4 << 20)
    assert both.dram_bytes == 3 * (4 << 20)
    assert both.time_us < 2 * e.time_us
    assert combine_estimates(h100, [e]) is e
    launched = estimate_bytes(load_profile("h100"), 4 << 20, 4 << 20, 256, 1 << 20)
    assert launched.time_us == pytest.approx(e.time_us + 4.0, rel=1e-3)
    tiny = estimate_bytes(load_profile("h100"), 64, 64, 256, 16)
    assert tiny.bound == "launch"
