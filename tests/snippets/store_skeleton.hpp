// A class skeleton of docs/stores.md: member declarations a store provides, checked against the
// library's concepts by the skeleton's own static_assert.
#include <idemgate/idemgate.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

using namespace idemgate;

/// The transaction your store hands to the business write.
struct YourTransaction {};

// @snippet: the example goes here
