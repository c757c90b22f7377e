#include "build_mla.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <stdexcept>

#include "rng.hpp"

namespace pagedattn::fuzz {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("mla case: " + what);
}

// The fields a drawn case always keeps within range; a case file may not.
void check_fields(const MlaFuzzCase& c) {
  require(c.num_heads >= 1 && c.num_heads <= kMaxMlaHeads, "num_heads out of range");
  require(c.kv_lora_rank >= 16 && c.kv_lora_rank <= 1024 && c.kv_lora_rank % 16 == 0,
          "kv_lora_rank must be a multiple of 16 in [16, 1024]");
  require(c.rope_dim >= 0 && c.rope_dim <= 256 && c.rope_dim % 16 == 0,
          "rope_dim must be a multiple of 16 in [0, 256]");
  require(c.block_size >= 1 && c.block_size <= kMaxBlockSize, "block_size out of range");
  for (int L : c.context_lens) require(L >= 0 && L <= 1000000, "context length out of range");
  require(c.q_lens.empty() || c.q_lens.size() == c.context_lens.size(), "q_lens per sequence");
  for (int n : c.q_lens) require(n >= 0 && n <= c.max_q_len && n <= 64, "q_lens out of range");
  for (int pad : {c.row_pad, c.block_pad, c.head_pad, c.q_row_pad, c.out_row_pad, c.table_pad}) {
    require(pad >= 0 && pad <= 4096, "a pad out of [0, 4096]");
  }
  require(c.spare_blocks >= 0 && c.spare_blocks <= 64, "spare_blocks out of [0, 64]");
  require(c.threads >= 1 && c.threads <= kMaxThreads, "threads out of range");
  require(std::isfinite(c.magnitude) && c.magnitude > 0, "magnitude must be positive");
  require(std::isfinite(c.scale), "scale must be finite");
  require(is_fp8(c.kv_dtype) ? c.kv_scale >= kMinKvScale && c.kv_scale <= kMaxKvScale
                             : c.kv_scale == 1.f,
          "kv_scale out of range for the cache");
}

// Fills `n` elements of `buf` (dtype t) with NaN.
void fill_nan(std::vector<std::uint8_t>& buf, DType t, std::int64_t n) {
  buf.assign(static_cast<std::size_t>(std::max<std::int64_t>(n, 1)) * dtype_size(t), 0);
  for (std::int64_t i = 0; i < n; ++i) store_from_float(buf.data(), t, i, kNaN);
}

