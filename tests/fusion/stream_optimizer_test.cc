// StreamOptimizer (docs/spec/fusion.md §9), BlocksOptimizer (§10.5) and repair_order (§10.6):
// §19.7 items 1-14 and §19.8 items 1-5.
#include "kiln/fusion/stream_optimizer.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "pattern_fuser.h"

namespace kiln::fusion {
namespace {

using testing::add;
using testing::add_rw;
using testing::C;
using testing::fuser_list;
using testing::O;
using testing::P;
using testing::U;

using Ops = std::vector<ir::Operation>;

const ir::Operation a1 = add(100, 101, 102);
const ir::Operation a2 = add(102, 103, 104);
const ir::Operation a3 = add(104, 105, 106);
const ir::Operation b1 = add(200, 201, 202);
const ir::Operation b2 = add(202, 203, 204);

// Registers every op, then commits.
struct Harness {
  std::shared_ptr<LogCapture> capture = std::make_shared<LogCapture>();
  FusionLog log;
  std::unique_ptr<StreamOptimizer> so;

  Harness(FuserList fusers, std::optional<std::size_t> max_blocks = StreamOptimizer::kDefaultMaxBlocks,
          LogLevel level = LogLevel::Full)
      : log(FusionLog::to_capture(level, capture)),
        so(std::make_unique<StreamOptimizer>(std::move(fusers), max_blocks, log)) {}

