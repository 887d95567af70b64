// The broker consumers from the installed tree (find_package(idemgate COMPONENTS amqp
// redis_streams)): both loops compile over one gate and link their client libraries; their
// options are checked before anything connects.
#include <idemgate/consumer/amqp.hpp>
#include <idemgate/consumer/redis_streams.hpp>
#include <idemgate/idemgate.hpp>
#include <idemgate/store/memory.hpp>

#include <cstdio>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace {

struct Echo {
  using request_type = std::string;
  using outcome_type = std::string;
  static constexpr bool honours_idempotency_key = true;
  idemgate::ClaimResult<std::string> claim(const std::string& r, const idemgate::Key&) { return r; }
};

std::optional<idemgate::consumer::Event<std::string>> decode(std::string_view body) {
  return idemgate::consumer::Event<std::string>{idemgate::derive_key("echo", body),
                                                std::string(body)};
}

}  // namespace

int main() {
  idemgate::MemoryStore store;
  Echo echo;
  idemgate::Gate gate{
      "echo", store, echo,
      [](idemgate::MemoryStore::transaction&, const std::string&, const std::string&) {}};
  int refused = 0;
  try {
    idemgate::consumer::AmqpConsumer amqp{gate, decode, idemgate::consumer::AmqpOptions{}};
  } catch (const std::invalid_argument&) {
    ++refused;  // no queue named
  }
  try {
    idemgate::consumer::RedisStreamsConsumer redis{gate, decode,
                                                   idemgate::consumer::RedisStreamsOptions{}};
  } catch (const std::invalid_argument&) {
    ++refused;  // no stream named
  }
  idemgate::consumer::AmqpOptions amqp_options;
  amqp_options.queue = "notifications";
  idemgate::consumer::AmqpConsumer amqp{gate, decode, amqp_options};
  idemgate::consumer::RedisStreamsOptions redis_options;
  redis_options.stream = "notifications";
  redis_options.consumer = "c1";
  idemgate::consumer::RedisStreamsConsumer redis{gate, decode, redis_options};
  std::printf("broker consumers: %d refused, %s and %s built\n", refused,
              amqp.options().queue.c_str(), redis.options().stream.c_str());
  return refused == 2 && !amqp.connected() && !redis.connected() ? 0 : 1;
}
