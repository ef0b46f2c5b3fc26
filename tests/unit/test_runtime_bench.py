"""Timing and device naming for --bench."""

from __future__ import annotations

import pytest

from tilekit.runtime.bench import (Timing, cpu_description, cpu_threads, peak_rss_bytes,
                                   time_runs)


def test_time_runs_counts_calls():
    calls = []
    timing = time_runs(lambda: calls.append(1), runs=4, warmup=2)
    assert len(calls) == 6 and len(timing.seconds) == 4 and timing.warmup == 2
    assert timing.min <= timing.median <= timing.max


def test_time_runs_needs_a_run():
    with pytest.raises(ValueError):
        time_runs(lambda: None, runs=0)


def test_line_names_the_device():
    line = Timing((0.001, 0.003, 0.002), 1).line("cpu (X, 2 threads)")
    assert line == ("bench: 3 runs after 1 warm-up on cpu (X, 2 threads): "
                    "median 2.000 ms, p90 2.800 ms, min 1.000 ms, max 3.000 ms, "
                    "stddev 1.000 ms")


def test_percentiles_and_spread_as_numpy_computes_them():
    np = pytest.importorskip("numpy")
    seconds = (0.004, 0.001, 0.010, 0.002, 0.003)
    t = Timing(seconds, 0)
    assert t.median == pytest.approx(np.percentile(seconds, 50))
    assert t.p90 == pytest.approx(np.percentile(seconds, 90))
    assert t.stddev == pytest.approx(np.std(seconds, ddof=1))
    one = Timing((0.005,), 0)
    assert one.p90 == 0.005 and one.stddev == 0.0


def test_record_is_data_in_milliseconds():
    rec = Timing((0.001, 0.003, 0.002), 1).record("cpu (X, 2 threads)", threads=2)
    assert rec == {"runs": 3, "warmup": 1, "device": "cpu (X, 2 threads)",
                   "method": "wall clock, whole runs", "p50_ms": 2.0, "p90_ms": 2.8,
                   "min_ms": 1.0, "max_ms": 3.0, "stddev_ms": 1.0,
                   "times_ms": [1.0, 3.0, 2.0], "threads": 2}


def test_on_run_is_called_after_every_call():
    seen = []
    time_runs(lambda: None, runs=3, warmup=1, on_run=lambda: seen.append(1))
    assert len(seen) == 4


def test_threads_capped_by_environment(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert cpu_threads() == 1
    assert cpu_description().endswith(", 1 thread)")


def test_peak_rss_is_positive():
    assert peak_rss_bytes() > 1 << 20
