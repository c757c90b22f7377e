#include "sim/simulator.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <random>
#include <vector>

#include "pagedattn/block_manager.hpp"
#include "pagedattn/cache_layout.hpp"
#include "pagedattn/reference.hpp"
#include "pagedattn/testing/device_memory.hpp"
#include "pagedattn/testing/random_case.hpp"

namespace pagedattn::sim {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Bytes in host memory (CPU backend) or device memory (CUDA backend), one interface.
class Buffer {
 public:
  explicit Buffer(bool device) : device_(device) {}
  void* data() { return device_ ? dev_.get() : host_.data(); }
  std::size_t size() const { return device_ ? dev_.size() : host_.size(); }
  void resize(std::size_t bytes, int fill_byte = 0) {  // contents are lost
    if (device_) {
      dev_ = testing::DeviceBuffer(bytes);
      if (bytes) testing::device_fill(dev_.get(), fill_byte, bytes);
    } else {
      host_.assign(bytes, static_cast<std::uint8_t>(fill_byte));
    }
  }
  void reserve(std::size_t bytes) {
    if (size() < bytes) resize(std::max(bytes, 2 * size()));
  }
  void upload(const void* src, std::size_t bytes) {
    reserve(bytes);
    if (device_)
      testing::copy_to_device(dev_.get(), src, bytes);
    else
      std::memcpy(host_.data(), src, bytes);
  }
  void download(void* dst, std::size_t bytes) {
    if (device_)
      testing::copy_to_host(dst, dev_.get(), bytes);
    else
      std::memcpy(dst, host_.data(), bytes);
  }

 private:
  bool device_;
  std::vector<std::uint8_t> host_;
  testing::DeviceBuffer dev_;
};

// Cheap uniform values in [-1, 1) for K, V and q: the simulator writes a lot of them.
struct FastRandom {
  std::uint64_t s;
  float next() {
    s ^= s >> 12, s ^= s << 25, s ^= s >> 27;
    return static_cast<float>((s * 0x2545F4914F6CDD1DULL) >> 40) * (2.0f / 16777216.0f) - 1.0f;
  }
  void fill(std::vector<float>& v, std::size_t n, float scale) {
    v.resize(n);
    for (float& x : v) x = scale * next();
  }
};

struct Request {
  int prompt = 0;
  int output = 0;
  int generated = 0;
  int fork_at = -1;  // fork when `generated` reaches this (-1: never)
  bool child = false;
};

struct Running {
  BlockManager::SeqId seq;
  Request req;
};

class Progress {
 public:
  Progress(bool on, int total) : on_(on), total_(total), start_(Clock::now()) {}
  void update(int done, long long steps, bool force = false) {
    if (!on_) return;
    const double now = seconds_since(start_);
    if (!force && now - last_ < 0.1) return;
    last_ = now;
    constexpr int kWidth = 30;
    const int fill = total_ ? done * kWidth / total_ : kWidth;
    std::fprintf(stderr, "\r[%.*s%*s] %3d%% %d/%d requests, %lld steps, %.1f s", fill,
                 "##############################", kWidth - fill, "",
                 total_ ? done * 100 / total_ : 100, done, total_, steps, now);
    std::fflush(stderr);
  }
  void finish(int done, long long steps) {
    update(done, steps, true);
    if (on_) std::fputc('\n', stderr);
  }

