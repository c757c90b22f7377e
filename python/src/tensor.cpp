#include "tensor.hpp"

#include <climits>
#include <sstream>
#include <utility>

#include "argument_error.hpp"

namespace pagedattn::py {
namespace {

// DLPack's codes of the 8-bit float formats (DLPack 1.1, kDLFloat8_*; nanobind's dtype_code does
// not name them). PyTorch's float8_e4m3fn and float8_e5m2 are the OCP formats of fp8 caches.
constexpr std::uint8_t kDLFloat8E4M3Fn = 10;
constexpr std::uint8_t kDLFloat8E5M2 = 12;

// The names of DLPack's 8-bit float codes 7 to 14, nullptr for another code.
const char* float8_name(std::uint8_t code) {
  static const char* const kNames[] = {"float8_e3m4",     "float8_e4m3",     "float8_e4m3b11fnuz",
                                       "float8_e4m3fn",   "float8_e4m3fnuz", "float8_e5m2",
                                       "float8_e5m2fnuz", "float8_e8m0fnu"};
  static_assert(kDLFloat8E4M3Fn == 7 + 3 && kDLFloat8E5M2 == 7 + 5, "codes 7 to 14 in order");
  return code >= 7 && code <= 14 ? kNames[code - 7] : nullptr;
}

}  // namespace

std::string dtype_str(nb::dlpack::dtype dt) {
  using Code = nb::dlpack::dtype_code;
  if (dt.bits == 8 && dt.lanes == 1 && float8_name(dt.code) != nullptr) {
    return float8_name(dt.code);
  }
  if (dt.code == static_cast<std::uint8_t>(Code::Bool)) return "bool";
  static const std::pair<Code, const char*> kKinds[] = {{Code::Int, "int"},
                                                        {Code::UInt, "uint"},
                                                        {Code::Float, "float"},
                                                        {Code::Bfloat, "bfloat"},
                                                        {Code::Complex, "complex"}};
  std::string s = "code" + std::to_string(dt.code) + "_";
  for (const auto& [code, kind] : kKinds) {
    if (dt.code == static_cast<std::uint8_t>(code)) s = kind;
  }
  s += std::to_string(dt.bits);
  if (dt.lanes != 1) s += "x" + std::to_string(dt.lanes);
  return s;
}

bool has_dtype(nb::dlpack::dtype dt, nb::dlpack::dtype_code code, int bits) {
  return dt.code == static_cast<std::uint8_t>(code) && dt.bits == bits && dt.lanes == 1;
}

std::string tuple_str(const std::vector<std::int64_t>& values) {
  std::ostringstream os;
  os << '(';
  for (std::size_t i = 0; i < values.size(); ++i) os << (i ? ", " : "") << values[i];
  os << (values.size() == 1 ? ",)" : ")");
  return os.str();
}

DType Tensor::float_dtype() const {
  using Code = nb::dlpack::dtype_code;
  if (marked) {
    const bool int4 = *marked == DType::kInt4;
    const int bits = pagedattn::is_fp8(*marked) || int4 ? 8 : 16;
    if (has_dtype(dt, Code::UInt, bits) || has_dtype(dt, Code::Int, bits)) return *marked;
    reject(ErrorCode::kInvalidArgument, name, ".dtype", dtype_str(dt),
           int4        ? std::string("pagedattn.int4() marks an 8-bit integer tensor holding two "
                                            "int4 codes a byte")
           : bits == 8 ? std::string("pagedattn.") + pagedattn::dtype_name(*marked) +
                             "() marks an 8-bit integer tensor holding fp8 codes"
                       : std::string("pagedattn.bf16() marks a 16-bit integer tensor holding bf16 "
                                     "bit patterns"));
  }
  if (has_dtype(dt, Code::Float, 32)) return DType::kF32;
  if (has_dtype(dt, Code::Float, 16)) return DType::kF16;
  if (has_dtype(dt, Code::Bfloat, 16)) return DType::kBF16;
  if (dt.bits == 8 && dt.lanes == 1 && dt.code == kDLFloat8E4M3Fn) return DType::kFP8E4M3;
  if (dt.bits == 8 && dt.lanes == 1 && dt.code == kDLFloat8E5M2) return DType::kFP8E5M2;
  if (has_dtype(dt, Code::Int, 8)) return DType::kInt8;
  if (name == "kv_cache" || name == "c_cache" || name == "kpe_cache") {
    reject(ErrorCode::kInvalidArgument, name, ".dtype", dtype_str(dt),
           "expected float32, float16, bfloat16, float8_e4m3fn or float8_e5m2 (bf16 bits in a "
           "uint16 tensor: wrap it with pagedattn.bf16(); fp8 codes in a uint8 tensor: with "
           "pagedattn.fp8_e4m3() or pagedattn.fp8_e5m2())");
  }
  if (name == "k_cache" || name == "v_cache") {
    reject(ErrorCode::kInvalidArgument, name, ".dtype", dtype_str(dt),
           "expected float32, float16, bfloat16, float8_e4m3fn, float8_e5m2 or int8 (bf16 bits "
           "in a uint16 tensor: wrap it with pagedattn.bf16(); fp8 codes in a uint8 tensor: with "
           "pagedattn.fp8_e4m3() or pagedattn.fp8_e5m2())");
  }
  reject(ErrorCode::kInvalidArgument, name, ".dtype", dtype_str(dt),
         "expected float32, float16 or bfloat16 (bf16 bits in a uint16 tensor: wrap it with "
         "pagedattn.bf16())");
}

void Tensor::require_int32() const {
  if (!has_dtype(dt, nb::dlpack::dtype_code::Int, 32)) {
    reject(ErrorCode::kInvalidArgument, name, ".dtype", dtype_str(dt), "expected int32");
  }
}

void Tensor::require_uint8() const {
  if (!has_dtype(dt, nb::dlpack::dtype_code::UInt, 8)) {
    reject(ErrorCode::kInvalidArgument, name, ".dtype", dtype_str(dt), "expected uint8");
  }
}

void Tensor::require_float32() const {
  if (!has_dtype(dt, nb::dlpack::dtype_code::Float, 32)) {
    reject(ErrorCode::kInvalidArgument, name, ".dtype", dtype_str(dt), "expected float32");
  }
}

void Tensor::require_ndim(int n, const char* layout) const {
  if (ndim() != n) {
    reject(ErrorCode::kInvalidArgument, name, ".shape", shape_str(),
           "expected " + std::to_string(n) + " dimensions " + layout);
  }
}

void Tensor::require_dim(int i, std::int64_t expected, const std::string& why) const {
  if (shape[i] != expected) {
    reject(ErrorCode::kInvalidArgument, name, ".shape", shape_str(),
           "dimension " + std::to_string(i) + " must be " + std::to_string(expected) + " (" + why +
               ")");
  }
}

void Tensor::require_shape_of(const Tensor& other) const {
  for (int i = 0; i < other.ndim(); ++i) {
    if (shape[i] != other.shape[i]) {
      reject(ErrorCode::kInvalidArgument, name, ".shape", shape_str(),
             "must equal " + other.name + ".shape " + other.shape_str());
    }
  }
}

bool Tensor::contiguous_from(int first) const {
  if (numel() == 0) return true;
  std::int64_t expected = 1;
  for (int i = ndim() - 1; i >= first; --i) {
    if (shape[i] != 1 && strides[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

void Tensor::require_contiguous() const {
  if (numel() > 1 && !contiguous_from(0)) {
    reject(ErrorCode::kInvalidArgument, name, ".strides", strides_str(),
           "must be contiguous (row-major); pass a contiguous tensor");
  }
}

std::int64_t Tensor::sequence_stride() const {
  if (!contiguous_from(1)) {
    reject(ErrorCode::kInvalidArgument, name, ".strides", strides_str(),
           "each sequence's [num_heads, head_dim] must be contiguous (row-major); only the "
           "stride between sequences may be larger");
  }
  const std::int64_t row = shape[1] * shape[2];
  if (shape[0] <= 1 || row == 0 || strides[0] == row) return 0;
  if (strides[0] < row) {
    reject(ErrorCode::kInvalidArgument, name, ".strides", strides_str(),
           "sequences must be at least num_heads * head_dim = " + std::to_string(row) +
               " elements apart, in increasing order (rows must not overlap)");
  }
  return strides[0];
}

int Tensor::dim_int(int i) const {
  if (shape[i] > INT_MAX) {
    reject(ErrorCode::kInvalidArgument, name, ".shape", shape_str(),
           "dimension " + std::to_string(i) + " exceeds the int32 range");
  }
  return static_cast<int>(shape[i]);
}

void* Tensor::data_or_placeholder() const {
  static std::int32_t placeholder[4] = {};
  return data ? data : placeholder;
}

void Tensor::require_device(const Device& d, const std::string& ref) const {
  if (device != d) {
    reject(ErrorCode::kInvalidArgument, name, ".device", device.str(),
           "must be on the same device as " + ref + " (" + d.str() + ")");
  }
}

std::string Tensor::dtype_label() const {
  if (!marked) return dtype_str(dt);
  return std::string("pagedattn.") + pagedattn::dtype_name(*marked) + "(" + dtype_str(dt) + ")";
}

DType shared_float_dtype(const Tensor& first, const Tensor& second) {
  const DType d = first.float_dtype();
  if (second.float_dtype() != d) {
    reject(ErrorCode::kInvalidArgument, second.name, ".dtype", second.dtype_label(),
           "must equal " + first.name + ".dtype (" + first.dtype_label() + ")");
  }
  return d;
}

}  // namespace pagedattn::py
