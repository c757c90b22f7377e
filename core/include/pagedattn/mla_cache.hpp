// Writing into the MLA latent cache that mla_decode reads (pagedattn/mla.hpp): append the latent
// rows of new tokens through a slot mapping, and copy whole blocks (the copy half of
// copy-on-write). The cache is MlaDecodeArgs': by default
//   c_cache:   [num_blocks][block_size][kv_lora_rank]
//   kpe_cache: [num_blocks][block_size][rope_dim]
// or as c_strides and kpe_strides place them, so one combined tensor of rows kv_lora_rank +
// rope_dim wide (vLLM, FlashMLA) is c_cache = base, kpe_cache = base + kv_lora_rank, both with
// strides {block_size * (kv_lora_rank + rope_dim), kv_lora_rank + rope_dim}. A slot names one
// token position of the pool: slot = block * block_size + offset. docs/mla.md.
#pragma once

#include <cstdint>

#include "pagedattn/cache_ops.hpp"
#include "pagedattn/mla.hpp"

namespace pagedattn {

// Latent cache writes: token i's kv_c row and k_pe row go to slot slot_mapping[i]; a negative
// slot skips the token (vLLM's MLA cache write skips every negative slot, where write_cache takes
// -1 alone). Shapes:
//   kv_c:         [num_tokens][kv_lora_rank], rows kv_c_row_stride elements apart (0: dense)
//   k_pe:         [num_tokens][rope_dim], rows k_pe_row_stride elements apart (0: dense)
//   slot_mapping: int32 [num_tokens], each negative or in [0, num_blocks * block_size)
// Slots of one call must be distinct (tokens are written in parallel): a non-negative slot given
// twice is an Error naming the later token (on CUDA, when the slots are checked). The values are
// converted through f32 to kv_dtype, rounding to nearest even; an fp8 cache stores value /
// kv_scale, finite values beyond the format's range saturating to its largest code, NaN staying
// NaN (Inf too in e5m2; Inf becomes NaN in e4m3, which has none), as write_cache quantizes.
// The parts may share one tensor (the combined layout) but no row of one may overlap a row of the
// other. For the CPU backend every pointer is host memory; for the CUDA backend, device memory.
struct MlaCacheWriteArgs {
  int num_tokens = 0;
  int kv_lora_rank = 512;  // as MlaDecodeArgs: a multiple of 16, at most 1024
  int rope_dim = 64;       // a multiple of 16 (0: none), at most 256
  int block_size = 0;      // [1, kMaxBlockSize]
  int num_blocks = 0;      // size of the cache pool

  const void* kv_c = nullptr;
  const void* k_pe = nullptr;      // may be null when rope_dim is 0
  DType src_dtype = DType::kBF16;  // f32, f16 or bf16
  std::int64_t kv_c_row_stride = 0;
  std::int64_t k_pe_row_stride = 0;
  const std::int32_t* slot_mapping = nullptr;

  void* c_cache = nullptr;
  void* kpe_cache = nullptr;      // may be null when rope_dim is 0
  DType kv_dtype = DType::kBF16;  // f32, f16, bf16, or fp8 (e4m3, e5m2) with kv_scale
  MlaPartStrides c_strides;       // as MlaDecodeArgs::c_strides
  MlaPartStrides kpe_strides;
  // An fp8 cache stores value / kv_scale, in [kMinKvScale, kMaxKvScale]; 1 otherwise. The scale
  // its decode passes (MlaDecodeArgs::kv_scale).
  float kv_scale = 1.f;

  std::int64_t kv_c_row() const { return kv_c_row_stride ? kv_c_row_stride : kv_lora_rank; }
  std::int64_t k_pe_row() const { return k_pe_row_stride ? k_pe_row_stride : rope_dim; }
  MlaPartStrides c_layout() const { return c_strides.or_dense(block_size, kv_lora_rank); }
  MlaPartStrides kpe_layout() const { return kpe_strides.or_dense(block_size, rope_dim); }
};

// Latent block copies: every slot of block `src` to block `dst`, in both parts. `pairs` is host
// memory for both backends (the block manager produces it on the host); the cache follows the
// backend. A dst must not appear twice nor be any pair's src.
struct MlaCopyBlocksArgs {
  int kv_lora_rank = 512;
  int rope_dim = 64;
  int block_size = 0;
  int num_blocks = 0;

  void* c_cache = nullptr;
  void* kpe_cache = nullptr;  // may be null when rope_dim is 0
  DType kv_dtype = DType::kBF16;
  MlaPartStrides c_strides;
  MlaPartStrides kpe_strides;
  const BlockCopy* pairs = nullptr;
  int num_pairs = 0;

  MlaPartStrides c_layout() const { return c_strides.or_dense(block_size, kv_lora_rank); }
  MlaPartStrides kpe_layout() const { return kpe_strides.or_dense(block_size, rope_dim); }
};

// Writes the new tokens' latent rows. Throws pagedattn::Error on bad input before writing
// anything (a slot past the pool names slot_mapping[i] and its value). CacheOpOptions as for
// write_cache: on CUDA, cuda_checked checks the device slot mapping on the host first; unchecked,
// the kernel skips a slot past the pool and does not look for repeated ones.
void write_mla_cache(const MlaCacheWriteArgs& args, const CacheOpOptions& options = {});

// Copies blocks src -> dst in both latent parts. Throws pagedattn::Error on bad input before
// copying.
void copy_blocks(const MlaCopyBlocksArgs& args, const CacheOpOptions& options = {});

}  // namespace pagedattn
