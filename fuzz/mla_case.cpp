#include "mla_case.hpp"

#include <algorithm>
#include <sstream>

namespace pagedattn::fuzz {

const char* mla_malformation_name(MlaMalformation m) {
  switch (m) {
    case MlaMalformation::kNone:
      return "none";
    case MlaMalformation::kIdOutOfRange:
      return "id-out-of-range";
    case MlaMalformation::kContextOverCapacity:
      return "context-over-capacity";
    case MlaMalformation::kNegativeContext:
      return "negative-context";
    case MlaMalformation::kOverlappingRows:
      return "overlapping-rows";
    case MlaMalformation::kNegativeStride:
      return "negative-stride";
    case MlaMalformation::kQRowStride:
      return "q-row-stride";
    case MlaMalformation::kQHeadStride:
      return "q-head-stride";
    case MlaMalformation::kOutRowStride:
      return "out-row-stride";
    case MlaMalformation::kQIndptrDecreasing:
      return "q-indptr-decreasing";
    case MlaMalformation::kKvScale:
      return "kv-scale";
    case MlaMalformation::kRank:
      return "rank";
    case MlaMalformation::kTooManyHeads:
      return "too-many-heads";
    case MlaMalformation::kCount:
      break;
  }
  return "unknown";
}

int MlaFuzzCase::q_rows() const {
  if (q_lens.empty()) return batch();
  int rows = 0;
  for (int n : q_lens) rows += n;
  return rows;
}

int MlaFuzzCase::max_blocks_per_seq() const {
  int most = 0;
  for (int L : context_lens) most = std::max(most, (std::max(L, 0) + block_size - 1) / block_size);
  return most + 1;  // an entry past every context: -1 or garbage, never read
}

std::string describe(const MlaFuzzCase& c) {
  std::ostringstream os;
  os << "mla H=" << c.num_heads << " rank=" << c.kv_lora_rank << " rope=" << c.rope_dim
     << " bs=" << c.block_size << " lens=[";
  for (int b = 0; b < c.batch(); ++b) os << (b ? "," : "") << c.context_lens[b];
  os << "]";
  if (!c.q_lens.empty()) {
    os << " q_lens=[";
    for (int b = 0; b < c.batch(); ++b) os << (b ? "," : "") << c.q_lens[b];
    os << "] max_q_len=" << c.max_q_len;
  }
  os << " q=" << dtype_name(c.q_dtype) << " kv=" << dtype_name(c.kv_dtype)
     << " out=" << dtype_name(c.out_dtype);
  if (is_fp8(c.kv_dtype)) os << " kv_scale=" << c.kv_scale;
  if (c.scale != 0.f) os << " scale=" << c.scale;
  if (c.magnitude != 1.f) os << " magnitude=" << c.magnitude;
  os << (c.combined ? " combined" : " two-part");
  if (c.row_pad || c.block_pad) os << " pad=" << c.row_pad << "/" << c.block_pad;
  if (c.fused_q) os << " fused-q(head_pad=" << c.head_pad << ")";
  if (c.q_row_pad) os << " q_row_pad=" << c.q_row_pad;
  if (c.out_row_pad) os << " out_row_pad=" << c.out_row_pad;
  if (c.table_pad) os << " table_pad=" << c.table_pad;
  if (!c.lse) os << " no-lse";
  os << " threads=" << c.threads;
  if (c.malformed()) os << " malformation=" << mla_malformation_name(c.bad) << ":" << c.bad_param;
  return os.str();
}

}  // namespace pagedattn::fuzz
