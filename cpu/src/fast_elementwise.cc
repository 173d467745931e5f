// The fast executor's block interpreter: typed element kernels (one clean loop each, left to the
// compiler's vectoriser), loads and stores with broadcast / strided / converting access, the
// BlockRunner that runs one compiled block over a chunk of positions, and Elementwise programs.
//
// Numerics match the reference executor (cpu/include/kiln/reference/reference_executor.h) exactly
// wherever the reference's result is a correctly rounded function of the operands: +, -, *, /,
// sqrt, comparisons, casts, integer arithmetic (wrapping), clamp, masks. f32 registers compute in
// f32: the reference computes in f64 and rounds once, which for these operations gives the same
// float (double rounding is innocuous for +, -, *, /, sqrt from f64 to f32, and from f32 to
// f16 / bf16). The transcendental functions of f32 registers use fast_math.h (<= 2 ulp); those
// of f64, f16 and bf16 registers, and erf / sin / cos / pow / float rem everywhere, call libm in
// f64 and round once to the register's dtype, exactly as the reference does.
#include <fmt/format.h>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>
#include <type_traits>

#if defined(__AVX__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "fast_math.h"
#include "fast_program.h"

#define KILN_IVDEP _Pragma("GCC ivdep")

namespace kiln::cpu::fast {

// ---- Classes and dtypes

std::size_t class_size(VClass c) {
  switch (c) {
    case VClass::F32: return 4;
    case VClass::Bool: return 1;
    default: return 8;
  }
}

std::optional<VClass> class_of(ir::DType d) {
  switch (d.kind()) {
    case ir::DTypeKind::F64: return VClass::F64;
    case ir::DTypeKind::F32:
    case ir::DTypeKind::Flex32:
    case ir::DTypeKind::F16:
    case ir::DTypeKind::BF16: return VClass::F32;
    case ir::DTypeKind::I64:
    case ir::DTypeKind::I32:
    case ir::DTypeKind::I16:
    case ir::DTypeKind::I8: return VClass::I64;
    case ir::DTypeKind::U64:
    case ir::DTypeKind::U32:
    case ir::DTypeKind::U16:
    case ir::DTypeKind::U8: return VClass::U64;
    case ir::DTypeKind::Bool: return VClass::Bool;
    case ir::DTypeKind::QFloat: return std::nullopt;
  }
  return std::nullopt;
}

bool stores_natively(ir::DType d) {
  switch (d.kind()) {
    case ir::DTypeKind::F64:
    case ir::DTypeKind::F32:
    case ir::DTypeKind::Flex32:
    case ir::DTypeKind::I64:
    case ir::DTypeKind::U64: return true;
    case ir::DTypeKind::Bool: return d.bool_store() != ir::BoolStore::U32;
    default: return false;
  }
}

Fixup fixup_of(ir::DType d) {
  switch (d.kind()) {
    case ir::DTypeKind::F16: return Fixup::F16;
    case ir::DTypeKind::BF16: return Fixup::BF16;
    case ir::DTypeKind::I32: return Fixup::Wrap32;
    case ir::DTypeKind::I16: return Fixup::Wrap16;
    case ir::DTypeKind::I8: return Fixup::Wrap8;
    case ir::DTypeKind::U32: return Fixup::WrapU32;
    case ir::DTypeKind::U16: return Fixup::WrapU16;
    case ir::DTypeKind::U8: return Fixup::WrapU8;
    default: return Fixup::None;
  }
}

namespace {

using B8 = std::uint8_t;  // bool registers hold 0 / 1 bytes

template <class T>
T sval(const Scalar& s) {
  if constexpr (std::is_same_v<T, float>)
    return static_cast<float>(s.f);
  else if constexpr (std::is_same_v<T, double>)
    return s.f;
  else if constexpr (std::is_same_v<T, std::int64_t>)
    return s.i;
  else if constexpr (std::is_same_v<T, std::uint64_t>)
    return s.u;
  else
    return s.b;
}

// A double rounded once to a register's dtype, held in the register's class.
template <class T>
T round_to(double v, Fixup f) {
  if constexpr (std::is_same_v<T, float>) {
    if (f == Fixup::F16) return f16_bits_to_f32(f16_from_f64(v));
    if (f == Fixup::BF16) return bf16_bits_to_f32(bf16_from_f64(v));
    return static_cast<float>(v);
  } else {
    (void)f;
    return v;
  }
}

// ---- Loads and stores: storage dtype <-> class arrays, with an element stride.

template <class S, class T, class Conv>
void load_run(const std::byte* src, std::int64_t stride, std::size_t n, T* dst, Conv conv) {
  const S* s = reinterpret_cast<const S*>(src);
  if (stride == 1) {
    KILN_IVDEP for (std::size_t i = 0; i < n; ++i) dst[i] = conv(s[i]);
  } else if (stride == 0) {
    const T v = conv(s[0]);
    for (std::size_t i = 0; i < n; ++i) dst[i] = v;
  } else {
    for (std::size_t i = 0; i < n; ++i) dst[i] = conv(s[static_cast<std::int64_t>(i) * stride]);
  }
}

template <class S, class T, class Conv>
void store_run(const T* src, std::size_t n, std::byte* dst, std::int64_t stride, Conv conv) {
  S* d = reinterpret_cast<S*>(dst);
  if (stride == 1) {
    KILN_IVDEP for (std::size_t i = 0; i < n; ++i) d[i] = conv(src[i]);
  } else {
    for (std::size_t i = 0; i < n; ++i) d[static_cast<std::int64_t>(i) * stride] = conv(src[i]);
  }
}

template <class T>
auto same() {
  return [](T v) { return v; };
}
template <class To>
auto cast_to() {
  return [](auto v) { return static_cast<To>(v); };
}

}  // namespace

void load_elements(const std::byte* src, ir::DType dtype, std::int64_t stride, std::size_t n, void* dst, VClass cls) {
  using ir::DTypeKind;
  switch (cls) {
    case VClass::F32: {
      float* d = static_cast<float*>(dst);
      if (dtype.kind() == DTypeKind::F16)
        load_run<std::uint16_t>(src, stride, n, d, [](std::uint16_t h) { return f16_bits_to_f32(h); });
      else if (dtype.kind() == DTypeKind::BF16)
        load_run<std::uint16_t>(src, stride, n, d, [](std::uint16_t h) { return bf16_bits_to_f32(h); });
      else
        load_run<float>(src, stride, n, d, same<float>());
      return;
    }
    case VClass::F64: load_run<double>(src, stride, n, static_cast<double*>(dst), same<double>()); return;
    case VClass::I64: {
      auto* d = static_cast<std::int64_t*>(dst);
      switch (dtype.kind()) {
        case DTypeKind::I32: load_run<std::int32_t>(src, stride, n, d, cast_to<std::int64_t>()); return;
        case DTypeKind::I16: load_run<std::int16_t>(src, stride, n, d, cast_to<std::int64_t>()); return;
        case DTypeKind::I8: load_run<std::int8_t>(src, stride, n, d, cast_to<std::int64_t>()); return;
        default: load_run<std::int64_t>(src, stride, n, d, same<std::int64_t>()); return;
      }
    }
    case VClass::U64: {
      auto* d = static_cast<std::uint64_t*>(dst);
      switch (dtype.kind()) {
        case DTypeKind::U32: load_run<std::uint32_t>(src, stride, n, d, cast_to<std::uint64_t>()); return;
        case DTypeKind::U16: load_run<std::uint16_t>(src, stride, n, d, cast_to<std::uint64_t>()); return;
        case DTypeKind::U8: load_run<std::uint8_t>(src, stride, n, d, cast_to<std::uint64_t>()); return;
        default: load_run<std::uint64_t>(src, stride, n, d, same<std::uint64_t>()); return;
      }
    }
    case VClass::Bool: {
      auto* d = static_cast<B8*>(dst);
      if (dtype.bool_store() == ir::BoolStore::U32)
        load_run<std::uint32_t>(src, stride, n, d, [](std::uint32_t v) { return static_cast<B8>(v != 0); });
      else
        load_run<std::uint8_t>(src, stride, n, d, [](std::uint8_t v) { return static_cast<B8>(v != 0); });
      return;
    }
  }
}

void store_elements(const void* src, VClass cls, std::size_t n, std::byte* dst, ir::DType dtype, std::int64_t stride) {
  using ir::DTypeKind;
  switch (cls) {
    case VClass::F32: {
      const float* s = static_cast<const float*>(src);
      if (dtype.kind() == DTypeKind::F16)
        store_run<std::uint16_t>(s, n, dst, stride, [](float v) { return f32_to_f16_bits(v); });
      else if (dtype.kind() == DTypeKind::BF16)
        store_run<std::uint16_t>(s, n, dst, stride, [](float v) { return f32_to_bf16_bits(v); });
      else
        store_run<float>(s, n, dst, stride, same<float>());
      return;
    }
    case VClass::F64: store_run<double>(static_cast<const double*>(src), n, dst, stride, same<double>()); return;
    case VClass::I64: {
      const auto* s = static_cast<const std::int64_t*>(src);
      switch (dtype.kind()) {
        case DTypeKind::I32: store_run<std::int32_t>(s, n, dst, stride, cast_to<std::int32_t>()); return;
        case DTypeKind::I16: store_run<std::int16_t>(s, n, dst, stride, cast_to<std::int16_t>()); return;
        case DTypeKind::I8: store_run<std::int8_t>(s, n, dst, stride, cast_to<std::int8_t>()); return;
        default: store_run<std::int64_t>(s, n, dst, stride, same<std::int64_t>()); return;
      }
    }
    case VClass::U64: {
      const auto* s = static_cast<const std::uint64_t*>(src);
      switch (dtype.kind()) {
        case DTypeKind::U32: store_run<std::uint32_t>(s, n, dst, stride, cast_to<std::uint32_t>()); return;
        case DTypeKind::U16: store_run<std::uint16_t>(s, n, dst, stride, cast_to<std::uint16_t>()); return;
        case DTypeKind::U8: store_run<std::uint8_t>(s, n, dst, stride, cast_to<std::uint8_t>()); return;
        default: store_run<std::uint64_t>(s, n, dst, stride, same<std::uint64_t>()); return;
      }
    }
    case VClass::Bool: {
      const auto* s = static_cast<const B8*>(src);
      if (dtype.bool_store() == ir::BoolStore::U32)
        store_run<std::uint32_t>(s, n, dst, stride, cast_to<std::uint32_t>());
      else
        store_run<std::uint8_t>(s, n, dst, stride, same<std::uint8_t>());
      return;
    }
  }
}

void apply_fixup(void* data, VClass cls, Fixup f, std::size_t n) {
  if (f == Fixup::None) return;
  if (cls == VClass::F32) {
    float* d = static_cast<float*>(data);
    if (f == Fixup::F16) {
      KILN_IVDEP for (std::size_t i = 0; i < n; ++i) d[i] = f16_bits_to_f32(f32_to_f16_bits(d[i]));
    } else if (f == Fixup::BF16) {
      KILN_IVDEP for (std::size_t i = 0; i < n; ++i) d[i] = bf16_bits_to_f32(f32_to_bf16_bits(d[i]));
    }
    return;
  }
  if (cls == VClass::I64) {
    auto* d = static_cast<std::int64_t*>(data);
    switch (f) {
      case Fixup::Wrap32: KILN_IVDEP for (std::size_t i = 0; i < n; ++i) d[i] = static_cast<std::int32_t>(d[i]); break;
      case Fixup::Wrap16: KILN_IVDEP for (std::size_t i = 0; i < n; ++i) d[i] = static_cast<std::int16_t>(d[i]); break;
      case Fixup::Wrap8:
        // The int8's sign extension is the wrap.
        // NOLINTNEXTLINE(bugprone-signed-char-misuse)
        KILN_IVDEP for (std::size_t i = 0; i < n; ++i) d[i] = static_cast<std::int8_t>(d[i]);
        break;
      default: break;
    }
    return;
  }
  if (cls == VClass::U64) {
    auto* d = static_cast<std::uint64_t*>(data);
    switch (f) {
      case Fixup::WrapU32:
        KILN_IVDEP for (std::size_t i = 0; i < n; ++i) d[i] = static_cast<std::uint32_t>(d[i]);
        break;
      case Fixup::WrapU16:
        KILN_IVDEP for (std::size_t i = 0; i < n; ++i) d[i] = static_cast<std::uint16_t>(d[i]);
        break;
      case Fixup::WrapU8: KILN_IVDEP for (std::size_t i = 0; i < n; ++i) d[i] = static_cast<std::uint8_t>(d[i]); break;
      default: break;
    }
  }
}

namespace {

// ---- Element functions

// Floored remainder (sign of the divisor), the reference's float_rem.
double float_rem(double a, double b) {
  double r = std::fmod(a, b);
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

template <class T>
T wrap_add(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
}
template <class T>
T wrap_sub(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(a) - static_cast<U>(b));
}
template <class T>
T wrap_mul(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
}

template <Code C, class T>
inline T bin(T a, T b, [[maybe_unused]] int bits) {
  constexpr bool kFloat = std::is_floating_point_v<T>;
  if constexpr (C == Code::Add) {
    if constexpr (kFloat)
      return a + b;
    else
      return wrap_add(a, b);
  } else if constexpr (C == Code::Sub) {
    if constexpr (kFloat)
      return a - b;
    else
      return wrap_sub(a, b);
  } else if constexpr (C == Code::Mul) {
    if constexpr (kFloat)
      return a * b;
    else
      return wrap_mul(a, b);
  } else if constexpr (C == Code::Div) {
    return a / b;  // floats only (integers: k_idiv)
  } else if constexpr (C == Code::BitAnd || C == Code::LogicAnd) {
    return a & b;
  } else if constexpr (C == Code::BitOr || C == Code::LogicOr) {
    return a | b;
  } else if constexpr (C == Code::BitXor || C == Code::LogicXor) {
    return a ^ b;
  } else if constexpr (C == Code::Shl) {
    bool out = static_cast<std::uint64_t>(b) >= static_cast<std::uint64_t>(bits);
    if constexpr (std::is_signed_v<T>) out = out || b < 0;
    return out ? T{0} : static_cast<T>(static_cast<std::uint64_t>(a) << (static_cast<std::uint64_t>(b) & 63));
  } else if constexpr (C == Code::Shr) {
    bool out = static_cast<std::uint64_t>(b) >= static_cast<std::uint64_t>(bits);
    if constexpr (std::is_signed_v<T>) {
      out = out || b < 0;
      const T fill = a < 0 ? T{-1} : T{0};
      return out ? fill : static_cast<T>(a >> (static_cast<std::uint64_t>(b) & 63));
    } else {
      return out ? T{0} : static_cast<T>(a >> (b & 63));
    }
  } else if constexpr (C == Code::ClampMin) {
    return a < b ? b : a;
  } else if constexpr (C == Code::ClampMax) {
    return a > b ? b : a;
  } else {
    static_assert(C == Code::Add, "not a simple binary code");
    return a;
  }
}

template <Code C, class T>
inline B8 cmp(T a, T b) {
  if constexpr (C == Code::Eq)
    return a == b;
  else if constexpr (C == Code::Ne)
    return a != b;
  else if constexpr (C == Code::Gt)
    return a > b;
  else if constexpr (C == Code::Ge)
    return a >= b;
  else if constexpr (C == Code::Lt)
    return a < b;
  else
    return a <= b;
}

template <Code C, class T>
inline T un(T x) {
  if constexpr (C == Code::Abs) {
    if constexpr (std::is_floating_point_v<T>)
      return std::fabs(x);
    else if constexpr (std::is_signed_v<T>)
      return x < 0 ? wrap_sub(T{0}, x) : x;
    else
      return x;
  } else if constexpr (C == Code::Neg) {
    if constexpr (std::is_floating_point_v<T>)
      return -x;
    else
      return wrap_sub(T{0}, x);
  } else if constexpr (C == Code::Sign) {
    if constexpr (std::is_floating_point_v<T> || std::is_signed_v<T>)
      return x > 0 ? T{1} : (x < 0 ? T{-1} : T{0});
    else
      return x != 0 ? T{1} : T{0};
  } else if constexpr (C == Code::Recip) {
    return T{1} / x;
  } else if constexpr (C == Code::Floor) {
    return std::floor(x);
  } else if constexpr (C == Code::Ceil) {
    return std::ceil(x);
  } else if constexpr (C == Code::Trunc) {
    return std::trunc(x);
  } else if constexpr (C == Code::Round) {
    // Half to even. GCC's roundeven builtins are exact whatever the rounding mode; clang 14 (the
    // tidy and thread-safety passes) lacks them, and rint rounds the same way in the default mode.
#if defined(__clang__)
    if constexpr (std::is_same_v<T, float>)
      return __builtin_rintf(x);
    else
      return __builtin_rint(x);
#else
    if constexpr (std::is_same_v<T, float>)
      return __builtin_roundevenf(x);
    else
      return __builtin_roundeven(x);
#endif
  } else if constexpr (C == Code::BitNot) {
    return static_cast<T>(~x);
  } else if constexpr (C == Code::Not) {
    return static_cast<T>(x ^ 1);
  } else {
    static_assert(C == Code::Abs, "not a simple unary code");
    return x;
  }
}

// ---- Kernels

template <Code C, class T, bool S>
void k_binary(const KArgs& a) {
  const std::size_t n = a.n;
  T* o = static_cast<T*>(a.out);
  const T* x = static_cast<const T*>(a.in[0]);
  const int bits = a.ins->bits;
  if constexpr (S) {
    const T y = sval<T>(*a.s[0]);
    KILN_IVDEP for (std::size_t i = 0; i < n; ++i) o[i] = bin<C, T>(x[i], y, bits);
  } else {
    const T* y = static_cast<const T*>(a.in[1]);
    KILN_IVDEP for (std::size_t i = 0; i < n; ++i) o[i] = bin<C, T>(x[i], y[i], bits);
  }
}

template <Code C, class T, bool S>
void k_compare(const KArgs& a) {
  const std::size_t n = a.n;
  B8* o = static_cast<B8*>(a.out);
  const T* x = static_cast<const T*>(a.in[0]);
  if constexpr (S) {
    const T y = sval<T>(*a.s[0]);
    KILN_IVDEP for (std::size_t i = 0; i < n; ++i) o[i] = cmp<C, T>(x[i], y);
  } else {
    const T* y = static_cast<const T*>(a.in[1]);
    KILN_IVDEP for (std::size_t i = 0; i < n; ++i) o[i] = cmp<C, T>(x[i], y[i]);
  }
}

// Integer division and floored remainder; a zero divisor is a fault (the reference fails too).
template <Code C, class T, bool S>
void k_idiv(const KArgs& a) {
  const std::size_t n = a.n;
  T* o = static_cast<T*>(a.out);
  const T* x = static_cast<const T*>(a.in[0]);
  const T* yv = S ? nullptr : static_cast<const T*>(a.in[1]);
  const T ys = S ? sval<T>(*a.s[0]) : T{0};
  bool bad = false;
  for (std::size_t i = 0; i < n; ++i) {
    const T d = S ? ys : yv[i];
    if (d == 0) {
      bad = true;
      o[i] = 0;
      continue;
    }
    if constexpr (std::is_signed_v<T>) {
      if (d == -1) {
        o[i] = C == Code::Div ? wrap_sub(T{0}, x[i]) : T{0};
        continue;
      }
    }
    if constexpr (C == Code::Div) {
      o[i] = x[i] / d;
    } else {
      T r = x[i] % d;
      if constexpr (std::is_signed_v<T>) {
        if (r != 0 && ((r < 0) != (d < 0))) r += d;
      }
      o[i] = r;
    }
  }
  if (bad) *a.fail = true;
}

// Float remainder and power: computed in f64 through libm and rounded once to the register's
// dtype, as the reference does.
template <Code C, class T, bool S>
void k_float_libm2(const KArgs& a) {
  const std::size_t n = a.n;
  T* o = static_cast<T*>(a.out);
  const T* x = static_cast<const T*>(a.in[0]);
  const T* yv = S ? nullptr : static_cast<const T*>(a.in[1]);
  const double ys = S ? static_cast<double>(sval<T>(*a.s[0])) : 0.0;
  const Fixup f = fixup_of(a.ins->out_dtype);
  for (std::size_t i = 0; i < n; ++i) {
    const double xv = x[i];
    const double y = S ? ys : static_cast<double>(yv[i]);
    const double r = C == Code::Rem ? float_rem(xv, y) : std::pow(xv, y);
    o[i] = round_to<T>(r, f);
  }
}

template <Code C, class T>
void k_unary(const KArgs& a) {
  const std::size_t n = a.n;
  T* o = static_cast<T*>(a.out);
  const T* x = static_cast<const T*>(a.in[0]);
  KILN_IVDEP for (std::size_t i = 0; i < n; ++i) o[i] = un<C, T>(x[i]);
}

#if defined(KILN_FAST_CHECKED_BLOCKS)
// An f32 fast function over the kernel's range with the target's vector forms (fast_math.h):
// blocks of 64 lanes through the restricted-domain form where there is one, checked once per
// block and recomputed with the general form when a lane was outside its domain (NaN, Inf,
// |x| >= 86 for exp, ...), else the general form; the tail through the scalar function. The
// same bits as the scalar function everywhere, in about half its auto-vectorised instructions
// on the common inputs.
using CheckedBlockFn = void (*)(const float*, float*, BlockCheck&);
template <float (*F)(float), void (*General)(const float*, float*), CheckedBlockFn Checked>
void k_fast_blocks(const KArgs& a) {
  constexpr std::size_t kLanes = 64;
  const std::size_t n = a.n;
  float* o = static_cast<float*>(a.out);
  const float* x = static_cast<const float*>(a.in[0]);
  // In place (o == x), a failed check needs the inputs back: the block goes to a buffer first.
  alignas(64) float staged[kLanes];
  std::size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    if constexpr (Checked != nullptr) {
      BlockCheck check;
      float* dst = o == x ? staged : o + i;
      Checked(x + i, dst, check);
      if (check.ok()) {
        if (dst == staged) std::memcpy(o + i, staged, sizeof staged);
        continue;
      }
    }
    General(x + i, o + i);
  }
  for (; i < n; ++i) o[i] = F(x[i]);
}
#endif

template <float (*F)(float)>
void k_fast_f32(const KArgs& a) {
  const std::size_t n = a.n;
  float* o = static_cast<float*>(a.out);
  const float* x = static_cast<const float*>(a.in[0]);
  KILN_IVDEP for (std::size_t i = 0; i < n; ++i) o[i] = F(x[i]);
}

double libm_exp(double v) { return std::exp(v); }
double libm_log(double v) { return std::log(v); }
double libm_log1p(double v) { return std::log1p(v); }
double libm_erf(double v) { return std::erf(v); }
double libm_cos(double v) { return std::cos(v); }
double libm_sin(double v) { return std::sin(v); }
double libm_tanh(double v) { return std::tanh(v); }

template <class T, double (*F)(double)>
void k_libm(const KArgs& a) {
  const std::size_t n = a.n;
  T* o = static_cast<T*>(a.out);
  const T* x = static_cast<const T*>(a.in[0]);
  const Fixup f = fixup_of(a.ins->out_dtype);
  for (std::size_t i = 0; i < n; ++i) o[i] = round_to<T>(F(static_cast<double>(x[i])), f);
}

template <class T>
void k_sqrt(const KArgs& a) {
  const std::size_t n = a.n;
  T* o = static_cast<T*>(a.out);
  const T* x = static_cast<const T*>(a.in[0]);
  std::size_t i = 0;
  // 256-bit vectors also on AVX-512 machines: GCC 12's 512-bit sqrt intrinsics trip
  // -Wmaybe-uninitialized, and Zen 4 runs both at the same rate.
#if defined(__AVX__)
  if constexpr (std::is_same_v<T, float>) {
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(o + i, _mm256_sqrt_ps(_mm256_loadu_ps(x + i)));
  } else {
    for (; i + 4 <= n; i += 4) _mm256_storeu_pd(o + i, _mm256_sqrt_pd(_mm256_loadu_pd(x + i)));
  }
#endif
  for (; i < n; ++i) o[i] = std::sqrt(x[i]);
}

template <class T, bool Inf>
void k_class_test(const KArgs& a) {
  const std::size_t n = a.n;
  B8* o = static_cast<B8*>(a.out);
  const T* x = static_cast<const T*>(a.in[0]);
  constexpr T kInf = std::numeric_limits<T>::infinity();
  if constexpr (Inf) {
    KILN_IVDEP for (std::size_t i = 0; i < n; ++i) o[i] = std::fabs(x[i]) == kInf;
  } else {
    KILN_IVDEP for (std::size_t i = 0; i < n; ++i) o[i] = x[i] != x[i];
  }
}

// Float -> integer: truncation toward zero, saturated to the target dtype's range, NaN -> 0
// (the element codec's rule).
template <class D>
D float_to_int(double v, int bits) {
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

template <class S, class D>
void k_cast(const KArgs& a) {
  const std::size_t n = a.n;
  D* o = static_cast<D*>(a.out);
  const S* x = static_cast<const S*>(a.in[0]);
  const ir::DType to = a.ins->out_dtype;
  if constexpr (std::is_same_v<S, B8>) {
    KILN_IVDEP for (std::size_t i = 0; i < n; ++i) o[i] = static_cast<D>(x[i] != 0 ? 1 : 0);
  } else if constexpr (std::is_same_v<D, B8>) {
    KILN_IVDEP for (std::size_t i = 0; i < n; ++i) o[i] = x[i] != 0;
  } else if constexpr (std::is_floating_point_v<S> && std::is_integral_v<D>) {
    const int bits = static_cast<int>(to.size_bytes() * 8);
    for (std::size_t i = 0; i < n; ++i) o[i] = float_to_int<D>(static_cast<double>(x[i]), bits);
  } else if constexpr (std::is_same_v<D, float> && !std::is_same_v<S, float>) {
    // From f64 or an integer: round once, straight to the target (f16 / bf16 from the f64 or
    // integer value, never through f32).
    const Fixup f = fixup_of(to);
    if (f == Fixup::None) {
      KILN_IVDEP for (std::size_t i = 0; i < n; ++i) o[i] = static_cast<float>(x[i]);
    } else {
      for (std::size_t i = 0; i < n; ++i) o[i] = round_to<float>(static_cast<double>(x[i]), f);
    }
  } else {
    KILN_IVDEP for (std::size_t i = 0; i < n; ++i) o[i] = static_cast<D>(x[i]);
  }
}

template <class T>
void k_clamp(const KArgs& a) {
  const std::size_t n = a.n;
  T* o = static_cast<T*>(a.out);
  const T* x = static_cast<const T*>(a.in[0]);
  const T lo = sval<T>(*a.s[0]);
  const T hi = sval<T>(*a.s[1]);
  KILN_IVDEP for (std::size_t i = 0; i < n; ++i) {
    T v = x[i] < lo ? lo : x[i];
    o[i] = v > hi ? hi : v;
  }
}

template <class T>
void k_where(const KArgs& a) {
  const std::size_t n = a.n;
  T* o = static_cast<T*>(a.out);
  const T* t = static_cast<const T*>(a.in[0]);
  const B8* m = static_cast<const B8*>(a.in[1]);
  const T* v = static_cast<const T*>(a.in[2]);
  KILN_IVDEP for (std::size_t i = 0; i < n; ++i) o[i] = m[i] ? v[i] : t[i];
}

template <class T>
void k_mask_fill(const KArgs& a) {
  const std::size_t n = a.n;
  T* o = static_cast<T*>(a.out);
  const T* t = static_cast<const T*>(a.in[0]);
  const B8* m = static_cast<const B8*>(a.in[1]);
  const T s = sval<T>(*a.s[0]);
  KILN_IVDEP for (std::size_t i = 0; i < n; ++i) o[i] = m[i] ? s : t[i];
}

template <class T>
void k_copy(const KArgs& a) {
  std::memcpy(a.out, a.in[0], a.n * sizeof(T));
}

template <class T>
void k_fill(const KArgs& a) {
  const std::size_t n = a.n;
  T* o = static_cast<T*>(a.out);
  const T v = a.s[0] != nullptr ? sval<T>(*a.s[0]) : sval<T>(a.ins->imm);
  for (std::size_t i = 0; i < n; ++i) o[i] = v;
}

// ---- Kernel selection

// `name` is a template's name: it cannot be parenthesised.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define KILN_BY_CLASS(name)                          \
  KernelFn name##_for(VClass c) {                    \
    switch (c) {                                     \
      case VClass::F32: return &name<float>;         \
      case VClass::F64: return &name<double>;        \
      case VClass::I64: return &name<std::int64_t>;  \
      case VClass::U64: return &name<std::uint64_t>; \
      case VClass::Bool: return &name<B8>;           \
    }                                                \
    return nullptr;                                  \
  }
KILN_BY_CLASS(k_clamp)
KILN_BY_CLASS(k_where)
KILN_BY_CLASS(k_mask_fill)
KILN_BY_CLASS(k_copy)
KILN_BY_CLASS(k_fill)
#undef KILN_BY_CLASS
// NOLINTEND(bugprone-macro-parentheses)

template <Code C, bool S>
KernelFn arith_kernel(VClass c) {
  switch (c) {
    case VClass::F32: return &k_binary<C, float, S>;
    case VClass::F64: return &k_binary<C, double, S>;
    case VClass::I64: return &k_binary<C, std::int64_t, S>;
    case VClass::U64: return &k_binary<C, std::uint64_t, S>;
    case VClass::Bool: return nullptr;
  }
  return nullptr;
}

template <Code C, bool S>
KernelFn int_kernel(VClass c) {
  if (c == VClass::I64) return &k_binary<C, std::int64_t, S>;
  if (c == VClass::U64) return &k_binary<C, std::uint64_t, S>;
  return nullptr;
}

template <Code C, bool S>
KernelFn bool_kernel(VClass c) {
  return c == VClass::Bool ? &k_binary<C, B8, S> : nullptr;
}

template <Code C, bool S>
KernelFn div_kernel(VClass c) {
  switch (c) {
    case VClass::F32:
      if constexpr (C == Code::Div)
        return &k_binary<C, float, S>;
      else
        return &k_float_libm2<C, float, S>;
    case VClass::F64:
      if constexpr (C == Code::Div)
        return &k_binary<C, double, S>;
      else
        return &k_float_libm2<C, double, S>;
    case VClass::I64: return &k_idiv<C, std::int64_t, S>;
    case VClass::U64: return &k_idiv<C, std::uint64_t, S>;
    case VClass::Bool: return nullptr;
  }
  return nullptr;
}

template <Code C, bool S>
KernelFn compare_kernel(VClass c) {
  switch (c) {
    case VClass::F32: return &k_compare<C, float, S>;
    case VClass::F64: return &k_compare<C, double, S>;
    case VClass::I64: return &k_compare<C, std::int64_t, S>;
    case VClass::U64: return &k_compare<C, std::uint64_t, S>;
    case VClass::Bool:
      if constexpr (C == Code::Eq || C == Code::Ne)
        return &k_compare<C, B8, S>;
      else
        return nullptr;
  }
  return nullptr;
}

template <bool S>
KernelFn binary_kernel(Code code, VClass c) {
  switch (code) {
    case Code::Add: return arith_kernel<Code::Add, S>(c);
    case Code::Sub: return arith_kernel<Code::Sub, S>(c);
    case Code::Mul: return arith_kernel<Code::Mul, S>(c);
    case Code::ClampMin: return arith_kernel<Code::ClampMin, S>(c);
    case Code::ClampMax: return arith_kernel<Code::ClampMax, S>(c);
    case Code::Div: return div_kernel<Code::Div, S>(c);
    case Code::Rem: return div_kernel<Code::Rem, S>(c);
    case Code::Pow:
      if (c == VClass::F32) return &k_float_libm2<Code::Pow, float, S>;
      if (c == VClass::F64) return &k_float_libm2<Code::Pow, double, S>;
      return nullptr;
    case Code::BitAnd: return int_kernel<Code::BitAnd, S>(c);
    case Code::BitOr: return int_kernel<Code::BitOr, S>(c);
    case Code::BitXor: return int_kernel<Code::BitXor, S>(c);
    case Code::Shl: return int_kernel<Code::Shl, S>(c);
    case Code::Shr: return int_kernel<Code::Shr, S>(c);
    case Code::LogicAnd: return bool_kernel<Code::LogicAnd, S>(c);
    case Code::LogicOr: return bool_kernel<Code::LogicOr, S>(c);
    case Code::LogicXor: return bool_kernel<Code::LogicXor, S>(c);
    case Code::Eq: return compare_kernel<Code::Eq, S>(c);
    case Code::Ne: return compare_kernel<Code::Ne, S>(c);
    case Code::Gt: return compare_kernel<Code::Gt, S>(c);
    case Code::Ge: return compare_kernel<Code::Ge, S>(c);
    case Code::Lt: return compare_kernel<Code::Lt, S>(c);
    case Code::Le: return compare_kernel<Code::Le, S>(c);
    default: return nullptr;
  }
}

template <Code C>
KernelFn numeric_unary(VClass c) {
  switch (c) {
    case VClass::F32: return &k_unary<C, float>;
    case VClass::F64: return &k_unary<C, double>;
    case VClass::I64: return &k_unary<C, std::int64_t>;
    case VClass::U64: return &k_unary<C, std::uint64_t>;
    case VClass::Bool: return nullptr;
  }
  return nullptr;
}

template <Code C>
KernelFn float_unary(VClass c) {
  if (c == VClass::F32) return &k_unary<C, float>;
  if (c == VClass::F64) return &k_unary<C, double>;
  return nullptr;
}

template <double (*F)(double)>
KernelFn libm_kernel(VClass c) {
  if (c == VClass::F32) return &k_libm<float, F>;
  if (c == VClass::F64) return &k_libm<double, F>;
  return nullptr;
}

template <class S>
KernelFn cast_from(VClass to) {
  switch (to) {
    case VClass::F32: return &k_cast<S, float>;
    case VClass::F64: return &k_cast<S, double>;
    case VClass::I64: return &k_cast<S, std::int64_t>;
    case VClass::U64: return &k_cast<S, std::uint64_t>;
    case VClass::Bool: return &k_cast<S, B8>;
  }
  return nullptr;
}

KernelFn cast_kernel(VClass from, VClass to) {
  switch (from) {
    case VClass::F32: return cast_from<float>(to);
    case VClass::F64: return cast_from<double>(to);
    case VClass::I64: return cast_from<std::int64_t>(to);
    case VClass::U64: return cast_from<std::uint64_t>(to);
    case VClass::Bool: return cast_from<B8>(to);
  }
  return nullptr;
}

}  // namespace

