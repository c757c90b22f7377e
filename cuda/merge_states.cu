// merge_states on CUDA: one thread per output element; each folds the row's segment states in
// segment order (SoftmaxState::merge, natural log, as the CPU backend does) and its column of the
// parts, then writes out = acc / l; the row's first thread writes lse. The states of a row are
// re-derived by each of its threads (S exponentials per element): the merge moves little data
// next to a decode, and this keeps it one simple, deterministic kernel.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda_error.hpp"
#include "pagedattn/detail/merge_backends.hpp"
#include "pagedattn/dtype.hpp"

namespace pagedattn::detail::cuda {
namespace {

constexpr int kMergeThreads = 256;

template <typename Part, typename Out>
__global__ void __launch_bounds__(kMergeThreads)
    merge_kernel(const Part* parts, const float* part_lse, Out* out, float* lse, int S,
                 std::int64_t R, int D, SegmentStrides strides) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * kMergeThreads + threadIdx.x;
  if (i >= R * D) return;
  const std::int64_t r = i / D;
  const int d = static_cast<int>(i - r * D);
  SoftmaxState st = SoftmaxState::empty();
  float acc = 0.f;
  for (int s = 0; s < S; ++s) {
    float fa = 0.f, fb = 0.f;
    if (!st.merge(segment_state(part_lse[s * strides.lse + r]), fa, fb)) continue;
    acc = acc * fa + to_float(parts[s * strides.parts + r * D + d]) * fb;
  }
  out[i] = from_float<Out>(acc * st.inv_sum());
  if (lse != nullptr && d == 0) lse[r] = st.lse();
}

template <typename Part, typename Out>
void launch(const MergeStatesArgs& a, const SegmentStrides& strides, cudaStream_t stream) {
  const std::int64_t n = static_cast<std::int64_t>(a.num_rows) * a.head_dim;
  const std::int64_t blocks = (n + kMergeThreads - 1) / kMergeThreads;
  if (blocks > INT32_MAX) {
    fail(ErrorCode::kUnsupported, "num_rows", a.num_rows, "too many elements for one launch");
  }
  merge_kernel<Part, Out><<<static_cast<unsigned>(blocks), kMergeThreads, 0, stream>>>(
      static_cast<const Part*>(a.parts), a.part_lse, static_cast<Out*>(a.out), a.lse,
      a.num_segments, a.num_rows, a.head_dim, strides);
  check(cudaGetLastError(), "merge_states kernel launch");
}

template <typename Part>
void launch_to(const MergeStatesArgs& a, const SegmentStrides& strides, cudaStream_t stream) {
  switch (a.out_dtype) {
    case DType::kF32:
      return launch<Part, float>(a, strides, stream);
    case DType::kF16:
      return launch<Part, f16_t>(a, strides, stream);
    case DType::kBF16:
      return launch<Part, bf16_t>(a, strides, stream);
  }
}

}  // namespace

void merge_states(const MergeStatesArgs& a, const SegmentStrides& strides,
                  const MergeStatesOptions& o) {
  const auto stream = static_cast<cudaStream_t>(o.cuda_stream);
  switch (a.part_dtype) {
    case DType::kF32:
      return launch_to<float>(a, strides, stream);
    case DType::kF16:
      return launch_to<f16_t>(a, strides, stream);
    case DType::kBF16:
      return launch_to<bf16_t>(a, strides, stream);
  }
}

}  // namespace pagedattn::detail::cuda
