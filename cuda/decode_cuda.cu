// The CUDA backend entry points: sizing and carving the workspace, checked mode, and the two
// launches (split partials, then combine) on the caller's stream. No allocation and no host
// synchronization when the caller passes a workspace (checked mode excepted: it must read the
// tables on the host).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "pagedattn/detail/backends.hpp"
#include "pagedattn/validate.hpp"
#include "split_kernel.cuh"

namespace pagedattn::detail::cuda {
namespace {

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    fail(ErrorCode::kDeviceError, what, cudaGetErrorName(err), cudaGetErrorString(err));
  }
}

// Waves of split CTAs the planner aims for: items = SMs x (split CTAs resident per SM) x kWaves.
// Each CTA pays a fixed start (plan, Q and page-id loads, pipeline fill: ~3 dependent memory
// round trips), so items must stay large: on the H200 one wave beat two on the single long
// sequences (B = 1, 32768 tokens: 61% of the read ceiling against 48%) and matched it elsewhere
// but for D = 64 (docs/cuda.md). Whole waves matter: the planner keeps a few long sequences'
// items within them (choose_chunk_blocks).
constexpr int kWaves = 1;
// A split covers at least this many tokens: amortizes each CTA's fixed start and keeps the
// combine cheap, while a single 4096-token sequence still spreads over 128 CTAs at 8 kv heads
// (on the H200, 256 beat 128 there, 15.7 against 17.8 us; 512 was slower again).
constexpr int kMinChunkTokens = 256;
constexpr int kMaxSplitsPerSeq = 1024;

int sm_count() {
  int dev = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  static std::mutex mu;
  static std::vector<int> cache;
  std::lock_guard<std::mutex> lock(mu);
  if (static_cast<int>(cache.size()) <= dev) cache.resize(dev + 1, 0);
  if (cache[dev] == 0) {
    int n = 0;
    check(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev),
          "cudaDeviceGetAttribute");
    cache[dev] = n;
  }
  return cache[dev];
}

// PAGEDATTN_CUDA_WAVES / PAGEDATTN_CUDA_MIN_CHUNK_TOKENS override the two constants and
// PAGEDATTN_CUDA_PDL=0 turns off the programmatic launch of the combine, for tuning experiments
// only (read once per process; the workspace size follows them).
int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  const int x = std::atoi(v);
  return x >= 0 ? x : fallback;
}

bool use_mma(const DecodeArgs& a) {
  return a.k_dtype != DType::kF32 && a.q_dtype == a.k_dtype && a.group_size() >= 4;
}

int head_chunks(const DecodeArgs& a) {
  return use_mma(a) ? 1 : (a.group_size() + kSimtHeadsPerCta - 1) / kSimtHeadsPerCta;
}

// Split CTAs of this call's kernel that fit on one SM (from the occupancy calculator, cached).
int split_ctas_per_sm(const DecodeArgs& a) {
  const bool mma = use_mma(a);
  int n = 0;
  switch (a.k_dtype) {
    case DType::kF32:
      n = split_ctas_per_sm_f32(a.head_dim);
      break;
    case DType::kF16:
      n = split_ctas_per_sm_f16(a.head_dim, mma);
      break;
    case DType::kBF16:
      n = split_ctas_per_sm_bf16(a.head_dim, mma);
      break;
  }
  return n > 0 ? n : 1;
}

// The plan's options for this call's shapes: the parallelism is whole waves of the split
// kernel's resident CTAs over the device's SMs, counted in work items (an item may take several
// CTAs).
PlanOptions plan_options(const DecodeArgs& a) {
  static const int waves = std::max(1, env_int("PAGEDATTN_CUDA_WAVES", kWaves));
  static const int min_chunk =
      std::max(1, env_int("PAGEDATTN_CUDA_MIN_CHUNK_TOKENS", kMinChunkTokens));
  PlanOptions o;
  o.parallelism = std::max(1, sm_count() * split_ctas_per_sm(a) * waves / head_chunks(a));
  o.min_chunk_tokens = min_chunk;
  o.max_splits_per_seq = kMaxSplitsPerSeq;
  return o;
}

bool use_pdl() {
  static const bool on = env_int("PAGEDATTN_CUDA_PDL", 1) != 0;
  return on;
}

// Upper bound on the plan's total splits for any context lengths within the table's capacity
// (core/split_plan.hpp): the grid covers it, so any later lengths fit the same launch.
std::int64_t max_total_splits(const DecodeArgs& a, const PlanOptions& o) {
  return max_plan_splits(a.batch, a.max_blocks_per_seq, a.num_kv_heads, a.block_size, o);
}

