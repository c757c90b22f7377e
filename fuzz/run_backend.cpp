#include "run_backend.hpp"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "fault_injection.hpp"
#include "pagedattn/cache_layout.hpp"
#include "pagedattn/detail/dispatch.hpp"
#include "pagedattn/testing/device_case.hpp"
#include "pagedattn/testing/device_memory.hpp"
#include "pagedattn/validate.hpp"

namespace pagedattn::fuzz {
namespace {

// The scalar fields run_cuda gives DeviceCase without and puts back for the backend: the window,
// the soft-cap, the row strides and the multi-token query counts. (q_indptr and kv_strides
// describe buffers, which run_cuda copies to the device apart.)
void copy_fields_device_case_lacks(const DecodeArgs& from, DecodeArgs& to) {
  to.window_left = from.window_left;
  to.logits_soft_cap = from.logits_soft_cap;
  to.q_row_stride = from.q_row_stride;
  to.out_row_stride = from.out_row_stride;
  to.num_q_tokens = from.num_q_tokens;
  to.max_q_len = from.max_q_len;
}

// Device copies of the per-token scale buffers `host` points at (BuiltCase's, gaps included),
// `d` pointed at them with host's token_scale_strides; null where host's are (a malformed case may
// carry only one, or ones the case does not own: a plain cache's). They live where the caches do
// (the CUDA backend refuses them, but must do so on the pointers it is given).
class TokenScaleCopies {
 public:
  TokenScaleCopies(const BuiltCase& bc, const DecodeArgs& host, DecodeArgs& d) {
    d.k_token_scales = copy(host.k_token_scales, bc.k_token_scales, k_);
    d.v_token_scales = copy(host.v_token_scales, bc.v_token_scales, v_);
    d.token_scale_strides = host.token_scale_strides;
  }

