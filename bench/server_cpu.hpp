#pragma once

// The CPU time a PostgreSQL server spent, read from /proc on the same machine: what
// server_work and steady_state report per event.

#include <dirent.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

namespace idemgate::bench {

// CPU time of one process in microseconds: its own (the scheduler's count, in nanoseconds,
// where the kernel keeps it) and, with `children`, that of its exited children it waited for
// (clock ticks).
inline double process_cpu_us(long pid, bool children) {
  if (!children) {
    std::ifstream schedstat("/proc/" + std::to_string(pid) + "/schedstat");
    double on_cpu_ns = 0;
    if (schedstat >> on_cpu_ns && on_cpu_ns > 0) return on_cpu_ns / 1000.0;
  }
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto close = text.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream fields(text.substr(close + 2));
  std::vector<std::string> f;
  for (std::string s; fields >> s;) f.push_back(s);
  // After the name: state(0) ppid(1) ... utime(11) stime(12) cutime(13) cstime(14).
  if (f.size() < 15) return 0;
  double ticks = std::stod(f[11]) + std::stod(f[12]);
  if (children) ticks += std::stod(f[13]) + std::stod(f[14]);
  return ticks * 1e6 / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

inline long parent_of(long pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto close = text.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream fields(text.substr(close + 2));
  std::string state;
  long ppid = 0;
  fields >> state >> ppid;
  return ppid;
}

// Every server process's CPU so far: the postmaster with its reaped children, and the live ones.
inline double server_cpu_us(long postmaster) {
  double total = process_cpu_us(postmaster, true);
  if (DIR* dir = ::opendir("/proc")) {
    while (const dirent* entry = ::readdir(dir)) {
      char* end = nullptr;
      const long pid = std::strtol(entry->d_name, &end, 10);
      if (*end != '\0' || pid <= 0) continue;
      if (parent_of(pid) == postmaster) total += process_cpu_us(pid, false);
    }
    ::closedir(dir);
  }
  return total;
}

}  // namespace idemgate::bench
