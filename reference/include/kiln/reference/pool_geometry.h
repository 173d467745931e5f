// The geometry of the pools (docs/spec/ir.md §5.8, shapes §6.3), shared by the reference kernels
// (reference/src/reference_pool.cc) and the fast CPU ones (cpu/src/fast_pool.cc), so that both
// visit the same windows in the same order: every pool runs as a 3-d one whose missing leading
// spatial dims have size 1 (kernel 1, stride 1, no padding), so one loop nest serves every rank
// and an output's flat index within its plane is PyTorch's.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

#include "kiln/base/result.h"
#include "kiln/ir/builders.h"
#include "kiln/ir/shape.h"

namespace kiln::reference::pool {

using Dims = std::array<std::uint64_t, 3>;

// A window's taps inside x along one spatial dim: the first position, how many, the step.
struct Taps {
  std::uint64_t first = 0, count = 0, step = 1;
};
using Box = std::array<Taps, 3>;

inline std::uint64_t box_size(const Box& b) { return b[0].count * b[1].count * b[2].count; }

// One pool op's geometry: x [N, C, in...] pooled to [N, C, out...], the spatial dims right-aligned
// in three (the missing leading ones 1); kernel .. dilation as the attributes say.
struct Geometry {
  std::size_t n = 0;         // the kind's spatial dims
  std::uint64_t planes = 0;  // N · C
  Dims in{1, 1, 1}, out{1, 1, 1};
  Dims kernel{1, 1, 1}, stride{1, 1, 1}, pad{0, 0, 0}, dilation{1, 1, 1};
  bool ceil_mode = false, count_include_pad = false;
  std::uint64_t batch = 0, channels = 0;

  std::uint64_t in_plane() const { return in[0] * in[1] * in[2]; }
  std::uint64_t out_plane() const { return out[0] * out[1] * out[2]; }
  // [N, C, out...]: the pooled shape.
  ir::Shape out_shape() const {
    ir::Shape s{batch, channels};
    for (std::size_t j = 3 - n; j < 3; ++j) s.push_back(out[j]);
    return s;
  }
  // Output k of a plane as a 3-d position (k < out_plane(), so no dim is 0).
  Dims unravel(std::uint64_t k) const { return {k / (out[1] * out[2]), (k / out[2]) % out[1], k % out[2]}; }
};

// A windowed pool's attributes (ir::build::pool_attrs_of), right-aligned.
inline Geometry from_attrs(const ir::build::PoolAttrs& a) {
  Geometry g;
  g.n = a.spatial;
  for (std::size_t i = 0; i < g.n; ++i) {
    const std::size_t j = 3 - g.n + i;
    g.kernel[j] = a.kernel[i];
    g.stride[j] = a.stride[i];
    g.pad[j] = a.padding[i];
    g.dilation[j] = a.dilation[i];
  }
  g.count_include_pad = a.count_include_pad;
  g.ceil_mode = a.ceil_mode;
  return g;
}

// x's batch, channels and spatial sizes into g; false when x's rank is not n + 2.
inline bool read_x(Geometry& g, const ir::Shape& x) {
  if (x.size() != g.n + 2) return false;
  g.batch = x[0];
  g.channels = x[1];
  g.planes = x[0] * x[1];
  for (std::size_t i = 0; i < g.n; ++i) g.in[3 - g.n + i] = x[2 + i];
  return true;
}

// The pooled sizes of a windowed pool by the pool formula (docs/spec/ir.md §4).
inline Status pool_sizes(Geometry& g) {
  for (std::size_t j = 3 - g.n; j < 3; ++j) {
    KILN_ASSIGN_OR_RETURN(
        g.out[j], ir::shape::pool_output(g.in[j], g.kernel[j], g.stride[j], g.pad[j], g.dilation[j], g.ceil_mode));
  }
  return Status::Ok();
}

// Calls f(flat position within the plane) for every tap of the box, in index order.
template <class F>
void for_each_position(const Box& b, const Dims& in, F&& f) {
  for (std::uint64_t i0 = 0; i0 < b[0].count; ++i0) {
    const std::uint64_t p0 = b[0].first + i0 * b[0].step;
    for (std::uint64_t i1 = 0; i1 < b[1].count; ++i1) {
      const std::uint64_t p01 = p0 * in[1] + b[1].first + i1 * b[1].step;
      for (std::uint64_t i2 = 0; i2 < b[2].count; ++i2) f(p01 * in[2] + b[2].first + i2 * b[2].step);
    }
  }
}

// The taps of output o's window inside x (only those: the kernel may be far larger than x when
// the padding is). An empty dim's first position is never read.
inline Box window_box(const Geometry& g, const Dims& o) {
  Box b;
  for (std::size_t j = 0; j < 3; ++j) {
    const std::uint64_t start = o[j] * g.stride[j];  // padded coordinates
    const auto [lo, hi] = ir::shape::window_taps(start, g.kernel[j], g.dilation[j], g.pad[j], g.in[j]);
    b[j] = Taps{start + lo * g.dilation[j] - g.pad[j], hi - lo, g.dilation[j]};
  }
  return b;
}

// PyTorch's divisor of an average pool: the window clipped to the padded input [−pad, in + pad)
// when count_include_pad, else the taps inside x. A double: a hand-made op's huge kernels must not
// wrap.
inline double divisor(const Geometry& g, const Dims& o, const Box& b) {
  if (!g.count_include_pad) return static_cast<double>(box_size(b));
  double d = 1;
  for (std::size_t j = 0; j < 3; ++j) {
    const std::uint64_t start = o[j] * g.stride[j];
    const std::uint64_t end = std::min(start + g.kernel[j], g.in[j] + 2 * g.pad[j]);
    d *= end > start ? static_cast<double>(end - start) : 0.0;
  }
  return d;
}

// An adaptive pool's window per spatial dim: PyTorch's [⌊o · in / out⌋, ⌈(o + 1) · in / out⌉).
// Allocated tensors keep o · in far from overflowing.
inline Box adaptive_box(const Geometry& g, const Dims& o) {
  Box b;
  for (std::size_t j = 0; j < 3; ++j) {
    const std::uint64_t start = o[j] * g.in[j] / g.out[j];
    const std::uint64_t end = ((o[j] + 1) * g.in[j] + g.out[j] - 1) / g.out[j];
    b[j] = Taps{start, end - start, 1};
  }
  return b;
}

}  // namespace kiln::reference::pool
