// Performance probes that pagedattn-bench's uniform shapes cannot express. Disabled by default
// (they time, they assert nothing about speed); the GPU job runs them with
// --gtest_also_run_disabled_tests and reads the "perf" lines. READ_CEILING_GBPS, when set, turns
// GB/s into a percentage of the read ceiling measured in the same job.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <vector>

#include "pagedattn/pagedattn.hpp"

// The CUDA runtime is linked only when the CUDA backend is built (tests/CMakeLists.txt).
#if defined(PAGEDATTN_TESTS_WITH_CUDA) && PAGEDATTN_TESTS_WITH_CUDA
#include <cuda_runtime.h>
#define PAGEDATTN_TEST_HAS_CUDA_RUNTIME 1
#endif

namespace pagedattn {
namespace {

#ifdef PAGEDATTN_TEST_HAS_CUDA_RUNTIME

void ok(cudaError_t e) { ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e); }

// Fills a device buffer with random bf16 values (|x| < 2), never zeros: a random host chunk
// copied over the buffer at shifting offsets.
void fill_bf16(void* dst, std::size_t elems, std::mt19937_64& rng) {
  const std::size_t chunk = std::min<std::size_t>(elems, 1u << 24);
  std::vector<std::uint16_t> host(chunk + 4096);
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  for (auto& h : host) h = from_float<bf16_t>(u(rng)).bits;
  for (std::size_t at = 0, k = 0; at < elems; at += chunk, ++k) {
    const std::size_t n = std::min(chunk, elems - at);
    ok(cudaMemcpy(static_cast<std::uint16_t*>(dst) + at, host.data() + (k * 977) % 4096, n * 2,
                  cudaMemcpyHostToDevice));
  }
}

// One 131072-token sequence among 63 of 1024 (bf16, H=32, KV=8, D=128, block 16, fragmented
// table), timed as CUDA-graph replays: the skewed-batch target.
TEST(CudaPerf, DISABLED_SkewedBatch) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const int B = 64, H = 32, KV = 8, D = 128, BS = 16;
  std::vector<std::int32_t> lens(B, 1024);
  lens[B / 2] = 131072;
  const int max_blocks = 131072 / BS;
  std::int64_t total_blocks = 0;
  for (int L : lens) total_blocks += (L + BS - 1) / BS;
  const int num_blocks = static_cast<int>(total_blocks) + 11;
  std::mt19937_64 rng(7);
  std::vector<std::int32_t> pool(num_blocks);
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  std::vector<std::int32_t> table(static_cast<std::size_t>(B) * max_blocks, -1);
  std::size_t next = 0;
  for (int b = 0; b < B; ++b) {
    for (int i = 0; i < (lens[b] + BS - 1) / BS; ++i) {
      table[static_cast<std::size_t>(b) * max_blocks + i] = pool[next++];
    }
  }
  const std::size_t cache = static_cast<std::size_t>(num_blocks) * KV * BS * D;
  void *q, *k, *v, *out, *dt, *dl;
  ok(cudaMalloc(&q, static_cast<std::size_t>(B) * H * D * 2));
  ok(cudaMalloc(&k, cache * 2));
  ok(cudaMalloc(&v, cache * 2));
  ok(cudaMalloc(&out, static_cast<std::size_t>(B) * H * D * 2));
  ok(cudaMalloc(&dt, table.size() * 4));
  ok(cudaMalloc(&dl, lens.size() * 4));
  fill_bf16(q, static_cast<std::size_t>(B) * H * D, rng);
  fill_bf16(k, cache, rng);
  fill_bf16(v, cache, rng);
  ok(cudaMemcpy(dt, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
  ok(cudaMemcpy(dl, lens.data(), lens.size() * 4, cudaMemcpyHostToDevice));
  DecodeArgs a;
  a.batch = B;
  a.num_heads = H;
  a.num_kv_heads = KV;
  a.head_dim = D;
  a.block_size = BS;
  a.num_blocks = num_blocks;
  a.max_blocks_per_seq = max_blocks;
  a.q = q;
  a.k_cache = k;
  a.v_cache = v;
  a.q_dtype = a.k_dtype = a.v_dtype = a.out_dtype = DType::kBF16;
  a.block_table = static_cast<const std::int32_t*>(dt);
  a.context_lens = static_cast<const std::int32_t*>(dl);
  a.out = out;
  cudaStream_t s;
  ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const std::size_t ws_bytes = cuda_workspace_size(a);
  void* ws;
  ok(cudaMalloc(&ws, ws_bytes));
  DecodeOptions o;
  o.backend = Backend::kCuda;
  o.cuda_stream = s;
  o.workspace = ws;
  o.workspace_bytes = ws_bytes;
  decode(a, o);
  ok(cudaStreamSynchronize(s));
  const int reps = 10;
  cudaGraph_t g;
  cudaGraphExec_t ge;
  ok(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int r = 0; r < reps; ++r) decode(a, o);
  ok(cudaStreamEndCapture(s, &g));
  ok(cudaGraphInstantiate(&ge, g, 0));
  ok(cudaGraphLaunch(ge, s));
  ok(cudaStreamSynchronize(s));
  cudaEvent_t e0, e1;
  ok(cudaEventCreate(&e0));
  ok(cudaEventCreate(&e1));
  std::vector<float> ms;
  for (int it = 0; it < 15; ++it) {
    ok(cudaEventRecord(e0, s));
    ok(cudaGraphLaunch(ge, s));
    ok(cudaEventRecord(e1, s));
    ok(cudaEventSynchronize(e1));
    float t = 0;
    ok(cudaEventElapsedTime(&t, e0, e1));
    ms.push_back(t / reps);
  }
  std::sort(ms.begin(), ms.end());
  const double med = ms[ms.size() / 2];
  const double bytes = 2.0 * static_cast<double>(total_blocks) * BS * KV * D * 2;
  const double gbps = bytes / (med * 1e-3) / 1e9;
  const char* ceil_env = std::getenv("READ_CEILING_GBPS");
  const double ceiling = ceil_env ? std::atof(ceil_env) : 0;
  std::printf(
      "perf skewed_batch B=64 (1x131072 + 63x1024) H=32 KV=8 D=128 BS=16 bf16: %.4f ms, "
      "%.0f GB/s, %.1f%% of %.0f GB/s\n",
      med, gbps, ceiling > 0 ? 100.0 * gbps / ceiling : 0.0, ceiling);
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaStreamDestroy(s);
  for (void* p : {q, k, v, out, dt, dl, ws}) cudaFree(p);
}

#endif  // PAGEDATTN_TEST_HAS_CUDA_RUNTIME

}  // namespace
}  // namespace pagedattn
