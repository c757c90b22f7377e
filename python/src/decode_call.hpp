// The module's decode and workspace_size: the tensors checked and turned into DecodeArgs, then
// the library's call.
#pragma once

#include <nanobind/nanobind.h>

namespace pagedattn::py {

// Adds decode and workspace_size to the module.
void bind_decode(nanobind::module_& m);

}  // namespace pagedattn::py
