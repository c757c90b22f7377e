// fi_decode_bench.cu -- times FlashInfer 0.7.2 paged batch decode (bf16 q/out, bf16 or fp8 K/V,
// HND paged cache) through its C++ headers, mirroring what BatchDecodeWithPagedKVCacheWrapper's
// JIT modules do:
//   flashinfer-cudacore: DecodePlan + BatchDecodeWithPagedKVCacheDispatched (csrc/batch_decode.cu)
//   flashinfer-tc: use_tensor_cores=True, i.e. PrefillPlan + BatchPrefillWithPagedKVCacheDispatched
//     with qo_len 1 (csrc/batch_prefill.cu + batch_prefill_paged.cuh, fa2 backend); with
//     --q-len N > 1 qo_len N per request and MaskMode::kCausal, as the wrapper's
//     q_len_per_req > 1 does (tc only).
//   flashinfer-fa3: the Hopper (sm_90a) paged prefill kernel that
//     BatchPrefillWithPagedKVCacheWrapper runs with backend="fa3" (what backend="auto" resolves
//     to on sm_90 for bf16): PrefillSM90Plan + hopper/prefill_sm90.cuh
//     BatchPrefillWithPagedKVCacheDispatched (csrc/batch_prefill_sm90.cu), at qo_len 1
//     (MaskMode::kNone) or --q-len N (kCausal); bf16 K/V only. The decode wrapper itself never
//     picks it for bf16 (its use_tensor_cores path resolves "auto" to fa2).
// --kv-dtype fp8_e4m3|fp8_e5m2 stores K and V as __nv_fp8_e4m3 / __nv_fp8_e5m2 (q and out stay
// bf16), on the cudacore and tc paths, with k_scale = v_scale = 1 (what the wrapper does when
// run() gets no scales).
// Inputs are rotated by default: each shape gets `sets` independent copies of q, K, V, page table
// and output, together at least 4x a 60 MiB L2 (at most 16), and timed call i runs set i % sets.
// Usage: fi_decode_bench [--shape B,H,KV,D,CTX[,BS]]... [--reps N] [--graph-reps N]
//          [--backend cudacore|tc|fa3|both|all] [--no-pdl] [--cuda-graph-plan] [--no-rotate]
//          [--seed S] [--q-len N] [--kv-dtype bf16|fp8_e4m3|fp8_e5m2]
// CSV on stdout, log on stderr. Exit 0 = every check passed.
// Build option: -DFI_BENCH_FP8_QLEN=1 also instantiates the causal (--q-len > 1) tensor-core
// kernels for fp8 K/V; without it that combination is refused (left out to bound compile time).
//
// Two translation units: FlashInfer's fa2/decode headers and its Hopper headers cannot share one
// (both define e.g. flashinfer::has_maybe_prefix_len_ptr and flashinfer::DefaultAttention, as two
// different templates), and FlashInfer's JIT builds them as separate modules too. build.sh
// compiles this file twice: as is (everything but fa3) and with -DFI_BENCH_SM90_TU=1 (only the fa3
// plan and run, at the end of the file), and links the two objects. The section below is common
// to both.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <flashinfer/attention/scheduler.cuh>  // PrefillPlanSM90Info, PrefillSM90Plan (both TUs)

#include "fi_bench_common.cuh"  // Workspace (both TUs), and what the main one shares with MLA's

// What the fa3 plan and run (FI_BENCH_SM90_TU section) need of a case: the tensors
// BatchPrefillWithKVCacheSM90Plan / BatchPrefillWithPagedKVCacheSM90Run receive from Python.
struct Fa3Args {
  int B, H, KV, D, BS, QL;  // batch, qo heads, kv heads, head dim, page size, q_len
  const void *q, *k, *v;    // bf16: q [B*QL][H][D]; K, V [num_pages][KV][BS][D] (HND)
  void* o;                  // bf16 [B*QL][H][D]
  const int* kv_indices;    // device: the page table (CSR, kv_indptr)
  const int *qo_indptr_h, *kv_indptr_h, *last_page_len_h;  // host, B + 1 / B + 1 / B entries
};
// Plan (csrc/batch_prefill_sm90.cu BatchPrefillWithKVCacheSM90Plan) and run
// (BatchPrefillWithPagedKVCacheSM90Run); defined in the FI_BENCH_SM90_TU section.
cudaError_t fa3_plan(const Fa3Args& a, Workspace& ws, bool enable_cuda_graph, cudaStream_t stream,
                     flashinfer::PrefillPlanSM90Info& plan_info);
cudaError_t fa3_run(const Fa3Args& a, const flashinfer::PrefillPlanSM90Info& plan_info,
                    const Workspace& ws, bool enable_pdl, cudaStream_t stream);

#ifndef FI_BENCH_SM90_TU  // ======== the main translation unit: everything but the fa3 kernels

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <flashinfer/attention/decode.cuh>
#include <flashinfer/attention/prefill.cuh>
#include <flashinfer/attention/variants.cuh>
#include <flashinfer/fastdiv.cuh>
#include <flashinfer/page.cuh>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#ifndef FI_BENCH_FP8_QLEN
#define FI_BENCH_FP8_QLEN 0
#endif

using namespace flashinfer;
using IdType = int32_t;
constexpr auto POS_ENCODING_MODE = PosEncodingMode::kNone;

// What the two modules' Params below have in common (the same names and types in both JIT
// configs): bf16 q and output, int32 ids, the cache, the ADDITIONAL_PARAMS scalars and the plan's
// work lists. The kernels read them by name, so where they are declared does not matter.
template <typename KV>
struct SharedParams {
  using DTypeQ = nv_bfloat16;
  using DTypeKV = KV;
  using DTypeO = nv_bfloat16;
  using IdType = int32_t;
  DTypeQ* q;
  paged_kv_t<DTypeKV, IdType> paged_kv;
  DTypeO* o;
  float* lse;
  float* maybe_alibi_slopes;
  double logits_soft_cap, sm_scale, rope_rcp_scale, rope_rcp_theta;
  uint32_t padded_batch_size, num_qo_heads;
  IdType q_stride_n, q_stride_h;
  int32_t window_left;
  IdType *request_indices, *kv_tile_indices, *o_indptr, *kv_chunk_size_ptr;
  bool* block_valid_mask;
  bool partition_kv;
};

// CUDA-core Params: csrc/batch_decode_customize_config.jinja as rendered by modules.py
// gen_batch_decode_module(bf16, KV, bf16, int32, D, D, pos_encoding_mode=0,
// use_sliding_window=False, use_logits_soft_cap=False) with KV = bf16, float8_e4m3fn or
// float8_e5m2 (the same module for every KV dtype, only dtype_kv differs; no scale params: the
// wrapper folds k_scale into sm_scale and multiplies the output by v_scale after the call);
// additional params: maybe_alibi_slopes, logits_soft_cap, sm_scale, rope_rcp_scale, rope_rcp_theta.
template <typename KV>
struct DecodeParams : SharedParams<KV> {
  bool enable_pdl;
  __host__ __device__ __forceinline__ int32_t get_qo_len(int32_t) const { return 1; }
  __host__ __device__ __forceinline__ int32_t get_kv_len(int32_t b) const {
    return this->paged_kv.get_length(b);
  }
};
// variant_name of both modules: DefaultAttention<use_custom_mask, sliding_window, soft_cap, alibi>;
// the tensor-core module's use_custom_mask is (MASK_MODE == kCustom) = false for MaskMode::kNone
// (q_len 1) and MaskMode::kCausal (q_len > 1) alike.
using AttentionVariant = DefaultAttention<false, false, false, false>;

// Tensor-core PagedParams: csrc/batch_prefill_customize_config.jinja as rendered by modules.py
// _gen_batch_prefill_primary_module("fa2", bf16, KV, bf16, int32, D, D, 0, False, False, False)
// (what get_batch_prefill_module builds for fa2; paged_kv_stride_mode "equal": SAME_KV_STRIDES).
// bf16 q with fp8 KV is fa2 in the wrapper too: utils.py is_fa3_backend_supported refuses fp8 KV
// with a non-fp8 q, and the fa2 module has no k/v scale params (maybe_k/v_cache_sf are NVFP4's).
// Its fields beyond SharedParams:
template <typename KV>
struct PagedParams : SharedParams<KV> {
  IdType* q_indptr;
  uint_fastdiv group_size;
  uint8_t* maybe_custom_mask;
  int32_t* maybe_mask_indptr;
  uint32_t* maybe_prefix_len_ptr;
  uint16_t *maybe_token_pos_in_items_ptr, *maybe_max_item_len_ptr;
  uint8_t *maybe_k_cache_sf, *maybe_v_cache_sf;
  int64_t token_pos_in_items_len;
  uint32_t k_sf_stride_page, k_sf_stride_n, k_sf_stride_h;
  uint32_t v_sf_stride_page, v_sf_stride_n, v_sf_stride_h;
  IdType *qo_tile_indices, *merge_indptr;
  uint32_t max_total_num_rows;
  uint32_t* total_num_rows;
  __host__ __device__ __forceinline__ uint32_t get_qo_len(uint32_t b) const {
    return q_indptr[b + 1] - q_indptr[b];
  }
  __host__ __device__ __forceinline__ uint32_t get_kv_len(uint32_t b) const {
    return this->paged_kv.get_length(b);
  }
};

