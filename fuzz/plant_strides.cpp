// Cache-view strides the API refuses (plant_malformation.hpp): kv_strides, and the per-token
// scales' token_scale_strides (the same rule, with rows of one element).
#include <algorithm>
#include <cstdint>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "plant_malformation.hpp"

namespace pagedattn::fuzz {
namespace {

// The field require_cache_strides names for strides whose rows overlap, or empty, by the rule it
// documents: with the dimensions in increasing stride (token, kv head, block among equal ones),
// each dimension of more than one entry must start at or past the extent of those before it, a
// row being head_dim elements. An independent oracle of core/src/validate.cpp's check, kept
// apart on purpose: the fuzzer derives the expected error without calling the code it tests.
std::string overlapping_stride(const StridedView& v, const CacheStrides& s) {
  struct Dim {
    const char* name;
    std::int64_t stride;
    int size;
  };
  Dim dims[] = {{".token", s.token, v.block_size},
                {".head", s.head, v.num_kv_heads},
                {".block", s.block, v.num_blocks}};
  std::stable_sort(std::begin(dims), std::end(dims),
                   [](const Dim& x, const Dim& y) { return x.stride < y.stride; });
  std::int64_t extent = v.head_dim;
  for (const Dim& d : dims) {
    if (d.size <= 1) continue;
    if (d.stride < extent) return v.field + d.name;
    extent += d.stride * (d.size - 1);
  }
  return {};
}

// Strides whose rows overlap, for field f (0 block, 1 head, 2 token): below a row (head_dim > 1
// only), or 1-4 below the extent of the dimensions with smaller strides; where that does not
// overlap (rows that interleave), below a row. Empty `field` when neither does.
BadStrides overlapping(const StridedView& v, std::uint64_t p, int f) {
  std::int64_t CacheStrides::*const fields[] = {&CacheStrides::block, &CacheStrides::head,
                                                &CacheStrides::token};
  const int sizes[] = {v.num_blocks, v.num_kv_heads, v.block_size};
  const std::int64_t D = v.head_dim;
  BadStrides bad{v.base, {}};
  CacheStrides& s = bad.strides;
  if ((p >> 16) % 2 && D > 1) {
    s.*fields[f] = 1 + static_cast<std::int64_t>((p >> 24) % (D - 1));
  } else {
    std::int64_t extent = D;  // of the dimensions below this one
    for (int g = 0; g < 3; ++g) {
      if (g != f && sizes[g] > 1 && v.base.*fields[g] < v.base.*fields[f]) {
        extent += v.base.*fields[g] * (sizes[g] - 1);
      }
    }
    s.*fields[f] = std::max<std::int64_t>(extent - 1 - (p >> 24) % 4, 1);
  }
  bad.field = overlapping_stride(v, s);
  if (bad.field.empty() && D > 1) {
    // Rows that interleave without overlapping: below head_dim does overlap.
    s = v.base;
    s.*fields[f] = 1 + static_cast<std::int64_t>((p >> 24) % (D - 1));
    bad.field = overlapping_stride(v, s);
  }
  return bad;
}

}  // namespace

// The view's own strides with one of them 0 among nonzero ones, negative, small enough that rows
// overlap (overlapping), or a block stride whose pool spans more than int64 addresses. Overlap
// needs a dimension of more than one entry (and a way to overlap: one-element rows leave none
// where every stride is already the smallest that fits), the span two blocks; without them the
// strides get a zero or a negative one instead.
BadStrides bad_strides(const StridedView& v, std::uint64_t p) {
  std::int64_t CacheStrides::*const fields[] = {&CacheStrides::block, &CacheStrides::head,
                                                &CacheStrides::token};
  const char* const names[] = {".block", ".head", ".token"};
  const int sizes[] = {v.num_blocks, v.num_kv_heads, v.block_size};
  int kind = static_cast<int>(p % 4);
  int f = static_cast<int>((p >> 8) % 3);
  if (kind == 2) {
    std::vector<int> dims;
    for (int g = 0; g < 3; ++g) {
      if (sizes[g] > 1) dims.push_back(g);
    }
    if (!dims.empty()) {
      f = dims[(p >> 8) % dims.size()];
      BadStrides bad = overlapping(v, p, f);
      if (!bad.field.empty() || v.head_dim > 1) return bad;
    }
    kind = 0;
  }
  if (kind == 3 && v.num_blocks < 2) kind = 1;
  BadStrides bad{v.base, v.field + names[f]};
  if (kind == 3) {
    bad.strides.block = (std::int64_t{1} << 62) + static_cast<std::int64_t>((p >> 16) % 1000);
    bad.field = v.field + ".block";
  } else if (kind == 0) {
    bad.strides.*fields[f] = 0;
  } else {
    const std::int64_t values[] = {-1, -v.head_dim, std::numeric_limits<std::int64_t>::min(),
                                   -1 - static_cast<std::int64_t>((p >> 16) % 100000)};
    bad.strides.*fields[f] = values[(p >> 40) % 4];
  }
  return bad;
}

// The case's own kv_strides (the dense HND ones on the default layout), made bad (bad_strides);
// on a laid-out case the cache buffers keep their layout's sizes.
void plant_kv_strides(const FuzzCase& c, BuiltCase& b) {
  DecodeArgs& a = b.args;
  const CacheStrides base = a.kv_strides.is_default()
                                ? CacheStrides::hnd(a.num_kv_heads, a.block_size, a.head_dim)
                                : a.kv_strides;
  const BadStrides bad = bad_strides(
      {base, a.num_blocks, a.num_kv_heads, a.block_size, a.head_dim, "kv_strides"}, c.bad_param);
  if (bad.field.empty()) not_applicable(c);
  a.kv_strides = bad.strides;
  b.expected_argument = bad.field;
}

}  // namespace pagedattn::fuzz
