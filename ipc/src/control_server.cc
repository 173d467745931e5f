#include "kiln/ipc/control_server.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <cerrno>
#include <cstring>
#include <map>
#include <vector>

#include "kiln/ipc/protocol.h"
#include "kiln/ipc/unix_socket.h"

namespace kiln::ipc {

namespace asio = boost::asio;
using local_socket = asio::local::stream_protocol::socket;
using boost::system::error_code;

namespace {

// Is something answering on `path`? Used to tell a live daemon from a stale socket file.
bool daemon_answers(const std::string& path) {
  UniqueFd s(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s) return false;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  return ::connect(s.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0;
}

}  // namespace

struct ControlServer::Impl : std::enable_shared_from_this<ControlServer::Impl> {
  struct Conn {
    explicit Conn(local_socket s) : socket(std::move(s)), timer(socket.get_executor()) {}
    local_socket socket;
    asio::steady_timer timer;
    std::uint64_t id = 0;
    PeerCredentials peer;
    std::array<std::uint8_t, kFramePrefixBytes> prefix{};
    std::vector<std::uint8_t> body;
    std::array<std::uint8_t, 1> watch_byte{};
    bool kicked = false;
    bool counted = false;                // in open_total / open_by_uid (uncount)
    std::string over_limit;              // non-empty: refused after its hello, with this reason
    const char* over_limit_reason = "";  // its metrics label
  };

  Impl(asio::io_context& io, ServerOptions o, ServerCallbacks cb)
      : strand(asio::make_strand(io)),
        acceptor(strand),
        retry_timer(strand),
        options(std::move(o)),
        callbacks(std::move(cb)) {}

  asio::strand<asio::io_context::executor_type> strand;
  asio::local::stream_protocol::acceptor acceptor;
  asio::steady_timer retry_timer;  // backs off after accept errors (EMFILE would spin)
  ServerOptions options;
  ServerCallbacks callbacks;
  CredentialPolicy policy;
  std::string path;
  ino_t socket_inode = 0;
  std::uint64_t next_id = 1;
  bool stopped = false;
  std::map<std::uint64_t, std::shared_ptr<Conn>> clients;  // handshaken, watched
  std::size_t open_total = 0;                              // connections counted (accepted, not dropped)
  std::map<uid_t, std::size_t> open_by_uid;

  // Counts a new connection against the limits; false when it must be closed unread (far past
  // one). A connection just past a limit is counted and marked to be refused with the reason.
  bool count(Conn& c) {
    std::size_t& mine = open_by_uid[c.peer.uid];
    if (open_total >= options.max_connections + kRefusalSlack ||
        mine >= options.max_connections_per_uid + kRefusalSlack) {
      if (mine == 0) open_by_uid.erase(c.peer.uid);
      refused("flood");
      return false;
    }
    if (open_total >= options.max_connections) {
      c.over_limit_reason = "connection_limit";
      c.over_limit = "the daemon has " + std::to_string(open_total) + " connections open, its limit " +
                     "(daemon.max_connections = " + std::to_string(options.max_connections) + "); try again later";
    } else if (mine >= options.max_connections_per_uid) {
      c.over_limit_reason = "uid_connection_limit";
      c.over_limit = "uid " + std::to_string(c.peer.uid) + " has " + std::to_string(mine) +
                     " connections open, its limit (daemon.max_connections_per_uid = " +
                     std::to_string(options.max_connections_per_uid) + "); close one first";
    }
    ++open_total;
    ++mine;
    c.counted = true;
    return true;
  }
  void refused(std::string_view reason) {
    if (callbacks.on_refused) callbacks.on_refused(reason);
  }
  void uncount(Conn& c) {
    if (!c.counted) return;
    c.counted = false;
    --open_total;
    if (auto it = open_by_uid.find(c.peer.uid); it != open_by_uid.end() && --it->second == 0) open_by_uid.erase(it);
  }

  void accept_next() {
    acceptor.async_accept([self = shared_from_this()](error_code ec, local_socket s) {
      if (self->stopped) return;
      if (!ec) {
        self->begin_handshake(std::make_shared<Conn>(std::move(s)));
        return self->accept_next();
      }
      // Transient accept errors (EMFILE, ECONNABORTED) must not stop the server, and retrying
      // at once would spin while the condition lasts: 50 ms is far below a client's timeout.
      self->retry_timer.expires_after(std::chrono::milliseconds(50));
      self->retry_timer.async_wait([self](error_code) {
        if (!self->stopped) self->accept_next();
      });
    });
  }

