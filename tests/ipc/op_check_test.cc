// The daemon's rebuild check of client operations and its memo of accepted shapes
// (kiln/ipc/op_check.h): a memo hit must accept exactly what the rebuild accepts.
#include "kiln/ipc/op_check.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "kiln/ir/builders.h"
#include "kiln/testing/quant.h"
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

// ---- The kinds runtime::Session emits beyond the elementwise core (session.h): each as its
// builder makes it is accepted; a lie about it, or a hostile attribute, is refused with an error.

const DType kI64{DTypeKind::I64};
const DType kBool = DType::boolean();

TensorIr typed(std::uint64_t id, ir::Shape shape, DType dtype) {
  return TensorIr{TensorId(id), std::move(shape), TensorStatus::ReadOnly, dtype};
}

ir::Operation built(Result<ir::Operation> r) {
  EXPECT_TRUE(r.ok()) << r.error().to_string();
  return std::move(r).value();
}

std::vector<ir::Operation> layout_and_indexing_ops() {
  namespace build = ir::build;
  const TensorIr x = in(1, {2, 3});
  const TensorId out(10);
  const std::vector<std::uint64_t> axes{1};
  const std::vector<ir::Slice> ranges{ir::Slice{0, 1, 1}, ir::Slice{1, 3, 1}};
  const std::vector<build::PadPair> pairs{{1, 0}, {0, 2}};
  const std::vector<build::PadPair> last{{1, 1}};
  return {
      built(build::flip(Family::BaseFloat, OpKind::Base_Flip, x, axes, out)),
      built(build::repeat_dim(Family::BaseFloat, OpKind::Base_RepeatDim, x, 0, 2, out)),
      built(build::select(Family::BaseFloat, OpKind::Base_Select, x, 1, typed(2, {4}, kI64), out)),
      built(build::select_assign(Family::BaseFloat, OpKind::Base_SelectAssign, x, 0, typed(2, {1}, kI64), in(3, {1, 3}),
                                 ir::IndexingUpdate::Add, out)),
      built(build::slice_assign(Family::BaseFloat, OpKind::Base_SliceAssign, x, ranges, in(3, {1, 2}), out)),
      built(build::scatter(Family::BaseFloat, OpKind::Base_Scatter, x, 1, typed(2, {2, 2}, kI64), in(3, {2, 2}),
                           ir::IndexingUpdate::Assign, out)),
      built(build::gather_nd(Family::BaseFloat, OpKind::Base_GatherNd, x, typed(2, {3, 2}, kI64), out)),
      built(build::scatter_nd(Family::BaseFloat, OpKind::Base_ScatterNd, x, typed(2, {2, 1}, kI64), in(3, {2, 3}),
                              ir::IndexingUpdate::Add, out)),
      built(build::unfold(Family::BaseFloat, OpKind::Base_Unfold, x, 1, 2, 1, out)),
      built(build::cross(Family::Float, OpKind::Float_Cross, x, in(2, {1, 3}), 1, out)),
      built(build::dim(Family::NumericFloat, OpKind::Numeric_CumSum, x, 1, out)),
      built(build::pad(Family::NumericFloat, OpKind::Numeric_Pad, x, pairs, ir::PadMode::Constant,
                       ir::ScalarIr::Float(9), out)),
      built(build::pad(Family::NumericFloat, OpKind::Numeric_Pad, x, last, ir::PadMode::Reflect, std::nullopt, out)),
      built(build::reduce_dim_with_indices(Family::NumericFloat, OpKind::Numeric_MaxDimWithIndices, x, 1, kI64, out,
                                           TensorId(11))),
      built(build::reduce_dim(Family::NumericFloat, OpKind::Numeric_TopK, x, 1, 2, out)),
      built(build::reduce_dim_arg(Family::NumericFloat, OpKind::Numeric_ArgTopK, x, 0, 1, kI64, out)),
      built(build::sort(Family::NumericFloat, OpKind::Numeric_Sort, x, 1, true, out)),
      built(build::sort_arg(Family::NumericFloat, OpKind::Numeric_ArgSort, x, 0, false, kI64, out)),
      built(build::sort_with_indices(Family::NumericFloat, OpKind::Numeric_SortWithIndices, x, 1, false, kI64, out,
                                     TensorId(11))),
      built(build::reduce_bool(Family::BaseBool, OpKind::Base_Any, typed(1, {4}, kBool), kBool, out)),
      built(build::reduce_dim_bool(Family::BaseBool, OpKind::Base_AllDim, typed(1, {2, 2}, kBool), 1, 1, kBool, out)),
  };
}

std::vector<ir::Operation> module_and_collective_ops() {
  namespace build = ir::build;
  const TensorId out(10);
  build::Conv2dOptions conv;
  conv.stride = {2, 1};
  conv.padding = {1, 0};
  build::ConvTranspose1dOptions transposed;
  transposed.stride = 2;
  transposed.padding_out = 1;
  build::MaxPool2dOptions max_pool;
  max_pool.kernel = {2, 2};
  max_pool.stride = {2, 2};
  max_pool.padding = {1, 1};
  max_pool.ceil_mode = true;
  build::AvgPool2dOptions avg_pool;
  avg_pool.kernel = {3, 3};
  avg_pool.count_include_pad = false;
  const std::vector<build::DeviceId> devices{{0, 0}, {1, 2}};
  return {
      built(build::conv2d(in(1, {1, 2, 5, 5}), in(2, {4, 2, 3, 3}), in(3, {4}), conv, out)),
      built(build::conv2d(in(1, {1, 2, 5, 5}), in(2, {4, 2, 3, 3}), std::nullopt, {}, out)),
      built(build::conv_transpose1d(in(1, {1, 2, 5}), in(2, {2, 3, 3}), in(3, {3}), transposed, out)),
      built(build::max_pool2d(in(1, {1, 1, 5, 5}), max_pool, out)),
      built(build::avg_pool2d(in(1, {2, 1, 5, 5}), avg_pool, out)),
      built(build::all_reduce(in(1, {3}), ir::ReduceOperation::Mean, devices, out)),
      built(build::all_reduce(in(1, {3}), ir::ReduceOperation::Sum, {}, out)),
  };
}

std::vector<ir::Operation> session_ops() {
  std::vector<ir::Operation> ops = layout_and_indexing_ops();
  for (ir::Operation& op : module_and_collective_ops()) ops.push_back(std::move(op));
  return ops;
}

TEST(OperationCheck, AcceptsEveryKindASessionEmits) {
  for (const ir::Operation& op : session_ops()) KILN_EXPECT_OK(check_client_operation(op)) << op.to_string();
}

TEST(OperationCheck, RefusesALieAboutAnOutputOfEveryNewKind) {
  for (const ir::Operation& op : session_ops()) {
    for (std::size_t o = 0; o < op.outputs().size(); ++o) {
      ir::Operation lie = op;
      lie.outputs()[o].shape.push_back(7);
      EXPECT_FALSE(check_client_operation(lie).ok()) << lie.to_string();
      ir::Operation wrong_dtype = op;
      wrong_dtype.outputs()[o].dtype = DType(DTypeKind::F64);
      EXPECT_FALSE(check_client_operation(wrong_dtype).ok()) << wrong_dtype.to_string();
    }
  }
}

// Refused with `what` in the message.
void expect_refused(const ir::Operation& op, const std::string& what) {
  const Status st = check_client_operation(op);
  ASSERT_FALSE(st.ok()) << op.to_string();
  EXPECT_NE(st.error().message.find(what), std::string::npos) << st.error().message;
}

// How an accepted op's claimed output is made wrong: one more dim, or a longer last dim.
enum class ShapeLie { ExtraDim, LongerLastDim };

// Every op of `ops` is accepted, directly and through the memo, and refused once any of its
// outputs claims a wrong shape (`lie`) or, with `check_dtype`, the wrong dtype f64 (every op here
// computes in f32 or an integer dtype).
void expect_accepted_and_outputs_checked(const std::vector<ir::Operation>& ops, ShapeLie lie, bool check_dtype = true) {
  OperationCheckMemo memo;
  for (const ir::Operation& op : ops) {
    KILN_EXPECT_OK(check_client_operation(op)) << op.to_string();
    KILN_EXPECT_OK(memo.check(op)) << op.to_string();
    for (std::size_t o = 0; o < op.outputs().size(); ++o) {
      const std::string what = "output " + std::to_string(o);
      ir::Operation wrong_shape = op;
      if (lie == ShapeLie::ExtraDim) {
        wrong_shape.outputs()[o].shape.push_back(7);
      } else {
        wrong_shape.outputs()[o].shape.back() += 1;
      }
      expect_refused(wrong_shape, what);
      if (!check_dtype) continue;
      ir::Operation wrong_dtype = op;
      wrong_dtype.outputs()[o].dtype = DType(DTypeKind::F64);
      // Refused as a wrong output, or (an index output) as an index dtype that is no integer one.
      const Status st = check_client_operation(wrong_dtype);
      ASSERT_FALSE(st.ok()) << wrong_dtype.to_string();
      const std::string& message = st.error().message;
      EXPECT_TRUE(message.find(what) != std::string::npos || message.find("index dtype f64") != std::string::npos ||
                  message.find("got f64") != std::string::npos)
          << message;
    }
  }
}

