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

// The kernel of the shared prefix passes (prefix_passes.hpp), whose many rows per K/V row make
// them bound by arithmetic, not reads: isa()'s, except where auto picked avx512 on a CPU with
// AVX-512 BF16, which takes avx512bf16 there (vdpbf16ps: half the Q.K instructions, and half
// the P.V ones with a bf16 out). A PAGEDATTN_CPU_ISA that names a set is kept for every pass.
KernelFn prefix_kernel();

}  // namespace pagedattn::detail::cpu
