// IR builders (docs/spec/ir.md §6) and the builder vectors of docs/spec/ir.md §12.5.
#include "kiln/ir/builders.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <ostream>
#include <vector>

namespace kiln {
inline void PrintTo(ErrorCode c, std::ostream* os) { *os << error_code_name(c); }
}  // namespace kiln

namespace kiln::ir {
inline void PrintTo(const DType& d, std::ostream* os) { *os << d.name(); }
inline void PrintTo(const TensorIr& t, std::ostream* os) { *os << t.to_string() << "/" << status_name(t.status); }

namespace {

using build::DistributionIr;

// Builds `expr`, asserts success and that the op passes Operation::validate().
// `var` names a declaration: it cannot be parenthesised.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define BUILD(var, expr)                                                               \
  auto var##_result = (expr);                                                          \
  ASSERT_TRUE(var##_result.ok()) << #expr << ": " << var##_result.error().to_string(); \
  const Operation& var = *var##_result;                                                \
  do {                                                                                 \
    Status _st = var.validate();                                                       \
    EXPECT_TRUE(_st.ok()) << (_st.ok() ? "" : _st.error().to_string());                \
  } while (0)
// NOLINTEND(bugprone-macro-parentheses)

#define EXPECT_ERR(expr, expected)                                          \
  do {                                                                      \
    auto _r = (expr);                                                       \
    ASSERT_FALSE(_r.ok()) << #expr << " succeeded, expected " << #expected; \
    EXPECT_EQ(_r.error().code, expected) << _r.error().to_string();         \
  } while (0)

// The error message of a failed build ("" when it succeeded, which the caller's check reports).
std::string message_of(const Result<Operation>& r) { return r.ok() ? std::string() : r.error().message; }

TensorIr t(std::uint64_t id, Shape shape, DType dtype = dtypes::f32, TensorStatus status = TensorStatus::ReadOnly) {
  return TensorIr{TensorId{id}, std::move(shape), status, dtype};
}
TensorId id(std::uint64_t v) { return TensorId{v}; }
const DType kBool = dtypes::boolean;

DType qfloat_packed(std::uint8_t packed_dim) {
  QuantScheme s;
  s.value = QuantValue::Q4S;
  s.store = QuantStoreKind::PackedU32;
  s.packed_dim = packed_dim;
  return DType::qfloat(s);
}

std::int64_t bits(double v) {
  std::int64_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

const TensorIr& out(const Operation& op, std::size_t i = 0) { return op.outputs()[i]; }

// ============================ docs/spec/ir.md §12.5 vectors ============================

// Item 1.
TEST(BuildersVector1, BinaryBroadcastsLeftOnes) {
  BUILD(op, build::binary(Family::NumericFloat, OpKind::Numeric_Add, t(1, {1, 1, 2, 4}), t(2, {7, 6, 2, 4}), id(3)));
  EXPECT_EQ(out(op), TensorIr::uninit(id(3), {7, 6, 2, 4}, dtypes::f32));
  EXPECT_EQ(op.kind_name(), "NumericFloat::Add");
  EXPECT_EQ(op.num_inputs, 2);
  EXPECT_EQ(op.inputs()[0], t(1, {1, 1, 2, 4}));
  EXPECT_EQ(op.inputs()[1], t(2, {7, 6, 2, 4}));
  EXPECT_EQ(op.dtype, dtypes::f32);
}

TEST(BuildersVector1, BinaryIncompatibleDims) {
  auto r = build::binary(Family::NumericFloat, OpKind::Numeric_Add, t(1, {2, 2}), t(2, {2, 4}), id(3));
  EXPECT_ERR(r, ErrorCode::IncompatibleDims);
  EXPECT_EQ(message_of(r), "NumericFloat::Add: broadcast: incompatible dims 2 and 4 at dim 1 ([2,2] vs [2,4])");
}

TEST(BuildersVector1, BinaryRankMismatch) {
  EXPECT_ERR(build::binary(Family::NumericFloat, OpKind::Numeric_Add, t(1, {2}), t(2, {2, 2}), id(3)),
             ErrorCode::RankMismatch);
}

TEST(BuildersVector1, BinaryDTypeMismatch) {
  auto r = build::binary(Family::NumericFloat, OpKind::Numeric_Mul, t(1, {2}), t(2, {2}, dtypes::f16), id(3));
  EXPECT_ERR(r, ErrorCode::DTypeMismatch);
  EXPECT_EQ(message_of(r), "NumericFloat::Mul: dtypes differ: lhs f32 vs rhs f16");
}

TEST(BuildersVector1, ComparisonOutputsTheBoolDtype) {
  BUILD(op, build::binary_comparison(Family::NumericFloat, OpKind::Numeric_Greater, t(1, {2, 3}), t(2, {2, 3}),
                                     DType::boolean(BoolStore::Native), id(3)));
  EXPECT_EQ(out(op).dtype, DType::boolean(BoolStore::Native));
  EXPECT_EQ(out(op).shape, (Shape{2, 3}));
  EXPECT_EQ(op.dtype, dtypes::f32);  // the family carries the input dtype for comparisons
}

// Item 2.
TEST(BuildersVector2, MatmulShapes) {
  BUILD(a, build::matmul(Family::Float, OpKind::Float_Matmul, t(1, {2, 3, 4}), t(2, {2, 4, 5}), id(3)));
  EXPECT_EQ(out(a).shape, (Shape{2, 3, 5}));
  BUILD(b, build::matmul(Family::Float, OpKind::Float_Matmul, t(1, {1, 3, 4}), t(2, {7, 4, 5}), id(3)));
  EXPECT_EQ(out(b).shape, (Shape{7, 3, 5}));
  EXPECT_ERR(build::matmul(Family::Float, OpKind::Float_Matmul, t(1, {3, 4}), t(2, {5, 6}), id(3)),
             ErrorCode::IncompatibleShapes);
  EXPECT_ERR(build::matmul(Family::Float, OpKind::Float_Matmul, t(1, {3, 4}), t(2, {2, 4, 5}), id(3)),
             ErrorCode::RankMismatch);
}

TEST(BuildersVector2, MatmulMixedDtypes) {
  const DType q = qfloat_packed(0);
  BUILD(a, build::matmul(Family::Float, OpKind::Float_Matmul, t(1, {3, 4}, q), t(2, {4, 5}), id(3)));
  EXPECT_EQ(out(a).dtype, q);
  EXPECT_EQ(a.dtype, q);
  auto r = build::matmul(Family::Float, OpKind::Float_Matmul, t(1, {3, 4}), t(2, {4, 5}, dtypes::i32), id(3));
  EXPECT_ERR(r, ErrorCode::DTypeMismatch);
  EXPECT_NE(message_of(r).find("f32"), std::string::npos);
  EXPECT_NE(message_of(r).find("i32"), std::string::npos);
}

// Item 3.
TEST(BuildersVector3, Reshape) {
  const TensorIr x = t(1, {2, 3, 4});
  auto reshape = [&](std::vector<std::int64_t> args) {
    return build::shape_op(Family::BaseFloat, OpKind::Base_Reshape, x, args, id(2));
  };
  BUILD(a, reshape({6, -1}));
  EXPECT_EQ(out(a).shape, (Shape{6, 4}));
  BUILD(b, reshape({0, -1}));
  EXPECT_EQ(out(b).shape, (Shape{2, 12}));
  EXPECT_ERR(reshape({-1, -1}), ErrorCode::Invalid);
  EXPECT_ERR(reshape({5, -1}), ErrorCode::Invalid);
  EXPECT_ERR(reshape({4, 7}), ErrorCode::Invalid);
}

// Item 4.
TEST(BuildersVector4, Expand) {
  auto expand = [](Shape in, std::vector<std::int64_t> target) {
    return build::shape_op(Family::BaseFloat, OpKind::Base_Expand, t(1, std::move(in)), target, id(2));
  };
  BUILD(a, expand({3, 1}, {2, 3, 4}));
  EXPECT_EQ(out(a).shape, (Shape{2, 3, 4}));
  EXPECT_ERR(expand({3, 2}, {3, 4}), ErrorCode::IncompatibleDims);
  EXPECT_ERR(expand({1, 2, 3}, {2, 3}), ErrorCode::RankMismatch);
}

// Item 5.
TEST(BuildersVector5, Cat) {
  auto cat = [](Shape a, Shape b, std::uint64_t dim) {
    const std::vector<TensorIr> ts{t(1, std::move(a)), t(2, std::move(b))};
    return build::cat(Family::BaseFloat, OpKind::Base_Cat, ts, dim, id(3));
  };
  BUILD(op, cat({2, 3}, {4, 3}, 0));
  EXPECT_EQ(out(op).shape, (Shape{6, 3}));
  EXPECT_EQ(op.num_inputs, 2);
  EXPECT_EQ(op.attrs, (AttrList{0}));
  EXPECT_ERR(cat({2, 3}, {4, 3}, 2), ErrorCode::OutOfBounds);
  EXPECT_ERR(cat({2, 3}, {2, 4}, 0), ErrorCode::IncompatibleShapes);
}

// Item 6.
TEST(BuildersVector6, SliceSizes) {
  auto size_of = [](Slice s) -> std::uint64_t {
    const Slice rs[] = {s};
    auto r = build::slice(Family::BaseFloat, OpKind::Base_Slice, t(1, {10}), rs, id(2));
    EXPECT_TRUE(r.ok()) << r.error().to_string();
    return r.ok() ? r->outputs()[0].shape[0] : 999;
  };
  EXPECT_EQ(size_of(Slice{2, 8, 1}), 6u);
  EXPECT_EQ(size_of(Slice{-3, std::nullopt, 1}), 3u);
  EXPECT_EQ(size_of(Slice{0, std::nullopt, 3}), 4u);
  EXPECT_EQ(size_of(Slice{8, 2, 1}), 0u);
  const Slice three[] = {Slice{0, 1, 1}, Slice{0, 1, 1}, Slice{0, 1, 1}};
  EXPECT_ERR(build::slice(Family::BaseFloat, OpKind::Base_Slice, t(1, {4, 5}), three, id(2)), ErrorCode::RankMismatch);
}

// Item 7.
TEST(BuildersVector7, ReduceDimTopKGatherNd) {
  BUILD(rd, build::reduce_dim(Family::NumericFloat, OpKind::Numeric_SumDim, t(1, {4, 5}), 1, 1, id(2)));
  EXPECT_EQ(out(rd).shape, (Shape{4, 1}));
  EXPECT_EQ(rd.attrs, (AttrList{1, 1}));

  BUILD(tk, build::topk_with_indices(Family::NumericFloat, OpKind::Numeric_TopKWithIndices, t(1, {4, 5}), 1, 3,
                                     dtypes::i64, id(2), id(3)));
  ASSERT_EQ(tk.outputs().size(), 2u);
  EXPECT_EQ(out(tk, 0), TensorIr::uninit(id(2), {4, 3}, dtypes::f32));
  EXPECT_EQ(out(tk, 1), TensorIr::uninit(id(3), {4, 3}, dtypes::i64));
  EXPECT_EQ(tk.attrs, (AttrList{1, 3}));

  BUILD(gn,
        build::gather_nd(Family::BaseFloat, OpKind::Base_GatherNd, t(1, {5, 6, 7}), t(2, {3, 2}, dtypes::i64), id(3)));
  EXPECT_EQ(out(gn).shape, (Shape{3, 7}));
  EXPECT_EQ(out(gn).dtype, dtypes::f32);
}

// Item 8.
TEST(BuildersVector8, Conv2d) {
  build::Conv2dOptions o;
  o.stride = {1, 1};
  o.padding = {1, 1};
  o.dilation = {1, 1};
  BUILD(op, build::conv2d(t(1, {1, 3, 32, 32}), t(2, {8, 3, 3, 3}), std::nullopt, o, id(3)));
  EXPECT_EQ(out(op).shape, (Shape{1, 8, 32, 32}));
  EXPECT_EQ(op.kind_name(), "Module::Conv2d");
  EXPECT_EQ(op.attrs, (AttrList{1, 1, 1, 1, 1, 1, 1}));
}

TEST(BuildersVector8, MaxPool2d) {
  build::MaxPool2dOptions o;
  o.kernel = {2, 2};
  o.stride = {2, 2};
  o.padding = {0, 0};
  BUILD(floor_mode, build::max_pool2d(t(1, {1, 1, 5, 5}), o, id(2)));
  EXPECT_EQ(out(floor_mode).shape, (Shape{1, 1, 2, 2}));
  o.ceil_mode = true;
  BUILD(ceil_mode, build::max_pool2d(t(1, {1, 1, 5, 5}), o, id(2)));
  EXPECT_EQ(out(ceil_mode).shape, (Shape{1, 1, 3, 3}));
  EXPECT_EQ(ceil_mode.attrs, (AttrList{2, 2, 2, 2, 0, 0, 1, 1, 1}));
}

TEST(BuildersVector8, ConvTranspose1d) {
  build::ConvTranspose1dOptions o;
  o.stride = 2;
  o.padding = 1;
  o.padding_out = 1;
  o.groups = 1;
  BUILD(op, build::conv_transpose1d(t(1, {1, 4, 10}), t(2, {4, 2, 3}), std::nullopt, o, id(3)));
  EXPECT_EQ(out(op).shape, (Shape{1, 2, 20}));
  EXPECT_EQ(op.attrs, (AttrList{2, 1, 1, 1, 1}));
}

// Item 9 (unfold windows) is a shape rule without a builder: tests/ir/shape_test.cc.

// Item 10.
TEST(BuildersVector10, PermuteMovesThePackedDim) {
  const std::uint64_t axes[] = {2, 0, 1};
  BUILD(op, build::permute(Family::BaseFloat, OpKind::Base_Permute, t(1, {4, 5, 8}, qfloat_packed(0)), axes, id(2)));
  EXPECT_EQ(out(op).shape, (Shape{8, 4, 5}));
  ASSERT_TRUE(out(op).dtype.is_quantized());
  EXPECT_EQ(out(op).dtype.scheme().packed_dim, 2);
  EXPECT_EQ(op.attrs, (AttrList{2, 0, 1}));
}

// Item 11.
TEST(BuildersVector11, Pad) {
  auto pad = [](Shape in, std::vector<build::PadPair> p, PadMode mode) {
    std::optional<ScalarIr> value;
    if (mode == PadMode::Constant) value = ScalarIr::Float(0);
    return build::pad(Family::NumericFloat, OpKind::Numeric_Pad, t(1, std::move(in)), p, mode, value, id(2));
  };
  BUILD(op, pad({3, 4}, {{1, 1}}, PadMode::Constant));
  EXPECT_EQ(out(op).shape, (Shape{3, 6}));
  EXPECT_EQ(op.attrs, (AttrList{static_cast<std::int64_t>(PadMode::Constant), 1, 1}));
  EXPECT_EQ(op.scalars.size(), 1u);
  EXPECT_ERR(pad({3, 4}, {{4, 0}}, PadMode::Reflect), ErrorCode::Invalid);
  EXPECT_ERR(pad({3, 0}, {{1, 0}}, PadMode::Edge), ErrorCode::Invalid);
  EXPECT_ERR(pad({3, 4}, {{1, 1}, {1, 1}, {1, 1}}, PadMode::Constant), ErrorCode::RankMismatch);
}

// Item 12.
TEST(BuildersVector12, ScalarFromF64) {
  EXPECT_EQ(*ScalarIr::from_f64(2.5, dtypes::f32), ScalarIr::Float(2.5));
  EXPECT_EQ(*ScalarIr::from_f64(3, dtypes::i32), ScalarIr::Int(3));
  EXPECT_EQ(*ScalarIr::from_f64(3, dtypes::u8), ScalarIr::UInt(3));
  EXPECT_EQ(*ScalarIr::from_f64(1, dtypes::boolean), ScalarIr::Bool(true));
  EXPECT_ERR(ScalarIr::from_f64(1, qfloat_packed(0)), ErrorCode::Unsupported);
}

// ============================ common checks ============================

TEST(Builders, KindMustHaveTheBuildersSignature) {
  auto r = build::binary(Family::NumericFloat, OpKind::Numeric_AddScalar, t(1, {2}), t(2, {2}), id(3));
  EXPECT_ERR(r, ErrorCode::Invalid);
  EXPECT_EQ(message_of(r), "NumericFloat::AddScalar: has signature Scalar, not Binary");
  EXPECT_ERR(build::unary(Family::BaseFloat, OpKind::Base_Reshape, t(1, {2}), id(2)), ErrorCode::Invalid);
  EXPECT_ERR(build::unary(Family::Float, static_cast<OpKind>(60000), t(1, {2}), id(2)), ErrorCode::Invalid);
}

TEST(Builders, GroupMustAdmitTheFamily) {
  EXPECT_ERR(build::binary(Family::Float, OpKind::Numeric_Add, t(1, {2}), t(2, {2}), id(3)), ErrorCode::Invalid);
  EXPECT_ERR(build::unary(Family::NumericFloat, OpKind::Float_Exp, t(1, {2}), id(2)), ErrorCode::Invalid);
  EXPECT_ERR(
      build::shape_op(Family::NumericFloat, OpKind::Base_Reshape, t(1, {2}), std::vector<std::int64_t>{2}, id(2)),
      ErrorCode::Invalid);
}

TEST(Builders, FamilyMustFitTheOperandDtype) {
  auto r = build::binary(Family::NumericInt, OpKind::Numeric_Add, t(1, {2}), t(2, {2}), id(3));
  EXPECT_ERR(r, ErrorCode::DTypeMismatch);
  EXPECT_EQ(message_of(r), "NumericInt::Add: family NumericInt does not apply to operand dtype f32");
  EXPECT_ERR(build::shape_op(Family::BaseInt, OpKind::Base_Reshape, t(1, {2}), std::vector<std::int64_t>{2}, id(2)),
             ErrorCode::DTypeMismatch);
  EXPECT_ERR(
      build::shape_op(Family::BaseFloat, OpKind::Base_Reshape, t(1, {2}, kBool), std::vector<std::int64_t>{2}, id(2)),
      ErrorCode::DTypeMismatch);
  EXPECT_ERR(build::unary(Family::Float, OpKind::Float_Exp, t(1, {2}, dtypes::i32), id(2)), ErrorCode::DTypeMismatch);
  EXPECT_ERR(build::unary(Family::Int, OpKind::Int_BitwiseNot, t(1, {2}), id(2)), ErrorCode::DTypeMismatch);
  EXPECT_ERR(build::unary(Family::Bool, OpKind::Bool_Not, t(1, {2}, dtypes::u8), id(2)), ErrorCode::DTypeMismatch);
  // Unsigned integers are integers; QFloat is handled by the float families.
  BUILD(u, build::binary(Family::NumericInt, OpKind::Numeric_Add, t(1, {2}, dtypes::u8), t(2, {2}, dtypes::u8), id(3)));
  EXPECT_EQ(u.dtype, dtypes::u8);
  BUILD(q, build::shape_op(Family::BaseFloat, OpKind::Base_Reshape, t(1, {2, 2}, qfloat_packed(0)),
                           std::vector<std::int64_t>{4}, id(2)));
}

TEST(Builders, InputsMustNotBeNotInit) {
  auto r = build::unary(Family::Float, OpKind::Float_Exp, t(1, {2}, dtypes::f32, TensorStatus::NotInit), id(2));
  EXPECT_ERR(r, ErrorCode::Invalid);
  EXPECT_EQ(message_of(r), "Float::Exp: input t1:f32[2] has status NotInit");
  EXPECT_ERR(build::binary(Family::NumericFloat, OpKind::Numeric_Add, t(1, {2}),
                           t(2, {2}, dtypes::f32, TensorStatus::NotInit), id(3)),
             ErrorCode::Invalid);
  BUILD(rw, build::unary(Family::Float, OpKind::Float_Exp, t(1, {2}, dtypes::f32, TensorStatus::ReadWrite), id(2)));
  EXPECT_EQ(rw.inputs()[0].status, TensorStatus::ReadWrite);
  EXPECT_EQ(out(rw).status, TensorStatus::NotInit);
}

TEST(Builders, OutputIdsMustBeFresh) {
  EXPECT_ERR(build::unary(Family::Float, OpKind::Float_Exp, t(1, {2}), id(1)), ErrorCode::Invalid);
  EXPECT_ERR(build::topk_with_indices(Family::NumericFloat, OpKind::Numeric_TopKWithIndices, t(1, {4}), 0, 2,
                                      dtypes::i64, id(2), id(2)),
             ErrorCode::Invalid);
}

TEST(Builders, OutputDtypeKindPicksTheBuilder) {
  // A comparison through a plain builder, and arithmetic through a comparison builder.
  EXPECT_ERR(build::binary(Family::NumericFloat, OpKind::Numeric_Greater, t(1, {2}), t(2, {2}), id(3)),
             ErrorCode::Invalid);
  EXPECT_ERR(build::binary_comparison(Family::NumericFloat, OpKind::Numeric_Add, t(1, {2}), t(2, {2}), kBool, id(3)),
             ErrorCode::Invalid);
  EXPECT_ERR(build::reduce_dim(Family::NumericFloat, OpKind::Numeric_ArgMax, t(1, {4, 5}), 1, 1, id(2)),
             ErrorCode::Invalid);
  EXPECT_ERR(build::reduce(Family::BaseFloat, OpKind::Base_All, t(1, {4}), id(2)), ErrorCode::Invalid);
  EXPECT_ERR(build::unary(Family::Float, OpKind::Float_IsNan, t(1, {4}), id(2)), ErrorCode::Invalid);
  // The explicit dtype must be of the right kind.
  EXPECT_ERR(
      build::binary_comparison(Family::NumericFloat, OpKind::Numeric_Greater, t(1, {2}), t(2, {2}), dtypes::f32, id(3)),
      ErrorCode::DTypeMismatch);
  EXPECT_ERR(
      build::reduce_dim_arg(Family::NumericFloat, OpKind::Numeric_ArgMax, t(1, {4, 5}), 1, 1, dtypes::f32, id(2)),
      ErrorCode::DTypeMismatch);
}

// Any convolution kind: x [1, 4, 5...], 2 groups, kernel 3 in every spatial dim, bias [6]; the
// gradients take output_grad of the forward's output shape ([1, 6, 3...], transposed [1, 6, 7...]).
Result<Operation> conv_any(OpKind kind, TensorId o) {
  const build::ConvKindInfo k = build::conv_kind_info(kind).value();
  Shape xs{1, 4}, ws{k.transposed ? 4u : 6u, k.transposed ? 3u : 2u}, gs{1, 6};
  build::ConvOptions opts{{}, {}, {}, {}, 2};
  for (std::size_t i = 0; i < k.rank; ++i) {
    xs.push_back(5);
    ws.push_back(3);
    gs.push_back(k.transposed ? 7 : 3);
    opts.stride.push_back(1);
    opts.padding.push_back(0);
    opts.dilation.push_back(1);
    if (k.transposed) opts.padding_out.push_back(0);
  }
  switch (k.role) {
    case build::ConvRole::Forward:
      return k.transposed ? build::conv_transpose(kind, t(1, xs), t(2, ws), t(3, {6}), opts, o)
                          : build::conv(kind, t(1, xs), t(2, ws), t(3, {6}), opts, o);
    case build::ConvRole::XBackward:
    case build::ConvRole::WeightBackward:
      return k.transposed ? build::conv_transpose_backward(kind, t(1, xs), t(2, ws), t(3, gs), opts, o)
                          : build::conv_backward(kind, t(1, xs), t(2, ws), t(3, gs), opts, o);
    case build::ConvRole::BiasBackward: return build::conv_bias_backward(kind, t(1, xs), t(2, {6}), t(3, gs), o);
  }
  return make_error(ErrorCode::Internal, "unreachable");
}

// A pool of docs/spec/ir.md §5.8 beyond MaxPool2d / AvgPool2d, by kind (the kind says the rank).
Result<Operation> build_pool(OpKind kind, TensorId o) {
  const TensorIr x1 = t(1, {1, 2, 5}), x2 = t(1, {1, 2, 5, 5}), x3 = t(1, {1, 2, 3, 4, 5});
  const build::MaxPool1dOptions m1{2, 2, 1, 1, false};  // [.., 5] → [.., 3]
  const build::MaxPool2dOptions m2{};                   // identity windows
  switch (kind) {
    case OpKind::Module_MaxPool1d: return build::max_pool1d(x1, m1, o);
    case OpKind::Module_MaxPool1dWithIndices: return build::max_pool1d_with_indices(x1, m1, dtypes::i64, o, id(11));
    case OpKind::Module_MaxPool2dWithIndices: return build::max_pool2d_with_indices(x2, m2, dtypes::i32, o, id(11));
    case OpKind::Module_MaxPool1dWithIndicesBackward:
      return build::max_pool1d_with_indices_backward(x1, t(2, {1, 2, 3}), t(3, {1, 2, 3}, dtypes::i64), m1, o);
    case OpKind::Module_MaxPool2dWithIndicesBackward:
      return build::max_pool2d_with_indices_backward(x2, t(2, {1, 2, 5, 5}), t(3, {1, 2, 5, 5}, dtypes::i64), m2, o);
    case OpKind::Module_AvgPool1d: return build::avg_pool1d(x1, build::AvgPool1dOptions{}, o);
    case OpKind::Module_AvgPool1dBackward:
      return build::avg_pool1d_backward(x1, t(2, {1, 2, 5}), build::AvgPool1dOptions{}, o);
    case OpKind::Module_AvgPool2dBackward:
      return build::avg_pool2d_backward(x2, t(2, {1, 2, 5, 5}), build::AvgPool2dOptions{}, o);
    case OpKind::Module_AdaptiveAvgPool1d: return build::adaptive_avg_pool1d(x1, 3, o);
    case OpKind::Module_AdaptiveAvgPool2d: return build::adaptive_avg_pool2d(x2, {3, 2}, o);
    case OpKind::Module_AdaptiveAvgPool3d: return build::adaptive_avg_pool3d(x3, {2, 3, 2}, o);
    case OpKind::Module_AdaptiveAvgPool1dBackward: return build::adaptive_avg_pool1d_backward(x1, t(2, {1, 2, 3}), o);
    case OpKind::Module_AdaptiveAvgPool2dBackward:
      return build::adaptive_avg_pool2d_backward(x2, t(2, {1, 2, 3, 2}), o);
    case OpKind::Module_AdaptiveAvgPool3dBackward:
      return build::adaptive_avg_pool3d_backward(x3, t(2, {1, 2, 2, 3, 2}), o);
    default: return make_error(ErrorCode::Internal, "not a pool");
  }
}

// A deformable convolution of x [1, 4, 5, 5] by weight [6, 2, 3, 3] (2 weight groups, 2 offset
// groups) with mask and bias: output [1, 6, 3, 3], offset [1, 36, 3, 3], mask [1, 18, 3, 3].
Result<Operation> deformable_any(OpKind kind, TensorId o) {
  build::DeformableConv2dOptions opts;
  opts.weight_groups = opts.offset_groups = 2;
  const TensorIr x = t(1, {1, 4, 5, 5}), offset = t(2, {1, 36, 3, 3}), weight = t(3, {6, 2, 3, 3}),
                 mask = t(4, {1, 18, 3, 3}), bias = t(5, {6});
  if (kind == OpKind::Module_DeformableConv2d) return build::deformable_conv2d(x, offset, weight, mask, bias, opts, o);
  return build::deformable_conv2d_backward(x, offset, weight, mask, bias, t(6, {1, 6, 3, 3}), opts,
                                           {o, id(11), id(12), id(13), id(14)});
}

// A world of one device, for the collectives that must name theirs.
const build::DeviceId kOneDevice[] = {{1, 0}};

// Every row of the op table can be built through the builder of its signature.
Result<Operation> build_any(OpKind kind) {
  const OpInfo& info = op_info(kind);
  Family f = Family::BaseFloat;
  DType d = dtypes::f32;
  switch (info.group) {
    case OpGroup::Numeric: f = Family::NumericFloat; break;
    case OpGroup::Float: f = Family::Float; break;
    case OpGroup::Int: f = Family::Int, d = dtypes::i32; break;
    case OpGroup::Bool: f = Family::Bool, d = kBool; break;
    case OpGroup::Activation: f = Family::Activation; break;
    default: break;
  }
  const bool cmp = info.has(kComparison);
  const bool index = info.has(kIndexOutput);
  const TensorIr x = t(1, {2, 3}, d);
  const TensorIr y = t(2, {2, 3}, d);
  const TensorIr idx = t(3, {2}, dtypes::i64);
  const TensorId o = id(10);
  const ScalarIr s = ScalarIr::Float(1);
  switch (info.signature) {
    case Signature::Unary: return cmp ? build::unary_comparison(f, kind, x, kBool, o) : build::unary(f, kind, x, o);
    case Signature::Binary:
      return cmp ? build::binary_comparison(f, kind, x, y, kBool, o) : build::binary(f, kind, x, y, o);
    case Signature::Scalar:
      return cmp ? build::scalar_comparison(f, kind, x, s, kBool, o) : build::scalar(f, kind, x, s, o);
    case Signature::Matmul: return build::matmul(f, kind, x, t(2, {3, 4}, d), o);
    case Signature::Cast: {
      if (kind == OpKind::Float_Dequantize) return build::dequantize(t(1, {2, 3}, DType::qfloat({})), dtypes::f16, o);
      DType target = dtypes::f16;
      if (kind == OpKind::Float_IntoInt || kind == OpKind::Bool_IntoInt) target = dtypes::i32;
      return build::cast(f, kind, x, target, o);
    }
    case Signature::Reduce: return cmp ? build::reduce_bool(f, kind, x, kBool, o) : build::reduce(f, kind, x, o);
    case Signature::ReduceDim:
      if (cmp) return build::reduce_dim_bool(f, kind, x, 1, 1, kBool, o);
      if (index) return build::reduce_dim_arg(f, kind, x, 1, 1, dtypes::i64, o);
      return build::reduce_dim(f, kind, x, 1, 1, o);
    case Signature::Dim: return build::dim(f, kind, x, 0, o);
    case Signature::ShapeOp:
      return build::shape_op(
          f, kind, x, kind == OpKind::Base_Reshape ? std::vector<std::int64_t>{6} : std::vector<std::int64_t>{4, 2, 3},
          o);
    case Signature::SwapDims: return build::swap_dims(f, kind, x, 0, 1, o);
    case Signature::Permute: return build::permute(f, kind, x, std::vector<std::uint64_t>{1, 0}, o);
    case Signature::Flip: return build::flip(f, kind, x, std::vector<std::uint64_t>{1}, o);
    case Signature::Creation: return build::creation(f, kind, {2}, d, o);
    case Signature::Full: return build::full(f, kind, {2}, d, s, o);
    case Signature::Random: return build::random(f, kind, {2}, d, DistributionIr::normal(0, 1), o);
    case Signature::Init: return build::init({2}, d, o);
    case Signature::Gather: return build::gather(f, kind, x, 1, t(3, {2, 2}, dtypes::i64), o);
    case Signature::Scatter: return build::scatter(f, kind, x, 1, t(3, {2, 2}, dtypes::i64), y, IndexingUpdate::Add, o);
    case Signature::Select: return build::select(f, kind, x, 0, idx, o);
    case Signature::SelectAssign: return build::select_assign(f, kind, x, 0, idx, y, IndexingUpdate::Assign, o);
    case Signature::Slice: return build::slice(f, kind, x, std::vector<Slice>{Slice{0, 1, 1}}, o);
    case Signature::SliceAssign: return build::slice_assign(f, kind, x, std::vector<Slice>{Slice{0, 1, 1}}, y, o);
    case Signature::MaskWhere: return build::mask_where(f, kind, x, t(3, {2, 3}, kBool), y, o);
    case Signature::MaskFill: return build::mask_fill(f, kind, x, t(3, {2, 3}, kBool), s, o);
    case Signature::Clamp: return build::clamp(f, kind, x, s, s, o);
    case Signature::RepeatDim: return build::repeat_dim(f, kind, x, 0, 2, o);
    case Signature::Cat: return build::cat(f, kind, std::vector<TensorIr>{x, y}, 0, o);
    case Signature::ReduceDimWithIndices: return build::reduce_dim_with_indices(f, kind, x, 1, dtypes::i64, o, id(11));
    case Signature::TopKWithIndices: return build::topk_with_indices(f, kind, x, 1, 2, dtypes::i64, o, id(11));
    case Signature::Sort:
      return index ? build::sort_arg(f, kind, x, 1, true, dtypes::i64, o) : build::sort(f, kind, x, 1, false, o);
    case Signature::SortWithIndices: return build::sort_with_indices(f, kind, x, 0, true, dtypes::i64, o, id(11));
    case Signature::Unfold: return build::unfold(f, kind, x, 1, 2, 1, o);
    case Signature::ScatterNd:
      return build::scatter_nd(f, kind, x, t(3, {2, 1}, dtypes::i64), y, IndexingUpdate::Add, o);
    case Signature::Cross: return build::cross(f, kind, x, t(2, {1, 3}, d), 1, o);
    case Signature::HardSigmoid: return build::hard_sigmoid(x, ScalarIr::Float(0.2), ScalarIr::Float(0.5), o);
    case Signature::GatherNd: return build::gather_nd(f, kind, x, t(3, {4, 1}, dtypes::i64), o);
    case Signature::Conv:
    case Signature::ConvTranspose: return conv_any(kind, o);
    case Signature::MaxPool2d: return build::max_pool2d(t(1, {1, 2, 5, 5}), build::MaxPool2dOptions{}, o);
    case Signature::AvgPool2d: return build::avg_pool2d(t(1, {1, 2, 5, 5}), build::AvgPool2dOptions{}, o);
    case Signature::Embedding: return build::embedding(t(1, {10, 4}), t(3, {2, 3}, dtypes::i64), o);
    case Signature::Pad: return build::pad(f, kind, x, std::vector<build::PadPair>{{1, 1}}, PadMode::Constant, s, o);
    case Signature::AllReduce: return build::all_reduce(x, ReduceOperation::Sum, {}, o);
    case Signature::Broadcast: return build::broadcast(x, 0, {}, o);
    case Signature::AllGather: return build::all_gather(x, 0, kOneDevice, o);
    case Signature::ReduceScatter: return build::reduce_scatter(x, ReduceOperation::Sum, 0, kOneDevice, o);
    case Signature::SyncCollective: return build::sync_collective();
    case Signature::Custom:
      return build::custom("c", std::vector<TensorIr>{x}, std::vector<TensorIr>{TensorIr::uninit(o, {1}, d)}, {});
    case Signature::Linear: return build::linear(t(1, {2, 3}), t(2, {3, 4}), t(3, {4}), o);
    case Signature::LinearBackward:
      return kind == OpKind::Module_LinearXBackward ? build::linear_x_backward(t(1, {3, 4}), t(2, {2, 4}), o)
                                                    : build::linear_weight_backward(t(1, {2, 3}), t(2, {2, 4}), o);
    case Signature::LinearBiasBackward: return build::linear_bias_backward(t(1, {2, 4}), o);
    case Signature::LayerNorm: return build::layer_norm(t(1, {2, 3}), t(2, {3}), t(3, {3}), 1e-5, o);
    case Signature::BatchNorm:
      return build::batch_norm(t(1, {2, 3, 4}), t(2, {3}), t(3, {3}), t(4, {3}), t(5, {3}), 1e-5, o);
    case Signature::EmbeddingBackward:
      return build::embedding_backward(t(1, {10, 4}), t(2, {2, 3, 4}), t(3, {2, 3}, dtypes::i64), o);
    case Signature::MaxPool:
    case Signature::MaxPoolWithIndices:
    case Signature::MaxPoolWithIndicesBackward:
    case Signature::AvgPool:
    case Signature::AvgPoolBackward:
    case Signature::AdaptiveAvgPool:
    case Signature::AdaptiveAvgPoolBackward: return build_pool(kind, o);
    case Signature::Drop: return build::drop(t(1, {2}, d, TensorStatus::ReadWrite));
    case Signature::ConvBackward:
    case Signature::ConvTransposeBackward:
    case Signature::ConvBiasBackward: return conv_any(kind, o);
    case Signature::GridSample2d: return build::grid_sample_2d(t(1, {1, 2, 4, 4}), t(2, {1, 3, 3, 2}), {}, o);
    case Signature::Interpolate:
      return build::interpolate(t(1, {1, 2, 4, 4}), {3, 5}, {InterpolateMode::Bilinear, false}, o);
    case Signature::InterpolateBackward:
      return build::interpolate_backward(t(1, {1, 2, 4, 4}), t(2, {1, 2, 3, 5}), {3, 5}, {}, o);
    case Signature::Unfold4d: return build::unfold4d(t(1, {1, 2, 4, 4}), {2, 2}, {}, o);
    case Signature::Rfft: return build::rfft(t(1, {2, 8}), 1, std::nullopt, o, id(11));
    case Signature::IRfft: return build::irfft(t(1, {2, 5}), t(2, {2, 5}), 1, std::nullopt, o);
    case Signature::Attention:
      return build::attention(t(1, {1, 2, 3, 4}), t(2, {1, 2, 5, 4}), t(3, {1, 2, 5, 6}), t(4, {1, 1, 3, 5}, kBool),
                              t(5, {1, 2, 3, 5}), {0.5, 2.0, true}, o);
    case Signature::CtcLoss:
      return build::ctc_loss(t(1, {6, 2, 4}), t(2, {2, 3}, dtypes::i64), t(3, {2}, dtypes::i64), t(4, {2}, dtypes::i32),
                             0, o);
    case Signature::CtcLossBackward:
      return build::ctc_loss_backward(t(1, {6, 2, 4}), t(2, {2, 3}, dtypes::i64), t(3, {2}, dtypes::i64),
                                      t(4, {2}, dtypes::i32), t(5, {2}), 0, o);
    case Signature::DeformableConv2d:
    case Signature::DeformableConv2dBackward: return deformable_any(kind, o);
    case Signature::Quantize: return build::quantize(x, t(2, {1}), t(3, {1}), QuantScheme{}, o);
  }
  return make_error(ErrorCode::Internal, "unreachable");
}

TEST(Builders, EveryKindInTheTableBuilds) {
  for (int i = 0; i < kNumOpKinds; ++i) {
    const auto kind = static_cast<OpKind>(i);
    auto r = build_any(kind);
    ASSERT_TRUE(r.ok()) << op_info(kind).variant << ": " << r.error().to_string();
    EXPECT_EQ(r->kind, kind);
    Status st = r->validate();
    EXPECT_TRUE(st.ok()) << (st.ok() ? "" : st.error().to_string());
    EXPECT_EQ(r->info().group, op_info(kind).group);
  }
}

// The executors' decoders read back what the builders stored: every windowed pool's and every
// convolution's options, from the op built with them; a damaged attribute list is refused with
// the value named.
TEST(Builders, PoolAndConvAttributesReadBackAsBuilt) {
  std::size_t pools = 0, convs = 0;
  for (int i = 0; i < kNumOpKinds; ++i) {
    const auto kind = static_cast<OpKind>(i);
    SCOPED_TRACE(std::string(op_info(kind).variant));
    const Result<Operation> op = build_any(kind);
    ASSERT_TRUE(op.ok());
    const Result<build::PoolAttrs> pool = build::pool_attrs_of(*op);
    const Signature sig = op->info().signature;
    const bool adaptive = sig == Signature::AdaptiveAvgPool || sig == Signature::AdaptiveAvgPoolBackward;
    if (build::pool_spatial_dims(kind) != 0 && !adaptive) {
      ASSERT_TRUE(pool.ok()) << pool.error().to_string();
      ++pools;
      EXPECT_EQ(pool->spatial, build::pool_spatial_dims(kind));
      // The attributes again from the decoded window, in op_table.h's order.
      std::vector<std::int64_t> again;
      for (const auto* field : {&pool->kernel, &pool->stride, &pool->padding, &pool->dilation}) {
        if (field == &pool->dilation && !pool->dilated) continue;
        for (std::size_t d = 0; d < pool->spatial; ++d) again.push_back(static_cast<std::int64_t>((*field)[d]));
      }
      if (!pool->dilated) again.push_back(pool->count_include_pad ? 1 : 0);
      again.push_back(pool->ceil_mode ? 1 : 0);
      EXPECT_EQ(std::vector<std::int64_t>(op->attrs.begin(), op->attrs.end()), again);
      Operation bad = *op;
      bad.attrs[0] = 0;  // kernel 0
      ASSERT_FALSE(build::pool_attrs_of(bad).ok());
      EXPECT_EQ(build::pool_attrs_of(bad).error().message, "kernel size must be at least 1, got 0");
      bad.attrs.push_back(1);
      EXPECT_FALSE(build::pool_attrs_of(bad).ok());
    } else {
      EXPECT_FALSE(pool.ok());
    }
    const std::optional<build::ConvKindInfo> k = build::conv_kind_info(kind);
    const Result<build::ConvOptions> conv = build::conv_options_of(*op);
    if (k && k->role != build::ConvRole::BiasBackward) {
      ASSERT_TRUE(conv.ok()) << conv.error().to_string();
      ++convs;
      std::vector<std::int64_t> again;
      for (const auto* list : {&conv->stride, &conv->padding, &conv->padding_out, &conv->dilation}) {
        if (list != &conv->padding_out) {
          EXPECT_EQ(list->size(), k->rank);
        }
        for (std::uint64_t v : *list) again.push_back(static_cast<std::int64_t>(v));
      }
      again.push_back(static_cast<std::int64_t>(conv->groups));
      EXPECT_EQ(std::vector<std::int64_t>(op->attrs.begin(), op->attrs.end()), again);
      Operation bad = *op;
      bad.attrs.back() = 0;
      ASSERT_FALSE(build::conv_options_of(bad).ok());
      EXPECT_EQ(build::conv_options_of(bad).error().message, "groups must be at least 1, got 0");
    } else {
      EXPECT_FALSE(conv.ok());
    }
  }
  EXPECT_EQ(pools, 10u);  // MaxPool1d/2d, with indices and their backwards, AvgPool1d/2d and theirs
  EXPECT_EQ(convs, 15u);  // Conv1-3d and their X and Weight gradients, ConvTranspose1-3d and theirs
}

// ============================ per signature ============================

TEST(BuildUnary, KeepsShapeAndDtype) {
  BUILD(exp, build::unary(Family::Float, OpKind::Float_Exp, t(1, {2, 3}, dtypes::bf16), id(2)));
  EXPECT_EQ(out(exp), TensorIr::uninit(id(2), {2, 3}, dtypes::bf16));
  EXPECT_EQ(exp.dtype, dtypes::bf16);
  EXPECT_EQ(exp.kind_name(), "Float::Exp");
  BUILD(abs, build::unary(Family::NumericInt, OpKind::Numeric_Abs, t(1, {}, dtypes::i32), id(2)));
  EXPECT_EQ(out(abs), TensorIr::uninit(id(2), {}, dtypes::i32));
  EXPECT_EQ(abs.dtype, dtypes::i32);
  BUILD(bnot, build::unary(Family::Int, OpKind::Int_BitwiseNot, t(1, {4}, dtypes::i64), id(2)));
  EXPECT_EQ(bnot.dtype, DType{});  // Int carries no dtype
  BUILD(lnot, build::unary(Family::Bool, OpKind::Bool_Not, t(1, {4}, DType::boolean(BoolStore::U8)), id(2)));
  EXPECT_EQ(out(lnot).dtype, DType::boolean(BoolStore::U8));
}

TEST(BuildUnary, ComparisonIsNan) {
  BUILD(op, build::unary_comparison(Family::Float, OpKind::Float_IsNan, t(1, {3}, dtypes::f16),
                                    DType::boolean(BoolStore::U32), id(2)));
  EXPECT_EQ(out(op), TensorIr::uninit(id(2), {3}, DType::boolean(BoolStore::U32)));
  EXPECT_EQ(op.dtype, dtypes::f16);
}

TEST(BuildBinary, BoolIntAndBaseEqual) {
  BUILD(band, build::binary(Family::Bool, OpKind::Bool_And, t(1, {2, 1}, kBool), t(2, {2, 3}, kBool), id(3)));
  EXPECT_EQ(out(band), TensorIr::uninit(id(3), {2, 3}, kBool));
  BUILD(shl, build::binary(Family::Int, OpKind::Int_BitwiseLeftShift, t(1, {2}, dtypes::i32), t(2, {2}, dtypes::i32),
                           id(3)));
  EXPECT_EQ(out(shl).dtype, dtypes::i32);
  // Equal of two bool tensors outputs D(lhs) (docs/spec/ir.md §5.11): the caller passes it.
  const DType b8 = DType::boolean(BoolStore::U8);
  BUILD(eq, build::binary_comparison(Family::BaseBool, OpKind::Base_Equal, t(1, {2}, b8), t(2, {2}, b8), b8, id(3)));
  EXPECT_EQ(out(eq).dtype, b8);
  EXPECT_EQ(eq.dtype, DType{});  // Base* carries no dtype
  EXPECT_ERR(build::binary(Family::Int, OpKind::Int_BitwiseAnd, t(1, {2}, dtypes::i32), t(2, {2}, dtypes::i64), id(3)),
             ErrorCode::DTypeMismatch);
}

// The float trigonometric / hyperbolic kinds and ArcTan2 / Hypot (docs/spec/ir.md §5.6): Unary and
// Binary rows of the Float group, untagged; the table-driven builders infer and check them.
TEST(BuildFloatFunctions, TrigonometricKindsAtan2AndHypot) {
  const OpKind unary[] = {OpKind::Float_Cosh,    OpKind::Float_Sinh,    OpKind::Float_Tan,
                          OpKind::Float_ArcCos,  OpKind::Float_ArcCosh, OpKind::Float_ArcSin,
                          OpKind::Float_ArcSinh, OpKind::Float_ArcTan,  OpKind::Float_ArcTanh};
  for (OpKind k : unary) {
    EXPECT_EQ(op_info(k).signature, Signature::Unary) << op_info(k).variant;
    EXPECT_EQ(op_info(k).tags, kNone) << op_info(k).variant;
    BUILD(op, build::unary(Family::Float, k, t(1, {2, 3}, dtypes::f16), id(2)));
    EXPECT_EQ(out(op), TensorIr::uninit(id(2), {2, 3}, dtypes::f16));
    EXPECT_EQ(op.dtype, dtypes::f16);
    EXPECT_EQ(op.kind_name(), "Float::" + std::string(op_info(k).variant));
    // Float only, in the Float family only.
    EXPECT_ERR(build::unary(Family::Float, k, t(1, {2}, dtypes::i32), id(2)), ErrorCode::DTypeMismatch);
    EXPECT_ERR(build::unary(Family::NumericFloat, k, t(1, {2}), id(2)), ErrorCode::Invalid);
  }
  for (OpKind k : {OpKind::Float_ArcTan2, OpKind::Float_Hypot}) {
    EXPECT_EQ(op_info(k).signature, Signature::Binary);
    EXPECT_EQ(op_info(k).tags, kNone);
    BUILD(op, build::binary(Family::Float, k, t(1, {2, 1}, dtypes::bf16), t(2, {1, 3}, dtypes::bf16), id(3)));
    EXPECT_EQ(out(op), TensorIr::uninit(id(3), {2, 3}, dtypes::bf16));
    EXPECT_ERR(build::binary(Family::Float, k, t(1, {2}), t(2, {2}, dtypes::f64), id(3)), ErrorCode::DTypeMismatch);
    EXPECT_ERR(build::binary(Family::Float, k, t(1, {2}), t(2, {3}), id(3)), ErrorCode::IncompatibleDims);
    EXPECT_ERR(build::binary(Family::Float, k, t(1, {2}, dtypes::i64), t(2, {2}, dtypes::i64), id(3)),
               ErrorCode::DTypeMismatch);
  }
  const auto r = build::binary(Family::Float, OpKind::Float_ArcTan2, t(1, {2}), t(2, {2}, dtypes::f64), id(3));
  EXPECT_NE(message_of(r).find("Float::ArcTan2"), std::string::npos) << message_of(r);
}

TEST(BuildScalar, StoresTheScalar) {
  BUILD(op, build::scalar(Family::NumericFloat, OpKind::Numeric_MulScalar, t(1, {2, 3}), ScalarIr::Float(-1), id(2)));
  EXPECT_EQ(out(op), TensorIr::uninit(id(2), {2, 3}, dtypes::f32));
  ASSERT_EQ(op.scalars.size(), 1u);
  EXPECT_EQ(op.scalars[0], ScalarIr::Float(-1));
  BUILD(cmp, build::scalar_comparison(Family::NumericInt, OpKind::Numeric_LowerEqualElem, t(1, {5}, dtypes::i32),
                                      ScalarIr::Int(0), kBool, id(2)));
  EXPECT_EQ(out(cmp).dtype, kBool);
  EXPECT_EQ(cmp.dtype, dtypes::i32);
  BUILD(eq, build::scalar_comparison(Family::BaseFloat, OpKind::Base_EqualElem, t(1, {5}), ScalarIr::Float(1), kBool,
                                     id(2)));
  EXPECT_ERR(build::scalar(Family::BaseFloat, OpKind::Base_EqualElem, t(1, {5}), ScalarIr::Float(1), id(2)),
             ErrorCode::Invalid);
}

TEST(BuildCast, TargetKindPerOp) {
  BUILD(f2f, build::cast(Family::BaseFloat, OpKind::Base_Cast, t(1, {2}), dtypes::f16, id(2)));
  EXPECT_EQ(out(f2f).dtype, dtypes::f16);
  BUILD(i2i, build::cast(Family::BaseInt, OpKind::Base_Cast, t(1, {2}, dtypes::i64), dtypes::u8, id(2)));
  EXPECT_EQ(out(i2i).dtype, dtypes::u8);
  BUILD(f2i, build::cast(Family::Float, OpKind::Float_IntoInt, t(1, {2}, dtypes::f16), dtypes::i32, id(2)));
  EXPECT_EQ(out(f2i).dtype, dtypes::i32);
  EXPECT_EQ(f2i.dtype, dtypes::f16);  // IntoInt carries the input dtype
  BUILD(i2f, build::cast(Family::Int, OpKind::Int_IntoFloat, t(1, {2}, dtypes::i32), dtypes::f32, id(2)));
  BUILD(b2i, build::cast(Family::Bool, OpKind::Bool_IntoInt, t(1, {2}, kBool), dtypes::i64, id(2)));
  BUILD(b2f, build::cast(Family::Bool, OpKind::Bool_IntoFloat, t(1, {2}, kBool), dtypes::f32, id(2)));
  auto r = build::cast(Family::BaseFloat, OpKind::Base_Cast, t(1, {2}), dtypes::i32, id(2));
  EXPECT_ERR(r, ErrorCode::DTypeMismatch);
  EXPECT_EQ(message_of(r), "BaseFloat::Cast: cannot cast f32 to i32: the target must be a float dtype");
  EXPECT_ERR(build::cast(Family::Float, OpKind::Float_IntoInt, t(1, {2}), dtypes::f64, id(2)),
             ErrorCode::DTypeMismatch);
  EXPECT_ERR(build::cast(Family::Bool, OpKind::Bool_IntoFloat, t(1, {2}, kBool), dtypes::i32, id(2)),
             ErrorCode::DTypeMismatch);
  EXPECT_ERR(build::cast(Family::Int, OpKind::Int_IntoFloat, t(1, {2}), dtypes::f32, id(2)), ErrorCode::DTypeMismatch);
}

TEST(BuildClampMask, ShapesAndDtypes) {
  BUILD(cl, build::clamp(Family::NumericFloat, OpKind::Numeric_Clamp, t(1, {3}), ScalarIr::Float(0), ScalarIr::Float(6),
                         id(2)));
  EXPECT_EQ(cl.scalars, (ScalarList{ScalarIr::Float(0), ScalarIr::Float(6)}));
  EXPECT_EQ(out(cl).shape, (Shape{3}));

  BUILD(mw, build::mask_where(Family::BaseFloat, OpKind::Base_MaskWhere, t(1, {1, 3}), t(2, {2, 1}, kBool),
                              t(3, {2, 3}), id(4)));
  EXPECT_EQ(out(mw), TensorIr::uninit(id(4), {2, 3}, dtypes::f32));
  EXPECT_EQ(mw.num_inputs, 3);
  EXPECT_EQ(mw.inputs()[1].id, id(2));
  EXPECT_ERR(build::mask_where(Family::BaseFloat, OpKind::Base_MaskWhere, t(1, {3}), t(2, {3}), t(3, {3}), id(4)),
             ErrorCode::DTypeMismatch);
  EXPECT_ERR(build::mask_where(Family::BaseFloat, OpKind::Base_MaskWhere, t(1, {3}), t(2, {3}, kBool),
                               t(3, {3}, dtypes::f16), id(4)),
             ErrorCode::DTypeMismatch);
  EXPECT_ERR(
      build::mask_where(Family::BaseFloat, OpKind::Base_MaskWhere, t(1, {3}), t(2, {2}, kBool), t(3, {3}), id(4)),
      ErrorCode::IncompatibleDims);

  BUILD(mf, build::mask_fill(Family::BaseInt, OpKind::Base_MaskFill, t(1, {4, 1}, dtypes::i32), t(2, {4, 5}, kBool),
                             ScalarIr::Int(7), id(3)));
  EXPECT_EQ(out(mf), TensorIr::uninit(id(3), {4, 5}, dtypes::i32));
  EXPECT_EQ(mf.scalars, (ScalarList{ScalarIr::Int(7)}));
  EXPECT_ERR(build::mask_fill(Family::BaseInt, OpKind::Base_MaskFill, t(1, {4}, dtypes::i32), t(2, {4}, dtypes::i32),
                              ScalarIr::Int(7), id(3)),
             ErrorCode::DTypeMismatch);
}

TEST(BuildMatmul, MixedRulesAndExplicitDtype) {
  BUILD(ff, build::matmul(Family::Float, OpKind::Float_Matmul, t(1, {2, 3}, dtypes::f16), t(2, {3, 4}), id(3)));
  EXPECT_EQ(out(ff).dtype, dtypes::f16);  // mixed = lhs's dtype
  const DType q = qfloat_packed(1);
  BUILD(fq, build::matmul(Family::Float, OpKind::Float_Matmul, t(1, {2, 3}), t(2, {3, 4}, q), id(3)));
  EXPECT_EQ(out(fq).dtype, dtypes::f32);
  BUILD(mixed,
        build::matmul_mixed(Family::Float, OpKind::Float_Matmul, t(1, {2, 3}, q), t(2, {3, 4}), dtypes::f32, id(3)));
  EXPECT_EQ(out(mixed).dtype, dtypes::f32);
  EXPECT_EQ(mixed.dtype, q);
  BUILD(ii,
        build::matmul(Family::Int, OpKind::Int_Matmul, t(1, {2, 3}, dtypes::i32), t(2, {3, 4}, dtypes::i32), id(3)));
  EXPECT_EQ(out(ii).dtype, dtypes::i32);
  EXPECT_ERR(
      build::matmul(Family::Int, OpKind::Int_Matmul, t(1, {2, 3}, dtypes::i32), t(2, {3, 4}, dtypes::i64), id(3)),
      ErrorCode::DTypeMismatch);
  EXPECT_ERR(build::matmul_mixed(Family::Float, OpKind::Float_Matmul, t(1, {2, 3}), t(2, {3, 4}), dtypes::i32, id(3)),
             ErrorCode::DTypeMismatch);
  EXPECT_ERR(build::matmul(Family::Float, OpKind::Float_Matmul, t(1, {2, 3, 4}), t(2, {3, 4, 5}), id(3)),
             ErrorCode::IncompatibleDims);
}

// Float Cross{lhs, rhs, dim} (docs/spec/ir.md §6.3): broadcast(lhs, rhs), same dtypes; the dim
// holds the 3-vectors in both operands, so it is never broadcast.
TEST(BuildCross, BroadcastsAroundADimOfSizeThree) {
  BUILD(c, build::cross(Family::Float, OpKind::Float_Cross, t(1, {4, 3}, dtypes::f16), t(2, {1, 3}, dtypes::f16), 1,
                        id(3)));
  EXPECT_EQ(out(c), TensorIr::uninit(id(3), {4, 3}, dtypes::f16));
  EXPECT_EQ(c.attrs, (AttrList{1}));
  EXPECT_EQ(c.dtype, dtypes::f16);
  EXPECT_EQ(c.kind_name(), "Float::Cross");
  BUILD(c0, build::cross(Family::Float, OpKind::Float_Cross, t(1, {3, 1, 2}), t(2, {3, 5, 1}), 0, id(3)));
  EXPECT_EQ(out(c0).shape, (Shape{3, 5, 2}));
  EXPECT_EQ(c0.attrs, (AttrList{0}));
  // Errors name the op and the values.
  auto r = build::cross(Family::Float, OpKind::Float_Cross, t(1, {4, 2}), t(2, {4, 2}), 1, id(3));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::IncompatibleShapes);
  EXPECT_EQ(message_of(r), "Float::Cross: dim 1 must have size 3 in both operands ([4,2] x [4,2])");
  // A dim of size 1 in one operand would broadcast, but it is not a 3-vector.
  EXPECT_ERR(build::cross(Family::Float, OpKind::Float_Cross, t(1, {2, 3}), t(2, {2, 1}), 1, id(3)),
             ErrorCode::IncompatibleShapes);
  r = build::cross(Family::Float, OpKind::Float_Cross, t(1, {2, 3}), t(2, {2, 3}), 2, id(3));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::OutOfBounds);
  EXPECT_EQ(message_of(r), "Float::Cross: dim 2 out of bounds for rank 2 ([2,3])");
  EXPECT_ERR(build::cross(Family::Float, OpKind::Float_Cross, t(1, {2, 3}), t(2, {3}), 1, id(3)),
             ErrorCode::RankMismatch);
  EXPECT_ERR(build::cross(Family::Float, OpKind::Float_Cross, t(1, {2, 3}), t(2, {4, 3}), 1, id(3)),
             ErrorCode::IncompatibleDims);
  EXPECT_ERR(build::cross(Family::Float, OpKind::Float_Cross, t(1, {3}), t(2, {3}, dtypes::f64), 0, id(3)),
             ErrorCode::DTypeMismatch);
  // Float only: an integer operand, a Numeric family, another signature's kind.
  EXPECT_ERR(build::cross(Family::Float, OpKind::Float_Cross, t(1, {3}, dtypes::i32), t(2, {3}, dtypes::i32), 0, id(3)),
             ErrorCode::DTypeMismatch);
  EXPECT_ERR(build::cross(Family::NumericFloat, OpKind::Float_Cross, t(1, {3}), t(2, {3}), 0, id(3)),
             ErrorCode::Invalid);
  EXPECT_ERR(build::cross(Family::Float, OpKind::Float_Matmul, t(1, {3}), t(2, {3}), 0, id(3)), ErrorCode::Invalid);
}

// The Activation group (docs/spec/ir.md §5.9): the table-driven builders take its Unary, Binary,
// Scalar and Dim kinds with Family::Activation (float operands, no carried dtype); HardSigmoid has
// its own builder. Shapes and dtypes as §6.3 (Binary broadcasts, Dim keeps the input's).
TEST(BuildActivation, TheGroupsKindsAndHardSigmoid) {
  const Family a = Family::Activation;
  BUILD(relu, build::unary(a, OpKind::Activation_Relu, t(1, {2, 3}, dtypes::bf16), id(2)));
  EXPECT_EQ(out(relu), TensorIr::uninit(id(2), {2, 3}, dtypes::bf16));
  EXPECT_EQ(relu.dtype, DType{});  // the Activation family carries no dtype
  EXPECT_EQ(relu.kind_name(), "Activation::Relu");
  // Backward ops: {output or input, grad}, broadcasting as every Binary kind.
  BUILD(back, build::binary(a, OpKind::Activation_SigmoidBackward, t(1, {2, 1}), t(2, {1, 3}), id(3)));
  EXPECT_EQ(out(back), TensorIr::uninit(id(3), {2, 3}, dtypes::f32));
  EXPECT_EQ(back.inputs()[1].id, id(2));
  BUILD(prelu, build::binary(a, OpKind::Activation_PRelu, t(1, {4, 3}, dtypes::f16), t(2, {1, 3}, dtypes::f16), id(3)));
  EXPECT_EQ(out(prelu).shape, (Shape{4, 3}));
  BUILD(leaky, build::scalar(a, OpKind::Activation_LeakyRelu, t(1, {5}), ScalarIr::Float(0.01), id(2)));
  EXPECT_EQ(leaky.scalars, (ScalarList{ScalarIr::Float(0.01)}));
  BUILD(soft, build::dim(a, OpKind::Activation_LogSoftmax, t(1, {2, 3}, dtypes::f64), 1, id(2)));
  EXPECT_EQ(out(soft), TensorIr::uninit(id(2), {2, 3}, dtypes::f64));
  EXPECT_EQ(soft.attrs, (AttrList{1}));
  BUILD(hs, build::hard_sigmoid(t(1, {2, 2}, dtypes::f16), ScalarIr::Float(0.2), ScalarIr::Float(0.5), id(2)));
  EXPECT_EQ(out(hs), TensorIr::uninit(id(2), {2, 2}, dtypes::f16));
  EXPECT_EQ(hs.scalars, (ScalarList{ScalarIr::Float(0.2), ScalarIr::Float(0.5)}));
  EXPECT_EQ(hs.kind_name(), "Activation::HardSigmoid");
  EXPECT_TRUE(hs.attrs.empty());
  // Errors name the op and the values.
  auto r = build::unary(a, OpKind::Activation_Gelu, t(1, {3}, dtypes::i32), id(2));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::DTypeMismatch);
  EXPECT_EQ(message_of(r), "Activation::Gelu: family Activation does not apply to operand dtype i32");
  r = build::dim(a, OpKind::Activation_Softmax, t(1, {2, 3}), 2, id(2));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(message_of(r), "Activation::Softmax: axis 2 out of bounds for rank 2 ([2,3])");
  EXPECT_ERR(build::hard_sigmoid(t(1, {3}, kBool), ScalarIr::Float(0.2), ScalarIr::Float(0.5), id(2)),
             ErrorCode::DTypeMismatch);
  EXPECT_ERR(build::binary(a, OpKind::Activation_ReluBackward, t(1, {3}), t(2, {3}, dtypes::f16), id(3)),
             ErrorCode::DTypeMismatch);
  EXPECT_ERR(build::binary(a, OpKind::Activation_GeluBackward, t(1, {2, 3}), t(2, {3, 2}), id(3)),
             ErrorCode::IncompatibleDims);
  // The group admits only its family, and the family only its group's kinds.
  EXPECT_ERR(build::unary(Family::Float, OpKind::Activation_Sigmoid, t(1, {3}), id(2)), ErrorCode::Invalid);
  EXPECT_ERR(build::unary(a, OpKind::Float_Exp, t(1, {3}), id(2)), ErrorCode::Invalid);
  EXPECT_ERR(build::unary(a, OpKind::Activation_Softmax, t(1, {3}), id(2)), ErrorCode::Invalid);  // a Dim kind
  EXPECT_ERR(build::hard_sigmoid(t(1, {3}), ScalarIr::Float(0.2), ScalarIr::Float(0.5), id(1)), ErrorCode::Invalid);
}

TEST(BuildReduce, FullReductions) {
  BUILD(sum, build::reduce(Family::NumericFloat, OpKind::Numeric_Sum, t(1, {3, 4}), id(2)));
  EXPECT_EQ(out(sum), TensorIr::uninit(id(2), {1}, dtypes::f32));
  BUILD(scalar_in, build::reduce(Family::NumericInt, OpKind::Numeric_Max, t(1, {}, dtypes::i32), id(2)));
  EXPECT_EQ(out(scalar_in).shape, (Shape{1}));
  BUILD(all, build::reduce_bool(Family::BaseFloat, OpKind::Base_All, t(1, {3, 4}), kBool, id(2)));
  EXPECT_EQ(out(all), TensorIr::uninit(id(2), {1}, kBool));
}

TEST(BuildReduceDim, AxesIndexAndBoolOutputs) {
  BUILD(am, build::reduce_dim_arg(Family::NumericFloat, OpKind::Numeric_ArgMax, t(1, {4, 5}, dtypes::f16), 0, 1,
                                  dtypes::i32, id(2)));
  EXPECT_EQ(out(am), TensorIr::uninit(id(2), {1, 5}, dtypes::i32));
  EXPECT_EQ(am.dtype, dtypes::f16);  // ArgMax carries the input dtype
  BUILD(any,
        build::reduce_dim_bool(Family::BaseInt, OpKind::Base_AnyDim, t(1, {4, 5}, dtypes::i32), 1, 1, kBool, id(2)));
  EXPECT_EQ(out(any), TensorIr::uninit(id(2), {4, 1}, kBool));
  EXPECT_ERR(build::reduce_dim(Family::NumericFloat, OpKind::Numeric_SumDim, t(1, {4, 5}), 2, 1, id(2)),
             ErrorCode::OutOfBounds);
  EXPECT_ERR(build::reduce_dim(Family::NumericFloat, OpKind::Numeric_SumDim, t(1, {4, 5}), 1, 0, id(2)),
             ErrorCode::Invalid);
  auto r = build::reduce_dim(Family::NumericFloat, OpKind::Numeric_MeanDim, t(1, {4, 5}), 7, 1, id(2));
  EXPECT_EQ(message_of(r), "NumericFloat::MeanDim: axis 7 out of bounds for rank 2 ([4,5])");
}

TEST(BuildDim, CumSum) {
  BUILD(op, build::dim(Family::NumericFloat, OpKind::Numeric_CumSum, t(1, {4, 5}), 1, id(2)));
  EXPECT_EQ(out(op), TensorIr::uninit(id(2), {4, 5}, dtypes::f32));
  EXPECT_EQ(op.attrs, (AttrList{1}));
  EXPECT_ERR(build::dim(Family::NumericFloat, OpKind::Numeric_CumSum, t(1, {4, 5}), 2, id(2)), ErrorCode::OutOfBounds);
}

TEST(BuildWithIndices, MaxDimAndTopK) {
  BUILD(op, build::reduce_dim_with_indices(Family::NumericInt, OpKind::Numeric_MaxDimWithIndices,
                                           t(1, {4, 5}, dtypes::i32), 0, dtypes::i64, id(2), id(3)));
  EXPECT_EQ(out(op, 0), TensorIr::uninit(id(2), {1, 5}, dtypes::i32));
  EXPECT_EQ(out(op, 1), TensorIr::uninit(id(3), {1, 5}, dtypes::i64));
  EXPECT_EQ(op.attrs, (AttrList{0}));
  EXPECT_EQ(op.dtype, dtypes::i32);
  EXPECT_ERR(build::reduce_dim_with_indices(Family::NumericInt, OpKind::Numeric_MinDimWithIndices,
                                            t(1, {4, 5}, dtypes::i32), 2, dtypes::i64, id(2), id(3)),
             ErrorCode::OutOfBounds);
  EXPECT_ERR(build::topk_with_indices(Family::NumericFloat, OpKind::Numeric_TopKWithIndices, t(1, {4, 5}), 1, 6,
                                      dtypes::i64, id(2), id(3)),
             ErrorCode::Invalid);
  EXPECT_ERR(build::topk_with_indices(Family::NumericFloat, OpKind::Numeric_TopKWithIndices, t(1, {4, 5}), 1, 2, kBool,
                                      id(2), id(3)),
             ErrorCode::DTypeMismatch);
}

// TopK / ArgTopK are ReduceDim kinds whose accumulator_len is k (docs/spec/ir.md §5.5): the axis
// becomes k, which must lie in 1..the axis' size.
TEST(BuildTopK, AccumulatorLenIsKAtMostTheAxisSize) {
  BUILD(tk, build::reduce_dim(Family::NumericFloat, OpKind::Numeric_TopK, t(1, {4, 5}, dtypes::bf16), 1, 3, id(2)));
  EXPECT_EQ(out(tk), TensorIr::uninit(id(2), {4, 3}, dtypes::bf16));
  EXPECT_EQ(tk.attrs, (AttrList{1, 3}));
  EXPECT_EQ(tk.kind_name(), "NumericFloat::TopK");
  BUILD(atk, build::reduce_dim_arg(Family::NumericInt, OpKind::Numeric_ArgTopK, t(1, {4, 5}, dtypes::u8), 0, 4,
                                   dtypes::i32, id(2)));
  EXPECT_EQ(out(atk), TensorIr::uninit(id(2), {4, 5}, dtypes::i32));
  EXPECT_EQ(atk.dtype, dtypes::u8);
  // k = the axis size is the whole sorted axis; one more is an error naming the op and the values.
  BUILD(all, build::reduce_dim(Family::NumericFloat, OpKind::Numeric_TopK, t(1, {4, 5}), 1, 5, id(2)));
  auto r = build::reduce_dim(Family::NumericFloat, OpKind::Numeric_TopK, t(1, {4, 5}), 1, 6, id(2));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::Invalid);
  EXPECT_EQ(message_of(r), "NumericFloat::TopK: k 6 exceeds axis 1 of size 5 ([4,5])");
  EXPECT_ERR(
      build::reduce_dim_arg(Family::NumericFloat, OpKind::Numeric_ArgTopK, t(1, {4, 5}), 0, 5, dtypes::i64, id(2)),
      ErrorCode::Invalid);
  EXPECT_ERR(build::reduce_dim(Family::NumericFloat, OpKind::Numeric_TopK, t(1, {4, 5}), 1, 0, id(2)),
             ErrorCode::Invalid);
  EXPECT_ERR(build::reduce_dim(Family::NumericFloat, OpKind::Numeric_TopK, t(1, {4, 5}), 2, 1, id(2)),
             ErrorCode::OutOfBounds);
  // ArgTopK outputs the index dtype: the plain builder refuses it, and the index dtype must be an integer.
  EXPECT_ERR(build::reduce_dim(Family::NumericFloat, OpKind::Numeric_ArgTopK, t(1, {4, 5}), 1, 2, id(2)),
             ErrorCode::Invalid);
  EXPECT_ERR(
      build::reduce_dim_arg(Family::NumericFloat, OpKind::Numeric_ArgTopK, t(1, {4, 5}), 1, 2, dtypes::f32, id(2)),
      ErrorCode::DTypeMismatch);
  EXPECT_ERR(build::reduce_dim(Family::BaseBool, OpKind::Numeric_TopK, t(1, {4}, kBool), 0, 1, id(2)),
             ErrorCode::Invalid);                               // Numeric kinds never apply to bool tensors
  EXPECT_FALSE(op_info(OpKind::Numeric_TopK).has(kReduceDim));  // tagged ·: never a reduce fusion
}

