#include "sim/options.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace pagedattn::sim {
namespace {

long long to_int(const std::string& text, const std::string& option) {
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0') {
    fail(ErrorCode::kInvalidArgument, option, "'" + text + "'", "expected an integer");
  }
  return v;
}

double to_double(const std::string& text, const std::string& option) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !std::isfinite(v)) {
    fail(ErrorCode::kInvalidArgument, option, "'" + text + "'", "expected a number");
  }
  return v;
}

int positive(long long v, const std::string& option) {
  if (v < 1 || v > (1 << 30)) fail(ErrorCode::kInvalidArgument, option, v, "must be positive");
  return static_cast<int>(v);
}

DType parse_dtype(const std::string& t) {
  if (t == "f32") return DType::kF32;
  if (t == "f16") return DType::kF16;
  if (t == "bf16") return DType::kBF16;
  fail(ErrorCode::kInvalidArgument, "--dtype", "'" + t + "'", "expected f32, f16 or bf16");
}

}  // namespace

int LengthDist::sample(std::mt19937_64& rng) const {
  switch (kind) {
    case Kind::kFixed:
      return lo;
    case Kind::kUniform:
      return std::uniform_int_distribution<int>(lo, hi)(rng);
    case Kind::kExponential: {
      const double x = std::exponential_distribution<double>(1.0 / mean)(rng);
      return std::clamp(static_cast<int>(std::lround(x)), 1, max());
    }
  }
  return lo;
}

int LengthDist::max() const {
  // The exponential is cut at 8 means (a 1 in 3000 tail), so capacity checks have a bound.
  return kind == Kind::kExponential ? std::max(1, static_cast<int>(std::ceil(8 * mean))) : hi;
}

std::string LengthDist::text() const {
  std::ostringstream os;
  if (kind == Kind::kFixed) os << lo;
  if (kind == Kind::kUniform) os << lo << ':' << hi;
  if (kind == Kind::kExponential) os << "exp:" << mean;
  return os.str();
}

LengthDist LengthDist::parse(const std::string& text, const std::string& option) {
  LengthDist d;
  if (text.rfind("exp:", 0) == 0) {
    d.kind = Kind::kExponential;
    d.mean = to_double(text.substr(4), option);
    if (d.mean < 1) fail(ErrorCode::kInvalidArgument, option, text, "mean must be at least 1");
    d.lo = 1;
    d.hi = d.max();
    return d;
  }
  const std::size_t colon = text.find(':');
  if (colon == std::string::npos) {
    d.lo = d.hi = positive(to_int(text, option), option);
    return d;
  }
  d.kind = Kind::kUniform;
  d.lo = positive(to_int(text.substr(0, colon), option), option);
  d.hi = positive(to_int(text.substr(colon + 1), option), option);
  if (d.lo > d.hi) fail(ErrorCode::kInvalidArgument, option, text, "expected A:B with A <= B");
  return d;
}

std::string usage(const char* argv0) {
  std::ostringstream os;
  const Options d;
  os << "usage: " << argv0 << " [options]\n"
     << "A continuous-batching decode loop over a paged K/V cache: requests arrive, their prompts\n"
     << "are written into the cache, every step appends one token per running sequence and runs\n"
     << "decode attention for each layer; sampled steps are checked against the f64 reference.\n\n"
     << "workload:\n"
     << "  --requests N        requests in the run (" << d.requests << ")\n"
     << "  --rate R            mean new requests per step, Poisson (" << d.rate << ")\n"
     << "  --prompt-len DIST   N, A:B (uniform) or exp:MEAN (" << d.prompt_len.text() << ")\n"
     << "  --output-len DIST   tokens to generate, same forms (" << d.output_len.text() << ")\n"
     << "  --fork-prob P       chance a request forks once mid-generation (" << d.fork_prob << ")\n"
     << "  --seed S            (" << d.seed << ")\n"
     << "  --max-batch N       running sequences at most (" << d.max_batch << ")\n"
     << "cache and model:\n"
     << "  --blocks N          cache blocks per layer (" << d.num_blocks << ")\n"
     << "  --block-size N      tokens per block (" << d.block_size << ")\n"
     << "  --heads N           query heads (" << d.num_heads << ")\n"
     << "  --kv-heads N        kv heads (" << d.num_kv_heads << ")\n"
     << "  --head-dim N        (" << d.head_dim << ")\n"
     << "  --dtype T           f32, f16 or bf16: cache, query and output (" << dtype_name(d.dtype)
     << ")\n"
     << "  --layers N          decode calls per step, each over its own cache (" << d.layers
     << ")\n"
     << "  --shared-cache      all layers read one cache (less memory)\n"
     << "run:\n"
     << "  --backend B         auto, cpu or cuda (auto)\n"
     << "  --threads N         CPU threads (OpenMP default)\n"
     << "  --verify-every N    check every N-th step against the f64 reference; 0: none ("
     << d.verify_every << ")\n"
     << "  --csv FILE          write a per-step timeline (plot it with scripts/plot_sim.sh)\n"
     << "  --progress / --no-progress   the progress bar on stderr (default: when a terminal)\n";
  return os.str();
}

