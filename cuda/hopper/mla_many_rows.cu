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

// The boxes of page i of the tile into stage s: nine 64-column swizzled parts of a 16-bit cache,
// or an 8-bit cache's two 256-column boxes of c and one of k_pe into the raw stage.
template <typename KV>
__device__ __forceinline__ void copy_page(Storage& sm, const CUtensorMap* map_c,
                                          const CUtensorMap* map_pe, int s, int i, int rows,
                                          int slot, int id) {
  std::uint64_t* bar = &sm.full[s];
  if constexpr (sizeof(KV) == 1) {
    char* raw = raw_stage(sm, s) + i * rows * kRawBoxCols;
#pragma unroll
    for (int b = 0; b < kRank / kRawBoxCols; ++b) {
      cuda::sm90::tma_load_3d(raw + b * kKeys * kRawBoxCols, map_c, b * kRawBoxCols, slot, id, bar);
    }
    cuda::sm90::tma_load_3d(raw_stage(sm, s) + kRank * kKeys + i * rows * kRope, map_pe, 0, slot,
                            id, bar);
  } else {
    char* dst = sm.kv[s] + i * rows * 128;
#pragma unroll
    for (int part = 0; part < kCParts; ++part) {
      cuda::sm90::tma_load_3d(dst + part * kPartBytes, map_c, part * 64, slot, id, bar);
    }
    cuda::sm90::tma_load_3d(dst + kCParts * kPartBytes, map_pe, 0, slot, id, bar);
  }
}

// The producer (one lane): for every tile, the block ids of its pages, then once the consumers
// released the stage, the boxes of every copied page. Pages of keys past the split, or whose id
// lies outside the pool, are not copied (the consumers find the same pages and mask them).
template <typename KV>
__device__ void produce_tiles(Storage& sm, const CUtensorMap* map_c, const CUtensorMap* map_pe,
                              const MlaParams& p, const MlaWork& w, int tiles) {
  const Pages g = tile_pages(p.block_size);
  const std::uint32_t page_bytes = (kRank + kRope) * g.rows * static_cast<int>(sizeof(KV));
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
      copy_page<KV>(sm, map_c, map_pe, s, i, g.rows, slot, ids[i]);
    }
  }
}

template <typename T, typename KV>
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
    if (threadIdx.x == kConsumers) produce_tiles<KV>(sm, &map_c, &map_pe, p, w, tiles);
    return;
  }
  cuda::sm90::setmaxnreg_inc<kConsumerRegs>();
  consume_tiles<T, KV>(sm, p, w, tiles);
#else
  __trap();  // never launched: the host takes this kernel only on sm_90
#endif
}

// One part of the latent cache (c or k_pe) as a 3-d tensor (column, slot, block) of KV; a box is
// `box_cols` columns of one page's min(block_size, 64) slots, 128-byte swizzled for 16-bit
// caches (64 columns), as laid out for an 8-bit cache's raw stage.
template <typename KV>
bool latent_map(CUtensorMap* map, const void* base, int cols, int box_cols, long long token,
                long long block, int block_size, int num_blocks) {
  constexpr bool k8 = sizeof(KV) == 1;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(block_size),
                              static_cast<cuuint64_t>(num_blocks)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(token) * sizeof(KV),
                                 static_cast<cuuint64_t>(block) * sizeof(KV)};
  const cuuint32_t box[3] = {static_cast<cuuint32_t>(box_cols),
                             static_cast<cuuint32_t>(tile_pages(block_size).rows), 1};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  const CUtensorMapDataType type = k8                           ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                                   : std::is_same_v<KV, __half> ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                                : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  const cuda::sm90::EncodeTiled encode = cuda::sm90::encode_tiled();
  return encode != nullptr && encode(map, type, 3, const_cast<void*>(base), dims, strides, box,
                                     elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                     k8 ? CU_TENSOR_MAP_SWIZZLE_NONE : CU_TENSOR_MAP_SWIZZLE_128B,
                                     CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                     CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

template <typename KV>
bool latent_maps(CUtensorMap* c, CUtensorMap* pe, const void* c_base, const void* pe_base,
                 long long c_token, long long c_block, long long pe_token, long long pe_block,
                 int block_size, int num_blocks) {
  const int c_box = sizeof(KV) == 1 ? kRawBoxCols : 64;
  return latent_map<KV>(c, c_base, kRank, c_box, c_token, c_block, block_size, num_blocks) &&
         latent_map<KV>(pe, pe_base, kRope, kRope, pe_token, pe_block, block_size, num_blocks);
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
  const auto allow = [](auto kernel) {
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem) ==
           cudaSuccess;
  };
  const bool fits = d.smem.optin_per_cta >= kSmem &&
                    allow(mla_many_rows_kernel<__nv_bfloat16, __nv_bfloat16>) &&
                    allow(mla_many_rows_kernel<__nv_bfloat16, fp8_e4m3_t>) &&
                    allow(mla_many_rows_kernel<__nv_bfloat16, fp8_e5m2_t>) &&
                    allow(mla_many_rows_kernel<__half, __half>) &&
                    allow(mla_many_rows_kernel<__half, fp8_e4m3_t>) &&
                    allow(mla_many_rows_kernel<__half, fp8_e5m2_t>);
  if (!fits) cudaGetLastError();
  if (d.device < kMaxDevices) known[d.device].store(fits ? 1 : -1, std::memory_order_release);
  return fits;
}

