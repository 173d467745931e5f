// Tests for the control plane (kiln/ipc/handshake.h, unix_socket.h, control_server.h,
// control_client.h): the credential policy (with fake uids and gids), job names, handshake
// frames, the runtime directory's mode and owner checks, and the full handshake over a real
// socket in a temporary runtime dir: descriptor passing, the segment used from both sides,
// refusals with their reasons, version mismatch (both sides), peer-closure detection, no daemon,
// and the client's check of the daemon's credentials (a fake uid, and a real one as root).
#include <grp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <thread>

#include "kiln/ipc/control_client.h"
#include "kiln/ipc/control_server.h"
#include "kiln/ipc/device_lock.h"
#include "kiln/ipc/handshake.h"
#include "kiln/ipc/protocol.h"
#include "kiln/ipc/unix_socket.h"
#include "kiln/testing/status.h"

namespace kiln::ipc {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

// ---- pure parts -------------------------------------------------------------------------------

TEST(CredentialPolicy, OwnUidAlwaysOtherUidsOnlyThroughTheGroup) {
  const CredentialPolicy own{1000, std::nullopt};
  KILN_EXPECT_OK(check_peer(own, PeerCredentials{1, 1000, 1000, {}}));
  auto refused = check_peer(own, PeerCredentials{2, 1001, 1001, {}});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().message, "uid 1001 not allowed");
  EXPECT_FALSE(check_peer(own, PeerCredentials{3, 0, 0, {}}).ok());  // root is not special

  const CredentialPolicy group{1000, gid_t{2000}};
  KILN_EXPECT_OK(check_peer(group, PeerCredentials{4, 1000, 1000, {}}));
  KILN_EXPECT_OK(check_peer(group, PeerCredentials{5, 1001, 2000, {}}));            // primary group
  KILN_EXPECT_OK(check_peer(group, PeerCredentials{6, 1002, 1002, {5, 2000, 7}}));  // supplementary
  auto no = check_peer(group, PeerCredentials{7, 1003, 1003, {5, 7}});
  ASSERT_FALSE(no.ok());
  EXPECT_EQ(no.error().message, "uid 1003 (gid 1003) not allowed: not the daemon's uid 1000 nor in group 2000");
}

// The client's side: it trusts a daemon of its own uid or root's, nobody else's.
TEST(DaemonCredentials, OwnUidOrRootOnly) {
  KILN_EXPECT_OK(check_daemon_peer(1000, PeerCredentials{1, 1000, 1000, {}}));
  KILN_EXPECT_OK(check_daemon_peer(1000, PeerCredentials{1, 0, 0, {}}));  // a system daemon
  KILN_EXPECT_OK(check_daemon_peer(0, PeerCredentials{1, 0, 0, {}}));
  auto planted = check_daemon_peer(1000, PeerCredentials{2, 1001, 1000, {1000}});  // same group: still not
  ASSERT_FALSE(planted.ok());
  EXPECT_EQ(planted.error().code, ErrorCode::Invalid);
  EXPECT_EQ(planted.error().message, "the daemon runs as uid 1001, neither this process's uid 1000 nor root");
  EXPECT_FALSE(check_daemon_peer(0, PeerCredentials{3, 1000, 1000, {}}).ok());  // root trusts only root
}

TEST(Handshake, JobNames) {
  KILN_EXPECT_OK(validate_job_name("resnet-50_train.v2"));
  KILN_EXPECT_OK(validate_job_name(std::string(64, 'a')));
  EXPECT_FALSE(validate_job_name("").ok());
  EXPECT_FALSE(validate_job_name(std::string(65, 'a')).ok());
  EXPECT_FALSE(validate_job_name(".hidden").ok());
  auto slash = validate_job_name("a/b");
  ASSERT_FALSE(slash.ok());
  EXPECT_EQ(slash.error().message,
            "job name: byte 0x2f at 1 is not allowed (use A-Z a-z 0-9 . _ -, not starting with .)");
  EXPECT_FALSE(validate_job_name(std::string("a\0b", 3)).ok());
  EXPECT_FALSE(validate_job_name("caf\xc3\xa9").ok());
}

