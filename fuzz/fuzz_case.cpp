#include "fuzz_case.hpp"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <sstream>
#include <string>
#include <utility>

#include "cuda_alignment.hpp"
#include "pagedattn/cache_layout.hpp"

namespace pagedattn::fuzz {

int FuzzCase::q_rows() const {
  return multi_token() ? std::accumulate(q_lens.begin(), q_lens.end(), 0) : spec.batch;
}

const char* FuzzCase::cuda_misaligned_stride() const {
  return misaligned_stride(q_rows(), static_cast<std::int64_t>(spec.num_heads) * spec.head_dim,
                           q_row_stride, spec.q_dtype, out_row_stride);
}

testing::KvGeometry FuzzCase::kv_geometry(int num_blocks) const {
  const int KV = spec.num_kv_heads, BS = spec.block_size, D = spec.head_dim;
  testing::KvGeometry g = testing::kv_geometry(kv_layout, num_blocks, KV, BS, D);
  if (kv_pad != 0) {
    // The layout's gaps after each kv head and each block kept, each row's widened.
    const std::int64_t head_gap = g.strides.head - BS * g.strides.token;
    const std::int64_t block_gap = g.strides.block - KV * g.strides.head;
    g.strides.token += kv_pad;
    g.strides.head = BS * g.strides.token + head_gap;
    g.strides.block = KV * g.strides.head + block_gap;
    g.elements =
        num_blocks == 0
            ? 0
            : CacheLayout::with_strides(num_blocks, KV, BS, D, g.strides).elements() + g.v_offset;
  }
  return g;
}

const char* token_scale_layout_name(TokenScaleLayout layout) {
  switch (layout) {
    case TokenScaleLayout::kDense:
      return "dense";
    case TokenScaleLayout::kNhd:
      return "nhd";
    case TokenScaleLayout::kPadded:
      return "padded";
  }
  return "?";
}

CacheStrides FuzzCase::token_scale_strides() const {
  const std::int64_t KV = spec.num_kv_heads, BS = spec.block_size, pad = token_scale_pad;
  // A row's scales: one, or an int4 row's head_dim / 32.
  const int n = token_scales_per_row(spec.kv_dtype, spec.head_dim);
  if (token_scale_layout == TokenScaleLayout::kNhd) return CacheStrides::nhd(KV, BS, n);
  CacheStrides s;
  if (token_scale_layout == TokenScaleLayout::kPadded) {
    s.token = n + pad;
    s.head = BS * s.token + pad;
    s.block = KV * s.head + pad;
  }
  return s;
}

const char* FuzzCase::cuda_misaligned_kv() const {
  if (default_layout()) return nullptr;
  const CacheLayout l = CacheLayout::with_strides(1, spec.num_kv_heads, spec.block_size,
                                                  spec.head_dim, kv_geometry(1).strides);
  return misaligned_kv(l, spec.kv_dtype);
}

void fit_tree_masks(FuzzCase& c) {
  if (!c.tree) return;
  c.tree_masks.resize(c.q_lens.size());
  for (std::size_t b = 0; b < c.q_lens.size(); ++b) {
    const int n = std::max(c.q_lens[b], 0);
    std::string& mask = c.tree_masks[b];
    if (mask.size() == static_cast<std::size_t>(n) * n) continue;
    // The old size, where it is a square (a hand-edited mask may not be: then none is kept).
    int old = 0;
    while (static_cast<std::size_t>(old + 1) * (old + 1) <= mask.size()) ++old;
    if (static_cast<std::size_t>(old) * old != mask.size()) old = 0;
    std::string fitted(static_cast<std::size_t>(n) * n, '0');
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j <= i; ++j) {
        const bool bit = i < old ? mask[static_cast<std::size_t>(i) * old + j] == '1' : i == j;
        fitted[static_cast<std::size_t>(i) * n + j] = bit ? '1' : '0';
      }
    }
    mask = std::move(fitted);
  }
}

std::string describe(const FuzzCase& c) {
  std::ostringstream os;
  os << testing::describe(c.spec) << " threads=" << c.threads << " mag=" << c.spec.magnitude;
  if (c.snap) os << " snap";
  if (c.scale != 0.f) os << " scale=" << c.scale;
  if (c.windowed()) os << " window=" << c.window_left;
  if (c.soft_capped()) os << " cap=" << c.soft_cap;
  if (!c.alibi_slopes.empty()) os << " alibi";
  if (!c.sinks.empty()) os << " sinks";
  if (c.q_row_stride != 0) os << " q_stride=" << c.q_row_stride;
  if (c.out_row_stride != 0) os << " out_stride=" << c.out_row_stride;
  if (!c.default_layout()) os << " layout=" << testing::kv_layout_name(c.kv_layout);
  if (c.kv_pad != 0) os << " kv_pad=" << c.kv_pad;
  if (c.spec.k_scale != 1.f) os << " k_scale=" << c.spec.k_scale;
  if (c.spec.v_scale != 1.f) os << " v_scale=" << c.spec.v_scale;
  if (c.per_head_scales()) os << " per_head_scales";
  // (testing::describe names token-scales.)
  if (c.token_scales() && c.token_scale_layout != TokenScaleLayout::kDense) {
    os << " token_scale_layout=" << token_scale_layout_name(c.token_scale_layout);
    if (c.token_scale_layout == TokenScaleLayout::kPadded) os << "+" << c.token_scale_pad;
  }
  if (c.multi_token()) {
    os << " q_lens=[";
    for (std::size_t i = 0; i < c.q_lens.size(); ++i) os << (i ? "," : "") << c.q_lens[i];
    os << "] max_q_len=" << c.max_q_len;
  }
  // The masks themselves are in the case file (up to 40 x 40 bits per sequence).
  if (c.tree) os << (c.tree_pack_seed != 0 ? " tree_mask(padded)" : " tree_mask");
  if (c.malformed()) os << " malformed=" << malformation_name(c.bad);
  return os.str();
}

}  // namespace pagedattn::fuzz