 private:
  bool on_;
  int total_;
  Clock::time_point start_;
  double last_ = -1;
};

class Simulator {
 public:
  explicit Simulator(const Options& o)
      : o_(o),
        backend_(resolve_backend(o.backend)),
        device_(backend_ == Backend::kCuda),
        rng_(o.seed),
        fast_{o.seed * 0x9E3779B97F4A7C15ULL + 1},
        bm_(o.num_blocks, o.block_size),
        row_(static_cast<std::size_t>(o.num_kv_heads) * o.head_dim),
        key_(device_),
        value_(device_),
        slots_(device_),
        q_(device_),
        out_(device_),
        lse_(device_),
        table_(device_),
        lens_(device_) {
    const std::size_t cache_bytes =
        CacheLayout::dense(o.num_blocks, o.num_kv_heads, o.block_size, o.head_dim).elements() *
        dtype_size(o.dtype);
    const int caches = o.shared_cache ? 1 : o.layers;
    for (int l = 0; l < caches; ++l) {
      // 0xff bytes are NaN in every dtype: a slot no sequence owns must never be read.
      k_.push_back(std::make_unique<Buffer>(device_));
      k_.back()->resize(cache_bytes, 0xff);
      v_.push_back(std::make_unique<Buffer>(device_));
      v_.back()->resize(cache_bytes, 0xff);
    }
    cache_bytes_ = cache_bytes * 2 * caches;
    cache_opts_.backend = backend_;
    cache_opts_.num_threads = o.threads;
    decode_opts_.backend = backend_;
    decode_opts_.num_threads = o.threads;
  }

  int run();

 private:
  Request new_request() {
    Request r;
    r.prompt = o_.prompt_len.sample(rng_);
    r.output = o_.output_len.sample(rng_);
    if (r.output > 1 && std::bernoulli_distribution(o_.fork_prob)(rng_)) {
      r.fork_at = std::uniform_int_distribution<int>(1, r.output - 1)(rng_);
    }
    return r;
  }
  int poisson_arrivals() { return std::poisson_distribution<int>(o_.rate)(rng_); }
  void admit();
  void fork_some();
  void make_room();
  void append_tokens();
  void write(const std::vector<std::int32_t>& slots);
  void copy(const std::vector<BlockCopy>& pairs);
  double decode_layers(bool verify);
  void verify_layer(int layer, const DecodeArgs& args);
  void finish_some();
  void csv_row(std::FILE* f, double decode_s, std::int64_t bytes);

  const Options o_;
  const Backend backend_;
  const bool device_;
  std::mt19937_64 rng_;
  FastRandom fast_;
  BlockManager bm_;
  const std::size_t row_;  // elements of one token's K (or V) over all kv heads

  std::vector<std::unique_ptr<Buffer>> k_, v_;  // per layer, or one shared
  std::size_t cache_bytes_ = 0;
  Buffer key_, value_, slots_, q_, out_, lse_, table_, lens_;
  std::vector<float> host_rows_k_, host_rows_v_;
  CacheOpOptions cache_opts_;
  DecodeOptions decode_opts_;

