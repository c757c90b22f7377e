// The public API around the kernels: backend selection, the no-op batch, optional outputs,
// mixed dtypes, custom scales, wide table rows, thread counts and plan invariance.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <string>

#include "pagedattn/detail/backends.hpp"
#include "pagedattn/reference.hpp"
#include "pagedattn/testing/random_case.hpp"
#include "reference_check.hpp"
#include "test_seed.hpp"

namespace pagedattn {
namespace {

testing::CaseSpec mixed_spec(std::uint64_t salt) {
  testing::CaseSpec s;
  s.batch = 5;
  s.num_heads = 12;
  s.num_kv_heads = 3;
  s.head_dim = 96;
  s.block_size = 16;
  s.context_lens = {700, 0, 33, 5000, 1};
  s.seed = testing::seed_for(salt);
  return s;
}

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    setenv(name, value, 1);
  }
  ~ScopedEnv() { had_ ? setenv(name_, old_.c_str(), 1) : unsetenv(name_); }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

TEST(Api, BackendNamesRoundTrip) {
  for (Backend b : {Backend::kAuto, Backend::kCpu, Backend::kCuda}) {
    EXPECT_EQ(parse_backend(backend_name(b)), b);
  }
}

TEST(Api, AutoPicksCudaOnlyWithADevice) {
  ScopedEnv env("PAGEDATTN_BACKEND", "");
  EXPECT_EQ(resolve_backend(Backend::kAuto), cuda_available() ? Backend::kCuda : Backend::kCpu);
  EXPECT_EQ(resolve_backend(Backend::kCpu), Backend::kCpu);
}

TEST(Api, EnvironmentOverridesAuto) {
  {
    ScopedEnv env("PAGEDATTN_BACKEND", "cpu");
    EXPECT_EQ(resolve_backend(Backend::kAuto), Backend::kCpu);
  }
  {
    ScopedEnv env("PAGEDATTN_BACKEND", "tpu");
    try {
      resolve_backend(Backend::kAuto);
      ADD_FAILURE() << "accepted PAGEDATTN_BACKEND=tpu";
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), "PAGEDATTN_BACKEND");
      EXPECT_NE(std::string(e.what()).find("'tpu'"), std::string::npos) << e.what();
    }
  }
  if (!cuda_available()) {
    ScopedEnv env("PAGEDATTN_BACKEND", "cuda");
    EXPECT_THROW(resolve_backend(Backend::kAuto), Error);
    // An explicit choice is not overridden by the environment.
    EXPECT_EQ(resolve_backend(Backend::kCpu), Backend::kCpu);
  }
}

TEST(Api, BatchZeroIsANoOpEvenWithNullBuffers) {
  DecodeArgs a;
  a.batch = 0;
  a.num_heads = 8;
  a.num_kv_heads = 2;
  a.head_dim = 128;
  a.block_size = 16;
  DecodeOptions o;
  o.backend = Backend::kCpu;
  EXPECT_NO_THROW(decode(a, o));
  EXPECT_TRUE(reference_decode(a).out.empty());
}

TEST(Api, MixedDtypesPerTensor) {
  testing::CaseSpec s = mixed_spec(41);
  s.q_dtype = DType::kF32;
  s.kv_dtype = DType::kBF16;
  s.out_dtype = DType::kF16;
  testing::HostCase c = testing::make_case(s);
  DecodeOptions o;
  o.backend = Backend::kCpu;
  testing::run_decode(c, o);
  testing::expect_matches_reference(c);
}

TEST(Api, LseIsOptional) {
  testing::HostCase c = testing::make_case(mixed_spec(42));
  DecodeArgs a = c.args();
  a.lse = nullptr;
  decode(a, DecodeOptions{Backend::kCpu});
  for (float x : c.lse) EXPECT_TRUE(std::isnan(x));  // still the poison: never written
  const testing::Comparison cmp = testing::compare_with_reference(c);
  EXPECT_LE(cmp.rel_err(), testing::out_tolerance(DType::kF32));
}

TEST(Api, CustomScale) {
  for (float scale : {0.01f, 1.f, 0.5f}) {
    testing::HostCase c = testing::make_case(mixed_spec(43));
    DecodeArgs a = c.args();
    a.scale = scale;
    decode(a, DecodeOptions{Backend::kCpu});
    // c.args() has no scale, so the reference is computed apart, from the scaled args.
    const testing::Comparison cmp = testing::compare_outputs(c, reference_decode(a));
    EXPECT_TRUE(cmp.all_finite) << "scale " << scale << ", first bad element: " << cmp.first_bad;
    EXPECT_LE(cmp.rel_err(), testing::out_tolerance(DType::kF32)) << "scale " << scale;
    EXPECT_LE(cmp.max_abs_err_lse, testing::lse_tolerance()) << "scale " << scale;
  }
}

TEST(Api, ThreadCountsAndSingleSplitGiveTheSameResult) {
  testing::HostCase base = testing::make_case(mixed_spec(44));
  detail::DecodeOptions o;
  o.backend = Backend::kCpu;
  o.num_threads = 1;
  o.single_split = true;
  testing::run_decode(base, o);
  testing::expect_matches_reference(base);
  for (int threads : {1, 2, 3, 8}) {
    testing::HostCase c = testing::make_case(mixed_spec(44));
    o.num_threads = threads;
    o.single_split = false;
    testing::run_decode(c, o);
    testing::expect_matches_reference(c);
    // Splits change the summation order, so only a rounding-level difference is allowed.
    const float* x = reinterpret_cast<const float*>(base.out.data());
    const float* y = reinterpret_cast<const float*>(c.out.data());
    for (std::size_t i = 0; i < base.out.size() / 4; ++i) ASSERT_NEAR(x[i], y[i], 1e-5) << i;
  }
}

TEST(Api, SameInputsSamePlanSameBits) {
  testing::HostCase a = testing::make_case(mixed_spec(45));
  testing::HostCase b = testing::make_case(mixed_spec(45));
  DecodeOptions o;
  o.backend = Backend::kCpu;
  o.num_threads = 2;
  testing::run_decode(a, o);
  testing::run_decode(b, o);
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * 4), 0);
}

TEST(Api, LogitsOfLargeMagnitudeStayFinite) {
  testing::CaseSpec s = mixed_spec(46);
  s.magnitude = 12.f;  // logits of order 12^2 * sqrt(96) / sqrt(96) * ... up to ~1e3
  testing::HostCase c = testing::make_case(s);
  DecodeOptions o;
  o.backend = Backend::kCpu;
  testing::run_decode(c, o);
  const testing::Comparison cmp = testing::compare_with_reference(c);
  EXPECT_TRUE(cmp.all_finite) << cmp.first_bad;
  // Logit error grows with |logit| * f32 epsilon; a peaked softmax amplifies it.
  EXPECT_LE(cmp.rel_err(), 1e-3);
}

}  // namespace
}  // namespace pagedattn