TEST(OperationCheck, RefusesHostileAttributesWithAnError) {
  const std::vector<ir::Operation> ops = session_ops();
  auto find = [&](OpKind k) {
    for (const ir::Operation& op : ops)
      if (op.kind == k) return op;
    ADD_FAILURE() << "no op of kind " << static_cast<int>(k);
    return ops[0];
  };
  ir::Operation op = find(OpKind::Base_Scatter);
  op.attrs[1] = 9;  // no such update rule
  expect_refused(op, "unknown indexing update 9");
  op = find(OpKind::Base_SelectAssign);
  op.attrs[0] = -1;
  expect_refused(op, "negative");
  op = find(OpKind::Base_RepeatDim);
  op.attrs[1] = INT64_MAX;  // the repeated size overflows
  expect_refused(op, "RepeatDim");
  op = find(OpKind::Numeric_Pad);
  op.attrs.pop_back();  // half a pair
  expect_refused(op, "unexpected number");
  op = find(OpKind::Numeric_Pad);
  op.attrs[0] = 7;  // no such mode (and a constant)
  expect_refused(op, "Pad");
  op = find(OpKind::Module_Conv2d);
  op.attrs[0] = 0;  // stride 0
  expect_refused(op, "stride");
  op = find(OpKind::Module_Conv2d);
  op.attrs.clear();
  expect_refused(op, "missing");
  op = find(OpKind::Module_MaxPool2d);
  op.attrs[8] = 5;  // a flag other than 0 or 1
  expect_refused(op, "differs");
  op = find(OpKind::Distributed_AllReduce);
  op.attrs[1] = std::int64_t{1} << 40;  // not two u16
  expect_refused(op, "differs");
  op = find(OpKind::Distributed_AllReduce);
  op.attrs[0] = 9;
  expect_refused(op, "unknown reduce operation");
  op = find(OpKind::Base_GatherNd);
  op.tensors[1].shape = {3, 9};  // tuples longer than the data's rank
  expect_refused(op, "GatherNd");
  op = find(OpKind::Base_Select);
  op.tensors[1].shape = {2, 2};  // indices of rank 2
  expect_refused(op, "Select");
}

// Top-k and sorting ops with hostile attributes or outputs: each refused with an error naming why.
TEST(OperationCheck, RefusesHostileSortAndTopKOperations) {
  const std::vector<ir::Operation> ops = layout_and_indexing_ops();
  auto find = [&](OpKind k) {
    for (const ir::Operation& op : ops)
      if (op.kind == k) return op;
    ADD_FAILURE() << "no op of kind " << static_cast<int>(k);
    return ops[0];
  };
  ir::Operation op = find(OpKind::Numeric_Sort);
  op.attrs[0] = 2;  // dim out of range for rank 2
  expect_refused(op, "dim 2 out of bounds for rank 2");
  op = find(OpKind::Numeric_ArgSort);
  op.attrs[0] = -1;
  expect_refused(op, "negative");
  op = find(OpKind::Numeric_Sort);
  op.attrs[1] = 5;  // descending is 0 or 1: rebuilt as 1, which differs
  expect_refused(op, "differs");
  op = find(OpKind::Numeric_SortWithIndices);
  op.attrs.pop_back();
  expect_refused(op, "missing");
  op = find(OpKind::Numeric_SortWithIndices);
  op.outputs()[1].dtype = kF32;  // indices must be an integer dtype
  expect_refused(op, "index dtype");
  op = find(OpKind::Numeric_SortWithIndices);
  op.tensors.pop_back();  // one output
  expect_refused(op, "not accepted over IPC");
  op = find(OpKind::Numeric_ArgSort);
  op.outputs()[0].dtype = kF32;
  expect_refused(op, "index dtype");
  op = find(OpKind::Numeric_TopK);
  op.attrs[1] = 4;  // k > the axis size (3)
  op.outputs()[0].shape = {2, 4};
  expect_refused(op, "k 4 exceeds axis 1 of size 3");
  op = find(OpKind::Numeric_ArgTopK);
  op.attrs[1] = 0;  // k = 0
  op.outputs()[0].shape = {0, 3};
  expect_refused(op, "accumulator_len must be at least 1");
  op = find(OpKind::Numeric_ArgTopK);
  op.attrs[0] = 7;  // axis out of range
  expect_refused(op, "axis 7 out of bounds");
  // A Sort of a bool tensor has no numeric family.
  ir::Operation bool_sort = find(OpKind::Numeric_Sort);
  bool_sort.tensors[0].dtype = kBool;
  bool_sort.tensors[1].dtype = kBool;
  EXPECT_FALSE(check_client_operation(bool_sort).ok());
}

// Unfold, ScatterNd and Cross with hostile attributes or operands: each refused with an error
// naming why.
TEST(OperationCheck, RefusesHostileUnfoldScatterNdAndCrossOperations) {
  const std::vector<ir::Operation> ops = layout_and_indexing_ops();
  auto find = [&](OpKind k) {
    for (const ir::Operation& op : ops)
      if (op.kind == k) return op;
    ADD_FAILURE() << "no op of kind " << static_cast<int>(k);
    return ops[0];
  };
  ir::Operation op = find(OpKind::Base_Unfold);
  op.attrs[2] = 0;
  expect_refused(op, "step must be at least 1");
  op = find(OpKind::Base_Unfold);
  op.attrs[1] = -2;
  expect_refused(op, "negative");
  op = find(OpKind::Base_Unfold);
  op.attrs.pop_back();
  expect_refused(op, "missing");
  op = find(OpKind::Base_Unfold);
  op.attrs[1] = 3;  // windows of 3 but the claimed output still has windows of 2
  expect_refused(op, "output 0");
  op = find(OpKind::Base_Unfold);
  op.attrs[0] = 2;
  expect_refused(op, "dim 2 out of bounds for rank 2");
  op = find(OpKind::Base_ScatterNd);
  op.attrs[0] = 9;
  expect_refused(op, "unknown indexing update 9");
  op = find(OpKind::Base_ScatterNd);
  op.tensors[1].dtype = kF32;
  expect_refused(op, "indices must be an integer dtype");
  op = find(OpKind::Base_ScatterNd);
  op.tensors[1].shape = {2, 3};  // 3-tuples into rank-2 data
  expect_refused(op, "address 3 dims");
  op = find(OpKind::Base_ScatterNd);
  op.tensors[2].dtype = DType(DTypeKind::F16);
  expect_refused(op, "dtypes differ");
  // The values' shape is the kernel's to check, as Scatter's value: the reference refuses it with
  // an error that claims the output (tests/reference/reference_layout_test.cc).
  op = find(OpKind::Base_ScatterNd);
  op.tensors[2].shape = {5};
  KILN_EXPECT_OK(check_client_operation(op));
  op = find(OpKind::Float_Cross);
  op.attrs[0] = 0;  // a dim of size 2
  expect_refused(op, "dim 0 must have size 3 in both operands");
  op = find(OpKind::Float_Cross);
  op.attrs[0] = 5;
  expect_refused(op, "out of bounds");
  op = find(OpKind::Float_Cross);
  op.attrs.clear();
  expect_refused(op, "missing");
  ir::Operation ints = find(OpKind::Float_Cross);
  for (ir::TensorIr& t : ints.tensors) t.dtype = kI64;
  ints.dtype = kI64;
  EXPECT_FALSE(check_client_operation(ints).ok()) << ints.to_string();
  ir::Operation numeric = find(OpKind::Float_Cross);
  numeric.family = Family::NumericFloat;  // the Float group only
  EXPECT_FALSE(check_client_operation(numeric).ok()) << numeric.to_string();
}

TEST(OperationCheck, TheTwoOutputsOfMaxDimWithIndicesAreBothChecked) {
  const std::vector<ir::Operation> ops = layout_and_indexing_ops();
  const auto it = std::find_if(ops.begin(), ops.end(),
                               [](const ir::Operation& op) { return op.kind == OpKind::Numeric_MaxDimWithIndices; });
  ASSERT_NE(it, ops.end());
  ir::Operation float_indices = *it;
  float_indices.outputs()[1].dtype = kF32;  // indices must be an integer dtype
  expect_refused(float_indices, "index dtype");
  ir::Operation one_output = *it;
  one_output.tensors.pop_back();
  expect_refused(one_output, "not accepted over IPC");
  // The memo applies the id rules to both outputs on a hit.
  OperationCheckMemo memo;
  KILN_ASSERT_OK(memo.check(*it));
  ir::Operation again = *it;
  again.tensors[0].id = TensorId(20), again.tensors[1].id = TensorId(21), again.tensors[2].id = TensorId(22);
  KILN_ASSERT_OK(memo.check(again));
  EXPECT_EQ(memo.hits(), 1u);
  ir::Operation aliased = again;
  aliased.tensors[2].id = TensorId(20);  // out_indices is the input
  Status st = memo.check(aliased);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("also an input"), std::string::npos) << st.error().message;
  EXPECT_FALSE(check_client_operation(aliased).ok());
  ir::Operation twice = again;
  twice.tensors[2].id = TensorId(21);  // out_indices is out
  st = memo.check(twice);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("used twice"), std::string::npos) << st.error().message;
  EXPECT_FALSE(check_client_operation(twice).ok());
}

