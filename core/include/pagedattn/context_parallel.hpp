// Context-parallel decode: the blocks of every sequence's context are shared out among the ranks
// of a group (each rank holds some of them, any way: ranges, strides, uneven, none), each rank
// decodes its share with lse, the ranks exchange their (out, lse) and merge them
// (merge_states), and every rank gets the decode of the whole contexts. The exchange goes
// through a Communicator: make_local_group() gives one for threads of one process (host memory,
// the CPU backend: tests and CI run the whole protocol without GPUs). See
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
  // Where the buffers of all_gather live: kCpu (host memory) or kCuda (device memory).
  virtual Backend memory() const = 0;
  // Gathers `bytes` bytes from every rank: recv (size() * bytes) gets rank r's at r * bytes.
  // `stream` is a cudaStream_t for device memory, ignored for host memory.
  virtual void all_gather(const void* send, void* recv, std::size_t bytes, void* stream) = 0;
};

// `ranks` communicators over host memory for `ranks` threads of this process: rank i is
// element i; each must be used by one thread. Throws on ranks < 1.
std::vector<std::unique_ptr<Communicator>> make_local_group(int ranks);

// One rank's call. `args` describe this rank's share: its cache (or the shared pool), a block
// table listing, per sequence, the blocks it holds in context order, and context_lens counting
// their tokens (a sequence's last, partial block belongs to the rank holding it, as the last
// entry of its row). q, batch, num_heads, head_dim, the dtypes and out / lse are the same shape
// on every rank; every rank gets out (and lse) of the whole contexts, identical on every rank.
// options.backend must match comm.memory(). Throws pagedattn::Error naming the argument on bad
// input, before anything is written; shapes that differ between ranks are an error on every
// rank (they are exchanged first).
void context_parallel_decode(const DecodeArgs& args, Communicator& comm,
                             const DecodeOptions& options = {});

}  // namespace pagedattn
