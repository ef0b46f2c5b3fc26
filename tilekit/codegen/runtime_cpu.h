// tilekit CPU helpers, included by every kernel of the C++ target (tilekit/tile/cpp.py).
//
// The same helpers as the device's runtime.cuh (floor division, NaN-propagating max/min,
// sigmoid, bounds checks), compiled as host C++: host_types.h gives the half types and what
// CUDA's headers would, and TK_HOST_EMUL leaves out runtime.cuh's device-only parts (warp
// shuffles, tensor cores, progress counters), which CPU programs never use (the CPU lowering
// refuses them). Its SHA-256 is recorded in the IR (codegen.helpers.sha256).
#pragma once

#include <climits>
#include <cstdint>

#define TK_HOST_EMUL 1
#include "host_types.h"
#include "runtime.cuh"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <omp.h>
#include <sched.h>
#include <vector>
#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif
#if defined(__AVX__)
#include <immintrin.h>
#elif defined(__ARM_NEON)
#include <arm_neon.h>
#endif

// -- team synchronisation -------------------------------------------------------------------
// What tk_run's barriers, a plan's segments (tk_run_plan) and a persistent kernel's grid
// barriers wait and signal with.
// Progress: `done` so far (an operator's blocks, a barrier's generations), `sleepers`
// threads blocked on it; zero when made.
struct tk_progress {
  std::atomic<unsigned> done{0};
  std::atomic<int> sleepers{0};
};

static inline void tk_cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Sleep until `p` counts `n` (a futex on Linux, else yield).
static inline void tk_sleep_until(tk_progress& p, unsigned n) {
  for (;;) {
    p.sleepers.fetch_add(1, std::memory_order_seq_cst);
    const unsigned seen = p.done.load(std::memory_order_seq_cst);
    if (seen >= n) {
      p.sleepers.fetch_sub(1, std::memory_order_relaxed);
      return;
    }
#if defined(__linux__)
    syscall(SYS_futex, reinterpret_cast<unsigned*>(&p.done), FUTEX_WAIT_PRIVATE, seen,
            nullptr, nullptr, 0);
#else
    sched_yield();
#endif
    p.sleepers.fetch_sub(1, std::memory_order_relaxed);
  }
}

// How long a thread spins before it sleeps in tk_wait_for: adapted per thread, between 100
// microseconds (the producer is usually running on another core, and a waiter that slept
// runs again only when the scheduler gets to it, tens of microseconds on a quiet virtual
// machine) and 2. A wait that took over 200 microseconds halves it: the producer was
// preempted (a loaded machine), and spinning then takes the core from the very thread
// waited for (spinning as long as libgomp's barriers, 300000 tries, held it on a loaded
// machine; yielding while spinning was slower). A wait that ended spinning doubles it.
static thread_local double tk_spin_seconds = 100e-6;

// Wait until `p` counts `n`: spin (by time, not tries: a `pause` takes from a few to over a
// hundred cycles across CPUs), then sleep on the counter (a futex on Linux, else yield).
static inline void tk_wait_for(tk_progress& p, unsigned n) {
  if (p.done.load(std::memory_order_acquire) >= n) return;
  const double start = omp_get_wtime();
  for (int i = 1;; ++i) {
    if (p.done.load(std::memory_order_acquire) >= n) {
      tk_spin_seconds = tk_spin_seconds >= 50e-6 ? 100e-6 : 2 * tk_spin_seconds;
      return;
    }
    tk_cpu_relax();
    if (i % 64 == 0 && omp_get_wtime() > start + tk_spin_seconds) break;
  }
  tk_sleep_until(p, n);
  if (omp_get_wtime() > start + 200e-6)
    tk_spin_seconds = tk_spin_seconds <= 4e-6 ? 2e-6 : 0.5 * tk_spin_seconds;
}

// Count `n` more of `p` done (release: the stores before it, before the count), and wake
// the threads asleep on it.
static inline void tk_signal(tk_progress& p, unsigned n) {
  p.done.fetch_add(n, std::memory_order_seq_cst);
#if defined(__linux__)
  if (p.sleepers.load(std::memory_order_seq_cst) > 0)
    syscall(SYS_futex, reinterpret_cast<unsigned*>(&p.done), FUTEX_WAKE_PRIVATE, INT_MAX,
            nullptr, nullptr, 0);
#endif
}

// The team barrier (of tk_run, and a persistent kernel's grid barrier): the last thread to
// arrive counts one more generation, the others wait for it in tk_wait_for. libgomp's own
// barrier under OMP_WAIT_POLICY=passive sleeps at once, and a sleeper wakes only when the
// scheduler gets to it: tens of microseconds per barrier, which a run of many small kernels
// pays at every one.
// `generation`: the calling thread's count of the barriers it passed in this run.
struct tk_barrier {
  std::atomic<int> arrived{0};
  tk_progress passed;
};

static inline void tk_team_barrier(tk_barrier& b, int threads, unsigned& generation) {
  ++generation;
  if (threads <= 1) return;
  if (b.arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == threads) {
    b.arrived.store(0, std::memory_order_relaxed);   // before the release of tk_signal
    tk_signal(b.passed, 1);
  } else {
    tk_wait_for(b.passed, generation);
  }
}

// The team a parallel region's threads form, as each of its threads sees it: the barrier
// they share, how many they are, and how many barriers this thread passed. Whoever opens
// the region (tk_run, a persistent kernel's entry) enters it on every thread; a persistent
// kernel's blocks are the team's threads, and its grid barrier (`tk_grid_sync`) is the
// team's barrier, so a kernel run by tk_run and tk_run's own barriers count one sequence.
struct tk_team_state {
  tk_barrier* barrier;
  int threads;
  unsigned generation;
};
static thread_local tk_team_state tk_this_team{nullptr, 1, 0};

static inline void tk_team_enter(tk_barrier& b, int threads) {
  tk_this_team = tk_team_state{&b, threads, 0};
}

// After the region: the thread is alone again (its barrier was the region's).
static inline void tk_team_leave() { tk_this_team = tk_team_state{nullptr, 1, 0}; }

