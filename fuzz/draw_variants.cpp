#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "draw_parts.hpp"
#include "pagedattn/variants.hpp"

namespace pagedattn::fuzz {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

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

}  // namespace

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

}  // namespace pagedattn::fuzz
