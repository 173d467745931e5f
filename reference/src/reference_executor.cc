// The reference executor's driver (checks, error model, handle traffic, dispatch), the lifecycle
// and collective ops, and the helpers shared by the kernels.
#include "kiln/reference/reference_executor.h"

#include <fmt/format.h>

#include <algorithm>
#include <exception>
#include <new>

#include "reference_internal.h"

namespace kiln::reference {
namespace kernels {

// ---- Checks

Status expect_out_shape(const Ctx& c, std::size_t out, const ir::Shape& expected) {
  if (c.out_ir(out).shape != expected)
    return c.error(ErrorCode::IncompatibleShapes,
                   fmt::format("output {} does not have the shape the op produces, {}", c.out_ir(out).to_string(),
                               ir::shape_to_string(expected)));
  return Status::Ok();
}

Status expect_out_shape(const Ctx& c, std::size_t out, const Result<ir::Shape>& expected) {
  if (!expected.ok()) return c.error(expected.error().code, expected.error().message);
  return expect_out_shape(c, out, expected.value());
}

Status expect_out_dtype(const Ctx& c, std::size_t out, ir::DType expected) {
  if (!(c.out_ir(out).dtype == expected))
    return c.error(ErrorCode::DTypeMismatch,
                   fmt::format("output {} must have dtype {}", c.out_ir(out).to_string(), expected.name()));
  return Status::Ok();
}

Status expect_out_bool(const Ctx& c, std::size_t out) {
  if (!c.out_ir(out).dtype.is_bool())
    return c.error(ErrorCode::DTypeMismatch,
                   fmt::format("output {} must have a bool dtype", c.out_ir(out).to_string()));
  return Status::Ok();
}

Status expect_out_integral(const Ctx& c, std::size_t out) {
  if (!c.out_ir(out).dtype.is_integral())
    return c.error(ErrorCode::DTypeMismatch,
                   fmt::format("output {} must have an integer dtype", c.out_ir(out).to_string()));
  return Status::Ok();
}

Status expect_index_fits(const Ctx& c, std::size_t out, std::uint64_t max_index) {
  KILN_RETURN_IF_ERROR(expect_out_integral(c, out));
  if (max_index > integral_max(c.out_ir(out).dtype))
    return c.error(ErrorCode::Invalid, fmt::format("indices up to {} do not fit the index dtype of {}", max_index,
                                                   c.out_ir(out).to_string()));
  return Status::Ok();
}

Status expect_same_dtype(const Ctx& c, std::size_t a, std::size_t b) {
  const ir::TensorIr& x = c.op.inputs()[a];
  const ir::TensorIr& y = c.op.inputs()[b];
  if (!(x.dtype == y.dtype))
    return c.error(ErrorCode::DTypeMismatch, fmt::format("dtypes differ: {} vs {}", x.to_string(), y.to_string()));
  return Status::Ok();
}

Result<std::size_t> axis_attr(const Ctx& c, std::size_t i, std::size_t rank, const char* what) {
  const std::int64_t a = c.op.attrs[i];
  if (a < 0 || static_cast<std::uint64_t>(a) >= rank)
    return c.error(ErrorCode::OutOfBounds, fmt::format("{} {} out of bounds for rank {}", what, a, rank));
  return static_cast<std::size_t>(a);
}

Result<std::uint64_t> count_attr(const Ctx& c, std::size_t i, const char* what) {
  const std::int64_t a = c.op.attrs[i];
  if (a < 0) return c.error(ErrorCode::Invalid, fmt::format("{} must not be negative, got {}", what, a));
  return static_cast<std::uint64_t>(a);
}

Result<bool> flag_attr(const Ctx& c, std::size_t i, const char* what) {
  const std::int64_t a = c.op.attrs[i];
  if (a != 0 && a != 1) return c.error(ErrorCode::Invalid, fmt::format("{} must be 0 or 1, got {}", what, a));
  return a == 1;
}

Result<ir::IndexingUpdate> update_attr(const Ctx& c, std::size_t i) {
  const std::int64_t a = c.op.attrs[i];
  if (a < static_cast<std::int64_t>(ir::IndexingUpdate::Assign) ||
      a > static_cast<std::int64_t>(ir::IndexingUpdate::Max))
    return c.error(ErrorCode::Invalid, fmt::format("unknown indexing update {}", a));
  return static_cast<ir::IndexingUpdate>(a);
}

// ---- Scalars and integers

ElementBytes scalar_element(const ir::ScalarIr& s, ir::DType dtype) {
  ElementBytes e;
  std::byte* b = e.bytes.data();
  switch (s.kind()) {
    case ir::ScalarIr::Kind::Float: element::store_f64(b, dtype, 0, s.as_float()); break;
    case ir::ScalarIr::Kind::Int: element::store_i64(b, dtype, 0, s.as_int()); break;
    case ir::ScalarIr::Kind::UInt: element::store_u64(b, dtype, 0, s.as_uint()); break;
    case ir::ScalarIr::Kind::Bool: element::store_bool(b, dtype, 0, s.as_bool()); break;
  }
  return e;
}

std::uint64_t integral_max(ir::DType d) {
  const int bits = int_bits(d);
  if (d.is_uint()) return bits == 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << bits) - 1;
  return (std::uint64_t{1} << (bits - 1)) - 1;
}

// ---- Index arithmetic

std::vector<std::uint64_t> strides_of(const ir::Shape& s) {
  std::vector<std::uint64_t> st(s.size());
  std::uint64_t acc = 1;
  for (std::size_t i = s.size(); i-- > 0;) {
    st[i] = acc;
    acc *= s[i];
  }
  return st;
}

void unravel(std::uint64_t linear, const ir::Shape& s, Index& idx) {
  idx.resize(s.size());
  for (std::size_t i = s.size(); i-- > 0;) {
    idx[i] = linear % s[i];  // s[i] > 0: a shape with a zero dim has no element to unravel
    linear /= s[i];
  }
}

std::uint64_t ravel(const Index& idx, const std::vector<std::uint64_t>& strides) {
  std::uint64_t linear = 0;
  for (std::size_t i = 0; i < idx.size(); ++i) linear += idx[i] * strides[i];
  return linear;
}

std::vector<std::uint64_t> broadcast_map(const ir::Shape& in, const ir::Shape& out) {
  const std::uint64_t n = ir::num_elements(out);
  std::vector<std::uint64_t> map(static_cast<std::size_t>(n));
  const std::vector<std::uint64_t> in_strides = strides_of(in);
  Index idx;
  for (std::uint64_t i = 0; i < n; ++i) {
    unravel(i, out, idx);
    std::uint64_t linear = 0;
    for (std::size_t d = 0; d < idx.size(); ++d) linear += (in[d] == 1 ? 0 : idx[d]) * in_strides[d];
    map[static_cast<std::size_t>(i)] = linear;
  }
  return map;
}

std::uint64_t dims_product(const ir::Shape& s, std::size_t from, std::size_t to) {
  std::uint64_t p = 1;
  for (std::size_t i = from; i < to; ++i) p *= s[i];
  return p;
}

bool read_index(const HostTensor& t, std::uint64_t i, std::uint64_t& out) {
  if (t.dtype().is_int()) {
    const std::int64_t v = t.get_i64(i);
    if (v < 0) return false;
    out = static_cast<std::uint64_t>(v);
    return true;
  }
  out = t.get_u64(i);
  return true;
}

Result<std::uint64_t> checked_index(const Ctx& c, const HostTensor& indices, std::uint64_t i, std::uint64_t size,
                                    const char* what) {
  std::uint64_t v = 0;
  if (!read_index(indices, i, v))
    return c.error(ErrorCode::OutOfBounds,
                   fmt::format("{} index {} (element {}) is negative", what, indices.get_i64(i), i));
  if (v >= size)
    return c.error(ErrorCode::OutOfBounds,
                   fmt::format("{} index {} (element {}) out of range for a dimension of size {}", what, v, i, size));
  return v;
}

namespace {

// ---- Whole-op checks

// The family fits the operand's dtype (the first input, or the output of a creation op) and a
// carried dtype is the operand's, as the builders guarantee (docs/spec/ir.md §5.11).
Status check_family(const ir::Operation& op) {
  const ir::OpInfo& info = op.info();
  if (op.tensors.empty()) return Status::Ok();
  const ir::DType operand = op.num_inputs > 0 ? op.inputs()[0].dtype : op.outputs()[0].dtype;
  bool fits = true;
  switch (info.group) {
    case ir::OpGroup::Base: fits = ir::base_family_for(operand) == op.family; break;
    case ir::OpGroup::Numeric: fits = ir::numeric_family_for(operand) == op.family; break;
    case ir::OpGroup::Float:  // Dequantize reads a QFloat operand
      fits = operand.is_float() || (info.has(ir::kQuantization) && operand.is_quantized());
      break;
    case ir::OpGroup::Int: fits = operand.is_integral(); break;
    case ir::OpGroup::Bool: fits = operand.is_bool(); break;
    case ir::OpGroup::Module:
    case ir::OpGroup::Activation: fits = operand.is_float(); break;
    case ir::OpGroup::Init:
    case ir::OpGroup::Custom:
    case ir::OpGroup::Drop:
    case ir::OpGroup::Distributed: break;
  }
  if (!fits)
    return make_error(ErrorCode::DTypeMismatch,
                      fmt::format("{}: family {} does not apply to operand dtype {}", op.kind_name(),
                                  ir::family_name(op.family), operand.name()));
  if (ir::family_carries_dtype(op.family) && !(op.dtype == operand))
    return make_error(ErrorCode::DTypeMismatch, fmt::format("{}: carried dtype {} differs from the operand dtype {}",
                                                            op.kind_name(), op.dtype.name(), operand.name()));
  return Status::Ok();
}

// Only the quantization kinds (tag Q) read or write QFloat tensors; their kernels check which.
Status check_not_quantized(const ir::Operation& op) {
  if (op.info().has(ir::kQuantization)) return Status::Ok();
  for (const ir::TensorIr& t : op.tensors)
    if (t.dtype.is_quantized())
      return make_error(ErrorCode::Unsupported,
                        fmt::format("{}: quantized tensor {} is not supported by the CPU reference executor",
                                    op.kind_name(), t.to_string()));
  if (ir::family_carries_dtype(op.family) && op.dtype.is_quantized())
    return make_error(ErrorCode::Unsupported,
                      fmt::format("{}: quantized dtype {} is not supported by the CPU reference "
                                  "executor",
                                  op.kind_name(), op.dtype.name()));
  return Status::Ok();
}

bool is_input_id(const ir::Operation& op, ir::TensorId id) {
  for (const ir::TensorIr& t : op.inputs())
    if (t.id == id) return true;
  return false;
}

Status check_output_ids(const ir::Operation& op) {
  const auto outs = op.outputs();
  for (std::size_t i = 0; i < outs.size(); ++i) {
    if (is_input_id(op, outs[i].id))
      return make_error(ErrorCode::Invalid,
                        fmt::format("{}: output id {} is also an input", op.kind_name(), outs[i].id.value()));
    for (std::size_t j = 0; j < i; ++j)
      if (outs[j].id == outs[i].id)
        return make_error(ErrorCode::Invalid,
                          fmt::format("{}: output id {} is used twice", op.kind_name(), outs[i].id.value()));
  }
  return Status::Ok();
}

// Whether inputs() / outputs() / kind_name() of the op can be used at all: kind and family in
// range, and no more inputs declared than tensors. An op failing this is reported untouched.
bool structurally_sound(const ir::Operation& op) {
  return static_cast<std::size_t>(op.kind) < static_cast<std::size_t>(ir::kNumOpKinds) &&
         static_cast<int>(op.family) < ir::kNumFamilies && op.num_inputs <= op.tensors.size();
}

std::string op_name(const ir::Operation& op) { return structurally_sound(op) ? op.kind_name() : "Operation"; }

// A failed op: ReadWrite inputs are released as if consumed, outputs are claimed with a new root
// (docs/spec/ir.md §11.3). An output id that is also an input (a malformed op) is left alone, so that the
// claim never destroys a live input; an op whose tensor lists cannot be read changes nothing.
Status fail(ReferenceExecutor::Handles& handles, const ir::Operation& op, Error error) {
  if (!structurally_sound(op)) return error;
  ir::release_consumed_inputs(handles, op);
  if (check_output_ids(op).ok()) {
    (void)ir::fail_op(handles, op, error, op.to_string());
  } else {
    const ir::TensorError err{ir::ExecutionError::from(error, op.to_string()), 0};
    for (const ir::TensorIr& out : op.outputs())
      if (!is_input_id(op, out.id)) handles.claim_unwritten(std::span<const ir::TensorId>(&out.id, 1), err);
  }
  return error;
}

// ---- Lifecycle and collectives

// Init: the buffer was registered out of band; check it is there as declared.
Status run_init(ReferenceExecutor::Handles& handles, const ir::Operation& op) {
  const ir::TensorIr& out = op.outputs()[0];
  const auto* entry = handles.entry(out.id);
  if (entry != nullptr && entry->is_errored()) return Status::Ok();  // claimed out of band; readers see why
  const HostTensor* t = handles.get_handle_ref(out.id);
  if (t == nullptr)
    return fail(
        handles, op,
        make_error(ErrorCode::InvalidHandle,
                   fmt::format("Init: {} has no buffer: it must be registered before its Init runs", out.to_string())));
  if (t->shape() != out.shape || !(t->dtype() == out.dtype)) {
    Error e = make_error(ErrorCode::IncompatibleShapes,
                         fmt::format("Init: {} was registered as {}", out.to_string(), t->to_string()));
    handles.claim(out.id, ir::TensorError{ir::ExecutionError::from(e, op.to_string()), 0});
    return e;
  }
  return Status::Ok();
}

Status run_drop(ReferenceExecutor::Handles& handles, const ir::Operation& op) {
  const ir::TensorIr& t = op.inputs()[0];
  if (!handles.free(t))
    return make_error(ErrorCode::InvalidHandle, fmt::format("Drop: {} has no handle to drop", t.to_string()));
  return Status::Ok();
}

// A collective over a world of one: the output is a copy of the input.
Result<Outputs> copy_of_input(const Ctx& c) {
  KILN_RETURN_IF_ERROR(expect_out_shape(c, 0, c.in[0].shape()));
  KILN_RETURN_IF_ERROR(expect_out_dtype(c, 0, c.in[0].dtype()));
  KILN_ASSIGN_OR_RETURN(HostTensor out, c.new_output());
  if (out.size_bytes() != 0)
    std::memcpy(out.mutable_data(), c.in[0].data(), static_cast<std::size_t>(out.size_bytes()));
  return single(std::move(out));
}

// Single device: the reduction over one participant is the tensor itself (sum, mean, min, max
// or product of one). A list naming other devices cannot be served here.
Result<Outputs> run_all_reduce(const Ctx& c) {
  const std::int64_t reduce_op = c.op.attrs[0];
  if (!ir::reduce_operation_of(reduce_op))
    return c.error(ErrorCode::Invalid, fmt::format("unknown reduce operation {}", reduce_op));
  if (c.op.attrs.size() > 2)
    return c.error(ErrorCode::Unsupported,
                   fmt::format("{} devices take part; the CPU device reduces over itself only", c.op.attrs.size() - 1));
  return copy_of_input(c);
}

// Broadcast, AllGather, ReduceScatter (kiln extensions) over a world of one device: the tensor
// itself. A world of several ranks needs a job spanning daemons (docs/distributed.md).
Result<Outputs> run_collective_of_one(const Ctx& c) {
  const ir::OpKind k = c.op.kind;
  const std::size_t leading = k == ir::OpKind::Distributed_ReduceScatter ? 2 : 1;  // attributes before the ids
  if (k == ir::OpKind::Distributed_ReduceScatter && !ir::reduce_operation_of(c.op.attrs[0]))
    return c.error(ErrorCode::Invalid, fmt::format("unknown reduce operation {}", c.op.attrs[0]));
  if (c.op.attrs.size() > leading + 1)
    return c.error(ErrorCode::Unsupported,
                   fmt::format("{} ranks take part; a device alone is a world of one (a job spanning daemons runs "
                               "the others, docs/distributed.md)",
                               c.op.attrs.size() - leading));
  if (k == ir::OpKind::Distributed_Broadcast && c.op.attrs[0] != 0)
    return c.error(ErrorCode::Invalid, fmt::format("root {} is not a rank of a world of one", c.op.attrs[0]));
  return copy_of_input(c);
}

Result<Outputs> run_kernel(const Ctx& c) {
  using S = ir::Signature;
  const ir::OpKind k = c.op.kind;
  // The activations reuse Unary, Binary, Scalar and Dim: one kernel file serves the group.
  if (c.op.info().group == ir::OpGroup::Activation) return run_activation(c);
  switch (c.op.info().signature) {
    case S::Unary: return run_unary(c);
    case S::Binary: return run_binary(c);
    case S::Scalar: return run_scalar(c);
    case S::Cast: return k == ir::OpKind::Float_Dequantize ? run_dequantize(c) : run_cast(c);
    case S::Clamp: return run_clamp(c);
    case S::MaskWhere: return run_mask_where(c);
    case S::MaskFill: return run_mask_fill(c);
    case S::Reduce: return run_reduce(c);
    case S::ReduceDim: return run_reduce_dim(c);
    case S::ReduceDimWithIndices: return run_reduce_dim_with_indices(c);
    case S::TopKWithIndices: return run_topk_with_indices(c);
    case S::Sort:
    case S::SortWithIndices: return run_sort(c);
    case S::Dim: return run_cumulative(c);
    case S::ShapeOp: return k == ir::OpKind::Base_Reshape ? run_reshape(c) : run_expand(c);
    case S::SwapDims: return run_swap_dims(c);
    case S::Permute: return run_permute(c);
    case S::Flip: return run_flip(c);
    case S::Slice: return run_slice(c);
    case S::SliceAssign: return run_slice_assign(c);
    case S::Select: return run_select(c);
    case S::SelectAssign: return run_select_assign(c);
    case S::Gather: return run_gather(c);
    case S::Scatter: return run_scatter(c);
    case S::GatherNd: return run_gather_nd(c);
    case S::ScatterNd: return run_scatter_nd(c);
    case S::Unfold: return run_unfold(c);
    case S::Cross: return run_cross(c);
    case S::HardSigmoid: return run_activation(c);  // Activation's own (caught above)
    case S::Cat: return run_cat(c);
    case S::RepeatDim: return run_repeat_dim(c);
    case S::Pad: return run_pad(c);
    case S::Creation:
    case S::Full: return run_creation(c);
    case S::Random: return run_random(c);
    case S::Matmul: return run_matmul(c);
    case S::Conv:
    case S::ConvTranspose: return run_conv(c);
    case S::MaxPool2d: return run_max_pool(c);
    case S::AvgPool2d: return run_avg_pool(c);
    case S::Embedding: return run_embedding(c);
    case S::Linear: return run_linear(c);
    case S::LinearBackward: return run_linear_backward(c);
    case S::LinearBiasBackward: return run_linear_bias_backward(c);
    case S::LayerNorm: return run_layer_norm(c);
    case S::BatchNorm: return run_batch_norm(c);
    case S::EmbeddingBackward: return run_embedding_backward(c);
    case S::MaxPool:
    case S::MaxPoolWithIndices: return run_max_pool(c);
    case S::MaxPoolWithIndicesBackward: return run_max_pool_backward(c);
    case S::AvgPool: return run_avg_pool(c);
    case S::AvgPoolBackward: return run_avg_pool_backward(c);
    case S::AdaptiveAvgPool: return run_adaptive_avg_pool(c);
    case S::AdaptiveAvgPoolBackward: return run_adaptive_avg_pool_backward(c);
    case S::AllReduce: return run_all_reduce(c);
    case S::Broadcast:
    case S::AllGather:
    case S::ReduceScatter: return run_collective_of_one(c);
    case S::Custom:
      return c.error(
          ErrorCode::Unsupported,
          fmt::format("unknown custom operation '{}': the CPU reference executor implements none", c.op.custom_id));
    // Handled by the driver before any kernel runs.
    case S::Init:
    case S::Drop:
    case S::SyncCollective: break;
    // Convolution gradients (reference_conv.cc, with the forwards above)
    case S::ConvBackward:
    case S::ConvTransposeBackward: return run_conv_backward(c);
    case S::ConvBiasBackward: return run_conv_bias_backward(c);
    case S::GridSample2d: return run_grid_sample_2d(c);
    case S::Interpolate: return run_interpolate(c);
    case S::InterpolateBackward: return run_interpolate_backward(c);
    case S::Unfold4d: return run_unfold4d(c);
    case S::Rfft: return run_rfft(c);
    case S::IRfft: return run_irfft(c);
    case S::Attention: return run_attention(c);
    case S::CtcLoss: return run_ctc_loss(c);
    case S::CtcLossBackward: return run_ctc_loss_backward(c);
    case S::DeformableConv2d: return run_deformable_conv2d(c);
    case S::DeformableConv2dBackward: return run_deformable_conv2d_backward(c);
    case S::Quantize: return run_quantize(c);
  }
  return c.error(ErrorCode::Internal, "no kernel for this signature");
}

}  // namespace
}  // namespace kernels

