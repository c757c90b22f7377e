// The CUDA backend beyond the shared reference grid (test_backend_reference.cpp): every head dim
// and large GQA groups against the f64 reference, CUDA against the CPU backend on identical
// inputs, a skewed batch, CUDA-graph capture and replay with new context lengths, bitwise
// determinism, checked mode (the CPU path's errors, out untouched), unchecked mode staying inside
// the buffers, and the stream + workspace API. Every test skips where no CUDA device is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cuda_device.hpp"
#include "pagedattn/detail/backends.hpp"
#include "pagedattn/testing/device_case.hpp"
#include "pagedattn/testing/random_case.hpp"
#include "pagedattn/validate.hpp"
#include "reference_check.hpp"
#include "test_seed.hpp"

namespace pagedattn {
namespace {

std::uint64_t test_seed() { return testing::seed_for_test(); }

using testing::expect_matches_reference;

testing::CaseSpec spec_for(DType dtype, int heads, int kv_heads, int head_dim, int block_size,
                           std::vector<int> lens) {
  testing::CaseSpec s =
      testing::shaped_spec(dtype, heads, kv_heads, head_dim, block_size, std::move(lens));
  s.spare_blocks = 5;
  s.table_padding = 2;
  s.table_stride_extra = 3;
  s.seed = test_seed();
  return s;
}

DecodeOptions cuda_options() {
  DecodeOptions o;
  o.backend = Backend::kCuda;
  return o;
}

// Every head dim with kernels, on both compute paths (group 2: CUDA cores; group 8: MMA for
// f16/bf16), mixed lengths in one batch. A supported head dim with no CUDA kernel (512, not in
// kCudaHeadDims) is refused up front, naming head_dim (test_cuda_head_dim.cpp has the rest).
TEST(CudaDecode, EveryHeadDimAndPath) {
  SKIP_WITHOUT_CUDA();
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (int d : kSupportedHeadDims) {
      for (int group : {2, 8}) {
        testing::HostCase c =
            testing::make_case(spec_for(dt, 2 * group, 2, d, 16, {0, 1, 15, 16, 17, 700}));
        if (!is_cuda_head_dim(d)) {
          try {
            testing::run_decode(c, cuda_options());
            ADD_FAILURE() << "head dim " << d << " was accepted on CUDA";
          } catch (const Error& e) {
            EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << e.what();
            EXPECT_EQ(e.argument(), "head_dim") << e.what();
          }
          continue;
        }
        testing::run_decode(c, cuda_options());
        expect_matches_reference(c);
      }
    }
  }
}

// Groups beyond one MMA tile (16 rows) and beyond one CUDA-core head chunk, up to 64 (MQA).
TEST(CudaDecode, LargeGroups) {
  SKIP_WITHOUT_CUDA();
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int group : {3, 5, 12, 16, 17, 20, 33, 48, 64}) {
      testing::HostCase c = testing::make_case(spec_for(dt, group, 1, 128, 16, {300, 0, 1029, 64}));
      testing::run_decode(c, cuda_options());
      expect_matches_reference(c);
    }
  }
}

// The query, cache and output dtypes need not agree (mixed inputs take the CUDA-core path).
TEST(CudaDecode, MixedDtypes) {
  SKIP_WITHOUT_CUDA();
  const DType all[] = {DType::kF32, DType::kF16, DType::kBF16};
  for (DType q : all) {
    for (DType kv : all) {
      for (DType out : all) {
        testing::CaseSpec s = spec_for(kv, 8, 2, 96, 7, {0, 5, 333});
        s.q_dtype = q;
        s.out_dtype = out;
        testing::HostCase c = testing::make_case(s);
        testing::run_decode(c, cuda_options());
        expect_matches_reference(c);
      }
    }
  }
}

// Block sizes from 1 to the maximum, including odd ones and sizes past one 64-token tile.
TEST(CudaDecode, BlockSizes) {
  SKIP_WITHOUT_CUDA();
  for (int bs : {1, 2, 3, 13, 64, 100, 128, 255, 256}) {
    for (DType dt : {DType::kBF16, DType::kF32}) {
      testing::HostCase c =
          testing::make_case(spec_for(dt, 8, 2, 64, bs, {bs - 1, 2 * bs + 1, 1000, 0, 1}));
      testing::run_decode(c, cuda_options());
      expect_matches_reference(c);
    }
  }
}

