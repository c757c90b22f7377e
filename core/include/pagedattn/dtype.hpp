// Storage dtypes and their conversions to and from f32 (round to nearest even; NaN and Inf kept).
// Plain bit manipulation, so the same code runs on the host and on the device.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "pagedattn/host_device.hpp"

namespace pagedattn {

// f32, f16 and bf16 store any tensor; the fp8 formats, int8 and int4 store K and V caches only,
// as codes that mean code x scale (DecodeArgs::k_scale and the rest; docs/kv_quantization.md).
// int4 packs two codes in a byte and always comes with a scale per group of 32 values of a row.
enum class DType : int {
  kF32 = 0,
  kF16 = 1,
  kBF16 = 2,
  kFP8E4M3 = 3,
  kFP8E5M2 = 4,
  kInt8 = 5,
  kInt4 = 6
};

inline bool is_fp8(DType t) { return t == DType::kFP8E4M3 || t == DType::kFP8E5M2; }
// The quantized cache dtypes: codes that take dequantization scales.
inline bool is_quantized(DType t) { return is_fp8(t) || t == DType::kInt8 || t == DType::kInt4; }

// int4 caches: each cache row (token, kv head) is cut into groups of kInt4GroupSize consecutive
// values with an f32 scale each (DecodeArgs::k_token_scales), so head_dim must be a multiple of
// it. A row of any other quantized cache has one such scale.
inline constexpr int kInt4GroupSize = 32;
// The scales a cache row of dtype t has in k_token_scales (head_dim / 32 for int4, else 1).
PAGEDATTN_HOST_DEVICE int token_scales_per_row(DType t, int head_dim) {
  return t == DType::kInt4 ? head_dim / kInt4GroupSize : 1;
}

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32:
      return "f32";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
    case DType::kFP8E4M3:
      return "fp8_e4m3";
    case DType::kFP8E5M2:
      return "fp8_e5m2";
    case DType::kInt8:
      return "int8";
    case DType::kInt4:
      return "int4";
  }
  return "unknown";
}

// Bytes of one element; int4 packs two elements in a byte, and counts 1 here: take the bytes of
// n elements from dtype_bytes.
inline std::size_t dtype_size(DType t) { return t == DType::kF32 ? 4 : is_quantized(t) ? 1 : 2; }
// Bytes that n elements of dtype t take (n / 2 rounded up for int4).
inline std::int64_t dtype_bytes(DType t, std::int64_t n) {
  return t == DType::kInt4 ? (n + 1) / 2 : n * static_cast<std::int64_t>(dtype_size(t));
}

// 16- and 8-bit storage types: distinct wrappers so templates can tell them apart.
struct f16_t {
  std::uint16_t bits;
};
struct bf16_t {
  std::uint16_t bits;
};

PAGEDATTN_HOST_DEVICE std::uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

PAGEDATTN_HOST_DEVICE float bits_float(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

PAGEDATTN_HOST_DEVICE float bf16_to_float(bf16_t h) {
  return bits_float(static_cast<std::uint32_t>(h.bits) << 16);
}

PAGEDATTN_HOST_DEVICE bf16_t float_to_bf16(float f) {
  std::uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep sign, force a quiet payload bit
    return bf16_t{static_cast<std::uint16_t>((u >> 16) | 0x0040u)};
  }
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return bf16_t{static_cast<std::uint16_t>(u >> 16)};
}

PAGEDATTN_HOST_DEVICE float f16_to_float(f16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h.bits & 0x8000u) << 16;
  std::uint32_t exp = (h.bits >> 10) & 0x1fu;
  std::uint32_t man = h.bits & 0x3ffu;
  if (exp == 0x1fu) return bits_float(sign | 0x7f800000u | (man << 13));  // Inf / NaN
  if (exp == 0) {
    if (man == 0) return bits_float(sign);  // signed zero
    // Subnormal: value = man * 2^-24, exact in f32.
    const float mag = static_cast<float>(man) * 5.9604644775390625e-8f;
    return sign ? -mag : mag;
  }
  return bits_float(sign | ((exp + 112u) << 23) | (man << 13));
}

