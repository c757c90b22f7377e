// The tolerance policy: how far a backend's out and lse may be from the f64 reference. Every
// check against the reference (tests, fuzzer, benchmark, demo, simulator) takes its bounds from
// here.
//
// The reference reads the same rounded inputs, so the error is f32 arithmetic (about 1e-6 of the
// output scale) plus the final rounding to the output dtype: half an ulp, 2^-11 of |out| for f16
// and 2^-8 for bf16, doubled for headroom. With a bf16 out the CUDA tensor cores and the CPU's
// AVX-512 BF16 kernel also round the softmax weights to bf16 for P.V (2^-9 of each weight, the
// errors of many tokens averaging out), inside the same bf16 bound.
#pragma once

#include "pagedattn/dtype.hpp"

namespace pagedattn::testing {

// Bound on |out - ref| / max|ref out| for an output dtype.
inline double out_tolerance(DType out_dtype) {
  switch (out_dtype) {
    case DType::kF32:
      return 2e-5;
    case DType::kF16:
      return 1e-3;
    case DType::kBF16:
      return 8e-3;
  }
  return 0;
}

// Bound on |lse - ref lse|: lse is computed and stored in f32, m + log(l) with l summed in f32.
inline double lse_tolerance() { return 1e-4; }

}  // namespace pagedattn::testing
