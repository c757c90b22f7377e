# Decides whether the NCCL communicator (the pagedattn::nccl library, nccl/) is built
# (PAGEDATTN_WITH_NCCL) from PAGEDATTN_NCCL, and finds NCCL: PAGEDATTN_NCCL_ROOT or the NCCL_ROOT /
# NCCL_HOME environment, the system, the nvidia-nccl-cu13 wheel of the python3 on PATH, or the
# copy of that wheel scripts/setup.sh unpacks into .deps/nccl. Defines the imported target
# pagedattn_nccl_external.
set(PAGEDATTN_NCCL AUTO CACHE STRING
    "Build the NCCL communicator: AUTO (with the CUDA backend, when NCCL is found), ON or OFF")
set_property(CACHE PAGEDATTN_NCCL PROPERTY STRINGS AUTO ON OFF)
set(PAGEDATTN_NCCL_ROOT "" CACHE PATH "Where NCCL is (a folder with include/nccl.h and lib/)")

set(PAGEDATTN_WITH_NCCL OFF)
if(NOT PAGEDATTN_NCCL STREQUAL "OFF")
  if(NOT PAGEDATTN_WITH_CUDA)
    if(PAGEDATTN_NCCL STREQUAL "ON")
      message(FATAL_ERROR "pagedattn: PAGEDATTN_NCCL=ON needs the CUDA backend (PAGEDATTN_CUDA)")
    endif()
  else()
    set(_hints ${PAGEDATTN_NCCL_ROOT} $ENV{NCCL_ROOT} $ENV{NCCL_HOME}
               ${PROJECT_SOURCE_DIR}/.deps/nccl/nvidia/nccl)
    find_program(_pagedattn_python3 python3)
    if(_pagedattn_python3)
      execute_process(
        COMMAND ${_pagedattn_python3} -c
                "import nvidia.nccl as m; print(list(m.__path__)[0])"
        OUTPUT_VARIABLE _wheel OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET
        RESULT_VARIABLE _wheel_rc)
      if(_wheel_rc EQUAL 0 AND _wheel)
        list(APPEND _hints ${_wheel})
      endif()
    endif()
    find_path(PAGEDATTN_NCCL_INCLUDE_DIR nccl.h HINTS ${_hints} PATH_SUFFIXES include)
    # The wheel ships only libnccl.so.2 (no libnccl.so link).
    find_library(PAGEDATTN_NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR HINTS ${_hints}
                 PATH_SUFFIXES lib lib64)
    if(PAGEDATTN_NCCL_INCLUDE_DIR AND PAGEDATTN_NCCL_LIBRARY)
      add_library(pagedattn_nccl_external SHARED IMPORTED)
      set_target_properties(pagedattn_nccl_external PROPERTIES
        IMPORTED_LOCATION ${PAGEDATTN_NCCL_LIBRARY}
        INTERFACE_INCLUDE_DIRECTORIES ${PAGEDATTN_NCCL_INCLUDE_DIR})
      set(PAGEDATTN_WITH_NCCL ON)
    elseif(PAGEDATTN_NCCL STREQUAL "ON")
      message(FATAL_ERROR "pagedattn: PAGEDATTN_NCCL=ON but NCCL was not found. "
                          "pip install nvidia-nccl-cu13, or set PAGEDATTN_NCCL_ROOT.")
    endif()
  endif()
endif()
if(PAGEDATTN_WITH_NCCL)
  message(STATUS "pagedattn: NCCL communicator ON (${PAGEDATTN_NCCL_LIBRARY})")
else()
  message(STATUS "pagedattn: NCCL communicator OFF")
endif()
