#include "cuda_alignment.hpp"

namespace pagedattn::fuzz {

const char* misaligned_stride(int rows, std::int64_t row, std::int64_t q_stride, DType q_dtype,
                              std::int64_t out_stride) {
  if (rows < 2) return nullptr;  // the stride of a single row is never used
  const std::int64_t q_bytes =
      (q_stride ? q_stride : row) * static_cast<std::int64_t>(dtype_size(q_dtype));
  if (q_bytes % 16 != 0) return "q_row_stride";
  if ((out_stride ? out_stride : row) % 2 != 0) return "out_row_stride";
  return nullptr;
}

const char* misaligned_kv(const CacheLayout& l, DType kv_dtype) {
  const std::int64_t elem = static_cast<std::int64_t>(dtype_size(kv_dtype));
  if (l.block_stride * elem % 16 != 0) return "kv_strides.block";
  if (l.head_stride * elem % 16 != 0) return "kv_strides.head";
  if (l.token_stride * elem % 16 != 0) return "kv_strides.token";
  return nullptr;
}

}  // namespace pagedattn::fuzz
