#include "kv_scales.hpp"

#include <cmath>
#include <sstream>

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

}  // namespace pagedattn::py
