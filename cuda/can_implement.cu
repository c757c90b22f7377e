// What the CUDA backend refuses before any launch (decode_steps.hpp, can_implement): a head dim
// it has no kernel for (512, not there yet), pointers and row strides the kernels' 16-byte reads
// and paired stores cannot take, a cache layout beyond 32-bit row indices, a kernel that does not
// fit on the device and, in checked mode, bad device tables. Each is an error naming the argument
// and its value; nothing is launched then.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>
#include <utility>

#include "decode_steps.hpp"
#include "pagedattn/validate.hpp"

namespace pagedattn::detail::cuda {
namespace {

void require_aligned(const char* name, const void* ptr, int bytes = 16) {
  if (reinterpret_cast<std::uintptr_t>(ptr) % bytes != 0) {
    fail(ErrorCode::kInvalidArgument, name, ptr,
         "must be " + std::to_string(bytes) + "-byte aligned for the CUDA backend");
  }
}

// Every row of q is read in 16-byte pieces (like q itself, 16-byte aligned), and out is stored
// two elements at a time (store_out_pair), so its rows start at even elements (out itself
// aligned to two elements). A single row's stride is never used.
void require_row_strides(const DecodeArgs& a) {
  if (a.q_rows() > 1) {
    const std::int64_t q_bytes = a.q_stride() * static_cast<std::int64_t>(dtype_size(a.q_dtype));
    if (q_bytes % 16 != 0) {
      fail(ErrorCode::kInvalidArgument, "q_row_stride", a.q_row_stride,
           "must make each row of q start 16-byte aligned for the CUDA backend (" +
               std::to_string(q_bytes) + " bytes between rows)");
    }
    if (a.out_stride() % 2 != 0) {
      fail(ErrorCode::kInvalidArgument, "out_row_stride", a.out_row_stride,
           "must be even for the CUDA backend (rows of out are stored two elements at a time)");
    }
  }
  const std::size_t pair_bytes = 2 * dtype_size(a.out_dtype);
  if (reinterpret_cast<std::uintptr_t>(a.out) % pair_bytes != 0) {
    fail(ErrorCode::kInvalidArgument, "out", a.out,
         "must be aligned to two elements (" + std::to_string(pair_bytes) +
             " bytes) for the CUDA backend");
  }
}

// The layout in 32-bit row units (RowUnits), or an error naming the field at fault.
RowUnits row_units(const DecodeArgs& a) {
  const CacheLayout l = a.cache_layout();
  const std::int64_t elem = static_cast<std::int64_t>(dtype_size(a.k_dtype));
  const std::pair<const char*, std::int64_t> strides[] = {{"kv_strides.block", l.block_stride},
                                                          {"kv_strides.head", l.head_stride},
                                                          {"kv_strides.token", l.token_stride}};
  for (const auto& [name, stride] : strides) {
    if (stride * elem % 16 != 0) {
      fail(ErrorCode::kInvalidArgument, name, stride,
           "must be a multiple of 16 bytes for the CUDA backend (" + std::to_string(stride * elem) +
               " bytes)");
    }
  }
  const std::int64_t unit = std::gcd(l.block_stride, l.token_stride) * elem;
  const std::int64_t block_units = l.block_stride * elem / unit;
  const std::int64_t token_units = l.token_stride * elem / unit;
  const long double last = static_cast<long double>(std::max(a.num_blocks - 1, 0)) * block_units +
                           static_cast<long double>(a.block_size - 1) * token_units;
  if (unit > INT32_MAX || block_units > INT32_MAX || last > INT32_MAX) {
    fail(ErrorCode::kUnsupported, "num_blocks", a.num_blocks,
         "the CUDA backend addresses a kv head's rows with 32-bit indices: num_blocks * "
         "kv_strides.block / gcd(kv_strides.block, kv_strides.token) must stay below 2^31");
  }
  return {static_cast<int>(block_units), static_cast<int>(token_units), static_cast<int>(unit),
          l.head_stride * elem};
}

}  // namespace

RowUnits can_implement(const DecodeArgs& a, const pagedattn::DecodeOptions& options) {
  require_cuda_head_dim(a.head_dim);  // no kernel at all (dispatch refuses it first)
  require_cuda_cache_dtype("k_dtype", a.k_dtype);
  require_aligned("q", a.q);
  require_aligned("k_cache", a.k_cache);
  require_aligned("v_cache", a.v_cache);
  if (a.has_token_scales()) {  // copied a float at a time (kv_pipeline.cuh)
    require_aligned("k_token_scales", a.k_token_scales, 4);
    require_aligned("v_token_scales", a.v_token_scales, 4);
  }
  if (options.workspace != nullptr) require_aligned("workspace", options.workspace);
  require_row_strides(a);
  const RowUnits units = row_units(a);
  // A kernel that does not fit on this device: an error naming head_dim.
  split_kernel_for(a, options.batch_invariant);
  if (options.cuda_checked) check_device_tables(a, static_cast<cudaStream_t>(options.cuda_stream));
  return units;
}

void check_launch(const DecodeArgs& a, const pagedattn::DecodeOptions& options) {
  can_implement(a, options);
}

}  // namespace pagedattn::detail::cuda