// Sort / ArgSort / SortWithIndices{input, dim, descending} (docs/spec/ir.md §5.2, §6.3): every
// output has the input's shape; attrs [dim, descending].
TEST(BuildSort, ShapesDtypesAndAttributes) {
  BUILD(s, build::sort(Family::NumericFloat, OpKind::Numeric_Sort, t(1, {2, 3, 4}, dtypes::f16), 1, true, id(2)));
  EXPECT_EQ(out(s), TensorIr::uninit(id(2), {2, 3, 4}, dtypes::f16));
  EXPECT_EQ(s.attrs, (AttrList{1, 1}));
  EXPECT_EQ(s.dtype, dtypes::f16);
  EXPECT_EQ(s.kind_name(), "NumericFloat::Sort");
  BUILD(as, build::sort_arg(Family::NumericInt, OpKind::Numeric_ArgSort, t(1, {5}, dtypes::i16), 0, false, dtypes::u32,
                            id(2)));
  EXPECT_EQ(out(as), TensorIr::uninit(id(2), {5}, dtypes::u32));
  EXPECT_EQ(as.attrs, (AttrList{0, 0}));
  EXPECT_EQ(as.dtype, dtypes::i16);
  BUILD(sw, build::sort_with_indices(Family::NumericFloat, OpKind::Numeric_SortWithIndices, t(1, {3, 2}), 0, false,
                                     dtypes::i64, id(2), id(3)));
  ASSERT_EQ(sw.outputs().size(), 2u);
  EXPECT_EQ(out(sw, 0), TensorIr::uninit(id(2), {3, 2}, dtypes::f32));
  EXPECT_EQ(out(sw, 1), TensorIr::uninit(id(3), {3, 2}, dtypes::i64));
  EXPECT_EQ(sw.attrs, (AttrList{0, 0}));
  // Errors name the op and the values.
  auto r = build::sort(Family::NumericFloat, OpKind::Numeric_Sort, t(1, {2, 3}), 2, false, id(2));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::OutOfBounds);
  EXPECT_EQ(message_of(r), "NumericFloat::Sort: dim 2 out of bounds for rank 2 ([2,3])");
  EXPECT_ERR(build::sort_with_indices(Family::NumericFloat, OpKind::Numeric_SortWithIndices, t(1, {3}), 1, false,
                                      dtypes::i64, id(2), id(3)),
             ErrorCode::OutOfBounds);
  EXPECT_ERR(build::sort_arg(Family::NumericFloat, OpKind::Numeric_ArgSort, t(1, {3}), 0, false, dtypes::f32, id(2)),
             ErrorCode::DTypeMismatch);
  EXPECT_ERR(build::sort_with_indices(Family::NumericFloat, OpKind::Numeric_SortWithIndices, t(1, {3}), 0, false, kBool,
                                      id(2), id(3)),
             ErrorCode::DTypeMismatch);
  // The builder must match the kind: ArgSort outputs indices, Sort values; SortWithIndices has its own.
  EXPECT_ERR(build::sort(Family::NumericFloat, OpKind::Numeric_ArgSort, t(1, {3}), 0, false, id(2)),
             ErrorCode::Invalid);
  EXPECT_ERR(build::sort_arg(Family::NumericFloat, OpKind::Numeric_Sort, t(1, {3}), 0, false, dtypes::i64, id(2)),
             ErrorCode::Invalid);
  EXPECT_ERR(build::sort(Family::NumericFloat, OpKind::Numeric_SortWithIndices, t(1, {3}), 0, false, id(2)),
             ErrorCode::Invalid);
  // The family must fit the operand (a bool tensor has no numeric family) and ids must be fresh.
  EXPECT_ERR(build::sort(Family::NumericInt, OpKind::Numeric_Sort, t(1, {3}, kBool), 0, false, id(2)),
             ErrorCode::DTypeMismatch);
  EXPECT_ERR(build::sort_with_indices(Family::NumericFloat, OpKind::Numeric_SortWithIndices, t(1, {3}), 0, false,
                                      dtypes::i64, id(2), id(2)),
             ErrorCode::Invalid);
}

