// The daemon's client sessions over one device (kiln/ipc/daemon.h).
#include "kiln/ipc/daemon.h"

#include "kiln/distributed/parts.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include <sys/random.h>
#include <unistd.h>
#include <boost/container/small_vector.hpp>

#include <cerrno>
#include <charconv>
#include <cstring>

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <span>
#include <thread>
#include <unordered_map>
#include <utility>

#include "daemon_plans.h"
#include "json_text.h"
#include "kiln/base/mutex.h"
#include "kiln/ipc/device_lock.h"
#include "kiln/ipc/log_format.h"
#include "kiln/ipc/op_check.h"
#include "kiln/ipc/protocol.h"
#include "kiln/ir/builders.h"
#include "words.h"

namespace kiln::ipc {

using runtime::StreamId;

namespace {

constexpr std::chrono::milliseconds kReceivePoll{100};  // how often a session checks for stop
// A completion waits for ring space in slices of this, checking for stop between them, so a stop
// never waits on a client that does not pop its completions.
constexpr std::chrono::milliseconds kSendSlice{50};
constexpr std::uint64_t kQueuedOpsRefresh = 64;  // ops between queued-op recounts
constexpr std::size_t kMaxJobTagNames = 4096;    // ended jobs whose names kilnctl plans still shows
// Registrations made without waking their stream's actor while the client's ring still holds
// messages, before the session wakes the actors anyway (see ClientSession::register_op). A
// worker's step up to its read fits (the read then runs it all on the session thread, no pool
// thread woken: 4-process ops/s +10-20% over a limit of 32); half an actor's intake ring, so a
// deferred burst never fills it.
constexpr std::size_t kDeferredWakeMax = 256;

// Bounds one staged (chunked) upload whatever the job's quota (0 = unlimited): far above any
// tensor a kiln device holds; it caps what a quota-less client can make the daemon reserve.
constexpr std::uint64_t kMaxStagedBytes = std::uint64_t{1} << 40;

// The largest staging this machine could hold: kMaxStagedBytes, or the physical memory when
// that is smaller. A request above it is refused before the allocation is tried (a sanitizer's
// allocator aborts the process on an impossible size instead of returning null).
std::uint64_t staging_limit() {
  static const std::uint64_t limit = [] {
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
    if (pages <= 0 || page <= 0) return kMaxStagedBytes;
    return std::min(kMaxStagedBytes, static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page));
  }();
  return limit;
}

// What the daemon knows of one client tensor.
struct TensorRecord {
  ir::TensorId global;
  ir::Shape shape;
  ir::DType dtype;
  StreamId home;
  std::uint64_t bytes = 0;
};

struct ExportRecord {
  ExportToken token;  // the whole token; the table is keyed by its index
  std::string job;
  std::uint64_t client_id = 0;
  std::uint64_t client_tensor = 0;
  TensorRecord tensor;
};

// A fresh token from the OS's secure random source (getrandom(2), the kernel's CSPRNG; it blocks
// only before the kernel's pool is first seeded, early at boot).
Result<ExportToken> new_export_token() {
  ExportToken t;
  std::size_t got = 0;
  while (got < t.bytes.size()) {
    const ssize_t n = ::getrandom(t.bytes.data() + got, t.bytes.size() - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return make_error(ErrorCode::Internal, fmt::format("getrandom: {}", std::strerror(errno)));
    }
    got += static_cast<std::size_t>(n);
  }
  return t;
}

std::string human_bytes(std::uint64_t b) {
  if (b >= (std::uint64_t{1} << 30)) return fmt::format("{:.1f} GiB", double(b) / double(1 << 30));
  if (b >= (std::uint64_t{1} << 20)) return fmt::format("{:.1f} MiB", double(b) / double(1 << 20));
  if (b >= (std::uint64_t{1} << 10)) return fmt::format("{:.1f} KiB", double(b) / double(1 << 10));
  return fmt::format("{} B", b);
}

}  // namespace

// Usage counted against a quota by several sessions: a job's, or a uid's. The two counts change
// on the op path (every registration charges its outputs, every consumed input releases), so they
// are atomics, not fields under the service's mutex: four clients' session threads took that one
// lock 2-3 times per op.
struct Usage {
  std::atomic<std::uint64_t> tensor_bytes{0};  // bytes charged by the sessions (a uid's: only under a uid quota)
  std::atomic<std::uint64_t> queued_ops{0};    // sum of the sessions' last recounts
};

// A job's owner and totals over its sessions.
// A stream's processor counters, as the metrics sum them per job.
struct StreamCounters {
  std::uint64_t executed = 0, cache_hits = 0, explorations = 0, plans_created = 0, fused_blocks = 0, unfused_ops = 0;
  static StreamCounters of(const runtime::StreamStats& st) {
    return StreamCounters{st.executed,      st.cache_hits,   st.explorations,
                          st.plans_created, st.fused_blocks, st.unfused_ops};
  }
  void add(const StreamCounters& o) {
    executed += o.executed;
    cache_hits += o.cache_hits;
    explorations += o.explorations;
    plans_created += o.plans_created;
    fused_blocks += o.fused_blocks;
    unfused_ops += o.unfused_ops;
  }
};

// What a job's sessions that ended counted (the metrics add the live sessions' own).
struct JobRetired {
  std::uint64_t ops_registered = 0;
  StreamCounters streams;
  RejectedCounts rejected;
};

struct JobState {
  uid_t owner_uid = 0;  // the creator's credentials (fixed)
  gid_t owner_gid = 0;
  std::uint32_t tag = 0;      // its streams' tag in the plan store (fixed; Impl::job_tags)
  std::uint64_t clients = 0;  // under DaemonService::Impl::mu
  JobRetired retired;         // under DaemonService::Impl::mu
  Usage usage;
};

// The live limits, read on the op path (relaxed loads) and set by the operator.
struct AtomicLimits {
  std::atomic<std::uint64_t> job_memory_bytes{0}, job_queued_ops{0}, uid_memory_bytes{0}, uid_queued_ops{0};
  std::atomic<std::uint64_t> uid_jobs{0}, staging_bytes{0}, max_connections{0}, max_connections_per_uid{0};

  static std::uint64_t get(const std::atomic<std::uint64_t>& a) { return a.load(std::memory_order_relaxed); }
  LiveLimits load() const {
    return LiveLimits{get(job_memory_bytes), get(job_queued_ops), get(uid_memory_bytes), get(uid_queued_ops),
                      get(uid_jobs),         get(staging_bytes),  get(max_connections),  get(max_connections_per_uid)};
  }
  void store(const LiveLimits& l) {
    job_memory_bytes.store(l.job_memory_bytes, std::memory_order_relaxed);
    job_queued_ops.store(l.job_queued_ops, std::memory_order_relaxed);
    uid_memory_bytes.store(l.uid_memory_bytes, std::memory_order_relaxed);
    uid_queued_ops.store(l.uid_queued_ops, std::memory_order_relaxed);
    uid_jobs.store(l.uid_jobs, std::memory_order_relaxed);
    staging_bytes.store(l.staging_bytes, std::memory_order_relaxed);
    max_connections.store(l.max_connections, std::memory_order_relaxed);
    max_connections_per_uid.store(l.max_connections_per_uid, std::memory_order_relaxed);
  }
};

// A client uid's totals over its sessions and the jobs it owns.
struct UidState {
  std::uint64_t clients = 0;  // under DaemonService::Impl::mu
  std::uint64_t jobs = 0;     // jobs it owns; under DaemonService::Impl::mu
  Usage usage;
};

// Adds `n` to `in_use` unless the sum passes `limit` (0 = none), as one step against the other
// sessions adding to it; `seen` is the count the refusal saw.
bool try_add(std::atomic<std::uint64_t>& in_use, std::uint64_t limit, std::uint64_t n, std::uint64_t& seen) {
  seen = in_use.load(std::memory_order_relaxed);
  if (limit == 0) {
    in_use.fetch_add(n, std::memory_order_relaxed);
    return true;
  }
  do {
    if (n > limit || seen > limit - n) return false;
  } while (!in_use.compare_exchange_weak(seen, seen + n, std::memory_order_relaxed));
  return true;
}

// Bytes of the daemon's host staging (a chunked upload's buffer, a chunked read's snapshot) held
// against DaemonOptions::staging_bytes, released when the staging goes, however it goes.
class StagingReservation {
 public:
  StagingReservation() = default;
  StagingReservation(std::atomic<std::uint64_t>& in_use, std::uint64_t bytes) : in_use_(&in_use), bytes_(bytes) {}
  StagingReservation(StagingReservation&& o) noexcept : in_use_(std::exchange(o.in_use_, nullptr)), bytes_(o.bytes_) {}
  StagingReservation& operator=(StagingReservation&& o) noexcept {
    if (this != &o) {
      reset();
      in_use_ = std::exchange(o.in_use_, nullptr);
      bytes_ = o.bytes_;
    }
    return *this;
  }
  ~StagingReservation() { reset(); }
  void reset() {
    if (in_use_ != nullptr) in_use_->fetch_sub(bytes_, std::memory_order_relaxed);
    in_use_ = nullptr;
  }

 private:
  std::atomic<std::uint64_t>* in_use_ = nullptr;
  std::uint64_t bytes_ = 0;
};

class ClientSession;

struct DaemonService::Impl {
  runtime::Device& device;
  DaemonOptions options;
  boost::asio::io_context io;
  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> work;
  std::unique_ptr<ControlServer> server;
  std::thread io_thread;
  std::string socket_path;
  std::optional<boost::asio::steady_timer> maintenance;  // on `io`: memory given back when idle

  mutable Mutex mu;
  std::map<std::uint64_t, std::shared_ptr<ClientSession>> sessions KILN_GUARDED_BY(mu);
  // Each session's thread, created under `mu` together with the session's entry, so that the
  // thread's own last act (moving itself to finished_threads, under `mu`) always finds it.
  std::map<std::uint64_t, std::thread> threads KILN_GUARDED_BY(mu);
  std::vector<std::thread> finished_threads KILN_GUARDED_BY(mu);  // sessions that ended, joined by the next reap
  std::map<std::string, JobState> jobs KILN_GUARDED_BY(mu);
  std::map<uid_t, UidState> uids KILN_GUARDED_BY(mu);                           // every uid with a client or a job
  std::unordered_map<std::uint64_t, ExportRecord> exports KILN_GUARDED_BY(mu);  // by ExportToken::index()
  std::uint64_t clients_served KILN_GUARDED_BY(mu) = 0;
  std::atomic<std::uint64_t> staged_bytes{0};         // every session's staging (StagingReservation)
  std::atomic<bool> stopping{false};                  // stop() began (for the sessions' logs)
  std::uint64_t next_stream KILN_GUARDED_BY(mu) = 1;  // device stream numbers handed to client streams
  std::function<BackendCounters()> backend_counters KILN_GUARDED_BY(mu);
  ControlHooks hooks KILN_GUARDED_BY(mu);
  bool stopped KILN_GUARDED_BY(mu) = false;
  AtomicLimits limits;                // DaemonOptions' quotas and connection limits, as set live
  std::atomic<bool> draining{false};  // kilnctl drain: new clients refused
  // Metrics of what is gone: sessions that ended (their jobs' shares are in JobState::retired),
  // and connections refused, by reason.
  RejectedCounts retired_rejected KILN_GUARDED_BY(mu);
  std::array<LatencySnapshot, kNumCommandKinds> retired_requests KILN_GUARDED_BY(mu){};
  LatencySnapshot retired_op_admission KILN_GUARDED_BY(mu);
  std::map<std::string, std::uint64_t, std::less<>> refused KILN_GUARDED_BY(mu);
  // Plan-store tags of jobs (kilnctl plans: who created and ran a plan), never reused; the names
  // of the last kMaxJobTagNames jobs are kept after they end.
  std::uint32_t next_job_tag KILN_GUARDED_BY(mu) = 1;
  std::map<std::uint32_t, std::string> job_tags KILN_GUARDED_BY(mu);

  Impl(runtime::Device& d, DaemonOptions o) : device(d), options(std::move(o)) {
    limits.store(LiveLimits{options.job_memory_bytes, options.job_queued_ops, options.uid_memory_bytes,
                            options.uid_queued_ops, options.uid_jobs, options.staging_bytes,
                            options.server.max_connections, options.server.max_connections_per_uid});
  }

  Status admit(const PeerCredentials& peer, std::string_view job);
  void on_client(std::unique_ptr<AcceptedClient> client);
  DaemonStatus status(std::optional<uid_t> viewer);
  DaemonMetrics metrics();
  void count_refusal(std::string_view reason) KILN_REQUIRES(mu);
  void set_limits(const LiveLimits& l);
  // Ends a client's session and waits until it has cleaned up; what it freed, for the operator.
  Result<std::string> disconnect(std::uint64_t client_id, std::chrono::milliseconds timeout);
  std::uint64_t clients_left() const;  // clients that are not an operator's kilnctl
  // Waits until a session has cleaned up and left the table (it drains its streams first);
  // false when `deadline` came first.
  bool wait_until_gone(std::uint64_t client_id, std::optional<std::chrono::steady_clock::time_point> deadline) const;
  BackendCounters backend() const;
  // The session is gone; its job and uid entries end with their last client.
  void leave(const std::string& job, uid_t uid) KILN_REQUIRES(mu);
  // A uid's entry goes with its last client and its last owned job.
  void drop_if_unused(uid_t u) KILN_REQUIRES(mu);
  void on_disconnect(std::uint64_t client_id, const Status& why);
  void reap();
  void schedule_maintenance();
};

