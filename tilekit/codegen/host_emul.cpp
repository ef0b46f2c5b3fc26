// The CUDA emulation's runtime: the fiber scheduler, the launch loops, the tensor-core, TMA
// and wgmma emulation and the harness's file I/O (host_emul.h declares them and says what
// they do). Compiled once per compiler and flags (tilekit.codegen.emulate) and linked into
// every emulation binary, so that a unit of generated kernels compiles only itself.
#include <string>

#include "host_emul.h"

namespace tk_emul {

static void trampoline() {
  entry(entry_arg);
  if (!fibers[current].bulk_open.empty() || !fibers[current].bulk_groups.empty())
    fail("a thread exits with TMA stores it did not wait for (cp.async.bulk.wait_group)");
  fibers[current].wait = Wait::kDone;  // returning resumes the scheduler (uc_link)
}

static void reset(Fiber& f) {
  if (!f.stack) f.stack = std::make_unique<Stack>();
  f.wait = Wait::kRun;
  f.fenced = false;
  f.wgmma_open.clear();
  f.wgmma_groups.clear();
  f.bulk_open.clear();
  f.bulk_groups.clear();
  getcontext(&f.ctx);
  f.ctx.uc_stack.ss_sp = f.stack->base;
  f.ctx.uc_stack.ss_size = kStack;
  f.ctx.uc_link = &scheduler;
  makecontext(&f.ctx, trampoline, 0);
}

static void resume(unsigned k) {
  current = k;
  threadIdx = dim3{fibers[k].thread, 1, 1};
  blockIdx = dim3{fibers[k].block, 1, 1};
  fibers[k].wait = Wait::kRun;
  swapcontext(&scheduler, &fibers[k].ctx);
}

// Release the barriers whose waiters are complete; exit on a barrier that can never release.
// Returns whether any barrier released.
static bool release(unsigned nblocks, unsigned threads) {
  bool released = false;
  unsigned grid_waiting = 0, grid_done = 0;
  for (unsigned s = 0; s < nblocks; ++s) {
    unsigned at_block = 0, at_grid = 0, done = 0;
    for (unsigned t = 0; t < threads; ++t) {
      const Wait w = fibers[s * threads + t].wait;
      at_block += w == Wait::kBlockBarrier;
      at_grid += w == Wait::kGridBarrier;
      done += w == Wait::kDone;
    }
    grid_waiting += at_grid;
    grid_done += done;
    if (at_block == 0) continue;
    if (at_block + done == threads && done != 0) {
      std::fprintf(stderr, "tk_emul: block %u: %u threads wait at a barrier that %u threads "
                   "never reach\n", fibers[s * threads].block, at_block, done);
      die(4);
    }
    if (at_block + at_grid == threads && at_grid != 0) {
      std::fprintf(stderr, "tk_emul: block %u: %u threads wait at __syncthreads() while %u "
                   "wait at the grid barrier\n", fibers[s * threads].block, at_block, at_grid);
      die(4);
    }
    if (at_block == threads) {
      for (unsigned t = 0; t < threads; ++t) {
        Fiber& f = fibers[s * threads + t];
        f.wait = Wait::kRun;
        f.fenced = false;  // a fence must follow the barrier it publishes
      }
      released = true;
    }
  }
  const unsigned total = nblocks * threads;
  if (grid_waiting != 0 && grid_waiting + grid_done == total) {
    if (grid_done != 0) {
      std::fprintf(stderr, "tk_emul: %u threads wait at the grid barrier that %u threads "
                   "never reach\n", grid_waiting, grid_done);
      die(4);
    }
    for (auto& f : fibers) f.wait = Wait::kRun, f.fenced = false;
    released = true;
  }
  return released;
}

static unsigned long long next_random() {
  seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
  return seed >> 33;
}

// Resident blocks do not run at one speed: every `kSpeedRounds` rounds each block draws a
// period (1, 4 or 16 rounds, half of them fast) and a phase, and runs only in its rounds, so a
// reader that does not wait for its writer is likely to overtake it.
constexpr unsigned kSpeedRounds = 16;

// Run `nblocks` resident blocks (fibers [s * threads, (s + 1) * threads) for slot s) until all
// are done.
static void run(unsigned nblocks, unsigned threads) {
  const unsigned total = nblocks * threads;
  std::vector<unsigned> order(total), period(nblocks, 1), phase(nblocks, 0);
  for (unsigned k = 0; k < total; ++k) order[k] = k;
  unsigned stuck = 0;
  for (unsigned round = 0;; ++round) {
    if (nblocks > 1 && round % kSpeedRounds == 0) {
      for (unsigned b = 0; b < nblocks; ++b) {
        const unsigned draw = next_random() % 4;
        period[b] = draw < 2 ? 1 : draw == 2 ? 4 : 16;
        phase[b] = next_random() % period[b];
      }
    }
    for (unsigned k = total; k > 1; --k) std::swap(order[k - 1], order[next_random() % k]);
    bool progress = false, skipped = false, live = false;
    unsigned resumed = 0;
    for (unsigned k = 0; k < total; ++k) {
      const unsigned f = order[k], b = f / threads;
      const Wait before = fibers[f].wait;
      if (before != Wait::kRun && before != Wait::kSpin) continue;
      if ((round + phase[b]) % period[b] != 0) {
        skipped = true;
        continue;
      }
      resume(f);
      ++resumed;
      progress |= fibers[f].wait != Wait::kSpin;
    }
    progress |= release(nblocks, threads);
    for (unsigned k = 0; k < total; ++k) live |= fibers[k].wait != Wait::kDone;
    if (!live) return;
    if (progress) {
      stuck = 0;
    } else if (resumed > 0 || !skipped) {
      ++stuck;
    }
    if (stuck == kStuckRounds || (!progress && resumed == 0 && !skipped)) {
      unsigned spinning = 0, waiting = 0;
      for (auto& f : fibers) {
        spinning += f.wait == Wait::kSpin;
        waiting += f.wait == Wait::kBlockBarrier || f.wait == Wait::kGridBarrier;
      }
      std::fprintf(stderr, "tk_emul: deadlock: %u threads spin and %u wait at barriers, and "
                   "none can progress\n", spinning, waiting);
      die(5);
    }
  }
}

void prepare_slots(unsigned grid, unsigned block_threads, unsigned nslots) {
  if (block_threads > kMaxThreads) {
    std::fprintf(stderr, "tk_emul: %u threads per block (at most %u)\n", block_threads,
                 kMaxThreads);
    die(3);
  }
  gridDim = dim3{grid, 1, 1};
  blockDim = dim3{block_threads, 1, 1};
  if (const char* text = std::getenv("TK_EMUL_SEED")) seed = std::strtoull(text, nullptr, 0);
  fibers.resize((size_t)nslots * block_threads);
  while (slots.size() < nslots) slots.push_back(std::make_unique<Block>());
}

void run_blocks(unsigned grid, unsigned block, const unsigned* ids, unsigned count) {
  const unsigned nblocks = ids ? count : grid;
  for (unsigned n = 0; n < nblocks; ++n) {
    const unsigned b = ids ? ids[n] : n;
    for (unsigned t = 0; t < block; ++t) {
      Fiber& f = fibers[t];
      f.block = b, f.thread = t, f.slot = 0;
      reset(f);
    }
    for (unsigned& w : slots[0]->wgmma_done) w = 0;
    for (unsigned i = 0; i < 16; ++i) slots[0]->named_arrived[i] = slots[0]->named_gen[i] = 0;
    run(1, block);
  }
}

void run_resident(unsigned grid, unsigned block) {
  for (unsigned b = 0; b < grid; ++b) {
    for (unsigned t = 0; t < block; ++t) {
      Fiber& f = fibers[(size_t)b * block + t];
      f.block = b, f.thread = t, f.slot = b;
      reset(f);
    }
    for (unsigned& w : slots[b]->wgmma_done) w = 0;
    for (unsigned i = 0; i < 16; ++i) slots[b]->named_arrived[i] = slots[b]->named_gen[i] = 0;
  }
  run(grid, block);
}

unsigned char* block_smem(size_t bytes) {
  std::vector<float4>& smem = block().smem;
  const size_t count = (bytes + sizeof(float4) - 1) / sizeof(float4);
  if (smem.size() < count) smem.resize(count, float4{0, 0, 0, 0});
  return reinterpret_cast<unsigned char*>(smem.data());
}

void mma(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2], int kind) {
  // kind 0: f16 m16n8k16, 1: bf16 m16n8k16, 2: tf32 m16n8k8
  const unsigned t = threadIdx.x, warp = t & ~31u, lane = t & 31u;
  for (int i = 0; i < 4; ++i) block().frag[t][i] = a[i];
  block().frag[t][4] = b[0];
  block().frag[t][5] = b[1];
  __syncthreads();
  float A[16][16] = {}, B[16][8] = {};
  const int K = kind == 2 ? 8 : 16;
  const bool bf = kind == 1;
  for (unsigned L = 0; L < 32; ++L) {
    const unsigned* f = block().frag[warp + L];
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

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "tk_emul: block %u thread %u: %s\n", fibers[current].block,
               fibers[current].thread, what);
  die(7);
}

