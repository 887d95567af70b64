// A consumer process for crash tests: processes one event through the gate on PostgreSQL and,
// at the fault point it is given, announces "FAULT_POINT <name>" on stdout and waits to be
// killed. Usage:
//   fault_consumer URI LOG BOOKINGS TERMINAL FAULT_POINT NOTIFICATION_ID CONTAINER
// FAULT_POINT: before_claim | after_claim | before_commit | none, or one_transaction_mid_write
// (a TransactionGate that books the slot itself and stops before its transaction commits).
// The gate's name is IDEMGATE_FAULT_GATE when set (two services on one log), else
// "ect.claim_slot".

#include "support/pg_terminal.hpp"
#include "support/slot_request.hpp"

#include <idemgate/gate.hpp>
#include <idemgate/store/postgres.hpp>
#include <idemgate/transaction_gate.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>

namespace {

[[noreturn]] void announce_and_wait(const char* point) {
  std::printf("FAULT_POINT %s\n", point);
  std::fflush(stdout);
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(60));
}

/// The terminal, with fault points around the claim.
struct FaultingTerminal {
  using request_type = idemgate::test::SlotRequest;
  using outcome_type = std::string;
  static constexpr bool honours_idempotency_key = true;
  idemgate::test::PgTerminal& terminal;
  std::string fault;
  idemgate::ClaimResult<std::string> claim(const request_type& r, const idemgate::Key& k) {
    if (fault == "before_claim") announce_and_wait("before_claim");
    auto answer = terminal.claim(r, k);
    if (fault == "after_claim") announce_and_wait("after_claim");
    return answer;
  }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 8) {
    std::fprintf(stderr,
                 "usage: fault_consumer URI LOG BOOKINGS TERMINAL FAULT_POINT NOTIFICATION "
                 "CONTAINER\n");
    return 2;
  }
  const std::string uri = argv[1], log = argv[2], bookings = argv[3], terminal_table = argv[4],
                    fault = argv[5], notification = argv[6], container = argv[7];
  idemgate::PostgresStore store(uri, {.table = log});
  idemgate::test::PgTerminal pg_terminal(uri, terminal_table);
  FaultingTerminal terminal{pg_terminal, fault};
  const char* gate_name = std::getenv("IDEMGATE_FAULT_GATE");
  idemgate::Gate gate{gate_name != nullptr ? gate_name : "ect.claim_slot",
                      store,
                      terminal,
                      [&](pqxx::work& tx, const idemgate::Key& key,
                          const idemgate::test::SlotRequest& r, const std::string& slot) {
                        idemgate::detail::pq::exec_params(
                            tx,
                            "INSERT INTO " + bookings +
                                " (container, slot_id, source_event) VALUES ($1, $2, $3::bytea)",
                            r.container, slot, idemgate::detail::pq::bytea_param(key.view()));
                        if (fault == "before_commit") announce_and_wait("before_commit");
                      },
                      {.lease = std::chrono::milliseconds(300)}};
  const auto key = idemgate::derive_key("ect.claim_slot", notification, container);
  if (fault == "one_transaction_mid_write") {
    idemgate::TransactionGate<idemgate::PostgresStore, idemgate::test::SlotRequest, std::string,
                              std::function<std::string(pqxx::work&, const idemgate::Key&,
                                                        const idemgate::test::SlotRequest&)>>
        once{gate_name != nullptr ? gate_name : "ect.claim_slot", store,
             [&](pqxx::work& tx, const idemgate::Key& k, const idemgate::test::SlotRequest& r) {
               idemgate::detail::pq::exec_params(
                   tx,
                   "INSERT INTO " + bookings +
                       " (container, slot_id, source_event) VALUES ($1, $2, $3::bytea)",
                   r.container, "own-slot", idemgate::detail::pq::bytea_param(k.view()));
               announce_and_wait("one_transaction_mid_write");
               return std::string("own-slot");
             }};
    (void)once.process(key, {container, "2025-06-09T07:00"});
  }
  const auto result = gate.process(key, {container, "2025-06-09T07:00"});
  std::printf("RESULT %s\n", std::string(to_string(result.status())).c_str());
  return 0;
}
