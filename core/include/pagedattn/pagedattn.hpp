// pagedattn: paged decode attention. The one public header.
//
// For sequence b and query head h (kv = h / (num_heads / num_kv_heads)):
//   s_t        = scale * dot(q[b,h,:], K[block_table[b, t / BS], kv, t % BS, :]),  t < L_b
//   out[b,h,:] = sum_t softmax(s)_t * V[block_table[b, t / BS], kv, t % BS, :]
//   lse[b,h]   = log(sum_t exp(s_t));   L_b == 0 gives out = 0 and lse = -inf.
// With q_indptr, sequence b has several query tokens, each attending causally to the context up
// to its own position (speculative decoding, chunked prefill): see DecodeArgs::q_indptr; with a
// tree mask, to the context before them and the new tokens its mask row names (tree_mask).
// The attention variants (a sliding window, a logits soft-cap, ALiBi slopes, attention sinks)
// change which t are attended and what s_t is: see DecodeArgs and pagedattn/variants.hpp.
// See docs/architecture.md and docs/variants.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "pagedattn/cache_layout.hpp"
#include "pagedattn/dtype.hpp"
#include "pagedattn/error.hpp"

namespace pagedattn {

enum class Backend { kAuto, kCpu, kCuda };

// "auto", "cpu", "cuda".
const char* backend_name(Backend b);
// Parses "auto|cpu|cuda"; anything else is an Error naming the text.
Backend parse_backend(const std::string& text, const std::string& argument = "backend");
// kAuto becomes PAGEDATTN_BACKEND when that is set, else CUDA when it was built and a device is
// present, else CPU. An explicit request for an unavailable backend throws kBackendUnavailable.
Backend resolve_backend(Backend requested);
// Whether the CUDA backend was built and a device is usable; `why` says what is missing.
bool cuda_available(std::string* why = nullptr);

// Head dims with kernels: the CPU backend has every one of them; the CUDA backend those of
// kCudaHeadDims (512 not yet: a CUDA decode, context-parallel decode, cache write, block copy or
// workspace query at head dim 512 is an Error(kUnsupported) naming head_dim, before anything runs).
// block_size may be anything in [1, kMaxBlockSize]; the GQA group (num_heads / num_kv_heads)
// anything in [1, kMaxGroupSize].
inline constexpr int kSupportedHeadDims[] = {64, 80, 96, 112, 128, 192, 256, 512};
inline constexpr int kCudaHeadDims[] = {64, 80, 96, 112, 128, 192, 256};
inline constexpr int kMaxBlockSize = 256;
inline constexpr int kMaxGroupSize = 64;
// DecodeOptions::num_threads and CacheOpOptions::num_threads lie in [0, kMaxThreads].
inline constexpr int kMaxThreads = 4096;
// The attention variants' values: a soft-cap of 0 or in [kMinSoftCap, kMaxVariantMagnitude],
// ALiBi slopes and sinks of magnitude at most kMaxVariantMagnitude (sinks may be -inf). The
// kernels keep logits in f32 (in log2 units on CUDA), where larger values would overflow.
inline constexpr float kMinSoftCap = 1e-20f;
inline constexpr float kMaxVariantMagnitude = 1e20f;
// Bounds of the fp8 cache scales (DecodeArgs::k_scale and the rest): a code times a scale stays a
// normal, finite f32 (the largest code is 57344 in e5m2, the smallest subnormal 2^-16).
inline constexpr float kMinKvScale = 1e-30f;
inline constexpr float kMaxKvScale = 1e30f;

// One decode step. Shapes (rows = batch, or num_q_tokens with q_indptr):
//   q, out:       [rows][num_heads][head_dim], each row of num_heads * head_dim elements
//                 q_row_stride / out_row_stride elements after the previous one
//   k/v_cache:    [num_blocks][num_kv_heads][block_size][head_dim]
//   block_table:  int32 [batch][block_table_stride], the first max_blocks_per_seq entries used
//   context_lens: int32 [batch]
//   lse:          f32 [rows][num_heads] (optional)
//   q_indptr:     int32 [batch + 1] (optional)
// For the CPU backend every pointer is host memory; for the CUDA backend, device memory.
struct DecodeArgs {
  int batch = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int block_size = 0;
  int num_blocks = 0;          // size of the cache pool (valid ids are [0, num_blocks))
  int max_blocks_per_seq = 0;  // table entries per sequence
  int block_table_stride = 0;  // elements between table rows; 0 means max_blocks_per_seq
  // Elements between the rows of consecutive sequences in q and in out; 0 means
  // num_heads * head_dim (dense). q may be the query part of a fused QKV projection
  // ([batch][(num_heads + 2 * num_kv_heads) * head_dim]) and out a slice of a larger buffer; a
  // sequence's heads stay contiguous. Not less than num_heads * head_dim (rows never overlap).
  std::int64_t q_row_stride = 0;
  std::int64_t out_row_stride = 0;

