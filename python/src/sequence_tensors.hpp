// What decode and mla_decode read alike beside their own tensors: the block table's layout, the
// multi-token query offsets (q_indptr, max_q_len), lse, and the backend's options with the
// caller's workspace. `q` below is the call's query tensor (decode's q, mla_decode's q_nope):
// the other tensors follow its rows, heads and device, and the errors name it.
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>
#include <optional>
#include <string>

#include "pagedattn/pagedattn.hpp"
#include "tensor.hpp"

namespace pagedattn::py {

// The library's block_table_stride for an int32 [batch, max_blocks_per_seq] table (checked
// before): each row contiguous, rows any stride apart in increasing order within the int32 range.
// 0 when the rows are adjacent or there is at most one row, so a dense table goes as dense.
int block_table_stride(const Tensor& table);

// max_q_len bounds the query tokens of multi-token queries: given without q_indptr (`query_tokens`
// false) it is an error naming it.
void require_q_indptr_for_max_q_len(bool query_tokens, const std::optional<int>& max_q_len);

// An offsets tensor per sequence (q_indptr, tree_mask_indptr): int32 [batch + 1], contiguous, on
// `device` (that of the argument `device_ref`).
Tensor offsets_input(nb::handle h, const char* name, int batch, const Device& device,
                     const char* device_ref);

// Multi-token queries: q_indptr as offsets_input() reads it, on q's device. Its values are checked
// by the library; an empty batch has no query tokens whatever q_indptr holds, so q must have no
// rows: checked here, as the library returns before looking at an empty batch's arguments.
Tensor q_indptr_input(nb::handle h, int batch, const Tensor& q);

// lse: f32 [rows, num_heads], q's first two dimensions, contiguous, on q's device; `query_tokens`
// names the rows num_q_tokens (with q_indptr) or batch in errors.
Tensor lse_output(nb::handle h, const Tensor& q, bool query_tokens);

// The options of a decode on `device` (that of the argument `device_ref`): the backend it picks,
// the CUDA stream, checked mode and batch invariance. The caller's workspace (None, or any
// writable contiguous tensor on that device) is imported into `workspace`, where it stays alive
// until the call returns, and handed to the CUDA backend (the CPU backend uses none).
DecodeOptions decode_options(const std::string& backend, const Device& device,
                             const char* device_ref, std::uintptr_t stream, bool checked,
                             bool batch_invariant, nb::handle workspace_h, Tensor& workspace);

// The largest query count of one sequence, max(q_indptr[b + 1] - q_indptr[b]), from q_indptr's
// values: read in place from host memory, or copied from the device on the call's stream (after
// the work queued before it, which may write q_indptr) and waited for. At least 1, as the
// library requires; values the library would refuse (a decreasing q_indptr, a first entry other
// than 0, a last one other than the token count) are left for its own checks to name.
int max_q_len_of(const Tensor& q_indptr, int batch, std::uintptr_t stream);

// The max_q_len a call passes the library: the caller's as it is (the library checks it), else
// max_q_len_of(), which on CUDA costs a copy to the host and a wait for the stream.
int resolve_max_q_len(const std::optional<int>& given, const Tensor& q_indptr, int batch,
                      std::uintptr_t stream);

}  // namespace pagedattn::py
