// SPDX-License-Identifier: MIT
// One Redis connection over hiredis: commands as argument vectors, replies as a small owned
// tree, and the stream commands a consumer group needs (XGROUP CREATE, XREADGROUP, XAUTOCLAIM,
// XPENDING, XACK, XADD). Only consumer/redis_streams.hpp (and the tests of it) use it.
#pragma once

#include "../../errors.hpp"

#include <hiredis/hiredis.h>

#include <sys/time.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace idemgate::detail::redis {

/// A reply, copied out of hiredis's.
struct Reply {
  enum class Kind { string, array, integer, nil, status, error } kind = Kind::nil;
  std::string text;  // string, status, error
  long long integer = 0;
  std::vector<Reply> elements;

  static Reply of(const redisReply* r) {
    Reply out;
    switch (r->type) {
      case REDIS_REPLY_STRING:
        out.kind = Kind::string;
        out.text.assign(r->str, r->len);
        break;
      case REDIS_REPLY_STATUS:
        out.kind = Kind::status;
        out.text.assign(r->str, r->len);
        break;
      case REDIS_REPLY_ERROR:
        out.kind = Kind::error;
        out.text.assign(r->str, r->len);
        break;
      case REDIS_REPLY_INTEGER:
        out.kind = Kind::integer;
        out.integer = r->integer;
        break;
      case REDIS_REPLY_ARRAY:
        out.kind = Kind::array;
        for (std::size_t i = 0; i < r->elements; ++i) out.elements.push_back(of(r->element[i]));
        break;
      default:
        out.kind = Kind::nil;
    }
    return out;
  }
};

/// One stream entry: its id and its fields.
struct Entry {
  std::string id;
  std::map<std::string, std::string> fields;
  /// False for an entry the stream no longer holds (trimmed or deleted while pending).
  bool present = true;
};

/// Where the server is.
struct Endpoint {
  std::string host = "127.0.0.1";
  int port = 6379;
};

inline timeval to_timeval(std::chrono::milliseconds d) {
  return timeval{static_cast<decltype(timeval::tv_sec)>(d.count() / 1000),
                 static_cast<decltype(timeval::tv_usec)>((d.count() % 1000) * 1000)};
}

/// The entries of a stream reply: an array of [id, [field, value, ...]] (nil data: deleted).
inline std::vector<Entry> entries_of(const Reply& list) {
  std::vector<Entry> entries;
  for (const Reply& e : list.elements) {
    if (e.kind != Reply::Kind::array || e.elements.empty()) continue;
    Entry entry;
    entry.id = e.elements[0].text;
    if (e.elements.size() < 2 || e.elements[1].kind != Reply::Kind::array) {
      entry.present = false;
    } else {
      const auto& kv = e.elements[1].elements;
      for (std::size_t i = 0; i + 1 < kv.size(); i += 2) entry.fields[kv[i].text] = kv[i + 1].text;
    }
    entries.push_back(std::move(entry));
  }
  return entries;
}

/// One connection. Not thread-safe: its owner serialises the calls.
class Connection {
 public:
  /// Connects; `timeout` bounds the connect and every reply (keep it above a blocking read's).
  Connection(const Endpoint& endpoint, std::chrono::milliseconds timeout) {
    context_ = redisConnectWithTimeout(endpoint.host.c_str(), endpoint.port, to_timeval(timeout));
    if (context_ == nullptr || context_->err != 0) {
      const std::string why = context_ != nullptr ? context_->errstr : "out of memory";
      if (context_ != nullptr) redisFree(context_);
      throw BrokerError("idemgate: cannot connect to Redis at " + endpoint.host + ":" +
                        std::to_string(endpoint.port) + " (" + why +
                        "); check that the server runs and the address is right");
    }
    redisSetTimeout(context_, to_timeval(timeout));
  }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;
  ~Connection() { redisFree(context_); }

