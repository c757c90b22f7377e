// Multi-token queries (DecodeArgs::q_indptr, num_q_tokens, max_q_len) on every backend. Query
// token i of sequence b (n_b tokens) sits at position P = L_b - n_b + i and must be exactly a
// one-token query of a context of P + 1 tokens: checked against the f64 reference over dtypes,
// head dims, GQA groups, block sizes, query and context lengths and the attention variants; row
// by row against one-token decodes on the same backend (which does not trust the reference's
// multi-token loop); for causality (NaN and huge values after a query's position never reach
// it); for what is never read (table entries before the earliest query's window, past the
// context, of sequences without query tokens); for the argument errors; and with row strides,
// lse rows, zero query tokens and sequences without query tokens. The CUDA rows skip where no
// device is present.
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
#include <thread>
#include <utility>
#include <vector>

#include "bad_input.hpp"
#include "gtest_printers.hpp"
#include "pagedattn/cache_layout.hpp"
#include "pagedattn/context_parallel.hpp"
#include "pagedattn/detail/dispatch.hpp"
#include "pagedattn/reference.hpp"
#include "pagedattn/testing/device_case.hpp"
#include "pagedattn/testing/device_memory.hpp"
#include "pagedattn/testing/poison.hpp"
#include "pagedattn/testing/random_case.hpp"
#include "pagedattn/testing/tolerance.hpp"
#include "pagedattn/variants.hpp"
#include "query_case.hpp"
#include "test_seed.hpp"
#include "variant_args.hpp"

namespace pagedattn {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

Variants all_variants(int heads, int window_left) {
  return {window_left, 30.f, alibi_slopes(heads), sink_logits(heads)};
}

// Makes everything no query token reads unreadable, so that reading it shows as a NaN or an
// out-of-bounds access: in a sequence with query tokens, the blocks wholly before the earliest
// query's window (queries_first_token) and the slots of its first block before it; in a sequence
// without query tokens, every block of its context. Their table entries become -1, ids past the
// pool, negative garbage, the id of a block no sequence owns (NaN throughout), or keep their id
// while the block fills with NaN. make_case already leaves -1 and garbage past each context.
void poison_unread(QueryCase& qc, int window_left) {
  testing::HostCase& c = qc.c;
  const int BS = c.spec.block_size;
  const int spare = testing::unowned_block(c);
  ASSERT_LT(spare, c.num_blocks) << "the case needs a spare block";
  for (int b = 0; b < c.spec.batch; ++b) {
    const int L = c.context_lens[b], n = qc.q_len(b);
    const int t0 = n > 0 ? queries_first_token(L, n, window_left) : L;
    const int first = n > 0 ? t0 / BS : blocks_for(L, BS);
    testing::poison_table_entries(c, b, first, spare);
    if (n > 0 && t0 > first * BS) testing::store_nan_tokens(c, b, first * BS, t0);
  }
}

// Device copies of every buffer a host DecodeArgs points at, q_indptr included, with q, out and
// lse of the given sizes (the host's buffers); out and lse carry the host's poison.
class DeviceQueryCase {
 public:
  DeviceQueryCase(const DecodeArgs& host, std::size_t q_bytes, std::size_t out_bytes,
                  std::size_t lse_floats)
      : args_(host), out_bytes_(out_bytes), lse_bytes_(lse_floats * sizeof(float)) {
    using testing::DeviceBuffer;
    const CacheLayout layout =
        CacheLayout::dense(host.num_blocks, host.num_kv_heads, host.block_size, host.head_dim);
    const std::size_t cache_bytes = static_cast<std::size_t>(layout.elements());
    const std::size_t table_elems =
        static_cast<std::size_t>(host.batch - 1) * host.table_stride() + host.max_blocks_per_seq;
    const std::size_t head_bytes = static_cast<std::size_t>(host.num_heads) * sizeof(float);
    q_ = DeviceBuffer(host.q, q_bytes);
    k_ = DeviceBuffer(host.k_cache, cache_bytes * dtype_size(host.k_dtype));
    v_ = DeviceBuffer(host.v_cache, cache_bytes * dtype_size(host.v_dtype));
    table_ = DeviceBuffer(host.block_table, table_elems * sizeof(std::int32_t));
    lens_ = DeviceBuffer(host.context_lens, host.batch * sizeof(std::int32_t));
    out_ = DeviceBuffer(host.out, out_bytes_);
    args_.q = q_.get();
    args_.k_cache = k_.get();
    args_.v_cache = v_.get();
    args_.block_table = table_.as<const std::int32_t>();
    args_.context_lens = lens_.as<const std::int32_t>();
    args_.out = out_.get();
    const std::size_t kv_head_bytes = static_cast<std::size_t>(host.num_kv_heads) * sizeof(float);
    to_device(args_.q_indptr, (host.batch + 1) * sizeof(std::int32_t), indptr_);
    to_device(args_.lse, lse_bytes_, lse_);
    to_device(args_.alibi_slopes, head_bytes, slopes_);
    to_device(args_.sinks, head_bytes, sinks_);
    to_device(args_.k_scales, kv_head_bytes, k_scales_);
    to_device(args_.v_scales, kv_head_bytes, v_scales_);
  }
  explicit DeviceQueryCase(QueryCase& qc, const Variants& v = {})
      : DeviceQueryCase(with_variants(qc.args(), v), qc.c.q.size(), qc.c.out.size(),
                        qc.c.lse.size()) {}

  const DecodeArgs& args() const { return args_; }
  DecodeArgs& args() { return args_; }
  // Device memory for a replacement q_indptr (the validation cases).
  void set_q_indptr(const std::vector<std::int32_t>& indptr) {
    indptr_ = testing::DeviceBuffer(indptr.data(), indptr.size() * sizeof(std::int32_t));
    args_.q_indptr = indptr_.as<const std::int32_t>();
  }
  void download(void* out, float* lse) const {
    if (out_bytes_ > 0) testing::copy_to_host(out, out_.get(), out_bytes_);
    if (lse != nullptr && lse_bytes_ > 0) testing::copy_to_host(lse, lse_.get(), lse_bytes_);
  }