void tma_load(void* dst, const tk_tensor_map& m, void* bar, const int* c) {
  const unsigned long long start = shared_addr(dst);
  if (start % 128) fail("a TMA destination not 128-byte aligned");
  if (m.swizzle != 0 && m.swizzle != 128) fail("a TMA swizzle other than 128 bytes");
  const unsigned long long row_bytes = (unsigned long long)m.box[0] * m.elem;
  if (m.swizzle == 128 && row_bytes > 128) fail("a 128-byte swizzled box row over 128 bytes");
  unsigned long long rows = 1;
  for (unsigned d = 1; d < m.rank; ++d) rows *= m.box[d];
  for (unsigned long long r = 0; r < rows; ++r) {
    long long at[5] = {0, 0, 0, 0, 0};
    unsigned long long rest = r;
    bool inside = true;
    unsigned long long offset = 0;
    for (unsigned d = 1; d < m.rank; ++d) {
      at[d] = c[d] + (long long)(rest % m.box[d]);
      rest /= m.box[d];
      inside = inside && at[d] >= 0 && at[d] < (long long)m.dims[d];
      offset += (unsigned long long)at[d] * m.strides[d];
    }
    for (unsigned i = 0; i < m.box[0]; ++i) {
      const long long x = c[0] + (long long)i;
      unsigned long long a = start + r * row_bytes + (unsigned long long)i * m.elem;
      if (m.swizzle == 128) a = swizzle128(a);
      unsigned char* out = smem_base() + a;
      if (inside && x >= 0 && x < (long long)m.dims[0]) {
        std::memcpy(out, m.base + offset + (unsigned long long)x * m.elem, m.elem);
      } else {
        std::memset(out, 0, m.elem);
      }
    }
  }
  mbar_complete_tx(bar, (long long)(rows * row_bytes));
}

