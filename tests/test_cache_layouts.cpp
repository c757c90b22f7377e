// The cache layouts (DecodeArgs::kv_strides, docs/cache_layouts.md): the same data stored as HND,
// NHD, K and V as halves of one tensor (per block or per token) and a padded pool must decode to
// the same bits on every backend, and the reference must agree; NaN fills every gap between
// rows, so a backend reading one shows. Strides that make rows overlap, or that CUDA cannot
// read, are errors naming the stride, and nothing is written.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "pagedattn/cache_ops.hpp"
#include "pagedattn/detail/dispatch.hpp"
#include "pagedattn/reference.hpp"
#include "pagedattn/testing/cache_op_args.hpp"
#include "pagedattn/testing/device_case.hpp"
#include "pagedattn/testing/device_memory.hpp"
#include "pagedattn/testing/kv_layouts.hpp"
#include "pagedattn/testing/random_case.hpp"
#include "test_seed.hpp"

namespace pagedattn {
namespace {

using testing::KvLayout;

testing::CaseSpec layout_spec(DType dtype, int head_dim, int group, int block_size) {
  testing::CaseSpec s =
      testing::shaped_spec(dtype, 3 * group, 3, head_dim, block_size, {0, 1, 700, 33, 2100});
  s.seed = testing::seed_for(0x1a70075);
  return s;
}

struct LayoutParam {
  Backend backend;
  DType dtype;
  int head_dim, group, block_size;
  KvLayout layout;
};

// Runs c (its out and lse) on `backend` with its caches stored as `st`.
void decode_in_layout(testing::HostCase& c, const testing::KvStorage& st, Backend backend,
                      bool multi_token) {
  detail::DecodeOptions o;
  o.backend = backend;
  std::vector<std::int32_t> q_indptr;
  DecodeArgs a = c.args();
  if (multi_token) {
    // 0, 1, 1, 2 and 1 query tokens: as many rows as the case's q and out have (batch).
    q_indptr = {0, 0, 1, 2, 4, 5};
    a.q_indptr = q_indptr.data();
    a.num_q_tokens = 5;
    a.max_q_len = 2;
  }
  if (backend == Backend::kCpu) {
    st.apply(a, st.k.data(), st.v.data());
    detail::decode(a, o);
    return;
  }
  const testing::DeviceCase dev(c.args());
  testing::DeviceBuffer k(st.k.data(), st.k.size()), v(st.v.data(), st.v.size());
  testing::DeviceBuffer qi(q_indptr.data(), q_indptr.size() * sizeof(std::int32_t));
  DecodeArgs d = dev.args();
  d.q_indptr = multi_token ? qi.as<std::int32_t>() : nullptr;
  d.num_q_tokens = a.num_q_tokens;
  d.max_q_len = a.max_q_len;
  st.apply(d, k.get(), v.get());
  detail::decode(d, o);
  dev.download(c.args());
}

class CacheLayouts : public ::testing::TestWithParam<LayoutParam> {};

TEST_P(CacheLayouts, DecodeToTheSameBitsAsHnd) {
  const LayoutParam& p = GetParam();
  if (p.backend == Backend::kCuda && !cuda_available()) GTEST_SKIP() << "no CUDA device";
  for (const bool multi_token : {false, true}) {
    SCOPED_TRACE(multi_token ? "two query tokens per sequence" : "one query token");
    testing::HostCase hnd =
        testing::make_case(layout_spec(p.dtype, p.head_dim, p.group, p.block_size));
    testing::HostCase other = hnd;
    hnd.poison_outputs();
    other.poison_outputs();
    decode_in_layout(hnd, testing::store_kv(hnd, KvLayout::kHnd), p.backend, multi_token);
    const testing::KvStorage st = testing::store_kv(other, p.layout);
    decode_in_layout(other, st, p.backend, multi_token);
    const std::size_t rows = hnd.spec.batch;
    const std::size_t out_bytes =
        rows * hnd.spec.num_heads * hnd.spec.head_dim * dtype_size(hnd.spec.out_dtype);
    EXPECT_EQ(std::memcmp(other.out.data(), hnd.out.data(), out_bytes), 0)
        << "out differs from the HND decode";
    EXPECT_EQ(std::memcmp(other.lse.data(), hnd.lse.data(), rows * hnd.spec.num_heads * 4), 0)
        << "lse differs from the HND decode";
    if (!multi_token) {
      // The decode is right, not only the same: against the f64 reference of the dense case.
      const testing::Comparison cmp = testing::compare_with_reference(other);
      EXPECT_TRUE(cmp.all_finite) << cmp.first_bad;
      EXPECT_LE(cmp.rel_err(), testing::out_tolerance(hnd.spec.out_dtype))
          << "rel_err " << cmp.rel_err();
      // And the reference reads the layout as the dense case.
      DecodeArgs ra = other.args();
      st.apply(ra, st.k.data(), st.v.data());
      const ReferenceResult laid = reference_decode(ra);
      const ReferenceResult dense = reference_decode(other.args());
      EXPECT_EQ(laid.out, dense.out);
      EXPECT_EQ(laid.lse, dense.lse);
    }
  }
}

std::vector<LayoutParam> layout_params() {
  std::vector<LayoutParam> v;
  for (Backend b : {Backend::kCpu, Backend::kCuda}) {
    for (KvLayout l : testing::kAllKvLayouts) {
      if (l == KvLayout::kHnd) continue;
      v.push_back({b, DType::kBF16, 128, 4, 16, l});
      v.push_back({b, DType::kF16, 64, 1, 7, l});
      v.push_back({b, DType::kF32, 80, 8, 32, l});
      v.push_back({b, DType::kBF16, 128, 32, 64, l});  // sm_90's many-row kernel (TMA)
    }
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(All, CacheLayouts, ::testing::ValuesIn(layout_params()),
                         [](const ::testing::TestParamInfo<LayoutParam>& i) {
                           return std::string(backend_name(i.param.backend)) + "_" +
                                  testing::kv_layout_name(i.param.layout) + "_" +
                                  dtype_name(i.param.dtype) + "_d" +
                                  std::to_string(i.param.head_dim) + "_g" +
                                  std::to_string(i.param.group) + "_bs" +
                                  std::to_string(i.param.block_size);
                         });

// write_cache and copy_blocks in a layout: the caches after the call are exactly the HND
// caches after the same call, stored in that layout (gaps still NaN).
class CacheOpLayouts : public ::testing::TestWithParam<std::pair<Backend, KvLayout>> {};

TEST_P(CacheOpLayouts, WriteAndCopyAsInHnd) {
  const auto [backend, layout] = GetParam();
  if (backend == Backend::kCuda && !cuda_available()) GTEST_SKIP() << "no CUDA device";
  testing::HostCase c = testing::make_case(layout_spec(DType::kBF16, 64, 2, 16));
  testing::KvStorage hnd = testing::store_kv(c, KvLayout::kHnd);
  testing::KvStorage other = testing::store_kv(c, layout);
  const int KV = c.spec.num_kv_heads, D = c.spec.head_dim, BS = c.spec.block_size;
  const int tokens = 37;
  std::vector<float> key(static_cast<std::size_t>(tokens) * KV * D), value(key.size());
  for (std::size_t i = 0; i < key.size(); ++i) {
    key[i] = static_cast<float>(i % 97) * 0.03125f - 1.f;
    value[i] = static_cast<float>(i % 89) * -0.0625f + 2.f;
  }
  std::vector<std::int32_t> slots(tokens);
  for (int t = 0; t < tokens; ++t) slots[t] = t == 5 ? -1 : (t * 7 + 3) % (c.num_blocks * BS);
  const BlockCopy pairs[] = {{0, 1}, {2, c.num_blocks - 1}};

  CacheOpOptions o;
  o.backend = backend;
  // Writes the tokens into caches k_cache and v_cache laid out as `st`, then copies the blocks;
  // every pointer in the backend's memory.
  auto write_then_copy = [&](const testing::KvStorage& st, void* k_cache, void* v_cache,
                             const void* k, const void* v, const std::int32_t* slot_mapping) {
    const auto pool = [&](auto args) {  // `args` (empty) picks CacheWriteArgs or CopyBlocksArgs
      return testing::pool_args<decltype(args)>(KV, D, BS, c.num_blocks, k_cache, v_cache,
                                                c.spec.kv_dtype, st.geometry.strides);
    };
    CacheWriteArgs w = pool(CacheWriteArgs{});
    w.num_tokens = tokens;
    w.key = k;
    w.value = v;
    w.src_dtype = DType::kF32;
    w.slot_mapping = slot_mapping;
    write_cache(w, o);
    CopyBlocksArgs cp = pool(CopyBlocksArgs{});
    cp.pairs = pairs;
    cp.num_pairs = 2;
    copy_blocks(cp, o);
  };
  auto run = [&](testing::KvStorage& st) {
    const std::int64_t v_off =
        st.geometry.v_offset * static_cast<std::int64_t>(dtype_size(c.spec.kv_dtype));
    if (backend == Backend::kCpu) {
      std::uint8_t* v_cache = st.geometry.shared ? st.k.data() + v_off : st.v.data();
      write_then_copy(st, st.k.data(), v_cache, key.data(), value.data(), slots.data());
      return;
    }
    testing::DeviceBuffer dk(st.k.data(), st.k.size()), dv(st.v.data(), st.v.size());
    testing::DeviceBuffer dkey(key.data(), key.size() * 4), dval(value.data(), value.size() * 4);
    testing::DeviceBuffer dslots(slots.data(), slots.size() * 4);
    void* v_cache = st.geometry.shared ? dk.as<std::uint8_t>() + v_off : dv.get();
    write_then_copy(st, dk.get(), v_cache, dkey.get(), dval.get(), dslots.as<std::int32_t>());
    dk.to_host(st.k);
    if (!st.geometry.shared) dv.to_host(st.v);
  };
  run(hnd);
  run(other);
  testing::HostCase after = c;
  after.k = hnd.k;
  after.v = hnd.v;
  const testing::KvStorage expected = testing::store_kv(after, layout);
  EXPECT_EQ(other.k, expected.k);
  EXPECT_EQ(other.v, expected.v);
}

INSTANTIATE_TEST_SUITE_P(All, CacheOpLayouts,
                         ::testing::Values(std::pair{Backend::kCpu, KvLayout::kNhd},
                                           std::pair{Backend::kCpu, KvLayout::kCombinedNhd},
                                           std::pair{Backend::kCpu, KvLayout::kTokenKvNhd},
                                           std::pair{Backend::kCpu, KvLayout::kPaddedHnd},
                                           std::pair{Backend::kCuda, KvLayout::kNhd},
                                           std::pair{Backend::kCuda, KvLayout::kCombinedNhd},
                                           std::pair{Backend::kCuda, KvLayout::kTokenKvNhd},
                                           std::pair{Backend::kCuda, KvLayout::kPaddedHnd}),
                         [](const ::testing::TestParamInfo<std::pair<Backend, KvLayout>>& i) {
                           return std::string(backend_name(i.param.first)) + "_" +
                                  testing::kv_layout_name(i.param.second);
                         });

struct BadStrides {
  CacheStrides strides;
  const char* argument;
};

// D = 64, block 16, 3 kv heads: NHD is {3072, 64, 192}, HND {3072, 1024, 64}.
std::vector<BadStrides> bad_strides() {
  return {
      {{3072, 1024, 63}, "kv_strides.token"},   // rows of one head overlap
      {{3072, 64, 64}, "kv_strides.head"},      // head and token both 64: rows coincide
      {{3072, 1000, 64}, "kv_strides.head"},    // heads overlap the previous head's last rows
      {{2048, 1024, 64}, "kv_strides.block"},   // blocks overlap
      {{3072, 0, 64}, "kv_strides.head"},       // a zero among nonzero strides
      {{-3072, 1024, 64}, "kv_strides.block"},  // negative
      {{3072, 1024, -64}, "kv_strides.token"},
      {{INT64_MAX / 2, 1024, 64}, "kv_strides.block"},  // the pool's span overflows
  };
}

TEST(CacheLayoutValidation, OverlappingOrBadStridesAreErrorsAndWriteNothing) {
  testing::HostCase c = testing::make_case(layout_spec(DType::kF32, 64, 2, 16));
  c.poison_outputs();
  const std::vector<std::uint8_t> before = c.out;
  for (const BadStrides& bad : bad_strides()) {
    SCOPED_TRACE(bad.argument);
    DecodeArgs a = c.args();
    a.kv_strides = bad.strides;
    try {
      decode(a, DecodeOptions{Backend::kCpu});
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_EQ(e.argument(), bad.argument) << e.what();
    }
    EXPECT_EQ(c.out, before);
    EXPECT_THROW(reference_decode(a), Error);
  }
}

TEST(CacheLayoutValidation, InterleavedButDisjointRowsAreAccepted) {
  // K and V per token ([blocks][slots][2][kv heads][D]): the token stride leaves room for V's
  // rows between K's, which is not an overlap.
  testing::HostCase c = testing::make_case(layout_spec(DType::kF32, 64, 2, 16));
  const testing::KvStorage st = testing::store_kv(c, KvLayout::kTokenKvNhd);
  DecodeArgs a = c.args();
  st.apply(a, st.k.data(), st.v.data());
  EXPECT_NO_THROW(decode(a, DecodeOptions{Backend::kCpu}));
}

TEST(CacheLayoutValidation, CudaRefusesStridesOffSixteenBytes) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  testing::HostCase c = testing::make_case(layout_spec(DType::kBF16, 64, 2, 16));
  const testing::DeviceCase dev(c.args());
  // Layouts without overlaps, each with one stride off a multiple of 16 bytes (8 bf16 elements):
  // token 68 (136 bytes), head 1028 (2056 bytes), block 3076 (6152 bytes).
  const BadStrides cases[] = {{{3 * 16 * 68, 16 * 68, 68}, "kv_strides.token"},
                              {{3088, 1028, 64}, "kv_strides.head"},
                              {{3076, 1024, 64}, "kv_strides.block"}};
  for (const BadStrides& bad : cases) {
    DecodeArgs a = dev.args();
    a.kv_strides = bad.strides;
    try {
      decode(a, DecodeOptions{Backend::kCuda});
      ADD_FAILURE() << "accepted " << bad.argument;
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), bad.argument) << e.what();
    }
  }
}

// The engine examples of docs/cache_layouts.md, with the doc's formulas: each engine's cache
// tensor filled through its own indexing, then decoded through the DecodeArgs the doc gives,
// must give the bits of the HND decode of the same values.
struct EngineCache {
  const char* name;
  // Elements of the engine's tensor, and where (block, kv head, slot, dim) of K (kv 0) or V
  // (kv 1) sits in it.
  std::int64_t (*elements)(std::int64_t NB, std::int64_t BS, std::int64_t H, std::int64_t D);
  std::int64_t (*index)(std::int64_t NB, std::int64_t BS, std::int64_t H, std::int64_t D, int kv,
                        std::int64_t b, std::int64_t h, std::int64_t t, std::int64_t d);
  // The doc's DecodeArgs fields over the tensor at `base`.
  void (*fields)(DecodeArgs& a, const float* base);
};

// The doc's fields for a cache whose blocks hold K then V ([num_blocks][2][...]), each half laid
// out as `half`: V starts one half-block after K, and blocks are two halves apart.
void k_then_v_in_each_block(DecodeArgs& a, const float* kv_cache, const CacheStrides& half) {
  a.kv_strides = half;
  a.k_cache = kv_cache;
  a.v_cache = kv_cache + half.block;
  a.kv_strides.block = 2 * half.block;
}

const EngineCache kEngineCaches[] = {
    {"vllm_flash_attn",  // kv_cache: [2][num_blocks][block_size][num_kv_heads][head_dim]
     [](auto NB, auto BS, auto H, auto D) { return 2 * NB * BS * H * D; },
     [](auto NB, auto BS, auto H, auto D, int kv, auto b, auto h, auto t, auto d) {
       return (((kv * NB + b) * BS + t) * H + h) * D + d;
     },
     [](DecodeArgs& a, const float* kv_cache) {
       const std::int64_t half =
           static_cast<std::int64_t>(a.num_blocks) * a.block_size * a.num_kv_heads * a.head_dim;
       a.k_cache = kv_cache;
       a.v_cache = kv_cache + half;
       a.kv_strides = CacheStrides::nhd(a.num_kv_heads, a.block_size, a.head_dim);
     }},
    {"vllm_flashinfer_nhd",  // kv_cache: [num_blocks][2][block_size][num_kv_heads][head_dim]
     [](auto NB, auto BS, auto H, auto D) { return NB * 2 * BS * H * D; },
     [](auto, auto BS, auto H, auto D, int kv, auto b, auto h, auto t, auto d) {
       return (((b * 2 + kv) * BS + t) * H + h) * D + d;
     },
     [](DecodeArgs& a, const float* kv_cache) {
       k_then_v_in_each_block(a, kv_cache,
                              CacheStrides::nhd(a.num_kv_heads, a.block_size, a.head_dim));
     }},
    {"flashinfer_hnd_combined",  // paged_kv_cache: [num_pages][2][num_kv_heads][page_size][D]
     [](auto NB, auto BS, auto H, auto D) { return NB * 2 * H * BS * D; },
     [](auto, auto BS, auto H, auto D, int kv, auto b, auto h, auto t, auto d) {
       return (((b * 2 + kv) * H + h) * BS + t) * D + d;
     },
     [](DecodeArgs& a, const float* kv_cache) {
       k_then_v_in_each_block(a, kv_cache,
                              CacheStrides::hnd(a.num_kv_heads, a.block_size, a.head_dim));
     }},
    {"sglang_token_pool",  // k_buffer, v_buffer: [num_tokens][num_kv_heads][head_dim], page 1
     [](auto NB, auto, auto H, auto D) { return 2 * NB * H * D; },
     [](auto NB, auto, auto H, auto D, int kv, auto b, auto h, auto, auto d) {
       return ((kv * NB + b) * H + h) * D + d;
     },
     [](DecodeArgs& a, const float* buffers) {
       const std::int64_t row = static_cast<std::int64_t>(a.num_kv_heads) * a.head_dim;
       a.k_cache = buffers;                       // k_buffer
       a.v_cache = buffers + a.num_blocks * row;  // v_buffer
       a.kv_strides = {row, a.head_dim, row};     // a block is one token: block_size 1
     }},
};

TEST(CacheLayoutDocs, EngineExamplesDecodeAsHnd) {
  for (const EngineCache& e : kEngineCaches) {
    SCOPED_TRACE(e.name);
    const bool token_pool = std::string(e.name) == "sglang_token_pool";
    testing::HostCase c = testing::make_case(layout_spec(DType::kF32, 64, 4, token_pool ? 1 : 16));
    c.poison_outputs();
    testing::HostCase other = c;
    detail::DecodeOptions cpu;
    cpu.backend = Backend::kCpu;
    run_decode(c, cpu);
    const std::int64_t NB = c.num_blocks, BS = c.spec.block_size, H = c.spec.num_kv_heads,
                       D = c.spec.head_dim;
    std::vector<float> tensor(static_cast<std::size_t>(e.elements(NB, BS, H, D)));
    const CacheLayout dense =
        CacheLayout::dense(c.num_blocks, c.spec.num_kv_heads, c.spec.block_size, c.spec.head_dim);
    const float* k = reinterpret_cast<const float*>(c.k.data());
    const float* v = reinterpret_cast<const float*>(c.v.data());
    for (std::int64_t b = 0; b < NB; ++b)
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t t = 0; t < BS; ++t)
          for (std::int64_t d = 0; d < D; ++d) {
            const std::int64_t at =
                dense.offset(static_cast<int>(b), static_cast<int>(h), static_cast<int>(t)) + d;
            tensor[e.index(NB, BS, H, D, 0, b, h, t, d)] = k[at];
            tensor[e.index(NB, BS, H, D, 1, b, h, t, d)] = v[at];
          }
    DecodeArgs a = other.args();
    e.fields(a, tensor.data());
    decode(a, DecodeOptions{Backend::kCpu});
    EXPECT_EQ(other.out, c.out);
    EXPECT_EQ(std::memcmp(other.lse.data(), c.lse.data(), c.lse.size() * 4), 0);
  }
}

