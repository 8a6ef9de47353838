#include "kernels/cpu/exact_cosine.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "centroidkv/common/dtype.h"
#include "kernels/cpu/fp8_elements.h"

namespace centroidkv::cpu {
namespace {

double ToDouble(float v) { return v; }

template <typename Storage, typename Widen>
void WidenRow(const RowBlock& rows, int64_t r, int32_t dim, Widen widen, double* out) {
  const Storage* x = static_cast<const Storage*>(rows.data) + r * rows.stride;
  for (int32_t j = 0; j < dim; ++j) out[j] = widen(x[j]);
}

void WidenRowToDouble(const RowBlock& rows, int64_t r, int32_t dim, double* out) {
  switch (rows.type) {
    case ElemType::kF32:
      return WidenRow<float>(rows, r, dim, [](float v) { return ToDouble(v); }, out);
    case ElemType::kF16:
      return WidenRow<uint16_t>(rows, r, dim, [](uint16_t v) { return ToDouble(HalfToFloat(v)); },
                                out);
    case ElemType::kBF16:
      return WidenRow<uint16_t>(
          rows, r, dim, [](uint16_t v) { return ToDouble(BFloat16ToFloat(v)); }, out);
    case ElemType::kF64:
      return WidenRow<double>(rows, r, dim, [](double v) { return v; }, out);
    case ElemType::kE4M3:
    case ElemType::kE5M2:
      return WidenRow<uint8_t>(
          rows, r, dim, [&](uint8_t v) { return ToDouble(WidenFp8Element(rows, v)); }, out);
  }
}

double Finish(double dot, double norm_x, double norm_y) {
  return dot / (std::max(std::sqrt(norm_x), 1e-6) * std::max(std::sqrt(norm_y), 1e-6));
}

// kWays pairs at once: x against ys[0 .. kWays-1].
template <int kWays>
void CosinesTogether(const double* x, const double* const* ys, int32_t dim, double* out) {
  double dot[kWays] = {}, norm_y[kWays] = {};
  double norm_x = 0.0;
  for (int32_t j = 0; j < dim; ++j) {
    const double xj = x[j];
    norm_x += xj * xj;
    for (int w = 0; w < kWays; ++w) {
      const double yj = ys[w][j];
      dot[w] += xj * yj;
      norm_y[w] += yj * yj;
    }
  }
  for (int w = 0; w < kWays; ++w) out[w] = Finish(dot[w], norm_x, norm_y[w]);
}

}  // namespace

void CosinesOfWidened(const double* x, const double* const* ys, int32_t count, int32_t dim,
                      double* out) {
  int32_t k = 0;
  for (; k + 4 <= count; k += 4) CosinesTogether<4>(x, ys + k, dim, out + k);
  for (; k + 2 <= count; k += 2) CosinesTogether<2>(x, ys + k, dim, out + k);
  if (k < count) CosinesTogether<1>(x, ys + k, dim, out + k);
}

double ExactCosine(const RowBlock& rows, int64_t a, int64_t b, int32_t dim) {
  std::vector<double> x(static_cast<size_t>(dim)), y(static_cast<size_t>(dim));
  WidenRowToDouble(rows, a, dim, x.data());
  WidenRowToDouble(rows, b, dim, y.data());
  const double* ys[1] = {y.data()};
  double cosine = 0.0;
  CosinesOfWidened(x.data(), ys, 1, dim, &cosine);
  return cosine;
}

}  // namespace centroidkv::cpu
