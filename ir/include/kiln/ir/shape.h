// Shape and Slice, and the shape rules the builders use (docs/spec/ir.md §4).
#pragma once

#include <algorithm>
#include <boost/container/small_vector.hpp>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>

#include "kiln/base/result.h"
#include "kiln/ir/dtype.h"

namespace kiln::ir {

// Up to 6 dims inline: every tensor occurrence carries a shape, and the registration path must
// not allocate for ordinary ranks.
using Shape = boost::container::small_vector<std::uint64_t, 6>;

std::string shape_to_string(const Shape& s);  // "[2,3,4]"
std::uint64_t num_elements(const Shape& s);   // product (1 for rank 0)

// One range of a slice: start, optional exclusive end, step != 0 (negative indices count from
// the end of the dimension).
struct Slice {
  std::int64_t start = 0;
  std::optional<std::int64_t> end;
  std::int64_t step = 1;

  // Concrete [start, end) in a dimension of size n, after clamping (docs/spec/ir.md §4).
  std::uint64_t begin_in(std::uint64_t n) const;
  std::uint64_t end_in(std::uint64_t n) const;
  // Output size in a dimension of size n.
  std::uint64_t output_size(std::uint64_t n) const;
  // The input position of output position i < output_size(n) (docs/spec/ir.md §4): from
  // begin_in(n) upwards for a positive step; Burn's negative steps walk the clamped range
  // backwards from end_in(n) − 1.
  std::uint64_t position(std::uint64_t n, std::uint64_t i) const;
  std::string to_string() const;
  friend bool operator==(const Slice&, const Slice&) = default;
};

namespace shape {
// broadcast(a, b): equal ranks; per dim equal / left 1 / right 1.
Result<Shape> broadcast(const Shape& a, const Shape& b);
Result<Shape> broadcast_many(std::span<const Shape> shapes);
// expand(self, target): right-aligned; self dim equal to the target dim or 1.
Result<Shape> expand(const Shape& self, const Shape& target);
// reshape(self, args): >0 literal, 0 copies self's dim at that position, -1 inferred (once).
Result<Shape> reshape(const Shape& self, std::span<const std::int64_t> args);
Result<Shape> swapped(const Shape& self, std::uint64_t d1, std::uint64_t d2);
// permuted(axes): new[i] = old[axes[i]]; axes must be a permutation of 0..rank-1.
Result<Shape> permuted(const Shape& self, std::span<const std::uint64_t> axes);
Result<Shape> repeat(const Shape& self, std::uint64_t dim, std::uint64_t times);
Result<Shape> cat(std::span<const Shape> shapes, std::uint64_t dim);
Result<Shape> slice(const Shape& self, std::span<const Slice> ranges);
Result<Shape> matmul_output(const Shape& lhs, const Shape& rhs);

// Spatial formulas (docs/spec/ir.md §4); an error instead of wrapping when a numerator is negative.
Result<std::uint64_t> conv_output(std::uint64_t in, std::uint64_t kernel, std::uint64_t stride, std::uint64_t padding,
                                  std::uint64_t dilation);
Result<std::uint64_t> pool_output(std::uint64_t in, std::uint64_t kernel, std::uint64_t stride, std::uint64_t padding,
                                  std::uint64_t dilation, bool ceil_mode);
Result<std::uint64_t> conv_transpose_output(std::uint64_t in, std::uint64_t kernel, std::uint64_t stride,
                                            std::uint64_t padding, std::uint64_t padding_out, std::uint64_t dilation);

// A sliding window's kernel taps [lo, hi) whose position start + i * step - pad falls inside
// [0, n) (the kernel size is an attribute: it may be far larger than the input when the padding
// is).
inline std::pair<std::uint64_t, std::uint64_t> window_taps(std::uint64_t start, std::uint64_t k, std::uint64_t step,
                                                           std::uint64_t pad, std::uint64_t n) {
  // start + i * step >= pad  <=>  i >= ceil((pad - start) / step)
  const std::uint64_t lo = start >= pad ? 0 : (pad - start + step - 1) / step;
  // start + i * step < pad + n  <=>  i < ceil((pad + n - start) / step)
  const std::uint64_t end = pad + n;
  const std::uint64_t hi = end <= start ? 0 : std::min(k, (end - start + step - 1) / step);
  return {std::min(lo, hi), hi};
}
std::uint64_t unfold_windows(std::uint64_t size, std::uint64_t window, std::uint64_t step);

// How kiln stores a QFloat tensor of shape `s` under its scheme (docs/decisions.md): one scale per
// block of the scheme's block shape, right-aligned to the tensor's dims (missing leading entries
// 1), so the scales have the tensor's rank and dims s[d] / block[d] ([1] for a per-tensor scheme);
// the packed stores hold 32 / bits (PackedU32) or 8 / bits (PackedNative) values per word along
// the packed axis rank − 1 − packed_dim. The bytes: the values (one signed byte each in the native
// store, else the words), then the scales in the scheme's precision, then an f32 global scale
// (the CPU device's HostTensor layout; the daemon charges outputs by it). Errors (Invalid): an
// unknown value type, store or scale precision; a zero block dim or one that does not divide its
// tensor dim; a block of more dims than the tensor whose extra leading entries are not 1; a packed
// dim out of range or a packed axis the values per word do not divide; a size beyond 64 bits.
struct QuantGeometry {
  Shape scales;
  std::uint64_t values_per_word = 1;  // 1 for the native store: one signed byte per value
  std::size_t packed_axis = 0;        // the packed stores' axis
  std::uint64_t word_bytes = 1;       // 4 for PackedU32
  std::uint64_t scale_bytes = 4;      // 2 for f16 / bf16 scales
  std::uint64_t scales_offset = 0;    // the values' bytes
  std::uint64_t global_offset = 0;    // the scales' end
  std::uint64_t total_bytes = 0;      // with the f32 global scale
};
Result<QuantGeometry> quant_geometry(const Shape& s, const QuantScheme& q);
}  // namespace shape

}  // namespace kiln::ir
