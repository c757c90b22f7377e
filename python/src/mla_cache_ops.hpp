// The module's latent cache operations (pagedattn/mla_cache.hpp): write_mla_cache (new tokens'
// kv_c and k_pe rows into their slots) and copy_mla_blocks (whole blocks of both parts, the copy
// half of copy-on-write), over the cache as mla_decode takes it (latent_cache.hpp).
#pragma once

#include <nanobind/nanobind.h>

namespace pagedattn::py {

// Adds write_mla_cache and copy_mla_blocks to the module.
void bind_mla_cache_ops(nanobind::module_& m);

}  // namespace pagedattn::py
