// The fp8 conversions (core/include/pagedattn/dtype.hpp), exhaustively: every one of the 256 codes
// of each format against the format's definition; every finite code back to itself; every
// midpoint between neighbours to the even one; saturation, NaN and Inf; and random f32 values
// against a brute-force search for the nearest code (ties to even).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cpu_kernel.hpp"
#include "cpu_kernel_check.hpp"
#include "pagedattn/cache_ops.hpp"
#include "pagedattn/dtype.hpp"
#include "pagedattn/online_softmax.hpp"
#include "pagedattn/reference.hpp"
#include "pagedattn/testing/random_case.hpp"
#include "test_seed.hpp"

namespace pagedattn {
namespace {

// The value of a code by the definition: (-1)^s * 2^(e - bias) * (1 + m / 2^M), or
// 2^(1 - bias) * m / 2^M for e = 0; NaN and Inf as each format defines them.
double by_definition(std::uint8_t c, int M, int bias, bool ieee_specials) {
  const int E = 7 - M;
  const int s = c >> 7, e = (c >> M) & ((1 << E) - 1), m = c & ((1 << M) - 1);
  const double sign = s ? -1.0 : 1.0;
  if (ieee_specials && e == (1 << E) - 1) {
    return m == 0 ? sign * std::numeric_limits<double>::infinity()
                  : std::numeric_limits<double>::quiet_NaN();
  }
  if (!ieee_specials && e == (1 << E) - 1 && m == (1 << M) - 1) {
    return std::numeric_limits<double>::quiet_NaN();
  }
  if (e == 0) return sign * std::ldexp(m, 1 - bias - M);
  return sign * std::ldexp((1 << M) + m, e - bias - M);
}

struct Format {
  const char* name;
  int M, bias;
  bool ieee;
  std::uint8_t max_code;  // largest finite
  float (*decode)(std::uint8_t);
  std::uint8_t (*encode)(float);
};

const Format kFormats[] = {
    {"e4m3", 3, 7, false, 0x7e, [](std::uint8_t c) { return fp8_e4m3_to_float({c}); },
     [](float f) { return float_to_fp8_e4m3(f).bits; }},
    {"e5m2", 2, 15, true, 0x7b, [](std::uint8_t c) { return fp8_e5m2_to_float({c}); },
     [](float f) { return float_to_fp8_e5m2(f).bits; }},
};

bool is_nan_code(const Format& f, std::uint8_t c) { return std::isnan(f.decode(c)); }

TEST(Fp8, EveryCodeDecodesByTheDefinition) {
  for (const Format& f : kFormats) {
    SCOPED_TRACE(f.name);
    for (int c = 0; c < 256; ++c) {
      const double want = by_definition(static_cast<std::uint8_t>(c), f.M, f.bias, f.ieee);
      const float got = f.decode(static_cast<std::uint8_t>(c));
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got)) << c;
      } else {
        EXPECT_EQ(static_cast<double>(got), want) << c;
        EXPECT_EQ(std::signbit(got), (c & 0x80) != 0) << c;
      }
    }
    EXPECT_EQ(f.decode(f.max_code), f.ieee ? 57344.f : 448.f);
  }
}

TEST(Fp8, FiniteCodesRoundTripAndMidpointsGoToEven) {
  for (const Format& f : kFormats) {
    SCOPED_TRACE(f.name);
    for (int c = 0; c < 256; ++c) {
      const std::uint8_t code = static_cast<std::uint8_t>(c);
      const float v = f.decode(code);
      if (std::isnan(v)) {
        EXPECT_TRUE(is_nan_code(f, f.encode(v))) << c;
        continue;
      }
      if (std::isinf(v)) continue;
      EXPECT_EQ(f.encode(v), code) << c;
    }
    // Positive neighbours c, c + 1 (both finite): the midpoint (exact in f32) goes to the even
    // code, a step of one f32 ulp either side to the nearer one.
    for (int c = 0; c < f.max_code; ++c) {
      const float lo = f.decode(static_cast<std::uint8_t>(c));
      const float hi = f.decode(static_cast<std::uint8_t>(c + 1));
      const float mid = (lo + hi) / 2;
      ASSERT_EQ(static_cast<double>(mid), (static_cast<double>(lo) + hi) / 2) << c;
      EXPECT_EQ(f.encode(mid), (c % 2 == 0) ? c : c + 1) << c;
      EXPECT_EQ(f.encode(std::nextafter(mid, 0.f)), c) << c;
      EXPECT_EQ(f.encode(std::nextafter(mid, 1e30f)), c + 1) << c;
      EXPECT_EQ(f.encode(-mid), ((c % 2 == 0) ? c : c + 1) | 0x80) << c;
    }
  }
}

