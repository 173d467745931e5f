// The rendezvous store's wire and both ends (store.h).
//
// Wire: frames of a u32 little-endian length and a payload. A request's payload is an op byte
// and its fields; an answer's is a status byte (0 ok, 1 error) and the result, or the error's
// message. Strings and values are a u32 length and their bytes.
//   hello  job, world_size u32, version, rank u32   -> ok
//   set    key, value                               -> ok
//   get    key, timeout_ms u32                      -> value
//   join   timeout_ms u32                           -> generation u64
//   live                                            -> count u32, ranks u32...
#include "kiln/distributed/store.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <optional>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <list>
#include <map>
#include <set>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kiln/base/bytes.h"
#include "kiln/base/mutex.h"
#include "kiln/base/posix.h"

namespace kiln::distributed {
namespace {

using Clock = std::chrono::steady_clock;
using Bytes = std::vector<std::uint8_t>;

enum class StoreOp : std::uint8_t { Hello = 1, Set = 2, Get = 3, Join = 4, Live = 5 };
constexpr std::uint8_t kMaxOp = 5;
// The largest frame: a set of the largest value with the largest key, and its header.
constexpr std::size_t kMaxFrameBytes = kMaxStoreValueBytes + kMaxStoreKeyBytes + 64;
// A store answer may take the request's own timeout (get, join); the client waits this much more
// before it calls the store unreachable.
constexpr std::chrono::milliseconds kAnswerMargin{5'000};

// ---- sockets

union SockAddr {
  sockaddr sa;
  sockaddr_in v4;
  sockaddr_in6 v6;
};

Result<std::pair<SockAddr, socklen_t>> to_sockaddr(const TcpAddress& at) {
  SockAddr addr{};
  if (inet_pton(AF_INET, at.host.c_str(), &addr.v4.sin_addr) == 1) {
    addr.v4.sin_family = AF_INET;
    addr.v4.sin_port = htons(at.port);
    return std::pair{addr, static_cast<socklen_t>(sizeof(sockaddr_in))};
  }
  if (inet_pton(AF_INET6, at.host.c_str(), &addr.v6.sin6_addr) == 1) {
    addr.v6.sin6_family = AF_INET6;
    addr.v6.sin6_port = htons(at.port);
    return std::pair{addr, static_cast<socklen_t>(sizeof(sockaddr_in6))};
  }
  return make_error(ErrorCode::Config, fmt::format("{}: not a numeric address", at.to_string()));
}

std::string host_of(const SockAddr& a) {
  char text[INET6_ADDRSTRLEN] = {};
  if (a.sa.sa_family == AF_INET6) inet_ntop(AF_INET6, &a.v6.sin6_addr, text, sizeof text);
  else inet_ntop(AF_INET, &a.v4.sin_addr, text, sizeof text);
  return text;
}

// Waits for `events` on `fd` until `deadline` (none: forever). false on timeout.
Result<bool> wait_for(int fd, short events, std::optional<Clock::time_point> deadline, const char* what) {
  for (;;) {
    int ms = -1;
    if (deadline) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*deadline - Clock::now()).count();
      if (left <= 0) return false;
      ms = static_cast<int>(std::min<long long>(left, 60'000));
    }
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, ms);
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) return sys_error(what, errno);
  }
}

Status send_frame(int fd, const Bytes& payload) {
  Bytes frame;
  ByteWriter w(frame);
  w.u32(static_cast<std::uint32_t>(payload.size()));
  w.bytes(payload);
  std::size_t sent = 0;
  while (sent < frame.size()) {
    const ssize_t n = ::send(fd, frame.data() + sent, frame.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return sys_error("store send", n < 0 ? errno : EPIPE);
    sent += static_cast<std::size_t>(n);
  }
  return Status::Ok();
}

Status recv_exact(int fd, std::uint8_t* out, std::size_t n, std::optional<Clock::time_point> deadline) {
  std::size_t got = 0;
  while (got < n) {
    KILN_ASSIGN_OR_RETURN(bool ready, wait_for(fd, POLLIN, deadline, "store poll"));
    if (!ready) return make_error(ErrorCode::Execution, "no answer in time");
    const ssize_t r = ::recv(fd, out + got, n - got, 0);
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (r == 0) return make_error(ErrorCode::Execution, "the connection was closed");
    if (r < 0) return sys_error("store recv", errno);
    got += static_cast<std::size_t>(r);
  }
  return Status::Ok();
}

Result<Bytes> recv_frame(int fd, std::optional<Clock::time_point> deadline) {
  std::uint8_t header[4];
  KILN_RETURN_IF_ERROR(recv_exact(fd, header, 4, deadline));
  const std::uint32_t n = static_cast<std::uint32_t>(load_le(header, 4));
  if (n == 0 || n > kMaxFrameBytes)
    return make_error(ErrorCode::Invalid, fmt::format("a frame of {} bytes (1..{} allowed)", n, kMaxFrameBytes));
  Bytes payload(n);
  KILN_RETURN_IF_ERROR(recv_exact(fd, payload.data(), n, deadline));
  return payload;
}

void put_string(ByteWriter& w, std::string_view s) {
  w.u32(static_cast<std::uint32_t>(s.size()));
  w.bytes(s);
}

bool get_bytes(ByteReader& r, std::size_t cap, std::span<const std::uint8_t>& out, const char* what) {
  std::uint32_t n = 0;
  if (!r.fixed(n, what)) return false;
  if (n > cap) return r.fail(fmt::format("{}: {} bytes, at most {}", what, n, cap));
  return r.take(n, out, what);
}

bool get_string(ByteReader& r, std::size_t cap, std::string& out, const char* what) {
  std::span<const std::uint8_t> b;
  if (!get_bytes(r, cap, b, what)) return false;
  out.assign(reinterpret_cast<const char*>(b.data()), b.size());
  return true;
}

Bytes ok_answer() { return Bytes{0}; }
Bytes error_answer(std::string_view message) {
  Bytes out{1};
  ByteWriter w(out);
  put_string(w, message.substr(0, 4096));
  return out;
}

std::string ranks_text(const std::vector<std::uint32_t>& ranks) {
  return fmt::format("{}", fmt::join(ranks, ", "));
}

// The generation a key belongs to: its leading "<n>/" (the group's prefix), if any.
std::optional<std::uint64_t> key_generation(const std::string& key) {
  std::uint64_t g = 0;
  const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), g);
  if (ec != std::errc() || end == key.data() || end == key.data() + key.size() || *end != '/') return std::nullopt;
  return g;
}

}  // namespace

