// Tests of common/dtype.cc: fp16 and bf16 conversions, checked exhaustively against
// independent formulas and brute-force round-to-nearest-even, plus known values.
#include "centroidkv/common/dtype.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace centroidkv {

// Readable test parameters in failure messages (found by ADL in DType's namespace).
static void PrintTo(DType dtype, std::ostream* os) { *os << DTypeName(dtype); }

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

bool IsHalfNaN(uint16_t bits) { return (bits & 0x7c00u) == 0x7c00u && (bits & 0x3ffu) != 0; }
bool IsBFloat16NaN(uint16_t bits) { return (bits & 0x7f80u) == 0x7f80u && (bits & 0x7fu) != 0; }

// The value of a binary16 pattern from its definition (not from the code under test).
double HalfValueByFormula(uint16_t bits) {
  const double sign = (bits & 0x8000u) ? -1.0 : 1.0;
  const int exponent = (bits >> 10) & 0x1f;
  const int mantissa = bits & 0x3ff;
  if (exponent == 0x1f) return mantissa == 0 ? sign * HUGE_VAL : std::nan("");
  if (exponent == 0) return sign * std::ldexp(mantissa, -24);
  return sign * std::ldexp(1024 + mantissa, exponent - 25);
}

// Magnitude of the non-negative finite-or-infinite pattern `bits` (<= 0x7c00) for rounding:
// 0x7c00 stands for 2^16, the value the next exponent would have.
double HalfMagnitude(uint16_t bits) { return bits == 0x7c00u ? 65536.0 : HalfValueByFormula(bits); }

// Round to nearest, ties to even, by search over the ordered non-negative half patterns.
uint16_t ReferenceFloatToHalf(float x) {
  const uint16_t sign = std::signbit(x) ? 0x8000u : 0u;
  const double a = std::fabs(static_cast<double>(x));
  uint16_t lo = 0, hi = 0x7c00u;  // invariant: value(lo) <= a < value(hi), or a is huge
  if (a >= 65536.0) return sign | 0x7c00u;
  while (hi - lo > 1) {
    const uint16_t mid = static_cast<uint16_t>((lo + hi) / 2);
    (HalfMagnitude(mid) <= a ? lo : hi) = mid;
  }
  const double below = a - HalfMagnitude(lo), above = HalfMagnitude(hi) - a;
  if (below < above) return sign | lo;
  if (above < below) return sign | hi;
  return sign | ((lo & 1u) ? hi : lo);
}

// The same for bf16: the candidates are the truncation and the next pattern up.
uint16_t ReferenceFloatToBFloat16(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint16_t lo = static_cast<uint16_t>((bits & 0x7fffffffu) >> 16);
  const uint16_t hi = static_cast<uint16_t>(lo + 1);
  const double a = std::fabs(static_cast<double>(x));
  const double value_lo = BFloat16ToFloat(lo);
  const double value_hi = hi == 0x7f80u ? std::ldexp(1.0, 128) : BFloat16ToFloat(hi);
  const double below = a - value_lo, above = value_hi - a;
  if (below < above) return sign | lo;
  if (above < below) return sign | hi;
  return sign | ((lo & 1u) ? hi : lo);
}

TEST(DTypeTest, SizesAndNames) {
  EXPECT_EQ(DTypeSize(DType::kFloat32), 4);
  EXPECT_EQ(DTypeSize(DType::kFloat16), 2);
  EXPECT_EQ(DTypeSize(DType::kBFloat16), 2);
  EXPECT_EQ(DTypeName(DType::kFloat32), "float32");
  EXPECT_EQ(DTypeName(DType::kFloat16), "float16");
  EXPECT_EQ(DTypeName(DType::kBFloat16), "bfloat16");
}

