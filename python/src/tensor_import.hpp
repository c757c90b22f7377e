// Tensor arguments imported in place, never copied: a tuple the Python layer described a tensor
// with, or any object nanobind takes through DLPack or the buffer protocol (NumPy, PyTorch,
// CuPy, JAX, ...). A bf16 or fp8 marking arrives as the argument's name in `tags`.
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>
#include <string>
#include <vector>

#include "tensor.hpp"

namespace pagedattn::py {

// A read-only tensor argument `name`, read as the dtype `tags` marks it with, if any.
Tensor input(nb::handle h, const char* name, const std::vector<std::string>& tags = {});

// A writable tensor argument (an output), marked as for input().
Tensor output(nb::handle h, const char* name, const std::vector<std::string>& tags = {});

// Imports h into t (whose name is set) when nanobind takes it as an array, read-only; false,
// with t untouched, when it does not.
bool import_array(nb::handle h, Tensor& t);

// A float32 vector input of `length` elements (`dims` and `length_ref` name them in errors),
// contiguous, on `device` (the device of the argument `device_ref`).
Tensor float32_vector_input(nb::handle h, const char* name, const char* dims, std::int64_t length,
                            const std::string& length_ref, const Device& device,
                            const char* device_ref);

}  // namespace pagedattn::py
