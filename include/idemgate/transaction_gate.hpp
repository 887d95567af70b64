// SPDX-License-Identifier: MIT
// TransactionGate: exactly once in one transaction, when the business write is the whole effect.
#pragma once

#include "batch.hpp"
#include "codec.hpp"
#include "concepts.hpp"
#include "detail/answers.hpp"
#include "detail/crypto/sha256.hpp"
#include "detail/durations.hpp"
#include "errors.hpp"
#include "gate_name.hpp"
#include "key.hpp"
#include "outcome.hpp"
#include "record.hpp"
#include "signals.hpp"

#include <chrono>
#include <concepts>
#include <cstddef>
#include <exception>
#include <functional>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace idemgate {

/// Tuning of a `TransactionGate`.
struct TransactionGateOptions {
  /// How long a delivery waits for a concurrent delivery of the same event whose transaction
  /// holds the key uncommitted, before it is answered `retry` (do not ack) with nothing written.
  /// On PostgreSQL it is the transaction's `lock_timeout`, so it also bounds every lock the
  /// transaction waits for (the business write's, a table's extension); a wait is also cut at
  /// `PostgresOptions::statement_timeout` (15 s by default), answered the same way. SQLite waits
  /// up to its `busy_timeout` instead, then throws `StoreError`. From 1 ms to an hour; keep it
  /// above the business write's usual time, or duplicates delivered together are sent back to
  /// the queue instead of answered.
  std::chrono::milliseconds lock_timeout = std::chrono::seconds(5);
  /// Largest encoded request the gate accepts (it is stored with the row).
  std::size_t max_request_bytes = 1 << 20;
  /// Keeps the readable label of a `LabelledKey` with a new row (see `GateOptions::keep_labels`).
  bool keep_labels = false;
};

/// The default write of a `TransactionGate`: takes the store's transaction and the request, and
/// returns the outcome it stores.
template <class Store, class Request, class Outcome>
using TransactionWrite = std::function<Outcome(typename Store::transaction&, const Request&)>;

/**
 * Exactly-once processing in one transaction, for an event whose side effect is only the
 * business write in the log's own database (a ledger's debit row, an inbox row): the key's row,
 * the business write and its outcome commit together, or nothing does. One commit where `Gate`
 * pays two, and no row is ever left in flight: a crash rolls the whole event back, and its
 * redelivery runs it as new.
 *
 * - A new key: `write(tx, request)` (or `write(tx, key, request)`) runs in the transaction that
 *   inserted the key; its outcome is stored with the row: `processed`.
 * - A committed key: the stored outcome, nothing written: `duplicate`. Another request under the
 *   key: `conflict`.
 * - A concurrent delivery of the same event waits for the first one's transaction, then gets the
 *   stored outcome; past `TransactionGateOptions::lock_timeout` it is answered `retry` (on
 *   SQLite, past its busy timeout, `StoreError`).
 * - A row a `Gate` of the same name left in flight whose lease ran out is taken over in the
 *   transaction; a live one answers `in_flight`.
 *
 * Choose it only when nothing outside the database happens for an event: a call to another
 * service, a message sent, a file written need `Gate`'s durable reservation, which is recorded
 * before the call so that a crash mid-call is finished under the same key instead of forgotten.
 * There is no reconciler to run and no lease: an event is either committed or absent. (Rows a
 * `Gate` of the same name left in flight under a live lease are still that gate's to finish:
 * keep its reconciler running until they are gone.) A write that commits the transaction itself,
 * before the outcome is stored, leaves its event answered `escalated`.
 *
 * Example:
 *   idemgate::TransactionGate<idemgate::PostgresStore, Debit, Receipt> gate{
 *       "ledger.debit", store, [](pqxx::work& tx, const Debit& d) { return debit(tx, d); }};
 *   auto result = gate.process(idemgate::derive_key("ledger.debit", event.id), request);
 *   if (result.should_ack()) message.ack();
 */
template <one_transaction_store Store, codable Request, codable Outcome,
          class Write = TransactionWrite<Store, Request, Outcome>, observer Observer = NullObserver>
class TransactionGate {
 public:
  /// What an event asks.
  using request_type = Request;
  /// What the write returns and the log stores.
  using outcome_type = Outcome;
  /// What `process` returns.
  using result_type = Result<Outcome>;