// One benchmark case: random fragmented paged K/V cache (HND), q, out, CSR page table.
// q and out are [B * QL][H][D] (row b * QL + i is query i of request b), bf16.
struct Case {
  int B, H, KV, D, CTX, BS, pages_per_seq = 0, num_blocks = 0;
  int QL = 1;                   // query tokens per request (--q-len)
  KvDtype kvt = KvDtype::BF16;  // K/V element type (--kv-dtype)
  nv_bfloat16 *q = nullptr, *o = nullptr;
  void *k = nullptr, *v = nullptr;  // nv_bfloat16, __nv_fp8_e4m3 or __nv_fp8_e5m2, as kvt says
  int *indptr = nullptr, *indices = nullptr, *last = nullptr, *qo_indptr = nullptr;
  std::vector<int> indptr_h, indices_h, last_h, qo_indptr_h;  // qo_indptr = arange(B+1) * QL
  // The pool: the blocks the sequences need, plus 10%.
  void layout() {
    pages_per_seq = (CTX + BS - 1) / BS;
    num_blocks = B * pages_per_seq + (B * pages_per_seq + 9) / 10;
  }
  size_t kv_elem_bytes() const { return kv_dtype_bytes(kvt); }
  size_t rows() const { return (size_t)B * QL; }
  size_t pool_elems() const { return (size_t)num_blocks * KV * BS * D; }
  size_t q_elems() const { return rows() * H * D; }
  double kv_pool_bytes() const { return 2.0 * pool_elems() * kv_elem_bytes(); }  // K + V arrays
  // One call's K+V, counted once per request: the whole context (the causal rows of a request all
  // read within the span of its last row, which is the whole context).
  double kv_read_bytes() const { return 2.0 * kv_elem_bytes() * B * (double)CTX * KV * D; }
  void strides(int64_t s[4]) const {
    s[0] = (int64_t)KV * BS * D, s[1] = BS * D, s[2] = D, s[3] = 1;
  }
};
// "" for the default mode (q_len 1, bf16 K/V), else e.g. " q_len=4 kv_dtype=fp8_e4m3".
static std::string mode_str(const Case& c) {
  std::string s;
  if (c.QL != 1) s += " q_len=" + std::to_string(c.QL);
  if (c.kvt != KvDtype::BF16) s += std::string(" kv_dtype=") + kv_dtype_name(c.kvt);
  return s;
}

