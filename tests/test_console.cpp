// The operator console over a real socket on 127.0.0.1: its token, its cross-site safety, and
// what resolving and re-driving do to the log and to the business table (SQLite).

#include "support/console_terminal.hpp"
#include "support/sqlite_files.hpp"

#include <idemgate/console/httplib.hpp>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace tc = idemgate::test::console;
using idemgate::RecordStatus;
using idemgate::console::ConsoleOptions;
using nlohmann::json;

constexpr const char* token = "0123456789abcdef-console-token";
constexpr const char* prefix = "/ops/console";

class ConsoleOverHttp : public ::testing::Test {
 protected:
  void SetUp() override {
    tc::create_bookings(path_);
    store_.migrate();
    tc::deliver(gate_, {"MSKU0000001", "MSKU0000002", "TIMEOUT0000003", "TIMEOUT0000004",
                        "BROKEN0000005", "REFUSED0000006"});
    idemgate::console::mount(server_, prefix, gate_,
                             ConsoleOptions{.bearer_token = token, .secure_cookie = false});
    port_ = server_.bind_to_any_port("127.0.0.1");
    ASSERT_GT(port_, 0);
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  void TearDown() override {
    server_.stop();
    if (thread_.joinable()) thread_.join();
  }

  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(30, 0);
    return c;
  }
  static httplib::Headers bearer() { return {{"Authorization", std::string("Bearer ") + token}}; }
  static std::string api(const std::string& rest) { return std::string(prefix) + "/api/" + rest; }

  static std::string resolve_path(const idemgate::Key& key) {
    return api("rows/" + key.hex() + "/resolve");
  }
  static std::string outcome_body(const std::string& slot_json) {
    return json{{"outcome", slot_json}}.dump();
  }

  // The session cookie, as a browser gets it by opening the console with its token.
  std::string session_cookie() {
    auto c = client();
    const auto res = c.Get(std::string(prefix) + "/?token=" + token);
    EXPECT_TRUE(res);
    EXPECT_EQ(res->status, 303);
    const std::string set = res->get_header_value("Set-Cookie");
    return set.substr(0, set.find(';'));
  }

  RecordStatus status_of(const idemgate::Key& key) {
    const auto row = gate_.store().find(key);
    EXPECT_TRUE(row);
    return row ? row->status : RecordStatus::in_flight;
  }

  idemgate::test::sqlite::TempDir dir_;
  std::string path_ = dir_.file("console.db");
  idemgate::SqliteStore store_{path_};
  tc::Terminal terminal_;
  tc::ConsoleGate gate_{std::string(tc::gate_name), store_, terminal_, tc::Book{},
                        tc::gate_options()};
  httplib::Server server_;
  std::thread thread_;
  int port_ = 0;

  const idemgate::Key timeout3_ = tc::key_of("event-2", "TIMEOUT0000003");
  const idemgate::Key timeout4_ = tc::key_of("event-3", "TIMEOUT0000004");
  const idemgate::Key broken_ = tc::key_of("event-4", "BROKEN0000005");
  const idemgate::Key refused_ = tc::key_of("event-5", "REFUSED0000006");
};

TEST_F(ConsoleOverHttp, TheSetUpLeavesEscalatedAndFailedRows) {
  EXPECT_EQ(status_of(timeout3_), RecordStatus::escalated);
  EXPECT_EQ(status_of(broken_), RecordStatus::escalated);
  EXPECT_EQ(status_of(refused_), RecordStatus::failed);
  EXPECT_EQ(tc::bookings_of(path_, "MSKU0000001"), 1);
}

