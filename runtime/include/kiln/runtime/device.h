// Device: one device's runtime: its backend (tensor table, executors), the execution-plan store
// and fusion log shared by all its streams, the thread pool running the stream actors, the
// stream table, the producer table (cross-stream dependencies) and shutdown.
//
// Thread-safety: every public method may be called from any client thread, concurrently, except
// the destructor. None may be called from inside a stream actor (they block on actors). The
// stream table is a oneTBB concurrent_hash_map (per-bucket locks), the producer table is sharded
// (producer_table.h): no global lock on the op path.
//
// Usage:
//   auto dev = Device::create(std::make_unique<cpu::ReferenceCpuBackend>(), RuntimeOptions{.threads = 4});
//   StreamId s = StreamId(0);
//   (*dev)->register_op(s, std::move(op));   // Lazy, returns at once
//   Result<HostData> d = (*dev)->read(s, t); // drains s only if t is not produced yet
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <tbb/concurrent_hash_map.h>
#include <boost/asio/thread_pool.hpp>

#include "kiln/base/mutex.h"
#include "kiln/fusion/config.h"
#include "kiln/fusion/fusion_log.h"
#include "kiln/fusion/plan_store.h"
#include "kiln/runtime/backend.h"
#include "kiln/runtime/config.h"
#include "kiln/runtime/producer_table.h"
#include "kiln/runtime/session_target.h"
#include "kiln/runtime/stream_actor.h"
#include "kiln/runtime/usable_cores.h"

