// The kernels every PyTorch device needs: factories, transfers to and from the CPU, copies,
// fills and reading one element (docs/pytorch.md, "What is lowered").
#include <ATen/FunctionalTensorWrapper.h>
#include <ATen/ops/_local_scalar_dense.h>
#include <ATen/ops/_to_copy.h>
#include <ATen/ops/copy_ops.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/autograd/VariableTypeUtils.h>
#include <torch/library.h>

#include <cstddef>
#include <span>

#include "state.h"
#include "tensor_impl.h"

namespace kiln::pytorch {
namespace {

void check_strided(std::optional<c10::Layout> layout, std::string_view what) {
  TORCH_CHECK(!layout || *layout == c10::Layout::Strided, "kiln: ", what, ": only strided (dense) tensors, not ",
              *layout);
}

// A CPU tensor's elements into a new kiln value (one copy: the bytes go straight to the device).
runtime::Tensor upload(const at::Tensor& cpu, std::string_view what) {
  TORCH_CHECK(cpu.device().is_cpu(), "kiln: ", what, ": expected a CPU tensor to copy from, got ", cpu.device());
  const at::Tensor c = cpu.contiguous();
  const ir::DType dtype = to_kiln_dtype(c.scalar_type(), what);
  const auto bytes = std::span<const std::byte>(static_cast<const std::byte*>(c.const_data_ptr()), c.nbytes());
  return value_or_throw(session().from_host_bytes(dtype, bytes, kiln_shape(c.sizes())), what);
}

// A kiln tensor's elements in a new contiguous CPU tensor of its dtype (drains what it waits on:
// a queued op that failed is reported here, naming it).
at::Tensor download(const at::Tensor& t, std::string_view what) {
  at::Tensor host = at::empty(t.sizes(), at::TensorOptions().dtype(t.scalar_type()));
  const auto dst = std::span<std::byte>(static_cast<std::byte*>(host.mutable_data_ptr()), host.nbytes());
  check(session().to_host_bytes(value_of(t, what), dst), what);
  sync_point();
  return host;
}

// `value` (of PyTorch sizes `from`) broadcast to PyTorch sizes `to`, as copy_ broadcasts its source.
runtime::Tensor broadcast_to(runtime::Tensor value, c10::IntArrayRef from, c10::IntArrayRef to, std::string_view what) {
  if (from.equals(to)) return value;
  const ir::Shape target = kiln_shape(to);
  if (value.shape().size() != target.size()) {
    value = value_or_throw(session().reshape(std::move(value), aligned_args(from, target.size())), what);
  }
  return value_or_throw(session().expand(std::move(value), target), what);
}

// The value `dst` gets from dst.copy_(src): src (kiln or CPU) in dst's dtype, broadcast to its sizes.
runtime::Tensor copied_value(const at::Tensor& dst, const at::Tensor& src, std::string_view what) {
  runtime::Tensor v = is_kiln(src) ? value_of(src, what) : upload(src, what);
  v = cast_to(v, to_kiln_dtype(dst.scalar_type(), what), what);
  return broadcast_to(std::move(v), src.sizes(), dst.sizes(), what);
}

at::Tensor empty_memory_format_kernel(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                                      std::optional<c10::Layout> layout, std::optional<c10::Device>,
                                      std::optional<bool>, std::optional<c10::MemoryFormat>) {
  check_strided(layout, "empty");
  const ir::DType d = to_kiln_dtype(c10::dtype_or_default(dtype), "empty");
  return make_tensor(value_or_throw(session().empty(kiln_shape(size), d), "empty"), size);
}

// Strides are always contiguous on kiln (docs/pytorch.md, "Known differences").
at::Tensor empty_strided_kernel(c10::IntArrayRef size, c10::IntArrayRef, std::optional<c10::ScalarType> dtype,
                                std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                                std::optional<bool> pin_memory) {
  return empty_memory_format_kernel(size, dtype, layout, device, pin_memory, std::nullopt);
}

// x.to(...): CPU → kiln (the dispatcher brings x.to("kiln") here with a CPU self), kiln → CPU,
// kiln → kiln (a dtype change; the same dtype shares the immutable value).
at::Tensor to_copy_kernel(const at::Tensor& self, std::optional<c10::ScalarType> dtype,
                          std::optional<c10::Layout> layout, std::optional<c10::Device> device, std::optional<bool>,
                          bool non_blocking, std::optional<c10::MemoryFormat> memory_format) {
  check_strided(layout, "to");
  const c10::ScalarType type = dtype.value_or(self.scalar_type());
  const c10::Device target = device.value_or(self.device());
  if (target.type() == kKilnDevice) {
    if (is_kiln(self)) return make_tensor(cast_to(value_of(self, "to"), to_kiln_dtype(type, "to"), "to"), self.sizes());
    // The cast on the CPU side: cheaper than on kiln, and PyTorch's own conversion rules.
    return make_tensor(upload(self.to(type), "to"), self.sizes());
  }
  const at::Tensor host = download(self, "to");
  return host.to(host.options().dtype(type).device(target), non_blocking, /*copy=*/false, memory_format);
}

// _to_copy under functionalization. PyTorch's kernel wraps the result only for the devices that
// opted into functionalization (XLA and Lazy, FunctionalizeFallbackKernel.cpp), so a kiln tensor
// from x.to(dtype) or x.float() came back unwrapped, and an in-place op on it with a wrapped
// operand failed PyTorch's check ("mutating a non-functional tensor with a functional tensor").
// This is PyTorch's kernel with kiln among those devices; every other device behaves as before.
at::Tensor to_copy_functionalize_kernel(const at::Tensor& self, std::optional<c10::ScalarType> dtype,
                                        std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                                        std::optional<bool> pin_memory, bool non_blocking,
                                        std::optional<c10::MemoryFormat> memory_format) {
  at::Tensor inner = self;
  if (at::functionalization::impl::isFunctionalTensor(self)) {
    at::functionalization::impl::sync(self);
    inner = at::functionalization::impl::from_functional_tensor(self);
  }
  const at::AutoDispatchSkipFunctionalize skip;
  at::Tensor out = at::_to_copy(inner, dtype, layout, device, pin_memory, non_blocking, memory_format);
  const c10::DeviceType target = device.value_or(self.device()).type();
  const bool opted_in = target == c10::DeviceType::XLA || target == c10::DeviceType::Lazy || target == kKilnDevice;
  if (!opted_in && !c10::impl::tls_local_dispatch_key_set().included_.has(c10::DispatchKey::Functionalize)) return out;
  return at::functionalization::impl::to_functional_tensor(out);
}

// other.copy_(kiln) where `other` is not tracked by functionalization (a CPU tensor), from any
// caller, C++ included (torch.distributed's DDP reads its checks back this way): functionalization
// refuses to write a tensor it does not track with one it does ("mutating a non-functional tensor
// with a functional tensor"; PyTorch exempts only XLA). ADInplaceOrView runs just before it: here
// the kiln source is synced and unwrapped, so the copy reads its current value below
// functionalization (kiln's copy kernel downloads it). The rest is PyTorch's kernel for this key:
// redispatch below it, then bump self's version.
at::Tensor& copy_inplace_or_view_kernel(c10::DispatchKeySet keys, at::Tensor& self, const at::Tensor& src,
                                        bool non_blocking) {
  at::Tensor source = src;
  if (is_kiln(src) && at::functionalization::impl::isFunctionalTensor(src) &&
      !at::functionalization::impl::isFunctionalTensor(self)) {
    at::functionalization::impl::sync(src);
    source = at::functionalization::impl::from_functional_tensor(src);
  }
  {
    const at::AutoDispatchBelowADInplaceOrView below;
    at::_ops::copy_::redispatch(keys & c10::after_ADInplaceOrView_keyset, self, source, non_blocking);
  }
  torch::autograd::increment_version(self);
  return self;
}

// Registered when the library loads, like TORCH_LIBRARY_IMPL's, with PyTorch's warning about
// overriding its kernels silenced (SilencedWarnings).
struct TransferRegistration {
  TransferRegistration() {
    const SilencedWarnings silenced;
    functionalize.emplace(torch::Library::IMPL, "aten", c10::DispatchKey::Functionalize, __FILE__, __LINE__);
    functionalize->impl("_to_copy", TORCH_FN(to_copy_functionalize_kernel));
    inplace_or_view.emplace(torch::Library::IMPL, "aten", c10::DispatchKey::ADInplaceOrView, __FILE__, __LINE__);
    inplace_or_view->impl("copy_", TORCH_FN(copy_inplace_or_view_kernel));
  }
  std::optional<torch::Library> functionalize;  // registered for as long as the extension is loaded
  std::optional<torch::Library> inplace_or_view;
};
const TransferRegistration transfer_registration;

// dst.copy_(self) with one side on kiln, as copy_'s generic kernel hands it over. A kiln dst is an
// inner tensor (functionalization never hands the backend a user-visible one): it gets a new value.
at::Tensor copy_from_kernel(const at::Tensor& self, const at::Tensor& dst, bool) {
  if (is_kiln(dst)) {
    impl_of(dst, "copy_").set_value(copied_value(dst, self, "copy_"), dst.sizes());
  } else {
    dst.copy_(download(self, "copy_"));
  }
  return dst;
}

at::Tensor copy_from_and_resize_kernel(const at::Tensor& self, const at::Tensor& dst) {
  if (is_kiln(dst)) {
    runtime::Tensor v = is_kiln(self) ? value_of(self, "copy_") : upload(self, "copy_");
    impl_of(dst, "copy_").set_value(cast_to(v, to_kiln_dtype(dst.scalar_type(), "copy_"), "copy_"), self.sizes());
  } else {
    dst.resize_(self.sizes());
    dst.copy_(download(self, "copy_"));
  }
  return dst;
}

// aten::copy, the functional form of copy_ that functionalization emits: self's sizes, dtype and
// device with src's values.
at::Tensor copy_kernel(const at::Tensor& self, const at::Tensor& src, bool) {
  if (!is_kiln(self)) {
    at::Tensor out = self.clone();
    out.copy_(download(src, "copy"));
    return out;
  }
  return make_tensor(copied_value(self, src, "copy"), self.sizes());
}

at::Tensor& copy_inplace_kernel(at::Tensor& self, const at::Tensor& src, bool) {
  if (is_kiln(self)) {
    impl_of(self, "copy_").set_value(copied_value(self, src, "copy_"), self.sizes());
  } else {
    self.copy_(download(src, "copy_"));
  }
  return self;
}

at::Scalar local_scalar_dense_kernel(const at::Tensor& self) {
  TORCH_CHECK(self.numel() == 1, "kiln: item(): a tensor with ", self.numel(),
              " elements cannot be converted to a Scalar");
  return at::_local_scalar_dense(download(self, "item"));
}

runtime::Tensor filled(const at::Tensor& self, const at::Scalar& value, std::string_view what) {
  const ir::DType d = to_kiln_dtype(self.scalar_type(), what);
  return value_or_throw(session().full(kiln_shape(self.sizes()), value.toDouble(), d), what);
}

// fill with a 0-dim tensor: a CPU one is a Scalar; a kiln one is broadcast (no read).
runtime::Tensor filled(const at::Tensor& self, const at::Tensor& value, std::string_view what) {
  TORCH_CHECK(value.dim() == 0, "kiln: ", what, ": the value must be a 0-dim tensor, not ", value.dim(), "-dim");
  if (const std::optional<double> s = cpu_scalar(value)) return filled(self, at::Scalar(*s), what);
  return copied_value(self, value, what);
}

at::Tensor fill_scalar(const at::Tensor& self, const at::Scalar& value) {
  return make_tensor(filled(self, value, "fill"), self.sizes());
}
at::Tensor fill_tensor(const at::Tensor& self, const at::Tensor& value) {
  return make_tensor(filled(self, value, "fill"), self.sizes());
}
at::Tensor& fill_scalar_(at::Tensor& self, const at::Scalar& value) {
  impl_of(self, "fill_").set_value(filled(self, value, "fill_"), self.sizes());
  return self;
}
at::Tensor& fill_tensor_(at::Tensor& self, const at::Tensor& value) {
  impl_of(self, "fill_").set_value(filled(self, value, "fill_"), self.sizes());
  return self;
}
at::Tensor& zero_(at::Tensor& self) { return fill_scalar_(self, at::Scalar(0)); }

// Inside the namespace so that these names hide the C library's (exp, log, abs, ...).
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", TORCH_FN(empty_memory_format_kernel));
  m.impl("empty_strided", TORCH_FN(empty_strided_kernel));
  m.impl("_to_copy", TORCH_FN(to_copy_kernel));
  m.impl("_copy_from", TORCH_FN(copy_from_kernel));
  m.impl("_copy_from_and_resize", TORCH_FN(copy_from_and_resize_kernel));
  m.impl("copy", TORCH_FN(copy_kernel));
  m.impl("copy_", TORCH_FN(copy_inplace_kernel));
  m.impl("_local_scalar_dense", TORCH_FN(local_scalar_dense_kernel));
  m.impl("fill.Scalar", TORCH_FN(fill_scalar));
  m.impl("fill.Tensor", TORCH_FN(fill_tensor));
  m.impl("fill_.Scalar", TORCH_FN(fill_scalar_));
  m.impl("fill_.Tensor", TORCH_FN(fill_tensor_));
  m.impl("zero_", TORCH_FN(zero_));
}

}  // namespace
}  // namespace kiln::pytorch
