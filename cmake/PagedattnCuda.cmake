# Decides whether the CUDA backend is built (PAGEDATTN_WITH_CUDA) from PAGEDATTN_CUDA.
set(PAGEDATTN_WITH_CUDA OFF)
if(NOT PAGEDATTN_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX})
    find_program(_pagedattn_nvcc nvcc HINTS /usr/local/cuda/bin ENV CUDA_PATH PATH_SUFFIXES bin)
    if(_pagedattn_nvcc)
      set(CMAKE_CUDA_COMPILER ${_pagedattn_nvcc})
    endif()
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    # Machine code for Ampere (sm_80: A100, A30; sm_86: A10, A40, RTX 30xx), Ada (sm_89: L4, L40,
    # RTX 40xx) and Hopper (sm_90: H100, H200), plus compute_90 PTX so newer GPUs can JIT it,
    # unless the architectures were chosen (-DCMAKE_CUDA_ARCHITECTURES, or a parent project). Only
    # pagedattn's own targets get this default (pagedattn_target_defaults); a parent project's
    # targets keep theirs. The kernels need sm_80 (cp.async, ldmatrix, bf16 MMA); the
    # programmatic launch of the combine is used only on sm_90.
    set(PAGEDATTN_CUDA_ARCHITECTURES "")
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(PAGEDATTN_CUDA_ARCHITECTURES 80-real 86-real 89-real 90-real 90-virtual)
      if(PAGEDATTN_TOP_LEVEL)
        set(CMAKE_CUDA_ARCHITECTURES ${PAGEDATTN_CUDA_ARCHITECTURES})
      endif()
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    set(PAGEDATTN_WITH_CUDA ON)
  elseif(PAGEDATTN_CUDA STREQUAL "ON")
    message(FATAL_ERROR "pagedattn: PAGEDATTN_CUDA=ON but no CUDA compiler (nvcc) was found. "
                        "Install the CUDA toolkit or set -DPAGEDATTN_CUDA=OFF.")
  else()
    message(STATUS "pagedattn: nvcc not found, building without the CUDA backend")
  endif()
endif()
message(STATUS "pagedattn: CUDA backend ${PAGEDATTN_WITH_CUDA}")

# Links the CUDA runtime into `target` (the one pagedattn library) so that a consumer of the
# installed package needs no CUDA toolkit: a shared library carries cudart_static inside it; a
# static one links CUDA::cudart_static inside this build only, its installed archive gets the
# objects of libcudart_static.a merged in (cmake/PagedattnInstall.cmake), and its exported link
# interface names only the system libraries the runtime needs (no CUDA:: target).
function(pagedattn_link_cuda_runtime target)
  get_target_property(type ${target} TYPE)
  if(type STREQUAL "STATIC_LIBRARY")
    target_link_libraries(${target} PUBLIC $<BUILD_INTERFACE:CUDA::cudart_static>
                          $<INSTALL_INTERFACE:pthread> $<INSTALL_INTERFACE:dl>
                          $<INSTALL_INTERFACE:rt>)
  else()
    target_link_libraries(${target} PRIVATE CUDA::cudart_static)
  endif()
  set_target_properties(${target} PROPERTIES CUDA_RESOLVE_DEVICE_SYMBOLS ON)
endfunction()
