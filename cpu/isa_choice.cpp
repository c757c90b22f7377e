// The choice of the CPU backend's instruction set (isa_choice.hpp): CPUID, XCR0 and, for AMX,
// the Linux grant of the tile state decide which kernels this processor runs.
#include "isa_choice.hpp"

#include <cstdlib>
#include <cstring>
#include <string>

#if PAGEDATTN_CPU_X86
#include <cpuid.h>
#endif
#if PAGEDATTN_CPU_AMX && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#include "pagedattn/error.hpp"

namespace pagedattn::detail::cpu {
namespace {

template <class Arch>
void kernel_for(const ItemContext& c, const WorkItem& it, int kv_count, float* m, float* l,
                float* acc, ItemScratch s) {
  ItemKernel{}(Arch{}, c, it, kv_count, m, l, acc, s);
}

// The instruction sets of this processor family, best first: each one's kernel, name (the
// PAGEDATTN_CPU_ISA value), whether this CPU runs it, and whether auto takes it where it runs
// (null: always).
struct IsaEntry {
  IsaChoice choice;
  bool (*supported)();
  bool (*auto_picks)() = nullptr;
};
bool always() { return true; }

#if PAGEDATTN_CPU_X86
// F16C from CPUID leaf 1 (ECX bit 29): the f16 widening of the AVX2 and AVX-512 kernels needs
// it. Read directly, since not every compiler's __builtin_cpu_supports knows "f16c".
bool has_f16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
}
bool has_avx512() { return xsimd::available_architectures().avx512bw && has_f16c(); }
bool has_avx2() { return xsimd::available_architectures().fma3_avx2 && has_f16c(); }
#if PAGEDATTN_CPU_AVX512BF16
// AVX512_BF16 (CPUID leaf 7, sub-leaf 1, EAX bit 5: vdpbf16ps) and AVX512_VBMI (leaf 7,
// sub-leaf 0, ECX bit 1: vpermi2b, the fp8 table), on top of AVX-512. Every processor with the
// first but Cooper Lake has the second.
bool has_avx512bf16() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!has_avx512() || !__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) || (ecx & 2u) == 0) {
    return false;
  }
  return __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) && (eax & (1u << 5)) != 0;
}
// An AMD processor of family 26 (Zen 5) or later: CPUID leaf 0's vendor string, leaf 1's family
// (base family 15 plus the extended family). Where auto takes avx512bf16: there vdpbf16ps runs
// the bf16 kernel faster than the widening FMA path, and on the Intel Xeons measured slower
// (docs/cpu.md has the numbers). Elsewhere it runs when named.
bool is_amd_zen5_or_later() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(0, &eax, &ebx, &ecx, &edx)) return false;
  const bool amd = ebx == 0x68747541u && edx == 0x69746e65u && ecx == 0x444d4163u;  // AuthenticAMD
  if (!amd || !__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return false;
  const unsigned base = (eax >> 8) & 0xf, ext = (eax >> 20) & 0xff;
  return (base == 0xf ? base + ext : base) >= 26;
}
#endif
#if PAGEDATTN_CPU_AMX
// The tile registers' state (XTILEDATA, XSAVE component 18) is granted to a Linux process only
// on request: arch_prctl(ARCH_REQ_XCOMP_PERM, 18), once per process, kept by its threads.
constexpr int kArchReqXcompPerm = 0x1023;
constexpr int kXfeatureXtiledata = 18;
// XCR0 (xgetbv 0): which state components the operating system saves.
std::uint64_t xcr0() {
  std::uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<std::uint64_t>(hi) << 32) | lo;
}
// AMX-TILE and AMX-BF16 (CPUID leaf 7, sub-leaf 0, EDX bits 24 and 22) on top of AVX-512 BF16,
// the tile state enabled by the operating system (OSXSAVE, leaf 1 ECX bit 27; XCR0 bits 17 and
// 18) and granted to this process. Asked once; a refusal leaves AMX unavailable.
bool request_amx() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!has_avx512bf16() || !__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  if ((edx & (1u << 24)) == 0 || (edx & (1u << 22)) == 0) return false;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || (ecx & (1u << 27)) == 0) return false;
  constexpr std::uint64_t kTileState = (1ull << 17) | (1ull << 18);
  if ((xcr0() & kTileState) != kTileState) return false;
