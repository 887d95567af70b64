#pragma once

// A child process whose stdout is read line by line on a thread of its own, each line kept with
// the time it arrived; the RabbitMQ consumer's tests and the chaos run watch the consumers
// through it and deliver signals to them.

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <functional>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace idemgate::test {

class LineProcess {
 public:
  using Clock = std::chrono::system_clock;
  /// One line of stdout and when it was read.
  struct Line {
    std::string text;
    Clock::time_point at;
  };

  /// Starts `argv[0]` with `argv`; its stderr goes to `stderr_path` (appended) when given, else
  /// to this process's stderr.
  explicit LineProcess(const std::vector<std::string>& argv, const std::string& stderr_path = {}) {
    int fds[2];
    if (pipe(fds) != 0) throw std::runtime_error("pipe failed");
    pid_ = fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      dup2(fds[1], STDOUT_FILENO);
      close(fds[0]);
      close(fds[1]);
      if (!stderr_path.empty()) {
        const int err = open(stderr_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (err >= 0) dup2(err, STDERR_FILENO);
      }
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
    close(fds[1]);
    reader_ = std::thread([this, fd = fds[0]] { read_lines(fd); });
  }
  ~LineProcess() {
    if (pid_ > 0) kill_now();
    if (reader_.joinable()) reader_.join();
  }
  LineProcess(const LineProcess&) = delete;
  LineProcess& operator=(const LineProcess&) = delete;

  /// The process id; -1 once it has been waited for.
  [[nodiscard]] pid_t pid() const { return pid_; }

  /// Every line so far.
  [[nodiscard]] std::vector<Line> lines() const {
    std::lock_guard lock(mutex_);
    return lines_;
  }

  /// Waits until a line from index `from` on satisfies `match`; its index, or none after
  /// `timeout` or at the end of the output.
  std::optional<std::size_t> wait_for(const std::function<bool(const std::string&)>& match,
                                      std::chrono::milliseconds timeout, std::size_t from = 0) {
    std::unique_lock lock(mutex_);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::size_t at = from;
    for (;;) {
      for (; at < lines_.size(); ++at)
        if (match(lines_[at].text)) return at;
      if (eof_) return std::nullopt;
      if (changed_.wait_until(lock, deadline) == std::cv_status::timeout) return std::nullopt;
    }
  }
  /// Waits for a line equal to `text`.
  bool wait_for_line(const std::string& text, std::chrono::milliseconds timeout) {
    return wait_for([&](const std::string& line) { return line == text; }, timeout).has_value();
  }

  /// Sends `signal`.
  void signal(int signal) {
    if (pid_ > 0) ::kill(pid_, signal);
  }
  /// SIGKILL, and waits for the process to be gone.
  void kill_now() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
    exit_code_ = -1;
  }
  /// Waits up to `timeout` for the process to exit; its exit code, -1 when a signal ended it,
  /// none when it still runs.
  std::optional<int> wait_exit(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      if (pid_ <= 0) return exit_code_;
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        return exit_code_;
      }
      if (std::chrono::steady_clock::now() > deadline) return std::nullopt;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

 private:
  void read_lines(int fd) {
    FILE* in = fdopen(fd, "r");
    std::string line;
    for (int c; (c = fgetc(in)) != EOF;) {
      if (c != '\n') {
        line += static_cast<char>(c);
        continue;
      }
      std::lock_guard lock(mutex_);
      lines_.push_back({std::move(line), Clock::now()});
      line.clear();
      changed_.notify_all();
    }
    fclose(in);
    std::lock_guard lock(mutex_);
    eof_ = true;
    changed_.notify_all();
  }

  pid_t pid_ = -1;
  std::optional<int> exit_code_;
  std::thread reader_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<Line> lines_;
  bool eof_ = false;
};

}  // namespace idemgate::test
