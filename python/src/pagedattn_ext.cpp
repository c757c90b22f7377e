// pagedattn._ext: the nanobind module under the pagedattn Python package.
//
// Every tensor argument arrives as any DLPack-capable object (NumPy, PyTorch, CuPy, JAX, ...) and
// is used in place: dtype, shape, strides and device are read from the tensor, checked, and turned
// into the library's argument structs. A mismatch throws pagedattn::Error naming the Python
// argument before anything is written; the Python side turns it into pagedattn.Error.
// The Python wrapper (pagedattn/__init__.py) allocates missing outputs, picks the default stream
// and unwraps integer tensors marked as bf16 or fp8 (passing their names in `tags`); this file
// does the checking and the calls.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "pagedattn/block_manager.hpp"
#include "pagedattn/merge_states.hpp"
#include "pagedattn/pagedattn.hpp"
#include "pagedattn/validate.hpp"

#if PAGEDATTN_PY_CUDA
#include <cuda_runtime_api.h>

#include "cuda_error.hpp"
#endif

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using pagedattn::Backend;
using pagedattn::DType;
using pagedattn::Error;
using pagedattn::ErrorCode;

// ----------------------------------------------------------------------------------------------
// Errors

[[noreturn]] void bad(ErrorCode code, const std::string& argument, const std::string& what,
                      const std::string& value, const std::string& reason) {
  throw Error(code, argument, argument + what + " = " + value + ": " + reason);
}

const char* code_name(ErrorCode c) {
  switch (c) {
    case ErrorCode::kInvalidArgument:
      return "invalid_argument";
    case ErrorCode::kOutOfRange:
      return "out_of_range";
    case ErrorCode::kUnsupported:
      return "unsupported";
    case ErrorCode::kBackendUnavailable:
      return "backend_unavailable";
    case ErrorCode::kDeviceError:
      return "device_error";
  }
  return "unknown";
}

// ----------------------------------------------------------------------------------------------
// Devices

enum class DeviceKind { kCpu, kCuda };

struct Device {
  DeviceKind kind = DeviceKind::kCpu;
  int id = 0;
  bool operator==(const Device& o) const {
    return kind == o.kind && (kind == DeviceKind::kCpu || id == o.id);
  }
  bool operator!=(const Device& o) const { return !(*this == o); }
  std::string str() const {
    return kind == DeviceKind::kCpu ? "cpu" : "cuda:" + std::to_string(id);
  }
};

// Makes the tensors' device current for the library's CUDA calls, and restores the previous one.
class DeviceGuard {
 public:
  explicit DeviceGuard(const Device& d) {
#if PAGEDATTN_PY_CUDA
    if (d.kind != DeviceKind::kCuda) return;
    int current = 0;
    pagedattn::detail::cuda::check(cudaGetDevice(&current), "cudaGetDevice");
    if (current != d.id) {
      pagedattn::detail::cuda::check(cudaSetDevice(d.id), "cudaSetDevice");
      previous_ = current;
    }
#else
    (void)d;
#endif
  }
  ~DeviceGuard() {
#if PAGEDATTN_PY_CUDA
    if (previous_ >= 0) cudaSetDevice(previous_);
#endif
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

// ----------------------------------------------------------------------------------------------
// Tensors

// DLPack's codes of the 8-bit float formats (DLPack 1.1, kDLFloat8_*; nanobind's dtype_code does
// not name them). PyTorch's float8_e4m3fn and float8_e5m2 are the OCP formats of fp8 caches.
constexpr std::uint8_t kDLFloat8E4M3Fn = 10;
constexpr std::uint8_t kDLFloat8E5M2 = 12;

const char* float8_name(std::uint8_t code) {
  switch (code) {
    case 7:
      return "float8_e3m4";
    case 8:
      return "float8_e4m3";
    case 9:
      return "float8_e4m3b11fnuz";
    case kDLFloat8E4M3Fn:
      return "float8_e4m3fn";
    case 11:
      return "float8_e4m3fnuz";
    case kDLFloat8E5M2:
      return "float8_e5m2";
    case 13:
      return "float8_e5m2fnuz";
    case 14:
      return "float8_e8m0fnu";
  }
  return nullptr;
}

std::string dtype_str(nb::dlpack::dtype dt) {
  if (dt.bits == 8 && dt.lanes == 1 && float8_name(dt.code) != nullptr) {
    return float8_name(dt.code);
  }
  std::string base;
  switch (static_cast<nb::dlpack::dtype_code>(dt.code)) {
    case nb::dlpack::dtype_code::Int:
      base = "int";
      break;
    case nb::dlpack::dtype_code::UInt:
      base = "uint";
      break;
    case nb::dlpack::dtype_code::Float:
      base = "float";
      break;
    case nb::dlpack::dtype_code::Bfloat:
      base = "bfloat";
      break;
    case nb::dlpack::dtype_code::Complex:
      base = "complex";
      break;
    case nb::dlpack::dtype_code::Bool:
      return "bool";
    default:
      base = "code" + std::to_string(dt.code) + "_";
  }
  std::string s = base + std::to_string(dt.bits);
  if (dt.lanes != 1) s += "x" + std::to_string(dt.lanes);
  return s;
}

bool is(nb::dlpack::dtype dt, nb::dlpack::dtype_code code, int bits) {
  return dt.code == static_cast<std::uint8_t>(code) && dt.bits == bits && dt.lanes == 1;
}

// What the binding reads from one tensor argument. Holds the import, so the memory stays alive.
struct Tensor {
  std::string name;
  nb::ndarray<nb::ro> in;  // set for inputs
  nb::ndarray<> out;       // set for outputs
  void* data = nullptr;
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;  // in elements
  nb::dlpack::dtype dt{};
  Device device;
  // The storage dtype a marked integer tensor holds: kBF16 for a 16-bit one marked with
  // pagedattn.bf16(), kFP8E4M3 or kFP8E5M2 for an 8-bit one marked with pagedattn.fp8_e4m3() or
  // pagedattn.fp8_e5m2() (NumPy has neither type).
  std::optional<DType> marked;

  int ndim() const { return static_cast<int>(shape.size()); }
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (auto s : shape) n *= s;
    return n;
  }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * ((dt.bits + 7) / 8); }