namespace {

// The transcendental functions: f32 registers without a fixup use the fast approximations
// (fast_math.h); f64, f16 and bf16 registers round libm's f64 result once (`exact`).
// Null when `code` is not one of them.
KernelFn math_kernel(Code code, VClass c, bool fast_f32, bool& exact) {
#if defined(KILN_FAST_CHECKED_BLOCKS)
#define KILN_FAST_F32(name, scalar, checked) &k_fast_blocks<scalar, &name##_block<64>, checked>
#else
#define KILN_FAST_F32(name, scalar, checked) &k_fast_f32<scalar>
#endif
  exact = true;
  switch (code) {
    case Code::Exp:
      exact = !fast_f32;
      return fast_f32 ? KILN_FAST_F32(exp, exp_f32, &exp_block_unchecked<64>) : libm_kernel<libm_exp>(c);
    case Code::Log:
      exact = !fast_f32;
      return fast_f32 ? KILN_FAST_F32(log, log_f32, &log_block_unchecked<64>) : libm_kernel<libm_log>(c);
    case Code::Log1p:
      exact = !fast_f32;
      return fast_f32 ? KILN_FAST_F32(log1p, log1p_f32, nullptr) : libm_kernel<libm_log1p>(c);
    case Code::Tanh:
      exact = !fast_f32;
      return fast_f32 ? KILN_FAST_F32(tanh, tanh_f32, &tanh_block_unchecked<64>) : libm_kernel<libm_tanh>(c);
    case Code::Erf: return libm_kernel<libm_erf>(c);
    case Code::Sin: return libm_kernel<libm_sin>(c);
    case Code::Cos: return libm_kernel<libm_cos>(c);
    default: exact = false; return nullptr;
  }
#undef KILN_FAST_F32
}

// The other unary codes, by register class (null when the class has no kernel for the code, or
// the code is not unary).
KernelFn unary_kernel(Code code, VClass c) {
  switch (code) {
    case Code::Sqrt: return c == VClass::F32 ? &k_sqrt<float> : c == VClass::F64 ? &k_sqrt<double> : nullptr;
    case Code::Abs: return numeric_unary<Code::Abs>(c);
    case Code::Neg: return numeric_unary<Code::Neg>(c);
    case Code::Sign: return numeric_unary<Code::Sign>(c);
    case Code::Recip: return float_unary<Code::Recip>(c);
    case Code::Round: return float_unary<Code::Round>(c);
    case Code::Floor: return float_unary<Code::Floor>(c);
    case Code::Ceil: return float_unary<Code::Ceil>(c);
    case Code::Trunc: return float_unary<Code::Trunc>(c);
    case Code::IsNan:
      return c == VClass::F32 ? &k_class_test<float, false> : c == VClass::F64 ? &k_class_test<double, false> : nullptr;
    case Code::IsInf:
      return c == VClass::F32 ? &k_class_test<float, true> : c == VClass::F64 ? &k_class_test<double, true> : nullptr;
    case Code::BitNot:
      return c == VClass::I64   ? &k_unary<Code::BitNot, std::int64_t>
             : c == VClass::U64 ? &k_unary<Code::BitNot, std::uint64_t>
                                : nullptr;
    case Code::Not: return c == VClass::Bool ? &k_unary<Code::Not, B8> : nullptr;
    default: return nullptr;
  }
}

bool is_math_code(Code code) {
  switch (code) {
    case Code::Exp:
    case Code::Log:
    case Code::Log1p:
    case Code::Tanh:
    case Code::Erf:
    case Code::Sin:
    case Code::Cos: return true;
    default: return false;
  }
}

bool is_plain_unary_code(Code code) {
  switch (code) {
    case Code::Sqrt:
    case Code::Abs:
    case Code::Neg:
    case Code::Sign:
    case Code::Recip:
    case Code::Round:
    case Code::Floor:
    case Code::Ceil:
    case Code::Trunc:
    case Code::IsNan:
    case Code::IsInf:
    case Code::BitNot:
    case Code::Not: return true;
    default: return false;
  }
}

}  // namespace

