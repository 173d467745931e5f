// Reference kernels of the resampling ops (docs/spec/ir.md §5.6, §5.8): Interpolate and its
// gradient, GridSample2d and Unfold4d. Every output element is a weighted sum of input elements
// (its "taps", separable into one list per axis), accumulated in f64 in tap order and rounded
// once. InterpolateBackward scatters the same taps, so it is Interpolate's exact adjoint in every
// mode. Semantics are Burn's, PyTorch's where Burn leaves them open (docs/decisions.md).
#include <algorithm>
#include <array>
#include <cmath>
#include <numbers>
#include <utility>
#include <vector>

#include "reference_internal.h"

namespace kiln::reference::kernels {
namespace {

using ir::GridSamplePaddingMode;
using ir::InterpolateMode;

// The input positions one output position reads along one axis, with their weights (at most
// Lanczos3's six).
struct Taps {
  std::array<std::uint64_t, 6> index{};
  std::array<double, 6> weight{};
  std::size_t n = 0;

  void add(std::uint64_t i, double w) {
    index[n] = i;
    weight[n] = w;
    ++n;
  }
};

// Σ_i Σ_j rows.weight[i] · cols.weight[j] · x[base + rows.index[i] · width + cols.index[j]].
double gather_taps(const HostTensor& x, std::uint64_t base, std::uint64_t width, const Taps& rows, const Taps& cols) {
  double acc = 0.0;
  for (std::size_t i = 0; i < rows.n; ++i)
    for (std::size_t j = 0; j < cols.n; ++j)
      acc += rows.weight[i] * cols.weight[j] * x.get_f64(base + rows.index[i] * width + cols.index[j]);
  return acc;
}

// ---- Checks of the operands and attributes the builders made (hand-made ops are checked here)

Status expect_float_operand(const Ctx& c, const HostTensor& t, const char* what) {
  if (!t.dtype().is_float())
    return c.error(ErrorCode::DTypeMismatch, fmt::format("{} {} must have a float dtype", what, t.to_string()));
  return Status::Ok();
}

Status expect_rank4(const Ctx& c, const HostTensor& t, const char* what) {
  if (t.shape().size() != 4)
    return c.error(ErrorCode::RankMismatch, fmt::format("{} {} must have rank 4", what, t.to_string()));
  return Status::Ok();
}

// A float [N, C, H, W] image with H, W >= 1: every mode maps into [0, H) x [0, W).
Status expect_image(const Ctx& c, const HostTensor& t, const char* what) {
  KILN_RETURN_IF_ERROR(expect_float_operand(c, t, what));
  KILN_RETURN_IF_ERROR(expect_rank4(c, t, what));
  if (t.shape()[2] == 0 || t.shape()[3] == 0)
    return c.error(ErrorCode::Invalid, fmt::format("{} {} has an empty image", what, t.to_string()));
  return Status::Ok();
}

Result<std::uint64_t> positive_attr(const Ctx& c, std::size_t i, const char* what) {
  const std::int64_t a = c.op.attrs[i];
  if (a < 1) return c.error(ErrorCode::Invalid, fmt::format("{} must be at least 1, got {}", what, a));
  return static_cast<std::uint64_t>(a);
}

Result<InterpolateMode> mode_attr(const Ctx& c, std::size_t i) {
  const std::int64_t a = c.op.attrs[i];
  if (a < 0 || a > static_cast<std::int64_t>(InterpolateMode::Lanczos3))
    return c.error(ErrorCode::Invalid, fmt::format("unknown interpolate mode {}", a));
  return static_cast<InterpolateMode>(a);
}

Result<GridSamplePaddingMode> padding_attr(const Ctx& c, std::size_t i) {
  const std::int64_t a = c.op.attrs[i];
  if (a < 0 || a > static_cast<std::int64_t>(GridSamplePaddingMode::Reflection))
    return c.error(ErrorCode::Invalid, fmt::format("unknown padding mode {}", a));
  return static_cast<GridSamplePaddingMode>(a);
}

// ---- The 1-D weights of each mode

// Keys' cubic convolution kernel with A = −0.75 (PyTorch's and Burn's bicubic), at distance t.
double cubic_weight(double t) {
  constexpr double A = -0.75;
  t = std::fabs(t);
  if (t <= 1) return ((A + 2) * t - (A + 3)) * t * t + 1;
  if (t < 2) return ((A * t - 5 * A) * t + 8 * A) * t - 4 * A;
  return 0.0;
}

// The Lanczos kernel with a = 3: sinc(x) · sinc(x / 3) for |x| < 3.
double lanczos3(double x) {
  if (x == 0) return 1.0;
  if (std::fabs(x) >= 3) return 0.0;
  const double px = std::numbers::pi * x;
  return 3 * std::sin(px) * std::sin(px / 3) / (px * px);
}

// An integral position held inside [0, size).
std::uint64_t clamp_index(double p, std::uint64_t size) {
  if (p <= 0) return 0;
  const auto last = static_cast<double>(size - 1);
  return p >= last ? size - 1 : static_cast<std::uint64_t>(p);
}

// ---- Interpolate's positions: output position o of `out` reads the input axis of `in`

// Burn's source coordinate: o · (in − 1) / (out − 1) with align_corners (0 for one output), else
// the half-pixel centre (o + ½) · in / out − ½. The numerators are exact integers in f64.
double source_coordinate(std::uint64_t o, std::uint64_t in, std::uint64_t out, bool align) {
  const auto od = static_cast<double>(o), id = static_cast<double>(in), nd = static_cast<double>(out);
  if (align) return out > 1 ? od * (id - 1) / (nd - 1) : 0.0;
  return (2 * od + 1) * id / (2 * nd) - 0.5;
}

// Nearest: floor(o · in / out) (Burn); NearestExact: floor((o + ½) · in / out) (PyTorch's
// nearest-exact); both in integers, so exact, and ignoring align_corners as Burn does.
std::uint64_t nearest_index(std::uint64_t o, std::uint64_t in, std::uint64_t out, bool exact) {
  const std::uint64_t num = exact ? 2 * o + 1 : o;  // out <= i64 max: 2 · out fits
  const std::uint64_t den = exact ? 2 * out : out;
  std::uint64_t product = 0;
  if (!__builtin_mul_overflow(num, in, &product)) return std::min(product / den, in - 1);
  // Sizes this large hold no data (the caller has no element to read); stay in range anyway.
  return clamp_index(std::floor(static_cast<double>(num) * static_cast<double>(in) / static_cast<double>(den)), in);
}

// Bilinear (PyTorch, Burn): the coordinate clamped at 0, its two neighbours, the upper one held
// at the last position.
Taps linear_taps(double src, std::uint64_t in) {
  src = std::max(src, 0.0);
  const double f = std::floor(src);
  const std::uint64_t lo = clamp_index(f, in);
  Taps t;
  t.add(lo, 1 - (src - f));
  t.add(std::min(lo + 1, in - 1), src - f);
  return t;
}

// Bicubic (PyTorch, Burn): floor − 1 … floor + 2, positions held inside the input (the
// coordinate itself is not clamped).
Taps cubic_taps(double src, std::uint64_t in) {
  const double f = std::floor(src);
  Taps t;
  for (int k = -1; k <= 2; ++k) t.add(clamp_index(f + k, in), cubic_weight(src - f - k));
  return t;
}

// Lanczos3 (Burn): floor − 2 … floor + 3; positions outside the input are skipped and the
// remaining weights renormalised to sum 1.
Taps lanczos_taps(double src, std::uint64_t in) {
  const double f = std::floor(src);
  Taps t;
  double sum = 0.0;
  for (int k = -2; k <= 3; ++k) {
    const double p = f + k;
    if (p < 0 || p >= static_cast<double>(in)) continue;
    const double w = lanczos3(src - p);
    t.add(static_cast<std::uint64_t>(p), w);
    sum += w;
  }
  if (sum != 0)
    for (std::size_t i = 0; i < t.n; ++i) t.weight[i] /= sum;
  return t;
}

// Interpolate's and InterpolateBackward's attributes [out_h, out_w, mode, align_corners] with x.
struct Resize {
  std::uint64_t planes, in_h, in_w, out_h, out_w;
  InterpolateMode mode;
  bool align;
};

Result<Resize> resize_of(const Ctx& c, const HostTensor& x) {
  KILN_RETURN_IF_ERROR(expect_image(c, x, "x"));
  KILN_ASSIGN_OR_RETURN(std::uint64_t out_h, positive_attr(c, 0, "output height"));
  KILN_ASSIGN_OR_RETURN(std::uint64_t out_w, positive_attr(c, 1, "output width"));
  KILN_ASSIGN_OR_RETURN(InterpolateMode mode, mode_attr(c, 2));
  KILN_ASSIGN_OR_RETURN(bool align, flag_attr(c, 3, "align_corners"));
  const ir::Shape& s = x.shape();
  return Resize{s[0] * s[1], s[2], s[3], out_h, out_w, mode, align};
}

Taps axis_taps(const Resize& r, std::uint64_t o, std::uint64_t in, std::uint64_t out) {
  switch (r.mode) {
    case InterpolateMode::Nearest:
    case InterpolateMode::NearestExact: {
      Taps t;
      t.add(nearest_index(o, in, out, r.mode == InterpolateMode::NearestExact), 1.0);
      return t;
    }
    case InterpolateMode::Bilinear: return linear_taps(source_coordinate(o, in, out, r.align), in);
    case InterpolateMode::Bicubic: return cubic_taps(source_coordinate(o, in, out, r.align), in);
    case InterpolateMode::Lanczos3: return lanczos_taps(source_coordinate(o, in, out, r.align), in);
  }
  return {};
}

// The taps of every output position along one axis (its size bounded by an allocated output).
std::vector<Taps> axis_table(const Resize& r, std::uint64_t in, std::uint64_t out) {
  std::vector<Taps> table;
  table.reserve(static_cast<std::size_t>(out));
  for (std::uint64_t o = 0; o < out; ++o) table.push_back(axis_taps(r, o, in, out));
  return table;
}

// ---- GridSample2d: PyTorch's grid_sampler_2d with Burn's rule for non-finite coordinates

struct Sampler {
  std::uint64_t height, width;
  InterpolateMode mode;
  GridSamplePaddingMode padding;
  bool align;
};

// grid [N, Ho, Wo, 2] of tensor [N, C, H, W]; the output [N, C, Ho, Wo] of tensor's dtype.
Status expect_grid_shapes(const Ctx& c, const HostTensor& tensor, const HostTensor& grid) {
  KILN_RETURN_IF_ERROR(expect_image(c, tensor, "tensor"));
  KILN_RETURN_IF_ERROR(expect_float_operand(c, grid, "grid"));
  KILN_RETURN_IF_ERROR(expect_rank4(c, grid, "grid"));
  const ir::Shape& ts = tensor.shape();
  const ir::Shape& gs = grid.shape();
  if (gs[0] != ts[0] || gs[3] != 2)
    return c.error(ErrorCode::IncompatibleShapes,
                   fmt::format("grid {} must be [N, Ho, Wo, 2] for tensor {}", grid.to_string(), tensor.to_string()));
  KILN_RETURN_IF_ERROR(expect_out_dtype(c, 0, tensor.dtype()));
  return expect_out_shape(c, 0, ir::Shape{ts[0], ts[1], gs[1], gs[2]});
}

Result<Sampler> sampler_of(const Ctx& c) {
  KILN_RETURN_IF_ERROR(expect_grid_shapes(c, c.in[0], c.in[1]));
  KILN_ASSIGN_OR_RETURN(InterpolateMode mode, mode_attr(c, 0));
  if (mode == InterpolateMode::NearestExact || mode == InterpolateMode::Lanczos3)
    return c.error(ErrorCode::Invalid,
                   fmt::format("interpolate mode {} does not apply to grid sampling", static_cast<std::int64_t>(mode)));
  KILN_ASSIGN_OR_RETURN(GridSamplePaddingMode padding, padding_attr(c, 1));
  KILN_ASSIGN_OR_RETURN(bool align, flag_attr(c, 2, "align_corners"));
  const ir::Shape& ts = c.in[0].shape();
  return Sampler{ts[2], ts[3], mode, padding, align};
}

// [−1, 1] to pixel coordinates: −1 and 1 are the corner pixels' centres with align_corners, else
// their outer edges.
double unnormalize(double g, std::uint64_t size, bool align) {
  const auto s = static_cast<double>(size);
  return align ? (g + 1) / 2 * (s - 1) : ((g + 1) * s - 1) / 2;
}

// PyTorch's reflect_coordinates: x reflected into [low, high], given doubled so that the
// half-pixel bounds stay integral.
double reflect(double x, double twice_low, double twice_high) {
  if (twice_low == twice_high) return 0.0;
  const double low = twice_low / 2, span = (twice_high - twice_low) / 2;
  x = std::fabs(x - low);
  const double extra = std::fmod(x, span);
  const double flips = std::floor(x / span);
  return std::fmod(flips, 2.0) == 0 ? extra + low : span - extra + low;
}

// PyTorch's compute_coordinates: border clips to [0, size − 1]; reflection reflects about the
// edge pixels' centres (align_corners) or outer edges, then clips; zeros keeps x (reads outside
// the input are zeros).
double pad_coordinate(double x, std::uint64_t size, const Sampler& s) {
  const auto last = static_cast<double>(size - 1);
  switch (s.padding) {
    case GridSamplePaddingMode::Zeros: return x;
    case GridSamplePaddingMode::Border: return std::clamp(x, 0.0, last);
    case GridSamplePaddingMode::Reflection:
      return std::clamp(s.align ? reflect(x, 0, 2 * last) : reflect(x, -1, 2 * last + 1), 0.0, last);
  }
  return x;
}

// Tap p (an integral position) when it lies inside [0, size): reads outside are zeros.
void add_inside(Taps& t, double p, std::uint64_t size, double w) {
  if (p >= 0 && p < static_cast<double>(size)) t.add(static_cast<std::uint64_t>(p), w);
}

// One axis of a sample at pixel coordinate x: nearest rounds half to even after padding;
// bilinear reads the padded coordinate's two neighbours; bicubic pads each of its four positions.
Taps grid_taps(double x, std::uint64_t size, const Sampler& s) {
  Taps t;
  if (s.mode == InterpolateMode::Nearest) {
    add_inside(t, std::nearbyint(pad_coordinate(x, size, s)), size, 1.0);
  } else if (s.mode == InterpolateMode::Bilinear) {
    const double p = pad_coordinate(x, size, s), f = std::floor(p);
    add_inside(t, f, size, 1 - (p - f));
    add_inside(t, f + 1, size, p - f);
  } else {
    const double f = std::floor(x);
    for (int k = -1; k <= 2; ++k) add_inside(t, pad_coordinate(f + k, size, s), size, cubic_weight(x - f - k));
  }
  return t;
}

// The (row, column) taps of the sample at grid point (gx, gy). A coordinate that is not finite
// reads nothing (zeros) except with border padding, which reads the centre pixel (Burn's rule).
std::pair<Taps, Taps> point_taps(double gx, double gy, const Sampler& s) {
  double px = unnormalize(gx, s.width, s.align), py = unnormalize(gy, s.height, s.align);
  if (!std::isfinite(px) || !std::isfinite(py)) {
    if (s.padding != GridSamplePaddingMode::Border) return {};
    const std::uint64_t centre_x = (s.width - 1) / 2, centre_y = (s.height - 1) / 2;  // whole pixels
    px = static_cast<double>(centre_x);
    py = static_cast<double>(centre_y);
  }
  return {grid_taps(py, s.height, s), grid_taps(px, s.width, s)};
}

// ---- Unfold4d: attrs [k0, k1, stride0, stride1, pad0, pad1, dilation0, dilation1]

struct Im2col {
  std::array<std::uint64_t, 2> kernel, stride, padding, dilation, blocks;
};

Result<Im2col> im2col_of(const Ctx& c, const HostTensor& x) {
  KILN_RETURN_IF_ERROR(expect_float_operand(c, x, "x"));
  KILN_RETURN_IF_ERROR(expect_rank4(c, x, "x"));
  Im2col u{};
  for (std::size_t i = 0; i < 2; ++i) {
    KILN_ASSIGN_OR_RETURN(u.kernel[i], positive_attr(c, i, "kernel size"));
    KILN_ASSIGN_OR_RETURN(u.stride[i], positive_attr(c, 2 + i, "stride"));
    KILN_ASSIGN_OR_RETURN(u.padding[i], count_attr(c, 4 + i, "padding"));
    KILN_ASSIGN_OR_RETURN(u.dilation[i], positive_attr(c, 6 + i, "dilation"));
    KILN_ASSIGN_OR_RETURN(
        u.blocks[i], ir::shape::conv_output(x.shape()[2 + i], u.kernel[i], u.stride[i], u.padding[i], u.dilation[i]));
  }
  std::uint64_t rows = 0, columns = 0;
  if (__builtin_mul_overflow(x.shape()[1], u.kernel[0], &rows) || __builtin_mul_overflow(rows, u.kernel[1], &rows) ||
      __builtin_mul_overflow(u.blocks[0], u.blocks[1], &columns))
    return c.error(ErrorCode::Invalid, fmt::format("the unfolded shape of x {} overflows", x.to_string()));
  KILN_RETURN_IF_ERROR(expect_out_dtype(c, 0, x.dtype()));
  KILN_RETURN_IF_ERROR(expect_out_shape(c, 0, ir::Shape{x.shape()[0], rows, columns}));
  return u;
}

// Position start + k · step − pad of an axis of size n, when inside [0, n).
bool window_position(std::uint64_t start, std::uint64_t k, std::uint64_t step, std::uint64_t pad, std::uint64_t n,
                     std::uint64_t& pos) {
  const std::uint64_t p = start + k * step;
  if (p < pad || p - pad >= n) return false;
  pos = p - pad;
  return true;
}

// Row (c, i, j) of one image's columns: x[c, oh·s0 + i·d0 − p0, ow·s1 + j·d1 − p1], 0 in the padding.
void unfold_row(const HostTensor& x, const HostTensor& out, const Im2col& u, std::uint64_t plane, std::uint64_t i,
                std::uint64_t j, std::uint64_t out_base) {
  const std::uint64_t H = x.shape()[2], W = x.shape()[3];
  for (std::uint64_t oh = 0; oh < u.blocks[0]; ++oh)
    for (std::uint64_t ow = 0; ow < u.blocks[1]; ++ow) {
      std::uint64_t h = 0, w = 0;
      const bool inside = window_position(oh * u.stride[0], i, u.dilation[0], u.padding[0], H, h) &&
                          window_position(ow * u.stride[1], j, u.dilation[1], u.padding[1], W, w);
      element::store_f64(out.mutable_data(), out.dtype(), out_base + oh * u.blocks[1] + ow,
                         inside ? x.get_f64((plane * H + h) * W + w) : 0.0);
    }
}

}  // namespace

// Interpolate{x [N, C, H, W]} → [N, C, out_h, out_w]: each output the separable taps' sum.
Result<Outputs> run_interpolate(const Ctx& c) {
  const HostTensor& x = c.in[0];
  KILN_ASSIGN_OR_RETURN(Resize r, resize_of(c, x));
  KILN_RETURN_IF_ERROR(expect_out_dtype(c, 0, x.dtype()));
  KILN_RETURN_IF_ERROR(expect_out_shape(c, 0, ir::Shape{x.shape()[0], x.shape()[1], r.out_h, r.out_w}));
  KILN_ASSIGN_OR_RETURN(HostTensor out, c.new_output());
  if (r.planes == 0) return single(std::move(out));  // no element: the position tables are not needed
  const std::vector<Taps> rows = axis_table(r, r.in_h, r.out_h), cols = axis_table(r, r.in_w, r.out_w);
  for (std::uint64_t p = 0; p < r.planes; ++p)
    for (std::uint64_t oh = 0; oh < r.out_h; ++oh)
      for (std::uint64_t ow = 0; ow < r.out_w; ++ow)
        element::store_f64(out.mutable_data(), out.dtype(), (p * r.out_h + oh) * r.out_w + ow,
                           gather_taps(x, p * r.in_h * r.in_w, r.in_w, rows[oh], cols[ow]));
  return single(std::move(out));
}

// InterpolateBackward{x, grad [N, C, out_h, out_w]} → x's shape: each grad element added into the
// positions its output read, with the same weights (zeros where nothing was read).
Result<Outputs> run_interpolate_backward(const Ctx& c) {
  const HostTensor& x = c.in[0];
  const HostTensor& g = c.in[1];
  KILN_ASSIGN_OR_RETURN(Resize r, resize_of(c, x));
  KILN_RETURN_IF_ERROR(expect_float_operand(c, g, "grad"));
  if (g.shape() != ir::Shape{x.shape()[0], x.shape()[1], r.out_h, r.out_w})
    return c.error(ErrorCode::IncompatibleShapes, fmt::format("grad {} does not match x {} and the output size [{},{}]",
                                                              g.to_string(), x.to_string(), r.out_h, r.out_w));
  KILN_RETURN_IF_ERROR(expect_out_dtype(c, 0, x.dtype()));
  KILN_RETURN_IF_ERROR(expect_out_shape(c, 0, x.shape()));
  KILN_ASSIGN_OR_RETURN(HostTensor out, c.new_output());
  std::vector<double> acc(static_cast<std::size_t>(x.num_elements()), 0.0);
  const std::vector<Taps> rows = r.planes ? axis_table(r, r.in_h, r.out_h) : std::vector<Taps>{};
  const std::vector<Taps> cols = r.planes ? axis_table(r, r.in_w, r.out_w) : std::vector<Taps>{};
  for (std::uint64_t p = 0; p < r.planes; ++p)
    for (std::uint64_t oh = 0; oh < r.out_h; ++oh)
      for (std::uint64_t ow = 0; ow < r.out_w; ++ow) {
        const double gv = g.get_f64((p * r.out_h + oh) * r.out_w + ow);
        const Taps& ry = rows[oh];
        const Taps& rx = cols[ow];
        for (std::size_t i = 0; i < ry.n; ++i)
          for (std::size_t j = 0; j < rx.n; ++j)
            acc[(p * r.in_h + ry.index[i]) * r.in_w + rx.index[j]] += ry.weight[i] * rx.weight[j] * gv;
      }
  for (std::size_t k = 0; k < acc.size(); ++k) element::store_f64(out.mutable_data(), out.dtype(), k, acc[k]);
  return single(std::move(out));
}

// GridSample2d{tensor [N, C, H, W], grid [N, Ho, Wo, 2]} → [N, C, Ho, Wo]: grid point (x, y)
// samples column x and row y of every channel of its batch's image.
Result<Outputs> run_grid_sample_2d(const Ctx& c) {
  KILN_ASSIGN_OR_RETURN(Sampler s, sampler_of(c));
  const HostTensor& t = c.in[0];
  const HostTensor& grid = c.in[1];
  KILN_ASSIGN_OR_RETURN(HostTensor out, c.new_output());
  const std::uint64_t batch = t.shape()[0], channels = t.shape()[1];
  const std::uint64_t points = grid.shape()[1] * grid.shape()[2], image = s.height * s.width;
  for (std::uint64_t n = 0; n < batch; ++n)
    for (std::uint64_t q = 0; q < points; ++q) {
      const std::uint64_t g = (n * points + q) * 2;
      const auto [rows, cols] = point_taps(grid.get_f64(g), grid.get_f64(g + 1), s);
      for (std::uint64_t ch = 0; ch < channels; ++ch)
        element::store_f64(out.mutable_data(), out.dtype(), (n * channels + ch) * points + q,
                           gather_taps(t, (n * channels + ch) * image, s.width, rows, cols));
    }
  return single(std::move(out));
}

// Unfold4d{x [N, C, H, W]} → [N, C·kh·kw, L] (im2col): row (c·kh + i)·kw + j holds kernel tap
// (i, j) of channel c over the L = blocks_h · blocks_w windows, in row-major window order.
Result<Outputs> run_unfold4d(const Ctx& c) {
  const HostTensor& x = c.in[0];
  KILN_ASSIGN_OR_RETURN(Im2col u, im2col_of(c, x));
  KILN_ASSIGN_OR_RETURN(HostTensor out, c.new_output());
  const std::uint64_t planes = x.shape()[0] * x.shape()[1], taps = u.kernel[0] * u.kernel[1];
  const std::uint64_t columns = u.blocks[0] * u.blocks[1];
  for (std::uint64_t p = 0; p < planes; ++p)
    for (std::uint64_t i = 0; i < u.kernel[0]; ++i)
      for (std::uint64_t j = 0; j < u.kernel[1]; ++j)
        unfold_row(x, out, u, p, i, j, (p * taps + i * u.kernel[1] + j) * columns);
  return single(std::move(out));
}

}  // namespace kiln::reference::kernels
