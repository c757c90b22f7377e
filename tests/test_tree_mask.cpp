// Tree masks (DecodeArgs::tree_mask, tree_mask_indptr): among a sequence's new tokens the mask
// replaces the causal rule. Checked: the f64 reference against an independent oracle (each query
// token as a one-token decode over a compact cache of exactly the tokens it attends); the CPU and
// CUDA backends against the reference over dtypes, head dims, groups, block sizes, random trees
// and random lower-triangular masks, with every variant and in batch-invariant mode (on CUDA the
// tensor-core, CUDA-core and Hopper many-row kernels); the naive baseline of the benchmark
// (testing::naive_decode) against the reference; a full lower-triangular mask against the causal
// decode; NaN in the K and V of tokens no row attends; rows that attend nothing; and the argument
// errors, which write nothing, on the CPU and in CUDA's checked mode. CUDA tests skip without a
// device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "bad_input.hpp"
#include "pagedattn/cache_layout.hpp"
#include "pagedattn/detail/dispatch.hpp"
#include "pagedattn/reference.hpp"
#include "pagedattn/testing/device_case.hpp"
#include "pagedattn/testing/naive_decode.hpp"
#include "pagedattn/tree_mask.hpp"
#include "quantized_spec.hpp"
#include "query_case.hpp"
#include "test_seed.hpp"
#include "variant_args.hpp"

namespace pagedattn {
namespace {

// A sequence's mask: attend[i][j] for new tokens i, j.
using Mask = std::vector<std::vector<bool>>;

// A token tree in list order: token i's parent is a random earlier token or none (a root, child
// of the context); each token attends itself and its ancestors.
Mask random_tree(int n, std::mt19937_64& rng) {
  Mask m(n, std::vector<bool>(n, false));
  for (int i = 0; i < n; ++i) {
    const int parent = static_cast<int>(rng() % (i + 1)) - 1;  // -1: a root
    if (parent >= 0) m[i] = m[parent];
    m[i][i] = true;
  }
  return m;
}

// Any lower-triangular pattern, the diagonal included or not.
Mask random_lower(int n, std::mt19937_64& rng) {
  Mask m(n, std::vector<bool>(n, false));
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j <= i; ++j) m[i][j] = rng() % 2 == 0;
  }
  return m;
}

Mask causal(int n) {
  Mask m(n, std::vector<bool>(n, false));
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j <= i; ++j) m[i][j] = true;
  }
  return m;
}

// The masks packed as DecodeArgs wants them, each sequence's span starting at a byte offset
// with a few bytes of set bits between spans and after each mask's last bit (never read).
struct PackedMasks {
  std::vector<std::uint8_t> bytes;
  std::vector<std::int32_t> indptr;
};
PackedMasks pack(const std::vector<Mask>& masks, std::mt19937_64& rng) {
  PackedMasks p;
  p.indptr.push_back(static_cast<std::int32_t>(rng() % 3));
  p.bytes.assign(p.indptr[0], 0xff);
  for (const Mask& m : masks) {
    const int n = static_cast<int>(m.size());
    const std::size_t start = p.bytes.size();
    p.bytes.resize(start + tree_mask_bytes(n) + rng() % 3, 0);
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < n; ++j) {
        const std::size_t bit = static_cast<std::size_t>(i) * n + j;
        if (m[i][j]) set_tree_mask_bit(p.bytes.data() + start, static_cast<std::int64_t>(bit));
      }
    }
    for (std::size_t bit = static_cast<std::size_t>(n) * n; bit % 8 != 0; ++bit) {
      set_tree_mask_bit(p.bytes.data() + start, static_cast<std::int64_t>(bit));  // ignored
    }
    for (std::size_t b = start + tree_mask_bytes(n); b < p.bytes.size(); ++b) p.bytes[b] = 0xff;
    p.indptr.push_back(static_cast<std::int32_t>(p.bytes.size()));
  }
  if (p.bytes.empty()) p.bytes.push_back(0);
  return p;
}

