// Rows of a quantized cache block (fp8 or int8 codes) as f32, each row times its own scale: the
// CPU backend's path for caches it does not widen in registers (int8, and per-token scales), which
// then runs the f32 kernel over the rows.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "pagedattn/dtype.hpp"

namespace pagedattn::detail::cpu {

// The f32 value of each of the 256 codes of a one-byte cache type.
template <class T>
struct CodeTable {
  float value[256];
  CodeTable() {
    for (int c = 0; c < 256; ++c) {
      T code;
      static_assert(sizeof(code) == 1, "one-byte codes");
      const unsigned char byte = static_cast<unsigned char>(c);
      std::memcpy(&code, &byte, 1);
      value[c] = to_float(code);
    }
  }
};

template <class T>
const CodeTable<T>& code_table() {
  static const CodeTable<T> table;
  return table;
}

// dst[t * D + d] = value(src[t * ts + d]) x scales[t * scale_stride] for t < n, d < D (scales
// null: x 1).
template <class T>
void dequantize_rows(const T* src, std::int64_t ts, int n, int D, const float* scales,
                     std::int64_t scale_stride, float* dst) {
  for (int t = 0; t < n; ++t) {
    const float s = scales != nullptr ? scales[t * scale_stride] : 1.f;
    float* __restrict out = dst + static_cast<std::int64_t>(t) * D;
    if constexpr (std::is_same_v<T, int8_code_t>) {
      // Sign-extend and convert: the compiler vectorizes this loop for each instruction set.
      const std::int8_t* __restrict row = reinterpret_cast<const std::int8_t*>(src + t * ts);
      for (int d = 0; d < D; ++d) out[d] = static_cast<float>(row[d]) * s;
    } else {
      const float* table = code_table<T>().value;
      const unsigned char* row = reinterpret_cast<const unsigned char*>(src + t * ts);
      for (int d = 0; d < D; ++d) out[d] = table[row[d]] * s;
    }
  }
}

}  // namespace pagedattn::detail::cpu
