// The CPU backend's instruction set: the work-item kernel of the best set this processor runs
// (or the one PAGEDATTN_CPU_ISA names), chosen once per process.
#pragma once

#include "cpu_kernel.hpp"

namespace pagedattn::detail::cpu {

struct IsaChoice {
  KernelFn fn;
  const char* name;
};

// The chosen kernel; a PAGEDATTN_CPU_ISA that names no set of this build, or one this CPU cannot
// run, throws naming the variable and the accepted names.
const IsaChoice& isa();

}  // namespace pagedattn::detail::cpu
