// Rows of a quantized cache block (fp8, int8 or int4 codes) as f32, each row times its own scale
// (an int4 row: each group of 32 values times its own): the CPU backend's path for caches it does
// not widen in the tiles (int8, int4, and per-token scales), which then runs the f32 kernel over
// the rows.
#pragma once

#include <cstdint>
#include <type_traits>

#include "pagedattn/dtype.hpp"
#include "widen.hpp"

namespace pagedattn::detail::cpu {
namespace {

// One int4 row of D values (D / 2 bytes, a multiple of 16) as f32: each group of 32 values times
// its own scale (group_scales[k] for values [32k, 32k + 32)). The nibbles are split into a
// buffer of int8 codes in order (the even element from the low nibble), then converted as int8
// codes are; the compiler vectorizes both loops for each instruction set.
inline void dequantize_int4_row(const std::uint8_t* __restrict row, int D,
                                const float* __restrict group_scales, float* __restrict out) {
  constexpr int kGroup = kInt4GroupSize;
  for (int k = 0; k < D / kGroup; ++k) {
    alignas(64) std::int8_t codes[kGroup];
    const std::uint8_t* bytes = row + k * (kGroup / 2);
    for (int j = 0; j < kGroup / 2; ++j) {
      const std::uint8_t b = bytes[j];
      codes[2 * j] = static_cast<std::int8_t>(static_cast<std::int8_t>(b << 4) >> 4);
      codes[2 * j + 1] = static_cast<std::int8_t>(static_cast<std::int8_t>(b) >> 4);
    }
    const float s = group_scales[k];
    float* o = out + k * kGroup;
    for (int j = 0; j < kGroup; ++j) o[j] = static_cast<float>(codes[j]) * s;
  }
}

// dst[t * D + d] = value(src[t * ts + d]) x scales[t * scale_stride] for t < n, d < D (scales
// null: x 1). D is a multiple of the batch width (every supported head dim is of 16). For int4
// (T = int4x2_t: ts counts bytes) the scales are required and a row has D / 32 of them from
// scales[t * scale_stride] on, one per group of 32 values.
template <class Arch, class T>
void dequantize_rows(const T* src, std::int64_t ts, int n, int D, const float* scales,
                     std::int64_t scale_stride, float* dst) {
  using B = fbatch<Arch>;
  constexpr int W = static_cast<int>(B::size);
  for (int t = 0; t < n; ++t) {
    float* __restrict out = dst + static_cast<std::int64_t>(t) * D;
    if constexpr (std::is_same_v<T, int4x2_t>) {
      dequantize_int4_row(reinterpret_cast<const std::uint8_t*>(src + t * ts), D,
                          scales + t * scale_stride, out);
    } else if constexpr (std::is_same_v<T, int8_code_t>) {
      // Sign-extend and convert: the compiler vectorizes this loop for each instruction set.
      const float s = scales != nullptr ? scales[t * scale_stride] : 1.f;
      const std::int8_t* __restrict row = reinterpret_cast<const std::int8_t*>(src + t * ts);
      for (int d = 0; d < D; ++d) out[d] = static_cast<float>(row[d]) * s;
    } else {
      const float s = scales != nullptr ? scales[t * scale_stride] : 1.f;
      // fp8 through the set's own widening, which reads value / kScale.
      const B scale(s * Widen<Arch>::template kScale<T>);
      const T* row = src + t * ts;
      for (int d = 0; d < D; d += W) (Widen<Arch>::load(row + d) * scale).store_unaligned(out + d);
    }
  }
}

}  // namespace
}  // namespace pagedattn::detail::cpu
