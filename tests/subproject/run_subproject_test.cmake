# ctest driver: configure the parent project (tests/subproject) with its own build type and CUDA
# architectures (sm_90 machine code only, unlike pagedattn's default), which its configure step
# checks pagedattn kept; then build its program and run it. The CUDA kernels are compiled once,
# by the build that runs this test: when CUDA is built, the parent's program is built and run
# from a second configuration of the parent without the CUDA backend.
# Variables: PAGEDATTN_SOURCE_DIR, SOURCE_DIR, WORK_DIR, WITH_CUDA.
file(REMOVE_RECURSE ${WORK_DIR})
set(args -DCMAKE_BUILD_TYPE=MinSizeRel -DPAGEDATTN_SOURCE_DIR=${PAGEDATTN_SOURCE_DIR})

function(configure_parent dir)
  execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${dir} ${args} ${ARGN}
                  RESULT_VARIABLE rc)
  if(rc)
    message(FATAL_ERROR "configuring the parent project (${ARGN}) failed: ${rc}")
  endif()
endfunction()

if(WITH_CUDA)
  configure_parent(${WORK_DIR}/cuda -DPAGEDATTN_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real)
endif()
set(app_dir ${WORK_DIR}/cpu)
configure_parent(${app_dir} -DPAGEDATTN_CUDA=OFF)
execute_process(COMMAND ${CMAKE_COMMAND} --build ${app_dir} --target parent_app -j 2
                RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "building the parent project failed: ${rc}")
endif()
execute_process(COMMAND ${app_dir}/parent_app RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "the parent project's program computed a wrong result: ${rc}")
endif()
