// Half-precision single ops through the f32 kernels (fast_widen.h).
#include "fast_widen.h"

#include <optional>
#include <vector>

#include "kiln/reference/tensor.h"

namespace kiln::cpu::fast {
namespace {

bool is_half(ir::DType d) { return d == ir::dtypes::f16 || d == ir::dtypes::bf16; }

// The one half dtype every float tensor of `op` has, or nothing (no half tensor, or mixed floats).
std::optional<ir::DType> half_dtype_of(const ir::Operation& op) {
  std::optional<ir::DType> half;
  for (const ir::TensorIr& t : op.tensors) {
    if (!t.dtype.is_float()) continue;
    if (!is_half(t.dtype) || (half && !(*half == t.dtype))) return std::nullopt;
    half = t.dtype;
  }
  return half;
}

// `t` converted element by element into a new tensor of `dtype` (From and To: the storage types).
template <class From, class To, class Convert>
std::optional<HostTensor> converted(HostAllocator& allocator, const HostTensor& t, ir::DType dtype, Convert convert) {
  Result<HostTensor> out = HostTensor::allocate(allocator, t.shape(), dtype);
  if (!out.ok()) return std::nullopt;
  const auto* src = reinterpret_cast<const From*>(t.data());
  auto* dst = reinterpret_cast<To*>(out->mutable_data());
  const std::uint64_t n = t.num_elements();
  for (std::uint64_t i = 0; i < n; ++i) dst[i] = convert(src[i]);
  return std::move(out).value();
}

std::optional<HostTensor> widened(HostAllocator& allocator, const HostTensor& h, ir::DType half) {
  return half == ir::dtypes::f16
             ? converted<std::uint16_t, float>(allocator, h, ir::dtypes::f32, reference::f16_to_f32)
             : converted<std::uint16_t, float>(allocator, h, ir::dtypes::f32, reference::bf16_to_f32);
}

std::optional<HostTensor> narrowed(HostAllocator& allocator, const HostTensor& f, ir::DType half) {
  return half == ir::dtypes::f16 ? converted<float, std::uint16_t>(allocator, f, half, reference::f16_from_f32)
                                 : converted<float, std::uint16_t>(allocator, f, half, reference::bf16_from_f32);
}

// A container holding the op's inputs as its f32 form reads them (the half ones widened, the
// others shared); nothing when an input is not held as the IR says.
std::optional<CpuDevice::Handles> widened_inputs(const ir::Operation& op, ir::DType half, HostAllocator& allocator,
                                                 const CpuDevice::Handles& handles) {
  CpuDevice::Handles scratch;
  for (const ir::TensorIr& t : op.inputs()) {
    if (scratch.has_handle(t.id)) continue;
    const HostTensor* h = handles.get_handle_ref(t.id);
    if (h == nullptr || !(h->dtype() == t.dtype) || h->shape() != t.shape) return std::nullopt;
    if (!(t.dtype == half)) {
      scratch.register_handle(t.id, *h);
      continue;
    }
    std::optional<HostTensor> wide = widened(allocator, *h, half);
    if (!wide) return std::nullopt;
    scratch.register_handle(t.id, std::move(*wide));
  }
  return scratch;
}

}  // namespace

bool run_through_f32(const ir::Operation& op, CpuDevice& device, CpuDevice::Handles& handles, SingleOpKernel kernel) {
  const std::optional<ir::DType> half = half_dtype_of(op);
  if (!half) return false;
  ir::Operation op32 = op;
  for (ir::TensorIr& t : op32.tensors)
    if (t.dtype == *half) t.dtype = ir::dtypes::f32;
  std::optional<CpuDevice::Handles> scratch = widened_inputs(op, *half, device.allocator(), handles);
  if (!scratch || !kernel(op32, device, *scratch)) return false;
  // The outputs, rounded to the half dtype where the op declares it, before anything is published.
  std::vector<HostTensor> outs;
  for (const ir::TensorIr& t : op.outputs()) {
    const HostTensor* h = scratch->get_handle_ref(t.id);
    if (h == nullptr) return false;
    if (!(t.dtype == *half)) {
      outs.push_back(*h);
      continue;
    }
    std::optional<HostTensor> narrow = narrowed(device.allocator(), *h, *half);
    if (!narrow) return false;
    outs.push_back(std::move(*narrow));
  }
  for (const ir::TensorIr& t : op.inputs()) (void)handles.free(t);
  for (std::size_t i = 0; i < outs.size(); ++i) handles.register_handle(op.outputs()[i].id, std::move(outs[i]));
  return true;
}

}  // namespace kiln::cpu::fast
