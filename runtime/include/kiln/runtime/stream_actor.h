// StreamActor: one stream of a device as an actor (architecture "Concurrency model"): an
// asio::strand on the device's thread pool, lock-free intake queues, and the stream's
// fusion::FusionStream (queue + processor), which only the strand ever touches.
//
// Thread-safety contract, per member:
//   * submit(), submit_drop(), claim_owner(), stats(), id(): any thread.
//   * The intake SPSC queue has exactly one producer: the stream's *owner* thread (the thread
//     whose implicit stream this is, or, for an explicit stream, the first thread that submits).
//     Every other thread pushes to the `foreign_` MPMC queue. Both have one consumer: the strand.
//   * stream_, executor_ and everything they hold: only by the holder of `running_`: a strand
//     turn (run_turn), a strand handler (snapshot, quiesce), or a client thread about to block on
//     a drain/read/share that found no turn running (try_run_inline, "caller runs"). Holders
//     hand over with acq_rel, so they see each other's work as consecutive turns would.
//   * close()/cancel_pending(): the device, at shutdown (cancel_pending after the pool joined)
//     and at close_stream (after quiesce(), the pool running; cancel_pending holds `running_`).
//
// Wake-up protocol (no lost wake-up; normally one turn queued or running at a time):
//   producer:  push(cmd)                                    [queue's release store]
//              if (!scheduled_.exchange(true, acq_rel)) post(strand, run_turn)
//   actor:     run at most drain_batch commands; if the batch ran out, re-post (flag stays true)
//              — or, when no other stream of the device is busy and no turn waits for a pool
//              thread, start the next turn in place; else scheduled_.exchange(false, acq_rel),
//              then re-check both queues and, if one has work, claim the flag again
//              (exchange(true)) and re-post.
//   Every flip of scheduled_ is counted in ActorContext::busy_streams (+1 on false→true, -1 on
//   true→false): the device-wide number of busy streams that waiters and actors consult.
//   The clear is an RMW, not a plain store: if a producer's exchange(true) came first in the
//   flag's modification order, the actor's exchange(false) reads it and synchronizes with it
//   (acquire), so the producer's push is visible to the re-check; if it came after, the
//   producer reads false and posts. Either way the command is seen.
//   Inline waiters (try_run_inline) take `running_` instead of waiting for a turn; a turn that
//   starts while one holds it returns at once, and the waiter runs the clear and re-check above
//   when it lets go (end_of_turn), so its leftover work gets a turn. The clear may let a producer
//   post a second turn while one is still queued; the strand runs them one after the other and
//   the later one finds little or nothing to do.
//
// Ordering: commands from one thread run in the order that thread submitted them (each thread
// uses exactly one of the two queues). A foreign command is run only after every intake command
// visible when it was popped (the actor empties the intake again right after popping a foreign
// command): what happened before a foreign push (e.g. the owner registering the last use of a
// tensor that another thread then drops) is registered before the foreign command runs.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include <boost/asio/strand.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/lockfree/queue.hpp>
#include <boost/lockfree/spsc_queue.hpp>

#include "kiln/fusion/fusers.h"
#include "kiln/fusion/multi_stream.h"
#include "kiln/fusion/plan_store.h"
#include "kiln/fusion/stream.h"
#include "kiln/runtime/backend.h"

