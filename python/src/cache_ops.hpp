// The module's cache operations: write_cache (new tokens' keys and values into their slots) and
// copy_blocks (whole blocks, the copy half of copy-on-write).
#pragma once

#include <nanobind/nanobind.h>

#include <vector>

#include "pagedattn/cache_ops.hpp"

namespace pagedattn::py {

// Block copy pairs (copy_blocks, copy_mla_blocks): an int32 or int64 host tensor [n, 2], or any
// sequence of (src, dst) pairs of ints; an error naming `pairs` otherwise. The library checks the
// ids.
std::vector<pagedattn::BlockCopy> read_pairs(nanobind::handle h);

// Adds write_cache and copy_blocks to the module.
void bind_cache_ops(nanobind::module_& m);

}  // namespace pagedattn::py
