"""The CPU emulation of blocks that wait on each other (host_emul.h `launch_concurrent`):
progress counters between blocks, grid barriers, per-block shared memory, and the failures it
must catch (a missing wait, a missing fence, a missing grid barrier, a deadlock).

The kernels are written by hand here so that each test shows one protocol and its broken
variant; tk-ram's and tk-grind's generated kernels are emulated through `emulate()`.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tilekit.codegen.emulate import find_cxx, host_program


pytestmark = pytest.mark.skipif(find_cxx() is None, reason="no C++ compiler")

PRELUDE = """
#include "runtime.cuh"
#include <cstdio>
static float data[8 * 64];
static float out[8 * 64];
static unsigned counter = 0;
"""

PRODUCER_CONSUMER = """
// Block 0 produces; blocks 1..7 wait for its counter, then read what it wrote.
__global__ void kernel() {
  const int t = threadIdx.x;
  if (blockIdx.x == 0) {
    for (int i = t; i < 8 * 64; i += blockDim.x) data[i] = 1.0f + i;
    __syncthreads();
    if (t == 0) { FENCE; atomicAdd(&counter, 1u); }
  } else {
    if (t == 0) { WAIT; }
    __syncthreads();
    out[blockIdx.x * 64 + t] = data[blockIdx.x * 64 + t];
  }
}
int main() {
  tk_emul::launch_concurrent(8, 64, [] { kernel(); });
  for (int b = 1; b < 8; ++b)
    for (int t = 0; t < 64; ++t)
      if (out[b * 64 + t] != 1.0f + b * 64 + t) { std::printf("stale\\n"); return 1; }
  std::printf("ok\\n");
  return 0;
}
"""

GRID_BARRIER = """
// Every block writes its part, meets the others at the grid barrier, reads its neighbour's.
__global__ void kernel() {
  const int t = threadIdx.x, b = blockIdx.x;
  data[b * 64 + t] = 1.0f + b * 64 + t;
  SYNC;
  const int n = (b + 1) % gridDim.x;
  out[b * 64 + t] = data[n * 64 + t];
}
int main() {
  tk_emul::launch_concurrent(8, 64, [] { kernel(); });
  for (int b = 0; b < 8; ++b)
    for (int t = 0; t < 64; ++t)
      if (out[b * 64 + t] != 1.0f + ((b + 1) % 8) * 64 + t) { std::printf("stale\\n"); return 1; }
  std::printf("ok\\n");
  return 0;
}
"""

SHARED_PER_BLOCK = """
// Resident blocks each own their shared memory, even when they interleave.
__global__ void kernel() {
  TK_STATIC_SMEM(smem, 256);
  float* s = reinterpret_cast<float*>(smem);
  s[threadIdx.x] = (float)blockIdx.x;
  __syncthreads();
  tk_spin();
  __syncthreads();
  out[blockIdx.x * 64 + threadIdx.x] = s[63 - threadIdx.x];
}
int main() {
  tk_emul::launch_concurrent(8, 64, [] { kernel(); });
  for (int b = 0; b < 8; ++b)
    for (int t = 0; t < 64; ++t)
      if (out[b * 64 + t] != (float)b) { std::printf("mixed\\n"); return 1; }
  std::printf("ok\\n");
  return 0;
}
"""


def build_cpp(tmp_path: Path, body: str, **macros: str) -> Path:
    source = tmp_path / "main.cpp"
    defines = "".join(f"#define {k} {v}\n" for k, v in macros.items())
    source.write_text(defines + PRELUDE + body)
    exe = tmp_path / "main"
    host_program(source, exe, "-DTK_EMUL_DYNAMIC_SMEM=1024")
    return exe


#: A race shows when the schedule lets a reader overtake its writer; each seed is another
#: schedule (host_emul.h draws thread orders and block speeds from it).
SEEDS = range(1, 9)


def run_cpp(tmp_path: Path, body: str, seed: int = 1, **macros: str
            ) -> subprocess.CompletedProcess:
    exe = build_cpp(tmp_path, body, **macros)
    return subprocess.run([str(exe)], capture_output=True, text=True, timeout=60,
                          env={"TK_EMUL_SEED": str(seed)})


def outcomes(tmp_path: Path, body: str, **macros: str) -> set[tuple[int, str]]:
    exe = build_cpp(tmp_path, body, **macros)
    return {(p.returncode, p.stdout.strip()) for p in (
        subprocess.run([str(exe)], capture_output=True, text=True, timeout=60,
                       env={"TK_EMUL_SEED": str(seed)}) for seed in SEEDS)}


WAIT = "while (tk_ld_acquire(&counter) < 1u) tk_spin()"


def test_counter_protocol_runs_under_every_schedule(tmp_path):
    assert outcomes(tmp_path, PRODUCER_CONSUMER, FENCE="__threadfence()",
                    WAIT=WAIT) == {(0, "ok")}


def test_a_missing_counter_wait_reads_stale_data(tmp_path):
    assert (1, "stale") in outcomes(tmp_path, PRODUCER_CONSUMER, FENCE="__threadfence()",
                                    WAIT="")


def test_a_missing_fence_before_the_signal_aborts(tmp_path):
    proc = run_cpp(tmp_path, PRODUCER_CONSUMER, FENCE="", WAIT=WAIT)
    assert proc.returncode == 6 and "__threadfence" in proc.stderr


def test_a_wait_that_nobody_signals_is_a_deadlock(tmp_path):
    proc = run_cpp(tmp_path, PRODUCER_CONSUMER, FENCE="__threadfence(); counter = 0; return",
                   WAIT=WAIT)
    assert proc.returncode == 5 and "deadlock" in proc.stderr


def test_grid_barrier_runs_under_every_schedule(tmp_path):
    assert outcomes(tmp_path, GRID_BARRIER, SYNC="tk_grid_sync()") == {(0, "ok")}


def test_a_missing_grid_barrier_reads_stale_data(tmp_path):
    assert (1, "stale") in outcomes(tmp_path, GRID_BARRIER, SYNC="")


def test_a_grid_barrier_some_blocks_skip_aborts(tmp_path):
    proc = run_cpp(tmp_path, GRID_BARRIER, SYNC="if (b != 3) tk_grid_sync()")
    assert proc.returncode == 4 and "grid barrier" in proc.stderr


def test_resident_blocks_own_their_shared_memory(tmp_path):
    proc = run_cpp(tmp_path, SHARED_PER_BLOCK)
    assert (proc.returncode, proc.stdout.strip()) == (0, "ok"), proc.stderr