static inline void tk_grid_sync() {
  tk_team_state& t = tk_this_team;
  if (t.barrier != nullptr) tk_team_barrier(*t.barrier, t.threads, t.generation);
}

// -- block memory ---------------------------------------------------------------------------
// A kernel's block-local buffers (the GPU's shared memory) live on the stack when small; a
// CPU kernel's packed panels and output tile (hundreds of KiB) would overflow a worker
// thread's stack, so each thread keeps one growing 64-byte-aligned arena for them.
static inline unsigned char* tk_block_memory(size_t bytes) {
  static thread_local unsigned char* base = nullptr;
  static thread_local size_t size = 0;
  if (bytes > size) {
    std::free(base);
    size = (bytes + 4095) & ~static_cast<size_t>(4095);
    base = static_cast<unsigned char*>(std::aligned_alloc(64, size));
  }
  return base;
}

// -- SIMD vectors -----------------------------------------------------------------------------
// float32 lanes of the widest vector registers the compiler targets (-march): 512-bit with
// AVX-512, 256-bit with AVX/AVX2, 128-bit otherwise (SSE, NEON). GCC/Clang vector extensions:
// the same source compiles for each; arithmetic on them is lane-wise.
#if defined(__AVX512F__)
#define TK_F32_LANES 16
#elif defined(__AVX__)
#define TK_F32_LANES 8
#else
#define TK_F32_LANES 4
#endif
typedef float tk_f32v __attribute__((vector_size(TK_F32_LANES * 4)));

static __forceinline__ tk_f32v tk_f32v_load(const float* p) {
  tk_f32v v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

static __forceinline__ void tk_f32v_store(float* p, tk_f32v v) { std::memcpy(p, &v, sizeof v); }

// Every lane *p: one broadcast load (vbroadcastss, ld1r). Written with the ISA's intrinsic
// where there is one: GCC spells a generic splat as two half-width broadcasts.
static __forceinline__ tk_f32v tk_f32v_splat(const float* p) {
#if defined(__AVX512F__)
  return _mm512_set1_ps(*p);
#elif defined(__AVX__)
  return _mm256_broadcast_ss(p);
#elif defined(__ARM_NEON)
  return vld1q_dup_f32(p);
#else
  tk_f32v v;
  for (int i = 0; i < TK_F32_LANES; ++i) v[i] = *p;
  return v;
#endif
}

// -- elementwise math in vector lanes -------------------------------------------------------
// exp, tanh, erf and sigmoid as straight-line float arithmetic, so that a `simd` loop runs
// them in vector lanes (libm's expf, tanhf and erff are calls the vectoriser cannot enter).
// They are always inlined: in a unit of many kernels GCC's inliner runs out of its growth
// budget and calls them instead, and a loop with a call is not vectorised (an LSTM step's
// gates then ran as scalar code with a branch per select, 3-12x as long, the most where the
// signs of its inputs were mixed). Errors: exp within 2 ulp; tanh and erf within 2e-7
// relative (tests/unit/test_cpu_math.py sweeps them against float64); NaN propagates,
// infinities give the limits.

static __forceinline__ float tk_bits_to_float(int32_t i) { return __builtin_bit_cast(float, i); }

static __forceinline__ int32_t tk_float_to_bits(float f) { return __builtin_bit_cast(int32_t, f); }

// exp(x) = 2^n exp(r): n = rint(x / ln 2) by the 1.5 x 2^23 rounding trick, r = x - n ln 2 in
// two parts (Cody-Waite), exp(r) by its Taylor series to r^7 on |r| <= ln 2 / 2 (error below
// 2e-9), 2^n from the exponent bits (as 2^(n-1) x 2, so that n = 128 stays finite).
static __forceinline__ float tk_expf(float x) {
  const float shifted = x * 1.44269504088896341f + 12582912.0f;
  const float n = shifted - 12582912.0f;
  const int32_t ni = tk_float_to_bits(shifted) - 0x4B400000;
  float r = x - n * 0.693145751953125f;
  r = r - n * 1.428606765330187045e-06f;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const float scale = tk_bits_to_float((ni + 126) << 23);
  const float y = p * scale * 2.0f;
  return x > 88.72283f ? __builtin_inff() : (x < -87.33654f ? 0.0f : y);
}

// tanh: x P(x^2) below 0.625 (a least-squares fit of tanh(x)/x, relative error 4e-9), else
// 1 - 2 / (exp(2|x|) + 1) with the sign of x; 1 from 9 on.
static __forceinline__ float tk_tanhf(float x) {
  const float a = x < 0.0f ? -x : x;
  const float u = x * x;
  float p = -0.005652355259668975f;
  p = p * u + 0.020583488974880118f;
  p = p * u - 0.05371848497871731f;
  p = p * u + 0.13331091126750277f;
  p = p * u - 0.3333325872294499f;
  p = p * u + 0.9999999959311563f;
  const float small = x * p;
  const float e = tk_expf(2.0f * (a < 9.0f ? a : 9.0f));
  const float big = 1.0f - 2.0f / (e + 1.0f);
  const float mag = a < 9.0f ? big : 1.0f;
  return a < 0.625f ? small : (x < 0.0f ? -mag : (x != x ? x : mag));
}

// erf: x P(x^2) below 0.9 (a least-squares fit of erf(x)/x, relative error 1.2e-8), else
// 1 - erfc(|x|) with erfc(a) = exp(Q(a - 0.9)), Q a degree-8 least-squares fit of log erfc
// on [0.9, 4] weighted by erfc (erf within 7.5e-8 there, evaluated in float32: a rounding of
// its last bits); 1 from 4 on. No division: the erfcc fit of Numerical Recipes took one
// (1 / (1 + z / 2)), and a vector division (10-20 cycles) cost about as much as the rest of
// erf: with it, a GELU epilogue took about 1.9x ONNX Runtime's Gelu per element on one Xeon
// core, and MLP-Mixer's GEMMs with GELU were 1.04x and 1.07x as long as they are now.
static __forceinline__ float tk_erff(float x) {
  const float a = x < 0.0f ? -x : x;
  const float u = x * x;
  float p = -0.0006086067294315337f;
  p = p * u + 0.005011083248697784f;
  p = p * u - 0.026778275950877478f;
  p = p * u + 0.11282122121956067f;
  p = p * u - 0.37612521327867643f;
  p = p * u + 1.1283791534670549f;
  const float small = x * p;
  const float s = (a < 4.0f ? a : 4.0f) - 0.9f;
  float q = -4.89707304e-07f;
  q = q * s - 1.8165958e-05f;
  q = q * s + 0.0002946163f;
  q = q * s - 0.00217536534f;
  q = q * s + 0.0110845016f;
  q = q * s - 0.0457836464f;
  q = q * s - 0.830016017f;
  q = q * s - 2.47163415f;
  q = q * s - 1.59409726f;
  const float erfc = tk_expf(q);
  const float mag = a < 4.0f ? 1.0f - erfc : 1.0f;
  return a < 0.9f ? small : (x < 0.0f ? -mag : (x != x ? x : mag));
}

// sigmoid: 1 / (1 + exp(-x)), from exp(-|x|) so that neither side overflows.
static __forceinline__ float tk_sigmoidf(float x) {
  const float e = tk_expf(x < 0.0f ? x : -x);
  return x < 0.0f ? e / (1.0f + e) : 1.0f / (1.0f + e);
}

// -- the register-tile GEMM micro-kernel ------------------------------------------------------
// c[MR][NR] (row stride ldc) = (accumulate ? c : 0) + a x b over kc steps, where `b` is a
// packed micro-panel of B (kc rows of NR values: b[k * NR + j]) and `a` one of A in one of two
// forms below. The MR x NR accumulators stay in vector registers (MR x NR / lanes of them: 12
// for 6 x 16 on AVX2, of 16 registers); each step broadcasts one value of A per row and
// multiply-adds it with NR / lanes vectors of B (the BLIS micro-kernel). The tile program
// packs the panels and runs the epilogue; this is its inner product, as mma.sync is on a
// GPU. A step's products are summed from zero and then added to c: a sum over K in blocks of
// kc, whose rounding error grows with kc + K / kc rather than with K. Both forms run at the
// core's FMA peak with their panels in L1 and L2.
//
// `tk_gemm_micro`: A packed, kc columns of MR values (a[k * MR + i]).
// `tk_gemm_micro_rows`: A read where it lies, row i of the tile at `a + i * lda` (kc
// contiguous values), rows from `rows` on repeating the last one (their sums land in rows of
// c that are never stored). A matrix whose K axis is contiguous (a matmul's left side) needs
// no packing then: the tile reads MR rows at once, each a stream the hardware prefetcher
// follows; only B, whose NR columns must be contiguous per step, is packed (MLAS's SGEMM reads
// A so too). A weight as A (a convolution's filters) is read from panels packed once instead.
//
// These are functions of their own (`noinline`), never inlined into the kernel's loops: there
// the epilogue's live values would crowd the 16 vector registers, and GCC spilled an
// accumulator to the stack, a store and a load on every step of K (the MobileNet block's
// 1 x 1 expansion 1.7x slower). A call per micro-tile costs a few cycles of its hundreds.
//
// `tk_gemm_micro_ahead` and `tk_gemm_micro_rows_ahead` also prefetch, on each step k of K,
// the line at `ahead + k * STEP`: a weight's packed panels (runtime_cpu.h tk_packed_panels)
// the next micro-tile or the next column of them reads. A weight comes from memory once per
// run (ResNet-50's 100 MB of filters, GPT-2's 28 MB a layer), each micro-panel a run of a
// few pages, and the hardware prefetcher starts on a page only after its first misses:
// ResNet-50's 3 x 3 layers on 7 x 7 pixels 0.75x, its kernels 0.90x; the GPT block's GEMMs
// 0.90x (one core of an AVX-512 Xeon). A prefetch takes a load slot the micro-kernel has
// spare (a broadcast of A and NR / lanes loads of B per MR x NR / lanes FMAs).
// A register tile's accumulators cleared, and stored into (or, `accumulate`, added to) the
// output tile at `c` (rows `ldc` apart).
template <int MR, int NV>
static __forceinline__ void tk_tile_clear(tk_f32v (&acc)[MR][NV]) {
#pragma GCC unroll 32
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j)
      acc[i][j] = tk_f32v{};
}