TEST(HalfTest, EveryPatternWidensAsDefined) {
  for (uint32_t bits = 0; bits <= 0xffffu; ++bits) {
    const uint16_t half = static_cast<uint16_t>(bits);
    const float widened = HalfToFloat(half);
    if (IsHalfNaN(half)) {
      EXPECT_TRUE(std::isnan(widened)) << "half 0x" << std::hex << bits;
      continue;
    }
    const double expected = HalfValueByFormula(half);
    EXPECT_EQ(static_cast<double>(widened), expected) << "half 0x" << std::hex << bits;
    EXPECT_EQ(std::signbit(widened), (bits & 0x8000u) != 0) << "half 0x" << std::hex << bits;
  }
}

TEST(HalfTest, EveryPatternRoundTripsExceptNaN) {
  for (uint32_t bits = 0; bits <= 0xffffu; ++bits) {
    const uint16_t half = static_cast<uint16_t>(bits);
    const uint16_t back = FloatToHalf(HalfToFloat(half));
    if (IsHalfNaN(half)) {
      EXPECT_TRUE(IsHalfNaN(back)) << "half 0x" << std::hex << bits << " -> 0x" << back;
      EXPECT_EQ(back & 0x8000u, half & 0x8000u) << "NaN sign of half 0x" << std::hex << bits;
    } else {
      EXPECT_EQ(back, half) << "half 0x" << std::hex << bits;
    }
  }
}

TEST(HalfTest, KnownValues) {
  EXPECT_EQ(HalfToFloat(0x3c00), 1.0f);
  EXPECT_EQ(HalfToFloat(0xc000), -2.0f);
  EXPECT_EQ(HalfToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));     // smallest subnormal
  EXPECT_EQ(HalfToFloat(0x03ff), std::ldexp(1023.0f, -24));  // largest subnormal
  EXPECT_EQ(HalfToFloat(0x0400), std::ldexp(1.0f, -14));     // smallest normal
  EXPECT_EQ(HalfToFloat(0x3555), 0.333251953125f);
  EXPECT_EQ(HalfToFloat(0x7c00), kInf);
  EXPECT_EQ(HalfToFloat(0xfc00), -kInf);
  EXPECT_TRUE(std::signbit(HalfToFloat(0x8000)));
  EXPECT_EQ(HalfToFloat(0x8000), 0.0f);

  EXPECT_EQ(FloatToHalf(0.1f), 0x2e66);
  EXPECT_EQ(FloatToHalf(-65504.0f), 0xfbff);
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(FloatToHalf(kInf), 0x7c00);
  EXPECT_EQ(FloatToHalf(-kInf), 0xfc00);
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::denorm_min()), 0x0000);
}

TEST(HalfTest, TiesRoundToEven) {
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // 1 + ulp/2: down
  EXPECT_EQ(FloatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // 1 + 3 ulp/2: up
  EXPECT_EQ(FloatToHalf(std::nextafter(1.0f + std::ldexp(1.0f, -11), 2.0f)), 0x3c01);
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -25)), 0x0000);  // half the smallest subnormal
  EXPECT_EQ(FloatToHalf(-std::ldexp(1.0f, -25)), 0x8000);
  EXPECT_EQ(FloatToHalf(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(FloatToHalf(3 * std::ldexp(1.0f, -25)), 0x0002);  // 1.5 subnormal ulps: even
  EXPECT_EQ(FloatToHalf(5 * std::ldexp(1.0f, -25)), 0x0002);  // 2.5: even
  // The largest subnormal plus half an ulp rounds up into the smallest normal.
  EXPECT_EQ(FloatToHalf(std::ldexp(2047.0f, -25)), 0x0400);
}

TEST(HalfTest, OverflowsToInfinity) {
  EXPECT_EQ(FloatToHalf(65519.0f), 0x7bff);  // below the midpoint to 2^16
  EXPECT_EQ(FloatToHalf(std::nextafter(65520.0f, 0.0f)), 0x7bff);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);  // the tie goes to the even "2^16" = inf
  EXPECT_EQ(FloatToHalf(-65520.0f), 0xfc00);
  EXPECT_EQ(FloatToHalf(1e10f), 0x7c00);
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::max()), 0x7c00);
  EXPECT_EQ(FloatToHalf(-1e10f), 0xfc00);
}

