// The client API's (session.h) operations beyond the core suite (api_test.cc): elementwise
// max / min, logic and bitwise ops, rounding, sign, creation, the remaining reductions and scans,
// layout and indexing writes, pad, the module ops, embedding and the collectives. Each against
// values computed here (by hand or in double), each checked for the exact IR kinds it emits where
// docs/spec/ir.md §5.11 prescribes a decomposition, and for the error value of a bad shape or dtype.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "api_fixture.h"
#include "kiln/runtime/session.h"
#include "kiln/runtime/session_conv_calls.h"
#include "kiln/testing/quant.h"
#include "kiln/testing/status.h"

namespace kiln::runtime {
namespace {

using ir::Shape;
using ::kiln::testing::ok;
using Kinds = std::vector<std::string>;

using api_testing::expect_near;

class ApiOps : public api_testing::RecordingSessionFixture {
 protected:
  // The error message of a call that must fail.
  static std::string error_of(Result<Tensor> r) {
    EXPECT_FALSE(r.ok()) << "the call succeeded";
    return r.ok() ? std::string("ok") : r.error().to_string();
  }
};

// The message names `what` (an op kind or a call).
#define EXPECT_NAMES(message, what) EXPECT_NE((message).find(what), std::string::npos) << (message)

// ---- Elementwise max / min

TEST_F(ApiOps, MaximumAndMinimumTensorAndScalar) {
  const std::vector<float> av{1, 5, -2, 4}, bv{3, 2};  // a [2, 2], b [1, 2] (broadcast over rows)
  Tensor a = f32(av, {2, 2}), b = f32(bv, {1, 2});
  std::vector<double> mx, mn, mxs, mns;
  for (int i = 0; i < 4; ++i) {
    const double x = av[i], y = bv[i % 2];
    mx.push_back(std::max(x, y)), mn.push_back(std::min(x, y));
    mxs.push_back(std::max(x, 2.5)), mns.push_back(std::min(x, 2.5));
  }
  expect_near(get(s->maximum(a, b), {2, 2}), mx);
  expect_near(get(s->minimum(a, b), {2, 2}), mn);
  expect_near(get(s->maximum(a, 2.5), {2, 2}), mxs);
  expect_near(get(s->minimum(a, 2.5), {2, 2}), mns);
  EXPECT_EQ(get_i64(s->maximum(i64({-3, 7}, {2}), i64({0, 9}, {2})), {2}), (std::vector<std::int64_t>{0, 9}));
  EXPECT_EQ(get_i64(s->minimum(i64({-3, 7}, {2}), 0.0), {2}), (std::vector<std::int64_t>{-3, 0}));
  // docs/spec/ir.md §5.11: one comparison, then a select.
  EXPECT_EQ(kinds_of([&] { ok(s->maximum(a, b)); }), (Kinds{"NumericFloat::Lower", "BaseFloat::MaskWhere"}));
  EXPECT_EQ(kinds_of([&] { ok(s->minimum(a, b)); }), (Kinds{"NumericFloat::Lower", "BaseFloat::MaskWhere"}));
  EXPECT_EQ(kinds_of([&] { ok(s->maximum(a, 1.0)); }), (Kinds{"NumericFloat::LowerElem", "BaseFloat::MaskFill"}));
  EXPECT_EQ(kinds_of([&] { ok(s->minimum(a, 1.0)); }), (Kinds{"NumericFloat::GreaterElem", "BaseFloat::MaskFill"}));
  Tensor n = i64({1, 2}, {2});
  EXPECT_EQ(kinds_of([&] { ok(s->maximum(n, n)); }), (Kinds{"NumericInt::Lower", "BaseInt::MaskWhere"}));
  // Errors: mixed dtypes, shapes that do not broadcast, bool operands.
  EXPECT_NAMES(error_of(s->maximum(a, i64({1, 2}, {1, 2}))), "Lower");
  EXPECT_NAMES(error_of(s->minimum(a, f32({1, 2, 3}, {1, 3}))), "Lower");
  EXPECT_NAMES(error_of(s->maximum(bools({true}, {1}), 0.0)), "LowerElem");
}

// ---- Logic and bitwise

TEST_F(ApiOps, LogicOnBoolTensors) {
  const std::vector<bool> pv{true, true, false, false}, qv{true, false, true, false};
  Tensor p = bools(pv, {4}), q = bools(qv, {4});
  std::vector<bool> and_v, or_v, xor_v, not_v;
  for (int i = 0; i < 4; ++i)
    and_v.push_back(pv[i] && qv[i]), or_v.push_back(pv[i] || qv[i]), xor_v.push_back(pv[i] != qv[i]),
        not_v.push_back(!pv[i]);
  EXPECT_EQ(get_bool(s->and_(p, q), {4}), and_v);
  EXPECT_EQ(get_bool(s->or_(p, q), {4}), or_v);
  EXPECT_EQ(get_bool(s->xor_(p, q), {4}), xor_v);
  EXPECT_EQ(get_bool(s->not_(p), {4}), not_v);
  // Broadcast: [4] with [1].
  EXPECT_EQ(get_bool(s->and_(p, bools({true}, {1})), {4}), pv);
  // The bool-scalar rule: true / false as a tensor of S(p), then the tensor form.
  EXPECT_EQ(get_bool(s->and_(p, true), {4}), pv);
  EXPECT_EQ(get_bool(s->and_(p, false), {4}), (std::vector<bool>(4, false)));
  EXPECT_EQ(get_bool(s->or_(p, false), {4}), pv);
  EXPECT_EQ(get_bool(s->or_(p, true), {4}), (std::vector<bool>(4, true)));
  EXPECT_EQ(get_bool(s->xor_(p, true), {4}), not_v);
  EXPECT_EQ(get_bool(s->xor_(p, false), {4}), pv);
  // docs/spec/ir.md §5.11 and §5.3: Bool And / Or; xor as Equal + Not, never Bool Xor.
  EXPECT_EQ(kinds_of([&] { ok(s->and_(p, q)); }), (Kinds{"Bool::And"}));
  EXPECT_EQ(kinds_of([&] { ok(s->or_(p, q)); }), (Kinds{"Bool::Or"}));
  EXPECT_EQ(kinds_of([&] { ok(s->xor_(p, q)); }), (Kinds{"BaseBool::Equal", "Bool::Not"}));
  EXPECT_EQ(kinds_of([&] { ok(s->not_(p)); }), (Kinds{"Bool::Not"}));
  EXPECT_EQ(kinds_of([&] { ok(s->and_(p, true)); }), (Kinds{"BaseBool::Ones", "Bool::And"}));
  EXPECT_EQ(kinds_of([&] { ok(s->or_(p, false)); }), (Kinds{"BaseBool::Zeros", "Bool::Or"}));
  EXPECT_EQ(kinds_of([&] { ok(s->xor_(p, true)); }), (Kinds{"BaseBool::Ones", "BaseBool::Equal", "Bool::Not"}));
  // Errors: a bool with an int tensor, shapes that do not broadcast, a float operand.
  EXPECT_NAMES(error_of(s->and_(p, i64({1, 0, 1, 0}, {4}))), "Bool::And");
  EXPECT_NAMES(error_of(s->or_(p, bools({true, false}, {2}))), "Bool::Or");
  EXPECT_NAMES(error_of(s->not_(f32({1}, {1}))), "BitwiseNot");
}

TEST_F(ApiOps, BitwiseOnIntegerTensors) {
  const std::vector<std::int64_t> xv{12, 10, -8}, yv{10, 6, 3}, sh{1, 2, 0};
  Tensor x = i64(xv, {3}), y = i64(yv, {3});
  std::vector<std::int64_t> and_v, or_v, xor_v, not_v, ands, ors, xors, shl, shr;
  for (int i = 0; i < 3; ++i) {
    and_v.push_back(xv[i] & yv[i]), or_v.push_back(xv[i] | yv[i]), xor_v.push_back(xv[i] ^ yv[i]);
    not_v.push_back(~xv[i]), ands.push_back(xv[i] & 6), ors.push_back(xv[i] | 1), xors.push_back(xv[i] ^ 5);
    shl.push_back(static_cast<std::int64_t>(static_cast<std::uint64_t>(xv[i]) << sh[i]));
    shr.push_back(xv[i] >> 2);  // arithmetic (C++20)
  }
  EXPECT_EQ(get_i64(s->and_(x, y), {3}), and_v);
  EXPECT_EQ(get_i64(s->or_(x, y), {3}), or_v);
  EXPECT_EQ(get_i64(s->xor_(x, y), {3}), xor_v);
  EXPECT_EQ(get_i64(s->not_(x), {3}), not_v);
  EXPECT_EQ(get_i64(s->and_(x, 6.0), {3}), ands);
  EXPECT_EQ(get_i64(s->or_(x, 1.0), {3}), ors);
  EXPECT_EQ(get_i64(s->xor_(x, 5.0), {3}), xors);
  EXPECT_EQ(get_i64(s->bitwise_left_shift(x, i64(sh, {3})), {3}), shl);
  EXPECT_EQ(get_i64(s->bitwise_right_shift(x, 2.0), {3}), shr);
  EXPECT_EQ(get_i64(s->bitwise_left_shift(x, 3.0), {3}), (std::vector<std::int64_t>{96, 80, -64}));
  EXPECT_EQ(get_i64(s->bitwise_right_shift(x, i64({2, 1, 3}, {3})), {3}), (std::vector<std::int64_t>{3, 5, -1}));
  Tensor small = ok(s->from_host(std::vector<std::int32_t>{5, -1}, {2}));
  EXPECT_EQ(ok(s->to_host<std::int32_t>(ok(s->and_(small, 3.0)))), (std::vector<std::int32_t>{1, 3}));
  EXPECT_EQ(kinds_of([&] { ok(s->and_(x, y)); }), (Kinds{"Int::BitwiseAnd"}));
  EXPECT_EQ(kinds_of([&] { ok(s->xor_(x, y)); }), (Kinds{"Int::BitwiseXor"}));
  EXPECT_EQ(kinds_of([&] { ok(s->or_(x, 1.0)); }), (Kinds{"Int::BitwiseOrScalar"}));
  EXPECT_EQ(kinds_of([&] { ok(s->not_(x)); }), (Kinds{"Int::BitwiseNot"}));
  EXPECT_EQ(kinds_of([&] { ok(s->bitwise_left_shift(x, 1.0)); }), (Kinds{"Int::BitwiseLeftShiftScalar"}));
  EXPECT_EQ(kinds_of([&] { ok(s->bitwise_right_shift(x, y)); }), (Kinds{"Int::BitwiseRightShift"}));
  // Errors: float operands, mixed integer widths, shapes that do not broadcast.
  EXPECT_NAMES(error_of(s->and_(f32({1, 2}, {2}), f32({1, 2}, {2}))), "BitwiseAnd");
  EXPECT_NAMES(error_of(s->xor_(f32({1, 2}, {2}), 1.0)), "BitwiseXorScalar");
  EXPECT_NAMES(error_of(s->or_(x, small)), "BitwiseOr");
  EXPECT_NAMES(error_of(s->bitwise_left_shift(x, i64({1, 2}, {2}))), "BitwiseLeftShift");
}

// ---- Rounding, sign, NaN / inf tests

TEST_F(ApiOps, RoundingSignAndFloatTests) {
  const std::vector<float> xv{-2.5f, -1.5f, -0.5f, 0.5f, 1.5f, 2.75f};
  Tensor x = f32(xv, {2, 3});
  std::vector<double> fl, ce, ro, tr, sg;
  for (float v : xv) {
    fl.push_back(std::floor(v)), ce.push_back(std::ceil(v)), tr.push_back(std::trunc(v));
    ro.push_back(std::nearbyint(double(v)));  // half to even in the default rounding mode
    sg.push_back(v > 0 ? 1 : v < 0 ? -1 : 0);
  }
  expect_near(get(s->floor(x), {2, 3}), fl);
  expect_near(get(s->ceil(x), {2, 3}), ce);
  expect_near(get(s->round(x), {2, 3}), ro);
  expect_near(get(s->trunc(x), {2, 3}), tr);
  expect_near(get(s->sign(x), {2, 3}), sg);
  expect_near(get(s->sign(f32({0, -0.25f, 3}, {3})), {3}), {0, -1, 1});
  EXPECT_EQ(get_i64(s->sign(i64({-7, 0, 9}, {3})), {3}), (std::vector<std::int64_t>{-1, 0, 1}));
  const float inf = std::numeric_limits<float>::infinity();
  Tensor special = f32({std::numeric_limits<float>::quiet_NaN(), inf, -inf, 1}, {4});
  EXPECT_EQ(get_bool(s->is_nan(special), {4}), (std::vector<bool>{true, false, false, false}));
  EXPECT_EQ(get_bool(s->is_inf(special), {4}), (std::vector<bool>{false, true, true, false}));
  EXPECT_EQ(kinds_of([&] { ok(s->floor(x)); }), (Kinds{"Float::Floor"}));
  EXPECT_EQ(kinds_of([&] { ok(s->ceil(x)); }), (Kinds{"Float::Ceil"}));
  EXPECT_EQ(kinds_of([&] { ok(s->round(x)); }), (Kinds{"Float::Round"}));
  EXPECT_EQ(kinds_of([&] { ok(s->trunc(x)); }), (Kinds{"Float::Trunc"}));
  EXPECT_EQ(kinds_of([&] { ok(s->is_nan(x)); }), (Kinds{"Float::IsNan"}));
  EXPECT_EQ(kinds_of([&] { ok(s->is_inf(x)); }), (Kinds{"Float::IsInf"}));
  // docs/spec/ir.md §5.11: sign never emits Numeric Sign.
  EXPECT_EQ(kinds_of([&] { ok(s->sign(x)); }),
            (Kinds{"BaseFloat::Zeros", "NumericFloat::LowerElem", "NumericFloat::GreaterElem", "BaseFloat::MaskFill",
                   "BaseFloat::MaskFill"}));
  Tensor n = i64({1}, {1});
  EXPECT_EQ(kinds_of([&] { ok(s->sign(n)); }),
            (Kinds{"BaseInt::Zeros", "NumericInt::LowerElem", "NumericInt::GreaterElem", "BaseInt::MaskFill",
                   "BaseInt::MaskFill"}));
  // Errors: integer operands of float-only ops, a bool sign.
  EXPECT_NAMES(error_of(s->floor(n)), "Floor");
  EXPECT_NAMES(error_of(s->round(n)), "Round");
  EXPECT_NAMES(error_of(s->is_nan(n)), "IsNan");
  EXPECT_NAMES(error_of(s->sign(bools({true}, {1}))), "sign");
  EXPECT_EQ(kinds_of([&] { (void)s->sign(bools({true}, {1})); }), Kinds{});
}

// ---- Activations (docs/spec/ir.md §5.9, §5.11): the Activation kinds exist in the IR for router
// clients, but the Session, as Burn's fusion client, emits the decompositions.

TEST_F(ApiOps, ActivationCallsEmitTheDecompositionsNotTheActivationKinds) {
  Tensor x = f32({-1, 0, 2}, {3});
  Tensor m = f32({1, 2, 3, 4}, {2, 2});
  const Kinds relu = kinds_of([&] { ok(s->relu(x)); });
  EXPECT_EQ(relu, (Kinds{"NumericFloat::LowerEqualElem", "BaseFloat::MaskFill"}));
  const Kinds all = kinds_of([&] {
    ok(s->gelu(x));
    ok(s->sigmoid(x));
    ok(s->silu(x));
    ok(s->softmax(m, 1));
    ok(s->log_softmax(m, 0));
  });
  EXPECT_FALSE(all.empty());
  for (const std::string& k : all) EXPECT_EQ(k.rfind("Activation::", 0), std::string::npos) << k;
}

// ---- Trigonometric and hyperbolic functions, atan2, hypot (docs/spec/ir.md §5.6)

TEST_F(ApiOps, TrigonometricAndHyperbolicFunctions) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  Tensor x = f32({0.0f, 0.5f, -1.0f, 2.0f}, {2, 2});
  // Closed forms (cosh 1 = (e + 1/e) / 2, acos ½ = π/3, asinh 1 = ln(1 + √2), atanh ½ = ln 3 / 2 ...).
  expect_near(get(s->cosh(x), {2, 2}), {1, 1.1276259652063807, 1.5430806348152437, 3.7621956910836314});
  expect_near(get(s->sinh(x), {2, 2}), {0, 0.5210953054937474, -1.1752011936438014, 3.626860407847019});
  expect_near(get(s->tan(x), {2, 2}), {0, 0.5463024898437905, -1.5574077246549023, -2.185039863261519});
  expect_near(get(s->atan(x), {2, 2}), {0, 0.4636476090008061, -0.7853981633974483, 1.1071487177940904});
  expect_near(get(s->asinh(x), {2, 2}), {0, 0.48121182505960347, -0.881373587019543, 1.4436354751788103});
  // Outside the domain: NaN; at a pole: ±inf.
  std::vector<double> v = get(s->acos(x), {2, 2});
  expect_near({v[0], v[1], v[2]}, {1.5707963267948966, 1.0471975511965976, 3.141592653589793});
  EXPECT_TRUE(std::isnan(v[3])) << "acos(2)";
  v = get(s->asin(x), {2, 2});
  expect_near({v[0], v[1], v[2]}, {0, 0.5235987755982988, -1.5707963267948966});
  EXPECT_TRUE(std::isnan(v[3])) << "asin(2)";
  v = get(s->acosh(f32({1.0f, 2.0f, 0.5f, inf}, {4})), {4});
  expect_near({v[0], v[1]}, {0, 1.3169578969248166});
  EXPECT_TRUE(std::isnan(v[2])) << "acosh(0.5)";
  EXPECT_EQ(v[3], inf);
  v = get(s->atanh(f32({0.5f, 1.0f, -1.0f, 2.0f}, {4})), {4});
  expect_near({v[0]}, {0.5493061443340549});
  EXPECT_EQ(v[1], inf) << "atanh(1)";
  EXPECT_EQ(v[2], -inf) << "atanh(-1)";
  EXPECT_TRUE(std::isnan(v[3])) << "atanh(2)";
  EXPECT_TRUE(std::isnan(get(s->cosh(f32({nan}, {1})), {1})[0]));
  for (auto [call, kind] : {std::pair{&Session::cosh, "Float::Cosh"}, std::pair{&Session::sinh, "Float::Sinh"},
                            std::pair{&Session::tan, "Float::Tan"}, std::pair{&Session::acos, "Float::ArcCos"},
                            std::pair{&Session::acosh, "Float::ArcCosh"}, std::pair{&Session::asin, "Float::ArcSin"},
                            std::pair{&Session::asinh, "Float::ArcSinh"}, std::pair{&Session::atan, "Float::ArcTan"},
                            std::pair{&Session::atanh, "Float::ArcTanh"}}) {
    EXPECT_EQ(kinds_of([&, c = call] { ok((s.get()->*c)(x)); }), (Kinds{kind}));
    // Float only: an integer operand is the builder's error, naming the kind.
    EXPECT_NAMES(error_of((s.get()->*call)(i64({1}, {1}))), std::string(kind).substr(7));
  }
}

TEST_F(ApiOps, Atan2AndHypot) {
  const double pi = 3.141592653589793;
  // atan2(y, x), y the first operand: the four quadrants, the axes and the signed zeros.
  Tensor y = f32({1, 1, -1, -1, 1, 0.0f, -0.0f, -0.0f}, {8});
  Tensor x = f32({1, -1, -1, 1, 0.0f, -0.0f, -0.0f, 2}, {8});
  const std::vector<double> r = get(s->atan2(y, x), {8});
  expect_near(r, {pi / 4, 3 * pi / 4, -3 * pi / 4, -pi / 4, pi / 2, pi, -pi, -0.0});
  EXPECT_TRUE(std::signbit(r[7])) << "atan2(-0, 2) = -0";
  // Broadcasting [2, 1] with [1, 2]; rounded once to f32.
  expect_near(get(s->atan2(f32({1, -1}, {2, 1}), f32({1, -1}, {1, 2})), {2, 2}),
              {pi / 4, 3 * pi / 4, -pi / 4, -3 * pi / 4});
  // hypot: 3-4-5, 5-12-13, no overflow of the squares in f32, inf wins over NaN.
  const float big = 3e30f, nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::vector<double> h = get(s->hypot(f32({3, -5, big, inf}, {4}), f32({4, 12, big, nan}, {4})), {4});
  expect_near({h[0], h[1], h[2]}, {5, 13, 4.242640687119285e30});
  EXPECT_EQ(h[3], inf) << "hypot(inf, NaN)";
  EXPECT_EQ(kinds_of([&] { ok(s->atan2(y, x)); }), (Kinds{"Float::ArcTan2"}));
  EXPECT_EQ(kinds_of([&] { ok(s->hypot(y, x)); }), (Kinds{"Float::Hypot"}));
  // Errors: shapes that do not broadcast, integer operands, mixed dtypes.
  EXPECT_NAMES(error_of(s->atan2(y, f32({1, 2, 3}, {3}))), "ArcTan2");
  EXPECT_NAMES(error_of(s->hypot(i64({1}, {1}), i64({2}, {1}))), "Hypot");
  Tensor d = ok(s->from_host(std::vector<double>{1.0}, {1}));
  EXPECT_NAMES(error_of(s->hypot(f32({1}, {1}), d)), "Hypot");
}

// ---- Creation

TEST_F(ApiOps, Creation) {
  expect_near(get(s->zeros({2, 3}), {2, 3}), std::vector<double>(6, 0.0));
  expect_near(get(s->ones({3}), {3}), std::vector<double>(3, 1.0));
  expect_near(get(s->full({2, 2}, 2.5), {2, 2}), std::vector<double>(4, 2.5));
  EXPECT_EQ(get_i64(s->ones({2}, ir::dtypes::i64), {2}), (std::vector<std::int64_t>{1, 1}));
  EXPECT_EQ(get_i64(s->zeros({1, 2}, ir::dtypes::i64), {1, 2}), (std::vector<std::int64_t>{0, 0}));
  EXPECT_EQ(ok(s->to_host<std::int32_t>(ok(s->full({3}, -4, ir::dtypes::i32)))), (std::vector<std::int32_t>(3, -4)));
  EXPECT_EQ(ok(s->to_host<double>(ok(s->full({2}, 0.125, ir::dtypes::f64)))), (std::vector<double>(2, 0.125)));
  EXPECT_EQ(get_bool(s->ones({3}, Session::kBoolDType), {3}), (std::vector<bool>(3, true)));
  EXPECT_EQ(get_bool(s->zeros({2}, Session::kBoolDType), {2}), (std::vector<bool>(2, false)));
  EXPECT_EQ(get_bool(s->full({2}, 1, Session::kBoolDType), {2}), (std::vector<bool>(2, true)));
  EXPECT_EQ(get_bool(s->full({2}, 0, Session::kBoolDType), {2}), (std::vector<bool>(2, false)));
  // Empty: shape and dtype only (its contents are unspecified).
  Tensor e = ok(s->empty({2, 3}, ir::dtypes::f64));
  EXPECT_EQ(e.shape(), (Shape{2, 3}));
  EXPECT_EQ(e.dtype(), ir::dtypes::f64);
  EXPECT_EQ(ok(s->to_host<double>(std::move(e))).size(), 6u);
  EXPECT_EQ(kinds_of([&] { ok(s->zeros({2})); }), (Kinds{"BaseFloat::Zeros"}));
  EXPECT_EQ(kinds_of([&] { ok(s->ones({2}, ir::dtypes::i32)); }), (Kinds{"BaseInt::Ones"}));
  EXPECT_EQ(kinds_of([&] { ok(s->empty({2}, Session::kBoolDType)); }), (Kinds{"BaseBool::Empty"}));
  EXPECT_EQ(kinds_of([&] { ok(s->full({2}, 3)); }), (Kinds{"NumericFloat::Full"}));
  EXPECT_EQ(kinds_of([&] { ok(s->full({2}, 3, ir::dtypes::i64)); }), (Kinds{"NumericInt::Full"}));
  EXPECT_EQ(kinds_of([&] { ok(s->full({2}, 1, Session::kBoolDType)); }), (Kinds{"BaseBool::Ones"}));
  EXPECT_EQ(kinds_of([&] { ok(s->full({2}, 0, Session::kBoolDType)); }), (Kinds{"BaseBool::Zeros"}));
}

// ---- Random creation and arange

using Dist = ir::build::DistributionIr;

// Moments of a sample, and the fraction of it inside [lo, hi].
struct Moments {
  double mean = 0, sd = 0, min = 0, max = 0;
};
Moments moments(const std::vector<double>& v) {
  Moments m{0, 0, v.empty() ? 0 : v[0], v.empty() ? 0 : v[0]};
  for (double x : v) m.mean += x, m.min = std::min(m.min, x), m.max = std::max(m.max, x);
  m.mean /= static_cast<double>(v.size());
  for (double x : v) m.sd += (x - m.mean) * (x - m.mean);
  m.sd = std::sqrt(m.sd / static_cast<double>(v.size() - 1));
  return m;
}
double fraction_within(const std::vector<double>& v, double lo, double hi) {
  const auto n = std::count_if(v.begin(), v.end(), [&](double x) { return x >= lo && x <= hi; });
  return static_cast<double>(n) / static_cast<double>(v.size());
}
template <class T>
std::vector<double> as_doubles(const std::vector<T>& v) {
  return std::vector<double>(v.begin(), v.end());
}

// 10^4 draws; each bound is 5 standard errors of the statistic (a wrong distribution, a
// shifted or scaled one, or a uniform in place of a normal fails them; a right one fails
// with probability < 10^-6).
constexpr double kDraws = 10000;
const Shape kDrawShape{100, 100};

TEST_F(ApiOps, RandomFloatDistributionsOnALargeSample) {
  const std::vector<double> u = get(s->random(kDrawShape), kDrawShape);  // Default: [0, 1)
  const Moments mu = moments(u);
  EXPECT_GE(mu.min, 0.0);
  EXPECT_LT(mu.max, 1.0);
  EXPECT_NEAR(mu.mean, 0.5, 5 * std::sqrt(1.0 / 12 / kDraws));
  EXPECT_NEAR(mu.sd, std::sqrt(1.0 / 12), 0.01);
  EXPECT_NEAR(fraction_within(u, 0, 0.25), 0.25, 5 * std::sqrt(0.25 * 0.75 / kDraws));

  const std::vector<double> b = get(s->random(kDrawShape, Dist::bernoulli(0.3)), kDrawShape);
  EXPECT_TRUE(std::all_of(b.begin(), b.end(), [](double x) { return x == 0 || x == 1; }));
  EXPECT_NEAR(moments(b).mean, 0.3, 5 * std::sqrt(0.3 * 0.7 / kDraws));

  // f32 may round a draw just below high up to high (as PyTorch's uniform_): hence <= 3.
  const std::vector<double> w = get(s->random(kDrawShape, Dist::uniform(-2, 3)), kDrawShape);
  const Moments mw = moments(w);
  EXPECT_GE(mw.min, -2.0);
  EXPECT_LE(mw.max, 3.0);
  EXPECT_LT(mw.min, -1.99);
  EXPECT_GT(mw.max, 2.99);
  EXPECT_NEAR(mw.mean, 0.5, 5 * 5 / std::sqrt(12.0 * kDraws));
  EXPECT_NEAR(mw.sd, 5 / std::sqrt(12.0), 0.04);

  std::vector<double> got = ok(s->to_host<double>(ok(s->random(kDrawShape, Dist::normal(1.5, 2), ir::dtypes::f64))));
  ASSERT_EQ(got.size(), 10000u);  // f64 this time
  const Moments mn = moments(got);
  EXPECT_NEAR(mn.mean, 1.5, 5 * 2 / std::sqrt(kDraws));
  EXPECT_NEAR(mn.sd, 2.0, 5 * 2 / std::sqrt(2.0 * kDraws));
  EXPECT_NEAR(fraction_within(got, -0.5, 3.5), 0.6827, 5 * std::sqrt(0.6827 * 0.3173 / kDraws));  // ±1 std
  EXPECT_NEAR(fraction_within(got, -2.5, 5.5), 0.9545, 5 * std::sqrt(0.9545 * 0.0455 / kDraws));  // ±2 std
  // A zero std is a constant.
  expect_near(get(s->random({3}, Dist::normal(-4, 0)), {3}), {-4, -4, -4});
}

TEST_F(ApiOps, RandomIntegerDistributionsOnALargeSample) {
  // Default on integers: [0, 255), as Burn's int_random.
  const std::vector<double> d = as_doubles(get_i64(s->random(kDrawShape, {}, ir::dtypes::i64), kDrawShape));
  const Moments md = moments(d);
  EXPECT_EQ(md.min, 0);
  EXPECT_EQ(md.max, 254);
  EXPECT_NEAR(md.mean, 127, 5 * std::sqrt((255.0 * 255 - 1) / 12 / kDraws));

  const std::vector<double> w =
      as_doubles(ok(s->to_host<std::int32_t>(ok(s->random(kDrawShape, Dist::uniform(-5, 5), ir::dtypes::i32)))));
  const Moments mw = moments(w);
  EXPECT_EQ(mw.min, -5);
  EXPECT_EQ(mw.max, 4);  // high is excluded
  EXPECT_NEAR(mw.mean, -0.5, 5 * std::sqrt(99.0 / 12 / kDraws));

  const std::vector<double> b =
      as_doubles(get_i64(s->random(kDrawShape, Dist::bernoulli(0.5), ir::dtypes::i64), kDrawShape));
  EXPECT_TRUE(std::all_of(b.begin(), b.end(), [](double x) { return x == 0 || x == 1; }));
  EXPECT_NEAR(moments(b).mean, 0.5, 5 * std::sqrt(0.25 / kDraws));

  // Normal on integers rounds to nearest: the mean stays, the variance grows by 1/12.
  const std::vector<double> n =
      as_doubles(ok(s->to_host<std::int32_t>(ok(s->random(kDrawShape, Dist::normal(10, 3), ir::dtypes::i32)))));
  const Moments mn = moments(n);
  EXPECT_NEAR(mn.mean, 10, 5 * 3 / std::sqrt(kDraws));
  EXPECT_NEAR(mn.sd, std::sqrt(9 + 1.0 / 12), 5 * 3 / std::sqrt(2.0 * kDraws));
}

TEST_F(ApiOps, RandomKindsShapesDtypesAndErrors) {
  EXPECT_EQ(kinds_of([&] { ok(s->random({2, 3})); }), (Kinds{"Float::Random"}));
  EXPECT_EQ(kinds_of([&] { ok(s->random({2}, Dist::normal(0, 1), ir::dtypes::f64)); }), (Kinds{"Float::Random"}));
  EXPECT_EQ(kinds_of([&] { ok(s->random({2}, Dist::uniform(0, 9), ir::dtypes::i32)); }),
            (Kinds{"NumericInt::IntRandom"}));
  Tensor t = ok(s->random({2, 3, 4}, Dist::uniform(1, 2), ir::dtypes::f64));
  EXPECT_EQ(t.shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(t.dtype(), ir::dtypes::f64);
  Tensor i = ok(s->random({5}, {}, ir::dtypes::i32));
  EXPECT_EQ(i.dtype(), ir::dtypes::i32);
  EXPECT_EQ(ok(s->to_host<std::int32_t>(std::move(i))).size(), 5u);
  // Two draws on a stream differ (the generator advances).
  EXPECT_NE(get(s->random({1000}), {1000}), get(s->random({1000}), {1000}));

  // Parameters out of range: the call's error, and nothing is emitted.
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  auto refused = [&](Dist d, ir::DType dtype, const std::string& what) {
    Kinds k = kinds_of([&] {
      Result<Tensor> r = s->random({4}, d, dtype);
      ASSERT_FALSE(r.ok()) << what;
      EXPECT_EQ(r.error().code, ErrorCode::Invalid) << r.error().to_string();
      EXPECT_NAMES(r.error().to_string(), what);
    });
    EXPECT_EQ(k, Kinds{}) << what;
  };
  refused(Dist::bernoulli(1.5), ir::dtypes::f32, "Float::Random: Bernoulli probability 1.5 is not in [0, 1]");
  refused(Dist::bernoulli(-0.1), ir::dtypes::i64, "NumericInt::IntRandom: Bernoulli probability -0.1");
  refused(Dist::bernoulli(nan), ir::dtypes::f32, "Bernoulli probability nan");
  refused(Dist::uniform(2, 2), ir::dtypes::f32, "Uniform(2, 2) needs finite bounds with low < high");
  refused(Dist::uniform(3, 1), ir::dtypes::f64, "Uniform(3, 1)");
  refused(Dist::uniform(0, inf), ir::dtypes::f32, "Uniform(0, inf)");
  refused(Dist::uniform(0.2, 0.7), ir::dtypes::i32, "integer range [0, 0) is empty");
  refused(Dist::normal(0, -1), ir::dtypes::f32, "Normal(0, -1) needs a finite mean and a finite std >= 0");
  refused(Dist::normal(nan, 1), ir::dtypes::i64, "Normal(nan, 1)");
  refused(Dist::normal(0, inf), ir::dtypes::f32, "Normal(0, inf)");
  // Bool (Burn has no bool random) and QFloat: no kind to emit.
  const std::string b = error_of(s->random({2}, Dist::bernoulli(0.5), Session::kBoolDType));
  EXPECT_NAMES(b, "random: bool");
  EXPECT_NAMES(b, "ne(x, 0)");
  EXPECT_NAMES(error_of(s->random({2}, {}, ir::DType::qfloat(ir::QuantScheme{}))), "random: ");
  EXPECT_EQ(kinds_of([&] { (void)s->random({2}, {}, Session::kBoolDType); }), Kinds{});
  // A distribution right for floats but out of an integer dtype's range fails at execution.
  EXPECT_FALSE(s->to_host<std::int32_t>(ok(s->random({2}, Dist::uniform(-1e12, 0), ir::dtypes::i32))).ok());
}

#if !KILN_TEST_IPC
// Each backend stream's generator starts from a fixed seed: a fresh device replays the draws.
TEST_F(ApiOps, RandomReplaysOnAFreshDevice) {
  auto draw = [](SessionTarget& target) {
    Session fresh(target);
    return ok(fresh.to_host<float>(ok(fresh.random({64}, Dist::normal(0, 1)))));
  };
  std::unique_ptr<Device> a = api_testing::make_device(), b = api_testing::make_device();
  EXPECT_EQ(draw(*a), draw(*b));
}

// Two streams of one device draw different values: each stream's generator has a seed of its own
// (the reference backend seeded every stream alike until 2026-12-06).
TEST_F(ApiOps, TwoStreamsDrawDifferentValues) {
  std::unique_ptr<Device> device = api_testing::make_device();
  Session session(*device);
  auto draw = [&] { return ok(session.to_host<float>(ok(session.random({64}, Dist::normal(0, 1))))); };
  const std::vector<float> here = draw();
  std::vector<float> there;
  std::thread other([&] { there = draw(); });  // its own implicit stream
  other.join();
  ASSERT_EQ(there.size(), 64u);
  EXPECT_NE(here, there);
}
#endif

TEST_F(ApiOps, ArangeFollowsTorchArange) {
  EXPECT_EQ(get_i64(s->arange(0, 5), {5}), (std::vector<std::int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(get_i64(s->arange(-3, 7, 4), {3}), (std::vector<std::int64_t>{-3, 1, 5}));
  EXPECT_EQ(get_i64(s->arange(0, 9, 3), {3}), (std::vector<std::int64_t>{0, 3, 6}));
  EXPECT_EQ(get_i64(s->arange(0, 10, 3), {4}), (std::vector<std::int64_t>{0, 3, 6, 9}));
  EXPECT_EQ(get_i64(s->arange(5, -4, -3), {3}), (std::vector<std::int64_t>{5, 2, -1}));
  EXPECT_EQ(get_i64(s->arange(3, 3), {0}), (std::vector<std::int64_t>{}));  // torch.arange(3, 3): empty
  EXPECT_EQ(get_i64(s->arange(3, 3, -2), {0}), (std::vector<std::int64_t>{}));
  // The whole int64 range: no overflow in the count or the values.
  constexpr std::int64_t lo = std::numeric_limits<std::int64_t>::min(), hi = std::numeric_limits<std::int64_t>::max();
  EXPECT_EQ(get_i64(s->arange(lo, hi, hi), {3}), (std::vector<std::int64_t>{lo, -1, hi - 1}));
  EXPECT_EQ(get_i64(s->arange(hi, lo, lo), {2}), (std::vector<std::int64_t>{hi, -1}));
  // Other dtypes: built in the dtype on the host.
  Tensor i = ok(s->arange(-2, 2, 1, ir::dtypes::i32));
  EXPECT_EQ(i.dtype(), ir::dtypes::i32);
  EXPECT_EQ(ok(s->to_host<std::int32_t>(std::move(i))), (std::vector<std::int32_t>{-2, -1, 0, 1}));
  expect_near(get(s->arange(0, 3, 1, ir::dtypes::f32), {3}), {0, 1, 2});
  EXPECT_EQ(ok(s->to_host<double>(ok(s->arange(10, 0, -5, ir::dtypes::f64)))), (std::vector<double>{10, 5}));
  Tensor u = ok(s->arange(250, 256, 2, ir::dtypes::u8));
  std::vector<std::byte> bytes(3);
  KILN_EXPECT_OK(s->to_host_bytes(std::move(u), bytes));
  EXPECT_EQ(bytes, (std::vector<std::byte>{std::byte{250}, std::byte{252}, std::byte{254}}));
  // No IR: an upload.
  EXPECT_EQ(kinds_of([&] { ok(s->arange(0, 4)); }), Kinds{});
  // Errors, PyTorch's: step 0, a step pointing away from end; then the dtype's.
  EXPECT_NAMES(error_of(s->arange(0, 5, 0)), "arange(0, 5, 0): step must be nonzero");
  EXPECT_NAMES(error_of(s->arange(5, 0)), "arange(5, 0, 1): upper bound and lower bound inconsistent with step sign");
  EXPECT_NAMES(error_of(s->arange(0, 5, -1)), "inconsistent with step sign");
  EXPECT_NAMES(error_of(s->arange(250, 260, 1, ir::dtypes::u8)), "arange: 259 does not fit u8");
  EXPECT_NAMES(error_of(s->arange(-1, 2, 1, ir::dtypes::u32)), "arange: -1 does not fit u32");
  Result<Tensor> b = s->arange(0, 2, 1, Session::kBoolDType);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.error().code, ErrorCode::DTypeMismatch);
  Result<Tensor> h = s->arange(0, 2, 1, ir::dtypes::f16);
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.error().code, ErrorCode::Unsupported);
  EXPECT_NAMES(h.error().to_string(), "arange: f16");
}

// ---- Reductions and scans

const std::vector<float> kA{1.5f, -2, 0.25f, 3, -0.5f, 4};  // [2, 3]

TEST_F(ApiOps, WholeTensorAndDimReductions) {
  Tensor a = f32(kA, {2, 3});  // [[1.5, -2, 0.25], [3, -0.5, 4]]
  double prod = 1, mx = kA[0], mn = kA[0], mabs = 0;
  std::size_t argmx = 0, argmn = 0;
  for (std::size_t i = 0; i < kA.size(); ++i) {
    prod *= kA[i], mabs = std::max(mabs, std::abs(double(kA[i])));
    if (kA[i] > mx) mx = kA[i], argmx = i;
    if (kA[i] < mn) mn = kA[i], argmn = i;
  }
  expect_near(get(s->prod(a), {1}), {prod});
  expect_near(get(s->prod(a, true), {1, 1}), {prod});
  expect_near(get(s->max(a), {1}), {mx});
  expect_near(get(s->min(a), {1}), {mn});
  expect_near(get(s->max_abs(a), {1}), {mabs});
  EXPECT_EQ(get_i64(s->argmax(a), {1}), (std::vector<std::int64_t>{static_cast<std::int64_t>(argmx)}));
  EXPECT_EQ(get_i64(s->argmin(a), {1}), (std::vector<std::int64_t>{static_cast<std::int64_t>(argmn)}));
  expect_near(get(s->prod_dim(a, 1), {2, 1}), {1.5 * -2 * 0.25, 3 * -0.5 * 4});
  expect_near(get(s->prod_dim(a, 0, false), {3}), {1.5 * 3, -2 * -0.5, 0.25 * 4});
  expect_near(get(s->max_abs_dim(a, 0, false), {3}), {3, 2, 4});
  expect_near(get(s->max_abs_dim(a, 1), {2, 1}), {2, 4});
  EXPECT_EQ(get_i64(s->argmin(a, 1), {2, 1}), (std::vector<std::int64_t>{1, 1}));
  EXPECT_EQ(get_i64(s->argmin(a, 0, false), {3}), (std::vector<std::int64_t>{0, 0, 0}));
  EXPECT_EQ(get_i64(s->max(i64({3, -9, 7}, {3})), {1}), (std::vector<std::int64_t>{7}));
  EXPECT_EQ(get_i64(s->min(i64({3, -9, 7}, {3})), {1}), (std::vector<std::int64_t>{-9}));
  EXPECT_EQ(get_i64(s->prod(i64({2, 3, -4}, {3})), {1}), (std::vector<std::int64_t>{-24}));
  EXPECT_EQ(get_i64(s->argmin(i64({5, -1, -1}, {3})), {1}), (std::vector<std::int64_t>{1}));  // the first
  EXPECT_EQ(kinds_of([&] { ok(s->prod(a)); }), (Kinds{"NumericFloat::Prod"}));
  EXPECT_EQ(kinds_of([&] { ok(s->max(a, true)); }), (Kinds{"NumericFloat::Max", "BaseFloat::Reshape"}));
  EXPECT_EQ(kinds_of([&] { ok(s->max_abs(a)); }), (Kinds{"NumericFloat::MaxAbs"}));
  EXPECT_EQ(kinds_of([&] { ok(s->prod_dim(a, 0)); }), (Kinds{"NumericFloat::ProdDim"}));
  EXPECT_EQ(kinds_of([&] { ok(s->argmin(a, 0, false)); }), (Kinds{"NumericFloat::ArgMin", "BaseInt::Reshape"}));
  // (K) docs/spec/ir.md §5.11: whole-tensor arg reductions flatten first, even a rank-1 tensor.
  EXPECT_EQ(kinds_of([&] { ok(s->argmax(a)); }), (Kinds{"BaseFloat::Reshape", "NumericFloat::ArgMax"}));
  Tensor v = i64({4, 2}, {2});
  EXPECT_EQ(kinds_of([&] { ok(s->argmin(v)); }), (Kinds{"BaseInt::Reshape", "NumericInt::ArgMin"}));
  // Errors: an axis out of range, a bool operand, keepdim = false giving rank 0.
  EXPECT_NAMES(error_of(s->argmin(a, 2)), "ArgMin");
  EXPECT_NAMES(error_of(s->prod_dim(a, 7)), "ProdDim");
  EXPECT_NAMES(error_of(s->max(bools({true}, {1}))), "Max");
  EXPECT_NAMES(error_of(s->max_abs_dim(f32({1, 2}, {2}), 0, false)), "rank-0");
}

TEST_F(ApiOps, AnyAndAll) {
  Tensor m = bools({true, false, false, false}, {2, 2});
  EXPECT_EQ(get_bool(s->any(m), {1}), (std::vector<bool>{true}));
  EXPECT_EQ(get_bool(s->all(m), {1}), (std::vector<bool>{false}));
  EXPECT_EQ(get_bool(s->any(m, true), {1, 1}), (std::vector<bool>{true}));
  EXPECT_EQ(get_bool(s->any_dim(m, 1), {2, 1}), (std::vector<bool>{true, false}));
  EXPECT_EQ(get_bool(s->all_dim(m, 0, false), {2}), (std::vector<bool>{false, false}));
  EXPECT_EQ(get_bool(s->all(bools({true, true}, {2})), {1}), (std::vector<bool>{true}));
  // Numeric operands: x != 0.
  Tensor f = f32({0, 2, 0, 0}, {2, 2});
  EXPECT_EQ(get_bool(s->any(f), {1}), (std::vector<bool>{true}));
  EXPECT_EQ(get_bool(s->all(f32({1, -1, 0.5f}, {3})), {1}), (std::vector<bool>{true}));
  EXPECT_EQ(get_bool(s->any_dim(f, 0), {1, 2}), (std::vector<bool>{false, true}));
  EXPECT_EQ(get_bool(s->all_dim(i64({1, 0, 3, 4}, {2, 2}), 1, false), {2}), (std::vector<bool>{false, true}));
  EXPECT_EQ(get_bool(s->any(i64({0, 0}, {2})), {1}), (std::vector<bool>{false}));
  EXPECT_EQ(kinds_of([&] { ok(s->any(m)); }), (Kinds{"BaseBool::Any"}));
  EXPECT_EQ(kinds_of([&] { ok(s->all(f)); }), (Kinds{"BaseFloat::All"}));
  EXPECT_EQ(kinds_of([&] { ok(s->all_dim(m, 0)); }), (Kinds{"BaseBool::AllDim"}));
  EXPECT_EQ(kinds_of([&] { ok(s->any_dim(f, 1, false)); }), (Kinds{"BaseFloat::AnyDim", "BaseBool::Reshape"}));
  EXPECT_NAMES(error_of(s->any_dim(m, 2)), "AnyDim");
}

TEST_F(ApiOps, MaxAndMinAlongADimWithIndices) {
  const std::vector<float> xv{3, 1, 3, -2, 5, 5};  // [2, 3]; ties: the first occurrence
  Tensor x = f32(xv, {2, 3});
  // Per row (dim 1) and per column (dim 0), by hand from the rule.
  std::vector<double> row_max, row_min, col_max;
  std::vector<std::int64_t> row_argmax, row_argmin, col_argmax;
  for (int r = 0; r < 2; ++r) {
    int imax = 0, imin = 0;
    for (int c = 1; c < 3; ++c) {
      if (xv[r * 3 + c] > xv[r * 3 + imax]) imax = c;
      if (xv[r * 3 + c] < xv[r * 3 + imin]) imin = c;
    }
    row_max.push_back(xv[r * 3 + imax]), row_argmax.push_back(imax);
    row_min.push_back(xv[r * 3 + imin]), row_argmin.push_back(imin);
  }
  for (int c = 0; c < 3; ++c) {
    const int best = xv[3 + c] > xv[c] ? 1 : 0;
    col_max.push_back(xv[best * 3 + c]), col_argmax.push_back(best);
  }
  auto [mv, mi] = ok(s->max_dim_with_indices(x, 1));
  EXPECT_EQ(mi.dtype(), Session::kIndexDType);
  expect_near(get(std::move(mv), {2, 1}), row_max);
  EXPECT_EQ(get_i64(std::move(mi), {2, 1}), row_argmax);
  auto [nv, ni] = ok(s->min_dim_with_indices(x, 1, false));
  expect_near(get(std::move(nv), {2}), row_min);
  EXPECT_EQ(get_i64(std::move(ni), {2}), row_argmin);
  auto [cv, ci] = ok(s->max_dim_with_indices(x, 0));
  expect_near(get(std::move(cv), {1, 3}), col_max);
  EXPECT_EQ(get_i64(std::move(ci), {1, 3}), col_argmax);
  auto [iv, ii] = ok(s->min_dim_with_indices(i64({4, -6, 2, 9}, {2, 2}), 0, false));
  EXPECT_EQ(get_i64(std::move(iv), {2}), (std::vector<std::int64_t>{2, -6}));
  EXPECT_EQ(get_i64(std::move(ii), {2}), (std::vector<std::int64_t>{1, 0}));
  EXPECT_EQ(kinds_of([&] { ok(s->max_dim_with_indices(x, 1)); }), (Kinds{"NumericFloat::MaxDimWithIndices"}));
  EXPECT_EQ(kinds_of([&] { ok(s->min_dim_with_indices(x, 1, false)); }),
            (Kinds{"NumericFloat::MinDimWithIndices", "BaseFloat::Reshape", "BaseInt::Reshape"}));
  Result<std::pair<Tensor, Tensor>> bad = s->max_dim_with_indices(x, 2);
  ASSERT_FALSE(bad.ok());
  EXPECT_NAMES(bad.error().to_string(), "MaxDimWithIndices");
  bad = s->min_dim_with_indices(f32({1, 2}, {2}), 0, false);
  ASSERT_FALSE(bad.ok());
  EXPECT_NAMES(bad.error().to_string(), "rank-0");
}

TEST_F(ApiOps, CumulativeScans) {
  const std::vector<float> xv{1, 2, -3, 4, 0.5f, -1};  // [2, 3]
  Tensor x = f32(xv, {2, 3});
  // Inclusive scans along dim 1 (rows) with `f`, and along dim 0 (columns).
  auto scan_rows = [&](double (*f)(double, double)) {
    std::vector<double> out;
    for (int r = 0; r < 2; ++r) {
      double acc = xv[r * 3];
      out.push_back(acc);
      for (int c = 1; c < 3; ++c) out.push_back(acc = f(acc, xv[r * 3 + c]));
    }
    return out;
  };
  expect_near(get(s->cumsum(x, 1), {2, 3}), scan_rows([](double a, double b) { return a + b; }));
  expect_near(get(s->cumprod(x, 1), {2, 3}), scan_rows([](double a, double b) { return a * b; }));
  expect_near(get(s->cummax(x, 1), {2, 3}), scan_rows([](double a, double b) { return std::max(a, b); }));
  expect_near(get(s->cummin(x, 1), {2, 3}), scan_rows([](double a, double b) { return std::min(a, b); }));
  std::vector<double> cols(xv.begin(), xv.end());
  for (int c = 0; c < 3; ++c) cols[3 + c] += cols[c];
  expect_near(get(s->cumsum(x, 0), {2, 3}), cols);
  EXPECT_EQ(get_i64(s->cumsum(i64({1, 2, 3}, {3}), 0), {3}), (std::vector<std::int64_t>{1, 3, 6}));
  EXPECT_EQ(get_i64(s->cumprod(i64({2, -3, 4}, {3}), 0), {3}), (std::vector<std::int64_t>{2, -6, -24}));
  EXPECT_EQ(kinds_of([&] { ok(s->cumsum(x, 1)); }), (Kinds{"NumericFloat::CumSum"}));
  EXPECT_EQ(kinds_of([&] { ok(s->cumprod(x, 0)); }), (Kinds{"NumericFloat::CumProd"}));
  EXPECT_EQ(kinds_of([&] { ok(s->cummin(x, 0)); }), (Kinds{"NumericFloat::CumMin"}));
  EXPECT_EQ(kinds_of([&] { ok(s->cummax(x, 0)); }), (Kinds{"NumericFloat::CumMax"}));
  EXPECT_NAMES(error_of(s->cumsum(x, 2)), "CumSum");
  EXPECT_NAMES(error_of(s->cummax(bools({true}, {1}), 0)), "CumMax");
}

// ---- Sorting and top-k (docs/spec/ir.md §5.5): stable, NaN as the largest value

TEST_F(ApiOps, SortArgsortAndSortWithIndices) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // [2, 4]: ties (5, 5), a NaN; sorted by hand along each row.
  Tensor x = f32({5, nan, -1, 5, 2, 0.5f, 2, -3}, {2, 4});
  std::vector<double> up = get(s->sort(x, 1), {2, 4});
  expect_near({up[0], up[1], up[2]}, {-1, 5, 5});
  EXPECT_TRUE(std::isnan(up[3])) << "NaN sorts last ascending";
  expect_near({up[4], up[5], up[6], up[7]}, {-3, 0.5, 2, 2});
  EXPECT_EQ(get_i64(s->argsort(x, 1), {2, 4}), (std::vector<std::int64_t>{2, 0, 3, 1, 3, 1, 0, 2}));
  std::vector<double> down = get(s->sort(x, 1, true), {2, 4});
  EXPECT_TRUE(std::isnan(down[0])) << "NaN sorts first descending";
  expect_near({down[1], down[2], down[3], down[4], down[5], down[6], down[7]}, {5, 5, -1, 2, 2, 0.5, -3});
  // Stable descending: the tie 5 (indices 0 and 3) and 2 (indices 0 and 2) keep their index order.
  EXPECT_EQ(get_i64(s->argsort(x, 1, true), {2, 4}), (std::vector<std::int64_t>{1, 0, 3, 2, 0, 2, 1, 3}));
  // Along dim 0 of an integer tensor, both outputs at once.
  auto [v, i] = ok(s->sort_with_indices(i64({4, -6, 2, 9, 4, 1}, {3, 2}), 0));
  EXPECT_EQ(i.dtype(), Session::kIndexDType);
  EXPECT_EQ(get_i64(std::move(v), {3, 2}), (std::vector<std::int64_t>{2, -6, 4, 1, 4, 9}));
  EXPECT_EQ(get_i64(std::move(i), {3, 2}), (std::vector<std::int64_t>{1, 0, 0, 2, 2, 1}));
  EXPECT_EQ(kinds_of([&] { ok(s->sort(x, 1)); }), (Kinds{"NumericFloat::Sort"}));
  EXPECT_EQ(kinds_of([&] { ok(s->argsort(x, 0, true)); }), (Kinds{"NumericFloat::ArgSort"}));
  EXPECT_EQ(kinds_of([&] { ok(s->sort_with_indices(x, 1)); }), (Kinds{"NumericFloat::SortWithIndices"}));
  // Errors: a dim out of range, a bool operand (no numeric family); nothing is registered.
  EXPECT_NAMES(error_of(s->sort(x, 2)), "Sort: dim 2 out of bounds");
  EXPECT_NAMES(error_of(s->argsort(bools({true, false}, {2}), 0)), "ArgSort");
  Result<std::pair<Tensor, Tensor>> bad = s->sort_with_indices(x, 5);
  ASSERT_FALSE(bad.ok());
  EXPECT_NAMES(bad.error().to_string(), "SortWithIndices");
  EXPECT_EQ(kinds_of([&] { (void)s->sort(x, 2); }), Kinds{});
}

TEST_F(ApiOps, TopKAndArgTopK) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor x = f32({1, 5, 3, 5, 2, nan, 8, -1}, {2, 4});
  // The k largest per row in descending order (ties in index order, NaN first), by hand.
  std::vector<double> t = get(s->topk(x, 3, 1), {2, 3});
  expect_near({t[0], t[1], t[2]}, {5, 5, 3});
  EXPECT_TRUE(std::isnan(t[3]));
  expect_near({t[4], t[5]}, {8, 2});
  Tensor idx = ok(s->argtopk(x, 3, 1));
  EXPECT_EQ(idx.dtype(), Session::kIndexDType);
  EXPECT_EQ(get_i64(std::move(idx), {2, 3}), (std::vector<std::int64_t>{1, 3, 2, 1, 2, 0}));
  // Along dim 0, k = 1: the column maxima (NaN beats 5).
  std::vector<double> col = get(s->topk(x, 1, 0), {1, 4});
  expect_near({col[0], col[2], col[3]}, {2, 8, 5});
  EXPECT_TRUE(std::isnan(col[1])) << "NaN is the largest value";
  EXPECT_EQ(get_i64(s->argtopk(i64({3, 9, 7, 1}, {2, 2}), 2, 0), {2, 2}), (std::vector<std::int64_t>{1, 0, 0, 1}));
  EXPECT_EQ(kinds_of([&] { ok(s->topk(x, 2, 1)); }), (Kinds{"NumericFloat::TopK"}));
  EXPECT_EQ(kinds_of([&] { ok(s->argtopk(x, 2, 1)); }), (Kinds{"NumericFloat::ArgTopK"}));
  // Errors name the op and the values: k above the dim's size, k = 0, a bad dim.
  EXPECT_NAMES(error_of(s->topk(x, 5, 1)), "TopK: k 5 exceeds axis 1 of size 4");
  EXPECT_NAMES(error_of(s->argtopk(x, 0, 1)), "ArgTopK");
  EXPECT_NAMES(error_of(s->topk(x, 1, 2)), "TopK: axis 2 out of bounds");
  EXPECT_EQ(kinds_of([&] { (void)s->topk(x, 5, 1); }), Kinds{});
}

