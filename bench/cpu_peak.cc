// fp32 FMA peak: see cpu_peak.h. Each kernel keeps many independent accumulators (more than
// FMA latency x FMA ports) so that the FMA units, not the dependency chains, are the limit.
// The accumulators converge to a finite value (acc * 0.999999 + small), so there are no
// denormals or infinities, and the result is consumed so the loop cannot be removed.
#include "bench/cpu_peak.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>

#include "kernels/cpu/simd/amx_tiles.h"
#include "kernels/cpu/simd_dispatch.h"

namespace centroidkv::bench {
namespace {

// One independent FMA chain per accumulator; X(k) is repeated for every accumulator.
#define CKV_REPEAT_12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define CKV_REPEAT_24(X) \
  CKV_REPEAT_12(X) X(12) X(13) X(14) X(15) X(16) X(17) X(18) X(19) X(20) X(21) X(22) X(23)

// 24 zmm chains: FMA latency 4 x 2 ports needs 8; 24 leaves room and fits the 32 registers.
constexpr int64_t kAvx512Chains = 24;
constexpr int64_t kAvx512Lanes = 16;

__attribute__((target("avx512f"))) float FmaLoopAvx512(int64_t iterations, float seed) {
  const __m512 mul = _mm512_set1_ps(0.999999f);
  const __m512 add = _mm512_set1_ps(seed * 1e-7f);
#define CKV_DECLARE(k) __m512 acc##k = _mm512_set1_ps(seed + static_cast<float>(k));
  CKV_REPEAT_24(CKV_DECLARE)
#undef CKV_DECLARE
  for (int64_t i = 0; i < iterations; ++i) {
#define CKV_STEP(k) acc##k = _mm512_fmadd_ps(acc##k, mul, add);
    CKV_REPEAT_24(CKV_STEP)
#undef CKV_STEP
  }
  __m512 sum = _mm512_setzero_ps();
#define CKV_SUM(k) sum = _mm512_add_ps(sum, acc##k);
  CKV_REPEAT_24(CKV_SUM)
#undef CKV_SUM
  // (Not _mm512_reduce_add_ps: GCC 12 flags its internal _mm256_undefined_pd as
  // uninitialised under -Werror.)
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, sum);
  float total = 0.0f;
  for (float lane : lanes) total += lane;
  return total;
}

// 12 ymm chains (16 registers in all).
constexpr int64_t kAvx2Chains = 12;
constexpr int64_t kAvx2Lanes = 8;

__attribute__((target("avx2,fma"))) float FmaLoopAvx2(int64_t iterations, float seed) {
  const __m256 mul = _mm256_set1_ps(0.999999f);
  const __m256 add = _mm256_set1_ps(seed * 1e-7f);
#define CKV_DECLARE(k) __m256 acc##k = _mm256_set1_ps(seed + static_cast<float>(k));
  CKV_REPEAT_12(CKV_DECLARE)
#undef CKV_DECLARE
  for (int64_t i = 0; i < iterations; ++i) {
#define CKV_STEP(k) acc##k = _mm256_fmadd_ps(acc##k, mul, add);
    CKV_REPEAT_12(CKV_STEP)
#undef CKV_STEP
  }
  __m256 sum = _mm256_setzero_ps();
#define CKV_SUM(k) sum = _mm256_add_ps(sum, acc##k);
  CKV_REPEAT_12(CKV_SUM)
#undef CKV_SUM
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, sum);
  float total = 0.0f;
  for (float lane : lanes) total += lane;
  return total;
}

// Scalar multiply-add (the portable fallback; 2 flops per step, fused or not).
constexpr int64_t kScalarChains = 12;

float FmaLoopScalar(int64_t iterations, float seed) {
  const float mul = 0.999999f;
  const float add = seed * 1e-7f;
#define CKV_DECLARE(k) float acc##k = seed + static_cast<float>(k);
  CKV_REPEAT_12(CKV_DECLARE)
#undef CKV_DECLARE
  for (int64_t i = 0; i < iterations; ++i) {
#define CKV_STEP(k) acc##k = acc##k * mul + add;
    CKV_REPEAT_12(CKV_STEP)
#undef CKV_STEP
  }
  float sum = 0.0f;
#define CKV_SUM(k) sum += acc##k;
  CKV_REPEAT_12(CKV_SUM)
#undef CKV_SUM
  return sum;
}

