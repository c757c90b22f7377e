// What the fp8 and int4 CPU kernel tests share: one kernel (cpu_kernel.hpp) run over a decode
// case's sequences the way the backend runs them, against the f64 reference.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

#include "cpu_kernel.hpp"
#include "pagedattn/dtype.hpp"
#include "pagedattn/online_softmax.hpp"
#include "pagedattn/reference.hpp"
#include "pagedattn/split_plan.hpp"
#include "pagedattn/testing/tolerance.hpp"

namespace pagedattn {

// a's q rows in f32 as the backend hands them to a kernel: x the softmax scale x the head's K
// scale, [batch][num_heads][head_dim].
inline std::vector<float> kernel_q(const DecodeArgs& a) {
  const int H = a.num_heads, G = a.group_size(), D = a.head_dim;
  std::vector<float> q(static_cast<std::size_t>(a.batch) * H * D);
  for (int b = 0; b < a.batch; ++b) {
    for (int h = 0; h < H; ++h) {
      for (int d = 0; d < D; ++d) {
        const std::size_t i = (static_cast<std::size_t>(b) * H + h) * D + d;
        q[i] = load_as_float(a.q, a.q_dtype, b * a.q_stride() + h * D + d) *
               (a.effective_scale() * head_scale(a.k_scale, a.k_scales, h / G));
      }
    }
  }
  return q;
}

// How far a kernel's result is from the reference: out as max |error| / max |out|, lse as max
// |error|; finite is false where an out value is not.
struct KernelErrors {
  bool finite = true;
  double out = 0;
  double lse = 0;
};

// Runs fn over every sequence of `a` (its kv heads as one task, with the q buffer and, where the
// context dequantizes, the rows buffer, as the backend runs them) on q from kernel_q, the P.V
// weights rounded to bf16 where asked; finishes each head as the backend does (x V scale).
inline KernelErrors kernel_errors(detail::cpu::KernelFn fn, const DecodeArgs& a,
                                  const std::vector<float>& q, bool bf16_weights) {
  const int H = a.num_heads, G = a.group_size(), KV = a.num_kv_heads, D = a.head_dim;
  detail::cpu::ItemContext ctx = detail::cpu::item_context(a, q.data());
  ctx.bf16_weights = bf16_weights;
  alignas(64) float scores[detail::cpu::kHeadTile * 256];
  std::vector<float> q_buffer(static_cast<std::size_t>(H) * D + 16);
  std::vector<float> rows(static_cast<std::size_t>(2) * a.block_size * D);
  std::vector<float> m(H), l(H), acc(static_cast<std::size_t>(H) * D);
  const ReferenceResult ref = reference_decode(a);
  double scale = 1e-30, err = 0;
  KernelErrors e;
  for (int b = 0; b < a.batch; ++b) {
    const WorkItem item{b, 0, 0, 0, blocks_for(a.context_lens[b], a.block_size)};
    fn(ctx, item, KV, m.data(), l.data(), acc.data(),
       detail::cpu::ItemScratch{scores, q_buffer.data(),
                                ctx.dequantizes() ? rows.data() : nullptr});
    for (int h = 0; h < H; ++h) {
      const std::size_t row = static_cast<std::size_t>(b) * H + h;
      const SoftmaxState st{m[h], l[h]};
      const float inv = st.inv_sum() * head_scale(a.v_scale, a.v_scales, h / G);
      for (int d = 0; d < D; ++d) {
        const double want = ref.out[row * D + d];
        const float got = acc[static_cast<std::size_t>(h) * D + d] * inv;
        e.finite = e.finite && std::isfinite(got);
        scale = std::max(scale, std::fabs(want));
        err = std::max(err, std::fabs(got - want));
      }
      e.lse = std::max(e.lse, std::fabs(st.lse() - ref.lse[row]));
    }
  }
  e.out = err / scale;
  return e;
}

// fn against the reference on `a`: with the P.V weights in f32, at the f32 out tolerance, and
// rounded to bf16, at bf16_weights_out's; a failure names isa and `what`.
inline void expect_kernel_matches_reference(detail::cpu::KernelFn fn, const DecodeArgs& a,
                                            const char* isa, const std::string& what,
                                            DType bf16_weights_out) {
  const std::vector<float> q = kernel_q(a);
  for (bool bf16_weights : {false, true}) {
    const KernelErrors e = kernel_errors(fn, a, q, bf16_weights);
    SCOPED_TRACE(std::string(isa) + (bf16_weights ? " bf16 weights: " : ": ") + what);
    EXPECT_TRUE(e.finite);
    EXPECT_LE(e.out, testing::out_tolerance(bf16_weights ? bf16_weights_out : DType::kF32));
    EXPECT_LE(e.lse, testing::lse_tolerance());
  }
}

}  // namespace pagedattn
