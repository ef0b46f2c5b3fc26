"""The compiled CPU program: one call per run (tk_run), per-kernel profiling in C++, the
barriers between kernels, and tk-ram's CPU plans (vEUs as cores, tk_run_plan)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from tilekit.codegen import generate
from tilekit.codegen.cpu_program import barriers, parallel_run
from tilekit.codegen.cpu_ram import cpu_kernels
from tilekit.codegen.cxx import find_cxx
from tilekit.errors import TilekitError
from tilekit.hw import load_profile
from tilekit.ir.payloads import CodegenSection, KernelRecord
from tilekit.ir.program import parse_program
from tilekit.onnx import import_model, load_model
from tilekit.ram import ram_module
from tilekit.ram.cpu import cut_segments
from tilekit.roll.schedule import roll_module
from tilekit.runtime.compiled import CpuProgram
from tilekit.runtime.cpu import run_module
from tilekit.weld import weld_module

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models import control_models, onnx_models, ram_models  # noqa: E402

needs_cxx = pytest.mark.skipif(find_cxx() is None, reason="no C++ compiler")


def _record(name: str, args, writes, grid: int = 1) -> KernelRecord:
    return KernelRecord(name=name, group=name, entry=f"tk_{name}", ops=(name,),
                        shape="cpu_loops", schedule={}, grid=(grid, 1, 1), block=(1, 1, 1),
                        smem_bytes=0, args=tuple(args), writes=tuple(writes), source="")


# -- barriers (pure) ---------------------------------------------------------------------------

def test_a_chain_of_shared_kernels_has_a_barrier_after_each():
    ks = [_record("a", ["x", "y"], ["y"], 4), _record("b", ["y", "z"], ["z"], 4),
          _record("c", ["z", "w"], ["w"], 4)]
    assert barriers(ks, [0, 1, 2]) == (True, True, True)


def test_independent_kernels_share_the_team_without_barriers():
    ks = [_record("a", ["x", "y"], ["y"], 4), _record("b", ["x", "z"], ["z"], 4),
          _record("c", ["y", "z", "w"], ["w"], 4)]
    assert barriers(ks, [0, 1, 2]) == (False, True, True)


def test_one_block_kernels_in_a_row_run_on_one_thread_without_barriers():
    ks = [_record("a", ["x", "y"], ["y"], 1), _record("b", ["y", "z"], ["z"], 1),
          _record("c", ["z", "w"], ["w"], 8), _record("d", ["w", "v"], ["v"], 1)]
    # a -> b on the first thread: no barrier; c is shared out: a barrier before it and
    # after it (d reads what c's blocks wrote on every thread)
    assert barriers(ks, [0, 1, 2, 3]) == (False, True, True, True)


def test_small_loop_nests_run_on_the_first_thread_without_barriers():
    """A multi-block kernel marked `one_thread` (at most one block's work) runs all its
    blocks on the first thread: like one-block kernels, a run of them needs no barrier and
    opens no parallel region; the printed entry loops over its blocks on that thread."""
    from dataclasses import replace

    from tilekit.codegen.cpu_program import on_first_thread, program_source
    from tilekit.schedule.cpu import cpu_tiles, one_thread

    t = cpu_tiles()
    assert one_thread(t.block_work, t) and not one_thread(t.block_work + 1, t)
    small = replace(_record("b", ["y", "z"], ["z"], 8), schedule={"one_thread": True})
    ks = [_record("a", ["x", "y"], ["y"], 1), small, _record("c", ["z", "w"], ["w"], 1),
          _record("d", ["w", "v"], ["v"], 8)]
    assert on_first_thread(small) and not on_first_thread(ks[3])
    assert barriers(ks, [0, 1, 2, 3]) == (False, False, True, True)
    assert not parallel_run(ks, [0, 1, 2]) and parallel_run(ks, [0, 1, 2, 3])
    text = program_source(ks)
    assert ("if (omp_get_thread_num() == 0) for (int tk_b = 0; tk_b < 8; ++tk_b) "
            "tk_call<tk_b_body>") in text
    assert "tk_share(8, tk_lo, tk_hi);\n    for (int tk_b = tk_lo; tk_b < tk_hi; ++tk_b) " \
        "tk_call<tk_d_body>" in text


def test_every_other_shared_kernel_walks_its_blocks_backwards():
    """Serpentine order: of the kernels whose blocks are shared out, every other one in the
    unit's order walks each thread's run of blocks backwards (first-thread kernels between
    them do not count), so it starts where the one before it ended; each thread's run is
    OpenMP's static share."""
    from tilekit.codegen.cpu_program import program_source, serpentine

    assert serpentine([True, False, True, True, False, True]) == (
        False, False, True, False, False, True)
    ks = [_record("a", ["x", "y"], ["y"], 4), _record("b", ["y", "z"], ["z"], 1),
          _record("c", ["z", "w"], ["w"], 6)]
    text = program_source(ks)
    assert "for (int tk_b = tk_lo; tk_b < tk_hi; ++tk_b) tk_call<tk_a_body>" in text
    assert "for (int tk_b = tk_hi - 1; tk_b >= tk_lo; --tk_b) tk_call<tk_c_body>" in text
    share = text[text.index("static inline void tk_share"):]
    assert "q = n / threads, r = n % threads" in share and "lo = me * q + (me < r ? me : r)" \
        in share


def test_a_write_after_read_needs_a_barrier():
    ks = [_record("a", ["x", "y"], ["y"], 4), _record("b", ["q", "x"], ["x"], 4)]
    assert barriers(ks, [0, 1]) == (True, True)


def test_only_runs_with_several_blocks_open_a_parallel_region():
    ks = [_record("a", ["x", "y"], ["y"], 1), _record("b", ["y", "z"], ["z"], 3)]
    assert not parallel_run(ks, [0])
    assert parallel_run(ks, [0, 1])


# -- one call per run --------------------------------------------------------------------------

def _imported(tmp_path, model, name):
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, str(path))
    imported = import_model(load_model(str(path)))
    weights = {k: np.ascontiguousarray(v) for k, v in imported.weights.items()}
    return imported.module.with_stage("import"), weights