// ---- server

class StoreServer::Impl {
 public:
  Impl(UniqueFd listener, std::uint16_t port, StoreIdentity identity)
      : listener_(std::move(listener)), port_(port), identity_(std::move(identity)),
        live_(identity_.world_size, false) {}

  void start() { acceptor_ = std::thread([this] { accept_loop(); }); }

  void stop() {
    {
      MutexLock lock(mu_);
      stopping_ = true;
      for (auto& c : connections_) ::shutdown(c.fd.get(), SHUT_RDWR);
    }
    ::shutdown(listener_.get(), SHUT_RDWR);
    cv_.notify_all();
    if (acceptor_.joinable()) acceptor_.join();
    std::list<Connection> done;
    {
      MutexLock lock(mu_);
      done.swap(connections_);
    }
    for (auto& c : done)
      if (c.thread.joinable()) c.thread.join();
  }

  std::uint16_t port() const { return port_; }

  std::vector<std::uint32_t> live_ranks() const {
    MutexLock lock(mu_);
    return live_locked();
  }

 private:
  struct Connection {
    UniqueFd fd;
    std::thread thread;
    bool finished = false;  // under mu_: its thread has ended and may be joined
  };

  std::vector<std::uint32_t> live_locked() const KILN_REQUIRES(mu_) {
    std::vector<std::uint32_t> out;
    for (std::uint32_t r = 0; r < live_.size(); ++r)
      if (live_[r]) out.push_back(r);
    return out;
  }

  // A connection per rank and a few more (a restarted daemon's new connection may arrive before
  // the old one's end is seen); beyond that, a connection is closed at once.
  std::size_t max_connections() const { return 2 * std::size_t{identity_.world_size} + 8; }

