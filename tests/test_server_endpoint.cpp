// The server side (server/): the Idempotency-Key header, canonical JSON fingerprints, the stored
// response, and Endpoint over SQLite through the cpp-httplib adapter, on loopback.

#include "support/server_scenarios.hpp"
#include "support/sqlite_files.hpp"

#include <idemgate/downstream/http.hpp>
#include <idemgate/idemgate.hpp>
#include <idemgate/reconciler.hpp>
#include <idemgate/server/canonical_json.hpp>
#include <idemgate/server/key_header.hpp>
#include <idemgate/server/message.hpp>
#include <idemgate/store/memory.hpp>

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <stdexcept>
#include <string>

namespace {

using namespace idemgate;
using namespace idemgate::test;
using server::canonical_json;
using server::read_key_header;

static_assert(server::answering_store<SqliteStore>);
static_assert(server::answering_store<MemoryStore>);

TEST(CanonicalJson, MemberOrderAndWhitespaceDoNotMatter) {
  const auto a = canonical_json(R"({"b":[1, 2,{"y":null,"x":true}],"a":"A"})");
  const auto b =
      canonical_json("{\n  \"a\" : \"\\u0041\",\n  \"b\" : [ 1 , 2 , {\"x\":true,\"y\":null} ]\n}");
  ASSERT_TRUE(a.ok) << a.error;
  ASSERT_TRUE(b.ok) << b.error;
  EXPECT_EQ(a.text, R"({"a":"A","b":[1,2,{"x":true,"y":null}]})");
  EXPECT_EQ(a.text, b.text);
}

TEST(CanonicalJson, DuplicateMemberNamesAreRefused) {
  const auto c = canonical_json(R"({"amount":1,"amount":100})");
  EXPECT_FALSE(c.ok);
  EXPECT_NE(c.error.find("\"amount\" appears twice"), std::string::npos) << c.error;
  EXPECT_FALSE(canonical_json(R"({"a":{"b":1,"b":1}})").ok);
}

TEST(CanonicalJson, ValuesKeepTheirMeaning) {
  EXPECT_NE(canonical_json(R"({"n":1})").text, canonical_json(R"({"n":"1"})").text);
  EXPECT_NE(canonical_json(R"([1,2])").text, canonical_json(R"([2,1])").text);
  EXPECT_EQ(canonical_json(R"("a\/b\n")").text, "\"a/b\\n\"");
  EXPECT_EQ(canonical_json(R"("\ud83d\ude00")").text, "\"\xF0\x9F\x98\x80\"");
}

TEST(CanonicalJson, WhatIsNotJsonIsRefused) {
  for (const char* bad : {"", "{", "{\"a\":1,}", "[1,]", "01", "1.", "{\"a\" 1}", "nul", "\"\\x\"",
                          "\"\\ud800\"", "{} {}", "\"a\nb\""})
    EXPECT_FALSE(canonical_json(bad).ok) << bad;
  std::string deep(200, '[');
  deep += std::string(200, ']');
  EXPECT_FALSE(canonical_json(deep).ok);
}

TEST(KeyHeader, AStructuredFieldStringIsUnquotedAndUnescaped) {
  const auto k = read_key_header(R"( "8e03978e-40d5\"x\\" )");
  ASSERT_TRUE(k.ok) << k.error;
  EXPECT_EQ(k.key, R"(8e03978e-40d5"x\)");
}

TEST(KeyHeader, ABareValueIsAcceptedOnlyWhenAllowed) {
  EXPECT_EQ(read_key_header("abc-123").key, "abc-123");
  server::KeyHeaderRules strict;
  strict.accept_bare = false;
  const auto refused = read_key_header("abc-123", strict);
  EXPECT_FALSE(refused.ok);
  EXPECT_NE(refused.error.find("quoted"), std::string::npos);
  EXPECT_FALSE(read_key_header("a b").ok);
}

TEST(KeyHeader, MalformedStringsAndLimitsAreRefused) {
  for (const char* bad :
       {"\"", "\"abc", "\"a\\b\"", "\"a\";p=1", "\"a\", \"b\"", "\"\"", "", "\"\xC3\xA9\""})
    EXPECT_FALSE(read_key_header(bad).ok) << bad;
  EXPECT_TRUE(read_key_header("\"" + std::string(255, 'k') + "\"").ok);
  const auto long_key = read_key_header("\"" + std::string(256, 'k') + "\"");
  EXPECT_FALSE(long_key.ok);
  EXPECT_NE(long_key.error.find("at most 255"), std::string::npos);
}

TEST(StoredResponse, KeepsStatusTheChosenHeadersAndBody) {
  server::Response r{201,
                     {{"content-type", "application/json"}, {"Date", "today"}, {"ETag", "\"1\""}},
                     std::string("a\0b", 3)};
  const auto back = server::decode_response(server::encode_response(r, {"Content-Type", "ETag"}));
  EXPECT_EQ(back.status, 201);
  ASSERT_EQ(back.headers.size(), 2u);
  EXPECT_EQ(back.header("Content-Type"), "application/json");
  EXPECT_EQ(back.header("etag"), "\"1\"");
  EXPECT_FALSE(back.header("Date"));
  EXPECT_EQ(back.body, std::string("a\0b", 3));
  EXPECT_THROW((void)server::decode_response("r1 3:201"), CodecError);
}

struct SqliteServer : ::testing::Test {
  sqlite::TempDir dir;
  SqliteClaims claims{dir.file("api.db")};
};

TEST_F(SqliteServer, SixteenConcurrentRequestsRunTheHandlerOnce) {
  sixteen_concurrent_requests_run_the_handler_once(claims);
}

TEST_F(SqliteServer, AKeyReusedWithAnotherRequestIsRefused) {
  a_key_reused_with_another_request_is_refused(claims);
}

TEST_F(SqliteServer, KilledAfterCommitReplaysOnRetry) {
  killed_after_commit_replays_on_retry(claims, claims.path, "idemgate_log");
}

TEST_F(SqliteServer, KilledBeforeCommitLeavesNothing) {
  killed_before_commit_leaves_nothing(claims, claims.path, "idemgate_log");
}

TEST_F(SqliteServer, AHandlerThrowingUnreadableBytesGivesItsKeyBack) {
  a_handler_throwing_unreadable_bytes_gives_its_key_back(claims);
}

TEST_F(SqliteServer, KeysExpireAndRetentionPurgesThem) {
  keys_expire_and_retention_purges_them(claims);
}

TEST_F(SqliteServer, KeysThatNeverCompletedFreeAfterTheirLifetime) {
  keys_that_never_completed_free_after_their_lifetime(claims);
}

TEST_F(SqliteServer, ABodyOverTheLimitIs413AndRunsAndKeepsNothing) {
  server::EndpointOptions options;
  options.max_body_bytes = 64;
  InProcessClaims<SqliteClaims> api(claims, options);
  const std::string fits = R"({"item":")" + std::string(64 - 11, 'x') + R"("})";
  ASSERT_EQ(fits.size(), 64u);
  const auto too_large = post_claim(api.port(), "\"k-large\"", fits + " ");
  ASSERT_TRUE(too_large);
  EXPECT_EQ(too_large->status, 413);
  EXPECT_EQ(too_large->get_header_value("Content-Type"), "application/problem+json");
  EXPECT_NE(too_large->body.find("request-too-large"), std::string::npos) << too_large->body;
  EXPECT_NE(too_large->body.find("at most 64 bytes"), std::string::npos) << too_large->body;
  EXPECT_EQ(api.handler_runs(), 0);
  EXPECT_FALSE(
      api.endpoint().store().find(api.endpoint().log_key("acme", "POST", "/claims", "k-large")))
      << "nothing of a refused request is kept";
  const auto at_the_limit = post_claim(api.port(), "\"k-large\"", fits);
  ASSERT_TRUE(at_the_limit);
  EXPECT_EQ(at_the_limit->status, 201) << at_the_limit->body;

  // The default: 1 MiB.
  InProcessClaims<SqliteClaims> defaults(claims, {});
  const auto over_a_mebibyte = post_claim(defaults.port(), "\"k-huge\"",
                                          R"({"item":")" + std::string(1 << 20, 'y') + R"("})");
  ASSERT_TRUE(over_a_mebibyte);
  EXPECT_EQ(over_a_mebibyte->status, 413);
  for (const std::size_t refused : {std::size_t{0}, (std::size_t{64} << 20) + 1})
    EXPECT_THROW((server::Endpoint{"claims.api", claims.open(),
                                   [&] {
                                     server::EndpointOptions o;
                                     o.max_body_bytes = refused;
                                     return o;
                                   }()}),
                 std::invalid_argument)
        << refused;
}

// What cpp-httplib hands the endpoint, as docs/server-side.md's table says: version 0.11
// (Debian 12's) percent-decodes header values before any adapter sees them, so "X-%41" and "X-A"
// arrive as one key, and a second, empty header line is dropped. This fails the day the library
// stops decoding, which is when the table must change.
TEST_F(SqliteServer, BehindCppHttplibKeysArriveAsTheLibraryDecodedThem) {
  InProcessClaims<SqliteClaims> api(claims, {});
  const auto encoded = post_claim(api.port(), "\"X-%41\"", R"({"n":1})");
  const auto plain = post_claim(api.port(), "\"X-A\"", R"({"n":2})");
  ASSERT_TRUE(encoded && plain);
  EXPECT_EQ(encoded->status, 201);
  const bool decodes = std::string_view(CPPHTTPLIB_VERSION).substr(0, 5) == "0.11.";
  if (decodes) {
    EXPECT_EQ(plain->status, 422) << "0.11 decodes %41: one key, another request";
    const auto quoted = post_claim(api.port(), "\"q-%22\"", R"({"n":3})");
    ASSERT_TRUE(quoted);
    EXPECT_EQ(quoted->status, 400) << "%22 arrives as a bare quote inside the sf-string";
  } else {
    EXPECT_EQ(plain->status, 201) << "header values as sent: two keys";
  }
  // A second, empty key line, written byte for byte (a client library might drop it).
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<std::uint16_t>(api.port()));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  const std::string body = R"({"n":4})";
  const std::string request =
      "POST /claims HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Client: acme\r\n"
      "Idempotency-Key: \"b-3\"\r\nIdempotency-Key: \r\nContent-Type: application/json\r\n"
      "Content-Length: " +
      std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
  ASSERT_EQ(::send(fd, request.data(), request.size(), 0), static_cast<ssize_t>(request.size()));
  std::string answer;
  char buffer[4096];
  for (ssize_t n; (n = ::recv(fd, buffer, sizeof buffer, 0)) > 0;)
    answer.append(buffer, static_cast<std::size_t>(n));
  ::close(fd);
  if (decodes)
    EXPECT_EQ(answer.substr(0, 12), "HTTP/1.1 201") << "0.11 drops the empty line: " << answer;
  else
    EXPECT_EQ(answer.substr(0, 12), "HTTP/1.1 400") << "two lines are refused: " << answer;
}

