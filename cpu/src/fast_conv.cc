// Convolutions on the fast path: every convolution kind of docs/spec/ir.md §5.8 (Conv1d/2d/3d,
// ConvTranspose1d/2d/3d, their X, Weight and Bias gradients) for f32 and f64 operands.
//
// f32 (what models train in): im2col and the matmul programs' packed GEMM (gemm_rows), sums in
// f32 in the GEMM's order, like a matmul: the reference's numbers within a matmul's tolerance,
// not its bits (docs/decisions.md, "Convolutions on the fast CPU path"). Per (batch, group):
//   * forward (into y): y = W_g [cout_g, Kc] x im2col(x) [Kc, P] + bias (Kc = cin_g · taps);
//   * into x (the X gradient, a transposed forward): W_g^T x a, its columns added back (col2im);
//   * into w (the Weight gradients): the transpose of Σ_n im2col(x[n]) [Kc, P] x b[n]^T [P, cout_g],
//     the batch in a fixed number of chunks whose partial sums are added in order (any thread
//     count gives the same numbers).
//
// f64 gives the reference's numbers bit for bit. The reference (reference/src/reference_conv.cc)
// sums each output element's product terms in f64, in a documented order, and rounds once. These
// kernels keep f64 accumulators and the same order per element, but walk the loop space so that
// the innermost loop runs along a row of the last spatial dim (contiguous loads and stores, no
// per-tap bounds checks), and split the work over independent output slices on the device's arena:
//   * forward (into y): per (batch, out channel); per element the terms come in (input channel,
//     kernel position) order, as the reference's.
//   * into x (the X gradient, a transposed forward): per (batch, in channel); the reference adds
//     an x element's terms in (out channel, output position) order, which for a fixed element is
//     the kernel positions in descending order (the output position falls as the kernel index
//     rises), so the kernel loops run backwards.
//   * into w (the Weight gradients): per (out channel, in channel); a weight element's terms come
//     in (batch, output position) order.
// Anything else (f16/bf16, mixed dtypes, an attribute or shape the builders would refuse) is
// declined: the reference runs the op and reports the error.
#include "fast_conv.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <type_traits>
#include <vector>

#include <boost/container/small_vector.hpp>

#include "fast_program.h"
#include "fast_single_op.h"
#include "kiln/ir/builders.h"
#include "kiln/ir/shape.h"

