#include "kiln/fusion/multi_stream.h"

namespace kiln::fusion {

const char* read_plan_name(ReadPlan p) {
  switch (p) {
    case ReadPlan::Drain: return "Drain";
    case ReadPlan::Direct: return "Direct";
    case ReadPlan::DeferFree: return "DeferFree";
  }
  return "?";
}

MultiStream::MultiStream(FuserFactory fusers, ProcessorOptions options, const FusionLog& log, ExecutionPlanStore& store)
    : fusers_(std::move(fusers)), options_(options), log_(log), store_(store) {}

FusionStream& MultiStream::get_or_create(StreamId id) {
  auto it = streams_.find(id);
  if (it == streams_.end()) it = streams_.emplace(id, std::make_unique<FusionStream>(fusers_(), options_, log_)).first;
  return *it->second;
}

const FusionStream* MultiStream::stream(StreamId id) const {
  auto it = streams_.find(id);
  return it == streams_.end() ? nullptr : it->second.get();
}

std::span<const ir::Operation> MultiStream::composition(StreamId id) const {
  const FusionStream* s = stream(id);
  return s ? s->queue().relative() : std::span<const ir::Operation>{};
}

void MultiStream::register_op(StreamId stream, ir::Operation op, Executor& executor) {
  if (op.is_drop()) shared_sources_.erase(op.tensors[0].id);
  get_or_create(stream).register_op(std::move(op), store_, executor);
}

void MultiStream::drain(StreamId stream, Executor& executor) {
  auto it = streams_.find(stream);
  if (it == streams_.end()) return;
  it->second->drain(store_, executor);
}

ReadPlan read_plan(const OperationQueue* queue, const ir::TensorIr& t, bool materialized) {
  if (!materialized) return ReadPlan::Drain;  // its producer is still queued (or it is errored)
  if (t.status != ir::TensorStatus::ReadWrite) return ReadPlan::Direct;
  if (queue != nullptr && queue->references_tensor(t.id)) return ReadPlan::DeferFree;
  return ReadPlan::Direct;
}

ir::TensorIr serve_read(OperationQueue& queue, const ir::TensorIr& t, ReadPlan plan) {
  ir::TensorIr used = t;
  if (plan == ReadPlan::DeferFree) {
    queue.defer_free(t);
    used.status = ir::TensorStatus::ReadOnly;
  }
  if (used.status == ir::TensorStatus::ReadWrite) queue.forget_variable(used.id);
  return used;
}

bool defer_foreign_drop(OperationQueue& queue, const ir::TensorIr& t) {
  if (queue.references_tensor(t.id)) {
    queue.defer_free(t);
    return true;
  }
  queue.forget_variable(t.id);
  return false;
}

ReadPlan MultiStream::read_plan(StreamId stream, const ir::TensorIr& t, const Presence& present) const {
  const FusionStream* s = this->stream(stream);
  return fusion::read_plan(s ? &s->queue() : nullptr, t, present(t.id));
}

ir::TensorIr MultiStream::read(StreamId stream, const ir::TensorIr& t, Executor& executor, const Presence& present) {
  const ReadPlan plan = read_plan(stream, t, present);
  if (plan == ReadPlan::Drain) drain(stream, executor);
  auto it = streams_.find(stream);
  if (it == streams_.end()) return t;  // nothing queued, no variable to forget
  ir::TensorIr used = serve_read(it->second->queue(), t, plan);
  // §16.6 stream removal, after a last-use read.
  if (used.status == ir::TensorStatus::ReadWrite && it->second->queue().variables().empty()) streams_.erase(it);
  return used;
}

bool MultiStream::foreign_drop(StreamId stream, const ir::TensorIr& t, Executor& executor, const Presence& present) {
  if (!present(t.id)) return false;
  shared_sources_.erase(t.id);
  auto it = streams_.find(stream);
  if (it == streams_.end()) {
    executor.free_tensor(t);
    return true;
  }
  OperationQueue& q = it->second->queue();
  if (!defer_foreign_drop(q, t)) {
    executor.free_tensor(t);
    if (q.variables().empty()) streams_.erase(it);
  }
  return true;
}

void MultiStream::register_foreign_drop(StreamId stream, const ir::TensorIr& t, Executor& executor,
                                        const Presence& present) {
  if (foreign_drop(stream, t, executor, present)) return;
  drain(stream, executor);
  ir::Operation drop;
  drop.kind = ir::OpKind::Drop_Drop;
  drop.family = ir::Family::Drop;
  drop.num_inputs = 1;
  ir::TensorIr rw = t;
  rw.status = ir::TensorStatus::ReadWrite;
  drop.tensors = {rw};
  register_op(stream, std::move(drop), executor);
}

bool MultiStream::prepare_shared_view(StreamId src_stream, ir::TensorId src, Executor& executor,
                                      const Presence& present) {
  if (shared_sources_.count(src) || present(src)) return false;
  shared_sources_.insert(src);
  drain(src_stream, executor);
  return true;
}

}  // namespace kiln::fusion