// One step k of K: the tile += A's column k (MR values, `a_at(k, i)` the address of row i's)
// times B's row (`bv`, the first NV vectors).
template <int MR, int NV, class AAt>
static __forceinline__ void tk_tile_fma(tk_f32v (&acc)[MR][NV], const tk_f32v* bv,
                                        const AAt& a_at, int k) {
#pragma GCC unroll 32
  for (int i = 0; i < MR; ++i) {
    const tk_f32v av = tk_f32v_splat(a_at(k, i));
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) acc[i][j] += av * bv[j];
  }
}

template <int MR, int NV>
static __forceinline__ void tk_tile_store(const tk_f32v (&acc)[MR][NV], float* __restrict__ c,
                                          int ldc, int accumulate) {
#pragma GCC unroll 32
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) {
      float* at = c + i * ldc + j * TK_F32_LANES;
      tk_f32v_store(at, accumulate ? tk_f32v_load(at) + acc[i][j] : acc[i][j]);
    }
}

template <int MR, int NR, int STEP, class AAt, class BRow>
static inline void tk_gemm_tile(AAt a_at, BRow b_row, int kc, float* __restrict__ c, int ldc,
                                int accumulate, const float* ahead) {
  static_assert(NR % TK_F32_LANES == 0, "NR must be a whole number of vectors");
  constexpr int NV = NR / TK_F32_LANES;
  tk_f32v acc[MR][NV];
  tk_tile_clear<MR, NV>(acc);
#pragma GCC unroll 4
  for (int k = 0; k < kc; ++k) {
    tk_f32v bv[NV];
    b_row(k, bv);
    if constexpr (STEP > 0) __builtin_prefetch(ahead + k * STEP);
    tk_tile_fma<MR, NV>(acc, bv, a_at, k);
  }
  tk_tile_store<MR, NV>(acc, c, ldc, accumulate);
}