TEST(BuildLayout, ExpandRejectsNegativeTargets) {
  EXPECT_ERR(
      build::shape_op(Family::BaseFloat, OpKind::Base_Expand, t(1, {3, 1}), std::vector<std::int64_t>{3, -1}, id(2)),
      ErrorCode::Invalid);
}

TEST(BuildLayout, SwapDims) {
  BUILD(op, build::swap_dims(Family::BaseInt, OpKind::Base_SwapDims, t(1, {2, 3, 4}, dtypes::i32), 0, 2, id(2)));
  EXPECT_EQ(out(op), TensorIr::uninit(id(2), {4, 3, 2}, dtypes::i32));
  EXPECT_EQ(op.attrs, (AttrList{0, 2}));
  EXPECT_ERR(build::swap_dims(Family::BaseInt, OpKind::Base_SwapDims, t(1, {2, 3}, dtypes::i32), 0, 2, id(2)),
             ErrorCode::OutOfBounds);
  // Packed along the last axis (packed_dim 0): swapping axes 0 and 2 moves it to the front.
  BUILD(q, build::swap_dims(Family::BaseFloat, OpKind::Base_SwapDims, t(1, {2, 3, 8}, qfloat_packed(0)), 0, 2, id(2)));
  EXPECT_EQ(out(q).dtype.scheme().packed_dim, 2);
  // A swap that leaves the packed axis in place keeps packed_dim.
  BUILD(q2, build::swap_dims(Family::BaseFloat, OpKind::Base_SwapDims, t(1, {2, 3, 8}, qfloat_packed(0)), 0, 1, id(2)));
  EXPECT_EQ(out(q2).dtype, qfloat_packed(0));
}

TEST(BuildLayout, PermuteErrorsAndBlockScheme) {
  const std::uint64_t two[] = {1, 0};
  const std::uint64_t dup[] = {0, 0};
  const std::uint64_t three[] = {0, 1, 2};
  EXPECT_ERR(build::permute(Family::BaseFloat, OpKind::Base_Permute, t(1, {2, 3}), three, id(2)),
             ErrorCode::RankMismatch);
  EXPECT_ERR(build::permute(Family::BaseFloat, OpKind::Base_Permute, t(1, {2, 3}), dup, id(2)), ErrorCode::Invalid);
  // Block [32] on the last dim of a rank-2 tensor: transposing moves the block to dim 0.
  QuantScheme s;
  s.block_rank = 1;
  s.block = {32, 0, 0, 0};
  BUILD(op, build::permute(Family::BaseFloat, OpKind::Base_Permute, t(1, {64, 128}, DType::qfloat(s)), two, id(2)));
  const QuantScheme& r = out(op).dtype.scheme();
  EXPECT_EQ(r.block_rank, 2);
  EXPECT_EQ(r.block[0], 32);
  EXPECT_EQ(r.block[1], 1);
  EXPECT_EQ(r.packed_dim, 0);  // native storage: no packed dim to move
  EXPECT_EQ(out(op).shape, (Shape{128, 64}));
  // The identity permutation keeps the scheme unchanged.
  const std::uint64_t id2[] = {0, 1};
  BUILD(same, build::permute(Family::BaseFloat, OpKind::Base_Permute, t(1, {64, 128}, DType::qfloat(s)), id2, id(2)));
  EXPECT_EQ(out(same).dtype, DType::qfloat(s));
}

TEST(BuildLayout, FlipAndRepeatDim) {
  const std::uint64_t axes[] = {0, 2};
  BUILD(fl, build::flip(Family::BaseBool, OpKind::Base_Flip, t(1, {2, 3, 4}, kBool), axes, id(2)));
  EXPECT_EQ(out(fl), TensorIr::uninit(id(2), {2, 3, 4}, kBool));
  EXPECT_EQ(fl.attrs, (AttrList{0, 2}));
  const std::uint64_t oob[] = {3};
  const std::uint64_t dup[] = {1, 1};
  EXPECT_ERR(build::flip(Family::BaseBool, OpKind::Base_Flip, t(1, {2, 3, 4}, kBool), oob, id(2)),
             ErrorCode::OutOfBounds);
  EXPECT_ERR(build::flip(Family::BaseBool, OpKind::Base_Flip, t(1, {2, 3, 4}, kBool), dup, id(2)), ErrorCode::Invalid);

  BUILD(rp, build::repeat_dim(Family::BaseFloat, OpKind::Base_RepeatDim, t(1, {2, 3}), 0, 3, id(2)));
  EXPECT_EQ(out(rp).shape, (Shape{6, 3}));
  EXPECT_EQ(rp.attrs, (AttrList{0, 3}));
  EXPECT_ERR(build::repeat_dim(Family::BaseFloat, OpKind::Base_RepeatDim, t(1, {2, 3}), 2, 3, id(2)),
             ErrorCode::OutOfBounds);
}

// Unfold{input, dim, size, step} (docs/spec/ir.md §4, §6.3): [dim] becomes the window count
// (size + step > dim: (dim + step − size) / step, else 0), `size` is appended.
TEST(BuildLayout, UnfoldCountsWindowsAndAppendsTheWindowAxis) {
  BUILD(u, build::unfold(Family::BaseFloat, OpKind::Base_Unfold, t(1, {2, 5, 3}, dtypes::bf16), 1, 2, 2, id(2)));
  EXPECT_EQ(out(u), TensorIr::uninit(id(2), {2, 2, 3, 2}, dtypes::bf16));  // windows [0, 2) and [2, 4)
  EXPECT_EQ(u.attrs, (AttrList{1, 2, 2}));
  EXPECT_EQ(u.kind_name(), "BaseFloat::Unfold");
  BUILD(whole, build::unfold(Family::BaseInt, OpKind::Base_Unfold, t(1, {5}, dtypes::i16), 0, 5, 1, id(2)));
  EXPECT_EQ(out(whole), TensorIr::uninit(id(2), {1, 5}, dtypes::i16));
  BUILD(last, build::unfold(Family::BaseBool, OpKind::Base_Unfold, t(1, {2, 7}, kBool), 1, 3, 1, id(2)));
  EXPECT_EQ(out(last).shape, (Shape{2, 5, 3}));
  // A window larger than the dim gives none (Burn's count; torch refuses it); size 0 gives dim + 1.
  BUILD(none, build::unfold(Family::BaseFloat, OpKind::Base_Unfold, t(1, {3, 2}), 0, 4, 1, id(2)));
  EXPECT_EQ(out(none).shape, (Shape{0, 2, 4}));
  BUILD(empty_windows, build::unfold(Family::BaseFloat, OpKind::Base_Unfold, t(1, {3}), 0, 0, 1, id(2)));
  EXPECT_EQ(out(empty_windows).shape, (Shape{4, 0}));
  // Errors name the op and the values.
  auto r = build::unfold(Family::BaseFloat, OpKind::Base_Unfold, t(1, {2, 5}), 1, 2, 0, id(2));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::Invalid);
  EXPECT_EQ(message_of(r), "BaseFloat::Unfold: step must be at least 1");
  r = build::unfold(Family::BaseFloat, OpKind::Base_Unfold, t(1, {2, 5}), 2, 2, 1, id(2));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::OutOfBounds);
  EXPECT_EQ(message_of(r), "BaseFloat::Unfold: dim 2 out of bounds for rank 2 ([2,5])");
  EXPECT_ERR(build::unfold(Family::BaseFloat, OpKind::Base_Unfold, t(1, {5}), 0, std::uint64_t{1} << 63, 1, id(2)),
             ErrorCode::Invalid);  // not an i64 attribute
  EXPECT_ERR(build::unfold(Family::BaseFloat, OpKind::Base_Unfold, t(1, {5}), 0, 2, ~std::uint64_t{0}, id(2)),
             ErrorCode::Invalid);
  EXPECT_ERR(build::unfold(Family::BaseInt, OpKind::Base_Unfold, t(1, {5}), 0, 2, 1, id(2)), ErrorCode::DTypeMismatch);
  EXPECT_ERR(build::unfold(Family::BaseFloat, OpKind::Base_Flip, t(1, {5}), 0, 2, 1, id(2)), ErrorCode::Invalid);
  EXPECT_ERR(build::unfold(Family::BaseFloat, OpKind::Base_Unfold, t(1, {5}), 0, 2, 1, id(1)), ErrorCode::Invalid);
}

