// Reference kernels: unary, binary and scalar arithmetic, comparisons, bitwise and bool logic,
// casts, clamp, mask_where, mask_fill and the float cross product.
//
// Every kernel loops over the output's elements, reads its operands in the compute domain of the
// input dtype (double, i64, u64 or bool; see reference_internal.h), applies the scalar function
// below and stores the result with the element codec (one rounding, or a wrap, to the output
// dtype).
#include <cmath>
#include <limits>
#include <optional>

#include "reference_internal.h"

namespace kiln::reference::kernels {
namespace {

using ir::OpKind;

// Round half to even (Burn's `round`, PyTorch's `round`), written out so that it does not depend
// on the floating-point environment's rounding mode.
double round_half_even(double x) {
  if (!std::isfinite(x)) return x;
  const double r = std::round(x);                                             // half away from zero
  if (std::fabs(x - std::trunc(x)) == 0.5) return 2.0 * std::round(x / 2.0);  // tie: the even neighbour
  return r;
}

// Floored remainder (sign of the divisor): fmod, then moved into the divisor's sign. This is
// PyTorch's `remainder` kernel; Burn's `remainder` has the same semantics.
double float_rem(double a, double b) {
  double r = std::fmod(a, b);
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

// Why an integer op could not produce a value.
struct IntFault {
  bool division_by_zero = false;
};

// Floored remainder of integers (sign of the divisor); b != 0. INT64_MIN % -1 would overflow in
// C++ and is 0 mathematically.
std::int64_t int_rem(std::int64_t a, std::int64_t b) {
  if (b == -1) return 0;
  std::int64_t r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

// Truncated division; b != 0. INT64_MIN / -1 wraps to INT64_MIN.
std::int64_t int_div(std::int64_t a, std::int64_t b) {
  if (b == -1) return wrap_sub(0, a);
  return a / b;
}

// x^e by squaring, wrapping. A negative exponent gives the truncation toward zero of the real
// power: 1 for x = 1, ±1 for x = -1, 0 for |x| > 1, and a division by zero for x = 0.
template <class T>
T int_pow(T x, T e, IntFault& fault) {
  if constexpr (std::is_signed_v<T>) {
    if (e < 0) {
      if (x == 0) {
        fault.division_by_zero = true;
        return 0;
      }
      if (x == 1) return 1;
      if (x == -1) return (e % 2 == 0) ? 1 : -1;
      return 0;
    }
  }
  std::uint64_t base = static_cast<std::uint64_t>(x);
  std::uint64_t exp = static_cast<std::uint64_t>(e);
  std::uint64_t acc = 1;
  while (exp != 0) {
    if (exp & 1) acc *= base;
    base *= base;
    exp >>= 1;
  }
  return static_cast<T>(acc);
}

// Shifts as PyTorch defines them for a `bits`-wide integer: a left shift by a negative amount or
// by at least `bits` gives 0; a right shift by such an amount gives the sign fill (-1 or 0) for
// signed values and 0 for unsigned ones. Values are held sign- or zero-extended in 64 bits and
// the store wraps them back to `bits`.
template <class T>
T shift_left(T a, T b, int bits) {
  if constexpr (std::is_signed_v<T>) {
    if (b < 0) return 0;
  }
  if (static_cast<std::uint64_t>(b) >= static_cast<std::uint64_t>(bits)) return 0;
  return static_cast<T>(static_cast<std::uint64_t>(a) << static_cast<int>(b));
}
template <class T>
T shift_right(T a, T b, int bits) {
  bool out_of_range = static_cast<std::uint64_t>(b) >= static_cast<std::uint64_t>(bits);
  if constexpr (std::is_signed_v<T>) {
    if (b < 0) out_of_range = true;
    if (out_of_range) return a < 0 ? -1 : 0;
  } else {
    if (out_of_range) return 0;
  }
  return a >> static_cast<int>(b);  // arithmetic for signed values (C++20)
}

// The value-producing binary ops, by kind (the scalar kinds map onto them).
enum class Arith {
  Add,
  Sub,
  Mul,
  Div,
  Rem,
  Pow,
  BitAnd,
  BitOr,
  BitXor,
  Shl,
  Shr,
  LogicAnd,
  LogicOr,
  LogicXor,
  ClampMin,
  ClampMax,
  Atan2,  // float only: atan2(lhs, rhs), lhs the y coordinate (torch.atan2(input, other))
  Hypot   // float only
};
enum class Cmp { Eq, Ne, Gt, Ge, Lt, Le };

std::optional<Arith> arith_of(OpKind k) {
  switch (k) {
    case OpKind::Numeric_Add:
    case OpKind::Numeric_AddScalar: return Arith::Add;
    case OpKind::Numeric_Sub:
    case OpKind::Numeric_SubScalar: return Arith::Sub;
    case OpKind::Numeric_Mul:
    case OpKind::Numeric_MulScalar: return Arith::Mul;
    case OpKind::Numeric_Div:
    case OpKind::Numeric_DivScalar: return Arith::Div;
    case OpKind::Numeric_Rem:
    case OpKind::Numeric_RemScalar: return Arith::Rem;
    case OpKind::Numeric_Powi:
    case OpKind::Numeric_PowiScalar:
    case OpKind::Float_Powf:
    case OpKind::Float_PowfScalar: return Arith::Pow;
    case OpKind::Int_BitwiseAnd:
    case OpKind::Int_BitwiseAndScalar: return Arith::BitAnd;
    case OpKind::Int_BitwiseOr:
    case OpKind::Int_BitwiseOrScalar: return Arith::BitOr;
    case OpKind::Int_BitwiseXor:
    case OpKind::Int_BitwiseXorScalar: return Arith::BitXor;
    case OpKind::Int_BitwiseLeftShift:
    case OpKind::Int_BitwiseLeftShiftScalar: return Arith::Shl;
    case OpKind::Int_BitwiseRightShift:
    case OpKind::Int_BitwiseRightShiftScalar: return Arith::Shr;
    case OpKind::Bool_And: return Arith::LogicAnd;
    case OpKind::Bool_Or: return Arith::LogicOr;
    case OpKind::Bool_Xor: return Arith::LogicXor;
    case OpKind::Numeric_ClampMin: return Arith::ClampMin;
    case OpKind::Numeric_ClampMax: return Arith::ClampMax;
    case OpKind::Float_ArcTan2: return Arith::Atan2;
    case OpKind::Float_Hypot: return Arith::Hypot;
    default: return std::nullopt;
  }
}

std::optional<Cmp> cmp_of(OpKind k) {
  switch (k) {
    case OpKind::Base_Equal:
    case OpKind::Base_EqualElem: return Cmp::Eq;
    case OpKind::Base_NotEqual:
    case OpKind::Base_NotEqualElem: return Cmp::Ne;
    case OpKind::Numeric_Greater:
    case OpKind::Numeric_GreaterElem: return Cmp::Gt;
    case OpKind::Numeric_GreaterEqual:
    case OpKind::Numeric_GreaterEqualElem: return Cmp::Ge;
    case OpKind::Numeric_Lower:
    case OpKind::Numeric_LowerElem: return Cmp::Lt;
    case OpKind::Numeric_LowerEqual:
    case OpKind::Numeric_LowerEqualElem: return Cmp::Le;
    default: return std::nullopt;
  }
}

// IEEE comparisons for floats (any comparison with NaN is false, != is true).
template <class T>
bool compare(Cmp c, T a, T b) {
  switch (c) {
    case Cmp::Eq: return a == b;
    case Cmp::Ne: return a != b;
    case Cmp::Gt: return a > b;
    case Cmp::Ge: return a >= b;
    case Cmp::Lt: return a < b;
    case Cmp::Le: return a <= b;
  }
  return false;
}

// One value-producing binary op in the domain T. `bits` is the integer width of the dtype (for
// shifts); integer division by zero sets fault and returns 0. Combinations arith_applies rejects
// never get here.
template <class T>
T arith(Arith op, T a, T b, int bits, IntFault& fault) {
  if constexpr (std::is_same_v<T, bool>) {
    switch (op) {
      case Arith::LogicAnd: return a && b;
      case Arith::LogicOr: return a || b;
      case Arith::LogicXor: return a != b;
      default: return false;  // unreachable: only Bool ops reach bool operands
    }
  } else if constexpr (std::is_same_v<T, double>) {
    (void)bits;
    (void)fault;
    switch (op) {
      case Arith::Add: return a + b;
      case Arith::Sub: return a - b;
      case Arith::Mul: return a * b;
      case Arith::Div: return a / b;  // IEEE: x/0 = ±inf, 0/0 = NaN
      case Arith::Rem: return float_rem(a, b);
      case Arith::Pow: return std::pow(a, b);
      case Arith::ClampMin: return a < b ? b : a;  // NaN input stays NaN
      case Arith::ClampMax: return a > b ? b : a;
      // C's atan2 (quadrants and signed zeros: atan2(±0, −0) = ±π, atan2(±0, +0) = ±0) and
      // hypot (no intermediate overflow; hypot(±inf, NaN) = +inf), as PyTorch's CPU kernels.
      case Arith::Atan2: return std::atan2(a, b);
      case Arith::Hypot: return std::hypot(a, b);
      default: return 0;  // unreachable: bitwise and bool ops never reach floats
    }
  } else {
    switch (op) {
      case Arith::Add: return wrap_add(a, b);
      case Arith::Sub: return wrap_sub(a, b);
      case Arith::Mul: return wrap_mul(a, b);
      case Arith::Div:
        if (b == 0) {
          fault.division_by_zero = true;
          return 0;
        }
        if constexpr (std::is_signed_v<T>)
          return int_div(a, b);
        else
          return a / b;
      case Arith::Rem:
        if (b == 0) {
          fault.division_by_zero = true;
          return 0;
        }
        if constexpr (std::is_signed_v<T>)
          return int_rem(a, b);
        else
          return a % b;
      case Arith::Pow: return int_pow<T>(a, b, fault);
      case Arith::BitAnd: return a & b;
      case Arith::BitOr: return a | b;
      case Arith::BitXor: return a ^ b;
      case Arith::Shl: return shift_left<T>(a, b, bits);
      case Arith::Shr: return shift_right<T>(a, b, bits);
      case Arith::ClampMin: return a < b ? b : a;
      case Arith::ClampMax: return a > b ? b : a;
      default: return 0;  // unreachable: bool ops never reach integers
    }
  }
}

// Which domains an Arith applies to: a guard on top of the family check, which already keeps
// bitwise ops to integers and logic ops to bools.
bool arith_applies(Arith op, Domain d) {
  switch (op) {
    case Arith::LogicAnd:
    case Arith::LogicOr:
    case Arith::LogicXor: return d == Domain::Bool;
    case Arith::BitAnd:
    case Arith::BitOr:
    case Arith::BitXor:
    case Arith::Shl:
    case Arith::Shr: return d == Domain::Int || d == Domain::UInt;
    case Arith::Atan2:
    case Arith::Hypot: return d == Domain::Float;
    default: return d != Domain::Bool;
  }
}

// The float functions of run_unary, computed in f64 (libm) and rounded once by the store;
// nullopt for a kind that is not a float unary function. Domain edges are C's (Annex F), which
// PyTorch's CPU kernels share: acos / asin outside [-1, 1], acosh below 1 and atanh outside
// [-1, 1] give NaN, atanh(±1) = ±inf (docs/spec/ir.md §5.6).
std::optional<double> float_unary(OpKind k, double v) {
  switch (k) {
    case OpKind::Numeric_Abs: return std::fabs(v);
    case OpKind::Numeric_Neg: return -v;
    // Burn's float_sign (Zeros, then MaskFill where x < 0 and x > 0): NaN and ±0 give 0.
    case OpKind::Numeric_Sign: return v > 0 ? 1.0 : (v < 0 ? -1.0 : 0.0);
    case OpKind::Float_Exp: return std::exp(v);
    case OpKind::Float_Log: return std::log(v);
    case OpKind::Float_Log1p: return std::log1p(v);
    case OpKind::Float_Erf: return std::erf(v);
    case OpKind::Float_Sqrt: return std::sqrt(v);
    case OpKind::Float_Cos: return std::cos(v);
    case OpKind::Float_Sin: return std::sin(v);
    case OpKind::Float_Tanh: return std::tanh(v);
    case OpKind::Float_Recip: return 1.0 / v;
    case OpKind::Float_Cosh: return std::cosh(v);
    case OpKind::Float_Sinh: return std::sinh(v);
    case OpKind::Float_Tan: return std::tan(v);
    case OpKind::Float_ArcCos: return std::acos(v);
    case OpKind::Float_ArcCosh: return std::acosh(v);
    case OpKind::Float_ArcSin: return std::asin(v);
    case OpKind::Float_ArcSinh: return std::asinh(v);
    case OpKind::Float_ArcTan: return std::atan(v);
    case OpKind::Float_ArcTanh: return std::atanh(v);
    case OpKind::Float_Round: return round_half_even(v);
    case OpKind::Float_Floor: return std::floor(v);
    case OpKind::Float_Ceil: return std::ceil(v);
    case OpKind::Float_Trunc: return std::trunc(v);
    default: return std::nullopt;
  }
}

Error division_by_zero(const Ctx& c) { return c.error(ErrorCode::Execution, "integer division by zero"); }

}  // namespace

// ---- Unary

Result<Outputs> run_unary(const Ctx& c) {
  const OpKind k = c.op.kind;
  const HostTensor& x = c.in[0];
  KILN_RETURN_IF_ERROR(expect_out_shape(c, 0, x.shape()));
  const bool to_bool = k == OpKind::Float_IsNan || k == OpKind::Float_IsInf;
  if (to_bool) {
    KILN_RETURN_IF_ERROR(expect_out_bool(c, 0));
  } else {
    KILN_RETURN_IF_ERROR(expect_out_dtype(c, 0, x.dtype()));
  }
  KILN_ASSIGN_OR_RETURN(HostTensor out, c.new_output());
  const std::uint64_t n = x.num_elements();
  const Domain d = domain_of(x.dtype());

  if (d == Domain::Float) {
    for (std::uint64_t i = 0; i < n; ++i) {
      const double v = x.get_f64(i);
      if (to_bool) {
        element::store_bool(out.mutable_data(), out.dtype(), i,
                            k == OpKind::Float_IsNan ? std::isnan(v) : std::isinf(v));
        continue;
      }
      const std::optional<double> r = float_unary(k, v);
      if (!r) return c.error(ErrorCode::DTypeMismatch, fmt::format("does not apply to {}", x.to_string()));
      element::store_f64(out.mutable_data(), out.dtype(), i, *r);
    }
    return single(std::move(out));
  }

  if (d == Domain::Bool) {
    if (k != OpKind::Bool_Not)
      return c.error(ErrorCode::DTypeMismatch, fmt::format("does not apply to {}", x.to_string()));
    for (std::uint64_t i = 0; i < n; ++i) element::store_bool(out.mutable_data(), out.dtype(), i, !x.get_bool(i));
    return single(std::move(out));
  }

  // Integers: wrap (abs and neg of the most negative value are itself, as in two's complement).
  return dispatch(d, [&]<class T>() -> Result<Outputs> {
    if constexpr (std::is_same_v<T, std::int64_t> || std::is_same_v<T, std::uint64_t>) {
      for (std::uint64_t i = 0; i < n; ++i) {
        const T v = load<T>(x, i);
        T r = 0;
        switch (k) {
          case OpKind::Numeric_Abs:
            if constexpr (std::is_signed_v<T>)
              r = v < 0 ? wrap_sub(T{0}, v) : v;
            else
              r = v;
            break;
          case OpKind::Numeric_Neg: r = wrap_sub(T{0}, v); break;
          case OpKind::Numeric_Sign:
            if constexpr (std::is_signed_v<T>)
              r = v > 0 ? 1 : (v < 0 ? -1 : 0);
            else
              r = v != 0 ? 1 : 0;
            break;
          case OpKind::Int_BitwiseNot: r = static_cast<T>(~v); break;
          default: return c.error(ErrorCode::DTypeMismatch, fmt::format("does not apply to {}", x.to_string()));
        }
        store<T>(out, i, r);
      }
      return single(std::move(out));
    } else {
      return c.error(ErrorCode::Internal, "unary: unexpected domain");
    }
  });
}

// ---- Binary (broadcasting, docs/spec/ir.md §4: equal ranks)

Result<Outputs> run_binary(const Ctx& c) {
  const OpKind k = c.op.kind;
  const HostTensor& a = c.in[0];
  const HostTensor& b = c.in[1];
  KILN_RETURN_IF_ERROR(expect_same_dtype(c, 0, 1));
  KILN_RETURN_IF_ERROR(expect_out_shape(c, 0, ir::shape::broadcast(a.shape(), b.shape())));
  const std::optional<Cmp> cmp = cmp_of(k);
  const std::optional<Arith> op = arith_of(k);
  if (!cmp && !op) return c.error(ErrorCode::Internal, "binary: unknown kind");
  const Domain d = domain_of(a.dtype());
  if (cmp) {
    KILN_RETURN_IF_ERROR(expect_out_bool(c, 0));
  } else {
    KILN_RETURN_IF_ERROR(expect_out_dtype(c, 0, a.dtype()));
    if (!arith_applies(*op, d))
      return c.error(ErrorCode::DTypeMismatch, fmt::format("does not apply to {}", a.to_string()));
  }
  KILN_ASSIGN_OR_RETURN(HostTensor out, c.new_output());
  const std::vector<std::uint64_t> ma = broadcast_map(a.shape(), out.shape());
  const std::vector<std::uint64_t> mb = broadcast_map(b.shape(), out.shape());
  const int bits = d == Domain::Int || d == Domain::UInt ? int_bits(a.dtype()) : 0;
  return dispatch(d, [&]<class T>() -> Result<Outputs> {
    IntFault fault;
    for (std::size_t i = 0; i < ma.size(); ++i) {
      const T x = load<T>(a, ma[i]);
      const T y = load<T>(b, mb[i]);
      if (cmp) {
        element::store_bool(out.mutable_data(), out.dtype(), i, compare<T>(*cmp, x, y));
      } else {
        store<T>(out, i, arith<T>(*op, x, y, bits, fault));
        if (fault.division_by_zero) return division_by_zero(c);
      }
    }
    return single(std::move(out));
  });
}

// ---- Cross{lhs, rhs, dim}: the cross product of the 3-vectors along dim, the other dims
// broadcast (docs/spec/ir.md §6.3; torch.linalg.cross). Float only: each component is computed in
// f64 from the two products (exact for f32 and narrower operands) and rounded once.

Result<Outputs> run_cross(const Ctx& c) {
  const HostTensor& a = c.in[0];
  const HostTensor& b = c.in[1];
  KILN_RETURN_IF_ERROR(expect_same_dtype(c, 0, 1));
  if (!a.dtype().is_float())
    return c.error(ErrorCode::DTypeMismatch, fmt::format("does not apply to {}", a.to_string()));
  KILN_RETURN_IF_ERROR(expect_out_shape(c, 0, ir::shape::broadcast(a.shape(), b.shape())));
  KILN_ASSIGN_OR_RETURN(std::size_t dim, axis_attr(c, 0, a.shape().size(), "dim"));
  if (a.shape()[dim] != 3 || b.shape()[dim] != 3)
    return c.error(ErrorCode::IncompatibleShapes, fmt::format("dim {} must have size 3 in both operands ({} x {})", dim,
                                                              a.to_string(), b.to_string()));
  KILN_RETURN_IF_ERROR(expect_out_dtype(c, 0, a.dtype()));
  KILN_ASSIGN_OR_RETURN(HostTensor out, c.new_output());
  const std::vector<std::uint64_t> ma = broadcast_map(a.shape(), out.shape());
  const std::vector<std::uint64_t> mb = broadcast_map(b.shape(), out.shape());
  // Element i with component 0 along dim has its components at i, i + inner, i + 2 inner.
  const std::uint64_t inner = dims_product(out.shape(), dim + 1, out.shape().size());
  for (std::uint64_t i = 0; i < ma.size(); ++i) {
    if ((i / inner) % 3 != 0) continue;  // ma is empty when inner is 0
    double x[3], y[3];
    for (std::uint64_t j = 0; j < 3; ++j) {
      x[j] = a.get_f64(ma[i + j * inner]);
      y[j] = b.get_f64(mb[i + j * inner]);
    }
    element::store_f64(out.mutable_data(), out.dtype(), i, x[1] * y[2] - x[2] * y[1]);
    element::store_f64(out.mutable_data(), out.dtype(), i + inner, x[2] * y[0] - x[0] * y[2]);
    element::store_f64(out.mutable_data(), out.dtype(), i + 2 * inner, x[0] * y[1] - x[1] * y[0]);
  }
  return single(std::move(out));
}

// ---- Scalar right-hand side: the scalar is converted to the operand's element type first.

Result<Outputs> run_scalar(const Ctx& c) {
  const OpKind k = c.op.kind;
  const HostTensor& a = c.in[0];
  KILN_RETURN_IF_ERROR(expect_out_shape(c, 0, a.shape()));
  const std::optional<Cmp> cmp = cmp_of(k);
  const std::optional<Arith> op = arith_of(k);
  if (!cmp && !op) return c.error(ErrorCode::Internal, "scalar: unknown kind");
  const Domain d = domain_of(a.dtype());
  if (cmp) {
    KILN_RETURN_IF_ERROR(expect_out_bool(c, 0));
  } else {
    KILN_RETURN_IF_ERROR(expect_out_dtype(c, 0, a.dtype()));
    if (!arith_applies(*op, d))
      return c.error(ErrorCode::DTypeMismatch, fmt::format("does not apply to {}", a.to_string()));
  }
  KILN_ASSIGN_OR_RETURN(HostTensor out, c.new_output());
  const int bits = d == Domain::Int || d == Domain::UInt ? int_bits(a.dtype()) : 0;
  return dispatch(d, [&]<class T>() -> Result<Outputs> {
    const T s = scalar_as<T>(c.op.scalars[0], a.dtype());
    IntFault fault;
    for (std::uint64_t i = 0; i < a.num_elements(); ++i) {
      const T x = load<T>(a, i);
      if (cmp) {
        element::store_bool(out.mutable_data(), out.dtype(), i, compare<T>(*cmp, x, s));
      } else {
        store<T>(out, i, arith<T>(*op, x, s, bits, fault));
        if (fault.division_by_zero) return division_by_zero(c);
      }
    }
    return single(std::move(out));
  });
}

// ---- Casts: the element codec's conversions (ir DType docs in tensor.h).

Result<Outputs> run_cast(const Ctx& c) {
  const HostTensor& x = c.in[0];
  const ir::DType target = c.out_ir().dtype;
  KILN_RETURN_IF_ERROR(expect_out_shape(c, 0, x.shape()));
  bool ok = false;
  switch (c.op.kind) {
    case OpKind::Base_Cast:
      ok = x.dtype().is_float() ? target.is_float() : x.dtype().is_integral() ? target.is_integral() : target.is_bool();
      break;
    case OpKind::Float_IntoInt:
    case OpKind::Bool_IntoInt: ok = target.is_integral(); break;
    case OpKind::Int_IntoFloat:
    case OpKind::Bool_IntoFloat: ok = target.is_float(); break;
    default: return c.error(ErrorCode::Internal, "cast: unknown kind");
  }
  if (!ok)
    return c.error(ErrorCode::DTypeMismatch, fmt::format("cannot convert {} to {}", x.dtype().name(), target.name()));
  KILN_ASSIGN_OR_RETURN(HostTensor out, c.new_output());
  return dispatch(domain_of(x.dtype()), [&]<class T>() -> Result<Outputs> {
    for (std::uint64_t i = 0; i < x.num_elements(); ++i) store<T>(out, i, load<T>(x, i));
    return single(std::move(out));
  });
}

// ---- Clamp: min first, then max (Burn's two mask_fills): NaN stays NaN; min > max gives max.

Result<Outputs> run_clamp(const Ctx& c) {
  const HostTensor& x = c.in[0];
  KILN_RETURN_IF_ERROR(expect_out_shape(c, 0, x.shape()));
  KILN_RETURN_IF_ERROR(expect_out_dtype(c, 0, x.dtype()));
  const Domain d = domain_of(x.dtype());
  if (d == Domain::Bool) return c.error(ErrorCode::DTypeMismatch, "does not apply to bool tensors");
  KILN_ASSIGN_OR_RETURN(HostTensor out, c.new_output());
  return dispatch(d, [&]<class T>() -> Result<Outputs> {
    const T lo = scalar_as<T>(c.op.scalars[0], x.dtype());
    const T hi = scalar_as<T>(c.op.scalars[1], x.dtype());
    for (std::uint64_t i = 0; i < x.num_elements(); ++i) {
      T v = load<T>(x, i);
      if (v < lo) v = lo;
      if (v > hi) v = hi;
      store<T>(out, i, v);
    }
    return single(std::move(out));
  });
}

// ---- MaskWhere{tensor, mask, value}: out = mask ? value : tensor, broadcast over all three.
// Elements are copied bit for bit (NaN payloads and signed zeros survive).

Result<Outputs> run_mask_where(const Ctx& c) {
  const HostTensor& t = c.in[0];
  const HostTensor& m = c.in[1];
  const HostTensor& v = c.in[2];
  if (!m.dtype().is_bool())
    return c.error(ErrorCode::DTypeMismatch, fmt::format("mask {} must be bool", m.to_string()));
  KILN_RETURN_IF_ERROR(expect_same_dtype(c, 0, 2));
  const ir::Shape shapes[] = {t.shape(), m.shape(), v.shape()};
  KILN_RETURN_IF_ERROR(expect_out_shape(c, 0, ir::shape::broadcast_many(shapes)));
  KILN_RETURN_IF_ERROR(expect_out_dtype(c, 0, t.dtype()));
  KILN_ASSIGN_OR_RETURN(HostTensor out, c.new_output());
  const std::vector<std::uint64_t> mt = broadcast_map(t.shape(), out.shape());
  const std::vector<std::uint64_t> mm = broadcast_map(m.shape(), out.shape());
  const std::vector<std::uint64_t> mv = broadcast_map(v.shape(), out.shape());
  for (std::size_t i = 0; i < mt.size(); ++i) {
    if (m.get_bool(mm[i])) {
      copy_element(v, mv[i], out, i);
    } else {
      copy_element(t, mt[i], out, i);
    }
  }
  return single(std::move(out));
}

// ---- MaskFill{tensor, mask, value}: out = mask ? value : tensor, broadcast(tensor, mask).

Result<Outputs> run_mask_fill(const Ctx& c) {
  const HostTensor& t = c.in[0];
  const HostTensor& m = c.in[1];
  if (!m.dtype().is_bool())
    return c.error(ErrorCode::DTypeMismatch, fmt::format("mask {} must be bool", m.to_string()));
  KILN_RETURN_IF_ERROR(expect_out_shape(c, 0, ir::shape::broadcast(t.shape(), m.shape())));
  KILN_RETURN_IF_ERROR(expect_out_dtype(c, 0, t.dtype()));
  KILN_ASSIGN_OR_RETURN(HostTensor out, c.new_output());
  const ElementBytes fill = scalar_element(c.op.scalars[0], t.dtype());
  const std::size_t width = static_cast<std::size_t>(t.dtype().size_bytes());
  const std::vector<std::uint64_t> mt = broadcast_map(t.shape(), out.shape());
  const std::vector<std::uint64_t> mm = broadcast_map(m.shape(), out.shape());
  for (std::size_t i = 0; i < mt.size(); ++i) {
    if (m.get_bool(mm[i])) {
      std::memcpy(out.mutable_data() + i * width, fill.bytes.data(), width);
    } else {
      copy_element(t, mt[i], out, i);
    }
  }
  return single(std::move(out));
}

}  // namespace kiln::reference::kernels