namespace kiln::runtime {

// Commands one actor runs per turn before re-posting itself. An op registration in Lazy mode
// costs roughly 1–20 µs in the fusion benchmarks (policy update, at worst an exploration), so 64
// keeps a turn well under a millisecond — other strands on the same pool thread are not starved —
// while the post/strand overhead (~0.1–0.5 µs per turn) stays under 1% of a turn. A first
// estimate; the runtime benchmark (next part) is to tune it.
inline constexpr std::size_t kDefaultDrainBatch = 64;

struct RuntimeOptions {
  // Pool threads; 0 = KILN_RUNTIME_THREADS from the environment, else kiln.toml
  // [runtime] threads, else usable_cores() (runtime/config.h).
  std::size_t threads = 0;
  // Commands per actor turn; nullopt = KILN_RUNTIME_DRAIN_BATCH, else kiln.toml [runtime]
  // drain_batch, else kDefaultDrainBatch. An explicit 0 is an error. Device::options() reports
  // the resolved value.
  std::optional<std::size_t> drain_batch;
  // Whether a thread that waits on a stream (drain, read, shared view) with no turn running and
  // at most a few commands queued runs them itself instead of waking a pool thread and sleeping
  // (StreamActor::try_run_inline); nullopt = KILN_RUNTIME_INLINE_WAITS, else kiln.toml [runtime]
  // inline_waits, else true. A backend whose kernels must stay on the pool threads
  // (DeviceBackend::executes_on_any_thread) never runs inline.
  std::optional<bool> inline_waits;
  // Whether a thread that waits on a stream spins for the answer (up to ~200 µs, while its actor
  // keeps running commands) before it sleeps, as long as no other stream of the device is busy
  // (Device::wait); nullopt = KILN_RUNTIME_SPIN_WAITS, else kiln.toml [runtime] spin_waits, else
  // on with 2 or more usable cores (a single core never spins, whatever the setting). kilnd
  // turns it off unless configured: its session threads share the cores with their clients,
  // which poll for the answer too. Device::options() reports the resolved setting.
  std::optional<bool> spin_waits;
  // kiln.toml location; an absent file (or an empty path) means defaults. Its [runtime] table is
  // read even when `fusion` is given explicitly.
  std::string config_path = "kiln.toml";
  // Explicit fusion settings: replace the file and the environment entirely.
  std::optional<fusion::FusionConfig> fusion;
  // [fusion] row_fuser from a flag (kilnd --row-fuser): wins over the file, the environment and
  // `fusion`.
  std::optional<bool> row_fuser;
  // Explicit log sink (tests capture it); default: stderr at the configured level.
  std::optional<fusion::FusionLog> log;
  // Bound of every blocking wait (drain, read, shared view, shutdown per stream). A wait that
  // runs out logs its reason and returns an error.
  std::chrono::milliseconds wait_timeout{60'000};
  // Spin waits: the longest a waiter spins, and the longest its actor may run no command before
  // the waiter gives up and sleeps (a pool-thread wake-up, ~20 µs on a VM, fits; a starved
  // actor or a long kernel does not last much longer). Tests stretch both.
  std::chrono::microseconds spin_wait_limit{200};
  std::chrono::microseconds spin_wait_stall{30};
  // Pauses a turn polls its intake for the producer's next op before it ends (ActorContext::
  // idle_polls). Default: kDefaultTurnIdlePolls from 2 usable cores, else 0 (on the only core
  // the poll only delays the producer it waits for). Tests stretch it.
  std::optional<int> turn_idle_polls;
  // Op registrations an owner queues before its push wakes the stream's actor (StreamActor::
  // push). Default: 1 (every registration wakes it, so it runs on another core while the
  // producer records) from 2 usable cores; on a lone core, drain_batch: the actor could only run
  // on the producer's core, so a wake per op would cost a context switch each way for nothing,
  // and a wait (drain, read, share) runs the unwoken backlog inline. Values above 1 need
  // inline_waits (without it, 1).
  std::optional<std::size_t> wake_after;
  // Environment lookup (tests inject one); default: the process environment.
  fusion::EnvLookup env;
};

// The memory check of docs/spec/fusion.md §16.8 (a test feature): the device's handles and every stream
// that still tracks tensors or queues operations. clean() iff neither remains.
struct MemoryReport {
  std::uint64_t handles = 0;
  std::vector<StreamSnapshot> streams;  // only streams with operations or variables left
  bool clean() const { return handles == 0 && streams.empty(); }
  // The spec's "==== Fusion Memory Report ====" rendering.
  std::string to_string() const;
};

class Device final : public SessionTarget {
 public:
  // Reads the configuration (explicit options > environment > kiln.toml) and starts the pool.
  static Result<std::unique_ptr<Device>> create(std::unique_ptr<DeviceBackend> backend, RuntimeOptions options = {});
  ~Device();  // shutdown()
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  // A fresh tensor id (never reused).
  ir::TensorId new_tensor_id() override {
    return ir::TensorId(next_tensor_id_.fetch_add(1, std::memory_order_relaxed));
  }
  // The first of `count` consecutive fresh ids (never reused), aligned to ir::kTensorIdBlock: a
  // producer that takes its ids in blocks keeps its tensors in one shard of the producer table,
  // which shards by aligned block (single ids taken meanwhile would otherwise misalign every
  // later block over two shards).
  ir::TensorId new_tensor_ids(std::uint64_t count) override;

