// MultiStream: the streams of one device and the rules that connect them (docs/spec/fusion.md §16.3–§16.6):
// registration, drains, reads (when a read drains, when a last-use read defers its free) and
// foreign drops (drops issued from another stream, which must neither enter nor cut the pending
// segment). Backend-neutral and single-threaded: it is Burn's server-actor view of the streams;
// the multi-threaded runtime applies the same per-stream rules (read_plan, serve_read,
// defer_foreign_drop below) from each stream's actor.
//
// Thread-safety: none; one owner at a time.
#pragma once

#include <compare>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <unordered_set>

#include "kiln/fusion/operation_queue.h"
#include "kiln/fusion/stream.h"
#include "kiln/fusion/stream_id.h"

namespace kiln::fusion {

// How a read is served (§16.4).
enum class ReadPlan : std::uint8_t {
  Drain,      // the tensor is not produced yet: drain its stream first
  Direct,     // materialized, and no queued op needs it after this read
  DeferFree,  // a last-use read of a tensor queued ops still reference: read it ReadOnly, free later
};
const char* read_plan_name(ReadPlan p);

// ---- The per-stream rules, the one implementation both MultiStream (single-threaded, the
// spec's view) and the runtime's stream actors (one per stream) apply.

// §16.4 read_plan: how a read of `t` is served on a stream whose queue is `queue` (null: the
// stream has nothing queued), given whether `t` has a materialized handle on the device.
ReadPlan read_plan(const OperationQueue* queue, const ir::TensorIr& t, bool materialized);
// §16.4 read + mark_read, after any drain the plan asked for: defers the free of a DeferFree
// read, and forgets a last-use read's variable. Returns the occurrence to read the data with
// (status ReadOnly when the free was deferred).
ir::TensorIr serve_read(OperationQueue& queue, const ir::TensorIr& t, ReadPlan plan);
// §16.5 foreign_drop of a materialized tensor: deferred when queued ops still read it (true:
// the queue frees it later), forgotten otherwise (false: the caller frees it now).
bool defer_foreign_drop(OperationQueue& queue, const ir::TensorIr& t);

class MultiStream {
 public:
  using FuserFactory = std::function<FuserList()>;
  // Whether a tensor has a materialized (Existing) handle on the device.
  using Presence = std::function<bool(ir::TensorId)>;

  MultiStream(FuserFactory fusers, ProcessorOptions options, const FusionLog& log, ExecutionPlanStore& store);

  // §16.3 register: appends to the stream (created on first use) and processes Lazily.
  void register_op(StreamId stream, ir::Operation op, Executor& executor);
  // §16.3 drain: executes everything queued on the stream; an execution boundary even when empty.
  void drain(StreamId stream, Executor& executor);

  ReadPlan read_plan(StreamId stream, const ir::TensorIr& t, const Presence& present) const;
  // Serves a read: drains or defers as read_plan says and returns the occurrence to fetch the
  // data with (status ReadOnly when the free was deferred), then removes a stream left without
  // variables (§16.6).
  ir::TensorIr read(StreamId stream, const ir::TensorIr& t, Executor& executor, const Presence& present);
  // §16.5 foreign_drop: true if handled without touching the segment.
  bool foreign_drop(StreamId stream, const ir::TensorIr& t, Executor& executor, const Presence& present);
  // A drop from another stream: handled directly, or drain + a queued Drop as the fallback.
  void register_foreign_drop(StreamId stream, const ir::TensorIr& t, Executor& executor, const Presence& present);
  // §16.5 tag_shared_view, the drain half: drains the source's stream the first time a not yet
  // materialized source is shared; returns whether it drained.
  bool prepare_shared_view(StreamId src_stream, ir::TensorId src, Executor& executor, const Presence& present);

  // Relative ops queued on a stream (empty if the stream does not exist).
  std::span<const ir::Operation> composition(StreamId stream) const;
  const FusionStream* stream(StreamId id) const;
  std::size_t num_streams() const { return streams_.size(); }
  bool is_shared_source(ir::TensorId id) const { return shared_sources_.count(id) != 0; }

 private:
  FusionStream& get_or_create(StreamId id);

  FuserFactory fusers_;
  ProcessorOptions options_;
  const FusionLog& log_;
  ExecutionPlanStore& store_;
  std::map<StreamId, std::unique_ptr<FusionStream>> streams_;
  std::unordered_set<ir::TensorId> shared_sources_;
};

}  // namespace kiln::fusion
