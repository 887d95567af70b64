#pragma once

// Runs a helper binary as a child process and reads what it announces on stdout, and runs a
// piece of the test itself in several forked processes at once.

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

namespace idemgate::test {

class ChildProcess {
 public:
  explicit ChildProcess(const std::vector<std::string>& argv) {
    int fds[2];
    if (pipe(fds) != 0) throw std::runtime_error("pipe failed");
    pid_ = fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      dup2(fds[1], STDOUT_FILENO);
      close(fds[0]);
      close(fds[1]);
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
    close(fds[1]);
    out_ = fdopen(fds[0], "r");
  }
  ~ChildProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (out_ != nullptr) fclose(out_);
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  /// The next line the child printed, without its newline; empty at end of output.
  std::string read_line() {
    std::string line;
    for (int c; (c = fgetc(out_)) != EOF && c != '\n';) line += static_cast<char>(c);
    return line;
  }

  /// Reads the next line into `line`; false at the end of the output.
  bool read_until_eof(std::string& line) {
    line.clear();
    int c = 0;
    while ((c = fgetc(out_)) != EOF && c != '\n') line += static_cast<char>(c);
    return c != EOF || !line.empty();
  }

  /// Kills the child with SIGKILL and returns once it is gone.
  void kill_now() {
    kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
  }

  /// Sends `signal` to the child (SIGTERM, as a deployment stops a consumer).
  void send(int signal) { kill(pid_, signal); }

  /// Waits for the child to exit; its exit code, or -1 if it died by a signal.
  int wait() {
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

 private:
  pid_t pid_ = -1;
  FILE* out_ = nullptr;
};

/// Exit code of a child of `run_in_children` whose body threw.
inline constexpr int child_threw = 100;

/// Runs `body(c)` for c in 0..n-1, each in its own forked process, all at once; returns their
/// exit codes in order: what `body` returned, or `child_threw`. A child opens its own stores and
/// connections inside `body`: none crosses the fork. Throws when a fork fails or a child dies by
/// a signal.
template <class Body>
std::vector<int> run_in_children(int n, Body body) {
  std::vector<pid_t> pids;
  for (int c = 0; c < n; ++c) {
    const pid_t pid = fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
      int code = child_threw;
      try {
        code = body(c);
      } catch (...) {
      }
      _exit(code);
    }
    pids.push_back(pid);
  }
  std::vector<int> codes;
  bool all_exited = true;
  for (const pid_t pid : pids) {
    int status = 0;
    const bool exited = waitpid(pid, &status, 0) == pid && WIFEXITED(status);
    all_exited = all_exited && exited;
    codes.push_back(exited ? WEXITSTATUS(status) : -1);
  }
  if (!all_exited) throw std::runtime_error("a child process died without exiting");
  return codes;
}

}  // namespace idemgate::test
