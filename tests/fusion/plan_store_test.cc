// Tests for ExecutionPlanStore and its first-op index (docs/spec/fusion.md §5.3–§5.6, vectors §19.4), plus
// concurrency tests (run them under -DKILN_SANITIZE=thread as well).
#include "kiln/fusion/plan_store.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <thread>
#include <vector>

namespace kiln::fusion {
namespace {

using ir::Operation;
using ir::TensorStatus;

ir::TensorIr T(std::uint64_t id, TensorStatus status = TensorStatus::ReadOnly) {
  return ir::TensorIr{ir::TensorId(id), ir::Shape{32, 32}, status, ir::dtypes::f32};
}

Operation binary(ir::OpKind kind, std::uint64_t l, std::uint64_t r, std::uint64_t o) {
  Operation op;
  op.kind = kind;
  op.family = ir::Family::NumericFloat;
  op.dtype = ir::dtypes::f32;
  op.num_inputs = 2;
  op.tensors = {T(l), T(r), T(o, TensorStatus::NotInit)};
  return op;
}

// §19 conventions: op1 = Add{T0, T1 -> T2 NotInit}, op2 = AddScalar{T0, Float(5.0) -> T2 NotInit},
// op3' = Sub with op1's tensors.
Operation op1() { return binary(ir::OpKind::Numeric_Add, 0, 1, 2); }
Operation op3_sub() { return binary(ir::OpKind::Numeric_Sub, 0, 1, 2); }
Operation op2() {
  Operation op;
  op.kind = ir::OpKind::Numeric_AddScalar;
  op.family = ir::Family::NumericFloat;
  op.dtype = ir::dtypes::f32;
  op.num_inputs = 1;
  op.tensors = {T(0), T(2, TensorStatus::NotInit)};
  op.scalars = {ir::ScalarIr::Float(5.0)};
  return op;
}
Operation log_op(std::uint64_t in, std::uint64_t out) {
  Operation op;
  op.kind = ir::OpKind::Float_Log;
  op.family = ir::Family::Float;
  op.dtype = ir::dtypes::f32;
  op.num_inputs = 1;
  op.tensors = {T(in), T(out, TensorStatus::NotInit)};
  return op;
}

// The store never looks at the optimization; an empty one keeps these tests independent of
// strategy.cc.
ExecutionPlan plan_of(std::vector<Operation> ops) { return ExecutionPlan{std::move(ops), BlockOptimization{}}; }

using Ids = std::vector<PlanId>;

// A hash that maps every op to one bucket: find/add must fall back on operator== (§5.6).
std::uint64_t collide(const Operation&) { return 42; }

TEST(TestOps, AreValid) {
  for (const Operation& op : {op1(), op2(), op3_sub(), log_op(0, 1)}) {
    EXPECT_TRUE(op.validate().ok()) << op.to_string();
  }
  EXPECT_FALSE(op1() == op2());
  EXPECT_FALSE(op1() == op3_sub());
}

// ---- §19.4, with the real hash and with a forced collision ------------------------------------

class PlanIndexTest : public ::testing::TestWithParam<bool> {
 protected:
  PlanIndexTest()
      : store_(GetParam() ? ExecutionPlanStore(ExecutionPlanStore::OpHasher(&collide)) : ExecutionPlanStore()) {}
  PlanId add(std::vector<Operation> ops) {
    auto r = store_.add(plan_of(std::move(ops)), ExecutionTrigger::always());
    EXPECT_TRUE(r.inserted);
    return r.id;
  }
  ExecutionPlanStore store_;
};

TEST_P(PlanIndexTest, Vector1SinglePlan) {
  EXPECT_EQ(add({op1()}), 0u);
  EXPECT_EQ(store_.find_starting_with(op1()), Ids({0}));
}

TEST_P(PlanIndexTest, Vector2TwoPlansSameFirstOpInInsertionOrder) {
  EXPECT_EQ(add({op1(), op2(), op1()}), 0u);
  EXPECT_EQ(add({op1(), op1(), op2()}), 1u);
  EXPECT_EQ(store_.find_starting_with(op1()), Ids({0, 1}));
  EXPECT_EQ(store_.find_starting_with(op2()), Ids{});
}

TEST_P(PlanIndexTest, Vector3OnlyTheFirstOpIsIndexed) {
  EXPECT_EQ(add({op1(), op1()}), 0u);
  EXPECT_EQ(add({op2(), op1()}), 1u);
  EXPECT_EQ(store_.find_starting_with(op1()), Ids({0}));
  EXPECT_EQ(store_.find_starting_with(op2()), Ids({1}));
}

TEST_P(PlanIndexTest, Vector4DifferentOpSameTensors) {
  EXPECT_EQ(add({op1(), op1()}), 0u);
  EXPECT_EQ(add({op3_sub(), op1()}), 1u);
  EXPECT_EQ(store_.find_starting_with(op1()), Ids({0}));
  EXPECT_EQ(store_.find_starting_with(op3_sub()), Ids({1}));
  EXPECT_EQ(store_.find_starting_with(op2()), Ids{});  // with the collision: bucket exists, no op
}

TEST_P(PlanIndexTest, IdenticalOperationsKeepOnePlanPerBucketEntry) {
  // [op1] and [op3'] share a bucket under the collision hash; an identical sequence is found
  // only under its own (equal) first op.
  EXPECT_EQ(add({op1()}), 0u);
  EXPECT_EQ(add({op3_sub()}), 1u);
  auto again = store_.add(plan_of({op3_sub()}), ExecutionTrigger::on_sync());
  EXPECT_FALSE(again.inserted);
  EXPECT_EQ(again.id, 1u);
  EXPECT_EQ(store_.size(), 2u);
  EXPECT_EQ(*store_.triggers(1), (TriggerList{ExecutionTrigger::always(), ExecutionTrigger::on_sync()}));
  EXPECT_EQ(*store_.triggers(0), (TriggerList{ExecutionTrigger::always()}));
}

INSTANTIATE_TEST_SUITE_P(Hash, PlanIndexTest, ::testing::Values(false, true),
                         [](const auto& p) { return p.param ? "ForcedCollision" : "Default"; });

// ---- store semantics ----------------------------------------------------------------------

TEST(PlanStore, IdsAreDenseInInsertionOrder) {
  ExecutionPlanStore store;
  EXPECT_EQ(store.size(), 0u);
  for (std::uint64_t i = 0; i < 10; ++i) {
    auto r = store.add(plan_of({log_op(i, i + 1)}), ExecutionTrigger::always());
    EXPECT_TRUE(r.inserted);
    EXPECT_EQ(r.id, i);
    EXPECT_EQ(store.size(), i + 1);
  }
  EXPECT_EQ(store.plan(3)->operations, std::vector<Operation>{log_op(3, 4)});
}

TEST(PlanStore, AddOfAnExistingSequenceOnlyAddsTheTrigger) {
  ExecutionPlanStore store;
  auto a = store.add(plan_of({op1(), op2()}), ExecutionTrigger::always());
  auto prefix = store.add(plan_of({op1()}), ExecutionTrigger::on_sync());  // a prefix is another plan
  auto b = store.add(plan_of({op1(), op2()}), ExecutionTrigger::on_sync());
  auto c = store.add(plan_of({op1(), op2()}), ExecutionTrigger::always());  // duplicate trigger
  EXPECT_EQ(a.id, 0u);
  EXPECT_TRUE(a.inserted);
  EXPECT_EQ(prefix.id, 1u);
  EXPECT_TRUE(prefix.inserted);
  EXPECT_EQ(b.id, 0u);
  EXPECT_FALSE(b.inserted);
  EXPECT_EQ(c.id, 0u);
  EXPECT_FALSE(c.inserted);
  EXPECT_EQ(store.size(), 2u);
  EXPECT_EQ(*store.triggers(0), (TriggerList{ExecutionTrigger::always(), ExecutionTrigger::on_sync()}));
  EXPECT_EQ(store.find_starting_with(op1()), Ids({0, 1}));
}

TEST(PlanStore, AddTriggerDeduplicatesEqualTriggers) {
  ExecutionPlanStore store;
  PlanId id = store.add(plan_of({op1()}), ExecutionTrigger::on_operations({op2()})).id;
  store.add_trigger(id, ExecutionTrigger::on_operations({op2()}));         // equal: ignored
  store.add_trigger(id, ExecutionTrigger::on_operations({op2(), op1()}));  // different ops: kept
  store.add_trigger(id, ExecutionTrigger::on_sync());
  store.add_trigger(id, ExecutionTrigger::on_sync());
  EXPECT_EQ(*store.triggers(id),
            (TriggerList{ExecutionTrigger::on_operations({op2()}), ExecutionTrigger::on_operations({op2(), op1()}),
                         ExecutionTrigger::on_sync()}));
}

TEST(PlanStore, TriggerSnapshotsNeverChange) {
  ExecutionPlanStore store;
  PlanId id = store.add(plan_of({op1()}), ExecutionTrigger::on_sync()).id;
  TriggerSnapshot before = store.triggers(id);
  store.add_trigger(id, ExecutionTrigger::always());
  EXPECT_EQ(*before, TriggerList{ExecutionTrigger::on_sync()});
  EXPECT_EQ(*store.triggers(id), (TriggerList{ExecutionTrigger::on_sync(), ExecutionTrigger::always()}));
  // A no-op add_trigger publishes nothing new.
  TriggerSnapshot after = store.triggers(id);
  store.add_trigger(id, ExecutionTrigger::always());
  EXPECT_EQ(store.triggers(id).get(), after.get());
}

TEST(PlanStore, PlanReferencesAreStableAcrossGrowth) {
  ExecutionPlanStore store;
  store.add(plan_of({op1(), op2()}), ExecutionTrigger::always());
  const ExecutionPlan* first = store.plan(0).get();
  const Operation* first_op = first->operations.data();
  for (std::uint64_t i = 0; i < 5000; ++i) store.add(plan_of({log_op(i, i + 1)}), ExecutionTrigger::always());
  EXPECT_EQ(store.plan(0).get(), first);
  EXPECT_EQ(store.plan(0)->operations.data(), first_op);
  EXPECT_EQ(store.plan(0)->operations, (std::vector<Operation>{op1(), op2()}));
  EXPECT_EQ(store.size(), 5001u);
}

TEST(PlanStore, FindSameFirstKind) {
  ExecutionPlanStore store;
  store.add(plan_of({op1()}), ExecutionTrigger::always());                                            // 0
  store.add(plan_of({op2()}), ExecutionTrigger::always());                                            // 1
  store.add(plan_of({binary(ir::OpKind::Numeric_Add, 7, 8, 9), op2()}), ExecutionTrigger::always());  // 2
  store.add(plan_of({op2(), op1()}), ExecutionTrigger::always());                                     // 3
  EXPECT_EQ(store.find_same_first_kind(binary(ir::OpKind::Numeric_Add, 3, 4, 5)), Ids({0, 2}));
  EXPECT_EQ(store.find_same_first_kind(op2()), Ids({1, 3}));
  EXPECT_EQ(store.find_same_first_kind(op3_sub()), Ids{});
  EXPECT_EQ(store.find_starting_with(binary(ir::OpKind::Numeric_Add, 3, 4, 5)), Ids{});
}

TEST(PlanStore, TriggerToString) {
  EXPECT_EQ(ExecutionTrigger::always().to_string(), "Always");
  EXPECT_EQ(ExecutionTrigger::on_sync().to_string(), "OnSync");
  EXPECT_EQ(ExecutionTrigger::on_operations({op1(), op2(), log_op(0, 1)}).to_string(),
            "OnOperations([NumericFloat::Add, NumericFloat::AddScalar, Float::Log])");
}

TEST(PlanStoreDeathTest, EmptyPlanIsAnInternalError) {
  ExecutionPlanStore store;
#ifdef NDEBUG
  auto r = store.add(plan_of({}), ExecutionTrigger::always());
  EXPECT_EQ(r.id, kInvalidPlanId);
  EXPECT_FALSE(r.inserted);
  EXPECT_EQ(store.size(), 0u);
#else
  EXPECT_DEATH(store.add(plan_of({}), ExecutionTrigger::always()), "at least one op");
#endif
}

TEST(PlanStore, GenerationCountsEveryChangeAndNothingElse) {
  ExecutionPlanStore store;
  EXPECT_EQ(store.generation(), 0u);
  const PlanId id = store.add(plan_of({op1()}), ExecutionTrigger::always()).id;
  EXPECT_EQ(store.generation(), 1u) << "a new plan";
  // Duplicates and reads change nothing a saved copy would miss.
  store.add(plan_of({op1()}), ExecutionTrigger::always());
  store.add_trigger(id, ExecutionTrigger::always());
  (void)store.find_starting_with(op1());
  (void)store.triggers(id);
  EXPECT_EQ(store.generation(), 1u);
  store.add(plan_of({op1()}), ExecutionTrigger::on_sync());  // existing plan, new trigger
  EXPECT_EQ(store.generation(), 2u);
  store.add_trigger(id, ExecutionTrigger::on_operations({op2()}));
  EXPECT_EQ(store.generation(), 3u);
  store.add(plan_of({op1(), op2()}), ExecutionTrigger::always());
  EXPECT_EQ(store.generation(), 4u);
  EXPECT_EQ(store.size(), 2u);
}

// ---- concurrency ------------------------------------------------------------------------------

// 64 distinct sequences over 8 ops: 4 first ops (so 16 plans share each first-op entry), some
// sequences a prefix of others (equality, not prefix matching, decides identity).
constexpr std::size_t kNumSequences = 64;
std::vector<Operation> sequence(std::size_t k) {
  const std::uint64_t f = k % 4, m = (k / 4) % 8;
  std::vector<Operation> ops{log_op(f, 100), log_op(m, 200)};
  if ((k / 32) % 2 == 1) ops.push_back(log_op((f + m) % 8, 300));
  return ops;
}
ExecutionTrigger trigger_for(std::size_t i) {
  switch (i % 4) {
    case 0: return ExecutionTrigger::always();
    case 1: return ExecutionTrigger::on_sync();
    case 2: return ExecutionTrigger::on_operations({log_op(1, 2)});
    default: return ExecutionTrigger::on_operations({log_op(2, 3), log_op(3, 4)});
  }
}

void run_concurrent(ExecutionPlanStore& store) {
  constexpr int kThreads = 8;
  constexpr int kIterations = 1500;
  std::vector<std::map<std::size_t, PlanId>> seen(kThreads);  // sequence -> id each thread got
  std::atomic<int> failures{0};
  std::barrier start(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      start.arrive_and_wait();
      for (int i = 0; i < kIterations; ++i) {
        // Threads walk the sequences at different strides, so the same sequence is added by
        // several threads at once and different ones in between.
        const std::size_t k = (static_cast<std::size_t>(i) * (t % 3 + 1) + static_cast<std::size_t>(t)) % kNumSequences;
        std::vector<Operation> ops = sequence(k);
        const Operation first = ops.front();
        auto r = store.add(plan_of(ops), trigger_for(static_cast<std::size_t>(i) + static_cast<std::size_t>(t)));
        auto [it, fresh] = seen[t].emplace(k, r.id);
        if (!fresh && it->second != r.id) failures.fetch_add(1);
        if (store.plan(r.id)->operations != ops) failures.fetch_add(1);

        // Readers: every id found is resolvable and starts with the op looked up.
        for (PlanId id : store.find_starting_with(first)) {
          if (id >= store.size() || !(store.plan(id)->operations.front() == first)) failures.fetch_add(1);
          if (store.triggers(id)->empty()) failures.fetch_add(1);
        }
        const Ids found = store.find_starting_with(first);
        if (std::find(found.begin(), found.end(), r.id) == found.end()) failures.fetch_add(1);
        if (!std::is_sorted(found.begin(), found.end())) failures.fetch_add(1);

        // Trigger writers racing with the readers above, on any published plan.
        const std::size_t n = store.size();
        store.add_trigger(static_cast<PlanId>((static_cast<std::size_t>(i) * 7 + static_cast<std::size_t>(t)) % n),
                          trigger_for(static_cast<std::size_t>(i) / 3));
        (void)store.find_same_first_kind(first);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);

  // Exactly one plan per distinct sequence: nothing lost, nothing duplicated.
  ASSERT_EQ(store.size(), kNumSequences);
  std::set<std::vector<Operation>, decltype([](const auto& a, const auto& b) {
             return std::lexicographical_compare(
                 a.begin(), a.end(), b.begin(), b.end(),
                 [](const Operation& x, const Operation& y) { return x.to_string() < y.to_string(); });
           })>
      distinct;
  std::map<std::size_t, PlanId> id_of;
  for (std::size_t k = 0; k < kNumSequences; ++k) {
    const std::vector<Operation> ops = sequence(k);
    const Ids found = store.find_starting_with(ops.front());
    std::vector<PlanId> matches;
    for (PlanId id : found) {
      if (store.plan(id)->operations == ops) matches.push_back(id);
    }
    ASSERT_EQ(matches.size(), 1u) << "sequence " << k;
    id_of[k] = matches.front();
  }
  for (PlanId id = 0; id < store.size(); ++id) {
    EXPECT_TRUE(distinct.insert(store.plan(id)->operations).second) << "duplicate plan " << id;
    const TriggerList& triggers = *store.triggers(id);
    EXPECT_FALSE(triggers.empty());
    EXPECT_LE(triggers.size(), 4u);
    for (std::size_t a = 0; a < triggers.size(); ++a) {
      for (std::size_t b = a + 1; b < triggers.size(); ++b) EXPECT_FALSE(triggers[a] == triggers[b]);
    }
  }
  // Each plan arrived with one trigger and every later one was counted once: no increment lost
  // to a race, and none for the many duplicates.
  std::uint64_t changes = 0;
  for (PlanId id = 0; id < store.size(); ++id) changes += store.triggers(id)->size();
  EXPECT_EQ(store.generation(), changes);
  // Every thread saw the same id for the same sequence.
  for (const auto& per_thread : seen) {
    for (const auto& [k, id] : per_thread) EXPECT_EQ(id, id_of.at(k)) << "sequence " << k;
  }
  // Each first op lists its 16 plans in ascending (insertion) order.
  for (std::uint64_t f = 0; f < 4; ++f) {
    const Ids found = store.find_starting_with(log_op(f, 100));
    EXPECT_EQ(found.size(), kNumSequences / 4);
    EXPECT_TRUE(std::is_sorted(found.begin(), found.end()));
  }
}

TEST(PlanStoreConcurrency, ManyThreadsAddFindAndTrigger) {
  ExecutionPlanStore store;
  run_concurrent(store);
}

TEST(PlanStoreConcurrency, ManyThreadsWithEveryOpInOneBucket) {
  ExecutionPlanStore store{ExecutionPlanStore::OpHasher(&collide)};
  run_concurrent(store);
}

TEST(PlanStoreConcurrency, TriggerWritersOnOnePlanLoseNothing) {
  // Copy-on-write CAS: concurrent writers of DIFFERENT triggers must all land; equal ones once.
  ExecutionPlanStore store;
  PlanId id = store.add(plan_of({op1()}), ExecutionTrigger::on_sync()).id;
  constexpr int kThreads = 8;
  constexpr std::uint64_t kPerThread = 50;
  std::barrier start(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      start.arrive_and_wait();
      for (std::uint64_t i = 0; i < kPerThread; ++i) {
        // Threads t and t+4 add the same triggers; readers snapshot in between.
        const std::uint64_t x = static_cast<std::uint64_t>(t % 4) * kPerThread + i;
        store.add_trigger(id, ExecutionTrigger::on_operations({log_op(x, x + 1)}));
        (void)store.triggers(id)->size();
      }
    });
  }
  for (auto& th : threads) th.join();
  const TriggerList& triggers = *store.triggers(id);
  ASSERT_EQ(triggers.size(), 1 + 4 * kPerThread);
  EXPECT_EQ(store.generation(), triggers.size()) << "one count per trigger that landed";
  std::set<std::string> names;
  for (const ExecutionTrigger& tr : triggers)
    names.insert(tr.to_string() + (tr.operations.empty() ? "" : tr.operations[0].to_string()));
  EXPECT_EQ(names.size(), triggers.size());
}

// ---- a bounded store (beyond Burn: PlanStoreOptions::max_plans) ---------------------------------

// Plan k: Log(k -> k+1000), one first op of its own.
ExecutionPlan numbered_plan(std::uint64_t k) { return plan_of({log_op(k, k + 1000)}); }

TEST(BoundedPlanStore, PublishingPastTheBoundEvictsTheColdestEighth) {
  ExecutionPlanStore store(PlanStoreOptions{.max_plans = 16});
  for (std::uint64_t k = 0; k < 16; ++k) ASSERT_EQ(store.add(numbered_plan(k), ExecutionTrigger::always()).id, k);
  EXPECT_EQ(store.size(), 16u);
  EXPECT_EQ(store.evicted(), 0u);
  // Plans 0-3 ran after the others were published: they are the warmest now.
  for (PlanId id : {0, 1, 2, 3}) store.mark_used(id);
  const std::uint64_t generation = store.generation();

  // The 17th plan takes the store past its bound: down to 16 - 16/8 = 14, the three coldest go
  // (plans 4, 5 and 6, published earliest and never run since).
  ASSERT_EQ(store.add(numbered_plan(16), ExecutionTrigger::always()).id, 16u);
  EXPECT_EQ(store.size(), 14u);
  EXPECT_EQ(store.evicted(), 3u);
  EXPECT_EQ(store.generation(), generation + 2) << "the new plan and the eviction";
  EXPECT_EQ(store.ids(), (Ids{0, 1, 2, 3, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}));
  for (PlanId id : {4, 5, 6}) {
    EXPECT_EQ(store.plan(id), nullptr) << "plan " << id;
    EXPECT_EQ(store.triggers(id), nullptr) << "plan " << id;
    EXPECT_TRUE(store.find_starting_with(log_op(id, id + 1000)).empty()) << "plan " << id;
    store.add_trigger(id, ExecutionTrigger::on_sync());  // nothing to add it to: no change
  }
  EXPECT_EQ(store.generation(), generation + 2);
  const Ids same_kind = store.find_same_first_kind(log_op(0, 1));
  EXPECT_EQ(same_kind, store.ids()) << "the kind index forgets the evicted plans too";
  for (PlanId id : {0, 3, 7, 16}) {
    ASSERT_NE(store.plan(id), nullptr) << "plan " << id;
    EXPECT_EQ(store.plan(id)->operations, numbered_plan(id).operations) << "plan " << id;
    EXPECT_EQ(store.find_starting_with(log_op(id, id + 1000)), Ids{id});
  }
}

TEST(BoundedPlanStore, AnEvictedSequenceComesBackUnderANewId) {
  ExecutionPlanStore store(PlanStoreOptions{.max_plans = 8});
  for (std::uint64_t k = 0; k < 9; ++k) store.add(numbered_plan(k), ExecutionTrigger::always());
  ASSERT_EQ(store.plan(0), nullptr) << "plan 0, the coldest, was evicted";
  const auto again = store.add(numbered_plan(0), ExecutionTrigger::on_sync());
  EXPECT_TRUE(again.inserted);
  EXPECT_EQ(again.id, 9u) << "ids are never reused";
  EXPECT_EQ(store.find_starting_with(log_op(0, 1000)), Ids{9});
  EXPECT_EQ(*store.triggers(9), TriggerList{ExecutionTrigger::on_sync()});
}

TEST(BoundedPlanStore, APinnedPlanOutlivesItsEviction) {
  ExecutionPlanStore store(PlanStoreOptions{.max_plans = 4});
  const auto first = store.add(plan_of({op1(), op2()}), ExecutionTrigger::always());
  const PlanPin pinned = store.plan(first.id);
  const TriggerSnapshot triggers = store.triggers(first.id);
  for (std::uint64_t k = 0; k < 8; ++k) store.add(numbered_plan(k), ExecutionTrigger::always());
  ASSERT_EQ(store.plan(first.id), nullptr) << "evicted from the store";
  // What was pinned before is whole: a stream that matched it still runs it.
  EXPECT_EQ(pinned->operations, (std::vector<Operation>{op1(), op2()}));
  EXPECT_EQ(first.plan->operations, (std::vector<Operation>{op1(), op2()}));
  EXPECT_EQ(*triggers, TriggerList{ExecutionTrigger::always()});
}

TEST(BoundedPlanStore, ARecentlyUsedPlanSurvivesEveryEviction) {
  ExecutionPlanStore store(PlanStoreOptions{.max_plans = 8});
  const PlanId hot = store.add(plan_of({op1()}), ExecutionTrigger::always()).id;
  for (std::uint64_t k = 0; k < 200; ++k) {
    store.add(numbered_plan(k), ExecutionTrigger::always());
    store.mark_used(hot);  // it runs between every two new plans
    ASSERT_NE(store.plan(hot), nullptr) << "after plan " << k;
  }
  EXPECT_LE(store.size(), 8u);
  EXPECT_EQ(store.evicted(), 201u - store.size());
}

TEST(BoundedPlanStore, ABoundOfOneKeepsThePlanJustPublished) {
  ExecutionPlanStore store(PlanStoreOptions{.max_plans = 1});
  for (std::uint64_t k = 0; k < 5; ++k) {
    const auto r = store.add(numbered_plan(k), ExecutionTrigger::always());
    EXPECT_EQ(store.ids(), Ids{r.id}) << "plan " << k;
    EXPECT_NE(store.plan(r.id), nullptr);
  }
  EXPECT_EQ(store.evicted(), 4u);
}

ExecutionTrigger tail(std::uint64_t k) { return ExecutionTrigger::on_operations({log_op(k, k + 1)}); }

TEST(BoundedPlanStore, PastTheTriggerCapTheOldestTailIsDropped) {
  ExecutionPlanStore store(PlanStoreOptions{.max_plan_triggers = 2});
  const PlanId id = store.add(plan_of({op1()}), ExecutionTrigger::always()).id;
  store.add_trigger(id, tail(1));
  store.add_trigger(id, tail(2));
  EXPECT_EQ(*store.triggers(id), (TriggerList{ExecutionTrigger::always(), tail(1), tail(2)}));
  const std::uint64_t generation = store.generation();
  store.add_trigger(id, tail(3));  // a third tail: the first goes
  EXPECT_EQ(*store.triggers(id), (TriggerList{ExecutionTrigger::always(), tail(2), tail(3)}));
  EXPECT_EQ(store.generation(), generation + 1);
  store.add_trigger(id, ExecutionTrigger::on_sync());  // not a tail: the cap does not count it
  EXPECT_EQ(*store.triggers(id),
            (TriggerList{ExecutionTrigger::always(), tail(2), tail(3), ExecutionTrigger::on_sync()}));
  store.add_trigger(id, tail(3));  // already there: nothing changes
  EXPECT_EQ(store.triggers(id)->size(), 4u);
  EXPECT_EQ(store.generation(), generation + 2);
}

TEST(PlanStore, WithoutATriggerCapEveryTailIsKept) {
  ExecutionPlanStore store;
  const PlanId id = store.add(plan_of({op1()}), ExecutionTrigger::always()).id;
  for (std::uint64_t k = 0; k < 300; ++k) store.add_trigger(id, tail(k));
  EXPECT_EQ(store.triggers(id)->size(), 301u);
}

// A replaced trigger list lives as long as a snapshot of it, no longer: a plan's triggers cost
// memory in proportion to their number. (Every old list was once kept for the store's life: a
// plan given k tails held k lists of up to k triggers, and the soak grew to 16 GiB.)
TEST(PlanStore, ReplacedTriggerListsAreFreedOnceNoSnapshotHoldsThem) {
  ExecutionPlanStore store;
  const PlanId id = store.add(plan_of({op1()}), ExecutionTrigger::always()).id;
  std::weak_ptr<const TriggerList> first = store.triggers(id);
  TriggerSnapshot held = store.triggers(id);
  store.add_trigger(id, tail(1));
  std::weak_ptr<const TriggerList> second = store.triggers(id);
  store.add_trigger(id, tail(2));
  EXPECT_TRUE(second.expired()) << "no snapshot held the second list: it is gone";
  EXPECT_FALSE(first.expired()) << "a reader still holds the first list";
  EXPECT_EQ(*held, TriggerList{ExecutionTrigger::always()});
  held.reset();
  EXPECT_TRUE(first.expired());
}

TEST(BoundedPlanStore, WithoutABoundNothingIsEvictedAndIdsStayDense) {
  ExecutionPlanStore store;
  EXPECT_EQ(store.max_plans(), 0u);
  for (std::uint64_t k = 0; k < 1000; ++k) store.add(numbered_plan(k), ExecutionTrigger::always());
  EXPECT_EQ(store.size(), 1000u);
  EXPECT_EQ(store.evicted(), 0u);
  const Ids ids = store.ids();
  ASSERT_EQ(ids.size(), 1000u);
  for (PlanId id = 0; id < 1000; ++id) EXPECT_EQ(ids[id], id);
}

// Threads publish, pin, find and mark plans while the bound keeps evicting (run under TSan too):
// every plan found is either whole (its operations are the sequence it was found under) or
// gone, never half there, and the store ends within its bound with its indexes consistent.
TEST(BoundedPlanStoreConcurrency, EvictionRacesWithReadersAndWriters) {
  constexpr std::size_t kBound = 32;
  constexpr int kThreads = 6, kIterations = 3000;
  ExecutionPlanStore store(PlanStoreOptions{.max_plans = kBound});
  std::atomic<int> failures{0};
  std::barrier start(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      start.arrive_and_wait();
      for (int i = 0; i < kIterations; ++i) {
        // 256 sequences: more than the bound, so plans come, go and come back.
        const std::uint64_t k = (static_cast<std::uint64_t>(i) * (2 * t + 1) + static_cast<std::uint64_t>(t)) % 256;
        const std::vector<Operation> ops{log_op(k % 16, 100), log_op(k, 200)};
        auto r = store.add(plan_of(ops), trigger_for(static_cast<std::size_t>(i)));
        if (r.plan == nullptr || r.plan->operations != ops) failures.fetch_add(1);
        for (PlanId id : store.find_starting_with(ops.front())) {
          const PlanPin p = store.plan(id);
          if (p != nullptr && !(p->operations.front() == ops.front())) failures.fetch_add(1);
          const TriggerSnapshot tr = store.triggers(id);
          if (tr != nullptr && tr->empty()) failures.fetch_add(1);
          store.mark_used(id);
        }
        store.add_trigger(r.id, ExecutionTrigger::on_sync());
        (void)store.find_same_first_kind(ops.front());
        if (i % 64 == 0) (void)store.ids();
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_LE(store.size(), kBound);
  EXPECT_GT(store.evicted(), 0u);
  // The indexes name exactly the kept plans.
  const Ids kept = store.ids();
  EXPECT_EQ(kept.size(), store.size());
  std::set<PlanId> indexed;
  for (std::uint64_t f = 0; f < 16; ++f)
    for (PlanId id : store.find_starting_with(log_op(f, 100))) EXPECT_TRUE(indexed.insert(id).second);
  EXPECT_EQ(indexed, std::set<PlanId>(kept.begin(), kept.end()));
  EXPECT_EQ(store.find_same_first_kind(log_op(0, 100)), kept);
  for (PlanId id : kept) EXPECT_NE(store.plan(id), nullptr);
}

// ---- Usage and retirement (kilnctl plans; beyond Burn)

TEST(PlanUsage, HitsLastUseAndTheTagsThatRanAPlan) {
  ExecutionPlanStore store;
  const PlanId id = store.add(plan_of({op1()}), ExecutionTrigger::always(), 7).id;
  std::optional<PlanUsage> u = store.usage(id);
  ASSERT_TRUE(u.has_value());
  EXPECT_EQ(u->hits, 0u);
  EXPECT_EQ(u->creator_tag, 7u);
  EXPECT_TRUE(u->user_tags.empty());
  EXPECT_GT(u->last_used_ms, 1'700'000'000'000) << "a Unix time in ms, stamped at publication";
  const std::uint64_t generation = store.generation();
  store.record_hit(id, 7);
  store.record_hit(id, 7);
  store.record_hit(id, 3);
  store.record_hit(id, 0);  // untagged: counted, no tag
  u = store.usage(id);
  EXPECT_EQ(u->hits, 4u);
  EXPECT_EQ(u->user_tags, (std::vector<std::uint32_t>{7, 3}));
  EXPECT_FALSE(u->more_users);
  EXPECT_EQ(store.generation(), generation) << "usage is not a change a saved copy misses";
  for (std::uint32_t tag = 10; tag < 10 + kPlanUserTags; ++tag) store.record_hit(id, tag);
  u = store.usage(id);
  EXPECT_EQ(u->user_tags.size(), kPlanUserTags);
  EXPECT_TRUE(u->more_users);
  EXPECT_EQ(store.usage(id + 1), std::nullopt);
  store.record_hit(id + 1, 1);  // no such plan: nothing happens
}

TEST(PlanUsage, TagsRecordedConcurrentlyAreEachKeptOnce) {
  ExecutionPlanStore store;
  const PlanId id = store.add(plan_of({op1()}), ExecutionTrigger::always()).id;
  std::vector<std::jthread> threads;
  for (std::uint32_t t = 1; t <= 4; ++t)
    threads.emplace_back([&store, id, t] {
      for (int i = 0; i < 1000; ++i) store.record_hit(id, 1 + (t + i) % 4);
    });
  threads.clear();
  const PlanUsage u = *store.usage(id);
  EXPECT_EQ(u.hits, 4000u);
  std::vector<std::uint32_t> tags = u.user_tags;
  std::sort(tags.begin(), tags.end());
  EXPECT_EQ(tags, (std::vector<std::uint32_t>{1, 2, 3, 4}));
}

TEST(PlanRetirement, RetiredPlansLeaveEveryLookUpButStayValidForTheirHolders) {
  ExecutionPlanStore store;
  const auto mine = store.add(plan_of({op1(), op2()}), ExecutionTrigger::always(), 1);
  const auto theirs = store.add(plan_of({log_op(0, 1)}), ExecutionTrigger::always(), 2);
  const PlanPin pinned = store.plan(mine.id);
  const std::uint64_t generation = store.generation();
  EXPECT_EQ(store.retire(1), 1u);
  EXPECT_EQ(store.plan(mine.id), nullptr);
  EXPECT_EQ(store.usage(mine.id), std::nullopt);
  EXPECT_TRUE(store.find_starting_with(op1()).empty()) << "no longer matched";
  EXPECT_TRUE(store.find_same_first_kind(op1()).empty());
  EXPECT_EQ(store.ids(), Ids{theirs.id});
  EXPECT_GT(store.generation(), generation) << "the plan cache's next save leaves it out";
  EXPECT_EQ(pinned->operations, (std::vector<Operation>{op1(), op2()})) << "a stream holding it runs it to the end";
  EXPECT_EQ(store.retired(), 1u);
  EXPECT_EQ(store.evicted(), 0u);
  // The sequence comes back under a new id when explored again; ids are never reused.
  const auto again = store.add(plan_of({op1(), op2()}), ExecutionTrigger::always(), 1);
  EXPECT_TRUE(again.inserted);
  EXPECT_EQ(again.id, 2u);
  EXPECT_EQ(store.retire(std::nullopt), 2u);
  EXPECT_EQ(store.size(), 0u);
  EXPECT_EQ(store.retire(std::nullopt), 0u);
  EXPECT_EQ(store.retired(), 3u);
}

}  // namespace
}  // namespace kiln::fusion
