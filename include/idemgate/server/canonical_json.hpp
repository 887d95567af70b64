// SPDX-License-Identifier: MIT
// A JSON text's canonical form: what a request means, not how it was serialised.
#pragma once

#include "../detail/json_string.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace idemgate::server {

/// What `canonical_json` made of a text: the canonical form, or why there is none.
struct CanonicalJson {
  /// True when the text is one JSON value (RFC 8259) without duplicate member names.
  bool ok = false;
  /// The canonical form (when `ok`).
  std::string text;
  /// What is wrong with the text, for a problem's `detail` (when not `ok`).
  std::string error;
};

namespace detail {

/// Parses one JSON text and writes its canonical form (see `canonical_json`).
class JsonCanonicalizer {
 public:
  /// A canonicalizer of `in`, which must outlive it.
  explicit JsonCanonicalizer(std::string_view in) : in_(in) {}

  /// The canonical form of the whole text, or why there is none.
  CanonicalJson run() {
    CanonicalJson out;
    skip_space();
    if (!value(out.text, 0)) return fail_with(std::move(out));
    skip_space();
    if (at_ < in_.size()) {
      error_ = "text after the JSON value at byte " + std::to_string(at_);
      return fail_with(std::move(out));
    }
    out.ok = true;
    return out;
  }

 private:
  static constexpr int max_depth = 128;

  CanonicalJson fail_with(CanonicalJson out) const {
    out.ok = false;
    out.text.clear();
    out.error = error_;
    return out;
  }

  bool fail(std::string what) {
    if (error_.empty()) error_ = std::move(what) + " at byte " + std::to_string(at_);
    return false;
  }

  void skip_space() { idemgate::detail::json::skip_space(in_, at_); }

  bool literal(std::string_view word, std::string& out) {
    if (in_.substr(at_, word.size()) != word) return fail("not a JSON value");
    at_ += word.size();
    out += word;
    return true;
  }

  bool value(std::string& out, int depth) {
    if (depth > max_depth) return fail("nested deeper than 128 levels");
    if (at_ >= in_.size()) return fail("a value is missing");
    switch (in_[at_]) {
      case '{':
        return object(out, depth);
      case '[':
        return array(out, depth);
      case '"': {
        std::string decoded;
        if (!string(decoded)) return false;
        write_string(decoded, out);
        return true;
      }
      case 't':
        return literal("true", out);
      case 'f':
        return literal("false", out);
      case 'n':
        return literal("null", out);
      default:
        return number(out);
    }
  }

