// Processor vectors (docs/spec/fusion.md §19.6): pattern fusers, a test segment that uses ops as given
// (no relativization), Lazy `add` and explicit `sync`.
#include <gtest/gtest.h>

#include "kiln/fusion/processor.h"
#include "pattern_fuser.h"

namespace kiln::fusion::testing {
namespace {

using ir::Operation;

// Executing a strategy removes ops from the front: opt.len() per Optimization, len(ordering)
// per Operations, children in order for Composed. Executing a plan records its id.
class TestSegment final : public Segment {
 public:
  std::span<const Operation> operations() const override { return ops; }
  void execute(PlanId id, const ExecutionPlan& plan) override {
    executed.push_back(id);
    remove(plan.optimization.strategy);
  }
  void execute_unfused(const BlockOptimization& bo) override {
    ++unfused_runs;
    remove(bo.strategy);
  }

  std::vector<Operation> ops;
  std::vector<PlanId> executed;
  int unfused_runs = 0;

 private:
  void remove(const ExecutionStrategy& s) {
    std::size_t n = 0;
    switch (s.kind()) {
      case ExecutionStrategy::Kind::Optimization: n = s.opt()->len(); break;
      case ExecutionStrategy::Kind::Operations: n = s.ordering().size(); break;
      case ExecutionStrategy::Kind::Composed:
        for (const auto& c : s.children()) remove(c);
        return;
    }
    ops.erase(ops.begin(), ops.begin() + static_cast<std::ptrdiff_t>(std::min(n, ops.size())));
  }
};

class ProcessorHarness {
 public:
  explicit ProcessorHarness(FuserList fusers) : processor_(std::move(fusers), ProcessorOptions{}, log_) {}
  void add(Operation op) {
    segment_.ops.push_back(std::move(op));
    processor_.process(segment_, store_, ExecutionMode::Lazy);
  }
  void sync() { processor_.process(segment_, store_, ExecutionMode::Sync); }

  std::size_t queued() const { return segment_.ops.size(); }
  std::size_t executions() const { return segment_.executed.size(); }
  PlanId last() const { return segment_.executed.back(); }
  const ExecutionPlanStore& store() const { return store_; }
  const Processor& processor() const { return processor_; }
  TriggerList triggers(PlanId id) const { return *store_.triggers(id); }

