// The library's own workspace, for decode calls that pass none: a buffer taken from a
// library-owned, stream-ordered memory pool on the call's stream and returned to it on the same
// stream after the launches. Calls on different streams or host threads therefore never share a
// buffer, and a buffer is never reused before the kernels that used it have finished (the pool
// hands it out again only in stream order). The pool keeps its memory between calls, so steady
// state allocates nothing from the driver.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <optional>

#include "pagedattn/pagedattn.hpp"

namespace pagedattn::detail::cuda {

class StreamWorkspace {
 public:
  StreamWorkspace(std::size_t bytes, cudaStream_t stream);
  ~StreamWorkspace();
  StreamWorkspace(const StreamWorkspace&) = delete;
  StreamWorkspace& operator=(const StreamWorkspace&) = delete;
  char* get() const { return static_cast<char*>(ptr_); }

 private:
  void* ptr_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

// A call's workspace of `bytes`: the caller's (options.workspace; workspace_bytes below `bytes`
// is an error naming it and the function `size_fn` that gives the size), or, without one, a
// buffer from the pool held by `own` until the call ends.
char* call_workspace(const pagedattn::DecodeOptions& options, std::size_t bytes,
                     cudaStream_t stream, std::optional<StreamWorkspace>* own, const char* size_fn);

}  // namespace pagedattn::detail::cuda
