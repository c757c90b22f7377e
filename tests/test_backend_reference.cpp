// Each backend against the f64 reference on a parametrized grid: dtype x head_dim x block_size x
// GQA group x context, fragmented tables over an oversized pool, -1 and garbage past each
// context, NaN in every slot no sequence may read, and mixed context lengths in one batch.
// The CUDA rows skip where no device is present.
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "gtest_printers.hpp"
#include "pagedattn/testing/random_case.hpp"
#include "reference_check.hpp"
#include "test_seed.hpp"

namespace pagedattn {
namespace {

enum class Ctx { kZero, kOne, kBlockMinus1, kBlock, kBlockPlus1, kThousand };
const char* ctx_name(Ctx c) {
  switch (c) {
    case Ctx::kZero:
      return "0";
    case Ctx::kOne:
      return "1";
    case Ctx::kBlockMinus1:
      return "BSm1";
    case Ctx::kBlock:
      return "BS";
    case Ctx::kBlockPlus1:
      return "BSp1";
    case Ctx::kThousand:
      return "1000";
  }
  return "?";
}
int ctx_len(Ctx c, int bs) {
  switch (c) {
    case Ctx::kZero:
      return 0;
    case Ctx::kOne:
      return 1;
    case Ctx::kBlockMinus1:
      return bs - 1;
    case Ctx::kBlock:
      return bs;
    case Ctx::kBlockPlus1:
      return bs + 1;
    case Ctx::kThousand:
      return 1000;
  }
  return 0;
}

// Readable parameter values in test listings.
void PrintTo(Ctx c, std::ostream* os) { *os << "ctx " << ctx_name(c); }

// A grid row's case, f32 until the caller sets the dtypes: the length under test next to other
// lengths in the same batch (L, 37, L, 0), each sequence's blocks scattered over a pool with spare
// blocks and a padded table.
testing::CaseSpec grid_spec(int num_heads, int num_kv_heads, int head_dim, int block_size,
                            Ctx ctx) {
  const int L = ctx_len(ctx, block_size);
  testing::CaseSpec spec = testing::shaped_spec(DType::kF32, num_heads, num_kv_heads, head_dim,
                                                block_size, {L, 37, L, 0});
  spec.spare_blocks = 5;
  spec.table_padding = 2;
  spec.seed = testing::seed_for_test();
  return spec;
}

void run_and_check(const testing::CaseSpec& spec, Backend backend) {
  testing::HostCase c = testing::make_case(spec);
  DecodeOptions o;
  o.backend = backend;
  testing::run_decode(c, o);
  testing::expect_matches_reference(c);
}

// group: query heads per kv head; 0 means every head on one kv head (MQA with 16 heads).
using Param = std::tuple<Backend, DType, int /*head_dim*/, int /*block_size*/, int /*group*/, Ctx>;

class BackendReferenceTest : public ::testing::TestWithParam<Param> {};

TEST_P(BackendReferenceTest, MatchesTheReference) {
  const auto [backend, dtype, head_dim, block_size, group, ctx] = GetParam();
  if (backend == Backend::kCuda && !cuda_available()) GTEST_SKIP() << "no CUDA device";
  const bool mqa = group == 0;
  testing::CaseSpec spec = grid_spec(mqa ? 16 : 2 * group, mqa ? 1 : 2, head_dim, block_size, ctx);
  spec.q_dtype = spec.kv_dtype = spec.out_dtype = dtype;
  spec.table_stride_extra = 3;
  run_and_check(spec, backend);
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  const auto [backend, dtype, head_dim, block_size, group, ctx] = info.param;
  return std::string(backend_name(backend)) + "_" + dtype_name(dtype) + "_d" +
         std::to_string(head_dim) + "_bs" + std::to_string(block_size) + "_g" +
         (group == 0 ? std::string("all") : std::to_string(group)) + "_ctx" + ctx_name(ctx);
}

INSTANTIATE_TEST_SUITE_P(
    Grid, BackendReferenceTest,
    ::testing::Combine(::testing::Values(Backend::kCpu, Backend::kCuda),
                       ::testing::Values(DType::kF32, DType::kF16, DType::kBF16),
                       ::testing::Values(64, 80, 128, 256), ::testing::Values(1, 7, 16, 32),
                       ::testing::Values(1, 4, 8, 0),
                       ::testing::Values(Ctx::kZero, Ctx::kOne, Ctx::kBlockMinus1, Ctx::kBlock,
                                         Ctx::kBlockPlus1, Ctx::kThousand)),
    param_name);

// The head dims and GQA groups the main grid leaves out (96, 112, 192; groups above 16), on a
// few lengths: every head dim with a kernel is checked against the reference.
INSTANTIATE_TEST_SUITE_P(Dims, BackendReferenceTest,
                         ::testing::Combine(::testing::Values(Backend::kCpu, Backend::kCuda),
                                            ::testing::Values(DType::kF32, DType::kBF16),
                                            ::testing::Values(96, 112, 192), ::testing::Values(16),
                                            ::testing::Values(4, 24, 64),
                                            ::testing::Values(Ctx::kBlockPlus1, Ctx::kThousand)),
                         param_name);

// Head dim 512 (the global layers of Gemma-style models) on the CPU only: the CUDA backend has no
// kernel for it yet (its refusal: test_cuda_decode.cpp). GQA groups 1 to 16 (8 and 16 with a bf16
// q and cache take the AMX tiles where there are any), blocks of 1 and 16 tokens, and a context
// past many blocks.
INSTANTIATE_TEST_SUITE_P(D512, BackendReferenceTest,
                         ::testing::Combine(::testing::Values(Backend::kCpu),
                                            ::testing::Values(DType::kF32, DType::kF16,
                                                              DType::kBF16),
                                            ::testing::Values(512), ::testing::Values(1, 16),
                                            ::testing::Values(1, 4, 8, 16),
                                            ::testing::Values(Ctx::kBlockPlus1, Ctx::kThousand)),
                         param_name);

// Quantized caches (fp8 and int8 codes of the values / k_scale, v_scale, per kv head too) read
// with f32, f16 or bf16 q and out: the reference dequantizes exactly, so the error is the backends'
// f32 arithmetic.
using Fp8Param = std::tuple<Backend, DType /*cache*/, DType /*q, out*/, int /*head_dim*/,
                            int /*block_size*/, int /*group*/, Ctx>;

// Per-head scales on the longer contexts (a block plus one, 1000), per-tensor alone on the rest:
// both kinds on every dtype, head dim, block size and group, at half the rows of crossing them.
bool per_head_scales(Ctx ctx) { return ctx == Ctx::kBlockPlus1 || ctx == Ctx::kThousand; }

class Fp8ReferenceTest : public ::testing::TestWithParam<Fp8Param> {};

TEST_P(Fp8ReferenceTest, MatchesTheReference) {
  const auto [backend, cache, dtype, head_dim, block_size, group, ctx] = GetParam();
  if (backend == Backend::kCuda && !cuda_available()) GTEST_SKIP() << "no CUDA device";
  testing::CaseSpec spec = grid_spec(2 * group, 2, head_dim, block_size, ctx);
  spec.q_dtype = spec.out_dtype = dtype;
  spec.kv_dtype = cache;
  spec.k_scale = 0.0625f;  // codes of 16 x the values
  spec.v_scale = 3.f;
  spec.per_head_scales = per_head_scales(ctx);
  run_and_check(spec, backend);
}

std::string fp8_param_name(const ::testing::TestParamInfo<Fp8Param>& info) {
  const auto [backend, cache, dtype, head_dim, block_size, group, ctx] = info.param;
  return std::string(backend_name(backend)) + "_" + dtype_name(cache) + "_" + dtype_name(dtype) +
         "_d" + std::to_string(head_dim) + "_bs" + std::to_string(block_size) + "_g" +
         std::to_string(group) + "_ctx" + ctx_name(ctx) + (per_head_scales(ctx) ? "_perhead" : "");
}

INSTANTIATE_TEST_SUITE_P(
    Grid, Fp8ReferenceTest,
    ::testing::Combine(::testing::Values(Backend::kCpu, Backend::kCuda),
                       ::testing::Values(DType::kFP8E4M3, DType::kFP8E5M2),
                       ::testing::Values(DType::kF32, DType::kF16, DType::kBF16),
                       ::testing::Values(64, 128), ::testing::Values(1, 16),
                       ::testing::Values(1, 8),
                       ::testing::Values(Ctx::kZero, Ctx::kOne, Ctx::kBlockPlus1, Ctx::kThousand)),
    fp8_param_name);

// int8 caches on the same grid (head dim 80 as well: the CUDA cores' 8-bit loads, an odd number
// of codes per lane).
INSTANTIATE_TEST_SUITE_P(
    Int8Grid, Fp8ReferenceTest,
    ::testing::Combine(::testing::Values(Backend::kCpu, Backend::kCuda),
                       ::testing::Values(DType::kInt8),
                       ::testing::Values(DType::kF32, DType::kF16, DType::kBF16),
                       ::testing::Values(64, 80, 128), ::testing::Values(1, 16),
                       ::testing::Values(1, 8),
                       ::testing::Values(Ctx::kZero, Ctx::kOne, Ctx::kBlockPlus1, Ctx::kThousand)),
    fp8_param_name);

// fp8 caches at head dim 512, CPU only (as D512 above).
INSTANTIATE_TEST_SUITE_P(D512, Fp8ReferenceTest,
                         ::testing::Combine(::testing::Values(Backend::kCpu),
                                            ::testing::Values(DType::kFP8E4M3, DType::kFP8E5M2),
                                            ::testing::Values(DType::kF32, DType::kBF16),
                                            ::testing::Values(512), ::testing::Values(1, 16),
                                            ::testing::Values(1, 8),
                                            ::testing::Values(Ctx::kBlockPlus1, Ctx::kThousand)),
                         fp8_param_name);

}  // namespace
}  // namespace pagedattn
