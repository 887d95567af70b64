// The main job, run as a user runs it: the replay binary, its table, its JSON and its exit
// status, on SQLite and on PostgreSQL, and its answers to bad input.

#include "support/child_process.hpp"
#include "support/postgres.hpp"

#include <gtest/gtest.h>
#include <common/json.hpp>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

using idemgate::test::ChildProcess;

namespace {

struct Replayed {
  std::string out;
  int status = 0;
};

Replayed replay(std::vector<std::string> args) {
  args.insert(args.begin(), ECT_DELTA_REPLAY_PATH);
  ChildProcess child(args);
  Replayed run;
  // The table starts with a blank line: read to the end of the output, not to a blank line.
  for (std::string line; child.read_until_eof(line);) run.out += line + '\n';
  run.status = child.wait();
  return run;
}

/// One number from the JSON object of one run ("naive" or "gated"); -1 when no line of the
/// output is a JSON object holding it.
long field(const std::string& out, const std::string& run, const std::string& name) {
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    const auto document = example::json::parse(line);
    if (!document || !document->is_object() || !document->contains(run)) continue;
    return static_cast<long>(example::json::integer_member(document->at(run), name).value_or(-1));
  }
  return -1;
}

/// The story's Monday: 87 deliveries (two of them redeliveries after a crash between the slot
/// claim and the TMS write) of notifications about 39 containers, and 87 slot appointments.
void expect_monday(const std::string& json) {
  EXPECT_EQ(field(json, "naive", "containers"), 39);
  EXPECT_EQ(field(json, "naive", "deliveries"), 87) << "as many as that Monday, crashes included";
  EXPECT_EQ(field(json, "naive", "slots_claimed"), 87) << "one new slot per delivery";
  EXPECT_EQ(field(json, "naive", "bookings"), 85) << "the two crashed deliveries wrote nothing";
  EXPECT_EQ(field(json, "naive", "ghost_slots"), 87 - 39);
  // The story's fee: EUR 4,250 for the 71 appointments cancelled that Monday.
  EXPECT_EQ(field(json, "naive", "cancellation_cost_eur"), std::lround((87 - 39) * 4250.0 / 71.0));
  EXPECT_EQ(field(json, "gated", "deliveries"), field(json, "naive", "deliveries"));
  EXPECT_EQ(field(json, "gated", "slots_claimed"), 39);
  EXPECT_EQ(field(json, "gated", "bookings"), 39);
  EXPECT_EQ(field(json, "gated", "ghost_slots"), 0);
  EXPECT_EQ(field(json, "gated", "cancellation_cost_eur"), 0);
  EXPECT_EQ(field(json, "gated", "reconciled"), 2) << "the two crashes are reconciled";
  EXPECT_EQ(field(json, "gated", "duplicates_blocked"), field(json, "gated", "deliveries") - 39);
}

}  // namespace

TEST(EctDeltaReplay, GatedRunOnSqliteEndsOneSlotAndOneBookingPerContainer) {
  const Replayed run = replay({"--json", "--seed", "11"});
  EXPECT_EQ(run.status, 0) << run.out;
  expect_monday(run.out);
}

TEST(EctDeltaReplay, GatedRunOnPostgresEndsOneSlotAndOneBookingPerContainer) {
  const std::string uri = idemgate::test::pg_uri();
  ASSERT_FALSE(uri.empty());
  const Replayed run = replay({"--json", "--store", uri});
  EXPECT_EQ(run.status, 0) << run.out;
  expect_monday(run.out);
}

TEST(EctDeltaReplay, PrintsTheSideBySideTable) {
  const Replayed run = replay({});
  EXPECT_EQ(run.status, 0);
  for (const char* row :
       {"slots claimed at the terminal", "TMS bookings", "ghost slots", "duplicates blocked",
        "reconciled after a crash", "cost of cancelling ghosts"})
    EXPECT_NE(run.out.find(row), std::string::npos) << row << "\n" << run.out;
}

TEST(EctDeltaReplay, ReadmeShowsTheTableTheReplayPrints) {
  const Replayed run = replay({});
  ASSERT_EQ(run.status, 0);
  std::ifstream file(IDEMGATE_SOURCE_DIR "/README.md");
  const std::string readme((std::istreambuf_iterator<char>(file)),
                           std::istreambuf_iterator<char>());
  ASSERT_FALSE(readme.empty());
  // The table as printed, without the blank lines around it.
  const auto first = run.out.find_first_not_of('\n');
  const auto last = run.out.find_last_not_of('\n');
  ASSERT_NE(first, std::string::npos);
  const std::string table = run.out.substr(first, last - first + 1);
  EXPECT_NE(readme.find("```\n" + table + "\n```"), std::string::npos)
      << "README.md does not show the table scripts/demo prints; it prints:\n"
      << table;
}

TEST(EctDeltaReplay, SeedChangesTheDeliveryOrderNotTheOutcome) {
  for (const char* seed : {"1", "2", "3"}) {
    const Replayed run = replay({"--json", "--seed", seed});
    EXPECT_EQ(run.status, 0) << "seed " << seed;
    expect_monday(run.out);
  }
}

TEST(EctDeltaReplay, TerminalThatIgnoresKeysIsEscalatedNotClaimed) {
  const Replayed run = replay({"--json", "--terminal-ignores-keys"});
  EXPECT_EQ(run.status, 1);
  EXPECT_EQ(field(run.out, "gated", "slots_claimed"), 0) << run.out;
  EXPECT_EQ(field(run.out, "gated", "bookings"), 0);
}

TEST(EctDeltaReplay, UnreachableTerminalIsAClearErrorWithNothingBooked) {
  const Replayed run = replay({"--terminal", "http://127.0.0.1:9"});
  EXPECT_EQ(run.status, 3);
  EXPECT_EQ(run.out, "");
}

TEST(EctDeltaReplay, StoreUriThatDoesNotParseIsRefused) {
  EXPECT_EQ(replay({"--store", "mysql://db"}).status, 2);
  EXPECT_EQ(replay({"--store", "sqlite:"}).status, 2);
  EXPECT_EQ(replay({"--seed", "x"}).status, 2);
}

TEST(EctDeltaReplay, CorruptSqliteFileIsRefusedWithNothingBooked) {
  const std::string path = ::testing::TempDir() + "corrupt-replay.db";
  {
    std::ofstream garbage(path, std::ios::binary);
    for (int i = 0; i < 4096; ++i) garbage.put(static_cast<char>((i * 7919) & 0xff));
  }
  const Replayed run = replay({"--json", "--store", "sqlite:" + path});
  EXPECT_EQ(run.status, 2);
  EXPECT_EQ(run.out.find("\"gated\""), std::string::npos) << "no gated run was reported";
  std::remove(path.c_str());
}