// ---- Layout, indexing and assignment

const std::vector<float> kM{1, 2, 3, 4, 5, 6};  // [2, 3]

TEST_F(ApiOps, FlipRepeatSelectGatherNd) {
  Tensor a = f32(kM, {2, 3});
  expect_near(get(s->flip(a, {1}), {2, 3}), {3, 2, 1, 6, 5, 4});
  expect_near(get(s->flip(a, {0, 1}), {2, 3}), {6, 5, 4, 3, 2, 1});
  expect_near(get(s->repeat_dim(a, 0, 2), {4, 3}), {1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6});
  expect_near(get(s->repeat_dim(f32({1, 2}, {2, 1}), 1, 3), {2, 3}), {1, 1, 1, 2, 2, 2});
  // select: out[:, j] = a[:, idx[j]].
  const std::vector<std::int64_t> idx{2, 0, 2};
  std::vector<double> sel;
  for (int r = 0; r < 2; ++r)
    for (std::int64_t j : idx) sel.push_back(kM[r * 3 + j]);
  expect_near(get(s->select(a, 1, i64(idx, {3})), {2, 3}), sel);
  expect_near(get(s->select(a, 0, i64({1}, {1})), {1, 3}), {4, 5, 6});
  EXPECT_EQ(get_i64(s->select(i64({7, 8, 9}, {3}), 0, i64({2, 2}, {2})), {2}), (std::vector<std::int64_t>{9, 9}));
  // gather_nd: index tuples of length 2 pick elements, of length 1 pick rows.
  expect_near(get(s->gather_nd(a, i64({1, 0, 0, 2}, {2, 2})), {2}), {kM[3], kM[2]});
  expect_near(get(s->gather_nd(a, i64({1, 0}, {2, 1})), {2, 3}), {4, 5, 6, 1, 2, 3});
  EXPECT_EQ(kinds_of([&] { ok(s->flip(a, {0})); }), (Kinds{"BaseFloat::Flip"}));
  EXPECT_EQ(kinds_of([&] { ok(s->repeat_dim(a, 1, 2)); }), (Kinds{"BaseFloat::RepeatDim"}));
  Tensor i = i64({0}, {1});
  EXPECT_EQ(kinds_of([&] { ok(s->select(a, 0, i)); }), (Kinds{"BaseFloat::Select"}));
  Tensor t = i64({0, 1}, {1, 2});
  EXPECT_EQ(kinds_of([&] { ok(s->gather_nd(a, t)); }), (Kinds{"BaseFloat::GatherNd"}));
  // Errors: a repeated or out-of-range axis, float or rank-2 select indices, tuples longer than
  // the data's rank.
  EXPECT_NAMES(error_of(s->flip(a, {1, 1})), "Flip");
  EXPECT_NAMES(error_of(s->flip(a, {2})), "Flip");
  EXPECT_NAMES(error_of(s->repeat_dim(a, 2, 2)), "RepeatDim");
  EXPECT_NAMES(error_of(s->select(a, 0, f32({0}, {1}))), "Select");
  EXPECT_NAMES(error_of(s->select(a, 0, i64({0, 1}, {1, 2}))), "Select");
  EXPECT_NAMES(error_of(s->gather_nd(a, i64({0, 0, 0}, {1, 3}))), "GatherNd");
}

