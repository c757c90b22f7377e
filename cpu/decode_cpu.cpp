// The CPU backend: executes the split plan with OpenMP threads, then combines the splits.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "cpu_kernel.hpp"
#include "isa_choice.hpp"
#include "pagedattn/detail/backends.hpp"
#include "pagedattn/online_softmax.hpp"
#include "pagedattn/shared_prefix.hpp"
#include "pagedattn/split_plan.hpp"
#include "pagedattn/variants.hpp"
#include "prefix_passes.hpp"
#include "work_threads.hpp"

namespace pagedattn::detail::cpu {
namespace {

// A grow-only, 64-byte aligned float buffer: it allocates only when a call needs more than any
// call before it on the same thread.
class FloatBuffer {
 public:
  FloatBuffer() = default;
  FloatBuffer(const FloatBuffer&) = delete;
  FloatBuffer& operator=(const FloatBuffer&) = delete;
  ~FloatBuffer() { std::free(data_); }

  float* get(std::size_t n) {
    if (n > capacity_) {
      std::free(data_);
      data_ = nullptr;
      capacity_ = 0;
      const std::size_t want = std::max<std::size_t>((n + 15) / 16 * 16, 16);
      data_ = static_cast<float*>(std::aligned_alloc(64, want * sizeof(float)));
      if (!data_) throw std::bad_alloc();
      capacity_ = want;
    }
    return data_;
  }

 private:
  float* data_ = nullptr;
  std::size_t capacity_ = 0;
};

// Scratch of one worker thread (OpenMP keeps its threads, so this lives across calls).
struct WorkerScratch {
  FloatBuffer scores;  // ItemScratch
  FloatBuffer merged;  // the combine's accumulator
  FloatBuffer q;       // ItemScratch::q
  FloatBuffer rows;    // ItemScratch::rows
};

// One unit of scheduling: the plan's items `item`, item + 1, ... for kv_count consecutive kv
// heads of one (sequence, split), which share one block range, of pass `pass` (0: the call's
// sequences; 1 on: the shared prefixes' passes).
struct Task {
  std::int64_t item;
  int kv_count;
  int pass = 0;
};

// State of one calling thread: the scaled queries, the partials and the last plan. A plan is
// reused while the context lengths and the shape are unchanged (every layer of a decode step).
struct CallerState {
  FloatBuffer q_scaled;
  std::vector<bf16_t> q_words;  // the raw bf16 q in the kernel's row order (query tokens together)
  FloatBuffer partials;         // m[P], l[P], acc[P][D]
  SplitPlan plan;
  std::vector<std::int32_t> plan_lens;
  std::vector<Task> tasks;  // built from the plan on every call (grow-only)
  // Shared prefixes: the passes, and the plan of the sequences' own tokens (own_plan).
  PrefixPasses prefix;
  SplitPlan own_plan;
  std::vector<std::int32_t> own_lens, own_first, own_shift;
  int plan_kv_heads = -1, plan_block_size = -1, plan_parallelism = -1, plan_window = -1,
      plan_fixed_chunk = -1;
  bool plan_single = false;

  const SplitPlan& plan_for(const DecodeArgs& a, const PlanOptions& po) {
    const bool same = plan_kv_heads == a.num_kv_heads && plan_block_size == a.block_size &&
                      plan_parallelism == po.parallelism && plan_single == po.single_split &&
                      plan_window == po.window_left && plan_fixed_chunk == po.fixed_chunk_tokens &&
                      plan_lens.size() == static_cast<std::size_t>(a.batch) &&
                      std::equal(plan_lens.begin(), plan_lens.end(), a.context_lens);
    if (!same) {
      plan = make_split_plan(a.context_lens, a.batch, a.num_kv_heads, a.block_size, po);
      plan_lens.assign(a.context_lens, a.context_lens + a.batch);
      plan_kv_heads = a.num_kv_heads;
      plan_block_size = a.block_size;
      plan_parallelism = po.parallelism;
      plan_single = po.single_split;
      plan_window = po.window_left;
      plan_fixed_chunk = po.fixed_chunk_tokens;
    }
    return plan;
  }
};

WorkerScratch& worker_scratch() {
  thread_local WorkerScratch s;
  return s;
}
CallerState& caller_state() {
  thread_local CallerState s;
  return s;
}

// out[0, D) = src[0, D) * inv in the output dtype.
void store_row(void* out, DType t, std::int64_t offset, const float* src, float inv, int D) {
  switch (t) {
    case DType::kF32: {
      float* o = static_cast<float*>(out) + offset;
      for (int d = 0; d < D; ++d) o[d] = src[d] * inv;
      break;
    }
    case DType::kF16: {
      f16_t* o = static_cast<f16_t*>(out) + offset;
      for (int d = 0; d < D; ++d) o[d] = float_to_f16(src[d] * inv);
      break;
    }
    case DType::kBF16: {
      bf16_t* o = static_cast<bf16_t*>(out) + offset;
      for (int d = 0; d < D; ++d) o[d] = float_to_bf16(src[d] * inv);
      break;
    }
    case DType::kFP8E4M3:
    case DType::kFP8E5M2:
      break;  // refused by validation: out is never fp8
  }
}

}  // namespace

int threads_for_work(int requested, std::int64_t kv_bytes) {
  const std::int64_t by_work = kv_bytes / kMinBytesPerThread;
  return static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(requested, by_work)));
}