// B's row k from a packed panel (rows LDB apart): its first NV vectors.
template <int NV, int LDB>
static __forceinline__ auto tk_panel_rows(const float* __restrict__ b) {
  return [b](int k, tk_f32v* bv) __attribute__((always_inline)) {
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) bv[j] = tk_f32v_load(b + k * LDB + j * TK_F32_LANES);
  };
}

// `LDB`: B's row stride, NR unless the tile covers the first NR columns of a wider panel (the
// last micro-panel of a ragged N, half of whose columns are past N: 196 pixels are 6 panels
// of 32 and 4 columns, computed as 16 rather than 32). Where NR is not a whole number of
// this machine's vectors (code rolled for narrower ones), the tile computes all LDB columns.
template <int NR, int LDB>
constexpr int tk_tile_width() { return NR % TK_F32_LANES == 0 ? NR : LDB; }

// The tile on B's rows from `b_row` (tk_panel_rows, tk_fill_rows) with A packed
// (`tk_gemm_packed_a`: MR values a step) or read where it lies (`tk_gemm_rows_a`: MR row
// pointers, rows from `rows` on repeating the last one; the lambda takes the pointers by
// reference: a copy of them, by value, ran MLP-Mixer's 196 x 512 x 2048 GEMM 1.06x as long).
template <int MR, int W, int STEP, class BRow>
static inline void tk_gemm_packed_a(const float* __restrict__ a, BRow b_row, int kc,
                                    float* __restrict__ c, int ldc, int accumulate,
                                    const float* ahead) {
  tk_gemm_tile<MR, W, STEP>([a](int k, int i) { return a + k * MR + i; }, b_row, kc, c, ldc,
                            accumulate, ahead);
}

template <int MR, int W, int STEP, class BRow>
static inline void tk_gemm_rows_a(const float* __restrict__ a, long lda, int rows, BRow b_row,
                                  int kc, float* __restrict__ c, int ldc, int accumulate,
                                  const float* ahead) {
  const float* row[MR];
#pragma GCC unroll 32
  for (int i = 0; i < MR; ++i) row[i] = a + (i < rows ? i : rows - 1) * lda;
  tk_gemm_tile<MR, W, STEP>([&row](int k, int i) { return row[i] + k; }, b_row, kc, c, ldc,
                            accumulate, ahead);
}

template <int MR, int NR, int LDB = NR>
static __attribute__((noinline)) void tk_gemm_micro(const float* __restrict__ a,
                                                     const float* __restrict__ b, int kc,
                                                     float* __restrict__ c, int ldc,
                                                     int accumulate) {
  constexpr int W = tk_tile_width<NR, LDB>();
  tk_gemm_packed_a<MR, W, 0>(a, tk_panel_rows<W / TK_F32_LANES, LDB>(b), kc, c, ldc,
                             accumulate, nullptr);
}

template <int MR, int NR, int LDB, int STEP>
static __attribute__((noinline)) void tk_gemm_micro_ahead(const float* __restrict__ a,
                                                           const float* __restrict__ b, int kc,
                                                           float* __restrict__ c, int ldc,
                                                           int accumulate, const float* ahead) {
  constexpr int W = tk_tile_width<NR, LDB>();
  tk_gemm_packed_a<MR, W, STEP>(a, tk_panel_rows<W / TK_F32_LANES, LDB>(b), kc, c, ldc,
                                accumulate, ahead);
}

template <int MR, int NR, int LDB = NR>
static __attribute__((noinline)) void tk_gemm_micro_rows(const float* __restrict__ a, long lda,
                                                          int rows, const float* __restrict__ b,
                                                          int kc, float* __restrict__ c, int ldc,
                                                          int accumulate) {
  constexpr int W = tk_tile_width<NR, LDB>();
  tk_gemm_rows_a<MR, W, 0>(a, lda, rows, tk_panel_rows<W / TK_F32_LANES, LDB>(b), kc, c, ldc,
                           accumulate, nullptr);
}

template <int MR, int NR, int LDB, int STEP>
static __attribute__((noinline)) void tk_gemm_micro_rows_ahead(
    const float* __restrict__ a, long lda, int rows, const float* __restrict__ b, int kc,
    float* __restrict__ c, int ldc, int accumulate, const float* ahead) {
  constexpr int W = tk_tile_width<NR, LDB>();
  tk_gemm_rows_a<MR, W, STEP>(a, lda, rows, tk_panel_rows<W / TK_F32_LANES, LDB>(b), kc, c,
                              ldc, accumulate, ahead);
}

// -- a ragged last micro-panel ----------------------------------------------------------------
// `tk_gemm_micro_ragged`: the tile of a micro-panel only `cols` (< NR) of whose columns are in
// N, A packed (`tk_gemm_micro`'s a[k * MR + i]: a packed panel or a weight's). The whole
// vectors of those columns run as the register tile does; the rest, fewer than a vector's
// lanes, by `tk_gemm_cols`, whose accumulators run along M: one vector of the MR rows per
// column, so that a column costs one FMA a step where the register tile spends MR FMAs on a
// vector of columns mostly past N (a 7 x 7 image's 49 pixels: 48 in three vectors and 1, for
// which a 16-lane tile did 16 columns' work). Where MR is not a power of two (AVX2's 6-row
// tiles, AVX-512's 14) a column is a vector of the next power of two lanes loaded under a
// mask (`tk_rows_load`), the lanes past MR zero; where no masked load of that width exists,
// the rest runs as a tile of NR / 2 or NR columns, as before the split (a vector loaded
// through memcpy ran 4-7x slower than that tile).

// A vector of N floats (a struct member: GCC drops a vector_size that depends on a template
// argument from a typedef or alias in the template's body).
template <int N>
struct tk_floats {
  typedef float type __attribute__((vector_size(N * 4)));
};

constexpr int tk_pow2_at_least(int n) { return n <= 1 ? 1 : 2 * tk_pow2_at_least((n + 1) / 2); }

