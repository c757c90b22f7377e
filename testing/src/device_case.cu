// Host-buffer round trip through the CUDA backend: device copies of every input (the variants'
// per-head slopes and sinks included, and of the
// poisoned out/lse, so an unwritten element shows), decode on the caller's stream, copies back.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "pagedattn/cache_layout.hpp"
#include "pagedattn/detail/dispatch.hpp"
#include "pagedattn/testing/cuda_check.hpp"
#include "pagedattn/testing/device_case.hpp"
#include "pagedattn/tree_mask.hpp"
#include "pagedattn/validate.hpp"

namespace pagedattn::testing {
namespace {

// A device buffer of `bytes` holding a copy of `host` (when not null), copied on `stream`.
DeviceBuffer upload(const void* host, std::size_t bytes, cudaStream_t stream) {
  DeviceBuffer d(bytes);
  if (host != nullptr && bytes > 0) {
    check_cuda(cudaMemcpyAsync(d.get(), host, bytes, cudaMemcpyHostToDevice, stream),
               "cudaMemcpyAsync");
  }
  return d;
}

}  // namespace

DeviceCase::DeviceCase(const DecodeArgs& host, void* stream_ptr) : args_(host) {
  validate_shapes(host);
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  const CacheLayout layout =
      CacheLayout::dense(host.num_blocks, host.num_kv_heads, host.block_size, host.head_dim);
  // Rows of q, out and lse: batch, or num_q_tokens with q_indptr (dense rows).
  const std::size_t rows = static_cast<std::size_t>(host.q_rows());
  const std::size_t qo_elems = rows * host.num_heads * host.head_dim;
  const std::size_t cache_elems = static_cast<std::size_t>(layout.elements());
  const std::size_t table_elems =
      host.batch == 0 ? 0
                      : static_cast<std::size_t>(host.batch - 1) * host.table_stride() +
                            host.max_blocks_per_seq;
  out_bytes_ = qo_elems * dtype_size(host.out_dtype);
  lse_bytes_ = host.lse ? rows * host.num_heads * sizeof(float) : 0;
  q_ = upload(host.q, qo_elems * dtype_size(host.q_dtype), stream);
  k_ = upload(host.k_cache, cache_elems * dtype_size(host.k_dtype), stream);
  v_ = upload(host.v_cache, cache_elems * dtype_size(host.v_dtype), stream);
  table_ = upload(host.block_table, table_elems * sizeof(std::int32_t), stream);
  lens_ = upload(host.context_lens, host.batch * sizeof(std::int32_t), stream);
  if (host.q_indptr) {
    indptr_ = upload(host.q_indptr, (host.batch + 1) * sizeof(std::int32_t), stream);
  }
  // A tree mask's offsets, and the bytes its masks take.
  if (host.tree_mask_indptr) {
    tree_indptr_ = upload(host.tree_mask_indptr, (host.batch + 1) * sizeof(std::int32_t), stream);
  }
  if (host.tree_mask && host.tree_mask_indptr && host.q_indptr) {
    const std::int64_t bytes =
        tree_mask_bytes_read(host.batch, host.q_indptr, host.tree_mask_indptr);
    // A pointer to one unread byte where the masks take none.
    tree_mask_ = upload(bytes > 0 ? host.tree_mask : nullptr,
                        static_cast<std::size_t>(std::max<std::int64_t>(bytes, 1)), stream);
  }
  out_ = upload(host.out, out_bytes_, stream);  // carries the caller's poison
  if (host.lse) lse_ = upload(host.lse, lse_bytes_, stream);
  const std::size_t head_bytes = static_cast<std::size_t>(host.num_heads) * sizeof(float);
  if (host.alibi_slopes) slopes_ = upload(host.alibi_slopes, head_bytes, stream);
  if (host.sinks) sinks_ = upload(host.sinks, head_bytes, stream);
  const std::size_t kv_head_bytes = static_cast<std::size_t>(host.num_kv_heads) * sizeof(float);
  if (host.k_scales) k_scales_ = upload(host.k_scales, kv_head_bytes, stream);
  if (host.v_scales) v_scales_ = upload(host.v_scales, kv_head_bytes, stream);
  const std::size_t token_scale_bytes =
      static_cast<std::size_t>(host.token_scale_layout().elements()) * sizeof(float);
  if (host.k_token_scales) k_token_scales_ = upload(host.k_token_scales, token_scale_bytes, stream);
  if (host.v_token_scales) v_token_scales_ = upload(host.v_token_scales, token_scale_bytes, stream);
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  args_.q = q_.get();
  args_.k_cache = k_.get();
  args_.v_cache = v_.get();
  args_.block_table = table_.as<const std::int32_t>();
  args_.context_lens = lens_.as<const std::int32_t>();
  args_.q_indptr = host.q_indptr ? indptr_.as<const std::int32_t>() : nullptr;
  args_.tree_mask = host.tree_mask ? tree_mask_.as<const std::uint8_t>() : nullptr;
  args_.tree_mask_indptr = host.tree_mask_indptr ? tree_indptr_.as<const std::int32_t>() : nullptr;
  args_.out = out_.get();
  args_.lse = host.lse ? lse_.as<float>() : nullptr;
  args_.alibi_slopes = host.alibi_slopes ? slopes_.as<const float>() : nullptr;
  args_.sinks = host.sinks ? sinks_.as<const float>() : nullptr;
  args_.k_scales = host.k_scales ? k_scales_.as<const float>() : nullptr;
  args_.v_scales = host.v_scales ? v_scales_.as<const float>() : nullptr;
  args_.k_token_scales = host.k_token_scales ? k_token_scales_.as<const float>() : nullptr;
  args_.v_token_scales = host.v_token_scales ? v_token_scales_.as<const float>() : nullptr;
}

void DeviceCase::download(const DecodeArgs& host, void* stream_ptr) const {
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  if (out_bytes_ > 0) {
    check_cuda(cudaMemcpyAsync(host.out, out_.get(), out_bytes_, cudaMemcpyDeviceToHost, stream),
               "cudaMemcpyAsync(out)");
  }
  if (host.lse != nullptr && lse_bytes_ > 0) {
    check_cuda(cudaMemcpyAsync(host.lse, lse_.get(), lse_bytes_, cudaMemcpyDeviceToHost, stream),
               "cudaMemcpyAsync(lse)");
  }
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

void cuda_decode_from_host(const DecodeArgs& host, const detail::DecodeOptions& options) {
  validate_shapes(host);
  if (host.batch == 0) return;
  detail::DecodeOptions o = options;
  o.backend = Backend::kCuda;
  const DeviceCase dev(host, o.cuda_stream);
  detail::decode(dev.args(), o);
  dev.download(host, o.cuda_stream);
}

}  // namespace pagedattn::testing
