# Finds the dependencies of the core and declares the optional components. Shared by the build
# and by the installed package config, so both resolve them the same way.
include_guard(DIRECTORY)  # imported targets are seen in their directory and below

find_package(OpenSSL REQUIRED)
find_package(Threads REQUIRED)
find_package(PkgConfig QUIET)

# idemgate_component(<name> DEBIAN <package> NEEDS <what> FIND <cmake package> <target> <pc>...)
# Declares the optional component idemgate::<name>: the build creates it when its dependencies
# are found, installs it in an export set and a pkg-config file (idemgate-<name>.pc) of its own,
# and `find_package(idemgate COMPONENTS <name>)` finds its dependencies again, or fails naming
# the Debian <package> to install. FIND takes triples: a CMake package, the imported target it
# defines, and the pkg-config module of the same dependency ("-" for none). The CMake package
# is tried first; the pkg-config module is the fallback (and what idemgate-<name>.pc requires).
# A CMake package "-" (and target "-") means pkg-config only: for a library whose packaged CMake
# config cannot be loaded.
set(IDEMGATE_COMPONENTS "")
macro(idemgate_component name)
  cmake_parse_arguments(_idemgate_c "" "DEBIAN;NEEDS" "FIND" ${ARGN})
  list(LENGTH _idemgate_c_FIND _idemgate_c_n)
  math(EXPR _idemgate_c_rest "${_idemgate_c_n} % 3")
  if(_idemgate_c_n EQUAL 0 OR NOT _idemgate_c_rest EQUAL 0 OR NOT _idemgate_c_DEBIAN
      OR NOT _idemgate_c_NEEDS)
    message(FATAL_ERROR "idemgate_component(${name}): give DEBIAN, NEEDS and FIND with "
      "triples of CMake package, target and pkg-config module")
  endif()
  list(APPEND IDEMGATE_COMPONENTS ${name})
  set(IDEMGATE_COMPONENT_${name}_DEBIAN "${_idemgate_c_DEBIAN}")
  set(IDEMGATE_COMPONENT_${name}_NEEDS "${_idemgate_c_NEEDS}")
  set(IDEMGATE_COMPONENT_${name}_FIND "${_idemgate_c_FIND}")
endmacro()

# idemgate_find_component(<name> <out>): finds the dependencies of one component and sets <out>
# to the targets to link, or to "" when one of them is missing. Sets <out>_PC to the pkg-config
# modules it requires.
function(idemgate_find_component name out)
  set(find ${IDEMGATE_COMPONENT_${name}_FIND})
  set(links "")
  set(modules "")
  list(LENGTH find n)
  math(EXPR last "${n} - 1")
  foreach(i RANGE 0 ${last} 3)
    math(EXPR t "${i} + 1")
    math(EXPR m "${i} + 2")
    list(GET find ${i} package)
    list(GET find ${t} target)
    list(GET find ${m} module)
    if(NOT module STREQUAL "-")
      list(APPEND modules ${module})
    endif()
    if(package STREQUAL "-")
      set(target "")
    elseif(NOT TARGET ${target})
      find_package(${package} QUIET)
    endif()
    if(NOT TARGET "${target}" AND NOT module STREQUAL "-" AND PkgConfig_FOUND)
      string(MAKE_C_IDENTIFIER "IDEMGATE_PC_${module}" prefix)
      string(TOUPPER ${prefix} prefix)
      if(NOT TARGET PkgConfig::${prefix})
        pkg_check_modules(${prefix} QUIET IMPORTED_TARGET GLOBAL ${module})
      endif()
      set(target PkgConfig::${prefix})
    endif()
    if(NOT TARGET "${target}")
      set(${out} "" PARENT_SCOPE)
      set(${out}_PC "${modules}" PARENT_SCOPE)
      return()
    endif()
    list(APPEND links ${target})
  endforeach()
  set(${out} "${links}" PARENT_SCOPE)
  set(${out}_PC "${modules}" PARENT_SCOPE)
endfunction()

# The optional components, one line each. libpqxx 7.x and later ship a CMake package; Debian
# 12's 6.4 and cpp-httplib have only pkg-config. libpq itself is linked too: the PostgreSQL
# store decodes bytea with it.
idemgate_component(postgres DEBIAN libpqxx-dev NEEDS "libpqxx with libpq"
  FIND libpqxx libpqxx::pqxx libpqxx PostgreSQL PostgreSQL::PostgreSQL libpq)
idemgate_component(sqlite DEBIAN libsqlite3-dev NEEDS "SQLite 3"
  FIND SQLite3 SQLite::SQLite3 sqlite3)
idemgate_component(http DEBIAN libcpp-httplib-dev NEEDS "cpp-httplib with OpenSSL"
  FIND httplib httplib::httplib cpp-httplib OpenSSL OpenSSL::SSL libssl)
idemgate_component(testing DEBIAN libgtest-dev NEEDS "GoogleTest"
  FIND GTest GTest::gtest gtest)
idemgate_component(prometheus DEBIAN prometheus-cpp-dev NEEDS "prometheus-cpp"
  FIND prometheus-cpp prometheus-cpp::core prometheus-cpp-core)
# The operator console (console/): served by the application's own cpp-httplib server.
idemgate_component(console DEBIAN libcpp-httplib-dev NEEDS "cpp-httplib"
  FIND httplib httplib::httplib cpp-httplib)
# The server side's Boost.Beast adapter (server/beast.hpp); its core and its cpp-httplib adapter
# need nothing more than the core and idemgate::http.
idemgate_component(beast DEBIAN libboost-dev NEEDS "Boost.Beast (the Boost headers)"
  FIND Boost Boost::headers -)
# The broker consumers (include/idemgate/consumer/): RabbitMQ over rabbitmq-c, whose Debian
# package ships a CMake package and a pkg-config module; Redis Streams over hiredis (pkg-config
# only on Debian 12's 0.14, a CMake package from 1.0 on).
idemgate_component(amqp DEBIAN librabbitmq-dev NEEDS "rabbitmq-c (librabbitmq)"
  FIND rabbitmq-c rabbitmq::rabbitmq librabbitmq)
idemgate_component(redis_streams DEBIAN libhiredis-dev NEEDS "hiredis"
  FIND hiredis hiredis::hiredis hiredis)
# The NATS C client: Debian's libnats-dev ships a CMake config that names a static library the
# package does not contain (loading it is a fatal error), so only its pkg-config module is used.
idemgate_component(nats DEBIAN libnats-dev NEEDS "the NATS C client (libnats)"
  FIND - - libnats)
