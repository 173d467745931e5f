#include "kiln/fusion/operation_queue.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>

#include "kiln/fusion/execution_table.h"

namespace kiln::fusion {

void OperationQueue::add(ir::Operation&& global) {
  for (const ir::TensorIr& t : global.nodes()) variables_[t.id] = t.status;
  relative_.emplace_back();
  converter_.relativize_into(global, relative_.back());
  shapes_assigned_.push_back(converter_.num_relative_shapes());
  global_.push_back(std::move(global));
}

bool OperationQueue::references_tensor(ir::TensorId id) const {
  for (const ir::Operation& op : global_)
    for (const ir::TensorIr& t : op.nodes())
      if (t.id == id) return true;
  return false;
}

void OperationQueue::flush_deferred(Executor& executor) {
  if (deferred_frees_.empty()) return;
  std::vector<ir::TensorIr> keep;
  for (ir::TensorIr& t : deferred_frees_) {
    if (references_tensor(t.id)) {
      keep.push_back(std::move(t));
    } else {
      variables_.erase(t.id);
      executor.free_tensor(t);
    }
  }
  deferred_frees_ = std::move(keep);
}

void OperationQueue::execute_plan(PlanId id, const ExecutionPlan& plan, Executor& executor, const FusionLog& log) {
  const std::size_t len = plan.optimization.ordering.size();
  const std::size_t assigned = (len >= 1 && len - 1 < shapes_assigned_.size()) ? shapes_assigned_[len - 1] : 1;
  // Check 1: the plan bakes in a relative dim id this queue's prefix never assigned.
  if (auto m = plan.optimization.strategy.max_relative_shape_id(); m && *m >= assigned) {
    log.log(LogLevel::Medium, [&] {
      return fmt::format(
          "[plan] #{} needs relative shape id {} but the stream assigned {}; running its {} "
          "operations unfused",
          id, *m, assigned, len);
    });
    run(BlockOptimization::unfused(std::min(len, global_.size())), executor, log);
    return;
  }
  // Check 2 (0.22.1): the plan names a position past the queue.
  for (std::size_t p : plan.optimization.ordering) {
    if (p >= global_.size()) {
      const std::size_t n = std::min(len, global_.size());
      log.log(LogLevel::Medium, [&] {
        return fmt::format("[plan] #{} names operation {} but the queue holds {}; running {} operations unfused", id, p,
                           global_.size(), n);
      });
      run(BlockOptimization::unfused(n), executor, log);
      return;
    }
  }
  run(plan.optimization, executor, log);
}

namespace {

// Walks a strategy, returns how many operations ran.
std::size_t walk(const ExecutionStrategy& s, const OperationQueue& q, Executor& executor) {
  switch (s.kind()) {
    case ExecutionStrategy::Kind::Optimization: {
      ExecutionContext ctx(q.converter(), q.global(), s.ordering());
      executor.execute_optimization(*s.opt(), ctx);
      return s.opt()->len();
    }
    case ExecutionStrategy::Kind::Operations:
      for (std::size_t p : s.ordering()) executor.execute_operation(q.global()[p]);
      return s.ordering().size();
    case ExecutionStrategy::Kind::Composed: {
      std::size_t n = 0;
      for (const auto& c : s.children()) n += walk(c, q, executor);
      return n;
    }
  }
  return 0;
}

}  // namespace

void OperationQueue::run(const BlockOptimization& bo, Executor& executor, const FusionLog& log) {
  log.log(LogLevel::Full, [&] { return format_execution_table(trace_blocks(bo.strategy, global_)); });
  const std::size_t executed = walk(bo.strategy, *this, executor);
  assert(executed <= global_.size());
  drain(std::min(executed, global_.size()), executor);
}

void OperationQueue::drain(std::size_t n, Executor& executor) {
  for (std::size_t i = 0; i < n; ++i) {
    for (const ir::TensorIr& t : global_[i].nodes()) {
      if (t.status == ir::TensorStatus::ReadWrite) variables_.erase(t.id);
      executor.free_tensor(t);
    }
  }
  global_.erase(global_.begin(), global_.begin() + static_cast<std::ptrdiff_t>(n));
  relativize_all();
  flush_deferred(executor);
}

void OperationQueue::relativize_all() {
  converter_.clear();
  relative_.resize(global_.size());
  shapes_assigned_.clear();
  for (std::size_t i = 0; i < global_.size(); ++i) {
    converter_.relativize_into(global_[i], relative_[i]);
    shapes_assigned_.push_back(converter_.num_relative_shapes());
  }
}

}  // namespace kiln::fusion
