// IR builders (docs/spec/ir.md §6): shape and dtype inference plus validation, one builder per signature.
#include "kiln/ir/builders.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

namespace kiln::ir::build {
namespace {

// What a kind's output dtype is: the operand's (or an explicit one), the bool dtype
// (kComparison) or the index dtype (kIndexOutput). Decides which builder variant applies.
enum class OutKind { Plain, Bool, Index };

// The op being built, for checks and error messages.
struct Ctx {
  Family family;
  OpKind kind;

  bool kind_known() const { return static_cast<std::size_t>(kind) < static_cast<std::size_t>(kNumOpKinds); }
  bool family_known() const { return static_cast<int>(family) < kNumFamilies; }

  // "NumericFloat::Add", as Operation::kind_name prints it.
  std::string name() const {
    if (!kind_known()) return fmt::format("OpKind({})", static_cast<unsigned>(kind));
    if (!family_known()) return fmt::format("Family({})::{}", static_cast<unsigned>(family), op_info(kind).variant);
    Operation probe;
    probe.kind = kind;
    probe.family = family;
    return probe.kind_name();
  }
  Error error(ErrorCode code, std::string_view what) const {
    return make_error(code, fmt::format("{}: {}", name(), what));
  }
  // Prefixes an error from the shape rules with the op's name, keeping its code.
  Error wrap(const Error& e) const { return error(e.code, e.message); }
  template <class T>
  Result<T> wrap(Result<T> r) const {
    if (r.ok()) return r;
    return wrap(r.error());
  }
};

std::string dims(std::span<const std::uint64_t> v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += fmt::format("{}{}", i ? "," : "", v[i]);
  return s + "]";
}

bool is_floatish(DType d) { return d.is_float() || d.is_quantized(); }

// Kind exists, has the builder's signature, its group admits the family, and the builder variant
// matches how the kind's output dtype is decided.
Status check_kind(const Ctx& c, Signature sig, OutKind out_kind) {
  if (!c.kind_known() || !c.family_known()) return c.error(ErrorCode::Invalid, "unknown operation kind or family");
  const OpInfo& info = op_info(c.kind);
  if (info.signature != sig)
    return c.error(ErrorCode::Invalid, fmt::format("has signature {}, not {}", signature_info(info.signature).name,
                                                   signature_info(sig).name));
  if (!group_admits(info.group, c.family))
    return c.error(ErrorCode::Invalid,
                   fmt::format("{} cannot belong to family {}", info.variant, family_name(c.family)));
  const OutKind actual = info.has(kComparison)    ? OutKind::Bool
                         : info.has(kIndexOutput) ? OutKind::Index
                                                  : OutKind::Plain;
  if (actual != out_kind) {
    static constexpr const char* kWhat[] = {"the operand's dtype", "the bool dtype", "the index dtype"};
    static constexpr const char* kBuilder[] = {"a plain builder", "a *_comparison / *_bool builder",
                                               "reduce_dim_arg / sort_arg"};
    return c.error(ErrorCode::Invalid,
                   fmt::format("outputs {}, this builder outputs {}: build it with {}", kWhat[static_cast<int>(actual)],
                               kWhat[static_cast<int>(out_kind)], kBuilder[static_cast<int>(actual)]));
  }
  return Status::Ok();
}

// The family fits the operand dtype (docs/spec/ir.md §5.1: the variant says which tensor kind it applies to).
Status check_operand(const Ctx& c, DType d) {
  bool fits = false;
  switch (op_info(c.kind).group) {
    case OpGroup::Base: fits = base_family_for(d) == c.family; break;
    case OpGroup::Numeric: fits = numeric_family_for(d) == c.family; break;
    case OpGroup::Float: fits = is_floatish(d); break;
    case OpGroup::Int: fits = d.is_integral(); break;
    case OpGroup::Bool: fits = d.is_bool(); break;
    case OpGroup::Module: fits = d.is_float(); break;
    case OpGroup::Activation: fits = is_floatish(d); break;  // Burn's ActivationOps take float tensors
    default: fits = true; break;
  }
  if (!fits)
    return c.error(ErrorCode::DTypeMismatch,
                   fmt::format("family {} does not apply to operand dtype {}", family_name(c.family), d.name()));
  return Status::Ok();
}

// same(a, b) of docs/spec/ir.md §6.2.
Status check_same(const Ctx& c, const TensorIr& a, const char* a_name, const TensorIr& b, const char* b_name) {
  if (!(a.dtype == b.dtype))
    return c.error(ErrorCode::DTypeMismatch,
                   fmt::format("dtypes differ: {} {} vs {} {}", a_name, a.dtype.name(), b_name, b.dtype.name()));
  return Status::Ok();
}

Status check_bool_dtype(const Ctx& c, DType d, const char* what) {
  if (!d.is_bool())
    return c.error(ErrorCode::DTypeMismatch, fmt::format("{} must be a bool dtype, got {}", what, d.name()));
  return Status::Ok();
}

Status check_index_dtype(const Ctx& c, DType d, const char* what) {
  if (!d.is_integral())
    return c.error(ErrorCode::DTypeMismatch, fmt::format("{} must be an integer dtype, got {}", what, d.name()));
  return Status::Ok();
}

Status check_axis(const Ctx& c, std::uint64_t axis, const Shape& s, const char* what = "dim") {
  if (axis >= s.size())
    return c.error(ErrorCode::OutOfBounds,
                   fmt::format("{} {} out of bounds for rank {} ({})", what, axis, s.size(), shape_to_string(s)));
  return Status::Ok();
}

Status check_rank(const Ctx& c, const TensorIr& t, std::size_t rank, const char* what) {
  if (t.shape.size() != rank)
    return c.error(ErrorCode::RankMismatch,
                   fmt::format("{} must have rank {}, has rank {} ({})", what, rank, t.shape.size(), t.to_string()));
  return Status::Ok();
}

// GatherNd / ScatterNd: indices [..., k] of rank >= 1 whose k-tuples address the first k dims of data.
Status check_nd_indices(const Ctx& c, const TensorIr& data, const TensorIr& indices) {
  const Shape& is = indices.shape;
  if (is.empty())
    return c.error(ErrorCode::RankMismatch, fmt::format("indices {} must have rank >= 1", indices.to_string()));
  if (is.back() > data.shape.size())
    return c.error(ErrorCode::OutOfBounds,
                   fmt::format("indices {} address {} dims of the rank-{} data {}", shape_to_string(is), is.back(),
                               data.shape.size(), shape_to_string(data.shape)));
  return Status::Ok();
}

Operation new_op(const Ctx& c, DType carried) {
  Operation op;
  op.kind = c.kind;
  op.family = c.family;
  if (family_carries_dtype(c.family)) op.dtype = carried;
  return op;
}

std::int64_t attr(std::uint64_t v) { return static_cast<std::int64_t>(v); }

std::int64_t double_bits(double v) {
  std::int64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return bits;
}

// Checks shared by every builder once the op is assembled: inputs are live occurrences (never
// NotInit), outputs have fresh ids (distinct from the inputs and from each other).
Result<Operation> finish(const Ctx& c, Operation&& op) {  // by reference: an Operation move is ~600 B
  for (const TensorIr& t : op.inputs())
    if (t.status == TensorStatus::NotInit)
      return c.error(ErrorCode::Invalid, fmt::format("input {} has status NotInit", t.to_string()));
  const auto outs = op.outputs();
  for (std::size_t i = 0; i < outs.size(); ++i) {
    for (const TensorIr& t : op.inputs())
      if (t.id == outs[i].id)
        return c.error(ErrorCode::Invalid, fmt::format("output id {} is also an input", outs[i].id.value()));
    for (std::size_t j = 0; j < i; ++j)
      if (outs[j].id == outs[i].id)
        return c.error(ErrorCode::Invalid, fmt::format("output id {} is used twice", outs[i].id.value()));
  }
  assert(op.validate().ok());
  return op;
}

// Single-input, single-output op.
Result<Operation> one_to_one(const Ctx& c, const TensorIr& input, Shape shape, DType out_dtype, TensorId out,
                             AttrList attrs = {}) {
  Operation op = new_op(c, input.dtype);
  op.num_inputs = 1;
  op.tensors.push_back(input);
  op.tensors.push_back(TensorIr::uninit(out, std::move(shape), out_dtype));
  op.attrs = std::move(attrs);
  return finish(c, std::move(op));
}

// docs/spec/ir.md §6.2: permuting a QFloat tensor permutes the block shape like the tensor (the block is
// right-aligned to the tensor's dims, missing leading entries are 1) and moves the packed dim
// with its axis. `axes` is a valid permutation of 0..rank-1.
Result<DType> permute_dtype(const Ctx& c, DType d, std::span<const std::uint64_t> axes) {
  if (!d.is_quantized()) return d;
  QuantScheme s = d.scheme();
  const std::size_t rank = axes.size();
  if (s.store != QuantStoreKind::Native) {
    if (s.packed_dim >= rank)
      return c.error(ErrorCode::Invalid,
                     fmt::format("packed dim {} out of bounds for rank {} ({})", s.packed_dim, rank, d.name()));
    const std::uint64_t packed_axis = rank - s.packed_dim - 1;
    const auto it = std::find(axes.begin(), axes.end(), packed_axis);
    const std::size_t new_pos = static_cast<std::size_t>(it - axes.begin());
    s.packed_dim = static_cast<std::uint8_t>(rank - new_pos - 1);
  }
  if (s.block_rank > 0) {
    boost::container::small_vector<std::uint64_t, 6> full(rank, 1);
    for (std::size_t j = 0; j < s.block_rank; ++j) {
      const std::size_t from_back = s.block_rank - j;  // 1 = last dim
      if (from_back > rank) {
        if (s.block[j] != 1)
          return c.error(ErrorCode::Invalid, fmt::format("block of rank {} does not fit a rank-{} tensor ({})",
                                                         s.block_rank, rank, d.name()));
        continue;
      }
      full[rank - from_back] = s.block[j];
    }
    boost::container::small_vector<std::uint64_t, 6> moved(rank);
    for (std::size_t i = 0; i < rank; ++i) moved[i] = full[axes[i]];
    std::size_t leading_ones = 0;
    while (leading_ones < rank && moved[leading_ones] == 1) ++leading_ones;
    const std::size_t needed = rank - leading_ones;
    const std::size_t new_rank = std::max<std::size_t>(std::min<std::size_t>(s.block_rank, rank), needed);
    if (new_rank > s.block.size())
      return c.error(ErrorCode::Unsupported, fmt::format("permuted block needs {} dims, a scheme holds at most {} ({})",
                                                         new_rank, s.block.size(), d.name()));
    s.block = {};
    for (std::size_t j = 0; j < new_rank; ++j) s.block[j] = static_cast<std::uint16_t>(moved[rank - new_rank + j]);
    s.block_rank = static_cast<std::uint8_t>(new_rank);
  }
  return DType::qfloat(s);
}

Status check_spatial_options(const Ctx& c, std::uint64_t groups) {
  if (groups == 0) return c.error(ErrorCode::Invalid, "groups must be at least 1");
  return Status::Ok();
}

Status check_bias(const Ctx& c, const std::optional<TensorIr>& bias, std::uint64_t channels) {
  if (!bias) return Status::Ok();
  if (bias->shape.size() != 1 || bias->shape[0] != channels)
    return c.error(ErrorCode::IncompatibleShapes,
                   fmt::format("bias {} must have shape [{}]", bias->to_string(), channels));
  return Status::Ok();
}

}  // namespace

// ---- Elementwise

namespace {
Result<Operation> unary_impl(const Ctx& c, OutKind kind, const TensorIr& input, DType out_dtype, TensorId out) {
  KILN_RETURN_IF_ERROR(check_kind(c, Signature::Unary, kind));
  KILN_RETURN_IF_ERROR(check_operand(c, input.dtype));
  return one_to_one(c, input, input.shape, out_dtype, out);
}

Result<Operation> binary_impl(const Ctx& c, OutKind kind, const TensorIr& lhs, const TensorIr& rhs,
                              std::optional<DType> out_dtype, TensorId out) {
  KILN_RETURN_IF_ERROR(check_kind(c, Signature::Binary, kind));
  KILN_RETURN_IF_ERROR(check_operand(c, lhs.dtype));
  KILN_RETURN_IF_ERROR(check_same(c, lhs, "lhs", rhs, "rhs"));
  KILN_ASSIGN_OR_RETURN(Shape shape, c.wrap(shape::broadcast(lhs.shape, rhs.shape)));
  Operation op = new_op(c, lhs.dtype);
  op.num_inputs = 2;
  op.tensors.push_back(lhs);
  op.tensors.push_back(rhs);
  op.tensors.push_back(TensorIr::uninit(out, std::move(shape), out_dtype.value_or(lhs.dtype)));
  return finish(c, std::move(op));
}

Result<Operation> scalar_impl(const Ctx& c, OutKind kind, const TensorIr& lhs, ScalarIr rhs, DType out_dtype,
                              TensorId out) {
  KILN_RETURN_IF_ERROR(check_kind(c, Signature::Scalar, kind));
  KILN_RETURN_IF_ERROR(check_operand(c, lhs.dtype));
  Operation op = new_op(c, lhs.dtype);
  op.num_inputs = 1;
  op.tensors.push_back(lhs);
  op.tensors.push_back(TensorIr::uninit(out, lhs.shape, out_dtype));
  op.scalars.push_back(rhs);
  return finish(c, std::move(op));
}
}  // namespace

Result<Operation> unary(Family family, OpKind kind, const TensorIr& input, TensorId out) {
  return unary_impl({family, kind}, OutKind::Plain, input, input.dtype, out);
}

Result<Operation> unary_comparison(Family family, OpKind kind, const TensorIr& input, DType bool_dtype, TensorId out) {
  const Ctx c{family, kind};
  KILN_RETURN_IF_ERROR(check_bool_dtype(c, bool_dtype, "comparison output dtype"));
  return unary_impl(c, OutKind::Bool, input, bool_dtype, out);
}

Result<Operation> binary(Family family, OpKind kind, const TensorIr& lhs, const TensorIr& rhs, TensorId out) {
  return binary_impl({family, kind}, OutKind::Plain, lhs, rhs, std::nullopt, out);
}

Result<Operation> binary_comparison(Family family, OpKind kind, const TensorIr& lhs, const TensorIr& rhs,
                                    DType bool_dtype, TensorId out) {
  const Ctx c{family, kind};
  KILN_RETURN_IF_ERROR(check_bool_dtype(c, bool_dtype, "comparison output dtype"));
  return binary_impl(c, OutKind::Bool, lhs, rhs, bool_dtype, out);
}

Result<Operation> scalar(Family family, OpKind kind, const TensorIr& lhs, ScalarIr rhs, TensorId out) {
  return scalar_impl({family, kind}, OutKind::Plain, lhs, rhs, lhs.dtype, out);
}

Result<Operation> scalar_comparison(Family family, OpKind kind, const TensorIr& lhs, ScalarIr rhs, DType bool_dtype,
                                    TensorId out) {
  const Ctx c{family, kind};
  KILN_RETURN_IF_ERROR(check_bool_dtype(c, bool_dtype, "comparison output dtype"));
  return scalar_impl(c, OutKind::Bool, lhs, rhs, bool_dtype, out);
}

Result<Operation> cast(Family family, OpKind kind, const TensorIr& input, DType target, TensorId out) {
  const Ctx c{family, kind};
  KILN_RETURN_IF_ERROR(check_kind(c, Signature::Cast, OutKind::Plain));
  KILN_RETURN_IF_ERROR(check_operand(c, input.dtype));
  if (kind == OpKind::Float_Dequantize && !input.dtype.is_quantized())
    return c.error(ErrorCode::DTypeMismatch,
                   fmt::format("input {} must be quantized (a QFloat dtype)", input.to_string()));
  // What the target must be: a cast stays within its kind of tensor, Into* change it.
  enum class Target { Float, Integer, Bool } needed = Target::Float;
  switch (kind) {
    case OpKind::Base_Cast:
      needed = family == Family::BaseFloat ? Target::Float : family == Family::BaseInt ? Target::Integer : Target::Bool;
      break;
    case OpKind::Float_IntoInt:
    case OpKind::Bool_IntoInt: needed = Target::Integer; break;
    default: needed = Target::Float; break;  // Int IntoFloat, Bool IntoFloat
  }
  const bool ok = needed == Target::Float     ? target.is_float()
                  : needed == Target::Integer ? target.is_integral()
                                              : target.is_bool();
  if (!ok) {
    static constexpr const char* kNeeded[] = {"a float dtype", "an integer dtype", "a bool dtype"};
    return c.error(ErrorCode::DTypeMismatch,
                   fmt::format("cannot cast {} to {}: the target must be {}", input.dtype.name(), target.name(),
                               kNeeded[static_cast<int>(needed)]));
  }
  return one_to_one(c, input, input.shape, target, out);
}

Result<Operation> clamp(Family family, OpKind kind, const TensorIr& tensor, ScalarIr min, ScalarIr max, TensorId out) {
  const Ctx c{family, kind};
  KILN_RETURN_IF_ERROR(check_kind(c, Signature::Clamp, OutKind::Plain));
  KILN_RETURN_IF_ERROR(check_operand(c, tensor.dtype));
  Operation op = new_op(c, tensor.dtype);
  op.num_inputs = 1;
  op.tensors.push_back(tensor);
  op.tensors.push_back(TensorIr::uninit(out, tensor.shape, tensor.dtype));
  op.scalars.push_back(min);
  op.scalars.push_back(max);
  return finish(c, std::move(op));
}

Result<Operation> hard_sigmoid(const TensorIr& tensor, ScalarIr alpha, ScalarIr beta, TensorId out) {
  const Ctx c{Family::Activation, OpKind::Activation_HardSigmoid};
  KILN_RETURN_IF_ERROR(check_operand(c, tensor.dtype));
  Operation op = new_op(c, tensor.dtype);
  op.num_inputs = 1;
  op.tensors.push_back(tensor);
  op.tensors.push_back(TensorIr::uninit(out, tensor.shape, tensor.dtype));
  op.scalars.push_back(alpha);
  op.scalars.push_back(beta);
  return finish(c, std::move(op));
}

Result<Operation> mask_where(Family family, OpKind kind, const TensorIr& tensor, const TensorIr& mask,
                             const TensorIr& value, TensorId out) {
  const Ctx c{family, kind};
  KILN_RETURN_IF_ERROR(check_kind(c, Signature::MaskWhere, OutKind::Plain));
  KILN_RETURN_IF_ERROR(check_operand(c, tensor.dtype));
  KILN_RETURN_IF_ERROR(check_bool_dtype(c, mask.dtype, "mask"));
  KILN_RETURN_IF_ERROR(check_same(c, tensor, "tensor", value, "value"));
  const Shape shapes[] = {tensor.shape, mask.shape, value.shape};
  KILN_ASSIGN_OR_RETURN(Shape shape, c.wrap(shape::broadcast_many(shapes)));
  Operation op = new_op(c, tensor.dtype);
  op.num_inputs = 3;
  op.tensors.push_back(tensor);
  op.tensors.push_back(mask);
  op.tensors.push_back(value);
  op.tensors.push_back(TensorIr::uninit(out, std::move(shape), tensor.dtype));
  return finish(c, std::move(op));
}

Result<Operation> mask_fill(Family family, OpKind kind, const TensorIr& tensor, const TensorIr& mask, ScalarIr value,
                            TensorId out) {
  const Ctx c{family, kind};
  KILN_RETURN_IF_ERROR(check_kind(c, Signature::MaskFill, OutKind::Plain));
  KILN_RETURN_IF_ERROR(check_operand(c, tensor.dtype));
  KILN_RETURN_IF_ERROR(check_bool_dtype(c, mask.dtype, "mask"));
  KILN_ASSIGN_OR_RETURN(Shape shape, c.wrap(shape::broadcast(tensor.shape, mask.shape)));
  Operation op = new_op(c, tensor.dtype);
  op.num_inputs = 2;
  op.tensors.push_back(tensor);
  op.tensors.push_back(mask);
  op.tensors.push_back(TensorIr::uninit(out, std::move(shape), tensor.dtype));
  op.scalars.push_back(value);
  return finish(c, std::move(op));
}

// ---- Quantization (docs/spec/ir.md §5.6, §6.3)

Result<Operation> quantize(const TensorIr& tensor, const TensorIr& scales, const std::optional<TensorIr>& global,
                           const QuantScheme& scheme, TensorId out) {
  const Ctx c{Family::Float, OpKind::Float_Quantize};
  if (!tensor.dtype.is_float())
    return c.error(ErrorCode::DTypeMismatch,
                   fmt::format("tensor {} must have a float dtype (not a quantized one)", tensor.to_string()));
  KILN_ASSIGN_OR_RETURN(shape::QuantGeometry g, c.wrap(shape::quant_geometry(tensor.shape, scheme)));
  if (!scales.dtype.is_float())
    return c.error(ErrorCode::DTypeMismatch, fmt::format("scales {} must have a float dtype", scales.to_string()));
  if (scales.shape != g.scales)
    return c.error(ErrorCode::IncompatibleShapes,
                   fmt::format("scales {} must have shape {} (one per block of tensor {} under {})", scales.to_string(),
                               shape_to_string(g.scales), shape_to_string(tensor.shape), scheme.to_string()));
  if (global && (!global->dtype.is_float() || global->shape != Shape{1}))
    return c.error(ErrorCode::IncompatibleShapes, fmt::format("global {} must be a float [1]", global->to_string()));
  Operation op = new_op(c, tensor.dtype);
  op.tensors = {tensor, scales};
  if (global) op.tensors.push_back(*global);
  op.num_inputs = static_cast<std::uint8_t>(op.tensors.size());
  op.tensors.push_back(TensorIr::uninit(out, tensor.shape, DType::qfloat(scheme)));
  return finish(c, std::move(op));
}

Result<Operation> dequantize(const TensorIr& input, DType out_dtype, TensorId out) {
  return cast(Family::Float, OpKind::Float_Dequantize, input, out_dtype, out);
}

// ---- Matmul

namespace {
Result<Operation> matmul_impl(const Ctx& c, const TensorIr& lhs, const TensorIr& rhs, std::optional<DType> out_dtype,
                              TensorId out) {
  KILN_RETURN_IF_ERROR(check_kind(c, Signature::Matmul, OutKind::Plain));
  KILN_RETURN_IF_ERROR(check_operand(c, lhs.dtype));
  // mixed(lhs, rhs): any float-or-quantized pair, otherwise equal.
  const bool mixed_ok = (is_floatish(lhs.dtype) && is_floatish(rhs.dtype)) || lhs.dtype == rhs.dtype;
  if (!mixed_ok)
    return c.error(ErrorCode::DTypeMismatch,
                   fmt::format("dtypes not compatible: lhs {} vs rhs {}", lhs.dtype.name(), rhs.dtype.name()));
  if (out_dtype && !(c.family == Family::Float ? is_floatish(*out_dtype) : out_dtype->is_integral()))
    return c.error(ErrorCode::DTypeMismatch,
                   fmt::format("output dtype {} does not fit family {}", out_dtype->name(), family_name(c.family)));
  KILN_ASSIGN_OR_RETURN(Shape shape, c.wrap(shape::matmul_output(lhs.shape, rhs.shape)));
  Operation op = new_op(c, lhs.dtype);
  op.num_inputs = 2;
  op.tensors.push_back(lhs);
  op.tensors.push_back(rhs);
  op.tensors.push_back(TensorIr::uninit(out, std::move(shape), out_dtype.value_or(lhs.dtype)));
  return finish(c, std::move(op));
}
}  // namespace

Result<Operation> matmul(Family family, OpKind kind, const TensorIr& lhs, const TensorIr& rhs, TensorId out) {
  return matmul_impl({family, kind}, lhs, rhs, std::nullopt, out);
}

Result<Operation> matmul_mixed(Family family, OpKind kind, const TensorIr& lhs, const TensorIr& rhs, DType out_dtype,
                               TensorId out) {
  return matmul_impl({family, kind}, lhs, rhs, out_dtype, out);
}

Result<Operation> cross(Family family, OpKind kind, const TensorIr& lhs, const TensorIr& rhs, std::uint64_t dim,
                        TensorId out) {
  const Ctx c{family, kind};
  KILN_RETURN_IF_ERROR(check_kind(c, Signature::Cross, OutKind::Plain));
  KILN_RETURN_IF_ERROR(check_operand(c, lhs.dtype));
  KILN_RETURN_IF_ERROR(check_same(c, lhs, "lhs", rhs, "rhs"));
  KILN_ASSIGN_OR_RETURN(Shape shape, c.wrap(shape::broadcast(lhs.shape, rhs.shape)));
  KILN_RETURN_IF_ERROR(check_axis(c, dim, shape));
  // The cross product is of 3-vectors: the dim itself is never broadcast (torch.linalg.cross).
  if (lhs.shape[dim] != 3 || rhs.shape[dim] != 3)
    return c.error(ErrorCode::IncompatibleShapes, fmt::format("dim {} must have size 3 in both operands ({} x {})", dim,
                                                              shape_to_string(lhs.shape), shape_to_string(rhs.shape)));
  Operation op = new_op(c, lhs.dtype);
  op.num_inputs = 2;
  op.tensors.push_back(lhs);
  op.tensors.push_back(rhs);
  op.tensors.push_back(TensorIr::uninit(out, std::move(shape), lhs.dtype));
  op.attrs.push_back(attr(dim));
  return finish(c, std::move(op));
}

// ---- Reductions and scans

namespace {
Result<Operation> reduce_impl(const Ctx& c, OutKind kind, const TensorIr& input, DType out_dtype, TensorId out) {
  KILN_RETURN_IF_ERROR(check_kind(c, Signature::Reduce, kind));
  KILN_RETURN_IF_ERROR(check_operand(c, input.dtype));
  return one_to_one(c, input, Shape{1}, out_dtype, out);  // rank 1, never rank 0 (docs/spec/ir.md §5.11)
}

Result<Operation> reduce_dim_impl(const Ctx& c, OutKind kind, const TensorIr& input, std::uint64_t axis,
                                  std::uint64_t accumulator_len, DType out_dtype, TensorId out) {
  KILN_RETURN_IF_ERROR(check_kind(c, Signature::ReduceDim, kind));
  KILN_RETURN_IF_ERROR(check_operand(c, input.dtype));
  KILN_RETURN_IF_ERROR(check_axis(c, axis, input.shape, "axis"));
  if (accumulator_len == 0) return c.error(ErrorCode::Invalid, "accumulator_len must be at least 1");
  // TopK / ArgTopK: accumulator_len is k (docs/spec/ir.md §5.5), at most the axis' size.
  if ((c.kind == OpKind::Numeric_TopK || c.kind == OpKind::Numeric_ArgTopK) && accumulator_len > input.shape[axis])
    return c.error(ErrorCode::Invalid, fmt::format("k {} exceeds axis {} of size {} ({})", accumulator_len, axis,
                                                   input.shape[axis], shape_to_string(input.shape)));
  Shape shape = input.shape;
  shape[axis] = accumulator_len;
  return one_to_one(c, input, std::move(shape), out_dtype, out, {attr(axis), attr(accumulator_len)});
}

Result<Operation> with_indices(const Ctx& c, const TensorIr& tensor, std::uint64_t dim, std::uint64_t size,
                               DType index_dtype, TensorId out, TensorId out_indices, AttrList attrs) {
  Shape shape = tensor.shape;
  shape[dim] = size;
  Operation op = new_op(c, tensor.dtype);
  op.num_inputs = 1;
  op.tensors.push_back(tensor);
  op.tensors.push_back(TensorIr::uninit(out, shape, tensor.dtype));
  op.tensors.push_back(TensorIr::uninit(out_indices, std::move(shape), index_dtype));
  op.attrs = std::move(attrs);
  return finish(c, std::move(op));
}
}  // namespace

Result<Operation> reduce(Family family, OpKind kind, const TensorIr& input, TensorId out) {
  return reduce_impl({family, kind}, OutKind::Plain, input, input.dtype, out);
}

Result<Operation> reduce_bool(Family family, OpKind kind, const TensorIr& input, DType bool_dtype, TensorId out) {
  const Ctx c{family, kind};
  KILN_RETURN_IF_ERROR(check_bool_dtype(c, bool_dtype, "output dtype"));
  return reduce_impl(c, OutKind::Bool, input, bool_dtype, out);
}

Result<Operation> reduce_dim(Family family, OpKind kind, const TensorIr& input, std::uint64_t axis,
                             std::uint64_t accumulator_len, TensorId out) {
  return reduce_dim_impl({family, kind}, OutKind::Plain, input, axis, accumulator_len, input.dtype, out);
}

Result<Operation> reduce_dim_bool(Family family, OpKind kind, const TensorIr& input, std::uint64_t axis,
                                  std::uint64_t accumulator_len, DType bool_dtype, TensorId out) {
  const Ctx c{family, kind};
  KILN_RETURN_IF_ERROR(check_bool_dtype(c, bool_dtype, "output dtype"));
  return reduce_dim_impl(c, OutKind::Bool, input, axis, accumulator_len, bool_dtype, out);
}

Result<Operation> reduce_dim_arg(Family family, OpKind kind, const TensorIr& input, std::uint64_t axis,
                                 std::uint64_t accumulator_len, DType index_dtype, TensorId out) {
  const Ctx c{family, kind};
  KILN_RETURN_IF_ERROR(check_index_dtype(c, index_dtype, "index dtype"));
  return reduce_dim_impl(c, OutKind::Index, input, axis, accumulator_len, index_dtype, out);
}

Result<Operation> dim(Family family, OpKind kind, const TensorIr& input, std::uint64_t axis, TensorId out) {
  const Ctx c{family, kind};
  KILN_RETURN_IF_ERROR(check_kind(c, Signature::Dim, OutKind::Plain));
  KILN_RETURN_IF_ERROR(check_operand(c, input.dtype));
  KILN_RETURN_IF_ERROR(check_axis(c, axis, input.shape, "axis"));
  return one_to_one(c, input, input.shape, input.dtype, out, {attr(axis)});
}

Result<Operation> reduce_dim_with_indices(Family family, OpKind kind, const TensorIr& tensor, std::uint64_t dim,
                                          DType index_dtype, TensorId out, TensorId out_indices) {
  const Ctx c{family, kind};
  KILN_RETURN_IF_ERROR(check_kind(c, Signature::ReduceDimWithIndices, OutKind::Plain));
  KILN_RETURN_IF_ERROR(check_operand(c, tensor.dtype));
  KILN_RETURN_IF_ERROR(check_axis(c, dim, tensor.shape));
  KILN_RETURN_IF_ERROR(check_index_dtype(c, index_dtype, "index dtype"));
  return with_indices(c, tensor, dim, 1, index_dtype, out, out_indices, {attr(dim)});
}

Result<Operation> topk_with_indices(Family family, OpKind kind, const TensorIr& tensor, std::uint64_t dim,
                                    std::uint64_t k, DType index_dtype, TensorId out, TensorId out_indices) {
  const Ctx c{family, kind};
  KILN_RETURN_IF_ERROR(check_kind(c, Signature::TopKWithIndices, OutKind::Plain));
  KILN_RETURN_IF_ERROR(check_operand(c, tensor.dtype));
  KILN_RETURN_IF_ERROR(check_axis(c, dim, tensor.shape));
  KILN_RETURN_IF_ERROR(check_index_dtype(c, index_dtype, "index dtype"));
  if (k > tensor.shape[dim])
    return c.error(ErrorCode::Invalid, fmt::format("k {} exceeds dim {} of size {} ({})", k, dim, tensor.shape[dim],
                                                   shape_to_string(tensor.shape)));
  return with_indices(c, tensor, dim, k, index_dtype, out, out_indices, {attr(dim), attr(k)});
}

// ---- Sorting along a dim: attrs [dim, descending] (docs/spec/ir.md §5.5, §6.3)

namespace {
Result<Operation> sort_impl(const Ctx& c, OutKind kind, const TensorIr& input, std::uint64_t dim, bool descending,
                            DType out_dtype, TensorId out) {
  KILN_RETURN_IF_ERROR(check_kind(c, Signature::Sort, kind));
  KILN_RETURN_IF_ERROR(check_operand(c, input.dtype));
  KILN_RETURN_IF_ERROR(check_axis(c, dim, input.shape));
  return one_to_one(c, input, input.shape, out_dtype, out, {attr(dim), descending ? 1 : 0});
}
}  // namespace

Result<Operation> sort(Family family, OpKind kind, const TensorIr& input, std::uint64_t dim, bool descending,
                       TensorId out) {
  return sort_impl({family, kind}, OutKind::Plain, input, dim, descending, input.dtype, out);
}

Result<Operation> sort_arg(Family family, OpKind kind, const TensorIr& input, std::uint64_t dim, bool descending,
                           DType index_dtype, TensorId out) {
  const Ctx c{family, kind};
  KILN_RETURN_IF_ERROR(check_index_dtype(c, index_dtype, "index dtype"));
  return sort_impl(c, OutKind::Index, input, dim, descending, index_dtype, out);
}

Result<Operation> sort_with_indices(Family family, OpKind kind, const TensorIr& input, std::uint64_t dim,
                                    bool descending, DType index_dtype, TensorId out, TensorId out_indices) {
  const Ctx c{family, kind};
  KILN_RETURN_IF_ERROR(check_kind(c, Signature::SortWithIndices, OutKind::Plain));
  KILN_RETURN_IF_ERROR(check_operand(c, input.dtype));
  KILN_RETURN_IF_ERROR(check_axis(c, dim, input.shape));
  KILN_RETURN_IF_ERROR(check_index_dtype(c, index_dtype, "index dtype"));
  return with_indices(c, input, dim, input.shape[dim], index_dtype, out, out_indices, {attr(dim), descending ? 1 : 0});
}

// ---- Layout

Result<Operation> shape_op(Family family, OpKind kind, const TensorIr& input, std::span<const std::int64_t> args,
                           TensorId out) {
  const Ctx c{family, kind};
  KILN_RETURN_IF_ERROR(check_kind(c, Signature::ShapeOp, OutKind::Plain));
  KILN_RETURN_IF_ERROR(check_operand(c, input.dtype));
  Shape shape;
  if (kind == OpKind::Base_Reshape) {
    KILN_ASSIGN_OR_RETURN(shape, c.wrap(shape::reshape(input.shape, args)));
  } else {
    Shape target;
    for (std::int64_t a : args) {
      if (a < 0)
        return c.error(ErrorCode::Invalid,
                       fmt::format("negative target dim {} (expand of {})", a, shape_to_string(input.shape)));
      target.push_back(static_cast<std::uint64_t>(a));
    }
    KILN_ASSIGN_OR_RETURN(shape, c.wrap(shape::expand(input.shape, target)));
  }
  return one_to_one(c, input, std::move(shape), input.dtype, out);
}

Result<Operation> swap_dims(Family family, OpKind kind, const TensorIr& input, std::uint64_t dim1, std::uint64_t dim2,
                            TensorId out) {
  const Ctx c{family, kind};
  KILN_RETURN_IF_ERROR(check_kind(c, Signature::SwapDims, OutKind::Plain));
  KILN_RETURN_IF_ERROR(check_operand(c, input.dtype));
  KILN_ASSIGN_OR_RETURN(Shape shape, c.wrap(shape::swapped(input.shape, dim1, dim2)));
  boost::container::small_vector<std::uint64_t, 6> axes(input.shape.size());
  for (std::size_t i = 0; i < axes.size(); ++i) axes[i] = i;
  std::swap(axes[dim1], axes[dim2]);
  KILN_ASSIGN_OR_RETURN(DType dtype,
                        permute_dtype(c, input.dtype, std::span<const std::uint64_t>(axes.data(), axes.size())));
  return one_to_one(c, input, std::move(shape), dtype, out, {attr(dim1), attr(dim2)});
}

Result<Operation> permute(Family family, OpKind kind, const TensorIr& input, std::span<const std::uint64_t> axes,
                          TensorId out) {
  const Ctx c{family, kind};
  KILN_RETURN_IF_ERROR(check_kind(c, Signature::Permute, OutKind::Plain));
  KILN_RETURN_IF_ERROR(check_operand(c, input.dtype));
  KILN_ASSIGN_OR_RETURN(Shape shape, c.wrap(shape::permuted(input.shape, axes)));
  KILN_ASSIGN_OR_RETURN(DType dtype, permute_dtype(c, input.dtype, axes));
  AttrList attrs;
  for (std::uint64_t a : axes) attrs.push_back(attr(a));
  return one_to_one(c, input, std::move(shape), dtype, out, std::move(attrs));
}

Result<Operation> flip(Family family, OpKind kind, const TensorIr& input, std::span<const std::uint64_t> axes,
                       TensorId out) {
  const Ctx c{family, kind};
  KILN_RETURN_IF_ERROR(check_kind(c, Signature::Flip, OutKind::Plain));
  KILN_RETURN_IF_ERROR(check_operand(c, input.dtype));
  AttrList attrs;
  for (std::size_t i = 0; i < axes.size(); ++i) {
    KILN_RETURN_IF_ERROR(check_axis(c, axes[i], input.shape, "axis"));
    if (std::find(axes.begin(), axes.begin() + static_cast<std::ptrdiff_t>(i), axes[i]) !=
        axes.begin() + static_cast<std::ptrdiff_t>(i))
      return c.error(ErrorCode::Invalid, fmt::format("axis {} repeated in {}", axes[i], dims(axes)));
    attrs.push_back(attr(axes[i]));
  }
  return one_to_one(c, input, input.shape, input.dtype, out, std::move(attrs));
}

Result<Operation> repeat_dim(Family family, OpKind kind, const TensorIr& tensor, std::uint64_t dim, std::uint64_t times,
                             TensorId out) {
  const Ctx c{family, kind};
  KILN_RETURN_IF_ERROR(check_kind(c, Signature::RepeatDim, OutKind::Plain));
  KILN_RETURN_IF_ERROR(check_operand(c, tensor.dtype));
  KILN_ASSIGN_OR_RETURN(Shape shape, c.wrap(shape::repeat(tensor.shape, dim, times)));
  return one_to_one(c, tensor, std::move(shape), tensor.dtype, out, {attr(dim), attr(times)});
}

Result<Operation> unfold(Family family, OpKind kind, const TensorIr& input, std::uint64_t dim, std::uint64_t size,
                         std::uint64_t step, TensorId out) {
  const Ctx c{family, kind};
  KILN_RETURN_IF_ERROR(check_kind(c, Signature::Unfold, OutKind::Plain));
  KILN_RETURN_IF_ERROR(check_operand(c, input.dtype));
  KILN_RETURN_IF_ERROR(check_axis(c, dim, input.shape));
  if (step == 0) return c.error(ErrorCode::Invalid, "step must be at least 1");
  // Attributes are i64: a larger size or step would not survive the trip (nor the daemon's check).
  constexpr auto kMaxAttr = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
  if (size > kMaxAttr || step > kMaxAttr)
    return c.error(ErrorCode::Invalid, fmt::format("size {} or step {} exceeds the i64 range", size, step));
  Shape shape = input.shape;
  shape[dim] = shape::unfold_windows(input.shape[dim], size, step);
  shape.push_back(size);
  return one_to_one(c, input, std::move(shape), input.dtype, out, {attr(dim), attr(size), attr(step)});
}

Result<Operation> cat(Family family, OpKind kind, std::span<const TensorIr> tensors, std::uint64_t dim, TensorId out) {
  const Ctx c{family, kind};
  KILN_RETURN_IF_ERROR(check_kind(c, Signature::Cat, OutKind::Plain));
  if (tensors.empty()) return c.error(ErrorCode::Invalid, "no tensors to concatenate");
  // num_inputs is a u8 (Operation layout).
  if (tensors.size() > 255)
    return c.error(ErrorCode::Invalid, fmt::format("{} inputs, at most 255 supported", tensors.size()));
  KILN_RETURN_IF_ERROR(check_operand(c, tensors[0].dtype));
  boost::container::small_vector<Shape, 4> shapes;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (!(tensors[i].dtype == tensors[0].dtype))
      return c.error(ErrorCode::DTypeMismatch, fmt::format("dtypes differ: tensor 0 {} vs tensor {} {}",
                                                           tensors[0].dtype.name(), i, tensors[i].dtype.name()));
    shapes.push_back(tensors[i].shape);
  }
  KILN_ASSIGN_OR_RETURN(Shape shape, c.wrap(shape::cat(std::span<const Shape>(shapes.data(), shapes.size()), dim)));
  Operation op = new_op(c, tensors[0].dtype);
  op.num_inputs = static_cast<std::uint8_t>(tensors.size());
  op.tensors.assign(tensors.begin(), tensors.end());
  op.tensors.push_back(TensorIr::uninit(out, std::move(shape), tensors[0].dtype));
  op.attrs.push_back(attr(dim));
  return finish(c, std::move(op));
}

