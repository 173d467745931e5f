// Shape rules of docs/spec/ir.md §4 and the shape vectors of §12.5 (items 1-6, 8, 9).
#include "kiln/ir/shape.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <vector>

namespace kiln {
inline void PrintTo(ErrorCode c, std::ostream* os) { *os << error_code_name(c); }
}  // namespace kiln

namespace kiln::ir {
namespace {

#define EXPECT_ERR(expr, expected)                                          \
  do {                                                                      \
    auto _r = (expr);                                                       \
    ASSERT_FALSE(_r.ok()) << #expr << " succeeded, expected " << #expected; \
    EXPECT_EQ(_r.error().code, expected) << _r.error().to_string();         \
  } while (0)

#define EXPECT_SHAPE(expr, ...)                                      \
  do {                                                               \
    auto _r = (expr);                                                \
    ASSERT_TRUE(_r.ok()) << #expr << ": " << _r.error().to_string(); \
    EXPECT_EQ(*_r, (Shape{__VA_ARGS__})) << shape_to_string(*_r);    \
  } while (0)

Result<Shape> reshape(const Shape& s, std::vector<std::int64_t> args) { return shape::reshape(s, args); }
Result<Shape> permuted(const Shape& s, std::vector<std::uint64_t> axes) { return shape::permuted(s, axes); }
Result<Shape> cat(std::vector<Shape> shapes, std::uint64_t dim) { return shape::cat(shapes, dim); }
Result<Shape> slice(const Shape& s, std::vector<Slice> ranges) { return shape::slice(s, ranges); }
Result<Shape> broadcast_many(std::vector<Shape> shapes) { return shape::broadcast_many(shapes); }

// ---- Basics

TEST(ShapeToString, PrintsWithoutSpaces) {
  EXPECT_EQ(shape_to_string({2, 3, 4}), "[2,3,4]");
  EXPECT_EQ(shape_to_string({}), "[]");
  EXPECT_EQ(shape_to_string({7}), "[7]");
}

TEST(NumElements, ProductOfDims) {
  EXPECT_EQ(num_elements({2, 3, 4}), 24u);
  EXPECT_EQ(num_elements({}), 1u);
  EXPECT_EQ(num_elements({5, 0, 3}), 0u);
}

// ---- broadcast (docs/spec/ir.md §12.5 item 1, shape part)

TEST(Broadcast, Vector1LeftOnesTakeRight) { EXPECT_SHAPE(shape::broadcast({1, 1, 2, 4}, {7, 6, 2, 4}), 7, 6, 2, 4); }

TEST(Broadcast, Vector1IncompatibleDims) {
  auto r = shape::broadcast({2, 2}, {2, 4});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::IncompatibleDims);
  EXPECT_EQ(r.error().message, "broadcast: incompatible dims 2 and 4 at dim 1 ([2,2] vs [2,4])");
}

TEST(Broadcast, Vector1RankMismatch) {
  auto r = shape::broadcast({2}, {2, 2});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::RankMismatch);
  EXPECT_NE(r.error().message.find("1 vs 2"), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find("[2] vs [2,2]"), std::string::npos) << r.error().message;
}

TEST(Broadcast, RightOneKeepsLeftAndZeroSizedDims) {
  EXPECT_SHAPE(shape::broadcast({3, 5}, {3, 1}), 3, 5);
  EXPECT_SHAPE(shape::broadcast({0, 4}, {1, 4}), 0, 4);
  EXPECT_SHAPE(shape::broadcast({1, 4}, {0, 4}), 0, 4);
  EXPECT_SHAPE(shape::broadcast({}, {}));
  EXPECT_ERR(shape::broadcast({0, 4}, {2, 4}), ErrorCode::IncompatibleDims);
}

TEST(BroadcastMany, FoldsAndRejectsEmpty) {
  EXPECT_SHAPE(broadcast_many({{1, 3}, {2, 1}, {2, 3}}), 2, 3);
  EXPECT_SHAPE(broadcast_many({{4, 1}}), 4, 1);
  auto r = broadcast_many({});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::Invalid);
  EXPECT_EQ(r.error().message, "Shape is empty.");
  EXPECT_ERR(broadcast_many({{1, 3}, {2, 1}, {3, 3}}), ErrorCode::IncompatibleDims);
  EXPECT_ERR(broadcast_many({{1, 3}, {3}}), ErrorCode::RankMismatch);
}

// ---- expand (item 4)

