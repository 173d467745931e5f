// The daemon's rebuild check of client operations and its memo of accepted shapes
// (kiln/ipc/op_check.h): a memo hit must accept exactly what the rebuild accepts.
#include "kiln/ipc/op_check.h"

#include <gtest/gtest.h>

#include "kiln/ir/builders.h"
#include "kiln/testing/status.h"

namespace kiln::ipc {
namespace {

using ir::DType;
using ir::DTypeKind;
using ir::Family;
using ir::OpKind;
using ir::TensorId;
using ir::TensorIr;
using ir::TensorStatus;

const DType kF32{DTypeKind::F32};

TensorIr in(std::uint64_t id, ir::Shape shape, TensorStatus st = TensorStatus::ReadOnly) {
  return TensorIr{TensorId(id), std::move(shape), st, kF32};
}

ir::Operation add(std::uint64_t a, std::uint64_t b, std::uint64_t out, ir::Shape sa = {4}, ir::Shape sb = {4}) {
  auto op = ir::build::binary(Family::NumericFloat, OpKind::Numeric_Add, in(a, sa), in(b, sb), TensorId(out));
  EXPECT_TRUE(op.ok()) << op.error().to_string();
  return std::move(op).value();
}

TEST(OperationCheckMemo, AcceptsTheSameShapeWithOtherIdsFromMemory) {
  OperationCheckMemo memo;
  KILN_ASSERT_OK(memo.check(add(1, 2, 3)));
  EXPECT_EQ(memo.hits(), 0u);
  KILN_ASSERT_OK(memo.check(add(10, 11, 12)));
  KILN_ASSERT_OK(memo.check(add(7, 7, 8)));  // the same tensor twice as inputs is a valid add
  EXPECT_EQ(memo.hits(), 2u);
}

TEST(OperationCheckMemo, AHitStillRefusesAnOutputThatIsAnInput) {
  OperationCheckMemo memo;
  KILN_ASSERT_OK(memo.check(add(1, 2, 3)));
  ir::Operation aliased = add(10, 11, 12);
  aliased.tensors[2].id = TensorId(11);
  const Status st = memo.check(aliased);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("also an input"), std::string::npos) << st.error().message;
  EXPECT_FALSE(check_client_operation(aliased).ok());  // and the rebuild agrees
}

TEST(OperationCheckMemo, ALieDiffersFromEveryAcceptedShapeAndIsRebuiltAndRefused) {
  OperationCheckMemo memo;
  KILN_ASSERT_OK(memo.check(add(1, 2, 3)));
  // Claimed output shape, output dtype, input status NotInit, an extra scalar: each differs
  // from the accepted op in one field only.
  ir::Operation wrong_shape = add(4, 5, 6);
  wrong_shape.tensors[2].shape = {8};
  ir::Operation wrong_dtype = add(4, 5, 6);
  wrong_dtype.tensors[2].dtype = DType(DTypeKind::F64);
  ir::Operation not_init = add(4, 5, 6);
  not_init.tensors[0].status = TensorStatus::NotInit;
  ir::Operation with_scalar = add(4, 5, 6);
  with_scalar.scalars.push_back(ir::ScalarIr::Float(1.0));
  for (const ir::Operation* op : {&wrong_shape, &wrong_dtype, &not_init, &with_scalar}) {
    EXPECT_FALSE(memo.check(*op).ok()) << op->to_string();
    EXPECT_FALSE(check_client_operation(*op).ok()) << op->to_string();
  }
  EXPECT_EQ(memo.hits(), 0u);
  KILN_ASSERT_OK(memo.check(add(4, 5, 6)));  // the true shape is still remembered
  EXPECT_EQ(memo.hits(), 1u);
}

TEST(OperationCheckMemo, ShapesSharingASlotAreEachCheckedOnTheirOwn) {
  // More distinct shapes than slots: every one is accepted, evictions only cost a rebuild, and
  // a lie about any of them is refused whatever the slot holds.
  OperationCheckMemo memo;
  for (std::uint64_t n = 1; n <= 200; ++n) {
    ASSERT_TRUE(memo.check(add(1, 2, 3, {n}, {n})).ok()) << n;
    ASSERT_TRUE(memo.check(add(1, 2, 3, {n, 1}, {1, n})).ok()) << n;  // broadcast to [n, n]
    ir::Operation lie = add(1, 2, 3, {n}, {n});
    lie.tensors[2].shape = {n + 1};
    ASSERT_FALSE(memo.check(lie).ok()) << n;
  }
}

// A training step's few dozen shapes all stay remembered: the second pass over them rebuilds
// none (direct-mapped slots lost some of these 40 to collisions on every pass).
TEST(OperationCheckMemo, AStepsWorkingSetOfShapesIsRememberedWhole) {
  OperationCheckMemo memo;
  auto pass = [&memo](std::uint64_t first_id) {
    for (std::uint64_t n = 1; n <= 40; ++n)
      ASSERT_TRUE(memo.check(add(first_id, first_id + 1, first_id + 2, {n}, {n})).ok()) << n;
  };
  pass(1);
  EXPECT_EQ(memo.hits(), 0u);
  pass(100);
  EXPECT_EQ(memo.hits(), 40u);
}

// A full set gives up its least recently used shape: one more shape than the set holds evicts
// the oldest, not one that was just checked.
TEST(OperationCheckMemo, AFullSetEvictsItsLeastRecentlyUsedShape) {
  // Shapes that share a set, found by their set index (ids do not count).
  const std::size_t n = OperationCheckMemo::ways() + 1;
  std::vector<std::uint64_t> sizes;
  const std::size_t set = OperationCheckMemo::set_of(add(1, 2, 3, {1}, {1}));
  for (std::uint64_t size = 1; sizes.size() < n && size < 100000; ++size)
    if (OperationCheckMemo::set_of(add(1, 2, 3, {size}, {size})) == set) sizes.push_back(size);
  ASSERT_EQ(sizes.size(), n);
  OperationCheckMemo memo;
  for (std::size_t i = 0; i + 1 < n; ++i) KILN_ASSERT_OK(memo.check(add(1, 2, 3, {sizes[i]}, {sizes[i]})));
  ASSERT_EQ(memo.hits(), 0u);
  KILN_ASSERT_OK(memo.check(add(4, 5, 6, {sizes[0]}, {sizes[0]})));  // the oldest, used again
  ASSERT_EQ(memo.hits(), 1u);
  KILN_ASSERT_OK(memo.check(add(1, 2, 3, {sizes[n - 1]}, {sizes[n - 1]})));  // evicts sizes[1]
  ASSERT_EQ(memo.hits(), 1u);
  for (std::size_t i : {std::size_t{0}, std::size_t{2}, n - 1}) {
    KILN_ASSERT_OK(memo.check(add(7, 8, 9, {sizes[i]}, {sizes[i]})));
  }
  EXPECT_EQ(memo.hits(), 4u) << "a recently used shape was evicted";
  KILN_ASSERT_OK(memo.check(add(7, 8, 9, {sizes[1]}, {sizes[1]})));
  EXPECT_EQ(memo.hits(), 4u) << "the least recently used shape was kept";
}

}  // namespace
}  // namespace kiln::ipc
