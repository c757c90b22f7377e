// Coverage-guided fuzzing of the API's validation and the CPU path (libFuzzer, built with clang
// and -fsanitize=fuzzer,address,undefined by scripts/build_libfuzzer.sh).
//
// The input bytes choose every DecodeArgs field, valid or not (libfuzzer_args.hpp: the attention
// variants, the q and out row strides, multi-token queries, fp8 and int8 caches with their scales,
// per-token scales in their strides and tree masks included), then the contents of the context
// lengths, the block table and the tensors. Buffers are allocated at exactly the sizes the declared
// shapes imply (a tree mask's bytes at its offsets' last entry), so AddressSanitizer reports any
// read or write outside them; with a window, the table entries before it are as random as the rest
// (validation and the kernels must ignore them); between the rows of a strided q lies NaN (a read
// of it makes out non-finite), between those of a strided out a byte pattern that must survive.
// Each input must either raise pagedattn::Error, agree with the f64 reference's own validation, and
// leave out and lse untouched; or succeed with every output finite and close to the reference and
// out's gaps untouched.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "libfuzzer_args.hpp"
#include "pagedattn/detail/dispatch.hpp"
#include "pagedattn/pagedattn.hpp"
#include "pagedattn/reference.hpp"

namespace {

using pagedattn::DecodeArgs;
using pagedattn::DType;
using pagedattn::fuzz::DrawnArgs;
using pagedattn::fuzz::product;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr std::uint8_t kGapByte = 0xa5;  // out's gaps: must survive every call

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "pagedattn libfuzzer target: %s\n", what);
  std::abort();
}

// A dtype the buffers can be filled in (fp8 and int8 too: validation refuses them for q and out).
bool valid_dtype(DType t) {
  return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16 || pagedattn::is_quantized(t);
}
std::size_t bytes_of(DType t) { return valid_dtype(t) ? pagedattn::dtype_size(t) : 4; }

// A buffer of exactly n bytes (one byte when n is 0, so the pointer is not null).
struct Buffer {
  std::unique_ptr<std::uint8_t[]> data;
  std::size_t size = 0;
  explicit Buffer(std::size_t n) : data(new std::uint8_t[std::max<std::size_t>(n, 1)]()), size(n) {}
  float* floats() { return reinterpret_cast<float*>(data.get()); }
};

// The rows of q, out and lse the arguments declare, and the strides they are laid out at: a
// refused stride gets dense rows (nothing may be read).
struct Rows {
  int rows;
  std::int64_t row, q_stride, out_stride;

  explicit Rows(const DecodeArgs& a)
      : rows(std::max(a.q_rows(), 0)),
        row(static_cast<std::int64_t>(product({a.num_heads, a.head_dim}))),
        q_stride(a.q_row_stride < row ? row : a.q_row_stride),
        out_stride(a.out_row_stride < row ? row : a.out_row_stride) {}
  // Elements of the rows at that stride, the last row ending the buffer (AddressSanitizer
  // catches a read or write past it).
  std::size_t extent(std::int64_t stride) const {
    return rows > 0 ? static_cast<std::size_t>((rows - 1) * stride + row) : 0;
  }
};

// Every buffer, at exactly the size the arguments declare.
struct Buffers {
  Buffer q, k, v, out;
  std::vector<std::int32_t> lens, table;
  std::vector<float> lse;
  Buffer slopes, sinks;                   // num_heads floats each
  Buffer k_scales, v_scales;              // num_kv_heads floats each
  Buffer k_token_scales, v_token_scales;  // token_scale_elements floats each

  Buffers(const DecodeArgs& a, const Rows& r, std::size_t table_stride)
      : q(r.extent(r.q_stride) * bytes_of(a.q_dtype)),
        k(pool(a) * bytes_of(a.k_dtype)),
        v(pool(a) * bytes_of(a.v_dtype)),
        out(r.extent(r.out_stride) * bytes_of(a.out_dtype)),
        lens(static_cast<std::size_t>(std::max(a.batch, 0))),
        table(static_cast<std::size_t>(std::max(a.batch, 0)) * table_stride),
        lse(product({r.rows, a.num_heads})),
        slopes(product({a.num_heads}) * sizeof(float)),
        sinks(product({a.num_heads}) * sizeof(float)),
        k_scales(product({a.num_kv_heads}) * sizeof(float)),
        v_scales(product({a.num_kv_heads}) * sizeof(float)),
        k_token_scales(token_scale_elements(a) * sizeof(float)),
        v_token_scales(token_scale_elements(a) * sizeof(float)) {}

