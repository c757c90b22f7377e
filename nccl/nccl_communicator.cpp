// Communicators over NCCL (nccl_communicator.hpp). all_gather is ncclAllGather of bytes
// (in place when the caller's send buffer is its own slot of recv); gather is a group of
// ncclSend to the root and ncclRecv at the root, one per peer.
#include "pagedattn/nccl_communicator.hpp"

#include <nccl.h>

#include <algorithm>
#include <string>
#include <vector>

#include "pagedattn/error.hpp"

namespace pagedattn {
namespace {

void check_nccl(ncclResult_t r, ncclComm_t comm, const char* what) {
  if (r == ncclSuccess) return;
  std::string msg = std::string(what) + " failed: " + ncclGetErrorString(r);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') msg += std::string(" (") + last + ")";
  fail(ErrorCode::kDeviceError, "nccl", what, msg);
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, bool owned) : comm_(comm), owned_(owned) {
    check_nccl(ncclCommUserRank(comm_, &rank_), comm_, "ncclCommUserRank");
    check_nccl(ncclCommCount(comm_, &size_), comm_, "ncclCommCount");
  }
  ~NcclCommunicator() override {
    if (owned_) ncclCommDestroy(comm_);
  }
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Backend memory() const override { return Backend::kCuda; }

  void all_gather(const void* send, void* recv, std::size_t bytes, void* stream) override {
    if (bytes == 0) return;
    check_nccl(
        ncclAllGather(send, recv, bytes, ncclUint8, comm_, static_cast<cudaStream_t>(stream)),
        comm_, "ncclAllGather");
  }

  void gather(const void* send, void* recv, std::size_t bytes, int root, void* stream) override {
    if (root < 0 || root >= size_) {
      fail(ErrorCode::kInvalidArgument, "root", root, "is not a rank of the group");
    }
    if (bytes == 0) return;
    const auto s = static_cast<cudaStream_t>(stream);
    check_nccl(ncclGroupStart(), comm_, "ncclGroupStart");
    ncclResult_t r = ncclSuccess;
    if (rank_ == root) {
      for (int peer = 0; peer < size_ && r == ncclSuccess; ++peer) {
        char* slot = static_cast<char*>(recv) + peer * bytes;
        if (peer == rank_) {
          // NCCL sends to itself within a group; skipped when the data is in place already.
          if (slot != send) r = ncclSend(send, bytes, ncclUint8, peer, comm_, s);
          if (slot != send && r == ncclSuccess)
            r = ncclRecv(slot, bytes, ncclUint8, peer, comm_, s);
        } else {
          r = ncclRecv(slot, bytes, ncclUint8, peer, comm_, s);
        }
      }
    } else {
      r = ncclSend(send, bytes, ncclUint8, root, comm_, s);
    }
    const ncclResult_t end = ncclGroupEnd();
    check_nccl(r, comm_, "ncclSend/ncclRecv");
    check_nccl(end, comm_, "ncclGroupEnd");
  }

 private:
  ncclComm_t comm_;
  bool owned_;
  int rank_ = 0, size_ = 0;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(ncclComm* comm) {
  if (comm == nullptr) fail(ErrorCode::kInvalidArgument, "comm", "null", "must not be null");
  return std::make_unique<NcclCommunicator>(comm, /*owned=*/false);
}

std::vector<std::unique_ptr<Communicator>> make_nccl_group(const std::vector<int>& devices) {
  if (devices.empty()) fail(ErrorCode::kInvalidArgument, "devices", "{}", "must not be empty");
  for (std::size_t i = 0; i < devices.size(); ++i) {
    if (devices[i] < 0) fail(ErrorCode::kInvalidArgument, "devices", devices[i], "is negative");
    if (std::count(devices.begin(), devices.end(), devices[i]) > 1) {
      fail(ErrorCode::kInvalidArgument, "devices", devices[i], "appears more than once");
    }
  }
  std::vector<ncclComm_t> comms(devices.size(), nullptr);
  check_nccl(ncclCommInitAll(comms.data(), static_cast<int>(devices.size()), devices.data()),
             nullptr, "ncclCommInitAll");
  std::vector<std::unique_ptr<Communicator>> group;
  group.reserve(comms.size());  // push_back cannot throw below
  try {
    for (ncclComm_t c : comms) {
      group.push_back(std::make_unique<NcclCommunicator>(c, /*owned=*/true));
    }
  } catch (...) {
    // The communicators not yet owned by a wrapper (the one whose wrapper failed included).
    for (std::size_t i = group.size(); i < comms.size(); ++i) ncclCommDestroy(comms[i]);
    throw;
  }
  return group;
}

std::string nccl_version() {
  int v = 0;
  check_nccl(ncclGetVersion(&v), nullptr, "ncclGetVersion");
  // NCCL >= 2.9 encodes major * 10000 + minor * 100 + patch.
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
         std::to_string(v % 100);
}

}  // namespace pagedattn
