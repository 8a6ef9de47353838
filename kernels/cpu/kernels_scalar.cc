// The portable kernels: plain C++ for any x86-64 (or other) CPU, and the yardstick the SIMD
// kernels are tested against. Panels are 8 wide; every A row is matched on its own, and the
// dot products are plain float sums (products and sums, no FMA).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "centroidkv/common/dtype.h"
#include "kernels/cpu/fp8_elements.h"
#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/rows_finite.h"

namespace centroidkv::cpu {
namespace {

constexpr int32_t kPanelWidth = 8;

// Calls fn(j, value) for elements begin <= j < end of row `r`, widened to double (exactly).
template <typename Fn>
void ForEachElement(const RowBlock& rows, int64_t r, int32_t begin, int32_t end, Fn fn) {
  switch (rows.type) {
    case ElemType::kF32: {
      const float* p = static_cast<const float*>(rows.data) + r * rows.stride;
      for (int32_t j = begin; j < end; ++j) fn(j, static_cast<double>(p[j]));
      return;
    }
    case ElemType::kF16: {
      const uint16_t* p = static_cast<const uint16_t*>(rows.data) + r * rows.stride;
      for (int32_t j = begin; j < end; ++j) fn(j, static_cast<double>(HalfToFloat(p[j])));
      return;
    }
    case ElemType::kBF16: {
      const uint16_t* p = static_cast<const uint16_t*>(rows.data) + r * rows.stride;
      for (int32_t j = begin; j < end; ++j) {
        fn(j, static_cast<double>(BFloat16ToFloat(p[j])));
      }
      return;
    }
    case ElemType::kF64: {
      const double* p = static_cast<const double*>(rows.data) + r * rows.stride;
      for (int32_t j = begin; j < end; ++j) fn(j, p[j]);
      return;
    }
    case ElemType::kE4M3:
    case ElemType::kE5M2: {
      const uint8_t* p = static_cast<const uint8_t*>(rows.data) + r * rows.stride;
      for (int32_t j = begin; j < end; ++j) {
        fn(j, static_cast<double>(WidenFp8Element(rows, p[j])));
      }
      return;
    }
  }
}

bool WidenRows(const RowBlock* rows, int64_t first, int32_t count, int32_t dim, float* out,
               float* inverse_norms) {
  bool exact = true;
  for (int32_t i = 0; i < count; ++i) {
    const int64_t r = first + i;
    float* dst = out + static_cast<int64_t>(i) * dim;
    double sum_squares = 0.0;
    ForEachElement(*rows, r, 0, dim, [&](int32_t j, double x) {
      dst[j] = static_cast<float>(x);
      sum_squares += x * x;
    });
    const double norm = std::max(std::sqrt(sum_squares), 1e-6);
    if (sum_squares <= 3.0e38) {
      inverse_norms[i] = static_cast<float>(1.0 / norm);
    } else {  // keep the inverse norm a normal float: normalise the row itself
      ForEachElement(*rows, r, 0, dim,
                     [&](int32_t j, double x) { dst[j] = static_cast<float>(x / norm); });
      inverse_norms[i] = 1.0f;
      exact = false;
    }
  }
  return exact;
}

void PackPanels(const float* rows, int64_t row_stride, const float* inverse_norms,
                int64_t norm_stride, int32_t count, int32_t dim, float* panels) {
  const int32_t num_panels = (count + kPanelWidth - 1) / kPanelWidth;
  for (int32_t p = 0; p < num_panels; ++p) {
    float* panel = panels + static_cast<int64_t>(p) * dim * kPanelWidth;
    for (int32_t l = 0; l < kPanelWidth; ++l) {
      const int64_t row = int64_t{p} * kPanelWidth + l;
      const float scale = row < count ? inverse_norms[row * norm_stride] : 0.0f;
      for (int32_t j = 0; j < dim; ++j) {
        panel[j * kPanelWidth + l] = row < count ? rows[row * row_stride + j] * scale : 0.0f;
      }
    }
  }
}

// Score of `a` against destination b: a sequential float sum over j.
float Dot(const float* a, const float* panels, int32_t b, int32_t dim) {
  const float* column =
      panels + static_cast<int64_t>(b / kPanelWidth) * dim * kPanelWidth + b % kPanelWidth;
  float sum = 0.0f;
  for (int32_t j = 0; j < dim; ++j) sum += a[j] * column[j * kPanelWidth];
  return sum;
}

void MatchRows(const float* a, int64_t a_stride, const float* a_inverse_norms, int64_t norm_stride,
               int32_t a_count, const float* panels, int32_t b_count, int32_t dim,
               const PrefetchRanges* /*prefetch: the portable kernels leave it to the CPU*/,
               const StopCheck* stop, RowMatch* out) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  constexpr int32_t kStopBlock = 1024;  // destinations between two polls
  StopPoller poller(stop);
  for (int32_t i = 0; i < a_count; ++i) {
    const float* row = a + i * a_stride;
    RowMatch match{0, kNegInf, kNegInf};
    for (int32_t b = 0; b < b_count; ++b) {
      if (b % kStopBlock == 0 &&
          poller.Stopped(int64_t{std::min(kStopBlock, b_count - b)} * dim)) {
        return;
      }
      const float score = Dot(row, panels, b, dim);
      if (score > match.first) {
        match.second = match.first;
        match.first = score;
        match.best = b;
      } else {
        match.second = std::max(match.second, score);
      }
    }
    const float scale = a_inverse_norms[i * norm_stride];
    match.first *= scale;
    match.second *= scale;
    out[i] = match;
  }
}

void ScoreRow(const float* a, float a_inverse_norm, const float* panels, int32_t b_count,
              int32_t dim, float* scores) {
  for (int32_t b = 0; b < b_count; ++b) scores[b] = Dot(a, panels, b, dim) * a_inverse_norm;
}

// The reference engine's order: sum = c_0 * x_0, then sum += c_k * x_k, then sum / total.
template <typename Out>
void MergeRow(const RowBlock* rows, const MergeTerm* terms, int32_t num_terms, double total,
              int32_t dim, Out* out) {
  constexpr int32_t kBlock = 256;
  double sums[kBlock];
  for (int32_t j0 = 0; j0 < dim; j0 += kBlock) {
    const int32_t j1 = std::min(j0 + kBlock, dim);
    for (int32_t k = 0; k < num_terms; ++k) {
      const double c = terms[k].count;
      ForEachElement(*rows, terms[k].row, j0, j1, [&](int32_t j, double x) {
        const double term = c * x;
        sums[j - j0] = k == 0 ? term : sums[j - j0] + term;
      });
    }
    for (int32_t j = j0; j < j1; ++j) out[j] = static_cast<Out>(sums[j - j0] / total);
  }
}

template <typename Out>
void ConvertRow(const RowBlock* rows, int64_t row, int32_t dim, Out* out) {
  ForEachElement(*rows, row, 0, dim, [&](int32_t j, double x) { out[j] = static_cast<Out>(x); });
}

void ConvertRows(const RowBlock* rows, int64_t first, int32_t count, int32_t dim, float* out) {
  for (int32_t i = 0; i < count; ++i) {
    ConvertRow<float>(rows, first + i, dim, out + static_cast<int64_t>(i) * dim);
  }
}

bool StreamFloats(const float* in, int64_t count, float* out) {
  std::copy(in, in + count, out);
  bool finite = true;
  for (int64_t i = 0; i < count; ++i) finite &= std::isfinite(in[i]);
  return finite;
}

uint32_t StreamHalves(const float* in, int64_t count, ElemType type, uint16_t* out) {
  const uint32_t overflow = HalfOverflowBits(type);
  uint32_t flags = 0;
  for (int64_t i = 0; i < count; ++i) {
    out[i] = type == ElemType::kF16 ? FloatToHalf(in[i]) : FloatToBFloat16(in[i]);
    uint32_t bits;
    std::memcpy(&bits, in + i, sizeof(bits));
    flags |= std::isfinite(in[i]) ? 0 : kStreamedNonFinite;
    flags |= (bits & 0x7fffffffu) >= overflow ? kStreamedBeyondRange : 0;
  }
  return flags;
}

float AddMax(float* x, const float* bias, int64_t count) {
  float best = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < count; ++i) {
    x[i] += bias[i];
    best = std::max(best, x[i]);
  }
  return best;
}

