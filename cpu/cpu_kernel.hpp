// The CPU backend's work-item kernel, one instantiation per instruction set (isa_*.cpp), chosen
// once at run time through xsimd::dispatch.
#pragma once

#include <cstdint>
#include <xsimd/xsimd.hpp>

#include "pagedattn/cache_layout.hpp"
#include "pagedattn/detail/fault_injection.hpp"
#include "pagedattn/dtype.hpp"
#include "pagedattn/split_plan.hpp"

namespace pagedattn::detail::cpu {

// Everything a work item reads. q is already widened to f32 and multiplied by the scale.
struct ItemContext {
  const float* q_scaled;  // [batch][num_heads][head_dim]
  const void* k_cache;
  const void* v_cache;
  DType kv_dtype;
  CacheLayout layout;
  BlockTableView table;
  const std::int32_t* context_lens;
  int num_heads;
  int group_size;
  Fault fault;  // test-only planted bug (kNone in production)
};

// Per-thread scratch: scores and weights for one block of the whole group.
struct ItemScratch {
  float* scores;  // group_size * block_size floats
};

// Folds the blocks of `item` into the group's partial states: m[g], l[g], acc[g * head_dim + d]
// for the group_size query heads of the item's kv head (fresh states on entry).
struct ItemKernel {
  template <class Arch>
  void operator()(Arch, const ItemContext& ctx, const WorkItem& item, float* m, float* l,
                  float* acc, ItemScratch scratch) const;
};

extern template void ItemKernel::operator()<xsimd::avx512bw>(xsimd::avx512bw, const ItemContext&,
                                                             const WorkItem&, float*, float*,
                                                             float*, ItemScratch) const;
extern template void ItemKernel::operator()<xsimd::fma3<xsimd::avx2>>(xsimd::fma3<xsimd::avx2>,
                                                                      const ItemContext&,
                                                                      const WorkItem&, float*,
                                                                      float*, float*,
                                                                      ItemScratch) const;
extern template void ItemKernel::operator()<xsimd::sse2>(xsimd::sse2, const ItemContext&,
                                                         const WorkItem&, float*, float*, float*,
                                                         ItemScratch) const;

// The name of the instruction set the dispatcher picks on this machine ("avx512", "avx2" or
// "sse2").
const char* active_isa_name();

}  // namespace pagedattn::detail::cpu
