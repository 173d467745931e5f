// Reference executor: the Activation group (docs/spec/ir.md §5.9). Expected values are closed
// forms (Φ(1) for gelu(1), 1 / (1 + e) for sigmoid(−1), −ln 2 for log_sigmoid(0), the softmax of
// [1, 2, 3]) or, for GeluBackward, the tanh approximation's derivative evaluated in double; the
// extremes (±inf, ±1000, −0, NaN) are where a naive formula would overflow or lose the sign.
#include "kiln/testing/status.h"
#include "reference_test_util.h"

namespace kiln::reference::testing {
namespace {

using F = Family;
using K = OpKind;

const std::vector<double> kExtremes{-kInf, -1000, -1, -0.0, 0, 1, 1000, kInf, kNaN};

TEST(ReferenceActivationTest, ReluAndGelu) {
  Device d;
  const TensorIr x = d.f64({9}, dtypes::f64, kExtremes);
  const std::vector<double> relu = d.f64_of(d.ok(b::unary(F::Activation, K::Activation_Relu, x, d.fresh())));
  EXPECT_THAT(relu, NanEq(std::vector<double>{0, 0, 0, 0, 0, 1, 1000, kInf, kNaN}));
  EXPECT_FALSE(std::signbit(relu[3])) << "relu(-0) is the mask fill's +0";
  // The erf form x Φ(x): Φ(1) = 0.8413447460685429, −Φ(−1); −inf · 0 is NaN (Burn's sequence,
  // PyTorch and Session::gelu agree); erf saturates, so ±1000 give −0 and 1000.
  EXPECT_THAT(
      d.f64_of(d.ok(b::unary(F::Activation, K::Activation_Gelu, x, d.fresh()))),
      Near(std::vector<double>{kNaN, 0, -0.15865525393145707, 0, 0, 0.8413447460685429, 1000, kInf, kNaN}, 1e-15));
}

TEST(ReferenceActivationTest, SigmoidAndLogSigmoidAreStable) {
  Device d;
  const TensorIr x = d.f64({9}, dtypes::f64, kExtremes);
  // 1 / (1 + e^−x); sigmoid(−1) = 1 / (1 + e), and e^1000 never overflows on the way.
  EXPECT_THAT(d.f64_of(d.ok(b::unary(F::Activation, K::Activation_Sigmoid, x, d.fresh()))),
              Near(std::vector<double>{0, 0, 0.2689414213699951, 0.5, 0.5, 0.7310585786300049, 1, 1, kNaN}, 1e-15));
  // −softplus(−x): −ln(1 + e) at −1, −ln 2 at ±0, x itself far below 0, 0 far above.
  EXPECT_THAT(d.f64_of(d.ok(b::unary(F::Activation, K::Activation_LogSigmoid, x, d.fresh()))),
              Near(std::vector<double>{-kInf, -1000, -1.3132616875182228, -0.6931471805599453, -0.6931471805599453,
                                       -0.31326168751822286, 0, 0, kNaN},
                   1e-15));
  // Rounded once: sigmoid(−100) ≈ 3.72e−44 is an f32 subnormal, not 0 (Burn's f32 sequence
  // overflows e^100 and gives 0).
  const TensorIr far = d.f64({1}, dtypes::f32, {-100});
  EXPECT_EQ(d.f64_of(d.ok(b::unary(F::Activation, K::Activation_Sigmoid, far, d.fresh())))[0],
            static_cast<double>(static_cast<float>(3.720075976020836e-44)));
}

// Backward ops take {forward output or input, grad} (Burn's ActivationOps argument order).
TEST(ReferenceActivationTest, ReluAndSigmoidBackwardTakeTheForwardOutput) {
  Device d;
  // ReluBackward{output, grad}: the gradient where output > 0; a NaN output lets it through.
  const TensorIr out = d.f64({5}, dtypes::f32, {-1, 0, -0.0, 2, kNaN});
  const TensorIr grad = d.f64({5}, dtypes::f32, {5, 5, 5, 5, 5});
  EXPECT_THAT(d.f64_of(d.ok(b::binary(F::Activation, K::Activation_ReluBackward, out, grad, d.fresh()))),
              NanEq(std::vector<double>{0, 0, 0, 5, 5}));
  // SigmoidBackward{output, grad}: grad · output (1 − output).
  const TensorIr s = d.f64({4}, dtypes::f64, {0.5, 0, 1, 0.25});
  const TensorIr g = d.f64({4}, dtypes::f64, {2, 2, 2, 4});
  EXPECT_EQ(d.f64_of(d.ok(b::binary(F::Activation, K::Activation_SigmoidBackward, s, g, d.fresh()))),
            (std::vector<double>{0.5, 0, 0, 0.75}));
  // Broadcasting as any Binary kind: a [2, 1] output with a [1, 2] gradient.
  const TensorIr col = d.f64({2, 1}, dtypes::f64, {-3, 3});
  const TensorIr row = d.f64({1, 2}, dtypes::f64, {7, 8});
  const TensorId bc = d.ok(b::binary(F::Activation, K::Activation_ReluBackward, col, row, d.fresh()));
  EXPECT_EQ(d.shape_of(bc), (Shape{2, 2}));
  EXPECT_EQ(d.f64_of(bc), (std::vector<double>{0, 0, 7, 8}));
}

TEST(ReferenceActivationTest, GeluAndLogSigmoidBackwardTakeTheForwardInput) {
  Device d;
  // GeluBackward{x, grad}: the tanh approximation's derivative (Burn's gelu_backward), 1.08296…
  // at 1 where the erf form's is Φ(1) + φ(1) = 1.08331…; the limits 1 and 0 at ±inf and where x³
  // overflows (1e200), not inf · 0.
  const TensorIr x = d.f64({8}, dtypes::f64, {0, 1, -1, 2, kInf, -kInf, 1e200, kNaN});
  const TensorIr ones = d.f64({8}, dtypes::f64, {1, 1, 1, 1, 1, 1, 1, 1});
  EXPECT_THAT(
      d.f64_of(d.ok(b::binary(F::Activation, K::Activation_GeluBackward, x, ones, d.fresh()))),
      Near(std::vector<double>{0.5, 1.0829640838457826, -0.08296408384578252, 1.0860992566236183, 1, 0, 1, kNaN},
           1e-14));
  const TensorIr three = d.f64({8}, dtypes::f64, {3, 3, 3, 3, 3, 3, 3, 3});
  EXPECT_EQ(d.f64_of(d.ok(b::binary(F::Activation, K::Activation_GeluBackward, x, three, d.fresh())))[0], 1.5);
  // LogSigmoidBackward{x, grad}: grad · sigmoid(−x), 1 at −inf and 0 at +inf (PyTorch's form;
  // Burn's max-trick sequence gives NaN at −inf).
  const TensorIr y = d.f64({6}, dtypes::f64, {0, -kInf, kInf, 1, -1, kNaN});
  const TensorIr twos = d.f64({6}, dtypes::f64, {2, 2, 2, 2, 2, 2});
  EXPECT_THAT(d.f64_of(d.ok(b::binary(F::Activation, K::Activation_LogSigmoidBackward, y, twos, d.fresh()))),
              Near(std::vector<double>{1, 2, 0, 0.5378828427399902, 1.4621171572600098, kNaN}, 1e-15));
}

TEST(ReferenceActivationTest, PReluLeakyReluAndHardSigmoid) {
  Device d;
  // PRelu{x, alpha}: x · alpha below 0, alpha broadcast per column; −0 and NaN stay.
  const TensorIr x = d.f64({2, 3}, dtypes::f64, {-2, 0, 3, -0.0, -1, kNaN});
  const TensorIr alpha = d.f64({1, 3}, dtypes::f64, {0.5, 0.25, 2});
  const std::vector<double> p = d.f64_of(d.ok(b::binary(F::Activation, K::Activation_PRelu, x, alpha, d.fresh())));
  EXPECT_THAT(p, NanEq(std::vector<double>{-1, 0, 3, -0.0, -0.25, kNaN}));
  EXPECT_TRUE(std::signbit(p[3])) << "-0 is not below 0";
  // LeakyRelu{x, slope}: the slope converted to the operand's dtype first (an Int scalar here).
  const TensorIr v = d.f64({5}, dtypes::f32, {-100, -0.0, 5, -kInf, kNaN});
  EXPECT_THAT(d.f64_of(d.ok(b::scalar(F::Activation, K::Activation_LeakyRelu, v, ScalarIr::Float(0.25), d.fresh()))),
              NanEq(std::vector<double>{-25, -0.0, 5, -kInf, kNaN}));
  EXPECT_EQ(d.f64_of(d.ok(b::scalar(F::Activation, K::Activation_LeakyRelu, v, ScalarIr::Int(2), d.fresh())))[0], -200);
  // HardSigmoid{x, alpha, beta}: clamp(alpha x + beta, 0, 1); ±inf saturate, NaN stays NaN.
  const TensorIr h = d.f64({9}, dtypes::f64, {-10, -2, 0, 1, 2, 10, kInf, -kInf, kNaN});
  EXPECT_THAT(d.f64_of(d.ok(b::hard_sigmoid(h, ScalarIr::Float(0.25), ScalarIr::Float(0.5), d.fresh()))),
              NanEq(std::vector<double>{0, 0, 0.5, 0.75, 1, 1, 1, 0, kNaN}));
  // Burn's defaults (0.2, 0.5) on f32: the scalars rounded to f32, the result rounded once.
  const TensorIr one = d.f64({1}, dtypes::f32, {1});
  EXPECT_EQ(d.f64_of(d.ok(b::hard_sigmoid(one, ScalarIr::Float(0.2), ScalarIr::Float(0.5), d.fresh())))[0],
            static_cast<double>(0.7f));
}

// Softmax / LogSoftmax / Softmin along an axis, the line's maximum subtracted first.
TEST(ReferenceActivationTest, SoftmaxFamilySubtractsTheMaximum) {
  Device d;
  const TensorIr x = d.f64({2, 3}, dtypes::f64, {1, 2, 3, 1000, 1000, -kInf});
  // Row 0: the softmax of [1, 2, 3]; row 1: e^1000 never overflows, −inf gives 0 (and −inf in log).
  EXPECT_THAT(
      d.f64_of(d.ok(b::dim(F::Activation, K::Activation_Softmax, x, 1, d.fresh()))),
      Near(std::vector<double>{0.09003057317038046, 0.24472847105479764, 0.6652409557748218, 0.5, 0.5, 0}, 1e-15));
  EXPECT_THAT(d.f64_of(d.ok(b::dim(F::Activation, K::Activation_LogSoftmax, x, 1, d.fresh()))),
              Near(std::vector<double>{-2.4076059644443806, -1.4076059644443804, -0.4076059644443804,
                                       -0.6931471805599453, -0.6931471805599453, -kInf},
                   1e-15));
  // Softmin = Softmax(−x): row 0 reversed; row 1 holds −inf, i.e. +inf once negated, which makes
  // the whole line NaN (inf − inf), as in PyTorch.
  EXPECT_THAT(
      d.f64_of(d.ok(b::dim(F::Activation, K::Activation_Softmin, x, 1, d.fresh()))),
      Near(std::vector<double>{0.6652409557748218, 0.24472847105479764, 0.09003057317038046, kNaN, kNaN, kNaN}, 1e-15));
  // Along axis 0: each column is a line; (5, 3) gives sigmoid(±2).
  const TensorIr cols = d.f64({2, 2}, dtypes::f32, {1, 5, 1, 3});
  EXPECT_THAT(d.f64_of(d.ok(b::dim(F::Activation, K::Activation_Softmax, cols, 0, d.fresh()))),
              Near(std::vector<double>{0.5, 0.8807970779778823, 0.5, 0.11920292202211755}, 1e-7));
  // A NaN, or a line of −inf, makes the line NaN; an empty axis gives an empty tensor.
  const TensorIr bad = d.f64({2, 2}, dtypes::f64, {kNaN, 1, -kInf, -kInf});
  EXPECT_THAT(d.f64_of(d.ok(b::dim(F::Activation, K::Activation_Softmax, bad, 1, d.fresh()))),
              NanEq(std::vector<double>{kNaN, kNaN, kNaN, kNaN}));
  const TensorIr empty = d.f64({2, 0}, dtypes::f16, {});
  EXPECT_EQ(d.shape_of(d.ok(b::dim(F::Activation, K::Activation_LogSoftmax, empty, 1, d.fresh()))), (Shape{2, 0}));
}

// Hand-made ops: an integer operand (the family check), a bad axis, mismatched dtypes or an output
// that is not the input's: errors that claim the output, never a crash.
TEST(ReferenceActivationTest, HostileOperationsAreErrors) {
  Device d;
  const TensorIr x = d.f64({2, 3}, dtypes::f32, {1, 2, 3, 4, 5, 6});
  Operation relu = *b::unary(F::Activation, K::Activation_Relu, x, d.fresh());
  relu.tensors[0] = d.i64({2, 3}, dtypes::i32, {1, 2, 3, 4, 5, 6});
  relu.tensors[1].dtype = dtypes::i32;
  d.expect_error(relu, ErrorCode::DTypeMismatch, "family Activation does not apply to operand dtype i32");
  Operation soft = *b::dim(F::Activation, K::Activation_Softmax, x, 1, d.fresh());
  soft.attrs[0] = 2;
  d.expect_error(soft, ErrorCode::OutOfBounds, "axis 2 out of bounds for rank 2");
  Operation prelu = *b::binary(F::Activation, K::Activation_PRelu, x, x, d.fresh());
  prelu.tensors[1] = d.f64({2, 3}, dtypes::f64, {1, 2, 3, 4, 5, 6});
  d.expect_error(prelu, ErrorCode::DTypeMismatch, "dtypes differ");
  Operation hs = *b::hard_sigmoid(x, ScalarIr::Float(0.2), ScalarIr::Float(0.5), d.fresh());
  hs.tensors[1].dtype = dtypes::f16;
  d.expect_error(hs, ErrorCode::DTypeMismatch, "must have dtype f32");
  hs = *b::hard_sigmoid(x, ScalarIr::Float(0.2), ScalarIr::Float(0.5), d.fresh());
  hs.tensors[1].shape = {3, 2};
  d.expect_error(hs, ErrorCode::IncompatibleShapes, "does not have the shape");
  // Wild scalars are converted like any other (2^64 − 1 and true become 1.8e19 and 1 in f32): no
  // error, a saturated result.
  hs = *b::hard_sigmoid(x, ScalarIr::UInt(~std::uint64_t{0}), ScalarIr::Bool(true), d.fresh());
  EXPECT_EQ(d.f64_of(d.ok(Result<Operation>(hs))), (std::vector<double>{1, 1, 1, 1, 1, 1}));
}

}  // namespace
}  // namespace kiln::reference::testing