DecodeArgs with_masks(DecodeArgs a, const PackedMasks& p) {
  a.tree_mask = p.bytes.data();
  a.tree_mask_indptr = p.indptr.data();
  return a;
}

// A tree-masked case: sequences of the given contexts and query-token counts, one mask each.
struct TreeCase {
  QueryCase qc;
  std::vector<Mask> masks;
  PackedMasks packed;
  DecodeArgs args(const Variants& v = {}) {
    return with_masks(with_variants(qc.args(), v), packed);
  }
};

TreeCase make_tree_case(const testing::CaseSpec& spec, const std::vector<int>& q_lens, bool trees) {
  TreeCase t;
  t.qc = make_query_case(spec, q_lens);
  std::mt19937_64 rng(spec.seed ^ 0x7ee3a5c0ffeeull);
  for (int b = 0; b < spec.batch; ++b) {
    const int n = t.qc.q_len(b);
    t.masks.push_back(trees ? random_tree(n, rng) : random_lower(n, rng));
  }
  t.packed = pack(t.masks, rng);
  return t;
}

// The oracle for one query token without variants: a one-token reference decode over a fresh
// single-sequence cache that holds exactly the tokens the token attends, in order.
ReferenceResult compact_reference(TreeCase& t, int b, int i) {
  const testing::HostCase& c = t.qc.c;
  const testing::CaseSpec& s = c.spec;
  const int n = t.qc.q_len(b), first_new = c.context_lens[b] - n;
  std::vector<int> tokens;
  for (int pos = 0; pos <= first_new + i; ++pos) {
    if (pos < first_new || t.masks[b][i][pos - first_new]) tokens.push_back(pos);
  }
  const int L = static_cast<int>(tokens.size());
  const int blocks = std::max(1, (L + s.block_size - 1) / s.block_size);
  const CacheLayout from =
      CacheLayout::dense(c.num_blocks, s.num_kv_heads, s.block_size, s.head_dim);
  const CacheLayout to = CacheLayout::dense(blocks, s.num_kv_heads, s.block_size, s.head_dim);
  const std::size_t elem = dtype_size(s.kv_dtype);
  std::vector<std::uint8_t> k(static_cast<std::size_t>(to.elements()) * elem);
  std::vector<std::uint8_t> v(k.size());
  for (int j = 0; j < L; ++j) {
    const int pos = tokens[j];
    const int block =
        c.block_table[static_cast<std::size_t>(b) * c.table_stride + pos / s.block_size];
    for (int kv = 0; kv < s.num_kv_heads; ++kv) {
      const std::size_t src = from.offset(block, kv, pos % s.block_size) * elem;
      const std::size_t dst = to.offset(j / s.block_size, kv, j % s.block_size) * elem;
      std::copy_n(c.k.data() + src, s.head_dim * elem, k.data() + dst);
      std::copy_n(c.v.data() + src, s.head_dim * elem, v.data() + dst);
    }
  }
  std::vector<std::int32_t> table(blocks), lens{L};
  for (int j = 0; j < blocks; ++j) table[j] = j;
  const std::size_t row = static_cast<std::size_t>(s.num_heads) * s.head_dim;
  DecodeArgs a = t.qc.args();
  a.q_indptr = nullptr;
  a.num_q_tokens = a.max_q_len = 0;
  a.batch = 1;
  a.q = c.q.data() + (t.qc.indptr[b] + i) * row * dtype_size(s.q_dtype);
  a.k_cache = k.data();
  a.v_cache = v.data();
  a.num_blocks = a.max_blocks_per_seq = blocks;
  a.block_table_stride = 0;
  a.block_table = table.data();
  a.context_lens = lens.data();
  a.k_scales = a.v_scales = nullptr;
  return reference_decode(a);
}

// Equal (both -inf for an empty row's lse) or within f64 rounding.
void expect_close(double got, double want, int b, int i, int h, int d) {
  if (got == want) return;
  EXPECT_NEAR(got, want, 1e-12) << "seq " << b << " token " << i << " head " << h
                                << (d < 0 ? " lse" : " dim " + std::to_string(d));
}

