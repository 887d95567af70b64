// SPDX-License-Identifier: MIT
// What the SQL stores share about the log's rows: its columns, and how a row becomes a Record.
#pragma once

#include "../../detail/json_string.hpp"
#include "../../errors.hpp"
#include "../../key.hpp"
#include "../../record.hpp"

#include <array>
#include <cctype>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace idemgate::detail {

/// The columns of the log that make a `Record`, in the order every SQL store selects them.
enum class LogColumn : int {
  key,
  status,
  fence,
  request,
  fingerprint,
  result,
  reason,
  duplicates,
  created_at,
  updated_at,
  lease_until,
  attempts,
  gate,
  label,
  history,
};

/// The log's column names, by `LogColumn`.
inline constexpr std::array<std::string_view, 15> log_column_names = {
    "key",         "status",   "fence",      "request",    "fingerprint",
    "result",      "reason",   "duplicates", "created_at", "updated_at",
    "lease_until", "attempts", "gate",       "label",      "history"};

/// Whether a column holds an instant (the stores read it as microseconds since the epoch).
[[nodiscard]] constexpr bool is_instant(LogColumn column) noexcept {
  return column == LogColumn::created_at || column == LogColumn::updated_at ||
         column == LogColumn::lease_until;
}

/// The select list of a `Record`, in `LogColumn` order: each column as
/// `expression(column, name)` gives it in the store's dialect, separated by ", ".
template <class Expression>
[[nodiscard]] std::string record_select_list(Expression expression) {
  std::string out;
  for (std::size_t i = 0; i < log_column_names.size(); ++i) {
    if (i > 0) out += ", ";
    out += expression(static_cast<LogColumn>(i), log_column_names[i]);
  }
  return out;
}

/// Concept: one row of a store's driver, read by column index: `bytes` for a blob, `text` for a
/// text column, `int64` for an integer, `is_null` to tell NULL apart.
template <class R>
concept log_row = requires(const R& row, int column) {
  { row.is_null(column) } -> std::convertible_to<bool>;
  { row.int64(column) } -> std::same_as<std::int64_t>;
  { row.bytes(column) } -> std::same_as<std::string>;
  { row.text(column) } -> std::same_as<std::string>;
};

/// A row count as a SQL LIMIT: sizes beyond what a 64-bit integer holds mean "no limit".
[[nodiscard]] inline std::int64_t sql_limit(std::size_t limit) {
  constexpr auto most = static_cast<std::size_t>(std::numeric_limits<std::int64_t>::max());
  return static_cast<std::int64_t>(limit > most ? most : limit);
}

/// Microseconds since the epoch as a time point; values past what the clock's duration holds
/// (such as an ended lease) saturate to the clock's minimum or maximum instead of overflowing.
[[nodiscard]] inline std::chrono::system_clock::time_point from_micros(std::int64_t micros) {
  using time_point = std::chrono::system_clock::time_point;
  constexpr std::int64_t lowest =
      std::chrono::duration_cast<std::chrono::microseconds>(time_point::min().time_since_epoch())
          .count();
  constexpr std::int64_t highest =
      std::chrono::duration_cast<std::chrono::microseconds>(time_point::max().time_since_epoch())
          .count();
  if (micros <= lowest) return time_point::min();
  if (micros >= highest) return time_point::max();
  return time_point(std::chrono::duration_cast<std::chrono::system_clock::duration>(
      std::chrono::microseconds(micros)));
}

/// The key stored in a row; throws `StoreError` when the bytes are not a key.
[[nodiscard]] inline Key key_from(std::string_view bytes) {
  Key::bytes_type raw{};
  if (bytes.size() != raw.size())
    throw StoreError("idemgate: the store holds a key of " + std::to_string(bytes.size()) +
                     " bytes; expected 32. Was the table written by another program?");
  std::memcpy(raw.data(), bytes.data(), raw.size());
  return Key(raw);
}

/// Reads the history a SQL store keeps as JSON: an array of objects with the members `attempt`
/// (integer), `outcome` and `reason` (strings) and `at` (microseconds since the epoch), in any
/// order and spacing; other members are skipped. Throws `StoreError` for anything else.
class HistoryParser {
 public:
  /// Parses `json`; empty text is an empty history.
  [[nodiscard]] static std::vector<HistoryEntry> parse(std::string_view json) {
    HistoryParser p(json);
    std::vector<HistoryEntry> entries;
    p.space();
    if (p.at_end()) return entries;
    p.expect('[');
    if (p.take(']')) return entries;
    do {
      entries.push_back(p.entry());
    } while (p.take(','));
    p.expect(']');
    return entries;
  }

 private:
  explicit HistoryParser(std::string_view text) : text_(text) {}

  HistoryEntry entry() {
    HistoryEntry e;
    expect('{');
    if (take('}')) return e;
    do {
      space();
      const std::string name = string();
      expect(':');
      space();
      if (name == "attempt") {
        e.attempt = integer();
      } else if (name == "at") {
        e.at = from_micros(integer());
      } else if (name == "outcome") {
        e.outcome = string();
      } else if (name == "reason") {
        e.reason = peek() == 'n' ? (word("null"), std::string()) : string();
      } else {
        skip_value();
      }
    } while (take(','));
    expect('}');
    return e;
  }