  bool object(std::string& out, int depth) {
    ++at_;
    std::vector<std::pair<std::string, std::string>> members;
    skip_space();
    if (at_ < in_.size() && in_[at_] == '}') {
      ++at_;
      out += "{}";
      return true;
    }
    for (;;) {
      skip_space();
      if (at_ >= in_.size() || in_[at_] != '"') return fail("a member name is missing");
      std::string name;
      if (!string(name)) return false;
      skip_space();
      if (at_ >= in_.size() || in_[at_] != ':') return fail("':' is missing");
      ++at_;
      skip_space();
      std::string member;
      if (!value(member, depth + 1)) return false;
      members.emplace_back(std::move(name), std::move(member));
      skip_space();
      if (at_ < in_.size() && in_[at_] == ',') {
        ++at_;
        continue;
      }
      if (at_ < in_.size() && in_[at_] == '}') {
        ++at_;
        break;
      }
      return fail("',' or '}' is missing");
    }
    // Member order carries no meaning: sorted by name (UTF-8 bytes, that is code points).
    std::sort(members.begin(), members.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    for (std::size_t i = 1; i < members.size(); ++i) {
      if (members[i].first == members[i - 1].first) {
        error_ = "the member name \"" + members[i].first +
                 "\" appears twice in one object; send it once";
        return false;
      }
    }
    out += '{';
    for (std::size_t i = 0; i < members.size(); ++i) {
      if (i > 0) out += ',';
      write_string(members[i].first, out);
      out += ':';
      out += members[i].second;
    }
    out += '}';
    return true;
  }

  bool array(std::string& out, int depth) {
    ++at_;
    out += '[';
    skip_space();
    if (at_ < in_.size() && in_[at_] == ']') {
      ++at_;
      out += ']';
      return true;
    }
    for (bool first = true;; first = false) {
      if (!first) out += ',';
      skip_space();
      if (!value(out, depth + 1)) return false;
      skip_space();
      if (at_ < in_.size() && in_[at_] == ',') {
        ++at_;
        continue;
      }
      if (at_ < in_.size() && in_[at_] == ']') {
        ++at_;
        out += ']';
        return true;
      }
      return fail("',' or ']' is missing");
    }
  }

  // A number as written (RFC 8259 grammar), without its whitespace: 1.0 and 1 stay apart, as
  // an API may tell them apart.
  bool number(std::string& out) {
    const std::size_t begin = at_;
    const auto digits = [&] {
      const std::size_t from = at_;
      while (at_ < in_.size() && in_[at_] >= '0' && in_[at_] <= '9') ++at_;
      return at_ - from;
    };
    if (at_ < in_.size() && in_[at_] == '-') ++at_;
    if (at_ < in_.size() && in_[at_] == '0') {
      ++at_;
    } else if (digits() == 0) {
      at_ = begin;
      return fail("not a JSON value");
    }
    if (at_ < in_.size() && in_[at_] == '.') {
      ++at_;
      if (digits() == 0) return fail("a digit is missing after '.'");
    }
    if (at_ < in_.size() && (in_[at_] == 'e' || in_[at_] == 'E')) {
      ++at_;
      if (at_ < in_.size() && (in_[at_] == '+' || in_[at_] == '-')) ++at_;
      if (digits() == 0) return fail("a digit is missing in the exponent");
    }
    out += in_.substr(begin, at_ - begin);
    return true;
  }

  // Decodes a string (escapes resolved) into `out`; the canonical form is written from that.
  // Bytes that are not UTF-8 pass through as they are: they still fingerprint the same.
  bool string(std::string& out) {
    const std::string_view wrong =
        idemgate::detail::json::read_string(in_, at_, out, idemgate::detail::json::RawBytes::any);
    return wrong.empty() || fail(std::string(wrong));
  }

  // The shortest escaping: '"', '\\' and control characters only (as RFC 8785 writes strings).
  static void write_string(std::string_view decoded, std::string& out) {
    static constexpr char hex[] = "0123456789abcdef";
    out += '"';
    for (const char ch : decoded) {
      const auto c = static_cast<unsigned char>(ch);
      switch (c) {
        case '"':
          out += "\\\"";
          break;
        case '\\':
          out += "\\\\";
          break;
        case '\b':
          out += "\\b";
          break;
        case '\f':
          out += "\\f";
          break;
        case '\n':
          out += "\\n";
          break;
        case '\r':
          out += "\\r";
          break;
        case '\t':
          out += "\\t";
          break;
        default:
          if (c < 0x20) {
            out += "\\u00";
            out += hex[c >> 4];
            out += hex[c & 0xF];
          } else {
            out += ch;
          }
      }
    }
    out += '"';
  }

  std::string_view in_;
  std::size_t at_ = 0;
  std::string error_;
};

}  // namespace detail

/**
 * The canonical form of a JSON text, for fingerprints that compare meaning: members sorted by
 * name, no insignificant whitespace, strings with escapes resolved and written with the shortest
 * escaping, numbers as written. A duplicate member name, trailing text, or anything that is not
 * JSON gives no form (`ok` false, `error` says why): a request that means two things is refused
 * rather than fingerprinted.
 *
 * Example:
 *   const auto c = idemgate::server::canonical_json(R"({ "b": 1, "a": "\u0041" })");
 *   // c.ok, and c.text == R"({"a":"A","b":1})"
 */
[[nodiscard]] inline CanonicalJson canonical_json(std::string_view text) {
  return detail::JsonCanonicalizer(text).run();
}

}  // namespace idemgate::server