TEST_F(ConsoleOverHttp, NothingIsServedWithoutTheToken) {
  auto c = client();
  for (const std::string& path :
       {std::string(prefix) + "/", std::string(prefix), api("signals"), api("escalated"),
        api("rows/" + timeout3_.hex()), std::string(prefix) + "/nowhere"}) {
    const auto res = c.Get(path);
    ASSERT_TRUE(res) << path;
    EXPECT_EQ(res->status, 401) << path;
    EXPECT_EQ(res->get_header_value("Content-Type"), "application/problem+json") << path;
    EXPECT_EQ(res->body.find("<html"), std::string::npos) << path;
    EXPECT_EQ(json::parse(res->body)["status"], 401);
  }
  const auto wrong = c.Get(api("signals"), {{"Authorization", "Bearer 0123456789abcdef-wrong"}});
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 401);
  const auto wrong_query = c.Get(std::string(prefix) + "/?token=0123456789abcdef-wrong");
  ASSERT_TRUE(wrong_query);
  EXPECT_EQ(wrong_query->status, 401);
  EXPECT_FALSE(wrong_query->has_header("Set-Cookie"));
  const auto forged = c.Get(std::string(prefix) + "/", {{"Cookie", "idemgate_console=00ff"}});
  ASSERT_TRUE(forged);
  EXPECT_EQ(forged->status, 401);
  // The token itself is not the cookie: a cookie must be the server's session value.
  const auto raw =
      c.Get(std::string(prefix) + "/", {{"Cookie", std::string("idemgate_console=") + token}});
  ASSERT_TRUE(raw);
  EXPECT_EQ(raw->status, 401);

  const auto resolve =
      c.Post(resolve_path(timeout3_), outcome_body(R"({"slot":"X"})"), "application/json");
  ASSERT_TRUE(resolve);
  EXPECT_EQ(resolve->status, 401);
  EXPECT_EQ(status_of(timeout3_), RecordStatus::escalated);
  EXPECT_EQ(tc::bookings_of(path_, "TIMEOUT0000003"), 0);
}

TEST_F(ConsoleOverHttp, OpeningWithTheTokenSetsAStrictCookieAndDropsTheTokenFromTheAddress) {
  auto c = client();
  const auto res = c.Get(std::string(prefix) + "/?token=" + token);
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 303);
  EXPECT_EQ(res->get_header_value("Location"), std::string(prefix) + "/");
  const std::string set = res->get_header_value("Set-Cookie");
  EXPECT_NE(set.find("HttpOnly"), std::string::npos) << set;
  EXPECT_NE(set.find("SameSite=Strict"), std::string::npos) << set;
  EXPECT_NE(set.find(std::string("Path=") + prefix + "/"), std::string::npos) << set;
  EXPECT_EQ(set.find(token), std::string::npos) << "the cookie must not carry the token";

  const auto page = c.Get(std::string(prefix) + "/", {{"Cookie", set.substr(0, set.find(';'))}});
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200);
  EXPECT_EQ(page->get_header_value("Content-Type"), "text/html; charset=utf-8");
  EXPECT_NE(page->body.find("idemgate console"), std::string::npos);
  const std::string csp = page->get_header_value("Content-Security-Policy");
  EXPECT_NE(csp.find("default-src 'none'"), std::string::npos) << csp;
  EXPECT_NE(csp.find("script-src 'sha256-"), std::string::npos) << csp;
  EXPECT_EQ(csp.find("unsafe-inline"), std::string::npos) << csp;
  EXPECT_EQ(csp.find("http"), std::string::npos) << csp;
  EXPECT_EQ(page->get_header_value("Cache-Control"), "no-store");
  // Nothing in the page comes from elsewhere.
  for (const char* external : {"src=", "href=", "http://", "https://", "@import", "url("})
    EXPECT_EQ(page->body.find(external), std::string::npos) << external;
}

