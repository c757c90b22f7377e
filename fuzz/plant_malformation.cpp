#include "plant_malformation.hpp"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "fast_case.hpp"
#include "pagedattn/cache_layout.hpp"
#include "pagedattn/variants.hpp"

namespace pagedattn::fuzz {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kMaxFloat = std::numeric_limits<float>::max();

std::string seq_arg(const char* name, int s) {
  return std::string(name) + "[" + std::to_string(s) + "]";
}

// A block id, or a context length, out of range.
void plant_in_tables(const FuzzCase& c, BuiltCase& b) {
  testing::HostCase& h = b.host;
  const std::uint64_t p = c.bad_param;
  const int B = c.spec.batch;
  switch (c.bad) {
    case Malformation::kIdOutOfRange: {
      // A sequence whose table is read: a context and, with multi-token queries, a query token.
      std::vector<int> with_blocks;
      for (int s = 0; s < B; ++s) {
        if (h.context_lens[s] > 0 && (!c.multi_token() || c.q_lens[s] > 0)) {
          with_blocks.push_back(s);
        }
      }
      if (with_blocks.empty()) not_applicable(c);
      const int s = with_blocks[p % with_blocks.size()];
      // An entry that is read: a window's first block or later (the earliest query's window
      // with several query tokens).
      const int first =
          first_read_token(h.context_lens[s], c.window_left, c.multi_token() ? c.q_lens[s] : 1) /
          c.spec.block_size;
      const int used = blocks_for(h.context_lens[s], c.spec.block_size);
      const int i = first + static_cast<int>((p >> 8) % (used - first));
      const std::int32_t values[] = {h.num_blocks, h.num_blocks + static_cast<int>((p >> 16) % 7),
                                     -1,           -static_cast<int>((p >> 16) % 100000) - 1,
                                     INT32_MAX,    INT32_MIN};
      h.block_table[static_cast<std::size_t>(s) * h.table_stride + i] = values[(p >> 40) % 6];
      b.expected_code = ErrorCode::kOutOfRange;
      b.expected_argument = "block_table[" + std::to_string(s) + "][" + std::to_string(i) + "]";
      break;
    }
    case Malformation::kContextOverCapacity: {
      if (B <= 0) not_applicable(c);
      const int s = static_cast<int>(p % B);
      const std::int64_t capacity =
          static_cast<std::int64_t>(h.max_blocks_per_seq) * c.spec.block_size;
      const std::int64_t v =
          (p >> 32) % 4 == 0 ? INT32_MAX : capacity + 1 + static_cast<std::int64_t>((p >> 8) % 300);
      h.context_lens[s] = static_cast<std::int32_t>(std::min<std::int64_t>(v, INT32_MAX));
      b.expected_code = ErrorCode::kOutOfRange;
      b.expected_argument = seq_arg("context_lens", s);
      break;
    }
    case Malformation::kNegativeContext: {
      if (B <= 0) not_applicable(c);
      const int s = static_cast<int>(p % B);
      h.context_lens[s] = (p >> 32) % 4 == 0 ? INT32_MIN : -1 - static_cast<int>((p >> 8) % 1000);
      b.expected_code = ErrorCode::kOutOfRange;
      b.expected_argument = seq_arg("context_lens", s);
      break;
    }
    default:
      break;
  }
}

// A shape, a batch, a table stride or a pointer the API refuses.
void plant_in_shapes(const FuzzCase& c, BuiltCase& b) {
  DecodeArgs& a = b.args;
  const std::uint64_t p = c.bad_param;
  const int B = c.spec.batch;
  switch (c.bad) {
    case Malformation::kHeadRatio:
      if (a.num_kv_heads >= 2) {
        a.num_heads += 1 + static_cast<int>(p % (a.num_kv_heads - 1));
      } else {
        a.num_kv_heads = a.num_heads + 1 + static_cast<int>(p % 8);
      }
      b.expected_argument = "num_heads";
      break;
    case Malformation::kGroupTooLarge:
      a.num_kv_heads = 1 + static_cast<int>(p % 4);
      a.num_heads = a.num_kv_heads * (kMaxGroupSize + 1 + static_cast<int>((p >> 8) % 64));
      b.expected_code = ErrorCode::kUnsupported;
      b.expected_argument = "group_size";
      break;
    case Malformation::kNullPointer: {
      if (B <= 0) not_applicable(c);  // a batch of 0 reads no pointer
      switch (p % 6) {
        case 0:
          a.q = nullptr, b.expected_argument = "q";
          break;
        case 1:
          a.k_cache = nullptr, b.expected_argument = "k_cache";
          break;
        case 2:
          a.v_cache = nullptr, b.expected_argument = "v_cache";
          break;
        case 3:
          a.block_table = nullptr, b.expected_argument = "block_table";
          break;
        case 4:
          a.context_lens = nullptr, b.expected_argument = "context_lens";
          break;
        default:
          a.out = nullptr, b.expected_argument = "out";
          break;
      }
      break;
    }
    case Malformation::kHeadDim: {
      const int values[] = {0,   -64, 1,   16,  32,  48,   65,       100,
                            127, 129, 160, 384, 511, 1024, INT32_MAX};
      a.head_dim = values[p % (sizeof(values) / sizeof(values[0]))];
      b.expected_code = ErrorCode::kUnsupported;
      b.expected_argument = "head_dim";
      break;
    }
    case Malformation::kBlockSize: {
      const int values[] = {0, -1, -256, kMaxBlockSize + 1, 512, INT32_MAX, INT32_MIN};
      a.block_size = values[p % (sizeof(values) / sizeof(values[0]))];
      b.expected_code = ErrorCode::kUnsupported;
      b.expected_argument = "block_size";
      break;
    }
    case Malformation::kTableStride:
      if (a.max_blocks_per_seq < 2) not_applicable(c);
      a.block_table_stride = 1 + static_cast<int>(p % (a.max_blocks_per_seq - 1));
      b.expected_argument = "block_table_stride";
      break;
    case Malformation::kNegativeBatch:
      a.batch = p % 2 ? -1 : INT32_MIN;
      b.expected_argument = "batch";
      break;
    default:
      break;
  }
}

// A dtype that is none, or that the API refuses where it stands.
void plant_in_dtypes(const FuzzCase& c, BuiltCase& b) {
  DecodeArgs& a = b.args;
  const std::uint64_t p = c.bad_param;
  switch (c.bad) {
    case Malformation::kDtypeMismatch:
      // Another plain dtype, or for a quantized cache now and then another quantized format.
      a.v_dtype = is_quantized(a.k_dtype) && (p >> 8) % 3 == 0
                      ? kQuantizedDTypes[(static_cast<int>(a.k_dtype) - 2 + p % 3) % 4]
                      : kPlainDTypes[(static_cast<int>(a.k_dtype) + 1 + p % 2) % 3];
      b.expected_code = ErrorCode::kUnsupported;
      b.expected_argument = "v_dtype";
      break;
    case Malformation::kBadDtype: {
      // Values past the last DType (kInt4 = 6) or negative.
      const DType bad =
          static_cast<DType>((p >> 8) % 2 ? -1 : 7 + static_cast<int>((p >> 16) % 50));
      DType* fields[] = {&a.q_dtype, &a.k_dtype, &a.v_dtype, &a.out_dtype};
      const char* names[] = {"q_dtype", "k_dtype", "v_dtype", "out_dtype"};
      *fields[p % 4] = bad;
      b.expected_argument = names[p % 4];
      break;
    }
    case Malformation::kFp8ValueDtype: {
      // The quantized dtypes store K and V caches only: q or out in e4m3, e5m2 or int8, whatever
      // the cache.
      (p % 2 ? a.out_dtype : a.q_dtype) = kQuantizedDTypes[(p >> 8) % 4];
      b.expected_code = ErrorCode::kUnsupported;
      b.expected_argument = p % 2 ? "out_dtype" : "q_dtype";
      break;
    }
    default:
      break;
  }
}

// A scale or an attention variant's value out of range.
void plant_in_values(const FuzzCase& c, BuiltCase& b) {
  DecodeArgs& a = b.args;
  const std::uint64_t p = c.bad_param;
  switch (c.bad) {
    case Malformation::kNonFiniteScale: {
      const float values[] = {std::numeric_limits<float>::quiet_NaN(),
                              std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity()};
      a.scale = values[p % 3];
      b.expected_argument = "scale";
      break;
    }
    case Malformation::kWindowLeft: {
      const int values[] = {-2, -3, -1000, INT32_MIN};
      a.window_left = values[p % 4];
      b.expected_argument = "window_left";
      break;
    }
    case Malformation::kSoftCap: {
      const float values[] = {-1.f, -1e-30f, -60.f,  std::numeric_limits<float>::quiet_NaN(),
                              kInf, -kInf,   1e-30f, kMaxFloat};
      a.logits_soft_cap = values[p % 8];
      b.expected_argument = "logits_soft_cap";
      break;
    }
    case Malformation::kNonFiniteSlope: {
      if (b.alibi_slopes.empty() || c.spec.num_heads <= 0) not_applicable(c);
      const int head = static_cast<int>((p >> 8) % c.spec.num_heads);
      const float values[] = {std::numeric_limits<float>::quiet_NaN(), kInf, -kInf, 1e21f,
                              -kMaxFloat};
      b.alibi_slopes[head] = values[p % 5];
      b.expected_argument = seq_arg("alibi_slopes", head);
      break;
    }
    case Malformation::kBadSink: {
      if (b.sinks.empty() || c.spec.num_heads <= 0) not_applicable(c);
      const int head = static_cast<int>((p >> 8) % c.spec.num_heads);
      const float values[] = {std::numeric_limits<float>::quiet_NaN(), kInf, kMaxFloat, -1e21f};
      b.sinks[head] = values[p % 4];
      b.expected_argument = seq_arg("sinks", head);
      break;
    }
    default:
      break;
  }
}

// A row stride that overlaps rows, or query-token counts that contradict each other.
void plant_in_rows(const FuzzCase& c, BuiltCase& b) {
  DecodeArgs& a = b.args;
  const std::uint64_t p = c.bad_param;
  const int B = c.spec.batch;
  const std::int64_t row = static_cast<std::int64_t>(c.spec.num_heads) * c.spec.head_dim;
  switch (c.bad) {
    case Malformation::kRowStride: {
      // Rows that would overlap: 1 to a row less one, or any negative value.
      const std::int64_t values[] = {
          -1,
          -row,
          std::numeric_limits<std::int64_t>::min(),
          -1 - static_cast<std::int64_t>((p >> 16) % 100000),
          1,
          row - 1,
          1 + static_cast<std::int64_t>((p >> 16) % std::max<std::int64_t>(row - 1, 1))};
      const std::int64_t v = values[(p >> 8) % 7];
      (p % 2 ? a.out_row_stride : a.q_row_stride) = v;
      b.expected_argument = p % 2 ? "out_row_stride" : "q_row_stride";
      break;
    }
    case Malformation::kQIndptrStart: {
      if (!c.multi_token() || B <= 0) not_applicable(c);
      const std::int32_t values[] = {1, -1, 1 + static_cast<std::int32_t>((p >> 16) % 100),
                                     INT32_MAX, INT32_MIN};
      b.q_indptr[0] = values[(p >> 8) % 5];
      b.expected_argument = "q_indptr[0]";
      break;
    }
    case Malformation::kQIndptrDecreasing: {
      // q_indptr[k] below q_indptr[k - 1]: sequence k - 1 gets a negative count, the first error.
      if (!c.multi_token() || B <= 0) not_applicable(c);
      const int k = 1 + static_cast<int>(p % B);
      const std::int64_t v = (p >> 40) % 4 == 0 ? INT32_MIN
                                                : static_cast<std::int64_t>(b.q_indptr[k - 1]) - 1 -
                                                      static_cast<std::int64_t>((p >> 8) % 20);
      b.q_indptr[k] = static_cast<std::int32_t>(v);
      b.expected_code = ErrorCode::kOutOfRange;
      b.expected_argument = seq_arg("q_indptr", k);
      break;
    }
    case Malformation::kQLenOverMax: {
      // A count above max_q_len: a lower max_q_len (at least 1) than the largest count, or one
      // sequence given more tokens, q_indptr shifted from there on (up to INT32_MAX). The first
      // sequence over the bound is named.
      if (!c.multi_token() || B <= 0) not_applicable(c);
      const int longest = *std::max_element(c.q_lens.begin(), c.q_lens.end());
      int over = -1;
      if (longest >= 2 && (p >> 40) % 2 == 0) {
        a.max_q_len = 1 + static_cast<int>((p >> 8) % (longest - 1));
        for (int s = 0; s < B && over < 0; ++s) {
          if (c.q_lens[s] > a.max_q_len) over = s;
        }
      } else {
        over = static_cast<int>(p % B);
        if ((p >> 48) % 4 == 0) {
          b.q_indptr[over + 1] = INT32_MAX;
        } else {
          const int extra = c.max_q_len + 1 + static_cast<int>((p >> 8) % 40) - c.q_lens[over];
          for (int s = over + 1; s <= B; ++s) b.q_indptr[s] += extra;
        }
      }
      b.expected_code = ErrorCode::kOutOfRange;
      b.expected_argument = seq_arg("q_indptr", over + 1);
      break;
    }
    case Malformation::kQIndptrEnd: {
      // Counts in range that do not add up to num_q_tokens: num_q_tokens larger, or the last
      // count one more or one less (within [0, max_q_len]).
      if (!c.multi_token() || B <= 0) not_applicable(c);
      const int last = c.q_lens[B - 1];
      if ((p >> 8) % 2 == 0) {
        a.num_q_tokens += 1 + static_cast<int>((p >> 16) % 64);
      } else {
        b.q_indptr[B] += last < c.max_q_len && (last == 0 || (p >> 16) % 2) ? 1 : -1;
      }
      b.expected_argument = seq_arg("q_indptr", B);
      break;
    }
    case Malformation::kMaxQLen: {
      if (!c.multi_token()) not_applicable(c);
      const int values[] = {0, -1, INT32_MIN};
      a.max_q_len = values[p % 3];
      b.expected_argument = "max_q_len";
      break;
    }
    case Malformation::kQTokensWithoutIndptr: {
      // q_indptr left out (or never set) with num_q_tokens, or only max_q_len, still set.
      a.q_indptr = nullptr;
      const int values[] = {1, B, B + 1, -1, INT32_MAX};
      a.num_q_tokens = c.multi_token() && p % 2 ? b.rows : values[(p >> 8) % 5];
      if (a.num_q_tokens == 0 || (p >> 16) % 4 == 0) {
        a.num_q_tokens = 0;
        a.max_q_len = c.multi_token() ? c.max_q_len : 1 + static_cast<int>((p >> 24) % 16);
        b.expected_argument = "max_q_len";
      } else {
        b.expected_argument = "num_q_tokens";
      }
      break;
    }
    default:
      break;
  }
}

// A quantized cache's scale out of range, or a scale on a cache that takes none.
void plant_in_scales(const FuzzCase& c, BuiltCase& b) {
  DecodeArgs& a = b.args;
  const std::uint64_t p = c.bad_param;
  switch (c.bad) {
    case Malformation::kBadKvScale: {
      // Outside [kMinKvScale, kMaxKvScale]: zero of either sign, negative (the case's own
      // scale negated among them), NaN, infinite, just past either bound, or the extremes.
      if (!c.quantized()) not_applicable(c);
      const bool v = p % 2;
      const float own = v ? c.spec.v_scale : c.spec.k_scale;
      const float values[] = {
          0.f,   -0.f,  -1.f,     -own,      std::numeric_limits<float>::quiet_NaN(), kInf,
          -kInf, 1e31f, 9.9e-31f, kMaxFloat, std::numeric_limits<float>::denorm_min()};
      (v ? a.v_scale : a.k_scale) = values[(p >> 8) % (sizeof(values) / sizeof(values[0]))];
      b.expected_argument = v ? "v_scale" : "k_scale";
      break;
    }
    case Malformation::kScaleOnPlainCache: {
      // A valid scale other than 1, or a per-head array (of ones: the array itself is refused),
      // on a cache of f32, f16 or bf16.
      if (c.quantized()) not_applicable(c);
      const float values[] = {0.5f, 2.f, 0.99999994f, 1.00000012f, 1e-3f, kMinKvScale, kMaxKvScale};
      const float x = values[(p >> 8) % (sizeof(values) / sizeof(values[0]))];
      switch (p % 4) {
        case 0:
          a.k_scale = x, b.expected_argument = "k_scale";
          break;
        case 1:
          a.v_scale = x, b.expected_argument = "v_scale";
          break;
        case 2:
          b.k_scales.assign(static_cast<std::size_t>(c.spec.num_kv_heads), 1.f);
          b.expected_argument = "k_scales";
          break;
        default:
          b.v_scales.assign(static_cast<std::size_t>(c.spec.num_kv_heads), 1.f);
          b.expected_argument = "v_scales";
          break;
      }
      b.expected_code = ErrorCode::kUnsupported;
      break;
    }
    case Malformation::kBadKvHeadScale: {
      // One kv head's K or V scale (an array the case has) out of range; like the variants'
      // values, read back from device memory by the CUDA backend in checked mode.
      if (!c.quantized() || !c.per_head_scales() || c.spec.num_kv_heads <= 0) {
        not_applicable(c);
      }
      const bool v = c.k_scales.empty() || (!c.v_scales.empty() && p % 2);
      const int head = static_cast<int>((p >> 8) % c.spec.num_kv_heads);
      const float values[] = {
          0.f,   -0.f,     -1.f,       std::numeric_limits<float>::quiet_NaN(), kInf, -kInf,
          1e31f, 9.9e-31f, -kMaxFloat, std::numeric_limits<float>::denorm_min()};
      (v ? b.v_scales : b.k_scales)[static_cast<std::size_t>(head)] =
          values[(p >> 16) % (sizeof(values) / sizeof(values[0]))];
      b.expected_argument = seq_arg(v ? "v_scales" : "k_scales", head);
      break;
    }
    default:
      break;
  }
}

}  // namespace

