// The spec of a case over a quantized cache, shared by the int8 and per-token scale tests.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "pagedattn/dtype.hpp"
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

}  // namespace pagedattn
