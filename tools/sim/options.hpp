// pagedattn-sim's command line: the workload (arrivals, lengths, forks), the model shape, the
// cache and the backend.
#pragma once

#include <cstdint>
#include <random>
#include <string>

#include "pagedattn/pagedattn.hpp"

namespace pagedattn::sim {

// A length distribution: "N" (fixed), "A:B" (uniform on [A, B]) or "exp:MEAN" (exponential,
// at least 1).
struct LengthDist {
  enum class Kind { kFixed, kUniform, kExponential } kind = Kind::kFixed;
  int lo = 1, hi = 1;  // fixed: lo; uniform: [lo, hi]
  double mean = 1;     // exponential
  int sample(std::mt19937_64& rng) const;
  int max() const;  // the largest value sample() returns
  std::string text() const;
  static LengthDist parse(const std::string& text, const std::string& option);

 private:
  static LengthDist parse_parts(const std::string& text, const std::string& option);
};

struct Options {
  bool help = false;  // --help: print usage() and run nothing
  int requests = 64;  // requests in the whole run
  double rate = 1.0;  // mean new requests per decode step (Poisson)
  LengthDist prompt_len = LengthDist::parse("16:384", "--prompt-len");
  LengthDist output_len = LengthDist::parse("16:128", "--output-len");
  double fork_prob = 0.25;  // chance a request forks once, at a random point of its output
  std::uint64_t seed = 1;
  int max_batch = 32;    // running sequences at most
  int num_blocks = 512;  // cache blocks per layer
  int block_size = 16;
  int num_heads = 16;
  int num_kv_heads = 2;
  int head_dim = 128;
  DType dtype = DType::kBF16;  // cache, query and output dtype
  int layers = 2;
  bool shared_cache = false;  // every layer reads one K/V cache (less memory)
  Backend backend = Backend::kAuto;
  int verify_every = 25;  // check every N-th step (and the last) against the f64 reference
  std::string csv;        // per-step timeline
  int progress = -1;      // -1: when stderr is a terminal
  int threads = 0;
};

// Parses argv strictly (pagedattn/cli/args.hpp); a bad flag, or a shape decode() refuses, throws
// cli::UsageError naming the flag and the value.
Options parse_options(int argc, char** argv);
std::string usage(const char* argv0);

}  // namespace pagedattn::sim
