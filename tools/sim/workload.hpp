// The requests of a run: Poisson arrivals per step, drawn prompt and output lengths, shared
// system prompts, n-way sampling and mid-generation forks, all from one seed.
#pragma once

#include <random>

#include "sim/options.hpp"

namespace pagedattn::sim {

struct Request {
  int prompt = 0;  // tokens written before the first step, the system prompt included
  int output = 0;  // tokens to generate
  int generated = 0;
  int fork_at = -1;      // fork once when `generated` reaches this (-1: never)
  int samples_left = 0;  // n-way siblings still to fork from the prompt
  int system = -1;       // the shared system prompt it starts with (-1: none)
  bool child = false;    // a fork: its finish is not a request's
};

class Workload {
 public:
  explicit Workload(const Options& o) : o_(o), rng_(o.seed) {}
  int arrivals() { return std::poisson_distribution<int>(o_.rate)(rng_); }
  Request next();
  int output_length() { return o_.output_len.sample(rng_); }

 private:
  const Options& o_;
  std::mt19937_64 rng_;
};

}  // namespace pagedattn::sim
