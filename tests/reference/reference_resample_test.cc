// Reference executor: the resampling ops (docs/spec/ir.md §5.6, §5.8). Interpolate in every mode
// with align_corners both ways, up and down (2 → 4, 4 → 3, 3 → 5), by hand and against Burn's
// published vectors; InterpolateBackward by central differences of Interpolate and, for the
// nearest modes, as sums into the chosen sources; GridSample2d at corners and outside the image
// for each padding mode; Unfold4d against an im2col computed here; forced bad ops.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <numbers>
#include <random>
#include <utility>

#include "kiln/testing/status.h"
#include "reference_test_util.h"

namespace kiln::reference::testing {
namespace {

using M = InterpolateMode;
using P = GridSamplePaddingMode;

std::vector<double> interpolate(Device& d, const TensorIr& x, std::array<std::uint64_t, 2> size, M mode, bool align) {
  return d.f64_of(d.ok(b::interpolate(x, size, {mode, align}, d.fresh())));
}

// `values` resized to `out` along W (a [1, 1, 1, n] row) and along H (a [1, 1, n, 1] column):
// the two must agree, and the row's result is returned.
std::vector<double> resize_1d(const std::vector<double>& values, std::uint64_t out, M mode, bool align) {
  Device d;
  const std::uint64_t n = values.size();
  const std::vector<double> row = interpolate(d, d.f64({1, 1, 1, n}, dtypes::f64, values), {1, out}, mode, align);
  const std::vector<double> col = interpolate(d, d.f64({1, 1, n, 1}, dtypes::f64, values), {out, 1}, mode, align);
  EXPECT_EQ(row, col) << "mode " << static_cast<int>(mode) << " align " << align;
  return row;
}

// ---- Interpolate, by hand

// Nearest reads floor(o · in / out), NearestExact floor((o + ½) · in / out); align_corners does
// not apply to either (Burn ignores it).
TEST(ReferenceInterpolateTest, NearestAndNearestExactPickTheirSources) {
  for (bool align : {false, true}) {
    EXPECT_EQ(resize_1d({10, 20}, 4, M::Nearest, align), (std::vector<double>{10, 10, 20, 20}));
    EXPECT_EQ(resize_1d({10, 20, 30, 40}, 3, M::Nearest, align), (std::vector<double>{10, 20, 30}));
    EXPECT_EQ(resize_1d({10, 20, 30}, 5, M::Nearest, align), (std::vector<double>{10, 10, 20, 20, 30}));
    EXPECT_EQ(resize_1d({10, 20}, 4, M::NearestExact, align), (std::vector<double>{10, 10, 20, 20}));
    // (o + ½) · 4/3 = 2/3, 2, 10/3.
    EXPECT_EQ(resize_1d({10, 20, 30, 40}, 3, M::NearestExact, align), (std::vector<double>{10, 30, 40}));
    // (o + ½) · 3/5 = 0.3, 0.9, 1.5, 2.1, 2.7.
    EXPECT_EQ(resize_1d({10, 20, 30}, 5, M::NearestExact, align), (std::vector<double>{10, 10, 20, 30, 30}));
  }
  // Burn's test_1d_nearest (6 → 9).
  EXPECT_EQ(resize_1d({1.5410, -0.2934, -2.1788, 0.5684, -1.0845, -1.3986}, 9, M::Nearest, true),
            (std::vector<double>{1.5410, 1.5410, -0.2934, -2.1788, -2.1788, 0.5684, -1.0845, -1.0845, -1.3986}));
}

// align_corners: o · (in − 1) / (out − 1); otherwise (o + ½) · in / out − ½, clamped at 0, the
// upper neighbour held at the last position.
TEST(ReferenceInterpolateTest, BilinearBothAlignments) {
  EXPECT_THAT(resize_1d({0, 4}, 4, M::Bilinear, true), Near(std::vector<double>{0, 4.0 / 3, 8.0 / 3, 4}, 1e-15));
  // Sources −¼ (→ 0), ¼, ¾, 1¼ (→ the last).
  EXPECT_EQ(resize_1d({0, 4}, 4, M::Bilinear, false), (std::vector<double>{0, 1, 3, 4}));
  EXPECT_EQ(resize_1d({1, 2, 4, 8}, 3, M::Bilinear, true), (std::vector<double>{1, 3, 8}));
  // Sources 1/6, 3/2, 17/6: 1 + 1/6, 2 + ½ · 2, 4 + 5/6 · 4.
  EXPECT_THAT(resize_1d({1, 2, 4, 8}, 3, M::Bilinear, false), Near(std::vector<double>{7.0 / 6, 3, 22.0 / 3}, 1e-15));
  EXPECT_EQ(resize_1d({0, 2, 8}, 5, M::Bilinear, true), (std::vector<double>{0, 1, 2, 5, 8}));
  // Sources −0.2 (→ 0), 0.4, 1, 1.6, 2.2 (→ the last).
  EXPECT_THAT(resize_1d({0, 2, 8}, 5, M::Bilinear, false), Near(std::vector<double>{0, 0.8, 2, 5.6, 8}, 1e-15));
  // 2-D is the product of the two axes: [[0, 4], [8, 12]] to 4 x 4, half-pixel.
  Device d;
  const std::vector<double> two_d =
      interpolate(d, d.f64({1, 1, 2, 2}, dtypes::f32, {0, 4, 8, 12}), {4, 4}, M::Bilinear, false);
  EXPECT_EQ(two_d, (std::vector<double>{0, 1, 3, 4, 2, 3, 5, 6, 6, 7, 9, 10, 8, 9, 11, 12}));
}

// Keys' kernel with A = −0.75 at distance t (a second implementation, for the non-dyadic cases).
double keys(double t) {
  t = std::fabs(t);
  if (t <= 1) return (1.25 * t - 2.25) * t * t + 1;
  return t < 2 ? ((-0.75 * t + 3.75) * t - 6) * t + 3 : 0.0;
}

// Bicubic of a row by the definition: taps floor − 1 … floor + 2, positions clamped.
std::vector<double> bicubic_by_hand(const std::vector<double>& x, std::size_t out, bool align) {
  const double in = static_cast<double>(x.size());
  std::vector<double> r;
  for (std::size_t o = 0; o < out; ++o) {
    const double od = static_cast<double>(o);
    const double s = align ? (out > 1 ? od * (in - 1) / static_cast<double>(out - 1) : 0)
                           : (od + 0.5) * in / static_cast<double>(out) - 0.5;
    double acc = 0;
    for (int k = -1; k <= 2; ++k) {
      const double p = std::floor(s) + k;
      acc += keys(s - p) * x[static_cast<std::size_t>(std::clamp(p, 0.0, in - 1))];
    }
    r.push_back(acc);
  }
  return r;
}

// At a half position the weights are −0.09375, 0.59375, 0.59375, −0.09375; at ¼ they are
// −0.10546875, 0.87890625, 0.26171875, −0.03515625 (mirrored at ¾). The coordinate is not
// clamped: the half-pixel 2 → 4 reads from −¼.
TEST(ReferenceInterpolateTest, BicubicBothAlignments) {
  EXPECT_EQ(resize_1d({0, 4}, 4, M::Bicubic, false), (std::vector<double>{-0.421875, 0.90625, 3.09375, 4.421875}));
  EXPECT_EQ(resize_1d({1, 2, 4}, 5, M::Bicubic, true), (std::vector<double>{1, 1.3125, 2, 3.09375, 4}));
  EXPECT_EQ(resize_1d({1, 2, 4, 8}, 3, M::Bicubic, true), (std::vector<double>{1, 2.71875, 8}));
  EXPECT_THAT(resize_1d({1, 2, 4, 8}, 3, M::Bicubic, false), Near(bicubic_by_hand({1, 2, 4, 8}, 3, false), 1e-14));
  EXPECT_THAT(resize_1d({1, 2, 4}, 5, M::Bicubic, false), Near(bicubic_by_hand({1, 2, 4}, 5, false), 1e-14));
  EXPECT_THAT(resize_1d({0, 3}, 4, M::Bicubic, true), Near(bicubic_by_hand({0, 3}, 4, true), 1e-14));
  // Burn's test_1d_bicubic (6 → 9, align_corners) and test_upsample_half_pixel (arange 4 x 4 → 8 x 8).
  EXPECT_THAT(resize_1d({1.5410, -0.2934, -2.1788, 0.5684, -1.0845, -1.3986}, 9, M::Bicubic, true),
              Near(std::vector<double>{1.541, 0.5747652, -1.010614, -2.197787, -0.8269969, 0.59609234, -0.5803058,
                                       -1.3792794, -1.3986},
                   1e-6));
  Device d;
  std::vector<double> arange(16);
  for (std::size_t i = 0; i < 16; ++i) arange[i] = static_cast<double>(i);
  const std::vector<double> half = interpolate(d, d.f64({1, 1, 4, 4}, dtypes::f64, arange), {8, 8}, M::Bicubic, false);
  EXPECT_THAT(std::vector<double>(half.begin(), half.begin() + 16),
              Near(std::vector<double>{-0.5273, -0.2305, 0.2461, 0.875, 1.2812, 1.9102, 2.3867, 2.6836, 0.6602, 0.957,
                                       1.4336, 2.0625, 2.4688, 3.0977, 3.5742, 3.8711},
                   1e-4));
}

// Lanczos3 (Burn): taps floor − 2 … floor + 3, those outside the input skipped, the rest
// renormalised. At half positions L(½) = 6/π², L(3/2) = −4/(3π²), L(5/2) = 6/(25π²).
TEST(ReferenceInterpolateTest, Lanczos3BothAlignments) {
  // 3 → 5 aligned: ½ reads 0, 1, 2 with 9/16, 9/16, −1/8; 3/2 the same mirrored; whole
  // positions read their source alone.
  EXPECT_THAT(resize_1d({1, 2, 4}, 5, M::Lanczos3, true), Near(std::vector<double>{1, 19.0 / 16, 2, 3.25, 4}, 1e-14));
  // 4 → 3 aligned: 3/2 reads all four, −1/7, 9/14, 9/14, −1/7.
  EXPECT_THAT(resize_1d({1, 2, 4, 8}, 3, M::Lanczos3, true), Near(std::vector<double>{1, 18.0 / 7, 8}, 1e-14));
  // 2 → 4 half-pixel: −¼ reads 0 and 1 with L(¼) and L(5/4), L(x) = 3 sin(πx) sin(πx/3) / (πx)²,
  // renormalised; 5/4 is its mirror image.
  constexpr double pi = std::numbers::pi;
  const double quarter = 3 * std::sin(pi / 4) * std::sin(pi / 12) / (pi * pi / 16);
  const double five_quarters = 3 * std::sin(5 * pi / 4) * std::sin(5 * pi / 12) / (25 * pi * pi / 16);
  const double first = 4 * five_quarters / (quarter + five_quarters);
  const std::vector<double> up = resize_1d({0, 4}, 4, M::Lanczos3, false);
  ASSERT_EQ(up.size(), 4u);
  EXPECT_NEAR(up[0], first, 1e-14);
  EXPECT_NEAR(up[3], 4 - first, 1e-14);  // mirror image of the first
  // Burn's vectors: test_upsample_2x (arange 4 x 4 → 8 x 8, aligned) and test_upsample_half_pixel.
  Device d;
  std::vector<double> arange(16);
  for (std::size_t i = 0; i < 16; ++i) arange[i] = static_cast<double>(i);
  const TensorIr x = d.f64({1, 1, 4, 4}, dtypes::f64, arange);
  const std::vector<double> aligned = interpolate(d, x, {8, 8}, M::Lanczos3, true);
  EXPECT_THAT(std::vector<double>(aligned.begin(), aligned.begin() + 16),
              Near(std::vector<double>{0, 0.2972, 0.8164, 1.3131, 1.6869, 2.1836, 2.7028, 3, 1.1889, 1.4861, 2.0053,
                                       2.5020, 2.8758, 3.3725, 3.8917, 4.1889},
                   1e-4));
  const std::vector<double> half = interpolate(d, x, {8, 8}, M::Lanczos3, false);
  EXPECT_THAT(std::vector<double>(half.begin(), half.begin() + 16),
              Near(std::vector<double>{-0.4626, -0.2276, 0.3055, 0.9087, 1.3512, 1.9543, 2.4875, 2.7225, 0.4773, 0.7123,
                                       1.2454, 1.8486, 2.2911, 2.8942, 3.4274, 3.6623},
                   1e-4));
}

// Every mode keeps a constant image constant (Lanczos3 through its renormalisation), planes are
// independent, and the output is the input's dtype, rounded once.
TEST(ReferenceInterpolateTest, ConstantsPlanesDtypesAndEmptyBatches) {
  Device d;
  const TensorIr flat = d.f64({1, 2, 3, 2}, dtypes::f64, std::vector<double>(12, 2.5));
  for (M mode : {M::Nearest, M::NearestExact, M::Bilinear, M::Bicubic, M::Lanczos3})
    for (bool align : {false, true}) {
      EXPECT_THAT(interpolate(d, flat, {5, 4}, mode, align), Near(std::vector<double>(40, 2.5), 1e-14))
          << static_cast<int>(mode) << " " << align;
    }
  const std::vector<double> v = random_values(2 * 3 * 3 * 4, 11);
  const std::vector<double> all = interpolate(d, d.f64({2, 3, 3, 4}, dtypes::f64, v), {5, 2}, M::Bicubic, false);
  ASSERT_EQ(all.size(), 2u * 3 * 5 * 2);
  for (std::size_t p = 0; p < 6; ++p) {
    const std::vector<double> plane(v.begin() + static_cast<std::ptrdiff_t>(p * 12),
                                    v.begin() + static_cast<std::ptrdiff_t>(p * 12 + 12));
    const std::vector<double> one = interpolate(d, d.f64({1, 1, 3, 4}, dtypes::f64, plane), {5, 2}, M::Bicubic, false);
    EXPECT_EQ(std::vector<double>(all.begin() + static_cast<std::ptrdiff_t>(p * 10),
                                  all.begin() + static_cast<std::ptrdiff_t>(p * 10 + 10)),
              one)
        << "plane " << p;
  }
  const TensorId h =
      d.ok(b::interpolate(d.f64({1, 1, 1, 2}, dtypes::f16, {0, 1}), {1, 3}, {M::Bilinear, true}, d.fresh()));
  EXPECT_EQ(d.tensor(h).dtype(), dtypes::f16);
  EXPECT_EQ(d.f64_of(h), (std::vector<double>{0, 0.5, 1}));
  const TensorId none =
      d.ok(b::interpolate(d.f64({0, 3, 2, 2}, dtypes::f32, {}), {7, 9}, {M::Lanczos3, false}, d.fresh()));
  EXPECT_EQ(d.shape_of(none), (Shape{0, 3, 7, 9}));
}

// ---- InterpolateBackward: the gradient of Interpolate with respect to x

// With L = Σ c · interpolate(x), interpolate_backward(x, c) is ∂L/∂x: central differences of L
// (computed by the executor in f64) match it. Interpolate is linear in x, so the differences are
// exact up to rounding. Up and down in each axis, both alignments.
TEST(ReferenceInterpolateTest, BackwardIsTheGradientOfInterpolate) {
  const Shape xs{1, 2, 3, 4};
  const std::array<std::uint64_t, 2> size{5, 3};  // H 3 → 5 (up), W 4 → 3 (down)
  for (M mode : {M::Bilinear, M::Bicubic, M::Lanczos3})
    for (bool align : {false, true}) {
      Device d;
      std::vector<double> xv = random_values(24, 21);
      const std::vector<double> cv = random_values(30, 22);
      auto loss = [&] { return dot(interpolate(d, d.f64(xs, dtypes::f64, xv), size, mode, align), cv); };
      const std::vector<double> g = d.f64_of(d.ok(b::interpolate_backward(
          d.f64(xs, dtypes::f64, xv), d.f64({1, 2, 5, 3}, dtypes::f64, cv), size, {mode, align}, d.fresh())));
      ASSERT_EQ(g.size(), xv.size());
      for (std::size_t k = 0; k < xv.size(); ++k)
        EXPECT_NEAR(central_difference(xv, k, loss), g[k], 1e-9)
            << "mode " << static_cast<int>(mode) << " align " << align << " x " << k;
    }
}

// Nearest is piecewise constant in the coordinates: its gradient sums each output's grad into
// the one source it read; inputs no output read get 0.
TEST(ReferenceInterpolateTest, NearestBackwardSumsGradsIntoTheChosenSources) {
  Device d;
  auto backward = [&](std::uint64_t in, std::uint64_t out, M mode, const std::vector<double>& g) {
    return d.f64_of(
        d.ok(b::interpolate_backward(d.f64({1, 1, 1, in}, dtypes::f64, std::vector<double>(in, 0)),
                                     d.f64({1, 1, 1, out}, dtypes::f64, g), {1, out}, {mode, false}, d.fresh())));
  };
  const std::vector<double> g5{1, 2, 4, 8, 16}, g3{1, 2, 4};
  EXPECT_EQ(backward(3, 5, M::Nearest, g5), (std::vector<double>{3, 12, 16}));        // sources 0 0 1 1 2
  EXPECT_EQ(backward(3, 5, M::NearestExact, g5), (std::vector<double>{3, 4, 24}));    // sources 0 0 1 2 2
  EXPECT_EQ(backward(4, 3, M::Nearest, g3), (std::vector<double>{1, 2, 4, 0}));       // sources 0 1 2
  EXPECT_EQ(backward(4, 3, M::NearestExact, g3), (std::vector<double>{1, 0, 2, 4}));  // sources 0 2 3
  // 2-D: Burn's test_nearest_backward, 2 x 2 → 4 x 4 with a grad of ones gives 4 everywhere.
  const TensorId ones = d.ok(b::interpolate_backward(d.f64({1, 1, 2, 2}, dtypes::f32, {0, 0, 0, 0}),
                                                     d.f64({1, 1, 4, 4}, dtypes::f32, std::vector<double>(16, 1)),
                                                     {4, 4}, {M::Nearest, true}, d.fresh()));
  EXPECT_EQ(d.f64_of(ones), (std::vector<double>{4, 4, 4, 4}));
  EXPECT_EQ(d.tensor(ones).dtype(), dtypes::f32);
}

// ---- GridSample2d on [[1, 2, 3], [4, 5, 6]] (H 2, W 3): grid (x, y), x along W

std::vector<double> grid_sample(std::vector<double> grid, M mode, P padding, bool align) {
  Device d;
  const TensorIr image = d.f64({1, 1, 2, 3}, dtypes::f64, {1, 2, 3, 4, 5, 6});
  const std::uint64_t points = grid.size() / 2;
  const TensorIr g = d.f64({1, 1, points, 2}, dtypes::f64, grid);
  return d.f64_of(d.ok(b::grid_sample_2d(image, g, {mode, padding, align}, d.fresh())));
}

// With align_corners the corners ±1 are the corner pixels in every mode and padding.
TEST(ReferenceGridSampleTest, AlignedCornersAreTheCornerPixels) {
  const std::vector<double> corners{-1, -1, 1, 1, 1, -1, -1, 1};
  for (M mode : {M::Nearest, M::Bilinear, M::Bicubic})
    for (P padding : {P::Zeros, P::Border, P::Reflection})
      EXPECT_THAT(grid_sample(corners, mode, padding, true), Near(std::vector<double>{1, 6, 3, 4}, 1e-15))
          << static_cast<int>(mode) << " " << static_cast<int>(padding);
}

// Without it ±1 are the corner pixels' outer edges: −1 is pixel −½. Bilinear with zeros reads a
// quarter of the corner pixel; border and reflection read the pixel itself. Nearest rounds half to
// even: x = 2.5 → 2 (inside), y = 1.5 → 2 (outside, zeros).
TEST(ReferenceGridSampleTest, HalfPixelCornersPerPaddingMode) {
  const std::vector<double> corners{-1, -1, 1, 1, 1, -1, -1, 1};
  EXPECT_EQ(grid_sample(corners, M::Bilinear, P::Zeros, false), (std::vector<double>{0.25, 1.5, 0.75, 1}));
  EXPECT_EQ(grid_sample(corners, M::Bilinear, P::Border, false), (std::vector<double>{1, 6, 3, 4}));
  EXPECT_EQ(grid_sample(corners, M::Bilinear, P::Reflection, false), (std::vector<double>{1, 6, 3, 4}));
  EXPECT_EQ(grid_sample(corners, M::Nearest, P::Zeros, false), (std::vector<double>{1, 0, 3, 0}));
  EXPECT_EQ(grid_sample(corners, M::Nearest, P::Border, false), (std::vector<double>{1, 6, 3, 4}));
  // Bicubic at (−½, −½): columns and rows −2 … 1 weigh −0.09375, 0.59375, 0.59375, −0.09375; zeros
  // keeps positions 0 and 1 only: (0.59375 · (0.59375 − 0.1875)) − 0.09375 · (2.375 − 0.46875).
  EXPECT_EQ(grid_sample({-1, -1}, M::Bicubic, P::Zeros, false), (std::vector<double>{0.0625}));
}

// Outside the image, aligned: x = 3 is pixel column 4 (W − 1 = 2 is the last), y = 0 row ½.
// Zeros reads nothing; border clamps to column 2 (½ · 3 + ½ · 6); reflection folds 4 about 2
// back to 0 (½ · 1 + ½ · 4). x = 1.5 is column 2.5: reflected to 1.5.
TEST(ReferenceGridSampleTest, OutsideTheImagePerPaddingMode) {
  const std::vector<double> outside{3, 0, 1.5, -1};
  EXPECT_EQ(grid_sample(outside, M::Bilinear, P::Zeros, true), (std::vector<double>{0, 1.5}));
  EXPECT_EQ(grid_sample(outside, M::Bilinear, P::Border, true), (std::vector<double>{4.5, 3}));
  EXPECT_EQ(grid_sample(outside, M::Bilinear, P::Reflection, true), (std::vector<double>{2.5, 2.5}));
  EXPECT_EQ(grid_sample(outside, M::Nearest, P::Zeros, true), (std::vector<double>{0, 3}));       // 2.5 → 2
  EXPECT_EQ(grid_sample(outside, M::Nearest, P::Border, true), (std::vector<double>{3, 3}));      // rows ½ → 0
  EXPECT_EQ(grid_sample(outside, M::Nearest, P::Reflection, true), (std::vector<double>{1, 3}));  // 1.5 → 2
  // Bicubic at column ½ of row 0 (x = −½): columns −1 … 2; zeros drops −1, border reads column 0
  // for it, reflection column 1.
  EXPECT_EQ(grid_sample({-0.5, -1}, M::Bicubic, P::Zeros, true), (std::vector<double>{1.5}));
  EXPECT_EQ(grid_sample({-0.5, -1}, M::Bicubic, P::Border, true), (std::vector<double>{1.40625}));
  EXPECT_EQ(grid_sample({-0.5, -1}, M::Bicubic, P::Reflection, true), (std::vector<double>{1.3125}));
  // Far away and not finite: zeros and reflection read nothing for a non-finite coordinate, border
  // reads the centre pixel (row (2 − 1) / 2 = 0, column (3 − 1) / 2 = 1), as Burn.
  const std::vector<double> wild{kNaN, 0, 0, kInf, 1e300, 1e300};
  EXPECT_EQ(grid_sample(wild, M::Bilinear, P::Zeros, true), (std::vector<double>{0, 0, 0}));
  EXPECT_EQ(grid_sample(wild, M::Bilinear, P::Border, true), (std::vector<double>{2, 2, 6}));
  EXPECT_EQ(grid_sample(wild, M::Bicubic, P::Reflection, false)[0], 0.0);
}

// Channels share the grid point, batches have their own grids; the output is the tensor's dtype.
TEST(ReferenceGridSampleTest, ChannelsBatchesAndDtypes) {
  Device d;
  const TensorIr t = d.f64({2, 2, 1, 2}, dtypes::f32, {1, 3, 10, 30, 100, 300, 1000, 3000});
  const TensorIr g = d.f64({2, 1, 2, 2}, dtypes::f16, {-1, 0, 0, 0, 1, 0, 0.5, 0});
  const TensorId o = d.ok(b::grid_sample_2d(t, g, {M::Bilinear, P::Border, true}, d.fresh()));
  EXPECT_EQ(d.shape_of(o), (Shape{2, 2, 1, 2}));
  EXPECT_EQ(d.tensor(o).dtype(), dtypes::f32);
  // Batch 0 at columns 0 and ½, batch 1 at columns 1 and ¾.
  EXPECT_EQ(d.f64_of(o), (std::vector<double>{1, 2, 10, 20, 300, 250, 3000, 2500}));
}

// ---- Unfold4d against im2col computed here

std::vector<double> im2col(const std::vector<double>& x, const Shape& s, std::array<std::int64_t, 2> k,
                           const b::Unfold4dOptions& o) {
  const auto H = static_cast<std::int64_t>(s[2]), W = static_cast<std::int64_t>(s[3]);
  auto blocks = [&](std::int64_t in, std::size_t i) {
    const auto span = static_cast<std::int64_t>(o.dilation[i]) * (k[i] - 1) + 1;
    return (in + 2 * static_cast<std::int64_t>(o.padding[i]) - span) / static_cast<std::int64_t>(o.stride[i]) + 1;
  };
  const std::int64_t bh = blocks(H, 0), bw = blocks(W, 1);
  std::vector<double> out;
  for (std::int64_t n = 0; n < static_cast<std::int64_t>(s[0]); ++n)
    for (std::int64_t c = 0; c < static_cast<std::int64_t>(s[1]); ++c)
      for (std::int64_t i = 0; i < k[0]; ++i)
        for (std::int64_t j = 0; j < k[1]; ++j)
          for (std::int64_t oh = 0; oh < bh; ++oh)
            for (std::int64_t ow = 0; ow < bw; ++ow) {
              const std::int64_t h = oh * static_cast<std::int64_t>(o.stride[0]) +
                                     i * static_cast<std::int64_t>(o.dilation[0]) -
                                     static_cast<std::int64_t>(o.padding[0]);
              const std::int64_t w = ow * static_cast<std::int64_t>(o.stride[1]) +
                                     j * static_cast<std::int64_t>(o.dilation[1]) -
                                     static_cast<std::int64_t>(o.padding[1]);
              const bool inside = h >= 0 && h < H && w >= 0 && w < W;
              out.push_back(
                  inside ? x[static_cast<std::size_t>(((n * static_cast<std::int64_t>(s[1]) + c) * H + h) * W + w)]
                         : 0.0);
            }
  return out;
}

TEST(ReferenceUnfold4dTest, MatchesADirectIm2col) {
  const Shape xs{2, 3, 5, 4};
  const std::vector<double> xv = random_values(120, 31);
  b::Unfold4dOptions strided;
  strided.stride = {2, 1};
  strided.padding = {1, 2};
  strided.dilation = {2, 1};
  b::Unfold4dOptions wide;
  wide.padding = {3, 0};
  wide.stride = {3, 3};
  for (const auto& [k, o] :
       {std::pair{std::array<std::int64_t, 2>{2, 3}, b::Unfold4dOptions{}},
        std::pair{std::array<std::int64_t, 2>{2, 3}, strided}, std::pair{std::array<std::int64_t, 2>{1, 1}, strided},
        std::pair{std::array<std::int64_t, 2>{5, 2}, wide}}) {
    Device d;
    const std::array<std::uint64_t, 2> ku{static_cast<std::uint64_t>(k[0]), static_cast<std::uint64_t>(k[1])};
    const TensorId out = d.ok(b::unfold4d(d.f64(xs, dtypes::f64, xv), ku, o, d.fresh()));
    const std::vector<double> want = im2col(xv, xs, k, o);
    EXPECT_EQ(d.f64_of(out), want) << k[0] << "x" << k[1];
    EXPECT_EQ(num_elements(d.shape_of(out)), want.size());
  }
}

// Burn's test_unfold4d_simple and test_unfold4d_complex on arange inputs.
TEST(ReferenceUnfold4dTest, BurnVectors) {
  Device d;
  std::vector<double> a32(32), a24(24);
  for (std::size_t i = 0; i < 32; ++i) a32[i] = static_cast<double>(i);
  for (std::size_t i = 0; i < 24; ++i) a24[i] = static_cast<double>(i);
  const TensorId simple = d.ok(b::unfold4d(d.f64({1, 2, 4, 4}, dtypes::f32, a32), {2, 2}, {}, d.fresh()));
  EXPECT_EQ(d.shape_of(simple), (Shape{1, 8, 9}));
  const std::vector<double> s = d.f64_of(simple);
  EXPECT_EQ(std::vector<double>(s.begin(), s.begin() + 9), (std::vector<double>{0, 1, 2, 4, 5, 6, 8, 9, 10}));
  EXPECT_EQ(std::vector<double>(s.end() - 9, s.end()), (std::vector<double>{21, 22, 23, 25, 26, 27, 29, 30, 31}));
  b::Unfold4dOptions o;
  o.padding = {0, 1};
  o.stride = {1, 2};
  o.dilation = {1, 2};
  const TensorId complex = d.ok(b::unfold4d(d.f64({1, 2, 3, 4}, dtypes::f32, a24), {2, 3}, o, d.fresh()));
  EXPECT_EQ(d.shape_of(complex), (Shape{1, 12, 2}));
  EXPECT_EQ(d.f64_of(complex),
            (std::vector<double>{0, 0, 1, 5, 3, 7, 0, 0, 5, 9, 7, 11, 0, 0, 13, 17, 15, 19, 0, 0, 17, 21, 19, 23}));
}

// ---- What the builders guarantee, forced wrong in hand-made ops: errors that claim the output.

TEST(ReferenceResampleTest, ForcedBadOperationsAreErrors) {
  Device d;
  const TensorIr x = d.f64({1, 1, 2, 2}, dtypes::f32, {1, 2, 3, 4});
  auto expect_error = [&](Operation op, ErrorCode code, const std::string& what) {
    op.tensors.back().id = d.fresh();
    Status st = d.exec.execute(op, d.handles);
    ASSERT_FALSE(st.ok()) << op.to_string();
    EXPECT_EQ(st.error().code, code) << st.error().to_string();
    EXPECT_NE(st.error().message.find(what), std::string::npos) << st.error().message;
    EXPECT_TRUE(d.handles.entry(op.outputs()[0].id)->is_errored());
  };
  const Operation up = b::interpolate(x, {3, 3}, {M::Bilinear, true}, d.fresh()).value();
  Operation bad = up;
  bad.attrs[2] = 5;
  expect_error(bad, ErrorCode::Invalid, "unknown interpolate mode 5");
  bad = up;
  bad.attrs[3] = 2;
  expect_error(bad, ErrorCode::Invalid, "align_corners");
  bad = up;
  bad.attrs[0] = 0, bad.outputs()[0].shape = {1, 1, 0, 3};
  expect_error(bad, ErrorCode::Invalid, "output height must be at least 1, got 0");
  bad = up;
  bad.outputs()[0].shape = {1, 1, 3, 4};
  expect_error(bad, ErrorCode::IncompatibleShapes, "does not have the shape");
  bad = up;
  bad.tensors[0] = d.f64({1, 1, 0, 2}, dtypes::f32, {});
  expect_error(bad, ErrorCode::Invalid, "empty image");
  Operation back =
      b::interpolate_backward(x, d.f64({1, 1, 3, 3}, dtypes::f32, std::vector<double>(9, 1)), {3, 3}, {}, d.fresh())
          .value();
  back.tensors[1] = d.f64({1, 1, 3, 2}, dtypes::f32, std::vector<double>(6, 1));
  expect_error(back, ErrorCode::IncompatibleShapes, "grad");
  back.tensors[1] = d.i64({1, 1, 3, 3}, dtypes::i32, std::vector<std::int64_t>(9, 1));
  expect_error(back, ErrorCode::DTypeMismatch, "grad");
  const Operation gs = b::grid_sample_2d(x, d.f64({1, 1, 1, 2}, dtypes::f32, {0, 0}), {}, d.fresh()).value();
  bad = gs;
  bad.attrs[0] = static_cast<std::int64_t>(M::NearestExact);
  expect_error(bad, ErrorCode::Invalid, "does not apply to grid sampling");
  bad = gs;
  bad.attrs[1] = 3;
  expect_error(bad, ErrorCode::Invalid, "unknown padding mode 3");
  bad = gs;
  bad.tensors[1] = d.f64({1, 1, 1, 3}, dtypes::f32, {0, 0, 0});
  expect_error(bad, ErrorCode::IncompatibleShapes, "[N, Ho, Wo, 2]");
  const Operation uf = b::unfold4d(x, {2, 2}, {}, d.fresh()).value();
  bad = uf;
  bad.attrs[2] = 0;
  expect_error(bad, ErrorCode::Invalid, "stride must be at least 1");
  bad = uf;
  bad.attrs[4] = -1;
  expect_error(bad, ErrorCode::Invalid, "padding");
  bad = uf;
  bad.outputs()[0].shape = {1, 4, 2};
  expect_error(bad, ErrorCode::IncompatibleShapes, "does not have the shape");
}

}  // namespace
}  // namespace kiln::reference::testing