Result<Operation> slice(Family family, OpKind kind, const TensorIr& tensor, std::span<const Slice> ranges,
                        TensorId out) {
  const Ctx c{family, kind};
  KILN_RETURN_IF_ERROR(check_kind(c, Signature::Slice, OutKind::Plain));
  KILN_RETURN_IF_ERROR(check_operand(c, tensor.dtype));
  KILN_ASSIGN_OR_RETURN(Shape shape, c.wrap(shape::slice(tensor.shape, ranges)));
  Operation op = new_op(c, tensor.dtype);
  op.num_inputs = 1;
  op.tensors.push_back(tensor);
  op.tensors.push_back(TensorIr::uninit(out, std::move(shape), tensor.dtype));
  op.ranges.assign(ranges.begin(), ranges.end());
  return finish(c, std::move(op));
}

Result<Operation> slice_assign(Family family, OpKind kind, const TensorIr& tensor, std::span<const Slice> ranges,
                               const TensorIr& value, TensorId out) {
  const Ctx c{family, kind};
  KILN_RETURN_IF_ERROR(check_kind(c, Signature::SliceAssign, OutKind::Plain));
  KILN_RETURN_IF_ERROR(check_operand(c, tensor.dtype));
  KILN_RETURN_IF_ERROR(check_same(c, tensor, "tensor", value, "value"));
  // Range count and steps as for Slice; the value's element count is not checked (docs/spec/ir.md §6.3).
  KILN_RETURN_IF_ERROR(c.wrap(shape::slice(tensor.shape, ranges)).status());
  Operation op = new_op(c, tensor.dtype);
  op.num_inputs = 2;
  op.tensors.push_back(tensor);
  op.tensors.push_back(value);
  op.tensors.push_back(TensorIr::uninit(out, tensor.shape, tensor.dtype));
  op.ranges.assign(ranges.begin(), ranges.end());
  return finish(c, std::move(op));
}

