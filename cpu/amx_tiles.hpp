// One block of a tile of 8 or 16 query heads on AMX tiles (isa_amx.cpp). Q.K: S^T = K Q^T with
// _tile_dpbf16ps, K rows read straight from the cache as the A tile and the heads' q packed once
// per task as the B tile. P.V with bf16 weights (a bf16 out): acc += P V, V interleaved in token
// pairs as the B tile.
// Part of the item kernel (item_kernel_impl.hpp), included only by the per-instruction-set
// translation units: internal linkage keeps each set's copy, built with its own flags, apart.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "widen.hpp"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#include <immintrin.h>
#endif

namespace pagedattn::detail::cpu {
namespace {

// One bf16 word of q packed for the B tile (amx_pack_q): a distinct type, so that the kernel
// body takes the AMX scores step for it.
struct AmxQWord {
  std::uint16_t bits;
};

// The tile shapes, for tiles of N = 8 or 16 query heads. A holds 16 tokens x 32 head dims of K
// (64 bytes a row, one row per token, at the cache's own stride); B holds 32 head dims x N query
// heads in the pair layout _tile_dpbf16ps needs (row j: the pairs (q_h[2j], q_h[2j + 1]) of heads
// h = 0..N-1, 4 N bytes); C holds 16 tokens x N heads of f32 sums. Head dims step 32 at a time, so
// head_dim must be a multiple of 32.
constexpr int kAmxTokens = 16;
constexpr int kAmxDims = 32;
constexpr int kAmxHeads = 8;       // the narrow tile: any multiple of 8 rows per kv head
constexpr int kAmxWideHeads = 16;  // the wide tile: a tile's 16 rows of 64 bytes in C and B

// Heads per tile for `rows` rows per kv head (a multiple of 8: the group, or query tokens x the
// group): 16 where they come in sixteens, so every tile of the task has the same shape and the
// tiles are configured once per task; 8 otherwise. A 16-head tile does the work of two 8-head
// ones in each _tile_dpbf16ps and each load of K or V.
inline int amx_tile_heads(int rows) {
  return rows % kAmxWideHeads == 0 ? kAmxWideHeads : kAmxHeads;
}

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)

// The tile registers: for Q.K tmm0 = C, tmm1 = K (A), tmm2 = q (B); for P.V (amx_block_values)
// tmm3 = the bf16 weights (A: N heads x 16 tokens), tmm4 and tmm5 = two 16-column halves of a
// 32-dim chunk of V in token pairs (B: 8 pairs x 16 dims x 2), tmm6 and tmm7 = the matching
// accumulators (C: N heads x 16 f32). GCC's tile intrinsics paste their register arguments into
// the instruction text, so the calls below name them by number.
constexpr int kAmxTileC = 0, kAmxTileK = 1, kAmxTileQ = 2;
constexpr int kAmxTileP = 3, kAmxTileV0 = 4, kAmxTileV1 = 5, kAmxTileAcc0 = 6, kAmxTileAcc1 = 7;

// ldtilecfg's 64-byte operand: palette 1, and rows and bytes per row of each tile.
struct alignas(64) AmxTileConfig {
  std::uint8_t palette = 1;
  std::uint8_t start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
};

// Configures this thread's tiles for tiles of `heads` (8 or 16) query heads. The configuration
// belongs to the thread; _tile_release gives the tiles back (the kernel calls it at the end of
// each task).
inline void amx_configure_tiles(int heads) {
  AmxTileConfig cfg;
  cfg.rows[kAmxTileC] = kAmxTokens;
  cfg.colsb[kAmxTileC] = heads * sizeof(float);
  cfg.rows[kAmxTileK] = kAmxTokens;
  cfg.colsb[kAmxTileK] = kAmxDims * sizeof(bf16_t);
  cfg.rows[kAmxTileQ] = kAmxDims / 2;
  cfg.colsb[kAmxTileQ] = heads * 2 * sizeof(bf16_t);
  cfg.rows[kAmxTileP] = heads;
  cfg.colsb[kAmxTileP] = kAmxTokens * sizeof(bf16_t);
  for (int tile : {kAmxTileV0, kAmxTileV1}) {
    cfg.rows[tile] = kAmxTokens / 2;
    cfg.colsb[tile] = kAmxTokens * 2 * sizeof(bf16_t);
  }
  for (int tile : {kAmxTileAcc0, kAmxTileAcc1}) {
    cfg.rows[tile] = heads;
    cfg.colsb[tile] = kAmxTokens * sizeof(float);
  }
  _tile_loadconfig(&cfg);
}

// Packs `heads` query heads (rows of D bf16 at q) as B tiles of N heads (N = tile_heads, which
// divides heads): tile g / N starts at out + g * D, its 32-dim step c at + c * 32 N, and word
// 2 N j + 2 h + e of the step is q_{g+h}[32 c + 2 j + e]. A pair of q words moves as one 32-bit
// unit: the packing is a transpose of N x 16 pairs per step.
inline void amx_pack_q(const bf16_t* q, int heads, int D, int tile_heads, AmxQWord* out) {
  const int step_words = kAmxDims * tile_heads;
  for (int g = 0; g < heads; g += tile_heads) {
    for (int c = 0; c < D / kAmxDims; ++c) {
      AmxQWord* step = out + static_cast<std::int64_t>(g) * D + c * step_words;
      for (int h = 0; h < tile_heads; ++h) {
        const bf16_t* row = q + static_cast<std::int64_t>(g + h) * D + c * kAmxDims;
        for (int j = 0; j < kAmxDims / 2; ++j) {
          std::memcpy(step + j * 2 * tile_heads + 2 * h, row + 2 * j, 2 * sizeof(bf16_t));
        }
      }
    }
  }
}

// Transposes the 16 x 16 floats of x (x[i] lane j becomes x[j] lane i) in four rounds of
// shuffles: pairs within 128-bit lanes (unpack), quads within them (shuffle_ps), then 128-bit
// lanes across two vectors twice (shuffle_f32x4). 64 shuffles, where 16 gathers of 16 load 256
// floats one by one.
inline void amx_transpose16(__m512 (&x)[16]) {
  __m512 t[16], u[16];
  for (int i = 0; i < 16; i += 2) {  // t[i] lane L: x[i][4L], x[i+1][4L], x[i][4L+1], x[i+1][4L+1]
    t[i] = _mm512_unpacklo_ps(x[i], x[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(x[i], x[i + 1]);
  }
  for (int g = 0; g < 16; g += 4) {  // u[g + j] lane L: column 4L + j of rows g..g+3
    u[g] = _mm512_shuffle_ps(t[g], t[g + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[g + 1] = _mm512_shuffle_ps(t[g], t[g + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[g + 2] = _mm512_shuffle_ps(t[g + 1], t[g + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[g + 3] = _mm512_shuffle_ps(t[g + 1], t[g + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  // t[h + j] lanes: column j of rows h..h+3, column 8 + j of them, column j of rows h+4..h+7,
  // column 8 + j of them; t[h + 4 + j] the same for columns 4 + j and 12 + j.
  for (int h = 0; h < 16; h += 8) {
    for (int j = 0; j < 4; ++j) {
      t[h + j] = _mm512_shuffle_f32x4(u[h + j], u[h + 4 + j], 0x88);
      t[h + 4 + j] = _mm512_shuffle_f32x4(u[h + j], u[h + 4 + j], 0xdd);
    }
  }
  for (int j = 0; j < 8; ++j) {  // the columns j and j + 8 of all 16 rows
    x[j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0x88);
    x[j + 8] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0xdd);
  }
}

// s[r * ss + t0 + t] = scale * sums[t * N + r] for r < N, t < 16: the C tile (tokens x heads)
// transposed into the kernel's head rows; 16 heads by shuffles (amx_transpose16), 8 by a gather
// each. Lanes past the block's tokens get whatever the tile computed for them; the softmax never
// reads them as logits.
template <int N>
inline void amx_store_scores(const float* sums, float* s, int ss, float scale) {
  const __m512 vscale = _mm512_set1_ps(scale);
  if constexpr (N == kAmxWideHeads) {
    __m512 x[16];
    for (int t = 0; t < kAmxTokens; ++t) x[t] = _mm512_load_ps(sums + t * N);
    amx_transpose16(x);
    for (int r = 0; r < N; ++r) _mm512_store_ps(s + r * ss, _mm512_mul_ps(x[r], vscale));
  } else {
    const __m512i rows =
        _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                           _mm512_set1_epi32(N));
#pragma GCC unroll 8
    for (int r = 0; r < N; ++r) {
      const __m512 column = _mm512_i32gather_ps(rows, sums + r, sizeof(float));
      _mm512_store_ps(s + r * ss, _mm512_mul_ps(column, vscale));
    }
  }
}

// s[r * ss + t] = scale * dot(q_r, k_t) for the N heads of a tile (N = 8 or 16, as configured),
// t < n, on raw bf16 q and K: per 16 tokens, one _tile_dpbf16ps per 32 head dims adds the 16 x N
// dot products of that step (each pair of products added to the f32 sum, rounded to nearest
// even, denormals flushed). Full 16-token steps load K from the cache; a last partial step copies
// its n % 16 rows into a buffer first, so no row past the block's tokens is read. q: the tile's
// packed B (amx_pack_q). The tiles must be configured for N heads (amx_configure_tiles).
template <int N, class Prefetch>
inline void amx_block_scores(const AmxQWord* q, int D, const bf16_t* k, std::int64_t ts, int n,
                             float* s, int ss, float scale, Prefetch& pf) {
  static_assert(N == kAmxHeads || N == kAmxWideHeads, "a configured tile width");
  alignas(64) float sums[kAmxTokens * N];
  alignas(64) bf16_t part[kAmxTokens * kAmxDims];
  const std::int64_t k_stride = ts * static_cast<std::int64_t>(sizeof(bf16_t));
  for (int t0 = 0; t0 < n; t0 += kAmxTokens) {
    const int rows = std::min(kAmxTokens, n - t0);
    const bf16_t* kt = k + t0 * ts;
    _tile_zero(0);
    for (int d = 0; d < D; d += kAmxDims) {
      pf.piece();
      if (rows == kAmxTokens) {
        _tile_loadd(1, kt + d, k_stride);
      } else {
        std::memset(part, 0, sizeof(part));
        for (int t = 0; t < rows; ++t) {
          std::memcpy(part + t * kAmxDims, kt + t * ts + d, kAmxDims * sizeof(bf16_t));
        }
        _tile_loadd(1, part, kAmxDims * sizeof(bf16_t));
      }
      _tile_loadd(2, q + (d / kAmxDims) * kAmxDims * N, N * 2 * sizeof(bf16_t));
      _tile_dpbf16ps(0, 1, 2);
    }
    _tile_stored(0, sums, N * sizeof(float));
    amx_store_scores<N>(sums, s + t0, ss, scale);
  }
}

// acc_r[0, D) += sum_{t < n} p_r[t] v_t for the N heads of a tile (as configured), with bf16
// weights (weights_to_bf16: row r's weights at the start of s + r * ss, 0 past the block's tokens)
// and one _tile_dpbf16ps per 16 head dims and 16 tokens. V enters as B in token pairs: the words of
// rows t and t + 1 interleaved (vpunpcklwd / vpunpckhwd, as values_tile_dp does), so the
// accumulators run in its token-pair order (from_token_pair_order puts them back). A token past
// the block's n is a zero row, never read from the cache (0 weight times a NaN would be NaN).
template <class Prefetch>
inline void amx_block_values(const float* s, int ss, const bf16_t* v, std::int64_t ts, int n,
                             float* acc, int D, Prefetch& pf) {
  alignas(64) bf16_t pairs[2][kAmxTokens / 2][2 * kAmxTokens];
  const bf16_t* weights = reinterpret_cast<const bf16_t*>(s);
  const std::int64_t p_stride = ss * static_cast<std::int64_t>(sizeof(float));
  const std::int64_t acc_stride = D * static_cast<std::int64_t>(sizeof(float));
  for (int t0 = 0; t0 < n; t0 += kAmxTokens) {
    _tile_loadd(3, weights + t0, p_stride);
    for (int d = 0; d < D; d += kAmxDims) {
      pf.piece();
      for (int i = 0; i < kAmxTokens / 2; ++i) {
        const int t = t0 + 2 * i;
        const __m512i zero = _mm512_setzero_si512();
        const __m512i x0 = t < n ? _mm512_loadu_si512(v + t * ts + d) : zero;
        const __m512i x1 = t + 1 < n ? _mm512_loadu_si512(v + (t + 1) * ts + d) : zero;
        _mm512_store_si512(pairs[0][i], _mm512_unpacklo_epi16(x0, x1));
        _mm512_store_si512(pairs[1][i], _mm512_unpackhi_epi16(x0, x1));
      }
      float* a = acc + d;
      _tile_loadd(4, pairs[0], sizeof(pairs[0][0]));
      _tile_loadd(5, pairs[1], sizeof(pairs[1][0]));
      _tile_loadd(6, a, acc_stride);
      _tile_loadd(7, a + kAmxTokens, acc_stride);
      _tile_dpbf16ps(6, 3, 4);
      _tile_dpbf16ps(7, 3, 5);
      _tile_stored(6, a, acc_stride);
      _tile_stored(7, a + kAmxTokens, acc_stride);
    }
  }
}

#endif
}  // namespace
}  // namespace pagedattn::detail::cpu
