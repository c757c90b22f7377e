// DecodeOptions::batch_invariant: a sequence's out and lse are bitwise the same whatever else is in
// the batch. The same sequences (one-token and multi-token, every dtype pair the backends run,
// with and without the variants) are decoded inside random batches (other sequences, other batch
// sizes, other positions, other thread counts on the CPU, a short and a long neighbour changing
// the default planner's split pressure) and their bits compared across batches, on each backend.
// That each batch's results are right is the reference tests' job; this file checks that they do
// not move.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cuda_device.hpp"
#include "gtest_printers.hpp"
#include "pagedattn/split_plan.hpp"
#include "pagedattn/testing/device_case.hpp"
#include "pagedattn/testing/random_case.hpp"
#include "test_seed.hpp"
#include "variant_args.hpp"

namespace pagedattn {
namespace {

// A pool of sequences over one cache: each sequence's context, table row and query rows.
struct Pool {
  testing::HostCase c;      // caches, block table and context lengths of every sequence
  std::vector<int> q_lens;  // query tokens per sequence
  std::vector<int> row0;    // its first row of q
  std::vector<std::uint8_t> q;
  int rows = 0;
};

Pool make_pool(const testing::CaseSpec& spec, const std::vector<int>& q_lens, std::uint64_t seed) {
  Pool p;
  p.c = testing::make_case(spec);
  p.q_lens = q_lens;
  for (int n : q_lens) {
    p.row0.push_back(p.rows);
    p.rows += n;
  }
  const std::size_t row_bytes =
      static_cast<std::size_t>(spec.num_heads) * spec.head_dim * dtype_size(spec.q_dtype);
  p.q.resize(p.rows * row_bytes);
  std::mt19937_64 rng(seed ^ 0x5eedu);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  const std::size_t n = p.q.size() / dtype_size(spec.q_dtype);
  for (std::size_t i = 0; i < n; ++i) {
    const float x = u(rng);
    switch (spec.q_dtype) {
      case DType::kF32:
        std::memcpy(&p.q[4 * i], &x, 4);
        break;
      case DType::kF16: {
        const f16_t h = float_to_f16(x);
        std::memcpy(&p.q[2 * i], &h, 2);
        break;
      }
      default: {
        const bf16_t h = float_to_bf16(x);
        std::memcpy(&p.q[2 * i], &h, 2);
        break;
      }
    }
  }
  return p;
}

// What a decode wrote for one sequence: its rows of out (bytes) and of lse.
struct SeqBits {
  std::vector<std::uint8_t> out;
  std::vector<float> lse;
};

// Decodes the pool's sequences `ids`, in that order, as one batch; returns each one's bits.
std::vector<SeqBits> decode_batch(Pool& p, const std::vector<int>& ids, const Variants& v,
                                  Backend backend, int threads) {
  const testing::CaseSpec& s = p.c.spec;
  DecodeArgs a = with_variants(p.c.args(), v);
  const int B = static_cast<int>(ids.size());
  const std::size_t q_row = static_cast<std::size_t>(s.num_heads) * s.head_dim;
  const std::size_t q_bytes = q_row * dtype_size(s.q_dtype);
  const std::size_t out_bytes = q_row * dtype_size(s.out_dtype);
  std::vector<std::int32_t> lens, table, indptr{0};
  std::vector<std::uint8_t> q;
  for (int id : ids) {
    lens.push_back(p.c.context_lens[id]);
    const std::int32_t* row = p.c.block_table.data() + std::size_t(id) * p.c.table_stride;
    table.insert(table.end(), row, row + p.c.table_stride);
    q.insert(q.end(), p.q.begin() + p.row0[id] * q_bytes,
             p.q.begin() + (p.row0[id] + p.q_lens[id]) * q_bytes);
    indptr.push_back(indptr.back() + p.q_lens[id]);
  }
  const int rows = indptr.back();
  std::vector<std::uint8_t> out(rows * out_bytes, 0xff);  // NaN in every float dtype
  std::vector<float> lse(std::size_t(rows) * s.num_heads, std::numeric_limits<float>::quiet_NaN());
  a.batch = B;
  a.context_lens = lens.data();
  a.block_table = table.data();
  a.q = q.data();
  a.out = out.data();
  a.lse = lse.data();
  a.q_indptr = indptr.data();
  a.num_q_tokens = rows;
  a.max_q_len = *std::max_element(p.q_lens.begin(), p.q_lens.end());
  detail::DecodeOptions o;
  o.batch_invariant = true;
  o.num_threads = threads;
  if (backend == Backend::kCuda) {
    testing::cuda_decode_from_host(a, o);
  } else {
    o.backend = Backend::kCpu;
    decode(a, o);
  }
  std::vector<SeqBits> bits(B);
  for (int i = 0; i < B; ++i) {
    const std::size_t r0 = indptr[i], r1 = indptr[i + 1];
    bits[i].out.assign(out.begin() + r0 * out_bytes, out.begin() + r1 * out_bytes);
    bits[i].lse.assign(lse.begin() + r0 * s.num_heads, lse.begin() + r1 * s.num_heads);
  }
  return bits;
}

struct InvariantParam {
  Backend backend;
  DType q, kv, out;
  int head_dim;
  int group;
  bool multi;  // several query tokens per sequence
  bool variants;
};

void PrintTo(const InvariantParam& p, std::ostream* os) {
  *os << (p.backend == Backend::kCuda ? "cuda" : "cpu") << "_q" << dtype_name(p.q) << "_kv"
      << dtype_name(p.kv) << "_out" << dtype_name(p.out) << "_d" << p.head_dim << "_g" << p.group
      << (p.multi ? "_multi" : "_one") << (p.variants ? "_variants" : "_plain");
}

class BatchInvariant : public ::testing::TestWithParam<InvariantParam> {};

TEST_P(BatchInvariant, SequencesKeepTheirBitsInEveryBatch) {
  const InvariantParam& prm = GetParam();
  if (prm.backend == Backend::kCuda) SKIP_WITHOUT_CUDA();
  const std::uint64_t seed = testing::seed_for_test();
  std::mt19937_64 rng(seed);
  // Contexts of 0 and 1 token, block boundaries, one split and many, and one long neighbour
  // (the default planner would split everything else less around it).
  std::vector<int> lens = {0, 1, 16, 17, 130, 511, 512, 513, 1100, 2900, 6000};
  std::vector<int> q_lens(lens.size(), 1);
  if (prm.multi) {
    for (std::size_t i = 0; i < lens.size(); ++i) {
      q_lens[i] = 1 + static_cast<int>(rng() % 5);
      lens[i] = std::max(lens[i], q_lens[i] - 1);  // at most one query token before the context
    }
  }
  testing::CaseSpec spec = testing::shaped_spec(prm.q, 4 * prm.group, 4, prm.head_dim, 16, lens);
  spec.seed = seed;
  spec.kv_dtype = prm.kv;
  spec.out_dtype = prm.out;
  if (is_fp8(prm.kv)) spec.k_scale = spec.v_scale = 0.5f;
  Pool pool = make_pool(spec, q_lens, seed);
  Variants v;
  if (prm.variants) {
    v.window_left = 700;
    v.soft_cap = 30.f;
    v.slopes = alibi_slopes(spec.num_heads);
    v.sinks = sink_logits(spec.num_heads);
  }
  const int n = static_cast<int>(lens.size());
  std::vector<SeqBits> first(n);
  std::vector<bool> seen(n, false);
  std::vector<int> all(n);
  std::iota(all.begin(), all.end(), 0);
  // Each sequence alone, then the whole pool, then random batches in random orders.
  std::vector<std::vector<int>> batches;
  for (int i = 0; i < n; ++i) batches.push_back({i});
  batches.push_back(all);
  for (int r = 0; r < 6; ++r) {
    std::vector<int> ids = all;
    std::shuffle(ids.begin(), ids.end(), rng);
    ids.resize(1 + rng() % n);
    batches.push_back(ids);
  }
  for (std::size_t k = 0; k < batches.size(); ++k) {
    const std::vector<int>& ids = batches[k];
    const int threads = 1 + static_cast<int>(k % 4);
    const std::vector<SeqBits> bits = decode_batch(pool, ids, v, prm.backend, threads);
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const int id = ids[i];
      if (!seen[id]) {
        first[id] = bits[i];
        seen[id] = true;
        continue;
      }
      std::ostringstream what;
      what << "sequence " << id << " (context " << lens[id] << ", " << q_lens[id]
           << " query tokens) at position " << i << " of a batch of " << ids.size() << ", "
           << threads << " CPU threads; " << testing::seed_note(seed);
      ASSERT_EQ(bits[i].out, first[id].out) << "out differs: " << what.str();
      ASSERT_EQ(std::memcmp(bits[i].lse.data(), first[id].lse.data(), bits[i].lse.size() * 4), 0)
          << "lse differs: " << what.str();
    }
  }
}

std::vector<InvariantParam> invariant_params() {
  std::vector<InvariantParam> ps;
  const DType bf = DType::kBF16, f32 = DType::kF32, f16 = DType::kF16, e4 = DType::kFP8E4M3;
  for (Backend b : {Backend::kCpu, Backend::kCuda}) {
    for (bool multi : {false, true}) {
      for (bool variants : {false, true}) {
        ps.push_back({b, bf, bf, bf, 128, 8, multi, variants});     // tensor cores, group 8
        ps.push_back({b, f32, f32, f32, 128, 2, multi, variants});  // tf32 from 3 rows on
        ps.push_back({b, bf, e4, bf, 128, 4, multi, variants});
        ps.push_back({b, f16, f16, f32, 64, 16, multi, variants});  // P's lo half
        ps.push_back({b, bf, bf, bf, 128, 32, multi, variants});    // many rows
      }
    }
  }
  return ps;
}

INSTANTIATE_TEST_SUITE_P(All, BatchInvariant, ::testing::ValuesIn(invariant_params()),
                         [](const ::testing::TestParamInfo<InvariantParam>& info) {
                           std::ostringstream os;
                           PrintTo(info.param, &os);
                           return os.str();
                         });

// The plan itself: a sequence's splits depend on its own length alone, and the chunk grows only
// for sequences longer than kBatchInvariantMaxSplits chunks.
TEST(BatchInvariantPlan, SplitsDependOnTheSequenceAlone) {
  PlanOptions o;
  o.parallelism = 1000;
  make_batch_invariant(o);
  EXPECT_EQ(o.fixed_chunk_tokens, kBatchInvariantChunkTokens);
  EXPECT_EQ(o.max_splits_per_seq, kBatchInvariantMaxSplits);
  const int bs = 16, chunk_blocks = kBatchInvariantChunkTokens / bs;
  const std::vector<std::int32_t> alone = {5000};
  const std::vector<std::int32_t> crowd = {7, 5000, 100000, 0, 512};
  const SplitPlan a = make_split_plan(alone.data(), 1, 2, bs, o);
  const SplitPlan b = make_split_plan(crowd.data(), 5, 2, bs, o);
  ASSERT_EQ(a.num_splits[0], b.num_splits[1]);
  EXPECT_EQ(a.num_splits[0], (blocks_for(5000, bs) + chunk_blocks - 1) / chunk_blocks);
  for (std::size_t i = 0; i < a.items.size(); ++i) {
    const WorkItem& x = a.items[i];
    const auto same = std::find_if(b.items.begin(), b.items.end(), [&](const WorkItem& y) {
      return y.seq == 1 && y.kv_head == x.kv_head && y.split == x.split;
    });
    ASSERT_NE(same, b.items.end());
    EXPECT_EQ(same->block_begin, x.block_begin);
    EXPECT_EQ(same->block_end, x.block_end);
  }
  // 100000 tokens: 6250 blocks in at most 64 splits of ceil(6250 / 64) = 98 blocks or fewer.
  EXPECT_EQ(b.num_splits[2], kBatchInvariantMaxSplits);
  EXPECT_EQ(b.num_splits[3], 0);
  EXPECT_EQ(b.num_splits[4], 1);
  EXPECT_LE(b.total_splits(), max_plan_splits(5, 6250, 2, bs, o));
}

}  // namespace
}  // namespace pagedattn