Result<Operation> pad(Family family, OpKind kind, const TensorIr& input, std::span<const PadPair> padding, PadMode mode,
                      std::optional<ScalarIr> constant, TensorId out) {
  const Ctx c{family, kind};
  KILN_RETURN_IF_ERROR(check_kind(c, Signature::Pad, OutKind::Plain));
  KILN_RETURN_IF_ERROR(check_operand(c, input.dtype));
  const Shape& in = input.shape;
  if (padding.size() > in.size())
    return c.error(ErrorCode::RankMismatch,
                   fmt::format("{} padding pairs for rank {} ({})", padding.size(), in.size(), shape_to_string(in)));
  if (mode == PadMode::Constant && !constant) return c.error(ErrorCode::Invalid, "constant padding needs a value");
  if (mode != PadMode::Constant && constant)
    return c.error(ErrorCode::Invalid, "only constant padding carries a value");
  if (mode != PadMode::Constant && mode != PadMode::Reflect && mode != PadMode::Edge)
    return c.error(ErrorCode::Invalid, fmt::format("unknown pad mode {}", static_cast<std::int64_t>(mode)));
  Shape shape = in;
  AttrList attrs{static_cast<std::int64_t>(mode)};
  const std::size_t first = in.size() - padding.size();
  for (std::size_t i = 0; i < padding.size(); ++i) {
    const std::size_t d = first + i;
    const PadPair& p = padding[i];
    // (K) a dim padded by (0, 0) is left alone whatever the mode.
    if (p.before != 0 || p.after != 0) {
      if (mode == PadMode::Reflect && (in[d] == 0 || p.before > in[d] - 1 || p.after > in[d] - 1))
        return c.error(ErrorCode::Invalid,
                       fmt::format("reflect padding ({}, {}) of dim {} needs both at most size - 1 = {} ({})", p.before,
                                   p.after, d, static_cast<std::int64_t>(in[d]) - 1, shape_to_string(in)));
      if (mode == PadMode::Edge && in[d] == 0)
        return c.error(ErrorCode::Invalid,
                       fmt::format("edge padding of dim {} of size 0 ({})", d, shape_to_string(in)));
    }
    shape[d] = in[d] + p.before + p.after;
    attrs.push_back(attr(p.before));
    attrs.push_back(attr(p.after));
  }
  Operation op = new_op(c, input.dtype);
  op.num_inputs = 1;
  op.tensors.push_back(input);
  op.tensors.push_back(TensorIr::uninit(out, std::move(shape), input.dtype));
  if (constant) op.scalars.push_back(*constant);
  op.attrs = std::move(attrs);
  return finish(c, std::move(op));
}

// ---- Indexing

Result<Operation> gather(Family family, OpKind kind, const TensorIr& tensor, std::uint64_t dim, const TensorIr& indices,
                         TensorId out) {
  const Ctx c{family, kind};
  KILN_RETURN_IF_ERROR(check_kind(c, Signature::Gather, OutKind::Plain));
  KILN_RETURN_IF_ERROR(check_operand(c, tensor.dtype));
  KILN_RETURN_IF_ERROR(check_axis(c, dim, tensor.shape));
  KILN_RETURN_IF_ERROR(check_index_dtype(c, indices.dtype, "indices"));
  KILN_RETURN_IF_ERROR(check_rank(c, indices, tensor.shape.size(), "indices"));
  Operation op = new_op(c, tensor.dtype);
  op.num_inputs = 2;
  op.tensors.push_back(tensor);
  op.tensors.push_back(indices);
  op.tensors.push_back(TensorIr::uninit(out, indices.shape, tensor.dtype));
  op.attrs.push_back(attr(dim));
  return finish(c, std::move(op));
}

Result<Operation> scatter(Family family, OpKind kind, const TensorIr& tensor, std::uint64_t dim,
                          const TensorIr& indices, const TensorIr& value, IndexingUpdate update, TensorId out) {
  const Ctx c{family, kind};
  KILN_RETURN_IF_ERROR(check_kind(c, Signature::Scatter, OutKind::Plain));
  KILN_RETURN_IF_ERROR(check_operand(c, tensor.dtype));
  KILN_RETURN_IF_ERROR(check_axis(c, dim, tensor.shape));
  KILN_RETURN_IF_ERROR(check_index_dtype(c, indices.dtype, "indices"));
  KILN_RETURN_IF_ERROR(check_same(c, tensor, "tensor", value, "value"));
  Operation op = new_op(c, tensor.dtype);
  op.num_inputs = 3;
  op.tensors.push_back(tensor);
  op.tensors.push_back(indices);
  op.tensors.push_back(value);
  op.tensors.push_back(TensorIr::uninit(out, tensor.shape, tensor.dtype));
  op.attrs.push_back(attr(dim));
  op.attrs.push_back(static_cast<std::int64_t>(update));
  return finish(c, std::move(op));
}

Result<Operation> select(Family family, OpKind kind, const TensorIr& tensor, std::uint64_t dim, const TensorIr& indices,
                         TensorId out) {
  const Ctx c{family, kind};
  KILN_RETURN_IF_ERROR(check_kind(c, Signature::Select, OutKind::Plain));
  KILN_RETURN_IF_ERROR(check_operand(c, tensor.dtype));
  KILN_RETURN_IF_ERROR(check_axis(c, dim, tensor.shape));
  KILN_RETURN_IF_ERROR(check_index_dtype(c, indices.dtype, "indices"));
  KILN_RETURN_IF_ERROR(check_rank(c, indices, 1, "indices"));
  Shape shape = tensor.shape;
  shape[dim] = indices.shape[0];
  Operation op = new_op(c, tensor.dtype);
  op.num_inputs = 2;
  op.tensors.push_back(tensor);
  op.tensors.push_back(indices);
  op.tensors.push_back(TensorIr::uninit(out, std::move(shape), tensor.dtype));
  op.attrs.push_back(attr(dim));
  return finish(c, std::move(op));
}

Result<Operation> select_assign(Family family, OpKind kind, const TensorIr& tensor, std::uint64_t dim,
                                const TensorIr& indices, const TensorIr& value, IndexingUpdate update, TensorId out) {
  const Ctx c{family, kind};
  KILN_RETURN_IF_ERROR(check_kind(c, Signature::SelectAssign, OutKind::Plain));
  KILN_RETURN_IF_ERROR(check_operand(c, tensor.dtype));
  KILN_RETURN_IF_ERROR(check_axis(c, dim, tensor.shape));
  KILN_RETURN_IF_ERROR(check_index_dtype(c, indices.dtype, "indices"));
  KILN_RETURN_IF_ERROR(check_rank(c, indices, 1, "indices"));
  KILN_RETURN_IF_ERROR(check_same(c, tensor, "tensor", value, "value"));
  Operation op = new_op(c, tensor.dtype);
  op.num_inputs = 3;
  op.tensors.push_back(tensor);
  op.tensors.push_back(indices);
  op.tensors.push_back(value);
  op.tensors.push_back(TensorIr::uninit(out, tensor.shape, tensor.dtype));
  op.attrs.push_back(attr(dim));
  op.attrs.push_back(static_cast<std::int64_t>(update));
  return finish(c, std::move(op));
}

Result<Operation> gather_nd(Family family, OpKind kind, const TensorIr& data, const TensorIr& indices, TensorId out) {
  const Ctx c{family, kind};
  KILN_RETURN_IF_ERROR(check_kind(c, Signature::GatherNd, OutKind::Plain));
  KILN_RETURN_IF_ERROR(check_operand(c, data.dtype));
  KILN_RETURN_IF_ERROR(check_index_dtype(c, indices.dtype, "indices"));
  KILN_RETURN_IF_ERROR(check_nd_indices(c, data, indices));
  const Shape& is = indices.shape;
  const std::uint64_t k = is.back();
  Shape shape(is.begin(), is.end() - 1);
  shape.insert(shape.end(), data.shape.begin() + static_cast<std::ptrdiff_t>(k), data.shape.end());
  Operation op = new_op(c, data.dtype);
  op.num_inputs = 2;
  op.tensors.push_back(data);
  op.tensors.push_back(indices);
  op.tensors.push_back(TensorIr::uninit(out, std::move(shape), data.dtype));
  return finish(c, std::move(op));
}

