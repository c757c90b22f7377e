#include "sequence_tensors.hpp"

#include <algorithm>
#include <climits>
#include <string>
#include <vector>

#include "argument_error.hpp"
#include "device.hpp"
#include "tensor_import.hpp"

namespace pagedattn::py {

int block_table_stride(const Tensor& table) {
  // An empty table's strides say nothing (NumPy 2 gives an empty array zero strides).
  if (table.numel() > 0 && table.shape[1] > 1 && table.strides[1] != 1) {
    reject(ErrorCode::kInvalidArgument, table.name, ".strides", table.strides_str(),
           "each row must be contiguous (rows may be any stride apart)");
  }
  if (table.shape[0] <= 1 || table.shape[1] == 0) return 0;
  if (table.strides[0] < table.shape[1] || table.strides[0] > INT_MAX) {
    reject(ErrorCode::kInvalidArgument, table.name, ".strides", table.strides_str(),
           "rows must not overlap and must lie within the int32 range");
  }
  return static_cast<int>(table.strides[0]);
}

void require_q_indptr_for_max_q_len(bool query_tokens, const std::optional<int>& max_q_len) {
  if (!query_tokens && max_q_len) {
    reject(ErrorCode::kInvalidArgument, "max_q_len", "", std::to_string(*max_q_len),
           "given without q_indptr (max_q_len bounds the query tokens of multi-token queries)");
  }
}

Tensor offsets_input(nb::handle h, const char* name, int batch, const Device& device,
                     const char* device_ref) {
  Tensor t = input(h, name);
  t.require_ndim(1, "[batch + 1]");
  t.require_int32();
  t.require_dim(0, static_cast<std::int64_t>(batch) + 1, "batch + 1, context_lens.shape[0] + 1");
  t.require_contiguous();
  t.require_device(device, device_ref);
  return t;
}

Tensor q_indptr_input(nb::handle h, int batch, const Tensor& q) {
  Tensor t = offsets_input(h, "q_indptr", batch, q.device, q.name.c_str());
  if (batch == 0 && q.shape[0] != 0) {
    reject(ErrorCode::kInvalidArgument, q.name, ".shape", q.shape_str(),
           "dimension 0 must be 0 (num_q_tokens: an empty batch has no query tokens)");
  }
  return t;
}

Tensor lse_output(nb::handle h, const Tensor& q, bool query_tokens) {
  Tensor lse = output(h, "lse");
  lse.require_ndim(2, query_tokens ? "[num_q_tokens, num_heads]" : "[batch, num_heads]");
  lse.require_dim(0, q.shape[0],
                  (query_tokens ? "num_q_tokens, " : "batch, ") + q.name + ".shape[0]");
  lse.require_dim(1, q.shape[1], "num_heads, " + q.name + ".shape[1]");
  lse.require_float32();
  lse.require_contiguous();
  lse.require_device(q.device, q.name);
  return lse;
}

DecodeOptions decode_options(const std::string& backend, const Device& device,
                             const char* device_ref, std::uintptr_t stream, bool checked,
                             bool batch_invariant, nb::handle workspace_h, Tensor& workspace) {
  DecodeOptions o;
  o.backend = pick_backend(backend, device, device_ref);
  o.cuda_stream = reinterpret_cast<void*>(stream);
  o.cuda_checked = checked;
  o.batch_invariant = batch_invariant;
  if (workspace_h.is_none()) return o;
  workspace = output(workspace_h, "workspace");
  workspace.require_contiguous();
  workspace.require_device(device, device_ref);
  if (o.backend == Backend::kCuda) {
    o.workspace = workspace.data;
    o.workspace_bytes = workspace.nbytes();
  }
  return o;
}

int max_q_len_of(const Tensor& q_indptr, int batch, std::uintptr_t stream) {
  std::vector<std::int32_t> copy;
  const std::int32_t* v = static_cast<const std::int32_t*>(q_indptr.data);
  if (q_indptr.device.kind == DeviceKind::kCuda) {
    copy.resize(static_cast<std::size_t>(batch) + 1);
    copy_to_host(copy.data(), q_indptr.data, copy.size() * sizeof(std::int32_t), stream,
                 "cudaMemcpyAsync(q_indptr)");
    v = copy.data();
  }
  std::int64_t most = 1;
  for (int b = 0; b < batch; ++b) {
    most = std::max(most, static_cast<std::int64_t>(v[b + 1]) - v[b]);
  }
  return static_cast<int>(std::min<std::int64_t>(most, INT_MAX));
}

int resolve_max_q_len(const std::optional<int>& given, const Tensor& q_indptr, int batch,
                      std::uintptr_t stream) {
  return given ? *given : max_q_len_of(q_indptr, batch, stream);
}

}  // namespace pagedattn::py
