// The tensor-core path (f16/bf16 caches with q in the same dtype, any group): S = Q K^T and
// O += P V with mma.sync m16n8k16, the CTA's rows (query token x query head of the group; see
// query_rows.cuh) as M (padded to 16; up to 4 row tiles, 64 rows), 16-token slices as N (scores)
// and K (P V). The keys and values are read once for all of a sequence's query tokens. The 4
// warps take different token slices (or row tiles for more than 16 rows), each with its own
// online-softmax state per row, and merge in a fixed order at the end. For an f32 out (or an f16
// out from a bf16 cache) P is split into hi + lo parts of the storage type, so the P V product
// keeps f32-level accuracy; when out is bf16, or f16 from an f16 cache, P's rounding to the
// storage type is below out's own rounding and P goes in as one part (half the P V products).
#pragma once

#include <cstdint>

#include "fp8_frags.cuh"
#include "kv_pipeline.cuh"
#include "logit_variants.cuh"
#include "pagedattn/online_softmax.hpp"
#include "ptx.cuh"
#include "query_rows.cuh"
#include "split_params.cuh"
#include "store_out.cuh"

namespace pagedattn::detail::cuda {

template <typename T, int D>
struct MmaCfg {
  // fp8 caches keep fp8 tiles and widen the fragments to f16 (fp8_frags.cuh).
  static constexpr bool kFp8 = is_fp8_type<T>;
  using MmaT = typename std::conditional<kFp8, __half, T>::type;
  static constexpr int TT = 64;  // 4 slices of 16 tokens
  static constexpr int ROW = RowGeom<T, D>::kRowBytes;
  static constexpr int TILE = 2 * TT * ROW;
  static constexpr int STAGES = stages_for_tile(TILE);
  // Q fragments live in registers up to D = 128 for 16-bit caches; larger head dims read them
  // from shared memory, as rows in the tile layout (ldmatrix). The fp8 path keeps its converted
  // fragments there at every head dim (16 bytes per lane, k-step and row tile): its widening
  // needs registers of its own.
  static constexpr bool kQInSmem = kFp8 || D > 128;
  static constexpr int QROWS = kMmaRowsPerCta;  // up to 4 row tiles of 16
  static constexpr int SCRATCH = kWarps * 16 * (D + 2) * 4;
  static constexpr int STAGE_AREA = STAGES * TILE > SCRATCH ? STAGES* TILE : SCRATCH;
  static constexpr int QBYTES =
      !kQInSmem ? 0 : (kFp8 ? QROWS / 16 * (D / 16) * 32 * 16 : QROWS * ROW);
  using Pipe = KvPipeline<T, D, TT, STAGES>;
  static constexpr int SMEM = STAGE_AREA + QBYTES + Pipe::kIndexBytes + kSmemAlign;
};

// The largest (or the sum) of N values by a balanced tree: log2(N) dependent steps instead of N.
template <int N, typename Op>
__device__ __forceinline__ float tree_reduce(float (&v)[N], Op op) {
#pragma unroll
  for (int w = 1; w < N; w *= 2) {
#pragma unroll
    for (int i = 0; i + w < N; i += 2 * w) v[i] = op(v[i], v[i + w]);
  }
  return v[0];
}

// kMulti: the item's sequence has several query tokens (item.n_q > 1). One-token decode runs the
// kMulti = false instance, where the per-row masks and the row arithmetic fold away: one-token
// decode, the common case, pays nothing for multi-token queries (docs/cuda.md). kFold (with
// kMulti, in the wide build): a warp that takes 2 or 4 slices of a full tile folds them with one
// softmax step (fold below).
template <typename T, int D, bool kMulti, bool kFold>
__device__ __forceinline__ void mma_item(const SplitParams& p, const CtaItem& item,
                                         typename MmaCfg<T, D>::Pipe& pipe, char* smem) {
  using Cfg = MmaCfg<T, D>;
  using Op = MmaOp<typename Cfg::MmaT>;
  constexpr int STAGES = Cfg::STAGES;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int R = item.rows;
  const std::int64_t part_base = item.part_base;
  char* sQ = smem + Cfg::STAGE_AREA;
  const int WH = R <= 16 ? 1 : (R <= 32 ? 2 : 4);
  const int WT = kWarps / WH;
  const int wh = warp / WT, wt = warp % WT;
  const int g = lane >> 2, q4 = lane & 3;
  const T* q = static_cast<const T*>(p.q);
  // The lane's rows g and g + 8 of its warp's row tile.
  QueryRow qr[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) qr[r] = query_row<kMulti>(p, item, wh * 16 + g + 8 * r);
  // Q of the rows (same dtype as the cache, so exact), rows past the CTA's zero.
  constexpr int kQK = Cfg::kQInSmem ? 1 : D / 16;
  std::uint32_t qf[kQK][4];
  // The logit factor of rows g and g + 8: scale * log2(e), for fp8 also the K scale and the
  // power of two a bf16 q was scaled by (fp8_q_fragments).
  float logit_fac[2] = {p.scale_log2, p.scale_log2};
  // Where the fp8 path keeps k-step kk of the warp's row tile, with Q in shared memory.
  auto q_frag_at = [&](int kk) { return sQ + ((wh * (D / 16) + kk) * 32 + lane) * 16; };
  if constexpr (Cfg::kFp8) {
    fp8_q_fragments<D>(p, qr, q4, head_scale(p.k_scale, p.k_scales, item.kv), logit_fac,
                       [&](int kk, const std::uint32_t(&a)[4]) {
                         if constexpr (Cfg::kQInSmem) {
                           if (wt == 0) {
                             *reinterpret_cast<uint4*>(q_frag_at(kk)) =
                                 make_uint4(a[0], a[1], a[2], a[3]);
                           }
                         } else {
#pragma unroll
                           for (int r = 0; r < 4; ++r) qf[kk][r] = a[r];
                         }
                       });
  } else if constexpr (Cfg::kQInSmem) {
    constexpr int CH = RowGeom<T, D>::kChunks;
    for (int idx = tid; idx < WH * 16 * CH; idx += kThreads) {
      const int r = idx / CH, c = idx - r * CH;
      const QueryRow row = query_row<kMulti>(p, item, r);
      uint4 v = make_uint4(0, 0, 0, 0);
      if (row.valid) {
        v = *reinterpret_cast<const uint4*>(
            reinterpret_cast<const char*>(q + row.qrow * p.q_stride +
                                          static_cast<std::int64_t>(row.head) * D) +
            c * 16);
      }
      *reinterpret_cast<uint4*>(sQ + RowGeom<T, D>::offset(r, c)) = v;
    }
  } else {
    // A fragments straight from global: a0 (row g, k 2q4), a1 (row g+8), a2 (k+8), a3.
    const T* qrow[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      qrow[r] = q + qr[r].qrow * p.q_stride + static_cast<std::int64_t>(qr[r].head) * D;
    }
#pragma unroll
    for (int kk = 0; kk < kQK; ++kk) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int col = kk * 16 + 2 * q4 + (r >> 1) * 8;
        qf[kk][r] =
            qr[r & 1].valid ? *reinterpret_cast<const std::uint32_t*>(qrow[r & 1] + col) : 0u;
      }
    }
  }
  pipe.prologue();
  float o[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  // Rows g and g + 8 of the warp's head tile; the lanes of a quad hold the same max and partial
  // sums of their own columns (summed over the quad at the end).
  SoftmaxState2 st[2] = {SoftmaxState2::empty(), SoftmaxState2::empty()};
  // NaN once a row met a non-finite logit: per row, two chains (n-tiles 0 and 1) so the
  // checks of a fold are not one dependent sequence.
  float bad[2][2] = {{0.f, 0.f}, {0.f, 0.f}};
  // Without the soft-cap and ALiBi, and with positive logit factors, the logits stay unscaled
  // until the exponentials: the row max is taken on them and scaled once (a positive factor
  // keeps the max, rounding included), and each weight is one exp2 of fma(s, fac, -shift).
  // Otherwise the logits are scaled first (efac = 1).
  const bool late =
      !p.logit_variant && __all_sync(0xffffffffu, logit_fac[0] > 0.f && logit_fac[1] > 0.f);
  const float efac[2] = {late ? logit_fac[0] : 1.f, late ? logit_fac[1] : 1.f};
  // ldmatrix lane addressing
  // (row, chunk pair) of each lane's 8x8 matrix row; chunk 2 * step + half for k-step `step`.
  const int a_row = (lane & 7) + ((lane >> 3) & 1) * 8, a_half = lane >> 4;
  const int k_tok = (lane & 7) + (lane >> 4) * 8, k_half = (lane >> 3) & 1;
  const int v_tok = (lane & 7) + ((lane >> 3) & 1) * 8, v_half = lane >> 4;
  using Geo = RowGeom<T, D>;
  // Each lane's ldmatrix offsets within a 16-row slice, hoisted out of the tile loop: slice sl
  // adds sl * 16 rows (a multiple of 8, so the swizzle is unchanged), and k-step kk reads chunk
  // 2 kk + half, at the offset of step kk % 4 plus 128 bytes per 4 steps (the swizzle permutes
  // chunks only within a 128-byte segment).
  // The ALiBi slopes of rows g and g + 8 (log2 units; 0 without ALiBi).
  float slope2[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) slope2[r] = alibi_slope2(p, qr[r].head, qr[r].valid);
  int k_at[4], v_at[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    k_at[j] = Geo::offset(k_tok, 2 * j + k_half);
    v_at[j] = Geo::offset(v_tok, 2 * j + v_half);
  }

  for (int it = 0; it < pipe.ntiles; ++it) {
    const int next_id = pipe.begin(it);
    const int stage = it % STAGES;
    const int rows = pipe.rows(it);
    const char* kS = pipe.k(stage);
    const char* vS = pipe.v(stage);
    const unsigned* tile_mask = pipe.mask(it);
    const int tile_t0 = pipe.tok_begin + it * Cfg::TT;  // the tile's first token
    // S = Q K^T of the NS slices sl0, sl0 + WT, ... over D / 16 k-steps, k-step outer so each
    // Q fragment read from shared memory serves every slice. One slice alone accumulates into
    // two sets (even and odd steps, summed after) so its dependent MMA chains are half as long;
    // several slices are independent chains already.
    auto scores = [&](auto ns, int sl0, float(&s)[decltype(ns)::value][2][4]) {
      constexpr int NS = decltype(ns)::value;
      float s_odd[2][4];
#pragma unroll
      for (int n = 0; n < 2; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s_odd[n][e] = 0.f;
#pragma unroll
          for (int j = 0; j < NS; ++j) s[j][n][e] = 0.f;
        }
      }
      auto acc_of = [&](int j, int kk) -> float(&)[2][4] {
        return NS == 1 && kk % 2 == 1 ? s_odd : s[j];
      };
      auto k_slice = [&](int j) { return kS + (sl0 + j * WT) * 16 * Cfg::ROW; };
      if constexpr (Cfg::kFp8) {
        // One ldmatrix: tokens 0-7 and 8-15 of chunks 2 j and 2 j + 1, i.e. k-steps 2 jj, 2 jj + 1.
#pragma unroll
        for (int jj = 0; jj < D / 32; ++jj) {
          std::uint32_t a[2][4];
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            if constexpr (Cfg::kQInSmem) {
              const uint4 av = *reinterpret_cast<const uint4*>(q_frag_at(2 * jj + h));
              a[h][0] = av.x, a[h][1] = av.y, a[h][2] = av.z, a[h][3] = av.w;
            } else {
#pragma unroll
              for (int r = 0; r < 4; ++r) a[h][r] = qf[2 * jj + h][r];
            }
          }
#pragma unroll
          for (int j = 0; j < NS; ++j) {
            std::uint32_t raw[4];
            ldmatrix_x4(raw, k_slice(j) + k_at[jj % 4] + (jj / 4) * 128);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              std::uint32_t bk[4];
              fp8_k_regs<T>(raw[h], bk[0], bk[1]);
              fp8_k_regs<T>(raw[2 + h], bk[2], bk[3]);
              float(&acc)[2][4] = acc_of(j, 2 * jj + h);
              Op::mma(acc[0], a[h], bk[0], bk[1]);
              Op::mma(acc[1], a[h], bk[2], bk[3]);
            }
          }
        }
      } else {
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
          std::uint32_t a[4];
          if constexpr (Cfg::kQInSmem) {
            ldmatrix_x4(a, sQ + Geo::offset(wh * 16 + a_row, 2 * kk + a_half));
          } else {
#pragma unroll
            for (int r = 0; r < 4; ++r) a[r] = qf[kk][r];
          }
#pragma unroll
          for (int j = 0; j < NS; ++j) {
            std::uint32_t bk[4];
            ldmatrix_x4(bk, k_slice(j) + k_at[kk % 4] + (kk / 4) * 128);
            float(&acc)[2][4] = acc_of(j, kk);
            Op::mma(acc[0], a, bk[0], bk[1]);
            Op::mma(acc[1], a, bk[2], bk[3]);
          }
        }
      }
      if constexpr (NS == 1) {
#pragma unroll
        for (int n = 0; n < 2; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) s[0][n][e] += s_odd[n][e];
        }
      }
    };
    // Note slice sl's non-finite logits of attended tokens (x * 0 is 0 for finite x, NaN
    // otherwise; rows that are not read are zero-filled, so they add 0 unless q itself is not
    // finite), scale them (unless `late`: then the scale joins the exponentials), apply the
    // soft-cap and ALiBi, mask the rows the slice's 16 mask bits exclude (warp-uniform: only
    // partial or skipped tiles) and the tokens a row does not attend to (`keep`, bit n * 4 + e
    // for element (n, e)).
    auto logits = [&](int sl, float(&s)[2][4], unsigned keep) {
      const int t0 = tile_t0 + sl * 16;  // the slice's first token
      const unsigned bits = (tile_mask[sl >> 1] >> ((sl & 1) * 16)) & 0xffffu;
#pragma unroll
      for (int n = 0; n < 2; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          bad[e >> 1][n] = fmaf((keep >> (n * 4 + e)) & 1u ? s[n][e] : 0.f, 0.f, bad[e >> 1][n]);
        }
      }
      if (!late) {
#pragma unroll
        for (int n = 0; n < 2; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) s[n][e] *= logit_fac[e >> 1];
        }
      }
      if (p.logit_variant) {  // uniform: the soft-cap and ALiBi, on every column of the slice
        const int rel0 = t0 + 2 * q4 - pipe.last_pos;  // t - (L - 1); a row's own is + back
#pragma unroll
        for (int n = 0; n < 2; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            s[n][e] = variant_logit(p, s[n][e], slope2[e >> 1],
                                    rel0 + n * 8 + (e & 1) + (kMulti ? qr[e >> 1].back : 0));
          }
        }
      }
      if (bits != 0xffffu) {
#pragma unroll
        for (int n = 0; n < 2; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            if (!((bits >> (n * 8 + 2 * q4 + (e & 1))) & 1u)) s[n][e] = -INFINITY;
          }
        }
      }
      if (keep != 0xffu) {
#pragma unroll
        for (int n = 0; n < 2; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            if (!((keep >> (n * 4 + e)) & 1u)) s[n][e] = -INFINITY;
          }
        }
      }
    };
    // O += P V for slice sl, P as the A operand in hi and lo parts (lo only with kLo, which is
    // p.p_lo: a compile-time flag here so that a fold's P V products for all its slices are one
    // straight run of code, the fragments of the next slice loaded while the products of this
    // one issue).
    auto values = [&](auto lo, int sl, const float(&s)[2][4], bool disagree, unsigned keep) {
      constexpr bool kLo = decltype(lo)::value;
      std::uint32_t ph[4], pl[4] = {0u, 0u, 0u, 0u};
      {
        const float* src[4] = {&s[0][0], &s[0][2], &s[1][0], &s[1][2]};
#pragma unroll
        for (int r = 0; r < 4; ++r) ph[r] = Op::pack(src[r][0], src[r][1]);
        if constexpr (kLo) {
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            float h0, h1;
            Op::unpack(ph[r], h0, h1);
            pl[r] = Op::pack(src[r][0] - h0, src[r][1] - h1);
          }
        }
      }
      const char* v_slice = vS + sl * 16 * Cfg::ROW;
      // Calls f(n, b) for the slice's V fragments two n-tiles at a time: b[0], b[1] the B
      // registers of n-tile n (tokens 0-7, 8-15), b[2], b[3] those of n-tile n + 1. 16-bit
      // tiles: n-tiles 2 dp, 2 dp + 1 are dims 16 dp .. 16 dp + 15. fp8 tiles: an ldmatrix
      // covers chunks 2 j and 2 j + 1, each giving the n-tiles of its even and odd dims.
      auto for_v_tiles = [&](auto&& f) {
        if constexpr (Cfg::kFp8) {
#pragma unroll
          for (int j = 0; j < D / 32; ++j) {
            std::uint32_t raw[4];  // chunk 2 j: tokens 0-7, 8-15; chunk 2 j + 1: the same
            ldmatrix_x4_trans(raw, v_slice + v_at[j % 4] + (j / 4) * 128);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              std::uint32_t b[4];
              fp8_v_regs<T>(raw[2 * h], b[0], b[2]);
              fp8_v_regs<T>(raw[2 * h + 1], b[1], b[3]);
              f(4 * j + 2 * h, b);
            }
          }
        } else {
#pragma unroll
          for (int dp = 0; dp < D / 16; ++dp) {
            std::uint32_t b[4];
            ldmatrix_x4_trans(b, v_slice + v_at[dp % 4] + (dp / 4) * 128);
            f(2 * dp, b);
          }
        }
      };
      if (!disagree) {
        for_v_tiles([&](int n, const std::uint32_t(&b)[4]) {
          Op::mma(o[n], ph, b[0], b[1]);
          Op::mma(o[n + 1], ph, b[2], b[3]);
          if constexpr (kLo) {
            Op::mma(o[n], pl, b[0], b[1]);
            Op::mma(o[n + 1], pl, b[2], b[3]);
          }
        });
      } else {
        // A token one row attends to and another does not (a weight of 0 there) must not bring
        // a non-finite value of V into the second row: 0 x NaN is NaN. So V's non-finite values
        // go in as 0, and an indicator product (1 where a row attends to a token, times 1 where
        // the token's V is not finite) makes the columns of the rows that do attend to one NaN.
        std::uint32_t att[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int bit = (r >> 1) * 4 + (r & 1) * 2;  // element (n, e) of the pair's first value
          att[r] = ((keep >> bit) & 1u ? Op::kOne : 0u) |
                   ((keep >> (bit + 1)) & 1u ? Op::kOne << 16 : 0u);
        }
        for_v_tiles([&](int n, const std::uint32_t(&b_in)[4]) {
          std::uint32_t b[4] = {b_in[0], b_in[1], b_in[2], b_in[3]}, nf[4];
#pragma unroll
          for (int j = 0; j < 4; ++j) nf[j] = take_non_finite<Op>(b[j]);
          float hit[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
          Op::mma(hit[0], att, nf[0], nf[1]);
          Op::mma(hit[1], att, nf[2], nf[3]);
          Op::mma(o[n], ph, b[0], b[1]);
          Op::mma(o[n + 1], ph, b[2], b[3]);
          if constexpr (kLo) {
            Op::mma(o[n], pl, b[0], b[1]);
            Op::mma(o[n + 1], pl, b[2], b[3]);
          }
#pragma unroll
          for (int h = 0; h < 2; ++h) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              if (hit[h][e] > 0.f) o[n + h][e] = NAN;
            }
          }
        });
      }
    };
    // Folds NS slices of the tile, sl0, sl0 + WT, ..., into the warp's states with one row max,
    // one rescale of the accumulator and one pass of exponentials for all of them: with more
    // than 16 rows a warp takes 2 or 4 slices of each tile, and folding them one by one made
    // each wait on the previous one's softmax (a chain the few warps per SM could not hide).
    // NS = 1 is the slice-by-slice fold: there, with several query tokens, the rows may disagree
    // on the slice's last tokens (causal) and, with a window, on its first ones (uniform); then
    // each element gets its row's verdict, bit n * 4 + e of `keep`. The wide fold (NS > 1) is
    // taken only on tiles where the rows agree.
    auto fold = [&](auto ns, int sl0) {
      constexpr int NS = decltype(ns)::value;
      float s[NS][2][4];
      scores(ns, sl0, s);
      const int t0 = tile_t0 + sl0 * 16;  // the (first) slice's first token
      unsigned keep = 0xffu;
      const bool disagree = NS == 1 && kMulti &&
                            rows_disagree(t0, t0 + 15, pipe.last_pos, item.n_q, p.plan.window_left);
      if (disagree) {
        keep = 0u;
#pragma unroll
        for (int n = 0; n < 2; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int t = t0 + n * 8 + 2 * q4 + (e & 1);
            keep |= static_cast<unsigned>(
                        row_attends(t, pipe.last_pos, qr[e >> 1].back, p.plan.window_left))
                    << (n * 4 + e);
          }
        }
      }