TEST_F(ApiOps, SliceAssignSelectAssignScatter) {
  Tensor a = f32(kM, {2, 3});
  // slice_assign: a[0:1, 1:3] = [[7, 8]].
  expect_near(get(s->slice_assign(a, {ir::Slice{0, 1, 1}, ir::Slice{1, 3, 1}}, f32({7, 8}, {1, 2})), {2, 3}),
              {1, 7, 8, 4, 5, 6});
  expect_near(get(s->slice_assign(a, {ir::Slice{1, 2, 1}}, f32({0, 0, 0}, {1, 3})), {2, 3}), {1, 2, 3, 0, 0, 0});
  // select_assign along dim 0 at row 1: Add, then Assign.
  const std::vector<float> row{10, 20, 30};
  std::vector<double> added(kM.begin(), kM.end()), assigned(kM.begin(), kM.end());
  for (int c = 0; c < 3; ++c) added[3 + c] += row[c], assigned[3 + c] = row[c];
  expect_near(get(s->select_assign(a, 0, i64({1}, {1}), f32(row, {1, 3}), ir::IndexingUpdate::Add), {2, 3}), added);
  expect_near(get(s->select_assign(a, 0, i64({1}, {1}), f32(row, {1, 3}), ir::IndexingUpdate::Assign), {2, 3}),
              assigned);
  // scatter along dim 1: out[r, idx[r, j]] = update(out[r, idx[r, j]], value[r, j]), in index order.
  const std::vector<std::int64_t> idx{2, 0, 1, 1};
  const std::vector<float> val{1, 2, 3, 4};
  std::vector<double> sc_add(kM.begin(), kM.end()), sc_assign(kM.begin(), kM.end());
  for (int r = 0; r < 2; ++r)
    for (int j = 0; j < 2; ++j) {
      const std::size_t at = r * 3 + static_cast<std::size_t>(idx[r * 2 + j]);
      sc_add[at] += val[r * 2 + j], sc_assign[at] = val[r * 2 + j];
    }
  expect_near(get(s->scatter(a, 1, i64(idx, {2, 2}), f32(val, {2, 2}), ir::IndexingUpdate::Add), {2, 3}), sc_add);
  expect_near(get(s->scatter(a, 1, i64(idx, {2, 2}), f32(val, {2, 2}), ir::IndexingUpdate::Assign), {2, 3}), sc_assign);
  Tensor v = f32({9}, {1, 1}), i = i64({0}, {1}), ii = i64({0}, {1, 1});
  EXPECT_EQ(kinds_of([&] {
              ok(s->slice_assign(a, {ir::Slice{0, 1, 1}, ir::Slice{0, 1, 1}}, v));
            }),
            (Kinds{"BaseFloat::SliceAssign"}));
  EXPECT_EQ(kinds_of([&] {
              ok(s->select_assign(a, 1, i, f32({1, 2}, {2, 1}), ir::IndexingUpdate::Add));
            }),
            (Kinds{"BaseFloat::SelectAssign"}));
  EXPECT_EQ(kinds_of([&] { ok(s->scatter(a, 0, ii, v, ir::IndexingUpdate::Add)); }), (Kinds{"BaseFloat::Scatter"}));
  // Errors: a value that does not fit (checked before any IR), mixed dtypes, bad indices.
  EXPECT_NAMES(error_of(s->slice_assign(a, {ir::Slice{0, 1, 1}}, f32({1, 2}, {1, 2}))), "slice_assign");
  EXPECT_NAMES(error_of(s->slice_assign(a, {ir::Slice{0, 1, 1}}, i64({1, 2, 3}, {1, 3}))), "SliceAssign");
  EXPECT_NAMES(error_of(s->select_assign(a, 0, i, f32({1, 2}, {1, 2}), ir::IndexingUpdate::Add)), "select_assign");
  EXPECT_NAMES(error_of(s->select_assign(a, 0, f32({0}, {1}), f32(row, {1, 3}), ir::IndexingUpdate::Add)),
               "SelectAssign");
  EXPECT_NAMES(error_of(s->scatter(a, 1, i64({0}, {1}), f32({1}, {1}), ir::IndexingUpdate::Add)), "scatter");
  EXPECT_NAMES(error_of(s->scatter(a, 1, ii, i64({1}, {1, 1}), ir::IndexingUpdate::Add)), "Scatter");
  const Kinds none = kinds_of([&] { (void)s->slice_assign(a, {ir::Slice{0, 1, 1}}, f32({1, 2}, {1, 2})); });
  EXPECT_EQ(none, Kinds{});
}

