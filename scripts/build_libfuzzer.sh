#!/usr/bin/env bash
# Builds the libFuzzer target (fuzz/libfuzzer_target.cpp and fuzz/libfuzzer_args.cpp) with clang:
# the core, the CPU backend and the dispatch layer (without CUDA) compiled straight from their
# sources with coverage, AddressSanitizer and UBSan.
#
#   scripts/build_libfuzzer.sh [BUILD_DIR]        (default build-libfuzzer)
#   BUILD_DIR/pagedattn_libfuzzer fuzz/corpus/libfuzzer -max_total_time=60
#
# Needs clang++ (14 or later) with its runtime (Debian: clang, libclang-rt-14-dev on newer
# releases, where the fuzzer runtime is split out), libomp-dev, libeigen3-dev and libxsimd-dev.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-$root/build-libfuzzer}"
CXX="${CXX_CLANG:-clang++}"
mkdir -p "$out/obj"

if ! command -v "$CXX" >/dev/null; then
  echo "build_libfuzzer: $CXX not found (install clang)" >&2
  exit 2
fi
probe="$out/probe.cpp"
printf 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }\n' \
  >"$probe"
if ! "$CXX" -fsanitize=fuzzer "$probe" -o "$out/probe" 2>"$out/probe.log"; then
  echo "build_libfuzzer: $CXX cannot link -fsanitize=fuzzer (see $out/probe.log);" \
    "install the compiler runtime (Debian: libclang-rt-<version>-dev or libclang-common-<version>-dev)" >&2
  exit 2
fi

san="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
common=(-std=c++17 -g -O1 -fopenmp $san
  -I"$root/core/include" -I"$root/dispatch/include" -I"$root/cpu" -I/usr/include/eigen3)
objs=()
compile() {  # source, extra flags...
  local src="$1"
  shift
  local obj="$out/obj/$(echo "${src#$root/}" | tr '/' '_').o"
  "$CXX" "${common[@]}" -fsanitize=fuzzer-no-link "$@" -c "$src" -o "$obj"
  objs+=("$obj")
}

for src in "$root"/core/src/*.cpp "$root"/dispatch/*.cpp "$root"/dispatch/no_cuda/*.cpp; do
  compile "$src"
done
for src in "$root"/cpu/*.cpp; do
  case "$(basename "$src")" in
    isa_avx2.cpp) compile "$src" -mavx2 -mfma -mf16c ;;
    isa_avx512.cpp) compile "$src" -mavx512f -mavx512cd -mavx512dq -mavx512bw -mfma -mf16c ;;
    # The optional AVX-512 BF16 and AMX kernels are left out (isa_choice.cpp registers them
    # only under PAGEDATTN_CPU_AVX512BF16 and PAGEDATTN_CPU_AMX); their paths are covered by
    # the test suite's per-ISA rows.
    isa_avx512bf16.cpp | isa_amx.cpp) ;;
    *) compile "$src" ;;
  esac
done
# The target: the arguments an input chooses (libfuzzer_args.cpp), then the buffers and checks.
compile "$root/fuzz/libfuzzer_args.cpp"
"$CXX" "${common[@]}" -fsanitize=fuzzer "$root/fuzz/libfuzzer_target.cpp" "${objs[@]}" \
  -o "$out/pagedattn_libfuzzer"
echo "built $out/pagedattn_libfuzzer"
echo "run:  $out/pagedattn_libfuzzer $root/fuzz/corpus/libfuzzer -max_total_time=60"
