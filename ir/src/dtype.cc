#include "kiln/ir/dtype.h"

#include <fmt/format.h>

namespace kiln::ir {

std::string QuantScheme::to_string() const {
  static constexpr const char* kValues[] = {"q8f", "q8s", "q4f", "q4s", "q2f", "q2s"};
  static constexpr const char* kStores[] = {"native", "u32", "packed"};
  std::string s = fmt::format("{},{}", kValues[static_cast<int>(value)], kStores[static_cast<int>(store)]);
  if (store != QuantStoreKind::Native) s += fmt::format("@{}", packed_dim);
  if (block_rank == 0) {
    s += ",tensor";
  } else {
    s += ",block[";
    for (int i = 0; i < block_rank; ++i) s += fmt::format("{}{}", i ? "," : "", block[i]);
    s += "]";
  }
  return s;
}

int quant_value_bits(QuantValue v) {
  switch (v) {
    case QuantValue::Q8F:
    case QuantValue::Q8S: return 8;
    case QuantValue::Q4F:
    case QuantValue::Q4S: return 4;
    case QuantValue::Q2F:
    case QuantValue::Q2S: return 2;
  }
  return 0;
}

std::pair<std::int64_t, std::int64_t> quant_value_range(QuantValue v) {
  const int bits = quant_value_bits(v);
  if (bits == 0) return {0, 0};
  const std::int64_t half = std::int64_t{1} << (bits - 1);
  const bool symmetric = v == QuantValue::Q8S || v == QuantValue::Q4S || v == QuantValue::Q2S;
  return {symmetric ? 1 - half : -half, half - 1};
}

std::size_t DType::size_bytes() const {
  switch (kind_) {
    case DTypeKind::F64:
    case DTypeKind::I64:
    case DTypeKind::U64: return 8;
    case DTypeKind::F32:
    case DTypeKind::Flex32:
    case DTypeKind::I32:
    case DTypeKind::U32: return 4;
    case DTypeKind::F16:
    case DTypeKind::BF16:
    case DTypeKind::I16:
    case DTypeKind::U16: return 2;
    case DTypeKind::I8:
    case DTypeKind::U8: return 1;
    case DTypeKind::Bool: return bool_store_ == BoolStore::U32 ? 4 : 1;
    case DTypeKind::QFloat: return 0;
  }
  return 0;
}

std::string DType::name() const {
  switch (kind_) {
    case DTypeKind::F64: return "f64";
    case DTypeKind::F32: return "f32";
    case DTypeKind::Flex32: return "flex32";
    case DTypeKind::F16: return "f16";
    case DTypeKind::BF16: return "bf16";
    case DTypeKind::I64: return "i64";
    case DTypeKind::I32: return "i32";
    case DTypeKind::I16: return "i16";
    case DTypeKind::I8: return "i8";
    case DTypeKind::U64: return "u64";
    case DTypeKind::U32: return "u32";
    case DTypeKind::U16: return "u16";
    case DTypeKind::U8: return "u8";
    case DTypeKind::Bool:
      switch (bool_store_) {
        case BoolStore::Native: return "bool(Native)";
        case BoolStore::U8: return "bool(U8)";
        case BoolStore::U32: return "bool(U32)";
      }
      return "bool";
    case DTypeKind::QFloat: return "qfloat(" + scheme_.to_string() + ")";
  }
  return "?";
}

std::optional<DType> parse_dtype(std::string_view n) {
  static constexpr std::pair<std::string_view, DType> kNames[] = {
      {"f64", dtypes::f64},
      {"f32", dtypes::f32},
      {"flex32", dtypes::flex32},
      {"f16", dtypes::f16},
      {"bf16", dtypes::bf16},
      {"i64", dtypes::i64},
      {"i32", dtypes::i32},
      {"i16", dtypes::i16},
      {"i8", dtypes::i8},
      {"u64", dtypes::u64},
      {"u32", dtypes::u32},
      {"u16", dtypes::u16},
      {"u8", dtypes::u8},
      {"bool", dtypes::boolean},
      {"bool(Native)", dtypes::boolean},
      {"bool(U8)", DType::boolean(BoolStore::U8)},
      {"bool(U32)", DType::boolean(BoolStore::U32)},
  };
  for (const auto& [name, d] : kNames)
    if (name == n) return d;
  return std::nullopt;
}

}  // namespace kiln::ir