  static std::size_t pool(const DecodeArgs& a) {
    return product({a.num_blocks, a.num_kv_heads, a.block_size, a.head_dim});
  }
  // The per-token scales' extent in their strides (the last row's end), or the dense pool's where
  // the strides or the shape are refused (then nothing may be read).
  static std::size_t token_scale_elements(const DecodeArgs& a) {
    const pagedattn::CacheStrides& s = a.token_scale_strides;
    const std::size_t dense = product({a.num_blocks, a.num_kv_heads, a.block_size});
    if (s.is_default() || s.block <= 0 || s.head <= 0 || s.token <= 0 || dense == 0) return dense;
    return static_cast<std::size_t>((a.num_blocks - 1) * s.block + (a.num_kv_heads - 1) * s.head +
                                    (a.block_size - 1) * s.token + 1);
  }
};

// Calls f on every byte of out's gaps (between its rows).
template <class F>
void for_each_gap_byte(Buffer& out, const Rows& r, std::size_t out_bytes, F&& f) {
  for (int b = 0; b + 1 < r.rows; ++b) {
    for (std::size_t i = (b * r.out_stride + r.row) * out_bytes;
         i < (b + 1) * r.out_stride * out_bytes; ++i) {
      f(out.data.get()[i]);
    }
  }
}

// q, K and V: small finite values (logits stay moderate) from `bytes`, the rest of the input,
// cycled; NaN between q's rows.
void fill_tensors(const DecodeArgs& a, const Rows& r, const std::vector<std::uint8_t>& bytes,
                  Buffers& b) {
  auto fill = [&](Buffer& buf, DType t, std::size_t salt) {
    if (!valid_dtype(t)) return;
    const std::size_t n = buf.size / pagedattn::dtype_size(t);
    // int8 codes -4..4 (the values' -2..2 would round to five codes), -128 never among them.
    const float unit = t == DType::kInt8 ? 32.f : 64.f;
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint8_t x = bytes.empty() ? static_cast<std::uint8_t>(i * 37 + salt)
                                           : bytes[(i + salt) % bytes.size()];
      pagedattn::store_from_float(buf.data.get(), t, i, (static_cast<int>(x) - 128) / unit);
    }
  };
  fill(b.q, a.q_dtype, 0);
  fill(b.k, a.k_dtype, 7);
  fill(b.v, a.v_dtype, 13);
  if (valid_dtype(a.q_dtype)) {
    for (int row = 0; row + 1 < r.rows; ++row) {
      for (std::int64_t i = r.row; i < r.q_stride; ++i) {
        pagedattn::store_from_float(b.q.data.get(), a.q_dtype, row * r.q_stride + i, kNaN);
      }
    }
  }
}

// Slopes in [-2, 2); sinks in [-16, 16) with -inf (no sink) for the lowest byte; per-kv-head
// scales, K's in [1/4, 1], V's in [1/4, 4); then one element made invalid (a non-finite slope, a
// NaN or +inf sink, a scale of 0, -2, NaN or inf) when asked for.
void fill_head_arrays(const DrawnArgs& d, const std::vector<std::uint8_t>& bytes, Buffers& b) {
  const std::size_t heads = b.slopes.size / sizeof(float);
  float* slope = b.slopes.floats();
  float* sink = b.sinks.floats();
  for (std::size_t h = 0; h < heads; ++h) {
    const int x = bytes.empty() ? static_cast<int>(h * 53 % 256) : bytes[(h + 29) % bytes.size()];
    slope[h] = (x - 128) / 64.f;
    sink[h] = x == 0 ? -kInf : (x - 128) / 8.f;
  }
  const std::size_t bad_head = static_cast<std::size_t>(d.bad_head);
  if (heads > 0 && d.slopes_kind == 3) slope[bad_head % heads] = d.bad_head % 2 ? kNaN : -kInf;
  if (heads > 0 && d.sinks_kind == 3) sink[bad_head % heads] = d.bad_head % 2 ? kInf : kNaN;
  const std::size_t kv_heads = b.k_scales.size / sizeof(float);
  float* k_scale = b.k_scales.floats();
  float* v_scale = b.v_scales.floats();
  for (std::size_t h = 0; h < kv_heads; ++h) {
    const int x = bytes.empty() ? static_cast<int>(h * 71 % 256) : bytes[(h + 31) % bytes.size()];
    k_scale[h] = std::exp2(-x / 128.f);
    v_scale[h] = std::exp2((x - 128) / 64.f);
  }
  if (kv_heads > 0 && d.kv_scales_kind == 3) {
    const float bad[] = {0.f, -2.f, kNaN, kInf};
    (d.v_scales_only ? v_scale : k_scale)[bad_head % kv_heads] = bad[d.bad_head % 4];
  }
}

