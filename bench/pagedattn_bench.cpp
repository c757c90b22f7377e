// pagedattn-bench: times decode attention per shape and reports KV GB/s against the machine's
// read bandwidth measured in the same run, with the error against the f64 reference.
//
//   pagedattn-bench [--backend cpu|cuda|naive] [--dtype f32|f16|bf16[,...]]
//                   [--shape B,H,KV,D,CTX[,BS]]... [--threads N] [--csv] [--contiguous]
//                   [--iters N] [--min-time S] [--bw-mib N] [--no-naive] [--plain]
//                   [--long-first TOKENS] [--window N] [--soft-cap X] [--alibi] [--sinks]
//                   [--q-len N] [--layout hnd|nhd|combined_nhd]
//                   [--kv-dtype f32|f16|bf16|fp8_e4m3|fp8_e5m2]
//
// Every flag is parsed strictly (cli/args.hpp) and every shape checked before anything is
// measured; a bad one is a message naming the flag and the value, and exit status 2.
//
// CPU timings rotate the inputs across enough copies of the cache that together they exceed the
// last-level cache several times, so no step is served from it. The CPU backend's shapes are also
// run through the naive baseline (naive_decode.hpp) and the speed-up is printed.
//
// The attention variants (--window, --soft-cap, --alibi, --sinks) apply to every row, the naive
// baseline's too, and the output says which were on. With a window a step reads only the attended
// tokens' K/V, and GB/s counts only those bytes.
//
// --q-len N gives every sequence N query tokens (speculative decoding, chunked prefill:
// DecodeArgs::q_indptr), so q and out have batch * N rows. GB/s still counts each sequence's
// attended K/V once, as the least a step must read for all of its query tokens together: a
// backend that reads it once per query token shows that as a lower GB/s.
//
// --layout puts K and V where a serving engine keeps them (DecodeArgs::kv_strides): hnd, the
// default dense [blocks][kv heads][block_size][head_dim] tensors; nhd, [blocks][block_size]
// [kv heads][head_dim]; combined_nhd, one tensor holding each block's K then its V. The bytes a
// step must read are the same K and V bytes in every layout, and so is GB/s's numerator.
//
// --kv-dtype stores the caches in another dtype than q and out (by default the same), fp8 among
// them (scaled by kFp8KvScale, cuda_timing.hpp). GB/s and %readBW count the bytes of the caches'
// own dtype: an fp8 step must read half the bytes of a bf16 one.
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "bench_variants.hpp"
#include "cuda_timing.hpp"
#include "naive_decode.hpp"
#include "pagedattn/cli/args.hpp"
#include "pagedattn/reference.hpp"
#include "pagedattn/testing/kv_layouts.hpp"
#include "pagedattn/testing/random_case.hpp"
#include "pagedattn/validate.hpp"
#include "pagedattn/variants.hpp"
#include "read_bandwidth.hpp"

using namespace pagedattn;
using pagedattn::bench::Shape;

namespace {

// The default grid: a long single sequence, mid batches, MHA, GQA 8, a small head dim, 256K tokens.
const Shape kDefaultShapes[] = {
    {1, 32, 8, 128, 32768, 16},  {8, 32, 8, 128, 8192, 16},  {32, 32, 8, 128, 2048, 16},
    {4, 32, 32, 128, 4096, 16},  {16, 64, 8, 128, 4096, 16}, {64, 32, 8, 64, 1024, 16},
    {1, 32, 8, 128, 262144, 16},
};

struct Options {
  bool help = false;
  std::string backend = "cpu";
  std::vector<DType> dtypes;  // --dtype, comma-separated; bf16 when not given
  std::vector<Shape> shapes;
  std::vector<std::string> shape_texts;  // as given, for the messages
  int threads = 0;
  bool csv = false;
  bool contiguous = false;
  bool naive = true;
  bool plain = false;        // CUDA: plain launches instead of CUDA-graph replays
  int long_first = 0;        // > 0: sequence 0 of every shape holds this many tokens
  bench::Variants variants;  // --window, --soft-cap, --alibi, --sinks: on every row
  int q_len = 1;             // --q-len: query tokens per sequence
  int iters = 20;            // timed runs at least
  double min_time = 0.5;     // seconds of timed runs at least
  double max_time = 10.0;    // stop after this many seconds (at least 3 runs)
  std::size_t bw_mib = 2048;
  bench::Clock clock = bench::Clock::kWall;  // --clock: what the CPU rows and bandwidth time
  bool limits = false;  // --limits: each CPU row's compute bound beside the read bandwidth
  // --layout: where K and V live (kHnd: the default dense layout, kv_strides 0)
  testing::KvLayout layout = testing::KvLayout::kHnd;
  // --kv-dtype: the caches' dtype; unset: each --dtype's own
  std::optional<DType> kv_dtype;

