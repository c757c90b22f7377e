// Host-buffer round trip through the CUDA backend: device copies of every input (and of the
// poisoned out/lse, so an unwritten element shows), decode on the caller's stream, copies back.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "device_roundtrip.hpp"
#include "pagedattn/cache_layout.hpp"
#include "pagedattn/detail/dispatch.hpp"
#include "pagedattn/validate.hpp"

namespace pagedattn::testkit {
namespace {

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    fail(ErrorCode::kDeviceError, what, cudaGetErrorName(err), cudaGetErrorString(err));
  }
}

// One device allocation, freed on scope exit (also when decode throws).
struct DeviceBuffer {
  void* ptr = nullptr;
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr != nullptr) cudaFree(ptr);
  }
  void* upload(const void* host, std::size_t bytes, cudaStream_t stream) {
    check(cudaMalloc(&ptr, bytes == 0 ? 16 : bytes), "cudaMalloc");
    if (host != nullptr && bytes > 0) {
      check(cudaMemcpyAsync(ptr, host, bytes, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync");
    }
    return ptr;
  }
};

}  // namespace

void cuda_decode_from_host(const DecodeArgs& host, const detail::DecodeOptions& options) {
  validate_shapes(host);
  if (host.batch == 0) return;
  detail::DecodeOptions o = options;
  o.backend = Backend::kCuda;
  cudaStream_t stream = static_cast<cudaStream_t>(o.cuda_stream);
  const CacheLayout layout =
      CacheLayout::dense(host.num_blocks, host.num_kv_heads, host.block_size, host.head_dim);
  const std::size_t qo_elems =
      static_cast<std::size_t>(host.batch) * host.num_heads * host.head_dim;
  const std::size_t cache_elems = static_cast<std::size_t>(layout.elements());
  const std::size_t table_elems =
      static_cast<std::size_t>(host.batch - 1) * host.table_stride() + host.max_blocks_per_seq;
  const std::size_t lse_elems = static_cast<std::size_t>(host.batch) * host.num_heads;
  DeviceBuffer q, k, v, table, lens, out, lse;
  DecodeArgs dev = host;
  dev.q = q.upload(host.q, qo_elems * dtype_size(host.q_dtype), stream);
  dev.k_cache = k.upload(host.k_cache, cache_elems * dtype_size(host.k_dtype), stream);
  dev.v_cache = v.upload(host.v_cache, cache_elems * dtype_size(host.v_dtype), stream);
  dev.block_table = static_cast<const std::int32_t*>(
      table.upload(host.block_table, table_elems * sizeof(std::int32_t), stream));
  dev.context_lens = static_cast<const std::int32_t*>(
      lens.upload(host.context_lens, host.batch * sizeof(std::int32_t), stream));
  const std::size_t out_bytes = qo_elems * dtype_size(host.out_dtype);
  dev.out = out.upload(host.out, out_bytes, stream);  // carries the caller's poison
  dev.lse = host.lse ? static_cast<float*>(lse.upload(host.lse, lse_elems * sizeof(float), stream))
                     : nullptr;
  detail::decode(dev, o);
  check(cudaMemcpyAsync(host.out, dev.out, out_bytes, cudaMemcpyDeviceToHost, stream),
        "cudaMemcpyAsync(out)");
  if (host.lse != nullptr) {
    check(cudaMemcpyAsync(host.lse, dev.lse, lse_elems * sizeof(float), cudaMemcpyDeviceToHost,
                          stream),
          "cudaMemcpyAsync(lse)");
  }
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

}  // namespace pagedattn::testkit
