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
// Two 16-bit values as one 32-bit fragment register, the first in the low half.
TK_DEVICE unsigned tk_pack16(unsigned short lo, unsigned short hi) {
  return (unsigned)lo | ((unsigned)hi << 16);
}