bool bind_kernel(CInstr& ins, const RegInfo& out) {
  const VClass c = ins.cls;
  // f32 / flex32 registers use the fast approximations; f16 / bf16 round from libm's f64 result.
  const bool fast_f32 = c == VClass::F32 && out.fixup == Fixup::None;
  KernelFn fn = nullptr;
  bool exact = false;
  if (ins.code == Code::Gather || ins.code == Code::Select || ins.code == Code::Cat) {
    ins.fn = nullptr;  // run by the BlockRunner (positions per element)
    return true;
  }
  if (is_math_code(ins.code)) {
    fn = math_kernel(ins.code, c, fast_f32, exact);
  } else if (is_plain_unary_code(ins.code)) {
    fn = unary_kernel(ins.code, c);
  } else {
    switch (ins.code) {
      case Code::Cast:
        fn = cast_kernel(c, ins.out_cls);
        // Rounded once to the target inside the kernel: float -> int (saturating, never wraps)
        // and f64 / integers -> f16 / bf16.
        exact = (c == VClass::F32 || c == VClass::F64) && (ins.out_cls == VClass::I64 || ins.out_cls == VClass::U64);
        exact = exact || (ins.out_cls == VClass::F32 && c != VClass::F32 && c != VClass::Bool);
        break;
      case Code::Clamp: fn = c == VClass::Bool ? nullptr : k_clamp_for(c); break;
      case Code::MaskWhere: fn = k_where_for(c); break;
      case Code::MaskFill: fn = k_mask_fill_for(c); break;
      case Code::Copy: fn = k_copy_for(c); break;
      case Code::Fill: fn = k_fill_for(c); break;
      default: {
        const bool scalar_rhs = ins.scalars[0] >= 0 && ins.regs[1] < 0;
        fn = scalar_rhs ? binary_kernel<true>(ins.code, c) : binary_kernel<false>(ins.code, c);
        exact = ins.code == Code::Pow || (ins.code == Code::Rem && (c == VClass::F32 || c == VClass::F64));
        break;
      }
    }
  }
  ins.fn = fn;
  ins.exact_out = exact;
  return fn != nullptr;
}

