// fi_mla_bench.cu -- times FlashInfer 0.7.2's MLA paged decode (the absorbed form of
// DeepSeek-V2/V3: kv_lora_rank 512 "ckv" + rope dim 64 "kpe", one latent row per token shared by
// every query head) through its C++ headers, the way BatchMLAPagedAttentionWrapper's fa2 and fa3
// JIT modules do:
//   plan: MLAPlan (attention/scheduler.cuh) on the host, as csrc/batch_mla_plan.cu calls it, then
//     the staged int workspace copied to the device (what the module's plan adapter does; MLAPlan
//     leaves that copy to its caller and returns how many bytes to copy);
//   run:  MLAParams filled as csrc/batch_mla_run.cu fills them, then
//     flashinfer-mla-fa2: mla::BatchMLAPagedAttention (attention/mla.cuh; any sm80+), or
//     flashinfer-mla-fa3: mla::BatchMLAPageAttentionHopper (attention/mla_hopper.cuh; sm90).
//   Both are one persistent cooperative kernel over every SM: the plan's work items (a 64- or
//   128-row tile of packed (query token, head) rows x a chunk of the context), then a grid-wide
//   merge of the chunks a long context was split into.
// Shapes: q [B * q_len][H][576] bf16 (q_nope then q_pe per head, the wrapper's "packed" query),
// the cache one combined [num_pages][page][576] tensor (vLLM's layout, the wrapper's "packed"
// cache: ckv = base, kpe = base + 512, both with the row stride 576), output [B * q_len][H][512]
// bf16, int32 ids, sm_scale 1/sqrt(576), no lse. With --q-len N > 1 every request has N query
// tokens and the causal mask (MaskMode::kCausal): query i of a request of context L attends
// tokens [0, L - N + i]. --kv-dtype fp8_e4m3 stores the cache as e4m3 codes with per-tensor
// scales ckv_scale = kpe_scale = 0.5 (the wrapper's scale_mode="kv-per-tensor"), q stays bf16.
// Inputs rotate over enough independent copies that consecutive calls read memory the L2 does
// not hold (as fi_decode_bench); times are CUDA-graph replays and event-timed plain calls.
// Correctness: every row's output for the first and the last sequence, after a plain call and
// after a graph replay, against a double-precision host loop; a row whose check fails is marked
// and the exit status is 1.
// Usage: fi_mla_bench [--shape B,H,CTX[,PAGE]]... [--page P] [--q-len N] [--kv-dtype bf16|fp8_e4m3]
//          [--backend fa2|fa3|both] [--csv] [--iters N] [--reps N] [--no-rotate] [--seed S]
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <flashinfer/attention/mla.cuh>
#include <flashinfer/attention/mla_hopper.cuh>  // includes mla.cuh; one translation unit holds both
#include <flashinfer/attention/mla_params.cuh>
#include <flashinfer/attention/scheduler.cuh>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "fi_bench_common.cuh"

using namespace flashinfer;

constexpr int kRank = 512, kRope = 64, kWidth = kRank + kRope;  // ckv, kpe, one latent row
constexpr float kFp8Scale = 0.5f;    // ckv_scale = kpe_scale: a value is its e4m3 code x 0.5
constexpr int kMaxWorks = 16384;     // MLAPlan's work-list capacity (max_total_num_works)
constexpr double kTolerance = 2e-2;  // max |out - ref| / max |ref| of a checked sequence

enum class Backend { Fa2, Fa3 };
static const char* backend_name(Backend b) {
  return b == Backend::Fa3 ? "flashinfer-mla-fa3" : "flashinfer-mla-fa2";
}

// One input set of a shape: its own cache, page order, q and output.
struct Case {
  int B = 0, H = 0, CTX = 0, BS = 64, QL = 1;
  KvDtype kvt = KvDtype::BF16;
  int pages_per_seq = 0, num_pages = 0;
  void* cache = nullptr;  // [num_pages][BS][576] of kvt
  nv_bfloat16 *q = nullptr, *o = nullptr;
  int* kv_indices = nullptr;                                          // device page table (CSR)
  std::vector<int> qo_indptr_h, kv_indptr_h, kv_len_h, kv_indices_h;  // host copies

  // The pool: the pages the sequences need, plus 10%, shuffled.
  void layout() {
    pages_per_seq = (CTX + BS - 1) / BS;
    num_pages = B * pages_per_seq + (B * pages_per_seq + 9) / 10;
  }
  size_t rows() const { return (size_t)B * QL; }
  size_t cache_elems() const { return (size_t)num_pages * BS * kWidth; }
  double cache_bytes() const { return (double)cache_elems() * kv_dtype_bytes(kvt); }
  size_t q_elems() const { return rows() * H * kWidth; }
  size_t o_elems() const { return rows() * H * kRank; }
  // The latent bytes one call must read: each request's context once, whatever its q_len.
  double read_bytes() const { return (double)B * CTX * kWidth * kv_dtype_bytes(kvt); }
};

