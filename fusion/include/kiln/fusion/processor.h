// Processor: a stream's Policy + Explorer, driving a segment in Lazy or Sync mode
// (docs/spec/fusion.md §7). Backend-neutral: what "execute" means is the Segment's business.
//
// Thread-safety: owned by one stream actor; shares only the (concurrent) plan store.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "kiln/fusion/explorer.h"
#include "kiln/fusion/operation_queue.h"
#include "kiln/fusion/plan_store.h"
#include "kiln/fusion/policy.h"

namespace kiln::fusion {

// The queue as the processor sees it (§7): relative ops, and two ways to execute a prefix.
class Segment {
 public:
  virtual ~Segment() = default;
  virtual std::span<const ir::Operation> operations() const = 0;
  // Runs a cached plan (pinned by the caller for the call); `id` names it in logs.
  virtual void execute(PlanId id, const ExecutionPlan& plan) = 0;
  virtual void execute_unfused(const BlockOptimization& bo) = 0;
};

// The production segment: an OperationQueue executed by an Executor.
class QueueSegment final : public Segment {
 public:
  QueueSegment(OperationQueue& queue, Executor& executor, const FusionLog& log)
      : queue_(queue), executor_(executor), log_(log) {}
  std::span<const ir::Operation> operations() const override { return queue_.relative(); }
  void execute(PlanId id, const ExecutionPlan& plan) override { queue_.execute_plan(id, plan, executor_, log_); }
  void execute_unfused(const BlockOptimization& bo) override { queue_.run(bo, executor_, log_); }

 private:
  OperationQueue& queue_;
  Executor& executor_;
  const FusionLog& log_;
};

struct ProcessorStats {
  std::uint64_t cache_hits = 0;      // cached plans executed
  std::uint64_t explorations = 0;    // explorations completed (new or existing plan)
  std::uint64_t plans_created = 0;   // plans this processor added to the store
  std::uint64_t unfused_capped = 0;  // segments run unfused because of max_explorations
  // What the executed plans asked the backend for: fused blocks (one launch each) and operations
  // run one by one (a plan's unfused leaves, capped segments). The backend may still replay a
  // fused block op by op (its own fallback counters say when).
  std::uint64_t fused_blocks = 0;
  std::uint64_t unfused_ops = 0;
};

struct ProcessorOptions {
  std::size_t max_blocks = 5;                   // [fusion.beam_search] max_blocks
  std::optional<std::size_t> max_explorations;  // [fusion] max_explorations; none = unlimited
  // The stream's tag in the plan store's usage (PlanUsage): a daemon tags a stream with its
  // job; 0 = untagged.
  std::uint32_t tag = 0;
};

class Processor {
 public:
  Processor(FuserList prototypes, ProcessorOptions options, const FusionLog& log);

  // Lazy: a new op was just appended to the segment. Sync: execute everything queued.
  void process(Segment& segment, ExecutionPlanStore& store, ExecutionMode mode);

  const ProcessorStats& stats() const { return stats_; }
  const Explorer& explorer() const { return explorer_; }

 private:
  void explore(Segment& segment, ExecutionPlanStore& store, ExecutionMode mode);
  void reset(const ExecutionPlanStore& store, std::span<const ir::Operation> remaining);
  // The plan that now covers the explored prefix (new, or cached and given the trigger), pinned.
  std::pair<PlanId, PlanPin> on_exploration_completed(std::span<const ir::Operation> ops, ExecutionPlanStore& store,
                                                      BlockOptimization opt, ExecutionMode mode);

  void count_launches(const ExecutionStrategy& strategy);

  const FusionLog& log_;
  const std::uint32_t tag_;
  Policy policy_;
  Explorer explorer_;
  ProcessorStats stats_;
  bool miss_explained_ = false;
};

// Why a segment found no cached plan, in one line (logged at Medium when an exploration starts):
// the closest cached plan for its first operation and the first position and field where the
// relative forms differ.
std::string explain_cache_miss(const ExecutionPlanStore& store, std::span<const ir::Operation> ops);
// The first field where two relative operations differ, e.g. "input 0 relative shape [1,2] vs
// cached [1,1]"; empty when they are equal.
std::string describe_first_difference(const ir::Operation& op, const ir::Operation& cached);

}  // namespace kiln::fusion