namespace kiln::cpu::fast {
namespace {

using ir::build::ConvKindInfo;
using ir::build::ConvRole;

// Three spatial dims, the op's real ones last (leading unit dims): the innermost loop is the
// last real dim, and the lexicographic order of positions is the reference's.
using Dims = std::array<std::uint64_t, 3>;

struct Space {
  std::uint64_t batch = 0, c_in = 0, c_out = 0, groups = 1;
  Dims in{1, 1, 1}, out{1, 1, 1}, kernel{1, 1, 1};
  Dims stride{1, 1, 1}, padding{0, 0, 0}, dilation{1, 1, 1};
  static std::uint64_t product(const Dims& d) { return d[0] * d[1] * d[2]; }
  std::uint64_t cin_g() const { return c_in / groups; }
  std::uint64_t cout_g() const { return c_out / groups; }
};

// The outputs o of dim d whose input position o·stride + k·dilation − padding lies in [0, in).
struct Range {
  std::uint64_t lo = 0, hi = 0;  // [lo, hi), empty when lo >= hi
};
Range valid_outputs(const Space& s, std::size_t d, std::uint64_t k) {
  const std::int64_t offset = static_cast<std::int64_t>(k * s.dilation[d]) - static_cast<std::int64_t>(s.padding[d]);
  const auto stride = static_cast<std::int64_t>(s.stride[d]);
  const auto in = static_cast<std::int64_t>(s.in[d]);
  const std::int64_t lo = offset >= 0 ? 0 : (-offset + stride - 1) / stride;
  const std::int64_t last = in - 1 - offset;  // o·stride <= last
  if (last < 0) return {};
  const std::int64_t hi = std::min<std::int64_t>(last / stride + 1, static_cast<std::int64_t>(s.out[d]));
  return {static_cast<std::uint64_t>(lo), static_cast<std::uint64_t>(std::max(hi, lo))};
}
std::uint64_t input_position(const Space& s, std::size_t d, std::uint64_t o, std::uint64_t k) {
  return o * s.stride[d] + k * s.dilation[d] - s.padding[d];  // within [0, in) for o in valid_outputs
}
// The innermost dim's tap of output o2 is row[o2 · stride + offset] (offset may be negative).
std::int64_t last_dim_offset(const Space& s, std::uint64_t k2) {
  return static_cast<std::int64_t>(k2 * s.dilation[2]) - static_cast<std::int64_t>(s.padding[2]);
}

// ---- Reading the op: the attributes and shapes, checked as the builders check them

// The attributes (ir::build::conv_options_of, which checks them as the builders do), right-aligned.
std::optional<Space> read_attributes(const ir::Operation& op, const ConvKindInfo& k, Dims& padding_out) {
  Result<ir::build::ConvOptions> o = ir::build::conv_options_of(op);
  if (!o.ok()) return std::nullopt;
  Space s;
  for (std::size_t i = 0; i < k.rank; ++i) {
    const std::size_t d = 3 - k.rank + i;
    s.stride[d] = o->stride[i];
    s.padding[d] = o->padding[i];
    s.dilation[d] = o->dilation[i];
    if (k.transposed) padding_out[d] = o->padding_out[i];
  }
  s.groups = o->groups;
  return s;
}

// The loop space from the op's x and weight (the reference's conv_space / transposed_space).
std::optional<Space> read_space(const ir::Operation& op, const ConvKindInfo& k) {
  Dims padding_out{0, 0, 0};
  std::optional<Space> s = read_attributes(op, k, padding_out);
  if (!s || op.inputs().size() < 2) return std::nullopt;
  const ir::Shape& xs = op.inputs()[0].shape;
  const ir::Shape& ws = op.inputs()[1].shape;
  if (xs.size() != k.rank + 2 || ws.size() != k.rank + 2) return std::nullopt;
  const std::uint64_t g = s->groups;
  s->batch = xs[0];
  if (!k.transposed) {
    if (xs[1] % g != 0 || ws[0] % g != 0 || ws[1] != xs[1] / g) return std::nullopt;
    s->c_in = xs[1];
    s->c_out = ws[0];
  } else {
    if (xs[1] != ws[0] || ws[0] % g != 0 || __builtin_mul_overflow(ws[1], g, &s->c_in)) return std::nullopt;
    s->c_out = xs[1];
  }
  for (std::size_t i = 0; i < k.rank; ++i) {
    const std::size_t d = 3 - k.rank + i;
    s->kernel[d] = ws[2 + i];
    Result<std::uint64_t> size =
        k.transposed ? ir::shape::conv_transpose_output(xs[2 + i], s->kernel[d], s->stride[d], s->padding[d],
                                                        padding_out[d], s->dilation[d])
                     : ir::shape::conv_output(xs[2 + i], s->kernel[d], s->stride[d], s->padding[d], s->dilation[d]);
    if (!size.ok()) return std::nullopt;
    (k.transposed ? s->out[d] : s->in[d]) = xs[2 + i];
    (k.transposed ? s->in[d] : s->out[d]) = *size;
  }
  return s;
}

ir::Shape with_spatial(const Space& s, std::uint64_t channels, const Dims& d, std::size_t rank) {
  ir::Shape shape{s.batch, channels};
  for (std::size_t i = 3 - rank; i < 3; ++i) shape.push_back(d[i]);
  return shape;
}

// ---- The three loop spaces. `a` and `b` are the operands as the reference names them.

template <class T>
struct Operands {
  const T* a = nullptr;
  const T* b = nullptr;
  const T* bias = nullptr;  // forwards only
  T* out = nullptr;
};

// y[n, co] = bias[co] + Σ_ci Σ_k x[n, g·cin_g + ci, o·s + k·d − p] · w[co, ci, k]; a = x, b = w.
template <class T>
void into_y(const Space& s, const Operands<T>& p, std::uint64_t slice, std::vector<double>& acc) {
  const std::uint64_t n = slice / s.c_out, co = slice % s.c_out, g = co / s.cout_g();
  const std::uint64_t in_size = Space::product(s.in), out_size = Space::product(s.out);
  const std::uint64_t k_size = Space::product(s.kernel);
  std::fill(acc.begin(), acc.end(), p.bias != nullptr ? static_cast<double>(p.bias[co]) : 0.0);
  std::array<Range, 3> r0;
  for (std::uint64_t ci = 0; ci < s.cin_g(); ++ci) {
    const T* x = p.a + (n * s.c_in + g * s.cin_g() + ci) * in_size;
    const T* w = p.b + (co * s.cin_g() + ci) * k_size;
    for (std::uint64_t k0 = 0; k0 < s.kernel[0]; ++k0) {
      r0[0] = valid_outputs(s, 0, k0);
      for (std::uint64_t k1 = 0; k1 < s.kernel[1]; ++k1) {
        r0[1] = valid_outputs(s, 1, k1);
        for (std::uint64_t k2 = 0; k2 < s.kernel[2]; ++k2) {
          r0[2] = valid_outputs(s, 2, k2);
          const double wv = static_cast<double>(w[(k0 * s.kernel[1] + k1) * s.kernel[2] + k2]);
          for (std::uint64_t o0 = r0[0].lo; o0 < r0[0].hi; ++o0)
            for (std::uint64_t o1 = r0[1].lo; o1 < r0[1].hi; ++o1) {
              const T* xr = x + (input_position(s, 0, o0, k0) * s.in[1] + input_position(s, 1, o1, k1)) * s.in[2];
              double* yr = acc.data() + (o0 * s.out[1] + o1) * s.out[2];
              const auto step = static_cast<std::int64_t>(s.stride[2]);
              const std::int64_t off = last_dim_offset(s, k2);
              for (std::uint64_t o2 = r0[2].lo; o2 < r0[2].hi; ++o2)
                yr[o2] += static_cast<double>(xr[static_cast<std::int64_t>(o2) * step + off]) * wv;
            }
        }
      }
    }
  }
  T* y = p.out + slice * out_size;
  for (std::uint64_t i = 0; i < out_size; ++i) y[i] = static_cast<T>(acc[i]);
}

// x[n, ci] = Σ_co Σ_o a[n, co, o] · w[co, ci − g·cin_g, k] over the taps that reach it (then +
// bias[ci] for a transposed forward); a is the y side.
template <class T>
void into_x(const Space& s, const Operands<T>& p, std::uint64_t slice, std::vector<double>& acc) {
  const std::uint64_t n = slice / s.c_in, ci = slice % s.c_in, g = ci / s.cin_g(), cig = ci % s.cin_g();
  const std::uint64_t out_size = Space::product(s.out), in_size = Space::product(s.in);
  const std::uint64_t k_size = Space::product(s.kernel);
  std::fill(acc.begin(), acc.end(), 0.0);
  std::array<Range, 3> r0;
  for (std::uint64_t co = g * s.cout_g(); co < (g + 1) * s.cout_g(); ++co) {
    const T* y = p.a + (n * s.c_out + co) * out_size;
    const T* w = p.b + (co * s.cin_g() + cig) * k_size;
    for (std::uint64_t k0 = s.kernel[0]; k0-- > 0;) {
      r0[0] = valid_outputs(s, 0, k0);
      for (std::uint64_t k1 = s.kernel[1]; k1-- > 0;) {
        r0[1] = valid_outputs(s, 1, k1);
        for (std::uint64_t k2 = s.kernel[2]; k2-- > 0;) {
          r0[2] = valid_outputs(s, 2, k2);
          const double wv = static_cast<double>(w[(k0 * s.kernel[1] + k1) * s.kernel[2] + k2]);
          for (std::uint64_t o0 = r0[0].lo; o0 < r0[0].hi; ++o0)
            for (std::uint64_t o1 = r0[1].lo; o1 < r0[1].hi; ++o1) {
              double* xr =
                  acc.data() + (input_position(s, 0, o0, k0) * s.in[1] + input_position(s, 1, o1, k1)) * s.in[2];
              const T* yr = y + (o0 * s.out[1] + o1) * s.out[2];
              const auto step = static_cast<std::int64_t>(s.stride[2]);
              const std::int64_t off = last_dim_offset(s, k2);
              for (std::uint64_t o2 = r0[2].lo; o2 < r0[2].hi; ++o2)
                xr[static_cast<std::int64_t>(o2) * step + off] += static_cast<double>(yr[o2]) * wv;
            }
        }
      }
    }
  }
  T* x = p.out + slice * in_size;
  const double bias = p.bias != nullptr ? static_cast<double>(p.bias[ci]) : 0.0;
  for (std::uint64_t i = 0; i < in_size; ++i) x[i] = static_cast<T>(p.bias != nullptr ? acc[i] + bias : acc[i]);
}

// sums[k2] += Σ_o2 xr[o2·stride + k2·dilation − padding] · yr[o2] over one row, each sum's terms
// in o2 order. Up to 8 kernel columns advance together (independent chains: the dependent adds of
// one sum would otherwise bound the loop); a wider kernel takes them one by one.
template <class T>
void accumulate_row(const Space& s, const T* xr, const T* yr, double* sums) {
  const std::uint64_t kw = s.kernel[2];
  const auto step = static_cast<std::int64_t>(s.stride[2]);
  if (kw > 8) {
    for (std::uint64_t k2 = 0; k2 < kw; ++k2) {
      const Range r = valid_outputs(s, 2, k2);
      const std::int64_t off = last_dim_offset(s, k2);
      double sum = sums[k2];
      for (std::uint64_t o2 = r.lo; o2 < r.hi; ++o2)
        sum += static_cast<double>(xr[static_cast<std::int64_t>(o2) * step + off]) * static_cast<double>(yr[o2]);
      sums[k2] = sum;
    }
    return;
  }
  std::array<double, 8> acc{};
  std::array<Range, 8> r{};
  std::array<std::int64_t, 8> off{};
  for (std::uint64_t k2 = 0; k2 < kw; ++k2) {
    acc[k2] = sums[k2];
    r[k2] = valid_outputs(s, 2, k2);
    off[k2] = last_dim_offset(s, k2);
  }
  // Where every column's tap is inside the row (the interior), no bounds checks.
  std::uint64_t lo = 0, hi = s.out[2];
  for (std::uint64_t k2 = 0; k2 < kw; ++k2) {
    lo = std::max(lo, r[k2].lo);
    hi = std::min(hi, r[k2].hi);
  }
  hi = std::max(hi, lo);
  auto checked = [&](std::uint64_t o2) {
    const double yv = static_cast<double>(yr[o2]);
    for (std::uint64_t k2 = 0; k2 < kw; ++k2)
      if (o2 >= r[k2].lo && o2 < r[k2].hi)
        acc[k2] += static_cast<double>(xr[static_cast<std::int64_t>(o2) * step + off[k2]]) * yv;
  };
  for (std::uint64_t o2 = 0; o2 < lo; ++o2) checked(o2);
  for (std::uint64_t o2 = lo; o2 < hi; ++o2) {
    const double yv = static_cast<double>(yr[o2]);
    const T* xo = xr + static_cast<std::int64_t>(o2) * step;
    for (std::uint64_t k2 = 0; k2 < kw; ++k2) acc[k2] += static_cast<double>(xo[off[k2]]) * yv;
  }
  for (std::uint64_t o2 = hi; o2 < s.out[2]; ++o2) checked(o2);
  for (std::uint64_t k2 = 0; k2 < kw; ++k2) sums[k2] = acc[k2];
}

// w[co, ci] = Σ_n Σ_o a[n, g·cin_g + ci, o·s + k·d − p] · b[n, co, o]; a is the x side, b the y side.
template <class T>
void into_w(const Space& s, const Operands<T>& p, std::uint64_t slice, std::vector<double>& acc) {
  const std::uint64_t co = slice / s.cin_g(), ci = slice % s.cin_g(), g = co / s.cout_g();
  const std::uint64_t out_size = Space::product(s.out), in_size = Space::product(s.in);
  const std::uint64_t k_size = Space::product(s.kernel);
  std::fill(acc.begin(), acc.end(), 0.0);
  std::array<Range, 2> r;
  for (std::uint64_t n = 0; n < s.batch; ++n) {
    const T* x = p.a + (n * s.c_in + g * s.cin_g() + ci) * in_size;
    const T* y = p.b + (n * s.c_out + co) * out_size;
    for (std::uint64_t o0 = 0; o0 < s.out[0]; ++o0)
      for (std::uint64_t o1 = 0; o1 < s.out[1]; ++o1) {
        const T* yr = y + (o0 * s.out[1] + o1) * s.out[2];
        for (std::uint64_t k0 = 0; k0 < s.kernel[0]; ++k0) {
          r[0] = valid_outputs(s, 0, k0);
          if (o0 < r[0].lo || o0 >= r[0].hi) continue;
          for (std::uint64_t k1 = 0; k1 < s.kernel[1]; ++k1) {
            r[1] = valid_outputs(s, 1, k1);
            if (o1 < r[1].lo || o1 >= r[1].hi) continue;
            const T* xr = x + (input_position(s, 0, o0, k0) * s.in[1] + input_position(s, 1, o1, k1)) * s.in[2];
            accumulate_row(s, xr, yr, acc.data() + (k0 * s.kernel[1] + k1) * s.kernel[2]);
          }
        }
      }
  }
  T* w = p.out + slice * k_size;
  for (std::uint64_t i = 0; i < k_size; ++i) w[i] = static_cast<T>(acc[i]);
}

enum class Into { Y, X, W };

// ---- f32: im2col + the packed GEMM (gemm_rows)
//
// One row of a group's im2col columns: input channel ci (at `channel` elements into the slice)
// and kernel tap (k0, k1, k2), kk = ci·kvol + tap; the outputs whose tap lies inside x per dim
// (r0, r1, r2) and the tap's offset along the last dim.
struct ColumnRow {
  std::uint64_t kk = 0, channel = 0, k0 = 0, k1 = 0;
  Range r0, r1, r2;
  std::int64_t off = 0;
};

// Every row of one group's columns, in kk order.
std::vector<ColumnRow> column_rows(const Space& s) {
  const std::uint64_t in_size = Space::product(s.in), k_size = Space::product(s.kernel);
  std::vector<ColumnRow> rows;
  rows.reserve(s.cin_g() * k_size);
  for (std::uint64_t ci = 0; ci < s.cin_g(); ++ci)
    for (std::uint64_t k0 = 0; k0 < s.kernel[0]; ++k0)
      for (std::uint64_t k1 = 0; k1 < s.kernel[1]; ++k1)
        for (std::uint64_t k2 = 0; k2 < s.kernel[2]; ++k2)
          rows.push_back(ColumnRow{ci * k_size + (k0 * s.kernel[1] + k1) * s.kernel[2] + k2, ci * in_size, k0, k1,
                                   valid_outputs(s, 0, k0), valid_outputs(s, 1, k1), valid_outputs(s, 2, k2),
                                   last_dim_offset(s, k2)});
  return rows;
}

// The offset in a channel of x of the row that output row (o0, o1) reads at the row's tap.
std::uint64_t x_row(const Space& s, const ColumnRow& r, std::uint64_t o0, std::uint64_t o1) {
  return (input_position(s, 0, o0, r.k0) * s.in[1] + input_position(s, 1, o1, r.k1)) * s.in[2];
}

// Output positions [p0, p1) as runs along the last dim, one output row (o0, o1) each: entries
// [a, b) of that row.
struct PositionRun {
  std::uint64_t o0, o1, a, b;
};
using PositionRuns = boost::container::small_vector<PositionRun, 8>;
PositionRuns position_runs(const Space& s, std::uint64_t p0, std::uint64_t p1) {
  PositionRuns runs;
  for (std::uint64_t p = p0; p < p1;) {
    const std::uint64_t row = p / s.out[2], a = p % s.out[2];
    const std::uint64_t b = std::min<std::uint64_t>(s.out[2], a + (p1 - p));
    runs.push_back(PositionRun{row / s.out[1], row % s.out[1], a, b});
    p += b - a;
  }
  return runs;
}

// One output row (o0, o1) of column row r, located once: entry o2 reads x's row at
// o2 · stride + off when o2 is in [lo, hi), and is 0 otherwise (lo = hi when the row is padding).
template <class T>
struct ColumnRun {
  const T* xr = nullptr;  // x's row (never offset before its start)
  std::uint64_t lo = 0, hi = 0;
  std::int64_t step = 1, off = 0;

