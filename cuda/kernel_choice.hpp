// The choice of split kernel for a call, as plain C++ with no CUDA runtime call: from the call's
// shapes and what the device offers of each candidate build (its SM count, and the CTAs per SM
// and shared memory of each build, measured by the caller), which build runs, how a CTA's rows
// are cut, and the CTAs per SM and waves the split plan aims at. Shapes only, never context
// lengths: a captured graph keeps the choice for any later lengths. The numbers behind the rules
// are in docs/cuda.md.
#pragma once

#include <cstdint>

#include "pagedattn/dtype.hpp"
#include "pagedattn/pagedattn.hpp"
#include "pagedattn/split_plan.hpp"
#include "split_build.hpp"

namespace pagedattn::detail::cuda {

// The fields of a call (DecodeArgs) the choice reads.
struct CallShape {
  DType q_dtype = DType::kBF16;
  DType k_dtype = DType::kBF16;
  int head_dim = 128;
  int group = 1;  // query heads per kv head
  int q_len = 1;  // query tokens per sequence, at most (DecodeArgs::q_len_bound)
  int batch = 1;
  int num_kv_heads = 1;
  int block_size = 16;
  int max_blocks = 1;  // the block table's capacity per sequence
  DType out_dtype = DType::kBF16;
  bool logit_variant = false;  // a soft-cap or ALiBi slopes
  bool token_scales = false;   // per-token K and V scales (DecodeArgs::k_token_scales)
};
CallShape call_shape(const DecodeArgs& a);

// What the device offers: its SMs, and the facts of the two candidate builds, `plain` (the build
// candidate_build names) and `dense` (the same with dense set; read only where weighs_dense).
struct KernelFacts {
  int sms = 0;
  BuildFacts plain;
  BuildFacts dense;
  BuildFacts many_rows;  // the Hopper many-row kernel's (read only where many_rows_serves)
  // The CUDA-core build's, read only where the plain build is f32's tf32 build and does not fit
  // (simt_stands_in).
  BuildFacts simt;
};

// The split kernel a call runs and what its plan aims at.
struct KernelChoice {
  SplitBuild build;
  int rows_per_cta = 0;  // rows_per_cta(s), or kSimtRowsPerCta where simt_stands_in
  int row_chunks = 0;    // CTAs per work item: ceil(group x q_len / rows_per_cta)
  int ctas_per_sm = 0;   // what the plan fills, at most what fits of the build; 0: none fits
  int waves = 1;         // waves of those CTAs the plan aims at
  int smem_bytes = 0;    // the build's dynamic shared memory per CTA
  int parallelism = 1;   // work items of the plan: SMs x ctas_per_sm x waves / row_chunks
};

// Waves of split CTAs the planner aims for. Each CTA pays a fixed start (plan, Q and page-id
// loads, pipeline fill), so items are kept large: one wave, and whole ones
// (choose_chunk_blocks). The dense 8-bit build may plan two (two_dense_waves_pay).
constexpr int kWaves = 1;
// A split covers at least this many tokens: amortizes each CTA's fixed start and keeps the
// combine cheap, while a single 4096-token sequence still spreads over 128 CTAs at 8 kv heads.
constexpr int kMinChunkTokens = 256;
constexpr int kMaxSplitsPerSeq = 1024;  // bounds the partials buffer

// The tensor cores for every group size of a 16-bit cache with q in the cache dtype, even MHA
// (the MMAs cost little next to the copies); for a quantized cache (fp8, int8) when q is f16 or
// bf16 (exact in f16, the fragments' type) and the head dim is a multiple of 32 (fp8_frags.cuh),
// per-token scales included (SplitBuild::token_scales); for an f32 cache with an f32 q (3xTF32,
// tf32_frags.cuh) at head dims 64, 96 and 128 with at least kTf32MinRows query rows per kv head.
// Otherwise the CUDA cores: with one or two rows they read an f32 cache faster than the three MMAs
// per product run (docs/cuda.md).
constexpr int kTf32MinRows = 3;
bool use_mma(const CallShape& s);
// Whether P, rounded to the tensor-core fragments' dtype (relative error 2^-9 for bf16, 2^-12 for
// f16, which quantized caches use), needs a lo part next to it (SplitParams::p_lo): not for a bf16
// out (whose own rounding is 2^-9 of |out|) nor for an f16 out from an f16 or quantized cache; an
// f32 out, or an f16 out from a bf16 cache, does.
bool p_needs_lo(DType k_dtype, DType out_dtype);
// The calls the Hopper many-row kernel serves (SplitBuild::hopper): a 16-bit cache with q in its
// dtype, head dim 128, P without a lo part, no soft-cap or ALiBi (it runs them through the variant
// policy's hooks, but measured 14% slower than the tensor-core path at 64 rows per kv head),
// block sizes 16 to 256 in powers of two (whole TMA boxes per tile), and at least
// kManyRowsMinRows query rows per kv head (below that the tensor-core path is as fast).
constexpr int kManyRowsMinRows = 32;
bool many_rows_serves(const CallShape& s);
// kMmaRowsPerCta on the tensor cores (kTf32RowsPerCta for f32), else kSimtRowsPerCta.
int rows_per_cta(const CallShape& s);
// Where f32's tf32 build needs more shared memory than the device has (sm_86 and sm_89: 99 KB
// per block) and the CUDA-core build fits, that one runs instead.
bool simt_stands_in(const CallShape& s, const KernelFacts& f);
// CTAs per work item for the call's rows (group x q_len) at rows_per_cta rows each.
int chunks_of_rows(const CallShape& s, int rows_per_cta);
int row_chunks(const CallShape& s);  // chunks_of_rows at rows_per_cta(s)
// The wide build: tensor cores, several query tokens and more than 16 rows per CTA, where a warp
// takes 2 or 4 slices of each tile and folds them at once; head dims with one (wide_head_dim);
// not with per-token scales, which only the plain build carries.
bool use_wide(const CallShape& s);
// The build before the dense weighing: mma and wide from the shapes, dense unset.
SplitBuild candidate_build(const CallShape& s);
// Whether the dense build is weighed against the plain one: a quantized cache on the plain
// tensor-core build, where that fits at all. Only then does the caller need KernelFacts::dense.
// With per-token scales there is no dense build, but the plain one is still weighed against
// one CTA per SM fewer (choose_split_kernel).
bool weighs_dense(const CallShape& s, SplitBuild candidate, const BuildFacts& plain);

// How this call's items fill the slots (SMs x CTAs per SM / row chunks) of a build when the plan
// aims at `plan_waves` waves, with every sequence as long as its table allows: the even-waves
// rule (choose_chunk_blocks) cuts each (sequence, kv head) into plan_waves x slots / pairs equal
// items, at most one per kMinChunkTokens.
struct WaveFill {
  double waves;              // items / slots
  double fill;               // the share of the slot time of the whole waves that items use
  std::int64_t item_tokens;  // tokens per item
};
WaveFill wave_fill(const CallShape& s, int sms, int ctas_per_sm, int plan_waves);
// One wave of `most` CTAs per SM is taken over `fewer` when its items make two waves or more (a
// partial last wave is then a small share of the time), or when its fill is at most
// kDenseFillSlack below that of `fewer`.
constexpr double kDenseFillSlack = 0.1;
bool dense_pays(const CallShape& s, int sms, int fewer, int most);
// Where one wave of `most` leaves slots empty, a plan of two waves of it fills them: taken when it
// fills at least kTwoWaveFill of them with items of at least kTwoWaveItemTokens tokens (shorter
// items pay their fixed start twice over).
constexpr double kTwoWaveFill = 0.9;
constexpr std::int64_t kTwoWaveItemTokens = 4096;
bool two_dense_waves_pay(const CallShape& s, int sms, int most);

// The choice. A quantized cache on the tensor cores weighs the most CTAs per SM (the dense build's
// where it fits more than the plain one, else the plain build's own) against one fewer (the plain
// build's, or the plain build planned one CTA per SM short of what fits): the most where
// dense_pays, or over two waves where two_dense_waves_pay, else one fewer. ctas_per_sm is 0 when
// the plain build fits nowhere (the caller reports it).
KernelChoice choose_split_kernel(const CallShape& s, const KernelFacts& f);

// The split plan's options for a choice: its parallelism in work items, kMinChunkTokens, the
// even-waves rule, kMaxSplitsPerSeq and the call's window.
PlanOptions plan_options(const KernelChoice& k, int window_left);

}  // namespace pagedattn::detail::cuda
