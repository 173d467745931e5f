// torch.optim's fused Adam and AdamW (`fused=True`: aten::_fused_adam_ and _fused_adamw_) on kiln:
// one call updates every parameter of a group, queued parameter by parameter so that each
// parameter's update (weight decay, both moments, bias corrections, the step) is one run of
// elementwise ops over one shape, which the fusion search takes as one kernel. The foreach path
// (PyTorch's default) issues the same update as ~10 list ops, each a separate pass over every
// parameter, and each in-place list op is checked on meta tensors by functionalization first.
//
// Two registrations:
//  - PrivateUse1 (the kernel on kiln's inner tensors): the update, writing new values into the
//    tensors it was given, as kiln's other in-place kernels do (KilnTensorImpl::set_value).
//  - Functionalize, replacing PyTorch's generated kernel for these four overloads: PyTorch's
//    refuses a call whose optional list `max_exp_avg_sqs` is empty (amsgrad off, the usual case):
//    it counts an empty list as "not functional" and asserts that a functional tensor is never
//    written into a non-functional one. This kernel does what the generated one does (sync the
//    wrappers, run the op on their inner tensors with functionalization skipped, then replace,
//    commit and sync every mutated wrapper), treating an empty list as holding nothing. Tensors of
//    other devices take the same path (their own kernels run on the inner tensors).
//
// The maths is PyTorch's (torch.optim.Adam / AdamW docs, and its CPU fused kernel): bias
// corrections from each parameter's step tensor, computed on the device in f64 (PyTorch: double on
// the host) so that no step is read back; the elementwise update in the parameter's dtype (f32 for
// f16 / bf16, PyTorch's opmath type).
#include <ATen/FunctionalTensorWrapper.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/_fused_adam_ops.h>
#include <ATen/ops/_fused_adamw_ops.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string_view>
#include <vector>

#include "state.h"
#include "tensor_impl.h"

