// IPC stress (label `stress`): a daemon service runs in this process over a Device on the fast
// CPU backend; separate client processes (this binary, exec'd in a worker mode) drive it.
//
//   * P = 3 program workers, each with S = 2 streams (one thread per stream), run random
//     programs through runtime::Session over ipc::RemoteTarget: elementwise chains, reductions,
//     small matmuls, mid-program reads, stream switches and tensors shared between the worker's
//     streams (shared views made by export/import in the daemon). Every result is checked in
//     the worker against a double-precision computation.
//   * Worker 0 is SIGKILLed mid-run (it never stops on its own) while the others continue; its
//     job must vanish from the daemon's accounts while they run, and when every client is gone
//     the device's tensors, bytes in use and streams must be back at their baseline.
//   * A flood client (a raw connection) registers thousands of ops without a sync, alternating
//     streams so that every op waits for the previous one to run (the daemon drains the other
//     stream before it registers the next): ops arrive far faster than they run. Its sends must
//     block on a full command ring (Endpoint::send_sleeps() > 0) and no op may be lost: the
//     final value is exact (integer arithmetic in f32) and the daemon counted every op.
//
// Why a daemon in process and workers exec'd: the test reads the device's memory directly, and
// fork() of this multithreaded process would copy locks held by other threads; posix_spawn
// (exec) gives each worker a fresh process.
//
// Bounded by KILN_STRESS_SECONDS (default 10): workers stop starting programs at 0.6 of it; the
// whole test fails if it is not done after 2 × budget + 30 s (process start-up and teardown
// under the sanitizers need the slack).
#include <fcntl.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "../tests/ipc/hostile.h"
#include "kiln/cpu/cpu_backend.h"
#include "kiln/fusion/config.h"
#include "kiln/ipc/control_client.h"
#include "kiln/ipc/daemon.h"
#include "kiln/ipc/protocol.h"
#include "kiln/ipc/remote_target.h"
#include "kiln/ir/builders.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/session.h"
#include "kiln/testing/status.h"
#include "random_program.h"

// As in runtime_stress.cc: Boost.Lockfree's freelist does a benign read TSan reports
// (boostorg/lockfree#78, open); the daemon's stream actors use that queue for foreign commands.
// The name is TSan's hook, reserved to the implementation by design.
extern "C" const char* __tsan_default_suppressions();  // NOLINT(bugprone-reserved-identifier)
// NOLINTNEXTLINE(bugprone-reserved-identifier)
extern "C" const char* __tsan_default_suppressions() { return "race:boost::lockfree::detail::freelist_stack\n"; }

extern char** environ;

