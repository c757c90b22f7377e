#include "sequence_tensors.hpp"

#include <algorithm>
#include <climits>
#include <vector>

#include "argument_error.hpp"
#include "device.hpp"

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

}  // namespace pagedattn::py
