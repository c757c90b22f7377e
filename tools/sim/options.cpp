#include "sim/options.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "pagedattn/cli/args.hpp"
#include "pagedattn/mla_validate.hpp"
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
    case Kind::kLogNormal: {
      const double x = std::lognormal_distribution<double>(std::log(mean), sigma)(rng);
      return static_cast<int>(std::clamp<double>(std::round(x), 1, max()));
    }
  }
  return lo;
}

int LengthDist::max() const {
  // The exponential is cut at 8 means (a 1 in 3000 tail), the log-normal at 3 deviations (1 in
  // 750), so capacity checks have a bound.
  if (kind == Kind::kExponential) return std::max(1, static_cast<int>(std::ceil(8 * mean)));
  if (kind == Kind::kLogNormal) {
    return static_cast<int>(std::clamp(std::ceil(mean * std::exp(3 * sigma)), 1.0, 1e9));
  }
  return hi;
}

std::string LengthDist::text() const {
  std::ostringstream os;
  if (kind == Kind::kFixed) os << lo;
  if (kind == Kind::kUniform) os << lo << ':' << hi;
  if (kind == Kind::kExponential) os << "exp:" << mean;
  if (kind == Kind::kLogNormal) os << "lognormal:" << mean << ':' << sigma;
  return os.str();
}

