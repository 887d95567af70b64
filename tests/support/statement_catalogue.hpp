#pragma once

// What every dialect's statements, as data, must be: each named once, each rendered for a log
// without a placeholder left, and each listing exactly the parameters its text uses.

#include <idemgate/store/log/protocol.hpp>
#include <idemgate/store/sql.hpp>

#include <gtest/gtest.h>

#include <set>
#include <span>
#include <string>
#include <string_view>

namespace idemgate::test {

/// The parameter numbers a statement's `parameters` text lists (`$2 key`, `?2 key`).
inline std::set<int> listed_parameters(std::string_view parameters) {
  return detail::sql_text::parameter_numbers(parameters);
}

/// Checks every statement of `catalogue`, rendered by `render(statement)`.
template <class Render>
void check_catalogue(std::span<const sql::Statement* const> catalogue, Render&& render) {
  std::set<std::string_view> names;
  for (const sql::Statement* statement : catalogue) {
    SCOPED_TRACE(std::string(statement->name));
    EXPECT_TRUE(names.insert(statement->name).second) << "named once";
    std::string text;
    ASSERT_NO_THROW(text = render(*statement)) << "every placeholder and fragment is known";
    EXPECT_EQ(text.find('{'), std::string::npos) << "no placeholder left: " << text;
    EXPECT_EQ(text.find("--"), std::string::npos) << "comments dropped: " << text;
    EXPECT_EQ(detail::sql_text::parameter_numbers(text), listed_parameters(statement->parameters))
        << "the parameters listed are the ones the text uses: " << text;
  }
}

/// Checks a dialect's migrations: numbered 1, 2, 3, … without gaps, each named once, each
/// statement and presence query rendered by `render(text)` without a placeholder left.
template <class Render>
void check_migrations(std::span<const sql::Migration> migrations, Render&& render) {
  std::set<std::string_view> names;
  int expected = 1;
  for (const sql::Migration& step : migrations) {
    SCOPED_TRACE(std::string(step.name));
    EXPECT_EQ(step.version, expected++);
    EXPECT_TRUE(names.insert(step.name).second) << "named once";
    EXPECT_FALSE(step.summary.empty());
    EXPECT_FALSE(step.statements.empty());
    for (std::string_view text : step.statements) {
      std::string rendered;
      ASSERT_NO_THROW(rendered = render(text));
      EXPECT_EQ(rendered.find("{log"), std::string::npos) << rendered;
    }
    std::string present;
    ASSERT_NO_THROW(present = render(step.present));
    EXPECT_EQ(present.find('{'), std::string::npos) << present;
  }
}

/// Checks that the history a dialect's statements write uses the words of the log protocol
/// (`detail::history`), as every other store does: each word appears in one statement's rendered
/// text at least.
template <class Render>
void check_history_words(std::span<const sql::Statement* const> catalogue, Render&& render) {
  std::string all;
  for (const sql::Statement* statement : catalogue) all += render(*statement) + "\n";
  for (std::string_view word :
       {detail::history::released, detail::history::redriven, detail::history::resolved,
        detail::history::taken_over, detail::history::lease_expired})
    EXPECT_NE(all.find("'" + std::string(word) + "'"), std::string::npos) << word;
}

}  // namespace idemgate::test