// Can `tk_rows_load` load MR floats as a vector (a whole vector, or a masked load)?
template <int MR>
constexpr bool tk_rows_loadable() {
  constexpr int V = tk_pow2_at_least(MR);
  if (V == MR) return MR >= 4;
#if defined(__AVX512F__)
  if (V == 16) return true;
#endif
#if defined(__AVX__)
  if (V == 8) return true;
#endif
  return false;
}

// MR floats from `p` as a vector of the next power of two lanes, the rest zero (never read).
template <int MR>
static __forceinline__ typename tk_floats<tk_pow2_at_least(MR)>::type tk_rows_load(
    const float* p) {
  constexpr int V = tk_pow2_at_least(MR);
  typedef typename tk_floats<V>::type rows_v;
  if constexpr (V == MR) {
    rows_v v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
#if defined(__AVX512F__)
  else if constexpr (V == 16) {
    return (rows_v)_mm512_maskz_loadu_ps((__mmask16)((1u << MR) - 1), p);
  }
#endif
#if defined(__AVX__)
  else if constexpr (V == 8) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return (rows_v)_mm256_maskload_ps(p, _mm256_cmpgt_epi32(_mm256_set1_epi32(MR), lane));
  }
#endif
  else {
    static_assert(tk_rows_loadable<MR>(), "no load of MR rows: tk_gemm_cols is not used");
    return rows_v{};
  }
}

template <int MR, int R, int LDB, int STEP>
static inline void tk_gemm_cols(const float* __restrict__ a, const float* __restrict__ b,
                                int kc, float* __restrict__ c, int ldc, int accumulate,
                                const float* ahead) {
  typedef typename tk_floats<tk_pow2_at_least(MR)>::type rows_v;
  // a column's sums are one dependent chain: fewer than 4 columns take several chains over
  // alternate steps of K, added at the end
  constexpr int P = R >= 4 ? 1 : R >= 2 ? 2 : 4;
  rows_v acc[P][R];
#pragma GCC unroll 4
  for (int p = 0; p < P; ++p)
#pragma GCC unroll 16
    for (int j = 0; j < R; ++j) acc[p][j] = rows_v{};
  int k = 0;
  for (; k + P <= kc; k += P) {
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) {
      const rows_v av = tk_rows_load<MR>(a + (k + p) * MR);
      if constexpr (STEP > 0) __builtin_prefetch(ahead + (k + p) * STEP);
#pragma GCC unroll 16
      for (int j = 0; j < R; ++j) acc[p][j] += av * b[(k + p) * LDB + j];
    }
  }
  for (; k < kc; ++k) {
    const rows_v av = tk_rows_load<MR>(a + k * MR);
#pragma GCC unroll 16
    for (int j = 0; j < R; ++j) acc[0][j] += av * b[k * LDB + j];
  }
#pragma GCC unroll 16
  for (int j = 0; j < R; ++j) {
    rows_v sum = acc[0][j];
    if constexpr (P == 2) sum += acc[1][j];
    if constexpr (P == 4) sum = (sum + acc[1][j]) + (acc[2][j] + acc[3][j]);
#pragma GCC unroll 32
    for (int i = 0; i < MR; ++i) {
      float* at = c + i * ldc + j;
      *at = accumulate ? *at + sum[i] : sum[i];
    }
  }
}

// `tk_gemm_cols` for a run-time count of columns, 1 <= r <= R.
template <int MR, int LDB, int STEP, int R>
static inline void tk_gemm_cols_upto(int r, const float* __restrict__ a,
                                     const float* __restrict__ b, int kc, float* __restrict__ c,
                                     int ldc, int accumulate, const float* ahead) {
  if constexpr (R > 0) {
    if (r == R) {
      tk_gemm_cols<MR, R, LDB, STEP>(a, b, kc, c, ldc, accumulate, ahead);
      return;
    }
    tk_gemm_cols_upto<MR, LDB, STEP, R - 1>(r, a, b, kc, c, ldc, accumulate, ahead);
  }
}

// The register tile on the first q vectors of columns, 1 <= q <= Q.
template <int MR, int LDB, int STEP, int Q>
static inline void tk_gemm_vectors_upto(int q, const float* __restrict__ a,
                                        const float* __restrict__ b, int kc,
                                        float* __restrict__ c, int ldc, int accumulate,
                                        const float* ahead) {
  if constexpr (Q > 0) {
    if (q == Q) {
      tk_gemm_micro_ahead<MR, Q * TK_F32_LANES, LDB, STEP>(a, b, kc, c, ldc, accumulate, ahead);
      return;
    }
    tk_gemm_vectors_upto<MR, LDB, STEP, Q - 1>(q, a, b, kc, c, ldc, accumulate, ahead);
  }
}

template <int MR, int NR, int STEP>
static __attribute__((noinline)) void tk_gemm_micro_ragged(const float* __restrict__ a,
                                                            const float* __restrict__ b, int kc,
                                                            float* __restrict__ c, int ldc,
                                                            int accumulate, int cols,
                                                            const float* ahead) {
  if constexpr (tk_rows_loadable<MR>()) {
    int q = cols / TK_F32_LANES, r = cols - q * TK_F32_LANES;
    // r columns take r FMAs and r loads of B a step, a whole vector of them MR of each: with
    // columns narrower than the machine's vectors (8 rows, 16 lanes) from about 1.5 MR
    // columns on a whole vector is as fast, with columns as wide from about 0.6 MR (one Zen 4
    // core: 8-row tiles 12 columns 0.90x the padded tile's time, 13 0.94x, 14 1.01x; 14-row
    // tiles 8 columns 0.64x, 9 1.24x; 6-row tiles of 8 lanes (AVX2) 3 columns 0.58x, 4 1.01x)
    constexpr bool narrow = tk_pow2_at_least(MR) < TK_F32_LANES;
    if ((narrow ? 2 * r >= 3 * MR : 5 * r >= 3 * MR) && (q + 1) * TK_F32_LANES <= NR)
      ++q, r = 0;
    tk_gemm_vectors_upto<MR, NR, STEP, NR / TK_F32_LANES>(q, a, b, kc, c, ldc, accumulate,
                                                          ahead);
    tk_gemm_cols_upto<MR, NR, STEP, TK_F32_LANES - 1>(
        r, a, b + q * TK_F32_LANES, kc, c + q * TK_F32_LANES, ldc, accumulate, ahead);
  } else {
    constexpr int HALF = NR % 8 == 0 ? NR / 2 : NR;
    if (cols <= HALF)
      tk_gemm_micro_ahead<MR, HALF, NR, STEP>(a, b, kc, c, ldc, accumulate, ahead);
    else
      tk_gemm_micro_ahead<MR, NR, NR, STEP>(a, b, kc, c, ldc, accumulate, ahead);
  }
}

