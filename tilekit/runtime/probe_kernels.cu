// Micro-benchmarks of `tk-hw probe` (tilekit/runtime/probe.py launches them; docs/hwprofiles.md,
// "Probing a device", says what each one measures).
//
// Every kernel is sized by its arguments and launched as one full wave (SMs x resident blocks),
// so that the host can scale one launch to a few milliseconds. Each one folds what it computed
// into a value and stores it only when that value equals `sentinel`, which the host sets to
// one it cannot take: the work stays live for the compiler, and nothing is written.
//
// Compiles with NVRTC (through CuPy) and with nvcc for sm_80 and later; the tensor-core
// kernels are empty below sm_80, where mma.sync with these shapes does not exist (the host
// does not launch them there).

// -- DRAM: read-only streaming -----------------------------------------------------------------

// Sums `n4` float4s, grid-stride. Four independent loads per thread per trip: one alone leaves
// the memory system idle between its issue and its return.
extern "C" __global__ void tk_probe_dram_read(const float4* __restrict__ src, long long n4,
                                              float* sink, float sentinel) {
  const long long stride = (long long)gridDim.x * blockDim.x;
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  float acc = 0.0f;
  for (; i + 3 * stride < n4; i += 4 * stride) {
    const float4 a = src[i], b = src[i + stride], c = src[i + 2 * stride];
    const float4 d = src[i + 3 * stride];
    acc += ((a.x + a.y) + (a.z + a.w)) + ((b.x + b.y) + (b.z + b.w))
         + ((c.x + c.y) + (c.z + c.w)) + ((d.x + d.y) + (d.z + d.w));
  }
  for (; i < n4; i += stride) {
    const float4 a = src[i];
    acc += (a.x + a.y) + (a.z + a.w);
  }
  if (acc == sentinel) sink[0] = acc;
}

// -- L2: repeated reads of a buffer that fits in it ----------------------------------------------

// ld.global.cg caches in L2 only, so every pass goes to L2 rather than to the SM's L1. The asm
// is volatile so that the compiler neither hoists a pass's loads out of the pass loop (the
// addresses repeat) nor merges them.
__device__ __forceinline__ float4 tk_probe_load_cg(const float4* p) {
  float4 v;
  asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
  return v;
}

extern "C" __global__ void tk_probe_l2_read(const float4* __restrict__ buf, int n4, int passes,
                                            float* sink, float sentinel) {
  const int stride = gridDim.x * blockDim.x;
  const int first = blockIdx.x * blockDim.x + threadIdx.x;
  float acc = 0.0f;
#pragma unroll 1
  for (int p = 0; p < passes; ++p) {
#pragma unroll 4
    for (int i = first; i < n4; i += stride) {
      const float4 v = tk_probe_load_cg(buf + i);
      acc += (v.x + v.y) + (v.z + v.w);
    }
  }
  if (acc == sentinel) sink[0] = acc;
}

// -- shared memory: conflict-free 16-byte loads ---------------------------------------------------

// A warp reads 32 consecutive float4s (512 B: four conflict-free wavefronts of 32 banks x 4 B)
// per load. The rows read shift every iteration by (i * step) mod 8 warps' worth, `step` a
// kernel argument (1): the addresses change from one iteration to the next and the compiler
// cannot prove two iterations alike, so no load is hoisted or merged. `#pragma unroll 1` keeps
// the iterations apart for the same reason.
#define TK_PROBE_SMEM_THREADS 256   // the block size the host launches (probe.py)
#define TK_PROBE_SMEM_LOADS 16      // float4 loads per thread per iteration
#define TK_PROBE_SMEM_SHIFTS 8
#define TK_PROBE_SMEM_TILE \
  (TK_PROBE_SMEM_THREADS + 32 * (TK_PROBE_SMEM_LOADS + TK_PROBE_SMEM_SHIFTS - 1))

extern "C" __global__ void __launch_bounds__(TK_PROBE_SMEM_THREADS)
tk_probe_smem_read(float* sink, int iters, int step, float sentinel) {
  __shared__ float4 tile[TK_PROBE_SMEM_TILE];
  for (int k = threadIdx.x; k < TK_PROBE_SMEM_TILE; k += blockDim.x) {
    tile[k] = make_float4(k, k + 1, k + 2, k + 3);
  }
  __syncthreads();
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 1
  for (int i = 0; i < iters; ++i) {
    const float4* row = tile + threadIdx.x + 32 * ((i * step) & (TK_PROBE_SMEM_SHIFTS - 1));
#pragma unroll
    for (int j = 0; j < TK_PROBE_SMEM_LOADS; ++j) {
      const float4 v = row[32 * j];
      acc.x += v.x;
      acc.y += v.y;
      acc.z += v.z;
      acc.w += v.w;
    }
  }
  const float total = (acc.x + acc.y) + (acc.z + acc.w);
  if (total == sentinel) sink[0] = total;
}

// -- FP32 FMA on the CUDA cores ------------------------------------------------------------------