TEST_F(SqliteServer, AMissingKeyIs400AndRunsNothing) {
  InProcessClaims<SqliteClaims> api(claims, {});
  const auto r = post_claim(api.port(), "", R"({"n":1})");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(r->get_header_value("Content-Type"), "application/problem+json");
  EXPECT_NE(r->body.find("idempotency-key-missing"), std::string::npos);
  EXPECT_EQ(api.handler_runs(), 0);
}

TEST_F(SqliteServer, AKeyNotRequiredRunsEachRequestWithoutOne) {
  server::EndpointOptions options;
  options.key_required = false;
  InProcessClaims<SqliteClaims> api(claims, options);
  EXPECT_EQ(post_claim(api.port(), "", R"({"n":1})")->body, R"({"claim":1})");
  EXPECT_EQ(post_claim(api.port(), "", R"({"n":1})")->body, R"({"claim":2})");
}

TEST_F(SqliteServer, AMalformedKeyOrBodyIs400AndRunsNothing) {
  InProcessClaims<SqliteClaims> api(claims, {});
  const auto key = post_claim(api.port(), "\"unclosed", R"({"n":1})");
  ASSERT_TRUE(key);
  EXPECT_EQ(key->status, 400);
  EXPECT_NE(key->body.find("idempotency-key-malformed"), std::string::npos);
  const auto longer = post_claim(api.port(), std::string(300, 'k'), R"({"n":1})");
  EXPECT_EQ(longer->status, 400);
  const auto twice = post_claim(api.port(), "\"dup\"", R"({"amount":1,"amount":100})");
  ASSERT_TRUE(twice);
  EXPECT_EQ(twice->status, 400);
  EXPECT_NE(twice->body.find("appears twice"), std::string::npos);
  EXPECT_EQ(api.handler_runs(), 0);
}