namespace kiln::ipc {
namespace {

using Clock = std::chrono::steady_clock;
using runtime::Session;
using runtime::StreamId;
using runtime::Tensor;
using stress::Checker;
using stress::Handoff;
using stress::kDim;
using stress::Values;

constexpr int kWorkers = 3;  // program workers (P)
constexpr int kStreams = 2;  // streams per worker (S), one thread each
constexpr int kShared = 3;   // tensors made on the worker's main thread, used on every stream
constexpr int kSlots = 2;    // tensors handed from one stream to the other
constexpr std::uint64_t kBallast = std::uint64_t{1} << 16;  // f32 elements each worker keeps alive
constexpr std::uint64_t kFloodMaxOps = 20'000;
constexpr std::uint64_t kFloodMinOps = 2'000;
constexpr const char* kSocket = "kilnd-stress.sock";
constexpr const char* kWorkerFlag = "--ipc-stress-worker";

double budget_seconds() {
  if (const char* v = std::getenv("KILN_STRESS_SECONDS")) {
    const double s = std::atof(v);
    if (s > 0) return s;
  }
  return 10.0;
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// ======================================================================= worker processes

// A worker's failures, printed as FAIL lines (the parent shows them); returns how many.
int report(const Checker& check) {
  for (const std::string& f : check.failures()) std::printf("FAIL %s\n", f.c_str());
  std::fflush(stdout);
  return check.count();
}

RemoteOptions remote_options(const std::string& dir, const std::string& job) {
  RemoteOptions o;
  o.runtime_dir = dir;
  o.socket_name = kSocket;
  o.job = job;
  return o;
}

// Program worker: S threads, one explicit stream each, random programs until `seconds` have
// passed. Prints "PROGRESS n" after each program and "RESULT ..." at the end; exit 0 iff every
// value was right.
int program_worker(int index, const std::string& job, const std::string& dir, double seconds) {
  auto remote = RemoteTarget::connect(remote_options(dir, job));
  if (!remote.ok()) {
    std::printf("FAIL connect: %s\n", remote.error().to_string().c_str());
    return 1;
  }
  Checker check;
  std::atomic<std::uint64_t> programs{0}, ops{0};
  std::mutex out_mu;
  const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  {
    Session s(**remote);
    std::mt19937_64 seed_rng(777 + static_cast<std::uint64_t>(index));
    std::vector<Tensor> shared;
    std::vector<Values> shared_ref;
    std::vector<Handoff> slots(kSlots);
    for (int k = 0; k < kShared; ++k) {
      Values v(16);
      for (double& x : v) x = static_cast<float>(std::uniform_real_distribution<double>(-1, 1)(seed_rng));
      std::optional<Tensor> t = check.get(s.from_host(stress::to_f32(v), {kDim, kDim}), "shared upload");
      if (!t) {
        report(check);
        return 1;
      }
      shared.push_back(std::move(*t));
      shared_ref.push_back(std::move(v));
    }
    // Ballast: enough live memory that a leak after the kill would show, with integer values
    // whose sum is exact in f32.
    std::vector<float> ballast_values(kBallast);
    double ballast_sum = 0;
    for (std::uint64_t i = 0; i < kBallast; ++i) ballast_sum += ballast_values[i] = static_cast<float>(i % 17);
    std::optional<Tensor> ballast = check.get(s.from_host(ballast_values, {kBallast}), "ballast upload");

    std::vector<std::thread> threads;
    threads.reserve(kStreams);
    for (int t = 0; t < kStreams; ++t)
      threads.emplace_back([&, t] {
        std::mt19937_64 rng(1000 * static_cast<std::uint64_t>(index) + static_cast<std::uint64_t>(t));
        std::vector<StreamId> streams{s.stream_ids().fresh(), s.stream_ids().fresh()};
        while (Clock::now() < deadline) {
          ops.fetch_add(stress::run_program(s, rng, streams, shared, shared_ref, slots, check),
                        std::memory_order_relaxed);
          const std::uint64_t n = programs.fetch_add(1, std::memory_order_relaxed) + 1;
          std::lock_guard lock(out_mu);
          std::printf("PROGRESS %llu\n", static_cast<unsigned long long>(n));
          std::fflush(stdout);
        }
      });
    for (auto& th : threads) th.join();
    for (Handoff& h : slots) h.tensor.reset();
    if (ballast) {
      std::optional<Tensor> total = check.get(s.sum(std::move(*ballast)), "ballast sum");
      std::optional<std::vector<float>> v;
      if (total) v = check.get(s.to_host(std::move(*total)), "ballast read");
      if (v && (v->size() != 1 || (*v)[0] != static_cast<float>(ballast_sum)))
        check.fail("ballast sum: " + (v->empty() ? std::string("empty") : std::to_string((*v)[0])) + " vs " +
                   std::to_string(ballast_sum));
    }
  }
  const int failures = report(check);
  std::printf("RESULT programs=%llu ops=%llu failures=%d\n", static_cast<unsigned long long>(programs.load()),
              static_cast<unsigned long long>(ops.load()), failures);
  std::fflush(stdout);
  return failures == 0 ? 0 : 1;
}

// ---- The flood client: a raw connection, so that it can count its blocked sends.

class RawClient {
 public:
  explicit RawClient(ClientConnection c) : conn_(std::move(c)), buf_(conn_.endpoint().max_receive_bytes()) {}

  Endpoint& endpoint() { return conn_.endpoint(); }
  std::uint64_t client_id() const { return conn_.client_id(); }

  // Pushes one command; blocks while the command ring is full (that is the backpressure).
  Result<std::uint64_t> send(CommandBody body) {
    const std::uint64_t rid = next_request_++;
    std::vector<std::uint8_t> msg;
    KILN_RETURN_IF_ERROR(encode_command(Command{rid, std::move(body)}, msg));
    KILN_RETURN_IF_ERROR(conn_.endpoint().send(msg, std::chrono::seconds(120)));
    return rid;
  }
  // The completion of `rid`; any other completion before it is an error completion of a
  // register_op (they are answered only when rejected): that is a lost op.
  Result<Completion> wait(std::uint64_t rid) {
    for (;;) {
      KILN_ASSIGN_OR_RETURN(std::optional<std::size_t> n, conn_.endpoint().receive(buf_, std::chrono::seconds(120)));
      if (!n) return make_error(ErrorCode::Execution, "no completion within 120 s");
      KILN_ASSIGN_OR_RETURN(Completion c, decode_completion(std::span<const std::uint8_t>(buf_.data(), *n),
                                                            conn_.endpoint().layout().arena_size));
      if (c.request_id == rid) return c;
      const auto* e = std::get_if<ErrorCpl>(&c.body);
      return make_error(ErrorCode::Execution, "request " + std::to_string(c.request_id) + " rejected: " +
                                                  (e ? e->message : std::string("unexpected completion")));
    }
  }

 private:
  ClientConnection conn_;
  std::vector<std::uint8_t> buf_;
  std::uint64_t next_request_ = 1;
};

constexpr std::uint64_t kAbsent = ~std::uint64_t{0};

// The number after `"key":` in `json` from position `from`; kAbsent if there is none.
std::uint64_t json_u64(const std::string& json, const std::string& key, std::size_t from) {
  const std::string k = "\"" + key + "\":";
  const std::size_t at = from == std::string::npos ? std::string::npos : json.find(k, from);
  if (at == std::string::npos) return kAbsent;
  return std::strtoull(json.c_str() + at + k.size(), nullptr, 10);
}

Status flood(const std::string& dir, double seconds) {
  ClientOptions o;
  o.runtime_dir = dir;
  o.socket_name = kSocket;
  o.job = "flood";
  KILN_ASSIGN_OR_RETURN(ClientConnection conn, connect_to_daemon(o));
  RawClient c(std::move(conn));
  const ir::DType f32 = ir::dtypes::f32;
  const ir::Shape shape{4};
  // x = [1, 2, 3, 4] through the arena.
  std::vector<float> x0{1, 2, 3, 4};
  Values ref(x0.begin(), x0.end());
  KILN_RETURN_IF_ERROR(c.endpoint().arena().write(
      ArenaRange{0, 16}, std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(x0.data()), 16)));
  KILN_ASSIGN_OR_RETURN(std::uint64_t up, c.send(UploadCmd{0, ir::TensorId(1), f32, shape, ArenaRange{0, 16}}));
  KILN_ASSIGN_OR_RETURN(Completion uploaded, c.wait(up));
  if (!std::holds_alternative<OkCpl>(uploaded.body)) return make_error(ErrorCode::Execution, "upload not acknowledged");

  // Integer adds and negations: exact in f32, and a lost, repeated or reordered op changes the
  // result. Each op consumes the previous result on the other stream, so the daemon drains that
  // stream (runs the previous op) before it can register this one.
  const auto t0 = Clock::now();
  std::uint64_t cur = 1, next_id = 2, sent = 0, stream = 0;
  while (sent < kFloodMaxOps && (sent < kFloodMinOps || seconds_since(t0) < seconds)) {
    stream = sent % 2;
    const ir::TensorIr in{ir::TensorId(cur), shape, ir::TensorStatus::ReadWrite, f32};
    const ir::TensorId out(next_id++);
    Result<ir::Operation> op = make_error(ErrorCode::Internal, "");
    if (sent % 5 == 4) {
      op = ir::build::scalar(ir::Family::NumericFloat, ir::OpKind::Numeric_MulScalar, in,
                             *ir::ScalarIr::from_f64(-1, f32), out);
      for (double& v : ref) v = -v;
    } else {
      const double add = static_cast<double>(sent % 13 + 1);
      op = ir::build::scalar(ir::Family::NumericFloat, ir::OpKind::Numeric_AddScalar, in,
                             *ir::ScalarIr::from_f64(add, f32), out);
      for (double& v : ref) v += add;
    }
    if (!op.ok()) return op.error();
    KILN_RETURN_IF_ERROR(c.send(RegisterOpCmd{stream, std::move(op).value()}).status());
    cur = out.value();
    ++sent;
  }
  const double flood_s = seconds_since(t0);
  const std::uint64_t sleeps = c.endpoint().send_sleeps();

  KILN_ASSIGN_OR_RETURN(std::uint64_t rd,
                        c.send(ReadCmd{stream, ir::TensorIr{ir::TensorId(cur), shape, ir::TensorStatus::ReadWrite, f32},
                                       ArenaRange{64, 16}}));
  KILN_ASSIGN_OR_RETURN(Completion read, c.wait(rd));
  const auto* done = std::get_if<ReadDoneCpl>(&read.body);
  if (done == nullptr) {
    const auto* e = std::get_if<ErrorCpl>(&read.body);
    return make_error(ErrorCode::Execution, "final read failed: " + (e ? e->message : std::string("?")));
  }
  std::vector<float> got(4);
  KILN_RETURN_IF_ERROR(
      c.endpoint().arena().read(done->data, std::span<std::uint8_t>(reinterpret_cast<std::uint8_t*>(got.data()), 16)));
  for (int i = 0; i < 4; ++i)
    if (static_cast<double>(got[i]) != ref[i])
      return make_error(ErrorCode::Execution, "flood result at " + std::to_string(i) + ": " + std::to_string(got[i]) +
                                                  " vs " + std::to_string(ref[i]) + " (an op was lost or reordered)");

  // The daemon's own count of this client's ops.
  KILN_ASSIGN_OR_RETURN(std::uint64_t st, c.send(StatusCmd{true}));
  KILN_ASSIGN_OR_RETURN(Completion status, c.wait(st));
  const auto* text = std::get_if<StatusTextCpl>(&status.body);
  if (text == nullptr) return make_error(ErrorCode::Execution, "status: unexpected completion");
  const std::size_t me = text->text.find("{\"id\":" + std::to_string(c.client_id()) + ",");
  const std::uint64_t counted = json_u64(text->text, "ops", me);
  const std::uint64_t rejected = json_u64(text->text, "rejected", me);
  if (counted != sent || rejected != 0)
    return make_error(ErrorCode::Execution, "the daemon counted " + std::to_string(counted) + " ops and " +
                                                std::to_string(rejected) + " rejections; sent " + std::to_string(sent) +
                                                " (" + std::to_string(kAbsent) + ": not in its status)");
  std::printf("RESULT flood ops=%llu seconds=%.2f send_sleeps=%llu\n", static_cast<unsigned long long>(sent), flood_s,
              static_cast<unsigned long long>(sleeps));
  std::fflush(stdout);
  if (sleeps == 0)
    return make_error(ErrorCode::Execution, "no backpressure: " + std::to_string(sent) +
                                                " ops without a sync never found the command ring full");
  return Status::Ok();
}

// A hostile client for the soak (tests/ipc/hostile.h): doorbell spam, a completion ring never
// popped, or a burst of connections, for `seconds`; exit 0 when it ran.
int hostile_worker(const std::string& mode, const std::string& job, const std::string& dir, double seconds) {
  const kiln::testing::hostile::Target target{dir, kSocket};
  const auto span = std::chrono::milliseconds(static_cast<long long>(seconds * 1000));
  if (mode == "connections") {
    // Two bursts may overlap: together under the per-uid cap (128), so the soak's own workers
    // still get in.
    kiln::testing::hostile::Flood f = kiln::testing::hostile::flood_connections(target, 50, job);
    std::printf("RESULT connections open=%zu refused=%llu\n", f.open.size(),
                static_cast<unsigned long long>(f.refused));
    std::fflush(stdout);
    std::this_thread::sleep_for(span);
    return 0;
  }
  auto c = kiln::testing::hostile::connect(target, job);
  if (!c.ok()) {
    std::printf("FAIL hostile connect: %s\n", c.error().message.c_str());
    return 1;
  }
  if (mode == "spam") {
    const std::uint64_t writes = kiln::testing::hostile::spam_doorbell(*c, span);
    std::printf("RESULT spam writes=%llu\n", static_cast<unsigned long long>(writes));
  } else {
    const std::uint64_t sent = kiln::testing::hostile::fill_without_popping(*c, span);
    std::printf("RESULT never-pop sent=%llu\n", static_cast<unsigned long long>(sent));
    std::fflush(stdout);
    std::this_thread::sleep_for(span);
  }
  return 0;
}

// argv: <self> --ipc-stress-worker <programs|flood|spam|never-pop|connections> <index> <job>
//       <runtime dir> <seconds>
int worker_main(int argc, char** argv) {
  if (argc != 7) {
    std::printf("FAIL worker: expected 5 arguments after %s\n", kWorkerFlag);
    return 2;
  }
  const std::string mode = argv[2], job = argv[4], dir = argv[5];
  const int index = std::atoi(argv[3]);
  const double seconds = std::atof(argv[6]);
  if (mode == "programs") return program_worker(index, job, dir, seconds);
  if (mode == "spam" || mode == "never-pop" || mode == "connections") return hostile_worker(mode, job, dir, seconds);
  if (mode == "flood") {
    Status st = flood(dir, seconds);
    if (!st.ok()) {
      std::printf("FAIL flood: %s\n", st.error().to_string().c_str());
      return 1;
    }
    return 0;
  }
  std::printf("FAIL worker: unknown mode %s\n", mode.c_str());
  return 2;
}

// ======================================================================= the test (parent)

// A worker process with its output on a pipe.
struct Child {
  std::string name;
  pid_t pid = -1;
  int out = -1;  // read end of its stdout + stderr
  std::string pending;
  std::string log;  // everything but PROGRESS lines
  std::uint64_t progress = 0;
  bool result = false;  // printed a RESULT line
  std::optional<int> status;

