// The CUDA side of pagedattn-bench: the GPU read ceiling (a streaming-read kernel, best of
// several grids and unroll depths) and the timing of one shape through the public API: CUDA
// events, median, CUDA-graph replay by default, inputs rotated over several sets so that together
// they exceed the L2 several times.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <random>
#include <vector>

#include "cuda_events.hpp"
#include "cuda_timing.hpp"
#include "device_random.cuh"
#include "median.hpp"
#include "pagedattn/cache_layout.hpp"
#include "pagedattn/dtype.hpp"
#include "pagedattn/reference.hpp"
#include "pagedattn/testing/cuda_check.hpp"
#include "pagedattn/testing/device_memory.hpp"
#include "pagedattn/testing/kv_layouts.hpp"
#include "pagedattn/testing/tables.hpp"

namespace pagedattn::bench {
namespace {

using testing::check_cuda;
using testing::DeviceBuffer;

// ---- read ceiling ----
template <int UNROLL>
__global__ void read_kernel(const int4* __restrict__ p, std::size_t n, int* sink) {
  int acc = 0;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + (UNROLL - 1) * stride < n; i += UNROLL * stride) {
    int4 v[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) v[u] = __ldcs(p + i + u * stride);
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < n; i += stride) {
    const int4 v = p[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x7fffffff) *sink = acc;
}

// ---- random inputs on the device (device_random.cuh) ----
template <typename T>
__global__ void fill_normal(T* p, std::size_t n, std::uint64_t seed) {
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    p[i] = from_f<T>(hashed_normal(seed, i));
  }
}

// A quantized cache's codes: N(0, 1) values divided by the cache's scale, through the library's
// own conversion (round to nearest even, saturating). A finite value never gives a NaN code: e4m3
// saturates at 448, e5m2 at 57344, far beyond the fp8 codes' spread of 2; int8 at 127, about four
// of its codes' standard deviations of 32.
template <typename T>
__global__ void fill_normal_codes(T* p, std::size_t n, std::uint64_t seed, float inv_scale) {
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    p[i] = from_float<T>(hashed_normal(seed, i) * inv_scale);
  }
}

// Per-token scales: 2^-1, 2^0 or 2^1 by a hash of (seed, i).
__global__ void fill_token_scales(float* p, std::size_t n, std::uint64_t seed) {
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    p[i] = static_cast<float>(1u << (hash32(seed * 0x9E3779B97F4A7C15ull + i) % 3)) * 0.5f;
  }
}

// n elements of dtype t from seed: N(0, 1) values (for fp8, their codes at kFp8KvScale; for int8,
// at kInt8KvScale).
void fill(void* p, DType t, std::size_t n, std::uint64_t seed) {
  if (n == 0) return;
  const int grid = static_cast<int>(std::min<std::size_t>((n + 255) / 256, 132 * 32));
  switch (t) {
    case DType::kFP8E4M3:
      fill_normal_codes<<<grid, 256>>>(static_cast<fp8_e4m3_t*>(p), n, seed, 1.f / kFp8KvScale);
      break;
    case DType::kFP8E5M2:
      fill_normal_codes<<<grid, 256>>>(static_cast<fp8_e5m2_t*>(p), n, seed, 1.f / kFp8KvScale);
      break;
    case DType::kInt8:
      fill_normal_codes<<<grid, 256>>>(static_cast<int8_code_t*>(p), n, seed, 1.f / kInt8KvScale);
      break;
    case DType::kF32:
      fill_normal<<<grid, 256>>>(static_cast<float*>(p), n, seed);
      break;
    case DType::kF16:
      fill_normal<<<grid, 256>>>(static_cast<__half*>(p), n, seed);
      break;
    case DType::kBF16:
      fill_normal<<<grid, 256>>>(static_cast<__nv_bfloat16*>(p), n, seed);
      break;
  }
  check_cuda(cudaGetLastError(), "fill_normal");
}

// One input set: its own cache pool, table (a random permutation when fragmented), q, out. In a
// layout that keeps K and V in one buffer, k holds both and v is empty.
struct InputSet {
  DeviceBuffer q, k, v, table, lens, out, lse, q_indptr;
  DecodeArgs args;
  DeviceBuffer k_token_scales, v_token_scales;  // with CudaTimingOptions::token_scales
};