TEST(HalfTest, NaNStaysNaN) {
  const float nans[] = {std::numeric_limits<float>::quiet_NaN(),
                        -std::numeric_limits<float>::quiet_NaN(),
                        std::bit_cast<float>(0x7f800001u),  // signalling, low payload only
                        std::bit_cast<float>(0xff800001u)};
  for (float nan : nans) {
    const uint16_t half = FloatToHalf(nan);
    EXPECT_TRUE(IsHalfNaN(half)) << "0x" << std::hex << std::bit_cast<uint32_t>(nan);
    EXPECT_EQ((half & 0x8000u) != 0, std::signbit(nan));
  }
}

// Every midpoint between neighbouring halves (both signs) and the floats just around it.
TEST(HalfTest, EveryMidpointRoundsToEven) {
  for (uint32_t lo = 0; lo < 0x7c00u; ++lo) {
    const uint32_t hi = lo + 1;
    const double mid =
        (HalfMagnitude(static_cast<uint16_t>(lo)) + HalfMagnitude(static_cast<uint16_t>(hi))) / 2;
    const float midpoint = static_cast<float>(mid);
    ASSERT_EQ(static_cast<double>(midpoint), mid) << "midpoint not exact in float";
    const uint16_t even = static_cast<uint16_t>((lo & 1u) ? hi : lo);
    for (float sign : {1.0f, -1.0f}) {
      const uint16_t sign_bit = sign < 0 ? 0x8000u : 0u;
      EXPECT_EQ(FloatToHalf(sign * midpoint), sign_bit | even) << "half 0x" << std::hex << lo;
      EXPECT_EQ(FloatToHalf(sign * std::nextafter(midpoint, 0.0f)), sign_bit | lo)
          << "half 0x" << std::hex << lo;
      EXPECT_EQ(FloatToHalf(sign * std::nextafter(midpoint, kInf)), sign_bit | hi)
          << "half 0x" << std::hex << lo;
    }
  }
}

// A sweep over float bit patterns of every exponent against brute-force rounding.
TEST(HalfTest, FloatSweepMatchesBruteForceRounding) {
  int failures = 0;
  for (uint64_t bits = 0; bits <= 0xffffffffu && failures < 10; bits += 2039) {
    const float x = std::bit_cast<float>(static_cast<uint32_t>(bits));
    if (std::isnan(x)) continue;
    const uint16_t expected = ReferenceFloatToHalf(x);
    const uint16_t actual = FloatToHalf(x);
    if (actual != expected) {
      ++failures;
      ADD_FAILURE() << "FloatToHalf(" << x << " = 0x" << std::hex << bits << ") = 0x" << actual
                    << ", expected 0x" << expected;
    }
  }
}

// The bulk forms agree bit for bit with the scalar ones (NaNs included) for every dtype, at
// every length and offset (vector body and scalar tail).
TEST(BulkConvertTest, MatchesTheScalarConversionsBitForBit) {
  std::vector<float> floats;
  for (uint64_t bits = 0; bits <= 0xffffffffu; bits += 40009) {
    floats.push_back(std::bit_cast<float>(static_cast<uint32_t>(bits)));
  }
  for (uint32_t h = 0; h <= 0xffffu; h += 7) floats.push_back(HalfToFloat(static_cast<uint16_t>(h)));
  floats.push_back(std::bit_cast<float>(0x7f800001u));  // a signalling NaN
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFp8E4M3,
                      DType::kFp8E5M2}) {
    const int64_t n = static_cast<int64_t>(floats.size());
    std::vector<uint8_t> bulk(static_cast<size_t>(n + 3) * DTypeSize(dtype), 0xab);
    std::vector<uint8_t> scalar = bulk;
    StoreFromFloats(bulk.data(), dtype, 3, n, floats.data());
    for (int64_t i = 0; i < n; ++i) StoreFromFloat(scalar.data(), dtype, 3 + i, floats[i]);
    ASSERT_EQ(bulk, scalar) << DTypeName(dtype);
    for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{8}, int64_t{13}, n}) {
      std::vector<float> wide(static_cast<size_t>(count) + 1, -1.0f);
      LoadAsFloats(bulk.data(), dtype, 3, count, wide.data());
      for (int64_t i = 0; i < count; ++i) {
        ASSERT_EQ(std::bit_cast<uint32_t>(wide[i]),
                  std::bit_cast<uint32_t>(LoadAsFloat(bulk.data(), dtype, 3 + i)))
            << DTypeName(dtype) << " element " << i;
      }
      EXPECT_EQ(wide[count], -1.0f) << "wrote past count";
    }
  }
}

