#include "malformation.hpp"

#include <cstddef>

namespace pagedattn::fuzz {
namespace {

const char* const kMalformationNames[] = {"none",
                                          "id-out-of-range",
                                          "context-over-capacity",
                                          "negative-context",
                                          "head-ratio",
                                          "group-too-large",
                                          "null-pointer",
                                          "head-dim",
                                          "block-size",
                                          "table-stride",
                                          "dtype-mismatch",
                                          "bad-dtype",
                                          "nonfinite-scale",
                                          "negative-batch",
                                          "window-left",
                                          "soft-cap",
                                          "nonfinite-slope",
                                          "bad-sink",
                                          "row-stride",
                                          "q-indptr-start",
                                          "q-indptr-decreasing",
                                          "q-len-over-max",
                                          "q-indptr-end",
                                          "max-q-len",
                                          "q-tokens-without-indptr",
                                          "kv-strides",
                                          "fp8-value-dtype",
                                          "bad-kv-scale",
                                          "scale-on-plain-cache",
                                          "bad-kv-head-scale",
                                          "tree-bit-above-diagonal",
                                          "tree-span-short",
                                          "tree-indptr-start",
                                          "tree-unpaired",
                                          "tree-without-q-indptr",
                                          "token-scales-on-plain-cache",
                                          "token-scales-unpaired",
                                          "bad-token-scale",
                                          "token-scale-strides"};
static_assert(sizeof(kMalformationNames) / sizeof(kMalformationNames[0]) ==
              static_cast<std::size_t>(Malformation::kCount));

}  // namespace

const char* malformation_name(Malformation m) {
  const int i = static_cast<int>(m);
  return i >= 0 && i < static_cast<int>(Malformation::kCount) ? kMalformationNames[i] : "unknown";
}

bool keeps_buffer_sizes(Malformation m) {
  return m == Malformation::kNone || m == Malformation::kIdOutOfRange ||
         m == Malformation::kContextOverCapacity || m == Malformation::kNegativeContext ||
         m == Malformation::kWindowLeft || m == Malformation::kSoftCap ||
         m == Malformation::kNonFiniteSlope || m == Malformation::kBadSink ||
         m == Malformation::kRowStride || m == Malformation::kQIndptrStart ||
         m == Malformation::kQIndptrDecreasing || m == Malformation::kQLenOverMax ||
         m == Malformation::kQIndptrEnd || m == Malformation::kKvStrides ||
         m == Malformation::kBadKvScale || m == Malformation::kScaleOnPlainCache ||
         m == Malformation::kBadKvHeadScale || m == Malformation::kTreeBitAboveDiagonal ||
         m == Malformation::kTreeSpanShort || m == Malformation::kTreeIndptrStart ||
         m == Malformation::kTreeUnpaired || m == Malformation::kTokenScalesOnPlainCache ||
         m == Malformation::kTokenScalesUnpaired || m == Malformation::kBadTokenScale ||
         m == Malformation::kTokenScaleStrides;
}

}  // namespace pagedattn::fuzz
