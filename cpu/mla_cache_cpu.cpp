// The latent cache's writes and block copies on the CPU, through the GQA cache operations'
// pieces (cache_rows.hpp): each part (c, k_pe) is a cache view of one kv head. OpenMP over tokens
// (or over each pair's two parts); a token's c row and k_pe row are each one contiguous run in the
// source and in the cache.
#include <cstdint>

#include "cache_rows.hpp"
#include "pagedattn/cache_layout.hpp"
#include "pagedattn/detail/cache_backends.hpp"
#include "pagedattn/detail/visit_dtype.hpp"
#include "pagedattn/dtype.hpp"
#include "pagedattn/mla_cache.hpp"

namespace pagedattn::detail::cpu {
namespace {

template <typename Src, typename Dst>
void write_typed(const MlaCacheWriteArgs& a, const CacheOpOptions& o) {
  const MlaPartStrides cl = a.c_layout(), pl = a.kpe_layout();
  const std::int64_t c_row = a.kv_c_row(), pe_row = a.k_pe_row();
  const auto* kv_c = static_cast<const Src*>(a.kv_c);
  const auto* k_pe = static_cast<const Src*>(a.k_pe);
  auto* c_cache = static_cast<Dst*>(a.c_cache);
  auto* kpe_cache = static_cast<Dst*>(a.kpe_cache);
  const std::int64_t elements =
      static_cast<std::int64_t>(a.num_tokens) * (a.kv_lora_rank + a.rope_dim);
  const int threads = cache_op_threads(o, elements * (sizeof(Src) + sizeof(Dst)));
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
  for (int t = 0; t < a.num_tokens; ++t) {
    const std::int32_t slot = a.slot_mapping[t];
    if (slot < 0) continue;  // skipped token
    const std::int64_t block = slot / a.block_size, offset = slot % a.block_size;
    convert_row(kv_c + t * c_row, c_cache + block * cl.block + offset * cl.token, a.kv_lora_rank,
                a.kv_scale);
    if (a.rope_dim > 0) {
      convert_row(k_pe + t * pe_row, kpe_cache + block * pl.block + offset * pl.token, a.rope_dim,
                  a.kv_scale);
    }
  }
}

}  // namespace

void write_mla_cache(const MlaCacheWriteArgs& a, const CacheOpOptions& o) {
  visit_value_type(a.src_dtype, "src_dtype", [&](auto src) {
    visit_accepted_type(MlaCacheTypes{}, a.kv_dtype, "kv_dtype", [&](auto cache) {
      write_typed<typename decltype(src)::type, typename decltype(cache)::type>(a, o);
    });
  });
}

void copy_blocks(const MlaCopyBlocksArgs& a, const CacheOpOptions& o) {
  const CacheLayout parts[2] = {
      mla_part_view(a.c_strides, a.num_blocks, a.block_size, a.kv_lora_rank),
      mla_part_view(a.kpe_strides, a.num_blocks, a.block_size, a.rope_dim)};
  unsigned char* bases[2] = {static_cast<unsigned char*>(a.c_cache),
                             static_cast<unsigned char*>(a.kpe_cache)};
  const int num_parts = a.rope_dim > 0 ? 2 : 1;
  const std::int64_t block_bytes = dtype_bytes(
      a.kv_dtype, static_cast<std::int64_t>(a.block_size) * (a.kv_lora_rank + a.rope_dim));
  const int threads = cache_op_threads(o, std::int64_t{a.num_pairs} * 2 * block_bytes);
  // num_parts * num_pairs independent copies; the parts of one block (a combined cache's rows
  // too) are disjoint bytes.
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
  for (int i = 0; i < num_parts * a.num_pairs; ++i) {
    const int part = i % num_parts;
    copy_block(bases[part], parts[part], a.kv_dtype, a.pairs[i / num_parts]);
  }
}

}  // namespace pagedattn::detail::cpu
