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
                    "median 2.000 ms, min 1.000 ms, max 3.000 ms")


def test_threads_capped_by_environment(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert cpu_threads() == 1
    assert cpu_description().endswith(", 1 thread)")


def test_peak_rss_is_positive():
    assert peak_rss_bytes() > 1 << 20