// Unfold, ScatterNd (docs/spec/ir.md §5.4) and the float cross product (§5.6): one kind each.
TEST_F(ApiOps, UnfoldAndScatterNd) {
  Tensor a = f32(kM, {2, 3});
  // Windows of 2 every 1 along dim 1, the window axis last: [[1, 2], [2, 3]], [[4, 5], [5, 6]].
  expect_near(get(s->unfold(a, 1, 2, 1), {2, 2, 2}), {1, 2, 2, 3, 4, 5, 5, 6});
  // One window of both rows along dim 0: the columns as 2-vectors.
  expect_near(get(s->unfold(a, 0, 2, 1), {1, 3, 2}), {1, 4, 2, 5, 3, 6});
  EXPECT_EQ(get_i64(s->unfold(i64({1, 2, 3, 4, 5}, {5}), 0, 2, 2), {2, 2}), (std::vector<std::int64_t>{1, 2, 3, 4}));
  // scatter_nd with 2-tuples (elements) and a 1-tuple (a row).
  Tensor cells = i64({1, 0, 0, 2}, {2, 2});
  expect_near(get(s->scatter_nd(a, cells, f32({10, 20}, {2}), ir::IndexingUpdate::Assign), {2, 3}),
              {1, 2, 20, 10, 5, 6});
  expect_near(get(s->scatter_nd(a, cells, f32({10, 20}, {2}), ir::IndexingUpdate::Add), {2, 3}), {1, 2, 23, 14, 5, 6});
  expect_near(get(s->scatter_nd(a, i64({1}, {1, 1}), f32({7, 8, 9}, {1, 3}), ir::IndexingUpdate::Mul), {2, 3}),
              {1, 2, 3, 28, 40, 54});
  Tensor v = f32({1}, {1}), row = i64({0, 0}, {1, 2});
  EXPECT_EQ(kinds_of([&] { ok(s->unfold(a, 1, 3, 1)); }), (Kinds{"BaseFloat::Unfold"}));
  EXPECT_EQ(kinds_of([&] { ok(s->scatter_nd(a, row, v, ir::IndexingUpdate::Max)); }), (Kinds{"BaseFloat::ScatterNd"}));
  // Errors: step 0, a bad dim, values of the wrong shape (checked first), float indices; nothing
  // is registered. An index out of range fails at execution, and the read reports it.
  EXPECT_NAMES(error_of(s->unfold(a, 1, 2, 0)), "Unfold: step must be at least 1");
  EXPECT_NAMES(error_of(s->unfold(a, 2, 2, 1)), "Unfold: dim 2 out of bounds");
  EXPECT_NAMES(error_of(s->scatter_nd(a, cells, f32({1, 2, 3}, {3}), ir::IndexingUpdate::Add)),
               "scatter_nd: values [3] must have shape [2]");
  EXPECT_NAMES(error_of(s->scatter_nd(a, f32({0, 0}, {1, 2}), v, ir::IndexingUpdate::Add)), "ScatterNd");
  EXPECT_EQ(kinds_of([&] { (void)s->scatter_nd(a, cells, f32({1, 2, 3}, {3}), ir::IndexingUpdate::Add); }), Kinds{});
  Tensor oob = ok(s->scatter_nd(a, i64({0, 3}, {1, 2}), v, ir::IndexingUpdate::Add));
  Result<std::vector<float>> read = s->to_host<float>(std::move(oob));
  ASSERT_FALSE(read.ok());
  EXPECT_NAMES(read.error().to_string(), "out of range");
}

TEST_F(ApiOps, CrossProduct) {
  // x × y = z, and (1, 2, 3) × (4, 5, 6) = (−3, 6, −3); the rhs row broadcasts.
  Tensor a = f32({1, 0, 0, 1, 2, 3}, {2, 3});
  expect_near(get(s->cross(a, f32({0, 1, 0, 4, 5, 6}, {2, 3}), 1), {2, 3}), {0, 0, 1, -3, 6, -3});
  expect_near(get(s->cross(a, f32({0, 0, 1}, {1, 3}), 1), {2, 3}), {0, -1, 0, 2, -1, 0});
  // Along dim 0 the columns are the vectors.
  expect_near(get(s->cross(f32({1, 1, 0, 2, 0, 3}, {3, 2}), f32({0, 4, 1, 5, 0, 6}, {3, 2}), 0), {3, 2}),
              {0, -3, 0, 6, 1, -3});
  Tensor b = f32({0, 1, 0}, {1, 3});
  EXPECT_EQ(kinds_of([&] { ok(s->cross(a, b, 1)); }), (Kinds{"Float::Cross"}));
  // Errors: a dim without 3-vectors, a bad dim, integer operands.
  EXPECT_NAMES(error_of(s->cross(a, b, 0)), "Cross: dim 0 must have size 3 in both operands");
  EXPECT_NAMES(error_of(s->cross(a, b, 2)), "Cross: dim 2 out of bounds");
  EXPECT_NAMES(error_of(s->cross(i64({1, 2, 3}, {3}), i64({4, 5, 6}, {3}), 0)), "Cross");
  EXPECT_EQ(kinds_of([&] { (void)s->cross(a, b, 0); }), Kinds{});
}

TEST_F(ApiOps, Pad) {
  Tensor x = f32({1, 2, 3, 4}, {2, 2});
  // Constant 9: one row before, two columns after.
  expect_near(get(s->pad(x, {{1, 0}, {0, 2}}, ir::PadMode::Constant, 9), {3, 4}), {9, 9, 9, 9, 1, 2, 9, 9, 3, 4, 9, 9});
  // The last dim only: reflect (without the edge) and edge (repeated).
  expect_near(get(s->pad(x, {{1, 1}}, ir::PadMode::Reflect), {2, 4}), {2, 1, 2, 1, 4, 3, 4, 3});
  expect_near(get(s->pad(x, {{0, 2}}, ir::PadMode::Edge), {2, 4}), {1, 2, 2, 2, 3, 4, 4, 4});
  expect_near(get(s->pad(x, {}), {2, 2}), {1, 2, 3, 4});
  EXPECT_EQ(get_i64(s->pad(i64({5, 6}, {2}), {{1, 1}}, ir::PadMode::Constant, -1), {4}),
            (std::vector<std::int64_t>{-1, 5, 6, -1}));
  EXPECT_EQ(kinds_of([&] { ok(s->pad(x, {{1, 1}})); }), (Kinds{"NumericFloat::Pad"}));
  // Errors: reflecting more than size − 1, more pairs than dims, a bool tensor.
  EXPECT_NAMES(error_of(s->pad(x, {{2, 0}}, ir::PadMode::Reflect)), "Pad");
  EXPECT_NAMES(error_of(s->pad(x, {{1, 1}, {1, 1}, {1, 1}})), "Pad");
  EXPECT_NAMES(error_of(s->pad(bools({true}, {1}), {{1, 1}})), "Pad");
}

// ---- Module ops

// Conv2d in double: x [N, C, H, W], w [O, C, kh, kw] (groups 1), zero padding.
std::vector<double> conv2d_ref(const std::vector<float>& x, Shape xs, const std::vector<float>& w, Shape ws,
                               const std::vector<float>& bias, std::uint64_t stride, std::uint64_t pad) {
  const auto oh = (xs[2] + 2 * pad - ws[2]) / stride + 1, ow = (xs[3] + 2 * pad - ws[3]) / stride + 1;
  std::vector<double> out;
  for (std::uint64_t n = 0; n < xs[0]; ++n)
    for (std::uint64_t o = 0; o < ws[0]; ++o)
      for (std::uint64_t i = 0; i < oh; ++i)
        for (std::uint64_t j = 0; j < ow; ++j) {
          double acc = bias.empty() ? 0.0 : bias[o];
          for (std::uint64_t c = 0; c < xs[1]; ++c)
            for (std::uint64_t ki = 0; ki < ws[2]; ++ki)
              for (std::uint64_t kj = 0; kj < ws[3]; ++kj) {
                const auto h = static_cast<std::int64_t>(i * stride + ki) - static_cast<std::int64_t>(pad);
                const auto v = static_cast<std::int64_t>(j * stride + kj) - static_cast<std::int64_t>(pad);
                if (h < 0 || v < 0 || h >= static_cast<std::int64_t>(xs[2]) || v >= static_cast<std::int64_t>(xs[3]))
                  continue;
                acc += double(x[((n * xs[1] + c) * xs[2] + h) * xs[3] + v]) *
                       w[((o * ws[1] + c) * ws[2] + ki) * ws[3] + kj];
              }
          out.push_back(acc);
        }
  return out;
}

