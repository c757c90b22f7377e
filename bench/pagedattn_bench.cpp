// pagedattn-bench: times decode attention per shape and reports KV GB/s against the machine's
// read bandwidth measured in the same run, with the error against the f64 reference.
//
//   pagedattn-bench [--backend cpu|cuda|naive] [--dtype f32|f16|bf16[,...]]
//                   [--shape B,H,KV,D,CTX[,BS]]... [--threads N] [--csv] [--contiguous]
//                   [--iters N] [--min-time S] [--bw-mib N] [--no-naive] [--plain]
//                   [--long-first TOKENS]
//
// CPU timings rotate the inputs across enough copies of the cache that together they exceed the
// last-level cache several times, so no step is served from it. The CPU backend's shapes are also
// run through the naive baseline (naive_decode.hpp) and the speed-up is printed.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "cuda_timing.hpp"
#include "naive_decode.hpp"
#include "pagedattn/reference.hpp"
#include "random_case.hpp"
#include "read_bandwidth.hpp"

using namespace pagedattn;
using pagedattn::bench::Shape;

namespace {

// The grid: long single sequence, mid batches, MHA, GQA 8, small head dim, 256K tokens.
const Shape kDefaultShapes[] = {
    {1, 32, 8, 128, 32768, 16},  {8, 32, 8, 128, 8192, 16},  {32, 32, 8, 128, 2048, 16},
    {4, 32, 32, 128, 4096, 16},  {16, 64, 8, 128, 4096, 16}, {64, 32, 8, 64, 1024, 16},
    {1, 32, 8, 128, 262144, 16},
};

struct Options {
  std::string backend = "cpu";
  std::vector<DType> dtypes;  // --dtype, comma-separated; bf16 when not given
  std::vector<Shape> shapes;
  int threads = 0;
  bool csv = false;
  bool contiguous = false;
  bool naive = true;
  bool plain = false;      // CUDA: plain launches instead of CUDA-graph replays
  int long_first = 0;      // > 0: sequence 0 of every shape holds this many tokens
  int iters = 20;          // timed runs at least
  double min_time = 0.5;   // seconds of timed runs at least
  double max_time = 10.0;  // stop after this many seconds (at least 3 runs)
  std::size_t bw_mib = 2048;
};

[[noreturn]] void usage(const char* prog, const std::string& why) {
  std::fprintf(stderr,
               "%s\nusage: %s [--backend cpu|cuda|naive] [--dtype f32|f16|bf16[,...]]\n"
               "       [--shape B,H,KV,D,CTX[,BLOCK]]... [--threads N] [--csv] [--contiguous]\n"
               "       [--iters N] [--min-time SECONDS] [--bw-mib MIB] [--no-naive] [--plain]\n"
               "       [--long-first TOKENS]\n"
               "  --plain       CUDA: time plain launches (default: CUDA-graph replays)\n"
               "  --long-first  sequence 0 of each shape holds TOKENS tokens, the others CTX\n"
               "                (a skewed batch; the context column shows CTX)\n",
               why.c_str(), prog);
  std::exit(2);
}

Shape parse_shape(const std::string& text, const char* prog) {
  std::vector<int> v;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    const long x = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || x < 0 || x > (1L << 30)) {
      usage(prog, "--shape = '" + text + "': expected B,H,KV,D,CTX[,BLOCK] (non-negative ints)");
    }
    v.push_back(static_cast<int>(x));
  }
  if (v.size() != 5 && v.size() != 6) {
    usage(prog, "--shape = '" + text + "': expected 5 or 6 comma-separated integers");
  }
  return Shape{v[0], v[1], v[2], v[3], v[4], v.size() == 6 ? v[5] : 16};
}

