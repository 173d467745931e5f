// The shared lowering (fusion/lowering.h): codes of op kinds, the operand checks every backend
// relies on, and the dtype classes each code covers.
#include "kiln/fusion/lowering.h"

#include <gtest/gtest.h>

namespace kiln::fusion::lowering {
namespace {

using ir::OpKind;
namespace dt = ir::dtypes;

// A program with one block: registers r0 = f32, r1 = f32, r2 = bool, r3 = f32 (the result), and
// two indexed inputs (f32 values, i64 indices).
struct OneBlock {
  FusedProgram program;
  OneBlock() {
    program.inputs.resize(2);
    program.inputs[0].dtype = dt::f32;
    program.inputs[0].role = InputRole::Indexed;
    program.inputs[1].dtype = dt::i64;
    program.inputs[1].role = InputRole::Indexed;
    program.blocks.resize(1);
    program.blocks[0].registers = {dt::f32, dt::f32, ir::DType::boolean(ir::BoolStore::Native), dt::f32};
  }
  std::string lower(const Instruction& ins, Lowered& out) const {
    return lower_instruction(program, program.blocks[0], ins, out);
  }
};

Instruction instr(OpKind op, ir::DType compute, ir::DType out_dtype, OperandList operands, std::uint32_t out = 3) {
  Instruction ins;
  ins.op = op;
  ins.compute = compute;
  ins.out_dtype = out_dtype;
  ins.operands = std::move(operands);
  ins.out = out;
  return ins;
}

TEST(Lowering, VariantsOfOneComputationShareACode) {
  EXPECT_EQ(code_of(OpKind::Numeric_Add), Code::Add);
  EXPECT_EQ(code_of(OpKind::Numeric_AddScalar), Code::Add);
  EXPECT_EQ(code_of(OpKind::Base_Equal), Code::Eq);
  EXPECT_EQ(code_of(OpKind::Base_EqualElem), Code::Eq);
  EXPECT_EQ(code_of(OpKind::Float_Exp), Code::Exp);
  EXPECT_FALSE(code_of(OpKind::Drop_Drop).has_value());
  EXPECT_TRUE(is_binary(Code::Add) && !is_binary(Code::Eq));
  EXPECT_TRUE(is_comparison(Code::Le) && is_unary(Code::Not) && !is_unary(Code::Cast));
}

TEST(Lowering, ABinaryOpTakesTwoRegistersOrARegisterAndAScalar) {
  const OneBlock b;
  Lowered l;
  EXPECT_EQ(b.lower(instr(OpKind::Numeric_Add, dt::f32, dt::f32, {Operand::local(0), Operand::local(1)}), l), "");
  EXPECT_EQ(l.code, Code::Add);
  EXPECT_EQ(l.operands.locals, (std::vector<std::uint32_t>{0, 1}));
  EXPECT_EQ(b.lower(instr(OpKind::Numeric_AddScalar, dt::f32, dt::f32, {Operand::local(0), Operand::scalar(4)}), l),
            "");
  EXPECT_EQ(l.operands.scalars, (std::vector<std::uint32_t>{4}));
  // One operand, a bool register, an indexed input, a wrong result dtype: not lowered.
  EXPECT_EQ(b.lower(instr(OpKind::Numeric_Add, dt::f32, dt::f32, {Operand::local(0)}), l), "operands of Add");
  EXPECT_EQ(b.lower(instr(OpKind::Numeric_Add, dt::f32, dt::f32, {Operand::local(0), Operand::local(2)}), l),
            "operands of Add");
  EXPECT_EQ(b.lower(instr(OpKind::Numeric_Add, dt::f32, dt::f32, {Operand::local(0), Operand::input(0)}), l),
            "operands of Add");
  EXPECT_EQ(b.lower(instr(OpKind::Numeric_Add, dt::f32, dt::f32, {Operand::local(0), Operand::local(1)}, 2), l),
            "instruction output");
}

TEST(Lowering, ComparisonsProduceBoolAndIndicesAreChecked) {
  const OneBlock b;
  Lowered l;
  const ir::DType boolean = ir::DType::boolean(ir::BoolStore::Native);
  EXPECT_EQ(b.lower(instr(OpKind::Numeric_Greater, dt::f32, boolean, {Operand::local(0), Operand::local(1)}, 2), l),
            "");
  EXPECT_EQ(l.code, Code::Gt);
  EXPECT_EQ(b.lower(instr(OpKind::Numeric_Greater, dt::f32, dt::f32, {Operand::local(0), Operand::local(1)}), l),
            "operands of Greater");
  EXPECT_EQ(b.lower(instr(OpKind::Float_Exp, dt::f32, dt::f32, {Operand::local(9)}), l), "operand register");
  EXPECT_EQ(b.lower(instr(OpKind::Float_Exp, dt::f32, dt::f32, {Operand::input(7)}), l), "input operand");
  EXPECT_EQ(b.lower(instr(OpKind::Drop_Drop, dt::f32, dt::f32, {}), l), "instruction Drop");
}

TEST(Lowering, GatherReadsTwoIndexedInputsAndMayFault) {
  const OneBlock b;
  Lowered l;
  Instruction g = instr(OpKind::Base_Gather, dt::f32, dt::f32, {Operand::input(0), Operand::input(1)});
  g.attrs = {0};
  EXPECT_EQ(b.lower(g, l), "");
  EXPECT_EQ(l.code, Code::Gather);
  EXPECT_EQ(l.operands.inputs, (std::vector<std::uint32_t>{0, 1}));
  EXPECT_TRUE(may_fault(Code::Gather, dt::f32));
  EXPECT_TRUE(may_fault(Code::Div, dt::i32));
  EXPECT_FALSE(may_fault(Code::Div, dt::f32));
  g.attrs.clear();
  EXPECT_EQ(b.lower(g, l), "operands of Gather");
}

TEST(Lowering, DtypeClassesPerCode) {
  EXPECT_TRUE(dtype_supported(Code::Exp, dt::f16));
  EXPECT_FALSE(dtype_supported(Code::Exp, dt::i32));
  EXPECT_TRUE(dtype_supported(Code::BitAnd, dt::u8));
  EXPECT_FALSE(dtype_supported(Code::BitAnd, dt::f32));
  EXPECT_TRUE(dtype_supported(Code::LogicOr, ir::DType::boolean(ir::BoolStore::Native)));
  EXPECT_FALSE(dtype_supported(Code::Add, ir::DType::boolean(ir::BoolStore::Native)));
  EXPECT_TRUE(dtype_supported(Code::Eq, ir::DType::boolean(ir::BoolStore::Native)));
}

}  // namespace
}  // namespace kiln::fusion::lowering
