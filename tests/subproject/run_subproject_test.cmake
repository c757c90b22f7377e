# ctest driver: configure the parent project (tests/subproject) with its own build type and CUDA
# architectures (sm_90 machine code only, unlike pagedattn's default), build it, run its program.
# Variables: PAGEDATTN_SOURCE_DIR, SOURCE_DIR, WORK_DIR, WITH_CUDA.
file(REMOVE_RECURSE ${WORK_DIR})
set(args -DCMAKE_BUILD_TYPE=MinSizeRel -DPAGEDATTN_SOURCE_DIR=${PAGEDATTN_SOURCE_DIR})
if(WITH_CUDA)
  list(APPEND args -DPAGEDATTN_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real)
else()
  list(APPEND args -DPAGEDATTN_CUDA=OFF)
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR} ${args}
                RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "configuring the parent project failed: ${rc}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${WORK_DIR} --target parent_app -j 2
                RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "building the parent project failed: ${rc}")
endif()
execute_process(COMMAND ${WORK_DIR}/parent_app RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "the parent project's program computed a wrong result: ${rc}")
endif()
