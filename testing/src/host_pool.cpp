#include "pagedattn/testing/host_pool.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <new>
#include <sstream>
#include <utility>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace pagedattn::testing {
namespace {

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

#if defined(__linux__)
// A mapping of `bytes` (a multiple of kHugePageBytes) starting on a huge-page boundary: mmap
// gives only 4 KiB alignment, so one huge page more is mapped and the parts before the boundary
// and past the end are unmapped again.
std::uint8_t* map_aligned(std::size_t bytes) {
  const std::size_t over = bytes + kHugePageBytes;
  void* raw = mmap(nullptr, over, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) throw std::bad_alloc();
  auto* first = static_cast<std::uint8_t*>(raw);
  const auto at = reinterpret_cast<std::uintptr_t>(first);
  auto* start = first + (round_up(at, kHugePageBytes) - at);
  if (start > first) munmap(first, static_cast<std::size_t>(start - first));
  std::uint8_t* end = start + bytes;
  if (end < first + over) munmap(end, static_cast<std::size_t>(first + over - end));
  return start;
}

// AnonHugePages of the smaps entries that overlap [begin, end), each at most its overlap.
std::size_t smaps_huge_bytes(std::uintptr_t begin, std::uintptr_t end) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  std::size_t total = 0;
  std::size_t overlap = 0;  // of the current entry with the range
  while (std::getline(smaps, line)) {
    unsigned long lo = 0, hi = 0;
    unsigned long long kb = 0;
    // An entry's first line starts "lo-hi perms ..."; its fields are "Name: value kB" (the
    // names starting with hex letters stop at their second letter, never at a '-').
    if (std::sscanf(line.c_str(), "%lx-%lx", &lo, &hi) == 2) {
      overlap =
          lo < end && hi > begin ? std::min<std::uintptr_t>(hi, end) - std::max(lo, begin) : 0;
    } else if (overlap > 0 && std::sscanf(line.c_str(), "AnonHugePages: %llu kB", &kb) == 1) {
      total += std::min<std::size_t>(overlap, static_cast<std::size_t>(kb) * 1024);
    }
  }
  return total;
}
#endif

}  // namespace

const char* huge_pages_name(HugePages pages) {
  switch (pages) {
    case HugePages::kOn:
      return "on";
    case HugePages::kOff:
      return "off";
    case HugePages::kDefault:
      break;
  }
  return "default";
}

const char* thp_mode_name(ThpMode mode) {
  switch (mode) {
    case ThpMode::kAlways:
      return "always";
    case ThpMode::kMadvise:
      return "madvise";
    case ThpMode::kNever:
      return "never";
    case ThpMode::kUnavailable:
      break;
  }
  return "unavailable";
}

ThpMode parse_thp_mode(const std::string& text) {
  std::istringstream words(text);
  std::string word;
  while (words >> word) {
    if (word == "[always]") return ThpMode::kAlways;
    if (word == "[madvise]") return ThpMode::kMadvise;
    if (word == "[never]") return ThpMode::kNever;
  }
  return ThpMode::kUnavailable;
}

ThpMode thp_mode(const char* path) {
  std::ifstream file(path);
  std::string text;
  if (!file || !std::getline(file, text)) return ThpMode::kUnavailable;
  return parse_thp_mode(text);
}

HostPool::HostPool(std::size_t bytes, HugePages pages, ThpMode thp) : size_(bytes), pages_(pages) {
  if (bytes == 0) return;
  mapped_ = round_up(bytes, kHugePageBytes);
#if defined(__linux__)
  data_ = map_aligned(mapped_);
  const bool can_matter = thp == ThpMode::kAlways || thp == ThpMode::kMadvise;
  if (pages != HugePages::kDefault && can_matter) {
    // Refused advice (EINVAL: a kernel without THP) leaves plain pages: still a valid pool.
    advised_ =
        madvise(data_, mapped_, pages == HugePages::kOn ? MADV_HUGEPAGE : MADV_NOHUGEPAGE) == 0;
  }
#else
  (void)thp;
  data_ = static_cast<std::uint8_t*>(::operator new(mapped_, std::align_val_t(kHugePageBytes)));
  std::memset(data_, 0, mapped_);
#endif
}

HostPool::HostPool(HostPool&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)),
      size_(std::exchange(o.size_, 0)),
      mapped_(std::exchange(o.mapped_, 0)),
      pages_(o.pages_),
      advised_(std::exchange(o.advised_, false)) {}

HostPool& HostPool::operator=(HostPool&& o) noexcept {
  if (this != &o) {
    release();
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    mapped_ = std::exchange(o.mapped_, 0);
    pages_ = o.pages_;
    advised_ = std::exchange(o.advised_, false);
  }
  return *this;
}

HostPool::~HostPool() { release(); }

void HostPool::release() noexcept {
  if (!data_) return;
#if defined(__linux__)
  munmap(data_, mapped_);
#else
  ::operator delete(data_, std::align_val_t(kHugePageBytes));
#endif
  data_ = nullptr;
  size_ = mapped_ = 0;
}

std::size_t HostPool::huge_page_bytes() const {
#if defined(__linux__)
  if (!data_) return 0;
  const auto begin = reinterpret_cast<std::uintptr_t>(data_);
  return std::min(size_, smaps_huge_bytes(begin, begin + mapped_));
#else
  return 0;
#endif
}

}  // namespace pagedattn::testing
