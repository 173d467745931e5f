// Reference executor: unary, binary and scalar arithmetic, comparisons, bitwise and bool ops,
// casts, clamp, mask_where and mask_fill. Expected values are computed by hand.
#include "kiln/testing/status.h"
#include "reference_test_util.h"

namespace kiln::reference::testing {
namespace {

using F = Family;
using K = OpKind;

// ---- Unary

TEST(ReferenceUnaryTest, FloatFunctions) {
  Device d;
  const TensorIr x = d.f64({4}, dtypes::f64, {0.0, 1.0, -2.0, 0.5});
  auto run = [&](K k) { return d.f64_of(d.ok(b::unary(F::Float, k, x, d.fresh()))); };
  EXPECT_THAT(run(K::Float_Exp),
              Near(std::vector<double>{1, 2.718281828459045, 0.1353352832366127, 1.6487212707001282}, 1e-15));
  EXPECT_THAT(run(K::Float_Log), NanEq(std::vector<double>{-kInf, 0, kNaN, std::log(0.5)}));
  EXPECT_THAT(run(K::Float_Log1p), Near(std::vector<double>{0, std::log(2.0), kNaN, std::log(1.5)}, 1e-15));
  EXPECT_THAT(run(K::Float_Sqrt), NanEq(std::vector<double>{0, 1, kNaN, std::sqrt(0.5)}));
  EXPECT_THAT(run(K::Float_Recip), NanEq(std::vector<double>{kInf, 1, -0.5, 2}));
  EXPECT_THAT(run(K::Float_Erf),
              Near(std::vector<double>{0, 0.8427007929497149, -0.9953222650189527, 0.5204998778130465}, 1e-15));
  EXPECT_THAT(run(K::Float_Cos), Near(std::vector<double>{1, std::cos(1.0), std::cos(-2.0), std::cos(0.5)}, 0));
  EXPECT_THAT(run(K::Float_Sin), Near(std::vector<double>{0, std::sin(1.0), std::sin(-2.0), std::sin(0.5)}, 0));
  EXPECT_THAT(run(K::Float_Tanh),
              Near(std::vector<double>{0, 0.7615941559557649, -0.9640275800758169, 0.46211715726000974}, 1e-15));
}

// Cosh … ArcTanh (docs/spec/ir.md §5.6): libm in f64, rounded once; C's (and PyTorch's) domain
// edges. Expected values from the closed forms (cosh 1 = (e + 1/e) / 2, acos ½ = π/3,
// asinh 1 = ln(1 + √2), atanh ½ = ln(3) / 2, ...).
TEST(ReferenceUnaryTest, TrigonometricAndHyperbolicFunctions) {
  Device d;
  const TensorIr x = d.f64({5}, dtypes::f64, {0.0, 0.5, -1.0, 2.0, kInf});
  auto run = [&](K k) { return d.f64_of(d.ok(b::unary(F::Float, k, x, d.fresh()))); };
  EXPECT_THAT(run(K::Float_Cosh),
              Near(std::vector<double>{1, 1.1276259652063807, 1.5430806348152437, 3.7621956910836314, kInf}, 1e-15));
  EXPECT_THAT(run(K::Float_Sinh),
              Near(std::vector<double>{0, 0.5210953054937474, -1.1752011936438014, 3.626860407847019, kInf}, 1e-15));
  // tan(2) is in the second quadrant: negative; tan(inf) is NaN.
  EXPECT_THAT(run(K::Float_Tan),
              Near(std::vector<double>{0, 0.5463024898437905, -1.5574077246549023, -2.185039863261519, kNaN}, 1e-15));
  // Outside [-1, 1]: NaN (acos(2) = NaN).
  EXPECT_THAT(run(K::Float_ArcCos),
              Near(std::vector<double>{1.5707963267948966, 1.0471975511965976, 3.141592653589793, kNaN, kNaN}, 1e-15));
  EXPECT_THAT(run(K::Float_ArcSin),
              Near(std::vector<double>{0, 0.5235987755982988, -1.5707963267948966, kNaN, kNaN}, 1e-15));
  EXPECT_THAT(run(K::Float_ArcTan), Near(std::vector<double>{0, 0.4636476090008061, -0.7853981633974483,
                                                             1.1071487177940904, 1.5707963267948966},
                                         1e-15));
  EXPECT_THAT(run(K::Float_ArcSinh),
              Near(std::vector<double>{0, 0.48121182505960347, -0.881373587019543, 1.4436354751788103, kInf}, 1e-15));
  // acosh: NaN below 1; acosh(2) = ln(2 + √3).
  EXPECT_THAT(run(K::Float_ArcCosh), Near(std::vector<double>{kNaN, kNaN, kNaN, 1.3169578969248166, kInf}, 1e-15));
  // atanh: ±inf at ±1, NaN beyond.
  EXPECT_THAT(run(K::Float_ArcTanh), Near(std::vector<double>{0, 0.5493061443340549, -kInf, kNaN, kNaN}, 1e-15));
  const TensorIr poles = d.f64({4}, dtypes::f64, {1.0, -1.0, 1.0000001, -0.0});
  const std::vector<double> th = d.f64_of(d.ok(b::unary(F::Float, K::Float_ArcTanh, poles, d.fresh())));
  EXPECT_THAT(th, NanEq(std::vector<double>{kInf, -kInf, kNaN, 0}));
  EXPECT_TRUE(std::signbit(th[3])) << "atanh(-0) = -0";
  const std::vector<double> sn = d.f64_of(d.ok(b::unary(F::Float, K::Float_ArcSin, poles, d.fresh())));
  EXPECT_THAT(sn, NanEq(std::vector<double>{1.5707963267948966, -1.5707963267948966, kNaN, 0}));
  EXPECT_TRUE(std::signbit(sn[3])) << "asin(-0) = -0";
}

// The f64 value is rounded once to the dtype: acos(½) in f32 is π/3 rounded to f32, not a
// float computation's result; cosh overflows f16 (max 65504) to inf.
TEST(ReferenceUnaryTest, TrigonometricFunctionsRoundOnceToTheDtype) {
  Device d;
  const TensorIr x = d.f64({2}, dtypes::f32, {0.5, 12.0});
  EXPECT_EQ(d.f64_of(d.ok(b::unary(F::Float, K::Float_ArcCos, x, d.fresh())))[0], 1.0471975803375244);
  EXPECT_EQ(d.f64_of(d.ok(b::unary(F::Float, K::Float_Cosh, x, d.fresh())))[1], 81377.3984375);  // f32(81377.39571...)
  const TensorIr h = d.f64({2}, dtypes::f16, {12.0, -12.0});
  EXPECT_THAT(d.f64_of(d.ok(b::unary(F::Float, K::Float_Cosh, h, d.fresh()))), NanEq(std::vector<double>{kInf, kInf}));
  EXPECT_THAT(d.f64_of(d.ok(b::unary(F::Float, K::Float_Sinh, h, d.fresh()))), NanEq(std::vector<double>{kInf, -kInf}));
}

TEST(ReferenceUnaryTest, TrigonometricKindsRefuseIntegerOperands) {
  Device d;
  const TensorIr xi = d.i64({2}, dtypes::i32, {0, 1});
  // The builders refuse an integer operand; a hand-made op meets the executor's family check.
  Operation op = *b::unary(F::Float, K::Float_ArcTanh, d.f64({2}, dtypes::f32, {0, 0.5}), d.fresh());
  op.tensors[0] = xi;
  Status st = d.exec.execute(op, d.handles);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ErrorCode::DTypeMismatch) << st.error().to_string();
}

TEST(ReferenceUnaryTest, RoundingFamilyRoundsHalfToEven) {
  Device d;
  const TensorIr x = d.f64({8}, dtypes::f32, {0.5, 1.5, 2.5, -0.5, -1.5, -2.7, 2.3, kNaN});
  auto run = [&](K k) { return d.f64_of(d.ok(b::unary(F::Float, k, x, d.fresh()))); };
  EXPECT_THAT(run(K::Float_Round), NanEq(std::vector<double>{0, 2, 2, -0.0, -2, -3, 2, kNaN}));
  EXPECT_THAT(run(K::Float_Floor), NanEq(std::vector<double>{0, 1, 2, -1, -2, -3, 2, kNaN}));
  EXPECT_THAT(run(K::Float_Ceil), NanEq(std::vector<double>{1, 2, 3, -0.0, -1, -2, 3, kNaN}));
  EXPECT_THAT(run(K::Float_Trunc), NanEq(std::vector<double>{0, 1, 2, -0.0, -1, -2, 2, kNaN}));
}

TEST(ReferenceUnaryTest, NumericUnaryOnFloatsAndInts) {
  Device d;
  const TensorIr xf = d.f64({5}, dtypes::f16, {-1.5, 0.0, 2.0, kNaN, -kInf});
  EXPECT_THAT(d.f64_of(d.ok(b::unary(F::NumericFloat, K::Numeric_Abs, xf, d.fresh()))),
              NanEq(std::vector<double>{1.5, 0, 2, kNaN, kInf}));
  EXPECT_THAT(d.f64_of(d.ok(b::unary(F::NumericFloat, K::Numeric_Neg, xf, d.fresh()))),
              NanEq(std::vector<double>{1.5, -0.0, -2, kNaN, kInf}));
  // Sign of NaN is 0 (Burn's float_sign lowering), of ±0 is 0.
  EXPECT_THAT(d.f64_of(d.ok(b::unary(F::NumericFloat, K::Numeric_Sign, xf, d.fresh()))),
              NanEq(std::vector<double>{-1, 0, 1, 0, -1}));

  const TensorIr xi = d.i64({4}, dtypes::i8, {-128, -3, 0, 7});
  EXPECT_EQ(d.i64_of(d.ok(b::unary(F::NumericInt, K::Numeric_Abs, xi, d.fresh()))),
            (std::vector<std::int64_t>{-128, 3, 0, 7}));  // |i8 min| wraps to itself
  EXPECT_EQ(d.i64_of(d.ok(b::unary(F::NumericInt, K::Numeric_Neg, xi, d.fresh()))),
            (std::vector<std::int64_t>{-128, 3, 0, -7}));
  EXPECT_EQ(d.i64_of(d.ok(b::unary(F::NumericInt, K::Numeric_Sign, xi, d.fresh()))),
            (std::vector<std::int64_t>{-1, -1, 0, 1}));
  const TensorIr xu = d.u64({3}, dtypes::u16, {0, 1, 65535});
  EXPECT_EQ(d.u64_of(d.ok(b::unary(F::NumericInt, K::Numeric_Neg, xu, d.fresh()))),
            (std::vector<std::uint64_t>{0, 65535, 1}));
  EXPECT_EQ(d.u64_of(d.ok(b::unary(F::NumericInt, K::Numeric_Sign, xu, d.fresh()))),
            (std::vector<std::uint64_t>{0, 1, 1}));
  const TensorIr x64 = d.i64({2}, dtypes::i64, {std::numeric_limits<std::int64_t>::min(), 5});
  EXPECT_EQ(d.i64_of(d.ok(b::unary(F::NumericInt, K::Numeric_Abs, x64, d.fresh()))),
            (std::vector<std::int64_t>{std::numeric_limits<std::int64_t>::min(), 5}));
}

TEST(ReferenceUnaryTest, BitwiseNotAndBoolNot) {
  Device d;
  const TensorIr xi = d.i64({3}, dtypes::i32, {0, -1, 5});
  EXPECT_EQ(d.i64_of(d.ok(b::unary(F::Int, K::Int_BitwiseNot, xi, d.fresh()))), (std::vector<std::int64_t>{-1, 0, -6}));
  const TensorIr xu = d.u64({2}, dtypes::u8, {0, 0xF0});
  EXPECT_EQ(d.u64_of(d.ok(b::unary(F::Int, K::Int_BitwiseNot, xu, d.fresh()))),
            (std::vector<std::uint64_t>{255, 0x0F}));
  const TensorIr xb = d.boolean({3}, {true, false, true}, DType::boolean(BoolStore::U32));
  EXPECT_EQ(d.bool_of(d.ok(b::unary(F::Bool, K::Bool_Not, xb, d.fresh()))), (std::vector<bool>{false, true, false}));
}

TEST(ReferenceUnaryTest, IsNanIsInfWriteTheBoolDtype) {
  Device d;
  const TensorIr x = d.f64({4}, dtypes::bf16, {1, kNaN, -kInf, kInf});
  const TensorId n = d.ok(b::unary_comparison(F::Float, K::Float_IsNan, x, DType::boolean(BoolStore::U8), d.fresh()));
  EXPECT_EQ(d.tensor(n).dtype(), DType::boolean(BoolStore::U8));
  EXPECT_EQ(d.bool_of(n), (std::vector<bool>{false, true, false, false}));
  const TensorId i = d.ok(b::unary_comparison(F::Float, K::Float_IsInf, x, dtypes::boolean, d.fresh()));
  EXPECT_EQ(d.bool_of(i), (std::vector<bool>{false, false, true, true}));
}

// ---- Binary

TEST(ReferenceBinaryTest, FloatArithmeticBroadcasts) {
  Device d;
  const TensorIr a = d.f64({2, 1}, dtypes::f32, {1, 2});
  const TensorIr c = d.f64({1, 3}, dtypes::f32, {10, 20, 30});
  auto run = [&](K k) { return d.f64_of(d.ok(b::binary(F::NumericFloat, k, a, c, d.fresh()))); };
  EXPECT_EQ(run(K::Numeric_Add), (std::vector<double>{11, 21, 31, 12, 22, 32}));
  EXPECT_EQ(run(K::Numeric_Sub), (std::vector<double>{-9, -19, -29, -8, -18, -28}));
  EXPECT_EQ(run(K::Numeric_Mul), (std::vector<double>{10, 20, 30, 20, 40, 60}));
  EXPECT_THAT(run(K::Numeric_Div), Near(std::vector<double>{0.1, 0.05, 1.0 / 30, 0.2, 0.1, 2.0 / 30}, 1e-7));
  EXPECT_EQ(d.shape_of(d.ok(b::binary(F::NumericFloat, K::Numeric_Add, a, c, d.fresh()))), (Shape{2, 3}));
}

// ArcTan2{lhs = y, rhs = x} is C's atan2(y, x) (torch.atan2(input, other)): the four quadrants,
// the axes, and the signed zeros: atan2(±0, −0) = ±π, atan2(±0, +0) = ±0, atan2(±0, x < 0) = ±π.
TEST(ReferenceBinaryTest, ArcTan2QuadrantsAxesAndSignedZeros) {
  Device d;
  const double pi = 3.141592653589793;
  const TensorIr y = d.f64({12}, dtypes::f64, {1, 1, -1, -1, 1, -1, 0.0, -0.0, 0.0, -0.0, 0.0, kNaN});
  const TensorIr x = d.f64({12}, dtypes::f64, {1, -1, -1, 1, 0.0, 0.0, -0.0, -0.0, 0.0, 0.0, -2, 1});
  const std::vector<double> r = d.f64_of(d.ok(b::binary(F::Float, K::Float_ArcTan2, y, x, d.fresh())));
  EXPECT_THAT(r, Near(std::vector<double>{pi / 4, 3 * pi / 4, -3 * pi / 4, -pi / 4, pi / 2, -pi / 2, pi, -pi, 0, -0.0,
                                          pi, kNaN},
                      1e-15));
  EXPECT_FALSE(std::signbit(r[8])) << "atan2(+0, +0) = +0";
  EXPECT_TRUE(std::signbit(r[9])) << "atan2(-0, +0) = -0";
  // Infinities: atan2(inf, inf) = π/4, atan2(1, -inf) = π, atan2(-1, inf) = -0.
  const TensorIr yi = d.f64({3}, dtypes::f64, {kInf, 1, -1});
  const TensorIr xi = d.f64({3}, dtypes::f64, {kInf, -kInf, kInf});
  const std::vector<double> ri = d.f64_of(d.ok(b::binary(F::Float, K::Float_ArcTan2, yi, xi, d.fresh())));
  EXPECT_THAT(ri, Near(std::vector<double>{pi / 4, pi, 0}, 1e-15));
  EXPECT_TRUE(std::signbit(ri[2]));
  // Broadcast [2, 1] against [1, 2], in bf16 (one rounding of the f64 result).
  const TensorIr by = d.f64({2, 1}, dtypes::bf16, {1, -1});
  const TensorIr bx = d.f64({1, 2}, dtypes::bf16, {1, -1});
  const TensorId bo = d.ok(b::binary(F::Float, K::Float_ArcTan2, by, bx, d.fresh()));
  EXPECT_EQ(d.shape_of(bo), (Shape{2, 2}));
  // bf16 has 8 significant bits: π/4 → 0.78515625, 3π/4 → 2.359375.
  EXPECT_EQ(d.f64_of(bo), (std::vector<double>{0.78515625, 2.359375, -0.78515625, -2.359375}));
}

// Hypot: √(a² + b²) without overflow in between; hypot(±inf, NaN) = +inf (C, PyTorch).
TEST(ReferenceBinaryTest, HypotAvoidsOverflowAndPrefersInfinity) {
  Device d;
  const TensorIr a = d.f64({6}, dtypes::f64, {3, -5, 1e200, kInf, kNaN, 0.0});
  const TensorIr c = d.f64({6}, dtypes::f64, {4, 12, 1e200, kNaN, -kInf, -0.0});
  EXPECT_THAT(d.f64_of(d.ok(b::binary(F::Float, K::Float_Hypot, a, c, d.fresh()))),
              Near(std::vector<double>{5, 13, 1.4142135623730951e200, kInf, kInf, 0}, 1e-15));
  // In f32, 3e30² would overflow a float computation; the f64 result rounds to f32(5e30).
  const TensorIr a32 = d.f64({1}, dtypes::f32, {3e30});
  const TensorIr c32 = d.f64({1}, dtypes::f32, {4e30});
  const double got = d.f64_of(d.ok(b::binary(F::Float, K::Float_Hypot, a32, c32, d.fresh())))[0];
  EXPECT_EQ(got, static_cast<double>(static_cast<float>(5e30)));
  // Operands of different dtypes are refused by the kernel as by the builder.
  Operation op = *b::binary(F::Float, K::Float_Hypot, a32, c32, d.fresh());
  op.tensors[1] = d.f64({1}, dtypes::f64, {4});
  EXPECT_FALSE(d.exec.execute(op, d.handles).ok());
}

// Cross (docs/spec/ir.md §6.3): a × b of the 3-vectors along dim, the other dims broadcast;
// torch.linalg.cross's component order (a1 b2 − a2 b1, a2 b0 − a0 b2, a0 b1 − a1 b0).
TEST(ReferenceBinaryTest, CrossOfThreeVectorsAlongADimBroadcasts) {
  Device d;
  const TensorIr a = d.f64({2, 3}, dtypes::f64, {1, 0, 0, 1, 2, 3});
  const TensorIr c = d.f64({2, 3}, dtypes::f64, {0, 1, 0, 4, 5, 6});
  // x × y = z; (1, 2, 3) × (4, 5, 6) = (12 − 15, 12 − 6, 5 − 8).
  EXPECT_EQ(d.f64_of(d.ok(b::cross(F::Float, K::Float_Cross, a, c, 1, d.fresh()))),
            (std::vector<double>{0, 0, 1, -3, 6, -3}));
  EXPECT_EQ(d.f64_of(d.ok(b::cross(F::Float, K::Float_Cross, c, a, 1, d.fresh()))),
            (std::vector<double>{0, 0, -1, 3, -6, 3}))
      << "anticommutative";
  // A [1, 3] rhs broadcast over the rows: x × z = −y, (1, 2, 3) × z = (2, −1, 0).
  const TensorIr z = d.f64({1, 3}, dtypes::f64, {0, 0, 1});
  const TensorId bz = d.ok(b::cross(F::Float, K::Float_Cross, a, z, 1, d.fresh()));
  EXPECT_EQ(d.shape_of(bz), (Shape{2, 3}));
  EXPECT_EQ(d.f64_of(bz), (std::vector<double>{0, -1, 0, 2, -1, 0}));
  // Along dim 0: the columns are the vectors, the same two products side by side.
  const TensorIr at = d.f64({3, 2}, dtypes::f32, {1, 1, 0, 2, 0, 3});
  const TensorIr ct = d.f64({3, 2}, dtypes::f32, {0, 4, 1, 5, 0, 6});
  EXPECT_EQ(d.f64_of(d.ok(b::cross(F::Float, K::Float_Cross, at, ct, 0, d.fresh()))),
            (std::vector<double>{0, -3, 0, 6, 1, -3}));
  // inf × 0 is NaN (IEEE, as torch); an empty batch gives an empty result.
  const TensorIr inf = d.f64({3}, dtypes::f64, {kInf, 0, 0});
  const TensorIr y = d.f64({3}, dtypes::f64, {0, 1, 0});
  EXPECT_THAT(d.f64_of(d.ok(b::cross(F::Float, K::Float_Cross, inf, y, 0, d.fresh()))),
              NanEq(std::vector<double>{0, kNaN, kInf}));
  const TensorIr none = d.f64({0, 3}, dtypes::f16, {});
  EXPECT_EQ(d.shape_of(d.ok(b::cross(F::Float, K::Float_Cross, none, none, 1, d.fresh()))), (Shape{0, 3}));
}

// Each component is computed in f64 and rounded once: (1 + 2⁻¹²)² − 1 = 2⁻¹¹ + 2⁻²⁴ is an f32,
// where f32 arithmetic would round the square to 1 + 2⁻¹¹ first.
TEST(ReferenceBinaryTest, CrossRoundsOnceAndRefusesBadOperands) {
  Device d;
  const double e = 1.0 + std::ldexp(1.0, -12);
  const TensorIr a = d.f64({3}, dtypes::f32, {0, e, 1});
  const TensorIr c = d.f64({3}, dtypes::f32, {0, 1, e});
  EXPECT_EQ(d.f64_of(d.ok(b::cross(F::Float, K::Float_Cross, a, c, 0, d.fresh()))),
            (std::vector<double>{std::ldexp(1.0, -11) + std::ldexp(1.0, -24), 0, 0}));
  auto cr = b::cross(F::Float, K::Float_Cross, a, c, 0, d.fresh());
  KILN_ASSERT_OK(cr);
  Operation bad = *cr;
  bad.attrs[0] = 1;  // out of range for rank 1
  Status st = d.exec.execute(bad, d.handles);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ErrorCode::OutOfBounds) << st.error().to_string();
  EXPECT_TRUE(d.handles.entry(bad.outputs()[0].id)->is_errored());
  // A hand-made rhs of size 1 along dim broadcasts to the output but is no 3-vector.
  bad = *b::cross(F::Float, K::Float_Cross, d.f64({2, 3}, dtypes::f32, {1, 2, 3, 4, 5, 6}),
                  d.f64({2, 3}, dtypes::f32, {1, 2, 3, 4, 5, 6}), 1, d.fresh());
  bad.tensors[1] = d.f64({2, 1}, dtypes::f32, {1, 2});
  st = d.exec.execute(bad, d.handles);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("dim 1 must have size 3 in both operands (f32[2,3] x f32[2,1])"), std::string::npos)
      << st.error().message;
  bad = *cr;
  bad.tensors[1] = d.f64({3}, dtypes::f64, {1, 2, 3});
  EXPECT_EQ(d.exec.execute(bad, d.handles).error().code, ErrorCode::DTypeMismatch);
  // Integer operands: the Float family does not apply.
  bad = *cr;
  bad.tensors[0] = d.i64({3}, dtypes::i32, {1, 2, 3});
  bad.tensors[1] = d.i64({3}, dtypes::i32, {4, 5, 6});
  bad.tensors[2].dtype = dtypes::i32;
  bad.dtype = dtypes::i32;
  EXPECT_EQ(d.exec.execute(bad, d.handles).error().code, ErrorCode::DTypeMismatch);
}

