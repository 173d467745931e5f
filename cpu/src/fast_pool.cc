// Pools on the fast path: the max, average and adaptive average pools of docs/spec/ir.md §5.8 (1,
// 2 or 3 spatial dims, max pools with or without indices) and their backwards, for f32 and f64
// operands, with the reference executor's numbers bit for bit.
//
// The reference (reference/src/reference_pool.cc) reads and writes every element through the
// dtype-generic codec. These kernels walk the same windows in the same order (the geometry is
// shared: kiln/reference/pool_geometry.h) on typed pointers, keep the reference's f64 sums and its
// tie and NaN rules, and split the work over planes (N · C), which are independent, on the
// device's arena. Anything else (f16/bf16: fast_widen.h runs those on these kernels; mixed dtypes, an attribute
// or shape the builders would refuse, an index out of range) is declined: the reference runs the
// op and reports the error.
#include "fast_pool.h"

#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "fast_program.h"
#include "fast_single_op.h"
#include "kiln/ir/builders.h"
#include "kiln/reference/pool_geometry.h"

namespace kiln::cpu::fast {
namespace {

using reference::pool::Box;
using reference::pool::box_size;
using reference::pool::Dims;
using reference::pool::for_each_position;
using reference::pool::Geometry;
using reference::pool::window_box;

enum class PoolKind { Max, MaxBackward, Avg, AvgBackward, Adaptive, AdaptiveBackward };

std::optional<PoolKind> pool_kind(const ir::Operation& op) {
  using ir::Signature;
  switch (op.info().signature) {
    case Signature::MaxPool2d:
    case Signature::MaxPool:
    case Signature::MaxPoolWithIndices: return PoolKind::Max;
    case Signature::MaxPoolWithIndicesBackward: return PoolKind::MaxBackward;
    case Signature::AvgPool2d:
    case Signature::AvgPool: return PoolKind::Avg;
    case Signature::AvgPoolBackward: return PoolKind::AvgBackward;
    case Signature::AdaptiveAvgPool: return PoolKind::Adaptive;
    case Signature::AdaptiveAvgPoolBackward: return PoolKind::AdaptiveBackward;
    default: return std::nullopt;
  }
}

bool is_backward(PoolKind k) {
  return k == PoolKind::MaxBackward || k == PoolKind::AvgBackward || k == PoolKind::AdaptiveBackward;
}
bool is_adaptive(PoolKind k) { return k == PoolKind::Adaptive || k == PoolKind::AdaptiveBackward; }

// ---- Reading the op: the geometry, checked as the builders check it

// An adaptive pool's: the output sizes (the attributes, or a backward's grad dims), each at least
// 1, over x's non-empty spatial dims.
std::optional<Geometry> adaptive_geometry(const ir::Operation& op, PoolKind kind) {
  Geometry g;
  g.n = ir::build::pool_spatial_dims(op.kind);
  const ir::Shape& xs = op.inputs()[0].shape;
  if (g.n == 0 || !reference::pool::read_x(g, xs)) return std::nullopt;
  std::vector<std::uint64_t> sizes;
  if (kind == PoolKind::Adaptive) {
    for (std::int64_t a : op.attrs) sizes.push_back(a < 1 ? 0 : static_cast<std::uint64_t>(a));
  } else {
    const ir::Shape& gs = op.inputs()[1].shape;
    if (gs.size() != xs.size() || gs[0] != xs[0] || gs[1] != xs[1]) return std::nullopt;
    sizes.assign(gs.begin() + 2, gs.end());
  }
  if (sizes.size() != g.n) return std::nullopt;
  for (std::size_t i = 0; i < g.n; ++i) {
    const std::size_t j = 3 - g.n + i;
    if (sizes[i] == 0 || g.in[j] == 0) return std::nullopt;
    g.out[j] = sizes[i];
  }
  return g;
}

std::optional<Geometry> geometry_of(const ir::Operation& op, PoolKind kind) {
  if (op.inputs().empty()) return std::nullopt;
  if (is_adaptive(kind)) return adaptive_geometry(op, kind);
  Result<ir::build::PoolAttrs> attrs = ir::build::pool_attrs_of(op);
  if (!attrs.ok()) return std::nullopt;
  Geometry g = reference::pool::from_attrs(*attrs);
  if (!reference::pool::read_x(g, op.inputs()[0].shape) || !reference::pool::pool_sizes(g).ok()) return std::nullopt;
  return g;
}

bool is_index_dtype(ir::DType d) { return d == ir::dtypes::i64 || d == ir::dtypes::i32; }

// The operands the geometry implies: a forward's outputs of the pooled shape (indices signed and
// wide enough for the plane's last index); a backward's grad (and indices) of the pooled shape
// and its output of x's. x, grad and the values share one float dtype.
bool operands_match(const ir::Operation& op, PoolKind kind, const Geometry& g) {
  const auto in = op.inputs();
  const auto outs = op.outputs();
  const ir::DType dtype = in[0].dtype;
  if (!(dtype == ir::dtypes::f32) && !(dtype == ir::dtypes::f64)) return false;
  const ir::Shape pooled = g.out_shape();
  if (!is_backward(kind)) {
    if (in.size() != 1 || outs.empty() || outs.size() > (kind == PoolKind::Max ? 2u : 1u)) return false;
    if (outs[0].shape != pooled || !(outs[0].dtype == dtype)) return false;
    if (outs.size() == 2) {
      const std::uint64_t max_index = outs[1].dtype == ir::dtypes::i32
                                          ? std::uint64_t{std::numeric_limits<std::int32_t>::max()}
                                          : ~std::uint64_t{0};
      if (outs[1].shape != pooled || !is_index_dtype(outs[1].dtype)) return false;
      if (g.in_plane() > 0 && g.in_plane() - 1 > max_index) return false;
    }
    return true;
  }
  const std::size_t arity = kind == PoolKind::MaxBackward ? 3 : 2;
  if (in.size() != arity || outs.size() != 1) return false;
  if (in[1].shape != pooled || !(in[1].dtype == dtype)) return false;
  if (arity == 3 && (in[2].shape != pooled || !is_index_dtype(in[2].dtype))) return false;
  return outs[0].shape == in[0].shape && outs[0].dtype == dtype;
}

// ---- The kernels, one plane range each. Sums in f64 in the reference's order, rounded once.

template <class T>
struct Planes {
  const Geometry& g;
  const T* x = nullptr;     // forwards
  const T* grad = nullptr;  // backwards
  const void* indices = nullptr;
  bool indices_i32 = false;
  T* out = nullptr;
  void* out_indices = nullptr;  // a max pool's second output
};

// The outputs whose windows lie inside x whole (no padding, no clipping), per dim [lo, hi), and
// the offsets of a window's taps from its first position in window_box's order: there a window
// is its first position plus the offsets, with no per-output box to work out.
struct Interior {
  Dims lo{0, 0, 0}, hi{0, 0, 0};
  std::vector<std::uint64_t> taps;

