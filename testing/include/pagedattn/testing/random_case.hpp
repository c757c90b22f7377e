// Random paged-attention cases in host memory: fragmented block tables over an oversized pool,
// -1 and garbage past each context, NaN in every cache slot no sequence may read; their comparison
// with the f64 reference. Shared by the tests, the fuzzer, the benchmark, the demo and the
// simulator.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "pagedattn/detail/backends.hpp"
#include "pagedattn/pagedattn.hpp"
#include "pagedattn/reference.hpp"
#include "pagedattn/testing/tolerance.hpp"

namespace pagedattn::testing {

struct CaseSpec {
  int batch = 1;
  int num_heads = 8;
  int num_kv_heads = 2;
  int head_dim = 64;
  int block_size = 16;
  std::vector<int> context_lens;  // one per sequence
  DType q_dtype = DType::kF32;
  DType kv_dtype = DType::kF32;
  DType out_dtype = DType::kF32;
  // Quantized caches: the dequantization scales (DecodeArgs::k_scale, v_scale); 1 for others.
  float k_scale = 1.f;
  float v_scale = 1.f;
  bool per_head_scales = false;  // also k_scales / v_scales per kv head (HostCase::k_scales)
  // Quantized caches: also a scale per (block, kv head, slot), in [0.25, 4) (NaN in the slots no
  // sequence reads, with poison), and the codes drawn so that code x scale has the usual spread
  // (HostCase::k_token_scales, dense [num_blocks][num_kv_heads][block_size]).
  // An int4 cache (kInt4) always has them, one per group of 32 values of a row, its codes drawn
  // uniform over -8..7 (-8 never written by write_cache, but read as -8); its unreadable slots hold
  // the code -8 and NaN scales.
  bool token_scales = false;
  int spare_blocks = 3;        // pool blocks no sequence owns (poisoned)
  int table_padding = 0;       // table entries past the largest context's blocks
  int table_stride_extra = 0;  // row stride - max_blocks_per_seq
  bool fragmented = true;      // random permutation of the pool; else blocks in order
  bool share_prefix = false;   // sequences may share their first blocks (prefix caching)
  // Forked groups (BlockManager::fork: n-way sampling, beam search, a shared system prompt):
  // with fork_members >= 2, each run of fork_members consecutive sequences is a group g that was
  // forked after fork_prefix[g] tokens (at most each member's context; missing entries: no fork).
  // Its members hold the first member's block ids for the blocks wholly before that token; the
  // block it falls inside (a fork mid-block) stays shared with a member that wrote nothing after
  // the fork (its context is fork_prefix[g]) and is a copy of its own (copy-on-write) for one
  // that did.
  int fork_members = 0;
  std::vector<int> fork_prefix;
  bool poison = true;     // NaN in unreadable slots, -1 / garbage past each context
  float magnitude = 1.f;  // q and k scale: logits grow with magnitude^2
  std::uint64_t seed = 1;
};

struct HostCase {
  CaseSpec spec;
  int num_blocks = 0;
  int max_blocks_per_seq = 0;
  int table_stride = 0;
  std::vector<std::uint8_t> q, k, v, out;
  std::vector<std::int32_t> block_table, context_lens;
  std::vector<float> lse;
  std::vector<float> k_scales, v_scales;              // per kv head, when spec.per_head_scales
  std::vector<float> k_token_scales, v_token_scales;  // per row, when spec.token_scales

  // DecodeArgs over this case's buffers (out and lse included).
  DecodeArgs args();
  // Fills out and lse with NaN, so an unwritten element shows.
  void poison_outputs();
};

HostCase make_case(const CaseSpec& spec);

// Whether sequence b's table entry i is its fork group's first member's (CaseSpec::fork_members,
// fork_prefix) given the contexts `lens`: the blocks wholly before the fork, and the block it
// falls inside while b wrote nothing after it. The case builders (make_case, the fuzzer's) share
// those entries with the group's first sequence.
bool forked_block(const CaseSpec& spec, const std::vector<std::int32_t>& lens, int b, int i);

// A spec of one shape, one sequence per length, every storage in `dtype`; the rest as above.
CaseSpec shaped_spec(DType dtype, int num_heads, int num_kv_heads, int head_dim, int block_size,
                     std::vector<int> context_lens);

// The geometry every case generator shares: c.spec's lengths (0 past those given, up to batch)
// into c.context_lens, and the table and pool sizes: rows of the largest context's blocks plus
// table_padding, the row stride, and every sequence's blocks plus spare_blocks.
void size_case(HostCase& c);

// Relative-to-scale comparison of a backend's out/lse with the f64 reference (the bounds are in
// tolerance.hpp).
struct Comparison {
  double max_abs_err_out = 0;  // max |out - ref|
  double ref_scale = 0;        // max |ref out|, at least 1e-30
  double max_abs_err_lse = 0;  // over finite reference lse; inf when -inf/finite disagree
  bool all_finite = true;      // every output element finite and written
  std::string first_bad;       // where the first non-finite or mismatched element is
  double rel_err() const { return max_abs_err_out / ref_scale; }
};
Comparison compare_with_reference(HostCase& c);
// The same measures of c's out and lse against a reference computed apart (for arguments that
// c.args() does not carry, such as the attention variants).
Comparison compare_outputs(const HostCase& c, const ReferenceResult& ref);

// Runs decode over the case on options.backend (resolved as decode() does); the CUDA backend
// gets device copies of the buffers and its results are copied back. Returns the backend used.
// The options are the backends' own (detail::DecodeOptions: single_split); public
// DecodeOptions convert to them.
Backend run_decode(HostCase& c, const detail::DecodeOptions& options = {});

std::string describe(const CaseSpec& spec);

}  // namespace pagedattn::testing
