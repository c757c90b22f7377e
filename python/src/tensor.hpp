// One tensor argument as the module reads it: data pointer, dtype, shape, strides (in elements)
// and device, with the checks that name the Python argument when the tensor does not fit.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "device.hpp"
#include "pagedattn/dtype.hpp"

namespace pagedattn::py {

namespace nb = nanobind;

// A DLPack dtype as the error messages name it: "float32", "uint16", "float8_e4m3fn", ...
std::string dtype_str(nb::dlpack::dtype dt);

// Whether dt is the scalar type (code, bits).
bool has_dtype(nb::dlpack::dtype dt, nb::dlpack::dtype_code code, int bits);

// "(2, 3)", "(4,)": a shape or strides as Python prints a tuple.
std::string tuple_str(const std::vector<std::int64_t>& values);

// What the binding reads from one tensor argument. Holds the import, so the memory stays alive.
struct Tensor {
  std::string name;
  nb::ndarray<nb::ro> in;  // set for inputs
  nb::ndarray<> out;       // set for outputs
  void* data = nullptr;
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;  // in elements
  nb::dlpack::dtype dt{};
  Device device;
  // The storage dtype a marked integer tensor holds: kBF16 for a 16-bit one marked with
  // pagedattn.bf16(), kFP8E4M3 or kFP8E5M2 for an 8-bit one marked with pagedattn.fp8_e4m3() or
  // pagedattn.fp8_e5m2() (NumPy has neither type), kInt4 for an 8-bit one marked with
  // pagedattn.int4() (two codes a byte: its last dimension, and its strides, count bytes).
  std::optional<DType> marked;

  int ndim() const { return static_cast<int>(shape.size()); }
  // The library's elements in one of the tensor's: 2 for packed int4 codes, else 1.
  int codes_per_element() const { return marked == DType::kInt4 ? 2 : 1; }
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (auto s : shape) n *= s;
    return n;
  }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * ((dt.bits + 7) / 8); }
  std::string shape_str() const { return tuple_str(shape); }
  std::string strides_str() const { return tuple_str(strides); }

  // The storage dtype of a float tensor, or of a quantized cache's codes: the fp8 formats, and
  // int8 for an int8 tensor. Those are returned for any tensor, so that the library refuses them
  // where they do not belong with its own error (q_dtype, src_dtype, ...).
  DType float_dtype() const;
  // The dtype as errors name it: dtype_str(dt), or for a marked tensor the marking with it
  // ("pagedattn.fp8_e4m3(int8)").
  std::string dtype_label() const;

  void require_int32() const;
  void require_uint8() const;
  void require_float32() const;
  void require_ndim(int n, const char* layout) const;
  void require_dim(int i, std::int64_t expected, const std::string& why) const;
  // The whole shape of `other`, which has as many dimensions (checked before).
  void require_shape_of(const Tensor& other) const;
  void require_contiguous() const;
  void require_device(const Device& d, const std::string& ref) const;

  // Row-major contiguity over dimensions [first, ndim); dimensions of size 1 are free.
  bool contiguous_from(int first) const;

  // For a [batch, num_heads, head_dim] tensor (q, out): the elements between consecutive
  // sequences' rows. A sequence's heads must be contiguous, but sequences may lie any distance
  // apart in increasing order (q as a view into a fused QKV projection, out as a slice of a wider
  // buffer). 0 when the rows are adjacent or there is at most one, so a dense tensor is passed as
  // dense and a size-1 batch's stride, which PyTorch leaves arbitrary, is never read.
  std::int64_t sequence_stride() const;

  // Dimension i as an int, refused beyond the int32 range.
  int dim_int(int i) const;

  // The data pointer, or for an empty tensor without one a placeholder: none of its elements is
  // read, but null would be a missing argument to the library.
  void* data_or_placeholder() const;
};

// The storage dtype (float_dtype()) `first` and `second` share (key and value, k_cache and
// v_cache); an error naming `second` when they differ.
DType shared_float_dtype(const Tensor& first, const Tensor& second);

}  // namespace pagedattn::py
