// A kiln tensor as PyTorch sees it: an opaque TensorImpl (no storage, no data pointer) that
// holds a kiln runtime::Tensor, a lazy id in the process's Session; and the conversions every
// kernel uses (dtypes, shapes, unwrapping its operands, wrapping its result).
//
// Storage model (docs/pytorch-spike.md §4, docs/decisions.md "PyTorch device"): every kiln
// tensor a user holds is a FunctionalTensorWrapper around a KilnTensorImpl, so the kernels here
// only ever see out-of-place ops on inner tensors: views arrive as *_copy ops, in-place ops as
// their functional forms, and writes through a view are replayed onto its base by the wrapper.
// A kiln value is immutable, so a "copy" may share it, and an inner tensor that PyTorch asks to
// mutate (fill_, copy_ inside a composite kernel) gets a new value bound to it.
//
// Shapes: kiln has no rank-0 tensors, so a PyTorch scalar (sizes []) holds a kiln tensor of
// shape [1]; every other kiln shape equals the PyTorch sizes. Strides are always contiguous.
//
// Thread-safety: a KilnTensorImpl is used as PyTorch uses a TensorImpl (one writer: the
// functionalization pass that owns the inner tensor); its value may be dropped on any thread.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "kiln/ir/dtype.h"
#include "kiln/ir/shape.h"
#include "kiln/runtime/session.h"

namespace kiln::pytorch {

inline constexpr c10::DeviceType kKilnDevice = c10::DeviceType::PrivateUse1;

class KilnTensorImpl final : public c10::TensorImpl {
 public:
  // `sizes` are PyTorch's (see the header comment); value's dtype gives the tensor's.
  KilnTensorImpl(runtime::Tensor value, c10::IntArrayRef sizes);

  const runtime::Tensor& value() const { return value_; }
  // Binds a new value (and sizes) to this tensor: an in-place op or a resize on an inner tensor.
  void set_value(runtime::Tensor value, c10::IntArrayRef sizes);

  c10::intrusive_ptr<c10::TensorImpl> shallow_copy_and_detach(const c10::VariableVersion& version_counter,
                                                              bool allow_tensor_metadata_change) const override;
  c10::intrusive_ptr<c10::TensorImpl> shallow_copy_and_detach(c10::VariableVersion&& version_counter,
                                                              bool allow_tensor_metadata_change) const override;
  void shallow_copy_from(const c10::intrusive_ptr<c10::TensorImpl>& impl) override;

 private:
  const char* tensorimpl_type_name() const override { return "kiln::pytorch::KilnTensorImpl"; }

  runtime::Tensor value_;
};

// ---- dtypes: f64, f32, f16, bf16, i64, i32, i16, i8, u8 and bool map one to one; anything else
// (complex, quantized, the wide unsigned types) is a KilnError (Unsupported) naming `what`.
ir::DType to_kiln_dtype(c10::ScalarType type, std::string_view what);
c10::ScalarType to_torch_dtype(ir::DType dtype);
// PyTorch's default float dtype (torch.get_default_dtype()), for ops that promote integers.
c10::ScalarType default_float_dtype();

// ---- shapes
// The kiln shape of PyTorch sizes: the sizes, or [1] for a scalar.
ir::Shape kiln_shape(c10::IntArrayRef sizes);
std::vector<std::int64_t> reshape_args(c10::IntArrayRef sizes);
// `sizes` right-aligned in `rank` dims (leading 1s): the rank-matched form kiln's broadcasting
// (equal ranks) needs for PyTorch's (right-aligned) broadcasting. rank >= sizes.size(), >= 1.
std::vector<std::int64_t> aligned_args(c10::IntArrayRef sizes, std::size_t rank);

// ---- operands and results
bool is_kiln(const at::Tensor& t);
// The kiln value of a kiln tensor; a plain TORCH_CHECK naming `what` for any other tensor.
const runtime::Tensor& value_of(const at::Tensor& t, std::string_view what);
KilnTensorImpl& impl_of(const at::Tensor& t, std::string_view what);
// A new kiln tensor holding `value`, with PyTorch sizes `sizes`. Wrapped for functionalization
// unless the call runs inside the functionalization pass (which wraps its outputs itself): the
// rule of torch/csrc/lazy (Note [kiln functionalization] in tensor_impl.cc).
at::Tensor make_tensor(runtime::Tensor value, c10::IntArrayRef sizes);
// `value` reshaped to PyTorch sizes `sizes` (no op when its kiln shape already is kiln_shape(sizes)).
runtime::Tensor reshaped(const runtime::Tensor& value, c10::IntArrayRef sizes, std::string_view what);
// `value` cast to `dtype` (no op when it has it); a cast to bool is `value != 0`, as PyTorch's.
runtime::Tensor cast_to(const runtime::Tensor& value, ir::DType dtype, std::string_view what);
// A kiln operand for an op whose result has PyTorch sizes of rank `rank`: kiln tensors as they
// are (cast to `dtype`, rank-aligned); a CPU scalar (0-dim) as a [1,..,1] kiln constant. Other
// CPU tensors: a TORCH_CHECK naming the devices, as PyTorch's other devices do.
runtime::Tensor operand(const at::Tensor& t, ir::DType dtype, std::size_t rank, std::string_view what);
// The Scalar of a CPU 0-dim tensor (a wrapped Python number), or nullopt for anything else.
std::optional<double> cpu_scalar(const at::Tensor& t);

// While it lives, PyTorch's warnings on this thread are dropped: kiln's Functionalize kernels
// replace PyTorch's on purpose, and the override warning would print at every `import kiln`.
// (PyTorch prints that warning once per process for all operators, so a later override by
// another library goes unannounced too.)
class SilencedWarnings final : public c10::WarningHandler {
 public:
  SilencedWarnings() : guard_(this) {}
  void process(const c10::Warning&) override {}

 private:
  c10::WarningUtils::WarningHandlerGuard guard_;
};

}  // namespace kiln::pytorch
