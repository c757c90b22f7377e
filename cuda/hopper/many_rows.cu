// The Hopper many-row kernel (many_rows.hpp) and its host side: the TMA tensor maps of the
// cache, the kernel's occupancy on the current device and its launch. Compiled for sm_90a only
// (cuda/CMakeLists.txt): wgmma exists in no other target.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <string>
#include <type_traits>

#include "../device_info.hpp"
#include "../launch.cuh"
#include "many_rows.hpp"
#include "many_rows_epilogue.cuh"
#include "many_rows_producer.cuh"
#include "pagedattn/error.hpp"
#include "tensor_map.hpp"

namespace pagedattn::detail::cuda {
namespace sm90 {

static_assert(offsetof(SharedStorage<__nv_bfloat16>, k) % 1024 == 0 &&
                  offsetof(SharedStorage<__nv_bfloat16>, v) % 1024 == 0,
              "every operand tile starts on a 1024-byte boundary");

// One CTA per work item of the split plan (planned on the device, as the split kernel's): the
// producer warp copies the item's tiles, the consumer warpgroup folds them and writes the rows.
template <typename T, typename V>
__global__ void __launch_bounds__(kCtaThreads, 2)
    many_rows_kernel(const __grid_constant__ CUtensorMap map_k,
                     const __grid_constant__ CUtensorMap map_v, const SplitParams p, const V var) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  // A programmatic dependent of the stream's previous kernel, as the split kernel is
  // (split_kernel.cuh): nothing global is read before that kernel is done.
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  extern __shared__ __align__(1024) char smem_raw[];
  SharedStorage<T>& sm = *reinterpret_cast<SharedStorage<T>*>(smem_raw);
  if (threadIdx.x == 0) {
    if (smem_u32(smem_raw) % 1024 != 0) __trap();  // the swizzle needs the alignment
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&sm.full[s], 1);
      mbar_init(&sm.empty[s], kConsumers / 32);
    }
    fence_barrier_init();
    sm.nonfinite_keys[0] = sm.nonfinite_keys[1] = 0;
  }
  CtaWork w;  // plan_cta's barriers also publish the initialized mbarriers
  if (!plan_cta<kCtaThreads>(p, sm.plan, &w)) return;  // uniform
  const TileWork tw = tile_work(p, w);
  if (threadIdx.x >= kConsumers) {
    produce_tiles(sm, &map_k, &map_v, p, tw);
    return;
  }
  const RowPair<V> rp = row_pair(p, var, tw);
  load_q(sm, p, tw);
  float o[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.f;
  SoftmaxState2 st[2] = {SoftmaxState2::empty(), SoftmaxState2::empty()};
  consume_tiles(sm, p, var, tw, rp, o, st);
  store_rows(p, var, tw, rp, o, st);
#else
  __trap();  // never launched: the host takes this kernel only on sm_90
#endif
}

EncodeTiled encode_tiled() {
  static const EncodeTiled fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult res = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                         &res) != cudaSuccess ||
        res != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      f = nullptr;
    }
    return reinterpret_cast<EncodeTiled>(f);
  }();
  return fn;
}

