#pragma once

// Portbase Cargo Information Service notifications, and the Monday of the story: 39 containers,
// 87 deliveries. 17 notifications are delivered 2 to 6 times (one of them six times), the rest
// once, out of order.

#include <algorithm>
#include <random>
#include <string>
#include <vector>

namespace ect_delta {

/// One Portbase notification: the fields the upstream controls.
struct Notification {
  /// Portbase's id of the notification; the same on every redelivery.
  std::string notification_id;
  /// The container it is about.
  std::string equipment_number;
  /// The pick-up window the planner asked for.
  std::string preferred_window;
};

/// The notifications of the Monday (one per container).
inline std::vector<Notification> monday_notifications() {
  std::vector<Notification> all;
  for (int i = 0; i < 39; ++i) {
    all.push_back({"CIS-2025-06-09-" + std::to_string(1000 + i),
                   "MSKU" + std::to_string(7000000 + i * 37),
                   "2025-06-09T" + std::to_string(6 + i % 12) + ":00"});
  }
  return all;
}

/// 87 deliveries of the 39 notifications, in an order shuffled by `seed`.
inline std::vector<Notification> monday_deliveries(unsigned seed = 9) {
  const auto notifications = monday_notifications();
  // 17 notifications delivered more than once (2 to 6 copies, 65 in all) plus 22 once: 87.
  const int copies[17] = {6, 5, 5, 5, 5, 5, 4, 4, 4, 3, 3, 3, 3, 3, 3, 2, 2};
  std::vector<Notification> deliveries;
  for (std::size_t i = 0; i < notifications.size(); ++i) {
    const int n = i < 17 ? copies[i] : 1;
    for (int c = 0; c < n; ++c) deliveries.push_back(notifications[i]);
  }
  std::mt19937 rng(seed);
  std::shuffle(deliveries.begin(), deliveries.end(), rng);
  return deliveries;
}

}  // namespace ect_delta
