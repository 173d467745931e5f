// ScalarIr: the serializable literal carried by operations (docs/spec/ir.md §1).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "kiln/base/result.h"
#include "kiln/ir/dtype.h"

namespace kiln::ir {

class ScalarIr {
 public:
  enum class Kind : std::uint8_t { Float, Int, UInt, Bool };

  constexpr ScalarIr() = default;  // UInt(0)
  static constexpr ScalarIr Float(double v) { return ScalarIr(Kind::Float, v, 0, 0); }
  static constexpr ScalarIr Int(std::int64_t v) { return ScalarIr(Kind::Int, 0, v, 0); }
  static constexpr ScalarIr UInt(std::uint64_t v) { return ScalarIr(Kind::UInt, 0, 0, v); }
  static constexpr ScalarIr Bool(bool v) { return ScalarIr(Kind::Bool, 0, 0, v ? 1 : 0); }

  // ScalarIr::new(value, dtype): float dtypes -> Float, signed -> Int, unsigned -> UInt,
  // bool -> Bool; QFloat is unsupported (an error value, docs/spec/ir.md §1).
  static Result<ScalarIr> from_f64(double value, DType dtype);

  constexpr Kind kind() const { return kind_; }
  constexpr double as_float() const { return f_; }
  constexpr std::int64_t as_int() const { return i_; }
  constexpr std::uint64_t as_uint() const { return u_; }
  constexpr bool as_bool() const { return u_ != 0; }

  // elem<E>(): numeric conversion to a target type.
  double to_f64() const;
  std::int64_t to_i64() const;
  std::uint64_t to_u64() const;
  bool to_bool() const;

  std::string to_string() const;

  // Equality: variant and value; Float compares with IEEE == (NaN != NaN).
  friend constexpr bool operator==(const ScalarIr& a, const ScalarIr& b) {
    if (a.kind_ != b.kind_) return false;
    switch (a.kind_) {
      case Kind::Float: return a.f_ == b.f_;
      case Kind::Int: return a.i_ == b.i_;
      default: return a.u_ == b.u_;
    }
  }
  // Hash input: Float contributes its bit pattern.
  std::uint64_t hash_bits() const {
    if (kind_ == Kind::Float) {
      // -0.0 == 0.0 under IEEE equality, so both must hash alike.
      const double v = f_ == 0.0 ? 0.0 : f_;
      std::uint64_t bits;
      std::memcpy(&bits, &v, sizeof bits);
      return bits;
    }
    return kind_ == Kind::Int ? static_cast<std::uint64_t>(i_) : u_;
  }

 private:
  constexpr ScalarIr(Kind k, double f, std::int64_t i, std::uint64_t u) : kind_(k), f_(f), i_(i), u_(u) {}
  Kind kind_ = Kind::UInt;
  double f_ = 0;
  std::int64_t i_ = 0;
  std::uint64_t u_ = 0;
};

}  // namespace kiln::ir
