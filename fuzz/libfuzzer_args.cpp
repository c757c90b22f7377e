#include "libfuzzer_args.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <limits>
#include <vector>

#include "pagedattn/tree_mask.hpp"

namespace pagedattn::fuzz {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// The shapes, the table's geometry, the dtypes (-1 is none) and the scale.
void draw_shapes(FuzzedDataProvider& in, DecodeArgs& a) {
  a.batch = in.ConsumeIntegralInRange<int>(-2, 5);
  a.num_kv_heads = in.ConsumeIntegralInRange<int>(-1, 4);
  const int group = in.ConsumeIntegralInRange<int>(0, 66);
  a.num_heads = in.ConsumeBool() ? a.num_kv_heads * group : in.ConsumeIntegralInRange<int>(-1, 80);
  constexpr int kDims = static_cast<int>(std::size(kSupportedHeadDims));
  a.head_dim = in.ConsumeBool() ? kSupportedHeadDims[in.ConsumeIntegralInRange<int>(0, kDims - 1)]
                                : in.ConsumeIntegralInRange<int>(-2, 300);
  a.block_size = in.ConsumeBool() ? in.ConsumeIntegralInRange<int>(1, 20)
                                  : in.ConsumeIntegralInRange<int>(-2, 260);
  a.num_blocks = in.ConsumeIntegralInRange<int>(-1, 12);
  a.max_blocks_per_seq = in.ConsumeIntegralInRange<int>(-1, 8);
  a.block_table_stride = in.ConsumeIntegralInRange<int>(0, 10);
  const DType kv_dtype = static_cast<DType>(in.ConsumeIntegralInRange<int>(-1, 3));
  a.q_dtype = static_cast<DType>(in.ConsumeIntegralInRange<int>(-1, 3));
  a.k_dtype = kv_dtype;
  a.v_dtype = in.ConsumeIntegralInRange<int>(0, 15) == 0
                  ? static_cast<DType>(in.ConsumeIntegralInRange<int>(-1, 3))
                  : kv_dtype;
  a.out_dtype = static_cast<DType>(in.ConsumeIntegralInRange<int>(-1, 3));
  switch (in.ConsumeIntegralInRange<int>(0, 7)) {
    case 0:
      a.scale = in.ConsumeFloatingPointInRange<float>(-2.f, 2.f);
      break;
    case 1:
      a.scale = kNaN;
      break;
    case 2:
      a.scale = kInf;
      break;
    default:
      break;
  }
}

// The attention variants, valid or not. Each draw's first value is "none", which is what an
// input too short to choose gets (the corpus of plain cases keeps its meaning).
void draw_variants(FuzzedDataProvider& in, DrawnArgs& d) {
  DecodeArgs& a = d.a;
  switch (in.ConsumeIntegralInRange<int>(0, 7)) {
    case 4:
    case 5:  // anywhere up to twice the longest possible context
      a.window_left = in.ConsumeIntegralInRange<int>(
          0, 2 * std::max(a.max_blocks_per_seq, 1) * std::clamp(a.block_size, 1, 260));
      break;
    case 6:
      a.window_left = INT32_MAX;
      break;
    case 7:
      a.window_left = in.ConsumeIntegralInRange<int>(INT32_MIN, -2);
      break;
    default:
      break;
  }
  switch (in.ConsumeIntegralInRange<int>(0, 7)) {
    case 4:
    case 5:
      a.logits_soft_cap = in.ConsumeFloatingPointInRange<float>(0.5f, 60.f);
      break;
    case 6:  // small caps squash every logit; huge ones change nothing
      a.logits_soft_cap =
          in.ConsumeBool() ? in.ConsumeFloatingPointInRange<float>(1e-3f, 0.5f) : 1e20f;
      break;
    case 7: {
      const float bad[] = {-1.f, -1e-30f, kNaN, kInf, -kInf};
      a.logits_soft_cap = bad[in.ConsumeIntegralInRange<int>(0, 4)];
      break;
    }
    default:
      break;
  }
  d.slopes_kind = in.ConsumeIntegralInRange<int>(0, 3);
  d.sinks_kind = in.ConsumeIntegralInRange<int>(0, 3);
  d.bad_head = in.ConsumeIntegralInRange<int>(0, 80);
}

// Row strides of q and out, dense when the input runs out: a row plus a gap, q as the query part
// of a fused QKV row, out as half of a row twice as long, or one that must be refused (negative,
// or rows that overlap).
std::int64_t draw_row_stride(FuzzedDataProvider& in, const DecodeArgs& a, bool is_q) {
  const std::int64_t row = static_cast<std::int64_t>(product({a.num_heads, a.head_dim}));
  switch (in.ConsumeIntegralInRange<int>(0, 15)) {
    case 10:
    case 11:
      return row + in.ConsumeIntegralInRange<int>(0, 40);
    case 12:
      return row + in.ConsumeIntegralInRange<int>(41, 300);
    case 13:
      return is_q ? (static_cast<std::int64_t>(a.num_heads) + 2 * a.num_kv_heads) * a.head_dim
                  : 2 * row;
    case 14:
      return row;  // the dense row, given explicitly
    case 15: {
      const std::int64_t bad[] = {-1, std::numeric_limits<std::int64_t>::min(), 1, row - 1};
      return bad[in.ConsumeIntegralInRange<int>(0, 3)];
    }
    default:
      return 0;
  }
}

// Multi-token queries, none when the input runs out: 0-4 none; 5, 6 per-sequence counts of 0-6
// (more than a context, now and then) and a max_q_len at or up to 2 above the largest; 7 the same
// with one error: q_indptr[0] != 0, an entry below the one before, a count above max_q_len, a
// total other than num_q_tokens, max_q_len 0 or -1, or num_q_tokens and max_q_len without
// q_indptr.
void draw_query_tokens(FuzzedDataProvider& in, DrawnArgs& d) {
  DecodeArgs& a = d.a;
  std::vector<std::int32_t>& indptr = d.indptr;
  bool with_indptr = false;
  if (const int q_kind = in.ConsumeIntegralInRange<int>(0, 7); q_kind >= 5) {
    const int B = std::max(a.batch, 0);
    indptr.assign(static_cast<std::size_t>(B) + 1, 0);
    int longest = 0;
    for (int b = 0; b < B; ++b) {
      const int n = in.ConsumeIntegralInRange<int>(0, 6);
      indptr[b + 1] = indptr[b] + n;
      longest = std::max(longest, n);
    }
    a.num_q_tokens = indptr[B];
    a.max_q_len = std::max(longest, 1) + in.ConsumeIntegralInRange<int>(0, 2);
    with_indptr = true;
    if (q_kind == 7) {
      const int at = B > 0 ? in.ConsumeIntegralInRange<int>(1, B) : 0;
      switch (in.ConsumeIntegralInRange<int>(0, 5)) {
        case 0:
          indptr[0] = in.ConsumeBool() ? 1 : -1;
          break;
        case 1:
          if (at > 0) indptr[at] = indptr[at - 1] - 1;
          break;
        case 2:
          for (int b = at; b <= B && at > 0; ++b) indptr[b] += a.max_q_len + 1;
          break;
        case 3:
          a.num_q_tokens += in.ConsumeBool() ? 1 : -1;
          break;
        case 4:
          a.max_q_len = in.ConsumeIntegralInRange<int>(-1, 0);
          break;
        default:
          with_indptr = false;
          break;
      }
    }
  }
  a.q_indptr = with_indptr ? indptr.data() : nullptr;
}

// fp8 caches, none when the input runs out. The dtype draws above reach e4m3 (3) but not e5m2 (4),
// and widening their range would remap every existing input's dtypes: an odd fp8_kind turns every
// e4m3 field into e5m2 instead. fp8_kind 4-5: k_scale and v_scale drawn (K's 2^-8 to 1, so the
// logits stay as moderate as the rest; V's 2^-10 to 2^10); 6-7: the same with one of them invalid
// (0, -1, NaN, inf or 1e31). Scales on a cache that is not fp8 must be refused. Per-head scales:
// kv_scales_kind as slopes_kind (K in [1/4, 1], V in [1/4, 4), from the data), both arrays or V's
// alone (v_scales_only).
void draw_fp8(FuzzedDataProvider& in, DrawnArgs& d) {
  DecodeArgs& a = d.a;
  const int fp8_kind = in.ConsumeIntegralInRange<int>(0, 7);
  if (fp8_kind % 2 == 1) {
    for (DType* t : {&a.q_dtype, &a.k_dtype, &a.v_dtype, &a.out_dtype}) {
      if (*t == DType::kFP8E4M3) *t = DType::kFP8E5M2;
    }
  }
  if (fp8_kind >= 4) {
    a.k_scale = std::exp2(in.ConsumeFloatingPointInRange<float>(-8.f, 0.f));
    a.v_scale = std::exp2(in.ConsumeFloatingPointInRange<float>(-10.f, 10.f));
  }
  if (fp8_kind >= 6) {
    const float bad[] = {0.f, -1.f, kNaN, kInf, 1e31f};
    (in.ConsumeBool() ? a.v_scale : a.k_scale) = bad[in.ConsumeIntegralInRange<int>(0, 4)];
  }
  d.kv_scales_kind = in.ConsumeIntegralInRange<int>(0, 3);
  d.v_scales_only = in.ConsumeBool();
}

// Sequence b's query tokens for a tree mask: its count in the drawn q_indptr (even one left out or
// malformed: validation must refuse the mask or the counts first), 0-16, or 1 without one.
int tree_count(const DrawnArgs& d, int b) {
  if (d.indptr.empty()) return 1;
  return std::clamp(d.indptr[b + 1] - d.indptr[b], 0, 16);
}

// Tree masks, none when the input runs out: 0-4 none; 5, 6 a mask per sequence, its bits on and
// below the diagonal from the input, the bits past its last one all set or all clear, packed from
// an offset of 0-2 bytes with 0-2 bytes of padding after each mask; 7 the same with one error: a
// bit above the diagonal, a span one byte short, a negative tree_mask_indptr[0], or one of the two
// pointers null. The bytes are exactly tree_indptr's last entry (at least one). Without q_indptr a
// tree mask must be refused.
void draw_tree_mask(FuzzedDataProvider& in, DrawnArgs& d) {
  const int kind = in.ConsumeIntegralInRange<int>(0, 7);
  if (kind < 5) return;
  DecodeArgs& a = d.a;
  const int B = std::max(a.batch, 0);
  std::vector<std::uint8_t>& bytes = d.tree_bytes;
  std::vector<std::int32_t>& indptr = d.tree_indptr;
  indptr.assign(static_cast<std::size_t>(B) + 1, 0);
  indptr[0] = in.ConsumeIntegralInRange<int>(0, 2);
  bytes.assign(static_cast<std::size_t>(indptr[0]), 0xa5);
  for (int b = 0; b < B; ++b) {
    const int n = tree_count(d, b);
    const std::size_t start = bytes.size();
    const bool tail = in.ConsumeBool();
    bytes.resize(start + static_cast<std::size_t>(tree_mask_bytes(n)), 0);
    for (std::int64_t bit = 0; bit < tree_mask_bytes(n) * 8; ++bit) {
      const bool in_mask = bit < static_cast<std::int64_t>(n) * n;
      if (in_mask ? bit % n <= bit / n && in.ConsumeBool() : tail) {
        set_tree_mask_bit(bytes.data() + start, bit);
      }
    }
    bytes.resize(bytes.size() + in.ConsumeIntegralInRange<std::size_t>(0, 2), 0x5a);
    indptr[b + 1] = static_cast<std::int32_t>(bytes.size());
  }
  a.tree_mask = bytes.data();
  a.tree_mask_indptr = indptr.data();
  if (kind == 7) {
    int at = -1;  // the first sequence of 2 query tokens or more (1 or more for a short span)
    const int error = in.ConsumeIntegralInRange<int>(0, 4);
    for (int b = 0; b < B && at < 0; ++b) {
      if (tree_count(d, b) >= (error == 0 ? 2 : 1)) at = b;
    }
    if (error == 0 && at >= 0) {
      const int n = tree_count(d, at);
      const std::int64_t bit = static_cast<std::int64_t>(indptr[at]) * 8 + n - 1;  // (0, n - 1)
      set_tree_mask_bit(bytes.data(), bit);
    } else if (error == 1 && at >= 0) {
      indptr[at + 1] =
          static_cast<std::int32_t>(indptr[at] + tree_mask_bytes(tree_count(d, at)) - 1);
    } else if (error == 2) {
      indptr[0] = in.ConsumeBool() ? -1 : INT32_MIN;
    } else if (error == 3) {
      a.tree_mask = nullptr;
    } else if (error == 4) {
      a.tree_mask_indptr = nullptr;
    }
  }
  if (bytes.empty()) bytes.push_back(0);  // no null pointer for a mask of no bits
  bytes.shrink_to_fit();
  if (a.tree_mask != nullptr) a.tree_mask = bytes.data();
}

// int8 caches, none when the input runs out: a draw of 6 or 7 (of 0-7) turns every fp8 field
// (e4m3 or e5m2: the dtype draws above reach them, and widening their range would remap every
// existing input's dtypes) into int8, which q and out must refuse and K and V take (with the fp8
// draw's scales).
void draw_int8(FuzzedDataProvider& in, DecodeArgs& a) {
  if (in.ConsumeIntegralInRange<int>(0, 7) < 6) return;
  for (DType* t : {&a.q_dtype, &a.k_dtype, &a.v_dtype, &a.out_dtype}) {
    if (is_fp8(*t)) *t = DType::kInt8;
  }
}

// Per-token scales, none when the input runs out: kind 0-3 none, 4-5 both arrays, 6 both with one
// element invalid, 7 one array alone (K's or V's), whatever the cache (a plain one must refuse
// them). Their strides: 0-4 the default, 5 NHD, 6 the dense order with a gap of 0-3 after every
// row, kv head and block, 7 refused ones (a zero among nonzero ones, a negative one, rows that
// overlap); drawn with or without the scales (strides alone must be refused too).
void draw_token_scales(FuzzedDataProvider& in, DrawnArgs& d) {
  DecodeArgs& a = d.a;
  const int kind = in.ConsumeIntegralInRange<int>(0, 7);
  d.token_scales_kind = kind < 4 ? 0 : kind < 6 ? 1 : kind == 6 ? 2 : in.ConsumeBool() ? 3 : 4;
  d.bad_row = in.ConsumeIntegralInRange<int>(0, 4095);
  d.v_bad = in.ConsumeBool();
  const std::int64_t KV = a.num_kv_heads, BS = a.block_size;
  CacheStrides& s = a.token_scale_strides;
  switch (in.ConsumeIntegralInRange<int>(0, 7)) {
    case 5:
      s = CacheStrides::nhd(a.num_kv_heads, a.block_size, 1);
      break;
    case 6: {
      const std::int64_t pad = in.ConsumeIntegralInRange<int>(0, 3);
      s.token = 1 + pad;
      s.head = BS * s.token + pad;
      s.block = KV * s.head + pad;
      break;
    }
    case 7: {
      const CacheStrides bad[] = {{0, 1, 1}, {KV * BS, BS, -1}, {1, 1, 1}, {KV * BS, 0, 1}};
      s = bad[in.ConsumeIntegralInRange<int>(0, 3)];
      break;
    }
    default:
      break;
  }
}

}  // namespace

void draw_args(FuzzedDataProvider& in, DrawnArgs& d) {
  draw_shapes(in, d.a);
  d.null_pointer = in.ConsumeIntegralInRange<int>(0, 24);  // >= 7: every pointer set
  d.with_lse = in.ConsumeBool();
  d.single_split = in.ConsumeBool();
  draw_variants(in, d);
  d.a.q_row_stride = draw_row_stride(in, d.a, true);
  d.a.out_row_stride = draw_row_stride(in, d.a, false);
  draw_query_tokens(in, d);
  draw_fp8(in, d);
  draw_tree_mask(in, d);
  draw_int8(in, d.a);
  draw_token_scales(in, d);
}

}  // namespace pagedattn::fuzz
