#include "sim/options.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <sstream>

#include "pagedattn/cli/args.hpp"
#include "pagedattn/validate.hpp"

namespace pagedattn::sim {
namespace {

constexpr long long kMaxCount = 1 << 30;  // requests, blocks, heads, tokens, ...
constexpr double kMaxRate = 1e6;          // --rate

int positive(const std::string& option, const std::string& text) {
  return static_cast<int>(cli::parse_int(option, text, 1, kMaxCount));
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
  try {
    return parse_parts(text, option);
  } catch (const cli::UsageError& e) {  // name the whole value, not the part that was wrong
    if (e.value() == text) throw;
    cli::bad_value(option, text,
                   "'" + e.value() + "': " + e.reason() + " (forms: N, A:B, exp:MEAN)");
  }
}

LengthDist LengthDist::parse_parts(const std::string& text, const std::string& option) {
  LengthDist d;
  if (text.rfind("exp:", 0) == 0) {
    d.kind = Kind::kExponential;
    d.mean = cli::parse_number(option, text.substr(4), 1, kMaxCount / 8);
    d.lo = 1;
    d.hi = d.max();
    return d;
  }
  const std::size_t colon = text.find(':');
  if (colon == std::string::npos) {
    d.lo = d.hi = positive(option, text);
    return d;
  }
  d.kind = Kind::kUniform;
  d.lo = positive(option, text.substr(0, colon));
  d.hi = positive(option, text.substr(colon + 1));
  if (d.lo > d.hi) cli::bad_value(option, text, "expected A:B with A <= B");
  return d;
}

std::string usage(const char* argv0) {
  std::ostringstream os;
  const Options d;
  os << "usage: " << argv0 << " [flags]\n"
     << "A continuous-batching decode loop over a paged K/V cache: requests arrive, their prompts\n"
     << "are written into the cache, every step appends one token per running sequence and runs\n"
     << "decode attention for each layer; sampled steps are checked against the f64 reference.\n\n"
     << "workload:\n"
     << "  --requests N        requests in the run (" << d.requests << ")\n"
     << "  --rate R            mean new requests per step, Poisson, > 0 (" << d.rate << ")\n"
     << "  --prompt-len DIST   N, A:B (uniform, A <= B) or exp:MEAN (MEAN >= 1) ("
     << d.prompt_len.text() << ")\n"
     << "  --output-len DIST   tokens to generate, same forms (" << d.output_len.text() << ")\n"
     << "  --fork-prob P       chance in [0, 1] a request forks once mid-generation ("
     << d.fork_prob << ")\n"
     << "  --seed S            an unsigned 64-bit integer (" << d.seed << ")\n"
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
     << "  --progress / --no-progress   the progress bar on stderr (default: when a terminal)\n"
     << "  --help, -h          this text\n\n"
     << "Counts (requests, blocks, heads, lengths, ...) are integers from 1 to " << kMaxCount
     << ";\n--block-size is at most " << kMaxBlockSize << ", --threads at most " << kMaxThreads
     << ", --layers at most 4096;\nthe heads, kv heads, head dim and block size must be a shape "
     << "decode() runs.\n";
  return os.str();
}

Options parse_options(int argc, char** argv) {
  Options o;
  cli::Args args(argc, argv);
  while (args.next()) {
    const std::string& a = args.flag();
    if (args.is_help()) {
      o.help = true;
    } else if (a == "--shared-cache") {
      o.shared_cache = true;
    } else if (a == "--progress" || a == "--no-progress") {
      o.progress = a == "--progress";
    } else if (a == "--requests") {
      o.requests = static_cast<int>(args.integer(1, kMaxCount));
    } else if (a == "--rate") {
      o.rate = args.number(0, kMaxRate, /*lo_open=*/true);
    } else if (a == "--prompt-len") {
      o.prompt_len = LengthDist::parse(args.value(), a);
    } else if (a == "--output-len") {
      o.output_len = LengthDist::parse(args.value(), a);
    } else if (a == "--fork-prob") {
      o.fork_prob = args.number(0, 1);
    } else if (a == "--seed") {
      o.seed = args.u64();
    } else if (a == "--max-batch") {
      o.max_batch = static_cast<int>(args.integer(1, kMaxCount));
    } else if (a == "--blocks") {
      o.num_blocks = static_cast<int>(args.integer(1, kMaxCount));
    } else if (a == "--block-size") {
      o.block_size = static_cast<int>(args.integer(1, kMaxBlockSize));
    } else if (a == "--heads") {
      o.num_heads = static_cast<int>(args.integer(1, kMaxCount));
    } else if (a == "--kv-heads") {
      o.num_kv_heads = static_cast<int>(args.integer(1, kMaxCount));
    } else if (a == "--head-dim") {
      o.head_dim = static_cast<int>(args.integer(1, kMaxCount));
    } else if (a == "--dtype") {
      o.dtype =
          args.choice<DType>({{"f32", DType::kF32}, {"f16", DType::kF16}, {"bf16", DType::kBF16}});
    } else if (a == "--layers") {
      o.layers = static_cast<int>(args.integer(1, 4096));
    } else if (a == "--backend") {
      o.backend = args.choice<Backend>(
          {{"auto", Backend::kAuto}, {"cpu", Backend::kCpu}, {"cuda", Backend::kCuda}});
    } else if (a == "--threads") {
      o.threads = static_cast<int>(args.integer(1, kMaxThreads));
    } else if (a == "--verify-every") {
      o.verify_every = static_cast<int>(args.integer(0, kMaxCount));
    } else if (a == "--csv") {
      o.csv = args.text();
    } else {
      args.unknown();
    }
  }
  if (o.help) return o;
  // The model shape must be one decode() runs; checked here so no request is simulated first.
  DecodeArgs shape;  // batch 0: the shape checks of decode(), without its buffers
  shape.num_heads = o.num_heads;
  shape.num_kv_heads = o.num_kv_heads;
  shape.head_dim = o.head_dim;
  shape.block_size = o.block_size;
  try {
    validate_shapes(shape, false);
  } catch (const Error& e) {
    const std::map<std::string, std::string> flags = {{"num_heads", "--heads"},
                                                      {"group_size", "--heads"},
                                                      {"head_dim", "--head-dim"},
                                                      {"block_size", "--block-size"}};
    const auto it = flags.find(e.argument());
    throw cli::UsageError(it == flags.end() ? e.argument() : it->second,
                          std::string(e.what()).substr(std::strlen("pagedattn: ")));
  }
  // Every request must fit the cache on its own, or the loop could never finish it.
  const long long longest = static_cast<long long>(o.prompt_len.max()) + o.output_len.max();
  const long long capacity = static_cast<long long>(o.num_blocks) * o.block_size;
  if (longest > capacity) {
    std::ostringstream v;
    v << "the longest request, " << longest << " tokens (prompt " << o.prompt_len.max()
      << " + output " << o.output_len.max()
      << "), exceeds the cache (--blocks * --block-size = " << capacity << " tokens)";
    throw cli::UsageError("--blocks", v.str());
  }
  return o;
}

}  // namespace pagedattn::sim
