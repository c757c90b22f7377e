// The CUDA backend's launch and dispatch: the plan options for the device, sizing and carving
// the workspace, checked mode, and the two launches (split partials, then combine) on the
// caller's stream. No host synchronization (checked mode excepted: it must read the tables on
// the host); with a caller workspace, no allocation either.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <numeric>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "combine.cuh"
#include "cuda_error.hpp"
#include "device_info.hpp"
#include "pagedattn/detail/backends.hpp"
#include "pagedattn/validate.hpp"
#include "pagedattn/variants.hpp"
#include "split_params.cuh"
#include "workspace.hpp"

namespace pagedattn::detail::cuda {
namespace {

// Waves of split CTAs the planner aims for: items = SMs x (split CTAs resident per SM) x kWaves.
// Each CTA pays a fixed start (plan, Q and page-id loads, pipeline fill: ~3 dependent memory
// round trips), so items must stay large: on the H200 one wave beat two on the single long
// sequences (B = 1, 32768 tokens: 61% of the read ceiling against 48%) and matched it elsewhere
// but for D = 64 (docs/cuda.md). Whole waves matter: the planner keeps a few long sequences'
// items within them (choose_chunk_blocks). The dense fp8 build may plan two (split_kernel_for).
constexpr int kWaves = 1;
// A split covers at least this many tokens: amortizes each CTA's fixed start and keeps the
// combine cheap, while a single 4096-token sequence still spreads over 128 CTAs at 8 kv heads
// (on the H200, 256 beat 128 there, 15.7 against 17.8 us; 512 was slower again).
constexpr int kMinChunkTokens = 256;
constexpr int kMaxSplitsPerSeq = 1024;

// The tensor cores for every group size of a 16-bit cache, even MHA (one of the 16 M rows used):
// the MMAs cost little next to the copies, and on the H200 the CUDA-core path reached 92% of the
// read ceiling at group 1, 74% at group 2 and 56% at group 3, the tensor cores 96%, 93%, 88%.
// An fp8 cache takes them too when q is f16 or bf16 (exact in f16, the fragments' type) and the
// head dim is a multiple of 32 (fp8_frags.cuh); with an f32 q it stays on the CUDA cores.
bool use_mma(const DecodeArgs& a) {
  const bool q16 = a.q_dtype == DType::kF16 || a.q_dtype == DType::kBF16;
  if (is_fp8(a.k_dtype)) return q16 && a.head_dim % 32 == 0;
  return (a.k_dtype == DType::kF16 || a.k_dtype == DType::kBF16) && a.q_dtype == a.k_dtype;
}

// A CTA's rows (query token x query head of a kv head: split_params.cuh), and the CTAs per work
// item that hold every row of a sequence with max_q_len query tokens.
int rows_per_cta(const DecodeArgs& a) {
  if (!use_mma(a)) return kSimtRowsPerCta;
  // Tuning override for the GPU job's experiments: 16, 32 or 64 rows per tensor-core CTA.
  static const int rows = [] {
    const char* env = std::getenv("PAGEDATTN_CUDA_MMA_ROWS");
    const int v = env ? std::atoi(env) : 0;
    return v == 16 || v == 32 || v == 64 ? v : kMmaRowsPerCta;
  }();
  return rows;
}
int row_chunks(const DecodeArgs& a) {
  const std::int64_t rows = static_cast<std::int64_t>(a.group_size()) * a.q_len_bound();
  return static_cast<int>((rows + rows_per_cta(a) - 1) / rows_per_cta(a));
}

// Whether a tensor-core call takes the wide build (SplitBuild::wide): with several query tokens
// and more than 16 rows per CTA (query tokens x group), where a warp takes 2 or 4 slices of each
// tile. On the H200 (bf16, D = 128) it took q_len 8 at group 4 and q_len 4 at group 8 from 68-74%
// and 66% of the read ceiling to 79-91% and 81% (D = 80 and 96: 0.66 of the time); with 16 rows
// or fewer a warp has one slice per tile and the plain build runs. Head dims: wide_head_dim.
bool use_wide(const DecodeArgs& a, bool mma) {
  const std::int64_t rows = static_cast<std::int64_t>(a.group_size()) * a.q_len_bound();
  return mma && a.q_len_bound() > 1 && std::min<std::int64_t>(rows, rows_per_cta(a)) > 16 &&
         wide_head_dim(a.head_dim);
}

// CTAs of one build of this call's split kernel that fit on one SM (from the occupancy
// calculator, cached; 0 when none fits).
int ctas_per_sm_of(const DecodeArgs& a, SplitBuild b) {
  switch (a.k_dtype) {
    case DType::kF32:
      return split_ctas_per_sm_f32(a.head_dim);
    case DType::kF16:
      return split_ctas_per_sm_f16(a.head_dim, b);
    case DType::kBF16:
      return split_ctas_per_sm_bf16(a.head_dim, b);
    case DType::kFP8E4M3:
    case DType::kFP8E5M2:
      return split_ctas_per_sm_fp8(a.head_dim, a.k_dtype == DType::kFP8E5M2, b);
  }
  return 0;
}

// How this call's items fill the slots (SMs x CTAs per SM) of a build when the plan aims at
// `plan_waves` waves of them, with every sequence as long as its table allows: the even-waves
// rule (choose_chunk_blocks) cuts each (sequence, kv head) into plan_waves x slots / pairs equal
// items, at most one per kMinChunkTokens.
struct WaveFill {
  double waves;              // items / slots
  double fill;               // the share of the slot time of the whole waves that items use
  std::int64_t item_tokens;  // tokens per item
};
WaveFill wave_fill(const DecodeArgs& a, int ctas_per_sm, int plan_waves) {
  const std::int64_t slots =
      std::max<std::int64_t>(1, std::int64_t{current_device().sms} * ctas_per_sm / row_chunks(a));
  const std::int64_t pairs = std::max<std::int64_t>(1, std::int64_t{a.batch} * a.num_kv_heads);
  const std::int64_t min_chunk = blocks_for(kMinChunkTokens, a.block_size);
  const std::int64_t most =
      std::max<std::int64_t>(1, (a.max_blocks_per_seq + min_chunk - 1) / min_chunk);
  const std::int64_t per_pair =
      std::min(most, std::max<std::int64_t>(1, plan_waves * slots / pairs));
  const std::int64_t items = pairs * per_pair;
  const std::int64_t waves = (items + slots - 1) / slots;
  return {static_cast<double>(items) / static_cast<double>(slots),
          static_cast<double>(items) / static_cast<double>(waves * slots),
          std::int64_t{a.max_blocks_per_seq} * a.block_size / per_pair};
}

// The dense build is taken when its items make two waves or more (a partial last wave is then a
// small share of the time), or when its fill is at most kDenseFillSlack below the other build's.
// On the H200 (fp8 e4m3 and e5m2, D = 128) it was 3-17% faster where that holds: one sequence of
// 131072 tokens, 8 x 32768 (fill 0.97 with both builds), 128 x 1024 and 4096 and MHA 32 x 4096
// (2.6 waves), though 6% (2 us) slower on one sequence of 32768 tokens, where the combine of its
// 392 splits instead of 264 shows; and 3-35% slower where the rule does not hold: 32 x 4096 and
// 16384 (256 (sequence, kv head) items for 396 slots, fill 0.65 against 0.97), 64 x 4096 at 8 kv
// heads (1.3 waves). At D = 64 its four CTAs per SM took 32 x 16384 from 39% to 61% of the read
// ceiling (docs/performance.md).
constexpr double kDenseFillSlack = 0.1;
bool dense_pays(const DecodeArgs& a, int plain_ctas, int dense_ctas) {
  const WaveFill dense = wave_fill(a, dense_ctas, 1);
  return dense.waves >= 2.0 || dense.fill >= wave_fill(a, plain_ctas, 1).fill - kDenseFillSlack;
}

// Where one wave of the dense build leaves slots empty, a plan of two waves of it can fill them:
// taken when it fills at least kTwoWaveFill of them with items of at least kTwoWaveItemTokens
// tokens. On the H200, 32 x 16384 (fp8, D = 128: 768 items of 5461 tokens for 2 x 396 slots) went
// from 328.1 us on the plain build to 310.5 us (72% -> 76% of the read ceiling); 32 x 4096 (items
// of 1365 tokens) was 6% slower that way than on the plain build (docs/performance.md).
constexpr double kTwoWaveFill = 0.9;
constexpr std::int64_t kTwoWaveItemTokens = 4096;
bool two_dense_waves_pay(const DecodeArgs& a, int dense_ctas) {
  const WaveFill two = wave_fill(a, dense_ctas, 2);
  return two.fill >= kTwoWaveFill && two.item_tokens >= kTwoWaveItemTokens;
}

// The build of the split kernel this call runs, the CTAs per SM and the waves its plan aims at,
// decided by shapes only (a captured graph keeps them for any later context lengths). A kernel
// that does not fit on the device is an error naming head_dim (head dims 192 and 256 on sm_86 /
// sm_89, 99 KB of shared memory per block).
struct SplitKernel {
  SplitBuild build;
  int ctas_per_sm = 0;  // what the plan fills: at most what fits of the build
  int waves = kWaves;
};
SplitKernel split_kernel_for(const DecodeArgs& a) {
  SplitKernel k;
  k.build.mma = use_mma(a);
  k.build.wide = use_wide(a, k.build.mma);
  k.ctas_per_sm = ctas_per_sm_of(a, k.build);
  if (k.ctas_per_sm > 0 && k.build.mma && !k.build.wide && is_fp8(a.k_dtype)) {
    // fp8 on the tensor cores: the most CTAs per SM (the dense build's where it fits more than
    // the plain one, else the plain build's own) against one fewer (the plain build's, or the
    // plain build planned one CTA per SM short of what fits), by the rules above. Whether the
    // plain build fits as many CTAs as the dense one depends on the registers the compiler
    // gives it (fp8 e4m3 at D = 128: 168, three CTAs per SM, since the softmax took fewer).
    SplitBuild dense_build = k.build;
    dense_build.dense = true;
    const int dense = ctas_per_sm_of(a, dense_build);
    const bool dense_fits_more = dense > k.ctas_per_sm;
    const int most = dense_fits_more ? dense : k.ctas_per_sm;
    const int fewer = dense_fits_more ? k.ctas_per_sm : most - 1;
    const bool one_wave = fewer < 1 || dense_pays(a, fewer, most);
    const bool two_waves = !one_wave && two_dense_waves_pay(a, most);
    if (one_wave || two_waves) {
      k.build.dense = dense_fits_more;
      k.ctas_per_sm = most;
      if (two_waves) k.waves = 2;
    } else {
      k.ctas_per_sm = fewer;
    }
  }
  if (k.ctas_per_sm <= 0) {
    cudaGetLastError();  // the failed attribute call's error is reported here, not later
    const DeviceInfo& d = current_device();
    int optin = 0;
    cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, d.device);
    fail(ErrorCode::kUnsupported, "head_dim", a.head_dim,
         std::string("the CUDA kernel for this head dim and k_dtype ") + dtype_name(a.k_dtype) +
             " needs more shared memory per block than this GPU (compute capability " +
             std::to_string(d.cc_major) + "." + std::to_string(d.cc_minor) + ") allows, " +
             std::to_string(optin) + " bytes");
  }
  return k;
}

// The plan's options for this call's shapes and split kernel k (split_kernel_for): the
// parallelism is whole waves of the kernel's resident CTAs over the device's SMs, counted in work
// items (an item may take several CTAs).
PlanOptions plan_options(const DecodeArgs& a, const SplitKernel& k) {
  PlanOptions o;
  o.parallelism = std::max(1, current_device().sms * k.ctas_per_sm * k.waves / row_chunks(a));
  o.min_chunk_tokens = kMinChunkTokens;
  o.even_waves = true;
  o.max_splits_per_seq = kMaxSplitsPerSeq;
  o.window_left = a.window_left;
  return o;
}

// Upper bound on the plan's total splits for any context lengths within the table's capacity
// (core/split_plan.hpp): the grid covers it, so any later lengths fit the same launch.
std::int64_t max_total_splits(const DecodeArgs& a, const PlanOptions& o) {
  return max_plan_splits(a.batch, a.max_blocks_per_seq, a.num_kv_heads, a.block_size, o);
}

constexpr std::size_t align256(std::size_t n) { return (n + 255) & ~std::size_t(255); }

struct Layout {
  std::size_t offsets_bytes, ml_bytes, acc_bytes, total;
};

Layout workspace_layout(const DecodeArgs& a, std::int64_t splits) {
  Layout l;
  // Each (sequence, split) holds max_q_len * num_heads partial states.
  const std::size_t partials =
      static_cast<std::size_t>(splits) * a.num_heads * static_cast<std::size_t>(a.q_len_bound());
  l.offsets_bytes = align256(static_cast<std::size_t>(a.batch + 1) * sizeof(int));
  l.ml_bytes = align256(partials * 2 * sizeof(float));
  l.acc_bytes = align256(partials * a.head_dim * sizeof(float));
  l.total = l.offsets_bytes + l.ml_bytes + l.acc_bytes;
  return l;
}

// The cache layout as the kernels address it (SplitParams::block_units and the rest): rows are
// read in 16-byte pieces, so every stride must be a multiple of 16 bytes, and a row's position
// is a 32-bit count of row units (the largest unit dividing the block and token strides).
struct RowUnits {
  int block_units, token_units, row_unit;
  long long head_bytes;
};

RowUnits row_units(const DecodeArgs& a) {
  const CacheLayout l = a.cache_layout();
  const std::int64_t elem = static_cast<std::int64_t>(dtype_size(a.k_dtype));
  const std::pair<const char*, std::int64_t> strides[] = {{"kv_strides.block", l.block_stride},
                                                          {"kv_strides.head", l.head_stride},
                                                          {"kv_strides.token", l.token_stride}};
  for (const auto& [name, stride] : strides) {
    if (stride * elem % 16 != 0) {
      fail(ErrorCode::kInvalidArgument, name, stride,
           "must be a multiple of 16 bytes for the CUDA backend (" + std::to_string(stride * elem) +
               " bytes)");
    }
  }
  const std::int64_t unit = std::gcd(l.block_stride, l.token_stride) * elem;
  const std::int64_t block_units = l.block_stride * elem / unit;
  const std::int64_t token_units = l.token_stride * elem / unit;
  const long double last = static_cast<long double>(std::max(a.num_blocks - 1, 0)) * block_units +
                           static_cast<long double>(a.block_size - 1) * token_units;
  if (unit > INT32_MAX || block_units > INT32_MAX || last > INT32_MAX) {
    fail(ErrorCode::kUnsupported, "num_blocks", a.num_blocks,
         "the CUDA backend addresses a kv head's rows with 32-bit indices: num_blocks * "
         "kv_strides.block / gcd(kv_strides.block, kv_strides.token) must stay below 2^31");
  }
  return {static_cast<int>(block_units), static_cast<int>(token_units), static_cast<int>(unit),
          l.head_stride * elem};
}

void require_aligned(const char* name, const void* ptr) {
  if (reinterpret_cast<std::uintptr_t>(ptr) % 16 != 0) {
    fail(ErrorCode::kInvalidArgument, name, ptr, "must be 16-byte aligned for the CUDA backend");
  }
}

}  // namespace