  DType kv_dtype_for(DType dtype) const { return kv_dtype.value_or(dtype); }
};

constexpr int kMaxTokens = 1 << 30;  // a context, a batch, a head count
constexpr long long kMaxIters = 1000000000;
constexpr double kMaxSeconds = 3600;    // --min-time
constexpr long long kMaxBwMib = 65536;  // --bw-mib: 64 GiB
constexpr double kMaxSoftCap = 1e6;     // --soft-cap
constexpr int kMaxQLen = 1 << 20;       // --q-len

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
      "  --long-first T     sequence 0 of each shape holds T tokens (1 to %d), the others CTX\n"
      "                     (a skewed batch; the context column shows CTX)\n"
      "  --limits           cpu: also time each shape's work on one thread with its K and V in\n"
      "                     cache (one kv head, 512 KiB of K/V), and report what bounds the row:\n"
      "                     that compute rate times --threads, or the read bandwidth, whichever\n"
      "                     is lower, and the row's share of it; and the pattern read: the\n"
      "                     shape's K/V read in decode's order with no arithmetic (the CSV's\n"
      "                     compute_gbps, pattern_gbps, pct_bound and bound columns)\n"
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
      "cache layout:\n"
      "  --layout L         where K and V live (kv_strides; the CSV's layout column):\n"
      "                     hnd, two tensors [blocks][kv heads][block][head_dim] (default);\n"
      "                     nhd, two tensors [blocks][block][kv heads][head_dim];\n"
      "                     combined_nhd, one tensor [blocks][2][block][kv heads][head_dim],\n"
      "                     each block's K then its V. GB/s counts the same K/V bytes in all\n"
      "cache dtype:\n"
      "  --kv-dtype T       the K and V caches' dtype: f32, f16, bf16, fp8_e4m3 or fp8_e5m2\n"
      "                     (default: each --dtype's own; q and out keep --dtype). An fp8 cache\n"
      "                     holds the values / %g (k_scale = v_scale = %g, no per-head scales).\n"
      "                     GB/s and %%readBW count the cache's own bytes (the CSV's kv_dtype\n"
      "                     column)\n"
      "  --help, -h         this text\n",
      prog, kMaxGroupSize, kMaxBlockSize, kMaxThreads, kMaxIters, kMaxSeconds, kMaxBwMib,
      kMaxTokens, kMaxTokens, kMaxSoftCap, kMaxQLen, bench::kFp8KvScale, bench::kFp8KvScale);
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
  for (DType q_dtype : o.dtypes) {
    const DType t = o.kv_dtype_for(q_dtype);
    const double blocks =
        (s.batch - 1.0) * std::ceil(static_cast<double>(s.context) / s.block_size) +
        std::ceil(static_cast<double>(s.context_of(0)) / s.block_size);
    const double bytes = 2.0 * blocks * s.block_size * s.kv_heads * s.head_dim * dtype_size(t);
    if (have > 0 && bytes > 0.5 * have) {
      char why[160];
      std::snprintf(why, sizeof why,
                    "its %s K/V cache takes %.1f GiB, more than half of this machine's %.1f GiB",
                    dtype_name(t), bytes / (1 << 30), have / (1 << 30));
      bad(why);
    }
  }
}