namespace detail {

// The code (exponent << M | mantissa) of a float format with M mantissa bits and exponent bias
// BIAS nearest to the value of `abs` (|x|'s f32 bits, not NaN), ties to even. The exponent is
// not bounded above: the caller saturates (Inf rounds past every finite code). Subnormals of
// both f32 and the format are handled. float_to_f16 and the fp8 conversions share it.
template <int M, int BIAS>
PAGEDATTN_HOST_DEVICE std::uint32_t round_to_small_float(std::uint32_t abs) {
  constexpr std::uint32_t kMinNormal = static_cast<std::uint32_t>(127 + 1 - BIAS) << 23;
  if (abs < kMinNormal) {  // a subnormal of the format (or zero): units of 2^(1 - BIAS - M)
    if (abs == 0) return 0;
    const std::uint32_t exp = abs >> 23;
    const std::uint32_t man = exp ? (abs & 0x7fffffu) | 0x800000u : abs & 0x7fffffu;
    const int e = exp ? static_cast<int>(exp) : 1;
    const int shift = 151 - BIAS - M - e;  // value / unit = man >> shift
    if (shift > 25) return 0;              // below half a unit
    std::uint32_t code = man >> shift;
    const std::uint32_t rem = man & ((1u << shift) - 1u);
    const std::uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (code & 1u))) ++code;  // may reach the smallest normal
    return code;
  }
  // Normal: rebias the exponent, round the mantissa to M bits (a carry rolls into the exponent).
  std::uint32_t v = abs - (static_cast<std::uint32_t>(127 - BIAS) << 23);
  v += (1u << (22 - M)) - 1u + ((v >> (23 - M)) & 1u);
  return v >> (23 - M);
}

}  // namespace detail

PAGEDATTN_HOST_DEVICE f16_t float_to_f16(float f) {
  const std::uint32_t u = float_bits(f);
  const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) {  // NaN: quiet, keep the top payload bits
    return f16_t{static_cast<std::uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu))};
  }
  // Rounding to 65520 or more (Inf included) reaches the Inf code: overflow to Inf.
  const std::uint32_t code = detail::round_to_small_float<10, 15>(abs);
  return f16_t{static_cast<std::uint16_t>(sign | (code > 0x7c00u ? 0x7c00u : code))};
}

// The two OCP 8-bit float formats of fp8 KV caches (DType::kFP8E4M3, kFP8E5M2), converted
// exactly to f32 and from it:
//   e4m3: sign, 4 exponent bits (bias 7), 3 mantissa bits; no infinities; NaN = S.1111.111;
//         largest finite 448; smallest subnormal 2^-9.
//   e5m2: sign, 5 exponent bits (bias 15), 2 mantissa bits; IEEE-like Inf and NaN; largest
//         finite 57344; smallest subnormal 2^-16. It is the top byte of an f16.
// From f32: round to nearest, ties to even; finite values beyond the range saturate to the
// largest finite value of the sign; NaN stays NaN; Inf stays Inf in e5m2 and becomes NaN in e4m3
// (which has no Inf), so a non-finite value never turns into one that looks valid.
struct fp8_e4m3_t {
  std::uint8_t bits;
};
struct fp8_e5m2_t {
  std::uint8_t bits;
};
template <typename T>
constexpr bool is_fp8_type = std::is_same_v<T, fp8_e4m3_t> || std::is_same_v<T, fp8_e5m2_t>;

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

// The int8 cache's codes: -127..127, symmetric (the code -128 is never written; it reads as -128).
// From f32: round to nearest, ties to even; beyond +-127 (Inf included) saturates to +-127; NaN,
// which no code holds, becomes 0.
struct int8_code_t {
  std::int8_t bits;
};

PAGEDATTN_HOST_DEVICE float int8_to_float(int8_code_t c) { return static_cast<float>(c.bits); }

PAGEDATTN_HOST_DEVICE int8_code_t float_to_int8(float f) {
  if (!(f == f)) return int8_code_t{0};  // NaN
  if (f >= 127.f) return int8_code_t{127};
  if (f <= -127.f) return int8_code_t{-127};
  return int8_code_t{static_cast<std::int8_t>(rintf(f))};  // the default rounding: ties to even
}

// The int4 cache's codes: -7..7, symmetric, a two's complement nibble each, two to a byte (the
// element of even index in the low nibble: element i of a row is nibble i % 2 of byte i / 2). The
// code -8 is never written; it reads as -8. From f32 as int8: ties to even, beyond +-7 (Inf
// included) saturates to +-7, NaN becomes 0. int4x2_t is a byte of two codes, the storage unit.
struct int4x2_t {
  std::uint8_t bits;
};