  // Entries [a, b) of the row into dst[0, b - a).
  void write(std::uint64_t a, std::uint64_t b, T* dst) const {
    const std::uint64_t v0 = std::clamp(lo, a, b), v1 = std::clamp(hi, v0, b);
    std::fill_n(dst, v0 - a, T{0});
    if (v1 > v0) {
      if (step == 1)
        std::copy_n(xr + (static_cast<std::int64_t>(v0) + off), v1 - v0, dst + (v0 - a));
      else
        for (std::uint64_t i = v0; i < v1; ++i) dst[i - a] = xr[static_cast<std::int64_t>(i) * step + off];
    }
    std::fill_n(dst + (v1 - a), b - v1, T{0});
  }
};

template <class T>
ColumnRun<T> column_run(const Space& s, const ColumnRow& r, const T* x, const PositionRun& run) {
  if (run.o0 < r.r0.lo || run.o0 >= r.r0.hi || run.o1 < r.r1.lo || run.o1 >= r.r1.hi) return {};
  return {x + r.channel + x_row(s, r, run.o0, run.o1), r.r2.lo, r.r2.hi, static_cast<std::int64_t>(s.stride[2]), r.off};
}

// Output positions [p0, p1) of the columns of one (batch, group) slice of the x side: entry
// (kk, p), p an output position, is x[ci, the input position tap reaches from p], 0 in the
// padding; stored [Kc, p1 - p0] (row kk: one tap's view of x over those positions).
template <class T>
void im2col(const Space& s, const std::vector<ColumnRow>& rows, const T* x, std::uint64_t p0, std::uint64_t p1,
            T* col) {
  const PositionRuns runs = position_runs(s, p0, p1);
  for (const ColumnRow& r : rows) {
    T* dst = col + r.kk * (p1 - p0);
    for (const PositionRun& run : runs) {
      column_run(s, r, x, run).write(run.a, run.b, dst);
      dst += run.b - run.a;
    }
  }
}

// The same columns as gemm_rows' B [Kc, P], packed panel by panel straight from x (an implicit
// im2col: the columns are never stored, and what a panel reads of x stays in cache).
template <class T>
class ColumnPanels final : public GemmPanelSource<T> {
 public:
  ColumnPanels(const Space& s, const std::vector<ColumnRow>& rows, const T* x) : s_(s), rows_(rows), x_(x) {}