// The float functions a Session emits (docs/spec/ir.md §5.6): Unary and Binary kinds, rebuilt by the
// table-driven builders like Exp and Powf; a lie about the output, or an integer operand, is refused.
TEST(OperationCheck, AcceptsTheTrigonometricKindsAtan2AndHypot) {
  namespace build = ir::build;
  std::vector<ir::Operation> ops;
  for (OpKind k :
       {OpKind::Float_Cosh, OpKind::Float_Sinh, OpKind::Float_Tan, OpKind::Float_ArcCos, OpKind::Float_ArcCosh,
        OpKind::Float_ArcSin, OpKind::Float_ArcSinh, OpKind::Float_ArcTan, OpKind::Float_ArcTanh})
    ops.push_back(built(build::unary(Family::Float, k, in(1, {2, 3}), TensorId(10))));
  for (OpKind k : {OpKind::Float_ArcTan2, OpKind::Float_Hypot})
    ops.push_back(built(build::binary(Family::Float, k, in(1, {2, 1}), in(2, {1, 3}), TensorId(10))));
  for (const ir::Operation& op : ops) {
    KILN_EXPECT_OK(check_client_operation(op)) << op.to_string();
    ir::Operation lie = op;
    lie.outputs()[0].shape = {3, 2};
    expect_refused(lie, "output 0");
    ir::Operation ints = op;
    for (ir::TensorIr& t : ints.tensors) t.dtype = kI64;
    ints.dtype = kI64;  // a Float family carrying an integer dtype
    EXPECT_FALSE(check_client_operation(ints).ok()) << ints.to_string();
    ir::Operation numeric = op;
    numeric.family = Family::NumericFloat;  // the Float group only
    EXPECT_FALSE(check_client_operation(numeric).ok()) << numeric.to_string();
  }
}

// The Activation kinds (docs/spec/ir.md §5.9): no Session call emits them, but a router client
// does; the table-driven builders rebuild the Unary, Binary, Scalar and Dim ones, hard_sigmoid its
// own. A lie about the output, an integer operand or another family is refused.
TEST(OperationCheck, AcceptsTheActivationKinds) {
  namespace build = ir::build;
  const Family a = Family::Activation;
  const TensorId out(10);
  std::vector<ir::Operation> ops;
  for (OpKind k :
       {OpKind::Activation_Relu, OpKind::Activation_Gelu, OpKind::Activation_Sigmoid, OpKind::Activation_LogSigmoid})
    ops.push_back(built(build::unary(a, k, in(1, {2, 3}), out)));
  for (OpKind k : {OpKind::Activation_ReluBackward, OpKind::Activation_GeluBackward, OpKind::Activation_SigmoidBackward,
                   OpKind::Activation_LogSigmoidBackward, OpKind::Activation_PRelu})
    ops.push_back(built(build::binary(a, k, in(1, {2, 1}), in(2, {1, 3}), out)));
  ops.push_back(built(build::scalar(a, OpKind::Activation_LeakyRelu, in(1, {2, 3}), ir::ScalarIr::Float(0.01), out)));
  ops.push_back(built(build::hard_sigmoid(in(1, {2, 3}), ir::ScalarIr::Float(0.2), ir::ScalarIr::Float(0.5), out)));
  for (OpKind k : {OpKind::Activation_Softmax, OpKind::Activation_LogSoftmax, OpKind::Activation_Softmin})
    ops.push_back(built(build::dim(a, k, in(1, {2, 3}), 1, out)));
  ASSERT_EQ(ops.size(), 14u);
  for (const ir::Operation& op : ops) {
    KILN_EXPECT_OK(check_client_operation(op)) << op.to_string();
    ir::Operation lie = op;
    lie.outputs()[0].shape = {3, 2};
    expect_refused(lie, "output 0");
    ir::Operation ints = op;
    for (ir::TensorIr& t : ints.tensors) t.dtype = kI64;
    EXPECT_FALSE(check_client_operation(ints).ok()) << ints.to_string();
    ir::Operation other = op;
    other.family = Family::Float;  // the Activation group only
    EXPECT_FALSE(check_client_operation(other).ok()) << other.to_string();
  }
  ir::Operation hs = ops[10];
  ASSERT_EQ(hs.kind, OpKind::Activation_HardSigmoid);
  hs.scalars.pop_back();
  expect_refused(hs, "unexpected number");
  ir::Operation soft = ops[11];
  soft.attrs[0] = 5;
  expect_refused(soft, "axis 5 out of bounds");
}

// ---- Dense layers, norms, the embedding's gradient (Session calls), and Module Embedding /
// TopKWithIndices (router-style clients): rebuilt like every other kind.

std::vector<ir::Operation> dense_ops() {
  namespace build = ir::build;
  const TensorId out(10);
  const TensorIr w = in(2, {3, 4});
  const TensorIr v3 = in(3, {3});
  return {
      built(build::linear(in(1, {2, 3}), w, in(3, {4}), out)),
      built(build::linear(in(1, {5, 2, 3}), w, std::nullopt, out)),
      built(build::linear(in(1, {3}), w, std::nullopt, out)),
      built(build::linear_x_backward(w, in(1, {2, 4}), out)),
      built(build::linear_weight_backward(in(1, {2, 3}), in(3, {2, 4}), out)),
      built(build::linear_bias_backward(in(1, {2, 4}), out)),
      built(build::layer_norm(in(1, {2, 3}), in(2, {3}), v3, 1e-5, out)),
      built(build::layer_norm(in(1, {2, 3}), in(2, {3}), std::nullopt, 0.0, out)),
      built(build::layer_norm_with_stats(in(1, {2, 3}), in(2, {3}), v3, 1e-5, out, TensorId(11), TensorId(12))),
      built(build::batch_norm(in(1, {2, 3, 2}), in(2, {3}), v3, in(4, {3}), in(5, {3}), 1e-5, out)),
      built(build::embedding_backward(in(1, {4, 3}), in(2, {2, 2, 3}), typed(3, {2, 2}, kI64), out)),
  };
}

TEST(OperationCheck, AcceptsDenseLayersNormsAndEmbeddingBackward) {
  expect_accepted_and_outputs_checked(dense_ops(), ShapeLie::ExtraDim);
}

// Refused with `what` in the message: the first op of `kind` in `ops`, changed by `change`.
template <class F>
void expect_changed_refused(const std::vector<ir::Operation>& ops, OpKind kind, F&& change, const std::string& what) {
  const auto it = std::find_if(ops.begin(), ops.end(), [kind](const ir::Operation& op) { return op.kind == kind; });
  ASSERT_NE(it, ops.end());
  ir::Operation op = *it;
  change(op);
  expect_refused(op, what);
}