// ---- Scratch and parallel loops

Scratch::Scratch(std::size_t bytes) {
  if (bytes != 0) data_ = static_cast<std::byte*>(::operator new (bytes, std::align_val_t{64}));
}
Scratch::~Scratch() {
  if (data_ != nullptr) ::operator delete (data_, std::align_val_t{64});
}

void parallel_ranges_impl(tbb::task_arena* arena, int threads, std::uint64_t n, std::uint64_t grain,
                          void (*fn)(void*, std::uint64_t, std::uint64_t), void* ctx) {
  if (n == 0) return;
  grain = grain == 0 ? 1 : grain;
  // Under ThreadSanitizer the pieces run on the calling thread: libtbb is not built with it, so
  // its spawn and join are invisible, and every parallel loop reported races inside oneTBB's
  // headers and on what a piece read (the cpu tests of the tsan preset). What TSan is there for
  // (the runtime's actors, queues and tables) does not run on this arena.
#if defined(__SANITIZE_THREAD__)
  constexpr bool kSerial = true;
#else
  constexpr bool kSerial = false;
#endif
  if (kSerial || arena == nullptr || threads <= 1 || n < 2 * grain) {
    fn(ctx, 0, n);
    return;
  }
  // Static partitioning: contiguous, equal shares per thread (bandwidth-bound loops stream best
  // when each core walks its own contiguous range).
  arena->execute([&] {
    tbb::parallel_for(
        tbb::blocked_range<std::uint64_t>(0, n, grain),
        [&](const tbb::blocked_range<std::uint64_t>& r) { fn(ctx, r.begin(), r.end()); }, tbb::static_partitioner());
  });
}