TEST(ReferenceBinaryTest, FloatDivisionAndRemainderFollowIeeeAndTheDivisorsSign) {
  Device d;
  const TensorIr a = d.f64({6}, dtypes::f64, {5, -5, 5, -5, 1, 0});
  const TensorIr c = d.f64({6}, dtypes::f64, {3, 3, -3, -3, 0, 0});
  EXPECT_THAT(d.f64_of(d.ok(b::binary(F::NumericFloat, K::Numeric_Div, a, c, d.fresh()))),
              NanEq(std::vector<double>{5.0 / 3, -5.0 / 3, -5.0 / 3, 5.0 / 3, kInf, kNaN}));
  EXPECT_THAT(d.f64_of(d.ok(b::binary(F::NumericFloat, K::Numeric_Rem, a, c, d.fresh()))),
              NanEq(std::vector<double>{2, 1, -1, -2, kNaN, kNaN}));
  // PyTorch's examples: remainder(-3..3, 2) and remainder(1..5, -1.5).
  const TensorIr x = d.f64({6}, dtypes::f32, {-3, -2, -1, 1, 2, 3});
  EXPECT_EQ(d.f64_of(d.ok(b::scalar(F::NumericFloat, K::Numeric_RemScalar, x, ScalarIr::Float(2), d.fresh()))),
            (std::vector<double>{1, 0, 1, 1, 0, 1}));
  const TensorIr y = d.f64({5}, dtypes::f32, {1, 2, 3, 4, 5});
  EXPECT_EQ(d.f64_of(d.ok(b::scalar(F::NumericFloat, K::Numeric_RemScalar, y, ScalarIr::Float(-1.5), d.fresh()))),
            (std::vector<double>{-0.5, -1, 0, -0.5, -1}));
}