  // Where k_cache's and v_cache's rows are (cache_layout.hpp, docs/cache_layouts.md): the
  // default is the dense HND layout [num_blocks][num_kv_heads][block_size][head_dim];
  // CacheStrides::nhd(...) is NHD, and K and V as halves of one tensor are two pointers into it
  // with the same strides. head_dim elements are contiguous. Rows must not overlap; the CUDA
  // backend also needs every stride to be a multiple of 16 bytes.
  CacheStrides kv_strides;

  const void* q = nullptr;
  DType q_dtype = DType::kF32;
  const void* k_cache = nullptr;
  DType k_dtype = DType::kF32;
  const void* v_cache = nullptr;
  DType v_dtype = DType::kF32;
  // Quantized caches (k_dtype = v_dtype = kFP8E4M3, kFP8E5M2, kInt8 or kInt4): a stored code c of
  // kv head h means c x k_scale x k_scales[h] in K (k_scales null: x 1), times the row's own scale
  // with per-token scales (below), and likewise for V; each scale in [kMinKvScale, kMaxKvScale].
  // k_scales and v_scales (f32 [num_kv_heads]) live where the caches do. Other cache dtypes take
  // no scales (k_scale = v_scale = 1, no arrays). docs/kv_quantization.md.
  float k_scale = 1.f;
  float v_scale = 1.f;
  const float* k_scales = nullptr;
  const float* v_scales = nullptr;
  // Per-(token, kv head) scales of a quantized cache, both or neither: f32, one per cache row
  // (block, kv head, slot), at the element offset token_scale_layout() gives (default dense
  // [num_blocks][num_kv_heads][block_size]; token_scale_strides as kv_strides with head_dim 1).
  // write_cache() writes them. They live where the caches do; the scale of every row a sequence's
  // used blocks hold below its context length must be in [kMinKvScale, kMaxKvScale] (checked where
  // they are in host memory or read back: CUDA's cuda_checked).
  // int4 caches (kInt4, CPU backend only for now: the CUDA backend refuses them, kUnsupported
  // naming k_dtype) pack two codes in a byte and need these scales: a row has head_dim / 32 of
  // them, one per group of 32 consecutive values, contiguous from the row's offset
  // (token_scale_strides as kv_strides with head_dim / 32). head_dim must be a multiple of 32,
  // and kv_strides, which count codes, must be even (each row starts on a byte).
  const float* k_token_scales = nullptr;
  const float* v_token_scales = nullptr;
  CacheStrides token_scale_strides;
  const std::int32_t* block_table = nullptr;
  const std::int32_t* context_lens = nullptr;
  void* out = nullptr;
  DType out_dtype = DType::kF32;
  float* lse = nullptr;        // optional
  std::optional<float> scale;  // default 1 / sqrt(head_dim)

