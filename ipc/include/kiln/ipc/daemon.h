// DaemonService: the daemon's side of every client connection, over one runtime::Device.
//
// The control socket (control_server.h) admits clients; for each one the service runs a
// ClientSession on its own thread: it pops commands from the client's ring (each copied out of
// shared memory by the ring before anything looks at it), decodes them (protocol.h), checks
// them against what the daemon has on record, runs them on the device and answers on the
// completion ring.
//
// What a client can name is only its own: tensor and stream ids are the client's, translated
// through the session's private tables into device ids; an id the client never created (or
// already consumed) is an error completion ("read: tensor 12 is not one of this client's
// tensors"), never an index. Every registered operation is rebuilt through the ir builders
// (op_check.h) and its inputs' shapes and dtypes are compared with the daemon's record.
// Tensors move between clients only by export (a random 256-bit token) and import by a client
// of the same job, which gets an independent shared view (runtime Device::share).
//
// Completions: upload, upload_part, read, read_part, sync, export, import, attach, close and
// status are answered; register_op and drop are answered only when they fail (the client reports
// such an error at its next sync or read), so the op path costs one ring record; so is
// report_fallbacks, which the decoder checks whole and the session then only stores.
//
// Fallbacks: a client may report the ops it ran on its own CPU instead of kiln (the PyTorch
// device's counted fallback) as a full snapshot (report_fallbacks); the session keeps the latest,
// and the status shows the kStatusFallbacks most-called of them with the client. They go with
// the client.
//
// Jobs belong to credentials: the client that creates a job (the first to connect with its
// name) makes its uid (and primary gid) the job's owner; another client may join it only as
// DaemonOptions::job_policy allows (by default the same uid). A job, its quota use and its exports
// end when its last client leaves; the name is then free for anyone.
//
// Quotas apply per job (every client of the job) and per uid (every client of that user, whatever
// its jobs): bytes of live tensors and queued (registered, not yet executed) operations; the
// number of jobs a uid owns is capped too. Exceeding one is an error completion naming the quota;
// nothing is dropped.
//
// Status: a client sees the device's totals, its own uid's jobs and clients; the daemon's uid and
// root see every job and client.
//
// The daemon never blocks on one client: a completion that a client does not take within
// DaemonOptions::completion_timeout (its ring stays full) disconnects it, with the reason logged,
// and a stop interrupts such a wait at once. A client whose doorbell rings with nothing in its
// ring (spam) is paced by its endpoint (endpoint.h), so its wake-ups cost the daemon a bounded
// share of a core.
//
// A client that goes (its control socket closes: exit, crash, SIGKILL) has its streams drained
// and closed and every tensor it held dropped; nothing of it remains.
//
// Live control (protocol.h's control command; what `kilnctl jobs|clients|limits|disconnect|drain|
// reload|metrics|stop` send): served to the daemon's uid and root only, anyone else is refused
// with the reason. `limits` shows or sets the LiveLimits (all or nothing), which apply to the next
// charge, admission or connection: a lowered quota refuses new work, it frees nothing. `disconnect
// ID` ends a client as its own exit would (its streams drained, its tensors freed; the others
// untouched). `drain start` refuses new clients (except the operator's kilnctl) until `drain
// resume`; `drain status` counts the clients left. `reload` and `stop` call the hooks kilnd sets
// (ControlHooks).
//
// Metrics (daemon_metrics.h): metrics() snapshots every counter; a session counts into its own
// atomics and a scrape sums them, so no lock or shared cache line is added to the op path.
//
// Thread-safety: start/stop/status from any thread. Sessions run on their own threads; the
// tables they share (jobs, export tokens, statistics) are behind one mutex that is never held
// while the device runs anything.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/base/result.h"
#include "kiln/distributed/group.h"
#include "kiln/ipc/control_server.h"
#include "kiln/ipc/daemon_metrics.h"
#include "kiln/ipc/protocol.h"
#include "kiln/runtime/device.h"

