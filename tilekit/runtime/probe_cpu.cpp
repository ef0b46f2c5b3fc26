// Micro-benchmarks of `tk-hw probe` on a CPU (tilekit/runtime/probe_cpu.py builds this file with
// g++ -O3 -march=native -fopenmp and runs it; docs/hwprofiles.md, "Probing a CPU", says what
// each one measures).
//
//   probe_cpu info                                   the ISA the compiler targets, vector bytes
//   probe_cpu read BYTES REP_S REPS WARMUP           streaming reads of BYTES per thread
//   probe_cpu fma REP_S REPS WARMUP                  independent FMA chains per thread
//   probe_cpu clock REP_S REPS WARMUP                a chain of dependent integer adds
//   probe_cpu fmaclock REP_S REPS WARMUP             FMA and adds in turn: FLOP per clock
//   probe_cpu forkjoin REP_S REPS WARMUP             empty `omp parallel` regions
//
// Threads: OMP_NUM_THREADS (the Python side sets it, with OMP_PROC_BIND/OMP_PLACES pinning one
// thread per core). Every timed benchmark follows one recipe (`measure`): the work of one
// repetition grows until it takes a quarter of REP_S seconds, is scaled to take all of it, runs
// WARMUP times untimed, then REPS times timed. One line per timed repetition goes to stdout,
// `rep <work> <seconds>`, and the host takes the median rate. Each kernel folds what it computed
// into a value printed last (`check <value>`), so the compiler cannot drop the work.

#include <omp.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#define TK_ISA "avx512"
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define TK_ISA "avx2"
#elif defined(__ARM_FEATURE_SVE)
#include <arm_sve.h>
#define TK_ISA "sve"
#elif defined(__ARM_NEON)
#include <arm_neon.h>
#define TK_ISA "neon"
#else
#define TK_ISA "none"
#endif

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// -- the recipe --------------------------------------------------------------------------------

// `run(n)` does n units of work and returns the seconds it took (timed inside, so that a
// benchmark can leave set-up and barriers out). Prints `rep <units> <seconds>` per timed run.
template <class Run>
long calibrate(Run run, double rep_seconds) {
  long n = 1;
  double seconds = run(n);
  while (seconds < rep_seconds / 4 && n < (1L << 40)) {
    n *= 2;
    seconds = run(n);
  }
  if (seconds > 0) {
    const double scaled = n * rep_seconds / seconds;
    n = scaled < 1 ? 1 : static_cast<long>(scaled);
  }
  return n;
}

template <class Run>
void measure(Run run, double rep_seconds, int reps, int warmup) {
  const long n = calibrate(run, rep_seconds);
  for (int i = 0; i < warmup; ++i) run(n);
  for (int i = 0; i < reps; ++i) {
    const double s = run(n);
    std::printf("rep %ld %.9e\n", n, s);
  }
}

// -- vectors of the ISA --------------------------------------------------------------------------

#if defined(__AVX512F__)
constexpr int kVectorBytes = 64;
#elif defined(__AVX2__) && defined(__FMA__)
constexpr int kVectorBytes = 32;
#elif defined(__ARM_FEATURE_SVE)
// SVE's length is the machine's: read at run time (svcntb).
#else
constexpr int kVectorBytes = 16;
#endif

int vector_bytes() {
#if defined(__ARM_FEATURE_SVE)
  return static_cast<int>(svcntb());
#else
  return kVectorBytes;
#endif
}

// -- streaming reads ---------------------------------------------------------------------------

