#include <cmath>
#include <cstdlib>
#include <string>

#include "pagedattn/detail/backends.hpp"
#include "pagedattn/pagedattn.hpp"
#include "pagedattn/validate.hpp"

namespace pagedattn {

const char* backend_name(Backend b) {
  switch (b) {
    case Backend::kAuto:
      return "auto";
    case Backend::kCpu:
      return "cpu";
    case Backend::kCuda:
      return "cuda";
  }
  return "unknown";
}

Backend parse_backend(const std::string& text, const std::string& argument) {
  if (text == "auto") return Backend::kAuto;
  if (text == "cpu") return Backend::kCpu;
  if (text == "cuda") return Backend::kCuda;
  fail(ErrorCode::kInvalidArgument, argument, "'" + text + "'", "expected auto, cpu or cuda");
}

bool cuda_available(std::string* why) { return detail::cuda::available(why); }

Backend resolve_backend(Backend requested) {
  if (requested == Backend::kAuto) {
    if (const char* env = std::getenv("PAGEDATTN_BACKEND"); env != nullptr && *env != '\0') {
      requested = parse_backend(env, "PAGEDATTN_BACKEND");
    }
  }
  if (requested == Backend::kAuto) return cuda_available() ? Backend::kCuda : Backend::kCpu;
  if (requested == Backend::kCuda) {
    std::string why;
    if (!cuda_available(&why)) {
      fail(ErrorCode::kBackendUnavailable, "backend", "cuda", "unavailable: " + why);
    }
  }
  return requested;
}

float DecodeArgs::effective_scale() const {
  return scale ? *scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
}

void decode(const DecodeArgs& args, const DecodeOptions& options) {
  validate_shapes(args);
  const Backend backend = resolve_backend(options.backend);
  if (args.batch == 0) return;
  if (backend == Backend::kCuda) {
    detail::cuda::decode(args, options);  // validates device-resident tables itself
    return;
  }
  validate_tables(args, args.context_lens, args.block_table);
  detail::cpu::decode(args, options);
}

}  // namespace pagedattn
