// DType: the element types of the IR (docs/spec/ir.md §3), with QFloat's quantization scheme.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace kiln::ir {

enum class DTypeKind : std::uint8_t {
  F64,
  F32,
  Flex32,
  F16,
  BF16,
  I64,
  I32,
  I16,
  I8,
  U64,
  U32,
  U16,
  U8,
  Bool,
  QFloat,
};

// How a bool tensor is stored.
enum class BoolStore : std::uint8_t { Native, U8, U32 };

enum class QuantValue : std::uint8_t { Q8F, Q8S, Q4F, Q4S, Q2F, Q2S };
enum class QuantStoreKind : std::uint8_t { Native, PackedU32, PackedNative };
enum class QuantParam : std::uint8_t { F32, F16, BF16 };

// A quantization scheme, kept small and trivially copyable. Only what the builders need is
// modelled: the packed dimension (counted from the last axis, 0 = last) and the block shape.
struct QuantScheme {
  QuantValue value = QuantValue::Q8S;
  QuantStoreKind store = QuantStoreKind::Native;
  std::uint8_t packed_dim = 0;           // meaningful for the packed stores
  std::uint8_t block_rank = 0;           // 0 = one scale for the whole tensor
  std::array<std::uint16_t, 4> block{};  // block shape, block_rank entries used
  QuantParam param = QuantParam::F32;

  friend bool operator==(const QuantScheme&, const QuantScheme&) = default;
  std::string to_string() const;
};

// The bits of a quantized value type (8, 4 or 2) and its integer range (Burn's QuantValue): the
// full-range types Q8F, Q4F, Q2F take [−2^(b−1), 2^(b−1) − 1], the symmetric Q8S, Q4S, Q2S
// [−(2^(b−1) − 1), 2^(b−1) − 1]. An unknown value type has 0 bits and the range [0, 0].
int quant_value_bits(QuantValue v);
std::pair<std::int64_t, std::int64_t> quant_value_range(QuantValue v);

class DType {
 public:
  constexpr DType() = default;  // f32
  constexpr explicit DType(DTypeKind kind) : kind_(kind) {}
  static constexpr DType boolean(BoolStore store = BoolStore::Native) {
    DType d(DTypeKind::Bool);
    d.bool_store_ = store;
    return d;
  }
  static constexpr DType qfloat(QuantScheme scheme) {
    DType d(DTypeKind::QFloat);
    d.scheme_ = scheme;
    return d;
  }

  constexpr DTypeKind kind() const { return kind_; }
  constexpr BoolStore bool_store() const { return bool_store_; }
  constexpr const QuantScheme& scheme() const { return scheme_; }

  constexpr bool is_float() const { return kind_ <= DTypeKind::BF16; }
  constexpr bool is_int() const { return kind_ >= DTypeKind::I64 && kind_ <= DTypeKind::I8; }
  constexpr bool is_uint() const { return kind_ >= DTypeKind::U64 && kind_ <= DTypeKind::U8; }
  constexpr bool is_bool() const { return kind_ == DTypeKind::Bool; }
  constexpr bool is_quantized() const { return kind_ == DTypeKind::QFloat; }
  constexpr bool is_integral() const { return is_int() || is_uint(); }

  // Bytes per element as stored (bool: by its store; QFloat: not a fixed size, 0).
  std::size_t size_bytes() const;
  // "f32", "bool(Native)", "qfloat(...)" (docs/spec/fusion.md §17.5).
  std::string name() const;

  friend constexpr bool operator==(const DType& a, const DType& b) {
    if (a.kind_ != b.kind_) return false;
    if (a.kind_ == DTypeKind::Bool) return a.bool_store_ == b.bool_store_;
    if (a.kind_ == DTypeKind::QFloat) return a.scheme_ == b.scheme_;
    return true;
  }

 private:
  DTypeKind kind_ = DTypeKind::F32;
  BoolStore bool_store_ = BoolStore::Native;
  QuantScheme scheme_{};
};

namespace dtypes {
inline constexpr DType f64{DTypeKind::F64};
inline constexpr DType f32{DTypeKind::F32};
inline constexpr DType flex32{DTypeKind::Flex32};
inline constexpr DType f16{DTypeKind::F16};
inline constexpr DType bf16{DTypeKind::BF16};
inline constexpr DType i64{DTypeKind::I64};
inline constexpr DType i32{DTypeKind::I32};
inline constexpr DType i16{DTypeKind::I16};
inline constexpr DType i8{DTypeKind::I8};
inline constexpr DType u64{DTypeKind::U64};
inline constexpr DType u32{DTypeKind::U32};
inline constexpr DType u16{DTypeKind::U16};
inline constexpr DType u8{DTypeKind::U8};
inline constexpr DType boolean = DType::boolean();
}  // namespace dtypes

// Parses the names produced by DType::name() for the plain dtypes ("f32", "bool", "u8", ...).
std::optional<DType> parse_dtype(std::string_view name);

}  // namespace kiln::ir
