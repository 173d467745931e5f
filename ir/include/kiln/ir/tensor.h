// TensorId, TensorStatus and TensorIr: one use of a tensor inside an operation (ir.md §2).
#pragma once

#include <compare>
#include <cstdint>
#include <functional>
#include <string>

#include "kiln/ir/dtype.h"
#include "kiln/ir/shape.h"

namespace kiln::ir {

// Identity of a tensor: allocated by the client from one counter, never reused.
class TensorId {
 public:
  constexpr explicit TensorId(std::uint64_t value) : value_(value) {}
  constexpr std::uint64_t value() const { return value_; }
  friend constexpr auto operator<=>(TensorId, TensorId) = default;
  std::string to_string() const { return "TensorId(" + std::to_string(value_) + ")"; }

 private:
  std::uint64_t value_;
};

// NotInit: this use creates the tensor. ReadOnly: read, used again later. ReadWrite: last use.
enum class TensorStatus : std::uint8_t { ReadOnly, ReadWrite, NotInit };
const char* status_name(TensorStatus s);

struct TensorIr {
  TensorId id{0};
  Shape shape;
  TensorStatus status = TensorStatus::NotInit;
  DType dtype;

  static TensorIr uninit(TensorId id, Shape shape, DType dtype) {
    return TensorIr{id, std::move(shape), TensorStatus::NotInit, dtype};
  }
  // "t42:f32[2,3,4]" (fusion.md §17.5).
  std::string to_string() const;
  friend bool operator==(const TensorIr&, const TensorIr&) = default;
};

}  // namespace kiln::ir

template <>
struct std::hash<kiln::ir::TensorId> {
  std::size_t operator()(kiln::ir::TensorId id) const noexcept {
    // splitmix64 finaliser: ids are sequential, spread them over buckets.
    std::uint64_t x = id.value() + 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return static_cast<std::size_t>(x ^ (x >> 31));
  }
};
