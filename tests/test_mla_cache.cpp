// Writes into the MLA latent cache and its block copies (pagedattn/mla_cache.hpp). Checked: every
// source and cache dtype against values found here from the formats themselves (the nearest
// value of the cache's format, ties to the even code, by a search over every code; fp8 storing
// value / kv_scale, saturating, NaN and Inf as write_cache quantizes), over the two-part, the
// combined, a padded and a slot-major layout with strided sources, every byte no row of the write
// owns left as it was; negative slots skipped; rope_dim 0; block copies in every layout; every
// bad argument, which writes nothing; a fork with copy-on-write through these calls, decoded by
// mla_decode against the f64 reference; and the CUDA backend against the CPU where a device is.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "bad_input.hpp"
#include "gtest_printers.hpp"
#include "pagedattn/block_manager.hpp"
#include "pagedattn/mla.hpp"
#include "pagedattn/mla_cache.hpp"
#include "pagedattn/reference.hpp"
#include "pagedattn/testing/device_memory.hpp"
#include "pagedattn/testing/tolerance.hpp"
#include "test_seed.hpp"

namespace pagedattn {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// ---- The expected cache values, from the formats' codes. ----

// Every finite non-negative value of a 16- or 8-bit dtype, indexed by its code (the positive codes
// are ordered by value, Inf and NaN above the largest finite one).
const std::vector<double>& finite_magnitudes(DType t) {
  static std::map<DType, std::vector<double>> tables;
  std::vector<double>& m = tables[t];
  if (!m.empty()) return m;
  const bool byte = dtype_size(t) == 1;
  for (std::uint32_t code = 0; code < (byte ? 0x80u : 0x8000u); ++code) {
    const std::uint8_t c8 = static_cast<std::uint8_t>(code);
    const std::uint16_t c16 = static_cast<std::uint16_t>(code);
    const double x = load_as_float(byte ? static_cast<const void*>(&c8) : &c16, t, 0);
    if (!std::isfinite(x)) break;
    m.push_back(x);
  }
  return m;
}

// What a cache of dtype t holds for the source value x under kv_scale: fp8 the nearest value to
// the f32 quotient x / kv_scale (a finite x whose quotient overflows saturating too), beyond the
// largest finite value saturating, NaN as NaN, Inf as Inf in e5m2 and NaN in e4m3; f16 and bf16
// the nearest value to x, rounding to Inf from halfway past the largest finite one; f32 x.
double expected_value(DType t, float x, float kv_scale) {
  if (t == DType::kF32) return x;
  const bool fp8 = is_fp8(t);
  float q = x;
  if (fp8) {
    q = x / kv_scale;
    if (std::isfinite(x) && std::isinf(q)) q = std::copysign(FLT_MAX, q);
  }
  if (std::isnan(q)) return kNaN;
  if (std::isinf(q)) return t == DType::kFP8E4M3 ? kNaN : q;
  const std::vector<double>& m = finite_magnitudes(t);
  const double a = std::fabs(static_cast<double>(q));
  const double top = m.back(), below = m[m.size() - 2];
  double r = 0;
  if (a >= top) {
    r = fp8 || a < top + (top - below) / 2 ? top : INFINITY;  // top's code is odd: a tie goes up
  } else {
    const std::size_t hi = std::lower_bound(m.begin(), m.end(), a) - m.begin();
    const std::size_t lo = hi - (m[hi] == a ? 0 : 1);
    const double d_lo = a - m[lo], d_hi = m[hi] - a;
    r = d_lo < d_hi ? m[lo] : d_hi < d_lo ? m[hi] : (lo % 2 == 0 ? m[lo] : m[hi]);
  }
  return std::copysign(r, q);
}

bool same_value(double got, double want) {
  if (std::isnan(want)) return std::isnan(got);
  return got == want && std::signbit(got) == std::signbit(want);
}

// ---- A latent pool in one of the layouts, and new tokens to write into it. ----

enum class Layout { kParts, kCombined, kPadded, kSlotMajor };
const char* layout_name(Layout l) {
  return l == Layout::kParts      ? "parts"
         : l == Layout::kCombined ? "combined"
         : l == Layout::kPadded   ? "padded"
                                  : "slot_major";
}

// The cache buffers (the combined layout keeps both parts in `c`), filled with a byte pattern so
// that every byte a call must leave alone can be checked.
struct Pool {
  int rank = 512, rope = 64, block_size = 16, num_blocks = 6;
  DType dtype = DType::kBF16;
  float kv_scale = 1.f;
  Layout layout = Layout::kParts;
  std::vector<std::uint8_t> c, kpe;
  MlaPartStrides cs, ps;  // as passed (kParts: {0, 0}, the dense default)

  std::size_t esz() const { return dtype_size(dtype); }
  std::uint8_t* c_ptr() { return c.data(); }
  std::uint8_t* kpe_ptr() {
    return layout == Layout::kCombined ? c.data() + rank * esz() : kpe.data();
  }
  // Element offsets of a slot's row in each part.
  std::int64_t c_at(int slot) const {
    const MlaPartStrides s = cs.or_dense(block_size, rank);
    return (slot / block_size) * s.block + (slot % block_size) * s.token;
  }
  std::int64_t kpe_at(int slot) const {
    const MlaPartStrides s = ps.or_dense(block_size, rope);
    return (slot / block_size) * s.block + (slot % block_size) * s.token;
  }
  double c_value(int slot, int d) { return load_as_float(c_ptr(), dtype, c_at(slot) + d); }
  double kpe_value(int slot, int d) { return load_as_float(kpe_ptr(), dtype, kpe_at(slot) + d); }

