// pagedattn-cp-bench: context-parallel decode of one long sequence. For each context length, one
// decode step on one device holding the whole context, then on a group of ranks each holding a
// contiguous range of its blocks (context_parallel_decode): the time per step, the speed-up, the
// bytes each rank exchanges, and the error of the group's result against the single device's.
// On CUDA one thread drives each GPU over NCCL; on the CPU the ranks are threads of the
// in-process group.
#include <omp.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cp_timing.hpp"
#include "cuda_timing.hpp"
#include "pagedattn/cli/args.hpp"
#include "pagedattn/context_parallel.hpp"
#include "pagedattn/testing/tolerance.hpp"
#include "pagedattn/validate.hpp"
#include "read_bandwidth.hpp"
#if PAGEDATTN_BENCH_WITH_NCCL
#include "pagedattn/nccl_communicator.hpp"
#endif

namespace pagedattn {
namespace {

constexpr int kMaxTokens = 1 << 30;
constexpr int kMaxRanks = 64;

struct Options {
  bool help = false;
  std::string backend = "auto";
  std::vector<int> gpus;  // empty: every visible GPU
  int ranks = 2;          // CPU
  std::vector<int> contexts;
  bench::CpShape shape;
  bench::CpTimingOptions timing;
  bool csv = false;
};

void print_help(const char* prog) {
  std::printf(
      "usage: %s [flags]\n"
      "Times one decode step of a batch-1 sequence on one device holding its whole context, and\n"
      "over a group of ranks each holding a contiguous range of its blocks\n"
      "(context_parallel_decode): time per step, speed-up, bytes exchanged, and the group's\n"
      "error against the single device (exit 1 when it exceeds the dtype's tolerance).\n"
      "CUDA: one thread per GPU over NCCL; NCCL_NVLS_ENABLE is set to 0 unless already set\n"
      "(NVLink multicast stays off). CPU: the ranks are threads of the in-process group.\n\n"
      "  --backend B        auto, cpu or cuda (default auto: cuda when a GPU is visible)\n"
      "  --gpus LIST        CUDA: the GPUs of the group, e.g. 0,1 (default: every visible GPU);\n"
      "                     the single-device run uses the first\n"
      "  --ranks N          CPU: ranks (threads), 1 to %d (default 2)\n"
      "  --contexts LIST    context lengths in tokens, 1 to %d each (default CUDA\n"
      "                     131072,262144,524288,1048576; CPU 16384,65536)\n"
      "  --heads N          query heads (default 32)\n"
      "  --kv-heads N       kv heads (default 8)\n"
      "  --head-dim N       head dim, one of the supported (default 128)\n"
      "  --block-size N     tokens per block, 1 to %d (default 16)\n"
      "  --dtype T          f32, f16 or bf16 for q, cache and out (default bf16)\n"
      "  --root R           -1: every rank gets the result (all-gather, the default); R >= 0:\n"
      "                     only rank R (gather)\n"
      "  --steps N          steps per timed sample, 1 to 1000 (default 10; CUDA: one graph)\n"
      "  --samples N        timed samples, the median counts, 1 to 1000 (default 10)\n"
      "  --threads N        CPU: threads in all, shared out among the ranks, 1 to %d\n"
      "  --csv              CSV on stdout (the bandwidth line goes to stderr)\n"
      "  --help, -h         this text\n",
      prog, kMaxRanks, kMaxTokens, kMaxBlockSize, kMaxThreads);
}

std::vector<int> int_list(cli::Args& args, long long lo, long long hi) {
  const std::string flag = args.flag(), text = args.value();
  std::vector<int> out;
  for (const std::string& item : cli::split_list(flag, text)) {
    try {
      out.push_back(static_cast<int>(cli::parse_int(flag, item, lo, hi)));
    } catch (const cli::UsageError&) {
      cli::bad_value(flag, text,
                     "'" + item + "' is not an integer in [" + std::to_string(lo) + ", " +
                         std::to_string(hi) + "]");
    }
  }
  return out;
}

Options parse(int argc, char** argv) {
  Options o;
  cli::Args args(argc, argv);
  while (args.next()) {
    if (args.is_help()) {
      o.help = true;
    } else if (args.is("--backend")) {
      o.backend = args.choice<std::string>({{"auto", "auto"}, {"cpu", "cpu"}, {"cuda", "cuda"}});
    } else if (args.is("--gpus")) {
      o.gpus = int_list(args, 0, 1023);
    } else if (args.is("--ranks")) {
      o.ranks = static_cast<int>(args.integer(1, kMaxRanks));
    } else if (args.is("--contexts")) {
      o.contexts = int_list(args, 1, kMaxTokens);
    } else if (args.is("--heads")) {
      o.shape.heads = static_cast<int>(args.integer(1, 1 << 16));
    } else if (args.is("--kv-heads")) {
      o.shape.kv_heads = static_cast<int>(args.integer(1, 1 << 16));
    } else if (args.is("--head-dim")) {
      o.shape.head_dim = static_cast<int>(args.integer(1, 1 << 16));
    } else if (args.is("--block-size")) {
      o.shape.block_size = static_cast<int>(args.integer(1, kMaxBlockSize));
    } else if (args.is("--dtype")) {
      o.shape.dtype =
          args.choice<DType>({{"f32", DType::kF32}, {"f16", DType::kF16}, {"bf16", DType::kBF16}});
    } else if (args.is("--root")) {
      o.timing.root = static_cast<int>(args.integer(-1, kMaxRanks - 1));
    } else if (args.is("--steps")) {
      o.timing.steps_per_sample = static_cast<int>(args.integer(1, 1000));
    } else if (args.is("--samples")) {
      o.timing.samples = static_cast<int>(args.integer(1, 1000));
    } else if (args.is("--threads")) {
      o.timing.cpu_threads = static_cast<int>(args.integer(1, kMaxThreads));
    } else if (args.is("--csv")) {
      o.csv = true;
    } else {
      args.unknown();
    }
  }
  if (o.help) return o;
  if (o.backend == "auto") o.backend = bench::cuda_device_count() > 0 ? "cuda" : "cpu";
  if (o.contexts.empty()) {
    o.contexts = o.backend == "cuda" ? std::vector<int>{131072, 262144, 524288, 1048576}
                                     : std::vector<int>{16384, 65536};
  }
  // The shape checks of decode(), before anything is measured.
  DecodeArgs a;
  a.num_heads = o.shape.heads;
  a.num_kv_heads = o.shape.kv_heads;
  a.head_dim = o.shape.head_dim;
  a.block_size = o.shape.block_size;
  try {
    validate_shapes(a, false);
  } catch (const Error& e) {
    const std::string reason = std::string(e.what()).substr(std::strlen("pagedattn: "));
    if (e.argument() == "num_kv_heads" || e.argument() == "group_size") {
      cli::bad_value("--kv-heads", std::to_string(o.shape.kv_heads), reason);
    } else if (e.argument() == "num_heads") {
      cli::bad_value("--heads", std::to_string(o.shape.heads), reason);
    } else if (e.argument() == "head_dim") {
      cli::bad_value("--head-dim", std::to_string(o.shape.head_dim), reason);
    }
    cli::bad_value("--block-size", std::to_string(o.shape.block_size), reason);
  }
  if (o.backend == "cuda") {
    const int visible = bench::cuda_device_count();
    if (visible == 0) throw cli::UsageError("--backend", "cuda", "no CUDA device is visible");
    if (o.gpus.empty()) {
      for (int d = 0; d < visible; ++d) o.gpus.push_back(d);
    }
    for (int d : o.gpus) {
      if (d >= visible) {
        cli::bad_value("--gpus", std::to_string(d),
                       "only " + std::to_string(visible) + " GPUs are visible");
      }
    }
#if !PAGEDATTN_BENCH_WITH_NCCL
    throw cli::UsageError("--backend", "cuda",
                          "this build has no NCCL communicator (configure with "
                          "-DPAGEDATTN_NCCL=ON and NCCL installed)");
#endif
  }
  const int ranks = o.backend == "cuda" ? static_cast<int>(o.gpus.size()) : o.ranks;
  if (o.timing.root >= ranks) {
    cli::bad_value("--root", std::to_string(o.timing.root),
                   "the group has " + std::to_string(ranks) + " ranks");
  }
  return o;
}

int run(int argc, char** argv) {
  const Options o = parse(argc, argv);
  if (o.help) {
    print_help(argv[0]);
    return 0;
  }
  std::FILE* info = o.csv ? stderr : stdout;
  std::vector<std::unique_ptr<Communicator>> group;
  double read_bw = 0;
  if (o.backend == "cuda") {
#if PAGEDATTN_BENCH_WITH_NCCL
    setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
    group = make_nccl_group(o.gpus);
    std::fprintf(info, "NCCL %s, NCCL_NVLS_ENABLE=%s, %zu GPUs\n", nccl_version().c_str(),
                 std::getenv("NCCL_NVLS_ENABLE"), o.gpus.size());
#endif
    read_bw = bench::cuda_read_ceiling_gbps();
    std::fprintf(info, "GPU read bandwidth (GPU %d): %.1f GB/s\n", o.gpus[0], read_bw);
  } else {
    group = make_local_group(o.ranks);
    const int threads = o.timing.cpu_threads > 0 ? o.timing.cpu_threads : omp_get_max_threads();
    read_bw = bench::measure_read_bandwidth_gbps(std::size_t(1) << 30, threads);
    std::fprintf(info, "read bandwidth: %.2f GB/s\n", read_bw);
  }
  std::fflush(info);
  std::vector<Communicator*> comms;
  for (auto& c : group) comms.push_back(c.get());
  const int ranks = static_cast<int>(comms.size());
  if (o.csv) {
    std::printf(
        "backend,dtype,heads,kv_heads,head_dim,block_size,context,ranks,exchange,single_ms,"
        "group_ms,speedup,group_over_single,single_gbps,single_pct_read_bw,state_bytes,"
        "recv_bytes,rel_err,lse_err\n");
  } else {
    std::printf("%-5s %8s %5s %10s %10s %8s %9s %8s %8s %10s %10s\n", "impl", "context", "ranks",
                "single_ms", "group_ms", "speedup", "group/one", "GB/s", "%readBW", "recv_B",
                "rel_err");
  }
  const double tol = testing::out_tolerance(o.shape.dtype);
  bool accurate = true;
  for (int context : o.contexts) {
    bench::CpShape s = o.shape;
    s.context = context;
    const bench::CpRow r = o.backend == "cuda" ? bench::time_cuda(s, comms, o.gpus, o.timing)
                                               : bench::time_cpu(s, comms, o.timing);
    const double gbps = r.kv_bytes / (r.single_ms * 1e-3) / 1e9;
    // What a rank receives: every other rank's states (all-gather), or the root's share of a
    // gather.
    const double recv = r.state_bytes * (ranks - 1);
    const char* exchange = o.timing.root < 0 ? "all_gather" : "gather";
    if (o.csv) {
      std::printf("%s,%s,%d,%d,%d,%d,%d,%d,%s,%.5f,%.5f,%.3f,%.3f,%.1f,%.1f,%.0f,%.0f,%.3g,%.3g\n",
                  o.backend.c_str(), dtype_name(s.dtype), s.heads, s.kv_heads, s.head_dim,
                  s.block_size, context, ranks, exchange, r.single_ms, r.group_ms,
                  r.single_ms / r.group_ms, r.group_ms / r.single_ms, gbps, 100 * gbps / read_bw,
                  r.state_bytes, recv, r.rel_err, r.lse_err);
    } else {
      std::printf("%-5s %8d %5d %10.4f %10.4f %8.2f %9.3f %8.1f %8.1f %10.0f %10.3g\n",
                  o.backend.c_str(), context, ranks, r.single_ms, r.group_ms,
                  r.single_ms / r.group_ms, r.group_ms / r.single_ms, gbps, 100 * gbps / read_bw,
                  recv, r.rel_err);
    }
    std::fflush(stdout);
    if (!(r.rel_err <= tol) || !(r.lse_err <= testing::lse_tolerance())) accurate = false;
  }
  if (!accurate) {
    std::fprintf(stderr,
                 "pagedattn-cp-bench: the group's result is off the single device's by "
                 "more than the dtype's tolerance\n");
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace pagedattn

int main(int argc, char** argv) {
  return pagedattn::cli::guarded_main("pagedattn-cp-bench",
                                      [&] { return pagedattn::run(argc, argv); });
}