  /// Gate `name` over `store`; `write` is the event's whole effect, run in the transaction that
  /// reserves its key.
  TransactionGate(GateName name, Store& store, Write write,
                  TransactionGateOptions options = {}) requires std::same_as<Observer, NullObserver>
      : TransactionGate(std::move(name), store, std::move(write), options, null_observer()) {}

  /// Gate `name` that also reports every result to `observer` (a `Counters`, for example),
  /// which must outlive the gate.
  TransactionGate(GateName name, Store& store, Write write, TransactionGateOptions options,
                  Observer& observer)
      : name_(std::move(name)),
        store_(store.for_gate(name_)),
        write_(std::move(write)),
        options_(options),
        observer_(observer) {
    detail::require_in_range("TransactionGateOptions::lock_timeout", options.lock_timeout,
                             std::chrono::milliseconds(1), std::chrono::milliseconds(3'600'000),
                             "It is how long a duplicate waits for the transaction of the same "
                             "event (default 5 seconds).");
    detail::require_in_range("TransactionGateOptions::max_request_bytes", options.max_request_bytes,
                             std::size_t{1}, std::size_t{64} << 20,
                             "Every request is stored with its row (default 1 MiB); keep larger "
                             "payloads elsewhere and send a reference.");
    if constexpr (requires { std::string_view(observer.gate()); }) {
      const std::string_view counted = observer.gate();
      if (!counted.empty() && counted != name_.view())
        throw std::invalid_argument(
            "idemgate: gate \"" + name_.str() + "\" reports to an observer made for gate \"" +
            std::string(counted) + "\"; give each gate an observer of its own name");
    }
  }

  /**
   * Processes one delivery of an event in one transaction. When it throws there is no result:
   * do not ack (nothing was written, unless a duplicate counter). What can leave it:
   * `RequestError` (the request does not encode or is too large: dead-letter it), `StoreError`
   * (the store cannot work; `BusinessWriteError` when the write broke the transaction), what the
   * write throws (its transaction was rolled back: the redelivery runs the event again), what
   * the outcome's codec throws, what the observer throws.
   */
  result_type process(const Key& key, const Request& request) {
    return process_labelled(key, request, {});
  }

  /// Like `process(key.key, request)`, and keeps `key.label` with a new row when
  /// `TransactionGateOptions::keep_labels` is on and the store keeps labels.
  result_type process(const LabelledKey& key, const Request& request) {
    if constexpr (labelling_store<Store>) {
      if (options_.keep_labels) return process_labelled(key.key, request, key.label);
    }
    return process_labelled(key.key, request, {});
  }

  /**
   * Processes a batch, each event in its own transaction (one event's failure costs only its
   * own): one result per message, in order; `retry_ids()` lists those not to ack. Messages with
   * the same key are processed once, the others answered `duplicate` (or `conflict` for another
   * request). A request that does not encode gets `failed`; a write that throws, or an outcome
   * its codec cannot encode (or a stored one it cannot decode), `retry`, naming which. Throws
   * `StoreError` when the store fails (ack none: the events committed so far are answered from
   * the log when redelivered).
   */
  BatchResult<Outcome> process_batch(std::span<const BatchMessage<Request>> messages) {
    std::vector<BatchItem<Outcome>> items;
    items.reserve(messages.size());
    std::unordered_map<Key, std::pair<std::size_t, Fingerprint>, KeyHash> first;
    for (std::size_t i = 0; i < messages.size(); ++i) {
      const BatchMessage<Request>& m = messages[i];
      const auto started = std::chrono::steady_clock::now();
      std::optional<result_type> result;
      std::string bytes;
      try {
        bytes = encode(m.request);
      } catch (const RequestError& e) {
        result = result_type::because(Status::failed, e.what());
      }
      if (!result) {
        const Fingerprint fingerprint = detail::sha256(bytes);
        const auto [seen, fresh] = first.try_emplace(m.key, i, fingerprint);
        if (!fresh) {
          const result_type& earlier = items[seen->second.first].result;
          if (seen->second.second != fingerprint)
            result = result_type::because(Status::conflict,
                                          "this key came twice in one batch with different "
                                          "requests; the key derivation is not stable or two "
                                          "events share a key");
          else if (earlier.has_outcome())
            result = result_type::with(Status::duplicate, earlier.outcome());
          else
            result = earlier;
        } else {
          try {
            result = once(m.key, m.request, bytes, fingerprint, label_of(m));
          } catch (const BusinessWriteError& e) {
            result = result_type::because(Status::retry, e.what());
          } catch (const StoreError&) {
            throw;
          } catch (const CodecError& e) {
            result = result_type::because(
                Status::retry, std::string("the outcome's codec threw: ") + e.what() +
                                   "; a new outcome was rolled back with its write, a stored one "
                                   "stays as it was. Do not ack: fix the codec, and the "
                                   "redelivery runs the event or answers it from the log");
          } catch (const std::exception& e) {
            result = result_type::because(
                Status::retry, std::string("the business write threw: ") + e.what() +
                                   "; nothing was written. Do not ack: the redelivery runs it "
                                   "again");
          }
        }
      }
      observer_.on_result(m.key, result->status(), std::chrono::steady_clock::now() - started);
      items.push_back({m.message_id, std::move(*result)});
    }
    return BatchResult<Outcome>(std::move(items));
  }