// Eight independent accumulators, one vector load folded into each by xor (one cycle of
// latency): the loads, not the arithmetic, set the pace. The empty asm with a memory clobber
// after each pass makes the compiler reload the buffer on the next pass instead of hoisting the
// loads out of the pass loop.
#if defined(__ARM_FEATURE_SVE)
uint32_t read_passes(const uint32_t* buf, size_t words, long passes) {
  const svbool_t all = svptrue_b32();
  const size_t step = svcntw();
  svuint32_t a0 = svdup_u32(0), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  for (long r = 0; r < passes; ++r) {
    for (size_t i = 0; i + 8 * step <= words; i += 8 * step) {
      a0 = sveor_u32_x(all, a0, svld1_u32(all, buf + i));
      a1 = sveor_u32_x(all, a1, svld1_u32(all, buf + i + step));
      a2 = sveor_u32_x(all, a2, svld1_u32(all, buf + i + 2 * step));
      a3 = sveor_u32_x(all, a3, svld1_u32(all, buf + i + 3 * step));
      a4 = sveor_u32_x(all, a4, svld1_u32(all, buf + i + 4 * step));
      a5 = sveor_u32_x(all, a5, svld1_u32(all, buf + i + 5 * step));
      a6 = sveor_u32_x(all, a6, svld1_u32(all, buf + i + 6 * step));
      a7 = sveor_u32_x(all, a7, svld1_u32(all, buf + i + 7 * step));
    }
    __asm__ volatile("" ::: "memory");
  }
  svuint32_t x = sveor_u32_x(all, sveor_u32_x(all, sveor_u32_x(all, a0, a1),
                                              sveor_u32_x(all, a2, a3)),
                             sveor_u32_x(all, sveor_u32_x(all, a4, a5),
                                         sveor_u32_x(all, a6, a7)));
  return static_cast<uint32_t>(sveorv_u32(all, x));
}
#else
typedef uint32_t vec_u32 __attribute__((vector_size(kVectorBytes)));

uint32_t read_passes(const uint32_t* buf, size_t words, long passes) {
  const vec_u32* p = reinterpret_cast<const vec_u32*>(buf);
  const size_t n = words / (kVectorBytes / 4);
  vec_u32 a0 = {}, a1 = {}, a2 = {}, a3 = {}, a4 = {}, a5 = {}, a6 = {}, a7 = {};
  for (long r = 0; r < passes; ++r) {
    for (size_t i = 0; i + 8 <= n; i += 8) {
      a0 ^= p[i];
      a1 ^= p[i + 1];
      a2 ^= p[i + 2];
      a3 ^= p[i + 3];
      a4 ^= p[i + 4];
      a5 ^= p[i + 5];
      a6 ^= p[i + 6];
      a7 ^= p[i + 7];
    }
    __asm__ volatile("" ::: "memory");
  }
  const vec_u32 x = ((a0 ^ a1) ^ (a2 ^ a3)) ^ ((a4 ^ a5) ^ (a6 ^ a7));
  uint32_t folded = 0;
  for (int k = 0; k < kVectorBytes / 4; ++k) folded ^= x[k];
  return folded;
}
#endif

// Every thread reads its own buffer of `bytes` (allocated and first touched by that thread, so
// it lives in the thread's NUMA node and its pages are mapped before timing). Work unit: one
// pass of every thread over its buffer; time: thread 0's, between two barriers.
int bench_read(size_t bytes, double rep_seconds, int reps, int warmup) {
  const int threads = omp_get_max_threads();
  const size_t chunk = 8 * static_cast<size_t>(vector_bytes());
  const size_t used = bytes / chunk * chunk;
  if (used == 0) {
    std::fprintf(stderr, "read: %zu bytes is less than one chunk of %zu\n", bytes, chunk);
    return 2;
  }
  std::vector<uint32_t*> buffers(threads, nullptr);
  std::vector<uint32_t> folded(threads, 0);
  bool failed = false;
#pragma omp parallel
  {
    const int t = omp_get_thread_num();
    void* p = nullptr;
    if (posix_memalign(&p, 4096, used) != 0) {
#pragma omp atomic write
      failed = true;
    } else {
      uint32_t* words = static_cast<uint32_t*>(p);
      for (size_t i = 0; i < used / 4; ++i) words[i] = static_cast<uint32_t>(i * 2654435761u + t);
      buffers[t] = words;
    }
  }
  if (failed) {
    std::fprintf(stderr, "read: cannot allocate %zu bytes per thread\n", used);
    return 2;
  }
  auto run = [&](long passes) {
    double seconds = 0;
#pragma omp parallel
    {
      const int t = omp_get_thread_num();
#pragma omp barrier
      const double start = now();
      folded[t] ^= read_passes(buffers[t], used / 4, passes);
#pragma omp barrier
      if (t == 0) seconds = now() - start;
    }
    return seconds;
  };
  std::printf("bytes_per_unit %zu\n", used * threads);
  measure(run, rep_seconds, reps, warmup);
  uint32_t check = 0;
  for (int t = 0; t < threads; ++t) {
    check ^= folded[t];
    std::free(buffers[t]);
  }
  std::printf("check %u\n", check);
  return 0;
}

// -- FMA ----------------------------------------------------------------------------------------

