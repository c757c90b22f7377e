#include "shrink.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "pagedattn/cache_layout.hpp"

namespace pagedattn::fuzz {
namespace {

// Candidates strictly simpler than a case, each the case with one edit (of its spec and of the
// case itself), in the order they are added.
class Candidates {
 public:
  explicit Candidates(const FuzzCase& c)
      : c_(c), row_(static_cast<std::int64_t>(c.spec.num_heads) * c.spec.head_dim) {}

  template <class Edit>
  void operator()(Edit&& edit) {
    FuzzCase n = c_;
    edit(n.spec, n);
    // The per-head arrays follow the head count: the leading heads' values.
    for (std::vector<float>* values : {&n.alibi_slopes, &n.sinks}) {
      if (!values->empty()) values->resize(static_cast<std::size_t>(n.spec.num_heads));
    }
    // Tree masks follow their counts (the leading corner of a shrunk one stays lower-triangular).
    fit_tree_masks(n);
    // And the per-head scales the kv head count.
    for (std::vector<float>* values : {&n.k_scales, &n.v_scales}) {
      if (!values->empty()) values->resize(static_cast<std::size_t>(n.spec.num_kv_heads));
    }
    // Row strides follow the row length and keep their gaps, so that fewer heads or a smaller
    // head_dim leave the strides valid (and as aligned: every row is a multiple of 16 bytes).
    const std::int64_t new_row = static_cast<std::int64_t>(n.spec.num_heads) * n.spec.head_dim;
    for (std::int64_t* stride : {&n.q_row_stride, &n.out_row_stride}) {
      if (*stride != 0) *stride += new_row - row_;
    }
    out_.push_back(std::move(n));
  }
  std::vector<FuzzCase> take() { return std::move(out_); }