TEST_F(ApiOps, Conv2dAndConvTranspose1d) {
  const std::vector<float> xv{1, 2, 3, 4, 5, 6, 7, 8, 9};            // [1, 1, 3, 3]
  const std::vector<float> wv{1, 0, 0, -1, 0.5f, 0.5f, 0.5f, 0.5f};  // [2, 1, 2, 2]
  const std::vector<float> bv{0.5f, -1};
  Tensor x = f32(xv, {1, 1, 3, 3}), w = f32(wv, {2, 1, 2, 2}), b = f32(bv, {2});
  expect_near(get(s->conv2d(x, w, b), {1, 2, 2, 2}), conv2d_ref(xv, {1, 1, 3, 3}, wv, {2, 1, 2, 2}, bv, 1, 0));
  expect_near(get(s->conv2d(x, w), {1, 2, 2, 2}), conv2d_ref(xv, {1, 1, 3, 3}, wv, {2, 1, 2, 2}, {}, 1, 0));
  ir::build::Conv2dOptions strided;
  strided.stride = {2, 2};
  strided.padding = {1, 1};
  expect_near(get(s->conv2d(x, w, b, strided), {1, 2, 2, 2}), conv2d_ref(xv, {1, 1, 3, 3}, wv, {2, 1, 2, 2}, bv, 2, 1));
  // ConvTranspose1d: x [1, 2, 3], w [2, 1, 2] → [1, 1, L'], each input scattering into
  // out[l * stride + k] (no padding, dilation 1).
  const std::vector<float> tx{1, 2, 3, -1, 0.5f, 2}, tw{1, -1, 2, 0.5f};
  ir::build::ConvTranspose1dOptions topt;
  topt.stride = 2;
  const std::uint64_t length = (3 - 1) * 2 + (2 - 1) + 1;
  std::vector<double> want(length, 0.25);  // the bias
  for (int c = 0; c < 2; ++c)
    for (int l = 0; l < 3; ++l)
      for (int k = 0; k < 2; ++k) want[l * 2 + k] += double(tx[c * 3 + l]) * tw[c * 2 + k];
  expect_near(get(s->conv_transpose1d(f32(tx, {1, 2, 3}), f32(tw, {2, 1, 2}), f32({0.25f}, {1}), topt), {1, 1, length}),
              want);
  EXPECT_EQ(kinds_of([&] { ok(s->conv2d(x, w, b)); }), (Kinds{"Module::Conv2d"}));
  Tensor t = f32(tx, {1, 2, 3}), tk = f32(tw, {2, 1, 2});
  EXPECT_EQ(kinds_of([&] { ok(s->conv_transpose1d(t, tk)); }), (Kinds{"Module::ConvTranspose1d"}));
  // Errors: rank, channels, bias shape, dtype, groups 0, and a transposed channel mismatch.
  EXPECT_NAMES(error_of(s->conv2d(f32(xv, {1, 3, 3}), w)), "Conv2d");
  EXPECT_NAMES(error_of(s->conv2d(f32({1, 2}, {1, 2, 1, 1}), w)), "Conv2d");
  EXPECT_NAMES(error_of(s->conv2d(x, w, f32({1, 2, 3}, {3}))), "Conv2d");
  EXPECT_NAMES(error_of(s->conv2d(i64({1}, {1, 1, 1, 1}), i64({1}, {1, 1, 1, 1}))), "Conv2d");
  ir::build::Conv2dOptions no_groups;
  no_groups.groups = 0;
  EXPECT_NAMES(error_of(s->conv2d(x, w, std::nullopt, no_groups)), "Conv2d");
  EXPECT_NAMES(error_of(s->conv_transpose1d(t, f32(tw, {1, 2, 2}))), "ConvTranspose1d");
}

// Conv1d / Conv3d / ConvTranspose2d / ConvTranspose3d (docs/spec/ir.md §5.8; no §5.11 row): the
// Module kind of the call's name. Values by hand (reference_conv_test.cc has the derivations).
TEST_F(ApiOps, Conv1dConv3dConvTranspose2dAndConvTranspose3d) {
  Tensor x1 = f32({1, 2, 3, 4, 5}, {1, 1, 5}), w1 = f32({1, 10}, {1, 1, 2}), b1 = f32({0.5f}, {1});
  ir::build::Conv1dOptions o1;
  o1.stride = 2;
  o1.padding = 1;  // [0, 1, 2, 3, 4, 5, 0] at 0, 2, 4
  expect_near(get(s->conv1d(x1, w1, b1, o1), {1, 1, 3}), {10.5, 32.5, 54.5});
  expect_near(get(s->conv1d(x1, w1), {1, 1, 4}), {21, 32, 43, 54});
  ir::build::Conv1dOptions depthwise;
  depthwise.groups = 2;
  Tensor x2 = f32({1, 2, 3, 4, 5, 6}, {1, 2, 3});
  expect_near(get(s->conv1d(x2, f32({1, 1, 1, -1}, {2, 1, 2}), std::nullopt, depthwise), {1, 2, 2}), {3, 5, -1, -1});
  // Conv3d over 1..8 with an all-ones [2, 2, 2] kernel, padded and strided along the last dim.
  Tensor x3 = f32({1, 2, 3, 4, 5, 6, 7, 8}, {1, 1, 2, 2, 2}), ones = f32(std::vector<float>(8, 1), {1, 1, 2, 2, 2});
  ir::build::Conv3dOptions o3;
  o3.stride = {1, 1, 2};
  o3.padding = {0, 0, 1};
  expect_near(get(s->conv3d(x3, ones, std::nullopt, o3), {1, 1, 1, 1, 2}), {16, 20});
  expect_near(get(s->conv3d(x3, ones), {1, 1, 1, 1, 1}), {36});
  // ConvTranspose2d, stride 2: each input scatters its 2 × 2 block; padding 1 keeps the centre.
  Tensor tx = f32({1, 2, 3, 4}, {1, 1, 2, 2}), tw = f32({1, 10, 100, 1000}, {1, 1, 2, 2});
  ir::build::ConvTranspose2dOptions t2;
  t2.stride = {2, 2};
  t2.padding = {1, 1};
  expect_near(get(s->conv_transpose2d(tx, tw, std::nullopt, t2), {1, 1, 2, 2}), {1000, 200, 30, 4});
  t2.padding = {0, 0};
  t2.padding_out = {1, 0};  // a last row no input reaches: the bias
  const std::vector<double> t2_out = get(s->conv_transpose2d(tx, tw, f32({-1}, {1}), t2), {1, 1, 5, 4});
  expect_near(std::vector<double>(t2_out.end() - 4, t2_out.end()), {-1, -1, -1, -1});
  expect_near(std::vector<double>(t2_out.begin(), t2_out.begin() + 4), {0, 9, 1, 19});
  Tensor t3x = f32({1, 2}, {1, 1, 1, 1, 2}), t3w = f32({1, 10}, {1, 1, 1, 1, 2});
  expect_near(get(s->conv_transpose3d(t3x, t3w), {1, 1, 1, 1, 3}), {1, 12, 20});
  EXPECT_EQ(kinds_of([&] { ok(s->conv1d(x1, w1, b1)); }), (Kinds{"Module::Conv1d"}));
  EXPECT_EQ(kinds_of([&] { ok(s->conv3d(x3, ones)); }), (Kinds{"Module::Conv3d"}));
  EXPECT_EQ(kinds_of([&] { ok(s->conv_transpose2d(tx, tw)); }), (Kinds{"Module::ConvTranspose2d"}));
  EXPECT_EQ(kinds_of([&] { ok(s->conv_transpose3d(t3x, t3w)); }), (Kinds{"Module::ConvTranspose3d"}));
  // Errors: rank, groups, padding_out >= max(stride, dilation), integers, a kernel wider than the
  // padded input; nothing is registered.
  EXPECT_NAMES(error_of(s->conv1d(x3, w1)), "Conv1d: x must have rank 3");
  ir::build::Conv3dOptions three_groups;
  three_groups.groups = 3;
  EXPECT_NAMES(error_of(s->conv3d(x3, ones, std::nullopt, three_groups)), "Conv3d: x");
  ir::build::ConvTranspose2dOptions too_far;
  too_far.padding_out = {1, 0};  // stride 1, dilation 1
  EXPECT_NAMES(error_of(s->conv_transpose2d(tx, tw, std::nullopt, too_far)), "ConvTranspose2d: padding_out 1");
  EXPECT_NAMES(error_of(s->conv_transpose3d(i64({1, 2}, {1, 1, 1, 1, 2}), i64({1, 10}, {1, 1, 1, 1, 2}))),
               "ConvTranspose3d");
  EXPECT_NAMES(error_of(s->conv1d(x1, f32(std::vector<float>(6, 1), {1, 1, 6}))), "Conv1d");
  EXPECT_EQ(kinds_of([&] { (void)s->conv1d(x3, w1); }), Kinds{});
}

// The gradients, each the Module kind of its name: x = [1, 2, 3], w = [1, 10], output_grad
// [1, 2] give the X gradient [1, 12, 20], the weight gradient [5, 8] and the bias gradient [3]
// in every rank (unit dims change nothing); the transposed x = [1, 2] with output_grad
// [1, 10, 100] gives the weight gradient [21, 210] and the bias gradient [111].
TEST_F(ApiOps, ConvolutionGradients) {
  auto shaped = [](std::size_t rank, std::uint64_t last) {
    Shape shape(rank + 2, 1);
    shape.back() = last;
    return shape;
  };
  auto check = [&](const auto& c) {
    SCOPED_TRACE(c.rank);
    Session& ss = *s;
    const std::string conv = "Module::Conv" + std::to_string(c.rank) + "d";
    const std::string transposed = "Module::ConvTranspose" + std::to_string(c.rank) + "d";
    Tensor x = f32({1, 2, 3}, shaped(c.rank, 3)), w = f32({1, 10}, shaped(c.rank, 2));
    Tensor g = f32({1, 2}, shaped(c.rank, 2)), bias = f32({0}, {1});
    Tensor tx = f32({1, 2}, shaped(c.rank, 2)), tg = f32({1, 10, 100}, shaped(c.rank, 3));
    expect_near(get((ss.*c.x_grad)(x, w, g, {}), shaped(c.rank, 3)), {1, 12, 20});
    expect_near(get((ss.*c.weight_grad)(x, w, g, {}), shaped(c.rank, 2)), {5, 8});
    expect_near(get((ss.*c.bias_grad)(x, bias, g), {1}), {3});
    expect_near(get((ss.*c.weight_grad_t)(tx, w, tg, {}), shaped(c.rank, 2)), {21, 210});
    expect_near(get((ss.*c.bias_grad_t)(tx, bias, tg), {1}), {111});
    EXPECT_EQ(kinds_of([&] { ok((ss.*c.x_grad)(x, w, g, {})); }), (Kinds{conv + "XBackward"}));
    EXPECT_EQ(kinds_of([&] { ok((ss.*c.weight_grad)(x, w, g, {})); }), (Kinds{conv + "WeightBackward"}));
    EXPECT_EQ(kinds_of([&] { ok((ss.*c.bias_grad)(x, bias, g)); }), (Kinds{conv + "BiasBackward"}));
    EXPECT_EQ(kinds_of([&] { ok((ss.*c.weight_grad_t)(tx, w, tg, {})); }), (Kinds{transposed + "WeightBackward"}));
    EXPECT_EQ(kinds_of([&] { ok((ss.*c.bias_grad_t)(tx, bias, tg)); }), (Kinds{transposed + "BiasBackward"}));
  };
  check(kConv1dCalls);
  check(kConv2dCalls);
  check(kConv3dCalls);
  // The transposed X gradient the spec leaves out is conv1d(output_grad, weight) with the same
  // options: Σ_k g[l + k] w[k] = [1 + 100, 10 + 1000].
  expect_near(get(s->conv1d(f32({1, 10, 100}, {1, 1, 3}), f32({1, 10}, {1, 1, 2})), {1, 1, 2}), {101, 1010});
  // Errors name the kind and what is wrong; nothing is registered.
  Tensor x = f32({1, 2, 3}, {1, 1, 3}), w = f32({1, 10}, {1, 1, 2}), g = f32({1, 2}, {1, 1, 2});
  EXPECT_NAMES(error_of(s->conv1d_weight_backward(x, w, f32({1, 2, 3}, {1, 1, 3}))),
               "Conv1dWeightBackward: output_grad");
  EXPECT_NAMES(
      error_of(s->conv2d_bias_backward(f32({1, 2, 3}, {1, 1, 1, 3}), f32({0, 0}, {2}), f32({1, 2}, {1, 1, 1, 2}))),
      "Conv2dBiasBackward: bias");
  EXPECT_NAMES(error_of(s->conv_transpose1d_weight_backward(x, w, i64({1, 2, 3, 4}, {1, 1, 4}))),
               "ConvTranspose1dWeightBackward");
  EXPECT_NAMES(error_of(s->conv3d_x_backward(x, w, g)), "Conv3dXBackward: x must have rank 5");
  EXPECT_EQ(kinds_of([&] { (void)s->conv3d_x_backward(x, w, g); }), Kinds{});
}

TEST_F(ApiOps, Pools) {
  std::vector<float> xv(16);
  for (int i = 0; i < 16; ++i) xv[i] = static_cast<float>((i * 7) % 11) - 4;  // [1, 1, 4, 4], unordered
  Tensor x = f32(xv, {1, 1, 4, 4});
  // Windows of k with stride st and padding p (padding never chosen by max; avg divisor: the
  // window clipped to the padded input when count_include_pad, else to the input).
  auto pool = [&](std::uint64_t k, std::uint64_t st, std::uint64_t p, bool is_max, bool include_pad) {
    const std::int64_t out = static_cast<std::int64_t>((4 + 2 * p - k) / st + 1);
    std::vector<double> r;
    for (std::int64_t i = 0; i < out; ++i)
      for (std::int64_t j = 0; j < out; ++j) {
        double best = -1e300, sum = 0;
        std::int64_t inside = 0;
        const std::int64_t h0 = i * static_cast<std::int64_t>(st) - static_cast<std::int64_t>(p);
        const std::int64_t w0 = j * static_cast<std::int64_t>(st) - static_cast<std::int64_t>(p);
        for (std::int64_t h = h0; h < h0 + static_cast<std::int64_t>(k); ++h)
          for (std::int64_t w = w0; w < w0 + static_cast<std::int64_t>(k); ++w) {
            if (h < 0 || w < 0 || h >= 4 || w >= 4) continue;
            best = std::max(best, double(xv[h * 4 + w])), sum += xv[h * 4 + w], ++inside;
          }
        r.push_back(is_max ? best : sum / (include_pad ? double(k * k) : double(inside)));
      }
    return r;
  };
  ir::build::MaxPool2dOptions mp;
  mp.kernel = {2, 2};
  mp.stride = {2, 2};
  expect_near(get(s->max_pool2d(x, mp), {1, 1, 2, 2}), pool(2, 2, 0, true, false));
  mp.padding = {1, 1};
  expect_near(get(s->max_pool2d(x, mp), {1, 1, 3, 3}), pool(2, 2, 1, true, false));
  ir::build::AvgPool2dOptions ap;
  ap.kernel = {2, 2};
  ap.stride = {2, 2};
  expect_near(get(s->avg_pool2d(x, ap), {1, 1, 2, 2}), pool(2, 2, 0, false, true));
  ap.padding = {1, 1};
  expect_near(get(s->avg_pool2d(x, ap), {1, 1, 3, 3}), pool(2, 2, 1, false, true));
  ap.count_include_pad = false;
  expect_near(get(s->avg_pool2d(x, ap), {1, 1, 3, 3}), pool(2, 2, 1, false, false));
  EXPECT_EQ(kinds_of([&] { ok(s->max_pool2d(x, mp)); }), (Kinds{"Module::MaxPool2d"}));
  EXPECT_EQ(kinds_of([&] { ok(s->avg_pool2d(x, ap)); }), (Kinds{"Module::AvgPool2d"}));
  // Errors: rank 3, an integer tensor, a kernel larger than the padded input.
  EXPECT_NAMES(error_of(s->max_pool2d(f32(xv, {1, 4, 4}), mp)), "MaxPool2d");
  EXPECT_NAMES(error_of(s->avg_pool2d(i64({1}, {1, 1, 1, 1}), ap)), "AvgPool2d");
  ir::build::MaxPool2dOptions huge;
  huge.kernel = {9, 9};
  EXPECT_NAMES(error_of(s->max_pool2d(x, huge)), "MaxPool2d");
}

TEST_F(ApiOps, EmbeddingIsReshapeSelectReshape) {
  std::vector<float> wv(12);
  for (int i = 0; i < 12; ++i) wv[i] = 0.5f * static_cast<float>(i) - 1;  // [4, 3]
  const std::vector<std::int64_t> iv{3, 0, 1, 3};                         // [2, 2]
  Tensor w = f32(wv, {4, 3}), idx = i64(iv, {2, 2});
  std::vector<double> want;
  for (std::int64_t row : iv)
    for (int e = 0; e < 3; ++e) want.push_back(wv[row * 3 + e]);
  expect_near(get(s->embedding(w, idx), {2, 2, 3}), want);
  Tensor narrow = ok(s->from_host(std::vector<std::int32_t>{2, 2, 0}, {1, 3}));
  expect_near(get(s->embedding(w, narrow), {1, 3, 3}), {wv[6], wv[7], wv[8], wv[6], wv[7], wv[8], wv[0], wv[1], wv[2]});
  // docs/spec/ir.md §5.11: never Module Embedding.
  EXPECT_EQ(kinds_of([&] { ok(s->embedding(w, idx)); }),
            (Kinds{"BaseInt::Reshape", "BaseFloat::Select", "BaseFloat::Reshape"}));
  // Errors (before any IR): indices of rank 1, integer weights, float indices.
  EXPECT_NAMES(error_of(s->embedding(w, i64({1, 2}, {2}))), "embedding");
  EXPECT_NAMES(error_of(s->embedding(i64({1, 2}, {1, 2}), idx)), "embedding");
  EXPECT_NAMES(error_of(s->embedding(w, f32({0, 1}, {1, 2}))), "embedding");
  Tensor flat = i64({1}, {1});
  EXPECT_EQ(kinds_of([&] { (void)s->embedding(w, flat); }), Kinds{});
}

// ---- Dense layers, norms, the embedding's gradient (docs/spec/ir.md §5.8; no §5.11 row: each
// call emits the Module kind of its name)

