// HostTensor: a CPU device tensor (a shared buffer, a shape and a dtype, contiguous row-major),
// with the element codec every CPU kernel uses (load/store any dtype as f64, i64, u64 or bool)
// and exact f16/bf16 conversions.
//
// Thread-safety: a HostTensor is a value (a shared_ptr to its buffer plus metadata); copies alias
// one buffer. Buffers are written only by the kernel that produces them, before the tensor is
// registered as a handle; once shared, a buffer is read-only, so any number of threads (streams)
// may read one concurrently.
//
// Usage:
//   HostAllocator alloc;
//   auto t = HostTensor::from_f64(alloc, {2, 2}, dtypes::bf16, std::vector<double>{1, 2.5, -0.1, 3});
//   t->to_f64();                  // {1, 2.5, -0.10009765625, 3}: rounded to bf16 on the way in
//   auto u = HostTensor::from_values<std::int32_t>(alloc, {3}, std::vector<std::int32_t>{1, 2, 3});
//   u->to_values<std::int32_t>(); // {1, 2, 3}
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/base/result.h"
#include "kiln/ir/dtype.h"
#include "kiln/ir/shape.h"
#include "kiln/reference/memory.h"

namespace kiln::reference {

// ---- f16 / bf16 (IEEE binary16 and bfloat16 bit patterns)
//
// Widening (to f32 / f64) is exact, subnormals included. Narrowing rounds once, to nearest with
// ties to even, from the full f64 value (never through f32 first, which could round twice);
// overflow gives infinity, underflow gives subnormals or a signed zero, and NaN stays a quiet
// NaN with its sign.
std::uint16_t f16_from_f64(double v);
std::uint16_t f16_from_f32(float v);
double f16_to_f64(std::uint16_t bits);
float f16_to_f32(std::uint16_t bits);
std::uint16_t bf16_from_f64(double v);
std::uint16_t bf16_from_f32(float v);
double bf16_to_f64(std::uint16_t bits);
float bf16_to_f32(std::uint16_t bits);

// ---- Element codec: element i of a buffer holding `dtype` elements, read or written through
// one of four compute domains. Preconditions: the dtype is not QFloat (callers reject it) and i
// is within the buffer. The conversions are those of a cast (and of Rust's `as`):
//   to a float dtype     rounded to nearest even, once (integers beyond 2^53 included)
//   float -> integer     truncated toward zero, saturated to the target's range, NaN -> 0
//   integer -> integer   two's complement wrap to the target width
//   bool -> number       0 / 1;  number -> bool: != 0 (NaN is true)
// Flex32 is stored as f32; bool is stored by its store (Native and U8: one byte, U32: four).
namespace element {
double load_f64(const std::byte* base, ir::DType dtype, std::uint64_t i);
std::int64_t load_i64(const std::byte* base, ir::DType dtype, std::uint64_t i);
std::uint64_t load_u64(const std::byte* base, ir::DType dtype, std::uint64_t i);
bool load_bool(const std::byte* base, ir::DType dtype, std::uint64_t i);
void store_f64(std::byte* base, ir::DType dtype, std::uint64_t i, double v);
void store_i64(std::byte* base, ir::DType dtype, std::uint64_t i, std::int64_t v);
void store_u64(std::byte* base, ir::DType dtype, std::uint64_t i, std::uint64_t v);
void store_bool(std::byte* base, ir::DType dtype, std::uint64_t i, bool v);
}  // namespace element

// The dtype whose storage is the C++ type T (float -> f32, std::int8_t -> i8, bool -> bool).
template <class T>
constexpr ir::DType native_dtype() {
  using ir::DTypeKind;
  if constexpr (std::is_same_v<T, double>)
    return ir::DType(DTypeKind::F64);
  else if constexpr (std::is_same_v<T, float>)
    return ir::DType(DTypeKind::F32);
  else if constexpr (std::is_same_v<T, std::int64_t>)
    return ir::DType(DTypeKind::I64);
  else if constexpr (std::is_same_v<T, std::int32_t>)
    return ir::DType(DTypeKind::I32);
  else if constexpr (std::is_same_v<T, std::int16_t>)
    return ir::DType(DTypeKind::I16);
  else if constexpr (std::is_same_v<T, std::int8_t>)
    return ir::DType(DTypeKind::I8);
  else if constexpr (std::is_same_v<T, std::uint64_t>)
    return ir::DType(DTypeKind::U64);
  else if constexpr (std::is_same_v<T, std::uint32_t>)
    return ir::DType(DTypeKind::U32);
  else if constexpr (std::is_same_v<T, std::uint16_t>)
    return ir::DType(DTypeKind::U16);
  else if constexpr (std::is_same_v<T, std::uint8_t>)
    return ir::DType(DTypeKind::U8);
  else if constexpr (std::is_same_v<T, bool>)
    return ir::DType::boolean();
  else
    static_assert(sizeof(T) == 0, "no dtype is stored as this type");
}

// ---- QFloat storage on the CPU device (docs/decisions.md). A QFloat tensor holds its quantized
// values as the scheme's store lays them out (ir::shape::quant_geometry) — Native: one signed byte
// per value, row-major; PackedU32 / PackedNative: values_per_word two's complement fields per
// little-endian u32 / byte word, consecutive along the packed axis, the words row-major over the
// shape with that axis divided — then one scale per block in the scheme's precision (f32, f16,
// bf16; the scales row-major), then the global scale as an f32 (1 when Quantize had none). It has
// no element codec: only the Quantize and Dequantize kernels read or write one, and the reference
// executor refuses quantized tensors for every other kind.
struct QuantLayout {
  ir::shape::QuantGeometry geometry;  // the sizes and offsets below come from it
  ir::DType scale_dtype;              // f32, f16 or bf16
  std::uint64_t word_bytes = 1;       // 4 for PackedU32
  std::uint64_t scales_offset = 0;    // the values' bytes
  std::uint64_t global_offset = 0;
  std::uint64_t total_bytes = 0;
};
Result<QuantLayout> quant_layout(const ir::Shape& shape, const ir::QuantScheme& scheme);

class HostTensor {
 public:
  // Wraps an existing buffer. Errors: null buffer, element count overflow, a QFloat scheme that
  // does not fit the shape, or a buffer smaller than the shape needs.
  static Result<HostTensor> wrap(std::shared_ptr<HostBuffer> buffer, ir::Shape shape, ir::DType dtype);
  // A new tensor; contents unspecified (a pooled block).
  static Result<HostTensor> allocate(HostAllocator& alloc, ir::Shape shape, ir::DType dtype);
  // A new tensor with every byte zero (0, +0.0, false).
  static Result<HostTensor> zeros(HostAllocator& alloc, ir::Shape shape, ir::DType dtype);
  // A copy of raw bytes laid out as the dtype stores them; the byte count must match exactly.
  static Result<HostTensor> from_bytes(HostAllocator& alloc, ir::Shape shape, ir::DType dtype,
                                       std::span<const std::byte> bytes);
  // Typed host data stored as native_dtype<T>(), or as `dtype` whose storage must be T (see
  // to_values: f16 bits as std::uint16_t, ...). The count must match.
  template <class T>
  static Result<HostTensor> from_values(HostAllocator& alloc, ir::Shape shape, std::span<const T> values);
  template <class T>
  static Result<HostTensor> from_values(HostAllocator& alloc, ir::Shape shape, ir::DType dtype,
                                        std::span<const T> values);
  // Host values converted element by element with the codec above; the count must match.
  static Result<HostTensor> from_f64(HostAllocator& alloc, ir::Shape shape, ir::DType dtype,
                                     std::span<const double> values);
  static Result<HostTensor> from_i64(HostAllocator& alloc, ir::Shape shape, ir::DType dtype,
                                     std::span<const std::int64_t> values);
  static Result<HostTensor> from_u64(HostAllocator& alloc, ir::Shape shape, ir::DType dtype,
                                     std::span<const std::uint64_t> values);
  static Result<HostTensor> from_bool(HostAllocator& alloc, ir::Shape shape, ir::DType dtype,
                                      const std::vector<bool>& values);