 private:
  const FuzzCase& c_;
  const std::int64_t row_;
  std::vector<FuzzCase> out_;
};

// Query-token counts listed per sequence, which a case edits along with its sequences.
bool counts_per_sequence(const FuzzCase& c) {
  return c.multi_token() && static_cast<int>(c.q_lens.size()) == c.spec.batch;
}

// Sequences [first, last) dropped, with their contexts, query token counts and tree masks.
void drop_sequences(testing::CaseSpec& t, FuzzCase& n, bool multi, int first, int last) {
  if (multi && n.tree_masks.size() == n.q_lens.size()) {
    n.tree_masks.erase(n.tree_masks.begin() + first, n.tree_masks.begin() + last);
  }
  t.context_lens.erase(t.context_lens.begin() + first, t.context_lens.begin() + last);
  t.batch = static_cast<int>(t.context_lens.size());
  if (multi) n.q_lens.erase(n.q_lens.begin() + first, n.q_lens.begin() + last);
}

// Fewer sequences: halves, then one at a time (their query token counts and tree masks with
// them).
void fewer_sequences(const FuzzCase& c, Candidates& add) {
  const int B = c.spec.batch;
  const bool multi = counts_per_sequence(c);
  if (B > 1) {
    add([&](testing::CaseSpec& t, FuzzCase& n) { drop_sequences(t, n, multi, B / 2, B); });
    add([&](testing::CaseSpec& t, FuzzCase& n) { drop_sequences(t, n, multi, 0, B / 2); });
    for (int i = 0; i < B; ++i) {
      add([&](testing::CaseSpec& t, FuzzCase& n) { drop_sequences(t, n, multi, i, i + 1); });
    }
  }
}

// One query token per sequence, then no tree mask, or one packed back to back, then fewer query
// tokens (0, 1, half, one less; a tree mask keeps its leading corner), then a max_q_len of just
// the largest count.
void fewer_query_tokens(const FuzzCase& c, Candidates& add) {
  const testing::CaseSpec& s = c.spec;
  const int B = s.batch;
  const auto no_tree = [](FuzzCase& n) {
    n.tree = false;
    n.tree_masks.clear();
    n.tree_pack_seed = 0;
  };
  if (c.multi_token()) {
    add([&](testing::CaseSpec&, FuzzCase& n) {
      n.q_lens.clear();
      n.max_q_len = 0;
      no_tree(n);
    });
  }
  if (c.tree) add([&](testing::CaseSpec&, FuzzCase& n) { no_tree(n); });
  if (c.tree_pack_seed != 0) add([](testing::CaseSpec&, FuzzCase& n) { n.tree_pack_seed = 0; });
  if (counts_per_sequence(c)) {
    for (int i = 0; i < B; ++i) {
      const int q = c.q_lens[i];
      for (int v : {0, 1, q / 2, q - 1}) {
        if (v < 0 || v >= q) continue;
        add([&](testing::CaseSpec&, FuzzCase& n) { n.q_lens[i] = v; });
      }
    }
    const int longest = B > 0 ? *std::max_element(c.q_lens.begin(), c.q_lens.end()) : 0;
    if (c.max_q_len > std::max(longest, 1)) {
      add([&](testing::CaseSpec&, FuzzCase& n) { n.max_q_len = std::max(longest, 1); });
    }
  }
}

// Shorter contexts.
void shorter_contexts(const FuzzCase& c, Candidates& add) {
  const testing::CaseSpec& s = c.spec;
  const int B = s.batch;
  for (int i = 0; i < B; ++i) {
    const int L = s.context_lens[i], BS = s.block_size;
    std::vector<int> shorter = {0, 1, L / 2, L - L % BS, L % BS, L - BS, L - 1};
    for (int v : shorter) {
      if (v < 0 || v >= L) continue;
      add([&](testing::CaseSpec& t, FuzzCase&) { t.context_lens[i] = v; });
    }
  }
}

// Fewer variants, then plainer ones: no window, or one of just the longest context (every block
// read, no traps before it); every slope 1; sinks of 0 where they are finite.
void plainer_variants(const FuzzCase& c, Candidates& add) {
  const testing::CaseSpec& s = c.spec;
  if (c.windowed()) {
    add([](testing::CaseSpec&, FuzzCase& n) { n.window_left = -1; });
    int longest = 0;
    for (int L : s.context_lens) longest = std::max(longest, L);
    if (c.window_left > longest) {
      add([&](testing::CaseSpec&, FuzzCase& n) { n.window_left = longest; });
    }
  }
  if (c.soft_capped()) add([](testing::CaseSpec&, FuzzCase& n) { n.soft_cap = 0.f; });
  if (!c.alibi_slopes.empty()) {
    add([](testing::CaseSpec&, FuzzCase& n) { n.alibi_slopes.clear(); });
    if (std::any_of(c.alibi_slopes.begin(), c.alibi_slopes.end(),
                    [](float x) { return x != 1.f; })) {
      add([](testing::CaseSpec&, FuzzCase& n) {
        std::fill(n.alibi_slopes.begin(), n.alibi_slopes.end(), 1.f);
      });
    }
  }
  if (!c.sinks.empty()) {
    add([](testing::CaseSpec&, FuzzCase& n) { n.sinks.clear(); });
    if (std::any_of(c.sinks.begin(), c.sinks.end(),
                    [](float x) { return std::isfinite(x) && x != 0.f; })) {
      add([](testing::CaseSpec&, FuzzCase& n) {
        for (float& x : n.sinks) x = std::isfinite(x) ? 0.f : x;
      });
    }
  }
}

// Dense q and out, then the cache layout.
void denser_buffers(const FuzzCase& c, Candidates& add) {
  if (c.q_row_stride != 0) add([](testing::CaseSpec&, FuzzCase& n) { n.q_row_stride = 0; });
  if (c.out_row_stride != 0) add([](testing::CaseSpec&, FuzzCase& n) { n.out_row_stride = 0; });
  // The default cache layout, or the padded one without its extra gap.
  if (!c.default_layout()) {
    add([](testing::CaseSpec&, FuzzCase& n) {
      n.kv_layout = testing::KvLayout::kHnd;
      n.kv_pad = 0;
    });
  }
  if (c.kv_pad != 0 && c.kv_layout != testing::KvLayout::kHnd) {
    add([](testing::CaseSpec&, FuzzCase& n) { n.kv_pad = 0; });
  }
}

// Smaller dims.
void smaller_dims(const FuzzCase& c, Candidates& add) {
  const testing::CaseSpec& s = c.spec;
  for (int d : kSupportedHeadDims) {
    if (d >= s.head_dim) break;
    if (s.kv_dtype == DType::kInt4 && d % kInt4GroupSize != 0) continue;  // groups of 32
    add([&](testing::CaseSpec& t, FuzzCase&) { t.head_dim = d; });
  }
  const int G = s.num_heads / std::max(s.num_kv_heads, 1);
  for (int kv : {1, 2}) {
    if (kv >= s.num_kv_heads) continue;
    add([&](testing::CaseSpec& t, FuzzCase&) {
      t.num_kv_heads = kv;
      t.num_heads = kv * G;
    });
  }
  for (int g : {1, 2, G / 2}) {
    if (g < 1 || g >= G) continue;
    add([&](testing::CaseSpec& t, FuzzCase&) { t.num_heads = t.num_kv_heads * g; });
  }
  for (int bs : {1, 2, 4, 8, 16, s.block_size / 2, s.block_size - 1}) {
    if (bs < 1 || bs >= s.block_size) continue;
    add([&](testing::CaseSpec& t, FuzzCase&) { t.block_size = bs; });
  }
}

// Simpler tables.
void simpler_tables(const FuzzCase& c, Candidates& add) {
  const testing::CaseSpec& s = c.spec;
  if (s.fragmented) add([](testing::CaseSpec& t, FuzzCase&) { t.fragmented = false; });
  if (s.share_prefix) add([](testing::CaseSpec& t, FuzzCase&) { t.share_prefix = false; });
  if (s.fork_members > 0) add([](testing::CaseSpec& t, FuzzCase&) { t.fork_members = 0; });
  if (s.spare_blocks > 0) add([](testing::CaseSpec& t, FuzzCase&) { t.spare_blocks = 0; });
  if (s.table_padding > 0) add([](testing::CaseSpec& t, FuzzCase&) { t.table_padding = 0; });
  if (s.table_stride_extra > 0) {
    add([](testing::CaseSpec& t, FuzzCase&) { t.table_stride_extra = 0; });
  }
}

// Without per-token scales (their layout back to the dense one, which a case without them keeps).
void no_token_scales(FuzzCase& n) {
  n.spec.token_scales = false;
  n.token_scale_layout = TokenScaleLayout::kDense;
  n.token_scale_pad = 0;
}

// Plainer dtypes, values and threads.
void plainer_values(const FuzzCase& c, Candidates& add) {
  const testing::CaseSpec& s = c.spec;
  if (s.q_dtype != DType::kF32)
    add([](testing::CaseSpec& t, FuzzCase&) { t.q_dtype = DType::kF32; });
  // A quantized cache becomes an f32 one without its scales (which a plain cache refuses): a
  // valid case still, so a failure that survives it did not need quantization. Else the scales
  // get plainer: no per-token ones, or dense ones, or padded without a gap; no per-head ones; then
  // k_scale and v_scale 1 (the cache stays quantized).
  if (s.kv_dtype != DType::kF32) {
    add([](testing::CaseSpec& t, FuzzCase& n) {
      t.kv_dtype = DType::kF32;
      t.k_scale = t.v_scale = 1.f;
      n.k_scales.clear();
      n.v_scales.clear();
      no_token_scales(n);
    });
  }
  // (An int4 cache keeps its group scales.)
  if (c.token_scales() && s.kv_dtype != DType::kInt4) {
    add([](testing::CaseSpec&, FuzzCase& n) { no_token_scales(n); });
  }
  if (c.token_scale_layout != TokenScaleLayout::kDense) {
    add([](testing::CaseSpec&, FuzzCase& n) {
      n.token_scale_layout = TokenScaleLayout::kDense;
      n.token_scale_pad = 0;
    });
  }
  if (c.token_scale_pad != 0) add([](testing::CaseSpec&, FuzzCase& n) { n.token_scale_pad = 0; });
  if (c.per_head_scales()) {
    add([](testing::CaseSpec&, FuzzCase& n) {
      n.k_scales.clear();
      n.v_scales.clear();
    });
  }
  if (s.k_scale != 1.f) add([](testing::CaseSpec& t, FuzzCase&) { t.k_scale = 1.f; });
  if (s.v_scale != 1.f) add([](testing::CaseSpec& t, FuzzCase&) { t.v_scale = 1.f; });
  if (s.out_dtype != DType::kF32) {
    add([](testing::CaseSpec& t, FuzzCase&) { t.out_dtype = DType::kF32; });
  }
  if (s.magnitude != 1.f) add([](testing::CaseSpec& t, FuzzCase&) { t.magnitude = 1.f; });
  if (c.snap) add([](testing::CaseSpec&, FuzzCase& n) { n.snap = false; });
  if (c.scale != 0.f) add([](testing::CaseSpec&, FuzzCase& n) { n.scale = 0.f; });
  if (c.threads > 1) add([](testing::CaseSpec&, FuzzCase& n) { n.threads = 1; });
  if (s.poison) add([](testing::CaseSpec& t, FuzzCase&) { t.poison = false; });
}

// Candidates strictly simpler than `c`, most aggressive first.
std::vector<FuzzCase> candidates(const FuzzCase& c) {
  Candidates add(c);
  fewer_sequences(c, add);
  fewer_query_tokens(c, add);
  shorter_contexts(c, add);
  plainer_variants(c, add);
  denser_buffers(c, add);
  smaller_dims(c, add);
  simpler_tables(c, add);
  plainer_values(c, add);
  return add.take();
}

}  // namespace

FuzzCase shrink_case(const FuzzCase& failing, const std::function<bool(const FuzzCase&)>& fails,
                     int max_evaluations, ShrinkStats* stats) {
  ShrinkStats local;
  ShrinkStats& st = stats ? *stats : local;
  FuzzCase current = failing;
  bool progress = true;
  while (progress && st.evaluations < max_evaluations) {
    progress = false;
    for (const FuzzCase& cand : candidates(current)) {
      if (st.evaluations >= max_evaluations) break;
      ++st.evaluations;
      if (fails(cand)) {
        current = cand;
        ++st.accepted;
        progress = true;
        break;
      }
    }
  }
  return current;
}

}  // namespace pagedattn::fuzz
