// The metrics endpoint (kiln/ipc/metrics_server.h).
#include "kiln/ipc/metrics_server.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/read_until.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/streambuf.hpp>
#include <boost/asio/write.hpp>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <thread>

namespace kiln::ipc {

namespace asio = boost::asio;
using boost::system::error_code;

Result<MetricsListen> parse_metrics_listen(std::string_view text, bool allow_remote) {
  constexpr std::string_view kForms = "expected unix, unix:PATH, tcp:HOST:PORT or tcp:[HOST]:PORT";
  MetricsListen l;
  if (text == "unix") return l;
  if (text.substr(0, 5) == "unix:") {
    l.path = std::string(text.substr(5));
    if (l.path.empty() || l.path[0] != '/')
      return make_error(ErrorCode::Config, fmt::format("metrics '{}': the socket path must be absolute", text));
    return l;
  }
  if (text.substr(0, 4) != "tcp:") return make_error(ErrorCode::Config, fmt::format("metrics '{}': {}", text, kForms));
  l.kind = MetricsListen::Kind::Tcp;
  std::string_view rest = text.substr(4);
  std::string_view host, port;
  if (!rest.empty() && rest[0] == '[') {
    const std::size_t close = rest.find(']');
    if (close == std::string_view::npos || close + 1 >= rest.size() || rest[close + 1] != ':')
      return make_error(ErrorCode::Config, fmt::format("metrics '{}': {}", text, kForms));
    host = rest.substr(1, close - 1);
    port = rest.substr(close + 2);
  } else {
    const std::size_t colon = rest.rfind(':');
    if (colon == std::string_view::npos)
      return make_error(ErrorCode::Config, fmt::format("metrics '{}': {}", text, kForms));
    host = rest.substr(0, colon);
    port = rest.substr(colon + 1);
  }
  unsigned value = 0;
  const auto [ptr, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (ec != std::errc() || ptr != port.data() + port.size() || port.empty() || value > 65535)
    return make_error(ErrorCode::Config, fmt::format("metrics '{}': port '{}' is not 0..65535", text, port));
  l.port = static_cast<std::uint16_t>(value);
  error_code bad;
  const asio::ip::address address = asio::ip::make_address(std::string(host), bad);
  if (bad) return make_error(ErrorCode::Config, fmt::format("metrics '{}': '{}' is not an IP address", text, host));
  if (!address.is_loopback() && !allow_remote)
    return make_error(ErrorCode::Config,
                      fmt::format("metrics '{}': {} is not a loopback address; the metrics name jobs and uids, so "
                                  "other addresses need daemon.metrics_allow_remote = true",
                                  text, host));
  l.host = address.to_string();
  return l;
}

namespace {

struct Answer {
  int status;
  const char* reason;
  std::string content_type;
  std::string body;
};

// The answer to one request head (the bytes up to the blank line).
Answer answer(std::string_view head, const std::function<std::string()>& body) {
  const std::size_t line_end = head.find("\r\n");
  const std::string_view line = head.substr(0, line_end);
  const std::size_t sp1 = line.find(' '), sp2 = line.rfind(' ');
  if (sp1 == std::string_view::npos || sp2 == sp1 || line.substr(sp2 + 1, 7) != "HTTP/1.")
    return {400, "Bad Request", "text/plain", "malformed request line\n"};
  const std::string_view method = line.substr(0, sp1), target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  if (method != "GET" && method != "HEAD") return {405, "Method Not Allowed", "text/plain", "only GET\n"};
  const std::string_view path = target.substr(0, target.find('?'));
  if (path != "/metrics") return {404, "Not Found", "text/plain", "the metrics are at /metrics\n"};
  return {200, "OK", "text/plain; version=0.0.4; charset=utf-8", method == "HEAD" ? std::string() : body()};
}

}  // namespace

struct MetricsServer::Impl {
  MetricsServerOptions options;
  asio::io_context io;
  std::optional<asio::local::stream_protocol::acceptor> unix_acceptor;
  std::optional<asio::ip::tcp::acceptor> tcp_acceptor;
  std::string address, unix_path;
  ino_t unix_inode = 0;
  std::thread thread;
  std::atomic<std::uint64_t> scrapes{0};
  std::size_t open = 0;  // connections being served (io thread only)
  bool stopped = false;  // guarded by the stop sequence: set before io stops

  template <class Socket>
  struct Conn {
    explicit Conn(Socket s) : socket(std::move(s)), timer(socket.get_executor()) {}
    Socket socket;  // first: the timer is made on its executor
    asio::steady_timer timer;
    asio::streambuf in{kMaxRequestBytes};
    std::string out;
  };

  template <class Acceptor>
  void accept(Acceptor& acceptor) {
    acceptor.async_accept([this, &acceptor](error_code ec, typename Acceptor::protocol_type::socket s) {
      if (ec == asio::error::operation_aborted) return;
      if (!ec) serve(std::move(s));
      accept(acceptor);
    });
  }

  template <class Socket>
  void serve(Socket s) {
    if (open >= kMaxMetricsConnections) return;  // closed unanswered: s goes out of scope
    ++open;
    auto c = std::make_shared<Conn<Socket>>(std::move(s));
    c->timer.expires_after(options.request_timeout);
    c->timer.async_wait([c](error_code ec) {
      if (ec) return;
      error_code ignored;
      c->socket.close(ignored);
    });
    asio::async_read_until(c->socket, c->in, "\r\n\r\n", [this, c](error_code ec, std::size_t n) {
      Answer a;
      if (ec == asio::error::not_found) {
        a = {400, "Bad Request", "text/plain", "request head over 8192 bytes\n"};
      } else if (ec) {
        return finish(c);
      } else {
        const std::string head(asio::buffers_begin(c->in.data()), asio::buffers_begin(c->in.data()) + n);
        a = answer(head, options.body);
      }
      if (a.status == 200) scrapes.fetch_add(1, std::memory_order_relaxed);
      c->out = fmt::format("HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{}",
                           a.status, a.reason, a.content_type, a.body.size(), a.body);
      asio::async_write(c->socket, asio::buffer(c->out), [this, c](error_code, std::size_t) { finish(c); });
    });
  }

  template <class C>
  void finish(const std::shared_ptr<C>& c) {
    error_code ignored;
    c->timer.cancel();
    c->socket.shutdown(asio::socket_base::shutdown_both, ignored);
    c->socket.close(ignored);
    --open;
  }

  Status bind_unix() {
    unix_path = options.listen.path.empty() ? options.default_unix_path : options.listen.path;
    struct stat st {};
    if (::lstat(unix_path.c_str(), &st) == 0) {
      if (!S_ISSOCK(st.st_mode)) return make_error(ErrorCode::Config, unix_path + " exists and is not a socket");
      ::unlink(unix_path.c_str());  // stale: the device lock says no other daemon of this device runs
    }
    error_code ec;
    auto& a = unix_acceptor.emplace(io);
    a.open(asio::local::stream_protocol(), ec);
    if (!ec) a.bind(asio::local::stream_protocol::endpoint(unix_path), ec);
    if (ec) return make_error(ErrorCode::Config, "metrics: binding " + unix_path + ": " + ec.message());
    if (options.allowed_gid && ::chown(unix_path.c_str(), static_cast<uid_t>(-1), *options.allowed_gid) != 0)
      return make_error(ErrorCode::Config, fmt::format("metrics: giving {} to group {}: {}", unix_path,
                                                       *options.allowed_gid, std::strerror(errno)));
    if (::chmod(unix_path.c_str(), options.allowed_gid ? 0660 : 0600) != 0 || ::lstat(unix_path.c_str(), &st) != 0)
      return make_error(ErrorCode::Config, "metrics: chmod of " + unix_path + ": " + std::strerror(errno));
    unix_inode = st.st_ino;
    a.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) return make_error(ErrorCode::Config, "metrics: listening on " + unix_path + ": " + ec.message());
    address = "unix:" + unix_path;
    accept(a);
    return Status::Ok();
  }

  Status bind_tcp() {
    error_code ec;
    const asio::ip::tcp::endpoint at(asio::ip::make_address(options.listen.host), options.listen.port);
    auto& a = tcp_acceptor.emplace(io);
    a.open(at.protocol(), ec);
    if (!ec) a.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) a.bind(at, ec);
    if (!ec) a.listen(asio::socket_base::max_listen_connections, ec);
    if (ec)
      return make_error(ErrorCode::Config, fmt::format("metrics: listening on {}:{}: {}", options.listen.host,
                                                       options.listen.port, ec.message()));
    const auto bound = a.local_endpoint(ec);
    address = at.address().is_v6() ? fmt::format("tcp:[{}]:{}", options.listen.host, bound.port())
                                   : fmt::format("tcp:{}:{}", options.listen.host, bound.port());
    accept(a);
    return Status::Ok();
  }
};

