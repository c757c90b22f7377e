// What the MLA decode kernel (mla_kernel.cuh) reads: MlaDecodeArgs (pagedattn/mla.hpp) in device
// terms, its split plan, and its shared-memory layout.
#pragma once

#include <cstdint>

namespace pagedattn::detail::cuda::mla {

constexpr int kRows = 16;      // query rows (token x head of one sequence) per CTA: one MMA M tile
constexpr int kTileKeys = 64;  // latent rows per tile
constexpr int kWarps = 8;      // each computes 8 keys of S and rank / 8 columns of out
constexpr int kThreads = kWarps * 32;
constexpr int kMaxRank = 512;  // kv_lora_rank: a multiple of 128 up to this
constexpr int kMaxRope = 64;   // rope_dim: a multiple of 16 up to this
constexpr int kPad = 8;        // 16-bit elements after each shared row: ldmatrix is conflict-free
constexpr int kPRow = kTileKeys + kPad;  // the stride of P's rows, in elements

struct MlaParams {
  const void* q_nope;
  const void* q_pe;
  long long q_nope_row, q_pe_row, q_nope_head, q_pe_head;  // elements
  const void* c;
  const void* kpe;
  long long c_block, c_token, kpe_block, kpe_token;  // elements
  int rank, rope;
  int heads, block_size, num_blocks, table_stride, max_blocks;
  const std::int32_t* table;
  const std::int32_t* lens;
  const std::int32_t* q_indptr;  // null: one query token per sequence
  int q_rows, max_q;
  int cta_rows;      // query rows per CTA: kRows here, 64 in the sm_90 kernel (mla_many_rows.hpp)
  bool q_vec16;      // q_nope and q_pe rows can be read in 16-byte pieces (addresses and strides)
  float scale_log2;  // scale * kv_scale * log2(e): the logits in log2 units
  float out_scale;   // kv_scale: what the accumulators of codes are multiplied by
  bool split_p;      // P V with P = hi + lo in the 16-bit type: f32-level weights
  // The split plan: every sequence has `splits` splits of `chunk` tokens (a multiple of
  // kTileKeys), each a partial state per row in the combine's layout (combine.cuh).
  int splits, chunk, row_chunks;
  float* part_ml;
  float* part_acc;
  int* split_offset;
};

// The shared memory of a CTA for a latent row of `width` = rank + rope elements, in bytes from
// the (16-byte aligned) dynamic base: Q, the 16-bit tiles (two stages, or one tile for 8-bit
// caches, whose two raw stages follow), the scores, P, and the stages' barriers.
struct SmemLayout {
  int ld;  // elements between the rows of Q and of a tile
  int q, tile0, tile1, raw0, raw1, scores, p_hi, p_lo, alpha, bad_keys, full, total;
};
__host__ __device__ inline SmemLayout smem_layout(int width, bool eight_bit) {
  SmemLayout s;
  s.ld = width + kPad;
  const int tile_bytes = kTileKeys * s.ld * 2;
  s.q = 0;
  s.tile0 = s.q + kRows * s.ld * 2;
  s.tile1 = s.tile0 + tile_bytes;
  s.raw0 = eight_bit ? s.tile1 : 0;  // 8-bit: one 16-bit tile, converted from the raw stage
  s.raw1 = s.raw0 + kTileKeys * width;
  const int after_tiles = eight_bit ? s.raw1 + kTileKeys * width : s.tile1 + tile_bytes;
  s.scores = (after_tiles + 15) / 16 * 16;
  s.p_hi = s.scores + kRows * kTileKeys * 4;
  s.p_lo = s.p_hi + kRows * kPRow * 2;
  s.alpha = s.p_lo + kRows * kPRow * 2;
  s.bad_keys = s.alpha + kRows * 4;
  s.full = s.bad_keys + kTileKeys * 4;  // two 8-byte barriers: a stage's copies (sm_90)
  s.total = s.full + 16;
  return s;
}

}  // namespace pagedattn::detail::cuda::mla
