// Element functions of JIT-generated kernels (jit.cc). Not compiled into kiln's own code paths:
// its text (with fast_math.h and jit_abi.h) is embedded verbatim at the top of every generated
// source, so it may include only standard headers and those two files.
//
// Each function is the per-element body of the interpreter kernel it replaces
// (fast_elementwise.cc: bin / un / k_idiv / k_cast / float_to_int ...), written identically so
// that a JIT kernel computes bit for bit what the interpreter computes: the same operations in
// the same types, one rounding per instruction. The JIT differential test holds them together.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "fast_math.h"
#include "jit_abi.h"

namespace kiln::cpu::jit::rt {

using B8 = std::uint8_t;

template <class T>
inline T wadd(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
}
template <class T>
inline T wsub(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(a) - static_cast<U>(b));
}
template <class T>
inline T wmul(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
}

template <class T>
inline T shl(T a, T b, int bits) {
  bool out = static_cast<std::uint64_t>(b) >= static_cast<std::uint64_t>(bits);
  if constexpr (std::is_signed_v<T>) out = out || b < 0;
  return out ? T{0} : static_cast<T>(static_cast<std::uint64_t>(a) << (static_cast<std::uint64_t>(b) & 63));
}
template <class T>
inline T shr(T a, T b, int bits) {
  bool out = static_cast<std::uint64_t>(b) >= static_cast<std::uint64_t>(bits);
  if constexpr (std::is_signed_v<T>) {
    out = out || b < 0;
    const T fill = a < 0 ? T{-1} : T{0};
    return out ? fill : static_cast<T>(a >> (static_cast<std::uint64_t>(b) & 63));
  } else {
    return out ? T{0} : static_cast<T>(a >> (b & 63));
  }
}

// Integer division / floored remainder; a zero divisor sets `fault` (the launch replays the
// ops, and the reference reports the error).
template <class T>
inline T idiv(T x, T d, int& fault) {
  if (d == 0) {
    fault = 1;
    return 0;
  }
  if constexpr (std::is_signed_v<T>) {
    if (d == -1) return wsub(T{0}, x);
  }
  return x / d;
}
template <class T>
inline T irem(T x, T d, int& fault) {
  if (d == 0) {
    fault = 1;
    return 0;
  }
  if constexpr (std::is_signed_v<T>) {
    if (d == -1) return T{0};
  }
  T r = x % d;
  if constexpr (std::is_signed_v<T>) {
    if (r != 0 && ((r < 0) != (d < 0))) r += d;
  }
  return r;
}

// Floored float remainder (sign of the divisor), in f64.
inline double float_rem(double a, double b) {
  double r = std::fmod(a, b);
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

template <class T>
inline T iabs(T x) {
  if constexpr (std::is_signed_v<T>)
    return x < 0 ? wsub(T{0}, x) : x;
  else
    return x;
}

template <class T>
inline T sign(T x) {
  if constexpr (std::is_unsigned_v<T>)
    return x != 0 ? T{1} : T{0};
  else
    return x > 0 ? T{1} : (x < 0 ? T{-1} : T{0});
}

template <class T>
inline T clamp(T x, T lo, T hi) {
  T v = x < lo ? lo : x;
  return v > hi ? hi : v;
}

template <class T>
inline B8 is_inf(T x) {
  return std::fabs(x) == std::numeric_limits<T>::infinity();
}

// Float -> integer: truncation toward zero, saturated to the target's range, NaN -> 0.
template <class D>
inline D float_to_int(double v, int bits) {
  if (v != v) return 0;
  if constexpr (std::is_signed_v<D>) {
    const double hi = std::ldexp(1.0, bits - 1);
    if (v >= hi) return static_cast<D>(static_cast<std::uint64_t>(hi) - 1);
    if (v <= -hi - 1.0) return static_cast<D>(-static_cast<std::int64_t>(static_cast<std::uint64_t>(hi) - 1) - 1);
    return static_cast<D>(v);
  } else {
    const double hi = std::ldexp(1.0, bits);
    if (v >= hi) return bits == 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << bits) - 1;
    if (v <= -1.0) return 0;
    return static_cast<D>(v);
  }
}

// Register fixups: keep an f32-class value inside f16 / bf16.
inline float fix_f16(float v) { return fast::f16_bits_to_f32(fast::f32_to_f16_bits(v)); }
inline float fix_bf16(float v) { return fast::bf16_bits_to_f32(fast::f32_to_bf16_bits(v)); }

// A double rounded once to f16 / bf16, held as a float.
inline float round_f16(const Frame* f, double v) { return fast::f16_bits_to_f32(f->f16_from_f64(v)); }
inline float round_bf16(const Frame* f, double v) { return fast::bf16_bits_to_f32(f->bf16_from_f64(v)); }

}  // namespace kiln::cpu::jit::rt
