#include "tensor_import.hpp"

#include <optional>

#include "argument_error.hpp"

namespace pagedattn::py {
namespace {

Device device_of(int type, int id, const std::string& name) {
  if (type == nb::device::cpu::value || type == nb::device::cuda_host::value) {
    return {DeviceKind::kCpu, 0};
  }
  if (type == nb::device::cuda::value) return {DeviceKind::kCuda, id};
  reject(ErrorCode::kInvalidArgument, name, ".device", "dlpack device type " + std::to_string(type),
         "only CPU and CUDA tensors are supported");
}

template <typename Array>
void describe(Tensor& t, const Array& a) {
  t.data = const_cast<void*>(static_cast<const void*>(a.data()));
  t.dt = a.dtype();
  t.shape.resize(a.ndim());
  t.strides.resize(a.ndim());
  for (std::size_t i = 0; i < a.ndim(); ++i) {
    t.shape[i] = static_cast<std::int64_t>(a.shape(i));
    t.strides[i] = a.stride(i);
  }
  t.device = device_of(a.device_type(), a.device_id(), t.name);
}

// A tensor the Python layer described as a plain tuple (pagedattn/__init__.py, _ref): (data
// pointer, DLPack type code, bits, DLPack device type, device index, shape, strides in elements).
// PyTorch tensors come this way, as reading their attributes is cheaper than a DLPack export.
bool import_described(nb::handle h, Tensor& t) {
  if (!nb::isinstance<nb::tuple>(h)) return false;
  const nb::tuple d = nb::borrow<nb::tuple>(h);
  if (d.size() != 7) return false;
  t.data = reinterpret_cast<void*>(nb::cast<std::uintptr_t>(d[0]));
  t.dt.code = nb::cast<std::uint8_t>(d[1]);
  t.dt.bits = nb::cast<std::uint8_t>(d[2]);
  t.dt.lanes = 1;
  const nb::tuple shape = nb::cast<nb::tuple>(d[5]), strides = nb::cast<nb::tuple>(d[6]);
  if (shape.size() != strides.size()) return false;
  t.shape.resize(shape.size());
  t.strides.resize(shape.size());
  for (std::size_t i = 0; i < shape.size(); ++i) {
    t.shape[i] = nb::cast<std::int64_t>(shape[i]);
    t.strides[i] = nb::cast<std::int64_t>(strides[i]);
  }
  t.device = device_of(nb::cast<int>(d[3]), nb::cast<int>(d[4]), t.name);
  return true;
}

// Imports a tensor without copying. Outputs must be writable.
Tensor import_tensor(nb::handle h, const std::string& name, bool writable,
                     std::optional<DType> marked) {
  Tensor t;
  t.name = name;
  t.marked = marked;
  if (import_described(h, t)) return t;
  if (writable) {
    if (nb::try_cast(h, t.out, /*convert=*/false)) {
      describe(t, t.out);
      return t;
    }
    nb::ndarray<nb::ro> probe;
    if (nb::try_cast(h, probe, /*convert=*/false)) {
      reject(ErrorCode::kInvalidArgument, name, "", "a read-only tensor",
             "must be writable (it is an output)");
    }
  } else if (import_array(h, t)) {
    return t;
  }
  std::string type_name = nb::type_name(h.type()).c_str();
  reject(ErrorCode::kInvalidArgument, name, "", "an object of type " + type_name,
         "expected a tensor supporting DLPack or the buffer protocol (NumPy, PyTorch, CuPy, JAX, "
         "...)");
}

// The dtype `tags` gives the argument `name`: an entry "name" or "name:bf16" marks bf16 bits,
// "name:fp8_e4m3" and "name:fp8_e5m2" fp8 codes, "name:int4" packed int4 codes (pagedattn.bf16()
// and the rest). An entry of another form is an error naming `tags`.
std::optional<DType> tagged(const std::vector<std::string>& tags, const char* name) {
  const std::size_t n = std::char_traits<char>::length(name);
  for (const std::string& tag : tags) {
    if (tag.compare(0, n, name) != 0) continue;
    if (tag.size() == n) return DType::kBF16;
    if (tag[n] != ':') continue;
    const std::string kind = tag.substr(n + 1);
    if (kind == "bf16") return DType::kBF16;
    if (kind == "fp8_e4m3") return DType::kFP8E4M3;
    if (kind == "fp8_e5m2") return DType::kFP8E5M2;
    if (kind == "int4") return DType::kInt4;
    reject(ErrorCode::kInvalidArgument, "tags", "", "'" + tag + "'",
           "expected 'name', 'name:bf16', 'name:fp8_e4m3', 'name:fp8_e5m2' or 'name:int4'");
  }
  return std::nullopt;
}

}  // namespace

Tensor input(nb::handle h, const char* name, const std::vector<std::string>& tags) {
  return import_tensor(h, name, false, tagged(tags, name));
}

Tensor output(nb::handle h, const char* name, const std::vector<std::string>& tags) {
  return import_tensor(h, name, true, tagged(tags, name));
}

bool import_array(nb::handle h, Tensor& t) {
  if (!nb::try_cast(h, t.in, /*convert=*/false)) return false;
  describe(t, t.in);
  return true;
}

Tensor float32_vector_input(nb::handle h, const char* name, const char* dims, std::int64_t length,
                            const std::string& length_ref, const Device& device,
                            const char* device_ref) {
  Tensor t = input(h, name);
  t.require_ndim(1, dims);
  t.require_dim(0, length, length_ref);
  t.require_float32();
  t.require_contiguous();
  t.require_device(device, device_ref);
  return t;
}

}  // namespace pagedattn::py
