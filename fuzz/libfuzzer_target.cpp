// Coverage-guided fuzzing of the API's validation and the CPU path (libFuzzer, built with clang
// and -fsanitize=fuzzer,address,undefined by scripts/build_libfuzzer.sh).
//
// The input bytes choose every DecodeArgs field, valid or not (the attention variants, the q
// and out row strides, multi-token queries and fp8 caches with their scales included), then the
// contents of the context
// lengths, the block table and the tensors. Buffers are allocated at exactly the sizes the declared
// shapes imply, so AddressSanitizer reports any read or write outside them; with a window, the
// table entries before it are as random as the rest (validation and the kernels must ignore them);
// between the rows of a strided q lies NaN (a read of it makes out non-finite), between those of a
// strided out a byte pattern that must survive. Each input must either raise pagedattn::Error,
// agree with the f64 reference's own validation, and leave out and lse untouched; or succeed with
// every output finite and close to the reference and out's gaps untouched.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "pagedattn/detail/dispatch.hpp"
#include "pagedattn/pagedattn.hpp"
#include "pagedattn/reference.hpp"

namespace {

using pagedattn::DecodeArgs;
using pagedattn::DType;

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "pagedattn libfuzzer target: %s\n", what);
  std::abort();
}

// A dtype the buffers can be filled in (fp8 too: validation refuses it for q and out).
bool valid_dtype(DType t) {
  return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16 || pagedattn::is_fp8(t);
}
std::size_t bytes_of(DType t) { return valid_dtype(t) ? pagedattn::dtype_size(t) : 4; }

// A buffer of exactly n bytes (one byte when n is 0, so the pointer is not null).
struct Buffer {
  std::unique_ptr<std::uint8_t[]> data;
  std::size_t size = 0;
  explicit Buffer(std::size_t n) : data(new std::uint8_t[std::max<std::size_t>(n, 1)]()), size(n) {}
};

