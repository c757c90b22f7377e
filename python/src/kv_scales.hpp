// The fp8 cache scales of a decode or a cache write: the per-tensor k_scale and v_scale, and the
// per-kv-head arrays k_scales and v_scales (f32 [num_kv_heads], contiguous, on the caches'
// device). Their values, and whether the cache is fp8 at all, the library checks: it names the
// field (k_scale, k_scales[2]). A finite scale that f32 cannot hold (it would turn into inf or
// 0) is refused here, with the value as given.
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

}  // namespace pagedattn::py