// One client: its tables and the thread that serves its ring.
class ClientSession : public std::enable_shared_from_this<ClientSession> {
 public:
  ClientSession(DaemonService::Impl& service, std::unique_ptr<AcceptedClient> client)
      : service_(service), client_(std::move(client)) {
    stats_.client_id = id();
    stats_.job = job();
    stats_.pid = client_->peer.pid;
    stats_.uid = client_->peer.uid;
  }
  // Under service_.mu, before launch().
  void set_usage(JobState* job, UidState* uid) {
    job_state_ = job;
    uid_state_ = uid;
  }
  uid_t uid() const { return client_->peer.uid; }
  gid_t gid() const { return client_->peer.gid; }

  // The session's thread (the caller stores it under the service's mutex, see Impl::threads).
  std::thread launch() {
    return std::thread([self = shared_from_this()] { self->run(); });
  }
  void request_stop() { stop_.store(true, std::memory_order_release); }
  std::uint64_t id() const { return client_->client_id; }
  const std::string& job() const { return client_->job; }

  ClientStatus status() const {
    MutexLock lock(stats_mu_);
    return stats_;
  }

  // What this session counted, for a scrape (any thread).
  struct Metrics {
    ClientStatus status;
    RejectedCounts rejected;
    std::array<LatencySnapshot, kNumCommandKinds> requests{};
    LatencySnapshot op_admission;
    std::vector<StreamId> streams;  // live: the scrape reads their counters from the device
    StreamCounters closed_streams;  // streams it closed
  };
  Metrics metrics() const;
  // Under service_.mu, as the session leaves service_.sessions: its counts move to its job's and
  // the service's totals in the same step, so a scrape counts them once.
  void retire_metrics() KILN_REQUIRES(service_.mu);

 private:
  void run();
  void serve(std::span<const std::uint8_t> message);
  void cleanup();

  // Handlers: an error return becomes an error completion for the request.
  Status attach(const AttachStreamCmd& c, std::uint64_t rid);
  Status register_op(RegisterOpCmd& c);
  // Whether this client's job is the one whose collectives span daemons.
  bool spans_daemons() const {
    return service_.options.collectives && service_.options.collectives->config().job == job();
  }
  // A collective of that job (AllReduce, Broadcast, AllGather, ReduceScatter), its ids
  // translated (register_op).
  Status collective_across_daemons(StreamId s, const ir::Operation& op);
  // AllReduce and Broadcast: `across` runs on the bytes of the op's output, which the stream
  // made a copy of its input.
  Status in_place_across_daemons(StreamId s, const ir::Operation& op, FunctionRef<Status(std::span<std::byte>)> across);
  // AllGather and ReduceScatter: the output is made from this rank's input outside the stream.
  Status reshaped_across_daemons(StreamId s, const ir::Operation& op);
  // This rank leaves the collective it cannot take part in (its peers fail at once); returns `why`.
  Status leave_collective(const ir::Operation& op, const Error& why);
  // The output of a collective that failed across daemons: its error, logged.
  Status fail_collective(const ir::TensorIr& out, const ir::Operation& op, const Error& error);
  Status upload(const UploadCmd& c, std::uint64_t rid);
  Status read(const ReadCmd& c, std::uint64_t rid);
  Status sync(const SyncCmd& c, std::uint64_t rid);
  Status drop(const DropCmd& c);
  Status export_tensor(const ExportCmd& c, std::uint64_t rid);
  Status import_tensor(const ImportCmd& c, std::uint64_t rid);
  Status close_stream(const CloseStreamCmd& c, std::uint64_t rid);
  Status status(const StatusCmd& c, std::uint64_t rid);
  Status upload_part(const UploadPartCmd& c, std::uint64_t rid);
  Status read_part(const ReadPartCmd& c, std::uint64_t rid);
  Status report_fallbacks(ReportFallbacksCmd& c);
  Status control(const ControlCmd& c, std::uint64_t rid);
  Result<std::string> control_answer(const ControlCmd& c);
  Result<std::string> plans_answer(const ControlCmd& c);
  Result<ReadPartDoneCpl> read_window(const ReadPartCmd& c);  // of staged_read_
  void reset_staged_read();                                   // ends the chunked read, releasing what it was charged
  void discard_staged_upload(std::uint64_t client_tensor);
  // Reserves `bytes` of the daemon's staging memory; `what` names the request in the error.
  Result<StagingReservation> reserve_staging(std::uint64_t bytes, const std::string& what);

  void dispatch(Command& cmd);  // runs a decoded command, answering an error completion on failure
  Status send(const Completion& cpl);
  void wake_deferred();
  void note_deferred(StreamId s);  // a registration or drop left for wake_deferred()
  StreamId stream(std::uint64_t client_stream);
  // A fresh device tensor id, from this session's current block of ir::kTensorIdBlock.
  ir::TensorId fresh_id() {
    if (next_id_ == end_id_) {
      next_id_ = service_.device.new_tensor_ids(ir::kTensorIdBlock).value();
      end_id_ = next_id_ + ir::kTensorIdBlock;
    }
    return ir::TensorId(next_id_++);
  }
  Result<TensorRecord*> lookup(std::uint64_t client_tensor, const char* what);
  // Makes `to` the tensor's home: its old home is drained first, so that no op queued there still
  // reads the tensor when `to` consumes or drops it (a drop goes to the home, and a queue must
  // never name another stream's tensor: docs/spec/fusion.md §16.5). A well-behaved client shares across
  // streams (export and import) and uploads onto the stream that uses a tensor, and never pays it.
  Status rehome(TensorRecord& rec, StreamId to);
  Status check_fresh(std::uint64_t client_tensor, const char* what) const;
  // Charges `bytes` to the job's memory quota; `what()` names the request in the error only.
  template <class What>
  Status charge(std::uint64_t bytes, const What& what);
  Status charge(std::uint64_t bytes, const char* what);
  void release(std::uint64_t bytes);
  void forget(std::span<const std::uint64_t> client_tensors);
  void forget(std::uint64_t client_tensor);
  void publish_stats();
  void count_rejected(ErrorCode code);
  void refresh_queued_ops();
  Status check_queued_ops();  // the job's and the uid's queued-op quotas, before a registration

  DaemonService::Impl& service_;
  std::unique_ptr<AcceptedClient> client_;
  std::atomic<bool> stop_{false};
  // This client's job entry in service_.jobs (the map and `clients` under service_.mu, the
  // counters atomic): set before the session thread starts; the entry lives until the job's
  // last session has cleaned up.
  JobState* job_state_ = nullptr;
  UidState* uid_state_ = nullptr;  // the same for this client's uid

  // Session-thread state.
  std::unordered_map<std::uint64_t, StreamId> streams_;
  std::unordered_map<std::uint64_t, TensorRecord> tensors_;
  // This client's entries in service_.exports, by client tensor (only this thread adds or
  // removes them): forget() withdraws a tensor's exports without scanning the device's.
  std::unordered_multimap<std::uint64_t, std::uint64_t> exported_;  // client tensor -> token index
  std::uint64_t tensor_bytes_ = 0;
  std::uint64_t next_id_ = 0, end_id_ = 0;  // fresh_id()'s block
  std::uint64_t ops_registered_ = 0;
  std::uint64_t queued_ops_ = 0;
  std::uint64_t rejected_ = 0;
  std::vector<std::uint8_t> out_;
  // Chunked transfers in progress (upload_part, read_part; see protocol.h). An upload's staging
  // buffer has the tensor's size, charged to the job's quota from its first part; the read
  // snapshot is one device read, at most one per connection, bounded by a live tensor's size.
  struct StagedUpload {
    std::uint64_t stream = 0;  // the client's home stream for the tensor
    ir::DType dtype;
    ir::Shape shape;
    std::uint64_t total = 0;     // bytes of the tensor (charged)
    std::uint64_t received = 0;  // bytes copied in so far: the next part's offset
    std::unique_ptr<std::byte[]> data;
    StagingReservation staging;
  };
  // One chunked read at a time (the client serialises them): a snapshot of the tensor, taken at
  // the first window. Read-only: dropped with its tensor (forget); a last use: the tensor is
  // consumed at once and its charge moves here.
  struct StagedRead {
    std::uint64_t client_tensor = 0;
    bool last_use = false;
    std::uint64_t sent = 0;     // bytes copied out so far: the next window's offset
    std::uint64_t charged = 0;  // quota bytes to release when the read ends
    runtime::HostData data;
    StagingReservation staging;
  };
  std::unordered_map<std::uint64_t, StagedUpload> staged_uploads_;
  std::optional<StagedRead> staged_read_;
  // Streams with registrations not woken yet, and how many (register_op, serve).
  std::vector<StreamId> deferred_streams_;
  std::size_t deferred_ops_ = 0;
  OperationCheckMemo op_check_;  // register_op's shape check, remembering accepted shapes

  mutable Mutex stats_mu_;
  ClientStatus stats_ KILN_GUARDED_BY(stats_mu_);
  std::vector<StreamId> stream_ids_ KILN_GUARDED_BY(stats_mu_);  // streams_'s device streams
  StreamCounters closed_streams_ KILN_GUARDED_BY(stats_mu_);

  // Metrics written by the session thread alone (single writer), read by scrapes.
  std::array<std::atomic<std::uint64_t>, kNumErrorCodes> rejected_by_code_{};
  std::array<LatencyHistogram, kNumCommandKinds> request_latency_;
  LatencyHistogram op_admission_;
  std::uint64_t op_sample_ = 0;  // register_ops seen, for the 1-in-kOpLatencySample timing
};

// kilnctl's job name for a uid ("kilnctl-<uid>"): an operator's tool, not a workload.
bool is_kilnctl_job(std::string_view job) { return job.substr(0, 8) == "kilnctl-"; }

// ---- Session thread

void ClientSession::run() {
  const LogScope scope(id(), job());
  Endpoint& ep = client_->endpoint;
  std::vector<std::uint8_t> buf(ep.max_receive_bytes());
  spdlog::info("kilnd: client {} connected (job {}, pid {}, uid {})", id(), job(), client_->peer.pid,
               client_->peer.uid);
  while (!stop_.load(std::memory_order_acquire)) {
    Result<std::optional<std::size_t>> got = ep.receive(buf, kReceivePoll);
    if (!got.ok()) {
      // A ring the client corrupted: nothing more from it can be trusted.
      spdlog::warn("kilnd: client {}: {}; disconnecting it", id(), got.error().to_string());
      break;
    }
    if (!got->has_value()) {
      // Idle: its queued ops may have run since the last recount, and a stale share would
      // count against the job's and the uid's other sessions.
      if (queued_ops_ != 0) refresh_queued_ops();
      continue;
    }
    serve(std::span<const std::uint8_t>(buf.data(), **got));
  }
  cleanup();
  MutexLock lock(service_.mu);
  retire_metrics();
  service_.leave(job(), uid());
  service_.sessions.erase(id());
  if (auto t = service_.threads.find(id()); t != service_.threads.end()) {
    service_.finished_threads.push_back(std::move(t->second));
    service_.threads.erase(t);
  }
  if (service_.server && !service_.stopped) service_.server->disconnect(id());
}

void ClientSession::serve(std::span<const std::uint8_t> message) {
  // Answered commands are timed; one-way ones are not, but for 1 register_op in
  // kOpLatencySample (two clock reads on every op would cost the op path).
  const auto kind = static_cast<CommandKind>(message.empty() ? 0 : message[0]);
  const bool one_way =
      kind == CommandKind::RegisterOp || kind == CommandKind::Drop || kind == CommandKind::ReportFallbacks;
  const bool timed = !one_way || (kind == CommandKind::RegisterOp && ++op_sample_ % kOpLatencySample == 0);
  const auto start = timed ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
  const std::uint64_t arena_size = client_->endpoint.layout().arena_size;
  Result<Command> decoded = decode_command(message, arena_size);
  if (!decoded.ok()) {
    count_rejected(decoded.error().code);
    (void)send(error_completion(peek_request_id(message).value_or(0), decoded.error()));
  } else {
    if (service_.options.before_command) service_.options.before_command(*decoded);
    dispatch(*decoded);
    if (timed) {
      const auto took = std::chrono::steady_clock::now() - start;
      if (kind == CommandKind::RegisterOp)
        op_admission_.observe(took);
      else
        request_latency_[static_cast<std::size_t>(kind) - 1].observe(took);
    }
  }
  // Registrations and drops left unwoken run once the burst is over (nothing more in the ring,
  // whatever this message was) or long.
  if (!deferred_streams_.empty() && (deferred_ops_ >= kDeferredWakeMax || !client_->endpoint.receive_pending()))
    wake_deferred();
  publish_stats();
}