def _inputs(module, seed=0):
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(module.tensors[n].shape).astype(np.float32)
            for n in module.inputs}


@needs_cxx
def test_one_call_equals_per_kernel_calls_and_profiles_every_kernel(tmp_path):
    module, weights = _imported(tmp_path, onnx_models.lstm_model(seq=4, batch=1, inputs=8,
                                                                 hidden=16), "lstm")
    code = generate(module, target="cpu").module
    inputs = _inputs(code)
    one = CpuProgram(code, threads=2)
    each = CpuProgram(code, threads=2, per_kernel=True)
    strict = CpuProgram(code, threads=2, overlap=False)
    assert len(one.runs) == 1
    got, want, ordered = one.run(inputs, weights), each.run(inputs, weights), \
        strict.run(inputs, weights)
    for name in want:   # the same kernels; bodies inlined elsewhere may contract FMAs otherwise
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(ordered[name], want[name], rtol=1e-5, atol=1e-6)
    names = [k.name for k in CodegenSection.read(code.codegen).kernels]
    out, timings = one.profile(inputs, weights)
    assert [n for n, _ in timings] == names
    assert all(t >= 0 for _, t in timings)
    np.testing.assert_allclose(out[code.outputs[0]], want[code.outputs[0]], rtol=1e-5,
                               atol=1e-6)
    assert [n for n, _ in each.profile(inputs, weights)[1]] == names
    assert one.timings is None      # profiling ends with the call


#: A team of threads passing barriers: each writes its slot with the generation, then every
#: thread checks that all slots hold it. A thread let through early reads a slot of the
#: generation before.
_BARRIER_CHECK = r"""
int main(int argc, char** argv) {
  const int threads = atoi(argv[1]), rounds = atoi(argv[2]);
  std::atomic<unsigned> slots[64];
  int wrong = 0;
  tk_barrier bar;
#pragma omp parallel num_threads(threads) reduction(+ : wrong)
  {
    const int n = omp_get_num_threads(), me = omp_get_thread_num();
    tk_team_enter(bar, n);
    for (int r = 1; r <= rounds; ++r) {
      slots[me].store(r, std::memory_order_relaxed);
      tk_grid_sync();
      for (int t = 0; t < n; ++t) wrong += slots[t].load(std::memory_order_relaxed) != (unsigned)r;
      tk_grid_sync();
    }
    tk_team_leave();
  }
  printf("%d\n", wrong);
  return wrong != 0;
}
"""


