// The split-decode kernel: one CTA per work item (sequence, kv head, split[, row chunk]) of the
// core's split plan, planned on the device by every CTA from the context lengths
// (device_plan.cuh), so a fixed grid (sized from shapes only) serves any context lengths:
// CUDA-graph safe.
//
// Per CTA: the KV pipeline (kv_pipeline.cuh) streams tiles of K and V into shared memory; a
// compute path folds each tile into the online-softmax states of the group's query heads
// (mma_path.cuh: tensor cores for f16/bf16 with q in the cache dtype; simt_path.cuh: CUDA cores
// otherwise);
// the warps' states merge in a fixed order and the CTA writes one partial state (m in log2 units,
// l, acc) per query head for the combine (combine.cuh). Deterministic: no atomics, fixed orders.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <type_traits>

#include "device_info.hpp"
#include "device_plan.cuh"
#include "kv_pipeline.cuh"
#include "launch.cuh"
#include "mma_path.cuh"
#include "pagedattn/cache_layout.hpp"
#include "pagedattn/split_plan.hpp"
#include "simt_path.cuh"
#include "split_params.cuh"

namespace pagedattn::detail::cuda {

// The shapes of a build: the tensor cores' (kTs: with the per-token scales' pipeline) or the
// CUDA cores'.
template <typename T, int D, bool kMma, bool kTs>
using SplitCfg = typename std::conditional<kMma, MmaCfg<T, D, kTs>, SimtCfg<T, D>>::type;

// kWide: the wide build (tensor cores, several query tokens; SplitBuild::wide), where every
// sequence's rows take the multi-token path with several slices per warp folded at once. kTs: the
// tensor cores with per-token scales (SplitBuild::token_scales). V: the variant policy
// (variant_policy.cuh), whose hooks the compute paths call.
template <typename T, int D, bool kMma, bool kWide, bool kTs, typename V>
__device__ __forceinline__ void split_cta(const SplitParams& p, const V& var) {
  using Cfg = SplitCfg<T, D, kMma, kTs>;
  using Pipe = typename Cfg::Pipe;
  constexpr int TT = Cfg::TT;
  constexpr int STAGES = Cfg::STAGES;
  extern __shared__ __align__(16) char smem_raw[];
  char* smem = align_smem(smem_raw);

#if __CUDA_ARCH__ >= 900
  // This grid is launched as a programmatic dependent of the stream's previous kernel (on sm_90,
  // launch_split_typed): its CTAs may become resident while that kernel drains, and wait here,
  // before reading or writing any global memory, until it has finished and its writes are
  // visible. The launch latency between two steps is hidden that way; what the previous kernel
  // wrote (q, the cache, the tables) is read only after it. (A no-op for a plain launch.)
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  // The combine is launched as a programmatic dependent of this grid: once every CTA here has
  // started, its CTAs may take free SM slots and wait (griddepcontrol.wait) for this grid's end.
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
  __shared__ PlanScratch<kThreads> plan_scratch;
  CtaWork work;
  if (!plan_cta<kThreads>(p, plan_scratch, &work)) return;  // uniform
  const CtaItem& item = work.item;
  const long long head_off = item.kv * p.head_bytes;
  Pipe pipe;
  pipe.stages = smem;
  pipe.rows_at = reinterpret_cast<int*>(smem + Cfg::STAGE_AREA + Cfg::QBYTES);
  pipe.masks = reinterpret_cast<unsigned*>(pipe.rows_at + STAGES * TT);
  pipe.p = &p;
  pipe.row_table = p.table + static_cast<std::int64_t>(item.seq) * p.table_stride;
  pipe.gK = static_cast<const char*>(p.k) + head_off;
  pipe.v_minus_k = static_cast<const char*>(p.v) - static_cast<const char*>(p.k);
  pipe.unit = p.row_unit;
  pipe.tok_begin = work.tok_begin;
  pipe.tok_lo = work.tok_lo;
  pipe.tok_end = work.tok_end;
  pipe.last_pos = work.len - 1;
  pipe.ntiles = (pipe.tok_end - pipe.tok_begin + TT - 1) / TT;
  pipe.scale_ring = reinterpret_cast<float*>(pipe.masks + (STAGES + 1) * Pipe::kMaskWords);
  const long long scales_off = item.kv * p.ts_head;
  pipe.gks = p.k_token_scales != nullptr ? p.k_token_scales + scales_off : nullptr;
  pipe.gvs = p.v_token_scales != nullptr ? p.v_token_scales + scales_off : nullptr;
  if constexpr (kMma && kWide) {
    mma_item<T, D, true, true>(p, var, item, pipe, smem);
  } else if constexpr (kMma) {
    if (item.n_q > 1 || p.tree_mask != nullptr) {
      mma_item<T, D, true, false>(p, var, item, pipe, smem);
    } else {
      mma_item<T, D, false, false>(p, var, item, pipe, smem);
    }
  } else {
    if (item.n_q > 1 || p.tree_mask != nullptr) {
      simt_item<T, D, true>(p, var, item, pipe, smem);
    } else {
      simt_item<T, D, false>(p, var, item, pipe, smem);
    }
  }
}

// The kernel with the compiler's own register budget (kMinCtas = 0), or one compiled to leave
// room for kMinCtas CTAs per SM (__launch_bounds__' second argument caps the registers per
// thread at what that many CTAs allow). The wide build is a kernel of its own: in one kernel
// with the other paths, its fold of several slices raised the one-token path's register budget
// too, costing CTAs per SM. At head dim 64 it is capped for four CTAs per SM (wide_min_ctas).
template <typename T, int D, bool kMma, bool kWide, bool kTs, typename V>
__global__ void __launch_bounds__(kThreads, kWide ? wide_min_ctas(D) : 0)
    split_kernel(SplitParams p, V var) {
  split_cta<T, D, kMma, kWide, kTs>(p, var);
}
template <typename T, int D, bool kMma, int kMinCtas, typename V>
__global__ void __launch_bounds__(kThreads, kMinCtas) split_kernel_min_ctas(SplitParams p, V var) {
  split_cta<T, D, kMma, false, false>(p, var);
}
template <typename T, int D, bool kMma, int kMinCtas, bool kWide, bool kTs, typename V>
constexpr auto split_kernel_fn() {
  static_assert(kMinCtas == 0 || !kWide, "the wide build has no dense variant");
  static_assert(!kTs || (kMma && kMinCtas == 0 && !kWide), "token scales: the plain build only");
  if constexpr (kMinCtas == 0) {
    return &split_kernel<T, D, kMma, kWide, kTs, V>;
  } else {
    return &split_kernel_min_ctas<T, D, kMma, kMinCtas, V>;
  }
}

// What prepare_split_typed found of one kernel on one device.
struct PreparedKernel {
  std::atomic<int> ctas{0};        // CTAs per SM at the kernel's own shared memory; 0: not yet
  std::atomic<int> smem_limit{0};  // the dynamic shared memory a launch may ask for
};

// Once per device and kernel: raise the dynamic shared-memory limit (a per-device attribute)
// and read the kernel's occupancy. Returns CTAs per SM, or 0 when the kernel cannot run on this
// device (the attribute could not be set, or no CTA fits): decode reports that before launching.
// Where more than one CTA fits, the limit is raised further, to what one CTA per SM could take,
// so that a launch may pad shared memory to hold fewer CTAs per SM (launch_shared_memory).
template <typename T, int D, bool kMma, int kMinCtas, bool kWide, bool kTs, typename V>
int prepare_split_typed(PreparedKernel** prepared = nullptr) {
  using Cfg = SplitCfg<T, D, kMma, kTs>;
  constexpr int kMaxDevices = 64;
  static PreparedKernel slots[kMaxDevices];
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0) return 0;
  PreparedKernel* slot = dev < kMaxDevices ? &slots[dev] : nullptr;
  if (prepared != nullptr) *prepared = slot;
  if (slot != nullptr) {
    const int known = slot->ctas.load(std::memory_order_acquire);
    if (known > 0) return known;
  }
  constexpr auto kernel = split_kernel_fn<T, D, kMma, kMinCtas, kWide, kTs, V>();
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::SMEM) !=
      cudaSuccess) {
    return 0;
  }
  int n = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kThreads, Cfg::SMEM) !=
      cudaSuccess) {
    cudaGetLastError();  // clear it: the estimate falls back to one CTA per SM
    n = 1;
  }
  if (n < 1) return 0;  // does not fit on this device at all
  int limit = Cfg::SMEM;
  const int one_per_sm =
      n > 1 ? shared_memory_for_residency(current_device().smem, Cfg::SMEM, 1) : 0;
  if (one_per_sm > limit) {
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, one_per_sm) ==
        cudaSuccess) {
      limit = one_per_sm;
    } else {
      cudaGetLastError();  // launches keep the kernel's own shared memory
    }
  }
  if (slot != nullptr) {
    slot->smem_limit.store(limit, std::memory_order_relaxed);
    slot->ctas.store(n, std::memory_order_release);
  }
  return n;
}

