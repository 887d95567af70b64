// A slow-flush disk for the benchmark's PostgreSQL: loaded into the server with LD_PRELOAD, it
// makes every fsync and fdatasync take IDEMGATE_DISK_FLUSH_MS milliseconds (a decimal number)
// longer than the disk's own flush, the way a flush costs 1-3 ms on a network disk.
//
// PostgreSQL 15 with its default wal_sync_method (fdatasync on Linux) flushes the WAL with
// fdatasync (issue_xlog_fsync), and data files, the control file and directories with fsync
// (pg_fsync), so these two calls are every flush a commit waits for. sync_file_range is not
// delayed: PostgreSQL calls it only to start write-back early (pg_flush_data,
// SYNC_FILE_RANGE_WRITE), never to wait for it. Writes through a file opened with O_DSYNC or
// O_SYNC (wal_sync_method = open_datasync or open_sync, which the benchmark does not use) are not
// delayed either.
//
// The real call runs first (found with dlsym(RTLD_NEXT)); the delay follows it only when it
// succeeded, and errno is what the real call left.

#include <dlfcn.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <ctime>

namespace {

using FlushCall = int (*)(int);

// The delay, read once from the environment; zero when unset or unreadable.
timespec flush_delay() {
  static const timespec delay = [] {
    timespec t{0, 0};
    const char* text = std::getenv("IDEMGATE_DISK_FLUSH_MS");
    if (text == nullptr) return t;
    char* end = nullptr;
    const double ms = std::strtod(text, &end);
    if (end == text || !std::isfinite(ms) || ms <= 0 || ms > 60'000) return t;
    const auto ns = static_cast<long long>(ms * 1e6);
    t.tv_sec = static_cast<time_t>(ns / 1'000'000'000);
    t.tv_nsec = static_cast<long>(ns % 1'000'000'000);
    return t;
  }();
  return delay;
}

// Sleeps for the whole delay, through interruptions by signals.
void wait_flush_delay() {
  timespec remaining = flush_delay();
  if (remaining.tv_sec == 0 && remaining.tv_nsec == 0) return;
  while (nanosleep(&remaining, &remaining) != 0 && errno == EINTR) {
  }
}

FlushCall next_call(const char* name) {
  return reinterpret_cast<FlushCall>(dlsym(RTLD_NEXT, name));
}

int delayed(FlushCall real, int fd) {
  if (real == nullptr) {
    errno = ENOSYS;
    return -1;
  }
  const int result = real(fd);
  if (result == 0) {
    const int saved = errno;
    wait_flush_delay();
    errno = saved;
  }
  return result;
}

}  // namespace

extern "C" {

/// fsync, then the configured delay.
int fsync(int fd) {
  static const FlushCall real = next_call("fsync");
  return delayed(real, fd);
}

/// fdatasync, then the configured delay.
int fdatasync(int fd) {
  static const FlushCall real = next_call("fdatasync");
  return delayed(real, fd);
}

}  // extern "C"
