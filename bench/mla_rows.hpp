// pagedattn-bench --mla: MLA decode rows (pagedattn/mla.hpp) on the CPU backend.
#pragma once

#include <cstdio>

#include "bench_options.hpp"

namespace pagedattn::bench {

// Times mla_decode on every --shape (B,H,1,576,CTX[,BS]) and --dtype, against `read_bw` (the
// streaming read measured in the same run), and prints a row each (CSV with --csv); notes go to
// `info`. Returns 1 when a row's error against the f64 reference exceeds its dtype's tolerance.
int run_mla_rows(const Options& o, double read_bw, std::FILE* info);

}  // namespace pagedattn::bench