  Child() = default;
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  Child(Child&& o) noexcept { *this = std::move(o); }
  Child& operator=(Child&& o) noexcept {
    std::swap(name, o.name), std::swap(pid, o.pid), std::swap(out, o.out), std::swap(pending, o.pending);
    std::swap(log, o.log), std::swap(progress, o.progress), std::swap(result, o.result), std::swap(status, o.status);
    return *this;
  }
  // Whatever happens to the test, no worker outlives it.
  ~Child() {
    if (pid > 0 && !status) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
    if (out >= 0) ::close(out);
  }

  void take_output() {
    char buf[4096];
    for (;;) {
      const ssize_t n = read(out, buf, sizeof buf);
      if (n <= 0) {
        if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
          ::close(out);
          out = -1;
        }
        return;
      }
      pending.append(buf, static_cast<std::size_t>(n));
      for (std::size_t nl; (nl = pending.find('\n')) != std::string::npos;) {
        const std::string line = pending.substr(0, nl);
        pending.erase(0, nl + 1);
        if (line.rfind("PROGRESS ", 0) == 0) {
          progress = std::strtoull(line.c_str() + 9, nullptr, 10);
          continue;
        }
        if (line.rfind("RESULT ", 0) == 0) result = true;
        log += line + "\n";
        std::printf("[%s] %s\n", name.c_str(), line.c_str());
        std::fflush(stdout);
      }
    }
  }
  bool reap() {
    if (status) return true;
    int st = 0;
    if (waitpid(pid, &st, WNOHANG) != pid) return false;
    status = st;
    return true;
  }
};

// posix_spawn of this binary in worker mode, stdout and stderr on a pipe.
Result<Child> spawn_worker(std::string name, std::vector<std::string> args) {
  std::error_code ec;
  const std::string self = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  if (ec) return make_error(ErrorCode::Internal, "cannot resolve /proc/self/exe: " + ec.message());
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return make_error(ErrorCode::Internal, std::string("pipe2: ") + std::strerror(errno));
  args.insert(args.begin(), {self, kWorkerFlag});
  std::vector<char*> argv;
  argv.reserve(args.size() + 1);
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&fa, fds[1], STDERR_FILENO);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, self.c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    return make_error(ErrorCode::Internal, std::string("posix_spawn: ") + std::strerror(rc));
  }
  (void)fcntl(fds[0], F_SETFL, O_NONBLOCK);
  Child c;
  c.name = std::move(name);
  c.pid = pid;
  c.out = fds[0];
  return c;
}

