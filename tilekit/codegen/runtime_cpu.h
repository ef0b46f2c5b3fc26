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

#include <cstdlib>
#include <cstring>
#if defined(__AVX__)
#include <immintrin.h>
#elif defined(__ARM_NEON)
#include <arm_neon.h>
#endif

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

static inline tk_f32v tk_f32v_load(const float* p) {
  tk_f32v v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

static inline void tk_f32v_store(float* p, tk_f32v v) { std::memcpy(p, &v, sizeof v); }

// Every lane *p: one broadcast load (vbroadcastss, ld1r). Written with the ISA's intrinsic
// where there is one: GCC spells a generic splat as two half-width broadcasts.
static inline tk_f32v tk_f32v_splat(const float* p) {
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

// -- the register-tile GEMM micro-kernel ------------------------------------------------------
// c[MR][NR] (row stride ldc) = (accumulate ? c : 0) + a x b over kc steps, where `a` is a
// packed micro-panel of A (kc columns of MR values: a[k * MR + i]) and `b` one of B (kc rows
// of NR values: b[k * NR + j]). The MR x NR accumulators stay in vector registers (MR x NR /
// lanes of them: 12 for 6 x 16 on AVX2, of 16 registers); each step broadcasts one value of
// A per row and multiply-adds it with NR / lanes vectors of B (the BLIS micro-kernel). The
// tile program packs the panels and runs the epilogue; this is its inner product, as mma.sync
// is on a GPU. A step's products are summed from zero and then added to c: a sum over K in
// blocks of kc, whose rounding error grows with kc + K / kc rather than with K.
template <int MR, int NR>
static inline void tk_gemm_micro(const float* __restrict__ a, const float* __restrict__ b,
                                 int kc, float* __restrict__ c, int ldc, int accumulate) {
  static_assert(NR % TK_F32_LANES == 0, "NR must be a whole number of vectors");
  constexpr int NV = NR / TK_F32_LANES;
  tk_f32v acc[MR][NV];
#pragma GCC unroll 32
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j)
      acc[i][j] = tk_f32v{};
#pragma GCC unroll 4
  for (int k = 0; k < kc; ++k) {
    tk_f32v bv[NV];
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) bv[j] = tk_f32v_load(b + k * NR + j * TK_F32_LANES);
#pragma GCC unroll 32
    for (int i = 0; i < MR; ++i) {
      const tk_f32v av = tk_f32v_splat(a + k * MR + i);
#pragma GCC unroll 8
      for (int j = 0; j < NV; ++j) acc[i][j] += av * bv[j];
    }
  }
#pragma GCC unroll 32
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) {
      float* at = c + i * ldc + j * TK_F32_LANES;
      tk_f32v_store(at, accumulate ? tk_f32v_load(at) + acc[i][j] : acc[i][j]);
    }
}
