// The scales of a quantized cache (fp8 or int8) in a decode or a cache operation: the per-tensor
// k_scale and v_scale, the per-kv-head arrays k_scales and v_scales (f32 [num_kv_heads],
// contiguous, on the caches' device), and the per-token k_token_scales and v_token_scales. Their
// values, and whether the cache is quantized at all, the library checks: it names the field
// (k_scale, k_scales[2], k_token_scales[block 3, kv head 0, slot 5]). A finite scale that f32
// cannot hold (it would turn into inf or 0) is refused here, with the value as given.
#pragma once

#include <nanobind/nanobind.h>

#include "cache_tensors.hpp"
#include "tensor.hpp"

namespace pagedattn::py {

struct KvScales {
  Tensor k, v;  // the per-head arrays' imports, alive until the call returns

  // Sets the scale fields of DecodeArgs or CacheWriteArgs; `cache` is k_cache, read in `layout`.
  template <typename Args>
  void set(Args& a, double k_scale, double v_scale, nb::handle k_h, nb::handle v_h,
           const Tensor& cache, KvLayout layout) {
    a.k_scale = to_f32(k_scale, "k_scale");
    a.v_scale = to_f32(v_scale, "v_scale");
    if (!k_h.is_none()) {
      k = per_kv_head(k_h, "k_scales", cache, layout);
      a.k_scales = static_cast<const float*>(k.data);
    }
    if (!v_h.is_none()) {
      v = per_kv_head(v_h, "v_scales", cache, layout);
      a.v_scales = static_cast<const float*>(v.data);
    }
  }

  static float to_f32(double value, const char* name);
  static Tensor per_kv_head(nb::handle h, const char* name, const Tensor& cache, KvLayout layout);
};

// The per-token scales (k_token_scales, v_token_scales), both or neither: f32
// [num_blocks, num_kv_heads, block_size] (an int4 cache's group scales [num_blocks, num_kv_heads,
// block_size, head_dim / 32], the last dimension contiguous), in this order whatever the caches'
// kv_layout, on the
// caches' device, in any strides with positive steps and no two rows at one address, the same in
// both (two views into one tensor work); the strides become token_scale_strides, as the caches'
// become kv_strides. decode reads them; write_cache and copy_blocks write them (`writable`).
struct TokenScales {
  Tensor k, v;  // the imports, alive until the call returns
  pagedattn::CacheStrides strides;
  bool given = false;

  // Reads the pair; `cache` is k_cache, read in `layout`. None and None: no per-token scales.
  void read(nb::handle k_h, nb::handle v_h, const Tensor& cache, KvLayout layout, bool writable);

  // Sets the per-token fields of DecodeArgs, CacheWriteArgs or CopyBlocksArgs.
  template <typename Args>
  void set(Args& a) const {
    if (!given) return;
    a.k_token_scales = data(k);
    a.v_token_scales = data(v);
    a.token_scale_strides = strides;
  }

 private:
  // An empty tensor may have no data pointer; none of its elements is used, but null would mean
  // "no per-token scales" to the library.
  static float* data(const Tensor& t);
  static Tensor scales_tensor(nb::handle h, const char* name, const Tensor& cache, KvLayout layout,
                              bool writable);
};

}  // namespace pagedattn::py
