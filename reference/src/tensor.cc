#include "kiln/reference/tensor.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>

namespace kiln::reference {
namespace {

using ir::DType;
using ir::DTypeKind;

// ---- f16 / bf16

// A binary floating-point format narrower than f64: p significand bits (with the implicit one),
// exponent bias, smallest normal exponent, exponent field width.
struct NarrowFormat {
  int p;
  int bias;
  int emin;
  int exp_bits;
};
constexpr NarrowFormat kF16{11, 15, -14, 5};
constexpr NarrowFormat kBF16{8, 127, -126, 8};

// Rounds the f64 value once to the format, to nearest with ties to even.
std::uint16_t narrow(double v, const NarrowFormat& f) {
  const auto bits = std::bit_cast<std::uint64_t>(v);
  const auto sign = static_cast<std::uint16_t>((bits >> 63) << 15);
  const int e = static_cast<int>((bits >> 52) & 0x7FF);
  const std::uint64_t frac = bits & ((std::uint64_t{1} << 52) - 1);
  const int mant_bits = f.p - 1;
  const auto exp_all = static_cast<std::uint16_t>(((1u << f.exp_bits) - 1) << mant_bits);
  if (e == 0x7FF) {
    if (frac != 0) return static_cast<std::uint16_t>(sign | exp_all | (1u << (mant_bits - 1)));  // quiet NaN
    return static_cast<std::uint16_t>(sign | exp_all);                                           // infinity
  }
  if (e == 0 && frac == 0) return sign;  // signed zero
  // |v| = M * 2^E exactly.
  const std::uint64_t M = e == 0 ? frac : (frac | (std::uint64_t{1} << 52));
  const int E = e == 0 ? -1074 : e - 1075;
  const int k = std::bit_width(M) - 1 + E;                            // floor(log2 |v|)
  if (k > f.bias) return static_cast<std::uint16_t>(sign | exp_all);  // beyond the largest binade: infinity
  // The target's unit in the last place is 2^q; the result is round(|v| / 2^q) * 2^q.
  int q = std::max(k, f.emin) - mant_bits;
  const int shift = q - E;  // > 0 here: the target is narrower than f64 in every binade it covers
  assert(shift > 0);
  std::uint64_t m = 0;
  if (shift < 64) {
    m = M >> shift;
    const std::uint64_t rem = M & ((std::uint64_t{1} << shift) - 1);
    const std::uint64_t half = std::uint64_t{1} << (shift - 1);
    if (rem > half || (rem == half && (m & 1) != 0)) ++m;
  }  // else M < 2^53 <= 2^(shift-1): below half an ulp, rounds to zero
  if (m == 0) return sign;
  if (m == (std::uint64_t{1} << f.p)) {  // rounding carried into the next binade
    m >>= 1;
    ++q;
  }
  if (m < (std::uint64_t{1} << mant_bits)) return static_cast<std::uint16_t>(sign | m);  // subnormal
  const int biased = q + mant_bits + f.bias;
  if (biased >= (1 << f.exp_bits) - 1) return static_cast<std::uint16_t>(sign | exp_all);  // rounded to overflow
  return static_cast<std::uint16_t>(sign | (static_cast<std::uint64_t>(biased) << mant_bits) |
                                    (m - (std::uint64_t{1} << mant_bits)));
}

// An integer magnitude as f64, rounded to odd when it needs more than 53 bits: a later rounding
// to a format of at most 51 bits (f32, f16, bf16) is then the correct rounding of the integer
// (no double rounding).
double magnitude_round_odd(std::uint64_t m) {
  const int bw = std::bit_width(m);
  if (bw <= 53) return static_cast<double>(m);
  const int s = bw - 53;
  std::uint64_t top = m >> s;
  if ((m & ((std::uint64_t{1} << s) - 1)) != 0) top |= 1;
  return std::ldexp(static_cast<double>(top), s);
}
double i64_round_odd(std::int64_t v) {
  const std::uint64_t mag = v < 0 ? std::uint64_t{0} - static_cast<std::uint64_t>(v) : static_cast<std::uint64_t>(v);
  const double d = magnitude_round_odd(mag);
  return v < 0 ? -d : d;
}

// Float to integer, Rust `as` style: truncate toward zero, saturate, NaN -> 0.
template <class T>
T saturating_cast(double v) {
  if (std::isnan(v)) return 0;
  // Both bounds are powers of two (or zero), exactly representable in f64.
  constexpr double lo = static_cast<double>(std::numeric_limits<T>::min());
  constexpr int digits = std::numeric_limits<T>::digits;  // value bits: 63 for i64, 64 for u64
  constexpr double hi_excl = 2.0 * static_cast<double>(std::uint64_t{1} << (digits - 1));  // max + 1
  if (v <= lo) return std::numeric_limits<T>::min();
  if (v >= hi_excl) return std::numeric_limits<T>::max();
  return static_cast<T>(std::trunc(v));
}

template <class T>
T read(const std::byte* base, std::uint64_t i) {
  T v;
  std::memcpy(&v, base + i * sizeof(T), sizeof(T));
  return v;
}
template <class T>
void write(std::byte* base, std::uint64_t i, T v) {
  std::memcpy(base + i * sizeof(T), &v, sizeof(T));
}

bool read_bool(const std::byte* base, DType d, std::uint64_t i) {
  if (d.bool_store() == ir::BoolStore::U32) return read<std::uint32_t>(base, i) != 0;
  return read<std::uint8_t>(base, i) != 0;
}
void write_bool(std::byte* base, DType d, std::uint64_t i, bool v) {
  if (d.bool_store() == ir::BoolStore::U32) {
    write<std::uint32_t>(base, i, v ? 1u : 0u);
  } else {
    write<std::uint8_t>(base, i, v ? 1 : 0);
  }
}

}  // namespace

std::uint16_t f16_from_f64(double v) { return narrow(v, kF16); }
std::uint16_t f16_from_f32(float v) { return narrow(static_cast<double>(v), kF16); }
std::uint16_t bf16_from_f64(double v) { return narrow(v, kBF16); }
std::uint16_t bf16_from_f32(float v) { return narrow(static_cast<double>(v), kBF16); }

double f16_to_f64(std::uint16_t bits) {
  const bool neg = (bits & 0x8000) != 0;
  const int exp = (bits >> 10) & 0x1F;
  const int mant = bits & 0x3FF;
  double mag;
  if (exp == 0x1F) {
    mag = mant != 0 ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else if (exp == 0) {
    mag = std::ldexp(static_cast<double>(mant), -24);  // subnormal: mant * 2^-24
  } else {
    mag = std::ldexp(static_cast<double>(1024 + mant), exp - 25);  // (1.mant) * 2^(exp-15)
  }
  return neg ? -mag : mag;
}
float f16_to_f32(std::uint16_t bits) { return static_cast<float>(f16_to_f64(bits)); }  // exact

float bf16_to_f32(std::uint16_t bits) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);  // bf16 is the top half of an f32
}
double bf16_to_f64(std::uint16_t bits) { return static_cast<double>(bf16_to_f32(bits)); }

