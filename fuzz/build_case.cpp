#include "build_case.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "cuda_alignment.hpp"
#include "fast_case.hpp"
#include "pagedattn/cache_layout.hpp"
#include "pagedattn/tree_mask.hpp"
#include "pagedattn/validate.hpp"
#include "pagedattn/variants.hpp"
#include "plant_malformation.hpp"
#include "rng.hpp"

namespace pagedattn::fuzz {
namespace {

float snapped(float x) { return std::max(-127.f, std::min(127.f, std::nearbyint(x))); }

// A case's per-head values for n heads: its own, repeated when n is larger.
std::vector<float> per_head(const std::vector<float>& values, int n) {
  std::vector<float> out(values);
  if (values.empty()) return out;
  out.resize(static_cast<std::size_t>(std::max(n, static_cast<int>(values.size()))));
  for (std::size_t i = values.size(); i < out.size(); ++i) out[i] = values[i % values.size()];
  return out;
}

// The spec make_fast_case builds: every sequence's context, and one block and one table entry
// where the contexts use none, since an empty pool or an empty table row gives a null data()
// pointer, which the API rejects for any batch > 0 (even when every context is empty).
testing::CaseSpec buildable_spec(const FuzzCase& c) {
  testing::CaseSpec spec = c.spec;
  spec.context_lens.resize(std::max(spec.batch, 0));
  int used_blocks = 0;
  for (int L : spec.context_lens) used_blocks += blocks_for(std::max(L, 0), spec.block_size);
  if (used_blocks == 0) {
    spec.spare_blocks = std::max(spec.spare_blocks, 1);
    if (spec.table_padding + spec.table_stride_extra == 0) spec.table_padding = 1;
  }
  return spec;
}

// Tree masks belong to multi-token cases, one per sequence of q_lens[b]^2 bits, none above the
// diagonal (a bad bit is a malformation, planted in the packed bytes).
void require_tree_masks(const FuzzCase& c) {
  if (!c.tree) {
    if (!c.tree_masks.empty()) throw std::invalid_argument("tree masks without the tree flag");
    return;
  }
  if (!c.multi_token() || c.tree_masks.size() != c.q_lens.size()) {
    throw std::invalid_argument("tree masks need multi-token queries and one mask per sequence");
  }
  for (std::size_t b = 0; b < c.q_lens.size(); ++b) {
    const std::string& mask = c.tree_masks[b];
    const int n = c.q_lens[b];
    bool valid = mask.size() == static_cast<std::size_t>(n) * n &&
                 mask.find_first_not_of("01") == std::string::npos;
    for (int i = 0; i < n && valid; ++i) {
      for (int j = i + 1; j < n && valid; ++j) valid = !c.tree_bit(static_cast<int>(b), i, j);
    }
    if (!valid) {
      throw std::invalid_argument("tree mask " + std::to_string(b) +
                                  " must hold q_lens^2 bits of 0 and 1, none above the diagonal");
    }
  }
}

// Per-token scales belong to quantized caches, and a layout other than the dense one (a gap of
// 0 to 4096 in the padded one alone) to per-token scales. Bad strides are the token-scale-strides
// malformation's business, planted in the arguments.
void require_token_scale_layout(const FuzzCase& c) {
  if (c.token_scales() && !c.quantized()) {
    throw std::invalid_argument("per-token scales need a quantized cache");
  }
  const bool padded = c.token_scale_layout == TokenScaleLayout::kPadded;
  if ((!c.token_scales() && c.token_scale_layout != TokenScaleLayout::kDense) ||
      c.token_scale_pad < 0 || c.token_scale_pad > 4096 || (!padded && c.token_scale_pad != 0)) {
    throw std::invalid_argument(
        "token_scale_layout " + std::string(token_scale_layout_name(c.token_scale_layout)) + " " +
        std::to_string(c.token_scale_pad) +
        " needs per-token scales, and a pad in [0, 4096] the padded layout");
  }
}

// Refuses what is no case (a shrink step or a hand-written case that breaks these is not one; bad
// counts and bad scales are malformations, planted in the arguments): multi-token queries need a
// count per sequence, none negative nor above max_q_len; scales belong to quantized caches, one
// per kv head where given.
void require_case(const FuzzCase& c) {
  const testing::CaseSpec& spec = c.spec;
  if (c.multi_token()) {
    if (static_cast<int>(c.q_lens.size()) != std::max(spec.batch, 0) ||
        std::any_of(c.q_lens.begin(), c.q_lens.end(),
                    [&](int n) { return n < 0 || n > c.max_q_len; }) ||
        std::accumulate(c.q_lens.begin(), c.q_lens.end(), 0.0) > 1e5) {
      throw std::invalid_argument(
          "q_lens must list batch counts in [0, max_q_len = " + std::to_string(c.max_q_len) + "]");
    }
  } else if (!c.q_lens.empty()) {
    throw std::invalid_argument("q_lens without max_q_len");
  }
  require_tree_masks(c);
  if (!is_quantized(spec.kv_dtype) &&
      (spec.k_scale != 1.f || spec.v_scale != 1.f || c.per_head_scales())) {
    throw std::invalid_argument("k_scale, v_scale, k_scales and v_scales need a quantized cache");
  }
  for (const std::vector<float>* values : {&c.k_scales, &c.v_scales}) {
    if (!values->empty() && static_cast<int>(values->size()) != spec.num_kv_heads) {
      throw std::invalid_argument("per-head scales must list num_kv_heads values");
    }
  }
  require_token_scale_layout(c);
  if (spec.kv_dtype == DType::kInt4 &&
      (spec.head_dim % kInt4GroupSize != 0 || c.kv_pad % 2 != 0 || !c.token_scales())) {
    throw std::invalid_argument(
        "an int4 cache needs a head_dim multiple of 32, an even kv_pad and its group scales");
  }
}

// Each row's sequence and the context it attends as a query.
void map_rows(const FuzzCase& c, BuiltCase& b) {
  const testing::HostCase& h = b.host;
  const int B = c.spec.batch;
  if (c.multi_token()) {
    b.q_indptr.assign(static_cast<std::size_t>(std::max(B, 0)) + 1, 0);
    for (int s = 0; s < B; ++s) {
      const int n = c.q_lens[s];
      b.q_indptr[s + 1] = b.q_indptr[s] + n;
      for (int i = 0; i < n; ++i) {
        b.row_seq.push_back(s);
        b.row_lens.push_back(std::max(0, h.context_lens[s] - n + i + 1));
      }
    }
  } else {
    for (int s = 0; s < B; ++s) {
      b.row_seq.push_back(s);
      b.row_lens.push_back(h.context_lens[s]);
    }
  }
  b.rows = static_cast<int>(b.row_seq.size());
}

// The tree masks packed as DecodeArgs::tree_mask takes them (FuzzCase::tree_pack_seed: back to
// back, or with a first offset of 1-3 bytes, 0-3 bytes of garbage after each mask and garbage in
// the bits past its last one), args pointed at them.
void pack_tree_masks(const FuzzCase& c, BuiltCase& b) {
  if (!c.tree) return;
  Rng r(c.tree_pack_seed);
  const bool padded = c.tree_pack_seed != 0;
  const auto garbage = [&](int count) {
    for (int k = 0; k < count; ++k) b.tree_mask.push_back(static_cast<std::uint8_t>(r.next()));
  };
  garbage(padded ? r.uniform(1, 3) : 0);
  b.tree_mask_indptr.push_back(static_cast<std::int32_t>(b.tree_mask.size()));
  for (int s = 0; s < c.spec.batch; ++s) {
    const int n = c.q_lens[static_cast<std::size_t>(s)];
    const std::size_t start = b.tree_mask.size();
    b.tree_mask.resize(start + static_cast<std::size_t>(tree_mask_bytes(n)), 0);
    for (std::int64_t bit = 0; bit < tree_mask_bytes(n) * 8; ++bit) {
      const bool set = bit < static_cast<std::int64_t>(n) * n
                           ? c.tree_bit(s, static_cast<int>(bit / n), static_cast<int>(bit % n))
                           : padded && (r.next() & 1);
      if (set) set_tree_mask_bit(b.tree_mask.data() + start, bit);
    }
    garbage(padded ? (r.chance(0.5) ? 0 : r.uniform(1, 3)) : 0);
    b.tree_mask_indptr.push_back(static_cast<std::int32_t>(b.tree_mask.size()));
  }
  if (b.tree_mask.empty()) garbage(1);
  b.args.tree_mask = b.tree_mask.data();
  b.args.tree_mask_indptr = b.tree_mask_indptr.data();
}

// Each row's attended tokens (BuiltCase::row_attended): its window less its tree mask's holes.
void count_attended(const FuzzCase& c, BuiltCase& b) {
  b.row_attended.resize(b.row_lens.size());
  for (std::size_t r = 0; r < b.row_lens.size(); ++r) {
    const int L = b.row_lens[r];
    int n = 0;
    for (int t = window_first_token(L, c.window_left); t < L; ++t) {
      n += b.tree_attends(static_cast<int>(r), t);
    }
    b.row_attended[r] = n;
  }
}

// A finite per-token scale rounded up to a power of two (the codes stay as they are: the values
// they stand for grow by less than 2x).
float pow2_ceil(float x) {
  int e = 0;
  const float m = std::frexp(x, &e);
  return !std::isfinite(x) || m == 0.5f ? x : std::ldexp(1.f, e);
}

// Integers in [-127, 127] are exact in every dtype and their products sum exactly in f32
// (|sum| <= 512 * 127 * 128 < 2^24, the largest e5m2 integer of 127's rounding being 128); times
// a power-of-two scale, each logit is exact: so the K per-token scales become powers of two too.
void snap_values(testing::HostCase& h) {
  const testing::CaseSpec& spec = h.spec;
  for (std::size_t i = 0; i < h.q.size() / dtype_size(spec.q_dtype); ++i) {
    store_from_float(h.q.data(), spec.q_dtype, i,
                     snapped(load_as_float(h.q.data(), spec.q_dtype, i)));
  }
  // int4 codes are integers already (-8 included, which a store would make -7).
  const std::size_t k_elems =
      spec.kv_dtype == DType::kInt4 ? 0 : h.k.size() / dtype_size(spec.kv_dtype);
  for (std::size_t i = 0; i < k_elems; ++i) {
    const float x = load_as_float(h.k.data(), spec.kv_dtype, i);
    if (std::isfinite(x)) store_from_float(h.k.data(), spec.kv_dtype, i, snapped(x));
  }
  for (float& x : h.k_token_scales) x = pow2_ceil(x);
}

// The gaps of an int8 cache's storage as poison_row poisons its slots (store_kv writes NaN there,
// which int8 stores as the code 0, an ordinary value): every byte -128, then the rows copied back.
void poison_int8_gaps(const testing::HostCase& h, testing::KvStorage& kv) {
  const testing::CaseSpec& s = h.spec;
  const testing::KvGeometry& g = kv.geometry;
  const CacheLayout l =
      CacheLayout::with_strides(h.num_blocks, s.num_kv_heads, s.block_size, s.head_dim, g.strides);
  const std::size_t row = static_cast<std::size_t>(s.head_dim);
  std::vector<std::uint8_t> k(kv.k.size(), 0x80), v(kv.v.size(), 0x80);
  std::vector<std::uint8_t>& v_buffer = g.shared ? k : v;
  const std::uint8_t* v_rows = g.shared ? kv.k.data() : kv.v.data();
  const std::size_t v_offset = static_cast<std::size_t>(g.v_offset);
  for (int blk = 0; blk < h.num_blocks; ++blk) {
    for (int kv_head = 0; kv_head < s.num_kv_heads; ++kv_head) {
      for (int slot = 0; slot < s.block_size; ++slot) {
        const std::size_t at = static_cast<std::size_t>(l.offset(blk, kv_head, slot));
        std::copy_n(kv.k.data() + at, row, k.begin() + static_cast<std::ptrdiff_t>(at));
        std::copy_n(v_rows + v_offset + at, row,
                    v_buffer.begin() + static_cast<std::ptrdiff_t>(v_offset + at));
      }
    }
  }
  kv.k = std::move(k);
  kv.v = std::move(v);
}

// K and V in the case's layout, copied from the dense (and snapped) ones, args pointed at them.
void lay_out_kv(const FuzzCase& c, BuiltCase& b) {
  if (c.default_layout()) return;
  if (c.kv_pad < 0 || (c.kv_pad > 0 && c.kv_layout != testing::KvLayout::kPaddedHnd) ||
      c.kv_pad > 4096) {
    throw std::invalid_argument("kv_pad " + std::to_string(c.kv_pad) +
                                " needs the padded_hnd layout and a value in [0, 4096]");
  }
  const testing::HostCase& h = b.host;
  b.kv = c.kv_pad == 0 ? testing::store_kv(h, c.kv_layout)
                       : testing::store_kv(h, c.kv_layout, c.kv_geometry(h.num_blocks));
  if (c.spec.kv_dtype == DType::kInt8) poison_int8_gaps(h, b.kv);
  b.kv.apply(b.args, b.kv.k.data(), b.kv.v.data());
}

// The per-token scales in the case's layout (FuzzCase::token_scale_layout), copied from the dense
// (and snapped) ones with NaN in every gap and after the last block's rows, args pointed at them.
void lay_out_token_scales(const FuzzCase& c, BuiltCase& b) {
  const testing::HostCase& h = b.host;
  if (h.k_token_scales.empty()) return;
  const int KV = c.spec.num_kv_heads, BS = c.spec.block_size;
  const int n_row = token_scales_per_row(c.spec.kv_dtype, c.spec.head_dim);  // int4: per group
  const CacheStrides strides = c.token_scale_strides();
  const CacheLayout from = CacheLayout::dense(h.num_blocks, KV, BS, n_row);
  const CacheLayout to = CacheLayout::with_strides(h.num_blocks, KV, BS, n_row, strides);
  const std::size_t n = static_cast<std::size_t>(
      std::max(to.elements(), static_cast<std::int64_t>(h.num_blocks) * to.block_stride));
  b.k_token_scales.assign(n, std::numeric_limits<float>::quiet_NaN());
  b.v_token_scales.assign(n, std::numeric_limits<float>::quiet_NaN());
  for (int blk = 0; blk < h.num_blocks; ++blk) {
    for (int kv = 0; kv < KV; ++kv) {
      for (int slot = 0; slot < BS; ++slot) {
        const std::size_t src = static_cast<std::size_t>(from.offset(blk, kv, slot));
        const std::size_t dst = static_cast<std::size_t>(to.offset(blk, kv, slot));
        for (int g = 0; g < n_row; ++g) {
          b.k_token_scales[dst + g] = h.k_token_scales[src + g];
          b.v_token_scales[dst + g] = h.v_token_scales[src + g];
        }
      }
    }
  }
  b.args.k_token_scales = b.k_token_scales.data();
  b.args.v_token_scales = b.v_token_scales.data();
  b.args.token_scale_strides = strides;
}

// Strided q and out: the dense rows copied into rows of the stride, gaps after each (q's NaN; out's
// are poisoned with the rest of it).
void lay_out_rows(const FuzzCase& c, BuiltCase& b) {
  const testing::CaseSpec& spec = c.spec;
  const std::int64_t row = static_cast<std::int64_t>(spec.num_heads) * spec.head_dim;
  const std::pair<const char*, std::int64_t> strides[] = {{"q_row_stride", c.q_row_stride},
                                                          {"out_row_stride", c.out_row_stride}};
  for (const auto& [name, stride] : strides) {
    // A stride the library would refuse is a malformation's business, and a shrink step that
    // made one is simply not a candidate; the bound keeps a hand-written case in memory.
    if (stride < 0 || (stride > 0 && stride < row) ||
        (stride > 0 && static_cast<double>(stride) * std::max(b.rows, 1) > 1e8)) {
      throw std::invalid_argument(std::string(name) + " " + std::to_string(stride) +
                                  " is not a valid stride for this case's rows of " +
                                  std::to_string(row) + " elements");
    }
  }
  // The buffers' rows: with multi-token queries at least one (make_fast_case), even when no
  // sequence has a query token.
  const int buffer_rows = c.multi_token() && spec.batch > 0 ? std::max(b.rows, 1) : b.rows;
  b.q_stride = c.q_row_stride ? c.q_row_stride : row;
  b.out_stride = c.out_row_stride ? c.out_row_stride : row;
  DecodeArgs& a = b.args;
  if (c.q_row_stride != 0) {
    const std::size_t qsz = dtype_size(spec.q_dtype);
    const std::int64_t n = buffer_rows * b.q_stride;
    b.q_rows.resize(static_cast<std::size_t>(n) * qsz);
    for (std::int64_t i = 0; i < n; ++i) {
      store_from_float(b.q_rows.data(), spec.q_dtype, i, std::numeric_limits<float>::quiet_NaN());
    }
    for (int r = 0; r < b.rows; ++r) {
      std::copy_n(b.host.q.begin() + static_cast<std::ptrdiff_t>(r * row * qsz), row * qsz,
                  b.q_rows.begin() + static_cast<std::ptrdiff_t>(r * b.q_stride * qsz));
    }
    a.q = b.q_rows.data();
    a.q_row_stride = c.q_row_stride;
  }
  if (c.out_row_stride != 0) {
    b.out_rows.resize(static_cast<std::size_t>(buffer_rows * b.out_stride) *
                      dtype_size(spec.out_dtype));
    a.out = b.out_rows.data();
    a.out_row_stride = c.out_row_stride;
  }
}

// What the CUDA backend has no kernel for yet, which it refuses (kUnsupported) right after the
// shapes, before anything else, or null: whatever the batch, a head dim (512; dispatch's
// require_cuda_head_dim, before a batch of 0 returns) or an int4 cache.
const char* cuda_unsupported(const DecodeArgs& a) {
  if (!is_cuda_head_dim(a.head_dim)) return "head_dim";
  if (a.k_dtype == DType::kInt4) return "k_dtype";  // dispatch's require_cuda_cache_dtype
  return nullptr;
}

// The CUDA backend checks its rows' alignment after the shapes and before q_indptr, the tables
// and the variants' values (which it reads back in checked mode only), over the rows the
// arguments declare; then the cache strides (once there is a sequence: a batch of 0 is a no-op).
// Before them all it refuses what it has no kernel for (cuda_unsupported). The fuzzer runs such
// cases on it all the same and requires that refusal, out and lse untouched, rather than keep them
// from a run with cuda among the backends.
void expect_cuda_refusal(const FuzzCase& c, BuiltCase& b) {
  const DecodeArgs& a = b.args;
  const bool shapes_pass =
      c.bad == Malformation::kNone || c.bad == Malformation::kIdOutOfRange ||
      c.bad == Malformation::kContextOverCapacity || c.bad == Malformation::kNegativeContext ||
      c.bad == Malformation::kNonFiniteSlope || c.bad == Malformation::kBadSink ||
      c.bad == Malformation::kQIndptrStart || c.bad == Malformation::kQIndptrDecreasing ||
      c.bad == Malformation::kQLenOverMax || c.bad == Malformation::kQIndptrEnd ||
      c.bad == Malformation::kBadKvHeadScale || c.bad == Malformation::kTreeBitAboveDiagonal ||
      c.bad == Malformation::kTreeSpanShort || c.bad == Malformation::kTreeIndptrStart ||
      c.bad == Malformation::kBadTokenScale;
  if (!shapes_pass) return;
  if (const char* field = cuda_unsupported(a)) {
    b.cuda_refuses = field;
    b.cuda_refuses_code = ErrorCode::kUnsupported;
    return;
  }
  const std::int64_t row = static_cast<std::int64_t>(c.spec.num_heads) * c.spec.head_dim;
  if (const char* field =
          misaligned_stride(a.q_rows(), row, c.q_row_stride, c.spec.q_dtype, c.out_row_stride)) {
    b.cuda_refuses = field;
  } else if (const char* kv_field =
                 a.batch > 0 ? misaligned_kv(a.cache_layout(), a.k_dtype) : nullptr) {
    b.cuda_refuses = kv_field;
  }
}

// args pointed at the host copies of the per-head arrays, long enough for the (possibly
// malformed) head counts, and at the host's table and lengths where a malformation changed them.
void point_at_host_arrays(const FuzzCase& c, BuiltCase& b) {
  DecodeArgs& a = b.args;
  if (!b.alibi_slopes.empty()) b.alibi_slopes = per_head(b.alibi_slopes, a.num_heads);
  if (!b.sinks.empty()) b.sinks = per_head(b.sinks, a.num_heads);
  a.alibi_slopes = b.alibi_slopes.empty() ? nullptr : b.alibi_slopes.data();
  a.sinks = b.sinks.empty() ? nullptr : b.sinks.data();
  if (!b.k_scales.empty()) b.k_scales = per_head(b.k_scales, a.num_kv_heads);
  if (!b.v_scales.empty()) b.v_scales = per_head(b.v_scales, a.num_kv_heads);
  a.k_scales = b.k_scales.empty() ? nullptr : b.k_scales.data();
  a.v_scales = b.v_scales.empty() ? nullptr : b.v_scales.data();
  if (c.bad == Malformation::kIdOutOfRange || c.bad == Malformation::kContextOverCapacity ||
      c.bad == Malformation::kNegativeContext) {
    a.block_table = b.host.block_table.data();
    a.context_lens = b.host.context_lens.data();
  }
}

}  // namespace

bool BuiltCase::tree_attends(int r, int t) const {
  if (tree_mask_indptr.empty()) return true;
  const int s = row_seq[static_cast<std::size_t>(r)];
  const int n = q_indptr[s + 1] - q_indptr[s];
  const TreeMaskRow row = tree_mask_row(tree_mask.data(), tree_mask_indptr[s], n, r - q_indptr[s],
                                        host.context_lens[s]);
  return row.attends(t);
}

DecodeArgs BuiltCase::dense_args() const {
  DecodeArgs a = args;
  if (laid_out()) {
    a.k_cache = host.k.data();
    a.v_cache = host.v.data();
    a.kv_strides = CacheStrides{};
  }
  if (a.k_token_scales != nullptr && !host.k_token_scales.empty()) {
    a.k_token_scales = host.k_token_scales.data();
    a.v_token_scales = host.v_token_scales.data();
    a.token_scale_strides = CacheStrides{};
  }
  return a;
}

void BuiltCase::poison_outputs() {
  host.poison_outputs();
  if (out_rows.empty()) return;
  const std::size_t osz = dtype_size(host.spec.out_dtype);
  const std::size_t row_bytes =
      static_cast<std::size_t>(host.spec.num_heads) * host.spec.head_dim * osz;
  std::fill(out_rows.begin(), out_rows.end(), kOutGapByte);
  for (int r = 0; r < rows; ++r) {
    std::fill_n(out_rows.begin() + static_cast<std::ptrdiff_t>(r * out_stride * osz), row_bytes,
                std::uint8_t{0xff});
  }
}

BuiltCase build_case(const FuzzCase& c) {
  BuiltCase b;
  const testing::CaseSpec spec = buildable_spec(c);
  require_case(c);
  b.host = make_fast_case(spec, c.window_left, c.q_lens, c.k_scales, c.v_scales, c.tree_masks);
  map_rows(c, b);
  if (c.snap) snap_values(b.host);
  DecodeArgs& a = b.args;
  a = b.host.args();
  // Before any malformation, which may leave the dtype that sizes V's offset in a shared buffer
  // invalid.
  lay_out_kv(c, b);
  lay_out_token_scales(c, b);
  if (c.scale != 0.f) a.scale = c.scale;
  a.window_left = c.window_left;
  a.logits_soft_cap = c.soft_cap;
  if (c.multi_token()) {
    a.q_indptr = b.q_indptr.data();
    a.num_q_tokens = b.rows;
    a.max_q_len = c.max_q_len;
  }
  pack_tree_masks(c, b);
  count_attended(c, b);
  b.alibi_slopes = per_head(c.alibi_slopes, spec.num_heads);
  b.sinks = per_head(c.sinks, spec.num_heads);
  b.k_scales = c.k_scales;
  b.v_scales = c.v_scales;
  lay_out_rows(c, b);
  b.poison_outputs();
  plant_malformation(c, b);
  expect_cuda_refusal(c, b);
  point_at_host_arrays(c, b);
  return b;
}

}  // namespace pagedattn::fuzz