  void begin_handshake(const std::shared_ptr<Conn>& c) {
    auto creds = peer_credentials(c->socket.native_handle());
    if (!creds.ok()) return;  // drop: cannot know who it is
    c->peer = std::move(creds).value();
    if (!count(*c)) return;  // far past a limit: closed unread (the socket goes with `c`)
    c->timer.expires_after(options.handshake_timeout);
    c->timer.async_wait([c](error_code ec) {
      if (!ec) {
        error_code ignored;
        c->socket.close(ignored);  // pending reads complete with operation_aborted
      }
    });
    asio::async_read(c->socket, asio::buffer(c->prefix), [self = shared_from_this(), c](error_code ec, std::size_t) {
      if (ec || self->stopped) return self->drop(c);
      auto prefix = decode_prefix(c->prefix);
      if (!prefix.ok() || prefix->magic != kHelloMagic) return self->drop(c);  // not a kiln client
      c->body.resize(prefix->body_len);
      const FramePrefix p = *prefix;
      asio::async_read(c->socket, asio::buffer(c->body), [self, c, p](error_code ec2, std::size_t) {
        if (ec2 || self->stopped) return self->drop(c);
        self->finish_handshake(c, p);
      });
    });
  }

  void drop(const std::shared_ptr<Conn>& c) {
    uncount(*c);
    error_code ignored;
    c->timer.cancel();
    c->socket.close(ignored);
  }

  void refuse(const std::shared_ptr<Conn>& c, const std::string& reason) {
    Reply r;
    r.version = kProtocolVersion;
    r.accepted = false;
    r.reason = reason;
    // The hello was read in full, so closing right after leaves the reply readable by the client.
    (void)send_with_fds(c->socket.native_handle(), encode_reply(r), {}, std::chrono::milliseconds(1000));
    drop(c);
  }

  void finish_handshake(const std::shared_ptr<Conn>& c, const FramePrefix& p) {
    if (p.version != kProtocolVersion) {
      refused("protocol_version");
      return refuse(c, "protocol version mismatch: daemon " + std::to_string(kProtocolVersion) + ", client " +
                           std::to_string(p.version));
    }
    auto hello = decode_hello(p, c->body);
    if (!hello.ok()) {
      refused("bad_hello");
      return refuse(c, hello.error().message);
    }
    if (!c->over_limit.empty()) {
      refused(c->over_limit_reason);
      return refuse(c, c->over_limit);
    }
    if (Status st = check_peer(policy, c->peer); !st.ok()) {
      refused("credentials");
      return refuse(c, st.error().message);
    }
    if (callbacks.admit) {
      if (Status st = callbacks.admit(c->peer, hello->job); !st.ok()) return refuse(c, st.error().message);
    }
    auto ep = Endpoint::create_daemon_side(options.segment);
    if (!ep.ok()) {
      refused("segment");
      return refuse(c, "daemon could not create the segment: " + ep.error().message);
    }

    c->id = next_id++;
    Reply r;
    r.version = kProtocolVersion;
    r.accepted = true;
    r.num_fds = kHandshakeFds;
    r.client_id = c->id;
    const std::array<int, kHandshakeFds> fds = {ep->memfd(), ep->bell_fd(Bell::CommandData),
                                                ep->bell_fd(Bell::CommandSpace), ep->bell_fd(Bell::CompletionData),
                                                ep->bell_fd(Bell::CompletionSpace)};
    if (!send_with_fds(c->socket.native_handle(), encode_reply(r), fds, std::chrono::milliseconds(1000)).ok()) {
      return drop(c);
    }
    c->timer.cancel();
    clients.emplace(c->id, c);
    watch(c);
    auto accepted =
        std::make_unique<AcceptedClient>(AcceptedClient{c->id, c->peer, std::move(hello->job), std::move(ep).value()});
    callbacks.on_client(std::move(accepted));
  }

  // After the handshake the client never writes to the socket: the read completes only at EOF,
  // on error, on a protocol violation, or when the daemon closes it.
  void watch(const std::shared_ptr<Conn>& c) {
    c->socket.async_read_some(
        asio::buffer(c->watch_byte), [self = shared_from_this(), c](error_code ec, std::size_t n) {
          if (self->stopped) return;
          auto it = self->clients.find(c->id);
          if (it == self->clients.end()) return;
          self->clients.erase(it);
          Status why;
          if (c->kicked) {
            why = make_error(ErrorCode::Execution, "disconnected by the daemon");
          } else if (!ec && n > 0) {
            why = make_error(ErrorCode::Decode, "client sent data on the control socket after the handshake");
          } else if (ec && ec != asio::error::eof) {
            why = make_error(ErrorCode::Execution, "control socket: " + ec.message());
          }
          self->drop(c);
          self->callbacks.on_disconnect(c->id, why);
        });
  }