// ---- Element codec

namespace element {

double load_f64(const std::byte* base, DType d, std::uint64_t i) {
  switch (d.kind()) {
    case DTypeKind::F64: return read<double>(base, i);
    case DTypeKind::F32:
    case DTypeKind::Flex32: return static_cast<double>(read<float>(base, i));
    case DTypeKind::F16: return f16_to_f64(read<std::uint16_t>(base, i));
    case DTypeKind::BF16: return bf16_to_f64(read<std::uint16_t>(base, i));
    case DTypeKind::I64: return static_cast<double>(read<std::int64_t>(base, i));
    case DTypeKind::I32: return static_cast<double>(read<std::int32_t>(base, i));
    case DTypeKind::I16: return static_cast<double>(read<std::int16_t>(base, i));
    case DTypeKind::I8: return static_cast<double>(read<std::int8_t>(base, i));
    case DTypeKind::U64: return static_cast<double>(read<std::uint64_t>(base, i));
    case DTypeKind::U32: return static_cast<double>(read<std::uint32_t>(base, i));
    case DTypeKind::U16: return static_cast<double>(read<std::uint16_t>(base, i));
    case DTypeKind::U8: return static_cast<double>(read<std::uint8_t>(base, i));
    case DTypeKind::Bool: return read_bool(base, d, i) ? 1.0 : 0.0;
    case DTypeKind::QFloat: break;
  }
  assert(false && "element::load_f64: QFloat has no element codec");
  return 0;
}

std::int64_t load_i64(const std::byte* base, DType d, std::uint64_t i) {
  switch (d.kind()) {
    case DTypeKind::I64: return read<std::int64_t>(base, i);
    case DTypeKind::I32: return read<std::int32_t>(base, i);
    case DTypeKind::I16: return read<std::int16_t>(base, i);
    case DTypeKind::I8: return read<std::int8_t>(base, i);
    case DTypeKind::U64: return static_cast<std::int64_t>(read<std::uint64_t>(base, i));  // wraps
    case DTypeKind::U32: return read<std::uint32_t>(base, i);
    case DTypeKind::U16: return read<std::uint16_t>(base, i);
    case DTypeKind::U8: return read<std::uint8_t>(base, i);
    case DTypeKind::Bool: return read_bool(base, d, i) ? 1 : 0;
    case DTypeKind::QFloat: assert(false && "element::load_i64: QFloat has no element codec"); return 0;
    default: return saturating_cast<std::int64_t>(load_f64(base, d, i));
  }
}

std::uint64_t load_u64(const std::byte* base, DType d, std::uint64_t i) {
  switch (d.kind()) {
    case DTypeKind::U64: return read<std::uint64_t>(base, i);
    case DTypeKind::U32: return read<std::uint32_t>(base, i);
    case DTypeKind::U16: return read<std::uint16_t>(base, i);
    case DTypeKind::U8: return read<std::uint8_t>(base, i);
    case DTypeKind::I64:
    case DTypeKind::I32:
    case DTypeKind::I16:
    case DTypeKind::I8: return static_cast<std::uint64_t>(load_i64(base, d, i));  // sign-extends, wraps
    case DTypeKind::Bool: return read_bool(base, d, i) ? 1 : 0;
    case DTypeKind::QFloat: assert(false && "element::load_u64: QFloat has no element codec"); return 0;
    default: return saturating_cast<std::uint64_t>(load_f64(base, d, i));
  }
}

bool load_bool(const std::byte* base, DType d, std::uint64_t i) {
  switch (d.kind()) {
    case DTypeKind::Bool: return read_bool(base, d, i);
    case DTypeKind::I64:
    case DTypeKind::I32:
    case DTypeKind::I16:
    case DTypeKind::I8:
    case DTypeKind::U64:
    case DTypeKind::U32:
    case DTypeKind::U16:
    case DTypeKind::U8: return load_u64(base, d, i) != 0;
    case DTypeKind::QFloat: assert(false && "element::load_bool: QFloat has no element codec"); return false;
    default: return load_f64(base, d, i) != 0;  // NaN != 0: true
  }
}

void store_f64(std::byte* base, DType d, std::uint64_t i, double v) {
  switch (d.kind()) {
    case DTypeKind::F64: write<double>(base, i, v); return;
    case DTypeKind::F32:
    case DTypeKind::Flex32: write<float>(base, i, static_cast<float>(v)); return;  // IEEE: nearest even
    case DTypeKind::F16: write<std::uint16_t>(base, i, f16_from_f64(v)); return;
    case DTypeKind::BF16: write<std::uint16_t>(base, i, bf16_from_f64(v)); return;
    case DTypeKind::I64: write(base, i, saturating_cast<std::int64_t>(v)); return;
    case DTypeKind::I32: write(base, i, saturating_cast<std::int32_t>(v)); return;
    case DTypeKind::I16: write(base, i, saturating_cast<std::int16_t>(v)); return;
    case DTypeKind::I8: write(base, i, saturating_cast<std::int8_t>(v)); return;
    case DTypeKind::U64: write(base, i, saturating_cast<std::uint64_t>(v)); return;
    case DTypeKind::U32: write(base, i, saturating_cast<std::uint32_t>(v)); return;
    case DTypeKind::U16: write(base, i, saturating_cast<std::uint16_t>(v)); return;
    case DTypeKind::U8: write(base, i, saturating_cast<std::uint8_t>(v)); return;
    case DTypeKind::Bool: write_bool(base, d, i, v != 0); return;
    case DTypeKind::QFloat: break;
  }
  assert(false && "element::store_f64: QFloat has no element codec");
}

void store_i64(std::byte* base, DType d, std::uint64_t i, std::int64_t v) {
  switch (d.kind()) {
    case DTypeKind::F64: write<double>(base, i, static_cast<double>(v)); return;  // correctly rounded
    case DTypeKind::F32:
    case DTypeKind::Flex32: write<float>(base, i, static_cast<float>(v)); return;  // correctly rounded
    case DTypeKind::F16: write<std::uint16_t>(base, i, f16_from_f64(i64_round_odd(v))); return;
    case DTypeKind::BF16: write<std::uint16_t>(base, i, bf16_from_f64(i64_round_odd(v))); return;
    // Integer to integer: two's complement wrap (C++20 defines these conversions as modular).
    case DTypeKind::I64: write(base, i, v); return;
    case DTypeKind::I32: write(base, i, static_cast<std::int32_t>(v)); return;
    case DTypeKind::I16: write(base, i, static_cast<std::int16_t>(v)); return;
    case DTypeKind::I8: write(base, i, static_cast<std::int8_t>(v)); return;
    case DTypeKind::U64: write(base, i, static_cast<std::uint64_t>(v)); return;
    case DTypeKind::U32: write(base, i, static_cast<std::uint32_t>(v)); return;
    case DTypeKind::U16: write(base, i, static_cast<std::uint16_t>(v)); return;
    case DTypeKind::U8: write(base, i, static_cast<std::uint8_t>(v)); return;
    case DTypeKind::Bool: write_bool(base, d, i, v != 0); return;
    case DTypeKind::QFloat: break;
  }
  assert(false && "element::store_i64: QFloat has no element codec");
}

void store_u64(std::byte* base, DType d, std::uint64_t i, std::uint64_t v) {
  switch (d.kind()) {
    case DTypeKind::F64: write<double>(base, i, static_cast<double>(v)); return;
    case DTypeKind::F32:
    case DTypeKind::Flex32: write<float>(base, i, static_cast<float>(v)); return;
    case DTypeKind::F16: write<std::uint16_t>(base, i, f16_from_f64(magnitude_round_odd(v))); return;
    case DTypeKind::BF16: write<std::uint16_t>(base, i, bf16_from_f64(magnitude_round_odd(v))); return;
    case DTypeKind::Bool: write_bool(base, d, i, v != 0); return;
    case DTypeKind::QFloat: assert(false && "element::store_u64: QFloat has no element codec"); return;
    default: store_i64(base, d, i, static_cast<std::int64_t>(v)); return;  // integers: same bits, wrapped
  }
}

void store_bool(std::byte* base, DType d, std::uint64_t i, bool v) {
  if (d.is_bool()) {
    write_bool(base, d, i, v);
  } else if (d.is_float()) {
    store_f64(base, d, i, v ? 1.0 : 0.0);
  } else {
    store_i64(base, d, i, v ? 1 : 0);
  }
}

}  // namespace element

