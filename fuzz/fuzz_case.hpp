// One fuzz case: a random-case spec plus what the fuzzer adds on top of it (exact-logit snapping,
// a custom scale, the CPU thread count, the attention variants, q and out row strides, multi-token
// queries, the K/V cache layout, fp8 caches and their scales, a planted malformation). Every case
// is a pure function of (seed, index) and the draw options, and a case file holds the full
// description so a shrunk case replays alone.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pagedattn/pagedattn.hpp"
#include "pagedattn/testing/kv_layouts.hpp"
#include "pagedattn/testing/random_case.hpp"

namespace pagedattn::fuzz {

// A deliberately invalid input, planted after the case is built.
enum class Malformation : int {
  kNone = 0,
  kIdOutOfRange,          // a block id inside a context outside [0, num_blocks)
  kContextOverCapacity,   // context_lens[b] > max_blocks_per_seq * block_size
  kNegativeContext,       // context_lens[b] < 0
  kHeadRatio,             // num_heads % num_kv_heads != 0
  kGroupTooLarge,         // num_heads / num_kv_heads > kMaxGroupSize
  kNullPointer,           // one of q, k_cache, v_cache, block_table, context_lens, out is null
  kHeadDim,               // an unsupported head_dim
  kBlockSize,             // block_size 0, negative or > kMaxBlockSize
  kTableStride,           // 0 < block_table_stride < max_blocks_per_seq
  kDtypeMismatch,         // v_dtype != k_dtype
  kBadDtype,              // a dtype value that is not a DType
  kNonFiniteScale,        // scale NaN or Inf
  kNegativeBatch,         // batch < 0
  kWindowLeft,            // window_left < -1
  kSoftCap,               // logits_soft_cap negative, NaN or infinite
  kNonFiniteSlope,        // an ALiBi slope NaN or infinite
  kBadSink,               // a sink NaN or +inf
  kRowStride,             // q_row_stride or out_row_stride negative or in (0, num_heads * head_dim)
  kQIndptrStart,          // q_indptr[0] != 0
  kQIndptrDecreasing,     // q_indptr[b + 1] < q_indptr[b]
  kQLenOverMax,           // a sequence's query tokens above max_q_len
  kQIndptrEnd,            // q_indptr[batch] != num_q_tokens
  kMaxQLen,               // max_q_len 0 or negative with q_indptr
  kQTokensWithoutIndptr,  // num_q_tokens (or max_q_len) set without q_indptr
  kKvStrides,             // kv_strides zero mixed with nonzero, negative, overlapping or too large
  kFp8ValueDtype,         // q_dtype or out_dtype fp8 (fp8 stores K and V caches only)
  kBadKvScale,            // k_scale or v_scale of an fp8 cache outside [kMinKvScale, kMaxKvScale]
  kScaleOnPlainCache,     // a K/V scale other than 1, or a per-head array, on a non-fp8 cache
  kBadKvHeadScale,        // one per-head scale (k_scales[h] or v_scales[h]) out of range
  kCount
};
const char* malformation_name(Malformation m);
// Table-content malformations keep every buffer size honest, so backends that copy buffers by
// the declared shapes (the CUDA round trip) can be given them too.
bool keeps_buffer_sizes(Malformation m);

// The byte every element of out's gaps (between and after the rows of a strided out) holds before
// a call and must still hold after it. Not 0xff, the NaN poison of out's rows, so neither a stray
// NaN nor a stray value passes for it.
inline constexpr std::uint8_t kOutGapByte = 0xa5;

struct FuzzCase {
  testing::CaseSpec spec;
  // q and k snapped to integers in [-127, 127] and a power-of-two scale: every logit is exact in
  // f32 whatever the summation order, so huge logits compare tightly.
  bool snap = false;
  float scale = 0.f;  // 0: the default 1 / sqrt(head_dim)
  int threads = 1;    // CPU backend threads (the split plan depends on them)
  // The attention variants (DecodeArgs; pagedattn/variants.hpp). With a window and poison, the
  // table entries before each sequence's first attended block hold -1 or garbage and the slots
  // of unattended tokens NaN, like everything past a context.
  int window_left = -1;
  float soft_cap = 0.f;
  std::vector<float> alibi_slopes;  // empty: none; else one per query head
  std::vector<float> sinks;         // empty: none; else one per query head (-inf: no sink)
  // Row strides of q and out in elements (DecodeArgs::q_row_stride, out_row_stride); 0: dense.
  // A strided q holds NaN between its rows (a read of them shows in out), a strided out
  // kOutGapByte (a write to them shows in the gap check).
  std::int64_t q_row_stride = 0;
  std::int64_t out_row_stride = 0;
  // Multi-token queries (DecodeArgs::q_indptr). max_q_len 0: none, one query token per sequence
  // (q_lens empty). Else q_lens holds each sequence's query tokens (0 allowed, and more than its
  // context), and max_q_len, at least their largest, is the declared bound.
  std::vector<int> q_lens;
  int max_q_len = 0;
  // Where K and V live (testing::KvLayout, DecodeArgs::kv_strides): kHnd is the default dense
  // layout, kv_strides left 0; any other is the case's K and V copied there, NaN in every gap.
  // kv_pad (kPaddedHnd only) widens every row's gap by that many elements, the kv head and block
  // strides following: strides that need not be multiples of 16 bytes, which the CPU backend
  // takes and the CUDA backend refuses (cuda_misaligned_kv).
  testing::KvLayout kv_layout = testing::KvLayout::kHnd;
  int kv_pad = 0;
  // fp8 caches (spec.kv_dtype kFP8E4M3 or kFP8E5M2) take their dequantization scales from
  // spec.k_scale and spec.v_scale, and per kv head from k_scales and v_scales (empty: none; else
  // num_kv_heads values each). The codes hold the case's values divided by the scales, so the
  // values the attention sees have the usual spread. Other caches keep the scales at 1 and none
  // per head (spec.per_head_scales is not used: make_fast_case takes the arrays themselves).
  std::vector<float> k_scales, v_scales;
  Malformation bad = Malformation::kNone;
  std::uint64_t bad_param = 0;  // which sequence / entry / pointer / value the malformation uses
  // Where the case came from (informational once shrunk).
  std::uint64_t origin_seed = 0;
  std::uint64_t origin_index = 0;

