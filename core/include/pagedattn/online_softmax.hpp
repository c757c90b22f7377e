// The online-softmax state: the one definition of the running max, the running sum, the rescale
// when the max grows, the merge of two states and the finalization to out and lse. The CPU tile
// kernels and combine fold logits through it in natural-log units (NaturalExp); Log2Exp is the
// same state in the log2 units of the CUDA kernels (so exponentials are one exp2).
//
// One state per query head: m = the largest logit seen, l = sum exp(s - m). The accumulator
// acc = sum exp(s - m) * v (head_dim floats, or a lane's slice of them) is held by the caller,
// who applies the factors these functions return. The empty state is (m = -inf, l = 0, acc = 0);
// no operation ever evaluates exp(-inf - -inf), so empty states never produce NaN.
// docs/online_softmax.md has the math.
#pragma once

#include <cmath>

#include "pagedattn/host_device.hpp"

namespace pagedattn {

// Logits in natural units: weights exp(s - m), lse = m + log(l).
struct NaturalExp {
  static PAGEDATTN_HOST_DEVICE float exp(float x) { return expf(x); }
  static PAGEDATTN_HOST_DEVICE float lse(float m, float l) { return m + logf(l); }
};

// Logits in log2 units (scale * log2(e) folded into q or the scores): weights exp2(s - m), and
// the natural-log lse = (m + log2(l)) * ln(2).
struct Log2Exp {
  // On the device one MUFU.EX2 (ex2.approx.ftz: relative error ~2^-22, results below 2^-126
  // flushed to 0, exp2(-inf) = 0); exp2f there would add a denormal range check around it, three
  // more instructions per weight in the kernels' inner loops.
  static PAGEDATTN_HOST_DEVICE float exp(float x) {
#if defined(__CUDA_ARCH__)
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
#else
    return exp2f(x);
#endif
  }
  static PAGEDATTN_HOST_DEVICE float lse(float m, float l) {
    return (m + log2f(l)) * 0.693147180559945309f;
  }
};

template <class Base>
struct OnlineSoftmax {
  float m;  // largest logit seen (-inf while empty)
  float l;  // sum of Base::exp(s - m) over the logits seen

  static PAGEDATTN_HOST_DEVICE OnlineSoftmax empty() { return OnlineSoftmax{-INFINITY, 0.f}; }
  PAGEDATTN_HOST_DEVICE bool is_empty() const { return l == 0.f; }

  // Base::exp(a - b), 0 when a is -inf (b may be -inf too then).
  static PAGEDATTN_HOST_DEVICE float factor(float a, float b) {
    return a == -INFINITY ? 0.f : Base::exp(a - b);
  }

  // Raises the running max to cover a tile whose largest logit is tile_max, scaling l. Returns
  // alpha, the factor the caller's accumulator must be multiplied by: exactly 1 when the max did
  // not move (callers may skip the rescale then), and 1 as well while the state is empty (its
  // accumulator is 0).
  // Written as selects rather than branches so that GPU warps do not diverge on it. A NaN
  // tile_max leaves the max unchanged (the NaN reaches l through the weights instead).
  PAGEDATTN_HOST_DEVICE float rescale_to(float tile_max) {
    const bool grows = tile_max > m;
    const float alpha = grows && m != -INFINITY ? Base::exp(m - tile_max) : 1.f;
    l = grows ? l * alpha : l;
    m = grows ? tile_max : m;
    return alpha;
  }

  // What logits are shifted by before exponentiating: the running max, or 0 while it is -inf
  // (so a masked logit gives exp(-inf) = 0, never exp(-inf - -inf)).
  PAGEDATTN_HOST_DEVICE float shift() const { return m == -INFINITY ? 0.f : m; }

  // The weight of one logit under the current max (0 for a masked logit of -inf).
  PAGEDATTN_HOST_DEVICE float weight(float s) const { return Base::exp(s - shift()); }

  // Adds the weights of a tile (computed with weight() or an equivalent vector exp).
  PAGEDATTN_HOST_DEVICE void add(float weight_sum) { l += weight_sum; }

  // Merges state o into this one. fa and fb are the factors for this state's accumulator and
  // o's (acc = acc * fa + acc_o * fb). Returns false, changing nothing, when both are empty.
  // Associative and commutative up to rounding; the empty state is the identity.
  PAGEDATTN_HOST_DEVICE bool merge(const OnlineSoftmax& o, float& fa, float& fb) {
    const float mm = m > o.m ? m : o.m;
    if (mm == -INFINITY) return false;
    fa = factor(m, mm);
    fb = factor(o.m, mm);
    l = l * fa + o.l * fb;
    m = mm;
    return true;
  }

  // 1 / l for the final normalization; 0 for the empty state (out = 0 rather than NaN), NaN when
  // a NaN reached the sum (a NaN or Inf logit), so that it shows in out.
  PAGEDATTN_HOST_DEVICE float inv_sum() const { return l > 0.f ? 1.f / l : (l == 0.f ? 0.f : l); }
  // The natural-log sum of exp over every logit seen; -inf for the empty state, NaN when a NaN
  // reached the sum.
  PAGEDATTN_HOST_DEVICE float lse() const {
    return l > 0.f ? Base::lse(m, l) : (l == 0.f ? -INFINITY : l);
  }
};

using SoftmaxState = OnlineSoftmax<NaturalExp>;  // the CPU backend's units
using SoftmaxState2 = OnlineSoftmax<Log2Exp>;    // the CUDA kernels' units

// ---- Array forms over one head's accumulator, built from the state's operations. ----

// Folds n logits s[0..n) into the state. On return p[i] = exp(s[i] - m_new) and the returned
// alpha is the factor the caller applies to acc before adding sum p[i] v_i. Logits of -inf
// (masked tokens) get weight 0. p may alias s.
template <class Base>
PAGEDATTN_HOST_DEVICE float softmax_update(OnlineSoftmax<Base>& st, const float* s, float* p,
                                           int n) {
  float tile_max = -INFINITY;
  for (int i = 0; i < n; ++i) tile_max = s[i] > tile_max ? s[i] : tile_max;
  const float alpha = st.rescale_to(tile_max);
  float sum = 0.f;
  for (int i = 0; i < n; ++i) {
    p[i] = st.weight(s[i]);
    sum += p[i];
  }
  st.add(sum);
  return alpha;
}

// Merges state b (with accumulator acc_b) into a (acc_a), over d elements.
template <class Base>
PAGEDATTN_HOST_DEVICE void softmax_merge(OnlineSoftmax<Base>& a, float* acc_a,
                                         const OnlineSoftmax<Base>& b, const float* acc_b, int d) {
  float fa = 0.f, fb = 0.f;
  if (!a.merge(b, fa, fb)) return;
  for (int i = 0; i < d; ++i) acc_a[i] = acc_a[i] * fa + acc_b[i] * fb;
}

// Writes out = acc / l (0 when empty) and returns the natural-log lse.
template <class Base>
PAGEDATTN_HOST_DEVICE float softmax_finalize(const OnlineSoftmax<Base>& st, const float* acc,
                                             float* out, int d) {
  const float inv = st.inv_sum();
  for (int i = 0; i < d; ++i) out[i] = acc[i] * inv;
  return st.lse();
}

}  // namespace pagedattn
