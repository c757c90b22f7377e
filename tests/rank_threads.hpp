// A local context-parallel group run in threads, one per rank, for the tests: each rank's
// Error, if it threw one.
#pragma once

#include <string>
#include <thread>
#include <vector>

#include "pagedattn/context_parallel.hpp"
#include "pagedattn/error.hpp"

namespace pagedattn {

struct RankError {
  bool thrown = false;
  ErrorCode code = ErrorCode::kInvalidArgument;
  std::string argument;  // "" when the rank returned
};

// Runs `body(rank, comm)` on every rank of a new local group, in threads; each rank's error.
template <typename F>
std::vector<RankError> run_on_every_rank(int ranks, F body) {
  auto group = make_local_group(ranks);
  std::vector<RankError> errors(ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      try {
        body(r, *group[r]);
      } catch (const Error& e) {
        errors[r] = {true, e.code(), e.argument()};
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return errors;
}

}  // namespace pagedattn
