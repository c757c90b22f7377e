// The library's CUDA error check for code outside the backend (pagedattn/detail/cuda_status.hpp):
// with the backend, a failed status is a kDeviceError naming the call and the CUDA error, as
// inside the backend; without it, every call is kBackendUnavailable. No GPU needed.
#include <gtest/gtest.h>

#include <string>

#include "pagedattn/detail/cuda_status.hpp"
#include "pagedattn/error.hpp"

#if PAGEDATTN_TESTS_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace pagedattn {
namespace {

#if PAGEDATTN_TESTS_WITH_CUDA

TEST(CudaStatus, SuccessPasses) {
  EXPECT_NO_THROW(detail::check_cuda_status(static_cast<int>(cudaSuccess), "cudaMalloc"));
}

TEST(CudaStatus, FailureNamesTheCallAndTheError) {
  try {
    detail::check_cuda_status(static_cast<int>(cudaErrorMemoryAllocation), "cudaMalloc(cache)");
    FAIL() << "no error thrown";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kDeviceError);
    const std::string what = e.what();
    EXPECT_NE(what.find("cudaMalloc(cache)"), std::string::npos) << what;
    EXPECT_NE(what.find("cudaErrorMemoryAllocation"), std::string::npos) << what;
  }
}

#else

TEST(CudaStatus, UnavailableWithoutTheBackend) {
  try {
    detail::check_cuda_status(0, "cudaMalloc");
    FAIL() << "no error thrown";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kBackendUnavailable);
  }
}

#endif

}  // namespace
}  // namespace pagedattn
