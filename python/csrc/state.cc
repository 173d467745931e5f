#include "state.h"

#include <c10/util/Exception.h>
#include <pthread.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <mutex>

#include "kiln/base/mutex.h"
#include "kiln/cpu/cpu_backend.h"
#include "kiln/ipc/remote_target.h"
#include "kiln/runtime/device.h"

namespace kiln::pytorch {
namespace {

// device, remote, socket and session are written by the one start (under started_once) and read
// after it: by callers of call_once, or after started.load(acquire).
struct State {
  std::once_flag started_once;
  std::atomic<bool> started{false};
  std::atomic<bool> forked{false};            // set in a child forked after the start
  std::unique_ptr<runtime::Device> device;    // in process
  std::unique_ptr<ipc::RemoteTarget> remote;  // in a kilnd
  std::string socket;                         // the kilnd's socket, absolute; empty in process
  std::unique_ptr<runtime::Session> session;
  // One report to the daemon at a time (report_fallbacks), so that snapshots arrive in the
  // order they were taken. Lock order: report_mu, then mu.
  Mutex report_mu KILN_ACQUIRED_BEFORE(mu);
  bool reported KILN_GUARDED_BY(report_mu) = false;  // a report went out (last_report is set)
  std::chrono::steady_clock::time_point last_report KILN_GUARDED_BY(report_mu);
  Mutex mu;
  std::map<std::string, std::int64_t> fallbacks KILN_GUARDED_BY(mu);
  bool fallbacks_changed KILN_GUARDED_BY(mu) = false;  // since the last report
  // fallbacks_changed, read without the lock at every sync point (a read is the hot path).
  std::atomic<bool> report_due{false};
};

// Fallback reports to a kilnd go at most this often: a training loop syncs or reads every step
// (milliseconds apart) and its counts change at each, while someone reading `kilnctl status`
// needs them within a second, not each step's.
constexpr std::chrono::milliseconds kFallbackReportInterval{500};

// Never destroyed (see shutdown() in state.h): a tensor Python frees during its finalization
// must still find its Session.
State& state() {
  static State* const s = new State();
  return *s;
}

// `path` made absolute (relative paths are the working directory's), so that the daemon named
// twice compares equal and the runtime directory is never the default one. Empty stays empty.
std::string absolute_socket(const std::string& path) {
  if (path.empty()) return path;
  std::error_code ec;
  std::filesystem::path p = std::filesystem::absolute(path, ec);
  return ec ? path : p.lexically_normal().string();
}

std::string socket_from_environment() {
  const char* env = std::getenv("KILN_SOCKET");
  return absolute_socket(env != nullptr ? env : "");
}

void note_started(State& s) {
  // A forked child shares the parent's connection (its rings) and none of its threads.
  ::pthread_atfork(nullptr, nullptr, [] { state().forked.store(true, std::memory_order_relaxed); });
  s.started.store(true, std::memory_order_release);
}

void start_in_process(State& s) {
  // The configuration comes from kiln.toml and KILN_* variables, as for every kiln client
  // (RuntimeOptions' defaults); the backend is the fast CPU executor with the JIT on Auto.
  Result<std::unique_ptr<runtime::Device>> device = runtime::Device::create(std::make_unique<cpu::CpuBackend>());
  s.device = value_or_throw(std::move(device), "starting the in-process device");
  s.session = std::make_unique<runtime::Session>(*s.device);
  note_started(s);
}

// Connects to the kilnd at `socket` (absolute). Every later wait is bounded: a daemon that goes
// away fails the waiting call within RemoteTarget's poll interval (it watches the socket), one
// that stops answering after RemoteOptions::reply_timeout.
void start_remote(State& s, const std::string& socket, const std::string& job, std::string_view how) {
  const std::filesystem::path p(socket);
  ipc::RemoteOptions options;
  options.runtime_dir = p.parent_path().string();
  options.socket_name = p.filename().string();
  options.job = job;
  s.remote = value_or_throw(ipc::RemoteTarget::connect(options), "connecting to kilnd (" + std::string(how) + ")");
  s.socket = socket;
  s.session = std::make_unique<runtime::Session>(*s.remote);
  note_started(s);
}

void start(State& s) {
  const std::string socket = socket_from_environment();
  if (socket.empty()) {
    start_in_process(s);
  } else {
    start_remote(s, socket, "pytorch", "KILN_SOCKET=" + socket);
  }
}

void check_not_forked(const State& s) {
  if (s.forked.load(std::memory_order_relaxed)) {
    throw_error(make_error(ErrorCode::Unsupported,
                           "the device was started before this process was forked; a forked child cannot use it "
                           "(start child processes with the spawn method, or before the first kiln op)"),
                "device");
  }
}

// Sends the fallback counts to the daemon if they changed since the last report (and, unless
// `now`, that report is kFallbackReportInterval old). Only in a kilnd, and never in a forked
// child (the parent's connection is not its own). A failed send raises nothing: it is dropped.
void report_fallbacks(State& s, bool now) {
  if (!s.report_due.load(std::memory_order_acquire)) return;
  if (!s.started.load(std::memory_order_acquire) || !s.remote || s.forked.load(std::memory_order_relaxed)) return;
  MutexLock report_lock(s.report_mu);
  const auto t = std::chrono::steady_clock::now();
  if (!now && s.reported && t - s.last_report < kFallbackReportInterval) return;
  std::map<std::string, std::uint64_t> snapshot;
  {
    MutexLock lock(s.mu);
    if (!s.fallbacks_changed) return;  // another thread's report took them
    for (const auto& [name, calls] : s.fallbacks) snapshot.emplace(name, static_cast<std::uint64_t>(calls));
    s.fallbacks_changed = false;
    s.report_due.store(false, std::memory_order_release);
  }
  s.reported = true;
  s.last_report = t;
  // A daemon that went away: the op that next waits on it raises; the counts are not worth more.
  Status st = s.remote->report_fallbacks(snapshot);
  (void)st;
}

// The counts changed: the next sync point reports them.
void mark_fallbacks_changed(State& s) KILN_REQUIRES(s.mu) {
  s.fallbacks_changed = true;
  s.report_due.store(true, std::memory_order_release);
}

}  // namespace

runtime::Session& session() {
  State& s = state();
  // A throwing start leaves the flag unset: the next call tries again.
  std::call_once(s.started_once, start, s);
  check_not_forked(s);
  return *s.session;
}

void connect(const std::string& path, const std::string& job) {
  State& s = state();
  const std::string socket = absolute_socket(path);
  if (socket.empty()) throw_error(make_error(ErrorCode::Invalid, "empty socket path"), "connect");
  bool ran = false;
  std::call_once(s.started_once, [&] {
    ran = true;
    start_remote(s, socket, job, "kiln.connect(" + socket + ")");
  });
  check_not_forked(s);
  if (ran || s.socket == socket) return;
  const std::string where = s.socket.empty() ? "in process" : "in the kilnd at " + s.socket;
  throw_error(make_error(ErrorCode::Invalid, "the device already started " + where + "; kiln.connect(" + socket +
                                                 ") must come before any kiln op (or set KILN_SOCKET)"),
              "connect");
}

Placement placement() {
  const State& s = state();
  if (!s.started.load(std::memory_order_acquire)) return Placement{false, socket_from_environment(), -1};
  Placement p{true, s.socket, -1};
  if (s.remote) p.client_id = static_cast<std::int64_t>(s.remote->client_id());
  return p;
}

std::string daemon_status(bool json) {
  State& s = state();
  session();  // starts the device as the first op would
  if (!s.remote) {
    throw_error(
        make_error(ErrorCode::Invalid, "the device runs in process; set KILN_SOCKET or call kiln.connect(path) first"),
        "daemon_status");
  }
  report_fallbacks(s, /*now=*/true);
  return value_or_throw(s.remote->daemon_status(json), "daemon_status");
}

void synchronize() {
  runtime::Session& device_session = session();
  // Before the sync: the daemon serves a client's commands in order, so once the sync returns
  // its status shows the counts.
  report_fallbacks(state(), /*now=*/false);
  check(device_session.sync(), "synchronize");
}

void sync_point() { report_fallbacks(state(), /*now=*/false); }

void shutdown() {
  State& s = state();
  // A forked child has none of the device's threads to join, nor a connection of its own.
  if (!s.started.load(std::memory_order_acquire) || s.forked.load(std::memory_order_relaxed)) return;
  report_fallbacks(s, /*now=*/true);  // a kilnd: what changed since the last sync point
  if (!s.device) return;
  Status st = s.device->shutdown();
  (void)st;  // at exit there is no one left to tell; a failed op was reported at its sync
}

void note_fallback(const std::string& name) {
  bool first = false;
  {
    State& s = state();
    MutexLock lock(s.mu);
    first = s.fallbacks[name]++ == 0;
    mark_fallbacks_changed(s);
  }
  if (first) {
    TORCH_WARN("kiln: ", name, " is not lowered to kiln; it runs on the CPU (kiln.stats() counts it; warned once)");
  }
}

std::map<std::string, std::int64_t> fallback_counts() {
  State& s = state();
  MutexLock lock(s.mu);
  return s.fallbacks;
}

void reset_fallback_counts() {
  State& s = state();
  {
    MutexLock lock(s.mu);
    s.fallbacks.clear();
    mark_fallbacks_changed(s);
  }
  report_fallbacks(s, /*now=*/true);  // the daemon's status shows the reset at once
}

void throw_error(const Error& error, std::string_view what) {
  throw c10::AcceleratorError({__func__, __FILE__, static_cast<std::uint32_t>(__LINE__)},
                              static_cast<std::int32_t>(error.code),
                              "kiln: " + std::string(what) + ": " + error.to_string());
}

}  // namespace kiln::pytorch