ir::Shape Launch::concrete(const ir::Shape& relative) const {
  ir::Shape s;
  s.reserve(relative.size());
  for (std::uint64_t id : relative) s.push_back(id < dims.size() ? dims[id] : 0);
  return s;
}

// ---- BlockRunner

namespace {

std::array<std::int64_t, kMaxRank> row_major(const ir::Shape& s) {
  std::array<std::int64_t, kMaxRank> st{};
  std::int64_t acc = 1;
  for (std::size_t i = s.size(); i-- > 0;) {
    st[i] = acc;
    acc *= static_cast<std::int64_t>(s[i]);
  }
  return st;
}

// Strides of a tensor (shape, strides) read at the positions of `ref` (equal ranks; each dim
// equal to ref's or 1 = broadcast). Empty string or the mismatch.
std::string map_onto(const ir::Shape& shape, const std::array<std::int64_t, kMaxRank>& strides, const ir::Shape& ref,
                     std::array<std::int64_t, kMaxRank>& out, bool* broadcast) {
  if (shape.size() != ref.size())
    return "rank of " + ir::shape_to_string(shape) + " differs from the block's " + ir::shape_to_string(ref);
  for (std::size_t d = 0; d < ref.size(); ++d) {
    if (shape[d] == ref[d]) {
      out[d] = strides[d];
    } else if (shape[d] == 1) {
      out[d] = 0;
      if (broadcast) *broadcast = true;
    } else {
      return "shape " + ir::shape_to_string(shape) + " does not broadcast to " + ir::shape_to_string(ref);
    }
  }
  return {};
}

}  // namespace

namespace {

// The shape and row-major strides a load reads: its input (through its view: swap_dims or a
// reshape of the source), or an output an earlier stage wrote. Empty string, or why not, with
// the values involved.
std::string load_layout(const Launch& launch, const CLoad& l, ir::Shape& shape,
                        std::array<std::int64_t, kMaxRank>& strides, const HostTensor*& t) {
  if (l.source != fusion::LoadSource::Input) {
    if (!launch.outputs[l.index]) return fmt::format("output {} read before it was written", l.index);
    t = &*launch.outputs[l.index];
    shape = t->shape();
    if (shape.size() > kMaxRank) return fmt::format("output {} rank {} above {}", l.index, shape.size(), kMaxRank);
    strides = row_major(shape);
    return {};
  }
  const fusion::ProgramInput& in = launch.program->inputs[l.index];
  if (!launch.inputs[l.index]) return fmt::format("input {} not bound", l.index);
  t = &*launch.inputs[l.index];
  if (in.role != fusion::InputRole::View) {
    shape = t->shape();
    if (shape.size() > kMaxRank) return fmt::format("input {} rank {} above {}", l.index, shape.size(), kMaxRank);
    strides = row_major(shape);
    return {};
  }
  const ir::Shape& src = t->shape();
  if (src.size() > kMaxRank)
    return fmt::format("input {}: view source rank {} above {}", l.index, src.size(), kMaxRank);
  shape = launch.concrete(in.view->shape);
  if (in.view->op != ir::OpKind::Base_SwapDims) {
    if (ir::num_elements(shape) != ir::num_elements(src) || shape.size() > kMaxRank)
      return fmt::format("input {}: reshape view {} of source {}", l.index, ir::shape_to_string(shape),
                         ir::shape_to_string(src));
    strides = row_major(shape);
    return {};
  }
  const auto d1 = static_cast<std::size_t>(in.view->dim1);
  const auto d2 = static_cast<std::size_t>(in.view->dim2);
  if (in.view->dim1 < 0 || in.view->dim2 < 0 || d1 >= src.size() || d2 >= src.size())
    return fmt::format("input {}: swap_dims axes ({}, {}) outside source rank {}", l.index, in.view->dim1,
                       in.view->dim2, src.size());
  ir::Shape swapped = src;
  std::swap(swapped[d1], swapped[d2]);
  if (swapped != shape)
    return fmt::format("input {}: swap_dims view {} is not source {} with axes {} and {} swapped", l.index,
                       ir::shape_to_string(shape), ir::shape_to_string(src), d1, d2);
  strides = row_major(src);
  std::swap(strides[d1], strides[d2]);
  return {};
}

}  // namespace

std::string BlockRunner::prepare(const Launch& launch, std::size_t b, const ir::Shape& reference,
                                 std::span<const std::uint32_t> preset, std::span<const std::uint32_t> written) {
  launch_ = &launch;
  block_ = &launch.compiled->blocks[b];
  reference_ = reference;
  if (reference.size() > kMaxRank)
    return fmt::format("block {}: reference {} of rank {} above {}", b, ir::shape_to_string(reference),
                       reference.size(), kMaxRank);
  numel_ = ir::num_elements(reference);
  preset_.assign(block_->regs.size(), false);
  for (std::uint32_t reg : preset) preset_[reg] = true;

  if (std::string e = bind_loads(launch, reference); !e.empty()) return e;
  if (std::string e = bind_stores(launch, reference, written); !e.empty()) return e;
  coalesce(reference);
  choose_direct_stores(launch);
  bind_instruction_args(launch);
  return bind_indexed(launch, reference);
}

// Each load's accessor: base, dtype and strides over the reference shape.
std::string BlockRunner::bind_loads(const Launch& launch, const ir::Shape& reference) {
  loads_.assign(block_->loads.size(), Accessor{});
  for (std::size_t i = 0; i < block_->loads.size(); ++i) {
    Accessor& a = loads_[i];
    ir::Shape shape;
    std::array<std::int64_t, kMaxRank> strides{};
    const HostTensor* t = nullptr;
    if (std::string e = load_layout(launch, block_->loads[i], shape, strides, t); !e.empty()) return e;
    if (std::string e = map_onto(shape, strides, reference, a.stride, nullptr); !e.empty())
      return fmt::format("load {}: {}", i, e);
    a.base = const_cast<std::byte*>(t->data());
    a.dtype = t->dtype();
    a.esize = t->dtype().size_bytes();
  }
  return {};
}