  bool malformed() const { return bad != Malformation::kNone; }
  bool huge() const { return spec.magnitude >= 4.f; }
  bool windowed() const { return window_left >= 0; }
  bool soft_capped() const { return soft_cap > 0.f; }
  // The variants context_parallel_decode refuses (a position in the whole sequence, or a term
  // counted once per sequence); the soft-cap it runs.
  bool position_variants() const { return windowed() || !alibi_slopes.empty() || !sinks.empty(); }
  bool multi_token() const { return max_q_len > 0; }
  // Rows of q, out and lse: every query token (the sum of q_lens), or one per sequence.
  int q_rows() const;
  // The stride field the CUDA backend refuses, or null: with two rows or more, q's rows must
  // start 16-byte aligned (it reads them in 16-byte pieces) and out's at even elements (it stores
  // them two at a time); q is checked first. The CPU backend takes any stride.
  const char* cuda_misaligned_stride() const;
  bool default_layout() const { return kv_layout == testing::KvLayout::kHnd && kv_pad == 0; }
  bool fp8() const { return is_fp8(spec.kv_dtype); }
  bool per_head_scales() const { return !k_scales.empty() || !v_scales.empty(); }
  // The layout's geometry for this case's shapes and `num_blocks` blocks (kv_pad applied).
  testing::KvGeometry kv_geometry(int num_blocks) const;
  // The kv_strides field the CUDA backend refuses, or null: it reads cache rows in 16-byte
  // pieces, so every stride must be a multiple of 16 bytes (checked block, head, token, after the
  // q and out row strides). Only a kv_pad can break that; the default layout never does.
  const char* cuda_misaligned_kv() const;
};

// Draw knobs: which backends the case must suit.
struct DrawOptions {
  bool table_malformations_only = false;  // CUDA runs only malformations that keep buffer sizes
  // The CUDA backend runs too: strided rows are aligned as it needs in most cases (85% rather
  // than half), so that most strided cases reach its kernels rather than its alignment refusal.
  bool cuda = false;
};

// The case at (seed, index). Pure: the same pair (and options) always gives the same case.
FuzzCase draw_case(std::uint64_t seed, std::uint64_t index, const DrawOptions& options = {});

// The built buffers plus the (possibly malformed) arguments the API is called with.
struct BuiltCase {
  // host's q, out and lse hold one row per query token (rows of them): host.spec.batch rows
  // without multi-token queries.
  testing::HostCase host;
  int rows = 0;
  // q_indptr ([batch + 1], empty without multi-token queries) and, per row, its sequence and the
  // context it attends as a query (P + 1 for the token at position P, 0 when P < 0): what the
  // oracle checks each row against.
  std::vector<std::int32_t> q_indptr;
  std::vector<int> row_seq, row_lens;
  // The host copies of the variants' per-head arrays args points at (at least num_heads values
  // for the arguments' num_heads, so a malformed head count never reads past them).
  std::vector<float> alibi_slopes, sinks;
  // The same for the per-kv-head scales of an fp8 cache (at least num_kv_heads values for the
  // arguments' num_kv_heads), empty where the case has none.
  std::vector<float> k_scales, v_scales;
  // q and out as args points at them: host.q and host.out when dense, else rows of q_stride /
  // out_stride elements, each followed by its gap (the last one's too, so a write past the last
  // row shows): NaN in q, kOutGapByte in out.
  std::vector<std::uint8_t> q_rows, out_rows;  // empty where dense
  std::int64_t q_stride = 0, out_stride = 0;   // elements between rows (the row length if dense)
  // K and V in the case's layout (FuzzCase::kv_layout), NaN in every gap; empty (kv.k) for the
  // default layout, where args reads host.k and host.v.
  testing::KvStorage kv;
  // over host's buffers (q_rows and out_rows where strided, kv's where laid out); malformed or not
  DecodeArgs args;
  ErrorCode expected_code = ErrorCode::kInvalidArgument;
  std::string expected_argument;  // empty for a valid case
  // The argument the CUDA backend raises instead (kInvalidArgument), or empty: a misaligned row
  // stride (FuzzCase::cuda_misaligned_stride, over the rows args declares), which it checks after
  // the shapes but before its checked-mode q_indptr, table and value checks, on a case that is
  // valid or malformed only in those.
  std::string cuda_refuses;