namespace kiln::ipc {

// Who may join a job its owner created (daemon.job_policy in kiln.toml).
enum class JobPolicy {
  Uid,    // "uid": clients of the owner's uid only (the default)
  Group,  // "group": also clients whose primary gid is the owner's (a team sharing one group)
  Any,    // "any": every client allowed to connect (a single trusted team; the pre-v3 behaviour)
};
Result<JobPolicy> parse_job_policy(std::string_view name);
const char* job_policy_name(JobPolicy p);

struct DaemonOptions {
  ServerOptions server;
  std::uint64_t job_memory_bytes = 0;  // live tensor bytes per job; 0 = unlimited
  std::uint64_t job_queued_ops = 0;    // registered, not yet executed operations per job; 0 = unlimited
  JobPolicy job_policy = JobPolicy::Uid;
  std::uint64_t uid_memory_bytes = 0;  // live tensor bytes per client uid; 0 = unlimited
  // Queued operations per client uid. A bound by default: queued ops hold memory in the daemon
  // (their IR and their outputs' handles) that no tensor quota counts. 0 = unlimited.
  std::uint64_t uid_queued_ops = std::uint64_t{1} << 20;
  std::uint64_t uid_jobs = 64;  // jobs one uid may own at once; 0 = unlimited
  // How long a completion may wait for room in a client's ring before the client is
  // disconnected as stuck. A live client pops its completions within microseconds.
  std::chrono::milliseconds completion_timeout{5000};
  // Host memory for chunked transfers, all clients together: a chunked upload stages its whole
  // tensor, a chunked read snapshots it, and neither is device memory, so no device limit
  // counts them. 0 = unlimited (kilnd sets a share of the host's memory).
  std::uint64_t staging_bytes = 0;
  // How often the daemon gives the backend's idle memory back (DeviceBackend::release_idle_memory);
  // 0 = never (an allocation or free still does it lazily).
  std::chrono::milliseconds maintenance_interval{1000};
  std::string device_name = "cpu";  // reported by status
  // The job whose collectives span daemons (kiln.toml [distributed], docs/distributed.md): an
  // collective (AllReduce, Broadcast, AllGather, ReduceScatter) from one of its clients runs with
  // the same job on the other daemons of its world, on the client's session thread. Null: every job's collectives are
  // single-device.
  std::shared_ptr<distributed::CollectiveGroup> collectives;
  // Test hook: called on a client's session thread with each decoded command before it is
  // served. Tests hold an answer here to make a client's timeout happen for sure, not by a race
  // against the clock. Unset in kilnd.
  std::function<void(const Command&)> before_command;
};

struct ClientStatus {
  std::uint64_t client_id = 0;
  std::string job;
  std::int64_t pid = 0;
  std::uint32_t uid = 0;
  std::uint64_t streams = 0;
  std::uint64_t tensors = 0;
  std::uint64_t tensor_bytes = 0;
  std::uint64_t ops_registered = 0;
  std::uint64_t queued_ops = 0;
  std::uint64_t rejected = 0;  // commands answered with an error
  // The client's last fallback report: its kStatusFallbacks most-called ops, most calls first
  // (ties by name), and how many other ops it named.
  std::vector<FallbackCount> fallbacks;
  std::uint64_t fallbacks_omitted = 0;
};

// Fallbacks the status shows per client. A training step's fallbacks are a handful of ops (none
// for the models docs/pytorch.md lists): 16 shows them all, and keeps a client's share of the
// status report (kMaxStatusBytes, 64 KiB, for every client of the daemon) to about 2.5 KiB
// whatever it reports.
inline constexpr std::size_t kStatusFallbacks = 16;

struct JobStatus {
  std::string name;
  std::uint32_t owner_uid = 0;
  std::uint64_t clients = 0;
  std::uint64_t tensor_bytes = 0;
  std::uint64_t queued_ops = 0;
};

struct DaemonStatus {
  std::string device;
  std::string socket_path;
  std::vector<ClientStatus> clients;
  std::vector<JobStatus> jobs;
  std::uint64_t clients_served = 0;  // since start
  std::uint64_t streams = 0;         // device streams
  std::uint64_t plans = 0;           // plan-store size
  std::uint64_t max_plans = 0;       // its bound (0: unbounded, as in Burn)
  std::uint64_t plans_evicted = 0;   // plans evicted by the bound since start
  std::uint64_t cache_hits = 0;      // plans executed from the store (all streams, live ones)
  std::uint64_t explorations = 0;
  std::uint64_t fused_launches = 0;  // backend counter when it reports one (CPU device)
  std::uint64_t memory_bytes = 0;    // backend allocator bytes in use
  std::uint64_t device_tensors = 0;
  std::optional<distributed::GroupStatus> distributed;  // the job that spans daemons, if any

  std::string to_json() const;
  std::string to_text() const;  // kilnctl status
};

// What the daemon's owner (kilnd) does for the control verbs the service cannot do alone.
struct ControlHooks {
  // Re-reads the configuration and applies what can change live; the text says what changed and
  // what needs a restart.
  std::function<Result<std::string>()> reload;
  // Stops the daemon as SIGTERM does (the call returns at once; the stop follows).
  std::function<void()> stop;
};

class DaemonService {
 public:
  static Result<std::unique_ptr<DaemonService>> start(runtime::Device& device, DaemonOptions options);
  ~DaemonService();
  DaemonService(const DaemonService&) = delete;
  DaemonService& operator=(const DaemonService&) = delete;

  const std::string& socket_path() const;
  // Stops accepting, disconnects every client, drains and frees what they held, joins every
  // thread. Idempotent.
  void stop();
  DaemonStatus status() const;  // everything: for the daemon itself
  // What a client of uid `viewer` may see: the device's totals, and only the jobs and clients of
  // its own uid, unless it is the daemon's uid or root.
  DaemonStatus status_for(std::uint32_t viewer) const;
  // The backend's counters the status and the metrics report (kilnd reads its backend's stats).
  void set_backend_counters(std::function<BackendCounters()> counters);
  void set_control_hooks(ControlHooks hooks);

  // Every counter, for the metrics endpoint (daemon_metrics.h).
  DaemonMetrics metrics() const;
  // The live limits, and a change of them (reload; kilnctl limits set goes through the control
  // command). Quotas apply from the next charge; connection limits from the next connection.
  LiveLimits limits() const;
  void set_limits(const LiveLimits& limits);
  // Ends one client as if it had gone (streams drained and closed, tensors freed). Error: no such client.
  Status disconnect(std::uint64_t client_id);
  // While draining, new clients are refused (the operator's kilnctl excepted).
  void set_draining(bool draining);

  struct Impl;

 private:
  explicit DaemonService(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::ipc