Options parse(int argc, char** argv) {
  Options o;
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
      o.clock = args.choice<bench::Clock>(
          {{"wall", bench::Clock::kWall}, {"thread-cpu", bench::Clock::kThreadCpu}});
    } else if (args.is("--plain")) {
      o.plain = true;
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
    } else if (args.is("--kv-dtype")) {
      o.kv_dtype = args.choice<DType>({{"f32", DType::kF32},
                                       {"f16", DType::kF16},
                                       {"bf16", DType::kBF16},
                                       {"fp8_e4m3", DType::kFP8E4M3},
                                       {"fp8_e5m2", DType::kFP8E5M2}});
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
    o.shapes.assign(std::begin(kDefaultShapes), std::end(kDefaultShapes));
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
  if (o.clock == bench::Clock::kThreadCpu) {
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

// Tokens of each kv head one decode step attends to over the batch: every context's, or with a
// window the last window_left + 1 of each (from window_first_token on; the blocks before it, and
// the slots of the first attended block before it, are never read). With q_len query tokens a
// sequence's tokens from its earliest query's window start on (queries_first_token), counted
// once: the K/V all of its query tokens read together.
double attended_tokens(const Shape& s, int window_left) {
  if (s.batch <= 0) return 0.0;
  const auto attended = [&](int len) {
    return static_cast<double>(len - queries_first_token(len, s.q_len, window_left));
  };
  return (s.batch - 1) * attended(s.context) + attended(s.context_of(0));
}

// Bytes of K and V one decode step must read: every attended token, each kv head, once, in the
// caches' dtype t.
double kv_bytes(const Shape& s, DType t, int window_left) {
  return 2.0 * attended_tokens(s, window_left) * s.kv_heads * s.head_dim *
         static_cast<double>(dtype_size(t));
}

// Median time (ms) of fn(i) on `clock` for i = 0, 1, ... after `warmup` untimed calls; min_time
// and max_time bound the runs in wall seconds.
double median_ms(const std::function<void(int)>& fn, int warmup, int min_iters, double min_time,
                 double max_time, bench::Clock clock) {
  for (int i = 0; i < warmup; ++i) fn(i);
  std::vector<double> ms;
  const double start = bench::seconds_now(bench::Clock::kWall);
  for (int i = warmup;; ++i) {
    const double t0 = bench::seconds_now(clock);
    fn(i);
    ms.push_back(1e3 * (bench::seconds_now(clock) - t0));
    const double total = bench::seconds_now(bench::Clock::kWall) - start;
    const int n = static_cast<int>(ms.size());
    if ((n >= min_iters && total >= min_time) || (n >= 3 && total >= max_time)) break;
  }
  std::sort(ms.begin(), ms.end());
  const std::size_t n = ms.size();
  return n % 2 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]);
}

