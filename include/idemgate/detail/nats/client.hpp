// SPDX-License-Identifier: MIT
// The NATS C client (libnats) as the JetStream consumer uses it: owning handles, errors that carry
// the client's own words, a connection that waits for its server, and a message's delivery
// count. Only consumer/nats.hpp (and tests of it) use it.
#pragma once

#include "../../errors.hpp"

#include <nats/nats.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

namespace idemgate::detail::nats {

// Owning handles over the client's objects.
struct ConnectionDeleter {
  void operator()(natsConnection* c) const noexcept { natsConnection_Destroy(c); }
};
struct OptionsDeleter {
  void operator()(natsOptions* o) const noexcept { natsOptions_Destroy(o); }
};
struct ContextDeleter {
  void operator()(jsCtx* js) const noexcept { jsCtx_Destroy(js); }
};
struct SubscriptionDeleter {
  void operator()(natsSubscription* s) const noexcept { natsSubscription_Destroy(s); }
};
struct MessageDeleter {
  void operator()(natsMsg* m) const noexcept { natsMsg_Destroy(m); }
};
struct StreamInfoDeleter {
  void operator()(jsStreamInfo* i) const noexcept { jsStreamInfo_Destroy(i); }
};
struct ConsumerInfoDeleter {
  void operator()(jsConsumerInfo* i) const noexcept { jsConsumerInfo_Destroy(i); }
};
struct MetaDataDeleter {
  void operator()(jsMsgMetaData* m) const noexcept { jsMsgMetaData_Destroy(m); }
};
struct PubAckDeleter {
  void operator()(jsPubAck* a) const noexcept { jsPubAck_Destroy(a); }
};
using Connection = std::unique_ptr<natsConnection, ConnectionDeleter>;
using Options = std::unique_ptr<natsOptions, OptionsDeleter>;
using Context = std::unique_ptr<jsCtx, ContextDeleter>;
using Subscription = std::unique_ptr<natsSubscription, SubscriptionDeleter>;
using Message = std::unique_ptr<natsMsg, MessageDeleter>;
using StreamInfo = std::unique_ptr<jsStreamInfo, StreamInfoDeleter>;
using ConsumerInfo = std::unique_ptr<jsConsumerInfo, ConsumerInfoDeleter>;
using MetaData = std::unique_ptr<jsMsgMetaData, MetaDataDeleter>;
using PubAck = std::unique_ptr<jsPubAck, PubAckDeleter>;

// The messages of one fetch; destroying the list destroys them.
class MessageList {
 public:
  MessageList() = default;
  MessageList(const MessageList&) = delete;
  MessageList& operator=(const MessageList&) = delete;
  ~MessageList() { natsMsgList_Destroy(&list_); }
  natsMsgList* get() noexcept { return &list_; }
  [[nodiscard]] int size() const noexcept { return list_.Count; }
  [[nodiscard]] natsMsg* operator[](int i) const noexcept { return list_.Msgs[i]; }

 private:
  natsMsgList list_{nullptr, 0};
};

// The client's description of what went wrong: its status text, its last error of this thread
// when that says more, and JetStream's error code.
inline std::string describe(natsStatus status, jsErrCode code = static_cast<jsErrCode>(0)) {
  std::string text = natsStatus_GetText(status);
  natsStatus last_status = NATS_OK;
  const char* last = nats_GetLastError(&last_status);
  if (last != nullptr && *last != '\0' && last_status == status && text != last)
    text += std::string(": ") + last;
  if (static_cast<int>(code) != 0) text += " (JetStream error " + std::to_string(code) + ")";
  return text;
}

// Throws NatsError for a failed call: what was being done, the client's words, what to do.
inline void check(natsStatus status, const std::string& doing, const std::string& advice,
                  jsErrCode code = static_cast<jsErrCode>(0)) {
  if (status == NATS_OK) return;
  throw NatsError("idemgate: NATS failed while " + doing + ": " + describe(status, code) + "; " +
                  advice);
}

// A connection to `url` that reconnects forever (every `reconnect_wait`) once it was up, and
// waits up to `startup_wait` for a server that is not up yet (a consumer restarted with its
// broker). Throws NatsError when none answered in that time.
inline Connection connect(const std::string& url, const std::string& name,
                          std::chrono::milliseconds reconnect_wait,
                          std::chrono::milliseconds startup_wait) {
  natsOptions* raw = nullptr;
  check(natsOptions_Create(&raw), "creating connection options", "the process is out of memory");
  Options options(raw);
  check(natsOptions_SetURL(options.get(), url.c_str()), "reading the URL '" + url + "'",
        "write it as nats://host:port");
  natsOptions_SetName(options.get(), name.c_str());
  natsOptions_SetMaxReconnect(options.get(), -1);
  natsOptions_SetReconnectWait(options.get(), reconnect_wait.count());
  // Without it, a fetch's pull request sent while disconnected sits in the reconnect buffer and
  // the fetch waits its whole timeout for nothing.
  natsOptions_SetFailRequestsOnDisconnect(options.get(), true);
  const auto deadline = std::chrono::steady_clock::now() + startup_wait;
  for (;;) {
    natsConnection* connection = nullptr;
    const natsStatus status = natsConnection_Connect(&connection, options.get());
    if (status == NATS_OK) return Connection(connection);
    if (std::chrono::steady_clock::now() >= deadline)
      check(status, "connecting to " + url,
            "check that nats-server runs there with JetStream on (-js), and the address");
    std::this_thread::sleep_for(reconnect_wait);
  }
}

// The JetStream context of a connection; its API requests wait up to `wait`.
inline Context jetstream(natsConnection* connection, std::chrono::milliseconds wait) {
  jsOptions options;
  jsOptions_Init(&options);
  options.Wait = wait.count();
  jsCtx* js = nullptr;
  check(natsConnection_JetStream(&js, connection, &options), "opening a JetStream context",
        "the process is out of memory");
  return Context(js);
}

// What JetStream says of one delivery: the stream sequence (the message's place in its stream)
// and how often the consumer delivered it, the first delivery being 1.
struct Delivery {
  std::uint64_t stream_sequence = 0;
  std::uint64_t deliveries = 1;
};

// The delivery of a message from a JetStream consumer; none for a message without JetStream
// metadata (not from a consumer).
inline bool delivery_of(natsMsg* message, Delivery& out) {
  jsMsgMetaData* raw = nullptr;
  if (natsMsg_GetMetaData(&raw, message) != NATS_OK) return false;
  MetaData meta(raw);
  out.stream_sequence = meta->Sequence.Stream;
  out.deliveries = meta->NumDelivered == 0 ? 1 : meta->NumDelivered;
  return true;
}

}  // namespace idemgate::detail::nats
