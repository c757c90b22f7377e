// The CPU kernel's inputs for a whole case, built as the backend builds them: q scaled once, and
// an ItemContext over the case's caches and table. Shared by the tests that call the kernels of
// every instruction set directly.
#pragma once

#include <cstddef>
#include <vector>

#include "cpu_kernel.hpp"
#include "pagedattn/dtype.hpp"
#include "pagedattn/pagedattn.hpp"

namespace pagedattn {

// Fills q_scaled with a's q times the effective scale and returns the backend's context over it
// (detail::cpu::item_context: a's variants included).
inline detail::cpu::ItemContext item_context(const DecodeArgs& a, std::vector<float>& q_scaled) {
  q_scaled.resize(static_cast<std::size_t>(a.batch) * a.num_heads * a.head_dim);
  for (std::size_t i = 0; i < q_scaled.size(); ++i) {
    q_scaled[i] = load_as_float(a.q, a.q_dtype, i) * a.effective_scale();
  }
  return detail::cpu::item_context(a, q_scaled.data());
}

}  // namespace pagedattn
