// SPDX-License-Identifier: MIT
// The operator command's words for durations, instants, bytes and tables.
#pragma once

#include <idemgate/key.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace idemgate::tool {

/// A command line the operator got wrong: exit status 2, with a message saying what to write.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

using Clock = std::chrono::system_clock;

/// Parses a duration such as `90s`, `15m`, `2h`, `7d`, `2w` or `1h30m` (units s, m, h, d, w).
[[nodiscard]] inline std::chrono::seconds parse_duration(std::string_view text) {
  const auto bad = [&] {
    return UsageError("\"" + std::string(text) +
                      "\" is not a duration: write a number and a unit, such as 90s, 15m, 2h, "
                      "7d, 2w or 1h30m");
  };
  if (text.empty()) throw bad();
  std::int64_t total = 0;
  std::size_t i = 0;
  while (i < text.size()) {
    std::int64_t n = 0;
    const std::size_t start = i;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') {
      if (n > 1'000'000'000) throw bad();
      n = n * 10 + (text[i++] - '0');
    }
    if (i == start || i == text.size()) throw bad();
    std::int64_t unit = 0;
    switch (text[i++]) {
      case 's':
        unit = 1;
        break;
      case 'm':
        unit = 60;
        break;
      case 'h':
        unit = 3600;
        break;
      case 'd':
        unit = 86400;
        break;
      case 'w':
        unit = 7 * 86400;
        break;
      default:
        throw bad();
    }
    total += n * unit;
  }
  return std::chrono::seconds(total);
}

/// Parses an instant in ISO 8601 UTC: `2026-06-09`, `2026-06-09T14:30`, `2026-06-09T14:30:05Z`
/// (seconds may carry a fraction; `Z` or `+00:00` may end it, and a space may stand for `T`).
[[nodiscard]] inline Clock::time_point parse_time(std::string_view text) {
  const auto bad = [&] {
    return UsageError("\"" + std::string(text) +
                      "\" is not an ISO 8601 UTC time: write it as 2026-06-09T14:30:00Z (or "
                      "2026-06-09, or 2026-06-09T14:30)");
  };
  std::string t(text);
  if (t.ends_with("Z") || t.ends_with("z")) t.pop_back();
  if (t.ends_with("+00:00")) t.resize(t.size() - 6);
  int year = 0, month = 0, day = 0, hour = 0, minute = 0;
  double second = 0;
  int used = 0;
  if (std::sscanf(t.c_str(), "%4d-%2d-%2d%n", &year, &month, &day, &used) != 3 || used != 10)
    throw bad();
  if (t.size() > 10) {
    if (t[10] != 'T' && t[10] != 't' && t[10] != ' ') throw bad();
    int more = 0;
    if (std::sscanf(t.c_str() + 11, "%2d:%2d%n", &hour, &minute, &more) != 2 || more != 5)
      throw bad();
    if (t.size() > 16) {
      if (t[16] != ':') throw bad();
      char* end = nullptr;
      second = std::strtod(t.c_str() + 17, &end);
      if (end != t.c_str() + t.size() || t.size() < 19) throw bad();
    }
  }
  if (month < 1 || month > 12 || day < 1 || day > 31 || hour > 23 || minute > 59 || second < 0 ||
      second >= 61)
    throw bad();
  std::tm tm{};
  tm.tm_year = year - 1900;
  tm.tm_mon = month - 1;
  tm.tm_mday = day;
  tm.tm_hour = hour;
  tm.tm_min = minute;
  const std::time_t whole = timegm(&tm);
  return Clock::from_time_t(whole) +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(second));
}

/// An instant given either as ISO 8601 UTC or as a duration ago (`2h` means two hours ago).
[[nodiscard]] inline Clock::time_point parse_instant(std::string_view text, Clock::time_point now) {
  if (!text.empty() && text.find('-') == std::string_view::npos) return now - parse_duration(text);
  return parse_time(text);
}