 private:
  FusionLog log_;
  ExecutionPlanStore store_;
  TestSegment segment_;
  Processor processor_;
};

std::vector<Operation> ops(std::initializer_list<Operation> list) { return list; }
TriggerList always() { return {ExecutionTrigger::always()}; }

TEST(Processor, ComplexStream) {  // §19.6.1
  ProcessorHarness h(fuser_list(P(0, {op1(), op2()}), P(1, {op2(), op2()})));
  h.add(op1());
  EXPECT_EQ(h.queued(), 1u);
  EXPECT_EQ(h.executions(), 0u);
  h.add(op1());
  EXPECT_EQ(h.queued(), 0u);
  ASSERT_EQ(h.executions(), 1u);
  EXPECT_EQ(h.last(), 0u);
  EXPECT_EQ(h.store().plan(0)->operations, ops({op1(), op1()}));
  EXPECT_EQ(h.triggers(0), always());
  h.add(op1());
  EXPECT_EQ(h.queued(), 1u);
  EXPECT_EQ(h.executions(), 1u);
  h.add(op2());
  EXPECT_EQ(h.queued(), 0u);
  EXPECT_EQ(h.executions(), 2u);
  EXPECT_EQ(h.last(), 1u);
  EXPECT_EQ(h.store().plan(1)->operations, ops({op1(), op2()}));
  EXPECT_EQ(h.triggers(1), always());
  EXPECT_EQ(h.store().plan(1)->optimization.strategy, O(0, 2, {0, 1}, 2));
  h.add(op2());
  EXPECT_EQ(h.queued(), 1u);
  EXPECT_EQ(h.executions(), 2u);
  h.add(op2());
  EXPECT_EQ(h.queued(), 0u);
  EXPECT_EQ(h.executions(), 3u);
  EXPECT_EQ(h.last(), 2u);
  EXPECT_EQ(h.store().plan(2)->operations, ops({op2(), op2()}));
  EXPECT_EQ(h.store().plan(2)->optimization.strategy, O(1, 2, {0, 1}, 2));
  h.add(op1());
  EXPECT_EQ(h.queued(), 1u);
  EXPECT_EQ(h.executions(), 3u);
  h.add(op2());  // cache hit: plan 0 invalidated, plan 1 found (Always)
  EXPECT_EQ(h.queued(), 0u);
  EXPECT_EQ(h.executions(), 4u);
  EXPECT_EQ(h.last(), 1u);
  h.add(op2());
  EXPECT_EQ(h.queued(), 1u);
  EXPECT_EQ(h.executions(), 4u);
  h.add(op2());
  EXPECT_EQ(h.queued(), 0u);
  EXPECT_EQ(h.executions(), 5u);
  EXPECT_EQ(h.last(), 2u);
  EXPECT_EQ(h.store().size(), 3u);
}

TEST(Processor, ReuseOfUnfusedPlans) {  // §19.6.2
  ProcessorHarness h(fuser_list(P(0, {op1(), op2()})));
  h.add(op3());
  EXPECT_EQ(h.queued(), 0u);
  ASSERT_EQ(h.executions(), 1u);
  EXPECT_EQ(h.store().plan(0)->operations, ops({op3()}));
  EXPECT_EQ(h.triggers(0), always());
  h.add(op3());
  EXPECT_EQ(h.queued(), 0u);
  EXPECT_EQ(h.executions(), 2u);
  EXPECT_EQ(h.last(), 0u);
  EXPECT_EQ(h.store().size(), 1u);
  h.add(op1());
  EXPECT_EQ(h.queued(), 1u);
  h.add(op3());
  EXPECT_EQ(h.queued(), 0u);
  EXPECT_EQ(h.executions(), 3u);
  EXPECT_EQ(h.last(), 1u);
  EXPECT_EQ(h.store().plan(1)->operations, ops({op1(), op3()}));
  EXPECT_EQ(h.triggers(1), always());
  EXPECT_EQ(h.store().plan(1)->optimization.strategy.kind(), ExecutionStrategy::Kind::Operations);
}

TEST(Processor, OverlappingFusers) {  // §19.6.3
  ProcessorHarness h(fuser_list(P(0, {op1(), op2()}), P(0, {op1(), op2(), op1(), op1()})));
  h.add(op1());
  EXPECT_EQ(h.queued(), 1u);
  h.add(op2());
  EXPECT_EQ(h.queued(), 2u);
  h.add(op1());
  EXPECT_EQ(h.queued(), 3u);
  EXPECT_EQ(h.executions(), 0u);
  h.add(op2());
  EXPECT_EQ(h.queued(), 2u);
  ASSERT_EQ(h.executions(), 1u);
  EXPECT_EQ(h.store().plan(0)->operations, ops({op1(), op2()}));
  EXPECT_EQ(h.triggers(0), TriggerList{ExecutionTrigger::on_operations({op1(), op2()})});
  EXPECT_EQ(h.store().plan(0)->optimization.strategy, O(0, 2, {0, 1}, 2));
  h.add(op2());
  EXPECT_EQ(h.queued(), 0u);
  EXPECT_EQ(h.executions(), 3u);
  EXPECT_EQ(h.triggers(0),
            (TriggerList{ExecutionTrigger::on_operations({op1(), op2()}), ExecutionTrigger::on_operations({op2()})}));
  EXPECT_EQ(h.store().plan(1)->operations, ops({op2()}));
  EXPECT_EQ(h.triggers(1), always());
  h.add(op1());
  EXPECT_EQ(h.queued(), 1u);
  h.add(op2());
  EXPECT_EQ(h.queued(), 2u);
  h.add(op1());
  EXPECT_EQ(h.queued(), 3u);
  EXPECT_EQ(h.executions(), 3u);
  h.add(op1());  // both triggers fail -> explore -> the 4-op fuser wins (score 4 > 2)
  EXPECT_EQ(h.queued(), 0u);
  EXPECT_EQ(h.executions(), 4u);
  EXPECT_EQ(h.last(), 2u);
  EXPECT_EQ(h.store().plan(2)->operations, ops({op1(), op2(), op1(), op1()}));
  EXPECT_EQ(h.triggers(2), always());
  h.add(op1());
  h.add(op2());
  h.add(op1());
  EXPECT_EQ(h.queued(), 3u);
  EXPECT_EQ(h.executions(), 4u);
  h.sync();
  EXPECT_EQ(h.queued(), 0u);
  EXPECT_EQ(h.executions(), 5u);
  EXPECT_EQ(h.last(), 3u);
  EXPECT_EQ(h.store().plan(3)->operations, ops({op1(), op2(), op1()}));
  EXPECT_EQ(h.triggers(3), TriggerList{ExecutionTrigger::on_sync()});
  EXPECT_EQ(h.store().plan(3)->optimization.strategy, C({O(0, 2, {0, 1}, 2), U({2})}));
  EXPECT_EQ(h.store().plan(3)->optimization.ordering, (Ordering{0, 1, 2}));
  EXPECT_EQ(h.triggers(0).size(), 2u) << "plan 0 keeps exactly its two OnOperations triggers";
  h.add(op3());
  EXPECT_EQ(h.queued(), 0u);
  EXPECT_EQ(h.executions(), 6u);
  EXPECT_EQ(h.last(), 4u);
  EXPECT_EQ(h.store().plan(4)->operations, ops({op3()}));
  EXPECT_EQ(h.triggers(4), always());
  h.add(op3());
  EXPECT_EQ(h.executions(), 7u);
  EXPECT_EQ(h.last(), 4u);
}

TEST(Processor, SyncPlansAreReusable) {  // §19.6.4
  ProcessorHarness h(fuser_list(P(0, {op1(), op2()}), P(1, {op1(), op2(), op3(), op1()})));
  h.add(op1());
  h.add(op2());
  h.add(op3());
  EXPECT_EQ(h.executions(), 0u);
  h.sync();
  ASSERT_EQ(h.executions(), 1u);
  EXPECT_EQ(h.last(), 0u);
  EXPECT_EQ(h.store().plan(0)->operations, ops({op1(), op2(), op3()}));
  EXPECT_EQ(h.triggers(0), TriggerList{ExecutionTrigger::on_sync()});
  EXPECT_EQ(h.store().plan(0)->optimization.strategy, C({O(0, 2, {0, 1}, 2), U({2})}));
  EXPECT_EQ(h.store().plan(0)->optimization.ordering, (Ordering{0, 1, 2}));
  EXPECT_EQ(h.processor().explorer().num_explorations(), 1u);
  h.add(op1());
  h.add(op2());
  h.add(op3());
  h.sync();
  EXPECT_EQ(h.executions(), 2u);
  EXPECT_EQ(h.last(), 0u);
  EXPECT_EQ(h.processor().explorer().num_explorations(), 1u) << "no re-exploration";
}

TEST(Processor, ExplorationCapRunsUnfusedWithoutCaching) {  // §8.3
  FusionLog log;
  ExecutionPlanStore store;
  TestSegment segment;
  ProcessorOptions options;
  options.max_explorations = 0;
  Processor p(fuser_list(P(0, {op1(), op2()})), options, log);
  segment.ops.push_back(op3());
  p.process(segment, store, ExecutionMode::Lazy);
  EXPECT_EQ(segment.unfused_runs, 1);
  EXPECT_EQ(store.size(), 0u);
  EXPECT_TRUE(segment.ops.empty());
}

}  // namespace
}  // namespace kiln::fusion::testing
