#include "sim/simulator.hpp"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <vector>

#include "pagedattn/block_manager.hpp"
#include "pagedattn/mla.hpp"
#include "pagedattn/mla_cache.hpp"
#include "pagedattn/reference.hpp"
#include "pagedattn/shared_blocks.hpp"
#include "pagedattn/shared_prefix.hpp"
#include "pagedattn/testing/naive_decode.hpp"
#include "pagedattn/testing/random_case.hpp"
#include "pagedattn/testing/tolerance.hpp"
#include "sim/buffer.hpp"
#include "sim/machine.hpp"
#include "sim/report.hpp"
#include "sim/workload.hpp"

namespace pagedattn::sim {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

struct Running {
  BlockManager::SeqId seq;
  Request req;
};

// An MLA model's latent cache: per simulated layer one [num_blocks][block_size][kv_lora_rank +
// rope_dim] tensor, each row c then k_pe (vLLM's and FlashMLA's layout). Sets the cache fields of
// MlaCacheWriteArgs, MlaCopyBlocksArgs and MlaDecodeArgs.
template <typename Args>
void set_latent_cache(Args& a, const Model& m, int block_size, int num_blocks, DType dtype,
                      void* base) {
  const std::int64_t width = m.row_elements();
  a.kv_lora_rank = m.kv_lora_rank;
  a.rope_dim = m.rope_dim;
  a.block_size = block_size;
  a.num_blocks = num_blocks;
  a.kv_dtype = dtype;
  a.c_cache = base;
  a.kpe_cache = static_cast<std::uint8_t*>(base) + m.kv_lora_rank * dtype_size(dtype);
  a.c_strides = a.kpe_strides = {block_size * width, width};
}

class Simulator {
 public:
  explicit Simulator(const Options& o);
  int run();

 private:
  void allocate_layers();
  void start_system_prompts();
  void admit();
  void fork_some();
  void make_room();
  void append_tokens();
  void fill_token_rows();
  void write(const std::vector<std::int32_t>& slots);
  void write_rows(std::size_t layer, std::size_t offset, const std::int32_t* slots, int n);
  void copy(const std::vector<BlockCopy>& pairs);
  double decode_layers(bool verify, double* bytes, double* naive_seconds);
  double decode_layer(const DecodeArgs& a);
  MlaDecodeArgs latent_args(const DecodeArgs& args, const void* cache, int num_blocks) const;
  double time_naive(const DecodeArgs& args);
  void verify_layer(int sampled, const DecodeArgs& args, const BlockManager::Tables& t);
  void compact_caches(int sampled, DecodeArgs& a, std::vector<std::int32_t>& table, int stride,
                      std::vector<std::vector<std::uint8_t>>& host);
  void record_check(int sampled, double rel, double lse_err, bool finite, std::size_t seqs);
  std::vector<int> verified_rows(int batch);
  void finish_some();
  void csv_row(std::FILE* f, double decode_s, double bytes, double naive_s);
  int num_blocks() const { return s_.plan.num_blocks; }

  const Options o_;
  const Backend backend_;
  const bool device_;
  Workload workload_;
  FastRandom fast_;
  RunStats s_;
  BlockManager bm_;
  // Elements of one token's K (or V) over all kv heads, or of its latent row (MLA).
  const std::size_t row_;
  const int q_width_, out_width_;  // elements of one query head's q and out
  std::vector<int> layers_;        // the model layers simulated, ascending

  // Per simulated layer, or one shared: the K and V caches, or in k_ the latent caches (MLA).
  std::vector<std::unique_ptr<Buffer>> k_, v_;
  std::vector<std::unique_ptr<Buffer>> sinks_;  // per simulated layer, with sinks
  std::vector<std::vector<float>> sinks_host_;
  // Random f32 K and V rows (MLA: latent rows, in token_k_) that new tokens are written from, a
  // window at a random offset per write: generated once, so writing a long prompt costs the
  // write and nothing on the host.
  Buffer token_k_, token_v_;
  int token_rows_ = 0;
  Buffer slots_, q_, out_, lse_, table_, lens_, naive_out_, naive_lse_;
  std::vector<std::uint8_t> q_host_;  // this step's queries, as decode() read them
  CacheOpOptions cache_opts_;
  DecodeOptions decode_opts_;

