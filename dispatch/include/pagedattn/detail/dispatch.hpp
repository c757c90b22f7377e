// The dispatch layer's internal entry points: decode() and mla_decode() with the backends' own
// options, so tests and the fuzzer can ask for one split per sequence. Not installed.
#pragma once

#include "pagedattn/detail/backends.hpp"

namespace pagedattn::detail {

// Validates, resolves options.backend and runs that backend, exactly as pagedattn::decode.
void decode(const DecodeArgs& args, const DecodeOptions& options);
// The same for pagedattn::mla_decode.
void mla_decode(const MlaDecodeArgs& args, const DecodeOptions& options);

}  // namespace pagedattn::detail
