// make_local_group(): communicators for threads of one process over host memory. all_gather is
// two barriers: every rank posts its send buffer, every rank copies all of them into its recv,
// and no rank leaves (and may reuse its send buffer) before every copy is done; gather is the
// same with only the root copying.
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "pagedattn/context_parallel.hpp"
#include "pagedattn/error.hpp"

namespace pagedattn {
namespace {

struct SharedState {
  explicit SharedState(int n) : ranks(n), sends(n, nullptr), sizes(n, 0) {}
  const int ranks;
  std::mutex mutex;
  std::condition_variable cv;
  int arrived = 0;
  long long generation = 0;
  std::vector<const void*> sends;
  std::vector<std::size_t> sizes;

  // Blocks until every rank has called it (reusable: generations).
  void barrier(std::unique_lock<std::mutex>& lock) {
    const long long gen = generation;
    if (++arrived == ranks) {
      arrived = 0;
      ++generation;
      cv.notify_all();
      return;
    }
    cv.wait(lock, [&] { return generation != gen; });
  }
};

class LocalCommunicator final : public Communicator {
 public:
  LocalCommunicator(std::shared_ptr<SharedState> s, int rank) : s_(std::move(s)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return s_->ranks; }
  Backend memory() const override { return Backend::kCpu; }

  void all_gather(const void* send, void* recv, std::size_t bytes, void*) override {
    exchange(send, recv, bytes, /*copy=*/true);
  }

  void gather(const void* send, void* recv, std::size_t bytes, int root, void*) override {
    if (root < 0 || root >= s_->ranks) {
      fail(ErrorCode::kInvalidArgument, "root", root, "is not a rank of the group");
    }
    exchange(send, recv, bytes, /*copy=*/rank_ == root);
  }

 private:
  // Posts `send`, waits for every rank, copies every rank's buffer into recv when `copy`, and
  // waits again so that no send buffer is reused while another rank still reads it.
  void exchange(const void* send, void* recv, std::size_t bytes, bool copy) {
    std::unique_lock<std::mutex> lock(s_->mutex);
    s_->sends[rank_] = send;
    s_->sizes[rank_] = bytes;
    s_->barrier(lock);
    // Every rank sees the same sizes, so a mismatch is an error on every rank alike.
    bool same = true;
    for (int r = 0; r < s_->ranks; ++r) same = same && s_->sizes[r] == bytes;
    if (same && copy) {
      lock.unlock();
      for (int r = 0; r < s_->ranks; ++r) {
        char* to = static_cast<char*>(recv) + r * bytes;
        if (bytes && to != s_->sends[r]) std::memcpy(to, s_->sends[r], bytes);  // in place: skip
      }
      lock.lock();
    }
    s_->barrier(lock);
    if (!same) {
      fail(ErrorCode::kInvalidArgument, "bytes", bytes,
           "collective sizes differ between the ranks of the group");
    }
  }

  std::shared_ptr<SharedState> s_;
  int rank_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_local_group(int ranks) {
  if (ranks < 1) fail(ErrorCode::kInvalidArgument, "ranks", ranks, "must be at least 1");
  auto shared = std::make_shared<SharedState>(ranks);
  std::vector<std::unique_ptr<Communicator>> group;
  for (int r = 0; r < ranks; ++r) group.push_back(std::make_unique<LocalCommunicator>(shared, r));
  return group;
}

}  // namespace pagedattn