// 16-bit integer multiply-adds, as the int16 match kernels issue them: AVX2 vpmaddwd (16
// int16 products summed pairwise into 8 int32 lanes) + vpaddd into the accumulator; AVX-512
// VNNI vpdpwssd (32 products into 16 lanes, accumulated in the same instruction). Inline asm
// keeps every product in the loop; int32 arithmetic wraps, so any values will do.
// Counted as 2 ops per product, the same unit as the fp32 flops.
constexpr int64_t kAvx2Int16OpsPerIteration = kAvx2Chains * 16 * 2;

__attribute__((target("avx2"))) float MaddLoopAvx2(int64_t iterations, float seed) {
  const __m256i mul = _mm256_set1_epi16(static_cast<int16_t>(3 + seed));
  const __m256i other = _mm256_set1_epi16(static_cast<int16_t>(5 - seed));
#define CKV_DECLARE(k) __m256i acc##k = _mm256_set1_epi32(static_cast<int32_t>(seed) + k);
  CKV_REPEAT_12(CKV_DECLARE)
#undef CKV_DECLARE
  for (int64_t i = 0; i < iterations; ++i) {
    // As in the match kernel, the products do not depend on the accumulators (the asm keeps
    // them in the loop); only the vpaddd chains do. Inline asm: with intrinsics GCC 12 keeps only
    // some of the 12 accumulators in registers and moves the others through the stack every step
    // (measured at half this rate).
#define CKV_STEP(k)                                        \
  asm("vpmaddwd %1, %2, %%ymm15\n\tvpaddd %%ymm15, %0, %0" \
      : "+x"(acc##k)                                       \
      : "x"(mul), "x"(other)                               \
      : "xmm15");
    CKV_REPEAT_12(CKV_STEP)
#undef CKV_STEP
  }
  __m256i sum = _mm256_setzero_si256();
#define CKV_SUM(k) sum = _mm256_add_epi32(sum, acc##k);
  CKV_REPEAT_12(CKV_SUM)
#undef CKV_SUM
  return static_cast<float>(_mm256_extract_epi32(sum, 0));
}

constexpr int64_t kAvx512Int16OpsPerIteration = kAvx512Chains * 32 * 2;

__attribute__((target("avx512f,avx512vnni"))) float DpwssdLoopAvx512(int64_t iterations,
                                                                     float seed) {
  const __m512i mul = _mm512_set1_epi16(static_cast<int16_t>(3 + seed));
  const __m512i other = _mm512_set1_epi16(static_cast<int16_t>(5 - seed));
#define CKV_DECLARE(k) __m512i acc##k = _mm512_set1_epi32(static_cast<int32_t>(seed) + k);
  CKV_REPEAT_24(CKV_DECLARE)
#undef CKV_DECLARE
  for (int64_t i = 0; i < iterations; ++i) {
    // Inline asm, as in kernels_avx512_vnni.cc: GCC 12's intrinsic copies the accumulator.
#define CKV_STEP(k) asm("vpdpwssd %1, %2, %0" : "+v"(acc##k) : "v"(mul), "v"(other));
    CKV_REPEAT_24(CKV_STEP)
#undef CKV_STEP
  }
  __m512i sum = _mm512_setzero_si512();
#define CKV_SUM(k) sum = _mm512_add_epi32(sum, acc##k);
  CKV_REPEAT_24(CKV_SUM)
#undef CKV_SUM
  alignas(64) int32_t lanes[16];
  _mm512_store_si512(lanes, sum);
  return static_cast<float>(lanes[0]);
}

#undef CKV_REPEAT_24
#undef CKV_REPEAT_12

// AMX: 4 accumulator tiles (16 x 16 fp32), each TDPBF16PS 16 x 16 x 32 products, with the
// cpu backend's tile configuration.
constexpr int64_t kAmxFlopsPerIteration = 4 * 16 * 16 * 32 * 2;

__attribute__((target("amx-tile,amx-bf16"))) float AmxLoop(int64_t iterations, float seed) {
  alignas(64) uint16_t operand[16 * 32];
  for (uint16_t& x : operand) x = 0x3c00;  // bf16 1/128: sums stay finite
  _tile_loadconfig(&cpu::kTileConfig);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, operand, 64);
  _tile_loadd(5, operand, 64);
  for (int64_t i = 0; i < iterations; ++i) {
    _tile_dpbf16ps(0, 4, 5);
    _tile_dpbf16ps(1, 4, 5);
    _tile_dpbf16ps(2, 4, 5);
    _tile_dpbf16ps(3, 4, 5);
  }
  alignas(64) float out[16 * 16];
  _tile_stored(0, out, 64);
  _tile_release();
  return out[0] + seed;
}

struct Kernel {
  float (*loop)(int64_t, float) = nullptr;
  int64_t flops_per_iteration = 0;  // chains x lanes x 2
};

