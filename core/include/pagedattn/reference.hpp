// The f64 reference: decode attention straight from the definition (two-pass softmax in double).
// It shares no arithmetic with the online-softmax path and is the oracle for tests, the fuzzer
// and the benchmarks. Host memory only.
#pragma once

#include <vector>

#include "pagedattn/mla.hpp"
#include "pagedattn/pagedattn.hpp"

namespace pagedattn {

struct ReferenceResult {
  std::vector<double> out;  // [rows][num_heads][head_dim] (rows: DecodeArgs::q_rows())
  std::vector<double> lse;  // [rows][num_heads]; -inf for an empty context
  // [rows][num_heads]: the attended tokens' share of the softmax, 1 - the sink's (1 without a
  // sink, 0 for an empty context). Computed from the tokens' own weights, so it keeps its
  // precision where the sink takes nearly everything (1 - exp(sink - lse) rounds to 0 there).
  std::vector<double> tokens_share;
};

// Validates like decode() and computes in double from the stored (rounded) inputs. A head whose q,
// or a K row inside its context, holds NaN or Inf gets NaN in all of its out and in its lse (an
// empty context gives out = 0, lse = -inf whatever q holds).
ReferenceResult reference_decode(const DecodeArgs& args);

// MLA decode (pagedattn/mla.hpp) the same way: out is [rows][num_heads][kv_lora_rank]. A head whose
// q, or a latent row inside its context, holds NaN or Inf gets NaN in all of its out and its lse.
ReferenceResult mla_reference_decode(const MlaDecodeArgs& args);

}  // namespace pagedattn
