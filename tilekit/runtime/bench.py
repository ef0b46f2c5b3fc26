"""Timing runs and naming the machine they ran on.

A benchmark number means nothing without the device: every report carries the CPU model
(from /proc/cpuinfo) and the number of threads the process may use. A `Timing` gives the
median (p50), the 90th percentile, min, max and the sample standard deviation of its runs.
"""

from __future__ import annotations

import os
import platform
import resource
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Timing:
    """Wall-clock seconds of `len(seconds)` runs, taken after `warmup` untimed runs.

    `method` says what was timed when it is not the whole call (e.g. kernels only).
    """

    seconds: tuple[float, ...]
    warmup: int
    method: str = ""

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def min(self) -> float:
        return min(self.seconds)

    @property
    def max(self) -> float:
        return max(self.seconds)

    @property
    def p90(self) -> float:
        """The 90th percentile, interpolated between the sorted runs (numpy's default
        'linear' method; the one run for a single run)."""
        if len(self.seconds) == 1:
            return self.seconds[0]
        return statistics.quantiles(self.seconds, n=10, method="inclusive")[8]

    @property
    def stddev(self) -> float:
        """The sample standard deviation of the runs (0 for a single run)."""
        return statistics.stdev(self.seconds) if len(self.seconds) > 1 else 0.0

    def line(self, device: str) -> str:
        n = len(self.seconds)
        how = f" ({self.method})" if self.method else ""
        return (f"bench: {n} run{'s' if n != 1 else ''} after {self.warmup} warm-up on "
                f"{device}{how}: median {self.median * 1e3:.3f} ms, p90 "
                f"{self.p90 * 1e3:.3f} ms, min {self.min * 1e3:.3f} ms, max "
                f"{self.max * 1e3:.3f} ms, stddev {self.stddev * 1e3:.3f} ms")

    def record(self, device: str, threads: int | None = None) -> dict:
        """The timing as data (tk-run --report-format json): milliseconds, the runs in order,
        the device and, on the CPU, the threads the process may use."""
        ms = lambda s: round(s * 1e3, 6)  # noqa: E731 - a unit, named once
        out = {"runs": len(self.seconds), "warmup": self.warmup, "device": device,
               "method": self.method or "wall clock, whole runs",
               "p50_ms": ms(self.median), "p90_ms": ms(self.p90), "min_ms": ms(self.min),
               "max_ms": ms(self.max), "stddev_ms": ms(self.stddev),
               "times_ms": [ms(s) for s in self.seconds]}
        if threads is not None:
            out["threads"] = threads
        return out


def time_runs(fn: Callable[[], object], runs: int, warmup: int = 1,
              on_run: Callable[[], None] | None = None) -> Timing:
    """Call `fn` `warmup` times untimed, then `runs` times timed (`time.perf_counter`);
    `on_run` (a progress display) is called after each call, outside the timed span.

    `fn` must finish its work before returning (a GPU runner synchronises).
    """
    if runs < 1:
        raise ValueError("runs must be at least 1")
    for _ in range(warmup):
        fn()
        if on_run is not None:
            on_run()
    seconds = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - start)
        if on_run is not None:
            on_run()
    return Timing(tuple(seconds), warmup)


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo, or what the platform module knows."""
    from tilekit.hw.cpu import cpuinfo_field

    return (cpuinfo_field("model name", "Model", "cpu model") or platform.processor()
            or platform.machine() or "unknown CPU")


def cpu_threads() -> int:
    """Threads NumPy's BLAS may use: the CPUs this process may run on, capped by the usual
    thread-count variables when they are set."""
    try:
        count = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        count = os.cpu_count() or 1
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        value = os.environ.get(var, "")
        if value.isdigit() and int(value) > 0:
            count = min(count, int(value))
    return count


def cpu_description() -> str:
    """`cpu (AMD EPYC 7B13, 2 threads)`."""
    threads = cpu_threads()
    return f"cpu ({cpu_model()}, {threads} thread{'s' if threads != 1 else ''})"


def peak_rss_bytes() -> int:
    """Peak resident memory of this process so far (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024
