// The body of ItemKernel, included by exactly one translation unit per instruction set.
//
// Per physical block and per tile of up to eight query heads of the GQA group (16 on AMX):
//   scores  S[r][t] = dot(q_r, k_t)          R heads x TT tokens of accumulators, reduced W at a
//                                            time by RowSums; each K row widened once per tile
//                                            (or, with AVX-512 BF16 and a bf16 q, not widened:
//                                            vdpbf16ps on the raw bf16 q and K, scaled after)
//   softmax p[r][t] = exp(S[r][t] - m_r)      vector exp over the block; acc and l rescaled only
//                                            when the block raises the running max m_r
//   values  acc_r  += sum_t p[r][t] * v_t    R heads x DC vectors of acc held in registers over
//                                            the block; each V row widened once per tile
//                                            (or, with a bf16 out on AVX-512 BF16: weights
//                                            rounded to bf16, two tokens per vdpbf16ps)
// On AMX (isa_amx.cpp, amx_tiles.hpp) the scores of a bf16 q and cache are one tile product
// S^T = K Q^T per 16 tokens, and with a bf16 out the values one tile product acc += P V, on
// tiles of 8 or 16 heads (amx_tile_heads); tiles of 16 heads with a bf16 out and blocks of up to
// 32 tokens run amx_steps.hpp instead of this body.
// The next physical blocks are prefetched while the current one is computed. Nothing allocates.
// The three steps are block_scores.hpp, block_softmax.hpp and block_values.hpp; the prefetch is
// paced_prefetch.hpp. Here: a block's tile of heads, an item's blocks, and the entry points.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "amx_tiles.hpp"
#include "block_scores.hpp"
#include "block_softmax.hpp"
#include "block_values.hpp"
#include "cpu_kernel.hpp"
#include "dequantize_rows.hpp"
#include "lane_orders.hpp"
#include "paced_prefetch.hpp"
#include "pagedattn/detail/visit_dtype.hpp"
#include "pagedattn/variants.hpp"
#include "tile_shape.hpp"
#include "widen.hpp"

