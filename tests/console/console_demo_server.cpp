// The console of a slot-claiming gate on SQLite, served on 127.0.0.1 for the browser test
// (browser_test.py): some events booked, some duplicated, two timed out and one whose business
// write always throws (escalated), one refused (failed).
//
// Usage: console_demo_server <database file> <token>
// Prints one JSON line {"port": N, "keys": {"<container>": "<key>", ...}} once it serves, and
// serves until its standard input closes.

#include "support/console_terminal.hpp"

#include <idemgate/console/httplib.hpp>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <exception>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

namespace tc = idemgate::test::console;

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: console_demo_server <database file> <token>\n");
    return 2;
  }
  try {
    const std::string path = argv[1];
    tc::create_bookings(path);
    idemgate::SqliteStore store{path};
    store.migrate();
    tc::Terminal terminal;
    tc::ConsoleGate gate{std::string(tc::gate_name), store, terminal, tc::Book{},
                         tc::gate_options()};
    const std::vector<std::string> containers{
        "MSKU7000037",         "TGHU4100442",         "CMAU1234565",
        "TIMEOUT-HLXU8001231", "MRKU2200917",         "BROKEN-TCLU3309876",
        "REFUSED-XXXU0000000", "TIMEOUT-SEGU5501770", "OOLU6600128"};
    tc::deliver(gate, containers);

    httplib::Server server;
    idemgate::console::mount(server, "/ops/console", gate,
                             {.bearer_token = argv[2], .secure_cookie = false});
    const int port = server.bind_to_any_port("127.0.0.1");
    if (port <= 0) throw std::runtime_error("cannot bind to 127.0.0.1");
    std::thread serving([&] { server.listen_after_bind(); });
    while (!server.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));

    nlohmann::json keys = nlohmann::json::object();
    for (std::size_t n = 0; n < containers.size(); ++n)
      keys[containers[n]] = tc::key_of("event-" + std::to_string(n), containers[n]).hex();
    std::cout << nlohmann::json{{"port", port}, {"keys", keys}}.dump() << std::endl;

    std::string line;
    while (std::getline(std::cin, line)) {
    }
    server.stop();
    serving.join();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "console_demo_server: %s\n", e.what());
    return 1;
  }
}
