"""Timing runs and naming the machine they ran on.

A benchmark number means nothing without the device: every report carries the CPU model
(from /proc/cpuinfo) and the number of threads the process may use.
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

    def line(self, device: str) -> str:
        n = len(self.seconds)
        how = f" ({self.method})" if self.method else ""
        return (f"bench: {n} run{'s' if n != 1 else ''} after {self.warmup} warm-up on "
                f"{device}{how}: median {self.median * 1e3:.3f} ms, min {self.min * 1e3:.3f} ms, "
                f"max {self.max * 1e3:.3f} ms")


def time_runs(fn: Callable[[], object], runs: int, warmup: int = 1) -> Timing:
    """Call `fn` `warmup` times untimed, then `runs` times timed (`time.perf_counter`).

    `fn` must finish its work before returning (a GPU runner synchronises).
    """
    if runs < 1:
        raise ValueError("runs must be at least 1")
    for _ in range(warmup):
        fn()
    seconds = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - start)
    return Timing(tuple(seconds), warmup)


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo, or what the platform module knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "cpu model") and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


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