// A TMA store (tma_load's layout, the other way): element i of box row r from shared memory at
// src + r * row bytes + i * elem (swizzled) to the tensor, elements outside the tensor skipped.
static void tma_store(const BulkStore& st) {
  const tk_tensor_map& m = *static_cast<const tk_tensor_map*>(st.map);
  if (st.src % 128) fail("a TMA store source not 128-byte aligned");
  if (m.swizzle != 0 && m.swizzle != 128) fail("a TMA swizzle other than 128 bytes");
  const unsigned long long row_bytes = (unsigned long long)m.box[0] * m.elem;
  if (m.swizzle == 128 && row_bytes > 128) fail("a 128-byte swizzled box row over 128 bytes");
  unsigned long long rows = 1;
  for (unsigned d = 1; d < m.rank; ++d) rows *= m.box[d];
  unsigned char* base = const_cast<unsigned char*>(m.base);
  for (unsigned long long r = 0; r < rows; ++r) {
    unsigned long long rest = r, offset = 0;
    bool inside = true;
    for (unsigned d = 1; d < m.rank; ++d) {
      const long long at = st.c[d] + (long long)(rest % m.box[d]);
      rest /= m.box[d];
      inside = inside && at >= 0 && at < (long long)m.dims[d];
      offset += (unsigned long long)at * m.strides[d];
    }
    for (unsigned i = 0; i < m.box[0] && inside; ++i) {
      const long long x = st.c[0] + (long long)i;
      if (x < 0 || x >= (long long)m.dims[0]) continue;
      unsigned long long a = st.src + r * row_bytes + (unsigned long long)i * m.elem;
      if (m.swizzle == 128) a = swizzle128(a);
      if (a + m.elem > block().smem.size() * sizeof(float4)) fail("a TMA store outside shared memory");
      std::memcpy(base + offset + (unsigned long long)x * m.elem, smem_base() + a, m.elem);
    }
  }
}

void bulk_retire(unsigned n) {
  Fiber& f = fibers[current];
  while (f.bulk_groups.size() > n) {
    for (const BulkStore& st : f.bulk_groups.front()) tma_store(st);
    f.bulk_groups.erase(f.bulk_groups.begin());
  }
}

// Element (mn, k) of an operand of `item` bytes (2: f16/bf16, 4: tf32) through its descriptor
// (the canonical layouts of the PTX ISA, "Shared Memory Matrix Layout", 128-byte swizzle):
// K-major, rows of mn 128 bytes apart, groups of 8 rows SBO apart, k contiguous; MN-major
// (transposed, 16-bit only), mn contiguous in rows of 64, 64-element groups LBO apart, rows of
// k 128 bytes apart, groups of 8 k SBO apart. Returns the element's bits.
static unsigned desc_element(unsigned long long desc, int trans, unsigned mn, unsigned k,
                             unsigned item) {
  if ((desc >> 62) != 1) fail("a wgmma descriptor without the 128-byte swizzle mode");
  if (((desc >> 49) & 7u) != 0) fail("a wgmma descriptor with a base offset");
  const unsigned long long start = (desc & 0x3fffu) << 4, lbo = ((desc >> 16) & 0x3fffu) << 4,
                           sbo = ((desc >> 32) & 0x3fffu) << 4;
  unsigned long long a;
  if (trans) {
    if (item != 2) fail("a transposed wgmma operand that is not 16-bit");
    a = start + (mn / 64) * lbo + ((mn / 8) % 8) * 16 + (mn % 8) * 2 + (k / 8) * sbo + (k % 8) * 128;
  } else {
    a = start + (mn / 8) * sbo + (mn % 8) * 128 + (unsigned long long)k * item;
  }
  a = swizzle128(a);
  if (a + item > block().smem.size() * sizeof(float4)) fail("a wgmma operand outside shared memory");
  unsigned v = 0;
  std::memcpy(&v, smem_base() + a, item);
  return v;
}

