// The latent cache's writes and block copies on the CUDA backend: the GQA cache operations'
// kernels (cache_rows.cuh) with c and k_pe as their two views, each a cache view of one kv head.
// A negative slot is skipped by write_kernel as every slot outside the pool is.
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "cache_rows.cuh"
#include "cuda_error.hpp"
#include "pagedattn/cache_layout.hpp"
#include "pagedattn/detail/cache_backends.hpp"
#include "pagedattn/dtype.hpp"
#include "pagedattn/mla_cache.hpp"

namespace pagedattn::detail::cuda {
namespace {

template <typename Src, typename Dst>
void launch_write(const MlaCacheWriteArgs& a, cudaStream_t stream) {
  const WriteView<Src, Dst> c{
      static_cast<const Src*>(a.kv_c),
      a.kv_c_row(),
      static_cast<Dst*>(a.c_cache),
      mla_part_view(a.c_strides, a.num_blocks, a.block_size, a.kv_lora_rank),
      a.kv_scale,
      nullptr};
  const WriteView<Src, Dst> pe{static_cast<const Src*>(a.k_pe),
                               a.k_pe_row(),
                               static_cast<Dst*>(a.kpe_cache),
                               mla_part_view(a.kpe_strides, a.num_blocks, a.block_size, a.rope_dim),
                               a.kv_scale,
                               nullptr};
  write_kernel<Src, Dst><<<a.num_tokens, kCacheThreads, 0, stream>>>(c, pe, a.slot_mapping);
}

}  // namespace

void write_mla_cache(const MlaCacheWriteArgs& a, const CacheOpOptions& o) {
  const auto stream = static_cast<cudaStream_t>(o.cuda_stream);
  if (o.cuda_checked) {
    validate_mla_slots(a, slots_on_host(a.slot_mapping, a.num_tokens, stream).data());
  }
  visit_value_type(a.src_dtype, "src_dtype", [&](auto src) {
    visit_accepted_type(MlaCacheTypes{}, a.kv_dtype, "kv_dtype", [&](auto cache) {
      launch_write<typename decltype(src)::type, typename decltype(cache)::type>(a, stream);
    });
  });
  check(cudaGetLastError(), "write_mla_cache kernel launch");
}

void copy_blocks(const MlaCopyBlocksArgs& a, const CacheOpOptions& o) {
  copy_views(a.c_cache, mla_part_view(a.c_strides, a.num_blocks, a.block_size, a.kv_lora_rank),
             a.kpe_cache, mla_part_view(a.kpe_strides, a.num_blocks, a.block_size, a.rope_dim),
             a.kv_dtype, a.pairs, a.num_pairs, static_cast<cudaStream_t>(o.cuda_stream));
}

}  // namespace pagedattn::detail::cuda
