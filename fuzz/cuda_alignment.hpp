// What the CUDA backend refuses that the CPU backend takes: it reads q and cache rows in 16-byte
// pieces and stores out two elements at a time, so q's row stride and every cache stride must be
// a multiple of 16 bytes and out's row stride even.
#pragma once

#include <cstdint>

#include "pagedattn/cache_layout.hpp"
#include "pagedattn/pagedattn.hpp"

namespace pagedattn::fuzz {

// The stride field refused for `rows` rows of `row` elements ("q_row_stride" first, then
// "out_row_stride"; a stride of 0 is the dense row), or null. A single row's stride is never used.
const char* misaligned_stride(int rows, std::int64_t row, std::int64_t q_stride, DType q_dtype,
                              std::int64_t out_stride);

// The kv_strides field refused among `l`'s strides (checked block, head, token), or null.
const char* misaligned_kv(const CacheLayout& l, DType kv_dtype);

}  // namespace pagedattn::fuzz
