#include "merge_states_call.hpp"

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <climits>
#include <cstdint>
#include <string>
#include <vector>

#include "argument_error.hpp"
#include "device.hpp"
#include "pagedattn/merge_states.hpp"
#include "tensor_import.hpp"

namespace pagedattn::py {
namespace {

using namespace nb::literals;

// parts [S, ..., head_dim] and part_lse [S, ...] (the same leading shape), out [..., head_dim]
// and lse [...]; the rows are the elements of "...".
void merge_states(nb::handle parts_h, nb::handle part_lse_h, nb::handle out_h, nb::handle lse_h,
                  const std::string& backend, std::uintptr_t stream,
                  const std::vector<std::string>& tags) {
  Tensor parts = input(parts_h, "parts", tags);
  Tensor plse = input(part_lse_h, "part_lse");
  if (parts.ndim() < 2) {
    reject(ErrorCode::kInvalidArgument, "parts", ".shape", parts.shape_str(),
           "expected [num_segments, ..., head_dim]");
  }
  const int nd = parts.ndim();
  if (plse.ndim() != nd - 1) {
    reject(ErrorCode::kInvalidArgument, "part_lse", ".shape", plse.shape_str(),
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
    reject(ErrorCode::kInvalidArgument, "parts", ".shape", parts.shape_str(), "too many rows");
  }

  Tensor out = output(out_h, "out", tags);
  if (out.ndim() != nd - 1) {
    reject(ErrorCode::kInvalidArgument, "out", ".shape", out.shape_str(),
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
      reject(ErrorCode::kInvalidArgument, "lse", ".shape", lse.shape_str(),
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

}  // namespace

void bind_merge_states(nb::module_& m) {
  m.def("merge_states", &merge_states, "parts"_a, "part_lse"_a, "out"_a, "lse"_a.none(),
        "backend"_a, "stream"_a, "tags"_a);
}

}  // namespace pagedattn::py