TEST(Handshake, FramesRoundTripAndRejectGarbage) {
  const auto hello = encode_hello(Hello{1, "job-1"});
  auto p = decode_prefix(std::span(hello).first(kFramePrefixBytes));
  KILN_ASSERT_OK(p);
  EXPECT_EQ(p->magic, kHelloMagic);
  auto h = decode_hello(*p, std::span(hello).subspan(kFramePrefixBytes));
  ASSERT_TRUE(h.ok()) << h.error().message;
  EXPECT_EQ(h->job, "job-1");
  EXPECT_EQ(h->version, 1);

  Reply r{1, false, 0, 0, std::string(600, 'x')};  // reason truncated to 512
  const auto reply = encode_reply(r);
  auto rp = decode_prefix(std::span(reply).first(kFramePrefixBytes));
  KILN_ASSERT_OK(rp);
  auto rr = decode_reply(*rp, std::span(reply).subspan(kFramePrefixBytes));
  ASSERT_TRUE(rr.ok()) << rr.error().message;
  EXPECT_FALSE(rr->accepted);
  EXPECT_EQ(rr->reason.size(), kMaxReasonBytes);

  std::vector<std::uint8_t> big = {0x4B, 0x4C, 0x4E, 0x48, 1, 0, 0xff, 0xff};
  EXPECT_FALSE(decode_prefix(big).ok());
  auto wrong = decode_reply(*p, std::span(hello).subspan(kFramePrefixBytes));  // a hello is no reply
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.error().message.find("not a kiln daemon"), std::string::npos);
}

// ---- runtime dir ------------------------------------------------------------------------------