TEST(BFloat16Test, EveryPatternRoundTripsExceptNaN) {
  for (uint32_t bits = 0; bits <= 0xffffu; ++bits) {
    const uint16_t bf16 = static_cast<uint16_t>(bits);
    const float widened = BFloat16ToFloat(bf16);
    EXPECT_EQ(std::bit_cast<uint32_t>(widened), bits << 16) << "bf16 0x" << std::hex << bits;
    const uint16_t back = FloatToBFloat16(widened);
    if (IsBFloat16NaN(bf16)) {
      EXPECT_TRUE(IsBFloat16NaN(back)) << "bf16 0x" << std::hex << bits;
      EXPECT_EQ(back & 0x8000u, bf16 & 0x8000u) << "NaN sign of bf16 0x" << std::hex << bits;
    } else {
      EXPECT_EQ(back, bf16) << "bf16 0x" << std::hex << bits;
    }
  }
}

TEST(BFloat16Test, KnownRoundings) {
  EXPECT_EQ(FloatToBFloat16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBFloat16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);      // tie: down to even
  EXPECT_EQ(FloatToBFloat16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);  // tie: up to even
  EXPECT_EQ(FloatToBFloat16(std::nextafter(1.0f + std::ldexp(1.0f, -8), 2.0f)), 0x3f81);
  EXPECT_EQ(FloatToBFloat16(-2.0f), 0xc000);
  EXPECT_EQ(FloatToBFloat16(std::numeric_limits<float>::max()), 0x7f80);  // overflow to inf
  EXPECT_EQ(FloatToBFloat16(-std::numeric_limits<float>::max()), 0xff80);
  EXPECT_EQ(FloatToBFloat16(kInf), 0x7f80);
  EXPECT_EQ(FloatToBFloat16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(FloatToBFloat16(std::bit_cast<float>(0x00018000u)), 0x0002);  // subnormal tie
  EXPECT_TRUE(IsBFloat16NaN(FloatToBFloat16(std::bit_cast<float>(0x7f800001u))));
  EXPECT_TRUE(IsBFloat16NaN(FloatToBFloat16(std::bit_cast<float>(0xff800001u))));
  EXPECT_TRUE(IsBFloat16NaN(FloatToBFloat16(std::numeric_limits<float>::quiet_NaN())));
}

TEST(BFloat16Test, FloatSweepMatchesBruteForceRounding) {
  int failures = 0;
  for (uint64_t bits = 0; bits <= 0xffffffffu && failures < 10; bits += 1021) {
    const float x = std::bit_cast<float>(static_cast<uint32_t>(bits));
    if (std::isnan(x) || std::isinf(x)) continue;
    const uint16_t expected = ReferenceFloatToBFloat16(x);
    const uint16_t actual = FloatToBFloat16(x);
    if (actual != expected) {
      ++failures;
      ADD_FAILURE() << "FloatToBFloat16(" << x << " = 0x" << std::hex << bits << ") = 0x" << actual
                    << ", expected 0x" << expected;
    }
  }
}

class LoadStoreTest : public ::testing::TestWithParam<DType> {};

TEST_P(LoadStoreTest, StoreRoundsOnceAndLoadWidens) {
  const DType dtype = GetParam();
  const float inputs[] = {0.0f, -1.5f, 3.14159265f, 1e-6f, -65504.0f, 0.1f};
  uint8_t buffer[sizeof(inputs)] = {};
  for (int i = 0; i < 6; ++i) StoreFromFloat(buffer, dtype, i, inputs[i]);
  for (int i = 0; i < 6; ++i) {
    float expected = inputs[i];
    if (dtype == DType::kFloat16) expected = HalfToFloat(FloatToHalf(inputs[i]));
    if (dtype == DType::kBFloat16) expected = BFloat16ToFloat(FloatToBFloat16(inputs[i]));
    if (IsFp8(dtype)) expected = Fp8ToFloat(FloatToFp8(inputs[i], dtype), dtype);
    EXPECT_EQ(LoadAsFloat(buffer, dtype, i), expected) << "element " << i;
  }
}

TEST_P(LoadStoreTest, StoreTouchesOnlyItsElement) {
  const DType dtype = GetParam();
  const int32_t size = DTypeSize(dtype);
  uint8_t buffer[16];
  std::fill(std::begin(buffer), std::end(buffer), uint8_t{0xaa});
  StoreFromFloat(buffer, dtype, 1, -2.0f);
  for (int32_t i = 0; i < 16; ++i) {
    if (i < size || i >= 2 * size) {
      EXPECT_EQ(buffer[i], 0xaa) << "byte " << i;
    }
  }
  EXPECT_EQ(LoadAsFloat(buffer, dtype, 1), -2.0f);
}

INSTANTIATE_TEST_SUITE_P(AllTypes, LoadStoreTest,
                         ::testing::Values(DType::kFloat32, DType::kFloat16, DType::kBFloat16,
                                           DType::kFp8E4M3, DType::kFp8E5M2),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           switch (info.param) {
                             case DType::kFloat32:
                               return std::string("Float32");
                             case DType::kFloat16:
                               return std::string("Float16");
                             case DType::kBFloat16:
                               return std::string("BFloat16");
                             case DType::kFp8E4M3:
                               return std::string("Fp8E4M3");
                             case DType::kFp8E5M2:
                               return std::string("Fp8E5M2");
                           }
                           return std::string("Unknown");
                         });