@needs_cxx
@pytest.mark.parametrize("threads", [2, 5])
def test_the_team_barrier_lets_no_thread_through_before_all_arrive(tmp_path, threads):
    """The team barrier of tk_run and of persistent kernels (runtime_cpu.h `tk_grid_sync`
    after `tk_team_enter`), compiled alone: with as many threads as cores (waits end
    spinning) and more (waiters sleep on the futex), no thread passes a barrier before every
    thread arrived, over thousands of them."""
    from tilekit.codegen.helpers import CPU_HEADERS

    source = tmp_path / "barrier.cpp"
    source.write_text('#include "runtime_cpu.h"\n#include <cstdio>\n#include <cstdlib>\n'
                      + _BARRIER_CHECK)
    binary = tmp_path / "barrier"
    subprocess.run([find_cxx(), "-O2", "-std=c++17", "-fopenmp", "-I",
                    str(CPU_HEADERS[0].parent), str(source), "-o", str(binary)],
                   check=True, capture_output=True)
    done = subprocess.run([str(binary), str(threads), "20000"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


#: The main of a helper's check: a page of floats (each its index + 0.5) between two pages
#: that fault, given to CHECKS, which count the wrong lanes.
_GUARDED_PAGE_MAIN = r"""
#include <sys/mman.h>
int main() {
  const long size = 4096;
  char* base = static_cast<char*>(mmap(nullptr, 3 * size, PROT_READ | PROT_WRITE,
                                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  mprotect(base, size, PROT_NONE);
  mprotect(base + 2 * size, size, PROT_NONE);
  float* page = reinterpret_cast<float*>(base + size);
  const long n = size / 4;
  for (long i = 0; i < n; ++i) page[i] = static_cast<float>(i) + 0.5f;
  const int wrong = CHECKS;
  printf("%d\n", wrong);
  return wrong != 0;
}
"""

#: tk_pack_row over a page between two inaccessible ones: rows that start before the page or
#: end past it, their lanes outside masked off (a convolution's padding), and a mask with
#: holes. A masked-off lane that were read would fault; a wrong lane prints its position.
_PACK_ROW_CHECK = r"""
template <int W>
static int check(float* page, long n) {
  int wrong = 0;
  alignas(64) float dst[W];
  alignas(64) int ok[W];
  for (long start = -W + 1; start < n; start += 3) {
    for (int holes = 0; holes < 2; ++holes) {
      for (int i = 0; i < W; ++i) {
        const long at = start + i;
        ok[i] = (at >= 0 && at < n && !(holes && i % 3 == 1)) ? -1 : 0;
      }
      tk_pack_row<W>(dst, page + start, ok, -7.0f, page);
      for (int i = 0; i < W; ++i) {
        const float want = ok[i] ? page[start + i] : -7.0f;
        if (dst[i] != want) { printf("W %d start %ld lane %d\n", W, start, i); ++wrong; }
      }
    }
  }
  return wrong;
}

""" + _GUARDED_PAGE_MAIN.replace(
    "CHECKS", "check<8>(page, n) + check<16>(page, n) + check<32>(page, n)")


#: tk_gather_row the same way, its lanes' values apart (see the test).
_GATHER_ROW_CHECK = r"""
template <int W>
static int check(float* page, long n) {
  int wrong = 0;
  alignas(64) float dst[W];
  alignas(64) int ok[W];
  alignas(64) int off[W];
  for (long start = -2 * W; start < n; start += 1) {
    for (int form = 0; form < 4; ++form) {
      for (int i = 0; i < W; ++i) {
        // two apart; two apart with a jump at lane 5 (a panel crossing into the next image
        // row); three apart; two apart with a hole in the mask
        long at = start + (form == 2 ? 3 : 2) * i + (form == 1 && i >= 5 ? 7 : 0);
        off[i] = static_cast<int>(at);
        ok[i] = (at >= 0 && at < n && !(form == 3 && i == 9)) ? -1 : 0;
      }
      tk_gather_row<W>(dst, page, off, ok, -7.0f);
      for (int i = 0; i < W; ++i) {
        const float want = ok[i] ? page[off[i]] : -7.0f;
        if (dst[i] != want) {
          printf("W %d start %ld form %d lane %d\n", W, start, form, i);
          ++wrong;
        }
      }
    }
  }
  return wrong;
}

""" + _GUARDED_PAGE_MAIN.replace("CHECKS", "check<16>(page, n) + check<32>(page, n)")


#: tk_gemm_micro_fill the same way: 5 rows of a B panel read from the page as the
#: micro-kernel computes (contiguous, or gathered two apart), their lanes outside the page and
#: a hole masked off (tk_lane_bits from the lanes' ints): the panel it leaves holds each row
#: (the pad elsewhere) and the tile is A times that panel, for whole and half-width tiles.
_FILL_CHECK = r"""
#include <cmath>
template <int NR, int W, int G>
static int check(float* page, long n) {
  constexpr int MR = 4, KC = 5;
  int wrong = 0;
  alignas(64) float a[KC * MR];
  alignas(64) float b[KC * NR];
  alignas(64) float c[MR * NR];
  alignas(64) int ok[NR];
  alignas(64) int lanes[NR];
  int rows[KC];
  long long bits[KC];
  for (int i = 0; i < KC * MR; ++i) a[i] = 0.25f * (i % 7) - 0.5f;
  for (int i = 0; i < NR; ++i) lanes[i] = 2 * i;
  for (long start = -2 * NR - 3; start < n; start += 5) {
    for (int k = 0; k < KC; ++k) {
      rows[k] = static_cast<int>(start + 3 * k);
      for (int i = 0; i < NR; ++i) {
        const long at = rows[k] + (G ? lanes[i] : i);
        ok[i] = (at >= 0 && at < n && !(k == 2 && i % 5 == 3)) ? -1 : 0;
      }
      bits[k] = tk_lane_bits<NR>(ok);
      for (int i = 0; i < NR; ++i)
        if ((((unsigned long long)bits[k] >> i) & 1) != (ok[i] != 0)) {
          printf("bits NR %d lane %d\n", NR, i);
          ++wrong;
        }
    }
    tk_gemm_micro_fill<MR, W, NR, 0, G>(a, page, rows, bits, lanes, -7.0f, b, KC, c, NR, 0, a);
    for (int k = 0; k < KC; ++k)
      for (int i = 0; i < NR; ++i) {
        const long at = rows[k] + (G ? lanes[i] : i);
        const float want = (((unsigned long long)bits[k] >> i) & 1) ? page[at] : -7.0f;
        if (b[k * NR + i] != want) {
          printf("panel NR %d G %d start %ld row %d lane %d\n", NR, G, start, k, i);
          ++wrong;
        }
      }
    for (int r = 0; r < MR; ++r)
      for (int j = 0; j < W; ++j) {
        double s = 0;
        for (int k = 0; k < KC; ++k) s += double(a[k * MR + r]) * b[k * NR + j];
        if (std::fabs(c[r * NR + j] - s) > 1e-5 * (1 + std::fabs(s))) {
          printf("tile NR %d W %d G %d start %ld at %d,%d\n", NR, W, G, start, r, j);
          ++wrong;
        }
      }
  }
  return wrong;
}

""" + _GUARDED_PAGE_MAIN.replace(
    "CHECKS", "check<16, 16, 0>(page, n) + check<16, 8, 0>(page, n) + check<32, 32, 0>(page, n)"
    " + check<32, 16, 0>(page, n) + check<16, 16, 1>(page, n) + check<32, 32, 1>(page, n)"
    " + check<32, 16, 1>(page, n)")


def _run_alone(tmp_path, name: str, check: str) -> subprocess.CompletedProcess:
    """A check of runtime_cpu.h's helpers compiled alone for this machine, run."""
    from tilekit.codegen.cxx import CXX_FLAGS
    from tilekit.codegen.helpers import CPU_HEADERS

    source = tmp_path / f"{name}.cpp"
    source.write_text('#include "runtime_cpu.h"\n#include <cstdio>\n' + check)
    binary = tmp_path / name
    flags = [f for f in CXX_FLAGS if f not in ("-shared", "-fPIC", "-w")]
    subprocess.run([find_cxx(), *flags, "-I", str(CPU_HEADERS[0].parent), str(source), "-o",
                    str(binary)], check=True, capture_output=True)
    return subprocess.run([str(binary)], capture_output=True, text=True, timeout=60)


@needs_cxx
def test_a_gathered_row_reads_only_its_lanes_inside(tmp_path):
    """runtime_cpu.h's tk_gather_row, compiled alone for this machine (AVX-512's or AVX2's
    masked gathers): rows of 16 and 32 lanes over a page whose neighbours fault, their values
    two apart, two apart with a jump (a panel crossing image rows), three apart, and with a
    hole in the mask, starting before the page and ending past it: each lane inside is its
    value, each other one the pad, and no lane off the mask is read."""
    done = _run_alone(tmp_path, "gather", _GATHER_ROW_CHECK)
    assert done.returncode == 0 and done.stdout.strip().endswith("0"), done.stdout + done.stderr


@needs_cxx
def test_a_packed_row_reads_only_its_lanes_inside(tmp_path):
    """runtime_cpu.h's tk_pack_row, compiled alone for this machine (-march=native: AVX-512's
    masked loads where it has them, else AVX's): rows of 8, 16 and 32 lanes over a page
    whose neighbours fault, starting before it and ending past it with those lanes masked
    off, and masks with holes: each lane inside is copied, each other one is the pad."""
    done = _run_alone(tmp_path, "pack", _PACK_ROW_CHECK)
    assert done.returncode == 0 and done.stdout.strip().endswith("0"), done.stdout + done.stderr


@needs_cxx
def test_a_micro_kernel_that_fills_its_panel_reads_only_its_lanes_inside(tmp_path):
    """runtime_cpu.h's tk_gemm_micro_fill, compiled alone for this machine: a micro-tile that
    packs its B panel as it reads it (rows contiguous, or gathered two apart) over a page
    whose neighbours fault, rows starting before the page and ending past it with those lanes
    masked off, and a hole in one row's mask: the panel holds each lane inside and the pad
    elsewhere, the tile is A times the panel (whole and half-width tiles), no lane off the
    mask is read, and tk_lane_bits gives each lane's bit."""
    done = _run_alone(tmp_path, "fill", _FILL_CHECK)
    assert done.returncode == 0 and done.stdout.strip().endswith("0"), done.stdout + done.stderr


@needs_cxx
def test_every_buffer_starts_on_a_cache_line(tmp_path):
    """The runtime's buffers (and the fresh one after an output is handed over) start on 64
    bytes, where NumPy would start a large array 16 bytes past a page: a vector of AVX-512
    would then span two cache lines at every access."""
    module, weights = _imported(tmp_path, onnx_models.mlp_epilogue(tokens=64, d_in=96,
                                                                   d_out=80), "mlp")
    code = generate(module, target="cpu").module
    program = CpuProgram(code, threads=2)
    inputs = _inputs(code)
    for _ in range(2):
        got = program.run(inputs, weights)
        assert all(b.ctypes.data % 64 == 0 for b in program.buffers.values())
    want = run_module(module, inputs, weights)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5)
        assert got[name].dtype == want[name].dtype and got[name].shape == want[name].shape


@needs_cxx
def test_kernels_for_a_profile_no_file_holds_run_when_the_caller_names_it(tmp_path):
    """A shipped profile scaled to other cores (`Profile.with_cpu`) is in no file, so the
    recorded-kernels check cannot find it by the IR's `hardware` name: the caller who
    generated the kernels passes it."""
    module, weights = _imported(tmp_path, onnx_models.softmax_chain(rows=64, seq=128),
                                "softmax")
    profile = load_profile("icelake").with_cpu(cores=3)
    code = generate(weld_module(roll_module(module, profile), profile), profile,
                    target="cpu").module
    with pytest.raises(TilekitError, match="re-run tk-codegen"):
        CpuProgram(code, threads=2)
    inputs = _inputs(code)
    got = CpuProgram(code, threads=2, profile=profile).run(inputs, weights)
    want = run_module(module, inputs, weights)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5)