  void accept_loop() {
    for (;;) {
      const int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        return;  // the listener was shut down (stop) or failed
      }
      UniqueFd conn(fd);
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      MutexLock lock(mu_);
      reap_finished_locked();
      if (stopping_ || connections_.size() >= max_connections()) continue;  // closed by conn's destructor
      connections_.push_back(Connection{std::move(conn), {}, false});
      Connection& c = connections_.back();
      c.thread = std::thread([this, &c] { serve(c); });
    }
  }

  void reap_finished_locked() KILN_REQUIRES(mu_) {
    for (auto it = connections_.begin(); it != connections_.end();) {
      if (it->finished) {
        it->thread.join();  // ended already: returns at once
        it = connections_.erase(it);
      } else {
        ++it;
      }
    }
  }

  void serve(Connection& c) {
    std::optional<std::uint32_t> rank;
    for (;;) {
      Result<Bytes> frame = recv_frame(c.fd.get(), std::nullopt);
      if (!frame.ok()) break;
      ByteReader r(*frame);
      std::uint8_t op = 0;
      if (!r.u8(op, "op") || op == 0 || op > kMaxOp) break;
      // An error here is a refusal (a malformed request, or a hello that may not join): answered,
      // then the connection ends. A request that fails in the ordinary way (a key not set in time)
      // is an error answer, and the connection goes on.
      Result<Bytes> answer = rank ? dispatch(static_cast<StoreOp>(op), r, *rank) : hello(static_cast<StoreOp>(op), r, rank);
      const bool refuse = !answer.ok();
      if (!send_frame(c.fd.get(), refuse ? error_answer(answer.error().message) : *answer).ok() || refuse) break;
    }
    // The peer sees the end now; the descriptor itself is closed when the connection is reaped.
    ::shutdown(c.fd.get(), SHUT_RDWR);
    MutexLock lock(mu_);
    if (rank) leave_locked(*rank);
    c.finished = true;
    cv_.notify_all();
  }

  // The first message: who is this, and may it join.
  Result<Bytes> hello(StoreOp op, ByteReader& r, std::optional<std::uint32_t>& rank) {
    if (op != StoreOp::Hello) return make_error(ErrorCode::Invalid, "the first message must be hello");
    std::string job, version;
    std::uint32_t world = 0, who = 0;
    if (!get_string(r, 64, job, "job") || !r.fixed(world, "world_size") || !get_string(r, 256, version, "version") ||
        !r.fixed(who, "rank") || !r.at_end())
      return make_error(ErrorCode::Invalid, "hello: " + (r.failed() ? r.error() : std::string("trailing bytes")));
    if (job != identity_.job)
      return make_error(ErrorCode::Invalid, fmt::format("this store serves job '{}', not '{}'", identity_.job, job));
    if (world != identity_.world_size)
      return make_error(ErrorCode::Invalid, fmt::format("job '{}' has {} ranks here, the daemon of rank {} says {}",
                                                        job, identity_.world_size, who, world));
    if (version != identity_.version)
      return make_error(ErrorCode::Invalid, fmt::format("rank {} runs {}, rank 0 runs {}: every daemon of a job must "
                                                        "run the same kiln",
                                                        who, version, identity_.version));
    if (who >= world) return make_error(ErrorCode::Invalid, fmt::format("rank {} is not below world_size {}", who, world));
    MutexLock lock(mu_);
    if (live_[who])
      return make_error(ErrorCode::Invalid,
                        fmt::format("rank {} of job '{}' is connected already (two daemons configured as one rank?)",
                                    who, job));
    live_[who] = true;
    rank = who;
    return ok_answer();
  }

  Result<Bytes> dispatch(StoreOp op, ByteReader& r, std::uint32_t rank) {
    const auto malformed = [&r](const char* what) {
      return make_error(ErrorCode::Invalid,
                        fmt::format("{}: {}", what, r.failed() ? r.error() : std::string("trailing bytes")));
    };
    switch (op) {
      case StoreOp::Set: {
        std::string key;
        std::span<const std::uint8_t> value;
        if (!get_string(r, kMaxStoreKeyBytes, key, "key") || !get_bytes(r, kMaxStoreValueBytes, value, "value") ||
            !r.at_end())
          return malformed("set");
        return set(std::move(key), value);
      }
      case StoreOp::Get: {
        std::string key;
        std::uint32_t timeout_ms = 0;
        if (!get_string(r, kMaxStoreKeyBytes, key, "key") || !r.fixed(timeout_ms, "timeout_ms") || !r.at_end())
          return malformed("get");
        return get(key, std::chrono::milliseconds(timeout_ms));
      }
      case StoreOp::Join: {
        std::uint32_t timeout_ms = 0;
        if (!r.fixed(timeout_ms, "timeout_ms") || !r.at_end()) return malformed("join");
        return join(rank, std::chrono::milliseconds(timeout_ms));
      }
      case StoreOp::Live: {
        if (!r.at_end()) return malformed("live");
        Bytes out = ok_answer();
        ByteWriter w(out);
        const std::vector<std::uint32_t> ranks = live_ranks();
        w.u32(static_cast<std::uint32_t>(ranks.size()));
        for (std::uint32_t x : ranks) w.u32(x);
        return out;
      }
      case StoreOp::Hello: return make_error(ErrorCode::Invalid, "hello twice");
    }
    return make_error(ErrorCode::Invalid, "unknown op");
  }

  Result<Bytes> set(std::string key, std::span<const std::uint8_t> value) {
    MutexLock lock(mu_);
    auto it = keys_.find(key);
    const std::size_t old = it == keys_.end() ? 0 : it->second.size();
    if (it == keys_.end() && keys_.size() >= kMaxStoreKeys)
      return error_answer(fmt::format("the store holds {} keys already", kMaxStoreKeys));
    if (bytes_ - old + value.size() > kMaxStoreBytes)
      return error_answer(fmt::format("the store holds {} bytes already", bytes_));
    bytes_ = bytes_ - old + value.size();
    keys_[std::move(key)] = Bytes(value.begin(), value.end());
    cv_.notify_all();
    return ok_answer();
  }

  Result<Bytes> get(const std::string& key, std::chrono::milliseconds timeout) {
    MutexLock lock(mu_);
    const auto deadline = Clock::now() + timeout;
    while (!stopping_ && keys_.find(key) == keys_.end())
      if (cv_.wait_until(lock, deadline) == std::cv_status::timeout) break;
    auto it = keys_.find(key);
    if (it == keys_.end()) return error_answer(fmt::format("key '{}' was not set within {} ms", key, timeout.count()));
    Bytes out = ok_answer();
    ByteWriter w(out);
    w.u32(static_cast<std::uint32_t>(it->second.size()));
    w.bytes(it->second);
    return out;
  }

  // The meeting (store.h join).
  Result<Bytes> join(std::uint32_t rank, std::chrono::milliseconds timeout) {
    MutexLock lock(mu_);
    if (forming_complete_) {  // the last generation met: this join opens the next one
      ++generation_;
      roster_.clear();
      forming_complete_ = false;
    }
    const std::uint64_t mine = generation_;
    roster_.insert(rank);
    if (roster_.size() == identity_.world_size) {
      forming_complete_ = true;
      completed_ = mine + 1;
      drop_keys_before_locked(mine);
      cv_.notify_all();
    }
    const auto deadline = Clock::now() + timeout;
    while (!stopping_ && completed_ <= mine)
      if (cv_.wait_until(lock, deadline) == std::cv_status::timeout) break;
    if (completed_ > mine) {
      Bytes out = ok_answer();
      ByteWriter w(out);
      w.u64(mine);
      return out;
    }
    std::vector<std::uint32_t> missing;
    for (std::uint32_t r = 0; r < identity_.world_size; ++r)
      if (!roster_.contains(r)) missing.push_back(r);
    if (generation_ == mine) roster_.erase(rank);
    return error_answer(fmt::format("rank(s) {} of job '{}' did not join within {} ms", ranks_text(missing),
                                    identity_.job, timeout.count()));
  }

  void leave_locked(std::uint32_t rank) KILN_REQUIRES(mu_) {
    live_[rank] = false;
    if (!forming_complete_) roster_.erase(rank);
  }

  // Gloo's keys of generations before `g` (the group prefixes them "<g>/"): nobody reads them
  // again once every rank has joined `g`.
  void drop_keys_before_locked(std::uint64_t g) KILN_REQUIRES(mu_) {
    for (auto it = keys_.begin(); it != keys_.end();) {
      const std::optional<std::uint64_t> kg = key_generation(it->first);
      if (kg && *kg < g) {
        bytes_ -= it->second.size();
        it = keys_.erase(it);
      } else {
        ++it;
      }
    }
  }

  UniqueFd listener_;
  const std::uint16_t port_;
  const StoreIdentity identity_;
  std::thread acceptor_;

  mutable Mutex mu_;
  std::condition_variable_any cv_;
  bool stopping_ KILN_GUARDED_BY(mu_) = false;
  std::list<Connection> connections_ KILN_GUARDED_BY(mu_);
  std::map<std::string, Bytes> keys_ KILN_GUARDED_BY(mu_);
  std::size_t bytes_ KILN_GUARDED_BY(mu_) = 0;
  std::vector<bool> live_ KILN_GUARDED_BY(mu_);
  // The meeting: the generation forming (or last formed, when complete), who joined it, and how
  // many generations have completed.
  std::uint64_t generation_ KILN_GUARDED_BY(mu_) = 0;
  std::set<std::uint32_t> roster_ KILN_GUARDED_BY(mu_);
  bool forming_complete_ KILN_GUARDED_BY(mu_) = false;
  std::uint64_t completed_ KILN_GUARDED_BY(mu_) = 0;
};

