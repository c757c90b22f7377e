// Context-parallel decode (pagedattn/context_parallel.hpp) with 1-4 ranks as threads, on the CPU
// over the in-process group and on one GPU over a communicator staged through it: every
// sequence's blocks shared out by ranges (uneven, some ranks holding none) or by strides; every
// rank (or the root) must get the decode of the whole contexts (f64 reference), the same bits on
// every rank. A bad argument on one rank is an error on every rank, never a hang.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#if PAGEDATTN_TESTS_WITH_CUDA
#include <cuda_runtime.h>
#endif

#include "gtest_printers.hpp"
#include "pagedattn/context_parallel.hpp"
#include "pagedattn/error.hpp"
#include "pagedattn/testing/cp_shares.hpp"
#include "pagedattn/testing/device_case.hpp"
#include "pagedattn/testing/random_case.hpp"
#include "pagedattn/testing/tolerance.hpp"
#include "rank_threads.hpp"
#include "test_seed.hpp"

namespace pagedattn {
namespace {

using testing::RankShare;
using testing::Share;
using testing::share_out;

#if PAGEDATTN_TESTS_WITH_CUDA
// A communicator over device memory for threads on one GPU, so the CUDA protocol runs with any
// number of ranks without NCCL: waits for the stream, stages the buffers through the host and the
// in-process group. (tests/test_context_parallel_nccl.cpp runs the real NCCL communicator.)
class StagedDeviceCommunicator final : public Communicator {
 public:
  explicit StagedDeviceCommunicator(Communicator& host) : host_(host) {}
  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }
  Backend memory() const override { return Backend::kCuda; }
  void all_gather(const void* send, void* recv, std::size_t bytes, void* stream) override {
    exchange(send, recv, bytes, -1, stream);
  }
  void gather(const void* send, void* recv, std::size_t bytes, int root, void* stream) override {
    exchange(send, recv, bytes, root, stream);
  }

