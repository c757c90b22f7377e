// build_prefix_passes (prefix_passes.hpp): the groups cut into chunks of at most kMaxPrefixRows
// rows per kv head, the chunks sorted into passes by their query tokens, each pass's queries
// gathered in its row order.
#include "prefix_passes.hpp"

#include <algorithm>

#include "pagedattn/shared_prefix.hpp"
#include "pagedattn/variants.hpp"

namespace pagedattn::detail::cpu {
namespace {

int query_tokens(const DecodeArgs& a, int b) {
  return a.q_indptr != nullptr ? a.q_indptr[b + 1] - a.q_indptr[b] : 1;
}
std::int64_t q_row(const DecodeArgs& a, int b, int i) {
  return a.q_indptr != nullptr ? a.q_indptr[b] + i : b;
}

// The pass of chunks of Q query tokens, made when it is the first.
PrefixPass& pass_for(PrefixPasses& out, int Q, std::size_t& used) {
  for (std::size_t p = 0; p < used; ++p) {
    if (out.passes[p].query_tokens == Q) return out.passes[p];
  }
  if (out.passes.size() <= used) out.passes.emplace_back();
  PrefixPass& pass = out.passes[used++];
  pass.query_tokens = Q;
  pass.lens.clear();
  pass.rows.clear();
  return pass;
}

// Chunk `chunk` of `pass`: its members' query rows into the pass's q (and words), scaled as
// scale_queries scales them: [chunk][kv head][row][D], row (token offset + i) * G + g.
void gather_chunk(const DecodeArgs& a, const std::int32_t* members, int count, PrefixPass& pass,
                  int chunk) {
  const int D = a.head_dim, G = a.group_size(), KV = a.num_kv_heads, Q = pass.query_tokens;
  const float scale = a.effective_scale();
  const bool bf16 = a.q_dtype == DType::kBF16;
  const std::int64_t per_kv = static_cast<std::int64_t>(Q) * G * D;
  for (int kv = 0; kv < KV; ++kv) {
    const float s = scale * head_scale(a.k_scale, a.k_scales, kv);
    std::int64_t dst = (static_cast<std::int64_t>(chunk) * KV + kv) * per_kv;
    for (int j = 0; j < count; ++j) {
      const int b = members[j];
      for (int i = 0; i < query_tokens(a, b); ++i) {
        const std::int64_t row = q_row(a, b, i) * a.q_stride();
        for (int g = 0; g < G; ++g, dst += D) {
          const std::int64_t src = row + static_cast<std::int64_t>(kv * G + g) * D;
          for (int d = 0; d < D; ++d) {
            pass.q[dst + d] = load_as_float(a.q, a.q_dtype, src + d) * s;
            if (bf16) pass.words[dst + d] = static_cast<const bf16_t*>(a.q)[src + d];
          }
        }
      }
    }
  }
}

// The pass's view over its chunks (lens and rows filled), q gathered, slopes per view head.
void finish_pass(const DecodeArgs& a, PrefixPass& pass) {
  const int G = a.group_size(), Q = pass.query_tokens, chunks = static_cast<int>(pass.lens.size());
  DecodeArgs& v = pass.view;
  v = a;
  v.batch = chunks;
  v.num_heads = Q * a.num_heads;
  v.context_lens = pass.lens.data();
  v.window_left = -1;
  v.sinks = nullptr;
  v.q_indptr = nullptr;
  v.num_q_tokens = v.max_q_len = 0;
  v.tree_mask = nullptr;
  v.tree_mask_indptr = nullptr;
  v.q = nullptr;  // the pass's q is its gathered rows (decode_cpu.cpp)
  v.q_row_stride = 0;
  v.out = nullptr;
  v.lse = nullptr;
  pass.slopes.clear();
  if (a.alibi_slopes != nullptr) {
    pass.slopes.resize(static_cast<std::size_t>(v.num_heads));
    for (int h = 0; h < v.num_heads; ++h) {
      const int kv = h / (Q * G), g = h % G;
      pass.slopes[h] = a.alibi_slopes[kv * G + g];
    }
    v.alibi_slopes = pass.slopes.data();
  }
}

// Whether two sequences that may share anything begin with the same block id: a group needs it.
// Sorts the first ids in a grow-only buffer of the calling thread, so a call without any pair
// allocates nothing.
bool any_common_first_block(const DecodeArgs& a) {
  thread_local std::vector<std::int32_t> first;
  first.clear();
  for (int b = 0; b < a.batch; ++b) {
    if (common_prefix_tokens(a, b) > 0) {
      first.push_back(a.block_table[static_cast<std::int64_t>(b) * a.table_stride()]);
    }
  }
  std::sort(first.begin(), first.end());
  return std::adjacent_find(first.begin(), first.end()) != first.end();
}

// A chunk of a group: members [first, first + count) of SharedPrefixes::members, sequence `index`
// of pass `pass`.
struct Chunk {
  int first, count, pass, index;
};

// Chunks group g is cut into: enough for at most kMaxPrefixRows rows per kv head each, each of two
// members at least.
int chunks_of(const DecodeArgs& a, const SharedPrefixes& found, const SharedPrefixGroup& g) {
  std::int64_t rows = 0;
  for (int j = 0; j < g.count; ++j) {
    rows += static_cast<std::int64_t>(query_tokens(a, found.members[g.first + j])) * a.group_size();
  }
  return static_cast<int>(std::clamp<std::int64_t>((rows + kMaxPrefixRows - 1) / kMaxPrefixRows, 1,
                                                   std::max(1, g.count / 2)));
}

// Members [begin, end) of `found.members`, sharing `tokens`, as one more sequence of the pass of
// their query-token count (its lens and rows), each member linked to its rows there.
Chunk add_chunk(const DecodeArgs& a, const SharedPrefixes& found, int tokens, int begin, int end,
                PrefixPasses& out, std::size_t& used) {
  int Q = 0;
  for (int j = begin; j < end; ++j) Q += query_tokens(a, found.members[j]);
  PrefixPass& pass = pass_for(out, Q, used);
  const Chunk chunk{begin, end - begin, static_cast<int>(&pass - out.passes.data()),
                    static_cast<int>(pass.lens.size())};
  pass.lens.push_back(tokens);
  pass.rows.push_back(found.members[begin]);
  int row0 = 0;
  for (int j = begin; j < end; ++j) {
    const int b = found.members[j];
    out.links[b] = PrefixLink{chunk.pass, chunk.index, row0, tokens};
    row0 += query_tokens(a, b);
  }
  return chunk;
}

}  // namespace

void build_prefix_passes(const DecodeArgs& a, PrefixPasses& out) {
  if (!any_common_first_block(a)) {
    out.passes.clear();
    return;
  }
  const SharedPrefixes found = find_shared_prefixes(a);
  out.links.assign(static_cast<std::size_t>(a.batch), PrefixLink{});
  std::size_t used = 0;
  std::vector<Chunk> chunks;
  for (const SharedPrefixGroup& g : found.groups) {
    const int n = chunks_of(a, found, g);
    for (int c = 0; c < n; ++c) {  // balanced by members
      const int begin = g.first + static_cast<int>(static_cast<std::int64_t>(c) * g.count / n);
      const int end = g.first + static_cast<int>(static_cast<std::int64_t>(c + 1) * g.count / n);
      chunks.push_back(add_chunk(a, found, g.tokens, begin, end, out, used));
    }
  }
  out.passes.resize(used);
  const std::size_t row = static_cast<std::size_t>(a.num_kv_heads) * a.group_size() * a.head_dim;
  for (PrefixPass& pass : out.passes) {
    const std::size_t elems = pass.lens.size() * static_cast<std::size_t>(pass.query_tokens) * row;
    pass.q.resize(elems);
    pass.words.resize(a.q_dtype == DType::kBF16 ? elems : 0);
  }
  for (const Chunk& c : chunks) {
    gather_chunk(a, &found.members[c.first], c.count, out.passes[c.pass], c.index);
  }
  for (PrefixPass& pass : out.passes) finish_pass(a, pass);
}

}  // namespace pagedattn::detail::cpu
