// This machine's fp32 FMA ceiling, measured rather than read from a data sheet: every
// hardware thread runs independent chains of fused multiply-adds in the widest vector ISA
// the CPU offers (AVX-512, else AVX2+FMA, else scalar), all at once. The benchmark divides
// its own GFLOP/s by this number, so "fraction of peak" is relative to the same machine, in
// the same process run, under the same frequency licence and neighbours.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace centroidkv::bench {

struct PeakOptions {
  int32_t threads = 0;      // 0: std::thread::hardware_concurrency()
  int32_t repetitions = 5;  // best of these
  double min_seconds = 0.1; // per repetition (the iteration count is calibrated to it)
  std::string isa;          // "" = widest available; or "avx512", "avx2", "scalar"
};

struct PeakResult {
  double gflops = 0.0;             // best repetition, 2 flops per FMA lane, all threads
  std::string isa;                 // "avx512", "avx2" or "scalar"
  int32_t threads = 0;
  std::vector<double> samples;     // GFLOP/s of every repetition
};

// The ISAs this CPU can run, widest first.
std::vector<std::string> AvailablePeakIsas();

// Runs the measurement (blocks for about repetitions * min_seconds).
PeakResult MeasureFp32Peak(const PeakOptions& options = {});

// Not an fp32 peak: the AMX matrix engine's rate of bf16 products accumulated in fp32
// (TDPBF16PS on four independent accumulator tiles, 2 flops per product), all threads at
// once; isa "amx-bf16". Context for the cpu backend's matrix-engine level, which spends three
// bf16 products per fp32-equivalent product (kernels/cpu/simd/kernels_amx.cc). nullopt where
// the CPU or the OS offers no AMX. options.isa is ignored.
std::optional<PeakResult> MeasureAmxBf16Peak(const PeakOptions& options = {});

// Not an fp32 peak either: the rate of 16-bit integer multiply-adds the int16 match kernels
// issue (KernelTable::match_int16, kernels/cpu/simd/match_int16_simd.h), 2 ops per product,
// all threads at once: options.isa "avx2" (vpmaddwd + vpaddd) or "avx512" (vpdpwssd, isa
// "avx512-vnni" in the result). Context for the int16 levels: the ceiling of their match
// kernel. nullopt where the CPU lacks the instructions or options.isa names neither.
std::optional<PeakResult> MeasureInt16Peak(const PeakOptions& options);

}  // namespace centroidkv::bench
