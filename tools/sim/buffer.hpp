// Buffers that live where the backend runs (host or device memory), and the cheap random values
// the simulator fills its tokens with.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "pagedattn/testing/device_memory.hpp"
#include "pagedattn/testing/host_pool.hpp"

namespace pagedattn::sim {

// Bytes in host memory (CPU backend) or device memory (CUDA backend), one interface. A K/V
// cache (`cache_pool`) lives on the host in a pool with transparent huge pages asked for
// (testing::HostPool): its blocks are read at scattered places. The other buffers are small and
// stay ordinary vectors, where a 2 MiB page would be mostly waste.
class Buffer {
 public:
  explicit Buffer(bool device, bool cache_pool = false) : device_(device), pool_(cache_pool) {}
  void* data() { return device_ ? dev_.get() : pool_ ? pages_.data() : host_.data(); }
  std::size_t size() const { return device_ ? dev_.size() : pool_ ? pages_.size() : host_.size(); }
  void resize(std::size_t bytes, int fill_byte = 0) {  // contents are lost
    if (device_) {
      dev_ = testing::DeviceBuffer(bytes);
      if (bytes) testing::device_fill(dev_.get(), fill_byte, bytes);
    } else if (pool_) {
      pages_ = testing::HostPool();  // the old pool is gone before the new one is mapped
      pages_ = testing::HostPool(bytes, testing::HugePages::kOn);
      if (bytes) std::memset(pages_.data(), fill_byte, bytes);
    } else {
      host_.assign(bytes, static_cast<std::uint8_t>(fill_byte));
    }
  }
  // Bytes of a host cache pool backed by huge pages (0 for other buffers).
  std::size_t huge_page_bytes() const { return pool_ ? pages_.huge_page_bytes() : 0; }
  void reserve(std::size_t bytes) {
    if (size() < bytes) resize(std::max(bytes, 2 * size()));
  }
  void upload(const void* src, std::size_t bytes) {
    reserve(bytes);
    if (device_)
      testing::copy_to_device(dev_.get(), src, bytes);
    else
      std::memcpy(host_.data(), src, bytes);
  }
  void download(void* dst, std::size_t bytes, std::size_t offset = 0) {
    const auto* src = static_cast<const std::uint8_t*>(data()) + offset;
    if (device_)
      testing::copy_to_host(dst, src, bytes);
    else
      std::memcpy(dst, src, bytes);
  }

 private:
  bool device_;
  bool pool_;
  std::vector<std::uint8_t> host_;
  testing::HostPool pages_;
  testing::DeviceBuffer dev_;
};

// Cheap uniform values in [-1, 1) for K, V and q: the simulator writes a lot of them.
struct FastRandom {
  std::uint64_t s;
  std::uint64_t next_u64() {  // xorshift64*
    s ^= s >> 12, s ^= s << 25, s ^= s >> 27;
    return s * 0x2545F4914F6CDD1DULL;
  }
  float next() { return static_cast<float>(next_u64() >> 40) * (2.0f / 16777216.0f) - 1.0f; }
  void fill(std::vector<float>& v, std::size_t n, float scale) {
    v.resize(n);
    for (float& x : v) x = scale * next();
  }
};

}  // namespace pagedattn::sim