TEST(BuildLayout, CatChecksDtypesAndCount) {
  const std::vector<TensorIr> mixed{t(1, {2}), t(2, {2}, dtypes::f16)};
  EXPECT_ERR(build::cat(Family::BaseFloat, OpKind::Base_Cat, mixed, 0, id(3)), ErrorCode::DTypeMismatch);
  EXPECT_ERR(build::cat(Family::BaseFloat, OpKind::Base_Cat, std::vector<TensorIr>{}, 0, id(3)), ErrorCode::Invalid);
  const std::vector<TensorIr> three{t(1, {2, 1}), t(2, {2, 2}), t(3, {2, 3})};
  BUILD(op, build::cat(Family::BaseFloat, OpKind::Base_Cat, three, 1, id(4)));
  EXPECT_EQ(out(op).shape, (Shape{2, 6}));
  EXPECT_EQ(op.num_inputs, 3);
}

TEST(BuildLayout, SliceAndSliceAssign) {
  const Slice ranges[] = {Slice{1, std::nullopt, 2}, Slice{-2, std::nullopt, -1}};
  BUILD(sl, build::slice(Family::BaseFloat, OpKind::Base_Slice, t(1, {10, 4, 3}), ranges, id(2)));
  EXPECT_EQ(out(sl).shape, (Shape{5, 2, 3}));
  EXPECT_EQ(sl.ranges, (RangeList{ranges[0], ranges[1]}));
  const Slice zero_step[] = {Slice{0, 4, 0}};
  EXPECT_ERR(build::slice(Family::BaseFloat, OpKind::Base_Slice, t(1, {10}), zero_step, id(2)), ErrorCode::Invalid);

  BUILD(sa,
        build::slice_assign(Family::BaseFloat, OpKind::Base_SliceAssign, t(1, {10, 4}), ranges, t(2, {5, 2}), id(3)));
  EXPECT_EQ(out(sa), TensorIr::uninit(id(3), {10, 4}, dtypes::f32));
  EXPECT_EQ(sa.num_inputs, 2);
  EXPECT_EQ(sa.ranges.size(), 2u);
  const Slice three[] = {Slice{0, 1, 1}, Slice{0, 1, 1}, Slice{0, 1, 1}};
  EXPECT_ERR(
      build::slice_assign(Family::BaseFloat, OpKind::Base_SliceAssign, t(1, {10, 4}), three, t(2, {1, 1}), id(3)),
      ErrorCode::RankMismatch);
  EXPECT_ERR(build::slice_assign(Family::BaseFloat, OpKind::Base_SliceAssign, t(1, {10, 4}), ranges,
                                 t(2, {5, 2}, dtypes::f64), id(3)),
             ErrorCode::DTypeMismatch);
}

TEST(BuildPad, ModesValuesAndLayout) {
  const build::PadPair last_two[] = {{1, 2}, {3, 3}};
  // Reflect: every padding at most size - 1 (here 3 on a dim of 4); no value.
  BUILD(rf, build::pad(Family::NumericInt, OpKind::Numeric_Pad, t(1, {2, 3, 4}, dtypes::i32), last_two,
                       PadMode::Reflect, std::nullopt, id(2)));
  EXPECT_EQ(out(rf), TensorIr::uninit(id(2), {2, 6, 10}, dtypes::i32));
  EXPECT_EQ(rf.attrs, (AttrList{static_cast<std::int64_t>(PadMode::Reflect), 1, 2, 3, 3}));
  EXPECT_TRUE(rf.scalars.empty());
  EXPECT_EQ(rf.dtype, dtypes::i32);
  BUILD(edge, build::pad(Family::NumericFloat, OpKind::Numeric_Pad, t(1, {0, 4}),
                         std::vector<build::PadPair>{{0, 0}, {2, 2}}, PadMode::Edge, std::nullopt, id(2)));
  EXPECT_EQ(out(edge).shape, (Shape{0, 8}));  // a (0, 0) pair leaves the empty dim alone
  EXPECT_ERR(build::pad(Family::NumericFloat, OpKind::Numeric_Pad, t(1, {4}), std::vector<build::PadPair>{{1, 1}},
                        PadMode::Constant, std::nullopt, id(2)),
             ErrorCode::Invalid);
  EXPECT_ERR(build::pad(Family::NumericFloat, OpKind::Numeric_Pad, t(1, {4}), std::vector<build::PadPair>{{1, 1}},
                        PadMode::Edge, ScalarIr::Float(1), id(2)),
             ErrorCode::Invalid);
  EXPECT_ERR(build::pad(Family::NumericFloat, OpKind::Numeric_Pad, t(1, {4}), std::vector<build::PadPair>{{0, 4}},
                        PadMode::Reflect, std::nullopt, id(2)),
             ErrorCode::Invalid);
}

TEST(BuildIndexing, GatherScatter) {
  BUILD(g, build::gather(Family::BaseFloat, OpKind::Base_Gather, t(1, {4, 5}), 1, t(2, {4, 2}, dtypes::i64), id(3)));
  EXPECT_EQ(out(g), TensorIr::uninit(id(3), {4, 2}, dtypes::f32));
  EXPECT_EQ(g.attrs, (AttrList{1}));
  EXPECT_EQ(g.inputs()[1].id, id(2));
  EXPECT_ERR(build::gather(Family::BaseFloat, OpKind::Base_Gather, t(1, {4, 5}), 2, t(2, {4, 2}, dtypes::i64), id(3)),
             ErrorCode::OutOfBounds);
  EXPECT_ERR(build::gather(Family::BaseFloat, OpKind::Base_Gather, t(1, {4, 5}), 1, t(2, {4, 2}), id(3)),
             ErrorCode::DTypeMismatch);
  EXPECT_ERR(build::gather(Family::BaseFloat, OpKind::Base_Gather, t(1, {4, 5}), 1, t(2, {8}, dtypes::i64), id(3)),
             ErrorCode::RankMismatch);

  BUILD(s, build::scatter(Family::BaseFloat, OpKind::Base_Scatter, t(1, {4, 5}), 0, t(2, {2, 5}, dtypes::i32),
                          t(3, {2, 5}), IndexingUpdate::Add, id(4)));
  EXPECT_EQ(out(s), TensorIr::uninit(id(4), {4, 5}, dtypes::f32));
  EXPECT_EQ(s.attrs, (AttrList{0, static_cast<std::int64_t>(IndexingUpdate::Add)}));
  ASSERT_EQ(s.num_inputs, 3);
  EXPECT_EQ(s.inputs()[1].id, id(2));  // field order: tensor, indices, value
  EXPECT_EQ(s.inputs()[2].id, id(3));
  EXPECT_ERR(build::scatter(Family::BaseFloat, OpKind::Base_Scatter, t(1, {4, 5}), 0, t(2, {2, 5}, dtypes::i32),
                            t(3, {2, 5}, dtypes::f16), IndexingUpdate::Assign, id(4)),
             ErrorCode::DTypeMismatch);
}

TEST(BuildIndexing, SelectSelectAssign) {
  BUILD(s, build::select(Family::BaseFloat, OpKind::Base_Select, t(1, {4, 5, 6}), 1, t(2, {7}, dtypes::i64), id(3)));
  EXPECT_EQ(out(s).shape, (Shape{4, 7, 6}));
  EXPECT_ERR(build::select(Family::BaseFloat, OpKind::Base_Select, t(1, {4, 5}), 1, t(2, {7, 1}, dtypes::i64), id(3)),
             ErrorCode::RankMismatch);
  EXPECT_ERR(build::select(Family::BaseFloat, OpKind::Base_Select, t(1, {4, 5}), 3, t(2, {7}, dtypes::i64), id(3)),
             ErrorCode::OutOfBounds);
  BUILD(sa, build::select_assign(Family::BaseInt, OpKind::Base_SelectAssign, t(1, {4, 5}, dtypes::i32), 0,
                                 t(2, {2}, dtypes::i64), t(3, {2, 5}, dtypes::i32), IndexingUpdate::Assign, id(4)));
  EXPECT_EQ(out(sa), TensorIr::uninit(id(4), {4, 5}, dtypes::i32));
  EXPECT_EQ(sa.attrs, (AttrList{0, 0}));
  EXPECT_ERR(build::select_assign(Family::BaseInt, OpKind::Base_SelectAssign, t(1, {4, 5}, dtypes::i32), 0,
                                  t(2, {2}, dtypes::i64), t(3, {2, 5}, dtypes::i64), IndexingUpdate::Assign, id(4)),
             ErrorCode::DTypeMismatch);
}

TEST(BuildIndexing, GatherNdBounds) {
  BUILD(full,
        build::gather_nd(Family::BaseFloat, OpKind::Base_GatherNd, t(1, {5, 6, 7}), t(2, {4, 3}, dtypes::i64), id(3)));
  EXPECT_EQ(out(full).shape, (Shape{4}));
  EXPECT_ERR(build::gather_nd(Family::BaseFloat, OpKind::Base_GatherNd, t(1, {5, 6}), t(2, {4, 3}, dtypes::i64), id(3)),
             ErrorCode::OutOfBounds);
  EXPECT_ERR(build::gather_nd(Family::BaseFloat, OpKind::Base_GatherNd, t(1, {5, 6}), t(2, {}, dtypes::i64), id(3)),
             ErrorCode::RankMismatch);
  EXPECT_ERR(build::gather_nd(Family::BaseFloat, OpKind::Base_GatherNd, t(1, {5, 6}), t(2, {4, 1}), id(3)),
             ErrorCode::DTypeMismatch);
}

// ScatterNd{data, indices, values, reduction}: data's shape and dtype, indices as GatherNd's; the
// values' shape is the kernel's to check (as Scatter's value, docs/spec/ir.md §6.3).
TEST(BuildIndexing, ScatterNd) {
  BUILD(s, build::scatter_nd(Family::BaseFloat, OpKind::Base_ScatterNd, t(1, {4, 3}), t(2, {2, 1}, dtypes::i64),
                             t(3, {2, 3}), IndexingUpdate::Add, id(4)));
  EXPECT_EQ(out(s), TensorIr::uninit(id(4), {4, 3}, dtypes::f32));
  EXPECT_EQ(s.attrs, (AttrList{static_cast<std::int64_t>(IndexingUpdate::Add)}));
  ASSERT_EQ(s.num_inputs, 3);
  EXPECT_EQ(s.inputs()[1].id, id(2));  // field order: data, indices, values
  EXPECT_EQ(s.inputs()[2].id, id(3));
  EXPECT_EQ(s.kind_name(), "BaseFloat::ScatterNd");
  BUILD(b, build::scatter_nd(Family::BaseBool, OpKind::Base_ScatterNd, t(1, {2, 2}, kBool), t(2, {3, 2}, dtypes::u8),
                             t(3, {3}, kBool), IndexingUpdate::Max, id(4)));
  EXPECT_EQ(out(b), TensorIr::uninit(id(4), {2, 2}, kBool));
  BUILD(k0,
        build::scatter_nd(Family::BaseInt, OpKind::Base_ScatterNd, t(1, {2}, dtypes::i32), t(2, {1, 0}, dtypes::i64),
                          t(3, {7}, dtypes::i32), IndexingUpdate::Assign, id(4)));  // values unchecked here
  EXPECT_EQ(out(k0).shape, (Shape{2}));
  // Errors name the op and the values.
  auto r = build::scatter_nd(Family::BaseFloat, OpKind::Base_ScatterNd, t(1, {4, 3}), t(2, {2, 3}, dtypes::i64),
                             t(3, {2}), IndexingUpdate::Add, id(4));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::OutOfBounds);
  EXPECT_EQ(message_of(r), "BaseFloat::ScatterNd: indices [2,3] address 3 dims of the rank-2 data [4,3]");
  r = build::scatter_nd(Family::BaseFloat, OpKind::Base_ScatterNd, t(1, {4, 3}), t(2, {2, 1}, dtypes::i64),
                        t(3, {2, 3}), static_cast<IndexingUpdate>(7), id(4));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(message_of(r), "BaseFloat::ScatterNd: unknown reduction 7");
  EXPECT_ERR(build::scatter_nd(Family::BaseFloat, OpKind::Base_ScatterNd, t(1, {4, 3}), t(2, {}, dtypes::i64), t(3, {}),
                               IndexingUpdate::Add, id(4)),
             ErrorCode::RankMismatch);
  EXPECT_ERR(build::scatter_nd(Family::BaseFloat, OpKind::Base_ScatterNd, t(1, {4, 3}), t(2, {2, 1}), t(3, {2, 3}),
                               IndexingUpdate::Add, id(4)),
             ErrorCode::DTypeMismatch);  // float indices
  EXPECT_ERR(build::scatter_nd(Family::BaseFloat, OpKind::Base_ScatterNd, t(1, {4, 3}), t(2, {2, 1}, dtypes::i64),
                               t(3, {2, 3}, dtypes::f16), IndexingUpdate::Add, id(4)),
             ErrorCode::DTypeMismatch);  // values of another dtype
  EXPECT_ERR(build::scatter_nd(Family::BaseInt, OpKind::Base_ScatterNd, t(1, {4, 3}), t(2, {2, 1}, dtypes::i64),
                               t(3, {2, 3}), IndexingUpdate::Add, id(4)),
             ErrorCode::DTypeMismatch);
  EXPECT_ERR(build::scatter_nd(Family::BaseFloat, OpKind::Base_Scatter, t(1, {4, 3}), t(2, {2, 1}, dtypes::i64),
                               t(3, {2, 3}), IndexingUpdate::Add, id(4)),
             ErrorCode::Invalid);
}

TEST(BuildCreation, CreationFullRandom) {
  BUILD(ones, build::creation(Family::BaseFloat, OpKind::Base_Ones, {2, 3}, dtypes::f16, id(1)));
  EXPECT_EQ(ones.num_inputs, 0);
  EXPECT_EQ(out(ones), TensorIr::uninit(id(1), {2, 3}, dtypes::f16));
  BUILD(empty, build::creation(Family::BaseBool, OpKind::Base_Empty, {4}, kBool, id(1)));
  EXPECT_ERR(build::creation(Family::BaseInt, OpKind::Base_Zeros, {2}, dtypes::f32, id(1)), ErrorCode::DTypeMismatch);

  BUILD(full, build::full(Family::NumericFloat, OpKind::Numeric_Full, {3}, dtypes::f64, ScalarIr::Float(0.5), id(1)));
  EXPECT_EQ(full.dtype, dtypes::f64);
  EXPECT_EQ(full.scalars, (ScalarList{ScalarIr::Float(0.5)}));
  EXPECT_ERR(build::full(Family::NumericInt, OpKind::Numeric_Full, {3}, dtypes::f32, ScalarIr::Int(1), id(1)),
             ErrorCode::DTypeMismatch);
  EXPECT_ERR(build::full(Family::NumericInt, OpKind::Numeric_Full, {3}, kBool, ScalarIr::Bool(true), id(1)),
             ErrorCode::DTypeMismatch);

  BUILD(rnd,
        build::random(Family::Float, OpKind::Float_Random, {2, 2}, dtypes::f32, DistributionIr::uniform(2, 3), id(1)));
  EXPECT_EQ(rnd.attrs, (AttrList{static_cast<std::int64_t>(Distribution::Uniform), bits(2), bits(3)}));
  EXPECT_EQ(rnd.dtype, dtypes::f32);
  BUILD(irnd, build::random(Family::NumericInt, OpKind::Numeric_IntRandom, {2}, dtypes::i32,
                            DistributionIr::bernoulli(0.25), id(1)));
  EXPECT_EQ(irnd.dtype, dtypes::i32);
  EXPECT_EQ(irnd.attrs[0], static_cast<std::int64_t>(Distribution::Bernoulli));
  BUILD(def, build::random(Family::Float, OpKind::Float_Random, {2}, dtypes::f32, DistributionIr{}, id(1)));
  EXPECT_EQ(def.attrs, (AttrList{0, 0, 0}));
  EXPECT_ERR(build::random(Family::Float, OpKind::Float_Random, {2}, dtypes::i32, DistributionIr{}, id(1)),
             ErrorCode::DTypeMismatch);
}

TEST(BuildModule, Conv2dChecks) {
  build::Conv2dOptions o;
  o.padding = {1, 1};
  BUILD(biased, build::conv2d(t(1, {2, 4, 8, 8}), t(2, {6, 2, 3, 3}), t(3, {6}),
                              build::Conv2dOptions{{2, 2}, {1, 1}, {1, 1}, 2}, id(4)));
  EXPECT_EQ(out(biased), TensorIr::uninit(id(4), {2, 6, 4, 4}, dtypes::f32));
  EXPECT_EQ(biased.num_inputs, 3);
  EXPECT_EQ(biased.attrs, (AttrList{2, 2, 1, 1, 1, 1, 2}));
  EXPECT_ERR(build::conv2d(t(1, {3, 32, 32}), t(2, {8, 3, 3, 3}), std::nullopt, o, id(3)), ErrorCode::RankMismatch);
  EXPECT_ERR(build::conv2d(t(1, {1, 3, 32, 32}), t(2, {8, 3, 3}), std::nullopt, o, id(3)), ErrorCode::RankMismatch);
  EXPECT_ERR(build::conv2d(t(1, {1, 4, 32, 32}), t(2, {8, 3, 3, 3}), std::nullopt, o, id(3)),
             ErrorCode::IncompatibleShapes);
  EXPECT_ERR(build::conv2d(t(1, {1, 3, 32, 32}), t(2, {8, 3, 3, 3}), t(3, {7}), o, id(4)),
             ErrorCode::IncompatibleShapes);
  EXPECT_ERR(build::conv2d(t(1, {1, 3, 32, 32}), t(2, {8, 3, 3, 3}, dtypes::f16), std::nullopt, o, id(3)),
             ErrorCode::DTypeMismatch);
  EXPECT_ERR(build::conv2d(t(1, {1, 3, 32, 32}, dtypes::i32), t(2, {8, 3, 3, 3}, dtypes::i32), std::nullopt, o, id(3)),
             ErrorCode::DTypeMismatch);
  EXPECT_ERR(build::conv2d(t(1, {1, 3, 2, 2}), t(2, {8, 3, 5, 5}), std::nullopt, build::Conv2dOptions{}, id(3)),
             ErrorCode::Invalid);  // kernel larger than the padded input
  build::Conv2dOptions zero_stride;
  zero_stride.stride = {1, 0};
  EXPECT_ERR(build::conv2d(t(1, {1, 3, 8, 8}), t(2, {8, 3, 3, 3}), std::nullopt, zero_stride, id(3)),
             ErrorCode::Invalid);
  build::Conv2dOptions zero_groups;
  zero_groups.groups = 0;
  EXPECT_ERR(build::conv2d(t(1, {1, 3, 8, 8}), t(2, {8, 3, 3, 3}), std::nullopt, zero_groups, id(3)),
             ErrorCode::Invalid);
}

TEST(BuildModule, ConvTranspose1dChecks) {
  build::ConvTranspose1dOptions o;
  o.groups = 2;
  BUILD(op, build::conv_transpose1d(t(1, {1, 4, 10}), t(2, {4, 3, 3}), t(3, {6}), o, id(4)));
  EXPECT_EQ(out(op).shape, (Shape{1, 6, 12}));
  EXPECT_ERR(build::conv_transpose1d(t(1, {1, 4, 10}), t(2, {4, 3, 3}), t(3, {3}), o, id(4)),
             ErrorCode::IncompatibleShapes);
  EXPECT_ERR(build::conv_transpose1d(t(1, {4, 10}), t(2, {4, 3, 3}), std::nullopt, o, id(4)), ErrorCode::RankMismatch);
  EXPECT_ERR(build::conv_transpose1d(t(1, {1, 5, 10}), t(2, {4, 3, 3}), std::nullopt, o, id(4)),
             ErrorCode::IncompatibleShapes);
  build::ConvTranspose1dOptions big_pad;
  big_pad.padding = 10;
  EXPECT_ERR(build::conv_transpose1d(t(1, {1, 4, 2}), t(2, {4, 3, 3}), std::nullopt, big_pad, id(4)),
             ErrorCode::Invalid);
}

TEST(BuildModule, PoolsAndEmbedding) {
  build::AvgPool2dOptions a;
  a.kernel = {3, 3};
  a.stride = {2, 2};
  a.padding = {1, 1};
  a.count_include_pad = false;
  BUILD(avg, build::avg_pool2d(t(1, {2, 3, 7, 8}), a, id(2)));
  EXPECT_EQ(out(avg).shape, (Shape{2, 3, 4, 4}));
  EXPECT_EQ(avg.attrs, (AttrList{3, 3, 2, 2, 1, 1, 0, 0}));
  EXPECT_ERR(build::avg_pool2d(t(1, {3, 7, 8}), a, id(2)), ErrorCode::RankMismatch);
  build::MaxPool2dOptions m;
  m.kernel = {9, 9};
  EXPECT_ERR(build::max_pool2d(t(1, {1, 1, 5, 5}), m, id(2)), ErrorCode::Invalid);
  m.kernel = {2, 2};
  m.dilation = {2, 2};
  BUILD(dil, build::max_pool2d(t(1, {1, 1, 5, 5}), m, id(2)));
  EXPECT_EQ(out(dil).shape, (Shape{1, 1, 3, 3}));  // effective kernel 3

  BUILD(emb, build::embedding(t(1, {100, 16}, dtypes::bf16), t(2, {4, 7}, dtypes::i64), id(3)));
  EXPECT_EQ(out(emb), TensorIr::uninit(id(3), {4, 7, 16}, dtypes::bf16));
  EXPECT_EQ(emb.kind_name(), "Module::Embedding");
  EXPECT_ERR(build::embedding(t(1, {100, 16}), t(2, {4, 7}), id(3)), ErrorCode::DTypeMismatch);
  EXPECT_ERR(build::embedding(t(1, {100, 16}), t(2, {28}, dtypes::i64), id(3)), ErrorCode::RankMismatch);
}

// ---- Dense layers, norms, the embedding's gradient (docs/spec/ir.md §5.8, §6.3)

// Linear{x, weight [d_in, d_out], bias?}: x with the last dim = weight[1] (Burn's layout), for x of
// rank 1, 2 and 3; the bias is an input only when given.
TEST(BuildDense, LinearShapesAndTheWeightLayout) {
  BUILD(v, build::linear(t(1, {3}), t(2, {3, 4}), std::nullopt, id(3)));
  EXPECT_EQ(out(v), TensorIr::uninit(id(3), {4}, dtypes::f32));
  EXPECT_EQ(v.num_inputs, 2);
  EXPECT_TRUE(v.attrs.empty());
  EXPECT_TRUE(v.scalars.empty());
  EXPECT_EQ(v.kind_name(), "Module::Linear");
  BUILD(m, build::linear(t(1, {2, 3}, dtypes::f16), t(2, {3, 4}, dtypes::f16), t(3, {4}, dtypes::f16), id(4)));
  EXPECT_EQ(out(m), TensorIr::uninit(id(4), {2, 4}, dtypes::f16));
  EXPECT_EQ(m.num_inputs, 3);
  EXPECT_EQ(m.inputs()[2], t(3, {4}, dtypes::f16));
  BUILD(b, build::linear(t(1, {5, 2, 3}), t(2, {3, 1}), t(3, {1}), id(4)));
  EXPECT_EQ(out(b).shape, (Shape{5, 2, 1}));
  // A [d_out, d_in] weight (PyTorch's layout) does not fit: the error names the op and the shapes.
  auto r = build::linear(t(1, {2, 3}), t(2, {4, 3}), std::nullopt, id(3));
  EXPECT_ERR(r, ErrorCode::IncompatibleShapes);
  EXPECT_EQ(message_of(r), "Module::Linear: x [2,3] has 3 features, weight [4,3] ([d_in, d_out]) takes 4");
  r = build::linear(t(1, {}), t(2, {3, 4}), std::nullopt, id(3));
  EXPECT_ERR(r, ErrorCode::RankMismatch);
  EXPECT_EQ(message_of(r), "Module::Linear: x t1:f32[] must have rank at least 1");
  EXPECT_ERR(build::linear(t(1, {2, 3}), t(2, {3}), std::nullopt, id(3)), ErrorCode::RankMismatch);
  EXPECT_ERR(build::linear(t(1, {2, 3}), t(2, {1, 3, 4}), std::nullopt, id(3)), ErrorCode::RankMismatch);
  r = build::linear(t(1, {2, 3}), t(2, {3, 4}), t(3, {3}), id(4));
  EXPECT_ERR(r, ErrorCode::IncompatibleShapes);
  EXPECT_EQ(message_of(r), "Module::Linear: bias t3:f32[3] must have shape [4]");
  EXPECT_ERR(build::linear(t(1, {2, 3}), t(2, {3, 4}), t(3, {1, 4}), id(4)), ErrorCode::IncompatibleShapes);
  // same(x, weight, bias?), float only; fresh ids, live inputs.
  r = build::linear(t(1, {2, 3}), t(2, {3, 4}, dtypes::f16), std::nullopt, id(3));
  EXPECT_ERR(r, ErrorCode::DTypeMismatch);
  EXPECT_EQ(message_of(r), "Module::Linear: dtypes differ: x f32 vs weight f16");
  EXPECT_ERR(build::linear(t(1, {2, 3}), t(2, {3, 4}), t(3, {4}, dtypes::bf16), id(4)), ErrorCode::DTypeMismatch);
  EXPECT_ERR(build::linear(t(1, {2, 3}, dtypes::i32), t(2, {3, 4}, dtypes::i32), std::nullopt, id(3)),
             ErrorCode::DTypeMismatch);
  EXPECT_ERR(build::linear(t(1, {2, 3}), t(2, {3, 4}), std::nullopt, id(2)), ErrorCode::Invalid);
  EXPECT_ERR(build::linear(t(1, {2, 3}, dtypes::f32, TensorStatus::NotInit), t(2, {3, 4}), std::nullopt, id(3)),
             ErrorCode::Invalid);
}

