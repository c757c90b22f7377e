// The online-softmax state of one query head: running max m, running sum l = sum exp(s - m), and
// the accumulator acc = sum exp(s - m) * v (held by the caller, head_dim floats).
//
// See docs/online_softmax.md for the math. The empty state is (m = -inf, l = 0, acc = 0). Every
// operation guards against exp(-inf - -inf) so that empty states never produce NaN.
#pragma once

#include <cmath>

#include "pagedattn/host_device.hpp"

namespace pagedattn {

struct SoftmaxState {
  float m;  // max logit seen so far (-inf when empty)
  float l;  // sum of exp(s - m) over the logits seen

  static PAGEDATTN_HOST_DEVICE SoftmaxState empty() { return SoftmaxState{-INFINITY, 0.f}; }
  PAGEDATTN_HOST_DEVICE bool is_empty() const { return l == 0.f; }
};

// exp(a - b), defined as 0 when a is -inf (so -inf - -inf never reaches exp).
PAGEDATTN_HOST_DEVICE float exp_diff(float a, float b) {
  return a == -INFINITY ? 0.f : expf(a - b);
}

// Folds n logits s[0..n) into the state. On return p[i] = exp(s[i] - m_new) and the returned
// alpha = exp(m_old - m_new) is the factor the caller applies to acc before adding sum p[i] v_i.
// Logits of -inf (masked tokens) get weight 0. p may alias s.
PAGEDATTN_HOST_DEVICE float softmax_update(SoftmaxState& st, const float* s, float* p, int n) {
  float m_new = st.m;
  for (int i = 0; i < n; ++i) m_new = s[i] > m_new ? s[i] : m_new;
  if (m_new == -INFINITY) {  // nothing but masked logits: state unchanged
    for (int i = 0; i < n; ++i) p[i] = 0.f;
    return 1.f;
  }
  const float alpha = exp_diff(st.m, m_new);
  float sum = 0.f;
  for (int i = 0; i < n; ++i) {
    p[i] = exp_diff(s[i], m_new);
    sum += p[i];
  }
  st.l = st.l * alpha + sum;
  st.m = m_new;
  return alpha;
}

// Merges state b (with accumulator acc_b) into a (acc_a), over d elements. Associative and
// commutative up to rounding; the empty state is the identity and two empty states stay empty.
PAGEDATTN_HOST_DEVICE void softmax_merge(SoftmaxState& a, float* acc_a, const SoftmaxState& b,
                                         const float* acc_b, int d) {
  const float m = a.m > b.m ? a.m : b.m;
  if (m == -INFINITY) return;  // both empty
  const float fa = exp_diff(a.m, m);
  const float fb = exp_diff(b.m, m);
  for (int i = 0; i < d; ++i) acc_a[i] = acc_a[i] * fa + acc_b[i] * fb;
  a.l = a.l * fa + b.l * fb;
  a.m = m;
}

// 1 / l for the final normalization, 0 for the empty state (so out = 0 rather than NaN).
PAGEDATTN_HOST_DEVICE float softmax_inv_sum(const SoftmaxState& st) {
  return st.l > 0.f ? 1.f / st.l : 0.f;
}

// Natural-log sum of exp over every logit seen: m + log(l); -inf for the empty state.
PAGEDATTN_HOST_DEVICE float softmax_lse(const SoftmaxState& st) {
  return st.l > 0.f ? st.m + logf(st.l) : -INFINITY;
}

// Writes out = acc / l (0 when empty) and returns the lse.
PAGEDATTN_HOST_DEVICE float softmax_finalize(const SoftmaxState& st, const float* acc, float* out,
                                             int d) {
  const float inv = softmax_inv_sum(st);
  for (int i = 0; i < d; ++i) out[i] = acc[i] * inv;
  return softmax_lse(st);
}

}  // namespace pagedattn