  explicit Interior(const Geometry& g) {
    for (std::size_t j = 0; j < 3; ++j) {
      const std::uint64_t span = (g.kernel[j] - 1) * g.dilation[j];  // first to last tap
      lo[j] = std::min(g.out[j], (g.pad[j] + g.stride[j] - 1) / g.stride[j]);
      hi[j] =
          g.in[j] + g.pad[j] >= span + 1 ? std::min(g.out[j], (g.in[j] + g.pad[j] - span - 1) / g.stride[j] + 1) : 0;
      hi[j] = std::max(hi[j], lo[j]);
    }
    for (std::uint64_t k0 = 0; k0 < g.kernel[0]; ++k0)
      for (std::uint64_t k1 = 0; k1 < g.kernel[1]; ++k1)
        for (std::uint64_t k2 = 0; k2 < g.kernel[2]; ++k2)
          taps.push_back((k0 * g.dilation[0] * g.in[1] + k1 * g.dilation[1]) * g.in[2] + k2 * g.dilation[2]);
  }
  // The first tap of an interior output's window.
  static std::uint64_t first(const Geometry& g, const Dims& o) {
    auto at = [&](std::size_t j) { return o[j] * g.stride[j] - g.pad[j]; };
    return (at(0) * g.in[1] + at(1)) * g.in[2] + at(2);
  }
};

// Outputs [lo, hi) of one output row whose windows all lie inside x (`first`: the first tap of
// output lo): the max rule tap by tap across the row, with selects instead of branches (which tap
// wins is data, unpredictable) and independent outputs in the inner loop.
template <class T>
void max_interior_row(const Geometry& g, const Interior& interior, const T* x, std::uint64_t first, std::size_t n,
                      T* best, std::int64_t* index) {
  const std::uint64_t step = g.stride[2];
  const std::uint64_t tap0 = interior.taps[0];
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t pos = first + i * step + tap0;
    best[i] = x[pos];
    index[i] = static_cast<std::int64_t>(pos);
  }
  for (std::size_t t = 1; t < interior.taps.size(); ++t) {
    const std::uint64_t tap = interior.taps[t];
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint64_t pos = first + i * step + tap;
      const T v = x[pos];
      const bool take = (v > best[i]) | (v != v);  // larger, or NaN (the last NaN wins)
      best[i] = take ? v : best[i];
      index[i] = take ? static_cast<std::int64_t>(pos) : index[i];
    }
  }
}

