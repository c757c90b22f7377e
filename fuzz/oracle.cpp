#include "oracle.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <limits>
#include <random>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "fault_injection.hpp"
#include "pagedattn/cache_layout.hpp"
#include "pagedattn/context_parallel.hpp"
#include "pagedattn/detail/dispatch.hpp"
#include "pagedattn/reference.hpp"
#include "pagedattn/testing/cp_shares.hpp"
#include "pagedattn/testing/device_case.hpp"

namespace pagedattn::fuzz {
namespace {

constexpr double kU = 0x1p-24;  // unit roundoff of f32

// Outputs of one run, widened to double.
struct Result {
  std::vector<double> out, lse;
};

Result read_outputs(const testing::HostCase& h) {
  Result r;
  const std::size_t n = h.out.size() / dtype_size(h.spec.out_dtype);
  r.out.resize(n);
  for (std::size_t i = 0; i < n; ++i) r.out[i] = load_as_float(h.out.data(), h.spec.out_dtype, i);
  r.lse.assign(h.lse.begin(), h.lse.end());
  return r;
}

// `checked`: the CUDA backend validates its device-resident tables (the CPU path always does).
void run_backend(Backend backend, const DecodeArgs& args, int threads, bool single_split,
                 bool checked) {
  detail::DecodeOptions o;
  o.backend = backend;
  o.num_threads = threads;
  o.single_split = single_split;
  o.fault = planted_fault();
  o.cuda_checked = checked;
  if (backend == Backend::kCuda) {
    testing::cuda_decode_from_host(args, o);
  } else {
    detail::decode(args, o);
  }
}

std::string where(std::size_t i, int H, int D) {
  std::ostringstream os;
  os << "out[" << i / D / H << "][" << (i / D) % H << "][" << i % D << "]";
  return os.str();
}

// The f32 logit error bound of an inexact case: |fl(s_t) - s_t| <= c * u * scale * sum |q_d k_d|
// with c = 2 sqrt(D) + 4 (probabilistic rounding-error growth of a D-term dot product, plus the
// rounding of q * scale and of the logit itself). Returns that bound over every (b, h, t) read
// and the largest |V| read.
void logit_error_bound(const DecodeArgs& a, double* logit_err, double* max_abs_v) {
  const CacheLayout layout =
      CacheLayout::dense(a.num_blocks, a.num_kv_heads, a.block_size, a.head_dim);
  const BlockTableView table{a.block_table, a.max_blocks_per_seq, a.table_stride()};
  const int H = a.num_heads, D = a.head_dim, G = a.group_size();
  double worst = 0, vmax = 0;
  std::vector<double> q(D), k(D);
  for (int b = 0; b < a.batch; ++b) {
    for (int t = 0; t < a.context_lens[b]; ++t) {
      for (int kv = 0; kv < a.num_kv_heads; ++kv) {
        const std::int64_t base =
            layout.offset(table.block(b, t / a.block_size), kv, t % a.block_size);
        for (int d = 0; d < D; ++d) {
          k[d] = std::fabs(load_as_float(a.k_cache, a.k_dtype, base + d));
          vmax = std::max<double>(vmax, std::fabs(load_as_float(a.v_cache, a.v_dtype, base + d)));
        }
        for (int g = 0; g < G; ++g) {
          const std::size_t qb = (static_cast<std::size_t>(b) * H + kv * G + g) * D;
          double sum = 0;
          for (int d = 0; d < D; ++d)
            sum += std::fabs(load_as_float(a.q, a.q_dtype, qb + d)) * k[d];
          worst = std::max(worst, sum);
        }
      }
    }
  }
  *logit_err = (2 * std::sqrt(static_cast<double>(D)) + 4) * kU * a.effective_scale() * worst;
  *max_abs_v = vmax;
}

double max_abs_finite(const void* data, DType t, std::size_t n) {
  double m = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double x = std::fabs(load_as_float(data, t, i));
    if (std::isfinite(x)) m = std::max(m, x);
  }
  return m;
}

Tolerance tolerance_for(const FuzzCase& c, const DecodeArgs& a, const ReferenceResult& ref) {
  Tolerance t;
  double ref_scale = 1e-30, lse_scale = 0;
  for (double x : ref.out) ref_scale = std::max(ref_scale, std::fabs(x));
  for (double x : ref.lse) {
    if (std::isfinite(x)) lse_scale = std::max(lse_scale, std::fabs(x));
  }
  int max_len = 0;
  for (int b = 0; b < a.batch; ++b) max_len = std::max(max_len, a.context_lens[b]);
  // The tolerance policy (testing/tolerance.hpp) covers f32 arithmetic and the output rounding;
  // lse is stored in f32, whose own rounding at |lse| ~ 1e4 (half an ulp, u * |lse|) exceeds its
  // fixed part.
  t.out_abs = testing::out_tolerance(a.out_dtype) * ref_scale;
  t.lse_abs = testing::lse_tolerance() + 4 * kU * lse_scale;

  // Even exact logits reach exp() through f32 arguments: a backend may form s * log2(e) - m *
  // log2(e) (or s - m after a scaled dot), each rounded at |s| u, so every weight carries a
  // relative error up to about 8 u |m|, with |m| <= |lse| + ln L.
  double ds = 8 * kU * (lse_scale + std::log1p(static_cast<double>(max_len)));
  double vmax = 0;
  // Snapped values times a power-of-two scale give exact logits; anything else at huge
  // magnitudes (a shrunk case may keep snapped values with the default scale) adds the f32
  // error bound of the dot products.
  int exponent = 0;
  const bool exact_logits = c.snap && a.scale && std::frexp(*a.scale, &exponent) == 0.5f;
  if (!exact_logits && c.huge()) {
    logit_error_bound(a, &t.logit_err, &vmax);
    ds += t.logit_err;
  } else {
    const CacheLayout layout =
        CacheLayout::dense(a.num_blocks, a.num_kv_heads, a.block_size, a.head_dim);
    vmax = max_abs_finite(a.v_cache, a.v_dtype, static_cast<std::size_t>(layout.elements()));
  }
  // A logit error ds moves every softmax weight by at most a factor exp(+-2 ds): out by
  // (exp(2 ds) - 1) max|V|, lse by ds.
  t.out_abs += std::expm1(2 * ds) * vmax;
  t.lse_abs += ds;
  return t;
}

// Compares `got` with `want` (the reference or another run). Returns an empty string when they
// agree; `ratio` gets the worst error / tolerance.
std::string compare(const Result& got, const std::vector<double>& want_out,
                    const std::vector<double>& want_lse, const Tolerance& tol, int H, int D,
                    double* ratio) {
  for (std::size_t i = 0; i < want_out.size(); ++i) {
    const double err = std::fabs(got.out[i] - want_out[i]);
    *ratio = std::max(*ratio, err / tol.out_abs);
    if (!(err <= tol.out_abs)) {
      std::ostringstream os;
      os << where(i, H, D) << " = " << got.out[i] << ", expected " << want_out[i] << " (|err| "
         << err << " > tol " << tol.out_abs << ")";
      return os.str();
    }
  }
  for (std::size_t i = 0; i < want_lse.size(); ++i) {
    const double g = got.lse[i], w = want_lse[i];
    bool ok;
    if (std::isinf(w) || std::isinf(g)) {
      ok = g == w;
    } else {
      const double err = std::fabs(g - w);
      *ratio = std::max(*ratio, err / tol.lse_abs);
      ok = err <= tol.lse_abs;
    }
    if (!ok) {
      std::ostringstream os;
      os << "lse[" << i / H << "][" << i % H << "] = " << g << ", expected " << w << " (tol "
         << tol.lse_abs << ")";
      return os.str();
    }
  }
  return {};
}

// Every element written and finite (outputs were poisoned with NaN before the run); lse is -inf
// exactly for an empty context.
std::string check_finite(const Result& r, const testing::HostCase& h) {
  const int H = h.spec.num_heads, D = h.spec.head_dim;
  for (std::size_t i = 0; i < r.out.size(); ++i) {
    if (!std::isfinite(r.out[i])) {
      std::ostringstream os;
      os << where(i, H, D) << " = " << r.out[i] << " (unwritten or not finite)";
      return os.str();
    }
  }
  for (std::size_t i = 0; i < r.lse.size(); ++i) {
    const bool empty = h.context_lens[i / H] == 0;
    const double x = r.lse[i];
    if (empty ? !(std::isinf(x) && x < 0) : !std::isfinite(x)) {
      std::ostringstream os;
      os << "lse[" << i / H << "][" << i % H << "] = " << x
         << (empty ? " (expected -inf: empty context)" : " (unwritten or not finite)");
      return os.str();
    }
  }
  return {};
}

// Context parallelism, on the CPU backend when it is tested: the blocks of every sequence shared
// out among 2 or 3 ranks of the in-process group at random cut points (some ranks holding none),
// each rank decoding its share with context_parallel_decode on one thread; every rank must get
// the same bits, and they must pass the finite and reference checks of a plain run.
std::string check_context_parallel(const FuzzCase& c, BuiltCase& bc, const ReferenceResult& ref,
                                   const Tolerance& tol, double* worst_ratio,
                                   const CheckOptions& options) {
  const DecodeArgs& a = bc.args;
  testing::HostCase& h = bc.host;
  if (a.batch == 0 || std::find(options.backends.begin(), options.backends.end(), Backend::kCpu) ==
                          options.backends.end()) {
    return {};
  }
  const int ranks = 2 + static_cast<int>((c.spec.seed >> 11) & 1);
  std::mt19937 rng(static_cast<std::uint32_t>(c.spec.seed * 2654435761u + 17));
  const std::vector<testing::RankShare> shares =
      testing::share_out(h, ranks, testing::Share::kRanges, rng);
  auto group = make_local_group(ranks);
  std::vector<std::vector<std::uint8_t>> outs(ranks, std::vector<std::uint8_t>(h.out.size()));
  std::vector<std::vector<float>> lses(ranks, std::vector<float>(h.lse.size(), NAN));
  std::vector<std::string> errors(ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      DecodeArgs mine = a;
      mine.block_table = shares[r].table.data();
      mine.context_lens = shares[r].lens.data();
      mine.out = outs[r].data();
      mine.lse = a.lse != nullptr ? lses[r].data() : nullptr;
      DecodeOptions o;
      o.backend = Backend::kCpu;
      o.num_threads = 1;
      try {
        context_parallel_decode(mine, *group[r], o);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const std::string tag = std::to_string(ranks) + " ranks: ";
  for (int r = 0; r < ranks; ++r) {
    if (!errors[r].empty()) return tag + "rank " + std::to_string(r) + " threw: " + errors[r];
  }
  for (int r = 1; r < ranks; ++r) {
    if (outs[r] != outs[0] ||
        std::memcmp(lses[r].data(), lses[0].data(), lses[0].size() * sizeof(float)) != 0) {
      return tag + "rank " + std::to_string(r) + " got other bits than rank 0";
    }
  }
  h.out = outs[0];
  if (a.lse != nullptr) std::copy(lses[0].begin(), lses[0].end(), h.lse.begin());
  const Result got = read_outputs(h);
  if (std::string bad = check_finite(got, h); !bad.empty()) return tag + bad;
  const std::string bad = compare(got, ref.out, ref.lse, tol, a.num_heads, a.head_dim, worst_ratio);
  return bad.empty() ? bad : tag + bad;
}

Outcome fail(const std::string& oracle, const std::string& message) {
  Outcome o;
  o.verdict = Verdict::kFail;
  o.oracle = oracle;
  o.message = message;
  return o;
}

Outcome check_malformed(BuiltCase& bc, const CheckOptions& options, int threads) {
  testing::HostCase& h = bc.host;
  for (Backend backend : options.backends) {
    const std::string tag = std::string(backend_name(backend)) + ": ";
    h.poison_outputs();
    const std::vector<std::uint8_t> out_before = h.out;
    const std::vector<float> lse_before = h.lse;
    try {
      run_backend(backend, bc.args, threads, false, /*checked=*/true);
      return fail("error", tag + "accepted invalid input, expected " +
                               error_code_name(bc.expected_code) + " on '" + bc.expected_argument +
                               "'");
    } catch (const Error& e) {
      if (e.code() != bc.expected_code || e.argument() != bc.expected_argument) {
        return fail("error", tag + "raised " + error_code_name(e.code()) + " on '" + e.argument() +
                                 "' (" + e.what() + "), expected " +
                                 error_code_name(bc.expected_code) + " on '" +
                                 bc.expected_argument + "'");
      }
    } catch (const std::exception& e) {
      return fail("error", tag + "threw a non-pagedattn exception: " + e.what());
    }
    if (h.out != out_before ||
        std::memcmp(h.lse.data(), lse_before.data(), h.lse.size() * sizeof(float)) != 0) {
      return fail("untouched", tag + "wrote out or lse before rejecting the input");
    }
  }
  return {};
}

}  // namespace

Outcome check_case(const FuzzCase& c, const CheckOptions& options) {
  BuiltCase bc;
  try {
    bc = build_case(c);
  } catch (const std::invalid_argument& e) {
    Outcome o;
    o.verdict = Verdict::kInapplicable;
    o.message = e.what();
    return o;
  }
  const int threads = options.threads > 0 ? options.threads : c.threads;
  if (c.malformed()) return check_malformed(bc, options, threads);

  testing::HostCase& h = bc.host;
  const DecodeArgs& a = bc.args;
  ReferenceResult ref;
  try {
    ref = reference_decode(a);
  } catch (const std::exception& e) {
    return fail("reference", std::string("the reference rejected a valid case: ") + e.what());
  }
  const Tolerance tol = tolerance_for(c, a, ref);
  const int H = a.num_heads, D = a.head_dim;

  Outcome outcome;
  std::vector<Result> planned;
  for (Backend backend : options.backends) {
    const std::string tag = std::string(backend_name(backend)) + ": ";
    Result runs[2];  // [0] the planner's plan, [1] a single split
    for (int single = 0; single < 2; ++single) {
      h.poison_outputs();
      try {
        // Checked and unchecked CUDA runs must agree on valid input: alternate per case.
        run_backend(backend, a, threads, single == 1, (c.spec.seed >> 7) & 1);
      } catch (const std::exception& e) {
        return fail("throw", tag + "threw on a valid case: " + e.what());
      }
      runs[single] = read_outputs(h);
      const std::string plan = single ? "single split: " : "";
      if (std::string bad = check_finite(runs[single], h); !bad.empty()) {
        return fail("finite", tag + plan + bad);
      }
      if (std::string bad =
              compare(runs[single], ref.out, ref.lse, tol, H, D, &outcome.worst_ratio);
          !bad.empty()) {
        return fail("reference", tag + plan + bad);
      }
    }
    // Plan invariance: the split plan may only change the rounding.
    double ignored = 0;
    if (std::string bad = compare(runs[0], runs[1].out, runs[1].lse, tol, H, D, &ignored);
        !bad.empty()) {
      return fail("plan", tag + "planner vs single split: " + bad);
    }
    planned.push_back(std::move(runs[0]));
  }
  if (std::string bad = check_context_parallel(c, bc, ref, tol, &outcome.worst_ratio, options);
      !bad.empty()) {
    return fail("context-parallel", bad);
  }
  // Backends against each other (the first one listed is the baseline).
  for (std::size_t i = 1; i < planned.size(); ++i) {
    double ignored = 0;
    if (std::string bad = compare(planned[i], planned[0].out, planned[0].lse, tol, H, D, &ignored);
        !bad.empty()) {
      return fail("cross", std::string(backend_name(options.backends[i])) + " vs " +
                               backend_name(options.backends[0]) + ": " + bad);
    }
  }
  return outcome;
}

}  // namespace pagedattn::fuzz
