// MultiStream reads and foreign drops (docs/spec/fusion.md §19.11 items 1–8): a single fuser that is always
// Open and never ready (ops accumulate until a drain); executed ops register their outputs.
#include <gtest/gtest.h>

#include "kiln/fusion/multi_stream.h"
#include "kiln/fusion/recording_executor.h"
#include "pattern_fuser.h"

namespace kiln::fusion::testing {
namespace {

using ir::TensorId;
using ir::TensorStatus;

class AlwaysOpenFuser final : public OperationFuser {
 public:
  void fuse(const ir::Operation&) override { ++n_; }
  FuserStatus status() const override { return FuserStatus::Open; }
  FuserProperties properties() const override { return {false, 0}; }
  std::size_t len() const override { return n_; }
  OptimizationPtr finish() override { return std::make_shared<TestOptimization>(99, n_); }
  void reset() override { n_ = 0; }
  std::unique_ptr<OperationFuser> clone() const override { return std::make_unique<AlwaysOpenFuser>(*this); }

 private:
  std::size_t n_ = 0;
};

ir::Operation exp_op(std::uint64_t i, std::uint64_t o) {
  ir::Operation op;
  op.kind = ir::OpKind::Float_Exp;
  op.family = ir::Family::Float;
  op.num_inputs = 1;
  op.tensors = {T(i, TensorStatus::ReadOnly), T(o, TensorStatus::NotInit)};
  return op;
}

struct Harness {
  FusionLog log;
  ExecutionPlanStore store;
  RecordingExecutor ex;
  MultiStream streams{[] { return fuser_list(std::make_unique<AlwaysOpenFuser>()); }, ProcessorOptions{}, log, store};
  StreamId s{0};
  MultiStream::Presence present = [this](TensorId id) { return ex.has_handle(id); };

