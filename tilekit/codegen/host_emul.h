// CPU emulation of a CUDA launch, for testing generated kernels without a GPU.
//
// Force-included (g++ -include host_emul.h) before a translation unit of generated kernels:
// CUDA qualifiers become plain C++, `__shared__` variables become function statics (one block
// runs at a time, so a static is exactly that block's shared memory), and every thread of a
// block is a fiber (ucontext) on one OS thread. `__syncthreads()` is a real barrier: the
// scheduler runs every fiber of the block up to its next barrier before any fiber passes it,
// and it aborts when some threads reach a barrier that others never reach (divergent
// barriers, undefined behaviour on the GPU that the hardware does not report).
// `__shfl_xor_sync` exchanges through a per-block array between two barriers (valid because
// generated code calls shuffles from block-uniform loops). Threads do not run in lock-step
// warps here, which is stricter than the hardware: code that relied on implicit warp
// synchrony would fail.
#pragma once

#include <ucontext.h>

#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

using std::isinf;
using std::isnan;

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
};
inline dim3 threadIdx, blockIdx, blockDim, gridDim;

#define TK_HOST_EMUL 1
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))

#ifndef TK_EMUL_DYNAMIC_SMEM
#define TK_EMUL_DYNAMIC_SMEM 16
#endif
#define TK_DYNAMIC_SMEM(name) alignas(16) static unsigned char name[TK_EMUL_DYNAMIC_SMEM]

inline float __int_as_float(int i) {
  float f;
  std::memcpy(&f, &i, sizeof f);
  return f;
}
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }

struct alignas(16) float4 {
  float x, y, z, w;
};
inline float4 make_float4(float a, float b, float c, float d) { return float4{a, b, c, d}; }

namespace tk_emul {
constexpr size_t kStack = 256 * 1024;
struct Fiber {
  ucontext_t ctx;
  std::vector<char> stack;
  bool done = false;
};
inline ucontext_t scheduler;
inline std::vector<Fiber> fibers;
inline unsigned current = 0;
inline void (*entry)(void*) = nullptr;
inline void* entry_arg = nullptr;
alignas(8) inline unsigned char exchange[1024][8];

inline void barrier() { swapcontext(&fibers[current].ctx, &scheduler); }

inline void trampoline() {
  entry(entry_arg);
  fibers[current].done = true;  // returning resumes the scheduler (uc_link)
}

// Run the blocks `ids[0..count)` of a grid of `grid` blocks of `block` threads, one block
// after another (`ids == nullptr`: every block).
template <typename F>
void launch(unsigned grid, unsigned block, F body, const unsigned* ids = nullptr,
            unsigned count = 0) {
  gridDim = dim3{grid, 1, 1};
  blockDim = dim3{block, 1, 1};
  fibers.resize(block);
  for (auto& f : fibers) f.stack.resize(kStack);
  entry = [](void* arg) { (*static_cast<F*>(arg))(); };
  entry_arg = &body;
  std::vector<unsigned> order(block);
  for (unsigned t = 0; t < block; ++t) order[t] = t;
  unsigned long long seed = 0x9e3779b97f4a7c15ULL;
  const unsigned nblocks = ids ? count : grid;
  for (unsigned n = 0; n < nblocks; ++n) {
    const unsigned b = ids ? ids[n] : n;
    blockIdx = dim3{b, 1, 1};
    for (unsigned t = 0; t < block; ++t) {
      Fiber& f = fibers[t];
      f.done = false;
      getcontext(&f.ctx);
      f.ctx.uc_stack.ss_sp = f.stack.data();
      f.ctx.uc_stack.ss_size = f.stack.size();
      f.ctx.uc_link = &scheduler;
      makecontext(&f.ctx, trampoline, 0);
    }
    // One round runs every live thread to its next barrier (or to its end), in a fresh
    // pseudo-random order each round (fixed seed: runs are reproducible), so that a missing
    // barrier is likely to let some thread read shared memory before its writer has run.
    for (;;) {
      unsigned finished = 0, waiting = 0;
      for (unsigned k = block; k > 1; --k) {
        seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
        std::swap(order[k - 1], order[(seed >> 33) % k]);
      }
      for (unsigned k = 0; k < block; ++k) {
        const unsigned t = order[k];
        if (fibers[t].done) continue;
        current = t;
        threadIdx = dim3{t, 1, 1};
        swapcontext(&scheduler, &fibers[t].ctx);
        if (fibers[t].done) ++finished; else ++waiting;
      }
      if (waiting == 0) break;
      if (finished != 0) {
        std::fprintf(stderr, "tk_emul: block %u: %u threads wait at a barrier that %u threads "
                     "never reach\n", b, waiting, finished);
        std::exit(4);
      }
    }
  }
}
}  // namespace tk_emul

