// The daemon's control socket: accepts clients on a Unix socket in the runtime directory,
// checks their credentials and handshake, creates each client's segment and passes it with the
// doorbells over the socket, then watches the socket so the daemon learns when a client goes.
//
// Per connection: accept -> SO_PEERCRED -> read hello (bounded, with a deadline) -> version,
// job name, credential policy, admission callback -> Endpoint::create_daemon_side -> reply
// with 5 descriptors -> on_client(...) -> async read on the socket; EOF (or any byte: the
// protocol sends nothing more) -> on_disconnect(...). A refused client gets a reply with the
// reason, then the socket is closed.
//
// Thread-safety: every handler runs on the server's strand of the io_context, so the callbacks
// never run concurrently with each other. stop() and disconnect() may be called from any
// thread (they post to the strand). Destroy the server before its io_context.
//
// Usage:
//   boost::asio::io_context io;
//   ServerCallbacks cb;
//   cb.on_client = [&](std::unique_ptr<AcceptedClient> c) { sessions.start(std::move(c)); };
//   cb.on_disconnect = [&](std::uint64_t id, const Status& why) { sessions.remove(id); };
//   KILN_ASSIGN_OR_RETURN(auto server, ControlServer::start(io, ServerOptions{.runtime_dir = dir}, cb));
//   io.run();
#pragma once

#include <sys/types.h>

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "kiln/base/result.h"
#include "kiln/ipc/endpoint.h"
#include "kiln/ipc/handshake.h"
#include "kiln/ipc/segment.h"

namespace kiln::ipc {

struct ServerOptions {
  std::string runtime_dir;                            // empty: default_runtime_dir()
  std::string socket_name = "kilnd-cpu.sock";         // the CPU daemon's (daemon_socket_name)
  std::optional<gid_t> allowed_gid;                   // besides our own uid (runtime dir becomes 0710)
  SegmentConfig segment;                              // per-client segment sizes
  std::chrono::milliseconds handshake_timeout{5000};  // a silent client is dropped after this
  // Connections open at once (handshaking or connected), in all and per client uid. One past a
  // limit is refused with a message naming it, after its hello; past the limit plus
  // kRefusalSlack it is closed at once, unread, so a flood cannot exhaust the daemon's files.
  std::size_t max_connections = 1024;
  std::size_t max_connections_per_uid = 128;
};
// Connections beyond a limit that are still answered with the reason (see ServerOptions).
inline constexpr std::size_t kRefusalSlack = 16;

// A client that completed the handshake. Ownership passes to on_client.
struct AcceptedClient {
  std::uint64_t client_id = 0;  // assigned by the server, never reused by it
  PeerCredentials peer;
  std::string job;
  Endpoint endpoint;  // daemon side: receive commands, send completions
};

struct ServerCallbacks {
  // Optional admission after the credential policy (e.g. per-job quotas). An error refuses the
  // client; its message is the reason the client sees.
  std::function<Status(const PeerCredentials&, std::string_view job)> admit;
  // Required. A client is connected; its endpoint is ready.
  std::function<void(std::unique_ptr<AcceptedClient>)> on_client;
  // Optional. A connection was refused before admission, with a reason for the metrics:
  // "connection_limit", "uid_connection_limit", "flood" (closed unread, far past a limit),
  // "credentials", "protocol_version", "bad_hello" or "segment". (Refusals by `admit` are its
  // caller's to count.)
  std::function<void(std::string_view reason)> on_refused;
  // Required. The client's control socket closed: Ok for an orderly EOF (the client process
  // exited or closed its connection), an error otherwise ("client sent data on the control
  // socket", "disconnected by the daemon", a socket error). Not called after stop().
  std::function<void(std::uint64_t client_id, const Status& why)> on_disconnect;
};

class ControlServer {
 public:
  // Creates the runtime dir (0700/0710, checked), replaces a stale socket file (refuses if a
  // daemon answers on it: "another daemon is already running at PATH"), binds, listens and
  // starts accepting on `io`.
  static Result<std::unique_ptr<ControlServer>> start(boost::asio::io_context& io, ServerOptions options,
                                                      ServerCallbacks callbacks);
  ~ControlServer();  // stop()
  ControlServer(const ControlServer&) = delete;
  ControlServer& operator=(const ControlServer&) = delete;

  const std::string& socket_path() const { return path_; }
  // Stops accepting, closes every client socket, removes the socket file. Idempotent.
  void stop();
  // Closes one client's socket (e.g. after it corrupted its ring); on_disconnect follows.
  void disconnect(std::uint64_t client_id);
  // New connection limits (ServerOptions' max_connections and max_connections_per_uid, >= 1),
  // applied from the next connection.
  void set_connection_limits(std::size_t max_connections, std::size_t max_connections_per_uid);

  struct Impl;

 private:
  ControlServer(std::shared_ptr<Impl> impl, std::string path);
  std::shared_ptr<Impl> impl_;
  std::string path_;
};

}  // namespace kiln::ipc