// ---- fp8 (OCP E4M3 "fn" and E5M2) ----

struct Fp8Layout {
  DType dtype;
  int mantissa_bits;
  int bias;
  bool has_infinity;
};

class Fp8Test : public ::testing::TestWithParam<Fp8Layout> {};

// The value of an fp8 code from the OCP definition (not from the code under test);
// NaN for the NaN codes.
double Fp8ValueByFormula(uint8_t code, const Fp8Layout& f) {
  const double sign = (code & 0x80) ? -1.0 : 1.0;
  const int exponent = (code & 0x7f) >> f.mantissa_bits;
  const int mantissa = code & ((1 << f.mantissa_bits) - 1);
  const int top = (1 << (7 - f.mantissa_bits)) - 1;
  if (f.has_infinity && exponent == top) return mantissa == 0 ? sign * HUGE_VAL : std::nan("");
  if (!f.has_infinity && (code & 0x7f) == 0x7f) return std::nan("");
  if (exponent == 0) return sign * std::ldexp(mantissa, 1 - f.bias - f.mantissa_bits);
  return sign * std::ldexp((1 << f.mantissa_bits) + mantissa, exponent - f.bias - f.mantissa_bits);
}

// The finite non-negative codes in increasing order of value.
std::vector<uint8_t> FiniteCodes(const Fp8Layout& f) {
  std::vector<uint8_t> codes;
  for (int c = 0; c < 0x80; ++c) {
    if (std::isfinite(Fp8ValueByFormula(static_cast<uint8_t>(c), f))) codes.push_back(c);
  }
  return codes;
}

// Round to nearest even by brute force over every finite code (`codes`, their values
// `values`), saturating to the largest.
uint8_t NearestFp8(float value, const std::vector<uint8_t>& codes,
                   const std::vector<double>& values) {
  const double magnitude = std::fabs(static_cast<double>(value));
  size_t best = 0;
  for (size_t i = 0; i < codes.size(); ++i) {
    const double d = std::fabs(values[i] - magnitude);
    const double best_d = std::fabs(values[best] - magnitude);
    if (d < best_d || (d == best_d && (codes[i] & 1) == 0)) best = i;
  }
  if (magnitude >= values.back()) best = codes.size() - 1;
  return static_cast<uint8_t>(codes[best] | (std::signbit(value) ? 0x80 : 0));
}

