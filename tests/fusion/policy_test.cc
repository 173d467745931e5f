// Tests for the Policy (docs/spec/fusion.md §6, vectors §19.5) and OperationsValidator (§6.1).
#include "kiln/fusion/policy.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "kiln/fusion/strategy.h"

namespace kiln::fusion {
namespace {

using ir::Operation;

// §19.5 "log chains": every tensor [32,32,1], NotInit, f32; op i = Log(T(prev) -> T(next)).
ir::TensorIr T(std::uint64_t id) {
  return ir::TensorIr{ir::TensorId(id), ir::Shape{32, 32, 1}, ir::TensorStatus::NotInit, ir::dtypes::f32};
}
Operation log_op(std::uint64_t in, std::uint64_t out) {
  Operation op;
  op.kind = ir::OpKind::Float_Log;
  op.family = ir::Family::Float;
  op.dtype = ir::dtypes::f32;
  op.num_inputs = 1;
  op.tensors = {T(in), T(out)};
  return op;
}

struct TestStream {
  explicit TestStream(std::uint64_t n) {
    for (std::uint64_t i = 0; i < n; ++i) ops.push_back(log_op(i, i + 1));
    last = n;
  }
  // Appends Log(last -> T(x)).
  TestStream& new_ops(std::uint64_t x) {
    ops.push_back(log_op(last, x));
    last = x;
    return *this;
  }
  std::vector<Operation> slice(std::size_t a, std::size_t b) const { return {ops.begin() + a, ops.begin() + b}; }
  std::span<const Operation> prefix(std::size_t n) const { return std::span<const Operation>(ops).first(n); }

  std::vector<Operation> ops;
  std::uint64_t last = 0;
};

PlanId add_plan(ExecutionPlanStore& store, std::vector<Operation> ops, std::vector<ExecutionTrigger> triggers) {
  // The store always publishes a plan with one trigger; "no triggers" plans (§19.5 item 2) are
  // made with OnSync, which matching never consults (§5.3), so they behave exactly the same.
  ExecutionTrigger first = triggers.empty() ? ExecutionTrigger::on_sync() : triggers.front();
  auto r = store.add(ExecutionPlan{std::move(ops), BlockOptimization{}}, std::move(first));
  EXPECT_TRUE(r.inserted);
  for (std::size_t i = 1; i < triggers.size(); ++i) store.add_trigger(r.id, triggers[i]);
  return r.id;
}

// "updates a..b expecting X": for i in a..b: update(ops[i]); action(ops[0..i], Lazy) == X.
void updates(Policy& policy, const ExecutionPlanStore& store, const TestStream& s, std::size_t a, std::size_t b,
             Action expected) {
  for (std::size_t i = a; i < b; ++i) {
    policy.update(store, s.ops[i]);
    EXPECT_EQ(policy.action(store, s.prefix(i), ExecutionMode::Lazy), expected) << "at op " << i;
  }
}

// ---- OperationsValidator (§6.1) ----------------------------------------------------------------

TEST(OperationsValidator, FoundIsSticky) {
  TestStream s(3);
  OperationsValidator v;
  v.update(s.ops[0], 0, s.prefix(2));
  EXPECT_EQ(v.state(), OperationsValidator::State::Validating);
  v.update(s.ops[1], 1, s.prefix(2));
  EXPECT_EQ(v.state(), OperationsValidator::State::Found);
  EXPECT_EQ(v.found_size(), 2u);
  v.update(s.ops[0], 2, s.prefix(2));  // past the end, but Found is sticky
  EXPECT_EQ(v.state(), OperationsValidator::State::Found);
}

TEST(OperationsValidator, InvalidatedIsSticky) {
  TestStream s(3);
  OperationsValidator v;
  v.update(s.ops[1], 0, s.prefix(2));
  EXPECT_EQ(v.state(), OperationsValidator::State::Invalidated);
  v.update(s.ops[1], 1, s.prefix(2));
  EXPECT_EQ(v.state(), OperationsValidator::State::Invalidated);
}

TEST(OperationsValidator, PositionPastTheReferenceInvalidates) {
  TestStream s(3);
  OperationsValidator v;
  v.update(s.ops[2], 2, s.prefix(2));
  EXPECT_EQ(v.state(), OperationsValidator::State::Invalidated);
}

TEST(Policy, ModeNames) {
  EXPECT_STREQ(mode_name(ExecutionMode::Lazy), "lazy");
  EXPECT_STREQ(mode_name(ExecutionMode::Sync), "sync");
}

// ---- §19.5 --------------------------------------------------------------------------------------

TEST(PolicyVectors, Item1EmptyStoreExplores) {
  ExecutionPlanStore store;
  Policy policy;
  TestStream s(3);
  updates(policy, store, s, 0, 3, Action::explore());
}

TEST(PolicyVectors, Item2DeferWhileValidatingThenSyncExecutesExactLength) {
  ExecutionPlanStore store;
  TestStream s(3);
  PlanId a = add_plan(store, s.slice(0, 2), {});
  PlanId b = add_plan(store, s.slice(0, 3), {});
  ASSERT_NE(a, b);
  Policy policy;
  updates(policy, store, s, 0, 2, Action::defer());
  EXPECT_EQ(policy.action(store, s.prefix(2), ExecutionMode::Sync), Action::execute(a));
}

TEST(PolicyVectors, Item3AlwaysExecutesButNeverAPlanLongerThanTheSegment) {
  ExecutionPlanStore store;
  TestStream s(3);
  PlanId id = add_plan(store, s.slice(0, 3), {ExecutionTrigger::always()});
  Policy policy;
  for (const Operation& op : s.ops) policy.update(store, op);
  EXPECT_EQ(policy.action(store, s.prefix(3), ExecutionMode::Lazy), Action::execute(id));
  EXPECT_NE(policy.action(store, s.prefix(1), ExecutionMode::Lazy).kind, Action::Kind::Execute);
}

// Item 4 concerns ExecutionStrategy::max_relative_shape_id (§5.1).
class ShapeIdOpt final : public Optimization {
 public:
  explicit ShapeIdOpt(std::uint64_t shape_id) : shape_id_(shape_id) {}
  std::size_t len() const override { return 1; }
  std::string_view name() const override { return "ShapeIdOpt"; }
  std::optional<std::uint64_t> max_relative_shape_id() const override { return shape_id_; }

