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

}  // namespace

std::vector<std::uint8_t> poison_row(DType t, int n) {
  std::vector<std::uint8_t> row(static_cast<std::size_t>(n) * dtype_size(t));
  if (t == DType::kInt8) {
    std::fill(row.begin(), row.end(), std::uint8_t{0x80});  // the code -128
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
  const int B = spec.batch, H = spec.num_heads, KV = spec.num_kv_heads, D = spec.head_dim,
            BS = spec.block_size;
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
    for (int i = 0; i < used; ++i) entry(b, i) = i < shared ? entry(donor, i) : pool[next++];
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

  const CacheLayout layout = CacheLayout::dense(c.num_blocks, KV, BS, D);
  fill_normal(c.q, spec.q_dtype, static_cast<std::size_t>(rows) * H * D, spec.magnitude, rng);

  // Every (block, slot) some sequence reads gets values; with poison, every other one NaN (the
  // slots before a window among them).
  const std::vector<char> readable =
      spec.poison ? attended_slots(c.args(), window_left, q_lens, tree_masks)
                  : std::vector<char>(static_cast<std::size_t>(c.num_blocks) * BS, 1);
  const std::size_t bytes = dtype_size(spec.kv_dtype);
  c.k.assign(static_cast<std::size_t>(layout.elements()) * bytes, 0);
  c.v.assign(c.k.size(), 0);
  const std::vector<std::uint8_t> nan_row = poison_row(spec.kv_dtype, D);
  // What each kv head's values are multiplied by before they are stored: the inverse of its
  // scales, exactly 1 for caches without any (so their contents do not change).
  std::vector<float> k_mul(static_cast<std::size_t>(KV)), v_mul(static_cast<std::size_t>(KV));
  for (int kv = 0; kv < KV; ++kv) {
    const std::size_t i = static_cast<std::size_t>(kv);
    k_mul[i] = 1.f / (spec.k_scale * (i < k_scales.size() ? k_scales[i] : 1.f));
    v_mul[i] = 1.f / (spec.v_scale * (i < v_scales.size() ? v_scales[i] : 1.f));
  }
  for (int blk = 0; blk < c.num_blocks; ++blk) {
    for (int kv = 0; kv < KV; ++kv) {
      for (int slot = 0; slot < BS; ++slot) {
        const std::int64_t base = layout.offset(blk, kv, slot);
        if (!readable[static_cast<std::size_t>(blk) * BS + slot]) {
          std::copy(nan_row.begin(), nan_row.end(), c.k.begin() + base * bytes);
          std::copy(nan_row.begin(), nan_row.end(), c.v.begin() + base * bytes);
          continue;
        }
        const float km = spec.magnitude * k_mul[static_cast<std::size_t>(kv)];
        const float vm = v_mul[static_cast<std::size_t>(kv)];
        for (int d = 0; d < D; ++d) {
          store_from_float(c.k.data(), spec.kv_dtype, base + d, km * rng.normal());
          store_from_float(c.v.data(), spec.kv_dtype, base + d, vm * rng.normal());
        }
      }
    }
  }
  c.out.assign(static_cast<std::size_t>(rows) * H * D * dtype_size(spec.out_dtype), 0);
  c.lse.assign(static_cast<std::size_t>(rows) * H, 0.f);
  c.poison_outputs();
  return c;
}

}  // namespace pagedattn::fuzz
