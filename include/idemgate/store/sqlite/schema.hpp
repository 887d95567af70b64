// SPDX-License-Identifier: MIT
// SqliteStore's schema and adoption: the numbered migrations applied and recorded, and rows of no
// gate given to one.
#pragma once

#include "../../detail/sqlite/statement.hpp"
#include "../../gate_name.hpp"
#include "../log/migration.hpp"
#include "../log/row.hpp"
#include "../sql.hpp"
#include "session.hpp"
#include "sql/schema.hpp"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace idemgate::detail::sqlite {

/// The log's schema: its numbered migrations (`sql::sqlite::migrations`), applied and recorded in
/// `<table>_migrations`; and adoption of the rows of no gate.
class Schema {
 public:
  /// On the handle's scope.
  explicit Schema(Scope scope) noexcept : s_(scope.session), gate_(scope.gate) {}

  /// The whole schema of the log `table` as one script, every step in order with the record of
  /// it (see `SqliteStore::schema_sql`).
  [[nodiscard]] static std::string script(const std::string& table) {
    const auto text = [&](std::string_view sql) {
      return Session::render_for(table, sql, false) + ";\n";
    };
    std::string out = text(idemgate::sql::sqlite::create_migrations.text);
    for (const idemgate::sql::Migration& step : idemgate::sql::sqlite::migrations) {
      out += "\n-- " + std::to_string(step.version) + " " + std::string(step.name) + ": " +
             std::string(step.summary) + "\n";
      for (std::string_view statement : step.statements) out += text(statement);
      out += text("INSERT INTO {migrations} (version, name, applied_at) VALUES (" +
                  std::to_string(step.version) + ", '" + std::string(step.name) +
                  "', CAST((julianday('now') - 2440587.5) * 86400000000 AS INTEGER))"
                  " ON CONFLICT (version) DO NOTHING");
    }
    return out;
  }

  /// See `SqliteStore::migrate`.
  MigrationReport migrate() {
    return s_.run("migrating the idemgate log", nullptr, [&] {
      s_.begin();
      s_.simple(idemgate::sql::sqlite::create_migrations, "migrating the idemgate log");
      MigrationReport report;
      report.table = s_.table();
      bool exists = false;
      {
        auto& read = s_.statement(idemgate::sql::sqlite::migrated_version);
        ResetGuard guard(read);
        read.bind("migrating the idemgate log");
        read.step("migrating the idemgate log");
        report.from_version = static_cast<int>(read.int64(0));
        exists = read.int64(1) != 0;
      }
      if (!exists) report.from_version = 0;
      int version = report.from_version;
      if (exists && version == 0) {
        for (const idemgate::sql::Migration& step : idemgate::sql::sqlite::migrations) {
          if (query_int(s_.db(), s_.render(step.present)).value_or(0) == 0) break;
          record(step, "found in place");
          report.found.push_back({step.version, std::string(step.name), std::string(step.summary)});
          version = step.version;
        }
      }
      for (const idemgate::sql::Migration& step : idemgate::sql::sqlite::migrations) {
        if (step.version <= version) continue;
        const auto started = std::chrono::steady_clock::now();
        for (std::string_view statement : step.statements) exec(s_.db(), s_.render(statement));
        record(step, "");
        report.applied.push_back({step.version, std::string(step.name), std::string(step.summary),
                                  std::chrono::duration_cast<std::chrono::milliseconds>(
                                      std::chrono::steady_clock::now() - started)});
        version = step.version;
      }
      report.to_version = std::max(version, report.from_version);
      s_.end("migrating the idemgate log");
      return report;
    });
  }

  /// See `SqliteStore::adopt_unowned_rows`.
  std::size_t adopt_unowned_rows(std::size_t limit) {
    require_named_scope(gate_, "adopt_unowned_rows");
    return s_.run("adopting rows of no gate", nullptr, [&] {
      s_.begin();
      const std::int64_t moved = s_.change(idemgate::sql::sqlite::adopt, "adopting rows of no gate",
                                           gate_, sql_limit(limit));
      (void)s_.change(idemgate::sql::sqlite::adopt_mismatches, "adopting rows of no gate", gate_);
      s_.end("adopting rows of no gate");
      return static_cast<std::size_t>(moved);
    });
  }

 private:
  void record(const idemgate::sql::Migration& step, std::string_view note) {
    auto& insert = s_.statement(idemgate::sql::sqlite::record_migration);
    ResetGuard guard(insert);
    insert.bind("migrating the idemgate log", step.version, step.name, note, s_.now_micros());
    while (insert.step("migrating the idemgate log")) {
    }
  }

  Session& s_;
  const std::string& gate_;
};

}  // namespace idemgate::detail::sqlite
