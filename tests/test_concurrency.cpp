// The CPU backend called from several host threads at once (its scratch is per thread): every
// result must equal, bit for bit, the result of the same call made alone. The CUDA counterpart
// (two streams, the library's own workspace) is CudaDecode.ConcurrentStreamsUseSeparateWorkspaces.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "pagedattn/testing/random_case.hpp"
#include "test_seed.hpp"

namespace pagedattn {
namespace {

testing::CaseSpec cpu_spec(DType dtype, int heads, int kv_heads, int head_dim,
                           std::vector<int> lens) {
  testing::CaseSpec s = testing::shaped_spec(dtype, heads, kv_heads, head_dim, 16, std::move(lens));
  s.spare_blocks = 3;
  s.seed = testing::seed_for_test();
  return s;
}

TEST(CpuConcurrency, ThreadsCallingDecodeAtOnceGetTheirOwnResults) {
  std::vector<testing::HostCase> cases;
  cases.push_back(testing::make_case(cpu_spec(DType::kBF16, 16, 4, 128, {3000, 1, 700})));
  cases.push_back(testing::make_case(cpu_spec(DType::kF32, 4, 4, 64, {5000, 0})));
  cases.push_back(testing::make_case(cpu_spec(DType::kF16, 24, 2, 96, {40, 2200})));
  cases.push_back(testing::make_case(cpu_spec(DType::kBF16, 8, 8, 256, {1500})));
  detail::DecodeOptions o;
  o.backend = Backend::kCpu;
  o.num_threads = 2;
  std::vector<std::vector<std::uint8_t>> alone_out;
  std::vector<std::vector<float>> alone_lse;
  for (auto& c : cases) {
    testing::run_decode(c, o);
    alone_out.push_back(c.out);
    alone_lse.push_back(c.lse);
  }
  std::atomic<int> mismatches{0};
  auto worker = [&](int t) {
    for (int rep = 0; rep < 12; ++rep) {
      const int k = (t + rep) % static_cast<int>(cases.size());
      testing::HostCase c = cases[k];  // own output buffers, same inputs
      std::fill(c.out.begin(), c.out.end(), std::uint8_t{0xff});
      testing::run_decode(c, o);
      if (c.out != alone_out[k] || c.lse != alone_lse[k]) ++mismatches;
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) threads.emplace_back(worker, t);
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

}  // namespace
}  // namespace pagedattn
