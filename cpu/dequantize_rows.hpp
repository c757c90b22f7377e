// Rows of a quantized cache block (fp8 or int8 codes) as f32, each row times its own scale: the
// CPU backend's path for caches it does not widen in the tiles (int8, and per-token scales), which
// then runs the f32 kernel over the rows.
#pragma once

#include <cstdint>
#include <type_traits>

#include "pagedattn/dtype.hpp"
#include "widen.hpp"

namespace pagedattn::detail::cpu {
namespace {

// dst[t * D + d] = value(src[t * ts + d]) x scales[t * scale_stride] for t < n, d < D (scales
// null: x 1). D is a multiple of the batch width (every supported head dim is of 16).
template <class Arch, class T>
void dequantize_rows(const T* src, std::int64_t ts, int n, int D, const float* scales,
                     std::int64_t scale_stride, float* dst) {
  using B = fbatch<Arch>;
  constexpr int W = static_cast<int>(B::size);
  for (int t = 0; t < n; ++t) {
    const float s = scales != nullptr ? scales[t * scale_stride] : 1.f;
    float* __restrict out = dst + static_cast<std::int64_t>(t) * D;
    if constexpr (std::is_same_v<T, int8_code_t>) {
      // Sign-extend and convert: the compiler vectorizes this loop for each instruction set.
      const std::int8_t* __restrict row = reinterpret_cast<const std::int8_t*>(src + t * ts);
      for (int d = 0; d < D; ++d) out[d] = static_cast<float>(row[d]) * s;
    } else {
      // fp8 through the set's own widening, which reads value / kScale.
      const B scale(s * Widen<Arch>::template kScale<T>);
      const T* row = src + t * ts;
      for (int d = 0; d < D; d += W) (Widen<Arch>::load(row + d) * scale).store_unaligned(out + d);
    }
  }
}

}  // namespace
}  // namespace pagedattn::detail::cpu
