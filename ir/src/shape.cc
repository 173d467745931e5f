// Shape rules of docs/spec/ir.md §4: broadcasting, reshape, slicing, concatenation, matmul and the
// spatial formulas. Every rule returns an error value naming the offending shapes or dims.
#include "kiln/ir/shape.h"

#include <fmt/format.h>

#include <algorithm>

namespace kiln::ir {
namespace {

// Overflow-checked arithmetic: shapes come from clients, a wrapped product would silently
// produce a wrong (small) shape.
bool mul_overflows(std::uint64_t a, std::uint64_t b, std::uint64_t* out) { return __builtin_mul_overflow(a, b, out); }
bool add_overflows(std::uint64_t a, std::uint64_t b, std::uint64_t* out) { return __builtin_add_overflow(a, b, out); }

std::string list_to_string(std::span<const std::int64_t> v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += fmt::format("{}{}", i ? "," : "", v[i]);
  return s + "]";
}
std::string list_to_string(std::span<const std::uint64_t> v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += fmt::format("{}{}", i ? "," : "", v[i]);
  return s + "]";
}

Error overflow_error(const char* what) {
  return make_error(ErrorCode::Invalid, fmt::format("{}: size overflows 64 bits", what));
}

// Maps a slice index into [0, n] (docs/spec/ir.md §4): negative counts from the end, clamped.
std::uint64_t clamp_index(std::int64_t i, std::uint64_t n) {
  if (i < 0) {
    // -i as unsigned is exact even for INT64_MIN.
    const std::uint64_t back = static_cast<std::uint64_t>(-(i + 1)) + 1;
    return back >= n ? 0 : n - back;
  }
  return std::min(static_cast<std::uint64_t>(i), n);
}

// The numerator shared by the convolution and pooling formulas: in + 2p − d(k − 1) − 1.
Result<std::uint64_t> window_numerator(const char* what, std::uint64_t in, std::uint64_t kernel, std::uint64_t stride,
                                       std::uint64_t padding, std::uint64_t dilation) {
  if (stride == 0) return make_error(ErrorCode::Invalid, fmt::format("{}: stride must be at least 1", what));
  if (kernel == 0) return make_error(ErrorCode::Invalid, fmt::format("{}: kernel size must be at least 1", what));
  if (dilation == 0) return make_error(ErrorCode::Invalid, fmt::format("{}: dilation must be at least 1", what));
  std::uint64_t padded, twice_pad, span, reach;
  if (mul_overflows(padding, 2, &twice_pad) || add_overflows(in, twice_pad, &padded) ||
      mul_overflows(dilation, kernel - 1, &span) || add_overflows(span, 1, &reach))
    return overflow_error(what);
  if (reach > padded)
    return make_error(ErrorCode::Invalid,
                      fmt::format("{}: kernel {} with dilation {} spans {} elements, more than the padded input "
                                  "{} (size {} + 2*padding {})",
                                  what, kernel, dilation, reach, padded, in, padding));
  return padded - reach;
}

}  // namespace

std::string shape_to_string(const Shape& s) {
  return list_to_string(std::span<const std::uint64_t>(s.data(), s.size()));
}

std::uint64_t num_elements(const Shape& s) {
  std::uint64_t n = 1;
  for (std::uint64_t d : s) n *= d;
  return n;
}

std::uint64_t Slice::begin_in(std::uint64_t n) const { return clamp_index(start, n); }

std::uint64_t Slice::end_in(std::uint64_t n) const { return end ? clamp_index(*end, n) : n; }

std::uint64_t Slice::output_size(std::uint64_t n) const {
  const std::uint64_t b = begin_in(n);
  const std::uint64_t e = end_in(n);
  if (b >= e) return 0;
  const std::uint64_t len = e - b;
  // |step|; step 0 is rejected by shape::slice and Operation::validate, treated as 1 here so the
  // function stays total.
  const std::uint64_t abs_step =
      step == 0 ? 1 : (step < 0 ? static_cast<std::uint64_t>(-(step + 1)) + 1 : static_cast<std::uint64_t>(step));
  return abs_step == 1 ? len : (len + abs_step - 1) / abs_step;
}

std::uint64_t Slice::position(std::uint64_t n, std::uint64_t i) const {
  const std::uint64_t abs_step =
      step < 0 ? static_cast<std::uint64_t>(-(step + 1)) + 1 : static_cast<std::uint64_t>(step);
  return step > 0 ? begin_in(n) + i * abs_step : (end_in(n) - 1) - i * abs_step;  // stays in [begin, end)
}

std::string Slice::to_string() const {
  return end ? fmt::format("Slice({}, {}, {})", start, *end, step) : fmt::format("Slice({}, none, {})", start, step);
}

namespace shape {

Result<Shape> broadcast(const Shape& a, const Shape& b) {
  if (a.size() != b.size())
    return make_error(ErrorCode::RankMismatch, fmt::format("broadcast: rank mismatch {} vs {} ({} vs {})", a.size(),
                                                           b.size(), shape_to_string(a), shape_to_string(b)));
  Shape out(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i] == b[i] || b[i] == 1) {
      out[i] = a[i];
    } else if (a[i] == 1) {
      out[i] = b[i];
    } else {
      return make_error(ErrorCode::IncompatibleDims,
                        fmt::format("broadcast: incompatible dims {} and {} at dim {} ({} vs {})", a[i], b[i], i,
                                    shape_to_string(a), shape_to_string(b)));
    }
  }
  return out;
}

