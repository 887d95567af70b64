// What a consumer does with a batch (consumer::decide): a body the decode function refuses or
// throws for is dead-lettered without reaching the gate; the others go through one
// process_batch and get the disposition of their answer and delivery count; when the gate
// throws (the store failed) or is stopping, every one is redelivered whatever its count.

#include <brokers/in_process.hpp>
#include <idemgate/consumer/decide.hpp>

#include <gtest/gtest.h>

#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using idemgate::Status;
using idemgate::consumer::decide;
using idemgate::consumer::Disposition;
using idemgate::consumer::PoisonPolicy;
using idemgate::consumer::Received;
namespace brokers = idemgate::test::brokers;

/// A gate whose store is down: process_batch throws.
struct BrokenGate {
  using request_type = std::string;
  int calls = 0;
  idemgate::BatchResult<std::string> process_batch(
      std::span<const idemgate::BatchMessage<std::string>>) {
    ++calls;
    throw idemgate::StoreError("the database is down");
  }
};

TEST(ConsumerDecide, RefusedBodiesAreDeadLetteredAndTheRestGoThroughTheGateAsOneBatch) {
  brokers::RecordingGate gate;
  auto decode = [](std::string_view body) {
    if (body == "throws") throw std::runtime_error("bad JSON");
    return brokers::decode(body);
  };
  const std::vector<Received> batch{{"n1|v", 1},   {"no event", 1}, {"n2|v", 1},
                                    {"throws", 4}, {"n1|v", 2},     {"poison|v", 3}};
  const auto settled = decide(gate, decode, std::span<const Received>(batch), PoisonPolicy{3});
  ASSERT_EQ(settled.size(), 6u);
  EXPECT_EQ(gate.batches(), std::vector<std::size_t>{4}) << "one process_batch of the four events";
  EXPECT_EQ(settled[0].status, Status::processed);
  EXPECT_EQ(settled[0].disposition, Disposition::ack);
  EXPECT_EQ(settled[1].status, std::nullopt);
  EXPECT_EQ(settled[1].disposition, Disposition::dead_letter);
  EXPECT_FALSE(settled[1].reason.empty());
  EXPECT_EQ(settled[2].disposition, Disposition::ack);
  EXPECT_EQ(settled[3].disposition, Disposition::dead_letter);
  EXPECT_NE(settled[3].reason.find("bad JSON"), std::string::npos);
  EXPECT_EQ(settled[4].status, Status::duplicate);
  EXPECT_EQ(settled[4].deliveries, 2u);
  EXPECT_EQ(settled[5].status, Status::retry);
  EXPECT_EQ(settled[5].disposition, Disposition::dead_letter) << "retry on the limit's delivery";
  EXPECT_EQ(settled[0].body, "n1|v");
}

TEST(ConsumerDecide, AStoreFailureRedeliversEveryEventWhateverItsCount) {
  BrokenGate gate;
  auto decode = &brokers::decode;
  const std::vector<Received> batch{{"n1|v", 1}, {"n2|v", 50}, {"no event", 50}};
  const auto settled = decide(gate, decode, std::span<const Received>(batch), PoisonPolicy{3});
  EXPECT_EQ(gate.calls, 1);
  EXPECT_EQ(settled[0].disposition, Disposition::redeliver);
  EXPECT_EQ(settled[1].disposition, Disposition::redeliver) << "not the message's fault";
  EXPECT_NE(settled[1].reason.find("the database is down"), std::string::npos);
  EXPECT_EQ(settled[1].status, std::nullopt);
  EXPECT_EQ(settled[2].disposition, Disposition::dead_letter);
}

TEST(ConsumerDecide, AStoppingGatesRetryIsRedeliveredPastTheLimit) {
  brokers::RecordingGate gate;
  gate.gate().begin_stop();
  auto decode = &brokers::decode;
  const std::vector<Received> batch{{"n1|v", 9}};
  const auto settled = decide(gate, decode, std::span<const Received>(batch), PoisonPolicy{3});
  EXPECT_EQ(settled[0].status, Status::retry);
  EXPECT_EQ(settled[0].disposition, Disposition::redeliver);
  EXPECT_EQ(gate.ledger().claims_of("n1"), 0);
}

TEST(ConsumerDecide, NothingReachesTheGateWhenNoBodyIsAnEvent) {
  brokers::RecordingGate gate;
  auto decode = &brokers::decode;
  const std::vector<Received> batch{{"a", 1}, {"b", 1}};
  const auto settled = decide(gate, decode, std::span<const Received>(batch));
  EXPECT_TRUE(gate.batches().empty());
  EXPECT_EQ(settled[0].disposition, Disposition::dead_letter);
  EXPECT_EQ(settled[1].disposition, Disposition::dead_letter);
}

}  // namespace
