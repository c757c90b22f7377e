// The module's mla_decode: q_nope, q_pe, the latent cache and the tables checked and turned into
// MlaDecodeArgs, then the library's call; and mla_workspace_size, the CUDA workspace of such a
// call.
#pragma once

#include <nanobind/nanobind.h>

namespace pagedattn::py {

// Adds mla_decode and mla_workspace_size to the module.
void bind_mla_decode(nanobind::module_& m);

}  // namespace pagedattn::py
