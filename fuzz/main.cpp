// pagedattn-fuzz: the differential fuzzer. Random shapes, block tables and cache contents through
// every requested backend against the f64 reference, GQA decodes and a share of MLA decodes; on a
// mismatch it prints a replay command, shrinks the case (GQA cases), saves it as a case file and
// exits non-zero. See docs/fuzzing.md.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <iterator>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "case_file.hpp"
#include "draw_case.hpp"
#include "fault_injection.hpp"
#include "fuzz_case.hpp"
#include "mla_case.hpp"
#include "mla_oracle.hpp"
#include "oracle.hpp"
#include "pagedattn/cli/args.hpp"
#include "pagedattn/pagedattn.hpp"
#include "pagedattn/validate.hpp"
#include "shrink.hpp"

namespace pf = pagedattn::fuzz;
using pagedattn::Backend;
using Clock = std::chrono::steady_clock;

namespace {

struct Config {
  bool help = false;
  std::vector<Backend> backends = {Backend::kCpu};
  std::string backend_text = "cpu";
  std::uint64_t seed = 1;
  long long iters = -1;  // -1: not given
  double seconds = -1;   // -1: not given
  int threads = 0;
  long long index = -1;  // -1: not given
  std::string replay;
  std::string fault;
  std::string out_dir = ".";
  int max_shrink = 400;
  bool expect_failure = false;
  bool progress = true;
  bool print_case = false;
  double mla_share = 0.2;  // the share of MLA cases (--mla)
  std::string mla_text;    // --mla as given; empty: the default
};

constexpr long long kMaxCount = 1LL << 62;  // --iters, --index
constexpr double kMaxSeconds = 1e7;         // --seconds: about four months
constexpr int kMaxShrink = 1 << 30;

void print_help() {
  std::printf(
      "usage: pagedattn-fuzz [flags]\n"
      "Random shapes, block tables and cache contents through every requested backend against\n"
      "the f64 reference. Exit status: 0 clean, 1 a failure (shrunk and saved), 2 a bad flag or\n"
      "case file, 3 a generator bug.\n\n"
      "  --backend LIST    backends to test, comma separated: cpu,cuda (default cpu)\n"
      "  --seed S          run seed, an unsigned 64-bit integer (default 1); case i is a\n"
      "                    function of (S, i)\n"
      "  --iters N         run N cases, 1 to %lld (default 1000 when --seconds is not given)\n"
      "  --seconds T       run for T seconds, more than 0 and at most %g (with --iters:\n"
      "                    whichever ends first)\n"
      "  --threads N       CPU backend threads for every case, 1 to %d (default: drawn per case)\n"
      "  --mla SHARE       the share of the cases that are MLA decodes (mla_decode), 0 to 1\n"
      "                    (default 0.2; 0: none, 1: MLA only); case i's kind is a function of\n"
      "                    (S, i, SHARE)\n"
      "  --index I         run only case I of the seed, 0 to %lld (a replay)\n"
      "  --replay FILE     run the case saved in FILE\n"
      "  --print-case      with --index or --replay: print the case file, do not run it\n"
      "  --out DIR         where failing cases are saved (default .)\n"
      "  --max-shrink N    shrink evaluations at most, 0 to %d (default 400; 0 disables)\n"
      "  --no-progress     no live progress line\n"
      "  --fault NAME      test only: plant a bug (last-block-off-by-one, wrong-kv-head,\n"
      "                    drop-split, batch-dependent-plan)\n"
      "  --expect-failure  test only: succeed iff a failure is found (and shrunk)\n"
      "  --help, -h        this text\n",
      kMaxCount, kMaxSeconds, pagedattn::kMaxThreads, kMaxCount, kMaxShrink);
}

Config parse(int argc, char** argv) {
  namespace cli = pagedattn::cli;
  Config c;
  cli::Args args(argc, argv);
  while (args.next()) {
    if (args.is_help()) {
      c.help = true;
    } else if (args.is("--backend")) {
      c.backends = args.choice_list<Backend>({{"cpu", Backend::kCpu}, {"cuda", Backend::kCuda}});
      c.backend_text.clear();
      for (Backend b : c.backends) {
        c.backend_text += (c.backend_text.empty() ? "" : ",") + std::string(backend_name(b));
      }
    } else if (args.is("--seed")) {
      c.seed = args.u64();
    } else if (args.is("--iters")) {
      c.iters = args.integer(1, kMaxCount);
    } else if (args.is("--seconds")) {
      c.seconds = args.number(0, kMaxSeconds, /*lo_open=*/true);
    } else if (args.is("--threads")) {
      c.threads = static_cast<int>(args.integer(1, pagedattn::kMaxThreads));
    } else if (args.is("--mla")) {
      c.mla_text = args.value();
      c.mla_share = cli::parse_number("--mla", c.mla_text, 0, 1);
    } else if (args.is("--index")) {
      c.index = args.integer(0, kMaxCount);
    } else if (args.is("--replay")) {
      c.replay = args.text();
    } else if (args.is("--out")) {
      c.out_dir = args.text();
    } else if (args.is("--max-shrink")) {
      c.max_shrink = static_cast<int>(args.integer(0, kMaxShrink));
    } else if (args.is("--fault")) {
      c.fault = args.choice<std::string>({{"none", ""},
                                          {"last-block-off-by-one", "last-block-off-by-one"},
                                          {"wrong-kv-head", "wrong-kv-head"},
                                          {"drop-split", "drop-split"},
                                          {"batch-dependent-plan", "batch-dependent-plan"}});
    } else if (args.is("--print-case")) {
      c.print_case = true;
    } else if (args.is("--no-progress")) {
      c.progress = false;
    } else if (args.is("--expect-failure")) {
      c.expect_failure = true;
    } else {
      args.unknown();
    }
  }
  if (c.help) return c;
  if (c.index >= 0 && !c.replay.empty()) {
    throw cli::UsageError("--index", "cannot be combined with --replay");
  }
  if (c.print_case && c.index < 0 && c.replay.empty()) {
    throw cli::UsageError("--print-case", "needs --index or --replay");
  }
  if (c.iters < 0 && c.seconds < 0) c.iters = 1000;
  return c;
}

// The name was checked by parse().
pagedattn::testing::Fault parse_fault(const std::string& name) {
  using pagedattn::testing::Fault;
  if (name == "last-block-off-by-one") return Fault::kLastBlockOffByOne;
  if (name == "wrong-kv-head") return Fault::kWrongKvHead;
  if (name == "drop-split") return Fault::kDropSplit;
  if (name == "batch-dependent-plan") return Fault::kBatchDependentPlan;
  return Fault::kNone;
}

// The options every replay line repeats.
std::string common_flags(const Config& cfg) {
  std::string s = "--backend " + cfg.backend_text;
  if (cfg.threads > 0) s += " --threads " + std::to_string(cfg.threads);
  if (!cfg.fault.empty()) s += " --fault " + cfg.fault;
  if (!cfg.mla_text.empty()) s += " --mla " + cfg.mla_text;
  return s;
}

struct Counts {
  long long cases = 0, valid = 0, malformed = 0, huge = 0, long_ctx = 0, empty_batch = 0;
  long long window = 0, soft_cap = 0, alibi = 0, sinks = 0;  // valid cases with each variant
  long long multi_token = 0;  // valid cases with multi-token queries (q_indptr)
  long long tree = 0;         // those of them with tree masks
  long long no_cuda_dim = 0;  // valid cases at a head dim with no CUDA kernel (512)
  // Valid cases with a strided q, with a strided out, and with a stride the CUDA backend refuses.
  long long strided_q = 0, strided_out = 0, misaligned = 0;
  // Valid cases per cache layout (the default dense HND one not counted), and with cache strides
  // the CUDA backend refuses (a kv_pad off its 16-byte multiples).
  long long layouts[std::size(pagedattn::testing::kAllKvLayouts)] = {};
  long long misaligned_kv = 0;
  // Valid cases with a quantized cache, per format, and those with per-head scales.
  long long fp8_e4m3 = 0, fp8_e5m2 = 0, int8 = 0, int4 = 0, per_head_scales = 0;
  // Valid cases with per-token scales, and those of them in a layout other than the dense one.
  long long token_scales = 0, strided_token_scales = 0;
  long long invariance_checks = 0;  // batch-invariance checks that ran and held
  long long forked = 0;             // valid cases with forked tables (draw_forks)
  long long shared_checks = 0;      // shared-prefix checks that ran and held
  // MLA cases (valid and malformed are the GQA cases'): valid ones with multi-token queries, an
  // fp8 cache, the combined cache; malformed ones; backend runs refused as unsupported.
  long long mla = 0, mla_multi_token = 0, mla_fp8 = 0, mla_combined = 0, mla_malformed = 0;
  long long mla_unsupported = 0;
  long long failures = 0;
  double worst_ratio = 0;
};

void count(Counts& n, const pf::FuzzCase& c, const pf::Outcome& o) {
  ++n.cases;
  if (c.malformed()) {
    ++n.malformed;
  } else {
    ++n.valid;
    if (c.huge()) ++n.huge;
    if (c.spec.batch == 0) ++n.empty_batch;
    n.window += c.windowed();
    n.soft_cap += c.soft_capped();
    n.alibi += !c.alibi_slopes.empty();
    n.sinks += !c.sinks.empty();
    n.multi_token += c.multi_token();
    n.tree += c.tree;
    n.no_cuda_dim += !pagedattn::is_cuda_head_dim(c.spec.head_dim);
    n.strided_q += c.q_row_stride != 0;
    n.strided_out += c.out_row_stride != 0;
    n.misaligned += c.cuda_misaligned_stride() != nullptr;
    if (!c.default_layout()) ++n.layouts[static_cast<std::size_t>(c.kv_layout)];
    n.misaligned_kv += c.cuda_misaligned_kv() != nullptr;
    n.fp8_e4m3 += c.spec.kv_dtype == pagedattn::DType::kFP8E4M3;
    n.fp8_e5m2 += c.spec.kv_dtype == pagedattn::DType::kFP8E5M2;
    n.int8 += c.spec.kv_dtype == pagedattn::DType::kInt8;
    n.int4 += c.spec.kv_dtype == pagedattn::DType::kInt4;
    n.per_head_scales += c.quantized() && c.per_head_scales();
    n.token_scales += c.token_scales();
    n.forked += c.spec.fork_members >= 2;
    n.strided_token_scales +=
        c.token_scales() && c.token_scale_layout != pf::TokenScaleLayout::kDense;
    for (int L : c.spec.context_lens) {
      if (L > 256) {
        ++n.long_ctx;
        break;
      }
    }
  }
  if (o.failed()) ++n.failures;
  n.invariance_checks += o.invariance_checks;
  n.shared_checks += o.shared_prefix_checks;
  n.worst_ratio = std::max(n.worst_ratio, o.worst_ratio);
}

void count_mla(Counts& n, const pf::MlaFuzzCase& c, const pf::Outcome& o) {
  ++n.cases;
  ++n.mla;
  if (c.malformed()) {
    ++n.mla_malformed;
  } else {
    n.mla_multi_token += !c.q_lens.empty();
    n.mla_fp8 += pagedattn::is_fp8(c.kv_dtype);
    n.mla_combined += c.combined;
  }
  n.mla_unsupported += o.unsupported;
  if (o.failed()) ++n.failures;
  n.worst_ratio = std::max(n.worst_ratio, o.worst_ratio);
}

std::string counts_text(const Counts& n, double elapsed) {
  // Every layout but the default one, in kAllKvLayouts order.
  std::string layouts;
  for (pagedattn::testing::KvLayout l : pagedattn::testing::kAllKvLayouts) {
    if (l == pagedattn::testing::KvLayout::kHnd) continue;
    layouts += std::string(layouts.empty() ? "" : ", ") + pagedattn::testing::kv_layout_name(l) +
               " " + std::to_string(n.layouts[static_cast<std::size_t>(l)]);
  }
  char buf[1280];
  std::snprintf(
      buf, sizeof buf,
      "%lld cases in %.1fs (%.0f/s): valid %lld (huge-logit %lld, split-length %lld, "
      "batch 0 %lld; variants: window %lld, soft-cap %lld, alibi %lld, sinks %lld; "
      "multi-token %lld, tree masks %lld; head dim without a cuda kernel %lld; strided: "
      "q %lld, out %lld, misaligned for cuda %lld; "
      "layouts: %s, misaligned for cuda %lld; quantized: e4m3 %lld, e5m2 %lld, int8 "
      "%lld, int4 %lld, per-head scales %lld, token scales %lld (strided %lld)), malformed %lld; "
      "mla %lld (multi-token %lld, fp8 %lld, combined cache %lld, malformed %lld; runs refused "
      "as unsupported %lld); batch-invariance checks %lld; forked %lld, shared-prefix checks "
      "%lld; failures %lld; worst err/tol %.3g",
      n.cases, elapsed, elapsed > 0 ? n.cases / elapsed : 0.0, n.valid, n.huge, n.long_ctx,
      n.empty_batch, n.window, n.soft_cap, n.alibi, n.sinks, n.multi_token, n.tree, n.no_cuda_dim,
      n.strided_q, n.strided_out, n.misaligned, layouts.c_str(), n.misaligned_kv, n.fp8_e4m3,
      n.fp8_e5m2, n.int8, n.int4, n.per_head_scales, n.token_scales, n.strided_token_scales,
      n.malformed, n.mla, n.mla_multi_token, n.mla_fp8, n.mla_combined, n.mla_malformed,
      n.mla_unsupported, n.invariance_checks, n.forked, n.shared_checks, n.failures, n.worst_ratio);
  return buf;
}

std::string outcome_text(const pf::Outcome& o) { return "[" + o.oracle + "] " + o.message; }

// Reports a failure, shrinks it, saves the shrunk case. Returns the path of the case file.
std::string handle_failure(const Config& cfg, const pf::CheckOptions& check, const pf::FuzzCase& c,
                           const pf::Outcome& o, const std::string& replay_line) {
  std::printf("FAIL %s\n  case:   %s\n  replay: %s\n", outcome_text(o).c_str(),
              pf::describe(c).c_str(), replay_line.c_str());
  std::fflush(stdout);
  pf::FuzzCase minimal = c;
  pf::Outcome last = o;
  if (cfg.max_shrink > 0) {
    pf::ShrinkStats stats;
    minimal = pf::shrink_case(
        c,
        [&](const pf::FuzzCase& cand) {
          const pf::Outcome r = pf::check_case(cand, check);
          if (r.failed() && r.oracle == o.oracle) {
            last = r;
            return true;
          }
          return false;
        },
        cfg.max_shrink, &stats);
    std::printf("  shrunk (%d evaluations, %d steps): %s\n  still fails: %s\n", stats.evaluations,
                stats.accepted, pf::describe(minimal).c_str(), outcome_text(last).c_str());
  }
  const std::string path = cfg.out_dir + "/fuzz-fail-" + std::to_string(c.origin_seed) + "-" +
                           std::to_string(c.origin_index) + ".case";
  try {
    pf::save_case(minimal, path);
    std::printf("  saved:  %s\n  replay: pagedattn-fuzz %s --replay %s\n", path.c_str(),
                common_flags(cfg).c_str(), path.c_str());
  } catch (const std::exception& e) {
    std::printf("  could not save the case: %s\n%s", e.what(), pf::to_text(minimal).c_str());
  }
  std::fflush(stdout);
  return path;
}

// Reports a failing MLA case and saves it. MLA cases are not shrunk: the case file holds the case
// as drawn. Returns the path of the case file.
std::string handle_mla_failure(const Config& cfg, const pf::MlaFuzzCase& c, const pf::Outcome& o,
                               const std::string& replay_line) {
  std::printf("FAIL %s\n  case:   %s\n  replay: %s\n", outcome_text(o).c_str(),
              pf::describe(c).c_str(), replay_line.c_str());
  const std::string path = cfg.out_dir + "/fuzz-fail-" + std::to_string(c.origin_seed) + "-" +
                           std::to_string(c.origin_index) + ".case";
  try {
    pf::save_mla_case(c, path);
    std::printf("  saved (not shrunk): %s\n  replay: pagedattn-fuzz %s --replay %s\n", path.c_str(),
                common_flags(cfg).c_str(), path.c_str());
  } catch (const std::exception& e) {
    std::printf("  could not save the case: %s\n%s", e.what(), pf::to_mla_text(c).c_str());
  }
  std::fflush(stdout);
  return path;
}

// One case of either kind, as drawn or read from a case file.
struct AnyCase {
  bool mla = false;
  pf::FuzzCase gqa;
  pf::MlaFuzzCase mla_case;

