#include "fault_injection.hpp"

namespace pagedattn::fuzz {
namespace {
detail::Fault g_fault = detail::Fault::kNone;
}  // namespace

void set_fault(detail::Fault f) { g_fault = f; }
detail::Fault planted_fault() { return g_fault; }

}  // namespace pagedattn::fuzz