TEST_F(ConsoleOverHttp, TheBearerTokenOpensTheApi) {
  auto c = client();
  const auto res = c.Get(api("signals"), bearer());
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const json s = json::parse(res->body);
  EXPECT_EQ(s["gate"], tc::gate_name);
  EXPECT_EQ(s["escalated"], 3);
  EXPECT_GE(s["events"].get<int>(), 6);
  EXPECT_GE(s["duplicates"].get<int>(), 3);
  EXPECT_TRUE(s["health"].contains("healthy"));
  EXPECT_TRUE(s["oldest_in_flight_seconds"].is_null());
  EXPECT_TRUE(s["oldest_snapshot_seconds"].is_null()) << "the console's store cannot tell";
  EXPECT_FALSE(s["health"]["old_snapshot"].get<bool>());

  const auto queue = c.Get(api("escalated"), bearer());
  ASSERT_TRUE(queue);
  ASSERT_EQ(queue->status, 200);
  std::vector<std::string> keys;
  const json listed = json::parse(queue->body);
  for (const json& row : listed["rows"]) {
    keys.push_back(row["key"]);
    EXPECT_EQ(row["status"], "escalated");
    EXPECT_NE(row["reason"].get<std::string>().find("gave up after"), std::string::npos);
  }
  EXPECT_EQ(keys, (std::vector<std::string>{timeout3_.hex(), timeout4_.hex(), broken_.hex()}));

  const auto row = c.Get(api("rows/" + broken_.hex()), bearer());
  ASSERT_TRUE(row);
  ASSERT_EQ(row->status, 200);
  const json r = json::parse(row->body);
  EXPECT_EQ(r["request"], "BROKEN0000005");
  EXPECT_NE(r["reason"].get<std::string>().find("no booking line"), std::string::npos);
  EXPECT_TRUE(r["result"].is_null());
}

