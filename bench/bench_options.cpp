#include "bench_options.hpp"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <tuple>
#include <utility>

#include "pagedattn/cli/args.hpp"
#include "pagedattn/mla.hpp"
#include "pagedattn/validate.hpp"
#include "pagedattn/variants.hpp"

namespace pagedattn::bench {
namespace {

// The default grid: a long single sequence, mid batches, MHA, GQA 8, a small head dim, 256K tokens.
const Shape kDefaultShapes[] = {
    {1, 32, 8, 128, 32768, 16},  {8, 32, 8, 128, 8192, 16},  {32, 32, 8, 128, 2048, 16},
    {4, 32, 32, 128, 4096, 16},  {16, 64, 8, 128, 4096, 16}, {64, 32, 8, 64, 1024, 16},
    {1, 32, 8, 128, 262144, 16},
};
// --mla's default grid: 16 heads (128 over tensor parallelism 8) and 128, one and eight sequences.
const Shape kDefaultMlaShapes[] = {
    {1, 16, 1, 576, 4096, 64},
    {8, 16, 1, 576, 4096, 64},
    {1, 128, 1, 576, 4096, 64},
    {8, 128, 1, 576, 4096, 64},
};

constexpr int kMaxTokens = 1 << 30;  // a context, a batch, a head count
constexpr long long kMaxIters = 1000000000;
constexpr double kMaxSeconds = 3600;    // --min-time
constexpr long long kMaxBwMib = 65536;  // --bw-mib: 64 GiB
constexpr double kMaxSoftCap = 1e6;     // --soft-cap
constexpr int kMaxQLen = 1 << 20;       // --q-len

}  // namespace

void print_help(const char* prog) {
  std::printf(
      "usage: %s [flags]\n"
      "Times decode attention per shape and reports K/V GB/s against the read bandwidth measured\n"
      "in the same run, with the error against the f64 reference (exit 1 when it exceeds the\n"
      "dtype's tolerance).\n\n"
      "  --backend B        cpu, cuda or naive (default cpu; cpu also times the naive baseline)\n"
      "  --dtype LIST       f32, f16, bf16 or a list of them: f32,bf16 (default bf16)\n"
      "  --shape B,H,KV,D,CTX[,BLOCK]\n"
      "                     batch, heads, kv heads, head dim, context tokens per sequence and\n"
      "                     block size (default 16); repeatable (default: the standard grid).\n"
      "                     B and CTX at least 1, H a multiple of KV with at most %d heads per\n"
      "                     kv head, D one of the supported head dims, BLOCK in [1, %d]\n"
      "  --threads N        CPU threads, 1 to %d (default: OpenMP's default)\n"
      "  --csv              CSV on stdout (the bandwidth line goes to stderr)\n"
      "  --contiguous       block tables in order instead of a random permutation\n"
      "  --iters N          timed runs at least, 1 to %lld (default 20)\n"
      "  --min-time S       seconds of timed runs at least, 0 to %g (default 0.5)\n"
      "  --bw-mib N         MiB streamed per read-bandwidth pass, 1 to %lld (default 2048)\n"
      "  --no-naive         skip the naive baseline on the cpu backend\n"
      "  --clock C          CPU timing: wall (default) or thread-cpu, the calling thread's\n"
      "                     CPU time for the decode rows and the read bandwidth alike (needs\n"
      "                     --threads 1: comparable figures on a host shared with other work)\n"
      "  --plain            CUDA: time plain launches (default: CUDA-graph replays)\n"
      "  --batch-invariant  cpu, cuda: every row with DecodeOptions::batch_invariant (each\n"
      "                     sequence's bits independent of the batch; docs/batch_invariance.md;\n"
      "                     the CSV's batch_invariant column, 0 or 1, the last)\n"
      "  --long-first T     sequence 0 of each shape holds T tokens (1 to %d), the others CTX\n"
      "                     (a skewed batch; the context column shows CTX)\n"
      "  --limits           cpu: also time each shape's work on one thread with its K and V in\n"
      "                     cache (one kv head, 512 KiB of K/V), and report what bounds the row:\n"
      "                     that compute rate times --threads, or the read bandwidth, whichever\n"
      "                     is lower, and the row's share of it; and the pattern read: the\n"
      "                     shape's K/V read in decode's order with no arithmetic, on 4 KiB\n"
      "                     pages and on 2 MiB transparent huge pages whatever --huge-pages\n"
      "                     says (the CSV's compute_gbps, pattern_gbps, pct_bound, bound and\n"
      "                     pattern_huge_gbps columns)\n"
      "  --huge-pages on|off\n"
      "                     cpu, naive: the K/V pools the rows decode, 2 MiB-aligned, with\n"
      "                     transparent huge pages asked for (on, the default: madvise\n"
      "                     MADV_HUGEPAGE) or refused (off: MADV_NOHUGEPAGE); where the system's\n"
      "                     policy is never, on gives 4 KiB pages. The CSV's huge_pct column is\n"
      "                     the share of the pools' bytes the kernel backed with huge pages\n"
      "attention variants, on every row (the CSV's window, soft_cap, alibi and sinks columns\n"
      "and the table's variants column say which were on; see docs/variants.md):\n"
      "  --window N         sliding window: attend only to the last N + 1 tokens of each\n"
      "                     sequence (window_left = N, 0 to %d); GB/s and %%readBW count only\n"
      "                     the attended tokens' K/V bytes, the rest is never read\n"
      "  --soft-cap X       logits soft-cap: s -> X * tanh(s / X), X in (0, %g]\n"
      "  --alibi            ALiBi biases with the paper's slopes 2^(-8 (h + 1) / H)\n"
      "  --sinks            attention sinks: one random logit per head, uniform in [-2, 2],\n"
      "                     from a fixed seed\n"
      "multi-token queries:\n"
      "  --q-len N          query tokens per sequence, 1 to %d (default 1): token i of each\n"
      "                     sequence's N sits at position CTX - N + i and attends causally to\n"
      "                     the tokens up to it (q_indptr); q and out have B * N rows. GB/s and\n"
      "                     %%readBW count each sequence's attended K/V once, from its earliest\n"
      "                     query's first attended token on (the CSV's q_len column)\n"
      "  --tree-mask        with --q-len N (N >= 2): each sequence's N query tokens carry a tree\n"
      "                     mask (tree_mask): a fixed random token tree per sequence, each\n"
      "                     token's parent none or an earlier token, drawn from a fixed seed; a\n"
      "                     token attends the context before the N and itself and its ancestors\n"
      "                     among them. The CPU backend then reads each query token's context on\n"
      "                     its own (the CUDA backend reads it once for all of them), but GB/s\n"
      "                     and %%readBW still count each sequence's K/V once, as\n"
      "                     for --q-len, so tree and causal rows compare by time (the CSV's tree\n"
      "                     column, 0 or 1, the last)\n"
      "shared prefixes:\n"
      "  --share N,PREFIX   cpu: each run of N sequences (N >= 2) is one prompt's samples, forked\n"
      "                     after PREFIX tokens (1 to CTX): their tables begin with the same\n"
      "                     blocks (the block PREFIX falls inside is a copy of each sample's).\n"
      "                     Each shape is timed twice, DecodeOptions::share_prefixes off (row\n"
      "                     cpu) and on (row shared), with the speed-up and the K/V bytes\n"
      "                     each reads per step; GB/s counts every sequence's attended K/V in\n"
      "                     both rows, so they compare by time (docs/shared_prefix.md)\n"
      "MLA:\n"
      "  --mla              cpu, cuda: MLA decode (mla_decode, docs/mla.md) instead: each --shape "
      "is\n"
      "                     B,H,1,576,CTX[,BS] (H query heads on one latent row of 512 + 64\n"
      "                     values; default 1 and 8 sequences of 4096 tokens, 16 and 128 heads,\n"
      "                     block size 64), the cache one combined [blocks][BS][576] tensor of "
      "--kv-dtype\n"
      "                     (bf16, f16, f32 or fp8_e4m3/e5m2), with --q-len query tokens per\n"
      "                     sequence; GB/s and %%readBW count each latent row once; the CSV has\n"
      "                     its own columns (backend,dtype,kv_dtype,batch,heads,context,\n"
      "                     block_size,q_len,ms,gbps,pct_read_bw,rel_err)\n"
      "cache layout:\n"
      "  --layout L         where K and V live (kv_strides; the CSV's layout column):\n"
      "                     hnd, two tensors [blocks][kv heads][block][head_dim] (default);\n"
      "                     nhd, two tensors [blocks][block][kv heads][head_dim];\n"
      "                     combined_nhd, one tensor [blocks][2][block][kv heads][head_dim],\n"
      "                     each block's K then its V. GB/s counts the same K/V bytes in all\n"
      "cache dtype:\n"
      "  --kv-dtype T       the K and V caches' dtype: f32, f16, bf16, fp8_e4m3, fp8_e5m2, int8\n"
      "                     or int4 (default: each --dtype's own; q and out keep --dtype). An\n"
      "                     fp8 cache holds the values / %g (k_scale = v_scale = %g), an int8\n"
      "                     one the values / %g, an int4 one codes times %g times a scale per\n"
      "                     group of 32 values (CPU and naive only); no per-head scales. GB/s\n"
      "                     and %%readBW count the cache's own bytes (int4: half a byte a value\n"
      "                     and 4 bytes a group) (the CSV's kv_dtype column)\n"
      "  --token-scales     with a quantized --kv-dtype: a scale per (token, kv head) too\n"
      "                     (k_token_scales, dense). GB/s counts their 4 bytes a\n"
      "                     row; the pattern read of --limits does not read them (the CSV's\n"
      "                     token_scales column, 0 or 1)\n"
      "  --help, -h         this text\n",
      prog, kMaxGroupSize, kMaxBlockSize, kMaxThreads, kMaxIters, kMaxSeconds, kMaxBwMib,
      kMaxTokens, kMaxTokens, kMaxSoftCap, kMaxQLen, kFp8KvScale, kFp8KvScale, kInt8KvScale,
      kInt4KvScale);
}

namespace {

// --share N,PREFIX: two integers, N at least 2, PREFIX at least 1 (checked against each shape's
// batch and context in validate_shape).
std::pair<int, int> parse_share(const std::string& text) {
  const std::vector<std::string> items = cli::split_list("--share", text);
  if (items.size() != 2) cli::bad_value("--share", text, "expected N,PREFIX: 2 integers");
  const int n = static_cast<int>(cli::parse_int("--share", items[0], 2, kMaxTokens));
  const int prefix = static_cast<int>(cli::parse_int("--share", items[1], 1, kMaxTokens));
  return {n, prefix};
}

Shape parse_shape(const std::string& text) {
  std::vector<int> v;
  for (const std::string& item : cli::split_list("--shape", text)) {
    try {
      v.push_back(static_cast<int>(cli::parse_int("--shape", item, 0, kMaxTokens)));
    } catch (const cli::UsageError&) {
      cli::bad_value("--shape", text,
                     "'" + item + "' is not an integer in [0, " + std::to_string(kMaxTokens) + "]");
    }
  }
  if (v.size() != 5 && v.size() != 6) {
    cli::bad_value("--shape", text, "expected B,H,KV,D,CTX[,BLOCK]: 5 or 6 integers");
  }
  return Shape{v[0], v[1], v[2], v[3], v[4], v.size() == 6 ? v[5] : 16};
}

// Physical memory in bytes (0 when unknown).
double physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<double>(pages) * page : 0.0;
}

// Every shape is checked before anything is measured: what decode() would refuse, an empty
// batch or context (nothing to time), and a cache larger than the machine's memory.
void validate_shape(const Shape& s, const std::string& text, const Options& o) {
  const auto bad = [&](const std::string& why) { cli::bad_value("--shape", text, why); };
  if (s.batch < 1) bad("batch = 0: must be at least 1 (an empty batch reads nothing to time)");
  if (s.context < 1) bad("context = 0: must be at least 1 (an empty context reads nothing)");
  if (o.mla) {  // B,H,1,576,CTX: one latent row of 512 + 64 values (mla_rows.cpp)
    if (s.kv_heads != 1 || s.head_dim != 576) {
      bad("--mla shapes are B,H,1,576,CTX: one latent row of kv_lora_rank 512 + rope_dim 64");
    }
    if (s.heads > kMaxMlaHeads) bad("--mla: at most " + std::to_string(kMaxMlaHeads) + " heads");
    if (s.block_size < 1 || s.block_size > kMaxBlockSize) bad("block size out of [1, 256]");
    return;
  }
  DecodeArgs a;  // batch 0: the shape checks of decode(), without its buffers
  a.num_heads = s.heads;
  a.num_kv_heads = s.kv_heads;
  a.head_dim = s.head_dim;
  a.block_size = s.block_size;
  a.max_blocks_per_seq =
      (std::max(s.context, o.long_first) + s.block_size - 1) / std::max(s.block_size, 1);
  try {
    validate_shapes(a, false);
  } catch (const Error& e) {
    bad(std::string(e.what()).substr(std::strlen("pagedattn: ")));
  }
  // The query tokens of every sequence are rows of q, out and lse: their count is an int, and
  // q and out (with the CPU backend's per-token tables) must fit in memory.
  if (s.q_rows() > std::numeric_limits<int>::max()) {
    cli::bad_value("--q-len", std::to_string(o.q_len),
                   "batch * q_len = " + std::to_string(s.q_rows()) + " query tokens of --shape " +
                       text + " exceed the int32 range");
  }
  const double have = physical_memory_bytes();
  for (DType t : o.dtypes) {
    const double row_bytes = static_cast<double>(s.heads) * s.head_dim * (2.0 * dtype_size(t) + 4) +
                             4.0 * a.max_blocks_per_seq;
    const double q_bytes = static_cast<double>(s.q_rows()) * row_bytes;
    if (o.q_len > 1 && have > 0 && q_bytes > 0.25 * have) {
      char why[200];
      std::snprintf(why, sizeof why,
                    "the %s q, out and lse of --shape %s take %.1f GiB with %d query tokens per "
                    "sequence, more than a quarter of this machine's %.1f GiB",
                    dtype_name(t), text.c_str(), q_bytes / (1 << 30), o.q_len, have / (1 << 30));
      cli::bad_value("--q-len", std::to_string(o.q_len), why);
    }
  }
  if (o.share_members > 0 && (o.share_prefix > s.context || o.share_prefix > s.context_of(0))) {
    cli::bad_value("--share",
                   std::to_string(o.share_members) + "," + std::to_string(o.share_prefix),
                   "PREFIX is longer than the contexts of --shape " + text);
  }
  for (DType q_dtype : o.dtypes) {
    const DType t = o.kv_dtype_for(q_dtype);
    double blocks = (s.batch - 1.0) * std::ceil(static_cast<double>(s.context) / s.block_size) +
                    std::ceil(static_cast<double>(s.context_of(0)) / s.block_size);
    if (o.share_members > 0) {  // every sample but each prompt's first reuses its full blocks
      const int samples = s.batch - (s.batch + o.share_members - 1) / o.share_members;
      blocks -= static_cast<double>(samples) * (o.share_prefix / s.block_size);
    }
    const double bytes = 2.0 * dtype_bytes(t, static_cast<std::int64_t>(blocks * s.block_size) *
                                                  s.kv_heads * s.head_dim);
    // --limits reads the pattern on the other kind of pages too, from a second copy of the pools.
    const double held = o.limits ? 2 * bytes : bytes;
    if (have > 0 && held > 0.5 * have) {
      char why[240];
      char twice[100] = "";
      if (o.limits) {
        std::snprintf(twice, sizeof twice,
                      " (%.1f GiB held with --limits: the pattern read on both kinds of pages)",
                      held / (1 << 30));
      }
      std::snprintf(why, sizeof why,
                    "its %s K/V cache takes %.1f GiB%s, more than half of this machine's %.1f GiB",
                    dtype_name(t), bytes / (1 << 30), twice, have / (1 << 30));
      bad(why);
    }
  }
}

}  // namespace

