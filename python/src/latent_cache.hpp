// MLA's latent cache as tensors: one combined [num_blocks, block_size, kv_lora_rank + rope_dim]
// tensor (vLLM, FlashMLA, SGLang), split here into two strided views of c and k_pe, or two
// tensors [num_blocks, block_size, kv_lora_rank] and [num_blocks, block_size, rope_dim]
// (FlashInfer). Either may carry a size-1 dimension before the last ([..., 1, width], FlashMLA's
// k_cache). Their strides go to the library as c_strides and kpe_strides, so views are read in
// place.
#pragma once

#include <nanobind/nanobind.h>

#include <string>
#include <vector>

#include "pagedattn/mla.hpp"
#include "tensor.hpp"

namespace pagedattn::py {

// Strides in elements between a tensor's rows (each contiguous) and dimensions, as the module
// reads q_nope, q_pe and out: [rows, heads, width].
struct RowStrides {
  std::int64_t row = 0;   // 0: dense
  std::int64_t head = 0;  // 0: dense
};

// The row and head strides of a [rows, num_heads, width] tensor: width contiguous, heads at
// least `width` elements apart and rows at least a row's heads apart, in increasing order. Sizes
// of 1 leave their stride free; dense dimensions give 0.
RowStrides row_strides(const Tensor& t);

// The latent cache of one call, checked against kv_lora_rank and rope_dim (from q_nope and q_pe).
struct LatentCache {
  Tensor c, kpe;  // the imports (kpe unset for a combined tensor), alive until the call returns
  DType dtype = DType::kBF16;
  int num_blocks = 0, block_size = 0;
  const void* c_data = nullptr;
  const void* kpe_data = nullptr;
  MlaPartStrides c_strides, kpe_strides;

  // kpe_h None: c_h is the combined tensor ("kv_cache"); else the two parts ("c_cache",
  // "kpe_cache"). All on `device` (q_nope's).
  void read(nb::handle c_h, nb::handle kpe_h, const std::vector<std::string>& tags, int rank,
            int rope, const Device& device);

  void set(MlaDecodeArgs& a) const {
    a.kv_dtype = dtype;
    a.num_blocks = num_blocks;
    a.block_size = block_size;
    a.c_cache = c_data;
    a.kpe_cache = kpe_data;
    a.c_strides = c_strides;
    a.kpe_strides = kpe_strides;
  }
};

}  // namespace pagedattn::py
