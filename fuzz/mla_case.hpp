// One MLA fuzz case (pagedattn/mla.hpp): the shapes, dtypes and layouts of a random MLA decode
// step, and the seed its values come from. Like a GQA case it is a pure function of (seed, index)
// (draw_mla_case), and a case file holds the whole description (to_mla_text), so a failing case
// replays alone.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pagedattn/dtype.hpp"

namespace pagedattn::fuzz {

// The invalid inputs an MLA case may carry, each with the error mla_decode must raise for it
// (before writing anything).
enum class MlaMalformation : int {
  kNone = 0,
  kIdOutOfRange,         // a block id inside a context outside [0, num_blocks)
  kContextOverCapacity,  // context_lens[b] > max_blocks_per_seq * block_size
  kNegativeContext,      // context_lens[b] < 0
  kOverlappingRows,      // c_strides.token (or kpe_strides.token) below its part's width
  kNegativeStride,       // c_strides.block (or kpe_strides.block) negative
  kQRowStride,           // q_nope_row_stride (or q_pe_row_stride) in (0, a row's span)
  kQHeadStride,          // q_nope_head_stride in (0, kv_lora_rank)
  kOutRowStride,         // out_row_stride in (0, num_heads * kv_lora_rank)
  kQIndptrDecreasing,    // q_indptr[b + 1] < q_indptr[b]
  kKvScale,              // an fp8 cache's kv_scale out of range, or another cache's not 1
  kRank,                 // kv_lora_rank not a multiple of 16
  kTooManyHeads,         // num_heads > kMaxMlaHeads
  kCount
};

const char* mla_malformation_name(MlaMalformation m);  // "id-out-of-range", ...; "unknown"

struct MlaFuzzCase {
  int num_heads = 16;
  int kv_lora_rank = 512;
  int rope_dim = 64;
  int block_size = 16;
  std::vector<int> context_lens;
  // Multi-token queries: empty, one query token per sequence; else each sequence's count (0
  // allowed, and more than its context) and max_q_len, at least their largest.
  std::vector<int> q_lens;
  int max_q_len = 0;
  DType q_dtype = DType::kBF16;
  DType kv_dtype = DType::kBF16;
  DType out_dtype = DType::kBF16;
  float kv_scale = 1.f;   // fp8 caches; 1 otherwise
  float scale = 0.f;      // 0: the default 1 / sqrt(kv_lora_rank + rope_dim)
  float magnitude = 1.f;  // the standard deviation of q and of the latent values
  // The cache: one combined [block][slot][rank + rope] buffer, or c and k_pe apart; each latent
  // row followed by row_pad elements and each block by block_pad, NaN in every gap.
  bool combined = false;
  int row_pad = 0;
  int block_pad = 0;
  // q: q_nope and q_pe as two slices of one [rows][heads][rank + rope + head_pad] buffer
  // (FlashMLA's), or two buffers of their own; each row followed by q_row_pad elements of NaN.
  bool fused_q = false;
  int head_pad = 0;
  int q_row_pad = 0;
  int out_row_pad = 0;   // elements of a sentinel after each row of out, never to be written
  int table_pad = 0;     // block_table_stride - max_blocks_per_seq
  int spare_blocks = 0;  // blocks no sequence reads (NaN)
  bool lse = true;
  int threads = 1;              // CPU backend threads
  std::uint64_t data_seed = 0;  // the values, the block order and the garbage past each context
  MlaMalformation bad = MlaMalformation::kNone;
  std::uint64_t bad_param = 0;  // which sequence, entry or value the malformation uses
  std::uint64_t origin_seed = 0;
  std::uint64_t origin_index = 0;

  bool malformed() const { return bad != MlaMalformation::kNone; }
  int batch() const { return static_cast<int>(context_lens.size()); }
  int q_rows() const;
  int max_blocks_per_seq() const;  // the table's width: the longest context's blocks, plus one
};

// Whether case `index` of a run with `seed` is an MLA case, for a run whose cases are MLA ones in
// about `share` of the indices (0: none, 1: all). Pure, like the draws.
bool is_mla_index(std::uint64_t seed, std::uint64_t index, double share);

// The case at (seed, index). Pure: the same pair always gives the same case.
MlaFuzzCase draw_mla_case(std::uint64_t seed, std::uint64_t index);

// One line: the shapes and every feature the case sets.
std::string describe(const MlaFuzzCase& c);

// Case files, as for GQA cases (case_file.hpp): "key value..." lines, '#' comments, a first key
// "mla" telling them apart. from_mla_text and load_mla_case throw std::runtime_error on I/O or
// parse errors, save_mla_case on I/O errors.
std::string to_mla_text(const MlaFuzzCase& c);
MlaFuzzCase from_mla_text(const std::string& text);
bool is_mla_text(const std::string& text);
void save_mla_case(const MlaFuzzCase& c, const std::string& path);

}  // namespace pagedattn::fuzz