/// An instant in ISO 8601 UTC, to the second: `2026-06-09T14:30:05Z`.
[[nodiscard]] inline std::string format_time(Clock::time_point at) {
  const std::time_t t = Clock::to_time_t(std::chrono::floor<std::chrono::seconds>(at));
  std::tm tm{};
  gmtime_r(&t, &tm);
  char out[32];
  std::strftime(out, sizeof out, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return out;
}

/// A duration as people read it: `45s`, `12m`, `3h05m`, `4d02h`.
[[nodiscard]] inline std::string format_age(std::chrono::seconds age) {
  const std::int64_t s = std::max<std::int64_t>(0, age.count());
  char out[48];
  if (s < 60)
    std::snprintf(out, sizeof out, "%llds", static_cast<long long>(s));
  else if (s < 3600)
    std::snprintf(out, sizeof out, "%lldm", static_cast<long long>(s / 60));
  else if (s < 86400)
    std::snprintf(out, sizeof out, "%lldh%02lldm", static_cast<long long>(s / 3600),
                  static_cast<long long>(s % 3600 / 60));
  else
    std::snprintf(out, sizeof out, "%lldd%02lldh", static_cast<long long>(s / 86400),
                  static_cast<long long>(s % 86400 / 3600));
  return out;
}

/// How far `at` lies before `now`, as `format_age` writes it.
[[nodiscard]] inline std::string age_of(Clock::time_point at, Clock::time_point now) {
  return format_age(std::chrono::duration_cast<std::chrono::seconds>(now - at));
}

/// Whether `bytes` is UTF-8 text without control characters other than tab and newlines.
[[nodiscard]] inline bool is_text(std::string_view bytes) {
  std::size_t i = 0;
  while (i < bytes.size()) {
    const auto c = static_cast<unsigned char>(bytes[i]);
    if (c < 0x80) {
      if (c == 0x7f || (c < 0x20 && c != '\t' && c != '\n' && c != '\r')) return false;
      ++i;
      continue;
    }
    std::size_t extra = 0;
    if ((c & 0xe0) == 0xc0 && c >= 0xc2)
      extra = 1;
    else if ((c & 0xf0) == 0xe0)
      extra = 2;
    else if ((c & 0xf8) == 0xf0 && c <= 0xf4)
      extra = 3;
    else
      return false;
    if (i + extra >= bytes.size()) return false;
    for (std::size_t k = 1; k <= extra; ++k)
      if ((static_cast<unsigned char>(bytes[i + k]) & 0xc0) != 0x80) return false;
    i += extra + 1;
  }
  return true;
}

/// Bytes in lowercase hex.
[[nodiscard]] inline std::string to_hex(std::string_view bytes) {
  std::string out;
  detail::append_hex(out, bytes);
  return out;
}

/// Stored bytes (a request, an outcome) as they are best read: `json` when they parse as a JSON
/// object or array, `text` when they are UTF-8 text, `hex` otherwise.
struct Readable {
  /// `json`, `text` or `hex`.
  std::string encoding;
  /// The JSON value (json), the text (text) or the hex digits (hex).
  nlohmann::json value;
};

/// Reads stored bytes as `Readable` says.
[[nodiscard]] inline Readable readable(std::string_view bytes) {
  if (!bytes.empty() && (bytes.front() == '{' || bytes.front() == '[')) {
    auto parsed = nlohmann::json::parse(bytes, nullptr, false);
    if (!parsed.is_discarded()) return {"json", std::move(parsed)};
  }
  if (is_text(bytes)) return {"text", std::string(bytes)};
  return {"hex", to_hex(bytes)};
}

/// The readable form as a JSON object: `{"encoding": ..., "value": ...}`.
[[nodiscard]] inline nlohmann::json readable_json(std::string_view bytes) {
  auto r = readable(bytes);
  return {{"encoding", r.encoding}, {"value", std::move(r.value)}};
}

/// The readable form for a person: indented JSON, the text, or hex in rows of 32 bytes.
[[nodiscard]] inline std::string readable_text(std::string_view bytes) {
  const auto r = readable(bytes);
  if (r.encoding == "json") return r.value.dump(2);
  if (r.encoding == "text") return r.value.get<std::string>();
  const auto hex = r.value.get<std::string>();
  std::string out = "(" + std::to_string(bytes.size()) + " bytes, hex)";
  for (std::size_t i = 0; i < hex.size(); i += 64) out += "\n" + hex.substr(i, 64);
  return out;
}

/// A table for people: a header row and left-aligned columns two spaces apart. Cells longer than
/// a column's limit are cut with `...`.
class Table {
 public:
  /// A table with these column headers.
  explicit Table(std::vector<std::string> headers) : headers_(std::move(headers)) {}

  /// Appends a row (one cell per header).
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  /// Whether no row was added.
  [[nodiscard]] bool empty() const noexcept { return rows_.empty(); }

  /// Prints the table to `out`.
  void print(std::FILE* out, std::size_t widest = 60) const {
    std::vector<std::size_t> width(headers_.size());
    for (std::size_t c = 0; c < headers_.size(); ++c) width[c] = headers_[c].size();
    for (const auto& row : rows_)
      for (std::size_t c = 0; c < row.size() && c < width.size(); ++c)
        width[c] = std::max(width[c], std::min(widest, display_width(row[c])));
    print_row(out, headers_, width, widest);
    for (const auto& row : rows_) print_row(out, row, width, widest);
  }

 private:
  static std::size_t display_width(const std::string& s) {
    std::size_t n = 0;
    for (unsigned char c : s) n += (c & 0xc0) != 0x80;
    return n;
  }
  static std::string cut(const std::string& s, std::size_t widest) {
    std::string flat = s;
    std::replace(flat.begin(), flat.end(), '\n', ' ');
    if (display_width(flat) <= widest) return flat;
    std::string out;
    std::size_t n = 0;
    for (unsigned char c : flat) {
      if ((c & 0xc0) != 0x80 && ++n > widest - 3) break;
      out += static_cast<char>(c);
    }
    return out + "...";
  }
  static void print_row(std::FILE* out, const std::vector<std::string>& row,
                        const std::vector<std::size_t>& width, std::size_t widest) {
    std::string line;
    for (std::size_t c = 0; c < width.size(); ++c) {
      const std::string cell = c < row.size() ? cut(row[c], widest) : "";
      line += cell;
      if (c + 1 < width.size()) line += std::string(width[c] - display_width(cell) + 2, ' ');
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    std::fprintf(out, "%s\n", line.c_str());
  }

  std::vector<std::string> headers_;
  std::vector<std::vector<std::string>> rows_;
};

}  // namespace idemgate::tool
