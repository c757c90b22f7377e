#include "context_parallel_check.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "output_checks.hpp"
#include "pagedattn/context_parallel.hpp"
#include "pagedattn/testing/cp_shares.hpp"

namespace pagedattn::fuzz {
namespace {

// What every rank of one context-parallel call ended with.
struct RankRuns {
  std::vector<std::vector<std::uint8_t>> outs;
  std::vector<std::vector<float>> lses;
  std::vector<std::string> errors;
  std::vector<ErrorCode> codes;
  std::vector<std::string> arguments;
};

// One context_parallel_decode per rank of a fresh in-process group, each on its share and its own
// copy of `out` (and of NaN lse), on one thread.
RankRuns run_ranks(const DecodeArgs& a, const std::vector<testing::RankShare>& shares,
                   const std::vector<std::uint8_t>& out, std::size_t lse_size) {
  const int ranks = static_cast<int>(shares.size());
  RankRuns runs;
  runs.outs.assign(ranks, out);
  runs.lses.assign(ranks, std::vector<float>(lse_size, NAN));
  runs.errors.resize(ranks);
  runs.codes.assign(ranks, ErrorCode::kInvalidArgument);
  runs.arguments.resize(ranks);
  auto group = make_local_group(ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      DecodeArgs mine = a;
      mine.block_table = shares[r].table.data();
      mine.context_lens = shares[r].lens.data();
      mine.out = runs.outs[r].data();
      mine.lse = a.lse != nullptr ? runs.lses[r].data() : nullptr;
      DecodeOptions o;
      o.backend = Backend::kCpu;
      o.num_threads = 1;
      try {
        context_parallel_decode(mine, *group[r], o);
      } catch (const Error& e) {
        runs.errors[r] = e.what();
        runs.codes[r] = e.code();
        runs.arguments[r] = e.argument();
      } catch (const std::exception& e) {
        runs.errors[r] = e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return runs;
}

}  // namespace

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
  const std::string tag = std::to_string(ranks) + " ranks: ";
  const char* refused = a.window_left >= 0            ? "window_left"
                        : a.alibi_slopes != nullptr   ? "alibi_slopes"
                        : a.sinks != nullptr          ? "sinks"
                        : a.q_indptr != nullptr       ? "q_indptr"
                        : a.k_token_scales != nullptr ? "k_token_scales"
                        : a.out_row_stride != 0       ? "out_row_stride"
                                                      : nullptr;
  if (refused != nullptr) {
    // Poisoned like a plain run's outputs, gaps holding kOutGapByte: all of it must stay.
    bc.poison_outputs();
    const RankRuns runs = run_ranks(a, shares, bc.out_buffer(), h.lse.size());
    const std::string want =
        std::string(error_code_name(ErrorCode::kUnsupported)) + " on '" + refused + "'";
    for (int r = 0; r < ranks; ++r) {
      const std::string rank = tag + "rank " + std::to_string(r) + " ";
      if (runs.codes[r] != ErrorCode::kUnsupported || runs.arguments[r] != refused) {
        return rank + (runs.errors[r].empty() ? "accepted the case" : "threw: " + runs.errors[r]) +
               ", expected " + want;
      }
      if (runs.outs[r] != bc.out_buffer() || !std::all_of(runs.lses[r].begin(), runs.lses[r].end(),
                                                          [](float x) { return std::isnan(x); })) {
        return rank + "wrote out, its gaps or lse before refusing the case";
      }
    }
    if (c.position_variants() || c.multi_token() || c.token_scales()) return {};
  }
  // Poisoned (all-ones bytes are NaN in every dtype), so that an unwritten element shows.
  DecodeArgs dense_out = a;
  dense_out.out_row_stride = 0;
  const RankRuns runs =
      run_ranks(dense_out, shares, std::vector<std::uint8_t>(h.out.size(), 0xff), h.lse.size());
  for (int r = 0; r < ranks; ++r) {
    if (!runs.errors[r].empty()) {
      return tag + "rank " + std::to_string(r) + " threw: " + runs.errors[r];
    }
  }
  for (int r = 1; r < ranks; ++r) {
    if (runs.outs[r] != runs.outs[0] || std::memcmp(runs.lses[r].data(), runs.lses[0].data(),
                                                    runs.lses[0].size() * sizeof(float)) != 0) {
      return tag + "rank " + std::to_string(r) + " got other bits than rank 0";
    }
  }
  const std::int64_t row = static_cast<std::int64_t>(a.num_heads) * a.head_dim;
  const Outputs got = read_outputs(h, bc.rows, runs.outs[0], row, runs.lses[0]);
  if (std::string bad = check_finite(got, bc, a.sinks); !bad.empty()) return tag + bad;
  const std::string bad = compare(bc, got, ref.out, ref.lse, tol, worst_ratio);
  return bad.empty() ? bad : tag + bad;
}

}  // namespace pagedattn::fuzz