TEST(Expand, Vector4) {
  EXPECT_SHAPE(shape::expand({3, 1}, {2, 3, 4}), 2, 3, 4);
  EXPECT_ERR(shape::expand({3, 2}, {3, 4}), ErrorCode::IncompatibleDims);
  EXPECT_ERR(shape::expand({1, 2, 3}, {2, 3}), ErrorCode::RankMismatch);
}

TEST(Expand, DimIndexCountedInTarget) {
  auto r = shape::expand({3, 2}, {5, 3, 4});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::IncompatibleDims);
  EXPECT_EQ(r.error().message, "expand: incompatible dims 2 and 4 at dim 2 ([3,2] to [5,3,4])");
  EXPECT_SHAPE(shape::expand({}, {2, 2}), 2, 2);
  EXPECT_SHAPE(shape::expand({1}, {0}), 0);
}

// ---- reshape (item 3)

TEST(Reshape, Vector3) {
  const Shape s{2, 3, 4};
  EXPECT_SHAPE(reshape(s, {6, -1}), 6, 4);
  EXPECT_SHAPE(reshape(s, {0, -1}), 2, 12);
  EXPECT_ERR(reshape(s, {-1, -1}), ErrorCode::Invalid);
  EXPECT_ERR(reshape(s, {5, -1}), ErrorCode::Invalid);
  EXPECT_ERR(reshape(s, {4, 7}), ErrorCode::Invalid);
}

TEST(Reshape, LiteralsCopiesAndOtherNegatives) {
  const Shape s{2, 3, 4};
  EXPECT_SHAPE(reshape(s, {24}), 24);
  EXPECT_SHAPE(reshape(s, {0, 0, 0}), 2, 3, 4);
  EXPECT_SHAPE(reshape(s, {-1}), 24);
  EXPECT_SHAPE(reshape(s, {1, 2, 1, 12}), 1, 2, 1, 12);
  EXPECT_SHAPE(reshape({}, {1, 1}), 1, 1);
  EXPECT_SHAPE(reshape({1}, {}));
  EXPECT_ERR(reshape(s, {-2, 12}), ErrorCode::Invalid);
  EXPECT_ERR(reshape(s, {2, 3, 4, 0}), ErrorCode::Invalid);  // 0 copies a dim the input lacks
  EXPECT_SHAPE(reshape({2, 0}, {0, -1}), 2, 0);
  EXPECT_ERR(reshape({2, 0}, {-1, 0}), ErrorCode::Invalid);  // -1 next to a zero-sized dim: ambiguous
  auto r = reshape(s, {5, -1});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("[2,3,4]"), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find("[5,-1]"), std::string::npos) << r.error().message;
}

// ---- swapped, permuted, repeat

TEST(Swapped, SwapsAndChecksBounds) {
  EXPECT_SHAPE(shape::swapped({2, 3, 4}, 0, 2), 4, 3, 2);
  EXPECT_SHAPE(shape::swapped({2, 3, 4}, 1, 1), 2, 3, 4);
  EXPECT_ERR(shape::swapped({2, 3}, 0, 2), ErrorCode::OutOfBounds);
  EXPECT_ERR(shape::swapped({2, 3}, 5, 0), ErrorCode::OutOfBounds);
}

TEST(Permuted, ReordersAndRejectsNonPermutations) {
  EXPECT_SHAPE(permuted({2, 3, 4}, {2, 0, 1}), 4, 2, 3);
  EXPECT_SHAPE(permuted({}, {}));
  EXPECT_ERR(permuted({2, 3, 4}, {0, 1}), ErrorCode::RankMismatch);
  EXPECT_ERR(permuted({2, 3, 4}, {0, 1, 1}), ErrorCode::Invalid);
  EXPECT_ERR(permuted({2, 3, 4}, {0, 1, 3}), ErrorCode::Invalid);
}

TEST(Repeat, MultipliesOneDim) {
  EXPECT_SHAPE(shape::repeat({2, 3}, 1, 4), 2, 12);
  EXPECT_SHAPE(shape::repeat({2, 3}, 0, 0), 0, 3);
  EXPECT_ERR(shape::repeat({2, 3}, 2, 4), ErrorCode::OutOfBounds);
  EXPECT_ERR(shape::repeat({std::numeric_limits<std::uint64_t>::max() / 2 + 1}, 0, 2), ErrorCode::Invalid);
}

// ---- cat (item 5)

