#include "kiln/runtime/stream_actor.h"

#include <algorithm>
#include <chrono>

#include <exception>
#include <type_traits>
#include <utility>

#include <spdlog/spdlog.h>
#include <boost/asio/post.hpp>

#include "kiln/base/cpu_relax.h"
#include "kiln/ir/builders.h"

namespace kiln::runtime {
namespace {

template <class... F>
struct Overloaded : F... {
  using F::operator()...;
};
template <class... F>
Overloaded(F...) -> Overloaded<F...>;

// What a reporting drain answers for an execution failure: the root cause, the op it happened in
// (the root's context) and how many ops were skipped because of it, under the root's code.
Error failure_error(StreamId id, const ir::TensorError& e) {
  Error err = e.to_error();
  err.message = "stream " + std::to_string(id.value()) + ": " + err.message;
  if (e.root && e.root->has_context()) err.message += "; the failed operation: " + e.root->context();
  return err;
}

Error internal_error(StreamId id, const char* what, const std::exception& e) {
  return make_error(ErrorCode::Internal,
                    std::string("stream ") + std::to_string(id.value()) + ": " + what + " threw: " + e.what());
}

}  // namespace

StreamActor::StreamActor(StreamId id, ActorContext ctx, boost::asio::thread_pool& pool)
    : id_(id),
      ctx_(ctx),
      strand_(boost::asio::make_strand(pool.get_executor())),
      executor_(ctx.backend->make_executor()),
      stream_(ctx.backend->fusers(*ctx.log, ctx.fusers), ctx.processor, *ctx.log),
      foreign_(kForeignReserve) {}

StreamActor::~StreamActor() {
  // Cancelling builds error values (allocation) and logs: a destructor must not throw. Out of
  // memory, the command being cancelled is deleted (its waiter sees a broken promise) and the
  // rest stay unanswered, as when a holder is stuck (their waiters time out).
  try {
    (void)cancel_pending("the stream was destroyed");
  } catch (...) {
  }
  Command* c = nullptr;
  while (recycled_.pop(c)) delete c;
}

void StreamActor::claim_owner() {
  std::thread::id none{};
  // acq_rel: a later is_owner() load on this thread sees its own claim; relaxed failure.
  (void)owner_.compare_exchange_strong(none, std::this_thread::get_id(), std::memory_order_acq_rel,
                                       std::memory_order_relaxed);
}

bool StreamActor::is_owner() const {
  // acquire: pairs with the claim's release (the owner only ever compares with itself; other
  // threads only need to see "not me", which any value gives).
  return owner_.load(std::memory_order_acquire) == std::this_thread::get_id();
}

Status StreamActor::submit(Command cmd) {
  if (closed_.load(std::memory_order_acquire))
    return make_error(ErrorCode::Execution, "stream " + std::to_string(id_.value()) + ": the device is shut down");
  claim_owner();  // an explicit stream's first submitter becomes its intake producer
  return push(new Command(std::move(cmd)));
}

Status StreamActor::submit_op(ir::Operation&& op, bool wake) {
  if (closed_.load(std::memory_order_acquire))
    return make_error(ErrorCode::Execution, "stream " + std::to_string(id_.value()) + ": the device is shut down");
  claim_owner();
  // The owner (the only consumer of recycled_) reuses a command the actor has run.
  Command* cmd = nullptr;
  if (!is_owner() || !recycled_.pop(cmd)) cmd = new Command(std::in_place_type<RegisterOpCmd>);
  std::get<RegisterOpCmd>(*cmd).op = std::move(op);
  return push(cmd, wake);
}

Status StreamActor::submit_drop(const ir::TensorIr& t, bool wake) {
  ir::TensorIr rw = t;
  rw.status = ir::TensorStatus::ReadWrite;
  if (is_owner()) {
    Result<ir::Operation> op = ir::build::drop(rw);
    if (!op.ok()) return op.error();
    return submit_op(std::move(op).value(), wake);
  }
  if (closed_.load(std::memory_order_acquire))
    return make_error(ErrorCode::Execution, "stream " + std::to_string(id_.value()) + ": the device is shut down");
  return push(new Command(ForeignDropCmd{rw}), wake);
}

Status StreamActor::push(Command* cmd, bool wake) {
  const bool lazy_registration = ctx_.wake_after > 1 && is_owner() && std::holds_alternative<RegisterOpCmd>(*cmd);
  if (is_owner()) {
    enqueued_.store(enqueued_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    // Full ring: wake the actor and yield until it makes room (bounded memory per stream).
    while (!intake_.push(cmd)) {
      if (closed_.load(std::memory_order_acquire)) {
        // The device is shutting down: this command may never run; refuse it.
        std::unique_ptr<Command> lost(cmd);
        return make_error(ErrorCode::Execution,
                          "stream " + std::to_string(id_.value()) + ": the device shut down with the intake full");
      }
      schedule();
      std::this_thread::yield();
    }
  } else {
    foreign_enqueued_.fetch_add(1, std::memory_order_relaxed);
    (void)foreign_.push(cmd);  // may allocate a node; false only on allocation failure (throws first)
    foreign_count_.fetch_add(1, std::memory_order_release);
  }
  if (!wake) return Status::Ok();
  // Up to wake_after - 1 registrations in a row leave the actor asleep (a lone core: the next
  // wait runs the backlog inline); every other command wakes it. (`cmd` may be run and gone by
  // now: only what was read before the push decides.)
  if (lazy_registration) {
    if (++unwoken_registrations_ < ctx_.wake_after) return Status::Ok();
    unwoken_registrations_ = 0;
  }
  schedule();
  return Status::Ok();
}

void StreamActor::wake() {
  if (intake_.read_available() > 0 || foreign_count_.load(std::memory_order_acquire) > 0) schedule();
}

void StreamActor::schedule() {
  // acq_rel: release publishes our push to the actor that clears the flag (its exchange reads
  // ours); acquire orders us after the actor's previous clear.
  if (!scheduled_.exchange(true, std::memory_order_acq_rel)) {
    count_busy(+1);
    post_turn();
  }
}

bool StreamActor::alone_on_device() const {
  // Relaxed hints: a wrong answer costs one extra re-post or one batch of delay, never a command.
  if (ctx_.turns_waiting != nullptr && ctx_.turns_waiting->load(std::memory_order_relaxed) > 0) return false;
  return ctx_.busy_streams == nullptr || ctx_.busy_streams->load(std::memory_order_relaxed) <= 1;
}

void StreamActor::count_busy(std::int64_t delta) {
  if (ctx_.busy_streams) ctx_.busy_streams->fetch_add(delta, std::memory_order_relaxed);
}

void StreamActor::post_turn() {
  turns_in_flight_.fetch_add(1, std::memory_order_relaxed);
  if (ctx_.turns_waiting) ctx_.turns_waiting->fetch_add(1, std::memory_order_relaxed);
  boost::asio::post(strand_, [this] { run_turn(); });
}

bool StreamActor::has_work() const {
  // read_available: consumer-side, acquire load of the write index.
  return intake_.read_available() > 0 || foreign_count_.load(std::memory_order_acquire) > 0;
}

namespace {
// How long cancel_pending waits for whoever holds the stream (a turn or inline waiter).
constexpr std::chrono::seconds kCancelWait{30};
}  // namespace

bool StreamActor::acquire_running() {
  bool expected = false;
  // acq_rel: acquire what the previous holder did with the stream's state; relaxed failure.
  return running_.compare_exchange_strong(expected, true, std::memory_order_acq_rel, std::memory_order_relaxed);
}

void StreamActor::release_running() { running_.store(false, std::memory_order_release); }

bool StreamActor::try_run_inline(Command& cmd) {
  if (!ctx_.inline_waits || closed_.load(std::memory_order_acquire)) return false;
  // Only a short backlog while a turn is scheduled: a long one then means the actor lags a
  // producer that is still running ahead (a pipelined loop); its turn is about to start or
  // already warm, and moving that work onto the caller's thread would only serialize it there.
  // An unscheduled backlog is registrations whose wake-up was deferred (register_op_deferred):
  // no turn is coming for them, so the waiter runs them, however many.
  if (scheduled_.load(std::memory_order_acquire) &&
      intake_.read_available() +
              static_cast<std::size_t>(std::max<std::int64_t>(0, foreign_count_.load(std::memory_order_relaxed))) >
          kInlineBacklog)
    return false;
  if (!acquire_running()) return false;
  if (closed_.load(std::memory_order_acquire)) {  // closed between the check above and now
    release_running();
    return false;
  }
  // Exactly what was queued before the call (the caller's own commands among it), in the
  // actor's order; later commands are left to the turn, so a flooding producer cannot hold us.
  std::size_t intake_left = intake_.read_available();
  std::int64_t foreign_left = foreign_count_.load(std::memory_order_acquire);
  Command* c = nullptr;
  while (foreign_left > 0 && foreign_.pop(c)) {
    foreign_count_.fetch_sub(1, std::memory_order_relaxed);
    --foreign_left;
    std::size_t visible = intake_.read_available();
    Command* o = nullptr;
    while (visible-- > 0 && intake_.pop(o)) {
      run_queued(o);
      if (intake_left > 0) --intake_left;
    }
    run_queued(c);
  }
  while (intake_left > 0 && intake_.pop(c)) {
    --intake_left;
    run_queued(c);
  }
  run(cmd);
  inline_runs_.store(inline_runs_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  end_of_turn();
  return true;
}

void StreamActor::end_of_turn() {
  release_running();
  // The wake-up protocol's clear and re-check (see the header). Whoever releases the stream runs
  // it, a turn or an inline waiter: a turn that found the stream held returned without running,
  // and work its producer queued without posting (the flag was set) is seen here.
  if (scheduled_.exchange(false, std::memory_order_acq_rel)) count_busy(-1);
  if (has_work() && !scheduled_.exchange(true, std::memory_order_acq_rel)) {
    count_busy(+1);
    post_turn();
  }
}

void StreamActor::run_queued(Command* c) {
  std::unique_ptr<Command> cmd(c);
  run(*cmd);
  // A registration goes back to the stream's owner for reuse (no malloc/free pair per op).
  if (std::holds_alternative<RegisterOpCmd>(*cmd) && recycled_.push(cmd.get())) (void)cmd.release();
}

void StreamActor::run_turn() {
  // Leaving, whichever way: the decrement is the turn's last touch of this actor (release: a
  // closer that sees 0 may destroy it). Declared first, so it runs after everything below.
  struct Leave {
    std::atomic<std::int64_t>& in_flight;
    ~Leave() { in_flight.fetch_sub(1, std::memory_order_release); }
  } leave{turns_in_flight_};
  if (ctx_.turns_waiting) ctx_.turns_waiting->fetch_sub(1, std::memory_order_relaxed);
  if (!acquire_running()) {
    // A waiter is running the stream inline; its end_of_turn() re-checks the queues and posts a
    // turn for anything left, so this one has nothing to do. (Or a close's cancel_pending holds
    // it: StreamActor::retire() then clears the busy flag this turn leaves set.)
    return;
  }
  turns_.store(turns_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  std::size_t processed = 0;  // in this batch
  bool ran = false;           // anything at all in this call (a batch restarted in place resets `processed`)
  auto run_owned = [this, &processed, &ran](Command* c) {
    run_queued(c);
    ++processed;
    ran = true;
  };
  int idle_polls = 0;
  answered_waiter_ = false;
  for (;;) {
    if (processed >= ctx_.drain_batch) {
      // Batch spent: re-post, handing the pool thread to the other strands' turns. When this is
      // the device's only busy stream, nothing waits for the thread, and a re-post would only
      // wake an idle pool thread (asio wakes one per post) to run the next turn elsewhere: the
      // next turn starts here instead (counted as a turn, not as deferred).
      if (!alone_on_device()) break;
      turns_.store(turns_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
      processed = 0;
    }
    Command* c = nullptr;
    // Foreign commands first, so that a busy owner cannot starve drops, reads and drains from
    // other threads (shutdown's drain among them).
    if (foreign_count_.load(std::memory_order_acquire) > 0 && foreign_.pop(c)) {
      foreign_count_.fetch_sub(1, std::memory_order_relaxed);
      // Whatever the foreign producer saw submitted before its push is visible now (its push
      // released, our pop acquired): register it first (see "Ordering" in the header). Only the
      // commands present now: a producer pushing without pause cannot keep us here.
      std::size_t visible = intake_.read_available();
      Command* o = nullptr;
      while (visible-- > 0 && intake_.pop(o)) run_owned(o);
      run_owned(c);
      continue;
    }
    if (intake_.pop(c)) {
      run_owned(c);
      idle_polls = 0;
      continue;
    }
    // A producer recording a program submits its next op within a microsecond or two: poll a
    // little before going idle (ActorContext::idle_polls). Not while another stream's turn waits
    // for a pool thread: polling would only delay it.
    // Nor right after answering a drain, read or share: its caller was blocked, and its thread
    // (or, over IPC, the daemon's session thread) needs the core now, not more ops from us.
    // (Whether this call ran anything, not this batch: a batch just restarted in place has run
    // nothing yet, and ending the turn there cost a post and a wake-up per batch.)
    if (ran && idle_polls < ctx_.idle_polls && !answered_waiter_ &&
        (ctx_.turns_waiting == nullptr || ctx_.turns_waiting->load(std::memory_order_relaxed) == 0)) {
      ++idle_polls;
      cpu_relax();
      continue;
    }
    break;
  }
  if (processed >= ctx_.drain_batch) {
    // Batch spent: yield the pool thread to other strands; the flag stays set (we are still
    // "scheduled"), so producers do not post a second turn.
    deferred_.store(deferred_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    release_running();
    post_turn();
    return;
  }
  end_of_turn();
}

std::size_t StreamActor::drain_now() {
  drains_.store(drains_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  return stream_.drain(*ctx_.store, *executor_);
}

void StreamActor::run(Command& command) {
  DeviceBackend& backend = *ctx_.backend;
  std::uint64_t executed = 0;
  bool finished = false;
  // Counters are published before a completion is fulfilled, so that a waiter reads them exact.
  auto finish = [&] {
    finished = true;
    // A waiter that sleeps needs the core now; one that spins already has its own.
    answered_waiter_ =
        std::visit(Overloaded{[](const RegisterOpCmd&) { return false; }, [](const ForeignDropCmd&) { return false; },
                              [](const auto& c) { return !c.waiter_spins; }},
                   command);
    commands_->store(commands_->load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    if (executed != 0) executed_.store(executed_.load(std::memory_order_relaxed) + executed, std::memory_order_relaxed);
    publish_stats();
  };
  std::visit(Overloaded{
                 [&](RegisterOpCmd& c) {
                   try {
                     executed += stream_.register_op(std::move(c.op), *ctx_.store, *executor_);
                   } catch (const std::exception& e) {
                     spdlog::error("kiln runtime: {}", internal_error(id_, "register_op", e).to_string());
                   }
                 },
                 [&](DrainCmd& c) {
                   Status st;
                   try {
                     executed += drain_now();
                     if (c.report_failure)
                       if (std::optional<ir::TensorError> failed = executor_->take_failure())
                         st = failure_error(id_, *failed);
                   } catch (const std::exception& e) {
                     st = internal_error(id_, "drain", e);
                   }
                   finish();
                   c.done.set_value(std::move(st));
                 },
                 [&](ReadCmd& c) {
                   Result<HostData> out = make_error(ErrorCode::Internal, "read: not served");
                   try {
                     // docs/spec/fusion.md §16.4 read_plan / read / mark_read (the rules in fusion/multi_stream.h).
                     const fusion::ReadPlan plan =
                         fusion::read_plan(&stream_.queue(), c.tensor, backend.is_materialized(c.tensor.id));
                     if (plan == fusion::ReadPlan::Drain) executed += drain_now();  // its producer is still queued
                     out = backend.download(fusion::serve_read(stream_.queue(), c.tensor, plan));
                   } catch (const std::exception& e) {
                     out = internal_error(id_, "read", e);
                   }
                   finish();
                   c.done.set_value(std::move(out));
                 },
                 [&](ForeignDropCmd& c) {
                   try {
                     // §16.5 foreign_drop; the fallback drains and queues the Drop.
                     if (backend.is_materialized(c.tensor.id)) {
                       if (!fusion::defer_foreign_drop(stream_.queue(), c.tensor)) backend.free(c.tensor);
                     } else {
                       executed += drain_now();
                       Result<ir::Operation> op = ir::build::drop(c.tensor);
                       if (op.ok()) executed += stream_.register_op(std::move(op).value(), *ctx_.store, *executor_);
                     }
                   } catch (const std::exception& e) {
                     spdlog::error("kiln runtime: {}", internal_error(id_, "foreign drop", e).to_string());
                   }
                 },
                 [&](ShareCmd& c) {
                   Status st;
                   try {
                     if (!backend.is_materialized(c.src)) executed += drain_now();  // the producer runs now
                     st = backend.alias(c.src, c.dst);
                   } catch (const std::exception& e) {
                     st = internal_error(id_, "shared view", e);
                   }
                   finish();
                   c.done.set_value(std::move(st));
                 },
             },
             command);
  if (!finished) finish();
}

void StreamActor::publish_stats() {
  const fusion::ProcessorStats& p = stream_.processor().stats();
  pending_ops_.store(stream_.queue().size(), std::memory_order_relaxed);
  cache_hits_.store(p.cache_hits, std::memory_order_relaxed);
  explorations_.store(p.explorations, std::memory_order_relaxed);
  plans_created_.store(p.plans_created, std::memory_order_relaxed);
  fused_blocks_.store(p.fused_blocks, std::memory_order_relaxed);
  unfused_ops_.store(p.unfused_ops, std::memory_order_relaxed);
}

StreamStats StreamActor::stats() const {
  StreamStats s;
  s.enqueued = enqueued_.load(std::memory_order_relaxed) + foreign_enqueued_.load(std::memory_order_relaxed);
  s.commands = commands_->load(std::memory_order_relaxed);
  s.executed = executed_.load(std::memory_order_relaxed);
  s.deferred = deferred_.load(std::memory_order_relaxed);
  s.turns = turns_.load(std::memory_order_relaxed);
  s.drains = drains_.load(std::memory_order_relaxed);
  s.inline_runs = inline_runs_.load(std::memory_order_relaxed);
  s.pending_ops = pending_ops_.load(std::memory_order_relaxed);
  s.cache_hits = cache_hits_.load(std::memory_order_relaxed);
  s.explorations = explorations_.load(std::memory_order_relaxed);
  s.plans_created = plans_created_.load(std::memory_order_relaxed);
  s.fused_blocks = fused_blocks_.load(std::memory_order_relaxed);
  s.unfused_ops = unfused_ops_.load(std::memory_order_relaxed);
  s.awake = scheduled_.load(std::memory_order_acquire);
  return s;
}

template <class F>
void StreamActor::post_exclusive(F fn) {
  // Counted as a waiting turn, so that a turn running batch after batch in place (the stream
  // alone on its device) re-posts and lets it in.
  if (ctx_.turns_waiting) ctx_.turns_waiting->fetch_add(1, std::memory_order_relaxed);
  boost::asio::post(strand_, [this, fn = std::move(fn)]() mutable {
    if (ctx_.turns_waiting) ctx_.turns_waiting->fetch_sub(1, std::memory_order_relaxed);
    if (!acquire_running()) {  // an inline waiter holds the stream: after it
      std::this_thread::yield();
      post_exclusive(std::move(fn));
      return;
    }
    // fn runs holding the stream and returns what to deliver once it is let go: a delivered
    // promise may let its waiter destroy this actor (close_stream after quiesce), so nothing of
    // `this` may be touched after it.
    auto deliver = fn();
    release_running();
    deliver();
  });
}

bool StreamActor::wait_turns_out(std::chrono::milliseconds limit) const {
  const auto give_up = std::chrono::steady_clock::now() + limit;
  for (int round = 0; turns_in_flight_.load(std::memory_order_acquire) != 0; ++round) {
    if (std::chrono::steady_clock::now() >= give_up) return false;
    // Yield first (the turn is normally next on a pool thread), then sleep: a turn stuck in a
    // kernel must not have the closer spin on a core for the whole limit.
    if (round < 64)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

void StreamActor::retire() {
  if (scheduled_.exchange(false, std::memory_order_acq_rel)) count_busy(-1);
}

std::future<void> StreamActor::quiesce() {
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> f = done->get_future();
  // The strand runs handlers in order: this one runs after every turn already posted, and it
  // holds the stream, so no inline waiter is running either.
  post_exclusive([done] { return [done] { done->set_value(); }; });
  return f;
}

StreamSnapshot StreamActor::snapshot_now() const {
  StreamSnapshot snap;
  snap.id = id_;
  snap.operations = stream_.queue().size();
  snap.cursor = stream_.cursor();
  for (const auto& [id, status] : stream_.queue().variables()) snap.variables.emplace_back(id, status);
  std::sort(snap.variables.begin(), snap.variables.end());
  return snap;
}

std::future<StreamSnapshot> StreamActor::snapshot() {
  auto done = std::make_shared<std::promise<StreamSnapshot>>();
  std::future<StreamSnapshot> f = done->get_future();
  post_exclusive(
      [this, done] { return [done, snap = snapshot_now()]() mutable { done->set_value(std::move(snap)); }; });
  return f;
}

std::size_t StreamActor::cancel_pending(const std::string& reason) {
  close();
  // The queues have one consumer at a time: wait out whoever holds the stream, above all an
  // inline waiter that got it before close() and may be running a long deferred backlog
  // (try_run_inline checks closed_ first, so no new one comes; turns hold running_ too).
  // Bounded: a holder stuck in a kernel must not hang shutdown; its commands are then left
  // (their waiters time out on their own) rather than popped under it.
  const auto give_up = std::chrono::steady_clock::now() + kCancelWait;
  while (!acquire_running()) {
    if (std::chrono::steady_clock::now() >= give_up) {
      spdlog::warn("kiln runtime: stream {}: still running after {} s; its queued commands are not cancelled",
                   id_.value(), kCancelWait.count());
      return 0;
    }
    std::this_thread::yield();
  }
  std::size_t n = 0;
  auto cancel = [&](Command* c) {
    std::unique_ptr<Command> cmd(c);
    ++n;
    Error err = make_error(ErrorCode::Execution, "stream " + std::to_string(id_.value()) + ": cancelled: " + reason);
    // What a cancelled op consumed, and a cancelled drop's tensor, are released now: no one
    // names them again (their last use was this command), so nothing else would ever free them.
    // An id that never materialized (another cancelled op's output) is a no-op.
    auto release = [&](const ir::TensorIr& t) {
      try {
        ctx_.backend->free(t);
      } catch (const std::exception& e) {  // cancel_pending also runs in the destructor
        spdlog::error("kiln runtime: {}",
                      internal_error(id_, "release of a cancelled command's tensor", e).to_string());
      }
    };
    std::visit(Overloaded{
                   [&](RegisterOpCmd& r) {
                     for (const ir::TensorIr& in : r.op.inputs())
                       if (in.status == ir::TensorStatus::ReadWrite) release(in);
                   },
                   [&](DrainCmd& d) { d.done.set_value(err); },
                   [&](ReadCmd& r) { r.done.set_value(err); },
                   [&](ForeignDropCmd& d) { release(d.tensor); },
                   [&](ShareCmd& s) { s.done.set_value(err); },
               },
               *cmd);
  };
  Command* c = nullptr;
  while (intake_.pop(c)) cancel(c);
  while (foreign_.pop(c)) {
    // Counted down like a turn's pop: a count left above zero made has_work() true for good, and
    // every later turn re-posted itself (a closed stream's turns never ended).
    foreign_count_.fetch_sub(1, std::memory_order_relaxed);
    cancel(c);
  }
  release_running();
  return n;
}

}  // namespace kiln::runtime
