// The CPU kernel's inputs for a whole case, built as the backend builds them: q scaled once, and
// an ItemContext over the case's caches and table. Shared by the tests that call the kernels of
// every instruction set directly.
#pragma once

#include <cstddef>
#include <vector>

#include "cpu_kernel.hpp"
#include "pagedattn/cache_layout.hpp"
#include "pagedattn/dtype.hpp"
#include "pagedattn/pagedattn.hpp"

namespace pagedattn {

// Fills q_scaled with a's q times the effective scale and returns the context over it; the
// attention variants are left at their defaults.
inline detail::cpu::ItemContext item_context(const DecodeArgs& a, std::vector<float>& q_scaled) {
  q_scaled.resize(static_cast<std::size_t>(a.batch) * a.num_heads * a.head_dim);
  for (std::size_t i = 0; i < q_scaled.size(); ++i) {
    q_scaled[i] = load_as_float(a.q, a.q_dtype, i) * a.effective_scale();
  }
  detail::cpu::ItemContext ctx;
  ctx.q_scaled = q_scaled.data();
  ctx.q_bf16 = a.q_dtype == DType::kBF16 ? static_cast<const bf16_t*>(a.q) : nullptr;
  ctx.q_bf16_stride = a.q_stride();
  ctx.scale = a.effective_scale();
  ctx.k_cache = a.k_cache;
  ctx.v_cache = a.v_cache;
  ctx.kv_dtype = a.k_dtype;
  ctx.layout = CacheLayout::dense(a.num_blocks, a.num_kv_heads, a.block_size, a.head_dim);
  ctx.table = BlockTableView{a.block_table, a.max_blocks_per_seq, a.table_stride()};
  ctx.context_lens = a.context_lens;
  ctx.num_heads = a.num_heads;
  ctx.group_size = a.group_size();
  return ctx;
}

}  // namespace pagedattn