void ClientSession::dispatch(Command& cmd) {
  const std::uint64_t rid = cmd.request_id;
  Status st = std::visit(
      [&](auto& c) -> Status {
        using T = std::decay_t<decltype(c)>;
        if constexpr (std::is_same_v<T, AttachStreamCmd>) return attach(c, rid);
        if constexpr (std::is_same_v<T, RegisterOpCmd>) return register_op(c);
        if constexpr (std::is_same_v<T, UploadCmd>) return upload(c, rid);
        if constexpr (std::is_same_v<T, ReadCmd>) return read(c, rid);
        if constexpr (std::is_same_v<T, SyncCmd>) return sync(c, rid);
        if constexpr (std::is_same_v<T, DropCmd>) return drop(c);
        if constexpr (std::is_same_v<T, ExportCmd>) return export_tensor(c, rid);
        if constexpr (std::is_same_v<T, ImportCmd>) return import_tensor(c, rid);
        if constexpr (std::is_same_v<T, CloseStreamCmd>) return close_stream(c, rid);
        if constexpr (std::is_same_v<T, StatusCmd>) return status(c, rid);
        if constexpr (std::is_same_v<T, UploadPartCmd>) return upload_part(c, rid);
        if constexpr (std::is_same_v<T, ReadPartCmd>) return read_part(c, rid);
        if constexpr (std::is_same_v<T, ReportFallbacksCmd>) return report_fallbacks(c);
        if constexpr (std::is_same_v<T, ControlCmd>) return control(c, rid);
        return make_error(ErrorCode::Internal, "unhandled command");
      },
      cmd.body);
  if (!st.ok()) {
    count_rejected(st.error().code);
    // A session on its way out (its answer not delivered, a stop) answers nothing more.
    if (stop_.load(std::memory_order_acquire)) return;
    Error e = st.error();
    e.message = std::string(command_kind_name(cmd.kind())) + ": " + e.message;
    (void)send(error_completion(rid, e));
  }
}

void ClientSession::note_deferred(StreamId s) {
  if (std::find(deferred_streams_.begin(), deferred_streams_.end(), s) == deferred_streams_.end())
    deferred_streams_.push_back(s);
  ++deferred_ops_;
}

void ClientSession::wake_deferred() {
  for (StreamId s : deferred_streams_) service_.device.wake_stream(s);
  deferred_streams_.clear();
  deferred_ops_ = 0;
}

Status ClientSession::send(const Completion& cpl) {
  out_.clear();
  KILN_RETURN_IF_ERROR(encode_completion(cpl, out_));
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + service_.options.completion_timeout;
  for (;;) {
    // In slices, so that a stop (or the timeout) ends the wait on a client that does not pop.
    Status st = client_->endpoint.send(out_, kSendSlice);
    if (st.ok()) return st;
    const bool ring_full = st.error().code == ErrorCode::ResourceExhausted;
    if (ring_full && !stop_.load(std::memory_order_acquire) && Clock::now() < deadline) continue;
    const bool stopping = stop_.load(std::memory_order_acquire);
    std::string why = !ring_full                                                      ? st.error().to_string()
                      : stopping && service_.stopping.load(std::memory_order_acquire) ? "the daemon is stopping"
                      : stopping
                          ? "the client went away"
                          : fmt::format("its completion ring stayed full for {} ms (daemon.completion_timeout_ms)",
                                        service_.options.completion_timeout.count());
    // A client that went, or a stop, is already logged; a stuck client is news.
    if (!stopping)
      spdlog::warn("kilnd: client {} (job {}, pid {}): completion not delivered: {}; disconnecting it", id(), job(),
                   client_->peer.pid, why);
    request_stop();
    return make_error(ErrorCode::ResourceExhausted, "completion not delivered: " + why);
  }
}

StreamId ClientSession::stream(std::uint64_t client_stream) {
  auto it = streams_.find(client_stream);
  if (it != streams_.end()) return it->second;
  std::uint64_t n;
  {
    MutexLock lock(service_.mu);
    n = service_.next_stream++;
  }
  const StreamId s = StreamId::from_number(n);
  service_.device.tag_stream(s, job_state_->tag);  // before the stream's first use
  streams_.emplace(client_stream, s);
  MutexLock lock(stats_mu_);
  stream_ids_.push_back(s);
  return s;
}

Result<TensorRecord*> ClientSession::lookup(std::uint64_t client_tensor, const char* what) {
  auto it = tensors_.find(client_tensor);
  if (it == tensors_.end())
    return make_error(ErrorCode::InvalidHandle,
                      fmt::format("{}: tensor {} is not one of this client's live tensors", what, client_tensor));
  return &it->second;
}

Status ClientSession::rehome(TensorRecord& rec, StreamId to) {
  KILN_RETURN_IF_ERROR(service_.device.barrier(rec.home));
  rec.home = to;
  return Status::Ok();
}

Status ClientSession::check_fresh(std::uint64_t client_tensor, const char* what) const {
  if (tensors_.count(client_tensor) != 0)
    return make_error(ErrorCode::Invalid,
                      fmt::format("{}: tensor id {} is already in use by this client", what, client_tensor));
  return Status::Ok();
}

Status ClientSession::charge(std::uint64_t bytes, const char* what) {
  return charge(bytes, [what] { return std::string(what); });
}

template <class What>
Status ClientSession::charge(std::uint64_t bytes, const What& what) {
  const std::uint64_t job_limit = AtomicLimits::get(service_.limits.job_memory_bytes);
  const std::uint64_t uid_limit = AtomicLimits::get(service_.limits.uid_memory_bytes);
  std::uint64_t seen = 0;
  if (!try_add(job_state_->usage.tensor_bytes, job_limit, bytes, seen))
    return make_error(ErrorCode::ResourceExhausted,
                      fmt::format("{}: job '{}' memory quota of {} exceeded ({} in use, {} more asked)", what(), job(),
                                  human_bytes(job_limit), human_bytes(seen), human_bytes(bytes)));
  // The uid's count always, quota or not: an operator may set one live (kilnctl limits set), and
  // it must then see what the uid holds already.
  if (!try_add(uid_state_->usage.tensor_bytes, uid_limit, bytes, seen)) {
    job_state_->usage.tensor_bytes.fetch_sub(bytes, std::memory_order_relaxed);
    return make_error(ErrorCode::ResourceExhausted,
                      fmt::format("{}: uid {} memory quota of {} exceeded ({} in use, {} more asked)", what(), uid(),
                                  human_bytes(uid_limit), human_bytes(seen), human_bytes(bytes)));
  }
  tensor_bytes_ += bytes;
  return Status::Ok();
}

void ClientSession::release(std::uint64_t bytes) {
  // Never more than this session holds: the job's and the uid's counts are sums of their
  // sessions' own.
  bytes = std::min(tensor_bytes_, bytes);
  job_state_->usage.tensor_bytes.fetch_sub(bytes, std::memory_order_relaxed);
  uid_state_->usage.tensor_bytes.fetch_sub(bytes, std::memory_order_relaxed);
  tensor_bytes_ -= bytes;
}

// The tensors leave this client's namespace (consumed, read for the last time, or dropped):
// their bytes are released and any export of them is withdrawn. The op path takes no lock here
// unless a forgotten tensor was exported.
void ClientSession::forget(std::span<const std::uint64_t> client_tensors) {
  std::uint64_t bytes = 0;
  boost::container::small_vector<std::uint64_t, 2> tokens;
  for (std::uint64_t t : client_tensors) {
    auto it = tensors_.find(t);
    if (it == tensors_.end()) continue;
    bytes += it->second.bytes;
    tensors_.erase(it);
    if (staged_read_ && !staged_read_->last_use && staged_read_->client_tensor == t) staged_read_.reset();
    if (exported_.empty()) continue;
    for (auto [e, end] = exported_.equal_range(t); e != end;) {
      tokens.push_back(e->second);
      e = exported_.erase(e);
    }
  }
  if (bytes != 0) release(bytes);
  if (tokens.empty()) return;
  MutexLock lock(service_.mu);
  for (std::uint64_t token : tokens) service_.exports.erase(token);
}

void ClientSession::forget(std::uint64_t client_tensor) { forget(std::span<const std::uint64_t>(&client_tensor, 1)); }

void ClientSession::refresh_queued_ops() {
  std::uint64_t queued = 0;
  for (const auto& [n, s] : streams_) {
    std::optional<runtime::StreamStats> st = service_.device.stream_stats(s);
    if (st) queued += st->pending_ops + (st->enqueued - std::min(st->enqueued, st->commands));
  }
  // The job's and the uid's counts are sums of their sessions' last recounts: swap this
  // session's share.
  job_state_->usage.queued_ops.fetch_add(queued - queued_ops_, std::memory_order_relaxed);  // modular
  uid_state_->usage.queued_ops.fetch_add(queued - queued_ops_, std::memory_order_relaxed);
  queued_ops_ = queued;
}