  std::deque<Request> waiting_;
  std::vector<Running> running_;
  BlockManager::SeqId next_seq_ = 0;
  int arrived_ = 0, finished_requests_ = 0;
  long long step_ = 0, generated_ = 0, forks_ = 0, preemptions_ = 0, cow_copies_ = 0;
  long long prompt_tokens_ = 0;
  int step_new_tokens_ = 0;
  std::int64_t step_context_ = 0;
  // Summary.
  int peak_used_ = 0, peak_running_ = 0;
  double frag_sum_ = 0, attn_seconds_ = 0, attn_bytes_ = 0;
  int verified_ = 0, mismatches_ = 0;
  double worst_rel_ = 0, worst_lse_ = 0;
};

void Simulator::write(const std::vector<std::int32_t>& slots) {
  if (slots.empty()) return;
  const std::size_t n = slots.size();
  slots_.upload(slots.data(), n * sizeof(std::int32_t));
  const int caches = static_cast<int>(k_.size());
  for (int l = 0; l < caches; ++l) {
    // New tokens arrive in f32 and are converted to the cache dtype by write_cache.
    fast_.fill(host_rows_k_, n * row_, 2.0f);
    fast_.fill(host_rows_v_, n * row_, 1.0f);
    key_.upload(host_rows_k_.data(), n * row_ * sizeof(float));
    value_.upload(host_rows_v_.data(), n * row_ * sizeof(float));
    CacheWriteArgs a;
    a.num_tokens = static_cast<int>(n);
    a.num_kv_heads = o_.num_kv_heads;
    a.head_dim = o_.head_dim;
    a.block_size = o_.block_size;
    a.num_blocks = o_.num_blocks;
    a.key = key_.data();
    a.value = value_.data();
    a.src_dtype = DType::kF32;
    a.slot_mapping = static_cast<const std::int32_t*>(slots_.data());
    a.k_cache = k_[l]->data();
    a.v_cache = v_[l]->data();
    a.cache_dtype = o_.dtype;
    write_cache(a, cache_opts_);
  }
}

void Simulator::copy(const std::vector<BlockCopy>& pairs) {
  if (pairs.empty()) return;
  for (std::size_t l = 0; l < k_.size(); ++l) {
    CopyBlocksArgs a;
    a.num_kv_heads = o_.num_kv_heads;
    a.head_dim = o_.head_dim;
    a.block_size = o_.block_size;
    a.num_blocks = o_.num_blocks;
    a.k_cache = k_[l]->data();
    a.v_cache = v_[l]->data();
    a.cache_dtype = o_.dtype;
    a.pairs = pairs.data();
    a.num_pairs = static_cast<int>(pairs.size());
    copy_blocks(a, cache_opts_);
  }
  cow_copies_ += static_cast<long long>(pairs.size());
}

// FIFO admission while the batch has room and the cache keeps one block of headroom per running
// sequence (so the next append rarely has to preempt).
void Simulator::admit() {
  std::vector<std::int32_t> slots;
  while (!waiting_.empty() && static_cast<int>(running_.size()) < o_.max_batch) {
    const Request& r = waiting_.front();
    const int need = bm_.blocks_for_prompt(r.prompt);
    const int headroom = static_cast<int>(running_.size()) + 1;
    if (need + (running_.empty() ? 0 : headroom) > bm_.num_free_blocks()) break;
    const BlockManager::SeqId seq = next_seq_++;
    const std::vector<std::int32_t> s = bm_.add_sequence(seq, r.prompt);
    slots.insert(slots.end(), s.begin(), s.end());
    prompt_tokens_ += r.prompt;
    running_.push_back({seq, r});
    waiting_.pop_front();
  }
  write(slots);
}

void Simulator::fork_some() {
  const std::size_t n = running_.size();
  for (std::size_t i = 0; i < n; ++i) {
    Request& r = running_[i].req;
    if (r.fork_at < 0 || r.generated < r.fork_at) continue;
    if (static_cast<int>(running_.size()) >= o_.max_batch) {
      if (++r.fork_at >= r.output) r.fork_at = -1;  // try again next step, while tokens remain
      continue;
    }
    r.fork_at = -1;
    Request child = r;
    child.child = true;
    const BlockManager::SeqId seq = next_seq_++;
    bm_.fork(running_[i].seq, seq);
    running_.push_back({seq, child});
    ++forks_;
  }
}

// Preempts the most recently started sequences until every running one can append a token. A
// preempted sequence returns to the front of the queue and is recomputed: its prompt becomes
// everything it holds, and it owes the rest of its output.
void Simulator::make_room() {
  for (;;) {
    int need = 0;
    for (const Running& r : running_) need += bm_.blocks_to_append(r.seq);
    if (need <= bm_.num_free_blocks() || running_.size() <= 1) return;
    Running victim = running_.back();
    running_.pop_back();
    Request r = victim.req;
    r.prompt = bm_.length(victim.seq);
    r.output -= r.generated;
    if (r.fork_at >= 0) r.fork_at = std::max(1, r.fork_at - r.generated);
    r.generated = 0;
    bm_.free_sequence(victim.seq);
    waiting_.push_front(r);
    ++preemptions_;
  }
}

void Simulator::append_tokens() {
  std::vector<std::int32_t> slots;
  std::vector<BlockCopy> copies;
  slots.reserve(running_.size());
  for (Running& r : running_) {
    const BlockManager::Append a = bm_.append_token(r.seq);
    if (a.copy) copies.push_back(*a.copy);
    slots.push_back(a.slot);
    ++r.req.generated;
  }
  copy(copies);  // before the writes: a copied block carries the shared tokens
  write(slots);
  step_new_tokens_ = static_cast<int>(slots.size());
  generated_ += step_new_tokens_;
}

double Simulator::decode_layers(bool verify) {
  std::vector<BlockManager::SeqId> ids;
  for (const Running& r : running_) ids.push_back(r.seq);
  const BlockManager::Tables t = bm_.tables(ids);
  const int batch = static_cast<int>(ids.size());
  table_.upload(t.block_table.data(), t.block_table.size() * sizeof(std::int32_t));
  lens_.upload(t.context_lens.data(), t.context_lens.size() * sizeof(std::int32_t));
  const std::size_t q_elems = static_cast<std::size_t>(batch) * o_.num_heads * o_.head_dim;
  std::vector<float> q32;
  fast_.fill(q32, q_elems, 2.0f);
  std::vector<std::uint8_t> q(q_elems * dtype_size(o_.dtype));
  for (std::size_t i = 0; i < q_elems; ++i) store_from_float(q.data(), o_.dtype, i, q32[i]);
  q_.upload(q.data(), q.size());
  out_.reserve(q.size());
  lse_.reserve(static_cast<std::size_t>(batch) * o_.num_heads * sizeof(float));

  DecodeArgs a;
  a.batch = batch;
  a.num_heads = o_.num_heads;
  a.num_kv_heads = o_.num_kv_heads;
  a.head_dim = o_.head_dim;
  a.block_size = o_.block_size;
  a.num_blocks = o_.num_blocks;
  a.max_blocks_per_seq = t.max_blocks_per_seq;
  a.q = q_.data();
  a.q_dtype = a.k_dtype = a.v_dtype = a.out_dtype = o_.dtype;
  a.block_table = static_cast<const std::int32_t*>(table_.data());
  a.context_lens = static_cast<const std::int32_t*>(lens_.data());
  a.out = out_.data();
  a.lse = static_cast<float*>(lse_.data());

  step_context_ = 0;
  for (const std::int32_t len : t.context_lens) step_context_ += len;
  const int check_layer =
      verify ? static_cast<int>((step_ / std::max(1, o_.verify_every)) % o_.layers) : -1;
  double seconds = 0;
  for (int l = 0; l < o_.layers; ++l) {
    const std::size_t c = o_.shared_cache ? 0 : l;
    a.k_cache = k_[c]->data();
    a.v_cache = v_[c]->data();
    const Clock::time_point t0 = Clock::now();
    decode(a, decode_opts_);
    if (device_) testing::device_synchronize();
    seconds += seconds_since(t0);
    if (l == check_layer) verify_layer(static_cast<int>(c), a);
  }
  return seconds;
}

// Compares this layer's output with reference_decode over host copies of the same inputs.
void Simulator::verify_layer(int cache, const DecodeArgs& device_args) {
  DecodeArgs a = device_args;
  const std::size_t q_bytes =
      static_cast<std::size_t>(a.batch) * a.num_heads * a.head_dim * dtype_size(o_.dtype);
  std::vector<std::uint8_t> q, out(q_bytes), k, v;
  std::vector<float> lse(static_cast<std::size_t>(a.batch) * a.num_heads);
  std::vector<std::int32_t> table, lens;
  if (device_) {
    q.resize(q_bytes);
    q_.download(q.data(), q_bytes);
    k.resize(k_[cache]->size());
    v.resize(v_[cache]->size());
    k_[cache]->download(k.data(), k.size());
    v_[cache]->download(v.data(), v.size());
    table.resize(static_cast<std::size_t>(a.batch) * a.max_blocks_per_seq);
    lens.resize(a.batch);
    table_.download(table.data(), table.size() * sizeof(std::int32_t));
    lens_.download(lens.data(), lens.size() * sizeof(std::int32_t));
    a.q = q.data();
    a.k_cache = k.data();
    a.v_cache = v.data();
    a.block_table = table.data();
    a.context_lens = lens.data();
  }
  out_.download(out.data(), q_bytes);
  lse_.download(lse.data(), lse.size() * sizeof(float));
  const ReferenceResult ref = reference_decode(a);
  double err = 0, scale = 1e-30, lse_err = 0;
  bool finite = true;
  for (std::size_t i = 0; i < ref.out.size(); ++i) {
    const double got = load_as_float(out.data(), o_.dtype, i);
    finite = finite && std::isfinite(got);
    err = std::max(err, std::fabs(got - ref.out[i]));
    scale = std::max(scale, std::fabs(ref.out[i]));
  }
  for (std::size_t i = 0; i < ref.lse.size(); ++i) {
    if (std::isfinite(ref.lse[i]))
      lse_err = std::max(lse_err, std::fabs(lse[i] - ref.lse[i]));
    else if (lse[i] != ref.lse[i])
      lse_err = INFINITY;
  }
  const double rel = err / scale;
  worst_rel_ = std::max(worst_rel_, rel);
  worst_lse_ = std::max(worst_lse_, lse_err);
  ++verified_;
  if (!finite || rel > testing::out_tolerance(o_.dtype) || lse_err > testing::lse_tolerance()) {
    ++mismatches_;
    std::fprintf(stderr,
                 "\npagedattn-sim: step %lld layer %d MISMATCH: rel_err %.3g, lse err %.3g%s\n",
                 step_, cache, rel, lse_err, finite ? "" : ", non-finite output");
  }
}

void Simulator::finish_some() {
  std::vector<Running> still;
  still.reserve(running_.size());
  for (const Running& r : running_) {
    if (r.req.generated >= r.req.output) {
      bm_.free_sequence(r.seq);
      if (!r.req.child) ++finished_requests_;
    } else {
      still.push_back(r);
    }
  }
  running_.swap(still);
}

void Simulator::csv_row(std::FILE* f, double decode_s, std::int64_t bytes) {
  if (!f) return;
  std::fprintf(f, "%lld,%d,%zu,%zu,%d,%d,%lld,%d,%d,%.4f,%.4f,%lld,%lld,%lld,%.4f,%.3f\n", step_,
               arrived_, running_.size(), waiting_.size(), finished_requests_, step_new_tokens_,
               static_cast<long long>(step_context_), bm_.num_used_blocks(), bm_.num_free_blocks(),
               static_cast<double>(bm_.num_used_blocks()) / std::max(1, bm_.num_blocks()),
               bm_.fragmentation(), cow_copies_, forks_, preemptions_, decode_s * 1e3,
               decode_s > 0 ? bytes / decode_s / 1e9 : 0.0);
}

int Simulator::run() {
  std::FILE* csv = nullptr;
  if (!o_.csv.empty()) {
    csv = std::fopen(o_.csv.c_str(), "w");
    if (!csv) fail(ErrorCode::kInvalidArgument, "--csv", o_.csv, "cannot be opened for writing");
    std::fputs(
        "step,arrived,running,waiting,finished,new_tokens,context_tokens,used_blocks,"
        "free_blocks,occupancy,fragmentation,cow_copies,forks,preemptions,decode_ms,"
        "attn_gbps\n",
        csv);
  }
  std::printf(
      "pagedattn-sim: backend %s, %d layers (%s), H=%d KV=%d D=%d %s, %d blocks x %d "
      "tokens (%.1f MiB of cache)\n",
      backend_name(backend_), o_.layers, o_.shared_cache ? "one shared cache" : "own caches",
      o_.num_heads, o_.num_kv_heads, o_.head_dim, dtype_name(o_.dtype), o_.num_blocks,
      o_.block_size, cache_bytes_ / 1048576.0);
  std::printf(
      "workload: %d requests, %.3g per step, prompt %s, output %s, fork prob %.3g, max "
      "batch %d, seed %llu\n",
      o_.requests, o_.rate, o_.prompt_len.text().c_str(), o_.output_len.text().c_str(),
      o_.fork_prob, o_.max_batch, static_cast<unsigned long long>(o_.seed));
  std::fflush(stdout);
  Progress progress(o_.progress < 0 ? isatty(2) != 0 : o_.progress != 0, o_.requests);
  const std::size_t token_bytes = row_ * dtype_size(o_.dtype) * 2;  // K and V of one token
  const Clock::time_point start = Clock::now();
  while (finished_requests_ < o_.requests) {
    int arrivals = std::min(poisson_arrivals(), o_.requests - arrived_);
    if (arrivals == 0 && running_.empty() && waiting_.empty() && arrived_ < o_.requests) {
      arrivals = 1;  // skip idle time
    }
    for (int i = 0; i < arrivals; ++i) waiting_.push_back(new_request());
    arrived_ += arrivals;
    admit();
    fork_some();
    make_room();
    append_tokens();
    const bool verify = o_.verify_every > 0 && step_ % o_.verify_every == 0;
    const double decode_s = decode_layers(verify);
    const std::int64_t bytes = step_context_ * static_cast<std::int64_t>(token_bytes) * o_.layers;
    attn_seconds_ += decode_s;
    attn_bytes_ += static_cast<double>(bytes);
    peak_used_ = std::max(peak_used_, bm_.num_used_blocks());
    peak_running_ = std::max(peak_running_, static_cast<int>(running_.size()));
    frag_sum_ += bm_.fragmentation();
    csv_row(csv, decode_s, bytes);
    finish_some();
    ++step_;
    progress.update(finished_requests_, step_);
  }
  const double wall = seconds_since(start);
  progress.finish(finished_requests_, step_);
  if (csv) std::fclose(csv);
  bm_.check_invariants();
  const bool all_free = bm_.num_free_blocks() == bm_.num_blocks();

  std::printf(
      "steps %lld, generated tokens %lld (+ %lld prompt tokens written) in %.2f s: %.0f "
      "tokens/s\n",
      step_, generated_, prompt_tokens_, wall, generated_ / wall);
  std::printf(
      "sequences: peak batch %d, forks %lld, copy-on-write block copies %lld, "
      "preemptions %lld\n",
      peak_running_, forks_, cow_copies_, preemptions_);
  std::printf("attention: %.2f GB of K/V read in %.2f s: %.2f GB/s\n", attn_bytes_ / 1e9,
              attn_seconds_, attn_seconds_ > 0 ? attn_bytes_ / attn_seconds_ / 1e9 : 0.0);
  std::printf(
      "cache: peak occupancy %.1f%% (%d of %d blocks), mean fragmentation %.1f%% "
      "(unused slots of used blocks), all blocks free at the end: %s\n",
      100.0 * peak_used_ / std::max(1, o_.num_blocks), peak_used_, o_.num_blocks,
      100.0 * frag_sum_ / std::max<long long>(1, step_), all_free ? "yes" : "NO");
  if (verified_ == 0) {
    std::printf("verify: no step sampled (--verify-every 0)\n");
  } else {
    std::printf(
        "verify: %d sampled steps against the f64 reference, max rel err %.3g (tolerance "
        "%.3g), max lse err %.3g: %s\n",
        verified_, worst_rel_, testing::out_tolerance(o_.dtype), worst_lse_,
        mismatches_ ? "MISMATCH" : "OK");
  }
  return mismatches_ || !all_free ? 1 : 0;
}

}  // namespace

int run(const Options& options) { return Simulator(options).run(); }

}  // namespace pagedattn::sim