// The cache as a 4-d tensor (head dim, slot, block, kv head) with the layout's strides; a box
// is one 64-column half of min(block_size, 64) slots, written 128-byte swizzled.
template <typename T>
CUtensorMap cache_map(const void* base, const SplitParams& p) {
  const long long token_bytes = static_cast<long long>(p.token_units) * p.row_unit;
  const long long block_bytes = static_cast<long long>(p.block_units) * p.row_unit;
  const long long head_bytes = p.num_kv_heads > 1 ? p.head_bytes : block_bytes;
  const cuuint64_t dims[4] = {kHeadDim, static_cast<cuuint64_t>(p.block_size),
                              static_cast<cuuint64_t>(p.num_blocks),
                              static_cast<cuuint64_t>(p.num_kv_heads)};
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(token_bytes),
                                 static_cast<cuuint64_t>(block_bytes),
                                 static_cast<cuuint64_t>(head_bytes)};
  const cuuint32_t box[4] = {64, static_cast<cuuint32_t>(page_geom(p.block_size).page_rows), 1, 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  const CUtensorMapDataType type = std::is_same_v<T, __half> ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                             : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  CUtensorMap map;
  const EncodeTiled encode = encode_tiled();
  const CUresult res =
      encode == nullptr
          ? CUDA_ERROR_NOT_SUPPORTED
          : encode(&map, type, 4, const_cast<void*>(base), dims, strides, box, elem_strides,
                   CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                   CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (res != CUDA_SUCCESS) {
    fail(ErrorCode::kDeviceError, "kv_strides",
         std::to_string(token_bytes) + "/" + std::to_string(block_bytes) + "/" +
             std::to_string(head_bytes) + " bytes (token/block/head)",
         "the driver cannot describe this cache layout as a TMA tensor (CUresult " +
             std::to_string(static_cast<int>(res)) + ")");
  }
  return map;
}

// CTAs per SM of the kernel on the current device (0: it cannot run there), once per device.
template <typename T>
int ctas_per_sm() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> known[kMaxDevices] = {};
  const DeviceInfo& d = current_device();
  if (d.cc_major != 9 || d.cc_minor != 0) return 0;  // sm_90a code runs on 9.0 alone
  std::atomic<int>* slot = d.device < kMaxDevices ? &known[d.device] : nullptr;
  if (slot != nullptr && slot->load(std::memory_order_relaxed) != 0) {
    return slot->load(std::memory_order_relaxed);
  }
  constexpr int kSmem = sizeof(SharedStorage<T>);
  int n = 0;
  if (cudaFuncSetAttribute(many_rows_kernel<T, GeneralVariant>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, many_rows_kernel<T, GeneralVariant>,
                                                    kCtaThreads, kSmem) != cudaSuccess) {
    cudaGetLastError();
    n = 0;
  }
  n = n < 1 ? -1 : n;  // -1 remembers "none"
  if (slot != nullptr) slot->store(n, std::memory_order_relaxed);
  return n < 1 ? 0 : n;
}

template <typename T>
void launch_typed(const SplitParams& p, const GeneralVariant& var, int grid, cudaStream_t stream) {
  const CUtensorMap map_k = cache_map<T>(p.k, p);
  const CUtensorMap map_v = cache_map<T>(p.v, p);
  ctas_per_sm<T>();  // sets the shared-memory limit on this device
  // Checked by the caller.
  launch_kernel(many_rows_kernel<T, GeneralVariant>, grid, kCtaThreads,
                static_cast<int>(sizeof(SharedStorage<T>)), p.pdl, stream, map_k, map_v, p, var);
}

}  // namespace sm90

BuildFacts many_rows_facts(DType k_dtype) {
  BuildFacts f;
  if (k_dtype == DType::kBF16) {
    f.ctas_per_sm = sm90::ctas_per_sm<__nv_bfloat16>();
    f.smem_bytes = sizeof(sm90::SharedStorage<__nv_bfloat16>);
  } else if (k_dtype == DType::kF16) {
    f.ctas_per_sm = sm90::ctas_per_sm<__half>();
    f.smem_bytes = sizeof(sm90::SharedStorage<__half>);
  }
  return f;
}

bool launch_many_rows(const SplitParams& p, const GeneralVariant& var, DType k_dtype, int grid,
                      cudaStream_t stream) {
  if (k_dtype == DType::kBF16) {
    sm90::launch_typed<__nv_bfloat16>(p, var, grid, stream);
  } else if (k_dtype == DType::kF16) {
    sm90::launch_typed<__half>(p, var, grid, stream);
  } else {
    return false;
  }
  return true;
}

}  // namespace pagedattn::detail::cuda
