// A consumer process with the library's default options, for the crash test in
// test_lease_crash.cpp: it reserves one event on an SQLite file, announces "calling" and then
// waits inside the downstream call until it is killed. Arguments: the database file, the
// container.

#include "support/slot_request.hpp"
#include "support/sqlite_files.hpp"

#include <idemgate/gate.hpp>
#include <idemgate/store/sqlite.hpp>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

namespace {

// A downstream whose call never ends: the process is killed inside it.
struct Hanging {
  using request_type = idemgate::test::SlotRequest;
  using outcome_type = std::string;
  static constexpr bool honours_idempotency_key = true;
  idemgate::ClaimResult<std::string> claim(const request_type&, const idemgate::Key&) {
    std::printf("calling\n");
    std::fflush(stdout);
    for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
  }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: lease_crash_consumer DB CONTAINER\n");
    return 2;
  }
  idemgate::SqliteStore store{argv[1]};
  Hanging downstream;
  idemgate::Gate gate{"ect.claim_slot", store, downstream,
                      idemgate::test::sqlite::book};  // default options
  const idemgate::test::SlotRequest request{argv[2], "2025-06-09T07:00"};
  (void)gate.process(idemgate::derive_key("ect.claim_slot", argv[2]), request);
  return 1;  // never reached: the downstream never answers
}