// -- packing --------------------------------------------------------------------------------
// dst[i] = ok[i] ? src[i] : pad for i < W: a packed panel's row of W values that lie
// contiguously in the operand, `ok` the lanes inside it (a convolution's padding, the edge of
// the GEMM). Masked vector loads (AVX-512's under a mask register, filling the padding in
// the same instruction; AVX's vmaskmovps and a blend): the masked-off lanes are never read,
// so `src` may point before or past the tensor there; contiguous loads, where a gather (or
// GCC's scalar code for `ok ? src[i] : pad`) would take a load per value. With AVX-512's,
// ResNet-50's 3 x 3 layers on 56 x 56 took 0.96x as long as with vmaskmovps on one Xeon core
// (their panels are packed from L2), the network's kernels the same within noise (a pack
// from memory, the MobileNet block's 1 x 1 projection, waits on memory either way). `ahead`
// is where a later row will be read (a few steps of K on): prefetched, since consecutive
// rows of a panel are a K stride apart and the hardware prefetcher does not follow such
// short rows (30% less time from memory, measured on Zen 3). A prefetch never faults,
// wherever it points.
#if defined(__AVX512F__)
// dst[h .. h + 16) = load(h, mask, fill) for each 16 of W lanes, the mask the lanes of ok
// that are not 0, fill the pad in every lane: a packed row's vectors loaded under masks.
template <int W, class Load>
static inline void tk_masked_row16(float* __restrict__ dst, const int* __restrict__ ok,
                                   float pad, Load load) {
  const __m512 fill = _mm512_set1_ps(pad);
#pragma GCC unroll 8
  for (int h = 0; h < W; h += 16) {
    const __mmask16 m = _mm512_cmpneq_epi32_mask(
        _mm512_loadu_si512(reinterpret_cast<const void*>(ok + h)), _mm512_setzero_si512());
    _mm512_storeu_ps(dst + h, load(h, m, fill));
  }
}
#endif

template <int W>
static inline void tk_pack_row(float* __restrict__ dst, const float* src,
                               const int* __restrict__ ok, float pad, const float* ahead) {
  __builtin_prefetch(ahead);
  __builtin_prefetch(ahead + W - 1);
#if defined(__AVX512F__)
  if constexpr (W % 16 == 0) {
    tk_masked_row16<W>(dst, ok, pad, [src](int h, __mmask16 m, __m512 fill) {
      return _mm512_mask_loadu_ps(fill, m, src + h);
    });
    return;
  }
#endif
#if defined(__AVX__)
  static_assert(W % 8 == 0, "W must be a whole number of 8-lane vectors");
  const __m256 fill = _mm256_set1_ps(pad);
#pragma GCC unroll 8
  for (int h = 0; h < W; h += 8) {
    const __m256i m = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ok + h));
    const __m256 v = _mm256_maskload_ps(src + h, m);
    _mm256_storeu_ps(dst + h, _mm256_blendv_ps(fill, v, _mm256_castsi256_ps(m)));
  }
#else
  for (int i = 0; i < W; ++i) dst[i] = ok[i] ? src[i] : pad;
#endif
}

#if defined(__AVX512F__)
// Lanes i of src[off[i]] under the mask m, `fill` elsewhere (lanes off the mask never read).
// Offsets two apart (a stride-2 window's row, the common case of a gathered panel row) are
// two masked loads of the 32 values they span and a permute of the even ones, BMI2's pdep
// spreading the mask to every second value; any other offsets, a hardware gather, which loads
// lane by lane. On a Zen 4 core the loads made ResNet-50's first convolution (7 x 7, stride 2:
// every panel row gathered) 0.83x as long as with the gathers (one core, 3.08 -> 2.55 ms).
static __forceinline__ __m512 tk_gather16(const float* src, const int* __restrict__ off,
                                          __mmask16 m, __m512 fill) {
  const __m512i at = _mm512_loadu_si512(reinterpret_cast<const void*>(off));
#if defined(__BMI2__)
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26,
                                         28, 30);
  if (_mm512_cmpeq_epi32_mask(at, _mm512_add_epi32(_mm512_set1_epi32(off[0]), even)) ==
      0xffff) {
    const unsigned wide = _pdep_u32((unsigned)m, 0x55555555u);
    const __m512 lo = _mm512_maskz_loadu_ps((__mmask16)wide, src + off[0]);
    const __m512 hi = _mm512_maskz_loadu_ps((__mmask16)(wide >> 16), src + off[0] + 16);
    return _mm512_mask_blend_ps(m, fill, _mm512_permutex2var_ps(lo, even, hi));
  }
#endif
  return _mm512_mask_i32gather_ps(fill, m, at, src, 4);
}
#endif