TEST(TreeMaskReference, EachRowIsADecodeOfExactlyItsAttendedTokens) {
  for (int trial = 0; trial < 6; ++trial) {
    testing::CaseSpec s = variant_spec(DType::kF32, 64, trial % 2 ? 5 : 16, 2 + trial % 3,
                                       {40 + 9 * trial, 7, 3 + trial, 0}, 100 + trial);
    TreeCase t = make_tree_case(s, {1 + 2 * trial, 5, 3 + trial, 0}, trial % 2 == 0);
    const ReferenceResult ref = reference_decode(t.args());
    const int H = s.num_heads, D = s.head_dim;
    for (int b = 0; b < s.batch; ++b) {
      for (int i = 0; i < t.qc.q_len(b); ++i) {
        const ReferenceResult one = compact_reference(t, b, i);
        const std::size_t row = static_cast<std::size_t>(t.qc.indptr[b] + i) * H;
        for (int h = 0; h < H; ++h) {
          expect_close(ref.lse[row + h], one.lse[h], b, i, h, -1);
          for (int d = 0; d < D; ++d) {
            expect_close(ref.out[(row + h) * D + d], one.out[h * D + d], b, i, h, d);
          }
        }
      }
    }
  }
}

// The backends to test: the CPU, and CUDA where a device is present.
std::vector<Backend> backends() {
  if (cuda_available()) return {Backend::kCpu, Backend::kCuda};
  return {Backend::kCpu};
}

// decode on `backend` over a case in host memory (CUDA: through device copies of every buffer).
void decode_on(Backend backend, const DecodeArgs& a, bool batch_invariant = false,
               bool checked = false) {
  detail::DecodeOptions o;
  o.backend = backend;
  o.num_threads = 2;
  o.batch_invariant = batch_invariant;
  o.cuda_checked = checked;
  if (backend == Backend::kCuda) {
    testing::cuda_decode_from_host(a, o);
  } else {
    detail::decode(a, o);
  }
}

// decode of t (with variants v) on every backend to test, each one's rows near ref; `what` names
// the case in a failure, the backend's name following it.
void expect_every_backend(TreeCase& t, const ReferenceResult& ref, const std::string& what,
                          const Variants& v = {}) {
  for (Backend b : backends()) {
    t.qc.c.poison_outputs();
    decode_on(b, t.args(v));
    expect_rows_near(t.qc, ref, 0, t.qc.rows(), what + backend_name(b));
  }
}

struct GridParam {
  DType dtype;
  GridShape shape;
  VariantKind variant;
  bool trees;
};
void PrintTo(const GridParam& p, std::ostream* os) {
  *os << dtype_name(p.dtype) << "_";
  PrintTo(p.shape, os);
  *os << "_" << kind_name(p.variant) << (p.trees ? "_trees" : "_lower");
}

Variants variants_of(VariantKind k, int heads) {
  Variants v;
  if (k == VariantKind::kWindow || k == VariantKind::kAll) v.window_left = 11;
  if (k == VariantKind::kSoftCap || k == VariantKind::kAll) v.soft_cap = 30.f;
  if (k == VariantKind::kAlibi || k == VariantKind::kAll) v.slopes = alibi_slopes(heads);
  if (k == VariantKind::kSinks || k == VariantKind::kAll) v.sinks = sink_logits(heads);
  return v;
}

class TreeMaskGrid : public ::testing::TestWithParam<GridParam> {};

// Contexts across block boundaries, more query tokens than context, a sequence without query
// tokens and one with a single one; q lens up to 16.
void check_grid(const GridParam& p, Backend backend) {
  testing::CaseSpec s = variant_spec(p.dtype, p.shape.head_dim, p.shape.block_size, p.shape.group,
                                     {300, 17, 4, 64, 1});
  TreeCase t = make_tree_case(s, {16, 9, 6, 0, 1}, p.trees);
  const Variants v = variants_of(p.variant, s.num_heads);
  const ReferenceResult ref = reference_decode(t.args(v));
  for (bool invariant : {false, true}) {
    t.qc.c.poison_outputs();
    decode_on(backend, t.args(v), invariant);
    expect_rows_near(t.qc, ref, 0, t.qc.rows(),
                     describe(v) + (invariant ? " batch_invariant" : ""));
  }
}

