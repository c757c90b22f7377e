// Cache writes on the CPU: OpenMP over tokens (or block copies); each (token, kv head) row is one
// contiguous run of head_dim elements in the source and in the cache, so a row is a memcpy when
// the dtypes match and a converting loop (through f32, dtype.hpp) when they differ.
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "cache_rows.hpp"
#include "pagedattn/cache_layout.hpp"
#include "pagedattn/cache_ops.hpp"
#include "pagedattn/detail/cache_backends.hpp"
#include "pagedattn/detail/visit_dtype.hpp"
#include "pagedattn/dtype.hpp"

namespace pagedattn::detail::cpu {
namespace {

// The largest finite |x| of a row (0 when it has none).
template <typename Src>
float finite_amax(const Src* src, int n) {
  float amax = 0.f;
  for (int i = 0; i < n; ++i) {
    const float x = std::fabs(to_float(src[i]));
    if (std::isfinite(x) && x > amax) amax = x;
  }
  return amax;
}

// One row of a quantized cache with per-token scales: its scale (row_token_scale) into *scale,
// its codes under head_scale x that scale into dst.
template <typename Src, typename Dst>
void quantize_row(const Src* src, Dst* dst, int n, float head_scale, DType cache, float* scale) {
  const float s = row_token_scale(finite_amax(src, n), max_code_magnitude(cache), head_scale);
  *scale = s;
  convert_row(src, dst, n, head_scale * s);
}

// One row of an int4 cache: each group of 32 values gets its scale (row_token_scale over the
// group, max code 7) into scales[k], and its codes x / (head_scale x that scale), two to a byte.
template <typename Src>
void quantize_int4_row(const Src* src, std::uint8_t* dst, int n, float head_scale, float* scales) {
  constexpr int kGroup = kInt4GroupSize;
  for (int k = 0; k < n / kGroup; ++k) {
    const Src* g = src + k * kGroup;
    const float s =
        row_token_scale(finite_amax(g, kGroup), max_code_magnitude(DType::kInt4), head_scale);
    scales[k] = s;
    const float q = head_scale * s;
    std::uint8_t* out = dst + k * (kGroup / 2);
    for (int j = 0; j < kGroup / 2; ++j) {
      out[j] =
          int4_pack(quantize_int4(to_float(g[2 * j]), q), quantize_int4(to_float(g[2 * j + 1]), q));
    }
  }
}

template <typename Src, typename Dst>
void write_typed(const CacheWriteArgs& a, const CacheOpOptions& o) {
  const CacheLayout layout = a.cache_layout();
  const CacheLayout scale_layout = a.token_scale_layout();
  const std::int64_t stride = a.token_stride();
  const auto* key = static_cast<const Src*>(a.key);
  const auto* value = static_cast<const Src*>(a.value);
  auto* k_cache = static_cast<Dst*>(a.k_cache);
  auto* v_cache = static_cast<Dst*>(a.v_cache);
  const std::int64_t elements =
      static_cast<std::int64_t>(a.num_tokens) * a.num_kv_heads * a.head_dim;
  const int threads = cache_op_threads(o, elements * 2 * (sizeof(Src) + sizeof(Dst)));
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
  for (int t = 0; t < a.num_tokens; ++t) {
    const std::int32_t slot = a.slot_mapping[t];
    if (slot < 0) continue;  // -1: skipped token
    const int block = slot / a.block_size;
    const int offset = slot % a.block_size;
    for (int h = 0; h < a.num_kv_heads; ++h) {
      const std::int64_t src = t * stride + static_cast<std::int64_t>(h) * a.head_dim;
      const std::int64_t dst = layout.offset(block, h, offset);
      const float ks = head_scale(a.k_scale, a.k_scales, h);
      const float vs = head_scale(a.v_scale, a.v_scales, h);
      if constexpr (std::is_same_v<Dst, int4x2_t>) {  // a byte holds two codes; scales required
        const std::int64_t at = scale_layout.offset(block, h, offset);
        quantize_int4_row(key + src, &k_cache[dst / 2].bits, a.head_dim, ks, &a.k_token_scales[at]);
        quantize_int4_row(value + src, &v_cache[dst / 2].bits, a.head_dim, vs,
                          &a.v_token_scales[at]);
        continue;
      } else if constexpr (is_quantized_type<Dst>) {
        if (a.k_token_scales != nullptr) {
          const std::int64_t at = scale_layout.offset(block, h, offset);
          quantize_row(key + src, k_cache + dst, a.head_dim, ks, a.cache_dtype,
                       &a.k_token_scales[at]);
          quantize_row(value + src, v_cache + dst, a.head_dim, vs, a.cache_dtype,
                       &a.v_token_scales[at]);
          continue;
        }
      }
      if constexpr (!std::is_same_v<Dst, int4x2_t>) {
        convert_row(key + src, k_cache + dst, a.head_dim, ks);
        convert_row(value + src, v_cache + dst, a.head_dim, vs);
      }
    }
  }
}

}  // namespace

void write_cache(const CacheWriteArgs& a, const CacheOpOptions& o) {
  visit_value_type(a.src_dtype, "src_dtype", [&](auto src) {
    visit_storage_type(a.cache_dtype, [&](auto cache) {
      write_typed<typename decltype(src)::type, typename decltype(cache)::type>(a, o);
    });
  });
}

void copy_blocks(const CopyBlocksArgs& a, const CacheOpOptions& o) {
  const CacheLayout layout = a.cache_layout();
  const std::int64_t block_bytes = dtype_bytes(
      a.cache_dtype, static_cast<std::int64_t>(a.num_kv_heads) * a.block_size * a.head_dim);
  auto* k = static_cast<unsigned char*>(a.k_cache);
  auto* v = static_cast<unsigned char*>(a.v_cache);
  const int threads = cache_op_threads(o, std::int64_t{a.num_pairs} * 4 * block_bytes);
  // 2 * num_pairs independent copies: K of each pair, then V of each pair.
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
  for (int i = 0; i < 2 * a.num_pairs; ++i) {
    copy_block(i % 2 == 0 ? k : v, layout, a.cache_dtype, a.pairs[i / 2]);
  }
  if (a.k_token_scales == nullptr) return;
  const CacheLayout scale_layout = a.token_scale_layout();
  const int groups = scale_layout.head_dim;  // a row's scales: 1, or head_dim / 32 for int4
  for (int i = 0; i < a.num_pairs; ++i) {    // the rows' scales with them: a few bytes a row
    for (int h = 0; h < a.num_kv_heads; ++h) {
      for (int t = 0; t < a.block_size; ++t) {
        const std::int64_t dst = scale_layout.offset(a.pairs[i].dst, h, t);
        const std::int64_t src = scale_layout.offset(a.pairs[i].src, h, t);
        for (int g = 0; g < groups; ++g) {
          a.k_token_scales[dst + g] = a.k_token_scales[src + g];
          a.v_token_scales[dst + g] = a.v_token_scales[src + g];
        }
      }
    }
  }
}

}  // namespace pagedattn::detail::cpu
