#include "cache_ops.hpp"

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <climits>
#include <cstdint>
#include <string>
#include <vector>

#include "argument_error.hpp"
#include "cache_tensors.hpp"
#include "device.hpp"
#include "kv_scales.hpp"
#include "pagedattn/block_manager.hpp"
#include "pagedattn/pagedattn.hpp"
#include "tensor_import.hpp"

namespace pagedattn::py {
namespace {

using namespace nb::literals;

// The elements between consecutive tokens of key and value ([num_tokens, num_kv_heads,
// head_dim]): each token's row must be contiguous; tokens may be any stride apart, the same
// stride in key and value. 0 for at most one token.
std::int64_t token_stride(const Tensor& key, const Tensor& value) {
  for (const Tensor* t : {&key, &value}) {
    if (!t->contiguous_from(1)) {
      reject(ErrorCode::kInvalidArgument, t->name, ".strides", t->strides_str(),
             "each token's [num_kv_heads, head_dim] must be contiguous");
    }
  }
  if (key.shape[0] <= 1) return 0;
  const std::int64_t row = key.shape[1] * key.shape[2];
  if (key.strides[0] < row) {
    reject(ErrorCode::kInvalidArgument, "key", ".strides", key.strides_str(),
           "tokens must not overlap");
  }
  if (value.strides[0] != key.strides[0]) {
    reject(ErrorCode::kInvalidArgument, "value", ".strides", value.strides_str(),
           "must step tokens like key.strides " + key.strides_str());
  }
  return key.strides[0];
}

// One block id of a pair at (i, j) in an int32 or int64 tensor [n, 2].
std::int32_t block_id_at(const Tensor& t, bool i32, std::int64_t i, int j) {
  const std::int64_t off = i * t.strides[0] + j * t.strides[1];
  const std::int64_t id = i32 ? static_cast<const std::int32_t*>(t.data)[off]
                              : static_cast<const std::int64_t*>(t.data)[off];
  if (id < INT32_MIN || id > INT32_MAX) {
    reject(ErrorCode::kOutOfRange, "pairs", "[" + std::to_string(i) + "]", std::to_string(id),
           "block id outside the int32 range");
  }
  return static_cast<std::int32_t>(id);
}

// Block copy pairs from an int32 or int64 host tensor [n, 2].
std::vector<pagedattn::BlockCopy> pairs_from_tensor(const Tensor& t) {
  if (t.device.kind != DeviceKind::kCpu) {
    reject(ErrorCode::kInvalidArgument, "pairs", ".device", t.device.str(),
           "block copy pairs are host memory (a CPU tensor or a list of (src, dst) pairs)");
  }
  if (t.ndim() != 2 || t.shape[1] != 2) {
    reject(ErrorCode::kInvalidArgument, "pairs", ".shape", t.shape_str(), "expected [n, 2]");
  }
  const bool i32 = has_dtype(t.dt, nb::dlpack::dtype_code::Int, 32);
  const bool i64 = has_dtype(t.dt, nb::dlpack::dtype_code::Int, 64);
  if (!i32 && !i64) {
    reject(ErrorCode::kInvalidArgument, "pairs", ".dtype", dtype_str(t.dt),
           "expected int32 or int64");
  }
  std::vector<pagedattn::BlockCopy> pairs(static_cast<std::size_t>(t.shape[0]));
  for (std::int64_t i = 0; i < t.shape[0]; ++i) {
    pairs[i].src = block_id_at(t, i32, i, 0);
    pairs[i].dst = block_id_at(t, i32, i, 1);
  }
  return pairs;
}

// Block copy pairs from any sequence of (src, dst) pairs of ints.
std::vector<pagedattn::BlockCopy> pairs_from_sequence(nb::handle h) {
  if (!nb::isinstance<nb::sequence>(h) || nb::isinstance<nb::str>(h)) {
    reject(ErrorCode::kInvalidArgument, "pairs", "",
           std::string("an object of type ") + nb::type_name(h.type()).c_str(),
           "expected a sequence of (src, dst) pairs or an int tensor [n, 2]");
  }
  std::vector<pagedattn::BlockCopy> pairs;
  std::size_t i = 0;
  for (nb::handle item : h) {
    std::int64_t src = 0, dst = 0;
    bool ok = nb::isinstance<nb::sequence>(item) && nb::len(item) == 2 &&
              nb::try_cast(item[0], src) && nb::try_cast(item[1], dst);
    if (!ok || src < INT32_MIN || src > INT32_MAX || dst < INT32_MIN || dst > INT32_MAX) {
      reject(ErrorCode::kInvalidArgument, "pairs", "[" + std::to_string(i) + "]",
             nb::repr(item).c_str(), "expected a pair of int32 block ids (src, dst)");
    }
    pairs.push_back({static_cast<std::int32_t>(src), static_cast<std::int32_t>(dst)});
    ++i;
  }
  return pairs;
}

void write_cache(nb::handle key_h, nb::handle value_h, nb::handle slots_h, nb::handle k_cache,
                 nb::handle v_cache, const std::string& backend, std::uintptr_t stream,
                 bool checked, const std::vector<std::string>& tags, const std::string& kv_layout,
                 double k_scale, double v_scale, nb::handle k_scales_h, nb::handle v_scales_h,
                 nb::handle k_token_scales_h, nb::handle v_token_scales_h) {
  const KvLayout layout = parse_kv_layout(kv_layout);
  Tensor key = input(key_h, "key", tags);
  Tensor value = input(value_h, "value", tags);
  Tensor slots = input(slots_h, "slot_mapping");
  CachePair c = cache_pair(k_cache, v_cache, tags, layout);

  key.require_ndim(3, "[num_tokens, num_kv_heads, head_dim]");
  value.require_ndim(3, "[num_tokens, num_kv_heads, head_dim]");
  slots.require_ndim(1, "[num_tokens]");
  const DType src = shared_float_dtype(key, value);
  slots.require_int32();
  key.require_dim(1, c.k.shape[layout.heads_dim()], layout.kv_heads_ref());
  key.require_dim(2, c.dims.head_dim,
                  c.k.codes_per_element() == 2 ? "head_dim, 2 x k_cache.shape[3] (int4 codes)"
                                               : "head_dim, k_cache.shape[3]");
  value.require_shape_of(key);
  slots.require_dim(0, key.shape[0], "num_tokens, key.shape[0]");
  slots.require_contiguous();
  const std::int64_t stride = token_stride(key, value);
  for (const Tensor* t : {&key, &value, &slots}) t->require_device(c.k.device, "k_cache");

  pagedattn::CacheWriteArgs a;
  a.num_tokens = key.dim_int(0);
  c.fill(a);
  a.key = key.data;
  a.value = value.data;
  a.src_dtype = src;
  a.src_token_stride = stride;
  a.slot_mapping = static_cast<const std::int32_t*>(slots.data);
  KvScales scales;
  scales.set(a, k_scale, v_scale, k_scales_h, v_scales_h, c.k, layout);
  TokenScales token_scales;  // written: each row's scale
  token_scales.read(k_token_scales_h, v_token_scales_h, c.k, layout, /*writable=*/true);
  token_scales.set(a);

  pagedattn::CacheOpOptions o;
  o.backend = pick_backend(backend, c.k.device, "k_cache");
  o.cuda_stream = reinterpret_cast<void*>(stream);
  o.cuda_checked = checked;

  DeviceGuard guard(c.k.device);
  nb::gil_scoped_release release;
  pagedattn::write_cache(a, o);
}

// `pairs`: an int32 or int64 host tensor [n, 2], or any sequence of (src, dst) pairs. The
// per-token scales, when given, are copied with their rows.
void copy_blocks(nb::handle k_cache, nb::handle v_cache, nb::handle pairs_h,
                 const std::string& backend, std::uintptr_t stream,
                 const std::vector<std::string>& tags, const std::string& kv_layout,
                 nb::handle k_token_scales_h, nb::handle v_token_scales_h) {
  const KvLayout layout = parse_kv_layout(kv_layout);
  CachePair c = cache_pair(k_cache, v_cache, tags, layout);
  TokenScales token_scales;
  token_scales.read(k_token_scales_h, v_token_scales_h, c.k, layout, /*writable=*/true);
  std::vector<pagedattn::BlockCopy> pairs = read_pairs(pairs_h);
  pagedattn::CopyBlocksArgs a;
  c.fill(a);
  a.pairs = pairs.data();
  a.num_pairs = static_cast<int>(pairs.size());
  token_scales.set(a);

  pagedattn::CacheOpOptions o;
  o.backend = pick_backend(backend, c.k.device, "k_cache");
  o.cuda_stream = reinterpret_cast<void*>(stream);

  DeviceGuard guard(c.k.device);
  nb::gil_scoped_release release;
  pagedattn::copy_blocks(a, o);
}

}  // namespace

std::vector<pagedattn::BlockCopy> read_pairs(nb::handle h) {
  Tensor t;
  t.name = "pairs";
  std::vector<pagedattn::BlockCopy> pairs =
      import_array(h, t) ? pairs_from_tensor(t) : pairs_from_sequence(h);
  if (pairs.size() > static_cast<std::size_t>(INT_MAX)) {
    reject(ErrorCode::kInvalidArgument, "pairs", ".length", std::to_string(pairs.size()),
           "too many pairs");
  }
  return pairs;
}

void bind_cache_ops(nb::module_& m) {
  m.def("write_cache", &write_cache, "key"_a, "value"_a, "slot_mapping"_a, "k_cache"_a, "v_cache"_a,
        "backend"_a, "stream"_a, "checked"_a, "tags"_a, "kv_layout"_a = "HND", "k_scale"_a = 1.0,
        "v_scale"_a = 1.0, "k_scales"_a.none() = nb::none(), "v_scales"_a.none() = nb::none(),
        "k_token_scales"_a.none() = nb::none(), "v_token_scales"_a.none() = nb::none());
  m.def("copy_blocks", &copy_blocks, "k_cache"_a, "v_cache"_a, "pairs"_a, "backend"_a, "stream"_a,
        "tags"_a, "kv_layout"_a = "HND", "k_token_scales"_a.none() = nb::none(),
        "v_token_scales"_a.none() = nb::none());
}

}  // namespace pagedattn::py
