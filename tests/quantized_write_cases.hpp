// What the int8 and int4 write tests share: the decode of rows written into a quantized cache
// against the decode of the same rows unquantized.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "pagedattn/cache_ops.hpp"
#include "pagedattn/dtype.hpp"
#include "pagedattn/pagedattn.hpp"
#include "pagedattn/reference.hpp"
#include "pagedattn/testing/cache_op_args.hpp"

namespace pagedattn {

// The error a format adds, as max |error| / max |out|: 200 tokens, 8 heads over 2 kv heads, head
// dim 128, blocks of 16, written into a `cache` pool by write_cache and decoded on the CPU, against
// the decode of the same rows written in f32. With `outliers`, one channel 20x the others in every
// seventh row. With `token_scales`, the rows' own scales (per token, or per group of 32 in int4);
// without, one scale per tensor that maps the largest |x| of K onto the top code.
inline double written_decode_error(DType cache, std::uint64_t seed, bool token_scales = true,
                                   bool outliers = true) {
  const int L = 200, H = 8, KV = 2, D = 128, BS = 16, blocks = (L + BS - 1) / BS;
  const CacheOpOptions cpu{Backend::kCpu, 2};
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> key(std::size_t{L} * KV * D), value(key.size()), q(std::size_t{H} * D);
  for (std::size_t i = 0; i < key.size(); ++i) {
    const float outlier = outliers && (i / D) % 7 == 0 && i % D == 5 ? 20.f : 1.f;
    key[i] = dist(rng) * outlier;
    value[i] = dist(rng) * outlier;
  }
  for (float& x : q) x = dist(rng);
  std::vector<std::int32_t> slots(L), table(blocks), lens = {L};
  for (int t = 0; t < L; ++t) slots[t] = t;
  for (int b = 0; b < blocks; ++b) table[b] = b;
  const std::size_t rows = std::size_t{blocks} * KV * BS;
  const int per_row = token_scales_per_row(cache, D);
  std::vector<float> exact_k(rows * D), exact_v(rows * D), ks(rows * per_row), vs(ks.size());
  std::vector<std::uint8_t> k(static_cast<std::size_t>(dtype_bytes(cache, rows * D))), v(k.size());
  auto exact = testing::pool_args<CacheWriteArgs>(KV, D, BS, blocks, exact_k.data(), exact_v.data(),
                                                  DType::kF32);
  exact.num_tokens = L;
  exact.key = key.data();
  exact.value = value.data();
  exact.slot_mapping = slots.data();
  write_cache(exact, cpu);
  CacheWriteArgs w = exact;
  w.k_cache = k.data();
  w.v_cache = v.data();
  w.cache_dtype = cache;
  if (token_scales) {
    w.k_token_scales = ks.data();
    w.v_token_scales = vs.data();
  } else {
    float amax = 0;
    for (float x : key) amax = std::max(amax, std::fabs(x));
    w.k_scale = w.v_scale = amax / max_code_magnitude(cache);
  }
  write_cache(w, cpu);
  DecodeArgs a;
  a.batch = 1;
  a.num_heads = H;
  a.num_kv_heads = KV;
  a.head_dim = D;
  a.block_size = BS;
  a.num_blocks = blocks;
  a.max_blocks_per_seq = blocks;
  a.q = q.data();
  a.k_cache = exact_k.data();
  a.v_cache = exact_v.data();
  a.block_table = table.data();
  a.context_lens = lens.data();
  const ReferenceResult want = reference_decode(a);
  a.k_cache = k.data();
  a.v_cache = v.data();
  a.k_dtype = a.v_dtype = cache;
  a.k_scale = w.k_scale;
  a.v_scale = w.v_scale;
  a.k_token_scales = w.k_token_scales;
  a.v_token_scales = w.v_token_scales;
  std::vector<float> out(std::size_t{H} * D);
  a.out = out.data();
  decode(a, DecodeOptions{Backend::kCpu, 2});
  double err = 0, scale = 1e-30;
  for (std::size_t i = 0; i < out.size(); ++i) {
    err = std::max(err, std::fabs(out[i] - want.out[i]));
    scale = std::max(scale, std::fabs(want.out[i]));
  }
  return err / scale;
}

}  // namespace pagedattn