__global__ void fill_uniform_bf16(nv_bfloat16* x, size_t n, uint64_t seed) {  // U[-1, 1)
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    x[i] = __float2bfloat16(
        2.0f * (float)(splitmix64(seed * 0x100000001B3ull + i) >> 40) / 16777216.0f - 1.0f);
}
// fp8 codes of small magnitude: random sign and mantissa, exponent field uniform over the 8 binades
// [bias - 7, bias] (e4m3: 0..7, so its subnormals and +-0 too; e5m2: 8..15): |x| < 2, never a
// NaN or Inf code.
__global__ void fill_fp8_codes(uint8_t* x, size_t n, uint64_t seed, int mant_bits, int exp_lo) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    const uint64_t r = splitmix64(seed * 0x100000001B3ull + i);
    const uint32_t sign = r & 1u, e = exp_lo + ((r >> 1) & 7u),
                   m = (r >> 4) & ((1u << mant_bits) - 1u);
    x[i] = (uint8_t)((sign << 7) | (e << mant_bits) | m);
  }
}
static void fill_kv(const Case& c, void* x, uint64_t seed) {
  if (c.kvt == KvDtype::BF16)
    fill_uniform_bf16<<<1024, 256>>>(static_cast<nv_bfloat16*>(x), c.pool_elems(), seed);
  else if (c.kvt == KvDtype::E4M3)
    fill_fp8_codes<<<1024, 256>>>(static_cast<uint8_t*>(x), c.pool_elems(), seed, 3, 0);
  else
    fill_fp8_codes<<<1024, 256>>>(static_cast<uint8_t*>(x), c.pool_elems(), seed, 2, 8);
}
static void make_case(Case& c, uint64_t seed) {
  c.layout();
  const int needed = c.B * c.pages_per_seq;
  std::vector<int> perm(c.num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::mt19937_64 rng(seed);
  // Fragmented: sequence b gets perm[b*pps, (b+1)*pps).
  std::shuffle(perm.begin(), perm.end(), rng);
  c.indices_h.assign(perm.begin(), perm.begin() + needed);
  c.last_h.assign(c.B, c.CTX - (c.pages_per_seq - 1) * c.BS);
  c.indptr_h.resize(c.B + 1);
  c.qo_indptr_h.resize(c.B + 1);
  for (int b = 0; b <= c.B; ++b) c.indptr_h[b] = b * c.pages_per_seq, c.qo_indptr_h[b] = b * c.QL;
  c.indptr = upload(c.indptr_h), c.indices = upload(c.indices_h), c.last = upload(c.last_h);
  c.qo_indptr = upload(c.qo_indptr_h);
  CK(cudaMalloc(&c.k, c.pool_elems() * c.kv_elem_bytes()));
  CK(cudaMalloc(&c.v, c.pool_elems() * c.kv_elem_bytes()));
  CK(cudaMalloc(&c.q, c.q_elems() * sizeof(nv_bfloat16)));
  CK(cudaMalloc(&c.o, c.q_elems() * sizeof(nv_bfloat16)));
  fill_kv(c, c.k, seed * 3 + 1);
  fill_kv(c, c.v, seed * 3 + 2);
  fill_uniform_bf16<<<1024, 256>>>(c.q, c.q_elems(), seed * 3 + 3);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
}
static void free_case(Case& c) {
  for (void* p : {(void*)c.k, (void*)c.v, (void*)c.q, (void*)c.o, (void*)c.indptr, (void*)c.indices,
                  (void*)c.last, (void*)c.qo_indptr})
    CK(cudaFree(p));
}

// ---- CUDA-core plan: BatchDecodeWithPagedKVCachePlan (csrc/batch_decode.cu). indptr is the
// host copy, as Python passes indptr.to("cpu"). The work estimation (occupancy of the decode
// kernel) depends on the KV dtype, so the Params carry it.
template <typename KV, uint32_t HEAD_DIM>
static cudaError_t cc_plan(const Case& c, Workspace& ws, bool enable_cuda_graph,
                           cudaStream_t stream, DecodePlanInfo& plan_info) {
  using Params = DecodeParams<KV>;
  cudaError_t status = cudaSuccess;
  std::vector<IdType> indptr_h(c.indptr_h);
  DISPATCH_GQA_GROUP_SIZE(c.H / c.KV, GROUP_SIZE, {
    auto work_estimation_func =
        BatchDecodeWithPagedKVCacheWorkEstimationDispatched<GROUP_SIZE, HEAD_DIM, POS_ENCODING_MODE,
                                                            AttentionVariant, Params>;
    status = DecodePlan<HEAD_DIM, POS_ENCODING_MODE, AttentionVariant, Params>(
        ws.fbuf, ws.fbytes, ws.ibuf, ws.ibuf_h, ws.ibytes, plan_info, indptr_h.data(), c.B, c.H,
        c.BS, enable_cuda_graph, stream, work_estimation_func);
  });
  return status;
}

// SharedParams, as both run functions set them: the cache (HND), q and output, no lse,
// window_left -1, the ADDITIONAL_PARAMS_SETTER scalars (sm_scale 1/sqrt(D),
// rope_scale 1, rope_theta 1e4; Python passes its cached ALiBi slopes, which use_alibi=false
// never reads) and the plan's work lists in the int workspace.
template <typename KV, typename PlanInfo>
static void set_shared_params(SharedParams<KV>& p, const Case& c, uint32_t head_dim,
                              const PlanInfo& plan, const Workspace& ws) {
  int64_t strides[4];
  c.strides(strides);
  p.q = c.q;
  p.paged_kv =
      paged_kv_t<KV, IdType>(c.KV, c.BS, head_dim, c.B, QKVLayout::kHND, static_cast<KV*>(c.k),
                             static_cast<KV*>(c.v), strides, strides, c.indices, c.indptr, c.last);
  p.o = c.o;
  p.lse = nullptr;
  p.num_qo_heads = c.H;
  p.q_stride_n = c.H * c.D;
  p.q_stride_h = c.D;
  p.window_left = -1;
  p.maybe_alibi_slopes = nullptr;
  p.logits_soft_cap = 0.0;
  p.sm_scale = 1.0 / std::sqrt((double)c.D);
  p.rope_rcp_scale = 1.0 / 1.0;
  p.rope_rcp_theta = 1.0 / 1e4;
  p.request_indices = GetPtrFromBaseOffset<IdType>(ws.ibuf, plan.request_indices_offset);
  p.kv_tile_indices = GetPtrFromBaseOffset<IdType>(ws.ibuf, plan.kv_tile_indices_offset);
  p.o_indptr = GetPtrFromBaseOffset<IdType>(ws.ibuf, plan.o_indptr_offset);
  p.kv_chunk_size_ptr = GetPtrFromBaseOffset<IdType>(ws.ibuf, plan.kv_chunk_size_ptr_offset);
  p.padded_batch_size = plan.padded_batch_size;
}

// ---- CUDA-core run: BatchDecodeWithPagedKVCacheRun (csrc/batch_decode.cu) with what the wrapper
// passes here: HND, no lse, window_left -1, sm_scale 1/sqrt(D), rope_scale 1, rope_theta 1e4.
// fp8 KV: sm_scale stays 1/sqrt(D) (the wrapper's sm_scale *= k_scale with no k_scale given) and
// no v_scale multiply follows (run() skips it when v_scale is None).
template <typename KV, uint32_t HEAD_DIM>
static cudaError_t cc_run(const Case& c, const DecodePlanInfo& plan_info, const Workspace& ws,
                          bool enable_pdl, cudaStream_t stream) {
  using Params = DecodeParams<KV>;
  Params params{};  // all the pointers batch_decode.cu nulls, partition_kv = false
  set_shared_params(params, c, HEAD_DIM, plan_info, ws);
  params.enable_pdl = enable_pdl;  // never read by the kernel (batch_decode.cu leaves it unset)
  typename Params::DTypeO* tmp_v = nullptr;
  float* tmp_s = nullptr;
  if (plan_info.split_kv) {
    tmp_v = GetPtrFromBaseOffset<typename Params::DTypeO>(ws.fbuf, plan_info.v_offset);
    tmp_s = GetPtrFromBaseOffset<float>(ws.fbuf, plan_info.s_offset);
    if (plan_info.enable_cuda_graph)
      params.block_valid_mask =
          GetPtrFromBaseOffset<bool>(ws.ibuf, plan_info.block_valid_mask_offset);
  }
  return BatchDecodeWithPagedKVCacheDispatched<HEAD_DIM, POS_ENCODING_MODE, AttentionVariant>(
      params, tmp_v, tmp_s, enable_pdl, stream);
}

// ---- Tensor-core plan: BatchPrefillWithKVCachePlan (csrc/batch_prefill.cu) with the arguments
// the decode wrapper's plan() passes for use_tensor_cores=True, backend fa2, q_len_per_req QL:
// qo_indptr = arange(B+1) * QL, total_num_rows = B * QL, uniform_q_len = QL if QL > 1 else 0
// (plan()'s `causal` argument is not passed on to PrefillPlan; the mask is a run-time template
// argument), kv_dtype_bytes = sizeof(DTypeKV) as batch_prefill.cu passes it.
static cudaError_t tc_plan(const Case& c, Workspace& ws, bool enable_cuda_graph,
                           cudaStream_t stream, PrefillPlanInfo& plan_info) {
  std::vector<IdType> qo_indptr_h(c.qo_indptr_h), kv_indptr_h(c.indptr_h);
  return PrefillPlan<IdType>(
      ws.fbuf, ws.fbytes, ws.ibuf, ws.ibuf_h, ws.ibytes, plan_info, qo_indptr_h.data(),
      kv_indptr_h.data(), /*total_num_rows=*/c.B * c.QL, c.B, c.H, c.KV, c.D, c.D, c.BS,
      enable_cuda_graph, /*sizeof_dtype_o=*/2,
      /*window_left=*/-1, /*fixed_split_size=*/-1, /*disable_split_kv=*/false,
      /*num_colocated_ctas=*/0, /*uniform_q_len=*/c.QL > 1 ? c.QL : 0, stream,
      /*kv_dtype_bytes=*/(uint32_t)c.kv_elem_bytes());
}

// Which (KV dtype, mask) pairs have tensor-core kernels built. bf16: both masks. fp8: kNone (q_len
// 1) always; kCausal (q_len > 1) only with -DFI_BENCH_FP8_QLEN=1.
template <typename KV, MaskMode MASK>
constexpr bool tc_built() {
  return std::is_same_v<KV, nv_bfloat16> || MASK == MaskMode::kNone || FI_BENCH_FP8_QLEN;
}

// ---- Tensor-core run: BatchPrefillWithPagedKVCacheRun (csrc/batch_prefill_paged.cuh, stride mode
// EQUAL) with mask NON_CAUSAL (MaskMode::kNone) at q_len 1 and CAUSAL (MaskMode::kCausal) at q_len
// > 1 (the decode wrapper's run(): MaskMode.CAUSAL if planned_q_len > 1 else NON_CAUSAL), HND, no
// lse, window_left -1. The wrapper's optional tensors are None except the ALiBi slopes (never
// read): every maybe_* stays nullptr. fp8 KV: sm_scale and output as in cc_run
// (k_scale = v_scale = 1).
template <typename KV, uint32_t HEAD_DIM, MaskMode MASK>
static cudaError_t tc_run(const Case& c, const PrefillPlanInfo& plan_info, const Workspace& ws,
                          bool enable_pdl, cudaStream_t stream) {
  using Params = PagedParams<KV>;
  Params params{};  // nullptr / 0 / false: what batch_prefill_paged.cuh sets before the plan
  set_shared_params(params, c, HEAD_DIM, plan_info, ws);
  params.q_indptr = c.qo_indptr;
  params.group_size = uint_fastdiv(c.H / c.KV);
  params.token_pos_in_items_len = 0;  // an ADDITIONAL_PARAMS_SETTER scalar
  typename Params::DTypeO* tmp_v = nullptr;
  float* tmp_s = nullptr;
  params.qo_tile_indices = GetPtrFromBaseOffset<IdType>(ws.ibuf, plan_info.qo_tile_indices_offset);
  if (plan_info.split_kv) {
    params.merge_indptr = GetPtrFromBaseOffset<IdType>(ws.ibuf, plan_info.merge_indptr_offset);
    tmp_v = GetPtrFromBaseOffset<typename Params::DTypeO>(ws.fbuf, plan_info.v_offset);
    tmp_s = GetPtrFromBaseOffset<float>(ws.fbuf, plan_info.s_offset);
  }
  params.max_total_num_rows = plan_info.total_num_rows;
  if (plan_info.enable_cuda_graph) {
    params.block_valid_mask =
        GetPtrFromBaseOffset<bool>(ws.ibuf, plan_info.block_valid_mask_offset);
    params.total_num_rows =
        GetPtrFromBaseOffset<uint32_t>(ws.ibuf, plan_info.total_num_rows_offset);
  }
  // DISPATCH_CTA_TILE_Q over the tiles batch_prefill_paged_kernel_inst.jinja instantiates for
  // head_dim < 512 (16, 64, 128). q_len 1 (packed qo_len = group size <= 16) always gets 16 on
  // sm_80+ (FA2DetermineCtaTileQ; with CUDA-graph plans too, as max_seq_len is 1), so the fp8
  // q_len-1 build has only 16; bf16 and every causal (q_len > 1) build have all three, since
  // packed qo_len = q_len * group size picks 16 (<= 16), 64 (<= 64) or 128.
  constexpr bool kAllTiles = std::is_same_v<KV, nv_bfloat16> || MASK == MaskMode::kCausal;
  auto launch = [&](auto tile) {
    return BatchPrefillWithPagedKVCacheDispatched<
        /*SAME_KV_STRIDES=*/true, decltype(tile)::value, HEAD_DIM, HEAD_DIM, POS_ENCODING_MODE,
        /*USE_FP16_QK_REDUCTION=*/false, MASK, AttentionVariant, Params>(params, tmp_v, tmp_s,
                                                                         enable_pdl, stream);
  };
  switch (plan_info.cta_tile_q) {
    case 16:
      return launch(std::integral_constant<uint32_t, 16>{});
    case 64:
      if constexpr (kAllTiles) return launch(std::integral_constant<uint32_t, 64>{});
      break;
    case 128:
      if constexpr (kAllTiles) return launch(std::integral_constant<uint32_t, 128>{});
      break;
  }
  FLASHINFER_ERROR("cta_tile_q " + std::to_string(plan_info.cta_tile_q) +
                   " is not built for kv_dtype " + kv_dtype_name(c.kvt) + " q_len " +
                   std::to_string(c.QL));
}

// ---- fa3: the plan and run live in the FI_BENCH_SM90_TU section (the second translation unit).
// This side hands them the case's tensors and host CSR arrays, as the Python wrapper's plan() and
// run() hand them to the JIT module. bf16 K/V only (main() keeps fp8 away from fa3).
static Fa3Args fa3_args(const Case& c) {
  return Fa3Args{c.B,
                 c.H,
                 c.KV,
                 c.D,
                 c.BS,
                 c.QL,
                 c.q,
                 c.k,
                 c.v,
                 c.o,
                 c.indices,
                 c.qo_indptr_h.data(),
                 c.indptr_h.data(),
                 c.last_h.data()};
}

// ---- A planned call of any backend.
enum class Backend { CudaCore, TensorCore, Fa3 };
struct Planned {
  Backend be;
  DecodePlanInfo dpi;
  PrefillPlanInfo ppi;
  PrefillPlanSM90Info f3pi;
  // fa3, for plan_str: the persistent grid (one CTA per SM) and the query tile.
  int num_ctas = 0, fa3_cta_tile_q = 0;
};
static const char* backend_name(Backend be, bool cg) {
  if (be == Backend::CudaCore) return cg ? "flashinfer-cudacore-cgplan" : "flashinfer-cudacore";
  if (be == Backend::Fa3) return cg ? "flashinfer-fa3-cgplan" : "flashinfer-fa3";
  return cg ? "flashinfer-tc-cgplan" : "flashinfer-tc";
}
template <typename KV>
static cudaError_t fi_plan_kv(Backend be, const Case& c, Workspace& ws, bool cg, cudaStream_t s,
                              Planned& p) {
  p.be = be;
  if (be == Backend::TensorCore) return tc_plan(c, ws, cg, s, p.ppi);
  return c.D == 64 ? cc_plan<KV, 64>(c, ws, cg, s, p.dpi) : cc_plan<KV, 128>(c, ws, cg, s, p.dpi);
}
template <typename KV>
static cudaError_t fi_run_kv(const Case& c, const Planned& p, const Workspace& ws, bool pdl,
                             cudaStream_t s) {
  if (p.be == Backend::TensorCore) {
    if (c.QL > 1) {  // the CUDA-core decode kernel has no multi-token mode; main() keeps it out
      if constexpr (tc_built<KV, MaskMode::kCausal>()) {
        return c.D == 64 ? tc_run<KV, 64, MaskMode::kCausal>(c, p.ppi, ws, pdl, s)
                         : tc_run<KV, 128, MaskMode::kCausal>(c, p.ppi, ws, pdl, s);
      } else {
        FLASHINFER_ERROR(std::string("q_len > 1 with kv_dtype ") + kv_dtype_name(c.kvt) +
                         " is not built (rebuild with -DFI_BENCH_FP8_QLEN=1)");
      }
    }
    return c.D == 64 ? tc_run<KV, 64, MaskMode::kNone>(c, p.ppi, ws, pdl, s)
                     : tc_run<KV, 128, MaskMode::kNone>(c, p.ppi, ws, pdl, s);
  }
  return c.D == 64 ? cc_run<KV, 64>(c, p.dpi, ws, pdl, s) : cc_run<KV, 128>(c, p.dpi, ws, pdl, s);
}
static cudaError_t fi_plan(Backend be, const Case& c, Workspace& ws, bool cg, cudaStream_t s,
                           Planned& p) {
  if (be == Backend::Fa3) {
    if (c.kvt != KvDtype::BF16) FLASHINFER_ERROR("fa3 is built for bf16 K/V only");
    p.be = be;
    int dev;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&p.num_ctas, cudaDevAttrMultiProcessorCount, dev));
    p.fa3_cta_tile_q = c.D == 64 ? 192 : 128;  // PrefillSM90Plan's cta_tile_q = the kernel's CTA_Q
    return fa3_plan(fa3_args(c), ws, cg, s, p.f3pi);
  }
  switch (c.kvt) {
    case KvDtype::E4M3:
      return fi_plan_kv<__nv_fp8_e4m3>(be, c, ws, cg, s, p);
    case KvDtype::E5M2:
      return fi_plan_kv<__nv_fp8_e5m2>(be, c, ws, cg, s, p);
    default:
      return fi_plan_kv<nv_bfloat16>(be, c, ws, cg, s, p);
  }
}
static cudaError_t fi_run(const Case& c, const Planned& p, const Workspace& ws, bool pdl,
                          cudaStream_t s) {
  if (p.be == Backend::Fa3) return fa3_run(fa3_args(c), p.f3pi, ws, pdl, s);
  switch (c.kvt) {
    case KvDtype::E4M3:
      return fi_run_kv<__nv_fp8_e4m3>(c, p, ws, pdl, s);
    case KvDtype::E5M2:
      return fi_run_kv<__nv_fp8_e5m2>(c, p, ws, pdl, s);
    default:
      return fi_run_kv<nv_bfloat16>(c, p, ws, pdl, s);
  }
}
static std::string plan_str(const Planned& p, const Workspace& ws) {
  if (p.be == Backend::Fa3) {  // PrefillSM90Plan: works = (qo head, request, 128/192-row q tile)
    const int works =
        GetPtrFromBaseOffset<IdType>(ws.ibuf_h, p.f3pi.work_indptr_offset)[p.num_ctas];
    return "works=" + std::to_string(works) + " over " + std::to_string(p.num_ctas) +
           " persistent CTAs, cta_tile_q=" + std::to_string(p.fa3_cta_tile_q) +
           " same_schedule_for_all_heads=" +
           std::to_string((int)p.f3pi.same_schedule_for_all_heads) +
           " (one work = one qo head x one request's query rows; GQA heads not packed)";
  }
  const bool tc = p.be == Backend::TensorCore;
  const int chunk = *GetPtrFromBaseOffset<IdType>(
      ws.ibuf_h, tc ? p.ppi.kv_chunk_size_ptr_offset : p.dpi.kv_chunk_size_ptr_offset);
  std::string s = "split_kv=" + std::to_string(tc ? p.ppi.split_kv : p.dpi.split_kv) +
                  " padded_batch_size=" +
                  std::to_string(tc ? p.ppi.padded_batch_size : p.dpi.padded_batch_size) +
                  " kv_chunk=" + std::to_string(chunk) + " tokens";
  return tc ? s + " cta_tile_q=" + std::to_string(p.ppi.cta_tile_q) : s;
}

