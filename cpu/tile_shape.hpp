// The register tiles of the item kernel per instruction set: tokens per scores tile, heads and
// head-dim vectors per values tile.
// Part of the item kernel (item_kernel_impl.hpp), included only by the per-instruction-set
// translation units: internal linkage keeps each set's copy, built with its own flags, apart.
#pragma once

#include "widen.hpp"

namespace pagedattn::detail::cpu {
namespace {

template <class Arch>
struct TileShape {
  static constexpr int W = static_cast<int>(fbatch<Arch>::size);
  static constexpr int kRegs = W == 16 ? 32 : 16;
  // Tokens per scores tile for R heads: R * TT accumulators, reduced W at a time by RowSums.
  static constexpr int tokens(int R) { return R >= W ? 1 : W / R; }
  // Heads per values tile (at most 4) and vectors of head_dim per values tile: R * DC
  // accumulators + DC value vectors + 1 weight stay in registers.
  static constexpr int value_heads(int R) { return R < 4 ? R : 4; }
  static constexpr int vectors(int R) { return kRegs == 32 ? (R <= 2 ? 8 : 4) : (R <= 2 ? 4 : 2); }
};

}  // namespace
}  // namespace pagedattn::detail::cpu
