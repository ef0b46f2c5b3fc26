// CPU emulation of a CUDA launch, for testing generated kernels without a GPU.
//
// Force-included (g++ -include host_emul.h) before a translation unit of generated kernels,
// which is linked with host_emul.cpp (the runtime this header declares, built once): CUDA
// qualifiers become plain C++ and every thread is a fiber (ucontext) on one OS thread.
// Shared memory is per block: `TK_STATIC_SMEM` and `TK_DYNAMIC_SMEM` (the only ways generated
// code gets shared memory) give each resident block its own buffer, as do the warp-collective
// exchanges below.
//
// Two launches:
// - `launch`: the blocks one after another, the threads of a block interleaved (an ordinary
//   kernel: blocks are independent, so running them in turn is faithful).
// - `launch_concurrent`: every block of the grid resident at once and every thread of every
//   block interleaved (a persistent program whose blocks wait on each other's progress
//   counters, or a cooperative kernel with grid barriers). A thread gives way at
//   `__syncthreads()`, at `tk_grid_sync()` and at a spin point (`tk_spin()`, `__nanosleep`).
//
// The scheduler runs the live threads in a fresh pseudo-random order each round (fixed seed,
// or TK_EMUL_SEED: runs are reproducible), and resident blocks at changing speeds, so a
// missing barrier or counter wait is likely to let a reader run before its writer. `__syncthreads()` is a real barrier: a block passes it only when all of
// its live threads wait there; some threads waiting where others have finished (a divergent
// barrier, undefined on the GPU) aborts (exit 4). `tk_grid_sync()` releases only when every
// live thread of the grid waits there (exit 4 otherwise). A grid in which no thread can make
// progress (every live thread spins or waits on a barrier that cannot release) aborts as a
// deadlock (exit 5).
//
// Memory is sequentially consistent here, so a missing `__threadfence()` cannot show up as a
// stale value. The emulator checks the release protocol instead: an integer atomic (a counter
// signal) must follow a `__threadfence()` by the same thread since its block's last barrier,
// or the run aborts (exit 6). Float atomics (data reductions) are not audited.
//
// `__shfl_xor_sync` exchanges through a per-block array between two barriers (valid because
// generated code calls shuffles from block-uniform loops). Threads do not run in lock-step
// warps here, which is stricter than the hardware: code that relied on implicit warp
// synchrony would fail.
#pragma once

#include <sys/mman.h>
#include <ucontext.h>

#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
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
#define __shared__ static
#define __launch_bounds__(...)
#define __grid_constant__
#define __constant__
#define __align__(n) __attribute__((aligned(n)))
#define __forceinline__ inline
#include "host_types.h"