StoreServer::StoreServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
StoreServer::~StoreServer() { impl_->stop(); }
std::uint16_t StoreServer::port() const { return impl_->port(); }
std::vector<std::uint32_t> StoreServer::live_ranks() const { return impl_->live_ranks(); }

Result<std::unique_ptr<StoreServer>> StoreServer::start(const TcpAddress& at, StoreIdentity identity) {
  KILN_ASSIGN_OR_RETURN(auto addr, to_sockaddr(at));
  const std::string what = "the rendezvous store at " + at.to_string();
  UniqueFd fd(::socket(addr.first.sa.sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return sys_error(what + ": socket", errno);
  const int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd.get(), &addr.first.sa, addr.second) != 0) return sys_error(what + ": bind", errno, ErrorCode::Config);
  if (::listen(fd.get(), 128) != 0) return sys_error(what + ": listen", errno);
  SockAddr bound{};
  socklen_t len = sizeof bound;
  ::getsockname(fd.get(), &bound.sa, &len);
  const std::uint16_t port = ntohs(bound.sa.sa_family == AF_INET6 ? bound.v6.sin6_port : bound.v4.sin_port);
  auto impl = std::make_unique<Impl>(std::move(fd), port, std::move(identity));
  impl->start();
  return std::unique_ptr<StoreServer>(new StoreServer(std::move(impl)));
}

