#include "kernels/cpu/exact_cosine.h"

#include <algorithm>
#include <cmath>

#include "centroidkv/common/dtype.h"

namespace centroidkv::cpu {
namespace {

template <typename Storage, typename Widen>
double CosineOf(const RowBlock& rows, int64_t a, int64_t b, int32_t dim, Widen widen) {
  const Storage* x = static_cast<const Storage*>(rows.data) + a * rows.stride;
  const Storage* y = static_cast<const Storage*>(rows.data) + b * rows.stride;
  double dot = 0.0, norm_x = 0.0, norm_y = 0.0;
  for (int32_t j = 0; j < dim; ++j) {
    const double xj = widen(x[j]);
    const double yj = widen(y[j]);
    dot += xj * yj;
    norm_x += xj * xj;
    norm_y += yj * yj;
  }
  return dot / (std::max(std::sqrt(norm_x), 1e-6) * std::max(std::sqrt(norm_y), 1e-6));
}

}  // namespace

double ExactCosine(const RowBlock& rows, int64_t a, int64_t b, int32_t dim) {
  switch (rows.type) {
    case ElemType::kF32:
      return CosineOf<float>(rows, a, b, dim, [](float v) { return static_cast<double>(v); });
    case ElemType::kF16:
      return CosineOf<uint16_t>(rows, a, b, dim,
                                [](uint16_t v) { return static_cast<double>(HalfToFloat(v)); });
    case ElemType::kBF16:
      return CosineOf<uint16_t>(rows, a, b, dim,
                                [](uint16_t v) { return static_cast<double>(BFloat16ToFloat(v)); });
    case ElemType::kF64:
      return CosineOf<double>(rows, a, b, dim, [](double v) { return v; });
  }
  return 0.0;
}

}  // namespace centroidkv::cpu