namespace tk_emul {
constexpr size_t kStack = 256 * 1024;
constexpr unsigned kMaxThreads = 1024;
// Rounds in which no thread reaches a barrier or finishes before a grid counts as deadlocked.
constexpr unsigned kStuckRounds = 64;

enum class Wait { kRun, kBlockBarrier, kGridBarrier, kSpin, kDone };

// Stop the run with `code`; no destructors (the caller may be on a fiber's stack).
[[noreturn]] inline void die(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(code);
}

// What one resident block owns: its shared memory and the scratch of its warp collectives.
struct Block {
  std::vector<float4> smem;  // float4: 16-byte aligned, like the device's buffers
  alignas(8) unsigned char exchange[kMaxThreads][8];
  alignas(16) unsigned frag[kMaxThreads][8];
  const void* rows[kMaxThreads];
  unsigned wgmma_done[kMaxThreads / 128];  // wgmma batches each warpgroup has executed
  unsigned named_arrived[16], named_gen[16];  // named barriers (bar.sync id, count)
};

struct Stack {  // reserved, not touched: a page is committed only when a fiber uses it
  void* base = nullptr;
  Stack() {
    base = mmap(nullptr, kStack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS |
                MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) {
      std::fprintf(stderr, "tk_emul: cannot reserve a fiber stack\n");
      die(3);
    }
  }
  ~Stack() { munmap(base, kStack); }
  Stack(const Stack&) = delete;
  Stack& operator=(const Stack&) = delete;
};

// One wgmma a thread issued, not yet executed (wgmma runs at the wait that retires it).
struct WgmmaOp {
  float* d;
  int n, kind, ta, tb;
  unsigned long long a, b;
};
// One TMA store a thread issued, not yet executed (it reads shared memory at the wait that
// retires its group: data overwritten before that wait is what lands).
struct BulkStore {
  const void* map;  // tk_tensor_map (declared below)
  unsigned long long src;  // shared address
  int c[5];
};

struct Fiber {
  ucontext_t ctx;
  std::unique_ptr<Stack> stack;
  unsigned block = 0, thread = 0, slot = 0;
  Wait wait = Wait::kRun;
  bool fenced = false;
  std::vector<WgmmaOp> wgmma_open;                 // issued since the last commit
  std::vector<std::vector<WgmmaOp>> wgmma_groups;  // committed, oldest first (never removed)
  std::vector<BulkStore> bulk_open;                 // TMA stores since the last commit
  std::vector<std::vector<BulkStore>> bulk_groups;  // committed, not yet retired, oldest first
};

inline ucontext_t scheduler;
inline std::vector<Fiber> fibers;
inline std::vector<std::unique_ptr<Block>> slots;
inline unsigned current = 0;
inline void (*entry)(void*) = nullptr;
inline void* entry_arg = nullptr;
inline unsigned long long seed = 0x9e3779b97f4a7c15ULL;

inline Block& block() { return *slots[fibers[current].slot]; }

inline void give_way(Wait why) {
  fibers[current].wait = why;
  swapcontext(&fibers[current].ctx, &scheduler);
}
inline void barrier() { give_way(Wait::kBlockBarrier); }

// Defined in host_emul.cpp, compiled once per cache and linked into every emulation (a unit
// of kernels compiles only its kernels and harness, not the scheduler), with the scheduler's
// own functions.
[[noreturn]] void fail(const char* what);
// Size the fibers and shared-memory slots of a launch of `grid` blocks of `block_threads`.
void prepare_slots(unsigned grid, unsigned block_threads, unsigned nslots);
// launch's and launch_concurrent's loops, once `entry` is set.
void run_blocks(unsigned grid, unsigned block, const unsigned* ids, unsigned count);
void run_resident(unsigned grid, unsigned block);
// The running thread's wgmma batches and TMA stores: issued, then committed as a group.
void wgmma_issue(const WgmmaOp& op);
void wgmma_commit();
void bulk_issue(const BulkStore& st);
void bulk_commit();
// The harness's tensors: `<dir>/<name>.bin`, `bytes` long (a shorter file exits 3; no file
// leaves zeros), and `<dir>/<name>.out` written back.
std::vector<unsigned char> load(const char* dir, const char* name, size_t bytes);
void save(const char* dir, const char* name, const std::vector<unsigned char>& data);

template <typename F>
void prepare(unsigned grid, unsigned block_threads, unsigned nslots, F& body) {
  prepare_slots(grid, block_threads, nslots);
  entry = [](void* arg) { (*static_cast<F*>(arg))(); };
  entry_arg = &body;
}

// Run the blocks `ids[0..count)` of a grid of `grid` blocks of `block` threads, one block
// after another (`ids == nullptr`: every block). One shared-memory slot serves them all, as a
// static would: what a block leaves there is what the next one finds.
template <typename F>
void launch(unsigned grid, unsigned block, F body, const unsigned* ids = nullptr,
            unsigned count = 0) {
  prepare(grid, block, 1, body);
  run_blocks(grid, block, ids, count);
}

// Every block of the grid resident at once, each with its own shared memory.
template <typename F>
void launch_concurrent(unsigned grid, unsigned block, F body) {
  prepare(grid, block, grid, body);
  run_resident(grid, block);
}

// This block's shared memory, at least `bytes` long. Every thread of a block asks for the
// same size at the kernel's entry, so only the block's first request can grow it.
unsigned char* block_smem(size_t bytes);

// An integer atomic is a signal to another block: audit the release protocol.
inline void audit_release(const char* what) {
  if (!fibers[current].fenced) {
    std::fprintf(stderr, "tk_emul: block %u thread %u: %s without a __threadfence() since the "
                 "block's last barrier (its writes may not be visible to the block it "
                 "signals)\n", fibers[current].block, fibers[current].thread, what);
    die(6);
  }
}
}  // namespace tk_emul