Options parse(int argc, char** argv) {
  Options o;
  auto value = [&](int& i) -> std::string {
    if (i + 1 >= argc) usage(argv[0], std::string(argv[i]) + " needs a value");
    return argv[++i];
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--backend") {
      o.backend = value(i);
      if (o.backend != "cpu" && o.backend != "cuda" && o.backend != "naive") {
        usage(argv[0], "--backend = '" + o.backend + "': expected cpu, cuda or naive");
      }
    } else if (a == "--dtype") {
      std::stringstream ss(value(i));
      std::string d;
      while (std::getline(ss, d, ',')) {
        if (d == "f32") {
          o.dtypes.push_back(DType::kF32);
        } else if (d == "f16") {
          o.dtypes.push_back(DType::kF16);
        } else if (d == "bf16") {
          o.dtypes.push_back(DType::kBF16);
        } else {
          usage(argv[0], "--dtype = '" + d + "': expected f32, f16 or bf16 (or a list: f32,bf16)");
        }
      }
    } else if (a == "--shape") {
      o.shapes.push_back(parse_shape(value(i), argv[0]));
    } else if (a == "--threads") {
      o.threads = std::atoi(value(i).c_str());
      if (o.threads <= 0) usage(argv[0], "--threads must be a positive integer");
    } else if (a == "--csv") {
      o.csv = true;
    } else if (a == "--contiguous") {
      o.contiguous = true;
    } else if (a == "--no-naive") {
      o.naive = false;
    } else if (a == "--iters") {
      o.iters = std::max(1, std::atoi(value(i).c_str()));
    } else if (a == "--min-time") {
      o.min_time = std::atof(value(i).c_str());
    } else if (a == "--bw-mib") {
      o.bw_mib = static_cast<std::size_t>(std::max(1, std::atoi(value(i).c_str())));
    } else if (a == "--plain") {
      o.plain = true;
    } else if (a == "--long-first") {
      const std::string v = value(i);
      char* end = nullptr;
      const long x = std::strtol(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || x <= 0 || x > (1L << 30)) {
        usage(argv[0], "--long-first = '" + v + "': expected a positive token count");
      }
      o.long_first = static_cast<int>(x);
    } else if (a == "--help" || a == "-h") {
      usage(argv[0], "pagedattn-bench: decode attention GB/s against the read bandwidth");
    } else {
      usage(argv[0], "unknown argument '" + a + "'");
    }
  }
  if (o.shapes.empty()) o.shapes.assign(std::begin(kDefaultShapes), std::end(kDefaultShapes));
  for (Shape& s : o.shapes) s.long_first = o.long_first;
  if (o.threads == 0) o.threads = omp_get_max_threads();
  if (o.dtypes.empty()) o.dtypes.push_back(DType::kBF16);
  return o;
}

// Bytes of K and V one decode step must read: every sequence's tokens, each kv head, once.
double kv_bytes(const Shape& s, DType t) {
  return 2.0 * s.total_tokens() * s.kv_heads * s.head_dim * static_cast<double>(dtype_size(t));
}

// Median wall time (ms) of fn(i) for i = 0, 1, ... after `warmup` untimed calls.
double median_ms(const std::function<void(int)>& fn, int warmup, int min_iters, double min_time,
                 double max_time) {
  for (int i = 0; i < warmup; ++i) fn(i);
  std::vector<double> ms;
  const auto start = std::chrono::steady_clock::now();
  for (int i = warmup;; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn(i);
    const auto t1 = std::chrono::steady_clock::now();
    ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    const double total = std::chrono::duration<double>(t1 - start).count();
    const int n = static_cast<int>(ms.size());
    if ((n >= min_iters && total >= min_time) || (n >= 3 && total >= max_time)) break;
  }
  std::sort(ms.begin(), ms.end());
  const std::size_t n = ms.size();
  return n % 2 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]);
}

