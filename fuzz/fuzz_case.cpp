#include "fuzz_case.hpp"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>
#include <stdexcept>
#include <utility>
#include <vector>

#include "fast_case.hpp"
#include "pagedattn/cache_layout.hpp"
#include "pagedattn/variants.hpp"

namespace pagedattn::fuzz {
namespace {

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Small helpers over one generator; every draw goes through it, so a case is a function of the
// generator's seed alone.
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : g_(seed) {}
  std::uint64_t next() { return g_(); }
  int uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(g_); }
  double real() { return std::uniform_real_distribution<double>(0.0, 1.0)(g_); }
  bool chance(double p) { return real() < p; }
  template <class T, std::size_t N>
  T pick(const T (&values)[N]) {
    return values[static_cast<std::size_t>(uniform(0, static_cast<int>(N) - 1))];
  }

 private:
  std::mt19937_64 g_;
};

const char* const kMalformationNames[] = {"none",
                                          "id-out-of-range",
                                          "context-over-capacity",
                                          "negative-context",
                                          "head-ratio",
                                          "group-too-large",
                                          "null-pointer",
                                          "head-dim",
                                          "block-size",
                                          "table-stride",
                                          "dtype-mismatch",
                                          "bad-dtype",
                                          "nonfinite-scale",
                                          "negative-batch",
                                          "window-left",
                                          "soft-cap",
                                          "nonfinite-slope",
                                          "bad-sink",
                                          "row-stride",
                                          "q-indptr-start",
                                          "q-indptr-decreasing",
                                          "q-len-over-max",
                                          "q-indptr-end",
                                          "max-q-len",
                                          "q-tokens-without-indptr",
                                          "kv-strides",
                                          "fp8-value-dtype",
                                          "bad-kv-scale",
                                          "scale-on-plain-cache",
                                          "bad-kv-head-scale"};
static_assert(sizeof(kMalformationNames) / sizeof(kMalformationNames[0]) ==
              static_cast<std::size_t>(Malformation::kCount));

const DType kDTypes[] = {DType::kF32, DType::kF16, DType::kBF16};
const DType kFp8DTypes[] = {DType::kFP8E4M3, DType::kFP8E5M2};

int draw_context(Rng& r, int bs, bool long_tail) {
  switch (r.uniform(0, 8)) {
    case 0:
      return 0;
    case 1:
      return 1;
    case 2:
      return std::max(bs - 1, 1);
    case 3:
      return bs;
    case 4:
      return bs + 1;
    case 5:
      return r.uniform(2, 4) * bs + r.uniform(-1, 1);
    case 6:
      return r.uniform(1, 4 * bs);
    default: {
      // Long tail: log-uniform up to a few thousand tokens.
      const double top = long_tail ? std::log(3000.0) : std::log(300.0);
      return static_cast<int>(std::exp(r.real() * top));
    }
  }
}

// Cache elements (per K or V tensor) the case allocates: used blocks plus spare ones.
std::int64_t pool_elements(const testing::CaseSpec& s) {
  std::int64_t blocks = s.spare_blocks;
  for (int i = 0; i < s.batch && i < static_cast<int>(s.context_lens.size()); ++i) {
    blocks += blocks_for(s.context_lens[i], s.block_size);
  }
  return blocks * s.num_kv_heads * s.block_size * s.head_dim;
}

void fit_budget(testing::CaseSpec& s, std::int64_t budget) {
  // Query/output rows: bounded too, by trimming the batch.
  while (s.batch > 1 &&
         static_cast<std::int64_t>(s.batch) * s.num_heads * s.head_dim > (std::int64_t{1} << 18)) {
    --s.batch;
  }
  s.context_lens.resize(s.batch);
  // A single block of every kv head must fit a few times over, or every context would vanish.
  const std::int64_t per_block =
      static_cast<std::int64_t>(s.num_kv_heads) * s.block_size * s.head_dim;
  budget = std::max(budget, 4 * per_block);
  // Over budget: trim spare blocks, then long batches, then the longest context (boundary-valued
  // short contexts survive the halving).
  while (pool_elements(s) > budget) {
    if (s.spare_blocks * per_block > budget / 4) {
      s.spare_blocks /= 2;
      continue;
    }
    if (s.batch > 8) {
      s.context_lens.resize(--s.batch);
      continue;
    }
    auto it = std::max_element(s.context_lens.begin(), s.context_lens.end());
    if (it == s.context_lens.end() || *it == 0) break;
    *it /= 2;
  }
}

float snapped(float x) { return std::max(-127.f, std::min(127.f, std::nearbyint(x))); }

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kMaxFloat = std::numeric_limits<float>::max();

int longest_context(const testing::CaseSpec& s) {
  int m = 0;
  for (int L : s.context_lens) m = std::max(m, L);
  return m;
}

// A context length of the case to measure a window against: a random non-empty one.
int some_context(Rng& r, const testing::CaseSpec& s) {
  std::vector<int> lens;
  for (int L : s.context_lens) {
    if (L > 0) lens.push_back(L);
  }
  if (lens.empty()) return 0;
  return lens[static_cast<std::size_t>(r.uniform(0, static_cast<int>(lens.size()) - 1))];
}

// window_left, aimed at the edges: none of the past (0), one token, a block's worth +-1, the
// window's first token on a block boundary of some sequence (+-1), just the whole context, longer
// than every context (the window changes nothing but the path), or anywhere.
int draw_window(Rng& r, const testing::CaseSpec& s) {
  const int BS = std::max(s.block_size, 1), longest = longest_context(s);
  switch (r.uniform(0, 8)) {
    case 0:
      return 0;
    case 1:
      return 1;
    case 2:
      return BS - 1 + r.uniform(0, 2);
    case 3:
      return r.uniform(2, 8) * BS + r.uniform(-1, 1);
    case 4: {
      const int L = some_context(r, s);
      if (L == 0) return r.uniform(0, BS);
      const int k = r.uniform(0, (L - 1) / BS);
      return std::max(L - 1 - k * BS + r.uniform(-1, 1), 0);
    }
    case 5:
      return std::max(longest - 1 + r.uniform(-1, 1), 0);
    case 6:
      return r.chance(0.8) ? longest + r.uniform(0, 1000) : INT32_MAX - r.uniform(0, 1);
    default:
      return r.uniform(0, std::max(longest, 1));
  }
}

// The ALiBi paper's slopes for H heads (BLOOM's form for an H that is not a power of two: the
// slopes of the power of two below, then every other slope of the one above).
std::vector<float> standard_slopes(int H) {
  if (H <= 0) return {};
  int p = 1;
  while (p * 2 <= H) p *= 2;
  std::vector<float> slopes;
  for (int h = 0; h < p; ++h) slopes.push_back(std::exp2(-8.f * (h + 1) / p));
  for (int h = 0; static_cast<int>(slopes.size()) < H; ++h) {
    slopes.push_back(std::exp2(-8.f * (2 * h + 1) / (2 * p)));
  }
  return slopes;
}

std::vector<float> draw_slopes(Rng& r, int H) {
  std::vector<float> slopes(static_cast<std::size_t>(std::max(H, 0)));
  switch (r.uniform(0, 5)) {
    case 0:
    case 1:
      return standard_slopes(H);
    case 2:  // uniform in [0, 1]
      for (float& x : slopes) x = static_cast<float>(r.real());
      break;
    case 3:  // log-uniform over [1e-4, 4], either sign (a negative slope favours old tokens)
      for (float& x : slopes) {
        x = static_cast<float>(std::exp(std::log(1e-4) + r.real() * std::log(4e4)));
        if (r.chance(0.3)) x = -x;
      }
      break;
    case 4: {  // the standard ones scaled, some heads without a bias
      const float f = static_cast<float>(std::exp2(r.uniform(-4, 3)));
      slopes = standard_slopes(H);
      for (float& x : slopes) x = r.chance(0.2) ? 0.f : x * f;
      break;
    }
    default: {  // one steep head among gentle ones
      for (float& x : slopes) x = static_cast<float>(0.01 * r.real());
      if (H > 0) {
        slopes[static_cast<std::size_t>(r.uniform(0, H - 1))] = r.chance(0.5) ? 16.f : -2.f;
      }
      break;
    }
  }
  return slopes;
}

// Sinks around the scale where they matter (log of the attended tokens, what lse is for logits
// near 0), no sink (-inf), large ones that swallow the softmax, and the largest the library
// accepts (kMaxVariantMagnitude).
float draw_sink(Rng& r, double center) {
  const double u = r.real();
  if (u < 0.55) return static_cast<float>(center + 8 * (r.real() - 0.5));
  if (u < 0.7) return -kInf;
  if (u < 0.85) {
    static const float kLarge[] = {20.f, 50.f, 100.f, 1e4f, -50.f, -1e4f};
    return r.pick(kLarge);
  }
  if (u < 0.98) return static_cast<float>(20 * (r.real() - 0.5));
  static const float kExtreme[] = {1e19f, -1e19f, kMaxVariantMagnitude, -kMaxVariantMagnitude};
  return r.pick(kExtreme);
}