// Points a's caches at k and v (v unused where the layout shares one buffer) with the layout's
// strides, a.k_dtype set; the default HND keeps kv_strides 0, as every caller without a layout.
void apply_layout(testing::KvLayout layout, const testing::KvGeometry& g, const void* k,
                  const void* v, DecodeArgs& a) {
  testing::KvStorage view;
  view.layout = layout;
  view.geometry = g;
  view.apply(a, k, v);
  if (layout == testing::KvLayout::kHnd) a.kv_strides = CacheStrides{};
}

}  // namespace

double cuda_read_ceiling_gbps() {
  std::size_t free_b = 0, total_b = 0;
  check_cuda(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
  const std::size_t bytes =
      std::min<std::size_t>(std::size_t(4) << 30, free_b / 2) & ~std::size_t(15);
  const std::size_t n = bytes / 16;
  DeviceBuffer buf(bytes), sink(16);
  check_cuda(cudaMemset(buf.get(), 1, bytes), "cudaMemset");
  int dev = 0, sms = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "attribute");
  Events ev;
  double best = 0;
  auto trial = [&](auto kernel, int blocks, int threads) {
    kernel<<<blocks, threads>>>(static_cast<const int4*>(buf.get()), n,
                                static_cast<int*>(sink.get()));
    check_cuda(cudaDeviceSynchronize(), "read_kernel");
    float best_ms = 1e30f;
    for (int r = 0; r < 10; ++r) {
      cudaEventRecord(ev.a);
      kernel<<<blocks, threads>>>(static_cast<const int4*>(buf.get()), n,
                                  static_cast<int*>(sink.get()));
      cudaEventRecord(ev.b);
      check_cuda(cudaEventSynchronize(ev.b), "cudaEventSynchronize");
      float ms = 0;
      cudaEventElapsedTime(&ms, ev.a, ev.b);
      best_ms = std::min(best_ms, ms);
    }
    best = std::max(best, bytes / (best_ms * 1e-3) / 1e9);
  };
  for (int threads : {256, 512, 1024}) {
    for (int per_sm : {1, 2, 4, 8, 16}) {
      if (threads * per_sm > 2048) continue;
      trial(read_kernel<4>, sms * per_sm, threads);
      trial(read_kernel<8>, sms * per_sm, threads);
    }
  }
  return best;
}