Options parse_options(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::fputs(usage(argv[0]).c_str(), stdout);
      std::exit(0);
    }
    if (a == "--shared-cache") {
      o.shared_cache = true;
      continue;
    }
    if (a == "--progress" || a == "--no-progress") {
      o.progress = a == "--progress";
      continue;
    }
    if (i + 1 >= argc)
      fail(ErrorCode::kInvalidArgument, a, "(missing)", "needs a value; see --help");
    const std::string v = argv[++i];
    if (a == "--requests")
      o.requests = positive(to_int(v, a), a);
    else if (a == "--rate")
      o.rate = to_double(v, a);
    else if (a == "--prompt-len")
      o.prompt_len = LengthDist::parse(v, a);
    else if (a == "--output-len")
      o.output_len = LengthDist::parse(v, a);
    else if (a == "--fork-prob")
      o.fork_prob = to_double(v, a);
    else if (a == "--seed")
      o.seed = static_cast<std::uint64_t>(to_int(v, a));
    else if (a == "--max-batch")
      o.max_batch = positive(to_int(v, a), a);
    else if (a == "--blocks")
      o.num_blocks = positive(to_int(v, a), a);
    else if (a == "--block-size")
      o.block_size = positive(to_int(v, a), a);
    else if (a == "--heads")
      o.num_heads = positive(to_int(v, a), a);
    else if (a == "--kv-heads")
      o.num_kv_heads = positive(to_int(v, a), a);
    else if (a == "--head-dim")
      o.head_dim = positive(to_int(v, a), a);
    else if (a == "--dtype")
      o.dtype = parse_dtype(v);
    else if (a == "--layers")
      o.layers = positive(to_int(v, a), a);
    else if (a == "--backend")
      o.backend = parse_backend(v, a);
    else if (a == "--threads")
      o.threads = positive(to_int(v, a), a);
    else if (a == "--verify-every") {
      const long long n = to_int(v, a);
      if (n < 0) fail(ErrorCode::kInvalidArgument, a, n, "must not be negative");
      o.verify_every = static_cast<int>(n);
    } else if (a == "--csv")
      o.csv = v;
    else
      fail(ErrorCode::kInvalidArgument, "option", "'" + a + "'", "unknown; see --help");
  }
  if (o.rate <= 0) fail(ErrorCode::kInvalidArgument, "--rate", o.rate, "must be positive");
  if (o.fork_prob < 0 || o.fork_prob > 1) {
    fail(ErrorCode::kInvalidArgument, "--fork-prob", o.fork_prob, "must be in [0, 1]");
  }
  // Every request must fit the cache on its own, or the loop could never finish it.
  const long long longest = static_cast<long long>(o.prompt_len.max()) + o.output_len.max();
  const long long capacity = static_cast<long long>(o.num_blocks) * o.block_size;
  if (longest > capacity) {
    std::ostringstream v;
    v << longest << " (prompt " << o.prompt_len.max() << " + output " << o.output_len.max() << ")";
    fail(ErrorCode::kInvalidArgument, "longest request", v.str(),
         "exceeds the cache (--blocks * --block-size = " + std::to_string(capacity) + " tokens)");
  }
  return o;
}

}  // namespace pagedattn::sim