std::size_t product(std::initializer_list<long long> dims) {
  long long p = 1;
  for (long long d : dims) p *= std::max(d, 0LL);
  return static_cast<std::size_t>(p);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  DecodeArgs a;
  a.batch = in.ConsumeIntegralInRange<int>(-2, 5);
  a.num_kv_heads = in.ConsumeIntegralInRange<int>(-1, 4);
  const int group = in.ConsumeIntegralInRange<int>(0, 66);
  a.num_heads = in.ConsumeBool() ? a.num_kv_heads * group : in.ConsumeIntegralInRange<int>(-1, 80);
  a.head_dim = in.ConsumeBool()
                   ? pagedattn::kSupportedHeadDims[in.ConsumeIntegralInRange<int>(0, 6)]
                   : in.ConsumeIntegralInRange<int>(-2, 300);
  a.block_size = in.ConsumeBool() ? in.ConsumeIntegralInRange<int>(1, 20)
                                  : in.ConsumeIntegralInRange<int>(-2, 260);
  a.num_blocks = in.ConsumeIntegralInRange<int>(-1, 12);
  a.max_blocks_per_seq = in.ConsumeIntegralInRange<int>(-1, 8);
  a.block_table_stride = in.ConsumeIntegralInRange<int>(0, 10);
  const DType kv_dtype = static_cast<DType>(in.ConsumeIntegralInRange<int>(-1, 3));
  a.q_dtype = static_cast<DType>(in.ConsumeIntegralInRange<int>(-1, 3));
  a.k_dtype = kv_dtype;
  a.v_dtype = in.ConsumeIntegralInRange<int>(0, 15) == 0
                  ? static_cast<DType>(in.ConsumeIntegralInRange<int>(-1, 3))
                  : kv_dtype;
  a.out_dtype = static_cast<DType>(in.ConsumeIntegralInRange<int>(-1, 3));
  switch (in.ConsumeIntegralInRange<int>(0, 7)) {
    case 0:
      a.scale = in.ConsumeFloatingPointInRange<float>(-2.f, 2.f);
      break;
    case 1:
      a.scale = std::numeric_limits<float>::quiet_NaN();
      break;
    case 2:
      a.scale = std::numeric_limits<float>::infinity();
      break;
    default:
      break;
  }
  const int null_pointer = in.ConsumeIntegralInRange<int>(0, 24);  // < 7: that pointer is null
  const bool with_lse = in.ConsumeBool();
  const bool single_split = in.ConsumeBool();

  // The attention variants, valid or not. Each draw's first value is "none", which is what an
  // input too short to choose gets (the corpus of plain cases keeps its meaning).
  const float kNaN = std::numeric_limits<float>::quiet_NaN();
  const float kInf = std::numeric_limits<float>::infinity();
  switch (in.ConsumeIntegralInRange<int>(0, 7)) {
    case 4:
    case 5:  // anywhere up to twice the longest possible context
      a.window_left = in.ConsumeIntegralInRange<int>(
          0, 2 * std::max(a.max_blocks_per_seq, 1) * std::clamp(a.block_size, 1, 260));
      break;
    case 6:
      a.window_left = INT32_MAX;
      break;
    case 7:
      a.window_left = in.ConsumeIntegralInRange<int>(INT32_MIN, -2);
      break;
    default:
      break;
  }
  switch (in.ConsumeIntegralInRange<int>(0, 7)) {
    case 4:
    case 5:
      a.logits_soft_cap = in.ConsumeFloatingPointInRange<float>(0.5f, 60.f);
      break;
    case 6:  // small caps squash every logit; huge ones change nothing
      a.logits_soft_cap =
          in.ConsumeBool() ? in.ConsumeFloatingPointInRange<float>(1e-3f, 0.5f) : 1e20f;
      break;
    case 7: {
      const float bad[] = {-1.f, -1e-30f, kNaN, kInf, -kInf};
      a.logits_soft_cap = bad[in.ConsumeIntegralInRange<int>(0, 4)];
      break;
    }
    default:
      break;
  }
  // 0, 1: none; 2: valid values; 3: valid values but one invalid.
  const int slopes_kind = in.ConsumeIntegralInRange<int>(0, 3);
  const int sinks_kind = in.ConsumeIntegralInRange<int>(0, 3);
  const int bad_head = in.ConsumeIntegralInRange<int>(0, 80);

  // Row strides of q and out, after every earlier draw and dense when the input runs out: a row
  // plus a gap, q as the query part of a fused QKV row, out as half of a row twice as long, or
  // one that must be refused (negative, or rows that overlap).
  const std::int64_t row = static_cast<std::int64_t>(product({a.num_heads, a.head_dim}));
  auto draw_stride = [&](bool is_q) -> std::int64_t {
    switch (in.ConsumeIntegralInRange<int>(0, 15)) {
      case 10:
      case 11:
        return row + in.ConsumeIntegralInRange<int>(0, 40);
      case 12:
        return row + in.ConsumeIntegralInRange<int>(41, 300);
      case 13:
        return is_q ? (static_cast<std::int64_t>(a.num_heads) + 2 * a.num_kv_heads) * a.head_dim
                    : 2 * row;
      case 14:
        return row;  // the dense row, given explicitly
      case 15: {
        const std::int64_t bad[] = {-1, std::numeric_limits<std::int64_t>::min(), 1, row - 1};
        return bad[in.ConsumeIntegralInRange<int>(0, 3)];
      }
      default:
        return 0;
    }
  };
  a.q_row_stride = draw_stride(true);
  a.out_row_stride = draw_stride(false);

  // Multi-token queries, after every earlier draw and none when the input runs out: 0-4 none;
  // 5, 6 per-sequence counts of 0-6 (more than a context, now and then) and a max_q_len at or up
  // to 2 above the largest; 7 the same with one error: q_indptr[0] != 0, an entry below the one
  // before, a count above max_q_len, a total other than num_q_tokens, max_q_len 0 or -1, or
  // num_q_tokens and max_q_len without q_indptr.
  std::vector<std::int32_t> indptr;
  bool with_indptr = false;
  if (const int q_kind = in.ConsumeIntegralInRange<int>(0, 7); q_kind >= 5) {
    const int B = std::max(a.batch, 0);
    indptr.assign(static_cast<std::size_t>(B) + 1, 0);
    int longest = 0;
    for (int b = 0; b < B; ++b) {
      const int n = in.ConsumeIntegralInRange<int>(0, 6);
      indptr[b + 1] = indptr[b] + n;
      longest = std::max(longest, n);
    }
    a.num_q_tokens = indptr[B];
    a.max_q_len = std::max(longest, 1) + in.ConsumeIntegralInRange<int>(0, 2);
    with_indptr = true;
    if (q_kind == 7) {
      const int at = B > 0 ? in.ConsumeIntegralInRange<int>(1, B) : 0;
      switch (in.ConsumeIntegralInRange<int>(0, 5)) {
        case 0:
          indptr[0] = in.ConsumeBool() ? 1 : -1;
          break;
        case 1:
          if (at > 0) indptr[at] = indptr[at - 1] - 1;
          break;
        case 2:
          for (int b = at; b <= B && at > 0; ++b) indptr[b] += a.max_q_len + 1;
          break;
        case 3:
          a.num_q_tokens += in.ConsumeBool() ? 1 : -1;
          break;
        case 4:
          a.max_q_len = in.ConsumeIntegralInRange<int>(-1, 0);
          break;
        default:
          with_indptr = false;
          break;
      }
    }
  }
  a.q_indptr = with_indptr ? indptr.data() : nullptr;

  // fp8 caches, after every earlier draw and none when the input runs out. The dtype draws above
  // reach e4m3 (3) but not e5m2 (4), and widening their range would remap every existing input's
  // dtypes: an odd fp8_kind turns every e4m3 field into e5m2 instead. fp8_kind 4-5: k_scale and
  // v_scale drawn (K's 2^-8 to 1, so the logits stay as moderate as the rest; V's 2^-10 to 2^10);
  // 6-7: the same with one of them invalid (0, -1, NaN, inf or 1e31). Scales on a cache that is not
  // fp8 must be refused. Per-head scales: 0, 1 none; 2 valid (K in [1/4, 1], V in [1/4, 4), from
  // the data); 3 valid but one invalid. Both arrays, or V's alone (v_scales_only, which also takes
  // the bad value).
  const int fp8_kind = in.ConsumeIntegralInRange<int>(0, 7);
  if (fp8_kind % 2 == 1) {
    for (DType* t : {&a.q_dtype, &a.k_dtype, &a.v_dtype, &a.out_dtype}) {
      if (*t == DType::kFP8E4M3) *t = DType::kFP8E5M2;
    }
  }
  if (fp8_kind >= 4) {
    a.k_scale = std::exp2(in.ConsumeFloatingPointInRange<float>(-8.f, 0.f));
    a.v_scale = std::exp2(in.ConsumeFloatingPointInRange<float>(-10.f, 10.f));
  }
  if (fp8_kind >= 6) {
    const float bad[] = {0.f, -1.f, kNaN, kInf, 1e31f};
    (in.ConsumeBool() ? a.v_scale : a.k_scale) = bad[in.ConsumeIntegralInRange<int>(0, 4)];
  }
  const int kv_scales_kind = in.ConsumeIntegralInRange<int>(0, 3);
  const bool v_scales_only = in.ConsumeBool();
  // The rows of q, out and lse the arguments declare.
  const int rows = std::max(a.q_rows(), 0);
  // The stride the rows are laid out at: a refused one gets dense rows (nothing may be read).
  auto layout_stride = [&](std::int64_t stride) { return stride < row ? row : stride; };
  const std::int64_t q_stride = layout_stride(a.q_row_stride);
  const std::int64_t out_stride = layout_stride(a.out_row_stride);
  // Elements of `rows` rows at that stride, the last row ending the buffer (AddressSanitizer
  // catches a read or write past it).
  auto extent = [&](std::int64_t stride) {
    return rows > 0 ? static_cast<std::size_t>((rows - 1) * stride + row) : 0;
  };

  // Buffers at the declared sizes. Declared sizes too large for quick runs are skipped.
  const std::size_t stride = static_cast<std::size_t>(
      std::max(a.block_table_stride ? a.block_table_stride : a.max_blocks_per_seq, 0));
  const std::size_t q_elems = extent(q_stride), out_elems = extent(out_stride);
  const std::size_t pool = product({a.num_blocks, a.num_kv_heads, a.block_size, a.head_dim});
  if (pool * 4 > (std::size_t{8} << 20) ||
      std::max(q_elems, out_elems) * 4 > (std::size_t{4} << 20)) {
    return 0;
  }
  Buffer q(q_elems * bytes_of(a.q_dtype)), k(pool * bytes_of(a.k_dtype)),
      v(pool * bytes_of(a.v_dtype)), out(out_elems * bytes_of(a.out_dtype));
  std::vector<std::int32_t> lens(static_cast<std::size_t>(std::max(a.batch, 0)));
  std::vector<std::int32_t> table(static_cast<std::size_t>(std::max(a.batch, 0)) * stride);
  std::vector<float> lse(product({rows, a.num_heads}));
  // Exactly num_heads floats each (AddressSanitizer catches a read past them).
  Buffer slopes(product({a.num_heads}) * sizeof(float)),
      sinks(product({a.num_heads}) * sizeof(float));
  // Exactly num_kv_heads floats each.
  Buffer k_scales(product({a.num_kv_heads}) * sizeof(float)),
      v_scales(product({a.num_kv_heads}) * sizeof(float));

  const long long capacity =
      static_cast<long long>(std::max(a.max_blocks_per_seq, 0)) * std::max(a.block_size, 0);
  for (auto& L : lens) L = in.ConsumeIntegralInRange<int>(-2, static_cast<int>(capacity) + 2);
  for (auto& id : table) id = in.ConsumeIntegralInRange<int>(-2, std::max(a.num_blocks, 0) + 1);
  // Small finite values (logits stay moderate); the rest of the input, cycled.
  const std::vector<std::uint8_t> bytes = in.ConsumeRemainingBytes<std::uint8_t>();
  auto fill = [&](Buffer& b, DType t, std::size_t salt) {
    if (!valid_dtype(t)) return;
    const std::size_t n = b.size / pagedattn::dtype_size(t);
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint8_t x = bytes.empty() ? static_cast<std::uint8_t>(i * 37 + salt)
                                           : bytes[(i + salt) % bytes.size()];
      pagedattn::store_from_float(b.data.get(), t, i, (static_cast<int>(x) - 128) / 64.f);
    }
  };
  fill(q, a.q_dtype, 0);
  fill(k, a.k_dtype, 7);
  fill(v, a.v_dtype, 13);
  if (valid_dtype(a.q_dtype)) {
    for (int b = 0; b + 1 < rows; ++b) {
      for (std::int64_t i = row; i < q_stride; ++i) {
        pagedattn::store_from_float(q.data.get(), a.q_dtype, b * q_stride + i,
                                    std::numeric_limits<float>::quiet_NaN());
      }
    }
  }
  // Slopes in [-2, 2); sinks in [-16, 16) with -inf (no sink) for the lowest byte; then one
  // element made invalid (a non-finite slope, a NaN or +inf sink) when asked for.
  const std::size_t heads = slopes.size / sizeof(float);
  float* slope = reinterpret_cast<float*>(slopes.data.get());
  float* sink = reinterpret_cast<float*>(sinks.data.get());
  for (std::size_t h = 0; h < heads; ++h) {
    const int x = bytes.empty() ? static_cast<int>(h * 53 % 256) : bytes[(h + 29) % bytes.size()];
    slope[h] = (x - 128) / 64.f;
    sink[h] = x == 0 ? -kInf : (x - 128) / 8.f;
  }
  if (heads > 0 && slopes_kind == 3) {
    slope[static_cast<std::size_t>(bad_head) % heads] = bad_head % 2 ? kNaN : -kInf;
  }
  if (heads > 0 && sinks_kind == 3) {
    sink[static_cast<std::size_t>(bad_head) % heads] = bad_head % 2 ? kInf : kNaN;
  }
  const std::size_t kv_heads = k_scales.size / sizeof(float);
  float* k_scale = reinterpret_cast<float*>(k_scales.data.get());
  float* v_scale = reinterpret_cast<float*>(v_scales.data.get());
  for (std::size_t h = 0; h < kv_heads; ++h) {
    const int x = bytes.empty() ? static_cast<int>(h * 71 % 256) : bytes[(h + 31) % bytes.size()];
    k_scale[h] = std::exp2(-x / 128.f);
    v_scale[h] = std::exp2((x - 128) / 64.f);
  }
  if (kv_heads > 0 && kv_scales_kind == 3) {
    const float bad[] = {0.f, -2.f, kNaN, kInf};
    (v_scales_only ? v_scale : k_scale)[static_cast<std::size_t>(bad_head) % kv_heads] =
        bad[bad_head % 4];
  }
  std::memset(out.data.get(), 0xff, std::max<std::size_t>(out.size, 1));
  constexpr std::uint8_t kGapByte = 0xa5;
  const std::size_t out_bytes = bytes_of(a.out_dtype);
  auto for_each_gap_byte = [&](auto&& f) {
    for (int b = 0; b + 1 < rows; ++b) {
      for (std::size_t i = (b * out_stride + row) * out_bytes; i < (b + 1) * out_stride * out_bytes;
           ++i) {
        f(out.data.get()[i]);
      }
    }
  };
  for_each_gap_byte([&](std::uint8_t& x) { x = kGapByte; });
  std::fill(lse.begin(), lse.end(), std::numeric_limits<float>::quiet_NaN());

  a.q = null_pointer == 0 ? nullptr : q.data.get();
  a.k_cache = null_pointer == 1 ? nullptr : k.data.get();
  a.v_cache = null_pointer == 2 ? nullptr : v.data.get();
  a.block_table = null_pointer == 3 ? nullptr : table.data();
  a.context_lens = null_pointer == 4 ? nullptr : lens.data();
  a.out = null_pointer == 5 ? nullptr : out.data.get();
  a.lse = with_lse && null_pointer != 6 ? lse.data() : nullptr;
  a.alibi_slopes = slopes_kind >= 2 ? slope : nullptr;
  a.sinks = sinks_kind >= 2 ? sink : nullptr;
  a.k_scales = kv_scales_kind >= 2 && !v_scales_only ? k_scale : nullptr;
  a.v_scales = kv_scales_kind >= 2 ? v_scale : nullptr;

  const std::vector<std::uint8_t> out_before(out.data.get(), out.data.get() + out.size);
  pagedattn::detail::DecodeOptions options;
  options.backend = pagedattn::Backend::kCpu;
  options.num_threads = 1;
  options.single_split = single_split;

  bool decode_threw = false;
  pagedattn::ErrorCode code{};
  std::string argument;
  try {
    pagedattn::detail::decode(a, options);
  } catch (const pagedattn::Error& e) {
    decode_threw = true;
    code = e.code();
    argument = e.argument();
  }
  if (decode_threw) {
    if (out.size > 0 && std::memcmp(out_before.data(), out.data.get(), out.size) != 0) {
      die("out written before an error");
    }
    for (float x : lse) {
      if (!std::isnan(x)) die("lse written before an error");
    }
  }

  // The reference validates the same way (it needs no out) and, when valid, computes the same
  // function.
  if (a.out == nullptr) return 0;
  pagedattn::ReferenceResult ref;
  try {
    ref = pagedattn::reference_decode(a);
  } catch (const pagedattn::Error& e) {
    if (!decode_threw) die("the reference rejected what decode accepted");
    if (e.code() != code || e.argument() != argument) {
      std::fprintf(stderr, "decode: %s (%s); reference: %s (%s)\n", argument.c_str(),
                   pagedattn::error_code_name(code), e.argument().c_str(),
                   pagedattn::error_code_name(e.code()));
      die("decode and the reference disagree");
    }
    return 0;
  }
  if (decode_threw) die("decode rejected what the reference accepted");
  if (a.batch == 0) return 0;
  for_each_gap_byte([&](std::uint8_t x) {
    if (x != kGapByte) die("a gap between out rows written");
  });

  double scale = 1e-30;
  for (double x : ref.out) scale = std::max(scale, std::fabs(x));
  const double tol = 1e-2 * scale + 1e-6;  // loose: f16/bf16 outputs, moderate logits
  for (std::size_t i = 0; i < ref.out.size(); ++i) {
    const std::int64_t at =
        static_cast<std::int64_t>(i) / row * out_stride + static_cast<std::int64_t>(i) % row;
    const double got = pagedattn::load_as_float(out.data.get(), a.out_dtype, at);
    if (!std::isfinite(got)) die("non-finite or unwritten output");
    if (std::fabs(got - ref.out[i]) > tol) die("output differs from the reference");
  }
  if (a.lse) {
    for (std::size_t i = 0; i < ref.lse.size(); ++i) {
      const double want = ref.lse[i], got = lse[i];
      if (std::isinf(want) ? got != want
                           : !(std::fabs(got - want) <= 1e-3 * (1 + std::fabs(want)))) {
        die("lse differs from the reference");
      }
    }
  }
  return 0;
}
