// What a broker consumer does with each answer of the gate: only retry is redelivered, and only
// until the delivery count reaches the poison limit; escalated and conflicting messages are
// dead-lettered; everything else is acknowledged.

#include <idemgate/consumer/disposition.hpp>

#include <gtest/gtest.h>

using idemgate::Status;
using idemgate::consumer::Disposition;
using idemgate::consumer::disposition;
using idemgate::consumer::PoisonPolicy;

TEST(Disposition, EveryAnswerThatTheGateSettledIsAcknowledged) {
  for (Status s : {Status::processed, Status::duplicate, Status::in_flight, Status::failed,
                   Status::lost_lease}) {
    EXPECT_EQ(disposition(s, 1), Disposition::ack) << to_string(s);
    EXPECT_EQ(disposition(s, 1000), Disposition::ack) << to_string(s);
  }
}

TEST(Disposition, RetryIsRedeliveredUntilTheDeliveryCountReachesTheLimit) {
  EXPECT_EQ(disposition(Status::retry, 1), Disposition::redeliver);
  EXPECT_EQ(disposition(Status::retry, 9), Disposition::redeliver);
  EXPECT_EQ(disposition(Status::retry, 10), Disposition::dead_letter);
  EXPECT_EQ(disposition(Status::retry, 1, PoisonPolicy{.max_deliveries = 1}),
            Disposition::dead_letter);
  EXPECT_EQ(disposition(Status::retry, 999, PoisonPolicy{.max_deliveries = 1000}),
            Disposition::redeliver);
}

TEST(Disposition, PoisonAndConflictsAreDeadLetteredAtOnce) {
  EXPECT_EQ(disposition(Status::escalated, 1), Disposition::dead_letter);
  EXPECT_EQ(disposition(Status::conflict, 1), Disposition::dead_letter);
}

TEST(Disposition, NamesAreStable) {
  EXPECT_EQ(to_string(Disposition::ack), "ack");
  EXPECT_EQ(to_string(Disposition::redeliver), "redeliver");
  EXPECT_EQ(to_string(Disposition::dead_letter), "dead-letter");
}