LengthDist LengthDist::parse(const std::string& text, const std::string& option) {
  try {
    return parse_parts(text, option);
  } catch (const cli::UsageError& e) {  // name the whole value, not the part that was wrong
    if (e.value() == text) throw;
    cli::bad_value(option, text,
                   "'" + e.value() + "': " + e.reason() +
                       " (forms: N, A:B, exp:MEAN, lognormal:MEDIAN:SIGMA)");
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
  if (text.rfind("lognormal:", 0) == 0) {
    const std::string rest = text.substr(10);
    const std::size_t colon = rest.find(':');
    if (colon == std::string::npos) cli::bad_value(option, text, "expected lognormal:MEDIAN:SIGMA");
    d.kind = Kind::kLogNormal;
    d.mean = cli::parse_number(option, rest.substr(0, colon), 1, 1e6);
    d.sigma = cli::parse_number(option, rest.substr(colon + 1), 0, 3);
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
     << "A continuous-batching decode loop over a paged K/V cache, for a served model: requests\n"
     << "arrive, their prompts are written into the cache, every step appends one token per\n"
     << "running sequence and runs decode attention for each simulated layer; sampled steps are\n"
     << "checked against the f64 reference.\n\n"
     << "model:\n"
     << "  --model NAME        a preset or custom (" << d.model.name << "); presets:\n";
  for (const Model& m : model_presets()) os << "                        " << m.describe() << "\n";
  os << "  --heads N           query heads (custom: 16; with a preset: replaces its value)\n"
     << "  --kv-heads N        kv heads (custom: 2)\n"
     << "  --head-dim N        (custom: 128)\n"
     << "  --layers N          the model's layers (custom: 2)\n"
     << "  --sliding-window N  tokens a sliding-window layer attends to, 0: none (custom: 0)\n"
     << "  --full-every N      with a window, every N-th layer attends to everything (1)\n"
     << "  --sinks             a sink logit per query head on every layer\n"
     << "  --soft-cap C        logits soft-cap, 0: none (0)\n"
     << "  --kv-lora-rank N    MLA: a latent row of N + --rope-dim values per token shared by\n"
     << "                      every query head, decoded by mla_decode (a multiple of 16, up to\n"
     << "                      1024; replaces --kv-heads, --head-dim and the variants)\n"
     << "  --rope-dim N        MLA: the latent row's rotary part, a multiple of 16 up to 256 (64)\n"
     << "  --sim-layers N      layers simulated, spread over the model (cpu 2, cuda 8)\n"
     << "workload:\n"
     << "  --workload W        the defaults of the ten flags below: chat (the cpu backend's),\n"
     << "                      long (the cuda backend's) or sampling (n-way sampling behind a\n"
     << "                      shared system prompt: " << kSamplingWorkload.requests
     << " requests, " << kSamplingWorkload.rate << " a step, prompts "
     << kSamplingWorkload.prompt_len << ",\n"
     << "                      outputs " << kSamplingWorkload.output_len << ", batch "
     << kSamplingWorkload.max_batch << ", " << kSamplingWorkload.system_prompts
     << " system prompts of " << kSamplingWorkload.system_len << " tokens, "
     << kSamplingWorkload.n_way << " samples each);\n"
     << "                      values below are chat's, then long's\n"
     << "  --requests N        requests in the run (" << kChatWorkload.requests << ", "
     << kLongWorkload.requests << ")\n"
     << "  --rate R            mean new requests per step, Poisson, > 0 (" << kChatWorkload.rate
     << ", " << kLongWorkload.rate << ")\n"
     << "  --prompt-len DIST   N, A:B (uniform, A <= B), exp:MEAN (MEAN >= 1) or\n"
     << "                      lognormal:MEDIAN:SIGMA (SIGMA in [0, 3]) ("
     << kChatWorkload.prompt_len << ", " << kLongWorkload.prompt_len << ")\n"
     << "  --output-len DIST   tokens to generate, same forms (" << kChatWorkload.output_len << ", "
     << kLongWorkload.output_len << ")\n"
     << "  --max-batch N       running sequences at most (" << kChatWorkload.max_batch << ", "
     << kLongWorkload.max_batch << ")\n"
     << "  --system-prompts N  shared system prompts, 0: none (" << d.system_prompts << ")\n"
     << "  --system-len N      tokens of each (" << d.system_len << ")\n"
     << "  --system-prob P     chance a request starts with one (" << d.system_prob << ")\n"
     << "  --n-way N           sequences an n-way sampling request forks into (" << d.n_way << ")\n"
     << "  --n-way-prob P      chance a request samples n-way (" << d.n_way_prob << ")\n"
     << "  --fork-prob P       chance in [0, 1] a request forks once mid-generation ("
     << d.fork_prob << ")\n"
     << "  --seed S            an unsigned 64-bit integer (" << d.seed << ")\n"
     << "cache:\n"
     << "  --cache-mib M       memory for the whole model's cache (cpu: 25% of available RAM,\n"
     << "                      at most 1024; cuda: 50% of free device memory)\n"
     << "  --blocks N          cache blocks per layer (default: from --cache-mib)\n"
     << "  --block-size N      tokens per block (" << d.block_size << ")\n"
     << "  --dtype T           f32, f16 or bf16: cache, query and output (" << dtype_name(d.dtype)
     << ")\n"
     << "  --shared-cache      all simulated layers read one cache (less memory)\n"
     << "  --share-prefixes on|off\n"
     << "                      DecodeOptions::share_prefixes: forked sequences read their shared\n"
     << "                      blocks once (on; the cpu backend; docs/shared_prefix.md)\n"
     << "run:\n"
     << "  --backend B         auto, cpu or cuda (auto)\n"
     << "  --threads N         CPU threads (OpenMP default)\n"
     << "  --verify-every N    check every N-th step against the f64 reference; 0: none ("
     << d.verify_every << ")\n"
     << "  --verify-seqs N     sequences of a checked step recomputed, 0: all (" << d.verify_seqs
     << ")\n"
     << "  --compare naive     also time the naive decode (a CTA or thread per query head, one\n"
     << "                      token at a time) on every step's inputs, for scale\n"
     << "  --csv FILE          write a per-step timeline (plot it with scripts/plot_sim.sh)\n"
     << "  --progress / --no-progress   the progress bar on stderr (default: when a terminal)\n"
     << "  --help, -h          this text\n\n"
     << "Counts (requests, blocks, heads, lengths, ...) are integers from 1 to " << kMaxCount
     << ";\n--block-size is at most " << kMaxBlockSize << ", --threads at most " << kMaxThreads
     << ", --layers at most 4096;\nthe heads, kv heads, head dim and block size must be a shape "
     << "decode() runs.\n";
  return os.str();
}

long long longest_request(const Options& o) {
  const bool system = o.system_prompts > 0 && o.system_prob > 0;
  return (system ? o.system_len : 0) + static_cast<long long>(o.prompt_len.max()) +
         o.output_len.max();
}

int system_prompt_blocks(const Options& o) {
  if (o.system_prompts == 0 || o.system_prob == 0) return 0;
  return o.system_prompts * ((o.system_len + o.block_size - 1) / o.block_size);
}

namespace {

// The shape flags given on the command line; each replaces the preset's value.
struct ShapeFlags {
  std::string model = "llama-3.1-8b";
  int heads = 0, kv_heads = 0, head_dim = 0, layers = 0, sliding_window = -1, full_every = 0;
  bool sinks = false;
  double soft_cap = -1;
  int kv_lora_rank = 0, rope_dim = -1;
  // Given flags of a GQA model's shape and variants, each with its value as given ("set" for
  // --sinks, which takes none).
  std::vector<std::pair<std::string, std::string>> gqa_flags;

  Model apply() const {
    const Model* base = find_model(model);
    if (!base) cli::bad_value("--model", model, "expected one of " + model_names());
    Model m = *base;
    if (kv_lora_rank) {
      if (!m.mla()) m.rope_dim = 64;  // DeepSeek's, unless --rope-dim says otherwise
      m.kv_lora_rank = kv_lora_rank;
    }
    if (rope_dim >= 0) {
      if (!m.mla()) {
        throw cli::UsageError("--rope-dim", "applies to an MLA model (--kv-lora-rank N, or " +
                                                std::string("--model deepseek-v3-tp8)"));
      }
      m.rope_dim = rope_dim;
    }
    if (m.mla() && !gqa_flags.empty()) {
      const std::string why = base->mla() ? m.name + " is an MLA model"
                                          : "--kv-lora-rank " + std::to_string(kv_lora_rank) +
                                                " makes this model an MLA model";
      throw cli::UsageError(
          gqa_flags.front().first, gqa_flags.front().second,
          "applies to GQA models only; " + why + ", whose heads share one latent row");
    }
    if (heads) m.num_heads = heads;
    if (kv_heads) m.num_kv_heads = kv_heads;
    if (head_dim) m.head_dim = head_dim;
    if (layers) m.layers = layers;
    if (sliding_window >= 0) m.sliding_window = sliding_window;
    if (full_every) m.full_every = full_every;
    if (sinks) m.sinks = true;
    if (soft_cap >= 0) m.logits_soft_cap = static_cast<float>(soft_cap);
    return m;
  }
};

// Flags of the model; false when `a` is not one.
bool parse_model_flag(cli::Args& args, ShapeFlags& f) {
  const std::string& a = args.flag();
  std::string value = "set";  // the flag's value as given, for the GQA flags' error
  const auto integer = [&](long long lo, long long hi) {
    value = args.value();
    return static_cast<int>(cli::parse_int(a, value, lo, hi));
  };
  if (a == "--model") {
    f.model = args.value();
  } else if (a == "--heads") {
    f.heads = integer(1, kMaxCount);
  } else if (a == "--kv-heads") {
    f.kv_heads = integer(1, kMaxCount);
  } else if (a == "--head-dim") {
    f.head_dim = integer(1, kMaxCount);
  } else if (a == "--layers") {
    f.layers = integer(1, 4096);
  } else if (a == "--sliding-window") {
    f.sliding_window = integer(0, kMaxCount);
  } else if (a == "--full-every") {
    f.full_every = integer(1, 4096);
  } else if (a == "--sinks") {
    f.sinks = true;
  } else if (a == "--soft-cap") {
    value = args.value();
    f.soft_cap = cli::parse_number(a, value, 0, kMaxVariantMagnitude);
    if (f.soft_cap > 0 && f.soft_cap < kMinSoftCap) {
      cli::bad_value(a, value, "below the smallest soft-cap");
    }
  } else if (a == "--kv-lora-rank") {
    f.kv_lora_rank = static_cast<int>(args.integer(1, kMaxCount));
    return true;
  } else if (a == "--rope-dim") {
    f.rope_dim = static_cast<int>(args.integer(0, kMaxCount));
    return true;
  } else {
    return false;
  }
  if (a != "--model" && a != "--heads" && a != "--layers") f.gqa_flags.emplace_back(a, value);
  return true;
}

// The workload flags given on the command line; each replaces the preset's value.
struct WorkloadFlags {
  std::string preset;  // --workload; empty: the backend's default
  std::set<std::string> given;
};

const WorkloadPreset* find_workload(const std::string& name) {
  for (const WorkloadPreset* w : {&kChatWorkload, &kLongWorkload, &kSamplingWorkload}) {
    if (name == w->name) return w;
  }
  return nullptr;
}

// The preset's values for the workload flags not given: --workload's preset, else the
// backend's default (long on CUDA, where the cache holds far more than short chat fills).
void apply_workload(Options& o, const WorkloadFlags& f) {
  const bool device = resolve_backend(o.backend) == Backend::kCuda;
  const WorkloadPreset& w =
      f.preset.empty() ? (device ? kLongWorkload : kChatWorkload) : *find_workload(f.preset);
  o.workload = w.name;
  const auto unset = [&](const char* flag) { return f.given.count(flag) == 0; };
  if (unset("--requests")) o.requests = w.requests;
  if (unset("--rate")) o.rate = w.rate;
  if (unset("--prompt-len")) o.prompt_len = LengthDist::parse(w.prompt_len, "--prompt-len");
  if (unset("--output-len")) o.output_len = LengthDist::parse(w.output_len, "--output-len");
  if (unset("--max-batch")) o.max_batch = w.max_batch;
  if (unset("--system-prompts")) o.system_prompts = w.system_prompts;
  if (unset("--system-len")) o.system_len = w.system_len;
  if (unset("--system-prob")) o.system_prob = w.system_prob;
  if (unset("--n-way")) o.n_way = w.n_way;
  if (unset("--n-way-prob")) o.n_way_prob = w.n_way_prob;
}

// Flags of the workload; false when `a` is not one.
bool parse_workload_flag(cli::Args& args, Options& o, WorkloadFlags& f) {
  const std::string& a = args.flag();
  f.given.insert(a);
  if (a == "--workload") {
    f.preset = args.value();
    if (!find_workload(f.preset)) cli::bad_value(a, f.preset, "expected chat, long or sampling");
  } else if (a == "--requests") {
    o.requests = static_cast<int>(args.integer(1, kMaxCount));
  } else if (a == "--rate") {
    o.rate = args.number(0, kMaxRate, /*lo_open=*/true);
  } else if (a == "--prompt-len") {
    o.prompt_len = LengthDist::parse(args.value(), a);
  } else if (a == "--output-len") {
    o.output_len = LengthDist::parse(args.value(), a);
  } else if (a == "--system-prompts") {
    o.system_prompts = static_cast<int>(args.integer(0, 4096));
  } else if (a == "--system-len") {
    o.system_len = static_cast<int>(args.integer(1, kMaxCount));
  } else if (a == "--system-prob") {
    o.system_prob = args.number(0, 1);
  } else if (a == "--n-way") {
    o.n_way = static_cast<int>(args.integer(1, 64));
  } else if (a == "--n-way-prob") {
    o.n_way_prob = args.number(0, 1);
  } else if (a == "--fork-prob") {
    o.fork_prob = args.number(0, 1);
  } else if (a == "--seed") {
    o.seed = args.u64();
  } else if (a == "--max-batch") {
    o.max_batch = static_cast<int>(args.integer(1, kMaxCount));
  } else {
    f.given.erase(a);
    return false;
  }
  return true;
}

// The shape checks of decode() (mla_decode() for MLA), without buffers.
void validate_model_shape(const Options& o) {
  const Model& m = o.model;
  if (m.mla()) {
    if (m.num_heads > kMaxMlaHeads) {
      fail(ErrorCode::kUnsupported, "num_heads", m.num_heads,
           "at most " + std::to_string(kMaxMlaHeads) + " query heads per latent row");
    }
    validate_mla_cache_shape(m.kv_lora_rank, m.rope_dim, o.block_size, 0, {}, {}, o.dtype);
    return;
  }
  DecodeArgs shape;  // batch 0: the shape checks of decode(), without its buffers
  shape.num_heads = m.num_heads;
  shape.num_kv_heads = m.num_kv_heads;
  shape.head_dim = m.head_dim;
  shape.block_size = o.block_size;
  validate_shapes(shape, false);
}

// The model shape must be one decode() runs; checked here so no request is simulated first.
void check_shape(const Options& o) {
  try {
    validate_model_shape(o);
  } catch (const Error& e) {
    const std::map<std::string, std::string> flags = {
        {"num_heads", "--heads"},           {"group_size", "--heads"},
        {"head_dim", "--head-dim"},         {"block_size", "--block-size"},
        {"kv_lora_rank", "--kv-lora-rank"}, {"rope_dim", "--rope-dim"}};
    const auto it = flags.find(e.argument());
    throw cli::UsageError(it == flags.end() ? e.argument() : it->second,
                          std::string(e.what()).substr(std::strlen("pagedattn: ")));
  }
  // The naive decode is GQA's: it has no latent form to compare with.
  if (o.model.mla() && o.compare_naive) {
    throw cli::UsageError("--compare", "naive", "the naive decode has no MLA form");
  }
  if (o.model.mla() && o.dtype == DType::kF32 && resolve_backend(o.backend) == Backend::kCuda) {
    throw cli::UsageError("--dtype", "f32",
                          "the CUDA backend's MLA kernel takes f16 or bf16 (the cpu backend f32)");
  }
}

// Every request must fit the cache on its own, beside the system prompts, or the loop could
// never finish it. Only a cache sized by --blocks can be too small; a budget's is raised.
void check_capacity(const Options& o) {
  if (o.num_blocks == 0) return;
  const long long longest = longest_request(o);
  const long long capacity =
      static_cast<long long>(o.num_blocks - system_prompt_blocks(o)) * o.block_size;
  if (longest > capacity) {
    std::ostringstream v;
    v << "the longest request, " << longest << " tokens (prompt " << o.prompt_len.max()
      << " + output " << o.output_len.max() << (o.system_prompts ? " + system prompt" : "")
      << "), exceeds the cache (--blocks * --block-size = "
      << static_cast<long long>(o.num_blocks) * o.block_size << " tokens, less "
      << system_prompt_blocks(o) << " blocks of system prompts)";
    throw cli::UsageError("--blocks", v.str());
  }
}

}  // namespace

Options parse_options(int argc, char** argv) {
  Options o;
  ShapeFlags shape;
  WorkloadFlags workload;
  cli::Args args(argc, argv);
  while (args.next()) {
    const std::string& a = args.flag();
    if (args.is_help()) {
      o.help = true;
    } else if (parse_model_flag(args, shape) || parse_workload_flag(args, o, workload)) {
    } else if (a == "--shared-cache") {
      o.shared_cache = true;
    } else if (a == "--share-prefixes") {
      o.share_prefixes = args.choice<bool>({{"on", true}, {"off", false}});
    } else if (a == "--progress" || a == "--no-progress") {
      o.progress = a == "--progress";
    } else if (a == "--sim-layers") {
      o.sim_layers = static_cast<int>(args.integer(1, 4096));
    } else if (a == "--blocks") {
      o.num_blocks = static_cast<int>(args.integer(1, kMaxCount));
    } else if (a == "--cache-mib") {
      o.cache_mib = args.number(0, 1 << 30, /*lo_open=*/true);
    } else if (a == "--block-size") {
      o.block_size = static_cast<int>(args.integer(1, kMaxBlockSize));
    } else if (a == "--dtype") {
      o.dtype =
          args.choice<DType>({{"f32", DType::kF32}, {"f16", DType::kF16}, {"bf16", DType::kBF16}});
    } else if (a == "--backend") {
      o.backend = args.choice<Backend>(
          {{"auto", Backend::kAuto}, {"cpu", Backend::kCpu}, {"cuda", Backend::kCuda}});
    } else if (a == "--threads") {
      o.threads = static_cast<int>(args.integer(1, kMaxThreads));
    } else if (a == "--verify-every") {
      o.verify_every = static_cast<int>(args.integer(0, kMaxCount));
    } else if (a == "--verify-seqs") {
      o.verify_seqs = static_cast<int>(args.integer(0, kMaxCount));
    } else if (a == "--compare") {
      o.compare_naive = args.choice<bool>({{"naive", true}});
    } else if (a == "--csv") {
      o.csv = args.text();
    } else {
      args.unknown();
    }
  }
  if (o.help) return o;
  o.model = shape.apply();
  apply_workload(o, workload);
  check_shape(o);
  check_capacity(o);
  return o;
}

}  // namespace pagedattn::sim