template <typename T, typename KV>
void launch_typed(const MlaParams& p, int grid, cudaStream_t stream) {
  CUtensorMap map_c, map_pe;
  if (!latent_maps<KV>(&map_c, &map_pe, p.c, p.kpe, p.c_token, p.c_block, p.kpe_token, p.kpe_block,
                       p.block_size, p.num_blocks)) {
    fail(ErrorCode::kDeviceError, "c_strides",
         std::to_string(p.c_token) + "/" + std::to_string(p.c_block) + " elements (token/block)",
         "the driver cannot describe this latent cache layout as TMA tensors");
  }
  check(launch_kernel(mla_many_rows_kernel<T, KV>, grid, kThreads,
                      static_cast<int>(sizeof(Storage)), false, stream, map_c, map_pe, p),
        "mla_many_rows_kernel launch");
}

// Calls fn with a value of the cache's element type (q's 16-bit type or an fp8 type).
template <typename T, typename Fn>
bool visit_cache_type(DType kv, Fn&& fn) {
  switch (kv) {
    case DType::kFP8E4M3:
      return fn(fp8_e4m3_t{});
    case DType::kFP8E5M2:
      return fn(fp8_e5m2_t{});
    default:
      return fn(T{});
  }
}

template <typename T>
bool maps_describe(const MlaDecodeArgs& a) {
  return visit_cache_type<T>(a.kv_dtype, [&](auto kv) {
    CUtensorMap c, pe;
    return latent_maps<decltype(kv)>(&c, &pe, a.c_cache, a.kpe_cache, a.c_layout().token,
                                     a.c_layout().block, a.kpe_layout().token, a.kpe_layout().block,
                                     a.block_size, a.num_blocks);
  });
}

}  // namespace mla::sm90

bool mla_many_rows_serves(const MlaDecodeArgs& a, bool split_p) {
  using namespace mla::sm90;
  const int bs = a.block_size;
  const bool pages_fit = bs % kKeys == 0 || (bs >= 8 && kKeys % bs == 0);
  const bool q16 = a.q_dtype == DType::kBF16 || a.q_dtype == DType::kF16;
  const bool cache_ok = a.kv_dtype == a.q_dtype || is_fp8(a.kv_dtype);
  if (!q16 || !cache_ok || a.kv_lora_rank != kRank || a.rope_dim != kRope || !pages_fit ||
      split_p || !fits_device()) {
    return false;
  }
  // A layout the driver cannot describe takes the 16-row kernel.
  return a.q_dtype == DType::kBF16 ? maps_describe<__nv_bfloat16>(a) : maps_describe<__half>(a);
}

void launch_mla_many_rows(const mla::MlaParams& p, DType q_dtype, DType kv_dtype, int grid,
                          cudaStream_t stream) {
  const auto launch = [&](auto q) {
    return mla::sm90::visit_cache_type<decltype(q)>(kv_dtype, [&](auto kv) {
      mla::sm90::launch_typed<decltype(q), decltype(kv)>(p, grid, stream);
      return true;
    });
  };
  if (q_dtype == DType::kBF16) {
    launch(__nv_bfloat16{});
  } else {
    launch(__half{});
  }
}

}  // namespace pagedattn::detail::cuda