TEST_P(TreeMaskGrid, CpuMatchesTheReference) { check_grid(GetParam(), Backend::kCpu); }

TEST_P(TreeMaskGrid, CudaMatchesTheReference) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  check_grid(GetParam(), Backend::kCuda);
}

std::vector<GridParam> grid() {
  std::vector<GridParam> g;
  const GridShape shapes[] = {{64, 16, 1}, {128, 7, 4}, {80, 1, 8}, {128, 16, 16}, {64, 32, 8}};
  for (DType d : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const GridShape& sh : shapes) {
      for (VariantKind k : {VariantKind::kPlain, VariantKind::kAll}) {
        for (bool trees : {true, false}) g.push_back({d, sh, k, trees});
      }
    }
  }
  for (VariantKind k :
       {VariantKind::kWindow, VariantKind::kSoftCap, VariantKind::kAlibi, VariantKind::kSinks}) {
    g.push_back({DType::kBF16, {128, 16, 8}, k, true});
  }
  return g;
}
INSTANTIATE_TEST_SUITE_P(TreeMask, TreeMaskGrid, ::testing::ValuesIn(grid()), [](const auto& info) {
  std::ostringstream os;
  PrintTo(info.param, &os);
  return os.str();
});

TEST(TreeMaskBackends, AFullLowerTriangleIsTheCausalDecode) {
  testing::CaseSpec s = variant_spec(DType::kBF16, 128, 16, 8, {200, 33, 5}, 7);
  TreeCase t = make_tree_case(s, {12, 8, 5}, true);
  std::mt19937_64 rng(s.seed);
  t.masks = {causal(12), causal(8), causal(5)};
  t.packed = pack(t.masks, rng);
  const ReferenceResult causal_ref = reference_decode(t.qc.args());
  const ReferenceResult tree_ref = reference_decode(t.args());
  EXPECT_EQ(causal_ref.out, tree_ref.out);
  EXPECT_EQ(causal_ref.lse, tree_ref.lse);
  expect_every_backend(t, causal_ref, "full lower-triangular mask, ");
}

TEST(TreeMaskBackends, TokensNoRowAttendsAreNeverRead) {
  // f32 (CUDA: tf32 tensor cores), bf16 at head dim 64 (tensor cores) and at 128 with 80 rows
  // per kv head (CUDA: the Hopper many-row kernel where the device has it).
  const std::tuple<DType, int, int, int> shapes[] = {
      {DType::kF32, 64, 4, 4}, {DType::kBF16, 64, 4, 4}, {DType::kBF16, 128, 16, 8}};
  for (const auto& [d, head_dim, block_size, group] : shapes) {
    testing::CaseSpec s = variant_spec(d, head_dim, block_size, group, {50, 10}, 11);
    TreeCase t = make_tree_case(s, {10, 6}, true);
    std::mt19937_64 rng(s.seed);
    // New tokens 3 and 7 of sequence 0 and token 0 of sequence 1: no row's bit, NaN K and V.
    for (auto [b, j] : {std::pair{0, 3}, {0, 7}, {1, 0}}) {
      for (auto& row : t.masks[b]) row[j] = false;
      const int pos = s.context_lens[b] - t.qc.q_len(b) + j;
      plant(t.qc.c, b, pos, pos + 1, std::numeric_limits<float>::quiet_NaN());
    }
    t.packed = pack(t.masks, rng);
    const ReferenceResult ref = reference_decode(t.args());
    expect_every_backend(t, ref,
                         std::string("NaN in unattended new tokens, ") + dtype_name(d) + " D " +
                             std::to_string(head_dim) + ", ");
  }
}

