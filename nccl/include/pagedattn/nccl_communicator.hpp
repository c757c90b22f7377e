// Communicators over NCCL for context-parallel decode on the CUDA backend
// (pagedattn/context_parallel.hpp). Part of the pagedattn::nccl library, built when NCCL is found
// (PAGEDATTN_NCCL=AUTO|ON|OFF); the pagedattn library itself does not depend on NCCL.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "pagedattn/context_parallel.hpp"

struct ncclComm;  // NCCL's communicator (ncclComm_t is ncclComm*)

namespace pagedattn {

// A Communicator over an NCCL communicator the caller made (ncclCommInitRank and friends, one
// process or thread per GPU); the caller keeps it and destroys it after the returned object.
// memory() is kCuda: the buffers are device memory of the communicator's GPU, and the
// collectives are enqueued on the stream they are given, never waited for. Throws
// pagedattn::Error (kInvalidArgument) on a null communicator, kDeviceError when NCCL fails.
std::unique_ptr<Communicator> make_nccl_communicator(ncclComm* comm);

// One communicator per GPU for threads of this process (ncclCommInitAll): rank i runs on
// devices[i] and owns its NCCL communicator. Each rank must be used by one thread whose current
// device is devices[i]. Throws on an empty list, a repeated device, or an NCCL error.
std::vector<std::unique_ptr<Communicator>> make_nccl_group(const std::vector<int>& devices);

// The version of the NCCL library in use, e.g. "2.28.9".
std::string nccl_version();

}  // namespace pagedattn