 private:
  // An optional array of the args (null when absent): a device copy of its `bytes` in `buf`,
  // the field pointed at it.
  template <typename T>
  static void to_device(T*& field, std::size_t bytes, testing::DeviceBuffer& buf) {
    if (field == nullptr) return;
    buf = testing::DeviceBuffer(field, bytes);
    field = buf.as<T>();
  }

  testing::DeviceBuffer q_, k_, v_, table_, lens_, indptr_, out_, lse_, slopes_, sinks_, k_scales_,
      v_scales_;
  DecodeArgs args_;
  std::size_t out_bytes_ = 0, lse_bytes_ = 0;
};

// Decodes the case with the variants on `backend`: on the CPU over the host buffers, on CUDA over
// device copies, out and lse copied back.
void run_query_decode(QueryCase& qc, const Variants& v, Backend backend,
                      detail::DecodeOptions o = {}) {
  o.backend = backend;
  if (backend != Backend::kCuda) {
    detail::decode(with_variants(qc.args(), v), o);
    return;
  }
  const DeviceQueryCase dev(qc, v);
  detail::decode(dev.args(), o);
  dev.download(qc.c.out.data(), qc.c.lse.data());
}

ReferenceResult query_reference(QueryCase& qc, const Variants& v) {
  return reference_decode(with_variants(qc.args(), v));
}

void expect_matches(const QueryCase& qc, const ReferenceResult& ref, const std::string& what,
                    double tolerance_factor = 1) {
  const testing::Comparison cmp = testing::compare_outputs(qc.c, ref);
  SCOPED_TRACE(what + ": " + qc.describe());
  EXPECT_TRUE(cmp.all_finite) << "first bad element: " << cmp.first_bad;
  EXPECT_LE(cmp.rel_err(), tolerance_factor * testing::out_tolerance(qc.c.spec.out_dtype));
  EXPECT_LE(cmp.max_abs_err_lse, tolerance_factor * testing::lse_tolerance());
}

// Whether rows [r0, r1) of out and lse hold the same bits in both cases.
void expect_rows_identical(const QueryCase& got, const QueryCase& want, int r0, int r1,
                           const std::string& what) {
  const testing::CaseSpec& s = got.c.spec;
  const std::size_t row_bytes =
      static_cast<std::size_t>(s.num_heads) * s.head_dim * dtype_size(s.out_dtype);
  for (int r = r0; r < r1; ++r) {
    EXPECT_EQ(
        std::memcmp(got.c.out.data() + r * row_bytes, want.c.out.data() + r * row_bytes, row_bytes),
        0)
        << what << ": out row " << r << " differs";
    EXPECT_EQ(std::memcmp(got.c.lse.data() + static_cast<std::size_t>(r) * s.num_heads,
                          want.c.lse.data() + static_cast<std::size_t>(r) * s.num_heads,
                          s.num_heads * sizeof(float)),
              0)
        << what << ": lse row " << r << " differs";
  }
}

// ---- The grid: against the f64 reference, plain and with every variant. ----

struct GridParam {
  Backend backend;
  VariantKind kind;
  DType dtype;  // q, out and, unless `cache` says otherwise, the caches
  GridShape shape;
  DType cache = DType::kF32;  // a quantized cache (scaled codes) when is_quantized
};
void PrintTo(const GridParam& p, std::ostream* os) {
  *os << backend_name(p.backend) << " " << kind_name(p.kind) << " " << dtype_name(p.dtype) << " d"
      << p.shape.head_dim << " bs" << p.shape.block_size << " g" << p.shape.group;
  if (is_quantized(p.cache)) *os << " cache " << dtype_name(p.cache);
}

class QueryTokenReference : public ::testing::TestWithParam<GridParam> {};

// One call of the grid test: the sequences (context length, query tokens) of `seqs` in one batch,
// for each variant configuration of p.kind, against the reference.
void check_query_grid(const GridParam& p, const std::vector<std::pair<int, int>>& seqs) {
  const int BS = p.shape.block_size;
  std::vector<int> lens, q_lens;
  for (const auto& [L, n] : seqs) lens.push_back(L), q_lens.push_back(n);
  testing::CaseSpec spec = variant_spec(p.dtype, p.shape.head_dim, BS, p.shape.group, lens);
  if (p.shape.group == kMaxGroupSize) {  // one kv head: the group alone makes it a large case
    spec.num_kv_heads = 1;
    spec.num_heads = kMaxGroupSize;
  }
  // Logits of order 9 (magnitude 3): large enough for a cap of 5 or 30 to bend them.
  if (p.kind == VariantKind::kSoftCap || p.kind == VariantKind::kAll) spec.magnitude = 3.f;
  if (is_quantized(p.cache)) {
    spec.kv_dtype = p.cache;
    spec.k_scale = 0.0625f;
    spec.v_scale = 3.f;
    spec.per_head_scales = true;
  }
  const QueryCase clean = make_query_case(spec, q_lens, p.kind == VariantKind::kAll ? 3 : 0);
  const int H = spec.num_heads;

  std::vector<Variants> configs;
  switch (p.kind) {
    case VariantKind::kPlain:
      configs.push_back({});
      break;
    case VariantKind::kWindow:
      // The last token alone, a block, one spanning several of the 33 queries' positions, and
      // more than any context. (The queries' positions put the window's first token at every
      // offset in a block.)
      for (int w : {0, BS, 20, 4000}) configs.push_back({w, 0.f, {}, {}});
      break;
    case VariantKind::kSoftCap:  // all_variants has a cap of 30
      configs.push_back({-1, 5.f, {}, {}});
      break;
    case VariantKind::kAlibi:
      configs.push_back({-1, 0.f, alibi_slopes(H), {}});
      break;
    case VariantKind::kSinks:
      configs.push_back({-1, 0.f, {}, sink_logits(H)});
      break;
    case VariantKind::kAll:
      if (p.shape.group < kMaxGroupSize) configs.push_back(all_variants(H, -1));
      if (p.shape.group < kMaxGroupSize) configs.push_back(all_variants(H, BS));
      configs.push_back(all_variants(H, 40));
      break;
  }
  for (const Variants& v : configs) {
    QueryCase qc = clean;
    const ReferenceResult ref = query_reference(qc, v);
    poison_unread(qc, v.window_left);
    run_query_decode(qc, v, p.backend);
    expect_matches(qc, ref, describe(v));
  }
}

TEST_P(QueryTokenReference, MatchesTheReference) {
  const GridParam& p = GetParam();
  if (p.backend == Backend::kCuda && !cuda_available()) GTEST_SKIP() << "no CUDA device";
  const int BS = p.shape.block_size;
  // (context length, query tokens): every query before the context (P < 0), a query of the
  // whole context, some queries before it, a context ending at a block boundary, queries
  // crossing one, a sequence without queries between others, 16 and 33 queries, and a context of
  // a few thousand tokens split into several work items and one of 1000 tokens with 8 queries
  // (32 or 64 rows per kv head at groups 4 and 8: the CUDA kernel's warps then fold 2 or 4
  // slices of a tile at once): on the smaller groups, in the bf16 rows of the plain call, the
  // window and all variants, and the f32 rows of the plain call (it makes a row slow).
  std::vector<std::pair<int, int>> seqs = {{0, 2}, {1, 1},   {3, 4},          {BS, 2}, {BS + 1, 8},
                                           {5, 0}, {37, 16}, {2 * BS + 3, 1}, {45, 33}};
  const bool long_context =
      p.shape.group <= 8 && ((p.dtype == DType::kBF16 &&
                              (p.kind == VariantKind::kPlain || p.kind == VariantKind::kWindow ||
                               p.kind == VariantKind::kAll)) ||
                             (p.dtype == DType::kF32 && p.kind == VariantKind::kPlain));
  if (long_context) seqs.insert(seqs.begin() + 2, {{2100, 4}, {1000, 8}});
  check_query_grid(p, seqs);
  // On the GPU more than 16 rows per kv head (query tokens x group) take the wide build of the
  // tensor-core kernel, as every call above does: the same sequences with at most 16 / group
  // query tokens each run the plain build.
  if (p.backend == Backend::kCuda) {
    for (auto& [L, n] : seqs) n = std::min(n, std::max(1, 16 / p.shape.group));
    SCOPED_TRACE("at most 16 rows per kv head");
    check_query_grid(p, seqs);
  }
}

std::vector<GridParam> grid_params() {
  std::vector<GridParam> v;
  // Head dims 64, 128 and 80 (a padded one), groups 1, 4, 8 and 16, block sizes 1, 16, 7 and 64
  // (with 16 and 64 at group 8, sm_90 takes its many-row kernel from 4 query tokens on);
  // group 64 at head dim 256 for the plain call and all variants together.
  const GridShape shapes[] = {{64, 16, 4}, {128, 16, 8}, {80, 7, 16}, {128, 1, 1}, {128, 64, 8}};
  for (Backend b : {Backend::kCpu, Backend::kCuda}) {
    for (VariantKind k : {VariantKind::kPlain, VariantKind::kWindow, VariantKind::kSoftCap,
                          VariantKind::kAlibi, VariantKind::kSinks, VariantKind::kAll}) {
      for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
        for (const GridShape& s : shapes) v.push_back({b, k, t, s});
      }
    }
    for (VariantKind k : {VariantKind::kPlain, VariantKind::kAll})
      v.push_back({b, k, DType::kBF16, {256, 16, 64}});
    // Quantized caches with f16 and bf16 q (the tensor cores on the GPU at head dims 64, 96, 128
    // and 256; 80 takes the CUDA cores), plain and with every variant.
    for (DType cache : {DType::kFP8E4M3, DType::kFP8E5M2, DType::kInt8}) {
      for (VariantKind k : {VariantKind::kPlain, VariantKind::kAll}) {
        v.push_back({b, k, DType::kBF16, {128, 16, 8}, cache});
        v.push_back({b, k, DType::kF16, {64, 16, 4}, cache});
      }
      v.push_back({b, VariantKind::kAll, DType::kBF16, {96, 7, 16}, cache});
      v.push_back({b, VariantKind::kAll, DType::kF16, {80, 16, 4}, cache});
      v.push_back({b, VariantKind::kPlain, DType::kBF16, {256, 16, 64}, cache});
    }
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Grid, QueryTokenReference, ::testing::ValuesIn(grid_params()),
                         [](const ::testing::TestParamInfo<GridParam>& i) {
                           const GridParam& p = i.param;
                           return std::string(backend_name(p.backend)) + "_" + kind_name(p.kind) +
                                  "_" + dtype_name(p.dtype) + "_d" +
                                  std::to_string(p.shape.head_dim) + "_bs" +
                                  std::to_string(p.shape.block_size) + "_g" +
                                  std::to_string(p.shape.group) +
                                  (is_quantized(p.cache) ? std::string("_") + dtype_name(p.cache)
                                                         : "");
                         });

// ---- Row by row: each query token is a one-token decode of its own context. ----

struct RowsParam {
  Backend backend;
  DType q_dtype, kv_dtype, out_dtype;
};
void PrintTo(const RowsParam& p, std::ostream* os) {
  *os << backend_name(p.backend) << " q " << dtype_name(p.q_dtype) << " kv "
      << dtype_name(p.kv_dtype) << " out " << dtype_name(p.out_dtype);
}

class QueryTokenRows : public ::testing::TestWithParam<RowsParam> {};

// Each row against a plain call (no q_indptr) of one sequence: that row's q, context length
// P + 1 (0 for P < 0), the same table row. With a window or ALiBi the CPU runs the multi-token
// call exactly that way, so with one split per sequence (a per-sequence plan) the bits are the
// same, and the whole call equals one plain call over all its rows with the bits of the default
// plan too. Otherwise (the CPU reads each sequence's K/V once for all its query tokens) and on
// CUDA, within the tolerance of two results rounded to the output dtype.
TEST_P(QueryTokenRows, EachRowIsAOneTokenDecodeOfItsOwnContext) {
  const RowsParam& p = GetParam();
  if (p.backend == Backend::kCuda && !cuda_available()) GTEST_SKIP() << "no CUDA device";
  testing::CaseSpec spec = variant_spec(p.kv_dtype, 128, 16, 4, {50, 0, 3, 17, 600, 40});
  spec.q_dtype = p.q_dtype;
  spec.out_dtype = p.out_dtype;
  spec.magnitude = 2.f;
  const QueryCase clean = make_query_case(spec, {8, 2, 5, 0, 3, 33}, 1);
  const int H = spec.num_heads, D = spec.head_dim;
  const std::size_t q_row = static_cast<std::size_t>(H) * D * dtype_size(spec.q_dtype);
  const std::size_t out_row = static_cast<std::size_t>(H) * D * dtype_size(spec.out_dtype);

  for (const Variants& v : {Variants{}, all_variants(H, 24)}) {
    SCOPED_TRACE(describe(v) + " " + clean.describe());
    QueryCase for_reference = clean;
    const ReferenceResult ref = query_reference(for_reference, v);
    for (const bool single_split : {false, true}) {
      SCOPED_TRACE(single_split ? "single split" : "default plan");
      detail::DecodeOptions o;
      o.backend = p.backend;
      o.single_split = single_split;
      QueryCase multi = clean;
      run_query_decode(multi, v, p.backend, o);

      // One plain call per row.
      QueryCase rows = clean;
      for (int b = 0; b < spec.batch; ++b) {
        for (int i = 0; i < clean.q_len(b); ++i) {
          const int r = clean.indptr[b] + i;
          const std::int32_t len = std::max(0, clean.position(b, i) + 1);
          DecodeArgs a = with_variants(rows.c.args(), v);
          a.batch = 1;
          a.q = rows.c.q.data() + r * q_row;
          a.out = rows.c.out.data() + r * out_row;
          a.lse = rows.c.lse.data() + static_cast<std::size_t>(r) * H;
          a.context_lens = &len;
          a.block_table = &table_entry(rows.c, b, 0);
          if (p.backend == Backend::kCuda) {
            testing::cuda_decode_from_host(a, o);
          } else {
            detail::decode(a, o);
          }
        }
      }
      // One plain call over all the rows: a sequence per query token.
      QueryCase batched = clean;
      std::vector<std::int32_t> lens, table;
      for (int b = 0; b < spec.batch; ++b) {
        for (int i = 0; i < clean.q_len(b); ++i) {
          lens.push_back(std::max(0, clean.position(b, i) + 1));
          const std::int32_t* row = &table_entry(batched.c, b, 0);
          table.insert(table.end(), row, row + clean.c.table_stride);
        }
      }
      DecodeArgs a = with_variants(batched.c.args(), v);
      a.batch = clean.rows();
      a.context_lens = lens.data();
      a.block_table = table.data();
      // Its sequences repeat their tables' rows (each query token its sequence's), which the
      // default would read once per group (docs/shared_prefix.md): compared bit for bit with the
      // multi-token call, it runs without sharing.
      detail::DecodeOptions unshared = o;
      unshared.share_prefixes = false;
      if (p.backend == Backend::kCuda) {
        testing::cuda_decode_from_host(a, unshared);
      } else {
        detail::decode(a, unshared);
      }

      const bool per_token =
          p.backend == Backend::kCpu && (v.window_left >= 0 || !v.slopes.empty());
      if (per_token) {
        if (single_split) expect_rows_identical(multi, rows, 0, clean.rows(), "one call per row");
        expect_rows_identical(multi, batched, 0, clean.rows(), "one call over all rows");
      } else {
        for (const QueryCase* plain : {&rows, &batched}) {
          ReferenceResult want;
          want.out.resize(static_cast<std::size_t>(clean.rows()) * H * D);
          for (std::size_t i = 0; i < want.out.size(); ++i) {
            want.out[i] = load_as_float(plain->c.out.data(), spec.out_dtype, i);
          }
          want.lse.assign(plain->c.lse.begin(), plain->c.lse.end());
          expect_matches(multi, want,
                         plain == &rows ? "one call per row" : "one call over all rows", 2);
        }
      }
      // And the plain calls agree with the reference, so the property is not vacuous.
      expect_matches(rows, ref, "plain calls");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    All, QueryTokenRows,
    ::testing::Values(RowsParam{Backend::kCpu, DType::kF32, DType::kF32, DType::kF32},
                      RowsParam{Backend::kCpu, DType::kF16, DType::kF16, DType::kF16},
                      RowsParam{Backend::kCpu, DType::kBF16, DType::kBF16, DType::kBF16},
                      RowsParam{Backend::kCpu, DType::kF32, DType::kBF16, DType::kF16},
                      RowsParam{Backend::kCuda, DType::kF32, DType::kF32, DType::kF32},
                      RowsParam{Backend::kCuda, DType::kF16, DType::kF16, DType::kF16},
                      RowsParam{Backend::kCuda, DType::kBF16, DType::kBF16, DType::kBF16},
                      RowsParam{Backend::kCuda, DType::kF32, DType::kBF16, DType::kF16}),
    [](const ::testing::TestParamInfo<RowsParam>& i) {
      return std::string(backend_name(i.param.backend)) + "_" + dtype_name(i.param.q_dtype) + "_" +
             dtype_name(i.param.kv_dtype) + "_" + dtype_name(i.param.out_dtype);
    });

// ---- Causality and what is never read. ----

struct CausalParam {
  Backend backend;
  DType dtype;
  // 128 / 16 / 8: 40 to 96 rows per kv head, which CUDA runs on the Hopper many-row kernel where
  // the device has it.
  int head_dim = 64, block_size = 7, group = 4;
};
void PrintTo(const CausalParam& p, std::ostream* os) {
  *os << backend_name(p.backend) << " " << dtype_name(p.dtype) << " d" << p.head_dim;
}

class QueryTokenCausality : public ::testing::TestWithParam<CausalParam> {};

// NaN, or values so large that reading them would dominate the softmax, in the keys and values of
// the tokens after query i's position leave rows 0 .. i of that sequence (and every other
// sequence) as they were; the later queries attend a NaN key, so they are NaN, as in the
// reference. Queries at P < 0 see the whole context poisoned and still give out = 0.
TEST_P(QueryTokenCausality, LaterTokensNeverReachEarlierQueries) {
  const CausalParam& p = GetParam();
  if (p.backend == Backend::kCuda && !cuda_available()) GTEST_SKIP() << "no CUDA device";
  const testing::CaseSpec spec =
      variant_spec(p.dtype, p.head_dim, p.block_size, p.group, {40, 23, 9, 150});
  const QueryCase clean = make_query_case(spec, {8, 5, 12, 6});
  const int H = spec.num_heads;
  const float huge = p.dtype == DType::kF16 ? 6e4f : 1e30f;

  for (const Variants& v : {Variants{}, all_variants(H, 10)}) {
    SCOPED_TRACE(describe(v));
    QueryCase base = clean;
    run_query_decode(base, v, p.backend);
    const ReferenceResult ref = query_reference(base, v);
    expect_matches(base, ref, "clean");
    for (int b = 0; b < spec.batch; ++b) {
      const int n = clean.q_len(b), L = clean.c.context_lens[b];
      std::vector<int> picks;
      for (const int i : {0, n / 2, n - 2}) {
        if (i >= 0 && std::find(picks.begin(), picks.end(), i) == picks.end()) picks.push_back(i);
      }
      for (const int i : picks) {
        const int P = clean.position(b, i);
        if (std::max(P + 1, 0) >= L) continue;  // no token after it
        const int r0 = clean.indptr[b], ri = r0 + i, r1 = clean.indptr[b + 1];
        for (const float value : {kNaN, huge}) {
          SCOPED_TRACE("sequence " + std::to_string(b) + " query " + std::to_string(i) +
                       " at P = " + std::to_string(P) +
                       ", tokens after it = " + std::to_string(value));
          QueryCase qc = clean;
          plant(qc.c, b, std::max(P + 1, 0), L, value);
          run_query_decode(qc, v, p.backend);
          // The untouched rows: this sequence's up to query i, and every other sequence's.
          const std::pair<int, int> kept[] = {{0, ri + 1}, {r1, clean.rows()}};
          for (const auto& [k0, k1] : kept) {
            if (p.backend == Backend::kCpu) {
              expect_rows_identical(qc, base, k0, k1, "unaffected rows");
            } else {
              expect_rows_near(qc, ref, k0, k1, "unaffected rows");
            }
          }
          if (std::isnan(value)) {
            const ReferenceResult poisoned = query_reference(qc, v);
            // A later query at P >= 0 attends its own token, which is poisoned.
            for (int r = ri + 1; r < r1; ++r) {
              if (clean.position(b, r - r0) < 0) continue;
              ASSERT_TRUE(std::isnan(poisoned.lse[static_cast<std::size_t>(r) * H]))
                  << "reference, row " << r;
            }
            expect_rows_near(qc, poisoned, ri + 1, r1, "later rows");
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, QueryTokenCausality,
                         ::testing::Values(CausalParam{Backend::kCpu, DType::kF32},
                                           CausalParam{Backend::kCpu, DType::kF16},
                                           CausalParam{Backend::kCpu, DType::kBF16},
                                           CausalParam{Backend::kCuda, DType::kF32},
                                           CausalParam{Backend::kCuda, DType::kF16},
                                           CausalParam{Backend::kCuda, DType::kBF16},
                                           CausalParam{Backend::kCuda, DType::kBF16, 128, 16, 8},
                                           CausalParam{Backend::kCuda, DType::kF16, 128, 16, 8}),
                         [](const ::testing::TestParamInfo<CausalParam>& i) {
                           return std::string(backend_name(i.param.backend)) + "_" +
                                  dtype_name(i.param.dtype) +
                                  (i.param.head_dim == 64 ? "" : "_d128_many_rows");
                         });

struct UnreadParam {
  Backend backend;
  bool cuda_checked;
};
void PrintTo(const UnreadParam& p, std::ostream* os) {
  *os << backend_name(p.backend) << (p.cuda_checked ? " checked" : "");
}

class QueryTokenUnread : public ::testing::TestWithParam<UnreadParam> {};

// Table entries before the earliest query's window, past the context, and in the rows of
// sequences without query tokens hold -1, ids past the pool and garbage, and the blocks they name
// hold NaN: the results are those of the clean case, and validation (the CPU's, CUDA's checked
// mode) accepts them.
TEST_P(QueryTokenUnread, TableEntriesNoQueryReadsDoNotMatter) {
  const UnreadParam& p = GetParam();
  if (p.backend == Backend::kCuda && !cuda_available()) GTEST_SKIP() << "no CUDA device";
  testing::CaseSpec spec = variant_spec(DType::kBF16, 128, 16, 4, {100, 2, 60, 0, 37, 500});
  spec.table_padding = 4;
  const QueryCase clean = make_query_case(spec, {4, 5, 0, 3, 6, 2});
  const int H = spec.num_heads;
  for (const Variants& v :
       {Variants{}, Variants{20, 0.f, {}, {}}, all_variants(H, 5), all_variants(H, 300)}) {
    SCOPED_TRACE(describe(v));
    QueryCase base = clean, qc = clean;
    const ReferenceResult ref = query_reference(base, v);
    run_query_decode(base, v, p.backend);
    poison_unread(qc, v.window_left);
    // Sequence 3 (an empty context with 3 queries) reads nothing either: its whole row is -1.
    for (int i = 0; i < qc.c.table_stride; ++i) table_entry(qc.c, 3, i) = -1;
    detail::DecodeOptions o;
    o.cuda_checked = p.cuda_checked;
    run_query_decode(qc, v, p.backend, o);
    expect_matches(qc, ref, "poisoned");
    if (p.backend == Backend::kCpu) expect_rows_identical(qc, base, 0, clean.rows(), "poisoned");
  }
}

INSTANTIATE_TEST_SUITE_P(All, QueryTokenUnread,
                         ::testing::Values(UnreadParam{Backend::kCpu, false},
                                           UnreadParam{Backend::kCuda, false},
                                           UnreadParam{Backend::kCuda, true}),
                         [](const ::testing::TestParamInfo<UnreadParam>& i) {
                           return std::string(backend_name(i.param.backend)) +
                                  (i.param.cuda_checked ? "_checked" : "");
                         });

// ---- Argument errors: typed, naming the argument, nothing written. ----

// Three sequences of 20, 0 and 9 tokens with 3, 2 and 4 query tokens (9 rows, max_q_len 4).
QueryCase validation_case() {
  testing::CaseSpec spec = bad_input_spec();
  spec.seed = testing::seed_for(0x9e1d);
  QueryCase qc = make_query_case(spec, {3, 2, 4});
  // Room for 16 rows, so that a count the validation let through shows as a failure, not as a
  // write past the buffers.
  const std::size_t row = static_cast<std::size_t>(spec.num_heads) * spec.head_dim;
  qc.c.q.resize(16 * row * dtype_size(spec.q_dtype));
  qc.c.out.resize(16 * row * dtype_size(spec.out_dtype));
  qc.c.lse.resize(16 * static_cast<std::size_t>(spec.num_heads));
  // Finite sentinels (0x3F bytes are finite in every dtype), so that a write shows.
  std::fill(qc.c.out.begin(), qc.c.out.end(), std::uint8_t{0x3F});
  std::fill(qc.c.lse.begin(), qc.c.lse.end(), 12345.f);
  return qc;
}

struct BadQuery {
  std::string what;
  std::vector<std::int32_t> indptr;  // empty: no q_indptr
  int num_q_tokens, max_q_len;
  ErrorCode code;
  std::string argument;  // what Error::argument() names
  std::string message;   // a part of the message
  // A change to the case's tables instead (block_table / context_lens errors): (seq, entry, id)
  // in the table, or entry -1 for context_lens[seq] = id; and the window of the call.
  int seq = -1, entry = 0, value = 0;
  int window_left = -1;
};

std::vector<BadQuery> bad_queries() {
  const ErrorCode inv = ErrorCode::kInvalidArgument, oor = ErrorCode::kOutOfRange;
  const std::int32_t kMax = std::numeric_limits<std::int32_t>::max();
  const std::int32_t kMin = std::numeric_limits<std::int32_t>::min();
  return {
      {"q_indptr[0] = 1", {1, 3, 5, 9}, 9, 4, inv, "q_indptr[0]", "q_indptr[0] = 1"},
      {"q_indptr[0] = -1", {-1, 3, 5, 9}, 9, 4, inv, "q_indptr[0]", "q_indptr[0] = -1"},
      {"decreasing q_indptr", {0, 3, 2, 9}, 9, 4, oor, "q_indptr[2]", "q_indptr[2] = 2"},
      {"q_indptr falling to INT32_MIN", {0, 3, kMin, 9}, 9, 4, oor, "q_indptr[2]", "q_indptr[2]"},
      {"more query tokens than max_q_len",
       {0, 3, 8, 12},
       12,
       4,
       oor,
       "q_indptr[2]",
       "max_q_len = 4"},
      {"the last sequence over max_q_len",
       {0, 3, 5, 10},
       10,
       4,
       oor,
       "q_indptr[3]",
       "max_q_len = 4"},
      {"a count of INT32_MAX", {0, kMax, kMax, kMax}, kMax, 4, oor, "q_indptr[1]", "max_q_len = 4"},
      {"q_indptr[batch] != num_q_tokens",
       {0, 3, 5, 9},
       8,
       4,
       inv,
       "q_indptr[3]",
       "num_q_tokens = 8"},
      {"q_indptr[batch] below num_q_tokens",
       {0, 3, 5, 9},
       10,
       4,
       inv,
       "q_indptr[3]",
       "num_q_tokens = 10"},
      {"max_q_len 0 with q_indptr", {0, 3, 5, 9}, 9, 0, inv, "max_q_len", "max_q_len = 0"},
      {"negative max_q_len", {0, 3, 5, 9}, 9, -2, inv, "max_q_len", "max_q_len = -2"},
      {"negative num_q_tokens", {0, 3, 5, 9}, -1, 4, inv, "num_q_tokens", "num_q_tokens = -1"},
      {"num_q_tokens without q_indptr", {}, 9, 0, inv, "num_q_tokens", "num_q_tokens = 9"},
      {"max_q_len without q_indptr", {}, 0, 4, inv, "max_q_len", "max_q_len = 4"},
      {"both without q_indptr", {}, 9, 4, inv, "num_q_tokens", "num_q_tokens = 9"},
      // The tables are still checked where a query reads them.
      {"a bad block id a query reads",
       {0, 3, 5, 9},
       9,
       4,
       oor,
       "block_table[2][1]",
       "block_table[2][1] = -1",
       2,
       1,
       -1},
      // With a window of 3 tokens, block 1 of sequence 0 (tokens 8-15) is read by its first
      // query (P = 17) only.
      {"a bad block id only the earliest query's window reads",
       {0, 3, 5, 9},
       9,
       4,
       oor,
       "block_table[0][1]",
       "block_table[0][1] = -1",
       0,
       1,
       -1,
       2},
      {"a context past the table",
       {0, 3, 5, 9},
       9,
       4,
       oor,
       "context_lens[1]",
       "context_lens[1] = 1000",
       1,
       -1,
       1000},
  };
}

void apply(QueryCase& qc, const BadQuery& k) {
  if (k.seq < 0) return;
  if (k.entry < 0) {
    qc.c.context_lens[k.seq] = k.value;
  } else {
    table_entry(qc.c, k.seq, k.entry) = k.value;
  }
}

void expect_error(const std::string& who, const BadQuery& k, const std::function<void()>& call) {
  expect_error(call, k.code, k.argument, {k.message}, who + " with " + k.what);
}

TEST(QueryTokenValidation, BadQueryArgumentsAreErrorsAndWriteNothing) {
  for (const BadQuery& k : bad_queries()) {
    SCOPED_TRACE(k.what);
    QueryCase qc = validation_case();
    apply(qc, k);
    const Unwritten unwritten(qc.c);
    DecodeArgs a = qc.c.args();
    a.window_left = k.window_left;
    a.q_indptr = k.indptr.empty() ? nullptr : k.indptr.data();
    a.num_q_tokens = k.num_q_tokens;
    a.max_q_len = k.max_q_len;
    expect_error("decode", k, [&] { decode(a, DecodeOptions{Backend::kCpu}); });
    unwritten.check();
    expect_error("the reference", k, [&] { reference_decode(a); });
  }
}

// The same errors from the CUDA backend with cuda_checked, q_indptr in device memory.
TEST(QueryTokenValidation, CudaCheckedModeRefusesBadQueryArguments) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  for (const BadQuery& k : bad_queries()) {
    SCOPED_TRACE(k.what);
    QueryCase qc = validation_case();
    apply(qc, k);
    DeviceQueryCase dev(qc);
    DecodeArgs& a = dev.args();
    if (k.indptr.empty()) {
      a.q_indptr = nullptr;
    } else {
      dev.set_q_indptr(k.indptr);
    }
    a.window_left = k.window_left;
    a.num_q_tokens = k.num_q_tokens;
    a.max_q_len = k.max_q_len;
    DecodeOptions o;
    o.backend = Backend::kCuda;
    o.cuda_checked = true;
    expect_error("decode", k, [&] { decode(a, o); });
    std::vector<std::uint8_t> out(qc.c.out.size());
    std::vector<float> lse(qc.c.lse.size());
    dev.download(out.data(), lse.data());
    EXPECT_TRUE(out == qc.c.out) << "out was written despite the error";
    EXPECT_EQ(std::memcmp(lse.data(), qc.c.lse.data(), lse.size() * sizeof(float)), 0)
        << "lse was written despite the error";
  }
}

// batch 0 is a no-op whatever q_indptr points at (it is not read).
// More query tokens than context + 1 with a window_left near INT32_MAX: the earliest query's
// window start must not overflow (it once did, and validation then skipped the sequence's table
// entries, so a bad block id reached the kernel).
TEST(QueryTokenValidation, HugeWindowWithMoreQueriesThanContext) {
  // One head, one sequence of one token with three query tokens, a pool of one block.
  testing::CaseSpec spec = testing::shaped_spec(DType::kF32, 1, 1, 64, 16, {1});
  spec.spare_blocks = 0;
  spec.seed = testing::seed_for_test();
  QueryCase qc = make_query_case(spec, {3});
  const Variants huge_window{std::numeric_limits<std::int32_t>::max(), 0.f, {}, {}};
  const std::int32_t valid_id = table_entry(qc.c, 0, 0);
  table_entry(qc.c, 0, 0) = 1000000;
  {
    const Unwritten unwritten(qc.c);
    expect_error([&] { run_query_decode(qc, huge_window, Backend::kCpu); }, ErrorCode::kOutOfRange,
                 "block_table[0][0]", {"block_table[0][0] = 1000000"},
                 "block id 1000000 of a 1-block pool");
    unwritten.check();
  }
  // With a valid id every query token's result matches the reference.
  table_entry(qc.c, 0, 0) = valid_id;
  const ReferenceResult ref = query_reference(qc, huge_window);
  run_query_decode(qc, huge_window, Backend::kCpu);
  expect_matches(qc, ref, "a valid block id");
}

TEST(QueryTokenValidation, EmptyBatchReadsNothing) {
  const std::int32_t garbage[] = {77};
  DecodeArgs a;
  a.num_heads = 4;
  a.num_kv_heads = 2;
  a.head_dim = 64;
  a.block_size = 16;
  a.q_indptr = garbage;
  a.num_q_tokens = 0;
  a.max_q_len = 8;
  EXPECT_NO_THROW(decode(a, DecodeOptions{Backend::kCpu}));
  EXPECT_NO_THROW(reference_decode(a));
}

// A rank of a context-parallel group holds a share of each context, which has no place for the
// queries' positions: q_indptr is refused by name on every rank that sets it, and the ranks that
// do not set it name the rank that did. Nothing is written.
TEST(QueryTokenContextParallel, QIndptrIsRefusedOnEveryRank) {
  const QueryCase base = validation_case();
  for (int ranks : {1, 2, 3}) {
    for (int only : {-1, ranks - 1}) {  // every rank sets it, or the last one only
      if (only >= 0 && ranks == 1) continue;
      SCOPED_TRACE(std::to_string(ranks) + " ranks, " +
                   (only < 0 ? "on every rank" : "on the last rank"));
      auto group = make_local_group(ranks);
      std::vector<QueryCase> cases(ranks, base);
      std::vector<std::string> errors(ranks);
      std::vector<ErrorCode> code(ranks, ErrorCode::kInvalidArgument);
      std::vector<std::thread> threads;
      for (int r = 0; r < ranks; ++r) {
        threads.emplace_back([&, r] {
          // Every rank has as many q rows as sequences, so that the ranks without q_indptr are
          // valid calls.
          DecodeArgs a = only < 0 || r == only ? cases[r].args() : cases[r].c.args();
          try {
            context_parallel_decode(a, *group[r], DecodeOptions{Backend::kCpu});
            errors[r] = "(none)";
          } catch (const Error& e) {
            errors[r] = e.argument();
            code[r] = e.code();
          }
        });
      }
      for (std::thread& t : threads) t.join();
      for (int r = 0; r < ranks; ++r) {
        if (only < 0 || r == only) {
          EXPECT_EQ(errors[r], "q_indptr") << "rank " << r;
          EXPECT_EQ(code[r], ErrorCode::kUnsupported) << "rank " << r;
        } else {
          EXPECT_EQ(errors[r], "rank") << "rank " << r;
        }
        EXPECT_TRUE(cases[r].c.out == base.c.out) << "rank " << r << " wrote out";
        EXPECT_TRUE(cases[r].c.lse == base.c.lse) << "rank " << r << " wrote lse";
      }
    }
  }
}

// ---- Rows: strides, lse, sequences without query tokens, no query token at all. ----

class QueryTokenLayout : public ::testing::TestWithParam<Backend> {};

// q rows inside a fused QKV buffer (its K and V parts NaN, never read) and out rows inside a
// wider buffer (a sentinel between them, never written), one row per query token: the bits of
// the dense call, and the reference reads the strided q the same way.
TEST_P(QueryTokenLayout, RowStridesGiveTheDenseResult) {
  const Backend backend = GetParam();
  if (backend == Backend::kCuda && !cuda_available()) GTEST_SKIP() << "no CUDA device";
  for (DType dt : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(dtype_name(dt));
    const testing::CaseSpec spec = variant_spec(dt, 128, 16, 4, {0, 40, 9, 300, 2});
    QueryCase dense = make_query_case(spec, {2, 7, 0, 12, 5});
    const int H = spec.num_heads, KV = spec.num_kv_heads, D = spec.head_dim, rows = dense.rows();
    const Variants v = all_variants(H, 50);
    run_query_decode(dense, v, backend);

    const std::int64_t row = static_cast<std::int64_t>(H) * D;
    const std::int64_t q_stride = static_cast<std::int64_t>(H + 2 * KV) * D;
    const std::int64_t out_stride = row + 64;  // keeps CUDA's rows 16-byte aligned
    const std::size_t qsz = dtype_size(dt), osz = dtype_size(dt);
    std::vector<std::uint8_t> q(static_cast<std::size_t>(rows * q_stride) * qsz);
    for (std::int64_t i = 0; i < rows * q_stride; ++i) store_from_float(q.data(), dt, i, kNaN);
    for (int r = 0; r < rows; ++r) {
      std::memcpy(q.data() + r * q_stride * qsz, dense.c.q.data() + r * row * qsz, row * qsz);
    }
    // The last row ends where its elements do: a write past them would be out of bounds.
    std::vector<std::uint8_t> out(static_cast<std::size_t>((rows - 1) * out_stride + row) * osz,
                                  0xA5);
    std::vector<float> lse(static_cast<std::size_t>(rows) * H, kNaN);
    DecodeArgs a = with_variants(dense.args(), v);
    a.q = q.data();
    a.out = out.data();
    a.lse = lse.data();
    a.q_row_stride = q_stride;
    a.out_row_stride = out_stride;
    if (backend == Backend::kCpu) {
      decode(a, DecodeOptions{Backend::kCpu});
    } else {
      DeviceQueryCase dev(a, q.size(), out.size(), lse.size());
      decode(dev.args(), DecodeOptions{Backend::kCuda});
      dev.download(out.data(), lse.data());
    }
    for (int r = 0; r < rows; ++r) {
      const std::uint8_t* got = out.data() + r * out_stride * osz;
      EXPECT_EQ(std::memcmp(got, dense.c.out.data() + r * row * osz, row * osz), 0)
          << "row " << r << " differs from the dense call";
      for (std::size_t i = row * osz; i < out_stride * osz && r + 1 < rows; ++i) {
        ASSERT_EQ(got[i], 0xA5) << "byte " << i << " past row " << r << " written";
      }
    }
    EXPECT_EQ(std::memcmp(lse.data(), dense.c.lse.data(), lse.size() * sizeof(float)), 0);
    const ReferenceResult ref_dense = query_reference(dense, v);
    const ReferenceResult ref = reference_decode(a);
    EXPECT_EQ(ref.out, ref_dense.out);
    EXPECT_EQ(ref.lse, ref_dense.lse);
  }
}

// lse is optional with q_indptr too: without it out holds the same bits. Its rows are the query
// rows: a query at P < 0 gives out = 0 and lse = -inf, or the sink (on CUDA to f32 rounding);
// the rows of a sequence's later queries follow the rows of a sequence without any.
TEST_P(QueryTokenLayout, LseRowsAreQueryRows) {
  const Backend backend = GetParam();
  if (backend == Backend::kCuda && !cuda_available()) GTEST_SKIP() << "no CUDA device";
  const testing::CaseSpec spec = variant_spec(DType::kF32, 64, 16, 4, {2, 0, 30, 18});
  const QueryCase clean = make_query_case(spec, {5, 3, 0, 4});  // P < 0: rows 0-2 and 5-7
  const int H = spec.num_heads, D = spec.head_dim;
  for (const Variants& v : {Variants{}, all_variants(H, 7)}) {
    SCOPED_TRACE(describe(v));
    QueryCase qc = clean;
    run_query_decode(qc, v, backend);
    expect_matches(qc, query_reference(qc, v), "with lse");
    for (int r : {0, 1, 2, 5, 6, 7}) {
      for (int h = 0; h < H; ++h) {
        const std::size_t at = static_cast<std::size_t>(r) * H + h;
        for (int d = 0; d < D; ++d) {
          ASSERT_EQ(load_as_float(qc.c.out.data(), spec.out_dtype, at * D + d), 0.f)
              << "row " << r << " head " << h;
        }
        const float want = v.sinks.empty() ? -kInf : v.sinks[h];
        if (std::isinf(want)) {
          EXPECT_EQ(qc.c.lse[at], want) << "row " << r << " head " << h;
        } else {
          EXPECT_NEAR(qc.c.lse[at], want, testing::lse_tolerance()) << "row " << r << " head " << h;
        }
      }
    }
    // Without lse.
    QueryCase no_lse = clean;
    DecodeArgs a = with_variants(no_lse.args(), v);
    a.lse = nullptr;
    if (backend == Backend::kCpu) {
      decode(a, DecodeOptions{Backend::kCpu});
    } else {
      DeviceQueryCase dev(a, no_lse.c.q.size(), no_lse.c.out.size(), 0);
      decode(dev.args(), DecodeOptions{Backend::kCuda});
      dev.download(no_lse.c.out.data(), nullptr);
    }
    EXPECT_TRUE(no_lse.c.out == qc.c.out) << "out differs without lse";
  }
}

// Every sequence without query tokens (num_q_tokens 0, batch > 0): nothing is read (the tables
// are garbage) and nothing is written.
TEST_P(QueryTokenLayout, NoQueryTokensWriteNothing) {
  const Backend backend = GetParam();
  if (backend == Backend::kCuda && !cuda_available()) GTEST_SKIP() << "no CUDA device";
  const testing::CaseSpec spec = variant_spec(DType::kBF16, 64, 16, 4, {30, 0, 5});
  QueryCase qc = make_query_case(spec, {0, 0, 0});
  ASSERT_EQ(qc.rows(), 0);
  std::fill(qc.c.block_table.begin(), qc.c.block_table.end(), -1);
  std::fill(qc.c.out.begin(), qc.c.out.end(), std::uint8_t{0x3F});
  std::vector<float> lse(8, 12345.f);
  qc.c.lse = lse;
  const std::vector<std::uint8_t> out_before = qc.c.out;
  for (const Variants& v : {Variants{}, all_variants(spec.num_heads, 3)}) {
    SCOPED_TRACE(describe(v));
    run_query_decode(qc, v, backend);
    EXPECT_TRUE(qc.c.out == out_before) << "out was written";
    EXPECT_TRUE(qc.c.lse == lse) << "lse was written";
    const ReferenceResult ref = query_reference(qc, v);
    EXPECT_TRUE(ref.out.empty());
    EXPECT_TRUE(ref.lse.empty());
  }
}

INSTANTIATE_TEST_SUITE_P(All, QueryTokenLayout, ::testing::Values(Backend::kCpu, Backend::kCuda),
                         [](const ::testing::TestParamInfo<Backend>& i) {
                           return std::string(backend_name(i.param));
                         });

}  // namespace
}  // namespace pagedattn
