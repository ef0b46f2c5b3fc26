// tilekit device helpers, included by every generated kernel (tilekit/codegen/runtime.cuh).
//
// Kept free of C++ standard headers so that the same text compiles with nvcc, with NVRTC
// (CuPy's RawModule) and, under tilekit/codegen/host_emul.h, as host C++ for the CPU
// emulation of a launch. Its SHA-256 is recorded in the IR (codegen.helpers.sha256).
#pragma once

// The CPU emulation (host_emul.h, TK_HOST_EMUL) brings its own half types and tensor-core
// helpers; on the device they come from CUDA's headers and inline PTX below.
#if defined(TK_USE_HALF) && !defined(TK_HOST_EMUL)
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#endif

#ifndef LLONG_MAX
#define LLONG_MAX 9223372036854775807LL
#endif
#ifndef LLONG_MIN
#define LLONG_MIN (-LLONG_MAX - 1LL)
#endif

#define TK_INF __int_as_float(0x7f800000)
#define TK_NAN __int_as_float(0x7fffffff)
#define TK_DEVICE __device__ __forceinline__
// Dynamic shared memory (launch-time size); a macro so that the CPU emulation can give it a
// fixed size.
#ifndef TK_DYNAMIC_SMEM
#define TK_DYNAMIC_SMEM(name) extern __shared__ __align__(16) unsigned char name[]
#endif
// Static shared memory (up to 48 KB), a macro for the same reason: the emulation gives each
// resident block its own.
#ifndef TK_STATIC_SMEM
#define TK_STATIC_SMEM(name, bytes) __shared__ __align__(16) unsigned char name[bytes]
#endif

// -- blocks that wait on each other (tk-ram's progress counters, tk-grind's grid barriers) ---
// Correct only when every block of the grid is resident at once: the launcher checks that
// (tilekit/runtime/occupancy.py). The emulation (host_emul.h) defines its own versions.
#if !defined(TK_HOST_EMUL)
// A spin point: back off briefly so that a waiting block leaves issue slots to the others.
TK_DEVICE void tk_spin() { __nanosleep(32); }
// A load that later reads of this thread cannot move before (acquire, device scope).
TK_DEVICE unsigned tk_ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
#if defined(TK_USE_GRID_SYNC)
#include <cooperative_groups.h>
// A barrier of the whole grid; the kernel must be launched cooperatively.
TK_DEVICE void tk_grid_sync() { cooperative_groups::this_grid().sync(); }
#endif
#endif

// -- bounds ---------------------------------------------------------------------------------
// 0 <= i < n in one unsigned compare (n > 0 always: tensors have no empty dimension here).
TK_DEVICE bool tk_in(int i, int n) { return (unsigned)i < (unsigned)n; }
// Any other pair (64-bit indices of tensors with 2^31 elements or more, mixed int widths).
template <typename I, typename N> TK_DEVICE bool tk_in(I i, N n) {
  return (unsigned long long)(long long)i < (unsigned long long)(long long)n;
}