TEST_F(ConsoleOverHttp, ResolveCommitsTheOutcomeAndTheBusinessRowThroughTheGate) {
  auto c = client();
  const auto res = c.Post(resolve_path(timeout3_), bearer(), outcome_body(R"({"slot":"MANUAL-7"})"),
                          "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const json body = json::parse(res->body);
  EXPECT_EQ(body["row"]["status"], "committed");
  EXPECT_EQ(body["row"]["result"], R"({"slot":"MANUAL-7"})");
  EXPECT_EQ(status_of(timeout3_), RecordStatus::committed);
  EXPECT_EQ(tc::bookings_of(path_, "TIMEOUT0000003"), 1);
  // A redelivery of the event now gets the operator's outcome.
  const auto again = gate_.process(timeout3_, "TIMEOUT0000003");
  ASSERT_EQ(again.status(), idemgate::Status::duplicate);
  EXPECT_EQ(again.outcome().id, "MANUAL-7");

  const auto twice = c.Post(resolve_path(timeout3_), bearer(),
                            outcome_body(R"({"slot":"MANUAL-8"})"), "application/json");
  ASSERT_TRUE(twice);
  EXPECT_EQ(twice->status, 409);
  EXPECT_EQ(json::parse(twice->body)["type"], "urn:idemgate:console:not-escalated");
  EXPECT_EQ(tc::bookings_of(path_, "TIMEOUT0000003"), 1);
}

TEST_F(ConsoleOverHttp, ResolveThroughTheCookieFromTheConsolesOwnPage) {
  const std::string cookie = session_cookie();
  auto c = client();
  const auto res =
      c.Post(resolve_path(timeout4_),
             {{"Cookie", cookie}, {"X-Idemgate-Console", "1"}, {"Sec-Fetch-Site", "same-origin"}},
             outcome_body(R"({"slot":"MANUAL-9"})"), "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(tc::bookings_of(path_, "TIMEOUT0000004"), 1);
}

TEST_F(ConsoleOverHttp, CrossSitePostsAreRefusedAndChangeNothing) {
  const std::string cookie = session_cookie();
  auto c = client();
  // What a form on another site can send: the cookie (were it not SameSite=Strict), no header.
  const auto form = c.Post(resolve_path(timeout3_), {{"Cookie", cookie}},
                           outcome_body(R"({"slot":"EVIL"})"), "text/plain");
  ASSERT_TRUE(form);
  EXPECT_EQ(form->status, 403);
  EXPECT_EQ(json::parse(form->body)["type"], "urn:idemgate:console:cross-site");
  // A browser marks another site's request, even with the header and a token.
  const auto marked =
      c.Post(resolve_path(timeout3_),
             {{"Cookie", cookie}, {"X-Idemgate-Console", "1"}, {"Sec-Fetch-Site", "cross-site"}},
             outcome_body(R"({"slot":"EVIL"})"), "application/json");
  ASSERT_TRUE(marked);
  EXPECT_EQ(marked->status, 403);
  const auto redrive =
      c.Post(api("rows/" + refused_.hex() + "/redrive"),
             {{"Cookie", cookie}, {"Sec-Fetch-Site", "same-site"}}, "{}", "application/json");
  ASSERT_TRUE(redrive);
  EXPECT_EQ(redrive->status, 403);
  EXPECT_EQ(status_of(timeout3_), RecordStatus::escalated);
  EXPECT_EQ(status_of(refused_), RecordStatus::failed);
  EXPECT_EQ(tc::bookings_of(path_, "TIMEOUT0000003"), 0);
  // No CORS: a preflight gets no Access-Control-* header.
  httplib::Request preflight;
  preflight.method = "OPTIONS";
  preflight.path = resolve_path(timeout3_);
  preflight.headers = {{"Origin", "https://evil.example"},
                       {"Access-Control-Request-Method", "POST"},
                       {"Access-Control-Request-Headers", "x-idemgate-console"}};
  const auto answer = c.send(preflight);
  ASSERT_TRUE(answer);
  EXPECT_NE(answer->status, 200);
  for (const auto& [name, value] : answer->headers)
    EXPECT_NE(name.rfind("Access-Control-", 0), 0u) << name;
}

TEST_F(ConsoleOverHttp, AnOutcomeThatDoesNotParseIsRefusedWith422) {
  auto c = client();
  const auto res =
      c.Post(resolve_path(timeout3_), bearer(), outcome_body("MANUAL-7"), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 422);
  EXPECT_EQ(res->get_header_value("Content-Type"), "application/problem+json");
  const json p = json::parse(res->body);
  EXPECT_EQ(p["type"], "urn:idemgate:console:outcome-does-not-parse");
  EXPECT_NE(p["detail"].get<std::string>().find("{\"slot\": \"<slot id>\"}"), std::string::npos)
      << p["detail"];
  EXPECT_EQ(status_of(timeout3_), RecordStatus::escalated);
  EXPECT_EQ(tc::bookings_of(path_, "TIMEOUT0000003"), 0);
}

TEST_F(ConsoleOverHttp, AThrowingBusinessWriteCommitsNothingAndSaysWhy) {
  auto c = client();
  const auto res = c.Post(resolve_path(broken_), bearer(), outcome_body(R"({"slot":"MANUAL-5"})"),
                          "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 422);
  const json p = json::parse(res->body);
  EXPECT_EQ(p["type"], "urn:idemgate:console:business-write-failed");
  const std::string detail = p["detail"];
  EXPECT_NE(detail.find("create it in the TMS first"), std::string::npos) << detail;
  EXPECT_NE(detail.find("still escalated"), std::string::npos) << detail;
  EXPECT_NE(p["title"].get<std::string>().find("nothing was committed"), std::string::npos);
  const auto row = gate_.store().find(broken_);
  ASSERT_TRUE(row);
  EXPECT_EQ(row->status, RecordStatus::escalated);
  EXPECT_FALSE(row->result);
  EXPECT_EQ(tc::bookings_of(path_, "BROKEN0000005"), 0);
}

TEST_F(ConsoleOverHttp, RedriveTurnsAFailedRowBackInFlightOnly) {
  auto c = client();
  const auto res =
      c.Post(api("rows/" + refused_.hex() + "/redrive"), bearer(), "{}", "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(json::parse(res->body)["row"]["status"], "in_flight");
  EXPECT_EQ(status_of(refused_), RecordStatus::in_flight);
  const auto again =
      c.Post(api("rows/" + refused_.hex() + "/redrive"), bearer(), "{}", "application/json");
  ASSERT_TRUE(again);
  EXPECT_EQ(again->status, 409);
  EXPECT_EQ(json::parse(again->body)["type"], "urn:idemgate:console:not-failed");
  const auto escalated =
      c.Post(api("rows/" + timeout3_.hex() + "/redrive"), bearer(), "{}", "application/json");
  ASSERT_TRUE(escalated);
  EXPECT_EQ(escalated->status, 409);
  EXPECT_EQ(status_of(timeout3_), RecordStatus::escalated);
}

TEST_F(ConsoleOverHttp, UnknownRowsBadKeysAndBadBodiesAreProblems) {
  auto c = client();
  const auto unknown = c.Get(api("rows/" + tc::key_of("event-99", "NOWHERE").hex()), bearer());
  ASSERT_TRUE(unknown);
  EXPECT_EQ(unknown->status, 404);
  EXPECT_EQ(json::parse(unknown->body)["type"], "urn:idemgate:console:unknown-row");
  const auto bad_key = c.Get(api("rows/not-a-key"), bearer());
  ASSERT_TRUE(bad_key);
  EXPECT_EQ(bad_key->status, 400);
  const auto bad_body =
      c.Post(resolve_path(timeout3_), bearer(), R"({"outcome": 7})", "application/json");
  ASSERT_TRUE(bad_body);
  EXPECT_EQ(bad_body->status, 400);
  const auto no_outcome = c.Post(resolve_path(timeout3_), bearer(), "{}", "application/json");
  ASSERT_TRUE(no_outcome);
  EXPECT_EQ(no_outcome->status, 400);
  const auto wrong_method = c.Delete(api("rows/" + timeout3_.hex()), bearer());
  ASSERT_TRUE(wrong_method);
  EXPECT_EQ(wrong_method->status, 405);
  EXPECT_EQ(status_of(timeout3_), RecordStatus::escalated);
}

TEST(Console, RefusesAShortTokenAndAnUnusablePrefix) {
  idemgate::test::sqlite::TempDir dir;
  idemgate::SqliteStore store{dir.file("c.db")};
  store.migrate();
  tc::Terminal terminal;
  tc::ConsoleGate gate{std::string(tc::gate_name), store, terminal, tc::Book{}, tc::gate_options()};
  httplib::Server server;
  EXPECT_THROW(idemgate::console::mount(server, "/ops", gate, {.bearer_token = "short"}),
               std::invalid_argument);
  EXPECT_THROW(idemgate::console::mount(server, "/ops", gate, {}), std::invalid_argument);
  for (const char* bad : {"", "/", "ops", "/ops/", "/o(p)s", "/ops?x"})
    EXPECT_THROW(idemgate::console::mount(server, bad, gate, {.bearer_token = token}),
                 std::invalid_argument)
        << bad;
  EXPECT_NO_THROW(
      idemgate::console::mount(server, "/ops/console.v1", gate, {.bearer_token = token}));
}

TEST_F(ConsoleOverHttp, RowsShowTheirLabelAndHistory) {
  auto c = client();
  const auto res = c.Get(api("rows/" + broken_.hex()), bearer());
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200);
  const json row = json::parse(res->body);
  EXPECT_EQ(row["label"], "console.claim_slot event-4 BROKEN0000005");
  std::vector<std::string> outcomes;
  for (const json& h : row["history"]) outcomes.push_back(h["outcome"]);
  ASSERT_FALSE(outcomes.empty());
  EXPECT_EQ(outcomes.back(), "escalated") << row["history"].dump();
  EXPECT_NE(row["history"].dump().find("no booking line"), std::string::npos)
      << row["history"].dump();

  const auto resolved = c.Post(resolve_path(timeout3_), bearer(),
                               outcome_body(R"({"slot":"MANUAL-7"})"), "application/json");
  ASSERT_TRUE(resolved);
  ASSERT_EQ(resolved->status, 200);
  const json after = json::parse(resolved->body)["row"];
  ASSERT_FALSE(after["history"].empty());
  EXPECT_EQ(after["history"].back()["outcome"], "resolved") << after["history"].dump();
}

TEST_F(ConsoleOverHttp, CausesGroupTheFailedAndEscalatedRows) {
  auto c = client();
  const auto res = c.Get(api("causes"), bearer());
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const json body = json::parse(res->body);
  int timed_out = 0, refused = 0, broken = 0;
  for (const json& cause : body["causes"]) {
    const std::string reason = cause["reason"];
    if (reason.find("timed out") != std::string::npos) {
      EXPECT_EQ(cause["status"], "escalated");
      timed_out += cause["rows"].get<int>();  // delivered twice, one says "after 2 attempts"
    } else if (reason.find("no booking line") != std::string::npos) {
      EXPECT_EQ(cause["status"], "escalated");
      broken = cause["rows"];
    } else if (reason == "the terminal refused: unknown container REFUSED0000006") {
      EXPECT_EQ(cause["status"], "failed");
      refused = cause["rows"];
    }
  }
  EXPECT_EQ(timed_out, 2) << body.dump();
  EXPECT_EQ(broken, 1) << body.dump();
  EXPECT_EQ(refused, 1) << body.dump();
}

TEST_F(ConsoleOverHttp, RowsAreListedByStatusReasonAndLabel) {
  auto c = client();
  const auto failed = c.Get(api("rows?status=failed"), bearer());
  ASSERT_TRUE(failed);
  ASSERT_EQ(failed->status, 200) << failed->body;
  const json f = json::parse(failed->body);
  EXPECT_EQ(f["count"], 1);
  ASSERT_EQ(f["rows"].size(), 1u);
  EXPECT_EQ(f["rows"][0]["key"], refused_.hex());
  const auto labelled = c.Get(api("rows?label=TIMEOUT"), bearer());
  ASSERT_TRUE(labelled);
  ASSERT_EQ(labelled->status, 200);
  EXPECT_EQ(json::parse(labelled->body)["count"], 2);
  const auto bogus = c.Get(api("rows?status=bogus"), bearer());
  ASSERT_TRUE(bogus);
  EXPECT_EQ(bogus->status, 400);
}

TEST_F(ConsoleOverHttp, RedrivingACauseRedrivesItsFailedRowsOnly) {
  auto c = client();
  const json refused = {{"reason", "the terminal refused: unknown container REFUSED0000006"}};
  const std::string cookie = session_cookie();
  const auto cross =
      c.Post(api("causes/redrive"), {{"Cookie", cookie}}, refused.dump(), "application/json");
  ASSERT_TRUE(cross);
  EXPECT_EQ(cross->status, 403);
  EXPECT_EQ(status_of(refused_), RecordStatus::failed);

  // By the id the causes list gives.
  const auto causes = c.Get(api("causes"), bearer());
  ASSERT_TRUE(causes);
  std::string id;
  const json listed = json::parse(causes->body);
  for (const json& cause : listed["causes"])
    if (cause["cause"].get<std::string>() == refused["reason"].get<std::string>())
      id = cause["id"].get<std::string>();
  ASSERT_EQ(id.size(), 12u) << causes->body;
  const auto res =
      c.Post(api("causes/redrive"), bearer(), json{{"cause", id}}.dump(), "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const json body = json::parse(res->body);
  EXPECT_EQ(body["redriven"], 1);
  EXPECT_EQ(body["still_failed"], 0);
  EXPECT_EQ(status_of(refused_), RecordStatus::in_flight);
  const auto again = c.Post(api("causes/redrive"), bearer(), refused.dump(), "application/json");
  ASSERT_TRUE(again);
  EXPECT_EQ(again->status, 409);

  const std::string escalated_reason = gate_.store().find(timeout3_)->reason;
  const auto escalated = c.Post(api("causes/redrive"), bearer(),
                                json{{"reason", escalated_reason}}.dump(), "application/json");
  ASSERT_TRUE(escalated);
  EXPECT_EQ(escalated->status, 409);
  EXPECT_EQ(status_of(timeout3_), RecordStatus::escalated);
  EXPECT_EQ(status_of(timeout4_), RecordStatus::escalated);
}

TEST_F(ConsoleOverHttp, AStoreThatFailsIsAProblemNotAnAnswer) {
  {
    auto db = idemgate::test::sqlite::open_raw(path_);
    char* error = nullptr;
    ASSERT_EQ(sqlite3_exec(db.get(), "DROP TABLE idemgate_log", nullptr, nullptr, &error),
              SQLITE_OK)
        << (error ? error : "");
  }
  auto c = client();
  const auto res = c.Get(api("escalated"), bearer());
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 503) << res->body;
  EXPECT_EQ(res->get_header_value("Content-Type"), "application/problem+json");
  EXPECT_EQ(json::parse(res->body)["type"], "urn:idemgate:console:store-unavailable");
}

TEST_F(ConsoleOverHttp, SigningOutClearsTheCookie) {
  const std::string cookie = session_cookie();
  auto c = client();
  const auto res = c.Post(std::string(prefix) + "/logout",
                          {{"Cookie", cookie}, {"X-Idemgate-Console", "1"}}, "", "text/plain");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  const std::string set = res->get_header_value("Set-Cookie");
  EXPECT_EQ(set.rfind("idemgate_console=;", 0), 0u) << set;
  EXPECT_NE(set.find("Max-Age=0"), std::string::npos) << set;
}

TEST(Console, TheSessionCookieIsSecureUnlessTurnedOff) {
  idemgate::test::sqlite::TempDir dir;
  idemgate::SqliteStore store{dir.file("c.db")};
  store.migrate();
  tc::Terminal terminal;
  tc::ConsoleGate gate{std::string(tc::gate_name), store, terminal, tc::Book{}, tc::gate_options()};
  const auto set_cookie = [&](ConsoleOptions options) {
    idemgate::console::Console console{gate, "/ops", std::move(options)};
    idemgate::console::ConsoleRequest request;
    request.method = "GET";
    request.path = "/";
    request.query.emplace("token", token);
    const auto response = console.handle(request);
    EXPECT_EQ(response.status, 303);
    for (const auto& [name, value] : response.headers)
      if (name == "Set-Cookie") return value;
    return std::string();
  };
  EXPECT_NE(set_cookie({.bearer_token = token}).find("; Secure"), std::string::npos);
  EXPECT_EQ(set_cookie({.bearer_token = token, .secure_cookie = false}).find("Secure"),
            std::string::npos);
}

TEST(ConsoleJson, ReadsFlatObjectsOfStringsOnly) {
  using idemgate::detail::console::parse_flat_object;
  const auto members = parse_flat_object(R"( {"outcome": "{\"slot\":\"A\u00e9\ud83d\ude00\"}"} )");
  EXPECT_EQ(members.at("outcome"), "{\"slot\":\"A\xc3\xa9\xf0\x9f\x98\x80\"}");
  EXPECT_TRUE(parse_flat_object("{}").empty());
  for (const char* bad : {"", "[]", R"({"a":1})", R"({"a":"b",})", R"({"a":"b"} x)",
                          R"({"a":"b","a":"c"})", R"({"a":"\ud800"})", "{\"a\":\"\x01\"}"})
    EXPECT_THROW((void)parse_flat_object(bad), idemgate::detail::console::JsonError) << bad;
}

TEST(ConsoleJson, WritesInertStringsAndReplacesBytesThatAreNotUtf8) {
  using idemgate::detail::console::quote;
  EXPECT_EQ(quote("a\"b\\c\n"), R"("a\"b\\c\n")");
  EXPECT_EQ(quote("</script><b>&"), R"("\u003c/script\u003e\u003cb\u003e\u0026")");
  EXPECT_EQ(quote("caf\xc3\xa9"), "\"caf\xc3\xa9\"");
  EXPECT_EQ(quote("\xff\xc3"), R"("\ufffd\ufffd")");
  EXPECT_EQ(quote("\xc0\xaf"), R"("\ufffd\ufffd")");  // an overlong '/'
}

}  // namespace
