// The example of codec.hpp: a codec specialised at namespace scope.
#include <idemgate/codec.hpp>

#include <string>
#include <string_view>

// @snippet: the example goes here