// The three backwards: x's shape (output_grad · weightᵀ), the weight's [d_in, d_out] and the
// bias' [d_out], all in output_grad's dtype.
TEST(BuildDense, LinearBackwardsShapesAndErrors) {
  BUILD(gx, build::linear_x_backward(t(1, {3, 4}, dtypes::bf16), t(2, {5, 2, 4}), id(3)));
  EXPECT_EQ(out(gx), TensorIr::uninit(id(3), {5, 2, 3}, dtypes::f32));  // output_grad's dtype (§6.3)
  EXPECT_EQ(gx.kind_name(), "Module::LinearXBackward");
  BUILD(gx1, build::linear_x_backward(t(1, {3, 4}), t(2, {4}), id(3)));
  EXPECT_EQ(out(gx1).shape, (Shape{3}));
  auto r = build::linear_x_backward(t(1, {3, 4}), t(2, {2, 3}), id(3));
  EXPECT_ERR(r, ErrorCode::IncompatibleShapes);
  EXPECT_EQ(message_of(r),
            "Module::LinearXBackward: output_grad [2,3] has 3 features, weight [3,4] ([d_in, d_out]) "
            "gives 4");
  EXPECT_ERR(build::linear_x_backward(t(1, {4}), t(2, {2, 4}), id(3)), ErrorCode::RankMismatch);
  EXPECT_ERR(build::linear_x_backward(t(1, {3, 4}), t(2, {}), id(3)), ErrorCode::RankMismatch);
  EXPECT_ERR(build::linear_x_backward(t(1, {3, 4}), t(2, {2, 4}, dtypes::i64), id(3)), ErrorCode::DTypeMismatch);

  BUILD(gw, build::linear_weight_backward(t(1, {5, 2, 3}), t(2, {5, 2, 4}, dtypes::f16), id(3)));
  EXPECT_EQ(out(gw), TensorIr::uninit(id(3), {3, 4}, dtypes::f16));
  EXPECT_EQ(gw.kind_name(), "Module::LinearWeightBackward");
  BUILD(outer, build::linear_weight_backward(t(1, {3}), t(2, {4}), id(3)));
  EXPECT_EQ(out(outer).shape, (Shape{3, 4}));
  r = build::linear_weight_backward(t(1, {5, 2, 3}), t(2, {2, 5, 4}), id(3));
  EXPECT_ERR(r, ErrorCode::IncompatibleShapes);
  EXPECT_EQ(message_of(r),
            "Module::LinearWeightBackward: x [5,2,3] and output_grad [2,5,4] must have the same leading dims");
  EXPECT_ERR(build::linear_weight_backward(t(1, {2, 3}), t(2, {1, 2, 4}), id(3)), ErrorCode::RankMismatch);
  EXPECT_ERR(build::linear_weight_backward(t(1, {}), t(2, {4}), id(3)), ErrorCode::RankMismatch);
  EXPECT_ERR(build::linear_weight_backward(t(1, {2, 3}, kBool), t(2, {2, 4}), id(3)), ErrorCode::DTypeMismatch);

  BUILD(gb, build::linear_bias_backward(t(1, {5, 2, 4}, dtypes::f64), id(3)));
  EXPECT_EQ(out(gb), TensorIr::uninit(id(3), {4}, dtypes::f64));
  EXPECT_EQ(gb.num_inputs, 1);
  BUILD(gb1, build::linear_bias_backward(t(1, {4}), id(3)));
  EXPECT_EQ(out(gb1).shape, (Shape{4}));
  EXPECT_ERR(build::linear_bias_backward(t(1, {}), id(3)), ErrorCode::RankMismatch);
  EXPECT_ERR(build::linear_bias_backward(t(1, {2, 4}, dtypes::u8), id(3)), ErrorCode::DTypeMismatch);
  EXPECT_ERR(build::linear_bias_backward(t(1, {2, 4}), id(1)), ErrorCode::Invalid);
}

// LayerNorm keeps epsilon as the attribute bits(epsilon) (never relativized, docs/spec/fusion.md
// §3.6); BatchNorm carries it as its one scalar, Float(epsilon).
TEST(BuildDense, LayerNormAndBatchNorm) {
  BUILD(ln, build::layer_norm(t(1, {2, 3, 4}), t(2, {4}), t(3, {4}), 1e-5, id(4)));
  EXPECT_EQ(out(ln), TensorIr::uninit(id(4), {2, 3, 4}, dtypes::f32));
  EXPECT_EQ(ln.num_inputs, 3);
  EXPECT_EQ(ln.attrs, (AttrList{bits(1e-5)}));
  EXPECT_TRUE(ln.scalars.empty());
  EXPECT_EQ(ln.kind_name(), "Module::LayerNorm");
  BUILD(no_beta, build::layer_norm(t(1, {4}, dtypes::bf16), t(2, {4}, dtypes::bf16), std::nullopt, 0.0, id(4)));
  EXPECT_EQ(no_beta.num_inputs, 2);
  EXPECT_EQ(out(no_beta).dtype, dtypes::bf16);
  auto r = build::layer_norm(t(1, {2, 3, 4}), t(2, {3}), std::nullopt, 1e-5, id(4));
  EXPECT_ERR(r, ErrorCode::IncompatibleShapes);
  EXPECT_EQ(message_of(r), "Module::LayerNorm: gamma t2:f32[3] must have shape [4] (the input's last dim)");
  EXPECT_ERR(build::layer_norm(t(1, {2, 4}), t(2, {4}), t(3, {4, 1}), 1e-5, id(4)), ErrorCode::IncompatibleShapes);
  EXPECT_ERR(build::layer_norm(t(1, {2, 4}), t(2, {2, 4}), std::nullopt, 1e-5, id(4)), ErrorCode::IncompatibleShapes);
  EXPECT_ERR(build::layer_norm(t(1, {}), t(2, {1}), std::nullopt, 1e-5, id(4)), ErrorCode::RankMismatch);
  r = build::layer_norm(t(1, {2, 4}), t(2, {4}, dtypes::f16), std::nullopt, 1e-5, id(4));
  EXPECT_ERR(r, ErrorCode::DTypeMismatch);
  EXPECT_EQ(message_of(r), "Module::LayerNorm: dtypes differ: input f32 vs gamma f16");
  EXPECT_ERR(build::layer_norm(t(1, {2, 4}), t(2, {4}), t(3, {4}, dtypes::f64), 1e-5, id(4)), ErrorCode::DTypeMismatch);
  r = build::layer_norm(t(1, {2, 4}), t(2, {4}), std::nullopt, -1e-3, id(4));
  EXPECT_ERR(r, ErrorCode::Invalid);
  EXPECT_EQ(message_of(r), "Module::LayerNorm: epsilon must be finite and non-negative, got -0.001");
  EXPECT_ERR(build::layer_norm(t(1, {2, 4}), t(2, {4}), std::nullopt, std::nan(""), id(4)), ErrorCode::Invalid);
  EXPECT_ERR(build::layer_norm(t(1, {2, 4}), t(2, {4}), std::nullopt, std::numeric_limits<double>::infinity(), id(4)),
             ErrorCode::Invalid);

  // With the row statistics (K): two more outputs of the input's shape with the last dim 1; the
  // builder's checks are layer_norm's, and the three ids must differ.
  BUILD(stats, build::layer_norm_with_stats(t(1, {2, 3, 4}), t(2, {4}), std::nullopt, 1e-5, id(4), id(5), id(6)));
  ASSERT_EQ(stats.outputs().size(), 3u);
  EXPECT_EQ(stats.outputs()[0], TensorIr::uninit(id(4), {2, 3, 4}, dtypes::f32));
  EXPECT_EQ(stats.outputs()[1], TensorIr::uninit(id(5), {2, 3, 1}, dtypes::f32));
  EXPECT_EQ(stats.outputs()[2], TensorIr::uninit(id(6), {2, 3, 1}, dtypes::f32));
  EXPECT_EQ(stats.attrs, (AttrList{bits(1e-5)}));
  EXPECT_EQ(stats.kind_name(), "Module::LayerNorm");
  EXPECT_ERR(build::layer_norm_with_stats(t(1, {2, 4}), t(2, {3}), std::nullopt, 1e-5, id(4), id(5), id(6)),
             ErrorCode::IncompatibleShapes);
  EXPECT_ERR(build::layer_norm_with_stats(t(1, {2, 4}), t(2, {4}), std::nullopt, 1e-5, id(4), id(5), id(5)),
             ErrorCode::Invalid);

  BUILD(bn, build::batch_norm(t(1, {2, 3, 4, 5}), t(2, {3}), t(3, {3}), t(4, {3}), t(5, {3}), 1e-3, id(6)));
  EXPECT_EQ(out(bn), TensorIr::uninit(id(6), {2, 3, 4, 5}, dtypes::f32));
  EXPECT_EQ(bn.num_inputs, 5);
  ASSERT_EQ(bn.scalars.size(), 1u);
  EXPECT_EQ(bn.scalars[0], ScalarIr::Float(1e-3));
  EXPECT_TRUE(bn.attrs.empty());
  EXPECT_EQ(bn.kind_name(), "Module::BatchNorm");
  BUILD(bn2, build::batch_norm(t(1, {4, 2}), t(2, {2}), t(3, {2}), t(4, {2}), t(5, {2}), 0.0, id(6)));
  EXPECT_EQ(out(bn2).shape, (Shape{4, 2}));
  r = build::batch_norm(t(1, {3}), t(2, {3}), t(3, {3}), t(4, {3}), t(5, {3}), 1e-5, id(6));
  EXPECT_ERR(r, ErrorCode::RankMismatch);
  EXPECT_EQ(message_of(r), "Module::BatchNorm: x t1:f32[3] must have rank at least 2 ([N, C, ...])");
  r = build::batch_norm(t(1, {2, 3}), t(2, {3}), t(3, {3}), t(4, {4}), t(5, {3}), 1e-5, id(6));
  EXPECT_ERR(r, ErrorCode::IncompatibleShapes);
  EXPECT_EQ(message_of(r), "Module::BatchNorm: mean t4:f32[4] must have shape [3] (the channels, x's dim 1)");
  r = build::batch_norm(t(1, {2, 3}), t(2, {3}), t(3, {3}), t(4, {3}), t(5, {3}, dtypes::f64), 1e-5, id(6));
  EXPECT_ERR(r, ErrorCode::DTypeMismatch);
  EXPECT_EQ(message_of(r), "Module::BatchNorm: dtypes differ: x f32 vs variance f64");
  EXPECT_ERR(build::batch_norm(t(1, {2, 3}), t(2, {1, 3}), t(3, {3}), t(4, {3}), t(5, {3}), 1e-5, id(6)),
             ErrorCode::IncompatibleShapes);
  EXPECT_ERR(build::batch_norm(t(1, {2, 3}), t(2, {3}), t(3, {3}), t(4, {3}), t(5, {3}), -0.5, id(6)),
             ErrorCode::Invalid);
  EXPECT_ERR(build::batch_norm(t(1, {2, 3}, dtypes::i32), t(2, {3}, dtypes::i32), t(3, {3}, dtypes::i32),
                               t(4, {3}, dtypes::i32), t(5, {3}, dtypes::i32), 1e-5, id(6)),
             ErrorCode::DTypeMismatch);
}

// EmbeddingBackward{weights [V, E], out_grad [B, S, E], indices [B, S]}: weights' shape and dtype.
TEST(BuildDense, EmbeddingBackward) {
  BUILD(eb, build::embedding_backward(t(1, {10, 4}, dtypes::f16), t(2, {2, 3, 4}, dtypes::f16),
                                      t(3, {2, 3}, dtypes::i32), id(4)));
  EXPECT_EQ(out(eb), TensorIr::uninit(id(4), {10, 4}, dtypes::f16));
  EXPECT_EQ(eb.num_inputs, 3);
  EXPECT_EQ(eb.kind_name(), "Module::EmbeddingBackward");
  auto r = build::embedding_backward(t(1, {10, 4}), t(2, {2, 3, 5}), t(3, {2, 3}, dtypes::i64), id(4));
  EXPECT_ERR(r, ErrorCode::IncompatibleShapes);
  EXPECT_EQ(message_of(r),
            "Module::EmbeddingBackward: out_grad t2:f32[2,3,5] must have shape [2,3,4] (indices [2,3], "
            "weights [10,4])");
  EXPECT_ERR(build::embedding_backward(t(1, {10, 4}), t(2, {6, 4}), t(3, {2, 3}, dtypes::i64), id(4)),
             ErrorCode::IncompatibleShapes);
  r = build::embedding_backward(t(1, {10, 4}), t(2, {2, 3, 4}, dtypes::f64), t(3, {2, 3}, dtypes::i64), id(4));
  EXPECT_ERR(r, ErrorCode::DTypeMismatch);
  EXPECT_EQ(message_of(r), "Module::EmbeddingBackward: dtypes differ: weights f32 vs out_grad f64");
  EXPECT_ERR(build::embedding_backward(t(1, {10, 4}), t(2, {2, 3, 4}), t(3, {2, 3}), id(4)), ErrorCode::DTypeMismatch);
  EXPECT_ERR(build::embedding_backward(t(1, {10, 4}), t(2, {6, 1, 4}), t(3, {6}, dtypes::i64), id(4)),
             ErrorCode::RankMismatch);
  EXPECT_ERR(build::embedding_backward(t(1, {10, 4, 1}), t(2, {2, 3, 4}), t(3, {2, 3}, dtypes::i64), id(4)),
             ErrorCode::RankMismatch);
  EXPECT_ERR(build::embedding_backward(t(1, {10, 4}, dtypes::i64), t(2, {2, 3, 4}, dtypes::i64),
                                       t(3, {2, 3}, dtypes::i64), id(4)),
             ErrorCode::DTypeMismatch);
  EXPECT_ERR(build::embedding_backward(t(1, {10, 4}), t(2, {2, 3, 4}), t(3, {2, 3}, dtypes::i64), id(3)),
             ErrorCode::Invalid);  // the output id is an input's
}

// ---- Convolutions of 1..3 spatial dims and their gradients (docs/spec/ir.md §5.8, §6.3)

TEST(BuildConv, ForwardsShapesAndAttributes) {
  // Conv1d: (10 + 2·1 − 2·(3 − 1) − 1) / 2 + 1 = 4; weight [C_out, C_in / groups, k].
  build::Conv1dOptions o1;
  o1.stride = 2;
  o1.padding = 1;
  o1.dilation = 2;
  o1.groups = 2;
  BUILD(c1, build::conv1d(t(1, {2, 4, 10}), t(2, {6, 2, 3}), t(3, {6}), o1, id(4)));
  EXPECT_EQ(out(c1), TensorIr::uninit(id(4), {2, 6, 4}, dtypes::f32));
  EXPECT_EQ(c1.kind_name(), "Module::Conv1d");
  EXPECT_EQ(c1.num_inputs, 3);
  EXPECT_EQ(c1.attrs, (AttrList{2, 1, 2, 2}));
  // Conv3d: depth (5 + 2 − 2 − 1) / 1 + 1 = 5, height (6 − 2 − 1) / 2 + 1 = 2, width
  // (7 + 2 − 4 − 1) / 3 + 1 = 2; attrs [stride..., padding..., dilation..., groups].
  build::Conv3dOptions o3;
  o3.stride = {1, 2, 3};
  o3.padding = {1, 0, 1};
  o3.dilation = {1, 1, 2};
  BUILD(c3,
        build::conv3d(t(1, {1, 2, 5, 6, 7}, dtypes::f64), t(2, {4, 2, 3, 3, 3}, dtypes::f64), std::nullopt, o3, id(3)));
  EXPECT_EQ(out(c3), TensorIr::uninit(id(3), {1, 4, 5, 2, 2}, dtypes::f64));
  EXPECT_EQ(c3.attrs, (AttrList{1, 2, 3, 1, 0, 1, 1, 1, 2, 1}));
  // The generic builder with Conv2d is conv2d, attribute for attribute.
  build::Conv2dOptions o2{{2, 1}, {1, 0}, {1, 2}, 1};
  BUILD(named2, build::conv2d(t(1, {1, 3, 6, 7}), t(2, {5, 3, 3, 2}), t(3, {5}), o2, id(4)));
  BUILD(generic2, build::conv(OpKind::Module_Conv2d, t(1, {1, 3, 6, 7}), t(2, {5, 3, 3, 2}), t(3, {5}),
                              build::conv_options(o2), id(4)));
  EXPECT_TRUE(named2 == generic2);
  EXPECT_EQ(out(named2).shape, (Shape{1, 5, 3, 5}));
  // ConvTranspose2d, weight [C_in, C_out / groups, kh, kw], C_out = 3 · 2: height (3 − 1)·2 +
  // 1·(2 − 1) + 1 + 1 − 2 = 5, width (5 − 1)·1 + 2·(3 − 1) + 1 = 9.
  build::ConvTranspose2dOptions t2;
  t2.stride = {2, 1};
  t2.padding = {1, 0};
  t2.padding_out = {1, 0};
  t2.dilation = {1, 2};
  t2.groups = 2;
  BUILD(tr2, build::conv_transpose2d(t(1, {1, 4, 3, 5}), t(2, {4, 3, 2, 3}), t(3, {6}), t2, id(4)));
  EXPECT_EQ(out(tr2), TensorIr::uninit(id(4), {1, 6, 5, 9}, dtypes::f32));
  EXPECT_EQ(tr2.kind_name(), "Module::ConvTranspose2d");
  EXPECT_EQ(tr2.attrs, (AttrList{2, 1, 1, 0, 1, 0, 1, 2, 2}));
  BUILD(tr3, build::conv_transpose3d(t(1, {2, 2, 2, 2, 2}), t(2, {2, 1, 2, 2, 2}), std::nullopt,
                                     build::ConvTranspose3dOptions{}, id(3)));
  EXPECT_EQ(out(tr3).shape, (Shape{2, 1, 3, 3, 3}));
  EXPECT_EQ(tr3.attrs, (AttrList{1, 1, 1, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1}));
  // PyTorch admits padding_out < max(stride, dilation): 1 with stride 1 and dilation 2.
  build::ConvTranspose1dOptions t1;
  t1.dilation = 2;
  t1.padding_out = 1;
  BUILD(tr1, build::conv_transpose1d(t(1, {1, 2, 4}), t(2, {2, 1, 3}), std::nullopt, t1, id(3)));
  EXPECT_EQ(out(tr1).shape, (Shape{1, 1, 9}));  // 3 + 4 + 1 + 1
}

TEST(BuildConv, GradientsTakeTheShapeOfTheirVariableAndTheDtypeOfOutputGrad) {
  build::Conv1dOptions o1;
  o1.stride = 2;
  o1.padding = 1;
  o1.dilation = 2;
  o1.groups = 2;
  const build::ConvOptions opts = build::conv_options(o1);
  const TensorIr x = t(1, {2, 4, 10}), w = t(2, {6, 2, 3}), g = t(3, {2, 6, 4}, dtypes::f64);
  BUILD(gx, build::conv_backward(OpKind::Module_Conv1dXBackward, x, w, g, opts, id(4)));
  EXPECT_EQ(out(gx), TensorIr::uninit(id(4), {2, 4, 10}, dtypes::f64));
  EXPECT_EQ(gx.num_inputs, 3);
  EXPECT_EQ(gx.attrs, (AttrList{2, 1, 2, 2}));
  EXPECT_EQ(gx.kind_name(), "Module::Conv1dXBackward");
  BUILD(gw, build::conv_backward(OpKind::Module_Conv1dWeightBackward, x, w, g, opts, id(4)));
  EXPECT_EQ(out(gw), TensorIr::uninit(id(4), {6, 2, 3}, dtypes::f64));
  BUILD(gb, build::conv_bias_backward(OpKind::Module_Conv1dBiasBackward, x, t(5, {6}), g, id(4)));
  EXPECT_EQ(out(gb), TensorIr::uninit(id(4), {6}, dtypes::f64));
  EXPECT_TRUE(gb.attrs.empty());
  // The transposed weight gradient: output_grad has the transposed forward's shape.
  build::ConvTranspose2dOptions t2;
  t2.stride = {2, 1};
  t2.padding = {1, 0};
  t2.padding_out = {1, 0};
  t2.dilation = {1, 2};
  t2.groups = 2;
  BUILD(tw, build::conv_transpose_backward(OpKind::Module_ConvTranspose2dWeightBackward, t(1, {1, 4, 3, 5}),
                                           t(2, {4, 3, 2, 3}), t(3, {1, 6, 5, 9}, dtypes::f16), build::conv_options(t2),
                                           id(4)));
  EXPECT_EQ(out(tw), TensorIr::uninit(id(4), {4, 3, 2, 3}, dtypes::f16));
  EXPECT_EQ(tw.attrs, (AttrList{2, 1, 1, 0, 1, 0, 1, 2, 2}));
  BUILD(tb, build::conv_bias_backward(OpKind::Module_ConvTranspose3dBiasBackward, t(1, {1, 2, 2, 2, 2}), t(2, {3}),
                                      t(3, {1, 3, 3, 3, 3}), id(4)));
  EXPECT_EQ(out(tb), TensorIr::uninit(id(4), {3}, dtypes::f32));
  BUILD(g3, build::conv_backward(OpKind::Module_Conv3dXBackward, t(1, {1, 2, 3, 3, 3}), t(2, {2, 2, 1, 1, 1}),
                                 t(3, {1, 2, 3, 3, 3}), build::conv_options(build::Conv3dOptions{}), id(4)));
  EXPECT_EQ(out(g3).shape, (Shape{1, 2, 3, 3, 3}));
}

TEST(BuildConv, ChannelAndGroupErrorsNameTheOpAndTheShapes) {
  build::Conv1dOptions g2;
  g2.groups = 2;
  auto r = build::conv1d(t(1, {1, 3, 8}), t(2, {4, 1, 3}), std::nullopt, g2, id(3));
  EXPECT_ERR(r, ErrorCode::IncompatibleShapes);
  EXPECT_EQ(message_of(r), "Module::Conv1d: x t1:f32[1,3,8] has 3 channels, not divisible by 2 groups");
  r = build::conv1d(t(1, {1, 4, 8}), t(2, {3, 2, 3}), std::nullopt, g2, id(3));
  EXPECT_ERR(r, ErrorCode::IncompatibleShapes);
  EXPECT_EQ(message_of(r), "Module::Conv1d: weight t2:f32[3,2,3] has 3 output channels, not divisible by 2 groups");
  r = build::conv3d(t(1, {1, 3, 4, 4, 4}), t(2, {2, 2, 1, 1, 1}), std::nullopt, {}, id(3));
  EXPECT_ERR(r, ErrorCode::IncompatibleShapes);
  EXPECT_EQ(message_of(r),
            "Module::Conv3d: x t1:f32[1,3,4,4,4] has 3 channels, weight t2:f32[2,2,1,1,1] ([C_out, C_in / groups, "
            "k...]) takes 2 per group x 1 groups");
  r = build::conv_transpose2d(t(1, {1, 3, 4, 4}), t(2, {4, 2, 3, 3}), std::nullopt, {}, id(3));
  EXPECT_ERR(r, ErrorCode::IncompatibleShapes);
  EXPECT_EQ(message_of(r),
            "Module::ConvTranspose2d: x t1:f32[1,3,4,4] has 3 channels, weight t2:f32[4,2,3,3] ([C_in, C_out / "
            "groups, k...]) takes 4");
  build::ConvTranspose3dOptions t3;
  t3.groups = 2;
  EXPECT_ERR(build::conv_transpose3d(t(1, {1, 3, 2, 2, 2}), t(2, {3, 1, 1, 1, 1}), std::nullopt, t3, id(3)),
             ErrorCode::IncompatibleShapes);  // 3 input channels in 2 groups
  // A bias of the wrong length; C_out = weight[1] · groups overflows.
  EXPECT_ERR(build::conv3d(t(1, {1, 2, 4, 4, 4}), t(2, {4, 2, 1, 1, 1}), t(3, {3}), {}, id(4)),
             ErrorCode::IncompatibleShapes);
  build::ConvTranspose1dOptions t1;
  t1.groups = 4;
  EXPECT_ERR(build::conv_transpose1d(t(1, {1, 4, 3}), t(2, {4, std::uint64_t{1} << 62, 1}), std::nullopt, t1, id(3)),
             ErrorCode::Invalid);
}

TEST(BuildConv, OptionErrors) {
  const TensorIr x1 = t(1, {1, 2, 8}), w1 = t(2, {2, 2, 3});
  build::Conv1dOptions zero_stride;
  zero_stride.stride = 0;
  auto r = build::conv1d(x1, w1, std::nullopt, zero_stride, id(3));
  EXPECT_ERR(r, ErrorCode::Invalid);
  EXPECT_EQ(message_of(r), "Module::Conv1d: stride [0]: every value must be at least 1 and fit an i64 attribute");
  build::Conv3dOptions zero_dilation;
  zero_dilation.dilation = {1, 0, 1};
  EXPECT_ERR(build::conv3d(t(1, {1, 2, 4, 4, 4}), t(2, {2, 2, 1, 1, 1}), std::nullopt, zero_dilation, id(3)),
             ErrorCode::Invalid);
  build::Conv1dOptions zero_groups;
  zero_groups.groups = 0;
  EXPECT_ERR(build::conv1d(x1, w1, std::nullopt, zero_groups, id(3)), ErrorCode::Invalid);
  build::Conv1dOptions huge;
  huge.padding = std::uint64_t{1} << 63;  // not an i64 attribute
  EXPECT_ERR(build::conv1d(x1, w1, std::nullopt, huge, id(3)), ErrorCode::Invalid);
  // Output sizes of 0 or less: a kernel wider than the padded input; a padding that crops the
  // whole transposed output.
  EXPECT_ERR(build::conv1d(t(1, {1, 2, 2}), t(2, {2, 2, 5}), std::nullopt, {}, id(3)), ErrorCode::Invalid);
  build::ConvTranspose2dOptions crop;
  crop.padding = {0, 3};
  r = build::conv_transpose2d(t(1, {1, 2, 2, 2}), t(2, {2, 1, 2, 2}), std::nullopt, crop, id(3));
  EXPECT_ERR(r, ErrorCode::Invalid);
  EXPECT_NE(message_of(r).find("Module::ConvTranspose2d: conv_transpose: 2*padding 6 exceeds"), std::string::npos)
      << message_of(r);
  // padding_out >= max(stride, dilation), as PyTorch refuses.
  build::ConvTranspose2dOptions po;
  po.stride = {2, 1};
  po.padding_out = {2, 0};
  r = build::conv_transpose2d(t(1, {1, 2, 2, 2}), t(2, {2, 1, 2, 2}), std::nullopt, po, id(3));
  EXPECT_ERR(r, ErrorCode::Invalid);
  EXPECT_EQ(message_of(r),
            "Module::ConvTranspose2d: padding_out 2 must be smaller than the stride 2 or the dilation 1 (dim 0)");
  po.padding_out = {1, 1};
  EXPECT_ERR(build::conv_transpose2d(t(1, {1, 2, 2, 2}), t(2, {2, 1, 2, 2}), std::nullopt, po, id(3)),
             ErrorCode::Invalid);
  // Lists of another length than the rank, padding_out on a convolution or missing on a transposed one.
  build::ConvOptions generic{{1}, {0}, {}, {1}, 1};
  EXPECT_ERR(build::conv(OpKind::Module_Conv2d, t(1, {1, 2, 4, 4}), t(2, {2, 2, 1, 1}), std::nullopt, generic, id(3)),
             ErrorCode::Invalid);
  generic.padding_out = {0};
  r = build::conv(OpKind::Module_Conv1d, x1, w1, std::nullopt, generic, id(3));
  EXPECT_ERR(r, ErrorCode::Invalid);
  EXPECT_EQ(message_of(r), "Module::Conv1d: padding_out [0] applies to transposed convolutions only");
  generic.padding_out.clear();
  EXPECT_ERR(build::conv_transpose(OpKind::Module_ConvTranspose1d, x1, w1, std::nullopt, generic, id(3)),
             ErrorCode::Invalid);
}

