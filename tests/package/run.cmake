# The packaging tests: idemgate as other projects take it in. One script, one MODE per test:
#   install       builds and installs idemgate into WORK_DIR/prefix (a CTest fixture: the modes
#                 that use the installed tree, and test_operator_command, share it); with
#                 EXPECT_COMMAND, bin/idemgate must be there and run
#   package       the consumer in this folder finds the installed package (find_package), builds
#                 and runs; the installed store conformance suite runs over the consumer's store
#   subdirectory  the same consumer takes idemgate's sources in with add_subdirectory
#   fetchcontent  ... with FetchContent, from the local sources (no network)
#   components    find_package(idemgate COMPONENTS ...) with a dependency made unfindable fails,
#                 naming the Debian package; OPTIONAL_COMPONENTS only reports it
#   pkgconfig     the README's first example built with `c++ $(pkg-config --cflags --libs ...)`
#                 against the installed tree, then run against IDEMGATE_TEST_PG
# Variables: SOURCE_DIR, WORK_DIR, GENERATOR, CXX, MODE, EXPECT_COMMAND.

cmake_minimum_required(VERSION 3.20)

set(prefix ${WORK_DIR}/prefix)
set(work ${WORK_DIR}/${MODE})

# step(<command...>): runs it; fails the test with its output when it fails.
function(step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed: ${ARGN}\n${out}\n${err}")
  endif()
  set(step_output "${out}${err}" PARENT_SCOPE)
endfunction()

# expect(<text> <regex> <what it means>)
function(expect text regex meaning)
  if(NOT text MATCHES "${regex}")
    message(FATAL_ERROR "${meaning}: expected to match '${regex}' in:\n${text}")
  endif()
endfunction()

# consumer(<way>): configures and builds the consumer project, taking idemgate in as <way>, then
# runs its programs and builds its own `docs` target.
function(consumer way)
  file(REMOVE_RECURSE ${work})
  if(way STREQUAL "package")
    set(from -DCMAKE_PREFIX_PATH=${prefix})
  else()
    set(from -DCONSUMER_IDEMGATE_SOURCE=${SOURCE_DIR})
  endif()
  step(${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/package -B ${work} -G ${GENERATOR}
    -DCMAKE_CXX_COMPILER=${CXX} -DCONSUMER_TAKES_IDEMGATE_AS=${way} ${from})
  step(${CMAKE_COMMAND} --build ${work} -j2)
  step(${work}/consumer)
  step(${work}/wrap_one_call)
  step(${work}/consumer_postgres)
  step(${work}/consumer_console)
  step(${CMAKE_COMMAND} --build ${work} --target docs)
  expect("${step_output}" "documentation of the consumer" "the consumer's docs target")
endfunction()

if(MODE STREQUAL "install")
  file(REMOVE_RECURSE ${work} ${prefix})
  step(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${work} -G ${GENERATOR} -DCMAKE_CXX_COMPILER=${CXX}
    -DIDEMGATE_BUILD_TESTS=OFF -DIDEMGATE_BUILD_BENCH=OFF -DIDEMGATE_BUILD_EXAMPLES=OFF
    -DCMAKE_INSTALL_PREFIX=${prefix})
  step(${CMAKE_COMMAND} --build ${work} -j2)  # the operator command; the rest is headers
  step(${CMAKE_COMMAND} --install ${work})
  # The schema and the alerting rules are installed as they are in docs/, beside the guide.
  foreach(shipped schema.sql alerts.yml)
    execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files ${SOURCE_DIR}/docs/${shipped}
      ${prefix}/share/idemgate/${shipped} RESULT_VARIABLE rc)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "the install does not hold docs/${shipped} as share/idemgate/${shipped}")
    endif()
  endforeach()
  if(NOT EXISTS ${prefix}/share/doc/idemgate/guide.md)
    message(FATAL_ERROR "the install does not hold the guide as share/doc/idemgate/guide.md")
  endif()
  # The operator command is installed to bin and runs from there.
  if(EXPECT_COMMAND)
    if(NOT EXISTS ${prefix}/bin/idemgate)
      message(FATAL_ERROR "the install does not hold the operator command as bin/idemgate")
    endif()
    step(${prefix}/bin/idemgate --version)
    expect("${step_output}" "^0\\.[0-9]+\\.[0-9]+" "bin/idemgate --version")
  endif()
  message(STATUS "idemgate installed into ${prefix}")

