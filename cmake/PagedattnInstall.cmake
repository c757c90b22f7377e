# cmake --install: headers, the library and a package config, so that a consumer writes
#   find_package(pagedattn REQUIRED)
#   target_link_libraries(app PRIVATE pagedattn::pagedattn)
# and, when built with NCCL, pagedattn::nccl (pagedattn/nccl_communicator.hpp).
include(CMakePackageConfigHelpers)

set(_pagedattn_installed pagedattn)
if(PAGEDATTN_WITH_NCCL)
  list(APPEND _pagedattn_installed pagedattn_nccl)  # pagedattn::nccl
  install(FILES ${PROJECT_SOURCE_DIR}/nccl/include/pagedattn/nccl_communicator.hpp
          DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/pagedattn)
endif()
install(TARGETS ${_pagedattn_installed} EXPORT pagedattnTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# A static library with the CUDA backend: the CUDA runtime goes inside the installed archive, so
# the export needs no CUDA:: target and consumers no CUDA toolkit (pagedattn_link_cuda_runtime).
get_target_property(_pagedattn_type pagedattn TYPE)
if(PAGEDATTN_WITH_CUDA AND _pagedattn_type STREQUAL "STATIC_LIBRARY")
  install(CODE "
    set(ARCHIVE \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBDIR}/$<TARGET_FILE_NAME:pagedattn>\")
    set(CUDART \"${CUDA_cudart_static_LIBRARY}\")
    set(AR \"${CMAKE_AR}\")
    set(RANLIB \"${CMAKE_RANLIB}\")
    include(\"${PROJECT_SOURCE_DIR}/cmake/PagedattnBundleCudart.cmake\")")
endif()
# Exactly the public headers: the API, what it includes (cache_layout.hpp: the cache strides),
# the block manager with its count of shared reads (shared_blocks.hpp) and the reference. The
# backends' math and seams (split_plan, online_softmax, validate, detail/) stay inside the build.
set(PAGEDATTN_PUBLIC_HEADERS block_manager.hpp cache_layout.hpp cache_ops.hpp context_parallel.hpp
                             dtype.hpp error.hpp host_device.hpp merge_states.hpp mla.hpp mla_cache.hpp
                             pagedattn.hpp reference.hpp shared_blocks.hpp)
list(TRANSFORM PAGEDATTN_PUBLIC_HEADERS PREPEND ${PROJECT_SOURCE_DIR}/core/include/pagedattn/)
install(FILES ${PAGEDATTN_PUBLIC_HEADERS} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/pagedattn)
install(EXPORT pagedattnTargets NAMESPACE pagedattn::
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/pagedattn)

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/pagedattnConfig.cmake.in
  ${PROJECT_BINARY_DIR}/pagedattnConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/pagedattn)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/pagedattnConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/pagedattnConfig.cmake
              ${PROJECT_BINARY_DIR}/pagedattnConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/pagedattn)
