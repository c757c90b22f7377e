#include "mla_oracle.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "build_mla.hpp"
#include "oracle_parts.hpp"
#include "pagedattn/reference.hpp"
#include "run_mla.hpp"
#include "tolerance.hpp"

namespace pagedattn::fuzz {
namespace {

// The CUDA backend's refusal of an MLA shape its kernel does not take (check_mla_launch: the
// dtypes, the widths, the latent parts' alignment), which names one of these arguments.
bool no_mla_kernel(Backend backend, const Error& e) {
  if (backend != Backend::kCuda || e.code() != ErrorCode::kUnsupported) return false;
  for (const char* arg :
       {"q_dtype", "kv_dtype", "kv_lora_rank", "rope_dim", "c_strides", "kpe_strides"}) {
    if (e.argument() == arg) return true;
  }
  return false;
}

std::string tag(Backend backend) { return std::string(backend_name(backend)) + ": "; }

// out [rows][heads][rank] and lse [rows][heads] (empty without lse) as read back.
struct MlaOutputs {
  std::vector<double> out, lse;
};

MlaOutputs read_outputs(const BuiltMla& m) {
  MlaOutputs o;
  const MlaDecodeArgs& a = m.args;
  o.out.resize(static_cast<std::size_t>(m.rows * m.out_width));
  for (std::int64_t r = 0; r < m.rows; ++r) {
    for (std::int64_t i = 0; i < m.out_width; ++i) {
      o.out[static_cast<std::size_t>(r * m.out_width + i)] =
          load_as_float(m.out.data(), a.out_dtype, r * m.out_row + i);
    }
  }
  if (a.lse != nullptr) {
    o.lse.assign(m.lse.begin(), m.lse.begin() + static_cast<std::ptrdiff_t>(m.rows) * a.num_heads);
  }
  return o;
}

// Every output against `want` within `tol`; "" when all hold. Tracks the worst error / bound.
std::string compare(const BuiltMla& m, const MlaOutputs& got, const std::vector<double>& want_out,
                    const std::vector<double>& want_lse, const Tolerance& tol, double* worst) {
  const int H = m.args.num_heads, R = m.args.kv_lora_rank;
  for (std::size_t i = 0; i < got.out.size(); ++i) {
    const std::size_t row = i / R;
    const double err = std::fabs(got.out[i] - want_out[i]), bound = tol.out_abs[row];
    *worst = std::max(*worst, err / bound);
    if (!(err <= bound)) {
      std::ostringstream os;
      os.precision(9);
      os << "out[" << row / H << "][" << row % H << "][" << i % R << "] = " << got.out[i]
         << ", reference " << want_out[i] << ": error " << err << " over " << bound;
      return os.str();
    }
  }
  for (std::size_t i = 0; i < got.lse.size(); ++i) {
    const double g = got.lse[i], w = want_lse[i];
    const double err = std::isinf(w) ? (g == w ? 0 : INFINITY) : std::fabs(g - w);
    if (!std::isinf(w)) *worst = std::max(*worst, err / tol.lse_abs[i]);
    if (!(err <= tol.lse_abs[i])) {
      std::ostringstream os;
      os.precision(9);
      os << "lse[" << i / H << "][" << i % H << "] = " << g << ", reference " << w << ": error "
         << err << " over " << tol.lse_abs[i];
      return os.str();
    }
  }
  return "";
}

// The malformed case on every backend: the expected error, nothing written.
Outcome check_malformed(BuiltMla& m, const CheckOptions& options, int threads) {
  Outcome outcome;
  const std::string want =
      std::string(error_code_name(m.expected_code)) + " on '" + m.expected_argument + "'";
  for (Backend backend : options.backends) {
    m.poison_outputs();
    const std::vector<std::uint8_t> out_before = m.out;
    const std::vector<float> lse_before = m.lse;
    try {
      run_mla(backend, m, threads, false, /*checked=*/true);
      return failure("error", tag(backend) + "accepted an invalid input, expected " + want);
    } catch (const Error& e) {
      if (no_mla_kernel(backend, e) && m.expected_argument != e.argument()) {
        ++outcome.unsupported;
      } else if (e.code() != m.expected_code || e.argument() != m.expected_argument) {
        return failure("error", tag(backend) + "raised " + error_code_name(e.code()) + " on '" +
                                    e.argument() + "' (" + e.what() + "), expected " + want);
      }
    } catch (const std::exception& e) {
      return failure("error", tag(backend) + "threw a non-pagedattn exception: " + e.what());
    }
    // Bytes, not values: the poison is NaN. An empty lse (none asked for) has no data pointer.
    if (m.out != out_before || (!m.lse.empty() && std::memcmp(m.lse.data(), lse_before.data(),
                                                              m.lse.size() * sizeof(float)) != 0)) {
      return failure("untouched", tag(backend) + "wrote out or lse before rejecting the input");
    }
  }
  return outcome;
}

// One run: poisoned outputs, the call, out's gaps, finite outputs, the reference. Returns false
// (and counts it) when the backend refuses MLA as unsupported.
bool run_checked(Backend backend, BuiltMla& m, int threads, bool invariant, bool checked,
                 const ReferenceResult& ref, const Tolerance& tol, MlaOutputs* got,
                 Outcome* outcome) {
  const std::string what = tag(backend) + (invariant ? "batch-invariant: " : "");
  m.poison_outputs();
  try {
    run_mla(backend, m, threads, invariant, checked);
  } catch (const Error& e) {
    if (no_mla_kernel(backend, e)) {
      ++outcome->unsupported;
      return false;
    }
    *outcome = failure("throw", what + "threw on a valid case: " + e.what());
    return false;
  } catch (const std::exception& e) {
    *outcome = failure("throw", what + "threw on a valid case: " + e.what());
    return false;
  }
  if (std::string bad = m.check_gaps(); !bad.empty()) {
    *outcome = failure("gap", what + bad);
    return false;
  }
  *got = read_outputs(m);
  for (double x : got->out) {
    if (!std::isfinite(x)) {
      *outcome = failure("finite", what + "a non-finite out on a case whose inputs are finite");
      return false;
    }
  }
  if (std::string bad = compare(m, *got, ref.out, ref.lse, tol, &outcome->worst_ratio);
      !bad.empty()) {
    *outcome = failure("reference", what + bad);
    return false;
  }
  return true;
}

}  // namespace

Outcome check_mla_case(const MlaFuzzCase& c, const CheckOptions& options) {
  BuiltMla m;
  try {
    m = build_mla_case(c);
  } catch (const std::invalid_argument& e) {
    return inapplicable(e.what());
  }
  const int threads = options.threads > 0 ? options.threads : c.threads;
  if (c.malformed()) return check_malformed(m, options, threads);

  ReferenceResult ref;
  try {
    ref = mla_reference_decode(m.args);
  } catch (const std::exception& e) {
    return failure("reference", std::string("the reference rejected a valid case: ") + e.what());
  }
  const Tolerance tol = mla_tolerance_for(m.args, ref);
  // Checked and unchecked CUDA runs must agree on valid input: alternate per case.
  const bool checked = (c.data_seed >> 7) & 1;
  Outcome outcome;
  std::vector<std::pair<Backend, MlaOutputs>> planned;
  for (Backend backend : options.backends) {
    MlaOutputs runs[2];  // [0] the default plan, [1] the batch-invariant one
    bool ran = true;
    for (int invariant = 0; invariant < 2 && ran; ++invariant) {
      ran = run_checked(backend, m, threads, invariant == 1, checked, ref, tol, &runs[invariant],
                        &outcome);
      if (outcome.failed()) return outcome;
    }
    if (!ran) continue;  // unsupported on this backend
    double ignored = 0;
    if (std::string bad = compare(m, runs[0], runs[1].out, runs[1].lse, tol, &ignored);
        !bad.empty()) {
      return failure("plan", tag(backend) + "default vs batch-invariant plan: " + bad);
    }
    planned.emplace_back(backend, std::move(runs[0]));
  }
  const Outcome cross =
      compare_backends(planned, [&](const MlaOutputs& run, const MlaOutputs& base) {
        double ignored = 0;
        return compare(m, run, base.out, base.lse, tol, &ignored);
      });
  return cross.failed() ? cross : outcome;
}

}  // namespace pagedattn::fuzz
