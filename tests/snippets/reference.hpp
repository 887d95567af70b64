// docs/reference.md: declarations at namespace scope (a codec, a downstream policy).
#include <idemgate/idemgate.hpp>

#include <cstdint>
#include <string>
#include <string_view>

// @snippet: the example goes here