// TK_EMUL_DYNAMIC_SMEM, the bytes of a block's dynamic shared memory, is defined by the unit
// that uses it (emulate.py's main.cpp: the largest of its kernels), after this header, so that
// the header compiles the same for every module (it is precompiled once).
#define TK_DYNAMIC_SMEM(name) unsigned char* name = tk_emul::block_smem(TK_EMUL_DYNAMIC_SMEM)
#define TK_STATIC_SMEM(name, bytes) unsigned char* name = tk_emul::block_smem(bytes)

inline void __threadfence() { tk_emul::fibers[tk_emul::current].fenced = true; }
inline void __nanosleep(unsigned) { tk_emul::give_way(tk_emul::Wait::kSpin); }
inline void tk_spin() { tk_emul::give_way(tk_emul::Wait::kSpin); }
inline void tk_grid_sync() { tk_emul::give_way(tk_emul::Wait::kGridBarrier); }
inline unsigned tk_ld_acquire(const unsigned* p) { return *(const volatile unsigned*)p; }
inline unsigned atomicAdd(unsigned* p, unsigned v) {
  tk_emul::audit_release("atomicAdd");
  const unsigned old = *p;
  *p = old + v;
  return old;
}
inline int atomicAdd(int* p, int v) {
  tk_emul::audit_release("atomicAdd");
  const int old = *p;
  *p = old + v;
  return old;
}
inline unsigned atomicMax(unsigned* p, unsigned v) {
  tk_emul::audit_release("atomicMax");
  const unsigned old = *p;
  if (v > old) *p = v;
  return old;
}
inline unsigned atomicExch(unsigned* p, unsigned v) {
  tk_emul::audit_release("atomicExch");
  const unsigned old = *p;
  *p = v;
  return old;
}
inline unsigned atomicCAS(unsigned* p, unsigned expected, unsigned v) {
  tk_emul::audit_release("atomicCAS");
  const unsigned old = *p;
  if (old == expected) *p = v;
  return old;
}
inline float atomicAdd(float* p, float v) {
  const float old = *p;
  *p = old + v;
  return old;
}

inline void __syncthreads() { tk_emul::barrier(); }

template <typename T>
T __shfl_xor_sync(unsigned, T v, int lane_mask) {
  const unsigned t = threadIdx.x;
  std::memcpy(tk_emul::block().exchange[t], &v, sizeof(T));
  __syncthreads();
  T out;
  std::memcpy(&out, tk_emul::block().exchange[t ^ (unsigned)lane_mask], sizeof(T));
  __syncthreads();
  return out;
}

// -- tensor cores: the warp collectives of runtime.cuh, by their documented layouts ---------
// Each lane deposits what it holds, the block meets at a barrier (the generated loops are
// block-uniform, as for the shuffles above), each lane computes its own result from its warp's
// deposits, and a second barrier lets the deposits be reused.
namespace tk_emul {
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
  block().rows[t] = p;
  __syncthreads();
  for (int i = 0; i < N; ++i) {
    if (TRANS) {
      r[i] = pack16(at16(block().rows[warp + 8 * i + 2 * q], g), at16(block().rows[warp + 8 * i + 2 * q + 1], g));
    } else {
      const void* row = block().rows[warp + 8 * i + g];
      r[i] = pack16(at16(row, 2 * q), at16(row, 2 * q + 1));
    }
  }
  __syncthreads();
}
// D (16x8) += A (16xK) B (Kx8) for this lane's four D elements, unpacking every lane's
// fragments by the instruction's layout.
void mma(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2], int kind);
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
  unsigned u = __float_as_uint(x);
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

