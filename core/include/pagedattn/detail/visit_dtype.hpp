// From a runtime DType to the storage type that holds it, for code templated on the element type
// (the CPU kernels, the benchmark's naive decode). Not installed.
#pragma once

#include "pagedattn/dtype.hpp"

namespace pagedattn::detail {

// Names a storage type without a value of it: visit_storage_type passes TypeTag<T>{} and the
// visitor reads T back as typename decltype(tag)::type.
template <class T>
struct TypeTag {
  using type = T;
};

// Calls visit(TypeTag<T>{}) with T the storage type of t (float, f16_t, bf16_t, fp8_e4m3_t,
// fp8_e5m2_t, int8_code_t or int4x2_t, a byte of two int4 codes), once; each dtype instantiates the
// visitor on its own type.
template <class Visitor>
void visit_storage_type(DType t, Visitor&& visit) {
  switch (t) {
    case DType::kF32:
      return visit(TypeTag<float>{});
    case DType::kF16:
      return visit(TypeTag<f16_t>{});
    case DType::kBF16:
      return visit(TypeTag<bf16_t>{});
    case DType::kFP8E4M3:
      return visit(TypeTag<fp8_e4m3_t>{});
    case DType::kFP8E5M2:
      return visit(TypeTag<fp8_e5m2_t>{});
    case DType::kInt8:
      return visit(TypeTag<int8_code_t>{});
    case DType::kInt4:
      return visit(TypeTag<int4x2_t>{});
  }
}

}  // namespace pagedattn::detail
