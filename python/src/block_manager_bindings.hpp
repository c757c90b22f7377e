// pagedattn.BlockManager: the library's host-side block allocator, its tables as NumPy arrays.
#pragma once

#include <nanobind/nanobind.h>

namespace pagedattn::py {

void bind_block_manager(nanobind::module_& m);

}  // namespace pagedattn::py