TEST(ReferenceBinaryTest, IntegerDivisionTruncatesAndRemainderIsFloored) {
  Device d;
  const TensorIr a = d.i64({4}, dtypes::i32, {7, -7, 7, -7});
  const TensorIr c = d.i64({4}, dtypes::i32, {2, 2, -2, -2});
  EXPECT_EQ(d.i64_of(d.ok(b::binary(F::NumericInt, K::Numeric_Div, a, c, d.fresh()))),
            (std::vector<std::int64_t>{3, -3, -3, 3}));
  EXPECT_EQ(d.i64_of(d.ok(b::binary(F::NumericInt, K::Numeric_Rem, a, c, d.fresh()))),
            (std::vector<std::int64_t>{1, 1, -1, -1}));
  // The most negative value divided by -1 wraps; its remainder is 0.
  const TensorIr m = d.i64({1}, dtypes::i64, {std::numeric_limits<std::int64_t>::min()});
  EXPECT_EQ(d.i64_of(d.ok(b::scalar(F::NumericInt, K::Numeric_DivScalar, m, ScalarIr::Int(-1), d.fresh()))),
            (std::vector<std::int64_t>{std::numeric_limits<std::int64_t>::min()}));
  EXPECT_EQ(d.i64_of(d.ok(b::scalar(F::NumericInt, K::Numeric_RemScalar, m, ScalarIr::Int(-1), d.fresh()))),
            (std::vector<std::int64_t>{0}));
  const TensorIr m8 = d.i64({1}, dtypes::i8, {-128});
  EXPECT_EQ(d.i64_of(d.ok(b::scalar(F::NumericInt, K::Numeric_DivScalar, m8, ScalarIr::Int(-1), d.fresh()))),
            (std::vector<std::int64_t>{-128}));
  const TensorIr u = d.u64({2}, dtypes::u32, {7, 4000000000});
  EXPECT_EQ(d.u64_of(d.ok(b::scalar(F::NumericInt, K::Numeric_DivScalar, u, ScalarIr::Int(2), d.fresh()))),
            (std::vector<std::uint64_t>{3, 2000000000}));
  EXPECT_EQ(d.u64_of(d.ok(b::scalar(F::NumericInt, K::Numeric_RemScalar, u, ScalarIr::Int(3), d.fresh()))),
            (std::vector<std::uint64_t>{1, 1}));
}

