// pagedattn-bench: times decode attention per shape and reports KV GB/s against the machine's
// read bandwidth measured in the same run, with the error against the f64 reference.
//
//   pagedattn-bench [--backend cpu|cuda|naive] [--dtype f32|f16|bf16[,...]]
//                   [--shape B,H,KV,D,CTX[,BS]]... [--threads N] [--csv] [--contiguous]
//                   [--iters N] [--min-time S] [--bw-mib N] [--no-naive] [--plain]
//                   [--long-first TOKENS] [--window N] [--soft-cap X] [--alibi] [--sinks]
//                   [--q-len N [--tree-mask]] [--layout hnd|nhd|combined_nhd]
//                   [--kv-dtype f32|f16|bf16|fp8_e4m3|fp8_e5m2|int8|int4] [--limits] [--huge-pages
//                   on|off] [--share N,PREFIX]
//
// Every flag is parsed strictly (bench_options.cpp) and every shape checked before anything is
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
// --tree-mask (with --q-len N, N >= 2) gives each sequence's N query tokens a tree mask
// (DecodeArgs::tree_mask): a random token tree per sequence from a fixed seed
// (bench::random_tree_masks), each token attending the context before the N and itself and its
// ancestors. The CPU backend then runs each query token as a decode of its own, reading its
// context again; GB/s keeps --q-len's definition (each sequence's K/V once), so a tree row and
// the causal row of the same shape compare by time; the CUDA backend reads a sequence's context
// once for all its query tokens, tree or not. The CSV's last column, tree, says whether the row
// had them. With a tree mask the CUDA row's rel_err is NaN where sequence 0's query tokens alone
// exceed the reference's budget.
//
// --layout puts K and V where a serving engine keeps them (DecodeArgs::kv_strides): hnd, the
// default dense [blocks][kv heads][block_size][head_dim] tensors; nhd, [blocks][block_size]
// [kv heads][head_dim]; combined_nhd, one tensor holding each block's K then its V. The bytes a
// step must read are the same K and V bytes in every layout, and so is GB/s's numerator.
//
// --kv-dtype stores the caches in another dtype than q and out (by default the same), fp8 among
// them (scaled by kFp8KvScale, cuda_timing.hpp). GB/s and %readBW count the bytes of the caches'
// own dtype: an fp8 step must read half the bytes of a bf16 one.
//
// --share N,PREFIX makes each run of N sequences the samples of one prompt, forked after PREFIX
// tokens (testing::CaseSpec::fork_members), and times each shape with shared prefixes off (row
// cpu) and on (row shared); GB/s counts every sequence's attended K/V in both, so the rows
// compare by time, and a line gives the speed-up and the bytes each reads.
//
// The CPU rows' caches live in 2 MiB-aligned pools (testing::HostPool) with transparent huge
// pages asked for, or refused with --huge-pages off; the huge_pct column says how much of them
// the kernel backed with huge pages. --limits reads each shape's blocks in decode's order once on
// 4 KiB pages and once on huge pages, whichever the decode used.

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

#include "bench_options.hpp"
#include "bench_variants.hpp"
#include "cuda_timing.hpp"
#include "median.hpp"
#include "mla_rows.hpp"
#include "pagedattn/cli/args.hpp"
#include "pagedattn/reference.hpp"
#include "pagedattn/shared_blocks.hpp"
#include "pagedattn/testing/host_pool.hpp"
#include "pagedattn/testing/kv_layouts.hpp"
#include "pagedattn/testing/naive_decode.hpp"
#include "pagedattn/testing/random_case.hpp"
#include "pagedattn/validate.hpp"
#include "pagedattn/variants.hpp"
#include "read_bandwidth.hpp"
#include "rotation.hpp"

using namespace pagedattn;
using pagedattn::bench::median_ms;
using pagedattn::bench::Options;
using pagedattn::bench::Shape;
using pagedattn::testing::HostPool;
using pagedattn::testing::HugePages;