// Independent chains acc = acc * a + b in vector registers: enough of them to cover the FMA
// latency on every unit (4 cycles x 2 units needs 8; Arm's four 128-bit NEON pipes need 16),
// few enough to stay in the register file (16 registers on AVX2, 32 elsewhere, with a and b).
#define TK_REP12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define TK_REP20(X) TK_REP12(X) X(12) X(13) X(14) X(15) X(16) X(17) X(18) X(19)

#if defined(__AVX512F__)
#define TK_CHAINS 20
#define TK_REP TK_REP20
typedef __m512 vf;
#define TK_SET(x) _mm512_set1_ps(x)
#define TK_FMA(acc, a, b) _mm512_fmadd_ps(acc, a, b)
#define TK_ADD(x, y) _mm512_add_ps(x, y)
#define TK_SUM(x) _mm512_reduce_add_ps(x)
#elif defined(__AVX2__) && defined(__FMA__)
#define TK_CHAINS 12
#define TK_REP TK_REP12
typedef __m256 vf;
#define TK_SET(x) _mm256_set1_ps(x)
#define TK_FMA(acc, a, b) _mm256_fmadd_ps(acc, a, b)
#define TK_ADD(x, y) _mm256_add_ps(x, y)
inline float tk_sum(__m256 x) {
  float v[8];
  _mm256_storeu_ps(v, x);
  return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}
#define TK_SUM(x) tk_sum(x)
#elif defined(__ARM_FEATURE_SVE)
#define TK_CHAINS 20
#define TK_REP TK_REP20
typedef svfloat32_t vf;
#define TK_SET(x) svdup_f32(x)
#define TK_FMA(acc, a, b) svmad_f32_x(svptrue_b32(), acc, a, b)
#define TK_ADD(x, y) svadd_f32_x(svptrue_b32(), x, y)
#define TK_SUM(x) svaddv_f32(svptrue_b32(), x)
#elif defined(__ARM_NEON)
#define TK_CHAINS 20
#define TK_REP TK_REP20
typedef float32x4_t vf;
#define TK_SET(x) vdupq_n_f32(x)
#define TK_FMA(acc, a, b) vfmaq_f32(b, acc, a)
#define TK_ADD(x, y) vaddq_f32(x, y)
#define TK_SUM(x) vaddvq_f32(x)
#endif

#ifdef TK_CHAINS
// a and b come from the caller so that the compiler cannot fold the chains.
float fma_chains(long iters, float a_value, float b_value) {
  const vf a = TK_SET(a_value), b = TK_SET(b_value);
#define TK_DECL(i) vf acc##i = TK_SET(static_cast<float>(i));
  TK_REP(TK_DECL)
  for (long it = 0; it < iters; ++it) {
#define TK_STEP(i) acc##i = TK_FMA(acc##i, a, b);
    TK_REP(TK_STEP)
    TK_REP(TK_STEP)
  }
  vf sum = TK_SET(0.0f);
#define TK_FOLD(i) sum = TK_ADD(sum, acc##i);
  TK_REP(TK_FOLD)
  return TK_SUM(sum);
}

// Work unit: one loop trip of every thread, 2 x TK_CHAINS FMAs of a vector each.
int bench_fma(double rep_seconds, int reps, int warmup, float a, float b) {
  const int threads = omp_get_max_threads();
  std::vector<float> folded(threads, 0.0f);
  auto run = [&](long iters) {
    double seconds = 0;
#pragma omp parallel
    {
      const int t = omp_get_thread_num();
#pragma omp barrier
      const double start = now();
      folded[t] += fma_chains(iters, a, b);
#pragma omp barrier
      if (t == 0) seconds = now() - start;
    }
    return seconds;
  };
  const long lanes = vector_bytes() / 4;
  std::printf("flop_per_unit %ld\n", 2L * TK_CHAINS * lanes * 2 * threads);
  measure(run, rep_seconds, reps, warmup);
  float check = 0;
  for (float f : folded) check += f;
  std::printf("check %.6e\n", static_cast<double>(check));
  return 0;
}
#endif

// -- the clock ----------------------------------------------------------------------------------

// 100 dependent register-to-register adds per trip: one cycle each on every core this targets,
// and not an immediate add, which some renamers fold. The loop counter runs beside the chain.
unsigned long add_chain(long iters, unsigned long step) {
  unsigned long x = 0;
  for (long it = 0; it < iters; ++it) {
#if defined(__x86_64__)
    __asm__ volatile(".rept 100\n\taddq %1, %0\n\t.endr" : "+r"(x) : "r"(step));
#elif defined(__aarch64__)
    __asm__ volatile(".rept 100\n\tadd %0, %0, %1\n\t.endr" : "+r"(x) : "r"(step));
#endif
  }
  return x;
}

