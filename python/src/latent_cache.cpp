#include "latent_cache.hpp"

#include <algorithm>
#include <string>

#include "argument_error.hpp"
#include "tensor_import.hpp"

namespace pagedattn::py {
namespace {

// Reads a cache tensor as [num_blocks, block_size, width]: 3-D, or 4-D with a size-1 dimension 2
// (one latent row per token), which is dropped.
void read_as_rows(Tensor& t, const char* dims) {
  if (t.ndim() == 4) {
    if (t.shape[2] != 1) {
      reject(ErrorCode::kInvalidArgument, t.name, ".shape", t.shape_str(),
             "dimension 2 must be 1 (one latent row per token: [num_blocks, block_size, 1, "
             "width])");
    }
    t.shape.erase(t.shape.begin() + 2);
    t.strides.erase(t.strides.begin() + 2);
  }
  t.require_ndim(3, dims);
}

// The block and slot strides of a [num_blocks, block_size, width] tensor, its width contiguous.
// A dimension of size 1 (or 0) says nothing of its stride, which may be anything (PyTorch leaves
// it so): it gets the dense one. A dimension of more than one element must step forward.
MlaPartStrides strides_of(const Tensor& t) {
  const std::int64_t blocks = t.shape[0], slots = t.shape[1], width = t.shape[2];
  if (width > 1 && t.strides[2] != 1) {
    reject(ErrorCode::kInvalidArgument, t.name, ".strides", t.strides_str(),
           "the last dimension (a latent row) must be contiguous");
  }
  MlaPartStrides s{t.strides[0], t.strides[1]};
  if (slots <= 1) s.token = width;
  if (blocks <= 1) s.block = std::max<std::int64_t>(slots, 1) * s.token;
  if ((slots > 1 && s.token <= 0) || (blocks > 1 && s.block <= 0)) {
    reject(ErrorCode::kInvalidArgument, t.name, ".strides", t.strides_str(),
           "the block and slot strides must be positive (no two rows at one address)");
  }
  return s;
}

// 0 strides for a dense part (or one without elements), else the strides as they are.
MlaPartStrides as_given(MlaPartStrides s, std::int64_t slots, int width) {
  if (width == 0 || (s.token == width && s.block == slots * width)) return {};
  return s;
}

}  // namespace

RowStrides row_strides(const Tensor& t) {
  const std::int64_t rows = t.shape[0], heads = t.shape[1], width = t.shape[2];
  if (t.numel() == 0) return {};
  if (width > 1 && t.strides[2] != 1) {
    reject(ErrorCode::kInvalidArgument, t.name, ".strides", t.strides_str(),
           "the last dimension must be contiguous");
  }
  RowStrides s;
  std::int64_t head = width;
  if (heads > 1 && t.strides[1] != width) {
    if (t.strides[1] < width) {
      reject(ErrorCode::kInvalidArgument, t.name, ".strides", t.strides_str(),
             "heads must be at least " + std::to_string(width) +
                 " elements apart, in increasing order (rows must not overlap)");
    }
    s.head = head = t.strides[1];
  }
  const std::int64_t span = (heads - 1) * head + width;
  if (rows > 1 && t.strides[0] != heads * head) {
    if (t.strides[0] < span) {
      reject(ErrorCode::kInvalidArgument, t.name, ".strides", t.strides_str(),
             "rows must be at least " + std::to_string(span) +
                 " elements apart, in increasing order (rows must not overlap)");
    }
    s.row = t.strides[0];
  }
  return s;
}

void LatentCache::read(nb::handle c_h, nb::handle kpe_h, const std::vector<std::string>& tags,
                       bool writable) {
  const auto import = [&](nb::handle h, const char* name) {
    return writable ? output(h, name, tags) : input(h, name, tags);
  };
  combined = kpe_h.is_none();
  if (combined) {
    c = import(c_h, "kv_cache");
    read_as_rows(c, "[num_blocks, block_size, kv_lora_rank + rope_dim]");
    dtype = c.float_dtype();
  } else {
    c = import(c_h, "c_cache");
    kpe = import(kpe_h, "kpe_cache");
    read_as_rows(c, "[num_blocks, block_size, kv_lora_rank]");
    read_as_rows(kpe, "[num_blocks, block_size, rope_dim]");
    kpe.require_dim(0, c.shape[0], "num_blocks, c_cache.shape[0]");
    kpe.require_dim(1, c.shape[1], "block_size, c_cache.shape[1]");
    dtype = shared_float_dtype(c, kpe);
  }
  num_blocks = c.dim_int(0);
  block_size = c.dim_int(1);
}

void LatentCache::split(int kv_lora_rank, int rope_dim, const LatentRefs& refs) {
  rank = kv_lora_rank;
  rope = rope_dim;
  if (combined) {
    c.require_dim(2, static_cast<std::int64_t>(rank) + rope,
                  std::string("kv_lora_rank + rope_dim, ") + refs.rank + " + " + refs.rope);
    const MlaPartStrides s = strides_of(c);
    // c is each row's first kv_lora_rank elements, k_pe the rest: both step as the rows do
    // (dense only without k_pe).
    c_strides = rope == 0 ? as_given(s, c.shape[1], rank) : s;
    kpe_strides = rope == 0 ? MlaPartStrides{} : s;
    c_data = c.data_or_placeholder();
    kpe_data = static_cast<char*>(c_data) + static_cast<std::int64_t>(rank) * (c.dt.bits / 8);
  } else {
    c.require_dim(2, rank, std::string("kv_lora_rank, ") + refs.rank);
    kpe.require_dim(2, rope, std::string("rope_dim, ") + refs.rope);
    c_strides = as_given(strides_of(c), c.shape[1], rank);
    kpe_strides = rope == 0 ? MlaPartStrides{} : as_given(strides_of(kpe), kpe.shape[1], rope);
    c_data = c.data_or_placeholder();
    kpe_data = kpe.data_or_placeholder();
  }
}

void LatentCache::require_device(const Device& device, const char* ref) const {
  c.require_device(device, ref);
  if (!combined) kpe.require_device(device, ref);
}

}  // namespace pagedattn::py
