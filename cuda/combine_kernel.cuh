// The combine kernel (combine.cuh) for any variant policy (variant_policy.cuh), whose finish it
// applies to each merged row: one warp per (sequence, query token, query head, 32-element slice
// of head_dim), so even B = 1 spreads over H x head_dim / 32 warps. Each warp loads the (m, l)
// and accumulator slices of the first 32 splits at once (one memory round trip for the common
// case) and adds them, in split order, under the largest m. combine.cu instantiates it for the
// library's policy; a test instantiates it for its own.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <atomic>
#include <cstdint>

#include "combine.cuh"
#include "cuda_error.hpp"
#include "device_info.hpp"
#include "launch.cuh"
#include "pagedattn/online_softmax.hpp"
#include "pagedattn/variants.hpp"
#include "query_rows.cuh"
#include "store_out.cuh"

namespace pagedattn::detail::cuda {
namespace combine_detail {

constexpr int kCombineWarps = 4;

// The (sequence, query token, query head) row idx's slice dc of head_dim: merges it over the
// sequence's ns splits from partial off, in split order, 32 loads in flight, and writes out (and
// lse from slice 0).
template <typename OutT, typename V>
__device__ void merge_slice(const CombineParams& p, const V& var, std::int64_t idx, int dc, int b,
                            int off, int ns) {
  const int lane = threadIdx.x & 31;
  const int D = p.head_dim;
  const std::int64_t rows = static_cast<std::int64_t>(p.max_q) * p.num_heads;  // per split
  const int in_seq = static_cast<int>(idx - b * rows);  // query token * num_heads + head
  const int i = in_seq / p.num_heads, h = in_seq - i * p.num_heads;
  const SeqQueries sq = seq_queries(p.q_indptr, p.q_rows, p.max_q, b);
  if (i >= sq.n) return;  // past the sequence's query tokens
  const int d = dc * 32 + lane;
  const std::int64_t step = rows * D;  // between splits
  const float* col0 = p.part_acc + (static_cast<std::int64_t>(off) * rows + in_seq) * D + d;
  // The first 32 splits' (m, l) and accumulator loads go out together, before the max is known:
  // one memory round trip for the common case instead of one per few splits.
  float m_first = -INFINITY, l_first = 0.f;
  if (lane < ns) {
    const std::int64_t pi = (static_cast<std::int64_t>(off) + lane) * rows + in_seq;
    m_first = p.part_ml[2 * pi];
    l_first = p.part_ml[2 * pi + 1];
  }
  float v[32];
#pragma unroll
  for (int k = 0; k < 32; ++k) v[k] = k < ns && d < D ? col0[k * step] : 0.f;
  float mmax = m_first;
  bool nan_m = m_first != m_first;
  for (int s = 32 + lane; s < ns; s += 32) {
    const float m = p.part_ml[2 * ((static_cast<std::int64_t>(off) + s) * rows + in_seq)];
    mmax = fmaxf(mmax, m);
    nan_m |= m != m;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) mmax = fmaxf(mmax, __shfl_xor_sync(0xffffffffu, mmax, o));
  // A split that met a non-finite logit has m = l = NaN; fmaxf would drop it (and with every
  // split NaN the row would look empty), so it makes the max NaN, and with it out and lse.
  if (__any_sync(0xffffffffu, nan_m)) mmax = NAN;
  float acc = 0.f, lsum = 0.f;
  if (mmax != -INFINITY) {
    float w = lane < ns ? SoftmaxState2::factor(m_first, mmax) : 0.f;
    lsum = w * l_first;
#pragma unroll
    for (int k = 0; k < 32; ++k) acc = fmaf(__shfl_sync(0xffffffffu, w, k), v[k], acc);
    for (int c = 32; c < ns; c += 32) {  // long sequences: the remaining splits, 32 at a time
      w = 0.f;
      if (c + lane < ns) {
        const std::int64_t pi = (static_cast<std::int64_t>(off) + c + lane) * rows + in_seq;
        w = SoftmaxState2::factor(p.part_ml[2 * pi], mmax);
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
  SoftmaxState2 total{mmax, lsum};
  // The variant's finish (a sink joins the denominator only: an empty context gets out = 0 and
  // lse = the sink).
  const float fa = var.finish(total, h);
  const std::int64_t qrow = sq.row0 + i;
  if (d < D) {
    store_out<OutT>(p.out, qrow * p.out_stride + static_cast<std::int64_t>(h) * D + d,
                    acc * (total.inv_sum() * fa));
  }
  if (p.lse != nullptr && dc == 0 && lane == 0) p.lse[qrow * p.num_heads + h] = total.lse();
}

// One warp per (sequence, query token, query head, 32-element slice of head_dim) unit, so even
// B = 1 spreads over H x head_dim / 32 warps. The grid holds at most what is resident at once
// (launch_combine). Where that covers the units, each warp takes one; otherwise each warp strides
// over them, 32 strides at a time: lane j reads the split count of the j-th unit's sequence, and
// the warp merges only the units whose sequence has several splits. Units of one-split sequences
// (their split CTA wrote out and lse) cost one round trip per 32 of them, where a CTA per unit
// would pay a CTA launch each.
template <typename OutT, typename V>
__global__ void __launch_bounds__(kCombineWarps * 32) combine_kernel(CombineParams p, V var) {
  // Launched programmatically after the split kernel: wait until its partials are complete and
  // visible (a no-op for a plain launch).
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  // The next decode's split kernel is a programmatic dependent of this one: let its CTAs become
  // resident now; they wait on the device for this grid's end before touching memory.
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
  const int lane = threadIdx.x & 31;
  const int dchunks = (p.head_dim + 31) / 32;
  const std::int64_t rows = static_cast<std::int64_t>(p.max_q) * p.num_heads;  // per split
  const std::int64_t units = p.batch * rows * dchunks;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * kCombineWarps;
  const std::int64_t warp =
      static_cast<std::int64_t>(blockIdx.x) * kCombineWarps + (threadIdx.x >> 5);
  if (units <= stride) {  // a unit per warp at most: nothing to scan
    if (warp >= units) return;
    const std::int64_t idx = warp / dchunks;  // the (sequence, query token, query head) row
    const int b = static_cast<int>(idx / rows);
    const int off = p.split_offset[b];
    const int ns = p.split_offset[b + 1] - off;
    if (ns != 1 || p.merge_single_splits)
      merge_slice<OutT>(p, var, idx, static_cast<int>(warp - idx * dchunks), b, off, ns);
    return;
  }
  for (std::int64_t first = warp; first < units; first += 32 * stride) {
    const std::int64_t mine = first + lane * stride;
    int off = 0, ns = 1;
    if (mine < units) {
      const int b = static_cast<int>(mine / dchunks / rows);
      off = p.split_offset[b];
      ns = p.split_offset[b + 1] - off;
    }
    for (unsigned todo =
             __ballot_sync(0xffffffffu, mine < units && (ns != 1 || p.merge_single_splits));
         todo != 0; todo &= todo - 1) {
      const int j = __ffs(todo) - 1;
      const std::int64_t widx = first + j * stride;
      const std::int64_t idx = widx / dchunks;  // the (sequence, query token, query head) row
      merge_slice<OutT>(p, var, idx, static_cast<int>(widx - idx * dchunks),
                        static_cast<int>(idx / rows), __shfl_sync(0xffffffffu, off, j),
                        __shfl_sync(0xffffffffu, ns, j));
    }
  }
}

template <typename OutT, typename V>
void launch_combine_typed(const CombineParams& c, const V& var, int grid, bool pdl,
                          cudaStream_t stream) {
  check(launch_kernel(combine_kernel<OutT, V>, grid, kCombineWarps * 32, 0, pdl, stream, c, var),
        "combine_kernel launch");
}

// The combine CTAs resident at once on the current device (at least one per SM), once per device.
template <typename OutT, typename V>
int resident_ctas() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> known[kMaxDevices] = {};
  const DeviceInfo& d = current_device();
  std::atomic<int>* slot = d.device < kMaxDevices ? &known[d.device] : nullptr;
  if (slot != nullptr && slot->load(std::memory_order_relaxed) > 0) {
    return slot->load(std::memory_order_relaxed);
  }
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, combine_kernel<OutT, V>,
                                                    kCombineWarps * 32, 0) != cudaSuccess) {
    cudaGetLastError();
    per_sm = 1;
  }
  const int n = d.sms * (per_sm > 1 ? per_sm : 1);
  if (slot != nullptr) slot->store(n, std::memory_order_relaxed);
  return n;
}

template <typename OutT, typename V>
void launch_combine_sized(const CombineParams& c, const V& var, bool pdl, cudaStream_t stream) {
  const std::int64_t warps =
      static_cast<std::int64_t>(c.batch) * c.max_q * c.num_heads * ((c.head_dim + 31) / 32);
  const std::int64_t needed = (warps + kCombineWarps - 1) / kCombineWarps;
  const std::int64_t resident = resident_ctas<OutT, V>();
  launch_combine_typed<OutT, V>(c, var, static_cast<int>(needed < resident ? needed : resident),
                                pdl, stream);
}

}  // namespace combine_detail

// Enqueues the combine for out's dtype with variant policy var on `stream` (launch_combine).
template <typename V>
void launch_combine_with(const CombineParams& c, const V& var, DType out_dtype, bool pdl,
                         cudaStream_t stream) {
  using combine_detail::launch_combine_sized;
  switch (out_dtype) {
    case DType::kF32:
      return launch_combine_sized<float>(c, var, pdl, stream);
    case DType::kF16:
      return launch_combine_sized<__half>(c, var, pdl, stream);
    case DType::kBF16:
      return launch_combine_sized<__nv_bfloat16>(c, var, pdl, stream);
  }
  fail(ErrorCode::kUnsupported, "out_dtype", static_cast<int>(out_dtype),
       "no CUDA combine kernel for this dtype");
}

}  // namespace pagedattn::detail::cuda
