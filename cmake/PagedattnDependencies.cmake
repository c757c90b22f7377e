# Every dependency comes from a distribution package; a missing one stops configuration with the
# package to install (scripts/setup.sh installs them all).
include(GNUInstallDirs)

macro(pagedattn_require pkg debian_pkg)
  find_package(${pkg} ${ARGN} QUIET)
  if(NOT ${pkg}_FOUND)
    message(FATAL_ERROR
      "pagedattn: dependency ${pkg} not found. Install the Debian package '${debian_pkg}' "
      "(apt-get install ${debian_pkg}) or run scripts/setup.sh.")
  endif()
endmacro()

pagedattn_require(Eigen3 libeigen3-dev 3.3 NO_MODULE)
pagedattn_require(xsimd libxsimd-dev)
pagedattn_require(OpenMP "libgomp1 (ships with g++)")
if(PAGEDATTN_BUILD_TESTS)
  pagedattn_require(GTest libgtest-dev)
endif()
if(PAGEDATTN_BUILD_BENCH)
  pagedattn_require(benchmark libbenchmark-dev)
endif()
