#include "sim/report.hpp"

#include <algorithm>
#include <cstdio>

#include "pagedattn/testing/host_pool.hpp"
#include "pagedattn/testing/tolerance.hpp"

namespace pagedattn::sim {
namespace {

constexpr double kMiB = 1048576.0;

std::string layer_list(const std::vector<LayerTiming>& layers) {
  std::string s;
  for (const LayerTiming& l : layers) {
    s += (s.empty() ? "" : ", ") + std::to_string(l.layer) + (l.window_left >= 0 ? "w" : "");
  }
  return s;
}

// Occupancy and fragmentation at each tenth of the run (the step ending it).
void print_timeline(const RunStats& s) {
  if (s.occupancy.empty()) return;
  std::printf("cache over time (occupancy/fragmentation at each tenth of the steps):");
  for (int i = 1; i <= 10; ++i) {
    const std::size_t at = std::min(s.occupancy.size() - 1, s.occupancy.size() * i / 10);
    std::printf(" %.0f/%.0f%%", 100.0 * s.occupancy[at], 100.0 * s.fragmentation[at]);
  }
  std::printf("\n");
}

}  // namespace

void weigh_layers(const Model& model, std::vector<LayerTiming>& layers) {
  for (LayerTiming& l : layers) {
    const bool sliding = l.window_left >= 0;
    int sampled = 0;
    for (const LayerTiming& o : layers) sampled += (o.window_left >= 0) == sliding ? 1 : 0;
    const int in_model = sliding ? model.sliding_layers() : model.layers - model.sliding_layers();
    l.weight = static_cast<double>(in_model) / sampled;
  }
}

void print_setup(const Options& o, const RunStats& s) {
  const Model& m = o.model;
  std::printf("model: %s\n       (%s)\n", m.describe().c_str(), m.source.c_str());
  std::printf("simulated: %zu of %d layers (%s%s)%s, backend %s, %s\n", s.layers.size(), m.layers,
              layer_list(s.layers).c_str(), m.sliding_layers() ? "; w: sliding window" : "",
              static_cast<int>(s.layers.size()) < m.layers ? ", the rest extrapolated" : "",
              backend_name(s.backend), dtype_name(o.dtype));
  if (s.plan.budget_bytes > 0) {
    std::printf("cache: %.0f MiB for all %d layers (%s)%s: ", s.plan.budget_bytes / kMiB, m.layers,
                s.plan.budget_source.c_str(),
                s.plan.raised ? ", raised to hold the longest request" : "");
  } else {
    std::printf("cache: %s: ", s.plan.budget_source.c_str());
  }
  std::printf("%d blocks x %d tokens per layer = %lld tokens; %.1f MiB allocated (%s)\n",
              s.plan.num_blocks, o.block_size,
              static_cast<long long>(s.plan.num_blocks) * o.block_size, s.allocated_bytes / kMiB,
              o.shared_cache ? "one cache shared by the simulated layers" : "simulated layers");
  if (s.huge_pct >= 0) {
    std::printf(
        "huge pages: %.0f%% of the cache's bytes (MADV_HUGEPAGE; transparent huge pages: %s)\n",
        s.huge_pct, testing::thp_mode_name(testing::thp_mode()));
  }
  std::printf(
      "workload: %s: %d requests, Poisson %.3g per step, prompt %s, output %s, %d system prompts "
      "of %d tokens (p %.3g), n-way %d (p %.3g), fork p %.3g, max batch %d, seed %llu\n",
      o.workload.c_str(), o.requests, o.rate, o.prompt_len.text().c_str(),
      o.output_len.text().c_str(), o.system_prompts, o.system_len, o.system_prob, o.n_way,
      o.n_way_prob, o.fork_prob, o.max_batch, static_cast<unsigned long long>(o.seed));
  std::printf("read ceiling: %.1f GB/s (%s streaming read, measured in this run)\n", s.ceiling_gbps,
              s.backend == Backend::kCuda ? "device" : "host");
  std::fflush(stdout);
}

void print_summary(const Options& o, const RunStats& s) {
  const double steps = static_cast<double>(std::max(1LL, s.steps));
  std::printf(
      "steps %lld, generated tokens %lld (+ %lld prompt tokens written, %lld of system prompts "
      "shared) in %.2f s: %.0f tokens/s\n",
      s.steps, s.generated, s.prompt_tokens, s.system_tokens, s.wall_seconds,
      s.generated / s.wall_seconds);
  double seconds = 0, bytes = 0, model_seconds = 0, distinct_bytes = 0, shared_bytes = 0;
  for (const LayerTiming& l : s.layers) {
    seconds += l.seconds;
    bytes += l.bytes;
    distinct_bytes += l.distinct_bytes;
    shared_bytes += l.shared_bytes;
    model_seconds += l.weight * l.seconds;
  }
  std::printf(
      "attention per step: %.3f ms over the %zu simulated layers, %.3f ms for all %d layers "
      "(estimated)\n",
      1e3 * seconds / steps, s.layers.size(), 1e3 * model_seconds / steps, o.model.layers);
  const double gbps = seconds > 0 ? bytes / seconds / 1e9 : 0.0;
  const char* kv = o.model.mla() ? "latent cache" : "K/V";  // what decode reads
  std::printf(
      "attention: %.2f GB of %s read (%.1f MB per step) in %.2f s: %.2f GB/s, %.0f%% of the read "
      "ceiling\n",
      bytes / 1e9, kv, bytes / steps / 1e6, seconds, gbps,
      s.ceiling_gbps > 0 ? 100 * gbps / s.ceiling_gbps : 0.0);
  // Forked sequences hold the same blocks; decode reads them once per sequence.
  std::printf(
      "shared blocks: %.1f per step read by two or more sequences; with each block read once, "
      "%.2f GB of %s (%.1f%% less)\n",
      s.shared_block_reads / steps, distinct_bytes / 1e9, kv,
      bytes > 0 ? 100.0 * (1.0 - distinct_bytes / bytes) : 0.0);
  // What a decode with shared prefixes reads: each group's shared tokens once (the decode above
  // ran with --share-prefixes as given; bytes above count every sequence's tokens either way).
  std::printf(
      "K/V per step over the simulated layers: %.2f MB without sharing, %.2f MB with shared "
      "prefixes (%.2fx fewer; share_prefixes %s, %s backend)\n",
      bytes / steps / 1e6, shared_bytes / steps / 1e6,
      shared_bytes > 0 ? bytes / shared_bytes : 1.0, o.share_prefixes ? "on" : "off",
      backend_name(s.backend));
  if (s.naive_seconds > 0) {
    std::printf(
        "naive decode (--compare naive): %.3f ms per step over the simulated layers, %.2f GB/s; "
        "pagedattn's decode is %.1fx faster\n",
        1e3 * s.naive_seconds / steps, bytes / s.naive_seconds / 1e9,
        seconds > 0 ? s.naive_seconds / seconds : 0.0);
  }
  // The ceiling is a streaming read of memory; a cache small enough to stay in the processor's
  // caches between steps is read faster than that.
  if (s.ceiling_gbps > 0 && gbps > s.ceiling_gbps) {
    std::printf(
        "           (above the streaming read: the %.0f MiB of simulated %s largely stay in the "
        "processor's caches between steps; --cache-mib sizes the cache)\n",
        s.allocated_bytes / kMiB, kv);
  }
  std::printf(
      "sequences: peak batch %d, forks %lld (n-way %lld), copy-on-write block copies %lld, "
      "preemptions %lld\n",
      s.peak_running, s.forks, s.n_way_forks, s.cow_copies, s.preemptions);
  double frag = 0;
  for (const float f : s.fragmentation) frag += f;
  print_timeline(s);
  std::printf(
      "cache: peak occupancy %.1f%% (%d of %d blocks), mean fragmentation %.1f%% "
      "(unused slots of used blocks), all blocks free at the end: %s\n",
      100.0 * s.peak_used / std::max(1, s.plan.num_blocks), s.peak_used, s.plan.num_blocks,
      100.0 * frag / steps, s.all_free ? "yes" : "NO");
  if (s.verified == 0) {
    std::printf("verify: no step sampled (--verify-every 0)\n");
  } else {
    std::printf(
        "verify: %d sampled steps (%lld sequences) against the f64 reference, max rel err %.3g "
        "(tolerance %.3g), max lse err %.3g: %s\n",
        s.verified, s.verified_seqs, s.worst_rel, testing::out_tolerance(o.dtype), s.worst_lse,
        s.mismatches ? "MISMATCH" : "OK");
  }
}

void Progress::update(int done, long long steps, bool force) {
  if (!on_) return;
  const double now = std::chrono::duration<double>(Clock::now() - start_).count();
  if (!force && now - last_ < 0.1) return;
  last_ = now;
  constexpr int kWidth = 30;
  const int fill = total_ ? done * kWidth / total_ : kWidth;
  std::fprintf(stderr, "\r[%.*s%*s] %3d%% %d/%d requests, %lld steps, %.1f s", fill,
               "##############################", kWidth - fill, "",
               total_ ? done * 100 / total_ : 100, done, total_, steps, now);
  std::fflush(stderr);
}

void Progress::finish(int done, long long steps) {
  update(done, steps, true);
  if (on_) std::fputc('\n', stderr);
}

}  // namespace pagedattn::sim