// ---- ReferenceExecutor

ReferenceExecutor::ReferenceExecutor(HostAllocator& allocator, std::uint64_t seed)
    : allocator_(allocator), rng_state_(seed) {}

Status ReferenceExecutor::execute(const ir::Operation& op, Handles& handles) {
  // No exception leaves the executor (conventions): the only ones possible are allocation
  // failures of the kernels' host-side scratch vectors.
  try {
    return execute_checked(op, handles);
  } catch (const std::bad_alloc&) {
    return kernels::fail(handles, op,
                         make_error(ErrorCode::ResourceExhausted,
                                    fmt::format("{}: out of host memory for the reference kernel's scratch space",
                                                kernels::op_name(op))));
  } catch (const std::exception& e) {
    return kernels::fail(
        handles, op,
        make_error(ErrorCode::Internal, fmt::format("{}: unexpected exception: {}", kernels::op_name(op), e.what())));
  }
}

Status ReferenceExecutor::execute_checked(const ir::Operation& op, Handles& handles) {
  using namespace kernels;
  if (Status st = op.validate(); !st.ok()) return fail(handles, op, st.error());

  switch (op.kind) {
    case ir::OpKind::Drop_Drop: return run_drop(handles, op);          // frees whatever the entry holds
    case ir::OpKind::Distributed_SyncCollective: return Status::Ok();  // nothing pending on one device
    case ir::OpKind::Init_Init: return run_init(handles, op);
    default: break;
  }

  if (handles.has_errors()) {
    if (std::optional<ir::OpSkip> skip = ir::skip_if_errored(handles, op)) return skip->error.to_error();
  }
  if (Status st = check_output_ids(op); !st.ok()) return fail(handles, op, st.error());
  if (Status st = check_not_quantized(op); !st.ok()) return fail(handles, op, st.error());
  if (Status st = check_family(op); !st.ok()) return fail(handles, op, st.error());

  // Inputs are read without removing their entries (an op may name one tensor twice, in any
  // order of statuses); ReadWrite entries are released once the kernel is done.
  std::vector<HostTensor> inputs;
  inputs.reserve(op.num_inputs);
  for (const ir::TensorIr& in : op.inputs()) {
    ir::HandleLookup<HostTensor> h = handles.get_handle(in.id, ir::TensorStatus::ReadOnly);
    if (!h.ok()) return fail(handles, op, h.error());
    if (h->shape() != in.shape || !(h->dtype() == in.dtype))
      return fail(handles, op,
                  make_error(ErrorCode::IncompatibleShapes, fmt::format("{}: input {} is held as {}", op.kind_name(),
                                                                        in.to_string(), h->to_string())));
    inputs.push_back(std::move(h).value());
  }

  Rng rng(rng_state_);
  const Ctx ctx{op, inputs, allocator_, rng};
  Result<Outputs> result = run_kernel(ctx);
  if (!result.ok()) return fail(handles, op, result.error());
  Outputs& outs = result.value();
  // Defensive: a kernel always returns what the IR declares; never register anything else.
  if (outs.size() != op.outputs().size())
    return fail(handles, op,
                make_error(ErrorCode::Internal, fmt::format("{}: kernel returned {} outputs, expected {}",
                                                            op.kind_name(), outs.size(), op.outputs().size())));
  for (std::size_t i = 0; i < outs.size(); ++i) {
    const ir::TensorIr& o = op.outputs()[i];
    if (outs[i].shape() != o.shape || !(outs[i].dtype() == o.dtype))
      return fail(handles, op,
                  make_error(ErrorCode::Internal, fmt::format("{}: kernel produced {} for output {}", op.kind_name(),
                                                              outs[i].to_string(), o.to_string())));
  }
  inputs.clear();
  ir::release_consumed_inputs(handles, op);
  for (std::size_t i = 0; i < outs.size(); ++i) handles.register_handle(op.outputs()[i].id, std::move(outs[i]));
  return Status::Ok();
}

}  // namespace kiln::reference
