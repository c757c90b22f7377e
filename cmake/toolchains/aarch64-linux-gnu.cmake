# Cross-compiling for AArch64 Linux with Debian's cross toolchain (g++-aarch64-linux-gnu); the
# test binaries run under qemu-user (qemu-aarch64 with the cross sysroot), which ctest and
# gtest_discover_tests pick up through CMAKE_CROSSCOMPILING_EMULATOR.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(PAGEDATTN_AARCH64_SYSROOT /usr/aarch64-linux-gnu CACHE PATH "AArch64 libraries for qemu -L")
find_program(PAGEDATTN_QEMU_AARCH64 NAMES qemu-aarch64 qemu-aarch64-static)
if(PAGEDATTN_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${PAGEDATTN_QEMU_AARCH64} -L ${PAGEDATTN_AARCH64_SYSROOT})
endif()
# Libraries and headers of the target: the cross sysroot first, then the host's (the header-only
# Eigen and xsimd are the same for every processor).
set(CMAKE_FIND_ROOT_PATH ${PAGEDATTN_AARCH64_SYSROOT})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)