// rel_err = max |out - ref| / max |ref| over the first sequences whose reference is quick to
// compute (the whole batch on the default grid). The reference attends each query token over
// its own context, so with several query tokens a sequence costs that many. When sequence 0's
// query tokens alone are too many, only its last m are checked (they attend exactly as the m
// query tokens of a sequence with m would); NaN when even one is too large.
double rel_err_vs_reference(const DecodeArgs& args) {
  constexpr double kMaxTokenHeads = 8.0 * 1024 * 1024;
  const auto queries = [&](int b) {
    return args.q_indptr ? std::max(args.q_indptr[b + 1] - args.q_indptr[b], 1) : 1;
  };
  DecodeArgs sub = args;
  sub.batch = 0;
  double work = 0;
  for (int b = 0; b < args.batch; ++b) {
    work += static_cast<double>(args.context_lens[b]) * args.num_kv_heads * queries(b);
    if (work > kMaxTokenHeads && sub.batch > 0) break;
    sub.batch = b + 1;
  }
  std::int64_t row0 = 0;  // the first row of out the reference's rows stand for
  std::int32_t tail[2] = {0, 0};
  const double per_query = static_cast<double>(args.context_lens[0]) * args.num_kv_heads;
  if (sub.batch == 1 && per_query * queries(0) > kMaxTokenHeads * 2) {
    const int m =
        static_cast<int>(std::min<double>(queries(0) - 1, kMaxTokenHeads * 2 / per_query));
    if (m < 1) return std::nan("");
    row0 = queries(0) - m;
    tail[1] = m;
    sub.q_indptr = tail;
    sub.num_q_tokens = sub.max_q_len = m;
    sub.q = static_cast<const std::uint8_t*>(args.q) +
            row0 * args.q_stride() * static_cast<std::int64_t>(dtype_size(args.q_dtype));
  } else if (sub.q_indptr) {
    sub.num_q_tokens = sub.q_indptr[sub.batch];  // the first sequences' rows
  }
  const ReferenceResult ref = reference_decode(sub);
  const std::int64_t first = row0 * args.num_heads * args.head_dim;  // out is dense
  double scale = 1e-30, err = 0;
  for (std::size_t i = 0; i < ref.out.size(); ++i) {
    const double got =
        load_as_float(args.out, args.out_dtype, first + static_cast<std::int64_t>(i));
    if (!std::isfinite(got)) return std::numeric_limits<double>::infinity();
    scale = std::max(scale, std::fabs(ref.out[i]));
    err = std::max(err, std::fabs(got - ref.out[i]));
  }
  return err / scale;
}

struct Row {
  std::string backend;
  Shape shape;
  double ms, gbps, pct, rel_err;
  double compute_gbps = 0;  // --limits: the compute bound (0: not measured)
  double pattern_gbps = 0;  // --limits: the pattern read (pattern_read_gbps)
  double read_gbps = 0;     // the read bandwidth of the run
};

// --limits: the lower of the compute bound and the read bandwidth, and which one it is.
double bound_gbps(const Row& r) { return std::min(r.compute_gbps, r.read_gbps); }
const char* bound_name(const Row& r) { return r.compute_gbps < r.read_gbps ? "compute" : "read"; }

// The variants column of the printed table: "-" for plain attention.
std::string variants_text(const bench::Variants& v) {
  std::vector<std::string> on;
  if (v.window_left >= 0) on.push_back("window=" + std::to_string(v.window_left));
  if (v.soft_cap > 0.f) {
    std::ostringstream cap;
    cap << "soft_cap=" << v.soft_cap;
    on.push_back(cap.str());
  }
  if (v.alibi) on.push_back("alibi");
  if (v.sinks) on.push_back("sinks");
  std::string text;
  for (const std::string& item : on) text += (text.empty() ? "" : ",") + item;
  return text.empty() ? "-" : text;
}

void print_row(const Options& o, DType dtype, const Row& r) {
  const Shape& s = r.shape;
  const bench::Variants& v = o.variants;
  const DType kv = o.kv_dtype_for(dtype);
  const bool limits = o.limits && r.compute_gbps > 0;
  if (o.csv) {
    std::printf("%s,%s,%d,%d,%d,%d,%d,%d,%.4f,%.2f,%.1f,%.3g,%d,%g,%d,%d,%d,%s,%s",
                r.backend.c_str(), dtype_name(dtype), s.batch, s.heads, s.kv_heads, s.head_dim,
                s.context, s.block_size, r.ms, r.gbps, r.pct, r.rel_err, v.window_left, v.soft_cap,
                v.alibi ? 1 : 0, v.sinks ? 1 : 0, s.q_len, testing::kv_layout_name(o.layout),
                dtype_name(kv));
    if (limits) {
      std::printf(",%.2f,%.2f,%.1f,%s", r.compute_gbps, r.pattern_gbps,
                  100.0 * r.gbps / bound_gbps(r), bound_name(r));
    } else if (o.limits) {
      std::printf(",,,,");
    }
    std::printf("\n");
  } else {
    std::printf(
        "%-6s %-5s %-8s %4d %4d %4d %4d %7d %4d %5d %-12s %10.3f %8.2f %7.1f%% %10.3g  %s\n",
        r.backend.c_str(), dtype_name(dtype), dtype_name(kv), s.batch, s.heads, s.kv_heads,
        s.head_dim, s.context, s.block_size, s.q_len, testing::kv_layout_name(o.layout), r.ms,
        r.gbps, r.pct, r.rel_err, variants_text(v).c_str());
    if (limits) {
      std::printf(
          "       bound: %s, %.2f GB/s (compute %.2f = %d threads x %.2f in cache; read "
          "%.2f): %.1f%% of it; pattern read %.2f GB/s\n",
          bound_name(r), bound_gbps(r), r.compute_gbps, o.threads, r.compute_gbps / o.threads,
          r.read_gbps, 100.0 * r.gbps / bound_gbps(r), r.pattern_gbps);
    }
  }
  std::fflush(stdout);
}