void ClientSession::count_rejected(ErrorCode code) {
  ++rejected_;
  auto& n = rejected_by_code_[std::min(static_cast<std::size_t>(code), kNumErrorCodes - 1)];
  n.store(n.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
}

ClientSession::Metrics ClientSession::metrics() const {
  Metrics m;
  {
    MutexLock lock(stats_mu_);
    m.status = stats_;
    m.streams = stream_ids_;
    m.closed_streams = closed_streams_;
  }
  for (std::size_t c = 0; c < kNumErrorCodes; ++c)
    m.rejected.by_code[c] = rejected_by_code_[c].load(std::memory_order_relaxed);
  for (std::size_t k = 0; k < kNumCommandKinds; ++k) m.requests[k] = request_latency_[k].snapshot();
  m.op_admission = op_admission_.snapshot();
  return m;
}

void ClientSession::retire_metrics() {
  const Metrics m = metrics();  // cleanup() moved every stream's counters into closed_streams
  JobRetired& job = job_state_->retired;
  job.ops_registered += m.status.ops_registered;
  job.streams.add(m.closed_streams);
  job.rejected.add(m.rejected);
  service_.retired_rejected.add(m.rejected);
  for (std::size_t k = 0; k < kNumCommandKinds; ++k) service_.retired_requests[k].add(m.requests[k]);
  service_.retired_op_admission.add(m.op_admission);
}

void ClientSession::publish_stats() {
  MutexLock lock(stats_mu_);
  stats_.streams = streams_.size();
  stats_.tensors = tensors_.size();
  stats_.tensor_bytes = tensor_bytes_;
  stats_.ops_registered = ops_registered_;
  stats_.queued_ops = queued_ops_;
  stats_.rejected = rejected_;
}

// ---- Handlers

Status ClientSession::attach(const AttachStreamCmd& c, std::uint64_t rid) {
  (void)stream(c.stream);
  return send(Completion{rid, OkCpl{}});
}

Status ClientSession::register_op(RegisterOpCmd& c) {
  ir::Operation& op = c.op;
  KILN_RETURN_IF_ERROR(op_check_.check(op));
  KILN_RETURN_IF_ERROR(check_queued_ops());
  // Inputs: this client's live tensors, with the shapes and dtypes on record. Inline storage:
  // this is the op path, and an op has a handful of inputs.
  const std::size_t ni = op.num_inputs;
  boost::container::small_vector<std::uint64_t, 4> consumed;
  boost::container::small_vector<TensorRecord*, 4> input_records;
  for (std::size_t i = 0; i < ni; ++i) {
    ir::TensorIr& t = op.tensors[i];
    KILN_ASSIGN_OR_RETURN(TensorRecord * rec, lookup(t.id.value(), "input"));
    input_records.push_back(rec);
    if (!(rec->dtype == t.dtype) || rec->shape != t.shape)
      return make_error(ErrorCode::Invalid,
                        fmt::format("{}: input {} is {} {} on record, the message says {} {}", op.kind_name(), i,
                                    ir::shape_to_string(rec->shape), rec->dtype.name(), ir::shape_to_string(t.shape),
                                    t.dtype.name()));
    if (t.status == ir::TensorStatus::ReadWrite) consumed.push_back(t.id.value());
  }
  for (std::size_t a = 0; a < consumed.size(); ++a)
    for (std::size_t b = a + 1; b < consumed.size(); ++b)
      if (consumed[a] == consumed[b])
        return make_error(ErrorCode::Invalid, fmt::format("{}: tensor {} consumed twice", op.kind_name(), consumed[a]));
  // Outputs: fresh ids; their bytes count against the job's memory quota.
  std::uint64_t out_bytes = 0;
  for (std::size_t o = ni; o < op.tensors.size(); ++o) {
    KILN_RETURN_IF_ERROR(check_fresh(op.tensors[o].id.value(), "output"));
    KILN_ASSIGN_OR_RETURN(std::uint64_t b, tensor_bytes(op.tensors[o].dtype, op.tensors[o].shape));
    out_bytes += b;
  }
  const StreamId s = stream(c.stream);
  // An input homed on another of this client's streams moves here first (rehome): its old home's
  // queued reads run before anything on this stream can free it.
  for (TensorRecord* rec : input_records)
    if (rec->home != s) KILN_RETURN_IF_ERROR(rehome(*rec, s));
  KILN_RETURN_IF_ERROR(charge(out_bytes, [&op] { return op.kind_name(); }));
  // Translate into device ids, then record outputs and forget consumed inputs.
  boost::container::small_vector<std::pair<std::uint64_t, TensorRecord>, 2> produced;
  for (std::size_t i = 0; i < op.tensors.size(); ++i) {
    ir::TensorIr& t = op.tensors[i];
    const std::uint64_t client_id = t.id.value();
    if (i < ni) {
      t.id = input_records[i]->global;  // the records stay put until forget() below
    } else {
      Result<std::uint64_t> bytes = tensor_bytes(t.dtype, t.shape);
      TensorRecord rec{fresh_id(), t.shape, t.dtype, s, bytes.ok() ? *bytes : 0};
      t.id = rec.global;
      produced.emplace_back(client_id, std::move(rec));
    }
  }
  // More messages waiting: register without waking the actor (serve() wakes it when the burst
  // ends). A burst followed by a sync or read then runs on this thread, in the wait's inline run
  // (StreamActor::try_run_inline takes any unscheduled backlog), with no pool thread woken; a
  // long burst still wakes the actor every kDeferredWakeMax ops.
  const bool across_daemons =
      op.info().has(ir::kDistributed) && op.kind != ir::OpKind::Distributed_SyncCollective && spans_daemons();
  const bool defer = !across_daemons && client_->endpoint.receive_pending();
  Status st = across_daemons ? collective_across_daemons(s, op)
              : defer        ? service_.device.register_op_deferred(s, std::move(op))
                             : service_.device.register_op(s, std::move(op));
  if (!st.ok()) {
    release(out_bytes);
    return st;
  }
  if (defer) note_deferred(s);
  forget(std::span<const std::uint64_t>(consumed.data(), consumed.size()));
  for (auto& [client_id, rec] : produced) tensors_.emplace(client_id, std::move(rec));
  ++ops_registered_;
  return Status::Ok();
}

// The device ids a collective names are the ranks of the job's world (DeviceId::index; the type
// is not looked at: every daemon of a job has the same kind of device): every rank once, or none
// (the whole world). A subset would be a subgroup, which kiln does not form. `first` is the
// first id's attribute (after the op's own: reduce op, root or dim).
Status check_collective_ranks(const ir::Operation& op, std::size_t first, std::uint32_t world) {
  const std::size_t named = op.attrs.size() - first;
  if (named == 0) return Status::Ok();
  std::vector<bool> seen(world, false);
  for (std::size_t i = first; i < op.attrs.size(); ++i) {
    const std::uint64_t rank = static_cast<std::uint64_t>(op.attrs[i]) & 0xffff;
    if (rank >= world || seen[rank])
      return make_error(ErrorCode::Unsupported,
                        fmt::format("{}: device {} is not a rank of the job's world of {}, or is named twice "
                                    "(device_ids index the ranks; name every rank once, or none)",
                                    op.kind_name(), rank, world));
    seen[rank] = true;
  }
  if (named != world)
    return make_error(ErrorCode::Unsupported,
                      fmt::format("{}: {} of the job's {} ranks named; a collective spans the whole world "
                                  "(subgroups are not formed)",
                                  op.kind_name(), named, world));
  return Status::Ok();
}

// Collectives block this session thread, never the device's pool (a collective waits for its
// peers). The stream first runs the op's single-device form (the identity, in the stream's order
// and plans like any op); once the stream has run it, the exchange with the other daemons runs
// on its result. A failure leaves the output errored, reported at the client's next sync or read
// like any failed op; an input that failed makes this rank leave the collective, so that its
// peers fail at once rather than at the timeout.
Status ClientSession::collective_across_daemons(StreamId s, const ir::Operation& op) {
  distributed::CollectiveGroup& group = *service_.options.collectives;
  const ir::DType dtype = op.tensors[1].dtype;
  if (dtype.is_quantized())
    return make_error(ErrorCode::Unsupported,
                      fmt::format("{} across daemons does not take quantized tensors", op.kind_name()));
  switch (op.kind) {
    case ir::OpKind::Distributed_AllReduce: {
      KILN_RETURN_IF_ERROR(distributed::CollectiveGroup::check_dtype(dtype));
      KILN_RETURN_IF_ERROR(check_collective_ranks(op, 1, group.config().world_size));
      const auto reduce_op = static_cast<ir::ReduceOperation>(op.attrs[0]);
      return in_place_across_daemons(
          s, op, [&](std::span<std::byte> bytes) { return group.all_reduce(dtype, bytes, reduce_op); });
    }
    case ir::OpKind::Distributed_Broadcast: {
      KILN_RETURN_IF_ERROR(check_collective_ranks(op, 1, group.config().world_size));
      const auto root = static_cast<std::uint32_t>(op.attrs[0]);
      return in_place_across_daemons(s, op, [&](std::span<std::byte> bytes) { return group.broadcast(bytes, root); });
    }
    case ir::OpKind::Distributed_AllGather:
      KILN_RETURN_IF_ERROR(check_collective_ranks(op, 1, group.config().world_size));
      return reshaped_across_daemons(s, op);
    case ir::OpKind::Distributed_ReduceScatter:
      KILN_RETURN_IF_ERROR(distributed::CollectiveGroup::check_dtype(dtype));
      KILN_RETURN_IF_ERROR(check_collective_ranks(op, 2, group.config().world_size));
      return reshaped_across_daemons(s, op);
    default: return make_error(ErrorCode::Invalid, fmt::format("{} is not a collective", op.kind_name()));
  }
}

Status ClientSession::in_place_across_daemons(StreamId s, const ir::Operation& op,
                                              FunctionRef<Status(std::span<std::byte>)> across) {
  const ir::TensorIr out = op.tensors[1];
  KILN_ASSIGN_OR_RETURN(ir::Operation local,
                        ir::build::all_reduce(op.tensors[0], ir::ReduceOperation::Sum, {}, out.id));
  Status queued = service_.device.register_op(s, std::move(local));
  if (queued.ok()) {
    wake_deferred();  // this client's other streams go on while the collective waits
    queued = service_.device.barrier(s);
  }
  if (!queued.ok()) return leave_collective(op, queued.error());
  bool reached = false;
  const Status done = service_.device.update_in_place(out, [&](std::span<std::byte> bytes) {
    reached = true;
    return across(bytes);
  });
  if (done.ok()) return Status::Ok();
  if (!reached) {
    (void)leave_collective(op, done.error());
    if (service_.device.error_of(out.id)) return Status::Ok();  // the output carries its input's error
  }
  // The output holds this rank's value alone: it becomes the error.
  ir::TensorIr release = out;
  release.status = ir::TensorStatus::ReadWrite;
  service_.device.backend().free(release);
  return fail_collective(out, op, done.error());
}

Status ClientSession::reshaped_across_daemons(StreamId s, const ir::Operation& op) {
  distributed::CollectiveGroup& group = *service_.options.collectives;
  const distributed::DistributedConfig& config = group.config();
  const ir::TensorIr& in = op.tensors[0];
  const ir::TensorIr out = op.tensors[1];
  const bool scatter = op.kind == ir::OpKind::Distributed_ReduceScatter;
  const std::size_t dim = static_cast<std::size_t>(op.attrs[scatter ? 1 : 0]);
  // The host copies (this rank's input; the gathered tensors and the output, or the reduced
  // tensor and the part) count against the daemon's staging memory, as a chunked transfer's do.
  KILN_ASSIGN_OR_RETURN(const std::uint64_t in_bytes, tensor_bytes(in.dtype, in.shape));
  const std::uint64_t world = config.world_size;
  const std::uint64_t host_bytes = scatter ? 2 * in_bytes : in_bytes + 2 * in_bytes * world;
  Result<StagingReservation> staging =
      reserve_staging(host_bytes, fmt::format("{} of {}", op.kind_name(), in.to_string()));
  if (!staging.ok()) return leave_collective(op, staging.error());
  // This rank's input, as the stream computes it, into a tensor of its own read (and released) here.
  const ir::TensorId mine_id = service_.device.new_tensor_id();
  KILN_ASSIGN_OR_RETURN(ir::Operation local, ir::build::all_reduce(in, ir::ReduceOperation::Sum, {}, mine_id));
  Status queued = service_.device.register_op(s, std::move(local));
  if (queued.ok()) {
    wake_deferred();
    queued = service_.device.barrier(s);
  }
  if (!queued.ok()) return leave_collective(op, queued.error());
  const ir::TensorIr mine_ir{mine_id, in.shape, ir::TensorStatus::ReadWrite, in.dtype};
  if (std::optional<ir::TensorError> failed = service_.device.error_of(mine_id)) {
    (void)leave_collective(op, Error{ErrorCode::Execution, failed->to_string()});
    service_.device.backend().free(mine_ir);
    return service_.device.claim_error(out.id, *failed);  // the output carries its input's error
  }
  Result<runtime::HostData> mine = service_.device.read(s, mine_ir);
  if (!mine.ok()) {
    (void)leave_collective(op, mine.error());
    return fail_collective(out, op, mine.error());
  }
  std::vector<std::byte> result;
  Status done = Status::Ok();
  try {
    const std::size_t esize = in.dtype.size_bytes();
    if (scatter) {
      done = group.all_reduce(in.dtype, mine->bytes, static_cast<ir::ReduceOperation>(op.attrs[0]));
      if (done.ok())
        result = distributed::part_along(mine->bytes, in.shape, esize, dim, config.world_size, config.rank);
    } else {
      std::vector<std::byte> ranks(mine->bytes.size() * world);
      done = group.all_gather(mine->bytes, ranks);
      if (done.ok()) result = distributed::concat_along(ranks, in.shape, esize, dim, config.world_size);
    }
  } catch (const std::bad_alloc&) {
    // Out of host memory before or after the exchange: this rank leaves (its peers fail at once).
    done = leave_collective(op, Error{ErrorCode::ResourceExhausted, "out of host memory"});
  }
  if (done.ok()) done = service_.device.upload(s, out.id, out.dtype, out.shape, result);
  if (!done.ok()) return fail_collective(out, op, done.error());
  return Status::Ok();
}

Status ClientSession::leave_collective(const ir::Operation& op, const Error& why) {
  distributed::CollectiveGroup& group = *service_.options.collectives;
  group.abandon(fmt::format("rank {} left {}: {}", group.config().rank, op.kind_name(), why.message));
  return Status(why);
}

Status ClientSession::fail_collective(const ir::TensorIr& out, const ir::Operation& op, const Error& error) {
  spdlog::warn("kilnd: client {} (job {}): {} across daemons failed: {}", id(), job(), op.kind_name(), error.message);
  return service_.device.claim_error(
      out.id, ir::TensorError::make_root(ErrorCode::Execution,
                                         fmt::format("{} across daemons: {}", op.kind_name(), error.message)));
}

Status ClientSession::upload(const UploadCmd& c, std::uint64_t rid) {
  KILN_RETURN_IF_ERROR(check_fresh(c.tensor.value(), "upload"));
  KILN_ASSIGN_OR_RETURN(std::uint64_t bytes, tensor_bytes(c.dtype, c.shape));
  if (bytes != c.data.length)
    return make_error(ErrorCode::Invalid,
                      fmt::format("the data range holds {} bytes, the tensor needs {}", c.data.length, bytes));
  // Straight from shared memory into the new tensor: the backend copies the bytes once and
  // decides nothing on their values (DeviceBackend::upload), so a client rewriting its range
  // meanwhile can only tear its own tensor's values. (A private copy first cost a zeroed
  // buffer and a second copy per upload.)
  KILN_ASSIGN_OR_RETURN(std::span<std::uint8_t> shared, client_->endpoint.arena().slice(c.data));
  KILN_RETURN_IF_ERROR(charge(bytes, "upload"));
  const ir::TensorId global = fresh_id();
  const StreamId home = stream(c.stream);
  Status st = service_.device.upload(home, global, c.dtype, c.shape, std::as_bytes(shared.first(bytes)));
  if (!st.ok()) {
    release(bytes);
    return st;
  }
  tensors_.emplace(c.tensor.value(), TensorRecord{global, c.shape, c.dtype, home, bytes});
  return send(Completion{rid, OkCpl{}});
}

Status ClientSession::read(const ReadCmd& c, std::uint64_t rid) {
  KILN_ASSIGN_OR_RETURN(TensorRecord * rec, lookup(c.tensor.id.value(), "read"));
  if (!(rec->dtype == c.tensor.dtype) || rec->shape != c.tensor.shape)
    return make_error(ErrorCode::Invalid,
                      fmt::format("tensor {} is {} {} on record, the message says {} {}", c.tensor.id.value(),
                                  ir::shape_to_string(rec->shape), rec->dtype.name(),
                                  ir::shape_to_string(c.tensor.shape), c.tensor.dtype.name()));
  if (rec->bytes > c.dest.length)
    return make_error(ErrorCode::Invalid,
                      fmt::format("the destination holds {} bytes, the tensor has {}", c.dest.length, rec->bytes));
  const bool last_use = c.tensor.status == ir::TensorStatus::ReadWrite;
  const ir::TensorIr t{rec->global, rec->shape, last_use ? ir::TensorStatus::ReadWrite : ir::TensorStatus::ReadOnly,
                       rec->dtype};
  Result<runtime::HostData> data = service_.device.read(rec->home, t);
  if (last_use) forget(c.tensor.id.value());  // consumed by the read, whatever its outcome
  if (!data.ok()) return data.error();
  const std::vector<std::byte>& bytes = data->bytes;
  KILN_RETURN_IF_ERROR(client_->endpoint.arena().write(
      c.dest, std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size())));
  return send(Completion{rid, ReadDoneCpl{data->dtype, data->shape, ArenaRange{c.dest.offset, bytes.size()}}});
}

