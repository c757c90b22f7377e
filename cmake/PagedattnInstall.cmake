# cmake --install: headers, the library and a package config, so that a consumer writes
#   find_package(pagedattn REQUIRED)
#   target_link_libraries(app PRIVATE pagedattn::pagedattn)
include(CMakePackageConfigHelpers)

install(TARGETS pagedattn EXPORT pagedattnTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# Exactly the public headers: the API, what it includes, the block manager and the reference. The
# backends' math and seams (split_plan, online_softmax, cache_layout, validate, detail/) stay
# inside the build.
set(PAGEDATTN_PUBLIC_HEADERS block_manager.hpp cache_ops.hpp dtype.hpp error.hpp host_device.hpp
                             pagedattn.hpp reference.hpp)
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
