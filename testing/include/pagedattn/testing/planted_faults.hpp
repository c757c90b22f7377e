// Known bugs planted around the CPU backend, so the fuzzer (and any test) can prove it catches
// them. Each runs the backend as it is, then makes the result wrong the way that bug would; the
// library itself carries none of them.
#pragma once

#include "pagedattn/detail/backends.hpp"
#include "pagedattn/pagedattn.hpp"

namespace pagedattn::testing {

enum class Fault : int {
  kNone = 0,
  kLastBlockOffByOne,   // a partial last block reads one slot past the context
  kWrongKvHead,         // kv head 1 reads kv head 0's keys and values
  kDropSplit,           // the combine ignores the last split of a split sequence
  kBatchDependentPlan,  // a batch-invariant call gets the default, batch-dependent split plan
};

// detail::decode(args, options), errors included, then, where the call ran on the CPU backend,
// `fault` planted in its outputs.
void decode_with_fault(const DecodeArgs& args, const detail::DecodeOptions& options, Fault fault);

}  // namespace pagedattn::testing