Result<Operation> scatter_nd(Family family, OpKind kind, const TensorIr& data, const TensorIr& indices,
                             const TensorIr& values, IndexingUpdate reduction, TensorId out) {
  const Ctx c{family, kind};
  KILN_RETURN_IF_ERROR(check_kind(c, Signature::ScatterNd, OutKind::Plain));
  KILN_RETURN_IF_ERROR(check_operand(c, data.dtype));
  KILN_RETURN_IF_ERROR(check_index_dtype(c, indices.dtype, "indices"));
  KILN_RETURN_IF_ERROR(check_same(c, data, "data", values, "values"));
  KILN_RETURN_IF_ERROR(check_nd_indices(c, data, indices));
  const auto r = static_cast<std::int64_t>(reduction);
  if (r < static_cast<std::int64_t>(IndexingUpdate::Assign) || r > static_cast<std::int64_t>(IndexingUpdate::Max))
    return c.error(ErrorCode::Invalid, fmt::format("unknown reduction {}", r));
  Operation op = new_op(c, data.dtype);
  op.num_inputs = 3;
  op.tensors.push_back(data);
  op.tensors.push_back(indices);
  op.tensors.push_back(values);
  op.tensors.push_back(TensorIr::uninit(out, data.shape, data.dtype));
  op.attrs.push_back(r);
  return finish(c, std::move(op));
}

// ---- Creation

namespace {
Result<Operation> created(const Ctx& c, Signature sig, const Shape& shape, DType dtype, TensorId out) {
  KILN_RETURN_IF_ERROR(check_kind(c, sig, OutKind::Plain));
  KILN_RETURN_IF_ERROR(check_operand(c, dtype));
  Operation op = new_op(c, dtype);
  op.num_inputs = 0;
  op.tensors.push_back(TensorIr::uninit(out, shape, dtype));
  return op;
}
}  // namespace

Result<Operation> creation(Family family, OpKind kind, const Shape& shape, DType dtype, TensorId out) {
  const Ctx c{family, kind};
  KILN_ASSIGN_OR_RETURN(Operation op, created(c, Signature::Creation, shape, dtype, out));
  return finish(c, std::move(op));
}

Result<Operation> full(Family family, OpKind kind, const Shape& shape, DType dtype, ScalarIr value, TensorId out) {
  const Ctx c{family, kind};
  KILN_ASSIGN_OR_RETURN(Operation op, created(c, Signature::Full, shape, dtype, out));
  op.scalars.push_back(value);
  return finish(c, std::move(op));
}

Result<Operation> random(Family family, OpKind kind, const Shape& shape, DType dtype, DistributionIr distribution,
                         TensorId out) {
  const Ctx c{family, kind};
  const auto dist = static_cast<std::int64_t>(distribution.kind);
  if (dist < 0 || dist > static_cast<std::int64_t>(Distribution::Normal))
    return c.error(ErrorCode::Invalid, fmt::format("unknown distribution {}", dist));
  KILN_ASSIGN_OR_RETURN(Operation op, created(c, Signature::Random, shape, dtype, out));
  op.attrs = {dist, double_bits(distribution.param0), double_bits(distribution.param1)};
  return finish(c, std::move(op));
}

// ---- Module ops

namespace {
Status check_module_operand(const Ctx& c, const TensorIr& t, const char* what) {
  if (!t.dtype.is_float())
    return c.error(ErrorCode::DTypeMismatch, fmt::format("{} {} must have a float dtype", what, t.to_string()));
  return Status::Ok();
}

// same(x, weight, bias?).
Status check_same_conv(const Ctx& c, const TensorIr& x, const TensorIr& weight, const std::optional<TensorIr>& bias) {
  KILN_RETURN_IF_ERROR(check_same(c, x, "x", weight, "weight"));
  if (bias) KILN_RETURN_IF_ERROR(check_same(c, x, "x", *bias, "bias"));
  return Status::Ok();
}

Result<Operation> module_op(const Ctx& c, std::initializer_list<const TensorIr*> inputs, Shape shape, DType dtype,
                            TensorId out, AttrList attrs) {
  Operation op = new_op(c, dtype);
  for (const TensorIr* t : inputs)
    if (t) op.tensors.push_back(*t);
  op.num_inputs = static_cast<std::uint8_t>(op.tensors.size());
  op.tensors.push_back(TensorIr::uninit(out, std::move(shape), dtype));
  op.attrs = std::move(attrs);
  return finish(c, std::move(op));
}

// One output of a module op, created as TensorIr::uninit in field order.
struct OutputSpec {
  TensorId id;
  Shape shape;
  DType dtype;
};

// A module op with several outputs (Rfft's two, DeformableConv2dBackward's three to five).
Result<Operation> module_op_outputs(const Ctx& c, std::initializer_list<const TensorIr*> inputs,
                                    std::span<const OutputSpec> outputs, AttrList attrs) {
  Operation op = new_op(c, DType{});
  for (const TensorIr* t : inputs)
    if (t) op.tensors.push_back(*t);
  op.num_inputs = static_cast<std::uint8_t>(op.tensors.size());
  for (const OutputSpec& o : outputs) op.tensors.push_back(TensorIr::uninit(o.id, o.shape, o.dtype));
  op.attrs = std::move(attrs);
  return finish(c, std::move(op));
}
}  // namespace

Result<Operation> conv2d(const TensorIr& x, const TensorIr& weight, const std::optional<TensorIr>& bias,
                         const Conv2dOptions& o, TensorId out) {
  return conv(OpKind::Module_Conv2d, x, weight, bias, conv_options(o), out);
}

Result<Operation> conv_transpose1d(const TensorIr& x, const TensorIr& weight, const std::optional<TensorIr>& bias,
                                   const ConvTranspose1dOptions& o, TensorId out) {
  return conv_transpose(OpKind::Module_ConvTranspose1d, x, weight, bias, conv_options(o), out);
}

Result<Operation> embedding(const TensorIr& weights, const TensorIr& indices, TensorId out) {
  const Ctx c{Family::Module, OpKind::Module_Embedding};
  KILN_RETURN_IF_ERROR(check_module_operand(c, weights, "weights"));
  KILN_RETURN_IF_ERROR(check_index_dtype(c, indices.dtype, "indices"));
  KILN_RETURN_IF_ERROR(check_rank(c, weights, 2, "weights"));
  KILN_RETURN_IF_ERROR(check_rank(c, indices, 2, "indices"));
  return module_op(c, {&weights, &indices}, Shape{indices.shape[0], indices.shape[1], weights.shape[1]}, weights.dtype,
                   out, {});
}

// ---- Dense layers, norms and the embedding's gradient (docs/spec/ir.md §5.8, §6.3)

namespace {
// The last dim of a tensor of rank >= 1 (the features of a dense layer or a norm).
Result<std::uint64_t> last_dim(const Ctx& c, const TensorIr& t, const char* what) {
  if (t.shape.empty())
    return c.error(ErrorCode::RankMismatch, fmt::format("{} {} must have rank at least 1", what, t.to_string()));
  return t.shape.back();
}

// A per-feature or per-channel vector: rank 1 with `size` elements (`of` says where size comes from).
Status check_vector(const Ctx& c, const TensorIr& t, const char* what, std::uint64_t size, const char* of) {
  if (t.shape.size() != 1 || t.shape[0] != size)
    return c.error(ErrorCode::IncompatibleShapes,
                   fmt::format("{} {} must have shape [{}] ({})", what, t.to_string(), size, of));
  return Status::Ok();
}

// (K) Burn takes any epsilon; a NaN, infinite or negative one can only make every output NaN.
Status check_epsilon(const Ctx& c, double epsilon) {
  if (!std::isfinite(epsilon) || epsilon < 0)
    return c.error(ErrorCode::Invalid, fmt::format("epsilon must be finite and non-negative, got {}", epsilon));
  return Status::Ok();
}

Shape with_last(Shape s, std::uint64_t last) {
  s.back() = last;
  return s;
}
}  // namespace

Result<Operation> linear(const TensorIr& x, const TensorIr& weight, const std::optional<TensorIr>& bias, TensorId out) {
  const Ctx c{Family::Module, OpKind::Module_Linear};
  KILN_RETURN_IF_ERROR(check_module_operand(c, x, "x"));
  KILN_RETURN_IF_ERROR(check_same_conv(c, x, weight, bias));
  KILN_ASSIGN_OR_RETURN(std::uint64_t d_in, last_dim(c, x, "x"));
  KILN_RETURN_IF_ERROR(check_rank(c, weight, 2, "weight"));
  if (weight.shape[0] != d_in)
    return c.error(ErrorCode::IncompatibleShapes,
                   fmt::format("x {} has {} features, weight {} ([d_in, d_out]) takes {}", shape_to_string(x.shape),
                               d_in, shape_to_string(weight.shape), weight.shape[0]));
  KILN_RETURN_IF_ERROR(check_bias(c, bias, weight.shape[1]));
  return module_op(c, {&x, &weight, bias ? &*bias : nullptr}, with_last(x.shape, weight.shape[1]), x.dtype, out, {});
}

Result<Operation> linear_x_backward(const TensorIr& weight, const TensorIr& output_grad, TensorId out) {
  const Ctx c{Family::Module, OpKind::Module_LinearXBackward};
  KILN_RETURN_IF_ERROR(check_module_operand(c, weight, "weight"));
  KILN_RETURN_IF_ERROR(check_module_operand(c, output_grad, "output_grad"));
  KILN_RETURN_IF_ERROR(check_rank(c, weight, 2, "weight"));
  KILN_ASSIGN_OR_RETURN(std::uint64_t d_out, last_dim(c, output_grad, "output_grad"));
  if (weight.shape[1] != d_out)
    return c.error(
        ErrorCode::IncompatibleShapes,
        fmt::format("output_grad {} has {} features, weight {} ([d_in, d_out]) gives {}",
                    shape_to_string(output_grad.shape), d_out, shape_to_string(weight.shape), weight.shape[1]));
  return module_op(c, {&weight, &output_grad}, with_last(output_grad.shape, weight.shape[0]), output_grad.dtype, out,
                   {});
}

Result<Operation> linear_weight_backward(const TensorIr& x, const TensorIr& output_grad, TensorId out) {
  const Ctx c{Family::Module, OpKind::Module_LinearWeightBackward};
  KILN_RETURN_IF_ERROR(check_module_operand(c, x, "x"));
  KILN_RETURN_IF_ERROR(check_module_operand(c, output_grad, "output_grad"));
  KILN_ASSIGN_OR_RETURN(std::uint64_t d_in, last_dim(c, x, "x"));
  KILN_ASSIGN_OR_RETURN(std::uint64_t d_out, last_dim(c, output_grad, "output_grad"));
  // Each row of x met the row of output_grad at the same leading index (the forward kept them).
  if (x.shape.size() != output_grad.shape.size() ||
      !std::equal(x.shape.begin(), x.shape.end() - 1, output_grad.shape.begin()))
    return c.error(x.shape.size() != output_grad.shape.size() ? ErrorCode::RankMismatch : ErrorCode::IncompatibleShapes,
                   fmt::format("x {} and output_grad {} must have the same leading dims", shape_to_string(x.shape),
                               shape_to_string(output_grad.shape)));
  return module_op(c, {&x, &output_grad}, Shape{d_in, d_out}, output_grad.dtype, out, {});
}

Result<Operation> linear_bias_backward(const TensorIr& output_grad, TensorId out) {
  const Ctx c{Family::Module, OpKind::Module_LinearBiasBackward};
  KILN_RETURN_IF_ERROR(check_module_operand(c, output_grad, "output_grad"));
  KILN_ASSIGN_OR_RETURN(std::uint64_t d_out, last_dim(c, output_grad, "output_grad"));
  return module_op(c, {&output_grad}, Shape{d_out}, output_grad.dtype, out, {});
}

Result<Operation> layer_norm(const TensorIr& input, const TensorIr& gamma, const std::optional<TensorIr>& beta,
                             double epsilon, TensorId out) {
  const Ctx c{Family::Module, OpKind::Module_LayerNorm};
  KILN_RETURN_IF_ERROR(check_module_operand(c, input, "input"));
  KILN_RETURN_IF_ERROR(check_same(c, input, "input", gamma, "gamma"));
  if (beta) KILN_RETURN_IF_ERROR(check_same(c, input, "input", *beta, "beta"));
  KILN_ASSIGN_OR_RETURN(std::uint64_t d, last_dim(c, input, "input"));
  KILN_RETURN_IF_ERROR(check_vector(c, gamma, "gamma", d, "the input's last dim"));
  if (beta) KILN_RETURN_IF_ERROR(check_vector(c, *beta, "beta", d, "the input's last dim"));
  KILN_RETURN_IF_ERROR(check_epsilon(c, epsilon));
  return module_op(c, {&input, &gamma, beta ? &*beta : nullptr}, input.shape, input.dtype, out, {double_bits(epsilon)});
}

Result<Operation> layer_norm_with_stats(const TensorIr& input, const TensorIr& gamma,
                                        const std::optional<TensorIr>& beta, double epsilon, TensorId out,
                                        TensorId out_mean, TensorId out_rstd) {
  KILN_ASSIGN_OR_RETURN(Operation op, layer_norm(input, gamma, beta, epsilon, out));
  Shape stats = input.shape;
  stats.back() = 1;  // layer_norm refused a rank-0 input
  op.tensors.push_back(TensorIr::uninit(out_mean, stats, input.dtype));
  op.tensors.push_back(TensorIr::uninit(out_rstd, stats, input.dtype));
  return finish(Ctx{Family::Module, OpKind::Module_LayerNorm}, std::move(op));
}

Result<Operation> batch_norm(const TensorIr& x, const TensorIr& gamma, const TensorIr& beta, const TensorIr& mean,
                             const TensorIr& variance, double epsilon, TensorId out) {
  const Ctx c{Family::Module, OpKind::Module_BatchNorm};
  KILN_RETURN_IF_ERROR(check_module_operand(c, x, "x"));
  const std::pair<const TensorIr*, const char*> stats[] = {
      {&gamma, "gamma"}, {&beta, "beta"}, {&mean, "mean"}, {&variance, "variance"}};
  for (const auto& [t, name] : stats) KILN_RETURN_IF_ERROR(check_same(c, x, "x", *t, name));
  if (x.shape.size() < 2)
    return c.error(ErrorCode::RankMismatch, fmt::format("x {} must have rank at least 2 ([N, C, ...])", x.to_string()));
  for (const auto& [t, name] : stats)
    KILN_RETURN_IF_ERROR(check_vector(c, *t, name, x.shape[1], "the channels, x's dim 1"));
  KILN_RETURN_IF_ERROR(check_epsilon(c, epsilon));
  Operation op = new_op(c, x.dtype);
  op.tensors = {x, gamma, beta, mean, variance};
  op.num_inputs = 5;
  op.tensors.push_back(TensorIr::uninit(out, x.shape, x.dtype));
  op.scalars.push_back(ScalarIr::Float(epsilon));
  return finish(c, std::move(op));
}

Result<Operation> embedding_backward(const TensorIr& weights, const TensorIr& out_grad, const TensorIr& indices,
                                     TensorId out) {
  const Ctx c{Family::Module, OpKind::Module_EmbeddingBackward};
  KILN_RETURN_IF_ERROR(check_module_operand(c, weights, "weights"));
  KILN_RETURN_IF_ERROR(check_same(c, weights, "weights", out_grad, "out_grad"));
  KILN_RETURN_IF_ERROR(check_index_dtype(c, indices.dtype, "indices"));
  KILN_RETURN_IF_ERROR(check_rank(c, weights, 2, "weights"));
  KILN_RETURN_IF_ERROR(check_rank(c, indices, 2, "indices"));
  const Shape expected{indices.shape[0], indices.shape[1], weights.shape[1]};
  if (out_grad.shape != expected)
    return c.error(
        ErrorCode::IncompatibleShapes,
        fmt::format("out_grad {} must have shape {} (indices {}, weights {})", out_grad.to_string(),
                    shape_to_string(expected), shape_to_string(indices.shape), shape_to_string(weights.shape)));
  return module_op(c, {&weights, &out_grad, &indices}, weights.shape, weights.dtype, out, {});
}

// ---- Pools (docs/spec/ir.md §5.8, shapes §6.3): one rank-generic body per signature, the spatial
// rank n implied by the kind (pool_spatial_dims); MaxPool2d and AvgPool2d share them.

std::size_t pool_spatial_dims(OpKind kind) {
  switch (kind) {
    case OpKind::Module_MaxPool1d:
    case OpKind::Module_MaxPool1dWithIndices:
    case OpKind::Module_MaxPool1dWithIndicesBackward:
    case OpKind::Module_AvgPool1d:
    case OpKind::Module_AvgPool1dBackward:
    case OpKind::Module_AdaptiveAvgPool1d:
    case OpKind::Module_AdaptiveAvgPool1dBackward: return 1;
    case OpKind::Module_MaxPool2d:
    case OpKind::Module_MaxPool2dWithIndices:
    case OpKind::Module_MaxPool2dWithIndicesBackward:
    case OpKind::Module_AvgPool2d:
    case OpKind::Module_AvgPool2dBackward:
    case OpKind::Module_AdaptiveAvgPool2d:
    case OpKind::Module_AdaptiveAvgPool2dBackward: return 2;
    case OpKind::Module_AdaptiveAvgPool3d:
    case OpKind::Module_AdaptiveAvgPool3dBackward: return 3;
    default: return 0;
  }
}

