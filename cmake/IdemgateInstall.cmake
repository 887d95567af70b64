include(CMakePackageConfigHelpers)

install(DIRECTORY include/idemgate DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS ${idemgate_targets} EXPORT idemgate-targets)
install(EXPORT idemgate-targets
  NAMESPACE idemgate::
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/idemgate)

# idemgate::testing links GoogleTest: the config loads it only when it finds GTest.
if(TARGET idemgate_testing)
  install(TARGETS idemgate_testing EXPORT idemgate-testing-targets)
  install(EXPORT idemgate-testing-targets
    NAMESPACE idemgate::
    DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/idemgate)
endif()

configure_package_config_file(cmake/idemgate-config.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/idemgate-config.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/idemgate)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/idemgate-config-version.cmake
  COMPATIBILITY SameMajorVersion
  ARCH_INDEPENDENT)
install(FILES
  ${CMAKE_CURRENT_BINARY_DIR}/idemgate-config.cmake
  ${CMAKE_CURRENT_BINARY_DIR}/idemgate-config-version.cmake
  cmake/IdemgateDependencies.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/idemgate)
install(FILES LICENSE README.md DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/idemgate)

# What operators use beside the headers: the PostgreSQL schema (to apply by hand or review) and
# the Prometheus alerting rules, in share/idemgate; the guides in share/doc/idemgate; and the
# API reference there too when `cmake --build <dir> --target docs` ran before installing.
install(FILES docs/schema.sql docs/alerts.yml DESTINATION ${CMAKE_INSTALL_DATADIR}/idemgate)
install(DIRECTORY docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR} FILES_MATCHING PATTERN "*.md"
  PATTERN "model" EXCLUDE)
install(DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}/docs/html DESTINATION ${CMAKE_INSTALL_DOCDIR}
  OPTIONAL)
