// Division by a divisor fixed for a whole launch (the block size), without a hardware divide: a
// multiply-high and a shift. The CUDA kernels map every token to its block this way, once per
// tile and thread; an integer division there is some 25 instructions.
//
// For a divisor d in [1, 2^31) and s = ceil(log2 d), the magic m = floor(2^32 (2^s - d) / d) + 1
// gives n / d = (umulhi(n, m) + n) >> s exactly for every n in [0, 2^31) (the round-up method of
// Granlund and Montgomery; the sum cannot overflow 32 bits for such n).
#pragma once

#include <cstdint>

#include "pagedattn/host_device.hpp"

namespace pagedattn {

struct FastDiv {
  std::uint32_t d = 1, m = 1, s = 0;

  static FastDiv make(std::uint32_t d) {
    FastDiv f;
    f.d = d;
    while ((std::uint64_t{1} << f.s) < d) ++f.s;
    f.m = static_cast<std::uint32_t>(((std::uint64_t{1} << 32) * ((std::uint64_t{1} << f.s) - d)) /
                                     d) +
          1;
    return f;
  }
  // n / d for n in [0, 2^31).
  PAGEDATTN_HOST_DEVICE std::uint32_t div(std::uint32_t n) const {
#if defined(__CUDA_ARCH__)
    const std::uint32_t hi = __umulhi(n, m);
#else
    const std::uint32_t hi = static_cast<std::uint32_t>((std::uint64_t{n} * m) >> 32);
#endif
    return (hi + n) >> s;
  }
  // n / d and n % d.
  PAGEDATTN_HOST_DEVICE void divmod(std::uint32_t n, std::uint32_t& q, std::uint32_t& r) const {
    q = div(n);
    r = n - q * d;
  }
};

}  // namespace pagedattn