TEST_F(ApiOps, LinearOverRank1To3AndItsBackwards) {
  const std::vector<float> wv{1, -2, 0.5f, 3, -1, 2};  // [d_in, d_out] = [3, 2]
  Tensor w = f32(wv, {3, 2}), bias = f32({0.25f, -4}, {2});
  // [1, 2, 3] · w + bias = [1 + 1 − 3 + 0.25, −2 + 6 + 6 − 4]; the second row below, [−1, 0, 4] · w.
  expect_near(get(s->linear(f32({1, 2, 3}, {3}), w, bias), {2}), {-0.75, 6});
  Tensor x = f32({1, 2, 3, -1, 0, 4}, {2, 3});
  expect_near(get(s->linear(x, w), {2, 2}), {-1, 10, -5, 10});
  std::vector<float> x3(12);
  for (int i = 0; i < 12; ++i) x3[i] = 0.5f * static_cast<float>(i - 5);
  std::vector<double> want;  // every leading dim is a row
  for (int r = 0; r < 4; ++r)
    for (int j = 0; j < 2; ++j) {
      double acc = j == 0 ? 0.25 : -4;
      for (int i = 0; i < 3; ++i) acc += double(x3[r * 3 + i]) * wv[i * 2 + j];
      want.push_back(acc);
    }
  expect_near(get(s->linear(f32(x3, {2, 2, 3}), w, bias), {2, 2, 2}), want);
  // The gradients for output_grad g = [[1, 2], [−1, 0.5]], by hand: g · wᵀ, xᵀ · g, column sums of g.
  Tensor g = f32({1, 2, -1, 0.5f}, {2, 2});
  expect_near(get(s->linear_x_backward(w, g), {2, 3}), {-3, 6.5, 3, -2, 1, 2});
  expect_near(get(s->linear_weight_backward(x, g), {3, 2}), {2, 1.5, 2, 4, -1, 8});
  expect_near(get(s->linear_bias_backward(g), {2}), {0, 2.5});
  EXPECT_EQ(kinds_of([&] { ok(s->linear(x, w, bias)); }), (Kinds{"Module::Linear"}));
  EXPECT_EQ(kinds_of([&] { ok(s->linear(x, w)); }), (Kinds{"Module::Linear"}));
  EXPECT_EQ(kinds_of([&] { ok(s->linear_x_backward(w, g)); }), (Kinds{"Module::LinearXBackward"}));
  EXPECT_EQ(kinds_of([&] { ok(s->linear_weight_backward(x, g)); }), (Kinds{"Module::LinearWeightBackward"}));
  EXPECT_EQ(kinds_of([&] { ok(s->linear_bias_backward(g)); }), (Kinds{"Module::LinearBiasBackward"}));
  // Errors name the op and the shapes: a [d_out, d_in] weight, a bias of d_in, integers, mismatches.
  Tensor wt = f32(wv, {2, 3});
  EXPECT_NAMES(error_of(s->linear(x, wt)), "Linear: x [2,3] has 3 features, weight [2,3]");
  EXPECT_NAMES(error_of(s->linear(x, w, f32({1, 2, 3}, {3}))), "Linear: bias");
  EXPECT_NAMES(error_of(s->linear(i64({1, 2, 3}, {3}), w)), "Linear");
  EXPECT_NAMES(error_of(s->linear_x_backward(w, f32({1, 2, 3}, {1, 3}))), "LinearXBackward");
  EXPECT_NAMES(error_of(s->linear_weight_backward(x, f32(wv, {3, 2}))), "LinearWeightBackward");
  EXPECT_NAMES(error_of(s->linear_bias_backward(i64({1}, {1}))), "LinearBiasBackward");
  EXPECT_EQ(kinds_of([&] { (void)s->linear(x, wt); }), Kinds{});
}

TEST_F(ApiOps, LayerNormAndBatchNorm) {
  const std::vector<float> xv{1, 2, 4, -1, 0.5f, 3}, gv{1, 2, 0.5f}, bv{0.1f, -0.2f, 0.3f};
  Tensor x = f32(xv, {2, 3}), gamma = f32(gv, {3}), beta = f32(bv, {3});
  // Per row: (x − mean) / sqrt(var + eps) · gamma + beta, var the biased variance.
  auto by_hand = [&](bool with_beta, double eps) {
    std::vector<double> r;
    for (int row = 0; row < 2; ++row) {
      double mean = 0, var = 0;
      for (int i = 0; i < 3; ++i) mean += double(xv[row * 3 + i]) / 3;
      for (int i = 0; i < 3; ++i) var += (xv[row * 3 + i] - mean) * (xv[row * 3 + i] - mean) / 3;
      for (int i = 0; i < 3; ++i)
        r.push_back((xv[row * 3 + i] - mean) / std::sqrt(var + eps) * gv[i] + (with_beta ? double(bv[i]) : 0.0));
    }
    return r;
  };
  expect_near(get(s->layer_norm(x, gamma, beta), {2, 3}), by_hand(true, 1e-5));
  expect_near(get(s->layer_norm(x, gamma), {2, 3}), by_hand(false, 1e-5));
  expect_near(get(s->layer_norm(x, gamma, beta, 0.5), {2, 3}), by_hand(true, 0.5));
  // BatchNorm over dim 1 of [N, C, L] = [2, 2, 2]: channel 0 (x − 1) / 2 · 3 + 1, channel 1
  // (x + 1) / 1 · −1 + 0 (variances 4 and 1, epsilon 0).
  Tensor xb = f32({1, 3, 0, 2, 5, -1, -1, 1}, {2, 2, 2});
  Tensor bg = f32({3, -1}, {2}), bb = f32({1, 0}, {2}), bm = f32({1, -1}, {2}), bvar = f32({4, 1}, {2});
  expect_near(get(s->batch_norm(xb, bg, bb, bm, bvar, 0.0), {2, 2, 2}), {1, 4, -1, -3, 7, -2, 0, -2});
  expect_near(get(s->batch_norm(f32({3, 0}, {1, 2}), bg, bb, bm, bvar, 0.0), {1, 2}), {4, -1});
  EXPECT_EQ(kinds_of([&] { ok(s->layer_norm(x, gamma, beta)); }), (Kinds{"Module::LayerNorm"}));
  EXPECT_EQ(kinds_of([&] { ok(s->layer_norm(x, gamma)); }), (Kinds{"Module::LayerNorm"}));
  // With its row statistics: one LayerNorm of three outputs, the same normalised values.
  LayerNormWithStats ln = ok(s->layer_norm_with_stats(x, gamma, beta));
  expect_near(get(std::move(ln.out), {2, 3}), by_hand(true, 1e-5));
  std::vector<double> means, rstds;
  for (int row = 0; row < 2; ++row) {
    double mean = 0, var = 0;
    for (int i = 0; i < 3; ++i) mean += double(xv[row * 3 + i]) / 3;
    for (int i = 0; i < 3; ++i) var += (xv[row * 3 + i] - mean) * (xv[row * 3 + i] - mean) / 3;
    means.push_back(mean), rstds.push_back(1 / std::sqrt(var + 1e-5));
  }
  expect_near(get(std::move(ln.mean), {2, 1}), means);
  expect_near(get(std::move(ln.rstd), {2, 1}), rstds);
  EXPECT_EQ(kinds_of([&] { ok(s->layer_norm_with_stats(x, gamma)); }), (Kinds{"Module::LayerNorm"}));
  EXPECT_EQ(kinds_of([&] { ok(s->batch_norm(xb, bg, bb, bm, bvar)); }), (Kinds{"Module::BatchNorm"}));
  // Errors: gamma of the wrong length, a negative epsilon, running statistics of the wrong
  // length, an x without a channel dim; nothing is registered.
  EXPECT_NAMES(error_of(s->layer_norm(x, bg)), "LayerNorm: gamma");
  EXPECT_NAMES(error_of(s->layer_norm(x, gamma, beta, -1)), "LayerNorm: epsilon");
  EXPECT_NAMES(error_of(s->batch_norm(xb, bg, bb, gamma, bvar)), "BatchNorm: mean");
  EXPECT_NAMES(error_of(s->batch_norm(f32({1, 2}, {2}), bg, bb, bm, bvar)), "BatchNorm");
  EXPECT_EQ(kinds_of([&] { (void)s->layer_norm(x, bg); }), Kinds{});
}

TEST_F(ApiOps, EmbeddingBackwardAccumulatesDuplicateIndices) {
  Tensor w = f32({0, 1, 2, 3, 4, 5, 6, 7}, {4, 2});
  Tensor g = f32({1, 2, 10, 20, 100, 200}, {1, 3, 2});
  Tensor idx = i64({2, 0, 2}, {1, 3});
  // Rows 2 (twice) and 0 of the gradient; rows 1 and 3 get nothing.
  expect_near(get(s->embedding_backward(w, g, idx), {4, 2}), {10, 20, 0, 0, 101, 202, 0, 0});
  EXPECT_EQ(kinds_of([&] { ok(s->embedding_backward(w, g, idx)); }), (Kinds{"Module::EmbeddingBackward"}));
  // An index out of range passes the builder (it sees shapes only) and fails at execution: the
  // read reports it.
  Tensor far = ok(s->embedding_backward(w, g, i64({2, 4, 0}, {1, 3})));
  EXPECT_FALSE(s->to_host<float>(std::move(far)).ok());
  // Builder errors: out_grad not [B, S, E], float indices.
  EXPECT_NAMES(error_of(s->embedding_backward(w, f32({1, 2, 3}, {1, 3, 1}), idx)), "EmbeddingBackward: out_grad");
  EXPECT_NAMES(error_of(s->embedding_backward(w, g, f32({2, 0, 2}, {1, 3}))), "EmbeddingBackward");
  EXPECT_EQ(kinds_of([&] { (void)s->embedding_backward(w, g, f32({0, 0, 0}, {1, 3})); }), Kinds{});
}

// ---- Pools beyond max_pool2d / avg_pool2d and the pools' gradients (docs/spec/ir.md §5.8; no §5.11
// row: each call emits the Module kind of its name)

TEST_F(ApiOps, MaxPool1dAndTheWithIndicesPools) {
  using O1 = ir::build::MaxPool1dOptions;
  Tensor x = f32({1, 3, 2, 5, 4}, {1, 1, 5});
  expect_near(get(s->max_pool1d(x, O1{2, 2, 0, 1, false}), {1, 1, 2}), {3, 5});
  expect_near(get(s->max_pool1d(x, O1{3, 2, 1, 1, false}), {1, 1, 3}), {3, 5, 5});  // padding never wins
  expect_near(get(s->max_pool1d(x, O1{2, 2, 0, 1, true}), {1, 1, 3}), {3, 5, 4});   // ceil mode
  expect_near(get(s->max_pool1d(x, O1{2, 1, 0, 2, false}), {1, 1, 3}), {2, 5, 4});  // dilation 2
  // Indices flat within the plane, kIndexDType; overlapping windows may pick one element twice,
  // ties keep the first.
  auto [v, i] = ok(s->max_pool1d_with_indices(x, O1{3, 1, 0, 1, false}));
  EXPECT_EQ(i.dtype(), Session::kIndexDType);
  expect_near(get(std::move(v), {1, 1, 3}), {3, 5, 5});
  EXPECT_EQ(get_i64(std::move(i), {1, 1, 3}), (std::vector<std::int64_t>{1, 3, 3}));
  auto [tv, ti] = ok(s->max_pool1d_with_indices(f32({2, 2, 1, 7, 7, 7}, {1, 1, 6}), O1{3, 3, 0, 1, false}));
  expect_near(get(std::move(tv), {1, 1, 2}), {2, 7});
  EXPECT_EQ(get_i64(std::move(ti), {1, 1, 2}), (std::vector<std::int64_t>{0, 3}));
  std::vector<float> v12(12);
  for (int k = 0; k < 12; ++k) v12[k] = static_cast<float>(k + 1);
  Tensor x2 = f32(v12, {1, 1, 3, 4});
  ir::build::MaxPool2dOptions o2;
  o2.kernel = {2, 2};
  o2.stride = {2, 2};
  o2.padding = {1, 1};
  auto [v2, i2] = ok(s->max_pool2d_with_indices(x2, o2));
  expect_near(get(std::move(v2), {1, 1, 2, 3}), {1, 3, 4, 9, 11, 12});
  EXPECT_EQ(get_i64(std::move(i2), {1, 1, 2, 3}), (std::vector<std::int64_t>{0, 2, 3, 8, 10, 11}));
  EXPECT_EQ(kinds_of([&] { ok(s->max_pool1d(x, O1{2, 2, 0, 1, false})); }), (Kinds{"Module::MaxPool1d"}));
  EXPECT_EQ(kinds_of([&] {
              ok(s->max_pool1d_with_indices(x, O1{2, 2, 0, 1, false}));
            }),
            (Kinds{"Module::MaxPool1dWithIndices"}));
  EXPECT_EQ(kinds_of([&] { ok(s->max_pool2d_with_indices(x2, o2)); }), (Kinds{"Module::MaxPool2dWithIndices"}));
  // Errors: the rank, padding over half the kernel, kernel 0, an integer x; nothing registered.
  EXPECT_NAMES(error_of(s->max_pool1d(x2, O1{2, 2, 0, 1, false})), "MaxPool1d: x must have rank 3");
  EXPECT_NAMES(error_of(s->max_pool1d(x, O1{3, 1, 2, 1, false})),
               "MaxPool1d: padding 2 exceeds half the kernel size 3");
  EXPECT_NAMES(error_of(s->max_pool1d(x, O1{0, 1, 0, 1, false})), "MaxPool1d: pool: kernel size must be at least 1");
  Result<std::pair<Tensor, Tensor>> bad = s->max_pool2d_with_indices(i64({1, 2, 3, 4}, {1, 1, 2, 2}), o2);
  ASSERT_FALSE(bad.ok());
  EXPECT_NAMES(bad.error().to_string(), "MaxPool2dWithIndices");
  EXPECT_EQ(kinds_of([&] { (void)s->max_pool1d(x, O1{3, 1, 2, 1, false}); }), Kinds{});
}

TEST_F(ApiOps, MaxPoolWithIndicesBackwards) {
  using O1 = ir::build::MaxPool1dOptions;
  const O1 o{3, 1, 0, 1, false};
  Tensor x = f32({1, 3, 2, 5, 4}, {1, 1, 5});
  auto [v, i] = ok(s->max_pool1d_with_indices(x, o));
  // Windows choose 1, 3, 3: the gradient at 3 accumulates.
  Tensor grad = f32({1, 10, 100}, {1, 1, 3});
  expect_near(get(s->max_pool1d_with_indices_backward(x, grad, i, o), {1, 1, 5}), {0, 1, 0, 110, 0});
  std::vector<float> v8(8);
  for (int k = 0; k < 8; ++k) v8[k] = static_cast<float>(k + 1);
  Tensor x2 = f32(v8, {1, 2, 2, 2});
  ir::build::MaxPool2dOptions k2;
  k2.kernel = {2, 2};
  auto [v2, i2] = ok(s->max_pool2d_with_indices(x2, k2));
  Tensor g2 = f32({5, 7}, {1, 2, 1, 1});
  expect_near(get(s->max_pool2d_with_indices_backward(x2, g2, i2, k2), {1, 2, 2, 2}), {0, 0, 0, 5, 0, 0, 0, 7});
  EXPECT_EQ(kinds_of([&] { ok(s->max_pool1d_with_indices_backward(x, grad, i, o)); }),
            (Kinds{"Module::MaxPool1dWithIndicesBackward"}));
  EXPECT_EQ(kinds_of([&] { ok(s->max_pool2d_with_indices_backward(x2, g2, i2, k2)); }),
            (Kinds{"Module::MaxPool2dWithIndicesBackward"}));
  // An index outside the plane passes the builder (it sees shapes) and fails at execution.
  Tensor far = ok(s->max_pool1d_with_indices_backward(x, grad, i64({1, 9, 3}, {1, 1, 3}), o));
  EXPECT_FALSE(s->to_host<float>(std::move(far)).ok());
  // Builder errors: grad of another shape, float indices.
  EXPECT_NAMES(error_of(s->max_pool1d_with_indices_backward(x, f32({1, 2}, {1, 1, 2}), i, o)),
               "MaxPool1dWithIndicesBackward: grad");
  EXPECT_NAMES(error_of(s->max_pool1d_with_indices_backward(x, grad, f32({1, 3, 3}, {1, 1, 3}), o)),
               "indices must be an integer dtype");
}

TEST_F(ApiOps, AvgPool1dAndTheAvgPoolBackwards) {
  using A1 = ir::build::AvgPool1dOptions;
  Tensor x = f32({1, 2, 3, 4, 5}, {1, 1, 5});
  expect_near(get(s->avg_pool1d(x, A1{2, 2, 0, true, false}), {1, 1, 2}), {1.5, 3.5});
  // Windows [−1, 1], [1, 3], [3, 5], with and without the padding in the divisor.
  expect_near(get(s->avg_pool1d(x, A1{3, 2, 1, true, false}), {1, 1, 3}), {1, 3, 3});
  expect_near(get(s->avg_pool1d(x, A1{3, 2, 1, false, false}), {1, 1, 3}), {1.5, 3, 4.5});
  // Ceil mode over 1..6: the last window holds x[5] and one padding element.
  Tensor x6 = f32({1, 2, 3, 4, 5, 6}, {1, 1, 6});
  expect_near(get(s->avg_pool1d(x6, A1{3, 2, 1, true, true}), {1, 1, 4}), {1, 3, 5, 3});
  expect_near(get(s->avg_pool1d(x6, A1{3, 2, 1, false, true}), {1, 1, 4}), {1.5, 3, 5, 6});
  // Backwards: each grad element over its divisor, spread over its window.
  expect_near(get(s->avg_pool1d_backward(x, f32({3, 6, 9}, {1, 1, 3}), A1{3, 2, 1, true, false}), {1, 1, 5}),
              {1, 3, 2, 5, 3});
  expect_near(get(s->avg_pool1d_backward(x, f32({2, 6, 4}, {1, 1, 3}), A1{3, 2, 1, false, false}), {1, 1, 5}),
              {1, 3, 2, 4, 2});
  ir::build::AvgPool2dOptions a2;
  a2.kernel = {2, 2};
  a2.stride = {2, 2};
  Tensor x2 = f32({1, 2, 3, 4, 5, 6, 7, 8}, {1, 1, 2, 4});
  Tensor g2 = f32({4, 8}, {1, 1, 1, 2});
  expect_near(get(s->avg_pool2d_backward(x2, g2, a2), {1, 1, 2, 4}), {1, 1, 2, 2, 1, 1, 2, 2});
  EXPECT_EQ(kinds_of([&] { ok(s->avg_pool1d(x, A1{2, 2, 0, true, false})); }), (Kinds{"Module::AvgPool1d"}));
  EXPECT_EQ(kinds_of([&] {
              ok(s->avg_pool1d_backward(x, f32({1, 1}, {1, 1, 2}), A1{2, 2, 0, true, false}));
            }),
            (Kinds{"Module::AvgPool1dBackward"}));
  EXPECT_EQ(kinds_of([&] { ok(s->avg_pool2d_backward(x2, g2, a2)); }), (Kinds{"Module::AvgPool2dBackward"}));
  // Errors: padding over half the kernel, a grad of another shape.
  EXPECT_NAMES(error_of(s->avg_pool1d(x, A1{2, 1, 2, true, false})), "AvgPool1d: padding 2 exceeds");
  EXPECT_NAMES(error_of(s->avg_pool1d_backward(x, f32({1}, {1, 1, 1}), A1{2, 2, 0, true, false})),
               "AvgPool1dBackward: grad");
  EXPECT_EQ(kinds_of([&] { (void)s->avg_pool2d_backward(x2, x2, a2); }), Kinds{});
}