TEST_F(SqliteServer, TwoKeyHeaderLinesAre400AndRunNothing) {
  InProcessClaims<SqliteClaims> api(claims, {});
  httplib::Client c("127.0.0.1", api.port());
  const auto r = c.Post(
      "/claims", {{"X-Client", "acme"}, {"Idempotency-Key", "\"a\""}, {"Idempotency-Key", "\"b\""}},
      R"({"n":1})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_NE(r->body.find("idempotency-key-malformed"), std::string::npos);
  EXPECT_EQ(api.handler_runs(), 0);
}

TEST_F(SqliteServer, KeysAreScopedPerClient) {
  InProcessClaims<SqliteClaims> api(claims, {});
  const auto acme = post_claim(api.port(), "\"same\"", R"({"n":1})", "acme");
  const auto other = post_claim(api.port(), "\"same\"", R"({"n":2})", "globex");
  ASSERT_TRUE(acme && other);
  EXPECT_EQ(acme->body, R"({"claim":1})");
  EXPECT_EQ(other->status, 201);
  EXPECT_EQ(other->body, R"({"claim":2})");
  EXPECT_EQ(other->get_header_value("Idempotent-Replayed"), "");
}

TEST_F(SqliteServer, AReplayCarriesTheStoredHeadersOnly) {
  InProcessClaims<SqliteClaims> api(claims, {});
  const auto first = post_claim(api.port(), "bare-key", R"({"n":1})");
  ASSERT_TRUE(first);
  EXPECT_EQ(first->get_header_value("X-Not-Stored"), "first-answer-only");
  EXPECT_EQ(first->get_header_value("Idempotent-Replayed"), "");
  const auto replay = post_claim(api.port(), "\"bare-key\"", R"({"n":1})");
  ASSERT_TRUE(replay);
  EXPECT_EQ(replay->status, 201);
  EXPECT_EQ(replay->get_header_value("Idempotent-Replayed"), "true");
  EXPECT_EQ(replay->get_header_value("Location"), "/claims/1");
  EXPECT_EQ(replay->get_header_value("Content-Type"), "application/json");
  EXPECT_EQ(replay->get_header_value("X-Not-Stored"), "");
}

// A handler's 4xx after validation is stored with its writes; a 5xx and a throw roll its writes
// back and store nothing, so the retry runs it again.
TEST_F(SqliteServer, ClientErrorsAreStoredServerErrorsAndThrowsAreNot) {
  auto store = claims.open();
  store.migrate();
  claims.create();
  server::Endpoint endpoint{"claims.api", store};
  int runs = 0;
  int status = 409;
  const auto handler = [&](SqliteTransaction& tx, const server::Request& r) {
    ++runs;
    SqliteClaims::insert(tx, r.client);
    if (status == 0) throw std::runtime_error("the handler broke");
    return server::Response{status, {{"Content-Type", "text/plain"}}, "answer"};
  };
  server::Request request{"POST", "/claims", "\"k\"", "text/plain", "body", "acme", ""};
  EXPECT_EQ(endpoint.handle(request, handler).status, 409);
  const auto replay = endpoint.handle(request, handler);
  EXPECT_EQ(replay.status, 409);
  EXPECT_EQ(replay.header("Idempotent-Replayed"), "true");
  EXPECT_EQ(runs, 1);
  EXPECT_EQ(claims.count(), 1);

  request.idempotency_key = "\"k5\"";
  status = 503;
  EXPECT_EQ(endpoint.handle(request, handler).status, 503);
  status = 0;
  const auto thrown = endpoint.handle(request, handler);
  EXPECT_EQ(thrown.status, 500);
  EXPECT_EQ(thrown.header("Content-Type"), "application/problem+json");
  EXPECT_EQ(claims.count(), 1);
  status = 201;
  const auto ran = endpoint.handle(request, handler);
  EXPECT_EQ(ran.status, 201);
  EXPECT_FALSE(ran.header("Idempotent-Replayed"));
  EXPECT_EQ(runs, 4);
  EXPECT_EQ(claims.count(), 2);
}

TEST_F(SqliteServer, AProjectionChoosesWhatTheFingerprintCompares) {
  auto store = claims.open();
  store.migrate();
  server::EndpointOptions options;
  options.canonical = [](const server::Request& r) {
    return server::CanonicalJson{true, r.body.substr(0, r.body.find('|')), {}};
  };
  server::Endpoint endpoint{"claims.api", store, options};
  const auto handler = [](SqliteTransaction&, const server::Request& r) {
    return server::Response{200, {}, r.body};
  };
  server::Request request{"POST", "/x", "\"k\"", "text/plain", "same|trace-1", "acme", ""};
  EXPECT_EQ(endpoint.handle(request, handler).body, "same|trace-1");
  request.body = "same|trace-2";
  EXPECT_EQ(endpoint.handle(request, handler).header("Idempotent-Replayed"), "true");
  request.body = "other|trace-2";
  EXPECT_EQ(endpoint.handle(request, handler).status, 422);
}

// The query string counts where EndpointOptions::query says, in its canonical form, over a real
// socket behind cpp-httplib.
TEST_F(SqliteServer, TheQueryCountsWhereTheOptionSays) {
  const auto post = [](int port, const std::string& target, const std::string& key) {
    httplib::Client c("127.0.0.1", port);
    return c.Post(target, {{"X-Client", "acme"}, {"Idempotency-Key", key}}, R"({"item":"reefer"})",
                  "application/json");
  };
  const auto replayed = [](const httplib::Result& r) {
    return r && r->status == 201 && r->get_header_value("Idempotent-Replayed") == "true";
  };
  const auto ran = [](const httplib::Result& r) {
    return r && r->status == 201 && !r->has_header("Idempotent-Replayed");
  };

  {  // The default: the query counts nowhere.
    InProcessClaims<SqliteClaims> api(claims, {});
    EXPECT_EQ(api.endpoint().options().query, server::QueryRole::ignored);
    EXPECT_TRUE(ran(post(api.port(), "/claims?currency=EUR", "\"k-ignored\"")));
    EXPECT_TRUE(replayed(post(api.port(), "/claims?currency=USD", "\"k-ignored\"")));
    EXPECT_EQ(api.handler_runs(), 1);
  }
  {  // In the fingerprint: another query is a conflict; the same one written otherwise is not.
    server::EndpointOptions options;
    options.query = server::QueryRole::fingerprint;
    InProcessClaims<SqliteClaims> api(claims, options);
    EXPECT_TRUE(ran(post(api.port(), "/claims?currency=EUR&amount=10", "\"k-print\"")));
    EXPECT_TRUE(replayed(post(api.port(), "/claims?amount=1%30&&currency=EU%52", "\"k-print\"")));
    const auto other = post(api.port(), "/claims?currency=USD&amount=10", "\"k-print\"");
    ASSERT_TRUE(other);
    EXPECT_EQ(other->status, 422) << other->body;
    EXPECT_EQ(post(api.port(), "/claims", "\"k-print\"")->status, 422) << "no query is another";
    EXPECT_EQ(api.handler_runs(), 1);
    const auto kept =
        api.endpoint().store().find(api.endpoint().log_key("acme", "POST", "/claims", "k-print"));
    ASSERT_TRUE(kept.has_value());
    EXPECT_EQ(kept->request, "?amount=10&currency=EUR\n{\"item\":\"reefer\"}")
        << "the log keeps the canonical query before the body";
    EXPECT_TRUE(ran(post(api.port(), "/claims", "\"k-bare\"")));
    EXPECT_EQ(api.endpoint()
                  .store()
                  .find(api.endpoint().log_key("acme", "POST", "/claims", "k-bare"))
                  ->request,
              "{\"item\":\"reefer\"}")
        << "a request without a query keeps its body alone, as before the option";
  }
  {  // In the scope: another query is another request.
    server::EndpointOptions options;
    options.query = server::QueryRole::scope;
    InProcessClaims<SqliteClaims> api(claims, options);
    EXPECT_TRUE(ran(post(api.port(), "/claims?currency=EUR", "\"k-scope\"")));
    EXPECT_TRUE(ran(post(api.port(), "/claims?currency=USD", "\"k-scope\"")));
    EXPECT_TRUE(replayed(post(api.port(), "/claims?currency=%45UR", "\"k-scope\"")));
    EXPECT_EQ(api.handler_runs(), 2);
    EXPECT_TRUE(api.endpoint().store().find(
        api.endpoint().log_key("acme", "POST", "/claims?currency=USD", "k-scope")))
        << "a lookup names the query in the target";
  }
}

TEST(CanonicalQuery, OrderAndEscapesDoNotMatterValuesDo) {
  EXPECT_EQ(server::canonical_query("b=2&a=%41"), "a=A&b=2");
  EXPECT_EQ(server::canonical_query("a=A&b=2"), "a=A&b=2");
  EXPECT_EQ(server::canonical_query("&&a=1&"), "a=1");
  EXPECT_EQ(server::canonical_query("q=a%26b%3Dc"), "q=a%26b%3Dc") << "& and = in a value stay";
  EXPECT_NE(server::canonical_query("q=a%26b%3Dc"), server::canonical_query("q=a&b=c"));
  EXPECT_NE(server::canonical_query("a"), server::canonical_query("a="));
  EXPECT_EQ(server::canonical_query("x=%zz"), "x=%25zz") << "a malformed escape is kept as text";
  EXPECT_EQ(server::canonical_query(""), "");
}

// The lookup of a consumer built with idemgate: its HttpDownstream's lookup finds what the
// endpoint stored under the key it sent, and its Reconciler commits it without claiming again.
struct ClaimsMapping {
  using request_type = std::string;
  using outcome_type = std::string;
  HttpCall claim_call(const std::string& body) const { return {"POST", "/claims", body}; }
  HttpCall lookup_call(const Key& key) const {
    return {"GET", "/claims?idempotency_key=" + key.hex()};
  }
  std::optional<std::string> parse_outcome(std::string_view body) const {
    return std::string(body);
  }
};

TEST_F(SqliteServer, AConsumersReconcilerFindsTheResponseByKey) {
  InProcessClaims<SqliteClaims> api(claims, {});
  HttpOptions http;
  http.headers = {{"X-Client", "acme"}};
  HttpDownstream<ClaimsMapping> downstream{"http://127.0.0.1:" + std::to_string(api.port()), http};
  SqliteStore consumer_store{dir.file("consumer.db")};
  consumer_store.migrate();
  int committed = 0;
  Gate gate{"consumer.claims", consumer_store, downstream,
            [&](SqliteTransaction&, const std::string&, const std::string&) { ++committed; }};
  const Key key = derive_key("consumer.claims", "event-1");
  EXPECT_TRUE(downstream.lookup(key).not_found());
  // The consumer reserved, its claim landed, and it died before committing.
  const auto fp = detail::sha256("{\"n\":1}");
  Fingerprint fingerprint{};
  std::copy(fp.begin(), fp.end(), fingerprint.begin());
  ASSERT_EQ(gate.store().reserve(key, fingerprint, "{\"n\":1}", std::chrono::milliseconds(1)).kind,
            Reservation::Kind::acquired);
  const auto landed = downstream.claim("{\"n\":1}", key);
  ASSERT_TRUE(landed.ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ReconcilerOptions options;
  options.stale_after = std::chrono::milliseconds(1);
  Reconciler reconciler{gate, options};
  const auto report = reconciler.run_once();
  EXPECT_EQ(report.found, 1u) << report.first_error;
  EXPECT_EQ(api.handler_runs(), 1);
  EXPECT_EQ(committed, 1);
  const auto row = gate.store().find(key);
  ASSERT_TRUE(row);
  EXPECT_EQ(row->status, RecordStatus::committed);
  EXPECT_EQ(row->result, R"({"claim":1})");
}

}  // namespace