// The table: each sequence's blocks drawn without repeats from a shuffled pool, -1 or garbage in
// the entries past its context (never read), the row padding garbage too.
void build_table(const MlaFuzzCase& c, BuiltMla& m, std::mt19937_64& rng) {
  MlaDecodeArgs& a = m.args;
  int used = 0;
  for (int L : c.context_lens) used += (L + c.block_size - 1) / c.block_size;
  a.num_blocks = used + c.spare_blocks;
  std::vector<std::int32_t> ids(static_cast<std::size_t>(a.num_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  a.max_blocks_per_seq = c.max_blocks_per_seq();
  const int stride = a.max_blocks_per_seq + c.table_pad;
  a.block_table_stride = c.table_pad ? stride : 0;
  m.table.assign(static_cast<std::size_t>(std::max(c.batch() * stride, 1)), -1);
  const std::int32_t garbage[] = {-1, a.num_blocks, 1 << 30, -(1 << 30)};
  for (int b = 0, next = 0; b < c.batch(); ++b) {
    const int n = (c.context_lens[b] + c.block_size - 1) / c.block_size;
    for (int i = 0; i < stride; ++i) {
      m.table[static_cast<std::size_t>(b) * stride + i] = i < n ? ids[next++] : garbage[rng() % 4];
    }
  }
  m.lens.assign(c.context_lens.begin(), c.context_lens.end());
  if (m.lens.empty()) m.lens.push_back(0);  // a pointer for an empty batch
  a.batch = c.batch();
  a.block_table = m.table.data();
  a.context_lens = m.lens.data();
  if (!c.q_lens.empty()) {
    m.indptr.assign(1, 0);
    for (int n : c.q_lens) m.indptr.push_back(m.indptr.back() + n);
    a.q_indptr = m.indptr.data();
    a.num_q_tokens = m.indptr.back();
    a.max_q_len = c.max_q_len;
  }
}

// The latent cache: NaN everywhere, then each context's rows N(0, magnitude) (an fp8 cache holds
// them divided by kv_scale, so that its values keep that spread).
void build_cache(const MlaFuzzCase& c, BuiltMla& m, std::mt19937_64& rng) {
  MlaDecodeArgs& a = m.args;
  const int R = c.kv_lora_rank, P = c.rope_dim, bs = c.block_size;
  const std::int64_t c_token = (c.combined ? R + P : R) + c.row_pad;
  const std::int64_t p_token = c.combined ? c_token : P + c.row_pad;
  const MlaPartStrides cs{bs * c_token + c.block_pad, c_token};
  const MlaPartStrides ps{bs * p_token + c.block_pad, p_token};
  fill_nan(m.c, c.kv_dtype, a.num_blocks * cs.block);
  if (!c.combined) fill_nan(m.kpe, c.kv_dtype, P > 0 ? a.num_blocks * ps.block : 0);
  const std::size_t esz = dtype_size(c.kv_dtype);
  a.kv_dtype = c.kv_dtype;
  a.kv_scale = c.kv_scale;
  a.c_cache = m.c.data();
  a.kpe_cache = c.combined ? m.c.data() + R * esz : m.kpe.data();
  const bool dense = c.row_pad == 0 && c.block_pad == 0;
  a.c_strides = c.combined || !dense ? cs : MlaPartStrides{};
  a.kpe_strides = (c.combined || !dense) && P > 0 ? ps : MlaPartStrides{};
  std::normal_distribution<float> normal(0.f, c.magnitude);
  const int stride = a.table_stride();
  for (int b = 0; b < c.batch(); ++b) {
    for (int t = 0; t < c.context_lens[b]; ++t) {
      const std::int64_t id = m.table[static_cast<std::size_t>(b) * stride + t / bs];
      const std::int64_t slot = t % bs;
      for (int d = 0; d < R + P; ++d) {
        const float v = normal(rng) / c.kv_scale;
        if (d < R || c.combined) {
          store_from_float(m.c.data(), c.kv_dtype, id * cs.block + slot * cs.token + d, v);
        } else {
          store_from_float(m.kpe.data(), c.kv_dtype, id * ps.block + slot * ps.token + d - R, v);
        }
      }
    }
  }
}

// q_nope and q_pe: two slices of one buffer (fused) or two buffers, NaN in every gap.
void build_queries(const MlaFuzzCase& c, BuiltMla& m, std::mt19937_64& rng) {
  MlaDecodeArgs& a = m.args;
  const int H = c.num_heads, R = c.kv_lora_rank, P = c.rope_dim;
  std::normal_distribution<float> normal(0.f, c.magnitude);
  a.q_dtype = c.q_dtype;
  // Fills `buf` with rows of H heads of `head` elements, the first `width` of each a value.
  const auto fill = [&](std::vector<std::uint8_t>& buf, std::int64_t head, std::int64_t row,
                        int width) {
    fill_nan(buf, c.q_dtype, m.rows * row);
    for (std::int64_t r = 0; r < m.rows; ++r) {
      for (std::int64_t h = 0; h < H; ++h) {
        for (int d = 0; d < width; ++d) {
          store_from_float(buf.data(), c.q_dtype, r * row + h * head + d, normal(rng));
        }
      }
    }
  };
  if (c.fused_q) {
    const std::int64_t head = R + P + c.head_pad, row = H * head + c.q_row_pad;
    fill(m.q_nope, head, row, R + P);
    a.q_nope = m.q_nope.data();
    a.q_pe = m.q_nope.data() + R * dtype_size(c.q_dtype);
    a.q_nope_head_stride = a.q_pe_head_stride = head;
    a.q_nope_row_stride = a.q_pe_row_stride = row;
    return;
  }
  fill(m.q_nope, R, H * R + c.q_row_pad, R);
  fill(m.q_pe, P, H * P + c.q_row_pad, P);
  a.q_nope = m.q_nope.data();
  a.q_pe = m.q_pe.data();
  if (c.q_row_pad) {
    a.q_nope_row_stride = H * R + c.q_row_pad;
    a.q_pe_row_stride = H * P + c.q_row_pad;
  }
}

void build_outputs(const MlaFuzzCase& c, BuiltMla& m) {
  MlaDecodeArgs& a = m.args;
  const std::int64_t row = static_cast<std::int64_t>(c.num_heads) * c.kv_lora_rank;
  a.out_dtype = c.out_dtype;
  a.out_row_stride = c.out_row_pad ? row + c.out_row_pad : 0;
  m.out_width = row;
  m.out_row = a.out_row();
  m.out.assign(static_cast<std::size_t>(std::max<std::int64_t>(m.rows * m.out_row, 1)) *
                   dtype_size(c.out_dtype),
               0);
  a.out = m.out.data();
  if (c.lse) {
    m.lse.assign(static_cast<std::size_t>(std::max(m.rows * c.num_heads, 1)), 0.f);
    a.lse = m.lse.data();
  }
  if (c.scale != 0.f) a.scale = c.scale;
  m.poison_outputs();
}

}  // namespace

void BuiltMla::poison_outputs() {
  std::fill(out.begin(), out.end(), kMlaOutGapByte);
  const DType t = args.out_dtype;
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t i = 0; i < out_width; ++i)
      store_from_float(out.data(), t, r * out_row + i, kNaN);
  }
  std::fill(lse.begin(), lse.end(), kNaN);
}

std::string BuiltMla::check_gaps() const {
  const std::size_t esz = dtype_size(args.out_dtype);
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t i = out_width; i < out_row; ++i) {
      const std::size_t at = static_cast<std::size_t>(r * out_row + i) * esz;
      for (std::size_t byte = 0; byte < esz; ++byte) {
        if (out[at + byte] != kMlaOutGapByte) {
          return "wrote out's gap: row " + std::to_string(r) + ", element " + std::to_string(i);
        }
      }
    }
  }
  return "";
}

BuiltMla build_mla_case(const MlaFuzzCase& c) {
  check_fields(c);
  BuiltMla m;
  MlaDecodeArgs& a = m.args;
  a.num_heads = c.num_heads;
  a.kv_lora_rank = c.kv_lora_rank;
  a.rope_dim = c.rope_dim;
  a.block_size = c.block_size;
  m.rows = c.q_rows();
  std::mt19937_64 rng(splitmix64(c.data_seed));
  build_table(c, m, rng);
  build_cache(c, m, rng);
  build_queries(c, m, rng);
  build_outputs(c, m);
  if (c.malformed()) plant_mla_malformation(c, m);
  return m;
}

}  // namespace pagedattn::fuzz