float ExpSubSum(float* x, float shift, int64_t count) {
  float sum = 0.0f;
  for (int64_t i = 0; i < count; ++i) {
    x[i] = std::exp(std::clamp(x[i] - shift, -87.3f, 88.7f));
    sum += x[i];
  }
  return sum;
}

}  // namespace

bool Fp8RowsWidenFinite(const RowBlock& rows, int64_t first, int32_t count, int32_t dim) {
  for (int32_t i = 0; i < count; ++i) {
    const uint8_t* row = static_cast<const uint8_t*>(rows.data) + (first + i) * rows.stride;
    for (int32_t j = 0; j < dim; ++j) {
      if (!std::isfinite(WidenFp8Element(rows, row[j]))) return false;
    }
  }
  return true;
}

namespace internal {

const KernelTable& ScalarKernels() {
  static const KernelTable table{"scalar",          kPanelWidth,        1,
                                 WidenRows,         PackPanels,         MatchRows,
                                 ScoreRow,          MergeRow<float>,    MergeRow<double>,
                                 ConvertRow<float>, ConvertRow<double>, ConvertRows,
                                 RowsFinite,        StreamFloats,       StreamHalves,
                                 nullptr,           nullptr,            0,
                                 AddMax,            ExpSubSum};
  return table;
}

}  // namespace internal
}  // namespace centroidkv::cpu
