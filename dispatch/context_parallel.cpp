// context_parallel_decode(): every rank validates its own share; over host memory (or with
// check_group) the ranks exchange a header (shapes and whether their validation passed) so that a
// bad argument on one rank is an error on all of them instead of a hang. Then each rank decodes
// its share into f32 (out, lse), written straight into its own slot of the gather buffer (one
// block of rows * (head_dim + 1) floats per rank: out, then lse), the blocks are all-gathered (or
// gathered to the root) in place, and merged in rank order (merge_states over the strided
// blocks), so every rank computes the same bits. The same steps run on both backends; only
// where the buffers live differs.
#include "pagedattn/context_parallel.hpp"

#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "pagedattn/detail/backends.hpp"
#include "pagedattn/detail/merge_backends.hpp"
#include "pagedattn/validate.hpp"

namespace pagedattn {
namespace {

// What every rank tells the others before any work: the shapes the merge depends on, whether
// its own arguments passed validation, and the root it was asked for.
struct Header {
  std::int32_t ok, batch, num_heads, head_dim, root;
};

constexpr std::size_t kAlign = 256;

std::size_t align_up(std::size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// What context-parallel decode does not take, refused by name: the variants that depend on a
// token's position in the whole sequence (the window, ALiBi) or count once per sequence (sinks),
// since a rank sees only its share of the context, and a strided out (the merge writes it dense).
// The soft-cap acts on each logit alone and a strided q is read as in decode().
void refuse_unsupported(const DecodeArgs& a) {
  const char* why =
      "not supported by context_parallel_decode (each rank holds a share of the "
      "context); decode the sequence on one device";
  if (a.window_left >= 0) fail(ErrorCode::kUnsupported, "window_left", a.window_left, why);
  if (a.alibi_slopes != nullptr) fail(ErrorCode::kUnsupported, "alibi_slopes", "set", why);
  if (a.sinks != nullptr) fail(ErrorCode::kUnsupported, "sinks", "set", why);
  if (a.q_indptr != nullptr) fail(ErrorCode::kUnsupported, "q_indptr", "set", why);
  if (a.k_token_scales != nullptr) fail(ErrorCode::kUnsupported, "k_token_scales", "set", why);
  if (a.out_row_stride != 0) {
    fail(ErrorCode::kUnsupported, "out_row_stride", a.out_row_stride,
         "not supported by context_parallel_decode (its merge writes out dense)");
  }
}

// The header exchange; throws on every rank alike when one rank's validation failed or the
// shapes differ.
void check_group(const DecodeArgs& args, Communicator& comm, Backend backend, int root,
                 const std::exception_ptr& local_error, void* stream) {
  const int ranks = comm.size();
  const Header mine{local_error ? 0 : 1, args.batch, args.num_heads, args.head_dim, root};
  std::vector<Header> all(ranks);
  if (backend == Backend::kCuda) {
    std::shared_ptr<void> dev = detail::cuda::stream_scratch(sizeof(Header) * ranks, stream);
    auto* recv = static_cast<char*>(dev.get());
    char* send = recv + sizeof(Header) * comm.rank();
    detail::cuda::copy_and_wait(send, &mine, sizeof(Header), stream);
    comm.all_gather(send, recv, sizeof(Header), stream);
    detail::cuda::copy_and_wait(all.data(), recv, sizeof(Header) * ranks, stream);
  } else {
    comm.all_gather(&mine, all.data(), sizeof(Header), stream);
  }
  if (local_error) std::rethrow_exception(local_error);
  for (int r = 0; r < ranks; ++r) {
    if (!all[r].ok) {
      fail(ErrorCode::kInvalidArgument, "rank", r,
           "its arguments failed validation (that rank reports which)");
    }
  }
  // Every rank compares with rank 0, so all of them fail alike.
  for (int r = 1; r < ranks; ++r) {
    const Header& h = all[r];
    const Header& first = all[0];
    auto differs = [&](const char* field, int v0, int vr) {
      if (v0 != vr) {
        fail(ErrorCode::kInvalidArgument, field, vr,
             "on rank " + std::to_string(r) + ", against " + std::to_string(v0) +
                 " on rank 0: every rank decodes the same queries");
      }
    };
    differs("batch", first.batch, h.batch);
    differs("num_heads", first.num_heads, h.num_heads);
    differs("head_dim", first.head_dim, h.head_dim);
    differs("root", first.root, h.root);
  }
}

}  // namespace

std::size_t context_parallel_state_bytes(const DecodeArgs& args) {
  // Rounded up so that every rank's block, and the out at its start, is 256-byte aligned: the
  // decode stores out in 8- and 16-byte pieces (an odd batch * num_heads would misalign every
  // other rank's block otherwise).
  return align_up(static_cast<std::size_t>(args.batch) * args.num_heads * (args.head_dim + 1) *
                  sizeof(float));
}

std::size_t context_parallel_workspace_size(const DecodeArgs& args, int ranks) {
  return context_parallel_workspace_size(args, ranks, DecodeOptions{});
}

std::size_t context_parallel_workspace_size(const DecodeArgs& args, int ranks,
                                            const DecodeOptions& options) {
  if (ranks < 1) fail(ErrorCode::kInvalidArgument, "ranks", ranks, "must be at least 1");
  DecodeArgs local = args;
  local.out_dtype = DType::kF32;
  local.out_row_stride = 0;
  return static_cast<std::size_t>(ranks) * context_parallel_state_bytes(args) +
         cuda_workspace_size(local, options);
}

void context_parallel_decode(const DecodeArgs& args, Communicator& comm,
                             const DecodeOptions& options,
                             const ContextParallelOptions& cp_options) {
  const int ranks = comm.size();
  const int rank = comm.rank();
  const int root = cp_options.root;
  const Backend memory = comm.memory();
  // Local validation; over host memory its error is rethrown after the header exchange, when
  // every rank knows.
  std::exception_ptr local_error;
  try {
    validate_options(options);
    if (root < -1 || root >= ranks) {
      fail(ErrorCode::kInvalidArgument, "root", root,
           "must be -1 (every rank) or a rank in [0, " + std::to_string(ranks) + ")");
    }
    const Backend backend = resolve_backend(options.backend);
    if (backend != memory) {
      fail(ErrorCode::kInvalidArgument, "backend", backend_name(backend),
           std::string("must be the communicator's memory, ") + backend_name(memory));
    }
    validate_shapes(args);
    if (backend == Backend::kCuda) require_cuda_head_dim(args.head_dim);
    refuse_unsupported(args);
    if (args.batch > 0 && backend == Backend::kCpu) {
      validate_tables(args, args.context_lens, args.block_table);
      validate_kv_scales(args, args.k_scales, args.v_scales);  // fp8 caches' per-head scales
    }
    if (backend == Backend::kCuda && args.batch > 0) {
      // Everything the CUDA decode would refuse, here, before the header exchange: a rank that
      // failed after it would leave the others waiting in the collective.
      detail::cuda::check_launch(args, options);
      if (options.workspace != nullptr &&
          options.workspace_bytes < context_parallel_workspace_size(args, ranks, options)) {
        fail(ErrorCode::kInvalidArgument, "workspace_bytes", options.workspace_bytes,
             "too small: context_parallel_workspace_size() = " +
                 std::to_string(context_parallel_workspace_size(args, ranks, options)));
      }
    }
  } catch (const Error&) {
    if (memory == Backend::kCuda && !cp_options.check_group) throw;
    local_error = std::current_exception();
  }
  if (memory == Backend::kCpu || cp_options.check_group) {
    check_group(args, comm, memory, root, local_error, options.cuda_stream);
  }
  if (args.batch == 0) return;

  // One block per rank: rows * D floats of out, then rows floats of lse.
  const std::int64_t rows = static_cast<std::int64_t>(args.batch) * args.num_heads;
  const std::int64_t D = args.head_dim;
  const std::size_t block_bytes = context_parallel_state_bytes(args);
  const std::size_t gathered_bytes = block_bytes * ranks;
  std::vector<float> host;
  std::shared_ptr<void> device;
  float* gathered = nullptr;
  detail::DecodeOptions local_options(options);
  local_options.cuda_checked = false;  // the tables were checked above (check_launch)
  if (memory == Backend::kCuda) {
    if (options.workspace != nullptr) {
      gathered = static_cast<float*>(options.workspace);
      local_options.workspace = static_cast<char*>(options.workspace) + gathered_bytes;
      local_options.workspace_bytes = options.workspace_bytes - gathered_bytes;
    } else {
      device = detail::cuda::stream_scratch(gathered_bytes, options.cuda_stream);
      gathered = static_cast<float*>(device.get());
    }
  } else {
    host.resize(gathered_bytes / sizeof(float));
    gathered = host.data();
  }
  const std::int64_t block_floats = static_cast<std::int64_t>(block_bytes / sizeof(float));
  float* mine = gathered + rank * block_floats;

  DecodeArgs local = args;
  local.out = mine;
  local.out_dtype = DType::kF32;
  local.out_row_stride = 0;  // the gather block is dense
  local.lse = mine + rows * D;
  if (memory == Backend::kCuda) {
    detail::cuda::decode(local, local_options);
  } else {
    detail::cpu::decode(local, local_options);  // validated above, not again
  }
  if (root < 0) {
    comm.all_gather(mine, gathered, block_bytes, options.cuda_stream);
  } else {
    comm.gather(mine, gathered, block_bytes, root, options.cuda_stream);
    if (rank != root) return;
  }

  MergeStatesArgs m;
  m.num_segments = ranks;
  m.num_rows = static_cast<int>(rows);
  m.head_dim = args.head_dim;
  m.parts = gathered;
  m.part_dtype = DType::kF32;
  m.part_lse = gathered + rows * D;
  m.out = args.out;
  m.out_dtype = args.out_dtype;
  m.lse = args.lse;
  MergeStatesOptions mo;
  mo.backend = memory;
  mo.num_threads = options.num_threads;
  mo.cuda_stream = options.cuda_stream;
  const detail::SegmentStrides strides{block_floats, block_floats};
  if (memory == Backend::kCuda) {
    detail::cuda::merge_states(m, strides, mo);
  } else {
    detail::cpu::merge_states(m, strides, mo);
  }
}

}  // namespace pagedattn
