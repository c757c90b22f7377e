#include "pagedattn/testing/kv_layouts.hpp"

#include <algorithm>
#include <cstring>
#include <limits>

#include "pagedattn/testing/random_case.hpp"

namespace pagedattn::testing {

const char* kv_layout_name(KvLayout layout) {
  switch (layout) {
    case KvLayout::kHnd:
      return "hnd";
    case KvLayout::kNhd:
      return "nhd";
    case KvLayout::kCombinedHnd:
      return "combined_hnd";
    case KvLayout::kCombinedNhd:
      return "combined_nhd";
    case KvLayout::kTokenKvNhd:
      return "token_kv_nhd";
    case KvLayout::kPaddedHnd:
      return "padded_hnd";
  }
  return "?";
}

KvGeometry kv_geometry(KvLayout layout, int num_blocks, int num_kv_heads, int block_size,
                       int head_dim) {
  const std::int64_t KV = num_kv_heads, BS = block_size, D = head_dim;
  KvGeometry g;
  switch (layout) {
    case KvLayout::kHnd:
    case KvLayout::kCombinedHnd:
      g.strides = CacheStrides::hnd(num_kv_heads, block_size, head_dim);
      break;
    case KvLayout::kNhd:
    case KvLayout::kCombinedNhd:
      g.strides = CacheStrides::nhd(num_kv_heads, block_size, head_dim);
      break;
    case KvLayout::kTokenKvNhd:
      g.strides.head = D;
      g.strides.token = 2 * KV * D;
      g.strides.block = BS * g.strides.token;
      g.v_offset = KV * D;
      g.shared = true;
      break;
    case KvLayout::kPaddedHnd:
      // 16 elements after every row, 32 after every kv head, 64 after every block: multiples
      // of 16 bytes for every dtype.
      g.strides.token = D + 16;
      g.strides.head = BS * g.strides.token + 32;
      g.strides.block = KV * g.strides.head + 64;
      break;
  }
  if (layout == KvLayout::kCombinedHnd || layout == KvLayout::kCombinedNhd) {
    // One buffer: each block holds K's block, then V's.
    g.v_offset = g.strides.block;
    g.strides.block *= 2;
    g.shared = true;
  }
  const CacheLayout l =
      CacheLayout::with_strides(num_blocks, num_kv_heads, block_size, head_dim, g.strides);
  g.elements = num_blocks == 0 ? 0 : l.elements() + g.v_offset;
  return g;
}

void KvStorage::apply(DecodeArgs& a, const void* base_k, const void* base_v) const {
  a.kv_strides = geometry.strides;
  a.k_cache = base_k;
  a.v_cache = static_cast<const std::uint8_t*>(geometry.shared ? base_k : base_v) +
              dtype_bytes(a.k_dtype, geometry.v_offset);
}

KvStorage store_kv(const HostCase& c, KvLayout layout) {
  const CaseSpec& s = c.spec;
  return store_kv(c, layout,
                  kv_geometry(layout, c.num_blocks, s.num_kv_heads, s.block_size, s.head_dim));
}

KvStorage store_kv(const HostCase& c, KvLayout layout, const KvGeometry& geometry) {
  const CaseSpec& s = c.spec;
  KvStorage st;
  st.layout = layout;
  st.geometry = geometry;
  // Bytes of an element offset or count (int4: two codes a byte, every offset even).
  const auto bytes = [&](std::int64_t n) {
    return static_cast<std::size_t>(dtype_bytes(s.kv_dtype, n));
  };
  const std::size_t n = static_cast<std::size_t>(st.geometry.elements);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  st.k.assign(bytes(static_cast<std::int64_t>(n)), 0);
  if (s.kv_dtype == DType::kInt4) {
    std::fill(st.k.begin(), st.k.end(), 0x88);  // code -8 (never written) where no row is
  } else {
    for (std::size_t i = 0; i < n; ++i) store_from_float(st.k.data(), s.kv_dtype, i, nan);
  }
  if (!st.geometry.shared) st.v = st.k;
  std::uint8_t* v_base =
      st.geometry.shared ? st.k.data() + bytes(st.geometry.v_offset) : st.v.data();
  const CacheLayout from =
      CacheLayout::dense(c.num_blocks, s.num_kv_heads, s.block_size, s.head_dim);
  const CacheLayout to = CacheLayout::with_strides(c.num_blocks, s.num_kv_heads, s.block_size,
                                                   s.head_dim, st.geometry.strides);
  const std::size_t row = bytes(s.head_dim);
  for (int b = 0; b < c.num_blocks; ++b) {
    for (int h = 0; h < s.num_kv_heads; ++h) {
      for (int t = 0; t < s.block_size; ++t) {
        const std::size_t src = bytes(from.offset(b, h, t));
        const std::size_t dst = bytes(to.offset(b, h, t));
        std::memcpy(st.k.data() + dst, c.k.data() + src, row);
        std::memcpy(v_base + dst, c.v.data() + src, row);
      }
    }
  }
  return st;
}

}  // namespace pagedattn::testing
