// The choice of split kernel (kernel_choice.hpp): plain arithmetic on shapes and device facts.
#include "kernel_choice.hpp"

#include <algorithm>

#include "pagedattn/cache_layout.hpp"

namespace pagedattn::detail::cuda {

CallShape call_shape(const DecodeArgs& a) {
  CallShape s{a.q_dtype, a.k_dtype,      a.head_dim,   a.group_size(),      a.q_len_bound(),
              a.batch,   a.num_kv_heads, a.block_size, a.max_blocks_per_seq};
  s.out_dtype = a.out_dtype;
  s.logit_variant = a.logits_soft_cap > 0.f || a.alibi_slopes != nullptr;
  s.token_scales = a.has_token_scales();
  return s;
}

bool use_mma(const CallShape& s) {
  const bool q16 = s.q_dtype == DType::kF16 || s.q_dtype == DType::kBF16;
  if (is_quantized(s.k_dtype)) return q16 && s.head_dim % 32 == 0;
  if (s.k_dtype == DType::kF32) {
    return s.q_dtype == DType::kF32 && s.head_dim % 32 == 0 && s.head_dim <= 128 &&
           std::int64_t{s.group} * s.q_len >= kTf32MinRows;
  }
  return (s.k_dtype == DType::kF16 || s.k_dtype == DType::kBF16) && s.q_dtype == s.k_dtype;
}

bool p_needs_lo(DType k_dtype, DType out_dtype) {
  const bool p_f16 = k_dtype == DType::kF16 || is_quantized(k_dtype);
  return !(out_dtype == DType::kBF16 || (out_dtype == DType::kF16 && p_f16));
}

bool many_rows_serves(const CallShape& s) {
  const bool q16 = s.k_dtype == DType::kF16 || s.k_dtype == DType::kBF16;
  const bool block_ok =
      s.block_size >= 16 && s.block_size <= 256 && (s.block_size & (s.block_size - 1)) == 0;
  return q16 && s.q_dtype == s.k_dtype && s.head_dim == 128 &&
         !p_needs_lo(s.k_dtype, s.out_dtype) && !s.logit_variant && block_ok &&
         std::int64_t{s.group} * s.q_len >= kManyRowsMinRows;
}

int rows_per_cta(const CallShape& s) {
  if (!use_mma(s)) return kSimtRowsPerCta;
  return s.k_dtype == DType::kF32 ? kTf32RowsPerCta : kMmaRowsPerCta;
}

bool simt_stands_in(const CallShape& s, const KernelFacts& f) {
  return s.k_dtype == DType::kF32 && use_mma(s) && f.plain.ctas_per_sm <= 0 &&
         f.simt.ctas_per_sm > 0;
}

int chunks_of_rows(const CallShape& s, int rows_per_cta) {
  const std::int64_t rows = static_cast<std::int64_t>(s.group) * s.q_len;
  return static_cast<int>((rows + rows_per_cta - 1) / rows_per_cta);
}

int row_chunks(const CallShape& s) { return chunks_of_rows(s, rows_per_cta(s)); }

bool use_wide(const CallShape& s) {
  const std::int64_t rows = static_cast<std::int64_t>(s.group) * s.q_len;
  return use_mma(s) && s.q_len > 1 && std::min<std::int64_t>(rows, rows_per_cta(s)) > 16 &&
         wide_head_dim(s.head_dim) && !s.token_scales;
}

SplitBuild candidate_build(const CallShape& s) {
  SplitBuild b;
  b.mma = use_mma(s);
  b.token_scales = b.mma && s.token_scales;
  b.wide = use_wide(s);
  return b;
}

bool weighs_dense(const CallShape& s, SplitBuild candidate, const BuildFacts& plain) {
  return plain.ctas_per_sm > 0 && candidate.mma && !candidate.wide && is_quantized(s.k_dtype);
}

WaveFill wave_fill(const CallShape& s, int sms, int ctas_per_sm, int plan_waves) {
  const std::int64_t slots =
      std::max<std::int64_t>(1, std::int64_t{sms} * ctas_per_sm / row_chunks(s));
  const std::int64_t pairs = std::max<std::int64_t>(1, std::int64_t{s.batch} * s.num_kv_heads);
  const std::int64_t min_chunk = blocks_for(kMinChunkTokens, s.block_size);
  const std::int64_t most = std::max<std::int64_t>(1, (s.max_blocks + min_chunk - 1) / min_chunk);
  const std::int64_t per_pair =
      std::min(most, std::max<std::int64_t>(1, plan_waves * slots / pairs));
  const std::int64_t items = pairs * per_pair;
  const std::int64_t waves = (items + slots - 1) / slots;
  return {static_cast<double>(items) / static_cast<double>(slots),
          static_cast<double>(items) / static_cast<double>(waves * slots),
          std::int64_t{s.max_blocks} * s.block_size / per_pair};
}

bool dense_pays(const CallShape& s, int sms, int fewer, int most) {
  const WaveFill dense = wave_fill(s, sms, most, 1);
  return dense.waves >= 2.0 || dense.fill >= wave_fill(s, sms, fewer, 1).fill - kDenseFillSlack;
}

bool two_dense_waves_pay(const CallShape& s, int sms, int most) {
  const WaveFill two = wave_fill(s, sms, most, 2);
  return two.fill >= kTwoWaveFill && two.item_tokens >= kTwoWaveItemTokens;
}

KernelChoice choose_split_kernel(const CallShape& s, const KernelFacts& f) {
  KernelChoice k;
  k.build = candidate_build(s);
  k.rows_per_cta = rows_per_cta(s);
  k.row_chunks = row_chunks(s);
  k.ctas_per_sm = f.plain.ctas_per_sm;
  k.smem_bytes = f.plain.smem_bytes;
  k.waves = kWaves;
  if (simt_stands_in(s, f)) {
    k.build = SplitBuild{};
    k.rows_per_cta = kSimtRowsPerCta;
    k.row_chunks = chunks_of_rows(s, kSimtRowsPerCta);
    k.ctas_per_sm = f.simt.ctas_per_sm;
    k.smem_bytes = f.simt.smem_bytes;
  } else if (many_rows_serves(s) && f.many_rows.ctas_per_sm > 0) {
    k.build.hopper = true;
    k.build.wide = false;
    k.ctas_per_sm = f.many_rows.ctas_per_sm;
    k.smem_bytes = f.many_rows.smem_bytes;
  } else if (weighs_dense(s, k.build, f.plain)) {
    // Whether the plain build fits as many CTAs as the dense one depends on the registers the
    // compiler gives it, so both are weighed from the facts.
    // The token-scale build has no dense build: its plain one is weighed against one fewer.
    const bool dense_fits_more = !k.build.token_scales && f.dense.ctas_per_sm > f.plain.ctas_per_sm;
    const int most = dense_fits_more ? f.dense.ctas_per_sm : f.plain.ctas_per_sm;
    const int fewer = dense_fits_more ? f.plain.ctas_per_sm : most - 1;
    const bool one_wave = fewer < 1 || dense_pays(s, f.sms, fewer, most);
    const bool two_waves = !one_wave && two_dense_waves_pay(s, f.sms, most);
    if (one_wave || two_waves) {
      k.build.dense = dense_fits_more;
      k.ctas_per_sm = most;
      if (dense_fits_more) k.smem_bytes = f.dense.smem_bytes;
      if (two_waves) k.waves = 2;
    } else {
      k.ctas_per_sm = fewer;
    }
  }
  k.parallelism = std::max(1, f.sms * k.ctas_per_sm * k.waves / k.row_chunks);
  k.build.resident_ctas = k.ctas_per_sm;
  return k;
}

PlanOptions plan_options(const KernelChoice& k, int window_left) {
  PlanOptions o;
  o.parallelism = k.parallelism;
  o.min_chunk_tokens = kMinChunkTokens;
  o.even_waves = true;
  o.max_splits_per_seq = kMaxSplitsPerSeq;
  o.window_left = window_left;
  return o;
}

}  // namespace pagedattn::detail::cuda
