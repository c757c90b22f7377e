#include "oracle.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "batch_invariance_check.hpp"
#include "build_case.hpp"
#include "context_parallel_check.hpp"
#include "oracle_parts.hpp"
#include "output_checks.hpp"
#include "pagedattn/reference.hpp"
#include "run_backend.hpp"
#include "shared_prefix_check.hpp"
#include "tolerance.hpp"

namespace pagedattn::fuzz {
namespace {

// Expects `backend` to raise `code` on `argument`, leaving out (its gaps included) and lse as they
// were: a passing outcome when it does, else the failing oracle's. `what` names the input.
Outcome expect_error(Backend backend, BuiltCase& bc, int threads, bool checked, ErrorCode code,
                     const std::string& argument, const std::string& what) {
  testing::HostCase& h = bc.host;
  const std::string tag = std::string(backend_name(backend)) + ": ";
  const std::string want = std::string(error_code_name(code)) + " on '" + argument + "'";
  bc.poison_outputs();
  const std::vector<std::uint8_t> out_before = bc.out_buffer();
  const std::vector<float> lse_before = h.lse;
  try {
    run_backend(backend, bc, threads, false, checked);
    return failure("error", tag + "accepted " + what + ", expected " + want);
  } catch (const Error& e) {
    if (e.code() != code || e.argument() != argument) {
      return failure("error", tag + "raised " + error_code_name(e.code()) + " on '" + e.argument() +
                                  "' (" + e.what() + "), expected " + want);
    }
  } catch (const std::exception& e) {
    return failure("error", tag + "threw a non-pagedattn exception: " + e.what());
  }
  if (bc.out_buffer() != out_before ||
      std::memcmp(h.lse.data(), lse_before.data(), h.lse.size() * sizeof(float)) != 0) {
    return failure("untouched", tag + "wrote out or lse before rejecting the input");
  }
  return {};
}

Outcome check_malformed(BuiltCase& bc, const CheckOptions& options, int threads) {
  for (Backend backend : options.backends) {
    // The CUDA backend may refuse a head dim or a misaligned stride first (BuiltCase::
    // cuda_refuses).
    const bool cuda_first = backend == Backend::kCuda && !bc.cuda_refuses.empty();
    Outcome o = expect_error(backend, bc, threads, /*checked=*/true,
                             cuda_first ? bc.cuda_refuses_code : bc.expected_code,
                             cuda_first ? bc.cuda_refuses : bc.expected_argument, "invalid input");
    if (o.failed()) return o;
  }
  return {};
}

}  // namespace

Outcome check_case(const FuzzCase& c, const CheckOptions& options) {
  BuiltCase bc;
  try {
    bc = build_case(c);
  } catch (const std::invalid_argument& e) {
    return inapplicable(e.what());
  }
  const int threads = options.threads > 0 ? options.threads : c.threads;
  if (c.malformed()) return check_malformed(bc, options, threads);

  const DecodeArgs& a = bc.args;
  // The reference over the dense K and V (and per-token scales), which the layouts only move:
  // whatever the backends do with kv_strides, they are held to the same attention.
  ReferenceResult ref;
  try {
    ref = reference_decode(bc.dense_args());
  } catch (const std::exception& e) {
    return failure("reference", std::string("the reference rejected a valid case: ") + e.what());
  }
  if (bc.laid_out() || bc.token_scales_laid_out()) {
    // The reference reads kv_strides (and token_scale_strides) too: over the laid-out cache it
    // must give the same bits.
    if (std::string bad = check_layout_reference(bc, ref); !bad.empty()) {
      return failure("layout", bad);
    }
  }
  // The CPU's bounds, and the CUDA backend's where it runs (no tighter, see tolerance_for).
  const Tolerance cpu_tol = tolerance_for(c, bc, ref, Backend::kCpu);
  const bool cuda = std::find(options.backends.begin(), options.backends.end(), Backend::kCuda) !=
                    options.backends.end();
  const Tolerance cuda_tol = cuda ? tolerance_for(c, bc, ref, Backend::kCuda) : cpu_tol;
  // Checked and unchecked CUDA runs must agree on valid input: alternate per case.
  const bool checked = (c.spec.seed >> 7) & 1;

  Outcome outcome;
  std::vector<std::pair<Backend, Outputs>> planned;
  for (Backend backend : options.backends) {
    const std::string tag = std::string(backend_name(backend)) + ": ";
    if (backend == Backend::kCuda && !bc.cuda_refuses.empty()) {
      // A head dim or a stride the CPU takes and the CUDA backend must refuse, naming it.
      Outcome o = expect_error(backend, bc, threads, checked, bc.cuda_refuses_code, bc.cuda_refuses,
                               "a case it must refuse (" + bc.cuda_refuses + ")");
      if (o.failed()) return o;
      continue;
    }
    const Tolerance& tol = backend == Backend::kCuda ? cuda_tol : cpu_tol;
    Outputs runs[2];  // [0] the planner's plan, [1] a single split
    for (int single = 0; single < 2; ++single) {
      bc.poison_outputs();
      try {
        run_backend(backend, bc, threads, single == 1, checked);
      } catch (const std::exception& e) {
        return failure("throw", tag + "threw on a valid case: " + e.what());
      }
      const std::string plan = single ? "single split: " : "";
      if (std::string bad = check_gaps(bc); !bad.empty()) return failure("gap", tag + plan + bad);
      runs[single] = read_outputs(bc);
      if (std::string bad = check_finite(runs[single], bc, a.sinks); !bad.empty()) {
        return failure("finite", tag + plan + bad);
      }
      if (std::string bad = compare(bc, runs[single], ref.out, ref.lse, tol, &outcome.worst_ratio);
          !bad.empty()) {
        return failure("reference", tag + plan + bad);
      }
    }
    // Plan invariance: the split plan may only change the rounding.
    double ignored = 0;
    if (std::string bad = compare(bc, runs[0], runs[1].out, runs[1].lse, tol, &ignored);
        !bad.empty()) {
      return failure("plan", tag + "planner vs single split: " + bad);
    }
    bool shared = false;
    if (std::string bad = check_shared_prefixes(backend, bc, runs[0], tol, threads, &shared);
        !bad.empty()) {
      return failure("shared-prefix", bad);
    }
    outcome.shared_prefix_checks += shared;
    if (std::string bad = check_batch_invariance(backend, c, bc, ref, tol, threads, checked,
                                                 &outcome.worst_ratio);
        !bad.empty()) {
      return failure("batch-invariant", bad);
    }
    outcome.invariance_checks += a.batch > 0;
    planned.emplace_back(backend, std::move(runs[0]));
  }
  if (std::string bad = check_context_parallel(c, bc, ref, cpu_tol, &outcome.worst_ratio, options);
      !bad.empty()) {
    return failure("context-parallel", bad);
  }
  // Backends against each other, to the looser bounds.
  const Outcome cross = compare_backends(planned, [&](const Outputs& run, const Outputs& base) {
    double ignored = 0;
    return compare(bc, run, base.out, base.lse, cuda_tol, &ignored);
  });
  return cross.failed() ? cross : outcome;
}

}  // namespace pagedattn::fuzz