TEST(BuildConv, RankDtypeAndKindErrors) {
  const build::ConvOptions o1 = build::conv_options(build::Conv1dOptions{});
  const TensorIr x1 = t(1, {1, 2, 8}), w1 = t(2, {2, 2, 3}), g1 = t(3, {1, 2, 6});
  // Ranks: x and weight must have rank n + 2.
  EXPECT_ERR(build::conv3d(t(1, {1, 2, 4, 4}), t(2, {2, 2, 1, 1, 1}), std::nullopt, {}, id(3)),
             ErrorCode::RankMismatch);
  auto r = build::conv1d(x1, t(2, {2, 2}), std::nullopt, {}, id(3));
  EXPECT_ERR(r, ErrorCode::RankMismatch);
  EXPECT_EQ(message_of(r), "Module::Conv1d: weight must have rank 3, has rank 2 (t2:f32[2,2])");
  EXPECT_ERR(
      build::conv(OpKind::Module_Conv2d, x1, w1, std::nullopt, build::conv_options(build::Conv2dOptions{}), id(3)),
      ErrorCode::RankMismatch);
  // Dtypes: same(x, weight, bias?), float operands (the gradients: each float, any of them).
  r = build::conv1d(x1, t(2, {2, 2, 3}, dtypes::f64), std::nullopt, {}, id(3));
  EXPECT_ERR(r, ErrorCode::DTypeMismatch);
  EXPECT_EQ(message_of(r), "Module::Conv1d: dtypes differ: x f32 vs weight f64");
  EXPECT_ERR(build::conv1d(x1, w1, t(3, {2}, dtypes::f16), {}, id(4)), ErrorCode::DTypeMismatch);
  EXPECT_ERR(build::conv1d(t(1, {1, 2, 8}, dtypes::i32), t(2, {2, 2, 3}, dtypes::i32), std::nullopt, {}, id(3)),
             ErrorCode::DTypeMismatch);
  EXPECT_ERR(build::conv_backward(OpKind::Module_Conv1dXBackward, x1, w1, t(3, {1, 2, 6}, dtypes::i64), o1, id(4)),
             ErrorCode::DTypeMismatch);
  EXPECT_ERR(build::conv_bias_backward(OpKind::Module_Conv1dBiasBackward, x1, t(2, {2}, kBool), g1, id(4)),
             ErrorCode::DTypeMismatch);
  // A kind of another signature.
  r = build::conv(OpKind::Module_ConvTranspose1d, x1, w1, std::nullopt, o1, id(3));
  EXPECT_ERR(r, ErrorCode::Invalid);
  EXPECT_EQ(message_of(r), "Module::ConvTranspose1d: has signature ConvTranspose, not Conv");
  EXPECT_ERR(build::conv_backward(OpKind::Module_Conv1dBiasBackward, x1, w1, g1, o1, id(4)), ErrorCode::Invalid);
  EXPECT_ERR(build::conv_transpose_backward(OpKind::Module_Conv1dWeightBackward, x1, w1, g1, o1, id(4)),
             ErrorCode::Invalid);
  EXPECT_ERR(build::conv_bias_backward(OpKind::Module_Linear, x1, t(2, {2}), g1, id(4)), ErrorCode::Invalid);
  EXPECT_ERR(build::conv_bias_backward(static_cast<OpKind>(kNumOpKinds), x1, t(2, {2}), g1, id(4)), ErrorCode::Invalid);
  EXPECT_ERR(build::conv1d(x1, w1, std::nullopt, {}, id(1)), ErrorCode::Invalid);  // the output id is x's
}

TEST(BuildConv, GradientShapeErrors) {
  const build::ConvOptions o1 = build::conv_options(build::Conv1dOptions{});
  const TensorIr x1 = t(1, {1, 2, 8}), w1 = t(2, {4, 2, 3});
  // output_grad must have the forward's output shape [1, 4, 6].
  auto r = build::conv_backward(OpKind::Module_Conv1dWeightBackward, x1, w1, t(3, {1, 4, 7}), o1, id(4));
  EXPECT_ERR(r, ErrorCode::IncompatibleShapes);
  EXPECT_EQ(message_of(r),
            "Module::Conv1dWeightBackward: output_grad t3:f32[1,4,7] must have the forward's output shape [1,4,6] (x "
            "[1,2,8], weight [4,2,3])");
  EXPECT_ERR(build::conv_backward(OpKind::Module_Conv1dXBackward, x1, w1, t(3, {4, 6}), o1, id(4)),
             ErrorCode::RankMismatch);
  EXPECT_ERR(build::conv_backward(OpKind::Module_Conv1dXBackward, x1, t(2, {4, 3, 3}), t(3, {1, 4, 6}), o1, id(4)),
             ErrorCode::IncompatibleShapes);  // the channels the forward would refuse
  EXPECT_ERR(
      build::conv_transpose_backward(OpKind::Module_ConvTranspose1dWeightBackward, x1, t(2, {2, 4, 3}), t(3, {1, 4, 8}),
                                     build::conv_options(build::ConvTranspose1dOptions{}), id(4)),
      ErrorCode::IncompatibleShapes);  // the transposed output is [1, 4, 10]
  // The bias gradients: ranks n + 2, one batch, a bias of output_grad's channels.
  EXPECT_ERR(build::conv_bias_backward(OpKind::Module_Conv2dBiasBackward, x1, t(2, {4}), t(3, {1, 4, 6}), id(4)),
             ErrorCode::RankMismatch);
  EXPECT_ERR(build::conv_bias_backward(OpKind::Module_Conv1dBiasBackward, x1, t(2, {4}), t(3, {1, 4}), id(4)),
             ErrorCode::RankMismatch);
  r = build::conv_bias_backward(OpKind::Module_Conv1dBiasBackward, x1, t(2, {4}), t(3, {2, 4, 6}), id(4));
  EXPECT_ERR(r, ErrorCode::IncompatibleShapes);
  EXPECT_EQ(message_of(r),
            "Module::Conv1dBiasBackward: output_grad t3:f32[2,4,6] and x t1:f32[1,2,8] must have the same batch");
  r = build::conv_bias_backward(OpKind::Module_ConvTranspose1dBiasBackward, x1, t(2, {5}), t(3, {1, 4, 6}), id(4));
  EXPECT_ERR(r, ErrorCode::IncompatibleShapes);
  EXPECT_EQ(message_of(r),
            "Module::ConvTranspose1dBiasBackward: bias t2:f32[5] must have shape [4] (output_grad's channels, dim 1)");
}

// ---- Pools (docs/spec/ir.md §5.8, §6.3): the pool formula per spatial dim, the window in the
// attributes, errors naming the op and the values.

TEST(BuildPool, MaxPool1dShapesAndAttributes) {
  const build::MaxPool1dOptions o{3, 2, 1, 2, false};  // reach 5 over 10 + 2: numerator 7
  BUILD(floor_mode, build::max_pool1d(t(1, {2, 3, 10}, dtypes::bf16), o, id(2)));
  EXPECT_EQ(out(floor_mode), TensorIr::uninit(id(2), {2, 3, 4}, dtypes::bf16));
  EXPECT_EQ(floor_mode.attrs, (AttrList{3, 2, 1, 2, 0}));
  EXPECT_EQ(floor_mode.kind_name(), "Module::MaxPool1d");
  BUILD(ceil_mode, build::max_pool1d(t(1, {2, 3, 10}), {3, 2, 1, 2, true}, id(2)));
  EXPECT_EQ(out(ceil_mode).shape, (Shape{2, 3, 5}));
  EXPECT_EQ(ceil_mode.attrs, (AttrList{3, 2, 1, 2, 1}));
  // Errors: kernel, stride or dilation 0, more padding than half the kernel, a window wider than
  // the padded input, the rank, the dtype, an output id that is an input's.
  auto r = build::max_pool1d(t(1, {1, 1, 5}), {0, 1, 0, 1, false}, id(2));
  EXPECT_ERR(r, ErrorCode::Invalid);
  EXPECT_EQ(message_of(r), "Module::MaxPool1d: pool: kernel size must be at least 1");
  r = build::max_pool1d(t(1, {1, 1, 5}), {2, 0, 0, 1, false}, id(2));
  EXPECT_EQ(message_of(r), "Module::MaxPool1d: pool: stride must be at least 1");
  r = build::max_pool1d(t(1, {1, 1, 5}), {2, 1, 0, 0, false}, id(2));
  EXPECT_EQ(message_of(r), "Module::MaxPool1d: pool: dilation must be at least 1");
  r = build::max_pool1d(t(1, {1, 1, 5}), {3, 1, 2, 1, false}, id(2));
  EXPECT_ERR(r, ErrorCode::Invalid);
  EXPECT_EQ(message_of(r), "Module::MaxPool1d: padding 2 exceeds half the kernel size 3 (spatial dim 0)");
  EXPECT_ERR(build::max_pool1d(t(1, {1, 1, 5}), {6, 1, 0, 1, false}, id(2)), ErrorCode::Invalid);
  EXPECT_ERR(build::max_pool1d(t(1, {1, 1, 5}), {3, 1, 0, 3, false}, id(2)), ErrorCode::Invalid);  // reach 7
  r = build::max_pool1d(t(1, {1, 1, 5, 5}), {2, 1, 0, 1, false}, id(2));
  EXPECT_ERR(r, ErrorCode::RankMismatch);
  EXPECT_EQ(message_of(r), "Module::MaxPool1d: x must have rank 3, has rank 4 (t1:f32[1,1,5,5])");
  EXPECT_ERR(build::max_pool1d(t(1, {5}), {1, 1, 0, 1, false}, id(2)), ErrorCode::RankMismatch);
  EXPECT_ERR(build::max_pool1d(t(1, {1, 1, 5}, dtypes::i32), {2, 1, 0, 1, false}, id(2)), ErrorCode::DTypeMismatch);
  EXPECT_ERR(build::max_pool1d(t(1, {1, 1, 5}), {2, 1, 0, 1, false}, id(1)), ErrorCode::Invalid);
  // The 2d pools share the rule (K: PyTorch refuses it too).
  build::MaxPool2dOptions m;
  m.kernel = {3, 3};
  m.padding = {1, 2};
  r = build::max_pool2d(t(1, {1, 1, 5, 5}), m, id(2));
  EXPECT_EQ(message_of(r), "Module::MaxPool2d: padding 2 exceeds half the kernel size 3 (spatial dim 1)");
  build::AvgPool2dOptions a;
  a.kernel = {2, 2};
  a.padding = {2, 0};
  EXPECT_ERR(build::avg_pool2d(t(1, {1, 1, 5, 5}), a, id(2)), ErrorCode::Invalid);
}

TEST(BuildPool, MaxPoolWithIndicesTwoOutputsAndTheIndexDtype) {
  BUILD(one,
        build::max_pool1d_with_indices(t(1, {2, 3, 7}, dtypes::f16), {2, 2, 1, 1, false}, dtypes::i32, id(2), id(3)));
  EXPECT_EQ(one.num_inputs, 1);
  ASSERT_EQ(one.outputs().size(), 2u);
  EXPECT_EQ(out(one, 0), TensorIr::uninit(id(2), {2, 3, 4}, dtypes::f16));
  EXPECT_EQ(out(one, 1), TensorIr::uninit(id(3), {2, 3, 4}, dtypes::i32));
  EXPECT_EQ(one.attrs, (AttrList{2, 2, 1, 1, 0}));
  EXPECT_EQ(one.kind_name(), "Module::MaxPool1dWithIndices");
  build::MaxPool2dOptions o;
  o.kernel = {2, 2};
  o.stride = {2, 2};
  o.ceil_mode = true;
  BUILD(two, build::max_pool2d_with_indices(t(1, {1, 2, 5, 5}), o, dtypes::i64, id(2), id(3)));
  EXPECT_EQ(out(two, 0).shape, (Shape{1, 2, 3, 3}));
  EXPECT_EQ(out(two, 1), TensorIr::uninit(id(3), {1, 2, 3, 3}, dtypes::i64));
  EXPECT_EQ(two.attrs, (AttrList{2, 2, 2, 2, 0, 0, 1, 1, 1}));  // MaxPool2d's layout
  // The indices: a signed integer dtype (−1 marks an empty window) that holds the plane's last
  // index (an i8 holds 127: a plane of 128, not of 129).
  auto r = build::max_pool1d_with_indices(t(1, {1, 1, 5}), {2, 2, 0, 1, false}, dtypes::f32, id(2), id(3));
  EXPECT_ERR(r, ErrorCode::DTypeMismatch);
  EXPECT_EQ(message_of(r),
            "Module::MaxPool1dWithIndices: index dtype f32 must be a signed integer dtype (-1 marks an empty window)");
  EXPECT_ERR(build::max_pool1d_with_indices(t(1, {1, 1, 5}), {2, 2, 0, 1, false}, dtypes::u32, id(2), id(3)),
             ErrorCode::DTypeMismatch);
  EXPECT_ERR(build::max_pool2d_with_indices(t(1, {1, 1, 5, 5}), o, kBool, id(2), id(3)), ErrorCode::DTypeMismatch);
  BUILD(fits, build::max_pool1d_with_indices(t(1, {1, 1, 128}), {2, 2, 0, 1, false}, dtypes::i8, id(2), id(3)));
  r = build::max_pool2d_with_indices(t(1, {1, 1, 12, 11}), o, dtypes::i8, id(2), id(3));
  EXPECT_ERR(r, ErrorCode::Invalid);
  EXPECT_EQ(message_of(r),
            "Module::MaxPool2dWithIndices: index dtype i8 cannot hold the last index of x [1,1,12,11]'s spatial "
            "plane");
  // The window's errors as MaxPool1d's; the two output ids must differ.
  EXPECT_ERR(build::max_pool1d_with_indices(t(1, {1, 1, 5}), {2, 2, 3, 1, false}, dtypes::i64, id(2), id(3)),
             ErrorCode::Invalid);
  EXPECT_ERR(build::max_pool2d_with_indices(t(1, {1, 5, 5}), o, dtypes::i64, id(2), id(3)), ErrorCode::RankMismatch);
  EXPECT_ERR(build::max_pool1d_with_indices(t(1, {1, 1, 5}), {2, 2, 0, 1, false}, dtypes::i64, id(2), id(2)),
             ErrorCode::Invalid);
}

TEST(BuildPool, AvgPool1d) {
  BUILD(avg, build::avg_pool1d(t(1, {2, 3, 7}), {3, 2, 1, false, true}, id(2)));
  EXPECT_EQ(out(avg), TensorIr::uninit(id(2), {2, 3, 4}, dtypes::f32));
  EXPECT_EQ(avg.attrs, (AttrList{3, 2, 1, 0, 1}));
  EXPECT_EQ(avg.kind_name(), "Module::AvgPool1d");
  auto r = build::avg_pool1d(t(1, {1, 1, 5}), {2, 1, 2, true, false}, id(2));
  EXPECT_EQ(message_of(r), "Module::AvgPool1d: padding 2 exceeds half the kernel size 2 (spatial dim 0)");
  EXPECT_ERR(build::avg_pool1d(t(1, {1, 1, 5}), {0, 1, 0, true, false}, id(2)), ErrorCode::Invalid);
  EXPECT_ERR(build::avg_pool1d(t(1, {1, 1, 5}), {2, 0, 0, true, false}, id(2)), ErrorCode::Invalid);
  EXPECT_ERR(build::avg_pool1d(t(1, {1, 5}), build::AvgPool1dOptions{}, id(2)), ErrorCode::RankMismatch);
  EXPECT_ERR(build::avg_pool1d(t(1, {1, 1, 5}, dtypes::u8), build::AvgPool1dOptions{}, id(2)),
             ErrorCode::DTypeMismatch);
}

// The backwards: x's shape and dtype; grad (and indices) must have the forward's output shape.
TEST(BuildPool, PoolBackwards) {
  const build::MaxPool1dOptions m{2, 2, 0, 1, false};  // [.., 5] → [.., 2]
  BUILD(mb, build::max_pool1d_with_indices_backward(t(1, {1, 2, 5}, dtypes::f16), t(2, {1, 2, 2}),
                                                    t(3, {1, 2, 2}, dtypes::u8), m, id(4)));
  EXPECT_EQ(out(mb), TensorIr::uninit(id(4), {1, 2, 5}, dtypes::f16));
  EXPECT_EQ(mb.num_inputs, 3);
  EXPECT_EQ(mb.attrs, (AttrList{2, 2, 0, 1, 0}));
  auto r =
      build::max_pool1d_with_indices_backward(t(1, {1, 2, 5}), t(2, {1, 2, 3}), t(3, {1, 2, 2}, dtypes::i64), m, id(4));
  EXPECT_ERR(r, ErrorCode::IncompatibleShapes);
  EXPECT_EQ(message_of(r),
            "Module::MaxPool1dWithIndicesBackward: grad t2:f32[1,2,3] must have the pool's output shape [1,2,2] (x "
            "[1,2,5])");
  r = build::max_pool1d_with_indices_backward(t(1, {1, 2, 5}), t(2, {1, 2, 2}), t(3, {1, 2, 2}), m, id(4));
  EXPECT_ERR(r, ErrorCode::DTypeMismatch);
  EXPECT_EQ(message_of(r), "Module::MaxPool1dWithIndicesBackward: indices must be an integer dtype, got f32");
  EXPECT_ERR(
      build::max_pool1d_with_indices_backward(t(1, {1, 2, 5}), t(2, {1, 2, 2}), t(3, {2, 2}, dtypes::i64), m, id(4)),
      ErrorCode::IncompatibleShapes);
  EXPECT_ERR(build::max_pool1d_with_indices_backward(t(1, {1, 2, 5}), t(2, {1, 2, 2}, dtypes::i64),
                                                     t(3, {1, 2, 2}, dtypes::i64), m, id(4)),
             ErrorCode::DTypeMismatch);
  build::MaxPool2dOptions m2;
  m2.kernel = {2, 2};
  BUILD(mb2, build::max_pool2d_with_indices_backward(t(1, {1, 1, 3, 3}), t(2, {1, 1, 2, 2}),
                                                     t(3, {1, 1, 2, 2}, dtypes::i64), m2, id(4)));
  EXPECT_EQ(out(mb2).shape, (Shape{1, 1, 3, 3}));
  EXPECT_EQ(mb2.kind_name(), "Module::MaxPool2dWithIndicesBackward");
  EXPECT_ERR(build::max_pool2d_with_indices_backward(t(1, {1, 1, 3, 3}), t(2, {1, 1, 3, 3}),
                                                     t(3, {1, 1, 3, 3}, dtypes::i64), m2, id(4)),
             ErrorCode::IncompatibleShapes);
  // AvgPool backwards: grad of another float dtype is fine (§6.3 lists no same()); x's dtype out.
  BUILD(ab, build::avg_pool1d_backward(t(1, {1, 1, 5}, dtypes::f16), t(2, {1, 1, 3}), {3, 2, 1, true, false}, id(3)));
  EXPECT_EQ(out(ab), TensorIr::uninit(id(3), {1, 1, 5}, dtypes::f16));
  EXPECT_EQ(ab.attrs, (AttrList{3, 2, 1, 1, 0}));
  EXPECT_ERR(build::avg_pool1d_backward(t(1, {1, 1, 5}), t(2, {1, 1, 2}), {3, 2, 1, true, false}, id(3)),
             ErrorCode::IncompatibleShapes);
  EXPECT_ERR(build::avg_pool1d_backward(t(1, {1, 1, 5}), t(2, {1, 1, 3}, dtypes::i32), {3, 2, 1, true, false}, id(3)),
             ErrorCode::DTypeMismatch);
  build::AvgPool2dOptions a2;
  a2.kernel = {2, 2};
  a2.stride = {2, 2};
  BUILD(ab2, build::avg_pool2d_backward(t(1, {2, 1, 4, 5}), t(2, {2, 1, 2, 2}), a2, id(3)));
  EXPECT_EQ(out(ab2).shape, (Shape{2, 1, 4, 5}));
  EXPECT_EQ(ab2.attrs, (AttrList{2, 2, 2, 2, 0, 0, 1, 0}));
  a2.padding = {0, 3};
  EXPECT_ERR(build::avg_pool2d_backward(t(1, {2, 1, 4, 5}), t(2, {2, 1, 2, 2}), a2, id(3)), ErrorCode::Invalid);
}

TEST(BuildPool, AdaptiveAvgPools) {
  BUILD(one, build::adaptive_avg_pool1d(t(1, {2, 3, 5}), 3, id(2)));
  EXPECT_EQ(out(one), TensorIr::uninit(id(2), {2, 3, 3}, dtypes::f32));
  EXPECT_EQ(one.attrs, (AttrList{3}));
  BUILD(two, build::adaptive_avg_pool2d(t(1, {1, 2, 7, 9}, dtypes::f64), {3, 4}, id(2)));
  EXPECT_EQ(out(two), TensorIr::uninit(id(2), {1, 2, 3, 4}, dtypes::f64));
  EXPECT_EQ(two.attrs, (AttrList{3, 4}));
  BUILD(three, build::adaptive_avg_pool3d(t(1, {1, 1, 4, 5, 6}), {2, 3, 9}, id(2)));  // larger than x too
  EXPECT_EQ(out(three).shape, (Shape{1, 1, 2, 3, 9}));
  EXPECT_EQ(three.kind_name(), "Module::AdaptiveAvgPool3d");
  auto r = build::adaptive_avg_pool2d(t(1, {1, 2, 7, 9}), {3, 0}, id(2));
  EXPECT_ERR(r, ErrorCode::Invalid);
  EXPECT_EQ(message_of(r), "Module::AdaptiveAvgPool2d: output size 0 at spatial dim 1 must be in [1, 2^63 - 1]");
  EXPECT_ERR(build::adaptive_avg_pool1d(t(1, {1, 1, 5}), std::uint64_t{1} << 63, id(2)), ErrorCode::Invalid);
  r = build::adaptive_avg_pool1d(t(1, {1, 1, 0}), 2, id(2));
  EXPECT_ERR(r, ErrorCode::Invalid);
  EXPECT_EQ(message_of(r), "Module::AdaptiveAvgPool1d: x t1:f32[1,1,0] has an empty spatial dim 0");
  EXPECT_ERR(build::adaptive_avg_pool3d(t(1, {1, 4, 5, 6}), {1, 1, 1}, id(2)), ErrorCode::RankMismatch);
  EXPECT_ERR(build::adaptive_avg_pool1d(t(1, {1, 1, 5}, dtypes::i64), 2, id(2)), ErrorCode::DTypeMismatch);
  // Backwards: x's shape; grad [N, C, output...] of x's rank, batch and channels.
  BUILD(g1, build::adaptive_avg_pool1d_backward(t(1, {2, 3, 5}, dtypes::bf16), t(2, {2, 3, 3}), id(3)));
  EXPECT_EQ(out(g1), TensorIr::uninit(id(3), {2, 3, 5}, dtypes::bf16));
  EXPECT_TRUE(g1.attrs.empty());
  BUILD(g3, build::adaptive_avg_pool3d_backward(t(1, {1, 1, 4, 5, 6}), t(2, {1, 1, 2, 7, 1}), id(3)));
  EXPECT_EQ(out(g3).shape, (Shape{1, 1, 4, 5, 6}));
  r = build::adaptive_avg_pool2d_backward(t(1, {1, 2, 7, 9}), t(2, {1, 3, 3, 4}), id(3));
  EXPECT_ERR(r, ErrorCode::IncompatibleShapes);
  EXPECT_EQ(message_of(r),
            "Module::AdaptiveAvgPool2dBackward: grad t2:f32[1,3,3,4] must have x [1,2,7,9]'s batch and channel dims");
  EXPECT_ERR(build::adaptive_avg_pool2d_backward(t(1, {1, 2, 7, 9}), t(2, {1, 2, 3}), id(3)), ErrorCode::RankMismatch);
  EXPECT_ERR(build::adaptive_avg_pool1d_backward(t(1, {1, 2, 5}), t(2, {1, 2, 0}), id(3)), ErrorCode::Invalid);
  EXPECT_ERR(build::adaptive_avg_pool1d_backward(t(1, {1, 2, 5}), t(2, {1, 2, 2}, dtypes::i32), id(3)),
             ErrorCode::DTypeMismatch);
}

// ---- Resampling (docs/spec/ir.md §5.6, §5.8, §6.3)

// Interpolate{x [N, C, H, W], output_size, options}: [N, C, out_h, out_w], attrs [out_h, out_w,
// mode, align_corners]; the defaults are Burn's InterpolateOptions::new(Nearest) (align_corners).
TEST(BuildResample, InterpolateShapesAttrsAndErrors) {
  BUILD(up, build::interpolate(t(1, {2, 3, 4, 5}, dtypes::f16), {7, 2}, {InterpolateMode::Bicubic, false}, id(2)));
  EXPECT_EQ(out(up), TensorIr::uninit(id(2), {2, 3, 7, 2}, dtypes::f16));
  EXPECT_EQ(up.attrs, (AttrList{7, 2, 3, 0}));
  EXPECT_EQ(up.num_inputs, 1);
  EXPECT_EQ(up.kind_name(), "Module::Interpolate");
  BUILD(dflt, build::interpolate(t(1, {1, 1, 2, 2}), {1, 1}, {}, id(2)));
  EXPECT_EQ(dflt.attrs, (AttrList{1, 1, 0, 1}));
  BUILD(empty_batch, build::interpolate(t(1, {0, 3, 2, 2}), {4, 4}, {InterpolateMode::Lanczos3, true}, id(2)));
  EXPECT_EQ(out(empty_batch).shape, (Shape{0, 3, 4, 4}));
  auto r = build::interpolate(t(1, {2, 3, 4}), {4, 4}, {}, id(2));
  EXPECT_ERR(r, ErrorCode::RankMismatch);
  EXPECT_EQ(message_of(r), "Module::Interpolate: x must have rank 4, has rank 3 (t1:f32[2,3,4])");
  r = build::interpolate(t(1, {1, 1, 0, 3}), {4, 4}, {}, id(2));
  EXPECT_ERR(r, ErrorCode::Invalid);
  EXPECT_EQ(message_of(r), "Module::Interpolate: x t1:f32[1,1,0,3] has an empty image: H and W must be at least 1");
  r = build::interpolate(t(1, {1, 1, 2, 2}), {0, 3}, {}, id(2));
  EXPECT_ERR(r, ErrorCode::Invalid);
  EXPECT_EQ(message_of(r), "Module::Interpolate: output_size [0,3] must be at least 1 in each dim");
  r = build::interpolate(t(1, {1, 1, 2, 2}), {std::uint64_t{1} << 63, 1}, {}, id(2));
  EXPECT_ERR(r, ErrorCode::Invalid);
  EXPECT_EQ(message_of(r), "Module::Interpolate: output size 9223372036854775808 exceeds the i64 range");
  r = build::interpolate(t(1, {1, 1, 2, 2}), {2, 2}, {static_cast<InterpolateMode>(5), false}, id(2));
  EXPECT_ERR(r, ErrorCode::Invalid);
  EXPECT_EQ(message_of(r), "Module::Interpolate: unknown interpolate mode 5");
  EXPECT_ERR(build::interpolate(t(1, {1, 1, 2, 2}), {2, 2}, {static_cast<InterpolateMode>(-1), false}, id(2)),
             ErrorCode::Invalid);
  r = build::interpolate(t(1, {1, 1, 2, 2}, dtypes::i32), {2, 2}, {}, id(2));
  EXPECT_ERR(r, ErrorCode::DTypeMismatch);
  EXPECT_EQ(message_of(r), "Module::Interpolate: x t1:i32[1,1,2,2] must have a float dtype");
  EXPECT_ERR(build::interpolate(t(1, {1, 1, 2, 2}), {2, 2}, {}, id(1)), ErrorCode::Invalid);  // output id = x's
}