Result<Shape> broadcast_many(std::span<const Shape> shapes) {
  if (shapes.empty()) return make_error(ErrorCode::Invalid, "Shape is empty.");
  Shape acc = shapes[0];
  for (std::size_t i = 1; i < shapes.size(); ++i) {
    KILN_ASSIGN_OR_RETURN(acc, broadcast(acc, shapes[i]));
  }
  return acc;
}

Result<Shape> expand(const Shape& self, const Shape& target) {
  if (self.size() > target.size())
    return make_error(ErrorCode::RankMismatch,
                      fmt::format("expand: cannot expand rank {} to lower rank {} ({} to {})", self.size(),
                                  target.size(), shape_to_string(self), shape_to_string(target)));
  const std::size_t offset = target.size() - self.size();
  for (std::size_t i = 0; i < self.size(); ++i) {
    const std::uint64_t s = self[i];
    const std::uint64_t t = target[offset + i];
    if (s != t && s != 1)
      return make_error(ErrorCode::IncompatibleDims,
                        fmt::format("expand: incompatible dims {} and {} at dim {} ({} to {})", s, t, offset + i,
                                    shape_to_string(self), shape_to_string(target)));
  }
  return target;
}

Result<Shape> reshape(const Shape& self, std::span<const std::int64_t> args) {
  auto invalid = [&](const std::string& why) {
    return make_error(ErrorCode::Invalid,
                      fmt::format("reshape: {} ({} to {})", why, shape_to_string(self), list_to_string(args)));
  };
  std::uint64_t total = 1;
  for (std::uint64_t d : self)
    if (mul_overflows(total, d, &total)) return overflow_error("reshape");

  Shape out(args.size());
  std::optional<std::size_t> inferred;
  std::uint64_t known = 1;  // product of every dim except the inferred one
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::int64_t a = args[i];
    if (a == -1) {
      if (inferred) return invalid(fmt::format("more than one -1 (at {} and {})", *inferred, i));
      inferred = i;
      continue;
    }
    if (a < -1) return invalid(fmt::format("negative size {} at {}", a, i));
    if (a == 0) {
      if (i >= self.size()) return invalid(fmt::format("0 at {} copies a dim the rank-{} input lacks", i, self.size()));
      out[i] = self[i];
    } else {
      out[i] = static_cast<std::uint64_t>(a);
    }
    if (mul_overflows(known, out[i], &known)) return overflow_error("reshape");
  }
  if (inferred) {
    if (known == 0) return invalid("cannot infer -1 when the other dims multiply to 0");
    if (total % known != 0) return invalid(fmt::format("{} elements are not divisible by {}", total, known));
    out[*inferred] = total / known;
  } else if (known != total) {
    return invalid(fmt::format("element count {} differs from {}", known, total));
  }
  return out;
}

