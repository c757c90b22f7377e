// Decoding with shared prefixes (DecodeOptions::share_prefixes) on the CPU backend: forked
// tables (groups whose first blocks are the same ids, forks mid-block, copy-on-write copies) give
// the f64 reference's result and the plain decode's, within the dtype's tolerance, for every cache
// dtype, layout, variant, block size and query-token count; batch-invariant calls never share.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "gtest_printers.hpp"
#include "pagedattn/block_manager.hpp"
#include "pagedattn/detail/backends.hpp"
#include "pagedattn/pagedattn.hpp"
#include "pagedattn/reference.hpp"
#include "pagedattn/testing/cache_op_args.hpp"
#include "pagedattn/testing/kv_layouts.hpp"
#include "pagedattn/testing/random_case.hpp"
#include "pagedattn/testing/tolerance.hpp"
#include "pagedattn/tree_mask.hpp"
#include "quantized_spec.hpp"
#include "query_case.hpp"
#include "test_seed.hpp"
#include "variant_args.hpp"

namespace pagedattn {
namespace {

// A cache's storage: the q and out dtype, the cache's, and per-token scales.
struct Storage {
  DType io, kv;
  bool token_scales = false;
};
void PrintTo(const Storage& s, std::ostream* os) {
  *os << dtype_name(s.io) << "_" << dtype_name(s.kv) << (s.token_scales ? "_ts" : "");
}

struct ShareParam {
  Storage storage;
  int block_size;
  int q_len;  // 0: no q_indptr (one query token each); else 1 to q_len tokens a sequence
  VariantKind variant;
  bool nhd = false;   // the cache in the NHD layout
  bool tree = false;  // tree masks over the query tokens
};
void PrintTo(const ShareParam& p, std::ostream* os) {
  PrintTo(p.storage, os);
  *os << "_bs" << p.block_size << "_q" << p.q_len << "_" << kind_name(p.variant)
      << (p.nhd ? "_nhd" : "") << (p.tree ? "_tree" : "");
}

// Three groups of four forked sequences (forks anywhere, mid-block included; one member that
// wrote nothing after its fork, sharing the fork's partial block) and two unforked sequences, or
// the lengths a seed draws.
testing::CaseSpec forked_spec(const ShareParam& p, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int members = 4, groups = 3, BS = p.block_size;
  std::vector<int> lens, prefix;
  for (int g = 0; g < groups; ++g) {
    const int fork = std::uniform_int_distribution<int>(40, 220)(rng);
    // Every other group forks on a block boundary.
    prefix.push_back(g % 2 == 0 ? std::max(BS, fork / BS * BS) : fork);
    for (int j = 0; j < members; ++j) {
      const int own = j == 1 ? 0 : std::uniform_int_distribution<int>(1, 70)(rng);
      lens.push_back(prefix.back() + own);
    }
  }
  lens.push_back(std::uniform_int_distribution<int>(1, 200)(rng));
  lens.push_back(std::uniform_int_distribution<int>(1, 200)(rng));
  const Storage& s = p.storage;
  testing::CaseSpec spec =
      is_quantized(s.kv) ? quantized_spec(s.kv, s.io, 8, 2, 64, BS, lens, s.token_scales, seed)
                         : testing::shaped_spec(s.io, 8, 2, 64, BS, lens);
  spec.kv_dtype = s.kv;
  spec.seed = seed;
  spec.spare_blocks = 4;
  spec.table_padding = 2;
  spec.table_stride_extra = 1;
  spec.fork_members = members;
  spec.fork_prefix = prefix;
  return spec;
}

// The variant of a grid row: windows that reach token 0 for some sequences and not others.
Variants variants_for(VariantKind k, int heads, const std::vector<std::int32_t>& lens) {
  Variants v;
  const int longest = *std::max_element(lens.begin(), lens.end());
  if (k == VariantKind::kWindow || k == VariantKind::kAll) v.window_left = longest - 40;
  if (k == VariantKind::kSoftCap || k == VariantKind::kAll) v.soft_cap = 8.f;
  if (k == VariantKind::kAlibi || k == VariantKind::kAll) v.slopes = alibi_slopes(heads);
  if (k == VariantKind::kSinks || k == VariantKind::kAll) v.sinks = sink_logits(heads);
  return v;
}

// Tree masks of random trees (each token's parent none or an earlier one; a token keeps itself
// and its ancestors), packed from byte 0 of each sequence's span.
struct Trees {
  std::vector<std::uint8_t> bits;
  std::vector<std::int32_t> indptr;
};
Trees random_trees(const std::vector<std::int32_t>& q_indptr, std::mt19937_64& rng) {
  Trees t;
  t.indptr.assign(1, 0);
  for (std::size_t b = 0; b + 1 < q_indptr.size(); ++b) {
    const int n = q_indptr[b + 1] - q_indptr[b];
    const std::int64_t at = t.indptr.back();
    t.bits.resize(static_cast<std::size_t>(at + tree_mask_bytes(n)), 0);
    std::vector<int> parent(n, -1);
    for (int i = 0; i < n; ++i) {
      parent[i] = i == 0 ? -1 : std::uniform_int_distribution<int>(-1, i - 1)(rng);
      for (int j = i; j >= 0; j = parent[j]) set_tree_mask_bit(t.bits.data() + at, i * n + j);
    }
    t.indptr.push_back(static_cast<std::int32_t>(at + tree_mask_bytes(n)));
  }
  return t;
}

// Decodes a (over qc's buffers) with o and expects the outputs to match ref, a's f64 reference,
// within the output dtype's tolerances; returns the comparison for the caller's own checks.
testing::Comparison expect_matches_reference(const QueryCase& qc, const DecodeArgs& a,
                                             const DecodeOptions& o, const ReferenceResult& ref) {
  decode(a, o);
  const testing::Comparison c = testing::compare_outputs(qc.c, ref);
  EXPECT_TRUE(c.all_finite) << c.first_bad;
  EXPECT_LE(c.rel_err(), testing::out_tolerance(qc.c.spec.out_dtype));
  EXPECT_LE(c.max_abs_err_lse, testing::lse_tolerance());
  return c;
}

class SharedPrefixDecode : public ::testing::TestWithParam<ShareParam> {};

TEST_P(SharedPrefixDecode, MatchesTheReferenceAndThePlainDecode) {
  const ShareParam p = GetParam();
  std::ostringstream name;
  PrintTo(p, &name);
  const std::uint64_t seed = testing::seed_for(testing::stable_hash(name.str()));
  const testing::CaseSpec spec = forked_spec(p, seed);
  std::mt19937_64 rng(seed + 7);
  std::vector<int> q_lens;
  for (int b = 0; b < spec.batch; ++b) {
    q_lens.push_back(p.q_len == 0 ? 1 : std::uniform_int_distribution<int>(1, p.q_len)(rng));
  }
  QueryCase qc = make_query_case(spec, q_lens);
  const Variants v = variants_for(p.variant, spec.num_heads, qc.c.context_lens);
  DecodeArgs a = with_variants(p.q_len == 0 ? qc.c.args() : qc.args(), v);
  Trees trees;
  if (p.tree) {
    trees = random_trees(qc.indptr, rng);
    a.tree_mask = trees.bits.data();
    a.tree_mask_indptr = trees.indptr.data();
  }
  std::optional<testing::KvStorage> nhd;
  if (p.nhd) {
    nhd = testing::store_kv(qc.c, testing::KvLayout::kNhd);
    nhd->apply(a, nhd->k.data(), nhd->v.data());
  }
  SCOPED_TRACE(qc.describe() + " " + describe(v));
  DecodeOptions o;
  o.backend = Backend::kCpu;
  const SharedPrefixes groups = detail::cpu::shared_prefixes(a, o);
  if (v.window_left < 0) {
    ASSERT_FALSE(groups.empty()) << "the case shares nothing";
  }

  const ReferenceResult ref = reference_decode(a);
  const testing::Comparison shared = expect_matches_reference(qc, a, o, ref);
  const std::vector<std::uint8_t> out_shared = qc.c.out;
  const std::vector<float> lse_shared = qc.c.lse;

  o.share_prefixes = false;
  qc.c.poison_outputs();
  decode(a, o);
  double out_diff = 0, lse_diff = 0;
  for (std::size_t i = 0; i < ref.out.size(); ++i) {
    out_diff =
        std::max<double>(out_diff, std::fabs(load_as_float(out_shared.data(), spec.out_dtype, i) -
                                             load_as_float(qc.c.out.data(), spec.out_dtype, i)));
  }
  for (std::size_t i = 0; i < ref.lse.size(); ++i) {
    if (std::isinf(ref.lse[i])) {
      EXPECT_EQ(lse_shared[i], qc.c.lse[i]) << "lse[" << i << "]";
    } else {
      lse_diff = std::max<double>(lse_diff, std::fabs(lse_shared[i] - qc.c.lse[i]));
    }
  }
  EXPECT_LE(out_diff / shared.ref_scale, testing::out_tolerance(spec.out_dtype));
  EXPECT_LE(lse_diff, testing::lse_tolerance());
}

std::vector<ShareParam> share_grid() {
  const std::vector<Storage> storages = {
      {DType::kF32, DType::kF32},        {DType::kF16, DType::kF16},
      {DType::kBF16, DType::kBF16},      {DType::kBF16, DType::kFP8E4M3},
      {DType::kF16, DType::kFP8E5M2},    {DType::kBF16, DType::kInt8, true},
      {DType::kF32, DType::kInt4, true}, {DType::kBF16, DType::kFP8E4M3, true}};
  std::vector<ShareParam> grid;
  // Every storage at every block size, one query token.
  for (const Storage& s : storages) {
    for (int bs : {1, 7, 16, 32}) grid.push_back({s, bs, 0, VariantKind::kPlain});
  }
  // Every variant with one and several query tokens, bf16 and f32.
  for (const Storage& s : {storages[0], storages[2]}) {
    for (VariantKind k : {VariantKind::kPlain, VariantKind::kWindow, VariantKind::kSoftCap,
                          VariantKind::kAlibi, VariantKind::kSinks, VariantKind::kAll}) {
      for (int q : {0, 1, 2, 4}) grid.push_back({s, 16, q, k});
    }
  }
  // Other block sizes and storages with several query tokens and ALiBi or a window.
  for (int bs : {5, 32}) {
    grid.push_back({storages[3], bs, 3, VariantKind::kAlibi});
    grid.push_back({storages[5], bs, 4, VariantKind::kWindow});
    grid.push_back({storages[1], bs, 2, VariantKind::kAll});
  }
  // NHD caches; tree masks.
  for (const Storage& s : {storages[2], storages[3]}) {
    grid.push_back({s, 16, 0, VariantKind::kPlain, true});
    grid.push_back({s, 16, 4, VariantKind::kAll, true});
    grid.push_back({s, 16, 4, VariantKind::kPlain, false, true});
    grid.push_back({s, 8, 3, VariantKind::kSinks, false, true});
  }
  return grid;
}

INSTANTIATE_TEST_SUITE_P(Grid, SharedPrefixDecode, ::testing::ValuesIn(share_grid()),
                         [](const ::testing::TestParamInfo<ShareParam>& info) {
                           std::ostringstream os;
                           PrintTo(info.param, &os);
                           return os.str() + "_" + std::to_string(info.index);
                         });

// A group too large for one prefix sequence (more than kMaxPrefixRows rows per kv head) is cut
// into chunks, and chunks of different query-token counts run in passes of their own: 20 samples
// of group 8 with 1 to 3 query tokens each (160 to 480 rows per kv head), beside a pair.
TEST(SharedPrefixChunks, LargeGroupsRunAsSeveralChunksAndPasses) {
  const std::uint64_t seed = testing::seed_for(97);
  std::mt19937_64 rng(seed);
  std::vector<int> lens, q_lens;
  for (int b = 0; b < 22; ++b) {
    lens.push_back(300 + static_cast<int>(rng() % 40));
    q_lens.push_back(1 + static_cast<int>(rng() % 3));
  }
  testing::CaseSpec spec = testing::shaped_spec(DType::kBF16, 16, 2, 64, 16, lens);
  spec.seed = seed;
  spec.fork_members = 20;
  spec.fork_prefix = {250, 200};
  QueryCase qc = make_query_case(spec, q_lens);
  const Variants v = variants_for(VariantKind::kAll, spec.num_heads, {1000});  // no window
  DecodeArgs a = with_variants(qc.args(), v);
  a.window_left = -1;
  SCOPED_TRACE(qc.describe());
  DecodeOptions o;
  o.backend = Backend::kCpu;
  const SharedPrefixes groups = detail::cpu::shared_prefixes(a, o);
  ASSERT_EQ(groups.groups.size(), 2u);
  EXPECT_EQ(groups.groups[0].count, 20);
  EXPECT_EQ(groups.groups[0].tokens, 240);  // the fork's block is each sample's own copy

  expect_matches_reference(qc, a, o, reference_decode(a));
}

// N-way sampling through the block manager: a prompt (ending mid-block), forked N - 1 times, each
// sample appending tokens of its own (the partial block copied on its first write, one sample
// writing nothing), then the step's decode over its tables.
class SharedPrefixFork : public ::testing::TestWithParam<std::tuple<int, DType>> {};

TEST_P(SharedPrefixFork, SamplesOfOnePromptDecodeLikeThePlainDecode) {
  const auto [bs, dtype] = GetParam();
  constexpr int kHeads = 16, kKv = 2, kDim = 128, kSamples = 6, kBlocks = 160;
  const std::uint64_t seed =
      testing::seed_for(static_cast<std::uint64_t>(bs * 131) + static_cast<std::uint64_t>(dtype));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  const std::size_t elems = CacheLayout::dense(kBlocks, kKv, bs, kDim).elements();
  std::vector<std::uint8_t> k(elems * dtype_size(dtype), 0xff), v(k.size(), 0xff);
  const auto write = [&](const std::vector<std::int32_t>& slots) {
    std::vector<float> key(slots.size() * kKv * kDim), value(key.size());
    for (float& x : key) x = normal(rng);
    for (float& x : value) x = normal(rng);
    CacheWriteArgs w =
        testing::pool_args<CacheWriteArgs>(kKv, kDim, bs, kBlocks, k.data(), v.data(), dtype);
    w.num_tokens = static_cast<int>(slots.size());
    w.key = key.data();
    w.value = value.data();
    w.slot_mapping = slots.data();
    write_cache(w, CacheOpOptions{Backend::kCpu});
  };
  BlockManager bm(kBlocks, bs);
  const int prompt = std::max(9 * bs + bs / 2 + 3, 45);  // enough shared tokens to pay
  write(bm.add_sequence(0, prompt));
  for (int s = 1; s < kSamples; ++s) bm.fork(0, s);
  int copies = 0;
  for (int s = 0; s < kSamples; ++s) {
    const int own = s == 2 ? 0 : 1 + static_cast<int>(rng() % (3 * bs));
    for (int t = 0; t < own; ++t) {
      const BlockManager::Append app = bm.append_token(s);
      if (app.copy) {
        CopyBlocksArgs c =
            testing::pool_args<CopyBlocksArgs>(kKv, kDim, bs, kBlocks, k.data(), v.data(), dtype);
        c.pairs = &*app.copy;
        c.num_pairs = 1;
        copy_blocks(c, CacheOpOptions{Backend::kCpu});
        ++copies;
      }
      write({app.slot});
    }
  }
  bm.check_invariants();
  if (bs > 1 && prompt % bs != 0) EXPECT_GT(copies, 0);

  const BlockManager::Tables t = bm.tables(bm.sequences());
  std::vector<float> q(static_cast<std::size_t>(kSamples) * kHeads * kDim);
  for (float& x : q) x = normal(rng);
  std::vector<std::uint8_t> out(q.size() * dtype_size(dtype)), plain(out.size());
  std::vector<float> lse(static_cast<std::size_t>(kSamples) * kHeads), plain_lse(lse.size());
  DecodeArgs a;
  a.batch = kSamples;
  a.num_heads = kHeads;
  a.num_kv_heads = kKv;
  a.head_dim = kDim;
  a.block_size = bs;
  a.num_blocks = kBlocks;
  a.max_blocks_per_seq = t.max_blocks_per_seq;
  a.q = q.data();
  a.k_cache = k.data();
  a.v_cache = v.data();
  a.k_dtype = a.v_dtype = dtype;
  a.block_table = t.block_table.data();
  a.context_lens = t.context_lens.data();
  a.out_dtype = dtype;
  DecodeOptions o;
  o.backend = Backend::kCpu;
  const SharedPrefixes groups = detail::cpu::shared_prefixes(a, o);
  ASSERT_EQ(groups.groups.size(), 1u);
  EXPECT_EQ(groups.groups[0].count, kSamples);
  EXPECT_EQ(groups.groups[0].tokens, bs > 1 ? prompt / bs * bs : prompt);
  a.out = out.data();
  a.lse = lse.data();
  decode(a, o);
  o.share_prefixes = false;
  a.out = plain.data();
  a.lse = plain_lse.data();
  decode(a, o);

  const ReferenceResult ref = reference_decode(a);
  double scale = 1e-30, err = 0, diff = 0, lse_err = 0;
  for (std::size_t i = 0; i < ref.out.size(); ++i) {
    const double got = load_as_float(out.data(), dtype, static_cast<std::int64_t>(i));
    scale = std::max(scale, std::fabs(ref.out[i]));
    err = std::max(err, std::fabs(got - ref.out[i]));
    diff = std::max(
        diff, std::fabs(got - load_as_float(plain.data(), dtype, static_cast<std::int64_t>(i))));
  }
  for (std::size_t i = 0; i < ref.lse.size(); ++i) {
    lse_err = std::max(lse_err, std::fabs(lse[i] - ref.lse[i]));
  }
  SCOPED_TRACE(testing::seed_note(seed));
  EXPECT_LE(err / scale, testing::out_tolerance(dtype));
  EXPECT_LE(diff / scale, testing::out_tolerance(dtype));
  EXPECT_LE(lse_err, testing::lse_tolerance());
}

INSTANTIATE_TEST_SUITE_P(BlockSizes, SharedPrefixFork,
                         ::testing::Combine(::testing::Values(1, 8, 16, 32),
                                            ::testing::Values(DType::kF32, DType::kBF16)));

// A batch-invariant call never shares (a shared pass would make a sequence's bits depend on the
// other sequences of its batch): a forked sequence decodes to the same bits alone and beside its
// siblings, and the introspection finds no group; the same call without the option shares.
TEST(SharedPrefixBatchInvariant, DisablesSharing) {
  ShareParam p{{DType::kBF16, DType::kBF16}, 16, 0, VariantKind::kPlain};
  testing::CaseSpec spec = forked_spec(p, testing::seed_for(4242));
  testing::HostCase c = testing::make_case(spec);
  DecodeArgs a = c.args();
  DecodeOptions o;
  o.backend = Backend::kCpu;
  ASSERT_FALSE(detail::cpu::shared_prefixes(a, o).empty());
  o.batch_invariant = true;
  EXPECT_TRUE(detail::cpu::shared_prefixes(a, o).empty());
  decode(a, o);
  const std::size_t row = static_cast<std::size_t>(spec.num_heads) * spec.head_dim * 2;
  for (int b : {0, 1, 5}) {
    DecodeArgs one = a;
    one.batch = 1;
    one.block_table = a.block_table + static_cast<std::int64_t>(b) * c.table_stride;
    one.context_lens = a.context_lens + b;
    one.q = c.q.data() + b * row;
    std::vector<std::uint8_t> out(row);
    std::vector<float> lse(static_cast<std::size_t>(spec.num_heads));
    one.out = out.data();
    one.lse = lse.data();
    decode(one, o);
    EXPECT_TRUE(std::equal(out.begin(), out.end(), c.out.begin() + b * row)) << "sequence " << b;
    EXPECT_TRUE(std::equal(lse.begin(), lse.end(), c.lse.begin() + b * spec.num_heads))
        << "sequence " << b;
  }
}

}  // namespace
}  // namespace pagedattn
