// The CUDA backend's MLA decode (pagedattn/mla.hpp): what it refuses before any launch, its split
// plan and workspace (from shapes only, so a captured graph replays with new context lengths),
// then the MLA kernel (mla_kernel.cuh) and the combine (combine.cuh) on the caller's stream.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>

#include "../combine.cuh"
#include "../cuda_error.hpp"
#include "../decode_steps.hpp"
#include "../device_info.hpp"
#include "../launch.cuh"
#include "../workspace.hpp"
#include "mla_kernel.cuh"
#include "pagedattn/mla_validate.hpp"
#if defined(PAGEDATTN_MANY_ROWS_KERNEL)
#include "../hopper/mla_many_rows.hpp"
#endif

namespace pagedattn::detail::cuda {
namespace {

using mla::kRows;
using mla::kTileKeys;
using mla::MlaParams;

// Tokens per split in a batch-invariant decode: fixed, so a sequence's splits never depend on
// the batch.
constexpr int kInvariantChunk = 1024;
// The fewest tokens a split is given when splitting to fill the device.
constexpr int kMinChunk = 256;

struct MlaPlan {
  bool many_rows = false;  // the sm_90 kernel (hopper/mla_many_rows.hpp), else mla_kernel.cuh's
  int cta_rows = kRows;
  int max_q = 1, row_chunks = 1, splits = 1, chunk = kTileKeys;
  WorkspaceLayout workspace;
};

// Whether PAGEDATTN_MLA_KERNEL=mma asks for the 16-row kernel wherever the sm_90 one would serve
// (to compare the two).
bool sixteen_rows_forced() {
  static const bool forced = [] {
    const char* env = std::getenv("PAGEDATTN_MLA_KERNEL");
    return env != nullptr && std::string(env) == "mma";
  }();
  return forced;
}

// f32 outputs, and f16 outputs of bf16 inputs, need f32-level weights: P as hi + lo parts.
bool needs_split_p(const MlaDecodeArgs& a) {
  return a.out_dtype == DType::kF32 || (a.out_dtype == DType::kF16 && a.q_dtype == DType::kBF16);
}

bool takes_many_rows(const MlaDecodeArgs& a) {
#if defined(PAGEDATTN_MANY_ROWS_KERNEL)
  return !sixteen_rows_forced() && mla_many_rows_serves(a, needs_split_p(a));
#else
  (void)a;
  return false;
#endif
}

std::size_t align256(std::size_t n) { return (n + 255) / 256 * 256; }
int ceil_div(std::int64_t a, std::int64_t b) { return static_cast<int>((a + b - 1) / b); }

// Every sequence gets the same splits of `chunk` tokens over the table row's capacity. The
// default fills one wave: one CTA is resident per SM, and a second, partial wave would leave
// most SMs idle while it runs.
MlaPlan plan_mla(const MlaDecodeArgs& a, const DecodeOptions& o) {
  MlaPlan plan;
  plan.many_rows = takes_many_rows(a);
#if defined(PAGEDATTN_MANY_ROWS_KERNEL)
  if (plan.many_rows) plan.cta_rows = kMlaManyRows;
#endif
  plan.max_q = a.q_indptr != nullptr ? std::max(1, a.max_q_len) : 1;
  plan.row_chunks = ceil_div(static_cast<std::int64_t>(plan.max_q) * a.num_heads, plan.cta_rows);
  const std::int64_t capacity =
      std::max<std::int64_t>(1, static_cast<std::int64_t>(a.max_blocks_per_seq) * a.block_size);
  std::int64_t chunk = 0;
  if (o.single_split) {
    chunk = capacity;
  } else if (o.batch_invariant) {
    chunk = kInvariantChunk;
  } else {
    const std::int64_t units = std::max<std::int64_t>(1, std::int64_t{a.batch} * plan.row_chunks);
    const std::int64_t want = std::max<std::int64_t>(1, current_device().sms / units);
    const std::int64_t most = std::max<std::int64_t>(1, capacity / kMinChunk);
    chunk = (capacity + std::min(want, most) - 1) / std::min(want, most);
  }
  plan.chunk = ceil_div(chunk, kTileKeys) * kTileKeys;
  plan.splits = ceil_div(capacity, plan.chunk);
  const std::int64_t partials =
      std::int64_t{a.batch} * plan.splits * plan.max_q * static_cast<std::int64_t>(a.num_heads);
  WorkspaceLayout& w = plan.workspace;
  w.offsets_bytes = align256((static_cast<std::size_t>(a.batch) + 1) * sizeof(int));
  w.ml_bytes = align256(static_cast<std::size_t>(partials) * 2 * sizeof(float));
  w.acc_bytes = align256(static_cast<std::size_t>(partials) * a.kv_lora_rank * sizeof(float));
  w.total = w.offsets_bytes + w.ml_bytes + w.acc_bytes;
  return plan;
}

void require_aligned(const char* name, const void* ptr, std::int64_t block, std::int64_t token,
                     std::size_t elem) {
  const auto at = reinterpret_cast<std::uintptr_t>(ptr);
  if (at % 16 != 0 || (block * static_cast<std::int64_t>(elem)) % 16 != 0 ||
      (token * static_cast<std::int64_t>(elem)) % 16 != 0) {
    fail(ErrorCode::kUnsupported, name,
         std::to_string(block) + "/" + std::to_string(token) + " elements (block/token)",
         "the CUDA backend reads latent rows in 16-byte pieces: the part's address and strides "
         "must be multiples of 16 bytes");
  }
}

// Allows the kernel the shared memory of the widest latent row the device can hold, once per
// device and instantiation: every call's own need was checked against that limit already.
template <typename T, typename KV>
void allow_kernel_smem() {
  constexpr int kMaxDevices = 64;
  static std::atomic<bool> done[kMaxDevices] = {};
  const DeviceInfo& d = current_device();
  if (d.device < kMaxDevices && done[d.device].load(std::memory_order_acquire)) return;
  const int widest = mla::smem_layout(mla::kMaxRank + mla::kMaxRope, sizeof(KV) == 1).total;
  check(cudaFuncSetAttribute(mla::mla_kernel<T, KV>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             std::min(widest, d.smem.optin_per_cta)),
        "cudaFuncSetAttribute(mla_kernel)");
  if (d.device < kMaxDevices) done[d.device].store(true, std::memory_order_release);
}

template <typename T, typename KV>
void launch_typed(const MlaParams& p, int grid, int smem, cudaStream_t stream) {
  allow_kernel_smem<T, KV>();
  check(launch_kernel(mla::mla_kernel<T, KV>, grid, mla::kThreads, smem, false, stream, p),
        "mla_kernel launch");
}

template <typename T>
void launch_for_cache(const MlaParams& p, DType kv_dtype, int grid, int smem, cudaStream_t stream) {
  switch (kv_dtype) {
    case DType::kFP8E4M3:
      return launch_typed<T, fp8_e4m3_t>(p, grid, smem, stream);
    case DType::kFP8E5M2:
      return launch_typed<T, fp8_e5m2_t>(p, grid, smem, stream);
    default:
      return launch_typed<T, T>(p, grid, smem, stream);
  }
}

bool a16(const void* ptr) { return reinterpret_cast<std::uintptr_t>(ptr) % 16 == 0; }

MlaParams mla_params(const MlaDecodeArgs& a, const MlaPlan& plan, char* ws) {
  MlaParams p{};
  p.q_nope = a.q_nope;
  p.q_pe = a.q_pe;
  p.q_nope_row = a.q_nope_row();
  p.q_pe_row = a.q_pe_row();
  p.q_nope_head = a.q_nope_head();
  p.q_pe_head = a.q_pe_head();
  p.c = a.c_cache;
  p.kpe = a.kpe_cache;
  p.c_block = a.c_layout().block;
  p.c_token = a.c_layout().token;
  p.kpe_block = a.kpe_layout().block;
  p.kpe_token = a.kpe_layout().token;
  p.rank = a.kv_lora_rank;
  p.rope = a.rope_dim;
  p.heads = a.num_heads;
  p.block_size = a.block_size;
  p.num_blocks = a.num_blocks;
  p.table_stride = a.table_stride();
  p.max_blocks = a.max_blocks_per_seq;
  p.table = a.block_table;
  p.lens = a.context_lens;
  p.q_indptr = a.q_indptr;
  p.q_rows = a.q_rows();
  p.max_q = plan.max_q;
  p.cta_rows = plan.cta_rows;
  p.q_vec16 = a16(a.q_nope) && a16(a.q_pe) && p.q_nope_row % 8 == 0 && p.q_nope_head % 8 == 0 &&
              p.q_pe_row % 8 == 0 && p.q_pe_head % 8 == 0;
  const float kv_scale = is_fp8(a.kv_dtype) ? a.kv_scale : 1.f;
  p.scale_log2 = a.effective_scale() * kv_scale * 1.4426950408889634f;
  p.out_scale = kv_scale;
  // 16-bit weights round to 2^-9 (bf16) or 2^-12 (f16) of each weight: inside a bf16 output's
  // tolerance, and an f16 output's with f16 weights; the others take them as hi + lo.
  p.split_p = needs_split_p(a);
  p.splits = plan.splits;
  p.chunk = plan.chunk;
  p.row_chunks = plan.row_chunks;
  p.split_offset = reinterpret_cast<int*>(ws);
  p.part_ml = reinterpret_cast<float*>(ws + plan.workspace.offsets_bytes);
  p.part_acc =
      reinterpret_cast<float*>(ws + plan.workspace.offsets_bytes + plan.workspace.ml_bytes);
  return p;
}

CombineParams mla_combine_params(const MlaDecodeArgs& a, const MlaParams& p) {
  CombineParams c{};
  c.part_ml = p.part_ml;
  c.part_acc = p.part_acc;
  c.split_offset = p.split_offset;
  c.q_indptr = a.q_indptr;
  c.q_rows = p.q_rows;
  c.max_q = p.max_q;
  c.out = a.out;
  c.out_stride = a.out_row();
  c.lse = a.lse;
  c.batch = a.batch;
  c.num_heads = a.num_heads;
  c.head_dim = a.kv_lora_rank;
  c.merge_single_splits = true;  // the MLA kernel writes partial states only
  return c;
}

}  // namespace

void check_mla_launch(const MlaDecodeArgs& a, const pagedattn::DecodeOptions& options) {
  if (a.q_dtype != DType::kBF16 && a.q_dtype != DType::kF16) {
    fail(ErrorCode::kUnsupported, "q_dtype", dtype_name(a.q_dtype),
         "the CUDA backend's MLA kernel takes bf16 or f16 queries (the CPU backend runs f32)");
  }
  if (!is_fp8(a.kv_dtype) && a.kv_dtype != a.q_dtype) {
    fail(ErrorCode::kUnsupported, "kv_dtype", dtype_name(a.kv_dtype),
         std::string("the CUDA backend's MLA kernel takes an fp8 cache or one of q's dtype (") +
             dtype_name(a.q_dtype) + ")");
  }
  if (a.kv_lora_rank % 128 != 0 || a.kv_lora_rank > mla::kMaxRank) {
    fail(ErrorCode::kUnsupported, "kv_lora_rank", a.kv_lora_rank,
         "the CUDA backend's MLA kernel takes a multiple of 128 up to " +
             std::to_string(mla::kMaxRank));
  }
  if (a.rope_dim > mla::kMaxRope) {
    fail(ErrorCode::kUnsupported, "rope_dim", a.rope_dim,
         "the CUDA backend's MLA kernel takes at most " + std::to_string(mla::kMaxRope));
  }
  const std::size_t esz = dtype_size(a.kv_dtype);
  require_aligned("c_strides", a.c_cache, a.c_layout().block, a.c_layout().token, esz);
  require_aligned("kpe_strides", a.kpe_cache, a.kpe_layout().block, a.kpe_layout().token, esz);
  const int smem = mla::smem_layout(a.row_width(), esz == 1).total;
  if (smem > current_device().smem.optin_per_cta) {
    fail(ErrorCode::kUnsupported, "kv_lora_rank", a.kv_lora_rank,
         "the MLA kernel needs " + std::to_string(smem) +
             " bytes of shared memory per CTA; this device allows " +
             std::to_string(current_device().smem.optin_per_cta));
  }
  if (options.workspace != nullptr && reinterpret_cast<std::uintptr_t>(options.workspace) % 16) {
    fail(ErrorCode::kInvalidArgument, "workspace", options.workspace,
         "must be 16-byte aligned for the CUDA backend");
  }
}

void mla_decode(const MlaDecodeArgs& a, const DecodeOptions& options) {
  cudaStream_t stream = static_cast<cudaStream_t>(options.cuda_stream);
  if (options.cuda_checked) check_device_tables(mla_table_view(a), stream);
  const MlaPlan plan = plan_mla(a, options);
  const std::int64_t grid64 = std::int64_t{a.batch} * plan.splits * plan.row_chunks;
  if (grid64 > INT32_MAX) {
    fail(ErrorCode::kUnsupported, "batch", a.batch, "too many work items for one launch");
  }
  std::optional<StreamWorkspace> own;  // returned to the pool on this stream when decode ends
  char* ws =
      call_workspace(options, plan.workspace.total, stream, &own, "cuda_mla_workspace_size()");
  const MlaParams p = mla_params(a, plan, ws);
#if defined(PAGEDATTN_MANY_ROWS_KERNEL)
  if (plan.many_rows) {
    launch_mla_many_rows(p, a.q_dtype, a.kv_dtype, static_cast<int>(grid64), stream);
    launch_combine(mla_combine_params(a, p), GeneralVariant{}, a.out_dtype, false, stream);
    return;
  }
#endif
  const int smem = mla::smem_layout(a.row_width(), is_fp8(a.kv_dtype)).total;
  if (a.q_dtype == DType::kBF16) {
    launch_for_cache<__nv_bfloat16>(p, a.kv_dtype, static_cast<int>(grid64), smem, stream);
  } else {
    launch_for_cache<__half>(p, a.kv_dtype, static_cast<int>(grid64), smem, stream);
  }
  launch_combine(mla_combine_params(a, p), GeneralVariant{}, a.out_dtype, false, stream);
}

std::size_t mla_workspace_size(const MlaDecodeArgs& a, const DecodeOptions& options) {
  return plan_mla(a, options).workspace.total;
}

}  // namespace pagedattn::detail::cuda

namespace pagedattn {

std::size_t cuda_mla_workspace_size(const MlaDecodeArgs& args, const DecodeOptions& options) {
  validate_mla_shapes(args);
  std::string why;
  if (!detail::cuda::available(&why)) {
    fail(ErrorCode::kBackendUnavailable, "backend", "cuda", "unavailable: " + why);
  }
  detail::cuda::check_mla_launch(args, options);
  return detail::cuda::mla_workspace_size(args, detail::DecodeOptions(options));
}

}  // namespace pagedattn