// An operand element's value: f16/bf16 from its 16 bits; tf32 from the upper 19 bits of its
// 32-bit word (the tensor cores ignore the low 13 mantissa bits of an fp32 in shared memory).
static float wgmma_value(unsigned bits, int kind) {
  if (kind == 2) return __int_as_float((int)(bits & 0xffffe000u));
  return lo16(bits, kind == 1);
}

// D (64 x N) += A (64 x K) B (K x N) for this thread's N/2 accumulators (the layout of
// runtime.cuh's tk_wgmma); K is 32 bytes of elements: 16 (f16, bf16) or 8 (tf32).
static void wgmma_run(const WgmmaOp& op) {
  const unsigned t = fibers[current].thread % 128, warp = t / 32, lane = t % 32;
  const unsigned item = op.kind == 2 ? 4 : 2, depth = 32 / item;
  // This thread's N / 2 accumulators read 2 rows of A and N / 4 columns of B: each of their
  // elements is read through its descriptor once (not once per accumulator), all before any
  // accumulator changes; every sum runs over k in order, as the ISA's product does.
  if (op.n < 8 || op.n > 256 || op.n % 8) fail("a wgmma N outside 8..256 in steps of 8");
  float a[2][16], b[64][16];
  for (unsigned r = 0; r < 2; ++r) {
    for (unsigned k = 0; k < depth; ++k)
      a[r][k] = wgmma_value(desc_element(op.a, op.ta, 16 * warp + lane / 4 + 8 * r, k, item),
                            op.kind);
  }
  for (int c = 0; c < op.n / 4; ++c) {
    const unsigned col = 8 * (c / 2) + 2 * (lane % 4) + c % 2;
    for (unsigned k = 0; k < depth; ++k)
      b[c][k] = wgmma_value(desc_element(op.b, op.tb, col, k, item), op.kind);
  }
  for (int i = 0; i < op.n / 2; ++i) {
    const float* row = a[(i / 2) % 2];
    const float* col = b[(i / 4) * 2 + i % 2];
    float sum = 0.0f;
    for (unsigned k = 0; k < depth; ++k) sum += row[k] * col[k];
    op.d[i] += sum;
  }
}

bool wgmma_run_next(unsigned first, unsigned wg) {
  unsigned& done = block().wgmma_done[wg];
  for (unsigned t = 0; t < 128; ++t) {
    if (fibers[first + t].wgmma_groups.size() <= done) return false;
  }
  for (unsigned t = 0; t < 128; ++t) {
    const unsigned keep = current;
    current = first + t;  // wgmma_run reads the thread's position from `current`
    for (const WgmmaOp& op : fibers[first + t].wgmma_groups[done]) wgmma_run(op);
    current = keep;
  }
  ++done;
  return true;
}

void bulk_commit() {
  Fiber& f = fibers[current];
  f.bulk_groups.push_back(std::move(f.bulk_open));
  f.bulk_open.clear();
}
void bulk_issue(const BulkStore& st) { fibers[current].bulk_open.push_back(st); }

void wgmma_commit() {
  Fiber& f = fibers[current];
  if (f.thread - f.thread % 128 + 128 > blockDim.x) fail("wgmma by a partial warpgroup");
  f.wgmma_groups.push_back(std::move(f.wgmma_open));
  f.wgmma_open.clear();
}
void wgmma_issue(const WgmmaOp& op) { fibers[current].wgmma_open.push_back(op); }

std::vector<unsigned char> load(const char* dir, const char* name, size_t bytes) {
  const std::string path = std::string(dir) + "/" + name + ".bin";
  std::vector<unsigned char> buf(bytes ? bytes : 1);
  if (FILE* f = std::fopen(path.c_str(), "rb")) {
    const size_t got = std::fread(buf.data(), 1, bytes, f);
    std::fclose(f);
    if (got != bytes) {
      std::fprintf(stderr, "short read %s\n", path.c_str());
      std::exit(3);
    }
  }
  return buf;
}

void save(const char* dir, const char* name, const std::vector<unsigned char>& data) {
  const std::string path = std::string(dir) + "/" + name + ".out";
  if (FILE* f = std::fopen(path.c_str(), "wb")) {
    std::fwrite(data.data(), 1, data.size(), f);
    std::fclose(f);
  }
}

}  // namespace tk_emul