namespace {

// Threads sized to the work: every thread beyond the first must get at least kMinBytesPerThread of
// K/V to read, and one thread runs without a parallel region at all, so a small call pays no
// wake-up or barrier (on a loaded machine a barrier can wait a whole scheduler slice for a thread
// that is not running). The count depends only on the shape, the context lengths and the requested
// threads, so results stay deterministic.
int threads_for_call(const DecodeArgs& a, const DecodeOptions& options) {
  const int requested = options.num_threads > 0 ? options.num_threads : omp_get_max_threads();
  std::int64_t tokens = 0;  // attended: the window's, with one
  for (int b = 0; b < a.batch; ++b) {
    tokens += a.context_lens[b] - window_first_token(a.context_lens[b], a.window_left);
  }
  const std::int64_t kv_bytes = dtype_bytes(a.k_dtype, tokens * a.num_kv_heads * a.head_dim * 2);
  return threads_for_work(requested, kv_bytes);
}

// A task runs every kv head of one (sequence, split) block by block, so it reads each physical
// block as one contiguous stretch (see run_item); the planner is asked for kv_heads times the
// parallelism, so that the tasks (not the items) number about 8 per thread: dynamic scheduling
// evens out uneven contexts, and one long sequence is split across every core.
PlanOptions plan_options(const DecodeArgs& a, const DecodeOptions& options, int threads) {
  constexpr int kTasksPerThread = 8;
  PlanOptions po;
  po.parallelism = threads * kTasksPerThread * a.num_kv_heads;
  po.min_chunk_tokens = 256;
  po.single_split = options.single_split;
  po.window_left = a.window_left;
  if (options.batch_invariant) make_batch_invariant(po);  // splits from each sequence alone
  return po;
}

// The plan's tasks (of pass `pass`), appended to `tasks`. When the splits alone are too few to
// keep every thread busy (a short batch, min_chunk_tokens or single_split), a task takes fewer kv
// heads: halve until there are 4 tasks per thread.
void add_tasks(const SplitPlan& plan, int num_kv_heads, int threads, int pass,
               std::vector<Task>& tasks) {
  const int KV = num_kv_heads;
  int kv_per_task = KV;
  const std::int64_t splits = plan.total_splits();
  while (kv_per_task > 1 && splits * ((KV + kv_per_task - 1) / kv_per_task) < 4 * threads) {
    kv_per_task = (kv_per_task + 1) / 2;
  }
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(plan.items.size()); ++i) {
    const int kv = plan.items[i].kv_head;
    if (kv % kv_per_task == 0) tasks.push_back(Task{i, std::min(kv_per_task, KV - kv), pass});
  }
}

