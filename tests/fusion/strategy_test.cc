// ExecutionStrategy and BlockOptimization (docs/spec/fusion.md §5.1, §5.2).
#include "kiln/fusion/strategy.h"

#include <gtest/gtest.h>

#include "pattern_fuser.h"

namespace kiln::fusion {
namespace {

using testing::C;
using testing::O;
using testing::TestOptimization;
using testing::U;

class ShapeOpt final : public Optimization {
 public:
  ShapeOpt(std::optional<std::uint64_t> m, std::size_t n) : m_(m), n_(n) {}
  std::size_t len() const override { return n_; }
  std::string_view name() const override { return "ShapeOpt"; }
  std::optional<std::uint64_t> max_relative_shape_id() const override { return m_; }

 private:
  std::optional<std::uint64_t> m_;
  std::size_t n_;
};

ExecutionStrategy shape_opt(std::optional<std::uint64_t> m, Ordering o) {
  const std::size_t n = o.size();
  return ExecutionStrategy::optimization(std::make_shared<ShapeOpt>(m, n), std::move(o), 1);
}

TEST(Strategy, Factories) {
  auto o = O(3, 2, {4, 1}, 630);
  EXPECT_EQ(o.kind(), ExecutionStrategy::Kind::Optimization);
  EXPECT_EQ(o.ordering(), (Ordering{4, 1}));
  EXPECT_EQ(o.score(), 630u);
  ASSERT_NE(o.opt(), nullptr);
  EXPECT_EQ(o.opt()->len(), 2u);

  auto u = U({2});
  EXPECT_EQ(u.kind(), ExecutionStrategy::Kind::Operations);
  EXPECT_EQ(u.ordering(), (Ordering{2}));
  EXPECT_EQ(u.opt(), nullptr);

  auto c = C({o, u});
  EXPECT_EQ(c.kind(), ExecutionStrategy::Kind::Composed);
  EXPECT_EQ(c.children().size(), 2u);
  EXPECT_TRUE(c.ordering().empty());
}

TEST(Strategy, ToString) {
  auto elementwise = ExecutionStrategy::optimization(std::make_shared<ShapeOpt>(std::nullopt, 2), {0, 1}, 630);
  EXPECT_EQ(elementwise.to_string(), "O(ShapeOpt,[0,1],630)");
  EXPECT_EQ(U({2}).to_string(), "U([2])");
  EXPECT_EQ(C({O(0, 2, {0, 1}, 2), U({2})}).to_string(), "C([O(TestOpt0,[0,1],2), U([2])])");
  EXPECT_EQ(U({}).to_string(), "U([])");
}

TEST(Strategy, EqualityComparesKindOrderingScoreChildrenAndOptimization) {
  EXPECT_EQ(O(0, 2, {0, 1}, 2), O(0, 2, {0, 1}, 2));
  EXPECT_NE(O(0, 2, {0, 1}, 2), O(1, 2, {0, 1}, 2));  // builder id differs (name)
  EXPECT_NE(O(0, 2, {0, 1}, 2), O(0, 3, {0, 1}, 2));  // len differs
  EXPECT_NE(O(0, 2, {0, 1}, 2), O(0, 2, {1, 0}, 2));
  EXPECT_NE(O(0, 2, {0, 1}, 2), O(0, 2, {0, 1}, 3));
  EXPECT_NE(O(0, 2, {0, 1}, 0), U({0, 1}));
  EXPECT_EQ(U({0, 1}), U({0, 1}));
  EXPECT_NE(U({0, 1}), U({1, 0}));
  EXPECT_EQ(C({U({0}), O(0, 1, {1}, 1)}), C({U({0}), O(0, 1, {1}, 1)}));
  EXPECT_NE(C({U({0}), O(0, 1, {1}, 1)}), C({O(0, 1, {1}, 1), U({0})}));
  EXPECT_NE(C({U({0})}), U({0}));
  // Null optimizations only equal null optimizations.
  EXPECT_EQ(ExecutionStrategy::optimization(nullptr, {0}, 1), ExecutionStrategy::optimization(nullptr, {0}, 1));
  EXPECT_NE(ExecutionStrategy::optimization(nullptr, {0}, 1), O(0, 1, {0}, 1));
}

TEST(Strategy, MaxRelativeShapeId) {
  EXPECT_EQ(U({0}).max_relative_shape_id(), std::nullopt);
  EXPECT_EQ(O(0, 1, {0}, 1).max_relative_shape_id(), std::nullopt);
  EXPECT_EQ(shape_opt(7, {0}).max_relative_shape_id(), std::optional<std::uint64_t>(7));
  auto c = C({shape_opt(3, {0}), U({1}), C({shape_opt(9, {2}), shape_opt(std::nullopt, {3})})});
  EXPECT_EQ(c.max_relative_shape_id(), std::optional<std::uint64_t>(9));
  EXPECT_EQ(C({U({0}), O(0, 1, {1}, 1)}).max_relative_shape_id(), std::nullopt);
}

TEST(Strategy, MapOrderingLiftsEveryLeaf) {
  auto s = C({O(0, 2, {0, 2}, 2), U({1}), C({U({3})})});
  const std::vector<std::size_t> holes = {4, 7, 9, 12};
  s.map_ordering(holes);
  EXPECT_EQ(s, C({O(0, 2, {4, 9}, 2), U({7}), C({U({12})})}));
}

TEST(Strategy, FlattenConcatenatesLeavesInExecutionOrder) {
  auto s = C({O(0, 2, {0, 2}, 2), C({U({3}), U({1})}), U({4})});
  EXPECT_EQ(s.flatten(), (Ordering{0, 2, 3, 1, 4}));
  EXPECT_EQ(U({5, 6}).flatten(), (Ordering{5, 6}));
}

TEST(BlockOptimization, IncludeTrailingWrapsASingleStrategy) {
  BlockOptimization bo(O(0, 2, {0, 1}, 2), {0, 1});
  bo.include_trailing(3);
  EXPECT_EQ(bo.strategy, C({O(0, 2, {0, 1}, 2), U({2})}));
  EXPECT_EQ(bo.ordering, (Ordering{0, 1, 2}));
}

TEST(BlockOptimization, IncludeTrailingAppendsToAComposedStrategy) {
  BlockOptimization bo(C({O(0, 2, {0, 2}, 2), U({1})}), {0, 2, 1});
  bo.include_trailing(5);
  EXPECT_EQ(bo.strategy, C({O(0, 2, {0, 2}, 2), U({1}), U({3, 4})}));
  EXPECT_EQ(bo.ordering, (Ordering{0, 2, 1, 3, 4}));
}

TEST(BlockOptimization, IncludeTrailingIsANoOpWhenEverythingIsCovered) {
  BlockOptimization bo(U({0, 1}), {0, 1});
  bo.include_trailing(2);
  EXPECT_EQ(bo.strategy, U({0, 1}));
  EXPECT_EQ(bo.ordering, (Ordering{0, 1}));
  bo.include_trailing(1);
  EXPECT_EQ(bo.ordering, (Ordering{0, 1}));
}

TEST(BlockOptimization, IncludeTrailingOnAnUnfusedHead) {
  // §19.7 item 6 in Sync mode: U([0]) + trailing position 1.
  BlockOptimization bo(U({0}), {0});
  bo.include_trailing(2);
  EXPECT_EQ(bo.strategy, C({U({0}), U({1})}));
  EXPECT_EQ(bo.ordering, (Ordering{0, 1}));
}

TEST(BlockOptimization, Unfused) {
  auto bo = BlockOptimization::unfused(3);
  EXPECT_EQ(bo.strategy, U({0, 1, 2}));
  EXPECT_EQ(bo.ordering, (Ordering{0, 1, 2}));
  EXPECT_EQ(BlockOptimization::unfused(0).ordering, Ordering{});
}

TEST(BlockOptimization, Equality) {
  EXPECT_EQ(BlockOptimization(U({0}), {0}), BlockOptimization(U({0}), {0}));
  EXPECT_NE(BlockOptimization(U({0}), {0}), BlockOptimization(U({0}), {1}));
}

}  // namespace
}  // namespace kiln::fusion
