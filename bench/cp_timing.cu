// pagedattn-cp-bench on CUDA (cp_timing.hpp). Every device fills its cache from a counter hash of
// the logical block (device_random.cuh), so the single device and the ranks hold the same keys
// and values without copies, each in its own random block order. A sample is one CUDA graph of
// steps_per_sample steps replayed between two events; the ranks start each sample together (a
// spinning barrier) and the slowest rank's time counts.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cp_barrier.hpp"
#include "cp_timing.hpp"
#include "cuda_events.hpp"
#include "device_random.cuh"
#include "pagedattn/cache_layout.hpp"
#include "pagedattn/testing/cuda_check.hpp"
#include "pagedattn/testing/device_memory.hpp"

namespace pagedattn::bench {
namespace {

using testing::check_cuda;
using testing::DeviceBuffer;

constexpr int kSpareBlocks = 7;

template <typename T>
__global__ void fill_blocks(T* pool, const std::int32_t* logical_of, std::int64_t block_elems,
                            std::int64_t total, std::uint64_t seed) {
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t p = i / block_elems;
    const std::int64_t logical = logical_of[p];
    pool[i] = from_f<T>(hashed_normal(
        seed, static_cast<std::uint64_t>(logical * block_elems + (i - p * block_elems))));
  }
}

void fill(void* pool, DType t, const std::int32_t* logical_of, std::int64_t block_elems,
          std::int64_t blocks, std::uint64_t seed) {
  const std::int64_t total = block_elems * blocks;
  const int grid = static_cast<int>(std::min<std::int64_t>((total + 255) / 256, 132 * 32));
  switch (t) {
    case DType::kF32:
      fill_blocks<<<grid, 256>>>(static_cast<float*>(pool), logical_of, block_elems, total, seed);
      break;
    case DType::kF16:
      fill_blocks<<<grid, 256>>>(static_cast<__half*>(pool), logical_of, block_elems, total, seed);
      break;
    case DType::kBF16:
      fill_blocks<<<grid, 256>>>(static_cast<__nv_bfloat16*>(pool), logical_of, block_elems, total,
                                 seed);
      break;
  }
  check_cuda(cudaGetLastError(), "fill_blocks");
}

// One device's share: blocks [lo, hi) of the sequence in a pool of its own, in random order.
struct Share {
  DeviceBuffer q, k, v, table, lens, out, lse, ws;
  DecodeArgs args;
  cudaStream_t stream = nullptr;

  // ranks > 0: a workspace for context_parallel_decode over that many ranks; 0: for decode.
  Share(const CpShape& s, int lo, int hi, int ranks, std::uint64_t order_seed) {
    const int nb = hi - lo;
    const int pool_blocks = nb + kSpareBlocks;
    const int tokens = std::max(0, std::min(hi * s.block_size, s.context) - lo * s.block_size);
    const std::int64_t block_elems =
        static_cast<std::int64_t>(s.kv_heads) * s.block_size * s.head_dim;
    const std::size_t esz = dtype_size(s.dtype);
    std::vector<std::int32_t> perm(pool_blocks), logical_of(pool_blocks);
    std::iota(perm.begin(), perm.end(), 0);
    std::mt19937_64 rng(order_seed);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int i = 0; i < pool_blocks; ++i) {
      // Blocks past the share hold values of their own, never read.
      logical_of[perm[i]] = i < nb ? lo + i : 1'000'000'000 + i;
    }
    DeviceBuffer logical(logical_of.data(), logical_of.size() * 4);
    k = DeviceBuffer(block_elems * pool_blocks * esz);
    v = DeviceBuffer(block_elems * pool_blocks * esz);
    fill(k.get(), s.dtype, logical.as<std::int32_t>(), block_elems, pool_blocks, 11);
    fill(v.get(), s.dtype, logical.as<std::int32_t>(), block_elems, pool_blocks, 12);
    const std::size_t qo = static_cast<std::size_t>(s.heads) * s.head_dim;
    q = DeviceBuffer(qo * esz);
    const std::int32_t zero = 0;
    DeviceBuffer q_index(&zero, 4);
    fill(q.get(), s.dtype, q_index.as<std::int32_t>(), static_cast<std::int64_t>(qo), 1, 13);
    std::vector<std::int32_t> row(std::max(nb, 1), -1);
    for (int i = 0; i < nb; ++i) row[i] = perm[i];
    table = DeviceBuffer(row.data(), row.size() * 4);
    lens = DeviceBuffer(&tokens, 4);
    out = DeviceBuffer(qo * esz);
    lse = DeviceBuffer(static_cast<std::size_t>(s.heads) * 4);
    check_cuda(cudaDeviceSynchronize(), "fill");
    args =
        share_args(s, pool_blocks, static_cast<int>(row.size()), q.get(), k.get(), v.get(),
                   table.as<std::int32_t>(), lens.as<std::int32_t>(), out.get(), lse.as<float>());
    ws = DeviceBuffer(ranks > 0 ? context_parallel_workspace_size(args, ranks)
                                : cuda_workspace_size(args));
    check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  ~Share() { cudaStreamDestroy(stream); }