std::unique_ptr<runtime::Device> make_device() {
  runtime::RuntimeOptions o;
  o.threads = 4;
  // The environment may set [fusion] keys (KILN_FUSION_MAX_PLANS for a soak); no kiln.toml.
  o.fusion = fusion::apply_fusion_env(fusion::FusionConfig{}, fusion::process_env());
  o.config_path = "";
  o.wait_timeout = std::chrono::seconds(120);
  auto d =
      runtime::Device::create(std::make_unique<cpu::CpuBackend>(cpu::CpuBackendOptions{.threads = 2}), std::move(o));
  EXPECT_TRUE(d.ok()) << (d.ok() ? "" : d.error().to_string());
  return d.ok() ? std::move(d).value() : nullptr;
}

bool job_present(const DaemonStatus& st, const std::string& job) {
  return std::any_of(st.jobs.begin(), st.jobs.end(), [&](const JobStatus& j) { return j.name == job; });
}
bool pid_present(const DaemonStatus& st, pid_t pid) {
  return std::any_of(st.clients.begin(), st.clients.end(), [&](const ClientStatus& c) { return c.pid == pid; });
}

TEST(IpcStress, WorkersFloodAndAKill) {
  // Random programs make a new fused structure almost every time; a CPU backend that compiles
  // each one (the JIT, where built in) would spend the budget in the compiler. KILN_CPU_JIT=1
  // in the environment still forces it on.
  setenv("KILN_CPU_JIT", "0", /*overwrite=*/0);
  const double budget = budget_seconds();
  const auto t0 = Clock::now();
  const auto hard_deadline = t0 + std::chrono::duration<double>(2 * budget + 30);
  auto dev = make_device();
  ASSERT_NE(dev, nullptr);
  char tmpl[] = "/tmp/kiln-ipc-stress-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  DaemonOptions o;
  o.server.runtime_dir = dir;
  o.server.socket_name = kSocket;
  // A small command ring, so that the flood fills it within a few hundred ops; every client
  // gets it, which only adds backpressure to the program workers' traffic.
  o.server.segment.command_ring_bytes = std::uint64_t{64} << 10;
  o.server.segment.arena_bytes = std::uint64_t{8} << 20;
  auto service = DaemonService::start(*dev, o);
  ASSERT_TRUE(service.ok()) << service.error().to_string();

  const runtime::MemoryStats baseline = dev->backend().memory_stats();
  const std::size_t baseline_streams = dev->num_streams();

  // Worker 0 runs until killed; 1..P-1 for 0.6 of the budget; the flood for 0.4 of it.
  std::vector<Child> kids;
  const std::string run_s = std::to_string(0.6 * budget);
  for (int i = 0; i < kWorkers; ++i) {
    const bool doomed = i == 0;
    auto c = spawn_worker("worker " + std::to_string(i), {"programs", std::to_string(i), doomed ? "doomed" : "stress",
                                                          dir, doomed ? std::to_string(100 * budget) : run_s});
    ASSERT_TRUE(c.ok()) << c.error().to_string();
    kids.push_back(std::move(c).value());
  }
  {
    auto c = spawn_worker("flood", {"flood", "0", "flood", dir, std::to_string(0.4 * budget)});
    ASSERT_TRUE(c.ok()) << c.error().to_string();
    kids.push_back(std::move(c).value());
  }
  Child& doomed = kids[0];
  const pid_t doomed_pid = doomed.pid;

  bool killed = false, doomed_cleaned = false, others_running_at_cleanup = false;
  std::uint64_t progress_at_kill = 0;
  double kill_at = 0, cleaned_at = 0;
  for (;;) {
    std::vector<pollfd> fds;
    for (const Child& k : kids)
      if (k.out >= 0) fds.push_back(pollfd{k.out, POLLIN, 0});
    if (!fds.empty())
      (void)poll(fds.data(), fds.size(), 50);
    else
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    for (Child& k : kids)
      if (k.out >= 0) k.take_output();
    // The kill: once worker 0 is busy and the others are well into their run.
    if (!killed && doomed.progress >= 3 && seconds_since(t0) >= 0.3 * budget) {
      ASSERT_EQ(kill(doomed_pid, SIGKILL), 0);
      killed = true;
      kill_at = seconds_since(t0);
      progress_at_kill = doomed.progress;
    }
    if (killed && !doomed_cleaned) {
      const DaemonStatus st = (*service)->status();
      if (!pid_present(st, doomed_pid) && !job_present(st, "doomed")) {
        doomed_cleaned = true;
        cleaned_at = seconds_since(t0);
        for (std::size_t i = 1; i < kids.size(); ++i) others_running_at_cleanup |= !kids[i].reap();
      }
    }
    bool all_done = true;
    for (Child& k : kids) all_done &= k.reap() && k.out < 0;
    if (all_done) break;
    if (Clock::now() > hard_deadline) {
      ADD_FAILURE() << "time budget exceeded: workers still running after " << seconds_since(t0) << " s";
      break;  // ~Child kills what is left
    }
  }
  std::printf("stress: kill at %.1f s (worker 0 after %llu programs), its client cleaned up at %.1f s%s\n", kill_at,
              static_cast<unsigned long long>(progress_at_kill), cleaned_at,
              others_running_at_cleanup ? " while the other workers ran" : "");

  EXPECT_TRUE(killed) << "worker 0 never got busy enough to be killed";
  ASSERT_TRUE(doomed.status.has_value());
  EXPECT_TRUE(WIFSIGNALED(*doomed.status) && WTERMSIG(*doomed.status) == SIGKILL) << doomed.log;
  for (std::size_t i = 1; i < kids.size(); ++i) {
    const Child& k = kids[i];
    ASSERT_TRUE(k.status.has_value()) << k.name;
    EXPECT_TRUE(WIFEXITED(*k.status) && WEXITSTATUS(*k.status) == 0 && k.result)
        << k.name << " failed (status " << *k.status << "):\n"
        << k.log;
  }

  // The killed client's job vanished from the accounts, and once every client is gone the
  // daemon holds nothing more than before the test.
  EXPECT_TRUE(doomed_cleaned) << "the killed worker's client was never cleaned up";
  auto settled = [&] {
    const DaemonStatus st = (*service)->status();
    const runtime::MemoryStats m = dev->backend().memory_stats();
    return st.clients.empty() && st.jobs.empty() && m.tensors == baseline.tensors &&
           m.bytes_in_use == baseline.bytes_in_use && dev->num_streams() == baseline_streams;
  };
  const auto settle_deadline = Clock::now() + std::chrono::seconds(30);
  while (!settled() && Clock::now() < settle_deadline) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const runtime::MemoryStats after = dev->backend().memory_stats();
  const DaemonStatus st = (*service)->status();
  EXPECT_TRUE(settled()) << "leak: " << after.tensors << " tensors / " << after.bytes_in_use << " bytes (baseline "
                         << baseline.tensors << " / " << baseline.bytes_in_use << "), " << dev->num_streams()
                         << " streams (baseline " << baseline_streams << "), " << st.clients.size() << " clients, "
                         << st.jobs.size() << " jobs";
  EXPECT_EQ(st.clients_served, static_cast<std::uint64_t>(kWorkers + 1));
  // And the runtime's own leak check (docs/spec/fusion.md §16.8) over every stream's tables.
  const Status leaks = dev->check_memory_leaks();
  EXPECT_TRUE(leaks.ok()) << leaks.error().to_string();

  (*service)->stop();
  KILN_EXPECT_OK(dev->shutdown());
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  EXPECT_LT(seconds_since(t0), 2 * budget + 30);
  std::printf("stress: %.1f s in all (budget %.0f s)\n", seconds_since(t0), budget);
}

