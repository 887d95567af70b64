#include <idemgate/webhook/contract.hpp>

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

using idemgate::ContractCheck;
using idemgate::ContractRejection;
using idemgate::EventContract;

TEST(EventContract, DeclaredTypesAreAccepted) {
  const EventContract contract{"message.sent", "message.received"};
  const ContractCheck sent = contract.check("message.sent");
  EXPECT_TRUE(sent.ok());
  EXPECT_TRUE(sent.message().empty());
  EXPECT_TRUE(contract.check("message.received"));
  EXPECT_TRUE(contract.accepts("message.received"));
}

TEST(EventContract, UndeclaredTypeIsRejectedAsUnknownWithAReason) {
  const EventContract contract{"message.sent", "message.received"};
  const ContractCheck check = contract.check("message.deleted");
  ASSERT_FALSE(check.ok());
  EXPECT_EQ(check.rejection(), ContractRejection::unknown_event_type);
  EXPECT_NE(check.message().find("\"message.deleted\""), std::string::npos) << check.message();
  EXPECT_NE(check.message().find("message.received, message.sent"), std::string::npos)
      << check.message();
  EXPECT_NE(check.message().find("not processed"), std::string::npos) << check.message();
  EXPECT_FALSE(contract.accepts("message.deleted"));
}

TEST(EventContract, TypesCompareExactly) {
  const EventContract contract{"message.sent"};
  for (const std::string_view near_miss : {"Message.Sent", "message.sent ", " message.sent",
                                           "message", "message.sent.v2", "message.sen"}) {
    const ContractCheck check = contract.check(near_miss);
    ASSERT_FALSE(check.ok()) << near_miss;
    EXPECT_EQ(check.rejection(), ContractRejection::unknown_event_type) << near_miss;
  }
}

TEST(EventContract, EventWithoutATypeIsRejected) {
  const EventContract contract{"message.sent"};
  const ContractCheck check = contract.check("");
  ASSERT_FALSE(check.ok());
  EXPECT_EQ(check.rejection(), ContractRejection::unknown_event_type);
  EXPECT_NE(check.message().find("without a type"), std::string::npos) << check.message();
}

TEST(EventContract, RejectionMessageCannotForgeLogLines) {
  const EventContract contract{"message.sent"};
  const ContractCheck check = contract.check("x\r\nINFO accepted message.sent");
  ASSERT_FALSE(check.ok());
  EXPECT_EQ(check.message().find('\n'), std::string::npos) << check.message();
  EXPECT_EQ(check.message().find('\r'), std::string::npos) << check.message();
}

TEST(EventContract, EmptyContractIsRefused) {
  EXPECT_THROW(EventContract({}), std::invalid_argument);
  EXPECT_THROW(EventContract(std::vector<std::string>{}), std::invalid_argument);
}

TEST(EventContract, EmptyDeclaredTypeIsRefused) {
  EXPECT_THROW(EventContract({"message.sent", ""}), std::invalid_argument);
}

TEST(EventContract, CanBeDeclaredFromAnyRangeOfStrings) {
  const std::vector<std::string> configured{"invoice.paid", "invoice.voided", "invoice.paid"};
  const EventContract contract(configured);
  EXPECT_TRUE(contract.check("invoice.paid").ok());
  EXPECT_TRUE(contract.check("invoice.voided").ok());
  EXPECT_FALSE(contract.check("invoice.created").ok());
  EXPECT_EQ(contract.types().size(), 2U);
}

TEST(EventContract, AcceptedCheckHasNoRejection) {
  const EventContract contract{"message.sent"};
  EXPECT_THROW((void)contract.check("message.sent").rejection(), std::logic_error);
}

TEST(EventContract, RejectionHasAStableName) {
  EXPECT_EQ(idemgate::to_string(ContractRejection::unknown_event_type), "unknown_event_type");
}
