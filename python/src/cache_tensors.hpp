// The K/V cache tensors: which dimensions hold what (the layout), the pool's sizes read from
// their shape, and the strides the library takes, so that views of a cache are used in place.
#pragma once

#include <nanobind/nanobind.h>

#include <string>
#include <vector>

#include "pagedattn/cache_layout.hpp"
#include "tensor.hpp"

namespace pagedattn::py {

// Which dimensions of a 4-D cache tensor hold the kv heads and the slots of a block: HND
// [num_blocks, num_kv_heads, block_size, head_dim], the library's default, or NHD
// [num_blocks, block_size, num_kv_heads, head_dim], FlashInfer's and vLLM's. Either way the
// tensors' strides go to the library as kv_strides, so views (K and V as halves of one tensor, a
// slice of a larger pool) are read and written in place.
struct KvLayout {
  bool nhd = false;

  int heads_dim() const { return nhd ? 2 : 1; }  // the num_kv_heads dimension
  int slots_dim() const { return nhd ? 1 : 2; }  // the block_size dimension
  const char* dims() const {
    return nhd ? "[num_blocks, block_size, num_kv_heads, head_dim] (kv_layout 'NHD')"
               : "[num_blocks, num_kv_heads, block_size, head_dim] (kv_layout 'HND')";
  }
  // "num_kv_heads, k_cache.shape[1]" and the like, for shape errors of the other tensors.
  std::string kv_heads_ref() const {
    return "num_kv_heads, k_cache.shape[" + std::to_string(heads_dim()) + "]";
  }
  std::string slots_ref() const {
    return "block_size, k_cache.shape[" + std::to_string(slots_dim()) + "]";
  }
};

// "HND" or "NHD", in any case. The Python wrapper checks this first; the module checks again for
// callers of the module itself.
KvLayout parse_kv_layout(const std::string& s);

// The pool's sizes as the library takes them, read from a 4-D cache tensor in `layout`.
struct PoolDims {
  int num_blocks, num_kv_heads, block_size, head_dim;
};

PoolDims pool_dims(const Tensor& k, KvLayout layout);

// The library's strides (CacheStrides) for a pair of equal shapes laid out over a pool: K/V caches
// or their per-token scales. Dimension 0 holds the blocks, heads_dim the kv heads, slots_dim the
// slots; the rows of `row` elements (head_dim, or 1) are contiguous (checked by the caller). K and
// V must step alike, with positive strides and rows that do not overlap (the library's
// require_cache_strides, whose error, naming `field`, is told as k's); a pair laid out as dense
// HND gets the default strides.
// per_element: the library's elements in one of the tensors' (2 for packed int4 codes), which
// multiplies the strides; `row` counts the library's elements.
pagedattn::CacheStrides pool_strides(const Tensor& k, const Tensor& v, int heads_dim, int slots_dim,
                                     int row, const char* field, int per_element = 1);

// kv_strides for a K/V cache pair of equal shapes, from the tensors' element strides. head_dim
// must be contiguous, and K and V must step alike: the library takes one set of strides for
// both. A pair laid out as dense HND gets the default strides.
pagedattn::CacheStrides cache_strides(const Tensor& k, const Tensor& v, KvLayout layout);

// The writable cache pair of a cache write or a block copy, checked: 4-D in `layout`, one
// storage dtype (a float format or quantized codes), one shape, one layout of strides, one device.
struct CachePair {
  Tensor k, v;
  DType dtype = DType::kF32;
  PoolDims dims{};
  pagedattn::CacheStrides strides;

  // The cache fields of the library's arguments (CacheWriteArgs, CopyBlocksArgs).
  template <typename Args>
  void fill(Args& a) const {
    a.num_kv_heads = dims.num_kv_heads;
    a.head_dim = dims.head_dim;
    a.block_size = dims.block_size;
    a.num_blocks = dims.num_blocks;
    a.kv_strides = strides;
    a.k_cache = k.data;
    a.v_cache = v.data;
    a.cache_dtype = dtype;
  }
};

// k_cache's last dimension against q's head_dim: equal, or half of it for packed int4 codes.
void require_cache_head_dim(const Tensor& k, std::int64_t head_dim);

CachePair cache_pair(nb::handle k_h, nb::handle v_h, const std::vector<std::string>& tags,
                     KvLayout layout);

}  // namespace pagedattn::py