// ---- HostTensor

Result<std::uint64_t> checked_num_elements(const ir::Shape& shape, std::uint64_t elem_bytes) {
  std::uint64_t n = 1;
  for (std::uint64_t d : shape) {
    if (__builtin_mul_overflow(n, d, &n))
      return make_error(ErrorCode::Invalid,
                        fmt::format("shape {}: element count overflows 64 bits", ir::shape_to_string(shape)));
  }
  std::uint64_t bytes = 0;
  if (__builtin_mul_overflow(n, elem_bytes, &bytes))
    return make_error(ErrorCode::Invalid,
                      fmt::format("shape {}: byte size overflows 64 bits", ir::shape_to_string(shape)));
  return n;
}

bool HostTensor::stores(DType d, std::size_t size, Storage kind) {
  switch (kind) {
    case Storage::Bool: return d.is_bool();
    case Storage::Float:
      return (d.kind() == DTypeKind::F64 && size == 8) ||
             ((d.kind() == DTypeKind::F32 || d.kind() == DTypeKind::Flex32) && size == 4);
    case Storage::Signed: return d.is_int() && d.size_bytes() == size;
    case Storage::Unsigned:
      return (d.is_uint() && d.size_bytes() == size) ||
             ((d.kind() == DTypeKind::F16 || d.kind() == DTypeKind::BF16) && size == 2) ||
             (d.is_bool() && d.size_bytes() == size);
  }
  return false;
}

