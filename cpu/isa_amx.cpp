// ItemKernel on AMX (built with the AVX-512 BF16 kernel's flags plus -mamx-tile -mamx-bf16): a
// bf16 cache read with a bf16 q at a GQA group that is a multiple of 8 and a head dim that is a
// multiple of 32 takes Q.K on AMX tiles (amx_tiles.hpp), and with a bf16 out (the weights may be
// rounded to bf16) P.V too: on tiles of 16 heads in steps of 32 tokens with the softmax of all 16
// heads at once (amx_steps.hpp), on tiles of 8 block by block with the AVX-512 kernel's softmax.
// P.V for other outs is the AVX-512 kernel's (V widened in pairs). Anything else runs the
// AVX-512 kernel of isa_avx512.cpp.
#include "amx_steps.hpp"
#include "item_kernel_impl.hpp"

namespace pagedattn::detail::cpu {
namespace {

// Whether the AMX scores step takes this task: the shape fits whole B tiles of heads and whole
// 32-dim steps, and the q buffer is there to hold the packed q.
bool amx_takes(const ItemContext& ctx, const ItemScratch& scratch) {
  return ctx.q_bf16 != nullptr && ctx.kv_dtype == DType::kBF16 && scratch.q != nullptr &&
         ctx.group_size % kAmxHeads == 0 && ctx.layout.head_dim % kAmxDims == 0;
}

// One task on AMX: q packed into the q buffer (kv_count * G * D words of the num_heads * D floats
// it holds) in tiles of amx_tile_heads(G) heads, this thread's tiles configured for them and
// released after the task, and the accumulators put back from the pair order of the widened V.
void run_item_amx(const ItemContext& c, const WorkItem& it, int kv_count, float* m, float* l,
                  float* acc, ItemScratch scratch) {
  using A = xsimd::avx512bw;
  constexpr int W = 16;
  const int D = c.layout.head_dim;
  const int heads = kv_count * c.group_size;
  const std::int64_t head0 = static_cast<std::int64_t>(it.kv_head) * c.group_size * D;
  AmxQWord* q = reinterpret_cast<AmxQWord*>(scratch.q);
  const int tile_heads = amx_tile_heads(c.group_size);
  amx_pack_q(c.q_bf16 + it.seq * c.q_bf16_stride + head0, heads, D, tile_heads, q);
  alignas(64) float tmp[2 * W];
  if (amx_steps_take(c)) {  // steps of 32 tokens, token-major softmax (amx_steps.hpp)
    amx_configure_step_tiles();
    run_item_amx_steps(c, it, kv_count, q, m, l, acc);
    _tile_release();
    for (int h = 0; h < heads; ++h) {
      from_token_pair_order<false>(acc + static_cast<std::int64_t>(h) * D, tmp, D);
    }
    return;
  }
  amx_configure_tiles(tile_heads);
  if (c.bf16_weights) {  // P.V on tiles too (a bf16 out), in token-pair order
    run_item<A, bf16_t, true, true>(c, it, kv_count, static_cast<const AmxQWord*>(q), m, l, acc,
                                    scratch);
    _tile_release();
    for (int h = 0; h < heads; ++h) {
      from_token_pair_order<false>(acc + static_cast<std::int64_t>(h) * D, tmp, D);
    }
    return;
  }
  run_item<A, bf16_t, true>(c, it, kv_count, static_cast<const AmxQWord*>(q), m, l, acc, scratch);
  _tile_release();
  for (int h = 0; h < heads; ++h) {
    from_pair_order<W>(acc + static_cast<std::int64_t>(h) * D, tmp, D);
  }
}

}  // namespace

void item_kernel_amx(const ItemContext& ctx, const WorkItem& item, int kv_count, float* m, float* l,
                     float* acc, ItemScratch scratch) {
  if (amx_takes(ctx, scratch)) return run_item_amx(ctx, item, kv_count, m, l, acc, scratch);
  ItemKernel{}(xsimd::avx512bw{}, ctx, item, kv_count, m, l, acc, scratch);
}

}  // namespace pagedattn::detail::cpu
