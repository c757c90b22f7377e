# Install-time step (cmake/PagedattnInstall.cmake): merges the objects of libcudart_static.a into
# the installed static libpagedattn.a, so that a consumer links the CUDA runtime from it and needs
# no CUDA toolkit. Variables: ARCHIVE (the installed archive), CUDART (libcudart_static.a), AR,
# RANLIB.
set(merged ${ARCHIVE}.merged)
set(mri ${ARCHIVE}.mri)
file(WRITE ${mri} "CREATE ${merged}\nADDLIB ${ARCHIVE}\nADDLIB ${CUDART}\nSAVE\nEND\n")
execute_process(COMMAND ${AR} -M INPUT_FILE ${mri} RESULT_VARIABLE rc ERROR_VARIABLE err)
file(REMOVE ${mri})
if(rc)
  file(REMOVE ${merged})
  message(FATAL_ERROR "pagedattn: merging ${CUDART} into ${ARCHIVE} failed (${rc}): ${err}")
endif()
execute_process(COMMAND ${RANLIB} ${merged} RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "pagedattn: ${RANLIB} ${merged} failed: ${rc}")
endif()
file(RENAME ${merged} ${ARCHIVE})
message(STATUS "Bundled the CUDA runtime (${CUDART}) into ${ARCHIVE}")
