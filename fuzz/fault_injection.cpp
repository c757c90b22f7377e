#include "fault_injection.hpp"

namespace pagedattn::fuzz {
namespace {
testing::Fault g_fault = testing::Fault::kNone;
}  // namespace

void set_fault(testing::Fault f) { g_fault = f; }

void decode_with_planted_fault(const DecodeArgs& args, const detail::DecodeOptions& options) {
  testing::decode_with_fault(args, options, g_fault);
}

}  // namespace pagedattn::fuzz