 private:
  std::uint64_t shape_id_;
};

TEST(PolicyVectors, Item4MaxRelativeShapeId) {
  auto composed = ExecutionStrategy::composed({
      ExecutionStrategy::operations({0, 1}),
      ExecutionStrategy::optimization(std::make_shared<ShapeIdOpt>(4), {2}, 10),
      ExecutionStrategy::optimization(std::make_shared<ShapeIdOpt>(7), {3}, 10),
  });
  EXPECT_EQ(composed.max_relative_shape_id(), std::optional<std::uint64_t>(7));
  EXPECT_EQ(ExecutionStrategy::operations({0, 1, 2}).max_relative_shape_id(), std::nullopt);
}

TEST(PolicyVectors, Item5OnOperationsTriggerFiresOnTheNextOp) {
  ExecutionPlanStore store;
  TestStream s(3);
  PlanId id = add_plan(store, s.slice(0, 2), {ExecutionTrigger::on_operations({s.ops[2]})});
  Policy policy;
  updates(policy, store, s, 0, 2, Action::defer());
  updates(policy, store, s, 2, 3, Action::execute(id));
}

TEST(PolicyVectors, Item6OnePlanTwoTriggersTwoStreams) {
  ExecutionPlanStore store;
  TestStream s1(2), s2(2);
  s1.new_ops(5);
  s2.new_ops(6);
  PlanId id = add_plan(store, s1.slice(0, 2),
                       {ExecutionTrigger::on_operations({s1.ops[2]}), ExecutionTrigger::on_operations({s2.ops[2]})});
  for (const TestStream* s : {&s1, &s2}) {
    Policy policy;
    updates(policy, store, *s, 0, 2, Action::defer());
    updates(policy, store, *s, 2, 3, Action::execute(id));
  }
}

TEST(PolicyVectors, Item7TwoPlansSameFirstOpEachStreamItsOwn) {
  ExecutionPlanStore store;
  TestStream s1(2), s2(2);
  s1.new_ops(4).new_ops(5);
  s2.new_ops(5).new_ops(6);
  PlanId a = add_plan(store, s1.slice(0, 3), {ExecutionTrigger::on_operations({s1.ops[3]})});
  PlanId b = add_plan(store, s2.slice(0, 3), {ExecutionTrigger::on_operations({s2.ops[3]})});
  ASSERT_NE(a, b);
  Policy p1, p2;
  updates(p1, store, s1, 0, 3, Action::defer());
  updates(p1, store, s1, 3, 4, Action::execute(a));
  updates(p2, store, s2, 0, 3, Action::defer());
  updates(p2, store, s2, 3, 4, Action::execute(b));
}

TEST(PolicyVectors, Item8NoCandidatesCollectedMidSegment) {
  ExecutionPlanStore store;
  TestStream s1(4);
  TestStream s2(2);
  s2.new_ops(6).new_ops(7);
  add_plan(store, s1.slice(0, 3), {ExecutionTrigger::on_operations({s1.ops[3]})});
  Policy policy;
  updates(policy, store, s2, 0, 2, Action::defer());
  updates(policy, store, s2, 2, 4, Action::explore());
}

// ---- further §6 rules ---------------------------------------------------------------------------

TEST(Policy, CompletingOpIsNotCheckedAgainstTheTrigger) {
  // The trigger's only op equals the op that completes the plan: matching must start with the
  // NEXT op, so nothing fires on ops[1] and a different ops[2] invalidates the trigger.
  ExecutionPlanStore store;
  TestStream s(2);
  s.new_ops(9);
  add_plan(store, s.slice(0, 2), {ExecutionTrigger::on_operations({s.ops[1]})});
  Policy policy;
  updates(policy, store, s, 0, 2, Action::defer());
  // Had ops[1] been checked, the trigger would be Found and this would be Execute.
  EXPECT_EQ(policy.action(store, s.prefix(2), ExecutionMode::Lazy), Action::defer());  // exact size
  policy.update(store, s.ops[2]);
  EXPECT_EQ(policy.action(store, s.prefix(3), ExecutionMode::Lazy), Action::explore());
}

TEST(Policy, TriggerListIsSnapshottedWhenThePlanBecomesAvailable) {
  ExecutionPlanStore store;
  TestStream s(3);
  PlanId id = add_plan(store, s.slice(0, 2), {ExecutionTrigger::on_sync()});
  Policy policy;
  policy.update(store, s.ops[0]);
  policy.update(store, s.ops[1]);  // available now, with [OnSync]
  store.add_trigger(id, ExecutionTrigger::always());
  policy.update(store, s.ops[2]);
  EXPECT_EQ(policy.action(store, s.prefix(3), ExecutionMode::Lazy), Action::explore());
  // Rebuilt from scratch the plan is available with [OnSync, Always] and fires at once.
  policy.reset();
  policy.update(store, s.ops[0]);
  policy.update(store, s.ops[1]);
  EXPECT_EQ(policy.action(store, s.prefix(2), ExecutionMode::Lazy), Action::execute(id));
}

TEST(Policy, OnSyncPlanDefersInLazyAndExecutesInSync) {
  ExecutionPlanStore store;
  TestStream s(3);
  PlanId id = add_plan(store, s.slice(0, 2), {ExecutionTrigger::on_sync()});
  Policy policy;
  updates(policy, store, s, 0, 1, Action::defer());  // validating candidate
  policy.update(store, s.ops[1]);
  // Available, no trigger to wait for: a shorter segment is not worth waiting for ...
  EXPECT_EQ(policy.action(store, s.prefix(1), ExecutionMode::Lazy), Action::explore());
  // ... but one matched exactly waits (Lazy) and executes at a drain (Sync).
  EXPECT_EQ(policy.action(store, s.prefix(2), ExecutionMode::Lazy), Action::defer());
  EXPECT_EQ(policy.action(store, s.prefix(2), ExecutionMode::Sync), Action::execute(id));
  // One more op: the plan no longer covers the segment exactly and has no trigger to wait for.
  policy.update(store, s.ops[2]);
  EXPECT_EQ(policy.action(store, s.prefix(3), ExecutionMode::Lazy), Action::explore());
  EXPECT_EQ(policy.action(store, s.prefix(3), ExecutionMode::Sync), Action::explore());
}

TEST(Policy, SyncNeverDefers) {
  ExecutionPlanStore store;
  TestStream s(3);
  add_plan(store, s.slice(0, 3), {ExecutionTrigger::always()});
  Policy policy;
  policy.update(store, s.ops[0]);  // a candidate is validating
  EXPECT_EQ(policy.action(store, s.prefix(1), ExecutionMode::Lazy), Action::defer());
  EXPECT_EQ(policy.action(store, s.prefix(1), ExecutionMode::Sync), Action::explore());
}

TEST(Policy, FoundIsClearedOnlyByReset) {
  ExecutionPlanStore store;
  TestStream s(4);
  PlanId id = add_plan(store, s.slice(0, 2), {ExecutionTrigger::always()});
  Policy policy;
  policy.update(store, s.ops[0]);
  policy.update(store, s.ops[1]);
  EXPECT_EQ(policy.action(store, s.prefix(2), ExecutionMode::Lazy), Action::execute(id));
  policy.update(store, s.ops[2]);
  policy.update(store, s.ops[3]);
  EXPECT_EQ(policy.action(store, s.prefix(4), ExecutionMode::Lazy), Action::execute(id));
  EXPECT_EQ(policy.action(store, s.prefix(4), ExecutionMode::Sync), Action::execute(id));
  EXPECT_EQ(policy.num_operations(), 4u);
  policy.reset();
  EXPECT_EQ(policy.num_operations(), 0u);
  EXPECT_EQ(policy.action(store, s.prefix(0), ExecutionMode::Lazy), Action::explore());
}

TEST(Policy, FirstAvailableWithASatisfiedTriggerWins) {
  // Plans [0..1] and [0..2], both Always: the shorter one becomes available (and found) first.
  ExecutionPlanStore store;
  TestStream s(2);
  PlanId shorter = add_plan(store, s.slice(0, 1), {ExecutionTrigger::always()});
  add_plan(store, s.slice(0, 2), {ExecutionTrigger::always()});
  Policy policy;
  policy.update(store, s.ops[0]);
  EXPECT_EQ(policy.action(store, s.prefix(1), ExecutionMode::Lazy), Action::execute(shorter));
  policy.update(store, s.ops[1]);
  EXPECT_EQ(policy.action(store, s.prefix(2), ExecutionMode::Lazy), Action::execute(shorter));
}

TEST(Policy, FailedTriggerStopsDeferring) {
  ExecutionPlanStore store;
  TestStream s(2);
  TestStream other(2);
  s.new_ops(3).new_ops(4);
  other.new_ops(8).new_ops(9);
  // Trigger of two ops: still validating after one matching op, invalidated by a wrong one.
  PlanId id = add_plan(store, s.slice(0, 2), {ExecutionTrigger::on_operations({s.ops[2], s.ops[3]})});
  Policy policy;
  updates(policy, store, s, 0, 3, Action::defer());
  EXPECT_EQ(policy.action(store, s.prefix(3), ExecutionMode::Lazy), Action::defer());  // 1 of 2 matched
  policy.update(store, s.ops[3]);
  EXPECT_EQ(policy.action(store, s.prefix(4), ExecutionMode::Lazy), Action::execute(id));
  Policy p2;
  updates(p2, store, other, 0, 2, Action::defer());
  p2.update(store, other.ops[2]);
  EXPECT_EQ(p2.action(store, other.prefix(3), ExecutionMode::Lazy), Action::explore());
}

// ---- a bounded store evicting plans the policy is matching (beyond Burn) -----------------------

// Fills a store bounded at 8 with other plans until `id` is evicted.
void evict(ExecutionPlanStore& store, PlanId id) {
  for (std::uint64_t k = 0; store.plan(id) != nullptr; ++k)
    add_plan(store, {log_op(1000 + k, 2000 + k)}, {ExecutionTrigger::always()});
}

TEST(PolicyWithABoundedStore, AnAvailablePlanEvictedBeforeItRunsStillRuns) {
  ExecutionPlanStore store(PlanStoreOptions{.max_plans = 8});
  TestStream s(2);
  const PlanId id = add_plan(store, s.slice(0, 2), {ExecutionTrigger::always()});
  Policy policy;
  policy.update(store, s.ops[0]);
  policy.update(store, s.ops[1]);
  evict(store, id);
  // The policy pinned the plan when it matched: it executes it, whole.
  ASSERT_EQ(policy.action(store, s.prefix(2), ExecutionMode::Lazy), Action::execute(id));
  const PlanPin plan = policy.pinned(id);
  ASSERT_NE(plan, nullptr);
  EXPECT_EQ(plan->operations, s.slice(0, 2));
}

TEST(PolicyWithABoundedStore, ACandidateEvictedWhileItIsMatchedIsForgotten) {
  ExecutionPlanStore store(PlanStoreOptions{.max_plans = 8});
  TestStream s(2);
  const PlanId id = add_plan(store, s.slice(0, 2), {ExecutionTrigger::always()});
  Policy policy;
  policy.update(store, s.ops[0]);
  EXPECT_EQ(policy.action(store, s.prefix(1), ExecutionMode::Lazy), Action::defer());
  evict(store, id);
  // It completes after its eviction: its trigger list is gone with it, so it is as if it had
  // never been cached, and the stream explores (and publishes it again).
  policy.update(store, s.ops[1]);
  EXPECT_EQ(policy.action(store, s.prefix(2), ExecutionMode::Lazy), Action::explore());
  EXPECT_EQ(policy.action(store, s.prefix(2), ExecutionMode::Sync), Action::explore());
  // A fresh match finds nothing either.
  policy.reset();
  policy.update(store, s.ops[0]);
  EXPECT_EQ(policy.action(store, s.prefix(1), ExecutionMode::Lazy), Action::explore());
}

TEST(PolicyDeathTest, AskingAboutMoreOpsThanAnalysedIsAnInternalError) {
  ExecutionPlanStore store;
  TestStream s(2);
  Policy policy;
  policy.update(store, s.ops[0]);
#ifdef NDEBUG
  EXPECT_EQ(policy.action(store, s.prefix(2), ExecutionMode::Lazy), Action::explore());
#else
  EXPECT_DEATH((void)policy.action(store, s.prefix(2), ExecutionMode::Lazy), "fewer ops");
#endif
}

}  // namespace
}  // namespace kiln::fusion