// Large logits (magnitude 4: logits of order 16) stress the online-softmax rescaling.
TEST(CudaDecode, LargeLogits) {
  SKIP_WITHOUT_CUDA();
  for (DType dt : {DType::kF32, DType::kBF16}) {
    testing::CaseSpec s = spec_for(dt, 16, 2, 128, 16, {4000, 17, 2500});
    s.magnitude = 4.f;
    testing::HostCase c = testing::make_case(s);
    testing::run_decode(c, cuda_options());
    expect_matches_reference(c);
  }
}

// CUDA and the CPU backend on identical inputs agree within the sum of their tolerances.
TEST(CudaDecode, AgreesWithCpu) {
  SKIP_WITHOUT_CUDA();
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (int group : {1, 4, 8}) {
      testing::CaseSpec s = spec_for(dt, 4 * group, 4, 128, 16, {0, 1, 16, 17, 1000, 3000});
      s.share_prefix = true;
      testing::HostCase gpu = testing::make_case(s);
      testing::HostCase cpu = testing::make_case(s);
      testing::run_decode(gpu, cuda_options());
      DecodeOptions co;
      co.backend = Backend::kCpu;
      testing::run_decode(cpu, co);
      // Each side against the reference first, so a disagreement names the side that is off.
      {
        SCOPED_TRACE("cuda");
        expect_matches_reference(gpu);
      }
      {
        SCOPED_TRACE("cpu");
        expect_matches_reference(cpu);
      }
      const std::size_t n = static_cast<std::size_t>(s.batch) * s.num_heads * s.head_dim;
      double scale = 1e-30, err = 0;
      for (std::size_t i = 0; i < n; ++i) {
        const double a = load_as_float(gpu.out.data(), dt, i);
        const double b = load_as_float(cpu.out.data(), dt, i);
        ASSERT_TRUE(std::isfinite(a) && std::isfinite(b)) << "element " << i;
        scale = std::max(scale, std::fabs(b));
        err = std::max(err, std::fabs(a - b));
      }
      SCOPED_TRACE(testing::describe(s));
      EXPECT_LE(err / scale, 2 * testing::out_tolerance(dt));
      for (std::size_t i = 0; i < gpu.lse.size(); ++i) {
        if (std::isinf(cpu.lse[i])) {
          EXPECT_EQ(gpu.lse[i], cpu.lse[i]) << "lse " << i;
        } else {
          EXPECT_NEAR(gpu.lse[i], cpu.lse[i], 2 * testing::lse_tolerance()) << "lse " << i;
        }
      }
    }
  }
}

// One long sequence among many short ones: the plan splits the long one finely.
TEST(CudaDecode, SkewedBatch) {
  SKIP_WITHOUT_CUDA();
  std::vector<int> lens(31, 1024);
  lens[7] = 40000;
  testing::HostCase c = testing::make_case(spec_for(DType::kBF16, 8, 2, 128, 16, lens));
  testing::run_decode(c, cuda_options());
  expect_matches_reference(c);
}

// More (row, head-dim slice) units than the combine's resident warps, long sequences (several
// splits) among short ones (one): each warp scans units 32 strides at a time and merges only
// those of the long sequences.
TEST(CudaDecode, CombineStridesOverMoreRowsThanResidentWarps) {
  SKIP_WITHOUT_CUDA();
  std::vector<int> lens(300, 20);
  for (std::size_t b = 3; b < lens.size(); b += 37) lens[b] = 6000 + static_cast<int>(b);
  testing::HostCase c = testing::make_case(spec_for(DType::kBF16, 64, 8, 128, 16, lens));
  testing::run_decode(c, cuda_options());
  expect_matches_reference(c);
}

// single_split (one work item per sequence and kv head) gives the same function.
TEST(CudaDecode, SingleSplit) {
  SKIP_WITHOUT_CUDA();
  testing::HostCase c = testing::make_case(spec_for(DType::kBF16, 8, 2, 128, 16, {5000, 0, 77}));
  detail::DecodeOptions o = cuda_options();
  o.single_split = true;
  testing::run_decode(c, o);
  expect_matches_reference(c);
}

