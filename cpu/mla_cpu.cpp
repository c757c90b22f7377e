// MLA decode on the CPU backend (pagedattn/mla.hpp): q widened to f32 and scaled once, the split
// plan over the sequences' contexts (one "kv head": the latent row), the item kernel of the
// machine's instruction set (mla_kernel.hpp, isa_choice.hpp) on every (sequence, split), then the
// combine of each row's splits in split order. Every latent row is read once per split for all
// of a sequence's query tokens and heads.
#include <omp.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "isa_choice.hpp"
#include "mla_kernel.hpp"
#include "pagedattn/detail/backends.hpp"
#include "pagedattn/mla_validate.hpp"
#include "pagedattn/online_softmax.hpp"
#include "pagedattn/split_plan.hpp"
#include "work_threads.hpp"

namespace pagedattn::detail::cpu {
namespace {

// n values of `dtype` from element `at` of `base` as f32 times `scale` into dst.
void widen(const void* base, DType dtype, std::int64_t at, int n, float scale, float* dst) {
  switch (dtype) {
    case DType::kF32: {
      const float* p = static_cast<const float*>(base) + at;
      for (int i = 0; i < n; ++i) dst[i] = p[i] * scale;
      return;
    }
    case DType::kBF16: {
      const bf16_t* p = static_cast<const bf16_t*>(base) + at;
      for (int i = 0; i < n; ++i) dst[i] = bf16_to_float(p[i]) * scale;
      return;
    }
    case DType::kF16: {
      const f16_t* p = static_cast<const f16_t*>(base) + at;
      for (int i = 0; i < n; ++i) dst[i] = f16_to_float(p[i]) * scale;
      return;
    }
    default: {  // fp8: every code's value, from a table
      static const auto tables = [] {
        std::array<std::array<float, 256>, 2> t{};
        for (int i = 0; i < 256; ++i) {
          t[0][i] = fp8_e4m3_to_float(fp8_e4m3_t{static_cast<std::uint8_t>(i)});
          t[1][i] = fp8_e5m2_to_float(fp8_e5m2_t{static_cast<std::uint8_t>(i)});
        }
        return t;
      }();
      const std::array<float, 256>& t = tables[dtype == DType::kFP8E4M3 ? 0 : 1];
      const std::uint8_t* p = static_cast<const std::uint8_t*>(base) + at;
      for (int i = 0; i < n; ++i) dst[i] = t[p[i]] * scale;
      return;
    }
  }
}

// Query tokens of sequence b.
int query_tokens(const MlaDecodeArgs& a, int b) {
  return a.q_indptr ? a.q_indptr[b + 1] - a.q_indptr[b] : 1;
}

// q_nope and q_pe of every row as one f32 row of width values per head, times the scale.
void widen_queries(const MlaDecodeArgs& a, std::vector<float>& q) {
  const int H = a.num_heads, R = a.kv_lora_rank, W = a.row_width();
  const int rows = a.q_rows();
  const float scale = a.effective_scale();
  q.resize(static_cast<std::size_t>(rows) * H * W);
  for (int r = 0; r < rows; ++r) {
    for (int h = 0; h < H; ++h) {
      float* dst = q.data() + (static_cast<std::int64_t>(r) * H + h) * W;
      const std::int64_t n0 = r * a.q_nope_row() + h * a.q_nope_head();
      const std::int64_t p0 = r * a.q_pe_row() + h * a.q_pe_head();
      for (int d = 0; d < R; ++d) {
        dst[d] = load_as_float(a.q_nope, a.q_dtype, static_cast<std::size_t>(n0 + d)) * scale;
      }
      for (int d = R; d < W; ++d) {
        dst[d] = load_as_float(a.q_pe, a.q_dtype, static_cast<std::size_t>(p0 + d - R)) * scale;
      }
    }
  }
}

// Row r of sequence b (query token r / num_heads, head r % num_heads): its splits' states merged
// in split order, written to out and lse.
void combine_row(const MlaDecodeArgs& a, const SplitPlan& plan, int max_rows, const float* m,
                 const float* l, const float* acc, int b, int r, float* merged) {
  const int H = a.num_heads, R = a.kv_lora_rank;
  SoftmaxState st = SoftmaxState::empty();
  std::fill(merged, merged + R, 0.f);
  for (int s = 0; s < plan.num_splits[b]; ++s) {
    const std::int64_t p = static_cast<std::int64_t>(plan.split_offset[b] + s) * max_rows + r;
    softmax_merge(st, merged, SoftmaxState{m[p], l[p]}, acc + p * R, R);
  }
  const int row = (a.q_indptr ? a.q_indptr[b] : b) + r / H, h = r % H;
  const float inv = st.inv_sum();
  const std::int64_t o0 = row * a.out_row() + static_cast<std::int64_t>(h) * R;
  for (int d = 0; d < R; ++d) {
    store_from_float(a.out, a.out_dtype, static_cast<std::size_t>(o0 + d), merged[d] * inv);
  }
  if (a.lse != nullptr) a.lse[static_cast<std::int64_t>(row) * H + h] = st.lse();
}

}  // namespace

void widen_latent_rows(const MlaItemContext& c, int id, int n, float* rows) {
  for (int t = 0; t < n; ++t) {
    float* dst = rows + static_cast<std::int64_t>(t) * c.width;
    widen(c.c_cache, c.kv_dtype, id * c.c.block + t * c.c.token, c.rank, c.kv_scale, dst);
    if (c.width == c.rank) continue;  // no k_pe (rope_dim 0)
    widen(c.kpe_cache, c.kv_dtype, id * c.kpe.block + t * c.kpe.token, c.width - c.rank, c.kv_scale,
          dst + c.rank);
  }
}

void mla_decode(const MlaDecodeArgs& a, const DecodeOptions& options) {
  const int H = a.num_heads, R = a.kv_lora_rank, W = a.row_width(), BS = a.block_size;
  // A sequence without query tokens reads nothing: its plan has no splits.
  std::vector<std::int32_t> lens(static_cast<std::size_t>(a.batch));
  std::int64_t tokens = 0;
  int max_q = 0;
  for (int b = 0; b < a.batch; ++b) {
    const int n_q = query_tokens(a, b);
    lens[b] = n_q > 0 ? a.context_lens[b] : 0;
    tokens += lens[b];
    max_q = std::max(max_q, n_q);
  }
  const int requested = options.num_threads > 0 ? options.num_threads : omp_get_max_threads();
  const int threads =
      threads_for_work(requested, tokens * W * static_cast<std::int64_t>(dtype_size(a.kv_dtype)));
  constexpr int kTasksPerThread = 8;
  PlanOptions po;
  po.parallelism = threads * kTasksPerThread;
  po.single_split = options.single_split;
  if (options.batch_invariant) make_batch_invariant(po);
  const SplitPlan plan = make_split_plan(lens.data(), a.batch, 1, BS, po);

  const int max_rows = max_q * H;  // rows of one (sequence, split)'s partial states
  const std::int64_t parts = static_cast<std::int64_t>(plan.total_splits()) * max_rows;
  thread_local std::vector<float> q, states;
  widen_queries(a, q);
  states.resize(static_cast<std::size_t>(parts) * (R + 2));
  float* m = states.data();
  float* l = m + parts;
  float* acc = l + parts;
  MlaItemContext ctx{q.data(),
                     H,
                     R,
                     W,
                     BS,
                     a.c_cache,
                     a.kpe_cache,
                     a.kv_dtype,
                     a.kv_scale,
                     a.c_layout(),
                     a.kpe_layout(),
                     BlockTableView{a.block_table, a.max_blocks_per_seq, a.table_stride()},
                     a.context_lens,
                     a.q_indptr};
  const MlaKernelFn kernel = isa().mla_fn;
  const std::int64_t items = static_cast<std::int64_t>(plan.items.size());
  const std::int64_t rows = static_cast<std::int64_t>(a.batch) * max_rows;
  const auto body = [&] {
    thread_local std::vector<float> block_rows, scores, merged;
    block_rows.resize(static_cast<std::size_t>(BS) * W);
    scores.resize(static_cast<std::size_t>(kMlaRowTile) * BS);
    merged.resize(static_cast<std::size_t>(R));
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t i = 0; i < items; ++i) {
      const WorkItem& it = plan.items[i];
      const std::int64_t p0 =
          static_cast<std::int64_t>(plan.split_offset[it.seq] + it.split) * max_rows;
      kernel(ctx, it, m + p0, l + p0, acc + p0 * R, MlaScratch{block_rows.data(), scores.data()});
    }
#pragma omp for schedule(dynamic, 8)
    for (std::int64_t i = 0; i < rows; ++i) {
      const int b = static_cast<int>(i / max_rows), r = static_cast<int>(i % max_rows);
      if (r >= query_tokens(a, b) * H) continue;
      combine_row(a, plan, max_rows, m, l, acc, b, r, merged.data());
    }
  };
  if (threads > 1) {
#pragma omp parallel num_threads(threads)
    body();
  } else {
    body();
  }
}

}  // namespace pagedattn::detail::cpu