void not_applicable(const FuzzCase& c) {
  throw std::invalid_argument(std::string("malformation ") + malformation_name(c.bad) +
                              " does not apply to this case");
}

void plant_malformation(const FuzzCase& c, BuiltCase& b) {
  switch (c.bad) {
    case Malformation::kNone:
      return;
    case Malformation::kIdOutOfRange:
    case Malformation::kContextOverCapacity:
    case Malformation::kNegativeContext:
      return plant_in_tables(c, b);
    case Malformation::kHeadRatio:
    case Malformation::kGroupTooLarge:
    case Malformation::kNullPointer:
    case Malformation::kHeadDim:
    case Malformation::kBlockSize:
    case Malformation::kTableStride:
    case Malformation::kNegativeBatch:
      return plant_in_shapes(c, b);
    case Malformation::kDtypeMismatch:
    case Malformation::kBadDtype:
    case Malformation::kFp8ValueDtype:
      return plant_in_dtypes(c, b);
    case Malformation::kNonFiniteScale:
    case Malformation::kWindowLeft:
    case Malformation::kSoftCap:
    case Malformation::kNonFiniteSlope:
    case Malformation::kBadSink:
      return plant_in_values(c, b);
    case Malformation::kRowStride:
    case Malformation::kQIndptrStart:
    case Malformation::kQIndptrDecreasing:
    case Malformation::kQLenOverMax:
    case Malformation::kQIndptrEnd:
    case Malformation::kMaxQLen:
    case Malformation::kQTokensWithoutIndptr:
      return plant_in_rows(c, b);
    case Malformation::kKvStrides:
      return plant_kv_strides(c, b);
    case Malformation::kBadKvScale:
    case Malformation::kScaleOnPlainCache:
    case Malformation::kBadKvHeadScale:
      return plant_in_scales(c, b);
    case Malformation::kTreeBitAboveDiagonal:
    case Malformation::kTreeSpanShort:
    case Malformation::kTreeIndptrStart:
    case Malformation::kTreeUnpaired:
    case Malformation::kTreeWithoutQIndptr:
      return plant_in_tree_mask(c, b);
    case Malformation::kTokenScalesOnPlainCache:
    case Malformation::kTokenScalesUnpaired:
    case Malformation::kBadTokenScale:
    case Malformation::kTokenScaleStrides:
      return plant_in_token_scales(c, b);
    case Malformation::kCount:
      not_applicable(c);
  }
}

}  // namespace pagedattn::fuzz
