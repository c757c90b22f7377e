#include "decode_call.hpp"

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cfloat>
#include <climits>
#include <cmath>
#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "argument_error.hpp"
#include "cache_tensors.hpp"
#include "device.hpp"
#include "kv_scales.hpp"
#include "pagedattn/pagedattn.hpp"
#include "pagedattn/tree_mask.hpp"
#include "sequence_tensors.hpp"
#include "tensor_import.hpp"

namespace pagedattn::py {
namespace {

using namespace nb::literals;

// One decode call's arguments, with the imports that keep its tensors alive until it returns.
struct DecodeCall {
  pagedattn::DecodeArgs args;
  pagedattn::DecodeOptions options;
  Device device;  // q's, which every tensor shares
  Tensor q, k, v, table, lens;
  Tensor q_indptr, tree_mask, tree_mask_indptr, out, lse, alibi_slopes, sinks, workspace;
  KvScales scales;
  TokenScales token_scales;
};

// q's and out's dimensions: a row per sequence, or with multi-token queries a row per query token.
const char* q_dims(bool query_tokens) {
  return query_tokens ? "[num_q_tokens, num_heads, head_dim]" : "[batch, num_heads, head_dim]";
}

// The sizes decode and its workspace depend on, but for the batch and the query tokens.
void set_decode_shape(pagedattn::DecodeArgs& a, const Tensor& q, const Tensor& k,
                      const Tensor& table, KvLayout layout) {
  a.num_heads = q.dim_int(1);
  a.head_dim = q.dim_int(2);
  const PoolDims pool = pool_dims(k, layout);
  a.num_blocks = pool.num_blocks;
  a.num_kv_heads = pool.num_kv_heads;
  a.block_size = pool.block_size;
  a.max_blocks_per_seq = table.dim_int(1);
}

// Reads and checks the decode tensors (everything but `out`, `lse`, the workspace and the
// optional per-head and per-sequence inputs). With multi-token queries (`query_tokens`) q has a
// row per query token, so the batch comes from context_lens instead of q. The caches' dimensions
// are read in `layout`.
DecodeCall decode_inputs(nb::handle q_h, nb::handle k_h, nb::handle v_h, nb::handle table_h,
                         nb::handle lens_h, const std::vector<std::string>& tags, bool query_tokens,
                         KvLayout layout) {
  DecodeCall c;
  Tensor& q = c.q = input(q_h, "q", tags);
  Tensor& k = c.k = input(k_h, "k_cache", tags);
  Tensor& v = c.v = input(v_h, "v_cache", tags);
  Tensor& table = c.table = input(table_h, "block_table");
  Tensor& lens = c.lens = input(lens_h, "context_lens");

  q.require_ndim(3, q_dims(query_tokens));
  k.require_ndim(4, layout.dims());
  v.require_ndim(4, layout.dims());
  table.require_ndim(2, "[batch, max_blocks_per_seq]");
  lens.require_ndim(1, "[batch]");

  auto& a = c.args;
  a.q_dtype = q.float_dtype();
  a.k_dtype = a.v_dtype = shared_float_dtype(k, v);
  table.require_int32();
  lens.require_int32();

  v.require_shape_of(k);
  require_cache_head_dim(k, q.shape[2]);
  if (query_tokens) {
    table.require_dim(0, lens.shape[0], "batch, context_lens.shape[0]");
  } else {
    table.require_dim(0, q.shape[0], "batch, q.shape[0]");
    lens.require_dim(0, q.shape[0], "batch, q.shape[0]");
  }

  a.q_row_stride = q.sequence_stride();
  a.kv_strides = cache_strides(k, v, layout);
  lens.require_contiguous();
  a.block_table_stride = block_table_stride(table);

  c.device = q.device;
  for (const Tensor* t : {&k, &v, &table, &lens}) t->require_device(c.device, "q");

  a.batch = lens.dim_int(0);
  set_decode_shape(a, q, k, table, layout);

  a.q = q.data;
  a.k_cache = k.data;
  a.v_cache = v.data;
  a.block_table = static_cast<const std::int32_t*>(table.data);
  a.context_lens = static_cast<const std::int32_t*>(lens.data);
  return c;
}

// Multi-token queries: q_indptr int32 [batch + 1] (q_indptr_input). Its values are checked by
// the library (first 0, non-decreasing, last = q.shape[0], each count at most max_q_len).
void read_query_tokens(DecodeCall& c, nb::handle q_indptr_h) {
  auto& a = c.args;
  c.q_indptr = q_indptr_input(q_indptr_h, a.batch, c.q);
  a.q_indptr = static_cast<const std::int32_t*>(c.q_indptr.data);
  a.num_q_tokens = c.q.dim_int(0);
}

// The bytes of tree_mask (in host memory) the library may read: sequence b's
// ceil(n_b * n_b / 8) from byte tree_mask_indptr[b], where its span holds them
// (0 <= tree_mask_indptr[b] and tree_mask_indptr[b + 1] - tree_mask_indptr[b] at least that).
// Where a span does not, the library refuses it before reading that sequence's mask
// (validate_tree_mask), as it refuses negative counts before reading any (validate_q_indptr).
// What it cannot know, and what is checked here, is that each mask it reads ends within the
// tensor.
void check_tree_mask_length(const Tensor& mask, const std::int32_t* q_indptr,
                            const std::int32_t* mask_indptr, int batch) {
  for (int b = 0; b < batch; ++b) {
    const std::int64_t n = static_cast<std::int64_t>(q_indptr[b + 1]) - q_indptr[b];
    if (n <= 0 || n > INT_MAX) continue;
    const std::int64_t first = mask_indptr[b];
    const std::int64_t end = first + tree_mask_bytes(static_cast<int>(n));
    if (first < 0 || end > mask_indptr[b + 1] || end <= mask.numel()) continue;
    std::ostringstream why;
    why << "too short: sequence " << b << "'s " << n << " x " << n << " mask takes bytes [" << first
        << ", " << end << ") (from tree_mask_indptr[" << b << "] = " << first << ")";
    reject(ErrorCode::kInvalidArgument, "tree_mask", ".shape", mask.shape_str(), why.str());
  }
}

// Tree masks over the query tokens: tree_mask, uint8 [bytes] of packed bits, and
// tree_mask_indptr, int32 [batch + 1] byte offsets, both contiguous on q's device, both or
// neither, and only with q_indptr (read before). Their values are checked by the library where
// they are in host memory, after the length of tree_mask is checked here (on CUDA, in checked
// mode only).
void read_tree_mask(DecodeCall& c, nb::handle mask_h, nb::handle indptr_h, bool query_tokens) {
  if (mask_h.is_none() && indptr_h.is_none()) return;
  if (mask_h.is_none() || indptr_h.is_none()) {
    const char* missing = mask_h.is_none() ? "tree_mask" : "tree_mask_indptr";
    const char* given = mask_h.is_none() ? "tree_mask_indptr" : "tree_mask";
    reject(ErrorCode::kInvalidArgument, missing, "", "None",
           std::string("needed with ") + given + " (the two are given together)");
  }
  if (!query_tokens) {
    reject(ErrorCode::kInvalidArgument, "tree_mask", "", "a tensor",
           "given without q_indptr (a tree mask masks a sequence's query tokens)");
  }
  auto& a = c.args;
  Tensor& mask = c.tree_mask = input(mask_h, "tree_mask");
  mask.require_ndim(1, "[bytes] (packed bits)");
  mask.require_uint8();
  mask.require_contiguous();
  mask.require_device(c.device, "q");
  c.tree_mask_indptr = offsets_input(indptr_h, "tree_mask_indptr", a.batch, c.device, "q");
  a.tree_mask_indptr = static_cast<const std::int32_t*>(c.tree_mask_indptr.data);
  if (c.device.kind == DeviceKind::kCpu) {
    check_tree_mask_length(mask, a.q_indptr, a.tree_mask_indptr, a.batch);
  }
  // An empty tensor may have no data pointer; none of its bytes is read (checked above), but
  // null would mean "no tree mask" to the library.
  static const std::uint8_t kNoBytes = 0;
  a.tree_mask = mask.data ? static_cast<const std::uint8_t*>(mask.data) : &kNoBytes;
}

// out, shaped and laid out like q, and lse (f32, out's shape without head_dim) when given.
void read_outputs(DecodeCall& c, nb::handle out_h, nb::handle lse_h,
                  const std::vector<std::string>& tags, bool query_tokens) {
  auto& a = c.args;
  Tensor& out = c.out = output(out_h, "out", tags);
  out.require_ndim(3, q_dims(query_tokens));
  out.require_shape_of(c.q);
  a.out_dtype = out.float_dtype();
  a.out_row_stride = out.sequence_stride();
  out.require_device(c.device, "q");
  a.out = out.data;
  if (lse_h.is_none()) return;
  c.lse = lse_output(lse_h, c.q, query_tokens);
  a.lse = static_cast<float*>(c.lse.data);
}

// A per-head input of the attention variants (alibi_slopes, sinks): f32 [num_heads], contiguous,
// on q's device.
Tensor per_head_input(nb::handle h, const char* name, const DecodeCall& c) {
  return float32_vector_input(h, name, "[num_heads]", c.q.shape[1], "num_heads, q.shape[1]",
                              c.device, "q");
}

// The attention variants; their values are checked by the library (validate.hpp), once the cap
// is a float: a positive cap that would round to 0 (no soft-cap) or overflow is refused here.
void read_variants(DecodeCall& c, int window_left, double logits_soft_cap, nb::handle alibi_h,
                   nb::handle sinks_h) {
  auto& a = c.args;
  a.window_left = window_left;
  a.logits_soft_cap = static_cast<float>(logits_soft_cap);
  if (logits_soft_cap > 0 && std::isfinite(logits_soft_cap) &&
      !(a.logits_soft_cap >= FLT_MIN && std::isfinite(a.logits_soft_cap))) {
    std::ostringstream value, least;
    value << logits_soft_cap;
    least << FLT_MIN;
    reject(ErrorCode::kInvalidArgument, "logits_soft_cap", "", value.str(),
           "outside the float32 range (a positive cap must be at least " + least.str() +
               " and below the largest float)");
  }
  if (!alibi_h.is_none()) {
    c.alibi_slopes = per_head_input(alibi_h, "alibi_slopes", c);
    a.alibi_slopes = static_cast<const float*>(c.alibi_slopes.data);
  }
  if (!sinks_h.is_none()) {
    c.sinks = per_head_input(sinks_h, "sinks", c);
    a.sinks = static_cast<const float*>(c.sinks.data);
  }
}

void decode(nb::handle q, nb::handle k_cache, nb::handle v_cache, nb::handle block_table,
            nb::handle context_lens, nb::handle out_h, nb::handle lse_h,
            std::optional<double> scale, const std::string& backend, std::uintptr_t stream,
            nb::handle workspace_h, bool checked, const std::vector<std::string>& tags,
            int window_left, double logits_soft_cap, nb::handle alibi_h, nb::handle sinks_h,
            nb::handle q_indptr_h, std::optional<int> max_q_len, nb::handle tree_mask_h,
            nb::handle tree_mask_indptr_h, const std::string& kv_layout, double k_scale,
            double v_scale, nb::handle k_scales_h, nb::handle v_scales_h, bool batch_invariant,
            nb::handle k_token_scales_h, nb::handle v_token_scales_h, bool share_prefixes) {
  const bool query_tokens = !q_indptr_h.is_none();
  require_q_indptr_for_max_q_len(query_tokens, max_q_len);
  const KvLayout layout = parse_kv_layout(kv_layout);
  DecodeCall c =
      decode_inputs(q, k_cache, v_cache, block_table, context_lens, tags, query_tokens, layout);
  if (query_tokens) read_query_tokens(c, q_indptr_h);
  read_tree_mask(c, tree_mask_h, tree_mask_indptr_h, query_tokens);
  read_outputs(c, out_h, lse_h, tags, query_tokens);
  if (scale) c.args.scale = static_cast<float>(*scale);
  read_variants(c, window_left, logits_soft_cap, alibi_h, sinks_h);
  c.scales.set(c.args, k_scale, v_scale, k_scales_h, v_scales_h, c.k, layout);
  c.token_scales.read(k_token_scales_h, v_token_scales_h, c.k, layout, /*writable=*/false);
  c.token_scales.set(c.args);

  c.options = decode_options(backend, c.device, "q", stream, checked, batch_invariant, workspace_h,
                             c.workspace);
  c.options.share_prefixes = share_prefixes;

  DeviceGuard guard(c.device);
  nb::gil_scoped_release release;
  if (query_tokens) {
    c.args.max_q_len = resolve_max_q_len(max_q_len, c.q_indptr, c.args.batch, stream);
  }
  pagedattn::decode(c.args, c.options);
}

// With max_q_len (multi-token queries) q is [num_q_tokens, num_heads, head_dim] and the batch is
// the table's rows; the workspace is sized for at most max_q_len query tokens per sequence.
// Only shapes count (the caches' strides change no sizes), so k_cache's dimensions are read in
// `kv_layout` and its strides are not looked at.
std::size_t workspace_size(nb::handle q, nb::handle k_cache, nb::handle block_table,
                           const std::string& backend, std::optional<int> max_q_len,
                           const std::string& kv_layout, const std::vector<std::string>& tags,
                           bool batch_invariant) {
  const KvLayout layout = parse_kv_layout(kv_layout);
  Tensor qt = input(q, "q", tags);
  Tensor k = input(k_cache, "k_cache", tags);
  Tensor table = input(block_table, "block_table");
  qt.require_ndim(3, q_dims(max_q_len.has_value()));
  k.require_ndim(4, layout.dims());
  table.require_ndim(2, "[batch, max_blocks_per_seq]");
  require_cache_head_dim(k, qt.shape[2]);
  if (!max_q_len) table.require_dim(0, qt.shape[0], "batch, q.shape[0]");
  k.require_device(qt.device, "q");
  table.require_device(qt.device, "q");
  if (pick_backend(backend, qt.device, "q") != Backend::kCuda) return 0;

  pagedattn::DecodeArgs a;
  // The kernel, and with it the split plan and the workspace, depends on q's and the cache's
  // dtypes (the tensor-core path for 16-bit q and cache alike; fp8 caches have kernels of their
  // own). out's dtype does not count: q's stands in for it.
  a.q_dtype = a.out_dtype = qt.float_dtype();
  a.k_dtype = a.v_dtype = k.float_dtype();
  a.batch = table.dim_int(0);
  set_decode_shape(a, qt, k, table, layout);
  // Only shapes matter for the size; the pointers just have to be non-null.
  static const std::int32_t dummy[4] = {};
  a.q = a.k_cache = a.v_cache = a.out = const_cast<std::int32_t*>(dummy);
  a.block_table = a.context_lens = dummy;
  if (max_q_len) {
    a.q_indptr = dummy;
    a.num_q_tokens = qt.dim_int(0);
    a.max_q_len = *max_q_len;
  }
  pagedattn::DecodeOptions options;
  options.backend = Backend::kCuda;
  options.batch_invariant = batch_invariant;
  DeviceGuard guard(qt.device);
  return pagedattn::cuda_workspace_size(a, options);
}

}  // namespace

void bind_decode(nb::module_& m) {
  m.def("decode", &decode, "q"_a, "k_cache"_a, "v_cache"_a, "block_table"_a, "context_lens"_a,
        "out"_a, "lse"_a.none(), "scale"_a.none(), "backend"_a, "stream"_a, "workspace"_a.none(),
        "checked"_a, "tags"_a, "window_left"_a = -1, "logits_soft_cap"_a = 0.0,
        "alibi_slopes"_a.none() = nb::none(), "sinks"_a.none() = nb::none(),
        "q_indptr"_a.none() = nb::none(), "max_q_len"_a.none() = nb::none(),
        "tree_mask"_a.none() = nb::none(), "tree_mask_indptr"_a.none() = nb::none(),
        "kv_layout"_a = "HND", "k_scale"_a = 1.0, "v_scale"_a = 1.0,
        "k_scales"_a.none() = nb::none(), "v_scales"_a.none() = nb::none(),
        "batch_invariant"_a = false, "k_token_scales"_a.none() = nb::none(),
        "v_token_scales"_a.none() = nb::none(), "share_prefixes"_a = true);
  m.def("workspace_size", &workspace_size, "q"_a, "k_cache"_a, "block_table"_a, "backend"_a,
        "max_q_len"_a.none() = nb::none(), "kv_layout"_a = "HND",
        "tags"_a = std::vector<std::string>{}, "batch_invariant"_a = false);
}

}  // namespace pagedattn::py