  // Per column row, the chunk's runs of positions: each run located once, then written panel
  // piece by panel piece (a run crosses panel ends).
  void pack(std::size_t j0, std::size_t width, T* panels) const override {
    const std::size_t nr = gemm_panel_width<T>();
    const std::size_t k = rows_.size();
    const PositionRuns runs = position_runs(s_, j0, j0 + width);
    for (const ColumnRow& r : rows_) {
      T* row_base = panels + r.kk * nr;  // column c at row_base + (c / nr) · nr · k + c % nr
      std::size_t c = 0;                 // the chunk's column of the run's first position
      for (const PositionRun& run : runs) {
        const ColumnRun<T> source = column_run(s_, r, x_, run);
        for (std::uint64_t o2 = run.a; o2 < run.b;) {
          const std::size_t col = c + (o2 - run.a), j = col % nr;
          const std::uint64_t end = std::min<std::uint64_t>(run.b, o2 + (nr - j));
          source.write(o2, end, row_base + col / nr * nr * k + j);
          o2 = end;
        }
        c += run.b - run.a;
      }
    }
    if (const std::size_t used = width % nr; used != 0)
      for (std::size_t kk = 0; kk < k; ++kk)
        std::fill_n(panels + width / nr * nr * k + kk * nr + used, nr - used, T{0});
  }

