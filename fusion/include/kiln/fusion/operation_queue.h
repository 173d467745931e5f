// OperationQueue: one stream's pending operations in global and relative form (docs/spec/fusion.md §4),
// and the execution of plans and strategies against it (§15).
//
// Thread-safety: owned by one stream actor.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "kiln/base/flat_id_map.h"
#include "kiln/fusion/executor.h"
#include "kiln/fusion/fusion_log.h"
#include "kiln/fusion/plan_store.h"
#include "kiln/fusion/strategy.h"
#include "kiln/ir/relative.h"

namespace kiln::fusion {

class OperationQueue {
 public:
  // Appends an operation (global form) and its relative form (§4 add).
  void add(ir::Operation&& global);

  std::span<const ir::Operation> global() const { return global_; }
  std::span<const ir::Operation> relative() const { return relative_; }
  std::span<const std::size_t> shapes_assigned() const { return shapes_assigned_; }
  const ir::RelativeConverter& converter() const { return converter_; }
  std::size_t size() const { return global_.size(); }
  bool empty() const { return global_.empty(); }

  // True iff some queued global op has a node with this id.
  bool references_tensor(ir::TensorId id) const;
  // Last status seen for every referenced tensor (entries may outlive the ops).
  const FlatIdMap<ir::TensorId, ir::TensorStatus>& variables() const { return variables_; }
  void forget_variable(ir::TensorId id) { variables_.erase(id); }

  // Last-use frees requested from other threads, applied at the next execution boundary.
  void defer_free(const ir::TensorIr& t) { deferred_frees_.push_back(t); }
  const std::vector<ir::TensorIr>& deferred_frees() const { return deferred_frees_; }
  void flush_deferred(Executor& executor);

  // §15.1: runs a cached plan after the two safety checks (falling back to its operations
  // unfused in submission order when a check fails).
  void execute_plan(PlanId id, const ExecutionPlan& plan, Executor& executor, const FusionLog& log);
  // §15.2 run: executes a strategy whose covered positions are exactly 0..n-1, then drains them.
  void run(const BlockOptimization& bo, Executor& executor, const FusionLog& log);

 private:
  // Removes the first n ops, frees their ReadWrite nodes, re-relativizes the rest (§3.9).
  void drain(std::size_t n, Executor& executor);
  void relativize_all();

  std::vector<ir::Operation> global_;
  std::vector<ir::Operation> relative_;
  std::vector<std::size_t> shapes_assigned_;
  ir::RelativeConverter converter_;
  // Flat: every op inserts its outputs and erases its consumed inputs (no node per entry).
  FlatIdMap<ir::TensorId, ir::TensorStatus> variables_;
  std::vector<ir::TensorIr> deferred_frees_;
};

}  // namespace kiln::fusion