namespace pagedattn::detail::cpu {
namespace {

// Whether q enters as the AMX kernel's packed B tiles (amx_pack_q): then its tiles of heads are
// AMX tiles.
template <class QT>
constexpr bool kAmxQ = std::is_same_v<QT, AmxQWord>;

// P V of the tile's R heads (weights in s, RV heads per values tile) over their first n tokens;
// with rows_n, head r over its first rows_n[r], one head per values tile, so no head reads a V
// row past its own tokens (0 x NaN would reach it). PW: the weights are bf16 pairs already.
template <class Arch, int R, int RV, int DC, bool P, bool PW, class T>
inline void tile_values(float* s, int ss, const T* v, std::int64_t ts, int n, const int* rows_n,
                        float* acc, int D, PacedPrefetch& pf) {
  if (rows_n != nullptr) {
    for (int r = 0; r < R; ++r) {
      if (rows_n[r] > 0) {
        tile_values<Arch, 1, 1, TileShape<Arch>::vectors(1), P, PW>(
            s + r * ss, ss, v, ts, rows_n[r], nullptr, acc + r * D, D, pf);
      }
    }
    return;
  }
  constexpr int W = TileShape<Arch>::W;
#if defined(__AVX512BF16__)
  if constexpr (PW) {
    for (int r = 0; r < R; r += RV) {
      const bf16_t* p = reinterpret_cast<const bf16_t*>(s + r * ss);
      float* a = acc + static_cast<std::int64_t>(r) * D;
      int d = 0;
      for (; d + DC * W <= D; d += DC * W) {
        pf.piece();
        values_tile_dp<RV, DC>(p, 2 * ss, v, ts, n, a, D, d);
      }
      // The rest by chunks: 32 elements of a bf16 cache (D a multiple of 32), 64 fp8 codes.
      constexpr int kChunk = is_fp8_type<T> ? 4 : 2;
      for (; d < D; d += kChunk * W) values_tile_dp<RV, kChunk>(p, 2 * ss, v, ts, n, a, D, d);
    }
    return;
  }
#else
  static_assert(!PW, "bf16 weights need AVX-512 BF16");
#endif
  for (int r = 0; r < R; r += RV) {
    const float* p = s + r * ss;
    float* a = acc + static_cast<std::int64_t>(r) * D;
    int d = 0;
    for (; d + DC * W <= D; d += DC * W) {
      pf.piece();
      values_tile<Arch, RV, DC, P>(p, ss, v, ts, n, a, D, d);
    }
    if constexpr (P) {  // D is a multiple of NG W here
      constexpr int NG = kGroupBatches<Arch, T>;
      for (; d < D; d += NG * W) values_tile<Arch, RV, NG, P>(p, ss, v, ts, n, a, D, d);
    } else {
      for (; d < D; d += W) values_tile<Arch, RV, 1, P>(p, ss, v, ts, n, a, D, d);
    }
  }
}

template <int R>
using Heads = std::integral_constant<int, R>;

// Heads of the tile that starts at row g of a kv head's G rows. On AMX the task's tile width
// (amx_tile_heads), which divides G. Otherwise tiles of 8 heads, then 4, then the rest (1 to 3):
// with 16 registers an 8-head tile cannot keep q in registers (see scores_tile), so two 4-head
// tiles run faster there.
template <class Arch, class QT>
inline int tile_heads(int G, int g) {
  if constexpr (kAmxQ<QT>) return amx_tile_heads(G);
  const int rest = G - g;
  return rest >= 8 && TileShape<Arch>::kRegs == 32 ? 8 : rest >= 4 ? 4 : rest;
}

// One block of n tokens (k, v: its first slot) for R query heads starting at q.
template <class Arch, int R, bool P, bool PW, class T, class QT>
inline void block_tile(const QT* q, const T* k, const T* v, std::int64_t ts, int n, int D,
                       float scale, const BlockLogits& var, float* s, int ss, float* m, float* l,
                       float* acc, PacedPrefetch& pf) {
  using Shape = TileShape<Arch>;
  constexpr int W = Shape::W;
  constexpr int TT = Shape::tokens(R);
  // fp8 V through f16 costs several instructions per widened batch: with 32 registers an 8-head
  // tile (two vectors of head_dim per head, 16 accumulators) widens each V row once instead of
  // twice. Quads (the table, about half the instructions) need four vectors per tile.
  constexpr bool kQuadV = P && kGroupBatches<Arch, T> == 4;
  constexpr bool kWideV = is_fp8_type<T> && Shape::kRegs == 32 && R == 8 && !kQuadV;
  constexpr int RV = kWideV ? 8 : Shape::value_heads(R);
  constexpr int DC = kWideV ? 2 : Shape::vectors(RV);
  static_assert(R % RV == 0, "values tiles cover the scores tile");
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
  if constexpr (kAmxQ<QT>) {
    amx_block_scores<R>(q, D, k, ts, n, s, ss, scale, pf);
  } else
#endif
  {
    int t = 0;
    for (; t + TT <= n; t += TT) {
      pf.piece();
      scores_of<Arch, R, TT, P>(q, D, k + t * ts, ts, s + t, ss, scale);
    }
    for (; t < n; ++t) scores_of<Arch, R, 1, P>(q, D, k + t * ts, ts, s + t, ss, scale);
  }
  if (var.active()) transform_logits<Arch, R>(s, ss, n, var);
  softmax_tile<Arch, R>(s, ss, n, var.rows_n, m, l, acc, D);
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
  if constexpr (PW && kAmxQ<QT>) {
    weights_to_bf16<R>(s, ss, n);
    if (var.rows_n == nullptr) {
      amx_block_values(s, ss, v, ts, n, acc, D, pf);
      return;
    }
    tile_values<Arch, R, RV, DC, P, PW>(s, ss, v, ts, n, var.rows_n, acc, D, pf);
    return;
  }
#endif
#if defined(__AVX512BF16__)
  if constexpr (PW) {
    static_assert((std::is_same_v<T, bf16_t> || kQuadV) && P, "bf16 words of V");
    weights_to_bf16<R>(s, ss, n);
  }
#endif
  tile_values<Arch, R, RV, DC, P, PW>(s, ss, v, ts, n, var.rows_n, acc, D, pf);
}

// Rows [slot, slot + n) of kv head kv of block id as f32 into rows (K, then V at rows + block_size
// * head_dim): codes times the per-token scales where there are some.
template <class Arch, class T>
void dequantize_stretch(const ItemContext& c, const T* k, const T* v, int id, int kv, int slot,
                        int n, float* rows) {
  const int D = c.layout.head_dim;
  const std::int64_t ts = c.layout.token_stride;
  const float* ks = nullptr;
  const float* vs = nullptr;
  if (c.k_token_scales != nullptr) {
    const std::int64_t at = c.token_scale_layout.offset(id, kv, slot);
    ks = c.k_token_scales + at;
    vs = c.v_token_scales + at;
  }
  const std::int64_t step = c.token_scale_layout.token_stride;
  dequantize_rows<Arch>(k, ts, n, D, ks, step, rows);
  dequantize_rows<Arch>(v, ts, n, D, vs, step,
                        rows + static_cast<std::int64_t>(c.layout.block_size) * D);
}

// Folds the blocks of `it` for kv heads [it.kv_head, it.kv_head + kv_count) into their states
// (m, l: kv_count * G entries; acc: kv_count * G rows of D). Block by block, every kv head of the
// range in turn: in the [block][kv head][slot][dim] layout this walks one contiguous stretch of
// K and of V per block (kv_count x 4 KB for bf16, D = 128, block 16) instead of one 4 KB piece
// per kv head at a random place, which the memory system serves much faster.
// DQ: the cache's codes are dequantized per stretch into scratch.rows (dequantize_rows.hpp, with
// the per-token scales) and the tiles read those f32 rows.
template <class Arch, class T, bool P, bool PW = false, class QT, bool DQ = false>
void run_item(const ItemContext& c, const WorkItem& it, int kv_count, const QT* q_heads, float* m,
              float* l, float* acc, ItemScratch scratch) {
  const int D = c.layout.head_dim, BS = c.layout.block_size, G = c.group_size;
  const std::int64_t ts = c.layout.token_stride;
  const int L = c.context_lens[it.seq];
  const T* k_cache = static_cast<const T*>(c.k_cache);
  const T* v_cache = static_cast<const T*>(c.v_cache);
  const int ss = scores_stride(BS);
  float* s = scratch.scores;  // [kHeadTile][ss]: logits, then weights
  const int kv_first = it.kv_head, kv_last = it.kv_head + kv_count - 1;
  const int heads = kv_count * G;

  for (int g = 0; g < heads; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.f;
  }
  std::fill(acc, acc + static_cast<std::int64_t>(heads) * D, 0.f);

  // The item's (block, kv head) units in compute order: unit u is kv head kv_first + u % kv_count
  // of logical block block_begin + u / kv_count, its valid rows of K and of V. Units [0, ahead)
  // are prefetched at once (nothing to overlap with yet); then, while unit u is computed, unit
  // u + ahead is prefetched in pieces. A short distance in units keeps the prefetched lines in L1
  // until they are used; the hardware prefetcher follows the contiguous stretch of several kv
  // heads beyond it. Never past the item: table entries past the context may be garbage.
  const int units = (it.block_end - it.block_begin) * kv_count;
  // A row's bytes (int4x2_t holds two of its D values).
  constexpr int kPerUnit = std::is_same_v<T, int4x2_t> ? 2 : 1;
  const std::int64_t row_bytes = static_cast<std::int64_t>(D) / kPerUnit * sizeof(T);
  const int ahead = prefetch_units(2 * static_cast<std::int64_t>(BS) * row_bytes);
  auto start_unit = [&](PacedPrefetch& p, int u, int pieces) {
    if (u >= units) {
      p.start(nullptr, nullptr, 0, 0, 0, 1);
      return;
    }
    const int b = it.block_begin + u / kv_count;
    const std::int64_t base = c.layout.offset(c.table.block(it.seq, b), kv_first + u % kv_count, 0);
    constexpr std::int64_t kElem = sizeof(T);
    p.start(k_cache + base, v_cache + base, valid_in_block(L, BS, b), row_bytes, ts * kElem,
            pieces);
  };
  PacedPrefetch pf;
  for (int u = 0; u < std::min(units, ahead); ++u) {
    start_unit(pf, u, 1);
    pf.rest();
  }
  // With a window or a shared prefix, the tokens of the first block before the first computed one
  // are skipped (never computed).
  const int first_tok = first_computed_token(c, it.seq, L);
  const QueryBounds qb = query_bounds(c, it.seq, L);  // query tokens together
  int rows_n[kHeadTile];  // the tile's rows' token counts in a block past a causal bound
  // One stretch of n attended tokens of block `id`, the first at position pos, for kv head
  // kv_first + i: every tile of its G query heads.
  const auto block_run = [&](int pos, int n, int id, int i) {
    const int kv = kv_first + i;
    // The factor of the dot products of a raw bf16 q (q_scaled has it in): an fp8 cache's K
    // scale joins the softmax scale.
    const float logit_scale =
        is_fp8_type<T> ? c.scale * head_scale(c.k_scale, c.k_scales, kv) : c.scale;
    const std::int64_t base = c.layout.offset(id, kv, pos % BS);
    const QT* q = q_heads + static_cast<std::int64_t>(i) * G * D;
    float* mi = m + i * G;
    float* li = l + i * G;
    float* ai = acc + static_cast<std::int64_t>(i) * G * D;
    if constexpr (DQ)
      dequantize_stretch<Arch>(c, k_cache + base, v_cache + base, id, kv, pos % BS, n,
                               scratch.rows);
    BlockLogits var;
    var.cap = c.soft_cap;
    var.first_pos = pos - (L - 1);
    for (int g = 0; g < G;) {
      const QT* qg = q + static_cast<std::int64_t>(g) * D;
      float* ag = ai + static_cast<std::int64_t>(g) * D;
      const int R = tile_heads<Arch, QT>(G, g);
      if (c.alibi_slopes != nullptr) var.slopes = c.alibi_slopes + kv * G + g;
      // Query tokens together: where the block passes the causal bound of some of the tile's
      // rows, each row takes the prefix of the block it attends; under a tree mask a new token
      // comes alone (attended_runs), and a row takes it where its mask row keeps it.
      var.rows_n = nullptr;
      const int last = pos + n - 1;  // the run's last position
      if (c.token_group > 0 &&
          (last > qb.first_query_pos || (qb.tree != nullptr && last >= qb.first_query_pos))) {
        for (int r = 0; r < R; ++r) {
          rows_n[r] = std::clamp(qb.last_pos(g + r) - pos + 1, 0, n);
          if (qb.tree != nullptr && pos >= qb.first_query_pos && !qb.keeps(g + r, pos)) {
            rows_n[r] = 0;
          }
        }
        var.rows_n = rows_n;
      }
      const auto tile = [&](auto heads) {
        if constexpr (DQ) {
          const float* kd = scratch.rows;
          block_tile<Arch, decltype(heads)::value, P, PW>(qg, kd, kd + BS * D, D, n, D, logit_scale,
                                                          var, s, ss, mi + g, li + g, ag, pf);
        } else {
          block_tile<Arch, decltype(heads)::value, P, PW>(qg, k_cache + base, v_cache + base, ts, n,
                                                          D, logit_scale, var, s, ss, mi + g,
                                                          li + g, ag, pf);
        }
      };
      if constexpr (kAmxQ<QT>) {  // AMX tiles: the task's width throughout
        R == kAmxWideHeads ? tile(Heads<kAmxWideHeads>{}) : tile(Heads<kAmxHeads>{});
      } else {
        switch (R) {
          case 8:
            tile(Heads<8>{});
            break;
          case 4:
            tile(Heads<4>{});
            break;
          case 3:
            tile(Heads<3>{});
            break;
          case 2:
            tile(Heads<2>{});
            break;
          default:
            tile(Heads<1>{});
            break;
        }
      }
      g += R;
    }
  };
  const TreeMaskRow* tree = c.tree_rows != nullptr ? &c.tree_rows[it.seq] : nullptr;
  int run_first[kMaxBlockSize], run_n[kMaxBlockSize];  // the block's attended stretches
  for (int blk = it.block_begin; blk < it.block_end; ++blk) {
    const int id = c.table.block(it.seq, blk);
    const int skip = std::max(0, first_tok - blk * BS);
    const int first = blk * BS + skip, count = valid_in_block(L, BS, blk) - skip;
    const int runs = qb.tree != nullptr ? attended_runs(qb, first, count, run_first, run_n)
                                        : attended_runs(tree, first, count, run_first, run_n);
    for (int i = 0; i < kv_count; ++i) {
      pf.rest();
      start_unit(pf, (blk - it.block_begin) * kv_count + i + ahead, kPrefetchPieces);
      for (int run = 0; run < runs; ++run) {
        block_run(blk * BS + skip + run_first[run], run_n[run], id, i);
      }
    }
  }
  pf.rest();
  if constexpr (!DQ) {
    // V widened to its values / kScale: the weighted sums too (the softmax's rescaling and NaN
    // do not depend on it).
    constexpr float kScale = Widen<Arch>::template kScale<T>;
    if constexpr (kScale != 1.f) {
      const std::int64_t n = static_cast<std::int64_t>(heads) * D;
      for (std::int64_t i = 0; i < n; ++i) acc[i] *= kScale;
    }
  }
}

// One task of a cache the context dequantizes (ItemContext::dequantizes): the f32 kernel over
// the rows dequantized per stretch, on the scaled f32 q.
template <class Arch, class T>
void run_item_dequantized(const ItemContext& c, const WorkItem& it, int kv_count, float* m,
                          float* l, float* acc, ItemScratch scratch) {
  const std::int64_t q0 = (static_cast<std::int64_t>(it.seq) * c.num_heads +
                           static_cast<std::int64_t>(it.kv_head) * c.group_size) *
                          c.layout.head_dim;
  run_item<Arch, T, false, false, float, true>(c, it, kv_count, c.q_scaled + q0, m, l, acc,
                                               scratch);
}

// One task: the item's blocks for kv_count kv heads. DP: Q.K as bf16 dot products on the raw
// bf16 q (c.q_bf16; AVX-512 BF16 with a bf16 cache, or an fp8 one through the table of AVX-512
// VBMI, in quads), otherwise on the scaled f32 q. Where the set widens T in pairs or quads, the
// accumulators run in pair or quad order and are put back in order at the end; the f32 q is
// copied into pair order too (into scratch.q: without it, the plain widening), the bf16 q of fp8
// dot products into word order. Where it widens T two batches at a time in order (e4m3 on AVX2
// and AVX-512 without VBMI), only head_dim must be a multiple of 2W.
template <class Arch, class T, bool DP = false>
void run_item(const ItemContext& c, const WorkItem& it, int kv_count, float* m, float* l,
              float* acc, ItemScratch scratch) {
  constexpr int W = static_cast<int>(fbatch<Arch>::size);
  const int D = c.layout.head_dim;
  const int heads = kv_count * c.group_size;
  const std::int64_t head0 = static_cast<std::int64_t>(it.kv_head) * c.group_size * D;
  const std::int64_t q0 = static_cast<std::int64_t>(it.seq) * c.num_heads * D + head0;
  const auto from_pairs = [&] {
    alignas(64) float tmp[2 * W];
    for (int h = 0; h < heads; ++h)
      from_pair_order<W>(acc + static_cast<std::int64_t>(h) * D, tmp, D);
  };
  // Quads: 4W = 64 elements per widening, so head_dim a multiple of 64 (64, 128, 192, 256, 512).
  const bool quads = Widen<Arch>::template kQuads<T> && scratch.q != nullptr && D % (4 * W) == 0;
  const auto from_quads = [&] {
    alignas(64) float tmp[64];
    for (int h = 0; h < heads; ++h) from_quad_order(acc + static_cast<std::int64_t>(h) * D, tmp, D);
  };
  // After P.V on bf16 weights (values_tile_dp): 32-element chunks of a bf16 cache, 64 of fp8.
  const auto from_token_pairs = [&] {
    alignas(64) float tmp[64];
    for (int h = 0; h < heads; ++h) {
      from_token_pair_order<is_fp8_type<T>>(acc + static_cast<std::int64_t>(h) * D, tmp, D);
    }
  };
  if constexpr (DP) {
    const bf16_t* q = c.q_bf16 + it.seq * c.q_bf16_stride + head0;
    if constexpr (is_fp8_type<T>) {
      // Through the table at head dims that are multiples of 64 (with the q buffer); else the
      // AVX-512 kernel (isa_avx512.cpp: the f16 widening, e4m3 two batches at a time).
      if (!quads) return ItemKernel{}(Arch{}, c, it, kv_count, m, l, acc, scratch);
      bf16_t* qw = reinterpret_cast<bf16_t*>(scratch.q);
      for (int h = 0; h < heads; ++h) {
        to_word_order(q + static_cast<std::int64_t>(h) * D, qw + static_cast<std::int64_t>(h) * D,
                      D);
      }
      if (c.bf16_weights) {  // P.V on vdpbf16ps too (a bf16 out)
        run_item<Arch, T, true, true>(c, it, kv_count, static_cast<const bf16_t*>(qw), m, l, acc,
                                      scratch);
        from_token_pairs();
        return;
      }
      run_item<Arch, T, true>(c, it, kv_count, static_cast<const bf16_t*>(qw), m, l, acc, scratch);
      from_quads();
    } else {
#if defined(__AVX512BF16__)
      // P.V on vdpbf16ps too where the weights may be rounded to bf16 (a bf16 out).
      if (c.bf16_weights && D % 32 == 0) {
        run_item<Arch, T, true, true>(c, it, kv_count, q, m, l, acc, scratch);
        from_token_pairs();
        return;
      }
#endif
      if constexpr (Widen<Arch>::template kPairs<T>) {
        if (D % (2 * W) == 0) {
          run_item<Arch, T, true>(c, it, kv_count, q, m, l, acc, scratch);
          from_pairs();
          return;
        }
      }
      run_item<Arch, T, false>(c, it, kv_count, q, m, l, acc, scratch);
    }
  } else {
    const float* q = c.q_scaled + q0;
    if constexpr (Widen<Arch>::template kTwo<T>) {
      // Two batches per widening, in order: q and the accumulators stay as they are.
      if (D % (2 * W) == 0) {
        run_item<Arch, T, true>(c, it, kv_count, q, m, l, acc, scratch);
        return;
      }
    }
    if constexpr (Widen<Arch>::template kPairs<T>) {
      if (scratch.q != nullptr && D % (2 * W) == 0) {
        for (int h = 0; h < heads; ++h) {
          to_pair_order<W>(q + static_cast<std::int64_t>(h) * D, scratch.q + h * D, D);
        }
        run_item<Arch, T, true>(c, it, kv_count, scratch.q, m, l, acc, scratch);
        from_pairs();
        return;
      }
    }
    run_item<Arch, T, false>(c, it, kv_count, q, m, l, acc, scratch);
  }
}

}  // namespace

template <class Arch>
void ItemKernel::operator()(Arch, const ItemContext& ctx, const WorkItem& item, int kv_count,
                            float* m, float* l, float* acc, ItemScratch scratch) const {
  visit_storage_type(ctx.kv_dtype, [&](auto cache_type) {
    using T = typename decltype(cache_type)::type;
    if constexpr (is_quantized_type<T>) {
      if (ctx.dequantizes()) {
        run_item_dequantized<Arch, T>(ctx, item, kv_count, m, l, acc, scratch);
        return;
      }
    }
    // int8 and int4 are always dequantized
    if constexpr (!std::is_same_v<T, int8_code_t> && !std::is_same_v<T, int4x2_t>) {
      run_item<Arch, T>(ctx, item, kv_count, m, l, acc, scratch);
    }
  });
}

template <class Arch>
void ItemKernel::operator()(Arch, const ItemContext& ctx, const WorkItem& item, float* m, float* l,
                            float* acc, ItemScratch scratch) const {
  (*this)(Arch{}, ctx, item, 1, m, l, acc, scratch);
}

}  // namespace pagedattn::detail::cpu