  std::string shape_str() const {
    std::ostringstream os;
    os << '(';
    for (std::size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
    os << (shape.size() == 1 ? ",)" : ")");
    return os.str();
  }

  // The storage dtype of a float tensor. The fp8 formats are returned for any tensor, so that the
  // library refuses them where they do not belong with its own error (q_dtype, src_dtype, ...).
  DType float_dtype() const {
    if (marked) {
      const int bits = pagedattn::is_fp8(*marked) ? 8 : 16;
      if (is(dt, nb::dlpack::dtype_code::UInt, bits) || is(dt, nb::dlpack::dtype_code::Int, bits)) {
        return *marked;
      }
      bad(ErrorCode::kInvalidArgument, name, ".dtype", dtype_str(dt),
          bits == 8 ? std::string("pagedattn.") + pagedattn::dtype_name(*marked) +
                          "() marks an 8-bit integer tensor holding fp8 codes"
                    : std::string("pagedattn.bf16() marks a 16-bit integer tensor holding bf16 "
                                  "bit patterns"));
    }
    if (is(dt, nb::dlpack::dtype_code::Float, 32)) return DType::kF32;
    if (is(dt, nb::dlpack::dtype_code::Float, 16)) return DType::kF16;
    if (is(dt, nb::dlpack::dtype_code::Bfloat, 16)) return DType::kBF16;
    if (dt.bits == 8 && dt.lanes == 1 && dt.code == kDLFloat8E4M3Fn) return DType::kFP8E4M3;
    if (dt.bits == 8 && dt.lanes == 1 && dt.code == kDLFloat8E5M2) return DType::kFP8E5M2;
    if (name == "k_cache" || name == "v_cache") {
      bad(ErrorCode::kInvalidArgument, name, ".dtype", dtype_str(dt),
          "expected float32, float16, bfloat16, float8_e4m3fn or float8_e5m2 (bf16 bits in a "
          "uint16 tensor: wrap it with pagedattn.bf16(); fp8 codes in a uint8 tensor: with "
          "pagedattn.fp8_e4m3() or pagedattn.fp8_e5m2())");
    }
    bad(ErrorCode::kInvalidArgument, name, ".dtype", dtype_str(dt),
        "expected float32, float16 or bfloat16 (bf16 bits in a uint16 tensor: wrap it with "
        "pagedattn.bf16())");
  }

  void require_int32() const {
    if (!is(dt, nb::dlpack::dtype_code::Int, 32)) {
      bad(ErrorCode::kInvalidArgument, name, ".dtype", dtype_str(dt), "expected int32");
    }
  }

  void require_float32() const {
    if (!is(dt, nb::dlpack::dtype_code::Float, 32)) {
      bad(ErrorCode::kInvalidArgument, name, ".dtype", dtype_str(dt), "expected float32");
    }
  }

  void require_ndim(int n, const char* layout) const {
    if (ndim() != n) {
      bad(ErrorCode::kInvalidArgument, name, ".shape", shape_str(),
          "expected " + std::to_string(n) + " dimensions " + layout);
    }
  }

  void require_dim(int i, std::int64_t expected, const std::string& why) const {
    if (shape[i] != expected) {
      bad(ErrorCode::kInvalidArgument, name, ".shape", shape_str(),
          "dimension " + std::to_string(i) + " must be " + std::to_string(expected) + " (" + why +
              ")");
    }
  }

  // Row-major contiguity over dimensions [first, ndim); dimensions of size 1 are free.
  bool contiguous_from(int first) const {
    if (numel() == 0) return true;
    std::int64_t expected = 1;
    for (int i = ndim() - 1; i >= first; --i) {
      if (shape[i] != 1 && strides[i] != expected) return false;
      expected *= shape[i];
    }
    return true;
  }

  void require_contiguous() const {
    if (numel() > 1 && !contiguous_from(0)) {
      bad(ErrorCode::kInvalidArgument, name, ".strides", strides_str(),
          "must be contiguous (row-major); pass a contiguous tensor");
    }
  }

  // For a [batch, num_heads, head_dim] tensor (q, out): the elements between consecutive
  // sequences' rows. A sequence's heads must be contiguous, but sequences may lie any distance
  // apart in increasing order (q as a view into a fused QKV projection, out as a slice of a wider
  // buffer). 0 when the rows are adjacent or there is at most one, so a dense tensor is passed as
  // dense and a size-1 batch's stride, which PyTorch leaves arbitrary, is never read.
  std::int64_t sequence_stride() const {
    if (!contiguous_from(1)) {
      bad(ErrorCode::kInvalidArgument, name, ".strides", strides_str(),
          "each sequence's [num_heads, head_dim] must be contiguous (row-major); only the "
          "stride between sequences may be larger");
    }
    const std::int64_t row = shape[1] * shape[2];
    if (shape[0] <= 1 || row == 0 || strides[0] == row) return 0;
    if (strides[0] < row) {
      bad(ErrorCode::kInvalidArgument, name, ".strides", strides_str(),
          "sequences must be at least num_heads * head_dim = " + std::to_string(row) +
              " elements apart, in increasing order (rows must not overlap)");
    }
    return strides[0];
  }

  std::string strides_str() const {
    std::ostringstream os;
    os << '(';
    for (std::size_t i = 0; i < strides.size(); ++i) os << (i ? ", " : "") << strides[i];
    os << (strides.size() == 1 ? ",)" : ")");
    return os.str();
  }

  int dim_int(int i) const {
    if (shape[i] > INT_MAX) {
      bad(ErrorCode::kInvalidArgument, name, ".shape", shape_str(),
          "dimension " + std::to_string(i) + " exceeds the int32 range");
    }
    return static_cast<int>(shape[i]);
  }

  void require_device(const Device& d, const std::string& ref) const {
    if (device != d) {
      bad(ErrorCode::kInvalidArgument, name, ".device", device.str(),
          "must be on the same device as " + ref + " (" + d.str() + ")");
    }
  }
};

Device device_of(int type, int id, const std::string& name) {
  if (type == nb::device::cpu::value || type == nb::device::cuda_host::value) {
    return {DeviceKind::kCpu, 0};
  }
  if (type == nb::device::cuda::value) return {DeviceKind::kCuda, id};
  bad(ErrorCode::kInvalidArgument, name, ".device", "dlpack device type " + std::to_string(type),
      "only CPU and CUDA tensors are supported");
}

template <typename Array>
void describe(Tensor& t, const Array& a) {
  t.data = const_cast<void*>(static_cast<const void*>(a.data()));
  t.dt = a.dtype();
  t.shape.resize(a.ndim());
  t.strides.resize(a.ndim());
  for (std::size_t i = 0; i < a.ndim(); ++i) {
    t.shape[i] = static_cast<std::int64_t>(a.shape(i));
    t.strides[i] = a.stride(i);
  }
  t.device = device_of(a.device_type(), a.device_id(), t.name);
}

// A tensor the Python layer described as a plain tuple (pagedattn/__init__.py, _ref): (data
// pointer, DLPack type code, bits, DLPack device type, device index, shape, strides in elements).
// PyTorch tensors come this way: their DLPack export costs more than the rest of a small call.
bool import_described(nb::handle h, Tensor& t) {
  if (!nb::isinstance<nb::tuple>(h)) return false;
  const nb::tuple d = nb::borrow<nb::tuple>(h);
  if (d.size() != 7) return false;
  t.data = reinterpret_cast<void*>(nb::cast<std::uintptr_t>(d[0]));
  t.dt.code = nb::cast<std::uint8_t>(d[1]);
  t.dt.bits = nb::cast<std::uint8_t>(d[2]);
  t.dt.lanes = 1;
  const nb::tuple shape = nb::cast<nb::tuple>(d[5]), strides = nb::cast<nb::tuple>(d[6]);
  if (shape.size() != strides.size()) return false;
  t.shape.resize(shape.size());
  t.strides.resize(shape.size());
  for (std::size_t i = 0; i < shape.size(); ++i) {
    t.shape[i] = nb::cast<std::int64_t>(shape[i]);
    t.strides[i] = nb::cast<std::int64_t>(strides[i]);
  }
  t.device = device_of(nb::cast<int>(d[3]), nb::cast<int>(d[4]), t.name);
  return true;
}

// Imports a tensor without copying. Outputs must be writable.
Tensor import_tensor(nb::handle h, const std::string& name, bool writable,
                     std::optional<DType> marked) {
  Tensor t;
  t.name = name;
  t.marked = marked;
  if (import_described(h, t)) return t;
  if (writable) {
    if (nb::try_cast(h, t.out, /*convert=*/false)) {
      describe(t, t.out);
      return t;
    }
    nb::ndarray<nb::ro> probe;
    if (nb::try_cast(h, probe, /*convert=*/false)) {
      bad(ErrorCode::kInvalidArgument, name, "", "a read-only tensor",
          "must be writable (it is an output)");
    }
  } else if (nb::try_cast(h, t.in, /*convert=*/false)) {
    describe(t, t.in);
    return t;
  }
  std::string type_name = nb::type_name(h.type()).c_str();
  bad(ErrorCode::kInvalidArgument, name, "", "an object of type " + type_name,
      "expected a tensor supporting DLPack or the buffer protocol (NumPy, PyTorch, CuPy, JAX, "
      "...)");
}

// The dtype `tags` gives the argument `name`: an entry "name" or "name:bf16" marks bf16 bits,
// "name:fp8_e4m3" and "name:fp8_e5m2" fp8 codes (pagedattn.bf16() and the rest). An entry of
// another form is an error naming `tags`.
std::optional<DType> tagged(const std::vector<std::string>& tags, const char* name) {
  const std::size_t n = std::char_traits<char>::length(name);
  for (const std::string& tag : tags) {
    if (tag.compare(0, n, name) != 0) continue;
    if (tag.size() == n) return DType::kBF16;
    if (tag[n] != ':') continue;
    const std::string kind = tag.substr(n + 1);
    if (kind == "bf16") return DType::kBF16;
    if (kind == "fp8_e4m3") return DType::kFP8E4M3;
    if (kind == "fp8_e5m2") return DType::kFP8E5M2;
    bad(ErrorCode::kInvalidArgument, "tags", "", "'" + tag + "'",
        "expected 'name', 'name:bf16', 'name:fp8_e4m3' or 'name:fp8_e5m2'");
  }
  return std::nullopt;
}

Tensor input(nb::handle h, const char* name, const std::vector<std::string>& tags = {}) {
  return import_tensor(h, name, false, tagged(tags, name));
}

Tensor output(nb::handle h, const char* name, const std::vector<std::string>& tags = {}) {
  return import_tensor(h, name, true, tagged(tags, name));
}

// The backend for tensors on `device`: "auto" follows the device (PAGEDATTN_BACKEND is not
// consulted: the tensors' memory decides); an explicit choice must be available and match it.
Backend pick_backend(const std::string& requested, const Device& device, const char* ref) {
  const Backend b = pagedattn::parse_backend(requested, "backend");
  const Backend want = device.kind == DeviceKind::kCuda ? Backend::kCuda : Backend::kCpu;
  if (want == Backend::kCuda || b == Backend::kCuda) {
    pagedattn::resolve_backend(Backend::kCuda);  // kBackendUnavailable, saying why
  }
  if (b != Backend::kAuto && b != want) {
    bad(ErrorCode::kInvalidArgument, "backend", "", "'" + requested + "'",
        std::string("does not match the device of ") + ref + " (" + device.str() + ")");
  }
  return want;
}

// ----------------------------------------------------------------------------------------------
// Cache layouts

// Which dimensions of a 4-D cache tensor hold the kv heads and the slots of a block: HND
// [num_blocks, num_kv_heads, block_size, head_dim], the library's default, or NHD
// [num_blocks, block_size, num_kv_heads, head_dim], FlashInfer's and vLLM's. Either way the
// tensors' strides go to the library as kv_strides, so views (K and V as halves of one tensor, a
// slice of a larger pool) are read and written in place.
struct KvLayout {
  bool nhd = false;