Status ClientSession::check_queued_ops() {
  // Recounted every few ops (a stream stats read per stream), and before any refusal: this
  // session's share may be stale (its ops ran since), and so may an idle session's (recounted by
  // run() while it waits).
  const std::uint64_t job_limit = AtomicLimits::get(service_.limits.job_queued_ops);
  const std::uint64_t uid_limit = AtomicLimits::get(service_.limits.uid_queued_ops);
  if (job_limit == 0 && uid_limit == 0) return Status::Ok();
  if (ops_registered_ % kQueuedOpsRefresh == 0) refresh_queued_ops();
  auto over = [&] {
    return (job_limit != 0 && job_state_->usage.queued_ops.load(std::memory_order_relaxed) >= job_limit) ||
           (uid_limit != 0 && uid_state_->usage.queued_ops.load(std::memory_order_relaxed) >= uid_limit);
  };
  if (!over()) return Status::Ok();
  refresh_queued_ops();
  if (const std::uint64_t queued = job_state_->usage.queued_ops.load(std::memory_order_relaxed);
      job_limit != 0 && queued >= job_limit)
    return make_error(ErrorCode::ResourceExhausted,
                      fmt::format("job '{}' has {} queued operations, its quota is {}: sync before queuing more", job(),
                                  queued, job_limit));
  if (const std::uint64_t queued = uid_state_->usage.queued_ops.load(std::memory_order_relaxed);
      uid_limit != 0 && queued >= uid_limit)
    return make_error(ErrorCode::ResourceExhausted,
                      fmt::format("uid {} has {} queued operations, its quota is {}: sync before queuing more", uid(),
                                  queued, uid_limit));
  return Status::Ok();
}

Status ClientSession::sync(const SyncCmd& c, std::uint64_t rid) {
  const StreamId device_stream = stream(c.stream);
  if (Status st = service_.device.drain(device_stream); !st.ok()) {
    // The device names its own stream; the client knows the stream by its own number.
    Error e = st.error();
    const std::string internal = fmt::format("stream {}: ", device_stream.value());
    if (e.message.rfind(internal, 0) == 0) e.message.replace(0, internal.size(), fmt::format("stream {}: ", c.stream));
    return e;
  }
  if (AtomicLimits::get(service_.limits.job_queued_ops) != 0 || AtomicLimits::get(service_.limits.uid_queued_ops) != 0)
    refresh_queued_ops();
  return send(Completion{rid, OkCpl{}});
}

Status ClientSession::drop(const DropCmd& c) {
  KILN_ASSIGN_OR_RETURN(TensorRecord * rec, lookup(c.tensor.id.value(), "drop"));
  const ir::TensorIr t{rec->global, rec->shape, ir::TensorStatus::ReadWrite, rec->dtype};
  // Like a registration: a drop followed by more messages leaves the actor asleep (a worker's
  // drops come in bursts, after the read that ended its step).
  const bool defer = client_->endpoint.receive_pending();
  const StreamId home = rec->home;
  Status st = defer ? service_.device.drop_deferred(home, t) : service_.device.drop(home, t);
  if (st.ok() && defer) note_deferred(home);
  forget(c.tensor.id.value());
  return st;
}

Status ClientSession::export_tensor(const ExportCmd& c, std::uint64_t rid) {
  KILN_ASSIGN_OR_RETURN(TensorRecord * rec, lookup(c.tensor.value(), "export"));
  ExportToken token;
  for (;;) {
    KILN_ASSIGN_OR_RETURN(token, new_export_token());
    MutexLock lock(service_.mu);
    if (service_.exports.count(token.index()) != 0) continue;  // 2^-64 per live export: draw again
    service_.exports.emplace(token.index(), ExportRecord{token, job(), id(), c.tensor.value(), *rec});
    break;
  }
  exported_.emplace(c.tensor.value(), token.index());
  return send(Completion{rid, ExportedCpl{token}});
}

Status ClientSession::import_tensor(const ImportCmd& c, std::uint64_t rid) {
  KILN_RETURN_IF_ERROR(check_fresh(c.tensor.value(), "import"));
  std::optional<ExportRecord> src;
  {
    MutexLock lock(service_.mu);
    auto it = service_.exports.find(c.token.index());
    // One message for every case: a token of another job must not be told apart from a wrong one.
    if (it == service_.exports.end() || !token_equal(it->second.token, c.token) || it->second.job != job())
      return make_error(ErrorCode::InvalidHandle, "no tensor exported under this token for job '" + job() + "'");
    src = it->second;
  }
  KILN_RETURN_IF_ERROR(charge(src->tensor.bytes, "import"));
  const ir::TensorId global = fresh_id();
  const StreamId home = stream(c.stream);
  Status st = service_.device.share(src->tensor.home, src->tensor.global, home, global);
  if (!st.ok()) {
    release(src->tensor.bytes);
    return st;
  }
  tensors_.emplace(c.tensor.value(),
                   TensorRecord{global, src->tensor.shape, src->tensor.dtype, home, src->tensor.bytes});
  return send(Completion{rid, OkCpl{}});
}

Status ClientSession::close_stream(const CloseStreamCmd& c, std::uint64_t rid) {
  auto it = streams_.find(c.stream);
  if (it == streams_.end()) return send(Completion{rid, OkCpl{}});
  for (const auto& [n, rec] : tensors_)
    if (rec.home == it->second)
      return make_error(ErrorCode::Invalid,
                        fmt::format("stream {} is still the home of tensor {}: drop it first", c.stream, n));
  const std::optional<runtime::StreamStats> last = service_.device.stream_stats(it->second);
  KILN_RETURN_IF_ERROR(service_.device.close_stream(it->second));
  {
    MutexLock lock(stats_mu_);
    if (last) closed_streams_.add(StreamCounters::of(*last));
    std::erase(stream_ids_, it->second);
  }
  streams_.erase(it);
  return send(Completion{rid, OkCpl{}});
}

Status ClientSession::status(const StatusCmd& c, std::uint64_t rid) {
  publish_stats();
  const DaemonStatus st = service_.status(uid());
  return send(Completion{rid, StatusTextCpl{c.json ? st.to_json() : st.to_text()}});
}

// ---- Live control (kilnctl)

Status ClientSession::control(const ControlCmd& c, std::uint64_t rid) {
  // The operator's: the daemon's uid and root. Checked on the peer credentials the kernel gave
  // at connect time (SO_PEERCRED), never on anything the client says.
  if (uid() != 0 && uid() != ::geteuid())
    return make_error(ErrorCode::Invalid,
                      fmt::format("kilnctl {} is for the daemon's user (uid {}) and root only; this client is uid {}",
                                  control_verb_name(c.verb), ::geteuid(), uid()));
  KILN_ASSIGN_OR_RETURN(std::string text, control_answer(c));
  return send(Completion{rid, StatusTextCpl{std::move(text)}});
}

namespace {

std::string jobs_answer(const DaemonStatus& st, bool json) {
  if (json) {
    std::string out = "[";
    for (std::size_t i = 0; i < st.jobs.size(); ++i) {
      const JobStatus& j = st.jobs[i];
      out += fmt::format("{}{{\"name\":\"{}\",\"owner_uid\":{},\"clients\":{},\"tensor_bytes\":{},\"queued_ops\":{}}}",
                         i ? "," : "", json_escape(j.name), j.owner_uid, j.clients, j.tensor_bytes, j.queued_ops);
    }
    return out + "]";
  }
  std::string out =
      fmt::format("{:<24} {:>9} {:>7} {:>12} {:>10}\n", "JOB", "OWNER UID", "CLIENTS", "MEMORY", "QUEUED OPS");
  for (const JobStatus& j : st.jobs)
    out += fmt::format("{:<24} {:>9} {:>7} {:>12} {:>10}\n", j.name, j.owner_uid, j.clients,
                       human_bytes(j.tensor_bytes), j.queued_ops);
  return out;
}

std::string clients_answer(const DaemonStatus& st, bool json) {
  if (json) {
    std::string out = "[";
    for (std::size_t i = 0; i < st.clients.size(); ++i) {
      const ClientStatus& c = st.clients[i];
      out += fmt::format(
          "{}{{\"id\":{},\"job\":\"{}\",\"pid\":{},\"uid\":{},\"streams\":{},\"tensors\":{},\"tensor_bytes\":{},"
          "\"ops\":{},\"queued_ops\":{},\"rejected\":{}}}",
          i ? "," : "", c.client_id, json_escape(c.job), c.pid, c.uid, c.streams, c.tensors, c.tensor_bytes,
          c.ops_registered, c.queued_ops, c.rejected);
    }
    return out + "]";
  }
  std::string out = fmt::format("{:>6} {:<24} {:>8} {:>6} {:>7} {:>7} {:>12} {:>10} {:>7} {:>8}\n", "CLIENT", "JOB",
                                "PID", "UID", "STREAMS", "TENSORS", "MEMORY", "OPS", "QUEUED", "REJECTED");
  for (const ClientStatus& c : st.clients)
    out += fmt::format("{:>6} {:<24} {:>8} {:>6} {:>7} {:>7} {:>12} {:>10} {:>7} {:>8}\n", c.client_id, c.job, c.pid,
                       c.uid, c.streams, c.tensors, human_bytes(c.tensor_bytes), c.ops_registered, c.queued_ops,
                       c.rejected);
  return out;
}

Result<std::uint64_t> parse_client_id(std::string_view text) {
  std::uint64_t id = 0;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), id);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size())
    return make_error(ErrorCode::Invalid, fmt::format("disconnect: '{}' is not a client id (kilnctl clients)", text));
  return id;
}

}  // namespace

