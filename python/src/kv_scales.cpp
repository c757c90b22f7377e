#include "kv_scales.hpp"

#include <cmath>
#include <sstream>
#include <string>

#include "argument_error.hpp"
#include "pagedattn/pagedattn.hpp"
#include "tensor_import.hpp"

namespace pagedattn::py {

float KvScales::to_f32(double value, const char* name) {
  const float f = static_cast<float>(value);
  if (std::isfinite(value) && (!std::isfinite(f) || (value != 0 && f == 0))) {
    std::ostringstream given, why;
    given << value;
    why << "outside the float32 range (a scale lies in [" << pagedattn::kMinKvScale << ", "
        << pagedattn::kMaxKvScale << "])";
    reject(ErrorCode::kInvalidArgument, name, "", given.str(), why.str());
  }
  return f;
}

Tensor KvScales::per_kv_head(nb::handle h, const char* name, const Tensor& cache, KvLayout layout) {
  return float32_vector_input(h, name, "[num_kv_heads]", cache.shape[layout.heads_dim()],
                              layout.kv_heads_ref(), cache.device, "k_cache");
}

void TokenScales::read(nb::handle k_h, nb::handle v_h, const Tensor& cache, KvLayout layout,
                       bool writable) {
  if (k_h.is_none() && v_h.is_none()) return;
  if (k_h.is_none() || v_h.is_none()) {
    const char* missing = k_h.is_none() ? "k_token_scales" : "v_token_scales";
    const char* given_name = k_h.is_none() ? "v_token_scales" : "k_token_scales";
    reject(ErrorCode::kInvalidArgument, missing, "", "None",
           std::string("needed with ") + given_name + " (per-token scales come in pairs)");
  }
  k = scales_tensor(k_h, "k_token_scales", cache, layout, writable);
  v = scales_tensor(v_h, "v_token_scales", cache, layout, writable);
  // An int4 cache's group scales: [..., head_dim / 32], the last dimension contiguous.
  const int groups = k.ndim() == 4 ? k.dim_int(3) : 1;
  for (const Tensor* t : {&k, &v}) {
    if (groups > 1 && t->numel() > 0 && t->strides[3] != 1) {
      reject(ErrorCode::kInvalidArgument, t->name, ".strides", t->strides_str(),
             "the last dimension (a row's group scales) must be contiguous (stride 1)");
    }
  }
  strides = pool_strides(k, v, 1, 2, groups, "token_scale_strides");
  given = true;
}

float* TokenScales::data(const Tensor& t) {
  static float none = 0.f;
  return t.data != nullptr ? static_cast<float*>(t.data) : &none;
}

Tensor TokenScales::scales_tensor(nb::handle h, const char* name, const Tensor& cache,
                                  KvLayout layout, bool writable) {
  Tensor t = writable ? output(h, name) : input(h, name);
  const bool int4 = cache.codes_per_element() == 2;
  if (int4) {  // a scale per group of 32 values of a row
    t.require_ndim(4, "[num_blocks, num_kv_heads, block_size, head_dim / 32] (int4 group scales)");
  } else {
    t.require_ndim(3, "[num_blocks, num_kv_heads, block_size]");
  }
  t.require_dim(0, cache.shape[0], "num_blocks, k_cache.shape[0]");
  t.require_dim(1, cache.shape[layout.heads_dim()], layout.kv_heads_ref());
  t.require_dim(2, cache.shape[layout.slots_dim()], layout.slots_ref());
  if (int4) t.require_dim(3, cache.shape[3] * 2 / 32, "head_dim / 32, k_cache.shape[3] / 16");
  t.require_float32();
  t.require_device(cache.device, "k_cache");
  return t;
}

}  // namespace pagedattn::py