  const ir::Shape& shape() const { return shape_; }
  ir::DType dtype() const { return dtype_; }
  std::uint64_t num_elements() const { return num_elements_; }
  // Elements × their size; a QFloat tensor's whole QuantLayout.
  std::uint64_t size_bytes() const { return size_bytes_; }

  const std::byte* data() const { return buffer_->data(); }
  // Only for the kernel producing this tensor, before it is shared (see the header comment).
  std::byte* mutable_data() const { return buffer_->data(); }
  std::span<const std::byte> bytes() const { return {data(), static_cast<std::size_t>(size_bytes())}; }
  const std::shared_ptr<HostBuffer>& buffer() const { return buffer_; }
  bool shares_buffer_with(const HostTensor& other) const { return buffer_ == other.buffer_; }
  // Whether exactly `owners` handles hold this buffer (this one among them), so that a consumer
  // may write it in place. The acquire fence orders every write and read done through a handle
  // released meanwhile (on any thread; the release decrement pairs with it) before the caller's
  // writes. ThreadSanitizer does not model fences (GCC refuses them under -fsanitize=thread):
  // there the check is the count alone, as it was before the fence.
  bool buffer_owned_by_only(long owners) const {
    if (buffer_.use_count() != owners) return false;
#if !defined(__SANITIZE_THREAD__)
    std::atomic_thread_fence(std::memory_order_acquire);
#endif
    return true;
  }