  void add(ir::Operation op) { streams.register_op(s, std::move(op), ex); }
  std::vector<ir::Operation> composition() const {
    auto c = streams.composition(s);
    return {c.begin(), c.end()};
  }
};

// Runs a three-op sequence with `inject` called at a chosen point; returns the composition.
template <class Inject>
std::vector<ir::Operation> run_with_injection(const std::vector<ir::Operation>& ops, std::size_t at, Inject inject,
                                              bool* handled) {
  Harness h;
  h.ex.materialize(TensorId(100));
  for (std::size_t i = 0; i < ops.size(); ++i) {
    if (i == at) *handled = inject(h);
    h.add(ops[i]);
  }
  if (at == ops.size()) *handled = inject(h);
  return h.composition();
}

TEST(MultiStreamReads, ForeignDropNeverCutsTheSegment) {  // §19.11 item 1
  const std::vector<ir::Operation> a = {exp_op(0, 1), exp_op(1, 2), exp_op(2, 3)};
  const std::vector<ir::Operation> b = {exp_op(100, 1), exp_op(1, 2), exp_op(2, 3)};
  auto drop = [](Harness& h) { return h.streams.foreign_drop(h.s, T(100, TensorStatus::ReadWrite), h.ex, h.present); };
  bool handled = false;
  auto reference_a = run_with_injection(a, 99, drop, &handled);
  for (std::size_t at : {std::size_t{0}, a.size()}) {
    handled = false;
    EXPECT_EQ(run_with_injection(a, at, drop, &handled), reference_a);
    EXPECT_TRUE(handled);
    EXPECT_EQ(reference_a.size(), 3u);
  }
  auto reference_b = run_with_injection(b, 99, drop, &handled);
  handled = false;
  EXPECT_EQ(run_with_injection(b, 1, drop, &handled), reference_b);
  EXPECT_TRUE(handled);
  EXPECT_EQ(reference_b.size(), 3u);
}

TEST(MultiStreamReads, ConsumingReadOfMaterializedTensorNeverDrains) {  // §19.11 item 2
  const std::vector<ir::Operation> a = {exp_op(0, 1), exp_op(1, 2), exp_op(2, 3)};
  const std::vector<ir::Operation> b = {exp_op(100, 1), exp_op(1, 2), exp_op(2, 3)};
  auto read = [](Harness& h) {
    const auto plan = h.streams.read_plan(h.s, T(100, TensorStatus::ReadWrite), h.present);
    h.streams.read(h.s, T(100, TensorStatus::ReadWrite), h.ex, h.present);
    return plan != ReadPlan::Drain;
  };
  bool not_drained = false;
  auto reference_a = run_with_injection(a, 99, read, &not_drained);
  for (std::size_t at : {std::size_t{0}, a.size()}) {
    EXPECT_EQ(run_with_injection(a, at, read, &not_drained), reference_a);
    EXPECT_TRUE(not_drained);
  }
  auto reference_b = run_with_injection(b, 99, read, &not_drained);
  EXPECT_EQ(run_with_injection(b, 1, read, &not_drained), reference_b);
  EXPECT_TRUE(not_drained);
}

TEST(MultiStreamReads, ReadOfUnproducedTensorDrains) {  // item 3
  Harness h;
  h.add(exp_op(0, 1));
  EXPECT_EQ(h.streams.read_plan(h.s, T(1, TensorStatus::ReadWrite), h.present), ReadPlan::Drain);
}

TEST(MultiStreamReads, LastUseReadOfReferencedTensorDefersTheFree) {  // item 4
  Harness h;
  h.ex.materialize(TensorId(0));
  h.add(exp_op(0, 1));
  EXPECT_EQ(h.streams.read_plan(h.s, T(0, TensorStatus::ReadWrite), h.present), ReadPlan::DeferFree);
  auto used = h.streams.read(h.s, T(0, TensorStatus::ReadWrite), h.ex, h.present);
  EXPECT_EQ(used.status, TensorStatus::ReadOnly);
  EXPECT_TRUE(h.ex.has_handle(TensorId(0)));
  EXPECT_EQ(h.composition().size(), 1u);
  h.streams.drain(h.s, h.ex);
  EXPECT_TRUE(h.ex.has_handle(TensorId(1)));
  EXPECT_FALSE(h.ex.has_handle(TensorId(0)));
}

TEST(MultiStreamReads, ReadAfterDrainIsDirect) {  // item 5
  Harness h;
  h.ex.materialize(TensorId(0));
  h.add(exp_op(0, 1));
  h.streams.drain(h.s, h.ex);
  EXPECT_EQ(h.streams.read_plan(h.s, T(0, TensorStatus::ReadWrite), h.present), ReadPlan::Direct);
}

TEST(MultiStreamDrops, DropOfUnproducedTensorFallsBack) {  // item 6
  Harness h;
  h.add(exp_op(0, 1));
  EXPECT_FALSE(h.streams.foreign_drop(h.s, T(1, TensorStatus::ReadWrite), h.ex, h.present));
  EXPECT_EQ(h.composition().size(), 1u);
}

TEST(MultiStreamDrops, DropOfReferencedTensorIsDeferred) {  // item 7
  Harness h;
  h.ex.materialize(TensorId(0));
  h.add(exp_op(0, 1));
  EXPECT_TRUE(h.streams.foreign_drop(h.s, T(0, TensorStatus::ReadWrite), h.ex, h.present));
  EXPECT_TRUE(h.ex.has_handle(TensorId(0)));
  EXPECT_EQ(h.composition().size(), 1u);
  h.streams.drain(h.s, h.ex);
  EXPECT_FALSE(h.ex.has_handle(TensorId(0)));
}

TEST(MultiStreamDrops, DropAfterDrainFreesAndForgets) {  // item 8
  Harness h;
  h.ex.materialize(TensorId(0));
  h.add(exp_op(0, 1));
  h.streams.drain(h.s, h.ex);
  EXPECT_TRUE(h.streams.foreign_drop(h.s, T(0, TensorStatus::ReadWrite), h.ex, h.present));
  EXPECT_FALSE(h.ex.has_handle(TensorId(0)));
  const FusionStream* s = h.streams.stream(h.s);
  if (s) {
    EXPECT_EQ(s->queue().variables().count(TensorId(0)), 0u);
  }
}

TEST(MultiStreamDrops, FallbackDrainsThenQueuesTheDrop) {
  Harness h;
  h.add(exp_op(0, 1));
  h.streams.register_foreign_drop(h.s, T(1, TensorStatus::ReadWrite), h.ex, h.present);
  EXPECT_TRUE(h.ex.has_handle(TensorId(1))) << "the producer was drained first";
  ASSERT_EQ(h.composition().size(), 1u);
  EXPECT_TRUE(h.composition()[0].is_drop()) << "then the drop was queued";
  h.streams.drain(h.s, h.ex);
  EXPECT_FALSE(h.ex.has_handle(TensorId(1)));
}

TEST(MultiStreamStreams, StreamRemovedWhenItsLastVariableIsRead) {  // §16.6
  Harness h;
  h.ex.materialize(TensorId(0));
  h.add(exp_op(0, 1));
  h.streams.drain(h.s, h.ex);
  ASSERT_EQ(h.streams.num_streams(), 1u);
  h.streams.read(h.s, T(0, TensorStatus::ReadWrite), h.ex, h.present);
  h.streams.read(h.s, T(1, TensorStatus::ReadWrite), h.ex, h.present);
  EXPECT_EQ(h.streams.num_streams(), 0u);
}

TEST(MultiStreamStreams, SharedViewDrainsOnlyTheFirstTime) {
  Harness h;
  h.add(exp_op(0, 1));
  StreamId other(1);
  EXPECT_TRUE(h.streams.prepare_shared_view(h.s, TensorId(1), h.ex, h.present));
  EXPECT_TRUE(h.ex.has_handle(TensorId(1)));
  EXPECT_FALSE(h.streams.prepare_shared_view(h.s, TensorId(1), h.ex, h.present));
  EXPECT_EQ(StreamId::from_number(3).value(), (std::uint64_t{1} << 63) | 3u);
  (void)other;
}

// The per-stream rules the runtime's stream actors call directly (no MultiStream around them).
TEST(StreamRules, ReadPlanServeReadAndForeignDropOnOneQueue) {
  OperationQueue q;
  q.add(exp_op(0, 1));  // queued: reads t0
  // Not materialized: drain first, whatever the status.
  EXPECT_EQ(read_plan(&q, T(0, TensorStatus::ReadOnly), false), ReadPlan::Drain);
  // Materialized, not a last use: direct.
  EXPECT_EQ(read_plan(&q, T(0, TensorStatus::ReadOnly), true), ReadPlan::Direct);
  // A last use of a tensor the queue still reads: defer its free; read it ReadOnly.
  EXPECT_EQ(read_plan(&q, T(0, TensorStatus::ReadWrite), true), ReadPlan::DeferFree);
  const ir::TensorIr used = serve_read(q, T(0, TensorStatus::ReadWrite), ReadPlan::DeferFree);
  EXPECT_EQ(used.status, TensorStatus::ReadOnly);
  ASSERT_EQ(q.deferred_frees().size(), 1u);
  EXPECT_EQ(q.deferred_frees()[0].id, TensorId(0));
  // A last use the queue does not read (or no queue at all): direct, and the variable is forgotten.
  EXPECT_EQ(read_plan(&q, T(7, TensorStatus::ReadWrite), true), ReadPlan::Direct);
  EXPECT_EQ(read_plan(nullptr, T(0, TensorStatus::ReadWrite), true), ReadPlan::Direct);
  EXPECT_EQ(q.variables().count(TensorId(1)), 1u);
  EXPECT_EQ(serve_read(q, T(1, TensorStatus::ReadWrite), ReadPlan::Direct).status, TensorStatus::ReadWrite);
  EXPECT_EQ(q.variables().count(TensorId(1)), 0u);
  // Foreign drops: deferred while queued ops read the tensor, the caller frees it otherwise.
  EXPECT_TRUE(defer_foreign_drop(q, T(0, TensorStatus::ReadWrite)));
  EXPECT_EQ(q.deferred_frees().size(), 2u);
  EXPECT_FALSE(defer_foreign_drop(q, T(9, TensorStatus::ReadWrite)));
  EXPECT_EQ(q.deferred_frees().size(), 2u);
}

}  // namespace
}  // namespace kiln::fusion::testing