std::vector<float> draw_sinks(Rng& r, const testing::CaseSpec& s) {
  const double center = std::log1p(static_cast<double>(some_context(r, s)));
  std::vector<float> sinks(static_cast<std::size_t>(std::max(s.num_heads, 0)));
  if (r.chance(0.3)) {  // one value for every head
    std::fill(sinks.begin(), sinks.end(), draw_sink(r, center));
  } else {  // each head its own, -inf (no sink) among them
    for (float& v : sinks) v = draw_sink(r, center);
  }
  return sinks;
}

// The attention variants of a case, from their own generator: every other draw of the case is
// the same as without them. The soft-cap raises the magnitude so the logits reach the cap.
void draw_variants(FuzzCase& c, Rng& r) {
  testing::CaseSpec& s = c.spec;
  const bool all = r.chance(0.04);  // every variant at once
  if (all || r.chance(0.25)) c.window_left = draw_window(r, s);
  if (all || r.chance(0.2)) {
    static const float kCaps[] = {1.f, 2.f, 5.f, 10.f, 20.f, 30.f, 50.f, 60.f};
    c.soft_cap = r.chance(0.6) ? r.pick(kCaps) : static_cast<float>(1 + 59 * r.real());
    // Logits ~ N(0, (magnitude^2 * scale * sqrt(D))^2): aim their spread at a multiple of the
    // cap, from mostly inside it to deep in its saturation. Half the huge cases keep theirs.
    if (!c.huge() || r.chance(0.5)) {
      static const double kReach[] = {0.5, 1, 2, 4, 10};
      const double D = s.head_dim;
      const double scale = c.scale != 0.f ? c.scale : 1 / std::sqrt(D);
      const double m = std::sqrt(c.soft_cap * r.pick(kReach) / (scale * std::sqrt(D)));
      s.magnitude = static_cast<float>(std::min(50.0, std::max(0.25, m)));
    }
  }
  if (all || r.chance(0.2)) c.alibi_slopes = draw_slopes(r, s.num_heads);
  if (all || r.chance(0.2)) c.sinks = draw_sinks(r, s);
}

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

double log_uniform(Rng& r, double lo, double hi) {
  return std::exp(std::log(lo) + r.real() * std::log(hi / lo));
}

// fp8 caches for a fifth of the cases (or when `force`, for the malformations that need one): K
// and V in e4m3 or e5m2, q and out staying f32, f16 or bf16 as drawn. The codes hold the values
// divided by the scales (make_fast_case), so the scales are drawn where the codes fit the format:
// log-uniform over [1e-3, 1e3], narrowed so that the codes' spread (K: the magnitude / k_scale,
// V: 1 / v_scale) lies in [1/8, 32] for e4m3 (3.5 sigma stays below its largest finite value,
// 448) or [1/128, 512] for e5m2 (57344); a tenth of the scales are drawn over the whole range,
// where codes saturate to the largest finite value or flush to subnormals and zero, as a real
// cache's can. 30% of the cases add per-head scales, log-uniform over [0.5, 2] per kv head for K
// and V alike. A snapped case keeps exact logits: its K scales are powers of two (k_scale such
// that the codes' spread is 4 to 32, integers once snapped; per-head 0.5, 1 or 2).
void draw_fp8(FuzzCase& c, Rng& r, bool force = false, bool force_per_head = false) {
  if (!r.chance(0.2) && !force) return;
  testing::CaseSpec& s = c.spec;
  s.kv_dtype = r.pick(kFp8DTypes);
  const bool e4m3 = s.kv_dtype == DType::kFP8E4M3;
  const double lo = e4m3 ? 1.0 / 8 : 1.0 / 128, hi = e4m3 ? 32.0 : 512.0;
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

// Back to a cache of `t` (not fp8), without scales.
void drop_fp8(FuzzCase& c, DType t) {
  c.spec.kv_dtype = t;
  c.spec.k_scale = c.spec.v_scale = 1.f;
  c.k_scales.clear();
  c.v_scales.clear();
}

// The field require_cache_strides names for strides whose rows overlap, or null, by the rule it
// documents: with the dimensions in increasing stride (token, kv head, block among equal ones),
// each dimension of more than one entry must start at or past the extent of those before it, a
// row being head_dim elements.
const char* overlapping_stride(const CacheStrides& s, int num_blocks, int num_kv_heads,
                               int block_size, int head_dim) {
  struct Dim {
    const char* name;
    std::int64_t stride;
    int size;
  };
  Dim dims[] = {{"kv_strides.token", s.token, block_size},
                {"kv_strides.head", s.head, num_kv_heads},
                {"kv_strides.block", s.block, num_blocks}};
  std::stable_sort(std::begin(dims), std::end(dims),
                   [](const Dim& x, const Dim& y) { return x.stride < y.stride; });
  std::int64_t extent = head_dim;
  for (const Dim& d : dims) {
    if (d.size <= 1) continue;
    if (d.stride < extent) return d.name;
    extent += d.stride * (d.size - 1);
  }
  return nullptr;
}

// The kv_strides field the CUDA backend refuses among `l`'s strides, or null (every stride a
// multiple of 16 bytes).
const char* misaligned_kv(const CacheLayout& l, DType kv_dtype) {
  const std::int64_t elem = static_cast<std::int64_t>(dtype_size(kv_dtype));
  if (l.block_stride * elem % 16 != 0) return "kv_strides.block";
  if (l.head_stride * elem % 16 != 0) return "kv_strides.head";
  if (l.token_stride * elem % 16 != 0) return "kv_strides.token";
  return nullptr;
}

// One sequence's query tokens: mostly 1-8, sometimes 0 (a sequence with nothing to decode this
// step) or 9-16, occasionally up to 40.
int draw_query_count(Rng& r) {
  const double u = r.real();
  if (u < 0.08) return 0;
  if (u < 0.45) return r.uniform(1, 4);
  if (u < 0.72) return r.uniform(5, 8);
  if (u < 0.94) return r.uniform(9, 16);
  return r.uniform(17, 40);
}

// What a multi-token case costs, in tokens (times kv heads and head_dim): each sequence's context
// in the pool, and every query token's context in the reference and the backend, each query
// token a query of its own context.
std::int64_t query_work(const testing::CaseSpec& s, const std::vector<int>& q_lens) {
  std::int64_t work = 0;
  for (int b = 0; b < s.batch; ++b) {
    const std::int64_t n = q_lens[static_cast<std::size_t>(b)];
    const std::int64_t L = std::max(s.context_lens[static_cast<std::size_t>(b)], 0);
    work += L;
    // The query tokens' contexts, L - n + 1 .. L, those below 1 attending to nothing.
    const std::int64_t lo = std::max<std::int64_t>(L - n + 1, 1);
    if (lo <= L) work += (lo + L) * (L - lo + 1) / 2;
  }
  return work;
}

// Multi-token queries for a quarter of the cases (speculative decoding's drafts, chunked
// prefill): per-sequence counts, one for every sequence in a third of them (a fixed draft
// length), and a max_q_len at or a little above the largest. The drawn context is mostly the
// context before the new tokens, which are appended to it (their keys and values are in the cache
// when decode runs), else kept as drawn, then shorter than the count now and then (queries at
// positions below 0, which attend to nothing); a few sequences get every token new, or more. The
// rows stay within the q/out bound and the work (query_work) within `work_budget` elements, by
// halving the longest context (down to its count) or the largest count. From a generator of its
// own, and before the variants, so a window is drawn against the final contexts.
void draw_query_lens(FuzzCase& c, Rng& r, std::int64_t work_budget, bool force = false) {
  if (!force && !r.chance(0.25)) return;
  testing::CaseSpec& s = c.spec;
  c.q_lens.assign(static_cast<std::size_t>(std::max(s.batch, 0)), 0);
  const bool same = r.chance(0.3);
  const int fixed = std::max(draw_query_count(r), 1);
  for (int b = 0; b < s.batch; ++b) {
    int& n = c.q_lens[static_cast<std::size_t>(b)];
    int& L = s.context_lens[static_cast<std::size_t>(b)];
    n = same ? fixed : draw_query_count(r);
    const double u = r.real();
    if (u < 0.6 || (u < 0.85 && L < n)) {
      L += n;  // the drawn context precedes the new tokens
    } else if (u >= 0.85 && u < 0.9 && L <= 40) {
      n = L + r.uniform(0, 3);  // every token new, or queries before the context
    }
  }
  const std::int64_t row = static_cast<std::int64_t>(s.num_heads) * s.head_dim;
  const std::int64_t per_token = static_cast<std::int64_t>(s.num_kv_heads) * s.head_dim;
  for (;;) {
    const std::int64_t rows = std::accumulate(c.q_lens.begin(), c.q_lens.end(), std::int64_t{0});
    const bool rows_over = rows * row > (std::int64_t{1} << 18);
    if (!rows_over && query_work(s, c.q_lens) * per_token <= work_budget) break;
    // The sequence with the most work (the most rows when the rows are over).
    int worst = -1;
    std::int64_t most = -1;
    for (int b = 0; b < s.batch; ++b) {
      const std::int64_t n = c.q_lens[static_cast<std::size_t>(b)];
      const std::int64_t L = std::max(s.context_lens[static_cast<std::size_t>(b)], 0);
      const std::int64_t w = rows_over ? n : (n + 1) * L + n;
      if (w > most) most = w, worst = b;
    }
    if (worst < 0) break;
    int& n = c.q_lens[static_cast<std::size_t>(worst)];
    int& L = s.context_lens[static_cast<std::size_t>(worst)];
    if (!rows_over && L > 4 * n) {
      L = std::max(L / 2, n);
    } else if (n > 1) {
      n /= 2;
    } else if (!rows_over && L > 0) {
      L /= 2;
    } else {
      break;  // nothing left to trim
    }
  }
  const int longest = c.q_lens.empty() ? 0 : *std::max_element(c.q_lens.begin(), c.q_lens.end());
  c.max_q_len = std::max(longest, 1);
  if (r.chance(0.3)) c.max_q_len += r.chance(0.9) ? r.uniform(1, 8) : r.uniform(9, 64);
}

// A case's per-head values for n heads: its own, repeated when n is larger.
std::vector<float> per_head(const std::vector<float>& values, int n) {
  std::vector<float> out(values);
  if (values.empty()) return out;
  out.resize(static_cast<std::size_t>(std::max(n, static_cast<int>(values.size()))));
  for (std::size_t i = values.size(); i < out.size(); ++i) out[i] = values[i % values.size()];
  return out;
}

}  // namespace