// PyTorch's max and its index: the first tap is the candidate and a strictly larger value or a
// NaN replaces it (ties keep the first tap, the last NaN wins); no tap inside x: −inf and −1.
template <class T>
void max_planes(const Planes<T>& p, std::uint64_t begin, std::uint64_t end) {
  const Geometry& g = p.g;
  const std::uint64_t in_plane = g.in_plane(), out_plane = g.out_plane();
  const Interior interior(g);
  std::vector<T> row_best(g.out[2]);
  std::vector<std::int64_t> row_index(g.out[2]);
  for (std::uint64_t pl = begin; pl < end; ++pl) {
    const T* x = p.x + pl * in_plane;
    auto store = [&](std::uint64_t k, T best, std::int64_t index) {
      const std::uint64_t at = pl * out_plane + k;
      p.out[at] = best;
      if (p.out_indices == nullptr) return;
      if (p.indices_i32)
        static_cast<std::int32_t*>(p.out_indices)[at] = static_cast<std::int32_t>(index);
      else
        static_cast<std::int64_t*>(p.out_indices)[at] = index;
    };
    for (std::uint64_t row = 0; row < g.out[0] * g.out[1]; ++row) {
      const Dims row_start{row / g.out[1], row % g.out[1], 0};
      const bool inner_row = row_start[0] >= interior.lo[0] && row_start[0] < interior.hi[0] &&
                             row_start[1] >= interior.lo[1] && row_start[1] < interior.hi[1];
      const std::uint64_t lo = inner_row ? interior.lo[2] : g.out[2], hi = inner_row ? interior.hi[2] : g.out[2];
      if (lo < hi) {
        max_interior_row(g, interior, x, Interior::first(g, {row_start[0], row_start[1], lo}), hi - lo, row_best.data(),
                         row_index.data());
        for (std::uint64_t o2 = lo; o2 < hi; ++o2) store(row * g.out[2] + o2, row_best[o2 - lo], row_index[o2 - lo]);
      }
      // The outputs whose windows reach past x: the window box, tap by tap.
      for (std::uint64_t o2 = 0; o2 < g.out[2]; ++o2) {
        if (o2 >= lo && o2 < hi) continue;
        T best = -std::numeric_limits<T>::infinity();
        std::int64_t index = -1;
        for_each_position(window_box(g, {row_start[0], row_start[1], o2}), g.in, [&](std::uint64_t pos) {
          const T v = x[pos];
          if (index < 0 || v > best || std::isnan(v)) {
            best = v;
            index = static_cast<std::int64_t>(pos);
          }
        });
        store(row * g.out[2] + o2, best, index);
      }
    }
  }
}

// Each grad element added at its index within its plane (−1, an empty window, adds nowhere).
// False on an index outside the plane (the reference reports it).
template <class T>
bool max_backward_planes(const Planes<T>& p, std::uint64_t begin, std::uint64_t end, std::vector<double>& acc) {
  const Geometry& g = p.g;
  const std::uint64_t in_plane = g.in_plane(), out_plane = g.out_plane();
  for (std::uint64_t pl = begin; pl < end; ++pl) {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (std::uint64_t k = 0; k < out_plane; ++k) {
      const std::uint64_t e = pl * out_plane + k;
      const std::int64_t at = p.indices_i32 ? static_cast<const std::int32_t*>(p.indices)[e]
                                            : static_cast<const std::int64_t*>(p.indices)[e];
      if (at == -1) continue;
      if (at < 0 || static_cast<std::uint64_t>(at) >= in_plane) return false;
      acc[static_cast<std::size_t>(at)] += static_cast<double>(p.grad[e]);
    }
    T* out = p.out + pl * in_plane;
    for (std::uint64_t i = 0; i < in_plane; ++i) out[i] = static_cast<T>(acc[i]);
  }
  return true;
}

// An average window's box and divisor: PyTorch's (a window with no element of x gives 0).
template <bool kAdaptive>
Box average_box(const Geometry& g, const Dims& o, double& divisor) {
  const Box b = kAdaptive ? reference::pool::adaptive_box(g, o) : window_box(g, o);
  divisor = kAdaptive ? static_cast<double>(box_size(b)) : reference::pool::divisor(g, o, b);
  return b;
}

template <class T, bool kAdaptive>
void average_planes(const Planes<T>& p, std::uint64_t begin, std::uint64_t end) {
  const Geometry& g = p.g;
  const std::uint64_t in_plane = g.in_plane(), out_plane = g.out_plane();
  for (std::uint64_t pl = begin; pl < end; ++pl) {
    const T* x = p.x + pl * in_plane;
    for (std::uint64_t k = 0; k < out_plane; ++k) {
      double div = 0;
      const Box b = average_box<kAdaptive>(g, g.unravel(k), div);
      double value = 0.0;
      if (box_size(b) != 0) {
        double sum = 0.0;
        for_each_position(b, g.in, [&](std::uint64_t pos) { sum += static_cast<double>(x[pos]); });
        value = sum / div;
      }
      p.out[pl * out_plane + k] = static_cast<T>(value);
    }
  }
}

