// The f64 reference against values worked out by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "pagedattn/reference.hpp"

namespace pagedattn {
namespace {

// One kv head, block size 2, head_dim 64; the sequence's tokens live in blocks 2 then 0.
struct Tiny {
  static constexpr int D = 64, BS = 2, NB = 3;
  std::vector<float> q = std::vector<float>(2 * D, 0.f);  // two q heads (group of 2)
  std::vector<float> k = std::vector<float>(NB * BS * D, 0.f);
  std::vector<float> v = std::vector<float>(NB * BS * D, 0.f);
  std::vector<std::int32_t> table = {2, 0, -1};
  std::vector<std::int32_t> lens = {3};
  DecodeArgs args() {
    DecodeArgs a;
    a.batch = 1;
    a.num_heads = 2;
    a.num_kv_heads = 1;
    a.head_dim = D;
    a.block_size = BS;
    a.num_blocks = NB;
    a.max_blocks_per_seq = 3;
    a.q = q.data();
    a.k_cache = k.data();
    a.v_cache = v.data();
    a.block_table = table.data();
    a.context_lens = lens.data();
    a.scale = 1.f;
    return a;
  }
  // Token t of the sequence, element d.
  float& key(int t, int d) { return k[(table[t / BS] * BS + t % BS) * D + d]; }
  float& value(int t, int d) { return v[(table[t / BS] * BS + t % BS) * D + d]; }
};

TEST(Reference, MatchesAHandComputedSoftmax) {
  Tiny c;
  c.q[0] = 1.f;            // head 0 looks at dimension 0
  c.q[Tiny::D + 1] = 2.f;  // head 1 looks at dimension 1
  for (int t = 0; t < 3; ++t) {
    c.key(t, 0) = static_cast<float>(t);  // head 0 logits 0, 1, 2
    c.key(t, 1) = 1.f;                    // head 1 logits 2, 2, 2
    c.value(t, 5) = static_cast<float>(10 * (t + 1));
  }
  // The unused slot of block 0 (token 3) holds NaN: it must not be read.
  c.k[(0 * Tiny::BS + 1) * Tiny::D] = NAN;
  c.v[(0 * Tiny::BS + 1) * Tiny::D + 5] = NAN;
  const ReferenceResult r = reference_decode(c.args());
  const double z = 1 + std::exp(1.0) + std::exp(2.0);
  EXPECT_NEAR(r.out[5], (10 + 20 * std::exp(1.0) + 30 * std::exp(2.0)) / z, 1e-12);
  EXPECT_NEAR(r.lse[0], std::log(z), 1e-12);
  EXPECT_NEAR(r.out[Tiny::D + 5], 20.0, 1e-12);  // uniform weights: mean of 10, 20, 30
  EXPECT_NEAR(r.lse[1], 2.0 + std::log(3.0), 1e-12);
  EXPECT_EQ(r.out[0], 0.0);
}

// tokens_share: the tokens' part of the softmax, 1 without a sink, 1 / (1 + e^(sink - s)) for
// equal logits s, and exact where the sink takes all but e^-60 of it (1 - exp(sink - lse) is 0
// in f64 there).
TEST(Reference, TokensShareKeepsItsPrecisionUnderADominantSink) {
  Tiny c;
  for (int t = 0; t < 3; ++t) c.key(t, 0) = 1.f;  // head 0: logits 1, 1, 1; head 1: 0, 0, 0
  c.q[0] = 1.f;
  const ReferenceResult plain = reference_decode(c.args());
  EXPECT_EQ(plain.tokens_share[0], 1.0);
  EXPECT_EQ(plain.tokens_share[1], 1.0);

  const float sinks[2] = {1.f, 60.f};
  DecodeArgs a = c.args();
  a.sinks = sinks;
  const ReferenceResult r = reference_decode(a);
  EXPECT_NEAR(r.tokens_share[0], 3 / (3 + 1.0), 1e-15);  // sink logit equal to the tokens'
  const double tiny = 3 * std::exp(-60.0) / (1 + 3 * std::exp(-60.0));
  EXPECT_NEAR(r.tokens_share[1], tiny, 1e-15 * tiny);
  EXPECT_EQ(-std::expm1(sinks[1] - r.lse[1]), 0.0);  // what the share replaces
}

TEST(Reference, EmptyContextGivesZeroAndMinusInfinity) {
  Tiny c;
  c.lens[0] = 0;
  c.table = {-1, -1, -1};  // never read
  const ReferenceResult r = reference_decode(c.args());
  for (double o : r.out) EXPECT_EQ(o, 0.0);
  EXPECT_EQ(r.lse[0], -INFINITY);
  EXPECT_EQ(r.lse[1], -INFINITY);
  EXPECT_EQ(r.tokens_share[0], 0.0);
}

TEST(Reference, DefaultScaleIsInverseSqrtHeadDim) {
  Tiny c;
  c.lens[0] = 2;
  c.q[0] = 8.f;
  c.key(0, 0) = 1.f;  // logit 8 * 1 / sqrt(64) = 1
  c.value(0, 0) = 1.f;
  DecodeArgs a = c.args();
  a.scale.reset();
  const ReferenceResult r = reference_decode(a);
  const double w0 = std::exp(1.0) / (std::exp(1.0) + 1.0);
  EXPECT_NEAR(r.out[0], w0, 1e-12);
}

}  // namespace
}  // namespace pagedattn
