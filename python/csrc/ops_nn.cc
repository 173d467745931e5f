// The layers of a CNN or a transformer and their backward kernels: convolutions (conv1d/2d/3d and
// the transposed ones, through convolution_overrideable, the last step of aten::convolution on an
// out-of-tree device), batch and layer norm, 2-d max pooling with indices and GELU.
//
// Each follows PyTorch's semantics (batch norm: the biased variance normalises, the unbiased one
// updates running_var, in place; max pool: indices flat within each plane, ceil_mode; GELU:
// approximate "none" or "tanh"). Arguments kiln cannot express (a non-float dtype, mixed dtypes, a
// transposed convolution whose output_padding reaches its stride, a ceil_mode window PyTorch drops)
// run on the CPU instead, counted as fallbacks under the op's name.
#include <ATen/ops/convolution.h>
#include <ATen/ops/convolution_backward.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/gelu_backward.h>
#include <ATen/ops/max_pool2d_with_indices.h>
#include <ATen/ops/max_pool2d_with_indices_backward.h>
#include <ATen/ops/native_batch_norm.h>
#include <ATen/ops/native_batch_norm_backward.h>
#include <ATen/ops/native_layer_norm.h>
#include <ATen/ops/native_layer_norm_backward.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <initializer_list>
#include <optional>
#include <string_view>
#include <tuple>
#include <vector>

#include "kiln/runtime/session_conv_calls.h"
#include "state.h"
#include "tensor_impl.h"