bool available(std::string* why) { return device_usable(why); }

std::size_t workspace_size(const DecodeArgs& a) {
  return workspace_layout(a, max_total_splits(a, plan_options(a, split_kernel_for(a)))).total;
}

SplitChoice split_choice(const DecodeArgs& a) {
  const SplitKernel k = split_kernel_for(a);
  SplitBuild plain = k.build, dense = k.build;
  plain.dense = false;
  dense.dense = true;
  return {k.build.dense, k.waves, k.ctas_per_sm, ctas_per_sm_of(a, plain),
          ctas_per_sm_of(a, dense)};
}

namespace {

// check_launch, returning the layout in row units, which decode uses.
RowUnits checked_units(const DecodeArgs& a, const pagedattn::DecodeOptions& options) {
  require_aligned("q", a.q);
  require_aligned("k_cache", a.k_cache);
  require_aligned("v_cache", a.v_cache);
  if (options.workspace != nullptr) require_aligned("workspace", options.workspace);
  // Every row of q is read in 16-byte pieces (like q itself, 16-byte aligned), and out is stored
  // two elements at a time (store_out_pair), so its rows start at even elements (out itself
  // aligned to two elements). A single row's stride is never used.
  if (a.q_rows() > 1) {
    const std::int64_t q_bytes = a.q_stride() * static_cast<std::int64_t>(dtype_size(a.q_dtype));
    if (q_bytes % 16 != 0) {
      fail(ErrorCode::kInvalidArgument, "q_row_stride", a.q_row_stride,
           "must make each row of q start 16-byte aligned for the CUDA backend (" +
               std::to_string(q_bytes) + " bytes between rows)");
    }
    if (a.out_stride() % 2 != 0) {
      fail(ErrorCode::kInvalidArgument, "out_row_stride", a.out_row_stride,
           "must be even for the CUDA backend (rows of out are stored two elements at a time)");
    }
  }
  const std::size_t pair_bytes = 2 * dtype_size(a.out_dtype);
  if (reinterpret_cast<std::uintptr_t>(a.out) % pair_bytes != 0) {
    fail(ErrorCode::kInvalidArgument, "out", a.out,
         "must be aligned to two elements (" + std::to_string(pair_bytes) +
             " bytes) for the CUDA backend");
  }
  // The layout in 32-bit row units, or an error naming the field at fault.
  const RowUnits units = row_units(a);
  split_kernel_for(a);  // a kernel that does not fit on this device: an error naming head_dim
  if (options.cuda_checked) {
    // Read the device tables back and validate them exactly as the CPU path does.
    cudaStream_t stream = static_cast<cudaStream_t>(options.cuda_stream);
    std::vector<std::int32_t> lens(a.batch);
    const std::size_t table_elems =
        static_cast<std::size_t>(a.batch - 1) * a.table_stride() + a.max_blocks_per_seq;
    std::vector<std::int32_t> table(std::max<std::size_t>(table_elems, 1));
    check(cudaMemcpyAsync(lens.data(), a.context_lens, lens.size() * sizeof(std::int32_t),
                          cudaMemcpyDeviceToHost, stream),
          "cudaMemcpyAsync(context_lens)");
    if (table_elems > 0) {
      check(cudaMemcpyAsync(table.data(), a.block_table, table_elems * sizeof(std::int32_t),
                            cudaMemcpyDeviceToHost, stream),
            "cudaMemcpyAsync(block_table)");
    }
    // The variants' per-head values, where given.
    std::vector<float> slopes(a.alibi_slopes ? a.num_heads : 0), sinks(a.sinks ? a.num_heads : 0);
    if (a.alibi_slopes != nullptr) {
      check(cudaMemcpyAsync(slopes.data(), a.alibi_slopes, slopes.size() * sizeof(float),
                            cudaMemcpyDeviceToHost, stream),
            "cudaMemcpyAsync(alibi_slopes)");
    }
    if (a.sinks != nullptr) {
      check(cudaMemcpyAsync(sinks.data(), a.sinks, sinks.size() * sizeof(float),
                            cudaMemcpyDeviceToHost, stream),
            "cudaMemcpyAsync(sinks)");
    }
    std::vector<float> k_scales(a.k_scales ? a.num_kv_heads : 0),
        v_scales(a.v_scales ? a.num_kv_heads : 0);
    for (auto [dst, src, what] : {std::tuple{&k_scales, a.k_scales, "cudaMemcpyAsync(k_scales)"},
                                  std::tuple{&v_scales, a.v_scales, "cudaMemcpyAsync(v_scales)"}}) {
      if (src != nullptr) {
        check(cudaMemcpyAsync(dst->data(), src, dst->size() * sizeof(float), cudaMemcpyDeviceToHost,
                              stream),
              what);
      }
    }
    std::vector<std::int32_t> indptr(a.q_indptr ? a.batch + 1 : 0);
    if (a.q_indptr != nullptr) {
      check(cudaMemcpyAsync(indptr.data(), a.q_indptr, indptr.size() * sizeof(std::int32_t),
                            cudaMemcpyDeviceToHost, stream),
            "cudaMemcpyAsync(q_indptr)");
    }
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    validate_q_indptr(a, indptr.data());
    validate_tables(a, lens.data(), table.data(), a.q_indptr ? indptr.data() : nullptr);
    validate_variant_values(a, a.alibi_slopes ? slopes.data() : nullptr,
                            a.sinks ? sinks.data() : nullptr);
    validate_kv_scales(a, a.k_scales ? k_scales.data() : nullptr,
                       a.v_scales ? v_scales.data() : nullptr);
  }
  return units;
}

}  // namespace

