// The attention variants pagedattn-bench applies to every row it times (--window, --soft-cap,
// --alibi, --sinks) and their per-head values, and its multi-token queries (--q-len) with their
// tree masks (--tree-mask), the same for the CPU and the CUDA timings.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "pagedattn/pagedattn.hpp"
#include "pagedattn/tree_mask.hpp"

namespace pagedattn::bench {

struct Variants {
  int window_left = -1;  // --window N: the last N + 1 tokens of each sequence (-1: all)
  float soft_cap = 0.f;  // --soft-cap X (0: none)
  bool alibi = false;    // --alibi: the ALiBi paper's slopes
  bool sinks = false;    // --sinks: one random sink logit per head

  bool any() const { return window_left >= 0 || soft_cap > 0.f || alibi || sinks; }
};

// The ALiBi paper's slopes for H heads: 2^(-8 (h + 1) / H).
inline std::vector<float> alibi_slopes(int num_heads) {
  std::vector<float> s(num_heads);
  for (int h = 0; h < num_heads; ++h) {
    s[h] = static_cast<float>(std::exp2(-8.0 * (h + 1) / num_heads));
  }
  return s;
}

// One sink logit per head, uniform in [-2, 2] (about the spread of the benchmark's logits, so a
// sink takes a share of the softmax without swamping it), from a fixed seed: every run, on every
// host and for either backend, uses the same values. mt19937_64's output is fixed by the
// standard, and the mapping to [0, 1) is done here rather than by a distribution, whose
// algorithm the standard leaves to the library.
inline std::vector<float> sink_logits(int num_heads) {
  std::mt19937_64 rng(0x5eed51u);
  std::vector<float> s(num_heads);
  for (float& x : s) x = static_cast<float>(4.0 * ((rng() >> 11) * 0x1.0p-53) - 2.0);
  return s;
}

// Host copies of one shape's per-head values (empty where the variant is off).
struct VariantValues {
  std::vector<float> slopes, sinks;
  VariantValues(const Variants& v, int num_heads)
      : slopes(v.alibi ? alibi_slopes(num_heads) : std::vector<float>{}),
        sinks(v.sinks ? sink_logits(num_heads) : std::vector<float>{}) {}
};

// Sets a's variant fields; slopes and sinks are where a's other buffers are (host memory for
// the CPU, device memory for CUDA), null where the variant is off.
inline void apply_variants(const Variants& v, const float* slopes, const float* sinks,
                           DecodeArgs& a) {
  a.window_left = v.window_left;
  a.logits_soft_cap = v.soft_cap;
  a.alibi_slopes = v.alibi ? slopes : nullptr;
  a.sinks = v.sinks ? sinks : nullptr;
}

// Uniform multi-token queries: q_indptr = 0, q_len, 2 q_len, ..., batch q_len (empty when
// q_len is 1, which is plain decode).
inline std::vector<std::int32_t> uniform_q_indptr(int batch, int q_len) {
  std::vector<std::int32_t> p;
  if (q_len <= 1) return p;
  p.resize(static_cast<std::size_t>(batch) + 1);
  for (int b = 0; b <= batch; ++b) p[b] = static_cast<std::int32_t>(b * q_len);
  return p;
}

// Sets a's multi-token query fields (DecodeArgs or MlaDecodeArgs) for q_len query tokens per
// sequence, q_indptr (from uniform_q_indptr) where a's other buffers are; nothing when q_len is 1.
template <typename Args>
void apply_q_len(int q_len, const std::int32_t* q_indptr, Args& a) {
  if (q_len <= 1) return;
  a.q_indptr = q_indptr;
  a.num_q_tokens = a.batch * q_len;
  a.max_q_len = q_len;
}

// The tree masks of --tree-mask (DecodeArgs::tree_mask, tree_mask_indptr), packed as the library
// takes them: sequence b's q_len x q_len bits from byte indptr[b] = b * tree_mask_bytes(q_len).
struct TreeMasks {
  std::vector<std::uint8_t> bits;
  std::vector<std::int32_t> indptr;  // [batch + 1]
};

// One random token tree per sequence over its q_len query tokens: token i's parent is drawn
// uniformly from none and the tokens before it (token 0 is always a root, so a sequence holds a
// forest), and token i attends itself and its ancestors. From a fixed seed, with the mapping to
// a choice done here rather than by a distribution (whose algorithm the standard leaves to the
// library): a shape gets the same trees in every run, on every host.
inline TreeMasks random_tree_masks(int batch, int q_len) {
  const std::int64_t span = tree_mask_bytes(q_len);
  TreeMasks m;
  m.bits.assign(static_cast<std::size_t>(batch * span), 0);
  m.indptr.resize(static_cast<std::size_t>(batch) + 1);
  for (int b = 0; b <= batch; ++b) m.indptr[b] = static_cast<std::int32_t>(b * span);
  std::mt19937_64 rng(0x7ee3a5u);
  std::vector<int> parent(static_cast<std::size_t>(q_len));
  for (int b = 0; b < batch; ++b) {
    for (int i = 0; i < q_len; ++i) {
      // One of i + 1 choices: none, or token 0 .. i - 1.
      parent[i] = static_cast<int>((rng() >> 11) * 0x1.0p-53 * (i + 1)) - 1;
      for (int t = i; t >= 0; t = parent[t]) {
        const std::int64_t bit = b * span * 8 + static_cast<std::int64_t>(i) * q_len + t;
        set_tree_mask_bit(m.bits.data(), bit);
      }
    }
  }
  return m;
}

}  // namespace pagedattn::bench