Result<QuantLayout> quant_layout(const ir::Shape& shape, const ir::QuantScheme& scheme) {
  auto wrap_error = [&](const Error& e) {
    return make_error(e.code, fmt::format("HostTensor: qfloat({}) of shape {}: {}", scheme.to_string(),
                                          ir::shape_to_string(shape), e.message));
  };
  Result<ir::shape::QuantGeometry> g = ir::shape::quant_geometry(shape, scheme);
  if (!g.ok()) return wrap_error(g.error());
  QuantLayout l;
  l.geometry = std::move(g).value();
  l.scale_dtype = scheme.param == ir::QuantParam::F16    ? ir::dtypes::f16
                  : scheme.param == ir::QuantParam::BF16 ? ir::dtypes::bf16
                                                         : ir::dtypes::f32;
  l.word_bytes = l.geometry.word_bytes;
  l.scales_offset = l.geometry.scales_offset;
  l.global_offset = l.geometry.global_offset;
  l.total_bytes = l.geometry.total_bytes;
  return l;
}

Result<std::pair<std::uint64_t, std::uint64_t>> HostTensor::storage_of(const ir::Shape& shape, DType dtype) {
  if (dtype.is_quantized()) {
    KILN_ASSIGN_OR_RETURN(QuantLayout l, quant_layout(shape, dtype.scheme()));
    KILN_ASSIGN_OR_RETURN(std::uint64_t n, checked_num_elements(shape));
    return std::make_pair(n, l.total_bytes);
  }
  KILN_ASSIGN_OR_RETURN(std::uint64_t n, checked_num_elements(shape, dtype.size_bytes()));
  return std::make_pair(n, n * dtype.size_bytes());
}

