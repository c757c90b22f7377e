#include "pagedattn/validate.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "pagedattn/cache_layout.hpp"
#include "pagedattn/split_plan.hpp"
#include "pagedattn/tree_mask.hpp"
#include "pagedattn/variants.hpp"

namespace pagedattn {
namespace {

template <std::size_t N>
std::string head_dims_list(const int (&dims)[N]) {
  std::ostringstream os;
  const char* sep = "";
  for (int d : dims) os << sep << d, sep = ", ";
  return os.str();
}

std::string supported_head_dims_text() {
  return "unsupported (supported: " + head_dims_list(kSupportedHeadDims) + ")";
}

// The table entries [first, end) of sequence b (context len) that a decode reads: from the
// window's first block of its earliest query on (q_indptr null: one query token).
std::pair<int, int> read_entries(const DecodeArgs& a, int len, const std::int32_t* q_indptr,
                                 int b) {
  const int q_len = q_indptr != nullptr ? q_indptr[b + 1] - q_indptr[b] : 1;
  int first = 0;
  const int used = planned_blocks(len, a.block_size, a.window_left, &first, q_len);
  return {first, first + used};
}

}  // namespace

void require_positive(const char* name, int v) {
  if (v <= 0) fail(ErrorCode::kInvalidArgument, name, v, "must be positive");
}

void require_cache_strides(const CacheStrides& s, int num_blocks, int num_kv_heads, int block_size,
                           int head_dim, const char* field) {
  if (s.is_default()) return;
  const std::string f = field;
  const std::string block = f + ".block", head = f + ".head", token = f + ".token";
  const std::pair<const std::string&, std::int64_t> named[] = {
      {block, s.block}, {head, s.head}, {token, s.token}};
  for (const auto& [name, v] : named) {
    if (v <= 0) {
      fail(ErrorCode::kInvalidArgument, name, v,
           "must be positive (all three 0 is the default dense layout)");
    }
  }
  // The span in long double first: the int64 products below must not overflow.
  const long double span = static_cast<long double>(std::max(num_blocks - 1, 0)) * s.block +
                           static_cast<long double>(num_kv_heads - 1) * s.head +
                           static_cast<long double>(block_size - 1) * s.token + head_dim;
  if (span > 4e18L) {
    fail(ErrorCode::kInvalidArgument, block, s.block,
         "too large: the pool's span exceeds the addressable range");
  }
  // No two rows overlap when, with the dimensions in increasing stride, each stride is at least
  // the extent of the dimensions below it (a row is head_dim elements). Dimensions of size 1
  // take no room and are skipped.
  // (fuzz/plant_malformation.cpp re-derives this rule apart, as the fuzzer's oracle of it.)
  struct Dim {
    const std::string* name;
    std::int64_t stride;
    int size;
  };
  Dim dims[] = {
      {&token, s.token, block_size}, {&head, s.head, num_kv_heads}, {&block, s.block, num_blocks}};
  std::stable_sort(std::begin(dims), std::end(dims),
                   [](const Dim& x, const Dim& y) { return x.stride < y.stride; });
  std::int64_t extent = head_dim;
  for (const Dim& d : dims) {
    if (d.size <= 1) continue;
    if (d.stride < extent) {
      std::ostringstream v;
      v << d.stride << " (" << f << " = {block " << s.block << ", head " << s.head << ", token "
        << s.token << "}, head_dim " << head_dim << ")";
      fail(ErrorCode::kInvalidArgument, *d.name, v.str(),
           "makes cache rows overlap: each stride must be at least the extent (" +
               std::to_string(extent) + " elements) of the dimensions with smaller strides");
    }
    extent += d.stride * (d.size - 1);
  }
}

void require_non_null(const char* name, const void* p) {
  if (p == nullptr) fail(ErrorCode::kInvalidArgument, name, "null", "pointer must not be null");
}

void require_dtype(const char* name, DType t) {
  if (t != DType::kF32 && t != DType::kF16 && t != DType::kBF16 && !is_quantized(t)) {
    fail(ErrorCode::kInvalidArgument, name, static_cast<int>(t), "not a DType");
  }
}

void require_value_dtype(const char* name, DType t) {
  require_dtype(name, t);
  if (is_quantized(t)) {
    fail(ErrorCode::kUnsupported, name, dtype_name(t),
         std::string("unsupported: ") + dtype_name(t) +
             " stores K and V caches only (this tensor takes f32, f16 or bf16)");
  }
}

void require_cache_scales(const char* dtype_field, DType cache, float k_scale, float v_scale,
                          const float* k_scales, const float* v_scales) {
  require_kv_scale("k_scale", k_scale);
  require_kv_scale("v_scale", v_scale);
  if (is_quantized(cache)) return;
  const std::string why = std::string("applies to quantized caches only (") + dtype_field +
                          " fp8_e4m3, fp8_e5m2, int8 or int4)";
  if (k_scale != 1.f) fail(ErrorCode::kUnsupported, "k_scale", k_scale, why);
  if (v_scale != 1.f) fail(ErrorCode::kUnsupported, "v_scale", v_scale, why);
  if (k_scales != nullptr) fail(ErrorCode::kUnsupported, "k_scales", "set", why);
  if (v_scales != nullptr) fail(ErrorCode::kUnsupported, "v_scales", "set", why);
}

void require_int4_cache(DType cache, int head_dim, const CacheStrides& kv_strides) {
  if (cache != DType::kInt4) return;
  if (head_dim % kInt4GroupSize != 0) {
    fail(ErrorCode::kUnsupported, "head_dim", head_dim,
         "unsupported for an int4 cache: it must be a multiple of 32 (a scale per group of 32 "
         "values)");
  }
  const std::pair<const char*, std::int64_t> named[] = {{"kv_strides.block", kv_strides.block},
                                                        {"kv_strides.head", kv_strides.head},
                                                        {"kv_strides.token", kv_strides.token}};
  for (const auto& [name, v] : named) {
    if (v % 2 != 0) {
      fail(ErrorCode::kInvalidArgument, name, v,
           "must be even for an int4 cache (strides count 4-bit codes, two to a byte: each row "
           "starts on a byte)");
    }
  }
}

void require_token_scales(const char* dtype_field, DType cache, const float* k_token_scales,
                          const float* v_token_scales, const CacheStrides& strides, int num_blocks,
                          int num_kv_heads, int block_size, int head_dim) {
  const bool k = k_token_scales != nullptr, v = v_token_scales != nullptr;
  if (k != v) {
    fail(ErrorCode::kInvalidArgument, k ? "v_token_scales" : "k_token_scales", "null",
         std::string("must be set with ") + (k ? "k_token_scales" : "v_token_scales") +
             " (per-token scales come in pairs)");
  }
  if (!k && cache == DType::kInt4) {
    fail(ErrorCode::kInvalidArgument, "k_token_scales", "null",
         std::string("an int4 cache (") + dtype_field +
             ") needs its group scales: k_token_scales and v_token_scales, head_dim / 32 per row");
  }
  if (!k) {
    if (!strides.is_default()) {
      fail(ErrorCode::kInvalidArgument, "token_scale_strides.block", strides.block,
           "set without per-token scales (k_token_scales and v_token_scales are null)");
    }
    return;
  }
  if (!is_quantized(cache)) {
    fail(ErrorCode::kUnsupported, "k_token_scales", "set",
         std::string("applies to quantized caches only (") + dtype_field + " is " +
             dtype_name(cache) + "; per-token scales take fp8_e4m3, fp8_e5m2, int8 or int4)");
  }
  require_cache_strides(strides, num_blocks, num_kv_heads, block_size,
                        token_scales_per_row(cache, head_dim), "token_scale_strides");
}

void require_kv_scale(const char* name, float v) {
  if (!(v >= kMinKvScale && v <= kMaxKvScale)) {
    std::ostringstream why;
    why << "must be in [" << kMinKvScale << ", " << kMaxKvScale << "]";
    fail(ErrorCode::kInvalidArgument, name, v, why.str());
  }
}

void require_block_size(int block_size) {
  if (block_size < 1 || block_size > kMaxBlockSize) {
    fail(ErrorCode::kUnsupported, "block_size", block_size,
         "unsupported (supported: 1 to " + std::to_string(kMaxBlockSize) + ")");
  }
}

void require_head_dim(int head_dim) {
  if (!is_supported_head_dim(head_dim)) {
    fail(ErrorCode::kUnsupported, "head_dim", head_dim, supported_head_dims_text());
  }
}

void require_cuda_head_dim(int head_dim) {
  if (is_cuda_head_dim(head_dim)) return;
  fail(ErrorCode::kUnsupported, "head_dim", head_dim,
       "the CUDA backend has no kernel for this head dim yet (its head dims: " +
           head_dims_list(kCudaHeadDims) + "; the CPU backend takes it)");
}

void require_cuda_cache_dtype(const char* name, DType cache) {
  if (cache != DType::kInt4) return;
  fail(ErrorCode::kUnsupported, name, dtype_name(cache),
       "the CUDA backend has no int4 caches yet (the CPU backend takes them)");
}

void require_backend(const char* name, Backend b) {
  if (b != Backend::kAuto && b != Backend::kCpu && b != Backend::kCuda) {
    fail(ErrorCode::kInvalidArgument, name, static_cast<int>(b),
         "not a Backend (kAuto, kCpu or kCuda)");
  }
}

void require_num_threads(int n) {
  if (n < 0 || n > kMaxThreads) {
    fail(ErrorCode::kInvalidArgument, "num_threads", n,
         "out of range [0, " + std::to_string(kMaxThreads) + "] (0: OpenMP's default)");
  }
}

void validate_options(const DecodeOptions& o) {
  require_backend("backend", o.backend);
  require_num_threads(o.num_threads);
}

void validate_options(const CacheOpOptions& o) {
  require_backend("backend", o.backend);
  require_num_threads(o.num_threads);
}

void validate_options(const MergeStatesOptions& o) {
  require_backend("backend", o.backend);
  require_num_threads(o.num_threads);
}

void validate_merge_args(const MergeStatesArgs& a) {
  if (a.num_segments < 0) {
    fail(ErrorCode::kInvalidArgument, "num_segments", a.num_segments, "must not be negative");
  }
  if (a.num_rows < 0) {
    fail(ErrorCode::kInvalidArgument, "num_rows", a.num_rows, "must not be negative");
  }
  require_positive("head_dim", a.head_dim);
  require_value_dtype("part_dtype", a.part_dtype);
  require_value_dtype("out_dtype", a.out_dtype);
  if (static_cast<double>(a.num_segments) * a.num_rows * a.head_dim > 4e18) {
    fail(ErrorCode::kInvalidArgument, "num_rows", a.num_rows,
         "num_segments * num_rows * head_dim elements exceed the addressable range");
  }
  if (a.num_rows == 0) return;  // a no-op: nothing is read or written
  // Without segments every row is empty (out = 0, lse = -inf) and the inputs are not read.
  if (a.num_segments > 0) {
    require_non_null("parts", a.parts);
    require_non_null("part_lse", a.part_lse);
  }
  require_non_null("out", a.out);
}

void validate_slot_mapping(const CacheWriteArgs& a, const std::int32_t* slot_mapping) {
  validate_write_slots(slot_mapping, a.num_tokens,
                       static_cast<std::int64_t>(a.num_blocks) * a.block_size, SlotSkip::kMinusOne);
}

void validate_write_slots(const std::int32_t* slot_mapping, int num_tokens, std::int64_t num_slots,
                          SlotSkip skip) {
  const bool negative_skips = skip == SlotSkip::kNegative;
  const char* skips = negative_skips ? "negative slots" : "-1";
  std::vector<std::pair<std::int32_t, int>> used;  // (slot, token)
  used.reserve(num_tokens);
  for (int i = 0; i < num_tokens; ++i) {
    const std::int32_t s = slot_mapping[i];
    if (s == -1 || (s < 0 && negative_skips)) continue;
    if (s < 0 || s >= num_slots) {
      std::ostringstream arg;
      arg << "slot_mapping[" << i << "]";
      fail(ErrorCode::kOutOfRange, arg.str(), s,
           "slot out of range [0, " + std::to_string(num_slots) + ") (num_blocks * block_size)" +
               (negative_skips ? std::string() : std::string(", and not -1 (skip)")));
    }
    used.emplace_back(s, i);
  }
  // Tokens are written in parallel, so two tokens in one slot would race. The error names the
  // first token (in token order) whose slot an earlier token already holds.
  std::sort(used.begin(), used.end());
  int repeat = -1, first = -1;
  for (std::size_t j = 0; j < used.size();) {
    std::size_t end = j + 1;
    while (end < used.size() && used[end].first == used[j].first) ++end;
    if (end - j > 1 && (repeat < 0 || used[j + 1].second < repeat)) {
      repeat = used[j + 1].second;
      first = used[j].second;
    }
    j = end;
  }
  if (repeat >= 0) {
    std::ostringstream arg;
    arg << "slot_mapping[" << repeat << "]";
    fail(ErrorCode::kInvalidArgument, arg.str(), slot_mapping[repeat],
         "the slot of slot_mapping[" + std::to_string(first) +
             "] too: the slots of one write must be distinct (only " + skips + " may repeat)");
  }
}

bool is_supported_head_dim(int head_dim) {
  for (int d : kSupportedHeadDims) {
    if (d == head_dim) return true;
  }
  return false;
}

bool is_cuda_head_dim(int head_dim) {
  for (int d : kCudaHeadDims) {
    if (d == head_dim) return true;
  }
  return false;
}

void require_table_shape(const DecodeArgs& a) {
  require_block_size(a.block_size);
  if (a.num_blocks < 0) {
    fail(ErrorCode::kInvalidArgument, "num_blocks", a.num_blocks, "must not be negative");
  }
  if (a.max_blocks_per_seq < 0) {
    fail(ErrorCode::kInvalidArgument, "max_blocks_per_seq", a.max_blocks_per_seq,
         "must not be negative");
  }
  if (a.block_table_stride != 0 && a.block_table_stride < a.max_blocks_per_seq) {
    std::ostringstream v;
    v << a.block_table_stride << " (max_blocks_per_seq = " << a.max_blocks_per_seq << ")";
    fail(ErrorCode::kInvalidArgument, "block_table_stride", v.str(),
         "must be 0 or at least max_blocks_per_seq");
  }
  if (static_cast<std::int64_t>(a.max_blocks_per_seq) * a.block_size > INT32_MAX) {
    fail(ErrorCode::kInvalidArgument, "max_blocks_per_seq", a.max_blocks_per_seq,
         "times block_size exceeds the int32 context range");
  }
}

void require_query_counts(const DecodeArgs& a) {
  if (a.q_indptr == nullptr) {
    if (a.num_q_tokens != 0) {
      fail(ErrorCode::kInvalidArgument, "num_q_tokens", a.num_q_tokens,
           "must be 0 without q_indptr (one query token per sequence)");
    }
    if (a.max_q_len != 0) {
      fail(ErrorCode::kInvalidArgument, "max_q_len", a.max_q_len,
           "must be 0 without q_indptr (one query token per sequence)");
    }
    return;
  }
  if (a.num_q_tokens < 0) {
    fail(ErrorCode::kInvalidArgument, "num_q_tokens", a.num_q_tokens, "must not be negative");
  }
  require_positive("max_q_len", a.max_q_len);
  if (a.batch == 0 && a.num_q_tokens != 0) {  // q_indptr[batch] = q_indptr[0] = 0
    fail(ErrorCode::kInvalidArgument, "num_q_tokens", a.num_q_tokens, "must be 0 when batch is 0");
  }
}

void validate_shapes(const DecodeArgs& a, bool require_out) {
  if (a.batch < 0) fail(ErrorCode::kInvalidArgument, "batch", a.batch, "must not be negative");
  require_positive("num_heads", a.num_heads);
  require_positive("num_kv_heads", a.num_kv_heads);
  if (a.num_heads % a.num_kv_heads != 0) {
    std::ostringstream v;
    v << a.num_heads << " (num_kv_heads = " << a.num_kv_heads << ")";
    fail(ErrorCode::kInvalidArgument, "num_heads", v.str(), "must be a multiple of num_kv_heads");
  }
  if (a.group_size() > kMaxGroupSize) {
    std::ostringstream v;
    v << a.group_size() << " (num_heads " << a.num_heads << " / num_kv_heads " << a.num_kv_heads
      << ")";
    fail(ErrorCode::kUnsupported, "group_size", v.str(),
         "unsupported (at most " + std::to_string(kMaxGroupSize) + " query heads per kv head)");
  }
  require_head_dim(a.head_dim);
  require_table_shape(a);
  require_query_counts(a);
  if ((a.tree_mask == nullptr) != (a.tree_mask_indptr == nullptr)) {
    fail(ErrorCode::kInvalidArgument, a.tree_mask ? "tree_mask_indptr" : "tree_mask", "null",
         "tree_mask and tree_mask_indptr are set together");
  }
  if (a.tree_mask != nullptr && a.q_indptr == nullptr) {
    fail(ErrorCode::kInvalidArgument, "q_indptr", "null",
         "a tree mask needs q_indptr (it masks a sequence's query tokens)");
  }
  const std::int64_t row = static_cast<std::int64_t>(a.num_heads) * a.head_dim;
  const std::pair<const char*, std::int64_t> row_strides[] = {{"q_row_stride", a.q_row_stride},
                                                              {"out_row_stride", a.out_row_stride}};
  for (const auto& [name, stride] : row_strides) {
    // Every element offset r * stride + h * head_dim + d must fit in int64.
    if (a.q_rows() > 0 && stride > (INT64_MAX - row) / a.q_rows()) {
      fail(ErrorCode::kInvalidArgument, name, stride,
           "too large: rows * stride exceeds the addressable range");
    }
    if (stride != 0 && stride < row) {
      std::ostringstream v;
      v << stride << " (num_heads * head_dim = " << row << ")";
      fail(ErrorCode::kInvalidArgument, name, v.str(),
           "must be 0 (dense) or at least num_heads * head_dim: rows must not overlap");
    }
  }
  require_cache_strides(a.kv_strides, a.num_blocks, a.num_kv_heads, a.block_size, a.head_dim);
  require_value_dtype("q_dtype", a.q_dtype);
  require_dtype("k_dtype", a.k_dtype);
  require_dtype("v_dtype", a.v_dtype);
  require_value_dtype("out_dtype", a.out_dtype);
  if (a.k_dtype != a.v_dtype) {
    fail(ErrorCode::kUnsupported, "v_dtype", dtype_name(a.v_dtype),
         std::string("must equal k_dtype (") + dtype_name(a.k_dtype) + ")");
  }
  require_cache_scales("k_dtype", a.k_dtype, a.k_scale, a.v_scale, a.k_scales, a.v_scales);
  require_int4_cache(a.k_dtype, a.head_dim, a.kv_strides);
  require_token_scales("k_dtype", a.k_dtype, a.k_token_scales, a.v_token_scales,
                       a.token_scale_strides, a.num_blocks, a.num_kv_heads, a.block_size,
                       a.head_dim);
  if (a.scale && !std::isfinite(*a.scale)) {
    fail(ErrorCode::kInvalidArgument, "scale", *a.scale, "must be finite");
  }
  if (a.window_left < -1) {
    fail(ErrorCode::kInvalidArgument, "window_left", a.window_left,
         "must be -1 (no window) or at least 0");
  }
  if (!(a.logits_soft_cap >= 0.f) || !std::isfinite(a.logits_soft_cap)) {
    fail(ErrorCode::kInvalidArgument, "logits_soft_cap", a.logits_soft_cap,
         "must be finite and at least 0 (0: no soft-cap)");
  }
  if (a.logits_soft_cap != 0.f &&
      (a.logits_soft_cap < kMinSoftCap || a.logits_soft_cap > kMaxVariantMagnitude)) {
    std::ostringstream why;
    why << "must be 0 (no soft-cap) or in [" << kMinSoftCap << ", " << kMaxVariantMagnitude << "]";
    fail(ErrorCode::kInvalidArgument, "logits_soft_cap", a.logits_soft_cap, why.str());
  }
  if (a.batch == 0) return;  // a no-op: nothing is read or written
  require_non_null("q", a.q);
  require_non_null("k_cache", a.k_cache);
  require_non_null("v_cache", a.v_cache);
  require_non_null("block_table", a.block_table);
  require_non_null("context_lens", a.context_lens);
  if (require_out) require_non_null("out", a.out);
}

void validate_q_indptr(const DecodeArgs& a, const std::int32_t* q_indptr) {
  if (a.q_indptr == nullptr) return;
  if (q_indptr[0] != 0) fail(ErrorCode::kInvalidArgument, "q_indptr[0]", q_indptr[0], "must be 0");
  for (int b = 0; b < a.batch; ++b) {
    const std::int64_t n = static_cast<std::int64_t>(q_indptr[b + 1]) - q_indptr[b];
    if (n < 0 || n > a.max_q_len) {
      std::ostringstream arg, why;
      arg << "q_indptr[" << b + 1 << "]";
      why << "gives sequence " << b << " " << n << " query tokens (q_indptr[" << b
          << "] = " << q_indptr[b] << "): each sequence has 0 to max_q_len = " << a.max_q_len;
      fail(ErrorCode::kOutOfRange, arg.str(), q_indptr[b + 1], why.str());
    }
  }
  if (q_indptr[a.batch] != a.num_q_tokens) {
    std::ostringstream arg;
    arg << "q_indptr[" << a.batch << "]";
    fail(ErrorCode::kInvalidArgument, arg.str(), q_indptr[a.batch],
         "must equal num_q_tokens = " + std::to_string(a.num_q_tokens));
  }
}

void validate_tables(const DecodeArgs& a, const std::int32_t* context_lens,
                     const std::int32_t* block_table, const std::int32_t* q_indptr) {
  const std::int64_t capacity = static_cast<std::int64_t>(a.max_blocks_per_seq) * a.block_size;
  const BlockTableView table{block_table, a.max_blocks_per_seq, a.table_stride()};
  for (int b = 0; b < a.batch; ++b) {
    const int len = context_lens[b];
    if (len < 0 || len > capacity) {
      std::ostringstream v;
      v << "context_lens[" << b << "]";
      fail(ErrorCode::kOutOfRange, v.str(), len,
           "out of range [0, " + std::to_string(capacity) + "] (max_blocks_per_seq * block_size)");
    }
    const auto [first, used] = read_entries(a, len, q_indptr, b);
    for (int i = first; i < used; ++i) {
      const std::int32_t id = table.block(b, i);
      if (id < 0 || id >= a.num_blocks) {
        std::ostringstream arg;
        arg << "block_table[" << b << "][" << i << "]";
        fail(ErrorCode::kOutOfRange, arg.str(), id,
             "block id out of range [0, " + std::to_string(a.num_blocks) +
                 ") (num_blocks) inside context_lens[" + std::to_string(b) +
                 "] = " + std::to_string(len));
      }
    }
  }
}

void validate_kv_scales(const DecodeArgs& a, const float* k_scales, const float* v_scales) {
  for (int h = 0; h < a.num_kv_heads; ++h) {
    if (k_scales != nullptr)
      require_kv_scale(("k_scales[" + std::to_string(h) + "]").c_str(), k_scales[h]);
    if (v_scales != nullptr)
      require_kv_scale(("v_scales[" + std::to_string(h) + "]").c_str(), v_scales[h]);
  }
}

void validate_token_scales(const DecodeArgs& a, const float* k_token_scales,
                           const float* v_token_scales, const std::int32_t* context_lens,
                           const std::int32_t* block_table, const std::int32_t* q_indptr) {
  if (k_token_scales == nullptr) return;
  const CacheLayout layout = a.token_scale_layout();
  const BlockTableView table{block_table, a.max_blocks_per_seq, a.table_stride()};
  // The first n rows of (block id, kv head kv): a branch-free pass over them (this runs on every
  // decode call), then, only where one is out of range, the search for the first such row.
  // A row has `groups` scales (int4: one per group of 32 values; an error names the group).
  const int groups = token_scales_per_row(a.k_dtype, a.head_dim);
  const auto check = [&](const char* name, const float* scales, int id, int kv, int n) {
    const float* row = scales + layout.offset(id, kv, 0);
    const std::int64_t step = layout.token_stride;
    bool bad = false;
    for (int slot = 0; slot < n; ++slot) {
      for (int g = 0; g < groups; ++g) {
        const float x = row[slot * step + g];
        bad |= !(x >= kMinKvScale && x <= kMaxKvScale);
      }
    }
    for (int slot = 0; bad && slot < n; ++slot) {
      for (int g = 0; g < groups; ++g) {
        std::ostringstream arg;
        arg << name << "[block " << id << ", kv head " << kv << ", slot " << slot;
        if (a.k_dtype == DType::kInt4) arg << ", group " << g;
        arg << "]";
        require_kv_scale(arg.str().c_str(), row[slot * step + g]);
      }
    }
  };
  for (int b = 0; b < a.batch; ++b) {
    const int len = context_lens[b];
    const auto [first, used] = read_entries(a, len, q_indptr, b);
    for (int i = first; i < used; ++i) {
      const int id = table.block(b, i);
      for (int kv = 0; kv < a.num_kv_heads; ++kv) {
        check("k_token_scales", k_token_scales, id, kv, valid_in_block(len, a.block_size, i));
        check("v_token_scales", v_token_scales, id, kv, valid_in_block(len, a.block_size, i));
      }
    }
  }
}

void validate_variant_values(const DecodeArgs& a, const float* alibi_slopes, const float* sinks) {
  for (int h = 0; h < a.num_heads; ++h) {
    if (alibi_slopes != nullptr && !(std::fabs(alibi_slopes[h]) <= kMaxVariantMagnitude)) {
      std::ostringstream why;
      why << "must be finite, of magnitude at most " << kMaxVariantMagnitude;
      fail(ErrorCode::kInvalidArgument, "alibi_slopes[" + std::to_string(h) + "]", alibi_slopes[h],
           why.str());
    }
    if (sinks != nullptr && sinks[h] != -INFINITY &&
        !(std::fabs(sinks[h]) <= kMaxVariantMagnitude)) {
      std::ostringstream why;
      why << "must not be NaN or +inf and at most " << kMaxVariantMagnitude
          << " in magnitude (-inf is no sink)";
      fail(ErrorCode::kInvalidArgument, "sinks[" + std::to_string(h) + "]", sinks[h], why.str());
    }
  }
}

void validate_tree_mask(const DecodeArgs& a, const std::uint8_t* tree_mask,
                        const std::int32_t* tree_mask_indptr, const std::int32_t* q_indptr) {
  if (a.tree_mask == nullptr) return;
  if (tree_mask_indptr[0] < 0) {
    fail(ErrorCode::kInvalidArgument, "tree_mask_indptr[0]", tree_mask_indptr[0],
         "must not be negative");
  }
  for (int b = 0; b < a.batch; ++b) {
    const int n = q_indptr[b + 1] - q_indptr[b];
    const std::int64_t have =
        static_cast<std::int64_t>(tree_mask_indptr[b + 1]) - tree_mask_indptr[b];
    if (have < tree_mask_bytes(n)) {
      std::ostringstream arg, why;
      arg << "tree_mask_indptr[" << b + 1 << "]";
      why << "leaves sequence " << b << " " << have << " bytes (tree_mask_indptr[" << b
          << "] = " << tree_mask_indptr[b] << ") for the " << n << " x " << n
          << " bits of its mask: it needs " << tree_mask_bytes(n);
      fail(ErrorCode::kInvalidArgument, arg.str(), tree_mask_indptr[b + 1], why.str());
    }
    for (int i = 0; i < n; ++i) {
      const TreeMaskRow row = tree_mask_row(tree_mask, tree_mask_indptr[b], n, i, n);
      for (int j = i + 1; j < n; ++j) {
        if (!row.attends(j)) continue;
        std::ostringstream arg, why;
        arg << "tree_mask bit (" << i << ", " << j << ") of sequence " << b;
        why << "token " << i << " may not attend the later token " << j
            << ": bits above the diagonal must be clear";
        fail(ErrorCode::kInvalidArgument, arg.str(), 1, why.str());
      }
    }
  }
}

}  // namespace pagedattn
