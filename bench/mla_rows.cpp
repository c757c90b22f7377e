// pagedattn-bench --mla: each shape's latent cache as one combined [blocks][BS][576] tensor (vLLM's
// layout) with fragmented tables, in enough copies that consecutive steps read memory the last
// level cache does not hold; mla_decode timed over them, its error checked against the f64
// reference on sequence 0. GB/s counts each attended latent row once. On the CUDA backend the
// copies live on the device and steps are timed as the GQA rows are (cuda_time_steps: CUDA-graph
// replays, or plain launches with --plain).
#include "mla_rows.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "bench_variants.hpp"
#include "cuda_timing.hpp"
#include "median.hpp"
#include "pagedattn/mla.hpp"
#include "pagedattn/reference.hpp"
#include "pagedattn/testing/device_memory.hpp"
#include "pagedattn/testing/tables.hpp"
#include "pagedattn/testing/tolerance.hpp"
#include "rotation.hpp"

namespace pagedattn::bench {
namespace {

constexpr int kRank = 512, kRope = 64, kWidth = kRank + kRope;
constexpr double kColdBytes = 512.0 * (1 << 20);  // copies until the caches span this much

// One copy of a shape's cache: its latent pool and the table into it.
struct MlaCopy {
  std::vector<std::uint8_t> pool;
  std::vector<std::int32_t> table;
};

// One shape's buffers: the copies the steps rotate over, q and out.
struct MlaRows {
  int B = 0, H = 0, BS = 0, q_len = 1, max_blocks = 0, num_blocks = 0;
  DType q_dtype = DType::kBF16, kv_dtype = DType::kBF16;
  float kv_scale = 1.f;
  std::vector<MlaCopy> copies;
  std::vector<std::int32_t> lens, indptr;
  std::vector<std::uint8_t> q, out;
  std::vector<float> lse;

