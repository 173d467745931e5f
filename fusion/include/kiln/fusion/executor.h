// The interface between the search and a backend: what the processor asks an executor to do
// when a plan runs (docs/spec/fusion.md §3.10, §15.2). Backends (CPU, CUDA) implement Executor; the
// fusion tests use a recording executor.
//
// Thread-safety: an Executor is called by one stream actor at a time for that stream.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <utility>

#include "kiln/fusion/fuser.h"
#include "kiln/ir/handle_error.h"
#include "kiln/ir/operation.h"
#include "kiln/ir/relative.h"

namespace kiln::fusion {

// What a fused optimization needs while it runs: the converter's maps (relative tensor id ->
// latest global TensorIr, relative dim id -> size, scalar and range placeholders -> values), and
// the global operations it covers, for fallbacks that replay them one by one.
class ExecutionContext {
 public:
  ExecutionContext(const ir::RelativeConverter& converter, std::span<const ir::Operation> global_ops,
                   std::span<const std::size_t> ordering)
      : converter_(converter), global_ops_(global_ops), ordering_(ordering) {}

  const ir::RelativeConverter& converter() const { return converter_; }
  // The i-th operation the optimization covers (queue position ordering[i]), global form.
  const ir::Operation& operation_within_optimization(std::size_t i) const { return global_ops_[ordering_[i]]; }
  std::span<const std::size_t> ordering() const { return ordering_; }

 private:
  const ir::RelativeConverter& converter_;
  std::span<const ir::Operation> global_ops_;
  std::span<const std::size_t> ordering_;
};

// The first failure an executor met since it was last asked: what a drain reports to its caller
// (the tensors keep their errors as docs/spec/ir.md §11 says; this only tells the sync that work failed).
class FirstFailure {
 public:
  void note(const ir::TensorError& e) {
    if (!first_) first_ = e;
  }
  std::optional<ir::TensorError> take() { return std::exchange(first_, std::nullopt); }

 private:
  std::optional<ir::TensorError> first_;
};

class Executor {
 public:
  virtual ~Executor() = default;
  // Runs one fused optimization. It fetches its inputs with the statuses of its relative trace
  // and registers its outputs under their global ids; it may fall back to running the covered
  // operations one by one through ctx.operation_within_optimization(i).
  virtual void execute_optimization(const Optimization& opt, const ExecutionContext& ctx) = 0;
  // Runs one operation alone (its global form).
  virtual void execute_operation(const ir::Operation& op) = 0;
  // drain_queue's free of an executed node (docs/spec/fusion.md §15.2): release the handle iff the
  // occurrence is ReadWrite (a no-op when a kernel already consumed it).
  virtual void free_tensor(const ir::TensorIr& t) = 0;
  // The first output this executor left Errored since the last call (a new failure, or an op
  // skipped because an input carried an earlier one), cleared by the call. An executor that
  // keeps no such record (a test's recording executor) returns nullopt.
  virtual std::optional<ir::TensorError> take_failure() { return std::nullopt; }
};

}  // namespace kiln::fusion