namespace {

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
// caches' dtype t, with a row's scales (4 bytes with per-token scales; an int4 row's half-byte
// codes and 4 bytes for each group of 32).
double kv_bytes(const Shape& s, DType t, int window_left, bool token_scales = false) {
  const double scales = t == DType::kInt4 ? 4.0 * token_scales_per_row(t, s.head_dim)
                        : token_scales    ? 4
                                          : 0;
  const double row = static_cast<double>(dtype_bytes(t, s.head_dim)) + scales;
  return 2.0 * attended_tokens(s, window_left) * s.kv_heads * row;
}

// rel_err = max |out - ref| / max |ref| over the first sequences whose reference is quick to
// compute (the whole batch on the default grid). The reference attends each query token over
// its own context, so with several query tokens a sequence costs that many. When sequence 0's
// query tokens alone are too many, only its last m are checked (they attend exactly as the m
// query tokens of a sequence with m would); NaN when even one is too large, or when a tree mask
// is set (the last m would take their ancestors among the others for context, attended whatever
// the mask says). The reference takes the tree mask as decode does.
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
    if (m < 1 || args.tree_mask) return std::nan("");
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
  double compute_gbps = 0;       // --limits: the compute bound (0: not measured)
  double pattern_gbps = 0;       // --limits: the pattern read on 4 KiB pages (pattern_read_gbps)
  double pattern_huge_gbps = 0;  // --limits: the same on huge pages
  double read_gbps = 0;          // the read bandwidth of the run
  double huge_pct = -1;          // % of the K/V pools on huge pages (< 0: device memory)
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

// The text table's cache column: the dtype, "+ts" with per-token scales.
std::string kv_text(const Options& o, DType kv) {
  return std::string(dtype_name(kv)) + (o.token_scales ? "+ts" : "");
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
      std::printf(",%.2f,%.2f,%.1f,%s,%.2f", r.compute_gbps, r.pattern_gbps,
                  100.0 * r.gbps / bound_gbps(r), bound_name(r), r.pattern_huge_gbps);
    } else if (o.limits) {
      std::printf(",,,,,");
    }
    if (r.huge_pct >= 0) {
      std::printf(",%.1f", r.huge_pct);
    } else {
      std::printf(",");
    }
    std::printf(",%d,%d,%d\n", o.tree_mask ? 1 : 0, o.token_scales ? 1 : 0,
                o.batch_invariant ? 1 : 0);
  } else {
    char huge[16] = "-";
    if (r.huge_pct >= 0) std::snprintf(huge, sizeof huge, "%.1f%%", r.huge_pct);
    std::printf(
        "%-6s %-5s %-8s %4d %4d %4d %4d %7d %4d %5d %4d %-12s %10.3f %8.2f %7.1f%% %10.3g %6s  "
        "%s\n",
        r.backend.c_str(), dtype_name(dtype), kv_text(o, kv).c_str(), s.batch, s.heads, s.kv_heads,
        s.head_dim, s.context, s.block_size, s.q_len, o.tree_mask ? 1 : 0,
        testing::kv_layout_name(o.layout), r.ms, r.gbps, r.pct, r.rel_err, huge,
        variants_text(v).c_str());
    if (limits) {
      std::printf(
          "       bound: %s, %.2f GB/s (compute %.2f = %d threads x %.2f in cache; read "
          "%.2f): %.1f%% of it; pattern read %.2f GB/s on 4 KiB pages, %.2f on huge pages\n",
          bound_name(r), bound_gbps(r), r.compute_gbps, o.threads, r.compute_gbps / o.threads,
          r.read_gbps, 100.0 * r.gbps / bound_gbps(r), r.pattern_gbps, r.pattern_huge_gbps);
    }
  }
  std::fflush(stdout);
}

// One copy of a cache: its K and V pools (V's empty when the layout keeps both in one buffer).
struct KvPools {
  HostPool k, v;
};

// A pool with `pages` holding a copy of the n bytes at `from` (written here, so its pages are
// faulted in now, not in the timed runs).
HostPool pool_copy(const std::uint8_t* from, std::size_t n, HugePages pages) {
  HostPool pool(n, pages);
  if (n) std::memcpy(pool.data(), from, n);
  return pool;
}