TEST(ReferenceBinaryTest, IntegerDivisionByZeroIsAnErrorThatClaimsTheOutput) {
  Device d;
  const TensorIr a = d.i64({2}, dtypes::i32, {1, 2}, TensorStatus::ReadWrite);
  const TensorIr c = d.i64({2}, dtypes::i32, {1, 0});
  auto op = b::binary(F::NumericInt, K::Numeric_Div, a, c, d.fresh());
  Status st = d.run(op);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ErrorCode::Execution);
  EXPECT_NE(st.error().message.find("division by zero"), std::string::npos);
  const TensorId out = op->outputs()[0].id;
  ASSERT_NE(d.handles.entry(out), nullptr);
  EXPECT_TRUE(d.handles.entry(out)->is_errored());
  EXPECT_FALSE(d.handles.has_handle(a.id));  // ReadWrite input released as if consumed
  EXPECT_TRUE(d.handles.has_handle(c.id));
  const TensorIr u = d.u64({1}, dtypes::u8, {9});
  EXPECT_FALSE(d.run(b::scalar(F::NumericInt, K::Numeric_RemScalar, u, ScalarIr::UInt(0), d.fresh())).ok());
}

TEST(ReferenceBinaryTest, IntegerArithmeticWrapsToTheWidth) {
  Device d;
  const TensorIr a = d.i64({3}, dtypes::i8, {100, -100, 127});
  const TensorIr c = d.i64({3}, dtypes::i8, {100, -100, 2});
  EXPECT_EQ(d.i64_of(d.ok(b::binary(F::NumericInt, K::Numeric_Add, a, c, d.fresh()))),
            (std::vector<std::int64_t>{-56, 56, -127}));
  EXPECT_EQ(d.i64_of(d.ok(b::binary(F::NumericInt, K::Numeric_Mul, a, c, d.fresh()))),
            (std::vector<std::int64_t>{16, 16, -2}));
  const TensorIr big = d.i64({1}, dtypes::i64, {std::numeric_limits<std::int64_t>::max()});
  EXPECT_EQ(d.i64_of(d.ok(b::scalar(F::NumericInt, K::Numeric_AddScalar, big, ScalarIr::Int(1), d.fresh()))),
            (std::vector<std::int64_t>{std::numeric_limits<std::int64_t>::min()}));
  EXPECT_EQ(d.i64_of(d.ok(b::scalar(F::NumericInt, K::Numeric_MulScalar, big, ScalarIr::Int(2), d.fresh()))),
            (std::vector<std::int64_t>{-2}));
  const TensorIr u = d.u64({2}, dtypes::u64, {0, ~std::uint64_t{0}});
  EXPECT_EQ(d.u64_of(d.ok(b::scalar(F::NumericInt, K::Numeric_SubScalar, u, ScalarIr::UInt(1), d.fresh()))),
            (std::vector<std::uint64_t>{~std::uint64_t{0}, ~std::uint64_t{0} - 1}));
}

