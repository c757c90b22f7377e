// Context-parallel decode over NCCL (pagedattn/nccl_communicator.hpp): one thread per visible GPU
// in one NCCL group (one GPU gives a group of one, still through NCCL), random fragmented cases
// shared out by ranges, every rank (or the root) checked against the f64 reference of the whole
// contexts and against each other bit for bit; the same step captured in a CUDA graph on every
// rank and replayed; the collectives on raw bytes; bad arguments. Skips without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "pagedattn/context_parallel.hpp"
#include "pagedattn/nccl_communicator.hpp"
#include "pagedattn/testing/cp_shares.hpp"
#include "pagedattn/testing/device_case.hpp"
#include "pagedattn/testing/random_case.hpp"
#include "pagedattn/testing/tolerance.hpp"

namespace pagedattn {
namespace {

using testing::RankShare;
using testing::Share;
using testing::share_out;

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

// Runs body(rank, comm, stream) in one thread per GPU, with that GPU current and a stream of its
// own; returns each rank's error text ("" when it returned).
std::vector<std::string> on_every_gpu(
    const std::function<void(int, Communicator&, cudaStream_t)>& body) {
  const int n = device_count();
  std::vector<int> devices(n);
  std::iota(devices.begin(), devices.end(), 0);
  auto group = make_nccl_group(devices);
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      cudaStream_t stream = nullptr;
      try {
        if (cudaSetDevice(r) != cudaSuccess ||
            cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
          throw std::runtime_error("cannot set up device " + std::to_string(r));
        }
        body(r, *group[r], stream);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
      if (stream) cudaStreamDestroy(stream);
    });
  }
  for (std::thread& t : threads) t.join();
  return errors;
}

enum class Step { kAllGather, kGatherToRoot0, kCheckedGroup, kGraph };

class NcclContextParallel : public ::testing::TestWithParam<Step> {};

TEST_P(NcclContextParallel, EveryRankGetsTheWholeDecode) {
  const Step run = GetParam();
  if (device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const int ranks = device_count();
  testing::CaseSpec spec;
  spec.batch = 4;
  spec.num_heads = 32;
  spec.num_kv_heads = 8;
  spec.head_dim = 128;
  spec.block_size = 16;
  spec.context_lens = {5000, 1, 0, 777};
  spec.q_dtype = spec.kv_dtype = spec.out_dtype = DType::kBF16;
  spec.seed = 20261130 + static_cast<int>(run);
  testing::HostCase c = testing::make_case(spec);
  std::mt19937 rng(static_cast<std::uint32_t>(spec.seed));
  const std::vector<RankShare> shares = share_out(c, ranks, Share::kRanges, rng);
  std::vector<testing::HostCase> results(ranks, c);
  ContextParallelOptions cp;
  cp.root = run == Step::kGatherToRoot0 ? 0 : -1;
  cp.check_group = run == Step::kCheckedGroup;
  const auto errors = on_every_gpu([&](int r, Communicator& comm, cudaStream_t stream) {
    testing::HostCase& mine = results[r];
    mine.poison_outputs();
    DecodeArgs a = mine.args();
    a.block_table = shares[r].table.data();
    a.context_lens = shares[r].lens.data();
    testing::DeviceCase dev(a, stream);
    DecodeOptions o;
    o.backend = Backend::kCuda;
    o.cuda_stream = stream;
    if (run != Step::kGraph) {
      context_parallel_decode(dev.args(), comm, o, cp);
    } else {
      // Captured with a caller workspace (no allocation, no host sync), replayed twice. NCCL
      // connects the peers on a communicator's first collective, which cannot happen inside a
      // capture: one step runs first, as in any NCCL program that captures graphs.
      testing::DeviceBuffer ws(context_parallel_workspace_size(dev.args(), comm.size()));
      o.workspace = ws.get();
      o.workspace_bytes = ws.size();
      context_parallel_decode(dev.args(), comm, o, cp);
      if (cudaStreamSynchronize(stream) != cudaSuccess) throw std::runtime_error("warm-up");
      testing::device_fill(
          dev.args().out, 0xFF,
          dev.args().batch * dev.args().num_heads * dev.args().head_dim * 2);  // NaN again
      cudaGraph_t graph = nullptr;
      cudaGraphExec_t exec = nullptr;
      if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
        throw std::runtime_error("cudaStreamBeginCapture");
      }
      context_parallel_decode(dev.args(), comm, o, cp);
      if (cudaStreamEndCapture(stream, &graph) != cudaSuccess ||
          cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) {
        throw std::runtime_error("graph capture of context_parallel_decode failed");
      }
      for (int i = 0; i < 2; ++i) {
        if (cudaGraphLaunch(exec, stream) != cudaSuccess) throw std::runtime_error("launch");
      }
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
    }
    dev.download(a, stream);
  });
  for (int r = 0; r < ranks; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r) + " of " + std::to_string(ranks));
    ASSERT_EQ(errors[r], "");
    if (cp.root >= 0 && r != cp.root) {
      for (float x : results[r].lse) EXPECT_TRUE(std::isnan(x)) << "a non-root rank was written";
      continue;
    }
    const testing::Comparison cmp = testing::compare_with_reference(results[r]);
    EXPECT_TRUE(cmp.all_finite) << cmp.first_bad;
    EXPECT_LE(cmp.rel_err(), testing::out_tolerance(spec.out_dtype)) << cmp.first_bad;
    EXPECT_LE(cmp.max_abs_err_lse, testing::lse_tolerance()) << cmp.first_bad;
    EXPECT_TRUE(results[r].out == results[0].out) << "ranks disagree";
  }
}