void check_launch(const DecodeArgs& a, const pagedattn::DecodeOptions& options) {
  checked_units(a, options);
}

void decode(const DecodeArgs& a, const DecodeOptions& options) {
  if (a.batch == 0) return;
  const RowUnits units = checked_units(a, options);
  cudaStream_t stream = static_cast<cudaStream_t>(options.cuda_stream);
  // The grid and the workspace depend on shapes only, sized for the split plan; single_split
  // needs fewer splits, so the same grid and workspace serve it.
  const SplitKernel kernel = split_kernel_for(a);
  PlanOptions plan = plan_options(a, kernel);
  const std::int64_t splits = max_total_splits(a, plan);
  plan.single_split = options.single_split;
  const Layout lay = workspace_layout(a, splits);
  char* ws = nullptr;
  std::optional<StreamWorkspace> own;  // returned to the pool on this stream when decode ends
  if (options.workspace != nullptr) {
    if (options.workspace_bytes < lay.total) {
      fail(ErrorCode::kInvalidArgument, "workspace_bytes", options.workspace_bytes,
           "too small: cuda_workspace_size() = " + std::to_string(lay.total));
    }
    ws = static_cast<char*>(options.workspace);
  } else {
    own.emplace(lay.total, stream);
    ws = own->get();
  }

  SplitParams p{};
  p.q = a.q;
  p.q_dtype = static_cast<int>(a.q_dtype);
  p.q_stride = a.q_stride();
  p.out_stride = a.out_stride();
  p.k = a.k_cache;
  p.v = a.v_cache;
  p.table = a.block_table;
  p.lens = a.context_lens;
  p.batch = a.batch;
  p.num_heads = a.num_heads;
  p.num_kv_heads = a.num_kv_heads;
  p.group = a.group_size();
  p.block_size = a.block_size;
  p.num_blocks = a.num_blocks;
  p.max_blocks = a.max_blocks_per_seq;
  p.table_stride = a.table_stride();
  p.block_div = FastDiv::make(static_cast<std::uint32_t>(a.block_size));
  p.block_units = units.block_units;
  p.token_units = units.token_units;
  p.row_unit = units.row_unit;
  p.head_bytes = units.head_bytes;
  p.scale_log2 = a.effective_scale() * kLog2e;
  p.k_scale = a.k_scale;
  p.v_scale = a.v_scale;
  p.k_scales = a.k_scales;
  p.v_scales = a.v_scales;
  p.plan = plan;
  const float cap = a.logits_soft_cap;
  p.cap2 = cap > 0.f ? cap * kLog2e : 0.f;
  p.cap_k = cap > 0.f ? soft_cap_exp2_scale(p.cap2) : 0.f;
  p.alibi = a.alibi_slopes;
  p.logit_variant = cap > 0.f || a.alibi_slopes != nullptr;
  p.sinks = a.sinks;
  // P rounded to the fragments' dtype (relative error 2^-9 for bf16, 2^-12 for f16, which fp8
  // caches use) stays below the rounding of a bf16 out (2^-9 of |out|) and of an f16 out from an
  // f16 or fp8 cache, so hi alone serves there; an f32 out, or an f16 out from a bf16 cache,
  // takes hi + lo.
  const bool p_f16 = a.k_dtype == DType::kF16 || is_fp8(a.k_dtype);
  p.p_lo = !(a.out_dtype == DType::kBF16 || (a.out_dtype == DType::kF16 && p_f16));
  p.q_indptr = a.q_indptr;
  p.q_rows = a.q_rows();
  p.max_q = a.q_len_bound();
  p.rows_per_cta = rows_per_cta(a);
  p.row_chunks = row_chunks(a);
  p.split_offset = reinterpret_cast<int*>(ws);
  p.part_ml = reinterpret_cast<float*>(ws + lay.offsets_bytes);
  p.part_acc = reinterpret_cast<float*>(ws + lay.offsets_bytes + lay.ml_bytes);
  p.out = a.out;
  p.out_dtype = static_cast<int>(a.out_dtype);
  p.lse = a.lse;
  p.pdl = current_device().pdl;

  const SplitBuild build = kernel.build;
  if (splits > 0) {
    const std::int64_t grid64 = splits * a.num_kv_heads * p.row_chunks;
    if (grid64 > INT32_MAX) {
      fail(ErrorCode::kUnsupported, "batch", a.batch, "too many work items for one launch");
    }
    const int grid = static_cast<int>(grid64);
    bool launched = false;
    switch (a.k_dtype) {
      case DType::kF32:
        launched = launch_split_f32(p, a.head_dim, grid, stream);
        break;
      case DType::kF16:
        launched = launch_split_f16(p, a.head_dim, build, grid, stream);
        break;
      case DType::kFP8E4M3:
      case DType::kFP8E5M2:
        launched =
            launch_split_fp8(p, a.head_dim, a.k_dtype == DType::kFP8E5M2, build, grid, stream);
        break;
      case DType::kBF16:
        launched = launch_split_bf16(p, a.head_dim, build, grid, stream);
        break;
    }
    if (!launched) {
      fail(ErrorCode::kUnsupported, "head_dim", a.head_dim,
           std::string("no CUDA kernel built for this head dim and k_dtype ") +
               dtype_name(a.k_dtype));
    }
    check(cudaGetLastError(), "split_kernel launch");
  } else {
    // No table entries at all: every context is 0; the combine sees no splits.
    check(cudaMemsetAsync(p.split_offset, 0, (a.batch + 1) * sizeof(int), stream),
          "cudaMemsetAsync");
  }

  CombineParams c{};
  c.part_ml = p.part_ml;
  c.part_acc = p.part_acc;
  c.split_offset = p.split_offset;
  c.q_indptr = p.q_indptr;
  c.q_rows = p.q_rows;
  c.max_q = p.max_q;
  c.out = a.out;
  c.out_stride = a.out_stride();
  c.lse = a.lse;
  c.sinks = a.sinks;
  c.batch = a.batch;
  c.num_heads = a.num_heads;
  c.head_dim = a.head_dim;
  // With splits, on sm_90, the combine is a programmatic dependent launch: its CTAs are scheduled
  // while the split grid drains and wait on the device (griddepcontrol.wait) instead of paying a
  // launch after it.
  launch_combine(c, a.out_dtype, splits > 0 && p.pdl, stream);
}

}  // namespace pagedattn::detail::cuda

namespace pagedattn {

std::size_t cuda_workspace_size(const DecodeArgs& args) {
  validate_shapes(args);
  std::string why;
  if (!detail::cuda::available(&why)) {
    fail(ErrorCode::kBackendUnavailable, "backend", "cuda", "unavailable: " + why);
  }
  return detail::cuda::workspace_size(args);
}

}  // namespace pagedattn
