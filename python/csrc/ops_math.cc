// Elementwise kernels: arithmetic, unary math, comparisons, logical ops, selection, and the backward
// kernels of the activations they define. Each follows PyTorch's type promotion (at::result_type: a
// Python number does not widen a tensor's dtype) and broadcasting (right-aligned; kiln's needs
// equal ranks, so operands are reshaped with leading 1s first), then queues the Session call.
#include <ATen/ExpandUtils.h>
#include <ATen/native/TypeProperties.h>
#include <ATen/ops/result_type.h>
#include <torch/library.h>

#include <string>

#include "state.h"
#include "tensor_impl.h"

namespace kiln::pytorch {
namespace {

using runtime::Session;
using Value = runtime::Tensor;
using BinaryFn = Result<Value> (Session::*)(Value, Value);
using ScalarFn = Result<Value> (Session::*)(Value, double);
using UnaryFn = Result<Value> (Session::*)(Value);

ir::DType kiln_type(c10::ScalarType t, std::string_view what) { return to_kiln_dtype(t, what); }

bool integral_or_bool(c10::ScalarType t) { return c10::isIntegralType(t, /*includeBool=*/true); }

// a ⊕ b in dtype `type`, broadcast: the Scalar form when b is a Python number (or any CPU 0-dim
// tensor), the tensor form otherwise.
at::Tensor binary(std::string_view what, const at::Tensor& a, const at::Tensor& b, c10::ScalarType type,
                  BinaryFn tensor_fn, ScalarFn scalar_fn) {
  if (type == c10::ScalarType::Bool) {
    // kiln's numeric ops exclude bool; PyTorch defines them on bool (add: or, mul: and, max, the
    // comparisons): computed in u8, a non-comparison's result cast back (nonzero → true).
    at::Tensor r = binary(what, a, b, c10::ScalarType::Byte, tensor_fn, scalar_fn);
    if (r.scalar_type() == c10::ScalarType::Bool) return r;
    return make_tensor(cast_to(value_of(r, what), ir::dtypes::boolean, what), r.sizes());
  }
  const std::vector<std::int64_t> sizes = at::infer_size(a.sizes(), b.sizes());
  const ir::DType d = kiln_type(type, what);
  Session& s = session();
  if (is_kiln(a)) {
    if (const std::optional<double> k = cpu_scalar(b)) {
      return make_tensor(value_or_throw((s.*scalar_fn)(operand(a, d, sizes.size(), what), *k), what), sizes);
    }
  }
  Value va = operand(a, d, sizes.size(), what);
  Value vb = operand(b, d, sizes.size(), what);
  return make_tensor(value_or_throw((s.*tensor_fn)(std::move(va), std::move(vb)), what), sizes);
}

at::Tensor unary(std::string_view what, const at::Tensor& a, c10::ScalarType type, UnaryFn fn) {
  Value v = operand(a, kiln_type(type, what), a.dim(), what);
  return make_tensor(value_or_throw((session().*fn)(std::move(v)), what), a.sizes());
}

// Float functions of integer tensors compute in the default float dtype, as PyTorch's.
at::Tensor unary_float(std::string_view what, const at::Tensor& a, UnaryFn fn) {
  const c10::ScalarType t = integral_or_bool(a.scalar_type()) ? default_float_dtype() : a.scalar_type();
  return unary(what, a, t, fn);
}

void check_not_bool(std::string_view what, const at::Tensor& a) {
  TORCH_CHECK(a.scalar_type() != c10::ScalarType::Bool, "kiln: ", what, " is not supported for bool tensors");
}

// ---- arithmetic

// a + alpha·b (sub: a − alpha·b).
at::Tensor add_sub(std::string_view what, const at::Tensor& a, const at::Tensor& b, const at::Scalar& alpha, bool sub) {
  const c10::ScalarType type = at::result_type(a, b);
  TORCH_CHECK(!sub || type != c10::ScalarType::Bool, "kiln: subtraction of bool tensors is not supported");
  const BinaryFn tensor_fn = sub ? static_cast<BinaryFn>(&Session::sub) : static_cast<BinaryFn>(&Session::add);
  const ScalarFn scalar_fn = sub ? static_cast<ScalarFn>(&Session::sub) : static_cast<ScalarFn>(&Session::add);
  const double k = alpha.toDouble();
  if (k == 1.0) return binary(what, a, b, type, tensor_fn, scalar_fn);
  const std::vector<std::int64_t> sizes = at::infer_size(a.sizes(), b.sizes());
  const bool boolean = type == c10::ScalarType::Bool;  // computed in u8, as binary() does
  const ir::DType d = kiln_type(boolean ? c10::ScalarType::Byte : type, what);
  Session& s = session();
  Value vb = value_or_throw(s.mul(operand(b, d, sizes.size(), what), k), what);
  Value r = value_or_throw((s.*tensor_fn)(operand(a, d, sizes.size(), what), std::move(vb)), what);
  return make_tensor(boolean ? cast_to(r, ir::dtypes::boolean, what) : std::move(r), sizes);
}

at::Tensor add_kernel(const at::Tensor& a, const at::Tensor& b, const at::Scalar& alpha) {
  return add_sub("add", a, b, alpha, false);
}
at::Tensor sub_kernel(const at::Tensor& a, const at::Tensor& b, const at::Scalar& alpha) {
  return add_sub("sub", a, b, alpha, true);
}
at::Tensor rsub_kernel(const at::Tensor& a, const at::Tensor& b, const at::Scalar& alpha) {
  return add_sub("rsub", b, a, alpha, true);
}
at::Tensor mul_kernel(const at::Tensor& a, const at::Tensor& b) {
  return binary("mul", a, b, at::result_type(a, b), &Session::mul, &Session::mul);
}

// True division: integer operands divide in the default float dtype.
at::Tensor div_kernel(const at::Tensor& a, const at::Tensor& b) {
  c10::ScalarType type = at::result_type(a, b);
  if (integral_or_bool(type)) type = default_float_dtype();
  return binary("div", a, b, type, &Session::div, &Session::div);
}

// div with rounding_mode "trunc" or "floor": a float quotient rounded; integers divide in f64
// (exact below 2^53) and are cast back, so that "floor" rounds toward −inf as PyTorch's does.
at::Tensor div_mode_kernel(const at::Tensor& a, const at::Tensor& b, std::optional<c10::string_view> mode) {
  if (!mode) return div_kernel(a, b);
  const bool floor = *mode == "floor";
  TORCH_CHECK(floor || *mode == "trunc", "kiln: div: rounding_mode must be 'trunc', 'floor' or None, not ", *mode);
  const c10::ScalarType type = at::result_type(a, b);
  const bool integral = integral_or_bool(type);
  const at::Tensor q = binary("div", a, b, integral ? c10::ScalarType::Double : type, &Session::div, &Session::div);
  Value v = value_of(q, "div");
  v = value_or_throw(floor ? session().floor(std::move(v)) : session().trunc(std::move(v)), "div");
  if (integral) v = cast_to(v, kiln_type(type, "div"), "div");
  return make_tensor(std::move(v), q.sizes());
}

at::Tensor neg_kernel(const at::Tensor& a) {
  check_not_bool("neg", a);
  return unary("neg", a, a.scalar_type(), &Session::neg);
}
at::Tensor abs_kernel(const at::Tensor& a) { return unary("abs", a, a.scalar_type(), &Session::abs); }
at::Tensor exp_kernel(const at::Tensor& a) { return unary_float("exp", a, &Session::exp); }
at::Tensor log_kernel(const at::Tensor& a) { return unary_float("log", a, &Session::log); }
at::Tensor sqrt_kernel(const at::Tensor& a) { return unary_float("sqrt", a, &Session::sqrt); }
at::Tensor rsqrt_kernel(const at::Tensor& a) { return unary_float("rsqrt", a, &Session::rsqrt); }
at::Tensor reciprocal_kernel(const at::Tensor& a) { return unary_float("reciprocal", a, &Session::recip); }
at::Tensor tanh_kernel(const at::Tensor& a) { return unary_float("tanh", a, &Session::tanh); }
// Session::sigmoid is Burn's decomposition, computed in f32 (docs/spec/ir.md §5.11); an f64 input gets
// 1 / (1 + exp(−x)) in f64 instead, to f64's accuracy as on PyTorch's CPU.
at::Tensor sigmoid_kernel(const at::Tensor& a) {
  constexpr std::string_view what = "sigmoid";
  if (a.scalar_type() != c10::ScalarType::Double) return unary_float(what, a, &Session::sigmoid);
  Session& s = session();
  Value t = value_or_throw(s.neg(operand(a, ir::dtypes::f64, a.dim(), what)), what);
  t = value_or_throw(s.exp(std::move(t)), what);
  t = value_or_throw(s.add(std::move(t), 1.0), what);
  return make_tensor(value_or_throw(s.recip(std::move(t)), what), a.sizes());
}
at::Tensor relu_kernel(const at::Tensor& a) {
  check_not_bool("relu", a);
  return unary("relu", a, a.scalar_type(), &Session::relu);
}

at::Tensor pow_scalar_kernel(const at::Tensor& a, const at::Scalar& e) {
  const c10::ScalarType type = at::result_type(a, e);
  TORCH_CHECK(!integral_or_bool(type) || e.toDouble() >= 0, "Integers to negative integer powers are not allowed.");
  Value v = operand(a, kiln_type(type, "pow"), a.dim(), "pow");
  return make_tensor(value_or_throw(session().pow(std::move(v), e.toDouble()), "pow"), a.sizes());
}
at::Tensor pow_tensor_kernel(const at::Tensor& a, const at::Tensor& b) {
  return binary("pow", a, b, at::result_type(a, b), &Session::pow, &Session::pow);
}

at::Tensor maximum_kernel(const at::Tensor& a, const at::Tensor& b) {
  return binary("maximum", a, b, at::result_type(a, b), &Session::maximum, &Session::maximum);
}
at::Tensor minimum_kernel(const at::Tensor& a, const at::Tensor& b) {
  return binary("minimum", a, b, at::result_type(a, b), &Session::minimum, &Session::minimum);
}

// clamp with either bound optional (a NaN input stays NaN, as in PyTorch).
at::Tensor clamp_kernel(const at::Tensor& a, const std::optional<at::Scalar>& lo, const std::optional<at::Scalar>& hi) {
  TORCH_CHECK(lo || hi, "torch.clamp: At least one of 'min' or 'max' must not be None");
  Session& s = session();
  Value v = operand(a, kiln_type(a.scalar_type(), "clamp"), a.dim(), "clamp");
  if (lo) v = value_or_throw(s.maximum(std::move(v), lo->toDouble()), "clamp");
  if (hi) v = value_or_throw(s.minimum(std::move(v), hi->toDouble()), "clamp");
  return make_tensor(std::move(v), a.sizes());
}
at::Tensor clamp_min_kernel(const at::Tensor& a, const at::Scalar& lo) { return clamp_kernel(a, lo, std::nullopt); }
at::Tensor clamp_max_kernel(const at::Tensor& a, const at::Scalar& hi) { return clamp_kernel(a, std::nullopt, hi); }

// clamp with tensor bounds (clamp.Tensor, clamp_min.Tensor, clamp_max.Tensor): self and the bounds
// in their common dtype (PyTorch's promotion over the three) and broadcast; the maximum with min
// first, then the minimum with max, so that min > max gives max, as PyTorch's. (A NaN bound
// gives self where PyTorch's gives NaN, as kiln's maximum and minimum do.)
at::Tensor clamp_tensor_kernel(const at::Tensor& a, const std::optional<at::Tensor>& lo,
                               const std::optional<at::Tensor>& hi) {
  const bool has_lo = lo.has_value() && lo->defined(), has_hi = hi.has_value() && hi->defined();
  TORCH_CHECK(has_lo || has_hi, "torch.clamp: At least one of 'min' or 'max' must not be None");
  at::native::ResultTypeState state;
  state = at::native::update_result_type_state(a, state);
  if (has_lo) state = at::native::update_result_type_state(*lo, state);
  if (has_hi) state = at::native::update_result_type_state(*hi, state);
  const c10::ScalarType type = at::native::result_type(state);
  at::Tensor r = a;
  if (has_lo) r = binary("clamp", r, *lo, type, &Session::maximum, &Session::maximum);
  if (has_hi) r = binary("clamp", r, *hi, type, &Session::minimum, &Session::minimum);
  return r;
}
at::Tensor clamp_min_tensor_kernel(const at::Tensor& a, const at::Tensor& lo) {
  return clamp_tensor_kernel(a, lo, std::nullopt);
}
at::Tensor clamp_max_tensor_kernel(const at::Tensor& a, const at::Tensor& hi) {
  return clamp_tensor_kernel(a, std::nullopt, hi);
}

// ---- comparisons (→ bool), computed in the promoted dtype of the operands.

template <BinaryFn TensorFn, ScalarFn ScalarFn_>
at::Tensor compare(const at::Tensor& a, const at::Tensor& b) {
  return binary("comparison", a, b, at::result_type(a, b), TensorFn, ScalarFn_);
}
template <ScalarFn Fn>
at::Tensor compare_scalar(const at::Tensor& a, const at::Scalar& k) {
  const c10::ScalarType promoted = at::result_type(a, k);
  // bool operands compare as u8 (kiln's comparisons exclude bool, as its numeric ops)
  const c10::ScalarType type = promoted == c10::ScalarType::Bool ? c10::ScalarType::Byte : promoted;
  Value v = operand(a, kiln_type(type, "comparison"), a.dim(), "comparison");
  return make_tensor(value_or_throw((session().*Fn)(std::move(v), k.toDouble()), "comparison"), a.sizes());
}

// ---- logical ops (→ bool): each operand taken as "nonzero" (NaN is true), broadcast.

// t as bool in a result of rank `rank`: a kiln tensor cast (x != 0) and rank-aligned; a CPU scalar
// as a [1,..,1] constant.
Value truth(const at::Tensor& t, std::size_t rank, std::string_view what) {
  if (const std::optional<double> k = cpu_scalar(t)) {
    return value_or_throw(session().full(ir::Shape(rank == 0 ? 1 : rank, 1), *k != 0 ? 1.0 : 0.0, ir::dtypes::boolean),
                          what);
  }
  return operand(t, ir::dtypes::boolean, rank, what);
}

template <BinaryFn Fn>
at::Tensor logical(const at::Tensor& a, const at::Tensor& b) {
  constexpr std::string_view what = "logical";
  const std::vector<std::int64_t> sizes = at::infer_size(a.sizes(), b.sizes());
  Value va = truth(a, sizes.size(), what);
  Value vb = truth(b, sizes.size(), what);
  return make_tensor(value_or_throw((session().*Fn)(std::move(va), std::move(vb)), what), sizes);
}

at::Tensor logical_not_kernel(const at::Tensor& a) {
  constexpr std::string_view what = "logical_not";
  return make_tensor(value_or_throw(session().not_(truth(a, a.dim(), what)), what), a.sizes());
}

// isnan: kiln's IsNan for floats; integers and bool are never NaN.
at::Tensor isnan_kernel(const at::Tensor& a) {
  constexpr std::string_view what = "isnan";
  if (c10::isFloatingType(a.scalar_type()))
    return make_tensor(value_or_throw(session().is_nan(value_of(a, what)), what), a.sizes());
  const ir::Shape shape = kiln_shape(a.sizes());
  Session& s = session();
  Value none = value_or_throw(
      a.numel() == 0 ? s.empty(shape, ir::dtypes::boolean) : s.full(shape, 0.0, ir::dtypes::boolean), what);
  return make_tensor(std::move(none), a.sizes());
}

// sign (and sgn, the same for real dtypes; abs's backward): −1, 0 or 1 (NaN: 0, as PyTorch's); a
// bool is its own sign.
at::Tensor sign_kernel(const at::Tensor& a) {
  if (a.scalar_type() == c10::ScalarType::Bool) return make_tensor(value_of(a, "sign"), a.sizes());
  return unary("sign", a, a.scalar_type(), &Session::sign);
}

// ---- selection

// where(cond, a, b): cond ? a : b = kiln's mask_where(b, cond, a), every operand broadcast to the
// result first (kiln's MaskWhere broadcasts the tensor with the mask only).
at::Tensor where_kernel(const at::Tensor& cond, const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(cond.scalar_type() == c10::ScalarType::Bool, "where expected condition to be a boolean tensor, but got ",
              cond.scalar_type());
  const std::vector<std::int64_t> sizes = at::infer_size(cond.sizes(), at::infer_size(a.sizes(), b.sizes()));
  const ir::DType d = kiln_type(at::result_type(a, b), "where");
  const ir::Shape shape = kiln_shape(sizes);
  Session& s = session();
  auto full_size = [&](const at::Tensor& t, ir::DType dt) {
    Value v = operand(t, dt, sizes.size(), "where");
    if (v.shape() == shape) return v;
    return value_or_throw(s.expand(std::move(v), shape), "where");
  };
  Value out =
      value_or_throw(s.mask_where(full_size(b, d), full_size(cond, ir::dtypes::boolean), full_size(a, d)), "where");
  return make_tensor(std::move(out), sizes);
}

at::Tensor masked_fill_kernel(const at::Tensor& a, const at::Tensor& mask, const at::Scalar& value) {
  TORCH_CHECK(mask.scalar_type() == c10::ScalarType::Bool,
              "masked_fill only supports boolean masks, but got mask "
              "with dtype ",
              mask.scalar_type());
  // The result has the broadcast shape of input and mask (a mask may broadcast the input, as on
  // PyTorch's CPU); kiln's MaskFill broadcasts the mask only, so the input is expanded first.
  const std::vector<std::int64_t> sizes = at::infer_size(a.sizes(), mask.sizes());
  const ir::DType d = kiln_type(a.scalar_type(), "masked_fill");
  Session& s = session();
  Value m = operand(mask, ir::dtypes::boolean, sizes.size(), "masked_fill");
  Value v = operand(a, d, sizes.size(), "masked_fill");
  if (const ir::Shape shape = kiln_shape(sizes); v.shape() != shape) {
    v = value_or_throw(s.expand(std::move(v), shape), "masked_fill");
  }
  return make_tensor(value_or_throw(s.mask_fill(std::move(v), std::move(m), value.toDouble()), "masked_fill"), sizes);
}

// ---- composites the optimizers and activations' backward passes use

// self + value·t1·t2 (addcmul) or self + value·t1/t2 (addcdiv).
at::Tensor addc(std::string_view what, const at::Tensor& self, const at::Tensor& t1, const at::Tensor& t2,
                const at::Scalar& value, bool divide) {
  const at::Tensor prod = divide ? div_kernel(t1, t2) : mul_kernel(t1, t2);
  return add_sub(what, self, prod, value, false);
}
at::Tensor addcmul_kernel(const at::Tensor& s, const at::Tensor& a, const at::Tensor& b, const at::Scalar& v) {
  return addc("addcmul", s, a, b, v, false);
}
at::Tensor addcdiv_kernel(const at::Tensor& s, const at::Tensor& a, const at::Tensor& b, const at::Scalar& v) {
  return addc("addcdiv", s, a, b, v, true);
}
// self + weight·(end − self)
at::Tensor lerp_kernel(const at::Tensor& self, const at::Tensor& end, const at::Scalar& weight) {
  return add_sub("lerp", self, sub_kernel(end, self, 1), weight, false);
}

// lerp with a tensor weight, all three broadcast (one float dtype, as PyTorch requires): PyTorch's
// two forms, self + weight·(end − self) where |weight| < 0.5, else end − (end − self)·(1 − weight)
// (exact at weight 1).
at::Tensor lerp_tensor_kernel(const at::Tensor& self, const at::Tensor& end, const at::Tensor& weight) {
  constexpr std::string_view what = "lerp";
  TORCH_CHECK(self.scalar_type() == end.scalar_type(), "expected dtype ", self.scalar_type(),
              " for `end` but got dtype ", end.scalar_type());
  TORCH_CHECK(self.scalar_type() == weight.scalar_type(), "expected dtype ", self.scalar_type(),
              " for `weight` but got dtype ", weight.scalar_type());
  TORCH_CHECK(c10::isFloatingType(self.scalar_type()), "\"lerp_kernel_tensor\" not implemented for '",
              self.scalar_type(), "'");
  const std::vector<std::int64_t> sizes = at::infer_size(at::infer_size(self.sizes(), end.sizes()), weight.sizes());
  const std::size_t rank = sizes.size();
  const ir::DType d = kiln_type(self.scalar_type(), what);
  const ir::Shape shape = kiln_shape(sizes);
  Session& s = session();
  Value a = operand(self, d, rank, what);
  Value b = operand(end, d, rank, what);
  Value w = operand(weight, d, rank, what);
  Value diff = value_or_throw(s.sub(b, a), what);
  Value small = value_or_throw(s.add(a, value_or_throw(s.mul(w, diff), what)), what);
  Value one_minus_w = value_or_throw(s.add(value_or_throw(s.neg(w), what), 1.0), what);
  Value large = value_or_throw(s.sub(b, value_or_throw(s.mul(diff, std::move(one_minus_w)), what)), what);
  Value is_small = value_or_throw(s.lt(value_or_throw(s.abs(w), what), 0.5), what);
  // kiln's MaskWhere broadcasts the tensor with the mask only: every operand at the result's shape
  auto full_size = [&](Value v) {
    if (v.shape() == shape) return v;
    return value_or_throw(s.expand(std::move(v), shape), what);
  };
  Value out = value_or_throw(
      s.mask_where(full_size(std::move(large)), full_size(std::move(is_small)), full_size(std::move(small))), what);
  return make_tensor(std::move(out), sizes);
}

// grad where self > threshold, else 0 (relu's backward).
at::Tensor threshold_backward_kernel(const at::Tensor& grad, const at::Tensor& self, const at::Scalar& threshold) {
  const std::vector<std::int64_t> sizes = at::infer_size(grad.sizes(), self.sizes());
  const ir::DType d = kiln_type(at::result_type(grad, self), "threshold_backward");
  Session& s = session();
  Value m = value_or_throw(s.le(operand(self, d, sizes.size(), "threshold_backward"), threshold.toDouble()),
                           "threshold_backward");
  Value g = operand(grad, d, sizes.size(), "threshold_backward");
  return make_tensor(value_or_throw(s.mask_fill(std::move(g), std::move(m), 0.0), "threshold_backward"), sizes);
}

// grad · y · (1 − y), y = sigmoid(x)
at::Tensor sigmoid_backward_kernel(const at::Tensor& grad, const at::Tensor& y) {
  Session& s = session();
  const ir::DType d = kiln_type(y.scalar_type(), "sigmoid_backward");
  Value vy = operand(y, d, y.dim(), "sigmoid_backward");
  Value one_minus = value_or_throw(s.add(value_or_throw(s.neg(vy), "sigmoid_backward"), 1.0), "sigmoid_backward");
  Value dy = value_or_throw(s.mul(vy, std::move(one_minus)), "sigmoid_backward");
  return mul_kernel(grad, make_tensor(std::move(dy), y.sizes()));
}

// grad · (1 − y²), y = tanh(x)
at::Tensor tanh_backward_kernel(const at::Tensor& grad, const at::Tensor& y) {
  Session& s = session();
  const ir::DType d = kiln_type(y.scalar_type(), "tanh_backward");
  Value vy = operand(y, d, y.dim(), "tanh_backward");
  Value sq = value_or_throw(s.mul(vy, vy), "tanh_backward");
  Value dy = value_or_throw(s.add(value_or_throw(s.neg(std::move(sq)), "tanh_backward"), 1.0), "tanh_backward");
  return mul_kernel(grad, make_tensor(std::move(dy), y.sizes()));
}

// Inside the namespace so that these names hide the C library's (exp, log, abs, ...).
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  using S = Session;
  m.impl("add.Tensor", TORCH_FN(add_kernel));
  m.impl("sub.Tensor", TORCH_FN(sub_kernel));
  m.impl("rsub.Tensor", TORCH_FN(rsub_kernel));
  m.impl("mul.Tensor", TORCH_FN(mul_kernel));
  m.impl("div.Tensor", TORCH_FN(div_kernel));
  m.impl("div.Tensor_mode", TORCH_FN(div_mode_kernel));
  m.impl("neg", TORCH_FN(neg_kernel));
  m.impl("abs", TORCH_FN(abs_kernel));
  m.impl("exp", TORCH_FN(exp_kernel));
  m.impl("log", TORCH_FN(log_kernel));
  m.impl("sqrt", TORCH_FN(sqrt_kernel));
  m.impl("rsqrt", TORCH_FN(rsqrt_kernel));
  m.impl("reciprocal", TORCH_FN(reciprocal_kernel));
  m.impl("tanh", TORCH_FN(tanh_kernel));
  m.impl("sigmoid", TORCH_FN(sigmoid_kernel));
  m.impl("relu", TORCH_FN(relu_kernel));
  m.impl("pow.Tensor_Scalar", TORCH_FN(pow_scalar_kernel));
  m.impl("pow.Tensor_Tensor", TORCH_FN(pow_tensor_kernel));
  m.impl("maximum", TORCH_FN(maximum_kernel));
  m.impl("minimum", TORCH_FN(minimum_kernel));
  m.impl("clamp", TORCH_FN(clamp_kernel));
  m.impl("clamp_min", TORCH_FN(clamp_min_kernel));
  m.impl("clamp_max", TORCH_FN(clamp_max_kernel));
  m.impl("clamp.Tensor", TORCH_FN(clamp_tensor_kernel));
  m.impl("clamp_min.Tensor", TORCH_FN(clamp_min_tensor_kernel));
  m.impl("clamp_max.Tensor", TORCH_FN(clamp_max_tensor_kernel));
  m.impl("eq.Tensor", TORCH_FN((compare<&S::eq, &S::eq>)));
  m.impl("ne.Tensor", TORCH_FN((compare<&S::ne, &S::ne>)));
  m.impl("lt.Tensor", TORCH_FN((compare<&S::lt, &S::lt>)));
  m.impl("le.Tensor", TORCH_FN((compare<&S::le, &S::le>)));
  m.impl("gt.Tensor", TORCH_FN((compare<&S::gt, &S::gt>)));
  m.impl("ge.Tensor", TORCH_FN((compare<&S::ge, &S::ge>)));
  m.impl("eq.Scalar", TORCH_FN(compare_scalar<&S::eq>));
  m.impl("ne.Scalar", TORCH_FN(compare_scalar<&S::ne>));
  m.impl("lt.Scalar", TORCH_FN(compare_scalar<&S::lt>));
  m.impl("le.Scalar", TORCH_FN(compare_scalar<&S::le>));
  m.impl("gt.Scalar", TORCH_FN(compare_scalar<&S::gt>));
  m.impl("ge.Scalar", TORCH_FN(compare_scalar<&S::ge>));
  m.impl("logical_and", TORCH_FN((logical<&S::and_>)));
  m.impl("logical_or", TORCH_FN((logical<&S::or_>)));
  m.impl("logical_xor", TORCH_FN((logical<&S::xor_>)));
  m.impl("logical_not", TORCH_FN(logical_not_kernel));
  m.impl("isnan", TORCH_FN(isnan_kernel));
  m.impl("sign", TORCH_FN(sign_kernel));
  m.impl("sgn", TORCH_FN(sign_kernel));
  m.impl("where.self", TORCH_FN(where_kernel));
  m.impl("masked_fill.Scalar", TORCH_FN(masked_fill_kernel));
  m.impl("addcmul", TORCH_FN(addcmul_kernel));
  m.impl("addcdiv", TORCH_FN(addcdiv_kernel));
  m.impl("lerp.Scalar", TORCH_FN(lerp_kernel));
  m.impl("lerp.Tensor", TORCH_FN(lerp_tensor_kernel));
  m.impl("threshold_backward", TORCH_FN(threshold_backward_kernel));
  m.impl("sigmoid_backward", TORCH_FN(sigmoid_backward_kernel));
  m.impl("tanh_backward", TORCH_FN(tanh_backward_kernel));
}

}  // namespace
}  // namespace kiln::pytorch