  // `a` over this pool: its shape, dtype, buffers and layout, the fields MlaCacheWriteArgs,
  // MlaCopyBlocksArgs and MlaDecodeArgs share.
  template <typename Args>
  Args laid_out(Args a) {
    a.kv_lora_rank = rank;
    a.rope_dim = rope;
    a.block_size = block_size;
    a.num_blocks = num_blocks;
    a.c_cache = c_ptr();
    a.kpe_cache = kpe_ptr();
    a.kv_dtype = dtype;
    a.c_strides = cs;
    a.kpe_strides = ps;
    return a;
  }
  MlaCacheWriteArgs write_args() {
    MlaCacheWriteArgs a = laid_out(MlaCacheWriteArgs{});
    a.kv_scale = kv_scale;
    return a;
  }
  MlaCopyBlocksArgs copy_args(const std::vector<BlockCopy>& pairs) {
    MlaCopyBlocksArgs a = laid_out(MlaCopyBlocksArgs{});
    a.pairs = pairs.data();
    a.num_pairs = static_cast<int>(pairs.size());
    return a;
  }
};

Pool make_pool(Layout layout, DType dtype, int rank = 512, int rope = 64, int block_size = 16,
               int num_blocks = 6) {
  Pool p;
  p.rank = rank, p.rope = rope, p.block_size = block_size, p.num_blocks = num_blocks;
  p.dtype = dtype;
  p.kv_scale = is_fp8(dtype) ? 0.25f : 1.f;
  p.layout = layout;
  const std::int64_t nb = num_blocks, bs = block_size, w = rank + rope;
  std::int64_t c_elems = nb * bs * rank, p_elems = nb * bs * rope;
  if (layout == Layout::kCombined) {
    p.cs = p.ps = {bs * w, w};
    c_elems = nb * bs * w;
    p_elems = 0;
  } else if (layout == Layout::kPadded) {
    p.cs = {bs * (rank + 16) + 48, rank + 16};
    p.ps = {bs * (rope + 8) + 8, rope + 8};
    c_elems = nb * p.cs.block;
    p_elems = nb * p.ps.block;
  } else if (layout == Layout::kSlotMajor) {  // [block_size][num_blocks][width]
    p.cs = {rank, nb * rank};
    p.ps = {rope, nb * rope};
  }
  p.c.resize(static_cast<std::size_t>(c_elems) * p.esz());
  p.kpe.resize(static_cast<std::size_t>(std::max<std::int64_t>(p_elems, 1)) * p.esz());
  for (std::size_t i = 0; i < p.c.size(); ++i) p.c[i] = static_cast<std::uint8_t>(i * 37 + 11);
  for (std::size_t i = 0; i < p.kpe.size(); ++i) p.kpe[i] = static_cast<std::uint8_t>(i * 29 + 3);
  return p;
}

// num_tokens latent rows in src dtype: kv_c and k_pe apart with padded rows, or (one_tensor) as
// slices of one [tokens][rank + rope + pad] tensor; the padding NaN, so a write that read it would
// show. Slots distinct, about one in five negative.
struct Tokens {
  int n = 0, rank = 0, rope = 0;
  DType dtype = DType::kF32;
  bool one_tensor = false;
  std::int64_t c_stride = 0, pe_stride = 0;
  std::vector<std::uint8_t> c, pe;
  std::vector<std::int32_t> slots;