  MlaDecodeArgs args(int i) {
    const MlaCopy& c = copy_for_step(copies, i);
    MlaDecodeArgs a;
    a.batch = B;
    a.num_heads = H;
    a.block_size = BS;
    a.num_blocks = num_blocks;
    a.max_blocks_per_seq = max_blocks;
    a.q_dtype = a.out_dtype = q_dtype;
    a.q_nope = q.data();
    a.q_pe = q.data() + kRank * dtype_size(q_dtype);
    a.q_nope_row_stride = a.q_pe_row_stride = static_cast<std::int64_t>(H) * kWidth;
    a.q_nope_head_stride = a.q_pe_head_stride = kWidth;  // FlashMLA's one q of 576 per head
    a.kv_dtype = kv_dtype;
    a.kv_scale = kv_scale;
    a.c_cache = c.pool.data();
    a.kpe_cache = c.pool.data() + kRank * dtype_size(kv_dtype);
    a.c_strides = a.kpe_strides = {static_cast<std::int64_t>(BS) * kWidth, kWidth};
    a.block_table = c.table.data();
    a.context_lens = lens.data();
    apply_q_len(q_len, indptr.data(), a);
    a.out = out.data();
    a.lse = lse.data();
    return a;
  }
};

MlaRows make_rows(const Shape& s, DType q_dtype, DType kv_dtype, bool contiguous, int q_len) {
  MlaRows m;
  m.B = s.batch;
  m.H = s.heads;
  m.BS = s.block_size;
  m.q_len = q_len;
  m.q_dtype = q_dtype;
  m.kv_dtype = kv_dtype;
  if (is_fp8(kv_dtype)) m.kv_scale = 0.5f;
  m.lens.assign(static_cast<std::size_t>(s.batch), s.context);
  m.max_blocks = (s.context + s.block_size - 1) / s.block_size;
  m.num_blocks = m.max_blocks * s.batch;
  const double pool_bytes =
      static_cast<double>(m.num_blocks) * s.block_size * kWidth * dtype_size(kv_dtype);
  const int copies = rotation_copies(pool_bytes, kColdBytes, 8);
  std::mt19937_64 rng(20261207u + static_cast<std::uint64_t>(s.batch) * 131 + s.context);
  std::normal_distribution<float> normal(0.f, 1.f);
  // Each latent row is a random window of a table of encoded N(0, 1) values: pools of several
  // GB fill at copy speed, and no two rows of a tile are alike.
  constexpr std::size_t kTable = std::size_t{1} << 16;
  const std::size_t esz = dtype_size(kv_dtype), row_bytes = kWidth * esz;
  std::vector<std::uint8_t> values(kTable * esz);
  for (std::size_t i = 0; i < kTable; ++i) {
    store_from_float(values.data(), kv_dtype, i, normal(rng) / m.kv_scale);
  }
  const std::size_t rows = static_cast<std::size_t>(m.num_blocks) * s.block_size;
  for (int c = 0; c < copies; ++c) {
    std::vector<std::uint8_t> pool(rows * row_bytes);
    for (std::size_t r = 0; r < rows; ++r) {
      const std::size_t at = rng() % (kTable - kWidth);
      std::memcpy(pool.data() + r * row_bytes, values.data() + at * esz, row_bytes);
    }
    m.copies.push_back({std::move(pool), testing::table_from_pool(
                                             testing::block_pool(m.num_blocks, !contiguous, rng),
                                             m.lens, s.block_size, m.max_blocks)});
  }
  m.indptr = uniform_q_indptr(s.batch, q_len);
  const std::size_t q_elems = static_cast<std::size_t>(s.batch) * q_len * s.heads * kWidth;
  m.q.resize(q_elems * dtype_size(q_dtype));
  for (std::size_t i = 0; i < q_elems; ++i) store_from_float(m.q.data(), q_dtype, i, normal(rng));
  m.out.resize(static_cast<std::size_t>(s.batch) * q_len * s.heads * kRank * dtype_size(q_dtype));
  m.lse.resize(static_cast<std::size_t>(s.batch) * q_len * s.heads);
  return m;
}

// A copy of a shape's cache on the device.
struct DeviceCopy {
  testing::DeviceBuffer pool, table;
  explicit DeviceCopy(const MlaCopy& c)
      : pool(c.pool.data(), c.pool.size()), table(c.table.data(), c.table.size() * 4) {}
};

// The copies, q, out and lse of a shape on the device; args(i) points step i at them.
struct DeviceRows {
  std::vector<DeviceCopy> copies;
  testing::DeviceBuffer lens, indptr, q, out, lse;
  explicit DeviceRows(const MlaRows& m)
      : lens(m.lens.data(), m.lens.size() * 4),
        indptr(m.indptr.data(), m.indptr.size() * 4),
        q(m.q.data(), m.q.size()),
        out(m.out.size()),
        lse(m.lse.size() * 4) {
    for (const MlaCopy& c : m.copies) copies.emplace_back(c);
  }
  MlaDecodeArgs args(MlaRows& m, int i) const {
    const DeviceCopy& c = copy_for_step(copies, i);
    MlaDecodeArgs a = m.args(i);
    a.q_nope = q.get();
    a.q_pe = q.as<char>() + kRank * dtype_size(m.q_dtype);
    a.c_cache = c.pool.get();
    a.kpe_cache = c.pool.as<char>() + kRank * dtype_size(m.kv_dtype);
    a.block_table = c.table.as<std::int32_t>();
    a.context_lens = lens.as<std::int32_t>();
    if (a.q_indptr != nullptr) a.q_indptr = indptr.as<std::int32_t>();
    a.out = out.get();
    a.lse = lse.as<float>();
    return a;
  }
};

// max |out - ref| / max |ref| over sequence 0's rows (of step 0's buffers).
double rel_err_of_sequence_0(MlaRows& m) {
  MlaDecodeArgs a = m.args(0);
  a.batch = 1;
  if (a.q_indptr) a.num_q_tokens = m.q_len;
  const ReferenceResult ref = mla_reference_decode(a);
  double scale = 1e-30, err = 0;
  for (std::size_t i = 0; i < ref.out.size(); ++i) {
    scale = std::max(scale, std::fabs(ref.out[i]));
    const double got = load_as_float(a.out, a.out_dtype, i);
    err = std::isfinite(got) ? std::max(err, std::fabs(got - ref.out[i]))
                             : std::numeric_limits<double>::infinity();
  }
  return err / scale;
}

}  // namespace

int run_mla_rows(const Options& o, double read_bw, std::FILE* info) {
  if (o.csv) {
    std::printf(
        "backend,dtype,kv_dtype,batch,heads,context,block_size,q_len,ms,gbps,pct_read_bw,"
        "rel_err,batch_invariant\n");
  } else {
    std::printf("%-5s %-5s %-9s %5s %4s %7s %4s %5s %10s %8s %8s %10s\n", "impl", "dtype", "kv",
                "B", "H", "ctx", "BS", "q_len", "ms", "GB/s", "%readBW", "rel_err");
  }
  bool accurate = true;
  for (DType dtype : o.dtypes) {
    const DType kv = o.kv_dtype_for(dtype);
    for (const Shape& s : o.shapes) {
      MlaRows m = make_rows(s, dtype, kv, o.contiguous, o.q_len);
      const bool cuda = o.backend == "cuda";
      DecodeOptions opt;
      opt.backend = cuda ? Backend::kCuda : Backend::kCpu;
      opt.num_threads = o.threads;
      opt.batch_invariant = o.batch_invariant;
      // The error of step 0's outputs (in m.out, m.lse), before the timed steps overwrite them.
      double ms = 0, err = 0;
      if (cuda) {
        const DeviceRows d(m);
        mla_decode(d.args(m, 0), opt);
        testing::device_synchronize();
        d.out.to_host(m.out);
        d.lse.to_host(m.lse);
        err = rel_err_of_sequence_0(m);
        ms = cuda_time_steps(
            [&](int i, void* stream) {
              DecodeOptions step = opt;
              step.cuda_stream = stream;
              mla_decode(d.args(m, i), step);
            },
            std::max(20, static_cast<int>(m.copies.size())), nullptr, !o.plain, o.iters);
      } else {
        mla_decode(m.args(0), opt);
        err = rel_err_of_sequence_0(m);
        ms = median_ms([&](int i) { mla_decode(m.args(i), opt); },
                       static_cast<int>(m.copies.size()), o.iters, o.min_time, o.max_time, o.clock);
      }
      const double bytes =
          static_cast<double>(s.batch) * s.context * kWidth * static_cast<double>(dtype_size(kv));
      const double gbps = bytes / (ms * 1e-3) / 1e9;
      const double tol = testing::out_tolerance(dtype);
      accurate = accurate && !(err > tol);
      if (o.csv) {
        std::printf("%s,%s,%s,%d,%d,%d,%d,%d,%.4f,%.2f,%.1f,%.3g,%d\n", o.backend.c_str(),
                    dtype_name(dtype), dtype_name(kv), s.batch, s.heads, s.context, s.block_size,
                    o.q_len, ms, gbps, 100.0 * gbps / read_bw, err, o.batch_invariant ? 1 : 0);
      } else {
        std::printf("%-5s %-5s %-9s %5d %4d %7d %4d %5d %10.4f %8.2f %8.1f %10.3g\n",
                    o.backend.c_str(), dtype_name(dtype), dtype_name(kv), s.batch, s.heads,
                    s.context, s.block_size, o.q_len, ms, gbps, 100.0 * gbps / read_bw, err);
      }
      std::fflush(stdout);
    }
  }
  if (!accurate) {
    std::fprintf(info, "pagedattn-bench: a rel_err exceeds its dtype's tolerance\n");
    return 1;
  }
  return 0;
}

}  // namespace pagedattn::bench
