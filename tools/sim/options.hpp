// pagedattn-sim's command line: the model (a preset or the shape flags), the workload
// (arrivals, lengths, shared system prompts, forks), the cache and the backend.
#pragma once

#include <cstdint>
#include <random>
#include <string>

#include "pagedattn/pagedattn.hpp"
#include "sim/model.hpp"

namespace pagedattn::sim {

// A length distribution: "N" (fixed), "A:B" (uniform on [A, B]), "exp:MEAN" (exponential, at
// least 1) or "lognormal:MEDIAN:SIGMA" (exp of a normal with mean ln MEDIAN and deviation SIGMA,
// at least 1, cut at MEDIAN * exp(3 SIGMA), the 99.87th percentile).
struct LengthDist {
  enum class Kind { kFixed, kUniform, kExponential, kLogNormal } kind = Kind::kFixed;
  int lo = 1, hi = 1;  // fixed: lo; uniform: [lo, hi]
  double mean = 1;     // exponential: the mean; log-normal: the median
  double sigma = 0;    // log-normal
  int sample(std::mt19937_64& rng) const;
  int max() const;  // the largest value sample() returns
  std::string text() const;
  static LengthDist parse(const std::string& text, const std::string& option);

 private:
  static LengthDist parse_parts(const std::string& text, const std::string& option);
};

struct Options {
  bool help = false;                          // --help: print usage() and run nothing
  Model model = *find_model("llama-3.1-8b");  // the preset with the shape flags applied
  int sim_layers = 0;  // layers simulated (sampled over the model); 0: the backend's default
  int requests = 48;   // requests in the whole run
  double rate = 0.5;   // mean new requests per decode step (Poisson)
  // Log-normal lengths: long right tails, prompts longer than outputs (docs/simulator.md).
  LengthDist prompt_len = LengthDist::parse("lognormal:300:0.9", "--prompt-len");
  LengthDist output_len = LengthDist::parse("lognormal:120:0.7", "--output-len");
  int system_prompts = 4;    // distinct shared system prompts, each cached once
  int system_len = 256;      // tokens of each
  double system_prob = 0.5;  // chance a request starts with one (then its prompt follows it)
  int n_way = 2;             // sequences sampled by an n-way request
  double n_way_prob = 0.1;   // chance a request samples n_way sequences from one prompt
  double fork_prob = 0;      // chance a request forks once, at a random point of its output
  std::uint64_t seed = 1;
  int max_batch = 32;    // running sequences at most
  int num_blocks = 0;    // cache blocks per layer; 0: from the memory budget
  double cache_mib = 0;  // the budget for the whole model's cache; 0: a share of free memory
  int block_size = 16;
  DType dtype = DType::kBF16;  // cache, query and output dtype
  bool shared_cache = false;   // every layer reads one K/V cache (less memory)
  Backend backend = Backend::kAuto;
  int verify_every = 25;  // check every N-th step (and the last) against the f64 reference
  std::string csv;        // per-step timeline
  int progress = -1;      // -1: when stderr is a terminal
  int threads = 0;
};

// Parses argv strictly (pagedattn/cli/args.hpp); a bad flag, or a shape decode() refuses, throws
// cli::UsageError naming the flag and the value.
Options parse_options(int argc, char** argv);
// Tokens the longest request holds at its end (its system prompt, prompt and output).
long long longest_request(const Options& o);
// Blocks the shared system prompts keep for the whole run.
int system_prompt_blocks(const Options& o);
std::string usage(const char* argv0);

}  // namespace pagedattn::sim
