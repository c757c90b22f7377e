#include "pagedattn/testing/random_case.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "pagedattn/cache_layout.hpp"
#include "pagedattn/detail/dispatch.hpp"
#include "pagedattn/reference.hpp"
#include "pagedattn/testing/device_case.hpp"
#include "pagedattn/testing/tables.hpp"

namespace pagedattn::testing {
namespace {

void fill_random(std::vector<std::uint8_t>& buf, DType t, std::size_t n, float scale,
                 std::mt19937_64& rng) {
  buf.assign(static_cast<std::size_t>(dtype_bytes(t, static_cast<std::int64_t>(n))), 0);
  if (t == DType::kInt4) {  // every code -8..7 alike (-8, never written, reads as -8)
    for (auto& b : buf) b = static_cast<std::uint8_t>(rng());
    return;
  }
  std::normal_distribution<float> dist(0.f, scale);
  for (std::size_t i = 0; i < n; ++i) store_from_float(buf.data(), t, i, dist(rng));
}

}  // namespace

bool forked_block(const CaseSpec& spec, const std::vector<std::int32_t>& lens, int b, int i) {
  if (spec.fork_members < 2 || b % spec.fork_members == 0) return false;
  const std::size_t g = static_cast<std::size_t>(b / spec.fork_members);
  if (g >= spec.fork_prefix.size()) return false;
  const int leader = b - b % spec.fork_members, BS = spec.block_size;
  const int fork = std::min({spec.fork_prefix[g], lens[b], lens[leader]});
  if (i < fork / BS) return true;  // wholly before the fork
  // The block the fork falls inside: shared while this member has written nothing after it.
  return i == fork / BS && fork % BS != 0 && lens[b] == fork;
}

void size_case(HostCase& c) {
  const CaseSpec& spec = c.spec;
  c.context_lens.assign(spec.context_lens.begin(), spec.context_lens.end());
  c.context_lens.resize(spec.batch, 0);
  int max_used = 0, total_used = 0;
  for (int b = 0; b < spec.batch; ++b) {
    const int used = blocks_for(c.context_lens[b], spec.block_size);
    max_used = std::max(max_used, used);
    for (int i = 0; i < used; ++i) total_used += !forked_block(spec, c.context_lens, b, i);
  }
  c.max_blocks_per_seq = max_used + spec.table_padding;
  c.table_stride = c.max_blocks_per_seq + spec.table_stride_extra;
  c.num_blocks = total_used + spec.spare_blocks;
}

CaseSpec shaped_spec(DType dtype, int num_heads, int num_kv_heads, int head_dim, int block_size,
                     std::vector<int> context_lens) {
  CaseSpec s;
  s.context_lens = std::move(context_lens);
  s.batch = static_cast<int>(s.context_lens.size());
  s.num_heads = num_heads;
  s.num_kv_heads = num_kv_heads;
  s.head_dim = head_dim;
  s.block_size = block_size;
  s.q_dtype = s.kv_dtype = s.out_dtype = dtype;
  return s;
}

HostCase make_case(const CaseSpec& spec) {
  HostCase c;
  c.spec = spec;
  std::mt19937_64 rng(spec.seed);
  const int B = spec.batch, H = spec.num_heads, KV = spec.num_kv_heads, D = spec.head_dim,
            BS = spec.block_size;
  size_case(c);

  // Physical ids: a permutation of the pool; the first ones go to the sequences.
  const std::vector<std::int32_t> pool = block_pool(c.num_blocks, spec.fragmented, rng);
  c.block_table.assign(static_cast<std::size_t>(B) * c.table_stride, -1);
  std::vector<char> owned(c.num_blocks, 0);
  int next = 0;
  for (int b = 0; b < B; ++b) {
    const int used = blocks_for(c.context_lens[b], BS);
    for (int i = 0; i < used; ++i) {
      if (forked_block(spec, c.context_lens, b, i)) {  // the group's first member's
        c.block_table[static_cast<std::size_t>(b) * c.table_stride + i] =
            c.block_table[static_cast<std::size_t>(b - b % spec.fork_members) * c.table_stride + i];
        continue;
      }
      std::int32_t id = pool[next++];
      // Prefix sharing: reuse sequence 0's block at the same position.
      if (spec.share_prefix && b > 0 && i < blocks_for(c.context_lens[0], BS) - 1 && (rng() & 1)) {
        id = c.block_table[i];
      }
      c.block_table[static_cast<std::size_t>(b) * c.table_stride + i] = id;
    }
    // Past the context: -1 or garbage ids, which must never be read.
    for (int i = used; i < c.table_stride && spec.poison; ++i) {
      const int kind = static_cast<int>(rng() % 3);
      c.block_table[static_cast<std::size_t>(b) * c.table_stride + i] =
          kind == 0   ? -1
          : kind == 1 ? std::numeric_limits<std::int32_t>::max() - 7
                      : static_cast<std::int32_t>(rng() % 1000000) - 500000;
    }
  }

  const CacheLayout layout = CacheLayout::dense(c.num_blocks, KV, BS, D);
  fill_random(c.q, spec.q_dtype, static_cast<std::size_t>(B) * H * D, spec.magnitude, rng);
  // An fp8 cache holds value / scale, so the dequantized values have the usual spread (per-head
  // scales, in [0.5, 2), widen it a little per kv head).
  fill_random(c.k, spec.kv_dtype, layout.elements(), spec.magnitude / spec.k_scale, rng);
  fill_random(c.v, spec.kv_dtype, layout.elements(), 1.f / spec.v_scale, rng);
  if (spec.per_head_scales) {
    std::uniform_real_distribution<float> per_head(0.5f, 2.f);
    for (int kv = 0; kv < KV; ++kv) {
      c.k_scales.push_back(per_head(rng));
      c.v_scales.push_back(per_head(rng));
    }
  }
  if (spec.kv_dtype == DType::kInt4) {
    // int4: uniform codes (above) and a scale per group of 32 values, in [0.25, 4).
    const std::size_t scales = static_cast<std::size_t>(c.num_blocks) * KV * BS * (D / 32);
    std::uniform_real_distribution<float> per_group(0.25f, 4.f);
    for (std::size_t r = 0; r < scales; ++r) {
      c.k_token_scales.push_back(per_group(rng));
      c.v_token_scales.push_back(per_group(rng));
    }
  } else if (spec.token_scales) {
    // Each row's codes divided by its scale: code x scale keeps the spread of the rest.
    const std::size_t rows = static_cast<std::size_t>(c.num_blocks) * KV * BS;
    std::uniform_real_distribution<float> per_row(0.25f, 4.f);
    for (std::size_t r = 0; r < rows; ++r) {
      c.k_token_scales.push_back(per_row(rng));
      c.v_token_scales.push_back(per_row(rng));
      const std::int64_t base = static_cast<std::int64_t>(r) * D;  // dense: row r's elements
      for (int d = 0; d < D; ++d) {
        const std::size_t i = static_cast<std::size_t>(base + d);
        store_from_float(c.k.data(), spec.kv_dtype, i,
                         load_as_float(c.k.data(), spec.kv_dtype, i) / c.k_token_scales[r]);
        store_from_float(c.v.data(), spec.kv_dtype, i,
                         load_as_float(c.v.data(), spec.kv_dtype, i) / c.v_token_scales[r]);
      }
    }
  }

  if (spec.poison) {
    // Every (block, slot) no sequence reads is poisoned with NaN.
    const std::vector<char> readable = readable_slots(c.args());
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (int blk = 0; blk < c.num_blocks; ++blk) {
      for (int slot = 0; slot < BS; ++slot) {
        if (readable[static_cast<std::size_t>(blk) * BS + slot]) continue;
        for (int kv = 0; kv < KV; ++kv) {
          const std::int64_t base = layout.offset(blk, kv, slot);
          for (int d = 0; d < D; ++d) {
            if (spec.kv_dtype == DType::kInt4) {  // no NaN code: -8, never written
              int4_store(c.k.data(), base + d, -8);
              int4_store(c.v.data(), base + d, -8);
              continue;
            }
            store_from_float(c.k.data(), spec.kv_dtype, base + d, nan);
            store_from_float(c.v.data(), spec.kv_dtype, base + d, nan);
          }
          if (!c.k_token_scales.empty()) {  // the row's scales (int4: each group's)
            const int per_row = token_scales_per_row(spec.kv_dtype, D);
            const std::size_t r = (static_cast<std::size_t>(blk) * KV + kv) * BS + slot;
            for (int g = 0; g < per_row; ++g) {
              c.k_token_scales[r * per_row + g] = c.v_token_scales[r * per_row + g] = nan;
            }
          }
        }
      }
    }
  }
  c.out.assign(static_cast<std::size_t>(B) * H * D * dtype_size(spec.out_dtype), 0);
  c.lse.assign(static_cast<std::size_t>(B) * H, 0.f);
  c.poison_outputs();
  return c;
}

DecodeArgs HostCase::args() {
  DecodeArgs a;
  a.batch = spec.batch;
  a.num_heads = spec.num_heads;
  a.num_kv_heads = spec.num_kv_heads;
  a.head_dim = spec.head_dim;
  a.block_size = spec.block_size;
  a.num_blocks = num_blocks;
  a.max_blocks_per_seq = max_blocks_per_seq;
  a.block_table_stride = table_stride;
  a.q = q.data();
  a.q_dtype = spec.q_dtype;
  a.k_cache = k.data();
  a.v_cache = v.data();
  a.k_dtype = a.v_dtype = spec.kv_dtype;
  a.k_scale = spec.k_scale;
  a.v_scale = spec.v_scale;
  a.k_scales = k_scales.empty() ? nullptr : k_scales.data();
  a.v_scales = v_scales.empty() ? nullptr : v_scales.data();
  a.k_token_scales = k_token_scales.empty() ? nullptr : k_token_scales.data();
  a.v_token_scales = v_token_scales.empty() ? nullptr : v_token_scales.data();
  a.block_table = block_table.data();
  a.context_lens = context_lens.data();
  a.out = out.data();
  a.out_dtype = spec.out_dtype;
  a.lse = lse.data();
  return a;
}

void HostCase::poison_outputs() {
  std::fill(out.begin(), out.end(), 0xff);  // NaN in f32, f16 and bf16 alike
  std::fill(lse.begin(), lse.end(), std::numeric_limits<float>::quiet_NaN());
}

Backend run_decode(HostCase& c, const detail::DecodeOptions& options) {
  const Backend backend = resolve_backend(options.backend);
  detail::DecodeOptions o = options;
  o.backend = backend;
  if (backend == Backend::kCuda) {
    cuda_decode_from_host(c.args(), o);
  } else {
    detail::decode(c.args(), o);
  }
  return backend;
}

Comparison compare_with_reference(HostCase& c) {
  return compare_outputs(c, reference_decode(c.args()));
}

Comparison compare_outputs(const HostCase& c, const ReferenceResult& ref) {
  Comparison r;
  r.ref_scale = 1e-30;
  const int D = c.spec.head_dim;
  for (std::size_t i = 0; i < ref.out.size(); ++i) {
    r.ref_scale = std::max(r.ref_scale, std::fabs(ref.out[i]));
    const double got = load_as_float(c.out.data(), c.spec.out_dtype, i);
    if (!std::isfinite(got)) {
      if (r.all_finite) {
        std::ostringstream os;
        os << "out[" << i / D / c.spec.num_heads << "][" << (i / D) % c.spec.num_heads << "]["
           << i % D << "] = " << got;
        r.first_bad = os.str();
      }
      r.all_finite = false;
      continue;
    }
    r.max_abs_err_out = std::max(r.max_abs_err_out, std::fabs(got - ref.out[i]));
  }
  for (std::size_t i = 0; i < ref.lse.size(); ++i) {
    const double got = c.lse[i], want = ref.lse[i];
    if (std::isnan(got)) {
      if (r.all_finite) r.first_bad = "lse[" + std::to_string(i) + "] = nan";
      r.all_finite = false;
    } else if (std::isinf(want) || std::isinf(got)) {
      if (got != want) r.max_abs_err_lse = std::numeric_limits<double>::infinity();
    } else {
      r.max_abs_err_lse = std::max(r.max_abs_err_lse, std::fabs(got - want));
    }
  }
  return r;
}

std::string describe(const CaseSpec& s) {
  std::ostringstream os;
  os << "B=" << s.batch << " H=" << s.num_heads << " KV=" << s.num_kv_heads << " D=" << s.head_dim
     << " BS=" << s.block_size << " q=" << dtype_name(s.q_dtype) << " kv=" << dtype_name(s.kv_dtype)
     << " out=" << dtype_name(s.out_dtype) << " seed=" << s.seed << " ctx=[";
  for (std::size_t i = 0; i < s.context_lens.size() && i < 8; ++i) {
    os << (i ? "," : "") << s.context_lens[i];
  }
  if (s.context_lens.size() > 8) os << ",...";
  os << "]";
  if (s.per_head_scales) os << " per-head-scales";
  if (s.token_scales) os << " token-scales";
  if (s.fork_members >= 2) {
    os << " forks of " << s.fork_members << " after [";
    for (std::size_t g = 0; g < s.fork_prefix.size() && g < 8; ++g) {
      os << (g ? "," : "") << s.fork_prefix[g];
    }
    os << (s.fork_prefix.size() > 8 ? ",...]" : "]");
  }
  return os.str();
}

}  // namespace pagedattn::testing
