// Single operations as one-op fused programs (kiln/fusion/single_op.h): shared by the CPU fast
// executor and the CUDA backend, so that one compiled form per structure serves unfused ops too.
#include "kiln/fusion/single_op.h"

#include "kiln/fusion/trace_fuser.h"
#include "kiln/ir/op_table.h"

namespace kiln::fusion {

using ir::OpKind;
using ir::TensorStatus;

namespace {

bool family_fits(const ir::Operation& op, ir::DType d) {
  bool ok = false;
  switch (op.family) {
    case ir::Family::BaseFloat:
    case ir::Family::NumericFloat:
    case ir::Family::Float: ok = d.is_float(); break;
    case ir::Family::BaseInt:
    case ir::Family::NumericInt:
    case ir::Family::Int: ok = d.is_integral(); break;
    case ir::Family::BaseBool:
    case ir::Family::Bool: ok = d.is_bool(); break;
    default: return false;
  }
  if (ir::family_carries_dtype(op.family)) ok = ok && op.dtype == d;
  return ok;
}

bool same_dtype_shape(const ir::TensorIr& a, const ir::Shape& shape, ir::DType d) {
  return a.shape == shape && a.dtype == d;
}

// The parts of a single-output op that the eligibility checks read.
struct SingleOp {
  const ir::Operation& op;
  const ir::OpInfo& info;
  std::span<const ir::TensorIr> in;
  const ir::TensorIr& out;

