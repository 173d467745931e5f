#include "kiln/fusion/processor.h"

#include <fmt/format.h>

#include <cassert>

namespace kiln::fusion {

Processor::Processor(FuserList prototypes, ProcessorOptions options, const FusionLog& log)
    : log_(log),
      tag_(options.tag),
      explorer_(std::move(prototypes), options.max_blocks, options.max_explorations, log) {}

void Processor::process(Segment& segment, ExecutionPlanStore& store, ExecutionMode mode) {
  if (mode == ExecutionMode::Lazy) {
    auto ops = segment.operations();
    if (ops.empty()) return;
    policy_.update(store, ops.back());
    explorer_.add_deferred();
  }
  for (;;) {
    auto ops = segment.operations();
    if (ops.empty()) break;
    const Action action = policy_.action(store, ops, mode);
    if (action.kind == Action::Kind::Explore) {
      explore(segment, store, mode);
      if (explorer_.is_up_to_date()) break;
    } else if (action.kind == Action::Kind::Defer) {
      // Sync never defers (§6.4): the policy only answers Defer in Lazy mode.
      assert(mode == ExecutionMode::Lazy);
      break;
    } else {
      log_.log(LogLevel::Full, [&] {
        return fmt::format("[plan] cache hit: execute plan #{} ({}, segment has {} ops)", action.plan, mode_name(mode),
                           ops.size());
      });
      if (mode == ExecutionMode::Sync) store.add_trigger(action.plan, ExecutionTrigger::on_sync());
      ++stats_.cache_hits;
      store.record_hit(action.plan, tag_);
      const PlanPin plan = policy_.pinned(action.plan);
      assert(plan != nullptr && "the policy executes only plans it holds");
      count_launches(plan->optimization.strategy);
      segment.execute(action.plan, *plan);
      reset(store, segment.operations());
    }
  }
}

void Processor::explore(Segment& segment, ExecutionPlanStore& store, ExecutionMode mode) {
  auto ops = segment.operations();
  if (!miss_explained_ && log_.enabled(LogLevel::Medium)) {
    miss_explained_ = true;
    log_.log(LogLevel::Medium, [&] { return "[plan] cache miss: " + explain_cache_miss(store, ops); });
  }
  ExplorationResult r = explorer_.explore(ops, mode);
  switch (r.kind) {
    case ExplorationResult::Kind::Completed: {
      const auto [id, plan] = on_exploration_completed(ops, store, std::move(r.optimization), mode);
      count_launches(plan->optimization.strategy);
      segment.execute(id, *plan);
      reset(store, segment.operations());
      break;
    }
    case ExplorationResult::Kind::Continue:
      // Sync always completes (§8.1).
      assert(mode == ExecutionMode::Lazy);
      break;
    case ExplorationResult::Kind::Unfused:
      ++stats_.unfused_capped;
      count_launches(r.optimization.strategy);
      segment.execute_unfused(r.optimization);
      reset(store, segment.operations());
      break;
  }
}

void Processor::count_launches(const ExecutionStrategy& strategy) {
  switch (strategy.kind()) {
    case ExecutionStrategy::Kind::Optimization: ++stats_.fused_blocks; return;
    case ExecutionStrategy::Kind::Operations: stats_.unfused_ops += strategy.ordering().size(); return;
    case ExecutionStrategy::Kind::Composed:
      for (const ExecutionStrategy& c : strategy.children()) count_launches(c);
      return;
  }
}

void Processor::reset(const ExecutionPlanStore& store, std::span<const ir::Operation> remaining) {
  explorer_.reset(remaining);
  policy_.reset();
  miss_explained_ = false;
  for (const ir::Operation& op : remaining) policy_.update(store, op);
}

std::pair<PlanId, PlanPin> Processor::on_exploration_completed(std::span<const ir::Operation> ops,
                                                               ExecutionPlanStore& store, BlockOptimization opt,
                                                               ExecutionMode mode) {
  const std::size_t k = opt.ordering.size();
  ++stats_.explorations;
  log_.log(LogLevel::Full, [&] {
    return fmt::format("[plan] exploration completed: {}, {}/{} ops optimized", mode_name(mode), k, ops.size());
  });
  ExecutionTrigger trigger =
      mode == ExecutionMode::Sync ? ExecutionTrigger::on_sync()
      : k == ops.size()           ? ExecutionTrigger::always()
                        : ExecutionTrigger::on_operations({ops.begin() + static_cast<std::ptrdiff_t>(k), ops.end()});
  auto prefix = ops.first(k);
  // The same plan is already cached (seen by this stream's policy): it only gains the trigger.
  const Action existing = policy_.action(store, prefix, ExecutionMode::Sync);
  if (existing.kind == Action::Kind::Execute) {
    store.add_trigger(existing.plan, trigger);
    store.mark_used(existing.plan);
    return {existing.plan, policy_.pinned(existing.plan)};
  }
  // Otherwise publish; the store deduplicates against plans other streams published meanwhile.
  auto added = store.add(ExecutionPlan{{prefix.begin(), prefix.end()}, std::move(opt)}, std::move(trigger), tag_);
  if (added.inserted)
    ++stats_.plans_created;
  else
    store.mark_used(added.id);
  return {added.id, std::move(added.plan)};
}

// ---- cache-miss explanations

std::string describe_first_difference(const ir::Operation& op, const ir::Operation& cached) {
  if (op.kind != cached.kind || op.family != cached.family)
    return fmt::format("kind {} vs cached {}", op.kind_name(), cached.kind_name());
  if (ir::family_carries_dtype(op.family) && !(op.dtype == cached.dtype))
    return fmt::format("dtype {} vs cached {}", op.dtype.name(), cached.dtype.name());
  if (op.num_inputs != cached.num_inputs || op.tensors.size() != cached.tensors.size())
    return fmt::format("{} inputs/{} tensors vs cached {}/{}", op.num_inputs, op.tensors.size(), cached.num_inputs,
                       cached.tensors.size());
  for (std::size_t i = 0; i < op.tensors.size(); ++i) {
    const ir::TensorIr& a = op.tensors[i];
    const ir::TensorIr& b = cached.tensors[i];
    const std::string label =
        i < op.num_inputs ? fmt::format("input {}", i) : fmt::format("output {}", i - op.num_inputs);
    if (a.shape != b.shape)
      return fmt::format("{} relative shape {} vs cached {}", label, ir::shape_to_string(a.shape),
                         ir::shape_to_string(b.shape));
    if (!(a.dtype == b.dtype)) return fmt::format("{} dtype {} vs cached {}", label, a.dtype.name(), b.dtype.name());
    if (a.status != b.status)
      return fmt::format("{} status {} vs cached {}", label, ir::status_name(a.status), ir::status_name(b.status));
    if (a.id != b.id) return fmt::format("{} relative id {} vs cached {}", label, a.id.value(), b.id.value());
  }
  if (op.scalars.size() != cached.scalars.size())
    return fmt::format("{} scalars vs cached {}", op.scalars.size(), cached.scalars.size());
  for (std::size_t i = 0; i < op.scalars.size(); ++i)
    if (!(op.scalars[i] == cached.scalars[i]))
      return fmt::format("scalar {} {} vs cached {}", i, op.scalars[i].to_string(), cached.scalars[i].to_string());
  if (op.ranges.size() != cached.ranges.size())
    return fmt::format("{} slice ranges vs cached {}", op.ranges.size(), cached.ranges.size());
  if (op.attrs != cached.attrs) {
    for (std::size_t i = 0; i < std::min(op.attrs.size(), cached.attrs.size()); ++i)
      if (op.attrs[i] != cached.attrs[i])
        return fmt::format("attribute {} {} vs cached {}", i, op.attrs[i], cached.attrs[i]);
    return fmt::format("{} attributes vs cached {}", op.attrs.size(), cached.attrs.size());
  }
  if (op.custom_id != cached.custom_id) return fmt::format("custom id {} vs cached {}", op.custom_id, cached.custom_id);
  return {};
}

std::string explain_cache_miss(const ExecutionPlanStore& store, std::span<const ir::Operation> ops) {
  if (ops.empty()) return "empty segment";
  const std::size_t n_plans = store.size();
  auto ids = store.find_starting_with(ops[0]);
  if (!ids.empty()) {
    // Plans start like this segment: report the one that matched longest.
    PlanId best = ids[0];
    PlanPin best_plan;
    std::size_t best_len = 0;
    for (PlanId id : ids) {
      PlanPin plan = store.plan(id);
      if (plan == nullptr) continue;  // evicted meanwhile
      std::size_t k = 0;
      while (k < plan->operations.size() && k < ops.size() && plan->operations[k] == ops[k]) ++k;
      if (best_plan == nullptr || k > best_len) best = id, best_plan = std::move(plan), best_len = k;
    }
    if (best_plan == nullptr)
      return fmt::format("the plans that started like this were evicted ({} plans cached)", n_plans);
    const auto& plan_ops = best_plan->operations;
    if (best_len < plan_ops.size() && best_len < ops.size())
      return fmt::format("closest plan #{} ({} ops) matches {} ops; op {} {}", best, plan_ops.size(), best_len,
                         best_len, describe_first_difference(ops[best_len], plan_ops[best_len]));
    if (best_len == plan_ops.size())
      return fmt::format("plan #{} covers the first {} ops but no trigger of it matches what follows", best,
                         plan_ops.size());
    return fmt::format("closest plan #{} has {} ops; the segment has only {}", best, plan_ops.size(), ops.size());
  }
  auto similar = store.find_same_first_kind(ops[0]);
  if (similar.empty())
    return fmt::format("no cached plan starts with {} ({} plans cached)", ops[0].kind_name(), n_plans);
  // Closest: the first plan whose first op differs latest in field order is as good as any;
  // report the first one with its first differing field.
  const PlanPin cached = store.plan(similar.back());
  if (cached == nullptr)
    return fmt::format("no cached plan starts with {} ({} plans cached)", ops[0].kind_name(), n_plans);
  return fmt::format("no cached plan starts with this op; closest plan #{}: op 0 {}", similar.back(),
                     describe_first_difference(ops[0], cached->operations[0]));
}

}  // namespace kiln::fusion