inline void __syncthreads() { tk_emul::barrier(); }

template <typename T>
T __shfl_xor_sync(unsigned, T v, int lane_mask) {
  const unsigned t = threadIdx.x;
  std::memcpy(tk_emul::exchange[t], &v, sizeof(T));
  __syncthreads();
  T out;
  std::memcpy(&out, tk_emul::exchange[t ^ (unsigned)lane_mask], sizeof(T));
  __syncthreads();
  return out;
}

// -- half types (the bits, with IEEE round-to-nearest-even conversions) ----------------------
struct __half {
  unsigned short x;
};
struct __nv_bfloat16 {
  unsigned short x;
};

inline float __half2float(__half h) {
  unsigned sign = (unsigned)(h.x & 0x8000u) << 16, mant = h.x & 0x3ffu, bits;
  int exp = (h.x >> 10) & 0x1f;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 1;
      while (!(mant & 0x400u)) {
        mant <<= 1;
        --exp;
      }
      bits = sign | ((unsigned)(exp - 15 + 127) << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((unsigned)(exp - 15 + 127) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline __half __float2half_rn(float f) {
  unsigned x;
  std::memcpy(&x, &f, 4);
  const unsigned sign = (x >> 16) & 0x8000u;
  unsigned mant = x & 0x7fffffu;
  const int exp = (int)((x >> 23) & 0xffu);
  unsigned h;
  if (exp == 255) {
    h = sign | 0x7c00u | (mant ? 0x200u | (mant >> 13) : 0u);
  } else {
    const int e = exp - 127 + 15;
    if (e >= 31) {
      h = sign | 0x7c00u;
    } else if (e <= 0) {
      if (e < -10) {
        h = sign;
      } else {
        mant |= 0x800000u;
        const int shift = 14 - e;
        unsigned hm = mant >> shift;
        const unsigned rem = mant & ((1u << shift) - 1u), halfway = 1u << (shift - 1);
        if (rem > halfway || (rem == halfway && (hm & 1u))) ++hm;
        h = sign | hm;
      }
    } else {
      h = sign | ((unsigned)e << 10) | (mant >> 13);
      const unsigned rem = mant & 0x1fffu;
      if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // a carry rounds up the exponent
    }
  }
  __half r;
  r.x = (unsigned short)h;
  return r;
}

inline float __bfloat162float(__nv_bfloat16 b) {
  const unsigned bits = (unsigned)b.x << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  unsigned x;
  std::memcpy(&x, &f, 4);
  __nv_bfloat16 r;
  if ((x & 0x7f800000u) == 0x7f800000u && (x & 0x7fffffu)) {
    r.x = (unsigned short)((x >> 16) | 0x40u);  // a quiet NaN
  } else {
    r.x = (unsigned short)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
  }
  return r;
}

// -- tensor cores: the warp collectives of runtime.cuh, by their documented layouts ---------
// Each lane deposits what it holds, the block meets at a barrier (the generated loops are
// block-uniform, as for the shuffles above), each lane computes its own result from its warp's
// deposits, and a second barrier lets the deposits be reused.
namespace tk_emul {
alignas(16) inline unsigned frag[1024][8];
inline const void* rows[1024];
inline float lo16(unsigned r, bool bf) {
  __half h;
  h.x = (unsigned short)(r & 0xffffu);
  __nv_bfloat16 b;
  b.x = h.x;
  return bf ? __bfloat162float(b) : __half2float(h);
}
inline float hi16(unsigned r, bool bf) { return lo16(r >> 16, bf); }
inline unsigned pack16(unsigned short lo, unsigned short hi) {
  return (unsigned)lo | ((unsigned)hi << 16);
}
inline unsigned short at16(const void* row, unsigned col) {
  unsigned short v;
  std::memcpy(&v, static_cast<const unsigned char*>(row) + 2 * col, 2);
  return v;
}
template <int N, bool TRANS>
inline void ldmatrix(unsigned* r, const void* p) {
  const unsigned t = threadIdx.x, warp = t & ~31u, lane = t & 31u, g = lane / 4, q = lane % 4;
  rows[t] = p;
  __syncthreads();
  for (int i = 0; i < N; ++i) {
    if (TRANS) {
      r[i] = pack16(at16(rows[warp + 8 * i + 2 * q], g), at16(rows[warp + 8 * i + 2 * q + 1], g));
    } else {
      const void* row = rows[warp + 8 * i + g];
      r[i] = pack16(at16(row, 2 * q), at16(row, 2 * q + 1));
    }
  }
  __syncthreads();
}
// D (16x8) += A (16xK) B (Kx8) for this lane's four D elements, unpacking every lane's
// fragments by the instruction's layout.
inline void mma(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2], int kind) {
  // kind 0: f16 m16n8k16, 1: bf16 m16n8k16, 2: tf32 m16n8k8
  const unsigned t = threadIdx.x, warp = t & ~31u, lane = t & 31u;
  for (int i = 0; i < 4; ++i) frag[t][i] = a[i];
  frag[t][4] = b[0];
  frag[t][5] = b[1];
  __syncthreads();
  float A[16][16] = {}, B[16][8] = {};
  const int K = kind == 2 ? 8 : 16;
  const bool bf = kind == 1;
  for (unsigned L = 0; L < 32; ++L) {
    const unsigned* f = frag[warp + L];
    const unsigned g = L / 4, q = L % 4;
    if (kind == 2) {
      float v[6];
      std::memcpy(v, f, sizeof v);
      A[g][q] = v[0];
      A[g + 8][q] = v[1];
      A[g][q + 4] = v[2];
      A[g + 8][q + 4] = v[3];
      B[q][g] = v[4];
      B[q + 4][g] = v[5];
    } else {
      A[g][2 * q] = lo16(f[0], bf);
      A[g][2 * q + 1] = hi16(f[0], bf);
      A[g + 8][2 * q] = lo16(f[1], bf);
      A[g + 8][2 * q + 1] = hi16(f[1], bf);
      A[g][2 * q + 8] = lo16(f[2], bf);
      A[g][2 * q + 9] = hi16(f[2], bf);
      A[g + 8][2 * q + 8] = lo16(f[3], bf);
      A[g + 8][2 * q + 9] = hi16(f[3], bf);
      B[2 * q][g] = lo16(f[4], bf);
      B[2 * q + 1][g] = hi16(f[4], bf);
      B[2 * q + 8][g] = lo16(f[5], bf);
      B[2 * q + 9][g] = hi16(f[5], bf);
    }
  }
  const unsigned g = lane / 4, q = lane % 4;
  const unsigned row[4] = {g, g, g + 8, g + 8}, col[4] = {2 * q, 2 * q + 1, 2 * q, 2 * q + 1};
  for (int i = 0; i < 4; ++i) {
    float sum = 0.0f;
    for (int k = 0; k < K; ++k) sum += A[row[i]][k] * B[k][col[i]];
    d[i] += sum;
  }
  __syncthreads();
}
}  // namespace tk_emul

inline void tk_ldmatrix_x4(unsigned (&r)[4], const void* p) { tk_emul::ldmatrix<4, false>(r, p); }
inline void tk_ldmatrix_x4_trans(unsigned (&r)[4], const void* p) {
  tk_emul::ldmatrix<4, true>(r, p);
}
inline void tk_mma_16816_f16(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
  tk_emul::mma(d, a, b, 0);
}
inline void tk_mma_16816_bf16(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
  tk_emul::mma(d, a, b, 1);
}
inline void tk_mma_1688_tf32(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
  tk_emul::mma(d, a, b, 2);
}
// cvt.rna.tf32.f32: keep 10 mantissa bits, round to nearest with ties away from zero.
inline unsigned tk_to_tf32(float x) {
  unsigned u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x1000u) & 0xffffe000u;
  return u;
}
// cp.async runs synchronously here: the copy is complete when it returns.
inline void tk_cp_async16(void* smem, const void* gmem, bool valid) {
  if (valid) std::memcpy(smem, gmem, 16);
  else std::memset(smem, 0, 16);
}
inline void tk_cp_async_commit() {}
template <int N> inline void tk_cp_async_wait() {}