  std::vector<BlockManager::SeqId> roots_;  // the shared system prompts
  std::deque<Request> waiting_;
  std::vector<Running> running_;
  BlockManager::SeqId next_seq_ = 0;
  int arrived_ = 0, finished_requests_ = 0;
  int step_new_tokens_ = 0;
  std::vector<std::int32_t> step_lens_;  // this step's context lengths
};

Simulator::Simulator(const Options& o)
    : o_(o),
      backend_(resolve_backend(o.backend)),
      device_(backend_ == Backend::kCuda),
      workload_(o_),
      fast_{o.seed * 0x9E3779B97F4A7C15ULL + 1},
      s_{backend_, plan_cache(o, device_)},
      bm_(s_.plan.num_blocks, o.block_size),
      row_(static_cast<std::size_t>(o.model.row_elements())),
      q_width_(o.model.mla() ? o.model.row_elements() : o.model.head_dim),
      out_width_(o.model.mla() ? o.model.kv_lora_rank : o.model.head_dim),
      token_k_(device_),
      token_v_(device_),
      slots_(device_),
      q_(device_),
      out_(device_),
      lse_(device_),
      table_(device_),
      lens_(device_),
      naive_out_(device_),
      naive_lse_(device_) {
  running_.reserve(static_cast<std::size_t>(o.max_batch) + 1);  // no reallocation mid-loop
  allocate_layers();
  fill_token_rows();
  cache_opts_.backend = backend_;
  cache_opts_.num_threads = o.threads;
  decode_opts_.backend = backend_;
  decode_opts_.num_threads = o.threads;
  decode_opts_.share_prefixes = o.share_prefixes;
}

// The simulated layers' caches and sinks; their timings weighted for the model's other layers.
void Simulator::allocate_layers() {
  const Model& m = o_.model;
  const int count = o_.sim_layers ? o_.sim_layers : device_ ? kDeviceSimLayers : kCpuSimLayers;
  layers_ = sample_layers(m, count);
  const std::size_t cache_bytes =
      static_cast<std::size_t>(num_blocks()) * o_.block_size * row_ * dtype_size(o_.dtype);
  const std::size_t caches = o_.shared_cache ? 1 : layers_.size();
  for (std::size_t l = 0; l < caches; ++l) {
    // 0xff bytes are NaN in every dtype: a slot no sequence owns must never be read.
    k_.push_back(std::make_unique<Buffer>(device_, true));
    k_.back()->resize(cache_bytes, 0xff);
    if (m.mla()) continue;  // one latent cache per layer
    v_.push_back(std::make_unique<Buffer>(device_, true));
    v_.back()->resize(cache_bytes, 0xff);
  }
  s_.allocated_bytes = static_cast<double>(m.rows_per_token()) * cache_bytes * caches;
  if (!device_ && s_.allocated_bytes > 0) {
    double huge = 0;
    for (const auto* pools : {&k_, &v_}) {
      for (const auto& b : *pools) huge += static_cast<double>(b->huge_page_bytes());
    }
    s_.huge_pct = 100.0 * huge / s_.allocated_bytes;
  }
  for (const int layer : layers_) {
    LayerTiming t;
    t.layer = layer;
    t.window_left = m.window_left(layer);
    s_.layers.push_back(t);
    if (!m.sinks) continue;
    // Learned per-head logits in the real model; here values of the scores' own magnitude.
    sinks_host_.emplace_back();
    fast_.fill(sinks_host_.back(), m.num_heads, 2.0f);
    sinks_.push_back(std::make_unique<Buffer>(device_));
    sinks_.back()->upload(sinks_host_.back().data(), m.num_heads * sizeof(float));
  }
  weigh_layers(m, s_.layers);
}

// Each system prompt is written once, as a sequence of its own that lives for the whole run;
// a request that starts with it forks it and shares its full blocks.
void Simulator::start_system_prompts() {
  if (o_.system_prob == 0) return;
  std::vector<std::int32_t> slots;
  for (int i = 0; i < o_.system_prompts; ++i) {
    const BlockManager::SeqId seq = next_seq_++;
    const std::vector<std::int32_t> s = bm_.add_sequence(seq, o_.system_len);
    slots.insert(slots.end(), s.begin(), s.end());
    roots_.push_back(seq);
  }
  write(slots);
}

// Up to 32 MiB of K rows and as much of V (MLA: of latent rows alone), at least 64 and at most
// 4096 tokens' worth.
void Simulator::fill_token_rows() {
  const std::size_t row_bytes = row_ * sizeof(float);
  token_rows_ = static_cast<int>(std::clamp<std::size_t>((32u << 20) / row_bytes, 64, 4096));
  std::vector<float> rows;
  fast_.fill(rows, token_rows_ * row_, 2.0f);
  token_k_.upload(rows.data(), rows.size() * sizeof(float));
  if (o_.model.mla()) return;
  fast_.fill(rows, token_rows_ * row_, 1.0f);
  token_v_.upload(rows.data(), rows.size() * sizeof(float));
}

// The K/V (or latent rows) of new tokens, into every simulated layer's cache: each call takes up
// to token_rows_ of them from a random offset into the random rows.
void Simulator::write(const std::vector<std::int32_t>& slots) {
  if (slots.empty()) return;
  slots_.upload(slots.data(), slots.size() * sizeof(std::int32_t));
  for (std::size_t l = 0; l < k_.size(); ++l) {
    for (std::size_t first = 0; first < slots.size(); first += token_rows_) {
      const int n = static_cast<int>(std::min<std::size_t>(token_rows_, slots.size() - first));
      const std::size_t offset = (fast_.next_u64() % (token_rows_ - n + 1)) * row_ * sizeof(float);
      write_rows(l, offset, static_cast<const std::int32_t*>(slots_.data()) + first, n);
    }
  }
}

// n tokens' rows from `offset` bytes into the random rows, into the cache of layer `layer`. New
// tokens arrive in f32 and are converted to the cache dtype by the write; an MLA token's kv_c
// and k_pe are the two parts of one random row.
void Simulator::write_rows(std::size_t layer, std::size_t offset, const std::int32_t* slots,
                           int n) {
  const auto* rows = static_cast<const std::uint8_t*>(token_k_.data()) + offset;
  if (o_.model.mla()) {
    MlaCacheWriteArgs a;
    a.num_tokens = n;
    set_latent_cache(a, o_.model, o_.block_size, num_blocks(), o_.dtype, k_[layer]->data());
    a.kv_c = rows;
    a.k_pe = rows + o_.model.kv_lora_rank * sizeof(float);
    a.kv_c_row_stride = a.k_pe_row_stride = static_cast<std::int64_t>(row_);
    a.src_dtype = DType::kF32;
    a.slot_mapping = slots;
    write_mla_cache(a, cache_opts_);
    return;
  }
  CacheWriteArgs a;
  a.num_tokens = n;
  a.num_kv_heads = o_.model.num_kv_heads;
  a.head_dim = o_.model.head_dim;
  a.block_size = o_.block_size;
  a.num_blocks = num_blocks();
  a.key = rows;
  a.value = static_cast<const std::uint8_t*>(token_v_.data()) + offset;
  a.src_dtype = DType::kF32;
  a.slot_mapping = slots;
  a.k_cache = k_[layer]->data();
  a.v_cache = v_[layer]->data();
  a.cache_dtype = o_.dtype;
  write_cache(a, cache_opts_);
}

void Simulator::copy(const std::vector<BlockCopy>& pairs) {
  if (pairs.empty()) return;
  for (std::size_t l = 0; l < k_.size(); ++l) {
    if (o_.model.mla()) {
      MlaCopyBlocksArgs a;
      set_latent_cache(a, o_.model, o_.block_size, num_blocks(), o_.dtype, k_[l]->data());
      a.pairs = pairs.data();
      a.num_pairs = static_cast<int>(pairs.size());
      copy_blocks(a, cache_opts_);
      continue;
    }
    CopyBlocksArgs a;
    a.num_kv_heads = o_.model.num_kv_heads;
    a.head_dim = o_.model.head_dim;
    a.block_size = o_.block_size;
    a.num_blocks = num_blocks();
    a.k_cache = k_[l]->data();
    a.v_cache = v_[l]->data();
    a.cache_dtype = o_.dtype;
    a.pairs = pairs.data();
    a.num_pairs = static_cast<int>(pairs.size());
    copy_blocks(a, cache_opts_);
  }
  s_.cow_copies += static_cast<long long>(pairs.size());
}

// FIFO admission while the batch has room and the cache keeps one block of headroom per running
// sequence (so the next append rarely has to preempt). A request with a system prompt forks it
// and appends the rest of its prompt: its first new token copies a shared partial block.
void Simulator::admit() {
  std::vector<std::int32_t> slots;
  std::vector<BlockCopy> copies;
  while (!waiting_.empty() && static_cast<int>(running_.size()) < o_.max_batch) {
    const Request& r = waiting_.front();
    const int shared = r.system >= 0 ? o_.system_len / o_.block_size : 0;
    const int need = bm_.blocks_for_prompt(r.prompt) - shared;
    const int headroom = static_cast<int>(running_.size()) + 1;
    if (need + (running_.empty() ? 0 : headroom) > bm_.num_free_blocks()) break;
    const BlockManager::SeqId seq = next_seq_++;
    if (r.system >= 0) {
      bm_.fork(roots_[r.system], seq);
      for (int t = o_.system_len; t < r.prompt; ++t) {
        const BlockManager::Append a = bm_.append_token(seq);
        if (a.copy) copies.push_back(*a.copy);
        slots.push_back(a.slot);
      }
      s_.system_tokens += o_.system_len;
      s_.prompt_tokens += r.prompt - o_.system_len;
    } else {
      const std::vector<std::int32_t> s = bm_.add_sequence(seq, r.prompt);
      slots.insert(slots.end(), s.begin(), s.end());
      s_.prompt_tokens += r.prompt;
    }
    running_.push_back({seq, r});
    waiting_.pop_front();
  }
  copy(copies);  // before the writes: a copied block carries the shared tokens
  write(slots);
}

// n-way sampling forks the siblings from the prompt; a mid-generation fork happens once, at its
// point. A full batch defers both to a later step.
void Simulator::fork_some() {
  const std::size_t n = running_.size();
  for (std::size_t i = 0; i < n; ++i) {
    while (running_[i].req.samples_left > 0 && static_cast<int>(running_.size()) < o_.max_batch) {
      Request child = running_[i].req;
      --running_[i].req.samples_left;
      child.child = true;
      child.samples_left = 0;
      child.fork_at = -1;
      child.output = child.generated + workload_.output_length();  // each sample its own length
      const BlockManager::SeqId seq = next_seq_++;
      bm_.fork(running_[i].seq, seq);
      running_.push_back({seq, child});
      ++s_.forks;
      ++s_.n_way_forks;
    }
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
    ++s_.forks;
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
    ++s_.preemptions;
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
  s_.generated += step_new_tokens_;
}

// The naive decode of the same inputs into buffers of its own (the checks read decode()'s
// output), timed like decode().
double Simulator::time_naive(const DecodeArgs& args) {
  DecodeArgs a = args;
  naive_out_.reserve(out_.size());
  naive_lse_.reserve(lse_.size());
  a.out = naive_out_.data();
  a.lse = static_cast<float*>(naive_lse_.data());
  const Clock::time_point t0 = Clock::now();
  if (device_) {
    testing::naive_decode_cuda(a);
    testing::device_synchronize();
  } else {
    testing::naive_decode(a, o_.threads > 0 ? o_.threads : omp_get_max_threads());
  }
  return seconds_since(t0);
}

// One decode() per simulated layer, each with that layer's variants; returns the seconds spent in
// them and adds their K/V bytes (the tokens each layer attends to) to *bytes, and with --compare
// naive the naive decode's seconds over the same inputs to *naive_seconds.
double Simulator::decode_layers(bool verify, double* bytes, double* naive_seconds) {
  const Model& m = o_.model;
  std::vector<BlockManager::SeqId> ids;
  for (const Running& r : running_) ids.push_back(r.seq);
  const BlockManager::Tables t = bm_.tables(ids);
  const int batch = static_cast<int>(ids.size());
  table_.upload(t.block_table.data(), t.block_table.size() * sizeof(std::int32_t));
  lens_.upload(t.context_lens.data(), t.context_lens.size() * sizeof(std::int32_t));
  step_lens_ = t.context_lens;
  const std::size_t q_elems = static_cast<std::size_t>(batch) * m.num_heads * q_width_;
  std::vector<float> q32;
  fast_.fill(q32, q_elems, 2.0f);
  q_host_.resize(q_elems * dtype_size(o_.dtype));
  for (std::size_t i = 0; i < q_elems; ++i) store_from_float(q_host_.data(), o_.dtype, i, q32[i]);
  q_.upload(q_host_.data(), q_host_.size());
  out_.reserve(static_cast<std::size_t>(batch) * m.num_heads * out_width_ * dtype_size(o_.dtype));
  lse_.reserve(static_cast<std::size_t>(batch) * m.num_heads * sizeof(float));

  DecodeArgs a;
  a.batch = batch;
  a.num_heads = m.num_heads;
  a.num_kv_heads = m.num_kv_heads;
  a.head_dim = m.head_dim;
  a.block_size = o_.block_size;
  a.num_blocks = num_blocks();
  a.max_blocks_per_seq = t.max_blocks_per_seq;
  a.q = q_.data();
  a.q_dtype = a.k_dtype = a.v_dtype = a.out_dtype = o_.dtype;
  a.block_table = static_cast<const std::int32_t*>(table_.data());
  a.context_lens = static_cast<const std::int32_t*>(lens_.data());
  a.out = out_.data();
  a.lse = static_cast<float*>(lse_.data());
  a.logits_soft_cap = m.logits_soft_cap;
  if (m.scale > 0) a.scale = m.scale;

  // K and V, or the latent row.
  const double token_bytes = static_cast<double>(row_ * dtype_size(o_.dtype) * m.rows_per_token());
  // The step's reads for each window its layers use (the tables are the same in every layer).
  std::map<int, SharedBlockReads> reads_by_window;
  const auto reads_for = [&](int window_left) -> const SharedBlockReads& {
    auto it = reads_by_window.find(window_left);
    if (it == reads_by_window.end()) {
      it = reads_by_window
               .emplace(window_left, count_shared_reads(t.block_table.data(), t.max_blocks_per_seq,
                                                        t.context_lens.data(), batch, o_.block_size,
                                                        window_left))
               .first;
    }
    return it->second;
  };
  s_.shared_block_reads += reads_for(-1).shared_blocks;
  // The tokens shared prefixes save for each window: what find_shared_prefixes groups (the CPU
  // backend's groups with share_prefixes on) reads once per group, over the host tables.
  std::map<int, std::int64_t> saved_by_window;
  const auto saved_for = [&](int window_left) {
    auto it = saved_by_window.find(window_left);
    if (it == saved_by_window.end()) {
      DecodeArgs host = a;
      host.block_table = t.block_table.data();
      host.context_lens = t.context_lens.data();
      host.window_left = window_left;
      it = saved_by_window.emplace(window_left, find_shared_prefixes(host).saved_tokens()).first;
    }
    return it->second;
  };
  const int n = static_cast<int>(layers_.size());
  const int check = verify ? static_cast<int>((s_.steps / std::max(1, o_.verify_every)) % n) : -1;
  double seconds = 0;
  for (int l = 0; l < n; ++l) {
    const std::size_t c = o_.shared_cache ? 0 : l;
    a.k_cache = k_[c]->data();  // MLA: the latent cache
    a.v_cache = m.mla() ? nullptr : v_[c]->data();
    a.window_left = s_.layers[l].window_left;
    a.sinks = m.sinks ? static_cast<const float*>(sinks_[l]->data()) : nullptr;
    const double dt = decode_layer(a);
    const SharedBlockReads& reads = reads_for(a.window_left);
    const double tokens = static_cast<double>(reads.per_sequence_tokens);
    s_.layers[l].seconds += dt;
    s_.layers[l].bytes += tokens * token_bytes;
    s_.layers[l].distinct_bytes += static_cast<double>(reads.distinct_tokens) * token_bytes;
    s_.layers[l].shared_bytes +=
        (tokens - static_cast<double>(saved_for(a.window_left))) * token_bytes;
    *bytes += tokens * token_bytes;
    seconds += dt;
    if (o_.compare_naive) *naive_seconds += time_naive(a);
    if (l == check) verify_layer(l, a, t);
  }
  return seconds;
}

// One layer's decode() (mla_decode() over the latent cache in a.k_cache for MLA); returns its
// seconds, with a device synchronisation on CUDA.
double Simulator::decode_layer(const DecodeArgs& a) {
  const Clock::time_point t0 = Clock::now();
  if (o_.model.mla()) {
    mla_decode(latent_args(a, a.k_cache, num_blocks()), decode_opts_);
  } else {
    decode(a, decode_opts_);
  }
  if (device_) testing::device_synchronize();
  return seconds_since(t0);
}

// The MLA decode of the step `args` describes (its batch, tables, q, out, lse and scale) over a
// latent cache of `num_blocks` blocks at `cache`. q holds FlashMLA's one query row of
// kv_lora_rank + rope_dim values per head: q_nope is each head's first kv_lora_rank, q_pe the
// rest.
MlaDecodeArgs Simulator::latent_args(const DecodeArgs& args, const void* cache,
                                     int num_blocks) const {
  const Model& m = o_.model;
  MlaDecodeArgs a;
  a.batch = args.batch;
  a.num_heads = m.num_heads;
  a.max_blocks_per_seq = args.max_blocks_per_seq;
  set_latent_cache(a, m, o_.block_size, num_blocks, o_.dtype, const_cast<void*>(cache));
  a.q_dtype = a.out_dtype = o_.dtype;
  a.q_nope = args.q;
  a.q_pe = static_cast<const std::uint8_t*>(args.q) + m.kv_lora_rank * dtype_size(o_.dtype);
  a.q_nope_head_stride = a.q_pe_head_stride = q_width_;
  a.q_nope_row_stride = a.q_pe_row_stride = static_cast<std::int64_t>(m.num_heads) * q_width_;
  a.block_table = args.block_table;
  a.context_lens = args.context_lens;
  a.out = args.out;
  a.lse = args.lse;
  a.scale = args.scale;
  return a;
}

// The batch rows a checked step recomputes: --verify-seqs of them (all with 0), spread evenly
// over the batch from a random start, ascending.
std::vector<int> Simulator::verified_rows(int batch) {
  const int n = o_.verify_seqs > 0 ? std::min(o_.verify_seqs, batch) : batch;
  const int start = static_cast<int>(fast_.next_u64() % static_cast<std::uint64_t>(batch));
  std::vector<int> rows;
  for (int i = 0; i < n; ++i) {
    rows.push_back(static_cast<int>((start + static_cast<long long>(i) * batch / n) % batch));
  }
  std::sort(rows.begin(), rows.end());
  return rows;
}

// Copies the blocks the verified rows' tables name from the layer's device caches (K and V, or
// the latent cache) into compact host caches, renumbering the tables' entries to match; points
// `a` at them.
void Simulator::compact_caches(int sampled, DecodeArgs& a, std::vector<std::int32_t>& table,
                               int stride, std::vector<std::vector<std::uint8_t>>& host) {
  const std::size_t cache = o_.shared_cache ? 0 : sampled;
  std::vector<Buffer*> device{k_[cache].get()};
  if (!o_.model.mla()) device.push_back(v_[cache].get());
  const std::size_t block_bytes =
      static_cast<std::size_t>(o_.block_size) * row_ * dtype_size(o_.dtype);
  std::vector<std::int32_t> compact(num_blocks(), -1);
  host.assign(device.size(), {});
  int used = 0;
  for (int i = 0; i < a.batch; ++i) {
    const int blocks = (a.context_lens[i] + o_.block_size - 1) / o_.block_size;
    for (int j = 0; j < blocks; ++j) {
      std::int32_t& entry = table[static_cast<std::size_t>(i) * stride + j];
      if (compact[entry] < 0) {
        compact[entry] = used++;
        for (std::size_t p = 0; p < device.size(); ++p) {
          host[p].resize(used * block_bytes);
          device[p]->download(host[p].data() + (used - 1) * block_bytes, block_bytes,
                              entry * block_bytes);
        }
      }
      entry = compact[entry];
    }
  }
  a.num_blocks = std::max(1, used);
  for (auto& h : host) h.resize(a.num_blocks * block_bytes);
  a.k_cache = host[0].data();
  a.v_cache = o_.model.mla() ? nullptr : host[1].data();
}

// Compares this layer's output for some of the batch's sequences with reference_decode (or
// mla_reference_decode) over host copies of their inputs: their queries and table rows, and on
// the device the cache blocks their tables name, copied into a compact host cache.
void Simulator::verify_layer(int sampled, const DecodeArgs& run, const BlockManager::Tables& t) {
  const std::vector<int> rows = verified_rows(run.batch);
  const std::size_t esize = dtype_size(o_.dtype);
  const std::size_t q_row = static_cast<std::size_t>(run.num_heads) * q_width_;
  const std::size_t out_row = static_cast<std::size_t>(run.num_heads) * out_width_;
  std::vector<std::uint8_t> out_all(static_cast<std::size_t>(run.batch) * out_row * esize);
  std::vector<float> lse_all(static_cast<std::size_t>(run.batch) * run.num_heads);
  out_.download(out_all.data(), out_all.size());
  lse_.download(lse_all.data(), lse_all.size() * sizeof(float));

  DecodeArgs a = run;
  a.batch = static_cast<int>(rows.size());
  std::vector<std::uint8_t> q(rows.size() * q_row * esize);
  std::vector<std::int32_t> table(rows.size() * t.max_blocks_per_seq), lens(rows.size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    std::memcpy(q.data() + i * q_row * esize, q_host_.data() + rows[i] * q_row * esize,
                q_row * esize);
    std::copy_n(t.block_table.begin() + static_cast<std::size_t>(rows[i]) * t.max_blocks_per_seq,
                t.max_blocks_per_seq, table.begin() + i * t.max_blocks_per_seq);
    lens[i] = t.context_lens[rows[i]];
  }
  a.q = q.data();
  a.block_table = table.data();
  a.context_lens = lens.data();
  a.sinks = a.sinks ? sinks_host_[sampled].data() : nullptr;
  std::vector<std::vector<std::uint8_t>> host;
  if (device_) compact_caches(sampled, a, table, t.max_blocks_per_seq, host);
  const ReferenceResult ref = o_.model.mla()
                                  ? mla_reference_decode(latent_args(a, a.k_cache, a.num_blocks))
                                  : reference_decode(a);
  double err = 0, scale = 1e-30, lse_err = 0;
  bool finite = true;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    for (std::size_t e = 0; e < out_row; ++e) {
      const double got = load_as_float(out_all.data(), o_.dtype, rows[i] * out_row + e);
      const double want = ref.out[i * out_row + e];
      finite = finite && std::isfinite(got);
      err = std::max(err, std::fabs(got - want));
      scale = std::max(scale, std::fabs(want));
    }
    for (int h = 0; h < run.num_heads; ++h) {
      const double got = lse_all[static_cast<std::size_t>(rows[i]) * run.num_heads + h];
      const double want = ref.lse[i * run.num_heads + h];
      if (std::isfinite(want))
        lse_err = std::max(lse_err, std::fabs(got - want));
      else if (got != want)
        lse_err = INFINITY;
    }
  }
  record_check(sampled, err / scale, lse_err, finite, rows.size());
}

// Adds one checked layer's errors to the run's and reports a mismatch.
void Simulator::record_check(int sampled, double rel, double lse_err, bool finite,
                             std::size_t seqs) {
  s_.worst_rel = std::max(s_.worst_rel, rel);
  s_.worst_lse = std::max(s_.worst_lse, lse_err);
  ++s_.verified;
  s_.verified_seqs += static_cast<long long>(seqs);
  if (!finite || rel > testing::out_tolerance(o_.dtype) || lse_err > testing::lse_tolerance()) {
    ++s_.mismatches;
    std::fprintf(stderr,
                 "\npagedattn-sim: step %lld layer %d MISMATCH: rel_err %.3g, lse err %.3g%s\n",
                 s_.steps, layers_[sampled], rel, lse_err, finite ? "" : ", non-finite output");
  }
}

void Simulator::finish_some() {
  std::vector<Running> still;
  still.reserve(running_.capacity());
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

void Simulator::csv_row(std::FILE* f, double decode_s, double bytes, double naive_s) {
  if (!f) return;
  long long context = 0;
  for (const std::int32_t len : step_lens_) context += len;
  std::fprintf(f, "%lld,%d,%zu,%zu,%d,%d,%lld,%d,%d,%.4f,%.4f,%lld,%lld,%lld,%.4f,%.3f,%.4f\n",
               s_.steps, arrived_, running_.size(), waiting_.size(), finished_requests_,
               step_new_tokens_, context, bm_.num_used_blocks(), bm_.num_free_blocks(),
               static_cast<double>(bm_.num_used_blocks()) / std::max(1, bm_.num_blocks()),
               bm_.fragmentation(), s_.cow_copies, s_.forks, s_.preemptions, decode_s * 1e3,
               decode_s > 0 ? bytes / decode_s / 1e9 : 0.0, naive_s * 1e3);
}

int Simulator::run() {
  std::FILE* csv = nullptr;
  if (!o_.csv.empty()) {
    csv = std::fopen(o_.csv.c_str(), "w");
    if (!csv) fail(ErrorCode::kInvalidArgument, "--csv", o_.csv, "cannot be opened for writing");
    std::fputs(
        "step,arrived,running,waiting,finished,new_tokens,context_tokens,used_blocks,"
        "free_blocks,occupancy,fragmentation,cow_copies,forks,preemptions,decode_ms,"
        "attn_gbps,naive_ms\n",
        csv);
  }
  s_.ceiling_gbps = device_ ? device_read_ceiling_gbps() : cpu_read_ceiling_gbps(o_.threads);
  print_setup(o_, s_);
  Progress progress(o_.progress < 0 ? isatty(2) != 0 : o_.progress != 0, o_.requests);
  start_system_prompts();
  const Clock::time_point start = Clock::now();
  while (arrived_ < o_.requests || !running_.empty() || !waiting_.empty()) {
    int arrivals = std::min(workload_.arrivals(), o_.requests - arrived_);
    if (arrivals == 0 && running_.empty() && waiting_.empty()) arrivals = 1;  // skip idle time
    for (int i = 0; i < arrivals; ++i) waiting_.push_back(workload_.next());
    arrived_ += arrivals;
    admit();
    fork_some();
    make_room();
    append_tokens();
    const bool verify = o_.verify_every > 0 && s_.steps % o_.verify_every == 0;
    double bytes = 0, naive_s = 0;
    const double decode_s = decode_layers(verify, &bytes, &naive_s);
    s_.naive_seconds += naive_s;
    s_.peak_used = std::max(s_.peak_used, bm_.num_used_blocks());
    s_.peak_running = std::max(s_.peak_running, static_cast<int>(running_.size()));
    s_.occupancy.push_back(static_cast<float>(bm_.num_used_blocks()) / num_blocks());
    s_.fragmentation.push_back(static_cast<float>(bm_.fragmentation()));
    csv_row(csv, decode_s, bytes, naive_s);
    finish_some();
    ++s_.steps;
    progress.update(finished_requests_, s_.steps);
  }
  s_.wall_seconds = seconds_since(start);
  progress.finish(finished_requests_, s_.steps);
  if (csv) std::fclose(csv);
  for (const BlockManager::SeqId root : roots_) bm_.free_sequence(root);
  bm_.check_invariants();
  s_.all_free = bm_.num_free_blocks() == bm_.num_blocks();
  print_summary(o_, s_);
  return s_.mismatches || !s_.all_free ? 1 : 0;
}

}  // namespace

int run(const Options& options) { return Simulator(options).run(); }

}  // namespace pagedattn::sim