  std::string text() const { return mla ? pf::to_mla_text(mla_case) : pf::to_text(gqa); }
  std::string describe() const { return mla ? pf::describe(mla_case) : pf::describe(gqa); }
  pf::Outcome check(const pf::CheckOptions& options) const {
    return mla ? pf::check_mla_case(mla_case, options) : pf::check_case(gqa, options);
  }
};

AnyCase draw_any(const Config& cfg, const pf::DrawOptions& draw, std::uint64_t i) {
  AnyCase c;
  c.mla = pf::is_mla_index(cfg.seed, i, cfg.mla_share);
  if (c.mla) {
    c.mla_case = pf::draw_mla_case(cfg.seed, i);
  } else {
    c.gqa = pf::draw_case(cfg.seed, i, draw);
  }
  return c;
}

// A case file of either kind (an MLA one starts with the key "mla").
AnyCase load_any(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw std::runtime_error("cannot read " + path);
  std::ostringstream ss;
  ss << f.rdbuf();
  AnyCase c;
  c.mla = pf::is_mla_text(ss.str());
  if (c.mla) {
    c.mla_case = pf::from_mla_text(ss.str());
  } else {
    c.gqa = pf::from_text(ss.str());
  }
  return c;
}

// --index or --replay: one case, printed or checked.
int run_one(const Config& cfg, const pf::CheckOptions& check, const pf::DrawOptions& draw) {
  AnyCase c;
  try {
    c = cfg.replay.empty() ? draw_any(cfg, draw, static_cast<std::uint64_t>(cfg.index))
                           : load_any(cfg.replay);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pagedattn-fuzz: %s\n", e.what());
    return 2;
  }
  if (cfg.print_case) {
    std::printf("%s", c.text().c_str());
    return 0;
  }
  std::printf("case: %s\n", c.describe().c_str());
  const pf::Outcome o = c.check(check);
  if (o.verdict == pf::Verdict::kInapplicable) {
    std::printf("inapplicable: %s\n", o.message.c_str());
    return 2;
  }
  if (o.unsupported > 0 && !o.failed()) {
    std::printf("(%d backend runs refused it as unsupported)\n", o.unsupported);
  }
  std::printf("%s\n", o.failed() ? ("FAIL " + outcome_text(o)).c_str() : "pass");
  return o.failed() ? 1 : 0;
}

int run(int argc, char** argv) {
  const Config cfg = parse(argc, argv);
  if (cfg.help) {
    print_help();
    return 0;
  }
  pf::set_fault(parse_fault(cfg.fault));

  pf::CheckOptions check;
  check.backends = cfg.backends;
  check.threads = cfg.threads;
  pf::DrawOptions draw;
  for (Backend b : cfg.backends) {
    if (b == Backend::kCuda) {
      draw.cuda = true;
      std::string why;
      if (!pagedattn::cuda_available(&why)) {
        std::fprintf(stderr, "pagedattn-fuzz: the cuda backend is unavailable: %s\n", why.c_str());
        return 2;
      }
    }
  }

  if (!cfg.replay.empty() || cfg.index >= 0) return run_one(cfg, check, draw);

  const bool live = cfg.progress && isatty(STDERR_FILENO);
  const double progress_every = live ? 1.0 : 10.0;
  std::fprintf(stderr, "pagedattn-fuzz: seed %llu, backends %s%s%s\n",
               static_cast<unsigned long long>(cfg.seed), cfg.backend_text.c_str(),
               cfg.fault.empty() ? "" : ", planted fault ", cfg.fault.c_str());
  const auto start = Clock::now();
  double next_report = progress_every;
  Counts n;
  for (std::uint64_t i = 0;; ++i) {
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    if (cfg.iters >= 0 && static_cast<long long>(i) >= cfg.iters) break;
    if (cfg.seconds >= 0 && elapsed >= cfg.seconds) break;
    if (cfg.progress && elapsed >= next_report) {
      std::fprintf(stderr, live ? "\r%s   " : "%s\n", counts_text(n, elapsed).c_str());
      next_report = elapsed + progress_every;
    }
    const AnyCase c = draw_any(cfg, draw, i);
    const pf::Outcome o = c.check(check);
    if (c.mla) {
      count_mla(n, c.mla_case, o);
    } else {
      count(n, c.gqa, o);
    }
    if (o.verdict == pf::Verdict::kInapplicable) {
      std::fprintf(stderr, "\npagedattn-fuzz: generator bug: case %llu: %s\n",
                   static_cast<unsigned long long>(i), o.message.c_str());
      return 3;
    }
    if (o.failed()) {
      if (live) std::fprintf(stderr, "\n");
      const std::string replay_line = "pagedattn-fuzz " + common_flags(cfg) + " --seed " +
                                      std::to_string(cfg.seed) + " --index " + std::to_string(i);
      if (c.mla) {
        handle_mla_failure(cfg, c.mla_case, o, replay_line);
      } else {
        handle_failure(cfg, check, c.gqa, o, replay_line);
      }
      std::printf("detected after %lld cases\n", n.cases);
      const double t = std::chrono::duration<double>(Clock::now() - start).count();
      std::printf("%s\n", counts_text(n, t).c_str());
      return cfg.expect_failure ? 0 : 1;
    }
  }
  const double t = std::chrono::duration<double>(Clock::now() - start).count();
  if (live) std::fprintf(stderr, "\n");
  std::printf("%s\n", counts_text(n, t).c_str());
  if (cfg.expect_failure) {
    std::printf("expected a failure, found none\n");
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Many small parallel regions on a shared machine: waiting threads should sleep, not spin.
  setenv("OMP_WAIT_POLICY", "passive", 0);
  return pagedattn::cli::guarded_main("pagedattn-fuzz", [&] { return run(argc, argv); });
}
