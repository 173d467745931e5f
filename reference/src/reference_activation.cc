// Reference kernels: the Activation group (docs/spec/ir.md §5.9), float only.
//
// Burn's fusion client decomposes activations into primitive ops (§5.11: the Session's relu,
// gelu, sigmoid and softmax emit those), so these kinds arrive from router / remote clients.
// Their values are those of Burn's default ActivationOps, computed in f64 in forms that do not
// overflow on the way and rounded once to the dtype by the store:
//
//   Relu(x)                         x <= 0 ? +0 : x (NaN stays NaN)
//   Gelu(x)                         x (1 + erf(x / √2)) / 2, the erf form; Gelu(−inf) is NaN
//                                   (−inf · 0), as Burn's sequence, PyTorch and Session::gelu give
//   Sigmoid(x)                      1 / (1 + e^−x), as e^x / (1 + e^x) for x < 0
//   LogSigmoid(x)                   −softplus(−x) = min(x, 0) − log1p(e^−|x|)
//   ReluBackward{output, grad}      output <= 0 ? +0 : grad
//   GeluBackward{x, grad}           grad · d/dx of the tanh approximation 0.5 x (1 + tanh u),
//                                   u = √(2/π) (x + 0.044715 x³) (Burn's gelu_backward, whose
//                                   constants are these rounded to six digits); the limits 1 and 0
//                                   where sech² u underflows, not inf · 0
//   SigmoidBackward{output, grad}   grad · output (1 − output)
//   LogSigmoidBackward{x, grad}     grad · sigmoid(−x) (PyTorch's form: 1 at −inf, 0 at +inf)
//   PRelu{x, alpha}                 x < 0 ? x · alpha : x, alpha broadcast (−0 stays −0)
//   LeakyRelu{x, slope}             x < 0 ? x · slope : x
//   HardSigmoid{x, alpha, beta}     clamp(alpha x + beta, 0, 1) (NaN stays NaN)
//   Softmax / LogSoftmax / Softmin  along the axis, the line's maximum subtracted first; a NaN or
//                                   a +inf in a line, or a line of −inf, makes it all NaN (as in
//                                   PyTorch); Softmin(x) = Softmax(−x)
//
// Scalars are converted to the operand's dtype first, as in every scalar kernel.
#include <cmath>
#include <limits>
#include <optional>

#include "reference_internal.h"

