#include "kiln/runtime/device.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "kiln/base/cpu_relax.h"

namespace kiln::runtime {

namespace {
// Largest read a waiting caller runs itself (see Device::read).
constexpr std::uint64_t kInlineReadBytes = 256 * 1024;
constexpr unsigned kSpinWaitsMinCores = 2;  // RuntimeOptions::spin_waits' default: on from 2 cores
constexpr int kWaitSpinRound = 32;          // pauses between checks of the clock, busy count and progress
}  // namespace

Result<std::unique_ptr<Device>> Device::create(std::unique_ptr<DeviceBackend> backend, RuntimeOptions options) {
  if (!backend) return make_error(ErrorCode::Invalid, "Device::create: no backend");
  // spdlog's registry is a lazy function-local static inside the (uninstrumented) libspdlog.so:
  // first touched by two client threads at once (e.g. two failing drops after a shutdown), TSan
  // cannot see its init guard and reports a race. Touching it here, before any thread of this
  // device or its clients logs, makes that initialization happen-before every later log call.
  (void)spdlog::default_logger_raw();
  if (options.drain_batch && *options.drain_batch == 0)
    return make_error(ErrorCode::Config, "Device::create: drain_batch must be > 0");
  if (!options.env) options.env = fusion::process_env();
  // [runtime]: explicit options > environment > kiln.toml > defaults (runtime/config.h).
  std::string warnings;
  Result<RuntimeFileConfig> rt = load_runtime_config(options.config_path, options.env, &warnings);
  if (!rt.ok()) return rt.error();
  if (!warnings.empty()) spdlog::warn("kiln runtime: {}", warnings);
  const unsigned cores = usable_cores();  // reads the cgroup files: once per device
  if (options.threads == 0) options.threads = rt->threads.value_or(cores);
  if (!options.drain_batch) options.drain_batch = rt->drain_batch.value_or(kDefaultDrainBatch);
  if (!options.inline_waits) options.inline_waits = rt->inline_waits.value_or(true);
  // Spin waits need a core for the waiter beside its actor.
  if (!options.spin_waits) options.spin_waits = rt->spin_waits.value_or(cores >= kSpinWaitsMinCores);
  // Polling for the producer's next op, like spinning, needs a core for the producer beside it.
  if (!options.turn_idle_polls) options.turn_idle_polls = cores >= kSpinWaitsMinCores ? kDefaultTurnIdlePolls : 0;
  if (!options.wake_after) options.wake_after = cores >= kSpinWaitsMinCores ? 1 : *options.drain_batch;
  if (*options.wake_after == 0) return make_error(ErrorCode::Config, "Device::create: wake_after must be > 0");
  fusion::FusionConfig config;
  if (options.fusion) {
    config = *options.fusion;
  } else {
    Result<fusion::FusionConfig> loaded = fusion::load_fusion_config(options.config_path, options.env);
    if (!loaded.ok()) return loaded.error();
    config = *loaded;
  }
  if (options.row_fuser) config.row_fuser = *options.row_fuser;
  fusion::FusionLog log;
  if (options.log)
    log = *options.log;
  else if (config.log_level != fusion::LogLevel::Disabled)
    log = fusion::FusionLog::to_stderr(config.log_level);
  const std::size_t threads = options.threads;
  // An explicit `true` stays reported as asked, but never spins without a core to spare.
  const bool spin_waits = *options.spin_waits && cores >= kSpinWaitsMinCores;
  return std::unique_ptr<Device>(
      new Device(std::move(backend), std::move(options), config, std::move(log), threads, spin_waits));
}

Device::Device(std::unique_ptr<DeviceBackend> backend, RuntimeOptions options, fusion::FusionConfig config,
               fusion::FusionLog log, std::size_t threads, bool spin_waits)
    : options_(std::move(options)),
      config_(config),
      log_(std::move(log)),
      backend_(std::move(backend)),
      store_(fusion::PlanStoreOptions{
          .max_plans = config.max_plans,
          .max_plan_triggers = config.max_plan_triggers,
          .search_options = fusion::search_options_of(fusion::FuserOptions{.row_fuser = config.row_fuser})}),
      threads_(threads),
      spin_waits_(spin_waits),
      pool_(threads) {}

Device::~Device() {
  Status st = shutdown();
  if (!st.ok()) spdlog::warn("kiln runtime: device shutdown: {}", st.error().to_string());
}

namespace {
void add_counters(StreamStats& sum, const StreamStats& s) {
  sum.enqueued += s.enqueued;
  sum.commands += s.commands;
  sum.executed += s.executed;
  sum.deferred += s.deferred;
  sum.turns += s.turns;
  sum.drains += s.drains;
  sum.inline_runs += s.inline_runs;
  sum.pending_ops += s.pending_ops;
  sum.cache_hits += s.cache_hits;
  sum.explorations += s.explorations;
  sum.plans_created += s.plans_created;
  sum.fused_blocks += s.fused_blocks;
  sum.unfused_ops += s.unfused_ops;
  sum.awake = sum.awake || s.awake;  // any stream awake
}
}  // namespace

bool Device::hold_actor(StreamId stream, StreamTable::const_accessor& held) {
  if (streams_.find(held, stream.value())) return true;  // bucket read lock: the hot path
  {
    // Creation is rare: serialized under streams_mu_ with the traversals of live_actors_
    // (shutdown, reports, totals), which never walk the TBB table itself.
    MutexLock lock(streams_mu_);
    if (closed_.load(std::memory_order_acquire)) return false;
    StreamTable::accessor a;
    if (streams_.insert(a, stream.value())) {
      ActorContext ctx;
      ctx.backend = backend_.get();
      ctx.store = &store_;
      ctx.log = &log_;
      ctx.processor.max_blocks = config_.max_blocks;
      ctx.processor.max_explorations = config_.max_explorations;
      if (auto tag = stream_tags_.find(stream.value()); tag != stream_tags_.end()) ctx.processor.tag = tag->second;
      ctx.fusers.row_fuser = config_.row_fuser;
      ctx.drain_batch = *options_.drain_batch;
      ctx.idle_polls = *options_.turn_idle_polls;
      ctx.turns_waiting = &turns_waiting_;
      ctx.busy_streams = &busy_streams_;
      ctx.inline_waits = *options_.inline_waits && backend_->executes_on_any_thread();
      ctx.wake_after = ctx.inline_waits ? *options_.wake_after : 1;
      a->second = std::make_unique<StreamActor>(stream, ctx, pool_);
      live_actors_.push_back(a->second.get());
    }
  }  // the write lock goes before the read lock is taken (same bucket)
  // Fails only when a close of the stream erased it in between.
  return streams_.find(held, stream.value());
}

namespace {
Error unavailable_error(StreamId stream) {
  return make_error(ErrorCode::Execution,
                    "stream " + std::to_string(stream.value()) + ": the stream was closed, or the device is shut down");
}
}  // namespace

template <class Cmd>
Status Device::dispatch_waited(StreamId stream, Command& cmd, bool may_inline,
                               std::shared_ptr<const std::atomic<std::uint64_t>>& progress) {
  StreamTable::const_accessor held;  // released on return, before the caller's wait: a close may
                                     // then destroy the actor; the answer's future outlives it
  if (!hold_actor(stream, held)) return unavailable_error(stream);
  StreamActor& a = *held->second;
  if (may_inline && a.try_run_inline(cmd)) return Status::Ok();
  if ((std::get<Cmd>(cmd).waiter_spins = spin_before_sleep(a))) progress = a.progress_counter();
  return a.submit(std::move(cmd));
}

void Device::claim_stream(StreamId stream) {
  StreamTable::const_accessor held;
  if (hold_actor(stream, held)) held->second->claim_owner();
}

Status SessionTarget::read_into(StreamId home, const ir::TensorIr& t, std::span<std::byte> dst) {
  // Checked before the read, which may consume the tensor (a last use); the read's own size is
  // checked after it (quantized and bool stores have their own layouts).
  if (const std::uint64_t want = ir::num_elements(t.shape) * t.dtype.size_bytes();
      !t.dtype.is_quantized() && !t.dtype.is_bool() && want != dst.size())
    return make_error(ErrorCode::Invalid,
                      fmt::format("read of {}: {} bytes into a buffer of {}", t.id.to_string(), want, dst.size()));
  KILN_ASSIGN_OR_RETURN(HostData data, read(home, t));
  if (data.bytes.size() != dst.size())
    return make_error(ErrorCode::Invalid, fmt::format("read of {}: {} bytes into a buffer of {}", t.id.to_string(),
                                                      data.bytes.size(), dst.size()));
  if (!dst.empty()) std::memcpy(dst.data(), data.bytes.data(), dst.size());
  return Status::Ok();
}

Status Device::upload(StreamId /*home*/, ir::TensorId id, ir::DType dtype, ir::Shape shape,
                      std::span<const std::byte> bytes) {
  if (is_shut_down()) return make_error(ErrorCode::Execution, "upload: the device is shut down");
  return backend_->upload(id, dtype, std::move(shape), bytes);
}

Status Device::register_op(StreamId stream, ir::Operation&& op) {
  return register_op_impl(stream, std::move(op), true);
}

Status Device::register_op_deferred(StreamId stream, ir::Operation&& op) {
  return register_op_impl(stream, std::move(op), false);
}

void Device::wake_stream(StreamId stream) {
  StreamTable::const_accessor a;
  if (streams_.find(a, stream.value())) a->second->wake();
}

Status Device::register_op_impl(StreamId stream, ir::Operation&& op, bool wake) {
  // Cross-stream dependency: an input another stream produced and has not executed yet.
  for (const ir::TensorIr& in : op.inputs()) {
    std::optional<StreamId> producer = producer_of(in.id);
    if (producer && *producer != stream && !backend_->is_materialized(in.id)) {
      Status st = barrier(*producer);
      if (!st.ok()) return st;
    }
  }
  for (const ir::TensorIr& out : op.outputs()) producers_.insert(out.id, stream);
  for (const ir::TensorIr& in : op.inputs())
    if (in.status == ir::TensorStatus::ReadWrite) producers_.erase(in.id);  // last use: no one names it again
  StreamTable::const_accessor held;
  if (!hold_actor(stream, held)) return unavailable_error(stream);
  return held->second->submit_op(std::move(op), wake);
}

std::optional<StreamId> Device::producer_of(ir::TensorId id) const { return producers_.find(id); }

ir::TensorId Device::new_tensor_ids(std::uint64_t count) {
  std::uint64_t next = next_tensor_id_.load(std::memory_order_relaxed);
  std::uint64_t first = 0;
  do {
    first =
        (next + ir::kTensorIdBlock - 1) / ir::kTensorIdBlock * ir::kTensorIdBlock;  // the skipped ids are never used
  } while (!next_tensor_id_.compare_exchange_weak(next, first + count, std::memory_order_relaxed));
  return ir::TensorId(first);
}

bool Device::spin_before_sleep(const StreamActor& a) const {
  if (!spin_waits_) return false;
  return busy_streams_.load(std::memory_order_relaxed) - (a.scheduled() ? 1 : 0) <= 0;
}

// `what` names the wait in the timeout error only (no string built per drain or read).
template <class V, class What>
V Device::wait(std::future<V>& f, const std::shared_ptr<const std::atomic<std::uint64_t>>& progress_of,
               const What& what) const {
  // Spin first, while no other stream is busy: a sleeping waiter costs a futex wake-up on the
  // actor's side and tens of µs before it runs again on a VM (its idle vCPU halted), and its
  // actor, told the waiter spins, keeps polling for the next op instead of going idle. With
  // other streams busy the cores are theirs: spinning then took the core an answer needed
  // (two producers and two actors on two cores: 2.1 M → 1.3 M ops/s).
  if (progress_of != nullptr) {
    // The cache-hit loop's read waits ~40–60 µs for its actor to catch up (spin_wait_limit 200).
    auto progressed_at = std::chrono::steady_clock::now();
    const auto until = progressed_at + options_.spin_wait_limit;
    std::uint64_t progress = progress_of->load(std::memory_order_relaxed);
    for (;;) {
      for (int i = 0; i < kWaitSpinRound; ++i) {
        if (f.wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
          spun_waits_.fetch_add(1, std::memory_order_relaxed);
          return f.get();
        }
        cpu_relax();
      }
      // One busy stream is the waiter's own (its actor at work), more mean others want cores.
      const auto now = std::chrono::steady_clock::now();
      if (busy_streams_.load(std::memory_order_relaxed) > 1 || now >= until) break;
      // Spin only while the actor visibly runs beside us. If it ran no command for a wake-up's
      // time it is in a long kernel, or waiting for a core — perhaps this one (a wake-up lands on
      // the waker's core, and a spinner there starves its actor): sleep and leave the core.
      if (const std::uint64_t p = progress_of->load(std::memory_order_relaxed); p != progress) {
        progress = p;
        progressed_at = now;
      } else if (now - progressed_at >= options_.spin_wait_stall) {
        break;
      }
    }
  }
  if (f.wait_for(options_.wait_timeout) != std::future_status::ready) {
    const std::string name = what();
    spdlog::warn("kiln runtime: {} did not complete within {} ms; giving up the wait", name,
                 options_.wait_timeout.count());
    return make_error(ErrorCode::Execution,
                      name + ": timed out after " + std::to_string(options_.wait_timeout.count()) + " ms");
  }
  return f.get();  // every path of the actor sets a value (never an exception)
}

Status Device::drain(StreamId stream) { return drain_impl(stream, true); }

Status Device::barrier(StreamId stream) { return drain_impl(stream, false); }

Status Device::drain_impl(StreamId stream, bool report_failure) {
  Command cmd{std::in_place_type<DrainCmd>};
  std::get<DrainCmd>(cmd).report_failure = report_failure;
  std::future<Status> f = std::get<DrainCmd>(cmd).done.get_future();
  std::shared_ptr<const std::atomic<std::uint64_t>> progress;
  KILN_RETURN_IF_ERROR(dispatch_waited<DrainCmd>(stream, cmd, true, progress));
  return wait(f, progress, [stream] { return "drain of stream " + std::to_string(stream.value()); });
}

Result<HostData> Device::read(StreamId home, const ir::TensorIr& t) {
  Command cmd{std::in_place_type<ReadCmd>, ReadCmd{t, {}}};
  std::future<Result<HostData>> f = std::get<ReadCmd>(cmd).done.get_future();
  if (t.status == ir::TensorStatus::ReadWrite) producers_.erase(t.id);
  // Inline only for small reads: a large one is dominated by its copy, and its buffer is better
  // allocated by the pool thread whose heap has recycled the last one (16 MiB reads on a busy
  // client heap fell from 4.4 to 0.8 GB/s, every buffer a fresh mmap).
  const bool small = ir::num_elements(t.shape) * t.dtype.size_bytes() <= kInlineReadBytes;
  std::shared_ptr<const std::atomic<std::uint64_t>> progress;
  KILN_RETURN_IF_ERROR(dispatch_waited<ReadCmd>(home, cmd, small, progress));
  return wait(f, progress,
              [&t, home] { return "read of " + t.to_string() + " on stream " + std::to_string(home.value()); });
}

Status Device::drop(StreamId home, const ir::TensorIr& t) { return drop_impl(home, t, true); }

Status Device::drop_deferred(StreamId home, const ir::TensorIr& t) { return drop_impl(home, t, false); }

Status Device::drop_impl(StreamId home, const ir::TensorIr& t, bool wake) {
  producers_.erase(t.id);
  StreamTable::const_accessor held;
  if (!hold_actor(home, held)) return unavailable_error(home);
  return held->second->submit_drop(t, wake);
}

Status Device::share(StreamId src_stream, ir::TensorId src, StreamId /*dst_stream*/, ir::TensorId dst) {
  Command cmd{std::in_place_type<ShareCmd>, ShareCmd{src, dst, {}}};
  std::future<Status> f = std::get<ShareCmd>(cmd).done.get_future();
  std::shared_ptr<const std::atomic<std::uint64_t>> progress;
  KILN_RETURN_IF_ERROR(dispatch_waited<ShareCmd>(src_stream, cmd, true, progress));
  return wait(f, progress, [src, src_stream] {
    return "shared view of " + src.to_string() + " from stream " + std::to_string(src_stream.value());
  });
}

void Device::tag_stream(StreamId stream, std::uint32_t tag) {
  MutexLock lock(streams_mu_);
  if (tag == 0)
    stream_tags_.erase(stream.value());
  else
    stream_tags_[stream.value()] = tag;
}

Status Device::close_stream(StreamId stream) {
  {
    MutexLock lock(streams_mu_);
    stream_tags_.erase(stream.value());
  }
  {
    StreamTable::const_accessor a;
    if (!streams_.find(a, stream.value())) return Status::Ok();
  }
  Status drained = barrier(stream);
  // Serialised with shutdown (which holds shutdown_mu_ while it uses its snapshot of actors).
  MutexLock shutdown_lock(shutdown_mu_);
  if (shut_down_) return drained;
  std::unique_ptr<StreamActor> owned;
  {
    // The entry's write lock waits for every call that holds the stream (a long inline run
    // among them) with no time bound, so it is taken outside the creation lock: new streams
    // are made meanwhile. A creation of this same id waits for it under the creation lock,
    // which is safe: nothing here takes that lock before the entry is erased.
    StreamTable::accessor a;
    if (!streams_.find(a, stream.value())) return drained;
    a->second->close();
    owned = std::move(a->second);
    streams_.erase(a);
  }
  // The actor stays listed in live_actors_ (alive: owned here) until its counters move into the
  // closed totals, in one step under streams_mu_: totals() never misses them (a caller that saw
  // the stream gone from the table read totals without the closed stream's work).
  // `abandon`: the actor is kept until the device goes (see keep), listed there in the same step.
  auto unlist = [&](bool abandon) {
    const StreamStats st = owned->stats();
    MutexLock streams_lock(streams_mu_);
    std::erase(live_actors_, owned.get());
    add_counters(closed_totals_, st);
    if (abandon) abandoned_.push_back(std::move(owned));
  };
  // A turn stuck in a kernel: keep the actor alive until the device goes (after its pool joined)
  // rather than destroy it under a running handler. Its counters join the totals either way
  // (final once no turn is left; what it had run so far otherwise).
  auto keep = [&](const char* what) -> Status {
    spdlog::warn("kiln runtime: close of stream {}: {} within {} ms; keeping the actor until shutdown", stream.value(),
                 what, options_.wait_timeout.count());
    unlist(/*abandon=*/true);
    return make_error(ErrorCode::Execution, "close of stream " + std::to_string(stream.value()) + ": timed out");
  };
  std::future<void> idle = owned->quiesce();
  if (idle.wait_for(options_.wait_timeout) != std::future_status::ready) return keep("the actor did not go idle");
  (void)owned->cancel_pending("the stream was closed");
  // A turn that was running when the quiesce was posted may have re-posted itself behind it (a
  // spent batch, or work queued before the close); it finds the queues empty now and ends.
  if (!owned->wait_turns_out(options_.wait_timeout)) return keep("a turn did not end");
  // Such a turn may have found the stream held by cancel_pending and left without clearing the
  // actor's busy flag: the device's busy count must not keep it (it would stop every later spin
  // and in-place turn).
  owned->retire();
  unlist(/*abandon=*/false);  // final counters now that no turn is left
  return drained;
}

std::string MemoryReport::to_string() const {
  std::string out = "\n==== Fusion Memory Report ====\n";
  out += " - Handles: " + std::to_string(handles) + "\n";
  out += " - Streams: " + std::to_string(streams.size()) + "\n";
  for (const StreamSnapshot& s : streams) {
    out += "  - StreamId(" + std::to_string(s.id.value()) + ") => operations: " + std::to_string(s.operations) +
           " cursor: " + std::to_string(s.cursor) + "\n";
    for (const auto& [id, status] : s.variables)
      out += "   - TensorId(" + std::to_string(id.value()) + ") => status: " + ir::status_name(status) + "\n";
  }
  out += "==============================\n";
  return out;
}

MemoryReport Device::memory_report() {
  // Serialised with close_stream and shutdown, which destroy or stop actors.
  MutexLock shutdown_lock(shutdown_mu_);
  std::vector<StreamActor*> actors;
  {
    MutexLock lock(streams_mu_);
    actors = live_actors_;
  }
  MemoryReport report;
  for (StreamActor* a : actors) {
    StreamSnapshot snap;
    if (shut_down_) {
      snap = a->snapshot_now();  // the pool has joined: no handler runs
    } else {
      std::future<StreamSnapshot> f = a->snapshot();
      if (f.wait_for(options_.wait_timeout) != std::future_status::ready) {
        snap.id = a->id();
        snap.operations = ~std::uint64_t{0};  // reported as busy: not clean
      } else {
        snap = f.get();
      }
    }
    if (snap.operations != 0 || !snap.variables.empty()) report.streams.push_back(std::move(snap));
  }
  report.handles = backend_->memory_stats().tensors;
  return report;
}

Status Device::check_memory_leaks() {
  MemoryReport r = memory_report();
  if (r.clean()) return Status::Ok();
  return make_error(ErrorCode::Execution, "memory check failed:" + r.to_string());
}

StreamStats Device::totals() const {
  MutexLock lock(streams_mu_);
  StreamStats sum = closed_totals_;
  for (const StreamActor* a : live_actors_) add_counters(sum, a->stats());
  return sum;
}

std::optional<StreamStats> Device::stream_stats(StreamId stream) const {
  StreamTable::const_accessor a;
  if (!streams_.find(a, stream.value())) return std::nullopt;
  return a->second->stats();
}

Status Device::shutdown() {
  MutexLock lock(shutdown_mu_);
  if (shut_down_) return Status::Ok();
  shut_down_ = true;
  // 1. Refuse new streams and snapshot the table (under the creation lock), drain every stream
  //    (bounded waits), then refuse new commands.
  std::vector<StreamActor*> actors;
  {
    MutexLock streams_lock(streams_mu_);
    closed_.store(true, std::memory_order_release);
    actors = live_actors_;
  }
  std::string problems;
  bool timed_out = false;
  for (StreamActor* a : actors) {
    DrainCmd cmd;
    cmd.report_failure = false;  // the clients' syncs report their failures, not the shutdown
    std::future<Status> f = cmd.done.get_future();
    Status st = a->submit(std::move(cmd));
    if (st.ok()) {
      if (f.wait_for(options_.wait_timeout) != std::future_status::ready) {
        spdlog::warn("kiln runtime: shutdown: stream {} did not drain within {} ms; cancelling it", a->id().value(),
                     options_.wait_timeout.count());
        timed_out = true;
        problems += " stream " + std::to_string(a->id().value()) + " timed out;";
      } else if (Status r = f.get(); !r.ok()) {
        problems += " " + r.error().message + ";";
      }
    }
  }
  for (StreamActor* a : actors) a->close();
  // 2. Join every thread. A stream that did not drain is abandoned: stop() makes the pool drop
  //    the handlers it has not started (a running handler still finishes).
  if (timed_out) pool_.stop();
  pool_.join();
  // 3. Whatever was submitted while we were draining (or abandoned) completes with an error.
  std::size_t cancelled = 0;
  for (StreamActor* a : actors) cancelled += a->cancel_pending("device shutdown");
  if (cancelled != 0) problems += " " + std::to_string(cancelled) + " command(s) cancelled;";
  if (problems.empty()) return Status::Ok();
  return make_error(ErrorCode::Execution, "device shutdown:" + problems);
}

}  // namespace kiln::runtime
