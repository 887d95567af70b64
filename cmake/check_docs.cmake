# Builds the API reference and fails on any Doxygen warning (an undocumented public name, a
# broken reference).
file(REMOVE ${LOG})
execute_process(COMMAND ${DOXYGEN} ${DOXYFILE} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "doxygen failed (exit ${rc})")
endif()
file(READ ${LOG} warnings)
string(STRIP "${warnings}" warnings)
if(NOT warnings STREQUAL "")
  message(FATAL_ERROR "Doxygen warnings:\n${warnings}")
endif()
message(STATUS "API reference built without warnings")