struct TempDir {
  TempDir() {
    char tmpl[] = "/tmp/kiln-ipc-test-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string path;
};

mode_t mode_of(const std::string& p) {
  struct stat st {};
  ::lstat(p.c_str(), &st);
  return st.st_mode & 07777;
}

TEST(RuntimeDir, CreatedPrivateAndCheckedWhenPresent) {
  TempDir t;
  const std::string dir = t.path + "/run";
  KILN_ASSERT_OK(ensure_runtime_dir(dir));
  EXPECT_EQ(mode_of(dir), 0700u);
  KILN_EXPECT_OK(ensure_runtime_dir(dir));  // idempotent
  ::chmod(dir.c_str(), 0755);
  auto loose = ensure_runtime_dir(dir);
  ASSERT_FALSE(loose.ok());
  EXPECT_EQ(loose.error().message, "runtime dir " + dir + " has mode 0755, expected 0700 (fix or remove it)");

  const std::string link = t.path + "/link";
  ASSERT_EQ(::symlink(dir.c_str(), link.c_str()), 0);
  auto sym = ensure_runtime_dir(link);
  ASSERT_FALSE(sym.ok());
  EXPECT_NE(sym.error().message.find("is not a directory (or is a symlink)"), std::string::npos);

  const std::string grouped = t.path + "/grouped";
  KILN_ASSERT_OK(ensure_runtime_dir(grouped, ::getegid()));
  EXPECT_EQ(mode_of(grouped), 0710u);

  auto longp = socket_path(t.path + "/" + std::string(120, 'd'), "kilnd.sock");
  ASSERT_FALSE(longp.ok());
  EXPECT_NE(longp.error().message.find("is longer than 107 bytes"), std::string::npos);
}

// ---- the real socket --------------------------------------------------------------------------

// A server on its own io_context thread, collecting what the callbacks report.
// A plain connected Unix socket to `path` (no handshake); invalid if the connect failed.
UniqueFd connect_raw(const std::string& path) {
  UniqueFd s(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strcpy(addr.sun_path, path.c_str());
  if (!s || ::connect(s.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) return UniqueFd();
  return s;
}

using ::kiln::testing::ok;

struct Daemon {
  explicit Daemon(std::string dir, ServerOptions o = {}) {
    o.runtime_dir = std::move(dir);
    o.segment = SegmentConfig{4096, 4096, 65536};
    ServerCallbacks cb;
    cb.admit = [](const PeerCredentials&, std::string_view job) -> Status {
      if (job == "over-quota") return make_error(ErrorCode::ResourceExhausted, "job over-quota has no quota left");
      return Status::Ok();
    };
    cb.on_client = [this](std::unique_ptr<AcceptedClient> c) {
      std::lock_guard lock(mu);
      clients.push_back(std::move(c));
      cv.notify_all();
    };
    cb.on_disconnect = [this](std::uint64_t id, const Status& why) {
      std::lock_guard lock(mu);
      gone.emplace_back(id, why.ok() ? std::string("ok") : why.error().message);
      cv.notify_all();
    };
    auto s = ControlServer::start(io, std::move(o), std::move(cb));
    if (!s.ok()) {
      start_error = s.error().message;
      return;
    }
    server = std::move(s).value();
    thread = std::thread([this] { io.run(); });
  }
  ~Daemon() {
    if (server) server->stop();
    work.reset();
    if (thread.joinable()) thread.join();
    server.reset();
  }
  std::unique_ptr<AcceptedClient> wait_client() {
    std::unique_lock lock(mu);
    if (!cv.wait_for(lock, 10s, [&] { return !clients.empty(); })) return nullptr;
    auto c = std::move(clients.front());
    clients.erase(clients.begin());
    return c;
  }
  std::optional<std::pair<std::uint64_t, std::string>> wait_gone() {
    std::unique_lock lock(mu);
    if (!cv.wait_for(lock, 10s, [&] { return !gone.empty(); })) return std::nullopt;
    auto g = gone.front();
    gone.erase(gone.begin());
    return g;
  }

  boost::asio::io_context io;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work{io.get_executor()};
  std::unique_ptr<ControlServer> server;
  std::string start_error;
  std::thread thread;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::unique_ptr<AcceptedClient>> clients;
  std::vector<std::pair<std::uint64_t, std::string>> gone;
};

ClientOptions client_options(const std::string& dir, std::string job = "test-job") {
  ClientOptions o;
  o.runtime_dir = dir;
  o.job = std::move(job);
  o.timeout = 5s;
  return o;
}

TEST(Control, NoDaemonIsAClearError) {
  TempDir t;
  auto c = connect_to_daemon(client_options(t.path));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error().message, "daemon not running at " + t.path + "/kilnd-cpu.sock");
}

TEST(Control, HandshakePassesTheSegmentAndBothSidesUseIt) {
  TempDir t;
  const std::string dir = t.path + "/run";
  Daemon d(dir);
  ASSERT_EQ(d.start_error, "");
  EXPECT_EQ(mode_of(dir), 0700u);
  EXPECT_EQ(mode_of(d.server->socket_path()), 0600u);

  auto conn = connect_to_daemon(client_options(dir));
  ASSERT_TRUE(conn.ok()) << conn.error().message;
  auto accepted = d.wait_client();
  ASSERT_NE(accepted, nullptr);
  EXPECT_EQ(accepted->job, "test-job");
  EXPECT_EQ(accepted->peer.uid, ::geteuid());
  EXPECT_EQ(accepted->peer.pid, ::getpid());
  EXPECT_EQ(accepted->client_id, conn->client_id());
  EXPECT_EQ(conn->endpoint().layout(), accepted->endpoint.layout());
  EXPECT_TRUE(conn->daemon_alive());

  // Client uploads 6 floats through the arena; the daemon reads them and answers with a
  // read_done that points at bytes it wrote back into the arena.
  Endpoint& cep = conn->endpoint();
  Endpoint& dep = accepted->endpoint;
  ArenaAllocator alloc(cep.layout().arena_size);
  const float values[6] = {1, 2, 3, 4, 5, 6};
  auto range = alloc.allocate(sizeof values);
  ASSERT_TRUE(range.has_value());
  KILN_ASSERT_OK(cep.arena().write(*range, {reinterpret_cast<const std::uint8_t*>(values), sizeof values}));
  std::vector<std::uint8_t> msg;
  KILN_ASSERT_OK(encode_command(Command{42, UploadCmd{0, ir::TensorId(1), ir::dtypes::f32, {2, 3}, *range}}, msg));
  KILN_ASSERT_OK(cep.send(msg, 1s));

  std::vector<std::uint8_t> buf(dep.max_receive_bytes());
  auto n = dep.receive(buf, 5s);
  ASSERT_TRUE(n.ok() && n->has_value());
  auto cmd = decode_command({buf.data(), **n}, dep.layout().arena_size);
  ASSERT_TRUE(cmd.ok()) << cmd.error().message;
  ASSERT_EQ(cmd->kind(), CommandKind::Upload);
  const auto& up = std::get<UploadCmd>(cmd->body);
  float copy[6];
  KILN_ASSERT_OK(dep.arena().read(up.data, {reinterpret_cast<std::uint8_t*>(copy), sizeof copy}));
  for (std::size_t i = 0; i < 6; ++i) EXPECT_EQ(copy[i], values[i]) << i;  // the values crossed as written
  for (float& f : copy) f *= 10;
  KILN_ASSERT_OK(dep.arena().write(up.data, {reinterpret_cast<const std::uint8_t*>(copy), sizeof copy}));
  msg.clear();
  KILN_ASSERT_OK(encode_completion(Completion{42, ReadDoneCpl{ir::dtypes::f32, {2, 3}, up.data}}, msg));
  KILN_ASSERT_OK(dep.send(msg, 1s));

  std::vector<std::uint8_t> cbuf(cep.max_receive_bytes());
  auto m = cep.receive(cbuf, 5s);
  ASSERT_TRUE(m.ok() && m->has_value());
  auto cpl = decode_completion({cbuf.data(), **m}, cep.layout().arena_size);
  ASSERT_TRUE(cpl.ok()) << cpl.error().message;
  EXPECT_EQ(cpl->request_id, 42u);
  const auto& done = std::get<ReadDoneCpl>(cpl->body);
  float back[6];
  KILN_ASSERT_OK(cep.arena().read(done.data, {reinterpret_cast<std::uint8_t*>(back), sizeof back}));
  EXPECT_EQ(back[5], 60.0f);
  KILN_ASSERT_OK(alloc.free(*range));

  // The client goes away: the daemon learns it from the socket.
  const std::uint64_t id = conn->client_id();
  conn = make_error(ErrorCode::Internal, "dropped");  // destroys the connection
  auto g = d.wait_gone();
  ASSERT_TRUE(g.has_value());
  EXPECT_EQ(g->first, id);
  EXPECT_EQ(g->second, "ok");
}

TEST(Control, RefusalsCarryTheirReason) {
  TempDir t;
  Daemon d(t.path + "/run");
  ASSERT_EQ(d.start_error, "");
  auto quota = connect_to_daemon(client_options(t.path + "/run", "over-quota"));
  ASSERT_FALSE(quota.ok());
  EXPECT_EQ(quota.error().message, "refused: job over-quota has no quota left");

  // A client of the previous version (no control) and one of a later version.
  ClientOptions v1 = client_options(t.path + "/run");
  v1.protocol_version = kProtocolVersion - 1;
  auto mismatch = connect_to_daemon(v1);
  ASSERT_FALSE(mismatch.ok());
  EXPECT_EQ(mismatch.error().code, ErrorCode::Unsupported);
  EXPECT_EQ(mismatch.error().message, "protocol version mismatch: daemon 6, client 5");
  ClientOptions v3 = client_options(t.path + "/run");
  v3.protocol_version = kProtocolVersion + 1;
  mismatch = connect_to_daemon(v3);
  ASSERT_FALSE(mismatch.ok());
  EXPECT_EQ(mismatch.error().message, "protocol version mismatch: daemon 6, client 7");

  auto bad_job = connect_to_daemon(client_options(t.path + "/run", "a b"));
  ASSERT_FALSE(bad_job.ok());
  EXPECT_NE(bad_job.error().message.find("job name"), std::string::npos);

  // A raw client sending a bad job name: the daemon refuses with the validator's reason.
  UniqueFd s = connect_raw(d.server->socket_path());
  ASSERT_TRUE(s.valid());
  Hello h{kProtocolVersion, "x/y"};
  const auto bytes = encode_hello(h);
  ASSERT_EQ(::send(s.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL), static_cast<ssize_t>(bytes.size()));
  std::array<std::uint8_t, kFramePrefixBytes> pre{};
  std::vector<UniqueFd> fds;
  KILN_ASSERT_OK(recv_exact_with_fds(s.get(), pre, fds));
  auto p = decode_prefix(pre);
  KILN_ASSERT_OK(p);
  std::vector<std::uint8_t> body(p->body_len);
  KILN_ASSERT_OK(recv_exact_with_fds(s.get(), body, fds));
  auto r = decode_reply(*p, body);
  KILN_ASSERT_OK(r);
  EXPECT_FALSE(r->accepted);
  EXPECT_NE(r->reason.find("job name: byte 0x2f"), std::string::npos) << r->reason;
  EXPECT_TRUE(fds.empty());
  {
    std::lock_guard lock(d.mu);
    EXPECT_TRUE(d.clients.empty());
  }
}

// A listening socket answered by hand on its own thread: reads a hello and sends `reply`.
struct FakeDaemon {
  explicit FakeDaemon(const std::string& path, Reply reply) {
    fd = UniqueFd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strcpy(addr.sun_path, path.c_str());
    ok = ::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 && ::listen(fd.get(), 4) == 0;
    if (!ok) return;
    thread = std::thread([this, reply] {
      UniqueFd c(::accept4(fd.get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (!c) return;
      std::array<std::uint8_t, kFramePrefixBytes> pre{};
      std::vector<UniqueFd> fds;
      if (!recv_exact_with_fds(c.get(), pre, fds).ok()) return;
      auto p = decode_prefix(pre);
      if (!p.ok()) return;
      std::vector<std::uint8_t> body(p->body_len);
      if (!recv_exact_with_fds(c.get(), body, fds).ok()) return;
      (void)send_with_fds(c.get(), encode_reply(reply), {}, 1000ms);
      char byte;
      (void)::recv(c.get(), &byte, 1, 0);  // until the client closes
    });
  }
  ~FakeDaemon() {
    if (thread.joinable()) thread.join();
  }
  UniqueFd fd;
  bool ok = false;
  std::thread thread;
};

// A daemon of an older version that (wrongly) accepts a newer client: the client itself refuses
// it, naming both versions, before using anything it sent.
TEST(Control, ClientRefusesADaemonOfAnotherVersion) {
  TempDir t;
  FakeDaemon d(t.path + "/kilnd-cpu.sock", Reply{static_cast<std::uint16_t>(kProtocolVersion - 1), true, 0, 7, ""});
  ASSERT_TRUE(d.ok);
  auto c = connect_to_daemon(client_options(t.path));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error().code, ErrorCode::Unsupported);
  EXPECT_EQ(c.error().message, "protocol version mismatch: daemon 5, client 6");
}

// A socket planted by another user: the client reads SO_PEERCRED right after connect() and
// refuses to talk to it (it sends no hello). Needs root, to listen as another uid.
TEST(Control, ClientRefusesADaemonOfAnotherUid) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root: a child process listens as another uid";
  TempDir t;
  constexpr uid_t kOther = 54321;  // any uid but ours and root's; no account needed
  ASSERT_EQ(::chown(t.path.c_str(), kOther, kOther), 0);
  const std::string path = t.path + "/kilnd-cpu.sock";
  int ready[2], done[2];
  ASSERT_EQ(::pipe(ready), 0);
  ASSERT_EQ(::pipe(done), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Only async-signal-safe calls here: the parent has threads.
    char ok = 0;
    if (::setgroups(0, nullptr) == 0 && ::setresgid(kOther, kOther, kOther) == 0 &&
        ::setresuid(kOther, kOther, kOther) == 0) {
      const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
      sockaddr_un addr{};
      addr.sun_family = AF_UNIX;
      std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
      if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 && ::listen(fd, 4) == 0) ok = 1;
    }
    (void)!::write(ready[1], &ok, 1);
    char byte;
    (void)!::read(done[0], &byte, 1);  // the connection stays pending in the backlog meanwhile
    ::_exit(0);
  }
  char ok = 0;
  ASSERT_EQ(::read(ready[0], &ok, 1), 1);
  ASSERT_EQ(ok, 1) << "the child could not listen as uid " << kOther;
  auto c = connect_to_daemon(client_options(t.path));
  (void)!::write(done[1], "x", 1);
  int status = 0;
  ::waitpid(child, &status, 0);
  for (int fd : {ready[0], ready[1], done[0], done[1]}) ::close(fd);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error().code, ErrorCode::Invalid);
  EXPECT_EQ(c.error().message,
            "refused: not trusting " + path + ": the daemon runs as uid 54321, neither this process's uid 0 nor root");
}

