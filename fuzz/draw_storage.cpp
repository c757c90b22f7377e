#include <algorithm>
#include <cmath>
#include <cstdint>

#include "draw_parts.hpp"

namespace pagedattn::fuzz {
namespace {

double log_uniform(Rng& r, double lo, double hi) {
  return std::exp(std::log(lo) + r.real() * std::log(hi / lo));
}

}  // namespace

// Row strides: a quarter of the cases get a strided q, a strided out or both. q as the query part
// of a fused QKV projection ((H + 2 KV) * D, what a serving stack hands over) or a row plus a gap;
// out as a row plus a gap, or one of two halves of a row twice as long. A gap of 0 is a stride
// that equals the dense row, given explicitly. Every row is a multiple of 16 bytes, so the gaps
// decide what the CUDA backend takes (FuzzCase::cuda_misaligned_stride): gaps it takes (whole
// 16-byte units in q, an even number of elements in out), or odd ones, which it refuses in either.
void draw_row_strides(FuzzCase& c, Rng& r, const DrawOptions& options) {
  if (!r.chance(0.25)) return;
  const testing::CaseSpec& s = c.spec;
  const std::int64_t row = static_cast<std::int64_t>(s.num_heads) * s.head_dim;
  const int which = r.uniform(0, 2);  // 0: q, 1: out, 2: both
  const bool aligned = r.chance(options.cuda ? 0.85 : 0.5);
  auto gap = [&](std::int64_t unit) -> std::int64_t {
    static const int kGaps[] = {0, 1, 2, 3, 4, 7, 8, 12, 16, 24, 64};
    const std::int64_t g = r.chance(0.7) ? r.pick(kGaps) : r.uniform(1, 256);
    return aligned ? (g + unit - 1) / unit * unit : g | 1;
  };
  if (which != 1) {
    c.q_row_stride = r.chance(0.4)
                         ? static_cast<std::int64_t>(s.num_heads + 2 * s.num_kv_heads) * s.head_dim
                         : row + gap(16 / static_cast<std::int64_t>(dtype_size(s.q_dtype)));
  }
  if (which != 0) c.out_row_stride = r.chance(0.2) ? 2 * row : row + gap(2);
}

// The cache layout: half the cases keep the default dense HND one (kv_strides 0), the others
// take one of the layouts serving engines use (testing::KvLayout), K and V copied there with NaN
// in every gap. Half the padded ones (a third when the CUDA backend runs too, so that most reach
// its kernels) widen every row's gap by kv_pad elements, which may leave the strides off the
// 16-byte multiples the CUDA backend needs.
void draw_layout(FuzzCase& c, Rng& r, const DrawOptions& options) {
  if (r.chance(0.5)) return;
  static const testing::KvLayout kOthers[] = {
      testing::KvLayout::kNhd, testing::KvLayout::kCombinedHnd, testing::KvLayout::kCombinedNhd,
      testing::KvLayout::kTokenKvNhd, testing::KvLayout::kPaddedHnd};
  c.kv_layout = r.pick(kOthers);
  if (c.kv_layout == testing::KvLayout::kPaddedHnd && r.chance(options.cuda ? 0.3 : 0.5)) {
    // 8 elements and their multiples stay 16-byte multiples for the 16-bit dtypes, 4 and 12 for
    // f32 too, and 16 alone for fp8.
    static const int kPads[] = {1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24};
    c.kv_pad = r.pick(kPads);
  }
}

// Quantized caches for 30% of the cases (or when `force`, for the malformations that need one): K
// and V in fp8_e4m3, fp8_e5m2 or int8 (a third each), q and out staying f32, f16 or bf16 as drawn.
// The codes hold the values divided by the scales (make_fast_case), so the scales are drawn where
// the codes fit the format: log-uniform over [1e-3, 1e3], narrowed so that the codes' spread (K:
// the magnitude / k_scale, V: 1 / v_scale) lies in [1/8, 32] for e4m3 (3.5 sigma stays below its
// largest finite value, 448), [1/128, 512] for e5m2 (57344) or [4, 36] for int8 (3.5 sigma stays
// below 127, and the codes keep a few bits: k_scale about 0.03-0.25 at magnitude 1); a tenth of the
// scales are drawn over the whole range, where codes saturate to the largest one or flush to
// subnormals (int8: to few codes) and zero, as a real cache's can. 30% of the cases add per-head
// scales, log-uniform over [0.5, 2] per kv head for K and V alike. A snapped case keeps exact
// logits: its K scales are powers of two (k_scale such that the codes' spread is 4 to 32, integers
// once snapped; per-head 0.5, 1 or 2).
//
// int4 (a quarter, where head_dim is a multiple of 32; else the other three) always has its group
// scales (draw_token_scales), which carry the rows' spread: its per-tensor scales are drawn as
// int8's. An odd kv_pad becomes even for it (its strides count codes, two to a byte).
void draw_quantized(FuzzCase& c, Rng& r, bool force, bool force_per_head) {
  if (!r.chance(0.3) && !force) return;
  testing::CaseSpec& s = c.spec;
  s.kv_dtype = r.pick(kQuantizedDTypes);
  if (s.kv_dtype == DType::kInt4 && s.head_dim % kInt4GroupSize != 0) {
    s.kv_dtype = kQuantizedDTypes[r.uniform(0, 2)];
  }
  if (s.kv_dtype == DType::kInt4) {
    c.kv_pad += c.kv_pad % 2;
    s.token_scales = true;  // its group scales, in the layout draw_token_scales gives them
  }
  const double lo = s.kv_dtype == DType::kFP8E4M3   ? 1.0 / 8
                    : s.kv_dtype == DType::kFP8E5M2 ? 1.0 / 128
                                                    : 4.0;
  const double hi = s.kv_dtype == DType::kFP8E4M3   ? 32.0
                    : s.kv_dtype == DType::kFP8E5M2 ? 512.0
                                                    : 36.0;
  auto scale_for = [&](double spread) {
    if (r.chance(0.1)) return static_cast<float>(log_uniform(r, 1e-3, 1e3));
    const double a = std::max(1e-3, spread / hi), b = std::min(1e3, spread / lo);
    return static_cast<float>(log_uniform(r, a, std::max(a, b)));
  };
  if (c.snap) {
    const double m = std::max(static_cast<double>(s.magnitude), 1e-3);
    const int e_lo = static_cast<int>(std::ceil(std::log2(m / 32)));
    const int e_hi = static_cast<int>(std::floor(std::log2(m / 4)));
    s.k_scale = std::ldexp(1.f, r.uniform(e_lo, std::max(e_lo, e_hi)));
  } else {
    s.k_scale = scale_for(s.magnitude);
  }
  s.v_scale = scale_for(1.0);
  c.k_scales.clear();
  c.v_scales.clear();
  if (r.chance(0.3) || force_per_head) {
    static const float kPow2[] = {0.5f, 1.f, 2.f};
    for (int kv = 0; kv < s.num_kv_heads; ++kv) {
      c.k_scales.push_back(c.snap ? r.pick(kPow2) : static_cast<float>(log_uniform(r, 0.5, 2)));
      c.v_scales.push_back(static_cast<float>(log_uniform(r, 0.5, 2)));
    }
  }
}

// Per-token scales for 40% of the quantized cases (every one when `force`, none for another
// cache): half in the default dense layout, a quarter in NHD order, a quarter padded (a gap of 0,
// the dense strides given explicitly, or 1, 2, 3, 5 or 16 elements after every row, kv head and
// block). The scales themselves come with the cache's contents (make_fast_case).
// An int4 cache always has them (its group scales).
void draw_token_scales(FuzzCase& c, Rng& r, bool force) {
  if (!c.quantized() || (!r.chance(0.4) && !force && c.spec.kv_dtype != DType::kInt4)) return;
  c.spec.token_scales = true;
  const double u = r.real();
  c.token_scale_layout = u < 0.5    ? TokenScaleLayout::kDense
                         : u < 0.75 ? TokenScaleLayout::kNhd
                                    : TokenScaleLayout::kPadded;
  static const int kPads[] = {0, 1, 2, 3, 5, 16};
  c.token_scale_pad = c.token_scale_layout == TokenScaleLayout::kPadded ? r.pick(kPads) : 0;
}

void drop_token_scales(FuzzCase& c) {
  c.spec.token_scales = false;
  c.token_scale_layout = TokenScaleLayout::kDense;
  c.token_scale_pad = 0;
}

void drop_quantized(FuzzCase& c, DType t) {
  c.spec.kv_dtype = t;
  c.spec.k_scale = c.spec.v_scale = 1.f;
  c.k_scales.clear();
  c.v_scales.clear();
  drop_token_scales(c);
}

}  // namespace pagedattn::fuzz
