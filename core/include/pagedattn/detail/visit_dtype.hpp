// From a runtime DType to the storage type that holds it, for code templated on the element type
// (the kernels of both backends, the benchmark's naive decode). Host code only. Not installed.
#pragma once

#include <type_traits>
#include <utility>

#include "pagedattn/dtype.hpp"
#include "pagedattn/error.hpp"

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

// The storage types a kernel is instantiated on, for visit_accepted_type.
template <class... Ts>
struct TypeList {};

// The value types: f32, f16 and bf16, which any tensor may hold (a query, an output, the source
// of a cache write); the quantized dtypes store caches only.
using ValueTypes = TypeList<float, f16_t, bf16_t>;

// visit_storage_type for a visitor instantiated on the types of `accepted` only: calls
// visit(TypeTag<T>{}) when t's storage type T is one of them, else throws kUnsupported naming
// `argument`. Validation refuses those dtypes before a backend runs; the throw keeps one it would
// let through from being skipped without a word.
template <class... Accepted, class Visitor>
void visit_accepted_type(TypeList<Accepted...>, DType t, const char* argument, Visitor&& visit) {
  visit_storage_type(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr ((std::is_same_v<T, Accepted> || ...)) {
      visit(tag);
    } else {
      fail(ErrorCode::kUnsupported, argument, dtype_name(t), "no kernel here takes this dtype");
    }
  });
}

// visit_accepted_type over the value types: f32, f16 or bf16.
template <class Visitor>
void visit_value_type(DType t, const char* argument, Visitor&& visit) {
  visit_accepted_type(ValueTypes{}, t, argument, std::forward<Visitor>(visit));
}

}  // namespace pagedattn::detail
