// Every code of each fp8 format through a whole decode, as a value of V and as a value of K, on
// every backend, with f16 and bf16 q at every head dim: on the GPU this is the tensor-core path,
// whose fragments widen codes in an order of their own (cuda/fp8_frags.cuh), and the CUDA-core
// path at head dims that are not multiples of 32. Each case is built so the exact answer is known:
//  - V: a context of one token has weight 1, so out is that token's V row times v_scale, exactly.
//  - K: query head h is the unit vector of dim h, so its logit, and with one token its lse, is
//    code h of the token's K row times k_scale times the softmax scale: a code read into the wrong
//    dim, or a wrong value, shows at once.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "pagedattn/dtype.hpp"
#include "pagedattn/pagedattn.hpp"
#include "pagedattn/testing/random_case.hpp"

namespace pagedattn {
namespace {

float decode_code(DType t, std::uint8_t c) {
  return t == DType::kFP8E4M3 ? fp8_e4m3_to_float({c}) : fp8_e5m2_to_float({c});
}

using Param = std::tuple<Backend, DType /*cache*/, DType /*q*/, int /*head_dim*/>;
class Fp8EveryCode : public ::testing::TestWithParam<Param> {};

constexpr float kKScale = 0.5f, kVScale = 0.25f;  // powers of two: the products stay exact

// One sequence of context 1 per D codes, so that ceil(256 / D) sequences hold all 256: sequence b
// dim d holds code (b * D + d) % 256.
testing::HostCase one_token_case(DType cache, DType q, int head_dim, int heads, int kv_heads) {
  testing::CaseSpec spec;
  spec.batch = (256 + head_dim - 1) / head_dim + 1;  // the last sequence: see KAsUnitQueries
  spec.num_heads = heads;
  spec.num_kv_heads = kv_heads;
  spec.head_dim = head_dim;
  spec.block_size = 16;
  spec.context_lens.assign(spec.batch, 1);
  spec.q_dtype = q;
  spec.kv_dtype = cache;
  spec.out_dtype = DType::kF32;
  spec.k_scale = kKScale;
  spec.v_scale = kVScale;
  spec.seed = 7;
  return testing::make_case(spec);
}

// Where kv head kv of sequence b's token sits in the caches.
std::int64_t token_row(const testing::HostCase& c, int b, int kv = 0) {
  const CacheLayout l =
      CacheLayout::dense(c.num_blocks, c.spec.num_kv_heads, c.spec.block_size, c.spec.head_dim);
  return l.offset(c.block_table[static_cast<std::size_t>(b) * c.table_stride], kv, 0);
}

std::uint8_t code_of(int b, int d, int D) { return static_cast<std::uint8_t>((b * D + d) % 256); }

TEST_P(Fp8EveryCode, VComesOutExactly) {
  const auto [backend, cache, qt, D] = GetParam();
  if (backend == Backend::kCuda && !cuda_available()) GTEST_SKIP() << "no CUDA device";
  testing::HostCase c = one_token_case(cache, qt, D, 1, 1);
  const int B = c.spec.batch - 1;
  for (int b = 0; b <= B; ++b) {
    const std::int64_t row = token_row(c, b);
    for (int d = 0; d < D; ++d) {
      c.k[row + d] = 0;  // logit 0 whatever q holds
      c.v[row + d] = b < B ? code_of(b, d, D) : 0;
    }
  }
  DecodeOptions o;
  o.backend = backend;
  testing::run_decode(c, o);
  const float* out = reinterpret_cast<const float*>(c.out.data());
  for (int b = 0; b < B; ++b) {
    for (int d = 0; d < D; ++d) {
      const std::uint8_t code = code_of(b, d, D);
      const float want = decode_code(cache, code) * kVScale;
      const float got = out[static_cast<std::size_t>(b) * D + d];
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got)) << "code " << int(code) << " gave " << got;
      } else if (std::isinf(want)) {
        // An infinite V value meets the zero low part of P on the tensor cores (0 x Inf): Inf or
        // NaN, never a finite value.
        EXPECT_FALSE(std::isfinite(got)) << "code " << int(code) << " gave " << got;
      } else {
        EXPECT_EQ(got, want) << "code " << int(code) << " at dim " << d;
      }
    }
  }
}

TEST_P(Fp8EveryCode, KAsUnitQueries) {
  const auto [backend, cache, qt, D] = GetParam();
  if (backend == Backend::kCuda && !cuda_available()) GTEST_SKIP() << "no CUDA device";
  // One query head per dim, 16 per kv head (each kv head holds the same K row).
  testing::HostCase c = one_token_case(cache, qt, D, D, D / 16);
  const int B = c.spec.batch - 1;  // the last sequence holds a NaN code in dim 0 of K
  for (int b = 0; b <= B; ++b) {
    for (int h = 0; h < D; ++h) {
      for (int d = 0; d < D; ++d) {
        store_from_float(c.q.data(), qt, (static_cast<std::size_t>(b) * D + h) * D + d,
                         h == d ? 1.f : 0.f);
      }
    }
    for (int kv = 0; kv < D / 16; ++kv) {
      const std::int64_t row = token_row(c, b, kv);
      for (int d = 0; d < D; ++d) {
        std::uint8_t code = code_of(b, d, D);
        // q's zeros times a non-finite code would make every head's logit NaN: those codes go
        // to the last sequence's test alone.
        if (!std::isfinite(decode_code(cache, code))) code = 0;
        if (b == B) code = d == 0 ? 0xff : 0x38;  // NaN in both formats, then a finite code
        c.k[row + d] = code;
        c.v[row + d] = 0x38;  // finite: out is this row
      }
    }
  }
  DecodeOptions o;
  o.backend = backend;
  testing::run_decode(c, o);
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < D; ++h) {
      std::uint8_t code = code_of(b, h, D);
      if (!std::isfinite(decode_code(cache, code))) code = 0;
      const double want = static_cast<double>(decode_code(cache, code)) * kKScale * scale;
      const float got = c.lse[static_cast<std::size_t>(b) * D + h];
      EXPECT_NEAR(got, want, 2e-6 * std::fabs(want) + 1e-30)
          << "code " << int(code) << " read by head " << h;
    }
  }
  for (int h = 0; h < D; ++h) {
    EXPECT_TRUE(std::isnan(c.lse[static_cast<std::size_t>(B) * D + h])) << "head " << h;
  }
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  const auto [backend, cache, q, D] = info.param;
  return std::string(backend_name(backend)) + "_" + dtype_name(cache) + "_q" + dtype_name(q) +
         "_d" + std::to_string(D);
}

INSTANTIATE_TEST_SUITE_P(All, Fp8EveryCode,
                         ::testing::Combine(::testing::Values(Backend::kCpu, Backend::kCuda),
                                            ::testing::Values(DType::kFP8E4M3, DType::kFP8E5M2),
                                            ::testing::Values(DType::kF16, DType::kBF16),
                                            ::testing::Values(64, 80, 96, 128, 256)),
                         param_name);

}  // namespace
}  // namespace pagedattn
