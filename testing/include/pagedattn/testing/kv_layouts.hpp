// A case's K and V caches stored in the layouts serving engines use (cache_layout.hpp): the same
// rows at other places, everything between them NaN, which no backend may read. Shared by the
// layout tests, the fuzzer and the benchmark.
#pragma once

#include <cstdint>
#include <vector>

#include "pagedattn/cache_layout.hpp"
#include "pagedattn/pagedattn.hpp"

namespace pagedattn::testing {

struct HostCase;

enum class KvLayout {
  kHnd,          // [blocks][kv heads][block_size][head_dim], K and V apart (the default)
  kNhd,          // [blocks][block_size][kv heads][head_dim], K and V apart
  kCombinedHnd,  // one tensor [blocks][2][kv heads][block_size][head_dim]: K then V per block
  kCombinedNhd,  // one tensor [blocks][2][block_size][kv heads][head_dim]
  kTokenKvNhd,   // one tensor [blocks][block_size][2][kv heads][head_dim]: K and V per token
  kPaddedHnd,    // HND with gaps after every row, kv head and block
};
constexpr KvLayout kAllKvLayouts[] = {KvLayout::kHnd,         KvLayout::kNhd,
                                      KvLayout::kCombinedHnd, KvLayout::kCombinedNhd,
                                      KvLayout::kTokenKvNhd,  KvLayout::kPaddedHnd};
const char* kv_layout_name(KvLayout layout);

// The strides of `layout`, and where V starts after K (elements) when both share one buffer
// (0 when they are apart). Every stride is a multiple of 16 bytes for 2- and 4-byte dtypes.
struct KvGeometry {
  CacheStrides strides;
  std::int64_t v_offset = 0;  // V's first element in the shared buffer, or 0
  std::int64_t elements = 0;  // elements of one buffer (K's, V's, or the shared one)
  bool shared = false;        // K and V in one buffer
};
KvGeometry kv_geometry(KvLayout layout, int num_blocks, int num_kv_heads, int block_size,
                       int head_dim);

// K and V of a case (c.k, c.v: dense HND) in `layout`: buffer k (and v, unless shared) filled
// with NaN, then every row copied to its place.
struct KvStorage {
  KvLayout layout = KvLayout::kHnd;
  KvGeometry geometry;
  std::vector<std::uint8_t> k, v;  // v empty when shared

  // Points args' caches and strides at base_k / base_v, the storage's buffers or device copies
  // of them (a shared buffer passes its base twice).
  void apply(DecodeArgs& args, const void* base_k, const void* base_v) const;
};
KvStorage store_kv(const HostCase& c, KvLayout layout);
// The same with explicit geometry (a layout's strides with extra padding, as the fuzzer draws).
KvStorage store_kv(const HostCase& c, KvLayout layout, const KvGeometry& geometry);

}  // namespace pagedattn::testing