// ---- client

class StoreClient::Impl {
 public:
  Impl(UniqueFd fd, TcpAddress at, std::string local_host)
      : fd_(std::move(fd)), at_(std::move(at)), local_host_(std::move(local_host)) {}

  // One request and its answer; `wait` is how long the store may take by the request's nature.
  Result<Bytes> call(const Bytes& request, std::chrono::milliseconds wait) {
    MutexLock lock(mu_);
    if (!fd_) return make_error(ErrorCode::Execution, where() + " is not connected (an earlier request failed)");
    Result<Bytes> answer = exchange(request, wait);
    if (!answer.ok()) {
      fd_.reset();  // a half-read answer leaves the stream out of step: never reuse it
      return make_error(answer.error().code, where() + ": " + answer.error().message);
    }
    ByteReader r(*answer);
    std::uint8_t status = 0;
    if (!r.u8(status, "status")) return make_error(ErrorCode::Invalid, where() + ": an empty answer");
    if (status != 0) {
      std::string message;
      if (!get_string(r, 4096, message, "message")) message = "(unreadable error)";
      return make_error(ErrorCode::Execution, where() + " refused: " + message);
    }
    return Bytes(answer->begin() + 1, answer->end());
  }

  std::string where() const { return "the rendezvous store at " + at_.to_string(); }
  const std::string& local_host() const { return local_host_; }
  bool connected() const {
    MutexLock lock(mu_);
    return fd_.valid();
  }

 private:
  Result<Bytes> exchange(const Bytes& request, std::chrono::milliseconds wait) KILN_REQUIRES(mu_) {
    KILN_RETURN_IF_ERROR(send_frame(fd_.get(), request));
    return recv_frame(fd_.get(), Clock::now() + wait + kAnswerMargin);
  }

  mutable Mutex mu_;
  UniqueFd fd_ KILN_GUARDED_BY(mu_);
  const TcpAddress at_;
  const std::string local_host_;
};