Result<HostTensor> HostTensor::wrap(std::shared_ptr<HostBuffer> buffer, ir::Shape shape, DType dtype) {
  if (!buffer) return make_error(ErrorCode::Invalid, "HostTensor: null buffer");
  KILN_ASSIGN_OR_RETURN(auto storage, storage_of(shape, dtype));
  const std::uint64_t need = storage.second;
  if (buffer->size() < need)
    return make_error(ErrorCode::Invalid, fmt::format("HostTensor: a {} tensor of shape {} needs {} bytes, the buffer "
                                                      "holds {}",
                                                      dtype.name(), ir::shape_to_string(shape), need, buffer->size()));
  return HostTensor(std::move(buffer), std::move(shape), dtype, storage.first, need);
}

Result<HostTensor> HostTensor::allocate(HostAllocator& alloc, ir::Shape shape, DType dtype) {
  KILN_ASSIGN_OR_RETURN(auto storage, storage_of(shape, dtype));
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<HostBuffer> buffer, alloc.allocate_shared(storage.second));
  return HostTensor(std::move(buffer), std::move(shape), dtype, storage.first, storage.second);
}

Result<HostTensor> HostTensor::zeros(HostAllocator& alloc, ir::Shape shape, DType dtype) {
  KILN_ASSIGN_OR_RETURN(HostTensor t, allocate(alloc, std::move(shape), dtype));
  if (t.size_bytes() != 0) std::memset(t.mutable_data(), 0, static_cast<std::size_t>(t.size_bytes()));
  return t;
}

