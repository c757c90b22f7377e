// Properties of the online-softmax state, for both units the backends run in (NaturalExp on the
// CPU, Log2Exp in the CUDA kernels): merge is associative and commutative, the empty state is
// its identity, empty states never make NaN, huge logits do not overflow, and folding blocks in
// any split agrees with the two-pass definition in f64. Logits are drawn in natural units and
// converted to the state's units (times log2(e) for Log2Exp); lse always comes back natural.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "pagedattn/online_softmax.hpp"
#include "test_seed.hpp"

namespace pagedattn {
namespace {

constexpr int kDim = 8;

// Natural logit -> the logit in Base's units.
template <class Base>
float in_units(float s);
template <>
float in_units<NaturalExp>(float s) {
  return s;
}
template <>
float in_units<Log2Exp>(float s) {
  return s * 1.44269504088896341f;
}

template <class Base>
struct Partial {
  OnlineSoftmax<Base> st = OnlineSoftmax<Base>::empty();
  std::vector<float> acc = std::vector<float>(kDim, 0.f);
};

// Folds natural logits s with values v (kDim each) into a fresh partial.
template <class Base>
Partial<Base> fold(const std::vector<float>& s, const std::vector<std::vector<float>>& v) {
  Partial<Base> p;
  std::vector<float> u(s.size()), w(s.size());
  for (std::size_t t = 0; t < s.size(); ++t) u[t] = in_units<Base>(s[t]);
  const float alpha = softmax_update(p.st, u.data(), w.data(), static_cast<int>(s.size()));
  for (float& a : p.acc) a *= alpha;
  for (std::size_t t = 0; t < s.size(); ++t) {
    for (int d = 0; d < kDim; ++d) p.acc[d] += w[t] * v[t][d];
  }
  return p;
}

template <class Base>
Partial<Base> merged(Partial<Base> a, const Partial<Base>& b) {
  softmax_merge(a.st, a.acc.data(), b.st, b.acc.data(), kDim);
  return a;
}

// Random partial from n random logits at magnitude `mag` (n = 0 gives the empty state).
template <class Base>
Partial<Base> random_partial(std::mt19937_64& rng, int n, float mag) {
  std::normal_distribution<float> dist(0.f, mag);
  std::vector<float> s(n);
  std::vector<std::vector<float>> v(n, std::vector<float>(kDim));
  for (int t = 0; t < n; ++t) {
    s[t] = dist(rng);
    for (float& x : v[t]) x = dist(rng) / mag;
  }
  return fold<Base>(s, v);
}

template <class Base>
void expect_same(const Partial<Base>& x, const Partial<Base>& y, double tol,
                 const std::string& note) {
  std::vector<float> ox(kDim), oy(kDim);
  const float lx = softmax_finalize(x.st, x.acc.data(), ox.data(), kDim);
  const float ly = softmax_finalize(y.st, y.acc.data(), oy.data(), kDim);
  if (std::isinf(lx) || std::isinf(ly)) {
    EXPECT_EQ(lx, ly) << note;
  } else {
    EXPECT_NEAR(lx, ly, tol * std::max(1.f, std::fabs(lx))) << note;
  }
  for (int d = 0; d < kDim; ++d) {
    EXPECT_FALSE(std::isnan(ox[d])) << note;
    EXPECT_NEAR(ox[d], oy[d], tol) << note;
  }
}

template <class Base>
class OnlineSoftmaxTest : public ::testing::Test {};

struct UnitsName {
  template <class Base>
  static std::string GetName(int) {
    return std::is_same_v<Base, NaturalExp> ? "NaturalExp" : "Log2Exp";
  }
};

using Units = ::testing::Types<NaturalExp, Log2Exp>;
TYPED_TEST_SUITE(OnlineSoftmaxTest, Units, UnitsName);

TYPED_TEST(OnlineSoftmaxTest, MergeIsAssociativeAndCommutative) {
  using Base = TypeParam;
  const std::uint64_t seed = testing::seed_for(21);
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 500; ++trial) {
    const float mag = trial % 3 == 0 ? 30.f : 3.f;
    const auto a = random_partial<Base>(rng, static_cast<int>(rng() % 5), mag);
    const auto b = random_partial<Base>(rng, static_cast<int>(rng() % 5), mag);
    const auto c = random_partial<Base>(rng, static_cast<int>(rng() % 5), mag);
    const std::string note = "trial " + std::to_string(trial) + " " + testing::seed_note(seed);
    expect_same(merged(merged(a, b), c), merged(a, merged(b, c)), 1e-5, note);
    expect_same(merged(a, b), merged(b, a), 1e-6, note);
  }
}

TYPED_TEST(OnlineSoftmaxTest, EmptyStateIsTheIdentity) {
  using Base = TypeParam;
  std::mt19937_64 rng(testing::seed_for(22));
  const Partial<Base> empty;
  for (int trial = 0; trial < 100; ++trial) {
    const auto a = random_partial<Base>(rng, 1 + static_cast<int>(rng() % 6), 5.f);
    const auto left = merged(empty, a), right = merged(a, empty);
    EXPECT_EQ(left.st.m, a.st.m);
    EXPECT_EQ(left.st.l, a.st.l);
    EXPECT_EQ(right.st.m, a.st.m);
    EXPECT_EQ(right.st.l, a.st.l);
    EXPECT_EQ(left.acc, a.acc);
    EXPECT_EQ(right.acc, a.acc);
  }
}

TYPED_TEST(OnlineSoftmaxTest, EmptyStatesNeverProduceNaN) {
  using Base = TypeParam;
  const auto e = merged(Partial<Base>{}, Partial<Base>{});
  EXPECT_TRUE(e.st.is_empty());
  EXPECT_EQ(e.st.m, -INFINITY);
  EXPECT_EQ(e.st.inv_sum(), 0.f);
  std::vector<float> out(kDim, 123.f);
  const float lse = softmax_finalize(e.st, e.acc.data(), out.data(), kDim);
  EXPECT_EQ(lse, -INFINITY);
  for (float o : out) EXPECT_EQ(o, 0.f);
  // Folding only masked (-inf) logits leaves the state empty with zero weights.
  auto st = OnlineSoftmax<Base>::empty();
  float s[3] = {-INFINITY, -INFINITY, -INFINITY}, w[3];
  EXPECT_EQ(softmax_update(st, s, w, 3), 1.f);
  EXPECT_TRUE(st.is_empty());
  for (float x : w) EXPECT_EQ(x, 0.f);
  // A rescale of the empty state leaves its (zero) accumulator alone.
  auto fresh = OnlineSoftmax<Base>::empty();
  EXPECT_EQ(fresh.rescale_to(3.f), 1.f);
  EXPECT_EQ(fresh.m, 3.f);
  EXPECT_EQ(fresh.l, 0.f);
}

TYPED_TEST(OnlineSoftmaxTest, HugeLogitsDoNotOverflow) {
  using Base = TypeParam;
  // exp(1e4) overflows f32; the state only ever exponentiates differences to the running max.
  std::vector<float> s = {1e4f, 1e4f - 1.f, -1e4f, 9990.f};
  std::vector<std::vector<float>> v(4, std::vector<float>(kDim, 1.f));
  for (int d = 0; d < kDim; ++d) v[1][d] = 2.f;
  const auto p = fold<Base>(s, v);
  std::vector<float> out(kDim);
  const float lse = softmax_finalize(p.st, p.acc.data(), out.data(), kDim);
  const double e1 = std::exp(-1.0), e10 = std::exp(-10.0);
  const double l = 1 + e1 + e10;
  // 1e4 * log2(e) is rounded to f32 (half an ulp: 1e-3 in log2 units) for Log2Exp.
  EXPECT_NEAR(lse, 1e4 + std::log(l), 2e-3);
  EXPECT_NEAR(out[0], (1 + 2 * e1 + e10) / l, 1e-3);
  // Blockwise folding with a rising max rescales without overflow too.
  const auto first = fold<Base>({-1e4f}, {v[2]});
  const auto second = fold<Base>({1e4f}, {v[0]});
  const auto both = merged(first, second);
  std::vector<float> o2(kDim);
  EXPECT_NEAR(softmax_finalize(both.st, both.acc.data(), o2.data(), kDim), 1e4f, 2e-3);
  EXPECT_FLOAT_EQ(o2[0], 1.f);
  // A rising max rescales the running sum in place: rescale_to returns exp(m_old - m_new).
  auto st = OnlineSoftmax<Base>::empty();
  st.rescale_to(in_units<Base>(-1e4f));
  st.add(1.f);
  EXPECT_EQ(st.rescale_to(in_units<Base>(1e4f)), 0.f);  // exp(-2e4) underflows to 0
  EXPECT_EQ(st.l, 0.f);
}

TYPED_TEST(OnlineSoftmaxTest, AnySplitAgreesWithTwoPassSoftmaxInF64) {
  using Base = TypeParam;
  const std::uint64_t seed = testing::seed_for(23);
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> dist(0.0, 4.0);
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 40);
    std::vector<float> s(n);
    std::vector<std::vector<float>> v(n, std::vector<float>(kDim));
    for (int t = 0; t < n; ++t) {
      s[t] = static_cast<float>(dist(rng));
      for (float& x : v[t]) x = static_cast<float>(dist(rng));
    }
    // Two-pass definition in double.
    double m = -INFINITY, l = 0;
    for (float x : s) m = std::max(m, double(x));
    std::vector<double> want(kDim, 0.0);
    for (int t = 0; t < n; ++t) {
      const double w = std::exp(s[t] - m);
      l += w;
      for (int d = 0; d < kDim; ++d) want[d] += w * v[t][d];
    }
    // Random cut points, folded left to right by merging per-block partials.
    Partial<Base> total;
    for (int t0 = 0; t0 < n;) {
      const int len = 1 + static_cast<int>(rng() % 7);
      const int t1 = std::min(n, t0 + len);
      total = merged(total,
                     fold<Base>(std::vector<float>(s.begin() + t0, s.begin() + t1),
                                std::vector<std::vector<float>>(v.begin() + t0, v.begin() + t1)));
      t0 = t1;
    }
    std::vector<float> out(kDim);
    const float lse = softmax_finalize(total.st, total.acc.data(), out.data(), kDim);
    EXPECT_NEAR(lse, m + std::log(l), 1e-5 * std::max(1.0, std::fabs(m)))
        << testing::seed_note(seed);
    for (int d = 0; d < kDim; ++d) {
      EXPECT_NEAR(out[d], want[d] / l, 2e-5 * 4) << testing::seed_note(seed);
    }
  }
}

}  // namespace
}  // namespace pagedattn