// A case of `shape` with copies of its cache in pools, so consecutive steps read different
// memory, and the attention variants every step applies. With q_len > 1 every sequence has q_len
// query tokens: q, out and lse have a row per token (q_rows, out_rows, lse_rows replace the base
// case's), with --tree-mask under the tree masks `tree`. Base's own K and V are dropped once
// copied; in a layout other than hnd every copy holds them in that layout, whose strides `laid`
// keeps.
struct RotatingCase {
  testing::HostCase base;
  std::optional<testing::KvStorage> laid;  // the layout's geometry (its buffers dropped)
  std::vector<KvPools> pools;
  bench::Variants variants;
  bench::VariantValues values;
  int q_len = 1;
  std::vector<std::int32_t> q_indptr;
  std::vector<std::uint8_t> q_rows, out_rows;
  std::vector<float> lse_rows;
  std::optional<bench::TreeMasks> tree;  // --tree-mask
  int copies() const { return static_cast<int>(pools.size()); }
  DecodeArgs args(int i) { return args_over(pools, i); }
  // The arguments of step i over the copies of `over` (these pools or their twins).
  DecodeArgs args_over(const std::vector<KvPools>& over, int i) {
    DecodeArgs a = base.args();
    bench::apply_variants(variants, values.slopes.data(), values.sinks.data(), a);
    if (q_len > 1) {
      bench::apply_q_len(q_len, q_indptr.data(), a);
      a.q = q_rows.data();
      a.out = out_rows.data();
      a.lse = lse_rows.data();
      if (tree) {
        a.tree_mask = tree->bits.data();
        a.tree_mask_indptr = tree->indptr.data();
      }
    }
    const KvPools& c = bench::copy_for_step(over, i);
    if (laid) {
      laid->apply(a, c.k.data(), c.v.data());
    } else {
      a.k_cache = c.k.data();
      a.v_cache = c.v.data();
    }
    return a;
  }
  // The same contents in new pools with `pages` (the pattern read's other pages).
  std::vector<KvPools> twin(HugePages pages) const {
    std::vector<KvPools> out;
    for (const KvPools& c : pools) {
      out.push_back(
          {pool_copy(c.k.data(), c.k.size(), pages), pool_copy(c.v.data(), c.v.size(), pages)});
    }
    return out;
  }
  // Percent of the pools' bytes the kernel backs with huge pages.
  double huge_pct() const {
    double huge = 0, all = 0;
    for (const KvPools& c : pools) {
      huge += static_cast<double>(c.k.huge_page_bytes() + c.v.huge_page_bytes());
      all += static_cast<double>(c.k.size() + c.v.size());
    }
    return all > 0 ? 100.0 * huge / all : 0.0;
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
  if (spec.kv_dtype == DType::kInt8) spec.k_scale = spec.v_scale = bench::kInt8KvScale;
  if (spec.kv_dtype == DType::kInt4) spec.k_scale = spec.v_scale = bench::kInt4KvScale;
  spec.token_scales = o.token_scales;
  spec.fragmented = !o.contiguous;
  spec.seed = 20261129u + static_cast<std::uint64_t>(s.batch) * 131 + s.context;
  if (o.share_members > 0) {  // --share: each run of N sequences forked after PREFIX tokens
    spec.fork_members = o.share_members;
    spec.fork_prefix.assign(
        static_cast<std::size_t>((s.batch + o.share_members - 1) / o.share_members),
        o.share_prefix);
  }
  RotatingCase rc{testing::make_case(spec), {}, {}, o.variants, {o.variants, s.heads}};
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
    if (o.tree_mask) rc.tree = bench::random_tree_masks(s.batch, s.q_len);
  }
  if (o.layout != testing::KvLayout::kHnd) rc.laid = testing::store_kv(rc.base, o.layout);
  std::vector<std::uint8_t>& k = rc.laid ? rc.laid->k : rc.base.k;
  std::vector<std::uint8_t>& v = rc.laid ? rc.laid->v : rc.base.v;
  const double cache_bytes = static_cast<double>(k.size() + v.size());
  const double want = rotate ? 4.0 * static_cast<double>(bench::last_level_cache_bytes()) : 0.0;
  const int copies = bench::rotation_copies(cache_bytes, want, 64);
  for (int c = 0; c < copies; ++c) {
    rc.pools.push_back(
        {pool_copy(k.data(), k.size(), o.huge_pages), pool_copy(v.data(), v.size(), o.huge_pages)});
  }
  for (std::vector<std::uint8_t>* bytes : {&rc.base.k, &rc.base.v, &k, &v}) {
    std::vector<std::uint8_t>().swap(*bytes);
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
  const double token_bytes = 2.0 * static_cast<double>(dtype_bytes(kv, s.head_dim));
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
double pattern_read_gbps(const Options& o, RotatingCase& rc, const std::vector<KvPools>& over,
                         DType dtype, const Shape& s) {
  const DType kv = o.kv_dtype_for(dtype);
  const std::size_t block_bytes =
      static_cast<std::size_t>(
          dtype_bytes(kv, static_cast<std::int64_t>(s.kv_heads) * s.block_size * s.head_dim)) /
      64 * 64;
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
  for (int c = 0; c < static_cast<int>(over.size()); ++c) {
    const DecodeArgs a = rc.args_over(over, c);
    const std::int64_t stride = dtype_bytes(kv, a.cache_layout().block_stride);
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
      [&](int i) { bench::time_read_tasks(bench::copy_for_step(passes, i), o.threads, o.clock); },
      std::max<int>(2, static_cast<int>(passes.size())), o.iters, o.min_time, o.max_time, o.clock);
  return kv_bytes(s, kv, o.variants.window_left) / (ms * 1e-3) / 1e9;
}

// The pattern read on `pages`: over the decode's own pools where they have those pages, else over
// a twin of them, freed afterwards.
double pattern_read_on(const Options& o, RotatingCase& rc, HugePages pages, DType dtype,
                       const Shape& s) {
  if (pages == o.huge_pages) return pattern_read_gbps(o, rc, rc.pools, dtype, s);
  const std::vector<KvPools> twin = rc.twin(pages);
  return pattern_read_gbps(o, rc, twin, dtype, s);
}

// --share: the shape timed with DecodeOptions::share_prefixes off (row cpu) and on (row
// shared), both checked against the reference, then the speed-up and the K/V bytes a step
// reads each way (count_shared_reads: every sequence's attended tokens, and each distinct
// (block, slot) once, what sharing reads; the block a fork falls inside is each sample's own).
// Returns the time with sharing.
template <class RowFor>
double time_sharing(const Options& o, DType dtype, RotatingCase& rc, RowFor row_for, FILE* info,
                    bool& accurate) {
  double ms[2] = {0, 0};
  for (int share = 0; share < 2; ++share) {
    DecodeOptions opt;
    opt.backend = Backend::kCpu;
    opt.num_threads = o.threads;
    opt.batch_invariant = o.batch_invariant;
    opt.share_prefixes = share == 1;
    decode(rc.args(0), opt);
    const double err = rel_err_vs_reference(rc.args(0));
    ms[share] = median_ms([&](int i) { decode(rc.args(i), opt); }, std::max(2, rc.copies()),
                          o.iters, o.min_time, o.max_time, o.clock);
    Row r = row_for(share ? "shared" : "cpu", ms[share], err);
    r.huge_pct = rc.huge_pct();
    accurate = accurate && !(r.rel_err > testing::out_tolerance(dtype));
    print_row(o, dtype, r);
  }
  const DecodeArgs a = rc.args(0);
  const SharedBlockReads reads = count_shared_reads(a.block_table, a.table_stride(), a.context_lens,
                                                    a.batch, a.block_size, a.window_left);
  const double token_bytes =
      2.0 * static_cast<double>(dtype_bytes(a.k_dtype, a.head_dim)) * a.num_kv_heads;
  std::fprintf(info,
               "  sharing %d-sample prefixes of %d tokens: %.2fx faster; K/V read per step "
               "%.1f MB without, %.1f MB with (%.2fx fewer bytes)\n",
               o.share_members, o.share_prefix, ms[0] / ms[1],
               static_cast<double>(reads.per_sequence_tokens) * token_bytes / 1e6,
               static_cast<double>(reads.distinct_tokens) * token_bytes / 1e6,
               static_cast<double>(reads.per_sequence_tokens) /
                   static_cast<double>(std::max<std::int64_t>(reads.distinct_tokens, 1)));
  std::fflush(info);
  return ms[1];
}

int run(int argc, char** argv) {
  const Options o = bench::parse(argc, argv);
  if (o.help) {
    bench::print_help(argv[0]);
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
    std::fprintf(info, "huge pages: %s for the K/V pools (transparent huge pages: %s)\n",
                 testing::huge_pages_name(o.huge_pages),
                 testing::thp_mode_name(testing::thp_mode()));
  }
  std::fflush(info);
  if (o.mla) return bench::run_mla_rows(o, read_bw, info);
  if (o.csv) {
    std::printf(
        "backend,dtype,batch,heads,kv_heads,head_dim,context,block_size,ms,gbps,"
        "pct_read_bw,rel_err,window,soft_cap,alibi,sinks,q_len,layout,kv_dtype%s,huge_pct,tree,"
        "token_scales,batch_invariant\n",
        o.limits ? ",compute_gbps,pattern_gbps,pct_bound,bound,pattern_huge_gbps" : "");
  } else {
    std::printf("%-6s %-5s %-8s %4s %4s %4s %4s %7s %4s %5s %4s %-12s %10s %8s %8s %10s %6s  %s\n",
                "impl", "dtype", "kv", "B", "H", "KV", "D", "ctx", "BS", "q_len", "tree", "layout",
                "ms", "GB/s", "%readBW", "rel_err", "huge", "variants");
  }
  bool accurate = true;
  std::map<std::tuple<DType, int, int, int, int>, double> in_cache_rates;  // --limits
  for (DType dtype : o.dtypes) {
    for (const Shape& s : o.shapes) {
      const double bytes =
          kv_bytes(s, o.kv_dtype_for(dtype), o.variants.window_left, o.token_scales);
      auto row_for = [&](const std::string& name, double ms, double err) {
        const double gbps = bytes / (ms * 1e-3) / 1e9;
        return Row{name, s, ms, gbps, 100.0 * gbps / read_bw, err};
      };
      const double tol = testing::out_tolerance(dtype);
      if (o.backend == "cuda") {
        bench::CudaTimingOptions co;
        co.contiguous = o.contiguous;
        co.graph = !o.plain;
        co.batch_invariant = o.batch_invariant;
        co.min_iterations = std::max(o.iters, 50);
        co.variants = o.variants;
        co.layout = o.layout;
        co.kv_dtype = o.kv_dtype_for(dtype);
        co.token_scales = o.token_scales;
        co.tree_mask = o.tree_mask;
        const bench::Timing t = bench::cuda_time_shape(s, dtype, co);
        const Row r = row_for("cuda", t.ms, t.rel_err);
        accurate = accurate && !(r.rel_err > tol);
        print_row(o, dtype, r);
        continue;
      }
      RotatingCase rc = make_rotating_case(o, dtype, s);
      const double huge_pct = rc.huge_pct();
      double ours_ms = 0;
      if (o.backend == "cpu" && o.share_members > 0) {
        ours_ms = time_sharing(o, dtype, rc, row_for, info, accurate);
      } else if (o.backend == "cpu") {
        DecodeOptions opt;
        opt.backend = Backend::kCpu;
        opt.num_threads = o.threads;
        opt.batch_invariant = o.batch_invariant;
        decode(rc.args(0), opt);
        const double err = rel_err_vs_reference(rc.args(0));
        ours_ms = median_ms([&](int i) { decode(rc.args(i), opt); }, std::max(2, rc.copies()),
                            o.iters, o.min_time, o.max_time, o.clock);
        Row r = row_for("cpu", ours_ms, err);
        r.huge_pct = huge_pct;
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
          r.pattern_gbps = pattern_read_on(o, rc, HugePages::kOff, dtype, s);
          r.pattern_huge_gbps = pattern_read_on(o, rc, HugePages::kOn, dtype, s);
          r.read_gbps = read_bw;
        }
        accurate = accurate && !(r.rel_err > tol);
        print_row(o, dtype, r);
      }
      if (o.backend == "naive" || o.naive) {
        testing::naive_decode(rc.args(0), o.threads);
        const double err = rel_err_vs_reference(rc.args(0));
        const double naive_ms =
            median_ms([&](int i) { testing::naive_decode(rc.args(i), o.threads); }, 1,
                      o.backend == "naive" ? o.iters : 3, 0.0, o.max_time, o.clock);
        Row r = row_for("naive", naive_ms, err);
        r.huge_pct = huge_pct;
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