// Each store's accessor (masked when the output broadcasts over the reference); stores of
// outputs the caller already filled (`written`) are marked done.
std::string BlockRunner::bind_stores(const Launch& launch, const ir::Shape& reference,
                                     std::span<const std::uint32_t> written) {
  stores_.assign(block_->stores.size(), Accessor{});
  store_done_.assign(block_->stores.size(), false);
  for (std::size_t i = 0; i < block_->stores.size(); ++i) {
    const CStore& s = block_->stores[i];
    Accessor& a = stores_[i];
    if (!launch.outputs[s.output]) return fmt::format("output {} not allocated", s.output);
    const HostTensor& t = *launch.outputs[s.output];
    if (t.shape().size() > kMaxRank)
      return fmt::format("output {} rank {} above {}", s.output, t.shape().size(), kMaxRank);
    bool bc = false;
    if (std::string e = map_onto(t.shape(), row_major(t.shape()), reference, a.stride, &bc); !e.empty())
      return fmt::format("output {}: {}", s.output, e);
    a.masked = bc;
    a.base = t.mutable_data();
    a.dtype = t.dtype();
    a.esize = t.dtype().size_bytes();
    for (std::uint32_t w : written)
      if (w == s.output) store_done_[i] = true;
  }
  return {};
}

// Coalesces the iteration space: drops size-1 dims, merges neighbours that every accessor walks
// contiguously (row-major flat positions are unchanged, so chunks keep their meaning); then
// marks each accessor contiguous, zero-stride (broadcast of one element) and aliasable.
void BlockRunner::coalesce(const ir::Shape& reference) {
  std::vector<Accessor*> all;
  for (Accessor& a : loads_) all.push_back(&a);
  for (Accessor& a : stores_) all.push_back(&a);
  rank_ = 0;
  std::array<std::uint64_t, kMaxRank> dims{};
  std::vector<std::array<std::int64_t, kMaxRank>> st(all.size());
  for (std::size_t d = 0; d < reference.size(); ++d) {
    if (reference[d] == 1) continue;
    bool merge = rank_ > 0;
    for (std::size_t k = 0; merge && k < all.size(); ++k)
      merge = st[k][rank_ - 1] == all[k]->stride[d] * static_cast<std::int64_t>(reference[d]);
    if (merge) {
      dims[rank_ - 1] *= reference[d];
      for (std::size_t k = 0; k < all.size(); ++k) st[k][rank_ - 1] = all[k]->stride[d];
    } else {
      dims[rank_] = reference[d];
      for (std::size_t k = 0; k < all.size(); ++k) st[k][rank_] = all[k]->stride[d];
      ++rank_;
    }
  }
  if (rank_ == 0) {
    rank_ = 1;
    dims[0] = 1;
    for (auto& s : st) s[0] = 0;
  }
  dims_ = dims;
  std::array<std::int64_t, kMaxRank> contiguous{};
  std::int64_t acc = 1;
  for (int d = rank_; d-- > 0;) {
    contiguous[d] = acc;
    acc *= static_cast<std::int64_t>(dims_[d]);
  }
  for (std::size_t k = 0; k < all.size(); ++k) {
    Accessor& a = *all[k];
    a.stride = st[k];
    a.contiguous = true;
    a.zero = true;
    for (int d = 0; d < rank_; ++d) {
      if (dims_[d] == 1) continue;
      a.contiguous = a.contiguous && a.stride[d] == contiguous[d];
      a.zero = a.zero && a.stride[d] == 0;
    }
    if (numel_ <= 1) a.zero = false;  // a single element: contiguous
  }
  for (Accessor& a : loads_) a.alias = a.contiguous && stores_natively(a.dtype);
}

// An instruction writes straight into an output it is stored to when that output is fresh,
// contiguous, not broadcast and holds the class natively.
void BlockRunner::choose_direct_stores(const Launch& launch) {
  direct_.assign(block_->instrs.size(), -1);
  for (std::size_t i = 0; i < block_->instrs.size(); ++i) {
    const std::uint32_t reg = block_->instrs[i].out;
    if (preset_[reg]) continue;
    for (std::size_t s = 0; s < block_->stores.size(); ++s) {
      const CStore& cs = block_->stores[s];
      if (cs.reg != reg || store_done_[s]) continue;
      const Accessor& a = stores_[s];
      // An output in a consumed input's buffer may be written in place only once no later
      // instruction reads that input through an aliasing load (its chunk would be overwritten).
      bool safe = !launch.output_inplace[cs.output];
      if (!safe) {
        safe = true;
        for (std::size_t l = 0; l < loads_.size(); ++l)
          if (loads_[l].base == a.base && loads_[l].alias &&
              block_->last_read[block_->loads[l].reg] > static_cast<int>(i))
            safe = false;
      }
      if (a.contiguous && !a.masked && stores_natively(a.dtype) && safe && block_->regs[reg].fixup == Fixup::None) {
        direct_[i] = static_cast<std::int32_t>(s);
        store_done_[s] = true;
      }
      break;
    }
  }
}

// Per instruction: the kernel arguments that do not change from chunk to chunk.
void BlockRunner::bind_instruction_args(const Launch& launch) {
  proto_.assign(block_->instrs.size(), KArgs{});
  fix_.assign(block_->instrs.size(), false);
  for (std::size_t i = 0; i < block_->instrs.size(); ++i) {
    const CInstr& ins = block_->instrs[i];
    for (std::size_t k = 0; k < 2; ++k)
      if (ins.scalars[k] >= 0) proto_[i].s[k] = &launch.scalars[static_cast<std::size_t>(ins.scalars[k])];
    proto_[i].ins = &ins;
    fix_[i] = !ins.exact_out && block_->regs[ins.out].fixup != Fixup::None;
  }
}

// The Indexed program inputs (read at positions per element), then the shape of every indexed
// instruction checked against the reference.
std::string BlockRunner::bind_indexed(const Launch& launch, const ir::Shape& reference) {
  const fusion::FusedProgram& prog = *launch.program;
  indexed_.assign(prog.inputs.size(), IndexedRead{});
  if (!block_->has_indexed) return {};
  for (std::size_t i = 0; i < prog.inputs.size(); ++i) {
    if (prog.inputs[i].role != fusion::InputRole::Indexed) continue;
    if (!launch.inputs[i]) return fmt::format("indexed input {} not bound", i);
    const HostTensor& t = *launch.inputs[i];
    if (t.shape().size() > kMaxRank)
      return fmt::format("indexed input {} rank {} above {}", i, t.shape().size(), kMaxRank);
    IndexedRead& ir_ = indexed_[i];
    ir_.base = t.data();
    ir_.dtype = t.dtype();
    ir_.shape = t.shape();
    const auto rm = row_major(t.shape());
    for (std::size_t d = 0; d < t.shape().size(); ++d) ir_.strides[d] = static_cast<std::uint64_t>(rm[d]);
  }
  for (const CInstr& ins : block_->instrs) {
    if (ins.code != Code::Gather && ins.code != Code::Select && ins.code != Code::Cat) continue;
    if (std::string e = check_indexed_shape(ins, reference); !e.empty()) return e;
  }
  return {};
}

// The output shape of one gather / select / cat must broadcast to the block's reference.
std::string BlockRunner::check_indexed_shape(const CInstr& ins, const ir::Shape& reference) const {
  const std::size_t r = reference.size();
  const IndexedRead& x = indexed_[ins.inputs[0]];
  const std::string_view what = ins.code == Code::Gather ? "gather" : ins.code == Code::Select ? "select" : "cat";
  if (x.shape.size() != r || ins.dim < 0 || static_cast<std::size_t>(ins.dim) >= r)
    return fmt::format("{}: tensor {} along dim {} in a block of rank {}", what, ir::shape_to_string(x.shape), ins.dim,
                       r);
  const auto dim = static_cast<std::size_t>(ins.dim);
  ir::Shape out = x.shape;
  if (ins.code == Code::Gather) {
    const IndexedRead& idx = indexed_[ins.inputs[1]];
    if (idx.shape.size() != r)
      return fmt::format("gather: indices {} of rank other than {}", ir::shape_to_string(idx.shape), r);
    for (std::size_t d = 0; d < r; ++d)
      if (d != dim && idx.shape[d] > x.shape[d])
        return fmt::format("gather: indices {} exceed the tensor {} in dim {}", ir::shape_to_string(idx.shape),
                           ir::shape_to_string(x.shape), d);
    out = idx.shape;
  } else if (ins.code == Code::Select) {
    const IndexedRead& idx = indexed_[ins.inputs[1]];
    if (idx.shape.size() != 1) return fmt::format("select: indices {} not of rank 1", ir::shape_to_string(idx.shape));
    out[dim] = idx.shape[0];
  } else {
    std::uint64_t total = 0;
    for (std::uint32_t in : ins.inputs) {
      const IndexedRead& xi = indexed_[in];
      if (xi.shape.size() != r)
        return fmt::format("cat: part {} of rank other than {}", ir::shape_to_string(xi.shape), r);
      for (std::size_t d = 0; d < r; ++d)
        if (d != dim && xi.shape[d] != x.shape[d])
          return fmt::format("cat: parts {} and {} differ in dim {}", ir::shape_to_string(x.shape),
                             ir::shape_to_string(xi.shape), d);
      total += xi.shape[dim];
    }
    out[dim] = total;
  }
  for (std::size_t d = 0; d < r; ++d)
    if (out[d] != reference[d] && out[d] != 1)
      return fmt::format("{}: output {} does not broadcast to the block's {}", what, ir::shape_to_string(out),
                         ir::shape_to_string(reference));
  return {};
}

