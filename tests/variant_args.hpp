// The attention variants of a test case, kept on the host (the CUDA runs upload slopes and
// sinks), and the values the variant tests draw them from. Shared by the variant and
// multi-token tests.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <ostream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "pagedattn/pagedattn.hpp"
#include "pagedattn/testing/random_case.hpp"
#include "test_seed.hpp"

namespace pagedattn {

struct Variants {
  int window_left = -1;
  float soft_cap = 0.f;
  std::vector<float> slopes;  // empty: no ALiBi
  std::vector<float> sinks;   // empty: no sinks
};

inline DecodeArgs with_variants(DecodeArgs a, const Variants& v) {
  a.window_left = v.window_left;
  a.logits_soft_cap = v.soft_cap;
  a.alibi_slopes = v.slopes.empty() ? nullptr : v.slopes.data();
  a.sinks = v.sinks.empty() ? nullptr : v.sinks.data();
  return a;
}

inline std::string describe(const Variants& v) {
  std::ostringstream os;
  os << "window_left=" << v.window_left << " soft_cap=" << v.soft_cap
     << " alibi=" << (v.slopes.empty() ? "no" : "yes")
     << " sinks=" << (v.sinks.empty() ? "no" : "yes");
  return os.str();
}

// The usual ALiBi slopes: 2^(-8 (h + 1) / H).
inline std::vector<float> alibi_slopes(int heads) {
  std::vector<float> s(heads);
  for (int h = 0; h < heads; ++h) s[h] = std::exp2(-8.f * (h + 1) / heads);
  return s;
}

// Sinks below, around and above the logits' lse, and every fifth head without one (-inf).
inline std::vector<float> sink_logits(int heads) {
  std::vector<float> s(heads);
  for (int h = 0; h < heads; ++h) {
    s[h] = h % 5 == 1 ? -std::numeric_limits<float>::infinity() : -2.f + 2.5f * (h % 5);
  }
  return s;
}

// The variant grids' rows: one-token or multi-token decode, plain, with each variant alone and
// with all of them.
enum class VariantKind { kPlain, kWindow, kSoftCap, kAlibi, kSinks, kAll };
inline const char* kind_name(VariantKind k) {
  switch (k) {
    case VariantKind::kPlain:
      return "plain";
    case VariantKind::kWindow:
      return "window";
    case VariantKind::kSoftCap:
      return "softcap";
    case VariantKind::kAlibi:
      return "alibi";
    case VariantKind::kSinks:
      return "sinks";
    case VariantKind::kAll:
      return "all";
  }
  return "?";
}
inline void PrintTo(VariantKind k, std::ostream* os) { *os << kind_name(k); }

// A grid row's head dim, block size and group.
struct GridShape {
  int head_dim, block_size, group;
};
inline void PrintTo(const GridShape& s, std::ostream* os) {
  *os << "d" << s.head_dim << "_bs" << s.block_size << "_g" << s.group;
}

// Two kv heads; table rows padded and strided, spare blocks in the pool (poisoned), as in the
// reference grid (test_backend_reference.cpp).
inline testing::CaseSpec variant_spec(DType dtype, int head_dim, int block_size, int group,
                                      std::vector<int> lens, std::uint64_t salt = 0) {
  testing::CaseSpec s =
      testing::shaped_spec(dtype, 2 * group, 2, head_dim, block_size, std::move(lens));
  s.spare_blocks = 5;
  s.table_padding = 2;
  s.table_stride_extra = 3;
  s.seed = testing::seed_for_test() + salt;
  return s;
}

inline std::int32_t& table_entry(testing::HostCase& c, int seq, int i) {
  return c.block_table[static_cast<std::size_t>(seq) * c.table_stride + i];
}

}  // namespace pagedattn