// The dynamic shared memory a launch of the kernel asks for: its own, or, where the plan gives
// work to fewer CTAs per SM than fit (SplitBuild::resident_ctas), enough that no more fit.
template <typename T, int D, bool kMma, int kMinCtas, bool kWide, bool kTs, typename V>
int launch_shared_memory(int resident_ctas) {
  using Cfg = SplitCfg<T, D, kMma, kTs>;
  PreparedKernel* slot = nullptr;
  const int fits = prepare_split_typed<T, D, kMma, kMinCtas, kWide, kTs, V>(&slot);
  if (resident_ctas < 1 || fits <= resident_ctas || slot == nullptr) return Cfg::SMEM;
  const int padded = shared_memory_for_residency(current_device().smem, Cfg::SMEM, resident_ctas);
  return padded > 0 && padded <= slot->smem_limit.load(std::memory_order_relaxed) ? padded
                                                                                  : Cfg::SMEM;
}

template <typename T, int D, bool kMma, int kMinCtas, bool kWide, bool kTs, typename V>
void launch_split_typed(const SplitParams& p, const V& var, int resident_ctas, int grid,
                        cudaStream_t stream) {
  // Its error is checked by the caller.
  launch_kernel(split_kernel_fn<T, D, kMma, kMinCtas, kWide, kTs, V>(), grid, kThreads,
                launch_shared_memory<T, D, kMma, kMinCtas, kWide, kTs, V>(resident_ctas), p.pdl,
                stream, p, var);
}

