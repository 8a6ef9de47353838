// A RandomLayer quantised to fp8 codes with per-head scales, for the fp8 tests of every
// engine: the codes as an fp8 LayerView, and the same layer widened exactly as an engine must
// see it (each code's value times its head's scale, one float multiply) as a float32 view.
// Layout and counts are the source's. Thread-compatible: a plain value; views borrow it.
#pragma once

#include <cstdint>
#include <vector>

#include "centroidkv/common/dtype.h"
#include "centroidkv/kernels/engine.h"
#include "tests/testing/random_layer.h"

namespace centroidkv::test {

class Fp8Layer {
 public:
  // Each head's scale maps its largest magnitude to the format's maximum.
  static Fp8Layer From(const RandomLayer& source, DType dtype);

  LayerView Fp8View() const;   // the codes, with key_scales / value_scales
  LayerView WideView() const;  // float32: code value x scale

  // Overwrites the code of one element (its widened value follows); for bad-data tests.
  void SetKeyCode(int32_t head, int32_t token, int32_t dim, uint8_t code);
  void SetValueCode(int32_t head, int32_t token, int32_t dim, uint8_t code);

  std::vector<float> key_scales, value_scales;  // [H]; may be changed (WideView follows)

 private:
  void Widen() const;  // wide_keys_ / wide_values_ from the codes and the current scales

  DType dtype_ = DType::kFp8E4M3;
  LayerView shape_;  // the source's view: dims, layout, counts (which it borrows)
  std::vector<uint32_t> counts_;
  std::vector<uint8_t> key_codes_, value_codes_;
  mutable std::vector<float> wide_keys_, wide_values_;
};

}  // namespace centroidkv::test