// A case of `shape` plus extra copies of its cache, so consecutive steps read different memory,
// and the attention variants every step applies. With q_len > 1 every sequence has q_len query
// tokens: q, out and lse have a row per token (q_rows, out_rows, lse_rows replace the base
// case's). In a layout other than hnd every copy of the cache is the base case's K and V in that
// layout (laid), and base's dense K and V are dropped.
struct RotatingCase {
  testing::HostCase base;
  std::vector<std::vector<std::uint8_t>> k_copies, v_copies;
  std::vector<testing::KvStorage> laid;
  bench::Variants variants;
  bench::VariantValues values;
  int q_len = 1;
  std::vector<std::int32_t> q_indptr;
  std::vector<std::uint8_t> q_rows, out_rows;
  std::vector<float> lse_rows;
  int copies() const {
    return laid.empty() ? 1 + static_cast<int>(k_copies.size()) : static_cast<int>(laid.size());
  }
  DecodeArgs args(int i) {
    DecodeArgs a = base.args();
    bench::apply_variants(variants, values.slopes.data(), values.sinks.data(), a);
    if (q_len > 1) {
      bench::apply_q_len(q_len, q_indptr.data(), a);
      a.q = q_rows.data();
      a.out = out_rows.data();
      a.lse = lse_rows.data();
    }
    const int c = i % copies();
    if (!laid.empty()) {
      const testing::KvStorage& kv = laid[static_cast<std::size_t>(c)];
      kv.apply(a, kv.k.data(), kv.v.data());
    } else if (c > 0) {
      a.k_cache = k_copies[c - 1].data();
      a.v_cache = v_copies[c - 1].data();
    }
    return a;
  }
};