Result<Shape> swapped(const Shape& self, std::uint64_t d1, std::uint64_t d2) {
  for (std::uint64_t d : {d1, d2})
    if (d >= self.size())
      return make_error(ErrorCode::OutOfBounds, fmt::format("swap_dims: dim {} out of bounds for rank {} ({})", d,
                                                            self.size(), shape_to_string(self)));
  Shape out = self;
  std::swap(out[d1], out[d2]);
  return out;
}

Result<Shape> permuted(const Shape& self, std::span<const std::uint64_t> axes) {
  if (axes.size() != self.size())
    return make_error(ErrorCode::RankMismatch, fmt::format("permute: {} axes {} for rank {} ({})", axes.size(),
                                                           list_to_string(axes), self.size(), shape_to_string(self)));
  Shape out(self.size());
  boost::container::small_vector<bool, 8> seen(self.size(), false);
  for (std::size_t i = 0; i < axes.size(); ++i) {
    const std::uint64_t a = axes[i];
    if (a >= self.size() || seen[a])
      return make_error(ErrorCode::Invalid, fmt::format("permute: axes {} are not a permutation of 0..{} ({})",
                                                        list_to_string(axes), self.size(), shape_to_string(self)));
    seen[a] = true;
    out[i] = self[a];
  }
  return out;
}

Result<Shape> repeat(const Shape& self, std::uint64_t dim, std::uint64_t times) {
  if (dim >= self.size())
    return make_error(ErrorCode::OutOfBounds, fmt::format("repeat: dim {} out of bounds for rank {} ({})", dim,
                                                          self.size(), shape_to_string(self)));
  Shape out = self;
  if (mul_overflows(out[dim], times, &out[dim])) return overflow_error("repeat");
  return out;
}

Result<Shape> cat(std::span<const Shape> shapes, std::uint64_t dim) {
  if (shapes.empty()) return make_error(ErrorCode::Invalid, "cat: no tensors to concatenate");
  const Shape& first = shapes[0];
  if (dim >= first.size())
    return make_error(ErrorCode::OutOfBounds, fmt::format("cat: dim {} out of bounds for rank {} ({})", dim,
                                                          first.size(), shape_to_string(first)));
  Shape out = first;
  for (std::size_t i = 1; i < shapes.size(); ++i) {
    const Shape& s = shapes[i];
    if (s.size() != first.size())
      return make_error(ErrorCode::RankMismatch,
                        fmt::format("cat: rank mismatch {} vs {} (tensor 0 {} vs tensor {} {})", first.size(), s.size(),
                                    shape_to_string(first), i, shape_to_string(s)));
    for (std::size_t d = 0; d < s.size(); ++d) {
      if (d != dim && s[d] != first[d])
        return make_error(ErrorCode::IncompatibleShapes,
                          fmt::format("cat: dim {} differs, {} vs {} (tensor 0 {} vs tensor {} {}, cat on dim {})", d,
                                      first[d], s[d], shape_to_string(first), i, shape_to_string(s), dim));
    }
    if (add_overflows(out[dim], s[dim], &out[dim])) return overflow_error("cat");
  }
  return out;
}

Result<Shape> slice(const Shape& self, std::span<const Slice> ranges) {
  if (ranges.size() > self.size())
    return make_error(ErrorCode::RankMismatch, fmt::format("slice: {} ranges for rank {} ({})", ranges.size(),
                                                           self.size(), shape_to_string(self)));
  Shape out = self;
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    if (ranges[i].step == 0)
      return make_error(ErrorCode::Invalid, fmt::format("slice: step 0 in {} at dim {} ({})", ranges[i].to_string(), i,
                                                        shape_to_string(self)));
    out[i] = ranges[i].output_size(self[i]);
  }
  return out;
}

