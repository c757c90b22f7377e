// The per-sequence tensors that decode and mla_decode read alike: the block table's layout and
// the largest query count of q_indptr.
#pragma once

#include <cstdint>

#include "tensor.hpp"

namespace pagedattn::py {

// The library's block_table_stride for an int32 [batch, max_blocks_per_seq] table (checked
// before): each row contiguous, rows any stride apart in increasing order within the int32 range.
// 0 when the rows are adjacent or there is at most one row, so a dense table goes as dense.
int block_table_stride(const Tensor& table);

// The largest query count of one sequence, max(q_indptr[b + 1] - q_indptr[b]), from q_indptr's
// values: read in place from host memory, or copied from the device on the call's stream (after
// the work queued before it, which may write q_indptr) and waited for. At least 1, as the
// library requires; values the library would refuse (a decreasing q_indptr, a first entry other
// than 0, a last one other than the token count) are left for its own checks to name.
int max_q_len_of(const Tensor& q_indptr, int batch, std::uintptr_t stream);

}  // namespace pagedattn::py