RotatingCase make_rotating_case(const Options& o, DType dtype, const Shape& s, bool rotate = true) {
  testing::CaseSpec spec;
  spec.batch = s.batch;
  spec.num_heads = s.heads;
  spec.num_kv_heads = s.kv_heads;
  spec.head_dim = s.head_dim;
  spec.block_size = s.block_size;
  spec.context_lens.resize(s.batch);
  for (int b = 0; b < s.batch; ++b) spec.context_lens[b] = s.context_of(b);
  spec.q_dtype = spec.out_dtype = dtype;
  spec.kv_dtype = o.kv_dtype_for(dtype);
  if (is_fp8(spec.kv_dtype)) spec.k_scale = spec.v_scale = bench::kFp8KvScale;
  spec.fragmented = !o.contiguous;
  spec.seed = 20261129u + static_cast<std::uint64_t>(s.batch) * 131 + s.context;
  RotatingCase rc{testing::make_case(spec), {}, {}, {}, o.variants, {o.variants, s.heads}};
  if (s.q_len > 1) {
    // The query rows, drawn like the case's own q (normal, unit variance).
    rc.q_len = s.q_len;
    rc.q_indptr = bench::uniform_q_indptr(s.batch, s.q_len);
    const std::size_t elems = static_cast<std::size_t>(s.q_rows()) * s.heads * s.head_dim;
    rc.q_rows.resize(elems * dtype_size(dtype));
    rc.out_rows.resize(elems * dtype_size(dtype));
    rc.lse_rows.resize(static_cast<std::size_t>(s.q_rows()) * s.heads);
    std::mt19937_64 rng(spec.seed + 1);
    std::normal_distribution<float> normal(0.f, 1.f);
    for (std::size_t i = 0; i < elems; ++i) {
      store_from_float(rc.q_rows.data(), dtype, i, normal(rng));
    }
  }
  if (o.layout != testing::KvLayout::kHnd) {
    rc.laid.push_back(testing::store_kv(rc.base, o.layout));
    std::vector<std::uint8_t>().swap(rc.base.k);
    std::vector<std::uint8_t>().swap(rc.base.v);
  }
  const double cache_bytes = rc.laid.empty()
                                 ? static_cast<double>(rc.base.k.size() + rc.base.v.size())
                                 : static_cast<double>(rc.laid[0].k.size() + rc.laid[0].v.size());
  const double want = rotate ? 4.0 * static_cast<double>(bench::last_level_cache_bytes()) : 0.0;
  const int copies = std::min(64, static_cast<int>(std::ceil(want / std::max(cache_bytes, 1.0))));
  for (int c = 1; c < copies; ++c) {
    if (!rc.laid.empty()) {
      rc.laid.push_back(rc.laid[0]);
    } else {
      rc.k_copies.push_back(rc.base.k);
      rc.v_copies.push_back(rc.base.v);
    }
  }
  return rc;
}

// One thread's decode rate on shape s's work with K and V in cache (K/V GB/s): the same dtypes,
// head dim, group, block size, query tokens, layout and variants, one sequence of one kv head
// whose K and V fill kInCacheBytes (half of the smallest L2 of the x86 hosts measured), decoded
// again and again from the same memory: the fastest of 300 calls, what the core does undisturbed
// (a host shared with other work stretches some calls, never shortens one). Each thread of a call
// runs items of its own, so --threads times this rate is what the shape could reach with
// unlimited read bandwidth: its compute bound. It counts a call's fixed cost (the plan, a few
// microseconds), which a long call pays once, so it errs low by a few percent.
double in_cache_gbps(const Options& o, DType dtype, const Shape& s) {
  constexpr double kInCacheBytes = 512.0 * 1024;
  const DType kv = o.kv_dtype_for(dtype);
  const double token_bytes = 2.0 * s.head_dim * static_cast<double>(dtype_size(kv));
  Shape c = s;
  c.batch = 1;
  c.heads = s.heads / s.kv_heads;
  c.kv_heads = 1;
  c.long_first = 0;
  c.context = std::max({static_cast<int>(kInCacheBytes / token_bytes) / s.block_size * s.block_size,
                        s.block_size, s.q_len});
  RotatingCase rc = make_rotating_case(o, dtype, c, false);
  DecodeOptions opt;
  opt.backend = Backend::kCpu;
  opt.num_threads = 1;
  const DecodeArgs a = rc.args(0);
  double ms = 1e30;
  for (int i = 0; i < 5; ++i) decode(a, opt);
  for (int i = 0; i < 300; ++i) {
    const double t0 = bench::seconds_now(o.clock);
    decode(a, opt);
    ms = std::min(ms, 1e3 * (bench::seconds_now(o.clock) - t0));
  }
  return kv_bytes(c, kv, o.variants.window_left) / (ms * 1e-3) / 1e9;
}

