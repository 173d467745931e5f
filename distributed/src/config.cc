#include "kiln/distributed/config.h"

#include <arpa/inet.h>

#include <charconv>

#include <fmt/format.h>

namespace kiln::distributed {
namespace {

bool is_numeric_address(const std::string& host) {
  unsigned char buf[16];
  return inet_pton(AF_INET, host.c_str(), buf) == 1 || inet_pton(AF_INET6, host.c_str(), buf) == 1;
}

}  // namespace

std::string TcpAddress::to_string() const {
  return host.find(':') != std::string::npos ? fmt::format("tcp:[{}]:{}", host, port)
                                             : fmt::format("tcp:{}:{}", host, port);
}

Result<TcpAddress> parse_tcp_address(std::string_view text) {
  const auto bad = [text](std::string_view why) {
    return make_error(ErrorCode::Config, fmt::format("rendezvous '{}': {} (expected tcp:HOST:PORT or tcp:[HOST]:PORT "
                                                     "with a numeric HOST)",
                                                     text, why));
  };
  if (text.substr(0, 4) != "tcp:") return bad("not a tcp: address");
  std::string_view rest = text.substr(4);
  TcpAddress out;
  std::string_view port_text;
  if (!rest.empty() && rest.front() == '[') {
    const std::size_t close = rest.find(']');
    if (close == std::string_view::npos || close + 1 >= rest.size() || rest[close + 1] != ':')
      return bad("an unclosed [ or no port after ]");
    out.host = std::string(rest.substr(1, close - 1));
    port_text = rest.substr(close + 2);
  } else {
    const std::size_t colon = rest.rfind(':');
    if (colon == std::string_view::npos) return bad("no port");
    out.host = std::string(rest.substr(0, colon));
    port_text = rest.substr(colon + 1);
  }
  if (!is_numeric_address(out.host)) return bad(fmt::format("'{}' is not a numeric IPv4 or IPv6 address", out.host));
  unsigned port = 0;
  const auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (ec != std::errc() || end != port_text.data() + port_text.size() || port > 65535)
    return bad(fmt::format("port '{}' is not in 0..65535", port_text));
  out.port = static_cast<std::uint16_t>(port);
  return out;
}

Status validate(const DistributedConfig& c) {
  const auto bad = [](std::string message) { return make_error(ErrorCode::Config, std::move(message)); };
  if (c.job.empty()) return bad("distributed.job is empty: name the job whose collectives span daemons");
  if (c.world_size == 0 || c.world_size > kMaxWorldSize)
    return bad(fmt::format("distributed.world_size {} is outside [1, {}]", c.world_size, kMaxWorldSize));
  if (c.rank >= c.world_size)
    return bad(fmt::format("distributed.rank {} is not below world_size {}", c.rank, c.world_size));
  if (c.rendezvous.host.empty()) return bad("distributed.rendezvous is not set (tcp:HOST:PORT)");
  if (c.rendezvous.port == 0 && c.rank != 0)
    return bad("distributed.rendezvous: port 0 (any free port) is for rank 0 alone; the others must know it");
  if (!c.host.empty() && !is_numeric_address(c.host))
    return bad(fmt::format("distributed.host '{}' is not a numeric IPv4 or IPv6 address", c.host));
  if (c.timeout < std::chrono::milliseconds(1) || c.timeout > std::chrono::hours(1))
    return bad(fmt::format("distributed.timeout_ms {} is outside [1, 3600000]", c.timeout.count()));
  return Status::Ok();
}

}  // namespace kiln::distributed