Result<std::string> ClientSession::control_answer(const ControlCmd& c) {
  DaemonService::Impl& s = service_;
  switch (c.verb) {
    case ControlVerb::Jobs: return jobs_answer(s.status(std::nullopt), c.json);
    case ControlVerb::Clients: publish_stats(); return clients_answer(s.status(std::nullopt), c.json);
    case ControlVerb::Limits: {
      LiveLimits l = s.limits.load();
      if (!c.args.empty()) {
        KILN_RETURN_IF_ERROR(apply_limit_assignments(c.args, l));
        s.set_limits(l);
        spdlog::info("kilnd: limits set by uid {} (kilnctl, client {}): {}", uid(), id(), c.args);
      }
      return c.json ? limits_to_json(l) : limits_to_text(l);
    }
    case ControlVerb::Disconnect: {
      KILN_ASSIGN_OR_RETURN(const std::uint64_t target, parse_client_id(c.args));
      if (target == id()) return make_error(ErrorCode::Invalid, "disconnect: that is this kilnctl's own connection");
      return s.disconnect(target, std::chrono::milliseconds(30'000));
    }
    case ControlVerb::Drain: {
      if (c.args == "start") {
        if (!s.draining.exchange(true))
          spdlog::info("kilnd: draining (kilnctl, uid {}): new clients are refused", uid());
      } else if (c.args == "resume") {
        if (s.draining.exchange(false))
          spdlog::info("kilnd: drain ended (kilnctl, uid {}): clients are accepted", uid());
      } else if (c.args != "status") {
        return make_error(ErrorCode::Invalid, fmt::format("drain: '{}': expected start, status or resume", c.args));
      }
      const bool draining = s.draining.load();
      const std::uint64_t left = s.clients_left();
      return c.json ? fmt::format("{{\"draining\":{},\"clients\":{}}}", draining, left)
                    : fmt::format("{}; {} client(s) connected besides kilnctl\n",
                                  draining ? "draining: new clients are refused" : "accepting clients", left);
    }
    case ControlVerb::Reload:
    case ControlVerb::Stop: {
      ControlHooks hooks;
      {
        MutexLock lock(s.mu);
        hooks = s.hooks;
      }
      if (c.verb == ControlVerb::Reload) {
        if (!hooks.reload)
          return make_error(ErrorCode::Unsupported, "reload: this daemon has no configuration file to re-read");
        return hooks.reload();
      }
      if (!hooks.stop) return make_error(ErrorCode::Unsupported, "stop: this daemon is stopped by its owner only");
      spdlog::info("kilnd: stop asked by uid {} (kilnctl, client {})", uid(), id());
      hooks.stop();
      return std::string("stopping: every client's streams are drained, the plans saved\n");
    }
    case ControlVerb::Metrics: return s.metrics().to_prometheus();
    case ControlVerb::Plans: return plans_answer(c);
  }
  return make_error(ErrorCode::Internal, "unhandled control verb");
}

// kilnctl plans: "list ...", "show ID FORMAT", "clear [JOB]".
Result<std::string> ClientSession::plans_answer(const ControlCmd& c) {
  DaemonService::Impl& s = service_;
  fusion::ExecutionPlanStore& store = s.device.plan_store();
  const std::vector<std::string_view> words = split_words(c.args);
  const std::string_view sub = words.empty() ? std::string_view() : words.front();
  const auto rest =
      words.empty() ? std::span<const std::string_view>() : std::span<const std::string_view>(words).subspan(1);
  if (sub == "list" || sub.empty()) {
    KILN_ASSIGN_OR_RETURN(const PlanListOptions options, parse_plan_list(rest, c.json));
    std::map<std::uint32_t, std::string> names;
    {
      MutexLock lock(s.mu);
      names = s.job_tags;
    }
    return list_plans(store, options, [&names](std::uint32_t tag) {
      if (tag == 0) return std::string("-");  // loaded from the plan cache, or an untagged stream
      auto it = names.find(tag);
      return it != names.end() ? it->second : fmt::format("job#{}", tag);
    });
  }
  if (sub == "show")
    return show_plan(store, rest.empty() ? std::string_view() : rest[0],
                     rest.size() > 1 ? rest[1] : std::string_view("text"));
  if (sub == "clear") {
    const std::string_view job = rest.empty() ? std::string_view() : rest[0];  // job names hold no spaces
    std::optional<std::uint32_t> tag;
    if (!job.empty()) {
      MutexLock lock(s.mu);
      for (const auto& [t, name] : s.job_tags)
        if (name == job) tag = t;  // the latest job of that name
      if (!tag)
        return make_error(ErrorCode::InvalidHandle,
                          fmt::format("plans clear: no job '{}' is known to this daemon", job));
    }
    const std::size_t before = store.size();
    const std::size_t retired = store.retire(tag);
    spdlog::info("kilnd: {} plan(s) retired by uid {} (kilnctl plans clear{}{})", retired, uid(),
                 job.empty() ? "" : " ", job);
    return fmt::format("retired {} of {} plans{}; plans held by running streams finish their runs\n", retired, before,
                       job.empty() ? std::string() : fmt::format(" (created by job {})", job));
  }
  return make_error(ErrorCode::Invalid, fmt::format("plans: '{}': expected list, show or clear", sub));
}

// One-way, as register_op: the decoder checked the whole snapshot (bounds, names), so storing it
// cannot fail. What the status shows is chosen here, once per report, not at every status.
Status ClientSession::report_fallbacks(ReportFallbacksCmd& c) {
  std::vector<FallbackCount>& counts = c.counts;
  std::sort(counts.begin(), counts.end(), [](const FallbackCount& a, const FallbackCount& b) {
    return a.calls != b.calls ? a.calls > b.calls : a.name < b.name;
  });
  const std::size_t omitted = counts.size() > kStatusFallbacks ? counts.size() - kStatusFallbacks : 0;
  counts.resize(counts.size() - omitted);
  MutexLock lock(stats_mu_);
  stats_.fallbacks = std::move(counts);
  stats_.fallbacks_omitted = omitted;
  return Status::Ok();
}

// ---- Chunked transfers (protocol.h, "Chunked transfers")

Result<StagingReservation> ClientSession::reserve_staging(std::uint64_t bytes, const std::string& what) {
  const std::uint64_t limit = AtomicLimits::get(service_.limits.staging_bytes);
  std::uint64_t seen = 0;
  if (!try_add(service_.staged_bytes, limit, bytes, seen))
    return make_error(ErrorCode::ResourceExhausted,
                      fmt::format("{}: the daemon's staging memory of {} cannot take {} more ({} in use by chunked "
                                  "transfers; daemon.staging_mib)",
                                  what, human_bytes(limit), human_bytes(bytes), human_bytes(seen)));
  return StagingReservation(service_.staged_bytes, bytes);
}

void ClientSession::discard_staged_upload(std::uint64_t client_tensor) {
  auto it = staged_uploads_.find(client_tensor);
  if (it == staged_uploads_.end()) return;
  release(it->second.total);
  staged_uploads_.erase(it);
}

Status ClientSession::upload_part(const UploadPartCmd& c, std::uint64_t rid) {
  const std::uint64_t id = c.tensor.value();
  KILN_ASSIGN_OR_RETURN(const std::uint64_t total, tensor_bytes(c.dtype, c.shape));
  // The decoder checked these bounds; the staging copy below relies on them, so check again.
  if (c.data.length == 0 || c.offset >= total || c.data.length > total - c.offset)
    return make_error(ErrorCode::Invalid, fmt::format("data: part [{}, +{}) is not inside the tensor's {} bytes",
                                                      c.offset, c.data.length, total));
  auto it = staged_uploads_.find(id);
  if (it == staged_uploads_.end()) {
    if (c.offset != 0)
      return make_error(ErrorCode::Invalid,
                        fmt::format("offset: {}, but no upload of tensor {} is in progress (its first "
                                    "part has offset 0)",
                                    c.offset, id));
    KILN_RETURN_IF_ERROR(check_fresh(id, "tensor_id"));
    // One chunked upload at a time per connection (the client library serialises them): an
    // unfinished one was abandoned (its client gave up), and goes with its charge.
    while (!staged_uploads_.empty()) discard_staged_upload(staged_uploads_.begin()->first);
    if (total > staging_limit())
      return make_error(
          ErrorCode::ResourceExhausted,
          fmt::format("shape: tensor {} of {} exceeds the largest chunked upload this machine can stage, {}", id,
                      human_bytes(total), human_bytes(staging_limit())));
    // The daemon's staging memory first (host memory no device limit counts), then the quotas.
    KILN_ASSIGN_OR_RETURN(StagingReservation staging, reserve_staging(total, fmt::format("staging tensor {}", id)));
    // The whole tensor is charged before anything is allocated: staged bytes count like live ones.
    KILN_RETURN_IF_ERROR(charge(total, [&] { return fmt::format("staging tensor {}", id); }));
    // Default-initialised: pages are touched only as parts arrive.
    std::unique_ptr<std::byte[]> buf(new (std::nothrow) std::byte[total]);
    if (!buf) {
      release(total);
      return make_error(ErrorCode::ResourceExhausted,
                        fmt::format("cannot allocate {} to stage tensor {}", human_bytes(total), id));
    }
    it = staged_uploads_
             .emplace(id, StagedUpload{c.stream, c.dtype, c.shape, total, 0, std::move(buf), std::move(staging)})
             .first;
  } else if (!(it->second.dtype == c.dtype) || it->second.shape != c.shape) {
    const std::string msg = fmt::format(
        "shape: tensor {} is being uploaded as {}{}, this part says {}{}; upload discarded", id,
        it->second.dtype.name(), ir::shape_to_string(it->second.shape), c.dtype.name(), ir::shape_to_string(c.shape));
    discard_staged_upload(id);
    return make_error(ErrorCode::Invalid, msg);
  } else if (it->second.stream != c.stream) {
    const std::string msg = fmt::format(
        "stream: tensor {} is being uploaded onto stream {}, this part says {}; upload "
        "discarded",
        id, it->second.stream, c.stream);
    discard_staged_upload(id);
    return make_error(ErrorCode::Invalid, msg);
  } else if (c.offset != it->second.received) {
    const std::string msg = fmt::format(
        "offset: {}, expected {} (the bytes received so far: parts arrive in order); upload "
        "of tensor {} discarded",
        c.offset, it->second.received, id);
    discard_staged_upload(id);
    return make_error(ErrorCode::Invalid, msg);
  }
  StagedUpload& staged = it->second;
  // Straight from shared memory into the private staging buffer: nothing reads the arena twice.
  Status copied = client_->endpoint.arena().read(
      c.data, std::span<std::uint8_t>(reinterpret_cast<std::uint8_t*>(staged.data.get()) + c.offset, c.data.length));
  if (!copied.ok()) {
    discard_staged_upload(id);
    return copied;
  }
  staged.received += c.data.length;
  if (staged.received < staged.total) return send(Completion{rid, OkCpl{}});
  // The last byte is in: the staging becomes the tensor, and its charge the tensor's.
  StagedUpload done = std::move(staged);
  staged_uploads_.erase(it);
  if (Status fresh = check_fresh(id, "tensor_id"); !fresh.ok()) {  // uploaded or imported meanwhile
    release(done.total);
    return fresh;
  }
  const ir::TensorId global = fresh_id();
  const StreamId home = stream(done.stream);
  Status st = service_.device.upload(home, global, done.dtype, done.shape,
                                     std::span<const std::byte>(done.data.get(), done.total));
  if (!st.ok()) {
    release(done.total);
    return st;
  }
  tensors_.emplace(id, TensorRecord{global, done.shape, done.dtype, home, done.total});
  return send(Completion{rid, OkCpl{}});
}

Status ClientSession::read_part(const ReadPartCmd& c, std::uint64_t rid) {
  const std::uint64_t id = c.tensor.id.value();
  const bool last_use = c.tensor.status == ir::TensorStatus::ReadWrite;
  if (c.offset == 0) {
    reset_staged_read();  // a new chunked read replaces an abandoned one
    KILN_ASSIGN_OR_RETURN(TensorRecord * found, lookup(id, "tensor.id"));
    const TensorRecord rec = *found;  // a copy: forget() below erases the entry
    if (!(rec.dtype == c.tensor.dtype) || rec.shape != c.tensor.shape)
      return make_error(ErrorCode::Invalid, fmt::format("tensor {} is {} {} on record, the message says {} {}", id,
                                                        ir::shape_to_string(rec.shape), rec.dtype.name(),
                                                        ir::shape_to_string(c.tensor.shape), c.tensor.dtype.name()));
    // One device read for the whole transfer, into staging memory reserved first. A last use
    // consumes the tensor here, whatever the outcome (as a one-piece read does): the snapshot
    // holds its bytes and takes over its quota charge, so a client that abandons the transfer
    // leaves nothing live behind it.
    Result<StagingReservation> staging = reserve_staging(rec.bytes, fmt::format("the read snapshot of tensor {}", id));
    Result<runtime::HostData> data =
        staging.ok()
            ? service_.device.read(rec.home, ir::TensorIr{rec.global, rec.shape, ir::TensorStatus::ReadOnly, rec.dtype})
            : Result<runtime::HostData>(staging.error());
    if (last_use) {
      Status dropped =
          service_.device.drop(rec.home, ir::TensorIr{rec.global, rec.shape, ir::TensorStatus::ReadWrite, rec.dtype});
      forget(id);
      if (data.ok() && !dropped.ok()) return dropped;
    }
    if (!data.ok()) return data.error();
    if (data->bytes.size() != rec.bytes)
      return make_error(ErrorCode::Internal, fmt::format("the device returned {} bytes for tensor {} of {}",
                                                         data->bytes.size(), id, rec.bytes));
    std::uint64_t charged = 0;
    if (last_use) {
      KILN_RETURN_IF_ERROR(charge(rec.bytes, [&] { return fmt::format("the read snapshot of tensor {}", id); }));
      charged = rec.bytes;
    }
    // A read-only snapshot is not charged: it goes with its tensor (forget() drops it), so the
    // job pays for those bytes once.
    staged_read_ = StagedRead{id, last_use, 0, charged, std::move(data).value(), std::move(staging).value()};
  } else if (!staged_read_ || staged_read_->client_tensor != id) {
    return make_error(ErrorCode::Invalid,
                      fmt::format("offset: {}, but no read of tensor {} is in progress (its first window has offset 0)",
                                  c.offset, id));
  }
  Result<ReadPartDoneCpl> window = read_window(c);
  // The transfer ends at its final window, or at one that fails.
  if (!window.ok() || staged_read_->sent == staged_read_->data.bytes.size()) reset_staged_read();
  if (!window.ok()) return window.error();
  return send(Completion{rid, std::move(window).value()});
}

Result<ReadPartDoneCpl> ClientSession::read_window(const ReadPartCmd& c) {
  const std::uint64_t id = c.tensor.id.value();
  StagedRead& s = *staged_read_;
  if (s.last_use != (c.tensor.status == ir::TensorStatus::ReadWrite))
    return make_error(ErrorCode::Invalid, fmt::format("tensor.status: the read of tensor {} began as {}", id,
                                                      s.last_use ? "a last use (ReadWrite)" : "ReadOnly"));
  if (!(s.data.dtype == c.tensor.dtype) || s.data.shape != c.tensor.shape)
    return make_error(ErrorCode::Invalid,
                      fmt::format("tensor: the read of tensor {} began as {} {}, this window says {} {}", id,
                                  ir::shape_to_string(s.data.shape), s.data.dtype.name(),
                                  ir::shape_to_string(c.tensor.shape), c.tensor.dtype.name()));
  if (c.offset != s.sent)
    return make_error(
        ErrorCode::Invalid,
        fmt::format("offset: {}, expected {} (the bytes read so far: windows come in order)", c.offset, s.sent));
  const std::uint64_t total = s.data.bytes.size();
  const std::uint64_t n = std::min(c.dest.length, total - s.sent);  // s.sent < total: the decoder's offset check
  const ArenaRange dest{c.dest.offset, n};
  KILN_RETURN_IF_ERROR(client_->endpoint.arena().write(
      dest, std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(s.data.bytes.data()) + s.sent, n)));
  s.sent += n;
  return ReadPartDoneCpl{s.data.dtype, s.data.shape, c.offset, dest};
}

void ClientSession::reset_staged_read() {
  if (!staged_read_) return;
  if (staged_read_->charged != 0) release(staged_read_->charged);
  staged_read_.reset();
}

// ---- Cleanup when the client goes

void ClientSession::cleanup() {
  runtime::Device& device = service_.device;
  wake_deferred();
  // Drain first, so that every queued op that reads a tensor has run before it is dropped.
  for (const auto& [n, s] : streams_) {
    const LogScope scope(std::nullopt, "", n);
    Status st = device.barrier(s);
    if (!st.ok()) spdlog::warn("kilnd: client {}: drain of stream {}: {}", id(), n, st.error().to_string());
  }
  for (const auto& [n, rec] : tensors_) {
    Status st = device.drop(rec.home, ir::TensorIr{rec.global, rec.shape, ir::TensorStatus::ReadWrite, rec.dtype});
    if (!st.ok()) spdlog::warn("kilnd: client {}: drop of tensor {}: {}", id(), n, st.error().to_string());
  }
  // An upload's home may never have been used by an op: make sure it exists
  // in the table so that its drops are drained and it is closed like the others.
  // The streams' counters stay with the job's metrics (taken as the streams close).
  {
    MutexLock lock(stats_mu_);
    for (const auto& [n, s] : streams_)
      if (std::optional<runtime::StreamStats> st = device.stream_stats(s)) closed_streams_.add(StreamCounters::of(*st));
    stream_ids_.clear();
  }
  for (const auto& [n, s] : streams_) {
    const LogScope scope(std::nullopt, "", n);
    Status st = device.close_stream(s);
    if (!st.ok()) spdlog::warn("kilnd: client {}: close of stream {}: {}", id(), n, st.error().to_string());
  }
  const std::size_t dropped = tensors_.size();
  tensors_.clear();
  // Staged transfers go too; their charges are part of tensor_bytes_, released below.
  staged_uploads_.clear();
  staged_read_.reset();
  {
    MutexLock lock(service_.mu);
    job_state_->usage.tensor_bytes.fetch_sub(tensor_bytes_, std::memory_order_relaxed);
    uid_state_->usage.tensor_bytes.fetch_sub(tensor_bytes_, std::memory_order_relaxed);
    for (Usage* u : {&job_state_->usage, &uid_state_->usage})
      u->queued_ops.fetch_sub(queued_ops_, std::memory_order_relaxed);
    for (const auto& [tensor, token] : exported_) service_.exports.erase(token);
    // The job and uid entries are left by run(), with the metrics' retirement.
  }
  exported_.clear();
  tensor_bytes_ = 0;
  queued_ops_ = 0;
  spdlog::info("kilnd: client {} (job {}) gone: {} stream(s) closed, {} tensor(s) freed", id(), job(), streams_.size(),
               dropped);
  streams_.clear();
}

// ---- Service

Result<JobPolicy> parse_job_policy(std::string_view name) {
  if (name == "uid") return JobPolicy::Uid;
  if (name == "group") return JobPolicy::Group;
  if (name == "any") return JobPolicy::Any;
  return make_error(ErrorCode::Config, fmt::format("job policy '{}': expected uid, group or any", name));
}

const char* job_policy_name(JobPolicy p) {
  switch (p) {
    case JobPolicy::Uid: return "uid";
    case JobPolicy::Group: return "group";
    case JobPolicy::Any: return "any";
  }
  return "?";
}

// On the control server's strand, before on_client of the same client (nothing of another
// client's handshake runs between the two, so the job this checks is the one on_client joins, or
// none).
Status DaemonService::Impl::admit(const PeerCredentials& peer, std::string_view job) {
  MutexLock lock(mu);
  // kilnctl's job per user (kilnctl-<uid>) is that uid's alone, and never counts as a job it
  // owns: nobody can keep a user from reading the daemon's status.
  const bool kilnctl = is_kilnctl_job(job);
  if (kilnctl && job.substr(8) != std::to_string(peer.uid)) {
    count_refusal("kilnctl_name");
    return make_error(ErrorCode::Invalid,
                      fmt::format("job '{}': names kilnctl-<uid> are kilnctl's, each for its own uid", job));
  }
  // Draining: the operator's kilnctl still gets in (to watch the drain, or end it).
  const bool operator_tool = kilnctl && (peer.uid == 0 || peer.uid == ::geteuid());
  if (draining.load(std::memory_order_relaxed) && !operator_tool) {
    count_refusal("draining");
    return make_error(ErrorCode::ResourceExhausted,
                      "the daemon is draining (kilnctl drain): it accepts no new clients until the operator resumes "
                      "it or it restarts");
  }
  auto it = jobs.find(std::string(job));
  if (it != jobs.end()) {
    const JobState& j = it->second;
    const bool allowed = options.job_policy == JobPolicy::Any || peer.uid == j.owner_uid ||
                         (options.job_policy == JobPolicy::Group && peer.gid == j.owner_gid);
    // The owner is not named: a client learns only that the name is taken.
    if (!allowed) {
      count_refusal("job_taken");
      return make_error(
          ErrorCode::Invalid,
          fmt::format("job '{}' belongs to another user (daemon.job_policy = {}); choose another job name", job,
                      job_policy_name(options.job_policy)));
    }
    return Status::Ok();
  }
  const std::uint64_t uid_jobs = AtomicLimits::get(limits.uid_jobs);
  if (uid_jobs != 0 && !kilnctl) {
    auto u = uids.find(peer.uid);
    if (u != uids.end() && u->second.jobs >= uid_jobs) {
      count_refusal("uid_jobs");
      return make_error(ErrorCode::ResourceExhausted,
                        fmt::format("uid {} owns {} jobs, its limit (daemon.uid_jobs = {}); a new job starts when one "
                                    "of them ends",
                                    peer.uid, u->second.jobs, uid_jobs));
    }
  }
  return Status::Ok();
}

void DaemonService::Impl::on_client(std::unique_ptr<AcceptedClient> client) {
  reap();
  auto session = std::make_shared<ClientSession>(*this, std::move(client));
  MutexLock lock(mu);
  if (stopped) return;
  sessions.emplace(session->id(), session);
  UidState& uid_state = uids[session->uid()];
  ++uid_state.clients;
  auto [job, created] = jobs.try_emplace(session->job());
  JobState& job_state = job->second;
  if (created) {
    // The first client's credentials own the job until its last client leaves.
    job_state.owner_uid = session->uid();
    job_state.owner_gid = session->gid();
    job_state.tag = next_job_tag++;
    job_tags.emplace(job_state.tag, session->job());
    if (job_tags.size() > kMaxJobTagNames) job_tags.erase(job_tags.begin());
    ++uid_state.jobs;
  }
  ++job_state.clients;
  session->set_usage(&job_state, &uid_state);
  ++clients_served;
  threads.emplace(session->id(), session->launch());
}

void DaemonService::Impl::drop_if_unused(uid_t u) {
  // (Under a shared policy an owner's job may outlive the owner's clients.)
  auto it = uids.find(u);
  if (it != uids.end() && it->second.clients == 0 && it->second.jobs == 0) uids.erase(it);
}

void DaemonService::Impl::leave(const std::string& job, uid_t uid) {
  if (auto me = uids.find(uid); me != uids.end() && me->second.clients > 0) --me->second.clients;
  if (auto j = jobs.find(job); j != jobs.end() && --j->second.clients == 0) {
    const uid_t owner_uid = j->second.owner_uid;
    if (auto owner = uids.find(owner_uid); owner != uids.end() && owner->second.jobs > 0) --owner->second.jobs;
    jobs.erase(j);
    drop_if_unused(owner_uid);
  }
  drop_if_unused(uid);
}

void DaemonService::Impl::on_disconnect(std::uint64_t client_id, const Status& why) {
  MutexLock lock(mu);
  auto it = sessions.find(client_id);
  if (it == sessions.end()) return;
  if (!why.ok()) spdlog::info("kilnd: client {}: {}", client_id, why.error().to_string());
  it->second->request_stop();
}

// Every DaemonOptions::maintenance_interval: large free blocks the backend pooled longer than its
// retention go back to the OS, so an idle daemon's memory returns near its baseline (an
// allocation or free does the same lazily; this covers a daemon that does neither).
void DaemonService::Impl::schedule_maintenance() {
  maintenance->expires_after(options.maintenance_interval);
  maintenance->async_wait([this](const boost::system::error_code& ec) {
    if (ec) return;  // cancelled: stopping
    const std::uint64_t released = device.backend().release_idle_memory();
    if (released != 0) spdlog::debug("kilnd: gave {} of idle memory back to the system", human_bytes(released));
    schedule_maintenance();
  });
}

void DaemonService::Impl::reap() {
  std::vector<std::thread> done;
  {
    MutexLock lock(mu);
    done.swap(finished_threads);
  }
  for (std::thread& t : done)
    if (t.joinable()) t.join();
}

DaemonService::DaemonService(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

DaemonService::~DaemonService() { stop(); }

Result<std::unique_ptr<DaemonService>> DaemonService::start(runtime::Device& device, DaemonOptions options) {
  auto impl = std::make_unique<Impl>(device, std::move(options));
  Impl* raw = impl.get();
  ServerCallbacks cb;
  cb.admit = [raw](const PeerCredentials& peer, std::string_view job) { return raw->admit(peer, job); };
  cb.on_client = [raw](std::unique_ptr<AcceptedClient> c) { raw->on_client(std::move(c)); };
  cb.on_disconnect = [raw](std::uint64_t id, const Status& why) { raw->on_disconnect(id, why); };
  cb.on_refused = [raw](std::string_view reason) {
    MutexLock lock(raw->mu);
    raw->count_refusal(reason);
  };
  KILN_ASSIGN_OR_RETURN(impl->server, ControlServer::start(impl->io, impl->options.server, std::move(cb)));
  impl->socket_path = impl->server->socket_path();
  impl->work.emplace(impl->io.get_executor());
  if (impl->options.maintenance_interval.count() > 0) {
    impl->maintenance.emplace(impl->io);
    impl->schedule_maintenance();
  }
  impl->io_thread = std::thread([raw] { raw->io.run(); });
  return std::unique_ptr<DaemonService>(new DaemonService(std::move(impl)));
}

const std::string& DaemonService::socket_path() const { return impl_->socket_path; }

void DaemonService::stop() {
  Impl& s = *impl_;
  std::vector<std::shared_ptr<ClientSession>> sessions;
  {
    MutexLock lock(s.mu);
    if (s.stopped) return;
    s.stopped = true;
    s.stopping.store(true, std::memory_order_release);
    for (auto& [id, session] : s.sessions) sessions.push_back(session);
  }
  if (s.server) s.server->stop();
  for (auto& session : sessions) session->request_stop();
  // Each session cleans up (drains, drops, closes its streams) and moves its thread to
  // finished_threads on the way out.
  for (auto& session : sessions) (void)s.wait_until_gone(session->id(), std::nullopt);
  s.reap();
  s.work.reset();
  s.io.stop();
  if (s.io_thread.joinable()) s.io_thread.join();
  s.maintenance.reset();  // its handler ran on the io thread, joined above
  s.server.reset();
}

void DaemonService::set_backend_counters(std::function<BackendCounters()> counters) {
  MutexLock lock(impl_->mu);
  impl_->backend_counters = std::move(counters);
}

void DaemonService::set_control_hooks(ControlHooks hooks) {
  MutexLock lock(impl_->mu);
  impl_->hooks = std::move(hooks);
}

DaemonMetrics DaemonService::metrics() const { return impl_->metrics(); }
LiveLimits DaemonService::limits() const { return impl_->limits.load(); }
void DaemonService::set_limits(const LiveLimits& limits) { impl_->set_limits(limits); }
void DaemonService::set_draining(bool draining) { impl_->draining.store(draining, std::memory_order_relaxed); }

Status DaemonService::disconnect(std::uint64_t client_id) {
  return impl_->disconnect(client_id, std::chrono::milliseconds(30'000)).status();
}

void DaemonService::Impl::count_refusal(std::string_view reason) {
  auto it = refused.find(reason);
  if (it == refused.end()) it = refused.emplace(std::string(reason), 0).first;
  ++it->second;
}

void DaemonService::Impl::set_limits(const LiveLimits& l) {
  limits.store(l);
  if (server) server->set_connection_limits(l.max_connections, l.max_connections_per_uid);
}

BackendCounters DaemonService::Impl::backend() const {
  std::function<BackendCounters()> counters;
  {
    MutexLock lock(mu);
    counters = backend_counters;
  }
  return counters ? counters() : BackendCounters{};
}

bool DaemonService::Impl::wait_until_gone(std::uint64_t client_id,
                                          std::optional<std::chrono::steady_clock::time_point> deadline) const {
  for (;;) {
    {
      MutexLock lock(mu);
      if (sessions.count(client_id) == 0) return true;
    }
    if (deadline && std::chrono::steady_clock::now() >= *deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

std::uint64_t DaemonService::Impl::clients_left() const {
  MutexLock lock(mu);
  return static_cast<std::uint64_t>(std::count_if(
      sessions.begin(), sessions.end(), [](const auto& entry) { return !is_kilnctl_job(entry.second->job()); }));
}

Result<std::string> DaemonService::Impl::disconnect(std::uint64_t client_id, std::chrono::milliseconds timeout) {
  std::shared_ptr<ClientSession> session;
  {
    MutexLock lock(mu);
    auto it = sessions.find(client_id);
    if (it == sessions.end())
      return make_error(ErrorCode::InvalidHandle, fmt::format("no client {} (kilnctl clients lists them)", client_id));
    session = it->second;
  }
  const ClientStatus before = session->status();
  const LogScope scope(client_id, before.job);  // the line is about the client that goes
  spdlog::info("kilnd: client {} (job {}, pid {}) disconnected by the operator", client_id, before.job, before.pid);
  session->request_stop();  // its thread closes the control socket on its way out
  // Its thread drains its streams and frees its tensors, then leaves the table.
  if (!wait_until_gone(client_id, std::chrono::steady_clock::now() + timeout))
    return make_error(ErrorCode::Execution,
                      fmt::format("client {} is still draining its streams after {} s; it goes when they finish",
                                  client_id, timeout.count() / 1000));
  return fmt::format(
      "client {} (job {}, pid {}, uid {}) disconnected: {} stream(s) drained and closed, {} tensor(s) "
      "({}) freed\n",
      client_id, before.job, before.pid, before.uid, before.streams, before.tensors, human_bytes(before.tensor_bytes));
}

DaemonMetrics DaemonService::Impl::metrics() {
  DaemonMetrics m;
  std::vector<std::shared_ptr<ClientSession>> live;
  std::map<std::string, JobMetrics> jobs_by_name;
  {
    // One step with the retirements (retire_metrics): a session is either live here or retired.
    MutexLock lock(mu);
    for (const auto& [id, session] : sessions) live.push_back(session);
    for (const auto& [name, job] : jobs) {
      JobMetrics& j = jobs_by_name[name];
      j.name = name;
      j.owner_uid = job.owner_uid;
      j.clients = job.clients;
      j.tensor_bytes = job.usage.tensor_bytes.load(std::memory_order_relaxed);
      j.queued_ops = job.usage.queued_ops.load(std::memory_order_relaxed);
      j.ops_registered = job.retired.ops_registered;
      j.ops_executed = job.retired.streams.executed;
      j.cache_hits = job.retired.streams.cache_hits;
      j.explorations = job.retired.streams.explorations;
      j.plans_created = job.retired.streams.plans_created;
      j.fused_launches = job.retired.streams.fused_blocks;
      j.unfused_ops = job.retired.streams.unfused_ops;
      j.rejected = job.retired.rejected;
    }
    m.clients_served = clients_served;
    m.rejected = retired_rejected;
    m.requests = retired_requests;
    m.op_admission = retired_op_admission;
    m.refused.insert(refused.begin(), refused.end());
  }
  // The live sessions' own counts, outside the service's lock.
  for (const auto& session : live) {
    const ClientSession::Metrics sm = session->metrics();
    m.rejected.add(sm.rejected);
    for (std::size_t k = 0; k < kNumCommandKinds; ++k) m.requests[k].add(sm.requests[k]);
    m.op_admission.add(sm.op_admission);
    auto j = jobs_by_name.find(sm.status.job);
    if (j == jobs_by_name.end()) continue;  // its job ended between the two steps
    JobMetrics& job = j->second;
    job.ops_registered += sm.status.ops_registered;
    job.rejected.add(sm.rejected);
    StreamCounters streams = sm.closed_streams;
    for (StreamId s : sm.streams)
      if (std::optional<runtime::StreamStats> st = device.stream_stats(s)) streams.add(StreamCounters::of(*st));
    job.ops_executed += streams.executed;
    job.cache_hits += streams.cache_hits;
    job.explorations += streams.explorations;
    job.plans_created += streams.plans_created;
    job.fused_launches += streams.fused_blocks;
    job.unfused_ops += streams.unfused_ops;
    for (const FallbackCount& f : sm.status.fallbacks) job.fallbacks[f.name] += f.calls;
  }
  m.clients = live.size();
  for (auto& [name, j] : jobs_by_name) {
    m.queued_ops += j.queued_ops;
    m.jobs.push_back(std::move(j));
  }
  m.device = options.device_name;
  m.draining = draining.load(std::memory_order_relaxed);
  m.streams = device.num_streams();
  m.plans = device.plan_store().size();
  m.max_plans = device.plan_store().max_plans();
  m.plans_evicted = device.plan_store().evicted();
  const runtime::StreamStats totals = device.totals();
  m.cache_hits = totals.cache_hits;
  m.explorations = totals.explorations;
  const runtime::MemoryStats mem = device.backend().memory_stats();
  m.memory_bytes = mem.bytes_in_use;
  m.device_tensors = mem.tensors;
  m.staged_bytes = staged_bytes.load(std::memory_order_relaxed);
  m.backend = backend();
  m.limits = limits.load();
  return m;
}

DaemonStatus DaemonService::status() const { return impl_->status(std::nullopt); }

DaemonStatus DaemonService::status_for(std::uint32_t viewer) const { return impl_->status(viewer); }

DaemonStatus DaemonService::Impl::status(std::optional<uid_t> viewer) {
  Impl& s = *this;
  // The daemon's own uid and root see everything; any other client its own uid's share. (A plain
  // flag and uid: GCC 12 at -O2 warns that an optional read in the loops may be uninitialised.)
  const bool everything = !viewer || *viewer == 0 || *viewer == ::geteuid();
  const uid_t who = viewer.value_or(0);
  DaemonStatus st;
  std::vector<std::shared_ptr<ClientSession>> live;
  {
    MutexLock lock(s.mu);
    for (auto& [id, session] : s.sessions)
      if (everything || session->uid() == who) live.push_back(session);
    for (const auto& [name, job] : s.jobs) {
      if (!everything && job.owner_uid != who) continue;
      st.jobs.push_back(JobStatus{name, job.owner_uid, job.clients,
                                  job.usage.tensor_bytes.load(std::memory_order_relaxed),
                                  job.usage.queued_ops.load(std::memory_order_relaxed)});
    }
    st.clients_served = s.clients_served;
  }
  for (auto& session : live) st.clients.push_back(session->status());
  st.device = s.options.device_name;
  if (s.options.collectives) st.distributed = s.options.collectives->status();
  st.socket_path = s.socket_path;
  st.streams = s.device.num_streams();
  st.plans = s.device.plan_store().size();
  st.max_plans = s.device.plan_store().max_plans();
  st.plans_evicted = s.device.plan_store().evicted();
  const runtime::MemoryStats mem = s.device.backend().memory_stats();
  st.memory_bytes = mem.bytes_in_use;
  st.device_tensors = mem.tensors;
  const runtime::StreamStats counters = s.device.totals();
  st.cache_hits = counters.cache_hits;
  st.explorations = counters.explorations;
  st.fused_launches = s.backend().fused_launches;
  return st;
}

std::string DaemonStatus::to_json() const {
  std::string out = "{";
  out += fmt::format("\"device\":\"{}\",\"socket\":\"{}\",\"clients_served\":{},\"streams\":{},\"plans\":{},",
                     json_escape(device), json_escape(socket_path), clients_served, streams, plans);
  const std::uint64_t lookups = cache_hits + explorations;
  out += fmt::format("\"max_plans\":{},\"plans_evicted\":{},", max_plans, plans_evicted);
  out += fmt::format("\"cache_hits\":{},\"explorations\":{},\"hit_rate\":{:.4f},\"fused_launches\":{},", cache_hits,
                     explorations, lookups ? double(cache_hits) / double(lookups) : 0.0, fused_launches);
  out += fmt::format("\"memory_bytes\":{},\"device_tensors\":{},", memory_bytes, device_tensors);
  if (distributed) {
    const distributed::GroupStatus& g = *distributed;
    out += fmt::format(
        "\"distributed\":{{\"job\":\"{}\",\"rank\":{},\"world_size\":{},\"rendezvous\":\"{}\","
        "\"state\":\"{}\",\"generation\":{},\"meetings\":{},\"collectives\":{},\"failures\":{},"
        "\"last_error\":\"{}\"}},",
        json_escape(g.job), g.rank, g.world_size, json_escape(g.rendezvous), distributed::group_state_name(g.state),
        g.generation, g.meetings, g.collectives, g.failures, json_escape(g.last_error));
  }
  out += "\"jobs\":[";
  for (std::size_t i = 0; i < jobs.size(); ++i)
    out += fmt::format("{}{{\"name\":\"{}\",\"owner_uid\":{},\"clients\":{},\"tensor_bytes\":{},\"queued_ops\":{}}}",
                       i ? "," : "", json_escape(jobs[i].name), jobs[i].owner_uid, jobs[i].clients,
                       jobs[i].tensor_bytes, jobs[i].queued_ops);
  out += "],\"clients\":[";
  for (std::size_t i = 0; i < clients.size(); ++i) {
    const ClientStatus& c = clients[i];
    out += fmt::format(
        "{}{{\"id\":{},\"job\":\"{}\",\"pid\":{},\"uid\":{},\"streams\":{},\"tensors\":{},\"tensor_bytes\":{},\"ops\":{"
        "},"
        "\"queued_ops\":{},\"rejected\":{},\"fallbacks\":{{",
        i ? "," : "", c.client_id, json_escape(c.job), c.pid, c.uid, c.streams, c.tensors, c.tensor_bytes,
        c.ops_registered, c.queued_ops, c.rejected);
    for (std::size_t f = 0; f < c.fallbacks.size(); ++f)
      out += fmt::format("{}\"{}\":{}", f ? "," : "", json_escape(c.fallbacks[f].name), c.fallbacks[f].calls);
    out += fmt::format("}},\"fallbacks_omitted\":{}}}", c.fallbacks_omitted);
  }
  out += "]}";
  return out;
}

std::string DaemonStatus::to_text() const {
  std::string out;
  const std::uint64_t lookups = cache_hits + explorations;
  out += fmt::format("kilnd on {} ({})\n", device, socket_path);
  out += fmt::format("  clients now {}, served {}; streams {}\n", clients.size(), clients_served, streams);
  out += fmt::format(
      "  plan store: {} plans ({}), {} cache hits, {} explorations, hit rate {:.1f}%\n", plans,
      max_plans ? fmt::format("at most {}, {} evicted", max_plans, plans_evicted) : std::string("unbounded"),
      cache_hits, explorations, lookups ? 100.0 * double(cache_hits) / double(lookups) : 0.0);
  out += fmt::format("  fused launches {}; memory in use {} in {} tensors\n", fused_launches, human_bytes(memory_bytes),
                     device_tensors);
  if (distributed) {
    const distributed::GroupStatus& g = *distributed;
    out += fmt::format("  distributed job {}: rank {} of {} (rendezvous {}), {}", g.job, g.rank, g.world_size,
                       g.rendezvous, distributed::group_state_name(g.state));
    if (g.meetings != 0) out += fmt::format(" (meeting {})", g.generation);
    out += fmt::format(", {} collectives, {} failures\n", g.collectives, g.failures);
    if (!g.last_error.empty()) out += fmt::format("    last error: {}\n", g.last_error);
  }
  for (const JobStatus& j : jobs)
    out += fmt::format("  job {} (uid {}): {} client(s), {} of tensors, {} queued ops\n", j.name, j.owner_uid,
                       j.clients, human_bytes(j.tensor_bytes), j.queued_ops);
  for (const ClientStatus& c : clients) {
    out += fmt::format(
        "    client {} (pid {}, uid {}, job {}): {} streams, {} tensors ({}), {} ops, {} queued, {} rejected\n",
        c.client_id, c.pid, c.uid, c.job, c.streams, c.tensors, human_bytes(c.tensor_bytes), c.ops_registered,
        c.queued_ops, c.rejected);
    if (c.fallbacks.empty()) continue;
    // One line under its client: "fallbacks: aten::flip 12, aten::index_add_ 3 (and 2 more)".
    out += "      fallbacks: ";
    for (std::size_t f = 0; f < c.fallbacks.size(); ++f)
      out += fmt::format("{}{} {}", f ? ", " : "", c.fallbacks[f].name, c.fallbacks[f].calls);
    if (c.fallbacks_omitted != 0) out += fmt::format(" (and {} more)", c.fallbacks_omitted);
    out += "\n";
  }
  return out;
}

}  // namespace kiln::ipc
