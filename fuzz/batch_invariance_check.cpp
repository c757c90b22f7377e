#include "batch_invariance_check.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <random>
#include <string>
#include <vector>

#include "output_checks.hpp"
#include "run_backend.hpp"

namespace pagedattn::fuzz {
namespace {

// The rows of out, lse and q that sequence `s` owns: [first, end).
struct RowRange {
  int first = 0, end = 0;
};

RowRange rows_of(const BuiltCase& bc, int s) {
  if (bc.q_indptr.empty()) return {s, s + 1};
  return {bc.q_indptr[s], bc.q_indptr[s + 1]};
}

// What one run left in out's buffer and in lse.
struct RunBits {
  std::vector<std::uint8_t> out;
  std::vector<float> lse;
};

// The first element of sequence `s` whose bits differ between `whole` and `other`, described, or
// empty when none does.
std::string first_difference(const BuiltCase& bc, int s, const RunBits& whole,
                             const RunBits& other) {
  const DecodeArgs& a = bc.args;
  const std::size_t row_bytes =
      static_cast<std::size_t>(a.num_heads) * a.head_dim * dtype_size(a.out_dtype);
  const std::size_t stride_bytes =
      static_cast<std::size_t>(bc.out_stride) * dtype_size(a.out_dtype);
  const RowRange r = rows_of(bc, s);
  for (int row = r.first; row < r.end; ++row) {
    const std::size_t at = row * stride_bytes;
    if (std::memcmp(whole.out.data() + at, other.out.data() + at, row_bytes) != 0) {
      return "sequence " + std::to_string(s) + ", row " + std::to_string(row) + ": out differs";
    }
    if (a.lse != nullptr) {
      const std::size_t h0 = static_cast<std::size_t>(row) * a.num_heads;
      if (std::memcmp(whole.lse.data() + h0, other.lse.data() + h0, a.num_heads * sizeof(float)) !=
          0) {
        return "sequence " + std::to_string(s) + ", row " + std::to_string(row) + ": lse differs";
      }
    }
  }
  return {};
}

// The other batch: how many sequences it keeps of the case's, and which of them hold their
// context (the rest get a shorter one).
struct OtherBatch {
  int batch = 0;
  std::vector<bool> kept;
  std::vector<std::int32_t> context_lens;
  int threads = 1;
};

OtherBatch draw_other_batch(const FuzzCase& c, const BuiltCase& bc, int threads) {
  std::mt19937 rng(static_cast<std::uint32_t>(c.spec.seed * 0x9e3779b9u + 41));
  const int batch = bc.args.batch;
  OtherBatch o;
  o.batch = std::uniform_int_distribution<int>(1, batch)(rng);
  o.kept.assign(o.batch, false);
  o.kept[std::uniform_int_distribution<int>(0, o.batch - 1)(rng)] = true;
  o.context_lens.assign(bc.host.context_lens.begin(), bc.host.context_lens.begin() + o.batch);
  for (int s = 0; s < o.batch; ++s) {
    if (!o.kept[s]) o.kept[s] = rng() & 1;
    if (o.kept[s]) continue;
    const std::int32_t len = o.context_lens[s];
    o.context_lens[s] =
        c.windowed() || len <= 0 ? 0 : std::uniform_int_distribution<std::int32_t>(0, len)(rng);
  }
  o.threads = threads;
  if (threads > 1 || (rng() & 1)) o.threads = threads > 1 ? threads - 1 : 2;
  return o;
}

}  // namespace

std::string check_batch_invariance(Backend backend, const FuzzCase& c, BuiltCase& bc,
                                   const ReferenceResult& ref, const Tolerance& tol, int threads,
                                   bool checked, double* worst_ratio) {
  DecodeArgs& a = bc.args;
  if (a.batch <= 0) return {};
  const std::string tag = std::string(backend_name(backend)) + ": batch-invariant: ";
  bc.poison_outputs();
  try {
    run_backend(backend, bc, threads, false, checked, /*batch_invariant=*/true);
  } catch (const std::exception& e) {
    return tag + "threw on a valid case: " + e.what();
  }
  if (std::string bad = check_gaps(bc); !bad.empty()) return tag + bad;
  const Outputs got = read_outputs(bc);
  if (std::string bad = check_finite(got, bc, a.sinks); !bad.empty()) return tag + bad;
  if (std::string bad = compare(bc, got, ref.out, ref.lse, tol, worst_ratio); !bad.empty()) {
    return tag + bad;
  }
  const RunBits whole{bc.out_buffer(), bc.host.lse};

  const OtherBatch other = draw_other_batch(c, bc, threads);
  const DecodeArgs saved_args = a;
  const std::vector<std::int32_t> saved_lens = bc.host.context_lens;
  std::copy(other.context_lens.begin(), other.context_lens.end(), bc.host.context_lens.begin());
  a.batch = other.batch;
  if (a.q_indptr != nullptr) a.num_q_tokens = bc.q_indptr[other.batch];
  bc.poison_outputs();
  std::string error;
  try {
    run_backend(backend, bc, other.threads, false, checked, /*batch_invariant=*/true);
  } catch (const std::exception& e) {
    error = e.what();
  }
  a = saved_args;
  std::copy(saved_lens.begin(), saved_lens.end(), bc.host.context_lens.begin());
  const std::string where = "in a batch of " + std::to_string(other.batch) + " of the case's " +
                            std::to_string(a.batch) + " sequences: ";
  if (!error.empty()) return tag + where + "threw: " + error;
  const RunBits part{bc.out_buffer(), bc.host.lse};
  for (int s = 0; s < other.batch; ++s) {
    if (!other.kept[s]) continue;
    if (std::string bad = first_difference(bc, s, whole, part); !bad.empty()) {
      return tag + where + bad;
    }
  }
  return {};
}

}  // namespace pagedattn::fuzz
