// ItemKernel for AVX-512 (F, CD, DQ and BW; built with their flags, FMA and F16C).
#include "item_kernel_impl.hpp"
#include "mla_kernel_impl.hpp"

namespace pagedattn::detail::cpu {
template void ItemKernel::operator()<xsimd::avx512bw>(xsimd::avx512bw, const ItemContext&,
                                                      const WorkItem&, float*, float*, float*,
                                                      ItemScratch) const;
template void ItemKernel::operator()<xsimd::avx512bw>(xsimd::avx512bw, const ItemContext&,
                                                      const WorkItem&, int, float*, float*, float*,
                                                      ItemScratch) const;
template void mla_item<xsimd::avx512bw>(const MlaItemContext&, const WorkItem&, float*, float*,
                                        float*, MlaScratch);
}  // namespace pagedattn::detail::cpu
