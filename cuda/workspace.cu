// Stream-ordered workspace from a library-owned memory pool per device (workspace.hpp).
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "cuda_error.hpp"
#include "pagedattn/detail/backends.hpp"
#include "workspace.hpp"

namespace pagedattn::detail::cuda {
namespace {

// The pool of the current device, created on first use. Its release threshold is unbounded:
// memory freed back to it stays reserved for the next call instead of returning to the driver.
cudaMemPool_t device_pool() {
  int dev = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  static std::mutex mu;
  static std::vector<cudaMemPool_t> pools;
  std::lock_guard<std::mutex> lock(mu);
  if (static_cast<int>(pools.size()) <= dev) pools.resize(dev + 1, nullptr);
  if (pools[dev] == nullptr) {
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = dev;
    cudaMemPool_t pool = nullptr;
    check(cudaMemPoolCreate(&pool, &props), "cudaMemPoolCreate");
    std::uint64_t keep = UINT64_MAX;
    check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep),
          "cudaMemPoolSetAttribute");
    pools[dev] = pool;
  }
  return pools[dev];
}

}  // namespace

StreamWorkspace::StreamWorkspace(std::size_t bytes, cudaStream_t stream) : stream_(stream) {
  check(cudaMallocFromPoolAsync(&ptr_, bytes > 0 ? bytes : 256, device_pool(), stream),
        "cudaMallocFromPoolAsync(workspace)");
}

StreamWorkspace::~StreamWorkspace() {
  // Ordered after every launch enqueued on the stream meanwhile; an error here (a broken
  // context) has already been reported by the launch that caused it.
  if (ptr_ != nullptr && cudaFreeAsync(ptr_, stream_) != cudaSuccess) cudaGetLastError();
}

char* call_workspace(const pagedattn::DecodeOptions& options, std::size_t bytes,
                     cudaStream_t stream, std::optional<StreamWorkspace>* own,
                     const char* size_fn) {
  if (options.workspace == nullptr) {
    own->emplace(bytes, stream);
    return (*own)->get();
  }
  if (options.workspace_bytes < bytes) {
    fail(ErrorCode::kInvalidArgument, "workspace_bytes", options.workspace_bytes,
         std::string("too small: ") + size_fn + " = " + std::to_string(bytes));
  }
  return static_cast<char*>(options.workspace);
}

std::shared_ptr<void> stream_scratch(std::size_t bytes, void* stream) {
  auto* ws = new StreamWorkspace(bytes, static_cast<cudaStream_t>(stream));
  return std::shared_ptr<void>(ws->get(), [ws](void*) { delete ws; });
}

void copy_and_wait(void* dst, const void* src, std::size_t bytes, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s), "cudaMemcpyAsync");
  check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
}

}  // namespace pagedattn::detail::cuda