// f32 on the tensor cores (3xTF32, from 3 rows per kv head) over one split of 32768 tokens per kv
// head: the error stays within f32's tolerance however many tokens one CTA sums (a long split's
// sums are where the tensor cores' own rounding would add up).
TEST(CudaDecode, F32OnTensorCoresOverALongSplit) {
  SKIP_WITHOUT_CUDA();
  for (const auto& [heads, head_dim] : {std::pair{16, 128}, std::pair{8, 64}}) {
    testing::HostCase c =
        testing::make_case(spec_for(DType::kF32, heads, 2, head_dim, 16, {32768, 3000}));
    detail::DecodeOptions o = cuda_options();
    o.single_split = true;
    testing::run_decode(c, o);
    expect_matches_reference(c);
  }
}

#ifdef PAGEDATTN_TEST_HAS_CUDA_RUNTIME

// The 8-bit (fp8, int8) tensor-core kernels at head dims 64 and 128 have a dense build (more CTAs
// per SM where the plain build's registers allow fewer), and decode plans for the most CTAs per SM
// either build fits or for one fewer, from the shapes (choose_split_kernel in
// cuda/kernel_choice.cpp): few (sequence, kv head) pairs take one fewer (the plain build), about as
// many pairs as the device has slots the most, and long tables with a few more pairs the most over
// two waves. Batches of growing size, short tables and then long ones (the choice reads the table's
// capacity; the contexts stay short), until each choice has run once, for each format and head dim,
// against the reference. On Hopper the plan for the most CTAs must have run (the dense build where
// it fits more); on a 132-SM Hopper GPU (H100 SXM, H200) the two-wave plan at D = 128 too.
TEST(CudaDecode, Fp8KernelBuilds) {
  SKIP_WITHOUT_CUDA();
  int device = 0;
  cudaDeviceProp prop{};
  testing::check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  testing::check_cuda(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  std::mt19937 rng(static_cast<std::uint32_t>(test_seed()));
  for (DType cache : {DType::kFP8E4M3, DType::kFP8E5M2, DType::kInt8}) {
    for (int d : {64, 128}) {
      bool ran[3] = {false, false, false};  // one fewer CTA, the most, the most over two waves
      for (int table_padding : {2, 1100}) {
        for (int batch : {1, 2, 4, 8, 16, 24, 32, 40, 48, 64, 96, 128}) {
          std::vector<int> lens(batch);
          for (int& l : lens) l = static_cast<int>(rng() % 600);
          testing::CaseSpec s = spec_for(DType::kBF16, 32, 8, d, 16, lens);
          s.kv_dtype = cache;
          s.k_scale = 0.25f;
          s.v_scale = 2.f;
          s.table_padding = table_padding;
          testing::HostCase c = testing::make_case(s);
          const detail::cuda::SplitChoice choice = detail::cuda::split_choice(c.args());
          const bool most = choice.ctas_per_sm == std::max(choice.plain_fits, choice.dense_fits);
          const int kind = !most ? 0 : choice.waves == 1 ? 1 : 2;
          ASSERT_TRUE(choice.waves == 1 || (most && choice.waves == 2));
          // The most CTAs come from the dense build exactly where it fits more than the plain
          // one; one fewer is always the plain build.
          ASSERT_EQ(choice.dense, most && choice.dense_fits > choice.plain_fits);
          if (ran[kind]) continue;
          ran[kind] = true;
          SCOPED_TRACE(std::string(dtype_name(cache)) + " d" + std::to_string(d) + " batch " +
                       std::to_string(batch) + ", a table of " +
                       std::to_string(c.max_blocks_per_seq) + " blocks, choice " +
                       std::to_string(kind));
          testing::run_decode(c, cuda_options());
          expect_matches_reference(c);
        }
      }
      const std::string what = std::string(dtype_name(cache)) + " d" + std::to_string(d);
      EXPECT_TRUE(ran[0]) << what << ": the plan one CTA per SM short never ran";
      if (prop.major == 9) EXPECT_TRUE(ran[1]) << what << ": the plan for the most CTAs never ran";
      if (prop.major == 9 && prop.multiProcessorCount == 132 && d == 128) {
        EXPECT_TRUE(ran[2]) << what << ": the plan for the most CTAs over two waves never ran";
      }
    }
  }
}

using testing::check_cuda;
using testing::DeviceBuffer;
using testing::DeviceCase;

// Copies new context lengths into a device case's table of lengths on `stream`.
void set_lens(const DeviceCase& d, const std::vector<std::int32_t>& lens, cudaStream_t stream) {
  check_cuda(cudaMemcpyAsync(const_cast<std::int32_t*>(d.args().context_lens), lens.data(),
                             lens.size() * sizeof(std::int32_t), cudaMemcpyHostToDevice, stream),
             "cudaMemcpyAsync(context_lens)");
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

// Captured once in a CUDA graph with a caller workspace, replayed with new context lengths (up
// to the lengths the case was built with, so no poisoned slot becomes readable): each replay
// matches the reference for its lengths.
TEST(CudaDecode, GraphReplayWithNewLengths) {
  SKIP_WITHOUT_CUDA();
  testing::HostCase c =
      testing::make_case(spec_for(DType::kBF16, 16, 2, 128, 16, {4000, 3000, 100, 2500}));
  DeviceCase d(c.args());
  cudaStream_t stream;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  const std::size_t ws_bytes = cuda_workspace_size(d.args());
  DeviceBuffer ws(ws_bytes);
  DecodeOptions o = cuda_options();
  o.cuda_stream = stream;
  o.workspace = ws.get();
  o.workspace_bytes = ws_bytes;
  decode(d.args(), o);  // loads the module before capture
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  check_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "BeginCapture");
  decode(d.args(), o);
  check_cuda(cudaStreamEndCapture(stream, &graph), "EndCapture");
  check_cuda(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
  const std::vector<std::vector<std::int32_t>> steps = {
      {4000, 3000, 100, 2500}, {1, 0, 17, 2500}, {0, 0, 0, 0}, {3999, 2999, 99, 1}};
  for (const auto& lens : steps) {
    c.poison_outputs();
    testing::copy_to_device(d.args().out, c.out.data(), c.out.size());
    set_lens(d, lens, stream);
    check_cuda(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
    check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    d.download(c.args());
    c.context_lens = lens;
    expect_matches_reference(c);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// Same inputs, same plan, same bits.
TEST(CudaDecode, Deterministic) {
  SKIP_WITHOUT_CUDA();
  for (DType dt : {DType::kF32, DType::kBF16}) {
    testing::HostCase c =
        testing::make_case(spec_for(dt, 32, 8, 128, 16, {20000, 1, 4096, 333, 0}));
    DeviceCase d(c.args());
    std::vector<std::uint8_t> first;
    std::vector<float> first_lse;
    for (int run = 0; run < 3; ++run) {
      decode(d.args(), cuda_options());
      testing::device_synchronize();
      d.download(c.args());
      if (run == 0) {
        first = c.out;
        first_lse = c.lse;
      } else {
        EXPECT_EQ(0, std::memcmp(first.data(), c.out.data(), first.size())) << "run " << run;
        EXPECT_EQ(0, std::memcmp(first_lse.data(), c.lse.data(), first_lse.size() * 4));
      }
    }
  }
}

std::string cpu_error(testing::HostCase& c) {
  DecodeOptions o;
  o.backend = Backend::kCpu;
  try {
    decode(c.args(), o);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// Checked mode reads the device tables and throws the CPU path's error; out stays untouched.
TEST(CudaDecode, CheckedModeReportsTheCpuErrors) {
  SKIP_WITHOUT_CUDA();
  struct Corruption {
    const char* what;
    int seq, entry, value;  // entry < 0: corrupt context_lens[seq] instead
  };
  const Corruption cases[] = {
      {"block id past the pool", 1, 3, 1 << 20},
      {"negative block id", 2, 0, -1},
      {"context longer than the table", 0, -1, 1 << 24},
      {"negative context", 3, -1, -5},
  };
  for (const Corruption& k : cases) {
    SCOPED_TRACE(k.what);
    testing::HostCase c =
        testing::make_case(spec_for(DType::kBF16, 8, 2, 64, 16, {100, 200, 50, 10}));
    if (k.entry >= 0) {
      c.block_table[static_cast<std::size_t>(k.seq) * c.table_stride + k.entry] = k.value;
    } else {
      c.context_lens[k.seq] = k.value;
    }
    const std::string want = cpu_error(c);
    DeviceCase d(c.args());
    DecodeOptions o = cuda_options();
    o.cuda_checked = true;
    try {
      decode(d.args(), o);
      ADD_FAILURE() << "checked mode accepted: " << k.what;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kOutOfRange);
      EXPECT_EQ(std::string(e.what()), want);
    }
    std::vector<std::uint8_t> out(c.out.size());
    testing::copy_to_host(out.data(), d.args().out, out.size());
    EXPECT_EQ(out, c.out) << "out was written";
  }
  // And valid tables pass checked mode with correct results.
  testing::HostCase c = testing::make_case(spec_for(DType::kBF16, 8, 2, 64, 16, {100, 0, 50}));
  DecodeOptions o = cuda_options();
  o.cuda_checked = true;
  testing::run_decode(c, o);
  expect_matches_reference(c);
}

// Unchecked mode with corrupt tables: no read outside the buffers (compute-sanitizer runs this
// test), every output written and finite; lengths are clamped to the table's capacity and tokens
// of out-of-range block ids are skipped.
TEST(CudaDecode, UncheckedCorruptTablesStayInBounds) {
  SKIP_WITHOUT_CUDA();
  testing::HostCase c =
      testing::make_case(spec_for(DType::kBF16, 8, 2, 64, 16, {100, 200, 50, 10}));
  c.block_table[1 * c.table_stride + 3] = 1 << 28;
  c.block_table[2 * c.table_stride + 0] = -7;
  c.context_lens[0] = 1 << 30;
  c.context_lens[3] = -3;
  DeviceCase d(c.args());
  decode(d.args(), cuda_options());
  testing::device_synchronize();
  d.download(c.args());
  // Sequence 0 now spans its whole table row, poisoned slots included, so only the others are
  // checked for values: 1 and 2 skip their bad blocks, 3 is empty.
  const std::size_t row = static_cast<std::size_t>(c.spec.num_heads) * c.spec.head_dim;
  for (std::size_t i = row; i < 4 * row; ++i) {
    ASSERT_TRUE(std::isfinite(load_as_float(c.out.data(), DType::kBF16, i))) << "element " << i;
    if (i >= 3 * row) EXPECT_EQ(load_as_float(c.out.data(), DType::kBF16, i), 0.f);
  }
  for (int h = 0; h < c.spec.num_heads; ++h) {
    EXPECT_EQ(c.lse[3 * c.spec.num_heads + h], -std::numeric_limits<float>::infinity());
  }
}

// Unchecked mode with a corrupt q_indptr (multi-token queries): the kernels clamp each sequence's
// rows into [0, num_q_tokens) and its count to max_q_len, so nothing is read or written outside
// q, out and lse (compute-sanitizer's memcheck runs this test), and the call still completes.
TEST(CudaDecode, UncheckedCorruptQueryIndptrStaysInBounds) {
  SKIP_WITHOUT_CUDA();
  // Six rows of q / out / lse, shared by four sequences through a garbage q_indptr.
  testing::HostCase c =
      testing::make_case(spec_for(DType::kBF16, 8, 2, 64, 16, {100, 200, 50, 10, 30, 40}));
  DeviceCase d(c.args());
  const std::vector<std::int32_t> indptr = {5, -3, 1 << 30, 2, -100};
  DeviceBuffer dev_indptr(indptr.data(), indptr.size() * sizeof(std::int32_t));
  DecodeArgs a = d.args();
  a.batch = 4;
  a.q_indptr = dev_indptr.as<std::int32_t>();
  a.num_q_tokens = 6;
  a.max_q_len = 4;
  decode(a, cuda_options());
  testing::device_synchronize();
  // And checked mode names the first bad entry.
  DecodeOptions checked = cuda_options();
  checked.cuda_checked = true;
  try {
    decode(a, checked);
    ADD_FAILURE() << "a corrupt q_indptr passed checked mode";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "q_indptr[0]");
  }
}

// out is stored two elements at a time: one element off is an error naming out, before any
// launch (a misaligned store would fault and ruin the context), and nothing is written.
TEST(CudaDecode, MisalignedOutIsAnError) {
  SKIP_WITHOUT_CUDA();
  for (const DType t : {DType::kF32, DType::kBF16}) {
    testing::HostCase c = testing::make_case(spec_for(t, 16, 4, 64, 16, {300, 17}));
    DeviceCase d(c.args());
    const std::size_t elems = c.out.size() / dtype_size(t);
    DeviceBuffer shifted((elems + 2) * dtype_size(t));
    check_cuda(cudaMemset(shifted.get(), 0x5a, shifted.size()), "cudaMemset");
    DecodeArgs a = d.args();
    a.out = shifted.as<char>() + dtype_size(t);  // valid memory, one element off
    try {
      decode(a, cuda_options());
      ADD_FAILURE() << "a misaligned out was accepted (" << dtype_name(t) << ")";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_EQ(e.argument(), "out");
    }
    std::vector<std::uint8_t> after(shifted.size());
    shifted.to_host(after);
    for (const std::uint8_t byte : after) ASSERT_EQ(byte, 0x5a);
  }
}

// A caller stream and workspace; a workspace that is too small is an error naming it.
TEST(CudaDecode, StreamAndWorkspace) {
  SKIP_WITHOUT_CUDA();
  testing::HostCase c = testing::make_case(spec_for(DType::kF16, 16, 4, 80, 32, {900, 3, 0, 2048}));
  DeviceCase d(c.args());
  cudaStream_t stream;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  const std::size_t ws_bytes = cuda_workspace_size(d.args());
  EXPECT_GT(ws_bytes, 0u);
  DeviceBuffer ws(ws_bytes);
  DecodeOptions o = cuda_options();
  o.cuda_stream = stream;
  o.workspace = ws.get();
  o.workspace_bytes = ws_bytes;
  decode(d.args(), o);
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  d.download(c.args());
  expect_matches_reference(c);

  o.workspace_bytes = ws_bytes - 1;
  try {
    decode(d.args(), o);
    ADD_FAILURE() << "a too-small workspace was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_EQ(e.argument(), "workspace_bytes");
  }
  cudaStreamDestroy(stream);
}

// Two host threads decode on two streams at once without a caller workspace (the library's own,
// stream-ordered workspace), each alternating between two shapes whose workspaces differ in size;
// every result must equal, bit for bit, the result of the same call made alone.
TEST(CudaDecode, ConcurrentStreamsUseSeparateWorkspaces) {
  SKIP_WITHOUT_CUDA();
  std::vector<testing::HostCase> cases;
  cases.push_back(testing::make_case(spec_for(DType::kBF16, 32, 8, 128, 16, {4000, 1, 2500, 0})));
  cases.push_back(testing::make_case(spec_for(DType::kF16, 8, 2, 64, 16, {30000, 7})));
  cases.push_back(testing::make_case(spec_for(DType::kF32, 6, 2, 80, 32, {900, 3000, 5})));
  cases.push_back(testing::make_case(spec_for(DType::kBF16, 64, 8, 128, 16, {16000, 12000})));
  std::vector<std::unique_ptr<DeviceCase>> dev;
  std::vector<std::vector<std::uint8_t>> alone_out;
  std::vector<std::vector<float>> alone_lse;
  for (auto& c : cases) {
    dev.push_back(std::make_unique<DeviceCase>(c.args()));
    decode(dev.back()->args(), cuda_options());
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    dev.back()->download(c.args());
    expect_matches_reference(c);
    alone_out.push_back(c.out);
    alone_lse.push_back(c.lse);
  }
  std::atomic<int> mismatches{0};
  auto worker = [&](int first) {
    cudaStream_t stream;
    check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    DecodeOptions o = cuda_options();
    o.cuda_stream = stream;
    for (int rep = 0; rep < 40; ++rep) {
      const int k = first + rep % 2;      // thread 0: cases 0, 1; thread 1: cases 2, 3
      testing::HostCase mine = cases[k];  // its own host output buffers
      mine.poison_outputs();
      const DeviceCase& d = *dev[k];
      check_cuda(cudaMemsetAsync(d.args().out, 0xff, mine.out.size(), stream), "cudaMemsetAsync");
      decode(d.args(), o);
      d.download(mine.args(), stream);
      if (mine.out != alone_out[k] ||
          std::memcmp(mine.lse.data(), alone_lse[k].data(), mine.lse.size() * sizeof(float)) != 0) {
        ++mismatches;
      }
    }
    cudaStreamDestroy(stream);
  };
  std::thread t0(worker, 0), t1(worker, 2);
  t0.join();
  t1.join();
  EXPECT_EQ(mismatches.load(), 0);
}

#endif  // PAGEDATTN_TEST_HAS_CUDA_RUNTIME

}  // namespace
}  // namespace pagedattn
