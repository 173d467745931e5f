// Block (docs/spec/fusion.md §10.1-§10.4) and the block dependency checks of §19.9 items 1-6.
#include "kiln/fusion/block.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <utility>

#include "kiln/fusion/dag.h"
#include "kiln/fusion/merging.h"
#include "pattern_fuser.h"

namespace kiln::fusion {
namespace {

using testing::add;
using testing::add_rw;
using testing::fuser_list;
using testing::O;
using testing::op1;
using testing::op2;
using testing::op3;
using testing::P;
using testing::U;

using Placed = std::vector<std::pair<ir::Operation, std::size_t>>;

// A block built by force-registering (op, position) pairs.
Block make_block(const FuserList& prototypes, const Placed& ops) {
  Block b(prototypes);
  for (const auto& [op, pos] : ops) b.register_op(op, pos, true);
  return b;
}

std::optional<std::vector<std::size_t>> topo(const std::vector<Block>& blocks) {
  const std::vector<DagNode> nodes = block_nodes(blocks);
  return Dag(std::span<const DagNode>(nodes)).topological_order();
}

Ordering sorted_positions(const Block& b) {
  Ordering o = b.ordering();
  std::sort(o.begin(), o.end());
  return o;
}

const FuserList kNoFusers;

// ---------------------------------------------------------------------------------------------
// Registration and bookkeeping (§10.2)
// ---------------------------------------------------------------------------------------------

TEST(Block, FirstOpIsAlwaysAcceptedLaterOnesNeedASharedTensorOrForce) {
  Block b(kNoFusers);
  EXPECT_EQ(b.start_pos(), Block::kNoPosition);
  EXPECT_EQ(b.end_pos(), 0u);
  EXPECT_EQ(b.register_op(add(1, 2, 3), 4, false), RegistrationResult::Accepted);
  EXPECT_EQ(b.register_op(add(10, 11, 12), 5, false), RegistrationResult::NotPartOfTheGraph);
  EXPECT_EQ(b.register_op(add(3, 5, 6), 7, false), RegistrationResult::Accepted);
  EXPECT_EQ(b.register_op(add(20, 21, 22), 2, true), RegistrationResult::Accepted);
  EXPECT_EQ(b.ordering(), (Ordering{4, 7, 2}));
  EXPECT_EQ(b.size(), 3u);
  EXPECT_EQ(b.start_pos(), 2u);
  EXPECT_EQ(b.end_pos(), 8u);
  EXPECT_TRUE(b.contains_any_tensor(add(99, 22, 98).nodes()));
  EXPECT_FALSE(b.contains_any_tensor(add(99, 97, 98).nodes()));
}

TEST(Block, BookkeepingIsOrderIndependent) {
  // Consumer registered before its producer (as a merge may append): 10 is still not external.
  Block b = make_block(kNoFusers, {{add_rw(10, 3, 11), 1}, {add(1, 2, 10), 0}});
  EXPECT_EQ(b.produced(), (std::set<ir::TensorId>{ir::TensorId(10), ir::TensorId(11)}));
  EXPECT_EQ(b.external_reads(), (std::set<ir::TensorId>{ir::TensorId(1), ir::TensorId(2), ir::TensorId(3)}));
  EXPECT_EQ(b.freed(), (std::set<ir::TensorId>{ir::TensorId(10)}));
  DagNode n = b.dag_node();
  EXPECT_EQ(n.position, 0u);
  EXPECT_EQ(n.produced, (std::vector<ir::TensorId>{ir::TensorId(10), ir::TensorId(11)}));
  EXPECT_EQ(n.read, (std::vector<ir::TensorId>{ir::TensorId(1), ir::TensorId(2), ir::TensorId(3)}));
  EXPECT_EQ(n.freed, (std::vector<ir::TensorId>{ir::TensorId(10)}));
}

TEST(Block, InPlaceOpIsNotAnExternalRead) {
  Block b = make_block(kNoFusers, {{op3(), 3}});
  EXPECT_TRUE(b.external_reads().empty());
  EXPECT_EQ(b.produced(), (std::set<ir::TensorId>{ir::TensorId(0)}));
  // As a single op node it reads 0 and produces 0: invalid as the first reader (§12.5).
  DagNode n = operation_node(op3(), 3);
  EXPECT_EQ(n.read, (std::vector<ir::TensorId>{ir::TensorId(0)}));
  EXPECT_EQ(n.produced, (std::vector<ir::TensorId>{ir::TensorId(0)}));
  EXPECT_TRUE(n.freed.empty());
  EXPECT_FALSE(b.can_append(make_block(kNoFusers, {{op1(), 0}})));
}

TEST(Block, ClosedAtRecordsTheRegistrationIndexThatClosedEachFuser) {
  auto a1 = add(100, 101, 102), a2 = add(102, 103, 104), a3 = add(104, 105, 106);
  FuserList protos = fuser_list(P(0, {a1, a2}), P(1, {a1, a2, a3}), P(2, {a2}));
  Block b = make_block(protos, {{a1, 0}});
  EXPECT_EQ(b.closed_at()[0], std::nullopt);
  EXPECT_EQ(b.closed_at()[1], std::nullopt);
  EXPECT_EQ(b.closed_at()[2], std::optional<std::ptrdiff_t>(0));
  b.register_op(a2, 1, true);
  EXPECT_EQ(b.closed_at()[0], std::optional<std::ptrdiff_t>(1));
  EXPECT_EQ(b.closed_at()[1], std::nullopt);
  EXPECT_TRUE(b.still_optimizing());
  b.register_op(a3, 2, true);
  EXPECT_EQ(b.closed_at()[1], std::optional<std::ptrdiff_t>(2));
  EXPECT_EQ(b.closed_at()[2], std::optional<std::ptrdiff_t>(0));  // later ops do not move it
  EXPECT_FALSE(b.still_optimizing());
}

TEST(Block, CopiesCloneTheFusers) {
  auto a1 = add(100, 101, 102), a2 = add(102, 103, 104);
  FuserList protos = fuser_list(P(0, {a1, a2}));
  Block b = make_block(protos, {{a1, 0}});
  Block copy(b);
  copy.register_op(a2, 1, true);
  EXPECT_TRUE(b.still_optimizing());
  EXPECT_FALSE(b.has_ready_optimization());
  EXPECT_TRUE(copy.has_ready_optimization());
  EXPECT_EQ(b.size(), 1u);
  // The prototypes stay pristine.
  EXPECT_EQ(static_cast<const testing::PatternFuser&>(*protos[0]).actual().size(), 0u);
}

// ---------------------------------------------------------------------------------------------
// Block::optimize (§10.4)
// ---------------------------------------------------------------------------------------------

TEST(BlockOptimize, HighestScoreStrictlyAboveZeroWinsTiesKeepTheEarlierFuser) {
  auto a1 = add(100, 101, 102), a2 = add(102, 103, 104);
  FuserList protos = fuser_list(P(0, {a1, a2}), P(1, {a1, a2}), P(2, {a1}));
  Block b = make_block(protos, {{a1, 0}, {a2, 1}});
  EXPECT_EQ(b.optimize(protos), BlockOptimization(O(0, 2, {0, 1}, 2), {0, 1}));
}

TEST(BlockOptimize, FusedPrefixTruncatesTheOrdering) {
  auto a1 = add(100, 101, 102), a2 = add(102, 103, 104), a3 = add(104, 105, 106);
  FuserList protos = fuser_list(P(0, {a1, a2}));
  Block b = make_block(protos, {{a1, 0}, {a2, 2}, {a3, 5}});
  EXPECT_EQ(b.optimize(protos), BlockOptimization(O(0, 2, {0, 2}, 2), {0, 2}));
}

// A fuser that is ready with score 0 (like the elementwise fuser after one op) is never chosen.
class ZeroScoreFuser final : public OperationFuser {
 public:
  void fuse(const ir::Operation&) override { ++n_; }
  FuserStatus status() const override { return n_ >= 1 ? FuserStatus::Closed : FuserStatus::Open; }
  FuserProperties properties() const override { return {n_ > 0, 0}; }
  std::size_t len() const override { return n_; }
  OptimizationPtr finish() override { return std::make_shared<testing::TestOptimization>(9, n_); }
  void reset() override { n_ = 0; }
  std::unique_ptr<OperationFuser> clone() const override { return std::make_unique<ZeroScoreFuser>(*this); }

