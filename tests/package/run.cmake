# Installs idemgate into a scratch prefix, then configures, builds and runs a consumer project
# that finds it with find_package(idemgate CONFIG), and runs the installed store conformance
# suite over the consumer's own store.

# docs/stores.md shows the consumer's conformance file as it is (checked first: it is quick).
file(READ ${SOURCE_DIR}/docs/stores.md docs)
file(READ ${SOURCE_DIR}/tests/package/tally_store_conformance.cpp example)
string(FIND "${docs}" "```cpp\n${example}```" at)
if(at EQUAL -1)
  message(FATAL_ERROR "docs/stores.md does not show tests/package/tally_store_conformance.cpp "
    "verbatim in a ```cpp block: make them the same")
endif()

file(REMOVE_RECURSE ${WORK_DIR})
set(build ${WORK_DIR}/idemgate-build)
set(prefix ${WORK_DIR}/prefix)
set(consumer ${WORK_DIR}/consumer-build)

function(step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed: ${ARGN}\n${out}\n${err}")
  endif()
endfunction()

step(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${build} -G ${GENERATOR} -DIDEMGATE_BUILD_TESTS=OFF
  -DIDEMGATE_BUILD_BENCH=OFF -DIDEMGATE_BUILD_EXAMPLES=OFF -DCMAKE_INSTALL_PREFIX=${prefix})
step(${CMAKE_COMMAND} --install ${build})
# The schema and the alerting rules are installed as they are in docs/.
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
step(${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/package -B ${consumer} -G ${GENERATOR}
  -DCMAKE_PREFIX_PATH=${prefix})
step(${CMAKE_COMMAND} --build ${consumer} -j2)
step(${consumer}/consumer)
if(EXISTS ${consumer}/consumer_postgres)
  step(${consumer}/consumer_postgres)
else()
  message(FATAL_ERROR "the installed idemgate::postgres target was not found by the consumer")
endif()

# The installed conformance suite over the consumer's own store: every test passes.
execute_process(COMMAND ${consumer}/tally_store_conformance
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out MATCHES "\\[  PASSED  \\] ([0-9]+) tests")
  message(FATAL_ERROR "the conformance suite failed over the consumer's store:\n${out}\n${err}")
endif()
message(STATUS "conformance suite over the consumer's TallyStore: ${CMAKE_MATCH_1} tests passed")

# A store that ignores the fence on release fails it, and the run says which behaviour broke.
execute_process(COMMAND ${consumer}/forgetful_store_conformance
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0 OR NOT out MATCHES
    "FAILED  \\] ForgetfulStore/StoreConformance/0.ReleaseNeedsTheCurrentFenceAndKeepsTheRowInFlight")
  message(FATAL_ERROR "the conformance suite did not fail a store that ignores fences "
    "(exit ${rc}):\n${out}\n${err}")
endif()

message(STATUS "consumer built and ran against ${prefix}")
