#pragma once

// The lines a store wrote to its log (PostgresOptions::log), kept for a test to read.

#include <cstddef>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace idemgate::test {

/// Log lines the store wrote, kept for the test to read.
struct LogLines {
  std::mutex mutex;
  std::vector<std::string> lines;

  /// A log function that keeps each line here.
  std::function<void(std::string_view)> sink() {
    return [this](std::string_view line) {
      std::lock_guard lock(mutex);
      lines.emplace_back(line);
    };
  }

  /// How many lines contain `text`.
  std::size_t count(const std::string& text) {
    std::lock_guard lock(mutex);
    std::size_t n = 0;
    for (const std::string& line : lines) n += line.find(text) != std::string::npos ? 1 : 0;
    return n;
  }

  /// Every line, one per line of the result.
  std::string all() {
    std::lock_guard lock(mutex);
    std::string text;
    for (const std::string& line : lines) text += line + "\n";
    return text;
  }
};

}  // namespace idemgate::test
