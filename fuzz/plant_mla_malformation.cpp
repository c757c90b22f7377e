// The malformations of MLA cases, each planted in a built case's arguments with the error
// mla_decode must raise for it. A table malformation needs a sequence that reads its table (a
// context, and query tokens); where the case has none, the rank is malformed instead, which every
// case can carry, so that a drawn case always plants something.
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "build_mla.hpp"

namespace pagedattn::fuzz {
namespace {

void expect(BuiltMla& m, ErrorCode code, const std::string& argument) {
  m.expected_code = code;
  m.expected_argument = argument;
}

// A value in [1, n - 1] picked by p (n >= 2).
std::int64_t below(std::uint64_t p, std::int64_t n) {
  return 1 + static_cast<std::int64_t>(p % static_cast<std::uint64_t>(n - 1));
}

// The sequence the parameter picks among those that read their table (context > 0 and, with
// q_indptr, at least one query token); -1 when none does.
int reading_sequence(const MlaFuzzCase& c, std::uint64_t p) {
  std::vector<int> reading;
  for (int b = 0; b < c.batch(); ++b) {
    if (c.context_lens[b] > 0 && (c.q_lens.empty() || c.q_lens[b] > 0)) reading.push_back(b);
  }
  return reading.empty() ? -1 : reading[p % reading.size()];
}

bool plant_table(const MlaFuzzCase& c, BuiltMla& m) {
  MlaDecodeArgs& a = m.args;
  const std::uint64_t p = c.bad_param;
  const int stride = a.table_stride();
  const int b = reading_sequence(c, p);
  switch (c.bad) {
    case MlaMalformation::kIdOutOfRange: {
      if (b < 0) return false;
      const int used = (c.context_lens[b] + c.block_size - 1) / c.block_size;
      const int i = static_cast<int>((p >> 8) % static_cast<std::uint64_t>(used));
      const std::int32_t ids[] = {-1, a.num_blocks, a.num_blocks + 17, -(1 << 30)};
      m.table[static_cast<std::size_t>(b) * stride + i] = ids[(p >> 4) % 4];
      expect(m, ErrorCode::kOutOfRange,
             "block_table[" + std::to_string(b) + "][" + std::to_string(i) + "]");
      return true;
    }
    case MlaMalformation::kContextOverCapacity:
    case MlaMalformation::kNegativeContext: {
      if (c.batch() == 0) return false;
      const int s = static_cast<int>(p % static_cast<std::uint64_t>(c.batch()));
      const int capacity = a.max_blocks_per_seq * c.block_size;
      m.lens[s] = c.bad == MlaMalformation::kNegativeContext
                      ? -1 - static_cast<int>((p >> 8) % 1000)
                      : capacity + 1 + static_cast<int>((p >> 8) % 64);
      expect(m, ErrorCode::kOutOfRange, "context_lens[" + std::to_string(s) + "]");
      return true;
    }
    case MlaMalformation::kQIndptrDecreasing: {
      if (c.q_lens.empty() || c.batch() == 0) return false;
      // Entry k below entry k - 1: sequence k - 1 gets a negative count.
      const int k = 1 + static_cast<int>(p % static_cast<std::uint64_t>(c.batch()));
      m.indptr[k] = m.indptr[k - 1] - 1 - static_cast<int>((p >> 8) % 3);
      expect(m, ErrorCode::kOutOfRange, "q_indptr[" + std::to_string(k) + "]");
      return true;
    }
    default:
      return false;
  }
}

bool plant_layout(const MlaFuzzCase& c, BuiltMla& m) {
  MlaDecodeArgs& a = m.args;
  const std::uint64_t p = c.bad_param;
  // c or k_pe (when it has width), by the parameter's low bit.
  const bool kpe = (p & 1) && c.rope_dim > 0;
  const char* part = kpe ? "kpe_strides" : "c_strides";
  MlaPartStrides& s = kpe ? a.kpe_strides : a.c_strides;
  const MlaPartStrides laid = kpe ? a.kpe_layout() : a.c_layout();
  const int width = kpe ? c.rope_dim : c.kv_lora_rank;
  switch (c.bad) {
    case MlaMalformation::kOverlappingRows:
      // Rows closer than a row's width overlap once there are two of them.
      if (c.block_size < 2 && a.num_blocks < 2) return false;
      s = {laid.block, below(p >> 1, width)};
      expect(m, ErrorCode::kInvalidArgument, std::string(part) + ".token");
      return true;
    case MlaMalformation::kNegativeStride:
      s = {-1 - static_cast<std::int64_t>((p >> 1) % 1000), laid.token};
      expect(m, ErrorCode::kInvalidArgument, std::string(part) + ".block");
      return true;
    case MlaMalformation::kQHeadStride:
      a.q_nope_head_stride = below(p, c.kv_lora_rank);
      expect(m, ErrorCode::kInvalidArgument, "q_nope_head_stride");
      return true;
    case MlaMalformation::kQRowStride: {
      const std::int64_t span = (c.num_heads - 1) * a.q_nope_head() + c.kv_lora_rank;
      a.q_nope_row_stride = below(p, span);
      expect(m, ErrorCode::kInvalidArgument, "q_nope_row_stride");
      return true;
    }
    case MlaMalformation::kOutRowStride:
      a.out_row_stride = below(p, static_cast<std::int64_t>(c.num_heads) * c.kv_lora_rank);
      expect(m, ErrorCode::kInvalidArgument, "out_row_stride");
      return true;
    default:
      return false;
  }
}

bool plant_value(const MlaFuzzCase& c, BuiltMla& m) {
  MlaDecodeArgs& a = m.args;
  const std::uint64_t p = c.bad_param;
  switch (c.bad) {
    case MlaMalformation::kKvScale: {
      const float bad[] = {0.f,
                           -1.f,
                           std::numeric_limits<float>::quiet_NaN(),
                           std::numeric_limits<float>::infinity(),
                           1e-31f,
                           1e31f};
      a.kv_scale = is_fp8(c.kv_dtype) ? bad[p % 6] : 2.f;
      expect(m, ErrorCode::kInvalidArgument, "kv_scale");
      return true;
    }
    case MlaMalformation::kTooManyHeads:
      a.num_heads = kMaxMlaHeads + 1 + static_cast<int>(p % 100);
      expect(m, ErrorCode::kUnsupported, "num_heads");
      return true;
    case MlaMalformation::kRank:
      a.kv_lora_rank += 8;  // no longer a multiple of 16
      expect(m, ErrorCode::kUnsupported, "kv_lora_rank");
      return true;
    default:
      return false;
  }
}

}  // namespace

void plant_mla_malformation(const MlaFuzzCase& c, BuiltMla& m) {
  if (plant_table(c, m) || plant_layout(c, m) || plant_value(c, m)) return;
  MlaFuzzCase fallback = c;
  fallback.bad = MlaMalformation::kRank;
  if (!plant_value(fallback, m)) throw std::invalid_argument("mla case: nothing to plant");
}

}  // namespace pagedattn::fuzz
