// The module's cache operations: write_cache (new tokens' keys and values into their slots) and
// copy_blocks (whole blocks, the copy half of copy-on-write).
#pragma once

#include <nanobind/nanobind.h>

namespace pagedattn::py {

// Adds write_cache and copy_blocks to the module.
void bind_cache_ops(nanobind::module_& m);

}  // namespace pagedattn::py
