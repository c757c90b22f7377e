// The naive baseline decode of the benchmark and the simulator (testing/naive_decode.hpp), on the
// CPU and on a CUDA device, against the f64 reference: every storage dtype, a block size that
// leaves partial blocks, contexts 0 and 1, and each attention variant.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cuda_device.hpp"
#include "pagedattn/reference.hpp"
#include "pagedattn/testing/device_case.hpp"
#include "pagedattn/testing/naive_decode.hpp"
#include "pagedattn/testing/tolerance.hpp"
#include "test_seed.hpp"
#include "variant_args.hpp"

namespace pagedattn {
namespace {

struct NaiveCase {
  DType dtype;
  Variants variants;
  std::string name;
};

std::vector<NaiveCase> naive_cases() {
  std::vector<NaiveCase> cases;
  for (const DType d : {DType::kF32, DType::kF16, DType::kBF16}) {
    const std::string dn = dtype_name(d);
    cases.push_back({d, {}, dn + "_plain"});
    Variants all;
    all.window_left = 20;
    all.soft_cap = 5.f;
    all.slopes = alibi_slopes(8);
    all.sinks = sink_logits(8);
    cases.push_back({d, all, dn + "_all_variants"});
  }
  return cases;
}

class NaiveDecode : public ::testing::TestWithParam<NaiveCase> {
 protected:
  testing::HostCase make() const {
    testing::CaseSpec spec =
        testing::shaped_spec(GetParam().dtype, 8, 2, 128, 7, {0, 1, 7, 100, 263});
    spec.magnitude = 2.f;
    spec.seed = testing::seed_for_test();
    testing::HostCase c = testing::make_case(spec);
    c.poison_outputs();
    return c;
  }
  void expect_matches(testing::HostCase& c) const {
    const DecodeArgs a = with_variants(c.args(), GetParam().variants);
    const testing::Comparison cmp = testing::compare_outputs(c, reference_decode(a));
    SCOPED_TRACE(describe(GetParam().variants) + " " + testing::seed_note(c.spec.seed));
    EXPECT_TRUE(cmp.all_finite) << "first bad element: " << cmp.first_bad;
    EXPECT_LE(cmp.rel_err(), testing::out_tolerance(c.spec.out_dtype));
    EXPECT_LE(cmp.max_abs_err_lse, testing::lse_tolerance());
  }
};

TEST_P(NaiveDecode, CpuMatchesTheReference) {
  testing::HostCase c = make();
  testing::naive_decode(with_variants(c.args(), GetParam().variants), 2);
  expect_matches(c);
}

TEST_P(NaiveDecode, CudaMatchesTheReference) {
  SKIP_WITHOUT_CUDA();
  testing::HostCase c = make();
  const DecodeArgs host = with_variants(c.args(), GetParam().variants);
  const testing::DeviceCase device(host);
  testing::naive_decode_cuda(device.args());
  device.download(host);
  expect_matches(c);
}

INSTANTIATE_TEST_SUITE_P(Naive, NaiveDecode, ::testing::ValuesIn(naive_cases()),
                         [](const ::testing::TestParamInfo<NaiveCase>& i) { return i.param.name; });

TEST(NaiveDecodeCuda, RefusesWhatItDoesNotServe) {
  SKIP_WITHOUT_CUDA();
  testing::HostCase c =
      testing::make_case(testing::shaped_spec(DType::kBF16, 8, 2, 128, 16, {5, 9}));
  DecodeArgs a = c.args();
  const std::int32_t q_indptr[] = {0, 1, 2};
  a.q_indptr = q_indptr;
  EXPECT_THROW(testing::naive_decode_cuda(a), Error);
  a = c.args();
  a.out_dtype = DType::kF32;
  EXPECT_THROW(testing::naive_decode_cuda(a), Error);
}

}  // namespace
}  // namespace pagedattn