TEST(Fp8, SaturationNaNAndInf) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const Format& f : kFormats) {
    SCOPED_TRACE(f.name);
    const float max = f.decode(f.max_code);
    for (float big :
         {max, std::nextafter(max, inf), max * 1.2f, 1e30f, std::numeric_limits<float>::max()}) {
      EXPECT_EQ(f.encode(big), f.max_code) << big;
      EXPECT_EQ(f.encode(-big), f.max_code | 0x80) << big;
    }
    EXPECT_TRUE(is_nan_code(f, f.encode(nan)));
    EXPECT_TRUE(is_nan_code(f, f.encode(-nan)));
    if (f.ieee) {  // e5m2 keeps Inf
      EXPECT_EQ(f.encode(inf), 0x7c);
      EXPECT_EQ(f.encode(-inf), 0xfc);
    } else {  // e4m3 has none: NaN, never a value that looks valid
      EXPECT_TRUE(is_nan_code(f, f.encode(inf)));
      EXPECT_TRUE(is_nan_code(f, f.encode(-inf)));
    }
    // Below half the smallest subnormal: zero of the sign; f32 subnormals too.
    const float tiny = f.decode(1) / 2;
    EXPECT_EQ(f.encode(tiny), 0);  // a tie: to even (zero)
    EXPECT_EQ(f.encode(std::nextafter(tiny, 1.f)), 1);
    EXPECT_EQ(f.encode(-1e-40f), 0x80);
    EXPECT_EQ(f.encode(0.f), 0);
    EXPECT_EQ(f.encode(-0.f), 0x80);
  }
}

// The nearest finite code by search (ties to the even code), saturating past the largest.
std::uint8_t nearest(const Format& f, float x) {
  const bool neg = std::signbit(x);
  const double a = std::fabs(static_cast<double>(x));
  int best = 0;
  double best_err = a;
  for (int c = 1; c <= f.max_code; ++c) {
    const double err = std::fabs(a - f.decode(static_cast<std::uint8_t>(c)));
    if (err < best_err || (err == best_err && c % 2 == 0)) best = c, best_err = err;
  }
  return static_cast<std::uint8_t>(best | (neg ? 0x80 : 0));
}

TEST(Fp8, RandomValuesGoToTheNearestCode) {
  std::mt19937_64 rng(testing::seed_for_test());
  SCOPED_TRACE("PAGEDATTN_TEST_SEED=" + std::to_string(testing::base_seed()));
  std::uniform_real_distribution<float> exponent(-22.f, 17.f);
  std::uniform_real_distribution<float> unit(-1.f, 1.f);
  for (const Format& f : kFormats) {
    SCOPED_TRACE(f.name);
    for (int i = 0; i < 20000; ++i) {
      const float x = unit(rng) * std::exp2(exponent(rng));
      ASSERT_EQ(f.encode(x), nearest(f, x)) << x;
    }
  }
}

// The CPU kernels this host runs, by their PAGEDATTN_CPU_ISA names.
const char* const kCpuIsas[] = {"amx", "avx512bf16", "avx512", "avx2", "sse2", "neon"};

// A case of one head and one token per sequence, every code of `f` once at least: code
// (b * D + d) % 256 at dimension d of sequence b's row of `which` cache (the other cache and q
// all zero), and the rest of each block (slots past the context) NaN codes, which no kernel may
// read.
struct CodeCase {
  testing::HostCase c;
  int batch;
};
CodeCase code_case(const Format& f, int D, bool in_k, DType q_dtype) {
  testing::CaseSpec spec;
  spec.batch = (256 + D - 1) / D;
  spec.num_heads = spec.num_kv_heads = 1;
  spec.head_dim = D;
  spec.block_size = 16;
  spec.context_lens.assign(spec.batch, 1);
  spec.kv_dtype = std::string(f.name) == "e4m3" ? DType::kFP8E4M3 : DType::kFP8E5M2;
  spec.q_dtype = q_dtype;
  testing::HostCase c = testing::make_case(spec);
  const DecodeArgs a = c.args();
  const CacheLayout l = a.cache_layout();
  for (int b = 0; b < spec.batch; ++b) {
    for (int t = 0; t < spec.block_size; ++t) {
      const std::int64_t row = l.offset(c.block_table[b * c.table_stride], 0, t);
      for (int d = 0; d < D; ++d) {
        const auto code = static_cast<std::uint8_t>((b * D + d) % 256);
        const std::uint8_t nan = (d & 1) ? 0xff : 0x7f;  // both formats' NaN codes, both signs
        c.k[row + d] = t > 0 ? nan : in_k ? code : 0;
        c.v[row + d] = t > 0 ? nan : in_k ? 0 : code;
      }
    }
  }
  const std::size_t q_elems = static_cast<std::size_t>(spec.batch) * D;
  for (std::size_t i = 0; i < q_elems; ++i) store_from_float(c.q.data(), q_dtype, i, 0.f);
  return CodeCase{std::move(c), spec.batch};
}

