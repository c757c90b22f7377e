// q and out with row strides (DecodeArgs::q_row_stride, out_row_stride): q as the query part of a
// fused QKV projection, out as a slice of a larger buffer. Every backend must read only the q
// rows' elements and write only the out rows' elements, and give the same bits as the dense call.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "pagedattn/context_parallel.hpp"
#include "pagedattn/detail/dispatch.hpp"
#include "pagedattn/reference.hpp"
#include "pagedattn/testing/device_case.hpp"
#include "pagedattn/testing/device_memory.hpp"
#include "pagedattn/testing/random_case.hpp"
#include "test_seed.hpp"

namespace pagedattn {
namespace {

struct Strided {
  std::vector<std::uint8_t> q, out;
  std::int64_t q_stride = 0, out_stride = 0;
};

// q copied into rows of a fused QKV buffer ([batch][(H + 2 KV) * D]; the K and V parts hold
// NaN, which must never be read), out rows of out_stride elements with a sentinel byte pattern
// between them, which must never be written.
Strided make_strided(const testing::HostCase& c, std::int64_t out_extra) {
  const testing::CaseSpec& s = c.spec;
  const std::int64_t row = static_cast<std::int64_t>(s.num_heads) * s.head_dim;
  Strided r;
  r.q_stride = static_cast<std::int64_t>(s.num_heads + 2 * s.num_kv_heads) * s.head_dim;
  r.out_stride = row + out_extra;
  const std::size_t qsz = dtype_size(s.q_dtype), osz = dtype_size(s.out_dtype);
  r.q.assign(static_cast<std::size_t>(s.batch * r.q_stride) * qsz, 0);
  for (std::int64_t i = 0; i < s.batch * r.q_stride; ++i) {
    store_from_float(r.q.data(), s.q_dtype, i, std::numeric_limits<float>::quiet_NaN());
  }
  for (int b = 0; b < s.batch; ++b) {
    std::memcpy(r.q.data() + b * r.q_stride * qsz, c.q.data() + b * row * qsz, row * qsz);
  }
  r.out.assign(static_cast<std::size_t>(s.batch * r.out_stride) * osz, 0xA5);
  return r;
}

DecodeArgs strided_args(testing::HostCase& c, Strided& st) {
  DecodeArgs a = c.args();
  a.q = st.q.data();
  a.out = st.out.data();
  a.q_row_stride = st.q_stride;
  a.out_row_stride = st.out_stride;
  return a;
}

// Out rows of the strided buffer, the gaps between them checked for the sentinel.
void expect_same_rows(const testing::HostCase& dense, const Strided& st) {
  const testing::CaseSpec& s = dense.spec;
  const std::size_t osz = dtype_size(s.out_dtype);
  const std::size_t row_bytes = static_cast<std::size_t>(s.num_heads) * s.head_dim * osz;
  for (int b = 0; b < s.batch; ++b) {
    const std::uint8_t* got = st.out.data() + b * st.out_stride * osz;
    EXPECT_EQ(std::memcmp(got, dense.out.data() + b * row_bytes, row_bytes), 0)
        << "sequence " << b << " differs from the dense call";
    for (std::size_t i = row_bytes;
         i < st.out_stride * osz && b * st.out_stride * osz + i < st.out.size(); ++i) {
      ASSERT_EQ(got[i], 0xA5) << "byte " << i << " past sequence " << b << "'s out row written";
    }
  }
}

testing::CaseSpec stride_spec(DType dtype, int head_dim, int group) {
  testing::CaseSpec s =
      testing::shaped_spec(dtype, 2 * group, 2, head_dim, 16, {0, 1, 700, 33, 3000});
  s.seed = testing::seed_for(0x57121de);
  return s;
}

struct StrideParam {
  Backend backend;
  DType dtype;
  int head_dim, group;
};

class RowStrides : public ::testing::TestWithParam<StrideParam> {};

TEST_P(RowStrides, GiveTheDenseResultAndTouchOnlyTheRows) {
  const StrideParam& p = GetParam();
  if (p.backend == Backend::kCuda && !cuda_available()) GTEST_SKIP() << "no CUDA device";
  testing::HostCase dense = testing::make_case(stride_spec(p.dtype, p.head_dim, p.group));
  dense.poison_outputs();
  detail::DecodeOptions o;
  o.backend = p.backend;
  if (p.backend == Backend::kCpu) {
    detail::decode(dense.args(), o);
  } else {
    testing::cuda_decode_from_host(dense.args(), o);
  }
  // 64 extra elements per out row keep CUDA's rows 16-byte aligned for every dtype.
  Strided st = make_strided(dense, 64);
  std::vector<float> lse(dense.lse.size(), 0.f);
  DecodeArgs a = strided_args(dense, st);
  a.lse = lse.data();
  if (p.backend == Backend::kCpu) {
    detail::decode(a, o);
  } else {
    const testing::DeviceCase dev(dense.args());
    testing::DeviceBuffer q(st.q.data(), st.q.size()), out(st.out.data(), st.out.size());
    testing::DeviceBuffer dlse(lse.size() * sizeof(float));
    DecodeArgs d = dev.args();
    d.q = q.get();
    d.out = out.get();
    d.lse = dlse.as<float>();
    d.q_row_stride = st.q_stride;
    d.out_row_stride = st.out_stride;
    detail::decode(d, o);
    out.to_host(st.out);
    dlse.to_host(lse);
  }
  expect_same_rows(dense, st);
  EXPECT_EQ(std::memcmp(lse.data(), dense.lse.data(), lse.size() * sizeof(float)), 0);
  // And the reference reads the strided q the same way.
  const ReferenceResult ref_dense = reference_decode(dense.args());
  DecodeArgs ra = strided_args(dense, st);
  const ReferenceResult ref = reference_decode(ra);
  EXPECT_EQ(ref.out, ref_dense.out);
  EXPECT_EQ(ref.lse, ref_dense.lse);
}

std::vector<StrideParam> stride_params() {
  std::vector<StrideParam> v;
  for (Backend b : {Backend::kCpu, Backend::kCuda}) {
    for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
      v.push_back({b, t, 128, 4});
      v.push_back({b, t, 64, 1});
      v.push_back({b, t, 80, 16});
    }
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(All, RowStrides, ::testing::ValuesIn(stride_params()),
                         [](const ::testing::TestParamInfo<StrideParam>& i) {
                           return std::string(backend_name(i.param.backend)) + "_" +
                                  dtype_name(i.param.dtype) + "_d" +
                                  std::to_string(i.param.head_dim) + "_g" +
                                  std::to_string(i.param.group);
                         });

TEST(RowStrides, OverlappingRowsAreErrorsAndWriteNothing) {
  testing::HostCase c = testing::make_case(stride_spec(DType::kF32, 64, 2));
  c.poison_outputs();
  const std::vector<std::uint8_t> before = c.out;
  const std::int64_t row = static_cast<std::int64_t>(c.spec.num_heads) * c.spec.head_dim;
  for (const char* field : {"q_row_stride", "out_row_stride"}) {
    for (const std::int64_t bad : {row - 1, std::int64_t{-1}, std::int64_t{1}}) {
      DecodeArgs a = c.args();
      (field[0] == 'q' ? a.q_row_stride : a.out_row_stride) = bad;
      try {
        decode(a, DecodeOptions{Backend::kCpu});
        ADD_FAILURE() << field << " = " << bad << " was accepted";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
        EXPECT_EQ(e.argument(), field);
      }
      EXPECT_EQ(c.out, before);
      EXPECT_THROW(reference_decode(a), Error);
    }
  }
}

TEST(RowStrides, CudaRefusesMisalignedRows) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  testing::HostCase c = testing::make_case(stride_spec(DType::kBF16, 64, 2));
  const std::int64_t row = static_cast<std::int64_t>(c.spec.num_heads) * c.spec.head_dim;
  const testing::DeviceCase dev(c.args());
  for (const char* field : {"q_row_stride", "out_row_stride"}) {
    DecodeArgs a = dev.args();
    // q: 8 bytes past a row, not 16-byte aligned; out: an odd number of elements.
    (field[0] == 'q' ? a.q_row_stride : a.out_row_stride) = field[0] == 'q' ? row + 4 : row + 1;
    try {
      decode(a, DecodeOptions{Backend::kCuda});
      ADD_FAILURE() << field << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), field);
    }
  }
}

TEST(RowStrides, ContextParallelTakesAStridedQButNotAStridedOut) {
  testing::HostCase c = testing::make_case(stride_spec(DType::kF32, 64, 2));
  auto group = make_local_group(1);
  Strided st = make_strided(c, 64);
  DecodeArgs a = strided_args(c, st);
  a.out_row_stride = 0;
  a.out = c.out.data();
  context_parallel_decode(a, *group[0], DecodeOptions{Backend::kCpu});
  testing::HostCase dense = c;
  dense.poison_outputs();
  decode(dense.args(), DecodeOptions{Backend::kCpu});
  const ReferenceResult ref = reference_decode(dense.args());
  const testing::Comparison cmp = testing::compare_outputs(c, ref);
  EXPECT_TRUE(cmp.all_finite) << cmp.first_bad;
  EXPECT_LE(cmp.rel_err(), testing::out_tolerance(DType::kF32));
  a = strided_args(c, st);
  try {
    context_parallel_decode(a, *group[0], DecodeOptions{Backend::kCpu});
    ADD_FAILURE() << "a strided out was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_EQ(e.argument(), "out_row_stride");
  }
}

}  // namespace
}  // namespace pagedattn