TEST(Cat, Vector5) {
  EXPECT_SHAPE(cat({{2, 3}, {4, 3}}, 0), 6, 3);
  EXPECT_ERR(cat({{2, 3}, {4, 3}}, 2), ErrorCode::OutOfBounds);
  EXPECT_ERR(cat({{2, 3}, {2, 4}}, 0), ErrorCode::IncompatibleShapes);
}

TEST(Cat, EmptyRankMismatchAndSingle) {
  EXPECT_ERR(cat({}, 0), ErrorCode::Invalid);
  EXPECT_ERR(cat({{2, 3}, {2, 3, 1}}, 0), ErrorCode::RankMismatch);
  EXPECT_SHAPE(cat({{2, 3}}, 1), 2, 3);
  EXPECT_SHAPE(cat({{2, 3}, {2, 0}, {2, 5}}, 1), 2, 8);
}

// ---- slices (item 6)

TEST(Slice, Vector6OutputSizes) {
  EXPECT_EQ((Slice{2, 8, 1}).output_size(10), 6u);
  EXPECT_EQ((Slice{-3, std::nullopt, 1}).output_size(10), 3u);
  EXPECT_EQ((Slice{0, std::nullopt, 3}).output_size(10), 4u);
  EXPECT_EQ((Slice{8, 2, 1}).output_size(10), 0u);
  EXPECT_ERR(slice({4, 5}, {Slice{0, 1, 1}, Slice{0, 1, 1}, Slice{0, 1, 1}}), ErrorCode::RankMismatch);
}

TEST(Slice, NegativeIndicesClampAndNegativeSteps) {
  // Negative indices count from the end and clamp at 0; large ones clamp at n.
  const Slice a{-3, -1, 1};
  EXPECT_EQ(a.begin_in(10), 7u);
  EXPECT_EQ(a.end_in(10), 9u);
  EXPECT_EQ(a.output_size(10), 2u);
  EXPECT_EQ((Slice{-100, 5, 1}).output_size(10), 5u);
  EXPECT_EQ((Slice{-100, 5, 1}).begin_in(10), 0u);
  EXPECT_EQ((Slice{3, 100, 1}).end_in(10), 10u);
  EXPECT_EQ((Slice{3, 100, 1}).output_size(10), 7u);
  EXPECT_EQ((Slice{std::numeric_limits<std::int64_t>::min(), std::nullopt, 1}).begin_in(10), 0u);
  // Negative steps walk the same range backwards: size is ceil(len / |step|).
  EXPECT_EQ((Slice{0, std::nullopt, -1}).output_size(10), 10u);
  EXPECT_EQ((Slice{0, std::nullopt, -3}).output_size(10), 4u);
  EXPECT_EQ((Slice{2, 8, -4}).output_size(10), 2u);
  EXPECT_EQ((Slice{-1, std::nullopt, -2}).output_size(10), 1u);
  EXPECT_EQ((Slice{5, 5, 1}).output_size(10), 0u);
  EXPECT_EQ((Slice{0, std::nullopt, 1}).output_size(0), 0u);
}

TEST(Slice, ShapeKeepsUnslicedDimsAndRejectsStepZero) {
  EXPECT_SHAPE(slice({10, 4, 6}, {Slice{2, 8, 2}}), 3, 4, 6);
  EXPECT_SHAPE(slice({10, 4}, {Slice{0, std::nullopt, 1}, Slice{-2, std::nullopt, 1}}), 10, 2);
  EXPECT_SHAPE(slice({10, 4}, {}), 10, 4);
  EXPECT_ERR(slice({10}, {Slice{0, 4, 0}}), ErrorCode::Invalid);
}

TEST(Slice, ToString) {
  EXPECT_EQ((Slice{2, 8, 2}).to_string(), "Slice(2, 8, 2)");
  EXPECT_EQ((Slice{-3, std::nullopt, 1}).to_string(), "Slice(-3, none, 1)");
  EXPECT_EQ((Slice{0, -1, -1}).to_string(), "Slice(0, -1, -1)");
}

// ---- matmul (item 2, shape part)

TEST(MatmulOutput, Vector2) {
  EXPECT_SHAPE(shape::matmul_output({2, 3, 4}, {2, 4, 5}), 2, 3, 5);
  EXPECT_SHAPE(shape::matmul_output({1, 3, 4}, {7, 4, 5}), 7, 3, 5);
  EXPECT_ERR(shape::matmul_output({3, 4}, {5, 6}), ErrorCode::IncompatibleShapes);
  EXPECT_ERR(shape::matmul_output({3, 4}, {2, 4, 5}), ErrorCode::RankMismatch);
}

