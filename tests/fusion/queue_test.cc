// OperationQueue (docs/spec/fusion.md §4) and plan execution against it (§15: the two safety checks, run,
// drain_queue, deferred frees).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "kiln/fusion/operation_queue.h"
#include "kiln/fusion/recording_executor.h"
#include "pattern_fuser.h"

namespace kiln::fusion::testing {
namespace {

using ir::Operation;
using ir::TensorStatus;

Operation exp_op(std::uint64_t in, TensorStatus s, std::uint64_t out, ir::Shape shape = {64, 32}) {
  Operation op;
  op.kind = ir::OpKind::Float_Exp;
  op.family = ir::Family::Float;
  op.num_inputs = 1;
  op.tensors = {T(in, shape, s), T(out, shape, TensorStatus::NotInit)};
  return op;
}

class ShapeIdOptimization final : public Optimization {
 public:
  ShapeIdOptimization(std::size_t n, std::uint64_t id) : n_(n), id_(id) {}
  std::size_t len() const override { return n_; }
  std::string_view name() const override { return "ShapeId"; }
  std::optional<std::uint64_t> max_relative_shape_id() const override { return id_; }

 private:
  std::size_t n_;
  std::uint64_t id_;
};

TEST(OperationQueue, AddRelativizesAndTracksShapesAndVariables) {
  OperationQueue q;
  q.add(exp_op(10, TensorStatus::ReadOnly, 11));
  q.add(exp_op(11, TensorStatus::ReadWrite, 12));
  ASSERT_EQ(q.size(), 2u);
  EXPECT_EQ(q.relative()[0].tensors[0].id, ir::TensorId(0));
  EXPECT_EQ(q.relative()[1].tensors[0].id, ir::TensorId(1));
  EXPECT_EQ(q.relative()[0].tensors[0].shape, (ir::Shape{1, 2}));
  // 1 <-> 0 seed, then 64 -> 1, 32 -> 2: three relative dim ids after the first op.
  EXPECT_EQ(q.shapes_assigned()[0], 3u);
  EXPECT_EQ(q.shapes_assigned()[1], 3u);
  EXPECT_TRUE(q.references_tensor(ir::TensorId(11)));
  EXPECT_FALSE(q.references_tensor(ir::TensorId(99)));
  EXPECT_EQ(q.variables().at(ir::TensorId(11)), TensorStatus::ReadWrite) << "the latest occurrence wins";
}

TEST(OperationQueue, RunDrainsExecutedPrefixAndReRelativizes) {
  OperationQueue q;
  RecordingExecutor ex;
  ex.materialize(ir::TensorId(10));
  FusionLog log;
  q.add(exp_op(10, TensorStatus::ReadWrite, 11));
  q.add(exp_op(11, TensorStatus::ReadWrite, 12));
  q.run(BlockOptimization(U({0}), {0}), ex, log);
  ASSERT_EQ(q.size(), 1u);
  EXPECT_EQ(q.global()[0].tensors[0].id, ir::TensorId(11));
  EXPECT_EQ(q.relative()[0].tensors[0].id, ir::TensorId(0)) << "renumbered from 0 after execution";
  EXPECT_FALSE(ex.has_handle(ir::TensorId(10)));
  EXPECT_TRUE(ex.has_handle(ir::TensorId(11)));
  EXPECT_EQ(q.variables().count(ir::TensorId(10)), 0u);
}

TEST(OperationQueue, ShapeIdGuardRunsUnfused) {  // §15.1 check 1, §19.14
  auto capture = std::make_shared<LogCapture>();
  FusionLog log = FusionLog::to_capture(LogLevel::Medium, capture);
  OperationQueue q;
  RecordingExecutor ex;
  q.add(exp_op(10, TensorStatus::ReadOnly, 11));
  ExecutionPlanStore store;
  // The plan's kernel bakes in relative dim id 3, but this queue's one-op prefix assigned 3 ids
  // (0, 1, 2): 3 >= 3 -> unfused.
  auto added = store.add(
      ExecutionPlan{{q.relative()[0]},
                    BlockOptimization(
                        ExecutionStrategy::optimization(std::make_shared<ShapeIdOptimization>(1, 3), {0}, 10), {0})},
      ExecutionTrigger::always());
  q.execute_plan(added.id, *added.plan, ex, log);
  EXPECT_EQ(q.size(), 0u);
  ASSERT_EQ(ex.records().size(), 1u);
  EXPECT_FALSE(ex.records()[0].fused);
  ASSERT_EQ(capture->lines().size(), 1u);
  EXPECT_EQ(capture->lines()[0],
            "[plan] #0 needs relative shape id 3 but the stream assigned 3; running its 1 operations unfused");
}

TEST(OperationQueue, ShapeIdWithinPrefixRunsFused) {
  FusionLog log;
  OperationQueue q;
  RecordingExecutor ex;
  q.add(exp_op(10, TensorStatus::ReadOnly, 11));
  ExecutionPlanStore store;
  auto added = store.add(
      ExecutionPlan{{q.relative()[0]},
                    BlockOptimization(
                        ExecutionStrategy::optimization(std::make_shared<ShapeIdOptimization>(1, 2), {0}, 10), {0})},
      ExecutionTrigger::always());
  q.execute_plan(added.id, *added.plan, ex, log);
  ASSERT_EQ(ex.records().size(), 1u);
  EXPECT_TRUE(ex.records()[0].fused);
}

TEST(OperationQueue, PositionsBeyondTheQueueRunUnfused) {  // §15.1 check 2
  auto capture = std::make_shared<LogCapture>();
  FusionLog log = FusionLog::to_capture(LogLevel::Medium, capture);
  OperationQueue q;
  RecordingExecutor ex;
  q.add(exp_op(10, TensorStatus::ReadOnly, 11));
  ExecutionPlanStore store;
  auto added =
      store.add(ExecutionPlan{{q.relative()[0]}, BlockOptimization(U({0, 1}), {0, 1})}, ExecutionTrigger::always());
  q.execute_plan(added.id, *added.plan, ex, log);
  EXPECT_EQ(q.size(), 0u);
  EXPECT_EQ(ex.executed().size(), 1u);
  ASSERT_EQ(capture->lines().size(), 1u);
  EXPECT_EQ(capture->lines()[0], "[plan] #0 names operation 1 but the queue holds 1; running 1 operations unfused");
}

TEST(OperationQueue, DeferredFreesWaitForTheLastReference) {
  FusionLog log;
  OperationQueue q;
  RecordingExecutor ex;
  ex.materialize(ir::TensorId(10));
  q.add(exp_op(10, TensorStatus::ReadOnly, 11));
  q.add(exp_op(11, TensorStatus::ReadOnly, 12));
  q.defer_free(T(10, {64, 32}, TensorStatus::ReadWrite));
  q.flush_deferred(ex);
  EXPECT_TRUE(ex.has_handle(ir::TensorId(10))) << "still referenced by a queued op";
  q.run(BlockOptimization(U({0}), {0}), ex, log);  // an execution boundary
  EXPECT_FALSE(ex.has_handle(ir::TensorId(10)));
  EXPECT_TRUE(q.deferred_frees().empty());
}

}  // namespace
}  // namespace kiln::fusion::testing