 private:
  std::size_t n_ = 0;
};

TEST(BlockOptimize, ScoreZeroIsNeverSelected) {
  FuserList protos = fuser_list(std::make_unique<ZeroScoreFuser>());
  Block b = make_block(protos, {{add(1, 2, 3), 0}});
  EXPECT_TRUE(b.has_ready_optimization());
  EXPECT_EQ(b.optimize(protos), BlockOptimization(U({0}), {0}));
}

// A fuser that is Closed from the start (K: closed at index -1).
class AlwaysClosedFuser final : public OperationFuser {
 public:
  void fuse(const ir::Operation&) override {}
  FuserStatus status() const override { return FuserStatus::Closed; }
  FuserProperties properties() const override { return {}; }
  std::size_t len() const override { return 0; }
  OptimizationPtr finish() override { return nullptr; }
  void reset() override {}
  std::unique_ptr<OperationFuser> clone() const override { return std::make_unique<AlwaysClosedFuser>(); }
};

TEST(HeadSettlement, WholeBlockWhileAFuserIsOpen) {
  // §19.7 item 7 at block level: fuser still open -> (K) whole block.
  auto a1 = add(100, 101, 102), a2 = add(102, 103, 104), a3 = add(104, 105, 106);
  FuserList protos = fuser_list(P(0, {a1, a2, a3}));
  Block b = make_block(protos, {{a1, 0}, {a2, 1}});
  EXPECT_EQ(b.head_length(protos), 2u);
  EXPECT_EQ(b.optimize(protos), BlockOptimization(U({0, 1}), {0, 1}));
}

TEST(HeadSettlement, WholeBlockWithoutFusers) {
  Block b = make_block(kNoFusers, {{add(1, 2, 3), 0}, {add(3, 4, 5), 1}});
  EXPECT_EQ(b.head_length(kNoFusers), 2u);
  EXPECT_EQ(b.optimize(kNoFusers), BlockOptimization(U({0, 1}), {0, 1}));
}

TEST(HeadSettlement, StopsBeforeAnOpAFreshFuserWouldStartOn) {
  // §19.7 item 6 (0.22.1): P(0,[a2,a1]) closes on a1 (index 0); a fresh fuser starts on a2.
  auto a1 = add(100, 101, 102), a2 = add(102, 103, 104);
  FuserList protos = fuser_list(P(0, {a2, a1}));
  Block b = make_block(protos, {{a1, 0}, {a2, 1}});
  EXPECT_EQ(b.closed_at()[0], std::optional<std::ptrdiff_t>(0));
  EXPECT_EQ(b.head_length(protos), 1u);
  EXPECT_EQ(b.optimize(protos), BlockOptimization(U({0}), {0}));
}

TEST(HeadSettlement, ExtendsOverOpsNoFreshFuserWouldStartOn) {
  // Only a fresh fuser that stays Open after the op counts as "starting" on it; one that accepts
  // the op and closes at once (P1 on a4) does not.
  auto a1 = add(100, 101, 102), a2 = add(102, 103, 104), a3 = add(104, 105, 106), a4 = add(106, 107, 108),
       b1 = add(200, 201, 202);
  FuserList protos = fuser_list(P(0, {a1, b1}), P(1, {a4}), P(2, {a4, a1}));
  // closed_at: P0 at 1 (a2), P1 at 0, P2 at 0 -> h = 2; a3: nobody stays open -> h = 3;
  // a4: P2 would stay open -> stop.
  Block b = make_block(protos, {{a1, 0}, {a2, 1}, {a3, 2}, {a4, 3}});
  EXPECT_EQ(b.head_length(protos), 3u);
  EXPECT_EQ(b.optimize(protos), BlockOptimization(U({0, 1, 2}), {0, 1, 2}));
  // Without P2 nothing would start on a4 (P1 accepts it and closes at once): whole block.
  FuserList protos2 = fuser_list(P(0, {a1, b1}), P(1, {a4}));
  Block b2 = make_block(protos2, {{a1, 0}, {a2, 1}, {a3, 2}, {a4, 3}});
  EXPECT_EQ(b2.head_length(protos2), 4u);
}

TEST(HeadSettlement, ClosedAtLastOpSettlesTheWholeBlock) {
  // §19.7 item 10: P(0,[a1,b1]) closes at index 1 -> whole block.
  auto a1 = add(100, 101, 102), a2 = add(102, 103, 104), b1 = add(200, 201, 202);
  FuserList protos = fuser_list(P(0, {a1, b1}));
  Block b = make_block(protos, {{a1, 0}, {a2, 1}});
  EXPECT_EQ(b.head_length(protos), 2u);
}

TEST(HeadSettlement, FuserClosedAtCreationContributesNothingButTheHeadIsNeverEmpty) {
  auto a1 = add(100, 101, 102), a2 = add(102, 103, 104);
  FuserList protos = fuser_list(std::make_unique<AlwaysClosedFuser>(), P(1, {a2}));
  Block b = make_block(protos, {{a1, 0}, {a2, 1}});
  EXPECT_EQ(b.closed_at()[0], std::optional<std::ptrdiff_t>(-1));
  EXPECT_EQ(b.closed_at()[1], std::optional<std::ptrdiff_t>(0));
  // h = max(1, 1 + 0) = 1; P1 on a2 accepts and closes at once -> does not "start" -> h = 2.
  EXPECT_EQ(b.head_length(protos), 2u);
  FuserList only_closed = fuser_list(std::make_unique<AlwaysClosedFuser>());
  Block c = make_block(only_closed, {{a1, 0}, {a2, 1}});
  EXPECT_EQ(c.head_length(only_closed), 2u);  // max(1, 0) = 1, then nobody starts on a2
  FuserList closed_and_open = fuser_list(std::make_unique<AlwaysClosedFuser>(), P(1, {a2, a1}));
  Block d = make_block(closed_and_open, {{a1, 0}, {a2, 1}});
  EXPECT_EQ(d.head_length(closed_and_open), 1u);  // never 0; P1 would start on a2
}

// ---------------------------------------------------------------------------------------------
// §19.9 items 1-6: dependencies, the contraction guard, merge direction
// ---------------------------------------------------------------------------------------------

TEST(BlockDag, Item1ProducerBlockFirst) {
  std::vector<Block> blocks;
  blocks.push_back(make_block(kNoFusers, {{add(50, 1, 2), 0}}));
  blocks.push_back(make_block(kNoFusers, {{add(9, 8, 50), 5}}));
  EXPECT_EQ(topo(blocks), (std::optional<std::vector<std::size_t>>{{1, 0}}));
}

TEST(BlockDag, Item2Cyclic) {
  std::vector<Block> blocks;
  blocks.push_back(make_block(kNoFusers, {{add(1, 2, 100), 0}, {add(200, 3, 101), 1}}));
  blocks.push_back(make_block(kNoFusers, {{add(100, 4, 200), 2}}));
  EXPECT_EQ(topo(blocks), std::nullopt);
}

TEST(BlockDag, Item3FreerAfterReader) {
  std::vector<Block> blocks;
  blocks.push_back(make_block(kNoFusers, {{add(100, 1, 2), 0}}));
  blocks.push_back(make_block(kNoFusers, {{add_rw(100, 3, 4), 1}}));
  EXPECT_EQ(topo(blocks), (std::optional<std::vector<std::size_t>>{{0, 1}}));
}

TEST(BlockDag, Item4ContractionGuard) {
  std::vector<Block> blocks;
  blocks.push_back(make_block(kNoFusers, {{add(1, 2, 100), 0}}));    // A
  blocks.push_back(make_block(kNoFusers, {{add(100, 3, 200), 1}}));  // C
  blocks.push_back(make_block(kNoFusers, {{add(200, 4, 300), 2}}));  // B
  const std::vector<DagNode> nodes = block_nodes(blocks);
  const Reachability guard = Dag(std::span<const DagNode>(nodes)).reachability();
  // Unseeded blocks: always false.
  EXPECT_FALSE(guard.can_contract(blocks[0].constituents(), blocks[2].constituents()));
  EXPECT_FALSE(guard.can_contract(blocks[0].constituents(), blocks[1].constituents()));
  EXPECT_FALSE(merge_two(blocks[0], blocks[1], guard).has_value());
  for (std::size_t i = 0; i < blocks.size(); ++i) blocks[i].seed_constituent(i);
  EXPECT_FALSE(guard.can_contract(blocks[0].constituents(), blocks[2].constituents()));  // (A, B)
  EXPECT_TRUE(guard.can_contract(blocks[0].constituents(), blocks[1].constituents()));   // (A, C)
  EXPECT_TRUE(guard.can_contract(blocks[1].constituents(), blocks[2].constituents()));   // (C, B)
}

TEST(BlockMerge, Item5ConsumerBeforeProducerFailsTheReverseSucceeds) {
  auto x = add(1, 2, 10), y = add(50, 3, 11), z = add(4, 5, 50);
  {
    FuserList protos = fuser_list(P(0, {x, y, z, x}));
    Block xy = make_block(protos, {{x, 0}, {y, 1}});
    Block zb = make_block(protos, {{z, 2}});
    EXPECT_FALSE(xy.can_append(zb));
    EXPECT_FALSE(xy.merge(zb));
    EXPECT_EQ(xy.size(), 2u);  // nothing mutated when the order is invalid
  }
  {
    FuserList protos = fuser_list(P(0, {z, x, y, x}));
    Block zb = make_block(protos, {{z, 2}});
    Block xy = make_block(protos, {{x, 0}, {y, 1}});
    EXPECT_TRUE(zb.can_append(xy));
    EXPECT_TRUE(zb.merge(xy));
    EXPECT_EQ(zb.ordering(), (Ordering{2, 0, 1}));
    EXPECT_EQ(zb.start_pos(), 0u);
    EXPECT_EQ(zb.end_pos(), 3u);
    EXPECT_TRUE(zb.still_optimizing());
  }
}

TEST(BlockMerge, Item6ReadAfterFreeFails) {
  auto reader = add(100, 1, 2), freer = add_rw(100, 3, 4);
  FuserList protos = fuser_list(P(0, {freer, reader, reader}));
  Block f = make_block(protos, {{freer, 1}});
  Block r = make_block(protos, {{reader, 0}});
  EXPECT_FALSE(f.merge(r));
}

TEST(BlockMerge, KeptOnlyIfItCreatesAReadyFusionNeitherSideHad) {
  auto a1 = add(100, 101, 102), a2 = add(102, 103, 104), b1 = add(200, 201, 202), b2 = add(202, 203, 204);
  // Both sides ready: a merge would hide one fusion.
  {
    FuserList protos = fuser_list(P(0, {a1, a2}), P(1, {b1, b2}));
    Block a = make_block(protos, {{a1, 0}, {a2, 1}});
    Block b = make_block(protos, {{b1, 2}, {b2, 3}});
    EXPECT_FALSE(a.merge(b));
  }
  // Neither ready, the merged block closes ready: kept.
  {
    FuserList protos = fuser_list(P(0, {a1, b1}));
    Block a = make_block(protos, {{a1, 0}});
    Block b = make_block(protos, {{b1, 1}});
    Block m(a);
    EXPECT_TRUE(m.merge(b));
    EXPECT_TRUE(m.has_ready_optimization());
    EXPECT_FALSE(m.still_optimizing());
    EXPECT_EQ(m.optimize(protos), BlockOptimization(O(0, 2, {0, 1}, 2), {0, 1}));
  }
  // Unrelated blocks are merged while the base block has an open fuser.
  {
    FuserList protos = fuser_list(P(0, {a1, b1, a2}));
    Block a = make_block(protos, {{a1, 0}});
    Block b = make_block(protos, {{b1, 1}});
    EXPECT_TRUE(a.merge(b));
    EXPECT_TRUE(a.still_optimizing());
  }
  // Nothing ready, nothing open: refused.
  {
    FuserList protos = fuser_list(P(0, {a2}));
    Block a = make_block(protos, {{a1, 0}});
    Block b = make_block(protos, {{b1, 1}});
    EXPECT_FALSE(a.merge(b));
  }
}

TEST(BlockMerge, ConstituentsAreUnited) {
  auto a1 = add(100, 101, 102), b1 = add(200, 201, 202);
  FuserList protos = fuser_list(P(0, {a1, b1, b1}));
  Block a = make_block(protos, {{a1, 0}});
  Block b = make_block(protos, {{b1, 1}});
  a.seed_constituent(3);
  b.seed_constituent(70);
  ASSERT_TRUE(a.merge(b));
  EXPECT_EQ(a.constituents().to_vector(), (std::vector<std::size_t>{3, 70}));
}

TEST(Block, SortByStartPosIsStable) {
  std::vector<Block> blocks;
  blocks.push_back(make_block(kNoFusers, {{add(1, 2, 3), 4}}));
  blocks.push_back(make_block(kNoFusers, {{add(10, 2, 3), 1}, {add(11, 2, 3), 9}}));
  blocks.push_back(make_block(kNoFusers, {{add(12, 2, 3), 1}}));
  Block::sort_by_start_pos(blocks);
  EXPECT_EQ(sorted_positions(blocks[0]), (Ordering{1, 9}));
  EXPECT_EQ(sorted_positions(blocks[1]), (Ordering{1}));
  EXPECT_EQ(sorted_positions(blocks[2]), (Ordering{4}));
}

TEST(OrderingIsValid, PerOpLifetimes) {
  std::vector<ir::Operation> ops = {add(1, 2, 10), add(10, 3, 11)};
  EXPECT_TRUE(ordering_is_valid(Ordering{0, 1}, ops));
  EXPECT_FALSE(ordering_is_valid(Ordering{1, 0}, ops));
  EXPECT_TRUE(ordering_is_valid(Ordering{1}, ops));  // other producers' outputs are external
}

}  // namespace
}  // namespace kiln::fusion
