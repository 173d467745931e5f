// The shared lowering (lowering.h).
#include "kiln/fusion/lowering.h"

#include <string_view>

namespace kiln::fusion::lowering {

std::optional<Code> code_of(ir::OpKind k) {
  switch (k) {
    case ir::OpKind::Numeric_Add:
    case ir::OpKind::Numeric_AddScalar: return Code::Add;
    case ir::OpKind::Numeric_Sub:
    case ir::OpKind::Numeric_SubScalar: return Code::Sub;
    case ir::OpKind::Numeric_Mul:
    case ir::OpKind::Numeric_MulScalar: return Code::Mul;
    case ir::OpKind::Numeric_Div:
    case ir::OpKind::Numeric_DivScalar: return Code::Div;
    case ir::OpKind::Numeric_Rem:
    case ir::OpKind::Numeric_RemScalar: return Code::Rem;
    case ir::OpKind::Float_Powf:
    case ir::OpKind::Float_PowfScalar: return Code::Pow;
    case ir::OpKind::Int_BitwiseAnd:
    case ir::OpKind::Int_BitwiseAndScalar: return Code::BitAnd;
    case ir::OpKind::Int_BitwiseOr:
    case ir::OpKind::Int_BitwiseOrScalar: return Code::BitOr;
    case ir::OpKind::Int_BitwiseXor:
    case ir::OpKind::Int_BitwiseXorScalar: return Code::BitXor;
    case ir::OpKind::Int_BitwiseLeftShift:
    case ir::OpKind::Int_BitwiseLeftShiftScalar: return Code::Shl;
    case ir::OpKind::Int_BitwiseRightShift:
    case ir::OpKind::Int_BitwiseRightShiftScalar: return Code::Shr;
    case ir::OpKind::Bool_And: return Code::LogicAnd;
    case ir::OpKind::Bool_Or: return Code::LogicOr;
    case ir::OpKind::Bool_Xor: return Code::LogicXor;
    case ir::OpKind::Numeric_ClampMin: return Code::ClampMin;
    case ir::OpKind::Numeric_ClampMax: return Code::ClampMax;
    case ir::OpKind::Base_Equal:
    case ir::OpKind::Base_EqualElem: return Code::Eq;
    case ir::OpKind::Base_NotEqual:
    case ir::OpKind::Base_NotEqualElem: return Code::Ne;
    case ir::OpKind::Numeric_Greater:
    case ir::OpKind::Numeric_GreaterElem: return Code::Gt;
    case ir::OpKind::Numeric_GreaterEqual:
    case ir::OpKind::Numeric_GreaterEqualElem: return Code::Ge;
    case ir::OpKind::Numeric_Lower:
    case ir::OpKind::Numeric_LowerElem: return Code::Lt;
    case ir::OpKind::Numeric_LowerEqual:
    case ir::OpKind::Numeric_LowerEqualElem: return Code::Le;
    case ir::OpKind::Numeric_Abs: return Code::Abs;
    case ir::OpKind::Numeric_Neg: return Code::Neg;
    case ir::OpKind::Numeric_Sign: return Code::Sign;
    case ir::OpKind::Float_Exp: return Code::Exp;
    case ir::OpKind::Float_Log: return Code::Log;
    case ir::OpKind::Float_Log1p: return Code::Log1p;
    case ir::OpKind::Float_Erf: return Code::Erf;
    case ir::OpKind::Float_Sqrt: return Code::Sqrt;
    case ir::OpKind::Float_Cos: return Code::Cos;
    case ir::OpKind::Float_Sin: return Code::Sin;
    case ir::OpKind::Float_Tanh: return Code::Tanh;
    case ir::OpKind::Float_Recip: return Code::Recip;
    case ir::OpKind::Float_Round: return Code::Round;
    case ir::OpKind::Float_Floor: return Code::Floor;
    case ir::OpKind::Float_Ceil: return Code::Ceil;
    case ir::OpKind::Float_Trunc: return Code::Trunc;
    case ir::OpKind::Float_IsNan: return Code::IsNan;
    case ir::OpKind::Float_IsInf: return Code::IsInf;
    case ir::OpKind::Int_BitwiseNot: return Code::BitNot;
    case ir::OpKind::Bool_Not: return Code::Not;
    case ir::OpKind::Base_Cast:
    case ir::OpKind::Float_IntoInt:
    case ir::OpKind::Int_IntoFloat:
    case ir::OpKind::Bool_IntoFloat:
    case ir::OpKind::Bool_IntoInt: return Code::Cast;
    case ir::OpKind::Numeric_Clamp: return Code::Clamp;
    case ir::OpKind::Base_MaskWhere: return Code::MaskWhere;
    case ir::OpKind::Base_MaskFill: return Code::MaskFill;
    case ir::OpKind::Base_Reshape: return Code::Copy;
    case ir::OpKind::Base_Ones:
    case ir::OpKind::Base_Zeros:
    case ir::OpKind::Numeric_Full: return Code::Fill;
    case ir::OpKind::Base_Gather: return Code::Gather;
    case ir::OpKind::Base_Select: return Code::Select;
    case ir::OpKind::Base_Cat: return Code::Cat;
    default: return std::nullopt;
  }
}

bool may_fault(Code c, const ir::DType& compute) {
  return is_indexed(c) || ((c == Code::Div || c == Code::Rem) && compute.is_integral());
}

namespace {

// The operand kinds, counts and dtypes each code needs.
bool operands_fit(const FusedProgram& p, const ProgramBlock& blk, const Instruction& ins, Code k, const Operands& o) {
  auto local_dtype = [&](std::size_t i) { return blk.registers[o.locals[i]]; };
  auto input_dtype = [&](std::size_t i) { return p.inputs[o.inputs[i]].dtype; };
  const ir::DType& compute = ins.compute;
  if (is_binary(k) || is_comparison(k)) {
    const bool scalar_rhs = o.locals.size() == 1 && o.scalars.size() == 1;
    return ((o.locals.size() == 2 && o.scalars.empty()) || scalar_rhs) && o.inputs.empty() &&
           local_dtype(0) == compute && (scalar_rhs || local_dtype(1) == compute) &&
           (is_comparison(k) ? ins.out_dtype.is_bool() : ins.out_dtype == compute);
  }
  if (is_unary(k)) {
    return o.locals.size() == 1 && o.scalars.empty() && o.inputs.empty() && local_dtype(0) == compute &&
           ((k == Code::IsNan || k == Code::IsInf) ? ins.out_dtype.is_bool() : ins.out_dtype == compute);
  }
  switch (k) {
    case Code::Cast: return o.locals.size() == 1 && o.scalars.empty() && o.inputs.empty() && local_dtype(0) == compute;
    case Code::Copy:
      return o.locals.size() == 1 && o.scalars.empty() && o.inputs.empty() && local_dtype(0) == compute &&
             ins.out_dtype == compute;
    case Code::Clamp:
      return o.locals.size() == 1 && o.scalars.size() == 2 && o.inputs.empty() && local_dtype(0) == compute &&
             ins.out_dtype == compute;
    case Code::MaskWhere:
      return o.locals.size() == 3 && o.scalars.empty() && o.inputs.empty() && local_dtype(0) == compute &&
             local_dtype(1).is_bool() && local_dtype(2) == compute && ins.out_dtype == compute;
    case Code::MaskFill:
      return o.locals.size() == 2 && o.scalars.size() == 1 && o.inputs.empty() && local_dtype(0) == compute &&
             local_dtype(1).is_bool() && ins.out_dtype == compute;
    case Code::Fill:
      return o.locals.empty() && o.inputs.empty() && ins.out_dtype == compute &&
             o.scalars.size() == (ins.op == ir::OpKind::Numeric_Full ? 1u : 0u);
    case Code::Gather:
    case Code::Select:
      return o.locals.empty() && o.scalars.empty() && o.inputs.size() == 2 && ins.attrs.size() == 1 &&
             input_dtype(0) == compute && input_dtype(1).is_integral() && ins.out_dtype == compute;
    case Code::Cat: {
      bool ok = o.locals.empty() && o.scalars.empty() && !o.inputs.empty() && ins.attrs.size() == 1 &&
                ins.out_dtype == compute;
      for (std::size_t i = 0; i < o.inputs.size(); ++i) ok = ok && input_dtype(i) == compute;
      return ok;
    }
    default: return false;
  }
}

}  // namespace

std::string lower_instruction(const FusedProgram& p, const ProgramBlock& blk, const Instruction& ins, Lowered& out) {
  const std::optional<Code> code = code_of(ins.op);
  const std::string_view variant = ir::op_info(ins.op).variant;
  if (!code) return "instruction " + std::string(variant);
  if (ins.out >= blk.registers.size() || !(blk.registers[ins.out] == ins.out_dtype)) return "instruction output";
  Operands o;
  for (const Operand& operand : ins.operands) {
    switch (operand.kind) {
      case OperandKind::Local:
        if (operand.index >= blk.registers.size()) return "operand register";
        o.locals.push_back(operand.index);
        break;
      case OperandKind::Input:
        if (operand.index >= p.inputs.size() || p.inputs[operand.index].role != InputRole::Indexed)
          return "input operand";
        o.inputs.push_back(operand.index);
        break;
      case OperandKind::Scalar: o.scalars.push_back(operand.index); break;
    }
  }
  if (!operands_fit(p, blk, ins, *code, o)) return "operands of " + std::string(variant);
  out.code = *code;
  out.operands = std::move(o);
  return {};
}

bool dtype_supported(Code k, const ir::DType& compute) {
  const bool fl = compute.is_float();
  const bool is_bool = compute.is_bool();
  const bool is_int = compute.is_integral();
  switch (k) {
    case Code::Add:
    case Code::Sub:
    case Code::Mul:
    case Code::Div:
    case Code::Rem:
    case Code::ClampMin:
    case Code::ClampMax:
    case Code::Clamp: return !is_bool;
    case Code::Pow:
    case Code::Exp:
    case Code::Log:
    case Code::Log1p:
    case Code::Erf:
    case Code::Sqrt:
    case Code::Cos:
    case Code::Sin:
    case Code::Tanh:
    case Code::Recip:
    case Code::Round:
    case Code::Floor:
    case Code::Ceil:
    case Code::Trunc:
    case Code::IsNan:
    case Code::IsInf: return fl;
    case Code::BitAnd:
    case Code::BitOr:
    case Code::BitXor:
    case Code::Shl:
    case Code::Shr:
    case Code::BitNot: return is_int;
    case Code::LogicAnd:
    case Code::LogicOr:
    case Code::LogicXor:
    case Code::Not: return is_bool;
    case Code::Abs:
    case Code::Neg:
    case Code::Sign: return !is_bool;
    default: return true;
  }
}

}  // namespace kiln::fusion::lowering