// Per-token scales in [1/2, 2) (K and V alike, from the data), every element of the buffers (gaps
// of padded strides included); then, when asked for, the element bad_row of one of them (wrapped
// into the buffer: it may land in a row nothing reads) 0, -1, NaN or inf.
void fill_token_scales(const DrawnArgs& d, const std::vector<std::uint8_t>& bytes, Buffers& b) {
  const std::size_t n = b.k_token_scales.size / sizeof(float);
  for (std::size_t i = 0; i < n; ++i) {
    const int x = bytes.empty() ? static_cast<int>(i * 97 % 256) : bytes[(i + 43) % bytes.size()];
    b.k_token_scales.floats()[i] = std::exp2((x - 128) / 128.f);
    b.v_token_scales.floats()[i] = std::exp2((128 - x) / 128.f);
  }
  if (n > 0 && d.token_scales_kind == 2) {
    const float bad[] = {0.f, -1.f, kNaN, kInf};
    (d.v_bad ? b.v_token_scales : b.k_token_scales).floats()[d.bad_row % n] = bad[d.bad_row % 4];
  }
}

// The arguments' pointers at the buffers, the one the input chose null.
void point_at(const DrawnArgs& d, Buffers& b, DecodeArgs& a) {
  const int null_pointer = d.null_pointer;
  a.q = null_pointer == 0 ? nullptr : b.q.data.get();
  a.k_cache = null_pointer == 1 ? nullptr : b.k.data.get();
  a.v_cache = null_pointer == 2 ? nullptr : b.v.data.get();
  a.block_table = null_pointer == 3 ? nullptr : b.table.data();
  a.context_lens = null_pointer == 4 ? nullptr : b.lens.data();
  a.out = null_pointer == 5 ? nullptr : b.out.data.get();
  a.lse = d.with_lse && null_pointer != 6 ? b.lse.data() : nullptr;
  a.alibi_slopes = d.slopes_kind >= 2 ? b.slopes.floats() : nullptr;
  a.sinks = d.sinks_kind >= 2 ? b.sinks.floats() : nullptr;
  a.k_scales = d.kv_scales_kind >= 2 && !d.v_scales_only ? b.k_scales.floats() : nullptr;
  a.v_scales = d.kv_scales_kind >= 2 ? b.v_scales.floats() : nullptr;
  const int t = d.token_scales_kind;
  a.k_token_scales = t != 0 && t != 4 ? b.k_token_scales.floats() : nullptr;
  a.v_token_scales = t != 0 && t != 3 ? b.v_token_scales.floats() : nullptr;
}

// What decode raised, if anything.
struct Raised {
  bool threw = false;
  pagedattn::ErrorCode code{};
  std::string argument;
};

// Runs decode on the CPU backend; an error must leave out and lse untouched.
Raised run_decode(const DecodeArgs& a, bool single_split, Buffers& b) {
  const std::vector<std::uint8_t> out_before(b.out.data.get(), b.out.data.get() + b.out.size);
  pagedattn::detail::DecodeOptions options;
  options.backend = pagedattn::Backend::kCpu;
  options.num_threads = 1;
  options.single_split = single_split;
  Raised raised;
  try {
    pagedattn::detail::decode(a, options);
  } catch (const pagedattn::Error& e) {
    raised.threw = true;
    raised.code = e.code();
    raised.argument = e.argument();
  }
  if (raised.threw) {
    if (b.out.size > 0 && std::memcmp(out_before.data(), b.out.data.get(), b.out.size) != 0) {
      die("out written before an error");
    }
    for (float x : b.lse) {
      if (!std::isnan(x)) die("lse written before an error");
    }
  }
  return raised;
}

