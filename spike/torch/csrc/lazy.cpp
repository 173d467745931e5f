// Variant (b): a kiln tensor is an opaque TensorImpl holding a "lazy id" (here, toy-wise, a
// contiguous CPU at::Tensor that stands for the value the id will have). It has sizes, a dtype
// and a device but no storage. Every user-visible kiln tensor is wrapped in a
// FunctionalTensorWrapper (PyTorch's functionalization, as torch_xla and the lazy tensor core
// use it), so the backend only ever sees out-of-place ops: views arrive as *_copy ops, in-place
// ops as their functional variants, and writes through views are replayed onto the base by
// the wrapper (with *_scatter ops or the view inverses).
#include "common.h"

#include <ATen/FunctionalTensorWrapper.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/_local_scalar_dense.h>
#include <ATen/ops/add.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mul.h>
#include <c10/core/TensorImpl.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <chrono>

namespace kiln_spike {

const char* const kVariant = "lazy";

namespace {

constexpr c10::DeviceType kKiln = c10::DeviceType::PrivateUse1;

// The opaque tensor. In kiln the payload would be a lazy id into the Session's graph; the
// TensorImpl only carries metadata (sizes, contiguous strides, dtype, device).
struct LazyImpl final : c10::TensorImpl {
  at::Tensor value;  // toy stand-in for the lazy id

  explicit LazyImpl(at::Tensor v)
      : c10::TensorImpl(c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), v.dtype(), c10::Device(kKiln, 0)),
        value(std::move(v)) {
    refresh_from_value();
    set_storage_access_should_throw();  // data_ptr()/storage() on the inner tensor throw
  }

  void refresh_from_value() {
    set_sizes_and_strides(value.sizes(), value.strides());
    data_type_ = value.dtype();
  }

  // Needed by detach()/autograd (variable_data) and by shallow copies.
  c10::intrusive_ptr<c10::TensorImpl> shallow_copy_and_detach(const c10::VariableVersion& vv,
                                                              bool allow_change) const override {
    auto impl = c10::make_intrusive<LazyImpl>(value);
    copy_tensor_metadata(this, impl.get(), vv, allow_change);
    return impl;
  }
  c10::intrusive_ptr<c10::TensorImpl> shallow_copy_and_detach(c10::VariableVersion&& vv,
                                                              bool allow_change) const override {
    auto impl = c10::make_intrusive<LazyImpl>(value);
    copy_tensor_metadata(this, impl.get(), std::move(vv), allow_change);
    return impl;
  }
  void shallow_copy_from(const c10::intrusive_ptr<c10::TensorImpl>& impl) override {
    auto* other = dynamic_cast<LazyImpl*>(impl.get());
    TORCH_INTERNAL_ASSERT(other, "kiln: shallow_copy_from a non-kiln tensor");
    copy_tensor_metadata(other, this, version_counter(), allow_tensor_metadata_change());
    value = other->value;
  }

 private:
  const char* tensorimpl_type_name() const override { return "kiln::LazyImpl"; }
};

LazyImpl* impl_of(const at::Tensor& t) {
  auto* p = dynamic_cast<LazyImpl*>(t.unsafeGetTensorImpl());
  TORCH_CHECK(p, "kiln: expected a kiln (lazy) tensor, got ", t.toString(),
              at::functionalization::impl::isFunctionalTensor(t) ? " (a functional wrapper)" : "");
  return p;
}

// The value of a kiln tensor, or a CPU tensor unchanged (wrapped scalars, copy sources).
at::Tensor value_of(const at::Tensor& t) { return t.device().type() == kKiln ? impl_of(t)->value : t; }

// Note [kiln functionalization] (the rule torch/csrc/lazy uses): a kernel that creates a kiln
// tensor from nothing (a factory, or a copy from the CPU) wraps it in a FunctionalTensorWrapper
// unless it runs inside the functionalization pass (Functionalize is then in the TLS exclude
// set), which wraps outputs itself.
at::Tensor make_kiln(at::Tensor cpu_value) {
  auto t = at::detail::make_tensor<LazyImpl>(cpu_value.contiguous());
  if (c10::impl::tls_local_dispatch_key_set().excluded_.has(c10::DispatchKey::Functionalize)) {
    return t;
  }
  return at::functionalization::impl::to_functional_tensor(t);
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype, std::optional<c10::Layout>,
                               std::optional<c10::Device>, std::optional<bool>, std::optional<c10::MemoryFormat>) {
  return make_kiln(at::empty(size, at::TensorOptions().dtype(c10::dtype_or_default(dtype))));
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef /*stride: always contiguous*/,
                         std::optional<c10::ScalarType> dtype, std::optional<c10::Layout> l,
                         std::optional<c10::Device> d, std::optional<bool> p) {
  return empty_memory_format(size, dtype, l, d, p, std::nullopt);
}

// cpu -> kiln (the dispatcher sends x.to("kiln") here with a CPU self, as in the lazy tensor
// core's _to_copy), kiln -> cpu, kiln -> kiln (dtype change).
at::Tensor to_copy(const at::Tensor& self, std::optional<c10::ScalarType> dtype, std::optional<c10::Layout>,
                   std::optional<c10::Device> device, std::optional<bool>, bool, std::optional<c10::MemoryFormat>) {
  auto v = value_of(self);
  auto st = dtype.value_or(self.scalar_type());
  if (device && device->type() != kKiln) {
    return v.to(v.options().dtype(st).device(*device), /*non_blocking=*/false, /*copy=*/true);
  }
  return make_kiln(v.to(st, /*non_blocking=*/false, /*copy=*/true));
}

// dst.copy_(self) where one side is kiln. A kiln dst is a fresh inner tensor (functionalization
// never hands the backend a mutation of a user-visible tensor): its lazy id is replaced.
at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool) {
  if (dst.device().type() == kKiln) {
    auto* d = impl_of(dst);
    d->value = value_of(self).to(dst.scalar_type()).expand(dst.sizes()).contiguous();
  } else {
    dst.copy_(value_of(self));
  }
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  if (dst.device().type() == kKiln) {
    auto* d = impl_of(dst);
    d->value = value_of(self).to(dst.scalar_type()).contiguous();
    d->refresh_from_value();
  } else {
    dst.resize_(self.sizes()).copy_(value_of(self));
  }
  return dst;
}

