// pagedattn._ext: the nanobind module under the pagedattn Python package.
//
// Every tensor argument arrives as any DLPack-capable object (NumPy, PyTorch, CuPy, JAX, ...) and
// is used in place: dtype, shape, strides and device are read from the tensor, checked, and turned
// into the library's argument structs. A mismatch throws pagedattn::Error naming the Python
// argument before anything is written; the Python side turns it into pagedattn.Error.
// The Python wrapper (pagedattn/__init__.py) allocates missing outputs, picks the default stream
// and unwraps integer tensors marked as bf16 or fp8 (passing their names in `tags`); the module
// does the checking and the calls. This file assembles the module from its parts:
//   tensor.hpp, tensor_import.hpp      one tensor argument: its checks and its import
//   device.hpp                         devices, the backend they pick, the module's CUDA calls
//   cache_tensors.hpp, kv_scales.hpp   the K/V caches' layout and strides, their scales
//   decode_call.hpp, cache_ops.hpp,    the module's functions, each file binding its own
//   merge_states_call.hpp, mla_call.hpp,
//   mla_cache_ops.hpp
//   latent_cache.hpp                   MLA's latent cache: one combined tensor or two parts
//   sequence_tensors.hpp               the block table, q_indptr, lse and the options, as
//                                      decodes read them
//   block_manager_bindings.hpp         the BlockManager class
#include <nanobind/nanobind.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>

#include <algorithm>
#include <string>
#include <utility>

#include "block_manager_bindings.hpp"
#include "cache_ops.hpp"
#include "decode_call.hpp"
#include "merge_states_call.hpp"
#include "mla_cache_ops.hpp"
#include "mla_call.hpp"
#include "pagedattn/pagedattn.hpp"

namespace nb = nanobind;

namespace {

// The code pagedattn.Error carries: the library's name for it, with '_' between the words.
std::string python_error_code(pagedattn::ErrorCode c) {
  std::string s = pagedattn::error_code_name(c);
  std::replace(s.begin(), s.end(), ' ', '_');
  return s;
}

}  // namespace

NB_MODULE(_ext, m) {
  namespace py = pagedattn::py;
  m.doc() = "pagedattn's compiled core; use the functions of the pagedattn package.";

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const pagedattn::Error& e) {
      nb::object cls = nb::module_::import_("pagedattn._errors").attr("Error");
      nb::object exc = cls(e.what(), e.argument(), python_error_code(e.code()));
      PyErr_SetObject(cls.ptr(), exc.ptr());
    }
  });

  py::bind_decode(m);
  py::bind_cache_ops(m);
  py::bind_merge_states(m);
  py::bind_mla_decode(m);
  py::bind_mla_cache_ops(m);

  m.def("cuda_available", []() {
    std::string why;
    const bool ok = pagedattn::cuda_available(&why);
    return std::make_pair(ok, why);
  });
  m.attr("built_with_cuda") = bool(PAGEDATTN_PY_CUDA);
  {
    nb::list dims;
    for (int d : pagedattn::kSupportedHeadDims) dims.append(d);
    m.attr("SUPPORTED_HEAD_DIMS") = nb::tuple(dims);
  }
  {
    nb::list dims;  // those the CUDA backend has kernels for (512 not yet)
    for (int d : pagedattn::kCudaHeadDims) dims.append(d);
    m.attr("CUDA_HEAD_DIMS") = nb::tuple(dims);
  }
  m.attr("MAX_BLOCK_SIZE") = pagedattn::kMaxBlockSize;
  m.attr("MAX_GROUP_SIZE") = pagedattn::kMaxGroupSize;

  py::bind_block_manager(m);
}
