// The fast CPU kernel's own risks: every instruction set's kernel in one run (whatever
// PAGEDATTN_CPU_ISA picks), head tiles that do not divide the group, token tiles that do not
// divide the block, long contexts split across threads, and the scratch and plan the backend
// keeps across calls (reused, invalidated and thread-safe).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "cpu_kernel.hpp"
#include "kernel_context.hpp"
#include "pagedattn/online_softmax.hpp"
#include "pagedattn/reference.hpp"
#include "pagedattn/testing/random_case.hpp"
#include "reference_check.hpp"
#include "test_seed.hpp"

namespace pagedattn {
namespace {

using detail::cpu::ItemContext;
using detail::cpu::ItemKernel;
using detail::cpu::ItemScratch;

testing::CaseSpec spec_of(int heads, int kv_heads, int head_dim, int block_size,
                          std::vector<int> lens, DType dtype, std::uint64_t salt) {
  testing::CaseSpec s =
      testing::shaped_spec(dtype, heads, kv_heads, head_dim, block_size, std::move(lens));
  s.table_padding = 2;
  s.spare_blocks = 4;
  s.seed = testing::seed_for(salt);
  return s;
}

using testing::expect_matches_reference;

// Runs one instruction set's kernel over every (sequence, kv head) as a single item, finalizes
// in f32 and compares with the f64 reference. all_kv_heads: one call per sequence covering every
// kv head block by block, with the q buffer that lets the kernel widen bf16 in pairs (the path
// the backend takes); otherwise one call per (sequence, kv head) without it. fn: run this kernel
// (kernel_for_isa) instead of Arch's ItemKernel. bf16_weights: the weights may be rounded to bf16
// for P.V (the backend's setting for a bf16 out), compared at the bf16 out tolerance.
template <class Arch>
void check_kernel_on(Arch, const char* name, const testing::CaseSpec& spec,
                     bool all_kv_heads = false, detail::cpu::KernelFn fn = nullptr,
                     bool bf16_weights = false) {
  testing::HostCase c = testing::make_case(spec);
  const DecodeArgs a = c.args();
  const int H = a.num_heads, D = a.head_dim, G = a.group_size();
  std::vector<float> q;
  ItemContext ctx = item_context(a, q);
  ctx.bf16_weights = bf16_weights;
  alignas(64) float scores[detail::cpu::kHeadTile * 256];
  const int KV = a.num_kv_heads;
  std::vector<float> m(KV * G), l(KV * G), acc(static_cast<std::size_t>(KV) * G * D);
  std::vector<float> q_buffer(static_cast<std::size_t>(H) * D + 16);

  const ReferenceResult ref = reference_decode(a);
  double scale = 1e-30, err = 0, lse_err = 0;
  for (int b = 0; b < a.batch; ++b) {
    const int L = a.context_lens[b];
    if (all_kv_heads) {
      const WorkItem item{b, 0, 0, 0, blocks_for(L, a.block_size)};
      const ItemScratch scratch{scores, q_buffer.data()};
      if (fn) {
        fn(ctx, item, KV, m.data(), l.data(), acc.data(), scratch);
      } else {
        ItemKernel{}(Arch{}, ctx, item, KV, m.data(), l.data(), acc.data(), scratch);
      }
    }
    for (int kv = 0; kv < KV; ++kv) {
      int s0 = kv * G;  // this kv head's first state in m, l and acc
      if (!all_kv_heads) {
        const WorkItem item{b, kv, 0, 0, blocks_for(L, a.block_size)};
        if (fn) {
          fn(ctx, item, 1, m.data(), l.data(), acc.data(), ItemScratch{scores});
        } else {
          ItemKernel{}(Arch{}, ctx, item, m.data(), l.data(), acc.data(), ItemScratch{scores});
        }
        s0 = 0;
      }
      for (int g = 0; g < G; ++g) {
        const std::size_t row = static_cast<std::size_t>(b) * H + kv * G + g;
        const SoftmaxState st{m[s0 + g], l[s0 + g]};
        const float inv = st.inv_sum();
        for (int d = 0; d < D; ++d) {
          const double want = ref.out[row * D + d];
          scale = std::max(scale, std::fabs(want));
          const float got = acc[static_cast<std::size_t>(s0 + g) * D + d];
          // A NaN difference counts as infinite: std::max would drop it.
          const double diff = std::fabs(got * inv - want);
          err = std::isnan(diff) ? INFINITY : std::max(err, diff);
        }
        const double lse = st.lse(), want_lse = ref.lse[row];
        if (std::isinf(want_lse)) {
          EXPECT_EQ(lse, want_lse) << name << " row " << row;
        } else {
          const double lse_diff = std::fabs(lse - want_lse);
          lse_err = std::isnan(lse_diff) ? INFINITY : std::max(lse_err, lse_diff);
        }
      }
    }
  }
  SCOPED_TRACE(std::string(name) + (bf16_weights ? " bf16 weights: " : ": ") +
               testing::describe(spec) + " " + testing::seed_note(spec.seed));
  EXPECT_LE(err / scale, testing::out_tolerance(bf16_weights ? DType::kBF16 : DType::kF32));
  EXPECT_LE(lse_err, testing::lse_tolerance());
}

void check_every_kernel(const testing::CaseSpec& spec, bool all_kv_heads = false) {
#if PAGEDATTN_CPU_X86
  check_kernel_on(xsimd::sse2{}, "sse2", spec, all_kv_heads);
  if (xsimd::available_architectures().fma3_avx2 && __builtin_cpu_supports("f16c")) {
    check_kernel_on(xsimd::fma3<xsimd::avx2>{}, "avx2", spec, all_kv_heads);
  }
  if (xsimd::available_architectures().avx512bw && __builtin_cpu_supports("f16c")) {
    check_kernel_on(xsimd::avx512bw{}, "avx512", spec, all_kv_heads);
  }
  // Q.K as bf16 dot products where the CPU has AVX-512 BF16 (bf16 q and cache; else avx512).
  if (const detail::cpu::KernelFn fn = detail::cpu::kernel_for_isa("avx512bf16")) {
    check_kernel_on(xsimd::avx512bw{}, "avx512bf16", spec, all_kv_heads, fn);
    // And P.V on vdpbf16ps, as for a bf16 out (only the bf16 q and cache take it).
    check_kernel_on(xsimd::avx512bw{}, "avx512bf16", spec, all_kv_heads, fn, true);
  }
  // Q.K on AMX tiles where the CPU has AMX (bf16 q and cache, groups that are multiples of 8,
  // with the q buffer; else the avx512 kernel).
  if (const detail::cpu::KernelFn fn = detail::cpu::kernel_for_isa("amx")) {
    check_kernel_on(xsimd::avx512bw{}, "amx", spec, all_kv_heads, fn);
    check_kernel_on(xsimd::avx512bw{}, "amx", spec, all_kv_heads, fn, true);
  }
#elif PAGEDATTN_CPU_ARM64
  check_kernel_on(xsimd::neon64{}, "neon", spec, all_kv_heads);
#endif
}

TEST(CpuPerfKernel, EveryIsaOnOddGroupsAndBlocks) {
  // Groups 2, 3, 5, 6 leave partial head tiles; blocks 5, 13, 31 leave partial token tiles.
  std::uint64_t salt = 1;
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (int group : {2, 3, 5, 6}) {
      for (int bs : {5, 13, 31}) {
        check_every_kernel(spec_of(2 * group, 2, 64, bs, {0, 1 + bs * 3, 97}, t, salt++));
      }
    }
    check_every_kernel(spec_of(8, 1, 112, 16, {300, 17}, t, salt++));
    check_every_kernel(spec_of(4, 2, 192, 256, {600, 255}, t, salt++));
    check_every_kernel(spec_of(6, 2, 512, 13, {300, 14}, t, salt++));
  }
}

TEST(CpuPerfKernel, EveryIsaOverAllKvHeadsWithPairedWidening) {
  // The backend's path: one call per (sequence, split) over every kv head, block by block, with
  // the q buffer (bf16 widened in pairs where head_dim allows; 80 and 112 on AVX2 do not).
  std::uint64_t salt = 200;
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (int group : {1, 3, 4, 8}) {
      for (int d : {64, 80, 128}) {
        check_every_kernel(spec_of(4 * group, 4, d, 16, {0, 1 + 16 * 5, 97}, t, salt++), true);
      }
    }
    check_every_kernel(spec_of(12, 3, 112, 7, {300, 20}, t, salt++), true);
    check_every_kernel(spec_of(8, 2, 256, 32, {600, 33}, t, salt++), true);
    for (int group : {1, 4, 8}) {
      check_every_kernel(spec_of(2 * group, 2, 512, 16, {0, 1 + 16 * 5, 97}, t, salt++), true);
    }
  }
}