TEST(TreeMaskBackends, ARowThatAttendsNothingIsEmpty) {
  // No context before the new tokens and an empty mask row: out 0 and lse -inf, or the sink.
  testing::CaseSpec s = variant_spec(DType::kF32, 64, 8, 2, {4}, 13);
  TreeCase t = make_tree_case(s, {4}, true);
  std::mt19937_64 rng(s.seed);
  t.masks[0] = {{false, false, false, false},
                {true, true, false, false},
                {false, false, false, false},
                {true, false, true, true}};
  t.packed = pack(t.masks, rng);
  for (bool sinks : {false, true}) {
    Variants v;
    if (sinks) v.sinks = sink_logits(s.num_heads);
    const ReferenceResult ref = reference_decode(t.args(v));
    for (int h = 0; h < s.num_heads; ++h) {
      EXPECT_EQ(ref.lse[h], sinks ? v.sinks[h] : -std::numeric_limits<double>::infinity());
    }
    expect_every_backend(t, ref, sinks ? "empty rows, sinks, " : "empty rows, ", v);
  }
}

TEST(TreeMaskBackends, ASingleQueryTokenMayDropItsOwnPosition) {
  // Sequences of one query token each under a tree mask: a clear bit (0, 0) drops the last
  // token, which one-token decode always attends.
  for (DType d : {DType::kBF16, DType::kF32}) {
    testing::CaseSpec s = variant_spec(d, 128, 16, 4, {40, 1, 17, 33}, 17);
    TreeCase t = make_tree_case(s, {1, 1, 1, 1}, true);
    std::mt19937_64 rng(s.seed);
    t.masks = {{{false}}, {{false}}, {{true}}, {{false}}};
    t.packed = pack(t.masks, rng);
    const ReferenceResult ref = reference_decode(t.args());
    expect_every_backend(t, ref, std::string("one query token, ") + dtype_name(d) + ", ");
  }
}

TEST(TreeMaskBackends, TheScalesOfTokensNoRowKeepsAreNeverUsed) {
  // Per-token scales: a new token no row keeps may hold any scale in range (2^99 here, with NaN
  // codes). The kept tokens' weights must not shrink by it (on the CUDA tensor cores, the unit of
  // a warp's V accumulator is the largest V scale of the tokens its rows weigh).
  for (DType cache : {DType::kFP8E5M2, DType::kInt8}) {
    const testing::CaseSpec s =
        quantized_spec(cache, DType::kBF16, 4, 1, 64, 1, {2, 40}, true, testing::seed_for_test());
    TreeCase t = make_tree_case(s, {1, 3}, true);
    std::mt19937_64 rng(s.seed);
    t.masks = {{{false}}, causal(3)};  // sequence 0 drops its own token; 1 drops new token 1
    for (auto& row : t.masks[1]) row[1] = false;
    t.packed = pack(t.masks, rng);
    const DecodeArgs a = t.args();
    const CacheLayout scales = a.token_scale_layout();
    for (const auto& [b, pos] : {std::pair{0, 1}, {1, 38}}) {
      const int id = t.qc.c.block_table[static_cast<std::size_t>(b) * t.qc.c.table_stride + pos];
      const std::int64_t at = scales.offset(id, 0, 0);
      t.qc.c.k_token_scales[at] = t.qc.c.v_token_scales[at] = std::ldexp(1.f, 99);
      plant(t.qc.c, b, pos, pos + 1, std::numeric_limits<float>::quiet_NaN());
    }
    const ReferenceResult ref = reference_decode(t.args());
    expect_every_backend(t, ref,
                         std::string("huge scales of dropped tokens, ") + dtype_name(cache) + ", ");
  }
}

