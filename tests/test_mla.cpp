// MLA decode (pagedattn/mla.hpp). Checked: the f64 reference against loops written here from the
// definition; the CPU backend against the reference over heads, query tokens, block sizes, cache
// dtypes (fp8 with its scale), the two-part and the combined latent cache, padded rows and strided
// q and out; empty and one-token contexts; NaN in every slot no query reads and in the tokens
// after a query's position; the split plan against one split per sequence; batch invariance;
// the argument errors, which write nothing (the CUDA backend: test_mla_cuda.cpp). ctest runs the
// suite again on the SSE2 and AVX2 kernels (tests/CMakeLists.txt).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bad_input.hpp"
#include "mla_case.hpp"
#include "pagedattn/detail/dispatch.hpp"
#include "pagedattn/mla.hpp"
#include "pagedattn/reference.hpp"
#include "pagedattn/testing/tolerance.hpp"
#include "test_seed.hpp"

namespace pagedattn {
namespace {

using namespace mla_testing;  // NOLINT(google-build-using-namespace)

void run_cpu(MlaCase& m, bool single_split = false, bool invariant = false) {
  detail::DecodeOptions o;
  o.backend = Backend::kCpu;
  o.num_threads = 2;
  o.single_split = single_split;
  o.batch_invariant = invariant;
  detail::mla_decode(m.args(), o);
}

// ---- The reference against the definition. ----

TEST(MlaReference, MatchesTheDefinitionOnASmallCase) {
  MlaSpec s;
  s.q_dtype = s.kv_dtype = s.out_dtype = DType::kF32;
  s.heads = 3;
  s.rank = 32;
  s.rope = 16;
  s.block_size = 4;
  s.lens = {5, 0, 9};
  s.q_lens = {2, 1, 3};
  s.seed = testing::seed_for_test();
  MlaCase m = make_mla_case(s);
  const MlaDecodeArgs a = m.args();
  const ReferenceResult ref = mla_reference_decode(a);
  const double scale = 1.f / std::sqrt(48.f);  // the default scale, 1 / sqrt(rank + rope) in f32
  for (int b = 0; b < 3; ++b) {
    for (int i = 0; i < s.q_lens[b]; ++i) {
      const int row = m.indptr[b] + i, L = s.lens[b] - s.q_lens[b] + i + 1;
      for (int h = 0; h < s.heads; ++h) {
        std::vector<double> sc(static_cast<std::size_t>(std::max(L, 0)));
        auto latent = [&](int t, int d) {
          const int id = m.table[static_cast<std::size_t>(b) * m.max_blocks + t / 4];
          const std::int64_t slot = static_cast<std::int64_t>(id) * 4 + t % 4;
          return d < 32
                     ? load_as_float(a.c_cache, s.kv_dtype, slot * a.c_strides.token + d)
                     : load_as_float(a.kpe_cache, s.kv_dtype, slot * a.kpe_strides.token + d - 32);
        };
        double mx = -INFINITY;
        for (int t = 0; t < L; ++t) {
          double dot = 0;
          for (int d = 0; d < 48; ++d) {
            const double qv =
                d < 32 ? load_as_float(a.q_nope, s.q_dtype, row * a.q_nope_row() + h * 32 + d)
                       : load_as_float(a.q_pe, s.q_dtype, row * a.q_pe_row() + h * 16 + d - 32);
            dot += qv * latent(t, d);
          }
          sc[t] = dot * scale;
          mx = std::max(mx, sc[t]);
        }
        double sum = 0;
        for (int t = 0; t < L; ++t) sum += std::exp(sc[t] - mx);
        const std::size_t at = static_cast<std::size_t>(row) * s.heads + h;
        if (L <= 0) {
          EXPECT_EQ(ref.lse[at], -INFINITY);
          continue;
        }
        EXPECT_NEAR(ref.lse[at], mx + std::log(sum), 1e-12);
        for (int d = 0; d < 32; ++d) {
          double o = 0;
          for (int t = 0; t < L; ++t) o += std::exp(sc[t] - mx) / sum * latent(t, d);
          EXPECT_NEAR(ref.out[at * 32 + d], o, 1e-12) << "row " << row << " head " << h;
        }
      }
    }
  }
}

// ---- The CPU backend against the reference. ----

struct GridParam {
  DType kv_dtype;
  int heads, q_len, block_size;
  bool combined;
};
void PrintTo(const GridParam& p, std::ostream* os) {
  *os << dtype_name(p.kv_dtype) << "_h" << p.heads << "_q" << p.q_len << "_bs" << p.block_size
      << (p.combined ? "_combined" : "_parts");
}

class MlaCpuGrid : public ::testing::TestWithParam<GridParam> {};

TEST_P(MlaCpuGrid, MatchesTheReference) {
  const GridParam& p = GetParam();
  MlaSpec s;
  s.kv_dtype = p.kv_dtype;
  s.q_dtype = s.out_dtype = p.kv_dtype == DType::kF32 ? DType::kF32 : DType::kBF16;
  if (p.kv_dtype == DType::kF16) s.q_dtype = s.out_dtype = DType::kF16;
  s.heads = p.heads;
  s.block_size = p.block_size;
  s.lens = {0, 1, 63, 300, 17};
  if (p.q_len > 1) s.q_lens = {p.q_len, 1, p.q_len, p.q_len, 0};
  s.combined = p.combined;
  s.seed = testing::seed_for_test();
  MlaCase m = make_mla_case(s);
  const ReferenceResult ref = mla_reference_decode(m.args());
  run_cpu(m);
  std::ostringstream what;
  PrintTo(p, &what);
  expect_matches(m, ref, what.str());
}

std::vector<GridParam> grid() {
  std::vector<GridParam> g;
  for (DType d : {DType::kBF16, DType::kF16, DType::kF32, DType::kFP8E4M3}) {
    for (int heads : {16, 128}) {
      for (int q : {1, 3}) {
        for (int bs : {1, 16, 64}) {
          for (bool combined : {false, true}) g.push_back({d, heads, q, bs, combined});
        }
      }
    }
  }
  g.push_back({DType::kFP8E5M2, 32, 2, 64, true});
  return g;
}
INSTANTIATE_TEST_SUITE_P(Mla, MlaCpuGrid, ::testing::ValuesIn(grid()), [](const auto& info) {
  std::ostringstream os;
  PrintTo(info.param, &os);
  return os.str();
});

TEST(MlaCpu, EmptyContextsGiveZeroAndMinusInfinity) {
  MlaSpec s;
  s.lens = {0, 0, 5};
  s.q_lens = {2, 0, 3};  // sequence 2's first query tokens sit before position 0 too
  s.lens[2] = 1;
  s.seed = testing::seed_for_test();
  MlaCase m = make_mla_case(s);
  const ReferenceResult ref = mla_reference_decode(m.args());
  run_cpu(m);
  expect_matches(m, ref, "empty contexts");
  for (int h = 0; h < s.heads; ++h) EXPECT_EQ(m.lse[h], -INFINITY);
}

TEST(MlaCpu, PaddedRowsAndStridedQueriesAndOut) {
  MlaSpec s;
  s.row_pad = 48;
  s.q_lens = {1, 2, 1, 3};
  s.seed = testing::seed_for_test();
  MlaCase m = make_mla_case(s);
  const ReferenceResult ref = mla_reference_decode(m.args());
  run_cpu(m);
  expect_matches(m, ref, "padded rows");
  // The padding of out rows stays as it was (NaN).
  const MlaDecodeArgs a = m.args();
  for (int r = 0; r < m.rows(); ++r) {
    for (int d = 0; d < s.row_pad; ++d) {
      EXPECT_TRUE(std::isnan(load_as_float(
          a.out, s.out_dtype, r * a.out_row() + static_cast<std::int64_t>(s.heads) * s.rank + d)));
    }
  }
}

TEST(MlaCpu, TheCombinedCacheGivesTheSameBitsAsTwoParts) {
  MlaSpec s;
  s.q_lens = {2, 1, 3, 1};
  s.seed = testing::seed_for_test();
  MlaCase parts = make_mla_case(s);
  s.combined = true;
  MlaCase combined = make_mla_case(s);  // the same draws, laid out in one tensor
  run_cpu(parts);
  run_cpu(combined);
  EXPECT_EQ(parts.out, combined.out);
  EXPECT_EQ(0, std::memcmp(parts.lse.data(), combined.lse.data(), parts.lse.size() * 4));
}

TEST(MlaCpu, LaterTokensNeverReachEarlierQueries) {
  MlaSpec s;
  s.lens = {40, 70};
  s.q_lens = {4, 6};
  s.seed = testing::seed_for_test();
  MlaCase clean = make_mla_case(s);
  run_cpu(clean);
  MlaCase poisoned = make_mla_case(s);
  // NaN in the latent rows after sequence 1's third query token (positions 67 to 69).
  const MlaDecodeArgs a = poisoned.args();
  for (int t = 67; t < 70; ++t) {
    const std::int64_t id = poisoned.table[static_cast<std::size_t>(poisoned.max_blocks) + t / 16];
    const std::int64_t slot = id * 16 + t % 16;
    store_from_float(poisoned.c.data(), s.kv_dtype, slot * a.c_strides.token + 3, kNaN);
  }
  run_cpu(poisoned);
  const ReferenceResult ref = mla_reference_decode(poisoned.args());
  expect_matches(poisoned, ref, "NaN after query 2 of sequence 1");
  // Rows of sequence 0 and of sequence 1's first three query tokens: bitwise as without NaN.
  const std::size_t row_bytes = static_cast<std::size_t>(s.heads) * s.rank * 2;
  const std::size_t keep = (4 + 3) * row_bytes;
  EXPECT_EQ(0, std::memcmp(clean.out.data(), poisoned.out.data(), keep));
  for (int h = 0; h < s.heads; ++h) EXPECT_TRUE(std::isnan(poisoned.lse[(4 + 3) * s.heads + h]));
}

TEST(MlaCpu, TheSplitPlanMatchesOneSplitPerSequence) {
  MlaSpec s;
  s.kv_dtype = s.q_dtype = s.out_dtype = DType::kF32;
  s.lens = {3000, 5, 1200};
  s.q_lens = {2, 1, 1};
  s.seed = testing::seed_for_test();
  MlaCase split = make_mla_case(s);
  MlaCase single = make_mla_case(s);
  run_cpu(split);
  run_cpu(single, /*single_split=*/true);
  const ReferenceResult ref = mla_reference_decode(split.args());
  expect_matches(split, ref, "planned splits");
  expect_matches(single, ref, "one split per sequence");
}

TEST(MlaCpu, BatchInvariantResultsDoNotDependOnTheBatch) {
  // Sequence 0 decoded alone (a batch of 1 over the same buffers) and among three more: the same
  // bits in batch-invariant mode, though the default plan splits it differently.
  MlaSpec s;
  s.lens = {2500, 9000, 30, 4000};
  s.seed = testing::seed_for_test();
  MlaCase batch = make_mla_case(s);
  MlaCase alone = batch;
  run_cpu(batch, false, true);
  detail::DecodeOptions o;
  o.backend = Backend::kCpu;
  o.num_threads = 2;
  o.batch_invariant = true;
  MlaDecodeArgs a = alone.args();
  a.batch = 1;
  detail::mla_decode(a, o);
  const std::size_t row_bytes = static_cast<std::size_t>(s.heads) * s.rank * 2;
  EXPECT_EQ(0, std::memcmp(alone.out.data(), batch.out.data(), row_bytes));
  EXPECT_EQ(0, std::memcmp(alone.lse.data(), batch.lse.data(), s.heads * 4));
}

TEST(MlaCpu, NaNInAQueryOrALatentRowMakesItsHeadsNaN) {
  MlaSpec s;
  s.lens = {30, 30};
  s.seed = testing::seed_for_test();
  MlaCase m = make_mla_case(s);
  MlaDecodeArgs a = m.args();
  store_from_float(m.q_pe.data(), s.q_dtype, 5 * s.rope + 1, kNaN);         // sequence 0, head 5
  const std::int64_t id = m.table[static_cast<std::size_t>(m.max_blocks)];  // sequence 1, token 0
  store_from_float(m.c.data(), s.kv_dtype, id * 16 * a.c_strides.token + 7, INFINITY);
  run_cpu(m);
  const ReferenceResult ref = mla_reference_decode(m.args());
  expect_matches(m, ref, "non-finite inputs");
  EXPECT_TRUE(std::isnan(m.lse[5]));
  EXPECT_FALSE(std::isnan(m.lse[4]));
  for (int h = 0; h < s.heads; ++h) EXPECT_TRUE(std::isnan(m.lse[s.heads + h]));
}

// ---- Errors. ----

TEST(MlaValidation, BadArgumentsAreErrorsAndWriteNothing) {
  MlaSpec s;
  s.lens = {20, 0, 9};
  s.q_lens = {2, 0, 1};
  s.seed = 7;
  MlaCase m = make_mla_case(s);
  struct Bad {
    std::string what, argument;
    ErrorCode code;
    std::function<void(MlaDecodeArgs&, MlaCase&)> apply;
  };
  const ErrorCode inv = ErrorCode::kInvalidArgument, uns = ErrorCode::kUnsupported,
                  oor = ErrorCode::kOutOfRange;
  const std::vector<Bad> bad = {
      {"negative batch", "batch", inv, [](MlaDecodeArgs& a, MlaCase&) { a.batch = -1; }},
      {"no heads", "num_heads", inv, [](MlaDecodeArgs& a, MlaCase&) { a.num_heads = 0; }},
      {"too many heads", "num_heads", uns, [](MlaDecodeArgs& a, MlaCase&) { a.num_heads = 257; }},
      {"rank not a multiple of 16", "kv_lora_rank", uns,
       [](MlaDecodeArgs& a, MlaCase&) { a.kv_lora_rank = 500; }},
      {"negative rope", "rope_dim", inv, [](MlaDecodeArgs& a, MlaCase&) { a.rope_dim = -16; }},
      {"block size 0", "block_size", uns, [](MlaDecodeArgs& a, MlaCase&) { a.block_size = 0; }},
      {"int8 cache", "kv_dtype", uns,
       [](MlaDecodeArgs& a, MlaCase&) { a.kv_dtype = DType::kInt8; }},
      {"int4 cache", "kv_dtype", uns,
       [](MlaDecodeArgs& a, MlaCase&) { a.kv_dtype = DType::kInt4; }},
      {"fp8 q", "q_dtype", uns, [](MlaDecodeArgs& a, MlaCase&) { a.q_dtype = DType::kFP8E4M3; }},
      {"scale on bf16", "kv_scale", inv, [](MlaDecodeArgs& a, MlaCase&) { a.kv_scale = 2.f; }},
      {"overlapping latent rows", "c_strides.token", inv,
       [](MlaDecodeArgs& a, MlaCase&) { a.c_strides.token = 100; }},
      {"one latent stride", "c_strides.block", inv,
       [](MlaDecodeArgs& a, MlaCase&) { a.c_strides.block = 0; }},
      {"short q rows", "q_nope_row_stride", inv,
       [](MlaDecodeArgs& a, MlaCase&) { a.q_nope_row_stride = 100; }},
      {"no c cache", "c_cache", inv, [](MlaDecodeArgs& a, MlaCase&) { a.c_cache = nullptr; }},
      {"no out", "out", inv, [](MlaDecodeArgs& a, MlaCase&) { a.out = nullptr; }},
      {"a context past the table", "context_lens[0]", oor,
       [](MlaDecodeArgs& a, MlaCase& c) { c.lens[0] = a.max_blocks_per_seq * 16 + 1; }},
      {"a block id out of range", "block_table[2][0]", oor,
       [](MlaDecodeArgs& a, MlaCase& c) { c.table[2 * a.max_blocks_per_seq] = a.num_blocks; }},
      {"q_indptr not from 0", "q_indptr[0]", inv,
       [](MlaDecodeArgs&, MlaCase& c) { c.indptr[0] = 1; }},
      {"non-finite scale", "scale", inv, [](MlaDecodeArgs& a, MlaCase&) { a.scale = NAN; }},
  };
  for (const Bad& k : bad) {
    MlaCase c = m;
    MlaDecodeArgs a = c.args();
    k.apply(a, c);
    const std::vector<std::uint8_t> out = c.out;
    detail::DecodeOptions o;
    o.backend = Backend::kCpu;
    expect_error([&] { detail::mla_decode(a, o); }, k.code, k.argument, {}, "decode: " + k.what);
    if (k.argument != "out") {
      expect_error([&] { mla_reference_decode(a); }, k.code, k.argument, {},
                   "reference: " + k.what);
    }
    EXPECT_EQ(out, c.out) << k.what << ": out was written";
  }
}

}  // namespace
}  // namespace pagedattn