#pragma unroll
      for (int j = 0; j < NS; ++j) logits(sl0 + j * WT, s[j], keep);
      // Row max (rows g and g + 8; a quad shares a row), in the logits' units: scaled by
      // efac = logit_fac > 0 (late) after the max, which rounding leaves the max.
      float mx[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float v[4 * NS];
#pragma unroll
        for (int j = 0; j < NS; ++j) {
#pragma unroll
          for (int n = 0; n < 2; ++n) {
            v[4 * j + 2 * n] = s[j][n][2 * r];
            v[4 * j + 2 * n + 1] = s[j][n][2 * r + 1];
          }
        }
        mx[r] = tree_reduce(v, [](float x, float y) { return fmaxf(x, y); });
      }
      float alpha[2], shift[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        alpha[r] = st[r].rescale_to(mx[r] * efac[r]);
        shift[r] = st[r].shift();
      }
      // The weights exp2(s * efac - shift) (0 for a masked -inf: efac > 0) and their row sums.
      float ps[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float v[4 * NS];
#pragma unroll
        for (int j = 0; j < NS; ++j) {
#pragma unroll
          for (int n = 0; n < 2; ++n) {
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              float& x = s[j][n][2 * r + c];
              x = Log2Exp::exp(fmaf(x, efac[r], -shift[r]));
              v[4 * j + 2 * n + c] = x;
            }
          }
        }
        ps[r] = tree_reduce(v, [](float x, float y) { return x + y; });
      }
      st[0].add(ps[0]);
      st[1].add(ps[1]);
      // Rescale the accumulator only when some row's max grew (alpha is exactly 1 otherwise):
      // after the first tiles of a split the max rarely moves.
      if (!__all_sync(0xffffffffu, alpha[0] == 1.f && alpha[1] == 1.f)) {
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
          o[n][0] *= alpha[0];
          o[n][1] *= alpha[0];
          o[n][2] *= alpha[1];
          o[n][3] *= alpha[1];
        }
      }
      auto products = [&](auto lo) {
#pragma unroll
        for (int j = 0; j < NS; ++j) values(lo, sl0 + j * WT, s[j], disagree, keep);
      };
      if (p.p_lo) {
        products(std::true_type{});
      } else {
        products(std::false_type{});
      }
    };
    // A full tile on which the rows agree, with 2 or 4 slices per warp: one fold of them all.
    // (The wide build only: see split_kernel in split_kernel.cuh.)
    if constexpr (kMulti && kFold) {
      if (WT < kWarps && rows == Cfg::TT &&
          !rows_disagree(tile_t0, tile_t0 + Cfg::TT - 1, pipe.last_pos, item.n_q,
                         p.plan.window_left)) {
        if (WT == 1) {
          fold(std::integral_constant<int, 4>{}, 0);
        } else {
          fold(std::integral_constant<int, 2>{}, wt);
        }
        pipe.end(it, next_id);
        continue;
      }
    }
    for (int sl = wt; sl * 16 < rows; sl += WT) fold(std::integral_constant<int, 1>{}, sl);
    pipe.end(it, next_id);
  }
  pipe.drain();  // the stage area becomes the merge scratch
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    st[r].l += __shfl_xor_sync(0xffffffffu, st[r].l, 1);
    st[r].l += __shfl_xor_sync(0xffffffffu, st[r].l, 2);
    float b = bad[r][0] + bad[r][1];
    b += __shfl_xor_sync(0xffffffffu, b, 1);
    b += __shfl_xor_sync(0xffffffffu, b, 2);
    // A non-finite logit makes the row's state NaN (m = l = NaN), which every merge after this
    // one, and the combine, carry through to out and lse (as the CPU backend does).
    if (b != 0.f) st[r].m = st[r].l = NAN;
  }
  // Every warp puts its rows' states and accumulators in the scratch (slot wh * WT + wt); then
  // all 128 threads merge them, TPR threads per row of the head tiles, each over D / TPR
  // columns, the WT warps of a head tile folded in order wt = 0, 1, ... Spread over all threads,
  // the merge stays a small share of a short item, where one warp doing it for the CTA would not.
  float* scratch = reinterpret_cast<float*>(smem);
  constexpr int SROW = D + 2;
  const float vs = Cfg::kFp8 ? head_scale(p.v_scale, p.v_scales, item.kv) : 1.f;
  {
    float* base = scratch + ((wh * WT + wt) * 16) * SROW;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float* row = base + (g + 8 * r) * SROW;
      if (q4 == 0) *reinterpret_cast<float2*>(row + D) = make_float2(st[r].m, st[r].l);
      if constexpr (Cfg::kFp8) {
        // n-tiles 2 c and 2 c + 1 hold dims 16 c + 4 q4 .. + 3 (fp8_chunk_dim); V's scale joins
        // the sum here: sum p (code x v_scale) = v_scale x sum p code.
#pragma unroll
        for (int c = 0; c < D / 16; ++c) {
          const int d = fp8_chunk_dim(c, q4);
          *reinterpret_cast<float2*>(row + d) =
              make_float2(o[2 * c][2 * r] * vs, o[2 * c + 1][2 * r] * vs);
          *reinterpret_cast<float2*>(row + d + 2) =
              make_float2(o[2 * c][2 * r + 1] * vs, o[2 * c + 1][2 * r + 1] * vs);
        }
      } else {
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
          *reinterpret_cast<float2*>(row + n * 8 + 2 * q4) =
              make_float2(o[n][2 * r], o[n][2 * r + 1]);
        }
      }
    }
  }
  __syncthreads();
  const int tile_rows = WH * 16;         // 16, 32 or 64
  const int tpr = kThreads / tile_rows;  // threads per row: 8, 4 or 2
  const int hl = tid / tpr;              // the row
  if (hl >= R) return;
  const QueryRow row = query_row<kMulti>(p, item, hl);
  const int mw = hl / 16, mr = hl % 16;  // its row tile and row in it
  const float* first = scratch + ((mw * WT) * 16 + mr) * SROW;
  // The row's merged state and each warp's factor (fold order wt = 0, 1, ...).
  SoftmaxState2 total{first[D], first[D + 1]};
  float fac[kWarps];
  fac[0] = 1.f;
