// The spec of a case over a quantized cache, and its per-token scales in the NHD order, shared by
// the int8 and per-token scale tests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "pagedattn/dtype.hpp"
#include "pagedattn/pagedattn.hpp"
#include "pagedattn/testing/random_case.hpp"

namespace pagedattn {

// A case of `cache` codes with per-tensor scales that spread the codes over the format's range
// (per-head scales too on even seeds; per-token scales where asked).
inline testing::CaseSpec quantized_spec(DType cache, DType q_and_out, int H, int KV, int D, int BS,
                                        std::vector<int> lens, bool token_scales,
                                        std::uint64_t seed) {
  testing::CaseSpec s = testing::shaped_spec(q_and_out, H, KV, D, BS, std::move(lens));
  s.kv_dtype = cache;
  s.k_scale = cache == DType::kInt8 ? 0.02f : 0.5f;
  s.v_scale = cache == DType::kInt8 ? 0.03f : 0.25f;
  s.per_head_scales = seed % 2 == 0;
  s.token_scales = token_scales;
  s.seed = seed;
  return s;
}

// A case's per-token scales (dense HND, [num_blocks][KV][BS]) in the order an NHD engine keeps
// them ([num_blocks][BS][KV]); args(c) is c.args() reading them through token_scale_strides.
struct NhdTokenScales {
  int KV = 0, BS = 0;
  std::vector<float> k, v;
  DecodeArgs args(testing::HostCase& c) const {
    DecodeArgs a = c.args();
    a.k_token_scales = k.data();
    a.v_token_scales = v.data();
    a.token_scale_strides = CacheStrides::nhd(KV, BS, 1);
    return a;
  }
};

inline NhdTokenScales nhd_token_scales(const testing::HostCase& c, int KV, int BS) {
  NhdTokenScales s{KV, BS, std::vector<float>(c.k_token_scales.size()),
                   std::vector<float>(c.v_token_scales.size())};
  for (int blk = 0; blk < c.num_blocks; ++blk) {
    for (int kv = 0; kv < KV; ++kv) {
      for (int t = 0; t < BS; ++t) {
        const std::size_t hnd = (static_cast<std::size_t>(blk) * KV + kv) * BS + t;
        const std::size_t nhd = (static_cast<std::size_t>(blk) * BS + t) * KV + kv;
        s.k[nhd] = c.k_token_scales[hnd];
        s.v[nhd] = c.v_token_scales[hnd];
      }
    }
  }
  return s;
}

}  // namespace pagedattn
