// The body of ItemKernel, included by exactly one translation unit per instruction set. Each
// K/V row is widened once and used by every query head of the group (never once per head).
#pragma once

#include <algorithm>
#include <cmath>

#include "cpu_kernel.hpp"
#include "pagedattn/online_softmax.hpp"
#include "widen.hpp"

namespace pagedattn::detail::cpu {
namespace {

// scores[r * stride] = dot(q_r, k) for R query rows q_r = q + r * head_dim.
template <class Arch, int R, class T>
inline void dot_rows(const float* q, const T* k, int head_dim, float* scores, int stride) {
  using B = fbatch<Arch>;
  constexpr int W = static_cast<int>(B::size);
  B sum[R];
  for (int r = 0; r < R; ++r) sum[r] = B(0.f);
  for (int d = 0; d < head_dim; d += W) {
    const B kk = Widen<Arch>::load(k + d);
    for (int r = 0; r < R; ++r)
      sum[r] = xsimd::fma(B::load_unaligned(q + r * head_dim + d), kk, sum[r]);
  }
  for (int r = 0; r < R; ++r) scores[r * stride] = xsimd::hadd(sum[r]);
}

template <class Arch, class T>
void run_item(const ItemContext& c, const WorkItem& it, float* m, float* l, float* acc,
              ItemScratch scratch) {
  using B = fbatch<Arch>;
  constexpr int W = static_cast<int>(B::size);
  const int D = c.layout.head_dim, BS = c.layout.block_size, G = c.group_size;
  const int L = c.context_lens[it.seq];
  const float* q =
      c.q_scaled + (static_cast<std::int64_t>(it.seq) * c.num_heads + it.kv_head * G) * D;
  const T* k_cache = static_cast<const T*>(c.k_cache);
  const T* v_cache = static_cast<const T*>(c.v_cache);
  float* s = scratch.scores;  // [G][BS]: logits, then weights

  for (int g = 0; g < G; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.f;
  }
  std::fill(acc, acc + static_cast<std::int64_t>(G) * D, 0.f);

  for (int blk = it.block_begin; blk < it.block_end; ++blk) {
    const int id = c.table.block(it.seq, blk);
    int n = valid_in_block(L, BS, blk);
    int kv = it.kv_head;
    if (c.fault == Fault::kLastBlockOffByOne && n < BS) ++n;
    if (c.fault == Fault::kWrongKvHead && kv == 1) kv = 0;
    const std::int64_t base = c.layout.offset(id, kv, 0);
    const T* kb = k_cache + base;
    const T* vb = v_cache + base;

    // Logits for the whole group, each key row read once.
    for (int t = 0; t < n; ++t) {
      const T* kt = kb + t * c.layout.token_stride;
      int g = 0;
      for (; g + 4 <= G; g += 4) dot_rows<Arch, 4>(q + g * D, kt, D, s + g * BS + t, BS);
      for (; g < G; ++g) dot_rows<Arch, 1>(q + g * D, kt, D, s + g * BS + t, BS);
    }

    // Online softmax per head; rescale the accumulator only when the max moved.
    for (int g = 0; g < G; ++g) {
      SoftmaxState state{m[g], l[g]};
      const float alpha = softmax_update(state, s + g * BS, s + g * BS, n);
      m[g] = state.m;
      l[g] = state.l;
      if (alpha != 1.f) {
        float* a = acc + static_cast<std::int64_t>(g) * D;
        const B va(alpha);
        for (int d = 0; d < D; d += W) (B::load_unaligned(a + d) * va).store_unaligned(a + d);
      }
    }

    // acc[g] += sum_t p[g][t] * V_t, each value row read once.
    for (int t = 0; t < n; ++t) {
      const T* vt = vb + t * c.layout.token_stride;
      for (int d = 0; d < D; d += W) {
        const B vv = Widen<Arch>::load(vt + d);
        for (int g = 0; g < G; ++g) {
          float* a = acc + static_cast<std::int64_t>(g) * D + d;
          xsimd::fma(B(s[g * BS + t]), vv, B::load_unaligned(a)).store_unaligned(a);
        }
      }
    }
  }
}

}  // namespace

template <class Arch>
void ItemKernel::operator()(Arch, const ItemContext& ctx, const WorkItem& item, float* m, float* l,
                            float* acc, ItemScratch scratch) const {
  switch (ctx.kv_dtype) {
    case DType::kF32:
      run_item<Arch, float>(ctx, item, m, l, acc, scratch);
      break;
    case DType::kF16:
      run_item<Arch, f16_t>(ctx, item, m, l, acc, scratch);
      break;
    case DType::kBF16:
      run_item<Arch, bf16_t>(ctx, item, m, l, acc, scratch);
      break;
  }
}

}  // namespace pagedattn::detail::cpu