 private:
  void exchange(const void* send, void* recv, std::size_t bytes, int root, void* stream) {
    const auto s = static_cast<cudaStream_t>(stream);
    std::vector<char> mine(bytes), all(bytes * size());
    ASSERT_EQ(cudaMemcpyAsync(mine.data(), send, bytes, cudaMemcpyDeviceToHost, s), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    if (root < 0) {
      host_.all_gather(mine.data(), all.data(), bytes, nullptr);
    } else {
      host_.gather(mine.data(), all.data(), bytes, root, nullptr);
      if (rank() != root) return;
    }
    ASSERT_EQ(cudaMemcpy(recv, all.data(), all.size(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  Communicator& host_;
};
#endif

// Each rank's copy of the case after context_parallel_decode over its share, and its error text
// ("" when it returned). Rank r runs in a thread of its own, on the CPU over the in-process
// group or, on CUDA, over device copies on a stream of its own through a staged communicator,
// with a caller workspace (context_parallel_workspace_size) when `workspace` is set, else the
// library's scratch. Outputs start as NaN, so an unwritten element shows.
struct RankRuns {
  std::vector<testing::HostCase> results;
  std::vector<std::string> errors;
};

RankRuns decode_on_ranks(Backend backend, const testing::HostCase& c,
                         const std::vector<RankShare>& shares, const ContextParallelOptions& cp,
                         bool workspace) {
  const int ranks = static_cast<int>(shares.size());
  auto group = make_local_group(ranks);
  RankRuns runs{std::vector<testing::HostCase>(ranks, c), std::vector<std::string>(ranks)};
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      testing::HostCase& mine = runs.results[r];
      mine.poison_outputs();
      DecodeArgs a = mine.args();
      a.block_table = shares[r].table.data();
      a.context_lens = shares[r].lens.data();
      DecodeOptions o;
      o.backend = backend;
      o.num_threads = 1;
      try {
        if (backend == Backend::kCpu) {
          context_parallel_decode(a, *group[r], o, cp);
          return;
        }
#if PAGEDATTN_TESTS_WITH_CUDA
        cudaStream_t stream = nullptr;
        ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
        {
          testing::DeviceCase dev(a, stream);
          o.cuda_stream = stream;
          testing::DeviceBuffer ws;
          if (workspace) {
            ws = testing::DeviceBuffer(context_parallel_workspace_size(dev.args(), ranks));
            o.workspace = ws.get();
            o.workspace_bytes = ws.size();
          }
          StagedDeviceCommunicator comm(*group[r]);
          context_parallel_decode(dev.args(), comm, o, cp);
          dev.download(a, stream);
        }
        cudaStreamDestroy(stream);
#endif
      } catch (const std::exception& e) {
        runs.errors[r] = e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return runs;
}

// Every rank from `first` on got the f64 reference of the whole contexts, the same bits as rank
// `first`; the ranks before it (not the root of a gather) kept their NaN outputs.
void expect_whole_decode(RankRuns& runs, int first, DType out_dtype) {
  for (std::size_t r = 0; r < runs.results.size(); ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    ASSERT_EQ(runs.errors[r], "");
    testing::HostCase& got = runs.results[r];
    if (static_cast<int>(r) < first) {  // not the root: out and lse untouched (still NaN)
      for (float x : got.lse) EXPECT_TRUE(std::isnan(x));
      continue;
    }
    const testing::Comparison cmp = testing::compare_with_reference(got);
    EXPECT_TRUE(cmp.all_finite) << cmp.first_bad;
    EXPECT_LE(cmp.rel_err(), testing::out_tolerance(out_dtype)) << cmp.first_bad;
    EXPECT_LE(cmp.max_abs_err_lse, testing::lse_tolerance()) << cmp.first_bad;
    EXPECT_TRUE(got.out == runs.results[first].out) << "ranks disagree";
    EXPECT_TRUE(got.lse == runs.results[first].lse) << "ranks disagree";
  }
}

// Who gets the result: every rank (all-gather), or the last rank only (gather to a root).
enum class Mode { kAll, kRootLast };

using CpParam = std::tuple<Backend, int, Share, DType, Mode>;  // backend, ranks, share, out, mode

class ContextParallel : public ::testing::TestWithParam<CpParam> {};

// With strides the CUDA ranks pass a caller workspace, with ranges they use the library's scratch.
TEST_P(ContextParallel, EveryRankGetsTheWholeDecode) {
  const auto [backend, ranks, how, out_dtype, mode] = GetParam();
  if (backend == Backend::kCuda && !cuda_available()) GTEST_SKIP() << "no CUDA device";
  testing::CaseSpec spec = testing::shaped_spec(DType::kBF16, 8, 2, 64, 16, {1000, 37, 0, 16, 300});
  spec.out_dtype = out_dtype;
  spec.seed = testing::seed_for_test();
  SCOPED_TRACE(testing::describe(spec) +
               " (replay with PAGEDATTN_TEST_SEED=" + std::to_string(testing::base_seed()) + ")");
  testing::HostCase c = testing::make_case(spec);
  std::mt19937 rng(static_cast<std::uint32_t>(spec.seed));
  const std::vector<RankShare> shares = share_out(c, ranks, how, rng);
  ContextParallelOptions cp;
  cp.root = mode == Mode::kAll ? -1 : ranks - 1;
  RankRuns runs = decode_on_ranks(backend, c, shares, cp, how == Share::kStrides);
  expect_whole_decode(runs, mode == Mode::kAll ? 0 : ranks - 1, out_dtype);
}

std::string cp_name(const ::testing::TestParamInfo<CpParam>& info) {
  const auto [backend, ranks, how, out, mode] = info.param;
  return std::string(backend_name(backend)) + "_" + std::to_string(ranks) + "ranks_" +
         (how == Share::kRanges ? "ranges" : "strides") + "_out_" + dtype_name(out) +
         (mode == Mode::kAll ? "_all" : "_root");
}

INSTANTIATE_TEST_SUITE_P(All, ContextParallel,
                         ::testing::Combine(::testing::Values(Backend::kCpu, Backend::kCuda),
                                            ::testing::Values(1, 2, 3, 4),
                                            ::testing::Values(Share::kRanges, Share::kStrides),
                                            ::testing::Values(DType::kF32, DType::kBF16),
                                            ::testing::Values(Mode::kAll, Mode::kRootLast)),
                         cp_name);

// An odd number of rows (batch * num_heads) on 2 and 3 ranks: every rank's block of the gather
// buffer must still start aligned (the decode stores out 8 and 16 bytes at a time), on both
// backends; 5 heads of 128 over 3 sequences, one of them empty, MHA and group 5.
class ContextParallelOddRows : public ::testing::TestWithParam<std::tuple<Backend, int, int>> {};

TEST_P(ContextParallelOddRows, EveryRankGetsTheWholeDecode) {
  const auto [backend, ranks, kv_heads] = GetParam();
  if (backend == Backend::kCuda && !cuda_available()) GTEST_SKIP() << "no CUDA device";
  testing::CaseSpec spec;
  spec.batch = 3;
  spec.num_heads = 5;
  spec.num_kv_heads = kv_heads;
  spec.head_dim = 128;
  spec.block_size = 16;
  spec.context_lens = {300, 17, 0};
  spec.q_dtype = spec.kv_dtype = spec.out_dtype = DType::kBF16;
  spec.seed = testing::seed_for_test();
  testing::HostCase c = testing::make_case(spec);
  std::mt19937 rng(static_cast<std::uint32_t>(spec.seed));
  const std::vector<RankShare> shares = share_out(c, ranks, Share::kRanges, rng);
  RankRuns runs = decode_on_ranks(backend, c, shares, {}, false);
  expect_whole_decode(runs, 0, spec.out_dtype);
}

INSTANTIATE_TEST_SUITE_P(All, ContextParallelOddRows,
                         ::testing::Combine(::testing::Values(Backend::kCpu, Backend::kCuda),
                                            ::testing::Values(2, 3), ::testing::Values(5, 1)),
                         [](const ::testing::TestParamInfo<std::tuple<Backend, int, int>>& i) {
                           return std::string(backend_name(std::get<0>(i.param))) + "_" +
                                  std::to_string(std::get<1>(i.param)) + "ranks_kv" +
                                  std::to_string(std::get<2>(i.param));
                         });

// Runs `body(rank)` on every rank of a new group, in threads; returns each rank's error argument
// ("" when it returned).
template <typename F>
std::vector<std::string> on_every_rank(int ranks, F body) {
  std::vector<std::string> argument;
  for (const RankError& e : run_on_every_rank(ranks, body)) argument.push_back(e.argument);
  return argument;
}

#if PAGEDATTN_TESTS_WITH_CUDA
// On CUDA with check_group, what the decode refuses before a launch is found before the header
// exchange: a misaligned q on rank 1 (named there) and a bad block id with cuda_checked on rank 2
// are errors on every rank, never a hang; the outputs stay untouched.
TEST(ContextParallelErrors, CheckGroupOnCudaFailsEveryRank) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  testing::CaseSpec spec;
  spec.batch = 2;
  spec.context_lens = {40, 7};
  spec.seed = 4;
  const testing::HostCase base = testing::make_case(spec);
  for (const bool misaligned_q : {true, false}) {
    SCOPED_TRACE(misaligned_q ? "misaligned q on rank 1" : "bad block id on rank 2");
    std::vector<testing::HostCase> cases(3, base);
    std::vector<std::vector<std::uint8_t>> outs(3);
    const auto got = on_every_rank(3, [&](int r, Communicator& host) {
      testing::HostCase& c = cases[r];
      if (!misaligned_q && r == 2) c.block_table[0] = c.num_blocks + 5;
      testing::DeviceCase dev(c.args());
      DecodeArgs a = dev.args();
      testing::DeviceBuffer shifted;
      if (misaligned_q && r == 1) {
        shifted = testing::DeviceBuffer(c.q.size() + 16);
        a.q = shifted.as<char>() + 4;  // valid memory, not 16-byte aligned
      }
      DecodeOptions o;
      o.backend = Backend::kCuda;
      o.cuda_checked = !misaligned_q;
      ContextParallelOptions cp;
      cp.check_group = true;
      StagedDeviceCommunicator comm(host);
      try {
        context_parallel_decode(a, comm, o, cp);
      } catch (...) {
        dev.download(c.args());
        outs[r] = c.out;
        throw;
      }
    });
    EXPECT_EQ(got[0], "rank");
    EXPECT_EQ(got[1], misaligned_q ? "q" : "rank");
    if (misaligned_q) {
      EXPECT_EQ(got[2], "rank");
    } else {
      EXPECT_EQ(got[2].rfind("block_table", 0), 0u) << got[2];
    }
    for (const auto& out : outs) EXPECT_TRUE(out == base.out) << "an output was written";
  }
}
#endif

TEST(ContextParallelErrors, ABadRankFailsEveryRank) {
  testing::CaseSpec spec;
  spec.batch = 2;
  spec.context_lens = {40, 7};
  spec.seed = 3;
  const testing::HostCase base = testing::make_case(spec);
  std::vector<testing::HostCase> cases(3, base);
  DecodeOptions cpu;
  cpu.backend = Backend::kCpu;
  // A block id outside the pool on rank 1: rank 1 names it, the others name rank 1.
  auto got = on_every_rank(3, [&](int r, Communicator& comm) {
    testing::HostCase& c = cases[r];
    if (r == 1) c.block_table[0] = c.num_blocks + 5;
    context_parallel_decode(c.args(), comm, cpu);
  });
  EXPECT_EQ(got[0], "rank");
  EXPECT_EQ(got[1].rfind("block_table", 0), 0u) << got[1];
  EXPECT_EQ(got[2], "rank");
  // Shapes that differ between ranks: every rank names the field.
  cases.assign(2, base);
  got = on_every_rank(2, [&](int r, Communicator& comm) {
    DecodeArgs a = cases[r].args();
    if (r == 1) a.batch = 1;
    context_parallel_decode(a, comm, cpu);
  });
  EXPECT_EQ(got[0], "batch");
  EXPECT_EQ(got[1], "batch");
  // The outputs were not written.
  for (const testing::HostCase& c : cases) EXPECT_TRUE(c.out == base.out);
  // A root outside the group: every rank names it; roots that differ between ranks too.
  cases.assign(2, base);
  got = on_every_rank(2, [&](int r, Communicator& comm) {
    ContextParallelOptions cp;
    cp.root = 2;
    context_parallel_decode(cases[r].args(), comm, cpu, cp);
  });
  EXPECT_EQ(got[0], "root");
  EXPECT_EQ(got[1], "root");
  got = on_every_rank(2, [&](int r, Communicator& comm) {
    ContextParallelOptions cp;
    cp.root = r;
    context_parallel_decode(cases[r].args(), comm, cpu, cp);
  });
  EXPECT_EQ(got[0], "root");
  EXPECT_EQ(got[1], "root");
  for (const testing::HostCase& c : cases) EXPECT_TRUE(c.out == base.out);
  EXPECT_THROW(context_parallel_workspace_size(cases[0].args(), 0), Error);
  // all_gather sizes that differ: an error on every rank, no hang.
  got = on_every_rank(3, [&](int r, Communicator& comm) {
    std::vector<char> send(r == 2 ? 8 : 4), recv(3 * send.size());
    comm.all_gather(send.data(), recv.data(), send.size(), nullptr);
  });
  for (const std::string& a : got) EXPECT_EQ(a, "bytes");
  EXPECT_THROW(make_local_group(0), Error);
}

}  // namespace
}  // namespace pagedattn