  int heads_dim() const { return nhd ? 2 : 1; }  // the num_kv_heads dimension
  int slots_dim() const { return nhd ? 1 : 2; }  // the block_size dimension
  const char* dims() const {
    return nhd ? "[num_blocks, block_size, num_kv_heads, head_dim] (kv_layout 'NHD')"
               : "[num_blocks, num_kv_heads, block_size, head_dim] (kv_layout 'HND')";
  }
  // "num_kv_heads, k_cache.shape[1]" and the like, for shape errors of the other tensors.
  std::string kv_heads_ref() const {
    return "num_kv_heads, k_cache.shape[" + std::to_string(heads_dim()) + "]";
  }
};

// "HND" or "NHD", in any case. The Python wrapper checks this first; the module checks again for
// callers of the module itself.
KvLayout parse_kv_layout(const std::string& s) {
  std::string upper = s;
  for (char& ch : upper) {
    if (ch >= 'a' && ch <= 'z') ch = static_cast<char>(ch - 'a' + 'A');
  }
  if (upper == "HND") return KvLayout{false};
  if (upper == "NHD") return KvLayout{true};
  bad(ErrorCode::kInvalidArgument, "kv_layout", "", "'" + s + "'",
      "expected 'HND' ([num_blocks, num_kv_heads, block_size, head_dim]) or 'NHD' "
      "([num_blocks, block_size, num_kv_heads, head_dim])");
}

// The pool's sizes as the library takes them, read from a 4-D cache tensor in `layout`.
struct PoolDims {
  int num_blocks, num_kv_heads, block_size, head_dim;
};

PoolDims pool_dims(const Tensor& k, KvLayout layout) {
  return {k.dim_int(0), k.dim_int(layout.heads_dim()), k.dim_int(layout.slots_dim()), k.dim_int(3)};
}

// kv_strides for a K/V cache pair of equal shapes, from the tensors' element strides. head_dim
// must be contiguous, and K and V must step alike: the library takes one set of strides for
// both. The stride of a dimension of size 1 is never used and PyTorch leaves it arbitrary, so it
// is replaced by the dense layout's before anything is compared. A pair laid out as dense HND
// gets the default strides, exactly what the library got before strided caches existed.
pagedattn::CacheStrides cache_strides(const Tensor& k, const Tensor& v, KvLayout layout) {
  // A pool with nothing in it is never read; its strides (NumPy 2 gives an empty array zero
  // strides) say nothing.
  if (k.numel() == 0) return {};
  const PoolDims d = pool_dims(k, layout);
  std::int64_t dense[4];
  dense[3] = 1;
  for (int i = 2; i >= 0; --i) dense[i] = dense[i + 1] * k.shape[i + 1];
  auto effective = [&](const Tensor& t) {
    std::vector<std::int64_t> s(4);
    for (int i = 0; i < 4; ++i) s[i] = t.shape[i] == 1 ? dense[i] : t.strides[i];
    return s;
  };
  for (const Tensor* t : {&k, &v}) {
    if (t->shape[3] > 1 && t->strides[3] != 1) {
      bad(ErrorCode::kInvalidArgument, t->name, ".strides", t->strides_str(),
          "the last dimension (head_dim) must be contiguous (stride 1)");
    }
  }
  const std::vector<std::int64_t> ks = effective(k), vs = effective(v);
  if (vs != ks) {
    bad(ErrorCode::kInvalidArgument, "v_cache", ".strides", v.strides_str(),
        "must equal k_cache.strides " + k.strides_str() +
            " (K and V share one layout; they may be two views into one tensor)");
  }
  for (int i = 0; i < 3; ++i) {
    if (ks[i] <= 0) {
      bad(ErrorCode::kInvalidArgument, "k_cache", ".strides", k.strides_str(),
          "dimension " + std::to_string(i) +
              " must have a positive stride (no broadcast or reversed dimensions)");
    }
  }
  pagedattn::CacheStrides s;
  s.block = ks[0];
  s.head = ks[layout.heads_dim()];
  s.token = ks[layout.slots_dim()];
  const pagedattn::CacheStrides hnd =
      pagedattn::CacheStrides::hnd(d.num_kv_heads, d.block_size, d.head_dim);
  if ((d.num_blocks == 1 || s.block == hnd.block) && (d.num_kv_heads == 1 || s.head == hnd.head) &&
      (d.block_size == 1 || s.token == hnd.token)) {
    return {};
  }
  // Overlapping rows (two slots at one address) are refused by the library, which would name its
  // own field; here the error names the tensor the caller passed.
  try {
    pagedattn::require_cache_strides(s, d.num_blocks, d.num_kv_heads, d.block_size, d.head_dim);
  } catch (const Error& e) {
    std::string why = e.what();
    const std::string prefix = "pagedattn: ";
    if (why.compare(0, prefix.size(), prefix) == 0) why.erase(0, prefix.size());
    bad(e.code(), "k_cache", ".strides", k.strides_str(), "not a valid cache layout (" + why + ")");
  }
  return s;
}

// ----------------------------------------------------------------------------------------------
// decode

struct DecodeCall {
  pagedattn::DecodeArgs args;
  Device device;
  std::vector<Tensor> keep;  // the imports, alive until the call returns
};

// Reads and checks the decode tensors (everything but `out`, `lse`, the workspace and the
// optional per-head and per-sequence inputs). With multi-token queries (`query_tokens`) q has a
// row per query token, so the batch comes from context_lens instead of q. The caches' dimensions
// are read in `layout`.
DecodeCall decode_inputs(nb::handle q_h, nb::handle k_h, nb::handle v_h, nb::handle table_h,
                         nb::handle lens_h, const std::vector<std::string>& tags, bool query_tokens,
                         KvLayout layout) {
  DecodeCall c;
  Tensor q = input(q_h, "q", tags);
  Tensor k = input(k_h, "k_cache", tags);
  Tensor v = input(v_h, "v_cache", tags);
  Tensor table = input(table_h, "block_table");
  Tensor lens = input(lens_h, "context_lens");

  q.require_ndim(
      3, query_tokens ? "[num_q_tokens, num_heads, head_dim]" : "[batch, num_heads, head_dim]");
  k.require_ndim(4, layout.dims());
  v.require_ndim(4, layout.dims());
  table.require_ndim(2, "[batch, max_blocks_per_seq]");
  lens.require_ndim(1, "[batch]");

  auto& a = c.args;
  a.q_dtype = q.float_dtype();
  a.k_dtype = k.float_dtype();
  a.v_dtype = v.float_dtype();
  if (a.v_dtype != a.k_dtype) {
    bad(ErrorCode::kInvalidArgument, "v_cache", ".dtype", dtype_str(v.dt),
        "must equal k_cache.dtype (" + dtype_str(k.dt) + ")");
  }
  table.require_int32();
  lens.require_int32();

  for (int i = 0; i < 4; ++i) {
    if (v.shape[i] != k.shape[i]) {
      bad(ErrorCode::kInvalidArgument, "v_cache", ".shape", v.shape_str(),
          "must equal k_cache.shape " + k.shape_str());
    }
  }
  k.require_dim(3, q.shape[2], "head_dim, q.shape[2]");
  if (query_tokens) {
    table.require_dim(0, lens.shape[0], "batch, context_lens.shape[0]");
  } else {
    table.require_dim(0, q.shape[0], "batch, q.shape[0]");
    lens.require_dim(0, q.shape[0], "batch, q.shape[0]");
  }

  a.q_row_stride = q.sequence_stride();
  a.kv_strides = cache_strides(k, v, layout);
  lens.require_contiguous();
  // An empty table's strides say nothing (NumPy 2 gives an empty array zero strides).
  if (table.numel() > 0 && table.shape[1] > 1 && table.strides[1] != 1) {
    bad(ErrorCode::kInvalidArgument, "block_table", ".strides", table.strides_str(),
        "each row must be contiguous (rows may be any stride apart)");
  }

  c.device = q.device;
  k.require_device(c.device, "q");
  v.require_device(c.device, "q");
  table.require_device(c.device, "q");
  lens.require_device(c.device, "q");

  a.batch = lens.dim_int(0);
  a.num_heads = q.dim_int(1);
  a.head_dim = q.dim_int(2);
  const PoolDims pool = pool_dims(k, layout);
  a.num_blocks = pool.num_blocks;
  a.num_kv_heads = pool.num_kv_heads;
  a.block_size = pool.block_size;
  a.max_blocks_per_seq = table.dim_int(1);
  if (a.batch > 1 && table.shape[1] > 0) {
    if (table.strides[0] < table.shape[1] || table.strides[0] > INT_MAX) {
      bad(ErrorCode::kInvalidArgument, "block_table", ".strides", table.strides_str(),
          "rows must not overlap and must lie within the int32 range");
    }
    a.block_table_stride = static_cast<int>(table.strides[0]);
  }

  a.q = q.data;
  a.k_cache = k.data;
  a.v_cache = v.data;
  a.block_table = static_cast<const std::int32_t*>(table.data);
  a.context_lens = static_cast<const std::int32_t*>(lens.data);

  c.keep.push_back(std::move(q));
  c.keep.push_back(std::move(k));
  c.keep.push_back(std::move(v));
  c.keep.push_back(std::move(table));
  c.keep.push_back(std::move(lens));
  return c;
}

// A per-head input of the attention variants (alibi_slopes, sinks): f32 [num_heads], contiguous,
// on q's device.
Tensor per_head_input(nb::handle h, const char* name, const Tensor& q, const Device& device) {
  Tensor t = input(h, name);
  t.require_ndim(1, "[num_heads]");
  t.require_dim(0, q.shape[1], "num_heads, q.shape[1]");
  t.require_float32();
  t.require_contiguous();
  t.require_device(device, "q");
  return t;
}

// The fp8 cache scales of a decode or a cache write: the per-tensor k_scale and v_scale, and the
// per-kv-head arrays k_scales and v_scales (f32 [num_kv_heads], contiguous, on the caches'
// device). Their values, and whether the cache is fp8 at all, the library checks: it names the
// field (k_scale, k_scales[2]). A finite scale that f32 cannot hold (it would turn into inf or
// 0) is refused here, with the value as given.
struct KvScales {
  Tensor k, v;  // the per-head arrays' imports, alive until the call returns