constexpr std::size_t align256(std::size_t n) { return (n + 255) & ~std::size_t(255); }

struct Layout {
  std::size_t offsets_bytes, ml_bytes, acc_bytes, total;
};

Layout workspace_layout(const DecodeArgs& a, std::int64_t splits) {
  Layout l;
  const std::size_t partials = static_cast<std::size_t>(splits) * a.num_heads;
  l.offsets_bytes = align256(static_cast<std::size_t>(a.batch + 1) * sizeof(int));
  l.ml_bytes = align256(partials * 2 * sizeof(float));
  l.acc_bytes = align256(partials * a.head_dim * sizeof(float));
  l.total = l.offsets_bytes + l.ml_bytes + l.acc_bytes;
  return l;
}

// The library's own workspace, for callers that pass none: one growing buffer per device.
void* cached_workspace(std::size_t bytes) {
  static std::mutex mu;
  static std::vector<std::pair<void*, std::size_t>> buffers;
  int dev = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  std::lock_guard<std::mutex> lock(mu);
  if (static_cast<int>(buffers.size()) <= dev) buffers.resize(dev + 1, {nullptr, 0});
  auto& buf = buffers[dev];
  if (buf.second < bytes) {
    if (buf.first != nullptr) {
      check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");  // the old buffer may be in use
      check(cudaFree(buf.first), "cudaFree");
      buf = {nullptr, 0};
    }
    check(cudaMalloc(&buf.first, bytes), "cudaMalloc");
    buf.second = bytes;
  }
  return buf.first;
}

// ---------------------------------------------------------------------------------------------
// Combine: one warp per (sequence, query head) merges the splits in order, finalizes out = acc / l
// and lse = (m + log2 l) * ln 2; an empty context gives out = 0, lse = -inf.

struct CombineParams {
  const float* part_ml;
  const float* part_acc;
  const int* split_offset;
  void* out;
  float* lse;
  int batch, num_heads, head_dim;
};

template <typename OutT>
__device__ __forceinline__ void store_out(void* out, std::int64_t i, float v);
template <>
__device__ __forceinline__ void store_out<float>(void* out, std::int64_t i, float v) {
  static_cast<float*>(out)[i] = v;
}
template <>
__device__ __forceinline__ void store_out<__half>(void* out, std::int64_t i, float v) {
  static_cast<__half*>(out)[i] = __float2half_rn(v);
}
template <>
__device__ __forceinline__ void store_out<__nv_bfloat16>(void* out, std::int64_t i, float v) {
  static_cast<__nv_bfloat16*>(out)[i] = __float2bfloat16_rn(v);
}

constexpr int kCombineWarps = 4;