// Issue 19.9: one uid opened connections until the daemon ran out of descriptors. Past its
// limit a uid is refused with the reason; far past it a connection is closed unread; a freed
// slot is usable again, and the total limit holds the same way.
TEST(Control, ConnectionsAreCappedPerUidAndInAll) {
  TempDir t;
  ServerOptions o;
  o.max_connections_per_uid = 3;
  Daemon d(t.path + "/run", o);
  ASSERT_EQ(d.start_error, "");
  std::vector<ClientConnection> held;
  for (int i = 0; i < 3; ++i) held.push_back(ok(connect_to_daemon(client_options(t.path + "/run"))));
  auto refused = connect_to_daemon(client_options(t.path + "/run"));
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("connections open, its limit (daemon.max_connections_per_uid = 3)"),
            std::string::npos)
      << refused.error().message;
  // A flood of silent sockets past the slack: each is closed unread, none holds a descriptor.
  std::vector<UniqueFd> flood;
  for (std::size_t i = 0; i < kRefusalSlack + 8; ++i) {
    flood.push_back(connect_raw(d.server->socket_path()));
    ASSERT_TRUE(flood.back().valid());
  }
  // The last one is past the slack: the daemon closes it (EOF) without waiting for a hello.
  pollfd p{flood.back().get(), POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 5000), 1) << "the daemon kept a connection far past the limit open";
  char byte = 0;
  EXPECT_EQ(::read(flood.back().get(), &byte, 1), 0);
  flood.clear();
  held.pop_back();  // a slot frees (the daemon sees the EOF) ...
  bool admitted = false;
  for (int i = 0; i < 100 && !admitted; ++i) {
    admitted = connect_to_daemon(client_options(t.path + "/run")).ok();
    if (!admitted) std::this_thread::sleep_for(50ms);
  }
  EXPECT_TRUE(admitted) << "a freed slot was not given back";
}