namespace kiln::runtime {

using fusion::StreamId;

// ---- Commands --------------------------------------------------------------------------------

// Register one operation (Lazy processing).
struct RegisterOpCmd {
  ir::Operation op;
};
// RegisterOpCmd is built in place on the heap (StreamActor::submit_op): an ir::Operation is ~600 B
// of inline small vectors, and every move of it on the op path shows in the cache-hit figure.
// Sync: execute everything queued (docs/spec/fusion.md §16.3 drain). With report_failure, the answer is
// the first execution failure of the stream since the last such drain (naming the failed op), if
// any; without, failures stay for the next reporting drain (an ordering drain: a cross-stream
// dependency, a close, a daemon's re-home).
struct DrainCmd {
  std::promise<Status> done;
  bool waiter_spins = false;  // its caller spins for the answer (Device::wait) instead of sleeping
  bool report_failure = true;
};
// Read a tensor whose home is this stream (§16.4: drain only if not produced yet).
struct ReadCmd {
  ir::TensorIr tensor;
  std::promise<Result<HostData>> done;
  bool waiter_spins = false;
};
// A drop issued by a thread other than the owner (§16.5 register_foreign_drop).
struct ForeignDropCmd {
  ir::TensorIr tensor;
};
// The drain half + alias of a cross-stream shared view (§16.5 tag_shared_view).
struct ShareCmd {
  ir::TensorId src;
  ir::TensorId dst;
  std::promise<Status> done;
  bool waiter_spins = false;
};
using Command = std::variant<RegisterOpCmd, DrainCmd, ReadCmd, ForeignDropCmd, ShareCmd>;

// What an actor needs from its device; all of it outlives the actor.
inline constexpr int kDefaultTurnIdlePolls = 256;

struct ActorContext {
  DeviceBackend* backend = nullptr;
  fusion::ExecutionPlanStore* store = nullptr;
  const fusion::FusionLog* log = nullptr;
  fusion::ProcessorOptions processor;
  fusion::FuserOptions fusers;
  std::size_t drain_batch = 64;
  // Pauses a turn polls for its producer's next op before it ends, when it ran anything and no
  // other turn waits: a producer recording a program submits its next op within a microsecond or
  // two, and the poll saves a post and a thread wake-up on each side (a futex round trip of
  // several µs). 256 pauses are ~1 µs on older x86 cores, ~7 µs on AMD Zen and ~12 µs on Intel
  // since Skylake (a pause there is ~140 cycles).
  int idle_polls = kDefaultTurnIdlePolls;
  // Turns posted to the device's pool and not started yet, over all its actors: an actor polls
  // for its producer's next op only while no other stream's turn is waiting for the thread.
  std::atomic<std::int64_t>* turns_waiting = nullptr;
  // Streams of the device with a turn posted or running (their `scheduled` flag set): a waiter
  // spins for its answer only while no stream but its own is busy (Device::wait).
  std::atomic<std::int64_t>* busy_streams = nullptr;
  // A waiting caller may run the stream's commands itself when no turn is running (see
  // StreamActor::try_run_inline); false keeps every command on the pool threads.
  bool inline_waits = true;
  // Registrations queued before an owner's push wakes the actor (RuntimeOptions::wake_after);
  // other commands always wake it. > 1 only with inline_waits, which runs an unwoken backlog.
  std::size_t wake_after = 1;
};

// A snapshot of the actor's counters (relaxed reads; exact after a completed drain/read of the
// stream, which synchronizes through its promise).
struct StreamStats {
  std::uint64_t enqueued = 0;       // commands submitted
  std::uint64_t commands = 0;       // commands run
  std::uint64_t executed = 0;       // operations executed by the backend
  std::uint64_t deferred = 0;       // turns that hit drain_batch and re-posted with work left
  std::uint64_t turns = 0;          // strand handlers run
  std::uint64_t drains = 0;         // Sync passes (drain commands, draining reads, shares, drops)
  std::uint64_t inline_runs = 0;    // drains, reads and shares run on the waiting caller's thread
  std::uint64_t pending_ops = 0;    // operations queued, not executed yet
  std::uint64_t cache_hits = 0;     // processor: cached plans executed
  std::uint64_t explorations = 0;   // processor: explorations completed
  std::uint64_t plans_created = 0;  // processor: plans this stream added to the store
  std::uint64_t fused_blocks = 0;   // processor: fused blocks its plans ran (one launch each)
  std::uint64_t unfused_ops = 0;    // processor: operations its plans ran one by one
  bool awake = false;               // a turn is posted or running (the wake-up flag is set)
};

// One stream's fusion state as the memory check sees it (docs/spec/fusion.md §16.8): the operations still
// queued, the cursor, and every tensor the queue tracks with its last status.
struct StreamSnapshot {
  StreamId id{0};
  std::uint64_t operations = 0;
  std::uint64_t cursor = 0;
  std::vector<std::pair<ir::TensorId, ir::TensorStatus>> variables;  // sorted by id
};

class StreamActor {
 public:
  // Intake ring capacity (commands): one page of pointers; a producer that runs 512 ops ahead
  // of its actor yields until the actor catches up, which bounds a stream's queued memory.
  static constexpr std::size_t kIntakeCapacity = 512;
  // Initial nodes of the foreign queue (drops, reads and shares from other threads are rare
  // next to registrations); it grows on demand.
  static constexpr std::size_t kForeignReserve = 64;
  // Most commands a waiter runs on its own thread before its own (try_run_inline).
  static constexpr std::size_t kInlineBacklog = 8;

