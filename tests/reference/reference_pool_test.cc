// Reference executor: the pools of docs/spec/ir.md §5.8 beyond MaxPool2d / AvgPool2d (those are in
// reference_module_test.cc): MaxPool1d, MaxPool1d/2dWithIndices, AvgPool1d, AdaptiveAvgPool1d/2d/3d
// and the backwards. Values computed here by hand (PyTorch's semantics: divisors, ties, NaN, flat
// indices), and central differences showing that each backward is the gradient of its forward.
#include <algorithm>
#include <random>
#include <utility>

#include "kiln/testing/status.h"
#include "reference_test_util.h"

namespace kiln::reference::testing {
namespace {

// n distinct values at least 0.09 apart, in random order: no ties, and a step of the central
// difference never changes which element is a window's maximum.
std::vector<double> distinct_values(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<double> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = 0.1 * static_cast<double>(i) - 0.05 * static_cast<double>(n);
  std::shuffle(v.begin(), v.end(), rng);
  std::uniform_real_distribution<double> jitter(0, 0.01);
  for (double& x : v) x += jitter(rng);
  return v;
}

// Expects every central difference of `loss` over v to equal the gradient's entry.
template <class F>
void expect_gradient(std::vector<double>& v, const std::vector<double>& gradient, F&& loss, const char* what) {
  ASSERT_EQ(gradient.size(), v.size()) << what;
  for (std::size_t k = 0; k < v.size(); ++k)
    EXPECT_NEAR(central_difference(v, k, loss), gradient[k], 1e-9) << what << " element " << k;
}

// A with-indices pool's values and indices.
struct WithIndices {
  std::vector<double> values;
  std::vector<std::int64_t> indices;
};
WithIndices run_with_indices(Device& d, const Result<Operation>& op) {
  d.ok(op);
  if (!op.ok()) return {};
  return {d.f64_of(op->outputs()[0].id), d.i64_of(op->outputs()[1].id)};
}

b::MaxPool1dOptions max1(std::uint64_t k, std::uint64_t s, std::uint64_t p = 0, std::uint64_t dil = 1,
                         bool ceil = false) {
  return b::MaxPool1dOptions{k, s, p, dil, ceil};
}
b::AvgPool1dOptions avg1(std::uint64_t k, std::uint64_t s, std::uint64_t p, bool include_pad, bool ceil = false) {
  return b::AvgPool1dOptions{k, s, p, include_pad, ceil};
}

// ---- Max pools

TEST(ReferencePoolsTest, MaxPool1dPaddingCeilModeAndDilation) {
  Device d;
  const TensorIr x = d.f64({1, 1, 5}, dtypes::f32, {1, 3, 2, 5, 4});
  auto pool = [&](const b::MaxPool1dOptions& o) { return d.f64_of(d.ok(b::max_pool1d(x, o, d.fresh()))); };
  EXPECT_EQ(pool(max1(2, 2)), (std::vector<double>{3, 5}));
  EXPECT_EQ(pool(max1(2, 2, 0, 1, true)), (std::vector<double>{3, 5, 4}));  // the last window holds x[4]
  // Windows [−1, 1], [1, 3], [3, 5]: the padding is never chosen.
  EXPECT_EQ(pool(max1(3, 2, 1)), (std::vector<double>{3, 5, 5}));
  // Dilation 2: taps (0, 2), (1, 3), (2, 4).
  EXPECT_EQ(pool(max1(2, 1, 0, 2)), (std::vector<double>{2, 5, 4}));
  // The spec's ceil mode (docs/spec/ir.md §4) keeps a fourth window [5, 6], all padding: −inf.
  const TensorId c = d.ok(b::max_pool1d(x, max1(2, 2, 1, 1, true), d.fresh()));
  EXPECT_EQ(d.shape_of(c), (Shape{1, 1, 4}));
  EXPECT_EQ(d.f64_of(c), (std::vector<double>{1, 3, 5, -kInf}));
  // Several planes: [N, C] = [2, 1], each pooled on its own; f16 rounding once.
  const TensorIr x2 = d.f64({2, 1, 3}, dtypes::f16, {1, -2, 0.5, -4, -3, -8});
  const TensorId two = d.ok(b::max_pool1d(x2, max1(2, 1), d.fresh()));
  EXPECT_EQ(d.tensor(two).dtype(), dtypes::f16);
  EXPECT_EQ(d.f64_of(two), (std::vector<double>{1, 0.5, -3, -3}));
}

TEST(ReferencePoolsTest, MaxPoolWithIndicesFlatWithinThePlane) {
  Device d;
  const TensorIr x = d.f64({1, 1, 5}, dtypes::f64, {1, 3, 2, 5, 4});
  WithIndices r = run_with_indices(d, b::max_pool1d_with_indices(x, max1(2, 2), dtypes::i64, d.fresh(), d.fresh()));
  EXPECT_EQ(r.values, (std::vector<double>{3, 5}));
  EXPECT_EQ(r.indices, (std::vector<std::int64_t>{1, 3}));
  // An empty window (all padding, the spec's ceil mode): −inf and −1.
  r = run_with_indices(d, b::max_pool1d_with_indices(x, max1(2, 2, 1, 1, true), dtypes::i32, d.fresh(), d.fresh()));
  EXPECT_EQ(r.values, (std::vector<double>{1, 3, 5, -kInf}));
  EXPECT_EQ(r.indices, (std::vector<std::int64_t>{0, 1, 3, -1}));
  // 2d, [3, 4] = 1..12 with padding 1: index h · 4 + w of the chosen element; the values are
  // MaxPool2d's.
  const TensorIr x2 = d.f64({1, 1, 3, 4}, dtypes::f32, iota1(12));
  b::MaxPool2dOptions o;
  o.kernel = {2, 2};
  o.stride = {2, 2};
  o.padding = {1, 1};
  r = run_with_indices(d, b::max_pool2d_with_indices(x2, o, dtypes::i64, d.fresh(), d.fresh()));
  EXPECT_EQ(r.values, (std::vector<double>{1, 3, 4, 9, 11, 12}));
  EXPECT_EQ(r.indices, (std::vector<std::int64_t>{0, 2, 3, 8, 10, 11}));
  EXPECT_EQ(d.f64_of(d.ok(b::max_pool2d(x2, o, d.fresh()))), r.values);
  // Dilation 2 on 4 × 4: taps two apart in both dims.
  b::MaxPool2dOptions dil;
  dil.kernel = {2, 2};
  dil.dilation = {2, 2};
  r = run_with_indices(d, b::max_pool2d_with_indices(d.f64({1, 1, 4, 4}, dtypes::f32, iota1(16)), dil, dtypes::i16,
                                                     d.fresh(), d.fresh()));
  EXPECT_EQ(r.values, (std::vector<double>{11, 12, 15, 16}));
  EXPECT_EQ(r.indices, (std::vector<std::int64_t>{10, 11, 14, 15}));
  // Two channels: each plane counts from 0.
  b::MaxPool2dOptions k2;
  k2.kernel = {2, 2};
  r = run_with_indices(d, b::max_pool2d_with_indices(d.f64({1, 2, 2, 2}, dtypes::f64, {1, 2, 3, 4, 8, 7, 6, 5}), k2,
                                                     dtypes::i64, d.fresh(), d.fresh()));
  EXPECT_EQ(r.values, (std::vector<double>{4, 8}));
  EXPECT_EQ(r.indices, (std::vector<std::int64_t>{3, 0}));
}

// PyTorch's rule: the first tap is the candidate, a strictly larger value or a NaN replaces it.
TEST(ReferencePoolsTest, MaxPoolTiesKeepTheFirstIndexAndNanPropagates) {
  Device d;
  auto run = [&](std::vector<double> v, const b::MaxPool1dOptions& o) {
    const TensorIr x = d.f64({1, 1, v.size()}, dtypes::f64, v);
    return run_with_indices(d, b::max_pool1d_with_indices(x, o, dtypes::i64, d.fresh(), d.fresh()));
  };
  WithIndices r = run({2, 2, 1, 7, 7, 7}, max1(3, 3));
  EXPECT_EQ(r.values, (std::vector<double>{2, 7}));
  EXPECT_EQ(r.indices, (std::vector<std::int64_t>{0, 3}));
  r = run({4, 4, 4}, max1(2, 1));
  EXPECT_EQ(r.indices, (std::vector<std::int64_t>{0, 1}));
  r = run({-kInf, -kInf, -1}, max1(2, 1));  // −inf everywhere: the first tap
  EXPECT_EQ(r.values, (std::vector<double>{-kInf, -1}));
  EXPECT_EQ(r.indices, (std::vector<std::int64_t>{0, 2}));
  // NaN wins over any number, before or after it; of two NaNs the last (PyTorch's CPU kernel).
  r = run({1, kNaN, 3, kNaN, kNaN, 0, 5, 6, kNaN}, max1(3, 3));
  EXPECT_THAT(r.values, NanEq(std::vector<double>{kNaN, kNaN, kNaN}));
  EXPECT_EQ(r.indices, (std::vector<std::int64_t>{1, 4, 8}));
  // Without indices: the same values (MaxPool1d and MaxPool2d).
  const TensorIr x = d.f64({1, 1, 4}, dtypes::bf16, {1, kNaN, 3, 2});
  EXPECT_THAT(d.f64_of(d.ok(b::max_pool1d(x, max1(2, 2), d.fresh()))), NanEq(std::vector<double>{kNaN, 3}));
}

TEST(ReferencePoolsTest, MaxPoolBackwardRoutesToTheIndices) {
  Device d;
  const TensorIr x = d.f64({1, 1, 5}, dtypes::f32, {1, 3, 2, 5, 4});
  // Windows [0, 2], [1, 3], [2, 4] choose 1, 3, 3: the two grads at 3 accumulate.
  const b::MaxPool1dOptions o = max1(3, 1);
  WithIndices r = run_with_indices(d, b::max_pool1d_with_indices(x, o, dtypes::i64, d.fresh(), d.fresh()));
  EXPECT_EQ(r.indices, (std::vector<std::int64_t>{1, 3, 3}));
  const TensorIr grad = d.f64({1, 1, 3}, dtypes::f32, {1, 10, 100});
  const TensorIr idx = d.i64({1, 1, 3}, dtypes::i64, r.indices);
  const TensorId g = d.ok(b::max_pool1d_with_indices_backward(x, grad, idx, o, d.fresh()));
  EXPECT_EQ(d.shape_of(g), (Shape{1, 1, 5}));
  EXPECT_EQ(d.tensor(g).dtype(), dtypes::f32);
  EXPECT_EQ(d.f64_of(g), (std::vector<double>{0, 1, 0, 110, 0}));
  // −1 (an empty window's index) adds nowhere; i32 indices are read as well.
  const b::MaxPool1dOptions ceil = max1(2, 2, 1, 1, true);
  const TensorIr g4 = d.f64({1, 1, 4}, dtypes::f32, {1, 2, 3, 4});
  const TensorIr i4 = d.i64({1, 1, 4}, dtypes::i32, {0, 1, 3, -1});
  EXPECT_EQ(d.f64_of(d.ok(b::max_pool1d_with_indices_backward(x, g4, i4, ceil, d.fresh()))),
            (std::vector<double>{1, 2, 0, 3, 0}));
  // 2d: the index is flat within each plane.
  b::MaxPool2dOptions k2;
  k2.kernel = {2, 2};
  const TensorIr x2 = d.f64({1, 2, 2, 2}, dtypes::f64, iota1(8));
  const TensorId g2 = d.ok(b::max_pool2d_with_indices_backward(
      x2, d.f64({1, 2, 1, 1}, dtypes::f64, {5, 7}), d.i64({1, 2, 1, 1}, dtypes::i64, {3, 0}), k2, d.fresh()));
  EXPECT_EQ(d.f64_of(g2), (std::vector<double>{0, 0, 0, 5, 7, 0, 0, 0}));
}

// ---- Average pools

TEST(ReferencePoolsTest, AvgPool1dDivisorsAndCeilMode) {
  Device d;
  const TensorIr x = d.f64({1, 1, 5}, dtypes::f64, iota1(5));
  auto pool = [&](const TensorIr& in, const b::AvgPool1dOptions& o) {
    return d.f64_of(d.ok(b::avg_pool1d(in, o, d.fresh())));
  };
  EXPECT_EQ(pool(x, avg1(2, 2, 0, true)), (std::vector<double>{1.5, 3.5}));
  // Windows [−1, 1], [1, 3], [3, 5]: divided by 3 with the padding counted, by what lies in x without.
  EXPECT_EQ(pool(x, avg1(3, 2, 1, true)), (std::vector<double>{1, 3, 3}));
  EXPECT_EQ(pool(x, avg1(3, 2, 1, false)), (std::vector<double>{1.5, 3, 4.5}));
  // Ceil mode over 1..6, k 3, s 2, p 1: the last window [5, 7] covers x[5], the right padding and
  // one element past it; its divisor is 2 with the padding counted (the padded input ends at 7),
  // 1 without (PyTorch: 3 and 6).
  const TensorIr x6 = d.f64({1, 1, 6}, dtypes::f64, iota1(6));
  EXPECT_EQ(pool(x6, avg1(3, 2, 1, true, true)), (std::vector<double>{1, 3, 5, 3}));
  EXPECT_EQ(pool(x6, avg1(3, 2, 1, false, true)), (std::vector<double>{1.5, 3, 5, 6}));
  // The spec's ceil mode keeps a window with no element of x: 0.
  EXPECT_EQ(pool(x, avg1(2, 2, 1, true, true)), (std::vector<double>{0.5, 2.5, 4.5, 0}));
  EXPECT_EQ(pool(x, avg1(2, 2, 1, false, true)), (std::vector<double>{1, 2.5, 4.5, 0}));
  // f32 operands: one rounding of the f64 mean.
  const TensorId f = d.ok(b::avg_pool1d(d.f64({1, 1, 3}, dtypes::f32, {1, 1, 2}), avg1(3, 1, 0, true), d.fresh()));
  EXPECT_EQ(d.tensor(f).dtype(), dtypes::f32);
  EXPECT_EQ(d.f64_of(f), (std::vector<double>{static_cast<double>(4.0f / 3.0f)}));
}

TEST(ReferencePoolsTest, AvgPoolBackwardsByHand) {
  Device d;
  const TensorIr x = d.f64({1, 1, 5}, dtypes::f64, iota1(5));
  // Windows [−1, 1], [1, 3], [3, 5]; grads 3, 6, 9 over divisors 3, 3, 3 give shares 1, 2, 3.
  const TensorId with =
      d.ok(b::avg_pool1d_backward(x, d.f64({1, 1, 3}, dtypes::f64, {3, 6, 9}), avg1(3, 2, 1, true), d.fresh()));
  EXPECT_EQ(d.f64_of(with), (std::vector<double>{1, 3, 2, 5, 3}));
  // Without the padding: divisors 2, 3, 2; grads 2, 6, 4 give shares 1, 2, 2.
  const TensorId without =
      d.ok(b::avg_pool1d_backward(x, d.f64({1, 1, 3}, dtypes::f64, {2, 6, 4}), avg1(3, 2, 1, false), d.fresh()));
  EXPECT_EQ(d.f64_of(without), (std::vector<double>{1, 3, 2, 4, 2}));
  // An empty window's grad goes nowhere (its output is the constant 0).
  const TensorId ceil = d.ok(
      b::avg_pool1d_backward(x, d.f64({1, 1, 4}, dtypes::f64, {2, 4, 6, 100}), avg1(2, 2, 1, true, true), d.fresh()));
  EXPECT_EQ(d.f64_of(ceil), (std::vector<double>{1, 2, 2, 3, 3}));
  // 2d: 2 × 2 windows of a 2 × 4 plane, stride 2; x's dtype for the result.
  b::AvgPool2dOptions o;
  o.kernel = {2, 2};
  o.stride = {2, 2};
  const TensorId g2 = d.ok(b::avg_pool2d_backward(d.f64({1, 1, 2, 4}, dtypes::f16, iota1(8)),
                                                  d.f64({1, 1, 1, 2}, dtypes::f32, {4, 8}), o, d.fresh()));
  EXPECT_EQ(d.tensor(g2).dtype(), dtypes::f16);
  EXPECT_EQ(d.f64_of(g2), (std::vector<double>{1, 1, 2, 2, 1, 1, 2, 2}));
}

// ---- Adaptive average pools

TEST(ReferencePoolsTest, AdaptiveAvgPoolWindowsThatDoNotDivide) {
  Device d;
  // 5 → 3: windows [0, 2), [1, 4), [3, 5).
  const TensorIr x = d.f64({1, 1, 5}, dtypes::f64, iota1(5));
  EXPECT_EQ(d.f64_of(d.ok(b::adaptive_avg_pool1d(x, 3, d.fresh()))), (std::vector<double>{1.5, 3, 4.5}));
  EXPECT_EQ(d.f64_of(d.ok(b::adaptive_avg_pool1d(x, 5, d.fresh()))), iota1(5));
  EXPECT_EQ(d.f64_of(d.ok(b::adaptive_avg_pool1d(x, 1, d.fresh()))), (std::vector<double>{3}));
  // 2 → 3 (larger than x): windows [0, 1), [0, 2), [1, 2).
  EXPECT_EQ(d.f64_of(d.ok(b::adaptive_avg_pool1d(d.f64({1, 1, 2}, dtypes::f32, {2, 4}), 3, d.fresh()))),
            (std::vector<double>{2, 3, 4}));
  // 2d, 3 × 3 → 2 × 2: rows and columns [0, 2), [1, 3).
  const TensorId a2 = d.ok(b::adaptive_avg_pool2d(d.f64({1, 1, 3, 3}, dtypes::f64, iota1(9)), {2, 2}, d.fresh()));
  EXPECT_EQ(d.shape_of(a2), (Shape{1, 1, 2, 2}));
  EXPECT_EQ(d.f64_of(a2), (std::vector<double>{3, 4, 6, 7}));
  // 3d, 2 × 2 × 2 → 1 × 2 × 1: the h = 0 and h = 1 halves; → 1 × 1 × 1: the mean.
  const TensorIr x3 = d.f64({1, 1, 2, 2, 2}, dtypes::f64, iota1(8));
  const TensorId a3 = d.ok(b::adaptive_avg_pool3d(x3, {1, 2, 1}, d.fresh()));
  EXPECT_EQ(d.shape_of(a3), (Shape{1, 1, 1, 2, 1}));
  EXPECT_EQ(d.f64_of(a3), (std::vector<double>{3.5, 5.5}));
  EXPECT_EQ(d.f64_of(d.ok(b::adaptive_avg_pool3d(x3, {1, 1, 1}, d.fresh()))), (std::vector<double>{4.5}));
  // Two planes stay apart.
  EXPECT_EQ(d.f64_of(d.ok(b::adaptive_avg_pool1d(d.f64({2, 1, 2}, dtypes::f64, {1, 3, 10, 20}), 1, d.fresh()))),
            (std::vector<double>{2, 15}));
}

TEST(ReferencePoolsTest, AdaptiveAvgPoolBackwardsByHand) {
  Device d;
  // 5 → 3, windows [0, 2), [1, 4), [3, 5); grads 2, 3, 4 give shares 1, 1, 2.
  const TensorIr x = d.f64({1, 1, 5}, dtypes::f32, iota1(5));
  const TensorId g = d.ok(b::adaptive_avg_pool1d_backward(x, d.f64({1, 1, 3}, dtypes::f32, {2, 3, 4}), d.fresh()));
  EXPECT_EQ(d.shape_of(g), (Shape{1, 1, 5}));
  EXPECT_EQ(d.f64_of(g), (std::vector<double>{1, 2, 1, 3, 2}));
  // 3 × 3 → 2 × 2: the centre element is in all four windows (each of 4 elements).
  const TensorId g2 = d.ok(b::adaptive_avg_pool2d_backward(
      d.f64({1, 1, 3, 3}, dtypes::f64, iota1(9)), d.f64({1, 1, 2, 2}, dtypes::f64, {4, 8, 12, 16}), d.fresh()));
  EXPECT_EQ(d.f64_of(g2), (std::vector<double>{1, 3, 2, 4, 10, 6, 3, 7, 4}));
  // 3d to one element: the grad spread over all eight.
  const TensorId g3 = d.ok(b::adaptive_avg_pool3d_backward(d.f64({1, 1, 2, 2, 2}, dtypes::f64, iota1(8)),
                                                           d.f64({1, 1, 1, 1, 1}, dtypes::f64, {8}), d.fresh()));
  EXPECT_EQ(d.f64_of(g3), std::vector<double>(8, 1.0));
}

// ---- Each backward is the gradient of its forward: with L = Σ c · forward(x), central
// differences of L in f64 match backward(x, c). The losses are piecewise linear (max pools: no
// ties, so the chosen element never changes within a step), so the differences are exact up to
// rounding.

TEST(ReferencePoolsTest, AvgPoolBackwardsAreTheGradientsOfTheAvgPools) {
  Device d;
  for (bool include_pad : {true, false}) {
    const b::AvgPool1dOptions o1 = avg1(3, 2, 1, include_pad, true);
    std::vector<double> xv = random_values(28, 1);  // [2, 2, 7] → [2, 2, 4]
    const std::vector<double> cv = random_values(16, 2);
    auto loss = [&] {
      return dot(d.f64_of(d.ok(b::avg_pool1d(d.f64({2, 2, 7}, dtypes::f64, xv), o1, d.fresh()))), cv);
    };
    const std::vector<double> g = d.f64_of(d.ok(
        b::avg_pool1d_backward(d.f64({2, 2, 7}, dtypes::f64, xv), d.f64({2, 2, 4}, dtypes::f64, cv), o1, d.fresh())));
    expect_gradient(xv, g, loss, "avg_pool1d");
    b::AvgPool2dOptions o2;
    o2.kernel = {3, 2};
    o2.stride = {2, 2};
    o2.padding = {1, 1};
    o2.count_include_pad = include_pad;
    o2.ceil_mode = true;
    std::vector<double> xv2 = random_values(60, 3);  // [1, 2, 5, 6] → [1, 2, 3, 4]
    const std::vector<double> cv2 = random_values(24, 4);
    auto loss2 = [&] {
      return dot(d.f64_of(d.ok(b::avg_pool2d(d.f64({1, 2, 5, 6}, dtypes::f64, xv2), o2, d.fresh()))), cv2);
    };
    const std::vector<double> g2 = d.f64_of(d.ok(b::avg_pool2d_backward(
        d.f64({1, 2, 5, 6}, dtypes::f64, xv2), d.f64({1, 2, 3, 4}, dtypes::f64, cv2), o2, d.fresh())));
    expect_gradient(xv2, g2, loss2, "avg_pool2d");
  }
}

TEST(ReferencePoolsTest, MaxPoolBackwardsAreTheGradientsOfTheMaxPools) {
  Device d;
  // 1d: k 3, s 2, p 1, dilation 2, ceil mode: [2, 3, 9] → [2, 3, 4], no empty window.
  const b::MaxPool1dOptions o1 = max1(3, 2, 1, 2, true);
  std::vector<double> xv = distinct_values(54, 5);
  const std::vector<double> cv = random_values(24, 6);
  auto loss = [&] { return dot(d.f64_of(d.ok(b::max_pool1d(d.f64({2, 3, 9}, dtypes::f64, xv), o1, d.fresh()))), cv); };
  const TensorIr x1 = d.f64({2, 3, 9}, dtypes::f64, xv);
  const WithIndices r1 = run_with_indices(d, b::max_pool1d_with_indices(x1, o1, dtypes::i64, d.fresh(), d.fresh()));
  const std::vector<double> g1 = d.f64_of(d.ok(b::max_pool1d_with_indices_backward(
      x1, d.f64({2, 3, 4}, dtypes::f64, cv), d.i64({2, 3, 4}, dtypes::i64, r1.indices), o1, d.fresh())));
  expect_gradient(xv, g1, loss, "max_pool1d");
  // 2d: kernel [3, 2], stride [2, 1], padding [1, 0], dilation [1, 2]: [1, 2, 5, 6] → [1, 2, 3, 4].
  b::MaxPool2dOptions o2;
  o2.kernel = {3, 2};
  o2.stride = {2, 1};
  o2.padding = {1, 0};
  o2.dilation = {1, 2};
  std::vector<double> xv2 = distinct_values(60, 7);
  const std::vector<double> cv2 = random_values(24, 8);
  auto loss2 = [&] {
    return dot(d.f64_of(d.ok(b::max_pool2d(d.f64({1, 2, 5, 6}, dtypes::f64, xv2), o2, d.fresh()))), cv2);
  };
  const TensorIr x2 = d.f64({1, 2, 5, 6}, dtypes::f64, xv2);
  const WithIndices r2 = run_with_indices(d, b::max_pool2d_with_indices(x2, o2, dtypes::i64, d.fresh(), d.fresh()));
  EXPECT_EQ(r2.values, d.f64_of(d.ok(b::max_pool2d(x2, o2, d.fresh()))));
  const std::vector<double> g2 = d.f64_of(d.ok(b::max_pool2d_with_indices_backward(
      x2, d.f64({1, 2, 3, 4}, dtypes::f64, cv2), d.i64({1, 2, 3, 4}, dtypes::i64, r2.indices), o2, d.fresh())));
  expect_gradient(xv2, g2, loss2, "max_pool2d");
}

TEST(ReferencePoolsTest, AdaptiveAvgPoolBackwardsAreTheGradientsOfTheAdaptivePools) {
  Device d;
  // 7 → 3 ([0, 3), [2, 5), [4, 7)), 5 × 4 → 3 × 3, 3 × 5 × 4 → 2 × 3 × 3: windows that overlap.
  std::vector<double> x1 = random_values(14, 9), x2 = random_values(40, 10), x3 = random_values(60, 11);
  const std::vector<double> c1 = random_values(6, 12), c2 = random_values(18, 13), c3 = random_values(18, 14);
  auto loss1 = [&] {
    return dot(d.f64_of(d.ok(b::adaptive_avg_pool1d(d.f64({2, 1, 7}, dtypes::f64, x1), 3, d.fresh()))), c1);
  };
  auto loss2 = [&] {
    return dot(d.f64_of(d.ok(b::adaptive_avg_pool2d(d.f64({1, 2, 5, 4}, dtypes::f64, x2), {3, 3}, d.fresh()))), c2);
  };
  auto loss3 = [&] {
    return dot(d.f64_of(d.ok(b::adaptive_avg_pool3d(d.f64({1, 1, 3, 5, 4}, dtypes::f64, x3), {2, 3, 3}, d.fresh()))),
               c3);
  };
  expect_gradient(x1,
                  d.f64_of(d.ok(b::adaptive_avg_pool1d_backward(d.f64({2, 1, 7}, dtypes::f64, x1),
                                                                d.f64({2, 1, 3}, dtypes::f64, c1), d.fresh()))),
                  loss1, "adaptive_avg_pool1d");
  expect_gradient(x2,
                  d.f64_of(d.ok(b::adaptive_avg_pool2d_backward(d.f64({1, 2, 5, 4}, dtypes::f64, x2),
                                                                d.f64({1, 2, 3, 3}, dtypes::f64, c2), d.fresh()))),
                  loss2, "adaptive_avg_pool2d");
  expect_gradient(x3,
                  d.f64_of(d.ok(b::adaptive_avg_pool3d_backward(d.f64({1, 1, 3, 5, 4}, dtypes::f64, x3),
                                                                d.f64({1, 1, 2, 3, 3}, dtypes::f64, c3), d.fresh()))),
                  loss3, "adaptive_avg_pool3d");
}

// ---- What the builders guarantee, forced wrong in hand-made ops: errors that claim the outputs.

class ForcedBadPools : public ::testing::Test {
 protected:
  Device d;
  void expect_error(Operation op, ErrorCode code, const std::string& what) {
    for (std::size_t i = op.num_inputs; i < op.tensors.size(); ++i) op.tensors[i].id = d.fresh();
    Status st = d.exec.execute(op, d.handles);
    ASSERT_FALSE(st.ok()) << op.to_string();
    EXPECT_EQ(st.error().code, code) << st.error().to_string();
    EXPECT_NE(st.error().message.find(what), std::string::npos) << st.error().message;
    for (const TensorIr& out : op.outputs()) EXPECT_TRUE(d.handles.entry(out.id)->is_errored());
  }
};

TEST_F(ForcedBadPools, WindowsAndOutputs) {
  const TensorIr x = d.f64({1, 1, 5}, dtypes::f32, iota1(5));
  Operation op = b::max_pool1d(x, max1(2, 2, 1), d.fresh()).value();
  Operation bad = op;
  bad.attrs.push_back(0);  // 6 attributes: validate admits up to 9 for the signature
  expect_error(bad, ErrorCode::Invalid, "takes 5 attributes, got 6");
  bad = op;
  bad.attrs[2] = 2;  // padding 2 with kernel 2
  expect_error(bad, ErrorCode::Invalid, "padding 2 exceeds half the kernel size 2");
  bad = op;
  bad.attrs[0] = 0;
  expect_error(bad, ErrorCode::Invalid, "kernel size must be at least 1, got 0");
  bad = op;
  bad.attrs[1] = -3;
  expect_error(bad, ErrorCode::Invalid, "stride");
  bad = op;
  bad.attrs[4] = 2;
  expect_error(bad, ErrorCode::Invalid, "ceil_mode");
  bad = op;
  bad.outputs()[0].shape = {1, 1, 2};
  expect_error(bad, ErrorCode::IncompatibleShapes, "does not have the shape");
  Operation avg = b::avg_pool1d(x, avg1(3, 1, 1, true), d.fresh()).value();
  avg.attrs[3] = 7;  // count_include_pad
  expect_error(avg, ErrorCode::Invalid, "count_include_pad");
  // Indices: unsigned, or too narrow for the plane's last index.
  Operation wi = b::max_pool1d_with_indices(x, max1(2, 2), dtypes::i64, d.fresh(), d.fresh()).value();
  bad = wi;
  bad.outputs()[1].dtype = dtypes::u32;
  expect_error(bad, ErrorCode::DTypeMismatch, "signed integer dtype");
  const TensorIr wide = d.f64({1, 1, 300}, dtypes::f32, iota1(300));
  bad = b::max_pool1d_with_indices(wide, max1(2, 2), dtypes::i16, d.fresh(), d.fresh()).value();
  bad.outputs()[1].dtype = dtypes::i8;
  expect_error(bad, ErrorCode::Invalid, "do not fit");
  bad = wi;
  bad.tensors[0] = d.f64({1, 5}, dtypes::f32, iota1(5));
  expect_error(bad, ErrorCode::RankMismatch, "must have rank 3");
}

TEST_F(ForcedBadPools, BackwardInputs) {
  const TensorIr x = d.f64({1, 1, 5}, dtypes::f32, iota1(5));
  const TensorIr grad = d.f64({1, 1, 2}, dtypes::f32, {1, 2});
  Operation mb =
      b::max_pool1d_with_indices_backward(x, grad, d.i64({1, 1, 2}, dtypes::i64, {1, 3}), max1(2, 2), d.fresh())
          .value();
  Operation bad = mb;
  bad.tensors[2] = d.i64({1, 1, 2}, dtypes::i64, {1, 5});  // past the plane of 5
  expect_error(bad, ErrorCode::OutOfBounds, "max pool index 5 (element 1) out of range");
  bad.tensors[2] = d.i64({1, 1, 2}, dtypes::i64, {-2, 3});  // negative, not the empty window's −1
  expect_error(bad, ErrorCode::OutOfBounds, "negative");
  bad.tensors[2] = d.f64({1, 1, 2}, dtypes::f32, {1, 3});
  expect_error(bad, ErrorCode::DTypeMismatch, "integer dtype");
  bad = mb;
  bad.tensors[1] = d.f64({1, 1, 3}, dtypes::f32, {1, 2, 3});
  expect_error(bad, ErrorCode::IncompatibleShapes, "grad");
  Operation ab = b::avg_pool1d_backward(x, grad, avg1(2, 2, 0, true), d.fresh()).value();
  ab.tensors[1] = d.i64({1, 1, 2}, dtypes::i64, {1, 2});
  expect_error(ab, ErrorCode::DTypeMismatch, "grad");
  ab = b::avg_pool1d_backward(x, grad, avg1(2, 2, 0, true), d.fresh()).value();
  ab.outputs()[0].dtype = dtypes::f64;
  expect_error(ab, ErrorCode::DTypeMismatch, "dtype");
}

TEST_F(ForcedBadPools, AdaptivePools) {
  const TensorIr x = d.f64({1, 1, 5}, dtypes::f32, iota1(5));
  Operation a = b::adaptive_avg_pool1d(x, 3, d.fresh()).value();
  Operation bad = a;
  bad.attrs[0] = 0;
  expect_error(bad, ErrorCode::Invalid, "output size must be at least 1, got 0");
  bad = a;
  bad.attrs.push_back(2);
  expect_error(bad, ErrorCode::Invalid, "takes 1 output sizes, got 2");
  bad = a;
  bad.tensors[0] = d.f64({1, 1, 0}, dtypes::f32, {});
  expect_error(bad, ErrorCode::Invalid, "empty spatial dim 0");
  Operation ab = b::adaptive_avg_pool1d_backward(x, d.f64({1, 1, 3}, dtypes::f32, {1, 2, 3}), d.fresh()).value();
  bad = ab;
  bad.tensors[1] = d.f64({2, 1, 3}, dtypes::f32, iota1(6));
  expect_error(bad, ErrorCode::IncompatibleShapes, "batch and channel dims");
  bad = ab;
  bad.tensors[1] = d.f64({1, 1, 0}, dtypes::f32, {});
  expect_error(bad, ErrorCode::Invalid, "output size 0");
}

}  // namespace
}  // namespace kiln::reference::testing