@needs_cxx
def test_code_without_a_profile_is_cut_for_the_machines_simd(tmp_path, monkeypatch):
    """tk-run's compiled mode on a module rolled for no CPU profile generates its kernels
    for the shipped profile of the machine's SIMD ISA scaled to the threads (the vectors
    -march=native builds), or with none when no shipped profile has that ISA."""
    import tilekit.hw.cpu as hw_cpu
    import tilekit.runtime.compiled as compiled
    from tilekit.runtime import backend

    module, weights = _imported(tmp_path, onnx_models.mlp_epilogue(tokens=64, d_in=96,
                                                                   d_out=80), "mlp")
    inputs = _inputs(module)
    want = run_module(module, inputs, weights)
    seen = []
    real = compiled.with_cpu_code
    monkeypatch.setattr(compiled, "with_cpu_code",
                        lambda m, p=None: (seen.append(p), real(m, p))[1])
    for isa, name in [("avx2", "milan"), ("avx512", "icelake"), ("neon", None)]:
        monkeypatch.setattr(hw_cpu, "host_isa", lambda isa=isa: isa)
        got = backend(module, "cpu", "compiled", threads=2).run(inputs, weights)
        assert (seen[-1] and (seen[-1].name, seen[-1].cpu.cores)) == (name and (name, 2))
        for out in want:
            np.testing.assert_allclose(got[out], want[out], rtol=1e-4, atol=1e-5)