// q widened once and pre-multiplied by the scale, and for an fp8 cache by its kv head's K
// scale: q . (code x k_scale) = (q x k_scale) . code, so the kernel reads the codes as they are.
const float* scale_queries(const DecodeArgs& a, FloatBuffer& buffer) {
  const int H = a.num_heads, D = a.head_dim, G = a.group_size();
  const float scale = a.effective_scale();
  float* q_scaled = buffer.get(static_cast<std::size_t>(a.batch) * H * D);
  const std::int64_t row = static_cast<std::int64_t>(H) * D;
  for (int b = 0; b < a.batch; ++b) {
    float* dst = q_scaled + b * row;
    const std::int64_t src = b * a.q_stride();
    for (int h = 0; h < H; ++h) {
      const float s = scale * head_scale(a.k_scale, a.k_scales, h / G);
      for (int d = 0; d < D; ++d) {
        const std::int64_t i = static_cast<std::int64_t>(h) * D + d;
        dst[i] = load_as_float(a.q, a.q_dtype, src + i) * s;
      }
    }
  }
  return q_scaled;
}

}  // namespace

ItemContext item_context(const DecodeArgs& a, const float* q_scaled, const std::int32_t* seq_rows) {
  ItemContext ctx;
  ctx.q_scaled = q_scaled;
  ctx.q_bf16 = a.q_dtype == DType::kBF16 ? static_cast<const bf16_t*>(a.q) : nullptr;
  ctx.q_bf16_stride = a.q_stride();
  ctx.scale = a.effective_scale();
  ctx.k_scale = a.k_scale;
  ctx.k_scales = a.k_scales;
  ctx.bf16_weights = a.out_dtype == DType::kBF16;
  ctx.k_cache = a.k_cache;
  ctx.v_cache = a.v_cache;
  ctx.kv_dtype = a.k_dtype;
  ctx.layout = a.cache_layout();
  if (a.k_dtype == DType::kInt4) {  // in bytes (int4x2_t), the strides validated even
    ctx.layout.block_stride /= 2;
    ctx.layout.head_stride /= 2;
    ctx.layout.token_stride /= 2;
  }
  ctx.k_token_scales = a.k_token_scales;
  ctx.v_token_scales = a.v_token_scales;
  ctx.token_scale_layout = a.token_scale_layout();
  ctx.table = BlockTableView{a.block_table, a.max_blocks_per_seq, a.table_stride(), seq_rows};
  ctx.context_lens = a.context_lens;
  ctx.num_heads = a.num_heads;
  ctx.group_size = a.group_size();
  ctx.window_left = a.window_left;
  ctx.soft_cap = a.logits_soft_cap;
  ctx.alibi_slopes = a.alibi_slopes;
  return ctx;
}

