// The flags of pagedattn-bench (pagedattn_bench.cpp says what the tool does): parsed strictly
// (cli/args.hpp), every shape checked before anything is measured; a bad one is a
// cli::UsageError naming the flag and the value.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "bench_clock.hpp"
#include "bench_variants.hpp"
#include "cuda_timing.hpp"
#include "pagedattn/dtype.hpp"
#include "pagedattn/testing/host_pool.hpp"
#include "pagedattn/testing/kv_layouts.hpp"

namespace pagedattn::bench {

struct Options {
  bool help = false;
  std::string backend = "cpu";
  std::vector<DType> dtypes;  // --dtype, comma-separated; bf16 when not given
  std::vector<Shape> shapes;
  std::vector<std::string> shape_texts;  // as given, for the messages
  int threads = 0;
  bool csv = false;
  bool contiguous = false;
  bool naive = true;
  bool plain = false;            // CUDA: plain launches instead of CUDA-graph replays
  bool batch_invariant = false;  // DecodeOptions::batch_invariant on every row
  int long_first = 0;            // > 0: sequence 0 of every shape holds this many tokens
  Variants variants;             // --window, --soft-cap, --alibi, --sinks: on every row
  int q_len = 1;                 // --q-len: query tokens per sequence
  bool tree_mask = false;        // --tree-mask: a random token tree per sequence (q_len >= 2)
  // --share N,PREFIX: runs of N sequences forked after PREFIX tokens (0: none)
  int share_members = 0;
  int share_prefix = 0;
  bool mla = false;        // --mla: MLA decode (mla_decode); shapes B,H,1,576,CTX
  int iters = 20;          // timed runs at least
  double min_time = 0.5;   // seconds of timed runs at least
  double max_time = 10.0;  // stop after this many seconds (at least 3 runs)
  std::size_t bw_mib = 2048;
  Clock clock = Clock::kWall;  // --clock: what the CPU rows and bandwidth time
  bool limits = false;         // --limits: each CPU row's compute bound beside the read bandwidth
  // --layout: where K and V live (kHnd: the default dense layout, kv_strides 0)
  testing::KvLayout layout = testing::KvLayout::kHnd;
  // --kv-dtype: the caches' dtype; unset: each --dtype's own
  std::optional<DType> kv_dtype;
  bool token_scales = false;  // --token-scales: per-(token, kv head) scales of a quantized cache
  // --huge-pages: the pages of the CPU rows' K/V pools (on: MADV_HUGEPAGE, off: MADV_NOHUGEPAGE)
  testing::HugePages huge_pages = testing::HugePages::kOn;

  DType kv_dtype_for(DType dtype) const { return kv_dtype.value_or(dtype); }
};

void print_help(const char* prog);
// The options of a command line; `--help` sets help and skips the checks.
Options parse(int argc, char** argv);

}  // namespace pagedattn::bench
