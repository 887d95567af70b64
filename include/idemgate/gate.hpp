#pragma once

#include "concepts.hpp"
#include "detail/sha256.hpp"
#include "outcome.hpp"

#include <chrono>
#include <cstddef>
#include <exception>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace idemgate {

/// Thrown before anything is written when a request cannot be used: too large, or its codec
/// failed. Nothing is reserved; fix the request (or the codec) and do not retry as is.
class RequestError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// Tuning of a `Gate`.
struct GateOptions {
  /// How long a reservation stays exclusive. Set it a bit above the longest plausible
  /// processing time; a redelivery after it expires takes the event over.
  std::chrono::milliseconds lease = std::chrono::minutes(2);
  /// Largest encoded request the gate accepts (it is stored with the reservation).
  std::size_t max_request_bytes = 1 << 20;
};

/// The default business write's type: a callable taking the store's transaction, the request and
/// the downstream's outcome. Any callable that also takes the key after the transaction works.
template <class Store, class Downstream>
using BusinessWrite =
    std::function<void(typename Store::transaction&, const typename Downstream::request_type&,
                       const typename Downstream::outcome_type&)>;

/**
 * The exactly-once gate: reserve the key, call the downstream with it, commit the outcome and
 * the business write in one transaction.
 *
 * A `Gate` holds references to its store and downstream; it is safe to share between threads
 * when they are (every shipped store is).
 *
 * Example:
 *   idemgate::Gate gate{store, terminal, [](pqxx::work& tx, const SlotRequest& r,
 *                                           const std::string& slot) { book(tx, r, slot); }};
 *   auto key = idemgate::derive_key("ect.claim_slot", n.notification_id, n.equipment_number);
 *   auto result = gate.process(key, SlotRequest{n.equipment_number, n.preferred_window});
 *   if (result.should_ack()) message.ack();
 */
template <store Store, downstream Downstream, class Apply = BusinessWrite<Store, Downstream>>
requires business_write<Apply, Store, Downstream>
class Gate {
 public:
  /// What the downstream is asked to do.
  using request_type = typename Downstream::request_type;
  /// What the downstream answers.
  using outcome_type = typename Downstream::outcome_type;
  /// What `process` returns.
  using result_type = Result<outcome_type>;

  /// A gate over `store` and `downstream`; `apply` is the business write, run in the commit's
  /// transaction (also by the reconciler, so it must depend only on request and outcome).
  Gate(Store& store, Downstream& downstream, Apply apply, GateOptions options = {})
      : store_(store), downstream_(downstream), apply_(std::move(apply)), options_(options) {}

  /**
   * Processes one delivery of an event: the four steps, in order.
   *
   * Throws `RequestError` for an unusable request (nothing written), `StoreError` when the store
   * fails (do not ack: a redelivery or the reconciler finishes the event), and whatever the
   * business write throws (its transaction is rolled back; the row stays in flight).
   */
  result_type process(const Key& key, const request_type& request) {
    const std::string bytes = encode_request(request);
    const Fingerprint fingerprint = detail::sha256(bytes);
    const Reservation reservation = store_.reserve(key, fingerprint, bytes, options_.lease);
    if (reservation.kind == Reservation::Kind::existing) return answer_existing(reservation);

    const bool took_over = reservation.kind == Reservation::Kind::taken_over;
    if constexpr (!Downstream::honours_idempotency_key) {
      const CommitStatus parked = store_.escalate(key, reservation.fence, no_key_support_reason());
      if (parked == CommitStatus::lost_lease) return lost_lease_result();
      return result_type::because(Status::escalated, no_key_support_reason())
          .set_took_over(took_over);
    } else {
      return finish(key, reservation.fence, request, claim(key, request)).set_took_over(took_over);
    }
  }

  /// Stores the downstream's answer under a fence this caller holds: commits an outcome with the
  /// business write, stores a permanent failure, or releases the key after a transient one.
  /// `process` and the reconciler both end here.
  result_type finish(const Key& key, std::int64_t fence, const request_type& request,
                     const ClaimResult<outcome_type>& answer) {
    if (answer.ok()) return commit(key, fence, request, answer.outcome());
    if (answer.permanent()) {
      std::string reason(answer.reason());
      if (store_.fail(key, fence, reason) == CommitStatus::lost_lease) return lost_lease_result();
      return result_type::because(Status::failed, std::move(reason));
    }
    store_.release(key, fence);
    return result_type::because(Status::retry, std::string(answer.reason()));
  }