  // Comparisons produce bool, every other op the dtype it computes in.
  bool out_dtype_ok(ir::DType operand) const {
    return info.has(ir::kComparison) ? out.dtype.is_bool() : out.dtype == operand;
  }
};

// Unary, binary, scalar, clamp and mask ops: operand dtypes and the broadcast output shape.
bool elementwise_eligible(const SingleOp& s) {
  const ir::Operation& op = s.op;
  const auto in = s.in;
  const ir::TensorIr& out = s.out;
  switch (s.info.signature) {
    case ir::Signature::Unary:
      return in.size() == 1 && family_fits(op, in[0].dtype) && out.shape == in[0].shape && s.out_dtype_ok(in[0].dtype);
    case ir::Signature::Binary: {
      if (in.size() != 2 || !(in[0].dtype == in[1].dtype) || !family_fits(op, in[0].dtype)) return false;
      Result<ir::Shape> shape = ir::shape::broadcast(in[0].shape, in[1].shape);
      return shape.ok() && *shape == out.shape && s.out_dtype_ok(in[0].dtype);
    }
    case ir::Signature::Scalar:
      return in.size() == 1 && op.scalars.size() == 1 && family_fits(op, in[0].dtype) && out.shape == in[0].shape &&
             s.out_dtype_ok(in[0].dtype);
    case ir::Signature::Clamp:
      return in.size() == 1 && op.scalars.size() == 2 && !in[0].dtype.is_bool() && family_fits(op, in[0].dtype) &&
             same_dtype_shape(out, in[0].shape, in[0].dtype);
    case ir::Signature::MaskWhere: {
      if (in.size() != 3 || !in[1].dtype.is_bool() || !(in[0].dtype == in[2].dtype) || !family_fits(op, in[0].dtype))
        return false;
      const ir::Shape shapes[] = {in[0].shape, in[1].shape, in[2].shape};
      Result<ir::Shape> shape = ir::shape::broadcast_many(shapes);
      return shape.ok() && same_dtype_shape(out, *shape, in[0].dtype);
    }
    case ir::Signature::MaskFill: {
      if (in.size() != 2 || op.scalars.size() != 1 || !in[1].dtype.is_bool() || !family_fits(op, in[0].dtype))
        return false;
      Result<ir::Shape> shape = ir::shape::broadcast(in[0].shape, in[1].shape);
      return shape.ok() && same_dtype_shape(out, *shape, in[0].dtype);
    }
    default: return false;
  }
}

// Casts: the source and target dtype classes each cast kind converts between.
bool cast_eligible(const SingleOp& s) {
  const ir::Operation& op = s.op;
  const auto in = s.in;
  if (in.size() != 1 || s.out.shape != in[0].shape) return false;
  const ir::DType from = in[0].dtype, to = s.out.dtype;
  switch (op.kind) {
    case OpKind::Base_Cast:
      return family_fits(op, from) && (from.is_float()      ? to.is_float()
                                       : from.is_integral() ? to.is_integral()
                                                            : to.is_bool());
    case OpKind::Float_IntoInt: return family_fits(op, from) && to.is_integral();
    case OpKind::Int_IntoFloat: return family_fits(op, from) && to.is_float();
    case OpKind::Bool_IntoFloat: return from.is_bool() && to.is_float();
    case OpKind::Bool_IntoInt: return from.is_bool() && to.is_integral();
    default: return false;
  }
}

// Creation ops: full, ones and zeros.
bool creation_eligible(const SingleOp& s) {
  const ir::Operation& op = s.op;
  switch (s.info.signature) {
    case ir::Signature::Full:
      return op.kind == OpKind::Numeric_Full && s.in.empty() && op.scalars.size() == 1 && family_fits(op, s.out.dtype);
    case ir::Signature::Creation:
      return (op.kind == OpKind::Base_Ones || op.kind == OpKind::Base_Zeros) && s.in.empty() &&
             family_fits(op, s.out.dtype);
    default: return false;
  }
}

// Indexed reads: gather, select and cat, with their dim attribute and index shapes.
bool indexing_eligible(const SingleOp& s) {
  const ir::Operation& op = s.op;
  const auto in = s.in;
  const ir::TensorIr& out = s.out;
  switch (s.info.signature) {
    case ir::Signature::Gather: {
      if (in.size() != 2 || op.attrs.size() != 1 || !in[1].dtype.is_integral() || !family_fits(op, in[0].dtype))
        return false;
      const std::size_t r = in[0].shape.size();
      if (op.attrs[0] < 0 || static_cast<std::size_t>(op.attrs[0]) >= r || in[1].shape.size() != r) return false;
      for (std::size_t d = 0; d < r; ++d)
        if (d != static_cast<std::size_t>(op.attrs[0]) && in[1].shape[d] > in[0].shape[d]) return false;
      return same_dtype_shape(out, in[1].shape, in[0].dtype);
    }
    case ir::Signature::Select: {
      if (in.size() != 2 || op.attrs.size() != 1 || !in[1].dtype.is_integral() || in[1].shape.size() != 1 ||
          !family_fits(op, in[0].dtype))
        return false;
      const std::size_t r = in[0].shape.size();
      if (op.attrs[0] < 0 || static_cast<std::size_t>(op.attrs[0]) >= r) return false;
      ir::Shape expected = in[0].shape;
      expected[static_cast<std::size_t>(op.attrs[0])] = in[1].shape[0];
      return same_dtype_shape(out, expected, in[0].dtype);
    }
    case ir::Signature::Cat: {
      if (in.empty() || op.attrs.size() != 1 || op.attrs[0] < 0 || !family_fits(op, in[0].dtype)) return false;
      std::vector<ir::Shape> shapes;
      for (const ir::TensorIr& t : in) {
        if (!(t.dtype == in[0].dtype)) return false;
        shapes.push_back(t.shape);
      }
      Result<ir::Shape> shape = ir::shape::cat(shapes, static_cast<std::uint64_t>(op.attrs[0]));
      return shape.ok() && same_dtype_shape(out, *shape, in[0].dtype);
    }
    default: return false;
  }
}

// Layout ops: swap_dims and reshape.
bool layout_eligible(const SingleOp& s) {
  const ir::Operation& op = s.op;
  const auto in = s.in;
  const ir::TensorIr& out = s.out;
  switch (s.info.signature) {
    case ir::Signature::SwapDims: {
      if (in.size() != 1 || op.attrs.size() != 2 || op.attrs[0] < 0 || op.attrs[1] < 0) return false;
      Result<ir::Shape> shape = ir::shape::swapped(in[0].shape, static_cast<std::uint64_t>(op.attrs[0]),
                                                   static_cast<std::uint64_t>(op.attrs[1]));
      return shape.ok() && same_dtype_shape(out, *shape, in[0].dtype);
    }
    case ir::Signature::ShapeOp:
      return op.kind == OpKind::Base_Reshape && in.size() == 1 && out.dtype == in[0].dtype &&
             ir::num_elements(out.shape) == ir::num_elements(in[0].shape);
    default: return false;
  }
}

// Reductions: over one dim (kept as size 1) or the whole tensor (output [1]).
bool reduction_eligible(const SingleOp& s) {
  const ir::Operation& op = s.op;
  const auto in = s.in;
  const ir::TensorIr& out = s.out;
  switch (s.info.signature) {
    case ir::Signature::ReduceDim: {
      if (in.size() != 1 || op.attrs.size() != 2 || op.attrs[1] != 1 || !family_fits(op, in[0].dtype)) return false;
      const std::size_t r = in[0].shape.size();
      if (op.attrs[0] < 0 || static_cast<std::size_t>(op.attrs[0]) >= r) return false;
      ir::Shape expected = in[0].shape;
      expected[static_cast<std::size_t>(op.attrs[0])] = 1;
      if (out.shape != expected) return false;
      if (s.info.has(ir::kIndexOutput)) return out.dtype.is_integral();
      return s.out_dtype_ok(in[0].dtype);
    }
    case ir::Signature::Reduce:
      return in.size() == 1 && family_fits(op, in[0].dtype) && out.shape == ir::Shape{1} && s.out_dtype_ok(in[0].dtype);
    default: return false;
  }
}

// Float matmul: float operands and the matmul output shape.
bool matmul_eligible(const SingleOp& s) {
  const auto in = s.in;
  if (s.op.kind != OpKind::Float_Matmul || in.size() != 2 || !in[0].dtype.is_float() || !in[1].dtype.is_float() ||
      !s.out.dtype.is_float())
    return false;
  Result<ir::Shape> shape = ir::shape::matmul_output(in[0].shape, in[1].shape);
  return shape.ok() && *shape == s.out.shape;
}

}  // namespace

// The checks the reference executor makes before running an op of these signatures: the fast
// path only runs ops the reference would run, so errors always come from the reference.
bool single_op_eligible(const ir::Operation& op, std::size_t max_rank) {
  if (!op.validate().ok()) return false;
  for (const ir::TensorIr& t : op.nodes())
    if (t.dtype.is_quantized() || t.shape.size() > max_rank) return false;
  if (op.outputs().size() != 1) return false;
  const SingleOp s{op, op.info(), op.inputs(), op.outputs()[0]};
  switch (s.info.signature) {
    case ir::Signature::Unary:
    case ir::Signature::Binary:
    case ir::Signature::Scalar:
    case ir::Signature::Clamp:
    case ir::Signature::MaskWhere:
    case ir::Signature::MaskFill: return elementwise_eligible(s);
    case ir::Signature::Cast: return cast_eligible(s);
    case ir::Signature::Full:
    case ir::Signature::Creation: return creation_eligible(s);
    case ir::Signature::Gather:
    case ir::Signature::Select:
    case ir::Signature::Cat: return indexing_eligible(s);
    case ir::Signature::SwapDims:
    case ir::Signature::ShapeOp: return layout_eligible(s);
    case ir::Signature::ReduceDim:
    case ir::Signature::Reduce: return reduction_eligible(s);
    case ir::Signature::Matmul: return matmul_eligible(s);
    default: return false;
  }
}

// The dim reduction a whole-tensor reduction is (over a [n] view of the input).
namespace {

std::optional<OpKind> dim_kind_of(OpKind k) {
  switch (k) {
    case OpKind::Numeric_Sum: return OpKind::Numeric_SumDim;
    case OpKind::Numeric_Mean: return OpKind::Numeric_MeanDim;
    case OpKind::Numeric_Prod: return OpKind::Numeric_ProdDim;
    case OpKind::Numeric_Max: return OpKind::Numeric_MaxDim;
    case OpKind::Numeric_Min: return OpKind::Numeric_MinDim;
    case OpKind::Numeric_MaxAbs: return OpKind::Numeric_MaxAbsDim;
    case OpKind::Base_All: return OpKind::Base_AllDim;
    case OpKind::Base_Any: return OpKind::Base_AnyDim;
    default: return std::nullopt;
  }
}

}  // namespace

ProgramOutput single_op_output(OneOpTables& t, const ir::TensorIr& out, std::uint32_t block, std::uint32_t local) {
  return ProgramOutput{t.tensor(out), out.dtype, t.shape(out.shape), TensorStatus::NotInit, block, local,
                       true,          true,      std::nullopt};
}

namespace {

// Elementwise, unary, binary, scalar, cast and clamp ops: one block, one instruction over the
// loaded (or, for indexed ops, directly read) inputs and the scalars.
FusedProgram elementwise_program(const ir::Operation& op, OneOpTables& t) {
  const ir::OpInfo& info = op.info();
  const auto in = op.inputs();
  const ir::TensorIr& out = op.outputs()[0];
  FusedProgram p;
  p.len = 1;
  ProgramBlock b;
  b.settings = FuseSettings::elementwise();
  p.kind = ProgramKind::Elementwise;
  b.reference_shape = t.shape(out.shape);
  const bool indexed = info.has(ir::kIndexed);
  Instruction ins;
  ins.op = op.kind;
  ins.family = op.family;
  ins.compute = in.empty() ? out.dtype : in[0].dtype;
  ins.out_dtype = out.dtype;
  ins.attrs = op.attrs;
  for (std::size_t i = 0; i < in.size(); ++i) {
    ProgramInput pi{t.tensor(in[i]), in[i].dtype, t.shape(in[i].shape), in[i].status, InputRole::Plain, std::nullopt};
    if (indexed) {
      pi.role = InputRole::Indexed;
      ins.operands.push_back(Operand::input(static_cast<std::uint32_t>(i)));
    } else {
      const bool bc = in[i].shape != out.shape;
      if (bc) pi.role = InputRole::Broadcast;
      const auto reg = static_cast<std::uint32_t>(b.registers.size());
      b.registers.push_back(in[i].dtype);
      b.loads.push_back(Load{LoadSource::Input, static_cast<std::uint32_t>(i), reg, bc});
      ins.operands.push_back(Operand::local(reg));
    }
    p.inputs.push_back(std::move(pi));
  }
  for (const ir::ScalarIr& s : op.scalars) {
    const std::uint32_t k = t.scalar(s);
    ins.operands.push_back(Operand::scalar(k));
    p.scalars.push_back(k);
  }
  ins.out = static_cast<std::uint32_t>(b.registers.size());
  b.registers.push_back(out.dtype);
  b.stores.push_back(Store{0, ins.out});
  const std::uint32_t local = ins.out;
  b.instructions.push_back(std::move(ins));
  p.blocks.push_back(std::move(b));
  p.outputs.push_back(single_op_output(t, out, 0, local));
  return p;
}

// swap_dims: one block loading a SwapDims view of the input.
FusedProgram swap_dims_program(const ir::Operation& op, OneOpTables& t) {
  const auto in = op.inputs();
  const ir::TensorIr& out = op.outputs()[0];
  FusedProgram p;
  p.len = 1;
  ProgramBlock b;
  b.settings = FuseSettings::elementwise();
  p.kind = ProgramKind::Elementwise;
  b.reference_shape = t.shape(out.shape);
  p.inputs.push_back(
      ProgramInput{t.tensor(in[0]), in[0].dtype, t.shape(in[0].shape), in[0].status, InputRole::Plain, std::nullopt});
  ViewSpec v{OpKind::Base_SwapDims, 0, op.attrs[0], op.attrs[1], b.reference_shape};
  p.inputs.push_back(
      ProgramInput{p.inputs[0].tensor, in[0].dtype, p.inputs[0].shape, in[0].status, InputRole::View, v});
  b.registers.push_back(out.dtype);
  b.loads.push_back(Load{LoadSource::Input, 1, 0, false});
  b.stores.push_back(Store{0, 0});
  p.blocks.push_back(std::move(b));
  p.outputs.push_back(single_op_output(t, out, 0, 0));
  return p;
}

// Dim and whole-tensor reductions: a load block, then a reduce-write block; nullopt when a
// whole-tensor reduction has no dim form.
std::optional<FusedProgram> reduction_program(const ir::Operation& op, OneOpTables& t) {
  const ir::OpInfo& info = op.info();
  const auto in = op.inputs();
  const ir::TensorIr& out = op.outputs()[0];
  FusedProgram p;
  p.len = 1;
  ProgramBlock b;
  b.settings = FuseSettings::elementwise();
  const bool full = info.has(ir::kFullReduce);
  const std::optional<OpKind> kind = full ? dim_kind_of(op.kind) : std::optional<OpKind>(op.kind);
  if (!kind) return std::nullopt;
  p.kind = ProgramKind::Reduce;
  p.captured_op_position = 0;
  p.inputs.push_back(
      ProgramInput{t.tensor(in[0]), in[0].dtype, t.shape(in[0].shape), in[0].status, InputRole::Plain, std::nullopt});
  ir::Shape reduce_in = p.inputs[0].shape;
  std::uint32_t load_input = 0;
  std::int64_t axis = full ? 0 : op.attrs[0];
  if (full) {
    // Read the input as a [n] view.
    reduce_in = ir::Shape{t.dim(ir::num_elements(in[0].shape))};
    ViewSpec v{OpKind::Base_Reshape, 0, 0, 0, reduce_in};
    p.inputs.push_back(
        ProgramInput{p.inputs[0].tensor, in[0].dtype, p.inputs[0].shape, in[0].status, InputRole::View, v});
    load_input = 1;
  }
  b.reference_shape = reduce_in;
  b.registers.push_back(in[0].dtype);
  b.loads.push_back(Load{LoadSource::Input, load_input, 0, false});
  p.blocks.push_back(std::move(b));
  ProgramBlock e;
  e.settings = FuseSettings::reduce_write();
  e.reference_shape = t.shape(out.shape);
  e.registers.push_back(out.dtype);
  e.reduction = Reduction{*kind, op.family, axis, 0, 0, in[0].dtype, reduce_accumulator(*kind, in[0].dtype), out.dtype};
  e.stores.push_back(Store{0, 0});
  p.blocks.push_back(std::move(e));
  p.outputs.push_back(single_op_output(t, out, 1, 0));
  return p;
}

// Float matmul: the matmul over two plain inputs and an epilogue block storing its result.
FusedProgram matmul_program(const ir::Operation& op, OneOpTables& t) {
  const auto in = op.inputs();
  const ir::TensorIr& out = op.outputs()[0];
  FusedProgram p;
  p.len = 1;
  ProgramBlock b;
  p.kind = ProgramKind::Matmul;
  for (std::size_t i = 0; i < 2; ++i)
    p.inputs.push_back(
        ProgramInput{t.tensor(in[i]), in[i].dtype, t.shape(in[i].shape), in[i].status, InputRole::Plain, std::nullopt});
  b.settings = FuseSettings::matmul_epilogue();
  b.reference_shape = t.shape(out.shape);
  b.registers.push_back(out.dtype);
  b.stores.push_back(Store{0, 0});
  p.blocks.push_back(std::move(b));
  p.matmul = MatmulSpec{0, 1, 0, op.dtype, out.dtype};
  p.outputs.push_back(single_op_output(t, out, 0, 0));
  return p;
}

}  // namespace

// Builds the one-op program of an eligible op; nullopt when no compiled form applies.
std::optional<FusedProgram> synthesize_single_op(const ir::Operation& op, OneOpTables& t) {
  const ir::OpInfo& info = op.info();
  if (info.has(ir::kElementwise) || info.signature == ir::Signature::Unary || info.signature == ir::Signature::Binary ||
      info.signature == ir::Signature::Scalar || info.signature == ir::Signature::Cast ||
      op.kind == OpKind::Numeric_ClampMin || op.kind == OpKind::Numeric_ClampMax)
    return elementwise_program(op, t);
  if (op.kind == OpKind::Base_SwapDims) return swap_dims_program(op, t);
  if (info.has(ir::kReduceDim) || info.has(ir::kFullReduce)) return reduction_program(op, t);
  if (op.kind == OpKind::Float_Matmul) return matmul_program(op, t);
  return std::nullopt;
}

}  // namespace kiln::fusion
