// ItemKernel for SSE2, the portable x86-64 baseline.
#include "item_kernel_impl.hpp"
#include "mla_kernel_impl.hpp"

namespace pagedattn::detail::cpu {
template void ItemKernel::operator()<xsimd::sse2>(xsimd::sse2, const ItemContext&, const WorkItem&,
                                                  float*, float*, float*, ItemScratch) const;
template void ItemKernel::operator()<xsimd::sse2>(xsimd::sse2, const ItemContext&, const WorkItem&,
                                                  int, float*, float*, float*, ItemScratch) const;
template void mla_item<xsimd::sse2>(const MlaItemContext&, const WorkItem&, float*, float*, float*,
                                    MlaScratch);
}  // namespace pagedattn::detail::cpu