namespace {

// Connects to `at`, retrying a refused or unreachable address until `deadline` (the store's
// daemon may not be up yet).
Result<UniqueFd> connect_until(const TcpAddress& at, Clock::time_point deadline) {
  KILN_ASSIGN_OR_RETURN(auto addr, to_sockaddr(at));
  int last = 0;
  for (;;) {
    UniqueFd fd(::socket(addr.first.sa.sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!fd) return sys_error("socket", errno);
    if (::connect(fd.get(), &addr.first.sa, addr.second) == 0) {
      const int one = 1;
      ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      return fd;
    }
    last = errno;
    if (last != ECONNREFUSED && last != ENETUNREACH && last != EHOSTUNREACH && last != ETIMEDOUT && last != EINTR)
      break;
    if (Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return make_error(ErrorCode::Execution, fmt::format("the rendezvous store at {} could not be reached: {}",
                                                    at.to_string(), errno_text(last)));
}

}  // namespace

StoreClient::StoreClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
StoreClient::~StoreClient() = default;

Result<std::unique_ptr<StoreClient>> StoreClient::connect(const TcpAddress& at, const StoreIdentity& identity,
                                                          std::uint32_t rank, std::chrono::milliseconds timeout) {
  KILN_ASSIGN_OR_RETURN(UniqueFd fd, connect_until(at, Clock::now() + timeout));
  SockAddr local{};
  socklen_t len = sizeof local;
  ::getsockname(fd.get(), &local.sa, &len);
  auto impl = std::make_unique<Impl>(std::move(fd), at, host_of(local));
  Bytes hello{static_cast<std::uint8_t>(StoreOp::Hello)};
  ByteWriter w(hello);
  put_string(w, identity.job);
  w.u32(identity.world_size);
  put_string(w, identity.version);
  w.u32(rank);
  KILN_RETURN_IF_ERROR(impl->call(hello, std::chrono::milliseconds(0)).status());
  return std::unique_ptr<StoreClient>(new StoreClient(std::move(impl)));
}

Status StoreClient::set(std::string_view key, std::span<const std::uint8_t> value) {
  if (key.size() > kMaxStoreKeyBytes || value.size() > kMaxStoreValueBytes)
    return make_error(ErrorCode::Invalid, fmt::format("store set: key of {} bytes or value of {} bytes is too large",
                                                      key.size(), value.size()));
  Bytes request{static_cast<std::uint8_t>(StoreOp::Set)};
  ByteWriter w(request);
  put_string(w, key);
  w.u32(static_cast<std::uint32_t>(value.size()));
  w.bytes(value);
  return impl_->call(request, std::chrono::milliseconds(0)).status();
}

Result<std::vector<std::uint8_t>> StoreClient::get(std::string_view key, std::chrono::milliseconds timeout) {
  if (key.size() > kMaxStoreKeyBytes) return make_error(ErrorCode::Invalid, "store get: key too long");
  Bytes request{static_cast<std::uint8_t>(StoreOp::Get)};
  ByteWriter w(request);
  put_string(w, key);
  w.u32(static_cast<std::uint32_t>(timeout.count()));
  KILN_ASSIGN_OR_RETURN(Bytes answer, impl_->call(request, timeout));
  ByteReader r(answer);
  std::span<const std::uint8_t> value;
  if (!get_bytes(r, kMaxStoreValueBytes, value, "value") || !r.at_end())
    return make_error(ErrorCode::Invalid, impl_->where() + ": a malformed value for '" + std::string(key) + "'");
  return Bytes(value.begin(), value.end());
}

Result<std::uint64_t> StoreClient::join(std::chrono::milliseconds timeout) {
  Bytes request{static_cast<std::uint8_t>(StoreOp::Join)};
  ByteWriter w(request);
  w.u32(static_cast<std::uint32_t>(timeout.count()));
  KILN_ASSIGN_OR_RETURN(Bytes answer, impl_->call(request, timeout));
  ByteReader r(answer);
  std::uint64_t generation = 0;
  if (!r.fixed(generation, "generation") || !r.at_end())
    return make_error(ErrorCode::Invalid, impl_->where() + ": a malformed join answer");
  return generation;
}

Result<std::vector<std::uint32_t>> StoreClient::live_ranks() {
  const Bytes request{static_cast<std::uint8_t>(StoreOp::Live)};
  KILN_ASSIGN_OR_RETURN(Bytes answer, impl_->call(request, std::chrono::milliseconds(0)));
  ByteReader r(answer);
  std::uint32_t n = 0;
  if (!r.fixed(n, "count") || n > kMaxWorldSize)
    return make_error(ErrorCode::Invalid, impl_->where() + ": a malformed rank list");
  std::vector<std::uint32_t> ranks(n);
  for (auto& x : ranks)
    if (!r.fixed(x, "rank")) return make_error(ErrorCode::Invalid, impl_->where() + ": a malformed rank list");
  return ranks;
}

const std::string& StoreClient::local_host() const { return impl_->local_host(); }
bool StoreClient::connected() const { return impl_->connected(); }
std::string StoreClient::where() const { return impl_->where(); }

}  // namespace kiln::distributed