// ---- Reference: one block per (qo head, query row), f32 accumulation, two-pass softmax over the
// tokens gathered through the page table; logits/probabilities live in a global scratch row. Query
// row r = b * QL + i of request b attends causally (bottom-right aligned, as MaskMode::kCausal):
// tokens [0, kv_len - QL + i], i.e. all kv_len tokens at QL = 1. K/V are read as stored (bf16 or
// the fp8 codes) and converted exactly to f32.
constexpr int REF_THREADS = 256;
template <bool MAX>
__device__ float block_reduce(float x, float* red) {
  red[threadIdx.x] = x;
  __syncthreads();
  for (int off = blockDim.x / 2; off > 0; off >>= 1) {
    if (threadIdx.x < off)
      red[threadIdx.x] = MAX ? fmaxf(red[threadIdx.x], red[threadIdx.x + off])
                             : red[threadIdx.x] + red[threadIdx.x + off];
    __syncthreads();
  }
  float r = red[0];
  __syncthreads();
  return r;
}
__device__ __forceinline__ float ref_f32(nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float ref_f32(__nv_fp8_e4m3 x) { return static_cast<float>(x); }
__device__ __forceinline__ float ref_f32(__nv_fp8_e5m2 x) { return static_cast<float>(x); }
template <typename KVT>
__global__ void ref_decode_kernel(const nv_bfloat16* q, const KVT* k, const KVT* v,
                                  const int* indptr, const int* indices, const int* last_len,
                                  float* scratch, size_t scratch_row, float* out, int row0, int H,
                                  int KV, int D, int BS, int QL, float sm_scale) {
  __shared__ float red[REF_THREADS];
  const int h = blockIdx.x, r = row0 + blockIdx.y, b = r / QL, kvh = h / (H / KV),
            tid = threadIdx.x;
  const int p0 = indptr[b], np = indptr[b + 1] - p0;
  const int kv_len = np == 0 ? 0 : (np - 1) * BS + last_len[b];
  const int causal_len = kv_len - QL + 1 + r % QL;  // = kv_len at QL 1
  const int len = causal_len > 0 ? causal_len : 0;
  const nv_bfloat16* qv = q + ((size_t)r * H + h) * D;
  float* s = scratch + ((size_t)blockIdx.y * H + h) * scratch_row;
  auto row = [&](const KVT* pool, int t) {  // token t of request b, kv head kvh
    return pool + (((size_t)indices[p0 + t / BS] * KV + kvh) * BS + t % BS) * D;
  };
  float m = -INFINITY;
  for (int t = tid; t < len; t += blockDim.x) {  // pass 1: logits and their max
    const KVT* kt = row(k, t);
    float acc = 0.f;
    for (int d = 0; d < D; ++d) acc += __bfloat162float(qv[d]) * ref_f32(kt[d]);
    s[t] = acc * sm_scale;
    m = fmaxf(m, s[t]);
  }
  m = block_reduce<true>(m, red);
  float sum = 0.f;
  for (int t = tid; t < len; t += blockDim.x) sum += (s[t] = expf(s[t] - m));  // pass 2: exp, sum
  sum = block_reduce<false>(sum, red);  // its barriers also publish s[] to the whole block
  const int slices = blockDim.x / D, d = tid % D, sl = tid / D;  // D in {64,128} divides 256
  float acc = 0.f;
  for (int t = sl; t < len; t += slices) acc += s[t] * ref_f32(row(v, t)[d]);
  red[tid] = acc;
  __syncthreads();
  if (tid < D) {
    float o = 0.f;
    for (int i = 0; i < slices; ++i) o += red[i * D + tid];
    out[((size_t)r * H + h) * D + tid] = len > 0 ? o / sum : 0.f;
  }
}
template <typename KVT>
static void ref_launch(const Case& c, dim3 grid, float* scratch, float* out, int row0) {
  ref_decode_kernel<KVT><<<grid, REF_THREADS>>>(
      c.q, static_cast<const KVT*>(c.k), static_cast<const KVT*>(c.v), c.indptr, c.indices, c.last,
      scratch, c.CTX, out, row0, c.H, c.KV, c.D, c.BS, c.QL, (float)(1.0 / std::sqrt((double)c.D)));
}
static std::vector<float> ref_decode(const Case& c) {
  // Query rows in chunks of at most 65535 (grid.y) whose scratch stays within 1 GiB; at q_len 1
  // every default shape is one chunk (the whole batch), as before.
  const int rows = (int)c.rows();
  const size_t per_row = (size_t)c.H * c.CTX;
  const int chunk = (int)std::max<size_t>(
      1, std::min<size_t>({(size_t)rows, 65535, ((size_t)1 << 28) / per_row}));
  float *scratch, *out;
  CK(cudaMalloc(&scratch, (size_t)chunk * per_row * sizeof(float)));
  CK(cudaMalloc(&out, c.q_elems() * sizeof(float)));
  for (int r0 = 0; r0 < rows; r0 += chunk) {
    const dim3 grid(c.H, std::min(chunk, rows - r0));
    if (c.kvt == KvDtype::E4M3)
      ref_launch<__nv_fp8_e4m3>(c, grid, scratch, out, r0);
    else if (c.kvt == KvDtype::E5M2)
      ref_launch<__nv_fp8_e5m2>(c, grid, scratch, out, r0);
    else
      ref_launch<nv_bfloat16>(c, grid, scratch, out, r0);
    CK(cudaGetLastError());
  }
  std::vector<float> h(c.q_elems());
  CK(cudaMemcpy(h.data(), out, h.size() * sizeof(float), cudaMemcpyDeviceToHost));
  CK(cudaFree(scratch));
  CK(cudaFree(out));
  return h;
}

template <typename T>
static std::vector<float> to_host_f32(const T* d, size_t n) {
  std::vector<T> h(n);
  CK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  std::vector<float> f(n);
  for (size_t i = 0; i < n; ++i) f[i] = static_cast<float>(h[i]);
  return f;
}
static std::vector<float> kv_to_host_f32(const Case& c, const void* d) {
  if (c.kvt == KvDtype::E4M3)
    return to_host_f32(static_cast<const __nv_fp8_e4m3*>(d), c.pool_elems());
  if (c.kvt == KvDtype::E5M2)
    return to_host_f32(static_cast<const __nv_fp8_e5m2*>(d), c.pool_elems());
  return to_host_f32(static_cast<const nv_bfloat16*>(d), c.pool_elems());
}

// CPU double-precision reference, for the tiny self-test cases only (same causal rows as the GPU
// reference; every sequence has length CTX).
static std::vector<float> cpu_ref(const Case& c) {
  auto k = kv_to_host_f32(c, c.k), v = kv_to_host_f32(c, c.v);
  auto q = to_host_f32(c.q, c.q_elems());
  std::vector<float> out(c.q_elems());
  for (int r = 0; r < (int)c.rows(); ++r)
    for (int h = 0; h < c.H; ++h) {
      const int b = r / c.QL, len = c.CTX - c.QL + 1 + r % c.QL;
      std::vector<double> s(len);
      std::vector<size_t> base(len);
      double m = -INFINITY, sum = 0;
      for (int t = 0; t < len; ++t) {
        const int page = c.indices_h[c.indptr_h[b] + t / c.BS];
        base[t] = (((size_t)page * c.KV + h / (c.H / c.KV)) * c.BS + t % c.BS) * c.D;
        double acc = 0;
        for (int d = 0; d < c.D; ++d)
          acc += (double)q[((size_t)r * c.H + h) * c.D + d] * k[base[t] + d];
        m = std::max(m, s[t] = acc / std::sqrt((double)c.D));
      }
      for (int t = 0; t < len; ++t) sum += (s[t] = std::exp(s[t] - m));
      for (int d = 0; d < c.D; ++d) {
        double acc = 0;
        for (int t = 0; t < len; ++t) acc += s[t] * v[base[t] + d];
        out[((size_t)r * c.H + h) * c.D + d] = (float)(acc / sum);
      }
    }
  return out;
}

struct Err {
  double max_abs = 0, max_ref = 0;
  double rel() const { return max_ref > 0 ? max_abs / max_ref : max_abs; }
};
static Err compare(const std::vector<float>& x, const std::vector<float>& ref) {
  Err e;
  for (size_t i = 0; i < x.size(); ++i) {
    const double d = std::fabs((double)x[i] - ref[i]);
    e.max_abs = std::isnan(d) ? INFINITY : std::max(e.max_abs, d);  // NaN (e.g. poison) fails
    e.max_ref = std::max(e.max_ref, std::fabs((double)ref[i]));
  }
  return e;
}
// Pass: abs err <= 2e-2 (bf16) and <= 5% of max|ref|. Outputs shrink as CTX grows (~1e-2 at 32k),
// so the absolute bound alone would accept garbage of the right magnitude on long contexts.
static bool err_ok(const Err& e) { return e.max_abs <= 2e-2 && e.rel() <= 5e-2; }
struct Verdict {  // every output checked for one CSV row: each must pass on its own
  double max_abs = 0, max_rel = 0;
  int checks = 0;
  bool ok = true;
  void add(const Err& e) {
    max_abs = std::max(max_abs, e.max_abs);
    max_rel = std::max(max_rel, e.rel());
    ok = ok && err_ok(e);
    ++checks;
  }
};

struct Options {
  std::vector<Case> shapes;
  std::vector<Backend> backends{Backend::CudaCore, Backend::TensorCore};
  int reps = 200, graph_reps = 30;
  bool pdl = true, cuda_graph_plan = false, rotate = true;
  uint64_t seed = 1234;
  int q_len = 1;                     // --q-len
  KvDtype kv_dtype = KvDtype::BF16;  // --kv-dtype
};

static void poison(const Case& c, cudaStream_t s) {  // NaN: a launch that skips o cannot pass
  CK(cudaMemsetAsync(c.o, 0xFF, c.q_elems() * sizeof(nv_bfloat16), s));
}
// Runs `launch` (which must write c.o) on a poisoned output and returns the output as f32.
template <typename F>
static std::vector<float> checked_run(const Case& c, cudaStream_t s, F&& launch) {
  poison(c, s);
  CK(launch());
  CK(cudaStreamSynchronize(s));  // to_host_f32's cudaMemcpy does not wait for a non-blocking stream
  return to_host_f32(c.o, c.q_elems());
}

// Self-test on tiny cases: GPU reference vs a CPU double loop, and each backend vs both. The cases
// run in the benchmark's mode (--q-len, --kv-dtype); CTX is raised to q_len where it is shorter.
static bool selftest(Workspace& ws, const Options& opt, cudaStream_t s, bool& fi_ok) {
  const int cases[][6] = {{2, 4, 2, 64, 37, 16}, {2, 8, 1, 128, 1000, 16}, {3, 4, 4, 128, 300, 32}};
  bool ref_ok = true;
  for (auto& t : cases) {
    Case c{t[0], t[1], t[2], t[3], std::max(t[4], opt.q_len), t[5]};
    c.QL = opt.q_len;
    c.kvt = opt.kv_dtype;
    make_case(c, opt.seed + 7);
    const std::vector<float> cpu = cpu_ref(c), gpu = ref_decode(c);
    const Err eg = compare(gpu, cpu);
    ref_ok &= eg.max_abs <= 1e-4;
    fprintf(stderr,
            "# selftest B=%d,H=%d,KV=%d,D=%d,CTX=%d,BS=%d%s: gpu_ref_vs_cpu=%.3g (max|ref|=%.3g) "
            "[%s]\n",
            c.B, c.H, c.KV, c.D, c.CTX, c.BS, mode_str(c).c_str(), eg.max_abs, eg.max_ref,
            eg.max_abs <= 1e-4 ? "ok" : "FAIL");
    for (Backend be : opt.backends) {
      Planned p;
      CK(fi_plan(be, c, ws, opt.cuda_graph_plan, s, p));
      CK(cudaStreamSynchronize(s));
      const std::vector<float> fi = checked_run(c, s, [&] { return fi_run(c, p, ws, opt.pdl, s); });
      const Err ef = compare(fi, cpu), efg = compare(fi, gpu);
      const bool ok = err_ok(ef) && err_ok(efg);
      fprintf(stderr, "#   %s (%s): vs_cpu=%.3g vs_gpu_ref=%.3g [%s]\n",
              backend_name(be, opt.cuda_graph_plan), plan_str(p, ws).c_str(), ef.max_abs,
              efg.max_abs, ok ? "ok" : "FAIL");
      fi_ok &= ok;
    }
    free_case(c);
  }
  return ref_ok;
}

static std::vector<int64_t> plan_vec(const Planned& p) {
  if (p.be == Backend::Fa3) return p.f3pi.ToVector();
  return p.be == Backend::TensorCore ? p.ppi.ToVector() : p.dpi.ToVector();
}

// One CSV row. Each set is planned once, outside all timing, as a server plans a batch once for
// all its layers. A plan is workspace offsets plus int-workspace contents computed from the host
// kv_indptr and the shape only (no page ids, no data pointers), so every set's plan must equal set
// 0's field for field and byte for byte; that is checked, and it is what makes the one shared
// workspace (as a server has one) valid for every set. run(i) is the only map from call to set.
static bool bench_backend(const std::vector<Case>& sets, Backend be,
                          const std::vector<std::vector<float>>& refs, Workspace& ws,
                          const Options& opt, cudaStream_t s) {
  const int S = (int)sets.size();
  const char* name = backend_name(be, opt.cuda_graph_plan);
  std::vector<Planned> plans(S);
  std::vector<char> ibuf0;
  for (int i = 0; i < S; ++i) {
    CK(fi_plan(be, sets[i], ws, opt.cuda_graph_plan, s, plans[i]));
    CK(cudaStreamSynchronize(s));
    const char* h = static_cast<const char*>(ws.ibuf_h);
    if (i == 0) {
      ibuf0.assign(h, h + ws.ibytes);
    } else if (plan_vec(plans[i]) != plan_vec(plans[0]) ||
               std::memcmp(h, ibuf0.data(), ws.ibytes)) {
      fprintf(stderr, "FATAL: %s: set %d's plan differs from set 0's\n", name, i);
      exit(5);
    }
  }
  fprintf(stderr, "#   %s plan: %s%s\n", name, plan_str(plans[0], ws).c_str(),
          S > 1 ? " (identical for every set)" : "");
  auto run = [&](int i) { return fi_run(sets[i % S], plans[i % S], ws, opt.pdl, s); };

  Verdict v;  // every set after a plain launch, then every set after one graph replay
  for (int i = 0; i < S; ++i)
    v.add(compare(checked_run(sets[i], s, [&] { return run(i); }), refs[i]));
  EventTimer timer;
  std::vector<double> tp = time_plain_calls(timer, s, S, opt.reps, run), tg;
  for (double& t : tp) t *= 1e3;  // microseconds

  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  cudaError_t st = cudaSuccess;
  for (int i = 0; i < kGraphCalls && st == cudaSuccess; ++i) st = run(i);
  const cudaError_t se = cudaStreamEndCapture(s, &g);
  if (st != cudaSuccess || se != cudaSuccess) {
    fprintf(stderr, "FATAL: graph capture failed: run=%s end_capture=%s\n", cudaGetErrorString(st),
            cudaGetErrorString(se));
    exit(2);
  }
  CK(cudaGraphInstantiate(&ge, g, 0));
  for (const Case& c : sets) poison(c, s);  // one replay must rewrite every set's output
  CK(cudaGraphLaunch(ge, s));
  CK(cudaStreamSynchronize(s));
  for (int i = 0; i < S; ++i) v.add(compare(to_host_f32(sets[i].o, sets[i].q_elems()), refs[i]));
  for (int i = 0; i < 5; ++i) CK(cudaGraphLaunch(ge, s));  // warmup
  for (int i = 0; i < opt.graph_reps; ++i)
    tg.push_back(timer.ms(s, [&] { CK(cudaGraphLaunch(ge, s)); }) * 1e3 / kGraphCalls);
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));

  const Case& c = sets[0];
  const double us_graph = median(tg), us_plain = median(tp);
  printf("%s,bf16,%d,%d,%d,%d,%d,%d,%.2f,%.2f,%.1f,%s%.3g,%d,%d,%s\n", name, c.B, c.H, c.KV, c.D,
         c.CTX, c.BS, us_graph, us_plain, c.kv_read_bytes() / (us_graph * 1e-6) / 1e9,
         v.ok ? "" : "FAIL:", v.max_abs, S, c.QL, kv_dtype_name(c.kvt));
  fflush(stdout);
  fprintf(stderr,
          "#   max_abs_err=%.3g max_rel=%.3g over %d outputs (%d set(s), plain launch and graph "
          "replay) -> %s\n",
          v.max_abs, v.max_rel, v.checks, S, v.ok ? "ok" : "FAIL");
  return v.ok;
}

