// Software prefetch of the next (block, kv head) units' K and V rows, paced over the compute of
// the current one.
// Part of the item kernel (item_kernel_impl.hpp), included only by the per-instruction-set
// translation units: internal linkage keeps each set's copy, built with its own flags, apart.
#pragma once

#include <algorithm>
#include <cstdint>

namespace pagedattn::detail::cpu {
namespace {

// (block, kv head) units ahead to prefetch (see run_item), by the unit's K and V bytes.
// Fragmented tables defeat the hardware prefetcher at every block boundary; two units ahead
// covers the memory latency at one unit's compute time. Units of more than 8 KB (f32 at head dim
// 128 and block 16: 16 KB) go one ahead: two of them and the current one fill a 48 KB L1 and
// would evict each other before use (docs/cpu.md has the measurements).
constexpr std::int64_t kTwoAheadMaxUnitBytes = 8 * 1024;
inline int prefetch_units(std::int64_t unit_bytes) {
  return unit_bytes > kTwoAheadMaxUnitBytes ? 1 : 2;
}

// Prefetches one later block (its K and V rows) a few cache lines at a time, interleaved with
// the compute of the current block. Issuing a whole block's lines at once fills the core's miss
// buffers, and the burst then stalls the kernel until memory catches up: compute and memory
// time add up instead of overlapping. It changes its own state, so GCC keeps the calls. Forced
// inline: in a large translation unit (the AVX-512 BF16 kernel with the fp8 table path) GCC may
// leave advance() out of line, and the call in the block loop then slows a decode that streams
// from memory (docs/cpu.md).
struct PacedPrefetch {
  const char* k = nullptr;
  const char* v = nullptr;
  std::int64_t stride = 0;                     // bytes between rows (0: one contiguous span)
  std::int64_t row_off = 0;                    // the current row's offset
  std::int64_t done = 0, total = 0, step = 0;  // in lines
  int row_lines = 0, col = 0;

  // `rows` rows of row_bytes, stride_bytes apart. Rows close together (the HND layout: a kv
  // head's slots are adjacent) are one span; rows far apart (NHD: the other kv heads sit between
  // them) are fetched row by row, so the lines between them are not fetched.
  void start(const void* kb, const void* vb, int rows, std::int64_t row_bytes,
             std::int64_t stride_bytes, int pieces) {
    k = static_cast<const char*>(kb);
    v = static_cast<const char*>(vb);
    row_off = 0;
    done = 0;
    col = 0;
    if (rows <= 0) {
      total = 0;
      return;
    }
    if (stride_bytes <= row_bytes + 64) {
      stride = 0;
      row_lines = static_cast<int>(((rows - 1) * stride_bytes + row_bytes + 63) / 64);
      total = row_lines;
    } else {
      stride = stride_bytes;
      // A row that does not start on a line touches one line more.
      row_lines = static_cast<int>((row_bytes + 63) / 64) + (stride_bytes % 64 != 0);
      total = static_cast<std::int64_t>(rows) * row_lines;
    }
    step = std::max<std::int64_t>(1, (total + pieces - 1) / pieces);
  }
  // The next piece (step lines of K and of V).
  __attribute__((always_inline)) void piece() { advance(std::min(done + step, total)); }
  // Whatever is left.
  __attribute__((always_inline)) void rest() { advance(total); }

 private:
  __attribute__((always_inline)) void advance(std::int64_t end) {
    for (; done < end; ++done) {
      const std::int64_t at = row_off + static_cast<std::int64_t>(col) * 64;
      __builtin_prefetch(k + at, 0, 3);
      __builtin_prefetch(v + at, 0, 3);
      if (++col == row_lines) {
        col = 0;
        row_off += stride;
      }
    }
  }
};

// Pieces one unit's prefetch is cut into: about one per scores or values tile of a 16-token
// block, so the lines go out spread over the unit's compute.
constexpr int kPrefetchPieces = 16;

}  // namespace
}  // namespace pagedattn::detail::cpu
