// Decode on the CUDA backend over host buffers, for tools and tests that build their cases on the
// host: device copies of every input (and of out and lse, so an unwritten element shows), decode,
// copies of out and lse back. Built from src/device_case.cu with the CUDA backend, from
// src/cuda_unavailable.cpp without (everything throws kBackendUnavailable).
#pragma once

#include <cstddef>

#include "pagedattn/detail/backends.hpp"
#include "pagedattn/pagedattn.hpp"
#include "pagedattn/testing/device_memory.hpp"

namespace pagedattn::testing {

// Device copies of the buffers a host DecodeArgs points at, freed on destruction.
class DeviceCase {
 public:
  // Copies every buffer of `host` (lse when not null) on `stream` (a cudaStream_t; null: the
  // default stream) and waits for the copies.
  explicit DeviceCase(const DecodeArgs& host, void* stream = nullptr);
  // `host` over the device copies.
  const DecodeArgs& args() const { return args_; }
  // Copies out (and lse, when both have one) back into `host`'s buffers on `stream` and waits.
  void download(const DecodeArgs& host, void* stream = nullptr) const;

 private:
  DeviceBuffer q_, k_, v_, table_, lens_, indptr_, out_, lse_, slopes_, sinks_, k_scales_,
      v_scales_, k_token_scales_, v_token_scales_, tree_mask_, tree_indptr_;
  DecodeArgs args_;
  std::size_t out_bytes_ = 0, lse_bytes_ = 0;
};

// Runs decode over `host` (host memory) on the CUDA backend through a DeviceCase, on
// options.cuda_stream; options.backend is ignored (always CUDA).
void cuda_decode_from_host(const DecodeArgs& host, const detail::DecodeOptions& options);

}  // namespace pagedattn::testing