// dst[i] = ok[i] ? src[off[i]] : pad for i < W: a packed panel's row whose values lie apart
// in the operand (a strided convolution's window: every second pixel of an image row, and
// the next image row where the panel crosses one). Hardware gathers under the mask of `ok`
// (lanes off the mask are never read). GCC does not emit gathers for such a loop when it tunes
// for a generic x86-64 (-march=native keeps -mtune=generic); it extracted each offset and
// loaded each value alone, and packing took as long as the micro-kernels on the strided
// layers: ResNet-50's first convolution (7 x 7, stride 2) 3.36 -> 2.10 ms on one core of an
// AVX-512 Xeon. Offsets are 32-bit: the caller uses this only with int32 indices.
template <int W>
static inline void tk_gather_row(float* __restrict__ dst, const float* src,
                                 const int* __restrict__ off, const int* __restrict__ ok,
                                 float pad) {
#if defined(__AVX512F__)
  if constexpr (W % 16 == 0) {
    tk_masked_row16<W>(dst, ok, pad, [src, off](int h, __mmask16 m, __m512 fill) {
      return tk_gather16(src, off + h, m, fill);
    });
    return;
  }
#endif
#if defined(__AVX2__)
  if constexpr (W % 8 == 0) {
    const __m256 fill = _mm256_set1_ps(pad);
#pragma GCC unroll 8
    for (int h = 0; h < W; h += 8) {
      const __m256i m = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ok + h));
      const __m256i at = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(off + h));
      _mm256_storeu_ps(dst + h, _mm256_mask_i32gather_ps(fill, src, at,
                                                          _mm256_castsi256_ps(m), 4));
    }
    return;
  }
#endif
  for (int i = 0; i < W; ++i) dst[i] = ok[i] ? src[off[i]] : pad;
}

// -- B packed by the micro-kernel that first reads it ----------------------------------------
// A B panel packed before the micro-kernels run (tk_pack_row, tk_gather_row over the whole
// panel) reads its operand, a layer's activations, from L2 or L3 while no FMA runs: in
// ResNet-50's 1 x 1 layers on 56 x 56 that took a fifth of the kernel (the packing reads at
// L3's bandwidth, and nothing overlaps it; onnxruntime's NCHWc kernels read their input as
// they compute). So the first micro-tile of each micro-panel packs it as it goes: on each
// step k it loads row k of the panel from the operand (its lanes under the mask bits[k],
// contiguous from src + rows[k], or gathered from src + rows[k] + lanes[i]), stores it into
// the panel for the micro-tiles after it, and multiplies it at once; the row TK_FILL_AHEAD steps
// on is prefetched. The operand's loads then wait while the FMAs of the steps before run (the
// MobileNet block's 1 x 1 projection 0.86x, ResNet-50's 64 x 3136 x 256 layers 0.88x, one core).

// Steps of K ahead whose operand rows a filling micro-kernel prefetches.
constexpr int TK_FILL_AHEAD = 8;

// The lanes of `ok` (W ints, W <= 64) that are not 0, as bits (lane i: bit i). By AVX2's
// vmovmskps, which writes an integer register, and not from an AVX-512 mask: GCC 12 spilled
// such a 16-bit mask with kmovw and reloaded it as 64 bits (movq), so the bits above the
// mask's were whatever the stack held (ResNet-50's 1 x 1 layers on 7 x 7 read zeros for
// half their columns in one block of two).
template <int W>
static __forceinline__ long long tk_lane_bits(const int* __restrict__ ok) {
  static_assert(W <= 64, "at most 64 lanes");
  unsigned long long bits = 0;
#if defined(__AVX2__)
  if constexpr (W % 8 == 0) {
#pragma GCC unroll 8
    for (int h = 0; h < W; h += 8) {
      const __m256i zero = _mm256_cmpeq_epi32(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ok + h)), _mm256_setzero_si256());
      const unsigned inside = ~static_cast<unsigned>(
          _mm256_movemask_ps(_mm256_castsi256_ps(zero))) & 0xFFu;
      bits |= static_cast<unsigned long long>(inside) << h;
    }
    return static_cast<long long>(bits);
  }
#endif
  for (int i = 0; i < W; ++i) bits |= static_cast<unsigned long long>(ok[i] != 0) << i;
  return static_cast<long long>(bits);
}

// One vector of a panel row: lane i = bit i of bits ? src[GATHER ? lanes[i] : i] : pad
// (lanes off the mask never read).
template <int GATHER>
static __forceinline__ tk_f32v tk_fill_vec(const float* src, const int* __restrict__ lanes,
                                           unsigned bits, float pad) {
#if defined(__AVX512F__)
  const __m512 fill = _mm512_set1_ps(pad);
  const __mmask16 m = (__mmask16)bits;
  if constexpr (GATHER)
    return (tk_f32v)tk_gather16(src, lanes, m, fill);
  else
    return (tk_f32v)_mm512_mask_loadu_ps(fill, m, src);
#elif defined(__AVX2__)
  const __m256 fill = _mm256_set1_ps(pad);
  const __m256i sel = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const __m256i m = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32((int)bits), sel),
                                       sel);
  if constexpr (GATHER)
    return (tk_f32v)_mm256_mask_i32gather_ps(
        fill, src, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(lanes)),
        _mm256_castsi256_ps(m), 4);
  else
    return (tk_f32v)_mm256_blendv_ps(fill, _mm256_maskload_ps(src, m), _mm256_castsi256_ps(m));
#else
  float v[TK_F32_LANES];
  for (int i = 0; i < TK_F32_LANES; ++i) v[i] = (bits >> i) & 1 ? src[GATHER ? lanes[i] : i] : pad;
  return tk_f32v_load(v);
#endif
}

// B's row k read from the operand as the micro-kernel computes: its LDB columns (lanes of
// bits[k] from src + rows[k], the pad elsewhere) stored into the panel at `b`, its first NV
// vectors multiplied at once; the row TK_FILL_AHEAD steps on prefetched.
template <int NV, int LDB, int GATHER>
static __forceinline__ auto tk_fill_rows(const float* src, const int* __restrict__ rows,
                                         const long long* __restrict__ bits,
                                         const int* __restrict__ lanes, float pad,
                                         float* __restrict__ b, int kc) {
  return [=](int k, tk_f32v* bv) __attribute__((always_inline)) {
    const float* later = src + rows[k + TK_FILL_AHEAD < kc ? k + TK_FILL_AHEAD : kc - 1];
    __builtin_prefetch(GATHER ? later + lanes[0] : later);
    __builtin_prefetch(GATHER ? later + lanes[LDB - 1] : later + LDB - 1);
    const unsigned long long row_bits = (unsigned long long)bits[k];
#pragma GCC unroll 8
    for (int j = 0; j < LDB / TK_F32_LANES; ++j) {
      const tk_f32v v = tk_fill_vec<GATHER>(src + rows[k] + (GATHER ? 0 : j * TK_F32_LANES),
                                            lanes + j * TK_F32_LANES,
                                            (unsigned)(row_bits >> (j * TK_F32_LANES)), pad);
      tk_f32v_store(b + k * LDB + j * TK_F32_LANES, v);
      if (j < NV) bv[j] = v;
    }
  };
}

