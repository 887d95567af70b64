#pragma once

// The upgrade race of a log written before gates: after migrate(), two replicas of this version
// (forked processes) serve redeliveries of every event the earlier version wrote while a third
// process adopts the log's rows of no gate, a few at a time. Each replica books an event (its
// business write, in the commit's transaction) only when its reservation says the event is new
// or taken over from a dead worker; what the earlier version finished must never be booked again.

#include <idemgate/detail/crypto/sha256.hpp>
#include <idemgate/key.hpp>
#include <idemgate/record.hpp>

#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <string>
#include <vector>

namespace idemgate::test {

/// Runs `body` in a forked child; its exit status is 0 when `body` returned, 1 when it threw
/// (the exception's message on standard error).
inline pid_t forked(const std::function<void()>& body) {
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  int status = 0;
  try {
    body();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "upgrade race child %d: %s\n", static_cast<int>(::getpid()), e.what());
    status = 1;
  } catch (...) {
    status = 1;
  }
  std::fflush(stderr);
  ::_exit(status);
}

/// Waits for `pid` and returns its exit status (-1 if it did not exit by itself).
inline int exit_status(pid_t pid) {
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

/// One replica of this version serving a redelivery of every event 1..n (in `order`) through the
/// gate's handle `gate`, with the key and fingerprint the released rows gave event i: reserve,
/// and when the event is new or taken over, commit it with `book(tx, key)` as its business write.
template <class Store, class Book>
void serve_redeliveries(Store& gate, const std::vector<int>& order, Key (*key_of)(int),
                        Fingerprint (*fingerprint_of)(int), Book&& book) {
  using namespace std::chrono_literals;
  for (const int i : order) {
    const std::string request = "{\"order\":" + std::to_string(i) + "}";
    const Key key = key_of(i);
    const Reservation r = gate.reserve(key, fingerprint_of(i), request, 30s);
    if (r.kind == Reservation::Kind::existing) continue;
    (void)gate.commit(key, r.fence, "{\"booking\":\"again\"}", [&](auto& tx) { book(tx, key); });
  }
}

/// The order 1..n, and n..1.
inline std::vector<int> upward(int n) {
  std::vector<int> out;
  for (int i = 1; i <= n; ++i) out.push_back(i);
  return out;
}
inline std::vector<int> downward(int n) {
  std::vector<int> out;
  for (int i = n; i >= 1; --i) out.push_back(i);
  return out;
}

/// Checks what the race booked, `bookings_of(i)` being event i's business rows: none for an event
/// the earlier version finished (the released rows' i % 4 != 0), exactly one for each event whose
/// worker died in flight (i % 4 == 0).
template <class Count>
void expect_finished_events_never_booked_again(int events, Count&& bookings_of) {
  int booked_again = 0, dead_booked = 0;
  for (int i = 1; i <= events; ++i) {
    const std::int64_t n = bookings_of(i);
    if (i % 4 == 0) {
      dead_booked += n == 1 ? 1 : 0;
      EXPECT_LE(n, 1) << "event " << i << " (stranded before the upgrade) booked " << n << " times";
    } else {
      booked_again += static_cast<int>(n);
    }
  }
  EXPECT_EQ(booked_again, 0) << "events finished before the upgrade were booked again";
  EXPECT_EQ(dead_booked, events / 4) << "every dead worker's event is finished once";
}

}  // namespace idemgate::test