// CTAs per SM that the dense build of a kernel is compiled for (0: there is none). The 8-bit
// (fp8, int8) tensor-core kernel's widening needs registers that the compiler's own budget spends
// freely; built for one more CTA per SM (three at D = 128, four at D = 64; a few dozen bytes of
// spills), it reads faster when the plan has items for the extra slots, so decode weighs both
// builds per call (choose_split_kernel). Where the compiler's own budget already fits as many CTAs
// (e4m3 at D = 128, depending on the compiler), decode has no reason to take the dense build. Other
// head dims either fit the CTAs already or lose to the spills; docs/cuda.md has the registers
// and times.
template <typename T, int D>
constexpr int kDenseMinCtas = is_quantized_type<T> ? (D == 64 ? 4 : (D == 128 ? 3 : 0)) : 0;

// Calls f(bool_constant<kMma>, integral_constant<int, kMinCtas>, bool_constant<kWide>,
// bool_constant<kTs>) for build b of the kernel of cache dtype T at head dim D: the CUDA cores
// (kMma false: where b asks for them, and head dims without a tensor-core kernel), the plain
// tensor-core build with the token scales' pipeline where b asks for it (quantized caches), the
// wide build where b asks for it and there is one (wide_head_dim; not for f32, whose tf32 path
// holds one row tile), the dense build where b asks for it and there is one (kDenseMinCtas), else
// the plain tensor-core build.
template <typename T, int D, typename F>
void with_split_build(SplitBuild b, F&& f) {
  using std::bool_constant;
  using std::integral_constant;
  const bool_constant<false> no;
  if constexpr (kMmaHeadDim<T, D>) {
    if (b.mma) {
      if constexpr (is_quantized_type<T>) {
        if (b.token_scales) {
          return f(bool_constant<true>{}, integral_constant<int, 0>{}, no, bool_constant<true>{});
        }
      }
      if constexpr (wide_head_dim(D) && !MmaCfg<T, D>::kTf32) {
        if (b.wide) {
          return f(bool_constant<true>{}, integral_constant<int, 0>{}, bool_constant<true>{}, no);
        }
      }
      if constexpr ((kDenseMinCtas<T, D>) > 0) {
        if (b.dense) {
          return f(bool_constant<true>{}, integral_constant<int, kDenseMinCtas<T, D>>{}, no, no);
        }
      }
      return f(bool_constant<true>{}, integral_constant<int, 0>{}, no, no);
    }
  }
  f(bool_constant<false>{}, integral_constant<int, 0>{}, no, no);
}

// Enqueues build b of the split kernel of cache dtype T at head dim D with variant policy V: what
// SplitKernels<T, D>::launch runs with the library's policy, and what a test runs with its own.
template <typename T, int D, typename V>
void launch_split_build(const SplitParams& p, const V& var, SplitBuild b, int grid,
                        cudaStream_t stream) {
  with_split_build<T, D>(b, [&](auto mma, auto min_ctas, auto wide, auto ts) {
    launch_split_typed<T, D, decltype(mma)::value, decltype(min_ctas)::value, decltype(wide)::value,
                       decltype(ts)::value>(p, var, b.resident_ctas, grid, stream);
  });
}

// SplitKernels<T, D> (split_params.cuh) through with_split_build, so the planner counts the CTAs
// and shared memory of the kernel that runs. Every cache dtype has a tensor-core variant at the
// head dims of kMmaHeadDim.
template <typename T, int D>
void SplitKernels<T, D>::launch(const SplitParams& p, const GeneralVariant& var, SplitBuild b,
                                int grid, cudaStream_t stream) {
  launch_split_build<T, D>(p, var, b, grid, stream);
}

template <typename T, int D>
BuildFacts SplitKernels<T, D>::facts(SplitBuild b) {
  BuildFacts f;
  with_split_build<T, D>(b, [&](auto mma, auto min_ctas, auto wide, auto ts) {
    using Cfg = SplitCfg<T, D, decltype(mma)::value, decltype(ts)::value>;
    f.ctas_per_sm =
        prepare_split_typed<T, D, decltype(mma)::value, decltype(min_ctas)::value,
                            decltype(wide)::value, decltype(ts)::value, GeneralVariant>();
    f.smem_bytes = Cfg::SMEM;
  });
  return f;
}

}  // namespace pagedattn::detail::cuda