  // Registers host data under a fresh id (no stream involved).
  // The device keeps no home per tensor (its client, a Session or the daemon, does): `home` is
  // only part of the SessionTarget contract.
  [[nodiscard]] Status upload(StreamId home, ir::TensorId id, ir::DType dtype, ir::Shape shape,
                              std::span<const std::byte> bytes) override;
  // Queues an op on `stream` (created on first use). An input still pending on another stream
  // (producer table) drains that stream first, blocking the caller.
  [[nodiscard]] Status register_op(StreamId stream, ir::Operation&& op) override;
  // register_op without waking the stream's actor: for a caller that registers a burst and then
  // calls wake_stream (or waits on the stream: drain, read and share run or wake it). The daemon
  // uses it while a client's ring still holds messages, so that an op followed by a sync is
  // registered and run by the session thread's inline drain with no pool thread woken at all.
  [[nodiscard]] Status register_op_deferred(StreamId stream, ir::Operation&& op);
  void wake_stream(StreamId stream);
  // Sync: executes everything queued on `stream`, then answers the stream's first execution
  // failure since the last drain, naming the op (and takes it: the next drain reports only what
  // fails after this one).
  [[nodiscard]] Status drain(StreamId stream) override;
  // An ordering drain: executes everything queued on `stream` and reports only whether it could
  // (a closed stream, a timeout); execution failures stay for the stream's next drain. For work
  // that must come after the stream's queued ops (cross-stream dependencies, closes, the
  // daemon's re-homing of a tensor), not for a client's sync.
  [[nodiscard]] Status barrier(StreamId stream);
  // A fresh tensor the device did not produce, registered as failed (DeviceBackend::claim_error):
  // the daemon's collectives across daemons, whose output is made outside the streams.
  [[nodiscard]] Status claim_error(ir::TensorId id, const ir::TensorError& error) {
    return backend_->claim_error(id, error);
  }
  // DeviceBackend::update_in_place (the daemon's collectives across daemons).
  [[nodiscard]] Status update_in_place(const ir::TensorIr& t, FunctionRef<Status(std::span<std::byte>)> update) {
    return backend_->update_in_place(t, update);
  }
  std::optional<ir::TensorError> error_of(ir::TensorId id) const { return backend_->error_of(id); }
  // Reads a tensor whose home is `home` (drains only if the tensor is not produced yet).
  [[nodiscard]] Result<HostData> read(StreamId home, const ir::TensorIr& t) override;
  // The last drop of a tensor whose home is `home` (queued Drop from the owner thread, foreign
  // drop from any other). Never blocks.
  [[nodiscard]] Status drop(StreamId home, const ir::TensorIr& t) override;
  // drop without waking the home stream's actor (see register_op_deferred).
  [[nodiscard]] Status drop_deferred(StreamId home, const ir::TensorIr& t);
  // A cross-stream shared view: drains `src_stream` if `src` is not produced yet, then `dst`
  // becomes an alias of `src` (errored source → errored alias, same root).
  [[nodiscard]] Status share(StreamId src_stream, ir::TensorId src, StreamId dst_stream, ir::TensorId dst) override;
  // Makes the calling thread the intake producer of `stream` (its implicit stream).
  void claim_stream(StreamId stream) override;
  // Stream removal (docs/spec/fusion.md §16.6): drains `stream`, then destroys its actor (its processor,
  // executor and queues). The caller guarantees that no other thread uses the stream meanwhile
  // and that no live tensor is homed on it any more (drop them first); a later use of the id
  // creates a fresh stream. Ok for an unknown stream. Used by the daemon when a client goes.
  [[nodiscard]] Status close_stream(StreamId stream);
  // Tags `stream` for the plan store's usage (fusion::PlanUsage: the daemon tags a client's
  // streams with its job). Applies to the stream's actor when it is created: call it before the
  // stream's first use. 0 removes the tag.
  void tag_stream(StreamId stream, std::uint32_t tag);

  std::optional<StreamStats> stream_stats(StreamId stream) const;
  // Every stream's counters summed, closed streams included (status reports: cache hits,
  // explorations, executed operations). Takes the stream-creation lock briefly.
  StreamStats totals() const;
  // Drains, reads and shared views whose answer came while their caller spun for it
  // (RuntimeOptions::spin_waits), over the device's life.
  std::uint64_t spun_waits() const { return spun_waits_.load(std::memory_order_relaxed); }
  // docs/spec/fusion.md §16.8: a snapshot of what is left (each live stream answers on its strand; after
  // shutdown the streams are read directly). check_memory_leaks(): Ok iff the report is clean,
  // else an error carrying the report. Call it once every client tensor is gone and the streams
  // have drained (e.g. after Session::sync, or after shutdown).
  MemoryReport memory_report();
  [[nodiscard]] Status check_memory_leaks();
  std::size_t num_streams() const { return streams_.size(); }
  // The stream that produced a still-pending (not yet dropped or consumed) tensor.
  std::optional<StreamId> producer_of(ir::TensorId id) const;

  // Drains every stream (each wait bounded by wait_timeout), stops the pool if a drain timed
  // out, joins every thread and cancels what is left. Idempotent. Error if something was
  // cancelled or timed out.
  [[nodiscard]] Status shutdown();
  bool is_shut_down() const { return closed_.load(std::memory_order_acquire); }

  DeviceBackend& backend() { return *backend_; }
  fusion::ExecutionPlanStore& plan_store() { return store_; }
  const fusion::FusionConfig& config() const { return config_; }
  const RuntimeOptions& options() const { return options_; }
  std::size_t threads() const { return threads_; }