// -- Hopper: mbarriers, TMA, wgmma ----------------------------------------------------------
// Shared addresses are offsets from the block's shared memory (the device's shared window),
// so alignment and the 128-byte swizzle (an XOR of address bits 4-6 with bits 7-9) are
// computed as the hardware computes them, whatever the host allocation's address.
//
// An mbarrier's 8 bytes hold its state: pending arrivals (bits 0-19), expected arrivals
// (20-39), pending transaction bytes (40-62, two's complement) and the parity of the phase in
// progress (63). A TMA copy is complete when it is issued: its bytes land and complete on the
// barrier at once. A wait gives way (a spin point) until the phase of the other parity has
// completed, so a consumer that waits for data no producer announced deadlocks (exit 5). A
// barrier that receives more arrivals than it expects, or more bytes than were announced,
// aborts (exit 7). wgmma is a warpgroup's collective: a committed batch runs, for all 128
// threads of the warpgroup at once, as late as the hardware may run it: when a thread of the
// warpgroup waits for it (wgmma.wait_group) and all 128 have committed it, reading shared
// memory then through its descriptors (so a stage released before the wait that retires its
// batch can be refilled before the batch reads it: wrong numbers) (only
// 128-byte swizzled operands, 16-bit or K-major tf32, are emulated: anything else aborts,
// exit 7); a thread's
// wgmma_wait gives way until its warpgroup has run all but the newest N of the batches it
// committed, so accumulators read before the wait hold their old values and a warpgroup of
// which one thread never issues the batch deadlocks.
struct tk_tensor_map {  // the emulation's encoding (the device's: the driver's 128 bytes)
  const unsigned char* base;
  unsigned rank, elem, swizzle;
  unsigned long long dims[5], strides[5];  // strides in bytes; strides[0] = elem
  unsigned box[5];
};

namespace tk_emul {
inline unsigned char* smem_base() { return reinterpret_cast<unsigned char*>(block().smem.data()); }
inline unsigned long long shared_addr(const void* p) {
  const unsigned char* c = static_cast<const unsigned char*>(p);
  if (c < smem_base() || c >= smem_base() + block().smem.size() * sizeof(float4))
    fail("a shared-memory operand outside the block's shared memory");
  return (unsigned long long)(c - smem_base());
}
inline unsigned long long swizzle128(unsigned long long a) { return a ^ (((a >> 7) & 7u) << 4); }

struct MBar {
  unsigned pending, expected, phase;
  long long tx;
};
inline MBar mbar_read(const void* bar) {
  if (shared_addr(bar) % 8) fail("an mbarrier not 8-byte aligned");
  unsigned long long w;
  std::memcpy(&w, bar, 8);
  long long tx = (long long)((w >> 40) & 0x7fffffull);
  if (tx & 0x400000) tx -= 0x800000;
  return MBar{(unsigned)(w & 0xfffffu), (unsigned)((w >> 20) & 0xfffffu), (unsigned)(w >> 63), tx};
}
inline void mbar_write(void* bar, MBar m) {
  if (m.pending == 0 && m.tx == 0) {  // the phase completes; the next one starts
    m.phase ^= 1u;
    m.pending = m.expected;
  }
  const unsigned long long w = (unsigned long long)m.pending | ((unsigned long long)m.expected << 20) |
      (((unsigned long long)m.tx & 0x7fffffull) << 40) | ((unsigned long long)m.phase << 63);
  std::memcpy(bar, &w, 8);
}
inline void mbar_arrive(void* bar, long long bytes) {
  MBar m = mbar_read(bar);
  if (m.pending == 0) fail("an mbarrier arrival beyond the expected count");
  m.pending -= 1;
  m.tx += bytes;
  mbar_write(bar, m);
}
inline void mbar_complete_tx(void* bar, long long bytes) {
  MBar m = mbar_read(bar);
  m.tx -= bytes;
  if (m.tx < 0) fail("more bytes completed on an mbarrier than expect_tx announced");
  mbar_write(bar, m);
}

// A box of the map's tensor at coordinates c into shared memory at dst: element i of box row r
// (rows: the box's outer dimensions, row-major) at dst + r * row bytes + i * elem, swizzled;
// zeros outside the tensor.
void tma_load(void* dst, const tk_tensor_map& m, void* bar, const int* c);
// Retire all but the newest n of this thread's committed TMA store groups (their reads of
// shared memory and their writes happen now).
void bulk_retire(unsigned n);
}  // namespace tk_emul

