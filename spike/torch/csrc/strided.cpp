// Variant (a): kiln tensors are ordinary strided tensors whose storage is host memory from an
// allocator registered for PrivateUse1 (the shape of PyTorch's OpenReg example). Views,
// in-place ops and aliasing are PyTorch's own: they share the storage.
#include "common.h"

#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/_local_scalar_dense.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/add.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/resize_native.h>
#include <ATen/ops/set_cpu_dispatch.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <torch/library.h>

#include <cstring>

namespace kiln_spike {

const char* const kVariant = "strided";

namespace {

constexpr c10::DeviceType kKiln = c10::DeviceType::PrivateUse1;

struct HostAllocator final : c10::Allocator {
  static void del(void* p) { c10::free_cpu(p); }
  c10::DataPtr allocate(size_t n) override {
    void* p = n ? c10::alloc_cpu(n) : nullptr;
    return {p, p, &del, c10::Device(kKiln, 0)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &del; }
  void copy_data(void* dst, const void* src, std::size_t n) const override { std::memcpy(dst, src, n); }
};
HostAllocator g_alloc;
REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &g_alloc);

const c10::DispatchKeySet kKeys{c10::DispatchKey::PrivateUse1};

// A CPU tensor over the same bytes as a kiln tensor (no copy): how kernels and copies reach
// the data. CPU tensors pass through unchanged (wrapped scalars, the other side of a copy).
at::Tensor host_view(const at::Tensor& t) {
  if (t.device().type() != kKiln) return t;
  return at::from_blob(t.data_ptr(), t.sizes(), t.strides(), t.options().device(c10::kCPU));
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype, std::optional<c10::Layout>,
                               std::optional<c10::Device>, std::optional<bool>, std::optional<c10::MemoryFormat> mf) {
  return at::detail::empty_generic(size, &g_alloc, kKeys, c10::dtype_or_default(dtype), mf);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
                         std::optional<c10::Layout>, std::optional<c10::Device>, std::optional<bool>) {
  return at::detail::empty_strided_generic(size, stride, &g_alloc, kKeys, c10::dtype_or_default(dtype));
}

at::Tensor as_strided(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride,
                      std::optional<c10::SymInt> offset) {
  return at::native::as_strided_tensorimpl(self, C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride),
                                           offset ? std::optional<int64_t>(offset->expect_int()) : std::nullopt);
}

at::Tensor view(const at::Tensor& self, c10::SymIntArrayRef size) {
  return at::native::view(self, C10_AS_INTARRAYREF_SLOW(size));
}

at::Tensor reshape_alias(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride) {
  return at::native::_reshape_alias(self, C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride));
}

const at::Tensor& resize(const at::Tensor& self, c10::SymIntArrayRef size, std::optional<c10::MemoryFormat> mf) {
  // The CPU resize grows the storage through storage->allocator(), which is g_alloc here.
  return at::native::resize_(self, C10_AS_INTARRAYREF_SLOW(size), mf);
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  host_view(dst).copy_(host_view(self), non_blocking);
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  dst.resize_(self.sizes());
  return copy_from(self, dst, false);
}

at::Scalar local_scalar_dense(const at::Tensor& self) { return at::_local_scalar_dense(host_view(self)); }

// set_ (storage swaps): what torch.save's storage copies and UntypedStorage.cpu() use.
at::Tensor& set_tensor(at::Tensor& self, const at::Tensor& src) { return at::native::set_tensor_(self, src); }
at::Tensor& set_storage(at::Tensor& self, at::Storage src) { return at::native::set_(self, src); }
at::Tensor& set_storage_offset(at::Tensor& self, at::Storage src, int64_t offset, c10::IntArrayRef size,
                               c10::IntArrayRef stride) {
  return at::cpu::set_(self, src, offset, size, stride);  // device-agnostic metadata update
}

// Two "lowered" compute ops: the CPU kernel writes straight into a kiln allocation.
at::Tensor to_kiln(const at::Tensor& cpu_result) {
  auto out = empty_strided(cpu_result.sizes(), cpu_result.strides(), cpu_result.scalar_type(), std::nullopt,
                           std::nullopt, std::nullopt);
  host_view(out).copy_(cpu_result);
  return out;
}
at::Tensor add(const at::Tensor& a, const at::Tensor& b, const at::Scalar& alpha) {
  return to_kiln(at::add(host_view(a), host_view(b), alpha));
}
at::Tensor mul(const at::Tensor& a, const at::Tensor& b) { return to_kiln(at::mul(host_view(a), host_view(b))); }

}  // namespace
}  // namespace kiln_spike

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  using namespace kiln_spike;
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("as_strided", as_strided);
  m.impl("view", view);
  m.impl("_reshape_alias", reshape_alias);
  m.impl("resize_", resize);
  m.impl("_copy_from", copy_from);
  m.impl("_copy_from_and_resize", copy_from_and_resize);
  m.impl("_local_scalar_dense", local_scalar_dense);
  m.impl("set_.source_Tensor", set_tensor);
  m.impl("set_.source_Storage", set_storage);
  m.impl("set_.source_Storage_storage_offset", set_storage_offset);
  m.impl("add.Tensor", add);
  m.impl("mul.Tensor", mul);
}
