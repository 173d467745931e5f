// Reference executor: layout, indexing and creation ops.
#include "kiln/testing/status.h"
#include "reference_test_util.h"

namespace kiln::reference::testing {
namespace {

using F = Family;
using K = OpKind;

std::vector<double> iota(std::size_t n) {
  std::vector<double> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<double>(i);
  return v;
}

TEST(ReferenceLayoutTest, ReshapeAndExpand) {
  Device d;
  const TensorIr x = d.f64({2, 3}, dtypes::f32, iota(6));
  const std::int64_t args[] = {3, -1};
  const TensorId r = d.ok(b::shape_op(F::BaseFloat, K::Base_Reshape, x, args, d.fresh()));
  EXPECT_EQ(d.shape_of(r), (Shape{3, 2}));
  EXPECT_EQ(d.f64_of(r), iota(6));
  EXPECT_FALSE(d.tensor(r).shares_buffer_with(d.tensor(x.id)));  // outputs never alias inputs

  const TensorIr c = d.i64({3, 1}, dtypes::i32, {1, 2, 3});
  const std::int64_t target[] = {2, 3, 2};
  const TensorId e = d.ok(b::shape_op(F::BaseInt, K::Base_Expand, c, target, d.fresh()));
  EXPECT_EQ(d.shape_of(e), (Shape{2, 3, 2}));
  EXPECT_EQ(d.i64_of(e), (std::vector<std::int64_t>{1, 1, 2, 2, 3, 3, 1, 1, 2, 2, 3, 3}));
}

TEST(ReferenceLayoutTest, SwapDimsPermuteFlip) {
  Device d;
  const TensorIr x = d.f64({2, 3}, dtypes::f64, iota(6));
  EXPECT_EQ(d.f64_of(d.ok(b::swap_dims(F::BaseFloat, K::Base_SwapDims, x, 0, 1, d.fresh()))),
            (std::vector<double>{0, 3, 1, 4, 2, 5}));
  const TensorIr y = d.f64({2, 3, 4}, dtypes::f16, iota(24));
  const std::uint64_t axes[] = {2, 0, 1};
  const TensorId p = d.ok(b::permute(F::BaseFloat, K::Base_Permute, y, axes, d.fresh()));
  EXPECT_EQ(d.shape_of(p), (Shape{4, 2, 3}));
  // out[i, j, k] = y[j, k, i] = 12 j + 4 k + i
  const std::vector<double> pv = d.f64_of(p);
  EXPECT_EQ(pv[0], 0);
  EXPECT_EQ(pv[1], 4);
  EXPECT_EQ(pv[3], 12);
  EXPECT_EQ(pv[6], 1);
  EXPECT_EQ(pv[23], 23);
  const std::uint64_t flip_axes[] = {0, 1};
  EXPECT_EQ(d.f64_of(d.ok(b::flip(F::BaseFloat, K::Base_Flip, x, flip_axes, d.fresh()))),
            (std::vector<double>{5, 4, 3, 2, 1, 0}));
  const std::uint64_t flip_last[] = {1};
  const TensorIr bl = d.boolean({2, 2}, {true, false, false, false});
  EXPECT_EQ(d.bool_of(d.ok(b::flip(F::BaseBool, K::Base_Flip, bl, flip_last, d.fresh()))),
            (std::vector<bool>{false, true, false, false}));
}

TEST(ReferenceLayoutTest, SliceWithNegativeIndicesAndSteps) {
  Device d;
  const TensorIr x = d.f64({10}, dtypes::f32, iota(10));
  auto slice = [&](Slice s) {
    const Slice r[] = {s};
    return d.f64_of(d.ok(b::slice(F::BaseFloat, K::Base_Slice, x, r, d.fresh())));
  };
  EXPECT_EQ(slice(Slice{2, 8, 1}), (std::vector<double>{2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(slice(Slice{-3, std::nullopt, 1}), (std::vector<double>{7, 8, 9}));
  EXPECT_EQ(slice(Slice{0, std::nullopt, 3}), (std::vector<double>{0, 3, 6, 9}));
  EXPECT_TRUE(slice(Slice{8, 2, 1}).empty());
  // Negative steps walk [begin, end) backwards from end - 1 (Burn).
  EXPECT_EQ(slice(Slice{0, std::nullopt, -1}), (std::vector<double>{9, 8, 7, 6, 5, 4, 3, 2, 1, 0}));
  EXPECT_EQ(slice(Slice{0, 10, -2}), (std::vector<double>{9, 7, 5, 3, 1}));
  EXPECT_EQ(slice(Slice{2, 5, -2}), (std::vector<double>{4, 2}));
  EXPECT_EQ(slice(Slice{-100, 100, std::numeric_limits<std::int64_t>::min()}), (std::vector<double>{9}));

  const TensorIr m = d.i64({3, 4}, dtypes::i64, {0, 1, 2, 3, 10, 11, 12, 13, 20, 21, 22, 23});
  const Slice r2[] = {Slice{1, std::nullopt, 1}, Slice{0, 4, -3}};
  const TensorId s = d.ok(b::slice(F::BaseInt, K::Base_Slice, m, r2, d.fresh()));
  EXPECT_EQ(d.shape_of(s), (Shape{2, 2}));
  EXPECT_EQ(d.i64_of(s), (std::vector<std::int64_t>{13, 10, 23, 20}));
  const Slice r1[] = {Slice{-1, std::nullopt, 1}};  // a range for the first dim only
  EXPECT_EQ(d.i64_of(d.ok(b::slice(F::BaseInt, K::Base_Slice, m, r1, d.fresh()))),
            (std::vector<std::int64_t>{20, 21, 22, 23}));
}

TEST(ReferenceLayoutTest, SliceAssign) {
  Device d;
  const TensorIr x = d.f64({2, 4}, dtypes::f64, iota(8));
  const TensorIr v = d.f64({1, 2}, dtypes::f64, {-1, -2});
  const Slice r[] = {Slice{1, 2, 1}, Slice{0, 4, -2}};  // row 1, columns 3 then 1
  EXPECT_EQ(d.f64_of(d.ok(b::slice_assign(F::BaseFloat, K::Base_SliceAssign, x, r, v, d.fresh()))),
            (std::vector<double>{0, 1, 2, 3, 4, -2, 6, -1}));
  // The value must have the sliced region's shape.
  const TensorIr wrong = d.f64({2}, dtypes::f64, {1, 2});
  auto op = b::slice_assign(F::BaseFloat, K::Base_SliceAssign, x, r, wrong, d.fresh());
  Status st = d.run(op);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ErrorCode::IncompatibleShapes);
}

TEST(ReferenceIndexingTest, SelectAndBounds) {
  Device d;
  const TensorIr x = d.f64({3, 2}, dtypes::f32, {0, 1, 10, 11, 20, 21});
  const TensorIr idx = d.i64({4}, dtypes::i32, {2, 0, 2, 1});
  const TensorId s = d.ok(b::select(F::BaseFloat, K::Base_Select, x, 0, idx, d.fresh()));
  EXPECT_EQ(d.shape_of(s), (Shape{4, 2}));
  EXPECT_EQ(d.f64_of(s), (std::vector<double>{20, 21, 0, 1, 20, 21, 10, 11}));
  const TensorIr cols = d.u64({1}, dtypes::u8, {1});
  EXPECT_EQ(d.f64_of(d.ok(b::select(F::BaseFloat, K::Base_Select, x, 1, cols, d.fresh()))),
            (std::vector<double>{1, 11, 21}));
  for (std::int64_t bad : {3, -1}) {
    const TensorIr oob = d.i64({1}, dtypes::i64, {bad});
    auto op = b::select(F::BaseFloat, K::Base_Select, x, 0, oob, d.fresh());
    Status st = d.run(op);
    ASSERT_FALSE(st.ok()) << bad;
    EXPECT_EQ(st.error().code, ErrorCode::OutOfBounds);
    EXPECT_TRUE(d.handles.entry(op->outputs()[0].id)->is_errored());
  }
}

TEST(ReferenceIndexingTest, SelectAssignWithEveryUpdate) {
  Device d;
  const TensorIr x = d.f64({3, 2}, dtypes::f64, {1, 2, 3, 4, 5, 6});
  const TensorIr idx = d.i64({3}, dtypes::i64, {2, 0, 2});
  const TensorIr v = d.f64({3, 2}, dtypes::f64, {10, 20, 30, 40, 50, 60});
  auto run = [&](IndexingUpdate u) {
    return d.f64_of(d.ok(b::select_assign(F::BaseFloat, K::Base_SelectAssign, x, 0, idx, v, u, d.fresh())));
  };
  EXPECT_EQ(run(IndexingUpdate::Assign), (std::vector<double>{30, 40, 3, 4, 50, 60}));  // last write wins
  EXPECT_EQ(run(IndexingUpdate::Add), (std::vector<double>{31, 42, 3, 4, 65, 86}));
  EXPECT_EQ(run(IndexingUpdate::Mul), (std::vector<double>{30, 80, 3, 4, 2500, 7200}));
  EXPECT_EQ(run(IndexingUpdate::Min), (std::vector<double>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(run(IndexingUpdate::Max), (std::vector<double>{30, 40, 3, 4, 50, 60}));
  // Along dim 1, ints wrapping.
  const TensorIr xi = d.i64({2, 2}, dtypes::i8, {100, 1, 2, 3});
  const TensorIr ci = d.i64({1}, dtypes::i64, {0});
  const TensorIr vi = d.i64({2, 1}, dtypes::i8, {100, -5});
  EXPECT_EQ(
      d.i64_of(d.ok(b::select_assign(F::BaseInt, K::Base_SelectAssign, xi, 1, ci, vi, IndexingUpdate::Add, d.fresh()))),
      (std::vector<std::int64_t>{-56, 1, -3, 3}));
  // Bool: Add is or, Mul is and.
  const TensorIr xb = d.boolean({2}, {false, true});
  const TensorIr cb = d.i64({2}, dtypes::i64, {0, 1});
  const TensorIr vb = d.boolean({2}, {true, false});
  EXPECT_EQ(d.bool_of(d.ok(
                b::select_assign(F::BaseBool, K::Base_SelectAssign, xb, 0, cb, vb, IndexingUpdate::Add, d.fresh()))),
            (std::vector<bool>{true, true}));
  EXPECT_EQ(d.bool_of(d.ok(
                b::select_assign(F::BaseBool, K::Base_SelectAssign, xb, 0, cb, vb, IndexingUpdate::Mul, d.fresh()))),
            (std::vector<bool>{false, false}));
}

TEST(ReferenceIndexingTest, GatherAndScatter) {
  Device d;
  const TensorIr x = d.f64({2, 3}, dtypes::f32, {1, 2, 3, 4, 5, 6});
  const TensorIr idx = d.i64({2, 2}, dtypes::i64, {2, 0, 1, 1});
  const TensorId g = d.ok(b::gather(F::BaseFloat, K::Base_Gather, x, 1, idx, d.fresh()));
  EXPECT_EQ(d.shape_of(g), (Shape{2, 2}));
  EXPECT_EQ(d.f64_of(g), (std::vector<double>{3, 1, 5, 5}));
  const TensorIr idx0 = d.i64({1, 3}, dtypes::i32, {1, 0, 1});
  EXPECT_EQ(d.f64_of(d.ok(b::gather(F::BaseFloat, K::Base_Gather, x, 0, idx0, d.fresh()))),
            (std::vector<double>{4, 2, 6}));

  const TensorIr z = d.f64({2, 3}, dtypes::f32, {0, 0, 0, 0, 0, 0});
  const TensorIr v = d.f64({2, 2}, dtypes::f32, {1, 2, 3, 4});
  auto scatter = [&](IndexingUpdate u) {
    return d.f64_of(d.ok(b::scatter(F::BaseFloat, K::Base_Scatter, z, 1, idx, v, u, d.fresh())));
  };
  EXPECT_EQ(scatter(IndexingUpdate::Assign), (std::vector<double>{2, 0, 1, 0, 4, 0}));
  EXPECT_EQ(scatter(IndexingUpdate::Add), (std::vector<double>{2, 0, 1, 0, 7, 0}));
  const TensorIr t = d.f64({2, 3}, dtypes::f32, {5, 5, 5, 5, 5, 5});
  EXPECT_EQ(d.f64_of(d.ok(b::scatter(F::BaseFloat, K::Base_Scatter, t, 1, idx, v, IndexingUpdate::Max, d.fresh()))),
            (std::vector<double>{5, 5, 5, 5, 5, 5}));
  EXPECT_EQ(d.f64_of(d.ok(b::scatter(F::BaseFloat, K::Base_Scatter, t, 1, idx, v, IndexingUpdate::Min, d.fresh()))),
            (std::vector<double>{2, 5, 1, 5, 3, 5}));
  EXPECT_EQ(d.f64_of(d.ok(b::scatter(F::BaseFloat, K::Base_Scatter, t, 1, idx, v, IndexingUpdate::Mul, d.fresh()))),
            (std::vector<double>{10, 5, 5, 5, 60, 5}));
  // Out-of-range index: an error, the output claimed.
  const TensorIr oob = d.i64({2, 2}, dtypes::i64, {0, 3, 0, 0});
  auto op = b::scatter(F::BaseFloat, K::Base_Scatter, z, 1, oob, v, IndexingUpdate::Add, d.fresh());
  EXPECT_EQ(d.run(op).error().code, ErrorCode::OutOfBounds);
  EXPECT_TRUE(d.handles.entry(op->outputs()[0].id)->is_errored());
  auto gop = b::gather(F::BaseFloat, K::Base_Gather, x, 1, oob, d.fresh());
  EXPECT_EQ(d.run(gop).error().code, ErrorCode::OutOfBounds);
}

TEST(ReferenceIndexingTest, GatherNd) {
  Device d;
  const TensorIr data = d.f64({2, 2, 2}, dtypes::f64, iota(8));
  const TensorIr i1 = d.i64({2, 2}, dtypes::i64, {0, 1, 1, 0});  // k = 2: rows of length 2
  const TensorId g = d.ok(b::gather_nd(F::BaseFloat, K::Base_GatherNd, data, i1, d.fresh()));
  EXPECT_EQ(d.shape_of(g), (Shape{2, 2}));
  EXPECT_EQ(d.f64_of(g), (std::vector<double>{2, 3, 4, 5}));
  const TensorIr i3 = d.i64({2, 3}, dtypes::u8, {1, 1, 1, 0, 0, 1});  // k = 3: scalars
  EXPECT_EQ(d.f64_of(d.ok(b::gather_nd(F::BaseFloat, K::Base_GatherNd, data, i3, d.fresh()))),
            (std::vector<double>{7, 1}));
  const TensorIr i0 = d.i64({3, 0}, dtypes::i64, {});  // k = 0: the whole tensor each time
  const TensorId w = d.ok(b::gather_nd(F::BaseFloat, K::Base_GatherNd, data, i0, d.fresh()));
  EXPECT_EQ(d.shape_of(w), (Shape{3, 2, 2, 2}));
  const TensorIr bad = d.i64({1, 2}, dtypes::i64, {0, 2});
  EXPECT_EQ(d.run(b::gather_nd(F::BaseFloat, K::Base_GatherNd, data, bad, d.fresh())).error().code,
            ErrorCode::OutOfBounds);
}

// ScatterNd (docs/spec/ir.md §5.4): each k-tuple of indices updates the sub-tensor it addresses
// with its slice of values, in index order; values are indices[..-1] ++ data[k..].
TEST(ReferenceIndexingTest, ScatterNdUpdatesSubTensorsInIndexOrder) {
  Device d;
  const TensorIr data = d.f64({3, 2}, dtypes::f32, {1, 2, 3, 4, 5, 6});
  // k = 1: whole rows. Row 2 gets [10, 20], row 0 gets [30, 40].
  const TensorIr rows = d.i64({2, 1}, dtypes::i64, {2, 0});
  const TensorIr row_values = d.f64({2, 2}, dtypes::f32, {10, 20, 30, 40});
  auto rows_with = [&](IndexingUpdate u) {
    return d.f64_of(d.ok(b::scatter_nd(F::BaseFloat, K::Base_ScatterNd, data, rows, row_values, u, d.fresh())));
  };
  EXPECT_EQ(rows_with(IndexingUpdate::Assign), (std::vector<double>{30, 40, 3, 4, 10, 20}));
  EXPECT_EQ(rows_with(IndexingUpdate::Add), (std::vector<double>{31, 42, 3, 4, 15, 26}));
  // k = 2: elements; (0, 1) is addressed twice, by 7 and then by 1.
  const TensorIr cells = d.i64({3, 2}, dtypes::u8, {0, 1, 2, 0, 0, 1});
  const TensorIr cell_values = d.f64({3}, dtypes::f32, {7, 8, 1});
  auto cells_with = [&](IndexingUpdate u) {
    return d.f64_of(d.ok(b::scatter_nd(F::BaseFloat, K::Base_ScatterNd, data, cells, cell_values, u, d.fresh())));
  };
  EXPECT_EQ(cells_with(IndexingUpdate::Assign), (std::vector<double>{1, 1, 3, 4, 8, 6})) << "the last write wins";
  EXPECT_EQ(cells_with(IndexingUpdate::Add), (std::vector<double>{1, 10, 3, 4, 13, 6}));  // 2 + 7 + 1, 5 + 8
  EXPECT_EQ(cells_with(IndexingUpdate::Mul), (std::vector<double>{1, 14, 3, 4, 40, 6}));  // 2 * 7 * 1, 5 * 8
  EXPECT_EQ(cells_with(IndexingUpdate::Min), (std::vector<double>{1, 1, 3, 4, 5, 6}));
  EXPECT_EQ(cells_with(IndexingUpdate::Max), (std::vector<double>{1, 7, 3, 4, 8, 6}));
  // k = 0: every (empty) tuple addresses the whole tensor.
  const TensorIr v = d.i64({2}, dtypes::u8, {250, 1});
  const TensorIr all = d.i64({2, 0}, dtypes::i64, {});
  const TensorIr whole = d.i64({2, 2}, dtypes::u8, {3, 20, 4, 30});
  EXPECT_EQ(d.u64_of(d.ok(b::scatter_nd(F::BaseInt, K::Base_ScatterNd, v, all, whole, IndexingUpdate::Add, d.fresh()))),
            (std::vector<std::uint64_t>{1, 51}))
      << "250 + 3 + 4 wraps in u8";
  // NaN wins Max (the NaN-propagating max of the other kernels); no tuples leaves data as is.
  const TensorIr nan = d.f64({1}, dtypes::f32, {kNaN});
  const TensorIr first = d.i64({1, 2}, dtypes::i64, {1, 1});
  EXPECT_THAT(
      d.f64_of(d.ok(b::scatter_nd(F::BaseFloat, K::Base_ScatterNd, data, first, nan, IndexingUpdate::Max, d.fresh()))),
      NanEq(std::vector<double>{1, 2, 3, kNaN, 5, 6}));
  const TensorIr no_tuples = d.i64({0, 1}, dtypes::i64, {});
  const TensorIr no_values = d.f64({0, 2}, dtypes::f32, {});
  EXPECT_EQ(d.f64_of(d.ok(b::scatter_nd(F::BaseFloat, K::Base_ScatterNd, data, no_tuples, no_values,
                                        IndexingUpdate::Assign, d.fresh()))),
            (std::vector<double>{1, 2, 3, 4, 5, 6}));
}

// Bad indices and hostile hand-made ops: errors naming the problem that claim the output.
TEST(ReferenceIndexingTest, ScatterNdRefusesBadIndicesAndShapes) {
  Device d;
  const TensorIr data = d.f64({3, 2}, dtypes::f32, {1, 2, 3, 4, 5, 6});
  const TensorIr values = d.f64({2, 2}, dtypes::f32, {10, 20, 30, 40});
  auto op = [&](const TensorIr& idx, const TensorIr& vals) {
    auto r = b::scatter_nd(F::BaseFloat, K::Base_ScatterNd, data, idx, vals, IndexingUpdate::Add, d.fresh());
    EXPECT_TRUE(r.ok()) << r.error().to_string();
    return r.ok() ? std::move(r).value() : Operation{};
  };
  d.expect_error(op(d.i64({2, 1}, dtypes::i64, {1, 3}), values), ErrorCode::OutOfBounds,
                 "scatter_nd index 3 (element 1) out of range for a dimension of size 3");
  d.expect_error(op(d.i64({2, 1}, dtypes::i32, {-1, 0}), values), ErrorCode::OutOfBounds,
                 "scatter_nd index -1 (element 0) is negative");
  // The builder leaves the values' shape to the kernel.
  d.expect_error(op(d.i64({2, 1}, dtypes::i64, {0, 1}), d.f64({2, 1}, dtypes::f32, {1, 2})),
                 ErrorCode::IncompatibleShapes, "values f32[2,1] must have shape [2,2]");
  Operation bad = op(d.i64({2, 1}, dtypes::i64, {0, 1}), values);
  bad.attrs[0] = 9;
  d.expect_error(bad, ErrorCode::Invalid, "unknown indexing update 9");
  bad = op(d.i64({2, 1}, dtypes::i64, {0, 1}), values);
  bad.tensors[1] = d.f64({2, 1}, dtypes::f32, {0, 1});
  d.expect_error(bad, ErrorCode::DTypeMismatch, "indices f32[2,1] must have an integer dtype");
  bad = op(d.i64({2, 1}, dtypes::i64, {0, 1}), values);
  bad.tensors[1] = d.i64({1, 3}, dtypes::i64, {0, 0, 0});
  d.expect_error(bad, ErrorCode::OutOfBounds, "address 3 dims");
  bad = op(d.i64({2, 1}, dtypes::i64, {0, 1}), values);
  bad.tensors[2] = d.i64({2, 2}, dtypes::i32, {1, 2, 3, 4});
  d.expect_error(bad, ErrorCode::DTypeMismatch, "dtypes differ");
  bad = op(d.i64({2, 1}, dtypes::i64, {0, 1}), values);
  bad.tensors[3].shape = {2, 3};
  d.expect_error(bad, ErrorCode::IncompatibleShapes, "does not have the shape");
}

// Unfold (docs/spec/ir.md §4, §6.3): out[p, w, q, j] = in[p, w * step + j, q], the window axis last.
TEST(ReferenceLayoutTest, UnfoldCopiesWindowsIntoANewLastAxis) {
  Device d;
  const TensorIr x = d.f64({2, 5}, dtypes::f32, iota(10));
  const TensorId rows = d.ok(b::unfold(F::BaseFloat, K::Base_Unfold, x, 1, 2, 2, d.fresh()));
  EXPECT_EQ(d.shape_of(rows), (Shape{2, 2, 2}));
  EXPECT_EQ(d.f64_of(rows), (std::vector<double>{0, 1, 2, 3, 5, 6, 7, 8})) << "element 4 and 9 are in no window";
  // Along dim 0 one window of both rows: each column becomes a 2-vector on the last axis.
  const TensorId cols = d.ok(b::unfold(F::BaseFloat, K::Base_Unfold, x, 0, 2, 1, d.fresh()));
  EXPECT_EQ(d.shape_of(cols), (Shape{1, 5, 2}));
  EXPECT_EQ(d.f64_of(cols), (std::vector<double>{0, 5, 1, 6, 2, 7, 3, 8, 4, 9}));
  // Overlapping windows of an integer tensor; a step past the size skips elements.
  const TensorIr xi = d.i64({4}, dtypes::i16, {4, -3, 7, 1});
  const TensorId ov = d.ok(b::unfold(F::BaseInt, K::Base_Unfold, xi, 0, 3, 1, d.fresh()));
  EXPECT_EQ(d.shape_of(ov), (Shape{2, 3}));
  EXPECT_EQ(d.i64_of(ov), (std::vector<std::int64_t>{4, -3, 7, -3, 7, 1}));
  const TensorIr seven = d.f64({7}, dtypes::f64, iota(7));
  EXPECT_EQ(d.f64_of(d.ok(b::unfold(F::BaseFloat, K::Base_Unfold, seven, 0, 2, 3, d.fresh()))),
            (std::vector<double>{0, 1, 3, 4}));
  // A window larger than the dim gives none; bits are copied (NaN payloads, -0).
  EXPECT_EQ(d.shape_of(d.ok(b::unfold(F::BaseFloat, K::Base_Unfold, seven, 0, 8, 1, d.fresh()))), (Shape{0, 8}));
  const TensorIr special = d.f64({2}, dtypes::f64, {-0.0, kNaN});
  const std::vector<double> sp = d.f64_of(d.ok(b::unfold(F::BaseFloat, K::Base_Unfold, special, 0, 1, 1, d.fresh())));
  EXPECT_THAT(sp, NanEq(std::vector<double>{-0.0, kNaN}));
  EXPECT_TRUE(std::signbit(sp[0]));
  const TensorIr flags = d.boolean({3}, {true, false, true});
  EXPECT_EQ(d.bool_of(d.ok(b::unfold(F::BaseBool, K::Base_Unfold, flags, 0, 2, 1, d.fresh()))),
            (std::vector<bool>{true, false, false, true}));
}

TEST(ReferenceLayoutTest, UnfoldRefusesBadAttributes) {
  Device d;
  const TensorIr x = d.f64({2, 5}, dtypes::f32, iota(10));
  auto u = b::unfold(F::BaseFloat, K::Base_Unfold, x, 1, 2, 1, d.fresh());
  KILN_ASSERT_OK(u);
  Operation bad = *u;
  bad.attrs[2] = 0;
  d.expect_error(bad, ErrorCode::Invalid, "step must be at least 1");
  bad = *u;
  bad.attrs[0] = 2;
  d.expect_error(bad, ErrorCode::OutOfBounds, "dim 2 out of bounds for rank 2");
  bad = *u;
  bad.attrs[1] = -1;
  d.expect_error(bad, ErrorCode::Invalid, "size must not be negative, got -1");
  bad = *u;
  bad.attrs[1] = std::numeric_limits<std::int64_t>::max();  // no window, and not the claimed shape
  d.expect_error(bad, ErrorCode::IncompatibleShapes, "does not have the shape");
  bad = *u;
  bad.tensors[1].dtype = dtypes::f16;
  d.expect_error(bad, ErrorCode::DTypeMismatch, "must have dtype f32");
}

TEST(ReferenceLayoutTest, CatAndRepeatDim) {
  Device d;
  const TensorIr a = d.i64({2, 1}, dtypes::i16, {1, 2});
  const TensorIr c = d.i64({2, 2}, dtypes::i16, {3, 4, 5, 6});
  const TensorIr e = d.i64({2, 0}, dtypes::i16, {});
  const TensorIr list[] = {a, c, e, a};
  const TensorId cat = d.ok(b::cat(F::BaseInt, K::Base_Cat, list, 1, d.fresh()));
  EXPECT_EQ(d.shape_of(cat), (Shape{2, 4}));
  EXPECT_EQ(d.i64_of(cat), (std::vector<std::int64_t>{1, 3, 4, 1, 2, 5, 6, 2}));
  const TensorIr rows[] = {c, c};
  EXPECT_EQ(d.i64_of(d.ok(b::cat(F::BaseInt, K::Base_Cat, rows, 0, d.fresh()))),
            (std::vector<std::int64_t>{3, 4, 5, 6, 3, 4, 5, 6}));
  const TensorId rep = d.ok(b::repeat_dim(F::BaseInt, K::Base_RepeatDim, c, 1, 3, d.fresh()));
  EXPECT_EQ(d.shape_of(rep), (Shape{2, 6}));
  EXPECT_EQ(d.i64_of(rep), (std::vector<std::int64_t>{3, 4, 3, 4, 3, 4, 5, 6, 5, 6, 5, 6}));
  EXPECT_EQ(d.i64_of(d.ok(b::repeat_dim(F::BaseInt, K::Base_RepeatDim, a, 0, 2, d.fresh()))),
            (std::vector<std::int64_t>{1, 2, 1, 2}));
  EXPECT_EQ(d.shape_of(d.ok(b::repeat_dim(F::BaseInt, K::Base_RepeatDim, a, 0, 0, d.fresh()))), (Shape{0, 1}));
}

TEST(ReferenceLayoutTest, PadConstantReflectEdge) {
  Device d;
  const TensorIr x = d.f64({2, 3}, dtypes::f32, {1, 2, 3, 4, 5, 6});
  const b::PadPair last[] = {{2, 1}};
  EXPECT_EQ(d.f64_of(d.ok(
                b::pad(F::NumericFloat, K::Numeric_Pad, x, last, PadMode::Constant, ScalarIr::Float(-1), d.fresh()))),
            (std::vector<double>{-1, -1, 1, 2, 3, -1, -1, -1, 4, 5, 6, -1}));
  EXPECT_EQ(d.f64_of(d.ok(b::pad(F::NumericFloat, K::Numeric_Pad, x, last, PadMode::Reflect, std::nullopt, d.fresh()))),
            (std::vector<double>{3, 2, 1, 2, 3, 2, 6, 5, 4, 5, 6, 5}));
  EXPECT_EQ(d.f64_of(d.ok(b::pad(F::NumericFloat, K::Numeric_Pad, x, last, PadMode::Edge, std::nullopt, d.fresh()))),
            (std::vector<double>{1, 1, 1, 2, 3, 3, 4, 4, 4, 5, 6, 6}));
  const b::PadPair both[] = {{1, 0}, {0, 1}};
  const TensorIr xi = d.i64({2, 2}, dtypes::i32, {1, 2, 3, 4});
  const TensorId p = d.ok(b::pad(F::NumericInt, K::Numeric_Pad, xi, both, PadMode::Edge, std::nullopt, d.fresh()));
  EXPECT_EQ(d.shape_of(p), (Shape{3, 3}));
  EXPECT_EQ(d.i64_of(p), (std::vector<std::int64_t>{1, 2, 2, 1, 2, 2, 3, 4, 4}));
  EXPECT_EQ(
      d.i64_of(d.ok(b::pad(F::NumericInt, K::Numeric_Pad, xi, both, PadMode::Constant, ScalarIr::Int(9), d.fresh()))),
      (std::vector<std::int64_t>{9, 9, 9, 1, 2, 9, 3, 4, 9}));
  // Reflect wider than the dim allows: rejected by the builder, and by the executor when forced.
  auto op = b::pad(F::NumericFloat, K::Numeric_Pad, x, last, PadMode::Reflect, std::nullopt, d.fresh());
  KILN_ASSERT_OK(op);
  Operation bad = *op;
  bad.attrs = {static_cast<std::int64_t>(PadMode::Reflect), 3, 0};
  bad.tensors[1].shape = {2, 6};
  EXPECT_FALSE(d.exec.execute(bad, d.handles).ok());
}

TEST(ReferenceCreationTest, EmptyZerosOnesFull) {
  Device d;
  EXPECT_EQ(d.f64_of(d.ok(b::creation(F::BaseFloat, K::Base_Empty, {2}, dtypes::f16, d.fresh()))),
            (std::vector<double>{0, 0}));  // deterministic: zero-filled
  EXPECT_EQ(d.i64_of(d.ok(b::creation(F::BaseInt, K::Base_Zeros, {3}, dtypes::i8, d.fresh()))),
            (std::vector<std::int64_t>{0, 0, 0}));
  EXPECT_EQ(d.f64_of(d.ok(b::creation(F::BaseFloat, K::Base_Ones, {2}, dtypes::bf16, d.fresh()))),
            (std::vector<double>{1, 1}));
  const TensorId ob = d.ok(b::creation(F::BaseBool, K::Base_Ones, {2}, DType::boolean(BoolStore::U32), d.fresh()));
  EXPECT_EQ(d.tensor(ob).to_values<std::uint32_t>(), (std::vector<std::uint32_t>{1, 1}));
  EXPECT_EQ(
      d.f64_of(d.ok(b::full(F::NumericFloat, K::Numeric_Full, {2, 2}, dtypes::f32, ScalarIr::Float(2.5), d.fresh()))),
      (std::vector<double>{2.5, 2.5, 2.5, 2.5}));
  EXPECT_EQ(d.u64_of(d.ok(b::full(F::NumericInt, K::Numeric_Full, {1}, dtypes::u16, ScalarIr::Int(-1), d.fresh()))),
            (std::vector<std::uint64_t>{65535}));
  EXPECT_EQ(d.shape_of(d.ok(b::creation(F::BaseFloat, K::Base_Zeros, {}, dtypes::f64, d.fresh()))), (Shape{}));
}

TEST(ReferenceCreationTest, RandomIsDeterministicPerSeedAndInRange) {
  Device d;
  const Shape s{1000};
  auto draw = [&](Family f, OpKind k, DType t, b::DistributionIr dist) {
    return d.f64_of(d.ok(b::random(f, k, s, t, dist, d.fresh())));
  };
  d.exec.reseed(7);
  const std::vector<double> u1 = draw(F::Float, K::Float_Random, dtypes::f32, {});
  d.exec.reseed(7);
  const std::vector<double> u2 = draw(F::Float, K::Float_Random, dtypes::f32, {});
  EXPECT_EQ(u1, u2);
  const std::vector<double> u3 = draw(F::Float, K::Float_Random, dtypes::f32, {});
  EXPECT_NE(u1, u3);  // the stream moves on
  double mean = 0;
  for (double v : u1) {
    EXPECT_GE(v, 0);
    EXPECT_LT(v, 1);
    mean += v / 1000;
  }
  EXPECT_NEAR(mean, 0.5, 0.05);
  for (double v : draw(F::Float, K::Float_Random, dtypes::f16, {})) EXPECT_LT(v, 1);  // k / 2^11, never 1
  for (double v : draw(F::Float, K::Float_Random, dtypes::bf16, {})) EXPECT_LT(v, 1);

  const std::vector<double> bern = draw(F::Float, K::Float_Random, dtypes::f64, b::DistributionIr::bernoulli(0.3));
  double ones = 0;
  for (double v : bern) {
    EXPECT_TRUE(v == 0 || v == 1);
    ones += v;
  }
  EXPECT_NEAR(ones / 1000, 0.3, 0.06);
  for (double v : draw(F::Float, K::Float_Random, dtypes::f64, b::DistributionIr::uniform(-2, 3))) {
    EXPECT_GE(v, -2);
    EXPECT_LT(v, 3);
  }
  const std::vector<double> normal = draw(F::Float, K::Float_Random, dtypes::f64, b::DistributionIr::normal(10, 2));
  double m = 0, var = 0;
  for (double v : normal) m += v / 1000;
  for (double v : normal) var += (v - m) * (v - m) / 1000;
  EXPECT_NEAR(m, 10, 0.3);
  EXPECT_NEAR(std::sqrt(var), 2, 0.3);

  for (double v : draw(F::NumericInt, K::Numeric_IntRandom, dtypes::i32, b::DistributionIr::uniform(-3, 4))) {
    EXPECT_GE(v, -3);
    EXPECT_LT(v, 4);
    EXPECT_EQ(v, std::trunc(v));
  }
  for (double v : draw(F::NumericInt, K::Numeric_IntRandom, dtypes::u8, {})) EXPECT_LT(v, 255);
  for (double v : draw(F::NumericInt, K::Numeric_IntRandom, dtypes::i8, {})) {
    EXPECT_GE(v, 0);
    EXPECT_LT(v, 128);
  }
  for (double v : draw(F::NumericFloat, K::Numeric_IntRandom, dtypes::f32, b::DistributionIr::bernoulli(1))) {
    EXPECT_EQ(v, 1);
  }
}

TEST(ReferenceCreationTest, RandomParametersAreChecked) {
  Device d;
  EXPECT_FALSE(
      d.run(b::random(F::Float, K::Float_Random, {2}, dtypes::f32, b::DistributionIr::bernoulli(1.5), d.fresh())).ok());
  EXPECT_FALSE(
      d.run(b::random(F::Float, K::Float_Random, {2}, dtypes::f32, b::DistributionIr::uniform(3, 1), d.fresh())).ok());
  EXPECT_FALSE(
      d.run(b::random(F::Float, K::Float_Random, {2}, dtypes::f32, b::DistributionIr::normal(0, -1), d.fresh())).ok());
  EXPECT_FALSE(d.run(b::random(F::NumericInt, K::Numeric_IntRandom, {2}, dtypes::u8, b::DistributionIr::uniform(0, 300),
                               d.fresh()))
                   .ok());  // does not fit u8
  EXPECT_FALSE(d.run(b::random(F::NumericInt, K::Numeric_IntRandom, {2}, dtypes::i32, b::DistributionIr::uniform(2, 2),
                               d.fresh()))
                   .ok());  // empty range
  auto op = b::random(F::Float, K::Float_Random, {2}, dtypes::f32, {}, d.fresh());
  KILN_ASSERT_OK(op);
  Operation bad = *op;
  bad.attrs[0] = 9;  // unknown distribution
  EXPECT_FALSE(d.exec.execute(bad, d.handles).ok());
}

}  // namespace
}  // namespace kiln::reference::testing