namespace {

// The partial states of a plan's (sequence, split, query head)s: m[P], l[P], acc[P][D].
struct Partials {
  float* m;
  float* l;
  float* acc;
};

// How the kernel's rows map onto the call's. One query token per sequence: the kernel's row
// (b, h) is the call's. Query tokens together (tokens > 1, or q_indptr set): the kernel sees
// each kv head with tokens x G rows, row i * G + g being query head kv * G + g of the
// sequence's query token i (rows of tokens past its n_b are padding, never written out).
struct TokenRows {
  const std::int32_t* q_indptr = nullptr;
  int tokens = 1;
};

// Merges the splits of the kernel's row (b, h) of H rows per sequence in split order
// (deterministic); returns the state and where its accumulator is (`merged`: D floats).
SoftmaxState merge_splits(const SplitPlan& plan, const Partials& part, int b, int h, int H, int D,
                          float* merged, const float** acc) {
  const int splits = plan.num_splits[b];
  if (splits == 1) {  // nothing to merge: finalize the one partial in place
    const std::int64_t p = plan.partial_index(b, 0, h, H);
    *acc = &part.acc[p * D];
    return SoftmaxState{part.m[p], part.l[p]};
  }
  SoftmaxState state = SoftmaxState::empty();
  std::fill(merged, merged + D, 0.f);
  for (int s = 0; s < splits; ++s) {
    const std::int64_t p = plan.partial_index(b, s, h, H);
    softmax_merge(state, merged, SoftmaxState{part.m[p], part.l[p]}, &part.acc[p * D], D);
  }
  *acc = merged;
  return state;
}

// Finalizes query row q_row's head h (of the call) from its merged state and writes out and lse.
void finish_row(const DecodeArgs& a, SoftmaxState state, const float* acc, std::int64_t q_row,
                int h) {
  const int D = a.head_dim;
  // The sink joins the denominator only (out = acc * fa / l with its l).
  const float fa = a.sinks != nullptr ? add_sink(state, a.sinks[h]) : 1.f;
  // A NaN state (a NaN or infinite logit in some split; see softmax_tile) gives NaN out and
  // lse, never the 0 and -inf of an empty context.
  const bool nan = std::isnan(state.l);
  // An fp8 cache's V scale: sum p (code x v_scale) = v_scale x sum p code.
  store_row(
      a.out, a.out_dtype, q_row * a.out_stride() + static_cast<std::int64_t>(h) * D, acc,
      nan ? NAN : state.inv_sum() * fa * head_scale(a.v_scale, a.v_scales, h / a.group_size()), D);
  if (a.lse) a.lse[q_row * a.num_heads + h] = nan ? NAN : state.lse();
}

// The shared prefixes of a call as decode_sequences sees its sequences: sequence s is the call's
// seq_of[s] (null: s) and, with seq_of, its query token s - call_q_indptr[seq_of[s]] (the call's
// query tokens run as sequences of their own); `parts` are the passes' partial states.
struct SharedRows {
  const PrefixPasses* passes = nullptr;
  const std::int32_t* seq_of = nullptr;
  const std::int32_t* call_q_indptr = nullptr;
  const Partials* parts = nullptr;  // per prefix pass
};

// The shared state of the kernel's row (sequence s, query token i, query head h of its kv head's
// group) into `merged`, or false when its sequence shares nothing. With ALiBi the state's max
// moves from the pass's bias to the row's own (prefix_alibi_shift; position: the row's).
bool shared_state(const DecodeArgs& a, const SharedRows& sr, int s, int i, int h, int position,
                  float* merged, SoftmaxState* state) {
  const int b = sr.seq_of != nullptr ? sr.seq_of[s] : s;
  const PrefixLink& link = sr.passes->links[b];
  if (link.pass < 0) return false;
  if (sr.seq_of != nullptr) i = s - sr.call_q_indptr[b];
  const PrefixPass& pass = sr.passes->passes[link.pass];
  const int G = a.group_size(), D = a.head_dim, QG = pass.query_tokens * G;
  const int kv = h / G, head = kv * QG + (link.row0 + i) * G + h % G;
  const float* acc = nullptr;
  *state = merge_splits(pass.plan, sr.parts[link.pass], link.chunk, head, pass.view.num_heads, D,
                        merged, &acc);
  if (acc != merged) std::copy(acc, acc + D, merged);
  if (state->m != -INFINITY) state->m += prefix_alibi_shift(a, h, link.tokens, position);
  return true;
}

// Combine of the kernel's row `row` (sequence row / Hk, head row % Hk of Hk = tokens x H): its
// splits merged (after its shared state, where it has one), then written as the call's (query
// token, head) it stands for.
void combine_row(const DecodeArgs& a, const SplitPlan& plan, const Partials& part,
                 const TokenRows& tr, const SharedRows& sr, std::int64_t row, float* merged) {
  const int H = a.num_heads, G = a.group_size(), Hk = tr.tokens * H, Gk = tr.tokens * G;
  const int b = static_cast<int>(row / Hk), hk = static_cast<int>(row % Hk);
  const int kv = hk / Gk, i = hk % Gk / G, h = kv * G + hk % G;
  std::int64_t q_row = b;
  int position = a.context_lens[b] - 1;  // the query token's
  if (tr.q_indptr != nullptr) {
    const int n = tr.q_indptr[b + 1] - tr.q_indptr[b];
    if (i >= n) return;  // padding
    q_row = tr.q_indptr[b] + i;
    position = a.context_lens[b] - n + i;
  }
  const float* acc = nullptr;
  SoftmaxState state;
  if (sr.passes != nullptr && shared_state(a, sr, b, i, h, position, merged, &state)) {
    for (int s = 0; s < plan.num_splits[b]; ++s) {
      const std::int64_t p = plan.partial_index(b, s, hk, Hk);
      softmax_merge(state, merged, SoftmaxState{part.m[p], part.l[p]}, &part.acc[p * a.head_dim],
                    a.head_dim);
    }
    acc = merged;
  } else {
    state = merge_splits(plan, part, b, hk, Hk, a.head_dim, merged, &acc);
  }
  finish_row(a, state, acc, q_row, h);
}

// The kernel's q (query tokens together, tr.tokens > 1): [batch][kv head][token][G][D], each row
// widened and scaled as scale_queries does, rows of padding tokens zero. With a bf16 q also the
// same rows of the raw bf16 q into `words` (for the kernels that read q_bf16).
const float* gather_queries(const DecodeArgs& a, const TokenRows& tr, FloatBuffer& buffer,
                            std::vector<bf16_t>& words) {
  const int H = a.num_heads, D = a.head_dim, G = a.group_size(), KV = a.num_kv_heads;
  const float scale = a.effective_scale();
  const std::size_t elems = static_cast<std::size_t>(a.batch) * tr.tokens * H * D;
  float* q = buffer.get(elems);
  const bool bf16 = a.q_dtype == DType::kBF16;
  if (bf16) words.assign(elems, bf16_t{});
  for (int b = 0; b < a.batch; ++b) {
    const int n_b = tr.q_indptr[b + 1] - tr.q_indptr[b];
    for (int kv = 0; kv < KV; ++kv) {
      const float s = scale * head_scale(a.k_scale, a.k_scales, kv);
      for (int i = 0; i < tr.tokens; ++i) {
        for (int g = 0; g < G; ++g) {
          const std::int64_t dst =
              ((static_cast<std::int64_t>(b) * KV + kv) * tr.tokens * G + i * G + g) * D;
          const std::int64_t src =
              (tr.q_indptr[b] + i) * a.q_stride() + static_cast<std::int64_t>(kv * G + g) * D;
          for (int d = 0; d < D; ++d) {
            q[dst + d] = i < n_b ? load_as_float(a.q, a.q_dtype, src + d) * s : 0.f;
            if (bf16 && i < n_b) words[dst + d] = static_cast<const bf16_t*>(a.q)[src + d];
          }
        }
      }
    }
  }
  return q;
}

// The plan of the sequences' own tokens when some share a prefix: sequence s computes from its
// shared tokens' end on (ItemContext::first_tokens, st.own_first). Planned as contexts that start
// at the block holding that token, so splits divide only what is left, then moved back to the
// sequences' own block numbers. A sequence whose context is all shared has no items.
const SplitPlan& own_plan(const DecodeArgs& k, const PlanOptions& po, const SharedRows& sr,
                          CallerState& st) {
  const int B = k.batch, BS = k.block_size;
  st.own_lens.resize(static_cast<std::size_t>(B));
  st.own_first.resize(static_cast<std::size_t>(B));
  st.own_shift.resize(static_cast<std::size_t>(B));
  for (int s = 0; s < B; ++s) {
    const int b = sr.seq_of != nullptr ? sr.seq_of[s] : s;
    const PrefixLink& link = sr.passes->links[b];
    const int L = k.context_lens[s], shared = link.pass >= 0 ? link.tokens : 0;
    st.own_first[s] = shared;
    st.own_shift[s] = shared < L ? shared / BS : 0;
    st.own_lens[s] = shared < L ? L - st.own_shift[s] * BS : 0;
  }
  DecodeArgs shifted = k;
  shifted.context_lens = st.own_lens.data();
  st.own_plan = st.plan_for(shifted, po);
  for (WorkItem& it : st.own_plan.items) {
    it.block_begin += st.own_shift[it.seq];
    it.block_end += st.own_shift[it.seq];
  }
  return st.own_plan;
}

// One pass of the call's tasks: its kernel, its items' context, plan and partial states, and
// query heads.
struct PassRun {
  KernelFn fn;
  ItemContext ctx;
  const SplitPlan* plan;
  Partials part;
  int heads;
};

// The passes of a call: runs[0] over `plan` with `heads` query heads (its context left to the
// caller), then each shared prefix pass with its plan and context; the tasks of all of them, the
// shared passes' first (each reads many rows' worth per block: the longest tasks start first);
// and every pass's partial states in one buffer. Returns the most query heads of a pass.
int plan_passes(const SplitPlan& plan, int heads, PrefixPasses* shared,
                const DecodeOptions& options, int threads, CallerState& st,
                std::vector<PassRun>& runs) {
  const int num_passes = 1 + (shared != nullptr ? static_cast<int>(shared->passes.size()) : 0);
  runs.resize(static_cast<std::size_t>(num_passes));
  runs[0].fn = isa().fn;
  runs[0].plan = &plan;
  runs[0].heads = heads;
  int max_heads = heads;
  for (int p = 1; p < num_passes; ++p) {
    PrefixPass& pass = shared->passes[p - 1];
    const DecodeArgs& v = pass.view;
    pass.plan = make_split_plan(pass.lens.data(), v.batch, v.num_kv_heads, v.block_size,
                                plan_options(v, options, threads));
    runs[p].fn = prefix_kernel();
    runs[p].plan = &pass.plan;
    runs[p].heads = v.num_heads;
    runs[p].ctx = item_context(v, pass.q.data(), pass.rows.data());
    runs[p].ctx.q_bf16 = pass.words.empty() ? nullptr : pass.words.data();
    runs[p].ctx.q_bf16_stride = static_cast<std::int64_t>(v.num_heads) * v.head_dim;
    max_heads = std::max(max_heads, v.num_heads);
  }
  st.tasks.clear();
  for (int p = 1; p < num_passes; ++p) {
    add_tasks(*runs[p].plan, plan.num_kv_heads, threads, p, st.tasks);
  }
  add_tasks(plan, plan.num_kv_heads, threads, 0, st.tasks);
  return max_heads;
}

// Every pass's partial states (m[P], l[P], acc[P][D] of each in turn) in the caller's buffer.
void place_partials(std::vector<PassRun>& runs, int D, FloatBuffer& buffer) {
  std::int64_t total = 0;
  for (const PassRun& r : runs) total += r.plan->num_partials(r.heads);
  float* at = buffer.get(static_cast<std::size_t>(total) * (D + 2));
  for (PassRun& r : runs) {
    const std::int64_t n = r.plan->num_partials(r.heads);
    r.part = Partials{at, at + n, at + 2 * n};
    at += n * (D + 2);
  }
}

// Runs the call: one query token per sequence (sequence b reads table row seq_rows[b]; null: row
// b), or with tr.tokens > 1 the sequences' query tokens together, each K/V row read once for all
// of a sequence's tokens. With shared prefixes (`shared`), the passes of the groups' shared
// tokens run beside the sequences' own tokens, in one parallel region, and the combine merges
// each row's shared state before its own splits; when the call's query tokens run as sequences
// of their own, sequence s is query token s - call_q_indptr[seq_rows[s]] of the call's sequence
// seq_rows[s].
void decode_sequences(const DecodeArgs& a, const DecodeOptions& options,
                      const std::int32_t* seq_rows, const TokenRows& tr,
                      const TreeMaskRow* tree_rows = nullptr, PrefixPasses* shared = nullptr,
                      const std::int32_t* call_q_indptr = nullptr) {
  const int D = a.head_dim, BS = a.block_size;
  // The kernel's view: tr.tokens x the heads per sequence, in groups of tr.tokens x G.
  DecodeArgs k = a;
  k.num_heads = a.num_heads * tr.tokens;
  k.q_indptr = nullptr;
  k.num_q_tokens = k.max_q_len = 0;
  const int H = k.num_heads;
  // Threads for the work of the plain decode: sharing reads fewer bytes but computes as much.
  const int threads = threads_for_call(k, options);
  CallerState& st = caller_state();
  SharedRows sr;
  sr.passes = shared;
  sr.seq_of = seq_rows;
  sr.call_q_indptr = call_q_indptr;
  const PlanOptions po = plan_options(k, options, threads);
  const SplitPlan& plan = shared != nullptr ? own_plan(k, po, sr, st) : st.plan_for(k, po);

  // Pass 0: the sequences' own tokens; then the shared passes.
  thread_local std::vector<PassRun> runs;
  thread_local std::vector<Partials> shared_parts;
  const int max_heads = plan_passes(plan, H, shared, options, threads, st, runs);
  place_partials(runs, D, st.partials);
  ItemContext& ctx = runs[0].ctx;
  if (tr.q_indptr == nullptr) {
    ctx = item_context(k, scale_queries(k, st.q_scaled), seq_rows);
  } else {
    ctx = item_context(k, gather_queries(a, tr, st.q_scaled, st.q_words), seq_rows);
    ctx.q_bf16 = a.q_dtype == DType::kBF16 ? st.q_words.data() : nullptr;
    ctx.q_bf16_stride = static_cast<std::int64_t>(H) * D;
    ctx.token_group = a.group_size();
    ctx.q_indptr = tr.q_indptr;
    ctx.tree_mask = a.tree_mask;
    ctx.tree_mask_indptr = a.tree_mask_indptr;
  }
  ctx.tree_rows = tree_rows;
  if (shared != nullptr) ctx.first_tokens = st.own_first.data();
  shared_parts.clear();
  for (std::size_t p = 1; p < runs.size(); ++p) shared_parts.push_back(runs[p].part);
  sr.parts = shared_parts.data();

  const std::int64_t num_tasks = static_cast<std::int64_t>(st.tasks.size());
  const Task* tasks = st.tasks.data();
  const PassRun* run = runs.data();
  const std::int64_t num_rows = static_cast<std::int64_t>(a.batch) * H;
  const std::size_t scores_floats = static_cast<std::size_t>(kHeadTile) * scores_stride(BS);
  // The tasks, then the combine; orphaned worksharing loops, so the same body runs inside a
  // parallel region or, for one thread, straight on the calling thread.
  const auto body = [&] {
    WorkerScratch& ws = worker_scratch();
    const ItemScratch scratch{
        ws.scores.get(scores_floats), ws.q.get(static_cast<std::size_t>(max_heads) * D),
        ctx.dequantizes() ? ws.rows.get(static_cast<std::size_t>(2) * BS * D) : nullptr};
    float* merged = ws.merged.get(D);

#pragma omp for schedule(dynamic, 1)
    for (std::int64_t i = 0; i < num_tasks; ++i) {
      const PassRun& r = run[tasks[i].pass];
      const WorkItem& it = r.plan->items[tasks[i].item];
      // The heads of consecutive kv heads of one (sequence, split) are consecutive partials.
      const std::int64_t p0 =
          r.plan->partial_index(it.seq, it.split, it.kv_head * r.ctx.group_size, r.heads);
      r.fn(r.ctx, it, tasks[i].kv_count, &r.part.m[p0], &r.part.l[p0], &r.part.acc[p0 * D],
           scratch);
    }

#pragma omp for schedule(dynamic, 8)
    for (std::int64_t row = 0; row < num_rows; ++row) {
      combine_row(a, plan, run[0].part, tr, sr, row, merged);
    }
  };
  if (threads > 1) {
#pragma omp parallel num_threads(threads)
    body();
  } else {
    body();
  }
}

// Multi-token queries (DecodeArgs::q_indptr): query token i of sequence b, at position
// P = L_b - n_b + i, is exactly a one-token query of a context of P + 1 tokens over b's table
// row (pagedattn.hpp), so the call runs as one of num_q_tokens such sequences, each reading its
// sequence's table row (rows[r]; lens[r] its context) and, with a tree mask, attending the tokens
// of its mask row (tree[r]). Each query token reads its keys and values itself: the way for a
// window or ALiBi, whose bounds and biases differ per token at the context's start, and for a tree
// mask in a batch-invariant call (decode() takes the tokens together otherwise).
DecodeArgs as_sequences(const DecodeArgs& a, std::vector<std::int32_t>& lens,
                        std::vector<std::int32_t>& rows, std::vector<TreeMaskRow>& tree) {
  lens.resize(static_cast<std::size_t>(a.num_q_tokens));
  rows.resize(static_cast<std::size_t>(a.num_q_tokens));
  tree.resize(a.tree_mask != nullptr ? static_cast<std::size_t>(a.num_q_tokens) : 0);
  for (int b = 0; b < a.batch; ++b) {
    const int n_q = a.q_indptr[b + 1] - a.q_indptr[b];
    for (int i = 0; i < n_q; ++i) {
      const int r = a.q_indptr[b] + i;
      lens[r] = std::max(0, a.context_lens[b] - n_q + i + 1);
      rows[r] = b;
      if (a.tree_mask != nullptr) tree[r] = tree_mask_row(a, b, i);
    }
  }
  DecodeArgs v = a;
  v.batch = a.num_q_tokens;
  v.context_lens = lens.data();
  v.q_indptr = nullptr;
  v.num_q_tokens = v.max_q_len = 0;
  v.tree_mask = nullptr;
  v.tree_mask_indptr = nullptr;
  return v;
}

// The call with each sequence's context as its query tokens read it together: the whole context,
// none for a sequence without query tokens (`lens` holds the lengths).
DecodeArgs with_read_lengths(const DecodeArgs& a, std::vector<std::int32_t>& lens) {
  lens.resize(static_cast<std::size_t>(a.batch));
  for (int b = 0; b < a.batch; ++b) {
    lens[b] = a.q_indptr[b + 1] > a.q_indptr[b] ? a.context_lens[b] : 0;
  }
  DecodeArgs v = a;
  v.context_lens = lens.data();
  return v;
}

// Multi-token queries without a window or ALiBi take the query tokens together: every token
// attends a prefix of the context (less, under a tree mask, the new tokens its mask row drops),
// so one pass over each sequence's K/V serves them all, each row masked at its own causal bound
// and tree-mask row (ItemContext::token_group, tree_mask). Rows per query head: the largest n_b
// of the call, so a batch-invariant decode takes each token apart instead (a sequence's rows
// would otherwise run in blocks sized by the batch's longest).
TokenRows tokens_together(const DecodeArgs& a, const DecodeOptions& options) {
  TokenRows tr;
  if (a.q_indptr == nullptr || a.window_left >= 0 || a.alibi_slopes != nullptr ||
      options.batch_invariant) {
    return tr;
  }
  tr.q_indptr = a.q_indptr;
  tr.tokens = 0;
  for (int b = 0; b < a.batch; ++b)
    tr.tokens = std::max(tr.tokens, a.q_indptr[b + 1] - a.q_indptr[b]);
  return tr;
}

// Whether the call may share prefixes: asked for, and not batch-invariant (a sequence's bits
// would depend on the other sequences of its batch).
bool may_share(const DecodeArgs& a, const DecodeOptions& options) {
  return options.share_prefixes && !options.batch_invariant && a.batch >= 2;
}

// The call's shared prefixes' passes, or null: sharing off or no group that pays.
PrefixPasses* prefix_passes(const DecodeArgs& a, const DecodeOptions& options) {
  if (!may_share(a, options)) return nullptr;
  PrefixPasses& passes = caller_state().prefix;
  build_prefix_passes(a, passes);
  return passes.empty() ? nullptr : &passes;
}

}  // namespace