TEST_P(Fp8Test, EveryCodeWidensToItsDefinedValue) {
  const Fp8Layout f = GetParam();
  for (int c = 0; c < 256; ++c) {
    const double expected = Fp8ValueByFormula(static_cast<uint8_t>(c), f);
    const float widened = Fp8ToFloat(static_cast<uint8_t>(c), f.dtype);
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(widened)) << "code " << c;
    } else {
      EXPECT_EQ(static_cast<double>(widened), expected) << "code " << c;
      EXPECT_EQ(std::signbit(widened), (c & 0x80) != 0) << "code " << c;
    }
  }
}

TEST_P(Fp8Test, EveryFiniteCodeRoundTrips) {
  const Fp8Layout f = GetParam();
  for (int c = 0; c < 256; ++c) {
    const float widened = Fp8ToFloat(static_cast<uint8_t>(c), f.dtype);
    if (!std::isfinite(widened)) continue;
    EXPECT_EQ(FloatToFp8(widened, f.dtype), c) << "code " << c;
  }
}

// Every midpoint between neighbouring codes, one float ulp either side of it, and a sweep
// over the whole float range: each narrows to the brute-force nearest-even code.
TEST_P(Fp8Test, NarrowingRoundsToNearestEvenAndSaturates) {
  const Fp8Layout f = GetParam();
  std::vector<float> probes;
  const std::vector<uint8_t> codes = FiniteCodes(f);
  std::vector<double> values;
  for (uint8_t code : codes) values.push_back(Fp8ValueByFormula(code, f));
  for (size_t i = 0; i + 1 < codes.size(); ++i) {
    const float mid = static_cast<float>(
        (Fp8ValueByFormula(codes[i], f) + Fp8ValueByFormula(codes[i + 1], f)) / 2);
    for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, kInf)}) {
      probes.push_back(x);
      probes.push_back(-x);
    }
  }
  for (uint64_t bits = 0; bits < 0x7f800000u; bits += 9973) {  // a prime stride
    float x;
    const auto b = static_cast<uint32_t>(bits);
    std::memcpy(&x, &b, sizeof(x));
    probes.push_back(x);
    probes.push_back(-x);
  }
  int64_t mismatches = 0;
  for (float x : probes) {
    const uint8_t got = FloatToFp8(x, f.dtype);
    const uint8_t want = NearestFp8(x, codes, values);
    if (got != want && ++mismatches <= 10) {
      ADD_FAILURE() << std::hexfloat << x << " narrowed to 0x" << std::hex << int(got)
                    << ", nearest even is 0x" << int(want);
    }
  }
  EXPECT_EQ(mismatches, 0) << "of " << probes.size() << " probes";
}

TEST_P(Fp8Test, OverflowSaturatesAndNaNStaysNaN) {
  const Fp8Layout f = GetParam();
  const uint8_t max_code = FiniteCodes(f).back();
  const float max = Fp8MaxFinite(f.dtype);
  EXPECT_EQ(Fp8ToFloat(max_code, f.dtype), max);
  for (float x : {max, std::nextafter(max, kInf), 2 * max, 1e30f, kInf}) {
    EXPECT_EQ(FloatToFp8(x, f.dtype), max_code) << x;
    EXPECT_EQ(FloatToFp8(-x, f.dtype), max_code | 0x80) << -x;
  }
  EXPECT_TRUE(std::isnan(Fp8ToFloat(FloatToFp8(std::nanf(""), f.dtype), f.dtype)));
  EXPECT_EQ(FloatToFp8(0.0f, f.dtype), 0x00);
  EXPECT_EQ(FloatToFp8(-0.0f, f.dtype), 0x80);
}

INSTANTIATE_TEST_SUITE_P(Formats, Fp8Test,
                         ::testing::Values(Fp8Layout{DType::kFp8E4M3, 3, 7, false},
                                           Fp8Layout{DType::kFp8E5M2, 2, 15, true}),
                         [](const ::testing::TestParamInfo<Fp8Layout>& info) {
                           return std::string(info.param.dtype == DType::kFp8E4M3 ? "E4M3"
                                                                                  : "E5M2");
                         });