static bool bench_shape(const Case& shape, Workspace& ws, const Options& opt, cudaStream_t s,
                        size_t l2) {
  Case sized = shape;
  sized.layout();
  const int S = rotation_sets(sized.kv_pool_bytes(), opt.rotate);
  std::vector<Case> sets(S, shape);
  for (int i = 0; i < S; ++i) make_case(sets[i], opt.seed + i);  // own data, own page order
  const Case& c = sets[0];
  fprintf(
      stderr,
      "# shape B=%d H=%d KV=%d D=%d CTX=%d BS=%d%s: pool %d blocks, K+V read %.1f MiB, "
      "sets=%d (K+V arrays %.1f MiB in all)%s\n",
      c.B, c.H, c.KV, c.D, c.CTX, c.BS, mode_str(c).c_str(), c.num_blocks,
      c.kv_read_bytes() / (1 << 20), S, S * c.kv_pool_bytes() / (1 << 20),
      S * c.kv_read_bytes() < 2.0 * l2 ? " (fits in ~2x L2: GB/s may exceed HBM bandwidth)" : "");
  std::vector<std::vector<float>> refs;
  for (const Case& set : sets) refs.push_back(ref_decode(set));
  bool ok = true;
  for (Backend be : opt.backends) ok &= bench_backend(sets, be, refs, ws, opt, s);
  for (Case& set : sets) free_case(set);
  return ok;
}

