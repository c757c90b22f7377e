// ItemKernel for AArch64 NEON (Advanced SIMD, part of the AArch64 baseline: no extra flags).
// Empty on other processors.
#include "item_kernel_impl.hpp"
#include "mla_kernel_impl.hpp"

#if PAGEDATTN_CPU_ARM64
namespace pagedattn::detail::cpu {
template void ItemKernel::operator()<xsimd::neon64>(xsimd::neon64, const ItemContext&,
                                                    const WorkItem&, float*, float*, float*,
                                                    ItemScratch) const;
template void ItemKernel::operator()<xsimd::neon64>(xsimd::neon64, const ItemContext&,
                                                    const WorkItem&, int, float*, float*, float*,
                                                    ItemScratch) const;
template void mla_item<xsimd::neon64>(const MlaItemContext&, const WorkItem&, float*, float*,
                                      float*, MlaScratch);
}  // namespace pagedattn::detail::cpu
#endif
