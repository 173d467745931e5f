// DistributedConfig: which job of this daemon spans daemons, its rank, its world and where the
// daemons meet (kiln.toml [distributed], kilnd's --dist-* flags, KILN_DIST_* variables).
//
//   [distributed]
//   job = "train"                    # the job name its clients give; other jobs stay single-device
//   rank = 0                         # this daemon's rank, 0 <= rank < world_size
//   world_size = 2
//   rendezvous = "tcp:10.0.0.1:29400"  # rank 0 serves the store there, every rank connects
//   host = "10.0.0.2"                # optional: the address peers reach this daemon's transport at
//   timeout_ms = 30000               # meetings and collectives fail after this long
//
// Thread-safety: pure functions.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "kiln/base/result.h"

namespace kiln::distributed {

// The address form of the rendezvous: tcp:HOST:PORT or tcp:[IPv6]:PORT. HOST is a numeric
// address (a name would make each rank resolve it on its own, perhaps differently).
struct TcpAddress {
  std::string host;
  std::uint16_t port = 0;
  std::string to_string() const;
};
Result<TcpAddress> parse_tcp_address(std::string_view text);

struct DistributedConfig {
  std::string job;
  std::uint32_t rank = 0;
  std::uint32_t world_size = 0;
  TcpAddress rendezvous;
  // Where this daemon's transport listens for its peers; empty: the local address of its
  // connection to the rendezvous (the interface that reaches rank 0).
  std::string host;
  std::chrono::milliseconds timeout{30'000};
};

// The most ranks one job may have: the store keeps a connection thread per rank, and the tests
// and the plan for scale (docs/distributed.md) stop well below it.
inline constexpr std::uint32_t kMaxWorldSize = 1024;

// Checks a configuration: a job name (its characters are the daemon's rule, checked where the
// daemon reads it: ipc::validate_job_name), 1 <= world_size <= kMaxWorldSize, rank < world_size, a timeout of 1 ms to 1 hour. Errors are
// ErrorCode::Config naming the key.
Status validate(const DistributedConfig& config);

}  // namespace kiln::distributed
