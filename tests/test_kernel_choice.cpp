// The CUDA backend's choice of split kernel (cuda/kernel_choice.hpp), on made-up device facts: no
// GPU and no CUDA toolkit needed. The expected builds and counts follow from the rules stated in
// the header, worked out by hand for each shape.
#include <gtest/gtest.h>

#include "device_info.hpp"
#include "kernel_choice.hpp"

namespace pagedattn::detail::cuda {
namespace {

// `q_len` query tokens of `group` query heads per kv head: 4 sequences of at most 64 blocks of 16
// tokens at 8 kv heads.
CallShape shape(DType q, DType k, int head_dim, int group, int q_len) {
  return {q, k, head_dim, group, q_len, 4, 8, 16, 64};
}

// A bf16 q over an fp8 cache at head dim 128, group 4, one query token, `batch` sequences of at
// most `tokens` tokens (16-token blocks) at 8 kv heads.
CallShape fp8_shape(DType cache, int batch, int tokens) {
  CallShape s = shape(DType::kBF16, cache, 128, 4, 1);
  s.batch = batch;
  s.max_blocks = tokens / 16;
  return s;
}

void expect_build(const KernelChoice& k, bool mma, bool wide, bool dense) {
  EXPECT_EQ(k.build.mma, mma);
  EXPECT_EQ(k.build.wide, wide);
  EXPECT_EQ(k.build.dense, dense);
}

KernelFacts facts(int plain_ctas, int dense_ctas) {
  KernelFacts f;
  f.sms = 132;
  f.plain = {plain_ctas, 40000};
  f.dense = {dense_ctas, 30000};
  return f;
}

TEST(KernelChoice, OneTokenBf16TakesThePlainTensorCoreBuild) {
  const CallShape s = shape(DType::kBF16, DType::kBF16, 128, 8, 1);
  const KernelChoice k = choose_split_kernel(s, facts(2, 3));
  expect_build(k, true, false, false);  // only fp8 weighs the dense build
  EXPECT_EQ(k.rows_per_cta, kMmaRowsPerCta);
  EXPECT_EQ(k.row_chunks, 1);
  EXPECT_EQ(k.ctas_per_sm, 2);
  EXPECT_EQ(k.waves, 1);
  EXPECT_EQ(k.smem_bytes, 40000);
  EXPECT_EQ(k.parallelism, 132 * 2);
  EXPECT_TRUE(use_mma(shape(DType::kF16, DType::kF16, 64, 1, 1)));  // MHA too
}

TEST(KernelChoice, QInAnotherDtypeThanA16BitCacheRunsOnTheCudaCores) {
  EXPECT_FALSE(use_mma(shape(DType::kBF16, DType::kF16, 128, 8, 1)));
  EXPECT_FALSE(use_mma(shape(DType::kF32, DType::kBF16, 128, 8, 1)));
  EXPECT_FALSE(use_mma(shape(DType::kF16, DType::kBF16, 128, 8, 1)));
}

TEST(KernelChoice, F32CacheWithThreeRowsOrMoreRunsTf32OnTheTensorCores) {
  const KernelChoice k =
      choose_split_kernel(shape(DType::kF32, DType::kF32, 128, 8, 1), facts(1, 5));
  expect_build(k, true, false, false);
  EXPECT_EQ(k.rows_per_cta, kTf32RowsPerCta);
  EXPECT_EQ(k.row_chunks, 1);
  EXPECT_EQ(k.ctas_per_sm, 1);
  EXPECT_EQ(k.parallelism, 132);
  // 32 rows are two chunks of 16, and so are 3 query tokens x group 8 = 24 rows.
  const KernelChoice g32 =
      choose_split_kernel(shape(DType::kF32, DType::kF32, 128, 32, 1), facts(1, 5));
  EXPECT_EQ(g32.row_chunks, 2);
  EXPECT_EQ(g32.parallelism, 132 / 2);
  EXPECT_EQ(row_chunks(shape(DType::kF32, DType::kF32, 128, 8, 3)), 2);
  // Three rows: group 3, or group 1 with three query tokens.
  EXPECT_TRUE(use_mma(shape(DType::kF32, DType::kF32, 64, 3, 1)));
  EXPECT_TRUE(use_mma(shape(DType::kF32, DType::kF32, 96, 1, 3)));
  // One row tile per CTA: never the wide build.
  EXPECT_FALSE(use_wide(shape(DType::kF32, DType::kF32, 128, 8, 8)));
}

TEST(KernelChoice, F32CacheRunsOnTheCudaCoresElsewhere) {
  // One or two rows per kv head, head dims without a tf32 kernel, q in another dtype.
  for (const CallShape& s :
       {shape(DType::kF32, DType::kF32, 128, 1, 1), shape(DType::kF32, DType::kF32, 128, 2, 1),
        shape(DType::kF32, DType::kF32, 80, 8, 1), shape(DType::kF32, DType::kF32, 256, 8, 1),
        shape(DType::kBF16, DType::kF32, 128, 8, 1)}) {
    EXPECT_FALSE(use_mma(s));
    const KernelChoice k = choose_split_kernel(s, facts(4, 5));
    expect_build(k, false, false, false);
    EXPECT_EQ(k.rows_per_cta, kSimtRowsPerCta);
    EXPECT_EQ(k.ctas_per_sm, 4);
  }
}

TEST(KernelChoice, CudaCoresStandInWhereTheTf32BuildDoesNotFit) {
  const CallShape s = shape(DType::kF32, DType::kF32, 128, 32, 1);
  KernelFacts f = facts(0, 0);  // sm_86: the tf32 build needs more than 99 KB
  f.simt = {3, 50000};
  EXPECT_TRUE(simt_stands_in(s, f));
  const KernelChoice k = choose_split_kernel(s, f);
  expect_build(k, false, false, false);
  EXPECT_EQ(k.rows_per_cta, kSimtRowsPerCta);
  EXPECT_EQ(k.row_chunks, 2);  // 32 rows in chunks of 16
  EXPECT_EQ(k.ctas_per_sm, 3);
  EXPECT_EQ(k.smem_bytes, 50000);
  EXPECT_EQ(k.parallelism, 132 * 3 / 2);
  // Only for f32, and only where the tf32 build does not fit.
  f.plain = {1, 150000};
  EXPECT_FALSE(simt_stands_in(s, f));
  EXPECT_FALSE(simt_stands_in(shape(DType::kBF16, DType::kBF16, 128, 8, 1), facts(0, 0)));
}

TEST(KernelChoice, MultiTokenRowsTakeTheWideBuild) {
  const KernelChoice k =
      choose_split_kernel(shape(DType::kBF16, DType::kBF16, 128, 8, 8), facts(2, 3));
  expect_build(k, true, true, false);
  EXPECT_EQ(k.row_chunks, 1);  // 64 rows
  EXPECT_EQ(k.ctas_per_sm, 2);
  // 8 tokens x group 16: 128 rows in two chunks of 64.
  const KernelChoice g16 =
      choose_split_kernel(shape(DType::kBF16, DType::kBF16, 128, 16, 8), facts(2, 3));
  EXPECT_TRUE(g16.build.wide);
  EXPECT_EQ(g16.row_chunks, 2);
  EXPECT_EQ(g16.parallelism, 132 * 2 / 2);
  // More than 16 rows: 4 x 5 = 20, 17 x 1.
  EXPECT_TRUE(use_wide(shape(DType::kF16, DType::kF16, 64, 5, 4)));
  EXPECT_TRUE(use_wide(shape(DType::kF16, DType::kF16, 96, 1, 17)));
  // 16 rows or fewer, one query token, or a head dim without a wide build: the plain build.
  EXPECT_FALSE(use_wide(shape(DType::kBF16, DType::kBF16, 128, 8, 2)));
  EXPECT_FALSE(use_wide(shape(DType::kBF16, DType::kBF16, 128, 32, 1)));
  EXPECT_FALSE(use_wide(shape(DType::kBF16, DType::kBF16, 192, 8, 8)));
  EXPECT_FALSE(use_wide(shape(DType::kBF16, DType::kBF16, 256, 8, 8)));
  EXPECT_TRUE(use_wide(shape(DType::kBF16, DType::kBF16, 64, 8, 8)));
}

TEST(KernelChoice, QuantizedTakesTheTensorCoresWithA16BitQAtHeadDimsOf32) {
  EXPECT_TRUE(use_mma(shape(DType::kBF16, DType::kFP8E4M3, 96, 4, 1)));
  EXPECT_TRUE(use_mma(shape(DType::kF16, DType::kFP8E5M2, 64, 4, 1)));
  EXPECT_TRUE(use_mma(shape(DType::kBF16, DType::kInt8, 128, 8, 1)));
  EXPECT_FALSE(use_mma(shape(DType::kBF16, DType::kInt8, 80, 4, 1)));
  EXPECT_FALSE(use_mma(shape(DType::kF32, DType::kInt8, 128, 4, 1)));
  // Per-token scales: the plain tensor-core build with the scales' pipeline, never dense or wide.
  CallShape token_scaled = shape(DType::kBF16, DType::kInt8, 128, 8, 4);
  token_scaled.token_scales = true;
  EXPECT_TRUE(use_mma(token_scaled));
  EXPECT_FALSE(use_wide(token_scaled));
  const KernelChoice ts = choose_split_kernel(token_scaled, facts(2, 3));
  EXPECT_TRUE(ts.build.mma && ts.build.token_scales);
  EXPECT_FALSE(ts.build.wide || ts.build.dense);
  EXPECT_LE(ts.ctas_per_sm, 2);  // the plain build's CTAs, or one fewer
  // As for fp8 without token scales: 256 (sequence, kv head) pairs of one 4096-token item
  // each would leave a third of three CTAs' 396 slots empty, so one fewer per SM is planned.
  CallShape pairs256 = fp8_shape(DType::kInt8, 32, 4096);
  pairs256.token_scales = true;
  const KernelChoice fewer = choose_split_kernel(pairs256, facts(3, 3));
  EXPECT_TRUE(fewer.build.token_scales);
  EXPECT_FALSE(fewer.build.dense);
  EXPECT_EQ(fewer.ctas_per_sm, 2);
  EXPECT_FALSE(candidate_build(shape(DType::kBF16, DType::kInt8, 128, 8, 4)).token_scales);
  token_scaled.q_dtype = DType::kF32;  // the CUDA cores, which read the scales at run time
  EXPECT_FALSE(candidate_build(token_scaled).token_scales);
  EXPECT_TRUE(p_needs_lo(DType::kInt8, DType::kF32));
  EXPECT_FALSE(p_needs_lo(DType::kInt8, DType::kF16));
  EXPECT_FALSE(use_mma(shape(DType::kBF16, DType::kFP8E4M3, 80, 4, 1)));
  EXPECT_FALSE(use_mma(shape(DType::kBF16, DType::kFP8E5M2, 112, 4, 1)));
  const KernelChoice f32q =
      choose_split_kernel(shape(DType::kF32, DType::kFP8E5M2, 128, 4, 1), facts(2, 3));
  EXPECT_FALSE(f32q.build.mma);
  EXPECT_FALSE(f32q.build.dense);
  EXPECT_EQ(f32q.ctas_per_sm, 2);
}

// 1 x 32768 tokens at 8 kv heads: 8 pairs. Three CTAs per SM make 396 slots, 49 items per pair,
// 392 items (fill 392 / 396); two make 264 slots, 33 per pair, fill 1. 0.99 >= 1 - 0.1: the most.
TEST(KernelChoice, Fp8TakesTheDenseBuildWhereItFitsMoreAndFills) {
  const CallShape s = fp8_shape(DType::kFP8E5M2, 1, 32768);
  const WaveFill dense = wave_fill(s, 132, 3, 1);
  EXPECT_DOUBLE_EQ(dense.waves, 392.0 / 396.0);
  EXPECT_DOUBLE_EQ(dense.fill, 392.0 / 396.0);
  EXPECT_EQ(dense.item_tokens, 32768 / 49);
  EXPECT_DOUBLE_EQ(wave_fill(s, 132, 2, 1).fill, 1.0);
  EXPECT_TRUE(dense_pays(s, 132, 2, 3));
  const KernelChoice k = choose_split_kernel(s, facts(2, 3));
  EXPECT_TRUE(k.build.mma);
  EXPECT_TRUE(k.build.dense);
  EXPECT_EQ(k.ctas_per_sm, 3);
  EXPECT_EQ(k.waves, 1);
  EXPECT_EQ(k.smem_bytes, 30000);  // the dense build's
  EXPECT_EQ(k.parallelism, 396);
  // Where the plain build fits as many CTAs, the most is the plain build's own.
  const KernelChoice same = choose_split_kernel(s, facts(3, 3));
  EXPECT_FALSE(same.build.dense);
  EXPECT_EQ(same.ctas_per_sm, 3);
  EXPECT_EQ(same.smem_bytes, 40000);
  // And where the dense build fits fewer, it is never taken.
  const KernelChoice fewer = choose_split_kernel(s, facts(3, 2));
  EXPECT_FALSE(fewer.build.dense);
  EXPECT_EQ(fewer.ctas_per_sm, 3);
}

// 32 x 4096 tokens at 8 kv heads: 256 pairs of 16 minimum chunks each. One wave of three CTAs:
// 256 items for 396 slots (fill 0.65) against 256 for 264 (0.97): not within 0.1. Two waves of
// three: 3 items per pair, 768 for 792 slots (fill 0.97), but of 1365 tokens, under 4096: one
// fewer, the plain build at two CTAs.
TEST(KernelChoice, Fp8TakesOneCtaFewerWhereTheMostLeavesSlotsEmpty) {
  const CallShape s = fp8_shape(DType::kFP8E5M2, 32, 4096);
  EXPECT_DOUBLE_EQ(wave_fill(s, 132, 3, 1).fill, 256.0 / 396.0);
  EXPECT_DOUBLE_EQ(wave_fill(s, 132, 2, 1).fill, 256.0 / 264.0);
  EXPECT_FALSE(dense_pays(s, 132, 2, 3));
  const WaveFill two = wave_fill(s, 132, 3, 2);
  EXPECT_DOUBLE_EQ(two.fill, 768.0 / 792.0);
  EXPECT_EQ(two.item_tokens, 4096 / 3);
  EXPECT_FALSE(two_dense_waves_pay(s, 132, 3));
  const KernelChoice k = choose_split_kernel(s, facts(2, 3));
  EXPECT_FALSE(k.build.dense);
  EXPECT_EQ(k.ctas_per_sm, 2);
  EXPECT_EQ(k.waves, 1);
  EXPECT_EQ(k.smem_bytes, 40000);
  EXPECT_EQ(k.parallelism, 264);
  // With as many CTAs of the plain build as of the dense one, the plain build one CTA short.
  const KernelChoice same = choose_split_kernel(s, facts(3, 3));
  EXPECT_FALSE(same.build.dense);
  EXPECT_EQ(same.ctas_per_sm, 2);
  // The launch is told to keep the third CTA that fits off each SM.
  EXPECT_EQ(same.build.resident_ctas, 2);
  EXPECT_EQ(k.build.resident_ctas, 2);
  // One fewer than one CTA per SM is none: the most.
  const KernelChoice one = choose_split_kernel(s, facts(1, 1));
  EXPECT_EQ(one.ctas_per_sm, 1);
}

// 32 x 16384 tokens: as above, but the two-wave items hold 16384 / 3 = 5461 tokens: two waves of
// the most.
TEST(KernelChoice, Fp8PlansTwoWavesOfTheMostForLongItems) {
  const CallShape s = fp8_shape(DType::kFP8E4M3, 32, 16384);
  EXPECT_FALSE(dense_pays(s, 132, 2, 3));
  EXPECT_EQ(wave_fill(s, 132, 3, 2).item_tokens, 5461);
  EXPECT_TRUE(two_dense_waves_pay(s, 132, 3));
  const KernelChoice k = choose_split_kernel(s, facts(2, 3));
  EXPECT_TRUE(k.build.dense);
  EXPECT_EQ(k.ctas_per_sm, 3);
  EXPECT_EQ(k.waves, 2);
  EXPECT_EQ(k.parallelism, 132 * 3 * 2);
  const KernelChoice same = choose_split_kernel(s, facts(3, 3));
  EXPECT_FALSE(same.build.dense);
  EXPECT_EQ(same.ctas_per_sm, 3);
  EXPECT_EQ(same.waves, 2);
}

// 128 x 1024 tokens at 8 kv heads: 1024 pairs for 396 slots, 2.6 waves: the most.
TEST(KernelChoice, Fp8TakesTheMostOverTwoWavesOfPairs) {
  const CallShape s = fp8_shape(DType::kFP8E4M3, 128, 1024);
  EXPECT_DOUBLE_EQ(wave_fill(s, 132, 3, 1).waves, 1024.0 / 396.0);
  EXPECT_TRUE(dense_pays(s, 132, 2, 3));
  const KernelChoice k = choose_split_kernel(s, facts(2, 3));
  EXPECT_TRUE(k.build.dense);
  EXPECT_EQ(k.ctas_per_sm, 3);
  EXPECT_EQ(k.waves, 1);
}

// H100's shared memory: 228 KB per SM, 1 KB reserved per CTA, 227 KB at most per CTA. A kernel
// of 40,000 bytes fits five CTAs (5 x 41,024 = 205,120); padded for two, a third does not fit.
TEST(KernelChoice, SharedMemoryPaddedToCapResidency) {
  constexpr SmemFacts h100{233472, 1024, 232448};
  const auto fits = [&](int smem) { return h100.per_sm / (smem + h100.reserved_per_cta); };
  EXPECT_EQ(fits(40000), 5);
  for (int ctas = 1; ctas < 5; ++ctas) {
    const int s = shared_memory_for_residency(h100, 40000, ctas);
    SCOPED_TRACE(ctas);
    EXPECT_EQ(fits(s), ctas);
    EXPECT_EQ(fits(s - 1), ctas + 1);  // the smallest such size
  }
  // A kernel that already takes more than that keeps its own size; none holds zero CTAs.
  EXPECT_EQ(shared_memory_for_residency(h100, 100000, 2), 100000);
  EXPECT_EQ(shared_memory_for_residency(h100, 40000, 0), 0);
  // Where one CTA per SM would need more than one CTA may ask for, there is no such size.
  constexpr SmemFacts tight{102400, 1024, 40000};
  EXPECT_EQ(shared_memory_for_residency(tight, 30000, 1), 0);
}

TEST(KernelChoice, OnlyThePlainFp8TensorCoreBuildWeighsTheDenseOne) {
  // The same shapes as the dense choice above on a bf16 cache, or on the wide build: no dense.
  CallShape bf16 = fp8_shape(DType::kFP8E5M2, 1, 32768);
  bf16.k_dtype = DType::kBF16;
  const KernelChoice k16 = choose_split_kernel(bf16, facts(2, 3));
  EXPECT_FALSE(k16.build.dense);
  EXPECT_EQ(k16.ctas_per_sm, 2);
  CallShape wide = fp8_shape(DType::kFP8E5M2, 1, 32768);
  wide.group = 8;
  wide.q_len = 8;
  EXPECT_FALSE(weighs_dense(wide, candidate_build(wide), {2, 40000}));
  const KernelChoice kw = choose_split_kernel(wide, facts(2, 3));
  EXPECT_TRUE(kw.build.wide);
  EXPECT_FALSE(kw.build.dense);
  EXPECT_EQ(kw.ctas_per_sm, 2);
  // A plain build that fits nowhere: nothing to weigh, no CTA (the caller reports it).
  const CallShape s = fp8_shape(DType::kFP8E5M2, 1, 32768);
  EXPECT_TRUE(weighs_dense(s, candidate_build(s), {2, 40000}));
  EXPECT_FALSE(weighs_dense(s, candidate_build(s), {0, 240000}));
  const KernelChoice none = choose_split_kernel(s, facts(0, 3));
  EXPECT_EQ(none.ctas_per_sm, 0);
  EXPECT_FALSE(none.build.dense);
}

TEST(KernelChoice, PlanOptionsAndCallShape) {
  KernelChoice k;
  k.parallelism = 396;
  const PlanOptions o = plan_options(k, 100);
  EXPECT_EQ(o.parallelism, 396);
  EXPECT_EQ(o.min_chunk_tokens, 256);
  EXPECT_TRUE(o.even_waves);
  EXPECT_EQ(o.max_splits_per_seq, 1024);
  EXPECT_EQ(o.window_left, 100);
  EXPECT_FALSE(o.single_split);

  DecodeArgs a;
  a.q_dtype = DType::kF16;
  a.k_dtype = DType::kFP8E4M3;
  a.head_dim = 96;
  a.num_heads = 32;
  a.num_kv_heads = 8;
  a.batch = 5;
  a.block_size = 32;
  a.max_blocks_per_seq = 7;
  a.max_q_len = 6;
  CallShape s = call_shape(a);
  EXPECT_EQ(s.q_dtype, DType::kF16);
  EXPECT_EQ(s.k_dtype, DType::kFP8E4M3);
  EXPECT_EQ(s.head_dim, 96);
  EXPECT_EQ(s.group, 4);
  EXPECT_EQ(s.q_len, 1);  // one query token without q_indptr
  EXPECT_EQ(s.batch, 5);
  EXPECT_EQ(s.num_kv_heads, 8);
  EXPECT_EQ(s.block_size, 32);
  EXPECT_EQ(s.max_blocks, 7);
  const std::int32_t indptr[6] = {};
  a.q_indptr = indptr;
  EXPECT_EQ(call_shape(a).q_len, 6);
}

// The Hopper many-row kernel serves 16-bit caches with q and a P-rounding out in their dtype at
// head dim 128, whole TMA boxes (block sizes 16 to 256, powers of two), no soft-cap or ALiBi and
// at least kManyRowsMinRows rows per kv head.
TEST(KernelChoice, ManyRowsServesItsCallsOnly) {
  CallShape s = shape(DType::kBF16, DType::kBF16, 128, 8, 4);  // 32 rows
  s.out_dtype = DType::kBF16;
  EXPECT_TRUE(many_rows_serves(s));
  CallShape t = s;
  t.q_len = 3;  // 24 rows
  EXPECT_FALSE(many_rows_serves(t));
  t = s;
  t.group = 64;
  t.q_len = 1;
  EXPECT_TRUE(many_rows_serves(t));
  for (int bs : {8, 48, 512}) {
    t = s;
    t.block_size = bs;
    EXPECT_FALSE(many_rows_serves(t)) << "block size " << bs;
  }
  for (int bs : {16, 32, 64, 128, 256}) {
    t = s;
    t.block_size = bs;
    EXPECT_TRUE(many_rows_serves(t)) << "block size " << bs;
  }
  t = s;
  t.out_dtype = DType::kF32;  // P needs its lo part
  EXPECT_FALSE(many_rows_serves(t));
  t = s;
  t.out_dtype = DType::kF16;  // an f16 out from a bf16 cache: the same
  EXPECT_FALSE(many_rows_serves(t));
  t = s;
  t.logit_variant = true;
  EXPECT_FALSE(many_rows_serves(t));
  t = s;
  t.head_dim = 64;
  EXPECT_FALSE(many_rows_serves(t));
  t = shape(DType::kF16, DType::kF16, 128, 8, 4);
  t.out_dtype = DType::kBF16;  // f16 P under a bf16 out's rounding
  EXPECT_TRUE(many_rows_serves(t));
  t = shape(DType::kBF16, DType::kFP8E4M3, 128, 8, 4);
  t.out_dtype = DType::kBF16;
  EXPECT_FALSE(many_rows_serves(t));
}

TEST(KernelChoice, ManyRowsTakenWhereTheDeviceHasIt) {
  CallShape s = shape(DType::kBF16, DType::kBF16, 128, 8, 8);  // 64 rows
  s.out_dtype = DType::kBF16;
  KernelFacts f = facts(2, 0);
  KernelChoice k = choose_split_kernel(s, f);
  EXPECT_FALSE(k.build.hopper);  // no many-row kernel on this device
  EXPECT_TRUE(k.build.wide);
  f.many_rows = {2, 114848};
  k = choose_split_kernel(s, f);
  EXPECT_TRUE(k.build.hopper);
  EXPECT_TRUE(k.build.mma);
  EXPECT_FALSE(k.build.wide);
  EXPECT_EQ(k.rows_per_cta, kMmaRowsPerCta);
  EXPECT_EQ(k.row_chunks, 1);
  EXPECT_EQ(k.ctas_per_sm, 2);
  EXPECT_EQ(k.smem_bytes, 114848);
  EXPECT_EQ(k.parallelism, 132 * 2);
  s.q_len = 16;  // 128 rows: two row chunks
  k = choose_split_kernel(s, f);
  EXPECT_TRUE(k.build.hopper);
  EXPECT_EQ(k.row_chunks, 2);
  EXPECT_EQ(k.parallelism, 132);
}

}  // namespace
}  // namespace pagedattn::detail::cuda
