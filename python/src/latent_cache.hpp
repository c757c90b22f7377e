// MLA's latent cache as tensors: one combined [num_blocks, block_size, kv_lora_rank + rope_dim]
// tensor (vLLM, FlashMLA, SGLang), split here into two strided views of c and k_pe, or two
// tensors [num_blocks, block_size, kv_lora_rank] and [num_blocks, block_size, rope_dim]
// (FlashInfer). Either may carry a size-1 dimension before the last ([..., 1, width], FlashMLA's
// k_cache). Their strides go to the library as c_strides and kpe_strides, so views are read and
// written in place. mla_decode, write_mla_cache, copy_mla_blocks and mla_workspace_size take it
// alike.
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

// Where the latent widths come from, for the errors of a cache that does not match them: the
// call's arguments that give kv_lora_rank and rope_dim ("q_nope.shape[2]", "q_pe.shape[2]").
struct LatentRefs {
  const char* rank;
  const char* rope;
};

// The latent cache of one call.
struct LatentCache {
  Tensor c, kpe;  // the imports (kpe unset for a combined tensor), alive until the call returns
  bool combined = false;
  DType dtype = DType::kBF16;
  int num_blocks = 0, block_size = 0;
  int rank = 0, rope = 0;  // kv_lora_rank and rope_dim, from split()
  void* c_data = nullptr;
  void* kpe_data = nullptr;
  MlaPartStrides c_strides, kpe_strides;

  // kpe_h None: c_h is the combined tensor ("kv_cache"); else the two parts ("c_cache",
  // "kpe_cache"), of one dtype and one [num_blocks, block_size]. `writable` for the cache
  // writes and copies. The widths are checked by split().
  void read(nb::handle c_h, nb::handle kpe_h, const std::vector<std::string>& tags, bool writable);
  // The last dimension: a combined row's kv_lora_rank + rope_dim, or c_cache's kv_lora_rank.
  std::int64_t width() const { return c.shape[2]; }
  // Checks the widths against kv_lora_rank and rope_dim as the call's other arguments give them
  // and sets the parts' pointers and strides: a combined row is c, then k_pe.
  void split(int kv_lora_rank, int rope_dim, const LatentRefs& refs);
  void require_device(const Device& device, const char* ref) const;

  // The cache fields of MlaDecodeArgs, MlaCacheWriteArgs and MlaCopyBlocksArgs.
  template <typename Args>
  void set(Args& a) const {
    a.kv_lora_rank = rank;
    a.rope_dim = rope;
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