 private:
  const Space& s_;
  const std::vector<ColumnRow>& rows_;
  const T* x_;
};

// t[c, r] = m[r, c] for an m of `rows` x `cols`.
template <class T>
void transpose_into(const T* m, std::uint64_t rows, std::uint64_t cols, T* t) {
  for (std::uint64_t r = 0; r < rows; ++r)
    for (std::uint64_t c = 0; c < cols; ++c) t[c * rows + r] = m[r * cols + c];
}

// The adjoint of im2col over output positions [p0, p1) ([Kc, p1 - p0] columns): adds each
// column entry into the x element it was read from.
template <class T>
void col2im_add(const Space& s, const std::vector<ColumnRow>& rows, const T* col, std::uint64_t p0, std::uint64_t p1,
                T* x) {
  const auto step = static_cast<std::int64_t>(s.stride[2]);
  const PositionRuns runs = position_runs(s, p0, p1);
  for (const ColumnRow& r : rows) {
    const T* c = col + r.kk * (p1 - p0);
    for (const PositionRun& run : runs) {
      const T* cr = c;  // cr[o2 - run.a]: this run's entry at o2
      c += run.b - run.a;
      if (run.o0 < r.r0.lo || run.o0 >= r.r0.hi || run.o1 < r.r1.lo || run.o1 >= r.r1.hi) continue;
      const std::uint64_t lo = std::clamp(r.r2.lo, run.a, run.b), hi = std::clamp(r.r2.hi, lo, run.b);
      T* xr = x + r.channel + x_row(s, r, run.o0, run.o1);
      for (std::uint64_t o2 = lo; o2 < hi; ++o2) xr[static_cast<std::int64_t>(o2) * step + r.off] += cr[o2 - run.a];
    }
  }
}

// The weight gradient's batch is split into at most this many chunks, each summed into its own
// partial gradient, the partials then added in chunk order: parallel work for a single group,
// with results that do not depend on the thread count.
constexpr std::uint64_t kWeightChunks = 4;

// The sizes every f32 loop space below works with.
struct GemmSpace {
  explicit GemmSpace(const Space& s)
      : in_size(Space::product(s.in)),
        out_size(Space::product(s.out)),
        columns(s.cin_g() * Space::product(s.kernel)),
        cin_g(s.cin_g()),
        cout_g(s.cout_g()) {
    // Per task: at least kParallelThreshold · 16 multiply-adds (a (batch, group) slice has
    // cout_g · P · Kc of them).
    grain =
        std::max<std::uint64_t>(1, kParallelThreshold * 16 / std::max<std::uint64_t>(cout_g * out_size * columns, 1));
  }
  std::uint64_t in_size, out_size, columns, cin_g, cout_g, grain;  // columns: Kc, one group's im2col rows