// The reference validates the same way (it needs no out) and, when valid, computes the same
// function: decode's outputs finite and close to it, out's gaps untouched.
void check_against_reference(const DecodeArgs& a, const Rows& r, const Raised& raised, Buffers& b) {
  if (a.out == nullptr) return;
  pagedattn::ReferenceResult ref;
  try {
    ref = pagedattn::reference_decode(a);
  } catch (const pagedattn::Error& e) {
    if (!raised.threw) die("the reference rejected what decode accepted");
    if (e.code() != raised.code || e.argument() != raised.argument) {
      std::fprintf(stderr, "decode: %s (%s); reference: %s (%s)\n", raised.argument.c_str(),
                   pagedattn::error_code_name(raised.code), e.argument().c_str(),
                   pagedattn::error_code_name(e.code()));
      die("decode and the reference disagree");
    }
    return;
  }
  if (raised.threw) die("decode rejected what the reference accepted");
  if (a.batch == 0) return;
  for_each_gap_byte(b.out, r, bytes_of(a.out_dtype), [](std::uint8_t x) {
    if (x != kGapByte) die("a gap between out rows written");
  });

  double scale = 1e-30;
  for (double x : ref.out) scale = std::max(scale, std::fabs(x));
  const double tol = 1e-2 * scale + 1e-6;  // loose: f16/bf16 outputs, moderate logits
  for (std::size_t i = 0; i < ref.out.size(); ++i) {
    const std::int64_t at =
        static_cast<std::int64_t>(i) / r.row * r.out_stride + static_cast<std::int64_t>(i) % r.row;
    const double got = pagedattn::load_as_float(b.out.data.get(), a.out_dtype, at);
    if (!std::isfinite(got)) die("non-finite or unwritten output");
    if (std::fabs(got - ref.out[i]) > tol) die("output differs from the reference");
  }
  if (a.lse) {
    for (std::size_t i = 0; i < ref.lse.size(); ++i) {
      const double want = ref.lse[i], got = b.lse[i];
      if (std::isinf(want) ? got != want
                           : !(std::fabs(got - want) <= 1e-3 * (1 + std::fabs(want)))) {
        die("lse differs from the reference");
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  DrawnArgs d;
  pagedattn::fuzz::draw_args(in, d);
  DecodeArgs& a = d.a;
  const Rows r(a);
  // Declared sizes too large for quick runs are skipped.
  const std::size_t table_stride = static_cast<std::size_t>(
      std::max(a.block_table_stride ? a.block_table_stride : a.max_blocks_per_seq, 0));
  if (Buffers::pool(a) * 4 > (std::size_t{8} << 20) ||
      std::max(r.extent(r.q_stride), r.extent(r.out_stride)) * 4 > (std::size_t{4} << 20)) {
    return 0;
  }
  Buffers b(a, r, table_stride);
  const long long capacity =
      static_cast<long long>(std::max(a.max_blocks_per_seq, 0)) * std::max(a.block_size, 0);
  for (auto& L : b.lens) L = in.ConsumeIntegralInRange<int>(-2, static_cast<int>(capacity) + 2);
  for (auto& id : b.table) id = in.ConsumeIntegralInRange<int>(-2, std::max(a.num_blocks, 0) + 1);
  const std::vector<std::uint8_t> bytes = in.ConsumeRemainingBytes<std::uint8_t>();
  fill_tensors(a, r, bytes, b);
  fill_head_arrays(d, bytes, b);
  fill_token_scales(d, bytes, b);
  // Outputs poisoned: NaN in out's rows and lse (an unwritten element shows), kGapByte between.
  std::memset(b.out.data.get(), 0xff, std::max<std::size_t>(b.out.size, 1));
  for_each_gap_byte(b.out, r, bytes_of(a.out_dtype), [](std::uint8_t& x) { x = kGapByte; });
  std::fill(b.lse.begin(), b.lse.end(), kNaN);
  point_at(d, b, a);
  const Raised raised = run_decode(a, d.single_split, b);
  check_against_reference(a, r, raised, b);
  return 0;
}