Options parse(int argc, char** argv) {
  Options o;
  bool huge_pages_given = false;
  cli::Args args(argc, argv);
  const std::vector<std::pair<std::string, DType>> dtypes = {
      {"f32", DType::kF32}, {"f16", DType::kF16}, {"bf16", DType::kBF16}};
  while (args.next()) {
    if (args.is_help()) {
      o.help = true;
    } else if (args.is("--backend")) {
      o.backend = args.choice<std::string>({{"cpu", "cpu"}, {"cuda", "cuda"}, {"naive", "naive"}});
    } else if (args.is("--dtype")) {
      o.dtypes = args.choice_list(dtypes);
    } else if (args.is("--shape")) {
      o.shape_texts.push_back(args.value());
      o.shapes.push_back(parse_shape(o.shape_texts.back()));
    } else if (args.is("--threads")) {
      o.threads = static_cast<int>(args.integer(1, kMaxThreads));
    } else if (args.is("--csv")) {
      o.csv = true;
    } else if (args.is("--contiguous")) {
      o.contiguous = true;
    } else if (args.is("--no-naive")) {
      o.naive = false;
    } else if (args.is("--iters")) {
      o.iters = static_cast<int>(args.integer(1, kMaxIters));
    } else if (args.is("--min-time")) {
      o.min_time = args.number(0, kMaxSeconds);
    } else if (args.is("--bw-mib")) {
      o.bw_mib = static_cast<std::size_t>(args.integer(1, kMaxBwMib));
    } else if (args.is("--clock")) {
      o.clock = args.choice<Clock>({{"wall", Clock::kWall}, {"thread-cpu", Clock::kThreadCpu}});
    } else if (args.is("--plain")) {
      o.plain = true;
    } else if (args.is("--batch-invariant")) {
      o.batch_invariant = true;
    } else if (args.is("--limits")) {
      o.limits = true;
    } else if (args.is("--long-first")) {
      o.long_first = static_cast<int>(args.integer(1, kMaxTokens));
    } else if (args.is("--window")) {
      o.variants.window_left = static_cast<int>(args.integer(0, kMaxTokens));
    } else if (args.is("--soft-cap")) {
      const std::string text = args.value();
      o.variants.soft_cap =
          static_cast<float>(cli::parse_number("--soft-cap", text, 0, kMaxSoftCap, true));
      // The library takes the cap as a float: one that rounds to 0 there would turn it off.
      if (o.variants.soft_cap < std::numeric_limits<float>::min()) {
        cli::bad_value("--soft-cap", text, "too small: below the smallest normal float");
      }
    } else if (args.is("--alibi")) {
      o.variants.alibi = true;
    } else if (args.is("--sinks")) {
      o.variants.sinks = true;
    } else if (args.is("--q-len")) {
      o.q_len = static_cast<int>(args.integer(1, kMaxQLen));
    } else if (args.is("--tree-mask")) {
      o.tree_mask = true;
    } else if (args.is("--share")) {
      std::tie(o.share_members, o.share_prefix) = parse_share(args.value());
    } else if (args.is("--mla")) {
      o.mla = true;
    } else if (args.is("--kv-dtype")) {
      o.kv_dtype = args.choice<DType>({{"f32", DType::kF32},
                                       {"f16", DType::kF16},
                                       {"bf16", DType::kBF16},
                                       {"fp8_e4m3", DType::kFP8E4M3},
                                       {"fp8_e5m2", DType::kFP8E5M2},
                                       {"int8", DType::kInt8},
                                       {"int4", DType::kInt4}});
    } else if (args.is("--token-scales")) {
      o.token_scales = true;
    } else if (args.is("--huge-pages")) {
      huge_pages_given = true;
      o.huge_pages = args.choice<testing::HugePages>(
          {{"on", testing::HugePages::kOn}, {"off", testing::HugePages::kOff}});
    } else if (args.is("--layout")) {
      o.layout =
          args.choice<testing::KvLayout>({{"hnd", testing::KvLayout::kHnd},
                                          {"nhd", testing::KvLayout::kNhd},
                                          {"combined_nhd", testing::KvLayout::kCombinedNhd}});
    } else {
      args.unknown();
    }
  }
  if (o.help) return o;
  if (o.shapes.empty()) {
    if (o.mla) {
      o.shapes.assign(std::begin(kDefaultMlaShapes), std::end(kDefaultMlaShapes));
    } else {
      o.shapes.assign(std::begin(kDefaultShapes), std::end(kDefaultShapes));
    }
    for (const Shape& s : o.shapes) {
      o.shape_texts.push_back(std::to_string(s.batch) + "," + std::to_string(s.heads) + "," +
                              std::to_string(s.kv_heads) + "," + std::to_string(s.head_dim) + "," +
                              std::to_string(s.context) + "," + std::to_string(s.block_size));
    }
  }
  if (o.dtypes.empty()) o.dtypes.push_back(DType::kBF16);
  for (std::size_t i = 0; i < o.shapes.size(); ++i) {
    o.shapes[i].long_first = o.long_first;
    o.shapes[i].q_len = o.q_len;
    validate_shape(o.shapes[i], o.shape_texts[i], o);
  }
  if (o.limits && o.backend != "cpu") {
    cli::bad_value("--backend", o.backend, "--limits bounds CPU rows only (--backend cpu)");
  }
  if (o.mla && (o.tree_mask || o.token_scales || o.limits || o.variants.any() ||
                o.layout != testing::KvLayout::kHnd || o.long_first > 0)) {
    cli::bad_value("--mla", "set",
                   "takes --q-len, --kv-dtype, --dtype, --threads and --batch-invariant only");
  }
  if (o.share_members > 0 && (o.backend != "cpu" || o.mla)) {
    cli::bad_value("--share",
                   std::to_string(o.share_members) + "," + std::to_string(o.share_prefix),
                   "shared prefixes run on the CPU backend only (--backend cpu, no --mla)");
  }
  // A tree mask orders a sequence's new tokens, so it needs two of them at least.
  if (o.tree_mask && o.q_len < 2) {
    cli::bad_value("--q-len", std::to_string(o.q_len),
                   "--tree-mask needs at least 2 query tokens per sequence (--q-len N, N >= 2)");
  }
  const DType kv = o.kv_dtype.value_or(o.dtypes.front());
  if (o.token_scales && !is_quantized(kv)) {
    cli::bad_value("--token-scales", dtype_name(kv),
                   "needs a quantized cache (--kv-dtype fp8_e4m3, fp8_e5m2, int8 or int4)");
  }
  if (kv == DType::kInt4 && o.backend == "cuda") {
    cli::bad_value("--kv-dtype", "int4",
                   "the CUDA backend has no int4 caches yet (--backend cpu or naive)");
  }
  if (huge_pages_given && o.backend == "cuda") {
    cli::bad_value("--huge-pages", testing::huge_pages_name(o.huge_pages),
                   "sets the pages of host pools; --backend cuda decodes from device memory");
  }
  if (o.clock == Clock::kThreadCpu) {
    // The calling thread's CPU time counts only the work done on it: one thread, on the CPU.
    if (o.backend == "cuda") {
      cli::bad_value("--clock", "thread-cpu", "times CPU work only, not --backend cuda");
    }
    if (o.threads != 1) {  // 0: not given
      cli::bad_value("--clock", "thread-cpu",
                     "needs --threads 1 (only the calling thread's CPU time is counted)");
    }
  }
  if (o.threads == 0) o.threads = omp_get_max_threads();
  o.max_time = std::max(o.max_time, o.min_time);
  return o;
}

}  // namespace pagedattn::bench
