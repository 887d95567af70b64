// SPDX-License-Identifier: MIT
// A SQL store's statements as data: what one statement, shared piece and migration step is, and
// how a statement's text becomes the text sent for one log table.
#pragma once

#include <cctype>
#include <cstddef>
#include <functional>
#include <optional>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace idemgate::sql {

/**
 * One statement a store sends, as data: its name (on PostgreSQL also the name it is prepared
 * under), its parameters in order, and its text. In the text, `{log}` stands for the log's table,
 * `{mismatches}` for its mismatches table, `{history_limit}` for `idemgate::history_limit`, and
 * `{name(a, b)}` for the `Fragment` called `name` with those arguments; `--` comments are
 * dropped when the text is rendered (`render`).
 */
struct Statement {
  /// What the statement is called.
  std::string_view name;
  /// Its parameters in order (`$1 gate, $2 key`), as the store binds them.
  std::string_view parameters;
  /// Its text, with placeholders.
  std::string_view text;
};

/// A piece of SQL that several statements of one dialect share, written into them as
/// `{name(a, b)}`: `{1}`, `{2}`, … in its text stand for the arguments.
struct Fragment {
  /// The name statements call it by.
  std::string_view name;
  /// What its arguments are.
  std::string_view parameters;
  /// Its text, with placeholders.
  std::string_view text;
};

/// One numbered step of a log's schema, as data. Applied in order, each once; the version of the
/// newest applied step is recorded in the `{log}_migrations` table.
struct Migration {
  /// Its number: 1, 2, 3, … without gaps.
  int version;
  /// A short name (`gates`).
  std::string_view name;
  /// What it changes, for the report of `migrate()`.
  std::string_view summary;
  /// A query that answers one boolean: whether a log made before versions were recorded already
  /// has this step's shape (then the step is recorded as found rather than applied).
  std::string_view present;
  /// Its statements, in order, each run on its own.
  std::span<const std::string_view> statements;
};

}  // namespace idemgate::sql

namespace idemgate::detail::sql_text {

/// Whether `text[at]` starts a `$$` dollar quote (a function body or DO block).
[[nodiscard]] inline bool dollar_quote_at(std::string_view text, std::size_t at) noexcept {
  return text.compare(at, 2, "$$") == 0;
}

/// What a character of an SQL text belongs to.
enum class Part {
  code,     ///< SQL itself
  quoted,   ///< a string literal, a quoted identifier or a `$$` dollar quote, quotes included
  comment,  ///< a `--` comment, up to its line's end
};

/// Calls `visit(i, part)` for every index `i` of `text`.
template <class Visit>
void scan(std::string_view text, Visit&& visit) {
  char quote = '\0';  // '\'', '"', '$' (a dollar quote) or '-' (a comment) while inside one
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quote == '-') {
      visit(i, Part::comment);
      if (c == '\n') quote = '\0';
    } else if (quote == '$') {
      visit(i, Part::quoted);
      if (dollar_quote_at(text, i)) {
        visit(++i, Part::quoted);
        quote = '\0';
      }
    } else if (quote != '\0') {
      visit(i, Part::quoted);
      if (c == quote) quote = '\0';  // a doubled quote closes and reopens: the same thing
    } else if (c == '\'' || c == '"') {
      quote = c;
      visit(i, Part::quoted);
    } else if (dollar_quote_at(text, i)) {
      quote = '$';
      visit(i, Part::quoted);
      visit(++i, Part::quoted);
    } else if (c == '-' && i + 1 < text.size() && text[i + 1] == '-') {
      quote = '-';
      visit(i, Part::comment);
    } else {
      visit(i, Part::code);
    }
  }
}

/// `text` without `--` comments, every run of whitespace outside quotes made one space, trimmed.
[[nodiscard]] inline std::string compact(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  bool pending_space = false;
  scan(text, [&](std::size_t i, Part part) {
    const char c = text[i];
    if (part == Part::comment ||
        (part == Part::code && std::isspace(static_cast<unsigned char>(c)))) {
      pending_space = true;
      return;
    }
    if (pending_space && !out.empty()) out += ' ';
    pending_space = false;
    out += c;
  });
  return out;
}

/// `text` without the whitespace it begins and ends with.
[[nodiscard]] inline std::string trimmed(std::string_view text) {
  const auto first = text.find_first_not_of(" \n\t");
  if (first == std::string_view::npos) return {};
  return std::string(text.substr(first, text.find_last_not_of(" \n\t") - first + 1));
}

/// Looks up a placeholder's value (`log`, `mismatches`, …); nullopt for an unknown name.
using Variables = std::function<std::optional<std::string>(std::string_view)>;

/// Splits a fragment call's arguments at the commas outside parentheses and quotes.
[[nodiscard]] inline std::vector<std::string> arguments(std::string_view list) {
  std::vector<std::string> out(1);
  int depth = 0;
  scan(list, [&](std::size_t i, Part part) {
    const char c = list[i];
    if (part == Part::code && c == '(') ++depth;
    if (part == Part::code && c == ')') --depth;
    if (part == Part::code && c == ',' && depth == 0) {
      out.emplace_back();
      return;
    }
    if (part != Part::comment) out.back() += c;
  });
  for (std::string& a : out) a = trimmed(a);
  return out;
}

/// The placeholder that opens at `text[open]`: `{name}` or `{name(arguments)}`, as the length of
/// its name and its whole length; nullopt when no placeholder opens there (a brace of the SQL).
struct Placeholder {
  /// The length of its name.
  std::size_t name;
  /// Its whole length, braces included.
  std::size_t length;
};