// rel_err = max |out - ref| / max |ref| over the first sequences whose reference is quick to
// compute (the whole batch on the default grid); NaN when even one sequence is too large.
double rel_err_vs_reference(const DecodeArgs& args) {
  constexpr double kMaxTokenHeads = 8.0 * 1024 * 1024;
  DecodeArgs sub = args;
  sub.batch = 0;
  double work = 0;
  for (int b = 0; b < args.batch; ++b) {
    work += static_cast<double>(args.context_lens[b]) * args.num_kv_heads;
    if (work > kMaxTokenHeads && sub.batch > 0) break;
    sub.batch = b + 1;
  }
  if (work > kMaxTokenHeads * 2 && sub.batch == 1) return std::nan("");
  const ReferenceResult ref = reference_decode(sub);
  double scale = 1e-30, err = 0;
  for (std::size_t i = 0; i < ref.out.size(); ++i) {
    const double got = load_as_float(args.out, args.out_dtype, i);
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
};

void print_row(const Options& o, DType dtype, const Row& r) {
  const Shape& s = r.shape;
  if (o.csv) {
    std::printf("%s,%s,%d,%d,%d,%d,%d,%d,%.4f,%.2f,%.1f,%.3g\n", r.backend.c_str(),
                dtype_name(dtype), s.batch, s.heads, s.kv_heads, s.head_dim, s.context,
                s.block_size, r.ms, r.gbps, r.pct, r.rel_err);
  } else {
    std::printf("%-6s %-5s %4d %4d %4d %4d %7d %4d %10.3f %8.2f %7.1f%% %10.3g\n",
                r.backend.c_str(), dtype_name(dtype), s.batch, s.heads, s.kv_heads, s.head_dim,
                s.context, s.block_size, r.ms, r.gbps, r.pct, r.rel_err);
  }
  std::fflush(stdout);
}

// A case of `shape` plus extra copies of its cache, so consecutive steps read different memory.
struct RotatingCase {
  testkit::HostCase base;
  std::vector<std::vector<std::uint8_t>> k_copies, v_copies;
  int copies() const { return 1 + static_cast<int>(k_copies.size()); }
  DecodeArgs args(int i) {
    DecodeArgs a = base.args();
    const int c = i % copies();
    if (c > 0) {
      a.k_cache = k_copies[c - 1].data();
      a.v_cache = v_copies[c - 1].data();
    }
    return a;
  }
};

RotatingCase make_rotating_case(const Options& o, DType dtype, const Shape& s) {
  testkit::CaseSpec spec;
  spec.batch = s.batch;
  spec.num_heads = s.heads;
  spec.num_kv_heads = s.kv_heads;
  spec.head_dim = s.head_dim;
  spec.block_size = s.block_size;
  spec.context_lens.resize(s.batch);
  for (int b = 0; b < s.batch; ++b) spec.context_lens[b] = s.context_of(b);
  spec.q_dtype = spec.kv_dtype = spec.out_dtype = dtype;
  spec.fragmented = !o.contiguous;
  spec.seed = 20261129u + static_cast<std::uint64_t>(s.batch) * 131 + s.context;
  RotatingCase rc{testkit::make_case(spec), {}, {}};
  const double cache_bytes = static_cast<double>(rc.base.k.size() + rc.base.v.size());
  const double want = 4.0 * static_cast<double>(bench::last_level_cache_bytes());
  const int copies = std::min(64, static_cast<int>(std::ceil(want / std::max(cache_bytes, 1.0))));
  for (int c = 1; c < copies; ++c) {
    rc.k_copies.push_back(rc.base.k);
    rc.v_copies.push_back(rc.base.v);
  }
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  FILE* info = o.csv ? stderr : stdout;  // the CSV on stdout stays machine-readable
  try {
    double read_bw = 0;
    if (o.backend == "cuda") {
      read_bw = bench::cuda_read_ceiling_gbps();
      std::fprintf(info, "GPU read bandwidth: %.1f GB/s\n", read_bw);
    } else {
      read_bw = bench::measure_read_bandwidth_gbps(o.bw_mib << 20, o.threads);
      std::fprintf(info, "read bandwidth: %.2f GB/s (%d threads, %zu MiB streamed per pass)\n",
                   read_bw, o.threads, o.bw_mib);
    }
    std::fflush(info);
    if (o.csv) {
      std::printf(
          "backend,dtype,batch,heads,kv_heads,head_dim,context,block_size,ms,gbps,"
          "pct_read_bw,rel_err\n");
    } else {
      std::printf("%-6s %-5s %4s %4s %4s %4s %7s %4s %10s %8s %8s %10s\n", "impl", "dtype", "B",
                  "H", "KV", "D", "ctx", "BS", "ms", "GB/s", "%readBW", "rel_err");
    }
    bool accurate = true;
    for (DType dtype : o.dtypes) {
      for (const Shape& s : o.shapes) {
        const double bytes = kv_bytes(s, dtype);
        auto row_for = [&](const std::string& name, double ms, double err) {
          const double gbps = bytes / (ms * 1e-3) / 1e9;
          return Row{name, s, ms, gbps, 100.0 * gbps / read_bw, err};
        };
        const double tol = testkit::out_tolerance(dtype);
        if (o.backend == "cuda") {
          bench::CudaTimingOptions co;
          co.contiguous = o.contiguous;
          co.graph = !o.plain;
          co.min_iterations = std::max(o.iters, 50);
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
                              o.iters, o.min_time, o.max_time);
          const Row r = row_for("cpu", ours_ms, err);
          accurate = accurate && !(r.rel_err > tol);
          print_row(o, dtype, r);
        }
        if (o.backend == "naive" || o.naive) {
          bench::naive_decode(rc.args(0), o.threads);
          const double err = rel_err_vs_reference(rc.args(0));
          const double naive_ms =
              median_ms([&](int i) { bench::naive_decode(rc.args(i), o.threads); }, 1,
                        o.backend == "naive" ? o.iters : 3, 0.0, o.max_time);
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
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}