MetricsServer::MetricsServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
MetricsServer::~MetricsServer() { stop(); }

Result<std::unique_ptr<MetricsServer>> MetricsServer::start(MetricsServerOptions options) {
  if (!options.body) return make_error(ErrorCode::Invalid, "metrics server: no body");
  auto impl = std::make_unique<Impl>();
  impl->options = std::move(options);
  KILN_RETURN_IF_ERROR(impl->options.listen.kind == MetricsListen::Kind::Unix ? impl->bind_unix() : impl->bind_tcp());
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->io.run(); });
  return std::unique_ptr<MetricsServer>(new MetricsServer(std::move(impl)));
}

const std::string& MetricsServer::address() const { return impl_->address; }
std::uint64_t MetricsServer::scrapes() const { return impl_->scrapes.load(std::memory_order_relaxed); }

void MetricsServer::stop() {
  Impl& s = *impl_;
  if (s.stopped) return;
  s.stopped = true;
  s.io.stop();
  if (s.thread.joinable()) s.thread.join();
  error_code ignored;
  if (s.unix_acceptor) s.unix_acceptor->close(ignored);
  if (s.tcp_acceptor) s.tcp_acceptor->close(ignored);
  struct stat st {};
  if (!s.unix_path.empty() && ::lstat(s.unix_path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode) &&
      st.st_ino == s.unix_inode)
    ::unlink(s.unix_path.c_str());
}

}  // namespace kiln::ipc