  /// Runs one command; throws `BrokerError` when the connection fails. An error reply is
  /// returned as such (kind error), for the caller to judge.
  Reply command(const std::vector<std::string>& args) {
    std::vector<const char*> argv;
    std::vector<std::size_t> lengths;
    for (const auto& a : args) {
      argv.push_back(a.data());
      lengths.push_back(a.size());
    }
    auto* raw = static_cast<redisReply*>(
        redisCommandArgv(context_, static_cast<int>(argv.size()), argv.data(), lengths.data()));
    if (raw == nullptr)
      throw BrokerError("idemgate: Redis failed during " + args.front() + " (" + context_->errstr +
                        "); the consumer connects again");
    Reply reply = Reply::of(raw);
    freeReplyObject(raw);
    return reply;
  }

  /// Runs one command and throws `BrokerError` on an error reply.
  Reply checked(const std::vector<std::string>& args) {
    Reply reply = command(args);
    if (reply.kind == Reply::Kind::error)
      throw BrokerError("idemgate: Redis refused " + args.front() + ": " + reply.text);
    return reply;
  }

  /// Creates the consumer group at the stream's start (and the stream) unless it exists.
  void create_group(const std::string& stream, const std::string& group) {
    const Reply reply = command({"XGROUP", "CREATE", stream, group, "0", "MKSTREAM"});
    if (reply.kind == Reply::Kind::error && reply.text.rfind("BUSYGROUP", 0) != 0)
      throw BrokerError("idemgate: Redis refused to create the consumer group " + group + " on " +
                        stream + ": " + reply.text);
  }

  /// Up to `count` entries never delivered to the group, waiting at most `block`.
  std::vector<Entry> read_new(const std::string& stream, const std::string& group,
                              const std::string& consumer, std::uint32_t count,
                              std::chrono::milliseconds block) {
    const Reply reply =
        checked({"XREADGROUP", "GROUP", group, consumer, "COUNT", std::to_string(count), "BLOCK",
                 std::to_string(std::max<long long>(block.count(), 1)), "STREAMS", stream, ">"});
    if (reply.kind != Reply::Kind::array || reply.elements.empty()) return {};
    const Reply& first = reply.elements[0];  // [stream, entries]
    if (first.elements.size() < 2) return {};
    return entries_of(first.elements[1]);
  }

  /// XAUTOCLAIM: up to `count` entries pending longer than `min_idle`, from `cursor` on, now this
  /// consumer's (their delivery counts go up by one). Sets `cursor` to where the next scan
  /// starts ("0-0" once the whole list was scanned).
  std::vector<Entry> claim_idle(const std::string& stream, const std::string& group,
                                const std::string& consumer, std::chrono::milliseconds min_idle,
                                std::string& cursor, std::uint32_t count) {
    const Reply reply =
        checked({"XAUTOCLAIM", stream, group, consumer, std::to_string(min_idle.count()), cursor,
                 "COUNT", std::to_string(count)});
    if (reply.kind != Reply::Kind::array || reply.elements.size() < 2) return {};
    cursor = reply.elements[0].text;
    return entries_of(reply.elements[1]);
  }

  /// The delivery counts of this consumer's pending entries from `first` to `last` (ids).
  std::map<std::string, std::uint32_t> delivery_counts(
      const std::string& stream, const std::string& group, const std::string& consumer,
      const std::string& first, const std::string& last, std::uint32_t count) {
    const Reply reply =
        checked({"XPENDING", stream, group, first, last, std::to_string(count), consumer});
    std::map<std::string, std::uint32_t> counts;
    for (const Reply& p : reply.elements)  // [id, consumer, idle, times delivered]
      if (p.elements.size() >= 4)
        counts[p.elements[0].text] = static_cast<std::uint32_t>(p.elements[3].integer);
    return counts;
  }

  /// XACK of `ids`.
  void ack(const std::string& stream, const std::string& group,
           const std::vector<std::string>& ids) {
    if (ids.empty()) return;
    std::vector<std::string> args{"XACK", stream, group};
    args.insert(args.end(), ids.begin(), ids.end());
    checked(args);
  }

  /// XADD of `fields` to `stream` under a new id.
  void add(const std::string& stream,
           const std::vector<std::pair<std::string, std::string>>& fields) {
    std::vector<std::string> args{"XADD", stream, "*"};
    for (const auto& [k, v] : fields) {
      args.push_back(k);
      args.push_back(v);
    }
    checked(args);
  }

 private:
  redisContext* context_ = nullptr;
};

}  // namespace idemgate::detail::redis