// The pattern read of a CPU row: the shape's K and V read in the order decode reads them, with no
// arithmetic. Every sequence's attended blocks in table order, each block's K then its V (all kv
// heads: a block is one contiguous run in every layout the benchmark offers), sequences cut into
// chunks of blocks so that each thread has several tasks (as the CPU backend's split plan does),
// shared out dynamically; the median of passes over the rotating copies, in K/V GB/s as the
// decode rows count them. Its gap to the streaming read is what the access pattern costs (runs
// of a few to 64 KB at scattered places); a decode row near it is bound by that, not by its
// arithmetic.
double pattern_read_gbps(const Options& o, RotatingCase& rc, DType dtype, const Shape& s) {
  const DType kv = o.kv_dtype_for(dtype);
  const std::size_t block_bytes =
      static_cast<std::size_t>(s.kv_heads) * s.block_size * s.head_dim * dtype_size(kv) / 64 * 64;
  // The table entries [first, end) of sequence b that decode reads.
  const auto attended_blocks = [&](int b) {
    const int len = s.context_of(b);
    return std::make_pair(queries_first_token(len, s.q_len, o.variants.window_left) / s.block_size,
                          (len + s.block_size - 1) / s.block_size);
  };
  std::int64_t total_blocks = 0;
  for (int b = 0; b < s.batch; ++b) {
    const auto [first, end] = attended_blocks(b);
    total_blocks += end - first;
  }
  const std::int64_t chunk =
      std::max<std::int64_t>(1, (total_blocks + 8 * o.threads - 1) / (8 * o.threads));
  std::vector<std::vector<bench::ReadTask>> passes;
  for (int c = 0; c < rc.copies(); ++c) {
    const DecodeArgs a = rc.args(c);
    const std::int64_t stride =
        a.cache_layout().block_stride * static_cast<std::int64_t>(dtype_size(kv));
    const char* k = static_cast<const char*>(a.k_cache);
    const char* v = static_cast<const char*>(a.v_cache);
    std::vector<bench::ReadTask> tasks;
    for (int b = 0; b < s.batch; ++b) {
      const auto [first, end] = attended_blocks(b);
      for (int j = first; j < end; ++j) {
        if ((j - first) % chunk == 0) tasks.emplace_back();
        const std::int64_t at = a.block_table[static_cast<std::int64_t>(b) * a.table_stride() + j];
        tasks.back().push_back({k + at * stride, block_bytes});
        tasks.back().push_back({v + at * stride, block_bytes});
      }
    }
    passes.push_back(std::move(tasks));
  }
  const double ms = median_ms(
      [&](int i) {
        bench::time_read_tasks(passes[static_cast<std::size_t>(i) % passes.size()], o.threads,
                               o.clock);
      },
      std::max<int>(2, static_cast<int>(passes.size())), o.iters, o.min_time, o.max_time, o.clock);
  return kv_bytes(s, kv, o.variants.window_left) / (ms * 1e-3) / 1e9;
}