  // Attention variants (docs/variants.md); the defaults are plain softmax attention. They
  // combine freely. With the query at position L_b - 1:
  // - window_left >= 0: attend to tokens t >= L_b - 1 - window_left only (the last
  //   window_left + 1 tokens); blocks wholly before the window, and their table entries, are
  //   never read. -1: the whole context.
  // - logits_soft_cap > 0: s_t = cap * tanh(s_t / cap), after the scale. 0: none. Otherwise in
  //   [kMinSoftCap, kMaxVariantMagnitude].
  // - alibi_slopes: f32 [num_heads], s_t += slope_h * (t - (L_b - 1)), after the soft-cap.
  // - sinks: f32 [num_heads], a logit per query head that joins the softmax's denominator
  //   (exp(sink_h) is added to sum_t exp(s_t)) and contributes no value; lse includes it, so an
  //   empty context gives out = 0 and lse = sink_h. -inf is no sink.
  // alibi_slopes and sinks live where the other tensors do (host memory for the CPU backend,
  // device memory for CUDA); slopes and sinks must be finite with magnitudes at most
  // kMaxVariantMagnitude, sinks may be -inf (checked where the values are in host memory: the CPU
  // backend, and CUDA with cuda_checked).
  int window_left = -1;
  float logits_soft_cap = 0.f;
  const float* alibi_slopes = nullptr;
  const float* sinks = nullptr;

  // Multi-token queries (speculative decoding, chunked prefill). With q_indptr, sequence b has
  // n_b = q_indptr[b + 1] - q_indptr[b] query tokens, rows q_indptr[b] .. q_indptr[b + 1] - 1 of
  // q, out and lse; its token i sits at position P = L_b - n_b + i (the new tokens' keys and
  // values are already in the cache, the last at L_b - 1) and is a query of a context of P + 1
  // tokens: it attends to tokens t <= P (causal), the window, ALiBi and sinks taken from P as
  // from L_b - 1 above. A token with P < 0 attends to nothing (out = 0, lse = -inf or the sink).
  // q_indptr[0] = 0, non-decreasing, q_indptr[batch] = num_q_tokens and every n_b in
  // [0, max_q_len] (checked where q_indptr is in host memory: the CPU backend, and CUDA with
  // cuda_checked; unchecked CUDA clamps it into those bounds). max_q_len (>= 1) sizes the CUDA
  // grid and workspace. Without q_indptr every sequence has one query token at L_b - 1, and
  // num_q_tokens and max_q_len stay 0.
  const std::int32_t* q_indptr = nullptr;
  int num_q_tokens = 0;
  int max_q_len = 0;

  // Tree masks (speculative decoding over a token tree: EAGLE, Medusa), with q_indptr: among a
  // sequence's n_b new tokens the mask replaces the causal rule. Token i (at P = L_b - n_b + i)
  // attends the tokens before the new ones (t < L_b - n_b) and new token j (at L_b - n_b + j) where
  // bit (i, j) of the sequence's mask is set; the window, ALiBi and sinks stay as above, taken
  // from P. Sequence b's mask is n_b x n_b bits, row-major: bit i * n_b + j is bit (i * n_b + j) %
  // 8 of byte tree_mask_indptr[b] + (i * n_b + j) / 8 (little-endian bit order, as
  // numpy.packbits(bitorder="little") and FlashInfer's packed custom masks). Bits with j > i must
  // be clear (a tree lists every token after its ancestors), so a token still attends nothing
  // after its own position. tree_mask_indptr: int32 [batch + 1], byte offsets into tree_mask,
  // tree_mask_indptr[0] >= 0, each sequence's span [tree_mask_indptr[b], tree_mask_indptr[b + 1])
  // at least ceil(n_b * n_b / 8) bytes. Both live where q_indptr does, both or neither are set,
  // and they are checked where they are in host memory or read back (CUDA's cuda_checked;
  // pagedattn/tree_mask.hpp, docs/tree_masks.md).
  const std::uint8_t* tree_mask = nullptr;
  const std::int32_t* tree_mask_indptr = nullptr;

