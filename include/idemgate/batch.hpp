// SPDX-License-Identifier: MIT
// The batch entry point's types: one message of a batch, and what became of each.
#pragma once

#include "key.hpp"
#include "outcome.hpp"

#include <string>
#include <utility>
#include <vector>

namespace idemgate {

/// One message of a batch (an SQS `ReceiveMessage` batch, a Kafka poll).
template <class Request>
struct BatchMessage {
  /// The transport's id of this delivery, used only to report which messages to retry.
  std::string message_id;
  /// The event's idempotency key (from the upstream's fields, not from `message_id`).
  Key key;
  /// What the downstream is asked to do.
  Request request;
  /// A readable label of the event (`derive_labelled_key`'s), kept with a new row when
  /// `GateOptions::keep_labels` is on and the store keeps labels; empty keeps none.
  std::string label = {};
};

/**
 * One event whose outcome a bulk business write commits: what a business write callable as
 * `write(transaction&, std::span<const CommittedEvent<Request, Outcome>>)` receives.
 * `process_batch` hands it every event of the batch it commits at once, so one multi-row statement
 * writes them all (`INSERT … SELECT … FROM unnest($1::text[], $2::text[])` on PostgreSQL);
 * `process`, group commit, the reconciler and `resolve` hand it one event. The references live
 * until the write returns.
 */
template <class Request, class Outcome>
struct CommittedEvent {
  /// The event's idempotency key (to record which event wrote a row).
  const Key& key;
  /// What the downstream was asked to do.
  const Request& request;
  /// What the downstream answered.
  const Outcome& outcome;
};

/// The gate's answer for one message of a batch.
template <class Outcome>
struct BatchItem {
  /// The message's id, as given.
  std::string message_id;
  /// What the gate did with it.
  Result<Outcome> result;
};

/// The gate's answers for a batch, in the order of the messages.
template <class Outcome>
class BatchResult {
 public:
  /// Wraps the per-message answers.
  explicit BatchResult(std::vector<BatchItem<Outcome>> items) : items_(std::move(items)) {}

  /// Every message's answer, in order.
  [[nodiscard]] const std::vector<BatchItem<Outcome>>& items() const& noexcept { return items_; }
  /// Every message's answer, in order, moved out of a temporary result (so that
  /// `for (auto& item : gate.process_batch(batch).items())` is safe).
  [[nodiscard]] std::vector<BatchItem<Outcome>> items() && noexcept { return std::move(items_); }

  /// The ids of the messages not to ack (the queue redelivers them): SQS's partial batch
  /// response (`batchItemFailures`).
  [[nodiscard]] std::vector<std::string> retry_ids() const {
    std::vector<std::string> ids;
    for (const auto& item : items_)
      if (!item.result.should_ack()) ids.push_back(item.message_id);
    return ids;
  }

 private:
  std::vector<BatchItem<Outcome>> items_;
};

}  // namespace idemgate