  DecodeOptions options() const {
    DecodeOptions o;
    o.backend = Backend::kCuda;
    o.cuda_stream = stream;
    o.workspace = ws.get();
    o.workspace_bytes = ws.size();
    return o;
  }
};

// Captures `steps` calls of step() on the share's stream into one graph.
template <typename Step>
cudaGraphExec_t capture(const Share& sh, int steps, Step step) {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  check_cuda(cudaStreamBeginCapture(sh.stream, cudaStreamCaptureModeThreadLocal),
             "cudaStreamBeginCapture");
  for (int i = 0; i < steps; ++i) step();
  check_cuda(cudaStreamEndCapture(sh.stream, &graph), "cudaStreamEndCapture");
  check_cuda(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
  cudaGraphDestroy(graph);
  return exec;
}

// Milliseconds of one replay of `exec` on the share's stream.
double time_replay(const Share& sh, cudaGraphExec_t exec, cudaEvent_t a, cudaEvent_t b) {
  check_cuda(cudaEventRecord(a, sh.stream), "cudaEventRecord");
  check_cuda(cudaGraphLaunch(exec, sh.stream), "cudaGraphLaunch");
  check_cuda(cudaEventRecord(b, sh.stream), "cudaEventRecord");
  check_cuda(cudaEventSynchronize(b), "cudaEventSynchronize");
  float ms = 0;
  check_cuda(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
  return ms;
}

StepResult download(const Share& sh, const CpShape& s) {
  StepResult r{std::vector<std::uint8_t>(static_cast<std::size_t>(s.heads) * s.head_dim *
                                         dtype_size(s.dtype)),
               std::vector<float>(s.heads)};
  sh.out.to_host(r.out);
  sh.lse.to_host(r.lse);
  return r;
}

}  // namespace

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

CpRow time_cuda(const CpShape& s, const std::vector<Communicator*>& comms,
                const std::vector<int>& devices, const CpTimingOptions& o) {
  const int ranks = static_cast<int>(comms.size());
  const int nb = blocks_for(s.context, s.block_size);
  const int K = o.steps_per_sample;
  CpRow row;
  row.kv_bytes = 2.0 * s.context * s.kv_heads * s.head_dim * dtype_size(s.dtype);

  // The whole context on the first device.
  StepResult single;
  {
    check_cuda(cudaSetDevice(devices[0]), "cudaSetDevice");
    Share sh(s, 0, nb, 0, 1);
    const DecodeOptions opt = sh.options();
    decode(sh.args, opt);  // warm-up
    check_cuda(cudaStreamSynchronize(sh.stream), "warm-up");
    cudaGraphExec_t exec = capture(sh, K, [&] { decode(sh.args, opt); });
    Events ev;
    time_replay(sh, exec, ev.a, ev.b);
    std::vector<double> samples;
    for (int i = 0; i < o.samples; ++i) samples.push_back(time_replay(sh, exec, ev.a, ev.b));
    cudaGraphExecDestroy(exec);
    row.single_ms = median(samples) / K;
    single = download(sh, s);
  }

  // The group: rank r holds blocks [r * nb / ranks, (r + 1) * nb / ranks).
  const StepResult grouped = time_group(row, o, ranks, nb, [&](const GroupRank& g) {
    check_cuda(cudaSetDevice(devices[g.rank]), "cudaSetDevice");
    Share sh(s, g.lo, g.hi, ranks, 100 + g.rank);
    const DecodeOptions opt = sh.options();
    auto step = [&] { context_parallel_decode(sh.args, *comms[g.rank], opt, g.cp); };
    step();  // warm-up; NCCL connects its peers here, outside any capture
    check_cuda(cudaStreamSynchronize(sh.stream), "warm-up");
    g.barrier.wait();
    cudaGraphExec_t exec = capture(sh, K, step);
    Events ev;
    g.barrier.wait();
    time_replay(sh, exec, ev.a, ev.b);
    for (int i = 0; i < o.samples; ++i) {
      g.barrier.wait();
      g.samples[i] = time_replay(sh, exec, ev.a, ev.b);
    }
    cudaGraphExecDestroy(exec);
    return g.root ? download(sh, s) : StepResult{};
  });
  row.state_bytes = state_bytes(s);
  compare_results(row, s.dtype, single, grouped);
  return row;
}

}  // namespace pagedattn::bench
