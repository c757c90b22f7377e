// The Hopper many-row kernel (cuda/hopper/): on an sm_90 device decode takes it for the calls it
// serves (cuda/kernel_choice.hpp, many_rows_serves) and not for the others; and what it computes
// matches the f64 reference over its block sizes, both 16-bit dtypes, full CTAs of rows and one
// with padding rows, contexts that end on and off tile and page boundaries, contexts split over
// several CTAs, windows and sinks, NaN in every slot no query may read, and unchecked mode's
// skipping of block ids outside the pool. Multi-token rows and the cache layouts run through it in
// test_query_tokens.cpp and test_cache_layouts.cpp. Every test skips without a CUDA device; the
// value checks run on any device (another one takes the tensor-core path, which must agree too).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "cuda_device.hpp"
#include "pagedattn/detail/backends.hpp"
#include "pagedattn/detail/dispatch.hpp"
#include "pagedattn/reference.hpp"
#include "pagedattn/testing/device_case.hpp"
#include "pagedattn/testing/random_case.hpp"
#include "reference_check.hpp"
#include "test_seed.hpp"
#include "variant_args.hpp"

namespace pagedattn {
namespace {

// Whether the current device is compute capability 9.0, where the kernel runs.
bool device_is_sm90() {
#if defined(PAGEDATTN_TEST_HAS_CUDA_RUNTIME)
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  return major == 9 && minor == 0;
#else
  return false;
#endif
}

// group query heads on each of kv_heads kv heads, head dim 128, the kernel's dtypes.
testing::CaseSpec many_rows_spec(DType dtype, int group, int kv_heads, int block_size,
                                 std::vector<int> lens) {
  testing::CaseSpec s =
      testing::shaped_spec(dtype, group * kv_heads, kv_heads, 128, block_size, std::move(lens));
  s.spare_blocks = 5;
  s.table_padding = 2;
  s.table_stride_extra = 3;
  s.seed = testing::seed_for_test();
  return s;
}

detail::DecodeOptions cuda_options() {
  detail::DecodeOptions o;
  o.backend = Backend::kCuda;
  return o;
}

TEST(CudaManyRows, TakenForTheCallsItServes) {
  SKIP_WITHOUT_CUDA();
  testing::HostCase c = testing::make_case(many_rows_spec(DType::kBF16, 32, 2, 16, {100, 7}));
  const bool sm90 = device_is_sm90();
  DecodeArgs a = c.args();
  const detail::cuda::SplitChoice chosen = detail::cuda::split_choice(a);
  EXPECT_EQ(chosen.many_rows, sm90) << "bf16, group 32";
  if (sm90) EXPECT_GE(chosen.ctas_per_sm, 1);
  RecordProperty("many_rows_ctas_per_sm", chosen.ctas_per_sm);
  a.out_dtype = DType::kF32;  // P needs its lo part: the tensor-core path
  EXPECT_FALSE(detail::cuda::split_choice(a).many_rows) << "f32 out";
  a = c.args();
  a.logits_soft_cap = 30.f;
  EXPECT_FALSE(detail::cuda::split_choice(a).many_rows) << "soft-cap";
  testing::HostCase few = testing::make_case(many_rows_spec(DType::kBF16, 8, 2, 16, {100, 7}));
  EXPECT_FALSE(detail::cuda::split_choice(few.args()).many_rows) << "group 8, one token";
  testing::HostCase odd = testing::make_case(many_rows_spec(DType::kF16, 64, 1, 48, {100, 7}));
  EXPECT_FALSE(detail::cuda::split_choice(odd.args()).many_rows) << "block size 48";
}

struct ManyRowsParam {
  DType dtype;  // q, caches and out
  int block_size;
  int group;
};
void PrintTo(const ManyRowsParam& p, std::ostream* os) {
  *os << dtype_name(p.dtype) << " bs" << p.block_size << " g" << p.group;
}

class CudaManyRowsReference : public ::testing::TestWithParam<ManyRowsParam> {};

// Contexts of 0 and 1 tokens, one short of, on and past a 64-key tile, and long ones that the
// plan splits over several CTAs (the combine merges their partial states); plain, with a window
// whose first token falls inside a page, and with sinks.
TEST_P(CudaManyRowsReference, MatchesTheReference) {
  SKIP_WITHOUT_CUDA();
  const ManyRowsParam& p = GetParam();
  const std::vector<int> lens = {0, 1, 63, 64, 65, 1000, 4133, 9000};
  testing::HostCase clean =
      testing::make_case(many_rows_spec(p.dtype, p.group, 2, p.block_size, lens));
  const int heads = clean.spec.num_heads;
  const Variants configs[] = {{}, {-1, 0.f, {}, sink_logits(heads)}, {700, 0.f, {}, {}}};
  for (const Variants& v : configs) {
    testing::HostCase c = clean;
    const DecodeArgs a = with_variants(c.args(), v);
    const ReferenceResult ref = reference_decode(a);
    testing::cuda_decode_from_host(a, cuda_options());
    const testing::Comparison cmp = testing::compare_outputs(c, ref);
    SCOPED_TRACE(describe(v) + " " + testing::describe(c.spec));
    EXPECT_TRUE(cmp.all_finite) << "first bad element: " << cmp.first_bad;
    EXPECT_LE(cmp.rel_err(), testing::out_tolerance(c.spec.out_dtype));
    EXPECT_LE(cmp.max_abs_err_lse, testing::lse_tolerance());
  }
}

std::vector<ManyRowsParam> many_rows_params() {
  std::vector<ManyRowsParam> v;
  for (DType t : {DType::kBF16, DType::kF16}) {
    for (int bs : {16, 32, 64, 128, 256}) v.push_back({t, bs, 32});
    v.push_back({t, 16, 64});
    v.push_back({t, 64, 48});  // 48 rows: a CTA with 16 padding rows
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(All, CudaManyRowsReference, ::testing::ValuesIn(many_rows_params()),
                         [](const ::testing::TestParamInfo<ManyRowsParam>& i) {
                           return std::string(dtype_name(i.param.dtype)) + "_bs" +
                                  std::to_string(i.param.block_size) + "_g" +
                                  std::to_string(i.param.group);
                         });

// An f16 cache and q with a bf16 out: P needs no lo part, so the kernel serves it too.
TEST(CudaManyRows, F16CacheWithBf16Out) {
  SKIP_WITHOUT_CUDA();
  testing::CaseSpec s = many_rows_spec(DType::kF16, 32, 2, 16, {5, 300, 2000});
  s.out_dtype = DType::kBF16;
  testing::HostCase c = testing::make_case(s);
  EXPECT_EQ(detail::cuda::split_choice(c.args()).many_rows, device_is_sm90());
  testing::run_decode(c, cuda_options());
  testing::expect_matches_reference(c);
}

// Unchecked mode: block ids outside the pool are skipped, their tokens taking no part. Plain
// attention does not depend on where a key sits, so the expected result is the reference of the
// same table with those entries removed and the context shortened by their tokens.
TEST(CudaManyRows, UncheckedBadBlockIdsAreSkipped) {
  SKIP_WITHOUT_CUDA();
  testing::HostCase c =
      testing::make_case(many_rows_spec(DType::kBF16, 32, 2, 16, {200, 300, 150}));
  testing::HostCase compact = c;
  std::int32_t* row = compact.block_table.data() + 1 * c.table_stride;
  const int blocks = (300 + 15) / 16;
  for (int i = 2, from = 3; from < blocks; ++from) {  // drop entries 2 and 5
    if (from == 5) continue;
    row[i++] = row[from];
  }
  compact.context_lens[1] = 300 - 2 * 16;
  c.block_table[1 * c.table_stride + 2] = 1 << 28;
  c.block_table[1 * c.table_stride + 5] = -7;
  testing::run_decode(c, cuda_options());
  const ReferenceResult ref = reference_decode(compact.args());
  const testing::Comparison cmp = testing::compare_outputs(c, ref);
  EXPECT_TRUE(cmp.all_finite) << "first bad element: " << cmp.first_bad;
  EXPECT_LE(cmp.rel_err(), testing::out_tolerance(DType::kBF16));
  EXPECT_LE(cmp.max_abs_err_lse, testing::lse_tolerance());
}

}  // namespace
}  // namespace pagedattn
