// Reference executor: matmul, conv2d, conv_transpose1d, max_pool2d, avg_pool2d, embedding, and the
// dense layers, norms and embedding gradient (linear and its backwards, layer_norm, batch_norm,
// embedding_backward).
#include <cstring>
#include <random>

#include "kiln/testing/status.h"
#include "reference_test_util.h"

namespace kiln::reference::testing {
namespace {

using F = Family;
using K = OpKind;

// ---- Matmul

TEST(ReferenceMatmulTest, BatchedWithBroadcastBatchDims) {
  Device d;
  const TensorIr a = d.f64({2, 2, 3}, dtypes::f32, {1, 2, 3, 4, 5, 6, 1, 0, 0, 0, 1, 0});
  const TensorIr c = d.f64({1, 3, 2}, dtypes::f32, {1, 2, 3, 4, 5, 6});
  const TensorId m = d.ok(b::matmul(F::Float, K::Float_Matmul, a, c, d.fresh()));
  EXPECT_EQ(d.shape_of(m), (Shape{2, 2, 2}));
  EXPECT_EQ(d.f64_of(m), (std::vector<double>{22, 28, 49, 64, 1, 2, 3, 4}));
}

TEST(ReferenceMatmulTest, AccumulatesInF64AndMixesFloatDtypes) {
  Device d;
  const TensorIr a = d.f64({1, 3}, dtypes::f32, {16777216, 1, 1});
  const TensorIr c = d.f64({3, 1}, dtypes::f32, {1, 1, 1});
  EXPECT_EQ(d.f64_of(d.ok(b::matmul(F::Float, K::Float_Matmul, a, c, d.fresh()))), (std::vector<double>{16777218}));
  const TensorIr h = d.f64({1, 2}, dtypes::f16, {1, 2});
  const TensorIr w = d.f64({2, 1}, dtypes::f32, {0.5, 0.25});
  const TensorId m = d.ok(b::matmul(F::Float, K::Float_Matmul, h, w, d.fresh()));
  EXPECT_EQ(d.tensor(m).dtype(), dtypes::f16);
  EXPECT_EQ(d.f64_of(m), (std::vector<double>{1}));
  const TensorIr e1 = d.f64({2, 0}, dtypes::f64, {});
  const TensorIr e2 = d.f64({0, 3}, dtypes::f64, {});
  EXPECT_EQ(d.f64_of(d.ok(b::matmul(F::Float, K::Float_Matmul, e1, e2, d.fresh()))),
            (std::vector<double>{0, 0, 0, 0, 0, 0}));
}

TEST(ReferenceMatmulTest, IntegerMatmulWraps) {
  Device d;
  const TensorIr a = d.i64({1, 2}, dtypes::i8, {100, 100});
  const TensorIr c = d.i64({2, 1}, dtypes::i8, {1, 1});
  EXPECT_EQ(d.i64_of(d.ok(b::matmul(F::Int, K::Int_Matmul, a, c, d.fresh()))), (std::vector<std::int64_t>{-56}));
  const TensorIr u = d.u64({2, 2}, dtypes::u32, {1, 2, 3, 4});
  EXPECT_EQ(d.u64_of(d.ok(b::matmul(F::Int, K::Int_Matmul, u, u, d.fresh()))),
            (std::vector<std::uint64_t>{7, 10, 15, 22}));
}

// ---- Conv2d

TEST(ReferenceConvTest, Conv2dStridePaddingDilationBias) {
  Device d;
  const TensorIr x = d.f64({1, 1, 3, 3}, dtypes::f32, iota1(9));
  const TensorIr w = d.f64({1, 1, 2, 2}, dtypes::f32, {1, 0, 0, 1});
  EXPECT_EQ(d.f64_of(d.ok(b::conv2d(x, w, std::nullopt, {}, d.fresh()))), (std::vector<double>{6, 8, 12, 14}));
  b::Conv2dOptions o;
  o.stride = {2, 2};
  o.padding = {1, 1};
  EXPECT_EQ(d.f64_of(d.ok(b::conv2d(x, w, std::nullopt, o, d.fresh()))), (std::vector<double>{1, 3, 7, 14}));
  const TensorIr bias = d.f64({1}, dtypes::f32, {10});
  EXPECT_EQ(d.f64_of(d.ok(b::conv2d(x, w, bias, o, d.fresh()))), (std::vector<double>{11, 13, 17, 24}));
  b::Conv2dOptions dil;
  dil.dilation = {2, 2};
  const TensorId dd = d.ok(b::conv2d(x, w, std::nullopt, dil, d.fresh()));
  EXPECT_EQ(d.shape_of(dd), (Shape{1, 1, 1, 1}));
  EXPECT_EQ(d.f64_of(dd), (std::vector<double>{10}));
}

TEST(ReferenceConvTest, Conv2dGroups) {
  Device d;
  const TensorIr x = d.f64({1, 2, 2, 2}, dtypes::f64, iota1(8));
  const TensorIr w = d.f64({2, 1, 1, 1}, dtypes::f64, {2, 3});
  b::Conv2dOptions o;
  o.groups = 2;
  EXPECT_EQ(d.f64_of(d.ok(b::conv2d(x, w, std::nullopt, o, d.fresh()))),
            (std::vector<double>{2, 4, 6, 8, 15, 18, 21, 24}));
  // Two groups of two input channels, one output channel each: each output sums its own group.
  const TensorIr x4 = d.f64({1, 4, 1, 1}, dtypes::f64, {1, 2, 3, 4});
  const TensorIr w4 = d.f64({2, 2, 1, 1}, dtypes::f64, {1, 10, 100, 1000});
  EXPECT_EQ(d.f64_of(d.ok(b::conv2d(x4, w4, std::nullopt, o, d.fresh()))), (std::vector<double>{21, 4300}));
}

// conv_transpose1d is the adjoint of the 1-d convolution with the same options:
// <conv(v), u> == <conv_transpose(u), v>. Checked against conv2d with a height of 1.
TEST(ReferenceConvTest, ConvTranspose1dIsTheAdjointOfConv) {
  Device d;
  const std::uint64_t N = 2, Cf_in = 4, Cf_out = 6, G = 2, Kk = 3, L_in = 11;
  const std::vector<double> wv = random_values(Cf_out * (Cf_in / G) * Kk, 1);
  const std::vector<double> vv = random_values(N * Cf_in * L_in, 2);
  const TensorIr v = d.f64({N, Cf_in, 1, L_in}, dtypes::f64, vv);
  const TensorIr w2 = d.f64({Cf_out, Cf_in / G, 1, Kk}, dtypes::f64, wv);
  b::Conv2dOptions o;
  o.stride = {1, 2};
  o.padding = {0, 1};
  o.dilation = {1, 2};
  o.groups = G;
  const TensorId conv = d.ok(b::conv2d(v, w2, std::nullopt, o, d.fresh()));
  ASSERT_EQ(d.shape_of(conv), (Shape{N, Cf_out, 1, 5}));
  const std::vector<double> uv = random_values(N * Cf_out * 5, 3);
  const TensorIr u = d.f64({N, Cf_out, 5}, dtypes::f64, uv);
  const TensorIr w1 = d.f64({Cf_out, Cf_in / G, Kk}, dtypes::f64, wv);
  b::ConvTranspose1dOptions t;
  t.stride = 2;
  t.padding = 1;
  t.dilation = 2;
  t.groups = G;
  const TensorId tr = d.ok(b::conv_transpose1d(u, w1, std::nullopt, t, d.fresh()));
  ASSERT_EQ(d.shape_of(tr), (Shape{N, Cf_in, L_in}));
  EXPECT_NEAR(dot(d.f64_of(conv), uv), dot(d.f64_of(tr), vv), 1e-12);
}

TEST(ReferenceConvTest, ConvTranspose1dByHand) {
  Device d;
  const TensorIr x = d.f64({1, 1, 3}, dtypes::f32, {1, 2, 3});
  const TensorIr w = d.f64({1, 1, 2}, dtypes::f32, {1, 10});
  b::ConvTranspose1dOptions o;
  o.stride = 2;
  EXPECT_EQ(d.f64_of(d.ok(b::conv_transpose1d(x, w, std::nullopt, o, d.fresh()))),
            (std::vector<double>{1, 10, 2, 20, 3, 30}));
  o.padding = 1;
  EXPECT_EQ(d.f64_of(d.ok(b::conv_transpose1d(x, w, std::nullopt, o, d.fresh()))), (std::vector<double>{10, 2, 20, 3}));
  o.padding = 0;
  o.padding_out = 1;
  const TensorIr bias = d.f64({1}, dtypes::f32, {0.5});
  EXPECT_EQ(d.f64_of(d.ok(b::conv_transpose1d(x, w, bias, o, d.fresh()))),
            (std::vector<double>{1.5, 10.5, 2.5, 20.5, 3.5, 30.5, 0.5}));
}

// ---- Pools

TEST(ReferencePoolTest, MaxPool2d) {
  Device d;
  const TensorIr x = d.f64({1, 1, 4, 4}, dtypes::f32, iota1(16));
  b::MaxPool2dOptions o;
  o.kernel = {2, 2};
  o.stride = {2, 2};
  EXPECT_EQ(d.f64_of(d.ok(b::max_pool2d(x, o, d.fresh()))), (std::vector<double>{6, 8, 14, 16}));
  o.padding = {1, 1};
  EXPECT_EQ(d.f64_of(d.ok(b::max_pool2d(x, o, d.fresh()))), (std::vector<double>{1, 3, 4, 9, 11, 12, 13, 15, 16}));
  b::MaxPool2dOptions dil;
  dil.kernel = {2, 2};
  dil.dilation = {2, 2};
  EXPECT_EQ(d.f64_of(d.ok(b::max_pool2d(x, dil, d.fresh()))), (std::vector<double>{11, 12, 15, 16}));
  const TensorIr x5 = d.f64({1, 1, 5, 5}, dtypes::f32, iota1(25));
  b::MaxPool2dOptions ceil;
  ceil.kernel = {2, 2};
  ceil.stride = {2, 2};
  ceil.ceil_mode = true;
  const TensorId c = d.ok(b::max_pool2d(x5, ceil, d.fresh()));
  EXPECT_EQ(d.shape_of(c), (Shape{1, 1, 3, 3}));
  EXPECT_EQ(d.f64_of(c), (std::vector<double>{7, 9, 10, 17, 19, 20, 22, 24, 25}));
}

TEST(ReferencePoolTest, MaxPoolPaddingIsMinusInfinityAndNanPropagates) {
  Device d;
  const TensorIr x = d.f64({1, 1, 2, 2}, dtypes::bf16, {-5, -5, -5, kNaN});
  b::MaxPool2dOptions o;
  o.kernel = {2, 2};
  o.stride = {2, 2};
  o.padding = {1, 1};
  EXPECT_THAT(d.f64_of(d.ok(b::max_pool2d(x, o, d.fresh()))), NanEq(std::vector<double>{-5, -5, -5, kNaN}));
}

TEST(ReferencePoolTest, AvgPool2dDivisors) {
  Device d;
  const TensorIr x = d.f64({1, 1, 4, 4}, dtypes::f64, iota1(16));
  b::AvgPool2dOptions o;
  o.kernel = {2, 2};
  o.stride = {2, 2};
  EXPECT_EQ(d.f64_of(d.ok(b::avg_pool2d(x, o, d.fresh()))), (std::vector<double>{3.5, 5.5, 11.5, 13.5}));
  o.padding = {1, 1};
  o.count_include_pad = true;
  EXPECT_EQ(d.f64_of(d.ok(b::avg_pool2d(x, o, d.fresh()))),
            (std::vector<double>{0.25, 1.25, 1, 3.5, 8.5, 5, 3.25, 7.25, 4}));
  o.count_include_pad = false;
  EXPECT_EQ(d.f64_of(d.ok(b::avg_pool2d(x, o, d.fresh()))), (std::vector<double>{1, 2.5, 4, 7, 8.5, 10, 13, 14.5, 16}));
  // Ceil mode: the last window sticks out past the (unpadded) input and is divided by what it
  // covers of the padded input (PyTorch).
  const TensorIr x5 = d.f64({1, 1, 5, 5}, dtypes::f64, iota1(25));
  b::AvgPool2dOptions c;
  c.kernel = {2, 2};
  c.stride = {2, 2};
  c.ceil_mode = true;
  c.count_include_pad = true;
  const std::vector<double> r = d.f64_of(d.ok(b::avg_pool2d(x5, c, d.fresh())));
  ASSERT_EQ(r.size(), 9u);
  EXPECT_EQ(r[0], 4);
  EXPECT_EQ(r[2], 7.5);
  EXPECT_EQ(r[8], 25);
}

// ---- Embedding

TEST(ReferenceEmbeddingTest, RowsByIndex) {
  Device d;
  const TensorIr w = d.f64({3, 2}, dtypes::f32, {0, 1, 10, 11, 20, 21});
  const TensorIr idx = d.i64({2, 2}, dtypes::i64, {2, 0, 1, 1});
  const TensorId e = d.ok(b::embedding(w, idx, d.fresh()));
  EXPECT_EQ(d.shape_of(e), (Shape{2, 2, 2}));
  EXPECT_EQ(d.f64_of(e), (std::vector<double>{20, 21, 0, 1, 10, 11, 10, 11}));
  const TensorIr oob = d.u64({1, 1}, dtypes::u32, {3});
  auto op = b::embedding(w, oob, d.fresh());
  Status st = d.run(op);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ErrorCode::OutOfBounds);
  EXPECT_TRUE(d.handles.entry(op->outputs()[0].id)->is_errored());
}

// ---- Attributes the builders guarantee, forced wrong: errors, never crashes.

TEST(ReferenceModuleTest, ForcedBadOptionsAreErrors) {
  Device d;
  const TensorIr x = d.f64({1, 2, 3, 3}, dtypes::f32, iota1(18));
  const TensorIr w = d.f64({2, 2, 2, 2}, dtypes::f32, iota1(16));
  auto op = b::conv2d(x, w, std::nullopt, {}, d.fresh());
  KILN_ASSERT_OK(op);
  for (std::size_t i = 0; i < op->attrs.size(); ++i) {
    for (std::int64_t v : {std::int64_t{0}, std::int64_t{-1}, std::int64_t{1} << 62, std::int64_t{3}}) {
      Operation bad = *op;
      bad.attrs[i] = v;
      bad.tensors.back().id = d.fresh();
      Status st = d.exec.execute(bad, d.handles);
      if (st.ok()) {
        // Only values that keep the output shape are accepted (e.g. padding 0 / dilation 1).
        EXPECT_TRUE(d.handles.get_handle_ref(bad.outputs()[0].id) != nullptr);
      } else {
        EXPECT_TRUE(d.handles.entry(bad.outputs()[0].id)->is_errored()) << i << " " << v;
      }
    }
  }
  auto pool = b::max_pool2d(x, {}, d.fresh());
  KILN_ASSERT_OK(pool);
  Operation bad = *pool;
  bad.attrs[8] = 2;  // ceil_mode must be a flag
  EXPECT_FALSE(d.exec.execute(bad, d.handles).ok());
}

// ---- Dense layers, norms and the embedding's gradient (docs/spec/ir.md §5.8): values computed here in
// double, and central differences showing the backwards are the gradients of the forwards.

// Linear by its definition: out[r, j] = Σ_i x[r, i] · w[i, j] + bias[j] (weight [d_in, d_out]).
std::vector<double> linear_by_hand(const std::vector<double>& x, const std::vector<double>& w,
                                   const std::vector<double>& bias, std::size_t d_in, std::size_t d_out) {
  std::vector<double> out;
  for (std::size_t r = 0; r < x.size() / d_in; ++r)
    for (std::size_t j = 0; j < d_out; ++j) {
      double acc = 0;
      for (std::size_t i = 0; i < d_in; ++i) acc += x[r * d_in + i] * w[i * d_out + j];
      out.push_back(acc + (bias.empty() ? 0.0 : bias[j]));
    }
  return out;
}

std::int64_t bits_of(double v) {
  std::int64_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

TEST(ReferenceDenseTest, LinearOverRank1To3WithAndWithoutBias) {
  Device d;
  const std::vector<double> wv{1, -2, 0.5, 3, -1, 2};  // [3, 2]: rows [1, -2], [0.5, 3], [-1, 2]
  const TensorIr w = d.f64({3, 2}, dtypes::f64, wv);
  const TensorIr bias = d.f64({2}, dtypes::f64, {0.25, -4});
  // [1, 2, 3] · w = [1 + 1 − 3, −2 + 6 + 6] = [−1, 10], plus the bias.
  const TensorId v = d.ok(b::linear(d.f64({3}, dtypes::f64, {1, 2, 3}), w, bias, d.fresh()));
  EXPECT_EQ(d.shape_of(v), (Shape{2}));
  EXPECT_EQ(d.f64_of(v), (std::vector<double>{-0.75, 6}));
  // Rank 2 without a bias: the second row [−1, 0, 4] · w = [−1 − 4, 2 + 8].
  const TensorId m = d.ok(b::linear(d.f64({2, 3}, dtypes::f64, {1, 2, 3, -1, 0, 4}), w, std::nullopt, d.fresh()));
  EXPECT_EQ(d.shape_of(m), (Shape{2, 2}));
  EXPECT_EQ(d.f64_of(m), (std::vector<double>{-1, 10, -5, 10}));
  // Rank 3 in f32 (halves and small integers: exact in f32 too): every leading dim is a row.
  std::vector<double> xv = iota1(12);
  for (double& e : xv) e *= 0.5;
  const TensorIr x3 = d.f64({2, 2, 3}, dtypes::f32, xv);
  const TensorId o3 =
      d.ok(b::linear(x3, d.f64({3, 2}, dtypes::f32, wv), d.f64({2}, dtypes::f32, {0.25, -4}), d.fresh()));
  EXPECT_EQ(d.shape_of(o3), (Shape{2, 2, 2}));
  EXPECT_EQ(d.tensor(o3).dtype(), dtypes::f32);
  EXPECT_EQ(d.f64_of(o3), linear_by_hand(xv, wv, {0.25, -4}, 3, 2));
  // No features in, or no rows: sums of nothing.
  const TensorId e = d.ok(b::linear(d.f64({2, 0}, dtypes::f64, {}), d.f64({0, 2}, dtypes::f64, {}),
                                    d.f64({2}, dtypes::f64, {1, 2}), d.fresh()));
  EXPECT_EQ(d.f64_of(e), (std::vector<double>{1, 2, 1, 2}));
  EXPECT_EQ(d.shape_of(d.ok(b::linear(d.f64({0, 3}, dtypes::f64, {}), w, bias, d.fresh()))), (Shape{0, 2}));
}

// x [2, 3] = [[1, 2, 3], [−1, 0, 4]], w as above, output_grad g [2, 2] = [[1, 2], [−1, 0.5]]:
// g · wᵀ, xᵀ · g and the column sums of g, by hand.
TEST(ReferenceDenseTest, LinearBackwardsByHand) {
  Device d;
  const TensorIr w = d.f64({3, 2}, dtypes::f64, {1, -2, 0.5, 3, -1, 2});
  const std::vector<double> xv{1, 2, 3, -1, 0, 4}, gv{1, 2, -1, 0.5};
  const TensorIr x = d.f64({2, 3}, dtypes::f64, xv);
  const TensorIr g = d.f64({2, 2}, dtypes::f64, gv);
  const TensorId gx = d.ok(b::linear_x_backward(w, g, d.fresh()));
  EXPECT_EQ(d.shape_of(gx), (Shape{2, 3}));
  EXPECT_EQ(d.f64_of(gx), (std::vector<double>{-3, 6.5, 3, -2, 1, 2}));
  const TensorId gw = d.ok(b::linear_weight_backward(x, g, d.fresh()));
  EXPECT_EQ(d.shape_of(gw), (Shape{3, 2}));
  EXPECT_EQ(d.f64_of(gw), (std::vector<double>{2, 1.5, 2, 4, -1, 8}));
  const TensorId gb = d.ok(b::linear_bias_backward(g, d.fresh()));
  EXPECT_EQ(d.shape_of(gb), (Shape{2}));
  EXPECT_EQ(d.f64_of(gb), (std::vector<double>{0, 2.5}));
  // The same rows with a batch dim: [2, 1, ·]; and rank 1 (one row: an outer product).
  const TensorIr x3 = d.f64({2, 1, 3}, dtypes::f64, xv);
  const TensorIr g3 = d.f64({2, 1, 2}, dtypes::f64, gv);
  EXPECT_EQ(d.shape_of(d.ok(b::linear_x_backward(w, g3, d.fresh()))), (Shape{2, 1, 3}));
  EXPECT_EQ(d.f64_of(d.ok(b::linear_weight_backward(x3, g3, d.fresh()))), (std::vector<double>{2, 1.5, 2, 4, -1, 8}));
  EXPECT_EQ(d.f64_of(d.ok(b::linear_bias_backward(g3, d.fresh()))), (std::vector<double>{0, 2.5}));
  const TensorIr x1 = d.f64({3}, dtypes::f32, {1, 2, 3});
  const TensorIr g1 = d.f64({2}, dtypes::f32, {1, -1});
  const TensorId outer = d.ok(b::linear_weight_backward(x1, g1, d.fresh()));
  EXPECT_EQ(d.tensor(outer).dtype(), dtypes::f32);
  EXPECT_EQ(d.f64_of(outer), (std::vector<double>{1, -1, 2, -2, 3, -3}));
  EXPECT_EQ(d.f64_of(d.ok(b::linear_bias_backward(g1, d.fresh()))), (std::vector<double>{1, -1}));
}

// With L = Σ c · linear(x, w, b), the backwards of c are ∂L/∂x, ∂L/∂w and ∂L/∂b: central
// differences of L (computed by the executor in f64) match them. L is linear in each variable, so
// the differences are exact up to rounding.
TEST(ReferenceDenseTest, LinearBackwardsAreTheGradientsOfLinear) {
  Device d;
  const Shape xs{2, 2, 3}, ws{3, 4}, cs{2, 2, 4};
  std::vector<double> xv = random_values(12, 1), wv = random_values(12, 2), bv = random_values(4, 3);
  const std::vector<double> cv = random_values(16, 4);
  auto loss = [&] {
    const TensorId o =
        d.ok(b::linear(d.f64(xs, dtypes::f64, xv), d.f64(ws, dtypes::f64, wv), d.f64({4}, dtypes::f64, bv), d.fresh()));
    return dot(d.f64_of(o), cv);
  };
  const TensorIr c = d.f64(cs, dtypes::f64, cv);
  const std::vector<double> gx = d.f64_of(d.ok(b::linear_x_backward(d.f64(ws, dtypes::f64, wv), c, d.fresh())));
  const std::vector<double> gw = d.f64_of(d.ok(b::linear_weight_backward(d.f64(xs, dtypes::f64, xv), c, d.fresh())));
  const std::vector<double> gb = d.f64_of(d.ok(b::linear_bias_backward(c, d.fresh())));
  ASSERT_EQ(gx.size(), xv.size());
  ASSERT_EQ(gw.size(), wv.size());
  ASSERT_EQ(gb.size(), bv.size());
  for (std::size_t k = 0; k < xv.size(); ++k) EXPECT_NEAR(central_difference(xv, k, loss), gx[k], 1e-9) << "x " << k;
  for (std::size_t k = 0; k < wv.size(); ++k) EXPECT_NEAR(central_difference(wv, k, loss), gw[k], 1e-9) << "w " << k;
  for (std::size_t k = 0; k < bv.size(); ++k) EXPECT_NEAR(central_difference(bv, k, loss), gb[k], 1e-9) << "b " << k;
}

// The same for the embedding: with L = Σ c · embedding(w, indices), EmbeddingBackward(w, c,
// indices) is ∂L/∂w; an index used three times sums three rows of c, a row never used gets 0.
TEST(ReferenceDenseTest, EmbeddingBackwardIsTheGradientOfEmbedding) {
  Device d;
  std::vector<double> wv = random_values(15, 5);        // [5, 3]
  const std::vector<double> cv = random_values(18, 6);  // [2, 3, 3]
  const TensorIr idx = d.i64({2, 3}, dtypes::i64, {4, 0, 4, 1, 4, 2});
  auto loss = [&] { return dot(d.f64_of(d.ok(b::embedding(d.f64({5, 3}, dtypes::f64, wv), idx, d.fresh()))), cv); };
  const TensorIr c = d.f64({2, 3, 3}, dtypes::f64, cv);
  const std::vector<double> g =
      d.f64_of(d.ok(b::embedding_backward(d.f64({5, 3}, dtypes::f64, wv), c, idx, d.fresh())));
  ASSERT_EQ(g.size(), wv.size());
  for (std::size_t k = 0; k < wv.size(); ++k) EXPECT_NEAR(central_difference(wv, k, loss), g[k], 1e-9) << k;
  for (std::size_t e = 0; e < 3; ++e) {
    EXPECT_EQ(g[3 * 3 + e], 0.0) << "row 3 is never looked up";
    EXPECT_DOUBLE_EQ(g[4 * 3 + e], cv[0 * 3 + e] + cv[2 * 3 + e] + cv[4 * 3 + e]);
  }
}

TEST(ReferenceDenseTest, EmbeddingBackwardAccumulatesDuplicatesAndRefusesBadIndices) {
  Device d;
  const TensorIr w = d.f64({4, 2}, dtypes::f32, iota1(8));
  const TensorIr g = d.f64({1, 3, 2}, dtypes::f32, {1, 2, 10, 20, 100, 200});
  const TensorId o = d.ok(b::embedding_backward(w, g, d.i64({1, 3}, dtypes::i32, {2, 0, 2}), d.fresh()));
  EXPECT_EQ(d.shape_of(o), (Shape{4, 2}));
  EXPECT_EQ(d.tensor(o).dtype(), dtypes::f32);
  EXPECT_EQ(d.f64_of(o), (std::vector<double>{10, 20, 0, 0, 101, 202, 0, 0}));
  EXPECT_EQ(d.f64_of(d.ok(b::embedding_backward(w, g, d.u64({1, 3}, dtypes::u8, {3, 3, 3}), d.fresh()))),
            (std::vector<double>{0, 0, 0, 0, 0, 0, 111, 222}));
  // An index outside [0, V) is an error value that claims the output, never a write out of bounds.
  for (std::int64_t bad : {std::int64_t{4}, std::int64_t{-1}}) {
    auto op = b::embedding_backward(w, g, d.i64({1, 3}, dtypes::i64, {0, bad, 1}), d.fresh());
    Status st = d.run(op);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.error().code, ErrorCode::OutOfBounds);
    EXPECT_NE(st.error().message.find("Module::EmbeddingBackward"), std::string::npos) << st.error().message;
    EXPECT_NE(st.error().message.find("(element 1)"), std::string::npos) << st.error().message;
    EXPECT_TRUE(d.handles.entry(op->outputs()[0].id)->is_errored());
  }
}

// Layer norm by its definition: per row of the last dim, (x − mean) / sqrt(var + eps) · gamma + beta,
// var the biased variance (Burn, PyTorch).
std::vector<double> layer_norm_by_hand(const std::vector<double>& x, const std::vector<double>& gamma,
                                       const std::vector<double>& beta, double eps) {
  const std::size_t n = gamma.size();
  std::vector<double> out;
  for (std::size_t r = 0; r < x.size() / n; ++r) {
    double mean = 0, var = 0;
    for (std::size_t i = 0; i < n; ++i) mean += x[r * n + i] / static_cast<double>(n);
    for (std::size_t i = 0; i < n; ++i) var += (x[r * n + i] - mean) * (x[r * n + i] - mean) / static_cast<double>(n);
    for (std::size_t i = 0; i < n; ++i)
      out.push_back((x[r * n + i] - mean) / std::sqrt(var + eps) * gamma[i] + (beta.empty() ? 0.0 : beta[i]));
  }
  return out;
}

// With the row statistics (K): the same output, and per row the mean and 1 / sqrt(var + eps);
// [2, 3]: rows [1, 2, 4] (mean 7/3, variance 14/9) and [2, 2, 2] (mean 2, variance 0: 1/sqrt(eps)).
TEST(ReferenceDenseTest, LayerNormWithItsRowStatistics) {
  Device d;
  const std::vector<double> xv{1, 2, 4, 2, 2, 2}, gv{1, 2, 0.5};
  const TensorIr x = d.f64({2, 3}, dtypes::f64, xv), gamma = d.f64({3}, dtypes::f64, gv);
  const Result<Operation> op = b::layer_norm_with_stats(x, gamma, std::nullopt, 1e-5, d.fresh(), d.fresh(), d.fresh());
  ASSERT_TRUE(op.ok()) << op.error().to_string();
  KILN_ASSERT_OK(d.exec.execute(*op, d.handles));
  EXPECT_THAT(d.f64_of(op->outputs()[0].id), Near(layer_norm_by_hand(xv, gv, {}, 1e-5), 1e-14));
  EXPECT_THAT(d.f64_of(op->outputs()[1].id), Near(std::vector<double>{7.0 / 3, 2}, 1e-15));
  EXPECT_THAT(d.f64_of(op->outputs()[2].id),
              Near(std::vector<double>{1 / std::sqrt(14.0 / 9 + 1e-5), 1 / std::sqrt(1e-5)}, 1e-12));
  // Two outputs is no form of the op: an error naming the counts.
  Operation two = *op;
  two.tensors.pop_back();
  const Status st = d.exec.execute(two, d.handles);
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(st.error().message, ::testing::HasSubstr("takes 1 or 3 outputs"));
}

TEST(ReferenceDenseTest, LayerNormWithAndWithoutBeta) {
  Device d;
  // [1, 2, 3]: mean 2, biased variance 2/3; epsilon 0 and gamma 1 give ±sqrt(3/2), 0.
  const TensorIr ones = d.f64({3}, dtypes::f64, {1, 1, 1});
  const TensorId plain = d.ok(b::layer_norm(d.f64({3}, dtypes::f64, {1, 2, 3}), ones, std::nullopt, 0.0, d.fresh()));
  EXPECT_THAT(d.f64_of(plain), Near(std::vector<double>{-std::sqrt(1.5), 0, std::sqrt(1.5)}, 1e-15));
  // [2, 3] with gamma and beta; the second row is constant: its variance is 0, so it gives beta.
  const std::vector<double> xv{1, 2, 4, 2, 2, 2}, gv{1, 2, 0.5}, bv{0.1, -0.2, 0.3};
  const TensorIr x = d.f64({2, 3}, dtypes::f64, xv);
  const TensorIr gamma = d.f64({3}, dtypes::f64, gv);
  const TensorIr beta = d.f64({3}, dtypes::f64, bv);
  const std::vector<double> with = d.f64_of(d.ok(b::layer_norm(x, gamma, beta, 1e-5, d.fresh())));
  EXPECT_THAT(with, Near(layer_norm_by_hand(xv, gv, bv, 1e-5), 1e-14));
  EXPECT_THAT(std::vector<double>(with.begin() + 3, with.end()), Near(bv, 1e-15));
  const std::vector<double> without = d.f64_of(d.ok(b::layer_norm(x, gamma, std::nullopt, 1e-5, d.fresh())));
  EXPECT_THAT(without, Near(layer_norm_by_hand(xv, gv, {}, 1e-5), 1e-14));
  // Rank 3 in f32: only the last dim is normalised; the inputs are read back as f32 rounded them.
  const TensorIr x3 = d.f64({2, 2, 2}, dtypes::f32, random_values(8, 7));
  const TensorIr g3 = d.f64({2}, dtypes::f32, {1.5, -0.5});
  const TensorId o3 = d.ok(b::layer_norm(x3, g3, std::nullopt, 1e-3, d.fresh()));
  EXPECT_EQ(d.shape_of(o3), (Shape{2, 2, 2}));
  EXPECT_EQ(d.tensor(o3).dtype(), dtypes::f32);
  EXPECT_THAT(d.f64_of(o3), Near(layer_norm_by_hand(d.f64_of(x3.id), d.f64_of(g3.id), {}, 1e-3), 1e-6));
}

TEST(ReferenceDenseTest, BatchNormOverChannelDimOne) {
  Device d;
  // [N, C] = [4, 2]: channel 0 (x − 4) / 2 · 2 + 0, channel 1 (x − 5) / 1 · 1 + 1; epsilon 0.
  const TensorIr x2 = d.f64({4, 2}, dtypes::f64, {1, 2, 3, 4, 5, 6, 7, 8});
  auto vec = [&](std::vector<double> v) { return d.f64({2}, dtypes::f64, std::move(v)); };
  const TensorId o2 = d.ok(b::batch_norm(x2, vec({2, 1}), vec({0, 1}), vec({4, 5}), vec({4, 1}), 0.0, d.fresh()));
  EXPECT_EQ(d.f64_of(o2), (std::vector<double>{-3, -2, -1, 0, 1, 2, 3, 4}));
  // [N, C, H, W] = [2, 3, 2, 2] with running statistics, by the definition per element.
  const std::vector<double> xv = random_values(24, 8);
  const std::vector<double> gamma{1.5, -1, 0.5}, beta{0, 0.25, -2}, mean{0.1, -0.3, 0.2}, var{0.5, 2, 0.04};
  auto chan = [&](const std::vector<double>& v) { return d.f64({3}, dtypes::f64, v); };
  const TensorId o4 = d.ok(b::batch_norm(d.f64({2, 3, 2, 2}, dtypes::f64, xv), chan(gamma), chan(beta), chan(mean),
                                         chan(var), 1e-3, d.fresh()));
  std::vector<double> want;
  for (std::size_t k = 0; k < xv.size(); ++k) {
    const std::size_t c = (k / 4) % 3;
    want.push_back((xv[k] - mean[c]) / std::sqrt(var[c] + 1e-3) * gamma[c] + beta[c]);
  }
  EXPECT_EQ(d.shape_of(o4), (Shape{2, 3, 2, 2}));
  EXPECT_THAT(d.f64_of(o4), Near(want, 1e-14));
  // f16 operands: one rounding of the f64 result.
  const TensorIr h = d.f64({1, 2}, dtypes::f16, {3, -1});
  auto half = [&](std::vector<double> v) { return d.f64({2}, dtypes::f16, std::move(v)); };
  const TensorId oh = d.ok(b::batch_norm(h, half({1, 1}), half({0, 0}), half({1, 1}), half({4, 1}), 0.0, d.fresh()));
  EXPECT_EQ(d.tensor(oh).dtype(), dtypes::f16);
  EXPECT_EQ(d.f64_of(oh), (std::vector<double>{1, -2}));
}

// What the builders guarantee, forced wrong in hand-made ops: errors that claim the output.
TEST(ReferenceDenseTest, ForcedBadDenseOperationsAreErrors) {
  Device d;
  const TensorIr x = d.f64({2, 3}, dtypes::f32, iota1(6));
  const TensorIr vec3 = d.f64({3}, dtypes::f32, {1, 1, 1});
  auto expect_error = [&](Operation op, ErrorCode code, const std::string& what) {
    op.tensors.back().id = d.fresh();
    Status st = d.exec.execute(op, d.handles);
    ASSERT_FALSE(st.ok()) << op.to_string();
    EXPECT_EQ(st.error().code, code) << st.error().to_string();
    EXPECT_NE(st.error().message.find(what), std::string::npos) << st.error().message;
    EXPECT_TRUE(d.handles.entry(op.outputs()[0].id)->is_errored());
  };
  Operation ln = b::layer_norm(x, vec3, vec3, 1e-5, d.fresh()).value();
  ln.attrs[0] = bits_of(-1.0);
  expect_error(ln, ErrorCode::Invalid, "epsilon must be finite and non-negative, got -1");
  ln.attrs[0] = bits_of(kNaN);
  expect_error(ln, ErrorCode::Invalid, "epsilon");
  Operation bn = b::batch_norm(x, vec3, vec3, vec3, vec3, 1e-5, d.fresh()).value();
  bn.scalars[0] = ScalarIr::Float(-kInf);
  expect_error(bn, ErrorCode::Invalid, "epsilon");
  bn = b::batch_norm(x, vec3, vec3, vec3, vec3, 1e-5, d.fresh()).value();
  bn.tensors[3] = d.f64({2}, dtypes::f32, {0, 0});  // a mean of the wrong length
  expect_error(bn, ErrorCode::IncompatibleShapes, "mean");
  Operation lin =
      b::linear(x, d.f64({3, 2}, dtypes::f32, iota1(6)), d.f64({2}, dtypes::f32, {0, 0}), d.fresh()).value();
  Operation bad = lin;
  bad.tensors[2] = vec3;  // a bias of d_in elements
  expect_error(bad, ErrorCode::IncompatibleShapes, "bias");
  bad = lin;
  bad.tensors[1] = d.f64({2, 3}, dtypes::f32, iota1(6));  // a [d_out, d_in] weight
  expect_error(bad, ErrorCode::IncompatibleShapes, "has 3 features");
  bad = lin;
  bad.outputs()[0].shape = {2, 3};
  expect_error(bad, ErrorCode::IncompatibleShapes, "does not have the shape");
  Operation gw = b::linear_weight_backward(x, d.f64({2, 2}, dtypes::f32, {1, 2, 3, 4}), d.fresh()).value();
  gw.tensors[1] = d.f64({3, 2}, dtypes::f32, iota1(6));  // leading dims 3, not 2
  expect_error(gw, ErrorCode::IncompatibleShapes, "same leading dims");
  Operation gx =
      b::linear_x_backward(d.f64({3, 2}, dtypes::f32, iota1(6)), d.f64({2, 2}, dtypes::f32, iota1(4)), d.fresh())
          .value();
  gx.outputs()[0].dtype = dtypes::f64;  // output_grad's dtype is f32
  expect_error(gx, ErrorCode::DTypeMismatch, "dtype");
  Operation eb = b::embedding_backward(d.f64({4, 2}, dtypes::f32, iota1(8)), d.f64({1, 2, 2}, dtypes::f32, iota1(4)),
                                       d.i64({1, 2}, dtypes::i64, {0, 1}), d.fresh())
                     .value();
  eb.tensors[2] = d.f64({1, 2}, dtypes::f32, {0, 1});  // float indices
  expect_error(eb, ErrorCode::DTypeMismatch, "indices");
}

}  // namespace
}  // namespace kiln::reference::testing
