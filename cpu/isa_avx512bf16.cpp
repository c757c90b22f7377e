// ItemKernel on AVX-512 with the BF16 dot product and VBMI (built with the AVX-512 flags plus
// -mavx512bf16 -mavx512vbmi): bf16 caches read with a bf16 q take Q.K as vdpbf16ps; fp8 caches
// widen through a bf16 table (vpermi2b, widen.hpp), with a bf16 q into vdpbf16ps too; the rest
// is the AVX-512 kernel of isa_avx512.cpp.
#include "item_kernel_impl.hpp"

namespace pagedattn::detail::cpu {

void item_kernel_avx512bf16(const ItemContext& ctx, const WorkItem& item, int kv_count, float* m,
                            float* l, float* acc, ItemScratch scratch) {
  using A = xsimd::avx512bw;
  if (ctx.q_bf16 != nullptr && !ctx.dequantizes()) {
    switch (ctx.kv_dtype) {
      case DType::kBF16:
        return run_item<A, bf16_t, true>(ctx, item, kv_count, m, l, acc, scratch);
      case DType::kFP8E4M3:
        return run_item<A, fp8_e4m3_t, true>(ctx, item, kv_count, m, l, acc, scratch);
      case DType::kFP8E5M2:
        return run_item<A, fp8_e5m2_t, true>(ctx, item, kv_count, m, l, acc, scratch);
      default:
        break;
    }
  }
  ItemKernel{}(A{}, ctx, item, kv_count, m, l, acc, scratch);
}

}  // namespace pagedattn::detail::cpu