double cuda_time_steps(const std::function<void(int, void*)>& step, int reps, void* stream,
                       bool graph, int min_iterations) {
  cudaStream_t own = nullptr;
  if (stream == nullptr) {
    check_cuda(cudaStreamCreateWithFlags(&own, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  const cudaStream_t s = own != nullptr ? own : static_cast<cudaStream_t>(stream);
  auto enqueue = [&] {
    for (int r = 0; r < reps; ++r) step(r, s);
  };
  Events ev;
  std::vector<double> samples;
  cudaGraphExec_t exec = nullptr;
  cudaGraph_t g = nullptr;
  if (graph) {
    check_cuda(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "BeginCapture");
    enqueue();
    check_cuda(cudaStreamEndCapture(s, &g), "EndCapture");
    check_cuda(cudaGraphInstantiate(&exec, g, 0), "cudaGraphInstantiate");
    check_cuda(cudaGraphLaunch(exec, s), "cudaGraphLaunch");  // warm-up
  } else {
    enqueue();
  }
  check_cuda(cudaStreamSynchronize(s), "warm-up");
  const int repeats = std::max(5, min_iterations / 4);
  for (int it = 0; it < repeats; ++it) {
    check_cuda(cudaEventRecord(ev.a, s), "cudaEventRecord");
    if (graph) {
      check_cuda(cudaGraphLaunch(exec, s), "cudaGraphLaunch");
    } else {
      enqueue();
    }
    check_cuda(cudaEventRecord(ev.b, s), "cudaEventRecord");
    check_cuda(cudaEventSynchronize(ev.b), "cudaEventSynchronize");
    float ms = 0;
    check_cuda(cudaEventElapsedTime(&ms, ev.a, ev.b), "cudaEventElapsedTime");
    samples.push_back(ms / reps);
  }
  if (exec) cudaGraphExecDestroy(exec);
  if (g) cudaGraphDestroy(g);
  if (own) cudaStreamDestroy(own);
  return median(samples);
}

Timing cuda_time_shape(const Shape& s, DType dtype, const CudaTimingOptions& options) {
  const int B = s.batch, H = s.heads, KV = s.kv_heads, D = s.head_dim, BS = s.block_size;
  std::vector<std::int32_t> host_lens(B);
  int max_blocks = 0, used_blocks = 0;
  for (int b = 0; b < B; ++b) {
    host_lens[b] = s.context_of(b);
    max_blocks = std::max(max_blocks, blocks_for(host_lens[b], BS));
    used_blocks += blocks_for(host_lens[b], BS);
  }
  const int num_blocks = used_blocks + 7;
  // Elements of one cache buffer in the layout: K's and V's each, or the one both share (for
  // the gapless layouts pagedattn-bench offers, a set holds just the dense K and V bytes).
  const testing::KvGeometry geometry = testing::kv_geometry(options.layout, num_blocks, KV, BS, D);
  const std::size_t cache_elems = static_cast<std::size_t>(geometry.elements);
  const int kv_buffers = geometry.shared ? 1 : 2;
  const DType kv_dtype = options.kv_dtype.value_or(dtype);
  const std::size_t esz = dtype_size(dtype), kv_esz = dtype_size(kv_dtype);
  const double kv_set_bytes = static_cast<double>(kv_buffers) * cache_elems * kv_esz;
  // Enough sets that the rotation spans at least 4x a 60 MB L2 (the H200's), at most 16 sets
  // and at most half the free memory.
  std::size_t free_b = 0, total_b = 0;
  check_cuda(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
  int sets = static_cast<int>(std::ceil(240e6 / std::max(kv_set_bytes, 1.0)));
  sets = std::max(2, std::min(sets, 16));
  while (sets > 1 && sets * kv_set_bytes > 0.5 * static_cast<double>(free_b)) --sets;

  // The variants' per-head values, on the host for the reference and on the device for decode
  // (one copy serves every set: they are read-only and tiny).
  const Variants& variants = options.variants;
  const VariantValues host_values(variants, H);
  const DeviceBuffer slopes(host_values.slopes.data(), host_values.slopes.size() * sizeof(float));
  const DeviceBuffer sinks(host_values.sinks.data(), host_values.sinks.size() * sizeof(float));

  std::mt19937_64 rng(20261129u + static_cast<std::uint64_t>(B) * 131 + s.context);
  std::vector<InputSet> in;
  in.reserve(sets);
  // q, out and lse have a row per query token: batch * q_len with q_len query tokens per
  // sequence (q_indptr uniform), batch without.
  const std::vector<std::int32_t> host_q_indptr = uniform_q_indptr(B, s.q_len);
  // --tree-mask: one set of masks serves every input set (read-only).
  std::optional<TreeMasks> host_tree;
  DeviceBuffer tree_bits, tree_indptr;
  if (options.tree_mask && s.q_len > 1) {
    host_tree = random_tree_masks(B, s.q_len);
    tree_bits = DeviceBuffer(host_tree->bits.data(), host_tree->bits.size());
    tree_indptr = DeviceBuffer(host_tree->indptr.data(), host_tree->indptr.size() * 4);
  }
  const std::size_t rows = static_cast<std::size_t>(s.q_rows());
  const std::size_t qo = rows * H * D;
  std::vector<std::vector<std::int32_t>> tables;
  for (int i = 0; i < sets; ++i) {
    // Each row takes its sequence's blocks from the (shuffled) pool; -1 past its context.
    const std::vector<std::int32_t> host_table = testing::table_from_pool(
        testing::block_pool(num_blocks, !options.contiguous, rng), host_lens, BS, max_blocks);
    tables.push_back(host_table);
    InputSet set{DeviceBuffer(qo * esz),
                 DeviceBuffer(cache_elems * kv_esz),
                 geometry.shared ? DeviceBuffer() : DeviceBuffer(cache_elems * kv_esz),
                 DeviceBuffer(host_table.size() * 4),
                 DeviceBuffer(B * 4),
                 DeviceBuffer(qo * esz),
                 DeviceBuffer(rows * H * 4),
                 DeviceBuffer(host_q_indptr.data(), host_q_indptr.size() * 4),
                 {},
                 {},
                 {}};
    fill(set.q.get(), dtype, qo, 3 * i + 1);
    fill(set.k.get(), kv_dtype, cache_elems, 3 * i + 2);
    if (!geometry.shared) fill(set.v.get(), kv_dtype, cache_elems, 3 * i + 3);
    check_cuda(cudaMemcpy(set.table.get(), host_table.data(), host_table.size() * 4,
                          cudaMemcpyHostToDevice),
               "cudaMemcpy(table)");
    check_cuda(cudaMemcpy(set.lens.get(), host_lens.data(), B * 4, cudaMemcpyHostToDevice),
               "cudaMemcpy(lens)");
    DecodeArgs& a = set.args;
    a.batch = B;
    a.num_heads = H;
    a.num_kv_heads = KV;
    a.head_dim = D;
    a.block_size = BS;
    a.num_blocks = num_blocks;
    a.max_blocks_per_seq = max_blocks;
    a.q = set.q.get();
    a.q_dtype = a.out_dtype = dtype;
    a.k_dtype = a.v_dtype = kv_dtype;
    if (is_fp8(kv_dtype)) a.k_scale = a.v_scale = kFp8KvScale;
    if (kv_dtype == DType::kInt8) a.k_scale = a.v_scale = kInt8KvScale;
    apply_layout(options.layout, geometry, set.k.get(), set.v.get(), a);
    a.block_table = static_cast<const std::int32_t*>(set.table.get());
    a.context_lens = static_cast<const std::int32_t*>(set.lens.get());
    a.out = set.out.get();
    a.lse = static_cast<float*>(set.lse.get());
    apply_variants(variants, static_cast<const float*>(slopes.get()),
                   static_cast<const float*>(sinks.get()), a);
    apply_q_len(s.q_len, static_cast<const std::int32_t*>(set.q_indptr.get()), a);
    if (host_tree) {
      a.tree_mask = tree_bits.as<const std::uint8_t>();
      a.tree_mask_indptr = tree_indptr.as<const std::int32_t>();
    }
    if (options.token_scales) {
      const std::size_t rows_of_pool = static_cast<std::size_t>(num_blocks) * KV * BS;
      set.k_token_scales = DeviceBuffer(rows_of_pool * 4);
      set.v_token_scales = DeviceBuffer(rows_of_pool * 4);
      const int grid = static_cast<int>(std::min<std::size_t>((rows_of_pool + 255) / 256, 4224));
      fill_token_scales<<<grid, 256>>>(set.k_token_scales.as<float>(), rows_of_pool, 3 * i + 2);
      fill_token_scales<<<grid, 256>>>(set.v_token_scales.as<float>(), rows_of_pool, 3 * i + 3);
      check_cuda(cudaGetLastError(), "fill_token_scales");
      a.k_token_scales = set.k_token_scales.as<const float>();
      a.v_token_scales = set.v_token_scales.as<const float>();
    }
    in.push_back(std::move(set));
  }
  check_cuda(cudaDeviceSynchronize(), "fill");

  cudaStream_t stream;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  DecodeOptions opt;
  opt.batch_invariant = options.batch_invariant;
  const std::size_t ws_bytes = cuda_workspace_size(in[0].args, opt);
  DeviceBuffer ws(ws_bytes);
  opt.backend = Backend::kCuda;
  opt.cuda_stream = stream;
  opt.workspace = ws.get();
  opt.workspace_bytes = ws_bytes;
  for (int i = 0; i < sets; ++i) decode(in[i].args, opt);  // warm-up, module load
  check_cuda(cudaStreamSynchronize(stream), "warm-up");

  // Accuracy: the f64 reference over a subsample of set 0's sequences (at most ~64K tokens),
  // when the cache fits comfortably in host memory; NaN otherwise.
  double rel_err = std::nan("");
  // With tree masks, only when sequence 0's every query token fits the reference's budget (the
  // masks of a tail of its query tokens are not the tail of its mask).
  constexpr double kBudget = 65536;
  const bool tail_only = static_cast<double>(host_lens[0]) * s.q_len > kBudget;
  if (kv_set_bytes <= 3e9 && !(host_tree && tail_only)) {
    std::vector<std::uint8_t> hq(qo * esz), hk(cache_elems * kv_esz),
        hv(geometry.shared ? 0 : cache_elems * kv_esz), hout(qo * esz);
    check_cuda(cudaMemcpy(hq.data(), in[0].q.get(), hq.size(), cudaMemcpyDeviceToHost), "copy q");
    check_cuda(cudaMemcpy(hk.data(), in[0].k.get(), hk.size(), cudaMemcpyDeviceToHost), "copy k");
    if (!hv.empty()) {
      check_cuda(cudaMemcpy(hv.data(), in[0].v.get(), hv.size(), cudaMemcpyDeviceToHost), "copy v");
    }
    check_cuda(cudaMemcpy(hout.data(), in[0].out.get(), hout.size(), cudaMemcpyDeviceToHost),
               "copy out");
    // The reference attends each query token over its own context, so with q_len query tokens
    // a sequence costs q_len contexts. When sequence 0's alone exceed the budget only its last
    // m >= 1 are checked: they attend exactly as the m query tokens of a sequence with m would.
    int sub = 0;
    for (double tokens = 0;
         sub < B && (sub == 0 || tokens + static_cast<double>(host_lens[sub]) * s.q_len <= kBudget);
         ++sub) {
      tokens += static_cast<double>(host_lens[sub]) * s.q_len;
    }
    int m = s.q_len;  // sequence 0's query tokens checked: its last m
    if (sub == 1 && static_cast<double>(host_lens[0]) * s.q_len > kBudget) {
      m = static_cast<int>(std::max(
          1.0, std::min<double>(s.q_len, std::floor(kBudget / std::max(host_lens[0], 1)))));
    }
    const std::size_t row0 = static_cast<std::size_t>(s.q_len - m);  // the first row checked
    const std::int32_t tail_indptr[2] = {0, m};
    DecodeArgs h = in[0].args;
    h.batch = sub;
    h.q = hq.data() + row0 * H * D * esz;
    apply_layout(options.layout, geometry, hk.data(), hv.data(), h);
    h.block_table = tables[0].data();
    h.context_lens = host_lens.data();
    h.out = nullptr;
    h.lse = nullptr;
    apply_variants(variants, host_values.slopes.data(), host_values.sinks.data(), h);
    apply_q_len(s.q_len, m < s.q_len ? tail_indptr : host_q_indptr.data(), h);
    if (h.q_indptr) h.num_q_tokens = m < s.q_len ? m : host_q_indptr[sub];
    if (host_tree) {  // every query token of the first `sub` sequences (m = q_len: see above)
      h.tree_mask = host_tree->bits.data();
      h.tree_mask_indptr = host_tree->indptr.data();
    }
    std::vector<float> hks, hvs;
    if (options.token_scales) {
      hks.resize(in[0].k_token_scales.size() / 4);
      hvs.resize(hks.size());
      in[0].k_token_scales.to_host(hks);
      in[0].v_token_scales.to_host(hvs);
      h.k_token_scales = hks.data();
      h.v_token_scales = hvs.data();
    }
    std::vector<std::uint8_t> scratch(qo * esz);
    h.out = scratch.data();
    const ReferenceResult ref = reference_decode(h);
    double scale = 1e-30, err = 0;
    for (std::size_t i = 0; i < ref.out.size(); ++i) {
      scale = std::max(scale, std::fabs(ref.out[i]));
      const double got = load_as_float(hout.data(), dtype, row0 * H * D + i);
      err = std::isfinite(got) ? std::max(err, std::fabs(got - ref.out[i]))
                               : std::numeric_limits<double>::infinity();
    }
    rel_err = err / scale;
  }

  const double ms = cuda_time_steps(
      [&](int r, void* step_stream) {
        DecodeOptions o = opt;
        o.cuda_stream = step_stream;
        decode(in[r % sets].args, o);
      },
      std::max(sets, 20), stream, options.graph, options.min_iterations);
  cudaStreamDestroy(stream);
  return Timing{ms, rel_err};
}

}  // namespace pagedattn::bench