Result<PoolAttrs> pool_attrs_of(const Operation& op) {
  PoolAttrs p;
  p.spatial = pool_spatial_dims(op.kind);
  switch (op.info().signature) {
    case Signature::MaxPool2d:
    case Signature::MaxPool:
    case Signature::MaxPoolWithIndices:
    case Signature::MaxPoolWithIndicesBackward: p.dilated = true; break;
    case Signature::AvgPool2d:
    case Signature::AvgPool:
    case Signature::AvgPoolBackward: p.dilated = false; break;
    default: return make_error(ErrorCode::Invalid, fmt::format("{} is not a windowed pool", op.kind_name()));
  }
  const std::size_t n = p.spatial, window = (p.dilated ? 4 : 3) * n, count = window + (p.dilated ? 1 : 2);
  if (op.attrs.size() != count)
    return make_error(ErrorCode::Invalid, fmt::format("takes {} attributes, got {}", count, op.attrs.size()));
  const auto value = [&](std::size_t i, const char* what, std::int64_t min) -> Result<std::uint64_t> {
    const std::int64_t a = op.attrs[i];
    if (a < 0) return make_error(ErrorCode::Invalid, fmt::format("{} must not be negative, got {}", what, a));
    if (a < min) return make_error(ErrorCode::Invalid, fmt::format("{} must be at least {}, got {}", what, min, a));
    return static_cast<std::uint64_t>(a);
  };
  const auto flag = [&](std::size_t i, const char* what) -> Result<bool> {
    const std::int64_t a = op.attrs[i];
    if (a != 0 && a != 1) return make_error(ErrorCode::Invalid, fmt::format("{} must be 0 or 1, got {}", what, a));
    return a == 1;
  };
  for (std::size_t i = 0; i < n; ++i) {
    KILN_ASSIGN_OR_RETURN(p.kernel[i], value(i, "kernel size", 1));
    KILN_ASSIGN_OR_RETURN(p.stride[i], value(n + i, "stride", 1));
    KILN_ASSIGN_OR_RETURN(p.padding[i], value(2 * n + i, "padding", 0));
    if (p.dilated) {
      KILN_ASSIGN_OR_RETURN(p.dilation[i], value(3 * n + i, "dilation", 1));
    }
    if (p.padding[i] > p.kernel[i] / 2)
      return make_error(ErrorCode::Invalid, fmt::format("padding {} exceeds half the kernel size {} (spatial dim {})",
                                                        p.padding[i], p.kernel[i], i));
  }
  if (!p.dilated) {
    KILN_ASSIGN_OR_RETURN(p.count_include_pad, flag(window, "count_include_pad"));
  }
  KILN_ASSIGN_OR_RETURN(p.ceil_mode, flag(count - 1, "ceil_mode"));
  return p;
}

namespace {
// A pool's window, n values per field (no dilation for average pools), then its flags
// ([ceil_mode], or [count_include_pad, ceil_mode]): the attributes in op_table.h's order.
struct PoolWindow {
  std::span<const std::uint64_t> kernel, stride, padding, dilation;
  bool ceil_mode = false;
  AttrList flags;

  AttrList attrs() const {
    AttrList a;
    for (auto field : {kernel, stride, padding, dilation})
      for (std::uint64_t v : field) a.push_back(attr(v));
    a.insert(a.end(), flags.begin(), flags.end());
    return a;
  }
};

PoolWindow window_of(const MaxPool1dOptions& o) {
  return {{&o.kernel, 1}, {&o.stride, 1}, {&o.padding, 1}, {&o.dilation, 1}, o.ceil_mode, {o.ceil_mode ? 1 : 0}};
}
PoolWindow window_of(const MaxPool2dOptions& o) {
  return {o.kernel, o.stride, o.padding, o.dilation, o.ceil_mode, {o.ceil_mode ? 1 : 0}};
}
PoolWindow window_of(const AvgPool1dOptions& o) {
  const AttrList flags{o.count_include_pad ? 1 : 0, o.ceil_mode ? 1 : 0};
  return {{&o.kernel, 1}, {&o.stride, 1}, {&o.padding, 1}, {}, o.ceil_mode, flags};
}
PoolWindow window_of(const AvgPool2dOptions& o) {
  return {o.kernel, o.stride, o.padding, {}, o.ceil_mode, {o.count_include_pad ? 1 : 0, o.ceil_mode ? 1 : 0}};
}

// x float of rank n + 2; the pooled shape [N, C, out...] by the pool formula per spatial dim.
Result<Shape> pooled_shape(const Ctx& c, const TensorIr& x, const PoolWindow& w) {
  assert(pool_spatial_dims(c.kind) == w.kernel.size());
  KILN_RETURN_IF_ERROR(check_module_operand(c, x, "x"));
  const std::size_t n = w.kernel.size();
  KILN_RETURN_IF_ERROR(check_rank(c, x, n + 2, "x"));
  Shape shape{x.shape[0], x.shape[1]};
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t dilation = w.dilation.empty() ? 1 : w.dilation[i];
    KILN_ASSIGN_OR_RETURN(std::uint64_t size, c.wrap(shape::pool_output(x.shape[2 + i], w.kernel[i], w.stride[i],
                                                                        w.padding[i], dilation, w.ceil_mode)));
    // PyTorch's limit: with more, a window may cover only padding in floor mode too.
    if (w.padding[i] > w.kernel[i] / 2)
      return c.error(ErrorCode::Invalid, fmt::format("padding {} exceeds half the kernel size {} (spatial dim {})",
                                                     w.padding[i], w.kernel[i], i));
    shape.push_back(size);
  }
  return shape;
}

Result<Operation> pool_forward(const Ctx& c, const TensorIr& x, const PoolWindow& w, TensorId out) {
  KILN_ASSIGN_OR_RETURN(Shape shape, pooled_shape(c, x, w));
  return module_op(c, {&x}, std::move(shape), x.dtype, out, w.attrs());
}

// Signed (−1 marks a window with no element of x) and wide enough for the plane's last index.
Status check_pool_index_dtype(const Ctx& c, const TensorIr& x, DType d) {
  if (!d.is_int())
    return c.error(ErrorCode::DTypeMismatch,
                   fmt::format("index dtype {} must be a signed integer dtype (-1 marks an empty window)", d.name()));
  std::uint64_t plane = 1;
  bool overflow = false;
  for (std::size_t i = 2; i < x.shape.size(); ++i)
    overflow = overflow || __builtin_mul_overflow(plane, x.shape[i], &plane);
  const std::uint64_t max = (std::uint64_t{1} << (d.size_bytes() * 8 - 1)) - 1;
  if (overflow || (plane > 0 && plane - 1 > max))
    return c.error(ErrorCode::Invalid, fmt::format("index dtype {} cannot hold the last index of x {}'s spatial plane",
                                                   d.name(), shape_to_string(x.shape)));
  return Status::Ok();
}

Result<Operation> pool_with_indices(const Ctx& c, const TensorIr& x, const PoolWindow& w, DType index_dtype,
                                    TensorId out, TensorId out_indices) {
  KILN_ASSIGN_OR_RETURN(Shape shape, pooled_shape(c, x, w));
  KILN_RETURN_IF_ERROR(check_pool_index_dtype(c, x, index_dtype));
  Operation op = new_op(c, x.dtype);
  op.num_inputs = 1;
  op.tensors.push_back(x);
  op.tensors.push_back(TensorIr::uninit(out, shape, x.dtype));
  op.tensors.push_back(TensorIr::uninit(out_indices, std::move(shape), index_dtype));
  op.attrs = w.attrs();
  return finish(c, std::move(op));
}

// A backward's grad (or indices) has the forward's output shape.
Status check_pooled(const Ctx& c, const TensorIr& t, const char* what, const TensorIr& x, const Shape& pooled) {
  if (t.shape != pooled)
    return c.error(ErrorCode::IncompatibleShapes,
                   fmt::format("{} {} must have the pool's output shape {} (x {})", what, t.to_string(),
                               shape_to_string(pooled), shape_to_string(x.shape)));
  return Status::Ok();
}

Result<Operation> avg_pool_backward(const Ctx& c, const TensorIr& x, const TensorIr& grad, const PoolWindow& w,
                                    TensorId out) {
  KILN_ASSIGN_OR_RETURN(Shape pooled, pooled_shape(c, x, w));
  KILN_RETURN_IF_ERROR(check_module_operand(c, grad, "grad"));
  KILN_RETURN_IF_ERROR(check_pooled(c, grad, "grad", x, pooled));
  return module_op(c, {&x, &grad}, x.shape, x.dtype, out, w.attrs());
}

Result<Operation> max_pool_backward(const Ctx& c, const TensorIr& x, const TensorIr& grad, const TensorIr& indices,
                                    const PoolWindow& w, TensorId out) {
  KILN_ASSIGN_OR_RETURN(Shape pooled, pooled_shape(c, x, w));
  KILN_RETURN_IF_ERROR(check_module_operand(c, grad, "grad"));
  KILN_RETURN_IF_ERROR(check_index_dtype(c, indices.dtype, "indices"));
  KILN_RETURN_IF_ERROR(check_pooled(c, grad, "grad", x, pooled));
  KILN_RETURN_IF_ERROR(check_pooled(c, indices, "indices", x, pooled));
  return module_op(c, {&x, &grad, &indices}, x.shape, x.dtype, out, w.attrs());
}

// An adaptive pool's x (or grad): float of rank n + 2, every spatial dim at least 1 (PyTorch: each
// window holds an element).
Status check_adaptive_operand(const Ctx& c, const TensorIr& t, const char* what) {
  const std::size_t n = pool_spatial_dims(c.kind);
  KILN_RETURN_IF_ERROR(check_module_operand(c, t, what));
  KILN_RETURN_IF_ERROR(check_rank(c, t, n + 2, what));
  for (std::size_t i = 0; i < n; ++i)
    if (t.shape[2 + i] == 0)
      return c.error(ErrorCode::Invalid, fmt::format("{} {} has an empty spatial dim {}", what, t.to_string(), i));
  return Status::Ok();
}

Result<Operation> adaptive_avg_pool(const Ctx& c, const TensorIr& x, std::span<const std::uint64_t> size,
                                    TensorId out) {
  KILN_RETURN_IF_ERROR(check_adaptive_operand(c, x, "x"));
  Shape shape{x.shape[0], x.shape[1]};
  AttrList attrs;
  for (std::size_t i = 0; i < size.size(); ++i) {
    if (size[i] == 0 || size[i] > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
      return c.error(ErrorCode::Invalid,
                     fmt::format("output size {} at spatial dim {} must be in [1, 2^63 - 1]", size[i], i));
    shape.push_back(size[i]);
    attrs.push_back(attr(size[i]));
  }
  return module_op(c, {&x}, std::move(shape), x.dtype, out, std::move(attrs));
}

Result<Operation> adaptive_avg_pool_backward(const Ctx& c, const TensorIr& x, const TensorIr& grad, TensorId out) {
  KILN_RETURN_IF_ERROR(check_adaptive_operand(c, x, "x"));
  KILN_RETURN_IF_ERROR(check_adaptive_operand(c, grad, "grad"));
  if (grad.shape[0] != x.shape[0] || grad.shape[1] != x.shape[1])
    return c.error(ErrorCode::IncompatibleShapes, fmt::format("grad {} must have x {}'s batch and channel dims",
                                                              grad.to_string(), shape_to_string(x.shape)));
  return module_op(c, {&x, &grad}, x.shape, x.dtype, out, {});
}

constexpr Ctx module_ctx(OpKind kind) { return Ctx{Family::Module, kind}; }
}  // namespace

Result<Operation> max_pool1d(const TensorIr& x, const MaxPool1dOptions& o, TensorId out) {
  return pool_forward(module_ctx(OpKind::Module_MaxPool1d), x, window_of(o), out);
}

Result<Operation> max_pool2d(const TensorIr& x, const MaxPool2dOptions& o, TensorId out) {
  return pool_forward(module_ctx(OpKind::Module_MaxPool2d), x, window_of(o), out);
}

Result<Operation> max_pool1d_with_indices(const TensorIr& x, const MaxPool1dOptions& o, DType index_dtype, TensorId out,
                                          TensorId out_indices) {
  return pool_with_indices(module_ctx(OpKind::Module_MaxPool1dWithIndices), x, window_of(o), index_dtype, out,
                           out_indices);
}

Result<Operation> max_pool2d_with_indices(const TensorIr& x, const MaxPool2dOptions& o, DType index_dtype, TensorId out,
                                          TensorId out_indices) {
  return pool_with_indices(module_ctx(OpKind::Module_MaxPool2dWithIndices), x, window_of(o), index_dtype, out,
                           out_indices);
}

Result<Operation> max_pool1d_with_indices_backward(const TensorIr& x, const TensorIr& grad, const TensorIr& indices,
                                                   const MaxPool1dOptions& o, TensorId out) {
  return max_pool_backward(module_ctx(OpKind::Module_MaxPool1dWithIndicesBackward), x, grad, indices, window_of(o),
                           out);
}

Result<Operation> max_pool2d_with_indices_backward(const TensorIr& x, const TensorIr& grad, const TensorIr& indices,
                                                   const MaxPool2dOptions& o, TensorId out) {
  return max_pool_backward(module_ctx(OpKind::Module_MaxPool2dWithIndicesBackward), x, grad, indices, window_of(o),
                           out);
}

Result<Operation> avg_pool1d(const TensorIr& x, const AvgPool1dOptions& o, TensorId out) {
  return pool_forward(module_ctx(OpKind::Module_AvgPool1d), x, window_of(o), out);
}

Result<Operation> avg_pool2d(const TensorIr& x, const AvgPool2dOptions& o, TensorId out) {
  return pool_forward(module_ctx(OpKind::Module_AvgPool2d), x, window_of(o), out);
}

Result<Operation> avg_pool1d_backward(const TensorIr& x, const TensorIr& grad, const AvgPool1dOptions& o,
                                      TensorId out) {
  return avg_pool_backward(module_ctx(OpKind::Module_AvgPool1dBackward), x, grad, window_of(o), out);
}

Result<Operation> avg_pool2d_backward(const TensorIr& x, const TensorIr& grad, const AvgPool2dOptions& o,
                                      TensorId out) {
  return avg_pool_backward(module_ctx(OpKind::Module_AvgPool2dBackward), x, grad, window_of(o), out);
}

Result<Operation> adaptive_avg_pool1d(const TensorIr& x, std::uint64_t output_size, TensorId out) {
  return adaptive_avg_pool(module_ctx(OpKind::Module_AdaptiveAvgPool1d), x, {&output_size, 1}, out);
}

Result<Operation> adaptive_avg_pool2d(const TensorIr& x, std::array<std::uint64_t, 2> output_size, TensorId out) {
  return adaptive_avg_pool(module_ctx(OpKind::Module_AdaptiveAvgPool2d), x, output_size, out);
}

Result<Operation> adaptive_avg_pool3d(const TensorIr& x, std::array<std::uint64_t, 3> output_size, TensorId out) {
  return adaptive_avg_pool(module_ctx(OpKind::Module_AdaptiveAvgPool3d), x, output_size, out);
}

Result<Operation> adaptive_avg_pool1d_backward(const TensorIr& x, const TensorIr& grad, TensorId out) {
  return adaptive_avg_pool_backward(module_ctx(OpKind::Module_AdaptiveAvgPool1dBackward), x, grad, out);
}

Result<Operation> adaptive_avg_pool2d_backward(const TensorIr& x, const TensorIr& grad, TensorId out) {
  return adaptive_avg_pool_backward(module_ctx(OpKind::Module_AdaptiveAvgPool2dBackward), x, grad, out);
}

Result<Operation> adaptive_avg_pool3d_backward(const TensorIr& x, const TensorIr& grad, TensorId out) {
  return adaptive_avg_pool_backward(module_ctx(OpKind::Module_AdaptiveAvgPool3dBackward), x, grad, out);
}

// ---- Resampling: interpolate and its gradient, grid sampling, unfold4d (docs/spec/ir.md §5.6,
// §5.8, §6.3)