// Eight independent chains per thread cover the FMA latency; sixteen iterations per loop trip
// keep the loop's own instructions (counter, branch) to about 1% of the issue slots. x = x*m + a
// with m < 1 converges, so no value overflows or goes denormal.
#define TK_PROBE_FMA_CHAINS 8
#define TK_PROBE_FMA_UNROLL 16

extern "C" __global__ void tk_probe_fma(float* sink, int iters, float mul, float add,
                                        float sentinel) {
  float x[TK_PROBE_FMA_CHAINS];
#pragma unroll
  for (int c = 0; c < TK_PROBE_FMA_CHAINS; ++c) x[c] = threadIdx.x * 1e-3f + c;
#pragma unroll 1
  for (int i = 0; i < iters; ++i) {
#pragma unroll
    for (int u = 0; u < TK_PROBE_FMA_UNROLL; ++u) {
#pragma unroll
      for (int c = 0; c < TK_PROBE_FMA_CHAINS; ++c) x[c] = fmaf(x[c], mul, add);
    }
  }
  float total = 0.0f;
#pragma unroll
  for (int c = 0; c < TK_PROBE_FMA_CHAINS; ++c) total += x[c];
  if (total == sentinel) sink[0] = total;
}

// -- tensor cores: mma.sync on registers ------------------------------------------------------------

// One warp-wide D = A * B + C, C and D the same four f32 registers (the accumulator fragment of
// m16n8: 4 per thread). A is four .b32 registers and B two: pairs of f16/bf16 for k16, one tf32
// each for m16n8k8 (PTX ISA, "Matrix Fragments for mma.m16n8k16/k8"). Empty before sm_80.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define TK_PROBE_MMA(instruction)                                                            \
  asm volatile(instruction " {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};" \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                              \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]))
#else
#define TK_PROBE_MMA(instruction)
#endif

struct TkProbeMmaF16 {
  __device__ __forceinline__ static void mma(float (&d)[4], const unsigned (&a)[4],
                                             const unsigned (&b)[2]) {
    TK_PROBE_MMA("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32");
  }
};

struct TkProbeMmaBF16 {
  __device__ __forceinline__ static void mma(float (&d)[4], const unsigned (&a)[4],
                                             const unsigned (&b)[2]) {
    TK_PROBE_MMA("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32");
  }
};

struct TkProbeMmaTF32 {
  __device__ __forceinline__ static void mma(float (&d)[4], const unsigned (&a)[4],
                                             const unsigned (&b)[2]) {
    TK_PROBE_MMA("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32");
  }
};

// Eight independent accumulators per warp: an mma's result is ready tens of cycles after its
// issue, and a tensor core takes a new one every few cycles. The operands are the same bits
// in every register (`a_bits`, `b_bits`: small values of the dtype), so the sums stay finite.
#define TK_PROBE_MMA_CHAINS 8

template <typename Mma>
__device__ __forceinline__ void tk_probe_mma_loop(float* sink, int iters, unsigned a_bits,
                                                  unsigned b_bits, float sentinel) {
  const unsigned a[4] = {a_bits, a_bits, a_bits, a_bits};
  const unsigned b[2] = {b_bits, b_bits};
  float acc[TK_PROBE_MMA_CHAINS][4];
#pragma unroll
  for (int c = 0; c < TK_PROBE_MMA_CHAINS; ++c) {
#pragma unroll
    for (int r = 0; r < 4; ++r) acc[c][r] = 0.0f;
  }
#pragma unroll 1
  for (int i = 0; i < iters; ++i) {
#pragma unroll
    for (int c = 0; c < TK_PROBE_MMA_CHAINS; ++c) Mma::mma(acc[c], a, b);
  }
  float total = 0.0f;
#pragma unroll
  for (int c = 0; c < TK_PROBE_MMA_CHAINS; ++c) {
    total += (acc[c][0] + acc[c][1]) + (acc[c][2] + acc[c][3]);
  }
  if (total == sentinel) sink[0] = total;
}

extern "C" __global__ void tk_probe_mma_fp16(float* sink, int iters, unsigned a_bits,
                                             unsigned b_bits, float sentinel) {
  tk_probe_mma_loop<TkProbeMmaF16>(sink, iters, a_bits, b_bits, sentinel);
}

extern "C" __global__ void tk_probe_mma_bf16(float* sink, int iters, unsigned a_bits,
                                             unsigned b_bits, float sentinel) {
  tk_probe_mma_loop<TkProbeMmaBF16>(sink, iters, a_bits, b_bits, sentinel);
}

extern "C" __global__ void tk_probe_mma_tf32(float* sink, int iters, unsigned a_bits,
                                             unsigned b_bits, float sentinel) {
  tk_probe_mma_loop<TkProbeMmaTF32>(sink, iters, a_bits, b_bits, sentinel);
}

// -- launch overhead ---------------------------------------------------------------------------------

extern "C" __global__ void tk_probe_empty() {}
