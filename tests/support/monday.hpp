#pragma once

// The Monday of the story, shared with the examples.

#include <ect_delta/portbase.hpp>

namespace idemgate::test {
using ect_delta::monday_deliveries;
using ect_delta::monday_notifications;
using ect_delta::Notification;
}  // namespace idemgate::test