namespace {

// Walks the chunk [start, start + n) of the iteration space as runs along the innermost dim:
// f(element offset of the run's first element, index of that element in the innermost dim,
//   run length, position of the run in the chunk, outer indices all zero where `zero_dims`).
template <class F>
void walk(int rank, const std::array<std::uint64_t, kMaxRank>& dims, const std::array<std::int64_t, kMaxRank>& stride,
          std::uint64_t start, std::size_t n, F&& f) {
  std::array<std::uint64_t, kMaxRank> idx{};
  std::uint64_t rem = start;
  for (int d = rank; d-- > 0;) {
    idx[d] = rem % dims[d];
    rem /= dims[d];
  }
  std::size_t done = 0;
  const int last = rank - 1;
  while (done < n) {
    std::int64_t off = 0;
    bool outer_zero = true;
    for (int d = 0; d < last; ++d) {
      off += static_cast<std::int64_t>(idx[d]) * stride[d];
      if (stride[d] == 0 && idx[d] != 0) outer_zero = false;
    }
    off += static_cast<std::int64_t>(idx[last]) * stride[last];
    const std::size_t run = static_cast<std::size_t>(std::min<std::uint64_t>(dims[last] - idx[last], n - done));
    f(off, idx[last], run, done, outer_zero);
    done += run;
    idx[last] += run;
    for (int d = last; d > 0 && idx[d] == dims[d]; --d) {
      idx[d] = 0;
      ++idx[d - 1];
    }
  }
}

}  // namespace

std::uint64_t BlockRunner::streamed_bytes() const {
  std::uint64_t bytes = 0;
  for (const Accessor& a : loads_)
    if (!a.zero) bytes += numel_ * a.esize;
  for (const Accessor& a : stores_) bytes += numel_ * a.esize;
  return bytes;
}

bool BlockRunner::streams_outputs() const {
  const bool memory_bound = block_->instrs.size() <= 2 * (block_->loads.size() + block_->stores.size());
  return memory_bound && streamed_bytes() > kStreamingBytes;
}

bool BlockRunner::streamable_store(std::size_t s) const {
  const Accessor& a = stores_[s];
  const CStore& cs = block_->stores[s];
  return a.contiguous && !a.masked && stores_natively(a.dtype) && block_->regs[cs.reg].fixup == Fixup::None &&
         !launch_->output_inplace[cs.output] && !preset_[cs.reg];
}

void BlockRunner::use_streaming_stores() {
  for (std::size_t s = 0; s < stores_.size(); ++s) (void)stream_store(s);
}

bool BlockRunner::stream_store(std::size_t s) {
#if defined(__AVX__)
  if (!streamable_store(s)) return false;
  stores_[s].stream = true;
  // The instruction that wrote it in place now writes its scratch slot; the store copies.
  for (std::size_t i = 0; i < direct_.size(); ++i)
    if (direct_[i] == static_cast<std::int32_t>(s)) direct_[i] = -1;
  store_done_[s] = false;
  return true;
#else
  (void)s;
  return false;
#endif
}

void stream_fence() {
#if defined(__AVX__)
  _mm_sfence();
#endif
}

namespace {

// dst[0, bytes) = src with non-temporal stores where both are 32-byte aligned.
void stream_copy(std::byte* dst, const std::byte* src, std::size_t bytes) {
  std::size_t i = 0;
#if defined(__AVX__)
  if ((reinterpret_cast<std::uintptr_t>(dst) | reinterpret_cast<std::uintptr_t>(src)) % 32 == 0) {
    for (; i + 32 <= bytes; i += 32)
      _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i),
                          _mm256_load_si256(reinterpret_cast<const __m256i*>(src + i)));
  }
#endif
  if (i < bytes) std::memcpy(dst + i, src + i, bytes - i);
}

}  // namespace

void BlockRunner::gather(const Accessor& a, std::uint64_t start, std::size_t n, void* dst, VClass cls) const {
  if (a.zero) {
    load_elements(a.base, a.dtype, 0, n, dst, cls);
    return;
  }
  if (a.contiguous) {
    load_elements(a.base + start * a.esize, a.dtype, 1, n, dst, cls);
    return;
  }
  const std::size_t cs = class_size(cls);
  const std::int64_t inner = a.stride[rank_ - 1];
  walk(rank_, dims_, a.stride, start, n, [&](std::int64_t off, std::uint64_t, std::size_t run, std::size_t at, bool) {
    load_elements(a.base + off * static_cast<std::int64_t>(a.esize), a.dtype, inner, run,
                  static_cast<std::byte*>(dst) + at * cs, cls);
  });
}

void BlockRunner::scatter(const Accessor& a, std::uint64_t start, std::size_t n, const void* src, VClass cls) const {
  if (a.stream) {
    stream_copy(a.base + start * a.esize, static_cast<const std::byte*>(src), n * a.esize);
    return;
  }
  if (a.contiguous && !a.masked) {
    store_elements(src, cls, n, a.base + start * a.esize, a.dtype, 1);
    return;
  }
  const std::size_t cs = class_size(cls);
  const std::int64_t inner = a.stride[rank_ - 1];
  walk(rank_, dims_, a.stride, start, n,
       [&](std::int64_t off, std::uint64_t inner_idx, std::size_t run, std::size_t at, bool outer_zero) {
         if (a.masked) {
           // A broadcast output: only the positions whose broadcast indices are all 0 write (one
           // writer per element, no race between chunks).
           if (!outer_zero) return;
           if (inner == 0) {
             if (inner_idx != 0) return;
             run = 1;
           }
         }
         store_elements(static_cast<const std::byte*>(src) + at * cs, cls, run,
                        a.base + off * static_cast<std::int64_t>(a.esize), a.dtype, inner);
       });
}

namespace {

// Reads an index element; false when it is negative.
bool read_index(const std::byte* base, ir::DType d, std::uint64_t i, std::uint64_t& out) {
  if (d.is_int()) {
    const std::int64_t v = element::load_i64(base, d, i);
    if (v < 0) return false;
    out = static_cast<std::uint64_t>(v);
    return true;
  }
  out = element::load_u64(base, d, i);
  return true;
}

}  // namespace

// Reads run by run along the last dim: a Select's (along another dim) and a Cat's runs come from
// one input at a fixed stride (a Cat's also end where its input does, when it joins along the last
// dim); a Gather's index varies per element, so its runs are single elements.
std::optional<BlockRunner::IndexedRun> BlockRunner::indexed_run(const CInstr& ins,
                                                                const std::array<std::uint64_t, kMaxRank>& idx,
                                                                std::size_t row_left, std::uint64_t cat_total) const {
  const std::size_t r = reference_.size(), last = r - 1;
  const auto dim = static_cast<std::size_t>(ins.dim);
  const IndexedRead& x = indexed_[ins.inputs[0]];
  // q: the position in the read tensor (0 along its size-1 dims, which broadcast).
  std::array<std::uint64_t, kMaxRank> q{};
  auto offset = [&](const IndexedRead& from, std::uint64_t along) {
    std::uint64_t src = 0;
    for (std::size_t d = 0; d < r; ++d) src += (d == dim ? along : q[d]) * from.strides[d];
    return src;
  };
  IndexedRun run{&x};
  switch (ins.code) {
    case Code::Gather: {
      const IndexedRead& ix = indexed_[ins.inputs[1]];
      std::uint64_t at = 0;
      for (std::size_t d = 0; d < r; ++d) {
        q[d] = ix.shape[d] == 1 ? 0 : idx[d];
        at += q[d] * ix.strides[d];
      }
      std::uint64_t v = 0;
      if (!read_index(ix.base, ix.dtype, at, v) || v >= x.shape[dim]) return std::nullopt;
      run.src = offset(x, v);
      return run;
    }
    case Code::Select: {
      const IndexedRead& ix = indexed_[ins.inputs[1]];
      for (std::size_t d = 0; d < r; ++d) q[d] = (d == dim ? ix.shape[0] : x.shape[d]) == 1 ? 0 : idx[d];
      std::uint64_t v = 0;
      if (!read_index(ix.base, ix.dtype, q[dim], v) || v >= x.shape[dim]) return std::nullopt;
      run.src = offset(x, v);
      if (dim != last) {
        run.len = row_left;
        run.step = x.shape[last] == 1 ? 0 : static_cast<std::int64_t>(x.strides[last]);
      }
      return run;
    }
    case Code::Cat: {
      for (std::size_t d = 0; d < r; ++d) q[d] = (d == dim ? cat_total : x.shape[d]) == 1 ? 0 : idx[d];
      std::uint64_t along = q[dim];
      for (std::uint32_t in : ins.inputs) {
        const IndexedRead& xi = indexed_[in];
        if (along < xi.shape[dim]) {
          run.from = &xi;
          break;
        }
        along -= xi.shape[dim];
      }
      run.src = offset(*run.from, along);
      run.len = row_left;
      if ((last == dim ? cat_total : x.shape[last]) != 1) {
        run.step = static_cast<std::int64_t>(run.from->strides[last]);
        if (last == dim)
          run.len = static_cast<std::size_t>(std::min<std::uint64_t>(run.len, run.from->shape[dim] - along));
      }
      return run;
    }
    default: return std::nullopt;
  }
}

