// The CPU backend's instruction set: the work-item kernels (GQA and MLA) of the best set this
// processor runs (or the one PAGEDATTN_CPU_ISA names), chosen once per process.
#pragma once

#include "cpu_kernel.hpp"
#include "mla_kernel.hpp"

namespace pagedattn::detail::cpu {

struct IsaChoice {
  KernelFn fn;
  const char* name;
  MlaKernelFn mla_fn;  // the MLA item kernel of the set (mla_kernel.hpp)
};

// The chosen kernel; a PAGEDATTN_CPU_ISA that names no set of this build, or one this CPU cannot
// run, throws naming the variable and the accepted names.
const IsaChoice& isa();

}  // namespace pagedattn::detail::cpu