#if defined(__linux__)
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}
bool has_amx() {
  static const bool granted = request_amx();
  return granted;
}
#endif
const IsaEntry kIsas[] = {
#if PAGEDATTN_CPU_AMX
    // Auto takes it wherever it runs: shapes it does not take run the AVX-512 kernel, which
    // auto picks on the Intel processors that have AMX (docs/cpu.md has the measurements).
    {{&item_kernel_amx, "amx", &mla_item<xsimd::avx512bw>}, &has_amx},
#endif
#if PAGEDATTN_CPU_AVX512BF16
    {{&item_kernel_avx512bf16, "avx512bf16", &mla_item<xsimd::avx512bw>},
     &has_avx512bf16,
     &is_amd_zen5_or_later},
#endif
    {{&kernel_for<xsimd::avx512bw>, "avx512", &mla_item<xsimd::avx512bw>}, &has_avx512},
    {{&kernel_for<xsimd::fma3<xsimd::avx2>>, "avx2", &mla_item<xsimd::fma3<xsimd::avx2>>},
     &has_avx2},
    {{&kernel_for<xsimd::sse2>, "sse2", &mla_item<xsimd::sse2>}, &always}};
#elif PAGEDATTN_CPU_ARM64
const IsaEntry kIsas[] = {
    {{&kernel_for<xsimd::neon64>, "neon", &mla_item<xsimd::neon64>}, &always}};
#endif

// The best instruction set of this machine, or the one PAGEDATTN_CPU_ISA names (for testing
// every path on one machine). Chosen once. A name this build has no kernel for, or one the CPU
// cannot run, is an error that lists the accepted names.
IsaChoice choose_isa() {
  const char* env = std::getenv("PAGEDATTN_CPU_ISA");
  const std::string want = env ? env : "";
  std::string names = "auto";
  const bool pick_best = want.empty() || want == "auto";
  for (const IsaEntry& e : kIsas) {
    if (pick_best || want == e.choice.name) {
      const bool runs = e.supported() && (!pick_best || e.auto_picks == nullptr || e.auto_picks());
      if (runs) return e.choice;
      if (!pick_best) {
        fail(ErrorCode::kBackendUnavailable, "PAGEDATTN_CPU_ISA", "'" + want + "'",
             "not supported by this CPU");
      }
    }
    names += std::string(", ") + e.choice.name;
  }
  fail(ErrorCode::kInvalidArgument, "PAGEDATTN_CPU_ISA", "'" + want + "'",
       "unknown instruction set on this processor (expected one of " + names + ")");
}

}  // namespace

const IsaChoice& isa() {
  static const IsaChoice choice = choose_isa();
  return choice;
}

KernelFn prefix_kernel() {
  static const KernelFn fn = [] {
    const char* env = std::getenv("PAGEDATTN_CPU_ISA");
    const bool automatic = env == nullptr || *env == 0 || std::strcmp(env, "auto") == 0;
    if (automatic && std::strcmp(isa().name, "avx512") == 0) {
      if (const KernelFn bf16 = kernel_for_isa("avx512bf16")) return bf16;
    }
    return isa().fn;
  }();
  return fn;
}

const char* active_isa_name() { return isa().name; }

KernelFn kernel_for_isa(const char* name) {
  for (const IsaEntry& e : kIsas) {
    if (std::strcmp(e.choice.name, name) == 0) return e.supported() ? e.choice.fn : nullptr;
  }
  return nullptr;
}

}  // namespace pagedattn::detail::cpu