elseif(MODE STREQUAL "package")
  # docs/stores.md shows the consumer's conformance file as it is (checked first: it is quick).
  file(READ ${SOURCE_DIR}/docs/stores.md docs)
  file(READ ${SOURCE_DIR}/tests/package/tally_store_conformance.cpp example)
  string(FIND "${docs}" "```cpp\n${example}```" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "docs/stores.md does not show tests/package/tally_store_conformance.cpp "
      "verbatim in a ```cpp block: make them the same")
  endif()
  consumer(package)
  step(${work}/consumer_nats)
  expect("${step_output}" "check that nats-server runs" "the installed NATS consumer's error")

  # The installed conformance suite over the consumer's own store: every test passes.
  execute_process(COMMAND ${work}/tally_store_conformance
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0 OR NOT out MATCHES "\\[  PASSED  \\] ([0-9]+) tests")
    message(FATAL_ERROR "the conformance suite failed over the consumer's store:\n${out}\n${err}")
  endif()
  message(STATUS "conformance suite over the consumer's TallyStore: ${CMAKE_MATCH_1} tests passed")

  # The broker consumers, from find_package(idemgate COMPONENTS amqp redis_streams).
  step(${work}/consumer_brokers)
  expect("${step_output}" "broker consumers: 2 refused, notifications and notifications built"
    "the installed amqp and redis_streams components")

  # A store that ignores the fence on release fails it, and the run says which behaviour broke.
  execute_process(COMMAND ${work}/forgetful_store_conformance
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(rc EQUAL 0 OR NOT out MATCHES
      "FAILED  \\] ForgetfulStore/StoreConformance/0.ReleaseNeedsTheCurrentFenceAndKeepsTheRowInFlight")
    message(FATAL_ERROR "the conformance suite did not fail a store that ignores fences "
      "(exit ${rc}):\n${out}\n${err}")
  endif()
  message(STATUS "consumer built and ran against ${prefix}")

elseif(MODE STREQUAL "subdirectory" OR MODE STREQUAL "fetchcontent")
  consumer(${MODE})
  if(EXISTS ${work}/idemgate/tests OR EXISTS ${work}/_deps/idemgate-build/tests)
    message(FATAL_ERROR "idemgate configured its tests inside the consumer")
  endif()
  message(STATUS "consumer built and ran with idemgate taken in by ${MODE}")

elseif(MODE STREQUAL "components")
  # A scratch consumer asking for components; one build tree, so the compiler is probed once.
  file(REMOVE_RECURSE ${work})
  # Its minimum is old on purpose: the package config must not depend on the consumer's policies.
  file(WRITE ${work}/src/CMakeLists.txt [=[
cmake_minimum_required(VERSION 3.1)
project(scratch LANGUAGES CXX)
if(SIBLINGS)  # two directories that cannot see each other's imported targets, both asking
  add_subdirectory(a)
  add_subdirectory(b)
else()
  include(find.cmake)
endif()
]=])
  file(WRITE ${work}/src/a/CMakeLists.txt "include(../find.cmake)\n")
  file(WRITE ${work}/src/b/CMakeLists.txt "include(../find.cmake)\n")
  file(WRITE ${work}/src/find.cmake [=[
if(OPTIONAL)
  find_package(idemgate CONFIG REQUIRED OPTIONAL_COMPONENTS ${WANT})
else()
  find_package(idemgate CONFIG REQUIRED COMPONENTS ${WANT})
endif()
foreach(c IN LISTS WANT)
  if(idemgate_${c}_FOUND AND TARGET idemgate::${c})
    message(STATUS "component ${c}: found in ${CMAKE_CURRENT_SOURCE_DIR}")
  elseif(NOT idemgate_${c}_FOUND AND NOT TARGET idemgate::${c})
    message(STATUS "component ${c}: not found")
  else()
    message(FATAL_ERROR "idemgate_${c}_FOUND and the target idemgate::${c} disagree")
  endif()
endforeach()
]=])
  # configure(<expected exit: 0 or 1> <WANT> <OPTIONAL> <HIDE> [SIBLINGS]): with HIDE, SQLite's
  # CMake module is disabled and pkg-config searches an empty folder, so SQLite and libpqxx
  # (which Debian 12 offers through pkg-config only) cannot be found. SIBLINGS asks from two
  # sibling directories instead of the top one.
  file(MAKE_DIRECTORY ${work}/empty)
  function(configure expect_rc want optional hide)
    set(siblings ${ARGN})
    if(hide)
      set(ENV{PKG_CONFIG_LIBDIR} ${work}/empty)
      set(ENV{PKG_CONFIG_PATH} "")
    else()
      unset(ENV{PKG_CONFIG_LIBDIR})
    endif()
    execute_process(COMMAND ${CMAKE_COMMAND} -S ${work}/src -B ${work}/build -G ${GENERATOR}
        -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_PREFIX_PATH=${prefix} "-DWANT=${want}"
        -DOPTIONAL=${optional} -DCMAKE_DISABLE_FIND_PACKAGE_SQLite3=${hide}
        -DCMAKE_DISABLE_FIND_PACKAGE_rabbitmq-c=${hide} -DCMAKE_DISABLE_FIND_PACKAGE_hiredis=${hide}
        -DSIBLINGS=${siblings}
      RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
    if(expect_rc EQUAL 0 AND NOT rc EQUAL 0 OR NOT expect_rc EQUAL 0 AND rc EQUAL 0)
      message(FATAL_ERROR "find_package(idemgate COMPONENTS ${want}) (dependencies hidden: "
        "${hide}) exited ${rc}, expected ${expect_rc}:\n${out}\n${err}")
    endif()
    string(REGEX REPLACE "[ \n]+" " " text "${out}${err}")  # CMake wraps long messages
    set(text "${text}" PARENT_SCOPE)
  endfunction()

  # SQLite made unfindable: the configuration fails and says what to install. (The runs with
  # hidden dependencies come first: pkg-config's results, once found, are cached.)
  configure(1 "sqlite" OFF ON)
  expect("${text}" "the component 'sqlite' needs SQLite 3, which was not found: install the \
Debian package libsqlite3-dev" "a required component whose dependency is missing")
  # libpqxx made unfindable.
  configure(1 "postgres" OFF ON)
  expect("${text}" "the component 'postgres' needs libpqxx with libpq, which was not found: \
install the Debian package libpqxx-dev" "a required component whose dependency is missing")
  # The broker consumers' client libraries made unfindable.
  configure(1 "amqp" OFF ON)
  expect("${text}" "the component 'amqp' needs rabbitmq-c \\(librabbitmq\\), which was not found: \
install the Debian package librabbitmq-dev" "a required component whose dependency is missing")
  configure(1 "redis_streams" OFF ON)
  expect("${text}" "the component 'redis_streams' needs hiredis, which was not found: install the \
Debian package libhiredis-dev" "a required component whose dependency is missing")
  # libnats made unfindable (Debian 12 offers it through pkg-config only: its CMake config names
  # a static library the package lacks).
  configure(1 "nats" OFF ON)
  expect("${text}" "the component 'nats' needs the NATS C client \\(libnats\\), which was not \
found: install the Debian package libnats-dev" "a required component whose dependency is missing")
  # As an optional component, the same gap leaves the package found and says what is left out.
  configure(0 "sqlite" ON ON)
  expect("${text}" "optional component left out: the component 'sqlite' needs SQLite 3"
    "an optional component whose dependency is missing")
  expect("${text}" "component sqlite: not found" "idemgate_sqlite_FOUND of a missing component")
  # A misspelt component.
  configure(1 "sqlight" OFF OFF)
  expect("${text}" "there is no component 'sqlight' \\(there are: postgres, sqlite, http, testing, prometheus"
    "an unknown component")
  # Every component, with its dependencies there.
  configure(0 "postgres;sqlite;http;testing;prometheus;console;beast;amqp;redis_streams;nats" OFF OFF)
  foreach(c postgres sqlite http testing prometheus console beast amqp redis_streams nats)
    expect("${text}" "component ${c}: found in ${work}/src " "the installed component ${c}")
  endforeach()
  # The same from two sibling directories of one project: each gets every component.
  configure(0 "postgres;sqlite;http;testing;prometheus;console;beast;nats" OFF OFF ON)
  foreach(c postgres sqlite http testing prometheus console beast nats)
    expect("${text}" "component ${c}: found in ${work}/src/a .*component ${c}: found in \
${work}/src/b" "the component ${c} in both sibling directories")
  endforeach()
  message(STATUS "each missing component failed the configuration with its Debian package")

elseif(MODE STREQUAL "pkgconfig")
  # The README's first example (examples/wrap_one_call/main.cpp, which check.cmake compares
  # with README.md), compiled the way a Makefile would.
  file(REMOVE_RECURSE ${work})
  file(MAKE_DIRECTORY ${work})
  set(ENV{PKG_CONFIG_PATH} ${prefix}/share/pkgconfig)
  find_program(PKG_CONFIG pkg-config REQUIRED)
  foreach(module idemgate idemgate-postgres idemgate-sqlite idemgate-http idemgate-testing
      idemgate-console idemgate-beast)
    step(${PKG_CONFIG} --validate ${module})
    step(${PKG_CONFIG} --print-errors --exists ${module})
  endforeach()
  step(${PKG_CONFIG} --cflags --libs idemgate-postgres)
  separate_arguments(flags UNIX_COMMAND "${step_output}")
  step(${CXX} -std=c++20 ${SOURCE_DIR}/examples/wrap_one_call/main.cpp -o ${work}/wrap_one_call
    ${flags})
  step(${CMAKE_COMMAND} -DEXAMPLE=${work}/wrap_one_call -DREADME=${SOURCE_DIR}/README.md
    -DSOURCE=${SOURCE_DIR}/examples/wrap_one_call/main.cpp
    -P ${SOURCE_DIR}/examples/wrap_one_call/check.cmake)
  message(STATUS "the README example built with pkg-config's flags (${flags}) and ran")

else()
  message(FATAL_ERROR "MODE must be install, package, subdirectory, fetchcontent, components "
    "or pkgconfig")
endif()
