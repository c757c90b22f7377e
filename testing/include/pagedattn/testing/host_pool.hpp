// Host memory for a paged K/V cache pool, as the benchmark and the simulator allocate it: one
// anonymous mapping whose start is aligned to a 2 MiB huge page, with transparent huge pages
// asked for (madvise MADV_HUGEPAGE) or refused (MADV_NOHUGEPAGE) on Linux. Decode reads blocks of
// a few to 64 KB at scattered places of a pool of gigabytes: with 4 KiB pages nearly every block
// needs a page walk of its own, with 2 MiB pages one TLB entry covers many blocks. The advice is
// only advice: where the kernel has no THP, or its policy is "never", the pool is plain memory
// and nothing fails. docs/cpu.md ("Huge pages") says what it is worth and how callers who
// allocate their own pools get the same.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace pagedattn::testing {

// What a pool asks of the kernel for its pages.
enum class HugePages {
  kDefault,  // no advice: the system's policy decides (THP "always" gives huge pages)
  kOn,       // MADV_HUGEPAGE: huge pages where the policy is "always" or "madvise"
  kOff,      // MADV_NOHUGEPAGE: 4 KiB pages, even under "always"
};
const char* huge_pages_name(HugePages pages);  // "default", "on", "off"

// The system's transparent huge page policy.
enum class ThpMode { kAlways, kMadvise, kNever, kUnavailable };
const char* thp_mode_name(ThpMode mode);  // "always", "madvise", "never", "unavailable"

constexpr const char* kThpEnabledPath = "/sys/kernel/mm/transparent_hugepage/enabled";
constexpr std::size_t kHugePageBytes = std::size_t{2} << 20;

// The bracketed choice of the policy file's text ("always [madvise] never" is kMadvise);
// kUnavailable when no known choice is bracketed.
ThpMode parse_thp_mode(const std::string& text);
// The policy read from `path` (by default the kernel's); kUnavailable where it cannot be read (a
// kernel without THP, a system other than Linux).
ThpMode thp_mode(const char* path = kThpEnabledPath);

// One pool of `bytes` zeroed bytes, freed on destruction. Its start is aligned to
// kHugePageBytes and its mapping is a whole number of huge pages, so every part of it can be
// a huge page. Allocation failure is std::bad_alloc; the advice never fails the allocation.
class HostPool {
 public:
  HostPool() = default;
  // `thp` is the policy the pool takes the system to have: under kNever or kUnavailable no advice
  // is given (it could not change anything).
  HostPool(std::size_t bytes, HugePages pages, ThpMode thp = thp_mode());
  HostPool(const HostPool&) = delete;
  HostPool& operator=(const HostPool&) = delete;
  HostPool(HostPool&& o) noexcept;
  HostPool& operator=(HostPool&& o) noexcept;
  ~HostPool();

  std::uint8_t* data() const { return data_; }  // null for an empty pool
  std::size_t size() const { return size_; }
  HugePages pages() const { return pages_; }
  // Whether the advice (kOn or kOff) was given and the kernel accepted it.
  bool advised() const { return advised_; }
  // Bytes of the pool backed by huge pages now, at most size(): the AnonHugePages of the
  // mappings of /proc/self/smaps that overlap the pool (a neighbouring pool the kernel merged
  // into the same mapping may count too); 0 where smaps cannot be read. It reads the whole
  // file: for reports, not for loops.
  std::size_t huge_page_bytes() const;

 private:
  void release() noexcept;

  std::uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
  std::size_t mapped_ = 0;  // bytes of the mapping: size_ rounded up to huge pages
  HugePages pages_ = HugePages::kDefault;
  bool advised_ = false;
};

}  // namespace pagedattn::testing
