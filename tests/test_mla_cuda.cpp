// MLA decode on the CUDA backend (pagedattn/mla.hpp, cuda/mla/, and on sm_90 the 64-row kernel of
// cuda/hopper/mla_many_rows.cu where it serves; PAGEDATTN_MLA_KERNEL=mma runs the 16-row one
// there): the kernels against the f64
// reference over heads (one to several 16-row chunks, and a partial one), query tokens, block
// sizes (1 to 256, dividing 64 or not), cache dtypes (bf16, f16, fp8 e4m3 and e5m2 with a scale),
// output dtypes, latent widths, the two-part and the combined cache with padded rows, and long
// contexts split over CTAs; NaN in every slot no query reads; one split against the default plan;
// bitwise batch invariance; a caller workspace; checked mode's refusal of bad tables; and what the
// kernel refuses before any launch. Each test skips without a device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "bad_input.hpp"
#include "cuda_device.hpp"
#include "mla_case.hpp"
#include "pagedattn/detail/dispatch.hpp"
#include "pagedattn/testing/device_memory.hpp"
#include "test_seed.hpp"

namespace pagedattn {
namespace {

using namespace mla_testing;  // NOLINT(google-build-using-namespace)
using testing::DeviceBuffer;

// A case's tensors on the device; args() points an MlaDecodeArgs at them.
struct DeviceMla {
  DeviceBuffer q_nope, q_pe, c, kpe, table, lens, indptr, out, lse;
  explicit DeviceMla(const MlaCase& m)
      : q_nope(m.q_nope.data(), m.q_nope.size()),
        q_pe(m.q_pe.data(), m.q_pe.size()),
        c(m.c.data(), m.c.size()),
        kpe(m.kpe.data(), m.kpe.size()),
        table(m.table.data(), m.table.size() * 4),
        lens(m.lens.data(), m.lens.size() * 4),
        indptr(m.indptr.data(), m.indptr.size() * 4),
        out(m.out.data(), m.out.size()),
        lse(m.lse.data(), m.lse.size() * 4) {}
  MlaDecodeArgs args(MlaCase& m) const {
    MlaDecodeArgs a = m.args();
    const auto shift = [](const void* host_base, const void* host_at, const DeviceBuffer& dev) {
      return dev.as<char>() +
             (static_cast<const char*>(host_at) - static_cast<const char*>(host_base));
    };
    a.q_nope = q_nope.get();
    a.q_pe = q_pe.get();
    a.c_cache = c.get();
    a.kpe_cache = m.spec.combined ? shift(m.c.data(), a.kpe_cache, c) : kpe.get();
    a.block_table = table.as<std::int32_t>();
    a.context_lens = lens.as<std::int32_t>();
    if (a.q_indptr != nullptr) a.q_indptr = indptr.as<std::int32_t>();
    a.out = out.get();
    a.lse = lse.as<float>();
    return a;
  }
  void fetch(MlaCase& m) const {
    out.to_host(m.out);
    lse.to_host(m.lse);
  }
};

void run_cuda(MlaCase& m, const detail::DecodeOptions& extra = {}) {
  DeviceMla d(m);
  detail::DecodeOptions o = extra;
  o.backend = Backend::kCuda;
  detail::mla_decode(d.args(m), o);
  testing::device_synchronize();
  d.fetch(m);
}

// ---- The kernel against the reference. ----

struct CudaParam {
  DType q_dtype, kv_dtype, out_dtype;
  int heads, q_len, block_size, rank, rope;
  bool combined;
};
void PrintTo(const CudaParam& p, std::ostream* os) {
  *os << "q" << dtype_name(p.q_dtype) << "_kv" << dtype_name(p.kv_dtype) << "_out"
      << dtype_name(p.out_dtype) << "_h" << p.heads << "_q" << p.q_len << "_bs" << p.block_size
      << "_r" << p.rank << "_p" << p.rope << (p.combined ? "_combined" : "_parts");
}

class MlaCudaGrid : public ::testing::TestWithParam<CudaParam> {};

TEST_P(MlaCudaGrid, MatchesTheReference) {
  SKIP_WITHOUT_CUDA();
  const CudaParam& p = GetParam();
  MlaSpec s;
  s.q_dtype = p.q_dtype;
  s.kv_dtype = p.kv_dtype;
  s.out_dtype = p.out_dtype;
  s.heads = p.heads;
  s.block_size = p.block_size;
  s.rank = p.rank;
  s.rope = p.rope;
  s.lens = {0, 1, 63, 300, 17, 1500};
  if (p.q_len > 1) s.q_lens = {p.q_len, 1, p.q_len, p.q_len, 0, p.q_len};
  s.combined = p.combined;
  s.row_pad = 16;  // 16 bytes or more: every latent row and part stays 16-byte aligned
  s.seed = testing::seed_for_test();
  MlaCase m = make_mla_case(s);
  const ReferenceResult ref = mla_reference_decode(m.args());
  run_cuda(m);
  std::ostringstream what;
  PrintTo(p, &what);
  expect_matches(m, ref, what.str());
}

std::vector<CudaParam> cuda_grid() {
  constexpr DType bf16 = DType::kBF16, f16 = DType::kF16, f32 = DType::kF32;
  constexpr DType e4m3 = DType::kFP8E4M3, e5m2 = DType::kFP8E5M2;
  std::vector<CudaParam> g;
  for (DType kv : {bf16, e4m3}) {
    for (int heads : {16, 128}) {
      for (int q : {1, 2}) {
        for (int bs : {1, 64}) {
          for (bool combined : {false, true})
            g.push_back({bf16, kv, bf16, heads, q, bs, 512, 64, combined});
        }
      }
    }
  }
  // Rows that end mid-chunk, block sizes that do not divide a tile, other widths and dtypes.
  g.push_back({bf16, bf16, bf16, 20, 3, 16, 512, 64, false});
  g.push_back({bf16, bf16, bf16, 16, 2, 32, 512, 64, true});
  g.push_back({bf16, bf16, bf16, 128, 2, 8, 512, 64, false});
  g.push_back({bf16, bf16, bf16, 1, 1, 100, 512, 64, true});
  g.push_back({bf16, bf16, bf16, 64, 4, 256, 512, 64, false});
  g.push_back({bf16, bf16, f32, 16, 2, 32, 512, 64, false});
  g.push_back({bf16, e4m3, f16, 32, 1, 64, 512, 64, true});
  g.push_back({f16, f16, f16, 16, 2, 64, 512, 64, false});
  g.push_back({f16, f16, f32, 128, 1, 16, 512, 64, true});
  g.push_back({f16, e5m2, f16, 16, 1, 64, 512, 64, false});
  g.push_back({bf16, e5m2, bf16, 128, 2, 64, 512, 64, true});
  g.push_back({bf16, bf16, bf16, 16, 1, 64, 256, 32, false});
  g.push_back({bf16, bf16, bf16, 8, 2, 16, 384, 48, true});
  g.push_back({bf16, e4m3, bf16, 16, 1, 7, 128, 16, false});
  g.push_back({bf16, bf16, f32, 16, 1, 64, 128, 0, false});
  return g;
}
INSTANTIATE_TEST_SUITE_P(Mla, MlaCudaGrid, ::testing::ValuesIn(cuda_grid()), [](const auto& info) {
  std::ostringstream os;
  PrintTo(info.param, &os);
  return os.str();
});

// A NaN in a later query token's latent row reaches the rows that attend it (NaN out and lse)
// and none of the earlier rows, which drop it.
TEST(MlaCuda, NaNInALaterQueryTokenReachesOnlyTheRowsThatAttendIt) {
  SKIP_WITHOUT_CUDA();
  MlaSpec s;
  s.heads = 16;
  s.block_size = 64;
  s.lens = {200};
  s.q_lens = {3};
  s.seed = testing::seed_for_test();
  MlaCase m = make_mla_case(s);
  const int id = m.table[199 / 64];
  store_from_float(m.c.data(), s.kv_dtype,
                   (static_cast<std::int64_t>(id) * 64 + 199 % 64) * m.latent_stride() + 5, kNaN);
  const ReferenceResult ref = mla_reference_decode(m.args());
  run_cuda(m);
  expect_matches(m, ref, "NaN in the last query token's row");
  for (int h = 0; h < s.heads; ++h) {
    EXPECT_FALSE(std::isnan(m.lse[h])) << "head " << h;
    EXPECT_TRUE(std::isnan(m.lse[2 * s.heads + h])) << "head " << h;
  }
}

TEST(MlaCuda, OneSplitMatchesTheSplitPlan) {
  SKIP_WITHOUT_CUDA();
  MlaSpec s;
  s.heads = 16;
  s.block_size = 64;
  s.lens = {9000, 5, 4100};
  s.q_lens = {2, 1, 2};
  s.seed = testing::seed_for_test();
  MlaCase one = make_mla_case(s);
  MlaCase split = make_mla_case(s);
  const ReferenceResult ref = mla_reference_decode(one.args());
  detail::DecodeOptions o;
  o.single_split = true;
  run_cuda(one, o);
  run_cuda(split);
  expect_matches(one, ref, "one split");
  expect_matches(split, ref, "split plan");
}

// The sequences of a small batch, decoded again inside a larger batch of other sequences, give
// the same bits with batch_invariant.
TEST(MlaCuda, BatchInvariantResultsDoNotDependOnTheBatch) {
  SKIP_WITHOUT_CUDA();
  MlaSpec small;
  small.heads = 16;
  small.block_size = 64;
  small.lens = {3000, 700};
  small.seed = testing::seed_for_test();
  MlaSpec big = small;
  big.lens = {3000, 700, 5000, 12000, 64, 9000, 1, 2500};
  MlaCase a = make_mla_case(small);
  MlaCase b = make_mla_case(big);  // the same seed: its first two sequences differ in blocks only
  // Give b's first two sequences a's q rows and latent rows.
  for (int seq = 0; seq < 2; ++seq) {
    for (int t = 0; t < small.lens[seq]; ++t) {
      const std::int64_t from =
          (static_cast<std::int64_t>(a.table[seq * a.max_blocks + t / 64]) * 64 + t % 64) *
          a.latent_stride();
      const std::int64_t to =
          (static_cast<std::int64_t>(b.table[seq * b.max_blocks + t / 64]) * 64 + t % 64) *
          b.latent_stride();
      const std::size_t esz = dtype_size(small.kv_dtype);
      std::memcpy(b.c.data() + to * esz, a.c.data() + from * esz, small.rank * esz);
      std::memcpy(b.kpe.data() + (to / b.latent_stride()) * (small.rope + small.row_pad) * esz,
                  a.kpe.data() + (from / a.latent_stride()) * (small.rope + small.row_pad) * esz,
                  small.rope * esz);
    }
  }
  std::memcpy(b.q_nope.data(), a.q_nope.data(), a.q_nope.size());
  std::memcpy(b.q_pe.data(), a.q_pe.data(), a.q_pe.size());
  detail::DecodeOptions o;
  o.batch_invariant = true;
  run_cuda(a, o);
  run_cuda(b, o);
  EXPECT_EQ(0, std::memcmp(a.out.data(), b.out.data(), a.out.size()));
  EXPECT_EQ(0, std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * sizeof(float)));
  expect_matches(a, mla_reference_decode(a.args()), "batch invariant");
}

TEST(MlaCuda, TakesTheCallersWorkspace) {
  SKIP_WITHOUT_CUDA();
  MlaSpec s;
  s.lens = {2000, 17};
  s.q_lens = {2, 1};
  s.block_size = 64;
  s.seed = testing::seed_for_test();
  MlaCase m = make_mla_case(s);
  const ReferenceResult ref = mla_reference_decode(m.args());
  DeviceMla d(m);
  const MlaDecodeArgs a = d.args(m);
  DecodeOptions o;
  o.backend = Backend::kCuda;
  const std::size_t bytes = cuda_mla_workspace_size(a, o);
  ASSERT_GT(bytes, 0u);
  DeviceBuffer ws(bytes);
  o.workspace = ws.get();
  o.workspace_bytes = bytes - 1;
  expect_error([&] { mla_decode(a, o); }, ErrorCode::kInvalidArgument, "workspace_bytes", {},
               "a workspace one byte short");
  o.workspace_bytes = bytes;
  mla_decode(a, o);
  testing::device_synchronize();
  d.fetch(m);
  expect_matches(m, ref, "caller workspace");
}

TEST(MlaCuda, CheckedModeRefusesABlockIdOutsideThePool) {
  SKIP_WITHOUT_CUDA();
  MlaSpec s;
  s.lens = {100, 40};
  s.block_size = 16;
  s.seed = testing::seed_for_test();
  MlaCase m = make_mla_case(s);
  m.table[1] = m.num_blocks;  // sequence 0's second block
  DeviceMla d(m);
  detail::DecodeOptions o;
  o.backend = Backend::kCuda;
  o.cuda_checked = true;
  expect_error([&] { detail::mla_decode(d.args(m), o); }, ErrorCode::kOutOfRange,
               "block_table[0][1]", {"= " + std::to_string(m.num_blocks), "num_blocks"},
               "a block id past the pool");
  const std::vector<std::uint8_t> before = m.out;
  d.fetch(m);
  EXPECT_EQ(before, m.out) << "out was written";
}

// ---- What the kernel refuses before any launch (host memory: nothing is read). ----

TEST(MlaCudaRefusals, NameTheArgument) {
  SKIP_WITHOUT_CUDA();
  struct Refusal {
    std::string what, argument;
    std::function<void(MlaSpec&)> spec;
  };
  const std::vector<Refusal> refusals = {
      {"f32 queries", "q_dtype", [](MlaSpec& s) { s.q_dtype = s.kv_dtype = DType::kF32; }},
      {"an f32 cache", "kv_dtype", [](MlaSpec& s) { s.kv_dtype = DType::kF32; }},
      {"an f16 cache for bf16 queries", "kv_dtype", [](MlaSpec& s) { s.kv_dtype = DType::kF16; }},
      {"a rank of 192", "kv_lora_rank", [](MlaSpec& s) { s.rank = 192; }},
      {"a rank of 1024", "kv_lora_rank", [](MlaSpec& s) { s.rank = 1024; }},
      {"a rope dim of 128", "rope_dim", [](MlaSpec& s) { s.rope = 128; }},
      {"latent rows 2 bytes apart from alignment", "c_strides", [](MlaSpec& s) { s.row_pad = 1; }},
  };
  for (const Refusal& r : refusals) {
    MlaSpec s;
    s.lens = {5};
    r.spec(s);
    MlaCase m = make_mla_case(s);
    detail::DecodeOptions o;
    o.backend = Backend::kCuda;
    expect_error([&] { detail::mla_decode(m.args(), o); }, ErrorCode::kUnsupported, r.argument, {},
                 r.what);
  }
}

}  // namespace
}  // namespace pagedattn
