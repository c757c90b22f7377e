// The two OCP 8-bit float formats serving engines store KV caches in, and their exact
// conversions to and from f32 (host and device alike, plain bit manipulation):
//   e4m3: sign, 4 exponent bits (bias 7), 3 mantissa bits; no infinities; NaN = S.1111.111;
//         largest finite 448; smallest subnormal 2^-9.
//   e5m2: sign, 5 exponent bits (bias 15), 2 mantissa bits; IEEE-like Inf and NaN; largest
//         finite 57344; smallest subnormal 2^-16. It is the top byte of an f16.
// From f32: round to nearest, ties to even; finite values beyond the range saturate to the
// largest finite value of the sign; NaN stays NaN; Inf stays Inf in e5m2 and becomes NaN in e4m3
// (which has no Inf), so a non-finite value never turns into one that looks valid.
// No DType stores them: they are conversions only, for fp8 KV caches.
#pragma once

#include <cstdint>

#include "pagedattn/dtype.hpp"
#include "pagedattn/host_device.hpp"

namespace pagedattn {

struct fp8_e4m3_t {
  std::uint8_t bits;
};
struct fp8_e5m2_t {
  std::uint8_t bits;
};

PAGEDATTN_HOST_DEVICE float fp8_e4m3_to_float(fp8_e4m3_t c) {
  const std::uint32_t sign = static_cast<std::uint32_t>(c.bits & 0x80u) << 24;
  const std::uint32_t exp = (c.bits >> 3) & 0xfu, man = c.bits & 0x7u;
  if (exp == 0xfu && man == 0x7u) return bits_float(sign | 0x7fc00000u);  // NaN
  if (exp == 0) {  // subnormal or zero: man * 2^-9, exact
    const float mag = static_cast<float>(man) * 0.001953125f;
    return sign ? -mag : mag;
  }
  return bits_float(sign | ((exp + 120u) << 23) | (man << 20));
}

PAGEDATTN_HOST_DEVICE float fp8_e5m2_to_float(fp8_e5m2_t c) {
  return f16_to_float(f16_t{static_cast<std::uint16_t>(c.bits << 8)});
}

PAGEDATTN_HOST_DEVICE fp8_e4m3_t float_to_fp8_e4m3(float f) {
  const std::uint32_t u = float_bits(f);
  const std::uint8_t sign = static_cast<std::uint8_t>((u >> 24) & 0x80u);
  const std::uint32_t abs = u & 0x7fffffffu;
  if (abs >= 0x7f800000u) return fp8_e4m3_t{static_cast<std::uint8_t>(sign | 0x7fu)};  // NaN, Inf
  const std::uint32_t code = detail::round_to_small_float<3, 7>(abs);
  return fp8_e4m3_t{static_cast<std::uint8_t>(sign | (code > 0x7eu ? 0x7eu : code))};
}

PAGEDATTN_HOST_DEVICE fp8_e5m2_t float_to_fp8_e5m2(float f) {
  const std::uint32_t u = float_bits(f);
  const std::uint8_t sign = static_cast<std::uint8_t>((u >> 24) & 0x80u);
  const std::uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return fp8_e5m2_t{static_cast<std::uint8_t>(sign | 0x7eu)};   // NaN
  if (abs == 0x7f800000u) return fp8_e5m2_t{static_cast<std::uint8_t>(sign | 0x7cu)};  // Inf
  const std::uint32_t code = detail::round_to_small_float<2, 15>(abs);
  return fp8_e5m2_t{static_cast<std::uint8_t>(sign | (code > 0x7bu ? 0x7bu : code))};
}

}  // namespace pagedattn