// Calls f(fn, format, D, q_dtype) for every CPU kernel the host has, both formats, head dims with
// whole pairs of batches (64, 128) and without (80: the last batch alone), and q f32 and bf16 (the
// kernels that take a bf16 q for Q.K see it), under a trace naming them; expects a kernel at all.
template <typename F>
void for_each_kernel_and_format(F&& f) {
  int kernels = 0;
  for (const char* isa : kCpuIsas) {
    const detail::cpu::KernelFn fn = detail::cpu::kernel_for_isa(isa);
    if (fn == nullptr) continue;
    ++kernels;
    for (const Format& format : kFormats) {
      for (int D : {64, 80, 128}) {
        for (DType q_dtype : {DType::kF32, DType::kBF16}) {
          SCOPED_TRACE(std::string(isa) + " " + format.name + " D " + std::to_string(D) + " q " +
                       dtype_name(q_dtype));
          f(fn, format, D, q_dtype);
        }
      }
    }
  }
  EXPECT_GT(kernels, 0);
}

// Every code of each format through every CPU kernel the host has (their own fp8 widening: f16
// conversions on AVX2 and AVX-512, one or two batches at a time, element by element elsewhere),
// in V: a context of one token has weight 1, so out is exactly that token's V row; NaN codes must
// give NaN, e5m2's Inf codes Inf. Also with the weights rounded to bf16 (a bf16 out: the
// avx512bf16 kernel's P.V on vdpbf16ps, the one token paired with zeros), where 1 stays exact.
TEST(Fp8CpuIsa, EveryCodeWidensExactly) {
  for_each_kernel_and_format([](detail::cpu::KernelFn fn, const Format& f, int D, DType q_dtype) {
    CodeCase cc = code_case(f, D, false, q_dtype);
    const DecodeArgs a = cc.c.args();
    std::vector<float> q(static_cast<std::size_t>(cc.batch) * D, 0.f);  // logits 0
    detail::cpu::ItemContext ctx = detail::cpu::item_context(a, q.data());
    alignas(64) float scores[detail::cpu::kHeadTile * 256];
    std::vector<float> q_buffer(D + 16);
    for (int i = 0; i < 2 * cc.batch; ++i) {
      const int b = i % cc.batch;
      ctx.bf16_weights = i >= cc.batch;
      SCOPED_TRACE(ctx.bf16_weights ? "bf16 weights" : "f32 weights");
      float m = 0.f, lsum = 0.f;
      std::vector<float> acc(D);
      const WorkItem item{b, 0, 0, 0, 1};
      fn(ctx, item, 1, &m, &lsum, acc.data(), detail::cpu::ItemScratch{scores, q_buffer.data()});
      for (int d = 0; d < D; ++d) {
        const auto code = static_cast<std::uint8_t>((b * D + d) % 256);
        const float want = f.decode(code);
        const float got = acc[d] / lsum;
        if (std::isnan(want)) {
          EXPECT_TRUE(std::isnan(got)) << "code " << int(code) << " gave " << got;
        } else {
          EXPECT_EQ(got, want) << "code " << int(code);
        }
      }
    }
  });
}

