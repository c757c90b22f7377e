#include "mla_call.hpp"

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "argument_error.hpp"
#include "device.hpp"
#include "kv_scales.hpp"
#include "latent_cache.hpp"
#include "pagedattn/mla.hpp"
#include "sequence_tensors.hpp"
#include "tensor_import.hpp"

namespace pagedattn::py {
namespace {

using namespace nb::literals;

// One mla_decode call's arguments, with the imports that keep its tensors alive until it returns.
struct MlaCall {
  MlaDecodeArgs args;
  DecodeOptions options;
  Device device;  // q_nope's, which every tensor shares
  Tensor q_nope, q_pe, table, lens, q_indptr, out, lse, workspace;
  LatentCache cache;
};

const char* rows_ref(bool query_tokens) {
  return query_tokens ? "num_q_tokens" : "batch, context_lens.shape[0]";
}

// q_nope [rows, num_heads, kv_lora_rank] and q_pe [rows, num_heads, rope_dim]: one float dtype,
// the last dimension contiguous, heads and rows any (increasing) distance apart, so FlashMLA's
// one q of [rows, num_heads, kv_lora_rank + rope_dim] goes as its two slices.
void read_queries(MlaCall& c, nb::handle q_nope_h, nb::handle q_pe_h,
                  const std::vector<std::string>& tags, bool query_tokens) {
  auto& a = c.args;
  const char* dims = query_tokens ? "[num_q_tokens, num_heads, " : "[batch, num_heads, ";
  c.q_nope = input(q_nope_h, "q_nope", tags);
  c.q_pe = input(q_pe_h, "q_pe", tags);
  c.q_nope.require_ndim(3, (std::string(dims) + "kv_lora_rank]").c_str());
  c.q_pe.require_ndim(3, (std::string(dims) + "rope_dim]").c_str());
  c.q_pe.require_dim(0, c.q_nope.shape[0],
                     std::string(rows_ref(query_tokens)) + ", q_nope.shape[0]");
  c.q_pe.require_dim(1, c.q_nope.shape[1], "num_heads, q_nope.shape[1]");
  a.q_dtype = shared_float_dtype(c.q_nope, c.q_pe);
  c.device = c.q_nope.device;
  c.q_pe.require_device(c.device, "q_nope");
  a.num_heads = c.q_nope.dim_int(1);
  a.kv_lora_rank = c.q_nope.dim_int(2);
  a.rope_dim = c.q_pe.dim_int(2);
  const RowStrides n = row_strides(c.q_nope), p = row_strides(c.q_pe);
  a.q_nope_row_stride = n.row;
  a.q_nope_head_stride = n.head;
  a.q_pe_row_stride = p.row;
  a.q_pe_head_stride = p.head;
  a.q_nope = c.q_nope.data_or_placeholder();
  a.q_pe = c.q_pe.data_or_placeholder();
}

// block_table int32 [batch, max_blocks_per_seq] (rows contiguous, any row stride) and
// context_lens int32 [batch], on q_nope's device; the batch is context_lens' length.
void read_tables(MlaCall& c, nb::handle table_h, nb::handle lens_h, bool query_tokens) {
  auto& a = c.args;
  Tensor& table = c.table = input(table_h, "block_table");
  Tensor& lens = c.lens = input(lens_h, "context_lens");
  table.require_ndim(2, "[batch, max_blocks_per_seq]");
  lens.require_ndim(1, "[batch]");
  table.require_int32();
  lens.require_int32();
  lens.require_contiguous();
  if (!query_tokens) lens.require_dim(0, c.q_nope.shape[0], "batch, q_nope.shape[0]");
  table.require_dim(0, lens.shape[0], "batch, context_lens.shape[0]");
  table.require_device(c.device, "q_nope");
  lens.require_device(c.device, "q_nope");
  a.batch = lens.dim_int(0);
  a.max_blocks_per_seq = table.dim_int(1);
  a.block_table_stride = block_table_stride(table);
  a.block_table = static_cast<const std::int32_t*>(table.data);
  a.context_lens = static_cast<const std::int32_t*>(lens.data);
}

// q_indptr int32 [batch + 1] (q_indptr_input); its values are checked by the library.
void read_query_tokens(MlaCall& c, nb::handle q_indptr_h) {
  auto& a = c.args;
  c.q_indptr = q_indptr_input(q_indptr_h, a.batch, c.q_nope);
  a.q_indptr = static_cast<const std::int32_t*>(c.q_indptr.data);
  a.num_q_tokens = c.q_nope.dim_int(0);
}

// The latent cache, its widths q_nope's and q_pe's, on q_nope's device.
void read_cache(MlaCall& c, nb::handle c_h, nb::handle kpe_h,
                const std::vector<std::string>& tags) {
  c.cache.read(c_h, kpe_h, tags, /*writable=*/false);
  c.cache.split(c.args.kv_lora_rank, c.args.rope_dim, {"q_nope.shape[2]", "q_pe.shape[2]"});
  c.cache.require_device(c.device, "q_nope");
  c.cache.set(c.args);
}

// out [rows, num_heads, kv_lora_rank], each row's heads contiguous, rows any stride apart; lse
// f32 [rows, num_heads], contiguous, when given.
void read_outputs(MlaCall& c, nb::handle out_h, nb::handle lse_h,
                  const std::vector<std::string>& tags, bool query_tokens) {
  auto& a = c.args;
  Tensor& out = c.out = output(out_h, "out", tags);
  out.require_ndim(3, query_tokens ? "[num_q_tokens, num_heads, kv_lora_rank]"
                                   : "[batch, num_heads, kv_lora_rank]");
  out.require_shape_of(c.q_nope);
  a.out_dtype = out.float_dtype();
  out.require_device(c.device, "q_nope");
  const RowStrides s = row_strides(out);
  if (s.head != 0) {
    reject(ErrorCode::kInvalidArgument, "out", ".strides", out.strides_str(),
           "each row's [num_heads, kv_lora_rank] must be contiguous (only the stride between "
           "rows may be larger)");
  }
  a.out_row_stride = s.row;
  a.out = out.data_or_placeholder();
  if (lse_h.is_none()) return;
  c.lse = lse_output(lse_h, c.q_nope, query_tokens);
  a.lse = static_cast<float*>(c.lse.data);
}

void mla_decode(nb::handle q_nope, nb::handle q_pe, nb::handle c_cache, nb::handle kpe_cache,
                nb::handle block_table, nb::handle context_lens, nb::handle out_h, nb::handle lse_h,
                std::optional<double> scale, double kv_scale, const std::string& backend,
                std::uintptr_t stream, nb::handle workspace_h, bool checked,
                const std::vector<std::string>& tags, nb::handle q_indptr_h,
                std::optional<int> max_q_len, bool batch_invariant) {
  const bool query_tokens = !q_indptr_h.is_none();
  require_q_indptr_for_max_q_len(query_tokens, max_q_len);
  MlaCall c;
  auto& a = c.args;
  read_queries(c, q_nope, q_pe, tags, query_tokens);
  read_tables(c, block_table, context_lens, query_tokens);
  if (query_tokens) read_query_tokens(c, q_indptr_h);
  read_cache(c, c_cache, kpe_cache, tags);
  a.kv_scale = KvScales::to_f32(kv_scale, "kv_scale");
  read_outputs(c, out_h, lse_h, tags, query_tokens);
  if (scale) a.scale = static_cast<float>(*scale);

  c.options = decode_options(backend, c.device, "q_nope", stream, checked, batch_invariant,
                             workspace_h, c.workspace);

  DeviceGuard guard(c.device);
  nb::gil_scoped_release release;
  if (query_tokens) a.max_q_len = resolve_max_q_len(max_q_len, c.q_indptr, a.batch, stream);
  pagedattn::mla_decode(a, c.options);
}

// With max_q_len (multi-token queries) q_nope is [num_q_tokens, num_heads, kv_lora_rank] and the
// batch is the table's rows; the workspace is sized for at most max_q_len query tokens per
// sequence. The size depends on shapes and dtypes only, but the cache is read as mla_decode reads
// it, so that a cache the kernel refuses (its alignment, its dtype) is refused here too.
std::size_t mla_workspace_size(nb::handle q_nope, nb::handle q_pe, nb::handle c_cache,
                               nb::handle kpe_cache, nb::handle block_table,
                               const std::string& backend, std::optional<int> max_q_len,
                               const std::vector<std::string>& tags, bool batch_invariant) {
  const bool query_tokens = max_q_len.has_value();
  MlaCall c;
  auto& a = c.args;
  read_queries(c, q_nope, q_pe, tags, query_tokens);
  Tensor& table = c.table = input(block_table, "block_table");
  table.require_ndim(2, "[batch, max_blocks_per_seq]");
  table.require_int32();
  if (!query_tokens) table.require_dim(0, c.q_nope.shape[0], "batch, q_nope.shape[0]");
  table.require_device(c.device, "q_nope");
  read_cache(c, c_cache, kpe_cache, tags);
  if (pick_backend(backend, c.device, "q_nope") != Backend::kCuda) return 0;

  a.batch = table.dim_int(0);
  a.max_blocks_per_seq = table.dim_int(1);
  a.block_table_stride = block_table_stride(table);
  a.out_dtype = a.q_dtype;  // the plan does not depend on out's dtype
  // Only shapes matter for the size; the tables' and out's pointers just have to be non-null.
  static const std::int32_t dummy[4] = {};
  a.block_table = a.context_lens = dummy;
  a.out = const_cast<std::int32_t*>(dummy);
  if (query_tokens) {
    a.q_indptr = dummy;
    a.num_q_tokens = c.q_nope.dim_int(0);
    a.max_q_len = *max_q_len;
  }
  DecodeOptions options;
  options.backend = Backend::kCuda;
  options.batch_invariant = batch_invariant;
  DeviceGuard guard(c.device);
  return pagedattn::cuda_mla_workspace_size(a, options);
}

}  // namespace

void bind_mla_decode(nb::module_& m) {
  m.def("mla_decode", &mla_decode, "q_nope"_a, "q_pe"_a, "c_cache"_a, "kpe_cache"_a.none(),
        "block_table"_a, "context_lens"_a, "out"_a, "lse"_a.none(), "scale"_a.none(), "kv_scale"_a,
        "backend"_a, "stream"_a, "workspace"_a.none(), "checked"_a, "tags"_a,
        "q_indptr"_a.none() = nb::none(), "max_q_len"_a.none() = nb::none(),
        "batch_invariant"_a = false);
  m.def("mla_workspace_size", &mla_workspace_size, "q_nope"_a, "q_pe"_a, "c_cache"_a,
        "kpe_cache"_a.none(), "block_table"_a, "backend"_a, "max_q_len"_a.none() = nb::none(),
        "tags"_a = std::vector<std::string>{}, "batch_invariant"_a = false);
  m.attr("MAX_MLA_HEADS") = pagedattn::kMaxMlaHeads;
}

}  // namespace pagedattn::py