// The adjoint of the average: each grad element divided by its window's divisor and added to the
// window's taps inside x, in output order.
template <class T, bool kAdaptive>
void average_backward_planes(const Planes<T>& p, std::uint64_t begin, std::uint64_t end, std::vector<double>& acc) {
  const Geometry& g = p.g;
  const std::uint64_t in_plane = g.in_plane(), out_plane = g.out_plane();
  for (std::uint64_t pl = begin; pl < end; ++pl) {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (std::uint64_t k = 0; k < out_plane; ++k) {
      double div = 0;
      const Box b = average_box<kAdaptive>(g, g.unravel(k), div);
      if (box_size(b) == 0) continue;  // its output is the constant 0
      const double share = static_cast<double>(p.grad[pl * out_plane + k]) / div;
      for_each_position(b, g.in, [&](std::uint64_t pos) { acc[pos] += share; });
    }
    T* out = p.out + pl * in_plane;
    for (std::uint64_t i = 0; i < in_plane; ++i) out[i] = static_cast<T>(acc[i]);
  }
}

// Runs the kind's kernel over every plane; false when a max backward met a bad index.
template <class T>
bool run_planes(const Launch& launch, PoolKind kind, const Planes<T>& p) {
  const Geometry& g = p.g;
  // Work per plane: the larger side, times the kernel's taps for the windowed pools.
  const std::uint64_t taps = is_adaptive(kind) ? 1 : g.kernel[0] * g.kernel[1] * g.kernel[2];
  const std::uint64_t work = std::max<std::uint64_t>(1, std::max(g.in_plane(), g.out_plane() * taps));
  const std::uint64_t grain = std::max<std::uint64_t>(1, kParallelThreshold / work);
  std::atomic<bool> bad_index{false};
  parallel_ranges(launch, g.planes, grain, [&](std::uint64_t begin, std::uint64_t end) {
    std::vector<double> acc(is_backward(kind) ? g.in_plane() : 0);
    switch (kind) {
      case PoolKind::Max: max_planes(p, begin, end); break;
      case PoolKind::MaxBackward:
        if (!max_backward_planes(p, begin, end, acc)) bad_index.store(true, std::memory_order_relaxed);
        break;
      case PoolKind::Avg: average_planes<T, false>(p, begin, end); break;
      case PoolKind::Adaptive: average_planes<T, true>(p, begin, end); break;
      case PoolKind::AvgBackward: average_backward_planes<T, false>(p, begin, end, acc); break;
      case PoolKind::AdaptiveBackward: average_backward_planes<T, true>(p, begin, end, acc); break;
    }
  });
  return !bad_index.load(std::memory_order_relaxed);
}

}  // namespace

bool run_pool(const ir::Operation& op, CpuDevice& device, CpuDevice::Handles& handles) {
  const std::optional<PoolKind> kind = pool_kind(op);
  if (!kind) return false;
  const std::optional<Geometry> g = geometry_of(op, *kind);
  if (!g || !operands_match(op, *kind, *g)) return false;
  const std::optional<std::vector<const HostTensor*>> held = held_inputs(op, handles);
  if (!held) return false;
  const std::vector<const HostTensor*>& in = *held;
  std::vector<HostTensor> outs;
  for (const ir::TensorIr& t : op.outputs()) {
    Result<HostTensor> out = HostTensor::allocate(device.allocator(), t.shape, t.dtype);
    if (!out.ok()) return false;
    outs.push_back(std::move(out).value());
  }

  const Launch launch = launch_on(device);
  const bool backward = is_backward(*kind);
  auto run = [&]<class T>(T*) {
    Planes<T> p{*g};
    (backward ? p.grad : p.x) = reinterpret_cast<const T*>(in[backward ? 1 : 0]->data());
    p.out = reinterpret_cast<T*>(outs[0].mutable_data());
    if (*kind == PoolKind::MaxBackward) {
      p.indices = in[2]->data();
      p.indices_i32 = in[2]->dtype() == ir::dtypes::i32;
    }
    if (outs.size() == 2) {
      p.out_indices = outs[1].mutable_data();
      p.indices_i32 = outs[1].dtype() == ir::dtypes::i32;
    }
    return run_planes<T>(launch, *kind, p);
  };
  const bool ran =
      in[0]->dtype() == ir::dtypes::f32 ? run(static_cast<float*>(nullptr)) : run(static_cast<double*>(nullptr));
  if (!ran) return false;  // the outputs are dropped unregistered

  commit(op, handles, outs);
  return true;
}

}  // namespace kiln::cpu::fast
