#include "fast_case.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "pagedattn/cache_layout.hpp"
#include "pagedattn/variants.hpp"

namespace pagedattn::fuzz {
namespace {

// xoshiro256** seeded through splitmix64: fast and good enough for test data.
class Xoshiro {
 public:
  explicit Xoshiro(std::uint64_t seed) {
    for (auto& w : s_) {
      seed += 0x9e3779b97f4a7c15ull;
      std::uint64_t z = seed;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      w = z ^ (z >> 31);
    }
  }
  std::uint64_t next() {
    const std::uint64_t result = rotl(s_[1] * 5, 7) * 9, t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }
  std::uint32_t below(std::uint32_t n) { return static_cast<std::uint32_t>((next() >> 32) % n); }
  // Approximately standard normal: the sum of four 16-bit uniforms (Irwin-Hall), rescaled to unit
  // variance. Bounded tails (|x| < 3.5) are fine for test data; magnitudes come from the spec.
  float normal() {
    const std::uint64_t r = next();
    const float sum =
        static_cast<float>((r & 0xffff) + ((r >> 16) & 0xffff) + ((r >> 32) & 0xffff) + (r >> 48));
    return (sum * (1.f / 65536.f) - 2.f) * 1.7320508f;
  }

 private:
  static std::uint64_t rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  std::uint64_t s_[4];
};

void fill_normal(std::vector<std::uint8_t>& buf, DType t, std::size_t n, float scale,
                 Xoshiro& rng) {
  buf.assign(n * dtype_size(t), 0);
  for (std::size_t i = 0; i < n; ++i) store_from_float(buf.data(), t, i, scale * rng.normal());
}

// The first token sequence b's query tokens read (one query token per sequence when q_lens is
// empty).
int sequence_first_read(int L, int window_left, const std::vector<int>& q_lens, int b) {
  return first_read_token(L, window_left, q_lens.empty() ? 1 : q_lens[static_cast<std::size_t>(b)]);
}

// Whether any of sequence b's n query tokens attends its new token j by its tree mask (its column
// j holds a set bit).
bool named_by_tree(const std::vector<std::string>& tree_masks, int b, int n, int j) {
  const std::string& mask = tree_masks[static_cast<std::size_t>(b)];
  for (int i = j; i < n; ++i) {
    if (mask[static_cast<std::size_t>(i) * n + j] == '1') return true;
  }
  return false;
}

// One flag per cache slot (block * block_size + slot): 1 where some sequence reads it, a token in
// [sequence_first_read, L) of its context that no tree mask leaves out, else 0. Entries before the
// first read block are never looked at, so they may hold anything.
std::vector<char> attended_slots(const DecodeArgs& a, int window_left,
                                 const std::vector<int>& q_lens,
                                 const std::vector<std::string>& tree_masks) {
  const int BS = a.block_size;
  std::vector<char> readable(static_cast<std::size_t>(a.num_blocks) * BS, 0);
  const BlockTableView table{a.block_table, a.max_blocks_per_seq, a.table_stride()};
  for (int b = 0; b < a.batch; ++b) {
    const int L = a.context_lens[b];
    const int n = q_lens.empty() ? 1 : q_lens[static_cast<std::size_t>(b)];
    for (int t = sequence_first_read(L, window_left, q_lens, b); t < L; ++t) {
      if (!tree_masks.empty() && t >= L - n && !named_by_tree(tree_masks, b, n, t - (L - n))) {
        continue;
      }
      readable[static_cast<std::size_t>(table.block(b, t / BS)) * BS + t % BS] = 1;
    }
  }
  return readable;
}

// A table entry that must never be read: -1, a huge id, random garbage (mostly negative or far
// out of range), or a stale id inside the pool, which only a wrong result can reveal.
std::int32_t trap_entry(Xoshiro& rng, int num_blocks) {
  switch (rng.below(4)) {
    case 0:
      return -1;
    case 1:
      return std::numeric_limits<std::int32_t>::max() - 7;
    case 2:
      return static_cast<std::int32_t>(rng.below(1000000)) - 500000;
    default:
      return num_blocks > 0 ? static_cast<std::int32_t>(rng.below(num_blocks)) : -1;
  }
}

// The dequantization multipliers of every kv head's values (stored times these): the inverse of
// its scales, exactly 1 for caches without any (so their contents do not change).
std::vector<float> inverse_scales(float scale, const std::vector<float>& per_head, int KV) {
  std::vector<float> mul(static_cast<std::size_t>(KV));
  for (std::size_t i = 0; i < mul.size(); ++i) {
    mul[i] = 1.f / (scale * (i < per_head.size() ? per_head[i] : 1.f));
  }
  return mul;
}

// A row's per-token scale: the row (n values, already divided by its kv head's scales) times
// 1 / scale must have its largest |x| at a code of 127 / jitter, jitter in [1, 4] (write_cache
// fits an int8 row to 127; a jitter leaves codes coarser at random): amax * jitter / 127, 1 for a
// row of zeros. 127 in every format, so that snapped codes (integers in [-127, 127]) keep them.
// An int4 group's (max_code 7) the same way at 7 / jitter.
float fitted_scale(const float* x, int n, Xoshiro& rng, float max_code = 127.f) {
  float amax = 0.f;
  for (int d = 0; d < n; ++d) amax = std::max(amax, std::fabs(x[d]));
  const float jitter = std::exp2(2.f * static_cast<float>(rng.next() >> 40) * 0x1p-24f);
  return amax > 0.f ? amax * jitter / max_code : 1.f;
}

// Stores one row of values `x` (D of them) at `base` of a cache buffer, each divided by `scale`.
void store_row(std::vector<std::uint8_t>& buf, DType t, std::int64_t base, const float* x, int D,
               float scale) {
  for (int d = 0; d < D; ++d) store_from_float(buf.data(), t, base + d, x[d] / scale);
}

// K and V: every slot `readable` flags (block * block_size + slot) gets values, every other one
// poison_row. The values: K ~ N(0, magnitude^2) and V ~ N(0, 1) once dequantized, stored divided
// by their kv head's scales and, with spec.token_scales, by their row's own (fitted_scale, drawn
// from a generator of their own, so that the values are those of the same case without them),
// which c.k_token_scales and c.v_token_scales get (dense [num_blocks][num_kv_heads][block_size]).
// An int4 cache's rows have a scale per group of 32 values instead, fitted to 7 / jitter
// (dense [num_blocks][num_kv_heads][block_size][head_dim / 32]).
void fill_kv(testing::HostCase& c, const std::vector<char>& readable, Xoshiro& rng) {
  const testing::CaseSpec& spec = c.spec;
  const int KV = spec.num_kv_heads, D = spec.head_dim, BS = spec.block_size;
  const CacheLayout layout = CacheLayout::dense(c.num_blocks, KV, BS, D);
  const bool int4 = spec.kv_dtype == DType::kInt4;
  const int groups = token_scales_per_row(spec.kv_dtype, D), group = D / groups;
  const float max_code = int4 ? 7.f : 127.f;
  c.k.assign(static_cast<std::size_t>(dtype_bytes(spec.kv_dtype, layout.elements())), 0);
  c.v.assign(c.k.size(), 0);
  const std::size_t rows = static_cast<std::size_t>(c.num_blocks) * KV * BS;
  if (spec.token_scales) {
    c.k_token_scales.assign(rows * groups, 1.f);
    c.v_token_scales.assign(rows * groups, 1.f);
  }
  const std::vector<std::uint8_t> nan_row = poison_row(spec.kv_dtype, D);
  const std::vector<float> k_mul = inverse_scales(spec.k_scale, c.k_scales, KV);
  const std::vector<float> v_mul = inverse_scales(spec.v_scale, c.v_scales, KV);
  Xoshiro scale_rng(spec.seed ^ 0x243f6a8885a308d3ull);
  std::vector<float> k(static_cast<std::size_t>(D)), v(k.size());
  for (std::size_t r = 0; r < rows; ++r) {
    const std::int64_t base = static_cast<std::int64_t>(r) * D;  // dense: row r's elements
    if (!readable[r / (static_cast<std::size_t>(KV) * BS) * BS + r % BS]) {
      const std::int64_t at = dtype_bytes(spec.kv_dtype, base);
      std::copy(nan_row.begin(), nan_row.end(), c.k.begin() + at);
      std::copy(nan_row.begin(), nan_row.end(), c.v.begin() + at);
      continue;
    }
    const std::size_t kv = r / BS % KV;
    for (int d = 0; d < D; ++d) {
      k[d] = spec.magnitude * k_mul[kv] * rng.normal();
      v[d] = v_mul[kv] * rng.normal();
    }
    for (int g = 0; g < groups; ++g) {
      const int d0 = g * group;
      const float ks =
          spec.token_scales ? fitted_scale(k.data() + d0, group, scale_rng, max_code) : 1.f;
      const float vs =
          spec.token_scales ? fitted_scale(v.data() + d0, group, scale_rng, max_code) : 1.f;
      store_row(c.k, spec.kv_dtype, base + d0, k.data() + d0, group, ks);
      store_row(c.v, spec.kv_dtype, base + d0, v.data() + d0, group, vs);
      if (spec.token_scales) {
        c.k_token_scales[r * groups + g] = ks;
        c.v_token_scales[r * groups + g] = vs;
      }
    }
  }
}

// One flag per cache slot (block * block_size + slot): 1 where validate_token_scales checks its
// rows' scales, read or not: every slot below a sequence's context in the blocks it reads (from the
// block of its first read token on, none for a sequence without query tokens). Re-derived here
// from that rule, apart from the library's code, as the fuzzer's oracle of it.
std::vector<char> checked_slots(const DecodeArgs& a, int window_left,
                                const std::vector<int>& q_lens) {
  const int BS = a.block_size;
  std::vector<char> checked(static_cast<std::size_t>(a.num_blocks) * BS, 0);
  const BlockTableView table{a.block_table, a.max_blocks_per_seq, a.table_stride()};
  for (int b = 0; b < a.batch; ++b) {
    const int L = a.context_lens[b];
    if (!q_lens.empty() && q_lens[static_cast<std::size_t>(b)] <= 0) continue;
    for (int t = sequence_first_read(L, window_left, q_lens, b) / BS * BS; t < L; ++t) {
      checked[static_cast<std::size_t>(table.block(b, t / BS)) * BS + t % BS] = 1;
    }
  }
  return checked;
}

// Per-token scale poison: NaN in the rows of every slot no sequence reads, like the codes, but
// kCheckedUnreadScale where validate_token_scales checks the row all the same (checked_slots).
void poison_token_scales(testing::HostCase& c, const std::vector<char>& readable, int window_left,
                         const std::vector<int>& q_lens) {
  const int KV = c.spec.num_kv_heads, BS = c.spec.block_size;
  const std::size_t groups = token_scales_per_row(c.spec.kv_dtype, c.spec.head_dim);
  const std::vector<char> checked = checked_slots(c.args(), window_left, q_lens);
  for (std::size_t i = 0; i < c.k_token_scales.size(); ++i) {
    const std::size_t r = i / groups;  // the row of scale i (an int4 row has several)
    const std::size_t slot = r / (static_cast<std::size_t>(KV) * BS) * BS + r % BS;
    if (readable[slot]) continue;
    const float x = checked[slot] ? kCheckedUnreadScale : std::numeric_limits<float>::quiet_NaN();
    c.k_token_scales[i] = c.v_token_scales[i] = x;
  }
}

}  // namespace

std::vector<std::uint8_t> poison_row(DType t, int n) {
  std::vector<std::uint8_t> row(static_cast<std::size_t>(dtype_bytes(t, n)));
  if (t == DType::kInt8) {
    std::fill(row.begin(), row.end(), std::uint8_t{0x80});  // the code -128
    return row;
  }
  if (t == DType::kInt4) {
    std::fill(row.begin(), row.end(), std::uint8_t{0x88});  // the code -8, twice a byte
    return row;
  }
  for (int d = 0; d < n; ++d) {
    store_from_float(row.data(), t, d, std::numeric_limits<float>::quiet_NaN());
  }
  return row;
}

int first_read_token(int L, int window_left, int q_len) {
  if (q_len <= 0) return L;
  return window_first_token(std::max(L - q_len + 1, 0), window_left);
}

testing::HostCase make_fast_case(const testing::CaseSpec& spec, int window_left,
                                 const std::vector<int>& q_lens, const std::vector<float>& k_scales,
                                 const std::vector<float>& v_scales,
                                 const std::vector<std::string>& tree_masks) {
  testing::HostCase c;
  c.spec = spec;
  c.k_scales = k_scales;
  c.v_scales = v_scales;
  Xoshiro rng(spec.seed);
  const int B = spec.batch, H = spec.num_heads, D = spec.head_dim, BS = spec.block_size;
  testing::size_case(c);
  // One row per query token; at least one with multi-token queries, since a call of sequences
  // without query tokens still needs q and out (not null), which then hold a row never read.
  int rows = B;
  if (!q_lens.empty()) rows = std::max(std::accumulate(q_lens.begin(), q_lens.end(), 0), 1);

  // Physical ids: a permutation of the pool; the first ones go to the sequences.
  std::vector<std::int32_t> pool(c.num_blocks);
  std::iota(pool.begin(), pool.end(), 0);
  if (spec.fragmented) {
    for (int i = c.num_blocks - 1; i > 0; --i) std::swap(pool[i], pool[rng.below(i + 1)]);
  }
  c.block_table.assign(static_cast<std::size_t>(B) * c.table_stride, -1);
  auto entry = [&](int b, int i) -> std::int32_t& {
    return c.block_table[static_cast<std::size_t>(b) * c.table_stride + i];
  };
  int next = 0;
  for (int b = 0; b < B; ++b) {
    const int used = blocks_for(c.context_lens[b], BS);
    // Prefix sharing: the leading full blocks of an earlier sequence, as a prefix cache would.
    int shared = 0, donor = 0;
    if (spec.share_prefix && b > 0 && (rng.next() & 1)) {
      donor = static_cast<int>(rng.below(b));
      const int full = c.context_lens[donor] / BS;
      shared = std::min(used, static_cast<int>(rng.below(full + 1)));
    }
    for (int i = 0; i < used; ++i) {
      const bool forked = testing::forked_block(spec, c.context_lens, b, i);  // draw_forks
      entry(b, i) = forked       ? entry(b - b % spec.fork_members, i)
                    : i < shared ? entry(donor, i)
                                 : pool[next++];
    }
    // Past the context: -1, garbage, or a stale id that is in range; none may be read.
    for (int i = used; i < c.table_stride && spec.poison; ++i) {
      entry(b, i) = trap_entry(rng, c.num_blocks);
    }
  }
  // Before each sequence's first read block (a window's, or with multi-token queries the earliest
  // query's; every block of a sequence without query tokens): the same traps, planted once every
  // row is built, so that a later sequence still shares the real prefix blocks (which it may
  // read).
  if ((window_left >= 0 || !q_lens.empty()) && spec.poison) {
    for (int b = 0; b < B; ++b) {
      const int L = c.context_lens[b];
      const int first =
          std::min(sequence_first_read(L, window_left, q_lens, b) / BS, blocks_for(L, BS));
      for (int i = 0; i < first; ++i) entry(b, i) = trap_entry(rng, c.num_blocks);
    }
  }

  fill_normal(c.q, spec.q_dtype, static_cast<std::size_t>(rows) * H * D, spec.magnitude, rng);
  // Every (block, slot) some sequence reads gets values; with poison, every other one poison_row
  // (the slots before a window among them).
  const std::vector<char> readable =
      spec.poison ? attended_slots(c.args(), window_left, q_lens, tree_masks)
                  : std::vector<char>(static_cast<std::size_t>(c.num_blocks) * BS, 1);
  fill_kv(c, readable, rng);
  if (spec.token_scales && spec.poison) poison_token_scales(c, readable, window_left, q_lens);
  c.out.assign(static_cast<std::size_t>(rows) * H * D * dtype_size(spec.out_dtype), 0);
  c.lse.assign(static_cast<std::size_t>(rows) * H, 0.f);
  c.poison_outputs();
  return c;
}

}  // namespace pagedattn::fuzz
