// What the tests that need a CUDA device share: the CUDA runtime, where the tests are built with
// it (PAGEDATTN_TESTS_WITH_CUDA, tests/CMakeLists.txt), and a skip where no device is present.
#pragma once

#include <gtest/gtest.h>

#include "pagedattn/pagedattn.hpp"

// The CUDA runtime is linked only when the CUDA backend is built; code that calls it directly
// sits under #if defined(PAGEDATTN_TEST_HAS_CUDA_RUNTIME).
#if defined(PAGEDATTN_TESTS_WITH_CUDA) && PAGEDATTN_TESTS_WITH_CUDA
#include <cuda_runtime.h>

#include "pagedattn/testing/cuda_check.hpp"
#define PAGEDATTN_TEST_HAS_CUDA_RUNTIME 1
#endif

// Ends the test as skipped where no CUDA device is present (a macro: GTEST_SKIP returns).
#define SKIP_WITHOUT_CUDA() \
  if (!::pagedattn::cuda_available()) GTEST_SKIP() << "no CUDA device"