Result<Shape> matmul_output(const Shape& lhs, const Shape& rhs) {
  if (lhs.size() != rhs.size() || lhs.size() < 2)
    return make_error(ErrorCode::RankMismatch,
                      fmt::format("matmul: ranks must be equal and at least 2, got {} and {} ({} x {})", lhs.size(),
                                  rhs.size(), shape_to_string(lhs), shape_to_string(rhs)));
  const std::size_t r = lhs.size();
  if (lhs[r - 1] != rhs[r - 2])
    return make_error(ErrorCode::IncompatibleShapes,
                      fmt::format("matmul: inner dims differ, {} vs {} ({} x {})", lhs[r - 1], rhs[r - 2],
                                  shape_to_string(lhs), shape_to_string(rhs)));
  Shape out(r);
  for (std::size_t i = 0; i + 2 < r; ++i) {
    if (lhs[i] == rhs[i] || rhs[i] == 1) {
      out[i] = lhs[i];
    } else if (lhs[i] == 1) {
      out[i] = rhs[i];
    } else {
      return make_error(ErrorCode::IncompatibleDims,
                        fmt::format("matmul: incompatible batch dims {} and {} at dim {} ({} x {})", lhs[i], rhs[i], i,
                                    shape_to_string(lhs), shape_to_string(rhs)));
    }
  }
  out[r - 2] = lhs[r - 2];
  out[r - 1] = rhs[r - 1];
  return out;
}

Result<std::uint64_t> conv_output(std::uint64_t in, std::uint64_t kernel, std::uint64_t stride, std::uint64_t padding,
                                  std::uint64_t dilation) {
  KILN_ASSIGN_OR_RETURN(std::uint64_t num, window_numerator("conv", in, kernel, stride, padding, dilation));
  return num / stride + 1;
}

Result<std::uint64_t> pool_output(std::uint64_t in, std::uint64_t kernel, std::uint64_t stride, std::uint64_t padding,
                                  std::uint64_t dilation, bool ceil_mode) {
  KILN_ASSIGN_OR_RETURN(std::uint64_t num, window_numerator("pool", in, kernel, stride, padding, dilation));
  return (ceil_mode ? num / stride + (num % stride != 0) : num / stride) + 1;
}

Result<std::uint64_t> conv_transpose_output(std::uint64_t in, std::uint64_t kernel, std::uint64_t stride,
                                            std::uint64_t padding, std::uint64_t padding_out, std::uint64_t dilation) {
  const char* what = "conv_transpose";
  if (stride == 0) return make_error(ErrorCode::Invalid, fmt::format("{}: stride must be at least 1", what));
  if (kernel == 0) return make_error(ErrorCode::Invalid, fmt::format("{}: kernel size must be at least 1", what));
  if (dilation == 0) return make_error(ErrorCode::Invalid, fmt::format("{}: dilation must be at least 1", what));
  if (in == 0) return make_error(ErrorCode::Invalid, fmt::format("{}: input size must be at least 1", what));
  // (in − 1)s + d(k − 1) + 1 + padding_out − 2p, with the subtraction last.
  std::uint64_t grown, span, sum, twice_pad;
  if (mul_overflows(in - 1, stride, &grown) || mul_overflows(dilation, kernel - 1, &span) ||
      add_overflows(grown, span, &sum) || add_overflows(sum, 1, &sum) || add_overflows(sum, padding_out, &sum) ||
      mul_overflows(padding, 2, &twice_pad))
    return overflow_error(what);
  if (twice_pad > sum)
    return make_error(ErrorCode::Invalid,
                      fmt::format("{}: 2*padding {} exceeds the unpadded output {} (input {}, kernel {}, stride {}, "
                                  "dilation {}, padding_out {})",
                                  what, twice_pad, sum, in, kernel, stride, dilation, padding_out));
  return sum - twice_pad;
}

std::uint64_t unfold_windows(std::uint64_t size, std::uint64_t window, std::uint64_t step) {
  if (step == 0) return 0;  // step > 0 is a precondition; 0 windows rather than a division by zero
  const std::uint64_t x = size + step;
  return x < window ? 0 : (x - window) / step;
}