// One warp per (sequence, query head, 32-element slice of head_dim): B=1 still spreads over
// H * head_dim / 32 warps. Each warp recomputes the row's max and sum (a few floats per split)
// and merges its slice over the splits, in split order, 32 loads in flight.
template <typename OutT>
__global__ void __launch_bounds__(kCombineWarps * 32) combine_kernel(CombineParams p) {
  // Launched programmatically after the split kernel: wait until its partials are complete and
  // visible (a no-op for a plain launch).
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  const int lane = threadIdx.x & 31;
  const int D = p.head_dim;
  const int dchunks = (D + 31) / 32;
  const std::int64_t widx =
      static_cast<std::int64_t>(blockIdx.x) * kCombineWarps + (threadIdx.x >> 5);
  if (widx >= static_cast<std::int64_t>(p.batch) * p.num_heads * dchunks) return;
  const std::int64_t idx = widx / dchunks;  // the (sequence, query head) row
  const int dc = static_cast<int>(widx - idx * dchunks);
  const int b = static_cast<int>(idx / p.num_heads), h = static_cast<int>(idx % p.num_heads);
  const int d = dc * 32 + lane;
  const int off = p.split_offset[b];
  const int ns = p.split_offset[b + 1] - off;
  const std::int64_t step = static_cast<std::int64_t>(p.num_heads) * D;  // between splits
  const float* col0 = p.part_acc + (static_cast<std::int64_t>(off) * p.num_heads + h) * D + d;
  // The first 32 splits' (m, l) and accumulator loads go out together, before the max is known:
  // one memory round trip for the common case instead of one per few splits.
  float m_first = -INFINITY, l_first = 0.f;
  if (lane < ns) {
    const std::int64_t pi = (static_cast<std::int64_t>(off) + lane) * p.num_heads + h;
    m_first = p.part_ml[2 * pi];
    l_first = p.part_ml[2 * pi + 1];
  }
  float v[32];
#pragma unroll
  for (int k = 0; k < 32; ++k) v[k] = k < ns && d < D ? col0[k * step] : 0.f;
  float mmax = m_first;
  for (int s = 32 + lane; s < ns; s += 32) {
    mmax = fmaxf(mmax, p.part_ml[2 * ((static_cast<std::int64_t>(off) + s) * p.num_heads + h)]);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) mmax = fmaxf(mmax, __shfl_xor_sync(0xffffffffu, mmax, o));
  float acc = 0.f, lsum = 0.f;
  if (mmax != -INFINITY) {
    float w = lane < ns ? exp2f(m_first - mmax) : 0.f;
    lsum = w * l_first;
#pragma unroll
    for (int k = 0; k < 32; ++k) acc = fmaf(__shfl_sync(0xffffffffu, w, k), v[k], acc);
    for (int c = 32; c < ns; c += 32) {  // long sequences: the remaining splits, 32 at a time
      w = 0.f;
      if (c + lane < ns) {
        const std::int64_t pi = (static_cast<std::int64_t>(off) + c + lane) * p.num_heads + h;
        w = exp2f(p.part_ml[2 * pi] - mmax);
        lsum += w * p.part_ml[2 * pi + 1];
      }
      const float* col = col0 + c * step;
#pragma unroll
      for (int k = 0; k < 32; ++k) v[k] = c + k < ns && d < D ? col[k * step] : 0.f;
#pragma unroll
      for (int k = 0; k < 32; ++k) acc = fmaf(__shfl_sync(0xffffffffu, w, k), v[k], acc);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) lsum += __shfl_xor_sync(0xffffffffu, lsum, o);
  }
  const float inv = lsum > 0.f ? 1.f / lsum : 0.f;
  if (d < D) store_out<OutT>(p.out, idx * D + d, acc * inv);
  if (p.lse != nullptr && dc == 0 && lane == 0) {
    p.lse[idx] = lsum > 0.f ? (mmax + log2f(lsum)) * 0.6931471805599453f : -INFINITY;
  }
}

template <typename OutT>
void launch_combine(const CombineParams& c, int grid, bool pdl, cudaStream_t stream) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(grid));
  cfg.blockDim = dim3(kCombineWarps * 32);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  check(cudaLaunchKernelEx(&cfg, combine_kernel<OutT>, c), "combine_kernel launch");
}

void require_aligned(const char* name, const void* ptr) {
  if (reinterpret_cast<std::uintptr_t>(ptr) % 16 != 0) {
    fail(ErrorCode::kInvalidArgument, name, ptr, "must be 16-byte aligned for the CUDA backend");
  }
}

}  // namespace

bool available(std::string* why) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    if (why) {
      *why = err != cudaSuccess ? std::string("no CUDA device: ") + cudaGetErrorString(err)
                                : std::string("no CUDA device present");
    }
    return false;
  }
  return true;
}

std::size_t workspace_size(const DecodeArgs& a) {
  return workspace_layout(a, max_total_splits(a, plan_options(a))).total;
}

