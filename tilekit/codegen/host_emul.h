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
