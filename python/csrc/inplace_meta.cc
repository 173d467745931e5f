// PyTorch's own C++ meta kernels for the in-place elementwise ops that training steps run most
// (the optimizers' updates), registered back over the Python ones.
//
// Why: functionalization checks every in-place op on a kiln tensor by running it first on meta
// tensors (its "meta reference": the shape and dtype errors an in-place op has and its functional
// form has not, e.g. `a.add_(b)` where b broadcasts a). `import torch` registers Python meta
// functions (torch/_meta_registrations.py, activate_meta) over the C++ structured meta kernels of
// these ops, so each check entered Python: measured per op on a 32x32 kiln tensor (release, 1
// core), mul_ 15.7 us against 4.0 us without the check, lerp_ 88 us against 4.4. The C++ kernels
// are the ones a libtorch process without Python runs: same checks, same errors, no Python.
//
// Reach: the Meta key is global, so meta tensors of every device in a process that imports kiln
// use these kernels for these ops when PyTorch's Python dispatcher is off. When it is on (dynamo
// and AOTAutograd tracing, where sizes may be symbolic) PyTorch still picks the Python meta
// functions (OpOverload.py_kernels come first). A symbolic size reaching these kernels anyway is
// refused with a message naming the way out (docs/decisions.md, "C++ in-place meta kernels").
#include <ATen/ScalarOps.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/add_meta_dispatch.h>
#include <ATen/ops/addcdiv_meta_dispatch.h>
#include <ATen/ops/addcmul_meta_dispatch.h>
#include <ATen/ops/div_meta_dispatch.h>
#include <ATen/ops/lerp_meta_dispatch.h>
#include <ATen/ops/mul_meta_dispatch.h>
#include <ATen/ops/sqrt_meta_dispatch.h>
#include <ATen/ops/sub_meta_dispatch.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <initializer_list>
#include <string_view>

namespace kiln::pytorch {
namespace {

// TensorIterator (the structured kernels' meta) needs concrete sizes.
void require_concrete(std::string_view op, std::initializer_list<const at::Tensor*> tensors) {
  for (const at::Tensor* t : tensors)
    TORCH_CHECK(!t->unsafeGetTensorImpl()->has_symbolic_sizes_strides(), "kiln: aten::", op,
                ": kiln registers PyTorch's C++ meta kernel for this in-place op (python/csrc/inplace_meta.cc), "
                "which needs concrete sizes; trace symbolic shapes with PyTorch's Python dispatcher enabled "
                "(torch._dispatch.python.enable_python_dispatcher), as dynamo and AOTAutograd do");
}

// The scalar overloads are composites in ATen: the op on the scalar wrapped as a 0-dim tensor.
at::Tensor wrapped(const at::Scalar& s) { return at::native::wrapped_scalar_tensor(s); }

at::Tensor& add_tensor(at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  require_concrete("add_", {&self, &other});
  return at::meta::add_(self, other, alpha);
}
at::Tensor& add_scalar(at::Tensor& self, const at::Scalar& other, const at::Scalar& alpha) {
  require_concrete("add_", {&self});
  return at::meta::add_(self, wrapped(other), alpha);
}
at::Tensor& sub_tensor(at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  require_concrete("sub_", {&self, &other});
  return at::meta::sub_(self, other, alpha);
}
at::Tensor& sub_scalar(at::Tensor& self, const at::Scalar& other, const at::Scalar& alpha) {
  require_concrete("sub_", {&self});
  return at::meta::sub_(self, wrapped(other), alpha);
}
at::Tensor& mul_tensor(at::Tensor& self, const at::Tensor& other) {
  require_concrete("mul_", {&self, &other});
  return at::meta::mul_(self, other);
}
at::Tensor& mul_scalar(at::Tensor& self, const at::Scalar& other) {
  require_concrete("mul_", {&self});
  return at::meta::mul_(self, wrapped(other));
}
at::Tensor& div_tensor(at::Tensor& self, const at::Tensor& other) {
  require_concrete("div_", {&self, &other});
  return at::meta::div_(self, other);
}
at::Tensor& div_scalar(at::Tensor& self, const at::Scalar& other) {
  require_concrete("div_", {&self});
  return at::meta::div_(self, wrapped(other));
}
at::Tensor& lerp_scalar(at::Tensor& self, const at::Tensor& end, const at::Scalar& weight) {
  require_concrete("lerp_", {&self, &end});
  return at::meta::lerp_(self, end, weight);
}
at::Tensor& lerp_tensor(at::Tensor& self, const at::Tensor& end, const at::Tensor& weight) {
  require_concrete("lerp_", {&self, &end, &weight});
  return at::meta::lerp_(self, end, weight);
}
at::Tensor& addcmul(at::Tensor& self, const at::Tensor& t1, const at::Tensor& t2, const at::Scalar& value) {
  require_concrete("addcmul_", {&self, &t1, &t2});
  return at::meta::addcmul_(self, t1, t2, value);
}
at::Tensor& addcdiv(at::Tensor& self, const at::Tensor& t1, const at::Tensor& t2, const at::Scalar& value) {
  require_concrete("addcdiv_", {&self, &t1, &t2});
  return at::meta::addcdiv_(self, t1, t2, value);
}
at::Tensor& sqrt(at::Tensor& self) {
  require_concrete("sqrt_", {&self});
  return at::meta::sqrt_(self);
}

// Registered when the library loads, after `import torch` ran activate_meta: the last kernel
// registered for a key is the one that runs (the dispatcher does not warn for the Meta key).
TORCH_LIBRARY_IMPL(aten, Meta, m) {
  m.impl("add_.Tensor", TORCH_FN(add_tensor));
  m.impl("add_.Scalar", TORCH_FN(add_scalar));
  m.impl("sub_.Tensor", TORCH_FN(sub_tensor));
  m.impl("sub_.Scalar", TORCH_FN(sub_scalar));
  m.impl("mul_.Tensor", TORCH_FN(mul_tensor));
  m.impl("mul_.Scalar", TORCH_FN(mul_scalar));
  m.impl("div_.Tensor", TORCH_FN(div_tensor));
  m.impl("div_.Scalar", TORCH_FN(div_scalar));
  m.impl("lerp_.Scalar", TORCH_FN(lerp_scalar));
  m.impl("lerp_.Tensor", TORCH_FN(lerp_tensor));
  m.impl("addcmul_", TORCH_FN(addcmul));
  m.impl("addcdiv_", TORCH_FN(addcdiv));
  m.impl("sqrt_", TORCH_FN(sqrt));
}

}  // namespace
}  // namespace kiln::pytorch
