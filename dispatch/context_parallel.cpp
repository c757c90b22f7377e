// context_parallel_decode(): every rank validates its own share, the ranks exchange a header
// (shapes and whether their validation passed) so that a bad argument on one rank is an error on
// all of them instead of a hang, then each decodes its share into f32 (out, lse), the states are
// all-gathered and merged in rank order (merge_states), so every rank computes the same bits.
#include "pagedattn/context_parallel.hpp"

#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "pagedattn/detail/backends.hpp"
#include "pagedattn/validate.hpp"

namespace pagedattn {
namespace {

// What every rank tells the others before any work: the shapes the merge depends on, and
// whether its own arguments passed validation.
struct Header {
  std::int32_t ok, batch, num_heads, head_dim;
};

}  // namespace

void context_parallel_decode(const DecodeArgs& args, Communicator& comm,
                             const DecodeOptions& options) {
  const int ranks = comm.size();
  // Local validation; its error is rethrown after the header exchange, when every rank knows.
  std::exception_ptr local_error;
  try {
    validate_options(options);
    const Backend backend = resolve_backend(options.backend);
    if (backend != comm.memory()) {
      fail(ErrorCode::kInvalidArgument, "backend", backend_name(backend),
           std::string("must be the communicator's memory, ") + backend_name(comm.memory()));
    }
    if (backend == Backend::kCuda) {
      fail(ErrorCode::kUnsupported, "backend", "cuda",
           "context-parallel decode runs on the CPU backend (no communicator over device "
           "memory)");
    }
    validate_shapes(args);
    if (args.batch > 0) validate_tables(args, args.context_lens, args.block_table);
  } catch (const Error&) {
    local_error = std::current_exception();
  }
  const Header mine{local_error ? 0 : 1, args.batch, args.num_heads, args.head_dim};
  std::vector<Header> all(ranks);
  comm.all_gather(&mine, all.data(), sizeof(Header), options.cuda_stream);
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
  }
  if (args.batch == 0) return;

  // This rank's share in f32, then every rank's, then the merge in rank order.
  const std::int64_t rows = static_cast<std::int64_t>(args.batch) * args.num_heads;
  const std::int64_t D = args.head_dim;
  std::vector<float> out(rows * D), lse(rows);
  DecodeArgs local = args;
  local.out = out.data();
  local.out_dtype = DType::kF32;
  local.lse = lse.data();
  detail::cpu::decode(local, detail::DecodeOptions(options));  // validated above, not again
  std::vector<float> parts(ranks * rows * D), part_lse(ranks * rows);
  comm.all_gather(out.data(), parts.data(), sizeof(float) * rows * D, options.cuda_stream);
  comm.all_gather(lse.data(), part_lse.data(), sizeof(float) * rows, options.cuda_stream);

  MergeStatesArgs m;
  m.num_segments = ranks;
  m.num_rows = static_cast<int>(rows);
  m.head_dim = args.head_dim;
  m.parts = parts.data();
  m.part_dtype = DType::kF32;
  m.part_lse = part_lse.data();
  m.out = args.out;
  m.out_dtype = args.out_dtype;
  m.lse = args.lse;
  MergeStatesOptions mo;
  mo.backend = Backend::kCpu;
  mo.num_threads = options.num_threads;
  merge_states(m, mo);
}

}  // namespace pagedattn