@needs_cxx
def test_host_driven_loops_run_each_step_as_one_call(tmp_path):
    module, weights = _imported(tmp_path, control_models.lstm_loop(seq=3), "loop")
    code = generate(module, target="cpu").module
    inputs = _inputs(code)
    one = CpuProgram(code, threads=2)
    each = CpuProgram(code, threads=2, per_kernel=True)
    assert one.steps is not None
    got, want = one.run(inputs, weights), each.run(inputs, weights)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6)
    assert one.counts == each.counts        # launches are counted per kernel
    reference = run_module(module, inputs, weights)
    for name in want:
        np.testing.assert_allclose(got[name], reference[name], rtol=1e-4, atol=1e-5)
    timed = [n for n, _ in one.profile(inputs, weights)[1]]
    assert timed == [n for n, _ in each.profile(inputs, weights)[1]]


# -- tk-ram on a CPU profile -------------------------------------------------------------------

def _cpu_profile():
    return load_profile("milan").with_cpu(cores=2)


@pytest.fixture(scope="session")
def packed_cell(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cell")
    module, weights = _imported(folder, ram_models.inception_block(channels=8, size=6,
                                                                   width=4, towers=2),
                                "inception")
    profile = _cpu_profile()
    welded = weld_module(roll_module(module, profile), profile)
    planned = ram_module(welded, profile, cpu_kernels=cpu_kernels)
    return module, welded, planned, weights, profile


def test_a_cpu_plan_packs_the_branches_on_the_cores(packed_cell):
    _, welded, planned, _, profile = packed_cell
    program = parse_program(planned.program)
    persistent = [s for s in program.segments if s.kind == "persistent"]
    assert persistent and all(s.veus <= profile.sm_count for s in persistent)
    assert all(o.threads == 1 and o.variant == 0 for o in program.operators)
    assert program.estimate["makespan_us"] <= program.estimate["serial_us"]
    # every vEU runs tasks of more than one operator: branches side by side
    assert all(len({i.op for i in items}) > 1 for s in persistent for items in s.lists)
    again = ram_module(welded, profile, cpu_kernels=cpu_kernels)
    assert again.program == planned.program       # deterministic


@needs_cxx
def test_a_packed_program_equals_the_reference(packed_cell):
    module, welded, planned, weights, profile = packed_cell
    packed = generate(planned, profile, target="cpu").module
    plain = generate(welded, profile, target="cpu").module
    inputs = _inputs(packed)
    runner = CpuProgram(packed, threads=2)
    assert runner.plan is not None
    got = runner.run(inputs, weights)
    want = CpuProgram(plain, threads=2, per_kernel=True).run(inputs, weights)
    reference = run_module(module, inputs, weights)
    # the same kernels: equal but for the last bits (a body inlined into the plan's walker
    # may have its multiply-adds contracted into FMAs otherwise)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got[name], reference[name], rtol=1e-4, atol=1e-5)
    again = runner.run(inputs, weights)             # the counters start from 0 every run
    for name in want:
        np.testing.assert_array_equal(again[name], got[name])
    # fewer threads than vEUs: the segment runs op by op, same results
    single = CpuProgram(packed, threads=1).run(inputs, weights)
    for name in want:
        np.testing.assert_allclose(single[name], want[name], rtol=1e-5, atol=1e-6)
    # profiling times every kernel (op by op)
    names = [k.name for k in CodegenSection.read(packed.codegen).kernels]
    assert sorted(n for n, _ in runner.profile(inputs, weights)[1]) == sorted(names)


@needs_cxx
def test_a_plan_that_does_not_match_the_kernels_is_refused(packed_cell):
    _, _, planned, _, profile = packed_cell
    packed = generate(planned, profile, target="cpu").module
    program = parse_program(packed.program)
    s = next(i for i, seg in enumerate(program.segments) if seg.kind == "persistent")
    seg = program.segments[s]
    o = seg.operators[0]
    op = program.operators[o]
    # one more rTask than the kernel has blocks, first on vEU 0: a valid plan of another
    # kernel than the one codegen made
    lists = [list(items) for items in seg.lists]
    from tilekit.ir.program import TASK, Item
    lists[0].insert(0, Item(TASK, o, op.tasks, 1))
    waits = [[Item(i.kind, i.op, i.first, op.tasks + 1) if i.op == o and i.kind != TASK
              else i for i in items] for items in lists]
    segments = list(program.segments)
    segments[s] = replace(seg, lists=tuple(tuple(x) for x in waits))
    operators = list(program.operators)
    operators[o] = replace(op, tasks=op.tasks + 1)
    bad = replace(program, operators=tuple(operators), segments=tuple(segments))
    with pytest.raises(TilekitError) as exc:
        CpuProgram(replace(packed, program=bad.record()), threads=2)
    assert exc.value.where == f"program.operators[{o}]"
    assert "rTasks" in str(exc.value) and "\n" not in str(exc.value)
    # an ill-formed section: the reader's one-line error with its IR path
    broken = dict(packed.program)
    broken["segments"] = [dict(x) for x in broken["segments"]]
    broken["segments"][s]["lists"] = ["0:0+1 bogus"] + broken["segments"][s]["lists"][1:]
    with pytest.raises(TilekitError) as exc:
        CpuProgram(replace(packed, program=broken), threads=2)
    assert exc.value.where.startswith(f"program.segments[{s}].lists[0]")


def test_tk_ram_on_a_cpu_profile_needs_a_cpu_rolled_module(tmp_path):
    from tilekit.cli.tk_import import main as tk_import
    from tilekit.cli.tk_ram import main

    onnx.save(ram_models.inception_block(channels=8, size=6, width=4, towers=1),
              str(tmp_path / "m.onnx"))
    imported = CliRunner().invoke(tk_import, [str(tmp_path / "m.onnx"), "-o",
                                              str(tmp_path / "m.yaml")])
    assert imported.exit_code == 0, imported.output
    result = CliRunner().invoke(main, [str(tmp_path / "m.yaml"), "--hw", "milan",
                                       "-o", str(tmp_path / "out.yaml")])
    assert result.exit_code == 2
    lines = [x for x in result.output.splitlines() if x.strip()]
    assert len(lines) == 1 and "not rolled for a CPU profile" in lines[0]
    assert "tk-roll --hw" in lines[0]
    assert not (tmp_path / "out.yaml").exists()


def test_ordinary_kernels_cut_the_persistent_segments():
    from tilekit.ram.tasks import Layout, ROperator, Variant

    def op(i, fixed=""):
        v = Variant(0, 2, 1, 0, 0, 1.0, 0.5, "cpu", Layout("whole", ()))
        return ROperator(i, f"k{i}", (f"o{i}",), (v,), fixed)

    ops = [op(0), op(1), op(2, "control"), op(3), op(4)]
    assert cut_segments(ops, [0, 0, 1, 2, 2]) == [("persistent", [0, 1]), ("kernel", [2]),
                                                   ("persistent", [3, 4])]
    assert cut_segments(ops[:3], [0, 1, 2]) == [("persistent", [0, 1]), ("kernel", [2])]
    assert cut_segments([op(0), op(1, "x")], [0, 1]) == [("kernel", [0]), ("kernel", [1])]