namespace kiln::pytorch {
namespace {

using runtime::Session;
using Value = runtime::Tensor;
namespace build = ir::build;
using Tensor3 = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

bool kiln_float(c10::ScalarType t) {
  return t == c10::ScalarType::Float || t == c10::ScalarType::Double || t == c10::ScalarType::Half ||
         t == c10::ScalarType::BFloat16;
}

bool defined(const std::optional<at::Tensor>& t) { return t && t->defined(); }

// An optional operand of a float op: absent, or on kiln with `type`.
bool same_float_operand(const std::optional<at::Tensor>& t, c10::ScalarType type) {
  return !defined(t) || (is_kiln(*t) && t->scalar_type() == type);
}

// ---- The CPU path of the kernels here: inputs read back, the op on the CPU, results sent back.
std::optional<at::Tensor> cpu_copy(const std::optional<at::Tensor>& t) {
  if (!defined(t)) return std::nullopt;
  return t->cpu();
}
at::Tensor back_to(const at::Tensor& t, const at::Tensor& like) { return t.defined() ? t.to(like.device()) : t; }
// A kiln tensor that an op mutates in place (running stats) takes the value of `src`.
void assign(const std::optional<at::Tensor>& dst, const std::optional<at::Tensor>& src, std::string_view what) {
  if (!defined(dst)) return;
  const at::Tensor k = back_to(*src, *dst);
  impl_of(*dst, what).set_value(value_of(k, what), dst->sizes());
}

Value sizes_of(const Value& v, c10::IntArrayRef sizes, std::string_view what) { return reshaped(v, sizes, what); }

std::vector<std::int64_t> sizes_vector(const Value& v) { return {v.shape().begin(), v.shape().end()}; }

// ================================ convolutions ================================

struct ConvArgs {
  c10::IntArrayRef stride, padding, dilation, output_padding;
  std::int64_t groups;
  bool transposed;
};

void put(std::uint64_t& field, c10::IntArrayRef v) { field = static_cast<std::uint64_t>(v[0]); }
template <std::size_t N>
void put(std::array<std::uint64_t, N>& field, c10::IntArrayRef v) {
  for (std::size_t i = 0; i < N; ++i) field[i] = static_cast<std::uint64_t>(v[i]);
}

template <class Options>
Options conv_options(const ConvArgs& a) {
  Options o;
  put(o.stride, a.stride);
  put(o.padding, a.padding);
  put(o.dilation, a.dilation);
  if constexpr (requires { o.padding_out; }) put(o.padding_out, a.output_padding);
  o.groups = static_cast<std::uint64_t>(a.groups);
  return o;
}

using runtime::SessionConvCalls;
using runtime::with_conv_calls;

bool positive(c10::IntArrayRef v) {
  return std::all_of(v.begin(), v.end(), [](std::int64_t x) { return x >= 1; });
}

// What kiln's convolutions express: 1 to 3 spatial dims, batched, one float dtype, every list one
// value per spatial dim, and (transposed) output_padding < stride, so that the input's gradient is
// the plain convolution of the output's gradient.
bool conv_lowerable(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                    const ConvArgs& a) {
  const std::int64_t rank = weight.dim() - 2;
  if (!is_kiln(input) || !is_kiln(weight) || rank < 1 || rank > 3 || input.dim() != weight.dim()) return false;
  if (!kiln_float(input.scalar_type()) || weight.scalar_type() != input.scalar_type()) return false;
  if (!same_float_operand(bias, input.scalar_type()) || input.numel() == 0 || weight.numel() == 0) return false;
  const auto r = static_cast<std::size_t>(rank);
  if (a.groups < 1 || a.stride.size() != r || a.padding.size() != r || a.dilation.size() != r) return false;
  if (!positive(a.stride) || !positive(a.dilation)) return false;
  if (std::any_of(a.padding.begin(), a.padding.end(), [](std::int64_t p) { return p < 0; })) return false;
  if (!a.transposed) return true;
  if (a.output_padding.size() != r) return false;
  for (std::size_t i = 0; i < r; ++i) {
    if (a.output_padding[i] < 0 || a.output_padding[i] >= a.stride[i]) return false;
  }
  return true;
}

template <class Opt, class TOpt>
Value conv_forward(const SessionConvCalls<Opt, TOpt>& c, Value x, Value w, std::optional<Value> b, const ConvArgs& a) {
  Session& s = session();
  if (a.transposed) {
    return value_or_throw((s.*c.forward_t)(std::move(x), std::move(w), std::move(b), conv_options<TOpt>(a)),
                          "convolution");
  }
  return value_or_throw((s.*c.forward)(std::move(x), std::move(w), std::move(b), conv_options<Opt>(a)), "convolution");
}

using Grads = std::array<std::optional<Value>, 3>;

// The gradients of input, weight and bias that `mask` asks for. A transposed convolution's input
// gradient is the plain convolution of g with the same weight and options (the spec has no
// transposed XBackward); the bias gradients take the bias only for its shape.
template <class Opt, class TOpt>
Grads conv_grads(const SessionConvCalls<Opt, TOpt>& c, const Value& g, const Value& x, const Value& w,
                 std::array<bool, 3> mask, const ConvArgs& a) {
  constexpr std::string_view what = "convolution_backward";
  Session& s = session();
  Grads out;
  if (a.transposed) {
    if (mask[0]) out[0] = value_or_throw((s.*c.forward)(g, w, std::nullopt, conv_options<Opt>(a)), what);
    if (mask[1]) out[1] = value_or_throw((s.*c.weight_grad_t)(x, w, g, conv_options<TOpt>(a)), what);
  } else {
    if (mask[0]) out[0] = value_or_throw((s.*c.x_grad)(x, w, g, conv_options<Opt>(a)), what);
    if (mask[1]) out[1] = value_or_throw((s.*c.weight_grad)(x, w, g, conv_options<Opt>(a)), what);
  }
  if (mask[2]) {
    Value bias = value_or_throw(s.empty(ir::Shape{g.shape()[1]}, g.dtype()), what);
    const auto fn = a.transposed ? c.bias_grad_t : c.bias_grad;
    out[2] = value_or_throw((s.*fn)(x, std::move(bias), g), what);
  }
  return out;
}

at::Tensor convolution_on_cpu(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                              c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation,
                              bool transposed, c10::IntArrayRef output_padding, std::int64_t groups) {
  note_fallback("aten::convolution_overrideable");
  return at::convolution(input.cpu(), weight.cpu(), cpu_copy(bias), stride, padding, dilation, transposed,
                         output_padding, groups)
      .to(input.device());
}

Tensor3 convolution_backward_on_cpu(const at::Tensor& grad, const at::Tensor& input, const at::Tensor& weight,
                                    const ConvArgs& a, std::array<bool, 3> mask) {
  note_fallback("aten::convolution_backward_overrideable");
  // The bias's size: the output channels (of a transposed convolution: weight dim 1 per group).
  const std::vector<std::int64_t> bias_sizes{a.transposed ? weight.size(1) * a.groups : weight.size(0)};
  auto [gi, gw, gb] =
      at::convolution_backward(grad.cpu(), input.cpu(), weight.cpu(), at::OptionalIntArrayRef(bias_sizes), a.stride,
                               a.padding, a.dilation, a.transposed, a.output_padding, a.groups, mask);
  return {back_to(gi, input), back_to(gw, input), back_to(gb, input)};
}

// For a device other than the CPU and CUDA, aten::convolution ends here (the default kernel
// raises NotImplementedError instead of reaching the boxed fallback).
// One value per spatial dim: aten::convolution accepts a single value for all of them (padding='valid'
// arrives as padding=[0]), as PyTorch's expand_param_if_needed.
std::vector<std::int64_t> per_dim(c10::IntArrayRef v, const at::Tensor& weight) {
  const auto dims = static_cast<std::size_t>(std::max<std::int64_t>(weight.dim() - 2, 0));
  if (v.size() == 1 && dims > 1) return std::vector<std::int64_t>(dims, v[0]);
  return {v.begin(), v.end()};
}

at::Tensor convolution_kernel(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                              c10::IntArrayRef stride_in, c10::IntArrayRef padding_in, c10::IntArrayRef dilation_in,
                              bool transposed, c10::IntArrayRef output_padding_in, std::int64_t groups) {
  const std::vector<std::int64_t> stride = per_dim(stride_in, weight), padding = per_dim(padding_in, weight),
                                  dilation = per_dim(dilation_in, weight),
                                  output_padding = per_dim(output_padding_in, weight);
  const ConvArgs a{stride, padding, dilation, output_padding, groups, transposed};
  if (!conv_lowerable(input, weight, bias, a)) {
    return convolution_on_cpu(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups);
  }
  std::optional<Value> b;
  if (defined(bias)) b = value_of(*bias, "convolution");
  const Value& x = value_of(input, "convolution");
  const Value& w = value_of(weight, "convolution");
  Value out = with_conv_calls(weight.dim() - 2, [&](const auto& c) { return conv_forward(c, x, w, b, a); });
  const std::vector<std::int64_t> sizes = sizes_vector(out);
  return make_tensor(std::move(out), sizes);
}

Tensor3 convolution_backward_kernel(const at::Tensor& grad, const at::Tensor& input, const at::Tensor& weight,
                                    c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation,
                                    bool transposed, c10::IntArrayRef output_padding, std::int64_t groups,
                                    std::array<bool, 3> mask) {
  const std::vector<std::int64_t> s = per_dim(stride, weight), p = per_dim(padding, weight),
                                  d = per_dim(dilation, weight), op = per_dim(output_padding, weight);
  const ConvArgs a{s, p, d, op, groups, transposed};
  if (!conv_lowerable(input, weight, std::nullopt, a) || !is_kiln(grad) || grad.scalar_type() != input.scalar_type()) {
    return convolution_backward_on_cpu(grad, input, weight, a, mask);
  }
  const Value& g = value_of(grad, "convolution_backward");
  const Value& x = value_of(input, "convolution_backward");
  const Value& w = value_of(weight, "convolution_backward");
  Grads grads = with_conv_calls(weight.dim() - 2, [&](const auto& c) { return conv_grads(c, g, x, w, mask, a); });
  const auto wrap = [](std::optional<Value>& v, c10::IntArrayRef sizes) {
    return v ? make_tensor(std::move(*v), sizes) : at::Tensor();
  };
  const std::vector<std::int64_t> bias_sizes{grad.size(1)};
  return {wrap(grads[0], input.sizes()), wrap(grads[1], weight.sizes()), wrap(grads[2], bias_sizes)};
}

// aten::convolution and its backward registered directly as well: their composite kernels view a
// 1-d convolution as a 2-d one (unsqueeze, squeeze: real views of the storage-less inner tensors,
// each an as_strided copy through the CPU) before reaching the *_overrideable kernels above.
Tensor3 convolution_backward_full_kernel(const at::Tensor& grad, const at::Tensor& input, const at::Tensor& weight,
                                         at::OptionalIntArrayRef /*bias_sizes: grad's channels*/,
                                         c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation,
                                         bool transposed, c10::IntArrayRef output_padding, std::int64_t groups,
                                         std::array<bool, 3> mask) {
  return convolution_backward_kernel(grad, input, weight, stride, padding, dilation, transposed, output_padding, groups,
                                     mask);
}

// ================================ batch norm ================================

// A [C] tensor as [1, C, 1, ...] (rank `rank`), cast to `d`, for per-channel broadcasting.
Value per_channel(const at::Tensor& t, ir::DType d, std::int64_t rank, std::string_view what) {
  std::vector<std::int64_t> args(static_cast<std::size_t>(rank), 1);
  args[1] = t.numel();
  return value_or_throw(session().reshape(cast_to(value_of(t, what), d, what), std::move(args)), what);
}

// The mean (or sum) over every dim but the channels (dim 1), keeping them: [1, C, 1, ...].
Value over_channels(Value v, bool mean, std::string_view what) {
  Session& s = session();
  const std::size_t rank = v.shape().size();
  for (std::size_t d = 0; d < rank; ++d) {
    if (d == 1) continue;
    v = value_or_throw(mean ? s.mean_dim(std::move(v), d, true) : s.sum_dim(std::move(v), d, true), what);
  }
  return v;
}

Value as_channels(const Value& v, std::int64_t c, std::string_view what) { return sizes_of(v, {c}, what); }

// What kiln's batch norm takes: a float input of rank >= 2 on kiln, every other tensor of its dtype.
bool batch_norm_lowerable(const at::Tensor& input, std::initializer_list<const std::optional<at::Tensor>*> others) {
  if (!is_kiln(input) || !kiln_float(input.scalar_type()) || input.dim() < 2 || input.numel() == 0) return false;
  return std::all_of(others.begin(), others.end(),
                     [&](const std::optional<at::Tensor>* t) { return same_float_operand(*t, input.scalar_type()); });
}

// running = (1 − momentum)·running + momentum·batch, in place (a new value bound to the tensor);
// `batch` has the running statistic's [C] shape.
void update_running(const std::optional<at::Tensor>& running, const Value& batch, double momentum,
                    std::string_view what) {
  if (!defined(running)) return;
  Session& s = session();
  Value old = value_or_throw(s.mul(value_of(*running, what), 1.0 - momentum), what);
  Value add = value_or_throw(s.mul(batch, momentum), what);
  impl_of(*running, what).set_value(value_or_throw(s.add(std::move(old), std::move(add)), what), running->sizes());
}

// Training: normalise by the batch's statistics (biased variance), return them ([C] mean and
// 1/sqrt(var + eps)) and update the running ones (unbiased variance).
Tensor3 batch_norm_train(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                         const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& running_mean,
                         const std::optional<at::Tensor>& running_var, double momentum, double eps) {
  constexpr std::string_view what = "native_batch_norm";
  Session& s = session();
  const std::int64_t c = input.size(1);
  const std::int64_t n = input.numel() / c;
  TORCH_CHECK(n > 1, "Expected more than 1 value per channel when training, got input size ", input.sizes());
  const Value& x = value_of(input, what);
  Value mean = over_channels(x, true, what);
  Value xc = value_or_throw(s.sub(x, mean), what);
  Value var = over_channels(value_or_throw(s.mul(xc, xc), what), true, what);
  Value invstd = value_or_throw(s.rsqrt(value_or_throw(s.add(var, eps), what)), what);
  Value y = value_or_throw(s.mul(std::move(xc), invstd), what);
  if (defined(weight))
    y = value_or_throw(s.mul(std::move(y), per_channel(*weight, x.dtype(), input.dim(), what)), what);
  if (defined(bias)) y = value_or_throw(s.add(std::move(y), per_channel(*bias, x.dtype(), input.dim(), what)), what);
  Value mean_c = as_channels(mean, c, what);  // one Reshape for the running update and the result
  update_running(running_mean, mean_c, momentum, what);
  const double unbias = static_cast<double>(n) / static_cast<double>(n - 1);
  update_running(running_var, as_channels(value_or_throw(s.mul(std::move(var), unbias), what), c, what), momentum,
                 what);
  return {make_tensor(std::move(y), input.sizes()), make_tensor(std::move(mean_c), {c}),
          make_tensor(as_channels(invstd, c, what), {c})};
}

// Inference: kiln's BatchNorm with the running statistics; save_mean and save_invstd are empty,
// as the CPU's.
Tensor3 batch_norm_eval(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                        const std::optional<at::Tensor>& bias, const at::Tensor& running_mean,
                        const at::Tensor& running_var, double eps) {
  constexpr std::string_view what = "native_batch_norm";
  Session& s = session();
  const ir::DType d = to_kiln_dtype(input.scalar_type(), what);
  const ir::Shape channels{static_cast<std::uint64_t>(input.size(1))};
  Value gamma = defined(weight) ? value_of(*weight, what) : value_or_throw(s.ones(channels, d), what);
  Value beta = defined(bias) ? value_of(*bias, what) : value_or_throw(s.zeros(channels, d), what);
  Value y = value_or_throw(s.batch_norm(value_of(input, what), std::move(gamma), std::move(beta),
                                        value_of(running_mean, what), value_of(running_var, what), eps),
                           what);
  const std::vector<std::int64_t> none{0};
  return {make_tensor(std::move(y), input.sizes()), make_tensor(value_or_throw(s.empty(ir::Shape{0}, d), what), none),
          make_tensor(value_or_throw(s.empty(ir::Shape{0}, d), what), none)};
}

Tensor3 native_batch_norm_kernel(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                                 const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& running_mean,
                                 const std::optional<at::Tensor>& running_var, bool training, double momentum,
                                 double eps) {
  const bool stats = defined(running_mean) && defined(running_var);
  if (batch_norm_lowerable(input, {&weight, &bias, &running_mean, &running_var}) && (training || stats)) {
    if (training) return batch_norm_train(input, weight, bias, running_mean, running_var, momentum, eps);
    return batch_norm_eval(input, weight, bias, *running_mean, *running_var, eps);
  }
  note_fallback("aten::native_batch_norm");
  std::optional<at::Tensor> rm = cpu_copy(running_mean), rv = cpu_copy(running_var);
  auto [y, m, v] =
      at::native_batch_norm(input.cpu(), cpu_copy(weight), cpu_copy(bias), rm, rv, training, momentum, eps);
  if (training) {
    assign(running_mean, rm, "native_batch_norm");
    assign(running_var, rv, "native_batch_norm");
  }
  return {back_to(y, input), back_to(m, input), back_to(v, input)};
}

// dx = w·invstd·(g − mean(g) − x̂·mean(g·x̂)) in training (the batch statistics depend on x), else
// w·invstd·g; dw = Σ g·x̂, db = Σ g over every dim but the channels.
Tensor3 batch_norm_backward_lowered(const at::Tensor& grad, const at::Tensor& input,
                                    const std::optional<at::Tensor>& weight, const at::Tensor& mean_t,
                                    const at::Tensor& invstd_or_var, bool train, double eps, std::array<bool, 3> mask) {
  constexpr std::string_view what = "native_batch_norm_backward";
  Session& s = session();
  const std::int64_t c = input.size(1), rank = input.dim();
  const Value& x = value_of(input, what);
  const Value& g = value_of(grad, what);
  Value mean = per_channel(mean_t, x.dtype(), rank, what);
  Value invstd = per_channel(invstd_or_var, x.dtype(), rank, what);
  if (!train) invstd = value_or_throw(s.rsqrt(value_or_throw(s.add(std::move(invstd), eps), what)), what);
  Value xhat = value_or_throw(s.mul(value_or_throw(s.sub(x, std::move(mean)), what), invstd), what);
  at::Tensor gi, gw, gb;
  if (mask[0]) {
    Value dx = g;
    if (train) {
      Value mg = over_channels(g, true, what);
      Value mgx = over_channels(value_or_throw(s.mul(g, xhat), what), true, what);
      dx = value_or_throw(
          s.sub(value_or_throw(s.sub(g, std::move(mg)), what), value_or_throw(s.mul(xhat, std::move(mgx)), what)),
          what);
    }
    dx = value_or_throw(s.mul(std::move(dx), invstd), what);
    if (defined(weight)) dx = value_or_throw(s.mul(std::move(dx), per_channel(*weight, x.dtype(), rank, what)), what);
    gi = make_tensor(std::move(dx), input.sizes());
  }
  if (mask[1]) {
    Value dw = over_channels(value_or_throw(s.mul(g, xhat), what), false, what);
    gw = make_tensor(as_channels(dw, c, what), {c});
  }
  if (mask[2]) gb = make_tensor(as_channels(over_channels(g, false, what), c, what), {c});
  return {gi, gw, gb};
}

Tensor3 native_batch_norm_backward_kernel(const at::Tensor& grad, const at::Tensor& input,
                                          const std::optional<at::Tensor>& weight,
                                          const std::optional<at::Tensor>& running_mean,
                                          const std::optional<at::Tensor>& running_var,
                                          const std::optional<at::Tensor>& save_mean,
                                          const std::optional<at::Tensor>& save_invstd, bool train, double eps,
                                          std::array<bool, 3> mask) {
  const std::optional<at::Tensor>& m = train ? save_mean : running_mean;
  const std::optional<at::Tensor>& v = train ? save_invstd : running_var;
  const std::optional<at::Tensor> g = grad;
  if (batch_norm_lowerable(input, {&g, &weight, &m, &v}) && defined(m) && defined(v) && m->numel() == input.size(1)) {
    return batch_norm_backward_lowered(grad, input, weight, *m, *v, train, eps, mask);
  }
  note_fallback("aten::native_batch_norm_backward");
  auto [gi, gw, gb] = at::native_batch_norm_backward(grad.cpu(), input.cpu(), cpu_copy(weight), cpu_copy(running_mean),
                                                     cpu_copy(running_var), cpu_copy(save_mean), cpu_copy(save_invstd),
                                                     train, eps, mask);
  return {back_to(gi, input), back_to(gw, input), back_to(gb, input)};
}

// ================================ layer norm ================================

// The input as rows [M, N]: N the normalized_shape's element count.
struct Rows {
  std::int64_t m, n;
  std::vector<std::int64_t> stat_sizes;  // the input's leading sizes, then a 1 per normalized dim
};

Rows rows_of(const at::Tensor& input, c10::IntArrayRef normalized_shape) {
  const auto axis = static_cast<std::size_t>(input.dim()) - normalized_shape.size();
  Rows r{1, 1, {}};
  for (std::size_t i = 0; i < static_cast<std::size_t>(input.dim()); ++i) {
    const std::int64_t size = input.size(static_cast<std::int64_t>(i));
    (i < axis ? r.m : r.n) *= size;
    r.stat_sizes.push_back(i < axis ? size : 1);
  }
  return r;
}

// The input of a layer norm as rows to normalize: its own shape when only its last dim is
// normalized (kiln's LayerNorm and the reductions along that dim take any rank, so no Reshape
// ops: they cannot fuse and each costs a plan run), else [m, n].
Value as_rows(const Value& v, const Rows& r, std::string_view what) {
  if (!v.shape().empty() && static_cast<std::int64_t>(v.shape().back()) == r.n) return v;
  return sizes_of(v, {r.m, r.n}, what);
}

bool layer_norm_lowerable(const at::Tensor& input, c10::IntArrayRef normalized_shape,
                          std::initializer_list<const std::optional<at::Tensor>*> others) {
  if (!is_kiln(input) || !kiln_float(input.scalar_type()) || input.numel() == 0) return false;
  if (normalized_shape.empty() || static_cast<std::size_t>(input.dim()) < normalized_shape.size()) return false;
  if (!input.sizes().slice(input.sizes().size() - normalized_shape.size()).equals(normalized_shape)) return false;
  return std::all_of(others.begin(), others.end(),
                     [&](const std::optional<at::Tensor>* t) { return same_float_operand(*t, input.scalar_type()); });
}

// kiln's LayerNorm over rows [M, N] with its row statistics (one op, one pass over the rows): the
// output, and the mean and 1/sqrt(var + eps) (biased variance) per row for the backward pass, of
// the CPU's sizes (leading dims, then 1s).
Tensor3 layer_norm_lowered(const at::Tensor& input, c10::IntArrayRef normalized_shape,
                           const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias, double eps) {
  constexpr std::string_view what = "native_layer_norm";
  Session& s = session();
  const Rows r = rows_of(input, normalized_shape);
  const Value x = as_rows(value_of(input, what), r, what);
  const ir::DType d = x.dtype();
  Value gamma = defined(weight) ? sizes_of(value_of(*weight, what), {r.n}, what)
                                : value_or_throw(s.ones(ir::Shape{static_cast<std::uint64_t>(r.n)}, d), what);
  std::optional<Value> beta;
  if (defined(bias)) beta = sizes_of(value_of(*bias, what), {r.n}, what);
  runtime::LayerNormWithStats ln =
      value_or_throw(s.layer_norm_with_stats(x, std::move(gamma), std::move(beta), eps), what);
  return {make_tensor(sizes_of(ln.out, input.sizes(), what), input.sizes()),
          make_tensor(sizes_of(ln.mean, r.stat_sizes, what), r.stat_sizes),
          make_tensor(sizes_of(ln.rstd, r.stat_sizes, what), r.stat_sizes)};
}

Tensor3 native_layer_norm_kernel(const at::Tensor& input, c10::IntArrayRef normalized_shape,
                                 const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
                                 double eps) {
  // kiln's LayerNorm refuses a negative or non-finite epsilon; PyTorch computes it.
  if (eps >= 0 && std::isfinite(eps) && layer_norm_lowerable(input, normalized_shape, {&weight, &bias})) {
    return layer_norm_lowered(input, normalized_shape, weight, bias, eps);
  }
  note_fallback("aten::native_layer_norm");
  auto [y, m, v] = at::native_layer_norm(input.cpu(), normalized_shape, cpu_copy(weight), cpu_copy(bias), eps);
  return {back_to(y, input), back_to(m, input), back_to(v, input)};
}

// Per row, x̂ = (x − mean)·rstd, gw = g·w: dx = rstd·(gw − mean(gw) − x̂·mean(gw·x̂));
// dw = Σ_rows g·x̂, db = Σ_rows g.
Tensor3 layer_norm_backward_lowered(const at::Tensor& grad, const at::Tensor& input, c10::IntArrayRef normalized_shape,
                                    const at::Tensor& mean_t, const at::Tensor& rstd_t,
                                    const std::optional<at::Tensor>& weight, std::array<bool, 3> mask) {
  constexpr std::string_view what = "native_layer_norm_backward";
  Session& s = session();
  const Rows r = rows_of(input, normalized_shape);
  const Value x = as_rows(value_of(input, what), r, what);
  const Value g = as_rows(value_of(grad, what), r, what);
  const std::size_t rank = x.shape().size();
  const std::uint64_t dim = rank - 1;  // the normalized one
  // The statistics [..., 1] and the weight [1, ..., 1, n] in x's rank.
  std::vector<std::int64_t> stat_shape(x.shape().begin(), x.shape().end());
  stat_shape.back() = 1;
  std::vector<std::int64_t> weight_shape(rank, 1);
  weight_shape.back() = r.n;
  // The views first: a Reshape between two ops of the row's chain closes the fusion blocks around
  // it, and the weight's sat between the statistics and their uses.
  const Value rstd = sizes_of(value_of(rstd_t, what), stat_shape, what);
  const Value mean = sizes_of(value_of(mean_t, what), stat_shape, what);
  std::optional<Value> w_row;
  if (defined(weight)) w_row = sizes_of(value_of(*weight, what), weight_shape, what);
  Value xc = value_or_throw(s.sub(x, mean), what);
  Value xhat = value_or_throw(s.mul(std::move(xc), rstd), what);
  at::Tensor gi, gw, gb;
  if (mask[0]) {
    Value gwt = g;
    if (w_row) gwt = value_or_throw(s.mul(g, *w_row), what);
    Value m1 = value_or_throw(s.mean_dim(gwt, dim, true), what);
    Value m2 = value_or_throw(s.mean_dim(value_or_throw(s.mul(gwt, xhat), what), dim, true), what);
    Value dx = value_or_throw(s.sub(value_or_throw(s.sub(std::move(gwt), std::move(m1)), what),
                                    value_or_throw(s.mul(xhat, std::move(m2)), what)),
                              what);
    dx = value_or_throw(s.mul(std::move(dx), rstd), what);
    gi = make_tensor(sizes_of(dx, input.sizes(), what), input.sizes());
  }
  // dw and db sum over every row: as [m, n] (a Reshape only when x kept a rank other than 2).
  if (mask[1] && defined(weight)) {
    Value gx = sizes_of(value_or_throw(s.mul(g, xhat), what), {r.m, r.n}, what);
    Value dw = value_or_throw(s.sum_dim(std::move(gx), 0, true), what);
    gw = make_tensor(sizes_of(dw, weight->sizes(), what), weight->sizes());
  }
  if (mask[2]) {
    const std::vector<std::int64_t> sizes(normalized_shape.begin(), normalized_shape.end());
    Value db = value_or_throw(s.sum_dim(sizes_of(g, {r.m, r.n}, what), 0, true), what);
    gb = make_tensor(sizes_of(db, sizes, what), sizes);
  }
  return {gi, gw, gb};
}

Tensor3 native_layer_norm_backward_kernel(const at::Tensor& grad, const at::Tensor& input,
                                          c10::IntArrayRef normalized_shape, const at::Tensor& mean,
                                          const at::Tensor& rstd, const std::optional<at::Tensor>& weight,
                                          const std::optional<at::Tensor>& bias, std::array<bool, 3> mask) {
  const std::optional<at::Tensor> g = grad, m = mean, v = rstd;
  if (layer_norm_lowerable(input, normalized_shape, {&g, &m, &v, &weight, &bias}) &&
      grad.sizes().equals(input.sizes())) {
    return layer_norm_backward_lowered(grad, input, normalized_shape, mean, rstd, weight, mask);
  }
  note_fallback("aten::native_layer_norm_backward");
  auto [gi, gw, gb] = at::native_layer_norm_backward(grad.cpu(), input.cpu(), normalized_shape, mean.cpu(), rstd.cpu(),
                                                     cpu_copy(weight), cpu_copy(bias), mask);
  return {back_to(gi, input), back_to(gw, input), back_to(gb, input)};
}

// ================================ max pooling ================================

struct Pool2d {
  build::MaxPool2dOptions options;
  bool lowerable = false;
};

// PyTorch's argument rules (one value for both dims; stride defaults to the kernel) and whether
// kiln computes PyTorch's output: kiln's ceil_mode keeps a last window that starts in the right
// padding, which PyTorch drops, so such a shape runs on the CPU.
Pool2d pool2d_of(const at::Tensor& self, c10::IntArrayRef kernel, c10::IntArrayRef stride, c10::IntArrayRef padding,
                 c10::IntArrayRef dilation, bool ceil_mode) {
  Pool2d p;
  p.options.ceil_mode = ceil_mode;
  const auto pick = [](c10::IntArrayRef v, std::size_t i) { return v.size() == 1 ? v[0] : v[i]; };
  const auto ok_size = [](c10::IntArrayRef v) { return v.size() == 1 || v.size() == 2; };
  if (!ok_size(kernel) || !(stride.empty() || ok_size(stride)) || !ok_size(padding) || !ok_size(dilation)) return p;
  if (!is_kiln(self) || !kiln_float(self.scalar_type()) || (self.dim() != 3 && self.dim() != 4) || self.numel() == 0) {
    return p;
  }
  for (std::size_t i = 0; i < 2; ++i) {
    const std::int64_t k = pick(kernel, i), s = stride.empty() ? k : pick(stride, i);
    const std::int64_t pad = pick(padding, i), d = pick(dilation, i);
    if (k < 1 || s < 1 || d < 1 || pad < 0 || pad > k / 2) return p;
    const std::int64_t in = self.size(self.dim() - 2 + static_cast<std::int64_t>(i));
    const std::int64_t num = in + 2 * pad - d * (k - 1) - 1;
    if (num < 0) return p;
    const std::int64_t out = (ceil_mode ? (num + s - 1) / s : num / s) + 1;
    if (ceil_mode && (out - 1) * s >= in + pad) return p;
    p.options.kernel[i] = static_cast<std::uint64_t>(k);
    p.options.stride[i] = static_cast<std::uint64_t>(s);
    p.options.padding[i] = static_cast<std::uint64_t>(pad);
    p.options.dilation[i] = static_cast<std::uint64_t>(d);
  }
  p.lowerable = true;
  return p;
}

// A 3-d (unbatched) tensor as [1, C, H, W].
Value batched(const at::Tensor& t, std::string_view what) {
  const Value& v = value_of(t, what);
  if (t.dim() == 4) return v;
  return sizes_of(v, {1, t.size(0), t.size(1), t.size(2)}, what);
}

std::tuple<at::Tensor, at::Tensor> max_pool2d_with_indices_kernel(const at::Tensor& self, c10::IntArrayRef kernel,
                                                                  c10::IntArrayRef stride, c10::IntArrayRef padding,
                                                                  c10::IntArrayRef dilation, bool ceil_mode) {
  constexpr std::string_view what = "max_pool2d_with_indices";
  const Pool2d p = pool2d_of(self, kernel, stride, padding, dilation, ceil_mode);
  if (!p.lowerable) {
    note_fallback("aten::max_pool2d_with_indices");
    auto [out, idx] = at::max_pool2d_with_indices(self.cpu(), kernel, stride, padding, dilation, ceil_mode);
    return {back_to(out, self), back_to(idx, self)};
  }
  auto [values, indices] = value_or_throw(session().max_pool2d_with_indices(batched(self, what), p.options), what);
  std::vector<std::int64_t> sizes = sizes_vector(values);
  if (self.dim() == 3) sizes.erase(sizes.begin());
  return {make_tensor(sizes_of(values, sizes, what), sizes), make_tensor(sizes_of(indices, sizes, what), sizes)};
}

at::Tensor max_pool2d_with_indices_backward_kernel(const at::Tensor& grad, const at::Tensor& self,
                                                   c10::IntArrayRef kernel, c10::IntArrayRef stride,
                                                   c10::IntArrayRef padding, c10::IntArrayRef dilation, bool ceil_mode,
                                                   const at::Tensor& indices) {
  constexpr std::string_view what = "max_pool2d_with_indices_backward";
  const Pool2d p = pool2d_of(self, kernel, stride, padding, dilation, ceil_mode);
  if (!p.lowerable || !is_kiln(grad) || grad.scalar_type() != self.scalar_type() || !is_kiln(indices)) {
    note_fallback("aten::max_pool2d_with_indices_backward");
    return at::max_pool2d_with_indices_backward(grad.cpu(), self.cpu(), kernel, stride, padding, dilation, ceil_mode,
                                                indices.cpu())
        .to(self.device());
  }
  Value out = value_or_throw(session().max_pool2d_with_indices_backward(batched(self, what), batched(grad, what),
                                                                        batched(indices, what), p.options),
                             what);
  return make_tensor(sizes_of(out, self.sizes(), what), self.sizes());
}

// ================================ GELU ================================

bool tanh_approximation(c10::string_view approximate) {
  TORCH_CHECK(approximate == "none" || approximate == "tanh", "approximate argument must be either none or tanh.");
  return approximate == "tanh";
}

constexpr double kSqrt2OverPi = 0.7978845608028654;  // √(2/π)
constexpr double kKappa = 0.044715;
constexpr double kInvSqrt2 = 0.7071067811865476;    // 1/√2
constexpr double kInvSqrt2Pi = 0.3989422804014327;  // 1/√(2π)

// tanh(√(2/π)·(x + κx³))
Value gelu_tanh_inner(const Value& x, std::string_view what) {
  Session& s = session();
  Value cube = value_or_throw(s.mul(value_or_throw(s.mul(x, x), what), x), what);
  Value inner = value_or_throw(s.add(x, value_or_throw(s.mul(std::move(cube), kKappa), what)), what);
  return value_or_throw(s.tanh(value_or_throw(s.mul(std::move(inner), kSqrt2OverPi), what)), what);
}

at::Tensor gelu_kernel(const at::Tensor& self, c10::string_view approximate) {
  constexpr std::string_view what = "gelu";
  const bool tanh = tanh_approximation(approximate);
  if (!is_kiln(self) || !kiln_float(self.scalar_type())) {
    note_fallback("aten::gelu");
    return at::gelu(self.cpu(), approximate).to(self.device());
  }
  Session& s = session();
  const Value& x = value_of(self, what);
  if (!tanh) return make_tensor(value_or_throw(s.gelu(x), what), self.sizes());
  // 0.5·x·(1 + tanh(√(2/π)·(x + κx³)))
  Value one_plus = value_or_throw(s.add(gelu_tanh_inner(x, what), 1.0), what);
  Value y = value_or_throw(s.mul(value_or_throw(s.mul(x, 0.5), what), std::move(one_plus)), what);
  return make_tensor(std::move(y), self.sizes());
}

// d/dx of the exact GELU: Φ(x) + x·φ(x).
Value gelu_exact_slope(const Value& x, std::string_view what) {
  Session& s = session();
  const auto v = [&](Result<Value> r) { return value_or_throw(std::move(r), what); };
  Value cdf = v(s.mul(v(s.add(v(s.erf(v(s.mul(x, kInvSqrt2)))), 1.0)), 0.5));
  Value pdf = v(s.mul(v(s.exp(v(s.mul(v(s.mul(x, x)), -0.5)))), kInvSqrt2Pi));
  return v(s.add(std::move(cdf), v(s.mul(x, std::move(pdf)))));
}

// d/dx of the tanh GELU: 0.5(1 + t) + 0.5x(1 − t²)·√(2/π)(1 + 3κx²), t = gelu_tanh_inner(x).
Value gelu_tanh_slope(const Value& x, std::string_view what) {
  Session& s = session();
  const auto v = [&](Result<Value> r) { return value_or_throw(std::move(r), what); };
  Value t = gelu_tanh_inner(x, what);
  Value left = v(s.mul(v(s.add(t, 1.0)), 0.5));
  Value one_minus_t2 = v(s.add(v(s.neg(v(s.mul(t, t)))), 1.0));
  Value slope = v(s.mul(v(s.add(v(s.mul(v(s.mul(x, x)), 3.0 * kKappa)), 1.0)), kSqrt2OverPi));
  Value right = v(s.mul(v(s.mul(v(s.mul(x, 0.5)), std::move(one_minus_t2))), std::move(slope)));
  return v(s.add(std::move(left), std::move(right)));
}

at::Tensor gelu_backward_kernel(const at::Tensor& grad, const at::Tensor& self, c10::string_view approximate) {
  constexpr std::string_view what = "gelu_backward";
  const bool tanh = tanh_approximation(approximate);
  if (!is_kiln(self) || !is_kiln(grad) || !kiln_float(self.scalar_type()) || grad.scalar_type() != self.scalar_type() ||
      !grad.sizes().equals(self.sizes())) {
    note_fallback("aten::gelu_backward");
    return at::gelu_backward(grad.cpu(), self.cpu(), approximate).to(self.device());
  }
  const Value& x = value_of(self, what);
  Value slope = tanh ? gelu_tanh_slope(x, what) : gelu_exact_slope(x, what);
  return make_tensor(value_or_throw(session().mul(value_of(grad, what), std::move(slope)), what), self.sizes());
}

// Inside the namespace so that these names hide the C library's.
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("convolution_overrideable", TORCH_FN(convolution_kernel));
  m.impl("convolution_backward_overrideable", TORCH_FN(convolution_backward_kernel));
  m.impl("convolution", TORCH_FN(convolution_kernel));
  m.impl("convolution_backward", TORCH_FN(convolution_backward_full_kernel));
  m.impl("native_batch_norm", TORCH_FN(native_batch_norm_kernel));
  m.impl("native_batch_norm_backward", TORCH_FN(native_batch_norm_backward_kernel));
  m.impl("native_layer_norm", TORCH_FN(native_layer_norm_kernel));
  m.impl("native_layer_norm_backward", TORCH_FN(native_layer_norm_backward_kernel));
  m.impl("max_pool2d_with_indices", TORCH_FN(max_pool2d_with_indices_kernel));
  m.impl("max_pool2d_with_indices_backward", TORCH_FN(max_pool2d_with_indices_backward_kernel));
  m.impl("gelu", TORCH_FN(gelu_kernel));
  m.impl("gelu_backward", TORCH_FN(gelu_backward_kernel));
}

}  // namespace
}  // namespace kiln::pytorch
