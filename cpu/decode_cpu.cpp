// The CPU backend: executes the split plan with OpenMP threads, then combines the splits.
#include <omp.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cpu_kernel.hpp"
#include "pagedattn/detail/backends.hpp"
#include "pagedattn/online_softmax.hpp"
#include "pagedattn/split_plan.hpp"

namespace pagedattn::detail::cpu {
namespace {

using KernelFn = void (*)(const ItemContext&, const WorkItem&, float*, float*, float*, ItemScratch);

template <class Arch>
void kernel_for(const ItemContext& c, const WorkItem& it, float* m, float* l, float* acc,
                ItemScratch s) {
  ItemKernel{}(Arch{}, c, it, m, l, acc, s);
}

struct IsaChoice {
  KernelFn fn;
  const char* name;
};

bool has_avx512() {
  return xsimd::available_architectures().avx512bw && __builtin_cpu_supports("f16c");
}
bool has_avx2() {
  return xsimd::available_architectures().fma3_avx2 && __builtin_cpu_supports("f16c");
}

// The best instruction set of this machine, or the one PAGEDATTN_CPU_ISA names (for testing
// every path on one machine). Chosen once.
IsaChoice choose_isa() {
  const char* env = std::getenv("PAGEDATTN_CPU_ISA");
  const std::string want = env ? env : "";
  if (want.empty() || want == "auto") {
    if (has_avx512()) return {&kernel_for<xsimd::avx512bw>, "avx512"};
    if (has_avx2()) return {&kernel_for<xsimd::fma3<xsimd::avx2>>, "avx2"};
    return {&kernel_for<xsimd::sse2>, "sse2"};
  }
  if (want == "avx512" && has_avx512()) return {&kernel_for<xsimd::avx512bw>, "avx512"};
  if (want == "avx2" && has_avx2()) return {&kernel_for<xsimd::fma3<xsimd::avx2>>, "avx2"};
  if (want == "sse2") return {&kernel_for<xsimd::sse2>, "sse2"};
  fail(ErrorCode::kBackendUnavailable, "PAGEDATTN_CPU_ISA", "'" + want + "'",
       "unknown or not supported by this CPU (expected auto, avx512, avx2 or sse2)");
}

const IsaChoice& isa() {
  static const IsaChoice choice = choose_isa();
  return choice;
}

}  // namespace

const char* active_isa_name() { return isa().name; }

void decode(const DecodeArgs& a, const DecodeOptions& options) {
  const IsaChoice& kernel = isa();
  const int threads = options.num_threads > 0 ? options.num_threads : omp_get_max_threads();
  const int H = a.num_heads, D = a.head_dim, G = a.group_size(), BS = a.block_size;

  PlanOptions po;
  po.parallelism = threads * 4;  // a few items per thread balance uneven contexts
  po.single_split = options.single_split;
  const SplitPlan plan = make_split_plan(a.context_lens, a.batch, a.num_kv_heads, BS, po);

  // q widened once and pre-multiplied by the scale.
  const float scale = a.effective_scale();
  std::vector<float> q_scaled(static_cast<std::size_t>(a.batch) * H * D);
  for (std::size_t i = 0; i < q_scaled.size(); ++i) {
    q_scaled[i] = load_as_float(a.q, a.q_dtype, i) * scale;
  }

  const std::int64_t P = plan.num_partials(H);
  std::vector<float> part_m(P), part_l(P), part_acc(static_cast<std::size_t>(P) * D);

  ItemContext ctx;
  ctx.q_scaled = q_scaled.data();
  ctx.k_cache = a.k_cache;
  ctx.v_cache = a.v_cache;
  ctx.kv_dtype = a.k_dtype;
  ctx.layout = CacheLayout::dense(a.num_blocks, a.num_kv_heads, BS, D);
  ctx.table = BlockTableView{a.block_table, a.max_blocks_per_seq, a.table_stride()};
  ctx.context_lens = a.context_lens;
  ctx.num_heads = H;
  ctx.group_size = G;
  ctx.fault = active_fault();
  const int dropped_splits = ctx.fault == Fault::kDropSplit ? 1 : 0;

  const std::int64_t num_items = static_cast<std::int64_t>(plan.items.size());
  const std::int64_t num_rows = static_cast<std::int64_t>(a.batch) * H;
#pragma omp parallel num_threads(threads)
  {
    std::vector<float> scores(static_cast<std::size_t>(G) * BS);
    std::vector<float> merged(D), finished(D);

#pragma omp for schedule(dynamic, 1)
    for (std::int64_t i = 0; i < num_items; ++i) {
      const WorkItem& it = plan.items[i];
      const std::int64_t p0 = plan.partial_index(it.seq, it.split, it.kv_head * G, H);
      kernel.fn(ctx, it, &part_m[p0], &part_l[p0], &part_acc[p0 * D], ItemScratch{scores.data()});
    }

    // Combine: merge each (sequence, head)'s splits in split order (deterministic), finalize.
#pragma omp for schedule(static)
    for (std::int64_t row = 0; row < num_rows; ++row) {
      const int b = static_cast<int>(row / H), h = static_cast<int>(row % H);
      SoftmaxState state = SoftmaxState::empty();
      std::fill(merged.begin(), merged.end(), 0.f);
      const int splits =
          plan.num_splits[b] > 1 ? plan.num_splits[b] - dropped_splits : plan.num_splits[b];
      for (int s = 0; s < splits; ++s) {
        const std::int64_t p = plan.partial_index(b, s, h, H);
        softmax_merge(state, merged.data(), SoftmaxState{part_m[p], part_l[p]}, &part_acc[p * D],
                      D);
      }
      const float lse = softmax_finalize(state, merged.data(), finished.data(), D);
      for (int d = 0; d < D; ++d) store_from_float(a.out, a.out_dtype, row * D + d, finished[d]);
      if (a.lse) a.lse[row] = lse;
    }
  }
}

}  // namespace pagedattn::detail::cpu