TEST(MatmulOutput, BatchBroadcastAndRankBelowTwo) {
  EXPECT_SHAPE(shape::matmul_output({3, 4}, {4, 5}), 3, 5);
  EXPECT_SHAPE(shape::matmul_output({2, 1, 3, 4}, {1, 6, 4, 5}), 2, 6, 3, 5);
  EXPECT_ERR(shape::matmul_output({2, 3, 4}, {3, 4, 5}), ErrorCode::IncompatibleDims);
  EXPECT_ERR(shape::matmul_output({4}, {4}), ErrorCode::RankMismatch);
}

// ---- spatial formulas (item 8) and unfold windows (item 9)

TEST(Spatial, Vector8Formulas) {
  // Conv2d [1,3,32,32] * [8,3,3,3], stride 1, padding 1, dilation 1 -> 32.
  EXPECT_EQ(*shape::conv_output(32, 3, 1, 1, 1), 32u);
  // MaxPool2d 5, kernel 2, stride 2, padding 0 -> 2, ceil mode 3.
  EXPECT_EQ(*shape::pool_output(5, 2, 2, 0, 1, false), 2u);
  EXPECT_EQ(*shape::pool_output(5, 2, 2, 0, 1, true), 3u);
  // ConvTranspose1d 10, kernel 3, stride 2, padding 1, padding_out 1 -> 20.
  EXPECT_EQ(*shape::conv_transpose_output(10, 3, 2, 1, 1, 1), 20u);
}

TEST(Spatial, MoreFormulas) {
  EXPECT_EQ(*shape::conv_output(32, 3, 2, 0, 1), 15u);
  EXPECT_EQ(*shape::conv_output(10, 3, 1, 0, 2), 6u);       // effective kernel 5
  EXPECT_EQ(*shape::conv_output(3, 3, 1, 0, 1), 1u);        // numerator exactly 0
  EXPECT_EQ(*shape::pool_output(6, 2, 2, 0, 1, true), 3u);  // ceil of an exact division
  EXPECT_EQ(*shape::pool_output(7, 3, 2, 1, 1, false), 4u);
  EXPECT_EQ(*shape::conv_transpose_output(1, 1, 1, 0, 0, 1), 1u);
}

TEST(Spatial, NegativeNumeratorsAndStrideZeroAreErrors) {
  EXPECT_ERR(shape::conv_output(2, 5, 1, 0, 1), ErrorCode::Invalid);
  EXPECT_ERR(shape::conv_output(2, 3, 1, 0, 2), ErrorCode::Invalid);
  EXPECT_ERR(shape::conv_output(32, 3, 0, 1, 1), ErrorCode::Invalid);
  EXPECT_ERR(shape::conv_output(32, 0, 1, 1, 1), ErrorCode::Invalid);
  EXPECT_ERR(shape::conv_output(32, 3, 1, 1, 0), ErrorCode::Invalid);
  EXPECT_ERR(shape::pool_output(1, 3, 1, 0, 1, false), ErrorCode::Invalid);
  EXPECT_ERR(shape::pool_output(5, 2, 0, 0, 1, true), ErrorCode::Invalid);
  EXPECT_ERR(shape::conv_transpose_output(1, 1, 1, 1, 0, 1), ErrorCode::Invalid);  // 1 - 2
  EXPECT_ERR(shape::conv_transpose_output(10, 3, 0, 1, 1, 1), ErrorCode::Invalid);
  EXPECT_ERR(shape::conv_transpose_output(0, 3, 1, 0, 0, 1), ErrorCode::Invalid);
  auto r = shape::conv_output(2, 5, 1, 0, 1);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("kernel 5"), std::string::npos) << r.error().message;
}

TEST(UnfoldWindows, Vector9) {
  struct Case {
    std::uint64_t size, window, step, expected;
  };
  const Case cases[] = {{2, 5, 1, 0}, {2, 3, 1, 0}, {3, 3, 1, 1}, {4, 3, 1, 2}, {5, 3, 1, 3},
                        {2, 3, 2, 0}, {3, 3, 2, 1}, {4, 3, 2, 1}, {5, 3, 2, 2}};
  for (const Case& c : cases)
    EXPECT_EQ(shape::unfold_windows(c.size, c.window, c.step), c.expected)
        << "(" << c.size << "," << c.window << "," << c.step << ")";
  EXPECT_EQ(shape::unfold_windows(5, 3, 0), 0u);
}

}  // namespace
}  // namespace kiln::ir
