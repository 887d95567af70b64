# Installs idemgate into a scratch prefix, then configures, builds and runs a consumer project
# that finds it with find_package(idemgate CONFIG).
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
step(${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/package -B ${consumer} -G ${GENERATOR}
  -DCMAKE_PREFIX_PATH=${prefix})
step(${CMAKE_COMMAND} --build ${consumer} -j2)
step(${consumer}/consumer)
if(EXISTS ${consumer}/consumer_postgres)
  step(${consumer}/consumer_postgres)
else()
  message(FATAL_ERROR "the installed idemgate::postgres target was not found by the consumer")
endif()
message(STATUS "consumer built and ran against ${prefix}")
