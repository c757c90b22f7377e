# ctest driver: install the build tree into a scratch prefix, then configure, build and run the
# consumer project against it. Variables: BUILD_DIR, SOURCE_DIR, WORK_DIR, WITH_NCCL (the
# package has pagedattn::nccl: its header is installed and its consumer runs), and NO_CUDA_TOOLKIT:
# when true, the consumer is configured and built as on a machine without the CUDA toolkit (no
# nvcc on PATH, CUDAToolkit_ROOT, CUDA_PATH, CUDA_HOME, CUDACXX and LIBRARY_PATH unset,
# find_package(CUDAToolkit) disabled), and the installed package must name no CUDA target.
file(REMOVE_RECURSE ${WORK_DIR})
execute_process(COMMAND ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/prefix
                RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "cmake --install failed: ${rc}")
endif()
# Only the public headers are installed.
file(GLOB_RECURSE installed RELATIVE ${WORK_DIR}/prefix/include ${WORK_DIR}/prefix/include/*)
list(SORT installed)
set(public pagedattn/block_manager.hpp pagedattn/cache_layout.hpp pagedattn/cache_ops.hpp
           pagedattn/context_parallel.hpp pagedattn/dtype.hpp
           pagedattn/error.hpp pagedattn/host_device.hpp pagedattn/merge_states.hpp
           pagedattn/mla.hpp pagedattn/mla_cache.hpp pagedattn/pagedattn.hpp
           pagedattn/reference.hpp pagedattn/shared_blocks.hpp)
if(WITH_NCCL)
  list(APPEND public pagedattn/nccl_communicator.hpp)
  list(SORT public)
endif()
if(NOT installed STREQUAL public)
  message(FATAL_ERROR "installed headers are '${installed}', expected exactly '${public}'")
endif()
set(env)
set(no_cuda_args)
if(NO_CUDA_TOOLKIT)
  file(GLOB_RECURSE package_files ${WORK_DIR}/prefix/pagedattn*.cmake)
  foreach(f IN LISTS package_files)
    file(READ ${f} text)
    if(text MATCHES "CUDA::|CUDAToolkit|cudart")
      message(FATAL_ERROR "${f} refers to the CUDA toolkit (${CMAKE_MATCH_0}): consumers would "
                          "need it")
    endif()
  endforeach()
  string(REPLACE ":" ";" path "$ENV{PATH}")
  set(clean_path)
  foreach(dir IN LISTS path)
    if(NOT EXISTS "${dir}/nvcc" AND NOT dir MATCHES "[Cc][Uu][Dd][Aa]")
      list(APPEND clean_path "${dir}")
    endif()
  endforeach()
  list(JOIN clean_path ":" clean_path)
  set(env ${CMAKE_COMMAND} -E env --unset=CUDAToolkit_ROOT --unset=CUDA_PATH --unset=CUDA_HOME
          --unset=CUDACXX --unset=LIBRARY_PATH "PATH=${clean_path}")
  set(no_cuda_args -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON)
endif()
execute_process(COMMAND ${env} ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/build
                        -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DCMAKE_BUILD_TYPE=Release
                        ${no_cuda_args}
                RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "configuring the consumer against the installed package failed: ${rc}")
endif()
execute_process(COMMAND ${env} ${CMAKE_COMMAND} --build ${WORK_DIR}/build RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "building the consumer failed: ${rc}")
endif()
execute_process(COMMAND ${WORK_DIR}/build/consumer RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "the consumer computed a wrong result: ${rc}")
endif()
if(WITH_NCCL)
  execute_process(COMMAND ${WORK_DIR}/build/consumer_nccl RESULT_VARIABLE rc)
  if(rc)
    message(FATAL_ERROR "the pagedattn::nccl consumer failed: ${rc}")
  endif()
endif()
