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

// The defaults of the arrival, length, batch, system-prompt and n-way flags (docs/simulator.md,
// "The workload"): `chat` is short chat traffic, the CPU backend's default; `long` is long
// prompts at a large batch, the CUDA backend's, where a device's cache holds hundreds of
// thousands of tokens per layer; `sampling` is n-way sampling behind a shared system prompt:
// every request starts with one of two system prompts of 2048 tokens and samples 8 sequences,
// whose tables share the system prompt's and the request's prompt's blocks (shared prefixes,
// docs/shared_prefix.md).
struct WorkloadPreset {
  const char* name;
  int requests;
  double rate;
  const char* prompt_len;
  const char* output_len;
  int max_batch;
  int system_prompts = 4;
  int system_len = 256;
  double system_prob = 0.5;
  int n_way = 2;
  double n_way_prob = 0.1;
};
inline constexpr WorkloadPreset kChatWorkload = {
    "chat", 48, 0.5, "lognormal:300:0.9", "lognormal:120:0.7", 32};
inline constexpr WorkloadPreset kLongWorkload = {
    "long", 384, 16, "lognormal:3000:0.6", "lognormal:200:0.5", 128};
inline constexpr WorkloadPreset kSamplingWorkload = {
    "sampling", 12, 0.25, "lognormal:400:0.5", "lognormal:150:0.4", 64, 2, 2048, 1.0, 8, 1.0};

struct Options {
  bool help = false;                          // --help: print usage() and run nothing
  Model model = *find_model("llama-3.1-8b");  // the preset with the shape flags applied
  int sim_layers = 0;  // layers simulated (sampled over the model); 0: the backend's default
  // --workload: the preset whose values the flags below start from (the backend's default when
  // not given; an explicit --requests, --rate, --prompt-len, --output-len or --max-batch wins).
  std::string workload = kChatWorkload.name;
  int requests = kChatWorkload.requests;  // requests in the whole run
  double rate = kChatWorkload.rate;       // mean new requests per decode step (Poisson)
  // Log-normal lengths: long right tails, prompts longer than outputs (docs/simulator.md).
  LengthDist prompt_len = LengthDist::parse(kChatWorkload.prompt_len, "--prompt-len");
  LengthDist output_len = LengthDist::parse(kChatWorkload.output_len, "--output-len");
  int system_prompts = 4;    // distinct shared system prompts, each cached once
  int system_len = 256;      // tokens of each
  double system_prob = 0.5;  // chance a request starts with one (then its prompt follows it)
  int n_way = 2;             // sequences sampled by an n-way request
  double n_way_prob = 0.1;   // chance a request samples n_way sequences from one prompt
  double fork_prob = 0;      // chance a request forks once, at a random point of its output
  std::uint64_t seed = 1;
  int max_batch = kChatWorkload.max_batch;  // running sequences at most
  int num_blocks = 0;                       // cache blocks per layer; 0: from the memory budget
  double cache_mib = 0;  // the budget for the whole model's cache; 0: a share of free memory
  int block_size = 16;
  DType dtype = DType::kBF16;  // cache, query and output dtype
  bool shared_cache = false;   // every layer reads one K/V cache (less memory)
  bool share_prefixes = true;  // DecodeOptions::share_prefixes (--share-prefixes on|off)
  Backend backend = Backend::kAuto;
  int verify_every = 25;       // check every N-th step against the f64 reference
  int verify_seqs = 8;         // sequences of a checked step recomputed (0: every one)
  bool compare_naive = false;  // --compare naive: time the naive decode on the same steps too
  std::string csv;             // per-step timeline
  int progress = -1;           // -1: when stderr is a terminal
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