  void skip_value() {
    space();
    const char c = peek();
    if (c == '"') {
      (void)string();
    } else if (c == 'n') {
      word("null");
    } else if (c == 't') {
      word("true");
    } else if (c == 'f') {
      word("false");
    } else {
      (void)integer();
    }
  }

  std::int64_t integer() {
    space();
    bool negative = take('-');
    std::int64_t value = 0;
    const std::size_t start = at_;
    while (at_ < text_.size() && text_[at_] >= '0' && text_[at_] <= '9')
      value = value * 10 + (text_[at_++] - '0');
    if (at_ == start) fail("a number is expected");
    // A number stored as a float (1.0e6): its integral part is kept.
    while (at_ < text_.size() && std::strchr(".eE+-0123456789", text_[at_]) != nullptr) ++at_;
    return negative ? -value : value;
  }

  std::string string() {
    space();
    std::string out;
    // The store wrote it: bytes that are not UTF-8 (an exception's message) pass through.
    const std::string_view wrong = json::read_string(text_, at_, out, json::RawBytes::any);
    if (!wrong.empty()) fail(wrong);
    return out;
  }

  void word(std::string_view w) {
    if (text_.substr(at_, w.size()) != w) fail("'" + std::string(w) + "' is expected");
    at_ += w.size();
  }
  void space() { json::skip_space(text_, at_); }
  bool at_end() const { return at_ >= text_.size(); }
  char peek() {
    space();
    return at_ < text_.size() ? text_[at_] : '\0';
  }
  bool take(char c) {
    if (peek() != c) return false;
    ++at_;
    return true;
  }
  void expect(char c) {
    if (!take(c)) fail("'" + std::string(1, c) + "' is expected");
  }
  [[noreturn]] void fail(std::string_view what) const {
    throw StoreError("idemgate: a row's history is not the JSON the store writes (" +
                     std::string(what) + " at offset " + std::to_string(at_) +
                     "); was the history column written by another program?");
  }

  std::string_view text_;
  std::size_t at_ = 0;
};

/// The `Record` in a row selected with `record_select_list`.
template <log_row Row>
[[nodiscard]] Record to_record(const Row& row) {
  const auto at = [](LogColumn column) { return static_cast<int>(column); };
  Record record;
  record.key = key_from(row.bytes(at(LogColumn::key)));
  record.status = parse_record_status(row.text(at(LogColumn::status)));
  record.fence = row.int64(at(LogColumn::fence));
  record.request = row.bytes(at(LogColumn::request));
  const std::string fingerprint = row.bytes(at(LogColumn::fingerprint));
  if (fingerprint.size() == record.fingerprint.size())
    std::memcpy(record.fingerprint.data(), fingerprint.data(), fingerprint.size());
  if (!row.is_null(at(LogColumn::result))) record.result = row.bytes(at(LogColumn::result));
  record.reason = row.text(at(LogColumn::reason));
  record.duplicates = row.int64(at(LogColumn::duplicates));
  record.created_at = from_micros(row.int64(at(LogColumn::created_at)));
  record.updated_at = from_micros(row.int64(at(LogColumn::updated_at)));
  record.lease_until = from_micros(row.int64(at(LogColumn::lease_until)));
  record.attempts = row.int64(at(LogColumn::attempts));
  record.gate = row.text(at(LogColumn::gate));
  if (!row.is_null(at(LogColumn::label))) record.label = row.text(at(LogColumn::label));
  if (!row.is_null(at(LogColumn::history)))
    record.history = HistoryParser::parse(row.text(at(LogColumn::history)));
  return record;
}

/// The signals row both stores select, in this order: first reservations in the window,
/// duplicates in the window, rows in flight, the oldest in-flight row (NULL when none; its form
/// is the store's own, turned into an age by `oldest_age`), escalated rows, mismatched keys in
/// the window, every mismatch, in-flight rows being retried.
template <log_row Row, class Age>
[[nodiscard]] StoreSignals signals_from(const Row& row, std::chrono::seconds window,
                                        Age oldest_age) {
  StoreSignals s;
  s.window = window;
  s.duplicates = row.int64(1);
  s.events = row.int64(0) + s.duplicates;
  s.in_flight = row.int64(2);
  if (!row.is_null(3)) s.oldest_in_flight = oldest_age(row.int64(3));
  s.escalated = row.int64(4);
  s.mismatched_keys = row.int64(5);
  s.mismatches_total = row.int64(6);
  s.retrying = row.int64(7);
  return s;
}

/// Whether `part` is a plain SQL identifier: 1 to `longest` letters, digits and underscores,
/// not starting with a digit.
[[nodiscard]] inline bool is_identifier(std::string_view part, std::size_t longest) {
  if (part.empty() || part.size() > longest) return false;
  const auto first = static_cast<unsigned char>(part.front());
  if (!(std::isalpha(first) || first == '_')) return false;
  for (char c : part) {
    const auto u = static_cast<unsigned char>(c);
    if (!(std::isalnum(u) || u == '_')) return false;
  }
  return true;
}

}  // namespace idemgate::detail
