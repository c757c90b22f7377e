// Multi-head latent attention (MLA) decode, in the absorbed form that DeepSeek-V2/V3-style models
// decode with: every token has one latent cache row of kv_lora_rank values c and rope_dim values
// k_pe, shared by all query heads. For query row r of sequence b and query head h:
//   s_t        = scale * (dot(q_nope[r,h,:], c_t) + dot(q_pe[r,h,:], k_pe_t)),  t attended
//   out[r,h,:] = sum_t softmax(s)_t * c_t                       (kv_lora_rank values)
//   lse[r,h]   = log(sum_t exp(s_t))
// where c_t and k_pe_t are token t's latent row: slot t % block_size of block
// block_table[b, t / block_size]. Sequence b attends its whole context, or with q_indptr each of
// its query tokens attends causally up to its own position, as DecodeArgs::q_indptr defines it.
// An empty context gives out = 0 and lse = -inf. The caller applies W_UV to out afterwards.
// docs/mla.md.
#pragma once

#include <cstdint>
#include <optional>

#include "pagedattn/dtype.hpp"
#include "pagedattn/pagedattn.hpp"

namespace pagedattn {

// Query heads per latent row, at most.
inline constexpr int kMaxMlaHeads = 256;

// The elements between consecutive blocks and consecutive slots of one latent part (c or k_pe);
// 0 means dense: [num_blocks][block_size][part's width]. The width's elements are contiguous.
struct MlaPartStrides {
  std::int64_t block = 0;
  std::int64_t token = 0;

  // These strides of a part `width` elements wide, the dense ones for {0, 0}.
  MlaPartStrides or_dense(int block_size, int width) const {
    if (block != 0 || token != 0) return *this;
    return {static_cast<std::int64_t>(block_size) * width, width};
  }
};

// One MLA decode step. Shapes (rows = batch, or num_q_tokens with q_indptr):
//   q_nope, out:  [rows][num_heads][kv_lora_rank]; q_pe: [rows][num_heads][rope_dim]; a row's
//                 heads are contiguous, rows *_row_stride elements apart (0: dense)
//   c_cache:      [num_blocks][block_size][kv_lora_rank] by default (c_strides)
//   kpe_cache:    [num_blocks][block_size][rope_dim] by default (kpe_strides)
//   block_table:  int32 [batch][block_table_stride]; context_lens: int32 [batch]
//   lse:          f32 [rows][num_heads] (optional); q_indptr: int32 [batch + 1] (optional)
// One combined cache of [num_blocks][block_size][kv_lora_rank + rope_dim] (vLLM, FlashMLA) is
// c_cache = base, kpe_cache = base + kv_lora_rank, both with strides
// {block_size * (kv_lora_rank + rope_dim), kv_lora_rank + rope_dim}. FlashMLA's one q of
// [rows][num_heads][576] is q_nope = q, q_pe = q + kv_lora_rank with both row strides
// num_heads * 576 and head_stride 576. Host memory for the CPU backend.
struct MlaDecodeArgs {
  int batch = 0;
  int num_heads = 0;
  int kv_lora_rank = 512;  // a multiple of 16, at most 1024
  int rope_dim = 64;       // a multiple of 16 (0: none), at most 256
  int block_size = 0;      // [1, kMaxBlockSize]
  int num_blocks = 0;
  int max_blocks_per_seq = 0;
  int block_table_stride = 0;  // 0: max_blocks_per_seq

  const void* q_nope = nullptr;
  const void* q_pe = nullptr;
  DType q_dtype = DType::kBF16;  // f32, f16 or bf16
  // Elements between consecutive rows of q_nope, q_pe and out (0: dense), and between the heads of
  // one row of q_nope and q_pe (0: kv_lora_rank and rope_dim).
  std::int64_t q_nope_row_stride = 0;
  std::int64_t q_pe_row_stride = 0;
  std::int64_t q_nope_head_stride = 0;
  std::int64_t q_pe_head_stride = 0;
  std::int64_t out_row_stride = 0;

  const void* c_cache = nullptr;
  const void* kpe_cache = nullptr;
  DType kv_dtype = DType::kBF16;  // f32, f16, bf16, or fp8 (e4m3, e5m2) with kv_scale
  MlaPartStrides c_strides;
  MlaPartStrides kpe_strides;
  // An fp8 cache's values are code x kv_scale, in [kMinKvScale, kMaxKvScale]; 1 otherwise.
  float kv_scale = 1.f;

  const std::int32_t* block_table = nullptr;
  const std::int32_t* context_lens = nullptr;
  // Multi-token queries, causal within each sequence's new tokens (DecodeArgs::q_indptr).
  const std::int32_t* q_indptr = nullptr;
  int num_q_tokens = 0;
  int max_q_len = 0;

  void* out = nullptr;
  DType out_dtype = DType::kBF16;
  float* lse = nullptr;        // optional
  std::optional<float> scale;  // default 1 / sqrt(kv_lora_rank + rope_dim)

  int table_stride() const { return block_table_stride ? block_table_stride : max_blocks_per_seq; }
  int q_rows() const { return q_indptr ? num_q_tokens : batch; }
  int row_width() const { return kv_lora_rank + rope_dim; }
  std::int64_t q_nope_head() const {
    return q_nope_head_stride ? q_nope_head_stride : kv_lora_rank;
  }
  std::int64_t q_pe_head() const { return q_pe_head_stride ? q_pe_head_stride : rope_dim; }
  std::int64_t q_nope_row() const {
    return q_nope_row_stride ? q_nope_row_stride : num_heads * q_nope_head();
  }
  std::int64_t q_pe_row() const {
    return q_pe_row_stride ? q_pe_row_stride : num_heads * q_pe_head();
  }
  std::int64_t out_row() const {
    return out_row_stride ? out_row_stride : static_cast<std::int64_t>(num_heads) * kv_lora_rank;
  }
  MlaPartStrides c_layout() const { return c_strides.or_dense(block_size, kv_lora_rank); }
  MlaPartStrides kpe_layout() const { return kpe_strides.or_dense(block_size, rope_dim); }
  float effective_scale() const;
};

// Runs MLA decode. Throws pagedattn::Error on bad input, before writing anything. The CPU backend
// runs every shape. The CUDA backend (device memory, on options.cuda_stream, with no host
// synchronization unless cuda_checked) takes bf16 or f16 queries with a cache of q's dtype or
// fp8, kv_lora_rank a multiple of 128 up to 512, rope_dim up to 64, and both latent parts at
// 16-byte aligned addresses and strides; it refuses others with kUnsupported naming the argument.
void mla_decode(const MlaDecodeArgs& args, const DecodeOptions& options = {});

// Device workspace bytes a CUDA mla_decode with these shapes and options needs when the caller
// passes one (DecodeOptions::workspace; 16-byte aligned). It depends on shapes only (the table's
// capacity, not the context lengths), so one workspace serves every step of a captured graph. 0
// in a build without the CUDA backend. Throws on shapes mla_decode refuses.
std::size_t cuda_mla_workspace_size(const MlaDecodeArgs& args, const DecodeOptions& options = {});

}  // namespace pagedattn
