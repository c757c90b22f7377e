// Drawing MLA cases: DeepSeek's shape (rank 512, rope 64, 16 to 128 heads) half the time, other
// multiples of 16 otherwise; page sizes 1 to 256; contexts sized to a work budget, so that a case
// costs about as much as a GQA one, with now and then a large one.
#include <algorithm>
#include <cstdint>

#include "mla_case.hpp"
#include "rng.hpp"

namespace pagedattn::fuzz {
namespace {

constexpr std::uint64_t kMlaSalt = 0x6d6c612d63617365ull;  // "mla-case"

int draw_heads(Rng& r) {
  static const int kHeads[] = {1, 2, 3, 4, 8, 16, 16, 32, 64, 128, 128};
  return r.chance(0.2) ? r.uniform(1, 128) : r.pick(kHeads);
}

// kv_lora_rank and rope_dim: DeepSeek's 512 and 64, or other multiples of 16 (rope 0 included),
// now and then the widest the library takes.
void draw_widths(Rng& r, MlaFuzzCase& c) {
  if (r.chance(0.5)) {
    c.kv_lora_rank = 512;
    c.rope_dim = 64;
    return;
  }
  c.kv_lora_rank = 16 * (r.chance(0.05) ? r.uniform(33, 64) : r.uniform(1, 32));
  c.rope_dim = 16 * (r.chance(0.05) ? r.uniform(9, 16) : r.uniform(0, 8));
}

int draw_block_size(Rng& r) {
  static const int kSizes[] = {1, 2, 16, 16, 32, 64, 128, 256};
  return r.chance(0.25) ? r.uniform(1, 256) : r.pick(kSizes);
}

DType draw_float(Rng& r) {
  static const DType kTypes[] = {DType::kF32, DType::kF16, DType::kBF16};
  return r.pick(kTypes);
}

// Contexts of the batch within `budget` multiply-adds of the logits: block boundaries, empty and
// one-token contexts, and random lengths.
void draw_contexts(Rng& r, MlaFuzzCase& c, int batch, double budget) {
  const double per_token = static_cast<double>(c.num_heads) * (c.kv_lora_rank + c.rope_dim);
  const int longest = static_cast<int>(std::clamp(budget / per_token / batch, 1.0, 5000.0));
  for (int b = 0; b < batch; ++b) {
    const int pick = r.uniform(0, 9);
    int len = pick == 0   ? 0
              : pick == 1 ? 1
              : pick <= 3 ? c.block_size * r.uniform(1, 4) + r.uniform(-1, 1)
                          : r.uniform(1, longest);
    c.context_lens.push_back(std::clamp(len, 0, longest));
  }
}

// Multi-token queries in 40% of the cases: 0 to 4 query tokens per sequence, mostly 1 to 4.
void draw_query_tokens(Rng& r, MlaFuzzCase& c) {
  if (!r.chance(0.4)) return;
  for (int b = 0; b < c.batch(); ++b) c.q_lens.push_back(r.chance(0.1) ? 0 : r.uniform(1, 4));
  int most = 1;
  for (int n : c.q_lens) most = std::max(most, n);
  c.max_q_len = most + (r.chance(0.2) ? r.uniform(1, 3) : 0);
}

void draw_values(Rng& r, MlaFuzzCase& c) {
  c.q_dtype = draw_float(r);
  c.out_dtype = draw_float(r);
  static const DType kCaches[] = {DType::kF32,     DType::kF16,     DType::kBF16,
                                  DType::kFP8E4M3, DType::kFP8E5M2, DType::kBF16};
  c.kv_dtype = r.pick(kCaches);
  if (is_fp8(c.kv_dtype)) {
    static const float kScales[] = {1.f, 0.5f, 0.0625f, 0.01f, 3.7f, 0.2f};
    c.kv_scale = r.pick(kScales);
  }
  static const float kMagnitudes[] = {1.f, 1.f, 1.f, 0.25f, 3.f};
  c.magnitude = r.pick(kMagnitudes);
  if (r.chance(0.3)) c.scale = static_cast<float>(0.01 + 0.2 * r.real());
}

void draw_layouts(Rng& r, MlaFuzzCase& c) {
  c.combined = r.chance(0.5);
  if (r.chance(0.4)) c.row_pad = r.uniform(1, 48);
  if (r.chance(0.3)) c.block_pad = r.uniform(1, 200);
  c.fused_q = r.chance(0.3);
  if (c.fused_q && r.chance(0.5)) c.head_pad = r.uniform(1, 16);
  if (r.chance(0.3)) c.q_row_pad = r.uniform(1, 40);
  if (r.chance(0.3)) c.out_row_pad = r.uniform(1, 40);
  if (r.chance(0.2)) c.table_pad = r.uniform(1, 5);
  c.spare_blocks = r.uniform(0, 3);
  c.lse = r.chance(0.8);
}

// A malformation in one case of seven, its parameter picking the sequence, entry or value.
void draw_malformation(Rng& r, MlaFuzzCase& c) {
  if (!r.chance(1.0 / 7)) return;
  c.bad = static_cast<MlaMalformation>(r.uniform(1, static_cast<int>(MlaMalformation::kCount) - 1));
  c.bad_param = r.next();
}

}  // namespace

bool is_mla_index(std::uint64_t seed, std::uint64_t index, double share) {
  if (share <= 0) return false;
  return share >= 1 || stream_rng(seed, index, kMlaSalt, 2).real() < share;
}

MlaFuzzCase draw_mla_case(std::uint64_t seed, std::uint64_t index) {
  Rng r = stream_rng(seed, index, kMlaSalt, 1);
  MlaFuzzCase c;
  c.num_heads = draw_heads(r);
  draw_widths(r, c);
  c.block_size = draw_block_size(r);
  const int batch = r.chance(0.03) ? 0 : r.uniform(1, 8);
  // Most cases within about 4M multiply-adds, one in ten up to 40M.
  draw_contexts(r, c, std::max(batch, 1), r.chance(0.1) ? 4e7 : 4e6);
  if (batch == 0) c.context_lens.clear();
  draw_query_tokens(r, c);
  draw_values(r, c);
  draw_layouts(r, c);
  c.threads = r.uniform(1, 4);
  draw_malformation(r, c);
  c.data_seed = r.next();
  c.origin_seed = seed;
  c.origin_index = index;
  return c;
}

}  // namespace pagedattn::fuzz
