#include <idemgate/outcome.hpp>

#include <gtest/gtest.h>

#include <string>

using idemgate::Result;
using idemgate::Status;

TEST(Status, OnlyRetryAsksForRedelivery) {
  for (Status s : {Status::processed, Status::duplicate, Status::in_flight, Status::conflict,
                   Status::failed, Status::escalated, Status::lost_lease})
    EXPECT_TRUE(idemgate::should_ack(s)) << to_string(s);
  EXPECT_FALSE(idemgate::should_ack(Status::retry));
}

TEST(Status, NamesAreStable) {
  EXPECT_EQ(to_string(Status::processed), "processed");
  EXPECT_EQ(to_string(Status::in_flight), "in_flight");
  EXPECT_EQ(to_string(Status::lost_lease), "lost_lease");
}

TEST(Result, CarriesOutcomeOrReason) {
  auto done = Result<std::string>::with(Status::processed, "slot-1");
  EXPECT_TRUE(done.has_outcome());
  EXPECT_EQ(done.outcome(), "slot-1");
  EXPECT_TRUE(done.should_ack());
  auto again = Result<std::string>::because(Status::retry, "503");
  EXPECT_FALSE(again.has_outcome());
  EXPECT_EQ(again.reason(), "503");
  EXPECT_FALSE(again.should_ack());
  EXPECT_THROW((void)again.outcome(), std::logic_error);
}

TEST(ClaimResult, TellsTheThreeAnswersApart) {
  idemgate::ClaimResult<int> ok = 7;
  idemgate::ClaimResult<int> permanent = idemgate::PermanentFailure{"unknown container"};
  idemgate::ClaimResult<int> transient = idemgate::TransientFailure{"503"};
  EXPECT_TRUE(ok.ok());
  EXPECT_EQ(ok.outcome(), 7);
  EXPECT_TRUE(permanent.permanent());
  EXPECT_EQ(permanent.reason(), "unknown container");
  EXPECT_TRUE(transient.transient());
  EXPECT_EQ(transient.reason(), "503");
}
