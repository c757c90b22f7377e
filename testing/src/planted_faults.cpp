#include "pagedattn/testing/planted_faults.hpp"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "pagedattn/detail/dispatch.hpp"
#include "pagedattn/split_plan.hpp"
#include "pagedattn/variants.hpp"

namespace pagedattn::testing {
namespace {

// p moved by `elements` elements of dtype t.
const void* at(const void* p, DType t, std::int64_t elements) {
  return static_cast<const std::uint8_t*>(p) + elements * static_cast<std::int64_t>(dtype_size(t));
}
void* at(void* p, DType t, std::int64_t elements) {
  return static_cast<std::uint8_t*>(p) + elements * static_cast<std::int64_t>(dtype_size(t));
}

// A call with one query token per sequence, as the CPU backend runs it: with q_indptr, query
// token r of sequence b becomes sequence r, over a copy of b's table row, with the context up to
// its own position (pagedattn.hpp, DecodeArgs::q_indptr); without, the call itself.
struct OneTokenCall {
  DecodeArgs args;
  std::vector<std::int32_t> lens, table;

  explicit OneTokenCall(const DecodeArgs& a) : args(a) {
    if (a.q_indptr == nullptr) return;
    for (int b = 0; b < a.batch; ++b) {
      const int n_q = a.q_indptr[b + 1] - a.q_indptr[b];
      const std::int32_t* row = a.block_table + static_cast<std::int64_t>(b) * a.table_stride();
      for (int i = 0; i < n_q; ++i) {
        lens.push_back(std::max(0, a.context_lens[b] - n_q + i + 1));
        table.insert(table.end(), row, row + a.max_blocks_per_seq);
      }
    }
    args.batch = a.num_q_tokens;
    args.context_lens = lens.data();
    args.block_table = table.data();
    args.block_table_stride = 0;
    args.q_indptr = nullptr;
    args.num_q_tokens = args.max_q_len = 0;
  }
};

// A context whose last block is partial reads one slot more (a `<=` for a `<` in the last
// block's slot count): the call again with those contexts one token longer, which stays within
// their blocks.
void last_block_off_by_one(const DecodeArgs& a, const detail::DecodeOptions& o) {
  const OneTokenCall call(a);
  if (call.args.batch == 0) return;
  std::vector<std::int32_t> lens(call.args.context_lens, call.args.context_lens + call.args.batch);
  for (std::int32_t& L : lens) L += L % a.block_size != 0;
  DecodeArgs v = call.args;
  v.context_lens = lens.data();
  detail::decode(v, o);
}

// The heads of kv head 1 read kv head 0's keys and values (a wrong kv head in the cache offset):
// those heads again, as a call of their own over kv head 0's rows (the caches' own pointers and
// strides, one kv head), with their own queries, scales and sinks, and kv head 0's ALiBi slopes,
// which the same wrong index picks.
void wrong_kv_head(const DecodeArgs& a, const detail::DecodeOptions& o) {
  if (a.num_kv_heads < 2) return;
  const int G = a.group_size(), H = a.num_heads;
  const std::int64_t head1 = static_cast<std::int64_t>(G) * a.head_dim;
  const CacheLayout layout = a.cache_layout();
  DecodeArgs v = a;
  v.num_heads = G;
  v.num_kv_heads = 1;
  v.kv_strides = CacheStrides{layout.block_stride, layout.head_stride, layout.token_stride};
  v.q = at(a.q, a.q_dtype, head1);
  v.q_row_stride = a.q_stride();
  v.out = at(a.out, a.out_dtype, head1);
  v.out_row_stride = a.out_stride();
  if (a.k_scales != nullptr) v.k_scales = a.k_scales + 1;
  if (a.v_scales != nullptr) v.v_scales = a.v_scales + 1;
  if (a.sinks != nullptr) v.sinks = a.sinks + G;
  std::vector<float> lse(static_cast<std::size_t>(a.q_rows()) * G);
  v.lse = a.lse != nullptr ? lse.data() : nullptr;
  detail::decode(v, o);
  for (int r = 0; a.lse != nullptr && r < a.q_rows(); ++r) {
    std::copy_n(&lse[static_cast<std::size_t>(r) * G], G,
                a.lse + static_cast<std::int64_t>(r) * H + G);
  }
}

// A sequence the plan splits loses its last split (a combine that stops one split early): each
// such sequence again over the tokens before that split, [first, kept). Its window then ends at
// kept, and ALiBi measures from kept - 1, which moves every bias of head h by
// shift_h = slope_h (L - kept); the sink moves with them and lse back, so the weights are those
// of the kept tokens under the true biases.
void drop_split(const DecodeArgs& a, const detail::DecodeOptions& o) {
  const OneTokenCall call(a);
  const DecodeArgs& s = call.args;
  const SplitPlan plan = detail::cpu::split_plan(s, o);
  std::vector<std::int32_t> kept(static_cast<std::size_t>(s.batch), -1);
  for (const WorkItem& it : plan.items) {
    const int splits = plan.num_splits[it.seq];
    if (splits > 1 && it.split == splits - 1) kept[it.seq] = it.block_begin * s.block_size;
  }
  const int H = s.num_heads;
  std::vector<float> lse(H), sinks(H), shift(H);
  for (int r = 0; r < s.batch; ++r) {
    if (kept[r] < 0) continue;
    const int L = s.context_lens[r];
    for (int h = 0; h < H; ++h) {
      shift[h] =
          s.alibi_slopes != nullptr ? s.alibi_slopes[h] * static_cast<float>(L - kept[r]) : 0.f;
      if (s.sinks != nullptr) sinks[h] = s.sinks[h] + shift[h];
    }
    DecodeArgs v = s;
    v.batch = 1;
    v.context_lens = &kept[r];
    v.block_table = s.block_table + static_cast<std::int64_t>(r) * s.table_stride();
    v.q = at(s.q, s.q_dtype, r * s.q_stride());
    v.out = at(s.out, s.out_dtype, r * s.out_stride());
    v.lse = lse.data();
    if (s.window_left >= 0) v.window_left = kept[r] - 1 - window_first_token(L, s.window_left);
    if (s.sinks != nullptr) v.sinks = sinks.data();
    detail::decode(v, o);
    for (int h = 0; s.lse != nullptr && h < H; ++h) {
      s.lse[static_cast<std::int64_t>(r) * H + h] = lse[h] - shift[h];
    }
  }
}

// The planner ignores DecodeOptions::batch_invariant: the call again with the default plan, whose
// splits follow the batch's size and the thread count.
void batch_dependent_plan(const DecodeArgs& a, const detail::DecodeOptions& o) {
  if (!o.batch_invariant) return;
  detail::DecodeOptions v = o;
  v.batch_invariant = false;
  detail::decode(a, v);
}

}  // namespace

void decode_with_fault(const DecodeArgs& args, const detail::DecodeOptions& options, Fault fault) {
  detail::decode(args, options);
  if (fault == Fault::kNone || args.batch == 0 ||
      resolve_backend(options.backend) != Backend::kCpu) {
    return;
  }
  switch (fault) {
    case Fault::kLastBlockOffByOne:
      last_block_off_by_one(args, options);
      break;
    case Fault::kWrongKvHead:
      wrong_kv_head(args, options);
      break;
    case Fault::kDropSplit:
      drop_split(args, options);
      break;
    case Fault::kBatchDependentPlan:
      batch_dependent_plan(args, options);
      break;
    case Fault::kNone:
      break;
  }
}

}  // namespace pagedattn::testing
