// Reference executor: reductions, arg reductions, max/min with indices, top-k, cumulative scans.
#include "kiln/testing/status.h"
#include "reference_test_util.h"

namespace kiln::reference::testing {
namespace {

using F = Family;
using K = OpKind;

TEST(ReferenceReduceTest, WholeTensorReductionsOfFloats) {
  Device d;
  const TensorIr x = d.f64({2, 3}, dtypes::f32, {1, -2, 3, -4, 5, 6});
  auto run = [&](K k) {
    const TensorId out = d.ok(b::reduce(F::NumericFloat, k, x, d.fresh()));
    EXPECT_EQ(d.shape_of(out), (Shape{1}));
    return d.f64_of(out);
  };
  EXPECT_EQ(run(K::Numeric_Sum), (std::vector<double>{9}));
  EXPECT_EQ(run(K::Numeric_Mean), (std::vector<double>{1.5}));
  EXPECT_EQ(run(K::Numeric_Prod), (std::vector<double>{720}));
  EXPECT_EQ(run(K::Numeric_Max), (std::vector<double>{6}));
  EXPECT_EQ(run(K::Numeric_Min), (std::vector<double>{-4}));
  EXPECT_EQ(run(K::Numeric_MaxAbs), (std::vector<double>{6}));
}

TEST(ReferenceReduceTest, FloatSumsAccumulateInF64) {
  Device d;
  // 2^24 + 1 + 1 + ... in f32 would stall at 2^24; f64 accumulation reaches 2^24 + 4 exactly.
  const TensorIr x = d.f64({5}, dtypes::f32, {16777216, 1, 1, 1, 1});
  EXPECT_EQ(d.f64_of(d.ok(b::reduce(F::NumericFloat, K::Numeric_Sum, x, d.fresh()))), (std::vector<double>{16777220}));
  // f16 storage: the mean of [60000, 60000] is 60000 although the sum overflows f16.
  const TensorIr h = d.f64({2}, dtypes::f16, {60000, 60000});
  EXPECT_EQ(d.f64_of(d.ok(b::reduce(F::NumericFloat, K::Numeric_Mean, h, d.fresh()))), (std::vector<double>{60000}));
  EXPECT_EQ(d.f64_of(d.ok(b::reduce(F::NumericFloat, K::Numeric_Sum, h, d.fresh()))), (std::vector<double>{kInf}));
}

TEST(ReferenceReduceTest, NanPropagatesThroughMaxMinAndSums) {
  Device d;
  const TensorIr x = d.f64({4}, dtypes::f64, {1, kNaN, 3, -kInf});
  auto run = [&](K k) { return d.f64_of(d.ok(b::reduce(F::NumericFloat, k, x, d.fresh()))); };
  EXPECT_THAT(run(K::Numeric_Max), NanEq(std::vector<double>{kNaN}));
  EXPECT_THAT(run(K::Numeric_Min), NanEq(std::vector<double>{kNaN}));
  EXPECT_THAT(run(K::Numeric_MaxAbs), NanEq(std::vector<double>{kNaN}));
  EXPECT_THAT(run(K::Numeric_Sum), NanEq(std::vector<double>{kNaN}));
  const TensorIr y = d.f64({3}, dtypes::f64, {1, -kInf, 3});
  EXPECT_EQ(d.f64_of(d.ok(b::reduce(F::NumericFloat, K::Numeric_Min, y, d.fresh()))), (std::vector<double>{-kInf}));
  EXPECT_EQ(d.f64_of(d.ok(b::reduce(F::NumericFloat, K::Numeric_MaxAbs, y, d.fresh()))), (std::vector<double>{kInf}));
}

TEST(ReferenceReduceTest, IntegerReductionsWrapAndMeanTruncates) {
  Device d;
  const TensorIr x = d.i64({4}, dtypes::i8, {100, 100, -1, -2});
  auto run = [&](K k) { return d.i64_of(d.ok(b::reduce(F::NumericInt, k, x, d.fresh()))); };
  EXPECT_EQ(run(K::Numeric_Sum), (std::vector<std::int64_t>{-59}));  // 197 wraps in i8
  EXPECT_EQ(run(K::Numeric_Mean), (std::vector<std::int64_t>{49}));  // 197 / 4 in i64
  EXPECT_EQ(run(K::Numeric_Prod), (std::vector<std::int64_t>{32}));  // 20000 mod 256
  EXPECT_EQ(run(K::Numeric_Max), (std::vector<std::int64_t>{100}));
  EXPECT_EQ(run(K::Numeric_Min), (std::vector<std::int64_t>{-2}));
  EXPECT_EQ(run(K::Numeric_MaxAbs), (std::vector<std::int64_t>{100}));
  const TensorIr n = d.i64({2}, dtypes::i32, {-7, 0});
  EXPECT_EQ(d.i64_of(d.ok(b::reduce(F::NumericInt, K::Numeric_Mean, n, d.fresh()))), (std::vector<std::int64_t>{-3}));
  const TensorIr u = d.u64({3}, dtypes::u64, {~std::uint64_t{0}, 2, 5});
  EXPECT_EQ(d.u64_of(d.ok(b::reduce(F::NumericInt, K::Numeric_Sum, u, d.fresh()))), (std::vector<std::uint64_t>{6}));
  EXPECT_EQ(d.u64_of(d.ok(b::reduce(F::NumericInt, K::Numeric_MaxAbs, u, d.fresh()))),
            (std::vector<std::uint64_t>{~std::uint64_t{0}}));
  const TensorIr m = d.i64({2}, dtypes::i8, {-128, 5});
  EXPECT_EQ(d.i64_of(d.ok(b::reduce(F::NumericInt, K::Numeric_MaxAbs, m, d.fresh()))),
            (std::vector<std::int64_t>{-128}));  // |-128| wraps like abs
}

TEST(ReferenceReduceTest, EmptyInputs) {
  Device d;
  const TensorIr x = d.f64({0}, dtypes::f32, {});
  EXPECT_EQ(d.f64_of(d.ok(b::reduce(F::NumericFloat, K::Numeric_Sum, x, d.fresh()))), (std::vector<double>{0}));
  EXPECT_EQ(d.f64_of(d.ok(b::reduce(F::NumericFloat, K::Numeric_Prod, x, d.fresh()))), (std::vector<double>{1}));
  EXPECT_THAT(d.f64_of(d.ok(b::reduce(F::NumericFloat, K::Numeric_Mean, x, d.fresh()))),
              NanEq(std::vector<double>{kNaN}));
  EXPECT_EQ(d.bool_of(d.ok(b::reduce_bool(F::BaseFloat, K::Base_All, x, dtypes::boolean, d.fresh()))),
            (std::vector<bool>{true}));
  EXPECT_EQ(d.bool_of(d.ok(b::reduce_bool(F::BaseFloat, K::Base_Any, x, dtypes::boolean, d.fresh()))),
            (std::vector<bool>{false}));
  auto max = b::reduce(F::NumericFloat, K::Numeric_Max, x, d.fresh());
  Status st = d.run(max);
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(d.handles.entry(max->outputs()[0].id)->is_errored());
  const TensorIr xi = d.i64({0}, dtypes::i32, {});
  EXPECT_FALSE(d.run(b::reduce(F::NumericInt, K::Numeric_Mean, xi, d.fresh())).ok());
  // A dim reduction of [0, 3] along 1 has no output element: nothing to fail.
  const TensorIr e = d.f64({0, 3}, dtypes::f32, {});
  EXPECT_EQ(d.shape_of(d.ok(b::reduce_dim(F::NumericFloat, K::Numeric_MaxDim, e, 1, 1, d.fresh()))), (Shape{0, 1}));
}

TEST(ReferenceReduceTest, AllAnyOnEveryKind) {
  Device d;
  const TensorIr f = d.f64({3}, dtypes::f32, {1, kNaN, -0.0});
  EXPECT_EQ(d.bool_of(d.ok(b::reduce_bool(F::BaseFloat, K::Base_All, f, dtypes::boolean, d.fresh()))),
            (std::vector<bool>{false}));
  EXPECT_EQ(d.bool_of(d.ok(b::reduce_bool(F::BaseFloat, K::Base_Any, f, dtypes::boolean, d.fresh()))),
            (std::vector<bool>{true}));
  const TensorIr i = d.i64({2, 2}, dtypes::i64, {1, 0, 2, 3});
  EXPECT_EQ(d.bool_of(d.ok(b::reduce_dim_bool(F::BaseInt, K::Base_AllDim, i, 1, 1, dtypes::boolean, d.fresh()))),
            (std::vector<bool>{false, true}));
  EXPECT_EQ(d.bool_of(d.ok(b::reduce_dim_bool(F::BaseInt, K::Base_AnyDim, i, 0, 1, dtypes::boolean, d.fresh()))),
            (std::vector<bool>{true, true}));
  const TensorIr bl = d.boolean({2, 2}, {false, false, true, false}, DType::boolean(BoolStore::U32));
  EXPECT_EQ(d.bool_of(d.ok(b::reduce_dim_bool(F::BaseBool, K::Base_AnyDim, bl, 1, 1, dtypes::boolean, d.fresh()))),
            (std::vector<bool>{false, true}));
  EXPECT_EQ(d.bool_of(d.ok(b::reduce_bool(F::BaseBool, K::Base_All, bl, dtypes::boolean, d.fresh()))),
            (std::vector<bool>{false}));
}

TEST(ReferenceReduceTest, DimReductionsKeepTheAxis) {
  Device d;
  // [2, 3, 2]
  const TensorIr x = d.f64({2, 3, 2}, dtypes::f64, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12});
  const TensorId s1 = d.ok(b::reduce_dim(F::NumericFloat, K::Numeric_SumDim, x, 1, 1, d.fresh()));
  EXPECT_EQ(d.shape_of(s1), (Shape{2, 1, 2}));
  EXPECT_EQ(d.f64_of(s1), (std::vector<double>{9, 12, 27, 30}));
  EXPECT_EQ(d.f64_of(d.ok(b::reduce_dim(F::NumericFloat, K::Numeric_MeanDim, x, 0, 1, d.fresh()))),
            (std::vector<double>{4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(d.f64_of(d.ok(b::reduce_dim(F::NumericFloat, K::Numeric_ProdDim, x, 2, 1, d.fresh()))),
            (std::vector<double>{2, 12, 30, 56, 90, 132}));
  EXPECT_EQ(d.f64_of(d.ok(b::reduce_dim(F::NumericFloat, K::Numeric_MaxDim, x, 1, 1, d.fresh()))),
            (std::vector<double>{5, 6, 11, 12}));
  EXPECT_EQ(d.f64_of(d.ok(b::reduce_dim(F::NumericFloat, K::Numeric_MinDim, x, 1, 1, d.fresh()))),
            (std::vector<double>{1, 2, 7, 8}));
  const TensorIr y = d.i64({2, 2}, dtypes::i16, {-5, 3, 2, -1});
  EXPECT_EQ(d.i64_of(d.ok(b::reduce_dim(F::NumericInt, K::Numeric_MaxAbsDim, y, 1, 1, d.fresh()))),
            (std::vector<std::int64_t>{5, 2}));
  EXPECT_EQ(d.i64_of(d.ok(b::reduce_dim(F::NumericInt, K::Numeric_SumDim, y, 0, 1, d.fresh()))),
            (std::vector<std::int64_t>{-3, 2}));
}

TEST(ReferenceReduceTest, ArgMaxArgMinTakeTheFirstOccurrenceAndTheFirstNan) {
  Device d;
  const TensorIr x = d.f64({2, 4}, dtypes::f32, {3, 7, 7, 1, 2, kNaN, 9, kNaN});
  const TensorId am = d.ok(b::reduce_dim_arg(F::NumericFloat, K::Numeric_ArgMax, x, 1, 1, dtypes::i64, d.fresh()));
  EXPECT_EQ(d.shape_of(am), (Shape{2, 1}));
  EXPECT_EQ(d.i64_of(am), (std::vector<std::int64_t>{1, 1}));
  EXPECT_EQ(d.i64_of(d.ok(b::reduce_dim_arg(F::NumericFloat, K::Numeric_ArgMin, x, 1, 1, dtypes::i32, d.fresh()))),
            (std::vector<std::int64_t>{3, 1}));
  const TensorIr xi = d.u64({2, 3}, dtypes::u8, {5, 5, 1, 0, 9, 9});
  EXPECT_EQ(d.u64_of(d.ok(b::reduce_dim_arg(F::NumericInt, K::Numeric_ArgMax, xi, 0, 1, dtypes::u8, d.fresh()))),
            (std::vector<std::uint64_t>{0, 1, 1}));
  EXPECT_EQ(d.u64_of(d.ok(b::reduce_dim_arg(F::NumericInt, K::Numeric_ArgMin, xi, 1, 1, dtypes::u8, d.fresh()))),
            (std::vector<std::uint64_t>{2, 0}));
}

TEST(ReferenceReduceTest, ArgIndexMustFitItsDtype) {
  Device d;
  std::vector<double> v(200, 1.0);
  const TensorIr x = d.f64({200}, dtypes::f32, v);
  EXPECT_FALSE(d.run(b::reduce_dim_arg(F::NumericFloat, K::Numeric_ArgMax, x, 0, 1, dtypes::i8, d.fresh())).ok());
  EXPECT_TRUE(d.run(b::reduce_dim_arg(F::NumericFloat, K::Numeric_ArgMax, x, 0, 1, dtypes::u8, d.fresh())).ok());
}

TEST(ReferenceReduceTest, MaxMinDimWithIndices) {
  Device d;
  const TensorIr x = d.f64({2, 3}, dtypes::bf16, {1, 4, 4, kNaN, 0, kNaN});
  auto op = b::reduce_dim_with_indices(F::NumericFloat, K::Numeric_MaxDimWithIndices, x, 1, dtypes::i64, d.fresh(),
                                       d.fresh());
  d.ok(op);
  const TensorId v = op->outputs()[0].id;
  const TensorId i = op->outputs()[1].id;
  EXPECT_EQ(d.shape_of(v), (Shape{2, 1}));
  EXPECT_EQ(d.shape_of(i), (Shape{2, 1}));
  EXPECT_THAT(d.f64_of(v), NanEq(std::vector<double>{4, kNaN}));
  EXPECT_EQ(d.i64_of(i), (std::vector<std::int64_t>{1, 0}));
  auto op2 = b::reduce_dim_with_indices(F::NumericFloat, K::Numeric_MinDimWithIndices, x, 0, dtypes::i32, d.fresh(),
                                        d.fresh());
  d.ok(op2);
  EXPECT_THAT(d.f64_of(op2->outputs()[0].id), NanEq(std::vector<double>{kNaN, 0, kNaN}));
  EXPECT_EQ(d.i64_of(op2->outputs()[1].id), (std::vector<std::int64_t>{1, 1, 1}));
  const TensorIr xi = d.i64({3}, dtypes::i32, {-1, -9, -9});
  auto op3 =
      b::reduce_dim_with_indices(F::NumericInt, K::Numeric_MinDimWithIndices, xi, 0, dtypes::i64, d.fresh(), d.fresh());
  d.ok(op3);
  EXPECT_EQ(d.i64_of(op3->outputs()[0].id), (std::vector<std::int64_t>{-9}));
  EXPECT_EQ(d.i64_of(op3->outputs()[1].id), (std::vector<std::int64_t>{1}));
}

TEST(ReferenceReduceTest, TopKSortsDescendingStablyWithNanFirst) {
  Device d;
  const TensorIr x = d.f64({2, 4}, dtypes::f32, {1, 5, 3, 5, 2, kNaN, 8, -1});
  auto op =
      b::topk_with_indices(F::NumericFloat, K::Numeric_TopKWithIndices, x, 1, 3, dtypes::i64, d.fresh(), d.fresh());
  d.ok(op);
  EXPECT_EQ(d.shape_of(op->outputs()[0].id), (Shape{2, 3}));
  EXPECT_THAT(d.f64_of(op->outputs()[0].id), NanEq(std::vector<double>{5, 5, 3, kNaN, 8, 2}));
  EXPECT_EQ(d.i64_of(op->outputs()[1].id), (std::vector<std::int64_t>{1, 3, 2, 1, 2, 0}));
  const TensorIr xi = d.i64({3, 2}, dtypes::i64, {4, 0, 9, 1, 4, 2});
  auto op2 =
      b::topk_with_indices(F::NumericInt, K::Numeric_TopKWithIndices, xi, 0, 2, dtypes::i32, d.fresh(), d.fresh());
  d.ok(op2);
  EXPECT_EQ(d.i64_of(op2->outputs()[0].id), (std::vector<std::int64_t>{9, 2, 4, 1}));
  EXPECT_EQ(d.i64_of(op2->outputs()[1].id), (std::vector<std::int64_t>{1, 2, 0, 1}));
  auto op3 =
      b::topk_with_indices(F::NumericInt, K::Numeric_TopKWithIndices, xi, 0, 0, dtypes::i32, d.fresh(), d.fresh());
  d.ok(op3);
  EXPECT_EQ(d.shape_of(op3->outputs()[0].id), (Shape{0, 2}));
}

// TopK / ArgTopK (ReduceDim, accumulator_len = k): the k largest in descending order and their
// indices, ties in index order, NaN first (as TopKWithIndices).
TEST(ReferenceReduceTest, TopKAndArgTopKAreTheLeadingKOfTheDescendingSort) {
  Device d;
  const TensorIr x = d.f64({2, 4}, dtypes::f32, {1, 5, 3, 5, 2, kNaN, 8, -1});
  const TensorId v = d.ok(b::reduce_dim(F::NumericFloat, K::Numeric_TopK, x, 1, 3, d.fresh()));
  EXPECT_EQ(d.shape_of(v), (Shape{2, 3}));
  EXPECT_THAT(d.f64_of(v), NanEq(std::vector<double>{5, 5, 3, kNaN, 8, 2}));
  const TensorId i = d.ok(b::reduce_dim_arg(F::NumericFloat, K::Numeric_ArgTopK, x, 1, 3, dtypes::u8, d.fresh()));
  EXPECT_EQ(d.tensor(i).dtype(), dtypes::u8);
  EXPECT_EQ(d.u64_of(i), (std::vector<std::uint64_t>{1, 3, 2, 1, 2, 0}));
  // Along axis 0 of an integer tensor; k = the whole axis is the full descending sort.
  const TensorIr xi = d.i64({3, 2}, dtypes::i16, {4, 0, 9, 1, 4, 2});
  EXPECT_EQ(d.i64_of(d.ok(b::reduce_dim(F::NumericInt, K::Numeric_TopK, xi, 0, 3, d.fresh()))),
            (std::vector<std::int64_t>{9, 2, 4, 1, 4, 0}));
  EXPECT_EQ(d.i64_of(d.ok(b::reduce_dim_arg(F::NumericInt, K::Numeric_ArgTopK, xi, 0, 1, dtypes::i64, d.fresh()))),
            (std::vector<std::int64_t>{1, 2}));
}

// Sort / ArgSort / SortWithIndices: a stable sort (equal values, ±0 included, keep their index
// order) with NaN larger than every number: last ascending, first descending (PyTorch's order).
TEST(ReferenceReduceTest, SortIsStableWithNanAsTheLargestValue) {
  Device d;
  const TensorIr x = d.f64({7}, dtypes::f64, {3, kNaN, -1, 3, kInf, -0.0, 0.0});
  auto sort = [&](K k, bool descending) {
    return k == K::Numeric_ArgSort ? b::sort_arg(F::NumericFloat, k, x, 0, descending, dtypes::i64, d.fresh())
                                   : b::sort(F::NumericFloat, k, x, 0, descending, d.fresh());
  };
  const std::vector<double> up = d.f64_of(d.ok(sort(K::Numeric_Sort, false)));
  EXPECT_THAT(up, NanEq(std::vector<double>{-1, -0.0, 0, 3, 3, kInf, kNaN}));
  EXPECT_TRUE(std::signbit(up[1])) << "-0 (index 5) stays before +0 (index 6)";
  EXPECT_FALSE(std::signbit(up[2]));
  EXPECT_EQ(d.i64_of(d.ok(sort(K::Numeric_ArgSort, false))), (std::vector<std::int64_t>{2, 5, 6, 0, 3, 4, 1}));
  const std::vector<double> down = d.f64_of(d.ok(sort(K::Numeric_Sort, true)));
  EXPECT_THAT(down, NanEq(std::vector<double>{kNaN, kInf, 3, 3, -0.0, 0, -1}));
  EXPECT_TRUE(std::signbit(down[4])) << "ties keep index order when descending too";
  EXPECT_EQ(d.i64_of(d.ok(sort(K::Numeric_ArgSort, true))), (std::vector<std::int64_t>{1, 4, 0, 3, 5, 6, 2}));
  // SortWithIndices along axis 1 of a [2, 3] integer tensor, both outputs.
  const TensorIr xi = d.i64({2, 3}, dtypes::i32, {5, -2, 5, 0, 7, -7});
  auto both =
      b::sort_with_indices(F::NumericInt, K::Numeric_SortWithIndices, xi, 1, true, dtypes::i32, d.fresh(), d.fresh());
  d.ok(both);
  EXPECT_EQ(d.i64_of(both->outputs()[0].id), (std::vector<std::int64_t>{5, 5, -2, 7, 0, -7}));
  EXPECT_EQ(d.i64_of(both->outputs()[1].id), (std::vector<std::int64_t>{0, 2, 1, 1, 0, 2}));
  // Along axis 0 (columns), ascending, unsigned.
  const TensorIr xu = d.u64({3, 2}, dtypes::u8, {200, 1, 7, 1, 9, 0});
  EXPECT_EQ(d.u64_of(d.ok(b::sort(F::NumericInt, K::Numeric_Sort, xu, 0, false, d.fresh()))),
            (std::vector<std::uint64_t>{7, 0, 9, 1, 200, 1}));
  EXPECT_EQ(d.i64_of(d.ok(b::sort_arg(F::NumericInt, K::Numeric_ArgSort, xu, 0, false, dtypes::i64, d.fresh()))),
            (std::vector<std::int64_t>{1, 2, 2, 0, 0, 1}));
  // An empty axis sorts to an empty tensor.
  const TensorIr e = d.f64({2, 0}, dtypes::f32, {});
  EXPECT_EQ(d.shape_of(d.ok(b::sort(F::NumericFloat, K::Numeric_Sort, e, 1, true, d.fresh()))), (Shape{2, 0}));
}

// Hostile attributes of hand-made ops: errors that claim every output, never a crash.
TEST(ReferenceReduceTest, SortAndTopKRefuseBadAttributes) {
  Device d;
  const TensorIr x = d.f64({2, 3}, dtypes::f32, {1, 2, 3, 4, 5, 6});
  auto sw =
      b::sort_with_indices(F::NumericFloat, K::Numeric_SortWithIndices, x, 1, false, dtypes::i64, d.fresh(), d.fresh());
  KILN_ASSERT_OK(sw);
  Operation bad = *sw;
  bad.attrs[0] = 2;  // dim out of range
  EXPECT_EQ(d.exec.execute(bad, d.handles).error().code, ErrorCode::OutOfBounds);
  EXPECT_TRUE(d.handles.entry(bad.outputs()[0].id)->is_errored());
  EXPECT_TRUE(d.handles.entry(bad.outputs()[1].id)->is_errored());
  bad = *sw;
  bad.attrs[1] = 2;  // descending is a flag
  Status st = d.exec.execute(bad, d.handles);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("descending must be 0 or 1, got 2"), std::string::npos) << st.error().message;
  bad = *sw;
  bad.tensors[2].dtype = dtypes::f32;  // indices must be an integer dtype
  EXPECT_FALSE(d.exec.execute(bad, d.handles).ok());
  auto as = b::sort_arg(F::NumericFloat, K::Numeric_ArgSort, x, 1, true, dtypes::i64, d.fresh());
  KILN_ASSERT_OK(as);
  bad = *as;
  bad.tensors[1].shape = {2, 2};  // not the input's shape
  EXPECT_EQ(d.exec.execute(bad, d.handles).error().code, ErrorCode::IncompatibleShapes);
  auto tk = b::reduce_dim(F::NumericFloat, K::Numeric_TopK, x, 1, 2, d.fresh());
  KILN_ASSERT_OK(tk);
  bad = *tk;
  bad.attrs[1] = 4;  // k > the axis size
  bad.tensors[1].shape = {2, 4};
  st = d.exec.execute(bad, d.handles);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("k 4 exceeds axis 1 of size 3"), std::string::npos) << st.error().message;
  bad = *tk;
  bad.attrs[1] = -1;
  EXPECT_FALSE(d.exec.execute(bad, d.handles).ok());
  auto atk = b::reduce_dim_arg(F::NumericFloat, K::Numeric_ArgTopK, x, 1, 3, dtypes::u8, d.fresh());
  KILN_ASSERT_OK(atk);
  bad = *atk;
  bad.tensors[1].dtype = dtypes::f16;  // ArgTopK writes indices
  EXPECT_FALSE(d.exec.execute(bad, d.handles).ok());
}

TEST(ReferenceReduceTest, CumulativeScans) {
  Device d;
  const TensorIr x = d.f64({2, 3}, dtypes::f64, {1, 2, 3, 4, 5, 6});
  EXPECT_EQ(d.f64_of(d.ok(b::dim(F::NumericFloat, K::Numeric_CumSum, x, 1, d.fresh()))),
            (std::vector<double>{1, 3, 6, 4, 9, 15}));
  EXPECT_EQ(d.f64_of(d.ok(b::dim(F::NumericFloat, K::Numeric_CumSum, x, 0, d.fresh()))),
            (std::vector<double>{1, 2, 3, 5, 7, 9}));
  EXPECT_EQ(d.f64_of(d.ok(b::dim(F::NumericFloat, K::Numeric_CumProd, x, 1, d.fresh()))),
            (std::vector<double>{1, 2, 6, 4, 20, 120}));
  const TensorIr y = d.f64({5}, dtypes::f32, {3, 1, kNaN, 5, 0});
  EXPECT_THAT(d.f64_of(d.ok(b::dim(F::NumericFloat, K::Numeric_CumMax, y, 0, d.fresh()))),
              NanEq(std::vector<double>{3, 3, kNaN, kNaN, kNaN}));
  EXPECT_THAT(d.f64_of(d.ok(b::dim(F::NumericFloat, K::Numeric_CumMin, y, 0, d.fresh()))),
              NanEq(std::vector<double>{3, 1, kNaN, kNaN, kNaN}));
  const TensorIr z = d.i64({4}, dtypes::i8, {100, 100, -3, 2});
  EXPECT_EQ(d.i64_of(d.ok(b::dim(F::NumericInt, K::Numeric_CumSum, z, 0, d.fresh()))),
            (std::vector<std::int64_t>{100, -56, -59, -57}));
  EXPECT_EQ(d.i64_of(d.ok(b::dim(F::NumericInt, K::Numeric_CumMax, z, 0, d.fresh()))),
            (std::vector<std::int64_t>{100, 100, 100, 100}));
  EXPECT_EQ(d.i64_of(d.ok(b::dim(F::NumericInt, K::Numeric_CumMin, z, 0, d.fresh()))),
            (std::vector<std::int64_t>{100, 100, -3, -3}));
  EXPECT_EQ(d.i64_of(d.ok(b::dim(F::NumericInt, K::Numeric_CumProd, z, 0, d.fresh()))),
            (std::vector<std::int64_t>{100, 16, -48, -96}));
}

TEST(ReferenceReduceTest, BadAttributesAreErrors) {
  Device d;
  const TensorIr x = d.f64({2, 3}, dtypes::f32, {1, 2, 3, 4, 5, 6});
  auto op = b::reduce_dim(F::NumericFloat, K::Numeric_SumDim, x, 1, 1, d.fresh());
  KILN_ASSERT_OK(op);
  Operation bad = *op;
  bad.attrs[0] = 5;  // axis out of range
  EXPECT_EQ(d.exec.execute(bad, d.handles).error().code, ErrorCode::OutOfBounds);
  bad = *op;
  bad.attrs[1] = 2;  // accumulator_len
  EXPECT_FALSE(d.exec.execute(bad, d.handles).ok());
  bad = *op;
  bad.tensors[1].shape = {2, 3};  // output shape that the op does not produce
  EXPECT_EQ(d.exec.execute(bad, d.handles).error().code, ErrorCode::IncompatibleShapes);
  auto tk =
      b::topk_with_indices(F::NumericFloat, K::Numeric_TopKWithIndices, x, 1, 2, dtypes::i64, d.fresh(), d.fresh());
  KILN_ASSERT_OK(tk);
  bad = *tk;
  bad.attrs[1] = 4;  // k > dim
  EXPECT_FALSE(d.exec.execute(bad, d.handles).ok());
  EXPECT_TRUE(d.handles.entry(bad.outputs()[0].id)->is_errored());
  EXPECT_TRUE(d.handles.entry(bad.outputs()[1].id)->is_errored());
}

}  // namespace
}  // namespace kiln::reference::testing