 private:
  static const float* copy(const float* p, const std::vector<float>& scales,
                           testing::DeviceBuffer& buffer) {
    if (p == nullptr) return nullptr;
    buffer = testing::DeviceBuffer(scales.data(), scales.size() * sizeof(float));
    return buffer.as<const float>();
  }
  testing::DeviceBuffer k_, v_;
};

// The CUDA backend over device copies of a host case (the slopes, sinks, q_indptr, tree mask and
// per-token scales included), out and lse copied back. DeviceCase checks the shapes itself, so it
// is given the case without its window, soft-cap, row strides, multi-token queries, tree mask,
// cache layout and per-token scales, which are put back for the backend: on a malformed one the
// error must be the backend's. DeviceCase copies dense
// caches, so a laid-out case gives it the dense K and V and its own layout's buffers (gaps and
// all) get device copies of their own, which the backend reads through the case's kv_strides.
// DeviceCase copies batch rows of q, out and lse, so a strided q or out, and with multi-token
// queries (or a declared row count that is not the buffers': a malformed one) q, out and lse, get
// device copies of their whole buffers here, gaps included (q's NaN, out's kOutGapByte), and come
// back whole, so that a read or write of a gap shows on the host; DeviceCase then copies a stand-in
// of batch rows instead.
void run_cuda(const BuiltCase& bc, const DecodeArgs& host, const detail::DecodeOptions& o) {
  // An int4 cache: refused (kUnsupported) after the shapes, before any pointer is read, so the
  // host arguments serve; DeviceCase would check them without the group scales they need.
  if (host.k_dtype == DType::kInt4) {
    detail::decode(host, o);
    return;
  }
  DecodeArgs plain = host;
  copy_fields_device_case_lacks(DecodeArgs{}, plain);  // the defaults: none of them
  plain.q_indptr = nullptr;
  plain.tree_mask = nullptr;
  plain.tree_mask_indptr = nullptr;
  plain.kv_strides = CacheStrides{};
  plain.k_token_scales = plain.v_token_scales = nullptr;
  plain.token_scale_strides = CacheStrides{};
  const bool own_kv = bc.laid_out();
  if (own_kv) {
    if (plain.k_cache != nullptr) plain.k_cache = bc.host.k.data();
    if (plain.v_cache != nullptr) plain.v_cache = bc.host.v.data();
  }
  const bool other_rows = !bc.q_indptr.empty() || bc.rows != host.batch;
  const bool own_q =
      host.q != nullptr && host.q == bc.q_buffer().data() && (!bc.q_rows.empty() || other_rows);
  const bool own_out = host.out != nullptr && host.out == bc.out_buffer().data() &&
                       (!bc.out_rows.empty() || other_rows);
  const bool own_lse = host.lse != nullptr && other_rows;
  std::vector<std::uint8_t> stand_in;
  if (own_q || own_out) {
    // The error DeviceCase would raise, before the stand-in is sized by the shapes.
    validate_shapes(plain);
    stand_in.assign(static_cast<std::size_t>(std::max(host.batch, 0)) * host.num_heads *
                        host.head_dim * sizeof(float),
                    0);
    if (own_q) plain.q = stand_in.data();
    if (own_out) plain.out = stand_in.data();
  }
  if (own_lse) plain.lse = nullptr;
  const testing::DeviceCase dev(plain, o.cuda_stream);
  DecodeArgs d = dev.args();
  copy_fields_device_case_lacks(host, d);
  testing::DeviceBuffer dq, dout, dlse, dindptr, dtree, dtree_indptr, dk, dv;
  const TokenScaleCopies token_scales(bc, host, d);
  if (own_kv) {
    // The storage's pointers and strides on device copies, then the arguments' own strides
    // (a malformed one) and null pointers back.
    dk = testing::DeviceBuffer(bc.kv.k.data(), bc.kv.k.size());
    if (!bc.kv.v.empty()) dv = testing::DeviceBuffer(bc.kv.v.data(), bc.kv.v.size());
    bc.kv.apply(d, dk.get(), dv.get());
    if (host.k_cache == nullptr) d.k_cache = nullptr;
    if (host.v_cache == nullptr) d.v_cache = nullptr;
  }
  d.kv_strides = host.kv_strides;
  if (own_q) {
    dq = testing::DeviceBuffer(bc.q_buffer().data(), bc.q_buffer().size());
    d.q = dq.get();
  }
  if (own_out) {
    dout = testing::DeviceBuffer(bc.out_buffer().data(), bc.out_buffer().size());
    d.out = dout.get();
  }
  if (own_lse) {
    dlse = testing::DeviceBuffer(bc.host.lse.data(), bc.host.lse.size() * sizeof(float));
    d.lse = dlse.as<float>();
  }
  if (host.q_indptr != nullptr) {
    // Like the block table: the CUDA backend reads it in device memory.
    dindptr = testing::DeviceBuffer(host.q_indptr, bc.q_indptr.size() * sizeof(std::int32_t));
    d.q_indptr = dindptr.as<const std::int32_t>();
  }
  // The tree mask and its offsets live where q_indptr does.
  if (host.tree_mask != nullptr) {
    dtree = testing::DeviceBuffer(bc.tree_mask.data(), bc.tree_mask.size());
    d.tree_mask = dtree.as<const std::uint8_t>();
  }
  if (host.tree_mask_indptr != nullptr) {
    dtree_indptr = testing::DeviceBuffer(bc.tree_mask_indptr.data(),
                                         bc.tree_mask_indptr.size() * sizeof(std::int32_t));
    d.tree_mask_indptr = dtree_indptr.as<const std::int32_t>();
  }
  detail::decode(d, o);
  if (!own_out) {
    dev.download(host, o.cuda_stream);  // out, and lse unless it has its own copy
  } else {
    testing::device_synchronize();
    testing::copy_to_host(host.out, dout.get(), bc.out_buffer().size());
    if (!own_lse && host.lse != nullptr && host.batch > 0) {
      testing::copy_to_host(host.lse, d.lse,
                            static_cast<std::size_t>(host.batch) * host.num_heads * sizeof(float));
    }
  }
  if (own_lse) {
    testing::device_synchronize();
    testing::copy_to_host(host.lse, dlse.get(), bc.host.lse.size() * sizeof(float));
  }
}

}  // namespace

void run_backend(Backend backend, const BuiltCase& bc, int threads, bool single_split, bool checked,
                 bool batch_invariant, bool share_prefixes) {
  detail::DecodeOptions o;
  o.backend = backend;
  o.num_threads = threads;
  o.single_split = single_split;
  o.cuda_checked = checked;
  o.batch_invariant = batch_invariant;
  o.share_prefixes = share_prefixes;
  if (backend == Backend::kCuda) {
    run_cuda(bc, bc.args, o);
  } else {
    decode_with_planted_fault(bc.args, o);
  }
}

}  // namespace pagedattn::fuzz
