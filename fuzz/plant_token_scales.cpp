// The per-token scale malformations (plant_malformation.hpp): the expected errors follow the rules
// DecodeArgs documents for k_token_scales, v_token_scales and token_scale_strides
// (pagedattn.hpp), re-derived here apart from core/src/validate.cpp, which checks them.
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "fast_case.hpp"
#include "pagedattn/cache_layout.hpp"
#include "pagedattn/variants.hpp"
#include "plant_malformation.hpp"

namespace pagedattn::fuzz {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// A row's scales: one, or an int4 row's one per group of 32 values.
int scales_per_row(const DecodeArgs& a) { return token_scales_per_row(a.k_dtype, a.head_dim); }

// Scales of ones (valid values) for every row of the pool, dense, in b's K and/or V array, args
// pointed at them.
void set_ones(BuiltCase& b, bool k, bool v) {
  DecodeArgs& a = b.args;
  const std::size_t n =
      static_cast<std::size_t>(a.num_blocks) * a.num_kv_heads * a.block_size * scales_per_row(a);
  if (k) {
    b.k_token_scales.assign(n, 1.f);
    a.k_token_scales = b.k_token_scales.data();
  }
  if (v) {
    b.v_token_scales.assign(n, 1.f);
    a.v_token_scales = b.v_token_scales.data();
  }
}

// Both arrays on an f32, f16 or bf16 cache, now and then in valid NHD strides: per-token scales
// belong to quantized caches, which is checked before their strides (kUnsupported).
void plant_on_plain_cache(const FuzzCase& c, BuiltCase& b) {
  if (c.quantized()) not_applicable(c);
  set_ones(b, true, true);
  const DecodeArgs& a = b.args;
  if ((c.bad_param >> 8) % 2) {
    b.args.token_scale_strides = CacheStrides::nhd(a.num_kv_heads, a.block_size, 1);
  }
  b.expected_code = ErrorCode::kUnsupported;
  b.expected_argument = "k_token_scales";
}

// One array without the other (the case's other one nulled, or on a case without them, one set
// alone, whatever the cache): the missing one is named. Or neither array with token_scale_strides
// set (the case's own, explicit dense ones, one field alone, or a negative one): the strides'
// block field is named, whichever field is set.
void plant_unpaired(const FuzzCase& c, BuiltCase& b) {
  DecodeArgs& a = b.args;
  const std::uint64_t p = c.bad_param;
  const int kind = static_cast<int>(p % 3);
  if (kind == 2) {
    const CacheStrides own = a.token_scale_strides;
    const CacheStrides values[] = {CacheStrides::hnd(a.num_kv_heads, a.block_size, 1),
                                   CacheStrides{0, 0, 1}, CacheStrides{0, 1, 0},
                                   CacheStrides{-1, 0, 0}};
    a.k_token_scales = a.v_token_scales = nullptr;
    a.token_scale_strides = own.is_default() ? values[(p >> 8) % 4] : own;
    // An int4 cache without its group scales is refused before their strides are looked at.
    b.expected_argument =
        a.k_dtype == DType::kInt4 ? "k_token_scales" : "token_scale_strides.block";
    return;
  }
  const bool k_missing = kind == 0;
  if (c.token_scales()) {
    (k_missing ? a.k_token_scales : a.v_token_scales) = nullptr;
  } else {
    set_ones(b, !k_missing, k_missing);
  }
  b.expected_argument = k_missing ? "k_token_scales" : "v_token_scales";
}

// The tokens (positions) of sequence s whose rows validate_token_scales checks: every token below
// its context from the block of its first read token on (none without a query token). With `read`,
// only those one of its rows attends (its window, less what its tree mask leaves out).
std::vector<int> checked_tokens(const FuzzCase& c, const BuiltCase& b, int s, bool read) {
  const int L = b.host.context_lens[s], BS = c.spec.block_size;
  const int q_len = c.multi_token() ? c.q_lens[static_cast<std::size_t>(s)] : 1;
  std::vector<int> tokens;
  if (q_len <= 0) return tokens;
  for (int t = first_read_token(L, c.window_left, q_len) / BS * BS; t < L; ++t) {
    bool attended = !read;
    for (int r = 0; r < b.rows && !attended; ++r) {
      const int len = b.row_lens[static_cast<std::size_t>(r)];
      attended = b.row_seq[static_cast<std::size_t>(r)] == s && t < len &&
                 t >= window_first_token(len, c.window_left) && b.tree_attends(r, t);
    }
    if (attended) tokens.push_back(t);
  }
  return tokens;
}

// A row's K or V scale out of [kMinKvScale, kMaxKvScale]: in a token a row reads (three times in
// four, where the sequence has one), else in any token whose row is checked. Checked sequence by
// sequence, the one bad row is the error whichever sequence reaches it first (kInvalidArgument,
// "k_token_scales[block B, kv head H, slot S]" with B the physical block id; an int4 row's scale
// is one of its groups', "[block B, kv head H, slot S, group G]").
void plant_bad_scale(const FuzzCase& c, BuiltCase& b) {
  const std::uint64_t p = c.bad_param;
  if (!c.token_scales() || b.k_token_scales.empty()) not_applicable(c);
  std::vector<int> seqs;
  for (int s = 0; s < c.spec.batch; ++s) {
    if (!checked_tokens(c, b, s, false).empty()) seqs.push_back(s);
  }
  if (seqs.empty()) not_applicable(c);
  const int s = seqs[p % seqs.size()];
  std::vector<int> tokens = checked_tokens(c, b, s, (p >> 40) % 4 != 0);
  if (tokens.empty()) tokens = checked_tokens(c, b, s, false);
  const int t = tokens[(p >> 8) % tokens.size()];
  const testing::HostCase& h = b.host;
  const int BS = c.spec.block_size, kv = static_cast<int>((p >> 16) % c.spec.num_kv_heads);
  const int id = h.block_table[static_cast<std::size_t>(s) * h.table_stride + t / BS];
  const int groups = scales_per_row(b.args);
  const int g = static_cast<int>((p >> 48) % groups);
  const CacheLayout l = CacheLayout::with_strides(h.num_blocks, c.spec.num_kv_heads, BS, groups,
                                                  c.token_scale_strides());
  const float values[] = {0.f,
                          -0.f,
                          -1.f,
                          kNaN,
                          kInf,
                          -kInf,
                          1e31f,
                          9.9e-31f,
                          -std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::denorm_min()};
  const bool v = (p >> 24) % 2;
  (v ? b.v_token_scales
     : b.k_token_scales)[static_cast<std::size_t>(l.offset(id, kv, t % BS) + g)] =
      values[(p >> 32) % (sizeof(values) / sizeof(values[0]))];
  b.expected_argument =
      std::string(v ? "v_token_scales" : "k_token_scales") + "[block " + std::to_string(id) +
      ", kv head " + std::to_string(kv) + ", slot " + std::to_string(t % BS) +
      (c.spec.kv_dtype == DType::kInt4 ? ", group " + std::to_string(g) : "") + "]";
}

// The case's token_scale_strides (the explicit dense ones in the default layout) made bad
// (bad_strides, with rows of one element, or an int4 row's head_dim / 32).
void plant_token_scale_strides(const FuzzCase& c, BuiltCase& b) {
  DecodeArgs& a = b.args;
  if (!c.token_scales()) not_applicable(c);
  const int n_row = scales_per_row(a);
  const CacheStrides own = c.token_scale_strides();
  const CacheStrides base =
      own.is_default() ? CacheStrides::hnd(a.num_kv_heads, a.block_size, n_row) : own;
  const BadStrides bad =
      bad_strides({base, a.num_blocks, a.num_kv_heads, a.block_size, n_row, "token_scale_strides"},
                  c.bad_param);
  if (bad.field.empty()) not_applicable(c);
  a.token_scale_strides = bad.strides;
  b.expected_argument = bad.field;
}

}  // namespace

void plant_in_token_scales(const FuzzCase& c, BuiltCase& b) {
  switch (c.bad) {
    case Malformation::kTokenScalesOnPlainCache:
      return plant_on_plain_cache(c, b);
    case Malformation::kTokenScalesUnpaired:
      return plant_unpaired(c, b);
    case Malformation::kBadTokenScale:
      return plant_bad_scale(c, b);
    case Malformation::kTokenScaleStrides:
      return plant_token_scale_strides(c, b);
    default:
      break;
  }
}

}  // namespace pagedattn::fuzz