TEST(TreeMaskNaive, TheBaselineMatchesTheReference) {
  // pagedattn-bench --tree-mask times the naive baseline on the same masks: random trees and any
  // lower-triangular pattern (empty rows, and blocks whose every token is masked out, among them).
  for (bool trees : {true, false}) {
    for (VariantKind k : {VariantKind::kPlain, VariantKind::kAll}) {
      testing::CaseSpec s = variant_spec(DType::kBF16, 64, 4, 4, {300, 17, 4, 64, 1});
      TreeCase t = make_tree_case(s, {16, 9, 6, 0, 1}, trees);
      const Variants v = variants_of(k, s.num_heads);
      const ReferenceResult ref = reference_decode(t.args(v));
      t.qc.c.poison_outputs();
      testing::naive_decode(t.args(v), 2);
      expect_rows_near(t.qc, ref, 0, t.qc.rows(),
                       describe(v) + (trees ? " naive, trees" : " naive, lower triangles"));
    }
  }
}

struct BadMask {
  std::string what, argument;
  std::function<void(DecodeArgs&, PackedMasks&)> apply;
  std::vector<std::string> parts;
};

// Malformed tree-mask arguments of a case of three sequences with 3, 0 and 2 query tokens.
std::vector<BadMask> bad_masks() {
  return {
      {"mask without indptr",
       "tree_mask_indptr",
       [](DecodeArgs& a, PackedMasks&) { a.tree_mask_indptr = nullptr; },
       {"together"}},
      {"indptr without mask",
       "tree_mask",
       [](DecodeArgs& a, PackedMasks&) { a.tree_mask = nullptr; },
       {"together"}},
      {"no q_indptr",
       "q_indptr",
       [](DecodeArgs& a, PackedMasks&) {
         a.q_indptr = nullptr;
         a.num_q_tokens = a.max_q_len = 0;
       },
       {"needs q_indptr"}},
      {"negative first offset",
       "tree_mask_indptr[0]",
       [](DecodeArgs&, PackedMasks& p) { p.indptr[0] = -1; },
       {"-1"}},
      {"too few bytes",
       "tree_mask_indptr[1]",
       [](DecodeArgs&, PackedMasks& p) { p.indptr[1] = p.indptr[0]; },
       {"needs 2"}},
      {"a bit above the diagonal",
       "tree_mask bit (0, 1) of sequence 2",
       [](DecodeArgs&, PackedMasks& p) { p.bytes[p.indptr[2]] |= 1u << 1; },
       {"later token 1"}},
  };
}

// Each of bad_masks() on a case of three sequences with 3, 0 and 2 query tokens, its outputs
// poisoned: refuse(args, mask) checks the error a call raises; nothing may be written.
void expect_bad_masks_refused(
    const std::function<void(const DecodeArgs&, const BadMask&)>& refuse) {
  testing::CaseSpec s = bad_input_spec();
  TreeCase t = make_tree_case(s, {3, 0, 2}, true);
  for (const BadMask& k : bad_masks()) {
    PackedMasks p = t.packed;
    DecodeArgs a = with_masks(t.qc.args(), p);
    k.apply(a, p);
    t.qc.c.poison_outputs();
    const Unwritten unwritten(t.qc.c);
    refuse(a, k);
    unwritten.check();
  }
}

TEST(TreeMaskValidation, BadMasksAreErrorsAndWriteNothing) {
  expect_bad_masks_refused([](const DecodeArgs& a, const BadMask& k) {
    detail::DecodeOptions o;
    o.backend = Backend::kCpu;
    const ErrorCode code = ErrorCode::kInvalidArgument;
    expect_error([&] { detail::decode(a, o); }, code, k.argument, k.parts, "decode: " + k.what);
    expect_error([&] { reference_decode(a); }, code, k.argument, k.parts, "reference: " + k.what);
  });
}

// The same errors from the CUDA backend in checked mode, the masks in device memory; nothing
// written.
TEST(TreeMaskValidation, CudaCheckedModeRefusesBadMasks) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  expect_bad_masks_refused([](const DecodeArgs& a, const BadMask& k) {
    expect_error([&] { decode_on(Backend::kCuda, a, false, /*checked=*/true); },
                 ErrorCode::kInvalidArgument, k.argument, k.parts, "cuda: " + k.what);
  });
}

}  // namespace
}  // namespace pagedattn
