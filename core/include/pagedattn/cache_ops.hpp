// Writing into the paged cache: append the K and V of new tokens through a slot mapping, and copy
// whole blocks (the copy half of copy-on-write). Both use the decode cache layout: by default
//   k/v_cache: [num_blocks][num_kv_heads][block_size][head_dim]
// or the one kv_strides gives (as DecodeArgs::kv_strides), and a slot names one token position of
// the pool: slot = block * block_size + offset. See docs/cache.md.
#pragma once

#include <cstdint>

#include "pagedattn/pagedattn.hpp"

namespace pagedattn {

// Cache writes: token i's key and value go to slot_mapping[i]; slot -1 skips the token.
// Shapes:
//   key, value:   [num_tokens][num_kv_heads][head_dim] (rows src_token_stride elements apart)
//   slot_mapping: int32 [num_tokens], each -1 or in [0, num_blocks * block_size)
// Slots of one call must be distinct (tokens are written in parallel): a slot other than -1 given
// twice is an Error naming the second token (on CUDA, when the slots are checked). head_dim is one
// decode() supports (kSupportedHeadDims). The new tokens' dtype may differ from the cache's:
// values are converted through f32, rounding to nearest even.
// For the CPU backend every pointer is host memory; for the CUDA backend, device memory.
struct CacheWriteArgs {
  int num_tokens = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int block_size = 0;
  int num_blocks = 0;  // size of the cache pool

  const void* key = nullptr;
  const void* value = nullptr;
  DType src_dtype = DType::kF32;
  std::int64_t src_token_stride = 0;  // elements between tokens; 0 means num_kv_heads * head_dim
  const std::int32_t* slot_mapping = nullptr;
  void* k_cache = nullptr;
  void* v_cache = nullptr;
  DType cache_dtype = DType::kF32;
  CacheStrides kv_strides;  // the caches' layout; default dense HND
  // A quantized cache (cache_dtype kFP8E4M3, kFP8E5M2 or kInt8) stores x / scale, rounded to the
  // nearest code (ties to even), finite values beyond the format's range saturating to its
  // largest code; NaN stays NaN in fp8 (Inf too in e5m2; Inf becomes NaN in e4m3, which has
  // none), and in int8 NaN becomes 0 and Inf saturates. scale is k_scale x k_scales[h] for kv
  // head h (k_scales null: k_scale alone), V alike: the scales a decode of the cache passes
  // (DecodeArgs::k_scale and the rest). Other caches take no scales.
  float k_scale = 1.f;
  float v_scale = 1.f;
  const float* k_scales = nullptr;  // f32 [num_kv_heads], where the caches are, or null
  const float* v_scales = nullptr;
  // Per-(token, kv head) scales (DecodeArgs::k_token_scales), both or neither, quantized caches
  // only: each written row (token, kv head) gets its own scale s, stored here at the row's place,
  // chosen so that the row's largest finite |x| maps onto the format's largest code:
  // s = max|x| / (max_code_magnitude(cache_dtype) x k_scale x k_scales[h]), clamped into
  // [kMinKvScale, kMaxKvScale], and 1 when the row has no finite nonzero value. The row then
  // stores x / (k_scale x k_scales[h] x s). An int4 cache (which needs them) does this for each
  // group of 32 values of a row, storing the row's head_dim / 32 scales from its offset on.
  // docs/kv_quantization.md.
  float* k_token_scales = nullptr;
  float* v_token_scales = nullptr;
  CacheStrides token_scale_strides;  // as DecodeArgs::token_scale_strides

  CacheLayout cache_layout() const {
    return CacheLayout::with_strides(num_blocks, num_kv_heads, block_size, head_dim, kv_strides);
  }
  CacheLayout token_scale_layout() const {  // as DecodeArgs::token_scale_layout()
    return CacheLayout::with_strides(num_blocks, num_kv_heads, block_size,
                                     token_scales_per_row(cache_dtype, head_dim),
                                     token_scale_strides);
  }
  std::int64_t token_stride() const {
    return src_token_stride ? src_token_stride : static_cast<std::int64_t>(num_kv_heads) * head_dim;
  }
};

// The per-token scale write_cache() gives a row whose largest finite |x| is amax, in a cache whose
// largest code magnitude is max_code (max_code_magnitude(cache_dtype)), under the row's kv-head
// scale head_scale (k_scale x k_scales[h]): amax / (max_code x head_scale), clamped into
// [kMinKvScale, kMaxKvScale]; 1 for a row with no finite nonzero value.
PAGEDATTN_HOST_DEVICE float row_token_scale(float amax, float max_code, float head_scale) {
  if (!(amax > 0.f && amax <= 3.402823466e38f)) return 1.f;
  const double s = static_cast<double>(amax) / (static_cast<double>(max_code) * head_scale);
  return s < kMinKvScale ? kMinKvScale : s > kMaxKvScale ? kMaxKvScale : static_cast<float>(s);
}

// One block copy: every kv head and slot of block `src` to block `dst`, in K and in V.
struct BlockCopy {
  std::int32_t src = 0;
  std::int32_t dst = 0;
};

// Block copies. `pairs` is host memory for both backends (the block manager produces it on the
// host); the caches follow the backend. A dst must not appear twice nor be any pair's src.
struct CopyBlocksArgs {
  int num_kv_heads = 0;
  int head_dim = 0;
  int block_size = 0;
  int num_blocks = 0;

  void* k_cache = nullptr;
  void* v_cache = nullptr;
  DType cache_dtype = DType::kF32;
  CacheStrides kv_strides;  // the caches' layout; default dense HND
  const BlockCopy* pairs = nullptr;
  int num_pairs = 0;
  // A quantized cache's per-token scales (DecodeArgs::k_token_scales), both or neither: copied
  // with their rows.
  float* k_token_scales = nullptr;
  float* v_token_scales = nullptr;
  CacheStrides token_scale_strides;

  CacheLayout cache_layout() const {
    return CacheLayout::with_strides(num_blocks, num_kv_heads, block_size, head_dim, kv_strides);
  }
  CacheLayout token_scale_layout() const {  // as DecodeArgs::token_scale_layout()
    return CacheLayout::with_strides(num_blocks, num_kv_heads, block_size,
                                     token_scales_per_row(cache_dtype, head_dim),
                                     token_scale_strides);
  }
};

struct CacheOpOptions {
  Backend backend = Backend::kAuto;  // resolved as for decode(); kAuto, kCpu or kCuda
  int num_threads = 0;          // CPU: worker threads in [1, kMaxThreads]; 0 uses OpenMP's default
  void* cuda_stream = nullptr;  // CUDA: the cudaStream_t to run on (nullptr = default)
  // CUDA: copy the device slot mapping to the host and check every slot before writing, as the
  // CPU backend does (one synchronisation per call). Unchecked (the default, like
  // DecodeOptions::cuda_checked), an out-of-range slot is skipped by the kernel and repeated
  // slots are not looked for; either way nothing is ever written outside the cache.
  bool cuda_checked = false;
};

// Writes the new tokens' K and V. Throws pagedattn::Error on bad input before writing anything
// (a slot out of range names slot_mapping[i] and its value).
void write_cache(const CacheWriteArgs& args, const CacheOpOptions& options = {});

// Copies blocks src -> dst in both caches. Throws pagedattn::Error on bad input before copying.
void copy_blocks(const CopyBlocksArgs& args, const CacheOpOptions& options = {});

}  // namespace pagedattn
