#pragma once

/// Just enough JSON for the examples' webhooks, terminal API and answers.
///
/// Deliberately minimal: `parse` reads one JSON value into a small tree (objects, arrays,
/// strings with every escape, numbers kept as text, true, false, null), with a depth limit and no
/// duplicate member names. Whatever it cannot read is refused, and the server answers
/// `malformed`: it never guesses. Use a full JSON library for anything bigger.

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace example::json {

/// One JSON value.
struct Value {
  /// What the value is.
  enum class Kind { null, boolean, number, string, array, object };

  /// What the value is.
  Kind kind = Kind::null;
  /// The string (unescaped), or the number's text as written.
  std::string text;
  /// The boolean.
  bool flag = false;
  /// The array's items.
  std::vector<Value> items;
  /// The object's members, in order.
  std::vector<std::pair<std::string, Value>> members;

  /// The member `name` of an object; nullptr when absent or when this is not an object.
  [[nodiscard]] const Value* find(std::string_view name) const {
    if (kind != Kind::object) return nullptr;
    for (const auto& [member, value] : members)
      if (member == name) return &value;
    return nullptr;
  }

  /// The string member `name`; nullopt when absent or not a string.
  [[nodiscard]] std::optional<std::string> string(std::string_view name) const {
    const Value* value = find(name);
    if (value == nullptr || value->kind != Kind::string) return std::nullopt;
    return value->text;
  }

  /// The integer member `name`; nullopt when absent, not a number, or not a 64-bit integer.
  [[nodiscard]] std::optional<std::int64_t> integer(std::string_view name) const {
    const Value* value = find(name);
    if (value == nullptr || value->kind != Kind::number) return std::nullopt;
    std::int64_t out = 0;
    const char* end = value->text.data() + value->text.size();
    const auto [stop, error] = std::from_chars(value->text.data(), end, out);
    if (error != std::errc() || stop != end) return std::nullopt;
    return out;
  }
};

namespace detail {

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  std::optional<Value> document() {
    Value value;
    if (!parse_value(value, 0)) return std::nullopt;
    skip_space();
    if (at_ != text_.size()) return std::nullopt;
    return value;
  }

 private:
  static constexpr int max_depth = 16;

  void skip_space() {
    while (at_ < text_.size() &&
           (text_[at_] == ' ' || text_[at_] == '\t' || text_[at_] == '\n' || text_[at_] == '\r'))
      ++at_;
  }

  bool consume(char c) {
    skip_space();
    if (at_ < text_.size() && text_[at_] == c) {
      ++at_;
      return true;
    }
    return false;
  }

  bool literal(std::string_view word) {
    if (text_.substr(at_, word.size()) != word) return false;
    at_ += word.size();
    return true;
  }

  bool parse_value(Value& out, int depth) {
    if (depth > max_depth) return false;
    skip_space();
    if (at_ >= text_.size()) return false;
    switch (text_[at_]) {
      case '{':
        out.kind = Value::Kind::object;
        return parse_object(out, depth);
      case '[':
        out.kind = Value::Kind::array;
        return parse_array(out, depth);
      case '"':
        out.kind = Value::Kind::string;
        return parse_string(out.text);
      case 't':
        out.kind = Value::Kind::boolean;
        out.flag = true;
        return literal("true");
      case 'f':
        out.kind = Value::Kind::boolean;
        return literal("false");
      case 'n':
        return literal("null");
      default:
        out.kind = Value::Kind::number;
        return parse_number(out.text);
    }
  }

  bool parse_object(Value& out, int depth) {
    ++at_;
    if (consume('}')) return true;
    do {
      skip_space();
      std::string name;
      if (at_ >= text_.size() || text_[at_] != '"' || !parse_string(name)) return false;
      // Two members of one name could be read differently by two parsers: refuse them.
      if (out.find(name) != nullptr) return false;
      if (!consume(':')) return false;
      Value value;
      if (!parse_value(value, depth + 1)) return false;
      out.members.emplace_back(std::move(name), std::move(value));
    } while (consume(','));
    return consume('}');
  }

  bool parse_array(Value& out, int depth) {
    ++at_;
    if (consume(']')) return true;
    do {
      Value item;
      if (!parse_value(item, depth + 1)) return false;
      out.items.push_back(std::move(item));
    } while (consume(','));
    return consume(']');
  }

  bool digits() {
    const std::size_t start = at_;
    while (at_ < text_.size() && text_[at_] >= '0' && text_[at_] <= '9') ++at_;
    return at_ > start;
  }

  bool parse_number(std::string& out) {
    const std::size_t start = at_;
    if (at_ < text_.size() && text_[at_] == '-') ++at_;
    if (at_ < text_.size() && text_[at_] == '0') {
      ++at_;
    } else if (!digits()) {
      return false;
    }
    if (at_ < text_.size() && text_[at_] == '.' && (++at_, !digits())) return false;
    if (at_ < text_.size() && (text_[at_] == 'e' || text_[at_] == 'E')) {
      ++at_;
      if (at_ < text_.size() && (text_[at_] == '+' || text_[at_] == '-')) ++at_;
      if (!digits()) return false;
    }
    out.assign(text_.substr(start, at_ - start));
    return true;
  }

  bool hex4(std::uint32_t& out) {
    if (at_ + 4 > text_.size()) return false;
    out = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = text_[at_++];
      std::uint32_t digit = 0;
      if (c >= '0' && c <= '9')
        digit = static_cast<std::uint32_t>(c - '0');
      else if (c >= 'a' && c <= 'f')
        digit = static_cast<std::uint32_t>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F')
        digit = static_cast<std::uint32_t>(c - 'A' + 10);
      else
        return false;
      out = out * 16 + digit;
    }
    return true;
  }

  static void append_utf8(std::string& out, std::uint32_t code) {
    if (code < 0x80) {
      out += static_cast<char>(code);
    } else if (code < 0x800) {
      out += static_cast<char>(0xc0 | (code >> 6));
      out += static_cast<char>(0x80 | (code & 0x3f));
    } else if (code < 0x10000) {
      out += static_cast<char>(0xe0 | (code >> 12));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (code & 0x3f));
    } else {
      out += static_cast<char>(0xf0 | (code >> 18));
      out += static_cast<char>(0x80 | ((code >> 12) & 0x3f));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (code & 0x3f));
    }
  }

  bool parse_escape(std::string& out) {
    if (at_ >= text_.size()) return false;
    const char c = text_[at_++];
    switch (c) {
      case '"':
      case '\\':
      case '/':
        out += c;
        return true;
      case 'b':
        out += '\b';
        return true;
      case 'f':
        out += '\f';
        return true;
      case 'n':
        out += '\n';
        return true;
      case 'r':
        out += '\r';
        return true;
      case 't':
        out += '\t';
        return true;
      case 'u':
        break;
      default:
        return false;
    }
    std::uint32_t code = 0;
    if (!hex4(code)) return false;
    if (code >= 0xdc00 && code <= 0xdfff) return false;  // a low surrogate alone
    if (code >= 0xd800 && code <= 0xdbff) {
      std::uint32_t low = 0;
      if (!literal("\\u") || !hex4(low) || low < 0xdc00 || low > 0xdfff) return false;
      code = 0x10000 + ((code - 0xd800) << 10) + (low - 0xdc00);
    }
    append_utf8(out, code);
    return true;
  }

  bool parse_string(std::string& out) {
    ++at_;
    while (at_ < text_.size()) {
      const char c = text_[at_++];
      if (c == '"') return true;
      if (static_cast<unsigned char>(c) < 0x20) return false;
      if (c != '\\') {
        out += c;
      } else if (!parse_escape(out)) {
        return false;
      }
    }
    return false;
  }

  std::string_view text_;
  std::size_t at_ = 0;
};

}  // namespace detail

/// The JSON value in `text`; nullopt when it is not (minimal) JSON or nests deeper than 16.
[[nodiscard]] inline std::optional<Value> parse(std::string_view text) {
  return detail::Parser(text).document();
}

/// `text` as a JSON string literal, quotes included.
[[nodiscard]] inline std::string quote(std::string_view text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04x", static_cast<unsigned>(c));
      out += escaped;
    } else {
      out += c;
    }
  }
  return out + '"';
}

/// The string member `name` of the JSON object in `text`; nullopt when `text` is not an object
/// or the member is absent or not a string.
[[nodiscard]] inline std::optional<std::string> string_field(std::string_view text,
                                                             std::string_view name) {
  const std::optional<Value> value = parse(text);
  if (!value) return std::nullopt;
  return value->string(name);
}

}  // namespace example::json
