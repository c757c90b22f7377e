// Linked when the library is built without the CUDA backend (PAGEDATTN_CUDA=OFF or no nvcc).
#include "pagedattn/detail/backends.hpp"

namespace pagedattn::detail::cuda {

bool available(std::string* why) {
  if (why)
    *why = "this build of pagedattn has no CUDA backend (configure with -DPAGEDATTN_CUDA=ON)";
  return false;
}

namespace {
[[noreturn]] void unavailable() {
  fail(ErrorCode::kBackendUnavailable, "backend", "cuda",
       "unavailable: this build of pagedattn has no CUDA backend");
}
}  // namespace

void decode(const DecodeArgs&, const DecodeOptions&) { unavailable(); }

void check_launch(const DecodeArgs&, const pagedattn::DecodeOptions&) { unavailable(); }

void mla_decode(const MlaDecodeArgs&, const DecodeOptions&) { unavailable(); }

void check_mla_launch(const MlaDecodeArgs&, const pagedattn::DecodeOptions&) { unavailable(); }

SplitChoice split_choice(const DecodeArgs&) { unavailable(); }

std::shared_ptr<void> stream_scratch(std::size_t, void*) { unavailable(); }

void copy_and_wait(void*, const void*, std::size_t, void*) { unavailable(); }

}  // namespace pagedattn::detail::cuda

namespace pagedattn {

std::size_t cuda_workspace_size(const DecodeArgs&) { return 0; }
std::size_t cuda_workspace_size(const DecodeArgs&, const DecodeOptions&) { return 0; }
std::size_t cuda_mla_workspace_size(const MlaDecodeArgs&, const DecodeOptions&) { return 0; }

}  // namespace pagedattn
