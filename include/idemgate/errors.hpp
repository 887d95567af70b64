// SPDX-License-Identifier: MIT
// Every exception idemgate throws, at the bottom layer: includes nothing of idemgate.
#pragma once

#include <stdexcept>

namespace idemgate {

/// Thrown when a key cannot be derived from the given parts.
class KeyError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// Thrown when a request or outcome cannot be turned into bytes or back.
class CodecError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Thrown before anything is written when a request cannot be used: too large, or its codec
/// failed. Nothing is reserved; fix the request (or the codec) and do not retry as is.
class RequestError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// Thrown when a store cannot do its work: the database is unreachable, a commit's fate is
/// unknown, the schema is missing. The message says what to do; do not ack the message.
class StoreError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Thrown when the business write broke the store's transaction: it swallowed an SQL error that
/// ended the transaction, or took transaction control itself. Nothing of the log was committed
/// and the event's lease was ended; do not ack, and fix the business write (let its SQL errors
/// propagate, or recover from an expected one with a savepoint).
class BusinessWriteError : public StoreError {
 public:
  using StoreError::StoreError;
};

/// Thrown by a broker consumer when its broker cannot be used: unreachable, a login refused, a
/// declaration refused, a settlement that did not reach it. The consumer's loop reconnects on
/// its own; what it had not settled is delivered again by the broker.
class BrokerError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Thrown by the NATS JetStream consumer (`consumer/nats.hpp`) when its server cannot be used:
/// unreachable, JetStream off, a stream or consumer that exists with settings JetStream will not
/// change. The message says what to do. Errors while settling one message are not thrown: the
/// message is then delivered again after `AckWait`, and the gate answers it again.
class NatsError : public BrokerError {
 public:
  using BrokerError::BrokerError;
};

}  // namespace idemgate