TEST(ReferenceBinaryTest, PowersOfFloatsAndIntegers) {
  Device d;
  const TensorIr x = d.f64({4}, dtypes::f32, {2, -8, 0, 4});
  const TensorIr e = d.f64({4}, dtypes::f32, {10, 1.0 / 3, -1, 0.5});
  EXPECT_THAT(d.f64_of(d.ok(b::binary(F::Float, K::Float_Powf, x, e, d.fresh()))),
              NanEq(std::vector<double>{1024, kNaN, kInf, 2}));
  EXPECT_EQ(d.f64_of(d.ok(b::scalar(F::Float, K::Float_PowfScalar, x, ScalarIr::Float(2), d.fresh()))),
            (std::vector<double>{4, 64, 0, 16}));
  EXPECT_EQ(d.f64_of(d.ok(b::scalar(F::NumericFloat, K::Numeric_PowiScalar, x, ScalarIr::Int(3), d.fresh()))),
            (std::vector<double>{8, -512, 0, 64}));
  EXPECT_THAT(d.f64_of(d.ok(b::binary(F::NumericFloat, K::Numeric_Powi, x, e, d.fresh()))),
              NanEq(std::vector<double>{1024, kNaN, kInf, 2}));
  // Integers: by squaring, wrapping; negative exponents truncate toward zero.
  const TensorIr xi = d.i64({5}, dtypes::i32, {2, -3, 1, -1, 5});
  const TensorIr ei = d.i64({5}, dtypes::i32, {31, 3, -5, -3, -1});
  EXPECT_EQ(d.i64_of(d.ok(b::binary(F::NumericInt, K::Numeric_Powi, xi, ei, d.fresh()))),
            (std::vector<std::int64_t>{std::numeric_limits<std::int32_t>::min(), -27, 1, -1, 0}));
  EXPECT_EQ(d.i64_of(d.ok(b::scalar(F::NumericInt, K::Numeric_PowiScalar, xi, ScalarIr::Int(2), d.fresh()))),
            (std::vector<std::int64_t>{4, 9, 1, 1, 25}));
  const TensorIr zero = d.i64({1}, dtypes::i32, {0});
  EXPECT_FALSE(d.run(b::scalar(F::NumericInt, K::Numeric_PowiScalar, zero, ScalarIr::Int(-1), d.fresh())).ok());
}

