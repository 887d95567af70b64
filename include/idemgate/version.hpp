// SPDX-License-Identifier: MIT
// The version of idemgate, defined once.
#pragma once

/// Major version of idemgate.
#define IDEMGATE_VERSION_MAJOR 0
/// Minor version of idemgate.
#define IDEMGATE_VERSION_MINOR 1
/// Patch version of idemgate.
#define IDEMGATE_VERSION_PATCH 0

namespace idemgate {
/// The library version as "major.minor.patch".
inline constexpr const char* version_string = "0.1.0";
}  // namespace idemgate