[[nodiscard]] inline std::optional<Placeholder> placeholder_at(std::string_view text,
                                                               std::size_t open) {
  std::size_t at = open + 1;
  while (at < text.size() &&
         (std::isalnum(static_cast<unsigned char>(text[at])) || text[at] == '_'))
    ++at;
  const std::size_t name = at - open - 1;
  if (name == 0 || at >= text.size()) return std::nullopt;
  if (text[at] == '}') return Placeholder{name, at + 1 - open};
  if (text[at] != '(') return std::nullopt;
  // The arguments end at the parenthesis that closes this one, quotes and nesting aside.
  int depth = 0;
  std::optional<std::size_t> close;
  const std::string_view rest = text.substr(at);
  scan(rest, [&](std::size_t i, Part part) {
    if (close || part != Part::code) return;
    if (rest[i] == '(') ++depth;
    if (rest[i] == ')' && --depth == 0) close = at + i;
  });
  if (!close || *close + 1 >= text.size() || text[*close + 1] != '}')
    throw std::logic_error("idemgate: an SQL fragment call is not closed by ')}': " +
                           std::string(text.substr(open, 60)));
  return Placeholder{name, *close + 2 - open};
}

/// Fills the placeholders of `text` (see `idemgate::sql::Statement`), fragments' included.
[[nodiscard]] inline std::string fill(std::string_view text, const Variables& variables,
                                      std::span<const idemgate::sql::Fragment* const> fragments,
                                      int depth = 0) {
  if (depth > 8) throw std::logic_error("idemgate: SQL fragments call each other in a loop");
  std::string out;
  std::size_t copied = 0;
  for (std::size_t open = text.find('{'); open != std::string_view::npos;
       open = text.find('{', open + 1)) {
    if (open < copied) continue;  // inside a placeholder already filled
    const std::optional<Placeholder> found = placeholder_at(text, open);
    if (!found) continue;
    const std::string_view name = text.substr(open + 1, found->name);
    out.append(text.substr(copied, open - copied));
    copied = open + found->length;
    if (found->length == found->name + 2) {
      const std::optional<std::string> value = variables(name);
      if (!value)
        throw std::logic_error("idemgate: unknown SQL placeholder {" + std::string(name) + "}");
      out += *value;
      continue;
    }
    const idemgate::sql::Fragment* fragment = nullptr;
    for (const idemgate::sql::Fragment* f : fragments)
      if (f->name == name) fragment = f;
    if (fragment == nullptr)
      throw std::logic_error("idemgate: unknown SQL fragment {" + std::string(name) + "(...)}");
    // Between the name's "(" and the closing ")}".
    // The arguments are filled where they are written, with the caller's placeholders.
    std::vector<std::string> args =
        arguments(text.substr(open + found->name + 2, found->length - found->name - 4));
    for (std::string& a : args) a = fill(a, variables, fragments, depth + 1);
    const Variables with_arguments = [&](std::string_view n) -> std::optional<std::string> {
      if (n.size() == 1 && n[0] >= '1' && n[0] <= '9') {
        const auto at = static_cast<std::size_t>(n[0] - '1');
        if (at < args.size()) return args[at];
        return std::nullopt;
      }
      return variables(n);
    };
    out += fill(fragment->text, with_arguments, fragments, depth + 1);
  }
  out.append(text.substr(copied));
  return out;
}

/// A statement's text as it is sent: placeholders filled, comments dropped, whitespace collapsed.
[[nodiscard]] inline std::string render(std::string_view text, const Variables& variables,
                                        std::span<const idemgate::sql::Fragment* const> fragments) {
  return compact(fill(text, variables, fragments));
}

/// Calls `found(at, length, number)` for every positional parameter (`$3`, `?3`) of `text`
/// outside quotes.
template <class Found>
void for_each_parameter(std::string_view text, Found&& found) {
  std::size_t skip_to = 0;
  scan(text, [&](std::size_t i, Part part) {
    if (part != Part::code || i < skip_to || (text[i] != '$' && text[i] != '?')) return;
    std::size_t end = i + 1;
    while (end < text.size() && std::isdigit(static_cast<unsigned char>(text[end]))) ++end;
    if (end == i + 1) return;
    found(i, end - i, std::stoi(std::string(text.substr(i + 1, end - i - 1))));
    skip_to = end;
  });
}

/// The numbers of the positional parameters `text` uses.
[[nodiscard]] inline std::set<int> parameter_numbers(std::string_view text) {
  std::set<int> numbers;
  for_each_parameter(text, [&](std::size_t, std::size_t, int n) { numbers.insert(n); });
  return numbers;
}

/// `text` with each positional parameter `$n` replaced by `literals[n - 1]` (SQL literals): the
/// statement sent as one text without parameters.
[[nodiscard]] inline std::string with_literals(std::string_view text,
                                               std::span<const std::string> literals) {
  std::string out;
  std::size_t copied = 0;
  for_each_parameter(text, [&](std::size_t at, std::size_t length, int n) {
    if (n < 1 || static_cast<std::size_t>(n) > literals.size())
      throw std::logic_error("idemgate: no literal for parameter $" + std::to_string(n));
    out.append(text.substr(copied, at - copied)).append(literals[static_cast<std::size_t>(n - 1)]);
    copied = at + length;
  });
  out.append(text.substr(copied));
  return out;
}

}  // namespace idemgate::detail::sql_text
