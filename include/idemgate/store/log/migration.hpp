// SPDX-License-Identifier: MIT
// What `migrate()` of a SQL store reports: the log's version before and after, and each step it
// applied or found in place.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace idemgate {

/// One numbered step of a log's schema that `migrate()` applied, or found in place.
struct MigrationStep {
  /// Its number.
  int version = 0;
  /// Its short name (`gates`).
  std::string name;
  /// What it changes.
  std::string summary;
  /// How long applying it took (zero for a step found in place).
  std::chrono::milliseconds took{0};
};

/// What `migrate()` did to a log (`SqliteStore::migrate`, `PostgresStore::migrate`).
struct MigrationReport {
  /// The log's table.
  std::string table;
  /// Its version before: the newest step recorded (0: no log yet, or a log made before versions
  /// were recorded).
  int from_version = 0;
  /// Its version after: the newest step this library knows, or the log's own when it is newer.
  int to_version = 0;
  /// The steps applied now, oldest first.
  std::vector<MigrationStep> applied;
  /// The steps a log made before versions were recorded already had: recorded, not run again.
  std::vector<MigrationStep> found;

  /// Whether the log's shape or its record of versions changed.
  [[nodiscard]] bool changed() const noexcept { return !applied.empty() || !found.empty(); }
};

}  // namespace idemgate
