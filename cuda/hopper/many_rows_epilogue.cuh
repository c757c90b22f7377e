// The many-row kernel's epilogue: each thread's two rows, their sums reduced over the quad of
// lanes that share them, written as the tensor-core path writes them (mma_path.cuh): out and lse
// when the CTA holds its sequence's only split (the sink folded in), else one partial state per
// row (m in log2 units, l, acc) for the combine.
#pragma once

#include "../store_out.cuh"
#include "../variant_policy.cuh"
#include "many_rows_consumer.cuh"

namespace pagedattn::detail::cuda::sm90 {

template <typename V>
__device__ inline void store_rows(const SplitParams& p, const V& var, const TileWork& tw,
                                  const RowPair<V>& rp, const float (&o)[64],
                                  const SoftmaxState2 (&st)[2]) {
  const int lane = threadIdx.x % 32;
  const CtaItem& item = tw.w.item;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    SoftmaxState2 total = st[r];
    total.l += __shfl_xor_sync(0xffffffffu, total.l, 1);
    total.l += __shfl_xor_sync(0xffffffffu, total.l, 2);
    const QueryRow& row = rp.row[r];
    if (!row.valid) continue;
    const int c0 = 2 * (lane % 4);
    if (item.finish) {
      const std::int64_t out_at =
          row.qrow * p.out_stride + static_cast<std::int64_t>(row.head) * kHeadDim;
      const float fa = var.finish(total, row.head);  // the variant's finish (a sink)
      const float inv = total.inv_sum() * fa;
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        store_out_pair(p.out, p.out_dtype, out_at + 8 * i + c0, o[4 * i + 2 * r] * inv,
                       o[4 * i + 2 * r + 1] * inv);
      }
      if (p.lse != nullptr && c0 == 0) {
        p.lse[static_cast<std::int64_t>(row.qrow) * p.num_heads + row.head] = total.lse();
      }
      continue;
    }
    const std::int64_t pidx = item.part_base +
                              static_cast<std::int64_t>(item.n_q - 1 - row.back) * p.num_heads +
                              row.head;
    if (c0 == 0) {
      p.part_ml[2 * pidx] = total.m;
      p.part_ml[2 * pidx + 1] = total.l;
    }
    float* dst = p.part_acc + pidx * kHeadDim;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      *reinterpret_cast<float2*>(dst + 8 * i + c0) =
          make_float2(o[4 * i + 2 * r], o[4 * i + 2 * r + 1]);
    }
  }
}

}  // namespace pagedattn::detail::cuda::sm90