// InterpolateBackward{x, grad [N, C, out_h, out_w]}: x's shape and dtype; grad float, its dtype
// free (§6.3 lists no same()); the attributes as Interpolate's.
TEST(BuildResample, InterpolateBackwardShapesAndErrors) {
  BUILD(g, build::interpolate_backward(t(1, {1, 2, 4, 4}), t(2, {1, 2, 3, 5}, dtypes::f16), {3, 5},
                                       {InterpolateMode::Bilinear, true}, id(3)));
  EXPECT_EQ(out(g), TensorIr::uninit(id(3), {1, 2, 4, 4}, dtypes::f32));
  EXPECT_EQ(g.attrs, (AttrList{3, 5, 2, 1}));
  EXPECT_EQ(g.num_inputs, 2);
  EXPECT_EQ(g.kind_name(), "Module::InterpolateBackward");
  auto r = build::interpolate_backward(t(1, {1, 2, 4, 4}), t(2, {1, 2, 5, 3}), {3, 5}, {}, id(3));
  EXPECT_ERR(r, ErrorCode::IncompatibleShapes);
  EXPECT_EQ(message_of(r),
            "Module::InterpolateBackward: grad t2:f32[1,2,5,3] must have shape [1,2,3,5] (x [1,2,4,4], output_size "
            "[3,5])");
  EXPECT_ERR(build::interpolate_backward(t(1, {1, 2, 4, 4}), t(2, {2, 3, 5}), {3, 5}, {}, id(3)),
             ErrorCode::RankMismatch);
  EXPECT_ERR(build::interpolate_backward(t(1, {1, 2, 4, 4}), t(2, {1, 1, 3, 5}), {3, 5}, {}, id(3)),
             ErrorCode::IncompatibleShapes);
  r = build::interpolate_backward(t(1, {1, 2, 4, 4}), t(2, {1, 2, 3, 5}, dtypes::i64), {3, 5}, {}, id(3));
  EXPECT_ERR(r, ErrorCode::DTypeMismatch);
  EXPECT_EQ(message_of(r), "Module::InterpolateBackward: grad t2:i64[1,2,3,5] must have a float dtype");
  EXPECT_ERR(build::interpolate_backward(t(1, {2, 4, 4}), t(2, {1, 2, 3, 5}), {3, 5}, {}, id(3)),
             ErrorCode::RankMismatch);
  EXPECT_ERR(build::interpolate_backward(t(1, {1, 2, 4, 0}), t(2, {1, 2, 3, 5}), {3, 5}, {}, id(3)),
             ErrorCode::Invalid);
  EXPECT_ERR(build::interpolate_backward(t(1, {1, 2, 4, 4}), t(2, {1, 2, 0, 5}), {0, 5}, {}, id(3)),
             ErrorCode::Invalid);
  r = build::interpolate_backward(t(1, {1, 2, 4, 4}), t(2, {1, 2, 3, 5}), {3, 5},
                                  {static_cast<InterpolateMode>(9), true}, id(3));
  EXPECT_ERR(r, ErrorCode::Invalid);
  EXPECT_EQ(message_of(r), "Module::InterpolateBackward: unknown interpolate mode 9");
}

// Float GridSample2d{tensor [N, C, H, W], grid [N, Ho, Wo, 2]}: [N, C, Ho, Wo], the tensor's dtype
// carried by the family; attrs [mode, padding_mode, align_corners], defaults Burn's (Bilinear,
// Zeros, false); modes Nearest, Bilinear and Bicubic only.
TEST(BuildResample, GridSample2dShapesAttrsAndErrors) {
  BUILD(gs, build::grid_sample_2d(t(1, {2, 3, 4, 5}), t(2, {2, 6, 7, 2}), {}, id(3)));
  EXPECT_EQ(out(gs), TensorIr::uninit(id(3), {2, 3, 6, 7}, dtypes::f32));
  EXPECT_EQ(gs.attrs, (AttrList{2, 0, 0}));
  EXPECT_EQ(gs.family, Family::Float);
  EXPECT_EQ(gs.dtype, dtypes::f32);
  EXPECT_EQ(gs.kind_name(), "Float::GridSample2d");
  BUILD(nearest, build::grid_sample_2d(t(1, {1, 1, 4, 5}, dtypes::bf16), t(2, {1, 0, 3, 2}, dtypes::f32),
                                       {InterpolateMode::Nearest, GridSamplePaddingMode::Reflection, true}, id(3)));
  EXPECT_EQ(out(nearest), TensorIr::uninit(id(3), {1, 1, 0, 3}, dtypes::bf16));
  EXPECT_EQ(nearest.attrs, (AttrList{0, 2, 1}));
  EXPECT_EQ(nearest.dtype, dtypes::bf16);
  auto r = build::grid_sample_2d(t(1, {2, 3, 4, 5}), t(2, {2, 6, 7, 3}), {}, id(3));
  EXPECT_ERR(r, ErrorCode::IncompatibleShapes);
  EXPECT_EQ(message_of(r), "Float::GridSample2d: grid t2:f32[2,6,7,3] must hold 2 coordinates (x, y) in its last dim");
  r = build::grid_sample_2d(t(1, {2, 3, 4, 5}), t(2, {1, 6, 7, 2}), {}, id(3));
  EXPECT_ERR(r, ErrorCode::IncompatibleShapes);
  EXPECT_EQ(message_of(r), "Float::GridSample2d: grid t2:f32[1,6,7,2] has batch 1, tensor t1:f32[2,3,4,5] has 2");
  EXPECT_ERR(build::grid_sample_2d(t(1, {2, 3, 4, 5}), t(2, {2, 6, 2}), {}, id(3)), ErrorCode::RankMismatch);
  r = build::grid_sample_2d(t(1, {3, 4, 5}), t(2, {3, 6, 7, 2}), {}, id(3));
  EXPECT_ERR(r, ErrorCode::RankMismatch);
  EXPECT_EQ(message_of(r), "Float::GridSample2d: tensor must have rank 4, has rank 3 (t1:f32[3,4,5])");
  EXPECT_ERR(build::grid_sample_2d(t(1, {2, 3, 0, 5}), t(2, {2, 6, 7, 2}), {}, id(3)), ErrorCode::Invalid);
  EXPECT_ERR(build::grid_sample_2d(t(1, {2, 3, 4, 5}, dtypes::i32), t(2, {2, 6, 7, 2}), {}, id(3)),
             ErrorCode::DTypeMismatch);
  r = build::grid_sample_2d(t(1, {2, 3, 4, 5}), t(2, {2, 6, 7, 2}, dtypes::i64), {}, id(3));
  EXPECT_ERR(r, ErrorCode::DTypeMismatch);
  EXPECT_EQ(message_of(r), "Float::GridSample2d: grid t2:i64[2,6,7,2] must have a float dtype");
  for (InterpolateMode m : {InterpolateMode::NearestExact, InterpolateMode::Lanczos3}) {
    r = build::grid_sample_2d(t(1, {2, 3, 4, 5}), t(2, {2, 6, 7, 2}), {m, GridSamplePaddingMode::Zeros, false}, id(3));
    EXPECT_ERR(r, ErrorCode::Invalid);
    EXPECT_NE(message_of(r).find("does not apply to grid sampling (Nearest, Bilinear or Bicubic)"), std::string::npos)
        << message_of(r);
  }
  r = build::grid_sample_2d(t(1, {2, 3, 4, 5}), t(2, {2, 6, 7, 2}),
                            {static_cast<InterpolateMode>(7), GridSamplePaddingMode::Zeros, false}, id(3));
  EXPECT_EQ(message_of(r), "Float::GridSample2d: unknown interpolate mode 7");
  r = build::grid_sample_2d(t(1, {2, 3, 4, 5}), t(2, {2, 6, 7, 2}),
                            {InterpolateMode::Bilinear, static_cast<GridSamplePaddingMode>(3), false}, id(3));
  EXPECT_ERR(r, ErrorCode::Invalid);
  EXPECT_EQ(message_of(r), "Float::GridSample2d: unknown padding mode 3");
  EXPECT_ERR(build::grid_sample_2d(t(1, {2, 3, 4, 5}), t(2, {2, 6, 7, 2}), {}, id(2)), ErrorCode::Invalid);
}

// Unfold4d{x, kernel_size, options} (im2col): [N, C·kh·kw, blocks_h · blocks_w] by the conv
// formula (Burn's unfold4d vectors: [2, 5, 3, 4] with a [2, 3] kernel is [2, 30, 4]).
TEST(BuildResample, Unfold4dShapesAttrsAndErrors) {
  BUILD(plain, build::unfold4d(t(1, {2, 5, 3, 4}), {2, 3}, {}, id(2)));
  EXPECT_EQ(out(plain), TensorIr::uninit(id(2), {2, 30, 4}, dtypes::f32));
  EXPECT_EQ(plain.attrs, (AttrList{2, 3, 1, 1, 0, 0, 1, 1}));
  EXPECT_EQ(plain.kind_name(), "Module::Unfold4d");
  build::Unfold4dOptions o;
  o.stride = {1, 2};
  o.padding = {0, 1};
  o.dilation = {1, 2};
  BUILD(strided, build::unfold4d(t(1, {1, 2, 3, 4}, dtypes::f64), {2, 3}, o, id(2)));
  EXPECT_EQ(out(strided), TensorIr::uninit(id(2), {1, 12, 2}, dtypes::f64));
  EXPECT_EQ(strided.attrs, (AttrList{2, 3, 1, 2, 0, 1, 1, 2}));
  auto r = build::unfold4d(t(1, {2, 3, 4}), {2, 2}, {}, id(2));
  EXPECT_ERR(r, ErrorCode::RankMismatch);
  EXPECT_EQ(message_of(r), "Module::Unfold4d: x must have rank 4, has rank 3 (t1:f32[2,3,4])");
  EXPECT_ERR(build::unfold4d(t(1, {1, 2, 3, 4}, dtypes::u8), {2, 2}, {}, id(2)), ErrorCode::DTypeMismatch);
  r = build::unfold4d(t(1, {1, 2, 3, 4}), {5, 2}, {}, id(2));
  EXPECT_ERR(r, ErrorCode::Invalid);
  EXPECT_EQ(message_of(r),
            "Module::Unfold4d: conv: kernel 5 with dilation 1 spans 5 elements, more than the padded input 3 (size 3 "
            "+ 2*padding 0)");
  r = build::unfold4d(t(1, {1, 2, 3, 4}), {0, 2}, {}, id(2));
  EXPECT_ERR(r, ErrorCode::Invalid);
  EXPECT_EQ(message_of(r), "Module::Unfold4d: conv: kernel size must be at least 1");
  o = {};
  o.stride = {1, 0};
  r = build::unfold4d(t(1, {1, 2, 3, 4}), {2, 2}, o, id(2));
  EXPECT_EQ(message_of(r), "Module::Unfold4d: conv: stride must be at least 1");
  o = {};
  o.dilation = {0, 1};
  EXPECT_ERR(build::unfold4d(t(1, {1, 2, 3, 4}), {2, 2}, o, id(2)), ErrorCode::Invalid);
  o = {};
  o.padding = {std::uint64_t{1} << 63, 0};
  r = build::unfold4d(t(1, {1, 2, 3, 4}), {2, 2}, o, id(2));
  EXPECT_ERR(r, ErrorCode::Invalid);
  EXPECT_NE(message_of(r).find("exceeds the i64 range"), std::string::npos) << message_of(r);
  // C · kh · kw beyond u64: refused, never wrapped.
  o = {};
  o.padding = {std::uint64_t{1} << 20, std::uint64_t{1} << 20};
  r = build::unfold4d(t(1, {1, std::uint64_t{1} << 40, 1, 1}), {std::uint64_t{1} << 20, std::uint64_t{1} << 20}, o,
                      id(2));
  EXPECT_ERR(r, ErrorCode::Invalid);
  EXPECT_NE(message_of(r).find("overflows"), std::string::npos) << message_of(r);
  EXPECT_ERR(build::unfold4d(t(1, {1, 2, 3, 4}), {2, 2}, {}, id(1)), ErrorCode::Invalid);
}

// ---- Quantization (docs/spec/ir.md §5.6, §6.3)

QuantScheme scheme(QuantValue value, QuantStoreKind store, std::uint8_t packed_dim, std::vector<std::uint16_t> block,
                   QuantParam param = QuantParam::F32) {
  QuantScheme q;
  q.value = value;
  q.store = store;
  q.packed_dim = packed_dim;
  q.block_rank = static_cast<std::uint8_t>(block.size());
  for (std::size_t i = 0; i < block.size(); ++i) q.block[i] = block[i];
  q.param = param;
  return q;
}

// Quantize{tensor, scales, global?, scheme} → QFloat(scheme) of the tensor's shape, carrying the
// tensor's dtype; scales shaped by the scheme's blocks; global [1] told by the input count.
TEST(BuildQuantization, QuantizeShapesAndScales) {
  const QuantScheme per_tensor{};
  BUILD(q, build::quantize(t(1, {2, 8}, dtypes::bf16), t(2, {1}), std::nullopt, per_tensor, id(4)));
  EXPECT_EQ(out(q), TensorIr::uninit(id(4), {2, 8}, DType::qfloat(per_tensor)));
  EXPECT_EQ(q.dtype, dtypes::bf16);
  EXPECT_EQ(q.num_inputs, 2);
  EXPECT_TRUE(q.attrs.empty());
  EXPECT_EQ(q.kind_name(), "Float::Quantize");
  // Blocks [1, 4] of a [2, 8] tensor: scales [2, 2]; Q4S in u32 words along the last axis; a
  // global scale as the third input.
  const QuantScheme blocks = scheme(QuantValue::Q4S, QuantStoreKind::PackedU32, 0, {1, 4}, QuantParam::F16);
  BUILD(b, build::quantize(t(1, {2, 8}), t(2, {2, 2}, dtypes::f64), t(3, {1}), blocks, id(4)));
  EXPECT_EQ(b.num_inputs, 3);
  EXPECT_EQ(out(b).dtype, DType::qfloat(blocks));
  // A block of rank 3 over a rank-2 tensor whose extra leading entry is 1; a rank-0 tensor.
  BUILD(wide, build::quantize(t(1, {4, 6}), t(2, {2, 3}), std::nullopt,
                              scheme(QuantValue::Q8F, QuantStoreKind::Native, 0, {1, 2, 2}), id(4)));
  BUILD(scalar, build::quantize(t(1, {}), t(2, {1}), std::nullopt, per_tensor, id(4)));
  EXPECT_EQ(out(scalar).shape, Shape{});
}

TEST(BuildQuantization, QuantizeErrors) {
  const QuantScheme blocks = scheme(QuantValue::Q8S, QuantStoreKind::Native, 0, {1, 4});
  auto r = build::quantize(t(1, {2, 8}), t(2, {2, 3}), std::nullopt, blocks, id(4));
  EXPECT_ERR(r, ErrorCode::IncompatibleShapes);
  EXPECT_EQ(message_of(r),
            "Float::Quantize: scales t2:f32[2,3] must have shape [2,2] (one per block of tensor [2,8] under "
            "q8s,native,block[1,4])");
  r = build::quantize(t(1, {2, 6}), t(2, {2, 2}), std::nullopt, blocks, id(4));
  EXPECT_ERR(r, ErrorCode::Invalid);
  EXPECT_EQ(message_of(r), "Float::Quantize: quant: dim 1 of size 6 is not divisible by the block's 4 ([2,6])");
  r = build::quantize(t(1, {2, 6}), t(2, {1}), std::nullopt, scheme(QuantValue::Q2S, QuantStoreKind::PackedU32, 0, {}),
                      id(4));
  EXPECT_ERR(r, ErrorCode::Invalid);
  EXPECT_EQ(message_of(r),
            "Float::Quantize: quant: the packed axis 1 of size 6 is not divisible by the 16 values of a word");
  EXPECT_ERR(build::quantize(t(1, {2, 8}), t(2, {1}), std::nullopt,
                             scheme(QuantValue::Q4S, QuantStoreKind::PackedNative, 2, {}), id(4)),
             ErrorCode::Invalid);  // packed dim beyond the rank
  EXPECT_ERR(build::quantize(t(1, {2, 8}), t(2, {1}), std::nullopt,
                             scheme(QuantValue::Q8S, QuantStoreKind::Native, 0, {2, 1, 1}), id(4)),
             ErrorCode::Invalid);  // a leading block entry beyond the rank
  QuantScheme unknown;
  unknown.value = static_cast<QuantValue>(7);
  r = build::quantize(t(1, {2, 8}), t(2, {1}), std::nullopt, unknown, id(4));
  EXPECT_ERR(r, ErrorCode::Invalid);
  EXPECT_EQ(message_of(r), "Float::Quantize: quant: unknown value type 7");
  r = build::quantize(t(1, {2, 8}, dtypes::i32), t(2, {1}), std::nullopt, QuantScheme{}, id(4));
  EXPECT_ERR(r, ErrorCode::DTypeMismatch);
  EXPECT_EQ(message_of(r), "Float::Quantize: tensor t1:i32[2,8] must have a float dtype (not a quantized one)");
  EXPECT_ERR(build::quantize(t(1, {2, 8}, DType::qfloat({})), t(2, {1}), std::nullopt, QuantScheme{}, id(4)),
             ErrorCode::DTypeMismatch);
  EXPECT_ERR(build::quantize(t(1, {2, 8}), t(2, {1}, dtypes::i64), std::nullopt, QuantScheme{}, id(4)),
             ErrorCode::DTypeMismatch);
  r = build::quantize(t(1, {2, 8}), t(2, {1}), t(3, {2}), QuantScheme{}, id(4));
  EXPECT_ERR(r, ErrorCode::IncompatibleShapes);
  EXPECT_EQ(message_of(r), "Float::Quantize: global t3:f32[2] must be a float [1]");
  EXPECT_ERR(build::quantize(t(1, {2, 8}), t(2, {1}), std::nullopt, QuantScheme{}, id(2)), ErrorCode::Invalid);
}

// Dequantize{input (QFloat)} → input's shape, the given float dtype; Cast's signature and builder.
TEST(BuildQuantization, Dequantize) {
  const DType q = DType::qfloat(scheme(QuantValue::Q4F, QuantStoreKind::PackedNative, 0, {2}));
  BUILD(de, build::dequantize(t(1, {3, 4}, q), dtypes::bf16, id(2)));
  EXPECT_EQ(out(de), TensorIr::uninit(id(2), {3, 4}, dtypes::bf16));
  EXPECT_EQ(de.dtype, q);
  EXPECT_EQ(de.kind_name(), "Float::Dequantize");
  BUILD(via_cast, build::cast(Family::Float, OpKind::Float_Dequantize, t(1, {3, 4}, q), dtypes::bf16, id(2)));
  EXPECT_EQ(via_cast, de);
  auto r = build::dequantize(t(1, {3, 4}), dtypes::f32, id(2));
  EXPECT_ERR(r, ErrorCode::DTypeMismatch);
  EXPECT_EQ(message_of(r), "Float::Dequantize: input t1:f32[3,4] must be quantized (a QFloat dtype)");
  EXPECT_ERR(build::dequantize(t(1, {3, 4}, q), dtypes::i32, id(2)), ErrorCode::DTypeMismatch);
  EXPECT_ERR(build::dequantize(t(1, {3, 4}, q), q, id(2)), ErrorCode::DTypeMismatch);  // a QFloat target
  EXPECT_ERR(build::cast(Family::BaseFloat, OpKind::Float_Dequantize, t(1, {3, 4}, q), dtypes::f32, id(2)),
             ErrorCode::Invalid);  // Dequantize is no Base kind
}

// ---- Deformable convolution (docs/spec/ir.md §5.8, §6.3)

// DeformableConv2d{x, offset, weight, mask?, bias?, options} → [N, C_out, H', W'] by the conv
// formula; attrs [present, s0, s1, p0, p1, d0, d1, wg, og], the optional tensors after weight.
TEST(BuildDeformable, ForwardShapesPresenceBitsAndAttrs) {
  const TensorIr x = t(1, {1, 4, 5, 5}, dtypes::f64), weight = t(3, {6, 4, 3, 3}, dtypes::f64);
  BUILD(plain,
        build::deformable_conv2d(x, t(2, {1, 18, 3, 3}, dtypes::f64), weight, std::nullopt, std::nullopt, {}, id(6)));
  EXPECT_EQ(out(plain), TensorIr::uninit(id(6), {1, 6, 3, 3}, dtypes::f64));
  EXPECT_EQ(plain.attrs, (AttrList{0, 1, 1, 0, 0, 1, 1, 1, 1}));
  EXPECT_EQ(plain.num_inputs, 3);
  EXPECT_EQ(plain.kind_name(), "Module::DeformableConv2d");
  // Stride 2, padding 1, dilation 2 on [2, 4, 7, 9]: H' = (7 + 2 − 4 − 1) / 2 + 1 = 3, W' = 4.
  build::DeformableConv2dOptions o;
  o.stride = {2, 2}, o.padding = {1, 1}, o.dilation = {2, 2};
  const TensorIr x2 = t(1, {2, 4, 7, 9}), w2 = t(3, {6, 4, 3, 3}), mask = t(4, {2, 9, 3, 4}), bias = t(5, {6});
  BUILD(full, build::deformable_conv2d(x2, t(2, {2, 18, 3, 4}), w2, mask, bias, o, id(6)));
  EXPECT_EQ(out(full).shape, (Shape{2, 6, 3, 4}));
  EXPECT_EQ(full.attrs, (AttrList{kPresentMask | kPresentBias, 2, 2, 1, 1, 2, 2, 1, 1}));
  EXPECT_EQ(full.inputs()[3], mask);
  EXPECT_EQ(full.inputs()[4], bias);
  BUILD(bias_only, build::deformable_conv2d(x2, t(2, {2, 18, 3, 4}), w2, std::nullopt, bias, o, id(6)));
  EXPECT_EQ(bias_only.attrs[0], kPresentBias);
  EXPECT_EQ(bias_only.inputs()[3], bias);
  // Groups: C_in 4 over 2 weight groups (weight [6, 2, 3, 3]) and 4 offset groups (offset 72).
  o = {};
  o.weight_groups = 2, o.offset_groups = 4;
  BUILD(grouped, build::deformable_conv2d(t(1, {1, 4, 5, 5}), t(2, {1, 72, 3, 3}), t(3, {6, 2, 3, 3}),
                                          t(4, {1, 36, 3, 3}), std::nullopt, o, id(6)));
  EXPECT_EQ(grouped.attrs, (AttrList{kPresentMask, 1, 1, 0, 0, 1, 1, 2, 4}));
}

// The backward's outputs: input_grad, offset_grad, weight_grad, then mask_grad? and bias_grad? iff
// mask? and bias? are inputs; every one x's dtype (offset is not checked, §6.3).
TEST(BuildDeformable, BackwardOutputsFollowThePresenceBits) {
  const TensorIr x = t(1, {1, 4, 5, 5}), offset = t(2, {1, 18, 3, 3}, dtypes::f64), weight = t(3, {6, 4, 3, 3}),
                 mask = t(4, {1, 9, 3, 3}), bias = t(5, {6}), grad = t(6, {1, 6, 3, 3}, dtypes::f16);
  BUILD(plain, build::deformable_conv2d_backward(x, offset, weight, std::nullopt, std::nullopt, grad, {},
                                                 {id(7), id(8), id(9), std::nullopt, std::nullopt}));
  ASSERT_EQ(plain.outputs().size(), 3u);
  EXPECT_EQ(out(plain, 0), TensorIr::uninit(id(7), {1, 4, 5, 5}, dtypes::f32));
  EXPECT_EQ(out(plain, 1), TensorIr::uninit(id(8), {1, 18, 3, 3}, dtypes::f32));
  EXPECT_EQ(out(plain, 2), TensorIr::uninit(id(9), {6, 4, 3, 3}, dtypes::f32));
  EXPECT_EQ(plain.num_inputs, 4);
  BUILD(both, build::deformable_conv2d_backward(x, offset, weight, mask, bias, grad, {},
                                                {id(7), id(8), id(9), id(10), id(11)}));
  ASSERT_EQ(both.outputs().size(), 5u);
  EXPECT_EQ(out(both, 3), TensorIr::uninit(id(10), {1, 9, 3, 3}, dtypes::f32));
  EXPECT_EQ(out(both, 4), TensorIr::uninit(id(11), {6}, dtypes::f32));
  EXPECT_EQ(both.inputs()[5], grad);
  EXPECT_EQ(both.attrs[0], kPresentMask | kPresentBias);
  BUILD(bias_only, build::deformable_conv2d_backward(x, offset, weight, std::nullopt, bias, grad, {},
                                                     {id(7), id(8), id(9), std::nullopt, id(11)}));
  ASSERT_EQ(bias_only.outputs().size(), 4u);
  EXPECT_EQ(out(bias_only, 3), TensorIr::uninit(id(11), {6}, dtypes::f32));
  auto r = build::deformable_conv2d_backward(x, offset, weight, mask, std::nullopt, grad, {},
                                             {id(7), id(8), id(9), std::nullopt, std::nullopt});
  EXPECT_ERR(r, ErrorCode::Invalid);
  EXPECT_EQ(
      message_of(r),
      "Module::DeformableConv2dBackward: mask_grad and bias_grad are outputs exactly when mask and bias are inputs");
  EXPECT_ERR(build::deformable_conv2d_backward(x, offset, weight, std::nullopt, std::nullopt, grad, {},
                                               {id(7), id(8), id(9), std::nullopt, id(11)}),
             ErrorCode::Invalid);
  r = build::deformable_conv2d_backward(x, offset, weight, std::nullopt, std::nullopt, t(6, {1, 6, 3, 2}), {},
                                        {id(7), id(8), id(9), std::nullopt, std::nullopt});
  EXPECT_ERR(r, ErrorCode::IncompatibleShapes);
  EXPECT_EQ(
      message_of(r),
      "Module::DeformableConv2dBackward: out_grad t6:f32[1,6,3,2] must have the forward's output shape [1,6,3,3]");
  EXPECT_ERR(build::deformable_conv2d_backward(x, offset, weight, t(4, {1, 9, 3, 3}, dtypes::f64), std::nullopt, grad,
                                               {}, {id(7), id(8), id(9), id(10), std::nullopt}),
             ErrorCode::DTypeMismatch);
  EXPECT_ERR(build::deformable_conv2d_backward(x, offset, weight, std::nullopt, std::nullopt, grad, {},
                                               {id(7), id(7), id(9), std::nullopt, std::nullopt}),
             ErrorCode::Invalid);  // one id twice
}