Result<HostTensor> HostTensor::from_bytes(HostAllocator& alloc, ir::Shape shape, DType dtype,
                                          std::span<const std::byte> bytes) {
  KILN_ASSIGN_OR_RETURN(HostTensor t, allocate(alloc, std::move(shape), dtype));
  if (bytes.size() != t.size_bytes())
    return make_error(ErrorCode::Invalid, fmt::format("HostTensor::from_bytes: {} needs {} bytes, got {}",
                                                      t.to_string(), t.size_bytes(), bytes.size()));
  if (!bytes.empty()) std::memcpy(t.mutable_data(), bytes.data(), bytes.size());
  return t;
}

namespace {
template <class T, class Store>
Result<HostTensor> from_converted(HostAllocator& alloc, ir::Shape shape, DType dtype, std::uint64_t count,
                                  const char* what, Store store) {
  if (dtype.is_quantized())  // no element codec: only Quantize writes one
    return make_error(ErrorCode::Unsupported,
                      fmt::format("HostTensor::{}: {} values are made by a Quantize op", what, dtype.name()));
  KILN_ASSIGN_OR_RETURN(HostTensor t, HostTensor::allocate(alloc, std::move(shape), dtype));
  if (count != t.num_elements())
    return make_error(ErrorCode::Invalid, fmt::format("HostTensor::{}: {} has {} elements, got {} values", what,
                                                      t.to_string(), t.num_elements(), count));
  for (std::uint64_t i = 0; i < count; ++i) store(t.mutable_data(), i);
  return t;
}
}  // namespace

Result<HostTensor> HostTensor::from_f64(HostAllocator& alloc, ir::Shape shape, DType dtype,
                                        std::span<const double> values) {
  return from_converted<double>(
      alloc, std::move(shape), dtype, values.size(), "from_f64",
      [&](std::byte* base, std::uint64_t i) { element::store_f64(base, dtype, i, values[i]); });
}

Result<HostTensor> HostTensor::from_i64(HostAllocator& alloc, ir::Shape shape, DType dtype,
                                        std::span<const std::int64_t> values) {
  return from_converted<std::int64_t>(
      alloc, std::move(shape), dtype, values.size(), "from_i64",
      [&](std::byte* base, std::uint64_t i) { element::store_i64(base, dtype, i, values[i]); });
}

Result<HostTensor> HostTensor::from_u64(HostAllocator& alloc, ir::Shape shape, DType dtype,
                                        std::span<const std::uint64_t> values) {
  return from_converted<std::uint64_t>(
      alloc, std::move(shape), dtype, values.size(), "from_u64",
      [&](std::byte* base, std::uint64_t i) { element::store_u64(base, dtype, i, values[i]); });
}

Result<HostTensor> HostTensor::from_bool(HostAllocator& alloc, ir::Shape shape, DType dtype,
                                         const std::vector<bool>& values) {
  return from_converted<bool>(alloc, std::move(shape), dtype, values.size(), "from_bool",
                              [&](std::byte* base, std::uint64_t i) {
                                element::store_bool(base, dtype, i, values[static_cast<std::size_t>(i)]);
                              });
}

std::vector<double> HostTensor::to_f64() const {
  std::vector<double> out(static_cast<std::size_t>(num_elements_));
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = get_f64(i);
  return out;
}
std::vector<std::int64_t> HostTensor::to_i64() const {
  std::vector<std::int64_t> out(static_cast<std::size_t>(num_elements_));
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = get_i64(i);
  return out;
}
std::vector<std::uint64_t> HostTensor::to_u64() const {
  std::vector<std::uint64_t> out(static_cast<std::size_t>(num_elements_));
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = get_u64(i);
  return out;
}
std::vector<bool> HostTensor::to_bool() const {
  std::vector<bool> out(static_cast<std::size_t>(num_elements_));
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = get_bool(i);
  return out;
}

std::string HostTensor::to_string() const { return dtype_.name() + ir::shape_to_string(shape_); }

}  // namespace kiln::reference