TEST(ReferenceBinaryTest, BitwiseOpsAndShifts) {
  Device d;
  const TensorIr a = d.i64({4}, dtypes::i16, {0x0F0F, -1, 6, -16});
  const TensorIr c = d.i64({4}, dtypes::i16, {0x00FF, 0x1234, 3, 2});
  EXPECT_EQ(d.i64_of(d.ok(b::binary(F::Int, K::Int_BitwiseAnd, a, c, d.fresh()))),
            (std::vector<std::int64_t>{0x000F, 0x1234, 2, 0}));
  EXPECT_EQ(d.i64_of(d.ok(b::binary(F::Int, K::Int_BitwiseOr, a, c, d.fresh()))),
            (std::vector<std::int64_t>{0x0FFF, -1, 7, -14}));
  EXPECT_EQ(d.i64_of(d.ok(b::binary(F::Int, K::Int_BitwiseXor, a, c, d.fresh()))),
            (std::vector<std::int64_t>{0x0FF0, ~0x1234, 5, -14}));
  EXPECT_EQ(d.i64_of(d.ok(b::scalar(F::Int, K::Int_BitwiseAndScalar, a, ScalarIr::Int(0xFF), d.fresh()))),
            (std::vector<std::int64_t>{0x0F, 0xFF, 6, 0xF0}));
  EXPECT_EQ(d.i64_of(d.ok(b::scalar(F::Int, K::Int_BitwiseOrScalar, a, ScalarIr::Int(1), d.fresh()))),
            (std::vector<std::int64_t>{0x0F0F, -1, 7, -15}));
  EXPECT_EQ(d.i64_of(d.ok(b::scalar(F::Int, K::Int_BitwiseXorScalar, a, ScalarIr::Int(-1), d.fresh()))),
            (std::vector<std::int64_t>{~0x0F0F, 0, -7, 15}));
  // Shifts: amounts are taken modulo nothing; out-of-range amounts give 0 (left) or the sign fill
  // (right), and the result wraps to 16 bits.
  const TensorIr s = d.i64({4}, dtypes::i16, {1, 15, 16, -1});
  const TensorIr v = d.i64({4}, dtypes::i16, {-3, 1, 5, -5});
  EXPECT_EQ(d.i64_of(d.ok(b::binary(F::Int, K::Int_BitwiseLeftShift, v, s, d.fresh()))),
            (std::vector<std::int64_t>{-6, -32768, 0, 0}));
  EXPECT_EQ(d.i64_of(d.ok(b::binary(F::Int, K::Int_BitwiseRightShift, v, s, d.fresh()))),
            (std::vector<std::int64_t>{-2, 0, 0, -1}));
  EXPECT_EQ(d.i64_of(d.ok(b::scalar(F::Int, K::Int_BitwiseLeftShiftScalar, v, ScalarIr::Int(2), d.fresh()))),
            (std::vector<std::int64_t>{-12, 4, 20, -20}));
  EXPECT_EQ(d.i64_of(d.ok(b::scalar(F::Int, K::Int_BitwiseRightShiftScalar, v, ScalarIr::Int(1), d.fresh()))),
            (std::vector<std::int64_t>{-2, 0, 2, -3}));
  const TensorIr u = d.u64({3}, dtypes::u8, {0x81, 0x81, 0x81});
  const TensorIr us = d.u64({3}, dtypes::u8, {1, 7, 8});
  EXPECT_EQ(d.u64_of(d.ok(b::binary(F::Int, K::Int_BitwiseLeftShift, u, us, d.fresh()))),
            (std::vector<std::uint64_t>{0x02, 0x80, 0}));
  EXPECT_EQ(d.u64_of(d.ok(b::binary(F::Int, K::Int_BitwiseRightShift, u, us, d.fresh()))),
            (std::vector<std::uint64_t>{0x40, 0x01, 0}));
}

TEST(ReferenceBinaryTest, BoolLogic) {
  Device d;
  const TensorIr a = d.boolean({4}, {false, false, true, true});
  const TensorIr c = d.boolean({4}, {false, true, false, true});
  EXPECT_EQ(d.bool_of(d.ok(b::binary(F::Bool, K::Bool_And, a, c, d.fresh()))), (std::vector<bool>{0, 0, 0, 1}));
  EXPECT_EQ(d.bool_of(d.ok(b::binary(F::Bool, K::Bool_Or, a, c, d.fresh()))), (std::vector<bool>{0, 1, 1, 1}));
  EXPECT_EQ(d.bool_of(d.ok(b::binary(F::Bool, K::Bool_Xor, a, c, d.fresh()))), (std::vector<bool>{0, 1, 1, 0}));
  EXPECT_EQ(d.bool_of(d.ok(b::binary_comparison(F::BaseBool, K::Base_Equal, a, c, dtypes::boolean, d.fresh()))),
            (std::vector<bool>{1, 0, 0, 1}));
  EXPECT_EQ(d.bool_of(d.ok(b::binary_comparison(F::BaseBool, K::Base_NotEqual, a, c, dtypes::boolean, d.fresh()))),
            (std::vector<bool>{0, 1, 1, 0}));
  EXPECT_EQ(d.bool_of(d.ok(b::scalar_comparison(F::BaseBool, K::Base_EqualElem, a, ScalarIr::Bool(true),
                                                dtypes::boolean, d.fresh()))),
            (std::vector<bool>{0, 0, 1, 1}));
}