  int table_stride() const { return block_table_stride ? block_table_stride : max_blocks_per_seq; }
  std::int64_t q_stride() const {
    return q_row_stride ? q_row_stride : static_cast<std::int64_t>(num_heads) * head_dim;
  }
  std::int64_t out_stride() const {
    return out_row_stride ? out_row_stride : static_cast<std::int64_t>(num_heads) * head_dim;
  }
  CacheLayout cache_layout() const {
    return CacheLayout::with_strides(num_blocks, num_kv_heads, block_size, head_dim, kv_strides);
  }
  // Where each cache row's scales are: a row's token_scales_per_row(k_dtype, head_dim) scales
  // (head_dim / 32 group scales for int4, else one) from offset(block, kv head, slot) on.
  CacheLayout token_scale_layout() const {
    return CacheLayout::with_strides(num_blocks, num_kv_heads, block_size,
                                     token_scales_per_row(k_dtype, head_dim), token_scale_strides);
  }
  bool has_token_scales() const { return k_token_scales != nullptr || v_token_scales != nullptr; }
  int group_size() const { return num_kv_heads > 0 ? num_heads / num_kv_heads : 0; }
  // Rows of q, out and lse, and the bound on any sequence's query tokens.
  int q_rows() const { return q_indptr ? num_q_tokens : batch; }
  int q_len_bound() const { return q_indptr ? max_q_len : 1; }
  float effective_scale() const;
  // Whether any attention variant is set.
  bool has_variant() const {
    return window_left >= 0 || logits_soft_cap > 0.f || alibi_slopes != nullptr || sinks != nullptr;
  }
};

struct DecodeOptions {
  Backend backend = Backend::kAuto;  // kAuto, kCpu or kCuda; any other value is an error
  int num_threads = 0;  // CPU: worker threads in [1, kMaxThreads]; 0 uses OpenMP's default
  // CUDA: the cudaStream_t to run on (nullptr = the default stream) and an optional device
  // workspace of at least workspace_size() bytes; without one the library keeps its own.
  void* cuda_stream = nullptr;
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
  // CUDA: copy the device-resident context_lens and block_table to the host and validate them
  // (the same errors as the CPU path) before any kernel runs. Synchronizes the stream. Without
  // it, out-of-range lengths are clamped and tokens of out-of-range block ids are skipped.
  bool cuda_checked = false;
  // A sequence's out and lse depend only on that sequence's own inputs (its q rows, context,
  // blocks and the call's dtypes, variants and layout), never on the other sequences of the
  // batch, their number or their order: bitwise the same in any batch. Each sequence is cut into
  // splits of a fixed size in tokens (kBatchInvariantChunkTokens, pagedattn/split_plan.hpp)
  // merged in a fixed order, and the CUDA backend runs the same kernel build for every batch.
  // Costs speed where the default plan would split less (large batches) and, on CUDA, workspace
  // (cuda_workspace_size(args, options)); docs/batch_invariance.md.
  bool batch_invariant = false;
  // Sequences whose block tables begin with the same block ids (BlockManager::fork: n-way
  // sampling, beam search, a shared system prompt) read those shared blocks once for all their
  // query rows: the CPU backend finds the groups from the tables itself (the core's
  // find_shared_prefixes), decodes each group's shared tokens together and each member's
  // own tokens apart, and merges the two partial states. Results equal the plain decode's within
  // the dtypes' tolerances, never bitwise: a sequence's bits then depend on the batch, so
  // batch_invariant turns sharing off. A call without groups that pay runs as without it. The
  // CUDA backend runs the plain decode for now. docs/shared_prefix.md.
  bool share_prefixes = true;
};

// Device workspace bytes the CUDA backend needs for these shapes on the current device. Depends
// on batch, heads, head_dim, block_size, max_blocks_per_seq and max_q_len only (not on context
// lengths or q_indptr's values), so one workspace serves every later step of the same shapes,
// CUDA-graph replays included.
std::size_t cuda_workspace_size(const DecodeArgs& args);
// The same for a decode with these options: a batch-invariant decode needs room for every
// sequence's splits at the table's capacity.
std::size_t cuda_workspace_size(const DecodeArgs& args, const DecodeOptions& options);

// Runs decode attention. Throws pagedattn::Error on bad input, before writing anything.
void decode(const DecodeArgs& args, const DecodeOptions& options = {});

}  // namespace pagedattn

#include "pagedattn/cache_ops.hpp"