namespace {
constexpr const char* kInterpolateModes[] = {"Nearest", "NearestExact", "Bilinear", "Bicubic", "Lanczos3"};

// An enum attribute the kernels switch over: a value outside the enum is an error, never a cast.
Status check_interpolate_mode(const Ctx& c, InterpolateMode mode) {
  const auto m = static_cast<std::int64_t>(mode);
  if (m < 0 || m > static_cast<std::int64_t>(InterpolateMode::Lanczos3))
    return c.error(ErrorCode::Invalid, fmt::format("unknown interpolate mode {}", m));
  return Status::Ok();
}

// A float [N, C, H, W] image with H, W >= 1 (every mode maps output positions into [0, H) and [0, W)).
Status check_image(const Ctx& c, const TensorIr& t, const char* what) {
  KILN_RETURN_IF_ERROR(check_module_operand(c, t, what));
  KILN_RETURN_IF_ERROR(check_rank(c, t, 4, what));
  if (t.shape[2] == 0 || t.shape[3] == 0)
    return c.error(ErrorCode::Invalid,
                   fmt::format("{} {} has an empty image: H and W must be at least 1", what, t.to_string()));
  return Status::Ok();
}

// Sizes travel as i64 attributes: a larger one would not survive the trip (nor the daemon's check).
Status check_attr_range(const Ctx& c, std::initializer_list<std::uint64_t> values, const char* what) {
  constexpr auto kMaxAttr = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
  for (std::uint64_t v : values)
    if (v > kMaxAttr) return c.error(ErrorCode::Invalid, fmt::format("{} {} exceeds the i64 range", what, v));
  return Status::Ok();
}

Status check_interpolate_args(const Ctx& c, std::array<std::uint64_t, 2> size, const InterpolateOptions& o) {
  if (size[0] == 0 || size[1] == 0)
    return c.error(ErrorCode::Invalid, fmt::format("output_size {} must be at least 1 in each dim", dims(size)));
  KILN_RETURN_IF_ERROR(check_attr_range(c, {size[0], size[1]}, "output size"));
  return check_interpolate_mode(c, o.mode);
}

AttrList interpolate_attrs(std::array<std::uint64_t, 2> size, const InterpolateOptions& o) {
  return {attr(size[0]), attr(size[1]), static_cast<std::int64_t>(o.mode), o.align_corners ? 1 : 0};
}

// Burn's grid sampling reads Nearest, Bilinear and Bicubic (PyTorch's three modes); the padding
// mode is one of the three GridSamplePaddingMode values.
Status check_grid_options(const Ctx& c, const GridSampleOptions& o) {
  KILN_RETURN_IF_ERROR(check_interpolate_mode(c, o.mode));
  if (o.mode == InterpolateMode::NearestExact || o.mode == InterpolateMode::Lanczos3)
    return c.error(ErrorCode::Invalid,
                   fmt::format("mode {} does not apply to grid sampling (Nearest, Bilinear or Bicubic)",
                               kInterpolateModes[static_cast<std::size_t>(o.mode)]));
  const auto p = static_cast<std::int64_t>(o.padding_mode);
  if (p < 0 || p > static_cast<std::int64_t>(GridSamplePaddingMode::Reflection))
    return c.error(ErrorCode::Invalid, fmt::format("unknown padding mode {}", p));
  return Status::Ok();
}
}  // namespace

Result<Operation> interpolate(const TensorIr& x, std::array<std::uint64_t, 2> output_size,
                              const InterpolateOptions& options, TensorId out) {
  const Ctx c{Family::Module, OpKind::Module_Interpolate};
  KILN_RETURN_IF_ERROR(check_image(c, x, "x"));
  KILN_RETURN_IF_ERROR(check_interpolate_args(c, output_size, options));
  return module_op(c, {&x}, Shape{x.shape[0], x.shape[1], output_size[0], output_size[1]}, x.dtype, out,
                   interpolate_attrs(output_size, options));
}

Result<Operation> interpolate_backward(const TensorIr& x, const TensorIr& grad,
                                       std::array<std::uint64_t, 2> output_size, const InterpolateOptions& options,
                                       TensorId out) {
  const Ctx c{Family::Module, OpKind::Module_InterpolateBackward};
  KILN_RETURN_IF_ERROR(check_image(c, x, "x"));
  KILN_RETURN_IF_ERROR(check_module_operand(c, grad, "grad"));
  KILN_RETURN_IF_ERROR(check_interpolate_args(c, output_size, options));
  // grad is the gradient of Interpolate's output: the kernel walks it by that shape.
  const Shape expected{x.shape[0], x.shape[1], output_size[0], output_size[1]};
  if (grad.shape != expected)
    return c.error(grad.shape.size() != 4 ? ErrorCode::RankMismatch : ErrorCode::IncompatibleShapes,
                   fmt::format("grad {} must have shape {} (x {}, output_size {})", grad.to_string(),
                               shape_to_string(expected), shape_to_string(x.shape), dims(output_size)));
  return module_op(c, {&x, &grad}, x.shape, x.dtype, out, interpolate_attrs(output_size, options));
}

Result<Operation> grid_sample_2d(const TensorIr& tensor, const TensorIr& grid, const GridSampleOptions& options,
                                 TensorId out) {
  const Ctx c{Family::Float, OpKind::Float_GridSample2d};
  KILN_RETURN_IF_ERROR(check_image(c, tensor, "tensor"));
  KILN_RETURN_IF_ERROR(check_module_operand(c, grid, "grid"));
  KILN_RETURN_IF_ERROR(check_rank(c, grid, 4, "grid"));
  if (grid.shape[3] != 2)
    return c.error(ErrorCode::IncompatibleShapes,
                   fmt::format("grid {} must hold 2 coordinates (x, y) in its last dim", grid.to_string()));
  if (grid.shape[0] != tensor.shape[0])
    return c.error(ErrorCode::IncompatibleShapes,
                   fmt::format("grid {} has batch {}, tensor {} has {}", grid.to_string(), grid.shape[0],
                               tensor.to_string(), tensor.shape[0]));
  KILN_RETURN_IF_ERROR(check_grid_options(c, options));
  return module_op(c, {&tensor, &grid}, Shape{tensor.shape[0], tensor.shape[1], grid.shape[1], grid.shape[2]},
                   tensor.dtype, out,
                   {static_cast<std::int64_t>(options.mode), static_cast<std::int64_t>(options.padding_mode),
                    options.align_corners ? 1 : 0});
}

Result<Operation> unfold4d(const TensorIr& x, std::array<std::uint64_t, 2> kernel_size, const Unfold4dOptions& o,
                           TensorId out) {
  const Ctx c{Family::Module, OpKind::Module_Unfold4d};
  KILN_RETURN_IF_ERROR(check_module_operand(c, x, "x"));
  KILN_RETURN_IF_ERROR(check_rank(c, x, 4, "x"));
  const std::array<std::uint64_t, 2>& k = kernel_size;
  KILN_RETURN_IF_ERROR(check_attr_range(
      c, {k[0], k[1], o.stride[0], o.stride[1], o.padding[0], o.padding[1], o.dilation[0], o.dilation[1]},
      "kernel size, stride, padding or dilation"));
  // The blocks of a conv with an [C·kh·kw, C, kh, kw] weight (§6.3), one column each.
  std::uint64_t blocks[2];
  for (std::size_t i = 0; i < 2; ++i) {
    KILN_ASSIGN_OR_RETURN(blocks[i],
                          c.wrap(shape::conv_output(x.shape[2 + i], k[i], o.stride[i], o.padding[i], o.dilation[i])));
  }
  std::uint64_t rows = 0, columns = 0;
  if (__builtin_mul_overflow(x.shape[1], k[0], &rows) || __builtin_mul_overflow(rows, k[1], &rows) ||
      __builtin_mul_overflow(blocks[0], blocks[1], &columns))
    return c.error(ErrorCode::Invalid, fmt::format("the unfolded shape of x {} with kernel {} overflows",
                                                   shape_to_string(x.shape), dims(k)));
  return module_op(c, {&x}, Shape{x.shape[0], rows, columns}, x.dtype, out,
                   {attr(k[0]), attr(k[1]), attr(o.stride[0]), attr(o.stride[1]), attr(o.padding[0]),
                    attr(o.padding[1]), attr(o.dilation[0]), attr(o.dilation[1])});
}

// ---- Convolutions of 1..3 spatial dims and their gradients (docs/spec/ir.md §5.8, §6.3)

namespace {
// One option's values as ConvOptions keeps them: a scalar (1-d options) or one per spatial dim.
std::vector<std::uint64_t> option_list(std::uint64_t v) { return {v}; }
template <std::size_t N>
std::vector<std::uint64_t> option_list(const std::array<std::uint64_t, N>& v) {
  return {v.begin(), v.end()};
}

template <class Options>
ConvOptions plain_conv_options(const Options& o) {
  return {option_list(o.stride), option_list(o.padding), {}, option_list(o.dilation), o.groups};
}
template <class Options>
ConvOptions transposed_conv_options(const Options& o) {
  return {option_list(o.stride), option_list(o.padding), option_list(o.padding_out), option_list(o.dilation), o.groups};
}
}  // namespace

ConvOptions conv_options(const Conv1dOptions& o) { return plain_conv_options(o); }
ConvOptions conv_options(const Conv2dOptions& o) { return plain_conv_options(o); }
ConvOptions conv_options(const Conv3dOptions& o) { return plain_conv_options(o); }
ConvOptions conv_options(const ConvTranspose1dOptions& o) { return transposed_conv_options(o); }
ConvOptions conv_options(const ConvTranspose2dOptions& o) { return transposed_conv_options(o); }
ConvOptions conv_options(const ConvTranspose3dOptions& o) { return transposed_conv_options(o); }

Result<ConvOptions> conv_options_of(const Operation& op) {
  const std::optional<ConvKindInfo> k = conv_kind_info(op.kind);
  if (!k || k->role == ConvRole::BiasBackward)
    return make_error(ErrorCode::Invalid, fmt::format("{} carries no convolution options", op.kind_name()));
  const std::size_t lists = k->transposed ? 4 : 3, count = lists * k->rank + 1;
  if (op.attrs.size() != count)
    return make_error(ErrorCode::Invalid,
                      fmt::format("takes {} attributes for {} spatial dims, got {}", count, k->rank, op.attrs.size()));
  ConvOptions o;
  static constexpr const char* kNames[] = {"stride", "padding", "padding_out", "dilation"};
  std::vector<std::uint64_t>* const order[] = {&o.stride, &o.padding, &o.padding_out, &o.dilation};
  std::size_t a = 0;
  for (std::size_t l = 0; l < 4; ++l) {
    if (l == 2 && !k->transposed) continue;
    const std::int64_t min = (l == 0 || l == 3) ? 1 : 0;
    for (std::size_t i = 0; i < k->rank; ++i, ++a) {
      if (op.attrs[a] < 0)
        return make_error(ErrorCode::Invalid,
                          fmt::format("{} must not be negative, got {} (dim {})", kNames[l], op.attrs[a], i));
      if (op.attrs[a] < min)
        return make_error(ErrorCode::Invalid,
                          fmt::format("{} must be at least {}, got {} (dim {})", kNames[l], min, op.attrs[a], i));
      order[l]->push_back(static_cast<std::uint64_t>(op.attrs[a]));
    }
  }
  if (op.attrs[a] < 1)
    return make_error(ErrorCode::Invalid, fmt::format("groups must be at least 1, got {}", op.attrs[a]));
  o.groups = static_cast<std::uint64_t>(op.attrs[a]);
  for (std::size_t i = 0; i < o.padding_out.size(); ++i)
    if (o.padding_out[i] >= std::max(o.stride[i], o.dilation[i]))
      return make_error(ErrorCode::Invalid,
                        fmt::format("padding_out {} must be smaller than the stride {} or the dilation {}",
                                    o.padding_out[i], o.stride[i], o.dilation[i]));
  return o;
}