  /// The gate's name.
  [[nodiscard]] const GateName& name() const noexcept { return name_; }
  /// The store handle scoped to this gate.
  [[nodiscard]] Store& store() noexcept { return store_; }
  /// The observer results are reported to.
  [[nodiscard]] Observer& observer() noexcept { return observer_; }
  /// The options.
  [[nodiscard]] const TransactionGateOptions& options() const noexcept { return options_; }

 private:
  result_type process_labelled(const Key& key, const Request& request, std::string_view label) {
    const auto started = std::chrono::steady_clock::now();
    const std::string bytes = encode(request);
    result_type result = once(key, request, bytes, detail::sha256(bytes), label);
    observer_.on_result(key, result.status(), std::chrono::steady_clock::now() - started);
    return result;
  }

  result_type once(const Key& key, const Request& request, std::string_view bytes,
                   const Fingerprint& fingerprint, std::string_view label) {
    std::optional<Outcome> produced;
    OnceResult done = store_.commit_once(
        key, fingerprint, bytes, label, options_.lock_timeout,
        [&](typename Store::transaction& tx) -> std::string {
          produced.reset();  // a transaction run again after a lost connection writes anew
          if constexpr (std::invocable<Write&, typename Store::transaction&, const Key&,
                                       const Request&>)
            produced.emplace(std::invoke(write_, tx, key, request));
          else
            produced.emplace(std::invoke(write_, tx, request));
          std::string outcome;
          codec<Outcome>::encode(*produced, outcome);
          return outcome;
        });
    switch (done.kind) {
      case OnceResult::Kind::committed:
        // A COMMIT whose reply was lost and was found landed on the next attempt: its outcome is
        // the stored one, decoded.
        if (!produced) produced.emplace(codec<Outcome>::decode(done.result));
        return result_type::with(Status::processed, std::move(*produced))
            .set_took_over(done.taken_over);
      case OnceResult::Kind::existing:
        return detail::answer_existing<Outcome>(done.found);
      case OnceResult::Kind::busy:
        break;
    }
    return result_type::because(
        Status::retry,
        "another delivery of this event holds its key in a transaction that did not end within "
        "TransactionGateOptions::lock_timeout; nothing was written. Do not ack: the redelivery "
        "is answered from the log once that transaction commits, or runs the event if it rolls "
        "back");
  }

  std::string encode(const Request& request) const {
    return detail::encode_request(request, options_.max_request_bytes,
                                  "TransactionGateOptions::max_request_bytes");
  }

  std::string_view label_of(const BatchMessage<Request>& message) const noexcept {
    if constexpr (labelling_store<Store>) {
      if (options_.keep_labels) return message.label;
    }
    return {};
  }

  static NullObserver& null_observer() noexcept {
    static NullObserver none;
    return none;
  }

  GateName name_;
  Store store_;  // scoped to name_
  Write write_;
  TransactionGateOptions options_;
  Observer& observer_;
};

}  // namespace idemgate