INSTANTIATE_TEST_SUITE_P(All, NcclContextParallel,
                         ::testing::Values(Step::kAllGather, Step::kGatherToRoot0,
                                           Step::kCheckedGroup, Step::kGraph),
                         [](const ::testing::TestParamInfo<Step>& info) {
                           switch (info.param) {
                             case Step::kAllGather:
                               return std::string("all_gather");
                             case Step::kGatherToRoot0:
                               return std::string("gather_to_root0");
                             case Step::kCheckedGroup:
                               return std::string("check_group");
                             case Step::kGraph:
                               return std::string("cuda_graph");
                           }
                           return std::string();
                         });

// The collectives on raw bytes: every rank's slot arrives, in place and not, and gather writes
// only the root.
TEST(NcclCommunicator, AllGatherAndGatherMoveEveryRanksBytes) {
  if (device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const std::size_t bytes = 1000;
  const auto errors = on_every_gpu([&](int r, Communicator& comm, cudaStream_t stream) {
    const int n = comm.size();
    EXPECT_EQ(comm.rank(), r);
    EXPECT_EQ(comm.memory(), Backend::kCuda);
    std::vector<unsigned char> mine(bytes), got(bytes * n);
    for (std::size_t i = 0; i < bytes; ++i) mine[i] = static_cast<unsigned char>(r * 31 + i);
    testing::DeviceBuffer send(mine.data(), bytes), recv(bytes * n);
    testing::device_fill(recv.get(), 0xEE, bytes * n);
    auto expect_slots = [&](bool only_own_untouched) {
      recv.to_host(got);
      for (int p = 0; p < n; ++p) {
        for (std::size_t i = 0; i < bytes; ++i) {
          const unsigned char want =
              only_own_untouched ? 0xEE : static_cast<unsigned char>(p * 31 + i);
          ASSERT_EQ(got[p * bytes + i], want) << "slot " << p << " byte " << i;
        }
      }
    };
    comm.all_gather(send.get(), recv.get(), bytes, stream);
    cudaStreamSynchronize(stream);
    expect_slots(false);
    // In place: the send buffer is this rank's own slot.
    testing::device_fill(recv.get(), 0xEE, bytes * n);
    testing::copy_to_device(recv.as<char>() + r * bytes, mine.data(), bytes);
    comm.all_gather(recv.as<char>() + r * bytes, recv.get(), bytes, stream);
    cudaStreamSynchronize(stream);
    expect_slots(false);
    // Gather to the last rank: the others' recv stays as it was.
    testing::device_fill(recv.get(), 0xEE, bytes * n);
    comm.gather(send.get(), recv.get(), bytes, n - 1, stream);
    cudaStreamSynchronize(stream);
    expect_slots(r != n - 1);
    EXPECT_THROW(comm.gather(send.get(), recv.get(), bytes, n, stream), Error);
  });
  for (const std::string& e : errors) EXPECT_EQ(e, "");
}

TEST(NcclCommunicator, BadArgumentsAreErrors) {
  EXPECT_THROW(make_nccl_communicator(nullptr), Error);
  EXPECT_THROW(make_nccl_group({}), Error);
  EXPECT_THROW(make_nccl_group({0, 0}), Error);
  EXPECT_THROW(make_nccl_group({-1}), Error);
  if (device_count() == 0) GTEST_SKIP() << "no CUDA device for the version check";
  EXPECT_FALSE(nccl_version().empty());
}

}  // namespace
}  // namespace pagedattn
