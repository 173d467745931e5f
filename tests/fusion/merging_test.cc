// Merging a list of blocks (docs/spec/fusion.md §11), §19.9 items 7-13.
#include "kiln/fusion/merging.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <utility>

#include "kiln/fusion/dag.h"
#include "pattern_fuser.h"

namespace kiln::fusion {
namespace {

using testing::add;
using testing::fuser_list;
using testing::op1;
using testing::op2;
using testing::op3;
using testing::P;

using Placed = std::vector<std::pair<ir::Operation, std::size_t>>;

Block make_block(const FuserList& prototypes, const Placed& ops) {
  Block b(prototypes);
  for (const auto& [op, pos] : ops) b.register_op(op, pos, true);
  return b;
}

// Seeds every block with its index and builds the guard over all of them (as §9.3 does).
Reachability seed_and_guard(std::vector<Block>& blocks) {
  for (std::size_t i = 0; i < blocks.size(); ++i) blocks[i].seed_constituent(i);
  const std::vector<DagNode> nodes = block_nodes(blocks);
  return Dag(std::span<const DagNode>(nodes)).reachability();
}

// Block equality in these tests compares the sorted position lists (§19.9).
Ordering positions(const Block& b) {
  Ordering o = b.ordering();
  std::sort(o.begin(), o.end());
  return o;
}
std::vector<Ordering> positions(const std::vector<Block>& bs) {
  std::vector<Ordering> out;
  for (const Block& b : bs) out.push_back(positions(b));
  return out;
}

FuserList ten_op_fusers() {
  return fuser_list(P(0, std::vector<ir::Operation>(10, op1())), P(1, std::vector<ir::Operation>(10, op2())));
}

class MergeBlockList : public ::testing::Test {
 protected:
  FuserList protos = ten_op_fusers();
  std::vector<Block> blocks;
  void place(const Placed& ops) { blocks.push_back(make_block(protos, ops)); }
  MergeResult run(bool sorted = true) {
    Reachability guard = seed_and_guard(blocks);
    return merge_block_list(std::span<const Block>(blocks), sorted, guard);
  }
};

TEST_F(MergeBlockList, Item7EmptyFails) {
  MergeResult r = run();
  EXPECT_TRUE(r.is_fail());
  EXPECT_TRUE(r.merged.empty());
  EXPECT_TRUE(r.failed.empty());
}

TEST_F(MergeBlockList, Item7OneBlockIsFull) {
  place({{op1(), 0}});
  MergeResult r = run();
  ASSERT_TRUE(r.is_full());
  ASSERT_EQ(r.merged.size(), 1u);
  EXPECT_EQ(positions(r.merged[0]), (Ordering{0}));
  // A clone: the input is untouched and the fusers are independent.
  r.merged[0].register_op(op1(), 1, true);
  EXPECT_EQ(blocks[0].size(), 1u);
}

TEST_F(MergeBlockList, Item8TwoBlocks) {
  place({{op1(), 0}, {op1(), 1}});
  place({{op1(), 2}, {op1(), 3}});
  MergeResult r = run();
  ASSERT_TRUE(r.is_full());
  EXPECT_EQ(positions(r.merged[0]), (Ordering{0, 1, 2, 3}));
  EXPECT_EQ(r.merged[0].ordering(), (Ordering{0, 1, 2, 3}));
  EXPECT_TRUE(r.merged[0].still_optimizing());
}

TEST_F(MergeBlockList, Item9ThreeBlocks) {
  place({{op1(), 0}});
  place({{op1(), 1}});
  place({{op1(), 2}});
  MergeResult r = run();
  ASSERT_TRUE(r.is_full());
  EXPECT_EQ(positions(r.merged[0]), (Ordering{0, 1, 2}));
}

TEST_F(MergeBlockList, Item10ThreeBlocksPartial) {
  place({{op1(), 0}});
  place({{op2(), 1}});
  place({{op1(), 2}});
  MergeResult r = run();
  ASSERT_TRUE(r.is_partial());
  EXPECT_EQ(positions(r.merged), (std::vector<Ordering>{{0, 2}, {1}}));
  EXPECT_TRUE(r.failed.empty());
}

TEST_F(MergeBlockList, Item11FourBlocksPartialWithFailure) {
  place({{op1(), 0}});
  place({{op2(), 1}});
  place({{op1(), 2}});
  place({{op3(), 3}});
  MergeResult r = run();
  ASSERT_TRUE(r.is_partial());
  EXPECT_EQ(positions(r.merged), (std::vector<Ordering>{{0, 2}}));
  EXPECT_EQ(positions(r.failed), (std::vector<Ordering>{{1}, {3}}));
}

TEST_F(MergeBlockList, Item12FiveBlocksPartialWithFailure) {
  place({{op1(), 0}});
  place({{op2(), 1}});
  place({{op1(), 2}});
  place({{op3(), 3}});
  place({{op2(), 4}});
  MergeResult r = run();
  ASSERT_TRUE(r.is_partial());
  EXPECT_EQ(positions(r.merged), (std::vector<Ordering>{{0, 2}, {1, 4}}));
  EXPECT_EQ(positions(r.failed), (std::vector<Ordering>{{3}}));
}

TEST_F(MergeBlockList, UnsortedKeepsTheAccumulationOrder) {
  // Item 12 unsorted: step 2 (e) puts the merged full list first ({op2@4, op2@1}), then the
  // merged partial list ({op1@0, op1@2}).
  place({{op1(), 0}});
  place({{op2(), 1}});
  place({{op1(), 2}});
  place({{op3(), 3}});
  place({{op2(), 4}});
  MergeResult r = run(/*sorted=*/false);
  ASSERT_TRUE(r.is_partial());
  ASSERT_EQ(r.merged.size(), 2u);
  EXPECT_EQ(r.merged[0].ordering(), (Ordering{4, 1}));
  EXPECT_EQ(r.merged[1].ordering(), (Ordering{0, 2}));
  EXPECT_EQ(positions(r.failed), (std::vector<Ordering>{{3}}));
}

TEST(MergeBlockListDirection, Item13DirectionReversal) {
  auto x = add(1, 2, 10), y = add(50, 3, 11), z = add(4, 5, 50), w = add(6, 7, 12);
  FuserList protos = fuser_list(P(0, {z, x, y, w, x}));
  std::vector<Block> blocks;
  blocks.push_back(make_block(protos, {{x, 0}, {y, 5}}));
  blocks.push_back(make_block(protos, {{z, 3}}));
  blocks.push_back(make_block(protos, {{w, 6}}));
  Reachability guard = seed_and_guard(blocks);
  MergeResult r = merge_block_list(std::span<const Block>(blocks), true, guard);
  ASSERT_TRUE(r.is_full());
  const Block& m = r.merged[0];
  EXPECT_EQ(m.operations(), (std::vector<ir::Operation>{z, x, y, w}));
  EXPECT_EQ(m.ordering(), (Ordering{3, 0, 5, 6}));
  EXPECT_EQ(m.constituents().to_vector(), (std::vector<std::size_t>{0, 1, 2}));
  EXPECT_TRUE(m.still_optimizing());
}

TEST(MergeTwo, TriesBothDirections) {
  auto x = add(1, 2, 10), y = add(50, 3, 11), z = add(4, 5, 50);
  FuserList protos = fuser_list(P(0, {z, x, y}));
  std::vector<Block> blocks;
  blocks.push_back(make_block(protos, {{x, 0}, {y, 1}}));
  blocks.push_back(make_block(protos, {{z, 2}}));
  Reachability guard = seed_and_guard(blocks);
  std::optional<Block> m = merge_two(blocks[0], blocks[1], guard);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->ordering(), (Ordering{2, 0, 1}));
  EXPECT_TRUE(m->has_ready_optimization());
  // Inputs untouched.
  EXPECT_EQ(blocks[0].size(), 2u);
  EXPECT_EQ(blocks[1].size(), 1u);
}

TEST(MergeTwo, RefusedByTheGuard) {
  // A -> C -> B: contracting A and B would put C both before and after the merged block.
  // Without the guard A+B would merge (P0 stays open on [a, b]) just like A+C does (P1).
  auto a = add(1, 2, 100), c = add(100, 3, 200), b = add(200, 4, 300), other = add(7, 8, 9);
  FuserList protos = fuser_list(P(0, {a, b, other}), P(1, {a, c, other}));
  std::vector<Block> blocks;
  blocks.push_back(make_block(protos, {{a, 0}}));
  blocks.push_back(make_block(protos, {{c, 1}}));
  blocks.push_back(make_block(protos, {{b, 2}}));
  Block unguarded(blocks[0]);
  EXPECT_TRUE(unguarded.merge(blocks[2]));
  Reachability guard = seed_and_guard(blocks);
  EXPECT_FALSE(merge_two(blocks[0], blocks[2], guard).has_value());
  EXPECT_TRUE(merge_two(blocks[0], blocks[1], guard).has_value());
}

TEST(MergeAccumulator, FullPartialFail) {
  FuserList protos = ten_op_fusers();
  std::vector<Block> blocks;
  blocks.push_back(make_block(protos, {{op1(), 0}}));
  blocks.push_back(make_block(protos, {{op2(), 1}}));
  blocks.push_back(make_block(protos, {{op1(), 2}}));
  Reachability guard = seed_and_guard(blocks);
  auto all = std::span<const Block>(blocks);

  MergeResult partial = merge_accumulator(blocks[0], all.subspan(1), guard);
  ASSERT_TRUE(partial.is_partial());
  EXPECT_EQ(positions(partial.merged), (std::vector<Ordering>{{0, 2}}));
  EXPECT_EQ(positions(partial.failed), (std::vector<Ordering>{{1}}));

  MergeResult full = merge_accumulator(blocks[0], all.subspan(2), guard);
  ASSERT_TRUE(full.is_full());
  EXPECT_EQ(positions(full.merged[0]), (Ordering{0, 2}));

  MergeResult fail = merge_accumulator(blocks[1], all.subspan(2), guard);
  EXPECT_TRUE(fail.is_fail());
  EXPECT_TRUE(merge_accumulator(blocks[0], {}, guard).is_fail());
}

}  // namespace
}  // namespace kiln::fusion