namespace {
Status check_scheme_enums(const QuantScheme& q) {
  if (quant_value_bits(q.value) == 0)
    return make_error(ErrorCode::Invalid, fmt::format("quant: unknown value type {}", static_cast<int>(q.value)));
  if (static_cast<int>(q.store) > static_cast<int>(QuantStoreKind::PackedNative))
    return make_error(ErrorCode::Invalid, fmt::format("quant: unknown store {}", static_cast<int>(q.store)));
  if (static_cast<int>(q.param) > static_cast<int>(QuantParam::BF16))
    return make_error(ErrorCode::Invalid, fmt::format("quant: unknown scale precision {}", static_cast<int>(q.param)));
  if (q.block_rank > q.block.size())
    return make_error(ErrorCode::Invalid,
                      fmt::format("quant: block rank {} exceeds the {} a scheme holds", q.block_rank, q.block.size()));
  return Status::Ok();
}

// The block scales' shape: s[d] / block[d] over the block right-aligned to s.
Result<Shape> block_scales(const Shape& s, const QuantScheme& q) {
  if (q.block_rank == 0) return Shape{1};
  Shape scales = s;
  for (std::size_t j = 0; j < q.block_rank; ++j) {
    const std::uint64_t b = q.block[j];
    const std::size_t from_back = q.block_rank - j;  // 1 = the last dim
    if (b == 0) return make_error(ErrorCode::Invalid, "quant: block dims must be at least 1");
    if (from_back > s.size()) {
      if (b != 1)
        return make_error(ErrorCode::Invalid, fmt::format("quant: a block of rank {} does not fit a rank-{} tensor",
                                                          q.block_rank, s.size()));
      continue;
    }
    const std::size_t d = s.size() - from_back;
    if (s[d] % b != 0)
      return make_error(ErrorCode::Invalid, fmt::format("quant: dim {} of size {} is not divisible by the block's {} "
                                                        "({})",
                                                        d, s[d], b, shape_to_string(s)));
    scales[d] = s[d] / b;
  }
  return scales;
}

// The packed stores' axis and values per word, which must divide it.
Status pack(const Shape& s, const QuantScheme& q, QuantGeometry& g) {
  if (q.packed_dim >= s.size())
    return make_error(ErrorCode::Invalid,
                      fmt::format("quant: packed dim {} out of bounds for rank {}", q.packed_dim, s.size()));
  g.packed_axis = s.size() - 1 - q.packed_dim;
  g.word_bytes = q.store == QuantStoreKind::PackedU32 ? 4 : 1;
  g.values_per_word = g.word_bytes * 8 / static_cast<std::uint64_t>(quant_value_bits(q.value));
  if (s[g.packed_axis] % g.values_per_word != 0)
    return make_error(ErrorCode::Invalid,
                      fmt::format("quant: the packed axis {} of size {} is not divisible by the {} values of a word",
                                  g.packed_axis, s[g.packed_axis], g.values_per_word));
  return Status::Ok();
}

// The byte offsets: values, scales, the f32 global; a count or size beyond 64 bits is an error.
Status place(const Shape& s, QuantGeometry& g) {
  std::uint64_t n = 1, blocks = 1, scale_bytes = 0;
  bool overflow = false;
  for (std::uint64_t d : s) overflow = overflow || __builtin_mul_overflow(n, d, &n);
  for (std::uint64_t d : g.scales) overflow = overflow || __builtin_mul_overflow(blocks, d, &blocks);
  g.scales_offset = n / g.values_per_word * g.word_bytes;  // the packed axis divides n
  overflow = overflow || __builtin_mul_overflow(blocks, g.scale_bytes, &scale_bytes) ||
             __builtin_add_overflow(g.scales_offset, scale_bytes, &g.global_offset) ||
             __builtin_add_overflow(g.global_offset, 4, &g.total_bytes);
  if (overflow)
    return make_error(ErrorCode::Invalid, fmt::format("quant: the size of {} overflows 64 bits", shape_to_string(s)));
  return Status::Ok();
}
}  // namespace

Result<QuantGeometry> quant_geometry(const Shape& s, const QuantScheme& q) {
  KILN_RETURN_IF_ERROR(check_scheme_enums(q));
  QuantGeometry g;
  KILN_ASSIGN_OR_RETURN(g.scales, block_scales(s, q));
  g.scale_bytes = q.param == QuantParam::F32 ? 4 : 2;
  if (q.store != QuantStoreKind::Native) KILN_RETURN_IF_ERROR(pack(s, q, g));
  KILN_RETURN_IF_ERROR(place(s, g));
  return g;
}

}  // namespace shape
}  // namespace kiln::ir