int bench_clock(double rep_seconds, int reps, int warmup) {
#if defined(__x86_64__) || defined(__aarch64__)
  unsigned long check = 0;
  auto run = [&](long iters) {
    const double start = now();
    check += add_chain(iters, 1);
    return now() - start;
  };
  std::printf("cycles_per_unit 100\n");
  measure(run, rep_seconds, reps, warmup);
  std::printf("check %lu\n", check);
  return 0;
#else
  std::fprintf(stderr, "clock: no add chain for this architecture\n");
  return 3;
#endif
}

// -- FMA per clock --------------------------------------------------------------------------------

// One thread alternates half a repetition of FMA chains with half a repetition of the add chain
// and prints both of each pair (`pair <flop> <seconds> <cycles> <seconds>`): their ratio, FLOP
// per clock, holds whatever the clock and whatever other work slowed both halves of a pair.
#ifdef TK_CHAINS
int bench_fma_per_clock(double rep_seconds, int reps, int warmup) {
  float folded = 0;
  unsigned long added = 0;
  auto fma = [&](long iters) {
    const double start = now();
    folded += fma_chains(iters, 0.999999f, 1e-6f);
    return now() - start;
  };
  auto adds = [&](long iters) {
    const double start = now();
    added += add_chain(iters, 1);
    return now() - start;
  };
  const long nf = calibrate(fma, rep_seconds / 2), nc = calibrate(adds, rep_seconds / 2);
  const long flop = 2L * TK_CHAINS * (vector_bytes() / 4) * 2;
  for (int i = 0; i < warmup; ++i) {
    fma(nf);
    adds(nc);
  }
  for (int i = 0; i < reps; ++i) {
    const double sf = fma(nf), sc = adds(nc);
    std::printf("pair %ld %.9e %ld %.9e\n", nf * flop, sf, nc * 100, sc);
  }
  std::printf("check %.6e %lu\n", static_cast<double>(folded), added);
  return 0;
}
#endif

// -- fork/join ------------------------------------------------------------------------------------

// Work unit: one empty parallel region on all threads (the fork, the implicit barrier, the join).
int bench_forkjoin(double rep_seconds, int reps, int warmup) {
  int check = 0;
#pragma omp parallel
  {
#pragma omp atomic
    check += 1;
  }
  auto run = [&](long regions) {
    const double start = now();
    for (long r = 0; r < regions; ++r) {
#pragma omp parallel
      { __asm__ volatile(""); }
    }
    return now() - start;
  };
  std::printf("threads %d\nregions_per_unit 1\n", omp_get_max_threads());
  measure(run, rep_seconds, reps, warmup);
  std::printf("check %d\n", check);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "info") == 0) {
    std::printf("isa %s\nvector_bytes %d\nthreads %d\n", TK_ISA, vector_bytes(),
                omp_get_max_threads());
    return 0;
  }
  const bool timed = argc >= 5;
  const double rep_seconds = timed ? std::atof(argv[argc - 3]) : 0;
  const int reps = timed ? std::atoi(argv[argc - 2]) : 0;
  const int warmup = timed ? std::atoi(argv[argc - 1]) : 0;
  if (timed && rep_seconds > 0 && reps > 0 && warmup >= 0) {
    if (argc == 6 && std::strcmp(argv[1], "read") == 0) {
      return bench_read(std::strtoull(argv[2], nullptr, 10), rep_seconds, reps, warmup);
    }
#ifdef TK_CHAINS
    if (argc == 5 && std::strcmp(argv[1], "fma") == 0) {
      return bench_fma(rep_seconds, reps, warmup, 0.999999f, 1e-6f);
    }
    if (argc == 5 && std::strcmp(argv[1], "fmaclock") == 0) {
      return bench_fma_per_clock(rep_seconds, reps, warmup);
    }
#endif
    if (argc == 5 && std::strcmp(argv[1], "clock") == 0) {
      return bench_clock(rep_seconds, reps, warmup);
    }
    if (argc == 5 && std::strcmp(argv[1], "forkjoin") == 0) {
      return bench_forkjoin(rep_seconds, reps, warmup);
    }
  }
  std::fprintf(stderr,
               "usage: probe_cpu info | read BYTES | fma | clock | forkjoin, "
               "then REP_SECONDS REPS WARMUP\n");
  return 2;
}
