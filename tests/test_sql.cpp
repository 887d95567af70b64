// A store's SQL as data (store/sql.hpp): how a statement's text is rendered for a log and sent
// with literals, and SQLite's statements and migrations as the store sends them.

#include "support/statement_catalogue.hpp"

#include <idemgate/store/sql.hpp>
#include <idemgate/store/sqlite.hpp>

#include <gtest/gtest.h>

#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace {

namespace st = idemgate::detail::sql_text;
using idemgate::sql::Fragment;

constexpr Fragment pair_of{"pair_of", "{1} a, {2} b", "({1} || {2})"};
constexpr Fragment outer{"outer", "{1} x", "outer({pair_of({1}, 'y')})"};
constexpr const Fragment* fragments[] = {&pair_of, &outer};

std::string render(std::string_view text) {
  return st::render(
      text,
      [](std::string_view name) -> std::optional<std::string> {
        if (name == "log") return "ops.idemgate_log";
        return std::nullopt;
      },
      fragments);
}

}  // namespace

TEST(SqlText, RenderingFillsTheLogDropsCommentsAndCollapsesWhitespaceOutsideQuotes) {
  EXPECT_EQ(render("SELECT  a\n  FROM {log} -- why, with an apostrophe's worth\n WHERE b = 1"),
            "SELECT a FROM ops.idemgate_log WHERE b = 1");
  EXPECT_EQ(render("SELECT '--  kept  ', \"a  b\" FROM {log}"),
            "SELECT '--  kept  ', \"a  b\" FROM ops.idemgate_log")
      << "quotes keep their text";
  EXPECT_EQ(render("DO $$ BEGIN\n  PERFORM 1; -- inside\nEND $$"),
            "DO $$ BEGIN\n  PERFORM 1; -- inside\nEND $$")
      << "a dollar-quoted body is kept whole";
  EXPECT_EQ(render("SELECT '{}'::jsonb, '{\"a\": 1}'"), "SELECT '{}'::jsonb, '{\"a\": 1}'")
      << "braces that are no placeholder stay";
  EXPECT_EQ(render("SELECT to_regclass('{log}')"), "SELECT to_regclass('ops.idemgate_log')")
      << "a placeholder is filled inside quotes too";
}

TEST(SqlText, FragmentsTakeArgumentsWithParenthesesQuotesAndPlaceholders) {
  EXPECT_EQ(render("SELECT {pair_of(coalesce(a, ''), 'x, y')}"),
            "SELECT (coalesce(a, '') || 'x, y')");
  EXPECT_EQ(render("SELECT {pair_of({log}.a, $2)}"), "SELECT (ops.idemgate_log.a || $2)")
      << "an argument is filled where it is written";
  EXPECT_EQ(render("SELECT {outer(3)}"), "SELECT outer((3 || 'y'))") << "fragments call fragments";
}

TEST(SqlText, AnUnknownPlaceholderOrFragmentIsAnErrorNotText) {
  EXPECT_THROW((void)render("SELECT {nothing}"), std::logic_error);
  EXPECT_THROW((void)render("SELECT {nothing(1)}"), std::logic_error);
  EXPECT_THROW((void)render("SELECT {pair_of(1, 2)"), std::logic_error) << "not closed";
}

TEST(SqlText, LiteralsTakeThePlaceOfEachParameterOutsideQuotes) {
  const std::vector<std::string> literals = {"'g'", "1", "2", "3", "4", "5", "6", "7", "8", "10"};
  EXPECT_EQ(st::with_literals("SELECT $1, $10, '$2' WHERE x = $3::bigint", literals),
            "SELECT 'g', 10, '$2' WHERE x = 2::bigint");
  EXPECT_THROW((void)st::with_literals("SELECT $11", literals), std::logic_error);
  EXPECT_EQ(st::parameter_numbers("a = ?1 AND b = ?12 AND c = '?3' AND d = $2"),
            (std::set<int>{1, 2, 12}));
}

TEST(SqliteStatements, EachIsNamedOnceRenderedWholeAndListsTheParametersItUses) {
  const auto render = [](const idemgate::sql::Statement& statement) {
    return idemgate::SqliteStore::statement_sql(statement, "bookings_log");
  };
  idemgate::test::check_catalogue(idemgate::sql::sqlite::statements, render);
  idemgate::test::check_history_words(idemgate::sql::sqlite::statements, render);
}

TEST(SqliteStatements, MigrationsAreNumberedWithoutGapsAndRenderWhole) {
  idemgate::test::check_migrations(idemgate::SqliteStore::migrations(), [](std::string_view text) {
    return idemgate::detail::sqlite::Session::render_for("bookings_log", text);
  });
  const std::string script = idemgate::SqliteStore::schema_sql("bookings_log");
  EXPECT_NE(script.find("CREATE TABLE IF NOT EXISTS bookings_log_migrations"), std::string::npos);
  EXPECT_NE(script.find("-- 4 gates: "), std::string::npos) << "each step under its heading";
}
