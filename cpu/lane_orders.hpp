// The element orders the widenings produce (pairs, quads, bf16 words, token pairs): q copied
// into them, the accumulators put back in order.
// Part of the item kernel (item_kernel_impl.hpp), included only by the per-instruction-set
// translation units: internal linkage keeps each set's copy, built with its own flags, apart.
#pragma once

#include <algorithm>

#include "pagedattn/dtype.hpp"
#include "widen.hpp"

namespace pagedattn::detail::cpu {
namespace {

// bf16 word order (word_dim in widen.hpp) and quad order (quad_dim), per chunk of 64 elements: a
// bf16 q is copied into the first, the accumulators run in the second and are put back at the
// end.
inline void to_word_order(const bf16_t* in, bf16_t* out, int D) {
  for (int c = 0; c < D; c += 64) {
    for (int w = 0; w < 2; ++w) {
      for (int n = 0; n < 32; ++n) out[c + 32 * w + n] = in[c + word_dim(w, n)];
    }
  }
}
inline void from_quad_order(float* row, float* tmp, int D) {
  for (int c = 0; c < D; c += 64) {
    for (int m = 0; m < 4; ++m) {
      for (int k = 0; k < 16; ++k) tmp[quad_dim(m, k)] = row[c + 16 * m + k];
    }
    std::copy(tmp, tmp + 64, row + c);
  }
}

// Pair order (see load_pair in widen.hpp): in every chunk of 2W elements, the even ones, then the
// odd ones. q is copied into it, the accumulators run in it and are put back in order at the end.
template <int W>
void to_pair_order(const float* in, float* out, int D) {
  for (int c = 0; c < D; c += 2 * W) {
    for (int i = 0; i < W; ++i) {
      out[c + i] = in[c + 2 * i];
      out[c + W + i] = in[c + 2 * i + 1];
    }
  }
}
template <int W>
void from_pair_order(float* row, float* tmp, int D) {
  for (int c = 0; c < D; c += 2 * W) {
    for (int i = 0; i < W; ++i) {
      tmp[2 * i] = row[c + i];
      tmp[2 * i + 1] = row[c + W + i];
    }
    std::copy(tmp, tmp + 2 * W, row + c);
  }
}

// Token-pair order (values_tile_dp): output vector 2 w + h of a chunk, lane j, holds word
// 8 (j / 4) + 4 h + j % 4 of word vector w: element 32 w + that word of a bf16 cache's chunk (32
// elements each, so w = 0), word_dim(w, that word) of an fp8 chunk (64 codes).
template <bool kFp8>
void from_token_pair_order(float* row, float* tmp, int D) {
  constexpr int kChunk = kFp8 ? 64 : 32;
  for (int c = 0; c < D; c += kChunk) {
    for (int o = 0; o < kChunk / 16; ++o) {
      const int w = o / 2, h = o % 2;
      for (int j = 0; j < 16; ++j) {
        const int word = 8 * (j / 4) + 4 * h + j % 4;
        tmp[kFp8 ? word_dim(w, word) : 32 * w + word] = row[c + 16 * o + j];
      }
    }
    std::copy(tmp, tmp + kChunk, row + c);
  }
}

}  // namespace
}  // namespace pagedattn::detail::cpu
