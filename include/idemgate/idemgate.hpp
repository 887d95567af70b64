// SPDX-License-Identifier: MIT
// Umbrella header: the core of idemgate, without a database or HTTP.
#pragma once

/// The core of idemgate: keys, results, the policy concepts and the gate. Needs only OpenSSL.
/// Stores and downstreams are opt-in headers: `store/postgres.hpp`, `store/sqlite.hpp`,
/// `store/memory.hpp`, `downstream/http.hpp`, `webhook/standard.hpp`.

#include "codec.hpp"
#include "concepts.hpp"
#include "errors.hpp"
#include "gate.hpp"
#include "gate_name.hpp"
#include "key.hpp"
#include "outcome.hpp"
#include "record.hpp"
#include "transaction_gate.hpp"
#include "version.hpp"