// The storage types of quantized caches (fp8, int8, and int4's byte of two codes).
template <typename T>
constexpr bool is_quantized_type =
    is_fp8_type<T> || std::is_same_v<T, int8_code_t> || std::is_same_v<T, int4x2_t>;

PAGEDATTN_HOST_DEVICE int int4_low(std::uint8_t b) {
  return static_cast<int>(static_cast<std::int8_t>(static_cast<std::uint8_t>(b << 4))) >> 4;
}
PAGEDATTN_HOST_DEVICE int int4_high(std::uint8_t b) {
  return static_cast<int>(static_cast<std::int8_t>(b)) >> 4;
}
// Element i of packed int4 codes.
PAGEDATTN_HOST_DEVICE int int4_code(const std::uint8_t* codes, std::int64_t i) {
  return (i & 1) ? int4_high(codes[i >> 1]) : int4_low(codes[i >> 1]);
}

PAGEDATTN_HOST_DEVICE int float_to_int4(float f) {
  if (!(f == f)) return 0;  // NaN
  if (f >= 7.f) return 7;
  if (f <= -7.f) return -7;
  return static_cast<int>(rintf(f));  // the default rounding: ties to even
}

// Two codes (each in -8..7) as one byte: lo at the even element.
PAGEDATTN_HOST_DEVICE std::uint8_t int4_pack(int lo, int hi) {
  return static_cast<std::uint8_t>((lo & 0xf) | ((hi & 0xf) << 4));
}

// Stores code c (in -8..7) as element i of packed int4 codes, leaving the other nibble.
inline void int4_store(std::uint8_t* codes, std::int64_t i, int c) {
  std::uint8_t& b = codes[i >> 1];
  b = (i & 1) ? static_cast<std::uint8_t>((b & 0x0fu) | ((c & 0xf) << 4))
              : static_cast<std::uint8_t>((b & 0xf0u) | (c & 0xf));
}

// The code int4 stores for x under `scale`: x / scale as float_to_int4 rounds it (a finite x
// whose quotient overflows saturates, as quantize_scaled's).
PAGEDATTN_HOST_DEVICE int quantize_int4(float x, float scale) { return float_to_int4(x / scale); }

// The largest magnitude a quantized cache dtype's codes hold (448 for e4m3, 57344 for e5m2, 127
// for int8, 7 for int4): write_cache's per-token (int4: per-group) scales map each row's (group's)
// largest |x| onto it.
inline float max_code_magnitude(DType t) {
  return t == DType::kFP8E4M3   ? 448.f
         : t == DType::kFP8E5M2 ? 57344.f
         : t == DType::kInt4    ? 7.f
                                : 127.f;
}

// Typed load/store of one element as f32: the one place storage types meet arithmetic.
PAGEDATTN_HOST_DEVICE float to_float(float x) { return x; }
PAGEDATTN_HOST_DEVICE float to_float(f16_t x) { return f16_to_float(x); }
PAGEDATTN_HOST_DEVICE float to_float(bf16_t x) { return bf16_to_float(x); }
PAGEDATTN_HOST_DEVICE float to_float(fp8_e4m3_t x) { return fp8_e4m3_to_float(x); }
PAGEDATTN_HOST_DEVICE float to_float(fp8_e5m2_t x) { return fp8_e5m2_to_float(x); }
PAGEDATTN_HOST_DEVICE float to_float(int8_code_t x) { return int8_to_float(x); }

template <typename T>
PAGEDATTN_HOST_DEVICE T from_float(float x);
template <>
PAGEDATTN_HOST_DEVICE float from_float<float>(float x) {
  return x;
}
template <>
PAGEDATTN_HOST_DEVICE f16_t from_float<f16_t>(float x) {
  return float_to_f16(x);
}
template <>
PAGEDATTN_HOST_DEVICE bf16_t from_float<bf16_t>(float x) {
  return float_to_bf16(x);
}
template <>
PAGEDATTN_HOST_DEVICE fp8_e4m3_t from_float<fp8_e4m3_t>(float x) {
  return float_to_fp8_e4m3(x);
}
template <>
PAGEDATTN_HOST_DEVICE fp8_e5m2_t from_float<fp8_e5m2_t>(float x) {
  return float_to_fp8_e5m2(x);
}
template <>
PAGEDATTN_HOST_DEVICE int8_code_t from_float<int8_code_t>(float x) {
  return float_to_int8(x);
}

