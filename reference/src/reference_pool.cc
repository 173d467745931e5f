// Reference kernels of the pools (docs/spec/ir.md §5.8, shapes §6.3): max pools with and without
// indices, average and adaptive average pools over 1, 2 or 3 spatial dims, and their backwards.
// Every pool runs as a 3-d one whose missing leading spatial dims have size 1 (kernel 1, stride 1,
// no padding), so one loop nest serves every rank and an output's flat index within its plane is
// PyTorch's. Floats accumulate in f64 in index order; each output is rounded once.
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "kiln/ir/builders.h"
#include "kiln/ir/shape.h"
#include "kiln/reference/pool_geometry.h"
#include "reference_internal.h"

namespace kiln::reference::kernels {
namespace {

using pool::Box;
using pool::Dims;
using Pool = pool::Geometry;
using pool::box_size;
using pool::divisor;
using pool::for_each_position;
using pool::window_box;

// Attribute i as a window value of at least `min`.
Result<std::uint64_t> window_attr(const Ctx& c, std::size_t i, const char* what, std::uint64_t min) {
  KILN_ASSIGN_OR_RETURN(std::uint64_t v, count_attr(c, i, what));
  if (v < min) return c.error(ErrorCode::Invalid, fmt::format("{} must be at least {}, got {}", what, min, v));
  return v;
}

// x [N, C, spatial...] of rank n + 2: the batch, channels and spatial sizes.
Status read_x(const Ctx& c, const HostTensor& x, Pool& g) {
  if (!pool::read_x(g, x.shape()))
    return c.error(ErrorCode::RankMismatch, fmt::format("x {} must have rank {}", x.to_string(), g.n + 2));
  return Status::Ok();
}

// Attributes (ir::build::pool_attrs_of, which checks them as the builders do), x and the pooled
// sizes of a windowed pool or of its backward.
Result<Pool> pool_geometry(const Ctx& c) {
  Result<ir::build::PoolAttrs> attrs = ir::build::pool_attrs_of(c.op);
  if (!attrs.ok()) return c.error(attrs.error().code, attrs.error().message);
  Pool g = pool::from_attrs(*attrs);
  KILN_RETURN_IF_ERROR(read_x(c, c.in[0], g));
  Status sizes = pool::pool_sizes(g);
  if (!sizes.ok()) return c.error(sizes.error().code, sizes.error().message);
  return g;
}

// PyTorch's max and its index: the first tap is the candidate and a strictly larger value or a
// NaN replaces it (ties keep the first tap, the last NaN wins); no tap inside x: −inf and −1.
std::pair<double, std::int64_t> window_max(const HostTensor& x, std::uint64_t base, const Box& b, const Dims& in) {
  double best = -std::numeric_limits<double>::infinity();
  std::int64_t index = -1;
  for_each_position(b, in, [&](std::uint64_t pos) {
    const double v = x.get_f64(base + pos);
    if (index < 0 || v > best || std::isnan(v)) {
      best = v;
      index = static_cast<std::int64_t>(pos);
    }
  });
  return {best, index};
}

// A with-indices pool's second output: the pooled shape, a signed integer dtype (−1 marks an empty
// window) that holds the plane's last index.
Status expect_index_output(const Ctx& c, const Pool& g) {
  KILN_RETURN_IF_ERROR(expect_out_shape(c, 1, g.out_shape()));
  if (!c.out_ir(1).dtype.is_int())
    return c.error(ErrorCode::DTypeMismatch,
                   fmt::format("output {} must have a signed integer dtype", c.out_ir(1).to_string()));
  return g.in_plane() == 0 ? Status::Ok() : expect_index_fits(c, 1, g.in_plane() - 1);
}

// Input i of a backward: the forward's output shape (and a float dtype for grad).
Status expect_pooled_input(const Ctx& c, std::size_t i, const Pool& g, const char* what) {
  const HostTensor& t = c.in[i];
  if (t.shape() != g.out_shape())
    return c.error(ErrorCode::IncompatibleShapes, fmt::format("{} {} must have the pool's output shape {}", what,
                                                              t.to_string(), ir::shape_to_string(g.out_shape())));
  return Status::Ok();
}

Status expect_float_input(const Ctx& c, std::size_t i, const char* what) {
  if (!c.in[i].dtype().is_float())
    return c.error(ErrorCode::DTypeMismatch, fmt::format("{} {} must have a float dtype", what, c.in[i].to_string()));
  return Status::Ok();
}

// The sums of the backwards, one per element of x, stored as the output (rounded once).
Result<Outputs> store_gradient(const Ctx& c, const std::vector<double>& acc) {
  KILN_ASSIGN_OR_RETURN(HostTensor out, c.new_output());
  for (std::uint64_t k = 0; k < acc.size(); ++k) element::store_f64(out.mutable_data(), out.dtype(), k, acc[k]);
  return single(std::move(out));
}

// A backward's output: x's shape and dtype.
Status expect_gradient_output(const Ctx& c) {
  KILN_RETURN_IF_ERROR(expect_out_dtype(c, 0, c.in[0].dtype()));
  return expect_out_shape(c, 0, c.in[0].shape());
}

}  // namespace

// ---- MaxPool{1,2}d and MaxPool{1,2}dWithIndices: attrs [k.., stride.., pad.., dilation..,
// ceil_mode]; a window lying entirely in the padding (the spec's ceil mode) gives −inf (index −1).

Result<Outputs> run_max_pool(const Ctx& c) {
  const HostTensor& x = c.in[0];
  KILN_ASSIGN_OR_RETURN(Pool g, pool_geometry(c));
  KILN_RETURN_IF_ERROR(expect_out_dtype(c, 0, x.dtype()));
  KILN_RETURN_IF_ERROR(expect_out_shape(c, 0, g.out_shape()));
  const bool with_indices = c.op.outputs().size() == 2;
  if (with_indices) KILN_RETURN_IF_ERROR(expect_index_output(c, g));
  Outputs outs;
  KILN_ASSIGN_OR_RETURN(HostTensor values, c.new_output(0));
  outs.push_back(std::move(values));
  if (with_indices) {
    KILN_ASSIGN_OR_RETURN(HostTensor indices, c.new_output(1));
    outs.push_back(std::move(indices));
  }
  const std::uint64_t in_plane = g.in_plane(), out_plane = g.out_plane();
  for (std::uint64_t pl = 0; pl < g.planes; ++pl)
    for (std::uint64_t k = 0; k < out_plane; ++k) {
      const auto [value, index] = window_max(x, pl * in_plane, window_box(g, g.unravel(k)), g.in);
      const std::uint64_t at = pl * out_plane + k;
      element::store_f64(outs[0].mutable_data(), outs[0].dtype(), at, value);
      if (with_indices) element::store_i64(outs[1].mutable_data(), outs[1].dtype(), at, index);
    }
  return outs;
}

// ---- MaxPool{1,2}dWithIndicesBackward{x, grad, indices}: zeros of x's shape, each grad element
// added at its index within its plane (duplicates accumulate; −1, an empty window, adds nowhere).

Result<Outputs> run_max_pool_backward(const Ctx& c) {
  KILN_ASSIGN_OR_RETURN(Pool g, pool_geometry(c));
  KILN_RETURN_IF_ERROR(expect_float_input(c, 1, "grad"));
  KILN_RETURN_IF_ERROR(expect_pooled_input(c, 1, g, "grad"));
  KILN_RETURN_IF_ERROR(expect_pooled_input(c, 2, g, "indices"));
  const HostTensor& grad = c.in[1];
  const HostTensor& indices = c.in[2];
  if (!indices.dtype().is_integral())
    return c.error(ErrorCode::DTypeMismatch, fmt::format("indices {} must have an integer dtype", indices.to_string()));
  KILN_RETURN_IF_ERROR(expect_gradient_output(c));
  const std::uint64_t in_plane = g.in_plane(), out_plane = g.out_plane();
  std::vector<double> acc(static_cast<std::size_t>(g.planes * in_plane), 0.0);
  for (std::uint64_t pl = 0; pl < g.planes; ++pl)
    for (std::uint64_t k = 0; k < out_plane; ++k) {
      const std::uint64_t e = pl * out_plane + k;
      if (indices.dtype().is_int() && indices.get_i64(e) == -1) continue;
      KILN_ASSIGN_OR_RETURN(std::uint64_t at, checked_index(c, indices, e, in_plane, "max pool"));
      acc[pl * in_plane + at] += grad.get_f64(e);
    }
  return store_gradient(c, acc);
}

// ---- AvgPool{1,2}d: attrs [k.., stride.., pad.., count_include_pad, ceil_mode], PyTorch's divisor
// (the window clipped to the padded input when count_include_pad, else to x). A window with no
// element of x (the spec's ceil mode) gives 0, as PyTorch's kernel does.

Result<Outputs> run_avg_pool(const Ctx& c) {
  const HostTensor& x = c.in[0];
  KILN_ASSIGN_OR_RETURN(Pool g, pool_geometry(c));
  KILN_RETURN_IF_ERROR(expect_out_dtype(c, 0, x.dtype()));
  KILN_RETURN_IF_ERROR(expect_out_shape(c, 0, g.out_shape()));
  KILN_ASSIGN_OR_RETURN(HostTensor out, c.new_output());
  const std::uint64_t in_plane = g.in_plane(), out_plane = g.out_plane();
  for (std::uint64_t pl = 0; pl < g.planes; ++pl)
    for (std::uint64_t k = 0; k < out_plane; ++k) {
      const Dims o = g.unravel(k);
      const Box b = window_box(g, o);
      double value = 0.0;
      if (box_size(b) != 0) {
        double sum = 0.0;
        for_each_position(b, g.in, [&](std::uint64_t pos) { sum += x.get_f64(pl * in_plane + pos); });
        value = sum / divisor(g, o, b);
      }
      element::store_f64(out.mutable_data(), out.dtype(), pl * out_plane + k, value);
    }
  return single(std::move(out));
}

// ---- AvgPool{1,2}dBackward{x, grad}: the adjoint of the average: each grad element divided by its
// window's divisor and added to the window's taps inside x.

Result<Outputs> run_avg_pool_backward(const Ctx& c) {
  KILN_ASSIGN_OR_RETURN(Pool g, pool_geometry(c));
  KILN_RETURN_IF_ERROR(expect_float_input(c, 1, "grad"));
  KILN_RETURN_IF_ERROR(expect_pooled_input(c, 1, g, "grad"));
  KILN_RETURN_IF_ERROR(expect_gradient_output(c));
  const HostTensor& grad = c.in[1];
  const std::uint64_t in_plane = g.in_plane(), out_plane = g.out_plane();
  std::vector<double> acc(static_cast<std::size_t>(g.planes * in_plane), 0.0);
  for (std::uint64_t pl = 0; pl < g.planes; ++pl)
    for (std::uint64_t k = 0; k < out_plane; ++k) {
      const Dims o = g.unravel(k);
      const Box b = window_box(g, o);
      if (box_size(b) == 0) continue;  // its output is the constant 0
      const double share = grad.get_f64(pl * out_plane + k) / divisor(g, o, b);
      for_each_position(b, g.in, [&](std::uint64_t pos) { acc[pl * in_plane + pos] += share; });
    }
  return store_gradient(c, acc);
}

// ---- AdaptiveAvgPool{1,2,3}d{x; attrs output_size..} and their backwards {x, grad}: PyTorch's
// windows [⌊o · in / out⌋, ⌈(o + 1) · in / out⌉) per spatial dim, averaged; the backward spreads
// each grad element evenly over its window.

namespace {

using pool::adaptive_box;

// x of rank n + 2 with non-empty spatial dims (each window holds an element), pooled to `sizes`
// (each at least 1): the attributes, or the grad's spatial dims.
Result<Pool> adaptive_geometry(const Ctx& c, std::span<const std::uint64_t> sizes) {
  Pool g;
  g.n = ir::build::pool_spatial_dims(c.op.kind);
  if (g.n == 0 || sizes.size() != g.n)
    return c.error(ErrorCode::Invalid, fmt::format("takes {} output sizes, got {}", g.n, sizes.size()));
  KILN_RETURN_IF_ERROR(read_x(c, c.in[0], g));
  for (std::size_t i = 0; i < g.n; ++i) {
    if (g.in[3 - g.n + i] == 0)
      return c.error(ErrorCode::Invalid, fmt::format("x {} has an empty spatial dim {}", c.in[0].to_string(), i));
    if (sizes[i] == 0) return c.error(ErrorCode::Invalid, fmt::format("output size 0 at spatial dim {}", i));
    g.out[3 - g.n + i] = sizes[i];
  }
  return g;
}

}  // namespace

Result<Outputs> run_adaptive_avg_pool(const Ctx& c) {
  const HostTensor& x = c.in[0];
  std::vector<std::uint64_t> sizes;
  for (std::size_t i = 0; i < c.op.attrs.size(); ++i) {
    KILN_ASSIGN_OR_RETURN(std::uint64_t size, window_attr(c, i, "output size", 1));
    sizes.push_back(size);
  }
  KILN_ASSIGN_OR_RETURN(Pool g, adaptive_geometry(c, sizes));
  KILN_RETURN_IF_ERROR(expect_out_dtype(c, 0, x.dtype()));
  KILN_RETURN_IF_ERROR(expect_out_shape(c, 0, g.out_shape()));
  KILN_ASSIGN_OR_RETURN(HostTensor out, c.new_output());
  const std::uint64_t in_plane = g.in_plane(), out_plane = g.out_plane();
  for (std::uint64_t pl = 0; pl < g.planes; ++pl)
    for (std::uint64_t k = 0; k < out_plane; ++k) {
      const Box b = adaptive_box(g, g.unravel(k));
      double sum = 0.0;
      for_each_position(b, g.in, [&](std::uint64_t pos) { sum += x.get_f64(pl * in_plane + pos); });
      element::store_f64(out.mutable_data(), out.dtype(), pl * out_plane + k, sum / static_cast<double>(box_size(b)));
    }
  return single(std::move(out));
}

Result<Outputs> run_adaptive_avg_pool_backward(const Ctx& c) {
  const HostTensor& x = c.in[0];
  const HostTensor& grad = c.in[1];
  KILN_RETURN_IF_ERROR(expect_float_input(c, 1, "grad"));
  const ir::Shape& gs = grad.shape();
  if (gs.size() != x.shape().size() || gs.size() < 2 || gs[0] != x.shape()[0] || gs[1] != x.shape()[1])
    return c.error(ErrorCode::IncompatibleShapes, fmt::format("grad {} must have x {}'s rank, batch and channel dims",
                                                              grad.to_string(), x.to_string()));
  const std::vector<std::uint64_t> sizes(gs.begin() + 2, gs.end());
  KILN_ASSIGN_OR_RETURN(Pool g, adaptive_geometry(c, sizes));
  KILN_RETURN_IF_ERROR(expect_gradient_output(c));
  const std::uint64_t in_plane = g.in_plane(), out_plane = g.out_plane();
  std::vector<double> acc(static_cast<std::size_t>(g.planes * in_plane), 0.0);
  for (std::uint64_t pl = 0; pl < g.planes; ++pl)
    for (std::uint64_t k = 0; k < out_plane; ++k) {
      const Box b = adaptive_box(g, g.unravel(k));
      const double share = grad.get_f64(pl * out_plane + k) / static_cast<double>(box_size(b));
      for_each_position(b, g.in, [&](std::uint64_t pos) { acc[pl * in_plane + pos] += share; });
    }
  return store_gradient(c, acc);
}

}  // namespace kiln::reference::kernels
