#include <cmath>

#include "pagedattn/pagedattn.hpp"

namespace pagedattn {

float DecodeArgs::effective_scale() const {
  return scale ? *scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
}

}  // namespace pagedattn