namespace {

struct ConvKindRow {
  OpKind kind;
  ConvKindInfo info;
};
constexpr ConvRole kFwd = ConvRole::Forward, kX = ConvRole::XBackward, kW = ConvRole::WeightBackward,
                   kB = ConvRole::BiasBackward;
constexpr ConvKindRow kConvKinds[] = {
    {OpKind::Module_Conv1d, {1, false, kFwd}},
    {OpKind::Module_Conv2d, {2, false, kFwd}},
    {OpKind::Module_Conv3d, {3, false, kFwd}},
    {OpKind::Module_Conv1dXBackward, {1, false, kX}},
    {OpKind::Module_Conv2dXBackward, {2, false, kX}},
    {OpKind::Module_Conv3dXBackward, {3, false, kX}},
    {OpKind::Module_Conv1dWeightBackward, {1, false, kW}},
    {OpKind::Module_Conv2dWeightBackward, {2, false, kW}},
    {OpKind::Module_Conv3dWeightBackward, {3, false, kW}},
    {OpKind::Module_Conv1dBiasBackward, {1, false, kB}},
    {OpKind::Module_Conv2dBiasBackward, {2, false, kB}},
    {OpKind::Module_Conv3dBiasBackward, {3, false, kB}},
    {OpKind::Module_ConvTranspose1d, {1, true, kFwd}},
    {OpKind::Module_ConvTranspose2d, {2, true, kFwd}},
    {OpKind::Module_ConvTranspose3d, {3, true, kFwd}},
    {OpKind::Module_ConvTranspose1dWeightBackward, {1, true, kW}},
    {OpKind::Module_ConvTranspose2dWeightBackward, {2, true, kW}},
    {OpKind::Module_ConvTranspose3dWeightBackward, {3, true, kW}},
    {OpKind::Module_ConvTranspose1dBiasBackward, {1, true, kB}},
    {OpKind::Module_ConvTranspose2dBiasBackward, {2, true, kB}},
    {OpKind::Module_ConvTranspose3dBiasBackward, {3, true, kB}},
};

// The kind has the builder's signature (and so is a convolution kind): its rank and role.
Result<ConvKindInfo> conv_kind_for(const Ctx& c, Signature sig) {
  KILN_RETURN_IF_ERROR(check_kind(c, sig, OutKind::Plain));
  const std::optional<ConvKindInfo> k = conv_kind_info(c.kind);
  if (!k) return c.error(ErrorCode::Internal, "a kind of a convolution signature missing from the convolution table");
  return *k;
}

// One value per spatial dim, each at least `min` and within an i64 attribute.
Status check_conv_list(const Ctx& c, const char* what, std::span<const std::uint64_t> v, std::size_t n,
                       std::uint64_t min) {
  if (v.size() != n)
    return c.error(ErrorCode::Invalid,
                   fmt::format("{} {} has {} values, a {}-d convolution takes {}", what, dims(v), v.size(), n, n));
  for (std::uint64_t x : v)
    if (x < min || x > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
      return c.error(ErrorCode::Invalid, fmt::format("{} {}: every value must be at least {} and fit an i64 attribute",
                                                     what, dims(v), min));
  return Status::Ok();
}

// The option lists fit the rank; a transposed convolution's padding_out is below max(stride,
// dilation) per dim, as PyTorch requires: a larger one only appends positions no input reaches.
Status check_conv_options(const Ctx& c, const ConvKindInfo& k, const ConvOptions& o) {
  KILN_RETURN_IF_ERROR(check_conv_list(c, "stride", o.stride, k.rank, 1));
  KILN_RETURN_IF_ERROR(check_conv_list(c, "padding", o.padding, k.rank, 0));
  KILN_RETURN_IF_ERROR(check_conv_list(c, "dilation", o.dilation, k.rank, 1));
  if (!k.transposed && !o.padding_out.empty())
    return c.error(ErrorCode::Invalid,
                   fmt::format("padding_out {} applies to transposed convolutions only", dims(o.padding_out)));
  if (k.transposed) KILN_RETURN_IF_ERROR(check_conv_list(c, "padding_out", o.padding_out, k.rank, 0));
  KILN_RETURN_IF_ERROR(check_spatial_options(c, o.groups));
  if (o.groups > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
    return c.error(ErrorCode::Invalid, fmt::format("groups {} does not fit an i64 attribute", o.groups));
  for (std::size_t i = 0; i < o.padding_out.size(); ++i)
    if (o.padding_out[i] >= std::max(o.stride[i], o.dilation[i]))
      return c.error(ErrorCode::Invalid,
                     fmt::format("padding_out {} must be smaller than the stride {} or the dilation {} (dim {})",
                                 o.padding_out[i], o.stride[i], o.dilation[i], i));
  return Status::Ok();
}

// x and weight of rank n + 2 whose channels fit the groups; the forward's output channels.
Result<std::uint64_t> conv_channels(const Ctx& c, const ConvKindInfo& k, const TensorIr& x, const TensorIr& w,
                                    std::uint64_t groups) {
  KILN_RETURN_IF_ERROR(check_rank(c, x, k.rank + 2, "x"));
  KILN_RETURN_IF_ERROR(check_rank(c, w, k.rank + 2, "weight"));
  const std::uint64_t c_in = x.shape[1];
  if (c_in % groups != 0)
    return c.error(ErrorCode::IncompatibleShapes,
                   fmt::format("x {} has {} channels, not divisible by {} groups", x.to_string(), c_in, groups));
  if (k.transposed) {
    std::uint64_t c_out = 0;
    if (w.shape[0] != c_in)
      return c.error(ErrorCode::IncompatibleShapes,
                     fmt::format("x {} has {} channels, weight {} ([C_in, C_out / groups, k...]) takes {}",
                                 x.to_string(), c_in, w.to_string(), w.shape[0]));
    if (__builtin_mul_overflow(w.shape[1], groups, &c_out))
      return c.error(ErrorCode::Invalid,
                     fmt::format("weight {} x {} groups: the channel count overflows", w.to_string(), groups));
    return c_out;
  }
  if (w.shape[0] % groups != 0)
    return c.error(
        ErrorCode::IncompatibleShapes,
        fmt::format("weight {} has {} output channels, not divisible by {} groups", w.to_string(), w.shape[0], groups));
  if (w.shape[1] != c_in / groups)
    return c.error(ErrorCode::IncompatibleShapes,
                   fmt::format("x {} has {} channels, weight {} ([C_out, C_in / groups, k...]) takes {} per group x {} "
                               "groups",
                               x.to_string(), c_in, w.to_string(), w.shape[1], groups));
  return w.shape[0];
}

// The forward's output, [N, C_out, out...] by the conv or the transposed formula (docs/spec/ir.md §4;
// an output of size 0 or less is an error there).
Result<Shape> conv_forward_shape(const Ctx& c, const ConvKindInfo& k, const TensorIr& x, const TensorIr& w,
                                 const ConvOptions& o) {
  KILN_RETURN_IF_ERROR(check_conv_options(c, k, o));
  KILN_ASSIGN_OR_RETURN(std::uint64_t c_out, conv_channels(c, k, x, w, o.groups));
  Shape shape{x.shape[0], c_out};
  for (std::size_t i = 0; i < k.rank; ++i) {
    const std::uint64_t in = x.shape[2 + i], kernel = w.shape[2 + i];
    Result<std::uint64_t> size =
        k.transposed
            ? shape::conv_transpose_output(in, kernel, o.stride[i], o.padding[i], o.padding_out[i], o.dilation[i])
            : shape::conv_output(in, kernel, o.stride[i], o.padding[i], o.dilation[i]);
    KILN_ASSIGN_OR_RETURN(std::uint64_t n, c.wrap(std::move(size)));
    shape.push_back(n);
  }
  return shape;
}

// [stride..., padding..., padding_out..., dilation..., groups] (padding_out empty unless transposed).
AttrList conv_attrs(const ConvOptions& o) {
  AttrList a;
  for (const std::vector<std::uint64_t>* list : {&o.stride, &o.padding, &o.padding_out, &o.dilation})
    for (std::uint64_t v : *list) a.push_back(attr(v));
  a.push_back(attr(o.groups));
  return a;
}

Result<Operation> conv_forward(const Ctx& c, Signature sig, const TensorIr& x, const TensorIr& weight,
                               const std::optional<TensorIr>& bias, const ConvOptions& o, TensorId out) {
  KILN_ASSIGN_OR_RETURN(ConvKindInfo k, conv_kind_for(c, sig));
  KILN_RETURN_IF_ERROR(check_module_operand(c, x, "x"));
  KILN_RETURN_IF_ERROR(check_same_conv(c, x, weight, bias));
  KILN_ASSIGN_OR_RETURN(Shape shape, conv_forward_shape(c, k, x, weight, o));
  KILN_RETURN_IF_ERROR(check_bias(c, bias, shape[1]));
  return module_op(c, {&x, &weight, bias ? &*bias : nullptr}, std::move(shape), x.dtype, out, conv_attrs(o));
}

// The X or Weight gradient of a convolution, the Weight gradient of a transposed one: output_grad
// is shaped like the forward's output of x and weight.
Result<Operation> conv_gradient(const Ctx& c, Signature sig, const TensorIr& x, const TensorIr& weight,
                                const TensorIr& output_grad, const ConvOptions& o, TensorId out) {
  KILN_ASSIGN_OR_RETURN(ConvKindInfo k, conv_kind_for(c, sig));
  KILN_RETURN_IF_ERROR(check_module_operand(c, x, "x"));
  KILN_RETURN_IF_ERROR(check_module_operand(c, weight, "weight"));
  KILN_RETURN_IF_ERROR(check_module_operand(c, output_grad, "output_grad"));
  KILN_ASSIGN_OR_RETURN(Shape forward, conv_forward_shape(c, k, x, weight, o));
  if (output_grad.shape != forward)
    return c.error(
        output_grad.shape.size() != forward.size() ? ErrorCode::RankMismatch : ErrorCode::IncompatibleShapes,
        fmt::format("output_grad {} must have the forward's output shape {} (x {}, weight {})", output_grad.to_string(),
                    shape_to_string(forward), shape_to_string(x.shape), shape_to_string(weight.shape)));
  Shape shape = k.role == ConvRole::XBackward ? x.shape : weight.shape;
  return module_op(c, {&x, &weight, &output_grad}, std::move(shape), output_grad.dtype, out, conv_attrs(o));
}

}  // namespace

std::optional<ConvKindInfo> conv_kind_info(OpKind kind) {
  for (const ConvKindRow& row : kConvKinds)
    if (row.kind == kind) return row.info;
  return std::nullopt;
}

Result<Operation> conv(OpKind kind, const TensorIr& x, const TensorIr& weight, const std::optional<TensorIr>& bias,
                       const ConvOptions& options, TensorId out) {
  return conv_forward(Ctx{Family::Module, kind}, Signature::Conv, x, weight, bias, options, out);
}

Result<Operation> conv_transpose(OpKind kind, const TensorIr& x, const TensorIr& weight,
                                 const std::optional<TensorIr>& bias, const ConvOptions& options, TensorId out) {
  return conv_forward(Ctx{Family::Module, kind}, Signature::ConvTranspose, x, weight, bias, options, out);
}

Result<Operation> conv_backward(OpKind kind, const TensorIr& x, const TensorIr& weight, const TensorIr& output_grad,
                                const ConvOptions& options, TensorId out) {
  return conv_gradient(Ctx{Family::Module, kind}, Signature::ConvBackward, x, weight, output_grad, options, out);
}

Result<Operation> conv_transpose_backward(OpKind kind, const TensorIr& x, const TensorIr& weight,
                                          const TensorIr& output_grad, const ConvOptions& options, TensorId out) {
  return conv_gradient(Ctx{Family::Module, kind}, Signature::ConvTransposeBackward, x, weight, output_grad, options,
                       out);
}

Result<Operation> conv_bias_backward(OpKind kind, const TensorIr& x, const TensorIr& bias, const TensorIr& output_grad,
                                     TensorId out) {
  const Ctx c{Family::Module, kind};
  KILN_ASSIGN_OR_RETURN(ConvKindInfo k, conv_kind_for(c, Signature::ConvBiasBackward));
  KILN_RETURN_IF_ERROR(check_module_operand(c, x, "x"));
  KILN_RETURN_IF_ERROR(check_module_operand(c, bias, "bias"));
  KILN_RETURN_IF_ERROR(check_module_operand(c, output_grad, "output_grad"));
  KILN_RETURN_IF_ERROR(check_rank(c, x, k.rank + 2, "x"));
  KILN_RETURN_IF_ERROR(check_rank(c, output_grad, k.rank + 2, "output_grad"));
  if (output_grad.shape[0] != x.shape[0])
    return c.error(ErrorCode::IncompatibleShapes, fmt::format("output_grad {} and x {} must have the same batch",
                                                              output_grad.to_string(), x.to_string()));
  KILN_RETURN_IF_ERROR(check_vector(c, bias, "bias", output_grad.shape[1], "output_grad's channels, dim 1"));
  return module_op(c, {&x, &bias, &output_grad}, bias.shape, output_grad.dtype, out, {});
}

Result<Operation> conv1d(const TensorIr& x, const TensorIr& weight, const std::optional<TensorIr>& bias,
                         const Conv1dOptions& options, TensorId out) {
  return conv(OpKind::Module_Conv1d, x, weight, bias, conv_options(options), out);
}

Result<Operation> conv3d(const TensorIr& x, const TensorIr& weight, const std::optional<TensorIr>& bias,
                         const Conv3dOptions& options, TensorId out) {
  return conv(OpKind::Module_Conv3d, x, weight, bias, conv_options(options), out);
}

Result<Operation> conv_transpose2d(const TensorIr& x, const TensorIr& weight, const std::optional<TensorIr>& bias,
                                   const ConvTranspose2dOptions& options, TensorId out) {
  return conv_transpose(OpKind::Module_ConvTranspose2d, x, weight, bias, conv_options(options), out);
}

Result<Operation> conv_transpose3d(const TensorIr& x, const TensorIr& weight, const std::optional<TensorIr>& bias,
                                   const ConvTranspose3dOptions& options, TensorId out) {
  return conv_transpose(OpKind::Module_ConvTranspose3d, x, weight, bias, conv_options(options), out);
}

// ---- Deformable convolution (docs/spec/ir.md §5.8, §6.3)

namespace {
// The forward's kernel taps (kh · kw) and output shape [N, C_out, H', W'].
struct DeformGeometry {
  std::uint64_t taps = 0;
  Shape out;
};

Status check_deform_options(const Ctx& c, const DeformableConv2dOptions& o) {
  KILN_RETURN_IF_ERROR(check_conv_list(c, "stride", o.stride, 2, 1));
  KILN_RETURN_IF_ERROR(check_conv_list(c, "padding", o.padding, 2, 0));
  KILN_RETURN_IF_ERROR(check_conv_list(c, "dilation", o.dilation, 2, 1));
  if (o.weight_groups == 0 || o.offset_groups == 0)
    return c.error(ErrorCode::Invalid, fmt::format("weight_groups {} and offset_groups {} must be at least 1",
                                                   o.weight_groups, o.offset_groups));
  return check_attr_range(c, {o.weight_groups, o.offset_groups}, "weight_groups or offset_groups");
}

// x [N, C_in, H, W] and weight [C_out, C_in / wg, kh, kw] (float, rank 4), C_in and C_out divisible
// by wg and C_in by og; the output by the conv formula.
Result<DeformGeometry> deform_geometry(const Ctx& c, const TensorIr& x, const TensorIr& weight,
                                       const DeformableConv2dOptions& o) {
  KILN_RETURN_IF_ERROR(check_module_operand(c, x, "x"));
  KILN_RETURN_IF_ERROR(check_module_operand(c, weight, "weight"));
  KILN_RETURN_IF_ERROR(check_rank(c, x, 4, "x"));
  KILN_RETURN_IF_ERROR(check_rank(c, weight, 4, "weight"));
  KILN_RETURN_IF_ERROR(check_deform_options(c, o));
  const std::uint64_t cin = x.shape[1], cout = weight.shape[0], wg = o.weight_groups;
  if (cin % wg != 0 || cout % wg != 0 || weight.shape[1] != cin / wg)
    return c.error(ErrorCode::IncompatibleShapes,
                   fmt::format("x {} has {} channels, weight {} ([C_out, C_in / weight_groups, kh, kw]) does not fit "
                               "{} weight groups",
                               x.to_string(), cin, weight.to_string(), wg));
  if (cin % o.offset_groups != 0)
    return c.error(ErrorCode::IncompatibleShapes, fmt::format("x {} has {} channels, not divisible by {} offset groups",
                                                              x.to_string(), cin, o.offset_groups));
  DeformGeometry g;
  g.out = Shape{x.shape[0], cout};
  for (std::size_t i = 0; i < 2; ++i) {
    KILN_ASSIGN_OR_RETURN(std::uint64_t size, c.wrap(shape::conv_output(x.shape[2 + i], weight.shape[2 + i],
                                                                        o.stride[i], o.padding[i], o.dilation[i])));
    g.out.push_back(size);
  }
  if (__builtin_mul_overflow(weight.shape[2], weight.shape[3], &g.taps))
    return c.error(ErrorCode::Invalid, fmt::format("weight {}: kh · kw overflows", weight.to_string()));
  return g;
}

// offset [N, 2·og·taps, H', W'] and mask? [N, og·taps, H', W'] over the output's plane, bias? [C_out].
Status check_deform_operands(const Ctx& c, const TensorIr& offset, const std::optional<TensorIr>& mask,
                             const std::optional<TensorIr>& bias, const DeformGeometry& g, std::uint64_t og) {
  std::uint64_t per_group = 0, offsets = 0;
  if (__builtin_mul_overflow(og, g.taps, &per_group) || __builtin_mul_overflow(per_group, 2, &offsets))
    return c.error(ErrorCode::Invalid,
                   fmt::format("{} offset groups of {} taps: the channel count overflows", og, g.taps));
  const Shape want_offset{g.out[0], offsets, g.out[2], g.out[3]};
  if (offset.shape != want_offset)
    return c.error(
        offset.shape.size() != 4 ? ErrorCode::RankMismatch : ErrorCode::IncompatibleShapes,
        fmt::format("offset {} must have shape {} (2 · offset_groups · kh · kw channels over the output plane)",
                    offset.to_string(), shape_to_string(want_offset)));
  const Shape want_mask{g.out[0], per_group, g.out[2], g.out[3]};
  if (mask && mask->shape != want_mask)
    return c.error(mask->shape.size() != 4 ? ErrorCode::RankMismatch : ErrorCode::IncompatibleShapes,
                   fmt::format("mask {} must have shape {} (offset_groups · kh · kw channels over the output plane)",
                               mask->to_string(), shape_to_string(want_mask)));
  return check_bias(c, bias, g.out[1]);
}

// same(x, weight, mask?, bias?) (§6.3; the forward adds offset).
Status check_deform_dtypes(const Ctx& c, const TensorIr& x, const TensorIr& weight, const std::optional<TensorIr>& mask,
                           const std::optional<TensorIr>& bias) {
  KILN_RETURN_IF_ERROR(check_same_conv(c, x, weight, bias));
  if (mask) KILN_RETURN_IF_ERROR(check_same(c, x, "x", *mask, "mask"));
  return Status::Ok();
}

AttrList deform_attrs(bool mask, bool bias, const DeformableConv2dOptions& o) {
  const std::int64_t present = (mask ? kPresentMask : 0) | (bias ? kPresentBias : 0);
  return {present,
          attr(o.stride[0]),
          attr(o.stride[1]),
          attr(o.padding[0]),
          attr(o.padding[1]),
          attr(o.dilation[0]),
          attr(o.dilation[1]),
          attr(o.weight_groups),
          attr(o.offset_groups)};
}
}  // namespace

Result<Operation> deformable_conv2d(const TensorIr& x, const TensorIr& offset, const TensorIr& weight,
                                    const std::optional<TensorIr>& mask, const std::optional<TensorIr>& bias,
                                    const DeformableConv2dOptions& options, TensorId out) {
  const Ctx c{Family::Module, OpKind::Module_DeformableConv2d};
  KILN_ASSIGN_OR_RETURN(DeformGeometry g, deform_geometry(c, x, weight, options));
  KILN_RETURN_IF_ERROR(check_same(c, x, "x", offset, "offset"));
  KILN_RETURN_IF_ERROR(check_deform_dtypes(c, x, weight, mask, bias));
  KILN_RETURN_IF_ERROR(check_deform_operands(c, offset, mask, bias, g, options.offset_groups));
  return module_op(c, {&x, &offset, &weight, mask ? &*mask : nullptr, bias ? &*bias : nullptr}, std::move(g.out),
                   x.dtype, out, deform_attrs(mask.has_value(), bias.has_value(), options));
}

Result<Operation> deformable_conv2d_backward(const TensorIr& x, const TensorIr& offset, const TensorIr& weight,
                                             const std::optional<TensorIr>& mask, const std::optional<TensorIr>& bias,
                                             const TensorIr& out_grad, const DeformableConv2dOptions& options,
                                             const DeformableConv2dGradIds& ids) {
  const Ctx c{Family::Module, OpKind::Module_DeformableConv2dBackward};
  KILN_ASSIGN_OR_RETURN(DeformGeometry g, deform_geometry(c, x, weight, options));
  KILN_RETURN_IF_ERROR(check_module_operand(c, offset, "offset"));
  KILN_RETURN_IF_ERROR(check_deform_dtypes(c, x, weight, mask, bias));
  KILN_RETURN_IF_ERROR(check_deform_operands(c, offset, mask, bias, g, options.offset_groups));
  KILN_RETURN_IF_ERROR(check_module_operand(c, out_grad, "out_grad"));
  if (out_grad.shape != g.out)
    return c.error(out_grad.shape.size() != 4 ? ErrorCode::RankMismatch : ErrorCode::IncompatibleShapes,
                   fmt::format("out_grad {} must have the forward's output shape {}", out_grad.to_string(),
                               shape_to_string(g.out)));
  if (mask.has_value() != ids.mask_grad.has_value() || bias.has_value() != ids.bias_grad.has_value())
    return c.error(ErrorCode::Invalid, "mask_grad and bias_grad are outputs exactly when mask and bias are inputs");
  std::vector<OutputSpec> outs{{ids.input_grad, x.shape, x.dtype},
                               {ids.offset_grad, offset.shape, x.dtype},
                               {ids.weight_grad, weight.shape, x.dtype}};
  if (mask) outs.push_back({*ids.mask_grad, mask->shape, x.dtype});
  if (bias) outs.push_back({*ids.bias_grad, bias->shape, x.dtype});
  return module_op_outputs(c, {&x, &offset, &weight, mask ? &*mask : nullptr, bias ? &*bias : nullptr, &out_grad}, outs,
                           deform_attrs(mask.has_value(), bias.has_value(), options));
}

// ---- Signals (docs/spec/ir.md §5.8, §6.3)

namespace {
// A given n is at least 1 and travels as an i64 attribute (0 stands for "none given").
Status check_fft_n(const Ctx& c, std::optional<std::uint64_t> n) {
  if (!n) return Status::Ok();
  if (*n == 0) return c.error(ErrorCode::Invalid, "n must be at least 1");
  return check_attr_range(c, {*n}, "n");
}
}  // namespace

Result<Operation> rfft(const TensorIr& signal, std::uint64_t dim, std::optional<std::uint64_t> n, TensorId out_re,
                       TensorId out_im) {
  const Ctx c{Family::Module, OpKind::Module_Rfft};
  KILN_RETURN_IF_ERROR(check_module_operand(c, signal, "signal"));
  KILN_RETURN_IF_ERROR(check_axis(c, dim, signal.shape));
  KILN_RETURN_IF_ERROR(check_fft_n(c, n));
  const std::uint64_t points = n.value_or(signal.shape[dim]);
  if (points == 0)
    return c.error(ErrorCode::Invalid,
                   fmt::format("signal {} has no points along dim {} (give n >= 1)", signal.to_string(), dim));
  Shape shape = signal.shape;
  shape[dim] = points / 2 + 1;
  const OutputSpec outs[] = {{out_re, shape, signal.dtype}, {out_im, shape, signal.dtype}};
  return module_op_outputs(c, {&signal}, outs, {attr(dim), attr(n.value_or(0))});
}

Result<Operation> irfft(const TensorIr& input_re, const TensorIr& input_im, std::uint64_t dim,
                        std::optional<std::uint64_t> n, TensorId out_signal) {
  const Ctx c{Family::Module, OpKind::Module_IRfft};
  KILN_RETURN_IF_ERROR(check_module_operand(c, input_re, "input_re"));
  KILN_RETURN_IF_ERROR(check_same(c, input_re, "input_re", input_im, "input_im"));
  if (input_im.shape != input_re.shape)
    return c.error(ErrorCode::IncompatibleShapes, fmt::format("input_im {} must have input_re {}'s shape",
                                                              input_im.to_string(), input_re.to_string()));
  KILN_RETURN_IF_ERROR(check_axis(c, dim, input_re.shape));
  KILN_RETURN_IF_ERROR(check_fft_n(c, n));
  const std::uint64_t len = input_re.shape[dim];
  if (len == 0)
    return c.error(ErrorCode::Invalid, fmt::format("input_re {} has no bins along dim {}", input_re.to_string(), dim));
  // 2 (len − 1) points from a single bin is none: n must then be given.
  const std::uint64_t points = n ? *n : 2 * (len - 1);
  if (points == 0 || (!n && len - 1 > std::numeric_limits<std::uint64_t>::max() / 2))
    return c.error(ErrorCode::Invalid, fmt::format("input_re {} gives {} output points along dim {} (give n >= 1)",
                                                   input_re.to_string(), points, dim));
  Shape shape = input_re.shape;
  shape[dim] = points;
  return module_op(c, {&input_re, &input_im}, std::move(shape), input_re.dtype, out_signal,
                   {attr(dim), attr(n.value_or(0))});
}

// ---- Attention and the CTC loss (docs/spec/ir.md §5.8, §6.3)

namespace {
// query [B, H, Lq, D], key [B, H, Lk, D], value [B, H, Lk, Dv] of one float dtype.
Status check_attention_inputs(const Ctx& c, const TensorIr& q, const TensorIr& k, const TensorIr& v) {
  KILN_RETURN_IF_ERROR(check_module_operand(c, q, "query"));
  KILN_RETURN_IF_ERROR(check_same(c, q, "query", k, "key"));
  KILN_RETURN_IF_ERROR(check_same(c, q, "query", v, "value"));
  KILN_RETURN_IF_ERROR(check_rank(c, q, 4, "query"));
  KILN_RETURN_IF_ERROR(check_rank(c, k, 4, "key"));
  KILN_RETURN_IF_ERROR(check_rank(c, v, 4, "value"));
  const Shape& qs = q.shape;
  if (k.shape[0] != qs[0] || k.shape[1] != qs[1] || k.shape[3] != qs[3])
    return c.error(ErrorCode::IncompatibleShapes, fmt::format("key {} must be [{}, {}, Lk, {}] for query {}",
                                                              k.to_string(), qs[0], qs[1], qs[3], q.to_string()));
  if (v.shape[0] != qs[0] || v.shape[1] != qs[1] || v.shape[2] != k.shape[2])
    return c.error(ErrorCode::IncompatibleShapes,
                   fmt::format("value {} must be [{}, {}, {}, Dv] for query {} and key {}", v.to_string(), qs[0], qs[1],
                               k.shape[2], shape_to_string(qs), shape_to_string(k.shape)));
  return Status::Ok();
}

// mask? / attn_bias?: rank 4, each dim the scores' or 1 (broadcast over it).
Status check_scores_operand(const Ctx& c, const TensorIr& t, const char* what, const Shape& scores) {
  KILN_RETURN_IF_ERROR(check_rank(c, t, 4, what));
  for (std::size_t i = 0; i < 4; ++i)
    if (t.shape[i] != scores[i] && t.shape[i] != 1)
      return c.error(ErrorCode::IncompatibleShapes, fmt::format("{} {} does not broadcast to the scores' shape {}",
                                                                what, t.to_string(), shape_to_string(scores)));
  return Status::Ok();
}

Status check_attention_options(const Ctx& c, const AttentionOptions& o) {
  if (o.scale && !std::isfinite(*o.scale))
    return c.error(ErrorCode::Invalid, fmt::format("scale must be finite, got {}", *o.scale));
  if (o.softcap && !(std::isfinite(*o.softcap) && *o.softcap > 0))
    return c.error(ErrorCode::Invalid, fmt::format("softcap must be finite and positive, got {}", *o.softcap));
  return Status::Ok();
}

AttrList attention_attrs(bool mask, bool bias, const AttentionOptions& o) {
  const std::int64_t present = (mask ? kPresentMask : 0) | (bias ? kPresentBias : 0) | (o.scale ? kPresentScale : 0) |
                               (o.softcap ? kPresentSoftcap : 0);
  return {present, o.is_causal ? 1 : 0, o.scale ? double_bits(*o.scale) : 0, o.softcap ? double_bits(*o.softcap) : 0};
}

// log_probs [T, N, C] (float), targets [N, S], input_lengths [N], target_lengths [N] (integer);
// blank one of the C classes.
Status check_ctc_operands(const Ctx& c, const TensorIr& log_probs, const TensorIr& targets,
                          const TensorIr& input_lengths, const TensorIr& target_lengths, std::uint64_t blank) {
  KILN_RETURN_IF_ERROR(check_module_operand(c, log_probs, "log_probs"));
  KILN_RETURN_IF_ERROR(check_rank(c, log_probs, 3, "log_probs"));
  const std::pair<const TensorIr*, const char*> ints[] = {
      {&targets, "targets"}, {&input_lengths, "input_lengths"}, {&target_lengths, "target_lengths"}};
  for (const auto& [t, name] : ints) {
    KILN_RETURN_IF_ERROR(check_index_dtype(c, t->dtype, name));
    KILN_RETURN_IF_ERROR(check_rank(c, *t, t == &targets ? 2 : 1, name));
    if (t->shape[0] != log_probs.shape[1])
      return c.error(ErrorCode::IncompatibleShapes,
                     fmt::format("{} {} must have the batch N = {} of log_probs {}", name, t->to_string(),
                                 log_probs.shape[1], shape_to_string(log_probs.shape)));
  }
  if (blank >= log_probs.shape[2])
    return c.error(ErrorCode::OutOfBounds, fmt::format("blank {} out of range for the {} classes of log_probs {}",
                                                       blank, log_probs.shape[2], shape_to_string(log_probs.shape)));
  return check_attr_range(c, {blank}, "blank");
}
}  // namespace

Result<Operation> attention(const TensorIr& query, const TensorIr& key, const TensorIr& value,
                            const std::optional<TensorIr>& mask, const std::optional<TensorIr>& attn_bias,
                            const AttentionOptions& options, TensorId out) {
  const Ctx c{Family::Module, OpKind::Module_Attention};
  KILN_RETURN_IF_ERROR(check_attention_inputs(c, query, key, value));
  const Shape& q = query.shape;
  const Shape scores{q[0], q[1], q[2], key.shape[2]};
  if (mask) {
    KILN_RETURN_IF_ERROR(check_bool_dtype(c, mask->dtype, "mask"));
    KILN_RETURN_IF_ERROR(check_scores_operand(c, *mask, "mask", scores));
  }
  if (attn_bias) {
    KILN_RETURN_IF_ERROR(check_same(c, query, "query", *attn_bias, "attn_bias"));
    KILN_RETURN_IF_ERROR(check_scores_operand(c, *attn_bias, "attn_bias", scores));
  }
  KILN_RETURN_IF_ERROR(check_attention_options(c, options));
  return module_op(c, {&query, &key, &value, mask ? &*mask : nullptr, attn_bias ? &*attn_bias : nullptr},
                   Shape{q[0], q[1], q[2], value.shape[3]}, query.dtype, out,
                   attention_attrs(mask.has_value(), attn_bias.has_value(), options));
}

Result<Operation> ctc_loss(const TensorIr& log_probs, const TensorIr& targets, const TensorIr& input_lengths,
                           const TensorIr& target_lengths, std::uint64_t blank, TensorId out) {
  const Ctx c{Family::Module, OpKind::Module_CtcLoss};
  KILN_RETURN_IF_ERROR(check_ctc_operands(c, log_probs, targets, input_lengths, target_lengths, blank));
  return module_op(c, {&log_probs, &targets, &input_lengths, &target_lengths}, Shape{log_probs.shape[1]},
                   log_probs.dtype, out, {attr(blank)});
}

Result<Operation> ctc_loss_backward(const TensorIr& log_probs, const TensorIr& targets, const TensorIr& input_lengths,
                                    const TensorIr& target_lengths, const TensorIr& grad_loss, std::uint64_t blank,
                                    TensorId out) {
  const Ctx c{Family::Module, OpKind::Module_CtcLossBackward};
  KILN_RETURN_IF_ERROR(check_ctc_operands(c, log_probs, targets, input_lengths, target_lengths, blank));
  KILN_RETURN_IF_ERROR(check_module_operand(c, grad_loss, "grad_loss"));
  if (grad_loss.shape != Shape{log_probs.shape[1]})
    return c.error(ErrorCode::IncompatibleShapes,
                   fmt::format("grad_loss {} must have shape [{}] (log_probs {})", grad_loss.to_string(),
                               log_probs.shape[1], shape_to_string(log_probs.shape)));
  return module_op(c, {&log_probs, &targets, &input_lengths, &target_lengths, &grad_loss}, log_probs.shape,
                   log_probs.dtype, out, {attr(blank)});
}

// ---- Lifecycle, custom, collectives

Result<Operation> init(const Shape& shape, DType dtype, TensorId out) {
  const Ctx c{Family::Init, OpKind::Init_Init};
  Operation op = new_op(c, dtype);
  op.tensors.push_back(TensorIr::uninit(out, shape, dtype));
  return finish(c, std::move(op));
}

Result<Operation> custom(std::string id, std::span<const TensorIr> inputs, std::span<const TensorIr> outputs,
                         std::span<const ScalarIr> scalars) {
  const Ctx c{Family::Custom, OpKind::Custom_Custom};
  if (id.empty()) return c.error(ErrorCode::Invalid, "custom op id must not be empty");
  if (inputs.size() > 255)
    return c.error(ErrorCode::Invalid, fmt::format("[{}] {} inputs, at most 255 supported", id, inputs.size()));
  for (const TensorIr& t : outputs)
    if (t.status != TensorStatus::NotInit)
      return c.error(ErrorCode::Invalid, fmt::format("[{}] output {} must have status NotInit, has {}", id,
                                                     t.to_string(), status_name(t.status)));
  Operation op = new_op(c, DType{});
  op.num_inputs = static_cast<std::uint8_t>(inputs.size());
  op.tensors.assign(inputs.begin(), inputs.end());
  op.tensors.insert(op.tensors.end(), outputs.begin(), outputs.end());
  op.scalars.assign(scalars.begin(), scalars.end());
  op.custom_id = std::move(id);
  return finish(c, std::move(op));
}

Result<Operation> drop(const TensorIr& tensor) {
  const Ctx c{Family::Drop, OpKind::Drop_Drop};
  if (tensor.status != TensorStatus::ReadWrite)
    return c.error(ErrorCode::Invalid, fmt::format("{} must have status ReadWrite, has {}", tensor.to_string(),
                                                   status_name(tensor.status)));
  Operation op = new_op(c, DType{});
  op.num_inputs = 1;
  op.tensors.push_back(tensor);
  return finish(c, std::move(op));
}

namespace {

void push_device_ids(AttrList& attrs, std::span<const DeviceId> device_ids) {
  for (const DeviceId& d : device_ids)
    attrs.push_back(static_cast<std::int64_t>((std::uint64_t{d.type} << 16) | d.index));
}

Status check_reduce_operation(const Ctx& c, ReduceOperation op) {
  if (reduce_operation_of(static_cast<std::int64_t>(op))) return Status::Ok();
  return c.error(ErrorCode::Invalid, fmt::format("unknown reduce operation {}", static_cast<std::int64_t>(op)));
}

// AllGather / ReduceScatter: the world is the named ids, and `dim` is one of the tensor's.
Status check_world_and_dim(const Ctx& c, const TensorIr& tensor, std::uint64_t dim,
                           std::span<const DeviceId> device_ids) {
  if (device_ids.empty())
    return c.error(ErrorCode::Invalid, "name the world's device ids (their number sizes the output)");
  return check_axis(c, dim, tensor.shape);
}

}  // namespace

Result<Operation> all_reduce(const TensorIr& tensor, ReduceOperation reduce_op, std::span<const DeviceId> device_ids,
                             TensorId out) {
  const Ctx c{Family::Distributed, OpKind::Distributed_AllReduce};
  KILN_RETURN_IF_ERROR(check_reduce_operation(c, reduce_op));
  AttrList attrs{static_cast<std::int64_t>(reduce_op)};
  push_device_ids(attrs, device_ids);
  return one_to_one(c, tensor, tensor.shape, tensor.dtype, out, std::move(attrs));
}

Result<Operation> broadcast(const TensorIr& tensor, std::uint64_t root, std::span<const DeviceId> device_ids,
                            TensorId out) {
  const Ctx c{Family::Distributed, OpKind::Distributed_Broadcast};
  if (!device_ids.empty() && root >= device_ids.size())
    return c.error(ErrorCode::Invalid,
                   fmt::format("root {} is not one of the {} ranks named", root, device_ids.size()));
  if (root > 0xffff) return c.error(ErrorCode::Invalid, fmt::format("root {} is not a rank", root));
  AttrList attrs{attr(root)};
  push_device_ids(attrs, device_ids);
  return one_to_one(c, tensor, tensor.shape, tensor.dtype, out, std::move(attrs));
}

Result<Operation> all_gather(const TensorIr& tensor, std::uint64_t dim, std::span<const DeviceId> device_ids,
                             TensorId out) {
  const Ctx c{Family::Distributed, OpKind::Distributed_AllGather};
  KILN_RETURN_IF_ERROR(check_world_and_dim(c, tensor, dim, device_ids));
  Shape shape = tensor.shape;
  if (shape[dim] > std::numeric_limits<std::uint64_t>::max() / device_ids.size())
    return c.error(ErrorCode::Invalid, fmt::format("dim {} of {} times {} ranks overflows", dim,
                                                   shape_to_string(tensor.shape), device_ids.size()));
  shape[dim] *= device_ids.size();
  AttrList attrs{attr(dim)};
  push_device_ids(attrs, device_ids);
  return one_to_one(c, tensor, std::move(shape), tensor.dtype, out, std::move(attrs));
}

Result<Operation> reduce_scatter(const TensorIr& tensor, ReduceOperation reduce_op, std::uint64_t dim,
                                 std::span<const DeviceId> device_ids, TensorId out) {
  const Ctx c{Family::Distributed, OpKind::Distributed_ReduceScatter};
  KILN_RETURN_IF_ERROR(check_reduce_operation(c, reduce_op));
  KILN_RETURN_IF_ERROR(check_world_and_dim(c, tensor, dim, device_ids));
  if (tensor.shape[dim] % device_ids.size() != 0)
    return c.error(ErrorCode::Invalid, fmt::format("dim {} of {} does not divide into {} equal parts", dim,
                                                   shape_to_string(tensor.shape), device_ids.size()));
  Shape shape = tensor.shape;
  shape[dim] /= device_ids.size();
  AttrList attrs{static_cast<std::int64_t>(reduce_op), attr(dim)};
  push_device_ids(attrs, device_ids);
  return one_to_one(c, tensor, std::move(shape), tensor.dtype, out, std::move(attrs));
}

Result<Operation> sync_collective() {
  Operation op;
  op.kind = OpKind::Distributed_SyncCollective;
  op.family = Family::Distributed;
  assert(op.validate().ok());
  return op;
}

}  // namespace kiln::ir::build