void decode(const DecodeArgs& a, const DecodeOptions& options) {
  PrefixPasses* shared = prefix_passes(a, options);
  if (a.q_indptr == nullptr) {
    decode_sequences(a, options, nullptr, TokenRows{}, nullptr, shared);
    return;
  }
  thread_local std::vector<std::int32_t> lens, rows;
  thread_local std::vector<TreeMaskRow> tree;
  const TokenRows tr = tokens_together(a, options);
  if (tr.q_indptr != nullptr) {
    if (tr.tokens > 0) {
      decode_sequences(with_read_lengths(a, lens), options, nullptr, tr, nullptr, shared);
    }
    return;
  }
  const DecodeArgs v = as_sequences(a, lens, rows, tree);
  if (v.batch > 0) {
    decode_sequences(v, options, rows.data(), TokenRows{}, tree.empty() ? nullptr : tree.data(),
                     shared, a.q_indptr);
  }
}

SharedPrefixes shared_prefixes(const DecodeArgs& a, const DecodeOptions& options) {
  return may_share(a, options) ? find_shared_prefixes(a) : SharedPrefixes{};
}

SplitPlan split_plan(const DecodeArgs& a, const DecodeOptions& options) {
  std::vector<std::int32_t> lens, rows;
  std::vector<TreeMaskRow> tree;
  const TokenRows tr = tokens_together(a, options);
  DecodeArgs v = a;
  if (tr.q_indptr != nullptr) {
    v = with_read_lengths(a, lens);
    v.num_heads *= tr.tokens;
  } else if (a.q_indptr != nullptr) {
    v = as_sequences(a, lens, rows, tree);
  }
  const PlanOptions po = plan_options(v, options, threads_for_call(v, options));
  return make_split_plan(v.context_lens, v.batch, v.num_kv_heads, v.block_size, po);
}

}  // namespace pagedattn::detail::cpu
