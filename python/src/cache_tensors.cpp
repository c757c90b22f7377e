#include "cache_tensors.hpp"

#include <cstdint>
#include <string>
#include <vector>

#include "argument_error.hpp"
#include "pagedattn/validate.hpp"
#include "tensor_import.hpp"

namespace pagedattn::py {

KvLayout parse_kv_layout(const std::string& s) {
  std::string upper = s;
  for (char& ch : upper) {
    if (ch >= 'a' && ch <= 'z') ch = static_cast<char>(ch - 'a' + 'A');
  }
  if (upper == "HND") return KvLayout{false};
  if (upper == "NHD") return KvLayout{true};
  reject(ErrorCode::kInvalidArgument, "kv_layout", "", "'" + s + "'",
         "expected 'HND' ([num_blocks, num_kv_heads, block_size, head_dim]) or 'NHD' "
         "([num_blocks, block_size, num_kv_heads, head_dim])");
}

PoolDims pool_dims(const Tensor& k, KvLayout layout) {
  return {k.dim_int(0), k.dim_int(layout.heads_dim()), k.dim_int(layout.slots_dim()),
          k.dim_int(3) * k.codes_per_element()};
}

namespace {

// t's element strides, a dimension of size 1 given the dense (row-major) layout's stride: its
// stride is never used and PyTorch leaves it arbitrary, so it is replaced before anything is
// compared.
std::vector<std::int64_t> effective_strides(const Tensor& t) {
  std::vector<std::int64_t> s(t.shape.size());
  std::int64_t dense = 1;
  for (int i = t.ndim() - 1; i >= 0; --i) {
    s[i] = t.shape[i] == 1 ? dense : t.strides[i];
    dense *= t.shape[i];
  }
  return s;
}

}  // namespace

// A pair laid out as dense HND gets the default strides, exactly what the library got before
// strided caches existed.
pagedattn::CacheStrides pool_strides(const Tensor& k, const Tensor& v, int heads_dim, int slots_dim,
                                     int row, const char* field, int per_element) {
  // A pool with nothing in it is never read; its strides (NumPy 2 gives an empty array zero
  // strides) say nothing.
  if (k.numel() == 0) return {};
  const std::vector<std::int64_t> ks = effective_strides(k), vs = effective_strides(v);
  if (vs != ks) {
    reject(ErrorCode::kInvalidArgument, v.name, ".strides", v.strides_str(),
           "must equal " + k.name + ".strides " + k.strides_str() +
               " (K and V share one layout; they may be two views into one tensor)");
  }
  for (int i : {0, heads_dim, slots_dim}) {
    if (ks[i] <= 0) {
      reject(ErrorCode::kInvalidArgument, k.name, ".strides", k.strides_str(),
             "dimension " + std::to_string(i) +
                 " must have a positive stride (no broadcast or reversed dimensions)");
    }
  }
  const int num_blocks = k.dim_int(0), num_kv_heads = k.dim_int(heads_dim);
  const int block_size = k.dim_int(slots_dim);
  const pagedattn::CacheStrides s{ks[0] * per_element, ks[heads_dim] * per_element,
                                  ks[slots_dim] * per_element};
  const pagedattn::CacheStrides hnd = pagedattn::CacheStrides::hnd(num_kv_heads, block_size, row);
  if ((num_blocks == 1 || s.block == hnd.block) && (num_kv_heads == 1 || s.head == hnd.head) &&
      (block_size == 1 || s.token == hnd.token)) {
    return {};
  }
  // Overlapping rows (two slots at one address) are refused by the library, which would name its
  // own field; here the error names the tensor the caller passed.
  try {
    pagedattn::require_cache_strides(s, num_blocks, num_kv_heads, block_size, row, field);
  } catch (const Error& e) {
    std::string why = e.what();
    const std::string prefix = "pagedattn: ";
    if (why.compare(0, prefix.size(), prefix) == 0) why.erase(0, prefix.size());
    reject(e.code(), k.name, ".strides", k.strides_str(), "not a valid layout (" + why + ")");
  }
  return s;
}

pagedattn::CacheStrides cache_strides(const Tensor& k, const Tensor& v, KvLayout layout) {
  for (const Tensor* t : {&k, &v}) {
    if (t->numel() > 0 && t->shape[3] > 1 && t->strides[3] != 1) {
      reject(ErrorCode::kInvalidArgument, t->name, ".strides", t->strides_str(),
             "the last dimension (head_dim) must be contiguous (stride 1)");
    }
  }
  // Packed int4 codes: the strides count bytes, the library's count codes (two a byte).
  const int per = k.codes_per_element();
  return pool_strides(k, v, layout.heads_dim(), layout.slots_dim(), k.dim_int(3) * per,
                      "kv_strides", per);
}

void require_cache_head_dim(const Tensor& k, std::int64_t head_dim) {
  if (k.codes_per_element() == 2) {  // two int4 codes a byte
    if (head_dim % 2 != 0 || k.shape[3] != head_dim / 2) {
      reject(ErrorCode::kInvalidArgument, k.name, ".shape", k.shape_str(),
             "dimension 3 must be head_dim / 2, q.shape[2] / 2 = " + std::to_string(head_dim) +
                 " / 2 (two int4 codes a byte)");
    }
    return;
  }
  k.require_dim(3, head_dim, "head_dim, q.shape[2]");
}

CachePair cache_pair(nb::handle k_h, nb::handle v_h, const std::vector<std::string>& tags,
                     KvLayout layout) {
  CachePair c;
  c.k = output(k_h, "k_cache", tags);
  c.v = output(v_h, "v_cache", tags);
  c.k.require_ndim(4, layout.dims());
  c.v.require_ndim(4, layout.dims());
  c.dtype = shared_float_dtype(c.k, c.v);
  c.v.require_shape_of(c.k);
  c.strides = cache_strides(c.k, c.v, layout);
  c.v.require_device(c.k.device, "k_cache");
  c.dims = pool_dims(c.k, layout);
  return c;
}

}  // namespace pagedattn::py