  template <typename Args>
  void set(Args& a, double k_scale, double v_scale, nb::handle k_h, nb::handle v_h,
           const Tensor& cache, KvLayout layout) {
    a.k_scale = to_f32(k_scale, "k_scale");
    a.v_scale = to_f32(v_scale, "v_scale");
    if (!k_h.is_none()) {
      k = per_kv_head(k_h, "k_scales", cache, layout);
      a.k_scales = static_cast<const float*>(k.data);
    }
    if (!v_h.is_none()) {
      v = per_kv_head(v_h, "v_scales", cache, layout);
      a.v_scales = static_cast<const float*>(v.data);
    }
  }

  static float to_f32(double value, const char* name) {
    const float f = static_cast<float>(value);
    if (std::isfinite(value) && (!std::isfinite(f) || (value != 0 && f == 0))) {
      std::ostringstream given, why;
      given << value;
      why << "outside the float32 range (a scale lies in [" << pagedattn::kMinKvScale << ", "
          << pagedattn::kMaxKvScale << "])";
      bad(ErrorCode::kInvalidArgument, name, "", given.str(), why.str());
    }
    return f;
  }

  static Tensor per_kv_head(nb::handle h, const char* name, const Tensor& cache, KvLayout layout) {
    Tensor t = input(h, name);
    t.require_ndim(1, "[num_kv_heads]");
    t.require_dim(0, cache.shape[layout.heads_dim()], layout.kv_heads_ref());
    t.require_float32();
    t.require_contiguous();
    t.require_device(cache.device, "k_cache");
    return t;
  }
};

// The largest query count of one sequence, max(q_indptr[b + 1] - q_indptr[b]), from q_indptr's
// values: read in place from host memory, or copied from the device on the call's stream (after
// the work queued before it, which may write q_indptr) and waited for. At least 1, as the
// library requires; values the library would refuse (a decreasing q_indptr, a first entry other
// than 0, a last one other than the token count) are left for its own checks to name.
int max_q_len_of(const Tensor& q_indptr, int batch, std::uintptr_t stream) {
  std::vector<std::int32_t> copy;
  const std::int32_t* v = static_cast<const std::int32_t*>(q_indptr.data);
  if (q_indptr.device.kind == DeviceKind::kCuda) {
#if PAGEDATTN_PY_CUDA
    copy.resize(static_cast<std::size_t>(batch) + 1);
    cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
    pagedattn::detail::cuda::check(
        cudaMemcpyAsync(copy.data(), q_indptr.data, copy.size() * sizeof(std::int32_t),
                        cudaMemcpyDeviceToHost, s),
        "cudaMemcpyAsync(q_indptr)");
    pagedattn::detail::cuda::check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    v = copy.data();
#else
    (void)stream;
#endif
  }
  std::int64_t most = 1;
  for (int b = 0; b < batch; ++b) {
    most = std::max(most, static_cast<std::int64_t>(v[b + 1]) - v[b]);
  }
  return static_cast<int>(std::min<std::int64_t>(most, INT_MAX));
}

void decode(nb::handle q, nb::handle k_cache, nb::handle v_cache, nb::handle block_table,
            nb::handle context_lens, nb::handle out_h, nb::handle lse_h,
            std::optional<double> scale, const std::string& backend, std::uintptr_t stream,
            nb::handle workspace_h, bool checked, const std::vector<std::string>& tags,
            int window_left, double logits_soft_cap, nb::handle alibi_h, nb::handle sinks_h,
            nb::handle q_indptr_h, std::optional<int> max_q_len, const std::string& kv_layout,
            double k_scale, double v_scale, nb::handle k_scales_h, nb::handle v_scales_h) {
  const bool query_tokens = !q_indptr_h.is_none();
  if (!query_tokens && max_q_len) {
    bad(ErrorCode::kInvalidArgument, "max_q_len", "", std::to_string(*max_q_len),
        "given without q_indptr (max_q_len bounds the query tokens of multi-token queries)");
  }
  const KvLayout layout = parse_kv_layout(kv_layout);
  DecodeCall c =
      decode_inputs(q, k_cache, v_cache, block_table, context_lens, tags, query_tokens, layout);
  auto& a = c.args;
  const Tensor& qt = c.keep[0];
  const char* rows = query_tokens ? "num_q_tokens, q.shape[0]" : "batch, q.shape[0]";

  // Multi-token queries: q_indptr int32 [batch + 1], contiguous, on q's device. Its values are
  // checked by the library (first 0, non-decreasing, last = q.shape[0], each count at most
  // max_q_len). An empty batch has no query tokens whatever q_indptr holds, so q must have no
  // rows: checked here, as the library returns before looking at an empty batch's arguments.
  Tensor q_indptr;
  if (query_tokens) {
    q_indptr = input(q_indptr_h, "q_indptr");
    q_indptr.require_ndim(1, "[batch + 1]");
    q_indptr.require_int32();
    q_indptr.require_dim(0, static_cast<std::int64_t>(a.batch) + 1,
                         "batch + 1, context_lens.shape[0] + 1");
    q_indptr.require_contiguous();
    q_indptr.require_device(c.device, "q");
    if (a.batch == 0 && qt.shape[0] != 0) {
      bad(ErrorCode::kInvalidArgument, "q", ".shape", qt.shape_str(),
          "dimension 0 must be 0 (num_q_tokens: an empty batch has no query tokens)");
    }
    a.q_indptr = static_cast<const std::int32_t*>(q_indptr.data);
    a.num_q_tokens = qt.dim_int(0);
  }

  Tensor out = output(out_h, "out", tags);
  out.require_ndim(
      3, query_tokens ? "[num_q_tokens, num_heads, head_dim]" : "[batch, num_heads, head_dim]");
  for (int i = 0; i < 3; ++i) {
    if (out.shape[i] != qt.shape[i]) {
      bad(ErrorCode::kInvalidArgument, "out", ".shape", out.shape_str(),
          "must equal q.shape " + qt.shape_str());
    }
  }
  a.out_dtype = out.float_dtype();
  a.out_row_stride = out.sequence_stride();
  out.require_device(c.device, "q");
  a.out = out.data;

  Tensor lse;
  if (!lse_h.is_none()) {
    lse = output(lse_h, "lse");
    lse.require_ndim(2, query_tokens ? "[num_q_tokens, num_heads]" : "[batch, num_heads]");
    lse.require_dim(0, qt.shape[0], rows);
    lse.require_dim(1, qt.shape[1], "num_heads, q.shape[1]");
    lse.require_float32();
    lse.require_contiguous();
    lse.require_device(c.device, "q");
    a.lse = static_cast<float*>(lse.data);
  }

  if (scale) a.scale = static_cast<float>(*scale);

  // The attention variants; their values are checked by the library (validate.hpp), once the cap
  // is a float: a positive cap that would round to 0 (no soft-cap) or overflow is refused here.
  a.window_left = window_left;
  a.logits_soft_cap = static_cast<float>(logits_soft_cap);
  if (logits_soft_cap > 0 && std::isfinite(logits_soft_cap) &&
      !(a.logits_soft_cap >= FLT_MIN && std::isfinite(a.logits_soft_cap))) {
    std::ostringstream value, least;
    value << logits_soft_cap;
    least << FLT_MIN;
    bad(ErrorCode::kInvalidArgument, "logits_soft_cap", "", value.str(),
        "outside the float32 range (a positive cap must be at least " + least.str() +
            " and below the largest float)");
  }
  Tensor slopes, sinks;
  if (!alibi_h.is_none()) {
    slopes = per_head_input(alibi_h, "alibi_slopes", qt, c.device);
    a.alibi_slopes = static_cast<const float*>(slopes.data);
  }
  if (!sinks_h.is_none()) {
    sinks = per_head_input(sinks_h, "sinks", qt, c.device);
    a.sinks = static_cast<const float*>(sinks.data);
  }
  KvScales scales;
  scales.set(a, k_scale, v_scale, k_scales_h, v_scales_h, c.keep[1], layout);

  pagedattn::DecodeOptions o;
  o.backend = pick_backend(backend, c.device, "q");
  o.cuda_stream = reinterpret_cast<void*>(stream);
  o.cuda_checked = checked;

  Tensor ws;
  if (!workspace_h.is_none()) {
    ws = output(workspace_h, "workspace");
    ws.require_contiguous();
    ws.require_device(c.device, "q");
    if (o.backend == Backend::kCuda) {
      o.workspace = ws.data;
      o.workspace_bytes = ws.nbytes();
    }
  }

  DeviceGuard guard(c.device);
  nb::gil_scoped_release release;
  if (query_tokens) {
    // A given max_q_len goes to the library as it is (it checks it); none is computed from
    // q_indptr, which on CUDA costs a copy to the host and a wait for the stream.
    a.max_q_len = max_q_len ? *max_q_len : max_q_len_of(q_indptr, a.batch, stream);
  }
  pagedattn::decode(a, o);
}

// With max_q_len (multi-token queries) q is [num_q_tokens, num_heads, head_dim] and the batch is
// the table's rows; the workspace is sized for at most max_q_len query tokens per sequence.
// Only shapes count (the caches' strides change no sizes), so k_cache's dimensions are read in
// `kv_layout` and its strides are not looked at.
std::size_t workspace_size(nb::handle q, nb::handle k_cache, nb::handle block_table,
                           const std::string& backend, std::optional<int> max_q_len,
                           const std::string& kv_layout, const std::vector<std::string>& tags) {
  const KvLayout layout = parse_kv_layout(kv_layout);
  Tensor qt = input(q, "q", tags);
  Tensor k = input(k_cache, "k_cache", tags);
  Tensor table = input(block_table, "block_table");
  qt.require_ndim(
      3, max_q_len ? "[num_q_tokens, num_heads, head_dim]" : "[batch, num_heads, head_dim]");
  k.require_ndim(4, layout.dims());
  table.require_ndim(2, "[batch, max_blocks_per_seq]");
  k.require_dim(3, qt.shape[2], "head_dim, q.shape[2]");
  if (!max_q_len) table.require_dim(0, qt.shape[0], "batch, q.shape[0]");
  k.require_device(qt.device, "q");
  table.require_device(qt.device, "q");
  if (pick_backend(backend, qt.device, "q") != Backend::kCuda) return 0;

  pagedattn::DecodeArgs a;
  // The kernel, and with it the split plan and the workspace, depends on q's and the cache's
  // dtypes (the tensor-core path for 16-bit q and cache alike; fp8 caches have kernels of their
  // own). out's dtype does not count: q's stands in for it.
  a.q_dtype = a.out_dtype = qt.float_dtype();
  a.k_dtype = a.v_dtype = k.float_dtype();
  a.batch = table.dim_int(0);
  a.num_heads = qt.dim_int(1);
  a.head_dim = qt.dim_int(2);
  const PoolDims pool = pool_dims(k, layout);
  a.num_blocks = pool.num_blocks;
  a.num_kv_heads = pool.num_kv_heads;
  a.block_size = pool.block_size;
  a.max_blocks_per_seq = table.dim_int(1);
  // Only shapes matter for the size; the pointers just have to be non-null.
  static const std::int32_t dummy[4] = {};
  a.q = a.k_cache = a.v_cache = a.out = const_cast<std::int32_t*>(dummy);
  a.block_table = a.context_lens = dummy;
  if (max_q_len) {
    a.q_indptr = dummy;
    a.num_q_tokens = qt.dim_int(0);
    a.max_q_len = *max_q_len;
  }
  DeviceGuard guard(qt.device);
  return pagedattn::cuda_workspace_size(a);
}

// ----------------------------------------------------------------------------------------------
// Cache writes and block copies

struct Cache {
  Tensor k, v;
  DType dtype = DType::kF32;
  PoolDims dims{};
  pagedattn::CacheStrides strides;
};

Cache cache_pair(nb::handle k_h, nb::handle v_h, const std::vector<std::string>& tags,
                 KvLayout layout) {
  Cache c;
  c.k = output(k_h, "k_cache", tags);
  c.v = output(v_h, "v_cache", tags);
  c.k.require_ndim(4, layout.dims());
  c.v.require_ndim(4, layout.dims());
  c.dtype = c.k.float_dtype();
  if (c.v.float_dtype() != c.dtype) {
    bad(ErrorCode::kInvalidArgument, "v_cache", ".dtype", dtype_str(c.v.dt),
        "must equal k_cache.dtype (" + dtype_str(c.k.dt) + ")");
  }
  for (int i = 0; i < 4; ++i) {
    if (c.v.shape[i] != c.k.shape[i]) {
      bad(ErrorCode::kInvalidArgument, "v_cache", ".shape", c.v.shape_str(),
          "must equal k_cache.shape " + c.k.shape_str());
    }
  }
  c.strides = cache_strides(c.k, c.v, layout);
  c.v.require_device(c.k.device, "k_cache");
  c.dims = pool_dims(c.k, layout);
  return c;
}

void write_cache(nb::handle key_h, nb::handle value_h, nb::handle slots_h, nb::handle k_cache,
                 nb::handle v_cache, const std::string& backend, std::uintptr_t stream,
                 bool checked, const std::vector<std::string>& tags, const std::string& kv_layout,
                 double k_scale, double v_scale, nb::handle k_scales_h, nb::handle v_scales_h) {
  const KvLayout layout = parse_kv_layout(kv_layout);
  Tensor key = input(key_h, "key", tags);
  Tensor value = input(value_h, "value", tags);
  Tensor slots = input(slots_h, "slot_mapping");
  Cache c = cache_pair(k_cache, v_cache, tags, layout);

  key.require_ndim(3, "[num_tokens, num_kv_heads, head_dim]");
  value.require_ndim(3, "[num_tokens, num_kv_heads, head_dim]");
  slots.require_ndim(1, "[num_tokens]");
  const DType src = key.float_dtype();
  if (value.float_dtype() != src) {
    bad(ErrorCode::kInvalidArgument, "value", ".dtype", dtype_str(value.dt),
        "must equal key.dtype (" + dtype_str(key.dt) + ")");
  }
  slots.require_int32();
  key.require_dim(1, c.k.shape[layout.heads_dim()], layout.kv_heads_ref());
  key.require_dim(2, c.k.shape[3], "head_dim, k_cache.shape[3]");
  for (int i = 0; i < 3; ++i) {
    if (value.shape[i] != key.shape[i]) {
      bad(ErrorCode::kInvalidArgument, "value", ".shape", value.shape_str(),
          "must equal key.shape " + key.shape_str());
    }
  }
  slots.require_dim(0, key.shape[0], "num_tokens, key.shape[0]");
  slots.require_contiguous();
  // Each token's [num_kv_heads, head_dim] must be contiguous; tokens may be any stride apart,
  // the same stride in key and value.
  for (Tensor* t : {&key, &value}) {
    if (!t->contiguous_from(1)) {
      bad(ErrorCode::kInvalidArgument, t->name, ".strides", t->strides_str(),
          "each token's [num_kv_heads, head_dim] must be contiguous");
    }
  }
  std::int64_t token_stride = 0;
  if (key.shape[0] > 1) {
    const std::int64_t row = key.shape[1] * key.shape[2];
    if (key.strides[0] < row) {
      bad(ErrorCode::kInvalidArgument, "key", ".strides", key.strides_str(),
          "tokens must not overlap");
    }
    if (value.strides[0] != key.strides[0]) {
      bad(ErrorCode::kInvalidArgument, "value", ".strides", value.strides_str(),
          "must step tokens like key.strides " + key.strides_str());
    }
    token_stride = key.strides[0];
  }
  key.require_device(c.k.device, "k_cache");
  value.require_device(c.k.device, "k_cache");
  slots.require_device(c.k.device, "k_cache");

  pagedattn::CacheWriteArgs a;
  a.num_tokens = key.dim_int(0);
  a.num_kv_heads = c.dims.num_kv_heads;
  a.head_dim = c.dims.head_dim;
  a.block_size = c.dims.block_size;
  a.num_blocks = c.dims.num_blocks;
  a.kv_strides = c.strides;
  a.key = key.data;
  a.value = value.data;
  a.src_dtype = src;
  a.src_token_stride = token_stride;
  a.slot_mapping = static_cast<const std::int32_t*>(slots.data);
  a.k_cache = c.k.data;
  a.v_cache = c.v.data;
  a.cache_dtype = c.dtype;
  KvScales scales;
  scales.set(a, k_scale, v_scale, k_scales_h, v_scales_h, c.k, layout);

  pagedattn::CacheOpOptions o;
  o.backend = pick_backend(backend, c.k.device, "k_cache");
  o.cuda_stream = reinterpret_cast<void*>(stream);
  o.cuda_checked = checked;

  DeviceGuard guard(c.k.device);
  nb::gil_scoped_release release;
  pagedattn::write_cache(a, o);
}

// Block copy pairs: an int32 host tensor [n, 2], or any sequence of (src, dst) pairs.
std::vector<pagedattn::BlockCopy> read_pairs(nb::handle h) {
  std::vector<pagedattn::BlockCopy> pairs;
  nb::ndarray<nb::ro> arr;
  if (nb::try_cast(h, arr, /*convert=*/false)) {
    Tensor t;
    t.name = "pairs";
    describe(t, arr);
    if (t.device.kind != DeviceKind::kCpu) {
      bad(ErrorCode::kInvalidArgument, "pairs", ".device", t.device.str(),
          "block copy pairs are host memory (a CPU tensor or a list of (src, dst) pairs)");
    }
    if (t.ndim() != 2 || t.shape[1] != 2) {
      bad(ErrorCode::kInvalidArgument, "pairs", ".shape", t.shape_str(), "expected [n, 2]");
    }
    const bool i32 = is(t.dt, nb::dlpack::dtype_code::Int, 32);
    const bool i64 = is(t.dt, nb::dlpack::dtype_code::Int, 64);
    if (!i32 && !i64) {
      bad(ErrorCode::kInvalidArgument, "pairs", ".dtype", dtype_str(t.dt),
          "expected int32 or int64");
    }
    pairs.resize(static_cast<std::size_t>(t.shape[0]));
    for (std::int64_t i = 0; i < t.shape[0]; ++i) {
      for (int j = 0; j < 2; ++j) {
        const std::int64_t off = i * t.strides[0] + j * t.strides[1];
        const std::int64_t id = i32 ? static_cast<const std::int32_t*>(t.data)[off]
                                    : static_cast<const std::int64_t*>(t.data)[off];
        if (id < INT32_MIN || id > INT32_MAX) {
          bad(ErrorCode::kOutOfRange, "pairs", "[" + std::to_string(i) + "]", std::to_string(id),
              "block id outside the int32 range");
        }
        (j == 0 ? pairs[i].src : pairs[i].dst) = static_cast<std::int32_t>(id);
      }
    }
    return pairs;
  }
  if (!nb::isinstance<nb::sequence>(h) || nb::isinstance<nb::str>(h)) {
    bad(ErrorCode::kInvalidArgument, "pairs", "",
        std::string("an object of type ") + nb::type_name(h.type()).c_str(),
        "expected a sequence of (src, dst) pairs or an int tensor [n, 2]");
  }
  std::size_t i = 0;
  for (nb::handle item : h) {
    std::int64_t src = 0, dst = 0;
    bool ok = nb::isinstance<nb::sequence>(item) && nb::len(item) == 2 &&
              nb::try_cast(item[0], src) && nb::try_cast(item[1], dst);
    if (!ok || src < INT32_MIN || src > INT32_MAX || dst < INT32_MIN || dst > INT32_MAX) {
      bad(ErrorCode::kInvalidArgument, "pairs", "[" + std::to_string(i) + "]",
          nb::repr(item).c_str(), "expected a pair of int32 block ids (src, dst)");
    }
    pairs.push_back({static_cast<std::int32_t>(src), static_cast<std::int32_t>(dst)});
    ++i;
  }
  return pairs;
}

void copy_blocks(nb::handle k_cache, nb::handle v_cache, nb::handle pairs_h,
                 const std::string& backend, std::uintptr_t stream,
                 const std::vector<std::string>& tags, const std::string& kv_layout) {
  Cache c = cache_pair(k_cache, v_cache, tags, parse_kv_layout(kv_layout));
  std::vector<pagedattn::BlockCopy> pairs = read_pairs(pairs_h);
  if (pairs.size() > static_cast<std::size_t>(INT_MAX)) {
    bad(ErrorCode::kInvalidArgument, "pairs", ".length", std::to_string(pairs.size()),
        "too many pairs");
  }
  pagedattn::CopyBlocksArgs a;
  a.num_kv_heads = c.dims.num_kv_heads;
  a.head_dim = c.dims.head_dim;
  a.block_size = c.dims.block_size;
  a.num_blocks = c.dims.num_blocks;
  a.kv_strides = c.strides;
  a.k_cache = c.k.data;
  a.v_cache = c.v.data;
  a.cache_dtype = c.dtype;
  a.pairs = pairs.data();
  a.num_pairs = static_cast<int>(pairs.size());

  pagedattn::CacheOpOptions o;
  o.backend = pick_backend(backend, c.k.device, "k_cache");
  o.cuda_stream = reinterpret_cast<void*>(stream);

  DeviceGuard guard(c.k.device);
  nb::gil_scoped_release release;
  pagedattn::copy_blocks(a, o);
}

// Merging attention states: parts [S, ..., head_dim] and part_lse [S, ...] (the same leading
// shape), out [..., head_dim] and lse [...]; the rows are the elements of "...".
void merge_states(nb::handle parts_h, nb::handle part_lse_h, nb::handle out_h, nb::handle lse_h,
                  const std::string& backend, std::uintptr_t stream,
                  const std::vector<std::string>& tags) {
  Tensor parts = input(parts_h, "parts", tags);
  Tensor plse = input(part_lse_h, "part_lse");
  if (parts.ndim() < 2) {
    bad(ErrorCode::kInvalidArgument, "parts", ".shape", parts.shape_str(),
        "expected [num_segments, ..., head_dim]");
  }
  const int nd = parts.ndim();
  if (plse.ndim() != nd - 1) {
    bad(ErrorCode::kInvalidArgument, "part_lse", ".shape", plse.shape_str(),
        "expected parts.shape without head_dim " + parts.shape_str());
  }
  for (int i = 0; i < nd - 1; ++i) plse.require_dim(i, parts.shape[i], "parts.shape");
  plse.require_float32();
  parts.require_contiguous();
  plse.require_contiguous();
  plse.require_device(parts.device, "parts");
  std::int64_t rows = 1;
  for (int i = 1; i < nd - 1; ++i) rows *= parts.shape[i];
  if (rows > INT_MAX) {
    bad(ErrorCode::kInvalidArgument, "parts", ".shape", parts.shape_str(), "too many rows");
  }

  Tensor out = output(out_h, "out", tags);
  if (out.ndim() != nd - 1) {
    bad(ErrorCode::kInvalidArgument, "out", ".shape", out.shape_str(),
        "expected parts.shape without the segment axis " + parts.shape_str());
  }
  for (int i = 0; i < nd - 1; ++i) out.require_dim(i, parts.shape[i + 1], "parts.shape");
  out.require_contiguous();
  out.require_device(parts.device, "parts");

  pagedattn::MergeStatesArgs a;
  a.num_segments = parts.dim_int(0);
  a.num_rows = static_cast<int>(rows);
  a.head_dim = parts.dim_int(nd - 1);
  a.parts = parts.data;
  a.part_dtype = parts.float_dtype();
  a.part_lse = static_cast<const float*>(plse.data);
  a.out = out.data;
  a.out_dtype = out.float_dtype();
  Tensor lse;
  if (!lse_h.is_none()) {
    lse = output(lse_h, "lse");
    if (lse.ndim() != nd - 2) {
      bad(ErrorCode::kInvalidArgument, "lse", ".shape", lse.shape_str(),
          "expected part_lse.shape without the segment axis " + plse.shape_str());
    }
    for (int i = 0; i < nd - 2; ++i) lse.require_dim(i, parts.shape[i + 1], "parts.shape");
    lse.require_float32();
    lse.require_contiguous();
    lse.require_device(parts.device, "parts");
    a.lse = static_cast<float*>(lse.data);
  }
  pagedattn::MergeStatesOptions o;
  o.backend = pick_backend(backend, parts.device, "parts");
  o.cuda_stream = reinterpret_cast<void*>(stream);
  DeviceGuard guard(parts.device);
  nb::gil_scoped_release release;
  pagedattn::merge_states(a, o);
}

// ----------------------------------------------------------------------------------------------
// BlockManager helpers

using Int32Array = nb::ndarray<nb::numpy, std::int32_t>;

Int32Array to_numpy(std::vector<std::int32_t>&& v, std::size_t rows, std::size_t cols, int ndim) {
  if (v.empty()) v.reserve(1);  // a valid pointer even for an empty array
  auto* heap = new std::vector<std::int32_t>(std::move(v));
  nb::capsule owner(heap,
                    [](void* p) noexcept { delete static_cast<std::vector<std::int32_t>*>(p); });
  if (ndim == 1) return Int32Array(heap->data(), {rows}, owner);
  return Int32Array(heap->data(), {rows, cols}, owner);
}

using AppendResult = std::pair<std::int32_t, std::optional<std::pair<std::int32_t, std::int32_t>>>;

AppendResult append_result(const pagedattn::BlockManager::Append& a) {
  AppendResult r{a.slot, std::nullopt};
  if (a.copy) r.second = std::make_pair(a.copy->src, a.copy->dst);
  return r;
}

}  // namespace

