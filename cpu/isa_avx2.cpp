// ItemKernel for AVX2 + FMA (built with -mavx2 -mfma -mf16c).
#include "item_kernel_impl.hpp"
#include "mla_kernel_impl.hpp"

namespace pagedattn::detail::cpu {
template void ItemKernel::operator()<xsimd::fma3<xsimd::avx2>>(xsimd::fma3<xsimd::avx2>,
                                                               const ItemContext&, const WorkItem&,
                                                               float*, float*, float*,
                                                               ItemScratch) const;
template void ItemKernel::operator()<xsimd::fma3<xsimd::avx2>>(xsimd::fma3<xsimd::avx2>,
                                                               const ItemContext&, const WorkItem&,
                                                               int, float*, float*, float*,
                                                               ItemScratch) const;
template void mla_item<xsimd::fma3<xsimd::avx2>>(const MlaItemContext&, const WorkItem&, float*,
                                                 float*, float*, MlaScratch);
}  // namespace pagedattn::detail::cpu
