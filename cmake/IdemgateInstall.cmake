include(CMakePackageConfigHelpers)

install(DIRECTORY include/idemgate DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS idemgate EXPORT idemgate-targets)
install(EXPORT idemgate-targets
  NAMESPACE idemgate::
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/idemgate)

# pkg-config files for builds without CMake, in the architecture-independent directory (the
# library is headers only). Paths are relative to the file itself, so the tree can move.
set(idemgate_pc_dir ${CMAKE_INSTALL_DATADIR}/pkgconfig)
if(IS_ABSOLUTE "${idemgate_pc_dir}" OR IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(idemgate_pc_prefix "${CMAKE_INSTALL_PREFIX}")
  set(idemgate_pc_includedir "${CMAKE_INSTALL_FULL_INCLUDEDIR}")
else()
  file(RELATIVE_PATH idemgate_pc_up /root/${idemgate_pc_dir} /root)
  string(REGEX REPLACE "/$" "" idemgate_pc_up "${idemgate_pc_up}")
  set(idemgate_pc_prefix "\${pcfiledir}/${idemgate_pc_up}")
  set(idemgate_pc_includedir "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
endif()

# idemgate_pkg_config(<file name> <description> <Requires> <Cflags and Libs of its own>)
function(idemgate_pkg_config name description requires own)
  file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/pkgconfig/${name}.pc
    "prefix=${idemgate_pc_prefix}\n"
    "includedir=${idemgate_pc_includedir}\n\n"
    "Name: ${name}\n"
    "Description: ${description}\n"
    "Version: ${PROJECT_VERSION}\n"
    "Requires: ${requires}\n"
    "${own}")
  install(FILES ${CMAKE_CURRENT_BINARY_DIR}/pkgconfig/${name}.pc DESTINATION ${idemgate_pc_dir})
endfunction()

# The core: headers, OpenSSL's libcrypto and threads. C++20 is the compiler's flag to give.
idemgate_pkg_config(idemgate "${PROJECT_DESCRIPTION} (C++20, headers only)" "libcrypto"
  "Cflags: -I\${includedir} -pthread\nLibs: -pthread\n")

# Each component: its own export set (the package config loads it only where its dependencies
# are found) and its own pkg-config file, requiring the core and its dependencies' modules.
foreach(component IN LISTS IDEMGATE_COMPONENTS)
  if(TARGET idemgate_${component})
    install(TARGETS idemgate_${component} EXPORT idemgate-${component}-targets)
    install(EXPORT idemgate-${component}-targets
      NAMESPACE idemgate::
      DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/idemgate)
    set(requires "idemgate = ${PROJECT_VERSION};${idemgate_${component}_pc_requires}")
    string(REPLACE ";" ", " requires "${requires}")
    idemgate_pkg_config(idemgate-${component}
      "idemgate::${component}: ${IDEMGATE_COMPONENT_${component}_NEEDS}" "${requires}" "")
  endif()
endforeach()

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
# the Prometheus alerting rules, in share/idemgate; the guides (and their images) in
# share/doc/idemgate; and the API reference there too when `cmake --build <dir> --target docs`
# ran before installing.
install(FILES docs/schema.sql docs/alerts.yml DESTINATION ${CMAKE_INSTALL_DATADIR}/idemgate)
install(DIRECTORY docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR} FILES_MATCHING PATTERN "*.md"
  PATTERN "*.png" PATTERN "model" EXCLUDE)
install(DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}/docs/html DESTINATION ${CMAKE_INSTALL_DOCDIR}
  OPTIONAL)