bool BlockRunner::run_indexed(const CInstr& ins, std::uint64_t start, std::size_t n, void* out) const {
  const std::size_t r = reference_.size();
  if (r == 0) return false;  // the builders give every indexed op a dim, so a rank >= 1
  const std::size_t last = r - 1;
  std::array<std::uint64_t, kMaxRank> idx{};
  std::uint64_t rem = start;
  for (std::size_t d = r; d-- > 0;) {
    idx[d] = rem % reference_[d];
    rem /= reference_[d];
  }
  std::uint64_t cat_total = 0;
  if (ins.code == Code::Cat)
    for (std::uint32_t in : ins.inputs) cat_total += indexed_[in].shape[static_cast<std::size_t>(ins.dim)];
  const std::size_t cs = class_size(ins.cls);
  for (std::size_t e = 0; e < n;) {
    const std::size_t row_left = static_cast<std::size_t>(std::min<std::uint64_t>(n - e, reference_[last] - idx[last]));
    const std::optional<IndexedRun> run = indexed_run(ins, idx, row_left, cat_total);
    if (!run) return false;
    load_elements(run->from->base + run->src * run->from->dtype.size_bytes(), run->from->dtype, run->step, run->len,
                  static_cast<std::byte*>(out) + e * cs, ins.cls);
    e += run->len;
    idx[last] += run->len;
    for (std::size_t d = last; d > 0 && idx[d] == reference_[d]; --d) {
      idx[d] = 0;
      ++idx[d - 1];
    }
  }
  return true;
}

bool parts_run_apart(const CBlock& cb, std::span<const Accessor> loads, std::span<const Accessor> stores,
                     std::uint64_t n) {
  if (!cb.split_into_parts() || n < kMinPartPositions) return false;
  if (loads.size() != cb.load_part.size() || stores.size() != cb.store_part.size()) return false;
  // Flat accessors only: what each touches is then one range.
  for (const Accessor& a : loads)
    if (!a.contiguous && !a.zero) return false;
  for (const Accessor& a : stores)
    if (!a.contiguous || a.masked) return false;
  auto range = [&](const Accessor& a) {
    const auto lo = reinterpret_cast<std::uintptr_t>(a.base);
    return std::pair{lo, lo + (a.zero ? 1 : n) * a.esize};
  };
  for (std::size_t s = 0; s < stores.size(); ++s) {
    const auto [s_lo, s_hi] = range(stores[s]);
    for (std::size_t l = 0; l < loads.size(); ++l) {
      if (cb.load_part[l] != kNoPart && cb.load_part[l] == cb.store_part[s]) continue;
      const auto [l_lo, l_hi] = range(loads[l]);
      if (l_lo < s_hi && s_lo < l_hi) return false;
    }
  }
  return true;
}

BlockRunner::BufferAccessors BlockRunner::accessors_of(const std::byte* buffer) const {
  BufferAccessors found;
  for (std::size_t l = 0; l < loads_.size(); ++l)
    if (loads_[l].base == buffer) {
      found.loads.push_back(static_cast<std::uint32_t>(l));
      found.contiguous = found.contiguous && loads_[l].contiguous && !loads_[l].zero;
    }
  for (std::size_t st = 0; st < stores_.size(); ++st)
    if (stores_[st].base == buffer) {
      found.stores.push_back(static_cast<std::uint32_t>(st));
      found.contiguous = found.contiguous && stores_[st].contiguous && !stores_[st].masked && !stores_[st].stream;
    }
  return found;
}

bool BlockRunner::run(std::uint64_t start, std::size_t n, std::byte* scratch, void** ptrs, std::uint32_t part) const {
  const CBlock& b = *block_;
  const std::size_t slot_bytes = kBlock * 8;
  // An instruction or store of another part is skipped (part == kNoPart: none is); the loads
  // are the part's own list (its broadcast loads included).
  auto other = [&](const std::vector<std::uint32_t>& parts, std::size_t i) {
    return part != kNoPart && parts[i] != part;
  };
  auto for_each_load = [&](auto&& f) {
    if (part == kNoPart) {
      for (std::size_t i = 0; i < b.loads.size(); ++i) f(i);
    } else {
      for (std::uint32_t i : b.loads_of_part(part)) f(i);
    }
  };
  if (prefetch_ && start + n < numel_) {
    // The next chunk of every contiguous input stream, into L2 (prefetcht1): a chunk's
    // operations run one after another, so without it a stream idles while the others are read
    // and DRAM latency is exposed at every chunk (W1 at 2^24: 0.98 -> 0.79 ns/elem, W3 2.37 ->
    // 1.70; prefetching into L1 instead evicts the chunk being computed and loses).
    const std::size_t next = static_cast<std::size_t>(std::min<std::uint64_t>(n, numel_ - start - n));
    for (std::size_t i = 0; i < loads_.size(); ++i) {
      const Accessor& a = loads_[i];
      if (!a.contiguous || a.zero || (part != kNoPart && b.load_part[i] != part)) continue;
      const std::byte* p = a.base + (start + n) * a.esize;
      for (std::size_t off = 0; off < next * a.esize; off += 64) __builtin_prefetch(p + off, 0, 2);
    }
  }
  for_each_load([&](std::size_t i) {
    const CLoad& l = b.loads[i];
    const Accessor& a = loads_[i];
    if (preset_[l.reg]) return;
    if (a.alias) {
      ptrs[l.reg] = a.base + start * a.esize;
    } else {
      void* dst = scratch + std::size_t{b.slot[l.reg]} * slot_bytes;
      gather(a, start, n, dst, b.regs[l.reg].cls);
      ptrs[l.reg] = dst;
    }
  });
  bool fail = false;
  for (std::size_t i = 0; i < b.instrs.size(); ++i) {
    if (other(b.instr_part, i)) continue;
    const CInstr& ins = b.instrs[i];
    void* out;
    if (direct_[i] >= 0) {
      const Accessor& a = stores_[static_cast<std::size_t>(direct_[i])];
      out = a.base + start * a.esize;
    } else {
      out = scratch + std::size_t{b.slot[ins.out]} * slot_bytes;
    }
    ptrs[ins.out] = out;
    if (ins.fn == nullptr) {
      if (!run_indexed(ins, start, n, out)) return false;
    } else {
      KArgs args = proto_[i];  // scalars and the instruction, bound by prepare()
      args.out = out;
      for (std::size_t k = 0; k < 3; ++k)
        if (ins.regs[k] >= 0) args.in[k] = ptrs[ins.regs[k]];
      args.n = n;
      args.fail = &fail;
      ins.fn(args);
      if (fail) return false;
    }
    if (fix_[i]) apply_fixup(out, b.regs[ins.out].cls, b.regs[ins.out].fixup, n);
  }
  for (std::size_t s = 0; s < b.stores.size(); ++s) {
    if (store_done_[s] || other(b.store_part, s)) continue;
    const CStore& cs = b.stores[s];
    scatter(stores_[s], start, n, ptrs[cs.reg], b.regs[cs.reg].cls);
  }
  return true;
}

// ---- Elementwise programs

std::string run_elementwise(const Launch& launch, bool* fault) {
  if (launch.jit != nullptr) {
    bool declined = false;
    std::string r = run_elementwise_jit(launch, fault, &declined);
    if (!declined) {
      if (r.empty() && !*fault && launch.jit_launches != nullptr)
        launch.jit_launches->fetch_add(1, std::memory_order_relaxed);
      return r;
    }
  }
  BlockRunner runner;
  const CBlock& cb = launch.compiled->blocks[0];
  if (std::string e = runner.prepare(launch, 0, launch.concrete(cb.reference)); !e.empty()) return e;
  const std::uint64_t n = runner.numel();
  // A memory-bound launch (at most ~2 instructions per stream: W1, W3) streaming from DRAM runs
  // short chunks, prefetches its input streams one chunk ahead and writes its outputs with
  // non-temporal stores. Compute-bound ones (W2: 11 instructions over 2 streams) keep long
  // chunks, whose per-instruction dispatch is 4x cheaper per element, and measured no gain
  // from prefetching or streaming stores.
  const bool streams = runner.streams_outputs();
  const std::size_t chunk = streams ? kStreamChunk : kBlock;
  if (streams) {
    runner.use_streaming_stores();
    runner.set_prefetch(true);
  }
  const std::uint64_t chunks = (n + chunk - 1) / chunk;
  // Independent parts one after another over each range (fused Adam: a parameter's streams at
  // a time instead of every parameter's), when no part writes what another reads.
  const bool apart = parts_run_apart(cb, runner.load_accessors(), runner.store_accessors(), n);
  const std::uint32_t passes = apart ? cb.parts : 1;
  std::atomic<bool> failed{false};
  auto body = [&](std::uint64_t b, std::uint64_t e) {
    Scratch scratch(runner.scratch_bytes());
    std::vector<void*> ptrs(runner.num_regs(), nullptr);
    for (std::uint32_t pass = 0; pass < passes && !failed.load(std::memory_order_relaxed); ++pass) {
      for (std::uint64_t c = b; c < e; ++c) {
        const std::uint64_t start = c * chunk;
        const std::size_t len = static_cast<std::size_t>(std::min<std::uint64_t>(chunk, n - start));
        if (!runner.run(start, len, scratch.data(), ptrs.data(), apart ? pass : kNoPart)) {
          failed.store(true, std::memory_order_relaxed);
          break;
        }
      }
    }
    if (streams) stream_fence();  // only a streaming launch wrote non-temporally
  };
  parallel_ranges(launch, chunks, kParallelThreshold / chunk / 2, body);
  if (failed.load(std::memory_order_relaxed)) {
    *fault = true;  // replayed op by op: nothing of this launch counts
    return {};
  }
  if (apart && launch.part_by_part != nullptr) launch.part_by_part->fetch_add(1, std::memory_order_relaxed);
  if (streams && launch.nontemporal_outputs != nullptr) {
    std::uint64_t streamed = 0;
    for (const Accessor& a : runner.store_accessors()) streamed += a.stream ? 1 : 0;
    if (streamed != 0) launch.nontemporal_outputs->fetch_add(streamed, std::memory_order_relaxed);
  }
  return {};
}

}  // namespace kiln::cpu::fast