  // The buffers args.q and args.out point at (q_rows or host.q, out_rows or host.out), gaps
  // included.
  const std::vector<std::uint8_t>& q_buffer() const { return q_rows.empty() ? host.q : q_rows; }
  std::vector<std::uint8_t>& out_buffer() { return out_rows.empty() ? host.out : out_rows; }
  const std::vector<std::uint8_t>& out_buffer() const {
    return out_rows.empty() ? host.out : out_rows;
  }
  bool laid_out() const { return !kv.k.empty(); }
  // args over host's dense K and V with the default kv_strides: the same attention, whatever the
  // layout (the reference is computed over it).
  DecodeArgs dense_args() const;
  // NaN in out's rows and lse (an unwritten element shows) and kOutGapByte in out's gaps.
  void poison_outputs();
};
BuiltCase build_case(const FuzzCase& c);

// Total K (or V) cache elements and multiply-adds of the reference: the cost bounds.
std::int64_t kv_elements(const FuzzCase& c);

std::string describe(const FuzzCase& c);

// Case files: "key value..." lines, '#' comments. save throws std::runtime_error on I/O errors,
// load on I/O or parse errors.
std::string to_text(const FuzzCase& c);
FuzzCase from_text(const std::string& text);
void save_case(const FuzzCase& c, const std::string& path);
FuzzCase load_case(const std::string& path);

}  // namespace pagedattn::fuzz
