# cmake --install: headers, the library and a package config, so that a consumer writes
#   find_package(pagedattn REQUIRED)
#   target_link_libraries(app PRIVATE pagedattn::pagedattn)
include(CMakePackageConfigHelpers)

install(TARGETS pagedattn EXPORT pagedattnTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/core/include/pagedattn
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
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