  StreamActor(StreamId id, ActorContext ctx, boost::asio::thread_pool& pool);
  ~StreamActor();
  StreamActor(const StreamActor&) = delete;
  StreamActor& operator=(const StreamActor&) = delete;

  StreamId id() const { return id_; }
  // Any thread: whether a turn is posted or running (a hint; relaxed).
  bool scheduled() const { return scheduled_.load(std::memory_order_relaxed); }
  // Any thread: the count of commands run, shared so that a spinning waiter may keep reading it
  // after the actor is gone (close_stream may destroy it once the waiter's answer is in).
  std::shared_ptr<const std::atomic<std::uint64_t>> progress_counter() const { return commands_; }

  // Any thread: makes the calling thread the intake's producer if none is set yet.
  void claim_owner();
  // Any thread: queues a command and wakes the actor if idle. Fails only once closed.
  [[nodiscard]] Status submit(Command cmd);
  // The same for one operation, moved once, into the queued command.
  // wake = false leaves the actor asleep (a caller that knows more commands follow at once,
  // e.g. the daemon with messages still in a client's ring); it must call wake() or wait on the
  // stream (drain, read, share) afterwards, or the operation stays queued.
  [[nodiscard]] Status submit_op(ir::Operation&& op, bool wake = true);
  // Any thread: schedules a turn if commands are queued (after submits with wake = false).
  void wake();
  // Any thread, for a command whose caller is about to block on its promise (drain, read, shared
  // view): if no turn is running, runs on the calling thread every command queued before it,
  // then `cmd` itself, and returns true (the promise is then fulfilled). Returns false, leaving
  // `cmd` untouched, when a turn holds the stream (or inline runs are off): submit it instead.
  // A drain then costs no pool-thread wake-up and no futex wake of the waiter, which is most of a
  // one-op sync's latency. Mutual exclusion with turns is `running_`, so the stream's state is
  // still touched by one thread at a time, in submission order.
  bool try_run_inline(Command& cmd);
  // Any thread: a drop of a tensor whose home is this stream (docs/spec/fusion.md §16.7): from the owner a
  // Drop operation enters the queue; from any other thread it is a foreign drop (§16.5).
  // wake = false as for submit_op.
  [[nodiscard]] Status submit_drop(const ir::TensorIr& t, bool wake = true);

  StreamStats stats() const;

  // Device, at shutdown or close_stream: refuse new commands.
  void close() { closed_.store(true, std::memory_order_release); }
  // Device, at close_stream (after close()): a future ready once every handler posted to the
  // strand before this call has run, so that the actor can be destroyed.
  std::future<void> quiesce();
  // Device, memory report: the snapshot, taken on the strand.
  std::future<StreamSnapshot> snapshot();
  // The same without the strand: only when no handler can run (after the pool joined).
  StreamSnapshot snapshot_now() const;
  // Device, after the pool joined (shutdown) or after quiesce() (close_stream): completes every
  // command still queued with an error naming `reason`; registrations and drops are not run, but
  // the tensors they consumed are released (nothing else would free them); returns how many
  // commands there were.
  std::size_t cancel_pending(const std::string& reason);
  // Device, at close_stream after quiesce() and cancel_pending(): waits until no turn is posted
  // or running (a turn running when quiesce() was posted may have re-posted itself behind it);
  // false if one is still there after `limit` (stuck in a kernel: the actor must be kept).
  bool wait_turns_out(std::chrono::milliseconds limit) const;
  // Device, at close_stream once wait_turns_out() returned true: takes the actor's busy flag
  // out of the device's busy count if a turn left it set.
  void retire();

