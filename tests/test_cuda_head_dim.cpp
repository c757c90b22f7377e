// Head dims the CPU backend has kernels for and the CUDA backend does not (512, kCudaHeadDims):
// every CUDA entry point that takes a head dim refuses one up front, an Error(kUnsupported) naming
// head_dim with its value, before any pointer is used and with nothing written, while the CPU
// backend takes the same call. The CUDA calls skip where no CUDA device is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <string>
#include <vector>

#include "bad_input.hpp"
#include "cuda_device.hpp"
#include "pagedattn/cache_ops.hpp"
#include "pagedattn/context_parallel.hpp"
#include "pagedattn/pagedattn.hpp"
#include "pagedattn/testing/cache_op_args.hpp"
#include "pagedattn/testing/random_case.hpp"
#include "pagedattn/validate.hpp"
#include "reference_check.hpp"
#include "test_seed.hpp"

namespace pagedattn {
namespace {

constexpr int kNoCudaDim = 512;
const std::vector<std::string> kRefusal = {"head_dim = 512", "CUDA backend has no kernel"};

// A bf16 case at head dim 512: 8 query heads on 2 kv heads, blocks of 16, contexts 40, 0 and 17.
testing::HostCase no_cuda_dim_case() {
  testing::CaseSpec s = testing::shaped_spec(DType::kBF16, 8, 2, kNoCudaDim, 16, {40, 0, 17});
  s.seed = testing::seed_for_test();
  return testing::make_case(s);
}

// A communicator over device memory that must never be reached: the refusal comes first.
class UnreachedDeviceCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  Backend memory() const override { return Backend::kCuda; }
  void all_gather(const void*, void*, std::size_t, void*) override {
    ADD_FAILURE() << "the header exchange ran before the refusal";
  }
};

TEST(CudaHeadDim, EveryCudaHeadDimIsSupportedAnd512IsNot) {
  for (int d : kCudaHeadDims) {
    EXPECT_TRUE(is_supported_head_dim(d)) << d;
    EXPECT_NO_THROW(require_cuda_head_dim(d)) << d;
  }
  for (int d : kSupportedHeadDims) {
    const bool cuda =
        std::find(std::begin(kCudaHeadDims), std::end(kCudaHeadDims), d) != std::end(kCudaHeadDims);
    EXPECT_EQ(is_cuda_head_dim(d), cuda) << d;
    EXPECT_TRUE(cuda || d == kNoCudaDim) << d << " has no CUDA kernel";
  }
  EXPECT_FALSE(is_cuda_head_dim(kNoCudaDim));
  expect_error([] { require_cuda_head_dim(kNoCudaDim); }, ErrorCode::kUnsupported, "head_dim",
               kRefusal, "head dim 512 for CUDA");
}

TEST(CudaHeadDim, TheCpuBackendDecodes512) {
  testing::HostCase c = no_cuda_dim_case();
  DecodeOptions o;
  o.backend = Backend::kCpu;
  testing::run_decode(c, o);
  testing::expect_matches_reference(c);
}

// decode(), a batch of 0 too, and the workspace query. Host pointers show the refusal as well as
// device ones would: it comes before any pointer is used.
TEST(CudaHeadDim, DecodeAndWorkspaceRefuse512) {
  SKIP_WITHOUT_CUDA();
  testing::HostCase c = no_cuda_dim_case();
  c.poison_outputs();
  const Unwritten unwritten(c);
  DecodeOptions o;
  o.backend = Backend::kCuda;
  const DecodeArgs a = c.args();
  expect_error([&] { decode(a, o); }, ErrorCode::kUnsupported, "head_dim", kRefusal, "decode");
  unwritten.check();
  DecodeArgs empty = a;
  empty.batch = 0;
  expect_error([&] { decode(empty, o); }, ErrorCode::kUnsupported, "head_dim", kRefusal,
               "decode of a batch of 0");
  o.backend = Backend::kAuto;  // auto picks CUDA where a device is present
  expect_error([&] { decode(a, o); }, ErrorCode::kUnsupported, "head_dim", kRefusal, "auto");
  expect_error([&] { cuda_workspace_size(a); }, ErrorCode::kUnsupported, "head_dim", kRefusal,
               "cuda_workspace_size");
  unwritten.check();
}

TEST(CudaHeadDim, ContextParallelDecodeRefuses512) {
  SKIP_WITHOUT_CUDA();
  testing::HostCase c = no_cuda_dim_case();
  c.poison_outputs();
  const Unwritten unwritten(c);
  const DecodeArgs a = c.args();
  DecodeOptions o;
  o.backend = Backend::kCuda;
  UnreachedDeviceCommunicator comm;
  expect_error([&] { context_parallel_decode(a, comm, o); }, ErrorCode::kUnsupported, "head_dim",
               kRefusal, "context_parallel_decode");
  expect_error([&] { context_parallel_workspace_size(a, 2, o); }, ErrorCode::kUnsupported,
               "head_dim", kRefusal, "context_parallel_workspace_size");
  unwritten.check();
}

// Cache writes and block copies: a pool the CUDA decode cannot read is refused as decode()
// refuses it, the caches untouched; the CPU backend writes the same tokens.
TEST(CudaHeadDim, CacheOpsRefuse512) {
  const int tokens = 3, kv_heads = 2, bs = 16, blocks = 3;
  const std::size_t row = static_cast<std::size_t>(kv_heads) * kNoCudaDim;
  std::vector<float> key(tokens * row, 1.5f), value(tokens * row, -2.f);
  std::vector<float> k_cache(blocks * bs * row, 0.f), v_cache(blocks * bs * row, 0.f);
  const std::vector<std::int32_t> slots = {3, -1, 2 * bs + 4};
  auto w = testing::pool_args<CacheWriteArgs>(kv_heads, kNoCudaDim, bs, blocks, k_cache.data(),
                                              v_cache.data(), DType::kF32);
  w.num_tokens = tokens;
  w.key = key.data();
  w.value = value.data();
  w.slot_mapping = slots.data();
  const BlockCopy pair{0, 1};
  auto copy = testing::pool_args<CopyBlocksArgs>(kv_heads, kNoCudaDim, bs, blocks, k_cache.data(),
                                                 v_cache.data(), DType::kF32);
  copy.pairs = &pair;
  copy.num_pairs = 1;
  if (cuda_available()) {
    CacheOpOptions o;
    o.backend = Backend::kCuda;
    expect_error([&] { write_cache(w, o); }, ErrorCode::kUnsupported, "head_dim", kRefusal,
                 "write_cache");
    expect_error([&] { copy_blocks(copy, o); }, ErrorCode::kUnsupported, "head_dim", kRefusal,
                 "copy_blocks");
    EXPECT_TRUE(std::all_of(k_cache.begin(), k_cache.end(), [](float x) { return x == 0.f; }));
    EXPECT_TRUE(std::all_of(v_cache.begin(), v_cache.end(), [](float x) { return x == 0.f; }));
  }
  CacheOpOptions cpu;
  cpu.backend = Backend::kCpu;
  write_cache(w, cpu);
  copy_blocks(copy, cpu);
  // Token 0 at slot 3 of block 0 (then copied to block 1), token 2 at slot 4 of block 2; in the
  // default layout ([block][kv head][slot][dim]) kv head 1's rows start bs * head_dim elements
  // after kv head 0's. The first element of kv head 0's rows, the last of kv head 1's.
  const std::size_t D = kNoCudaDim, head = bs * D, block = bs * row;
  for (std::size_t at : {3 * D, block + 3 * D, 2 * block + head + 4 * D + D - 1}) {
    EXPECT_EQ(k_cache[at], 1.5f) << at;
    EXPECT_EQ(v_cache[at], -2.f) << at;
  }
}

}  // namespace
}  // namespace pagedattn
