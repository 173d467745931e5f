// Reference kernels of the signal ops (docs/spec/ir.md §5.8): Rfft and IRfft along one dim, as
// plain O(n²) DFTs in f64: a table of the n-th roots of unity indexed by k·t mod n (so every
// twiddle is one rounding of cos / sin), each output summed in index order and rounded once.
// Semantics are torch.fft.rfft / irfft with n (the spec and Burn are silent on n): the signal is
// zero-padded or trimmed to n points; the inverse reads bins 0 .. n/2 of a Hermitian signal,
// missing bins are zero, and the imaginary parts of bins 0 and n/2 do not count (C2R).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <vector>

#include "reference_internal.h"

namespace kiln::reference::kernels {
namespace {

// A tensor around one dim: outer × len × inner elements, the dim's elements `inner` apart.
struct Lines {
  std::uint64_t outer = 1, len = 0, inner = 1;
};

Lines lines_of(const ir::Shape& s, std::size_t dim) {
  return {dims_product(s, 0, dim), s[dim], dims_product(s, dim + 1, s.size())};
}

// cos and sin of 2π·j / n for j in [0, n).
struct Roots {
  std::vector<double> cos, sin;
};

Roots roots_of(std::uint64_t n) {
  Roots r;
  r.cos.resize(static_cast<std::size_t>(n));
  r.sin.resize(static_cast<std::size_t>(n));
  for (std::size_t j = 0; j < r.cos.size(); ++j) {
    const double a = 2 * std::numbers::pi * static_cast<double>(j) / static_cast<double>(n);
    r.cos[j] = std::cos(a);
    r.sin[j] = std::sin(a);
  }
  return r;
}

Status expect_float(const Ctx& c, const HostTensor& t, const char* what) {
  if (!t.dtype().is_float())
    return c.error(ErrorCode::DTypeMismatch, fmt::format("{} {} must have a float dtype", what, t.to_string()));
  return Status::Ok();
}

// The dim attribute and n (attribute 1; 0: none given, so the dim's length, or 2·(len − 1) bins'
// worth for the inverse).
struct Transform {
  std::size_t dim = 0;
  std::uint64_t n = 0;
};

Result<Transform> transform_of(const Ctx& c, const ir::Shape& s, bool inverse) {
  KILN_ASSIGN_OR_RETURN(std::size_t dim, axis_attr(c, 0, s.size(), "dim"));
  KILN_ASSIGN_OR_RETURN(std::uint64_t given, count_attr(c, 1, "n"));
  const std::uint64_t len = s[dim];
  if (inverse && len == 0) return c.error(ErrorCode::Invalid, fmt::format("no bins along dim {}", dim));
  std::uint64_t n = given;
  if (n == 0 && len - 1 <= std::numeric_limits<std::uint64_t>::max() / 2) n = inverse ? 2 * (len - 1) : len;
  if (n == 0) return c.error(ErrorCode::Invalid, fmt::format("no output points along dim {} (n must be given)", dim));
  return Transform{dim, n};
}

// X[k] = Σ_t x[t]·e^(−2πi·k·t/n) for k = 0 .. n/2 over the first min(n, len) points of each line.
void forward_dft(const HostTensor& x, const Lines& l, std::uint64_t n, const HostTensor& re, const HostTensor& im) {
  const Roots r = roots_of(n);
  const std::uint64_t bins = n / 2 + 1, used = std::min(n, l.len);
  for (std::uint64_t o = 0; o < l.outer; ++o)
    for (std::uint64_t i = 0; i < l.inner; ++i)
      for (std::uint64_t k = 0; k < bins; ++k) {
        double sr = 0, si = 0;
        std::uint64_t j = 0;  // k·t mod n
        for (std::uint64_t t = 0; t < used; ++t) {
          const double v = x.get_f64((o * l.len + t) * l.inner + i);
          sr += v * r.cos[j];
          si -= v * r.sin[j];
          j += k;
          if (j >= n) j -= n;
        }
        const std::uint64_t at = (o * bins + k) * l.inner + i;
        element::store_f64(re.mutable_data(), re.dtype(), at, sr);
        element::store_f64(im.mutable_data(), im.dtype(), at, si);
      }
}

// x[t] = (1/n) Σ_k w_k·(Re X[k]·cos θ − Im X[k]·sin θ), θ = 2π·k·t/n, over k = 0 .. min(len − 1,
// n/2): w = 1 for bin 0 and bin n/2 (their imaginary parts drop out), else 2
// (the bin and its mirror n − k).
void inverse_dft(const HostTensor& re, const HostTensor& im, const Lines& l, std::uint64_t n, const HostTensor& out) {
  const Roots r = roots_of(n);
  const std::uint64_t bins = std::min(l.len, n / 2 + 1);
  for (std::uint64_t o = 0; o < l.outer; ++o)
    for (std::uint64_t i = 0; i < l.inner; ++i)
      for (std::uint64_t t = 0; t < n; ++t) {
        double acc = 0;
        std::uint64_t j = 0;  // k·t mod n
        for (std::uint64_t k = 0; k < bins; ++k) {
          const std::uint64_t at = (o * l.len + k) * l.inner + i;
          // Bins 0 and n/2 are their own mirrors: their imaginary parts are dropped outright
          // (sin θ is 0 there, but std::sin(π) is not exactly 0).
          const bool self_mirror = k == 0 || 2 * k == n;
          const double imaginary = self_mirror ? 0.0 : im.get_f64(at) * r.sin[j];
          acc += (self_mirror ? 1.0 : 2.0) * (re.get_f64(at) * r.cos[j] - imaginary);
          j += t;
          if (j >= n) j -= n;
        }
        element::store_f64(out.mutable_data(), out.dtype(), (o * n + t) * l.inner + i, acc / static_cast<double>(n));
      }
}

}  // namespace

// Rfft{signal; dim, n} → out_re, out_im: the signal with [dim] = n / 2 + 1, its dtype.
Result<Outputs> run_rfft(const Ctx& c) {
  const HostTensor& x = c.in[0];
  KILN_RETURN_IF_ERROR(expect_float(c, x, "signal"));
  KILN_ASSIGN_OR_RETURN(Transform f, transform_of(c, x.shape(), false));
  ir::Shape shape = x.shape();
  shape[f.dim] = f.n / 2 + 1;
  for (std::size_t o = 0; o < 2; ++o) {
    KILN_RETURN_IF_ERROR(expect_out_shape(c, o, shape));
    KILN_RETURN_IF_ERROR(expect_out_dtype(c, o, x.dtype()));
  }
  KILN_ASSIGN_OR_RETURN(HostTensor re, c.new_output(0));
  KILN_ASSIGN_OR_RETURN(HostTensor im, c.new_output(1));
  // No roots table for an empty output: n may be an attribute far beyond any allocation.
  if (re.num_elements() != 0) forward_dft(x, lines_of(x.shape(), f.dim), f.n, re, im);
  Outputs outs;
  outs.push_back(std::move(re));
  outs.push_back(std::move(im));
  return outs;
}

// IRfft{input_re, input_im; dim, n} → input_re with [dim] = n, its dtype.
Result<Outputs> run_irfft(const Ctx& c) {
  const HostTensor& re = c.in[0];
  const HostTensor& im = c.in[1];
  KILN_RETURN_IF_ERROR(expect_float(c, re, "input_re"));
  KILN_RETURN_IF_ERROR(expect_same_dtype(c, 0, 1));
  if (im.shape() != re.shape())
    return c.error(ErrorCode::IncompatibleShapes,
                   fmt::format("input_im {} must have input_re {}'s shape", im.to_string(), re.to_string()));
  KILN_ASSIGN_OR_RETURN(Transform f, transform_of(c, re.shape(), true));
  ir::Shape shape = re.shape();
  shape[f.dim] = f.n;
  KILN_RETURN_IF_ERROR(expect_out_shape(c, 0, shape));
  KILN_RETURN_IF_ERROR(expect_out_dtype(c, 0, re.dtype()));
  KILN_ASSIGN_OR_RETURN(HostTensor out, c.new_output());
  if (out.num_elements() != 0) inverse_dft(re, im, lines_of(re.shape(), f.dim), f.n, out);
  return single(std::move(out));
}

}  // namespace kiln::reference::kernels
