// Validation of MLA decode's arguments (pagedattn/mla.hpp), shared by every backend.
#pragma once

#include "pagedattn/mla.hpp"

namespace pagedattn {

// Sizes, strides, dtypes and pointers. Reads no tensor. The reference passes require_out = false.
void validate_mla_shapes(const MlaDecodeArgs& args, bool require_out = true);

// q_indptr, context_lens and block_table in host memory, checked as decode() checks them
// (validate_q_indptr, validate_tables over mla_table_view).
void validate_mla_tables(const MlaDecodeArgs& args);

// The call's table fields as a DecodeArgs of one kv head: what the GQA table checks, the split
// planner and the CPU backend's tables read.
DecodeArgs mla_table_view(const MlaDecodeArgs& args);

}  // namespace pagedattn