TEST_F(ApiOps, AdaptiveAvgPoolsAndTheirBackwards) {
  std::vector<float> v9(9), v8(8);
  for (int k = 0; k < 9; ++k) v9[k] = static_cast<float>(k + 1);
  for (int k = 0; k < 8; ++k) v8[k] = static_cast<float>(k + 1);
  Tensor x = f32({1, 2, 3, 4, 5}, {1, 1, 5}), x2 = f32(v9, {1, 1, 3, 3}), x3 = f32(v8, {1, 1, 2, 2, 2});
  // 5 → 3: windows [0, 2), [1, 4), [3, 5); 3 × 3 → 2 × 2: [0, 2), [1, 3) per dim.
  expect_near(get(s->adaptive_avg_pool1d(x, 3), {1, 1, 3}), {1.5, 3, 4.5});
  expect_near(get(s->adaptive_avg_pool2d(x2, {2, 2}), {1, 1, 2, 2}), {3, 4, 6, 7});
  expect_near(get(s->adaptive_avg_pool3d(x3, {1, 2, 1}), {1, 1, 1, 2, 1}), {3.5, 5.5});
  expect_near(get(s->adaptive_avg_pool1d_backward(x, f32({2, 3, 4}, {1, 1, 3})), {1, 1, 5}), {1, 2, 1, 3, 2});
  expect_near(get(s->adaptive_avg_pool2d_backward(x2, f32({4, 8, 12, 16}, {1, 1, 2, 2})), {1, 1, 3, 3}),
              {1, 3, 2, 4, 10, 6, 3, 7, 4});
  expect_near(get(s->adaptive_avg_pool3d_backward(x3, f32({8}, {1, 1, 1, 1, 1})), {1, 1, 2, 2, 2}),
              std::vector<double>(8, 1.0));
  EXPECT_EQ(kinds_of([&] { ok(s->adaptive_avg_pool1d(x, 3)); }), (Kinds{"Module::AdaptiveAvgPool1d"}));
  EXPECT_EQ(kinds_of([&] { ok(s->adaptive_avg_pool2d(x2, {2, 2})); }), (Kinds{"Module::AdaptiveAvgPool2d"}));
  EXPECT_EQ(kinds_of([&] { ok(s->adaptive_avg_pool3d(x3, {1, 1, 1})); }), (Kinds{"Module::AdaptiveAvgPool3d"}));
  EXPECT_EQ(kinds_of([&] {
              ok(s->adaptive_avg_pool1d_backward(x, f32({1}, {1, 1, 1})));
            }),
            (Kinds{"Module::AdaptiveAvgPool1dBackward"}));
  EXPECT_EQ(kinds_of([&] {
              ok(s->adaptive_avg_pool2d_backward(x2, f32({1}, {1, 1, 1, 1})));
            }),
            (Kinds{"Module::AdaptiveAvgPool2dBackward"}));
  EXPECT_EQ(kinds_of([&] {
              ok(s->adaptive_avg_pool3d_backward(x3, f32({1}, {1, 1, 1, 1, 1})));
            }),
            (Kinds{"Module::AdaptiveAvgPool3dBackward"}));
  // Errors: an output size of 0, the rank, a grad of other channels.
  EXPECT_NAMES(error_of(s->adaptive_avg_pool1d(x, 0)), "AdaptiveAvgPool1d: output size 0");
  EXPECT_NAMES(error_of(s->adaptive_avg_pool3d(x2, {1, 1, 1})), "AdaptiveAvgPool3d: x must have rank 5");
  EXPECT_NAMES(error_of(s->adaptive_avg_pool2d_backward(x2, f32({1, 2}, {1, 2, 1, 1}))),
               "AdaptiveAvgPool2dBackward: grad");
  EXPECT_EQ(kinds_of([&] { (void)s->adaptive_avg_pool1d(x, 0); }), Kinds{});
}

// ---- Collectives

TEST_F(ApiOps, AllReduceAndSyncCollective) {
  Tensor a = f32({1, -2, 3.5f}, {3});
  // One participant (this device): the sum and the mean of one are the tensor itself.
  expect_near(get(s->all_reduce(a, ir::ReduceOperation::Sum, {}), {3}), {1, -2, 3.5});
  expect_near(get(s->all_reduce(a, ir::ReduceOperation::Mean, {ir::build::DeviceId{0, 0}}), {3}), {1, -2, 3.5});
  EXPECT_EQ(kinds_of([&] { ok(s->all_reduce(a, ir::ReduceOperation::Sum, {})); }), (Kinds{"Distributed::AllReduce"}));
  // sync_collective emits no IR (docs/spec/ir.md §5.11): it drains the current stream.
  Tensor queued = ok(s->mul(a, 2.0));
  EXPECT_EQ(kinds_of([&] { KILN_EXPECT_OK(s->sync_collective()); }), Kinds{});
  expect_near(get(std::move(queued), {3}), {2, -4, 7});
  EXPECT_NAMES(error_of(s->all_reduce(a, static_cast<ir::ReduceOperation>(7), {})), "AllReduce");
}

// The CPU devices reduce over themselves only: a second participant fails at execution, and the
// failure reaches the read.
TEST_F(ApiOps, AllReduceOverOtherDevicesFailsAtExecution) {
  Tensor r = ok(
      s->all_reduce(f32({1}, {1}), ir::ReduceOperation::Sum, {ir::build::DeviceId{0, 0}, ir::build::DeviceId{0, 1}}));
  EXPECT_FALSE(s->to_host<float>(std::move(r)).ok());
}

// Broadcast, AllGather and ReduceScatter (kiln extensions) on a device alone: a world of one
// (the tensor itself, each op emitting its kind); more ranks, or another root, fail at execution
// with a message that says so; a bad dim or an unnamed world fail at the call.
TEST_F(ApiOps, BroadcastAllGatherAndReduceScatterOverAWorldOfOne) {
  Tensor a = f32({1, -2, 3.5f, 4, 5, 6}, {2, 3});
  const std::vector<ir::build::DeviceId> self = {{0, 0}};
  expect_near(get(s->broadcast(a, 0, {}), {2, 3}), {1, -2, 3.5, 4, 5, 6});
  expect_near(get(s->all_gather(a, 1, self), {2, 3}), {1, -2, 3.5, 4, 5, 6});
  expect_near(get(s->reduce_scatter(a, ir::ReduceOperation::Mean, 0, self), {2, 3}), {1, -2, 3.5, 4, 5, 6});
  EXPECT_EQ(kinds_of([&] { ok(s->broadcast(a, 0, self)); }), (Kinds{"Distributed::Broadcast"}));
  EXPECT_EQ(kinds_of([&] { ok(s->all_gather(a, 0, self)); }), (Kinds{"Distributed::AllGather"}));
  EXPECT_EQ(kinds_of([&] { ok(s->reduce_scatter(a, ir::ReduceOperation::Sum, 1, self)); }),
            (Kinds{"Distributed::ReduceScatter"}));
  const std::vector<ir::build::DeviceId> two = {{0, 0}, {0, 1}};
  Result<std::vector<float>> gathered = s->to_host<float>(ok(s->all_gather(a, 0, two)));
  ASSERT_FALSE(gathered.ok());
  EXPECT_NE(gathered.error().message.find("a device alone is a world of one"), std::string::npos)
      << gathered.error().message;
  EXPECT_FALSE(s->to_host<float>(ok(s->broadcast(a, 1, {}))).ok());
  EXPECT_FALSE(s->to_host<float>(ok(s->reduce_scatter(a, ir::ReduceOperation::Sum, 0, two))).ok());
  EXPECT_NAMES(error_of(s->all_gather(a, 2, self)), "AllGather");
  EXPECT_NAMES(error_of(s->all_gather(a, 0, {})), "AllGather");
  EXPECT_NAMES(error_of(s->reduce_scatter(a, ir::ReduceOperation::Sum, 1, two)), "ReduceScatter");
}

// ---- Resampling (docs/spec/ir.md §5.6, §5.8; no §5.11 row: each call emits the kind of its name)

TEST_F(ApiOps, InterpolateEveryModeBothAlignments) {
  using ir::InterpolateMode;
  Tensor two = f32({0, 4}, {1, 1, 1, 2});
  const Shape row4{1, 1, 1, 4};
  // 2 → 4: nearest reads floor(o / 2) either way; bilinear o / 3 aligned, else (o + ½) / 2 − ½
  // clamped at 0; bicubic half-pixel reads from −¼ (Keys, A = −0.75).
  expect_near(get(s->interpolate(two, {1, 4}, {InterpolateMode::Nearest, true}), row4), {0, 0, 4, 4});
  expect_near(get(s->interpolate(two, {1, 4}, {InterpolateMode::NearestExact, false}), row4), {0, 0, 4, 4});
  expect_near(get(s->interpolate(two, {1, 4}, {InterpolateMode::Bilinear, true}), row4), {0, 4.0 / 3, 8.0 / 3, 4});
  expect_near(get(s->interpolate(two, {1, 4}, {InterpolateMode::Bilinear, false}), row4), {0, 1, 3, 4});
  expect_near(get(s->interpolate(two, {1, 4}, {InterpolateMode::Bicubic, false}), row4),
              {-0.421875, 0.90625, 3.09375, 4.421875});
  // 4 → 3 (down): nearest 0, 1, 2; nearest-exact 0, 2, 3; bilinear aligned 0, 3/2, 3.
  Tensor four = f32({1, 2, 4, 8}, {1, 1, 1, 4});
  const Shape row3{1, 1, 1, 3};
  expect_near(get(s->interpolate(four, {1, 3}, {InterpolateMode::Nearest, false}), row3), {1, 2, 4});
  expect_near(get(s->interpolate(four, {1, 3}, {InterpolateMode::NearestExact, true}), row3), {1, 4, 8});
  expect_near(get(s->interpolate(four, {1, 3}, {InterpolateMode::Bilinear, true}), row3), {1, 3, 8});
  expect_near(get(s->interpolate(four, {1, 3}, {InterpolateMode::Bicubic, true}), row3), {1, 2.71875, 8});
  // 3 → 5 along H, Lanczos3 aligned: ½ reads 9/16, 9/16, −1/8 (renormalised, Burn).
  Tensor three = f32({1, 2, 4}, {1, 1, 3, 1});
  expect_near(get(s->interpolate(three, {5, 1}, {InterpolateMode::Lanczos3, true}), {1, 1, 5, 1}),
              {1, 19.0 / 16, 2, 3.25, 4});
  // 2-D half-pixel bilinear; the defaults are Burn's InterpolateOptions::new(Nearest).
  Tensor sq = f32({0, 4, 8, 12}, {1, 1, 2, 2});
  expect_near(get(s->interpolate(sq, {4, 4}, {InterpolateMode::Bilinear, false}), {1, 1, 4, 4}),
              {0, 1, 3, 4, 2, 3, 5, 6, 6, 7, 9, 10, 8, 9, 11, 12});
  expect_near(get(s->interpolate(sq, {1, 3}, {}), {1, 1, 1, 3}), {0, 0, 4});
  EXPECT_EQ(kinds_of([&] { ok(s->interpolate(sq, {3, 3}, {})); }), (Kinds{"Module::Interpolate"}));
  // Errors name the op and the values; nothing is registered.
  EXPECT_NAMES(error_of(s->interpolate(f32({1, 2}, {1, 2}), {2, 2}, {})), "Interpolate: x must have rank 4");
  EXPECT_NAMES(error_of(s->interpolate(sq, {0, 2}, {})), "Interpolate: output_size [0,2]");
  EXPECT_NAMES(error_of(s->interpolate(sq, {2, 2}, {static_cast<InterpolateMode>(8), true})),
               "unknown interpolate mode 8");
  EXPECT_NAMES(error_of(s->interpolate(i64({1, 2, 3, 4}, {1, 1, 2, 2}), {2, 2}, {})), "Interpolate: x");
  EXPECT_EQ(kinds_of([&] { (void)s->interpolate(sq, {0, 2}, {}); }), Kinds{});
}

// The gradient sums grad into the positions each output read, with the same weights.
TEST_F(ApiOps, InterpolateBackwardSumsIntoTheSources) {
  using ir::InterpolateMode;
  Tensor x = f32({0, 0}, {1, 1, 1, 2});
  Tensor g = f32({1, 2, 4, 8}, {1, 1, 1, 4});
  // Half-pixel bilinear 2 → 4 reads (1, 0), (¾, ¼), (¼, ¾), (0, 1): 1 + 1.5 + 1, 0.5 + 3 + 8.
  expect_near(get(s->interpolate_backward(x, g, {1, 4}, {InterpolateMode::Bilinear, false}), {1, 1, 1, 2}),
              {3.5, 11.5});
  // Nearest 3 → 5 reads 0, 0, 1, 1, 2.
  Tensor x3 = f32({0, 0, 0}, {1, 1, 1, 3});
  Tensor g5 = f32({1, 2, 4, 8, 16}, {1, 1, 1, 5});
  expect_near(get(s->interpolate_backward(x3, g5, {1, 5}, {}), {1, 1, 1, 3}), {3, 12, 16});
  EXPECT_EQ(kinds_of([&] { ok(s->interpolate_backward(x3, g5, {1, 5}, {})); }), (Kinds{"Module::InterpolateBackward"}));
  EXPECT_NAMES(error_of(s->interpolate_backward(x3, g, {1, 5}, {})), "InterpolateBackward: grad");
  EXPECT_NAMES(error_of(s->interpolate_backward(x3, i64({1, 2, 3, 4, 5}, {1, 1, 1, 5}), {1, 5}, {})),
               "InterpolateBackward: grad");
  EXPECT_EQ(kinds_of([&] { (void)s->interpolate_backward(x3, g, {1, 5}, {}); }), Kinds{});
}

// [[1, 2, 3], [4, 5, 6]] sampled at the corners and outside the image, per padding mode.
TEST_F(ApiOps, GridSample2dPaddingModes) {
  using ir::GridSamplePaddingMode;
  using ir::InterpolateMode;
  Tensor img = f32({1, 2, 3, 4, 5, 6}, {1, 1, 2, 3});
  // (x, y): the corners (−1, −1) and (1, 1); (3, 0) two columns beyond the last, half a row
  // down; (1.5, −1) half a column beyond the last on row 0.
  Tensor grid = f32({-1, -1, 1, 1, 3, 0, 1.5f, -1}, {1, 1, 4, 2});
  const Shape out{1, 1, 1, 4};
  auto sample = [&](InterpolateMode m, GridSamplePaddingMode p, bool align) {
    return get(s->grid_sample_2d(img, grid, {m, p, align}), out);
  };
  expect_near(sample(InterpolateMode::Bilinear, GridSamplePaddingMode::Zeros, true), {1, 6, 0, 1.5});
  expect_near(sample(InterpolateMode::Bilinear, GridSamplePaddingMode::Border, true), {1, 6, 4.5, 3});
  expect_near(sample(InterpolateMode::Bilinear, GridSamplePaddingMode::Reflection, true), {1, 6, 2.5, 2.5});
  expect_near(sample(InterpolateMode::Nearest, GridSamplePaddingMode::Zeros, true), {1, 6, 0, 3});
  // The defaults (Burn's): bilinear, zeros, corners at the pixels' outer edges.
  expect_near(get(s->grid_sample_2d(img, grid), out), {0.25, 1.5, 0, 0});
  EXPECT_EQ(kinds_of([&] { ok(s->grid_sample_2d(img, grid)); }), (Kinds{"Float::GridSample2d"}));
  EXPECT_NAMES(error_of(s->grid_sample_2d(img, f32({0, 0, 0}, {1, 1, 1, 3}))), "GridSample2d: grid");
  EXPECT_NAMES(error_of(s->grid_sample_2d(img, f32({0, 0, 0, 0}, {2, 1, 1, 2}))), "has batch 2");
  EXPECT_NAMES(error_of(s->grid_sample_2d(img, grid, {InterpolateMode::Lanczos3, GridSamplePaddingMode::Zeros, false})),
               "does not apply to grid sampling");
  EXPECT_EQ(kinds_of([&] { (void)s->grid_sample_2d(img, f32({0, 0, 0}, {1, 1, 1, 3})); }), Kinds{});
}

