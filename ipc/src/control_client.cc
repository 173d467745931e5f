#include "kiln/ipc/control_client.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "kiln/ipc/handshake.h"
#include "kiln/ipc/protocol.h"
#include "kiln/ipc/unix_socket.h"

namespace kiln::ipc {

ClientConnection::ClientConnection(UniqueFd socket, Endpoint endpoint, std::uint64_t client_id, std::string job)
    : socket_(std::move(socket)), endpoint_(std::move(endpoint)), client_id_(client_id), job_(std::move(job)) {
  endpoint_.watch_hangup(socket_.get());
}

bool ClientConnection::daemon_alive() const {
  pollfd p{socket_.get(), POLLIN, 0};
  // The daemon never writes after the handshake: readable means EOF (or a broken peer).
  return ::poll(&p, 1, 0) == 0;
}

Result<ClientConnection> connect_to_daemon(const ClientOptions& options) {
  KILN_RETURN_IF_ERROR(validate_job_name(options.job));
  const std::string dir = options.runtime_dir.empty() ? default_runtime_dir() : options.runtime_dir;
  KILN_ASSIGN_OR_RETURN(const std::string path, socket_path(dir, options.socket_name));
  const std::uint16_t version = options.protocol_version != 0 ? options.protocol_version : kProtocolVersion;

  UniqueFd sock(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!sock) return sys_error("socket", errno);
  // Bound every blocking step: a hung daemon must not hang the client.
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(options.timeout.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((options.timeout.count() % 1000) * 1000);
  ::setsockopt(sock.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(sock.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);

  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  if (::connect(sock.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
    const int err = errno;
    if (err == ENOENT || err == ECONNREFUSED) {
      return make_error(ErrorCode::Execution, "daemon not running at " + path);
    }
    if (err == EACCES || err == EPERM) {
      // The runtime directory is private to the daemon's user (0700), or to its allowed group.
      return make_error(ErrorCode::Invalid, "refused: no permission to reach " + path +
                                                " (the daemon accepts only its own user and its --allowed-group)");
    }
    return sys_error("connecting to the daemon at " + path, err);
  }
  // Who answers: a socket planted by another user (in a runtime dir it could create first, or
  // through a path the client was pointed to) must not receive our hello, let alone our data.
  Result<PeerCredentials> daemon = peer_credentials(sock.get());
  if (!daemon.ok())
    return make_error(ErrorCode::Execution,
                      "reading the credentials of the daemon at " + path + ": " + daemon.error().message);
  if (Status trusted = check_daemon_peer(::geteuid(), *daemon); !trusted.ok())
    return make_error(ErrorCode::Invalid, "refused: not trusting " + path + ": " + trusted.error().message);

  const auto hello = encode_hello(Hello{version, options.job});
  if (Status st = send_with_fds(sock.get(), hello, {}, options.timeout); !st.ok()) {
    return make_error(ErrorCode::Execution, "sending the handshake to " + path + ": " + st.error().message);
  }

  std::vector<UniqueFd> fds;
  auto read_failed = [&](const Status& st) {
    if (st.error().message == "timed out") {
      return make_error(ErrorCode::Execution, "daemon at " + path + " did not answer the handshake within " +
                                                  std::to_string(options.timeout.count()) + " ms");
    }
    return make_error(st.error().code, "handshake with " + path + ": " + st.error().message);
  };
  std::array<std::uint8_t, kFramePrefixBytes> prefix_bytes{};
  if (Status st = recv_exact_with_fds(sock.get(), prefix_bytes, fds); !st.ok()) return read_failed(st);
  KILN_ASSIGN_OR_RETURN(const FramePrefix prefix, decode_prefix(prefix_bytes));
  std::vector<std::uint8_t> body(prefix.body_len);
  if (Status st = recv_exact_with_fds(sock.get(), body, fds); !st.ok()) return read_failed(st);
  KILN_ASSIGN_OR_RETURN(Reply reply, decode_reply(prefix, body));

  if (reply.version != version) {
    return make_error(ErrorCode::Unsupported, "protocol version mismatch: daemon " + std::to_string(reply.version) +
                                                  ", client " + std::to_string(version));
  }
  if (!reply.accepted) return make_error(ErrorCode::Invalid, "refused: " + reply.reason);
  if (fds.size() != kHandshakeFds || reply.num_fds != kHandshakeFds) {
    return make_error(ErrorCode::Decode, "handshake reply carried " + std::to_string(fds.size()) +
                                             " file descriptors, expected " + std::to_string(kHandshakeFds));
  }
  Bells bells;
  for (std::size_t i = 0; i < kNumBells; ++i) bells[i] = std::move(fds[i + 1]);
  KILN_ASSIGN_OR_RETURN(Endpoint ep, Endpoint::attach_client_side(std::move(fds[0]), std::move(bells)));
  return ClientConnection(std::move(sock), std::move(ep), reply.client_id, options.job);
}

}  // namespace kiln::ipc