TEST(CpuPerfKernel, LongContextSplitAcrossThreads) {
  // One kv head, one sequence: only splitting the context can use more than one thread.
  for (DType t : {DType::kF32, DType::kBF16}) {
    testing::HostCase c =
        testing::make_case(spec_of(4, 1, 128, 16, {20000}, t, 100 + static_cast<int>(t)));
    DecodeOptions o;
    o.backend = Backend::kCpu;
    o.num_threads = 2;
    decode(c.args(), o);
    expect_matches_reference(c, "split");
  }
}

TEST(CpuPerfKernel, PlanAndScratchFollowChangingShapes) {
  // The backend keeps its plan and buffers across calls: new lengths in the same array, a new
  // batch and a new head_dim must each be planned and sized afresh.
  DecodeOptions o;
  o.backend = Backend::kCpu;
  o.num_threads = 2;
  testing::HostCase big = testing::make_case(spec_of(8, 2, 128, 16, {3000, 900}, DType::kF32, 7));
  decode(big.args(), o);
  expect_matches_reference(big, "first call");

  testing::HostCase same = testing::make_case(spec_of(8, 2, 128, 16, {3000, 900}, DType::kF32, 8));
  same.context_lens = {40, 899};  // same batch and array size, fewer blocks for both
  decode(same.args(), o);
  expect_matches_reference(same, "new lengths");

  testing::HostCase small =
      testing::make_case(spec_of(16, 4, 64, 8, {1, 0, 77, 8, 9}, DType::kBF16, 9));
  decode(small.args(), o);
  expect_matches_reference(small, "smaller shape");
  decode(big.args(), o);
  expect_matches_reference(big, "back to the first shape");
}

TEST(CpuPerfKernel, ConcurrentCallersDoNotShareState) {
  std::vector<testing::HostCase> cases;
  for (int i = 0; i < 4; ++i) {
    cases.push_back(testing::make_case(spec_of(4 * (i + 1), i + 1, i % 2 ? 64 : 128, 16,
                                               std::vector<int>(1 + i, 500 + 300 * i),
                                               i % 2 ? DType::kF16 : DType::kF32, 20 + i)));
  }
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&cases, i] {
      DecodeOptions o;
      o.backend = Backend::kCpu;
      o.num_threads = 2;
      for (int rep = 0; rep < 5; ++rep) decode(cases[i].args(), o);
    });
  }
  for (std::thread& t : threads) t.join();
  for (testing::HostCase& c : cases) expect_matches_reference(c, "concurrent");
}

}  // namespace
}  // namespace pagedattn