static bool parse_shape(const char* s, Case& c) {
  const std::vector<std::string> f = split_commas(s);
  if (f.size() < 5 || f.size() > 6) return false;
  auto num = [&](size_t i, int def) {
    return i < f.size() && !f[i].empty() ? std::atoi(f[i].c_str()) : def;
  };
  c = Case{num(0, 0), num(1, 0), num(2, 0), num(3, 128), num(4, 0), num(5, 16)};
  const int g = c.KV > 0 ? c.H / c.KV : 0;  // DISPATCH_GQA_GROUP_SIZE's list (CUDA-core path)
  return c.B > 0 && c.H > 0 && c.KV > 0 && c.CTX > 0 && c.BS > 0 && c.H % c.KV == 0 &&
         (g == 1 || g == 2 || g == 3 || g == 4 || g == 6 || g == 8 || g == 16) &&
         (c.D == 64 || c.D == 128);
}

int main(int argc, char** argv) {
  Options opt;
  FlagReader flags(argc, argv);
  while (flags.next_flag()) {
    const std::string& a = flags.flag();
    if (a == "--shape") {
      Case c{};
      const std::string v = flags.value();
      if (!parse_shape(v.c_str(), c)) {
        fprintf(stderr,
                "bad --shape '%s': want B,H,KV,D,CTX[,BS], H%%KV==0, H/KV in {1,2,3,4,6,8,16}, D "
                "in {64,128}\n",
                v.c_str());
        return 1;
      }
      opt.shapes.push_back(c);
    } else if (a == "--backend") {
      opt.backends = flags.choice<std::vector<Backend>>(
          {{"cudacore", {Backend::CudaCore}},
           {"tc", {Backend::TensorCore}},
           {"fa3", {Backend::Fa3}},
           {"both", {Backend::CudaCore, Backend::TensorCore}},
           {"all", {Backend::CudaCore, Backend::TensorCore, Backend::Fa3}}},
          "want cudacore, tc, fa3, both (cudacore + tc) or all");
    } else if (a == "--reps")
      opt.reps = std::max(1, std::atoi(flags.value().c_str()));
    else if (a == "--graph-reps")
      opt.graph_reps = std::max(1, std::atoi(flags.value().c_str()));
    else if (a == "--no-pdl")
      opt.pdl = false;
    else if (a == "--cuda-graph-plan")
      opt.cuda_graph_plan = true;
    else if (a == "--no-rotate")
      opt.rotate = false;
    else if (a == "--seed")
      opt.seed = std::strtoull(flags.value().c_str(), nullptr, 10);
    else if (a == "--q-len") {
      opt.q_len = flags.integer(1, 1 << 20);
    } else if (a == "--kv-dtype") {
      opt.kv_dtype = flags.choice<KvDtype>(
          {{"bf16", KvDtype::BF16}, {"fp8_e4m3", KvDtype::E4M3}, {"fp8_e5m2", KvDtype::E5M2}},
          "want bf16, fp8_e4m3 or fp8_e5m2");
    } else {
      fprintf(stderr,
              "usage: %s [--shape B,H,KV,D,CTX[,BS]]... [--reps N] [--graph-reps N] "
              "[--backend cudacore|tc|fa3|both|all] [--no-pdl] [--cuda-graph-plan] [--no-rotate] "
              "[--seed S] [--q-len N] [--kv-dtype bf16|fp8_e4m3|fp8_e5m2]\n"
              "  --backend: both = cudacore + tc (default), all = cudacore + tc + fa3\n"
              "  --q-len N: N query tokens per request, causal (tc and fa3 paths only)\n"
              "  --kv-dtype: K/V cache element type (q and output stay bf16; fp8: cudacore and tc "
              "only)\n",
              argv[0]);
      return 1;
    }
  }
  if (opt.shapes.empty()) {
    const int def[][5] = {{1, 32, 8, 128, 4096},   {1, 32, 8, 128, 32768},  {1, 32, 8, 128, 131072},
                          {8, 32, 8, 128, 4096},   {8, 32, 8, 128, 32768},  {32, 32, 8, 128, 1024},
                          {32, 32, 8, 128, 4096},  {32, 32, 8, 128, 16384}, {128, 32, 8, 128, 1024},
                          {128, 32, 8, 128, 4096}, {64, 64, 8, 128, 4096},  {32, 32, 32, 128, 4096},
                          {32, 32, 4, 64, 4096}};
    for (auto& d : def) opt.shapes.push_back(Case{d[0], d[1], d[2], d[3], d[4], 16});
  }
  if (opt.q_len > 1) {
    if (opt.kv_dtype != KvDtype::BF16 && !FI_BENCH_FP8_QLEN) {
      fprintf(stderr,
              "--q-len > 1 with --kv-dtype %s is not built into this binary: rebuild with "
              "-DFI_BENCH_FP8_QLEN=1 (build.sh OUT_BIN -DFI_BENCH_FP8_QLEN=1)\n",
              kv_dtype_name(opt.kv_dtype));
      return 1;
    }
    auto cc = std::find(opt.backends.begin(), opt.backends.end(), Backend::CudaCore);
    if (cc != opt.backends.end()) {
      opt.backends.erase(cc);
      if (opt.backends.empty()) opt.backends = {Backend::TensorCore};
      fprintf(stderr,
              "# --q-len %d: FlashInfer's CUDA-core decode kernel has no multi-token mode; "
              "running the causal prefill kernel path(s) only (%s)\n",
              opt.q_len,
              opt.backends.size() > 1 ? "flashinfer-tc and flashinfer-fa3" : "flashinfer-tc");
    }
  }
  if (opt.kv_dtype != KvDtype::BF16) {  // fa3 needs an fp8 q for fp8 K/V (is_fa3_backend_supported)
    auto f3 = std::find(opt.backends.begin(), opt.backends.end(), Backend::Fa3);
    if (f3 != opt.backends.end()) {
      if (opt.backends.size() == 1) {
        fprintf(stderr,
                "--backend fa3 needs --kv-dtype bf16: FlashInfer's fa3 path takes fp8 K/V only "
                "with an fp8 q (this benchmark's q is bf16)\n");
        return 1;
      }
      opt.backends.erase(f3);
      fprintf(stderr,
              "# --kv-dtype %s: no fa3 row (FlashInfer's fa3 path takes fp8 K/V only with an "
              "fp8 q)\n",
              kv_dtype_name(opt.kv_dtype));
    }
  }
  for (Case& c : opt.shapes) {
    if (c.CTX < opt.q_len) {  // as the wrapper's plan(): every kv_len must be >= q_len_per_req
      fprintf(stderr, "--q-len %d needs context >= %d; shape %d,%d,%d,%d,%d has context %d\n",
              opt.q_len, opt.q_len, c.B, c.H, c.KV, c.D, c.CTX, c.CTX);
      return 1;
    }
    c.QL = opt.q_len;
    c.kvt = opt.kv_dtype;
  }
  try {
    int dev;
    cudaDeviceProp prop;
    CK(cudaGetDevice(&dev));
    CK(cudaGetDeviceProperties(&prop, dev));
    opt.pdl = opt.pdl && prop.major >= 9;  // Python: enable_pdl = device_support_pdl() (sm >= 90)
    fprintf(stderr,
            "# device: %s (sm_%d%d, %d SMs, L2 %d MiB); flashinfer 0.7.2 batch decode, pdl=%d, "
            "plan enable_cuda_graph=%d, graph=%d calls x %d replays, plain reps=%d, rotate=%d, "
            "q_len=%d, kv_dtype=%s\n",
            prop.name, prop.major, prop.minor, prop.multiProcessorCount, prop.l2CacheSize >> 20,
            (int)opt.pdl, (int)opt.cuda_graph_plan, kGraphCalls, opt.graph_reps, opt.reps,
            (int)opt.rotate, opt.q_len, kv_dtype_name(opt.kv_dtype));
    if (prop.major != 9 || prop.minor != 0)
      fprintf(stderr, "# WARNING: binary is built for sm_90a only\n");
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    Workspace ws;
    alloc_workspace(ws);

    bool all_ok = true;
    if (!selftest(ws, opt, s, all_ok)) {
      fprintf(stderr,
              "FATAL: GPU reference disagrees with the CPU double loop; not benchmarking\n");
      return 4;
    }
    printf(
        "backend,dtype,batch,heads,kv_heads,head_dim,context,block_size,us_graph,us_plain,gbps,"
        "max_abs_err,sets,q_len,kv_dtype\n");
    fflush(stdout);
    for (const Case& c : opt.shapes) all_ok &= bench_shape(c, ws, opt, s, prop.l2CacheSize);
    free_workspace(ws);
    CK(cudaStreamDestroy(s));
    if (!all_ok) fprintf(stderr, "# one or more checks FAILED\n");
    return all_ok ? 0 : 1;
  } catch (const std::exception& e) {  // flashinfer::Error, e.g. a workspace overflow
    fprintf(stderr, "FATAL: %s\n", e.what());
    return 3;
  }
}