// The bulk scaled forms (AVX2 where the CPU has it) against the scalar ones, bit for bit:
// every code at several scales, and probes (midpoints, a sweep, specials) narrowed with them,
// at lengths that leave a scalar tail.
TEST_P(Fp8Test, BulkScaledFormsMatchTheScalarOnes) {
  const Fp8Layout f = GetParam();
  const float scales[] = {1.0f, 0.0173f, 3.5e-5f, 211.0f, 1e-30f};
  std::vector<uint8_t> codes;
  for (int rep = 0; rep < 3; ++rep) {
    for (int c = 0; c < 256; ++c) codes.push_back(static_cast<uint8_t>(c * 37 + rep));
  }
  codes.push_back(0x11);  // a tail of 1 after 768
  std::vector<float> probes;
  for (uint64_t bits = 0; bits <= 0xffffffffu; bits += 65521) {
    probes.push_back(std::bit_cast<float>(static_cast<uint32_t>(bits)));
  }
  for (float x : {0.0f, -0.0f, kInf, -kInf, std::nanf(""), 1e-40f, -1e-44f}) probes.push_back(x);
  for (float scale : scales) {
    SCOPED_TRACE(scale);
    std::vector<float> wide(codes.size());
    WidenFp8(codes.data(), static_cast<int64_t>(codes.size()), f.dtype, scale, wide.data());
    for (size_t i = 0; i < codes.size(); ++i) {
      const float want = Fp8ToFloat(codes[i], f.dtype) * scale;
      ASSERT_EQ(std::bit_cast<uint32_t>(wide[i]), std::bit_cast<uint32_t>(want))
          << "code 0x" << std::hex << int(codes[i]);
    }
    for (uint8_t code : FiniteCodes(f)) {  // and every midpoint, scaled
      const float x = Fp8ToFloat(code, f.dtype) * scale;
      probes.push_back(x);
      probes.push_back(std::nextafter(x, kInf));
    }
    std::vector<uint8_t> narrow(probes.size());
    NarrowToFp8(probes.data(), static_cast<int64_t>(probes.size()), f.dtype, scale,
                narrow.data());
    for (size_t i = 0; i < probes.size(); ++i) {
      ASSERT_EQ(narrow[i], FloatToFp8(probes[i] / scale, f.dtype))
          << std::hexfloat << probes[i] << " / " << scale;
    }
  }
}

TEST(Fp8Test, KnownValues) {
  EXPECT_EQ(FloatToFp8(1.0f, DType::kFp8E4M3), 0x38);
  EXPECT_EQ(FloatToFp8(1.0f, DType::kFp8E5M2), 0x3c);
  EXPECT_EQ(FloatToFp8(448.0f, DType::kFp8E4M3), 0x7e);
  EXPECT_EQ(FloatToFp8(57344.0f, DType::kFp8E5M2), 0x7b);
  EXPECT_EQ(FloatToFp8(std::ldexp(1.0f, -9), DType::kFp8E4M3), 0x01);   // smallest subnormal
  EXPECT_EQ(FloatToFp8(std::ldexp(1.0f, -16), DType::kFp8E5M2), 0x01);
  EXPECT_EQ(FloatToFp8(std::ldexp(1.0f, -10), DType::kFp8E4M3), 0x00);  // tie to even (0)
  EXPECT_EQ(FloatToFp8(1.0625f, DType::kFp8E4M3), 0x38);  // halfway 1 / 1.125: even
  EXPECT_EQ(FloatToFp8(1.1875f, DType::kFp8E4M3), 0x3a);  // halfway 1.125 / 1.25: even
  EXPECT_EQ(DTypeSize(DType::kFp8E4M3), 1);
  EXPECT_EQ(DTypeName(DType::kFp8E5M2), "fp8_e5m2");
}

}  // namespace
}  // namespace centroidkv