// -- integer division with the expression language's (Python's) floor semantics ----------
TK_DEVICE int tk_floordiv(int a, int b) {
  const int q = a / b;
  return (q * b != a && ((a < 0) != (b < 0))) ? q - 1 : q;
}
TK_DEVICE long long tk_floordiv(long long a, long long b) {
  const long long q = a / b;
  return (q * b != a && ((a < 0) != (b < 0))) ? q - 1 : q;
}
TK_DEVICE int tk_floormod(int a, int b) {
  const int r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
TK_DEVICE long long tk_floormod(long long a, long long b) {
  const long long r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
// Mixed integer widths (a 64-bit index beside an int constant) compute in 64 bits.
template <typename A, typename B> TK_DEVICE long long tk_floordiv(A a, B b) {
  return tk_floordiv((long long)a, (long long)b);
}
template <typename A, typename B> TK_DEVICE long long tk_floormod(A a, B b) {
  return tk_floormod((long long)a, (long long)b);
}
// NumPy's float mod: the result takes the divisor's sign.
TK_DEVICE float tk_floormod(float a, float b) {
  const float r = fmodf(a, b);
  return (r != 0.0f && ((r < 0.0f) != (b < 0.0f))) ? r + b : r;
}
TK_DEVICE double tk_floormod(double a, double b) {
  const double r = fmod(a, b);
  return (r != 0.0 && ((r < 0.0) != (b < 0.0))) ? r + b : r;
}

// -- max / min: NaN-propagating like NumPy's maximum/minimum (fmaxf would drop the NaN) ----
// (a != a) is "a is NaN"; when only b is NaN, the comparison is false and b is returned.
TK_DEVICE float tk_max(float a, float b) { return (a != a || a > b) ? a : b; }
TK_DEVICE float tk_min(float a, float b) { return (a != a || a < b) ? a : b; }
TK_DEVICE double tk_max(double a, double b) { return (a != a || a > b) ? a : b; }
TK_DEVICE double tk_min(double a, double b) { return (a != a || a < b) ? a : b; }
// The same with b a constant that is not NaN (a ReLU's 0, a Clip's bounds: the C printers
// spell max(x, c) so): one compare and a blend where the general form takes two compares, an
// or and a blend per vector; equal results, signed zeros included (tk_max(-0, 0) is 0).
TK_DEVICE float tk_max_c(float a, float c) { return c >= a ? c : a; }
TK_DEVICE float tk_min_c(float a, float c) { return c <= a ? c : a; }
TK_DEVICE double tk_max_c(double a, double c) { return c >= a ? c : a; }
TK_DEVICE double tk_min_c(double a, double c) { return c <= a ? c : a; }
TK_DEVICE int tk_max(int a, int b) { return a > b ? a : b; }
TK_DEVICE int tk_min(int a, int b) { return a < b ? a : b; }
TK_DEVICE long long tk_max(long long a, long long b) { return a > b ? a : b; }
TK_DEVICE long long tk_min(long long a, long long b) { return a < b ? a : b; }
TK_DEVICE bool tk_max(bool a, bool b) { return a || b; }
TK_DEVICE bool tk_min(bool a, bool b) { return a && b; }

// -- small math -----------------------------------------------------------------------------
TK_DEVICE float tk_abs(float x) { return fabsf(x); }
TK_DEVICE double tk_abs(double x) { return fabs(x); }
TK_DEVICE long long tk_abs(long long x) { return x < 0 ? -x : x; }
TK_DEVICE float tk_sign(float x) { return x != x ? x : (float)((x > 0.0f) - (x < 0.0f)); }
TK_DEVICE double tk_sign(double x) { return x != x ? x : (double)((x > 0.0) - (x < 0.0)); }
TK_DEVICE long long tk_sign(long long x) { return (x > 0) - (x < 0); }
// Split by sign so that exp never overflows (as the NumPy reference does).
TK_DEVICE float tk_sigmoid(float x) {
  const float e = expf(-fabsf(x));
  return x >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
}
TK_DEVICE double tk_sigmoid(double x) {
  const double e = exp(-fabs(x));
  return x >= 0.0 ? 1.0 / (1.0 + e) : e / (1.0 + e);
}

// -- reductions across the L lanes of a lane group (L a power of two <= 32) ---------------
// Every lane of the warp must call these (the generated loops are block-uniform).
template <int L, typename T> TK_DEVICE T tk_warp_sum(T v) {
#pragma unroll
  for (int o = L / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
template <int L, typename T> TK_DEVICE T tk_warp_prod(T v) {
#pragma unroll
  for (int o = L / 2; o > 0; o /= 2) v *= __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
template <int L, typename T> TK_DEVICE T tk_warp_max(T v) {
#pragma unroll
  for (int o = L / 2; o > 0; o /= 2) v = tk_max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
template <int L, typename T> TK_DEVICE T tk_warp_min(T v) {
#pragma unroll
  for (int o = L / 2; o > 0; o /= 2) v = tk_min(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Shuffles move 32/64-bit words: a bool travels as an int.
template <int L> TK_DEVICE bool tk_warp_max(bool v) { return tk_warp_max<L, int>((int)v) != 0; }
template <int L> TK_DEVICE bool tk_warp_min(bool v) { return tk_warp_min<L, int>((int)v) != 0; }

// -- tensor cores (sm_80+): ldmatrix, mma.sync, cp.async -------------------------------------
// Fragment layouts are the PTX ISA's ("Matrix Fragments for mma.m16n8k16" / "m16n8k8"), with
// g = lane / 4 and t = lane % 4:
//   m16n8k16 (f16, bf16), A 16x16 row: a[0] = A[g][2t..2t+1], a[1] = A[g+8][2t..],
//       a[2] = A[g][2t+8..], a[3] = A[g+8][2t+8..]; B 16x8 col: b[0] = B[2t..2t+1][g],
//       b[1] = B[2t+8..2t+9][g] (two 16-bit values a register, the lower index low);
//   m16n8k8 (tf32), A 16x8: a[0] = A[g][t], a[1] = A[g+8][t], a[2] = A[g][t+4],
//       a[3] = A[g+8][t+4]; B 8x8: b[0] = B[t][g], b[1] = B[t+4][g];
//   C/D 16x8 (f32): d[0] = D[g][2t], d[1] = D[g][2t+1], d[2] = D[g+8][2t], d[3] = D[g+8][2t+1].
// ldmatrix .x4 loads four 8x8 b16 matrices; lane L gives the address of row L % 8 of matrix
// L / 8 and receives row g, columns 2t..2t+1 of each (with .trans: rows 2t..2t+1, column g).
// Every lane of the warp must call these (the generated loops are block-uniform).
#if !defined(TK_HOST_EMUL)
TK_DEVICE unsigned tk_smem_addr(const void* p) {
  return (unsigned)__cvta_generic_to_shared(p);
}
TK_DEVICE void tk_ldmatrix_x4(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(tk_smem_addr(p)));
}
TK_DEVICE void tk_ldmatrix_x4_trans(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(tk_smem_addr(p)));
}
TK_DEVICE void tk_mma_16816_f16(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
               "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
TK_DEVICE void tk_mma_16816_bf16(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
               "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
TK_DEVICE void tk_mma_1688_tf32(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
               "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
// An fp32 value rounded to tf32 (round to nearest, ties away), as mma's tf32 operand.
TK_DEVICE unsigned tk_to_tf32(float x) {
  unsigned r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}
// 16 bytes global -> shared, asynchronously; `valid` false writes zeros (src-size 0).
TK_DEVICE void tk_cp_async16(void* smem, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
               :: "r"(tk_smem_addr(smem)), "l"(gmem), "r"(valid ? 16 : 0));
}
TK_DEVICE void tk_cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }
template <int N> TK_DEVICE void tk_cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" :: "n"(N));
}
#endif

// -- Hopper (sm_90): mbarriers, TMA; (sm_90a): wgmma, setmaxnreg ---------------------------
// A TMA descriptor as a kernel parameter: CUtensorMap's size and alignment (the driver's
// cuTensorMapEncodeTiled fills its bytes on the host; tilekit/runtime/cuda.py). The emulation
// (host_emul.h) has its own encoding.
#if !defined(TK_HOST_EMUL)
struct __align__(128) tk_tensor_map {
  unsigned char bytes[128];
};
// The shared-memory base rounded up to A bytes (a 128-byte swizzle repeats every 1024 bytes:
// TMA writes and wgmma reads agree on it only from an aligned base); the kernel declares A
// bytes more than it uses.
template <int A> TK_DEVICE unsigned char* tk_align_smem(unsigned char* p) {
  return p + ((A - (tk_smem_addr(p) & (A - 1))) & (A - 1));
}
// mbarrier objects (8 bytes of shared memory): a phase completes when its expected arrivals
// have arrived and the bytes announced with expect_tx have landed; waits test the parity of
// the phase (a fresh barrier's "previous" phase, parity 1, counts as complete).
TK_DEVICE void tk_mbar_init(void* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(tk_smem_addr(bar)),
               "r"(count) : "memory");
}
// After initialising: the barriers visible to the asynchronous proxy (TMA completes on them).
TK_DEVICE void tk_mbar_fence_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
TK_DEVICE void tk_mbar_expect_tx(void* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n"
               :: "r"(tk_smem_addr(bar)), "r"(bytes) : "memory");
}
TK_DEVICE void tk_mbar_arrive(void* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(tk_smem_addr(bar))
               : "memory");
}
TK_DEVICE void tk_mbar_wait(void* bar, unsigned parity) {
  const unsigned a = tk_smem_addr(bar);
  unsigned done;
  do {
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                 "selp.u32 %0, 1, 0, p;\n}\n" : "=r"(done) : "r"(a), "r"(parity) : "memory");
  } while (!done);
}
// TMA: the box at coordinates c0.. (innermost first, elements) of the map's tensor into shared
// memory at dst (zeros outside the tensor), its bytes completing on bar.
TK_DEVICE void tk_tma_load_1d(void* dst, const tk_tensor_map& m, void* bar, int c0) {
  asm volatile("cp.async.bulk.tensor.1d.shared::cluster.global.mbarrier::complete_tx::bytes"
               " [%0], [%1, {%3}], [%2];\n" :: "r"(tk_smem_addr(dst)), "l"(&m),
               "r"(tk_smem_addr(bar)), "r"(c0) : "memory");
}
TK_DEVICE void tk_tma_load_2d(void* dst, const tk_tensor_map& m, void* bar, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
               " [%0], [%1, {%3, %4}], [%2];\n" :: "r"(tk_smem_addr(dst)), "l"(&m),
               "r"(tk_smem_addr(bar)), "r"(c0), "r"(c1) : "memory");
}
TK_DEVICE void tk_tma_load_3d(void* dst, const tk_tensor_map& m, void* bar, int c0, int c1,
                              int c2) {
  asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
               " [%0], [%1, {%3, %4, %5}], [%2];\n" :: "r"(tk_smem_addr(dst)), "l"(&m),
               "r"(tk_smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2) : "memory");
}
TK_DEVICE void tk_tma_load_4d(void* dst, const tk_tensor_map& m, void* bar, int c0, int c1,
                              int c2, int c3) {
  asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
               " [%0], [%1, {%3, %4, %5, %6}], [%2];\n" :: "r"(tk_smem_addr(dst)), "l"(&m),
               "r"(tk_smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3) : "memory");
}
TK_DEVICE void tk_tma_load_5d(void* dst, const tk_tensor_map& m, void* bar, int c0, int c1,
                              int c2, int c3, int c4) {
  asm volatile("cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes"
               " [%0], [%1, {%3, %4, %5, %6, %7}], [%2];\n" :: "r"(tk_smem_addr(dst)), "l"(&m),
               "r"(tk_smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4) : "memory");
}
// TMA store: the map's box at coordinates c0.. of its tensor from shared memory at src (in the
// map's swizzled layout; elements outside the tensor are not written), in this thread's bulk
// group; commit closes the group; wait<N> / wait_read<N> until at most N groups are incomplete
// / still reading shared memory. The writes of the threads that filled src must be fenced for
// the async proxy first (tk_fence_proxy_async) and a barrier must order them before the store.
TK_DEVICE void tk_tma_store_1d(const tk_tensor_map& m, const void* src, int c0) {
  asm volatile("cp.async.bulk.tensor.1d.global.shared::cta.bulk_group [%0, {%2}], [%1];\n"
               :: "l"(&m), "r"(tk_smem_addr(src)), "r"(c0) : "memory");
}
TK_DEVICE void tk_tma_store_2d(const tk_tensor_map& m, const void* src, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n"
               :: "l"(&m), "r"(tk_smem_addr(src)), "r"(c0), "r"(c1) : "memory");
}
TK_DEVICE void tk_tma_store_3d(const tk_tensor_map& m, const void* src, int c0, int c1, int c2) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];\n"
               :: "l"(&m), "r"(tk_smem_addr(src)), "r"(c0), "r"(c1), "r"(c2) : "memory");
}
TK_DEVICE void tk_tma_store_4d(const tk_tensor_map& m, const void* src, int c0, int c1, int c2,
                               int c3) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n"
               :: "l"(&m), "r"(tk_smem_addr(src)), "r"(c0), "r"(c1), "r"(c2), "r"(c3) : "memory");
}
TK_DEVICE void tk_tma_store_5d(const tk_tensor_map& m, const void* src, int c0, int c1, int c2,
                               int c3, int c4) {
  asm volatile("cp.async.bulk.tensor.5d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5, %6}], [%1];\n"
               :: "l"(&m), "r"(tk_smem_addr(src)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4)
               : "memory");
}
TK_DEVICE void tk_bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
template <int N> TK_DEVICE void tk_bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;\n" :: "n"(N) : "memory");
}
template <int N> TK_DEVICE void tk_bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" :: "n"(N) : "memory");
}
TK_DEVICE void tk_fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// A barrier of `threads` threads (a multiple of 32) on hardware barrier `id` (1..15; 0 is
// __syncthreads'): the consumer warpgroups synchronise without the producer.
TK_DEVICE void tk_named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" :: "r"(id), "r"(threads) : "memory");
}
// The shared-memory matrix descriptor (PTX ISA, "Matrix Descriptor Format"): start address,
// leading and stride byte offsets (each >> 4, 14 bits), base offset 0, 128-byte swizzle (1
// in bits 62-63).
TK_DEVICE unsigned long long tk_wgmma_desc(const void* p, unsigned lbo, unsigned sbo) {
  return (unsigned long long)((tk_smem_addr(p) & 0x3FFFFu) >> 4)
         | ((unsigned long long)((lbo & 0x3FFFFu) >> 4) << 16)
         | ((unsigned long long)((sbo & 0x3FFFFu) >> 4) << 32) | (1ull << 62);
}
// The accumulators as operands of an empty asm: the compiler neither moves their reads before
// a wait nor their writes after a fence (CUTLASS's warpgroup_fence_operand).
template <int R, int C> TK_DEVICE void tk_fence_regs(float (&d)[R][C]) {
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int c = 0; c < C; ++c) asm volatile("" : "+f"(d[r][c]) :: "memory");
  }
}
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
// Compiled for a device target other than sm_90a: a kernel that uses these does not build.
template <int R, int C> TK_DEVICE void tk_wgmma_fence(float (&)[R][C]) {
  static_assert(R < 0, "wgmma needs the sm_90a target (-gencode=arch=compute_90a,code=sm_90a)");
}
#else
template <int R, int C> TK_DEVICE void tk_wgmma_fence(float (&d)[R][C]) {
  tk_fence_regs(d);
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
#endif
TK_DEVICE void tk_wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N, int R, int C> TK_DEVICE void tk_wgmma_wait(float (&d)[R][C]) {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(N) : "memory");
  tk_fence_regs(d);
}
template <int R> TK_DEVICE void tk_setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" :: "n"(R));
}
template <int R> TK_DEVICE void tk_setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" :: "n"(R));
}
// wgmma.mma_async.m64nNk16 with fp32 accumulators, A and B from shared memory through their
// descriptors; KIND 0: f16, 1: bf16 (k16), 2: tf32 (k8, fp32 words in shared memory of which
// the tensor cores read the upper 19 bits); TA / TB: 1 when A is M-major / B is N-major
// (transposed; f16 and bf16 only).
// Accumulator layout (PTX ISA, "wgmma .m64nNk16 register fragment layout for accumulator
// matrix D"): warp w of the warpgroup holds rows 16w..16w+15; with g = lane / 4, t = lane % 4,
// d[i] = D[16w + g + 8 * ((i / 2) % 2)][8 * (i / 4) + 2t + i % 2].
template <int N, int KIND, int TA, int TB> struct tk_wgmma_op;
// The accumulators' operands: %0 .. %(R-1) in the instruction, bound to d[0] .. d[R-1].
#define TK_WGMMA_R32 \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15," \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define TK_WGMMA_R64 \
  TK_WGMMA_R32 "," \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47," \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define TK_WGMMA_R128 \
  TK_WGMMA_R64 "," \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79," \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95," \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111," \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define TK_WGMMA_D32 \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define TK_WGMMA_D64 \
  TK_WGMMA_D32, \
  "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
  "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
  "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define TK_WGMMA_D128 \
  TK_WGMMA_D64, \
  "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), \
  "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), \
  "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), \
  "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), \
  "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), \
  "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), \
  "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), \
  "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
