// Reference kernels of Quantize and Dequantize (docs/spec/ir.md §5.6): the only kernels that read or
// write QFloat tensors, through HostTensor's QuantLayout (the values as the scheme's store packs
// them, the block scales in the scheme's precision, the global scale as an f32). Symmetric
// quantization as Burn's: q = clamp(round(x / s), the value type's range), round half away from
// zero (Rust's f32::round) and NaN to 0; x = q · s; s = the element's block scale as stored times
// the global scale as stored, in f64.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "reference_internal.h"

namespace kiln::reference::kernels {
namespace {

// Where the elements of a QFloat tensor of one shape live.
struct Addressing {
  QuantLayout layout;
  int bits = 8;                              // of a value's field: 8 for the native store's bytes
  std::vector<std::uint64_t> word_strides;   // over the shape, the packed axis divided
  std::vector<std::uint64_t> block;          // the block dims right-aligned to the shape (1 where none)
  std::vector<std::uint64_t> block_strides;  // over the scales' shape; empty for a per-tensor scale
};

Result<Addressing> addressing_of(const Ctx& c, const ir::Shape& shape, const ir::QuantScheme& scheme) {
  Result<QuantLayout> l = quant_layout(shape, scheme);
  if (!l.ok()) return c.error(l.error().code, l.error().message);
  Addressing a;
  a.layout = std::move(l).value();
  const ir::shape::QuantGeometry& g = a.layout.geometry;
  if (scheme.store != ir::QuantStoreKind::Native) a.bits = ir::quant_value_bits(scheme.value);
  ir::Shape words = shape;
  if (g.values_per_word > 1) words[g.packed_axis] /= g.values_per_word;
  a.word_strides = strides_of(words);
  if (scheme.block_rank == 0) return a;
  a.block.assign(shape.size(), 1);
  for (std::size_t j = 0; j < scheme.block_rank; ++j) {
    const std::size_t from_back = scheme.block_rank - j;  // quant_geometry: leading extras are 1
    if (from_back <= shape.size()) a.block[shape.size() - from_back] = scheme.block[j];
  }
  a.block_strides = strides_of(g.scales);
  return a;
}

std::uint64_t block_of(const Addressing& a, const Index& idx) {
  std::uint64_t b = 0;
  for (std::size_t d = 0; d < a.block_strides.size(); ++d) b += idx[d] / a.block[d] * a.block_strides[d];
  return b;
}

// The byte offset of element idx's word and the bit offset of its field within the word.
std::pair<std::uint64_t, int> slot_of(const Addressing& a, const Index& idx) {
  const ir::shape::QuantGeometry& g = a.layout.geometry;
  std::uint64_t word = 0;
  int shift = 0;
  for (std::size_t d = 0; d < idx.size(); ++d) {
    std::uint64_t i = idx[d];
    if (g.values_per_word > 1 && d == g.packed_axis) {
      shift = static_cast<int>(i % g.values_per_word) * a.bits;
      i /= g.values_per_word;
    }
    word += i * a.word_strides[d];
  }
  return {word * a.layout.word_bytes, shift};
}

// Little-endian words of 1 or 4 bytes, whatever the host's order.
std::uint32_t read_word(const std::byte* p, std::uint64_t bytes) {
  std::uint32_t w = 0;
  for (std::uint64_t k = 0; k < bytes; ++k) w |= std::to_integer<std::uint32_t>(p[k]) << (8 * k);
  return w;
}

void write_word(std::byte* p, std::uint64_t bytes, std::uint32_t w) {
  for (std::uint64_t k = 0; k < bytes; ++k) p[k] = static_cast<std::byte>((w >> (8 * k)) & 0xFFu);
}

// A two's complement field of a.bits bits.
void store_value(std::byte* base, const Addressing& a, const Index& idx, std::int64_t q) {
  const auto [at, shift] = slot_of(a, idx);
  const std::uint32_t mask = (std::uint32_t{1} << a.bits) - 1;
  std::uint32_t w = read_word(base + at, a.layout.word_bytes);
  w = (w & ~(mask << shift)) | ((static_cast<std::uint32_t>(q) & mask) << shift);
  write_word(base + at, a.layout.word_bytes, w);
}

std::int64_t load_value(const std::byte* base, const Addressing& a, const Index& idx) {
  const auto [at, shift] = slot_of(a, idx);
  const std::uint32_t mask = (std::uint32_t{1} << a.bits) - 1;
  const std::uint32_t v = (read_word(base + at, a.layout.word_bytes) >> shift) & mask;
  const std::int64_t sign = std::int64_t{1} << (a.bits - 1);
  return (static_cast<std::int64_t>(v) ^ sign) - sign;  // sign-extends the field
}

// Stores the block scales in the scheme's precision and the global scale as an f32 into `out`, and
// returns the effective scales (block scale × global, as stored), each finite and positive (K:
// Burn divides by whatever it is given).
Result<std::vector<double>> write_scales(const Ctx& c, const QuantLayout& l, const HostTensor& scales,
                                         const HostTensor* global, const HostTensor& out) {
  std::byte* base = out.mutable_data();
  element::store_f64(base + l.global_offset, ir::dtypes::f32, 0, global != nullptr ? global->get_f64(0) : 1.0);
  const double g = element::load_f64(base + l.global_offset, ir::dtypes::f32, 0);
  std::vector<double> s(static_cast<std::size_t>(scales.num_elements()));
  for (std::size_t b = 0; b < s.size(); ++b) {
    element::store_f64(base + l.scales_offset, l.scale_dtype, b, scales.get_f64(b));
    s[b] = element::load_f64(base + l.scales_offset, l.scale_dtype, b) * g;
    if (!(std::isfinite(s[b]) && s[b] > 0))
      return c.error(ErrorCode::Invalid, fmt::format("scale {} of block {} times the global scale {} must be finite "
                                                     "and positive",
                                                     scales.get_f64(b), b, g));
  }
  return s;
}

// Quantize's operands: a float tensor, its scales of the scheme's block shape, a float [1] global.
Status check_quantize_operands(const Ctx& c, const Addressing& a) {
  const HostTensor &x = c.in[0], &scales = c.in[1];
  if (!x.dtype().is_float())
    return c.error(ErrorCode::DTypeMismatch, fmt::format("tensor {} must have a float dtype", x.to_string()));
  if (!scales.dtype().is_float() || scales.shape() != a.layout.geometry.scales)
    return c.error(ErrorCode::IncompatibleShapes, fmt::format("scales {} must be a float {}", scales.to_string(),
                                                              ir::shape_to_string(a.layout.geometry.scales)));
  if (c.in.size() > 2 && (!c.in[2].dtype().is_float() || c.in[2].shape() != ir::Shape{1}))
    return c.error(ErrorCode::IncompatibleShapes, fmt::format("global {} must be a float [1]", c.in[2].to_string()));
  return Status::Ok();
}

}  // namespace

// Quantize{tensor, scales, global?} → QFloat(scheme) of the tensor's shape.
Result<Outputs> run_quantize(const Ctx& c) {
  const HostTensor& x = c.in[0];
  const ir::TensorIr& o = c.out_ir();
  if (!o.dtype.is_quantized())
    return c.error(ErrorCode::DTypeMismatch, fmt::format("output {} must have a QFloat dtype", o.to_string()));
  KILN_RETURN_IF_ERROR(expect_out_shape(c, 0, x.shape()));
  const ir::QuantScheme& scheme = o.dtype.scheme();
  KILN_ASSIGN_OR_RETURN(Addressing a, addressing_of(c, x.shape(), scheme));
  KILN_RETURN_IF_ERROR(check_quantize_operands(c, a));
  KILN_ASSIGN_OR_RETURN(HostTensor out, c.new_output());
  if (a.layout.scales_offset != 0) std::memset(out.mutable_data(), 0, static_cast<std::size_t>(a.layout.scales_offset));
  KILN_ASSIGN_OR_RETURN(std::vector<double> s,
                        write_scales(c, a.layout, c.in[1], c.in.size() > 2 ? &c.in[2] : nullptr, out));
  const auto [lo, hi] = ir::quant_value_range(scheme.value);
  Index idx;
  for (std::uint64_t i = 0; i < x.num_elements(); ++i) {
    unravel(i, x.shape(), idx);
    const double v = std::round(x.get_f64(i) / s[static_cast<std::size_t>(block_of(a, idx))]);
    const double q = std::isnan(v) ? 0.0 : std::clamp(v, static_cast<double>(lo), static_cast<double>(hi));
    store_value(out.mutable_data(), a, idx, static_cast<std::int64_t>(q));
  }
  return single(std::move(out));
}

// Dequantize{input (QFloat)} → a float tensor of its shape: q · s per element.
Result<Outputs> run_dequantize(const Ctx& c) {
  const HostTensor& q = c.in[0];
  if (!q.dtype().is_quantized())
    return c.error(ErrorCode::DTypeMismatch, fmt::format("input {} must be quantized", q.to_string()));
  if (!c.out_ir().dtype.is_float())
    return c.error(ErrorCode::DTypeMismatch, fmt::format("output {} must have a float dtype", c.out_ir().to_string()));
  KILN_RETURN_IF_ERROR(expect_out_shape(c, 0, q.shape()));
  KILN_ASSIGN_OR_RETURN(Addressing a, addressing_of(c, q.shape(), q.dtype().scheme()));
  KILN_ASSIGN_OR_RETURN(HostTensor out, c.new_output());
  const std::byte* base = q.data();
  const QuantLayout& l = a.layout;
  const double g = element::load_f64(base + l.global_offset, ir::dtypes::f32, 0);
  Index idx;
  for (std::uint64_t i = 0; i < q.num_elements(); ++i) {
    unravel(i, q.shape(), idx);
    const double s = element::load_f64(base + l.scales_offset, l.scale_dtype, block_of(a, idx)) * g;
    element::store_f64(out.mutable_data(), out.dtype(), i, static_cast<double>(load_value(base, a, idx)) * s);
  }
  return single(std::move(out));
}

}  // namespace kiln::reference::kernels
