// pagedattn-microbench: Google Benchmark micro-benchmarks of the pieces under decode, on inputs
// that stay in cache, so they measure instruction throughput rather than memory bandwidth
// (pagedattn-bench measures the latter). Bytes/s counters count the K/V bytes read.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "pagedattn/dtype.hpp"
#include "pagedattn/online_softmax.hpp"
#include "pagedattn/testing/random_case.hpp"

namespace {

using pagedattn::DType;

// One decode step whose K/V (128 KB to 1 MB) fits in L2/L3: the CPU kernel's compute rate. An
// fp8 cache is read by a bf16 q into a bf16 out (the serving case), with scales of 0.5.
void BM_CpuDecodeInCache(benchmark::State& state) {
  const DType dtype = static_cast<DType>(state.range(0));
  const int group = static_cast<int>(state.range(1));
  pagedattn::testing::CaseSpec spec;
  spec.batch = 1;
  spec.num_kv_heads = 2;
  spec.num_heads = 2 * group;
  spec.head_dim = 128;
  spec.block_size = 16;
  spec.context_lens = {512};
  spec.kv_dtype = dtype;
  spec.q_dtype = spec.out_dtype = pagedattn::is_fp8(dtype) ? DType::kBF16 : dtype;
  if (pagedattn::is_fp8(dtype)) spec.k_scale = spec.v_scale = 0.5f;
  spec.poison = false;
  pagedattn::testing::HostCase c = pagedattn::testing::make_case(spec);
  pagedattn::DecodeOptions o;
  o.backend = pagedattn::Backend::kCpu;
  o.num_threads = 1;
  const pagedattn::DecodeArgs args = c.args();
  for (auto _ : state) {
    pagedattn::decode(args, o);
    benchmark::ClobberMemory();
  }
  const double kv_bytes =
      2.0 * 512 * spec.num_kv_heads * spec.head_dim * pagedattn::dtype_size(dtype);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kv_bytes));
  state.SetLabel(std::string(pagedattn::dtype_name(dtype)) + " group " + std::to_string(group));
}
BENCHMARK(BM_CpuDecodeInCache)
    ->ArgsProduct({{static_cast<int>(DType::kF32), static_cast<int>(DType::kF16),
                    static_cast<int>(DType::kBF16), static_cast<int>(DType::kFP8E4M3),
                    static_cast<int>(DType::kFP8E5M2)},
                   {1, 4, 8}});

// Merging two partial states of head_dim 128: the combine's inner step.
void BM_SoftmaxMerge(benchmark::State& state) {
  std::vector<float> a(128, 1.f), b(128, 2.f);
  pagedattn::SoftmaxState sa{1.f, 3.f};
  const pagedattn::SoftmaxState sb{2.f, 5.f};
  for (auto _ : state) {
    pagedattn::SoftmaxState s = sa;
    pagedattn::softmax_merge(s, a.data(), sb, b.data(), 128);
    benchmark::DoNotOptimize(s);
    benchmark::DoNotOptimize(a.data());
  }
}
BENCHMARK(BM_SoftmaxMerge);

// The portable (non-SIMD) conversions the reference and the slow paths use.
template <DType T>
void BM_ConvertToStorage(benchmark::State& state) {
  std::mt19937 rng(1);
  std::normal_distribution<float> dist;
  std::vector<float> x(4096);
  for (float& v : x) v = dist(rng);
  std::vector<std::uint16_t> y(x.size());
  for (auto _ : state) {
    for (std::size_t i = 0; i < x.size(); ++i) pagedattn::store_from_float(y.data(), T, i, x[i]);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * x.size()));
}
BENCHMARK(BM_ConvertToStorage<DType::kF16>);
BENCHMARK(BM_ConvertToStorage<DType::kBF16>);

}  // namespace

BENCHMARK_MAIN();
