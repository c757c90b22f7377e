// Checked mode (DecodeOptions::cuda_checked): the device tables, tree masks and per-head values
// read back to the host and validated exactly as the CPU path validates them. The one place decode
// waits for its stream.
#include <algorithm>
#include <cstdint>
#include <tuple>
#include <vector>

#include "cuda_error.hpp"
#include "decode_steps.hpp"
#include "pagedattn/tree_mask.hpp"
#include "pagedattn/validate.hpp"
#include "pagedattn/variants.hpp"

namespace pagedattn::detail::cuda {
namespace {

// Enqueues a copy of `n` elements of T from device `src` into host `dst` (resized to n) when src
// is set.
template <typename T>
void read_back(std::vector<T>* dst, const T* src, std::size_t n, const char* what,
               cudaStream_t stream) {
  if (src == nullptr) return;
  dst->resize(n);
  check(cudaMemcpyAsync(dst->data(), src, n * sizeof(T), cudaMemcpyDeviceToHost, stream), what);
}

}  // namespace

void check_device_tables(const DecodeArgs& a, cudaStream_t stream) {
  std::vector<std::int32_t> lens(a.batch);
  const std::size_t table_elems =
      static_cast<std::size_t>(a.batch - 1) * a.table_stride() + a.max_blocks_per_seq;
  std::vector<std::int32_t> table(std::max<std::size_t>(table_elems, 1));
  check(cudaMemcpyAsync(lens.data(), a.context_lens, lens.size() * sizeof(std::int32_t),
                        cudaMemcpyDeviceToHost, stream),
        "cudaMemcpyAsync(context_lens)");
  if (table_elems > 0) {
    check(cudaMemcpyAsync(table.data(), a.block_table, table_elems * sizeof(std::int32_t),
                          cudaMemcpyDeviceToHost, stream),
          "cudaMemcpyAsync(block_table)");
  }
  // The variants' per-head values and the kv scales, where given.
  std::vector<float> slopes, sinks, k_scales, v_scales;
  read_back(&slopes, a.alibi_slopes, a.num_heads, "cudaMemcpyAsync(alibi_slopes)", stream);
  read_back(&sinks, a.sinks, a.num_heads, "cudaMemcpyAsync(sinks)", stream);
  read_back(&k_scales, a.k_scales, a.num_kv_heads, "cudaMemcpyAsync(k_scales)", stream);
  read_back(&v_scales, a.v_scales, a.num_kv_heads, "cudaMemcpyAsync(v_scales)", stream);
  std::vector<std::int32_t> indptr, tree_indptr;
  read_back(&indptr, a.q_indptr, a.batch + 1, "cudaMemcpyAsync(q_indptr)", stream);
  read_back(&tree_indptr, a.tree_mask_indptr, a.batch + 1, "cudaMemcpyAsync(tree_mask_indptr)",
            stream);
  // The per-token scales, over the whole span of their layout (this mode is for debugging).
  std::vector<float> k_token, v_token;
  const auto token_elems = static_cast<std::size_t>(a.token_scale_layout().elements());
  read_back(&k_token, a.k_token_scales, token_elems, "cudaMemcpyAsync(k_token_scales)", stream);
  read_back(&v_token, a.v_token_scales, token_elems, "cudaMemcpyAsync(v_token_scales)", stream);
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  validate_q_indptr(a, indptr.data());
  if (a.tree_mask != nullptr) {  // its bytes once the offsets say how many are read
    std::vector<std::uint8_t> tree;
    const auto bytes =
        static_cast<std::size_t>(tree_mask_bytes_read(a.batch, indptr.data(), tree_indptr.data()));
    read_back(&tree, a.tree_mask, bytes, "cudaMemcpyAsync(tree_mask)", stream);
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    validate_tree_mask(a, tree.data(), tree_indptr.data(), indptr.data());
  }
  validate_tables(a, lens.data(), table.data(), a.q_indptr ? indptr.data() : nullptr);
  validate_variant_values(a, a.alibi_slopes ? slopes.data() : nullptr,
                          a.sinks ? sinks.data() : nullptr);
  validate_kv_scales(a, a.k_scales ? k_scales.data() : nullptr,
                     a.v_scales ? v_scales.data() : nullptr);
  validate_token_scales(a, a.k_token_scales ? k_token.data() : nullptr,
                        a.v_token_scales ? v_token.data() : nullptr, lens.data(), table.data(),
                        a.q_indptr ? indptr.data() : nullptr);
}

}  // namespace pagedattn::detail::cuda
