// Every way libpq accepts a password comes out hidden in messages: URI user info, URI query
// parameters (percent-encoded too), keyword/value pairs plain, quoted and escaped.

#include <idemgate/detail/postgres/connection_pool.hpp>

#include <gtest/gtest.h>

#include <string>

using idemgate::detail::redact_uri;

namespace {

// The redacted form keeps everything but the secret, and the secret appears nowhere in it.
void expect_redacted(const std::string& input, const std::string& expected,
                     const std::string& secret) {
  const std::string redacted = redact_uri(input);
  EXPECT_EQ(redacted, expected) << input;
  EXPECT_EQ(redacted.find(secret), std::string::npos) << redacted;
}

}  // namespace

TEST(RedactUri, UriUserInfoPasswordIsHidden) {
  expect_redacted("postgresql://app:s3cret@db.internal:5432/ledger",
                  "postgresql://app:***@db.internal:5432/ledger", "s3cret");
  expect_redacted("postgres://app:s3cret@db/ledger", "postgres://app:***@db/ledger", "s3cret");
  // Percent-encoded, and raw characters a careless URI leaves in: '@', '/', '?', ':'.
  expect_redacted("postgresql://app:p%40ss%2Fw0rd@db/ledger", "postgresql://app:***@db/ledger",
                  "w0rd");
  expect_redacted("postgresql://app:pa@ss/w:rd@db:5432/ledger?sslmode=require",
                  "postgresql://app:***@db:5432/ledger?sslmode=require", "ss/w:rd");
  expect_redacted("postgresql://app:pa?ss/w:rd@db/ledger?sslmode=require",
                  "postgresql://app:***@db/ledger?sslmode=require", "ss/w:rd");
  expect_redacted("postgresql://app:1234@db:5432/ledger", "postgresql://app:***@db:5432/ledger",
                  "1234");
  // A user without a password, and a host with a port but no user info, stay as they are.
  expect_redacted("postgresql://app@db:5432/ledger", "postgresql://app@db:5432/ledger", "***");
  expect_redacted("postgresql://db:5432/ledger?application_name=a@b",
                  "postgresql://db:5432/ledger?application_name=a@b", "***");
}

TEST(RedactUri, UriPasswordQueryParameterIsHiddenPercentEncodedOrNot) {
  expect_redacted("postgresql://db/ledger?password=s3cret&sslmode=require",
                  "postgresql://db/ledger?password=***&sslmode=require", "s3cret");
  expect_redacted("postgresql://db/ledger?sslmode=require&password=s3cret",
                  "postgresql://db/ledger?sslmode=require&password=***", "s3cret");
  expect_redacted("postgresql://db/ledger?password=se%20cr%26et&user=app",
                  "postgresql://db/ledger?password=***&user=app", "se%20cr");
  // libpq decodes parameter names too.
  expect_redacted("postgresql://db/ledger?pass%77ord=s3cret",
                  "postgresql://db/ledger?pass%77ord=***", "s3cret");
  expect_redacted("postgresql://db/ledger?%70%61ssword=s3cret&x=1",
                  "postgresql://db/ledger?%70%61ssword=***&x=1", "s3cret");
  expect_redacted("postgresql://db/ledger?sslpassword=k3y&password=s3cret",
                  "postgresql://db/ledger?sslpassword=***&password=***", "s3cret");
  EXPECT_EQ(redact_uri("postgresql://db/ledger?sslpassword=k3y").find("k3y"), std::string::npos);
  // Both places at once.
  expect_redacted("postgresql://app:one@db/ledger?password=two",
                  "postgresql://app:***@db/ledger?password=***", "one");
  EXPECT_EQ(redact_uri("postgresql://app:one@db/ledger?password=two").find("two"),
            std::string::npos);
}

TEST(RedactUri, KeywordValuePasswordIsHiddenPlainQuotedOrEscaped) {
  expect_redacted("host=db dbname=ledger password=s3cret user=app",
                  "host=db dbname=ledger password=*** user=app", "s3cret");
  expect_redacted("password=s3cret", "password=***", "s3cret");
  // Spaces around '='.
  expect_redacted("host=db password = s3cret user=app", "host=db password = *** user=app",
                  "s3cret");
  // Single-quoted, with spaces and escaped quotes and backslashes inside.
  expect_redacted(R"(host=db password='se cr\'et' user=app)", "host=db password=*** user=app",
                  "cr");
  expect_redacted(R"(password = 'a\\b c' dbname=ledger)", "password = *** dbname=ledger", "b c");
  // Unquoted with a backslash-escaped space.
  expect_redacted(R"(host=db password=se\ cret user=app)", "host=db password=*** user=app", "cret");
  expect_redacted("host=db sslpassword=k3y", "host=db sslpassword=***", "k3y");
  // A value that mentions "password=" is not a password, and stays.
  expect_redacted("application_name='password=x' host=db", "application_name='password=x' host=db",
                  "***");
}

TEST(RedactUri, TextLibpqCannotParseIsHiddenFromThereOn) {
  // An unquoted password with a space: libpq reads "cr" as the next keyword and fails.
  expect_redacted("host=db password=se cr", "host=db password=*** ***", "cr");
  // An unterminated quote.
  expect_redacted("host=db password='se cr", "host=db password=***", "se cr");
}

TEST(RedactUri, TextWithoutPasswordIsUnchanged) {
  for (const std::string text : {"sqlite:ledger.db", "mysql://db/ledger", "host=db dbname=ledger",
                                 "postgresql://db/ledger", ""})
    EXPECT_EQ(redact_uri(text), text);
  expect_redacted("mysql://app:s3cret@db/ledger", "mysql://app:***@db/ledger", "s3cret");
}
