#include "output_checks.hpp"

#include <algorithm>
#include <cmath>
#include <exception>
#include <sstream>
#include <string>
#include <vector>

#include "pagedattn/testing/kv_layouts.hpp"

namespace pagedattn::fuzz {
namespace {

// Row r of q, out and lse, for messages: its sequence, and with multi-token queries which of the
// sequence's query tokens it is and the context it attends.
std::string row_text(const BuiltCase& bc, std::size_t r) {
  if (bc.q_indptr.empty() || r >= bc.row_seq.size()) return {};
  const int b = bc.row_seq[r];
  std::ostringstream os;
  os << " (sequence " << b << "'s query token " << static_cast<int>(r) - bc.q_indptr[b] << " of "
     << bc.q_indptr[b + 1] - bc.q_indptr[b] << ", context " << bc.row_lens[r] << " of "
     << bc.host.context_lens[b];
  if (!bc.tree_mask_indptr.empty())
    os << ", " << bc.row_attended[r] << " attended by its tree mask";
  os << ")";
  return os.str();
}

std::string where(const BuiltCase& bc, std::size_t i, int H, int D) {
  std::ostringstream os;
  os << "out[" << i / D / H << "][" << (i / D) % H << "][" << i % D << "]"
     << row_text(bc, i / D / H);
  return os.str();
}

// Every byte of out's gaps (after each row of a strided out) still kOutGapByte: no backend may
// write there. Empty when so.
std::string check_gaps(const testing::HostCase& h, int rows, const std::vector<std::uint8_t>& out,
                       std::int64_t stride) {
  const std::size_t osz = dtype_size(h.spec.out_dtype);
  const std::int64_t row = static_cast<std::int64_t>(h.spec.num_heads) * h.spec.head_dim;
  if (stride == row) return {};
  for (int b = 0; b < rows; ++b) {
    for (std::int64_t i = row; i < stride; ++i) {
      const std::size_t at = static_cast<std::size_t>(b * stride + i) * osz;
      if (std::any_of(out.begin() + static_cast<std::ptrdiff_t>(at),
                      out.begin() + static_cast<std::ptrdiff_t>(at + osz),
                      [](std::uint8_t x) { return x != kOutGapByte; })) {
        std::ostringstream os;
        os << "out gap element " << i - row << " after row " << b << " (element " << b * stride + i
           << " of out, row stride " << stride
           << ") written: " << load_as_float(out.data(), h.spec.out_dtype, b * stride + i);
        return os.str();
      }
    }
  }
  return {};
}

// The laid-out cache a layout check reads, for messages: "nhd cache", "hnd cache with strided
// token scales".
std::string layout_text(const BuiltCase& bc) {
  return std::string(testing::kv_layout_name(bc.kv.layout)) + " cache" +
         (bc.token_scales_laid_out() ? " with strided token scales" : "");
}

}  // namespace

Outputs read_outputs(const testing::HostCase& h, int rows, const std::vector<std::uint8_t>& out,
                     std::int64_t stride, const std::vector<float>& lse) {
  Outputs r;
  const DType t = h.spec.out_dtype;
  const std::int64_t row = static_cast<std::int64_t>(h.spec.num_heads) * h.spec.head_dim;
  r.out.resize(static_cast<std::size_t>(rows * row));
  for (int b = 0; b < rows; ++b) {
    for (std::int64_t i = 0; i < row; ++i) {
      r.out[static_cast<std::size_t>(b * row + i)] = load_as_float(out.data(), t, b * stride + i);
    }
  }
  r.lse.assign(lse.begin(), lse.begin() + static_cast<std::ptrdiff_t>(rows) * h.spec.num_heads);
  return r;
}

Outputs read_outputs(const BuiltCase& bc) {
  return read_outputs(bc.host, bc.rows, bc.out_buffer(), bc.out_stride, bc.host.lse);
}

std::string check_gaps(const BuiltCase& bc) {
  if (bc.rows == 0 && bc.host.spec.batch > 0) {
    // No query tokens: the row q and out hold (not to be null) is no output, and lse has none.
    const std::uint8_t poison = bc.out_rows.empty() ? 0xff : kOutGapByte;
    const std::vector<std::uint8_t>& out = bc.out_buffer();
    if (std::any_of(out.begin(), out.end(), [&](std::uint8_t x) { return x != poison; }) ||
        !std::all_of(bc.host.lse.begin(), bc.host.lse.end(),
                     [](float x) { return std::isnan(x); })) {
      return "out or lse written by a call without query tokens";
    }
    return {};
  }
  return bc.out_rows.empty() ? std::string()
                             : check_gaps(bc.host, bc.rows, bc.out_rows, bc.out_stride);
}

// Compares `got` with `want` (the reference or another run). Returns an empty string when they
// agree; `ratio` gets the worst error / tolerance.
std::string compare(const BuiltCase& bc, const Outputs& got, const std::vector<double>& want_out,
                    const std::vector<double>& want_lse, const Tolerance& tol, double* ratio) {
  const int H = bc.args.num_heads, D = bc.args.head_dim;
  // Row by row ((row, head): one bound each), the first element out of bounds reported.
  for (std::size_t j = 0; j * D < want_out.size(); ++j) {
    const double bound = tol.out_abs[j];
    const double *g = &got.out[j * D], *w = &want_out[j * D];
    double row_err = 0;
    bool bad = false;
    for (int d = 0; d < D; ++d) {
      const double err = std::fabs(g[d] - w[d]);
      row_err = std::max(row_err, err);
      bad |= !(err <= bound);
    }
    *ratio = std::max(*ratio, row_err / bound);
    for (int d = 0; bad && d < D; ++d) {
      const double err = std::fabs(g[d] - w[d]);
      if (err <= bound) continue;
      std::ostringstream os;
      os << where(bc, j * D + d, H, D) << " = " << g[d] << ", expected " << w[d] << " (|err| "
         << err << " > tol " << bound << ")";
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
      *ratio = std::max(*ratio, err / tol.lse_abs[i]);
      ok = err <= tol.lse_abs[i];
    }
    if (!ok) {
      std::ostringstream os;
      os << "lse[" << i / H << "][" << i % H << "]" << row_text(bc, i / H) << " = " << g
         << ", expected " << w << " (tol " << tol.lse_abs[i] << ")";
      return os.str();
    }
  }
  return {};
}

// Every element written and finite (outputs were poisoned with NaN before the run), except an
// empty row's lse (a query token at a position below 0 attends to nothing, nor does one whose
// tree mask row is clear with no context before the new tokens; BuiltCase::row_attended):
// exactly -inf without a sink (or with one of -inf), else finite (the reference check holds it
// to the sink; a backend in log2 units may round it on the way).
std::string check_finite(const Outputs& r, const BuiltCase& bc, const float* sinks) {
  const int H = bc.host.spec.num_heads, D = bc.host.spec.head_dim;
  for (std::size_t i = 0; i < r.out.size(); ++i) {
    if (!std::isfinite(r.out[i])) {
      std::ostringstream os;
      os << where(bc, i, H, D) << " = " << r.out[i] << " (unwritten or not finite)";
      return os.str();
    }
  }
  for (std::size_t i = 0; i < r.lse.size(); ++i) {
    const bool empty = bc.row_attended[i / H] == 0;
    const double x = r.lse[i];
    const bool no_sink = sinks == nullptr || sinks[i % H] == -INFINITY;
    if (empty && no_sink ? !(std::isinf(x) && x < 0) : !std::isfinite(x)) {
      std::ostringstream os;
      os << "lse[" << i / H << "][" << i % H << "]" << row_text(bc, i / H) << " = " << x
         << (!empty    ? " (unwritten or not finite)"
             : no_sink ? " (expected -inf: empty context, no sink)"
                       : " (expected the sink: empty context)");
      return os.str();
    }
  }
  return {};
}

// The reference over the case's laid-out K and V and per-token scales (NaN in every gap) against
// `dense`, the one over the dense cache: the same rows read in the same order, so the same bits.
// Empty when so.
std::string check_layout_reference(const BuiltCase& bc, const ReferenceResult& dense) {
  ReferenceResult laid;
  try {
    laid = reference_decode(bc.args);
  } catch (const std::exception& e) {
    return std::string("the reference rejected the laid-out cache: ") + e.what();
  }
  const auto same = [](double x, double y) { return x == y || (std::isnan(x) && std::isnan(y)); };
  const int H = bc.args.num_heads, D = bc.args.head_dim;
  for (std::size_t i = 0; i < dense.out.size(); ++i) {
    if (i >= laid.out.size() || !same(laid.out[i], dense.out[i])) {
      std::ostringstream os;
      os << "reference over the " << layout_text(bc) << ": " << where(bc, i, H, D) << " = "
         << (i < laid.out.size() ? laid.out[i] : NAN) << ", over the dense one " << dense.out[i];
      return os.str();
    }
  }
  for (std::size_t i = 0; i < dense.lse.size(); ++i) {
    if (i >= laid.lse.size() || !same(laid.lse[i], dense.lse[i])) {
      std::ostringstream os;
      os << "reference over the " << layout_text(bc) << ": lse[" << i / H << "][" << i % H << "]"
         << row_text(bc, i / H) << " = " << (i < laid.lse.size() ? laid.lse[i] : NAN)
         << ", over the dense one " << dense.lse[i];
      return os.str();
    }
  }
  return {};
}

}  // namespace pagedattn::fuzz
