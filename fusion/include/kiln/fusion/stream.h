// FusionStream: one stream's queue and processor, the unit a stream actor drives
// (docs/spec/fusion.md §16.3 register / drain, without threads or cross-stream logic).
//
// Thread-safety: owned by one stream actor; shares only the (concurrent) plan store.
#pragma once

#include "kiln/fusion/operation_queue.h"
#include "kiln/fusion/processor.h"

namespace kiln::fusion {

class FusionStream {
 public:
  FusionStream(FuserList prototypes, ProcessorOptions options, const FusionLog& log)
      : log_(log), processor_(std::move(prototypes), options, log) {}

  // Appends a (global) operation and runs the processor in Lazy mode.
  // Returns how many operations executed as a consequence.
  std::size_t register_op(ir::Operation&& op, ExecutionPlanStore& store, Executor& executor);
  // The same with a copy of `op` (tests and tools replaying a recorded program).
  std::size_t register_op(const ir::Operation& op, ExecutionPlanStore& store, Executor& executor) {
    return register_op(ir::Operation(op), store, executor);
  }
  // Sync: executes everything queued; a drain is an execution boundary even for an empty queue.
  std::size_t drain(ExecutionPlanStore& store, Executor& executor);

  OperationQueue& queue() { return queue_; }
  const OperationQueue& queue() const { return queue_; }
  const Processor& processor() const { return processor_; }
  // Operations executed so far.
  std::uint64_t cursor() const { return cursor_; }

 private:
  const FusionLog& log_;
  OperationQueue queue_;
  Processor processor_;
  std::uint64_t cursor_ = 0;
};

}  // namespace kiln::fusion