const char* malformation_name(Malformation m) {
  const int i = static_cast<int>(m);
  return i >= 0 && i < static_cast<int>(Malformation::kCount) ? kMalformationNames[i] : "unknown";
}

bool keeps_buffer_sizes(Malformation m) {
  return m == Malformation::kNone || m == Malformation::kIdOutOfRange ||
         m == Malformation::kContextOverCapacity || m == Malformation::kNegativeContext ||
         m == Malformation::kWindowLeft || m == Malformation::kSoftCap ||
         m == Malformation::kNonFiniteSlope || m == Malformation::kBadSink ||
         m == Malformation::kRowStride || m == Malformation::kQIndptrStart ||
         m == Malformation::kQIndptrDecreasing || m == Malformation::kQLenOverMax ||
         m == Malformation::kQIndptrEnd || m == Malformation::kKvStrides ||
         m == Malformation::kBadKvScale || m == Malformation::kScaleOnPlainCache ||
         m == Malformation::kBadKvHeadScale;
}

namespace {

// The stride field the CUDA backend refuses for `rows` rows (FuzzCase::cuda_misaligned_stride).
const char* misaligned_stride(int rows, std::int64_t row, std::int64_t q_stride, DType q_dtype,
                              std::int64_t out_stride) {
  if (rows < 2) return nullptr;  // the stride of a single row is never used
  const std::int64_t q_bytes =
      (q_stride ? q_stride : row) * static_cast<std::int64_t>(dtype_size(q_dtype));
  if (q_bytes % 16 != 0) return "q_row_stride";
  if ((out_stride ? out_stride : row) % 2 != 0) return "out_row_stride";
  return nullptr;
}

}  // namespace

int FuzzCase::q_rows() const {
  return multi_token() ? std::accumulate(q_lens.begin(), q_lens.end(), 0) : spec.batch;
}

const char* FuzzCase::cuda_misaligned_stride() const {
  return misaligned_stride(q_rows(), static_cast<std::int64_t>(spec.num_heads) * spec.head_dim,
                           q_row_stride, spec.q_dtype, out_row_stride);
}

testing::KvGeometry FuzzCase::kv_geometry(int num_blocks) const {
  const int KV = spec.num_kv_heads, BS = spec.block_size, D = spec.head_dim;
  testing::KvGeometry g = testing::kv_geometry(kv_layout, num_blocks, KV, BS, D);
  if (kv_pad != 0) {
    // The layout's gaps after each kv head and each block kept, each row's widened.
    const std::int64_t head_gap = g.strides.head - BS * g.strides.token;
    const std::int64_t block_gap = g.strides.block - KV * g.strides.head;
    g.strides.token += kv_pad;
    g.strides.head = BS * g.strides.token + head_gap;
    g.strides.block = KV * g.strides.head + block_gap;
    g.elements =
        num_blocks == 0
            ? 0
            : CacheLayout::with_strides(num_blocks, KV, BS, D, g.strides).elements() + g.v_offset;
  }
  return g;
}

const char* FuzzCase::cuda_misaligned_kv() const {
  if (default_layout()) return nullptr;
  const CacheLayout l = CacheLayout::with_strides(1, spec.num_kv_heads, spec.block_size,
                                                  spec.head_dim, kv_geometry(1).strides);
  return misaligned_kv(l, spec.kv_dtype);
}

DecodeArgs BuiltCase::dense_args() const {
  DecodeArgs a = args;
  if (laid_out()) {
    a.k_cache = host.k.data();
    a.v_cache = host.v.data();
    a.kv_strides = CacheStrides{};
  }
  return a;
}

void BuiltCase::poison_outputs() {
  host.poison_outputs();
  if (out_rows.empty()) return;
  const std::size_t osz = dtype_size(host.spec.out_dtype);
  const std::size_t row_bytes =
      static_cast<std::size_t>(host.spec.num_heads) * host.spec.head_dim * osz;
  std::fill(out_rows.begin(), out_rows.end(), kOutGapByte);
  for (int r = 0; r < rows; ++r) {
    std::fill_n(out_rows.begin() + static_cast<std::ptrdiff_t>(r * out_stride * osz), row_bytes,
                std::uint8_t{0xff});
  }
}

