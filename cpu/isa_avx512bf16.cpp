// ItemKernel on AVX-512 with the BF16 dot product (built with the AVX-512 flags plus
// -mavx512bf16): bf16 caches read with a bf16 q take Q.K as vdpbf16ps; the rest is the AVX-512
// kernel of isa_avx512.cpp.
#include "item_kernel_impl.hpp"

namespace pagedattn::detail::cpu {

void item_kernel_avx512bf16(const ItemContext& ctx, const WorkItem& item, int kv_count, float* m,
                            float* l, float* acc, ItemScratch scratch) {
  if (ctx.kv_dtype == DType::kBF16 && ctx.q_bf16 != nullptr) {
    run_item<xsimd::avx512bw, bf16_t, true>(ctx, item, kv_count, m, l, acc, scratch);
  } else {
    ItemKernel{}(xsimd::avx512bw{}, ctx, item, kv_count, m, l, acc, scratch);
  }
}

}  // namespace pagedattn::detail::cpu
