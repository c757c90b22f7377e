// An MLA fuzz case's buffers and MlaDecodeArgs: the latent cache fragmented over a pool with NaN
// in every slot no query reads and in every gap of its layout, -1 or garbage in the table past
// each context, NaN in q's gaps and a sentinel in out's; a malformed case's one bad argument
// planted with the error it must raise.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mla_case.hpp"
#include "pagedattn/error.hpp"
#include "pagedattn/mla.hpp"

namespace pagedattn::fuzz {

struct BuiltMla {
  MlaDecodeArgs args;
  // q_nope (and q_pe after it, with a fused q), q_pe, the cache (c and k_pe, or c alone when
  // combined), k_pe, out: raw bytes of their dtypes. Every pointer of args points into these.
  std::vector<std::uint8_t> q_nope, q_pe, c, kpe, out;
  std::vector<float> lse;  // empty without lse
  std::vector<std::int32_t> table, lens, indptr;
  int rows = 0;
  // out's layout as built (a malformed out_row_stride leaves these): elements of a row, and
  // between rows.
  std::int64_t out_width = 0, out_row = 0;
  // A malformed case: the error every backend must raise.
  ErrorCode expected_code = ErrorCode::kInvalidArgument;
  std::string expected_argument;

  // NaN in every element of out's rows and in lse; the sentinel in out's gaps.
  void poison_outputs();
  // Where out's gaps were written ("" when untouched).
  std::string check_gaps() const;
};

// The byte out's gaps hold, never to be written.
inline constexpr std::uint8_t kMlaOutGapByte = 0x5a;

// Throws std::invalid_argument for a case that cannot be built (a hand-edited case file's
// impossible field, or a malformation the case has nothing to plant on).
BuiltMla build_mla_case(const MlaFuzzCase& c);

// Plants c.bad in a built case's arguments and sets the error it must raise
// (plant_mla_malformation.cpp); std::invalid_argument where the case has nothing to plant it on.
void plant_mla_malformation(const MlaFuzzCase& c, BuiltMla& m);

}  // namespace pagedattn::fuzz