FuzzCase draw_case(std::uint64_t seed, std::uint64_t index, const DrawOptions& options) {
  Rng r(splitmix64(splitmix64(seed) ^ (index * 0xd1342543de82ef95ull + 1)));
  FuzzCase c;
  c.origin_seed = seed;
  c.origin_index = index;
  testing::CaseSpec& s = c.spec;
  s.seed = r.next();

  s.head_dim = r.pick(kSupportedHeadDims);
  static const int kBlockSizes[] = {1,  2,  3,  5,  7,   8,   13,  15,  16,  17,  31,
                                    32, 33, 63, 64, 100, 127, 128, 129, 200, 255, 256};
  s.block_size = r.chance(0.7) ? r.pick(kBlockSizes) : r.uniform(1, kMaxBlockSize);

  // Group size from 1 to all heads on one kv head.
  int group;
  const double gu = r.real();
  if (gu < 0.25) {
    group = 1;
  } else if (gu < 0.55) {
    static const int kPow2[] = {2, 4, 8};
    group = r.pick(kPow2);
  } else if (gu < 0.75) {
    static const int kOdd[] = {3, 5, 6, 7};
    group = r.pick(kOdd);
  } else if (gu < 0.92) {
    group = r.uniform(1, kMaxGroupSize);
  } else {
    static const int kLarge[] = {16, 32, kMaxGroupSize};
    group = r.pick(kLarge);
  }
  static const int kKvHeads[] = {1, 1, 2, 2, 3, 4, 8};
  int kv = r.pick(kKvHeads);
  while (kv > 1 && kv * s.block_size * s.head_dim > (1 << 17)) --kv;
  s.num_kv_heads = kv;
  s.num_heads = kv * group;

  const bool long_ctx = r.chance(0.3);
  const double bu = r.real();
  s.batch = bu < 0.03  ? 0
            : bu < 0.5 ? r.uniform(1, 4)
            : bu < 0.8 ? r.uniform(5, 16)
                       : r.uniform(17, 64);
  s.context_lens.resize(s.batch);
  for (int& L : s.context_lens) L = draw_context(r, s.block_size, long_ctx);
  if (long_ctx && s.batch > 0) {
    // At least one context long enough for the planner to split it (splits cover >= 256 tokens).
    s.context_lens[r.uniform(0, s.batch - 1)] = r.uniform(300, 1500);
  }

  s.spare_blocks = r.chance(0.8) ? r.uniform(0, 6) : r.uniform(7, 40);
  s.table_padding = r.chance(0.5) ? 0 : r.uniform(1, 4);
  s.table_stride_extra = r.chance(0.4) ? r.uniform(1, 5) : 0;
  s.fragmented = r.chance(0.85);
  s.share_prefix = r.chance(0.35);
  s.poison = r.chance(0.95);
  s.q_dtype = r.pick(kDTypes);
  s.kv_dtype = r.pick(kDTypes);
  s.out_dtype = r.pick(kDTypes);

  const bool huge = r.chance(0.15);
  if (huge) {
    static const float kHuge[] = {5.f, 15.f, 50.f};  // logits ~ magnitude^2, up to ~1e4
    s.magnitude = r.pick(kHuge);
  } else {
    static const float kNormal[] = {0.25f, 1.f, 1.f, 2.f};
    s.magnitude = r.pick(kNormal);
  }
  c.snap = r.chance(huge ? 0.5 : 0.1);
  if (c.snap) {
    c.scale = std::ldexp(1.f, -static_cast<int>(std::lround(std::log2(std::sqrt(s.head_dim)))));
  } else if (r.chance(0.1)) {
    c.scale = static_cast<float>(0.01 + 0.5 * r.real());
  }
  static const int kThreads[] = {1, 1, 2, 2, 3, 4};
  c.threads = r.pick(kThreads);

  // Bound the cost: most cases small, some medium, long ones bigger.
  std::int64_t budget = long_ctx ? (1 << 18) : r.chance(0.8) ? (1 << 14) : (1 << 16);
  fit_budget(s, budget);

  // A table row exactly full: the longest context fills max_blocks_per_seq * block_size.
  if (s.batch > 0 && r.chance(0.2)) {
    auto it = std::max_element(s.context_lens.begin(), s.context_lens.end());
    if (*it > 0) {
      s.table_padding = 0;
      *it = blocks_for(*it, s.block_size) * s.block_size;
    }
  }

  // Multi-token queries from a generator of their own too, before the variants (which are drawn
  // against the contexts they change); a case without them keeps every other draw.
  Rng queries(
      splitmix64(splitmix64(seed ^ 0x3c6ef372fe94f82bull) ^ (index * 0x9e3779b97f4a7c15ull + 7)));
  // Twice what a case of one query token per sequence may read (its pool: at least 4 blocks).
  const std::int64_t work_budget =
      2 *
      std::max(budget, 4 * static_cast<std::int64_t>(s.num_kv_heads) * s.block_size * s.head_dim);
  draw_query_lens(c, queries, work_budget);
  Rng variants(
      splitmix64(splitmix64(seed ^ 0x6a09e667f3bcc909ull) ^ (index * 0x9e3779b97f4a7c15ull + 3)));
  draw_variants(c, variants);
  // The strides too come from a generator of their own: every other draw stays as it was.
  Rng strides(
      splitmix64(splitmix64(seed ^ 0xbb67ae8584caa73bull) ^ (index * 0x9e3779b97f4a7c15ull + 5)));
  draw_row_strides(c, strides, options);
  // And the cache layout.
  Rng layouts(
      splitmix64(splitmix64(seed ^ 0xa54ff53a5f1d36f1ull) ^ (index * 0x9e3779b97f4a7c15ull + 9)));
  draw_layout(c, layouts, options);
  // And the fp8 caches, after the variants: a soft-cap sets the magnitude the scales aim at.
  Rng fp8(
      splitmix64(splitmix64(seed ^ 0x510e527fade682d1ull) ^ (index * 0x9e3779b97f4a7c15ull + 11)));
  draw_fp8(c, fp8);

  if (r.chance(0.12)) {
    const int kinds = static_cast<int>(Malformation::kCount) - 1;
    Malformation m = static_cast<Malformation>(1 + r.uniform(0, kinds - 1));
    if (options.table_malformations_only && !keeps_buffer_sizes(m)) {
      static const Malformation kTable[] = {Malformation::kIdOutOfRange,
                                            Malformation::kContextOverCapacity,
                                            Malformation::kNegativeContext};
      m = r.pick(kTable);
    }
    c.bad = m;
    c.bad_param = r.next();
    // Make it applicable: a sequence to corrupt, a context with blocks, a table of >= 2 entries,
    // query tokens to miscount.
    if (s.batch == 0) {
      s.batch = 1;
      s.context_lens = {1};
      if (c.multi_token()) c.q_lens = {1};
    }
    if (m == Malformation::kIdOutOfRange &&
        std::all_of(s.context_lens.begin(), s.context_lens.end(), [](int L) { return L == 0; })) {
      s.context_lens[0] = 1;
    }
    const bool needs_queries = m == Malformation::kQIndptrStart ||
                               m == Malformation::kQIndptrDecreasing ||
                               m == Malformation::kQLenOverMax || m == Malformation::kQIndptrEnd ||
                               m == Malformation::kMaxQLen;
    if (needs_queries && !c.multi_token()) draw_query_lens(c, queries, work_budget, true);
    if (m == Malformation::kIdOutOfRange && c.multi_token()) {
      // A read entry needs a sequence with a context and a query token.
      bool read = false;
      for (int b = 0; b < s.batch; ++b) read |= s.context_lens[b] > 0 && c.q_lens[b] > 0;
      if (!read) {
        s.context_lens[0] = std::max(s.context_lens[0], 1);
        c.q_lens[0] = std::max(c.q_lens[0], 1);
        c.max_q_len = std::max(c.max_q_len, c.q_lens[0]);
      }
    }
    if (m == Malformation::kTableStride) s.table_padding = std::max(s.table_padding, 2);
    if (m == Malformation::kNonFiniteSlope && c.alibi_slopes.empty()) {
      c.alibi_slopes = draw_slopes(variants, s.num_heads);
    }
    if (m == Malformation::kBadSink && c.sinks.empty()) c.sinks = draw_sinks(variants, s);
    // A bad scale needs an fp8 cache (a bad per-head one its per-head scales); a scale on a
    // cache that takes none, a plain cache.
    if ((m == Malformation::kBadKvScale && !c.fp8()) ||
        (m == Malformation::kBadKvHeadScale && (!c.fp8() || c.k_scales.empty()))) {
      draw_fp8(c, fp8, true, m == Malformation::kBadKvHeadScale);
    }
    if (m == Malformation::kScaleOnPlainCache && c.fp8()) drop_fp8(c, fp8.pick(kDTypes));
  }
  return c;
}

std::int64_t kv_elements(const FuzzCase& c) { return pool_elements(c.spec); }

