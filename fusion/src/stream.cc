#include "kiln/fusion/stream.h"

namespace kiln::fusion {

std::size_t FusionStream::register_op(ir::Operation&& op, ExecutionPlanStore& store, Executor& executor) {
  queue_.add(std::move(op));
  const std::size_t before = queue_.size();
  QueueSegment segment(queue_, executor, log_);
  processor_.process(segment, store, ExecutionMode::Lazy);
  const std::size_t executed = before - queue_.size();
  cursor_ += executed;
  return executed;
}

std::size_t FusionStream::drain(ExecutionPlanStore& store, Executor& executor) {
  const std::size_t n = queue_.size();
  QueueSegment segment(queue_, executor, log_);
  processor_.process(segment, store, ExecutionMode::Sync);
  cursor_ += n;
  queue_.flush_deferred(executor);
  return n;
}

}  // namespace kiln::fusion