  /// Commits `outcome` and the business write under `fence` in one transaction.
  result_type commit(const Key& key, std::int64_t fence, const request_type& request,
                     const outcome_type& outcome) {
    std::string outcome_bytes;
    codec<outcome_type>::encode(outcome, outcome_bytes);
    const CommitStatus status =
        store_.commit(key, fence, outcome_bytes,
                      [&](typename Store::transaction& tx) { apply(tx, key, request, outcome); });
    if (status == CommitStatus::lost_lease) return lost_lease_result();
    return result_type::with(Status::processed, outcome);
  }

  /// Runs the business write inside `tx` (the store's commit or resolve transaction).
  void apply(typename Store::transaction& tx, const Key& key, const request_type& request,
             const outcome_type& outcome) {
    if constexpr (std::invocable<Apply&, typename Store::transaction&, const Key&,
                                 const request_type&, const outcome_type&>)
      std::invoke(apply_, tx, key, request, outcome);
    else
      std::invoke(apply_, tx, request, outcome);
  }

  /// Up to `limit` escalated events, oldest first: the manual queue.
  std::vector<Record> escalated(std::size_t limit = 100) { return store_.escalated(limit); }

  /// Resolves an escalated event by hand with `outcome`: commits it with the business write in
  /// one transaction. False when the event is not escalated (unknown, or resolved already).
  bool resolve(const Key& key, const outcome_type& outcome) {
    const std::optional<Record> row = store_.find(key);
    if (!row || row->status != RecordStatus::escalated) return false;
    const request_type request = decode_request(row->request);
    std::string outcome_bytes;
    codec<outcome_type>::encode(outcome, outcome_bytes);
    return store_.resolve(key, outcome_bytes, [&](typename Store::transaction& tx) {
      apply(tx, key, request, outcome);
    });
  }

  /// Encodes a request as the store keeps it; throws `RequestError` when it cannot.
  [[nodiscard]] std::string encode_request(const request_type& request) const {
    std::string bytes;
    try {
      codec<request_type>::encode(request, bytes);
    } catch (const std::exception& e) {
      throw RequestError(std::string("idemgate: the request could not be encoded (") + e.what() +
                         "); nothing was reserved. Fix the request or its codec.");
    }
    if (bytes.size() > options_.max_request_bytes)
      throw RequestError("idemgate: the encoded request is " + std::to_string(bytes.size()) +
                         " bytes, over the limit of " + std::to_string(options_.max_request_bytes) +
                         "; nothing was reserved. Send a smaller request or raise "
                         "GateOptions::max_request_bytes.");
    return bytes;
  }

  /// Decodes a stored request; throws `CodecError` when the bytes do not decode.
  [[nodiscard]] request_type decode_request(std::string_view bytes) const {
    return codec<request_type>::decode(bytes);
  }

  /// The store.
  [[nodiscard]] Store& store() noexcept { return store_; }
  /// The downstream.
  [[nodiscard]] Downstream& downstream() noexcept { return downstream_; }
  /// The options.
  [[nodiscard]] const GateOptions& options() const noexcept { return options_; }

 private:
  ClaimResult<outcome_type> claim(const Key& key, const request_type& request) {
    try {
      return downstream_.claim(request, key);
    } catch (const std::exception& e) {
      // The downstream honours the key, so a later claim under it cannot double the effect.
      return TransientFailure{std::string("the downstream threw: ") + e.what()};
    }
  }

  result_type answer_existing(const Reservation& found) const {
    if (!found.same_request)
      return result_type::because(
          Status::conflict,
          "this key was first used with a different request; the key derivation "
          "is not stable or two events share a key");
    switch (found.status) {
      case RecordStatus::committed: {
        return result_type::with(Status::duplicate, codec<outcome_type>::decode(found.result));
      }
      case RecordStatus::failed:
        return result_type::because(Status::failed, found.reason);
      case RecordStatus::escalated:
        return result_type::because(Status::escalated, found.reason);
      case RecordStatus::in_flight:
        break;
    }
    return result_type::because(Status::in_flight,
                                "another worker holds this key under a live lease");
  }

  static result_type lost_lease_result() {
    return result_type::because(
        Status::lost_lease,
        "this worker's lease was taken over; its commit was rolled back and the "
        "new holder finishes the event");
  }

  static std::string no_key_support_reason() {
    return "the downstream does not honour Idempotency-Key, so a retry could double the side "
           "effect; a human must finish this event";
  }

  Store& store_;
  Downstream& downstream_;
  Apply apply_;
  GateOptions options_;
};

}  // namespace idemgate
