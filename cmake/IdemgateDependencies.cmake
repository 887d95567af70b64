# Finds the dependencies of the core and of each backend. Shared by the build and by the
# installed package config, so both resolve them the same way.
include_guard(GLOBAL)

find_package(OpenSSL REQUIRED)
find_package(Threads REQUIRED)
find_package(PkgConfig QUIET)

# libpqxx: 7.x and later ship a CMake package; Debian 12's 6.4 has only pkg-config.
# libpq itself is linked too: the store decodes bytea with it.
set(idemgate_pqxx_target "")
find_package(PostgreSQL QUIET)
find_package(libpqxx CONFIG QUIET)
if(TARGET libpqxx::pqxx)
  set(idemgate_pqxx_target libpqxx::pqxx)
elseif(PkgConfig_FOUND)
  pkg_check_modules(IDEMGATE_PQXX QUIET IMPORTED_TARGET GLOBAL libpqxx)
  if(TARGET PkgConfig::IDEMGATE_PQXX)
    set(idemgate_pqxx_target PkgConfig::IDEMGATE_PQXX)
  endif()
endif()
if(idemgate_pqxx_target AND TARGET PostgreSQL::PostgreSQL)
  list(APPEND idemgate_pqxx_target PostgreSQL::PostgreSQL)
elseif(idemgate_pqxx_target)
  set(idemgate_pqxx_target "")
endif()

find_package(SQLite3 QUIET)

# cpp-httplib: upstream ships a CMake package; Debian 12 has only pkg-config.
set(idemgate_httplib_target "")
find_package(httplib CONFIG QUIET)
if(TARGET httplib::httplib)
  set(idemgate_httplib_target httplib::httplib)
elseif(PkgConfig_FOUND)
  pkg_check_modules(IDEMGATE_HTTPLIB QUIET IMPORTED_TARGET GLOBAL cpp-httplib)
  if(TARGET PkgConfig::IDEMGATE_HTTPLIB)
    set(idemgate_httplib_target PkgConfig::IDEMGATE_HTTPLIB)
  endif()
endif()
