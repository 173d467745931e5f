// The client side of the control socket: connect, handshake, receive the segment and doorbells,
// and hand back a ready ClientConnection.
//
// Thread-safety: connect_to_daemon is a plain blocking function. A ClientConnection follows the
// Endpoint rules (one sender and one receiver thread at a time).
//
// Usage:
//   KILN_ASSIGN_OR_RETURN(ClientConnection conn, connect_to_daemon({.job = "resnet-train"}));
//   Endpoint& ep = conn.endpoint();   // send commands, receive completions (endpoint.h)
// Errors are what a user needs to act on:
//   "daemon not running at /run/user/1000/kiln/kilnd-cpu.sock"
//   "refused: uid 1001 not allowed"
//   "refused: not trusting PATH: the daemon runs as uid 1001, neither this process's uid 1000 nor root"
//   "protocol version mismatch: daemon 2, client 1"
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "kiln/base/result.h"
#include "kiln/ipc/endpoint.h"
#include "kiln/ipc/fd.h"

namespace kiln::ipc {

struct ClientOptions {
  std::string runtime_dir;  // empty: default_runtime_dir()
  std::string socket_name = "kilnd-cpu.sock";
  std::string job = "default";
  std::chrono::milliseconds timeout{10'000};  // bounds connect + handshake
  // Sent in the hello; tests override it to check the mismatch path.
  std::uint16_t protocol_version = 0;  // 0: kProtocolVersion
};

class ClientConnection {
 public:
  ClientConnection(ClientConnection&&) noexcept = default;
  ClientConnection& operator=(ClientConnection&&) noexcept = default;

  std::uint64_t client_id() const { return client_id_; }
  const std::string& job() const { return job_; }
  Endpoint& endpoint() { return endpoint_; }
  int socket_fd() const { return socket_.get(); }
  // False once the daemon closed the control socket (non-blocking check).
  bool daemon_alive() const;

 private:
  friend Result<ClientConnection> connect_to_daemon(const ClientOptions& options);
  ClientConnection(UniqueFd socket, Endpoint endpoint, std::uint64_t client_id, std::string job);
  UniqueFd socket_;  // kept open: closing it tells the daemon we are gone
  Endpoint endpoint_;
  std::uint64_t client_id_;
  std::string job_;
};

Result<ClientConnection> connect_to_daemon(const ClientOptions& options);

}  // namespace kiln::ipc
