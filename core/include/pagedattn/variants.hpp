// The attention variants of DecodeArgs (window_left, logits_soft_cap, alibi_slopes, sinks): the
// one definition of which tokens a query attends to and what happens to a logit on its way to the
// softmax, shared by the f64 reference, the CPU backend and the CUDA kernels. docs/variants.md
// has the definitions; in short, for the query at position L - 1 of a context of L tokens:
//
//   attended tokens  t in [window_first_token(L, window_left), L)
//   logit            s_t = scale * dot(q, k_t)
//                    s_t = cap * tanh(s_t / cap)              when logits_soft_cap = cap > 0
//                    s_t = s_t + slope_h * (t - (L - 1))      with alibi_slopes
//   softmax          over the attended logits plus, with sinks, one more logit sink_h that adds
//                    exp(sink_h) to the denominator and nothing to the numerator
#pragma once

#include <cmath>

#include "pagedattn/host_device.hpp"
#include "pagedattn/online_softmax.hpp"

namespace pagedattn {

// log2(e): the CUDA kernels keep logits in log2 units (s * log2(e)).
constexpr float kLog2e = 1.4426950408889634f;

// The first token the last query of a context of `len` tokens attends to: the last
// window_left + 1 tokens when window_left >= 0, every token when it is -1.
PAGEDATTN_HOST_DEVICE int window_first_token(int len, int window_left) {
  return window_left >= 0 && len - 1 - window_left > 0 ? len - 1 - window_left : 0;
}

// The first token any of a sequence's q_len query tokens attends to (the earliest query sits at
// len - q_len; pagedattn.hpp, DecodeArgs::q_indptr), for q_len >= 1: with one query token,
// window_first_token(len, window_left).
PAGEDATTN_HOST_DEVICE int queries_first_token(int len, int q_len, int window_left) {
  // Clamped at 0 first (more query tokens than len + 1: the earliest attend nothing), so that
  // len - 1 - window_left cannot overflow for a window_left near INT_MAX.
  const int earliest_len = len - q_len + 1;
  return window_first_token(earliest_len > 0 ? earliest_len : 0, window_left);
}

// The first logical block holding an attended token. Blocks before it, and their table
// entries, are never read.
PAGEDATTN_HOST_DEVICE int window_first_block(int len, int window_left, int block_size) {
  return window_first_token(len, window_left) / block_size;
}

// cap * tanh(s / cap) in double (the reference).
inline double soft_cap(double s, double cap) { return cap * std::tanh(s / cap); }

// The same in log2 units, where s2 = s * log2(e) and cap2 = cap * log2(e): cap2 * tanh(s2 / cap2),
// computed as cap2 - 2 cap2 / (exp(2 s2 / cap2) + 1) with k = soft_cap_exp2_scale(cap2), so
// exp(2 s2 / cap2) = exp2(k s2). Its error is absolute (about 1e-7 of the cap, what a logit's own
// rounding is) rather than relative near 0; the softmax depends on logit differences only, so an
// absolute error is what counts. On the device the division is the approximate one (2 ulp; 0
// once e + 1 passes 2^126, where the exact quotient is below 2^-125 of the cap anyway).
PAGEDATTN_HOST_DEVICE float soft_cap_exp2_scale(float cap2) { return 2.f * kLog2e / cap2; }
PAGEDATTN_HOST_DEVICE float soft_cap_log2(float s2, float cap2, float k) {
  const float e = Log2Exp::exp(k * s2);
#if defined(__CUDA_ARCH__)
  return cap2 - __fdividef(2.f * cap2, e + 1.f);
#else
  return cap2 - 2.f * cap2 / (e + 1.f);
#endif
}

// Folds a sink logit (in Base's units; -inf for none) into a finished state: the state gains
// exp(sink - m) in its sum and nothing in its accumulator. Returns the factor the accumulator
// must be multiplied by (1 when the sink changes nothing).
template <class Base>
PAGEDATTN_HOST_DEVICE float add_sink(OnlineSoftmax<Base>& st, float sink) {
  float fa = 1.f, fb = 0.f;
  if (!st.merge(OnlineSoftmax<Base>{sink, 1.f}, fa, fb)) return 1.f;
  return fa;
}

}  // namespace pagedattn