 private:
  bool is_owner() const;
  Status push(Command* cmd, bool wake = true);
  void schedule();
  void count_busy(std::int64_t delta);  // ActorContext::busy_streams, on a flip of scheduled_
  // No other stream of the device is busy and no turn waits for a pool thread.
  bool alone_on_device() const;
  void post_turn();
  void run_turn();
  bool acquire_running();
  void release_running();
  void end_of_turn();  // release the stream, then the wake-up protocol's clear and re-check
  // Posts `fn` to the strand to run while holding the stream (after any inline waiter); fn
  // returns a callable run after the stream is let go (delivering a result whose waiter may
  // destroy the actor).
  template <class F>
  void post_exclusive(F fn);
  void run(Command& cmd);
  // Runs a command popped from a queue and frees or recycles it.
  void run_queued(Command* c);
  std::size_t drain_now();
  bool has_work() const;
  void publish_stats();

  const StreamId id_;
  const ActorContext ctx_;
  boost::asio::strand<boost::asio::thread_pool::executor_type> strand_;

  // Strand-only state.
  bool answered_waiter_ = false;  // the last command run completed a promise someone waits on
  std::unique_ptr<fusion::Executor> executor_;
  fusion::FusionStream stream_;

  // Intake: single producer (owner_) / single consumer (strand). spsc_queue pads its read and
  // write indices onto separate cache lines itself.
  boost::lockfree::spsc_queue<Command*, boost::lockfree::capacity<kIntakeCapacity>> intake_;
  // Foreign commands: any producer / the strand consumes.
  boost::lockfree::queue<Command*> foreign_;
  // Intake registrations the actor has run, handed back to the owner for its next op: the
  // strand produces, the owner thread consumes (submit_op). Owned: deleted with the actor.
  boost::lockfree::spsc_queue<Command*, boost::lockfree::capacity<kIntakeCapacity>> recycled_;

  // The intake's producer thread; written once (CAS from the default id), read by producers.
  alignas(64) std::atomic<std::thread::id> owner_{};
  // Owner-thread-only: registrations pushed since the owner last woke the actor (wake_after).
  std::size_t unwoken_registrations_ = 0;
  // Foreign commands pushed and not popped yet: producers fetch_add(release) after their push,
  // the strand fetch_sub(relaxed) after each pop and load(acquire) in the re-check.
  alignas(64) std::atomic<std::int64_t> foreign_count_{0};
  std::atomic<std::uint64_t> foreign_enqueued_{0};  // on the line foreign producers write anyway
  // True while a turn is posted or running (see the protocol above).
  alignas(64) std::atomic<bool> scheduled_{false};
  // Turns posted and not finished: the last thing a turn touches is its decrement (run_turn).
  std::atomic<std::int64_t> turns_in_flight_{0};
  // True while one thread runs the stream's commands: a turn or an inline waiter. Everything the
  // strand-only state comment above says holds for whoever holds this flag (acq_rel hand-over).
  std::atomic<bool> running_{false};
  std::atomic<bool> closed_{false};

  // Counters, all relaxed. enqueued_ is the owner's alone: a plain load and store per op, not a
  // locked read-modify-write (a full barrier on x86); other producers count in foreign_enqueued_.
  // The rest are stored by the strand.
  alignas(64) std::atomic<std::uint64_t> enqueued_{0};
  // The strand's counters start a cache line of their own, away from enqueued_ (the owner's
  // store per op).
  alignas(64) std::atomic<std::uint64_t> executed_{0};
  // Commands run: a relaxed progress hint for spinning waiters (Device::wait) as well. The
  // pointer is read by the strand per command: on the strand's line, not the producer's.
  const std::shared_ptr<std::atomic<std::uint64_t>> commands_ = std::make_shared<std::atomic<std::uint64_t>>(0);
  std::atomic<std::uint64_t> deferred_{0};
  std::atomic<std::uint64_t> turns_{0};
  std::atomic<std::uint64_t> drains_{0};
  std::atomic<std::uint64_t> inline_runs_{0};
  std::atomic<std::uint64_t> pending_ops_{0};
  std::atomic<std::uint64_t> cache_hits_{0};
  std::atomic<std::uint64_t> explorations_{0};
  std::atomic<std::uint64_t> plans_created_{0};
  std::atomic<std::uint64_t> fused_blocks_{0};
  std::atomic<std::uint64_t> unfused_ops_{0};
};

}  // namespace kiln::runtime