TEST(Control, TheTotalConnectionLimitHolds) {
  TempDir t;
  ServerOptions o;
  o.max_connections = 2;
  Daemon d(t.path + "/run", o);
  ASSERT_EQ(d.start_error, "");
  auto a = ok(connect_to_daemon(client_options(t.path + "/run")));
  auto b = ok(connect_to_daemon(client_options(t.path + "/run")));
  auto refused = connect_to_daemon(client_options(t.path + "/run"));
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("(daemon.max_connections = 2)"), std::string::npos) << refused.error().message;
}

// Issue 19.13: one daemon per device, whatever its socket's name.
TEST(DeviceLock, ASecondDaemonForTheDeviceIsRefusedWithTheHoldersPid) {
  TempDir t;
  const std::string dir = t.path + "/locks";
  auto first = DeviceLock::acquire("cuda:0", dir);
  ASSERT_TRUE(first.ok()) << first.error().to_string();
  EXPECT_EQ(first->path(), dir + "/kilnd-cuda-0.lock");
  EXPECT_EQ(mode_of(dir), 0700u);
  auto second = DeviceLock::acquire("cuda:0", dir);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.error().message, "another kilnd (pid " + std::to_string(::getpid()) +
                                        ") already serves device cuda:0 (lock " + dir + "/kilnd-cuda-0.lock)");
  EXPECT_TRUE(DeviceLock::acquire("cpu", dir).ok()) << "another device has its own lock";
  { DeviceLock gone = std::move(first).value(); }
  EXPECT_TRUE(DeviceLock::acquire("cuda:0", dir).ok()) << "the lock goes with its holder";
}