BuiltCase build_case(const FuzzCase& c) {
  BuiltCase b;
  testing::CaseSpec spec = c.spec;
  spec.context_lens.resize(std::max(spec.batch, 0));
  // An empty pool or an empty table row gives a null data() pointer, which the API rejects for
  // any batch > 0 (even when every context is empty): keep one block and one table entry.
  int used_blocks = 0;
  for (int L : spec.context_lens) used_blocks += blocks_for(std::max(L, 0), spec.block_size);
  if (used_blocks == 0) {
    spec.spare_blocks = std::max(spec.spare_blocks, 1);
    if (spec.table_padding + spec.table_stride_extra == 0) spec.table_padding = 1;
  }
  // Multi-token queries: a count per sequence, none negative nor above max_q_len (a shrink step
  // or a hand-written case that breaks this is not a case; bad counts are malformations).
  if (c.multi_token()) {
    if (static_cast<int>(c.q_lens.size()) != std::max(spec.batch, 0) ||
        std::any_of(c.q_lens.begin(), c.q_lens.end(),
                    [&](int n) { return n < 0 || n > c.max_q_len; }) ||
        std::accumulate(c.q_lens.begin(), c.q_lens.end(), 0.0) > 1e5) {
      throw std::invalid_argument(
          "q_lens must list batch counts in [0, max_q_len = " + std::to_string(c.max_q_len) + "]");
    }
  } else if (!c.q_lens.empty()) {
    throw std::invalid_argument("q_lens without max_q_len");
  }
  // Scales belong to fp8 caches, one per kv head where given (bad ones are malformations, planted
  // in the arguments).
  if (!is_fp8(spec.kv_dtype) &&
      (spec.k_scale != 1.f || spec.v_scale != 1.f || c.per_head_scales())) {
    throw std::invalid_argument("k_scale, v_scale, k_scales and v_scales need an fp8 cache");
  }
  for (const std::vector<float>* values : {&c.k_scales, &c.v_scales}) {
    if (!values->empty() && static_cast<int>(values->size()) != spec.num_kv_heads) {
      throw std::invalid_argument("per-head scales must list num_kv_heads values");
    }
  }
  b.host = make_fast_case(spec, c.window_left, c.q_lens, c.k_scales, c.v_scales);
  testing::HostCase& h = b.host;
  // Each row's sequence and the context it attends as a query.
  const int B = spec.batch;
  if (c.multi_token()) {
    b.q_indptr.assign(static_cast<std::size_t>(std::max(B, 0)) + 1, 0);
    for (int s = 0; s < B; ++s) {
      const int n = c.q_lens[s];
      b.q_indptr[s + 1] = b.q_indptr[s] + n;
      for (int i = 0; i < n; ++i) {
        b.row_seq.push_back(s);
        b.row_lens.push_back(std::max(0, h.context_lens[s] - n + i + 1));
      }
    }
  } else {
    for (int s = 0; s < B; ++s) {
      b.row_seq.push_back(s);
      b.row_lens.push_back(h.context_lens[s]);
    }
  }
  b.rows = static_cast<int>(b.row_seq.size());
  if (c.snap) {
    // Integers in [-127, 127] are exact in every dtype and their products sum exactly in f32
    // (|sum| <= 256 * 127^2 < 2^24); times a power-of-two scale, each logit is exact.
    for (std::size_t i = 0; i < h.q.size() / dtype_size(spec.q_dtype); ++i) {
      store_from_float(h.q.data(), spec.q_dtype, i,
                       snapped(load_as_float(h.q.data(), spec.q_dtype, i)));
    }
    for (std::size_t i = 0; i < h.k.size() / dtype_size(spec.kv_dtype); ++i) {
      const float x = load_as_float(h.k.data(), spec.kv_dtype, i);
      if (std::isfinite(x)) store_from_float(h.k.data(), spec.kv_dtype, i, snapped(x));
    }
  }
  DecodeArgs& a = b.args;
  a = h.args();
  // K and V in the case's layout, copied from the dense (and snapped) ones; before any
  // malformation, which may leave the dtype that sizes V's offset in a shared buffer invalid.
  if (!c.default_layout()) {
    if (c.kv_pad < 0 || (c.kv_pad > 0 && c.kv_layout != testing::KvLayout::kPaddedHnd) ||
        c.kv_pad > 4096) {
      throw std::invalid_argument("kv_pad " + std::to_string(c.kv_pad) +
                                  " needs the padded_hnd layout and a value in [0, 4096]");
    }
    b.kv = c.kv_pad == 0 ? testing::store_kv(h, c.kv_layout)
                         : testing::store_kv(h, c.kv_layout, c.kv_geometry(h.num_blocks));
    b.kv.apply(a, b.kv.k.data(), b.kv.v.data());
  }
  if (c.scale != 0.f) a.scale = c.scale;
  a.window_left = c.window_left;
  a.logits_soft_cap = c.soft_cap;
  if (c.multi_token()) {
    a.q_indptr = b.q_indptr.data();
    a.num_q_tokens = b.rows;
    a.max_q_len = c.max_q_len;
  }
  b.alibi_slopes = per_head(c.alibi_slopes, spec.num_heads);
  b.sinks = per_head(c.sinks, spec.num_heads);
  b.k_scales = c.k_scales;
  b.v_scales = c.v_scales;

  const std::uint64_t p = c.bad_param;
  auto not_applicable = [&] {
    throw std::invalid_argument(std::string("malformation ") + malformation_name(c.bad) +
                                " does not apply to this case");
  };

  // Strided q and out: the dense rows copied into rows of the stride, gaps after each.
  const std::int64_t row = static_cast<std::int64_t>(spec.num_heads) * spec.head_dim;
  const std::pair<const char*, std::int64_t> strides[] = {{"q_row_stride", c.q_row_stride},
                                                          {"out_row_stride", c.out_row_stride}};
  for (const auto& [name, stride] : strides) {
    // A stride the library would refuse is a malformation's business, and a shrink step that
    // made one is simply not a candidate; the bound keeps a hand-written case in memory.
    if (stride < 0 || (stride > 0 && stride < row) ||
        (stride > 0 && static_cast<double>(stride) * std::max(b.rows, 1) > 1e8)) {
      throw std::invalid_argument(std::string(name) + " " + std::to_string(stride) +
                                  " is not a valid stride for this case's rows of " +
                                  std::to_string(row) + " elements");
    }
  }
  // The buffers' rows: with multi-token queries at least one (make_fast_case), even when no
  // sequence has a query token.
  const int buffer_rows = c.multi_token() && B > 0 ? std::max(b.rows, 1) : b.rows;
  b.q_stride = c.q_row_stride ? c.q_row_stride : row;
  b.out_stride = c.out_row_stride ? c.out_row_stride : row;
  if (c.q_row_stride != 0) {
    const std::size_t qsz = dtype_size(spec.q_dtype);
    const std::int64_t n = buffer_rows * b.q_stride;
    b.q_rows.resize(static_cast<std::size_t>(n) * qsz);
    for (std::int64_t i = 0; i < n; ++i) {
      store_from_float(b.q_rows.data(), spec.q_dtype, i, std::numeric_limits<float>::quiet_NaN());
    }
    for (int r = 0; r < b.rows; ++r) {
      std::copy_n(h.q.begin() + static_cast<std::ptrdiff_t>(r * row * qsz), row * qsz,
                  b.q_rows.begin() + static_cast<std::ptrdiff_t>(r * b.q_stride * qsz));
    }
    a.q = b.q_rows.data();
    a.q_row_stride = c.q_row_stride;
  }
  if (c.out_row_stride != 0) {
    b.out_rows.resize(static_cast<std::size_t>(buffer_rows * b.out_stride) *
                      dtype_size(spec.out_dtype));
    a.out = b.out_rows.data();
    a.out_row_stride = c.out_row_stride;
  }
  b.poison_outputs();

  auto seq_arg = [](const char* name, int s) {
    return std::string(name) + "[" + std::to_string(s) + "]";
  };
  switch (c.bad) {
    case Malformation::kNone:
      break;
    case Malformation::kIdOutOfRange: {
      // A sequence whose table is read: a context and, with multi-token queries, a query token.
      std::vector<int> with_blocks;
      for (int s = 0; s < B; ++s) {
        if (h.context_lens[s] > 0 && (!c.multi_token() || c.q_lens[s] > 0)) {
          with_blocks.push_back(s);
        }
      }
      if (with_blocks.empty()) not_applicable();
      const int s = with_blocks[p % with_blocks.size()];
      // An entry that is read: a window's first block or later (the earliest query's window
      // with several query tokens).
      const int first =
          first_read_token(h.context_lens[s], c.window_left, c.multi_token() ? c.q_lens[s] : 1) /
          spec.block_size;
      const int used = blocks_for(h.context_lens[s], spec.block_size);
      const int i = first + static_cast<int>((p >> 8) % (used - first));
      const std::int32_t values[] = {h.num_blocks, h.num_blocks + static_cast<int>((p >> 16) % 7),
                                     -1,           -static_cast<int>((p >> 16) % 100000) - 1,
                                     INT32_MAX,    INT32_MIN};
      h.block_table[static_cast<std::size_t>(s) * h.table_stride + i] = values[(p >> 40) % 6];
      b.expected_code = ErrorCode::kOutOfRange;
      b.expected_argument = "block_table[" + std::to_string(s) + "][" + std::to_string(i) + "]";
      break;
    }
    case Malformation::kContextOverCapacity: {
      if (B <= 0) not_applicable();
      const int s = static_cast<int>(p % B);
      const std::int64_t capacity =
          static_cast<std::int64_t>(h.max_blocks_per_seq) * spec.block_size;
      const std::int64_t v =
          (p >> 32) % 4 == 0 ? INT32_MAX : capacity + 1 + static_cast<std::int64_t>((p >> 8) % 300);
      h.context_lens[s] = static_cast<std::int32_t>(std::min<std::int64_t>(v, INT32_MAX));
      b.expected_code = ErrorCode::kOutOfRange;
      b.expected_argument = seq_arg("context_lens", s);
      break;
    }
    case Malformation::kNegativeContext: {
      if (B <= 0) not_applicable();
      const int s = static_cast<int>(p % B);
      h.context_lens[s] = (p >> 32) % 4 == 0 ? INT32_MIN : -1 - static_cast<int>((p >> 8) % 1000);
      b.expected_code = ErrorCode::kOutOfRange;
      b.expected_argument = seq_arg("context_lens", s);
      break;
    }
    case Malformation::kHeadRatio:
      if (a.num_kv_heads >= 2) {
        a.num_heads += 1 + static_cast<int>(p % (a.num_kv_heads - 1));
      } else {
        a.num_kv_heads = a.num_heads + 1 + static_cast<int>(p % 8);
      }
      b.expected_argument = "num_heads";
      break;
    case Malformation::kGroupTooLarge:
      a.num_kv_heads = 1 + static_cast<int>(p % 4);
      a.num_heads = a.num_kv_heads * (kMaxGroupSize + 1 + static_cast<int>((p >> 8) % 64));
      b.expected_code = ErrorCode::kUnsupported;
      b.expected_argument = "group_size";
      break;
    case Malformation::kNullPointer: {
      if (B <= 0) not_applicable();  // a batch of 0 reads no pointer
      switch (p % 6) {
        case 0:
          a.q = nullptr, b.expected_argument = "q";
          break;
        case 1:
          a.k_cache = nullptr, b.expected_argument = "k_cache";
          break;
        case 2:
          a.v_cache = nullptr, b.expected_argument = "v_cache";
          break;
        case 3:
          a.block_table = nullptr, b.expected_argument = "block_table";
          break;
        case 4:
          a.context_lens = nullptr, b.expected_argument = "context_lens";
          break;
        default:
          a.out = nullptr, b.expected_argument = "out";
          break;
      }
      break;
    }
    case Malformation::kHeadDim: {
      const int values[] = {0, -64, 1, 16, 32, 48, 65, 100, 127, 129, 160, 384, 512, INT32_MAX};
      a.head_dim = values[p % (sizeof(values) / sizeof(values[0]))];
      b.expected_code = ErrorCode::kUnsupported;
      b.expected_argument = "head_dim";
      break;
    }
    case Malformation::kBlockSize: {
      const int values[] = {0, -1, -256, kMaxBlockSize + 1, 512, INT32_MAX, INT32_MIN};
      a.block_size = values[p % (sizeof(values) / sizeof(values[0]))];
      b.expected_code = ErrorCode::kUnsupported;
      b.expected_argument = "block_size";
      break;
    }
    case Malformation::kTableStride:
      if (a.max_blocks_per_seq < 2) not_applicable();
      a.block_table_stride = 1 + static_cast<int>(p % (a.max_blocks_per_seq - 1));
      b.expected_argument = "block_table_stride";
      break;
    case Malformation::kDtypeMismatch:
      // Another plain dtype, or for an fp8 cache now and then the other fp8 format.
      a.v_dtype = is_fp8(a.k_dtype) && (p >> 8) % 3 == 0
                      ? (a.k_dtype == DType::kFP8E4M3 ? DType::kFP8E5M2 : DType::kFP8E4M3)
                      : kDTypes[(static_cast<int>(a.k_dtype) + 1 + p % 2) % 3];
      b.expected_code = ErrorCode::kUnsupported;
      b.expected_argument = "v_dtype";
      break;
    case Malformation::kBadDtype: {
      // Values past the last DType (kFP8E5M2 = 4) or negative.
      const DType bad =
          static_cast<DType>((p >> 8) % 2 ? -1 : 5 + static_cast<int>((p >> 16) % 50));
      DType* fields[] = {&a.q_dtype, &a.k_dtype, &a.v_dtype, &a.out_dtype};
      const char* names[] = {"q_dtype", "k_dtype", "v_dtype", "out_dtype"};
      *fields[p % 4] = bad;
      b.expected_argument = names[p % 4];
      break;
    }
    case Malformation::kNonFiniteScale: {
      const float values[] = {std::numeric_limits<float>::quiet_NaN(),
                              std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity()};
      a.scale = values[p % 3];
      b.expected_argument = "scale";
      break;
    }
    case Malformation::kNegativeBatch:
      a.batch = p % 2 ? -1 : INT32_MIN;
      b.expected_argument = "batch";
      break;
    case Malformation::kWindowLeft: {
      const int values[] = {-2, -3, -1000, INT32_MIN};
      a.window_left = values[p % 4];
      b.expected_argument = "window_left";
      break;
    }
    case Malformation::kSoftCap: {
      const float values[] = {-1.f, -1e-30f, -60.f,  std::numeric_limits<float>::quiet_NaN(),
                              kInf, -kInf,   1e-30f, kMaxFloat};
      a.logits_soft_cap = values[p % 8];
      b.expected_argument = "logits_soft_cap";
      break;
    }
    case Malformation::kNonFiniteSlope: {
      if (b.alibi_slopes.empty() || spec.num_heads <= 0) not_applicable();
      const int head = static_cast<int>((p >> 8) % spec.num_heads);
      const float values[] = {std::numeric_limits<float>::quiet_NaN(), kInf, -kInf, 1e21f,
                              -kMaxFloat};
      b.alibi_slopes[head] = values[p % 5];
      b.expected_argument = seq_arg("alibi_slopes", head);
      break;
    }
    case Malformation::kBadSink: {
      if (b.sinks.empty() || spec.num_heads <= 0) not_applicable();
      const int head = static_cast<int>((p >> 8) % spec.num_heads);
      const float values[] = {std::numeric_limits<float>::quiet_NaN(), kInf, kMaxFloat, -1e21f};
      b.sinks[head] = values[p % 4];
      b.expected_argument = seq_arg("sinks", head);
      break;
    }
    case Malformation::kRowStride: {
      // Rows that would overlap: 1 to a row less one, or any negative value.
      const std::int64_t values[] = {
          -1,
          -row,
          std::numeric_limits<std::int64_t>::min(),
          -1 - static_cast<std::int64_t>((p >> 16) % 100000),
          1,
          row - 1,
          1 + static_cast<std::int64_t>((p >> 16) % std::max<std::int64_t>(row - 1, 1))};
      const std::int64_t v = values[(p >> 8) % 7];
      (p % 2 ? a.out_row_stride : a.q_row_stride) = v;
      b.expected_argument = p % 2 ? "out_row_stride" : "q_row_stride";
      break;
    }
    case Malformation::kQIndptrStart: {
      if (!c.multi_token() || B <= 0) not_applicable();
      const std::int32_t values[] = {1, -1, 1 + static_cast<std::int32_t>((p >> 16) % 100),
                                     INT32_MAX, INT32_MIN};
      b.q_indptr[0] = values[(p >> 8) % 5];
      b.expected_argument = "q_indptr[0]";
      break;
    }
    case Malformation::kQIndptrDecreasing: {
      // q_indptr[k] below q_indptr[k - 1]: sequence k - 1 gets a negative count, the first error.
      if (!c.multi_token() || B <= 0) not_applicable();
      const int k = 1 + static_cast<int>(p % B);
      const std::int64_t v = (p >> 40) % 4 == 0 ? INT32_MIN
                                                : static_cast<std::int64_t>(b.q_indptr[k - 1]) - 1 -
                                                      static_cast<std::int64_t>((p >> 8) % 20);
      b.q_indptr[k] = static_cast<std::int32_t>(v);
      b.expected_code = ErrorCode::kOutOfRange;
      b.expected_argument = seq_arg("q_indptr", k);
      break;
    }
    case Malformation::kQLenOverMax: {
      // A count above max_q_len: a lower max_q_len (at least 1) than the largest count, or one
      // sequence given more tokens, q_indptr shifted from there on (up to INT32_MAX). The first
      // sequence over the bound is named.
      if (!c.multi_token() || B <= 0) not_applicable();
      const int longest = *std::max_element(c.q_lens.begin(), c.q_lens.end());
      int over = -1;
      if (longest >= 2 && (p >> 40) % 2 == 0) {
        a.max_q_len = 1 + static_cast<int>((p >> 8) % (longest - 1));
        for (int s = 0; s < B && over < 0; ++s) {
          if (c.q_lens[s] > a.max_q_len) over = s;
        }
      } else {
        over = static_cast<int>(p % B);
        if ((p >> 48) % 4 == 0) {
          b.q_indptr[over + 1] = INT32_MAX;
        } else {
          const int extra = c.max_q_len + 1 + static_cast<int>((p >> 8) % 40) - c.q_lens[over];
          for (int s = over + 1; s <= B; ++s) b.q_indptr[s] += extra;
        }
      }
      b.expected_code = ErrorCode::kOutOfRange;
      b.expected_argument = seq_arg("q_indptr", over + 1);
      break;
    }
    case Malformation::kQIndptrEnd: {
      // Counts in range that do not add up to num_q_tokens: num_q_tokens larger, or the last
      // count one more or one less (within [0, max_q_len]).
      if (!c.multi_token() || B <= 0) not_applicable();
      const int last = c.q_lens[B - 1];
      if ((p >> 8) % 2 == 0) {
        a.num_q_tokens += 1 + static_cast<int>((p >> 16) % 64);
      } else {
        b.q_indptr[B] += last < c.max_q_len && (last == 0 || (p >> 16) % 2) ? 1 : -1;
      }
      b.expected_argument = seq_arg("q_indptr", B);
      break;
    }
    case Malformation::kMaxQLen: {
      if (!c.multi_token()) not_applicable();
      const int values[] = {0, -1, INT32_MIN};
      a.max_q_len = values[p % 3];
      b.expected_argument = "max_q_len";
      break;
    }
    case Malformation::kQTokensWithoutIndptr: {
      // q_indptr left out (or never set) with num_q_tokens, or only max_q_len, still set.
      a.q_indptr = nullptr;
      const int values[] = {1, B, B + 1, -1, INT32_MAX};
      a.num_q_tokens = c.multi_token() && p % 2 ? b.rows : values[(p >> 8) % 5];
      if (a.num_q_tokens == 0 || (p >> 16) % 4 == 0) {
        a.num_q_tokens = 0;
        a.max_q_len = c.multi_token() ? c.max_q_len : 1 + static_cast<int>((p >> 24) % 16);
        b.expected_argument = "max_q_len";
      } else {
        b.expected_argument = "num_q_tokens";
      }
      break;
    }
    case Malformation::kKvStrides: {
      // The case's own strides (the dense HND ones for the default layout) with one of them 0
      // among nonzero ones, negative, small enough that rows overlap (below head_dim, or below
      // the extent of the dimensions with smaller strides: an NHD head stride under head_dim, a
      // token stride under the kv heads' extent), or a block stride whose pool spans more than
      // int64 addresses. Overlap needs a dimension of more than one entry, the span two blocks;
      // without them the case gets a zero or a negative stride instead.
      const CacheStrides base = a.kv_strides.is_default()
                                    ? CacheStrides::hnd(a.num_kv_heads, a.block_size, a.head_dim)
                                    : a.kv_strides;
      std::int64_t CacheStrides::*const fields[] = {&CacheStrides::block, &CacheStrides::head,
                                                    &CacheStrides::token};
      const char* const names[] = {"kv_strides.block", "kv_strides.head", "kv_strides.token"};
      const int sizes[] = {a.num_blocks, a.num_kv_heads, a.block_size};
      const std::int64_t D = a.head_dim;
      CacheStrides s = base;
      int kind = static_cast<int>(p % 4);
      int f = static_cast<int>((p >> 8) % 3);
      const char* expected = nullptr;
      if (kind == 2) {
        std::vector<int> dims;
        for (int g = 0; g < 3; ++g) {
          if (sizes[g] > 1) dims.push_back(g);
        }
        if (dims.empty()) {
          kind = 0;
        } else {
          f = dims[(p >> 8) % dims.size()];
          if ((p >> 16) % 2) {
            s.*fields[f] = 1 + static_cast<std::int64_t>((p >> 24) % (D - 1));
          } else {
            std::int64_t extent = D;  // of the dimensions below this one
            for (int g = 0; g < 3; ++g) {
              if (g != f && sizes[g] > 1 && base.*fields[g] < base.*fields[f]) {
                extent += base.*fields[g] * (sizes[g] - 1);
              }
            }
            s.*fields[f] = std::max<std::int64_t>(extent - 1 - (p >> 24) % 4, 1);
          }
          expected = overlapping_stride(s, a.num_blocks, a.num_kv_heads, a.block_size, a.head_dim);
          if (expected == nullptr) {
            // Rows that interleave without overlapping: below head_dim does overlap.
            s = base;
            s.*fields[f] = 1 + static_cast<std::int64_t>((p >> 24) % (D - 1));
            expected =
                overlapping_stride(s, a.num_blocks, a.num_kv_heads, a.block_size, a.head_dim);
          }
        }
      }
      if (kind == 3) {
        if (a.num_blocks < 2) {
          kind = 1;
        } else {
          s.block = (std::int64_t{1} << 62) + static_cast<std::int64_t>((p >> 16) % 1000);
          expected = "kv_strides.block";
        }
      }
      if (kind == 0) {
        s.*fields[f] = 0;
        expected = names[f];
      } else if (kind == 1) {
        const std::int64_t values[] = {-1, -D, std::numeric_limits<std::int64_t>::min(),
                                       -1 - static_cast<std::int64_t>((p >> 16) % 100000)};
        s.*fields[f] = values[(p >> 40) % 4];
        expected = names[f];
      }
      if (expected == nullptr) not_applicable();
      a.kv_strides = s;
      b.expected_argument = expected;
      break;
    }
    case Malformation::kFp8ValueDtype: {
      // fp8 stores K and V caches only: q or out in e4m3 or e5m2, whatever the cache.
      const DType fp8 = (p >> 8) % 2 ? DType::kFP8E5M2 : DType::kFP8E4M3;
      (p % 2 ? a.out_dtype : a.q_dtype) = fp8;
      b.expected_code = ErrorCode::kUnsupported;
      b.expected_argument = p % 2 ? "out_dtype" : "q_dtype";
      break;
    }
    case Malformation::kBadKvScale: {
      // Outside [kMinKvScale, kMaxKvScale]: zero of either sign, negative (the case's own
      // scale negated among them), NaN, infinite, just past either bound, or the extremes.
      if (!is_fp8(spec.kv_dtype)) not_applicable();
      const bool v = p % 2;
      const float own = v ? spec.v_scale : spec.k_scale;
      const float values[] = {
          0.f,   -0.f,  -1.f,     -own,      std::numeric_limits<float>::quiet_NaN(), kInf,
          -kInf, 1e31f, 9.9e-31f, kMaxFloat, std::numeric_limits<float>::denorm_min()};
      (v ? a.v_scale : a.k_scale) = values[(p >> 8) % (sizeof(values) / sizeof(values[0]))];
      b.expected_argument = v ? "v_scale" : "k_scale";
      break;
    }
    case Malformation::kScaleOnPlainCache: {
      // A valid scale other than 1, or a per-head array (of ones: the array itself is refused),
      // on a cache of f32, f16 or bf16.
      if (is_fp8(spec.kv_dtype)) not_applicable();
      const float values[] = {0.5f, 2.f, 0.99999994f, 1.00000012f, 1e-3f, kMinKvScale, kMaxKvScale};
      const float x = values[(p >> 8) % (sizeof(values) / sizeof(values[0]))];
      switch (p % 4) {
        case 0:
          a.k_scale = x, b.expected_argument = "k_scale";
          break;
        case 1:
          a.v_scale = x, b.expected_argument = "v_scale";
          break;
        case 2:
          b.k_scales.assign(static_cast<std::size_t>(spec.num_kv_heads), 1.f);
          b.expected_argument = "k_scales";
          break;
        default:
          b.v_scales.assign(static_cast<std::size_t>(spec.num_kv_heads), 1.f);
          b.expected_argument = "v_scales";
          break;
      }
      b.expected_code = ErrorCode::kUnsupported;
      break;
    }
    case Malformation::kBadKvHeadScale: {
      // One kv head's K or V scale (an array the case has) out of range; like the variants'
      // values, read back from device memory by the CUDA backend in checked mode.
      if (!is_fp8(spec.kv_dtype) || !c.per_head_scales() || spec.num_kv_heads <= 0) {
        not_applicable();
      }
      const bool v = c.k_scales.empty() || (!c.v_scales.empty() && p % 2);
      const int head = static_cast<int>((p >> 8) % spec.num_kv_heads);
      const float values[] = {
          0.f,   -0.f,     -1.f,       std::numeric_limits<float>::quiet_NaN(), kInf, -kInf,
          1e31f, 9.9e-31f, -kMaxFloat, std::numeric_limits<float>::denorm_min()};
      (v ? b.v_scales : b.k_scales)[static_cast<std::size_t>(head)] =
          values[(p >> 16) % (sizeof(values) / sizeof(values[0]))];
      b.expected_argument = seq_arg(v ? "v_scales" : "k_scales", head);
      break;
    }
    case Malformation::kCount:
      not_applicable();
  }
  // The CUDA backend checks its rows' alignment after the shapes and before q_indptr, the tables
  // and the variants' values (which it reads back in checked mode only), over the rows the
  // arguments declare.
  const bool shapes_pass =
      c.bad == Malformation::kNone || c.bad == Malformation::kIdOutOfRange ||
      c.bad == Malformation::kContextOverCapacity || c.bad == Malformation::kNegativeContext ||
      c.bad == Malformation::kNonFiniteSlope || c.bad == Malformation::kBadSink ||
      c.bad == Malformation::kQIndptrStart || c.bad == Malformation::kQIndptrDecreasing ||
      c.bad == Malformation::kQLenOverMax || c.bad == Malformation::kQIndptrEnd ||
      c.bad == Malformation::kBadKvHeadScale;
  if (const char* field =
          misaligned_stride(a.q_rows(), row, c.q_row_stride, spec.q_dtype, c.out_row_stride);
      field != nullptr && shapes_pass) {
    b.cuda_refuses = field;
  }
  // Then the cache strides (once there is a sequence: a batch of 0 is a no-op).
  if (const char* field = shapes_pass && a.batch > 0 && b.cuda_refuses.empty()
                              ? misaligned_kv(a.cache_layout(), a.k_dtype)
                              : nullptr) {
    b.cuda_refuses = field;
  }
  // Host copies of the per-head arrays, long enough for the (possibly malformed) head count.
  if (!b.alibi_slopes.empty()) b.alibi_slopes = per_head(b.alibi_slopes, a.num_heads);
  if (!b.sinks.empty()) b.sinks = per_head(b.sinks, a.num_heads);
  a.alibi_slopes = b.alibi_slopes.empty() ? nullptr : b.alibi_slopes.data();
  a.sinks = b.sinks.empty() ? nullptr : b.sinks.data();
  if (!b.k_scales.empty()) b.k_scales = per_head(b.k_scales, a.num_kv_heads);
  if (!b.v_scales.empty()) b.v_scales = per_head(b.v_scales, a.num_kv_heads);
  a.k_scales = b.k_scales.empty() ? nullptr : b.k_scales.data();
  a.v_scales = b.v_scales.empty() ? nullptr : b.v_scales.data();
  if (c.bad == Malformation::kIdOutOfRange || c.bad == Malformation::kContextOverCapacity ||
      c.bad == Malformation::kNegativeContext) {
    a.block_table = h.block_table.data();
    a.context_lens = h.context_lens.data();
  }
  return b;
}