  void register_all(const Ops& ops) {
    for (const auto& op : ops) so->register_op(op);
  }
  std::vector<std::string> lines() const { return capture->lines(); }
  bool logged(const std::string& line) const {
    auto l = lines();
    return std::find(l.begin(), l.end(), line) != l.end();
  }
};

BlockOptimization bo(ExecutionStrategy s, Ordering o) { return BlockOptimization(std::move(s), std::move(o)); }

// ---------------------------------------------------------------------------------------------
// §19.7
// ---------------------------------------------------------------------------------------------

TEST(StreamOptimizer, Item1SingleFusion) {
  Harness r(fuser_list(P(0, {a1, a2})));
  Ops ops = {a1, a2};
  r.register_all(ops);
  EXPECT_EQ(r.so->optimize(ops), bo(O(0, 2, {0, 1}, 2), {0, 1}));
}

TEST(StreamOptimizer, Item2TwoIndependentFusions) {
  Harness r(fuser_list(P(0, {a1, a2}), P(1, {b1, b2})));
  Ops ops = {a1, a2, b1, b2};
  r.register_all(ops);
  EXPECT_EQ(r.so->num_blocks(), 2u);
  EXPECT_EQ(r.so->optimize(ops), bo(C({O(0, 2, {0, 1}, 2), O(1, 2, {2, 3}, 2)}), {0, 1, 2, 3}));
}

TEST(StreamOptimizer, Item3Interleaved) {
  Harness r(fuser_list(P(0, {a1, a2}), P(1, {b1, b2})));
  Ops ops = {a1, b1, a2, b2};
  r.register_all(ops);
  EXPECT_EQ(r.so->optimize(ops), bo(C({O(0, 2, {0, 2}, 2), O(1, 2, {1, 3}, 2)}), {0, 2, 1, 3}));
}

TEST(StreamOptimizer, Item4InterleavedSingleFuserMergesTheBlocks) {
  Harness r(fuser_list(P(0, {a1, a2, b1, b2})));
  Ops ops = {a1, b1, a2, b2};
  r.register_all(ops);
  EXPECT_EQ(r.so->num_blocks(), 2u);
  EXPECT_EQ(r.so->optimize(ops), bo(O(0, 4, {0, 2, 1, 3}, 4), {0, 2, 1, 3}));
}

TEST(StreamOptimizer, Item5InterleavedPartialFusion) {
  Harness r(fuser_list(P(0, {a1, a2})));
  Ops ops = {a1, b1, a2, b2};
  r.register_all(ops);
  EXPECT_EQ(r.so->optimize(ops), bo(C({O(0, 2, {0, 2}, 2), U({1, 3})}), {0, 2, 1, 3}));
}

TEST(StreamOptimizer, Item6HeadSettlement) {
  // (0.22.1) the fuser closed at index 0 and a fresh fuser would start on a2: only [0] settles.
  Harness r(fuser_list(P(0, {a2, a1})));
  Ops ops = {a1, a2};
  r.register_all(ops);
  EXPECT_FALSE(r.so->still_optimizing());
  BlockOptimization out = r.so->optimize(ops);
  EXPECT_EQ(out, bo(U({0}), {0}));
  // Sync: the Explorer folds the trailing position in unfused.
  out.include_trailing(ops.size());
  EXPECT_EQ(out, bo(C({U({0}), U({1})}), {0, 1}));
}

TEST(StreamOptimizer, Item7FuserStillOpenSettlesTheWholeBlock) {
  Harness r(fuser_list(P(0, {a1, a2, a3})));
  Ops ops = {a1, a2};
  r.register_all(ops);
  EXPECT_TRUE(r.so->still_optimizing());
  EXPECT_EQ(r.so->optimize(ops), bo(U({0, 1}), {0, 1}));
}

TEST(StreamOptimizer, Item8ReadyFuserWhileAnotherIsOpen) {
  Harness r(fuser_list(P(0, {a1, a2}), P(1, {a1, a2, a3})));
  Ops ops = {a1, a2};
  r.register_all(ops);
  EXPECT_TRUE(r.so->still_optimizing());
  EXPECT_EQ(r.so->optimize(ops), bo(O(0, 2, {0, 1}, 2), {0, 1}));
}

TEST(StreamOptimizer, Item9HigherScoreWins) {
  Harness r(fuser_list(P(0, {a1, a2}), P(1, {a1, a2, a3})));
  Ops ops = {a1, a2, a3};
  r.register_all(ops);
  EXPECT_FALSE(r.so->still_optimizing());
  EXPECT_EQ(r.so->optimize(ops), bo(O(1, 3, {0, 1, 2}, 3), {0, 1, 2}));
}

TEST(StreamOptimizer, Item10NoFusionClosedAtTheLastOp) {
  Harness r(fuser_list(P(0, {a1, b1})));
  Ops ops = {a1, a2};
  r.register_all(ops);
  EXPECT_FALSE(r.so->still_optimizing());
  EXPECT_EQ(r.so->optimize(ops), bo(U({0, 1}), {0, 1}));
}

TEST(StreamOptimizer, Item11MergePassFoldsAnUnrelatedBlock) {
  Harness r(fuser_list(P(0, {a1, a2, b1, b2})));
  Ops ops = {a1, b1, a2};
  r.register_all(ops);
  EXPECT_EQ(r.so->num_blocks(), 2u);
  EXPECT_TRUE(r.so->still_optimizing());
  EXPECT_EQ(r.so->optimize(ops), bo(U({0, 2, 1}), {0, 2, 1}));
}

TEST(StreamOptimizer, Item12DependentBlock) {
  const ir::Operation c = add(104, 204, 105);
  Harness r(fuser_list(P(0, {a1, a2}), P(1, {b1, b2})));
  Ops ops = {a1, a2, b1, b2, c};
  r.register_all(ops);
  EXPECT_EQ(r.so->num_blocks(), 3u);
  EXPECT_EQ(r.so->length(), 5u);
  EXPECT_FALSE(r.so->stopped());
  EXPECT_EQ(r.so->optimize(ops), bo(C({O(0, 2, {0, 1}, 2), O(1, 2, {2, 3}, 2), U({4})}), {0, 1, 2, 3, 4}));
  EXPECT_EQ(r.lines(), (std::vector<std::string>{
                           "[stream] op 0 NumericFloat::Add → new block (total: 1)",
                           "[stream] op 1 NumericFloat::Add → accepted in 1/1 block(s)",
                           "[stream] op 2 NumericFloat::Add → new block (total: 2)",
                           "[stream] op 3 NumericFloat::Add → accepted in 1/2 block(s)",
                           "[stream] op 4 NumericFloat::Add → new dependent block (total: 3)",
                           "selected composed strategy (3 sub-strategies)",
                       }));
}

TEST(StreamOptimizer, Item13DependentOpAtMaxBlocksStops) {
  const ir::Operation c = add(104, 204, 105);
  Harness r(fuser_list(P(0, {a1, a2}), P(1, {b1, b2})), 2, LogLevel::Medium);
  for (const auto& op : {a1, a2, b1, b2}) r.so->register_op(op);
  EXPECT_FALSE(r.so->stopped());
  r.so->register_op(c);
  EXPECT_TRUE(r.so->stopped());
  EXPECT_FALSE(r.so->still_optimizing());
  EXPECT_EQ(r.so->length(), 4u);
  EXPECT_EQ(r.so->num_blocks(), 2u);
  EXPECT_EQ(
      r.lines(),
      (std::vector<std::string>{"[stream] stopped (max_blocks=2 reached on dependency) at op 4 (NumericFloat::Add)"}));
  Ops ops = {a1, a2, b1, b2};
  EXPECT_EQ(r.so->optimize(ops), bo(C({O(0, 2, {0, 1}, 2), O(1, 2, {2, 3}, 2)}), {0, 1, 2, 3}));
}

TEST(StreamOptimizer, Item14DependencyCycleGuard) {
  Harness r(FuserList{}, std::nullopt);
  r.so->register_op(add_rw(1, 2, 3));
  r.so->register_op(add(10, 11, 12));
  EXPECT_EQ(r.so->num_blocks(), 2u);
  r.so->on_dependent_op(add(1, 3, 20));
  EXPECT_TRUE(r.so->stopped());
  EXPECT_EQ(r.so->num_blocks(), 2u);
  EXPECT_TRUE(r.logged("[stream] stopped (unresolvable dependency cycle) at op 2 (NumericFloat::Add)"));
}

// ---------------------------------------------------------------------------------------------
// max_blocks, stopping, dropping, reset
// ---------------------------------------------------------------------------------------------

TEST(StreamOptimizer, StopsAtMaxBlocksWhenNothingMerges) {
  Harness r(FuserList{}, 2);
  const ir::Operation c1 = add(300, 301, 302), d1 = add(400, 401, 402);
  Ops ops = {a1, b1, c1, d1};
  r.register_all(ops);
  EXPECT_TRUE(r.so->stopped());
  EXPECT_FALSE(r.so->still_optimizing());
  EXPECT_EQ(r.so->length(), 2u);
  EXPECT_EQ(r.lines(), (std::vector<std::string>{
                           "[stream] op 0 NumericFloat::Add → new block (total: 1)",
                           "[stream] op 1 NumericFloat::Add → new block (total: 2)",
                           "[stream] stopped (max_blocks=2 reached) at op 2 (NumericFloat::Add)",
                           "[stream] NumericFloat::Add dropped (optimizer stopped at op 2)",
                       }));
  // Only what was registered is committed; positions 2 and 3 are trailing.
  EXPECT_EQ(r.so->optimize(ops), bo(C({U({0}), U({1})}), {0, 1}));
}

TEST(StreamOptimizer, AtMaxBlocksAMergeFreesASlot) {
  // Both blocks have an open fuser, so merging them all frees a slot for the third op.
  const ir::Operation c1 = add(300, 301, 302);
  Harness r(fuser_list(P(0, {a1, b1, c1, a2})), 2);
  Ops ops = {a1, b1, c1};
  r.register_all(ops);
  EXPECT_FALSE(r.so->stopped());
  EXPECT_EQ(r.so->length(), 3u);
  EXPECT_EQ(r.so->num_blocks(), 2u);
  EXPECT_EQ(r.lines().back(), "[stream] op 2 NumericFloat::Add → new block (total: 2)");
  EXPECT_TRUE(r.so->still_optimizing());
}

TEST(StreamOptimizer, MaxBlocksOneForcesEverythingIntoOneBlock) {
  Harness r(fuser_list(P(0, {a1, b1})), 1);
  Ops ops = {a1, b1};
  r.register_all(ops);
  EXPECT_EQ(r.so->num_blocks(), 1u);
  EXPECT_EQ(r.so->optimize(ops), bo(O(0, 2, {0, 1}, 2), {0, 1}));
}

TEST(StreamOptimizer, NoBlocksMeansStillOptimizing) {
  Harness r(fuser_list(P(0, {a1, a2})));
  EXPECT_TRUE(r.so->still_optimizing());
  EXPECT_EQ(r.so->num_blocks(), 0u);
  EXPECT_EQ(r.so->length(), 0u);
}

TEST(StreamOptimizer, ResetClearsEverything) {
  Harness r(FuserList{}, 1);
  Ops ops = {a1, b1};
  r.register_all(ops);
  r.so->reset();
  EXPECT_EQ(r.so->num_blocks(), 0u);
  EXPECT_EQ(r.so->length(), 0u);
  EXPECT_FALSE(r.so->stopped());
  EXPECT_TRUE(r.so->still_optimizing());
  Harness s(FuserList{}, 2);
  s.register_all({a1, b1, add(300, 301, 302)});
  ASSERT_TRUE(s.so->stopped());
  s.so->reset();
  EXPECT_FALSE(s.so->stopped());
  s.so->register_op(a1);
  EXPECT_EQ(s.so->length(), 1u);
}

TEST(StreamOptimizer, HolesAreFilledByASubSearchAndRepaired) {
  // Block A = {a1, a2, a3}: fused prefix [0, 1], position 2 unresolved; block B = {b1@3}
  // resolves 3, so 2 is an interior hole. The sub-search settles it unfused; repair_order puts
  // it before B.
  Harness r(fuser_list(P(0, {a1, a2})));
  Ops ops = {a1, a2, a3, b1};
  r.register_all(ops);
  EXPECT_EQ(r.so->num_blocks(), 2u);
  r.capture->clear();
  EXPECT_EQ(r.so->optimize(ops), bo(C({O(0, 2, {0, 1}, 2), U({2}), U({3})}), {0, 1, 2, 3}));
  EXPECT_EQ(r.lines(), (std::vector<std::string>{
                           "selected composed strategy (2 sub-strategies)",
                           "[stream] op 0 NumericFloat::Add → new block (total: 1)",
                           "selected single strategy",
                       }));
}

TEST(StreamOptimizer, TrailingUnresolvedPositionsAreNotHoles) {
  Harness r(fuser_list(P(0, {a1, a2})));
  Ops ops = {a1, a2, a3};
  r.register_all(ops);
  EXPECT_EQ(r.so->optimize(ops), bo(O(0, 2, {0, 1}, 2), {0, 1}));
}

TEST(StreamOptimizer, SelectedSingleStrategyIsLoggedAtBasic) {
  Harness r(fuser_list(P(0, {a1, a2})), StreamOptimizer::kDefaultMaxBlocks, LogLevel::Basic);
  Ops ops = {a1, a2};
  r.register_all(ops);
  (void)r.so->optimize(ops);
  EXPECT_EQ(r.lines(), (std::vector<std::string>{"selected single strategy"}));
}

TEST(StreamOptimizer, Deterministic) {
  const ir::Operation c = add(104, 204, 105);
  Ops ops = {a1, b1, a2, b2, c, a3};
  auto once = [&] {
    Harness r(fuser_list(P(0, {a1, a2}), P(1, {b1, b2})));
    r.register_all(ops);
    return std::make_pair(r.so->optimize(ops), r.lines());
  };
  EXPECT_EQ(once(), once());
}

// ---------------------------------------------------------------------------------------------
// §19.8 repair_order
// ---------------------------------------------------------------------------------------------

class RepairOrder : public ::testing::Test {
 protected:
  std::shared_ptr<LogCapture> capture = std::make_shared<LogCapture>();
  FusionLog log = FusionLog::to_capture(LogLevel::Medium, capture);
};

TEST_F(RepairOrder, Item1SplitsTheUnfusedChunkAroundTheFusedOne) {
  Ops ops = {add(1, 2, 10), add(10, 3, 100), add(100, 4, 101), add_rw(10, 5, 11)};
  auto out = repair_order(bo(C({O({1, 2}), U({0, 3})}), {1, 2, 0, 3}), ops, log);
  EXPECT_EQ(out, bo(C({U({0}), O({1, 2}), U({3})}), {0, 1, 2, 3}));
  EXPECT_TRUE(capture->lines().empty());
}

TEST_F(RepairOrder, Item2ReordersChunksByDependency) {
  Ops ops = {add(1, 2, 5), add(5, 3, 10), add(10, 4, 20)};
  auto out = repair_order(bo(C({U({2}), O({0, 1})}), {2, 0, 1}), ops, log);
  EXPECT_EQ(out, bo(C({O({0, 1}), U({2})}), {0, 1, 2}));
}

TEST_F(RepairOrder, Item3FusedChunksFeedingEachOtherFallBackToUnfused) {
  Ops ops = {add(1, 2, 10), add(10, 6, 20), add(20, 7, 21), add(20, 5, 11)};
  auto out = repair_order(bo(C({O({0, 3}), O({1, 2})}), {0, 3, 1, 2}), ops, log);
  EXPECT_EQ(out, bo(U({0, 1, 2, 3}), {0, 1, 2, 3}));
  EXPECT_EQ(capture->lines(), (std::vector<std::string>{"[repair] falling back to unfused stream order (4 ops)"}));
}

TEST_F(RepairOrder, Item4InvalidSingleStrategyUnfuses) {
  Ops ops = {add(1, 2, 10), add(10, 3, 11)};
  auto out = repair_order(bo(O({1, 0}), {1, 0}), ops, log);
  EXPECT_EQ(out, bo(U({0, 1}), {0, 1}));
  EXPECT_EQ(capture->lines(), (std::vector<std::string>{"[repair] falling back to unfused stream order (2 ops)"}));
}

TEST_F(RepairOrder, Item5ValidSingleStrategyPassesThrough) {
  Ops ops = {add(1, 2, 10), add(10, 3, 11)};
  auto out = repair_order(bo(O({0, 1}), {0, 1}), ops, log);
  EXPECT_EQ(out, bo(O({0, 1}), {0, 1}));
  EXPECT_TRUE(capture->lines().empty());
}

TEST_F(RepairOrder, AssembleIsAlwaysComposed) {
  Ops ops = {add(1, 2, 10), add(10, 3, 11)};
  auto out = repair_order(bo(C({O({0, 1})}), {0, 1}), ops, log);
  EXPECT_EQ(out, bo(C({O({0, 1})}), {0, 1}));
}

TEST_F(RepairOrder, InternallyMisorderedChunkFallsBackAfterTheChunkSort) {
  // One chunk, internally out of order: the chunk sort cannot fix it.
  Ops ops = {add(1, 2, 10), add(10, 3, 11), add(7, 8, 9)};
  auto out = repair_order(bo(C({U({1, 0}), U({2})}), {1, 0, 2}), ops, log);
  EXPECT_EQ(out, bo(U({0, 1, 2}), {0, 1, 2}));
}

}  // namespace
}  // namespace kiln::fusion