template <int A> inline unsigned char* tk_align_smem(unsigned char* p) {
  return p + ((A - (tk_emul::shared_addr(p) & (A - 1))) & (A - 1));
}
inline void tk_mbar_init(void* bar, unsigned count) {
  tk_emul::shared_addr(bar);
  const unsigned long long w = (unsigned long long)count | ((unsigned long long)count << 20);
  std::memcpy(bar, &w, 8);
}
inline void tk_mbar_fence_init() {}
inline void tk_mbar_expect_tx(void* bar, unsigned bytes) { tk_emul::mbar_arrive(bar, bytes); }
inline void tk_mbar_arrive(void* bar) { tk_emul::mbar_arrive(bar, 0); }
inline void tk_mbar_wait(void* bar, unsigned parity) {
  while (tk_emul::mbar_read(bar).phase == (parity & 1u)) tk_emul::give_way(tk_emul::Wait::kSpin);
}
inline void tk_tma_load_1d(void* dst, const tk_tensor_map& m, void* bar, int c0) {
  const int c[5] = {c0, 0, 0, 0, 0};
  tk_emul::tma_load(dst, m, bar, c);
}
inline void tk_tma_load_2d(void* dst, const tk_tensor_map& m, void* bar, int c0, int c1) {
  const int c[5] = {c0, c1, 0, 0, 0};
  tk_emul::tma_load(dst, m, bar, c);
}
inline void tk_tma_load_3d(void* dst, const tk_tensor_map& m, void* bar, int c0, int c1, int c2) {
  const int c[5] = {c0, c1, c2, 0, 0};
  tk_emul::tma_load(dst, m, bar, c);
}
inline void tk_tma_load_4d(void* dst, const tk_tensor_map& m, void* bar, int c0, int c1, int c2,
                           int c3) {
  const int c[5] = {c0, c1, c2, c3, 0};
  tk_emul::tma_load(dst, m, bar, c);
}
inline void tk_tma_load_5d(void* dst, const tk_tensor_map& m, void* bar, int c0, int c1, int c2,
                           int c3, int c4) {
  const int c[5] = {c0, c1, c2, c3, c4};
  tk_emul::tma_load(dst, m, bar, c);
}
template <int R>
inline void tk_emul_tma_store(const tk_tensor_map& m, const void* src, const int (&c)[R]) {
  tk_emul::BulkStore st{&m, tk_emul::shared_addr(src), {0, 0, 0, 0, 0}};
  for (int d = 0; d < R; ++d) st.c[d] = c[d];
  tk_emul::bulk_issue(st);
}
inline void tk_tma_store_1d(const tk_tensor_map& m, const void* src, int c0) {
  tk_emul_tma_store<1>(m, src, {c0});
}
inline void tk_tma_store_2d(const tk_tensor_map& m, const void* src, int c0, int c1) {
  tk_emul_tma_store<2>(m, src, {c0, c1});
}
inline void tk_tma_store_3d(const tk_tensor_map& m, const void* src, int c0, int c1, int c2) {
  tk_emul_tma_store<3>(m, src, {c0, c1, c2});
}
inline void tk_tma_store_4d(const tk_tensor_map& m, const void* src, int c0, int c1, int c2,
                            int c3) {
  tk_emul_tma_store<4>(m, src, {c0, c1, c2, c3});
}
inline void tk_tma_store_5d(const tk_tensor_map& m, const void* src, int c0, int c1, int c2,
                            int c3, int c4) {
  tk_emul_tma_store<5>(m, src, {c0, c1, c2, c3, c4});
}
inline void tk_bulk_commit() { tk_emul::bulk_commit(); }
// The stores run when a wait retires them: a `.read` wait retires them too (the data is read
// then, which is all the program may rely on before it reuses the buffer).
template <int N> inline void tk_bulk_wait() { tk_emul::bulk_retire(N); }
template <int N> inline void tk_bulk_wait_read() { tk_emul::bulk_retire(N); }
inline void tk_fence_proxy_async() {}
// A barrier of `threads` threads on barrier `id`: the last arrival releases the others.
inline void tk_named_barrier(int id, int threads) {
  using namespace tk_emul;
  if (id < 1 || id > 15) fail("a named barrier id outside 1..15");
  unsigned& arrived = block().named_arrived[id];
  const unsigned gen = block().named_gen[id];
  if (++arrived == (unsigned)threads) {
    arrived = 0;
    ++block().named_gen[id];
    return;
  }
  while (block().named_gen[id] == gen) give_way(Wait::kSpin);
}
inline unsigned long long tk_wgmma_desc(const void* p, unsigned lbo, unsigned sbo) {
  return ((tk_emul::shared_addr(p) & 0x3FFFFu) >> 4) |
         ((unsigned long long)((lbo & 0x3FFFFu) >> 4) << 16) |
         ((unsigned long long)((sbo & 0x3FFFFu) >> 4) << 32) | (1ull << 62);
}
template <int R, int C> inline void tk_wgmma_fence(float (&)[R][C]) {}
namespace tk_emul {
// Run the warpgroup's oldest batch not yet run, when all 128 of its threads have committed it
// (false: some thread has not).
bool wgmma_run_next(unsigned first, unsigned wg);
}  // namespace tk_emul
inline void tk_wgmma_commit() { tk_emul::wgmma_commit(); }
// Batches run as late as the hardware may run them: when a thread waits for them.
template <int N, int R, int C> inline void tk_wgmma_wait(float (&)[R][C]) {
  using namespace tk_emul;
  const Fiber& f = fibers[current];
  const unsigned first = current - f.thread % 128, wg = f.thread / 128;
  while (block().wgmma_done[wg] + N < f.wgmma_groups.size()) {
    if (!wgmma_run_next(first, wg)) give_way(Wait::kSpin);
  }
}
template <int R> inline void tk_setmaxnreg_inc() {}
template <int R> inline void tk_setmaxnreg_dec() {}
template <int N, int KIND, int TA, int TB>
inline void tk_wgmma(float (&d)[N / 2], unsigned long long a, unsigned long long b) {
  tk_emul::wgmma_issue(tk_emul::WgmmaOp{d, N, KIND, TA, TB, a, b});
}
// The emulation's tensor map (the harness builds one per TMA descriptor of a launch).
inline tk_tensor_map tk_emul_tensor_map(const void* base, unsigned elem, unsigned rank,
                                        const unsigned long long* dims,
                                        const unsigned long long* strides, const unsigned* box,
                                        unsigned swizzle) {
  tk_tensor_map m{};
  m.base = static_cast<const unsigned char*>(base);
  m.rank = rank, m.elem = elem, m.swizzle = swizzle;
  for (unsigned d = 0; d < rank; ++d) m.dims[d] = dims[d], m.strides[d] = strides[d], m.box[d] = box[d];
  return m;
}
