#pragma once

/// The examples' JSON: nlohmann-json, read strictly.
///
/// Webhook bodies and API answers come from outside, so `parse` adds two refusals to
/// nlohmann-json's own: an object that names a member twice (nlohmann-json would keep the last
/// one silently, while another parser may keep the first, so the signed body could mean two
/// things), and nesting deeper than `max_depth`. Whatever is refused is answered `malformed`.
/// Write JSON with `nlohmann::json` itself: `Json{{"slot", id}}.dump()`.

#include <nlohmann/json.hpp>

#include <cstdint>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace example::json {

/// A JSON value (nlohmann-json).
using Json = nlohmann::json;

/// How deeply objects and arrays may nest in a parsed document.
inline constexpr int max_depth = 16;

/// The JSON value in `text`; nullopt when it is not JSON, nests deeper than `max_depth`, or an
/// object in it names a member twice.
[[nodiscard]] inline std::optional<Json> parse(std::string_view text) {
  std::vector<std::set<std::string>> names;  // the member names of each open object
  bool refused = false;
  const auto check = [&](int depth, Json::parse_event_t event, Json& parsed) {
    if (depth > max_depth) refused = true;
    if (event == Json::parse_event_t::object_start) names.emplace_back();
    if (event == Json::parse_event_t::object_end && !names.empty()) names.pop_back();
    if (event == Json::parse_event_t::key && !names.empty() &&
        !names.back().insert(parsed.get<std::string>()).second)
      refused = true;
    return true;
  };
  Json document = Json::parse(text.begin(), text.end(), check, /*allow_exceptions=*/false);
  if (refused || document.is_discarded()) return std::nullopt;
  return document;
}

/// The string member `name` of `object`; nullopt when `object` is not an object or the member is
/// absent or not a string.
[[nodiscard]] inline std::optional<std::string> string_member(const Json& object,
                                                              std::string_view name) {
  if (!object.is_object()) return std::nullopt;
  const auto it = object.find(name);
  if (it == object.end() || !it->is_string()) return std::nullopt;
  return it->get<std::string>();
}

/// The integer member `name` of `object`; nullopt when absent, not a whole number as written
/// (`5.0` is not), or outside the 64-bit signed range.
[[nodiscard]] inline std::optional<std::int64_t> integer_member(const Json& object,
                                                                std::string_view name) {
  if (!object.is_object()) return std::nullopt;
  const auto it = object.find(name);
  if (it == object.end()) return std::nullopt;
  if (it->is_number_unsigned()) {
    const auto value = it->get<std::uint64_t>();
    if (value > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
      return std::nullopt;
    return static_cast<std::int64_t>(value);
  }
  if (!it->is_number_integer()) return std::nullopt;
  return it->get<std::int64_t>();
}

}  // namespace example::json
