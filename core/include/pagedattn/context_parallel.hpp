// Context-parallel decode: the blocks of every sequence's context are shared out among the ranks
// of a group (each rank holds some of them, any way: ranges, strides, uneven, none), each rank
// decodes its share with lse, the ranks exchange their (out, lse) and merge them
// (merge_states), and every rank (or one root rank) gets the decode of the whole contexts. The
// exchange goes through a Communicator: make_local_group() gives one for threads of one process
// (host memory, the CPU backend: tests and CI run the whole protocol without GPUs);
// pagedattn/nccl_communicator.hpp gives one over NCCL (device memory, the CUDA backend). See
// docs/context_parallel.md.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "pagedattn/merge_states.hpp"
#include "pagedattn/pagedattn.hpp"

namespace pagedattn {

// What context-parallel decode needs from a group of ranks. Every rank calls the collectives in
// the same order with the same sizes (a rank that stops early leaves the others waiting, as with
// any collective library).
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Where the buffers of the collectives live: kCpu (host memory) or kCuda (device memory).
  virtual Backend memory() const = 0;
  // Gathers `bytes` bytes from every rank: recv (size() * bytes) gets rank r's at r * bytes.
  // send may be recv + rank() * bytes (in place). `stream` is a cudaStream_t for device memory,
  // ignored for host memory; device-memory collectives are enqueued on it, not waited for.
  virtual void all_gather(const void* send, void* recv, std::size_t bytes, void* stream) = 0;
  // As all_gather, but only `root`'s recv is written (the others' is left as it was). recv
  // holds size() * bytes on every rank. The default is all_gather.
  virtual void gather(const void* send, void* recv, std::size_t bytes, int root, void* stream) {
    (void)root;
    all_gather(send, recv, bytes, stream);
  }
};

// `ranks` communicators over host memory for `ranks` threads of this process: rank i is
// element i; each must be used by one thread. Throws on ranks < 1.
std::vector<std::unique_ptr<Communicator>> make_local_group(int ranks);

struct ContextParallelOptions {
  // -1: every rank gets the result (the states are all-gathered). r in [0, ranks): only rank r
  // does (the states are gathered to it, the other ranks' out and lse are not written).
  int root = -1;
  // Whether the ranks exchange a header (shapes, and whether each rank's arguments passed
  // validation) before the decode, so that a bad argument on one rank, or shapes that differ
  // between ranks, is an error on every rank instead of a hang. Over host memory the header is
  // always exchanged. Over device memory it is exchanged only when this is set, because it waits
  // for the stream (a host round trip: no CUDA-graph capture); without it each rank validates
  // only its own arguments.
  bool check_group = false;
};

// One rank's call. `args` describe this rank's share: its cache (or the shared pool), a block
// table listing, per sequence, the blocks it holds in context order, and context_lens counting
// their tokens (a sequence's last, partial block belongs to the rank holding it, as the last
// entry of its row). q, batch, num_heads, head_dim, the dtypes and out / lse are the same shape
// on every rank; every rank (or the root) gets out (and lse) of the whole contexts, the same bits
// on every rank. options.backend must match comm.memory(). On CUDA everything is enqueued on
// options.cuda_stream with no host synchronization (unless check_group). With a workspace
// (options.workspace, context_parallel_workspace_size() bytes) nothing is allocated, so a step
// can be captured in a CUDA graph; without one, the gathered states and the decode's workspace
// come stream-ordered from the library's memory pool. Throws pagedattn::Error naming the argument
// on bad input, before anything is written.
void context_parallel_decode(const DecodeArgs& args, Communicator& comm,
                             const DecodeOptions& options = {},
                             const ContextParallelOptions& cp_options = {});

// Bytes of the states a rank sends per step (its f32 out and lse): batch * num_heads *
// (head_dim + 1) * 4, rounded up to 256 (every rank's block starts aligned). A rank receives
// `ranks - 1` times this (all-gather), or the root does (gather).
std::size_t context_parallel_state_bytes(const DecodeArgs& args);

// Device workspace bytes of one CUDA context-parallel step over `ranks` ranks on the current
// device: the gathered states plus the local decode's workspace (cuda_workspace_size). Like that,
// it depends on shapes only, so one workspace serves every step of the same shapes.
std::size_t context_parallel_workspace_size(const DecodeArgs& args, int ranks);
// The same for a step with these options (a batch-invariant one needs more, as
// cuda_workspace_size(args, options) says).
std::size_t context_parallel_workspace_size(const DecodeArgs& args, int ranks,
                                            const DecodeOptions& options);

}  // namespace pagedattn
