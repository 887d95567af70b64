# Fails when a field of a public options struct is missing from docs/reference.md: every field
# must be named (`field`) in the section of the reference (up to its next "## " heading) where
# the struct is first named as `Name` (or, failing that, Name). Run with -DSOURCE_DIR=<the source tree>.
set(options_structs
  "gate.hpp:GateOptions"
  "gate.hpp:Coalescing"
  "transaction_gate.hpp:TransactionGateOptions"
  "reconciler.hpp:ReconcilerOptions"
  "retention.hpp:RetentionOptions"
  "signals.hpp:SignalThresholds"
  "store/postgres/options.hpp:PostgresOptions"
  "store/sqlite/options.hpp:SqliteOptions"
  "downstream/http.hpp:HttpOptions"
  "webhook/verification.hpp:WebhookOptions"
  "metrics/prometheus_cpp.hpp:RegistryOptions"
  "server/endpoint.hpp:EndpointOptions"
  "server/key_header.hpp:KeyHeaderRules"
  "consumer/amqp.hpp:AmqpOptions"
  "consumer/redis_streams.hpp:RedisStreamsOptions"
  "consumer/nats.hpp:JetStreamOptions")

file(READ ${SOURCE_DIR}/docs/reference.md reference)
set(missing "")
set(checked 0)
foreach(entry IN LISTS options_structs)
  string(REPLACE ":" ";" parts "${entry}")
  list(GET parts 0 header)
  list(GET parts 1 name)
  file(READ ${SOURCE_DIR}/include/idemgate/${header} source)
  string(FIND "${source}" "\nstruct ${name} {\n" begin)
  if(begin EQUAL -1)
    message(FATAL_ERROR "struct ${name} is not in include/idemgate/${header}; update this list")
  endif()
  string(SUBSTRING "${source}" ${begin} -1 body)
  string(FIND "${body}" "\n};" end)
  string(SUBSTRING "${body}" 0 ${end} body)
  # One list element per line: protect the semicolons first.
  string(REPLACE ";" "<semicolon>" body "${body}")
  string(REPLACE "\n" ";" lines "${body}")

  string(FIND "${reference}" "`${name}`" at)
  if(at EQUAL -1)
    string(FIND "${reference}" "${name}" at)
  endif()
  if(at EQUAL -1)
    list(APPEND missing "${name} (the struct itself)")
    continue()
  endif()
  string(SUBSTRING "${reference}" ${at} -1 section)
  string(FIND "${section}" "\n## " next)
  if(NOT next EQUAL -1)
    string(SUBSTRING "${section}" 0 ${next} section)
  endif()

  foreach(line IN LISTS lines)
    # Members sit at two spaces; comments, static members, aliases and functions are no fields.
    if(NOT line MATCHES "^  [^ /]" OR line MATCHES "^  (static |using |\\[\\[|void |bool [a-z_]+\\()")
      continue()
    endif()
    if(line MATCHES "^  ([^=]*[^ =]) = ")
      set(declaration "${CMAKE_MATCH_1}")
    elseif(line MATCHES "^  (.*)<semicolon>$")
      set(declaration "${CMAKE_MATCH_1}")
      string(REGEX REPLACE "{[^}]*}$" "" declaration "${declaration}")
    else()
      continue()
    endif()
    if(NOT declaration MATCHES "([A-Za-z_][A-Za-z0-9_]*)$")
      continue()
    endif()
    set(field "${CMAKE_MATCH_1}")
    math(EXPR checked "${checked} + 1")
    string(FIND "${section}" "`${field}`" found)
    if(found EQUAL -1)
      list(APPEND missing "${name}::${field}")
    endif()
  endforeach()
endforeach()

if(missing)
  list(JOIN missing "\n  " missing)
  message(FATAL_ERROR "docs/reference.md does not document these options (name each, with its "
    "default, where the struct is described):\n  ${missing}")
endif()
message(STATUS "docs/reference.md documents all ${checked} option fields")
