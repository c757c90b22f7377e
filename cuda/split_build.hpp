// The split CTA's shape and the builds of the split kernel, as plain C++: the kernels
// (split_params.cuh) and the host's choice of kernel (kernel_choice.hpp) read the same
// definitions, and the choice compiles without nvcc.
#pragma once

namespace pagedattn::detail::cuda {

constexpr int kThreads = 128;  // every split CTA: 4 warps
constexpr int kWarps = kThreads / 32;
// A CTA holds the rows (query token, query head of the group) of one kv head, query token major:
// row r is token r / group, head r % group. The CUDA-core path holds up to 4 rows per warp, 16
// per CTA; the tensor-core path up to 4 M tiles of 16, 64 per CTA. More rows (large groups, or
// several query tokens) run in row chunks, one CTA each (SplitParams::row_chunks).
constexpr int kSimtRowsPerWarp = 4;
constexpr int kSimtRowsPerCta = kSimtRowsPerWarp * kWarps;
constexpr int kMmaRowsPerCta = 64;
// The tf32 path (f32 caches) holds one row tile: its split Q fragments take shared memory that
// the stages need (tf32_frags.cuh).
constexpr int kTf32RowsPerCta = 16;

// Which build of a cache dtype's split kernel a call runs (choose_split_kernel,
// kernel_choice.hpp).
struct SplitBuild {
  bool mma = false;    // the tensor cores (use_mma); otherwise the CUDA cores
  bool dense = false;  // fp8: the build for more CTAs per SM (kDenseMinCtas in split_kernel.cuh)
  bool wide = false;   // multi-token rows: the build whose warps fold several slices at once
  // A quantized cache with per-token scales on the tensor cores: the plain build, its pipeline
  // carrying each tile's scales (never dense or wide).
  bool token_scales = false;
  // The Hopper many-row kernel (hopper/many_rows.hpp): wgmma fed by a TMA producer warp, for
  // many query rows per kv head on sm_90. mma is set with it (the same rows per CTA).
  bool hopper = false;
  // The CTAs per SM that the plan gives work to (KernelChoice::ctas_per_sm). Where the build fits
  // more, the launch pads each CTA's shared memory so that no more than these share an SM: the
  // block scheduler may otherwise stack the plan's CTAs three to an SM while other SMs hold one,
  // and the stacked ones share one SM's bandwidth. 0: no cap.
  int resident_ctas = 0;
};

// What the current device offers of one build: how many of its CTAs fit on one SM (0: none, the
// kernel cannot run there) and the dynamic shared memory each CTA takes.
struct BuildFacts {
  int ctas_per_sm = 0;
  int smem_bytes = 0;
};

// The head dims with a wide build (mma_path.cuh: a warp folds the 2 or 4 token slices of a tile
// it takes with one softmax step). Above 128 the accumulators leave too few free registers for
// it.
constexpr bool wide_head_dim(int head_dim) { return head_dim >= 64 && head_dim <= 128; }

}  // namespace pagedattn::detail::cuda