  void do_stop() {
    if (stopped) return;
    stopped = true;
    error_code ignored;
    acceptor.close(ignored);
    retry_timer.cancel();
    for (auto& [id, c] : clients) drop(c);
    clients.clear();
    // Remove the socket file only if it is still ours (not one a successor daemon bound).
    struct stat st {};
    if (::lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode) && st.st_ino == socket_inode) ::unlink(path.c_str());
  }
};

ControlServer::ControlServer(std::shared_ptr<Impl> impl, std::string path)
    : impl_(std::move(impl)), path_(std::move(path)) {}

Result<std::unique_ptr<ControlServer>> ControlServer::start(asio::io_context& io, ServerOptions options,
                                                            ServerCallbacks callbacks) {
  if (!callbacks.on_client || !callbacks.on_disconnect) {
    return make_error(ErrorCode::Invalid, "control server: on_client and on_disconnect are required");
  }
  if (options.runtime_dir.empty()) options.runtime_dir = default_runtime_dir();
  KILN_RETURN_IF_ERROR(compute_layout(options.segment).status());
  KILN_RETURN_IF_ERROR(ensure_runtime_dir(options.runtime_dir, options.allowed_gid));
  KILN_ASSIGN_OR_RETURN(std::string path, ipc::socket_path(options.runtime_dir, options.socket_name));

  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) return make_error(ErrorCode::Config, path + " exists and is not a socket");
    if (daemon_answers(path)) return make_error(ErrorCode::Config, "another daemon is already running at " + path);
    ::unlink(path.c_str());  // stale: left by a daemon that died
  }

  auto impl = std::make_shared<Impl>(io, std::move(options), std::move(callbacks));
  impl->policy = CredentialPolicy::for_this_process(impl->options.allowed_gid);
  impl->path = path;
  error_code ec;
  impl->acceptor.open(asio::local::stream_protocol(), ec);
  if (!ec) impl->acceptor.bind(asio::local::stream_protocol::endpoint(path), ec);
  if (ec) return make_error(ErrorCode::Execution, "binding " + path + ": " + ec.message());
  // Only the credential check decides who gets in, but the file mode keeps others from even
  // connecting: owner only, or owner and the allowed group.
  const mode_t mode = impl->options.allowed_gid ? 0660 : 0600;
  if (impl->options.allowed_gid && ::chown(path.c_str(), static_cast<uid_t>(-1), *impl->options.allowed_gid) != 0) {
    return sys_error("giving " + path + " to group " + std::to_string(*impl->options.allowed_gid), errno);
  }
  if (::chmod(path.c_str(), mode) != 0) return sys_error("chmod of " + path, errno);
  if (::lstat(path.c_str(), &st) != 0) return sys_error("stat of " + path, errno);
  impl->socket_inode = st.st_ino;
  impl->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return make_error(ErrorCode::Execution, "listening on " + path + ": " + ec.message());
  asio::dispatch(impl->strand, [impl] { impl->accept_next(); });
  return std::unique_ptr<ControlServer>(new ControlServer(std::move(impl), std::move(path)));
}

ControlServer::~ControlServer() {
  // The posted stop allocates its handler: a destructor must not throw, and out of memory the
  // clients are closed when the io_context goes (the unlink below still runs).
  try {
    stop();
  } catch (...) {
  }
  // Also here, synchronously: if the io_context is not running, the posted stop waits, but a
  // destroyed server must not leave its socket file behind. Same inode check as do_stop.
  struct stat st {};
  if (::lstat(path_.c_str(), &st) == 0 && S_ISSOCK(st.st_mode) && st.st_ino == impl_->socket_inode) {
    ::unlink(path_.c_str());
  }
}

void ControlServer::stop() {
  asio::dispatch(impl_->strand, [impl = impl_] { impl->do_stop(); });
}

void ControlServer::disconnect(std::uint64_t client_id) {
  asio::dispatch(impl_->strand, [impl = impl_, client_id] {
    auto it = impl->clients.find(client_id);
    if (it == impl->clients.end()) return;
    it->second->kicked = true;
    error_code ignored;
    it->second->socket.cancel(ignored);  // the watch completes with operation_aborted
  });
}

void ControlServer::set_connection_limits(std::size_t max_connections, std::size_t max_connections_per_uid) {
  asio::dispatch(impl_->strand, [impl = impl_, max_connections, max_connections_per_uid] {
    impl->options.max_connections = std::max<std::size_t>(1, max_connections);
    impl->options.max_connections_per_uid = std::max<std::size_t>(1, max_connections_per_uid);
  });
}

}  // namespace kiln::ipc