Kernel KernelFor(const std::string& isa) {
  if (isa == "avx512") return {&FmaLoopAvx512, kAvx512Chains * kAvx512Lanes * 2};
  if (isa == "avx2") return {&FmaLoopAvx2, kAvx2Chains * kAvx2Lanes * 2};
  if (isa == "scalar") return {&FmaLoopScalar, kScalarChains * 2};
  throw std::invalid_argument("cpu_peak: unknown ISA '" + isa + "' (avx512, avx2, scalar)");
}

std::atomic<float> g_sink{0.0f};  // keeps the results alive

double Seconds(std::chrono::steady_clock::time_point from) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - from).count();
}

// Runs `iterations` on every thread at once; returns wall seconds from the common start to
// the last thread's end (thread creation is outside the timed span).
double RunAllThreads(const Kernel& kernel, int32_t threads, int64_t iterations) {
  std::atomic<bool> go{false};
  std::atomic<int32_t> ready{0};
  std::vector<std::thread> pool;
  pool.reserve(threads);
  for (int32_t t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      const float result = kernel.loop(iterations, 1.0f + static_cast<float>(t));
      g_sink.store(result, std::memory_order_relaxed);
    });
  }
  while (ready.load() < threads) std::this_thread::yield();
  const auto start = std::chrono::steady_clock::now();
  go.store(true, std::memory_order_release);
  for (std::thread& thread : pool) thread.join();
  return Seconds(start);
}

}  // namespace

std::vector<std::string> AvailablePeakIsas() {
  __builtin_cpu_init();
  std::vector<std::string> isas;
  if (__builtin_cpu_supports("avx512f")) isas.emplace_back("avx512");
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) isas.emplace_back("avx2");
  isas.emplace_back("scalar");
  return isas;
}

namespace {

PeakResult Measure(const Kernel& kernel, const std::string& isa, const PeakOptions& options) {
  PeakResult result;
  result.isa = isa;
  result.threads = options.threads > 0
                       ? options.threads
                       : static_cast<int32_t>(std::max(1u, std::thread::hardware_concurrency()));

  // Calibrate on one thread: grow the iteration count until one run takes >= 20 ms, then
  // scale it to the requested duration.
  int64_t iterations = 1 << 16;
  double seconds = 0.0;
  for (;;) {
    const auto start = std::chrono::steady_clock::now();
    g_sink.store(kernel.loop(iterations, 1.0f), std::memory_order_relaxed);
    seconds = Seconds(start);
    if (seconds >= 0.02 || iterations > (int64_t{1} << 40)) break;
    iterations *= 4;
  }
  iterations = std::max<int64_t>(
      1, static_cast<int64_t>(static_cast<double>(iterations) * options.min_seconds / seconds));

  const double flops = static_cast<double>(kernel.flops_per_iteration) *
                       static_cast<double>(iterations) * result.threads;
  for (int32_t rep = 0; rep < std::max(1, options.repetitions); ++rep) {
    const double elapsed = RunAllThreads(kernel, result.threads, iterations);
    const double gflops = flops / elapsed / 1e9;
    result.samples.push_back(gflops);
    result.gflops = std::max(result.gflops, gflops);
  }
  return result;
}

}  // namespace

PeakResult MeasureFp32Peak(const PeakOptions& options) {
  const std::vector<std::string> isas = AvailablePeakIsas();
  const std::string isa = options.isa.empty() ? isas.front() : options.isa;
  if (std::find(isas.begin(), isas.end(), isa) == isas.end()) {
    throw std::invalid_argument("cpu_peak: this CPU cannot run ISA " + isa);
  }
  return Measure(KernelFor(isa), isa, options);
}

std::optional<PeakResult> MeasureAmxBf16Peak(const PeakOptions& options) {
  // The same check (and request to the OS for the tile state) as the cpu backend's.
  if (!cpu::SimdLevelSupported(cpu::SimdLevel::kAmx)) return std::nullopt;
  return Measure(Kernel{&AmxLoop, kAmxFlopsPerIteration}, "amx-bf16", options);
}

std::optional<PeakResult> MeasureInt16Peak(const PeakOptions& options) {
  __builtin_cpu_init();
  const bool vnni = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vnni");
  const bool avx2 = __builtin_cpu_supports("avx2");
  if (options.isa == "avx512" && vnni) {
    return Measure(Kernel{&DpwssdLoopAvx512, kAvx512Int16OpsPerIteration}, "avx512-vnni", options);
  }
  if (options.isa == "avx2" && avx2) {
    return Measure(Kernel{&MaddLoopAvx2, kAvx2Int16OpsPerIteration}, "avx2", options);
  }
  return std::nullopt;
}

}  // namespace centroidkv::bench
