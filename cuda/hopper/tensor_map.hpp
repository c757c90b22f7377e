// The driver's TMA tensor-map encoder, found through the runtime so that the library needs no
// link to libcuda (defined in many_rows.cu; both sm_90 kernels build their maps with it).
#pragma once

#include <cuda.h>

namespace pagedattn::detail::cuda::sm90 {

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                 const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                 const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                 CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// cuTensorMapEncodeTiled, or null where the driver lacks it.
EncodeTiled encode_tiled();

}  // namespace pagedattn::detail::cuda::sm90
