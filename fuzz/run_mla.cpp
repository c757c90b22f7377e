#include "run_mla.hpp"

#include <cstdint>
#include <vector>

#include "pagedattn/testing/device_memory.hpp"

namespace pagedattn::fuzz {
namespace {

// A host buffer and its device copy; pointers into the one map to the same offset in the other.
struct Copied {
  const std::uint8_t* host = nullptr;
  std::size_t bytes = 0;
  testing::DeviceBuffer device;

  template <typename T>
  Copied(const std::vector<T>& v)  // NOLINT: built from each buffer in turn
      : host(reinterpret_cast<const std::uint8_t*>(v.data())),
        bytes(v.size() * sizeof(T)),
        device(v.data(), v.size() * sizeof(T)) {}
  bool holds(const void* p) const {
    const auto* b = static_cast<const std::uint8_t*>(p);
    return bytes > 0 && b >= host && b < host + bytes;
  }
  void* moved(const void* p) const {
    return static_cast<std::uint8_t*>(device.get()) + (static_cast<const std::uint8_t*>(p) - host);
  }
};

// `p` moved into the device copy of the buffer that holds it (null stays null).
template <typename T>
T* on_device(T* p, const std::vector<Copied>& copies) {
  if (p == nullptr) return nullptr;
  for (const Copied& c : copies) {
    if (c.holds(p)) return static_cast<T*>(c.moved(p));
  }
  return p;  // outside every buffer: the backend refuses it before reading
}

void copy_back(BuiltMla& m, const std::vector<Copied>& copies) {
  testing::device_synchronize();
  testing::copy_to_host(m.out.data(), copies[0].device.get(), m.out.size());
  if (!m.lse.empty()) {
    testing::copy_to_host(m.lse.data(), copies[1].device.get(), m.lse.size() * sizeof(float));
  }
}

void run_cuda(BuiltMla& m, const DecodeOptions& o) {
  std::vector<Copied> copies;
  copies.reserve(9);
  copies.emplace_back(m.out);  // [0] out and [1] lse, copied back
  copies.emplace_back(m.lse);
  for (const auto* v : {&m.q_nope, &m.q_pe, &m.c, &m.kpe}) copies.emplace_back(*v);
  for (const auto* v : {&m.table, &m.lens, &m.indptr}) copies.emplace_back(*v);
  MlaDecodeArgs d = m.args;
  d.q_nope = on_device(d.q_nope, copies);
  d.q_pe = on_device(d.q_pe, copies);
  d.c_cache = on_device(d.c_cache, copies);
  d.kpe_cache = on_device(d.kpe_cache, copies);
  d.block_table = on_device(d.block_table, copies);
  d.context_lens = on_device(d.context_lens, copies);
  d.q_indptr = on_device(d.q_indptr, copies);
  d.out = on_device(d.out, copies);
  d.lse = on_device(d.lse, copies);
  try {
    mla_decode(d, o);
  } catch (...) {
    copy_back(m, copies);
    throw;
  }
  copy_back(m, copies);
}

}  // namespace

void run_mla(Backend backend, BuiltMla& m, int threads, bool batch_invariant, bool checked) {
  DecodeOptions o;
  o.backend = backend;
  o.num_threads = backend == Backend::kCpu ? threads : 0;
  o.batch_invariant = batch_invariant;
  o.cuda_checked = checked;
  if (backend == Backend::kCuda) {
    run_cuda(m, o);
  } else {
    mla_decode(m.args, o);
  }
}

}  // namespace pagedattn::fuzz
