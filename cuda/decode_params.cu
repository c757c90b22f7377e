// The kernels' parameters for one CUDA decode (decode_steps.hpp): the call's pointers and shapes,
// its cache layout in row units, the plan, the workspace carved into the partial states, and the
// combine's share of them.
#include "decode_steps.hpp"
#include "device_info.hpp"
#include "pagedattn/variants.hpp"

namespace pagedattn::detail::cuda {

SplitParams make_split_params(const DecodeArgs& a, const DecodePlan& plan, const RowUnits& units,
                              char* workspace) {
  SplitParams p{};
  p.q = a.q;
  p.q_dtype = static_cast<int>(a.q_dtype);
  p.q_stride = a.q_stride();
  p.out_stride = a.out_stride();
  p.k = a.k_cache;
  p.v = a.v_cache;
  p.table = a.block_table;
  p.lens = a.context_lens;
  p.batch = a.batch;
  p.num_heads = a.num_heads;
  p.num_kv_heads = a.num_kv_heads;
  p.group = a.group_size();
  p.block_size = a.block_size;
  p.num_blocks = a.num_blocks;
  p.max_blocks = a.max_blocks_per_seq;
  p.table_stride = a.table_stride();
  p.block_div = FastDiv::make(static_cast<std::uint32_t>(a.block_size));
  p.block_units = units.block_units;
  p.token_units = units.token_units;
  p.row_unit = units.row_unit;
  p.head_bytes = units.head_bytes;
  p.scale_log2 = a.effective_scale() * kLog2e;
  p.k_scale = a.k_scale;
  p.v_scale = a.v_scale;
  p.k_scales = a.k_scales;
  p.v_scales = a.v_scales;
  p.k_token_scales = a.k_token_scales;
  p.v_token_scales = a.v_token_scales;
  const CacheLayout ts = a.token_scale_layout();
  p.ts_block = ts.block_stride;
  p.ts_head = ts.head_stride;
  p.ts_token = ts.token_stride;
  p.plan = plan.options;
  p.p_lo = p_needs_lo(a.k_dtype, a.out_dtype);
  p.q_indptr = a.q_indptr;
  p.q_rows = a.q_rows();
  p.max_q = a.q_len_bound();
  p.tree_mask = a.tree_mask;
  p.tree_mask_indptr = a.tree_mask_indptr;
  p.rows_per_cta = plan.kernel.rows_per_cta;
  p.row_chunks = plan.kernel.row_chunks;
  const WorkspaceLayout& ws = plan.workspace;
  p.split_offset = reinterpret_cast<int*>(workspace);
  p.part_ml = reinterpret_cast<float*>(workspace + ws.offsets_bytes);
  p.part_acc = reinterpret_cast<float*>(workspace + ws.offsets_bytes + ws.ml_bytes);
  p.out = a.out;
  p.out_dtype = static_cast<int>(a.out_dtype);
  p.lse = a.lse;
  p.pdl = current_device().pdl;
  return p;
}

GeneralVariant general_variant(const DecodeArgs& a) {
  GeneralVariant v;
  const float cap = a.logits_soft_cap;
  v.cap2 = cap > 0.f ? cap * kLog2e : 0.f;
  v.cap_k = cap > 0.f ? soft_cap_exp2_scale(v.cap2) : 0.f;
  v.alibi = a.alibi_slopes;
  v.sinks = a.sinks;
  v.transforms = cap > 0.f || a.alibi_slopes != nullptr;
  return v;
}

CombineParams make_combine_params(const DecodeArgs& a, const SplitParams& p) {
  CombineParams c{};
  c.part_ml = p.part_ml;
  c.part_acc = p.part_acc;
  c.split_offset = p.split_offset;
  c.q_indptr = p.q_indptr;
  c.q_rows = p.q_rows;
  c.max_q = p.max_q;
  c.out = a.out;
  c.out_stride = a.out_stride();
  c.lse = a.lse;
  c.batch = a.batch;
  c.num_heads = a.num_heads;
  c.head_dim = a.head_dim;
  return c;
}

}  // namespace pagedattn::detail::cuda