// A standard normal value per index (Box-Muller over two 24-bit uniforms), so q and the cache
// have the statistics pagedattn-bench --mla gives its own (normal, fp8 codes of normal / scale).
__device__ __forceinline__ float normal_at(uint64_t seed, size_t i) {
  const uint64_t r = splitmix64(seed * 0x100000001B3ull + i);
  const float u1 = ((float)(r >> 40) + 1.0f) / 16777217.0f;  // (0, 1]
  const float u2 = (float)((r >> 16) & 0xFFFFFFu) / 16777216.0f;
  return sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
}
__global__ void fill_normal_bf16(nv_bfloat16* x, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    x[i] = __float2bfloat16(normal_at(seed, i));
}
__global__ void fill_normal_e4m3(__nv_fp8_e4m3* x, size_t n, uint64_t seed, float inv_scale) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    x[i] = __nv_fp8_e4m3(normal_at(seed, i) * inv_scale);  // saturating, never NaN
}

static void make_case(Case& c, uint64_t seed) {
  c.layout();
  std::vector<int> perm(c.num_pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::mt19937_64 rng(seed);
  std::shuffle(perm.begin(), perm.end(), rng);  // request b gets perm[b * pps, (b + 1) * pps)
  c.kv_indices_h.assign(perm.begin(), perm.begin() + (size_t)c.B * c.pages_per_seq);
  c.qo_indptr_h.resize(c.B + 1);
  c.kv_indptr_h.resize(c.B + 1);
  for (int b = 0; b <= c.B; ++b)
    c.qo_indptr_h[b] = b * c.QL, c.kv_indptr_h[b] = b * c.pages_per_seq;
  c.kv_len_h.assign(c.B, c.CTX);
  c.kv_indices = upload(c.kv_indices_h);
  CK(cudaMalloc(&c.cache, c.cache_elems() * kv_dtype_bytes(c.kvt)));
  CK(cudaMalloc(&c.q, c.q_elems() * sizeof(nv_bfloat16)));
  CK(cudaMalloc(&c.o, c.o_elems() * sizeof(nv_bfloat16)));
  if (c.kvt == KvDtype::E4M3)
    fill_normal_e4m3<<<2048, 256>>>(static_cast<__nv_fp8_e4m3*>(c.cache), c.cache_elems(),
                                    seed * 3 + 1, 1.0f / kFp8Scale);
  else
    fill_normal_bf16<<<2048, 256>>>(static_cast<nv_bfloat16*>(c.cache), c.cache_elems(),
                                    seed * 3 + 1);
  fill_normal_bf16<<<1024, 256>>>(c.q, c.q_elems(), seed * 3 + 2);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
}
static void free_case(Case& c) {
  for (void* p : {c.cache, (void*)c.q, (void*)c.o, (void*)c.kv_indices}) CK(cudaFree(p));
}

// ---- What the wrapper's plan() refuses before it calls MLAPlan (mla/_batch_mla/_backends/
// _fa_common.py), mirrored so that a shape it would refuse is skipped with its reason instead of
// overflowing MLAPlan's fixed work lists or silently dropping keys.
struct Device {
  int sm_count = 0, smem_per_sm = 0, major = 0, minor = 0;
};
// The cluster MLAPlan picks: 2 CTAs when the average packed (token, head) rows exceed 64.
static int cluster_size(const Case& c) { return (c.QL * c.H) > 64 ? 2 : 1; }
static std::string plan_refusal(const Case& c, Backend be, const Device& dev) {
  const int cluster = cluster_size(c), clusters = dev.sm_count / cluster, tile = 64 * cluster;
  const bool causal = c.QL > 1;
  // _fa_plan_work_count: works = sum over (request, query tile) of its KV chunks.
  const int64_t tiles_per_req = (int64_t(c.QL) * c.H + tile - 1) / tile;
  if (tiles_per_req * c.B > kMaxWorks)
    return "needs " + std::to_string(tiles_per_req * c.B) + " query tiles; MLAPlan holds " +
           std::to_string(kMaxWorks) + " work items";
  std::vector<int64_t> eff;
  for (int64_t i = 0; i < tiles_per_req; ++i) {
    const int64_t kv = c.CTX;
    eff.push_back(causal && i + 1 != tiles_per_req
                      ? std::max<int64_t>(
                            std::min<int64_t>(kv - c.QL + ((i + 1) * tile + c.H - 1) / c.H, kv), 0)
                      : kv);
  }
  int64_t total = 0;
  for (int64_t e : eff) total += e * c.B;
  const int64_t avg = std::max<int64_t>((total + clusters - 1) / clusters, 1);
  const int64_t limit = avg <= 8    ? 32
                        : avg <= 16 ? 64
                        : avg <= 32 ? 128
                        : avg <= 64 ? 192
                                    : (avg + 255) / 256 * 256;
  int64_t works = 0;
  for (int64_t e : eff) works += std::max<int64_t>(1, (e + limit - 1) / limit) * c.B;
  if (works > kMaxWorks)
    return "needs " + std::to_string(works) + " work items with its KV splits; MLAPlan holds " +
           std::to_string(kMaxWorks);
  // _validate_fa_causal_tile_bound: when a cluster's query tile ends inside a token's heads and
  // the last key that token may see starts a KV tile, the kernels' causal bound drops that key.
  if (causal && tile % c.H != 0) {
    const int tile_kv = be == Backend::Fa3          ? 64
                        : c.kvt == KvDtype::E4M3    ? 32
                        : dev.smem_per_sm >= 221696 ? 64
                        : dev.smem_per_sm >= 147968 ? 32
                                                    : 16;
    for (int end = tile; end < c.QL * c.H; end += tile) {
      const int query = end / c.H, rem = end % c.H, key = c.CTX - c.QL + query;
      if (rem && query < c.QL && key >= 0 && key < c.CTX && key % tile_kv == 0)
        return "causal tile boundary FlashInfer refuses (heads " + std::to_string(c.H) +
               ", query " + std::to_string(query) + ", key " + std::to_string(key) + ")";
    }
  }
  return "";
}

// ---- Plan: csrc/batch_mla_plan.cu's MLAPlan call with what the wrapper's plan() passes:
// qo_indptr (host) = arange(B + 1) * q_len, kv_indptr (host, pages), kv_len (host, tokens),
// num_heads, head_dim_o = kv_lora_rank, causal (q_len > 1 here, the mask run() gets). MLAPlan
// writes the work lists into the pinned buffer and returns how many bytes of it to stage; the
// module's plan adapter then copies that prefix to the device int workspace, as done here.
// The plan depends on the lengths and the shape only (not on page ids or data), so one plan
// serves every rotated set of a shape.
struct Plan {
  MLAPlanInfo info{};
  size_t staged = 0;
  int works = 0, split_works = 0;
};
static void mla_plan(const Case& c, Workspace& ws, cudaStream_t s, Plan& p) {
  std::vector<int32_t> qo(c.qo_indptr_h), kvp(c.kv_indptr_h), kvl(c.kv_len_h);
  CK(MLAPlan<int32_t>(ws.fbuf, ws.fbytes, ws.ibuf, ws.ibuf_h, ws.ibytes, p.info, p.staged,
                      qo.data(), kvp.data(), kvl.data(), c.B, c.H, /*head_dim_o=*/kRank,
                      /*causal=*/c.QL > 1, s));
  if (p.staged > ws.ibytes) FLASHINFER_ERROR("MLAPlan staged more than the int workspace");
  CK(cudaMemcpyAsync(ws.ibuf, ws.ibuf_h, p.staged, cudaMemcpyHostToDevice, s));
  CK(cudaStreamSynchronize(s));
  const int32_t* wi = GetPtrFromBaseOffset<int32_t>(ws.ibuf_h, p.info.work_indptr_offset);
  const int32_t* pi = GetPtrFromBaseOffset<int32_t>(ws.ibuf_h, p.info.partial_indptr_offset);
  p.works = wi[p.info.num_blks_y];
  p.split_works = 0;
  for (int i = 0; i < p.works; ++i) p.split_works += pi[i] != -1;
}
static std::string plan_str(const Plan& p) {
  return "cluster=" + std::to_string(p.info.num_blks_x) + " CTA(s) x " +
         std::to_string(p.info.num_blks_y) + " clusters, works=" + std::to_string(p.works) + " (" +
         std::to_string(p.split_works) + " of them KV-split and merged)";
}

// ---- Run: csrc/batch_mla_run.cu / batch_mla_sm90_run.cu with what the wrapper's run() passes:
// the plan's work lists from the int workspace, partial outputs in the float workspace, strides of
// the packed q and the combined cache (elements), no lse, sm_scale, and the fp8 scales
// (ckv_scale = kpe_scale = kFp8Scale for an e4m3 cache, else 1; no per-group scale array).
template <typename KV>
using Params = MLAParams<nv_bfloat16, KV, nv_bfloat16, int32_t>;

template <typename KV>
static Params<KV> make_params(const Case& c, const Plan& plan, const Workspace& ws) {
  Params<KV> p{};
  void* ib = ws.ibuf;
  const MLAPlanInfo& pi = plan.info;
  p.q_nope = c.q;
  p.q_pe = c.q + kRank;
  p.ckv = static_cast<KV*>(c.cache);
  p.kpe = static_cast<KV*>(c.cache) + kRank;
  p.q_indptr = GetPtrFromBaseOffset<int32_t>(ib, pi.q_indptr_offset);
  p.kv_indptr = GetPtrFromBaseOffset<int32_t>(ib, pi.kv_indptr_offset);
  p.partial_indptr = GetPtrFromBaseOffset<int32_t>(ib, pi.partial_indptr_offset);
  p.kv_indices = c.kv_indices;
  p.q_len = GetPtrFromBaseOffset<int32_t>(ib, pi.q_len_offset);
  p.kv_len = GetPtrFromBaseOffset<int32_t>(ib, pi.kv_len_offset);
  p.q_start = GetPtrFromBaseOffset<int32_t>(ib, pi.q_start_offset);
  p.kv_start = GetPtrFromBaseOffset<int32_t>(ib, pi.kv_start_offset);
  p.kv_end = GetPtrFromBaseOffset<int32_t>(ib, pi.kv_end_offset);
  p.work_indptr = GetPtrFromBaseOffset<int32_t>(ib, pi.work_indptr_offset);
  p.merge_packed_offset_start =
      GetPtrFromBaseOffset<int32_t>(ib, pi.merge_packed_offset_start_offset);
  p.merge_packed_offset_end = GetPtrFromBaseOffset<int32_t>(ib, pi.merge_packed_offset_end_offset);
  p.merge_partial_packed_offset_start =
      GetPtrFromBaseOffset<int32_t>(ib, pi.merge_partial_packed_offset_start_offset);
  p.merge_partial_packed_offset_end =
      GetPtrFromBaseOffset<int32_t>(ib, pi.merge_partial_packed_offset_end_offset);
  p.merge_partial_stride = GetPtrFromBaseOffset<int32_t>(ib, pi.merge_partial_stride_offset);
  p.final_o = c.o;
  p.final_lse = nullptr;
  p.partial_o = GetPtrFromBaseOffset<nv_bfloat16>(ws.fbuf, pi.partial_o_offset);
  p.partial_lse = GetPtrFromBaseOffset<float>(ws.fbuf, pi.partial_lse_offset);
  p.num_heads = uint_fastdiv(c.H);
  p.block_size = uint_fastdiv(c.BS);
  p.q_nope_stride_n = p.q_pe_stride_n = (uint32_t)c.H * kWidth;  // q: [rows][H][576]
  p.q_nope_stride_h = p.q_pe_stride_h = kWidth;
  p.ckv_stride_page = p.kpe_stride_page = (uint32_t)c.BS * kWidth;  // cache: [pages][BS][576]
  p.ckv_stride_n = p.kpe_stride_n = kWidth;
  p.o_stride_n = (uint32_t)c.H * kRank;  // out: [rows][H][512]
  p.o_stride_h = kRank;
  p.sm_scale = (float)(1.0 / std::sqrt((double)kWidth));
  const bool fp8 = std::is_same_v<KV, __nv_fp8_e4m3>;
  p.ckv_scale = fp8 ? kFp8Scale : 1.f;
  p.kpe_scale = fp8 ? kFp8Scale : 1.f;
  p.ckv_scale_arr = nullptr;
  p.return_lse_base_on_e = false;
  return p;
}

// The kernels built: head dims 512 / 64, bf16 q and output, bf16 or e4m3 cache, MaskMode kNone
// (q_len 1) or kCausal (q_len > 1), each on the fa2 and the Hopper kernel; the JIT module
// instantiates the same set per dtype (DISPATCH_MASK_MODE also builds kCustom, which both
// entry points refuse).
template <typename KV, MaskMode MASK>
static cudaError_t launch(Backend be, const Params<KV>& p, const Plan& plan, cudaStream_t s) {
  if (be == Backend::Fa3)
    return mla::BatchMLAPageAttentionHopper<MASK, kRank, kRope>(p, plan.info.num_blks_x,
                                                                plan.info.num_blks_y, s);
  return mla::BatchMLAPagedAttention<MASK, kRank, kRope>(p, plan.info.num_blks_x,
                                                         plan.info.num_blks_y, s);
}
template <typename KV>
static cudaError_t run_kv(Backend be, const Case& c, const Plan& plan, const Workspace& ws,
                          cudaStream_t s) {
  const Params<KV> p = make_params<KV>(c, plan, ws);
  return c.QL > 1 ? launch<KV, MaskMode::kCausal>(be, p, plan, s)
                  : launch<KV, MaskMode::kNone>(be, p, plan, s);
}
static cudaError_t mla_run(Backend be, const Case& c, const Plan& plan, const Workspace& ws,
                           cudaStream_t s) {
  if (c.kvt == KvDtype::E4M3) return run_kv<__nv_fp8_e4m3>(be, c, plan, ws, s);
  return run_kv<nv_bfloat16>(be, c, plan, ws, s);
}

// ---- Reference: sequence b of a set in double precision on the host. The combined row is
// [c | k_pe] and the query row [q_nope | q_pe], so a logit is scale x one dot product over 576.
static std::vector<double> ref_sequence(const Case& c, int b) {
  const size_t row_elems = (size_t)c.BS * kWidth, eb = kv_dtype_bytes(c.kvt);
  std::vector<uint8_t> raw((size_t)c.pages_per_seq * row_elems * eb);
  for (int j = 0; j < c.pages_per_seq; ++j) {
    const int page = c.kv_indices_h[(size_t)c.kv_indptr_h[b] + j];
    CK(cudaMemcpy(raw.data() + (size_t)j * row_elems * eb,
                  static_cast<const uint8_t*>(c.cache) + (size_t)page * row_elems * eb,
                  row_elems * eb, cudaMemcpyDeviceToHost));
  }
  std::vector<double> kv((size_t)c.CTX * kWidth);  // token t's row, dequantised
  for (size_t i = 0; i < kv.size(); ++i)
    kv[i] =
        c.kvt == KvDtype::E4M3
            ? (double)static_cast<float>(reinterpret_cast<const __nv_fp8_e4m3*>(raw.data())[i]) *
                  kFp8Scale
            : (double)static_cast<float>(reinterpret_cast<const nv_bfloat16*>(raw.data())[i]);
  const size_t q_row = (size_t)c.H * kWidth;
  std::vector<nv_bfloat16> qh((size_t)c.QL * q_row);
  CK(cudaMemcpy(qh.data(), c.q + (size_t)b * c.QL * q_row, qh.size() * sizeof(nv_bfloat16),
                cudaMemcpyDeviceToHost));
  std::vector<double> out((size_t)c.QL * c.H * kRank);
  const double scale = 1.0 / std::sqrt((double)kWidth);
  auto head = [&](int i, int h) {  // query token i, head h
    const int len = c.CTX - c.QL + 1 + i;
    double qd[kWidth];
    for (int d = 0; d < kWidth; ++d)
      qd[d] = (double)static_cast<float>(qh[(size_t)i * q_row + (size_t)h * kWidth + d]);
    std::vector<double> sc(len);
    double m = -INFINITY, sum = 0;
    for (int t = 0; t < len; ++t) {
      const double* r = &kv[(size_t)t * kWidth];
      double acc = 0;
      for (int d = 0; d < kWidth; ++d) acc += qd[d] * r[d];
      m = std::max(m, sc[t] = acc * scale);
    }
    double* o = &out[((size_t)i * c.H + h) * kRank];
    std::fill(o, o + kRank, 0.0);
    for (int t = 0; t < len; ++t) {
      const double w = std::exp(sc[t] - m);
      sum += w;
      const double* r = &kv[(size_t)t * kWidth];
      for (int d = 0; d < kRank; ++d) o[d] += w * r[d];
    }
    for (int d = 0; d < kRank; ++d) o[d] /= sum;
  };
  const int jobs = c.QL * c.H;
  const int nthreads =
      (int)std::max(1u, std::min<unsigned>(std::thread::hardware_concurrency(), jobs));
  std::vector<std::thread> pool;
  for (int w = 0; w < nthreads; ++w)
    pool.emplace_back([&, w] {
      for (int j = w; j < jobs; j += nthreads) head(j / c.H, j % c.H);
    });
  for (auto& t : pool) t.join();
  return out;
}

// max |out - ref| / max |ref| over sequence b's rows of c.o; a NaN or Inf gives +inf.
static double rel_err(const Case& c, int b, const std::vector<double>& ref) {
  std::vector<nv_bfloat16> o(ref.size());
  CK(cudaMemcpy(o.data(), c.o + (size_t)b * c.QL * c.H * kRank, o.size() * sizeof(nv_bfloat16),
                cudaMemcpyDeviceToHost));
  double err = 0, mx = 1e-30;
  for (size_t i = 0; i < o.size(); ++i) {
    const double got = (double)static_cast<float>(o[i]);
    mx = std::max(mx, std::fabs(ref[i]));
    err = std::isfinite(got) ? std::max(err, std::fabs(got - ref[i]))
                             : std::numeric_limits<double>::infinity();
  }
  return err / mx;
}
// Whether every element of c.o is finite (the output is poisoned with NaN before a check).
static bool all_finite(const Case& c) {
  std::vector<nv_bfloat16> o(c.o_elems());
  CK(cudaMemcpy(o.data(), c.o, o.size() * sizeof(nv_bfloat16), cudaMemcpyDeviceToHost));
  for (const nv_bfloat16& x : o)
    if (!std::isfinite(static_cast<float>(x))) return false;
  return true;
}
static void poison(const Case& c, cudaStream_t s) {
  CK(cudaMemsetAsync(c.o, 0xFF, c.o_elems() * sizeof(nv_bfloat16), s));
}

struct Options {
  std::vector<Case> shapes;
  std::vector<Backend> backends{Backend::Fa2, Backend::Fa3};
  int page = 64, q_len = 1, iters = 30, reps = 100;
  KvDtype kvt = KvDtype::BF16;
  bool csv = false, rotate = true;
  uint64_t seed = 1234;
};

static void print_header(const Options& o) {
  if (o.csv)
    printf(
        "backend,dtype,kv_dtype,batch,heads,context,block_size,q_len,ms,gbps,ms_plain,rel_err,"
        "sets\n");
  else
    printf("%-18s %-5s %-8s %5s %4s %7s %4s %5s %10s %8s %10s %9s %4s\n", "impl", "dtype", "kv",
           "B", "H", "ctx", "BS", "q_len", "ms", "GB/s", "ms_plain", "rel_err", "sets");
  fflush(stdout);
}

// One row: plan once, check the first and last sequences of set 0 after a plain call, time plain
// calls and graph replays over the sets, check again after a replay.
static bool bench_backend(Backend be, std::vector<Case>& sets,
                          const std::vector<std::vector<double>>& refs,
                          const std::vector<int>& checked, Workspace& ws, const Options& opt,
                          const Device& dev, cudaStream_t s) {
  const Case& c = sets[0];
  const char* name = backend_name(be);
  if (be == Backend::Fa3 && dev.major != 9) {
    fprintf(stderr, "#   %s: skipped (the Hopper MLA kernel needs sm_90, this is sm_%d%d)\n", name,
            dev.major, dev.minor);
    return true;
  }
  const std::string why = plan_refusal(c, be, dev);
  if (!why.empty()) {
    fprintf(stderr, "#   %s: skipped, FlashInfer's plan() refuses this shape: %s\n", name,
            why.c_str());
    return true;
  }
  Plan plan;
  mla_plan(c, ws, s, plan);
  fprintf(stderr, "#   %s plan: %s\n", name, plan_str(plan).c_str());
  const int S = (int)sets.size();
  auto run = [&](int i) { return mla_run(be, sets[i % S], plan, ws, s); };

  double err = 0;
  bool ok = true;
  auto check_set0 = [&](const char* when) {
    for (size_t k = 0; k < checked.size(); ++k) {
      const double e = rel_err(sets[0], checked[k], refs[k]);
      err = std::max(err, e);
      if (!(e <= kTolerance)) {
        ok = false;
        fprintf(stderr, "#   %s: sequence %d after %s: rel_err %.3g > %.3g\n", name, checked[k],
                when, e, kTolerance);
      }
    }
  };
  poison(sets[0], s);
  CK(run(0));
  CK(cudaStreamSynchronize(s));
  check_set0("a plain call");

  EventTimer timer;
  const std::vector<double> tp = time_plain_calls(timer, s, S, opt.reps, run);

  // A batch of kGraphCalls calls, one per set in turn: a CUDA graph of them, or, should this
  // driver refuse to capture the cooperative launches, the same calls launched back to back
  // (then ms includes their launch cost, and the log says so).
  cudaGraph_t g = nullptr;
  cudaGraphExec_t ge = nullptr;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  cudaError_t st = cudaSuccess;
  for (int i = 0; i < kGraphCalls && st == cudaSuccess; ++i) st = run(i);
  const cudaError_t se = cudaStreamEndCapture(s, &g);
  const bool graph =
      st == cudaSuccess && se == cudaSuccess && cudaGraphInstantiate(&ge, g, 0) == cudaSuccess;
  if (!graph) {
    (void)cudaGetLastError();
    fprintf(stderr,
            "#   %s: CUDA-graph capture failed (run: %s, end capture: %s); ms times %d plain "
            "calls back to back instead\n",
            name, cudaGetErrorString(st), cudaGetErrorString(se), kGraphCalls);
  }
  auto batch = [&] {
    if (graph) {
      CK(cudaGraphLaunch(ge, s));
    } else {
      for (int i = 0; i < kGraphCalls; ++i) CK(run(i));
    }
  };
  const char* batch_name = graph ? "a graph replay" : "a batch of plain calls";
  for (const Case& set : sets) poison(set, s);  // one batch must rewrite every set's output
  batch();
  CK(cudaStreamSynchronize(s));
  check_set0(batch_name);
  for (int i = 0; i < S; ++i)
    if (!all_finite(sets[i])) {
      ok = false;
      fprintf(stderr, "#   %s: set %d's output has NaN/Inf after %s\n", name, i, batch_name);
    }
  for (int i = 0; i < 3; ++i) batch();  // warm-up
  std::vector<double> tg;
  for (int i = 0; i < opt.iters; ++i) tg.push_back(timer.ms(s, batch) / kGraphCalls);
  if (ge) CK(cudaGraphExecDestroy(ge));
  if (g) CK(cudaGraphDestroy(g));

  const double ms = median(tg), ms_plain = median(tp), gbps = c.read_bytes() / (ms * 1e-3) / 1e9;
  char err_s[32];
  snprintf(err_s, sizeof err_s, "%s%.3g", ok ? "" : "FAIL:", err);
  if (opt.csv)
    printf("%s,bf16,%s,%d,%d,%d,%d,%d,%.4f,%.1f,%.4f,%s,%d\n", name, kv_dtype_name(c.kvt), c.B, c.H,
           c.CTX, c.BS, c.QL, ms, gbps, ms_plain, err_s, S);
  else
    printf("%-18s %-5s %-8s %5d %4d %7d %4d %5d %10.4f %8.1f %10.4f %9s %4d\n", name, "bf16",
           kv_dtype_name(c.kvt), c.B, c.H, c.CTX, c.BS, c.QL, ms, gbps, ms_plain, err_s, S);
  fflush(stdout);
  return ok;
}

static bool bench_shape(const Case& shape, Workspace& ws, const Options& opt, const Device& dev,
                        size_t l2, cudaStream_t s) {
  Case sized = shape;
  sized.layout();
  const int S = rotation_sets(sized.cache_bytes(), opt.rotate);
  std::vector<Case> sets(S, shape);
  for (int i = 0; i < S; ++i) make_case(sets[i], opt.seed + i);
  const Case& c = sets[0];
  fprintf(stderr,
          "# shape B=%d H=%d CTX=%d page=%d q_len=%d kv=%s: %d pages, latent read %.1f MiB, "
          "sets=%d (caches %.1f MiB in all)%s\n",
          c.B, c.H, c.CTX, c.BS, c.QL, kv_dtype_name(c.kvt), c.num_pages,
          c.read_bytes() / (1 << 20), S, S * c.cache_bytes() / (1 << 20),
          S * c.read_bytes() < 2.0 * l2 ? " (fits in ~2x L2: GB/s may exceed HBM bandwidth)" : "");
  std::vector<int> checked{0};
  if (c.B > 1) checked.push_back(c.B - 1);
  std::vector<std::vector<double>> refs;
  for (int b : checked) refs.push_back(ref_sequence(c, b));
  bool ok = true;
  for (Backend be : opt.backends) ok &= bench_backend(be, sets, refs, checked, ws, opt, dev, s);
  for (Case& set : sets) free_case(set);
  return ok;
}

// B,H,CTX[,PAGE], or pagedattn-bench --mla's B,H,1,576,CTX[,PAGE], so one shape list serves both.
static bool parse_shape(const char* text, int page, Case& c) {
  std::vector<long> v;
  for (const std::string& t : split_commas(text)) {
    char* end = nullptr;
    const long x = std::strtol(t.c_str(), &end, 10);
    if (t.empty() || *end != '\0') return false;
    v.push_back(x);
  }
  c = Case{};
  if (v.size() == 3 || v.size() == 4) {
    c.B = (int)v[0], c.H = (int)v[1], c.CTX = (int)v[2], c.BS = v.size() == 4 ? (int)v[3] : page;
  } else if ((v.size() == 5 || v.size() == 6) && v[2] == 1 && v[3] == kWidth) {
    c.B = (int)v[0], c.H = (int)v[1], c.CTX = (int)v[4], c.BS = v.size() == 6 ? (int)v[5] : page;
  } else {
    return false;
  }
  return c.B > 0 && c.H > 0 && c.H <= 256 && c.CTX > 0 && c.BS > 0 && v[0] <= (1 << 20) &&
         v[1] <= 256 && c.CTX <= (1 << 24) && c.BS <= (1 << 16);
}

static int usage(const char* argv0) {
  fprintf(stderr,
          "usage: %s [--shape B,H,CTX[,PAGE]]... [--page P] [--q-len N] "
          "[--kv-dtype bf16|fp8_e4m3] [--backend fa2|fa3|both] [--csv] [--iters N] [--reps N] "
          "[--no-rotate] [--seed S]\n"
          "  --shape    batch, query heads (<= 256), context per sequence, page size (default "
          "--page);\n"
          "             also B,H,1,576,CTX[,PAGE] as pagedattn-bench --mla takes it. Default: "
          "batch 1/32/128 x heads 16/64/128 x context 1024/4096/32768\n"
          "  --page P   page (block) size of shapes that do not name one (default 64)\n"
          "  --q-len N  query tokens per request, causal (default 1)\n"
          "  --kv-dtype bf16 (default) or fp8_e4m3 (scales 0.5; q and output stay bf16)\n"
          "  --backend  fa2 (mla.cuh), fa3 (mla_hopper.cuh, sm_90) or both (default)\n"
          "  --csv      CSV on stdout (else a table)\n"
          "  --iters N  timed CUDA-graph replays of %d calls (default 30)\n"
          "  --reps N   timed plain calls (default 100)\n",
          argv0, kGraphCalls);
  return 1;
}

int main(int argc, char** argv) {
  Options opt;
  std::vector<std::string> shape_args;
  FlagReader flags(argc, argv);
  while (flags.next_flag()) {
    const std::string& a = flags.flag();
    if (a == "--shape") {
      shape_args.push_back(flags.value());
    } else if (a == "--page") {
      opt.page = flags.integer(1, 1 << 16);
    } else if (a == "--q-len") {
      opt.q_len = flags.integer(1, 1 << 16);
    } else if (a == "--kv-dtype") {  // e5m2 is taken only to be refused with a clear line
      opt.kvt = flags.choice<KvDtype>({{"bf16", KvDtype::BF16},
                                       {"fp8_e4m3", KvDtype::E4M3},
                                       {"fp8", KvDtype::E4M3},
                                       {"fp8_e5m2", KvDtype::E5M2}},
                                      "want bf16 or fp8_e4m3");
    } else if (a == "--backend") {
      opt.backends = flags.choice<std::vector<Backend>>({{"fa2", {Backend::Fa2}},
                                                         {"fa3", {Backend::Fa3}},
                                                         {"both", {Backend::Fa2, Backend::Fa3}}},
                                                        "want fa2, fa3 or both");
    } else if (a == "--csv") {
      opt.csv = true;
    } else if (a == "--iters") {
      opt.iters = flags.integer(1, 1000000);
    } else if (a == "--reps") {
      opt.reps = flags.integer(1, 1000000);
    } else if (a == "--no-rotate") {
      opt.rotate = false;
    } else if (a == "--seed") {
      opt.seed = std::strtoull(flags.value().c_str(), nullptr, 10);
    } else {
      return usage(argv[0]);
    }
  }
  for (const std::string& t : shape_args) {  // after the loop: --page may follow --shape
    Case c;
    if (!parse_shape(t.c_str(), opt.page, c)) {
      fprintf(stderr, "bad --shape '%s': want B,H,CTX[,PAGE] (or B,H,1,576,CTX[,PAGE]), H <= 256\n",
              t.c_str());
      return 1;
    }
    opt.shapes.push_back(c);
  }
  if (opt.shapes.empty())
    for (int b : {1, 32, 128})
      for (int h : {16, 64, 128})
        for (int ctx : {1024, 4096, 32768}) {
          Case c;
          c.B = b, c.H = h, c.CTX = ctx, c.BS = opt.page;
          opt.shapes.push_back(c);
        }
  for (Case& c : opt.shapes) {
    if (c.CTX < opt.q_len) {  // the wrapper needs every kv_len >= its q_len
      fprintf(stderr, "--q-len %d needs context >= %d; a shape has context %d\n", opt.q_len,
              opt.q_len, c.CTX);
      return 1;
    }
    c.QL = opt.q_len;
    c.kvt = opt.kvt;
  }

  print_header(opt);
  if (opt.kvt == KvDtype::E5M2) {
    fprintf(
        stderr,
        "# --kv-dtype fp8_e5m2: not supported by FlashInfer 0.7.2's MLA decode (its fa2 and fa3 "
        "kernels take bf16, f16 or fp8_e4m3 caches); no rows\n");
    return 0;
  }
  try {
    int id;
    cudaDeviceProp prop;
    CK(cudaGetDevice(&id));
    CK(cudaGetDeviceProperties(&prop, id));
    Device dev;
    dev.sm_count = prop.multiProcessorCount;
    dev.major = prop.major;
    dev.minor = prop.minor;
    CK(cudaDeviceGetAttribute(&dev.smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, id));
    fprintf(stderr,
            "# device: %s (sm_%d%d, %d SMs, L2 %d MiB, %d KiB shared memory per SM); flashinfer "
            "0.7.2 MLA decode, kv_lora_rank %d, rope %d, q_len=%d, kv_dtype=%s, graph=%d calls x "
            "%d replays, plain reps=%d, rotate=%d\n",
            prop.name, prop.major, prop.minor, prop.multiProcessorCount, prop.l2CacheSize >> 20,
            dev.smem_per_sm >> 10, kRank, kRope, opt.q_len, kv_dtype_name(opt.kvt), kGraphCalls,
            opt.iters, opt.reps, (int)opt.rotate);
    if (prop.major != 9 || prop.minor != 0)
      fprintf(stderr, "# WARNING: this binary holds sm_90a code only\n");
    if (opt.kvt == KvDtype::E4M3 && prop.major != 9) {
      fprintf(stderr,
              "# --kv-dtype fp8_e4m3: FlashInfer 0.7.2's MLA takes an fp8 cache on sm_90 only; no "
              "rows\n");
      return 0;
    }
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    Workspace ws;
    alloc_workspace(ws);
    bool all_ok = true;
    for (const Case& c : opt.shapes) all_ok &= bench_shape(c, ws, opt, dev, prop.l2CacheSize, s);
    free_workspace(ws);
    CK(cudaStreamDestroy(s));
    if (!all_ok) fprintf(stderr, "# one or more checks FAILED\n");
    return all_ok ? 0 : 1;
  } catch (const std::exception& e) {  // flashinfer::Error
    fprintf(stderr, "FATAL: %s\n", e.what());
    return 3;
  }
}