std::int64_t bits_of(double v) {
  std::int64_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

TEST(OperationCheck, RefusesHostileLinearOperations) {
  const std::vector<ir::Operation> ops = dense_ops();
  using Op = ir::Operation;
  // A [d_out, d_in] weight, a rank-0 x, a bias of d_in elements, mixed dtypes, a missing weight.
  expect_changed_refused(
      ops, OpKind::Module_Linear,
      [](Op& op) {
        op.tensors[1].shape = {4, 3};
      },
      "has 3 features");
  expect_changed_refused(
      ops, OpKind::Module_Linear, [](Op& op) { op.tensors[0].shape = {}; }, "rank at least 1");
  expect_changed_refused(
      ops, OpKind::Module_Linear, [](Op& op) { op.tensors[2].shape = {3}; }, "bias");
  expect_changed_refused(
      ops, OpKind::Module_Linear, [](Op& op) { op.tensors[1].dtype = DType(DTypeKind::F64); }, "dtypes differ");
  expect_changed_refused(
      ops, OpKind::Module_Linear,
      [](Op& op) {
        op.tensors.erase(op.tensors.begin() + 1, op.tensors.begin() + 3);
        op.num_inputs = 1;
      },
      "unexpected number");
  // The backwards: features that do not match, leading dims that differ, a claimed shape, an
  // integer gradient, and an X-backward relabelled as a weight backward.
  expect_changed_refused(
      ops, OpKind::Module_LinearXBackward,
      [](Op& op) {
        op.tensors[1].shape = {2, 3};
      },
      "gives 4");
  expect_changed_refused(
      ops, OpKind::Module_LinearWeightBackward,
      [](Op& op) {
        op.tensors[1].shape = {3, 4};
      },
      "same leading dims");
  expect_changed_refused(
      ops, OpKind::Module_LinearBiasBackward, [](Op& op) { op.outputs()[0].shape = {2}; }, "output 0");
  expect_changed_refused(
      ops, OpKind::Module_LinearBiasBackward, [](Op& op) { op.tensors[0].dtype = kI64; }, "float dtype");
  expect_changed_refused(
      ops, OpKind::Module_LinearXBackward, [](Op& op) { op.kind = OpKind::Module_LinearWeightBackward; },
      "same leading dims");
}

TEST(OperationCheck, RefusesHostileNormAndEmbeddingBackwardOperations) {
  const std::vector<ir::Operation> ops = dense_ops();
  using Op = ir::Operation;
  expect_changed_refused(
      ops, OpKind::Module_LayerNorm, [](Op& op) { op.tensors[1].shape = {2}; }, "gamma");
  expect_changed_refused(
      ops, OpKind::Module_LayerNorm, [](Op& op) { op.tensors[2].dtype = DType(DTypeKind::F16); }, "dtypes differ");
  expect_changed_refused(
      ops, OpKind::Module_LayerNorm, [](Op& op) { op.attrs[0] = bits_of(-1.0); },
      "epsilon must be finite and non-negative");
  expect_changed_refused(
      ops, OpKind::Module_LayerNorm, [](Op& op) { op.attrs[0] = bits_of(std::nan("")); }, "epsilon");
  expect_changed_refused(
      ops, OpKind::Module_LayerNorm, [](Op& op) { op.attrs.clear(); }, "unexpected number");
  // BatchNorm: an epsilon that is not a Float scalar is rebuilt as one, which differs.
  expect_changed_refused(
      ops, OpKind::Module_BatchNorm, [](Op& op) { op.scalars[0] = ir::ScalarIr::Int(0); }, "differs");
  expect_changed_refused(
      ops, OpKind::Module_BatchNorm, [](Op& op) { op.scalars.clear(); }, "unexpected number");
  expect_changed_refused(
      ops, OpKind::Module_BatchNorm, [](Op& op) { op.tensors[4].shape = {2}; }, "variance");
  expect_changed_refused(
      ops, OpKind::Module_BatchNorm, [](Op& op) { op.tensors[0].shape = {3}, op.outputs()[0].shape = {3}; },
      "rank at least 2");
  expect_changed_refused(
      ops, OpKind::Module_EmbeddingBackward, [](Op& op) { op.tensors[2].dtype = kF32; },
      "indices must be an integer dtype");
  expect_changed_refused(
      ops, OpKind::Module_EmbeddingBackward,
      [](Op& op) {
        op.tensors[1].shape = {2, 2, 4};
      },
      "out_grad");
  expect_changed_refused(
      ops, OpKind::Module_EmbeddingBackward,
      [](Op& op) {
        op.outputs()[0].shape = {2, 3};
      },
      "output 0");
  expect_changed_refused(
      ops, OpKind::Module_EmbeddingBackward,
      [](Op& op) {
        op.tensors[0].shape = {4, 3, 1};
      },
      "rank 2");
}

// Module Embedding and TopKWithIndices (docs/spec/ir.md §5.3: router clients send them; no Session
// call emits them): accepted as their builders make them, refused when anything differs.
TEST(OperationCheck, AcceptsModuleEmbeddingAndTopKWithIndicesAndRefusesHostileOnes) {
  namespace build = ir::build;
  using Op = ir::Operation;
  const std::vector<ir::Operation> ops{
      built(build::embedding(in(1, {4, 3}), typed(2, {2, 2}, kI64), TensorId(10))),
      built(build::topk_with_indices(Family::NumericFloat, OpKind::Numeric_TopKWithIndices, in(1, {2, 3}), 1, 2, kI64,
                                     TensorId(10), TensorId(11))),
  };
  expect_accepted_and_outputs_checked(ops, ShapeLie::ExtraDim);
  const OpKind emb = OpKind::Module_Embedding, topk = OpKind::Numeric_TopKWithIndices;
  expect_changed_refused(
      ops, emb, [](Op& op) { op.tensors[1].dtype = kF32; }, "indices must be an integer dtype");
  expect_changed_refused(
      ops, emb,
      [](Op& op) {
        op.tensors[0].shape = {4, 3, 1};
      },
      "rank 2");
  expect_changed_refused(
      ops, emb, [](Op& op) { op.tensors[0].dtype = kI64; }, "float dtype");
  expect_changed_refused(
      ops, emb, [](Op& op) { op.tensors.erase(op.tensors.begin() + 1), op.num_inputs = 1; }, "unexpected number");
  expect_changed_refused(
      ops, topk,
      [](Op& op) {
        op.attrs[1] = 4, op.outputs()[0].shape = {2, 4}, op.outputs()[1].shape = {2, 4};
      },
      "k 4 exceeds dim 1 of size 3");
  expect_changed_refused(
      ops, topk, [](Op& op) { op.attrs[0] = 5; }, "dim 5 out of bounds");
  expect_changed_refused(
      ops, topk, [](Op& op) { op.attrs.pop_back(); }, "missing");
  expect_changed_refused(
      ops, topk, [](Op& op) { op.outputs()[1].dtype = kF32; }, "index dtype");
  expect_changed_refused(
      ops, topk, [](Op& op) { op.tensors.pop_back(); }, "not accepted over IPC");
  expect_changed_refused(
      ops, topk, [](Op& op) { op.outputs()[0].dtype = kI64; }, "output 0");
}

// Init (kiln uploads out of band) and Custom (the daemon runs no client code) are refused.
TEST(OperationCheck, InitAndCustomAreRefusedByName) {
  namespace build = ir::build;
  const TensorIr x = in(1, {2, 3});
  const std::vector<ir::Operation> refused{
      built(build::custom("user::op", std::vector<TensorIr>{x},
                          std::vector<TensorIr>{TensorIr::uninit(TensorId(10), {2, 3}, kF32)}, {})),
      built(build::init({2, 3}, kF32, TensorId(10))),
  };
  OperationCheckMemo memo;
  for (const ir::Operation& op : refused) {
    expect_refused(op, "not accepted over IPC");
    EXPECT_FALSE(memo.check(op).ok()) << op.to_string();
  }
}

// SyncCollective (Session::sync_collective in the router form) is accepted as the builder makes
// it, with nothing attached: a tensor, a scalar or an attribute sent with it is refused.
TEST(OperationCheck, AcceptsABareSyncCollectiveOnly) {
  const ir::Operation sync = built(ir::build::sync_collective());
  KILN_EXPECT_OK(check_client_operation(sync));
  OperationCheckMemo memo;
  KILN_EXPECT_OK(memo.check(sync));
  ir::Operation with_tensor = sync;
  with_tensor.tensors.push_back(in(1, {2, 3}));
  with_tensor.num_inputs = 1;
  EXPECT_FALSE(check_client_operation(with_tensor).ok());
  ir::Operation with_attr = sync;
  with_attr.attrs.push_back(1);
  EXPECT_FALSE(check_client_operation(with_attr).ok());
  ir::Operation with_scalar = sync;
  with_scalar.scalars.push_back(ir::ScalarIr::from_f64(1.0, kF32).value());
  EXPECT_FALSE(check_client_operation(with_scalar).ok());
}

// Random creation (Session::random): Float Random and NumericInt IntRandom of every distribution
// are accepted, from the rebuild and from the memo; an unknown distribution, missing attributes,
// an input, or an output dtype other than the op's are refused. (The output shape is given, as
// for Zeros / Full: no lie about it can be told.)
TEST(OperationCheck, AcceptsRandomCreationOfEveryDistribution) {
  namespace build = ir::build;
  using D = build::DistributionIr;
  const DType i32{DTypeKind::I32};
  const D dists[] = {D{}, D::bernoulli(0.25), D::uniform(-1, 2), D::normal(0, 3)};
  OperationCheckMemo memo;
  for (const D& d : dists) {
    const ir::Operation f = built(build::random(Family::Float, OpKind::Float_Random, {2, 3}, kF32, d, TensorId(10)));
    const ir::Operation i =
        built(build::random(Family::NumericInt, OpKind::Numeric_IntRandom, {4}, i32, d, TensorId(10)));
    for (const ir::Operation* op : {&f, &i}) {
      KILN_EXPECT_OK(check_client_operation(*op)) << op->to_string();
      KILN_EXPECT_OK(memo.check(*op)) << op->to_string();
    }
  }
  const ir::Operation r = built(build::random(Family::Float, OpKind::Float_Random, {2}, kF32, {}, TensorId(10)));
  ir::Operation unknown = r;
  unknown.attrs[0] = 9;
  expect_refused(unknown, "unknown distribution");
  ir::Operation short_attrs = r;
  short_attrs.attrs.pop_back();
  expect_refused(short_attrs, "attributes missing or extra");
  ir::Operation with_input = r;
  with_input.tensors.insert(with_input.tensors.begin(), in(1, {2}));
  with_input.num_inputs = 1;
  EXPECT_FALSE(check_client_operation(with_input).ok()) << with_input.to_string();
  ir::Operation as_f64 = r;
  as_f64.outputs()[0].dtype = DType(DTypeKind::F64);
  EXPECT_FALSE(check_client_operation(as_f64).ok()) << as_f64.to_string();
  ir::Operation int_out = r;
  int_out.outputs()[0].dtype = i32;
  int_out.dtype = i32;
  EXPECT_FALSE(check_client_operation(int_out).ok()) << int_out.to_string();
}

// ---- Convolutions of 1..3 spatial dims and their gradients (docs/spec/ir.md §5.8): one op of
// each of the 21 kinds, as a Session call builds it.

std::vector<ir::Operation> conv_ops() {
  namespace build = ir::build;
  using K = OpKind;
  const TensorId out(10);
  build::Conv1dOptions c1;  // [2, 4, 9] → (9 + 2 − 5) / 2 + 1 = 4
  c1.stride = 2;
  c1.padding = 1;
  c1.dilation = 2;
  c1.groups = 2;
  build::Conv3dOptions c3;  // [1, 2, 3, 4, 5] * [3, 2, 3, 2, 3] → [1, 3, 3, 3, 5]
  c3.padding = {1, 0, 1};
  build::ConvTranspose2dOptions t2;  // [1, 4, 3, 3] * [4, 1, 2, 2] → [1, 2, 7, 4]
  t2.stride = {2, 1};
  t2.padding_out = {1, 0};
  t2.groups = 2;
  build::ConvTranspose3dOptions t3;  // [1, 2, 2, 2, 2] * [2, 3, 2, 2, 2] → [1, 3, 3, 4, 3]
  t3.dilation = {1, 2, 1};
  const build::ConvOptions o1 = build::conv_options(c1), o2 = build::conv_options(build::Conv2dOptions{});
  const build::ConvOptions o3 = build::conv_options(c3), ot2 = build::conv_options(t2), ot3 = build::conv_options(t3);
  const build::ConvOptions ot1 = build::conv_options(build::ConvTranspose1dOptions{});  // [1, 2, 5] → [1, 3, 6]
  const TensorIr x1 = in(1, {2, 4, 9}), w1 = in(2, {6, 2, 3}), g1 = in(3, {2, 6, 4});
  const TensorIr x2 = in(1, {1, 2, 4, 4}), w2 = in(2, {3, 2, 2, 2}), g2 = in(3, {1, 3, 3, 3});
  const TensorIr x3 = in(1, {1, 2, 3, 4, 5}), w3 = in(2, {3, 2, 3, 2, 3}), g3 = in(3, {1, 3, 3, 3, 5});
  const TensorIr tx1 = in(1, {1, 2, 5}), tw1 = in(2, {2, 3, 2}), tg1 = in(3, {1, 3, 6});
  const TensorIr tx2 = in(1, {1, 4, 3, 3}), tw2 = in(2, {4, 1, 2, 2}), tg2 = in(3, {1, 2, 7, 4});
  const TensorIr tx3 = in(1, {1, 2, 2, 2, 2}), tw3 = in(2, {2, 3, 2, 2, 2}), tg3 = in(3, {1, 3, 3, 4, 3});
  return {
      built(build::conv1d(x1, w1, in(3, {6}), c1, out)),
      built(build::conv1d(x1, w1, std::nullopt, c1, out)),
      built(build::conv3d(x3, w3, in(3, {3}), c3, out)),
      built(build::conv_transpose2d(tx2, tw2, in(3, {2}), t2, out)),
      built(build::conv_transpose3d(tx3, tw3, std::nullopt, t3, out)),
      built(build::conv_backward(K::Module_Conv1dXBackward, x1, w1, g1, o1, out)),
      built(build::conv_backward(K::Module_Conv2dXBackward, x2, w2, g2, o2, out)),
      built(build::conv_backward(K::Module_Conv3dXBackward, x3, w3, g3, o3, out)),
      built(build::conv_backward(K::Module_Conv1dWeightBackward, x1, w1, g1, o1, out)),
      built(build::conv_backward(K::Module_Conv2dWeightBackward, x2, w2, g2, o2, out)),
      built(build::conv_backward(K::Module_Conv3dWeightBackward, x3, w3, g3, o3, out)),
      built(build::conv_bias_backward(K::Module_Conv1dBiasBackward, x1, in(2, {6}), g1, out)),
      built(build::conv_bias_backward(K::Module_Conv2dBiasBackward, x2, in(2, {3}), g2, out)),
      built(build::conv_bias_backward(K::Module_Conv3dBiasBackward, x3, in(2, {3}), g3, out)),
      built(build::conv_transpose_backward(K::Module_ConvTranspose1dWeightBackward, tx1, tw1, tg1, ot1, out)),
      built(build::conv_transpose_backward(K::Module_ConvTranspose2dWeightBackward, tx2, tw2, tg2, ot2, out)),
      built(build::conv_transpose_backward(K::Module_ConvTranspose3dWeightBackward, tx3, tw3, tg3, ot3, out)),
      built(build::conv_bias_backward(K::Module_ConvTranspose1dBiasBackward, tx1, in(2, {3}), tg1, out)),
      built(build::conv_bias_backward(K::Module_ConvTranspose2dBiasBackward, tx2, in(2, {2}), tg2, out)),
      built(build::conv_bias_backward(K::Module_ConvTranspose3dBiasBackward, tx3, in(2, {3}), tg3, out)),
      built(build::conv2d(x2, w2, std::nullopt, {}, out)),
      built(build::conv_transpose1d(tx1, tw1, in(3, {3}), {}, out)),
  };
}

TEST(OperationCheck, AcceptsEveryConvolutionKind) {
  const std::vector<ir::Operation> ops = conv_ops();
  expect_accepted_and_outputs_checked(ops, ShapeLie::ExtraDim);
  std::vector<OpKind> kinds;
  for (const ir::Operation& op : ops)
    if (std::find(kinds.begin(), kinds.end(), op.kind) == kinds.end()) kinds.push_back(op.kind);
  EXPECT_EQ(kinds.size(), 21u);
}

TEST(OperationCheck, RefusesHostileConvolutions) {
  const std::vector<ir::Operation> ops = conv_ops();
  using Op = ir::Operation;
  using K = OpKind;
  // Attribute counts that do not fit the kind's rank (a Conv1d relabelled Conv2d), a negative one.
  expect_changed_refused(
      ops, K::Module_Conv1d, [](Op& op) { op.attrs.pop_back(); }, "missing or extra");
  expect_changed_refused(
      ops, K::Module_Conv3d, [](Op& op) { op.attrs.push_back(1); }, "missing or extra");
  expect_changed_refused(
      ops, K::Module_Conv1d, [](Op& op) { op.kind = K::Module_Conv2d; }, "missing or extra");
  expect_changed_refused(
      ops, K::Module_ConvTranspose2d, [](Op& op) { op.attrs[2] = -1; }, "negative");
  // Options the builders refuse: stride 0, dilation 0, padding_out >= max(stride, dilation),
  // groups that do not divide the channels.
  expect_changed_refused(
      ops, K::Module_Conv1d, [](Op& op) { op.attrs[0] = 0; }, "stride");
  expect_changed_refused(
      ops, K::Module_Conv3d, [](Op& op) { op.attrs[7] = 0; }, "dilation");
  expect_changed_refused(
      ops, K::Module_ConvTranspose2d, [](Op& op) { op.attrs[4] = 2; }, "padding_out 2 must be smaller");
  expect_changed_refused(
      ops, K::Module_Conv1d, [](Op& op) { op.attrs[3] = 3; }, "not divisible by 3 groups");
  // Tensors: a bias of the wrong length, mixed dtypes, output_grad of another shape, a weight of
  // another rank, an X gradient relabelled as the weight's, two inputs for three.
  expect_changed_refused(
      ops, K::Module_Conv3d, [](Op& op) { op.tensors[2].shape = {2}; }, "bias");
  expect_changed_refused(
      ops, K::Module_ConvTranspose2d, [](Op& op) { op.tensors[1].dtype = DType(DTypeKind::F64); }, "dtypes differ");
  expect_changed_refused(
      ops, K::Module_Conv2dWeightBackward,
      [](Op& op) {
        op.tensors[2].shape = {1, 3, 3, 2};
      },
      "forward's output shape");
  expect_changed_refused(
      ops, K::Module_ConvTranspose3dWeightBackward,
      [](Op& op) {
        op.tensors[1].shape = {2, 3, 2, 2};
      },
      "weight must have rank 5");
  expect_changed_refused(
      ops, K::Module_Conv1dXBackward, [](Op& op) { op.kind = K::Module_Conv1dWeightBackward; }, "output 0");
  expect_changed_refused(
      ops, K::Module_ConvTranspose2dWeightBackward,
      [](Op& op) {
        op.tensors.erase(op.tensors.begin() + 2);
        op.num_inputs = 2;
      },
      "unexpected number");
  // The bias gradients: an attribute, another batch, an integer bias.
  expect_changed_refused(
      ops, K::Module_Conv2dBiasBackward, [](Op& op) { op.attrs.push_back(0); }, "unexpected number");
  expect_changed_refused(
      ops, K::Module_ConvTranspose1dBiasBackward,
      [](Op& op) {
        op.tensors[2].shape = {2, 3, 6};
      },
      "same batch");
  expect_changed_refused(
      ops, K::Module_Conv3dBiasBackward, [](Op& op) { op.tensors[1].dtype = kI64; }, "float dtype");
}

// ---- Pools beyond MaxPool2d / AvgPool2d and their backwards (Session calls): rebuilt from the
// kind's spatial rank and the window attributes; the with-indices pools have two outputs.

std::vector<ir::Operation> pool_ops() {
  namespace build = ir::build;
  const TensorId out(10), idx(11);
  const build::MaxPool1dOptions m1{3, 2, 1, 2, true};  // [2, 1, 9] → [2, 1, 4]
  build::MaxPool2dOptions m2;                          // [1, 2, 5, 6] → [1, 2, 3, 3]
  m2.kernel = {3, 2};
  m2.stride = {2, 2};
  m2.padding = {1, 0};
  const build::AvgPool1dOptions a1{3, 2, 1, false, true};  // [2, 1, 7] → [2, 1, 4]
  build::AvgPool2dOptions a2;                              // [1, 2, 5, 6] → [1, 2, 3, 4]
  a2.kernel = {2, 2};
  a2.stride = {2, 2};
  a2.padding = {1, 1};
  const TensorIr x1 = in(1, {2, 1, 9}), x2 = in(1, {1, 2, 5, 6}), x7 = in(1, {2, 1, 7}), x3 = in(1, {1, 1, 3, 5, 6});
  return {
      built(build::max_pool1d(x1, m1, out)),
      built(build::max_pool1d_with_indices(x1, m1, kI64, out, idx)),
      built(build::max_pool2d_with_indices(x2, m2, kI64, out, idx)),
      built(build::max_pool1d_with_indices_backward(x1, in(2, {2, 1, 4}), typed(3, {2, 1, 4}, kI64), m1, out)),
      built(build::max_pool2d_with_indices_backward(x2, in(2, {1, 2, 3, 3}), typed(3, {1, 2, 3, 3}, kI64), m2, out)),
      built(build::avg_pool1d(x7, a1, out)),
      built(build::avg_pool1d_backward(x7, in(2, {2, 1, 4}), a1, out)),
      built(build::avg_pool2d_backward(x2, in(2, {1, 2, 3, 4}), a2, out)),
      built(build::adaptive_avg_pool1d(x7, 3, out)),
      built(build::adaptive_avg_pool2d(x2, {3, 4}, out)),
      built(build::adaptive_avg_pool3d(x3, {2, 3, 4}, out)),
      built(build::adaptive_avg_pool1d_backward(x7, in(2, {2, 1, 3}), out)),
      built(build::adaptive_avg_pool2d_backward(x2, in(2, {1, 2, 3, 4}), out)),
      built(build::adaptive_avg_pool3d_backward(x3, in(2, {1, 1, 2, 3, 4}), out)),
  };
}

TEST(OperationCheck, AcceptsThePoolsAndTheirBackwards) {
  expect_accepted_and_outputs_checked(pool_ops(), ShapeLie::ExtraDim);
}

TEST(OperationCheck, RefusesHostileMaxPools) {
  const std::vector<ir::Operation> ops = pool_ops();
  using Op = ir::Operation;
  const OpKind mp = OpKind::Module_MaxPool1d, wi1 = OpKind::Module_MaxPool1dWithIndices,
               wi2 = OpKind::Module_MaxPool2dWithIndices, back = OpKind::Module_MaxPool1dWithIndicesBackward;
  // The window: padding over half the kernel, kernel or stride 0, a missing, surplus or negative
  // attribute, a flag of 2.
  expect_changed_refused(
      ops, mp, [](Op& op) { op.attrs[2] = 2; }, "padding 2 exceeds half the kernel size 3");
  expect_changed_refused(
      ops, mp, [](Op& op) { op.attrs[0] = 0; }, "kernel size must be at least 1");
  expect_changed_refused(
      ops, mp, [](Op& op) { op.attrs[1] = 0; }, "stride must be at least 1");
  expect_changed_refused(
      ops, mp, [](Op& op) { op.attrs.pop_back(); }, "missing");
  expect_changed_refused(
      ops, mp, [](Op& op) { op.attrs.push_back(0); }, "differs");
  expect_changed_refused(
      ops, mp, [](Op& op) { op.attrs[3] = -2; }, "negative");
  expect_changed_refused(
      ops, mp, [](Op& op) { op.attrs[4] = 2; }, "differs");
  expect_changed_refused(
      ops, mp,
      [](Op& op) {
        op.tensors[0].shape = {2, 1, 9, 1};
      },
      "must have rank 3");
  // The indices: a float or unsigned dtype, one output, a claimed shape; a 2d op relabelled 1d.
  expect_changed_refused(
      ops, wi1, [](Op& op) { op.outputs()[1].dtype = kF32; }, "signed integer dtype");
  expect_changed_refused(
      ops, wi1, [](Op& op) { op.outputs()[1].dtype = DType(DTypeKind::U32); }, "signed integer dtype");
  expect_changed_refused(
      ops, wi1, [](Op& op) { op.tensors.pop_back(); }, "not accepted over IPC");
  expect_changed_refused(
      ops, wi2,
      [](Op& op) {
        op.outputs()[1].shape = {1, 2, 3, 4};
      },
      "output 1");
  expect_changed_refused(
      ops, wi2, [](Op& op) { op.kind = OpKind::Module_MaxPool1dWithIndices; }, "must have rank 3");
  // The backward: grad or indices of another shape, float indices, a missing input.
  expect_changed_refused(
      ops, back,
      [](Op& op) {
        op.tensors[1].shape = {2, 1, 5};
      },
      "grad");
  expect_changed_refused(
      ops, back,
      [](Op& op) {
        op.tensors[2].shape = {2, 4};
      },
      "indices");
  expect_changed_refused(
      ops, back, [](Op& op) { op.tensors[2].dtype = kF32; }, "indices must be an integer dtype");
  expect_changed_refused(
      ops, back, [](Op& op) { op.tensors.erase(op.tensors.begin() + 2), op.num_inputs = 2; }, "unexpected number");
}

TEST(OperationCheck, RefusesHostileAvgAndAdaptivePools) {
  const std::vector<ir::Operation> ops = pool_ops();
  using Op = ir::Operation;
  const OpKind avg = OpKind::Module_AvgPool1d, avg_back = OpKind::Module_AvgPool2dBackward,
               a1 = OpKind::Module_AdaptiveAvgPool1d, a2 = OpKind::Module_AdaptiveAvgPool2d,
               a2_back = OpKind::Module_AdaptiveAvgPool2dBackward;
  expect_changed_refused(
      ops, avg, [](Op& op) { op.attrs[3] = 3; }, "differs");  // count_include_pad 3
  expect_changed_refused(
      ops, avg, [](Op& op) { op.attrs[2] = 2; }, "padding 2 exceeds");
  expect_changed_refused(
      ops, avg, [](Op& op) { op.tensors[0].dtype = kI64; }, "float dtype");
  expect_changed_refused(
      ops, avg_back,
      [](Op& op) {
        op.tensors[1].shape = {1, 2, 3, 3};
      },
      "must have the pool's output shape");
  expect_changed_refused(
      ops, avg_back, [](Op& op) { op.attrs.pop_back(); }, "missing");
  // Adaptive: an output size of 0, one that disagrees with the claimed output, a missing or
  // surplus size, an empty spatial dim of x; the backward: another batch, an attribute.
  expect_changed_refused(
      ops, a1, [](Op& op) { op.attrs[0] = 0; }, "output size 0");
  expect_changed_refused(
      ops, a1, [](Op& op) { op.attrs[0] = 2; }, "output 0");
  expect_changed_refused(
      ops, a2, [](Op& op) { op.attrs.pop_back(); }, "missing");
  expect_changed_refused(
      ops, a2, [](Op& op) { op.attrs.push_back(4); }, "differs");
  expect_changed_refused(
      ops, a1,
      [](Op& op) {
        op.tensors[0].shape = {2, 1, 0};
      },
      "empty spatial dim");
  expect_changed_refused(
      ops, a2_back,
      [](Op& op) {
        op.tensors[1].shape = {2, 2, 3, 4};
      },
      "batch and channel dims");
  expect_changed_refused(
      ops, a2_back, [](Op& op) { op.attrs.push_back(3); }, "differs");
}

// ---- Resampling (Session calls): Interpolate and its backward, GridSample2d, Unfold4d; the
// enum attributes are checked by the builders, flags rebuilt as 0 / 1.

std::vector<ir::Operation> resample_ops() {
  namespace build = ir::build;
  using ir::GridSamplePaddingMode;
  using ir::InterpolateMode;
  const TensorId out(10);
  build::Unfold4dOptions strided;
  strided.stride = {2, 1};
  strided.padding = {1, 0};
  strided.dilation = {2, 1};
  return {
      built(build::interpolate(in(1, {1, 2, 3, 4}), {5, 2}, {InterpolateMode::Bicubic, false}, out)),
      built(build::interpolate(in(1, {1, 2, 3, 4}), {6, 8}, {}, out)),
      built(build::interpolate_backward(in(1, {1, 2, 3, 4}), in(2, {1, 2, 5, 2}), {5, 2},
                                        {InterpolateMode::Lanczos3, true}, out)),
      built(build::grid_sample_2d(in(1, {2, 3, 4, 5}), in(2, {2, 6, 7, 2}), {}, out)),
      built(build::grid_sample_2d(in(1, {2, 3, 4, 5}), in(2, {2, 6, 7, 2}),
                                  {InterpolateMode::Nearest, GridSamplePaddingMode::Reflection, true}, out)),
      built(build::unfold4d(in(1, {2, 3, 5, 4}), {2, 3}, {}, out)),
      built(build::unfold4d(in(1, {2, 3, 5, 4}), {2, 3}, strided, out)),
  };
}

TEST(OperationCheck, AcceptsTheResamplingKinds) {
  expect_accepted_and_outputs_checked(resample_ops(), ShapeLie::LongerLastDim);
}

TEST(OperationCheck, RefusesHostileInterpolateOperations) {
  const std::vector<ir::Operation> ops = resample_ops();
  using Op = ir::Operation;
  const OpKind up = OpKind::Module_Interpolate, back = OpKind::Module_InterpolateBackward;
  // Modes out of the enum, a negative mode, a flag other than 0 / 1, a zero output size.
  expect_changed_refused(
      ops, up, [](Op& op) { op.attrs[2] = 7; }, "unknown interpolate mode 7");
  expect_changed_refused(
      ops, up, [](Op& op) { op.attrs[2] = -1; }, "attribute 2 missing or negative");
  expect_changed_refused(
      ops, up, [](Op& op) { op.attrs[3] = 2; }, "differs");
  expect_changed_refused(
      ops, up,
      [](Op& op) {
        op.attrs[0] = 0, op.outputs()[0].shape = {1, 2, 0, 2};
      },
      "must be at least 1");
  // Wrong ranks, an empty image, an integer x, a missing attribute.
  expect_changed_refused(
      ops, up,
      [](Op& op) {
        op.tensors[0].shape = {2, 3, 4};
      },
      "x must have rank 4");
  expect_changed_refused(
      ops, up,
      [](Op& op) {
        op.tensors[0].shape = {1, 2, 0, 4};
      },
      "empty image");
  expect_changed_refused(
      ops, up, [](Op& op) { op.tensors[0].dtype = kI64; }, "float dtype");
  expect_changed_refused(
      ops, up, [](Op& op) { op.attrs.pop_back(); }, "missing");
  // The backward: a grad of the wrong shape or rank or dtype, no grad, a forward relabelled.
  expect_changed_refused(
      ops, back,
      [](Op& op) {
        op.tensors[1].shape = {1, 2, 2, 5};
      },
      "grad");
  expect_changed_refused(
      ops, back,
      [](Op& op) {
        op.tensors[1].shape = {2, 5, 2};
      },
      "grad");
  expect_changed_refused(
      ops, back, [](Op& op) { op.tensors[1].dtype = kBool; }, "grad");
  expect_changed_refused(
      ops, back, [](Op& op) { op.tensors.erase(op.tensors.begin() + 1), op.num_inputs = 1; }, "unexpected number");
  expect_changed_refused(
      ops, up, [](Op& op) { op.kind = OpKind::Module_InterpolateBackward; }, "unexpected number");
  expect_changed_refused(
      ops, back, [](Op& op) { op.attrs[2] = 5; }, "unknown interpolate mode 5");
}

TEST(OperationCheck, RefusesHostileGridSampleAndUnfold4dOperations) {
  const std::vector<ir::Operation> ops = resample_ops();
  using Op = ir::Operation;
  const OpKind gs = OpKind::Float_GridSample2d, uf = OpKind::Module_Unfold4d;
  expect_changed_refused(
      ops, gs, [](Op& op) { op.attrs[0] = 1; }, "does not apply to grid sampling");
  expect_changed_refused(
      ops, gs, [](Op& op) { op.attrs[0] = 4; }, "does not apply to grid sampling");
  expect_changed_refused(
      ops, gs, [](Op& op) { op.attrs[0] = 9; }, "unknown interpolate mode 9");
  expect_changed_refused(
      ops, gs, [](Op& op) { op.attrs[1] = 3; }, "unknown padding mode 3");
  expect_changed_refused(
      ops, gs, [](Op& op) { op.attrs[2] = 5; }, "differs");
  expect_changed_refused(
      ops, gs,
      [](Op& op) {
        op.tensors[1].shape = {2, 6, 7, 3};
      },
      "2 coordinates");
  expect_changed_refused(
      ops, gs,
      [](Op& op) {
        op.tensors[1].shape = {1, 6, 7, 2};
      },
      "has batch 1");
  expect_changed_refused(
      ops, gs,
      [](Op& op) {
        op.tensors[1].shape = {2, 6, 2};
      },
      "grid must have rank 4");
  expect_changed_refused(
      ops, gs,
      [](Op& op) {
        op.tensors[0].shape = {3, 4, 5};
      },
      "tensor must have rank 4");
  expect_changed_refused(
      ops, gs, [](Op& op) { op.tensors[1].dtype = kI64; }, "float dtype");
  expect_changed_refused(
      ops, gs, [](Op& op) { op.dtype = DType(DTypeKind::F64); }, "differs");  // the carried dtype
  expect_changed_refused(
      ops, uf, [](Op& op) { op.attrs[2] = 0; }, "stride must be at least 1");
  expect_changed_refused(
      ops, uf, [](Op& op) { op.attrs[0] = 9; }, "spans");
  expect_changed_refused(
      ops, uf, [](Op& op) { op.attrs[7] = -2; }, "attribute 7 missing or negative");
  expect_changed_refused(
      ops, uf,
      [](Op& op) {
        op.tensors[0].shape = {2, 3, 5, 4, 1};
      },
      "x must have rank 4");
  expect_changed_refused(
      ops, uf,
      [](Op& op) {
        op.outputs()[0].shape = {2, 18, 6};
      },
      "output 0");
}

// ---- Signals (Session calls): Rfft with its two outputs and IRfft; attributes [dim, n], n = 0
// for none given.

std::vector<ir::Operation> signal_ops() {
  namespace build = ir::build;
  const TensorId out(10), out2(11);
  return {
      built(build::rfft(in(1, {2, 8}), 1, std::nullopt, out, out2)),
      built(build::rfft(in(1, {5, 3}), 0, 12, out, out2)),
      built(build::irfft(in(1, {2, 5}), in(2, {2, 5}), 1, std::nullopt, out)),
      built(build::irfft(in(1, {4, 2}), in(2, {4, 2}), 0, 3, out)),
  };
}

TEST(OperationCheck, AcceptsTheSignalKinds) {
  expect_accepted_and_outputs_checked(signal_ops(), ShapeLie::LongerLastDim);
}

TEST(OperationCheck, RefusesHostileSignalOperations) {
  const std::vector<ir::Operation> ops = signal_ops();
  using Op = ir::Operation;
  const OpKind rf = OpKind::Module_Rfft, inv = OpKind::Module_IRfft;
  expect_changed_refused(
      ops, rf, [](Op& op) { op.attrs[0] = 2; }, "dim 2 out of bounds");
  expect_changed_refused(
      ops, rf, [](Op& op) { op.attrs[1] = -1; }, "attribute 1 missing or negative");
  expect_changed_refused(
      ops, rf, [](Op& op) { op.attrs[1] = 6; }, "output 0");  // 4 bins, not the claimed 5
  expect_changed_refused(
      ops, rf, [](Op& op) { op.attrs.pop_back(); }, "missing");
  expect_changed_refused(
      ops, rf, [](Op& op) { op.attrs.push_back(0); }, "differs");
  expect_changed_refused(
      ops, rf, [](Op& op) { op.tensors.pop_back(); }, "(1 outputs)");
  expect_changed_refused(
      ops, rf, [](Op& op) { op.tensors.push_back(op.tensors.back()), op.tensors.back().id = TensorId(12); },
      "(3 outputs)");
  expect_changed_refused(
      ops, rf, [](Op& op) { op.tensors[0].dtype = kI64; }, "float dtype");
  expect_changed_refused(
      ops, rf, [](Op& op) { op.kind = OpKind::Module_IRfft; }, "(2 outputs)");
  expect_changed_refused(
      ops, inv, [](Op& op) { op.tensors[1].dtype = DType(DTypeKind::F64); }, "dtypes differ");
  expect_changed_refused(
      ops, inv,
      [](Op& op) {
        op.tensors[1].shape = {2, 4};
      },
      "must have input_re");
  expect_changed_refused(
      ops, inv, [](Op& op) { op.tensors.erase(op.tensors.begin() + 1), op.num_inputs = 1; }, "unexpected number");
  expect_changed_refused(
      ops, inv,
      [](Op& op) {
        op.tensors[0].shape = op.tensors[1].shape = {2, 1};
      },
      "give n >= 1");
}

// ---- Attention and the CTC loss (Session calls): Attention's optional inputs and options told by
// its presence bits; CtcLoss and its backward with [blank].

std::vector<ir::Operation> sequence_ops() {
  namespace build = ir::build;
  const TensorId out(10);
  const TensorIr q = in(1, {2, 3, 4, 8}), k = in(2, {2, 3, 5, 8}), v = in(3, {2, 3, 5, 6});
  const TensorIr mask = typed(4, {2, 1, 4, 5}, kBool), bias = in(5, {1, 3, 1, 5});
  const TensorIr lp = in(1, {6, 2, 4}), tg = typed(2, {2, 3}, kI64), il = typed(3, {2}, kI64), tl = typed(4, {2}, kI64);
  return {
      built(build::attention(q, k, v, mask, bias, {0.25, 30.0, true}, out)),
      built(build::attention(q, k, v, std::nullopt, std::nullopt, {}, out)),
      built(build::attention(q, k, v, std::nullopt, bias, {-1.0, std::nullopt, false}, out)),
      built(build::attention(q, k, v, mask, std::nullopt, {std::nullopt, 2.0, true}, out)),
      built(build::ctc_loss(lp, tg, il, tl, 0, out)),
      built(build::ctc_loss_backward(lp, tg, il, tl, in(5, {2}), 3, out)),
  };
}

TEST(OperationCheck, AcceptsAttentionAndTheCtcKinds) {
  expect_accepted_and_outputs_checked(sequence_ops(), ShapeLie::LongerLastDim);
}

TEST(OperationCheck, RefusesHostileAttentionOperations) {
  const std::vector<ir::Operation> ops = sequence_ops();
  using Op = ir::Operation;
  const OpKind at = OpKind::Module_Attention;
  // Presence bits: unknown ones, negative, announcing an input that is not there or hiding one that
  // is, an option's bits without its bit (rebuilt as 0).
  expect_changed_refused(
      ops, at, [](Op& op) { op.attrs[0] |= 32; }, "unknown presence bits 47");
  expect_changed_refused(
      ops, at, [](Op& op) { op.attrs[0] = -1; }, "unknown presence bits -1");
  expect_changed_refused(
      ops, at, [](Op& op) { op.attrs[0] &= ~ir::kPresentBias; }, "unexpected number");
  expect_changed_refused(
      ops, at, [](Op& op) { op.attrs[0] &= ~ir::kPresentScale; }, "differs");
  ir::Operation plain = ops[1];  // no optional input: a mask bit announces a fourth
  plain.attrs[0] = ir::kPresentMask;
  expect_refused(plain, "unexpected number");
  // Options: a NaN scale, a zero or negative softcap, a flag other than 0 / 1.
  expect_changed_refused(
      ops, at, [](Op& op) { op.attrs[2] = bits_of(std::nan("")); }, "scale must be finite");
  expect_changed_refused(
      ops, at, [](Op& op) { op.attrs[3] = bits_of(0.0); }, "softcap must be finite and positive");
  expect_changed_refused(
      ops, at, [](Op& op) { op.attrs[3] = bits_of(-2.0); }, "softcap must be finite and positive");
  expect_changed_refused(
      ops, at, [](Op& op) { op.attrs[1] = 2; }, "differs");
  expect_changed_refused(
      ops, at, [](Op& op) { op.attrs.pop_back(); }, "unexpected number");
  // Operands: the mask and the bias swapped, a float mask, a bias of another dtype, shapes.
  expect_changed_refused(
      ops, at, [](Op& op) { std::swap(op.tensors[3], op.tensors[4]); }, "mask must be a bool dtype");
  expect_changed_refused(
      ops, at, [](Op& op) { op.tensors[4].dtype = DType(DTypeKind::F64); }, "attn_bias");
  expect_changed_refused(
      ops, at,
      [](Op& op) {
        op.tensors[3].shape = {2, 2, 4, 5};
      },
      "does not broadcast");
  expect_changed_refused(
      ops, at,
      [](Op& op) {
        op.tensors[1].shape = {2, 3, 5, 7};
      },
      "key");
  expect_changed_refused(
      ops, at, [](Op& op) { op.tensors[0].dtype = kI64; }, "float dtype");
}

TEST(OperationCheck, RefusesHostileCtcOperations) {
  const std::vector<ir::Operation> ops = sequence_ops();
  using Op = ir::Operation;
  const OpKind loss = OpKind::Module_CtcLoss, back = OpKind::Module_CtcLossBackward;
  expect_changed_refused(
      ops, loss, [](Op& op) { op.attrs[0] = 4; }, "blank 4 out of range");
  expect_changed_refused(
      ops, loss, [](Op& op) { op.attrs[0] = -1; }, "attribute 0 missing or negative");
  expect_changed_refused(
      ops, loss, [](Op& op) { op.attrs.clear(); }, "missing");
  expect_changed_refused(
      ops, loss, [](Op& op) { op.tensors[1].dtype = kF32; }, "targets must be an integer dtype");
  expect_changed_refused(
      ops, loss, [](Op& op) { op.tensors[2].shape = {3}; }, "input_lengths");
  expect_changed_refused(
      ops, loss,
      [](Op& op) {
        op.tensors[0].shape = {6, 8};
      },
      "log_probs must have rank 3");
  expect_changed_refused(
      ops, loss, [](Op& op) { op.kind = OpKind::Module_CtcLossBackward; }, "unexpected number");
  expect_changed_refused(
      ops, back, [](Op& op) { op.tensors[4].shape = {3}; }, "grad_loss");
  expect_changed_refused(
      ops, back, [](Op& op) { op.tensors[4].dtype = kI64; }, "grad_loss");
  expect_changed_refused(
      ops, back, [](Op& op) { op.tensors.erase(op.tensors.begin() + 4), op.num_inputs = 4; }, "unexpected number");
}

// ---- The deformable convolution (Session calls): presence bits for mask? and bias?, the
// backward's three to five outputs.

std::vector<ir::Operation> deformable_ops() {
  namespace build = ir::build;
  const TensorId out(10);
  build::DeformableConv2dOptions o;  // x [1, 4, 5, 5], weight [6, 2, 3, 3]: output [1, 6, 3, 3]
  o.weight_groups = o.offset_groups = 2;
  const TensorIr x = in(1, {1, 4, 5, 5}), offset = in(2, {1, 36, 3, 3}), weight = in(3, {6, 2, 3, 3});
  const TensorIr mask = in(4, {1, 18, 3, 3}), bias = in(5, {6}), grad = in(6, {1, 6, 3, 3});
  const build::DeformableConv2dGradIds all{out, TensorId(11), TensorId(12), TensorId(13), TensorId(14)};
  return {
      built(build::deformable_conv2d(x, offset, weight, mask, bias, o, out)),
      built(build::deformable_conv2d(x, offset, weight, std::nullopt, std::nullopt, o, out)),
      built(build::deformable_conv2d(x, offset, weight, std::nullopt, bias, o, out)),
      built(build::deformable_conv2d_backward(x, offset, weight, mask, bias, grad, o, all)),
      built(build::deformable_conv2d_backward(x, offset, weight, std::nullopt, std::nullopt, grad, o,
                                              {out, TensorId(11), TensorId(12), std::nullopt, std::nullopt})),
      built(build::deformable_conv2d_backward(x, offset, weight, std::nullopt, bias, grad, o,
                                              {out, TensorId(11), TensorId(12), std::nullopt, TensorId(14)})),
  };
}

TEST(OperationCheck, AcceptsTheDeformableConvolutionKinds) {
  expect_accepted_and_outputs_checked(deformable_ops(), ShapeLie::LongerLastDim);
}

TEST(OperationCheck, RefusesHostileDeformableConvolutions) {
  const std::vector<ir::Operation> ops = deformable_ops();
  using Op = ir::Operation;
  const OpKind fwd = OpKind::Module_DeformableConv2d, back = OpKind::Module_DeformableConv2dBackward;
  expect_changed_refused(
      ops, fwd, [](Op& op) { op.attrs[0] = 4; }, "unknown presence bits 4");
  expect_changed_refused(
      ops, fwd, [](Op& op) { op.attrs[0] = -1; }, "attribute 0 missing or negative");
  expect_changed_refused(
      ops, fwd, [](Op& op) { op.attrs[0] = ir::kPresentMask; }, "unexpected number");  // 5 inputs, 1 announced
  expect_changed_refused(
      ops, fwd, [](Op& op) { std::swap(op.tensors[3], op.tensors[4]); }, "mask");
  expect_changed_refused(
      ops, fwd, [](Op& op) { op.attrs[1] = 0; }, "stride");
  expect_changed_refused(
      ops, fwd, [](Op& op) { op.attrs[8] = 3; }, "not divisible by 3 offset groups");
  expect_changed_refused(
      ops, fwd, [](Op& op) { op.attrs[7] = 4; }, "does not fit 4 weight groups");
  expect_changed_refused(
      ops, fwd, [](Op& op) { op.attrs.pop_back(); }, "missing");
  expect_changed_refused(
      ops, fwd,
      [](Op& op) {
        op.tensors[1].shape = {1, 35, 3, 3};
      },
      "offset");
  expect_changed_refused(
      ops, fwd, [](Op& op) { op.tensors[1].dtype = DType(DTypeKind::F64); }, "dtypes differ");
  // The backward: outputs the bits do not announce, a relabelled forward, a bad out_grad.
  expect_changed_refused(
      ops, back, [](Op& op) { op.tensors.pop_back(); }, "unexpected number");  // no bias_grad
  expect_changed_refused(
      ops, back, [](Op& op) { op.attrs[0] = ir::kPresentMask; }, "unexpected number");
  expect_changed_refused(
      ops, back,
      [](Op& op) {
        op.tensors[5].shape = {1, 6, 3, 2};
      },
      "out_grad");
  expect_changed_refused(
      ops, back, [](Op& op) { op.tensors[5].dtype = kI64; }, "out_grad");
  expect_changed_refused(
      ops, back, [](Op& op) { op.kind = OpKind::Module_DeformableConv2d; }, "(5 outputs)");
  expect_changed_refused(
      ops, fwd, [](Op& op) { op.kind = OpKind::Module_DeformableConv2dBackward; }, "(1 outputs)");
}

// ---- Quantization (Session calls): Quantize, the scheme its output's QFloat dtype, and Dequantize.

ir::QuantScheme block_scheme() { return ::kiln::testing::packed_q4_blocks(); }

std::vector<ir::Operation> quantization_ops() {
  namespace build = ir::build;
  const TensorId out(10);
  const DType q = DType::qfloat(block_scheme());
  return {
      built(build::quantize(in(1, {2, 8}), in(2, {2, 2}), std::nullopt, block_scheme(), out)),
      built(build::quantize(in(1, {2, 8}), in(2, {1}), in(3, {1}), ir::QuantScheme{}, out)),
      built(build::dequantize(typed(1, {2, 8}, q), kF32, out)),
  };
}

TEST(OperationCheck, AcceptsQuantizeAndDequantize) {
  // Output dtypes: a QFloat scheme is refused by RefusesHostileQuantization below.
  expect_accepted_and_outputs_checked(quantization_ops(), ShapeLie::LongerLastDim, /*check_dtype=*/false);
}

TEST(OperationCheck, RefusesHostileQuantization) {
  const std::vector<ir::Operation> ops = quantization_ops();
  using Op = ir::Operation;
  const OpKind quant = OpKind::Float_Quantize, de = OpKind::Float_Dequantize;
  // The scheme is the output dtype: another one must fit the scales, a non-QFloat output is no scheme.
  expect_changed_refused(
      ops, quant, [](Op& op) { op.outputs()[0].dtype = DType::qfloat(ir::QuantScheme{}); }, "scales");
  expect_changed_refused(
      ops, quant, [](Op& op) { op.outputs()[0].dtype = kF32; }, "must have a QFloat dtype");
  expect_changed_refused(
      ops, quant,
      [](Op& op) {
        ir::QuantScheme s = block_scheme();
        s.block = {1, 3, 0, 0};
        op.outputs()[0].dtype = DType::qfloat(s);
      },
      "not divisible by the block's 3");
  expect_changed_refused(
      ops, quant,
      [](Op& op) {
        ir::QuantScheme s = block_scheme();
        s.value = static_cast<ir::QuantValue>(11);
        op.outputs()[0].dtype = DType::qfloat(s);
      },
      "unknown value type 11");
  expect_changed_refused(
      ops, quant,
      [](Op& op) {
        op.tensors[1].shape = {2, 3};
      },
      "scales");
  expect_changed_refused(
      ops, quant, [](Op& op) { op.tensors[0].dtype = kI64; }, "float dtype");
  expect_changed_refused(
      ops, quant, [](Op& op) { op.dtype = DType(DTypeKind::F64); }, "differs");  // the carried dtype
  expect_changed_refused(
      ops, quant, [](Op& op) { op.tensors.erase(op.tensors.begin() + 1), op.num_inputs = 1; }, "unexpected number");
  // Dequantize: a float input, a non-float target, the carried dtype.
  expect_changed_refused(
      ops, de, [](Op& op) { op.tensors[0].dtype = kF32, op.dtype = kF32; }, "must be quantized");
  expect_changed_refused(
      ops, de, [](Op& op) { op.outputs()[0].dtype = kI64; }, "float dtype");
  expect_changed_refused(
      ops, de, [](Op& op) { op.dtype = kF32; }, "differs");
  expect_changed_refused(
      ops, de, [](Op& op) { op.kind = OpKind::Float_IntoInt; }, "integer dtype");  // IntoInt's target
}

}  // namespace
}  // namespace kiln::ipc
