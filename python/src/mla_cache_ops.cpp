#include "mla_cache_ops.hpp"

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "argument_error.hpp"
#include "cache_ops.hpp"
#include "device.hpp"
#include "kv_scales.hpp"
#include "latent_cache.hpp"
#include "pagedattn/mla_cache.hpp"
#include "tensor_import.hpp"

namespace pagedattn::py {
namespace {

using namespace nb::literals;

// The elements between consecutive rows of a [num_tokens, width] source (kv_c, k_pe): each row
// contiguous, rows any stride apart in increasing order, so both may be slices of one wider
// tensor. 0 (dense) for at most one row.
std::int64_t source_row_stride(const Tensor& t) {
  const std::int64_t rows = t.shape[0], width = t.shape[1];
  if (width > 1 && rows > 0 && t.strides[1] != 1) {
    reject(ErrorCode::kInvalidArgument, t.name, ".strides", t.strides_str(),
           "each token's row must be contiguous");
  }
  if (rows <= 1) return 0;
  if (t.strides[0] < width) {
    reject(ErrorCode::kInvalidArgument, t.name, ".strides", t.strides_str(),
           "tokens must be at least " + std::to_string(width) +
               " elements apart, in increasing order (rows must not overlap)");
  }
  return t.strides[0];
}

// The options of a cache operation on the cache's device.
CacheOpOptions cache_options(const std::string& backend, const LatentCache& cache,
                             std::uintptr_t stream, bool checked) {
  CacheOpOptions o;
  o.backend = pick_backend(backend, cache.c.device, cache.c.name.c_str());
  o.cuda_stream = reinterpret_cast<void*>(stream);
  o.cuda_checked = checked;
  return o;
}

// kv_c [num_tokens, kv_lora_rank] and k_pe [num_tokens, rope_dim] of one float dtype,
// slot_mapping int32 [num_tokens], all on the cache's device; the widths are the cache's.
void write_mla_cache(nb::handle kv_c_h, nb::handle k_pe_h, nb::handle slots_h, nb::handle c_h,
                     nb::handle kpe_h, double kv_scale, const std::string& backend,
                     std::uintptr_t stream, bool checked, const std::vector<std::string>& tags) {
  Tensor kv_c = input(kv_c_h, "kv_c", tags);
  Tensor k_pe = input(k_pe_h, "k_pe", tags);
  Tensor slots = input(slots_h, "slot_mapping");
  kv_c.require_ndim(2, "[num_tokens, kv_lora_rank]");
  k_pe.require_ndim(2, "[num_tokens, rope_dim]");
  slots.require_ndim(1, "[num_tokens]");
  k_pe.require_dim(0, kv_c.shape[0], "num_tokens, kv_c.shape[0]");
  slots.require_dim(0, kv_c.shape[0], "num_tokens, kv_c.shape[0]");
  const DType src = shared_float_dtype(kv_c, k_pe);
  slots.require_int32();
  slots.require_contiguous();
  LatentCache cache;
  cache.read(c_h, kpe_h, tags, /*writable=*/true);
  cache.split(kv_c.dim_int(1), k_pe.dim_int(1), {"kv_c.shape[1]", "k_pe.shape[1]"});
  const char* cache_name = cache.c.name.c_str();
  cache.require_device(cache.c.device, cache_name);
  for (const Tensor* t : {&kv_c, &k_pe, &slots}) t->require_device(cache.c.device, cache_name);

  MlaCacheWriteArgs a;
  a.num_tokens = kv_c.dim_int(0);
  cache.set(a);
  a.kv_c = kv_c.data_or_placeholder();
  a.k_pe = k_pe.data_or_placeholder();
  a.src_dtype = src;
  a.kv_c_row_stride = source_row_stride(kv_c);
  a.k_pe_row_stride = source_row_stride(k_pe);
  a.slot_mapping = static_cast<const std::int32_t*>(slots.data_or_placeholder());
  a.kv_scale = KvScales::to_f32(kv_scale, "kv_scale");
  const CacheOpOptions o = cache_options(backend, cache, stream, checked);

  DeviceGuard guard(cache.c.device);
  nb::gil_scoped_release release;
  pagedattn::write_mla_cache(a, o);
}

// The widths of a combined row, which the call does not give: a copy moves the bytes of whole
// rows, so any split the library takes copies the same bytes. The row goes as c alone, or, past
// the largest kv_lora_rank, as that much c and the rest k_pe.
void split_for_copy(LatentCache& cache) {
  constexpr std::int64_t kMaxRank = 1024, kMaxRope = 256;
  const std::int64_t width = cache.width();
  if (!cache.combined) {
    cache.split(cache.c.dim_int(2), cache.kpe.dim_int(2),
                {"c_cache.shape[2]", "kpe_cache.shape[2]"});
    return;
  }
  if (width < 16 || width % 16 != 0 || width > kMaxRank + kMaxRope) {
    reject(ErrorCode::kInvalidArgument, "kv_cache", ".shape", cache.c.shape_str(),
           "the last dimension, kv_lora_rank + rope_dim, must be a multiple of 16 from 16 to " +
               std::to_string(kMaxRank + kMaxRope));
  }
  const int rank = static_cast<int>(std::min(width, kMaxRank));
  cache.split(rank, static_cast<int>(width - rank), {"kv_cache.shape[2]", "0"});  // always fits
}

// `pairs`: an int32 or int64 host tensor [n, 2], or any sequence of (src, dst) pairs.
void copy_mla_blocks(nb::handle c_h, nb::handle kpe_h, nb::handle pairs_h,
                     const std::string& backend, std::uintptr_t stream,
                     const std::vector<std::string>& tags) {
  LatentCache cache;
  cache.read(c_h, kpe_h, tags, /*writable=*/true);
  split_for_copy(cache);
  cache.require_device(cache.c.device, cache.c.name.c_str());
  std::vector<BlockCopy> pairs = read_pairs(pairs_h);
  MlaCopyBlocksArgs a;
  cache.set(a);
  a.pairs = pairs.data();
  a.num_pairs = static_cast<int>(pairs.size());
  const CacheOpOptions o = cache_options(backend, cache, stream, /*checked=*/false);

  DeviceGuard guard(cache.c.device);
  nb::gil_scoped_release release;
  pagedattn::copy_blocks(a, o);
}

}  // namespace

void bind_mla_cache_ops(nb::module_& m) {
  m.def("write_mla_cache", &write_mla_cache, "kv_c"_a, "k_pe"_a, "slot_mapping"_a, "c_cache"_a,
        "kpe_cache"_a.none(), "kv_scale"_a, "backend"_a, "stream"_a, "checked"_a, "tags"_a);
  m.def("copy_mla_blocks", &copy_mla_blocks, "c_cache"_a, "kpe_cache"_a.none(), "pairs"_a,
        "backend"_a, "stream"_a, "tags"_a);
}

}  // namespace pagedattn::py
