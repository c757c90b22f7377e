// testing::HostPool, the 2 MiB-aligned K/V pool of the benchmark and the simulator: aligned,
// sized, zeroed and writable whatever huge pages it asks for and whatever the system's policy
// is, never failing for want of huge pages, and unmapped when destroyed.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "pagedattn/testing/host_pool.hpp"

#if defined(__linux__)
#include <errno.h>
#include <sys/mman.h>
#endif

namespace pagedattn::testing {
namespace {

const HugePages kAllPages[] = {HugePages::kDefault, HugePages::kOn, HugePages::kOff};
const ThpMode kAllModes[] = {ThpMode::kAlways, ThpMode::kMadvise, ThpMode::kNever,
                             ThpMode::kUnavailable};

// Every byte reads 0, then holds what was written to it.
void expect_zeroed_and_writable(const HostPool& pool) {
  std::uint8_t* p = pool.data();
  std::size_t nonzero = 0;
  for (std::size_t i = 0; i < pool.size(); ++i) nonzero += p[i] != 0;
  EXPECT_EQ(nonzero, 0u);
  for (std::size_t i = 0; i < pool.size(); ++i) p[i] = static_cast<std::uint8_t>(i * 7 + 1);
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < pool.size(); ++i) {
    wrong += p[i] != static_cast<std::uint8_t>(i * 7 + 1);
  }
  EXPECT_EQ(wrong, 0u);
}

#if defined(__linux__)
// Whether the page at p is mapped in this process (mincore fails with ENOMEM on unmapped memory).
bool mapped(const void* p) {
  unsigned char resident = 0;
  void* page = reinterpret_cast<void*>(reinterpret_cast<std::uintptr_t>(p) & ~std::uintptr_t{4095});
  return mincore(page, 1, &resident) == 0 || errno != ENOMEM;
}
#endif

TEST(HostPool, AlignedSizedZeroedWritable) {
  const std::size_t sizes[] = {1, 4096 + 3, kHugePageBytes, 5 * kHugePageBytes + 7};
  for (const HugePages pages : kAllPages) {
    for (const ThpMode mode : kAllModes) {
      for (const std::size_t bytes : sizes) {
        SCOPED_TRACE(std::string(huge_pages_name(pages)) + " under " + thp_mode_name(mode) + ", " +
                     std::to_string(bytes) + " bytes");
        const HostPool pool(bytes, pages, mode);
        ASSERT_NE(pool.data(), nullptr);
        EXPECT_EQ(reinterpret_cast<std::uintptr_t>(pool.data()) % kHugePageBytes, 0u);
        EXPECT_EQ(pool.size(), bytes);
        EXPECT_EQ(pool.pages(), pages);
        expect_zeroed_and_writable(pool);
        EXPECT_LE(pool.huge_page_bytes(), bytes);
      }
    }
  }
}

// Under a policy of "never", or with no THP at all, no advice is given and the pool is plain
// memory: the allocation does not fail.
TEST(HostPool, NoHugePagesIsNoError) {
  for (const ThpMode mode : {ThpMode::kNever, ThpMode::kUnavailable}) {
    const HostPool pool(3 * kHugePageBytes, HugePages::kOn, mode);
    EXPECT_FALSE(pool.advised()) << thp_mode_name(mode);
    expect_zeroed_and_writable(pool);
  }
  const HostPool plain(kHugePageBytes, HugePages::kDefault, ThpMode::kMadvise);
  EXPECT_FALSE(plain.advised());  // no advice asked for
}

// Where the system has THP, the kernel accepts both pieces of advice; a pool that refused huge
// pages has none, whatever the policy.
TEST(HostPool, AdviceOnThisSystem) {
  const ThpMode mode = thp_mode();
  const bool thp = mode == ThpMode::kAlways || mode == ThpMode::kMadvise;
  for (const HugePages pages : {HugePages::kOn, HugePages::kOff}) {
    HostPool pool(4 * kHugePageBytes, pages);
    expect_zeroed_and_writable(pool);
#if defined(__linux__)
    EXPECT_EQ(pool.advised(), thp) << huge_pages_name(pages) << " under " << thp_mode_name(mode);
#endif
    if (pages == HugePages::kOff) {
      EXPECT_EQ(pool.huge_page_bytes(), 0u);
    }
  }
}

TEST(HostPool, EmptyPool) {
  const HostPool pool(0, HugePages::kOn);
  EXPECT_EQ(pool.data(), nullptr);
  EXPECT_EQ(pool.size(), 0u);
  EXPECT_EQ(pool.huge_page_bytes(), 0u);
  const HostPool unset;
  EXPECT_EQ(unset.data(), nullptr);
}

TEST(HostPool, MovedAndFreed) {
  HostPool a(kHugePageBytes + 1, HugePages::kOn);
  std::uint8_t* const p = a.data();
  p[0] = 42;
  HostPool b(std::move(a));
  EXPECT_EQ(a.data(), nullptr);
  EXPECT_EQ(a.size(), 0u);
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(b.size(), kHugePageBytes + 1);
  EXPECT_EQ(b.data()[0], 42);
  HostPool c(4096, HugePages::kOff);
  std::uint8_t* const q = c.data();
  c = std::move(b);  // c's own pool is freed, b's moves in
  EXPECT_EQ(c.data(), p);
  EXPECT_EQ(b.data(), nullptr);
#if defined(__linux__)
  EXPECT_FALSE(mapped(q));
  EXPECT_TRUE(mapped(p));
  c = HostPool();
  EXPECT_FALSE(mapped(p));
  std::uint8_t* last = nullptr;
  {
    const HostPool scoped(3 * kHugePageBytes, HugePages::kOn);
    last = scoped.data() + 3 * kHugePageBytes - 1;
    *last = 1;
    EXPECT_TRUE(mapped(last));
  }
  EXPECT_FALSE(mapped(last));  // the destructor unmapped the whole pool
#else
  (void)q;
#endif
}

TEST(HostPool, ThpModeFromPolicyText) {
  EXPECT_EQ(parse_thp_mode("always [madvise] never"), ThpMode::kMadvise);
  EXPECT_EQ(parse_thp_mode("[always] madvise never\n"), ThpMode::kAlways);
  EXPECT_EQ(parse_thp_mode("always madvise [never]"), ThpMode::kNever);
  EXPECT_EQ(parse_thp_mode("always madvise never"), ThpMode::kUnavailable);
  EXPECT_EQ(parse_thp_mode(""), ThpMode::kUnavailable);
  EXPECT_EQ(parse_thp_mode("[sometimes] never"), ThpMode::kUnavailable);
  EXPECT_EQ(thp_mode("/nonexistent/transparent_hugepage/enabled"), ThpMode::kUnavailable);
  const std::string path = ::testing::TempDir() + "pagedattn_thp_enabled";
  std::FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs("always madvise [never]\n", f);
  std::fclose(f);
  EXPECT_EQ(thp_mode(path.c_str()), ThpMode::kNever);
  std::remove(path.c_str());
  EXPECT_STREQ(thp_mode_name(ThpMode::kMadvise), "madvise");
  EXPECT_STREQ(huge_pages_name(HugePages::kOff), "off");
}

}  // namespace
}  // namespace pagedattn::testing
