// NaN and Inf in the inputs: NaN or +-Inf in q, or in a K row inside the context, gives NaN in
// all of that head's out and in its lse, on every backend as in the f64 reference: never the
// out = 0, lse = -inf of an empty context, nor any other value that looks valid. The other heads
// and sequences of the batch keep their results, an empty context stays out = 0, lse = -inf
// whatever its q holds, and NaN past a context is never read (test_backend_reference.cpp). The
// CUDA rows skip where no device is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "gtest_printers.hpp"
#include "pagedattn/reference.hpp"
#include "pagedattn/testing/poison.hpp"
#include "pagedattn/testing/random_case.hpp"
#include "pagedattn/testing/tolerance.hpp"
#include "poisoned_heads.hpp"
#include "test_seed.hpp"

namespace pagedattn {
namespace {

using testing::Poison;

void store(std::vector<std::uint8_t>& buf, DType t, std::size_t i, float x) {
  switch (t) {
    case DType::kF32:
      reinterpret_cast<float*>(buf.data())[i] = x;
      break;
    case DType::kF16:
      reinterpret_cast<f16_t*>(buf.data())[i] = float_to_f16(x);
      break;
    case DType::kBF16:
      reinterpret_cast<bf16_t*>(buf.data())[i] = float_to_bf16(x);
      break;
  }
}

class NonFinite : public ::testing::TestWithParam<NonFiniteParam> {};

TEST_P(NonFinite, GivesNaNInTheHeadsItReaches) {
  const auto [backend, dtype, poison] = GetParam();
  if (backend == Backend::kCuda && !cuda_available()) GTEST_SKIP() << "no CUDA device";
  // Sequence 0 is long enough to be split (the bad value lands in one split of several),
  // sequence 1 ends inside a block, sequence 2 is empty. 8 heads on 2 kv heads (groups of 4).
  testing::CaseSpec spec = testing::shaped_spec(dtype, 8, 2, 128, 16, {1500, 37, 0});
  spec.seed = testing::seed_for_test();
  testing::HostCase c = testing::make_case(spec);
  const int H = spec.num_heads, KV = spec.num_kv_heads, G = H / KV, D = spec.head_dim;
  const int BS = spec.block_size;
  const float bad = poison_value(poison);

  // bad_head[b * H + h]: the heads whose result must be NaN.
  std::vector<bool> bad_head(static_cast<std::size_t>(spec.batch) * H, false);
  auto poison_k_row = [&](int b, int t, int kv, int d) {
    const int id = c.block_table[static_cast<std::size_t>(b) * c.table_stride + t / BS];
    const std::size_t i = ((static_cast<std::size_t>(id) * KV + kv) * BS + t % BS) * D + d;
    store(c.k, dtype, i, bad);
    for (int g = 0; g < G; ++g) bad_head[static_cast<std::size_t>(b) * H + kv * G + g] = true;
  };
  switch (poison) {
    case Poison::kQNaN:
    case Poison::kQPosInf:
    case Poison::kQNegInf:
      store(c.q, dtype, (0 * H + 5) * static_cast<std::size_t>(D) + 7, bad);  // seq 0, head 5
      bad_head[0 * H + 5] = true;
      store(c.q, dtype, (2 * H + 1) * static_cast<std::size_t>(D) + 3, bad);  // seq 2 is empty
      break;
    case Poison::kKNaN:
    case Poison::kKPosInf:
    case Poison::kKNegInf:
      poison_k_row(0, 1037, 0, 11);  // seq 0, kv head 0, a token of a later split
      break;
    case Poison::kKLastRowNaN:
      poison_k_row(1, 36, 1, 0);  // seq 1's last token, kv head 1
      break;
  }

  const ReferenceResult ref = reference_decode(c.args());
  // Finite sentinels (0x3F bytes are finite in every dtype): a NaN read back was written.
  std::fill(c.out.begin(), c.out.end(), std::uint8_t{0x3F});
  std::fill(c.lse.begin(), c.lse.end(), 12345.f);
  detail::DecodeOptions o;
  o.backend = backend;
  testing::run_decode(c, o);

  const std::string trace = std::string(poison_name(poison)) + " " + testing::describe(c.spec) +
                            " " + testing::seed_note(c.spec.seed);
  SCOPED_TRACE(trace);
  // Empty sequences: out = 0 and lse = -inf exactly, whatever q holds.
  for (int b = 0; b < spec.batch; ++b) {
    if (spec.context_lens[b] != 0) continue;
    for (int i = 0; i < H * D; ++i) {
      const std::size_t e = static_cast<std::size_t>(b) * H * D + i;
      ASSERT_EQ(load_as_float(c.out.data(), dtype, e), 0.f) << "seq " << b;
    }
    for (int h = 0; h < H; ++h) {
      EXPECT_EQ(ref.lse[static_cast<std::size_t>(b) * H + h],
                -std::numeric_limits<double>::infinity())
          << "seq " << b;
    }
  }
  expect_nan_in_poisoned_heads(c, ref, bad_head);
}

INSTANTIATE_TEST_SUITE_P(All, NonFinite, non_finite_params(Poison::kKLastRowNaN), non_finite_name);

}  // namespace
}  // namespace pagedattn
