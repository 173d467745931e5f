// Reference executor: the signal ops (docs/spec/ir.md §5.8). Rfft by hand (with n padding and
// trimming) and against the DFT by its definition along every dim of a rank-3 tensor; IRfft by
// hand, as Rfft's inverse for even and odd n, with missing and surplus bins and the imaginary parts
// of bins 0 and n / 2 unused (C2R); dtypes; forced bad ops.
#include <cmath>
#include <complex>
#include <cstddef>
#include <numbers>
#include <optional>
#include <random>
#include <vector>

#include "kiln/testing/status.h"
#include "reference_test_util.h"

namespace kiln::reference::testing {
namespace {

struct Spectrum {
  std::vector<double> re, im;
};

Spectrum rfft(Device& d, const TensorIr& x, std::uint64_t dim, std::optional<std::uint64_t> n) {
  const TensorId re = d.fresh(), im = d.fresh();
  d.ok(b::rfft(x, dim, n, re, im));
  return {d.f64_of(re), d.f64_of(im)};
}

std::vector<double> irfft(Device& d, const TensorIr& re, const TensorIr& im, std::uint64_t dim,
                          std::optional<std::uint64_t> n) {
  return d.f64_of(d.ok(b::irfft(re, im, dim, n, d.fresh())));
}

// The one-sided DFT of a line by the definition (std::polar of −2π·k·t/n, the line padded or
// trimmed to n): a second implementation, without the kernel's table.
Spectrum dft_by_definition(const std::vector<double>& x, std::size_t n) {
  Spectrum s;
  for (std::size_t k = 0; k <= n / 2; ++k) {
    std::complex<double> acc = 0;
    for (std::size_t t = 0; t < n && t < x.size(); ++t)
      acc += x[t] * std::polar(1.0, -2 * std::numbers::pi * static_cast<double>(k * t) / static_cast<double>(n));
    s.re.push_back(acc.real());
    s.im.push_back(acc.imag());
  }
  return s;
}

constexpr double kTol = 1e-13;

// ---- Rfft

TEST(ReferenceRfftTest, ByHand) {
  Device d;
  // [1, 2, 3, 4]: X = 10, −2 + 2i, −2.
  Spectrum s = rfft(d, d.f64({4}, dtypes::f64, {1, 2, 3, 4}), 0, std::nullopt);
  EXPECT_THAT(s.re, Near(std::vector<double>{10, -2, -2}, kTol));
  EXPECT_THAT(s.im, Near(std::vector<double>{0, 2, 0}, kTol));
  // Padded to 6: X[1] = 1 + 2·e^(−iπ/3) + 3·e^(−2iπ/3) − 4 = −3.5 − 2.5·√3·i,
  // X[2] = 1 + 2·e^(−2iπ/3) + 3·e^(−4iπ/3) + 4 = 2.5 + 0.5·√3·i, X[3] = 1 − 2 + 3 − 4.
  s = rfft(d, d.f64({4}, dtypes::f64, {1, 2, 3, 4}), 0, 6);
  const double r3 = std::sqrt(3.0);
  EXPECT_THAT(s.re, Near(std::vector<double>{10, -3.5, 2.5, -2}, kTol));
  EXPECT_THAT(s.im, Near(std::vector<double>{0, -2.5 * r3, 0.5 * r3, 0}, kTol));
  // Trimmed to 3 points of [1, 2, 3, 4]: X = 6, −1.5 + 0.5·√3·i.
  s = rfft(d, d.f64({4}, dtypes::f64, {1, 2, 3, 4}), 0, 3);
  EXPECT_THAT(s.re, Near(std::vector<double>{6, -1.5}, kTol));
  EXPECT_THAT(s.im, Near(std::vector<double>{0, 0.5 * r3}, kTol));
  // One point: X[0] = x[0]; a constant has its whole sum in bin 0.
  s = rfft(d, d.f64({1}, dtypes::f64, {-7}), 0, std::nullopt);
  EXPECT_EQ(s.re, (std::vector<double>{-7}));
  EXPECT_EQ(s.im, (std::vector<double>{0}));
  s = rfft(d, d.f64({5}, dtypes::f64, {2, 2, 2, 2, 2}), 0, std::nullopt);
  EXPECT_THAT(s.re, Near(std::vector<double>{10, 0, 0}, kTol));
  // An empty signal with n given: every bin is zero.
  s = rfft(d, d.f64({0}, dtypes::f64, {}), 0, 4);
  EXPECT_EQ(s.re, (std::vector<double>{0, 0, 0}));
}

// Every dim of a [3, 5, 4] tensor, with the length, a padding and a trimming n, against the
// definition line by line.
TEST(ReferenceRfftTest, EveryDimAgainstTheDefinition) {
  const Shape shape{3, 5, 4};
  const std::vector<double> x = random_values(60, 7);
  for (std::size_t dim = 0; dim < 3; ++dim) {
    for (std::optional<std::uint64_t> n :
         {std::optional<std::uint64_t>{}, std::optional<std::uint64_t>{7}, std::optional<std::uint64_t>{2}}) {
      Device d;
      const Spectrum s = rfft(d, d.f64(shape, dtypes::f64, x), dim, n);
      const std::size_t len = shape[dim], points = n.value_or(len), bins = points / 2 + 1;
      const std::size_t inner = dim == 2 ? 1 : dim == 1 ? 4 : 20, outer = 60 / (len * inner);
      ASSERT_EQ(s.re.size(), outer * bins * inner);
      for (std::size_t o = 0; o < outer; ++o)
        for (std::size_t i = 0; i < inner; ++i) {
          std::vector<double> line;
          for (std::size_t t = 0; t < len; ++t) line.push_back(x[(o * len + t) * inner + i]);
          const Spectrum want = dft_by_definition(line, points);
          for (std::size_t k = 0; k < bins; ++k) {
            EXPECT_NEAR(s.re[(o * bins + k) * inner + i], want.re[k], 1e-12) << dim << " " << k;
            EXPECT_NEAR(s.im[(o * bins + k) * inner + i], want.im[k], 1e-12) << dim << " " << k;
          }
        }
    }
  }
}

// f32 in, f32 out: each bin rounded once from the f64 sum.
TEST(ReferenceRfftTest, KeepsTheDtype) {
  Device d;
  const TensorIr x = d.f64({2, 3}, dtypes::f32, {0.1, 0.2, 0.3, 1, 2, 4});
  const TensorId re = d.fresh(), im = d.fresh();
  d.ok(b::rfft(x, 1, std::nullopt, re, im));
  EXPECT_EQ(d.tensor(re).dtype(), dtypes::f32);
  EXPECT_EQ(d.tensor(im).dtype(), dtypes::f32);
  const double a = static_cast<double>(0.1f), bb = static_cast<double>(0.2f), cc = static_cast<double>(0.3f);
  EXPECT_EQ(d.f64_of(re)[0], static_cast<double>(static_cast<float>(a + bb + cc)));
  EXPECT_EQ(d.f64_of(re)[2], 7);
}

// ---- IRfft

TEST(ReferenceIRfftTest, ByHand) {
  Device d;
  // Bin 0 alone: a constant 4 / n.
  EXPECT_THAT(irfft(d, d.f64({3}, dtypes::f64, {4, 0, 0}), d.f64({3}, dtypes::f64, {0, 0, 0}), 0, std::nullopt),
              Near(std::vector<double>{1, 1, 1, 1}, kTol));
  // Bin 1 real: 2·cos(πt/2) / 4; imaginary: −2·sin(πt/2) / 4.
  EXPECT_THAT(irfft(d, d.f64({3}, dtypes::f64, {0, 1, 0}), d.f64({3}, dtypes::f64, {0, 0, 0}), 0, std::nullopt),
              Near(std::vector<double>{0.5, 0, -0.5, 0}, kTol));
  EXPECT_THAT(irfft(d, d.f64({3}, dtypes::f64, {0, 0, 0}), d.f64({3}, dtypes::f64, {0, 1, 0}), 0, std::nullopt),
              Near(std::vector<double>{0, -0.5, 0, 0.5}, kTol));
  // The Nyquist bin of an even n: (−1)^t / n.
  EXPECT_THAT(irfft(d, d.f64({3}, dtypes::f64, {0, 0, 4}), d.f64({3}, dtypes::f64, {0, 0, 0}), 0, std::nullopt),
              Near(std::vector<double>{1, -1, 1, -1}, kTol));
}

// C2R: the imaginary parts of bin 0 and of bin n / 2 (n even) do not count; of an odd n, the last
// bin is an ordinary one and its imaginary part does.
TEST(ReferenceIRfftTest, ImaginaryPartsOfBinZeroAndNyquistDoNotCount) {
  Device d;
  const TensorIr re = d.f64({3}, dtypes::f64, {1, 2, 3});
  const std::vector<double> plain = irfft(d, re, d.f64({3}, dtypes::f64, {0, 0.5, 0}), 0, 4);
  EXPECT_EQ(irfft(d, re, d.f64({3}, dtypes::f64, {9, 0.5, -9}), 0, 4), plain);
  EXPECT_NE(irfft(d, re, d.f64({3}, dtypes::f64, {0, 0.5, 1}), 0, 5),
            irfft(d, re, d.f64({3}, dtypes::f64, {0, 0.5, 0}), 0, 5));
}

// irfft(rfft(x), n = len) = x for even and odd lengths, along dim 0 and dim 1.
TEST(ReferenceIRfftTest, InvertsRfft) {
  for (std::uint64_t len : {1u, 2u, 5u, 8u}) {
    for (std::size_t dim = 0; dim < 2; ++dim) {
      Device d;
      const Shape shape = dim == 0 ? Shape{len, 3} : Shape{3, len};
      const std::vector<double> x = random_values(static_cast<std::size_t>(3 * len), len);
      const TensorIr xt = d.f64(shape, dtypes::f64, x);
      const TensorId re = d.fresh(), im = d.fresh();
      d.ok(b::rfft(xt, dim, std::nullopt, re, im));
      const TensorIr re_t{re, d.shape_of(re), TensorStatus::ReadOnly, dtypes::f64};
      const TensorIr im_t{im, d.shape_of(im), TensorStatus::ReadOnly, dtypes::f64};
      EXPECT_THAT(irfft(d, re_t, im_t, dim, len), Near(x, 1e-13)) << len << " " << dim;
    }
  }
}

// Missing bins are zero, bins beyond n / 2 are ignored.
TEST(ReferenceIRfftTest, MissingBinsAreZeroAndSurplusOnesIgnored) {
  Device d;
  // Two bins, n = 8: bin 1 of 1 → 2·cos(2πt/8) / 8.
  const std::vector<double> x = irfft(d, d.f64({2}, dtypes::f64, {0, 1}), d.f64({2}, dtypes::f64, {0, 0}), 0, 8);
  ASSERT_EQ(x.size(), 8u);
  for (std::size_t t = 0; t < 8; ++t)
    EXPECT_NEAR(x[t], std::cos(std::numbers::pi * static_cast<double>(t) / 4) / 4, kTol);
  // Five bins, n = 4: bins 3 and 4 play no part.
  const TensorIr im = d.f64({5}, dtypes::f64, {0, 0, 0, 0, 0});
  EXPECT_EQ(irfft(d, d.f64({5}, dtypes::f64, {1, 2, 3, 50, 60}), im, 0, 4),
            irfft(d, d.f64({5}, dtypes::f64, {1, 2, 3, 0, 0}), im, 0, 4));
}

// ---- Forced bad ops (hand-made: every builder check is made again)

TEST(ReferenceFftTest, HandMadeOpsAreCheckedAgain) {
  Device d;
  const TensorIr x = d.f64({2, 4}, dtypes::f32, {1, 2, 3, 4, 5, 6, 7, 8});
  Operation f = *b::rfft(x, 1, std::nullopt, d.fresh(), d.fresh());
  auto expect_error = [&](Operation op, const char* what) {
    for (TensorIr& o : op.outputs()) o.id = d.fresh();
    const Status st = d.exec.execute(op, d.handles);
    ASSERT_FALSE(st.ok()) << op.to_string();
    EXPECT_NE(st.error().message.find(what), std::string::npos) << st.error().message;
  };
  Operation bad = f;
  bad.attrs[0] = 2;
  expect_error(bad, "dim 2 out of bounds");
  bad = f;
  bad.attrs[1] = -3;
  expect_error(bad, "n must not be negative");
  bad = f;
  bad.attrs[1] = 6;  // n = 6 needs 4 bins, the outputs claim 3
  expect_error(bad, "does not have the shape");
  bad = f;
  bad.outputs()[1].dtype = dtypes::f64;
  expect_error(bad, "must have dtype f32");
  const TensorIr re = d.f64({2, 3}, dtypes::f32, {1, 2, 3, 4, 5, 6});
  Operation inv = *b::irfft(re, d.f64({2, 3}, dtypes::f32, {0, 0, 0, 0, 0, 0}), 1, std::nullopt, d.fresh());
  bad = inv;
  bad.tensors[1] = d.f64({2, 2}, dtypes::f32, {0, 0, 0, 0});
  expect_error(bad, "must have input_re");
  bad = inv;
  bad.tensors[1] = d.f64({2, 3}, dtypes::f64, {0, 0, 0, 0, 0, 0});
  expect_error(bad, "dtypes differ");
  bad = *b::irfft(d.f64({2, 1}, dtypes::f32, {1, 2}), d.f64({2, 1}, dtypes::f32, {0, 0}), 1, 2, d.fresh());
  bad.attrs[1] = 0;  // one bin, no n: no points
  bad.outputs()[0].shape = {2, 0};
  expect_error(bad, "no output points");
  // A huge n on an empty batch allocates nothing and succeeds.
  Operation empty = *b::rfft(d.f64({0, 4}, dtypes::f32, {}), 1, std::nullopt, d.fresh(), d.fresh());
  empty.attrs[1] = std::int64_t{1} << 60;
  empty.outputs()[0].shape = empty.outputs()[1].shape = {0, (std::uint64_t{1} << 59) + 1};
  KILN_EXPECT_OK(d.exec.execute(empty, d.handles));
}

}  // namespace
}  // namespace kiln::reference::testing
