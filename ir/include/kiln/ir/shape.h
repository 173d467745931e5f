// Shape and Slice, and the shape rules the builders use (docs/spec/ir.md §4).
#pragma once

#include <boost/container/small_vector.hpp>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "kiln/base/result.h"

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
std::uint64_t unfold_windows(std::uint64_t size, std::uint64_t window, std::uint64_t step);
}  // namespace shape

}  // namespace kiln::ir
