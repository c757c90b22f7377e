// The module's merge_states: attention states of several segments of the same contexts merged
// into the state over the whole contexts.
#pragma once

#include <nanobind/nanobind.h>

namespace pagedattn::py {

// Adds merge_states to the module.
void bind_merge_states(nanobind::module_& m);

}  // namespace pagedattn::py