#else  // FI_BENCH_SM90_TU ======== the fa3 translation unit (build.sh: -DFI_BENCH_SM90_TU=1)

// What FlashInfer's JIT builds for BatchPrefillWithPagedKVCacheWrapper(backend="fa3") with bf16 q,
// K/V and output, int32 ids, head_dim_qk = head_dim_vo = D, pos_encoding_mode 0, no sliding window,
// no soft-cap, no fp16 QK reduction: modules.py _gen_batch_prefill_module("fa3", ...) ->
// gen_customize_batch_prefill_module renders csrc/batch_prefill_sm90_customize_config.jinja
// (its includes, then the PagedParams below, then variant_decl and prefill_sm90.cuh) and
// csrc/batch_prefill_paged_sm90_kernel_inst.jinja, and compiles them with
// csrc/batch_prefill_sm90.cu.
#include <cmath>
#include <flashinfer/attention/hopper/attention_updater.cuh>
#include <flashinfer/attention/hopper/prefill_sm90.cuh>
#include <flashinfer/attention/hopper/variant_helper.cuh>
#include <flashinfer/attention/hopper/variants.cuh>  // variant_decl (non-fp8 fa3)
#include <flashinfer/attention/mask.cuh>
#include <flashinfer/cutlass_utils.cuh>
#include <flashinfer/layout.cuh>
#include <flashinfer/math.cuh>
#include <string>
#include <vector>

using namespace flashinfer;

namespace {

// The config's PagedParams with {{ additional_params_decl }} as generate_additional_params(...,
// is_sm90_template=True) renders the non-fp8 fa3 lists of modules.py: tensors maybe_prefix_len_ptr
// (uint32_t), maybe_token_pos_in_items_ptr, maybe_max_item_len_ptr (uint16_t), maybe_scale_v
// (float); scalars logits_soft_cap, sm_scale, scale_v_scalar (double), token_pos_in_items_len
// (int64_t). (hopper/default_params.cuh's BatchPrefillPagedParams has the same fields except
// head_dim, with a float sm_scale and no scale_v; the JIT module does not use it.)
struct Fa3PagedParams {
  using DTypeQ = cutlass_dtype_t<nv_bfloat16>;  // cutlass::bfloat16_t
  using DTypeKV = cutlass_dtype_t<nv_bfloat16>;
  using DTypeO = cutlass_dtype_t<nv_bfloat16>;
  using IdType = cutlass_dtype_t<int32_t>;
  DTypeQ* q_ptr;
  DTypeKV* k_ptr;
  DTypeKV* v_ptr;
  DTypeO* o_ptr;
  float* lse_ptr;

  IdType* qo_tile_indices;
  IdType* qo_indptr;
  IdType* kv_indptr;
  IdType* kv_indices;
  IdType* qo_lens;
  IdType* kv_lens;
  IdType* head_indices;
  IdType* work_indptr;
  IdType* batch_indices;

  struct AdditionalParams {
    uint32_t* maybe_prefix_len_ptr;
    uint16_t* maybe_token_pos_in_items_ptr;
    uint16_t* maybe_max_item_len_ptr;
    float* maybe_scale_v;
    double logits_soft_cap;
    double sm_scale;
    double scale_v_scalar;
    int64_t token_pos_in_items_len;
  } additional_params;

  int64_t q_stride_n;
  int64_t k_stride_n;
  int64_t v_stride_n;
  int64_t o_stride_n;
  int64_t q_stride_h;
  int64_t k_stride_h;
  int64_t v_stride_h;
  int64_t o_stride_h;
  int64_t nnz_qo;

  int64_t k_page_stride;  // paged_k_cache.stride(0)
  int64_t v_page_stride;

