#include "tensor_impl.h"

#include <ATen/FunctionalTensorWrapper.h>
#include <c10/core/DefaultDtype.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <string>
#include <utility>

#include "state.h"

namespace kiln::pytorch {

// ---- KilnTensorImpl ----------------------------------------------------------------------------

KilnTensorImpl::KilnTensorImpl(runtime::Tensor value, c10::IntArrayRef sizes)
    : c10::TensorImpl(c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                      c10::scalarTypeToTypeMeta(to_torch_dtype(value.dtype())), c10::Device(kKilnDevice, 0)),
      value_(std::move(value)) {
  set_sizes_contiguous(sizes);
  // There are no bytes to point at: data_ptr()/storage() on an inner tensor throw instead of
  // handing out garbage. (The functional wrapper users hold reports data_ptr() 0.)
  set_storage_access_should_throw();
}

void KilnTensorImpl::set_value(runtime::Tensor value, c10::IntArrayRef sizes) {
  data_type_ = c10::scalarTypeToTypeMeta(to_torch_dtype(value.dtype()));
  value_ = std::move(value);
  set_sizes_contiguous(sizes);
}

// detach(), autograd's variable_data() and shallow copies come through these: a copy shares
// the (immutable) kiln value and takes this tensor's metadata.
c10::intrusive_ptr<c10::TensorImpl> KilnTensorImpl::shallow_copy_and_detach(const c10::VariableVersion& version_counter,
                                                                            bool allow_tensor_metadata_change) const {
  auto impl = c10::make_intrusive<KilnTensorImpl>(value_, sizes());
  copy_tensor_metadata(this, impl.get(), version_counter, allow_tensor_metadata_change);
  return impl;
}

c10::intrusive_ptr<c10::TensorImpl> KilnTensorImpl::shallow_copy_and_detach(c10::VariableVersion&& version_counter,
                                                                            bool allow_tensor_metadata_change) const {
  auto impl = c10::make_intrusive<KilnTensorImpl>(value_, sizes());
  copy_tensor_metadata(this, impl.get(), std::move(version_counter), allow_tensor_metadata_change);
  return impl;
}

void KilnTensorImpl::shallow_copy_from(const c10::intrusive_ptr<c10::TensorImpl>& impl) {
  const auto* other = dynamic_cast<const KilnTensorImpl*>(impl.get());
  TORCH_CHECK(other != nullptr, "kiln: shallow_copy_from a tensor that is not a kiln tensor");
  copy_tensor_metadata(other, this, version_counter(), allow_tensor_metadata_change());
  value_ = other->value_;
}

// ---- dtypes ------------------------------------------------------------------------------------

ir::DType to_kiln_dtype(c10::ScalarType type, std::string_view what) {
  switch (type) {
    case c10::ScalarType::Double: return ir::dtypes::f64;
    case c10::ScalarType::Float: return ir::dtypes::f32;
    case c10::ScalarType::Half: return ir::dtypes::f16;
    case c10::ScalarType::BFloat16: return ir::dtypes::bf16;
    case c10::ScalarType::Long: return ir::dtypes::i64;
    case c10::ScalarType::Int: return ir::dtypes::i32;
    case c10::ScalarType::Short: return ir::dtypes::i16;
    case c10::ScalarType::Char: return ir::dtypes::i8;
    case c10::ScalarType::Byte: return ir::dtypes::u8;
    case c10::ScalarType::Bool: return ir::dtypes::boolean;
    default:
      throw_error(make_error(ErrorCode::Unsupported, std::string("dtype ") + c10::toString(type) +
                                                         " has no kiln counterpart (kiln: f64, f32, f16, bf16, "
                                                         "i64, i32, i16, i8, u8, bool)"),
                  what);
  }
}

c10::ScalarType to_torch_dtype(ir::DType dtype) {
  switch (dtype.kind()) {
    case ir::DTypeKind::F64: return c10::ScalarType::Double;
    case ir::DTypeKind::F32: return c10::ScalarType::Float;
    case ir::DTypeKind::F16: return c10::ScalarType::Half;
    case ir::DTypeKind::BF16: return c10::ScalarType::BFloat16;
    case ir::DTypeKind::I64: return c10::ScalarType::Long;
    case ir::DTypeKind::I32: return c10::ScalarType::Int;
    case ir::DTypeKind::I16: return c10::ScalarType::Short;
    case ir::DTypeKind::I8: return c10::ScalarType::Char;
    case ir::DTypeKind::U8: return c10::ScalarType::Byte;
    case ir::DTypeKind::Bool:
      // Only Bool(Native) (one byte, 0 or 1) is PyTorch's bool; the Session makes no other.
      TORCH_INTERNAL_ASSERT(dtype.bool_store() == ir::BoolStore::Native, "kiln: bool store ", dtype.name());
      return c10::ScalarType::Bool;
    default: break;
  }
  TORCH_INTERNAL_ASSERT(false, "kiln: a tensor of dtype ", dtype.name(), " reached PyTorch");
  return c10::ScalarType::Undefined;
}

c10::ScalarType default_float_dtype() { return c10::typeMetaToScalarType(c10::get_default_dtype()); }

// ---- shapes ------------------------------------------------------------------------------------

ir::Shape kiln_shape(c10::IntArrayRef sizes) {
  if (sizes.empty()) return ir::Shape{1};
  return ir::Shape(sizes.begin(), sizes.end());
}

std::vector<std::int64_t> reshape_args(c10::IntArrayRef sizes) {
  if (sizes.empty()) return {1};
  return std::vector<std::int64_t>(sizes.begin(), sizes.end());
}

std::vector<std::int64_t> aligned_args(c10::IntArrayRef sizes, std::size_t rank) {
  TORCH_INTERNAL_ASSERT(rank >= sizes.size() && rank >= 1);
  std::vector<std::int64_t> args(rank - sizes.size(), 1);
  args.insert(args.end(), sizes.begin(), sizes.end());
  return args;
}

// ---- operands and results ----------------------------------------------------------------------

bool is_kiln(const at::Tensor& t) { return t.defined() && t.device().type() == kKilnDevice; }

KilnTensorImpl& impl_of(const at::Tensor& t, std::string_view what) {
  TORCH_CHECK(is_kiln(t), "kiln: ", what, ": expected a kiln tensor, got ",
              t.defined() ? t.device().str() : std::string("an undefined tensor"));
  auto* impl = dynamic_cast<KilnTensorImpl*>(t.unsafeGetTensorImpl());
  // A functional wrapper here would mean a kernel ran outside the functionalization pass.
  TORCH_INTERNAL_ASSERT(impl != nullptr, "kiln: ", what, ": a kiln tensor that is not a KilnTensorImpl (",
                        t.unsafeGetTensorImpl()->is_wrapped_number() ? "wrapped number" : "wrapper", ")");
  return *impl;
}

const runtime::Tensor& value_of(const at::Tensor& t, std::string_view what) { return impl_of(t, what).value(); }

// Note [kiln functionalization]: a kernel that creates a kiln tensor from nothing (a factory, a
// copy from the CPU) wraps it in a FunctionalTensorWrapper, unless it runs inside the
// functionalization pass (Functionalize is then in the TLS exclude set), whose kernel wraps the
// outputs itself. torch/csrc/lazy uses the same rule; no global mode is needed.
at::Tensor make_tensor(runtime::Tensor value, c10::IntArrayRef sizes) {
  TORCH_INTERNAL_ASSERT_DEBUG_ONLY(value.shape() == kiln_shape(sizes), "kiln: value ",
                                   ir::shape_to_string(value.shape()), " for sizes ", sizes);
  at::Tensor t = at::detail::make_tensor<KilnTensorImpl>(std::move(value), sizes);
  if (c10::impl::tls_local_dispatch_key_set().excluded_.has(c10::DispatchKey::Functionalize)) return t;
  return at::functionalization::impl::to_functional_tensor(t);
}

runtime::Tensor reshaped(const runtime::Tensor& value, c10::IntArrayRef sizes, std::string_view what) {
  if (value.shape() == kiln_shape(sizes)) return value;
  // No elements: a fresh empty tensor of the shape (kiln's Reshape reads a 0 as "keep the input's
  // dim", ONNX's rule, so [5, 5, 0] → [25, 0] cannot be a Reshape).
  if (c10::multiply_integers(sizes) == 0)
    return value_or_throw(session().empty(kiln_shape(sizes), value.dtype()), what);
  return value_or_throw(session().reshape(value, reshape_args(sizes)), what);
}

runtime::Tensor cast_to(const runtime::Tensor& value, ir::DType dtype, std::string_view what) {
  if (value.dtype() == dtype) return value;
  if (dtype.is_bool()) return value_or_throw(session().ne(value, 0.0), what);
  return value_or_throw(session().cast(value, dtype), what);
}

std::optional<double> cpu_scalar(const at::Tensor& t) {
  if (!t.defined() || t.device().type() != c10::DeviceType::CPU || t.dim() != 0) return std::nullopt;
  return t.item().toDouble();
}

runtime::Tensor operand(const at::Tensor& t, ir::DType dtype, std::size_t rank, std::string_view what) {
  const std::size_t kiln_rank = rank == 0 ? 1 : rank;
  if (is_kiln(t)) {
    runtime::Tensor v = cast_to(value_of(t, what), dtype, what);
    if (v.shape().size() == kiln_rank) return v;
    return value_or_throw(session().reshape(std::move(v), aligned_args(t.sizes(), kiln_rank)), what);
  }
  const std::optional<double> scalar = cpu_scalar(t);
  TORCH_CHECK(scalar.has_value(),
              "Expected all tensors to be on the same device, but found at least two devices, kiln:0 and ",
              t.defined() ? t.device().str() : std::string("an undefined tensor"), "! (kiln: ", what, ")");
  return value_or_throw(session().full(ir::Shape(kiln_rank, 1), *scalar, dtype), what);
}

}  // namespace kiln::pytorch
