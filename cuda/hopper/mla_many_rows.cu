// The sm_90 MLA kernel (mla_many_rows.hpp) and its host side: the TMA tensor maps of the latent
// cache, the choice of the kernel and its launch. Compiled for sm_90a only (cuda/CMakeLists.txt).
//
// One CTA per (sequence, split, 64 query rows): a producer thread copies each tile of 64 latent
// rows with TMA into one of two stages (nine boxes of 64 columns per page of the tile), two
// consumer warpgroups fold the tiles (mla_many_rows_consumer.cuh) and write the partial state
// the combine merges, as the 16-row kernel (mla_kernel.cuh) does.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <string>
#include <type_traits>

#include "../cuda_error.hpp"
#include "../device_info.hpp"
#include "../launch.cuh"
#include "mla_many_rows.hpp"
#include "mla_many_rows_consumer.cuh"
#include "pagedattn/error.hpp"
#include "tensor_map.hpp"

namespace pagedattn::detail::cuda {
namespace mla::sm90 {

static_assert(offsetof(Storage, kv) % 1024 == 0 && offsetof(Storage, p) % 1024 == 0,
              "every operand tile starts on a 1024-byte boundary");
static_assert(kRowsPerCta == kMlaManyRows, "the host plans the kernel's rows per CTA");

// The producer (one lane): for every tile, the block ids of its pages, then once the consumers
// released the stage, one box per part and copied page. Pages of keys past the split, or whose
// id lies outside the pool, are not copied (the consumers find the same pages and mask them).
__device__ void produce_tiles(Storage& sm, const CUtensorMap* map_c, const CUtensorMap* map_pe,
                              const MlaParams& p, const MlaWork& w, int tiles) {
  const Pages g = tile_pages(p.block_size);
  const std::uint32_t page_bytes = kParts * g.rows * 128u;
  for (int t = 0; t < tiles; ++t) {
    const int s = t % kStages, key0 = w.tok_begin + t * kKeys;
    int ids[8];
    std::uint32_t ok = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      ids[i] = -1;
      if (i < g.per_tile && key0 + i * g.rows < w.tok_end) {
        ids[i] = page_id(p, w, key0, i, g.rows);
        if (page_copied(p, w, key0, i, g.rows, ids[i])) ok |= 1u << i;
      }
    }
    if (t >= kStages) cuda::sm90::mbar_wait(&sm.empty[s], ((t / kStages) + 1) & 1);
    cuda::sm90::mbar_arrive_expect_tx(&sm.full[s], __popc(ok) * page_bytes);
#pragma unroll
    for (int i = 0; i < 8; ++i) {  // unrolled so that ids stays in registers
      if (!(ok & (1u << i))) continue;
      const int first = key0 + i * g.rows;
      const int slot = first - (first / p.block_size) * p.block_size;
      char* dst = sm.kv[s] + i * g.rows * 128;
#pragma unroll
      for (int part = 0; part < kCParts; ++part) {
        cuda::sm90::tma_load_3d(dst + part * kPartBytes, map_c, part * 64, slot, ids[i],
                                &sm.full[s]);
      }
      cuda::sm90::tma_load_3d(dst + kCParts * kPartBytes, map_pe, 0, slot, ids[i], &sm.full[s]);
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads, 1)
    mla_many_rows_kernel(const __grid_constant__ CUtensorMap map_c,
                         const __grid_constant__ CUtensorMap map_pe, const MlaParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(1024) char smem_raw[];
  Storage& sm = *reinterpret_cast<Storage*>(smem_raw);
  const MlaWork w = mla_work(p);
  if (w.split == 0 && w.row0 == 0 && threadIdx.x == 0) {
    if (w.b == 0) p.split_offset[0] = 0;
    p.split_offset[w.b + 1] = (w.b + 1) * p.splits;
  }
  if (w.row0 >= w.n_rows) return;  // no query row of the sequence in this chunk (uniform)
  if (threadIdx.x == 0) {
    if (smem_u32(smem_raw) % 1024 != 0) __trap();  // the swizzle needs the alignment
    for (int s = 0; s < kStages; ++s) {
      cuda::sm90::mbar_init(&sm.full[s], 1);
      cuda::sm90::mbar_init(&sm.empty[s], kConsumers / 32);
    }
    cuda::sm90::fence_barrier_init();
  }
  __syncthreads();
  const int tiles = w.tok_end > w.tok_begin ? (w.tok_end - w.tok_begin + kKeys - 1) / kKeys : 0;
  if (threadIdx.x >= kConsumers) {
    cuda::sm90::setmaxnreg_dec<kProducerRegs>();
    if (threadIdx.x == kConsumers) produce_tiles(sm, &map_c, &map_pe, p, w, tiles);
    return;
  }
  cuda::sm90::setmaxnreg_inc<kConsumerRegs>();
  consume_tiles<T>(sm, p, w, tiles);
#else
  __trap();  // never launched: the host takes this kernel only on sm_90
#endif
}

// One part of the latent cache (c or k_pe) as a 3-d tensor (column, slot, block); a box is 64
// columns of one page's min(block_size, 64) slots, written 128-byte swizzled.
template <typename T>
bool latent_map(CUtensorMap* map, const void* base, int cols, long long token, long long block,
                int block_size, int num_blocks) {
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(block_size),
                              static_cast<cuuint64_t>(num_blocks)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(token) * sizeof(T),
                                 static_cast<cuuint64_t>(block) * sizeof(T)};
  const cuuint32_t box[3] = {64, static_cast<cuuint32_t>(tile_pages(block_size).rows), 1};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  const CUtensorMapDataType type = std::is_same_v<T, __half> ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                             : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  const cuda::sm90::EncodeTiled encode = cuda::sm90::encode_tiled();
  return encode != nullptr && encode(map, type, 3, const_cast<void*>(base), dims, strides, box,
                                     elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                     CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                     CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

template <typename T>
bool latent_maps(CUtensorMap* c, CUtensorMap* pe, const void* c_base, const void* pe_base,
                 long long c_token, long long c_block, long long pe_token, long long pe_block,
                 int block_size, int num_blocks) {
  return latent_map<T>(c, c_base, kRank, c_token, c_block, block_size, num_blocks) &&
         latent_map<T>(pe, pe_base, kRope, pe_token, pe_block, block_size, num_blocks);
}

// Whether the kernel fits on the current device, once per device (0: not known yet).
bool fits_device() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> known[kMaxDevices] = {};
  const DeviceInfo& d = current_device();
  if (d.cc_major != 9 || d.cc_minor != 0) return false;  // sm_90a code runs on 9.0 alone
  if (d.device < kMaxDevices && known[d.device].load(std::memory_order_acquire) != 0) {
    return known[d.device].load(std::memory_order_relaxed) > 0;
  }
  constexpr int kSmem = sizeof(Storage);
  const bool fits =
      d.smem.optin_per_cta >= kSmem &&
      cudaFuncSetAttribute(mla_many_rows_kernel<__nv_bfloat16>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem) == cudaSuccess &&
      cudaFuncSetAttribute(mla_many_rows_kernel<__half>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem) == cudaSuccess;
  if (!fits) cudaGetLastError();
  if (d.device < kMaxDevices) known[d.device].store(fits ? 1 : -1, std::memory_order_release);
  return fits;
}

template <typename T>
void launch_typed(const MlaParams& p, int grid, cudaStream_t stream) {
  CUtensorMap map_c, map_pe;
  if (!latent_maps<T>(&map_c, &map_pe, p.c, p.kpe, p.c_token, p.c_block, p.kpe_token, p.kpe_block,
                      p.block_size, p.num_blocks)) {
    fail(ErrorCode::kDeviceError, "c_strides",
         std::to_string(p.c_token) + "/" + std::to_string(p.c_block) + " elements (token/block)",
         "the driver cannot describe this latent cache layout as TMA tensors");
  }
  check(launch_kernel(mla_many_rows_kernel<T>, grid, kThreads, static_cast<int>(sizeof(Storage)),
                      false, stream, map_c, map_pe, p),
        "mla_many_rows_kernel launch");
}

}  // namespace mla::sm90

bool mla_many_rows_serves(const MlaDecodeArgs& a, bool split_p) {
  using namespace mla::sm90;
  const int bs = a.block_size;
  const bool pages_fit = bs % kKeys == 0 || (bs >= 8 && kKeys % bs == 0);
  if (!(a.q_dtype == DType::kBF16 || a.q_dtype == DType::kF16) || a.kv_dtype != a.q_dtype ||
      a.kv_lora_rank != kRank || a.rope_dim != kRope || !pages_fit || split_p || !fits_device()) {
    return false;
  }
  CUtensorMap c, pe;  // a layout the driver cannot describe takes the 16-row kernel
  return a.q_dtype == DType::kBF16
             ? latent_maps<__nv_bfloat16>(&c, &pe, a.c_cache, a.kpe_cache, a.c_layout().token,
                                          a.c_layout().block, a.kpe_layout().token,
                                          a.kpe_layout().block, bs, a.num_blocks)
             : latent_maps<__half>(&c, &pe, a.c_cache, a.kpe_cache, a.c_layout().token,
                                   a.c_layout().block, a.kpe_layout().token, a.kpe_layout().block,
                                   bs, a.num_blocks);
}

void launch_mla_many_rows(const mla::MlaParams& p, DType dtype, int grid, cudaStream_t stream) {
  if (dtype == DType::kBF16) {
    mla::sm90::launch_typed<__nv_bfloat16>(p, grid, stream);
  } else {
    mla::sm90::launch_typed<__half>(p, grid, stream);
  }
}

}  // namespace pagedattn::detail::cuda