// The code a quantized cache stores for value x under `scale` (the value x / scale, as from_float
// rounds it). A finite x whose quotient overflows f32 is beyond every format's range, so it
// saturates like any other finite value instead of becoming Inf (NaN in e4m3).
template <typename Fp8>
PAGEDATTN_HOST_DEVICE Fp8 quantize_scaled(float x, float scale) {
  float q = x / scale;
  const bool x_finite = (float_bits(x) & 0x7f800000u) != 0x7f800000u;
  if (x_finite && (float_bits(q) & 0x7fffffffu) == 0x7f800000u) {
    q = bits_float((float_bits(q) & 0x80000000u) | 0x7f7fffffu);  // +-FLT_MAX, same sign
  }
  return from_float<Fp8>(q);
}

// The element a cache of storage type Dst holds for value x: a quantized Dst the code of x / scale
// (quantize_scaled), any other Dst x itself rounded to nearest even (scale unused: unquantized
// caches take none). Every cache write converts through it; int4, two codes to a byte, has its
// own (quantize_int4).
template <typename Dst>
PAGEDATTN_HOST_DEVICE Dst cache_element(float x, float scale) {
  if constexpr (is_quantized_type<Dst>) {
    return quantize_scaled<Dst>(x, scale);
  } else {
    return from_float<Dst>(x);
  }
}

// The dequantization scale of kv head h of a quantized cache: the per-tensor scale times the head's
// own, when there are per-head scales (per_head may be null).
PAGEDATTN_HOST_DEVICE float head_scale(float scale, const float* per_head, int h) {
  return per_head != nullptr ? scale * per_head[h] : scale;
}

// Runtime-typed element access, for code that is not templated on the dtype (reference, tests).
inline float load_as_float(const void* base, DType t, std::size_t i) {
  switch (t) {
    case DType::kF32:
      return static_cast<const float*>(base)[i];
    case DType::kF16:
      return f16_to_float(static_cast<const f16_t*>(base)[i]);
    case DType::kBF16:
      return bf16_to_float(static_cast<const bf16_t*>(base)[i]);
    case DType::kFP8E4M3:
      return fp8_e4m3_to_float(static_cast<const fp8_e4m3_t*>(base)[i]);
    case DType::kFP8E5M2:
      return fp8_e5m2_to_float(static_cast<const fp8_e5m2_t*>(base)[i]);
    case DType::kInt8:
      return int8_to_float(static_cast<const int8_code_t*>(base)[i]);
    case DType::kInt4:  // i counts codes: nibble i % 2 of byte i / 2
      return static_cast<float>(int4_code(static_cast<const std::uint8_t*>(base), i));
  }
  return 0.f;
}

inline void store_from_float(void* base, DType t, std::size_t i, float v) {
  switch (t) {
    case DType::kF32:
      static_cast<float*>(base)[i] = v;
      break;
    case DType::kF16:
      static_cast<f16_t*>(base)[i] = float_to_f16(v);
      break;
    case DType::kBF16:
      static_cast<bf16_t*>(base)[i] = float_to_bf16(v);
      break;
    case DType::kFP8E4M3:
      static_cast<fp8_e4m3_t*>(base)[i] = float_to_fp8_e4m3(v);
      break;
    case DType::kFP8E5M2:
      static_cast<fp8_e5m2_t*>(base)[i] = float_to_fp8_e5m2(v);
      break;
    case DType::kInt8:
      static_cast<int8_code_t*>(base)[i] = float_to_int8(v);
      break;
    case DType::kInt4:
      int4_store(static_cast<std::uint8_t*>(base), static_cast<std::int64_t>(i), float_to_int4(v));
      break;
  }
}

// Rounds a value to what dtype t holds (identity for f32).
inline float round_to(DType t, float v) {
  switch (t) {
    case DType::kF32:
      return v;
    case DType::kF16:
      return f16_to_float(float_to_f16(v));
    case DType::kBF16:
      return bf16_to_float(float_to_bf16(v));
    case DType::kFP8E4M3:
      return fp8_e4m3_to_float(float_to_fp8_e4m3(v));
    case DType::kFP8E5M2:
      return fp8_e5m2_to_float(float_to_fp8_e5m2(v));
    case DType::kInt8:
      return int8_to_float(float_to_int8(v));
    case DType::kInt4:
      return static_cast<float>(float_to_int4(v));
  }
  return v;
}

}  // namespace pagedattn