// A /proc/self/status field of this process (the daemon runs in it), bytes; 0 when unknown.
std::uint64_t status_bytes(const char* field = "VmRSS") {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return 0;
  char line[256];
  const std::string format = std::string(field) + ": %llu kB";
  unsigned long long kib = 0;
  while (std::fgets(line, sizeof line, f) != nullptr)
    if (std::sscanf(line, format.c_str(), &kib) == 1) break;
  std::fclose(f);
  return kib * 1024;
}
std::uint64_t resident_bytes() { return status_bytes("VmRSS"); }

// The soak (issue 19), opt-in: KILN_SOAK_SECONDS of program workers (every value checked), a
// worker SIGKILLed every few seconds and replaced, and hostile clients mixed in (doorbell spam,
// a never-popped completion ring, connection bursts, op floods). At the end: every worker that
// was not killed computed right, the daemon holds what it held before, and its resident memory
// came back near where it started.
TEST(IpcSoak, KillsHostileClientsAndFloods) {
  const char* env = std::getenv("KILN_SOAK_SECONDS");
  if (env == nullptr || std::atof(env) <= 0) GTEST_SKIP() << "opt-in: set KILN_SOAK_SECONDS (e.g. 1800)";
  setenv("KILN_CPU_JIT", "0", /*overwrite=*/0);
  const double soak = std::atof(env);
  const auto t0 = Clock::now();
  auto dev = make_device();
  ASSERT_NE(dev, nullptr);
  char tmpl[] = "/tmp/kiln-ipc-soak-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  DaemonOptions o;
  o.server.runtime_dir = dir;
  o.server.socket_name = kSocket;
  o.server.segment.command_ring_bytes = std::uint64_t{64} << 10;
  o.server.segment.arena_bytes = std::uint64_t{8} << 20;
  o.completion_timeout = std::chrono::seconds(1);
  auto service = DaemonService::start(*dev, o);
  ASSERT_TRUE(service.ok()) << service.error().to_string();
  const runtime::MemoryStats baseline = dev->backend().memory_stats();
  const std::uint64_t rss_start = resident_bytes();

  std::mt19937_64 rng(20261201);
  std::vector<Child> kids;
  std::uint64_t spawned = 0, kills = 0, hostiles = 0, wrong = 0, finished = 0;
  std::string wrong_logs;
  auto spawn = [&](const std::string& mode, const std::string& job, double seconds) {
    auto c = spawn_worker(mode + " " + std::to_string(spawned),
                          {mode, std::to_string(spawned), job, dir, std::to_string(seconds)});
    ++spawned;
    if (c.ok())
      kids.push_back(std::move(c).value());
    else
      ADD_FAILURE() << c.error().to_string();
  };
  // Takes the children's output and reaps the finished: a worker that was not killed must have
  // exited 0 (a wrong value makes a program worker exit 1 with FAIL lines).
  auto reap_finished = [&] {
    for (Child& k : kids)
      if (k.out >= 0) k.take_output();
    for (auto it = kids.begin(); it != kids.end();) {
      if (!it->reap() || it->out >= 0) {
        ++it;
        continue;
      }
      const bool killed = it->name.rfind("killed ", 0) == 0;
      if (!killed && !(WIFEXITED(*it->status) && WEXITSTATUS(*it->status) == 0)) {
        ++wrong;
        wrong_logs += it->name + ":\n" + it->log;
      }
      finished += !killed;
      it = kids.erase(it);
    }
  };
  auto next_kill = t0 + std::chrono::seconds(5), next_hostile = t0 + std::chrono::seconds(3);
  const char* hostile_modes[] = {"spam", "never-pop", "connections", "flood"};
  while (seconds_since(t0) < soak) {
    // Three program workers at all times, each for 10-30 s.
    std::size_t programs_running = 0;
    for (const Child& k : kids) programs_running += k.name.rfind("programs", 0) == 0 && !k.status;
    for (; programs_running < 3; ++programs_running) spawn("programs", "soak", 10.0 + double(rng() % 20));
    if (Clock::now() >= next_kill) {
      // A random running program worker dies by SIGKILL mid-program.
      std::vector<Child*> running;
      for (Child& k : kids)
        if (k.name.rfind("programs", 0) == 0 && !k.status && k.progress >= 1) running.push_back(&k);
      if (!running.empty()) {
        Child* victim = running[rng() % running.size()];
        kill(victim->pid, SIGKILL);
        victim->name = "killed " + victim->name;
        ++kills;
      }
      next_kill = Clock::now() + std::chrono::seconds(3 + rng() % 6);
    }
    if (Clock::now() >= next_hostile) {
      const std::string mode = hostile_modes[rng() % 4];
      spawn(mode, "hostile-" + std::to_string(spawned), 2.0 + double(rng() % 4));
      ++hostiles;
      next_hostile = Clock::now() + std::chrono::seconds(4 + rng() % 6);
    }
    std::vector<pollfd> fds;
    for (const Child& k : kids)
      if (k.out >= 0) fds.push_back(pollfd{k.out, POLLIN, 0});
    if (!fds.empty()) (void)poll(fds.data(), fds.size(), 100);
    reap_finished();
  }
  // Let the last ones finish (hostile ones end on their own; program workers within 30 s).
  const auto end_deadline = Clock::now() + std::chrono::seconds(120);
  while (!kids.empty() && Clock::now() < end_deadline) {
    reap_finished();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(kids.empty()) << kids.size() << " workers still running after the soak";
  EXPECT_EQ(wrong, 0u) << wrong_logs;
  auto settled = [&] {
    const DaemonStatus st = (*service)->status();
    const runtime::MemoryStats m = dev->backend().memory_stats();
    return st.clients.empty() && m.tensors == baseline.tensors && m.bytes_in_use == baseline.bytes_in_use;
  };
  const auto settle_deadline = Clock::now() + std::chrono::seconds(30);
  while (!settled() && Clock::now() < settle_deadline) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_TRUE(settled()) << "the daemon did not return to its baseline after the soak";
  (void)dev->backend().release_idle_memory();
  std::this_thread::sleep_for(std::chrono::seconds(3));  // past the large-block retention
  (void)dev->backend().release_idle_memory();
  const runtime::MemoryStats after = dev->backend().memory_stats();
  const std::uint64_t rss_before_trim = resident_bytes();
#if defined(__GLIBC__)
  (void)::malloc_trim(0);  // what the heap keeps of freed memory is not kiln's to hold
#endif
  const std::uint64_t rss_end = resident_bytes();
  std::printf(
      "soak: %zu plans in the store (at most %zu, %llu evicted); resident %.1f MiB before the heap was trimmed\n",
      dev->plan_store().size(), dev->plan_store().max_plans(),
      static_cast<unsigned long long>(dev->plan_store().evicted()), double(rss_before_trim) / (1 << 20));
  std::size_t triggers = 0, most_triggers = 0;
  for (fusion::PlanId id : dev->plan_store().ids())
    if (const fusion::TriggerSnapshot t = dev->plan_store().triggers(id)) {
      triggers += t->size();
      most_triggers = std::max(most_triggers, t->size());
    }
  std::printf("soak: %zu triggers on the plans kept, at most %zu on one plan\n", triggers, most_triggers);
  std::printf("soak: resident at the end: anonymous %.1f MiB, files %.1f MiB, shared memory %.1f MiB\n",
              double(status_bytes("RssAnon")) / (1 << 20), double(status_bytes("RssFile")) / (1 << 20),
              double(status_bytes("RssShmem")) / (1 << 20));
  std::printf(
      "soak: %.0f s; %llu workers and hostile clients started, %llu program workers SIGKILLed, %llu hostile clients, "
      "%llu workers finished, %llu wrong results; at the end %llu tensors / %llu bytes on the device (baseline %llu "
      "/ "
      "%llu), resident %.1f MiB (%.1f MiB at start), %llu clients served\n",
      seconds_since(t0), static_cast<unsigned long long>(spawned), static_cast<unsigned long long>(kills),
      static_cast<unsigned long long>(hostiles), static_cast<unsigned long long>(finished),
      static_cast<unsigned long long>(wrong), static_cast<unsigned long long>(after.tensors),
      static_cast<unsigned long long>(after.bytes_in_use), static_cast<unsigned long long>(baseline.tensors),
      static_cast<unsigned long long>(baseline.bytes_in_use), double(rss_end) / (1 << 20),
      double(rss_start) / (1 << 20), static_cast<unsigned long long>((*service)->status().clients_served));
  // Near where it started but for the plans: the device's pools went back (the daemon found them
  // idle), and so did the heap. Not under AddressSanitizer: its allocator keeps what was freed (its quarantine, and
  // no release to the system by default), so the figure there says nothing about kiln's.
#if defined(__SANITIZE_ADDRESS__)
  std::printf("soak: resident memory not checked under AddressSanitizer (its allocator keeps freed memory)\n");
#else
  // Random programs make a new plan nearly every time, ~34 KiB resident each with its compiled
  // forms (measured unbounded: 18158 plans, 620 MiB after 60 s); the store keeps at most
  // max_plans (8192) of them. What a leak would add scales with clients or time, not with the
  // plans kept: 256 MiB plus twice the kept plans' share catches it.
  const std::uint64_t plans_share = std::uint64_t{64} << 10;
  EXPECT_LT(rss_end, rss_start + (std::uint64_t{256} << 20) + plans_share * dev->plan_store().size())
      << "resident memory did not come back";
#endif
  const Status leaks = dev->check_memory_leaks();
  EXPECT_TRUE(leaks.ok()) << leaks.error().to_string();
  (*service)->stop();
  KILN_EXPECT_OK(dev->shutdown());
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

}  // namespace
}  // namespace kiln::ipc

// Worker mode first (before gtest or any thread exists in this process); else the tests.
int main(int argc, char** argv) {
  if (argc >= 2 && std::string_view(argv[1]) == kiln::ipc::kWorkerFlag) return kiln::ipc::worker_main(argc, argv);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
