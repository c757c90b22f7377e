// The sm_90 MLA kernel (mla_many_rows.cu, docs/mla.md): 64 query rows of a sequence per CTA on
// warpgroup MMAs, each tile of 64 latent rows copied once by TMA. Built where the library's
// architectures include sm_90 (PAGEDATTN_MANY_ROWS_KERNEL); mla_decode.cu asks it before planning,
// since the rows per CTA shape the plan.
#pragma once

#include <cuda_runtime.h>

#include "../mla/mla_params.cuh"
#include "pagedattn/dtype.hpp"
#include "pagedattn/mla.hpp"

namespace pagedattn::detail::cuda {

constexpr int kMlaManyRows = 64;  // query rows per CTA: one wgmma M tile

// Whether the kernel serves the call on the current device: an sm_90 device with room for its
// shared memory, a 16-bit q with a cache of its dtype or fp8, rank 512 and rope 64 (a tile is eight
// 64-column parts of c and one of k_pe), pages that split or fill 64-key tiles (8, 16 or 32
// tokens, or a multiple of 64), weights in q's 16-bit type (not split_p), and a cache layout the
// driver can describe as TMA tensors.
bool mla_many_rows_serves(const MlaDecodeArgs& a, bool split_p);

// Launches it on grid CTAs (batch x splits x row chunks of p's plan, p.cta_rows = kMlaManyRows);
// a layout that mla_many_rows_serves accepted.
void launch_mla_many_rows(const mla::MlaParams& p, DType q_dtype, DType kv_dtype, int grid,
                          cudaStream_t stream);

}  // namespace pagedattn::detail::cuda