// im2col: Burn's test_unfold4d_complex, and the identities of a 1 x 1 and a whole-image kernel.
TEST_F(ApiOps, Unfold4dIsIm2col) {
  std::vector<float> a24(24);
  for (int i = 0; i < 24; ++i) a24[i] = static_cast<float>(i);
  Tensor x = f32(a24, {1, 2, 3, 4});
  ir::build::Unfold4dOptions o;
  o.stride = {1, 2};
  o.padding = {0, 1};
  o.dilation = {1, 2};
  expect_near(get(s->unfold4d(x, {2, 3}, o), {1, 12, 2}),
              {0, 0, 1, 5, 3, 7, 0, 0, 5, 9, 7, 11, 0, 0, 13, 17, 15, 19, 0, 0, 17, 21, 19, 23});
  Tensor small = f32({1, 2, 3, 4}, {1, 1, 2, 2});
  expect_near(get(s->unfold4d(small, {1, 1}), {1, 1, 4}), {1, 2, 3, 4});
  expect_near(get(s->unfold4d(small, {2, 2}), {1, 4, 1}), {1, 2, 3, 4});
  EXPECT_EQ(kinds_of([&] { ok(s->unfold4d(small, {2, 2})); }), (Kinds{"Module::Unfold4d"}));
  EXPECT_NAMES(error_of(s->unfold4d(f32({1, 2}, {1, 2}), {1, 1})), "Unfold4d: x must have rank 4");
  EXPECT_NAMES(error_of(s->unfold4d(small, {3, 1})), "Unfold4d: conv: kernel 3");
  ir::build::Unfold4dOptions zero;
  zero.stride = {0, 1};
  EXPECT_NAMES(error_of(s->unfold4d(small, {1, 1}, zero)), "stride must be at least 1");
  EXPECT_EQ(kinds_of([&] { (void)s->unfold4d(small, {3, 1}); }), Kinds{});
}

// ---- The deformable convolution

// A 1 x 1 kernel over [[1, 2], [3, 4]]: offsets (½, ½) average the four pixels at (0, 0); the mask
// scales, the bias adds; the backward's gradients by hand.
TEST_F(ApiOps, DeformableConv2dAndItsBackward) {
  Tensor x = f32({1, 2, 3, 4}, {1, 1, 2, 2}), w = f32({2}, {1, 1, 1, 1});
  Tensor offset = f32({0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f}, {1, 2, 2, 2});
  const Shape out{1, 1, 2, 2};
  expect_near(get(s->deformable_conv2d(x, offset, w), out), {5, 3, 3.5, 2});
  Tensor mask = f32({1, 0, 2, 1}, {1, 1, 2, 2}), bias = f32({10}, {1});
  expect_near(get(s->deformable_conv2d(x, offset, w, mask, bias), out), {15, 10, 17, 12});
  EXPECT_EQ(kinds_of([&] { ok(s->deformable_conv2d(x, offset, w, mask)); }), (Kinds{"Module::DeformableConv2d"}));
  // out_grad of ones at (0, 0) only: the weight gradient is the sample there (2.5), the input's a
  // quarter of the weight on each pixel, the offsets' the bilinear slopes times the weight.
  Tensor grad = f32({1, 0, 0, 0}, {1, 1, 2, 2});
  DeformableConv2dGrads g = ok(s->deformable_conv2d_backward(x, offset, w, std::nullopt, bias, grad));
  ASSERT_FALSE(g.mask_grad.has_value());
  ASSERT_TRUE(g.bias_grad.has_value());
  expect_near(get(std::move(g.input_grad), {1, 1, 2, 2}), {0.5, 0.5, 0.5, 0.5});
  // d/dy at (½, ½): −½·1 − ½·2 + ½·3 + ½·4 = 2, d/dx: −½·1 + ½·2 − ½·3 + ½·4 = 1; times w = 2.
  expect_near(get(std::move(g.offset_grad), {1, 2, 2, 2}), {4, 0, 0, 0, 2, 0, 0, 0});
  expect_near(get(std::move(g.weight_grad), {1, 1, 1, 1}), {2.5});
  expect_near(get(std::move(*g.bias_grad), {1}), {1});
  EXPECT_EQ(kinds_of([&] { ok(s->deformable_conv2d_backward(x, offset, w, mask, std::nullopt, grad)); }),
            (Kinds{"Module::DeformableConv2dBackward"}));
  DeformableConv2dGrads with_mask = ok(s->deformable_conv2d_backward(x, offset, w, mask, std::nullopt, grad));
  ASSERT_TRUE(with_mask.mask_grad.has_value());
  expect_near(get(std::move(*with_mask.mask_grad), {1, 1, 2, 2}), {5, 0, 0, 0});  // w · the sample 2.5
  // Errors name the op and the values; nothing is registered.
  EXPECT_NAMES(error_of(s->deformable_conv2d(x, f32({0, 0}, {1, 2, 1, 1}), w)), "DeformableConv2d: offset");
  EXPECT_NAMES(error_of(s->deformable_conv2d(x, offset, w, f32({1, 1}, {1, 1, 1, 2}))), "DeformableConv2d: mask");
  Result<DeformableConv2dGrads> bad = s->deformable_conv2d_backward(x, offset, w, std::nullopt, std::nullopt, x);
  EXPECT_TRUE(bad.ok());  // out_grad [1, 1, 2, 2] is the forward's output shape here
  bad = s->deformable_conv2d_backward(x, offset, w, std::nullopt, std::nullopt, f32({1}, {1, 1, 1, 1}));
  ASSERT_FALSE(bad.ok());
  EXPECT_NAMES(bad.error().to_string(), "DeformableConv2dBackward: out_grad");
  EXPECT_EQ(kinds_of([&] { (void)s->deformable_conv2d(x, f32({0, 0}, {1, 2, 1, 1}), w); }), Kinds{});
}

// ---- Quantization

// Q8S with scale 0.5: x / 0.5 rounded half away from zero and clamped to ±127, then multiplied
// back; [1, 4] blocks of a [2, 8] tensor in Q4S u32 words, one scale each; a global scale.
TEST_F(ApiOps, QuantizeAndDequantize) {
  const ir::QuantScheme q8;  // Q8S, native, per tensor, f32 scale
  Tensor x = f32({1.1f, -0.25f, 100, -100}, {4});
  Tensor q = ok(s->quantize(x, f32({0.5f}, {1}), q8));
  EXPECT_EQ(q.dtype(), ir::DType::qfloat(q8));
  EXPECT_EQ(q.shape(), (Shape{4}));
  expect_near(get(s->dequantize(std::move(q)), {4}), {1, -0.5, 63.5, -63.5});
  ir::QuantScheme blocks;
  blocks.value = ir::QuantValue::Q4S;
  blocks.store = ir::QuantStoreKind::PackedU32;
  blocks.block_rank = 2;
  blocks.block = {1, 4, 0, 0};
  Tensor y = f32({1, 2, 3, 4, 5, 6, 7, 8, 2, 4, 6, 8, 10, 12, 14, 16}, {2, 8});
  Tensor scales = f32({1, 2, 2, 4}, {2, 2});
  expect_near(get(s->dequantize(ok(s->quantize(y, scales, blocks))), {2, 8}),
              {1, 2, 3, 4, 6, 6, 8, 8, 2, 4, 6, 8, 12, 12, 16, 16});
  expect_near(get(s->dequantize(ok(s->quantize(f32({1, 0.3f}, {2}), f32({1}, {1}), q8, f32({0.25f}, {1})))), {2}),
              {1, 0.25});
  EXPECT_EQ(kinds_of([&] { ok(s->dequantize(ok(s->quantize(x, f32({1}, {1}), q8)), ir::dtypes::f64)); }),
            (Kinds{"Float::Quantize", "Float::Dequantize"}));
  // Builder errors name the op and the values; a zero scale passes the builder (it sees shapes) and
  // fails at execution.
  EXPECT_NAMES(error_of(s->quantize(y, f32({1, 1}, {2}), blocks)), "Quantize: scales");
  EXPECT_NAMES(error_of(s->quantize(i64({1, 2}, {2}), f32({1}, {1}), q8)), "Quantize: tensor");
  EXPECT_NAMES(error_of(s->dequantize(x)), "Dequantize: input");
  EXPECT_EQ(kinds_of([&] { (void)s->dequantize(x); }), Kinds{});
  Tensor zero = ok(s->quantize(x, f32({0}, {1}), q8));
  EXPECT_FALSE(s->to_host<float>(ok(s->dequantize(std::move(zero)))).ok());
}

// A QFloat tensor crosses the client boundary like any other (over IPC: protocol version 6): its
// bytes in kiln's layout out of to_host_bytes, back in through from_host_bytes, dequantized to
// the same values; dropped unread; a byte count that is not the layout's is refused.
TEST_F(ApiOps, QuantizedTensorsTravelAsKilnsLayout) {
  const ir::QuantScheme blocks = ::kiln::testing::packed_q4_blocks();  // [2, 8]: 8 + 8 + 4 bytes
  const ir::DType q4 = ir::DType::qfloat(blocks);
  const std::vector<float> xv{1, 2, 3, 4, 5, 6, 7, 8, 2, 4, 6, 8, 10, 12, 14, 16};
  Tensor q = ok(s->quantize(f32(xv, {2, 8}), f32({1, 2, 2, 4}, {2, 2}), blocks));
  Tensor q_copy = q;
  std::vector<std::byte> bytes(20);
  KILN_ASSERT_OK(s->to_host_bytes(std::move(q_copy), bytes));
  Tensor back = ok(s->from_host_bytes(q4, bytes, {2, 8}));
  EXPECT_EQ(back.dtype(), q4);
  const std::vector<double> want = get(s->dequantize(std::move(q)), {2, 8});
  expect_near(get(s->dequantize(std::move(back)), {2, 8}), want);
  EXPECT_NE(want, std::vector<double>(16, 0.0));
  // Q8S [4] with one scale: 4 value bytes, the f32 scale, the global scale.
  Tensor small = ok(s->quantize(f32({1, -2, 3, -4}, {4}), f32({0.5f}, {1}), ir::QuantScheme{}));
  std::vector<std::byte> small_bytes(12);
  KILN_ASSERT_OK(s->to_host_bytes(small, small_bytes));
  { Tensor dropped = std::move(small); }  // dropped unread, over IPC too
  expect_near(get(s->dequantize(ok(s->from_host_bytes(ir::DType::qfloat(ir::QuantScheme{}), small_bytes, {4}))), {4}),
              {1, -2, 3, -4});
  // The layout's byte count, and a shape the scheme fits, or an error naming both.
  EXPECT_NAMES(error_of(s->from_host_bytes(q4, std::span<const std::byte>(bytes).first(19), {2, 8})), "20");
  EXPECT_NAMES(error_of(s->from_host_bytes(q4, bytes, {2, 6})), "from_host_bytes");
  std::vector<std::byte> wrong_size(12);
  EXPECT_FALSE(s->to_host_bytes(ok(s->quantize(f32({1, 2, 3, 4}, {4}), f32({1}, {1}), ir::QuantScheme{})),
                                std::span<std::byte>(wrong_size).first(11))
                   .ok());
}

// ---- Signals

// rfft of [1, 2, 3, 4] is 10, −2 + 2i, −2 (torch.fft.rfft); n pads or trims; irfft inverts it.
TEST_F(ApiOps, RfftAndIRfft) {
  Tensor x = f32({1, 2, 3, 4, 0, 1, 0, -1}, {2, 4});
  auto [re, im] = ok(s->rfft(x, 1));
  EXPECT_EQ(re.dtype(), ir::dtypes::f32);
  Tensor re_copy = re, im_copy = im;
  expect_near(get(std::move(re), {2, 3}), {10, -2, -2, 0, 0, 0});
  expect_near(get(std::move(im), {2, 3}), {0, 2, 0, 0, -2, 0});
  expect_near(get(s->irfft(re_copy, im_copy, 1, 4), {2, 4}), {1, 2, 3, 4, 0, 1, 0, -1});
  // Trimmed to 1 point along dim 0: bin 0 is the first row.
  auto [re2, im2] = ok(s->rfft(x, 0, 1));
  expect_near(get(std::move(re2), {1, 4}), {1, 2, 3, 4});
  expect_near(get(std::move(im2), {1, 4}), {0, 0, 0, 0});
  // irfft without n: 2·(3 − 1) = 4 points; bin 0 alone is the mean.
  expect_near(get(s->irfft(f32({8, 0, 0}, {3}), f32({0, 0, 0}, {3}), 0), {4}), {2, 2, 2, 2});
  EXPECT_EQ(kinds_of([&] { ok(s->rfft(x, 1)); }), (Kinds{"Module::Rfft"}));
  EXPECT_EQ(kinds_of([&] { ok(s->irfft(re_copy, im_copy, 1)); }), (Kinds{"Module::IRfft"}));
  // Errors name the op and the values; nothing is registered.
  Result<std::pair<Tensor, Tensor>> bad = s->rfft(x, 2);
  ASSERT_FALSE(bad.ok());
  EXPECT_NAMES(bad.error().to_string(), "Rfft: dim 2 out of bounds");
  bad = s->rfft(i64({1, 2}, {2}), 0);
  ASSERT_FALSE(bad.ok());
  EXPECT_NAMES(bad.error().to_string(), "Rfft: signal");
  EXPECT_NAMES(error_of(s->irfft(re_copy, f32({0, 0}, {2}), 1)), "IRfft: input_im");
  EXPECT_NAMES(error_of(s->irfft(f32({1}, {1}), f32({0}, {1}), 0)), "IRfft: input_re");
  EXPECT_NAMES(error_of(s->irfft(re_copy, im_copy, 1, 0)), "IRfft: n must be at least 1");
  EXPECT_EQ(kinds_of([&] { (void)s->rfft(x, 2); }), Kinds{});
}

// ---- Attention and the CTC loss

// Scores 0 and ln 3 weigh the values 4 and 8 by ¼ and ¾; Burn's mask (true masks out), a bias, the
// bottom-right causal diagonal.
TEST_F(ApiOps, AttentionOptionsMaskAndBias) {
  const float l3 = std::log(3.0f);
  Tensor q = f32({1}, {1, 1, 1, 1}), k = f32({0, l3}, {1, 1, 2, 1}), v = f32({4, 8}, {1, 1, 2, 1});
  const ir::build::AttentionOptions one{1.0, std::nullopt, false};
  const Shape row{1, 1, 1, 1};
  expect_near(get(s->attention(q, k, v, std::nullopt, std::nullopt, one), row), {7});
  expect_near(get(s->attention(q, k, v, bools({false, true}, {1, 1, 1, 2}), std::nullopt, one), row), {4});
  expect_near(get(s->attention(q, k, v, std::nullopt, f32({l3, 0}, {1, 1, 1, 2}), one), row), {6});
  expect_near(get(s->attention(q, k, v, bools({true, true}, {1, 1, 1, 2})), row), {0});  // every key masked
  Tensor q2 = f32({0, 0}, {1, 1, 2, 1}), k3 = f32({0, 0, 0}, {1, 1, 3, 1}), v3 = f32({3, 6, 12}, {1, 1, 3, 1});
  expect_near(
      get(s->attention(q2, k3, v3, std::nullopt, std::nullopt, {std::nullopt, std::nullopt, true}), {1, 1, 2, 1}),
      {4.5, 7});
  EXPECT_EQ(kinds_of([&] { ok(s->attention(q, k, v)); }), (Kinds{"Module::Attention"}));
  EXPECT_EQ(kinds_of([&] {
              ok(s->attention(q, k, v, std::nullopt, f32({0, 0}, {1, 1, 1, 2})));
            }),
            (Kinds{"Module::Attention"}));
  EXPECT_NAMES(error_of(s->attention(q, k, f32({1, 2, 3}, {1, 1, 3, 1}))), "Attention: value");
  EXPECT_NAMES(error_of(s->attention(q, k, v, f32({0, 0}, {1, 1, 1, 2}))), "Attention: mask must be a bool dtype");
  EXPECT_NAMES(error_of(s->attention(q, k, v, std::nullopt, std::nullopt, {std::nullopt, -1.0, false})),
               "Attention: softcap must be finite and positive");
  EXPECT_EQ(kinds_of([&] { (void)s->attention(q, k, f32({1, 2, 3}, {1, 1, 3, 1})); }), Kinds{});
}

// Two steps of p = (0.4, 0.6), target [1]: the paths 11, b1, 1b give 0.84; the gradient is Burn's
// grad_loss · (exp(lp) − the posterior of each class at each step).
TEST_F(ApiOps, CtcLossAndItsBackward) {
  const float a = std::log(0.4f), c = std::log(0.6f);
  Tensor lp = f32({a, c, a, c}, {2, 1, 2});
  Tensor targets = i64({1}, {1, 1}), il = i64({2}, {1}), tl = i64({1}, {1});
  expect_near(get(s->ctc_loss(lp, targets, il, tl), {1}), {-std::log(0.84)});
  const double pb = 0.24 / 0.84, p1 = 0.6 / 0.84;  // blank: b1 at t 0, 1b at t 1; label: the rest
  expect_near(get(s->ctc_loss_backward(lp, targets, il, tl, f32({2}, {1})), {2, 1, 2}),
              {2 * (0.4 - pb), 2 * (0.6 - p1), 2 * (0.4 - pb), 2 * (0.6 - p1)});
  EXPECT_EQ(kinds_of([&] { ok(s->ctc_loss(lp, targets, il, tl)); }), (Kinds{"Module::CtcLoss"}));
  EXPECT_EQ(kinds_of([&] { ok(s->ctc_loss_backward(lp, targets, il, tl, f32({1}, {1}))); }),
            (Kinds{"Module::CtcLossBackward"}));
  // Builder errors name the op and the values; a length beyond T passes the builder (it sees
  // shapes) and fails at execution.
  EXPECT_NAMES(error_of(s->ctc_loss(lp, targets, il, tl, 2)), "CtcLoss: blank 2 out of range");
  EXPECT_NAMES(error_of(s->ctc_loss(lp, f32({1}, {1, 1}), il, tl)), "CtcLoss: targets");
  EXPECT_NAMES(error_of(s->ctc_loss_backward(lp, targets, il, tl, f32({1, 1}, {2}))), "CtcLossBackward: grad_loss");
  EXPECT_EQ(kinds_of([&] { (void)s->ctc_loss(lp, targets, il, tl, 2); }), Kinds{});
  Tensor far = ok(s->ctc_loss(lp, targets, i64({3}, {1}), tl));
  EXPECT_FALSE(s->to_host<float>(std::move(far)).ok());
}

}  // namespace
}  // namespace kiln::runtime
