// Plants a fuzz case's malformation (FuzzCase::bad, chosen by bad_param) in its built arguments
// or the host copies they point at, and records the error the API must raise for it.
#pragma once

#include <cstdint>
#include <string>

#include "build_case.hpp"
#include "fuzz_case.hpp"

namespace pagedattn::fuzz {

// Throws std::invalid_argument when the malformation does not apply to the case (a shrink step
// may leave it nothing to corrupt).
void plant_malformation(const FuzzCase& c, BuiltCase& b);

// For the files that plant one family each: the tree-mask malformations (plant_tree_mask.cpp),
// the per-token scale ones (plant_token_scales.cpp), bad kv_strides (plant_strides.cpp), and the
// refusal of a malformation the case gives nothing to corrupt.
void plant_in_tree_mask(const FuzzCase& c, BuiltCase& b);
void plant_in_token_scales(const FuzzCase& c, BuiltCase& b);
void plant_kv_strides(const FuzzCase& c, BuiltCase& b);
[[noreturn]] void not_applicable(const FuzzCase& c);

// A cache view whose strides a malformation breaks: its strides (explicit, not the default 0s),
// its shape (a row of head_dim elements: 1 for the per-token scales) and the field its errors
// name ("kv_strides", "token_scale_strides").
struct StridedView {
  CacheStrides base;
  int num_blocks, num_kv_heads, block_size;
  std::int64_t head_dim;
  std::string field;
};
// Strides require_cache_strides refuses and the field its error names (FIELD.block, .head or
// .token), `p` choosing how (plant_strides.cpp); an empty field where the choice found none.
struct BadStrides {
  CacheStrides strides;
  std::string field;
};
BadStrides bad_strides(const StridedView& view, std::uint64_t p);

}  // namespace pagedattn::fuzz