#pragma unroll
  for (int w = 1; w < kWarps; ++w) fac[w] = 0.f;
#pragma unroll
  for (int w = 1; w < kWarps; ++w) {  // unrolled, so fac stays in registers
    if (w >= WT) break;
    const float* row = first + w * 16 * SROW;
    float fa = 0.f, fb = 0.f;
    if (!total.merge(SoftmaxState2{row[D], row[D + 1]}, fa, fb)) continue;
#pragma unroll
    for (int v = 0; v < w; ++v) fac[v] *= fa;
    fac[w] = fb;
  }
  // Columns c and c + 1 of the row, merged over the warps (unrolled: fac stays in registers).
  auto merged = [&](int c) {
    float2 a = make_float2(0.f, 0.f);
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      if (w >= WT) break;
      const float2 v = *reinterpret_cast<const float2*>(first + w * 16 * SROW + c);
      a.x = fmaf(v.x, fac[w], a.x);
      a.y = fmaf(v.y, fac[w], a.y);
    }
    return a;
  };
  const int c0 = (tid % tpr) * 2;  // pairs of columns, tpr threads side by side
  if (item.finish) {               // the sequence's only split: out and lse directly
    const std::int64_t out_row = static_cast<std::int64_t>(row.qrow) * p.num_heads + row.head;
    const std::int64_t out_at = row.qrow * p.out_stride + static_cast<std::int64_t>(row.head) * D;
    const float fa = fold_sink(p, total, row.head);  // the sink: denominator only
    const float inv = total.inv_sum() * fa;
    for (int c = c0; c < D; c += 2 * tpr) {
      const float2 a = merged(c);
      store_out_pair(p.out, p.out_dtype, out_at + c, a.x * inv, a.y * inv);
    }
    if (p.lse != nullptr && c0 == 0) p.lse[out_row] = total.lse();
    return;
  }
  const std::int64_t pidx =
      part_base + static_cast<std::int64_t>(item.n_q - 1 - row.back) * p.num_heads + row.head;
  if (c0 == 0) {
    p.part_ml[2 * pidx] = total.m;
    p.part_ml[2 * pidx + 1] = total.l;
  }
  float* dst = p.part_acc + pidx * D;
  for (int c = c0; c < D; c += 2 * tpr) *reinterpret_cast<float2*>(dst + c) = merged(c);
}

}  // namespace pagedattn::detail::cuda