namespace kiln::reference::kernels {
namespace {

using ir::OpKind;

double sigmoid(double v) {
  if (v >= 0) return 1.0 / (1.0 + std::exp(-v));
  const double e = std::exp(v);  // NaN lands here and stays NaN
  return e / (1.0 + e);
}

// The derivative of the tanh approximation of Gelu (see the file comment).
double gelu_tanh_derivative(double v) {
  constexpr double kC = 0.7978845608028654;  // √(2/π)
  constexpr double kA = 0.044715;
  const double t = std::tanh(kC * (v + kA * v * v * v));
  const double sech2 = 1.0 - t * t;
  // Where sech² is 0 the second term's limit is 0; computing it would give inf · 0 for |x| whose
  // cube overflows (and for ±inf).
  const double slope = sech2 == 0 ? 0.0 : 0.5 * v * kC * (1.0 + 3.0 * kA * v * v) * sech2;
  return 0.5 * (1.0 + t) + slope;
}

std::optional<double> unary_activation(OpKind k, double v) {
  switch (k) {
    case OpKind::Activation_Relu: return v <= 0 ? 0.0 : v;
    case OpKind::Activation_Gelu: return v * (1.0 + std::erf(v / std::sqrt(2.0))) / 2.0;
    case OpKind::Activation_Sigmoid: return sigmoid(v);
    case OpKind::Activation_LogSigmoid: return (v < 0 ? v : 0.0) - std::log1p(std::exp(-std::fabs(v)));
    default: return std::nullopt;
  }
}

// lhs is the forward output (Relu, Sigmoid), the forward input (Gelu, LogSigmoid) or the tensor
// (PRelu); rhs the gradient or PRelu's alpha.
std::optional<double> binary_activation(OpKind k, double a, double b) {
  switch (k) {
    case OpKind::Activation_ReluBackward: return a <= 0 ? 0.0 : b;
    case OpKind::Activation_GeluBackward: return b * gelu_tanh_derivative(a);
    case OpKind::Activation_SigmoidBackward: return b * (a * (1.0 - a));
    case OpKind::Activation_LogSigmoidBackward: return b * sigmoid(-a);
    case OpKind::Activation_PRelu: return a < 0 ? a * b : a;
    default: return std::nullopt;
  }
}

Error unknown_kind(const Ctx& c) { return c.error(ErrorCode::Internal, "activation: unknown kind"); }

Result<Outputs> run_unary_activation(const Ctx& c, const HostTensor& x) {
  KILN_RETURN_IF_ERROR(expect_out_shape(c, 0, x.shape()));
  KILN_ASSIGN_OR_RETURN(HostTensor out, c.new_output());
  for (std::uint64_t i = 0; i < x.num_elements(); ++i) {
    const std::optional<double> r = unary_activation(c.op.kind, x.get_f64(i));
    if (!r) return unknown_kind(c);
    element::store_f64(out.mutable_data(), out.dtype(), i, *r);
  }
  return single(std::move(out));
}

// Broadcasting (docs/spec/ir.md §4: equal ranks), as every Binary kind.
Result<Outputs> run_binary_activation(const Ctx& c, const HostTensor& x) {
  const HostTensor& y = c.in[1];
  KILN_RETURN_IF_ERROR(expect_same_dtype(c, 0, 1));
  KILN_RETURN_IF_ERROR(expect_out_shape(c, 0, ir::shape::broadcast(x.shape(), y.shape())));
  KILN_ASSIGN_OR_RETURN(HostTensor out, c.new_output());
  const std::vector<std::uint64_t> mx = broadcast_map(x.shape(), out.shape());
  const std::vector<std::uint64_t> my = broadcast_map(y.shape(), out.shape());
  for (std::size_t i = 0; i < mx.size(); ++i) {
    const std::optional<double> r = binary_activation(c.op.kind, x.get_f64(mx[i]), y.get_f64(my[i]));
    if (!r) return unknown_kind(c);
    element::store_f64(out.mutable_data(), out.dtype(), i, *r);
  }
  return single(std::move(out));
}

// LeakyRelu{x, slope} and HardSigmoid{x, alpha, beta}: elementwise with scalars.
Result<Outputs> run_scalar_activation(const Ctx& c, const HostTensor& x) {
  const OpKind k = c.op.kind;
  if (k != OpKind::Activation_LeakyRelu && k != OpKind::Activation_HardSigmoid) return unknown_kind(c);
  KILN_RETURN_IF_ERROR(expect_out_shape(c, 0, x.shape()));
  KILN_ASSIGN_OR_RETURN(HostTensor out, c.new_output());
  const double s0 = scalar_as<double>(c.op.scalars[0], x.dtype());
  const double s1 = k == OpKind::Activation_HardSigmoid ? scalar_as<double>(c.op.scalars[1], x.dtype()) : 0.0;
  for (std::uint64_t i = 0; i < x.num_elements(); ++i) {
    const double v = x.get_f64(i);
    double r = 0;
    if (k == OpKind::Activation_LeakyRelu) {
      r = v < 0 ? v * s0 : v;
    } else {
      r = s0 * v + s1;
      if (r < 0) r = 0;
      if (r > 1) r = 1;
    }
    element::store_f64(out.mutable_data(), out.dtype(), i, r);
  }
  return single(std::move(out));
}

// Softmax / LogSoftmax / Softmin of one line of n values, spaced `stride` apart from `first`.
void softmax_line(OpKind k, const HostTensor& x, const HostTensor& out, std::uint64_t first, std::uint64_t n,
                  std::uint64_t stride) {
  const double sign = k == OpKind::Activation_Softmin ? -1.0 : 1.0;
  double m = -std::numeric_limits<double>::infinity();
  for (std::uint64_t j = 0; j < n; ++j) m = max_nan(m, sign * x.get_f64(first + j * stride));
  double sum = 0;
  for (std::uint64_t j = 0; j < n; ++j) sum += std::exp(sign * x.get_f64(first + j * stride) - m);
  const double log_sum = std::log(sum);
  for (std::uint64_t j = 0; j < n; ++j) {
    const double shifted = sign * x.get_f64(first + j * stride) - m;
    const double r = k == OpKind::Activation_LogSoftmax ? shifted - log_sum : std::exp(shifted) / sum;
    element::store_f64(out.mutable_data(), out.dtype(), first + j * stride, r);
  }
}

// Along attribute 0 (the axis): the input viewed as [outer, n, inner], one line per (outer, inner).
Result<Outputs> run_softmax(const Ctx& c, const HostTensor& x) {
  const OpKind k = c.op.kind;
  if (k != OpKind::Activation_Softmax && k != OpKind::Activation_LogSoftmax && k != OpKind::Activation_Softmin)
    return unknown_kind(c);
  KILN_ASSIGN_OR_RETURN(std::size_t axis, axis_attr(c, 0, x.shape().size(), "axis"));
  KILN_RETURN_IF_ERROR(expect_out_shape(c, 0, x.shape()));
  KILN_ASSIGN_OR_RETURN(HostTensor out, c.new_output());
  const std::uint64_t outer = dims_product(x.shape(), 0, axis);
  const std::uint64_t n = x.shape()[axis];
  const std::uint64_t inner = dims_product(x.shape(), axis + 1, x.shape().size());
  for (std::uint64_t o = 0; o < outer; ++o)
    for (std::uint64_t i = 0; i < inner; ++i) softmax_line(k, x, out, o * n * inner + i, n, inner);
  return single(std::move(out));
}

}  // namespace

Result<Outputs> run_activation(const Ctx& c) {
  const HostTensor& x = c.in[0];
  if (!x.dtype().is_float())
    return c.error(ErrorCode::DTypeMismatch, fmt::format("does not apply to {}", x.to_string()));
  KILN_RETURN_IF_ERROR(expect_out_dtype(c, 0, x.dtype()));
  switch (c.op.info().signature) {
    case ir::Signature::Unary: return run_unary_activation(c, x);
    case ir::Signature::Binary: return run_binary_activation(c, x);
    case ir::Signature::Scalar:
    case ir::Signature::HardSigmoid: return run_scalar_activation(c, x);
    case ir::Signature::Dim: return run_softmax(c, x);
    default: return c.error(ErrorCode::Internal, "activation: unknown signature");
  }
}

}  // namespace kiln::reference::kernels