// One specialisation: N columns, R accumulators (REGS, OUTS), the instruction INSTR;
// f16 and bf16 (k16) take the operands' transposes TA, TB as immediates, tf32 (k8) none.
#define TK_WGMMA_K16(N, KIND, R, REGS, OUTS, INSTR, P, A, B, TA_, TB_) \
template <int TA, int TB> struct tk_wgmma_op<N, KIND, TA, TB> { \
  TK_DEVICE static void run(float (&d)[R], unsigned long long a, unsigned long long b) { \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " P ", 0;\n" INSTR " {" REGS "}, " A \
                 ", " B ", p, 1, 1, " TA_ ", " TB_ ";\n}\n" \
                 : OUTS : "l"(a), "l"(b), "r"(1), "n"(TA), "n"(TB)); \
  } \
};
#define TK_WGMMA_K8(N, R, REGS, OUTS, INSTR, P, A, B) \
template <int TA, int TB> struct tk_wgmma_op<N, 2, TA, TB> { \
  static_assert(TA == 0 && TB == 0, "tf32 wgmma reads K-major operands only"); \
  TK_DEVICE static void run(float (&d)[R], unsigned long long a, unsigned long long b) { \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " P ", 0;\n" INSTR " {" REGS "}, " A \
                 ", " B ", p, 1, 1;\n}\n" \
                 : OUTS : "l"(a), "l"(b), "r"(1)); \
  } \
};
TK_WGMMA_K16(64, 0, 32, TK_WGMMA_R32, TK_WGMMA_D32,
             "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16", "%34", "%32", "%33",
             "%35", "%36")
TK_WGMMA_K16(128, 0, 64, TK_WGMMA_R64, TK_WGMMA_D64,
             "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16", "%66", "%64", "%65",
             "%67", "%68")
TK_WGMMA_K16(256, 0, 128, TK_WGMMA_R128, TK_WGMMA_D128,
             "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16", "%130", "%128", "%129",
             "%131", "%132")
TK_WGMMA_K16(64, 1, 32, TK_WGMMA_R32, TK_WGMMA_D32,
             "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16", "%34", "%32", "%33",
             "%35", "%36")
TK_WGMMA_K16(128, 1, 64, TK_WGMMA_R64, TK_WGMMA_D64,
             "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16", "%66", "%64", "%65",
             "%67", "%68")
TK_WGMMA_K16(256, 1, 128, TK_WGMMA_R128, TK_WGMMA_D128,
             "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16", "%130", "%128", "%129",
             "%131", "%132")
// tf32 (KIND 2): m64nNk8, both operands K-major (the instruction has no transpose for tf32).
TK_WGMMA_K8(64, 32, TK_WGMMA_R32, TK_WGMMA_D32,
            "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32", "%34", "%32", "%33")
TK_WGMMA_K8(128, 64, TK_WGMMA_R64, TK_WGMMA_D64,
            "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32", "%66", "%64", "%65")
TK_WGMMA_K8(256, 128, TK_WGMMA_R128, TK_WGMMA_D128,
            "wgmma.mma_async.sync.aligned.m64n256k8.f32.tf32.tf32", "%130", "%128", "%129")
template <int N, int KIND, int TA, int TB>
TK_DEVICE void tk_wgmma(float (&d)[N / 2], unsigned long long a, unsigned long long b) {
  tk_wgmma_op<N, KIND, TA, TB>::run(d, a, b);
}
#endif
// Two 16-bit values as one 32-bit fragment register, the first in the low half.
TK_DEVICE unsigned tk_pack16(unsigned short lo, unsigned short hi) {
  return (unsigned)lo | ((unsigned)hi << 16);
}
