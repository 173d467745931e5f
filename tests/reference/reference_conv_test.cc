// Reference executor: the convolutions of 1, 2 and 3 spatial dims (docs/spec/ir.md §5.8) and their
// gradients. Small cases by hand (stride, padding, dilation, groups, depthwise, padding_out), the
// ranks against each other (a 1-d convolution is a 2-d one of height 1), the transposed
// convolution as the adjoint of the convolution, central differences showing that every X,
// Weight and Bias gradient is the gradient of its forward, and hand-made ops with bad attributes.
// Conv2d and ConvTranspose1d keep their tests in reference_module_test.cc.
#include <random>

#include "kiln/testing/status.h"
#include "op_samples.h"
#include "reference_test_util.h"

namespace kiln::reference::testing {
namespace {

using K = OpKind;

std::size_t count(const Shape& s) { return static_cast<std::size_t>(num_elements(s)); }

// ---- By hand

// x = [1, 2, 3, 4, 5], w = [1, 10]: out[i] = Σ_k x[i·stride − padding + k·dilation] · w[k].
TEST(ReferenceConvNdTest, Conv1dStridePaddingDilationBias) {
  Device d;
  const TensorIr x = d.f64({1, 1, 5}, dtypes::f32, iota1(5));
  const TensorIr w = d.f64({1, 1, 2}, dtypes::f32, {1, 10});
  EXPECT_EQ(d.f64_of(d.ok(b::conv1d(x, w, std::nullopt, {}, d.fresh()))), (std::vector<double>{21, 32, 43, 54}));
  b::Conv1dOptions o;
  o.stride = 2;
  o.padding = 1;  // [0, 1, 2, 3, 4, 5, 0] at 0, 2, 4
  EXPECT_EQ(d.f64_of(d.ok(b::conv1d(x, w, std::nullopt, o, d.fresh()))), (std::vector<double>{10, 32, 54}));
  b::Conv1dOptions dil;
  dil.dilation = 2;  // x[i] + 10 · x[i + 2]
  const TensorIr bias = d.f64({1}, dtypes::f32, {0.5});
  const TensorId r = d.ok(b::conv1d(x, w, bias, dil, d.fresh()));
  EXPECT_EQ(d.shape_of(r), (Shape{1, 1, 3}));
  EXPECT_EQ(d.f64_of(r), (std::vector<double>{31.5, 42.5, 53.5}));
  // f32 operands summed in f64 and rounded once: 2^24 + 1 + 1 is exact, an f32 sum would lose both.
  const TensorIr big = d.f64({1, 1, 3}, dtypes::f32, {16777216, 1, 1});
  const TensorIr ones = d.f64({1, 1, 3}, dtypes::f32, {1, 1, 1});
  EXPECT_EQ(d.f64_of(d.ok(b::conv1d(big, ones, std::nullopt, {}, d.fresh()))), (std::vector<double>{16777218}));
}

TEST(ReferenceConvNdTest, Conv1dGroupsAndDepthwise) {
  Device d;
  const TensorIr x = d.f64({1, 2, 3}, dtypes::f64, {1, 2, 3, 4, 5, 6});
  b::Conv1dOptions o;
  o.groups = 2;
  // Depthwise (groups = C_in = C_out): channel 0 sums pairs, channel 1 differences them.
  const TensorIr w = d.f64({2, 1, 2}, dtypes::f64, {1, 1, 1, -1});
  EXPECT_EQ(d.f64_of(d.ok(b::conv1d(x, w, std::nullopt, o, d.fresh()))), (std::vector<double>{3, 5, -1, -1}));
  // Depthwise with multiplier 2: output channels 0, 1 read input channel 0, channels 2, 3 channel 1.
  const TensorIr wm = d.f64({4, 1, 1}, dtypes::f64, {1, 2, 3, 4});
  EXPECT_EQ(d.f64_of(d.ok(b::conv1d(x, wm, std::nullopt, o, d.fresh()))),
            (std::vector<double>{1, 2, 3, 2, 4, 6, 12, 15, 18, 16, 20, 24}));
  // Two groups of two input channels: each output sums its own group only.
  const TensorIr x4 = d.f64({1, 4, 1}, dtypes::f64, {1, 2, 3, 4});
  const TensorIr w4 = d.f64({2, 2, 1}, dtypes::f64, {1, 10, 100, 1000});
  EXPECT_EQ(d.f64_of(d.ok(b::conv1d(x4, w4, std::nullopt, o, d.fresh()))), (std::vector<double>{21, 4300}));
}

TEST(ReferenceConvNdTest, Conv3dStridePaddingDilation) {
  Device d;
  // x [2, 2, 2] = 1..8 (index d·4 + h·2 + w), an all-ones [2, 2, 2] kernel: the sum.
  const TensorIr x = d.f64({1, 1, 2, 2, 2}, dtypes::f64, iota1(8));
  const TensorIr ones = d.f64({1, 1, 2, 2, 2}, dtypes::f64, std::vector<double>(8, 1));
  EXPECT_EQ(d.f64_of(d.ok(b::conv3d(x, ones, std::nullopt, {}, d.fresh()))), (std::vector<double>{36}));
  // Padding 1 and stride 2 along w: the windows see the w = 0 plane (1+3+5+7), then w = 1.
  b::Conv3dOptions o;
  o.stride = {1, 1, 2};
  o.padding = {0, 0, 1};
  const TensorId r = d.ok(b::conv3d(x, ones, std::nullopt, o, d.fresh()));
  EXPECT_EQ(d.shape_of(r), (Shape{1, 1, 1, 1, 2}));
  EXPECT_EQ(d.f64_of(r), (std::vector<double>{16, 20}));
  // Dilation 2 on x [3, 3, 3] = 1..27 with taps at (0, 0, 0) and (1, 1, 1): x[0,0,0] + x[2,2,2].
  std::vector<double> corners(8, 0);
  corners[0] = 1;
  corners[7] = 1;
  b::Conv3dOptions dil;
  dil.dilation = {2, 2, 2};
  const TensorIr bias = d.f64({1}, dtypes::f64, {-8});
  EXPECT_EQ(d.f64_of(d.ok(b::conv3d(d.f64({1, 1, 3, 3, 3}, dtypes::f64, iota1(27)),
                                    d.f64({1, 1, 2, 2, 2}, dtypes::f64, corners), bias, dil, d.fresh()))),
            (std::vector<double>{20}));
}

// x [2, 2] = [[1, 2], [3, 4]], w [2, 2] = [[1, 10], [100, 1000]], stride 2: each input scatters
// its 2 × 2 block x · w at (2i, 2j); padding crops, padding_out appends.
TEST(ReferenceConvNdTest, ConvTranspose2dStridePaddingPaddingOutGroups) {
  Device d;
  const TensorIr x = d.f64({1, 1, 2, 2}, dtypes::f32, {1, 2, 3, 4});
  const TensorIr w = d.f64({1, 1, 2, 2}, dtypes::f32, {1, 10, 100, 1000});
  b::ConvTranspose2dOptions o;
  o.stride = {2, 2};
  const std::vector<double> full{1, 10, 2, 20, 100, 1000, 200, 2000, 3, 30, 4, 40, 300, 3000, 400, 4000};
  EXPECT_EQ(d.f64_of(d.ok(b::conv_transpose2d(x, w, std::nullopt, o, d.fresh()))), full);
  o.padding = {1, 1};  // the centre 2 × 2
  EXPECT_EQ(d.f64_of(d.ok(b::conv_transpose2d(x, w, std::nullopt, o, d.fresh()))),
            (std::vector<double>{1000, 200, 30, 4}));
  o.padding = {0, 0};
  o.padding_out = {1, 1};  // a last row and column no input reaches: the bias only
  const TensorId r = d.ok(b::conv_transpose2d(x, w, d.f64({1}, dtypes::f32, {0.5}), o, d.fresh()));
  ASSERT_EQ(d.shape_of(r), (Shape{1, 1, 5, 5}));
  std::vector<double> want;
  for (std::size_t i = 0; i < 5; ++i)
    for (std::size_t j = 0; j < 5; ++j) want.push_back(0.5 + (i < 4 && j < 4 ? full[i * 4 + j] : 0.0));
  EXPECT_EQ(d.f64_of(r), want);
  // Groups: weight [C_in, C_out / groups, ...]; input channel 0 feeds outputs 0, 1, channel 1 outputs 2, 3.
  b::ConvTranspose2dOptions g;
  g.groups = 2;
  const TensorIr x2 = d.f64({1, 2, 1, 1}, dtypes::f64, {1, 2});
  const TensorId gr =
      d.ok(b::conv_transpose2d(x2, d.f64({2, 2, 1, 1}, dtypes::f64, {3, 5, 7, 11}), std::nullopt, g, d.fresh()));
  EXPECT_EQ(d.shape_of(gr), (Shape{1, 4, 1, 1}));
  EXPECT_EQ(d.f64_of(gr), (std::vector<double>{3, 5, 14, 22}));
}

TEST(ReferenceConvNdTest, ConvTranspose3dByHand) {
  Device d;
  const TensorIr x = d.f64({1, 1, 1, 1, 2}, dtypes::f64, {1, 2});
  const TensorIr w = d.f64({1, 1, 1, 1, 2}, dtypes::f64, {1, 10});
  EXPECT_EQ(d.f64_of(d.ok(b::conv_transpose3d(x, w, std::nullopt, {}, d.fresh()))), (std::vector<double>{1, 12, 20}));
  b::ConvTranspose3dOptions o;
  o.stride = {1, 1, 2};
  o.padding_out = {0, 0, 1};
  EXPECT_EQ(d.f64_of(d.ok(b::conv_transpose3d(x, w, std::nullopt, o, d.fresh()))),
            (std::vector<double>{1, 10, 2, 20, 0}));
}

// x = [1, 2, 3], w = [1, 10], output_grad g = [1, 2]: gx[i] = Σ_{o + k = i} g[o] w[k] = [1, 12, 20],
// gw[k] = Σ_o g[o] x[o + k] = [5, 8], gb = Σ g = 3. With stride 2 and padding 1 on x = 1..5 and
// g = [1, 2, 3] (positions 2o − 1 + k): gx = [10, 2, 20, 3, 30], gw = [2·2 + 3·4, 1·1 + 2·3 + 3·5].
TEST(ReferenceConvNdTest, ConvGradientsByHand) {
  Device d;
  const TensorIr w = d.f64({1, 1, 2}, dtypes::f64, {1, 10});
  const TensorIr x = d.f64({1, 1, 3}, dtypes::f64, {1, 2, 3});
  const TensorIr g = d.f64({1, 1, 2}, dtypes::f32, {1, 2});
  const b::ConvOptions plain = b::conv_options(b::Conv1dOptions{});
  const TensorId gx = d.ok(b::conv_backward(K::Module_Conv1dXBackward, x, w, g, plain, d.fresh()));
  EXPECT_EQ(d.tensor(gx).dtype(), dtypes::f32);  // output_grad's
  EXPECT_EQ(d.f64_of(gx), (std::vector<double>{1, 12, 20}));
  EXPECT_EQ(d.f64_of(d.ok(b::conv_backward(K::Module_Conv1dWeightBackward, x, w, g, plain, d.fresh()))),
            (std::vector<double>{5, 8}));
  EXPECT_EQ(d.f64_of(d.ok(
                b::conv_bias_backward(K::Module_Conv1dBiasBackward, x, d.f64({1}, dtypes::f64, {0}), g, d.fresh()))),
            (std::vector<double>{3}));
  b::Conv1dOptions o;
  o.stride = 2;
  o.padding = 1;
  const TensorIr x5 = d.f64({1, 1, 5}, dtypes::f64, iota1(5));
  const TensorIr g3 = d.f64({1, 1, 3}, dtypes::f64, {1, 2, 3});
  EXPECT_EQ(d.f64_of(d.ok(b::conv_backward(K::Module_Conv1dXBackward, x5, w, g3, b::conv_options(o), d.fresh()))),
            (std::vector<double>{10, 2, 20, 3, 30}));
  EXPECT_EQ(d.f64_of(d.ok(b::conv_backward(K::Module_Conv1dWeightBackward, x5, w, g3, b::conv_options(o), d.fresh()))),
            (std::vector<double>{16, 22}));
  // The transposed weight gradient: out[l + k] += x[l] w[k], so gw[k] = Σ_l x[l] g[l + k].
  const TensorIr xt = d.f64({1, 1, 2}, dtypes::f64, {1, 2});
  const TensorIr gt = d.f64({1, 1, 3}, dtypes::f64, {1, 10, 100});
  EXPECT_EQ(d.f64_of(d.ok(b::conv_transpose_backward(K::Module_ConvTranspose1dWeightBackward, xt, w, gt,
                                                     b::conv_options(b::ConvTranspose1dOptions{}), d.fresh()))),
            (std::vector<double>{21, 210}));
  // Bias gradients sum every batch and position of a channel.
  const TensorIr g2 = d.f64({2, 2, 1, 2}, dtypes::f64, {1, 2, 10, 20, 100, 200, 1000, 2000});
  EXPECT_EQ(d.f64_of(d.ok(b::conv_bias_backward(K::Module_ConvTranspose2dBiasBackward,
                                                d.f64({2, 3, 1, 1}, dtypes::f64, iota1(6)),
                                                d.f64({2}, dtypes::f64, {0, 0}), g2, d.fresh()))),
            (std::vector<double>{303, 3030}));
}

// ---- The ranks against each other: a unit dim changes nothing, not even the order of the sums.

TEST(ReferenceConvNdTest, Conv1dIsConv2dOfHeightOneIsConv3dOfDepthAndHeightOne) {
  Device d;
  const std::vector<double> xv = random_values(2 * 4 * 7, 1), wv = random_values(6 * 2 * 3, 2);
  const std::vector<double> bv = random_values(6, 3);
  b::Conv1dOptions o1;
  o1.stride = 2;
  o1.padding = 1;
  o1.dilation = 2;
  o1.groups = 2;
  const b::Conv2dOptions o2{{1, 2}, {0, 1}, {1, 2}, 2};
  const b::Conv3dOptions o3{{1, 1, 2}, {0, 0, 1}, {1, 1, 2}, 2};
  const TensorIr bias = d.f64({6}, dtypes::f64, bv);
  const TensorId r1 =
      d.ok(b::conv1d(d.f64({2, 4, 7}, dtypes::f64, xv), d.f64({6, 2, 3}, dtypes::f64, wv), bias, o1, d.fresh()));
  const TensorId r2 =
      d.ok(b::conv2d(d.f64({2, 4, 1, 7}, dtypes::f64, xv), d.f64({6, 2, 1, 3}, dtypes::f64, wv), bias, o2, d.fresh()));
  const TensorId r3 = d.ok(
      b::conv3d(d.f64({2, 4, 1, 1, 7}, dtypes::f64, xv), d.f64({6, 2, 1, 1, 3}, dtypes::f64, wv), bias, o3, d.fresh()));
  EXPECT_EQ(d.shape_of(r1), (Shape{2, 6, 3}));
  EXPECT_EQ(d.f64_of(r1), d.f64_of(r2));
  EXPECT_EQ(d.f64_of(r1), d.f64_of(r3));
  // A 2-d convolution is a 3-d one of depth 1.
  const std::vector<double> x2 = random_values(2 * 5 * 6, 4), w2 = random_values(4 * 2 * 3 * 2, 5);
  const b::Conv2dOptions p2{{2, 1}, {1, 0}, {1, 2}, 1};
  const b::Conv3dOptions p3{{1, 2, 1}, {0, 1, 0}, {1, 1, 2}, 1};
  EXPECT_EQ(d.f64_of(d.ok(b::conv2d(d.f64({1, 2, 5, 6}, dtypes::f64, x2), d.f64({4, 2, 3, 2}, dtypes::f64, w2),
                                    std::nullopt, p2, d.fresh()))),
            d.f64_of(d.ok(b::conv3d(d.f64({1, 2, 1, 5, 6}, dtypes::f64, x2), d.f64({4, 2, 1, 3, 2}, dtypes::f64, w2),
                                    std::nullopt, p3, d.fresh()))));
}

TEST(ReferenceConvNdTest, TransposedAndGradientRanksAgreeToo) {
  Device d;
  const std::vector<double> xv = random_values(2 * 4 * 5, 6), wv = random_values(4 * 3 * 3, 7);
  b::ConvTranspose1dOptions t1;
  t1.stride = 2;
  t1.padding = 1;
  t1.padding_out = 1;
  t1.dilation = 2;
  t1.groups = 2;
  const b::ConvTranspose2dOptions t2{{1, 2}, {0, 1}, {0, 1}, {1, 2}, 2};
  const b::ConvTranspose3dOptions t3{{1, 1, 2}, {0, 0, 1}, {0, 0, 1}, {1, 1, 2}, 2};
  const TensorIr bias = d.f64({6}, dtypes::f64, random_values(6, 8));
  const TensorId r1 = d.ok(
      b::conv_transpose1d(d.f64({2, 4, 5}, dtypes::f64, xv), d.f64({4, 3, 3}, dtypes::f64, wv), bias, t1, d.fresh()));
  const TensorId r2 = d.ok(b::conv_transpose2d(d.f64({2, 4, 1, 5}, dtypes::f64, xv),
                                               d.f64({4, 3, 1, 3}, dtypes::f64, wv), bias, t2, d.fresh()));
  const TensorId r3 = d.ok(b::conv_transpose3d(d.f64({2, 4, 1, 1, 5}, dtypes::f64, xv),
                                               d.f64({4, 3, 1, 1, 3}, dtypes::f64, wv), bias, t3, d.fresh()));
  EXPECT_EQ(d.shape_of(r1), (Shape{2, 6, 12}));  // 4·2 + 2·2 + 1 + 1 − 2
  EXPECT_EQ(d.f64_of(r1), d.f64_of(r2));
  EXPECT_EQ(d.f64_of(r1), d.f64_of(r3));
  // The conv gradients of rank 1 and 3 on the same numbers.
  const std::vector<double> gv = random_values(2 * 6 * 3, 9), cw = random_values(6 * 2 * 3, 10);
  b::Conv1dOptions o1;
  o1.stride = 2;
  o1.padding = 1;
  o1.dilation = 2;
  o1.groups = 2;
  const b::ConvOptions c1 = b::conv_options(o1),
                       c3 = b::conv_options(b::Conv3dOptions{{1, 1, 2}, {0, 0, 1}, {1, 1, 2}, 2});
  const TensorIr x1 = d.f64({2, 4, 7}, dtypes::f64, random_values(56, 11)),
                 x3 = d.f64({2, 4, 1, 1, 7}, dtypes::f64, d.f64_of(x1.id));
  const TensorIr w1 = d.f64({6, 2, 3}, dtypes::f64, cw), w3 = d.f64({6, 2, 1, 1, 3}, dtypes::f64, cw);
  const TensorIr g1 = d.f64({2, 6, 3}, dtypes::f64, gv), g3 = d.f64({2, 6, 1, 1, 3}, dtypes::f64, gv);
  EXPECT_EQ(d.f64_of(d.ok(b::conv_backward(K::Module_Conv1dXBackward, x1, w1, g1, c1, d.fresh()))),
            d.f64_of(d.ok(b::conv_backward(K::Module_Conv3dXBackward, x3, w3, g3, c3, d.fresh()))));
  EXPECT_EQ(d.f64_of(d.ok(b::conv_backward(K::Module_Conv1dWeightBackward, x1, w1, g1, c1, d.fresh()))),
            d.f64_of(d.ok(b::conv_backward(K::Module_Conv3dWeightBackward, x3, w3, g3, c3, d.fresh()))));
  const TensorIr b6 = d.f64({6}, dtypes::f64, std::vector<double>(6, 0));
  EXPECT_EQ(d.f64_of(d.ok(b::conv_bias_backward(K::Module_Conv1dBiasBackward, x1, b6, g1, d.fresh()))),
            d.f64_of(d.ok(b::conv_bias_backward(K::Module_Conv3dBiasBackward, x3, b6, g3, d.fresh()))));
}

// ---- The transposed convolution is the adjoint of the convolution with the same weight and
// options: <conv(x), y> == <x, conv_transpose(y)>, padding_out making the shapes meet.

struct AdjointCase {
  K conv, transposed;
  Shape xs, ws, ys;
  b::ConvOptions conv_options, transposed_options;
};

void expect_adjoint(const AdjointCase& a) {
  Device d;
  const std::vector<double> xv = random_values(count(a.xs), 21), wv = random_values(count(a.ws), 22);
  const std::vector<double> yv = random_values(count(a.ys), 23);
  const TensorIr w = d.f64(a.ws, dtypes::f64, wv);
  const TensorId cx = d.ok(b::conv(a.conv, d.f64(a.xs, dtypes::f64, xv), w, std::nullopt, a.conv_options, d.fresh()));
  ASSERT_EQ(d.shape_of(cx), a.ys);
  const TensorId ty = d.ok(
      b::conv_transpose(a.transposed, d.f64(a.ys, dtypes::f64, yv), w, std::nullopt, a.transposed_options, d.fresh()));
  ASSERT_EQ(d.shape_of(ty), a.xs);
  EXPECT_NEAR(dot(d.f64_of(cx), yv), dot(xv, d.f64_of(ty)), 1e-12);
}

TEST(ReferenceConvNdTest, ConvTransposeIsTheAdjointOfConvInEveryRank) {
  // 1-d, depthwise with multiplier 2: (9 + 4 − 3) / 3 + 1 = 4; back (4 − 1)·3 + 3 − 4 + 1 = 9.
  expect_adjoint({K::Module_Conv1d,
                  K::Module_ConvTranspose1d,
                  {2, 3, 9},
                  {6, 1, 3},
                  {2, 6, 4},
                  b::ConvOptions{{3}, {2}, {}, {1}, 3},
                  b::ConvOptions{{3}, {2}, {1}, {1}, 3}});
  // 2-d, 2 groups: height (7 + 2 − 4 − 1) / 2 + 1 = 3, width (6 − 2) / 3 + 1 = 2; back 7 and 5 + 1.
  expect_adjoint({K::Module_Conv2d,
                  K::Module_ConvTranspose2d,
                  {2, 4, 7, 6},
                  {6, 2, 3, 2},
                  {2, 6, 3, 2},
                  b::ConvOptions{{2, 3}, {1, 0}, {}, {2, 1}, 2},
                  b::ConvOptions{{2, 3}, {1, 0}, {0, 1}, {2, 1}, 2}});
  // 3-d, 2 groups: depth (5 − 2) / 2 + 1 = 2, height 5, width 1; back 4 + 1, 4, 3.
  expect_adjoint({K::Module_Conv3d,
                  K::Module_ConvTranspose3d,
                  {1, 2, 5, 4, 3},
                  {4, 1, 2, 2, 2},
                  {1, 4, 2, 5, 1},
                  b::ConvOptions{{2, 1, 1}, {0, 1, 0}, {}, {1, 1, 2}, 2},
                  b::ConvOptions{{2, 1, 1}, {0, 1, 0}, {1, 0, 0}, {1, 1, 2}, 2}});
}

// ---- Gradients by central differences: with L = Σ c · forward(x, w, b), the gradient kinds of c
// are ∂L/∂x (convolutions only: the spec has no transposed X gradient), ∂L/∂w and ∂L/∂b. L is
// linear in each variable, so the differences are exact up to rounding.

struct GradientCase {
  K forward;
  std::optional<K> x_grad;
  K weight_grad, bias_grad;
  Shape xs, ws, cs;
  b::ConvOptions options;
};

// The three gradients of c (output_grad) from the executor; the X gradient empty for a transposed forward.
std::vector<std::vector<double>> gradients(Device& d, const GradientCase& g, const std::vector<double>& xv,
                                           const std::vector<double>& wv, const std::vector<double>& cv) {
  const bool transposed = b::conv_kind_info(g.forward)->transposed;
  const TensorIr x = d.f64(g.xs, dtypes::f64, xv), w = d.f64(g.ws, dtypes::f64, wv);
  const TensorIr c = d.f64(g.cs, dtypes::f64, cv), bias = d.f64({g.cs[1]}, dtypes::f64, std::vector<double>(g.cs[1]));
  std::vector<std::vector<double>> out(3);
  if (g.x_grad) out[0] = d.f64_of(d.ok(b::conv_backward(*g.x_grad, x, w, c, g.options, d.fresh())));
  out[1] = d.f64_of(d.ok(transposed ? b::conv_transpose_backward(g.weight_grad, x, w, c, g.options, d.fresh())
                                    : b::conv_backward(g.weight_grad, x, w, c, g.options, d.fresh())));
  out[2] = d.f64_of(d.ok(b::conv_bias_backward(g.bias_grad, x, bias, c, d.fresh())));
  return out;
}

void expect_gradients(const GradientCase& g) {
  SCOPED_TRACE(op_info(g.forward).variant);
  Device d;
  std::vector<double> xv = random_values(count(g.xs), 31), wv = random_values(count(g.ws), 32);
  std::vector<double> bv = random_values(g.cs[1], 33);
  const std::vector<double> cv = random_values(count(g.cs), 34);
  const bool transposed = b::conv_kind_info(g.forward)->transposed;
  auto loss = [&] {
    const TensorIr x = d.f64(g.xs, dtypes::f64, xv), w = d.f64(g.ws, dtypes::f64, wv);
    const TensorIr bias = d.f64({g.cs[1]}, dtypes::f64, bv);
    const TensorId o = d.ok(transposed ? b::conv_transpose(g.forward, x, w, bias, g.options, d.fresh())
                                       : b::conv(g.forward, x, w, bias, g.options, d.fresh()));
    EXPECT_EQ(d.shape_of(o), g.cs);
    return dot(d.f64_of(o), cv);
  };
  const std::vector<std::vector<double>> grads = gradients(d, g, xv, wv, cv);
  ASSERT_EQ(grads[0].size(), g.x_grad ? xv.size() : 0u);
  ASSERT_EQ(grads[1].size(), wv.size());
  ASSERT_EQ(grads[2].size(), bv.size());
  for (std::size_t k = 0; k < grads[0].size(); ++k)
    EXPECT_NEAR(central_difference(xv, k, loss), grads[0][k], 1e-9) << "x " << k;
  for (std::size_t k = 0; k < wv.size(); ++k)
    EXPECT_NEAR(central_difference(wv, k, loss), grads[1][k], 1e-9) << "w " << k;
  for (std::size_t k = 0; k < bv.size(); ++k)
    EXPECT_NEAR(central_difference(bv, k, loss), grads[2][k], 1e-9) << "b " << k;
}

TEST(ReferenceConvNdTest, ConvGradientsAreTheGradientsOfConv) {
  // 1-d: (6 + 2 − 3) / 2 + 1 = 3. 2-d: (4 + 2 − 3) + 1 = 4, (5 − 2) / 2 + 1 = 2. 3-d: 1, 5, 3.
  expect_gradients({K::Module_Conv1d,
                    K::Module_Conv1dXBackward,
                    K::Module_Conv1dWeightBackward,
                    K::Module_Conv1dBiasBackward,
                    {2, 4, 6},
                    {4, 2, 2},
                    {2, 4, 3},
                    b::ConvOptions{{2}, {1}, {}, {2}, 2}});
  expect_gradients({K::Module_Conv2d,
                    K::Module_Conv2dXBackward,
                    K::Module_Conv2dWeightBackward,
                    K::Module_Conv2dBiasBackward,
                    {1, 4, 4, 5},
                    {2, 2, 2, 2},
                    {1, 2, 4, 2},
                    b::ConvOptions{{1, 2}, {1, 0}, {}, {2, 1}, 2}});
  expect_gradients({K::Module_Conv3d,
                    K::Module_Conv3dXBackward,
                    K::Module_Conv3dWeightBackward,
                    K::Module_Conv3dBiasBackward,
                    {1, 2, 3, 3, 4},
                    {2, 1, 2, 1, 2},
                    {1, 2, 1, 5, 3},
                    b::ConvOptions{{1, 1, 2}, {0, 1, 1}, {}, {2, 1, 1}, 2}});
}

TEST(ReferenceConvNdTest, ConvTransposeGradientsAreTheGradientsOfConvTranspose) {
  // 1-d: (3 − 1)·2 + 2·1 + 1 + 1 − 2 = 6. 2-d: 7 and 4. 3-d: 3, 3, 2.
  expect_gradients({K::Module_ConvTranspose1d,
                    std::nullopt,
                    K::Module_ConvTranspose1dWeightBackward,
                    K::Module_ConvTranspose1dBiasBackward,
                    {2, 4, 3},
                    {4, 1, 2},
                    {2, 2, 6},
                    b::ConvOptions{{2}, {1}, {1}, {2}, 2}});
  expect_gradients({K::Module_ConvTranspose2d,
                    std::nullopt,
                    K::Module_ConvTranspose2dWeightBackward,
                    K::Module_ConvTranspose2dBiasBackward,
                    {1, 2, 3, 2},
                    {2, 2, 2, 3},
                    {1, 2, 7, 4},
                    b::ConvOptions{{2, 1}, {0, 1}, {1, 0}, {1, 2}, 1}});
  expect_gradients({K::Module_ConvTranspose3d,
                    std::nullopt,
                    K::Module_ConvTranspose3dWeightBackward,
                    K::Module_ConvTranspose3dBiasBackward,
                    {1, 2, 2, 2, 2},
                    {2, 1, 2, 2, 1},
                    {1, 2, 3, 3, 2},
                    b::ConvOptions{{2, 1, 1}, {1, 0, 0}, {1, 0, 0}, {1, 1, 1}, 2}});
}

// ---- Hand-made ops: what the builders guarantee, forced wrong, is an error that claims the output.

// A valid op of every convolution kind: op_samples.h's (x [1, 4, 3...], 2 groups, kernel 2,
// padding 1; transposed stride 2 and padding_out 1), in f32.
Operation conv_op(Device& d, K k) {
  Result<Operation> r = samples::conv_sample(d, k, dtypes::f32, d.fresh());
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().to_string());
  return r.ok() ? *r : Operation{};
}

std::vector<K> conv_kinds() {
  std::vector<K> kinds;
  for (int i = 0; i < kNumOpKinds; ++i)
    if (b::conv_kind_info(static_cast<K>(i))) kinds.push_back(static_cast<K>(i));
  return kinds;
}

// Runs `op` with a fresh output id: either it succeeds with the output the IR claims, or it fails
// and the output is claimed by the error. Returns whether it succeeded.
bool run_claimed(Device& d, Operation op) {
  op.tensors.back().id = d.fresh();
  const Status st = d.exec.execute(op, d.handles);
  if (st.ok()) {
    const HostTensor* h = d.handles.get_handle_ref(op.outputs()[0].id);
    EXPECT_NE(h, nullptr) << op.to_string();
    if (h) {
      EXPECT_EQ(h->shape(), op.outputs()[0].shape);
    }
  } else {
    EXPECT_TRUE(d.handles.entry(op.outputs()[0].id)->is_errored()) << op.to_string();
  }
  return st.ok();
}

TEST(ReferenceConvNdTest, EveryKindRunsAndSurvivesEveryForcedAttribute) {
  Device d;
  const std::vector<K> kinds = conv_kinds();
  ASSERT_EQ(kinds.size(), 21u);
  for (K k : kinds) {
    SCOPED_TRACE(op_info(k).variant);
    const Operation op = conv_op(d, k);
    EXPECT_TRUE(run_claimed(d, op));
    for (std::size_t i = 0; i < op.attrs.size(); ++i)
      for (std::int64_t v : {std::int64_t{0}, std::int64_t{-1}, std::int64_t{1} << 62, std::int64_t{3}}) {
        Operation bad = op;
        bad.attrs[i] = v;
        (void)run_claimed(d, bad);  // only values that keep the output shape succeed
      }
    // One attribute more or fewer than the rank takes (a Conv2d's list read as a Conv3d's ...).
    Operation more = op;
    more.attrs.push_back(1);
    if (more.validate().ok()) {
      EXPECT_FALSE(run_claimed(d, more));
    }
    Operation fewer = op;
    if (!fewer.attrs.empty()) {
      fewer.attrs.pop_back();
      if (fewer.validate().ok()) {
        EXPECT_FALSE(run_claimed(d, fewer));
      }
    }
  }
}

// Named errors for the checks the kernels make again.
TEST(ReferenceConvNdTest, ForcedBadConvolutionsAreNamedErrors) {
  Device d;
  auto expect_error = [&](Operation op, ErrorCode code, const std::string& what) {
    op.tensors.back().id = d.fresh();
    const Status st = d.exec.execute(op, d.handles);
    ASSERT_FALSE(st.ok()) << op.to_string();
    EXPECT_EQ(st.error().code, code) << st.error().to_string();
    EXPECT_NE(st.error().message.find(what), std::string::npos) << st.error().message;
    EXPECT_TRUE(d.handles.entry(op.outputs()[0].id)->is_errored());
  };
  // A Conv1d relabelled Conv3d: the attribute count and the ranks no longer fit.
  Operation c1 = conv_op(d, K::Module_Conv1d);
  Operation bad = c1;
  bad.kind = K::Module_Conv3d;
  expect_error(bad, ErrorCode::Invalid, "Module::Conv3d: takes 10 attributes for 3 spatial dims, got 4");
  bad = c1;
  bad.attrs[1] = -2;  // padding
  expect_error(bad, ErrorCode::Invalid, "padding must not be negative, got -2");
  bad = c1;
  bad.tensors[1] = d.f64({6, 3, 2}, dtypes::f32, random_values(36, 1));  // 3 channels per group, x has 2
  expect_error(bad, ErrorCode::IncompatibleShapes, "do not fit 2 groups");
  bad = c1;
  bad.tensors[2] = d.f64({4}, dtypes::f32, random_values(4, 2));
  expect_error(bad, ErrorCode::IncompatibleShapes, "bias");
  bad = c1;
  bad.outputs()[0].shape = {1, 6, 5};
  expect_error(bad, ErrorCode::IncompatibleShapes, "does not have the shape");
  // padding_out must stay below max(stride, dilation) = 2.
  Operation t2 = conv_op(d, K::Module_ConvTranspose2d);
  bad = t2;
  bad.attrs[4] = 2;  // padding_out of dim 0
  expect_error(bad, ErrorCode::Invalid, "padding_out 2 must be smaller");
  // The gradients: output_grad of another shape, an integer weight, a bias of other channels.
  Operation gw = conv_op(d, K::Module_Conv2dWeightBackward);
  bad = gw;
  bad.tensors[2] = d.f64({1, 6, 3, 4}, dtypes::f32, random_values(72, 3));
  expect_error(bad, ErrorCode::IncompatibleShapes, "must have the forward's output shape [1,6,4,4]");
  bad = gw;
  bad.tensors[1] = d.i64({6, 2, 2, 2}, dtypes::i32, std::vector<std::int64_t>(48, 1));
  expect_error(bad, ErrorCode::DTypeMismatch, "weight");
  bad = gw;
  bad.outputs()[0].dtype = dtypes::f64;  // output_grad is f32
  expect_error(bad, ErrorCode::DTypeMismatch, "dtype");
  Operation gb = conv_op(d, K::Module_ConvTranspose3dBiasBackward);
  bad = gb;
  bad.tensors[1] = d.f64({5}, dtypes::f32, random_values(5, 4));
  expect_error(bad, ErrorCode::IncompatibleShapes, "do not fit");
  bad = gb;
  bad.tensors[0] = d.f64({1, 4, 3}, dtypes::f32, random_values(12, 5));  // rank 3 for a 3-d kind
  expect_error(bad, ErrorCode::RankMismatch, "x");
}

}  // namespace
}  // namespace kiln::reference::testing