TEST(DeviceLock, ALockDirectoryAnotherUserCouldWriteIsRefused) {
  TempDir t;
  const std::string dir = t.path + "/open";
  ASSERT_EQ(::mkdir(dir.c_str(), 0777), 0);
  ASSERT_EQ(::chmod(dir.c_str(), 0777), 0);
  auto lock = DeviceLock::acquire("cpu", dir);
  ASSERT_FALSE(lock.ok());
  EXPECT_NE(lock.error().message.find("mode 0777"), std::string::npos) << lock.error().message;
}

TEST(Control, SilentClientIsDroppedAfterTheHandshakeTimeout) {
  TempDir t;
  ServerOptions o;
  o.handshake_timeout = 200ms;
  Daemon d(t.path + "/run", o);
  ASSERT_EQ(d.start_error, "");
  UniqueFd s = connect_raw(d.server->socket_path());
  ASSERT_TRUE(s.valid());
  timeval tv{5, 0};
  ::setsockopt(s.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  char c;
  EXPECT_EQ(::recv(s.get(), &c, 1, 0), 0);  // EOF: the daemon hung up
}

TEST(Control, DaemonSideDisconnectAndShutdownAreSeenByTheClient) {
  TempDir t;
  Daemon d(t.path + "/run");
  ASSERT_EQ(d.start_error, "");
  auto conn = connect_to_daemon(client_options(t.path + "/run"));
  ASSERT_TRUE(conn.ok()) << conn.error().message;
  auto accepted = d.wait_client();
  ASSERT_NE(accepted, nullptr);
  // A completion published just before the daemon hangs up is still delivered.
  std::vector<std::uint8_t> msg;
  KILN_ASSERT_OK(encode_completion(Completion{9, OkCpl{}}, msg));
  KILN_ASSERT_OK(accepted->endpoint.send(msg, 1s));
  d.server->disconnect(accepted->client_id);
  auto g = d.wait_gone();
  ASSERT_TRUE(g.has_value());
  EXPECT_EQ(g->second, "disconnected by the daemon");
  std::vector<std::uint8_t> buf(conn->endpoint().max_receive_bytes());
  auto last = conn->endpoint().receive(buf, 5s);
  ASSERT_TRUE(last.ok() && last->has_value()) << (last.ok() ? "timeout" : last.error().message);
  EXPECT_EQ(**last, msg.size());
  // Then a client blocked on its ring notices the closed socket instead of waiting out the
  // timeout.
  const auto start = std::chrono::steady_clock::now();
  auto r = conn->endpoint().receive(buf, 10s);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message, "peer closed the connection");
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  EXPECT_FALSE(conn->daemon_alive());
}

TEST(Control, OneDaemonPerSocketAndStaleSocketsAreReplaced) {
  TempDir t;
  const std::string dir = t.path + "/run";
  {
    Daemon first(dir);
    ASSERT_EQ(first.start_error, "");
    Daemon second(dir);
    EXPECT_EQ(second.start_error, "another daemon is already running at " + dir + "/kilnd-cpu.sock");
  }
  EXPECT_FALSE(fs::exists(dir + "/kilnd-cpu.sock"));  // removed on stop
  // A stale socket file (bound, never listened on, like a crashed daemon's) is replaced.
  UniqueFd s(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strcpy(addr.sun_path, (dir + "/kilnd-cpu.sock").c_str());
  ASSERT_EQ(::bind(s.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  s.reset();
  Daemon third(dir);
  EXPECT_EQ(third.start_error, "");
  auto conn = connect_to_daemon(client_options(dir));
  EXPECT_TRUE(conn.ok()) << conn.error().message;
}

}  // namespace
}  // namespace kiln::ipc
