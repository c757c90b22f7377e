// The CPU backend's MLA work-item kernel, as the backend sees it (mla_cpu.cpp plans and combines;
// mla_kernel_impl.hpp holds the kernel). A work item is one split of one sequence.
#pragma once

#include <cstdint>

#include "pagedattn/cache_layout.hpp"
#include "pagedattn/dtype.hpp"
#include "pagedattn/mla.hpp"
#include "pagedattn/split_plan.hpp"

namespace pagedattn::detail::cpu {

// What an MLA work item reads (mla_cpu.cpp fills it from validated arguments).
struct MlaItemContext {
  const float* q;  // [rows][num_heads][width]: q_nope then q_pe, widened and times the scale
  int num_heads, rank, width, block_size;
  const void* c_cache;
  const void* kpe_cache;
  DType kv_dtype;
  float kv_scale;
  MlaPartStrides c, kpe;  // in elements, the defaults resolved
  BlockTableView table;
  const std::int32_t* context_lens;
  const std::int32_t* q_indptr;  // null: one query token per sequence
};

// Per-thread buffers: block_size * width floats for a block's latent rows, and
// kMlaRowTile * block_size floats for scores.
struct MlaScratch {
  float* rows;
  float* scores;
};

// Query rows a pass over a block's latent rows takes at once.
constexpr int kMlaRowTile = 4;

// The MLA item kernel: fresh states m, l [rows] and acc [rows][rank] of the item's sequence's
// n_q * num_heads rows (query token major) on entry, folded over the item's blocks on return.
using MlaKernelFn = void (*)(const MlaItemContext&, const WorkItem&, float* m, float* l, float* acc,
                             MlaScratch scratch);

// A block's first n latent rows as f32 rows of width values (c, then k_pe), times kv_scale.
// Compiled once, with the baseline flags (mla_cpu.cpp): it converts, the kernels compute.
void widen_latent_rows(const MlaItemContext& c, int id, int n, float* rows);

// The kernel of one instruction set: defined in mla_kernel_impl.hpp and instantiated only in
// that set's isa_*.cpp (compiled with its flags).
template <class Arch>
void mla_item(const MlaItemContext& c, const WorkItem& it, float* m, float* l, float* acc,
              MlaScratch scratch);

}  // namespace pagedattn::detail::cpu