NB_MODULE(_ext, m) {
  m.doc() = "pagedattn's compiled core; use the functions of the pagedattn package.";

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const Error& e) {
      nb::object cls = nb::module_::import_("pagedattn._errors").attr("Error");
      nb::object exc = cls(e.what(), e.argument(), code_name(e.code()));
      PyErr_SetObject(cls.ptr(), exc.ptr());
    }
  });

  m.def("decode", &decode, "q"_a, "k_cache"_a, "v_cache"_a, "block_table"_a, "context_lens"_a,
        "out"_a, "lse"_a.none(), "scale"_a.none(), "backend"_a, "stream"_a, "workspace"_a.none(),
        "checked"_a, "tags"_a, "window_left"_a = -1, "logits_soft_cap"_a = 0.0,
        "alibi_slopes"_a.none() = nb::none(), "sinks"_a.none() = nb::none(),
        "q_indptr"_a.none() = nb::none(), "max_q_len"_a.none() = nb::none(), "kv_layout"_a = "HND",
        "k_scale"_a = 1.0, "v_scale"_a = 1.0, "k_scales"_a.none() = nb::none(),
        "v_scales"_a.none() = nb::none());
  m.def("workspace_size", &workspace_size, "q"_a, "k_cache"_a, "block_table"_a, "backend"_a,
        "max_q_len"_a.none() = nb::none(), "kv_layout"_a = "HND",
        "tags"_a = std::vector<std::string>{});
  m.def("write_cache", &write_cache, "key"_a, "value"_a, "slot_mapping"_a, "k_cache"_a, "v_cache"_a,
        "backend"_a, "stream"_a, "checked"_a, "tags"_a, "kv_layout"_a = "HND", "k_scale"_a = 1.0,
        "v_scale"_a = 1.0, "k_scales"_a.none() = nb::none(), "v_scales"_a.none() = nb::none());
  m.def("copy_blocks", &copy_blocks, "k_cache"_a, "v_cache"_a, "pairs"_a, "backend"_a, "stream"_a,
        "tags"_a, "kv_layout"_a = "HND");
  m.def("merge_states", &merge_states, "parts"_a, "part_lse"_a, "out"_a, "lse"_a.none(),
        "backend"_a, "stream"_a, "tags"_a);

  m.def("cuda_available", []() {
    std::string why;
    const bool ok = pagedattn::cuda_available(&why);
    return std::make_pair(ok, why);
  });
  m.attr("built_with_cuda") = bool(PAGEDATTN_PY_CUDA);
  {
    nb::list dims;
    for (int d : pagedattn::kSupportedHeadDims) dims.append(d);
    m.attr("SUPPORTED_HEAD_DIMS") = nb::tuple(dims);
  }
  m.attr("MAX_BLOCK_SIZE") = pagedattn::kMaxBlockSize;
  m.attr("MAX_GROUP_SIZE") = pagedattn::kMaxGroupSize;

  using BM = pagedattn::BlockManager;
  nb::class_<BM>(m, "BlockManager",
                 "Host-side block allocation for a paged cache of `num_blocks` blocks of\n"
                 "`block_size` tokens: which blocks each sequence owns, reference counts so a\n"
                 "forked sequence shares its parent's blocks, and copy-on-write of a shared,\n"
                 "partly filled last block. Every method either completes or raises\n"
                 "pagedattn.Error leaving the manager unchanged (running out of blocks too).")
      .def(nb::init<int, int>(), "num_blocks"_a, "block_size"_a)
      .def_prop_ro("num_blocks", &BM::num_blocks, "Blocks in the pool.")
      .def_prop_ro("block_size", &BM::block_size, "Tokens per block.")
      .def_prop_ro("num_free_blocks", &BM::num_free_blocks, "Blocks no sequence references.")
      .def_prop_ro("num_used_blocks", &BM::num_used_blocks, "Blocks some sequence references.")
      .def_prop_ro("num_sequences", &BM::num_sequences, "Sequences held.")
      .def(
          "add_sequence",
          [](BM& bm, BM::SeqId id, int prompt_len) {
            std::vector<std::int32_t> slots = bm.add_sequence(id, prompt_len);
            const std::size_t n = slots.size();
            return to_numpy(std::move(slots), n, 0, 1);
          },
          "seq_id"_a, "prompt_len"_a,
          "Adds sequence `seq_id` (a new id) with a prompt of `prompt_len` tokens and returns\n"
          "the prompt's slot mapping: an int32 NumPy array of `prompt_len` slots in token\n"
          "order, for write_cache().")
      .def(
          "append_token", [](BM& bm, BM::SeqId id) { return append_result(bm.append_token(id)); },
          "seq_id"_a,
          "Appends one token to `seq_id`. Returns (slot, copy): the slot to write the token\n"
          "to, and None or a (src, dst) block copy to perform first with copy_blocks() when\n"
          "the last block was shared (copy-on-write).")
      .def("free_sequence", &BM::free_sequence, "seq_id"_a,
           "Releases `seq_id`'s blocks; blocks nobody references become free.")
      .def("fork", &BM::fork, "parent"_a, "child"_a,
           "Makes `child` (a new id) share every block of `parent`. Allocates nothing.")
      .def("blocks_for_prompt", &BM::blocks_for_prompt, "prompt_len"_a,
           "Blocks add_sequence(_, prompt_len) would allocate now.")
      .def("blocks_to_append", &BM::blocks_to_append, "seq_id"_a,
           "Blocks append_token(seq_id) would allocate now (0 or 1).")
      .def("__contains__", &BM::contains, "seq_id"_a)
      .def("__len__", &BM::num_sequences)
      .def("length", &BM::length, "seq_id"_a, "Tokens in `seq_id`.")
      .def(
          "blocks", [](const BM& bm, BM::SeqId id) { return bm.blocks(id); }, "seq_id"_a,
          "The block ids of `seq_id`, in token order.")
      .def("sequences", &BM::sequences, "The sequence ids held, ascending.")
      .def("ref_count", &BM::ref_count, "block"_a, "How many sequences reference `block`.")
      .def("slot", &BM::slot, "seq_id"_a, "pos"_a, "The slot of token `pos` of `seq_id`.")
      .def(
          "tables",
          [](const BM& bm, const std::vector<BM::SeqId>& seqs, int min_width) {
            BM::Tables t = bm.tables(seqs, min_width);
            const std::size_t n = t.context_lens.size();
            const std::size_t w = static_cast<std::size_t>(t.max_blocks_per_seq);
            return std::make_pair(to_numpy(std::move(t.block_table), n, w, 2),
                                  to_numpy(std::move(t.context_lens), n, 0, 1));
          },
          "seq_ids"_a, "min_width"_a = 0,
          "Decode tables for `seq_ids`, in that order: (block_table, context_lens), int32\n"
          "NumPy arrays of shapes [n, width] (-1 padded; width is the widest sequence's\n"
          "block count, at least 1 and at least `min_width`) and [n].")
      .def("fragmentation", &BM::fragmentation,
           "Unfilled token slots in used blocks over all slots of used blocks (0 when none).")
      .def("stored_tokens", &BM::stored_tokens, "Tokens stored, shared tokens counted once.")
      .def("check_invariants", &BM::check_invariants,
           "Recomputes the reference counts and the free list; raises pagedattn.Error on any\n"
           "disagreement.");
}