  int head_dim;  // never read by the kernel; batch_prefill_sm90.cu leaves it unset
  int num_qo_heads;
  int num_kv_heads;
  int group_size;
  int page_size;
  int window_left;

  bool causal;
};

// variant_name for fa3 without fp8: DefaultAttention<use_logits_soft_cap> (hopper/variants.cuh),
// i.e. StandardAttention.
using Fa3Variant = DefaultAttention<false>;

// batch_prefill_paged_sm90_kernel_inst.jinja instantiates BatchPrefillWithPagedKVCacheDispatched<D,
// D, MASK, USE_SLIDING_WINDOW, SAME_SCHEDULER_FOR_ALL_HEADS, variant, PagedParams> for the 4 mask
// modes x SAME_SCHEDULER_FOR_ALL_HEADS in {true, false}. Built here: kNone (q_len 1) and kCausal
// (q_len > 1), D 64 and 128, SAME_SCHEDULER_FOR_ALL_HEADS = false only: PrefillSM90Plan sets it
// when ceil(total_rows / cta_tile_q) + batch - 1 > 4096, i.e. batches of about 4000 requests and
// more, which fa3_run refuses with a FlashInfer exception.
template <uint32_t HEAD_DIM, MaskMode MASK>
cudaError_t fa3_launch(Fa3PagedParams& params, bool enable_pdl, cudaStream_t stream) {
  return BatchPrefillWithPagedKVCacheDispatched<HEAD_DIM, HEAD_DIM, MASK,
                                                /*USE_SLIDING_WINDOW=*/false,
                                                /*SAME_SCHEDULER_FOR_ALL_HEADS=*/false, Fa3Variant,
                                                Fa3PagedParams>(params, enable_pdl, stream);
}

}  // namespace

// BatchPrefillWithKVCacheSM90Plan with the arguments BatchPrefillWithPagedKVCacheWrapper.plan()
// passes for fa3: qo_indptr (host) = arange(B+1) * QL, paged_kv_indptr (host), kv_lens_arr_host =
// get_seq_lens(indptr, last_page_len, page_size), total_num_rows = qo_indptr[-1] = B * QL (the
// wrapper's `self._max_total_num_rows or total_num_rows`; without use_cuda_graph the former is
// None), batch_size, num_qo_heads, num_kv_heads, page_size, enable_cuda_graph, head_dim_qk,
// head_dim_vo, causal = (QL > 1) (the plan()'s causal argument, matching the mask run() gets),
// window_left = -1 (unused by the SM90 plan); csrc passes sizeof_dtype_o = 2.
cudaError_t fa3_plan(const Fa3Args& a, Workspace& ws, bool enable_cuda_graph, cudaStream_t stream,
                     PrefillPlanSM90Info& plan_info) {
  std::vector<int32_t> qo_indptr_h(a.qo_indptr_h, a.qo_indptr_h + a.B + 1),
      kv_indptr_h(a.kv_indptr_h, a.kv_indptr_h + a.B + 1), kv_len_h(a.B);
  for (int b = 0; b < a.B; ++b) {  // get_seq_lens: (num_pages - 1) * page_size + last_page_len
    const int np = kv_indptr_h[b + 1] - kv_indptr_h[b];
    kv_len_h[b] = np > 0 ? (np - 1) * a.BS + a.last_page_len_h[b] : 0;
  }
  return PrefillSM90Plan<int32_t>(ws.fbuf, ws.fbytes, ws.ibuf, ws.ibuf_h, ws.ibytes, plan_info,
                                  qo_indptr_h.data(), kv_indptr_h.data(), kv_len_h.data(),
                                  /*total_num_rows=*/qo_indptr_h[a.B], a.B, a.H, a.KV,
                                  /*head_dim_qk=*/a.D, /*head_dim_vo=*/a.D, /*page_size=*/a.BS,
                                  /*causal=*/a.QL > 1, enable_cuda_graph, /*sizeof_dtype_o=*/2,
                                  stream);
}

// BatchPrefillWithPagedKVCacheSM90Run with what BatchPrefillWithPagedKVCacheWrapper.run() passes
// for fa3 and a bf16 q: HND, mask_mode NON_CAUSAL (q_len 1) or CAUSAL (q_len > 1), no lse,
// window_left -1, and ADDITIONAL_PARAMS_SETTER over (prefix_len_ptr, token_pos_in_items_ptr,
// max_item_len_ptr = None, scale_v tensor = None, logits_soft_cap = 0, sm_scale = 1/sqrt(D),
// scale_v_scalar = 1.0 (_split_scale_param(None)), token_pos_in_items_len = 0). enable_pdl is
// passed on as the wrapper does, but the SM90 launch (cudaLaunchKernel) does not use it.
cudaError_t fa3_run(const Fa3Args& a, const PrefillPlanSM90Info& plan_info, const Workspace& ws,
                    bool enable_pdl, cudaStream_t stream) {
  using P = Fa3PagedParams;
  P params{};  // csrc declares it uninitialised and then sets every field the kernel reads
  params.q_ptr = static_cast<P::DTypeQ*>(const_cast<void*>(a.q));
  params.k_ptr = static_cast<P::DTypeKV*>(const_cast<void*>(a.k));
  params.v_ptr = static_cast<P::DTypeKV*>(const_cast<void*>(a.v));
  params.o_ptr = static_cast<P::DTypeO*>(a.o);
  params.lse_ptr = nullptr;
  params.q_stride_n = (int64_t)a.H * a.D;  // q, o: contiguous [rows][H][D]
  params.q_stride_h = a.D;
  params.o_stride_n = (int64_t)a.H * a.D;
  params.o_stride_h = a.D;
  // HND: paged_k_cache (num_pages, num_heads, page_size, head_dim), contiguous
  params.k_stride_h = (int64_t)a.BS * a.D;
  params.k_stride_n = a.D;
  params.v_stride_h = (int64_t)a.BS * a.D;
  params.v_stride_n = a.D;
  params.k_page_stride = (int64_t)a.KV * a.BS * a.D;
  params.v_page_stride = (int64_t)a.KV * a.BS * a.D;
  if (params.k_page_stride != params.v_page_stride || params.k_stride_n != params.v_stride_n)
    FLASHINFER_ERROR("K and V must have same page stride and stride_n for sparse attention");
  params.nnz_qo = (int64_t)a.B * a.QL;
  params.num_qo_heads = a.H;
  params.num_kv_heads = a.KV;
  params.group_size = a.H / a.KV;
  params.page_size = a.BS;
  params.window_left = -1;
  params.causal = a.QL > 1;  // mask_mode_code == 1 (CAUSAL)
  void* ibuf = ws.ibuf;
  params.qo_tile_indices = GetPtrFromBaseOffset<int32_t>(ibuf, plan_info.qo_tile_indices_offset);
  params.qo_indptr = GetPtrFromBaseOffset<int32_t>(ibuf, plan_info.qo_indptr_offset);
  params.kv_indptr = GetPtrFromBaseOffset<int32_t>(ibuf, plan_info.kv_indptr_offset);
  params.qo_lens = GetPtrFromBaseOffset<int32_t>(ibuf, plan_info.qo_len_offset);
  params.kv_lens = GetPtrFromBaseOffset<int32_t>(ibuf, plan_info.kv_len_offset);
  params.head_indices = GetPtrFromBaseOffset<int32_t>(ibuf, plan_info.head_indices_offset);
  params.work_indptr = GetPtrFromBaseOffset<int32_t>(ibuf, plan_info.work_indptr_offset);
  params.batch_indices = GetPtrFromBaseOffset<int32_t>(ibuf, plan_info.batch_indices_offset);
  params.kv_indices = const_cast<int32_t*>(a.kv_indices);
  // ADDITIONAL_PARAMS_SETTER
  params.additional_params.maybe_prefix_len_ptr = nullptr;
  params.additional_params.maybe_token_pos_in_items_ptr = nullptr;
  params.additional_params.maybe_max_item_len_ptr = nullptr;
  params.additional_params.maybe_scale_v = nullptr;
  params.additional_params.logits_soft_cap = 0.0;
  params.additional_params.sm_scale = 1.0 / std::sqrt((double)a.D);
  params.additional_params.scale_v_scalar = 1.0;
  params.additional_params.token_pos_in_items_len = 0;

  if (plan_info.same_schedule_for_all_heads)
    FLASHINFER_ERROR(
        "fa3: the plan chose SAME_SCHEDULER_FOR_ALL_HEADS=true (more than 4096 works "
        "per head), which this benchmark does not build");
  if (a.D == 64)
    return a.QL > 1 ? fa3_launch<64, MaskMode::kCausal>(params, enable_pdl, stream)
                    : fa3_launch<64, MaskMode::kNone>(params, enable_pdl, stream);
  if (a.D == 128)
    return a.QL > 1 ? fa3_launch<128, MaskMode::kCausal>(params, enable_pdl, stream)
                    : fa3_launch<128, MaskMode::kNone>(params, enable_pdl, stream);
  FLASHINFER_ERROR("fa3: head_dim " + std::to_string(a.D) + " is not built (64 and 128 are)");
}

#endif  // FI_BENCH_SM90_TU