TEST(CacheLayoutGeometry, NamedLayoutsHaveTheirStrides) {
  EXPECT_EQ(CacheStrides::hnd(8, 16, 128).block, 8 * 16 * 128);
  EXPECT_EQ(CacheStrides::hnd(8, 16, 128).head, 16 * 128);
  EXPECT_EQ(CacheStrides::hnd(8, 16, 128).token, 128);
  EXPECT_EQ(CacheStrides::nhd(8, 16, 128).block, 8 * 16 * 128);
  EXPECT_EQ(CacheStrides::nhd(8, 16, 128).head, 128);
  EXPECT_EQ(CacheStrides::nhd(8, 16, 128).token, 8 * 128);
  // The default is dense HND, and explicit HND strides give the same offsets.
  const CacheLayout d = CacheLayout::dense(10, 8, 16, 128);
  const CacheLayout e = CacheLayout::with_strides(10, 8, 16, 128, CacheStrides::hnd(8, 16, 128));
  EXPECT_EQ(d.offset(7, 5, 3), e.offset(7, 5, 3));
  EXPECT_EQ(d.elements(), e.elements());
  const CacheLayout n = CacheLayout::with_strides(10, 8, 16, 128, CacheStrides::nhd(8, 16, 128));
  EXPECT_EQ(n.offset(7, 5, 3), 7 * 16 * 8 * 128 + 3 * 8 * 128 + 5 * 128);
  EXPECT_EQ(n.elements(), d.elements());
}

}  // namespace
}  // namespace pagedattn