// The same in K: q all ones and one code per K row (the rest code 0, +0), so the one logit, the
// state's m, is exactly the code's value; a NaN or Inf code makes the state NaN.
TEST(Fp8CpuIsa, EveryCodeWidensExactlyInK) {
  for_each_kernel_and_format([](detail::cpu::KernelFn fn, const Format& f, int D, DType q_dtype) {
    CodeCase cc = code_case(f, D, true, q_dtype);
    const int batch = cc.batch;
    const std::size_t q_elems = static_cast<std::size_t>(batch) * D;
    for (std::size_t i = 0; i < q_elems; ++i) store_from_float(cc.c.q.data(), q_dtype, i, 1.f);
    const DecodeArgs a = cc.c.args();
    const CacheLayout l = a.cache_layout();
    const std::vector<float> ones(q_elems, 1.f);
    detail::cpu::ItemContext ctx = detail::cpu::item_context(a, ones.data());
    ctx.scale = 1.f;  // q_scaled is q itself (and K's scale 1): the logit is the code's value
    alignas(64) float scores[detail::cpu::kHeadTile * 256];
    std::vector<float> q_buffer(D + 16);
    std::vector<float> acc(D);
    for (int code = 0; code < 256; ++code) {
      // Sequence 0's row holds only this code (at dimension code % D), zeros elsewhere.
      const std::int64_t row = l.offset(cc.c.block_table[0], 0, 0);
      for (int d = 0; d < D; ++d) cc.c.k[row + d] = 0;
      cc.c.k[row + code % D] = static_cast<std::uint8_t>(code);
      float m = 0.f, lsum = 0.f;
      const WorkItem item{0, 0, 0, 0, 1};
      fn(ctx, item, 1, &m, &lsum, acc.data(), detail::cpu::ItemScratch{scores, q_buffer.data()});
      const float want = f.decode(static_cast<std::uint8_t>(code));
      if (std::isnan(want) || std::isinf(want)) {
        EXPECT_TRUE(std::isnan(m) && std::isnan(lsum)) << "code " << code << " gave " << m;
      } else {
        EXPECT_EQ(m, want) << "code " << code;
        EXPECT_EQ(lsum, 1.f) << "code " << code;
      }
    }
  });
}

// Every CPU kernel the host has against the f64 reference on random fp8 caches, at every head
// dim (whole pairs of batches or not), group sizes that leave partial head tiles, per-tensor and
// per-head scales, q f32 and bf16; the case poisons every slot no sequence reads (NaN codes past
// each context and in unused blocks). The kernel runs each sequence's kv heads as one task with
// the q buffer, as the backend does, and the result is finished here the way the backend does it
// (q x scale x K scale in, x V scale out).
TEST(Fp8CpuIsa, EveryKernelMatchesTheReference) {
  for (const char* isa : kCpuIsas) {
    const detail::cpu::KernelFn fn = detail::cpu::kernel_for_isa(isa);
    if (fn == nullptr) continue;
    for (DType cache : {DType::kFP8E4M3, DType::kFP8E5M2}) {
      for (int D : kSupportedHeadDims) {
        for (DType q_dtype : {DType::kF32, DType::kBF16}) {
          const bool per_head = D % 64 != 0;
          const int group = D == 128 ? 8 : D == 96 ? 3 : 5;
          testing::CaseSpec spec;
          spec.batch = 3;
          spec.num_kv_heads = 2;
          spec.num_heads = 2 * group;
          spec.head_dim = D;
          spec.block_size = D == 112 ? 7 : 16;
          spec.context_lens = {45, 1, 130};
          spec.spare_blocks = 3;
          spec.q_dtype = q_dtype;
          spec.out_dtype = DType::kF32;
          spec.kv_dtype = cache;
          spec.k_scale = 0.0625f;
          spec.v_scale = 3.f;
          spec.per_head_scales = per_head;
          spec.seed = testing::seed_for_test();
          testing::HostCase c = testing::make_case(spec);
          const DecodeArgs a = c.args();
          // With the weights for P.V in f32, and rounded to bf16 (the backend's setting for a bf16
          // out; the avx512bf16 kernel's vdpbf16ps path for a bf16 q) at the bf16 out tolerance.
          expect_kernel_matches_reference(
              fn, a, isa, testing::describe(spec) + " " + testing::seed_note(spec.seed),
              DType::kBF16);
        }
      }
    }
  }
}

