# The test of an example that compiles in a group (CMakeLists.txt): the group builds (after the
# build, nothing is left to do), or else the example alone does, and its messages are the test's.
# Variables: BUILD_DIR, GROUP (the group's target), SNIPPET (the example's own target).

cmake_minimum_required(VERSION 3.20)

execute_process(COMMAND ${CMAKE_COMMAND} --build ${BUILD_DIR} --target ${GROUP}
  RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
if(rc EQUAL 0)
  message(STATUS "${SNIPPET} compiles in ${GROUP}")
  return()
endif()
# Some example of the group does not compile: is it this one?
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BUILD_DIR} --target ${SNIPPET}
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${SNIPPET} does not compile (messages above)")
endif()
message(STATUS "${SNIPPET} compiles alone; another example of ${GROUP} does not")