namespace kiln::pytorch {
namespace {

using Value = runtime::Tensor;

enum class Decay { Adam, AdamW };  // Adam: grad += wd * param; AdamW: param *= 1 - lr * wd

struct Hyper {
  double lr, beta1, beta2, weight_decay, eps;
  bool amsgrad, maximize;
};

// The lists of one call, all of one length (max_exp_avg_sqs: empty unless amsgrad).
struct Lists {
  at::TensorList params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps;
};

void check_lists(const Lists& l, const Hyper& h, std::string_view what) {
  const std::size_t n = l.params.size();
  TORCH_CHECK(l.grads.size() == n && l.exp_avgs.size() == n && l.exp_avg_sqs.size() == n && l.steps.size() == n,
              "kiln: ", what, ": the params, grads, exp_avgs, exp_avg_sqs and state_steps lists differ in length");
  TORCH_CHECK(!h.amsgrad || l.max_exp_avg_sqs.size() == n, "kiln: ", what,
              ": amsgrad needs one max_exp_avg_sq per param");
}

// `v` (a [1] value) as [1, ..., 1] of rank `rank`, so that it broadcasts over a parameter.
Value broadcastable(const Value& v, std::size_t rank, std::string_view what) {
  return reshaped(v, std::vector<std::int64_t>(std::max<std::size_t>(rank, 1), 1), what);
}

// Per parameter: -lr / (1 - beta1^step) and sqrt(1 - beta2^step), as [P] values in `dtype`,
// computed in f64 from the concatenated step tensors in a few ops for the whole group.
struct Corrections {
  Value neg_step_size, bias_correction2_sqrt;
};

Corrections corrections(at::TensorList steps, const Hyper& h, ir::DType dtype, std::string_view what) {
  runtime::Session& s = session();
  std::vector<Value> parts;
  parts.reserve(steps.size());
  for (const at::Tensor& t : steps) {
    TORCH_CHECK(t.numel() == 1, "kiln: ", what, ": a state_step must hold one element, not ", t.numel());
    parts.push_back(reshaped(value_of(t, what), {1}, what));  // a 0-dim step is [1] already: no op
  }
  Value step = value_or_throw(parts.size() == 1 ? Result<Value>(parts[0]) : s.cat(std::move(parts), 0), what);
  step = cast_to(step, ir::dtypes::f64, what);
  // 1 - beta^step = 1 - exp(step * ln(beta)); beta = 0 gives ln = -inf and a correction of 1.
  auto one_minus_pow = [&](double beta) {
    Value x = value_or_throw(s.mul(step, std::log(beta)), what);
    x = value_or_throw(s.exp(std::move(x)), what);
    return value_or_throw(s.add(value_or_throw(s.neg(std::move(x)), what), 1.0), what);
  };
  Value bc1 = one_minus_pow(h.beta1);
  Value neg_step = value_or_throw(s.mul(value_or_throw(s.recip(std::move(bc1)), what), -h.lr), what);
  Value bc2_sqrt = value_or_throw(s.sqrt(one_minus_pow(h.beta2)), what);
  return {cast_to(neg_step, dtype, what), cast_to(bc2_sqrt, dtype, what)};
}

// Element i of a [P] value, shaped to broadcast over a tensor of rank `rank`.
Value element(const Value& v, std::size_t i, std::size_t count, std::size_t rank, std::string_view what) {
  Value e = v;
  if (count > 1) {
    const auto at = static_cast<std::int64_t>(i);
    e = value_or_throw(session().slice(v, {ir::Slice{at, at + 1, 1}}), what);
  }
  return broadcastable(e, rank, what);
}

// A scalar tensor operand (grad_scale, found_inf): kiln or CPU, as a [1,..,1] value.
Value scalar_operand(const at::Tensor& t, ir::DType dtype, std::size_t rank, std::string_view what) {
  TORCH_CHECK(t.numel() == 1, "kiln: ", what, ": grad_scale and found_inf must hold one element, not ", t.numel());
  // operand() rank-aligns a kiln tensor and takes a CPU one as a 0-dim scalar.
  return operand(is_kiln(t) ? t : t.reshape({}), dtype, rank, what);
}

// The new values of one parameter's tensors.
struct Updated {
  Value param, exp_avg, exp_avg_sq;
  std::optional<Value> grad;  // grad_scale given: the unscaled grad is written back, as PyTorch does
  std::optional<Value> max_exp_avg_sq;
};

// PyTorch's lerp(self, end, w) for a Python-number weight: self + w (end - self) when |w| < 0.5,
// else end - (end - self)(1 - w).
Value lerp(const Value& self, const Value& end, double w, std::string_view what) {
  runtime::Session& s = session();
  Value diff = value_or_throw(s.sub(end, self), what);
  if (std::abs(w) < 0.5) return value_or_throw(s.add(self, value_or_throw(s.mul(std::move(diff), w), what)), what);
  return value_or_throw(s.sub(end, value_or_throw(s.mul(std::move(diff), 1.0 - w), what)), what);
}

Updated update_one(const Lists& l, std::size_t i, const Hyper& h, Decay decay, const Corrections& c,
                   const std::optional<Value>& grad_scale, std::string_view what) {
  runtime::Session& s = session();
  const at::Tensor& p = l.params[i];
  const std::size_t rank = static_cast<std::size_t>(std::max<std::int64_t>(p.dim(), 1));
  const ir::DType stored = to_kiln_dtype(p.scalar_type(), what);
  TORCH_CHECK(stored.is_float(), "kiln: ", what, ": parameters must be floating point, not ", p.scalar_type());
  const ir::DType math = stored == ir::dtypes::f64 ? ir::dtypes::f64 : ir::dtypes::f32;
  auto load = [&](const at::Tensor& t) {
    TORCH_CHECK(t.sizes().equals(p.sizes()), "kiln: ", what, ": a state tensor of sizes ", t.sizes(),
                " for a parameter of sizes ", p.sizes());
    return cast_to(value_of(t, what), math, what);
  };
  Value param = load(p), grad = load(l.grads[i]), m = load(l.exp_avgs[i]), v = load(l.exp_avg_sqs[i]);
  std::optional<Value> unscaled, vmax;
  if (grad_scale) {
    grad = value_or_throw(s.div(std::move(grad), *grad_scale), what);
    unscaled = cast_to(grad, stored, what);
  }
  if (h.maximize) grad = value_or_throw(s.neg(std::move(grad)), what);
  if (h.weight_decay != 0) {
    if (decay == Decay::AdamW) {
      param = value_or_throw(s.mul(std::move(param), 1.0 - h.lr * h.weight_decay), what);
    } else {
      grad = value_or_throw(s.add(std::move(grad), value_or_throw(s.mul(param, h.weight_decay), what)), what);
    }
  }
  m = lerp(m, grad, 1.0 - h.beta1, what);
  Value g2 = value_or_throw(s.mul(value_or_throw(s.mul(grad, grad), what), 1.0 - h.beta2), what);
  v = value_or_throw(s.add(value_or_throw(s.mul(std::move(v), h.beta2), what), std::move(g2)), what);
  Value second = v;
  if (h.amsgrad) {
    second = value_or_throw(s.maximum(load(l.max_exp_avg_sqs[i]), v), what);
    vmax = cast_to(second, stored, what);
  }
  const std::size_t count = l.params.size();
  Value denom = value_or_throw(
      s.div(value_or_throw(s.sqrt(std::move(second)), what), element(c.bias_correction2_sqrt, i, count, rank, what)),
      what);
  denom = value_or_throw(s.add(std::move(denom), h.eps), what);
  Value step = value_or_throw(
      s.mul(value_or_throw(s.div(m, std::move(denom)), what), element(c.neg_step_size, i, count, rank, what)), what);
  return Updated{cast_to(value_or_throw(s.add(std::move(param), std::move(step)), what), stored, what),
                 cast_to(m, stored, what), cast_to(v, stored, what), std::move(unscaled), std::move(vmax)};
}

// found_inf != 0 (GradScaler saw an inf or a NaN): the step is skipped, every tensor keeps its value.
Value unless_found_inf(Value updated, const at::Tensor& old, const std::optional<Value>& skip, std::string_view what) {
  if (!skip) return updated;
  return value_or_throw(session().mask_where(std::move(updated), *skip, value_of(old, what)), what);
}

// The kernel on kiln's inner tensors: every list written in place (set_value).
void fused_adam_kiln(Decay decay, const Lists& l, const Hyper& h, const std::optional<at::Tensor>& grad_scale,
                     const std::optional<at::Tensor>& found_inf) {
  const std::string_view what = decay == Decay::AdamW ? "_fused_adamw_" : "_fused_adam_";
  check_lists(l, h, what);
  if (l.params.empty()) return;
  const ir::DType math = l.params[0].scalar_type() == c10::ScalarType::Double ? ir::dtypes::f64 : ir::dtypes::f32;
  const Corrections c = corrections(l.steps, h, math, what);
  for (std::size_t i = 0; i < l.params.size(); ++i) {
    const std::size_t rank = static_cast<std::size_t>(std::max<std::int64_t>(l.params[i].dim(), 1));
    const ir::DType pm = l.params[i].scalar_type() == c10::ScalarType::Double ? ir::dtypes::f64 : ir::dtypes::f32;
    TORCH_CHECK(pm == math, "kiln: ", what, ": one call updates parameters of one precision (f64, or f32/f16/bf16)");
    std::optional<Value> scale, skip;
    if (grad_scale && grad_scale->defined()) scale = scalar_operand(*grad_scale, pm, rank, what);
    if (found_inf && found_inf->defined())
      skip = cast_to(scalar_operand(*found_inf, ir::dtypes::f32, rank, what), ir::dtypes::boolean, what);
    Updated u = update_one(l, i, h, decay, c, scale, what);
    auto write = [&](const at::Tensor& t, Value v) {
      impl_of(t, what).set_value(unless_found_inf(std::move(v), t, skip, what), t.sizes());
    };
    write(l.params[i], std::move(u.param));
    if (u.grad) write(l.grads[i], std::move(*u.grad));
    write(l.exp_avgs[i], std::move(u.exp_avg));
    write(l.exp_avg_sqs[i], std::move(u.exp_avg_sq));
    if (u.max_exp_avg_sq) write(l.max_exp_avg_sqs[i], std::move(*u.max_exp_avg_sq));
  }
}

// lr of the tensor_lr overloads: a host number (a kiln lr is read back: one sync per call).
double lr_value(const at::Tensor& lr, std::string_view what) {
  TORCH_CHECK(lr.numel() == 1, "kiln: ", what, ": lr must hold one element, not ", lr.numel());
  return lr.item().toDouble();
}

template <Decay D>
void kiln_kernel(at::TensorList self, at::TensorList grads, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
                 at::TensorList max_exp_avg_sqs, at::TensorList state_steps, double lr, double beta1, double beta2,
                 double weight_decay, double eps, bool amsgrad, bool maximize,
                 const std::optional<at::Tensor>& grad_scale, const std::optional<at::Tensor>& found_inf) {
  fused_adam_kiln(D, Lists{self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps},
                  Hyper{lr, beta1, beta2, weight_decay, eps, amsgrad, maximize}, grad_scale, found_inf);
}

template <Decay D>
void kiln_kernel_tensor_lr(at::TensorList self, at::TensorList grads, at::TensorList exp_avgs,
                           at::TensorList exp_avg_sqs, at::TensorList max_exp_avg_sqs, at::TensorList state_steps,
                           const at::Tensor& lr, double beta1, double beta2, double weight_decay, double eps,
                           bool amsgrad, bool maximize, const std::optional<at::Tensor>& grad_scale,
                           const std::optional<at::Tensor>& found_inf) {
  kiln_kernel<D>(self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps,
                 lr_value(lr, D == Decay::AdamW ? "_fused_adamw_" : "_fused_adam_"), beta1, beta2, weight_decay, eps,
                 amsgrad, maximize, grad_scale, found_inf);
}

// ---- Functionalize ------------------------------------------------------------------------------

bool functional(at::TensorList l) {
  for (const at::Tensor& t : l)
    if (!at::functionalization::impl::isFunctionalTensor(t)) return false;
  return true;
}

// The inner tensors of a list of wrappers (synced first), or the list itself when it is not functional.
std::vector<at::Tensor> unwrapped(at::TensorList l) {
  if (l.empty() || !functional(l)) return l.vec();
  at::functionalization::impl::sync(l);
  return at::functionalization::impl::from_functional_tensor(l);
}

std::optional<at::Tensor> unwrapped(const std::optional<at::Tensor>& t) {
  if (!t || !t->defined() || !at::functionalization::impl::isFunctionalTensor(*t)) return t;
  at::functionalization::impl::sync(*t);
  return at::functionalization::impl::from_functional_tensor(*t);
}

// Each wrapper of `wrappers` now holds the new value of its inner tensor (`inner`, written in place
// by the kernel below the Functionalize key): replace, commit (its views see it) and sync.
void publish(at::TensorList wrappers, const std::vector<at::Tensor>& inner) {
  if (wrappers.empty() || !functional(wrappers)) return;
  for (std::size_t i = 0; i < wrappers.size(); ++i) {
    at::functionalization::impl::replace_(wrappers[i], inner[i]);
    at::functionalization::impl::commit_update(wrappers[i]);
    at::functionalization::impl::sync(wrappers[i]);
  }
}

// A tensor the op may write without touching `t`: on kiln a new handle on the same immutable value
// (at::clone would queue an Empty and a copy), elsewhere a clone.
at::Tensor fresh_copy(const at::Tensor& t) {
  if (is_kiln(t)) return at::detail::make_tensor<KilnTensorImpl>(value_of(t, "_fused_adam_"), t.sizes());
  return t.clone();
}

// The generated kernel's steps. The inner call writes into fresh copies of the mutated lists' inner
// tensors (fresh_copy), because the inner tensors before the call may also be the base of another
// wrapper's pending views. Without a functional tensor among the arguments the op runs on them in
// place, as the generated kernel does.
template <class Redispatch>
void functionalized(at::TensorList self, at::TensorList grads, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
                    at::TensorList max_exp_avg_sqs, at::TensorList state_steps,
                    const std::optional<at::Tensor>& grad_scale, const std::optional<at::Tensor>& found_inf,
                    Redispatch&& redispatch) {
  const at::TensorList mutated[] = {self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs};
  bool any = false, all = true;
  for (const at::TensorList l : mutated) {
    if (l.empty()) continue;  // PyTorch's kernel counted an empty list as a non-functional tensor
    const bool f = functional(l);
    any = any || f;
    all = all && f;
  }
  if (!any) {
    at::AutoDispatchSkipFunctionalize guard;
    std::vector<at::Tensor> p = self.vec(), g = grads.vec(), m = exp_avgs.vec(), v = exp_avg_sqs.vec(),
                            vmax = max_exp_avg_sqs.vec(), steps = state_steps.vec();
    std::optional<at::Tensor> scale = grad_scale, inf = found_inf;
    redispatch(p, g, m, v, vmax, steps, scale, inf);
    return;
  }
  TORCH_CHECK(all,
              "kiln: a fused optimizer step mixes functional tensors (kiln's, or under torch.func.functionalize) "
              "with others among the tensors it writes");
  std::vector<at::Tensor> p = unwrapped(self), g = unwrapped(grads), m = unwrapped(exp_avgs),
                          v = unwrapped(exp_avg_sqs), vmax = unwrapped(max_exp_avg_sqs), steps = unwrapped(state_steps);
  std::optional<at::Tensor> scale = unwrapped(grad_scale), inf = unwrapped(found_inf);
  const bool grads_written = grad_scale && grad_scale->defined();  // else the op only reads them
  {
    at::AutoDispatchSkipFunctionalize guard;  // the copies and the op run on the inner tensors
    for (std::vector<at::Tensor>* l : {&p, &g, &m, &v, &vmax}) {
      if (l == &g && !grads_written) continue;
      for (at::Tensor& t : *l) t = fresh_copy(t);
    }
    redispatch(p, g, m, v, vmax, steps, scale, inf);
  }
  publish(self, p);
  if (grads_written) publish(grads, g);
  publish(exp_avgs, m);
  publish(exp_avg_sqs, v);
  publish(max_exp_avg_sqs, vmax);
}

template <Decay D>
void functionalize_kernel(at::TensorList self, at::TensorList grads, at::TensorList exp_avgs,
                          at::TensorList exp_avg_sqs, at::TensorList max_exp_avg_sqs, at::TensorList state_steps,
                          double lr, double beta1, double beta2, double weight_decay, double eps, bool amsgrad,
                          bool maximize, const std::optional<at::Tensor>& grad_scale,
                          const std::optional<at::Tensor>& found_inf) {
  functionalized(self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, grad_scale, found_inf,
                 [&](auto& p, auto& g, auto& m, auto& v, auto& vmax, auto& steps, auto& scale, auto& inf) {
                   using Op = std::conditional_t<D == Decay::AdamW, at::_ops::_fused_adamw_, at::_ops::_fused_adam_>;
                   Op::call(p, g, m, v, vmax, steps, lr, beta1, beta2, weight_decay, eps, amsgrad, maximize, scale,
                            inf);
                 });
}

template <Decay D>
void functionalize_kernel_tensor_lr(at::TensorList self, at::TensorList grads, at::TensorList exp_avgs,
                                    at::TensorList exp_avg_sqs, at::TensorList max_exp_avg_sqs,
                                    at::TensorList state_steps, const at::Tensor& lr, double beta1, double beta2,
                                    double weight_decay, double eps, bool amsgrad, bool maximize,
                                    const std::optional<at::Tensor>& grad_scale,
                                    const std::optional<at::Tensor>& found_inf) {
  const std::optional<at::Tensor> inner_lr = unwrapped(std::optional<at::Tensor>(lr));
  functionalized(
      self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, grad_scale, found_inf,
      [&](auto& p, auto& g, auto& m, auto& v, auto& vmax, auto& steps, auto& scale, auto& inf) {
        using Op =
            std::conditional_t<D == Decay::AdamW, at::_ops::_fused_adamw__tensor_lr, at::_ops::_fused_adam__tensor_lr>;
        Op::call(p, g, m, v, vmax, steps, *inner_lr, beta1, beta2, weight_decay, eps, amsgrad, maximize, scale, inf);
      });
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_fused_adam_", TORCH_FN(kiln_kernel<Decay::Adam>));
  m.impl("_fused_adamw_", TORCH_FN(kiln_kernel<Decay::AdamW>));
  m.impl("_fused_adam_.tensor_lr", TORCH_FN(kiln_kernel_tensor_lr<Decay::Adam>));
  m.impl("_fused_adamw_.tensor_lr", TORCH_FN(kiln_kernel_tensor_lr<Decay::AdamW>));
}

// The Functionalize kernels, registered when the library loads, like TORCH_LIBRARY_IMPL's, but
// with PyTorch's warning about overriding a kernel silenced (SilencedWarnings).
struct FunctionalizeRegistration {
  FunctionalizeRegistration() {
    const SilencedWarnings silenced;
    library.emplace(torch::Library::IMPL, "aten", c10::DispatchKey::Functionalize, __FILE__, __LINE__);
    library->impl("_fused_adam_", TORCH_FN(functionalize_kernel<Decay::Adam>));
    library->impl("_fused_adamw_", TORCH_FN(functionalize_kernel<Decay::AdamW>));
    library->impl("_fused_adam_.tensor_lr", TORCH_FN(functionalize_kernel_tensor_lr<Decay::Adam>));
    library->impl("_fused_adamw_.tensor_lr", TORCH_FN(functionalize_kernel_tensor_lr<Decay::AdamW>));
  }
  std::optional<torch::Library> library;  // registered for as long as the extension is loaded
};
const FunctionalizeRegistration functionalize_registration;

}  // namespace
}  // namespace kiln::pytorch