// tk_gemm_micro_ahead and tk_gemm_micro_rows_ahead (STEP 0: no prefetch of `ahead`), filling
// their B panel: `b` is where the panel's rows go.
template <int MR, int NR, int LDB, int STEP, int GATHER>
static __attribute__((noinline)) void tk_gemm_micro_fill(
    const float* __restrict__ a, const float* src, const int* __restrict__ rows,
    const long long* __restrict__ bits, const int* __restrict__ lanes, float pad,
    float* __restrict__ b, int kc, float* __restrict__ c, int ldc, int accumulate,
    const float* ahead) {
  constexpr int W = tk_tile_width<NR, LDB>();
  tk_gemm_packed_a<MR, W, STEP>(
      a, tk_fill_rows<W / TK_F32_LANES, LDB, GATHER>(src, rows, bits, lanes, pad, b, kc), kc,
      c, ldc, accumulate, ahead);
}

template <int MR, int NR, int LDB, int STEP, int GATHER>
static __attribute__((noinline)) void tk_gemm_micro_rows_fill(
    const float* __restrict__ a, long lda, int arows, const float* src,
    const int* __restrict__ rows, const long long* __restrict__ bits,
    const int* __restrict__ lanes, float pad, float* __restrict__ b, int kc,
    float* __restrict__ c, int ldc, int accumulate, const float* ahead) {
  constexpr int W = tk_tile_width<NR, LDB>();
  tk_gemm_rows_a<MR, W, STEP>(
      a, lda, arows,
      tk_fill_rows<W / TK_F32_LANES, LDB, GATHER>(src, rows, bits, lanes, pad, b, kc), kc, c,
      ldc, accumulate, ahead);
}

// -- weights packed once --------------------------------------------------------------------
// A GEMM one of whose operands is a model's weight (a linear layer's matrix as B, a
// convolution's filters as A) would pack or stream the same values in the same order on every
// run. `tk_packed_panels` packs the whole weight once into micro-panels of W rows or columns
// (data[(p * k + kk) * W + j] = src[(p * W + j) * ldn + kk * ldk], 0 for p * W + j >= n) and
// returns micro-panel `panel` from step `k0` on: a run only reads packed panels. As B, the
// panels are what the micro-kernel's B rows read; as A, what `tk_gemm_micro` reads
// (a[k * MR + i]): one run of addresses per micro-tile, where read in place its MR rows were
// MR short streams a K stride apart, which the hardware prefetcher follows late when the
// weight comes from memory (ResNet-50's filters, 100 MB, are read once per run). The packs
// are the library's own, one per (src, n, k, ldn, ldk, W), valid while the weights'
// generation stands: whoever changes a weight's values in place (tk-run's compiled runtime
// binding weights) calls `tk_weights_changed` (cxx.RUNTIME_TAIL), and the next lookup
// re-packs. The table is searched and a pack made under one lock, so a pack is made once and
// whole before any thread reads it; a block looks its pack up once and keeps the address in
// `slot` (a local of the block, 0 at its start), so the micro-kernel's calls cost an add (a
// lookup per call took 20 ns, 4% of a 6 x 16 tile's time over 256 steps).
struct tk_packed_key {
  const float* src;
  long n, k, ldn, ldk;
  int w;
  bool operator==(const tk_packed_key& o) const {
    return src == o.src && n == o.n && k == o.k && ldn == o.ldn && ldk == o.ldk && w == o.w;
  }
};

struct tk_packed_entry {
  tk_packed_key key;
  unsigned generation;
  float* data;
};

// The library's own (internal linkage: never shared with another loaded library); packs
// live as long as the library.
static std::atomic<unsigned> tk_weights_generation{1};
static std::mutex tk_packed_lock;
static std::vector<tk_packed_entry> tk_packed_table;

static inline const float* tk_packed_find(const tk_packed_key& key) {
  const unsigned generation = tk_weights_generation.load(std::memory_order_acquire);
  std::lock_guard<std::mutex> hold(tk_packed_lock);
  tk_packed_entry* e = nullptr;
  for (tk_packed_entry& x : tk_packed_table)
    if (x.key == key) e = &x;
  const long panels = (key.n + key.w - 1) / key.w;
  if (e == nullptr) {
    float* data = static_cast<float*>(
        std::aligned_alloc(64, ((panels * key.k * key.w * 4 + 63) / 64) * 64));
    tk_packed_table.push_back({key, 0, data});
    e = &tk_packed_table.back();
  }
  if (e->generation != generation) {
    for (long p = 0; p < panels; ++p)
      for (long kk = 0; kk < key.k; ++kk) {
        float* dst = e->data + (p * key.k + kk) * key.w;
        for (int j = 0; j < key.w; ++j) {
          const long col = p * key.w + j;
          dst[j] = col < key.n ? key.src[col * key.ldn + kk * key.ldk] : 0.0f;
        }
      }
    e->generation = generation;
  }
  return e->data;
}

template <int W>
static inline const float* tk_packed_panels(long long* slot, const float* src, long n, long k,
                                            long ldn, long ldk, long panel, long k0) {
  if (*slot == 0)
    *slot = static_cast<long long>(reinterpret_cast<uintptr_t>(
        tk_packed_find(tk_packed_key{src, n, k, ldn, ldk, W})));
  return reinterpret_cast<const float*>(static_cast<uintptr_t>(*slot)) + (panel * k + k0) * W;
}

static inline void tk_packed_weights_changed() {
  tk_weights_generation.fetch_add(1, std::memory_order_acq_rel);
}