std::string describe(const FuzzCase& c) {
  std::ostringstream os;
  os << testing::describe(c.spec) << " threads=" << c.threads << " mag=" << c.spec.magnitude;
  if (c.snap) os << " snap";
  if (c.scale != 0.f) os << " scale=" << c.scale;
  if (c.windowed()) os << " window=" << c.window_left;
  if (c.soft_capped()) os << " cap=" << c.soft_cap;
  if (!c.alibi_slopes.empty()) os << " alibi";
  if (!c.sinks.empty()) os << " sinks";
  if (c.q_row_stride != 0) os << " q_stride=" << c.q_row_stride;
  if (c.out_row_stride != 0) os << " out_stride=" << c.out_row_stride;
  if (!c.default_layout()) os << " layout=" << testing::kv_layout_name(c.kv_layout);
  if (c.kv_pad != 0) os << " kv_pad=" << c.kv_pad;
  if (c.spec.k_scale != 1.f) os << " k_scale=" << c.spec.k_scale;
  if (c.spec.v_scale != 1.f) os << " v_scale=" << c.spec.v_scale;
  if (c.per_head_scales()) os << " per_head_scales";
  if (c.multi_token()) {
    os << " q_lens=[";
    for (std::size_t i = 0; i < c.q_lens.size(); ++i) os << (i ? "," : "") << c.q_lens[i];
    os << "] max_q_len=" << c.max_q_len;
  }
  if (c.malformed()) os << " malformed=" << malformation_name(c.bad);
  return os.str();
}