// aten::copy, the functional form of copy_ that functionalization emits.
at::Tensor copy(const at::Tensor& self, const at::Tensor& src, bool) {
  return make_kiln(value_of(src).to(self.scalar_type()).expand(self.sizes()).contiguous());
}

at::Scalar local_scalar_dense(const at::Tensor& self) { return at::_local_scalar_dense(value_of(self)); }

// Two "lowered" compute ops (in kiln: a node appended to the lazy graph).
at::Tensor add(const at::Tensor& a, const at::Tensor& b, const at::Scalar& alpha) {
  return make_kiln(at::add(value_of(a), value_of(b), alpha));
}
at::Tensor mul(const at::Tensor& a, const at::Tensor& b) { return make_kiln(at::mul(value_of(a), value_of(b))); }

}  // namespace
}  // namespace kiln_spike

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  using namespace kiln_spike;
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("_to_copy", to_copy);
  m.impl("_copy_from", copy_from);
  m.impl("_copy_from_and_resize", copy_from_and_resize);
  m.impl("copy", copy);
  m.impl("_local_scalar_dense", local_scalar_dense);
  m.impl("add.Tensor", add);
  m.impl("mul.Tensor", mul);

  // The view_copy and scatter ops that functionalization emits have composite kernels that
  // call real view ops on the (storage-less) inner tensor; pin them to the CPU fallback until
  // kiln lowers them (reshape/transpose/slice/... nodes). A registration here beats the
  // composite kernel; the catch-all fallback alone does not.
  const auto fb = [] { return torch::CppFunction::makeFromBoxedFunction<&kiln_spike::counted_cpu_fallback>(); };
  for (const char* op :
       {"view_copy",          "_unsafe_view",  "_reshape_alias_copy", "as_strided_copy",   "t_copy",
        "transpose_copy.int", "permute_copy",  "expand_copy",         "slice_copy.Tensor", "select_copy.int",
        "unsqueeze_copy",     "squeeze_copy",  "squeeze_copy.dim",    "squeeze_copy.dims", "alias_copy",
        "detach_copy",        "diagonal_copy", "unfold_copy",         "split_copy.Tensor", "split_with_sizes_copy",
        "unbind_copy.int",    "narrow_copy",   "slice_scatter",       "select_scatter",    "diagonal_scatter",
        "as_strided_scatter"}) {
    m.impl(op, fb());
  }
}

namespace kiln_spike {
namespace {

// bench_add on the inner (unwrapped) tensors with functionalization skipped: the difference to
// bench_add on the wrappers is what functionalization costs per op.
double bench_add_inner(const at::Tensor& a, const at::Tensor& b, int64_t n) {
  at::functionalization::impl::sync(a);
  at::functionalization::impl::sync(b);
  const auto ia = at::functionalization::impl::from_functional_tensor(a);
  const auto ib = at::functionalization::impl::from_functional_tensor(b);
  c10::impl::ExcludeDispatchKeyGuard skip(c10::DispatchKey::Functionalize);
  at::Tensor r = at::add(ia, ib);
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < n; ++i) {
    r = at::add(ia, ib);
  }
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / static_cast<double>(n);
}

}  // namespace
}  // namespace kiln_spike

TORCH_LIBRARY_FRAGMENT(kiln_spike, m) {
  m.def("bench_add_inner(Tensor a, Tensor b, int n) -> float", &kiln_spike::bench_add_inner);
}