  // Output positions per pass of the backward kernels, so that a pass's [Kc, positions] columns
  // stay in L2 (kColumnChunkBytes) between the GEMM and im2col / col2im; the weight gradient's
  // passes are whole multiples of kWeightChunkStep positions (its GEMM's K).
  std::uint64_t column_chunk() const {
    return std::max<std::uint64_t>(16, kColumnChunkBytes / (std::max<std::uint64_t>(columns, 1) * sizeof(float)));
  }
  std::uint64_t weight_chunk() const {
    return std::max<std::uint64_t>(1, column_chunk() / kWeightChunkStep) * kWeightChunkStep;
  }
  static constexpr std::uint64_t kColumnChunkBytes = std::uint64_t{512} << 10;
  static constexpr std::uint64_t kWeightChunkStep = 256;
};

// y[n, group's channels] = W_g [cout_g, Kc] x columns [Kc, P] (+ bias).
template <class T>
void forward_gemm(const Launch& launch, const Space& s, const Operands<T>& p) {
  const GemmSpace z(s);
  const std::vector<ColumnRow> rows = column_rows(s);
  parallel_ranges(launch, s.batch * s.groups, z.grain, [&](std::uint64_t begin, std::uint64_t end) {
    for (std::uint64_t i = begin; i < end; ++i) {
      const std::uint64_t n = i / s.groups, g = i % s.groups;
      const ColumnPanels<T> columns(s, rows, p.a + (n * s.c_in + g * z.cin_g) * z.in_size);
      T* y = p.out + (n * s.c_out + g * z.cout_g) * z.out_size;
      for (std::uint64_t co = 0; co < z.cout_g; ++co)
        std::fill_n(y + co * z.out_size, z.out_size, p.bias != nullptr ? p.bias[g * z.cout_g + co] : T{0});
      gemm_rows<T>(z.cout_g, z.out_size, z.columns, p.b + g * z.cout_g * z.columns, z.columns, columns, y, z.out_size,
                   /*add_to_c=*/true);
    }
  });
}

// columns [Kc, P] = W_g^T [Kc, cout_g] x a[n, group's channels] [cout_g, P], added back into x (+ bias).
template <class T>
void into_x_gemm(const Launch& launch, const Space& s, const Operands<T>& p) {
  const GemmSpace z(s);
  const std::vector<ColumnRow> rows = column_rows(s);
  std::vector<T> wt(s.groups * z.columns * z.cout_g);
  for (std::uint64_t g = 0; g < s.groups; ++g)
    transpose_into(p.b + g * z.cout_g * z.columns, z.cout_g, z.columns, wt.data() + g * z.columns * z.cout_g);
  const std::uint64_t chunk = std::min(z.column_chunk(), z.out_size);
  parallel_ranges(launch, s.batch * s.groups, z.grain, [&](std::uint64_t begin, std::uint64_t end) {
    std::vector<T> col(z.columns * chunk);
    for (std::uint64_t i = begin; i < end; ++i) {
      const std::uint64_t n = i / s.groups, g = i % s.groups;
      T* x = p.out + (n * s.c_in + g * z.cin_g) * z.in_size;
      for (std::uint64_t ci = 0; ci < z.cin_g; ++ci)
        std::fill_n(x + ci * z.in_size, z.in_size, p.bias != nullptr ? p.bias[g * z.cin_g + ci] : T{0});
      const T* a = p.a + (n * s.c_out + g * z.cout_g) * z.out_size;
      for (std::uint64_t p0 = 0; p0 < z.out_size; p0 += chunk) {
        const std::uint64_t p1 = std::min(z.out_size, p0 + chunk);
        gemm_rows<T>(z.columns, p1 - p0, z.cout_g, wt.data() + g * z.columns * z.cout_g, z.cout_g, a + p0, z.out_size,
                     col.data(), p1 - p0, false);
        col2im_add(s, rows, col.data(), p0, p1, x);
      }
    }
  });
}

// dW_g [cout_g, Kc] = Σ_n b[n, group's channels] [cout_g, P] x columns(a[n])^T [P, Kc], summed as
// its transpose (columns [Kc, P] x b[n]^T [P, cout_g]: the transposed operand is then b's small
// slice, not the columns), the batch in chunks (kWeightChunks) whose partial gradients are added
// in chunk order.
template <class T>
void into_w_gemm(const Launch& launch, const Space& s, const Operands<T>& p) {
  const GemmSpace z(s);
  const std::uint64_t per_chunk = std::max<std::uint64_t>(1, (s.batch + kWeightChunks - 1) / kWeightChunks);
  const std::uint64_t chunks = std::max<std::uint64_t>(1, (s.batch + per_chunk - 1) / per_chunk);
  const std::uint64_t g_size = z.cout_g * z.columns;
  const std::vector<ColumnRow> rows = column_rows(s);
  std::vector<T> partial(s.groups * chunks * g_size);  // [group][chunk]: Σ over the chunk, [Kc, cout_g]
  const std::uint64_t pass = std::min(z.weight_chunk(), z.out_size);
  parallel_ranges(launch, s.groups * chunks, 1, [&](std::uint64_t begin, std::uint64_t end) {
    std::vector<T> col(z.columns * pass), bt(z.out_size * z.cout_g);
    for (std::uint64_t i = begin; i < end; ++i) {
      const std::uint64_t g = i / chunks, chunk = i % chunks;
      T* sum = partial.data() + i * g_size;
      for (std::uint64_t n = chunk * per_chunk; n < std::min(s.batch, (chunk + 1) * per_chunk); ++n) {
        const T* x = p.a + (n * s.c_in + g * z.cin_g) * z.in_size;
        transpose_into(p.b + (n * s.c_out + g * z.cout_g) * z.out_size, z.cout_g, z.out_size, bt.data());
        for (std::uint64_t p0 = 0; p0 < z.out_size; p0 += pass) {
          const std::uint64_t p1 = std::min(z.out_size, p0 + pass);
          im2col(s, rows, x, p0, p1, col.data());
          gemm_rows<T>(z.columns, z.cout_g, p1 - p0, col.data(), p1 - p0, bt.data() + p0 * z.cout_g, z.cout_g, sum,
                       z.cout_g, /*add_to_c=*/n != chunk * per_chunk || p0 != 0);
        }
      }
    }
  });
  for (std::uint64_t g = 0; g < s.groups; ++g) {
    T* dw = p.out + g * g_size;
    transpose_into(partial.data() + g * chunks * g_size, z.columns, z.cout_g, dw);
    for (std::uint64_t chunk = 1; chunk < chunks; ++chunk) {
      const T* part = partial.data() + (g * chunks + chunk) * g_size;
      for (std::uint64_t co = 0; co < z.cout_g; ++co)
        for (std::uint64_t kk = 0; kk < z.columns; ++kk) dw[co * z.columns + kk] += part[kk * z.cout_g + co];
    }
  }
}

template <class T>
void run_space_gemm(const Launch& launch, const Space& s, Into into, const Operands<T>& p) {
  switch (into) {
    case Into::Y: return forward_gemm(launch, s, p);
    case Into::X: return into_x_gemm(launch, s, p);
    case Into::W: return into_w_gemm(launch, s, p);
  }
}

// f64: the reference's order per element (bit for bit).
template <class T>
void run_space_exact(const Launch& launch, const Space& s, Into into, const Operands<T>& p) {
  const std::uint64_t slices = into == Into::Y   ? s.batch * s.c_out
                               : into == Into::X ? s.batch * s.c_in
                                                 : s.c_out * s.cin_g();
  const std::uint64_t slice_size = into == Into::Y   ? Space::product(s.out)
                                   : into == Into::X ? Space::product(s.in)
                                                     : Space::product(s.kernel);
  // Work per slice: its taps (all of them, whichever side it sums into).
  const std::uint64_t taps =
      std::max<std::uint64_t>(1, s.batch * s.c_out * Space::product(s.out) * s.cin_g() * Space::product(s.kernel) /
                                     std::max<std::uint64_t>(slices, 1));
  const std::uint64_t grain = std::max<std::uint64_t>(1, kParallelThreshold / taps);
  parallel_ranges(launch, slices, grain, [&](std::uint64_t begin, std::uint64_t end) {
    std::vector<double> acc(slice_size);
    for (std::uint64_t i = begin; i < end; ++i) {
      if (into == Into::Y) into_y(s, p, i, acc);
      if (into == Into::X) into_x(s, p, i, acc);
      if (into == Into::W) into_w(s, p, i, acc);
    }
  });
}

template <class T>
void run_space(const Launch& launch, const Space& s, Into into, const Operands<T>& p) {
  if constexpr (std::is_same_v<T, float>)
    run_space_gemm(launch, s, into, p);
  else
    run_space_exact(launch, s, into, p);
}

// out[ch] = Σ_n Σ_i g[n, ch, i] in index order.
template <class T>
void run_bias_backward(const Launch& launch, const ir::Shape& gs, const T* g, T* out) {
  std::uint64_t inner = 1;
  for (std::size_t i = 2; i < gs.size(); ++i) inner *= gs[i];
  const std::uint64_t batch = gs[0], channels = gs[1];
  parallel_ranges(launch, channels,
                  std::max<std::uint64_t>(1, kParallelThreshold / std::max<std::uint64_t>(1, batch * inner)),
                  [&](std::uint64_t begin, std::uint64_t end) {
                    for (std::uint64_t ch = begin; ch < end; ++ch) {
                      double sum = 0.0;
                      for (std::uint64_t n = 0; n < batch; ++n) {
                        const T* row = g + (n * channels + ch) * inner;
                        for (std::uint64_t i = 0; i < inner; ++i) sum += static_cast<double>(row[i]);
                      }
                      out[ch] = static_cast<T>(sum);
                    }
                  });
}

// ---- The op: which space, which operands, which output shape

struct Plan {
  Into into = Into::Y;
  std::size_t a = 0, b = 1;         // input positions
  std::optional<std::size_t> bias;  // input position of a forward's bias
  ir::Shape out_shape;
  bool bias_backward = false;
};

std::optional<Plan> plan_of(const ir::Operation& op, const ConvKindInfo& k, const Space& s) {
  Plan plan;
  const ir::Shape x_side = with_spatial(s, s.c_in, s.in, k.rank), y_side = with_spatial(s, s.c_out, s.out, k.rank);
  switch (k.role) {
    case ConvRole::Forward:
      if (op.inputs().size() > 2) plan.bias = 2;
      plan.into = k.transposed ? Into::X : Into::Y;
      plan.out_shape = k.transposed ? x_side : y_side;
      if (plan.bias && op.inputs()[2].shape != ir::Shape{plan.out_shape[1]}) return std::nullopt;
      return plan;
    case ConvRole::XBackward:
      if (k.transposed || op.inputs().size() != 3 || op.inputs()[2].shape != y_side) return std::nullopt;
      plan = Plan{Into::X, 2, 1, std::nullopt, op.inputs()[0].shape, false};
      return plan;
    case ConvRole::WeightBackward:
      if (op.inputs().size() != 3 || op.inputs()[2].shape != (k.transposed ? x_side : y_side)) return std::nullopt;
      plan = k.transposed ? Plan{Into::W, 2, 0, std::nullopt, op.inputs()[1].shape, false}
                          : Plan{Into::W, 0, 2, std::nullopt, op.inputs()[1].shape, false};
      return plan;
    case ConvRole::BiasBackward: break;
  }
  return std::nullopt;
}

}  // namespace

bool run_conv(const ir::Operation& op, CpuDevice& device, CpuDevice::Handles& handles) {
  const std::optional<ConvKindInfo> k = ir::build::conv_kind_info(op.kind);
  if (!k || op.outputs().size() != 1) return false;
  const ir::TensorIr& out_ir = op.outputs()[0];
  if (!(out_ir.dtype == ir::dtypes::f32) && !(out_ir.dtype == ir::dtypes::f64)) return false;
  // Every input is held, of the output's dtype, with the shape the IR says.
  const std::optional<std::vector<const HostTensor*>> held = held_inputs(op, handles);
  if (!held) return false;
  const std::vector<const HostTensor*>& in = *held;
  for (const ir::TensorIr& t : op.inputs())
    if (!(t.dtype == out_ir.dtype)) return false;
  Plan plan;
  Space space;
  if (k->role == ConvRole::BiasBackward) {
    if (in.size() != 3) return false;
    const ir::Shape& gs = in[2]->shape();
    if (gs.size() != k->rank + 2 || in[0]->shape().size() != k->rank + 2 || gs[0] != in[0]->shape()[0] ||
        in[1]->shape() != ir::Shape{gs[1]})
      return false;
    plan.bias_backward = true;
    plan.out_shape = in[1]->shape();
  } else {
    std::optional<Space> s = read_space(op, *k);
    if (!s) return false;
    std::optional<Plan> p = plan_of(op, *k, *s);
    if (!p) return false;
    space = *s;
    plan = *p;
  }
  if (out_ir.shape != plan.out_shape) return false;
  Result<HostTensor> out = HostTensor::allocate(device.allocator(), out_ir.shape, out_ir.dtype);
  if (!out.ok()) return false;

  const Launch launch = launch_on(device);
  auto run = [&]<class T>(T*) {
    T* dst = reinterpret_cast<T*>(out->mutable_data());
    auto data = [&](std::size_t i) { return reinterpret_cast<const T*>(in[i]->data()); };
    if (plan.bias_backward) return run_bias_backward<T>(launch, in[2]->shape(), data(2), dst);
    const Operands<T> operands{data(plan.a), data(plan.b), plan.bias ? data(*plan.bias) : nullptr, dst};
    run_space<T>(launch, space, plan.into, operands);
  };
  if (out_ir.dtype == ir::dtypes::f32)
    run(static_cast<float*>(nullptr));
  else
    run(static_cast<double*>(nullptr));

  commit(op, handles, std::span<HostTensor>(&*out, 1));
  return true;
}

}  // namespace kiln::cpu::fast