  const void* kv_c() const { return c.data(); }
  // Where k_pe starts with c's and pe's bytes at c_base and pe_base (host or device copies).
  const void* k_pe_in(const void* c_base, const void* pe_base) const {
    return one_tensor ? static_cast<const std::uint8_t*>(c_base) + rank * dtype_size(dtype)
                      : pe_base;
  }
  const void* k_pe() const { return k_pe_in(c.data(), pe.data()); }
  float c_value(int t, int d) const { return load_as_float(kv_c(), dtype, t * c_stride + d); }
  float pe_value(int t, int d) const { return load_as_float(k_pe(), dtype, t * pe_stride + d); }
  void fill(MlaCacheWriteArgs& a) const {
    a.num_tokens = n;
    a.kv_c = kv_c();
    a.k_pe = k_pe();
    a.src_dtype = dtype;
    a.kv_c_row_stride = c_stride;
    a.k_pe_row_stride = pe_stride;
    a.slot_mapping = slots.data();
  }
};

// The values a quantizing write must get right, placed first: NaN, Inf, beyond every range (and
// beyond f32 once divided by kv_scale), below the smallest subnormal, and around the formats'
// largest values.
const std::vector<float>& edge_values() {
  static const std::vector<float> edges = {
      kNaN,  kInf,  -kInf, 1e6f,    -1e6f,   3.4e38f, -3.4e38f, 1e-9f,   -1e-9f, 0.f,
      -0.f,  112.f, 114.f, 116.f,   -116.f,  120.f,   65504.f,  65520.f, 7e4f,   14336.f,
      15e3f, 1e-7f, 6e-8f, 3.4e38f, 2.9e-3f, 448.f,   500.f,    -500.f,  1.f,    -1.f};
  return edges;
}

Tokens make_tokens(int n, const Pool& pool, DType src, bool one_tensor, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  Tokens tk;
  tk.n = n, tk.rank = pool.rank, tk.rope = pool.rope, tk.dtype = src, tk.one_tensor = one_tensor;
  tk.c_stride = one_tensor ? pool.rank + pool.rope + 8 : pool.rank + 5;
  tk.pe_stride = one_tensor ? tk.c_stride : pool.rope + 3;
  tk.c.resize(static_cast<std::size_t>(n * tk.c_stride) * dtype_size(src));
  tk.pe.resize(static_cast<std::size_t>(std::max<std::int64_t>(n * tk.pe_stride, 1)) *
               dtype_size(src));
  for (std::size_t i = 0; i < tk.c.size() / dtype_size(src); ++i) {
    store_from_float(tk.c.data(), src, i, kNaN);
  }
  for (std::size_t i = 0; i < tk.pe.size() / dtype_size(src); ++i) {
    store_from_float(tk.pe.data(), src, i, kNaN);
  }
  std::normal_distribution<float> normal(0.f, 3.f);
  const std::vector<float>& edges = edge_values();
  std::size_t next_edge = 0;
  const auto value = [&] { return next_edge < edges.size() ? edges[next_edge++] : normal(rng); };
  auto* pe_base = one_tensor ? tk.c.data() + pool.rank * dtype_size(src) : tk.pe.data();
  for (int t = 0; t < n; ++t) {
    if (t == 1) next_edge = 0;  // the edges in token 0's c and token 1's k_pe
    for (int d = 0; d < pool.rank; ++d) {
      store_from_float(tk.c.data(), src, t * tk.c_stride + d, t == 1 ? normal(rng) : value());
    }
    for (int d = 0; d < pool.rope; ++d) {
      store_from_float(pe_base, src, t * tk.pe_stride + d, t == 0 ? normal(rng) : value());
    }
  }
  std::vector<std::int32_t> all(static_cast<std::size_t>(pool.num_blocks) * pool.block_size);
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  const std::int32_t skips[] = {-1, -2, -1000, std::numeric_limits<std::int32_t>::min()};
  for (int t = 0; t < n; ++t) {  // tokens 0 and 1, which hold the edges, written
    tk.slots.push_back(t > 1 && rng() % 5 == 0 ? skips[rng() % 4] : all[t % all.size()]);
  }
  return tk;
}

// f32 tokens in one source tensor of rows of rank + rope: `values` row after row (c, then k_pe),
// zero where it ends first; token t written to slots[t].
Tokens f32_rows(int rank, int rope, const std::vector<float>& values,
                const std::vector<std::int32_t>& slots) {
  Tokens tk;
  tk.n = static_cast<int>(slots.size()), tk.rank = rank, tk.rope = rope;
  tk.one_tensor = true, tk.c_stride = tk.pe_stride = rank + rope;
  tk.c.assign(static_cast<std::size_t>(tk.n) * (rank + rope) * sizeof(float), 0);
  std::memcpy(tk.c.data(), values.data(), values.size() * sizeof(float));
  tk.slots = slots;
  return tk;
}

// The byte ranges a write or copy of rows may change: one flag per byte of the pool's buffers.
struct Owned {
  std::vector<bool> c, kpe;
  explicit Owned(const Pool& p) : c(p.c.size(), false), kpe(p.kpe.size(), false) {}
  void mark(Pool& p, const std::uint8_t* row, int elements) {
    const bool in_c = row >= p.c.data() && row < p.c.data() + p.c.size();
    std::vector<bool>& flags = in_c ? c : kpe;
    const std::size_t at = row - (in_c ? p.c.data() : p.kpe.data());
    for (std::size_t i = 0; i < elements * p.esz(); ++i) flags[at + i] = true;
  }
};

// Every byte of `after` outside `owned` as in `before`.
void expect_rest_untouched(const Pool& before, const Pool& after, const Owned& owned,
                           const std::string& what) {
  int changed = 0;
  for (std::size_t i = 0; i < before.c.size(); ++i) {
    changed += !owned.c[i] && before.c[i] != after.c[i];
  }
  for (std::size_t i = 0; i < before.kpe.size(); ++i) {
    changed += !owned.kpe[i] && before.kpe[i] != after.kpe[i];
  }
  EXPECT_EQ(changed, 0) << what << ": bytes outside the written rows changed";
}

// Every written row against expected_value, every other byte as it was.
void expect_written(const Pool& before, Pool& after, const Tokens& tk, const std::string& what) {
  Owned owned(after);
  int wrong = 0;
  for (int t = 0; t < tk.n; ++t) {
    const int s = tk.slots[t];
    if (s < 0) continue;
    owned.mark(after, after.c_ptr() + after.c_at(s) * after.esz(), after.rank);
    owned.mark(after, after.kpe_ptr() + after.kpe_at(s) * after.esz(), after.rope);
    for (int d = 0; d < after.rank + after.rope; ++d) {
      const bool c = d < after.rank;
      const double got = c ? after.c_value(s, d) : after.kpe_value(s, d - after.rank);
      const float x = c ? tk.c_value(t, d) : tk.pe_value(t, d - after.rank);
      const double want = expected_value(after.dtype, x, after.kv_scale);
      if (!same_value(got, want) && ++wrong <= 5) {
        ADD_FAILURE() << what << ": token " << t << " slot " << s << (c ? " c[" : " k_pe[")
                      << (c ? d : d - after.rank) << "] of " << x << " holds " << got
                      << ", expected " << want;
      }
    }
  }
  EXPECT_EQ(wrong, 0) << what;
  expect_rest_untouched(before, after, owned, what);
}

void write_cpu(const MlaCacheWriteArgs& a) {
  CacheOpOptions o;
  o.backend = Backend::kCpu;
  o.num_threads = 2;
  write_mla_cache(a, o);
}

// ---- Round trips: every source and cache dtype, every layout. ----

class MlaCacheWrite : public ::testing::TestWithParam<std::tuple<DType, DType>> {};

TEST_P(MlaCacheWrite, StoresTheNearestValueInEveryLayout) {
  const auto [src, cache] = GetParam();
  for (Layout layout : {Layout::kParts, Layout::kCombined, Layout::kPadded, Layout::kSlotMajor}) {
    for (bool one_tensor : {false, true}) {
      Pool pool = make_pool(layout, cache);
      const Pool before = pool;
      const Tokens tk = make_tokens(70, pool, src, one_tensor, testing::seed_for(71));
      MlaCacheWriteArgs a = pool.write_args();
      tk.fill(a);
      write_cpu(a);
      std::ostringstream what;
      what << dtype_name(src) << " to " << dtype_name(cache) << ", " << layout_name(layout)
           << (one_tensor ? ", one source tensor" : ", two source tensors");
      expect_written(before, pool, tk, what.str());
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Mla, MlaCacheWrite,
    ::testing::Combine(::testing::Values(DType::kF32, DType::kF16, DType::kBF16),
                       ::testing::Values(DType::kF32, DType::kF16, DType::kBF16, DType::kFP8E4M3,
                                         DType::kFP8E5M2)),
    [](const auto& info) {
      return std::string(dtype_name(std::get<0>(info.param))) + "_to_" +
             dtype_name(std::get<1>(info.param));
    });

// Every midpoint between two neighbouring fp8 values (a tie: the even code wins), a hair either
// side of it, and every value past the largest (saturating), at a power-of-two scale (exact
// quotients) and at one that is not (the quotient rounded in f32 first).
TEST(MlaCacheFp8, RoundsToNearestEvenAndSaturates) {
  for (DType cache : {DType::kFP8E4M3, DType::kFP8E5M2}) {
    for (float scale : {0.5f, 0.37f}) {
      const std::vector<double>& m = finite_magnitudes(cache);
      std::vector<float> xs;
      for (std::size_t i = 0; i + 1 < m.size(); ++i) {
        const float mid = static_cast<float>((m[i] + m[i + 1]) / 2 * scale);
        for (float x : {mid, std::nextafter(mid, 0.f), std::nextafter(mid, kInf)}) {
          xs.push_back(x);
          xs.push_back(-x);
        }
      }
      for (float big : {1.01f, 1.5f, 100.f, 1e30f})
        xs.push_back(static_cast<float>(m.back()) * big);
      Pool pool = make_pool(Layout::kCombined, cache, 16, 16, 64,
                            static_cast<int>((xs.size() + 31) / 32 / 64 + 1));
      pool.kv_scale = scale;
      const Pool before = pool;
      std::vector<std::int32_t> slots((xs.size() + 31) / 32);
      for (std::size_t t = 0; t < slots.size(); ++t) {
        slots[t] = static_cast<std::int32_t>(slots.size() - 1 - t);
      }
      const Tokens tk = f32_rows(16, 16, xs, slots);
      MlaCacheWriteArgs a = pool.write_args();
      tk.fill(a);
      write_cpu(a);
      expect_written(before, pool, tk,
                     std::string(dtype_name(cache)) + " at scale " + std::to_string(scale));
    }
  }
}

TEST(MlaCache, NegativeSlotsSkipTheirTokens) {
  Pool pool = make_pool(Layout::kCombined, DType::kBF16);
  const Pool before = pool;
  Tokens tk = make_tokens(6, pool, DType::kF32, false, 3);
  tk.slots = {-1, 5, -2, std::numeric_limits<std::int32_t>::min(), -96, 17};
  MlaCacheWriteArgs a = pool.write_args();
  tk.fill(a);
  write_cpu(a);
  expect_written(before, pool, tk, "negative slots");
  tk.slots = {-1, -1, -3, -3, -1, -7};  // skips may repeat; nothing is written
  Pool untouched = before;
  a = untouched.write_args();
  tk.fill(a);
  write_cpu(a);
  EXPECT_TRUE(untouched.c == before.c && untouched.kpe == before.kpe);
}

TEST(MlaCache, RopeDimZeroWritesTheLatentAlone) {
  Pool pool = make_pool(Layout::kParts, DType::kF16, 128, 0, 8, 4);
  const Pool before = pool;
  Tokens tk = make_tokens(20, pool, DType::kBF16, false, 9);
  MlaCacheWriteArgs a = pool.write_args();
  tk.fill(a);
  a.k_pe = nullptr;
  a.kpe_cache = nullptr;
  write_cpu(a);
  expect_written(before, pool, tk, "rope_dim 0");
}

TEST(MlaCache, NoTokensIsANoOp) {
  MlaCacheWriteArgs a;
  a.block_size = 16;
  a.num_blocks = 4;
  write_cpu(a);  // every pointer null: nothing is read or written
  MlaCopyBlocksArgs c;
  c.block_size = 16;
  c.num_blocks = 4;
  copy_blocks(c, CacheOpOptions{Backend::kCpu});
}

// ---- Block copies. ----

// `pool` with each pair's dst rows, in both parts, replaced by its src rows.
Pool copied(Pool pool, const std::vector<BlockCopy>& pairs) {
  const Pool before = pool;
  Pool src = before;
  for (const BlockCopy& p : pairs) {
    for (int t = 0; t < pool.block_size; ++t) {
      const int from = p.src * pool.block_size + t, to = p.dst * pool.block_size + t;
      std::memcpy(pool.c_ptr() + pool.c_at(to) * pool.esz(),
                  src.c_ptr() + src.c_at(from) * src.esz(), pool.rank * pool.esz());
      std::memcpy(pool.kpe_ptr() + pool.kpe_at(to) * pool.esz(),
                  src.kpe_ptr() + src.kpe_at(from) * src.esz(), pool.rope * pool.esz());
    }
  }
  return pool;
}

TEST(MlaCacheCopy, CopiesBothPartsOfEveryPairInEveryLayout) {
  const std::vector<BlockCopy> pairs = {{0, 3}, {2, 1}, {4, 5}};
  for (Layout layout : {Layout::kParts, Layout::kCombined, Layout::kPadded, Layout::kSlotMajor}) {
    for (DType t : {DType::kBF16, DType::kFP8E4M3, DType::kF32}) {
      Pool pool = make_pool(layout, t);
      const Pool want = copied(pool, pairs);
      CacheOpOptions o;
      o.backend = Backend::kCpu;
      o.num_threads = 2;
      copy_blocks(pool.copy_args(pairs), o);
      EXPECT_TRUE(pool.c == want.c) << layout_name(layout) << " " << dtype_name(t) << ": c";
      EXPECT_TRUE(pool.kpe == want.kpe) << layout_name(layout) << " " << dtype_name(t) << ": k_pe";
    }
  }
}

TEST(MlaCacheCopy, RopeDimZeroCopiesTheLatentAlone) {
  Pool pool = make_pool(Layout::kPadded, DType::kF16, 64, 0, 4, 3);
  const std::vector<BlockCopy> pairs = {{2, 0}};
  const Pool want = copied(pool, pairs);
  MlaCopyBlocksArgs a = pool.copy_args(pairs);
  a.kpe_cache = nullptr;
  copy_blocks(a, CacheOpOptions{Backend::kCpu});
  EXPECT_TRUE(pool.c == want.c);
}

// ---- Errors. ----

struct BadWrite {
  std::string what, argument;
  ErrorCode code;
  std::string part;  // of the message
  std::function<void(MlaCacheWriteArgs&, CacheOpOptions&, std::vector<std::int32_t>&)> apply;
};

TEST(MlaCacheValidation, BadWritesAreErrorsAndWriteNothing) {
  const ErrorCode inv = ErrorCode::kInvalidArgument, uns = ErrorCode::kUnsupported,
                  oor = ErrorCode::kOutOfRange;
  using A = MlaCacheWriteArgs;
  using O = CacheOpOptions;
  using S = std::vector<std::int32_t>;
  const std::vector<BadWrite> bad = {
      {"negative tokens", "num_tokens", inv, "num_tokens = -1",
       [](A& a, O&, S&) { a.num_tokens = -1; }},
      {"rank not a multiple of 16", "kv_lora_rank", uns, "kv_lora_rank = 500",
       [](A& a, O&, S&) { a.kv_lora_rank = 500; }},
      {"rank 0", "kv_lora_rank", inv, "kv_lora_rank = 0", [](A& a, O&, S&) { a.kv_lora_rank = 0; }},
      {"rope too wide", "rope_dim", uns, "rope_dim = 272", [](A& a, O&, S&) { a.rope_dim = 272; }},
      {"negative rope", "rope_dim", inv, "rope_dim = -16", [](A& a, O&, S&) { a.rope_dim = -16; }},
      {"block size 0", "block_size", uns, "block_size = 0", [](A& a, O&, S&) { a.block_size = 0; }},
      {"negative pool", "num_blocks", inv, "num_blocks = -2",
       [](A& a, O&, S&) { a.num_blocks = -2; }},
      {"slots past int32", "num_blocks", inv, "int32 slot range",
       [](A& a, O&, S&) { a.num_blocks = 1 << 27; }},
      {"int8 cache", "kv_dtype", uns, "kv_dtype = int8",
       [](A& a, O&, S&) { a.kv_dtype = DType::kInt8; }},
      {"int4 cache", "kv_dtype", uns, "kv_dtype = int4",
       [](A& a, O&, S&) { a.kv_dtype = DType::kInt4; }},
      {"not a dtype", "kv_dtype", inv, "not a DType",
       [](A& a, O&, S&) { a.kv_dtype = static_cast<DType>(77); }},
      {"fp8 source", "src_dtype", uns, "src_dtype = fp8_e4m3",
       [](A& a, O&, S&) { a.src_dtype = DType::kFP8E4M3; }},
      {"scale on bf16", "kv_scale", inv, "kv_scale = 2", [](A& a, O&, S&) { a.kv_scale = 2.f; }},
      {"fp8 scale 0", "kv_scale", inv, "kv_scale = 0",
       [](A& a, O&, S&) { a.kv_dtype = DType::kFP8E4M3, a.kv_scale = 0.f; }},
      {"fp8 scale NaN", "kv_scale", inv, "kv_scale = nan",
       [](A& a, O&, S&) { a.kv_dtype = DType::kFP8E5M2, a.kv_scale = kNaN; }},
      {"overlapping latent rows", "c_strides.token", inv, "c_strides.token = 100",
       [](A& a, O&, S&) {
         a.c_strides = {1600, 100};
       }},
      {"one latent stride", "c_strides.block", inv, "c_strides.block = 0",
       [](A& a, O&, S&) {
         a.c_strides = {0, 512};
       }},
      {"overlapping blocks", "kpe_strides.block", inv, "kpe_strides.block = 100",
       [](A& a, O&, S&) {
         a.kpe_strides = {100, 64};
       }},
      {"short c rows", "kv_c_row_stride", inv, "kv_c_row_stride = 511",
       [](A& a, O&, S&) { a.kv_c_row_stride = 511; }},
      {"short k_pe rows", "k_pe_row_stride", inv, "k_pe_row_stride = 63",
       [](A& a, O&, S&) { a.k_pe_row_stride = 63; }},
      {"no kv_c", "kv_c", inv, "kv_c = null", [](A& a, O&, S&) { a.kv_c = nullptr; }},
      {"no k_pe", "k_pe", inv, "k_pe = null", [](A& a, O&, S&) { a.k_pe = nullptr; }},
      {"no slots", "slot_mapping", inv, "slot_mapping = null",
       [](A& a, O&, S&) { a.slot_mapping = nullptr; }},
      {"no c cache", "c_cache", inv, "c_cache = null", [](A& a, O&, S&) { a.c_cache = nullptr; }},
      {"no k_pe cache", "kpe_cache", inv, "kpe_cache = null",
       [](A& a, O&, S&) { a.kpe_cache = nullptr; }},
      {"slot past the pool", "slot_mapping[3]", oor, "slot_mapping[3] = 64",
       [](A&, O&, S& s) { s[3] = 64; }},
      {"slot twice", "slot_mapping[5]", inv, "the slot of slot_mapping[1] too",
       [](A&, O&, S& s) { s[5] = s[1]; }},
      {"bad backend", "backend", inv, "not a Backend",
       [](A&, O& o, S&) { o.backend = static_cast<Backend>(-4); }},
      {"bad thread count", "num_threads", inv, "num_threads = -1",
       [](A&, O& o, S&) { o.num_threads = -1; }},
  };
  for (const BadWrite& k : bad) {
    Pool pool = make_pool(Layout::kParts, DType::kBF16, 512, 64, 16, 4);
    const Pool before = pool;
    Tokens tk = make_tokens(8, pool, DType::kF32, false, 5);
    tk.slots = {0, 9, -1, 17, 33, 2, 63, 40};
    MlaCacheWriteArgs a = pool.write_args();
    tk.fill(a);
    CacheOpOptions o;
    o.backend = Backend::kCpu;
    std::vector<std::int32_t> slots = tk.slots;
    a.slot_mapping = slots.data();
    k.apply(a, o, slots);
    if (a.slot_mapping != nullptr) a.slot_mapping = slots.data();
    expect_error([&] { write_mla_cache(a, o); }, k.code, k.argument, {k.part}, k.what);
    EXPECT_TRUE(pool.c == before.c && pool.kpe == before.kpe) << k.what << ": the cache changed";
  }
}

TEST(MlaCacheValidation, BadCopiesAreErrorsAndCopyNothing) {
  using A = MlaCopyBlocksArgs;
  const ErrorCode inv = ErrorCode::kInvalidArgument, uns = ErrorCode::kUnsupported,
                  oor = ErrorCode::kOutOfRange;
  struct Bad {
    std::string what, argument;
    ErrorCode code;
    std::string part;
    std::function<void(A&, std::vector<BlockCopy>&)> apply;
  };
  const std::vector<Bad> bad = {
      {"negative pairs", "num_pairs", inv, "num_pairs = -1",
       [](A& a, std::vector<BlockCopy>&) { a.num_pairs = -1; }},
      {"no pairs", "pairs", inv, "pairs = null",
       [](A& a, std::vector<BlockCopy>&) { a.pairs = nullptr; }},
      {"no c cache", "c_cache", inv, "c_cache = null",
       [](A& a, std::vector<BlockCopy>&) { a.c_cache = nullptr; }},
      {"no k_pe cache", "kpe_cache", inv, "kpe_cache = null",
       [](A& a, std::vector<BlockCopy>&) { a.kpe_cache = nullptr; }},
      {"src past the pool", "pairs[1].src", oor, "pairs[1].src = 6",
       [](A&, std::vector<BlockCopy>& p) { p[1].src = 6; }},
      {"negative dst", "pairs[0].dst", oor, "pairs[0].dst = -1",
       [](A&, std::vector<BlockCopy>& p) { p[0].dst = -1; }},
      {"dst twice", "pairs[1].dst", inv, "the dst of two pairs",
       [](A&, std::vector<BlockCopy>& p) { p[1].dst = p[0].dst; }},
      {"dst also a src", "pairs[1].dst", inv, "also the src of a pair",
       [](A&, std::vector<BlockCopy>& p) { p[1].dst = p[0].src; }},
      {"int8 cache", "kv_dtype", uns, "kv_dtype = int8",
       [](A& a, std::vector<BlockCopy>&) { a.kv_dtype = DType::kInt8; }},
      {"overlapping rows", "kpe_strides.token", inv, "kpe_strides.token = 32",
       [](A& a, std::vector<BlockCopy>&) {
         a.kpe_strides = {64 * 16, 32};
       }},
      {"rank too wide", "kv_lora_rank", uns, "kv_lora_rank = 1040",
       [](A& a, std::vector<BlockCopy>&) { a.kv_lora_rank = 1040; }},
  };
  for (const Bad& k : bad) {
    Pool pool = make_pool(Layout::kParts, DType::kBF16);
    const Pool before = pool;
    std::vector<BlockCopy> pairs = {{0, 3}, {2, 1}};
    MlaCopyBlocksArgs a = pool.copy_args(pairs);
    k.apply(a, pairs);
    expect_error([&] { copy_blocks(a, CacheOpOptions{Backend::kCpu}); }, k.code, k.argument,
                 {k.part}, k.what);
    EXPECT_TRUE(pool.c == before.c && pool.kpe == before.kpe) << k.what << ": the cache changed";
  }
}

// ---- End to end: written, forked, copied on write, decoded. ----

// Sequences written through write_mla_cache with the block manager's slots, forked inside a
// block, appended to with copy-on-write through the MLA copy_blocks: every token's latent row
// read through the block table is the one written for it, and mla_decode over the cache matches
// the f64 reference.
class MlaCacheDecode : public ::testing::TestWithParam<std::tuple<DType, Layout>> {};

TEST_P(MlaCacheDecode, AForkCopiedOnWriteDecodesAsTheReference) {
  const auto [dtype, layout] = GetParam();
  constexpr int kHeads = 16, kRank = 512, kRope = 64, kBs = 16;
  Pool pool = make_pool(layout, dtype, kRank, kRope, kBs, 24);
  std::mt19937_64 rng(testing::seed_for(41));
  std::normal_distribution<float> normal(0.f, 1.f);
  BlockManager bm(pool.num_blocks, kBs);
  std::map<BlockManager::SeqId, std::vector<std::vector<float>>> rows;  // per sequence, per token
  const auto write = [&](BlockManager::SeqId id, const std::vector<std::int32_t>& slots) {
    std::vector<float> values;
    for (std::size_t t = 0; t < slots.size(); ++t) {
      std::vector<float> row(kRank + kRope);
      for (float& v : row) v = normal(rng);
      values.insert(values.end(), row.begin(), row.end());
      rows[id].push_back(row);
    }
    const Tokens tk = f32_rows(kRank, kRope, values, slots);
    MlaCacheWriteArgs a = pool.write_args();
    tk.fill(a);
    write_cpu(a);
  };
  const auto append = [&](BlockManager::SeqId id) {
    const BlockManager::Append app = bm.append_token(id);
    if (app.copy) copy_blocks(pool.copy_args({*app.copy}), CacheOpOptions{Backend::kCpu});
    write(id, {app.slot});
  };
  write(0, bm.add_sequence(0, 37));
  write(1, bm.add_sequence(1, 16));
  bm.fork(0, 2);
  rows[2] = rows[0];
  for (int i = 0; i < 3; ++i) append(0);
  for (int i = 0; i < 21; ++i) append(2);
  for (int i = 0; i < 2; ++i) append(1);
  bm.check_invariants();

  const std::vector<BlockManager::SeqId> seqs = {0, 1, 2};
  const BlockManager::Tables tables = bm.tables(seqs);
  for (std::size_t b = 0; b < seqs.size(); ++b) {
    const std::vector<std::vector<float>>& r = rows[seqs[b]];
    ASSERT_EQ(tables.context_lens[b], static_cast<int>(r.size()));
    int wrong = 0;
    for (int t = 0; t < tables.context_lens[b]; ++t) {
      const int slot = bm.slot(seqs[b], t);
      for (int d = 0; d < kRank + kRope; ++d) {
        const double got = d < kRank ? pool.c_value(slot, d) : pool.kpe_value(slot, d - kRank);
        wrong += !same_value(got, expected_value(dtype, r[t][d], pool.kv_scale));
      }
    }
    EXPECT_EQ(wrong, 0) << "sequence " << seqs[b] << ": latent values not as written";
  }

  const int B = static_cast<int>(seqs.size());
  std::vector<float> q_nope(static_cast<std::size_t>(B) * kHeads * kRank),
      q_pe(static_cast<std::size_t>(B) * kHeads * kRope), out(q_nope.size(), kNaN),
      lse(static_cast<std::size_t>(B) * kHeads, kNaN);
  for (float& v : q_nope) v = normal(rng);
  for (float& v : q_pe) v = normal(rng);
  MlaDecodeArgs d = pool.laid_out(MlaDecodeArgs{});
  d.batch = B;
  d.num_heads = kHeads;
  d.max_blocks_per_seq = tables.max_blocks_per_seq;
  d.q_nope = q_nope.data();
  d.q_pe = q_pe.data();
  d.q_dtype = DType::kF32;
  d.kv_scale = pool.kv_scale;
  d.block_table = tables.block_table.data();
  d.context_lens = tables.context_lens.data();
  d.out = out.data();
  d.out_dtype = DType::kF32;
  d.lse = lse.data();
  DecodeOptions o;
  o.backend = Backend::kCpu;
  o.num_threads = 2;
  mla_decode(d, o);
  const ReferenceResult ref = mla_reference_decode(d);
  double scale = 1e-30, err = 0;
  for (double v : ref.out) scale = std::max(scale, std::fabs(v));
  for (std::size_t i = 0; i < out.size(); ++i) err = std::max(err, std::fabs(out[i] - ref.out[i]));
  EXPECT_LE(err / scale, testing::out_tolerance(DType::kF32));
  for (std::size_t i = 0; i < lse.size(); ++i) {
    EXPECT_NEAR(lse[i], ref.lse[i], testing::lse_tolerance()) << "row " << i / kHeads;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Mla, MlaCacheDecode,
    ::testing::Combine(::testing::Values(DType::kBF16, DType::kFP8E4M3, DType::kF16),
                       ::testing::Values(Layout::kParts, Layout::kCombined, Layout::kPadded)),
    [](const auto& info) {
      return std::string(dtype_name(std::get<0>(info.param))) + "_" +
             layout_name(std::get<1>(info.param));
    });

// ---- The CUDA backend. ----

TEST(MlaCacheCuda, UnavailableIsAClearError) {
  if (cuda_available()) GTEST_SKIP() << "a CUDA device is present";
  Pool pool = make_pool(Layout::kParts, DType::kBF16);
  const Tokens tk = make_tokens(4, pool, DType::kF32, false, 5);
  MlaCacheWriteArgs a = pool.write_args();
  tk.fill(a);
  CacheOpOptions o;
  o.backend = Backend::kCuda;
  expect_error([&] { write_mla_cache(a, o); }, ErrorCode::kBackendUnavailable, "backend", {},
               "a CUDA write without a device");
  const std::vector<BlockCopy> pairs = {{0, 1}};
  expect_error([&] { copy_blocks(pool.copy_args(pairs), o); }, ErrorCode::kBackendUnavailable,
               "backend", {}, "a CUDA copy without a device");
}

using testing::DeviceBuffer;

// The pool's buffers on the device, and its arguments pointing there.
struct DevicePool {
  Pool& host;
  DeviceBuffer c, kpe;
  explicit DevicePool(Pool& p)
      : host(p), c(p.c.data(), p.c.size()), kpe(p.kpe.data(), p.kpe.size()) {}
  void* kpe_ptr() {
    return host.layout == Layout::kCombined
               ? static_cast<void*>(c.as<std::uint8_t>() + host.rank * host.esz())
               : kpe.get();
  }
  template <typename Args>
  Args on_device(Args a) {
    a.c_cache = c.get();
    a.kpe_cache = kpe_ptr();
    return a;
  }
  void to_host() {
    c.to_host(host.c);
    kpe.to_host(host.kpe);
  }
};

// The tokens' sources and slots on the device.
struct DeviceTokens {
  DeviceBuffer c, pe, slots;
  explicit DeviceTokens(const Tokens& tk)
      : c(tk.c.data(), tk.c.size()),
        pe(tk.pe.data(), tk.pe.size()),
        slots(tk.slots.data(), tk.slots.size() * sizeof(std::int32_t)) {}
  // `a` with tk's write fields (Tokens::fill), pointing here.
  MlaCacheWriteArgs with_tokens(const Tokens& tk, MlaCacheWriteArgs a) const {
    tk.fill(a);
    a.kv_c = c.get();
    a.k_pe = tk.k_pe_in(c.get(), pe.get());
    a.slot_mapping = slots.as<const std::int32_t>();
    return a;
  }
};

TEST(MlaCacheCuda, WritesAndCopiesAsTheCpu) {
  if (!cuda_available() || !testing::device_memory_built()) GTEST_SKIP() << "no CUDA device";
  const std::vector<BlockCopy> pairs = {{0, 3}, {2, 1}, {4, 5}};
  for (Layout layout : {Layout::kParts, Layout::kCombined, Layout::kPadded, Layout::kSlotMajor}) {
    for (DType t : {DType::kBF16, DType::kFP8E4M3, DType::kFP8E5M2, DType::kF32}) {
      for (bool checked : {false, true}) {
        Pool want = make_pool(layout, t);
        Pool got = want;
        const Tokens tk = make_tokens(70, want, DType::kBF16, checked, testing::seed_for(7));
        MlaCacheWriteArgs a = want.write_args();
        tk.fill(a);
        write_cpu(a);
        copy_blocks(want.copy_args(pairs), CacheOpOptions{Backend::kCpu});

        DevicePool dev(got);
        const DeviceTokens dev_tk(tk);
        const MlaCacheWriteArgs g = dev_tk.with_tokens(tk, dev.on_device(got.write_args()));
        CacheOpOptions o;
        o.backend = Backend::kCuda;
        o.cuda_checked = checked;
        write_mla_cache(g, o);
        copy_blocks(dev.on_device(got.copy_args(pairs)), o);
        dev.to_host();
        std::ostringstream what;
        what << layout_name(layout) << " " << dtype_name(t) << (checked ? " checked" : "");
        EXPECT_TRUE(got.c == want.c) << what.str() << ": c";
        EXPECT_TRUE(got.kpe == want.kpe) << what.str() << ": k_pe";
      }
    }
  }
}

TEST(MlaCacheCuda, CheckedSlotsPastThePoolAreErrorsUncheckedOnesAreSkipped) {
  if (!cuda_available() || !testing::device_memory_built()) GTEST_SKIP() << "no CUDA device";
  Pool got = make_pool(Layout::kCombined, DType::kFP8E4M3);
  const Pool before = got;
  Tokens tk = make_tokens(12, got, DType::kF32, false, 8);
  tk.slots[2] = got.num_blocks * got.block_size;
  DevicePool dev(got);
  const DeviceTokens dev_tk(tk);
  const MlaCacheWriteArgs g = dev_tk.with_tokens(tk, dev.on_device(got.write_args()));
  CacheOpOptions o;
  o.backend = Backend::kCuda;
  o.cuda_checked = true;
  expect_error([&] { write_mla_cache(g, o); }, ErrorCode::kOutOfRange, "slot_mapping[2]", {},
               "a slot past the pool, checked");
  dev.to_host();
  EXPECT_TRUE(got.c == before.c) << "written despite the error";
  o.cuda_checked = false;
  write_mla_cache(g, o);
  dev.to_host();
  tk.slots[2] = -1;
  expect_written(before, got, tk, "unchecked, the slot past the pool skipped");
}

}  // namespace
}  // namespace pagedattn
