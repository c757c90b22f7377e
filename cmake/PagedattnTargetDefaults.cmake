# Settings every pagedattn target carries as its own properties, so that a parent project that
# adds pagedattn with add_subdirectory keeps its own language standard, PIC and CUDA
# architectures for its targets.
function(pagedattn_target_defaults target)
  target_compile_features(${target} PUBLIC cxx_std_17)
  set_target_properties(${target} PROPERTIES CXX_EXTENSIONS OFF POSITION_INDEPENDENT_CODE ON)
  if(PAGEDATTN_WITH_CUDA)
    set_target_properties(${target} PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON
                                               CUDA_EXTENSIONS OFF)
    if(_PAGEDATTN_CUDA_ARCHS)  # cmake/PagedattnCuda.cmake
      set_target_properties(${target} PROPERTIES CUDA_ARCHITECTURES "${_PAGEDATTN_CUDA_ARCHS}")
    endif()
  endif()
endfunction()