int run(int argc, char** argv) {
  const Options o = parse(argc, argv);
  if (o.help) {
    print_help(argv[0]);
    return 0;
  }
  FILE* info = o.csv ? stderr : stdout;  // the CSV on stdout stays machine-readable
  double read_bw = 0;
  if (o.backend == "cuda") {
    read_bw = bench::cuda_read_ceiling_gbps();
    std::fprintf(info, "GPU read bandwidth: %.1f GB/s\n", read_bw);
  } else {
    read_bw = bench::measure_read_bandwidth_gbps(o.bw_mib << 20, o.threads, 5, o.clock);
    std::fprintf(info, "read bandwidth: %.2f GB/s (%d threads, %zu MiB streamed per pass%s)\n",
                 read_bw, o.threads, o.bw_mib,
                 o.clock == bench::Clock::kThreadCpu ? ", thread CPU time" : "");
  }
  std::fflush(info);
  if (o.csv) {
    std::printf(
        "backend,dtype,batch,heads,kv_heads,head_dim,context,block_size,ms,gbps,"
        "pct_read_bw,rel_err,window,soft_cap,alibi,sinks,q_len,layout,kv_dtype%s\n",
        o.limits ? ",compute_gbps,pattern_gbps,pct_bound,bound" : "");
  } else {
    std::printf("%-6s %-5s %-8s %4s %4s %4s %4s %7s %4s %5s %-12s %10s %8s %8s %10s  %s\n", "impl",
                "dtype", "kv", "B", "H", "KV", "D", "ctx", "BS", "q_len", "layout", "ms", "GB/s",
                "%readBW", "rel_err", "variants");
  }
  bool accurate = true;
  std::map<std::tuple<DType, int, int, int, int>, double> in_cache_rates;  // --limits
  for (DType dtype : o.dtypes) {
    for (const Shape& s : o.shapes) {
      const double bytes = kv_bytes(s, o.kv_dtype_for(dtype), o.variants.window_left);
      auto row_for = [&](const std::string& name, double ms, double err) {
        const double gbps = bytes / (ms * 1e-3) / 1e9;
        return Row{name, s, ms, gbps, 100.0 * gbps / read_bw, err};
      };
      const double tol = testing::out_tolerance(dtype);
      if (o.backend == "cuda") {
        bench::CudaTimingOptions co;
        co.contiguous = o.contiguous;
        co.graph = !o.plain;
        co.min_iterations = std::max(o.iters, 50);
        co.variants = o.variants;
        co.layout = o.layout;
        co.kv_dtype = o.kv_dtype_for(dtype);
        const bench::Timing t = bench::cuda_time_shape(s, dtype, co);
        const Row r = row_for("cuda", t.ms, t.rel_err);
        accurate = accurate && !(r.rel_err > tol);
        print_row(o, dtype, r);
        continue;
      }
      RotatingCase rc = make_rotating_case(o, dtype, s);
      double ours_ms = 0;
      if (o.backend == "cpu") {
        DecodeOptions opt;
        opt.backend = Backend::kCpu;
        opt.num_threads = o.threads;
        decode(rc.args(0), opt);
        const double err = rel_err_vs_reference(rc.args(0));
        ours_ms = median_ms([&](int i) { decode(rc.args(i), opt); }, std::max(2, rc.copies()),
                            o.iters, o.min_time, o.max_time, o.clock);
        Row r = row_for("cpu", ours_ms, err);
        if (o.limits) {
          // The in-cache rate depends on the work per (token, kv head) only: shapes sharing it
          // share one measurement.
          const auto work =
              std::make_tuple(dtype, s.heads / s.kv_heads, s.head_dim, s.block_size, s.q_len);
          auto known = in_cache_rates.find(work);
          if (known == in_cache_rates.end()) {
            known = in_cache_rates.emplace(work, in_cache_gbps(o, dtype, s)).first;
          }
          r.compute_gbps = o.threads * known->second;
          r.pattern_gbps = pattern_read_gbps(o, rc, dtype, s);
          r.read_gbps = read_bw;
        }
        accurate = accurate && !(r.rel_err > tol);
        print_row(o, dtype, r);
      }
      if (o.backend == "naive" || o.naive) {
        bench::naive_decode(rc.args(0), o.threads);
        const double err = rel_err_vs_reference(rc.args(0));
        const double naive_ms =
            median_ms([&](int i) { bench::naive_decode(rc.args(i), o.threads); }, 1,
                      o.backend == "naive" ? o.iters : 3, 0.0, o.max_time, o.clock);
        const Row r = row_for("naive", naive_ms, err);
        // The baseline is what a user would write first, not the library: its f32 sums over a
        // quarter-million tokens may drift past the tolerance. Reported, and fatal only when
        // the baseline itself is what was asked for.
        if (r.rel_err > tol) {
          std::fprintf(info, "  naive baseline rel_err %.3g exceeds the %s tolerance %.3g\n",
                       r.rel_err, dtype_name(dtype), tol);
          if (o.backend == "naive") accurate = false;
        }
        print_row(o, dtype, r);
        if (o.backend == "cpu") {
          std::fprintf(info, "  speed-up over naive: %.1fx\n", naive_ms / ours_ms);
          std::fflush(info);
        }
      }
    }
  }
  if (!accurate) {
    std::fprintf(stderr, "pagedattn-bench: a rel_err exceeds its dtype's tolerance\n");
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return cli::guarded_main("pagedattn-bench", [&] { return run(argc, argv); });
}
