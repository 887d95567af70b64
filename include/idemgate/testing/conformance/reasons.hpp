// SPDX-License-Identifier: MIT
// Conformance tests of the texts the log keeps (reasons, labels, mismatch sources): any bytes are
// stored, read back as the same valid UTF-8 text, and found again by what was first written.
#pragma once

#include "../../concepts.hpp"
#include "../../gate.hpp"
#include "../../record.hpp"
#include "../../store/log/text.hpp"
#include "../slot_request.hpp"
#include "fixture.hpp"

#include <gtest/gtest.h>

#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace idemgate::testing {

/// @cond

namespace detail {

/// A reason with what PostgreSQL refuses in text: bytes that are not UTF-8 (a body read as it
/// came) and an embedded NUL.
inline std::string unreadable_reason() {
  return std::string("unreadable input: \xff\xfe{\"id\":\x00\xc3(}", 29);
}

/// A slot API that refuses, or throws, with a reason holding any bytes.
class RefusingTerminal {
 public:
  using request_type = SlotRequest;
  using outcome_type = std::string;
  static constexpr bool honours_idempotency_key = true;

  enum class How { permanent, transient, throws };
  explicit RefusingTerminal(How how, std::string reason) : how_(how), reason_(std::move(reason)) {}

  /// Refuses as told.
  ClaimResult<std::string> claim(const SlotRequest&, const Key&) {
    ++calls;
    if (how_ == How::throws) throw std::runtime_error(reason_);
    if (how_ == How::permanent) return PermanentFailure{reason_};
    return TransientFailure{reason_};
  }
  /// Claims made.
  int calls = 0;

 private:
  How how_;
  std::string reason_;
};

}  // namespace detail

TYPED_TEST_P(StoreConformance, AReasonOfAnyBytesIsStoredReadBackAndFoundAgain) {
  const std::string unreadable = detail::unreadable_reason();
  const std::string huge(1 << 20, 'x');
  const std::string stored = idemgate::detail::stored_text(unreadable);
  EXPECT_TRUE(idemgate::detail::stored_as_is(stored));
  EXPECT_NE(stored.find("\\xff\\xfe"), std::string::npos) << stored;
  EXPECT_NE(stored.find("\\x00"), std::string::npos) << "the NUL is kept, shown, not a cut";

  const auto fp = idemgate::detail::sha256("MSKU1");
  const Key failed = detail::key_of("reason bytes", 0), parked = detail::key_of("reason bytes", 1),
            released = detail::key_of("reason bytes", 2);
  for (const Key& key : {failed, parked, released})
    ASSERT_EQ(this->store().reserve(key, fp, "MSKU1", 1min).kind, Reservation::Kind::acquired);
  EXPECT_EQ(this->store().fail(failed, 1, unreadable), CommitStatus::committed);
  EXPECT_EQ(this->store().escalate(parked, 1, huge), CommitStatus::committed);
  if constexpr (idemgate::explaining_store<typename TypeParam::Store>) {
    EXPECT_TRUE(this->store().release(released, 1, unreadable)) << "the key was not given back";
    EXPECT_EQ(this->store().find(released)->reason, stored);
  } else {
    EXPECT_TRUE(this->store().release(released, 1)) << "the key was not given back";
  }

  EXPECT_EQ(this->store().find(failed)->reason, stored);
  const std::string kept = this->store().find(parked)->reason;
  EXPECT_LE(kept.size(), max_stored_text);
  EXPECT_NE(kept.find("[cut: 1048576 bytes in all]"), std::string::npos);

  // The released key is free at once: the next delivery takes it over.
  EXPECT_EQ(this->store().reserve(released, fp, "MSKU1", 1min).kind, Reservation::Kind::taken_over);

  // Found again by the reason as the caller first wrote it, or as the log shows it.
  if constexpr (idemgate::operable_store<typename TypeParam::Store>) {
    ASSERT_FALSE(this->store().find(failed)->history.empty());
    EXPECT_EQ(this->store().find(failed)->history.back().reason, stored);
    RowQuery by_bytes;
    by_bytes.status = RecordStatus::failed;
    by_bytes.reason = unreadable;
    EXPECT_EQ(this->store().rows(by_bytes).size(), 1u);
    RowQuery as_shown;
    as_shown.status = RecordStatus::failed;
    as_shown.reason = stored;
    EXPECT_EQ(this->store().count(as_shown), 1);
    EXPECT_EQ(this->store().redrive_cause(unreadable, 10), 1u);
  }

  if constexpr (idemgate::monitored_store<typename TypeParam::Store>) {
    this->store().record_mismatch(failed, "a", "b", unreadable);
    const auto mismatches = this->store().mismatches(1);
    ASSERT_EQ(mismatches.size(), 1u);
    EXPECT_EQ(mismatches[0].source, stored);
  }
}