// ---- case files ----

std::string to_text(const FuzzCase& c) {
  const testing::CaseSpec& s = c.spec;
  std::ostringstream os;
  os.precision(9);
  os << "# pagedattn-fuzz case (replay: pagedattn-fuzz --replay FILE)\n"
     << "origin " << c.origin_seed << ' ' << c.origin_index << '\n'
     << "batch " << s.batch << '\n'
     << "num_heads " << s.num_heads << '\n'
     << "num_kv_heads " << s.num_kv_heads << '\n'
     << "head_dim " << s.head_dim << '\n'
     << "block_size " << s.block_size << '\n'
     << "context_lens";
  for (int i = 0; i < s.batch && i < static_cast<int>(s.context_lens.size()); ++i) {
    os << ' ' << s.context_lens[i];
  }
  os << '\n'
     << "q_dtype " << dtype_name(s.q_dtype) << '\n'
     << "kv_dtype " << dtype_name(s.kv_dtype) << '\n'
     << "out_dtype " << dtype_name(s.out_dtype) << '\n'
     << "q_row_stride " << c.q_row_stride << '\n'
     << "out_row_stride " << c.out_row_stride << '\n'
     << "kv_layout " << testing::kv_layout_name(c.kv_layout) << '\n'
     << "kv_pad " << c.kv_pad << '\n'
     << "k_scale " << s.k_scale << '\n'
     << "v_scale " << s.v_scale << '\n';
  // A line of values (one per kv head or query head, or none: the line may be left out).
  const auto list = [&os](const char* key, const std::vector<float>& values) {
    os << key;
    for (float x : values) os << ' ' << x;
    os << '\n';
  };
  list("k_scales", c.k_scales);  // fp8 caches, per kv head
  list("v_scales", c.v_scales);
  os << "max_q_len " << c.max_q_len << '\n' << "q_lens";
  for (int n : c.q_lens) os << ' ' << n;
  os << '\n'
     << "spare_blocks " << s.spare_blocks << '\n'
     << "table_padding " << s.table_padding << '\n'
     << "table_stride_extra " << s.table_stride_extra << '\n'
     << "fragmented " << s.fragmented << '\n'
     << "share_prefix " << s.share_prefix << '\n'
     << "poison " << s.poison << '\n'
     << "magnitude " << s.magnitude << '\n'
     << "data_seed " << s.seed << '\n'
     << "snap " << c.snap << '\n'
     << "scale " << c.scale << '\n'
     << "threads " << c.threads << '\n'
     << "window_left " << c.window_left << '\n'
     << "logits_soft_cap " << c.soft_cap << '\n';
  list("alibi_slopes", c.alibi_slopes);  // per query head
  list("sinks", c.sinks);
  os << "malformation " << malformation_name(c.bad) << ' ' << c.bad_param << '\n';
  return os.str();
}

