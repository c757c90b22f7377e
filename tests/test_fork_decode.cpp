// Decode after forks: sequences that share blocks through the block manager (with copy-on-write
// of partial blocks through copy_blocks) give the same attention as the same tokens written into
// private, unshared blocks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gtest_printers.hpp"
#include "pagedattn/block_manager.hpp"
#include "pagedattn/cache_layout.hpp"
#include "pagedattn/pagedattn.hpp"
#include "pagedattn/reference.hpp"
#include "pagedattn/testing/cache_op_args.hpp"

namespace pagedattn {
namespace {

constexpr int kHeads = 8, kKvHeads = 2, kDim = 64;
constexpr int kRow = kKvHeads * kDim;  // elements of one token's K (or V)

struct Pool {
  int num_blocks, block_size;
  DType dtype;
  std::vector<std::uint8_t> k, v;
  Pool(int blocks, int bs, DType t) : num_blocks(blocks), block_size(bs), dtype(t) {
    const std::size_t bytes =
        CacheLayout::dense(blocks, kKvHeads, bs, kDim).elements() * dtype_size(t);
    k.assign(bytes, 0xff);  // NaN in every dtype: an unwritten slot read by decode would show
    v.assign(bytes, 0xff);
  }
  // Cache-write or block-copy arguments over this pool.
  template <typename CacheOpArgs>
  CacheOpArgs pool_args() {
    return testing::pool_args<CacheOpArgs>(kKvHeads, kDim, block_size, num_blocks, k.data(),
                                           v.data(), dtype);
  }
  void write(const std::vector<float>& key, const std::vector<float>& value,
             const std::vector<std::int32_t>& slots) {
    CacheWriteArgs a = pool_args<CacheWriteArgs>();
    a.num_tokens = static_cast<int>(slots.size());
    a.key = key.data();
    a.value = value.data();
    a.slot_mapping = slots.data();
    write_cache(a, CacheOpOptions{Backend::kCpu});
  }
  void copy(const BlockCopy& p) {
    CopyBlocksArgs a = pool_args<CopyBlocksArgs>();
    a.pairs = &p;
    a.num_pairs = 1;
    copy_blocks(a, CacheOpOptions{Backend::kCpu});
  }
  DecodeArgs decode_args(const std::vector<float>& q, std::vector<float>& out,
                         const BlockManager::Tables& t) const {
    DecodeArgs a;
    a.batch = static_cast<int>(t.context_lens.size());
    a.num_heads = kHeads;
    a.num_kv_heads = kKvHeads;
    a.head_dim = kDim;
    a.block_size = block_size;
    a.num_blocks = num_blocks;
    a.max_blocks_per_seq = t.max_blocks_per_seq;
    a.q = q.data();
    a.k_cache = k.data();
    a.k_dtype = dtype;
    a.v_cache = v.data();
    a.v_dtype = dtype;
    a.block_table = t.block_table.data();
    a.context_lens = t.context_lens.data();
    a.out = out.data();
    return a;
  }
};

class ForkDecode : public ::testing::TestWithParam<std::tuple<int, DType>> {};

TEST_P(ForkDecode, SharedBlocksDecodeLikeAnUnsharedCopy) {
  const auto [bs, dtype] = GetParam();
  std::mt19937_64 rng(bs * 31 + static_cast<int>(dtype));
  std::normal_distribution<float> normal(0.f, 1.f);
  const auto random_rows = [&](int n) {
    std::vector<float> x(static_cast<std::size_t>(n) * kRow);
    for (float& e : x) e = normal(rng);
    return x;
  };

  Pool shared(96, bs, dtype);
  BlockManager bm(shared.num_blocks, bs);
  // Each sequence's tokens in order (K and V rows), to rebuild an unshared copy.
  std::map<BlockManager::SeqId, std::pair<std::vector<float>, std::vector<float>>> history;

  const auto add = [&](BlockManager::SeqId id, int prompt) {
    const std::vector<float> key = random_rows(prompt), value = random_rows(prompt);
    shared.write(key, value, bm.add_sequence(id, prompt));
    history[id] = {key, value};
  };
  int copies = 0;
  const auto append = [&](BlockManager::SeqId id) {
    const BlockManager::Append a = bm.append_token(id);
    if (a.copy) {
      shared.copy(*a.copy);  // before the write: the copy carries the shared tokens
      ++copies;
    }
    const std::vector<float> key = random_rows(1), value = random_rows(1);
    shared.write(key, value, {a.slot});
    auto& [hk, hv] = history[id];
    hk.insert(hk.end(), key.begin(), key.end());
    hv.insert(hv.end(), value.begin(), value.end());
  };
  const auto fork = [&](BlockManager::SeqId parent, BlockManager::SeqId child) {
    bm.fork(parent, child);
    history[child] = history[parent];
  };

  add(0, 3 * bs + bs / 2 + 1);  // ends inside a block
  add(1, 2 * bs);               // ends on a block boundary
  fork(0, 2);
  fork(1, 3);
  for (int i = 0; i < bs + 3; ++i) append(2);  // the child writes first, then the parent
  for (int i = 0; i < 5; ++i) append(0);
  fork(2, 4);
  for (int i = 0; i < 7; ++i) {
    append(4);
    append(1);
  }
  append(2);
  fork(4, 5);  // no writes after: the child reads only shared blocks
  bm.check_invariants();
  if (bs > 1) EXPECT_GT(copies, 0);  // one-token blocks are never partly filled

  const std::vector<BlockManager::SeqId> ids = bm.sequences();
  const int batch = static_cast<int>(ids.size());
  const std::vector<float> q = random_rows(batch * kHeads / kKvHeads);
  std::vector<float> out_shared(q.size()), out_private(q.size());
  const BlockManager::Tables t_shared = bm.tables(ids);
  DecodeOptions o;
  o.backend = Backend::kCpu;
  const DecodeArgs a_shared = shared.decode_args(q, out_shared, t_shared);
  decode(a_shared, o);

  // The same tokens, each sequence in blocks of its own.
  Pool priv(96, bs, dtype);
  BlockManager own(priv.num_blocks, bs);
  for (const auto id : ids) {
    const auto& [key, value] = history[id];
    priv.write(key, value, own.add_sequence(id, static_cast<int>(key.size() / kRow)));
  }
  const BlockManager::Tables t_private = own.tables(ids);
  ASSERT_EQ(t_private.context_lens, t_shared.context_lens);
  decode(priv.decode_args(q, out_private, t_private), o);

  for (std::size_t i = 0; i < q.size(); ++i) {
    ASSERT_TRUE(std::isfinite(out_shared[i])) << i;
    ASSERT_NEAR(out_shared[i], out_private[i], 1e-6f * (1.f + std::fabs(out_private[i]))) << i;
  }
  // And both against the f64 reference.
  const ReferenceResult ref = reference_decode(a_shared);
  double err = 0, scale = 1e-30;
  for (std::size_t i = 0; i < q.size(); ++i) {
    err = std::max(err, std::fabs(out_shared[i] - ref.out[i]));
    scale = std::max(scale, std::fabs(ref.out[i]));
  }
  EXPECT_LT(err / scale, 2e-5);
}

INSTANTIATE_TEST_SUITE_P(Grid, ForkDecode,
                         ::testing::Combine(::testing::Values(1, 8, 16),
                                            ::testing::Values(DType::kF32, DType::kBF16)),
                         [](const auto& info) {
                           return "bs" + std::to_string(std::get<0>(info.param)) + "_" +
                                  dtype_name(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace pagedattn