void decode(const DecodeArgs& a, const DecodeOptions& options) {
  if (a.batch == 0) return;
  require_aligned("q", a.q);
  require_aligned("k_cache", a.k_cache);
  require_aligned("v_cache", a.v_cache);
  cudaStream_t stream = static_cast<cudaStream_t>(options.cuda_stream);
  // The grid and the workspace depend on shapes only, sized for the split plan; single_split
  // needs fewer splits, so the same grid and workspace serve it.
  PlanOptions plan = plan_options(a);
  const std::int64_t splits = max_total_splits(a, plan);
  plan.single_split = options.single_split;
  const Layout lay = workspace_layout(a, splits);
  char* ws = nullptr;
  if (options.workspace != nullptr) {
    if (options.workspace_bytes < lay.total) {
      fail(ErrorCode::kInvalidArgument, "workspace_bytes", options.workspace_bytes,
           "too small: cuda_workspace_size() = " + std::to_string(lay.total));
    }
    require_aligned("workspace", options.workspace);
    ws = static_cast<char*>(options.workspace);
  } else {
    ws = static_cast<char*>(cached_workspace(lay.total));
  }

  if (options.cuda_checked) {
    // Read the device tables back and validate them exactly as the CPU path does.
    std::vector<std::int32_t> lens(a.batch);
    const std::size_t table_elems =
        static_cast<std::size_t>(a.batch - 1) * a.table_stride() + a.max_blocks_per_seq;
    std::vector<std::int32_t> table(std::max<std::size_t>(table_elems, 1));
    check(cudaMemcpyAsync(lens.data(), a.context_lens, lens.size() * sizeof(std::int32_t),
                          cudaMemcpyDeviceToHost, stream),
          "cudaMemcpyAsync(context_lens)");
    if (table_elems > 0) {
      check(cudaMemcpyAsync(table.data(), a.block_table, table_elems * sizeof(std::int32_t),
                            cudaMemcpyDeviceToHost, stream),
            "cudaMemcpyAsync(block_table)");
    }
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    validate_tables(a, lens.data(), table.data());
  }

  SplitParams p{};
  p.q = a.q;
  p.q_dtype = static_cast<int>(a.q_dtype);
  p.k = a.k_cache;
  p.v = a.v_cache;
  p.table = a.block_table;
  p.lens = a.context_lens;
  p.batch = a.batch;
  p.num_heads = a.num_heads;
  p.num_kv_heads = a.num_kv_heads;
  p.group = a.group_size();
  p.block_size = a.block_size;
  p.num_blocks = a.num_blocks;
  p.max_blocks = a.max_blocks_per_seq;
  p.table_stride = a.table_stride();
  p.scale_log2 = a.effective_scale() * 1.4426950408889634f;
  p.plan = plan;
  p.head_chunks = head_chunks(a);
  p.split_offset = reinterpret_cast<int*>(ws);
  p.part_ml = reinterpret_cast<float*>(ws + lay.offsets_bytes);
  p.part_acc = reinterpret_cast<float*>(ws + lay.offsets_bytes + lay.ml_bytes);

  const bool mma = use_mma(a);
  if (splits > 0) {
    const std::int64_t grid64 = splits * a.num_kv_heads * p.head_chunks;
    if (grid64 > INT32_MAX) {
      fail(ErrorCode::kUnsupported, "batch", a.batch, "too many work items for one launch");
    }
    const int grid = static_cast<int>(grid64);
    switch (a.k_dtype) {
      case DType::kF32:
        launch_split_f32(p, a.head_dim, grid, stream);
        break;
      case DType::kF16:
        launch_split_f16(p, a.head_dim, mma, grid, stream);
        break;
      case DType::kBF16:
        launch_split_bf16(p, a.head_dim, mma, grid, stream);
        break;
    }
    check(cudaGetLastError(), "split_kernel launch");
  } else {
    // No table entries at all: every context is 0; the combine sees no splits.
    check(cudaMemsetAsync(p.split_offset, 0, (a.batch + 1) * sizeof(int), stream),
          "cudaMemsetAsync");
  }

  CombineParams c{};
  c.part_ml = p.part_ml;
  c.part_acc = p.part_acc;
  c.split_offset = p.split_offset;
  c.out = a.out;
  c.lse = a.lse;
  c.batch = a.batch;
  c.num_heads = a.num_heads;
  c.head_dim = a.head_dim;
  const std::int64_t warps =
      static_cast<std::int64_t>(a.batch) * a.num_heads * ((a.head_dim + 31) / 32);
  const int cgrid = static_cast<int>((warps + kCombineWarps - 1) / kCombineWarps);
  // With splits, the combine is a programmatic dependent launch: its CTAs are scheduled while
  // the split grid drains and wait on the device (griddepcontrol.wait) instead of paying a
  // launch after it.
  const bool pdl = splits > 0 && use_pdl();
  switch (a.out_dtype) {
    case DType::kF32:
      launch_combine<float>(c, cgrid, pdl, stream);
      break;
    case DType::kF16:
      launch_combine<__half>(c, cgrid, pdl, stream);
      break;
    case DType::kBF16:
      launch_combine<__nv_bfloat16>(c, cgrid, pdl, stream);
      break;
  }
  check(cudaGetLastError(), "combine_kernel launch");
}

}  // namespace pagedattn::detail::cuda

namespace pagedattn {

std::size_t cuda_workspace_size(const DecodeArgs& args) {
  validate_shapes(args);
  std::string why;
  if (!detail::cuda::available(&why)) {
    fail(ErrorCode::kBackendUnavailable, "backend", "cuda", "unavailable: " + why);
  }
  return detail::cuda::workspace_size(args);
}

}  // namespace pagedattn