namespace {

// `cache`: the K/V dtype, which may be fp8 too.
DType parse_dtype(const std::string& t, bool cache) {
  for (DType d : kDTypes) {
    if (t == dtype_name(d)) return d;
  }
  for (DType d : kFp8DTypes) {
    if (t != dtype_name(d)) continue;
    if (cache) return d;
    throw std::runtime_error("case file: dtype '" + t +
                             "' is for kv_dtype only (fp8 stores K and V caches only)");
  }
  throw std::runtime_error("case file: unknown dtype '" + t + "'");
}

// A float as to_text writes it, "inf", "-inf" and "nan" included (operator>> takes none of them).
bool parse_float(const std::string& t, float& v) {
  char* end = nullptr;
  v = std::strtof(t.c_str(), &end);
  return !t.empty() && end == t.c_str() + t.size();
}

}  // namespace

FuzzCase from_text(const std::string& text) {
  FuzzCase c;
  testing::CaseSpec& s = c.spec;
  s.context_lens.clear();
  std::istringstream in(text);
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ls(line);
    std::string key;
    ls >> key;
    auto bad = [&] {
      throw std::runtime_error("case file line " + std::to_string(line_no) + ": cannot parse '" +
                               line + "'");
    };
    auto read_int = [&](int& v) {
      if (!(ls >> v)) bad();
    };
    auto read_bool = [&](bool& v) {
      int i;
      if (!(ls >> i)) bad();
      v = i != 0;
    };
    std::string word;
    if (key == "origin") {
      if (!(ls >> c.origin_seed >> c.origin_index)) bad();
    } else if (key == "batch") {
      read_int(s.batch);
    } else if (key == "num_heads") {
      read_int(s.num_heads);
    } else if (key == "num_kv_heads") {
      read_int(s.num_kv_heads);
    } else if (key == "head_dim") {
      read_int(s.head_dim);
    } else if (key == "block_size") {
      read_int(s.block_size);
    } else if (key == "context_lens") {
      int L;
      while (ls >> L) s.context_lens.push_back(L);
    } else if (key == "q_dtype" || key == "kv_dtype" || key == "out_dtype") {
      if (!(ls >> word)) bad();
      (key == "q_dtype"    ? s.q_dtype
       : key == "kv_dtype" ? s.kv_dtype
                           : s.out_dtype) = parse_dtype(word, key == "kv_dtype");
    } else if (key == "q_row_stride" || key == "out_row_stride") {
      if (!(ls >> (key == "q_row_stride" ? c.q_row_stride : c.out_row_stride))) bad();
    } else if (key == "kv_layout") {
      if (!(ls >> word)) bad();
      bool found = false;
      for (testing::KvLayout l : testing::kAllKvLayouts) {
        if (word == testing::kv_layout_name(l)) {
          c.kv_layout = l;
          found = true;
        }
      }
      if (!found) bad();
    } else if (key == "kv_pad") {
      read_int(c.kv_pad);
    } else if (key == "k_scale" || key == "v_scale") {
      if (!(ls >> word) || !parse_float(word, key == "k_scale" ? s.k_scale : s.v_scale)) bad();
    } else if (key == "k_scales" || key == "v_scales") {
      std::vector<float>& values = key == "k_scales" ? c.k_scales : c.v_scales;
      values.clear();
      float x;
      while (ls >> word) {
        if (!parse_float(word, x)) bad();
        values.push_back(x);
      }
    } else if (key == "max_q_len") {
      read_int(c.max_q_len);
    } else if (key == "q_lens") {
      c.q_lens.clear();
      int n;
      while (ls >> n) c.q_lens.push_back(n);
      if (!ls.eof()) bad();
    } else if (key == "spare_blocks") {
      read_int(s.spare_blocks);
    } else if (key == "table_padding") {
      read_int(s.table_padding);
    } else if (key == "table_stride_extra") {
      read_int(s.table_stride_extra);
    } else if (key == "fragmented") {
      read_bool(s.fragmented);
    } else if (key == "share_prefix") {
      read_bool(s.share_prefix);
    } else if (key == "poison") {
      read_bool(s.poison);
    } else if (key == "magnitude") {
      if (!(ls >> s.magnitude)) bad();
    } else if (key == "data_seed") {
      if (!(ls >> s.seed)) bad();
    } else if (key == "snap") {
      read_bool(c.snap);
    } else if (key == "scale") {
      if (!(ls >> c.scale)) bad();
    } else if (key == "threads") {
      read_int(c.threads);
    } else if (key == "window_left") {
      read_int(c.window_left);
    } else if (key == "logits_soft_cap") {
      if (!(ls >> word) || !parse_float(word, c.soft_cap)) bad();
    } else if (key == "alibi_slopes" || key == "sinks") {
      std::vector<float>& values = key == "sinks" ? c.sinks : c.alibi_slopes;
      values.clear();
      float x;
      while (ls >> word) {
        if (!parse_float(word, x)) bad();
        values.push_back(x);
      }
    } else if (key == "malformation") {
      if (!(ls >> word >> c.bad_param)) bad();
      bool found = false;
      for (int i = 0; i < static_cast<int>(Malformation::kCount); ++i) {
        if (word == kMalformationNames[i]) {
          c.bad = static_cast<Malformation>(i);
          found = true;
        }
      }
      if (!found) bad();
    } else {
      bad();
    }
  }
  if (s.batch < 0 || static_cast<int>(s.context_lens.size()) != s.batch) {
    throw std::runtime_error("case file: context_lens must list batch values");
  }
  if (c.max_q_len < 0 || (c.max_q_len > 0 && static_cast<int>(c.q_lens.size()) != s.batch) ||
      (c.max_q_len == 0 && !c.q_lens.empty())) {
    throw std::runtime_error(
        "case file: q_lens must list batch values with a max_q_len of 1 or more, or none with "
        "max_q_len 0 (one query token per sequence)");
  }
  for (const auto& [key, values] :
       {std::pair{"alibi_slopes", &c.alibi_slopes}, std::pair{"sinks", &c.sinks}}) {
    if (!values->empty() && static_cast<int>(values->size()) != s.num_heads) {
      throw std::runtime_error(std::string("case file: ") + key +
                               " must list num_heads values, or none");
    }
  }
  for (const auto& [key, values] :
       {std::pair{"k_scales", &c.k_scales}, std::pair{"v_scales", &c.v_scales}}) {
    if (!values->empty() && static_cast<int>(values->size()) != s.num_kv_heads) {
      throw std::runtime_error(std::string("case file: ") + key +
                               " must list num_kv_heads values, or none");
    }
  }
  return c;
}

void save_case(const FuzzCase& c, const std::string& path) {
  std::ofstream f(path);
  f << to_text(c);
  if (!f) throw std::runtime_error("cannot write " + path);
}

FuzzCase load_case(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw std::runtime_error("cannot read " + path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return from_text(ss.str());
}

}  // namespace pagedattn::fuzz