TEST(ReferenceBinaryTest, ComparisonsWithNanAndBroadcasting) {
  Device d;
  const TensorIr a = d.f64({3, 1}, dtypes::f32, {1, kNaN, 3});
  const TensorIr c = d.f64({1, 2}, dtypes::f32, {1, kNaN});
  auto cmp = [&](F f, K k) { return d.bool_of(d.ok(b::binary_comparison(f, k, a, c, dtypes::boolean, d.fresh()))); };
  // Output order: (a0,c0) (a0,c1) (a1,c0) (a1,c1) (a2,c0) (a2,c1).
  EXPECT_EQ(cmp(F::BaseFloat, K::Base_Equal), (std::vector<bool>{1, 0, 0, 0, 0, 0}));
  EXPECT_EQ(cmp(F::BaseFloat, K::Base_NotEqual), (std::vector<bool>{0, 1, 1, 1, 1, 1}));
  EXPECT_EQ(cmp(F::NumericFloat, K::Numeric_Greater), (std::vector<bool>{0, 0, 0, 0, 1, 0}));
  EXPECT_EQ(cmp(F::NumericFloat, K::Numeric_GreaterEqual), (std::vector<bool>{1, 0, 0, 0, 1, 0}));
  EXPECT_EQ(cmp(F::NumericFloat, K::Numeric_Lower), (std::vector<bool>{0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(cmp(F::NumericFloat, K::Numeric_LowerEqual), (std::vector<bool>{1, 0, 0, 0, 0, 0}));
}

TEST(ReferenceBinaryTest, IntegerComparisonsAndElemForms) {
  Device d;
  const TensorIr a = d.u64({3}, dtypes::u64, {0, 5, ~std::uint64_t{0}});
  auto elem = [&](F f, K k, ScalarIr s) {
    return d.bool_of(d.ok(b::scalar_comparison(f, k, a, s, dtypes::boolean, d.fresh())));
  };
  EXPECT_EQ(elem(F::NumericInt, K::Numeric_GreaterElem, ScalarIr::UInt(4)), (std::vector<bool>{0, 1, 1}));
  EXPECT_EQ(elem(F::NumericInt, K::Numeric_GreaterEqualElem, ScalarIr::UInt(5)), (std::vector<bool>{0, 1, 1}));
  EXPECT_EQ(elem(F::NumericInt, K::Numeric_LowerElem, ScalarIr::UInt(5)), (std::vector<bool>{1, 0, 0}));
  EXPECT_EQ(elem(F::NumericInt, K::Numeric_LowerEqualElem, ScalarIr::UInt(5)), (std::vector<bool>{1, 1, 0}));
  EXPECT_EQ(elem(F::BaseInt, K::Base_EqualElem, ScalarIr::UInt(~std::uint64_t{0})), (std::vector<bool>{0, 0, 1}));
  EXPECT_EQ(elem(F::BaseInt, K::Base_NotEqualElem, ScalarIr::Int(0)), (std::vector<bool>{0, 1, 1}));
  const TensorIr s = d.i64({3}, dtypes::i8, {-1, 0, 1});
  const TensorIr t = d.i64({3}, dtypes::i8, {0, 0, 0});
  EXPECT_EQ(d.bool_of(d.ok(b::binary_comparison(F::NumericInt, K::Numeric_Lower, s, t, dtypes::boolean, d.fresh()))),
            (std::vector<bool>{1, 0, 0}));
}

TEST(ReferenceScalarTest, ScalarsAreConvertedToTheElementTypeFirst) {
  Device d;
  // An f16 tensor compared with 0.1: the scalar is f16's 0.1 (0.0999755859375), so equal.
  const TensorIr h = d.f64({1}, dtypes::f16, {0.1});
  EXPECT_EQ(d.bool_of(d.ok(b::scalar_comparison(F::BaseFloat, K::Base_EqualElem, h, ScalarIr::Float(0.1),
                                                dtypes::boolean, d.fresh()))),
            (std::vector<bool>{true}));
  // A float scalar on an int tensor truncates: 7 + 2.9 = 9, 7 > 6.5 compares against 6.
  const TensorIr i = d.i64({1}, dtypes::i32, {7});
  EXPECT_EQ(d.i64_of(d.ok(b::scalar(F::NumericInt, K::Numeric_AddScalar, i, ScalarIr::Float(2.9), d.fresh()))),
            (std::vector<std::int64_t>{9}));
  const TensorIr six = d.i64({1}, dtypes::i32, {6});
  EXPECT_EQ(d.bool_of(d.ok(b::scalar_comparison(F::NumericInt, K::Numeric_GreaterElem, six, ScalarIr::Float(6.5),
                                                dtypes::boolean, d.fresh()))),
            (std::vector<bool>{false}));
  // f32 arithmetic rounds once from f64: 1 + 1e-8 stays 1.
  const TensorIr one = d.f64({1}, dtypes::f32, {1});
  EXPECT_EQ(d.f64_of(d.ok(b::scalar(F::NumericFloat, K::Numeric_AddScalar, one, ScalarIr::Float(1e-8), d.fresh()))),
            (std::vector<double>{1}));
  // bf16: 1 + 1/256 is a tie, rounds to even (1); 1 + 3/256 rounds to 1 + 4/256.
  const TensorIr bf = d.f64({2}, dtypes::bf16, {1, 1});
  const TensorIr inc = d.f64({2}, dtypes::bf16, {1.0 / 256, 3.0 / 256});
  EXPECT_EQ(d.f64_of(d.ok(b::binary(F::NumericFloat, K::Numeric_Add, bf, inc, d.fresh()))),
            (std::vector<double>{1, 1 + 4.0 / 256}));
  // f16 overflow to infinity, f16 underflow to a subnormal.
  const TensorIr hf = d.f64({2}, dtypes::f16, {60000, std::ldexp(1.0, -14)});
  EXPECT_EQ(d.f64_of(d.ok(b::scalar(F::NumericFloat, K::Numeric_MulScalar, hf, ScalarIr::Float(2), d.fresh()))),
            (std::vector<double>{kInf, std::ldexp(1.0, -13)}));
  EXPECT_EQ(d.f64_of(d.ok(b::scalar(F::NumericFloat, K::Numeric_DivScalar, hf, ScalarIr::Float(1024), d.fresh()))),
            (std::vector<double>{58.59375, std::ldexp(1.0, -24)}));
}

TEST(ReferenceScalarTest, ClampMinMaxAndClamp) {
  Device d;
  const TensorIr x = d.f64({5}, dtypes::f64, {-5, 0, 5, kNaN, kInf});
  EXPECT_THAT(d.f64_of(d.ok(b::scalar(F::NumericFloat, K::Numeric_ClampMin, x, ScalarIr::Float(-1), d.fresh()))),
              NanEq(std::vector<double>{-1, 0, 5, kNaN, kInf}));
  EXPECT_THAT(d.f64_of(d.ok(b::scalar(F::NumericFloat, K::Numeric_ClampMax, x, ScalarIr::Float(1), d.fresh()))),
              NanEq(std::vector<double>{-5, 0, 1, kNaN, 1}));
  EXPECT_THAT(d.f64_of(d.ok(
                  b::clamp(F::NumericFloat, K::Numeric_Clamp, x, ScalarIr::Float(-1), ScalarIr::Float(2), d.fresh()))),
              NanEq(std::vector<double>{-1, 0, 2, kNaN, 2}));
  // min > max: everything becomes max (Burn's two mask_fills, PyTorch's clamp).
  EXPECT_THAT(
      d.f64_of(d.ok(b::clamp(F::NumericFloat, K::Numeric_Clamp, x, ScalarIr::Float(3), ScalarIr::Float(1), d.fresh()))),
      NanEq(std::vector<double>{1, 1, 1, kNaN, 1}));
  const TensorIr xi = d.i64({4}, dtypes::u8, {0, 10, 200, 255});
  EXPECT_EQ(
      d.u64_of(d.ok(b::clamp(F::NumericInt, K::Numeric_Clamp, xi, ScalarIr::Int(5), ScalarIr::Int(200), d.fresh()))),
      (std::vector<std::uint64_t>{5, 10, 200, 200}));
}

// ---- Casts

TEST(ReferenceCastTest, FloatToFloatRoundsOnce) {
  Device d;
  const TensorIr x = d.f64({4}, dtypes::f64, {0.1, 65520, 1e-8, kNaN});
  EXPECT_THAT(d.f64_of(d.ok(b::cast(F::BaseFloat, K::Base_Cast, x, dtypes::f16, d.fresh()))),
              NanEq(std::vector<double>{0.0999755859375, kInf, 0, kNaN}));
  EXPECT_THAT(d.f64_of(d.ok(b::cast(F::BaseFloat, K::Base_Cast, x, dtypes::f32, d.fresh()))),
              NanEq(std::vector<double>{static_cast<double>(0.1f), 65520, static_cast<double>(1e-8f), kNaN}));
  EXPECT_THAT(d.f64_of(d.ok(b::cast(F::BaseFloat, K::Base_Cast, x, dtypes::flex32, d.fresh()))),
              NanEq(std::vector<double>{static_cast<double>(0.1f), 65520, static_cast<double>(1e-8f), kNaN}));
  const TensorIr h = d.f64({1}, dtypes::bf16, {3.0});
  EXPECT_EQ(d.f64_of(d.ok(b::cast(F::BaseFloat, K::Base_Cast, h, dtypes::f64, d.fresh()))), (std::vector<double>{3}));
}

TEST(ReferenceCastTest, IntoIntSaturatesIntoFloatRounds) {
  Device d;
  const TensorIr x = d.f64({5}, dtypes::f32, {2.7, -2.7, 1e10, kNaN, -kInf});
  EXPECT_EQ(d.i64_of(d.ok(b::cast(F::Float, K::Float_IntoInt, x, dtypes::i16, d.fresh()))),
            (std::vector<std::int64_t>{2, -2, 32767, 0, -32768}));
  EXPECT_EQ(d.u64_of(d.ok(b::cast(F::Float, K::Float_IntoInt, x, dtypes::u8, d.fresh()))),
            (std::vector<std::uint64_t>{2, 0, 255, 0, 0}));
  const TensorIr i = d.i64({3}, dtypes::i64, {16777217, -3, 1 << 20});
  EXPECT_EQ(d.f64_of(d.ok(b::cast(F::Int, K::Int_IntoFloat, i, dtypes::f32, d.fresh()))),
            (std::vector<double>{16777216, -3, 1 << 20}));
  EXPECT_EQ(d.f64_of(d.ok(b::cast(F::Int, K::Int_IntoFloat, i, dtypes::f16, d.fresh()))),
            (std::vector<double>{kInf, -3, kInf}));
  const TensorIr w = d.i64({2}, dtypes::i32, {300, -1});
  EXPECT_EQ(d.i64_of(d.ok(b::cast(F::BaseInt, K::Base_Cast, w, dtypes::i8, d.fresh()))),
            (std::vector<std::int64_t>{44, -1}));
  EXPECT_EQ(d.u64_of(d.ok(b::cast(F::BaseInt, K::Base_Cast, w, dtypes::u16, d.fresh()))),
            (std::vector<std::uint64_t>{300, 65535}));
  const TensorIr bl = d.boolean({2}, {true, false});
  EXPECT_EQ(d.f64_of(d.ok(b::cast(F::Bool, K::Bool_IntoFloat, bl, dtypes::bf16, d.fresh()))),
            (std::vector<double>{1, 0}));
  EXPECT_EQ(d.i64_of(d.ok(b::cast(F::Bool, K::Bool_IntoInt, bl, dtypes::i64, d.fresh()))),
            (std::vector<std::int64_t>{1, 0}));
  const TensorId u32 = d.ok(b::cast(F::BaseBool, K::Base_Cast, bl, DType::boolean(BoolStore::U32), d.fresh()));
  EXPECT_EQ(d.tensor(u32).to_values<std::uint32_t>(), (std::vector<std::uint32_t>{1, 0}));
}

// ---- MaskWhere / MaskFill

TEST(ReferenceMaskTest, MaskWhereBroadcastsAllThreeAndCopiesBits) {
  Device d;
  const TensorIr t = d.f64({2, 2}, dtypes::f32, {1, 2, 3, 4});
  const TensorIr m = d.boolean({1, 2}, {true, false});
  const TensorIr v = d.f64({2, 1}, dtypes::f32, {-kNaN, 20});
  const TensorId out = d.ok(b::mask_where(F::BaseFloat, K::Base_MaskWhere, t, m, v, d.fresh()));
  const std::vector<double> r = d.f64_of(out);
  EXPECT_TRUE(std::isnan(r[0]) && std::signbit(r[0]));  // the NaN's sign bit survives
  EXPECT_EQ((std::vector<double>{r[1], r[2], r[3]}), (std::vector<double>{2, 20, 4}));
  const TensorIr ti = d.i64({3}, dtypes::i64, {1, 2, 3});
  const TensorIr mi = d.boolean({3}, {false, true, true}, DType::boolean(BoolStore::U32));
  const TensorIr vi = d.i64({3}, dtypes::i64, {-1, -2, -3});
  EXPECT_EQ(d.i64_of(d.ok(b::mask_where(F::BaseInt, K::Base_MaskWhere, ti, mi, vi, d.fresh()))),
            (std::vector<std::int64_t>{1, -2, -3}));
}

TEST(ReferenceMaskTest, MaskFillConvertsTheValue) {
  Device d;
  const TensorIr t = d.i64({2, 2}, dtypes::u8, {1, 2, 3, 4});
  const TensorIr m = d.boolean({2, 1}, {false, true});
  EXPECT_EQ(d.u64_of(d.ok(b::mask_fill(F::BaseInt, K::Base_MaskFill, t, m, ScalarIr::Float(300.5), d.fresh()))),
            (std::vector<std::uint64_t>{1, 2, 255, 255}));  // 300.5 saturates to u8
  const TensorIr f = d.f64({2}, dtypes::bf16, {1, 2});
  const TensorIr fm = d.boolean({2}, {true, false});
  EXPECT_EQ(d.f64_of(d.ok(b::mask_fill(F::BaseFloat, K::Base_MaskFill, f, fm, ScalarIr::Float(0.1), d.fresh()))),
            (std::vector<double>{0.10009765625, 2}));
  const TensorIr bl = d.boolean({2}, {true, false});
  EXPECT_EQ(d.bool_of(d.ok(b::mask_fill(F::BaseBool, K::Base_MaskFill, bl, fm, ScalarIr::Bool(false), d.fresh()))),
            (std::vector<bool>{false, false}));
}

TEST(ReferenceMaskTest, MaskMustBeBool) {
  Device d;
  const TensorIr t = d.f64({2}, dtypes::f32, {1, 2});
  const TensorIr m = d.i64({2}, dtypes::u8, {1, 0});
  auto op =
      b::mask_fill(F::BaseFloat, K::Base_MaskFill, t, d.boolean({2}, {true, false}), ScalarIr::Float(0), d.fresh());
  KILN_ASSERT_OK(op);
  Operation bad = *op;
  bad.tensors[1] = m;  // passes validate(): the executor must check
  Status st = d.exec.execute(bad, d.handles);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ErrorCode::DTypeMismatch);
  EXPECT_TRUE(d.handles.entry(bad.outputs()[0].id)->is_errored());
}

}  // namespace
}  // namespace kiln::reference::testing