// What fp8 storage costs in accuracy (docs/fp8.md quotes these runs): K and V drawn in f32,
// written into fp8 caches by write_cache with a per-tensor scale of amax / the format's largest
// finite value (the usual calibration), decoded on the CPU and compared with the f64 reference of
// the f32 data. The bounds are about twice the worst seen over six seeds (out 0.063 and 0.10 of
// max |out|, lse 0.027 and 0.062): the quantization's error (3 mantissa bits in e4m3, 2 in e5m2),
// largest on the shortest context, where fewer values average it down.
TEST(Fp8Accuracy, DecodeAgainstTheUnquantizedData) {
  struct Run {
    DType dtype;
    float max_finite;
    double bound;
  };
  for (const Run& run : {Run{DType::kFP8E4M3, 448.f, 0.12}, Run{DType::kFP8E5M2, 57344.f, 0.2}}) {
    SCOPED_TRACE(dtype_name(run.dtype));
    testing::CaseSpec spec =
        testing::shaped_spec(DType::kF32, 16, 4, 128, 16, {1000, 17, 4000, 300});
    spec.seed = testing::seed_for_test();
    testing::HostCase c = testing::make_case(spec);  // f32 q, K, V and out
    const ReferenceResult exact = reference_decode(c.args());
    // Quantize the pool: every slot of every block is written (unread slots hold NaN: NaN codes).
    const std::int64_t slots = static_cast<std::int64_t>(c.num_blocks) * spec.block_size;
    const int KV = spec.num_kv_heads, D = spec.head_dim;
    std::vector<float> key(slots * KV * D), value(key.size());
    const CacheLayout l = CacheLayout::dense(c.num_blocks, KV, spec.block_size, D);
    float k_amax = 0.f, v_amax = 0.f;
    for (std::int64_t t = 0; t < slots; ++t) {
      for (int h = 0; h < KV; ++h) {
        for (int d = 0; d < D; ++d) {
          const std::int64_t at = l.offset(static_cast<int>(t / spec.block_size), h,
                                           static_cast<int>(t % spec.block_size)) +
                                  d;
          const float kx = load_as_float(c.k.data(), DType::kF32, at);
          const float vx = load_as_float(c.v.data(), DType::kF32, at);
          key[(t * KV + h) * D + d] = kx;
          value[(t * KV + h) * D + d] = vx;
          if (std::isfinite(kx)) k_amax = std::max(k_amax, std::fabs(kx));
          if (std::isfinite(vx)) v_amax = std::max(v_amax, std::fabs(vx));
        }
      }
    }
    std::vector<std::int32_t> slot_ids(slots);
    for (std::int64_t t = 0; t < slots; ++t) slot_ids[t] = static_cast<std::int32_t>(t);
    std::vector<std::uint8_t> k8(l.elements()), v8(l.elements());
    CacheWriteArgs w;
    w.num_tokens = static_cast<int>(slots);
    w.num_kv_heads = KV;
    w.head_dim = D;
    w.block_size = spec.block_size;
    w.num_blocks = c.num_blocks;
    w.key = key.data();
    w.value = value.data();
    w.src_dtype = DType::kF32;
    w.slot_mapping = slot_ids.data();
    w.k_cache = k8.data();
    w.v_cache = v8.data();
    w.cache_dtype = run.dtype;
    w.k_scale = k_amax / run.max_finite;
    w.v_scale = v_amax / run.max_finite;
    CacheOpOptions wo;
    wo.backend = Backend::kCpu;
    write_cache(w, wo);

    DecodeArgs a = c.args();
    a.k_cache = k8.data();
    a.v_cache = v8.data();
    a.k_dtype = a.v_dtype = run.dtype;
    a.k_scale = w.k_scale;
    a.v_scale = w.v_scale;
    decode(a, DecodeOptions{Backend::kCpu});
    double err = 0, scale = 1e-30, lse_err = 0;
    for (std::size_t i = 0; i < exact.out.size(); ++i) {
      err = std::max(err, std::fabs(load_as_float(c.out.data(), DType::kF32, i) - exact.out[i]));
      scale = std::max(scale, std::fabs(exact.out[i]));
    }
    for (std::size_t i = 0; i < exact.lse.size(); ++i) {
      if (std::isfinite(exact.lse[i]))
        lse_err = std::max(lse_err, std::fabs(c.lse[i] - exact.lse[i]));
    }
    std::printf("[ fp8 ] %s: out rel_err %.4f (of max |out|), lse abs err %.4f\n",
                dtype_name(run.dtype), err / scale, lse_err);
    EXPECT_LE(err / scale, run.bound);
    EXPECT_LE(lse_err, run.bound / 2);
  }
}

}  // namespace
}  // namespace pagedattn