 private:
  Device(std::unique_ptr<DeviceBackend> backend, RuntimeOptions options, fusion::FusionConfig config,
         fusion::FusionLog log, std::size_t threads, bool spin_waits);
  using StreamTable = tbb::concurrent_hash_map<std::uint64_t, std::unique_ptr<StreamActor>>;
  // The stream's actor (created on first use) with its table entry read-locked in `held`:
  // close_stream cannot erase and destroy the actor while `held` lives. Held across calls into
  // the actor that do not wait (a push, an inline run of what is queued), never across a wait,
  // and never two at once (a read lock taken again while a writer is queued on the bucket would
  // deadlock). false: the stream was just closed, or the device is shut down.
  bool hold_actor(StreamId stream, StreamTable::const_accessor& held);
  // A drain, read or share (Cmd): run inline when `may_inline` and the stream allows it, else
  // submitted to the held actor, with `progress` set when its waiter is to spin. The caller
  // waits afterwards, the actor no longer held.
  template <class Cmd>
  Status dispatch_waited(StreamId stream, Command& cmd, bool may_inline,
                         std::shared_ptr<const std::atomic<std::uint64_t>>& progress);
  Status register_op_impl(StreamId stream, ir::Operation&& op, bool wake);
  Status drop_impl(StreamId home, const ir::TensorIr& t, bool wake);
  Status drain_impl(StreamId stream, bool report_failure);
  // Waits for an actor's answer (spins briefly, then sleeps up to options().wait_timeout);
  // what() names the wait in the timeout error.
  // progress: the actor's command count, when the caller may spin for the answer first
  // (decided by spin_before_sleep() before the command was submitted, so that the actor knows
  // the waiter keeps its core); nullptr = sleep at once.
  template <class V, class What>
  V wait(std::future<V>& f, const std::shared_ptr<const std::atomic<std::uint64_t>>& progress, const What& what) const;
  // Whether a waiter on `a` should spin before it sleeps: spin waits are on (spin_waits_) and no
  // other stream of the device is busy.
  bool spin_before_sleep(const StreamActor& a) const;

  // Declaration order is destruction order reversed: actors (streams_) go before the pool, the
  // store, the log and the backend they use.
  RuntimeOptions options_;
  fusion::FusionConfig config_;
  fusion::FusionLog log_;
  std::unique_ptr<DeviceBackend> backend_;
  fusion::ExecutionPlanStore store_;
  std::size_t threads_;
  std::atomic<std::int64_t> turns_waiting_{0};        // see ActorContext::turns_waiting; outlives the pool
  bool spin_waits_ = false;                           // options_.spin_waits, and a core for the waiter beside its actor
  std::atomic<std::int64_t> busy_streams_{0};         // see ActorContext::busy_streams; outlives the pool
  mutable std::atomic<std::uint64_t> spun_waits_{0};  // waits answered while spinning
  boost::asio::thread_pool pool_;
  StreamTable streams_;
  // The actors of streams_, for traversals (reports, totals, shutdown) under streams_mu_: a TBB
  // table may not be traversed while other threads use it, not even by lookups alone (a lookup
  // after the table grew rehashes its bucket in place; TSan caught a report doing so).
  std::vector<StreamActor*> live_actors_ KILN_GUARDED_BY(streams_mu_);
  std::vector<std::unique_ptr<StreamActor>> abandoned_ KILN_GUARDED_BY(streams_mu_);  // closed streams never idle
  StreamStats closed_totals_ KILN_GUARDED_BY(streams_mu_);                            // counters of closed streams
  std::unordered_map<std::uint64_t, std::uint32_t> stream_tags_ KILN_GUARDED_BY(streams_mu_);  // tag_stream
  ProducerTable producers_;
  std::atomic<std::uint64_t> next_tensor_id_{0};
  std::atomic<bool> closed_{false};
  mutable Mutex streams_mu_;  // stream creation vs snapshots and removal (never on the op path)
  Mutex shutdown_mu_ KILN_ACQUIRED_BEFORE(streams_mu_);  // serializes shutdown() and closes
  bool shut_down_ KILN_GUARDED_BY(shutdown_mu_) = false;
};

}  // namespace kiln::runtime
