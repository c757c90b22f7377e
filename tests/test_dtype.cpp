// Storage dtype conversions: round to nearest even, NaN and Inf preserved, exact round trips.
#include <gtest/gtest.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <type_traits>

#include "bad_input.hpp"
#include "pagedattn/detail/visit_dtype.hpp"
#include "pagedattn/dtype.hpp"
#include "test_seed.hpp"

namespace pagedattn {
namespace {

// The processor's own f32 -> f16 conversion (round to nearest even), where it has one.
#if defined(__x86_64__)
bool has_hardware_f16() { return __builtin_cpu_supports("f16c"); }
__attribute__((target("f16c"))) std::uint16_t hardware_f16(float f) {
  return static_cast<std::uint16_t>(
      _mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(f), _MM_FROUND_TO_NEAREST_INT), 0));
}
#elif defined(__aarch64__)
bool has_hardware_f16() { return true; }  // FCVT, part of the AArch64 baseline
std::uint16_t hardware_f16(float f) {
  const __fp16 h = static_cast<__fp16>(f);
  std::uint16_t bits;
  std::memcpy(&bits, &h, 2);
  return bits;
}
#else
bool has_hardware_f16() { return false; }
std::uint16_t hardware_f16(float) { return 0; }
#endif

// bf16 rounding computed independently: the two nearest bf16 values, pick the closer (ties even).
std::uint16_t reference_bf16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  const std::uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u;
  const std::uint32_t rem = u & 0xffffu;
  if (rem < 0x8000u) return static_cast<std::uint16_t>(lo >> 16);
  if (rem > 0x8000u) return static_cast<std::uint16_t>(hi >> 16);
  return static_cast<std::uint16_t>(((lo >> 16) & 1u) ? hi >> 16 : lo >> 16);
}

TEST(Dtype, F16RoundTripIsExactForEveryValue) {
  for (std::uint32_t bits = 0; bits < 0x10000u; ++bits) {
    const f16_t h{static_cast<std::uint16_t>(bits)};
    const float f = f16_to_float(h);
    const f16_t back = float_to_f16(f);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_float(back))) << std::hex << bits;
      EXPECT_EQ(back.bits & 0x8000u, bits & 0x8000u) << "NaN sign, bits " << std::hex << bits;
    } else {
      EXPECT_EQ(back.bits, bits) << std::hex << bits;
    }
  }
}

TEST(Dtype, Bf16RoundTripIsExactForEveryValue) {
  for (std::uint32_t bits = 0; bits < 0x10000u; ++bits) {
    const bf16_t h{static_cast<std::uint16_t>(bits)};
    const float f = bf16_to_float(h);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(f))));
    } else {
      EXPECT_EQ(float_to_bf16(f).bits, bits) << std::hex << bits;
    }
  }
}

TEST(Dtype, F16MatchesHardwareRoundingOnRandomFloats) {
  if (!has_hardware_f16()) GTEST_SKIP() << "no f16 conversion instruction on this CPU";
  const std::uint64_t seed = testing::seed_for(11);
  std::mt19937 rng(static_cast<std::uint32_t>(seed));
  for (int i = 0; i < 2000000; ++i) {
    std::uint32_t u = rng();
    // Concentrate on the f16 range (exponents near 0), with every mantissa pattern.
    if (i % 2) u = (u & 0x807fffffu) | ((100u + rng() % 50u) << 23);
    float f;
    std::memcpy(&f, &u, 4);
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_f16(f).bits, hardware_f16(f))
        << "input bits " << std::hex << u << " " << testing::seed_note(seed);
  }
}

TEST(Dtype, Bf16RoundsToNearestEven) {
  const std::uint64_t seed = testing::seed_for(12);
  std::mt19937 rng(static_cast<std::uint32_t>(seed));
  for (int i = 0; i < 2000000; ++i) {
    std::uint32_t u = rng();
    if (i % 4 == 0) u = (u & 0xffff0000u) | 0x8000u;  // exact ties
    float f;
    std::memcpy(&f, &u, 4);
    if (std::isnan(f) || std::isinf(f)) continue;
    ASSERT_EQ(float_to_bf16(f).bits, reference_bf16(f))
        << std::hex << u << " " << testing::seed_note(seed);
  }
}

TEST(Dtype, SpecialValuesArePreserved) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(f16_to_float(float_to_f16(inf)), inf);
  EXPECT_EQ(f16_to_float(float_to_f16(-inf)), -inf);
  EXPECT_EQ(bf16_to_float(float_to_bf16(inf)), inf);
  EXPECT_EQ(bf16_to_float(float_to_bf16(-inf)), -inf);
  EXPECT_TRUE(std::isnan(f16_to_float(float_to_f16(nan))));
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(nan))));
  // A NaN whose payload sits only in the low bits must not become Inf when narrowed.
  std::uint32_t low_payload = 0x7f800001u;
  float sneaky;
  std::memcpy(&sneaky, &low_payload, 4);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(sneaky))));
  EXPECT_TRUE(std::isnan(f16_to_float(float_to_f16(sneaky))));
  // Overflow: beyond the largest f16 (65504) rounds to Inf; 65519 still rounds down.
  EXPECT_EQ(f16_to_float(float_to_f16(65520.f)), inf);
  EXPECT_EQ(f16_to_float(float_to_f16(65519.f)), 65504.f);
  EXPECT_EQ(bf16_to_float(float_to_bf16(3.4e38f)), inf);
  // Signed zero and subnormals.
  EXPECT_EQ(float_to_f16(-0.f).bits, 0x8000u);
  EXPECT_EQ(float_to_bf16(-0.f).bits, 0x8000u);
  EXPECT_EQ(f16_to_float(f16_t{0x0001u}), std::ldexp(1.f, -24));
  EXPECT_EQ(float_to_f16(std::ldexp(1.f, -25)).bits, 0u);   // tie to even: 0
  EXPECT_EQ(float_to_f16(std::ldexp(1.5f, -25)).bits, 1u);  // above the tie
  EXPECT_EQ(float_to_f16(std::ldexp(3.f, -25)).bits, 2u);   // 1.5 ulp: tie to even (2)
}

TEST(Dtype, RuntimeTypedAccessAgreesWithTyped) {
  std::uint16_t buf[3];
  store_from_float(buf, DType::kBF16, 1, 1.5f);
  EXPECT_EQ(load_as_float(buf, DType::kBF16, 1), 1.5f);
  store_from_float(buf, DType::kF16, 2, -2.25f);
  EXPECT_EQ(load_as_float(buf, DType::kF16, 2), -2.25f);
  EXPECT_EQ(round_to(DType::kBF16, 1.00390625f), 1.f);  // 1 + 2^-8 ties to even
  EXPECT_STREQ(dtype_name(DType::kBF16), "bf16");
  EXPECT_EQ(dtype_size(DType::kF32), 4u);
}

TEST(Dtype, VisitValueTypeGivesTheStorageTypeOrNamesTheArgument) {
  bool bf16 = false;
  detail::visit_value_type(DType::kBF16, "src_dtype", [&](auto tag) {
    bf16 = std::is_same_v<typename decltype(tag)::type, bf16_t>;
  });
  EXPECT_TRUE(bf16);
  expect_error(
      [] {
        detail::visit_value_type(DType::kInt8, "src_dtype",
                                 [](auto) { ADD_FAILURE() << "int8 visited"; });
      },
      ErrorCode::kUnsupported, "src_dtype", {"int8"}, "an int8 value type");
}

}  // namespace
}  // namespace pagedattn