TYPED_TEST_P(StoreConformance, ALabelOfAnyBytesIsStoredAndFindsItsRow) {
  if constexpr (!idemgate::labelling_store<typename TypeParam::Store> ||
                !idemgate::operable_store<typename TypeParam::Store>) {
    GTEST_SKIP() << "not an idemgate::labelling_store and idemgate::operable_store";
  } else {
    const std::string label = "order \xff\xfe 17";
    const Key key = detail::key_of("label bytes");
    ASSERT_EQ(this->store().reserve(key, idemgate::detail::sha256("r"), "r", 1min, label).kind,
              Reservation::Kind::acquired);
    EXPECT_EQ(this->store().find(key)->label, idemgate::detail::stored_text(label));
    RowQuery q;
    q.label_contains = label;
    EXPECT_EQ(this->store().rows(q).size(), 1u);
  }
}

TYPED_TEST_P(StoreConformance, AGateWhoseDownstreamFailsWithAnyBytesEndsTheAttemptAndReturns) {
  using detail::RefusingTerminal;
  using detail::SlotRequest;
  const std::string unreadable = detail::unreadable_reason();
  for (const auto how : {RefusingTerminal::How::permanent, RefusingTerminal::How::transient,
                         RefusingTerminal::How::throws}) {
    RefusingTerminal terminal(how, unreadable);
    idemgate::Gate gate{this->gate_name,
                        this->store(),
                        terminal,
                        [this](auto& tx, const Key& key, const SlotRequest&, const std::string&) {
                          this->traits_.write_business(tx, key);
                        },
                        {.heartbeat = false}};
    const Key key = detail::key_of("refused with bytes", static_cast<int>(how));
    std::optional<decltype(gate.process(key, SlotRequest{}))> result;
    ASSERT_NO_THROW(result.emplace(gate.process(key, SlotRequest{"MSKU1", "07:00"})))
        << "a downstream's failure left process()";
    const auto row = this->store().find(key);
    ASSERT_TRUE(row.has_value());
    if (how == RefusingTerminal::How::permanent) {
      EXPECT_EQ(result->status(), Status::failed);
      EXPECT_EQ(row->status, RecordStatus::failed);
    } else {
      // Given back: held for the gate's first back-off (500 ms), not for its lease (10 s).
      EXPECT_EQ(row->status, RecordStatus::in_flight);
      EXPECT_LT(row->lease_until, std::chrono::system_clock::now() + 2s)
          << "the lease was not given back: the key stays frozen until it runs out";
      this->traits_.advance(1s);
      EXPECT_EQ(this->store()
                    .reserve(key, idemgate::detail::sha256(row->request), row->request, 1min)
                    .kind,
                Reservation::Kind::taken_over)
          << "the key is not free once the back-off ended";
    }
    // A store that keeps no reason of a release (not an explaining_store) keeps one of a failure.
    if (how == RefusingTerminal::How::permanent ||
        idemgate::explaining_store<typename TypeParam::Store>) {
      EXPECT_NE(row->reason.find("\\xff\\xfe"), std::string::npos) << row->reason;
    }
    EXPECT_EQ(this->traits_.business_rows_for(key), 0);
  }
}

/// @endcond
}  // namespace idemgate::testing
