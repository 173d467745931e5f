// The daemon's rebuild check of client operations (kiln/ipc/op_check.h).
#include "kiln/ipc/op_check.h"

#include <fmt/format.h>

#include <cstring>
#include <optional>
#include <span>
#include <vector>

#include "kiln/ir/builders.h"
#include "kiln/ir/hash.h"

namespace kiln::ipc {
namespace {

using ir::OpKind;
using ir::Signature;
namespace build = ir::build;

Result<std::uint64_t> attr_at(const ir::Operation& op, std::size_t i) {
  if (i >= op.attrs.size() || op.attrs[i] < 0)
    return make_error(ErrorCode::Invalid, fmt::format("{}: attribute {} missing or negative", op.kind_name(), i));
  return static_cast<std::uint64_t>(op.attrs[i]);
}

// Attributes first .. first + out.size(), each non-negative.
Status attrs_at(const ir::Operation& op, std::size_t first, std::span<std::uint64_t> out) {
  for (std::size_t i = 0; i < out.size(); ++i) {
    KILN_ASSIGN_OR_RETURN(out[i], attr_at(op, first + i));
  }
  return Status::Ok();
}

// Every attribute from `first` on (Permute's and Flip's axes).
Result<std::vector<std::uint64_t>> attrs_from(const ir::Operation& op, std::size_t first) {
  std::vector<std::uint64_t> v(op.attrs.size() > first ? op.attrs.size() - first : 0);
  KILN_RETURN_IF_ERROR(attrs_at(op, first, v));
  return v;
}

// Scatter / SelectAssign's update rule (attribute 1), ScatterNd's reduction (attribute 0): the
// Scatter and SelectAssign builders take it as given, so an unknown value is refused here.
Result<ir::IndexingUpdate> update_at(const ir::Operation& op, std::size_t i) {
  KILN_ASSIGN_OR_RETURN(std::uint64_t u, attr_at(op, i));
  if (u > static_cast<std::uint64_t>(ir::IndexingUpdate::Max))
    return make_error(ErrorCode::Invalid, fmt::format("{}: unknown indexing update {}", op.kind_name(), u));
  return static_cast<ir::IndexingUpdate>(u);
}

// A module op's optional third input (bias?).
std::optional<ir::TensorIr> optional_input(const ir::Operation& op, std::size_t i) {
  if (i < op.inputs().size()) return op.inputs()[i];
  return std::nullopt;
}

// The error for an op whose inputs or scalars do not fit its signature.
Error unexpected_arity(const ir::Operation& op) {
  return make_error(ErrorCode::Invalid, fmt::format("{}: unexpected number of inputs or scalars", op.kind_name()));
}

// Elementwise signatures: unary, binary, scalar (each possibly a comparison; the Activation
// kinds among them), cast, clamp, hard_sigmoid, masks, and the cross product (binary along a dim).
Result<ir::Operation> rebuild_elementwise(const ir::Operation& op) {
  const auto in = op.inputs();
  const ir::TensorIr& o = op.outputs()[0];
  const bool cmp = op.info().has(ir::kComparison);
  switch (op.info().signature) {
    case Signature::Unary:
      if (in.size() != 1) break;
      return cmp ? build::unary_comparison(op.family, op.kind, in[0], o.dtype, o.id)
                 : build::unary(op.family, op.kind, in[0], o.id);
    case Signature::Binary:
      if (in.size() != 2) break;
      return cmp ? build::binary_comparison(op.family, op.kind, in[0], in[1], o.dtype, o.id)
                 : build::binary(op.family, op.kind, in[0], in[1], o.id);
    case Signature::Scalar:
      if (in.size() != 1 || op.scalars.size() != 1) break;
      return cmp ? build::scalar_comparison(op.family, op.kind, in[0], op.scalars[0], o.dtype, o.id)
                 : build::scalar(op.family, op.kind, in[0], op.scalars[0], o.id);
    case Signature::Cast:
      if (in.size() != 1) break;
      return build::cast(op.family, op.kind, in[0], o.dtype, o.id);
    case Signature::Clamp:
      if (in.size() != 1 || op.scalars.size() != 2) break;
      return build::clamp(op.family, op.kind, in[0], op.scalars[0], op.scalars[1], o.id);
    case Signature::HardSigmoid:  // Activation HardSigmoid only: its builder fixes the family
      if (in.size() != 1 || op.scalars.size() != 2) break;
      return build::hard_sigmoid(in[0], op.scalars[0], op.scalars[1], o.id);
    case Signature::MaskWhere:
      if (in.size() != 3) break;
      return build::mask_where(op.family, op.kind, in[0], in[1], in[2], o.id);
    case Signature::MaskFill:
      if (in.size() != 2 || op.scalars.size() != 1) break;
      return build::mask_fill(op.family, op.kind, in[0], in[1], op.scalars[0], o.id);
    case Signature::Cross: {
      if (in.size() != 2) break;
      KILN_ASSIGN_OR_RETURN(std::uint64_t dim, attr_at(op, 0));
      return build::cross(op.family, op.kind, in[0], in[1], dim, o.id);
    }
    default: break;
  }
  return unexpected_arity(op);
}

// Matmul: the plain builder when the output keeps the input dtype, else the mixed one.
Result<ir::Operation> rebuild_matmul(const ir::Operation& op) {
  const auto in = op.inputs();
  const ir::TensorIr& o = op.outputs()[0];
  if (in.size() != 2) return unexpected_arity(op);
  return o.dtype == in[0].dtype ? build::matmul(op.family, op.kind, in[0], in[1], o.id)
                                : build::matmul_mixed(op.family, op.kind, in[0], in[1], o.dtype, o.id);
}

// Sort / ArgSort / SortWithIndices{input, dim, descending}: a descending flag other than 0 or 1
// is rebuilt as 1, so the comparison refuses it.
Result<ir::Operation> rebuild_sort(const ir::Operation& op) {
  const auto in = op.inputs();
  const ir::TensorIr& o = op.outputs()[0];
  if (in.size() != 1) return unexpected_arity(op);
  KILN_ASSIGN_OR_RETURN(std::uint64_t dim, attr_at(op, 0));
  KILN_ASSIGN_OR_RETURN(std::uint64_t descending, attr_at(op, 1));
  if (op.info().signature == Signature::SortWithIndices) {
    const ir::TensorIr& indices = op.outputs()[1];
    return build::sort_with_indices(op.family, op.kind, in[0], dim, descending != 0, indices.dtype, o.id, indices.id);
  }
  if (op.info().has(ir::kIndexOutput))
    return build::sort_arg(op.family, op.kind, in[0], dim, descending != 0, o.dtype, o.id);
  return build::sort(op.family, op.kind, in[0], dim, descending != 0, o.id);
}

// Reductions: whole-tensor, over a dim (value, arg or bool output; TopK / ArgTopK keep k values),
// scans along a dim, max / min along a dim with their indices and TopKWithIndices (two outputs).
Result<ir::Operation> rebuild_reduction(const ir::Operation& op) {
  const auto in = op.inputs();
  const ir::TensorIr& o = op.outputs()[0];
  switch (op.info().signature) {
    case Signature::Reduce:
      if (in.size() != 1) break;
      // By the kind's tag, not the dtypes: All / Any of a bool tensor keep its dtype.
      return op.info().has(ir::kComparison) ? build::reduce_bool(op.family, op.kind, in[0], o.dtype, o.id)
                                            : build::reduce(op.family, op.kind, in[0], o.id);
    case Signature::ReduceDim: {
      if (in.size() != 1) break;
      KILN_ASSIGN_OR_RETURN(std::uint64_t axis, attr_at(op, 0));
      KILN_ASSIGN_OR_RETURN(std::uint64_t acc, attr_at(op, 1));
      if (op.info().has(ir::kIndexOutput))
        return build::reduce_dim_arg(op.family, op.kind, in[0], axis, acc, o.dtype, o.id);
      if (op.info().has(ir::kComparison))
        return build::reduce_dim_bool(op.family, op.kind, in[0], axis, acc, o.dtype, o.id);
      return build::reduce_dim(op.family, op.kind, in[0], axis, acc, o.id);
    }
    case Signature::Dim: {
      if (in.size() != 1) break;
      KILN_ASSIGN_OR_RETURN(std::uint64_t axis, attr_at(op, 0));
      return build::dim(op.family, op.kind, in[0], axis, o.id);
    }
    case Signature::ReduceDimWithIndices: {
      if (in.size() != 1 || op.outputs().size() != 2) break;
      KILN_ASSIGN_OR_RETURN(std::uint64_t dim, attr_at(op, 0));
      const ir::TensorIr& indices = op.outputs()[1];
      return build::reduce_dim_with_indices(op.family, op.kind, in[0], dim, indices.dtype, o.id, indices.id);
    }
    case Signature::TopKWithIndices: {
      if (in.size() != 1 || op.outputs().size() != 2) break;
      KILN_ASSIGN_OR_RETURN(std::uint64_t dim, attr_at(op, 0));
      KILN_ASSIGN_OR_RETURN(std::uint64_t k, attr_at(op, 1));
      const ir::TensorIr& indices = op.outputs()[1];
      return build::topk_with_indices(op.family, op.kind, in[0], dim, k, indices.dtype, o.id, indices.id);
    }
    default: break;
  }
  return unexpected_arity(op);
}

// Layout signatures: reshape / expand, swap_dims, permute, flip, slice, unfold.
Result<ir::Operation> rebuild_layout(const ir::Operation& op) {
  const auto in = op.inputs();
  const ir::TensorIr& o = op.outputs()[0];
  switch (op.info().signature) {
    case Signature::ShapeOp: {
      if (in.size() != 1) break;
      // Reshape and Expand carry no attributes: the claimed output shape is the target, and the
      // builder checks that it is one the input can take.
      std::vector<std::int64_t> args;
      for (std::uint64_t d : o.shape) {
        if (d > static_cast<std::uint64_t>(INT64_MAX)) return make_error(ErrorCode::Invalid, "dimension out of range");
        args.push_back(static_cast<std::int64_t>(d));
      }
      return build::shape_op(op.family, op.kind, in[0], args, o.id);
    }
    case Signature::SwapDims: {
      if (in.size() != 1) break;
      KILN_ASSIGN_OR_RETURN(std::uint64_t d1, attr_at(op, 0));
      KILN_ASSIGN_OR_RETURN(std::uint64_t d2, attr_at(op, 1));
      return build::swap_dims(op.family, op.kind, in[0], d1, d2, o.id);
    }
    case Signature::Permute:
    case Signature::Flip: {
      if (in.size() != 1) break;
      KILN_ASSIGN_OR_RETURN(std::vector<std::uint64_t> axes, attrs_from(op, 0));
      return op.info().signature == Signature::Permute ? build::permute(op.family, op.kind, in[0], axes, o.id)
                                                       : build::flip(op.family, op.kind, in[0], axes, o.id);
    }
    case Signature::Slice:
      if (in.size() != 1) break;
      return build::slice(op.family, op.kind, in[0], std::span<const ir::Slice>(op.ranges.data(), op.ranges.size()),
                          o.id);
    case Signature::Unfold: {
      if (in.size() != 1) break;
      std::uint64_t a[3];
      KILN_RETURN_IF_ERROR(attrs_at(op, 0, a));
      return build::unfold(op.family, op.kind, in[0], a[0], a[1], a[2], o.id);
    }
    default: break;
  }
  return unexpected_arity(op);
}

// Indexed reads: cat along a dim, gather and select along a dim, gather_nd.
Result<ir::Operation> rebuild_indexing(const ir::Operation& op) {
  const auto in = op.inputs();
  const ir::TensorIr& o = op.outputs()[0];
  switch (op.info().signature) {
    case Signature::Cat: {
      if (in.empty()) break;
      KILN_ASSIGN_OR_RETURN(std::uint64_t dim, attr_at(op, 0));
      return build::cat(op.family, op.kind, in, dim, o.id);
    }
    case Signature::Gather:
    case Signature::Select: {
      if (in.size() != 2) break;
      KILN_ASSIGN_OR_RETURN(std::uint64_t dim, attr_at(op, 0));
      return op.info().signature == Signature::Gather ? build::gather(op.family, op.kind, in[0], dim, in[1], o.id)
                                                      : build::select(op.family, op.kind, in[0], dim, in[1], o.id);
    }
    case Signature::GatherNd:
      if (in.size() != 2) break;
      return build::gather_nd(op.family, op.kind, in[0], in[1], o.id);
    default: break;
  }
  return unexpected_arity(op);
}

// Writes into a copy of the tensor: slice_assign, select_assign, scatter, scatter_nd; and the
// shape-changing copies repeat_dim and pad.
Result<ir::Operation> rebuild_update(const ir::Operation& op) {
  const auto in = op.inputs();
  const ir::TensorIr& o = op.outputs()[0];
  switch (op.info().signature) {
    case Signature::SliceAssign:
      if (in.size() != 2) break;
      return build::slice_assign(op.family, op.kind, in[0],
                                 std::span<const ir::Slice>(op.ranges.data(), op.ranges.size()), in[1], o.id);
    case Signature::SelectAssign:
    case Signature::Scatter: {
      if (in.size() != 3) break;
      KILN_ASSIGN_OR_RETURN(std::uint64_t dim, attr_at(op, 0));
      KILN_ASSIGN_OR_RETURN(ir::IndexingUpdate update, update_at(op, 1));
      if (op.info().signature == Signature::Scatter)
        return build::scatter(op.family, op.kind, in[0], dim, in[1], in[2], update, o.id);
      return build::select_assign(op.family, op.kind, in[0], dim, in[1], in[2], update, o.id);
    }
    case Signature::ScatterNd: {
      if (in.size() != 3) break;
      KILN_ASSIGN_OR_RETURN(ir::IndexingUpdate reduction, update_at(op, 0));
      return build::scatter_nd(op.family, op.kind, in[0], in[1], in[2], reduction, o.id);
    }
    case Signature::RepeatDim: {
      if (in.size() != 1) break;
      std::uint64_t a[2];
      KILN_RETURN_IF_ERROR(attrs_at(op, 0, a));
      return build::repeat_dim(op.family, op.kind, in[0], a[0], a[1], o.id);
    }
    case Signature::Pad: {
      if (in.size() != 1 || op.attrs.empty() || op.attrs.size() % 2 != 1 || op.scalars.size() > 1) break;
      // [mode, before0, after0, ...]; the builder checks the mode and the constant's presence.
      KILN_ASSIGN_OR_RETURN(std::vector<std::uint64_t> a, attrs_from(op, 0));
      std::vector<build::PadPair> pairs;
      for (std::size_t i = 1; i + 1 < a.size(); i += 2) pairs.push_back(build::PadPair{a[i], a[i + 1]});
      std::optional<ir::ScalarIr> constant;
      if (!op.scalars.empty()) constant = op.scalars[0];
      return build::pad(op.family, op.kind, in[0], pairs, static_cast<ir::PadMode>(a[0]), constant, o.id);
    }
    default: break;
  }
  return unexpected_arity(op);
}

// Pools; their options are the attributes in builder order.
Result<ir::Operation> rebuild_module(const ir::Operation& op) {
  const auto in = op.inputs();
  const ir::TensorIr& o = op.outputs()[0];
  if (in.size() != 1) return unexpected_arity(op);
  std::uint64_t a[9] = {};
  switch (op.info().signature) {
    // A flag attribute other than 0 or 1 is rebuilt as 1, so the comparison refuses it.
    case Signature::MaxPool2d: {
      KILN_RETURN_IF_ERROR(attrs_at(op, 0, std::span<std::uint64_t>(a, 9)));
      const build::MaxPool2dOptions opts{{a[0], a[1]}, {a[2], a[3]}, {a[4], a[5]}, {a[6], a[7]}, a[8] != 0};
      return build::max_pool2d(in[0], opts, o.id);
    }
    case Signature::AvgPool2d: {
      KILN_RETURN_IF_ERROR(attrs_at(op, 0, std::span<std::uint64_t>(a, 8)));
      const build::AvgPool2dOptions opts{{a[0], a[1]}, {a[2], a[3]}, {a[4], a[5]}, a[6] != 0, a[7] != 0};
      return build::avg_pool2d(in[0], opts, o.id);
    }
    default: break;
  }
  return unexpected_arity(op);
}

// Dense layers, norms, and the embedding with its gradient (docs/spec/ir.md §5.8): tensors in field
// order, the optional bias / beta present when the op has three inputs. LayerNorm's epsilon is its
// attribute's f64 bits; BatchNorm's is its scalar, rebuilt as Float(to_f64), so the comparison
// refuses a scalar of another kind.
Result<ir::Operation> rebuild_dense(const ir::Operation& op) {
  const auto in = op.inputs();
  const ir::TensorId out = op.outputs()[0].id;
  switch (op.info().signature) {
    case Signature::Linear:
      if (in.size() != 2 && in.size() != 3) break;
      return build::linear(in[0], in[1], optional_input(op, 2), out);
    case Signature::LinearBackward:
      if (in.size() != 2) break;
      return op.kind == OpKind::Module_LinearXBackward ? build::linear_x_backward(in[0], in[1], out)
                                                       : build::linear_weight_backward(in[0], in[1], out);
    case Signature::LinearBiasBackward:
      if (in.size() != 1) break;
      return build::linear_bias_backward(in[0], out);
    case Signature::LayerNorm: {
      if ((in.size() != 2 && in.size() != 3) || op.attrs.size() != 1) break;
      double epsilon = 0;
      std::memcpy(&epsilon, &op.attrs[0], sizeof epsilon);
      if (op.outputs().size() == 3)
        return build::layer_norm_with_stats(in[0], in[1], optional_input(op, 2), epsilon, out, op.outputs()[1].id,
                                            op.outputs()[2].id);
      return build::layer_norm(in[0], in[1], optional_input(op, 2), epsilon, out);
    }
    case Signature::BatchNorm:
      if (in.size() != 5 || op.scalars.size() != 1) break;
      return build::batch_norm(in[0], in[1], in[2], in[3], in[4], op.scalars[0].to_f64(), out);
    case Signature::Embedding:
      if (in.size() != 2) break;
      return build::embedding(in[0], in[1], out);
    case Signature::EmbeddingBackward:
      if (in.size() != 3) break;
      return build::embedding_backward(in[0], in[1], in[2], out);
    default: break;
  }
  return unexpected_arity(op);
}

// Pools beyond MaxPool2d / AvgPool2d (docs/spec/ir.md §5.8): the kind gives the spatial dims and
// the attributes are the window in builder order (op_table.h), or an adaptive pool's output size.
// A missing attribute is refused here; a surplus one is not rebuilt, so the comparison refuses it,
// and a flag other than 0 or 1 is rebuilt as 1, likewise.
Result<build::MaxPool1dOptions> max_pool1d_options(const ir::Operation& op) {
  std::uint64_t a[5] = {};
  KILN_RETURN_IF_ERROR(attrs_at(op, 0, a));
  return build::MaxPool1dOptions{a[0], a[1], a[2], a[3], a[4] != 0};
}

Result<build::MaxPool2dOptions> max_pool2d_options(const ir::Operation& op) {
  std::uint64_t a[9] = {};
  KILN_RETURN_IF_ERROR(attrs_at(op, 0, a));
  return build::MaxPool2dOptions{{a[0], a[1]}, {a[2], a[3]}, {a[4], a[5]}, {a[6], a[7]}, a[8] != 0};
}

Result<build::AvgPool1dOptions> avg_pool1d_options(const ir::Operation& op) {
  std::uint64_t a[5] = {};
  KILN_RETURN_IF_ERROR(attrs_at(op, 0, a));
  return build::AvgPool1dOptions{a[0], a[1], a[2], a[3] != 0, a[4] != 0};
}

Result<build::AvgPool2dOptions> avg_pool2d_options(const ir::Operation& op) {
  std::uint64_t a[8] = {};
  KILN_RETURN_IF_ERROR(attrs_at(op, 0, a));
  return build::AvgPool2dOptions{{a[0], a[1]}, {a[2], a[3]}, {a[4], a[5]}, a[6] != 0, a[7] != 0};
}

// Max pools: MaxPool1d, the two with indices (out, out_indices) and their backwards.
Result<ir::Operation> rebuild_max_pool(const ir::Operation& op, std::size_t n) {
  const auto in = op.inputs();
  const auto outs = op.outputs();
  const bool backward = op.info().signature == Signature::MaxPoolWithIndicesBackward;
  if (in.size() != (backward ? 3u : 1u)) return unexpected_arity(op);
  if (n == 1) {
    KILN_ASSIGN_OR_RETURN(build::MaxPool1dOptions o, max_pool1d_options(op));
    if (backward) return build::max_pool1d_with_indices_backward(in[0], in[1], in[2], o, outs[0].id);
    if (outs.size() == 1) return build::max_pool1d(in[0], o, outs[0].id);
    return build::max_pool1d_with_indices(in[0], o, outs[1].dtype, outs[0].id, outs[1].id);
  }
  KILN_ASSIGN_OR_RETURN(build::MaxPool2dOptions o, max_pool2d_options(op));
  if (backward) return build::max_pool2d_with_indices_backward(in[0], in[1], in[2], o, outs[0].id);
  return build::max_pool2d_with_indices(in[0], o, outs[1].dtype, outs[0].id, outs[1].id);
}

// Average pools: AvgPool1d and the two backwards {x, grad}.
Result<ir::Operation> rebuild_avg_pool(const ir::Operation& op, std::size_t n) {
  const auto in = op.inputs();
  const ir::TensorId out = op.outputs()[0].id;
  const bool backward = op.info().signature == Signature::AvgPoolBackward;
  if (in.size() != (backward ? 2u : 1u)) return unexpected_arity(op);
  if (n == 1) {
    KILN_ASSIGN_OR_RETURN(build::AvgPool1dOptions o, avg_pool1d_options(op));
    return backward ? build::avg_pool1d_backward(in[0], in[1], o, out) : build::avg_pool1d(in[0], o, out);
  }
  KILN_ASSIGN_OR_RETURN(build::AvgPool2dOptions o, avg_pool2d_options(op));
  return build::avg_pool2d_backward(in[0], in[1], o, out);
}

// Adaptive average pools {x; output sizes} and their backwards {x, grad}.
Result<ir::Operation> rebuild_adaptive_avg_pool(const ir::Operation& op, std::size_t n) {
  const auto in = op.inputs();
  const ir::TensorId out = op.outputs()[0].id;
  if (op.info().signature == Signature::AdaptiveAvgPoolBackward) {
    if (in.size() != 2) return unexpected_arity(op);
    if (n == 1) return build::adaptive_avg_pool1d_backward(in[0], in[1], out);
    if (n == 2) return build::adaptive_avg_pool2d_backward(in[0], in[1], out);
    return build::adaptive_avg_pool3d_backward(in[0], in[1], out);
  }
  if (in.size() != 1) return unexpected_arity(op);
  std::uint64_t a[3] = {};
  KILN_RETURN_IF_ERROR(attrs_at(op, 0, std::span<std::uint64_t>(a, n)));
  if (n == 1) return build::adaptive_avg_pool1d(in[0], a[0], out);
  if (n == 2) return build::adaptive_avg_pool2d(in[0], {a[0], a[1]}, out);
  return build::adaptive_avg_pool3d(in[0], {a[0], a[1], a[2]}, out);
}

Result<ir::Operation> rebuild_pool(const ir::Operation& op) {
  const std::size_t n = build::pool_spatial_dims(op.kind);
  switch (op.info().signature) {
    case Signature::MaxPool:
    case Signature::MaxPoolWithIndices:
    case Signature::MaxPoolWithIndicesBackward: return rebuild_max_pool(op, n);
    case Signature::AvgPool:
    case Signature::AvgPoolBackward: return rebuild_avg_pool(op, n);
    case Signature::AdaptiveAvgPool:
    case Signature::AdaptiveAvgPoolBackward: return rebuild_adaptive_avg_pool(op, n);
    default: break;
  }
  return unexpected_arity(op);
}

// Resampling (docs/spec/ir.md §5.6, §5.8): the options are the attributes in builder order. An
// enum attribute is passed on as given and the builders refuse an unknown value; a flag other than
// 0 or 1 is rebuilt as 1, so the comparison refuses it.
Result<ir::Operation> rebuild_resample(const ir::Operation& op) {
  const auto in = op.inputs();
  const ir::TensorId out = op.outputs()[0].id;
  std::uint64_t a[8] = {};
  switch (op.info().signature) {
    case Signature::GridSample2d: {
      if (in.size() != 2) break;
      KILN_RETURN_IF_ERROR(attrs_at(op, 0, std::span<std::uint64_t>(a, 3)));
      const build::GridSampleOptions opts{static_cast<ir::InterpolateMode>(a[0]),
                                          static_cast<ir::GridSamplePaddingMode>(a[1]), a[2] != 0};
      return build::grid_sample_2d(in[0], in[1], opts, out);
    }
    case Signature::Interpolate:
    case Signature::InterpolateBackward: {
      const bool backward = op.info().signature == Signature::InterpolateBackward;
      if (in.size() != (backward ? 2u : 1u)) break;
      KILN_RETURN_IF_ERROR(attrs_at(op, 0, std::span<std::uint64_t>(a, 4)));
      const build::InterpolateOptions opts{static_cast<ir::InterpolateMode>(a[2]), a[3] != 0};
      return backward ? build::interpolate_backward(in[0], in[1], {a[0], a[1]}, opts, out)
                      : build::interpolate(in[0], {a[0], a[1]}, opts, out);
    }
    case Signature::Unfold4d: {
      if (in.size() != 1) break;
      KILN_RETURN_IF_ERROR(attrs_at(op, 0, std::span<std::uint64_t>(a, 8)));
      const build::Unfold4dOptions opts{{a[2], a[3]}, {a[4], a[5]}, {a[6], a[7]}};
      return build::unfold4d(in[0], {a[0], a[1]}, opts, out);
    }
    default: break;
  }
  return unexpected_arity(op);
}

// Rfft{signal; dim, n} → out_re, out_im and IRfft{input_re, input_im; dim, n} (docs/spec/ir.md
// §5.8): n = 0 stands for none given, which the builders take as nullopt.
Result<ir::Operation> rebuild_fft(const ir::Operation& op) {
  const auto in = op.inputs();
  const auto outs = op.outputs();
  std::uint64_t a[2] = {};
  KILN_RETURN_IF_ERROR(attrs_at(op, 0, a));
  const std::optional<std::uint64_t> n = a[1] == 0 ? std::nullopt : std::optional<std::uint64_t>(a[1]);
  if (op.info().signature == Signature::Rfft) {
    if (in.size() != 1) return unexpected_arity(op);
    return build::rfft(in[0], a[0], n, outs[0].id, outs[1].id);
  }
  if (in.size() != 2) return unexpected_arity(op);
  return build::irfft(in[0], in[1], a[0], n, outs[0].id);
}

// An optional f64 option: the attribute's bits when `bit` is present (the builder writes 0 when not,
// so a stray value is rebuilt as 0 and refused as differing).
std::optional<double> optional_f64(const ir::Operation& op, std::int64_t present, std::int64_t bit, std::size_t i) {
  if ((present & bit) == 0) return std::nullopt;
  double v = 0;
  std::memcpy(&v, &op.attrs[i], sizeof v);
  return v;
}

// Attention{query, key, value, mask?, attn_bias?; present, is_causal, bits(scale), bits(softcap)}:
// the presence bits say which optional inputs follow value (mask first) and which options hold a
// value; unknown bits, or an input count the bits do not announce, are refused here.
Result<ir::Operation> rebuild_attention(const ir::Operation& op) {
  const auto in = op.inputs();
  if (op.attrs.size() != 4) return unexpected_arity(op);
  const std::int64_t present = op.attrs[0];
  constexpr std::int64_t kKnown = ir::kPresentMask | ir::kPresentBias | ir::kPresentScale | ir::kPresentSoftcap;
  if (present < 0 || (present & ~kKnown) != 0)
    return make_error(ErrorCode::Invalid, fmt::format("{}: unknown presence bits {}", op.kind_name(), present));
  const bool has_mask = (present & ir::kPresentMask) != 0, has_bias = (present & ir::kPresentBias) != 0;
  if (in.size() != 3u + (has_mask ? 1 : 0) + (has_bias ? 1 : 0)) return unexpected_arity(op);
  std::optional<ir::TensorIr> mask, bias;
  if (has_mask) mask = in[3];
  if (has_bias) bias = in[has_mask ? 4 : 3];
  build::AttentionOptions o;
  o.scale = optional_f64(op, present, ir::kPresentScale, 2);
  o.softcap = optional_f64(op, present, ir::kPresentSoftcap, 3);
  o.is_causal = op.attrs[1] != 0;  // a flag other than 0 / 1 is rebuilt as 1 and refused as differing
  return build::attention(in[0], in[1], in[2], mask, bias, o, op.outputs()[0].id);
}

// CtcLoss{log_probs, targets, input_lengths, target_lengths; blank} and its backward (grad_loss
// fifth).
Result<ir::Operation> rebuild_ctc(const ir::Operation& op) {
  const auto in = op.inputs();
  const ir::TensorId out = op.outputs()[0].id;
  KILN_ASSIGN_OR_RETURN(std::uint64_t blank, attr_at(op, 0));
  if (op.info().signature == Signature::CtcLoss) {
    if (in.size() != 4) return unexpected_arity(op);
    return build::ctc_loss(in[0], in[1], in[2], in[3], blank, out);
  }
  if (in.size() != 5) return unexpected_arity(op);
  return build::ctc_loss_backward(in[0], in[1], in[2], in[3], in[4], blank, out);
}

// DeformableConv2d{x, offset, weight, mask?, bias?; present, s0, s1, p0, p1, d0, d1, wg, og} and its
// backward (out_grad last; outputs input_grad, offset_grad, weight_grad, mask_grad?, bias_grad?):
// the presence bits say which optional inputs follow weight and which optional outputs follow
// weight_grad; unknown bits, or input or output counts the bits do not announce, are refused here.
Result<ir::Operation> rebuild_deformable(const ir::Operation& op) {
  const auto in = op.inputs();
  const auto outs = op.outputs();
  std::uint64_t a[9] = {};
  KILN_RETURN_IF_ERROR(attrs_at(op, 0, a));
  if (a[0] > static_cast<std::uint64_t>(ir::kPresentMask | ir::kPresentBias))
    return make_error(ErrorCode::Invalid, fmt::format("{}: unknown presence bits {}", op.kind_name(), a[0]));
  const bool has_mask = (a[0] & ir::kPresentMask) != 0, has_bias = (a[0] & ir::kPresentBias) != 0;
  const std::size_t optional = (has_mask ? 1 : 0) + (has_bias ? 1 : 0);
  const bool backward = op.info().signature == Signature::DeformableConv2dBackward;
  if (in.size() != 3 + optional + (backward ? 1 : 0) || (backward && outs.size() != 3 + optional))
    return unexpected_arity(op);
  std::optional<ir::TensorIr> mask, bias;
  if (has_mask) mask = in[3];
  if (has_bias) bias = in[has_mask ? 4 : 3];
  const build::DeformableConv2dOptions o{{a[1], a[2]}, {a[3], a[4]}, {a[5], a[6]}, a[7], a[8]};
  if (!backward) return build::deformable_conv2d(in[0], in[1], in[2], mask, bias, o, outs[0].id);
  build::DeformableConv2dGradIds ids{outs[0].id, outs[1].id, outs[2].id, std::nullopt, std::nullopt};
  if (has_mask) ids.mask_grad = outs[3].id;
  if (has_bias) ids.bias_grad = outs[has_mask ? 4 : 3].id;
  return build::deformable_conv2d_backward(in[0], in[1], in[2], mask, bias, in.back(), o, ids);
}

// Float Quantize{tensor, scales, global?}: the scheme is the claimed output's QFloat dtype, which
// the builder holds to the tensor's shape; the optional global is told by the input count.
// Dequantize is a Cast and rebuilt with the elementwise kinds.
Result<ir::Operation> rebuild_quantize(const ir::Operation& op) {
  const auto in = op.inputs();
  const ir::TensorIr& o = op.outputs()[0];
  if (in.size() != 2 && in.size() != 3) return unexpected_arity(op);
  if (!o.dtype.is_quantized())
    return make_error(ErrorCode::Invalid,
                      fmt::format("{}: output {} must have a QFloat dtype", op.kind_name(), o.to_string()));
  return build::quantize(in[0], in[1], optional_input(op, 2), o.dtype.scheme(), o.id);
}

// AllReduce{tensor, op, device ids packed as (type << 16 | index)}: an id that does not unpack
// to two u16 is rebuilt differently, so the comparison refuses it.
Result<ir::Operation> rebuild_all_reduce(const ir::Operation& op) {
  if (op.inputs().size() != 1) return unexpected_arity(op);
  KILN_ASSIGN_OR_RETURN(std::vector<std::uint64_t> a, attrs_from(op, 0));
  if (a.empty()) return unexpected_arity(op);
  std::vector<build::DeviceId> devices;
  for (std::size_t i = 1; i < a.size(); ++i)
    devices.push_back(build::DeviceId{static_cast<std::uint16_t>(a[i] >> 16), static_cast<std::uint16_t>(a[i])});
  return build::all_reduce(op.inputs()[0], static_cast<ir::ReduceOperation>(a[0]), devices, op.outputs()[0].id);
}

// Broadcast [root, ids...], AllGather [dim, ids...], ReduceScatter [op, dim, ids...]: the ids
// rebuilt as AllReduce's, the leading attributes passed as they came (the builders bound them).
Result<ir::Operation> rebuild_collective(const ir::Operation& op) {
  if (op.inputs().size() != 1) return unexpected_arity(op);
  KILN_ASSIGN_OR_RETURN(std::vector<std::uint64_t> a, attrs_from(op, 0));
  const bool scatter = op.kind == ir::OpKind::Distributed_ReduceScatter;
  const std::size_t leading = scatter ? 2 : 1;
  if (a.size() < leading) return unexpected_arity(op);
  std::vector<build::DeviceId> devices;
  for (std::size_t i = leading; i < a.size(); ++i)
    devices.push_back(build::DeviceId{static_cast<std::uint16_t>(a[i] >> 16), static_cast<std::uint16_t>(a[i])});
  const ir::TensorIr& in = op.inputs()[0];
  const ir::TensorId out = op.outputs()[0].id;
  if (op.kind == ir::OpKind::Distributed_Broadcast) return build::broadcast(in, a[0], devices, out);
  if (op.kind == ir::OpKind::Distributed_AllGather) return build::all_gather(in, a[0], devices, out);
  return build::reduce_scatter(in, static_cast<ir::ReduceOperation>(a[0]), a[1], devices, out);
}

// Creation signatures: ones / zeros, and full with its scalar.
Result<ir::Operation> rebuild_creation(const ir::Operation& op) {
  const auto in = op.inputs();
  const ir::TensorIr& o = op.outputs()[0];
  switch (op.info().signature) {
    case Signature::Creation:
      if (!in.empty()) break;
      return build::creation(op.family, op.kind, o.shape, o.dtype, o.id);
    case Signature::Full:
      if (!in.empty() || op.scalars.size() != 1) break;
      return build::full(op.family, op.kind, o.shape, o.dtype, op.scalars[0], o.id);
    default: break;
  }
  return unexpected_arity(op);
}

// Random creation (Float Random, NumericInt IntRandom; Session::random): no inputs or scalars,
// attributes [distribution, bits(param0), bits(param1)]. The builder refuses an unknown
// distribution; the parameters' ranges are the executor's to check (an error value on the output).
Result<ir::Operation> rebuild_random(const ir::Operation& op) {
  if (!op.inputs().empty() || !op.scalars.empty()) return unexpected_arity(op);
  if (op.attrs.size() != 3)
    return make_error(ErrorCode::Invalid, fmt::format("{}: attributes missing or extra: {} given, 3 expected",
                                                      op.kind_name(), op.attrs.size()));
  build::DistributionIr d;
  d.kind = static_cast<ir::Distribution>(op.attrs[0]);
  std::memcpy(&d.param0, &op.attrs[1], sizeof d.param0);
  std::memcpy(&d.param1, &op.attrs[2], sizeof d.param1);
  const ir::TensorIr& o = op.outputs()[0];
  return build::random(op.family, op.kind, o.shape, o.dtype, d, o.id);
}

// A convolution's options from its attributes: [stride..., padding..., padding_out...
// (transposed only), dilation..., groups], each list as long as the kind's rank.
Result<build::ConvOptions> conv_options_at(const ir::Operation& op, const build::ConvKindInfo& k) {
  const std::size_t n = k.rank, lists = k.transposed ? 4 : 3;
  if (op.attrs.size() != lists * n + 1)
    return make_error(ErrorCode::Invalid,
                      fmt::format("{}: attributes missing or extra: {} given, {} for {} spatial dims", op.kind_name(),
                                  op.attrs.size(), lists * n + 1, n));
  Result<build::ConvOptions> o = build::conv_options_of(op);
  if (!o.ok()) return make_error(o.error().code, fmt::format("{}: {}", op.kind_name(), o.error().message));
  return o;
}

// Convolutions and their gradients (docs/spec/ir.md §5.8): tensors in field order (the forwards'
// bias present when there are three inputs), the kind's rank splitting the attributes.
Result<ir::Operation> rebuild_conv(const ir::Operation& op) {
  const std::optional<build::ConvKindInfo> k = build::conv_kind_info(op.kind);
  if (!k) return unexpected_arity(op);
  const auto in = op.inputs();
  const ir::TensorId out = op.outputs()[0].id;
  if (k->role == build::ConvRole::BiasBackward) {
    if (in.size() != 3 || !op.attrs.empty()) return unexpected_arity(op);
    return build::conv_bias_backward(op.kind, in[0], in[1], in[2], out);
  }
  KILN_ASSIGN_OR_RETURN(build::ConvOptions o, conv_options_at(op, *k));
  switch (op.info().signature) {
    case Signature::Conv:
      if (in.size() != 2 && in.size() != 3) break;
      return build::conv(op.kind, in[0], in[1], optional_input(op, 2), o, out);
    case Signature::ConvTranspose:
      if (in.size() != 2 && in.size() != 3) break;
      return build::conv_transpose(op.kind, in[0], in[1], optional_input(op, 2), o, out);
    case Signature::ConvBackward:
      if (in.size() != 3) break;
      return build::conv_backward(op.kind, in[0], in[1], in[2], o, out);
    case Signature::ConvTransposeBackward:
      if (in.size() != 3) break;
      return build::conv_transpose_backward(op.kind, in[0], in[1], in[2], o, out);
    default: break;
  }
  return unexpected_arity(op);
}

// The module, collective and creation signatures (the rest of rebuild's dispatch).
Result<ir::Operation> rebuild_module_kinds(const ir::Operation& op) {
  switch (op.info().signature) {
    case Signature::MaxPool2d:
    case Signature::AvgPool2d: return rebuild_module(op);
    case Signature::Linear:
    case Signature::LinearBackward:
    case Signature::LinearBiasBackward:
    case Signature::LayerNorm:
    case Signature::BatchNorm:
    case Signature::Embedding:
    case Signature::EmbeddingBackward: return rebuild_dense(op);
    case Signature::MaxPool:
    case Signature::MaxPoolWithIndices:
    case Signature::MaxPoolWithIndicesBackward:
    case Signature::AvgPool:
    case Signature::AvgPoolBackward:
    case Signature::AdaptiveAvgPool:
    case Signature::AdaptiveAvgPoolBackward: return rebuild_pool(op);
    case Signature::AllReduce: return rebuild_all_reduce(op);
    case Signature::Broadcast:
    case Signature::AllGather:
    case Signature::ReduceScatter: return rebuild_collective(op);
    case Signature::Creation:
    case Signature::Full: return rebuild_creation(op);
    case Signature::Random: return rebuild_random(op);
    case Signature::Conv:
    case Signature::ConvTranspose:
    case Signature::ConvBackward:
    case Signature::ConvTransposeBackward:
    case Signature::ConvBiasBackward: return rebuild_conv(op);
    case Signature::DeformableConv2d:
    case Signature::DeformableConv2dBackward: return rebuild_deformable(op);
    case Signature::Quantize: return rebuild_quantize(op);
    case Signature::GridSample2d:
    case Signature::Interpolate:
    case Signature::InterpolateBackward:
    case Signature::Unfold4d: return rebuild_resample(op);
    case Signature::Rfft:
    case Signature::IRfft: return rebuild_fft(op);
    case Signature::Attention: return rebuild_attention(op);
    case Signature::CtcLoss:
    case Signature::CtcLossBackward: return rebuild_ctc(op);
    default:
      return make_error(ErrorCode::Invalid,
                        fmt::format("{}: this kind of operation is not accepted over IPC", op.kind_name()));
  }
}

// The builder call that would have produced `op`, from its own inputs, scalars and attributes.
Result<ir::Operation> rebuild(const ir::Operation& op) {
  // Decoding held the output count to the signature's range (Operation::validate); a hand-made op
  // is held to it here, so that every rebuild below may read the outputs it expects (an op of
  // optional outputs checks which it has itself). A variadic count (Custom) is never accepted.
  // SyncCollective carries nothing (Session::sync_collective's router form): the builder's op,
  // compared whole, refuses any tensor, scalar or attribute it was sent with.
  if (op.kind == ir::OpKind::Distributed_SyncCollective) return ir::build::sync_collective();
  const ir::SignatureInfo& sig = ir::signature_info(op.info().signature);
  const std::size_t outputs = op.outputs().size();
  if (sig.min_outputs < 1 || sig.max_outputs == ir::kVariadic || outputs < static_cast<std::size_t>(sig.min_outputs) ||
      outputs > static_cast<std::size_t>(sig.max_outputs))
    return make_error(ErrorCode::Invalid,
                      fmt::format("{}: not accepted over IPC ({} outputs)", op.kind_name(), outputs));
  switch (op.info().signature) {
    case Signature::Unary:
    case Signature::Binary:
    case Signature::Scalar:
    case Signature::Cast:
    case Signature::Clamp:
    case Signature::HardSigmoid:
    case Signature::MaskWhere:
    case Signature::MaskFill:
    case Signature::Cross: return rebuild_elementwise(op);
    case Signature::Matmul: return rebuild_matmul(op);
    case Signature::Reduce:
    case Signature::ReduceDim:
    case Signature::Dim:
    case Signature::ReduceDimWithIndices:
    case Signature::TopKWithIndices: return rebuild_reduction(op);
    case Signature::Sort:
    case Signature::SortWithIndices: return rebuild_sort(op);
    case Signature::ShapeOp:
    case Signature::SwapDims:
    case Signature::Permute:
    case Signature::Flip:
    case Signature::Slice:
    case Signature::Unfold: return rebuild_layout(op);
    case Signature::Cat:
    case Signature::Gather:
    case Signature::Select:
    case Signature::GatherNd: return rebuild_indexing(op);
    case Signature::SliceAssign:
    case Signature::SelectAssign:
    case Signature::Scatter:
    case Signature::ScatterNd:
    case Signature::RepeatDim:
    case Signature::Pad: return rebuild_update(op);
    default: return rebuild_module_kinds(op);
  }
}

}  // namespace

Status check_client_operation(const ir::Operation& op) {
  // No second Operation::validate: the codec's decode ran it (see the header).
  for (const ir::TensorIr& t : op.inputs())
    if (t.status != ir::TensorStatus::ReadOnly && t.status != ir::TensorStatus::ReadWrite)
      return make_error(ErrorCode::Invalid, fmt::format("{}: input {} has status {}; inputs are ReadOnly or ReadWrite",
                                                        op.kind_name(), t.id.to_string(), ir::status_name(t.status)));
  KILN_ASSIGN_OR_RETURN(ir::Operation rebuilt, rebuild(op));
  if (rebuilt == op) return Status::Ok();
  // Name what differs: outputs first (the usual lie), then anything else.
  const auto claimed = op.outputs();
  const auto inferred = rebuilt.outputs();
  for (std::size_t i = 0; i < claimed.size() && i < inferred.size(); ++i)
    if (!(claimed[i] == inferred[i]))
      return make_error(ErrorCode::Invalid, fmt::format("{}: output {} is {} but the builder infers {}", op.kind_name(),
                                                        i, claimed[i].to_string(), inferred[i].to_string()));
  return make_error(ErrorCode::Invalid,
                    fmt::format("{}: the operation differs from what its builder makes of its inputs and attributes",
                                op.kind_name()));
}

namespace {

// Everything but the tensor ids, with the project's structural mix (a slot index; equality
// decides).
std::uint64_t shape_hash(const ir::Operation& op) {
  ir::StructuralHasher hs;
  hs.add(static_cast<std::uint64_t>(op.kind) << 16 | static_cast<std::uint64_t>(op.family) << 8 | op.num_inputs);
  hs.add_dtype(op.dtype);
  for (const ir::TensorIr& t : op.tensors) {
    hs.add_enum(t.status);
    hs.add_dtype(t.dtype);
    hs.add_shape(t.shape);
  }
  for (const ir::ScalarIr& v : op.scalars) hs.add(v.hash_bits());
  for (std::int64_t a : op.attrs) hs.add(static_cast<std::uint64_t>(a));
  return hs.finish();
}

bool equal_but_ids(const ir::Operation& a, const ir::Operation& b) {
  if (a.kind != b.kind || a.family != b.family || a.num_inputs != b.num_inputs || !(a.dtype == b.dtype) ||
      a.tensors.size() != b.tensors.size())
    return false;
  for (std::size_t i = 0; i < a.tensors.size(); ++i) {
    const ir::TensorIr& x = a.tensors[i];
    const ir::TensorIr& y = b.tensors[i];
    if (x.status != y.status || !(x.dtype == y.dtype) || x.shape != y.shape) return false;
  }
  return a.scalars == b.scalars && a.ranges == b.ranges && a.attrs == b.attrs && a.custom_id == b.custom_id;
}

}  // namespace

std::size_t OperationCheckMemo::set_of(const ir::Operation& op) { return shape_hash(op) % kSets; }

Status OperationCheckMemo::check(const ir::Operation& op) {
  const std::uint64_t hash = shape_hash(op);
  std::array<Slot, kWays>& set = sets_[hash % kSets];
  ++tick_;
  for (Slot& slot : set) {
    if (!slot.used || slot.hash != hash || !equal_but_ids(slot.op, op)) continue;
    // The id rules of the builders (ir builders' finish): an output is none of the inputs, and
    // the outputs differ (MaxDimWithIndices has two).
    const auto outs = op.outputs();
    for (std::size_t i = 0; i < outs.size(); ++i) {
      for (const ir::TensorIr& in : op.inputs())
        if (in.id == outs[i].id)
          return make_error(ErrorCode::Invalid,
                            fmt::format("{}: output id {} is also an input", op.kind_name(), outs[i].id.value()));
      for (std::size_t j = 0; j < i; ++j)
        if (outs[j].id == outs[i].id)
          return make_error(ErrorCode::Invalid,
                            fmt::format("{}: output id {} is used twice", op.kind_name(), outs[i].id.value()));
    }
    slot.last_use = tick_;
    ++hits_;
    return Status::Ok();
  }
  KILN_RETURN_IF_ERROR(check_client_operation(op));
  // An unused way, else the least recently used one.
  Slot* victim = &set[0];
  for (Slot& slot : set) {
    if (!slot.used) {
      victim = &slot;
      break;
    }
    if (slot.last_use < victim->last_use) victim = &slot;
  }
  victim->op = op;
  for (ir::TensorIr& t : victim->op.tensors) t.id = ir::TensorId(0);
  victim->hash = hash;
  victim->last_use = tick_;
  victim->used = true;
  return Status::Ok();
}

}  // namespace kiln::ipc