  // One element through the codec.
  double get_f64(std::uint64_t i) const { return element::load_f64(data(), dtype_, i); }
  std::int64_t get_i64(std::uint64_t i) const { return element::load_i64(data(), dtype_, i); }
  std::uint64_t get_u64(std::uint64_t i) const { return element::load_u64(data(), dtype_, i); }
  bool get_bool(std::uint64_t i) const { return element::load_bool(data(), dtype_, i); }

  // Every element through the codec.
  std::vector<double> to_f64() const;
  std::vector<std::int64_t> to_i64() const;
  std::vector<std::uint64_t> to_u64() const;
  std::vector<bool> to_bool() const;
  // The raw elements; T must be the dtype's storage type (f16/bf16: std::uint16_t bits,
  // flex32: float, bool(Native/U8): std::uint8_t, bool(U32): std::uint32_t; bool reads any bool
  // store), else an empty vector.
  template <class T>
  std::vector<T> to_values() const;

  // "f32[2,3]".
  std::string to_string() const;

 private:
  HostTensor(std::shared_ptr<HostBuffer> buffer, ir::Shape shape, ir::DType dtype, std::uint64_t n, std::uint64_t bytes)
      : buffer_(std::move(buffer)), shape_(std::move(shape)), dtype_(dtype), num_elements_(n), size_bytes_(bytes) {}
  // The element count and byte size a tensor of this shape and dtype needs.
  static Result<std::pair<std::uint64_t, std::uint64_t>> storage_of(const ir::Shape& shape, ir::DType dtype);

  enum class Storage { Float, Signed, Unsigned, Bool };
  template <class T>
  static constexpr Storage storage_of() {
    if constexpr (std::is_same_v<T, bool>)
      return Storage::Bool;
    else if constexpr (std::is_floating_point_v<T>)
      return Storage::Float;
    else if constexpr (std::is_signed_v<T>)
      return Storage::Signed;
    else
      return Storage::Unsigned;
  }
  // Whether `dtype` stores its elements as a C++ type of this size and kind.
  static bool stores(ir::DType dtype, std::size_t size, Storage kind);

  std::shared_ptr<HostBuffer> buffer_;
  ir::Shape shape_;
  ir::DType dtype_;
  std::uint64_t num_elements_ = 0;
  std::uint64_t size_bytes_ = 0;
};

// Element count of a shape with overflow checking; also rejects totals whose byte size for
// `elem_bytes` would overflow 64 bits.
Result<std::uint64_t> checked_num_elements(const ir::Shape& shape, std::uint64_t elem_bytes = 1);

template <class T>
Result<HostTensor> HostTensor::from_values(HostAllocator& alloc, ir::Shape shape, std::span<const T> values) {
  return from_values<T>(alloc, std::move(shape), native_dtype<T>(), values);
}

template <class T>
Result<HostTensor> HostTensor::from_values(HostAllocator& alloc, ir::Shape shape, ir::DType dtype,
                                           std::span<const T> values) {
  static_assert(std::is_trivially_copyable_v<T>);
  if (!stores(dtype, sizeof(T), storage_of<T>()))
    return make_error(ErrorCode::DTypeMismatch, "HostTensor::from_values: " + dtype.name() + " is not stored as a " +
                                                    std::to_string(sizeof(T)) + "-byte value of this kind");
  if constexpr (std::is_same_v<T, bool>) {
    return from_bool(alloc, std::move(shape), dtype, std::vector<bool>(values.begin(), values.end()));
  } else {
    return from_bytes(alloc, std::move(shape), dtype, std::as_bytes(values));
  }
}

template <class T>
std::vector<T> HostTensor::to_values() const {
  static_assert(std::is_trivially_copyable_v<T>);
  if (!stores(dtype_, sizeof(T), storage_of<T>())) return {};
  std::vector<T> out(static_cast<std::size_t>(num_elements_));
  if constexpr (std::is_same_v<T, bool>) {
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = get_bool(i);
  } else if (!out.empty()) {
    std::memcpy(out.data(), data(), out.size() * sizeof(T));
  }
  return out;
}

}  // namespace kiln::reference
