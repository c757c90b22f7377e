// merge_states on the CPU: OpenMP over rows; each row folds its segments' states in segment order
// into one (SoftmaxState::merge, the same operations as the decode's combine) over an f32
// accumulator, then writes out = acc / l and lse.
#include <omp.h>

#include <cstdint>
#include <vector>

#include "pagedattn/detail/merge_backends.hpp"
#include "pagedattn/dtype.hpp"
#include "work_threads.hpp"

namespace pagedattn::detail::cpu {
namespace {

template <typename Part, typename Out>
void merge_typed(const MergeStatesArgs& a, const SegmentStrides& strides,
                 const MergeStatesOptions& o) {
  const int S = a.num_segments, D = a.head_dim;
  const std::int64_t R = a.num_rows;
  const auto* parts = static_cast<const Part*>(a.parts);
  auto* out = static_cast<Out*>(a.out);
  const std::int64_t bytes = R * D * (static_cast<std::int64_t>(S) * sizeof(Part) + sizeof(Out));
  const int threads =
      threads_for_work(o.num_threads > 0 ? o.num_threads : omp_get_max_threads(), bytes);
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    std::vector<float> acc(D);
#pragma omp for schedule(static)
    for (std::int64_t r = 0; r < R; ++r) {
      SoftmaxState st = SoftmaxState::empty();
      for (int d = 0; d < D; ++d) acc[d] = 0.f;
      for (int s = 0; s < S; ++s) {
        float fa = 0.f, fb = 0.f;
        if (!st.merge(segment_state(a.part_lse[s * strides.lse + r]), fa, fb)) continue;
        const Part* p = parts + s * strides.parts + r * D;
        for (int d = 0; d < D; ++d) acc[d] = acc[d] * fa + to_float(p[d]) * fb;
      }
      const float inv = st.inv_sum();
      for (int d = 0; d < D; ++d) out[r * D + d] = from_float<Out>(acc[d] * inv);
      if (a.lse != nullptr) a.lse[r] = st.lse();
    }
  }
}

template <typename Part>
void merge_to(const MergeStatesArgs& a, const SegmentStrides& st, const MergeStatesOptions& o) {
  switch (a.out_dtype) {
    case DType::kF32:
      return merge_typed<Part, float>(a, st, o);
    case DType::kF16:
      return merge_typed<Part, f16_t>(a, st, o);
    case DType::kBF16:
      return merge_typed<Part, bf16_t>(a, st, o);
  }
}

}  // namespace

void merge_states(const MergeStatesArgs& a, const SegmentStrides& st, const MergeStatesOptions& o) {
  switch (a.part_dtype) {
    case DType::kF32:
      return merge_to<float>(a, st, o);
    case DType::kF16:
      return merge_to<f16_t>(a, st, o);
    case DType::kBF16:
      return merge_to<bf16_t>(a, st, o);
  }
}

}  // namespace pagedattn::detail::cpu
