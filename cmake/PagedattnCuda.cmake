# Decides whether the CUDA backend is built (PAGEDATTN_WITH_CUDA) from PAGEDATTN_CUDA, and for
# which GPU architectures (PAGEDATTN_CUDA_ARCHITECTURES).

set(PAGEDATTN_CUDA_ARCHITECTURES "" CACHE STRING
    "GPU architectures of pagedattn's kernels: a CMake CUDA_ARCHITECTURES list (e.g. 90a-real), \
'portable' (80-real;90-real;90-virtual), 'local' (the GPUs nvidia-smi lists), or empty: \
CMAKE_CUDA_ARCHITECTURES when set, else local when a GPU is found, else portable")

# The fewest targets that run every GPU from sm_80 on at full speed: sm_80 machine code also runs
# on sm_86 and sm_89 (same major version), sm_90 machine code on Hopper, and compute_90 PTX is
# compiled by the driver for anything newer. The kernels need sm_80 (cp.async, ldmatrix, bf16
# MMA).
set(_pagedattn_portable_archs 80-real 90-real 90-virtual)

# Machine code for each GPU that nvidia-smi lists on this machine (empty when there is none).
function(pagedattn_local_cuda_architectures out)
  set(archs "")
  find_program(_pagedattn_nvidia_smi nvidia-smi)
  if(_pagedattn_nvidia_smi)
    execute_process(COMMAND ${_pagedattn_nvidia_smi} --query-gpu=compute_cap --format=csv,noheader
                    OUTPUT_VARIABLE caps RESULT_VARIABLE rc ERROR_QUIET
                    OUTPUT_STRIP_TRAILING_WHITESPACE)
    if(rc EQUAL 0 AND caps MATCHES "^[0-9]")
      string(REPLACE "\n" ";" caps "${caps}")
      foreach(cap IN LISTS caps)
        string(STRIP "${cap}" cap)
        string(REPLACE "." "" cap "${cap}")
        if(cap MATCHES "^[0-9]+$" AND cap GREATER_EQUAL 80)
          list(APPEND archs ${cap}-real)
        endif()
      endforeach()
      list(REMOVE_DUPLICATES archs)
    endif()
  endif()
  set(${out} "${archs}" PARENT_SCOPE)
endfunction()

# Sets _PAGEDATTN_CUDA_ARCHS, the architectures pagedattn's own targets build for
# (pagedattn_target_defaults), and CMAKE_CUDA_ARCHITECTURES when pagedattn is the top-level
# project and nobody chose them; a parent project's targets keep their own.
macro(pagedattn_choose_cuda_architectures)
  set(_PAGEDATTN_CUDA_ARCHS "")
  set(_pagedattn_archs_from "")
  if(PAGEDATTN_CUDA_ARCHITECTURES STREQUAL "portable")
    set(_PAGEDATTN_CUDA_ARCHS ${_pagedattn_portable_archs})
  elseif(PAGEDATTN_CUDA_ARCHITECTURES STREQUAL "local")
    pagedattn_local_cuda_architectures(_PAGEDATTN_CUDA_ARCHS)
    if(NOT _PAGEDATTN_CUDA_ARCHS)
      message(FATAL_ERROR "pagedattn: PAGEDATTN_CUDA_ARCHITECTURES=local but nvidia-smi lists no "
                          "GPU of sm_80 or newer; name the architectures (e.g. 90-real) or use "
                          "'portable'")
    endif()
  elseif(PAGEDATTN_CUDA_ARCHITECTURES)
    set(_PAGEDATTN_CUDA_ARCHS ${PAGEDATTN_CUDA_ARCHITECTURES})
  elseif(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    pagedattn_local_cuda_architectures(_PAGEDATTN_CUDA_ARCHS)
    if(NOT _PAGEDATTN_CUDA_ARCHS)
      set(_PAGEDATTN_CUDA_ARCHS ${_pagedattn_portable_archs})
    endif()
  endif()
  if(_PAGEDATTN_CUDA_ARCHS AND PAGEDATTN_TOP_LEVEL AND NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES ${_PAGEDATTN_CUDA_ARCHS})
  endif()
  if(_PAGEDATTN_CUDA_ARCHS)
    message(STATUS "pagedattn: CUDA architectures ${_PAGEDATTN_CUDA_ARCHS}")
  else()
    message(STATUS "pagedattn: CUDA architectures ${CMAKE_CUDA_ARCHITECTURES} (CMAKE_CUDA_ARCHITECTURES)")
  endif()
endmacro()
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
    pagedattn_choose_cuda_architectures()
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