TEST(BuildDeformable, ErrorsNameTheOpAndTheValues) {
  const TensorIr x = t(1, {1, 4, 5, 5}), offset = t(2, {1, 36, 3, 3}), weight = t(3, {6, 2, 3, 3});
  build::DeformableConv2dOptions o;
  o.weight_groups = o.offset_groups = 2;
  auto r = build::deformable_conv2d(x, offset, t(3, {6, 3, 3, 3}), std::nullopt, std::nullopt, o, id(6));
  EXPECT_ERR(r, ErrorCode::IncompatibleShapes);
  EXPECT_EQ(message_of(r),
            "Module::DeformableConv2d: x t1:f32[1,4,5,5] has 4 channels, weight t3:f32[6,3,3,3] ([C_out, C_in / "
            "weight_groups, kh, kw]) does not fit 2 weight groups");
  build::DeformableConv2dOptions three = o;
  three.offset_groups = 3;
  r = build::deformable_conv2d(x, offset, weight, std::nullopt, std::nullopt, three, id(6));
  EXPECT_ERR(r, ErrorCode::IncompatibleShapes);
  EXPECT_EQ(message_of(r),
            "Module::DeformableConv2d: x t1:f32[1,4,5,5] has 4 channels, not divisible by 3 offset groups");
  r = build::deformable_conv2d(x, t(2, {1, 35, 3, 3}), weight, std::nullopt, std::nullopt, o, id(6));
  EXPECT_ERR(r, ErrorCode::IncompatibleShapes);
  EXPECT_EQ(message_of(r),
            "Module::DeformableConv2d: offset t2:f32[1,35,3,3] must have shape [1,36,3,3] (2 · offset_groups · kh · kw "
            "channels over the output plane)");
  r = build::deformable_conv2d(x, offset, weight, t(4, {1, 18, 3, 2}), std::nullopt, o, id(6));
  EXPECT_ERR(r, ErrorCode::IncompatibleShapes);
  EXPECT_EQ(message_of(r),
            "Module::DeformableConv2d: mask t4:f32[1,18,3,2] must have shape [1,18,3,3] (offset_groups · kh · kw "
            "channels over the output plane)");
  EXPECT_ERR(build::deformable_conv2d(x, t(2, {36, 3, 3}), weight, std::nullopt, std::nullopt, o, id(6)),
             ErrorCode::RankMismatch);
  r = build::deformable_conv2d(x, offset, weight, std::nullopt, t(5, {5}), o, id(6));
  EXPECT_ERR(r, ErrorCode::IncompatibleShapes);
  EXPECT_EQ(message_of(r), "Module::DeformableConv2d: bias t5:f32[5] must have shape [6]");
  r = build::deformable_conv2d(x, t(2, {1, 36, 3, 3}, dtypes::f64), weight, std::nullopt, std::nullopt, o, id(6));
  EXPECT_ERR(r, ErrorCode::DTypeMismatch);
  EXPECT_EQ(message_of(r), "Module::DeformableConv2d: dtypes differ: x f32 vs offset f64");
  build::DeformableConv2dOptions bad = o;
  bad.stride = {0, 1};
  r = build::deformable_conv2d(x, offset, weight, std::nullopt, std::nullopt, bad, id(6));
  EXPECT_ERR(r, ErrorCode::Invalid);
  EXPECT_EQ(message_of(r),
            "Module::DeformableConv2d: stride [0,1]: every value must be at least 1 and fit an i64 attribute");
  bad = o;
  bad.weight_groups = 0;
  r = build::deformable_conv2d(x, offset, weight, std::nullopt, std::nullopt, bad, id(6));
  EXPECT_ERR(r, ErrorCode::Invalid);
  EXPECT_EQ(message_of(r), "Module::DeformableConv2d: weight_groups 0 and offset_groups 2 must be at least 1");
  bad = o;
  bad.offset_groups = std::uint64_t{1} << 63;
  EXPECT_ERR(build::deformable_conv2d(x, offset, weight, std::nullopt, std::nullopt, bad, id(6)), ErrorCode::Invalid);
  EXPECT_ERR(build::deformable_conv2d(t(1, {1, 4, 2, 2}), offset, weight, std::nullopt, std::nullopt, o, id(6)),
             ErrorCode::Invalid);  // a 3 x 3 kernel on a 2 x 2 image: the conv formula
  EXPECT_ERR(build::deformable_conv2d(t(1, {4, 5, 5}), offset, weight, std::nullopt, std::nullopt, o, id(6)),
             ErrorCode::RankMismatch);
  EXPECT_ERR(
      build::deformable_conv2d(t(1, {1, 4, 5, 5}, dtypes::i32), offset, weight, std::nullopt, std::nullopt, o, id(6)),
      ErrorCode::DTypeMismatch);
}

// ---- Signals (docs/spec/ir.md §5.8, §6.3)

// Rfft{signal, dim, n?} → out_re, out_im: the signal with [dim] = n / 2 + 1 (n: the dim's length
// when absent), its dtype; attrs [dim, n or 0].
TEST(BuildSignal, RfftShapesAttrsAndErrors) {
  BUILD(f, build::rfft(t(1, {2, 8}, dtypes::f16), 1, std::nullopt, id(2), id(3)));
  ASSERT_EQ(f.outputs().size(), 2u);
  EXPECT_EQ(out(f, 0), TensorIr::uninit(id(2), {2, 5}, dtypes::f16));
  EXPECT_EQ(out(f, 1), TensorIr::uninit(id(3), {2, 5}, dtypes::f16));
  EXPECT_EQ(f.attrs, (AttrList{1, 0}));
  EXPECT_EQ(f.kind_name(), "Module::Rfft");
  BUILD(padded, build::rfft(t(1, {3, 4}), 1, 5, id(2), id(3)));  // 4 points padded to 5: bins 0 .. 2
  EXPECT_EQ(out(padded).shape, (Shape{3, 3}));
  EXPECT_EQ(padded.attrs, (AttrList{1, 5}));
  BUILD(trimmed, build::rfft(t(1, {2, 8}), 1, 3, id(2), id(3)));
  EXPECT_EQ(out(trimmed, 1).shape, (Shape{2, 2}));
  BUILD(dim0, build::rfft(t(1, {7, 2}), 0, std::nullopt, id(2), id(3)));
  EXPECT_EQ(out(dim0).shape, (Shape{4, 2}));
  BUILD(empty_given_n, build::rfft(t(1, {2, 0}), 1, 4, id(2), id(3)));  // all zeros: nothing to sum
  EXPECT_EQ(out(empty_given_n).shape, (Shape{2, 3}));
  auto r = build::rfft(t(1, {2, 8}), 2, std::nullopt, id(2), id(3));
  EXPECT_ERR(r, ErrorCode::OutOfBounds);
  EXPECT_EQ(message_of(r), "Module::Rfft: dim 2 out of bounds for rank 2 ([2,8])");
  r = build::rfft(t(1, {2, 8}), 1, 0, id(2), id(3));
  EXPECT_ERR(r, ErrorCode::Invalid);
  EXPECT_EQ(message_of(r), "Module::Rfft: n must be at least 1");
  r = build::rfft(t(1, {2, 8}), 1, std::uint64_t{1} << 63, id(2), id(3));
  EXPECT_ERR(r, ErrorCode::Invalid);
  EXPECT_EQ(message_of(r), "Module::Rfft: n 9223372036854775808 exceeds the i64 range");
  r = build::rfft(t(1, {2, 0}), 1, std::nullopt, id(2), id(3));
  EXPECT_ERR(r, ErrorCode::Invalid);
  EXPECT_EQ(message_of(r), "Module::Rfft: signal t1:f32[2,0] has no points along dim 1 (give n >= 1)");
  r = build::rfft(t(1, {4}, dtypes::i32), 0, std::nullopt, id(2), id(3));
  EXPECT_ERR(r, ErrorCode::DTypeMismatch);
  EXPECT_EQ(message_of(r), "Module::Rfft: signal t1:i32[4] must have a float dtype");
  EXPECT_ERR(build::rfft(t(1, {4}), 0, std::nullopt, id(2), id(2)), ErrorCode::Invalid);  // one id twice
  EXPECT_ERR(build::rfft(t(1, {4}), 0, std::nullopt, id(2), id(1)), ErrorCode::Invalid);  // an input's id
  EXPECT_ERR(build::rfft(t(1, {}), 0, std::nullopt, id(2), id(3)), ErrorCode::OutOfBounds);
}

// IRfft{input_re, input_im, dim, n?}: input_re with [dim] = n, 2·(len − 1) when absent.
TEST(BuildSignal, IRfftShapesAttrsAndErrors) {
  BUILD(f, build::irfft(t(1, {2, 5}, dtypes::f64), t(2, {2, 5}, dtypes::f64), 1, std::nullopt, id(3)));
  EXPECT_EQ(out(f), TensorIr::uninit(id(3), {2, 8}, dtypes::f64));
  EXPECT_EQ(f.attrs, (AttrList{1, 0}));
  EXPECT_EQ(f.num_inputs, 2);
  BUILD(odd, build::irfft(t(1, {2, 5}), t(2, {2, 5}), 1, 7, id(3)));
  EXPECT_EQ(out(odd).shape, (Shape{2, 7}));
  EXPECT_EQ(odd.attrs, (AttrList{1, 7}));
  BUILD(one_bin, build::irfft(t(1, {1, 3}), t(2, {1, 3}), 0, 4, id(3)));
  EXPECT_EQ(out(one_bin).shape, (Shape{4, 3}));
  auto r = build::irfft(t(1, {2, 5}), t(2, {2, 5}, dtypes::f64), 1, std::nullopt, id(3));
  EXPECT_ERR(r, ErrorCode::DTypeMismatch);
  EXPECT_EQ(message_of(r), "Module::IRfft: dtypes differ: input_re f32 vs input_im f64");
  r = build::irfft(t(1, {2, 5}), t(2, {2, 4}), 1, std::nullopt, id(3));
  EXPECT_ERR(r, ErrorCode::IncompatibleShapes);
  EXPECT_EQ(message_of(r), "Module::IRfft: input_im t2:f32[2,4] must have input_re t1:f32[2,5]'s shape");
  r = build::irfft(t(1, {2, 0}), t(2, {2, 0}), 1, 4, id(3));
  EXPECT_ERR(r, ErrorCode::Invalid);
  EXPECT_EQ(message_of(r), "Module::IRfft: input_re t1:f32[2,0] has no bins along dim 1");
  r = build::irfft(t(1, {3, 1}), t(2, {3, 1}), 1, std::nullopt, id(3));
  EXPECT_ERR(r, ErrorCode::Invalid);
  EXPECT_EQ(message_of(r), "Module::IRfft: input_re t1:f32[3,1] gives 0 output points along dim 1 (give n >= 1)");
  r = build::irfft(t(1, {3, 2}), t(2, {3, 2}), 1, 0, id(3));
  EXPECT_ERR(r, ErrorCode::Invalid);
  EXPECT_EQ(message_of(r), "Module::IRfft: n must be at least 1");
  EXPECT_ERR(build::irfft(t(1, {3, 2}), t(2, {3, 2}), 2, std::nullopt, id(3)), ErrorCode::OutOfBounds);
  EXPECT_ERR(build::irfft(t(1, {3, 2}, dtypes::i64), t(2, {3, 2}, dtypes::i64), 1, std::nullopt, id(3)),
             ErrorCode::DTypeMismatch);
  EXPECT_ERR(build::irfft(t(1, {3, 2}), t(2, {3, 2}), 1, std::nullopt, id(2)), ErrorCode::Invalid);
}

// ---- Attention and the CTC loss (docs/spec/ir.md §5.8, §6.3)

// Attention{query, key, value, mask?, attn_bias?, options} → [B, H, Lq, Dv]; attrs [present,
// is_causal, bits(scale), bits(softcap)], the optional tensors after value, mask first.
TEST(BuildSequence, AttentionShapesPresenceBitsAndAttrs) {
  const TensorIr q = t(1, {2, 3, 4, 8}, dtypes::f16), k = t(2, {2, 3, 5, 8}, dtypes::f16),
                 v = t(3, {2, 3, 5, 6}, dtypes::f16);
  BUILD(plain, build::attention(q, k, v, std::nullopt, std::nullopt, {}, id(6)));
  EXPECT_EQ(out(plain), TensorIr::uninit(id(6), {2, 3, 4, 6}, dtypes::f16));
  EXPECT_EQ(plain.attrs, (AttrList{0, 0, 0, 0}));
  EXPECT_EQ(plain.num_inputs, 3);
  EXPECT_EQ(plain.kind_name(), "Module::Attention");
  const TensorIr mask = t(4, {2, 1, 4, 5}, kBool), bias = t(5, {1, 3, 1, 5}, dtypes::f16);
  BUILD(full, build::attention(q, k, v, mask, bias, {0.25, 30.0, true}, id(6)));
  EXPECT_EQ(full.attrs,
            (AttrList{kPresentMask | kPresentBias | kPresentScale | kPresentSoftcap, 1, bits(0.25), bits(30.0)}));
  ASSERT_EQ(full.num_inputs, 5);
  EXPECT_EQ(full.inputs()[3], mask);
  EXPECT_EQ(full.inputs()[4], bias);
  // attn_bias alone is the fourth input, told by its bit; a softcap alone sets bit 3 only.
  BUILD(bias_only, build::attention(q, k, v, std::nullopt, bias, {std::nullopt, 5.0, false}, id(6)));
  EXPECT_EQ(bias_only.attrs, (AttrList{kPresentBias | kPresentSoftcap, 0, 0, bits(5.0)}));
  EXPECT_EQ(bias_only.inputs()[3], bias);
  BUILD(mask_only, build::attention(q, k, v, mask, std::nullopt, {-2.0, std::nullopt, true}, id(6)));
  EXPECT_EQ(mask_only.attrs, (AttrList{kPresentMask | kPresentScale, 1, bits(-2.0), 0}));
  BUILD(no_keys, build::attention(t(1, {1, 1, 2, 3}), t(2, {1, 1, 0, 3}), t(3, {1, 1, 0, 4}), std::nullopt,
                                  std::nullopt, {}, id(6)));
  EXPECT_EQ(out(no_keys).shape, (Shape{1, 1, 2, 4}));
}

TEST(BuildSequence, AttentionErrors) {
  const TensorIr q = t(1, {2, 3, 4, 8}), k = t(2, {2, 3, 5, 8}), v = t(3, {2, 3, 5, 6});
  auto r = build::attention(t(1, {2, 3, 4}), k, v, std::nullopt, std::nullopt, {}, id(6));
  EXPECT_ERR(r, ErrorCode::RankMismatch);
  EXPECT_EQ(message_of(r), "Module::Attention: query must have rank 4, has rank 3 (t1:f32[2,3,4])");
  r = build::attention(q, t(2, {2, 3, 5, 7}), v, std::nullopt, std::nullopt, {}, id(6));
  EXPECT_ERR(r, ErrorCode::IncompatibleShapes);
  EXPECT_EQ(message_of(r), "Module::Attention: key t2:f32[2,3,5,7] must be [2, 3, Lk, 8] for query t1:f32[2,3,4,8]");
  r = build::attention(q, k, t(3, {2, 3, 4, 6}), std::nullopt, std::nullopt, {}, id(6));
  EXPECT_ERR(r, ErrorCode::IncompatibleShapes);
  EXPECT_EQ(message_of(r),
            "Module::Attention: value t3:f32[2,3,4,6] must be [2, 3, 5, Dv] for query [2,3,4,8] and key [2,3,5,8]");
  r = build::attention(q, t(2, {2, 3, 5, 8}, dtypes::f64), v, std::nullopt, std::nullopt, {}, id(6));
  EXPECT_ERR(r, ErrorCode::DTypeMismatch);
  EXPECT_EQ(message_of(r), "Module::Attention: dtypes differ: query f32 vs key f64");
  r = build::attention(q, k, v, t(4, {2, 3, 4, 5}), std::nullopt, {}, id(6));
  EXPECT_ERR(r, ErrorCode::DTypeMismatch);
  EXPECT_EQ(message_of(r), "Module::Attention: mask must be a bool dtype, got f32");
  r = build::attention(q, k, v, t(4, {2, 3, 4, 4}, kBool), std::nullopt, {}, id(6));
  EXPECT_ERR(r, ErrorCode::IncompatibleShapes);
  EXPECT_NE(message_of(r).find("does not broadcast to the scores' shape [2,3,4,5]"), std::string::npos)
      << message_of(r);
  EXPECT_ERR(build::attention(q, k, v, t(4, {4, 5}, kBool), std::nullopt, {}, id(6)), ErrorCode::RankMismatch);
  r = build::attention(q, k, v, std::nullopt, t(5, {2, 3, 4, 5}, dtypes::f64), {}, id(6));
  EXPECT_ERR(r, ErrorCode::DTypeMismatch);
  EXPECT_EQ(message_of(r), "Module::Attention: dtypes differ: query f32 vs attn_bias f64");
  EXPECT_ERR(build::attention(q, k, v, std::nullopt, t(5, {2, 2, 4, 5}), {}, id(6)), ErrorCode::IncompatibleShapes);
  r = build::attention(q, k, v, std::nullopt, std::nullopt, {std::nan(""), std::nullopt, false}, id(6));
  EXPECT_ERR(r, ErrorCode::Invalid);
  EXPECT_EQ(message_of(r), "Module::Attention: scale must be finite, got nan");
  r = build::attention(q, k, v, std::nullopt, std::nullopt, {std::nullopt, 0.0, false}, id(6));
  EXPECT_ERR(r, ErrorCode::Invalid);
  EXPECT_EQ(message_of(r), "Module::Attention: softcap must be finite and positive, got 0");
  EXPECT_ERR(build::attention(q, k, v, std::nullopt, std::nullopt, {std::nullopt, -1.0, false}, id(6)),
             ErrorCode::Invalid);
  EXPECT_ERR(build::attention(t(1, {2, 3, 4, 8}, dtypes::i32), t(2, {2, 3, 5, 8}, dtypes::i32),
                              t(3, {2, 3, 5, 6}, dtypes::i32), std::nullopt, std::nullopt, {}, id(6)),
             ErrorCode::DTypeMismatch);
  EXPECT_ERR(build::attention(q, k, v, std::nullopt, std::nullopt, {}, id(2)), ErrorCode::Invalid);  // key's id
}

// CtcLoss{log_probs [T, N, C], targets [N, S], input_lengths [N], target_lengths [N], blank} → [N];
// the backward → log_probs' shape; both log_probs' dtype, attrs [blank].
TEST(BuildSequence, CtcLossAndItsBackward) {
  const TensorIr lp = t(1, {6, 2, 4}), tg = t(2, {2, 3}, dtypes::i64), il = t(3, {2}, dtypes::i32),
                 tl = t(4, {2}, dtypes::u8);
  BUILD(loss, build::ctc_loss(lp, tg, il, tl, 3, id(6)));
  EXPECT_EQ(out(loss), TensorIr::uninit(id(6), {2}, dtypes::f32));
  EXPECT_EQ(loss.attrs, (AttrList{3}));
  EXPECT_EQ(loss.kind_name(), "Module::CtcLoss");
  BUILD(grad, build::ctc_loss_backward(lp, tg, il, tl, t(5, {2}, dtypes::f64), 0, id(6)));
  EXPECT_EQ(out(grad), TensorIr::uninit(id(6), {6, 2, 4}, dtypes::f32));
  EXPECT_EQ(grad.num_inputs, 5);
  auto r = build::ctc_loss(t(1, {6, 8}), tg, il, tl, 0, id(6));
  EXPECT_ERR(r, ErrorCode::RankMismatch);
  EXPECT_EQ(message_of(r), "Module::CtcLoss: log_probs must have rank 3, has rank 2 (t1:f32[6,8])");
  EXPECT_ERR(build::ctc_loss(t(1, {6, 2, 4}, dtypes::i32), tg, il, tl, 0, id(6)), ErrorCode::DTypeMismatch);
  r = build::ctc_loss(lp, t(2, {2, 3}), il, tl, 0, id(6));
  EXPECT_ERR(r, ErrorCode::DTypeMismatch);
  EXPECT_EQ(message_of(r), "Module::CtcLoss: targets must be an integer dtype, got f32");
  EXPECT_ERR(build::ctc_loss(lp, t(2, {6}, dtypes::i64), il, tl, 0, id(6)), ErrorCode::RankMismatch);
  r = build::ctc_loss(lp, tg, t(3, {3}, dtypes::i32), tl, 0, id(6));
  EXPECT_ERR(r, ErrorCode::IncompatibleShapes);
  EXPECT_EQ(message_of(r), "Module::CtcLoss: input_lengths t3:i32[3] must have the batch N = 2 of log_probs [6,2,4]");
  EXPECT_ERR(build::ctc_loss(lp, t(2, {3, 3}, dtypes::i64), il, tl, 0, id(6)), ErrorCode::IncompatibleShapes);
  EXPECT_ERR(build::ctc_loss(lp, tg, il, t(4, {2}, kBool), 0, id(6)), ErrorCode::DTypeMismatch);
  r = build::ctc_loss(lp, tg, il, tl, 4, id(6));
  EXPECT_ERR(r, ErrorCode::OutOfBounds);
  EXPECT_EQ(message_of(r), "Module::CtcLoss: blank 4 out of range for the 4 classes of log_probs [6,2,4]");
  r = build::ctc_loss_backward(lp, tg, il, tl, t(5, {3}), 0, id(6));
  EXPECT_ERR(r, ErrorCode::IncompatibleShapes);
  EXPECT_EQ(message_of(r), "Module::CtcLossBackward: grad_loss t5:f32[3] must have shape [2] (log_probs [6,2,4])");
  EXPECT_ERR(build::ctc_loss_backward(lp, tg, il, tl, t(5, {2}, dtypes::i64), 0, id(6)), ErrorCode::DTypeMismatch);
  EXPECT_ERR(build::ctc_loss_backward(lp, tg, il, tl, t(5, {2}), 9, id(6)), ErrorCode::OutOfBounds);
  EXPECT_ERR(build::ctc_loss(lp, tg, il, tl, 0, id(4)), ErrorCode::Invalid);  // target_lengths' id
}

TEST(BuildLifecycle, InitCustomDrop) {
  BUILD(init, build::init({2, 3}, dtypes::u8, id(1)));
  EXPECT_EQ(init.kind_name(), "Init::InitOperationIr");
  EXPECT_TRUE(init.inputs().empty());
  EXPECT_EQ(out(init), TensorIr::uninit(id(1), {2, 3}, dtypes::u8));

  const std::vector<TensorIr> ins{t(1, {2}), t(2, {3}, dtypes::i32, TensorStatus::ReadWrite)};
  const std::vector<TensorIr> outs{TensorIr::uninit(id(3), {4}, dtypes::f32), TensorIr::uninit(id(4), {}, kBool)};
  const std::vector<ScalarIr> scalars{ScalarIr::Int(12)};
  BUILD(custom, build::custom("my_kernel", ins, outs, scalars));
  EXPECT_EQ(custom.kind_name(), "Custom");
  EXPECT_EQ(custom.custom_id, "my_kernel");
  EXPECT_EQ(custom.num_inputs, 2);
  EXPECT_EQ(custom.outputs().size(), 2u);
  EXPECT_EQ(custom.scalars, (ScalarList{ScalarIr::Int(12)}));
  const std::vector<TensorIr> bad_outs{t(3, {4})};
  EXPECT_ERR(build::custom("my_kernel", ins, bad_outs, {}), ErrorCode::Invalid);
  EXPECT_ERR(build::custom("", ins, outs, {}), ErrorCode::Invalid);
  const std::vector<TensorIr> uninit_in{TensorIr::uninit(id(1), {2}, dtypes::f32)};
  EXPECT_ERR(build::custom("k", uninit_in, outs, {}), ErrorCode::Invalid);
  BUILD(no_tensors, build::custom("barrier", {}, {}, {}));

  BUILD(drop, build::drop(t(5, {2, 2}, dtypes::f32, TensorStatus::ReadWrite)));
  EXPECT_EQ(drop.kind_name(), "Drop");
  EXPECT_EQ(drop.inputs().size(), 1u);
  EXPECT_TRUE(drop.outputs().empty());
  auto r = build::drop(t(5, {2, 2}));
  EXPECT_ERR(r, ErrorCode::Invalid);
  EXPECT_EQ(message_of(r), "Drop: t5:f32[2,2] must have status ReadWrite, has ReadOnly");
}

TEST(BuildDistributed, AllReduceAndSync) {
  const build::DeviceId devices[] = {{1, 0}, {1, 3}};
  BUILD(ar, build::all_reduce(t(1, {8}, dtypes::bf16), ReduceOperation::Mean, devices, id(2)));
  EXPECT_EQ(out(ar), TensorIr::uninit(id(2), {8}, dtypes::bf16));
  EXPECT_EQ(ar.attrs, (AttrList{static_cast<std::int64_t>(ReduceOperation::Mean), 1 << 16, (1 << 16) | 3}));
  EXPECT_EQ(ar.kind_name(), "Distributed::AllReduce");
  // Min, max and prod: the kiln extension (docs/decisions.md); past it, an error.
  for (ReduceOperation op : {ReduceOperation::Min, ReduceOperation::Max, ReduceOperation::Prod})
    EXPECT_TRUE(build::all_reduce(t(1, {8}), op, {}, id(2)).ok()) << reduce_operation_name(op);
  auto bad = build::all_reduce(t(1, {8}), static_cast<ReduceOperation>(5), {}, id(2));
  EXPECT_ERR(bad, ErrorCode::Invalid);
  EXPECT_EQ(message_of(bad), "Distributed::AllReduce: unknown reduce operation 5");
  BUILD(sync, build::sync_collective());
  EXPECT_TRUE(sync.tensors.empty());
  EXPECT_EQ(sync.kind_name(), "Distributed::SyncCollective");
}

// Broadcast, AllGather and ReduceScatter (kiln extensions): shapes from the named world, and
// errors for a root outside it, an unnamed world, a dim that does not divide.
TEST(BuildDistributed, BroadcastAllGatherReduceScatter) {
  const build::DeviceId world[] = {{1, 0}, {1, 1}, {1, 2}};
  BUILD(bc, build::broadcast(t(1, {4, 5}, dtypes::f16), 2, world, id(2)));
  EXPECT_EQ(out(bc), TensorIr::uninit(id(2), {4, 5}, dtypes::f16));
  EXPECT_EQ(bc.attrs, (AttrList{2, 1 << 16, (1 << 16) | 1, (1 << 16) | 2}));
  EXPECT_EQ(bc.kind_name(), "Distributed::Broadcast");
  BUILD(bc_world, build::broadcast(t(1, {4}), 7, {}, id(2)));
  EXPECT_EQ(bc_world.attrs, (AttrList{7}));
  auto bad_root = build::broadcast(t(1, {4}), 3, world, id(2));
  EXPECT_ERR(bad_root, ErrorCode::Invalid);
  EXPECT_EQ(message_of(bad_root), "Distributed::Broadcast: root 3 is not one of the 3 ranks named");

  BUILD(ag, build::all_gather(t(1, {4, 5}, dtypes::i32), 1, world, id(2)));
  EXPECT_EQ(out(ag), TensorIr::uninit(id(2), {4, 15}, dtypes::i32));
  EXPECT_EQ(ag.attrs, (AttrList{1, 1 << 16, (1 << 16) | 1, (1 << 16) | 2}));
  EXPECT_EQ(ag.kind_name(), "Distributed::AllGather");
  auto unnamed = build::all_gather(t(1, {4}), 0, {}, id(2));
  EXPECT_ERR(unnamed, ErrorCode::Invalid);
  EXPECT_EQ(message_of(unnamed), "Distributed::AllGather: name the world's device ids (their number sizes the output)");
  EXPECT_ERR(build::all_gather(t(1, {4}), 1, world, id(2)), ErrorCode::OutOfBounds);

  BUILD(rs, build::reduce_scatter(t(1, {6, 2}), ReduceOperation::Mean, 0, world, id(2)));
  EXPECT_EQ(out(rs), TensorIr::uninit(id(2), {2, 2}, dtypes::f32));
  EXPECT_EQ(rs.attrs,
            (AttrList{static_cast<std::int64_t>(ReduceOperation::Mean), 0, 1 << 16, (1 << 16) | 1, (1 << 16) | 2}));
  auto uneven = build::reduce_scatter(t(1, {4, 2}), ReduceOperation::Sum, 0, world, id(2));
  EXPECT_ERR(uneven, ErrorCode::Invalid);
  EXPECT_EQ(message_of(uneven), "Distributed::ReduceScatter: dim 0 of [4,2] does not divide into 3 equal parts");
  EXPECT_ERR(build::reduce_scatter(t(1, {6}), static_cast<ReduceOperation>(9), 0, world, id(2)), ErrorCode::Invalid);
}

}  // namespace
}  // namespace kiln::ir
