// Reference executor: matmul, conv2d, conv_transpose1d, max_pool2d, avg_pool2d, embedding.
#include <random>

#include "kiln/testing/status.h"
#include "reference_test_util.h"

namespace kiln::reference::testing {
namespace {

using F = Family;
using K = OpKind;

std::vector<double> iota1(std::size_t n) {
  std::vector<double> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<double>(i + 1);
  return v;
}

std::vector<double> random_values(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> v(n);
  for (double& x : v) x = u(rng);
  return v;
}

double dot(const std::vector<double>& a, const std::vector<double>& c) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * c[i];
  return s;
}

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

}  // namespace
}  // namespace kiln::reference::testing
