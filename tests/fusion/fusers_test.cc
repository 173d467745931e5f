// Tests for the built-in fusers (docs/spec/fusion.md §14.1, §14.4–§14.8; vectors §19.13) on hand-built
// RELATIVE ops with statuses as a real program produces them.
#include "kiln/fusion/fusers.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "kiln/fusion/fused_program.h"
#include "kiln/fusion/fusion_log.h"

namespace kiln::fusion {
namespace {

using ir::Family;
using ir::Operation;
using ir::OpKind;
using ir::Shape;
using ir::TensorIr;
using ir::TensorStatus;

constexpr TensorStatus RO = TensorStatus::ReadOnly;
constexpr TensorStatus RW = TensorStatus::ReadWrite;
constexpr TensorStatus NI = TensorStatus::NotInit;
constexpr std::uint32_t kBindings = 64;  // "mock device with generous bindings" (§19.13)

TensorIr T(std::uint64_t id, Shape shape, TensorStatus s, ir::DType d = ir::dtypes::f32) {
  return TensorIr{ir::TensorId(id), std::move(shape), s, d};
}

Operation make(OpKind kind, Family family, std::vector<TensorIr> inputs, std::vector<TensorIr> outputs,
               std::vector<ir::ScalarIr> scalars = {}, std::vector<std::int64_t> attrs = {},
               ir::DType dtype = ir::dtypes::f32) {
  Operation op;
  op.kind = kind;
  op.family = family;
  op.dtype = dtype;
  op.num_inputs = static_cast<std::uint8_t>(inputs.size());
  for (auto& t : inputs) op.tensors.push_back(t);
  for (auto& t : outputs) op.tensors.push_back(t);
  for (auto& s : scalars) op.scalars.push_back(s);
  for (auto a : attrs) op.attrs.push_back(a);
  const Status st = op.validate();
  EXPECT_TRUE(st.ok()) << (st.ok() ? "" : st.error().to_string());
  return op;
}

Operation add(TensorIr l, TensorIr r, TensorIr o) {
  return make(OpKind::Numeric_Add, Family::NumericFloat, {l, r}, {o});
}
Operation mul(TensorIr l, TensorIr r, TensorIr o) {
  return make(OpKind::Numeric_Mul, Family::NumericFloat, {l, r}, {o});
}
Operation mul_scalar(TensorIr l, std::uint64_t k, TensorIr o) {
  return make(OpKind::Numeric_MulScalar, Family::NumericFloat, {l}, {o}, {ir::ScalarIr::UInt(k)});
}
Operation exp_op(TensorIr in, TensorIr out) { return make(OpKind::Float_Exp, Family::Float, {in}, {out}); }
Operation drop(TensorIr t) { return make(OpKind::Drop_Drop, Family::Drop, {t}, {}); }
Operation ones(TensorIr out) { return make(OpKind::Base_Ones, Family::BaseFloat, {}, {out}); }
Operation reduce_dim(OpKind k, TensorIr in, TensorIr out, std::int64_t axis) {
  return make(k, Family::NumericFloat, {in}, {out}, {}, {axis, 1}, in.dtype);
}
Operation sum_dim(TensorIr in, TensorIr out, std::int64_t axis) {
  return reduce_dim(OpKind::Numeric_SumDim, in, out, axis);
}
Operation matmul(TensorIr l, TensorIr r, TensorIr o) { return make(OpKind::Float_Matmul, Family::Float, {l, r}, {o}); }
Operation swap_dims(TensorIr in, TensorIr out, std::int64_t d1, std::int64_t d2) {
  return make(OpKind::Base_SwapDims, Family::BaseFloat, {in}, {out}, {}, {d1, d2});
}
Operation max_pool2d(TensorIr x, TensorIr out) {
  return make(OpKind::Module_MaxPool2d, Family::Module, {x}, {out}, {}, {2, 2, 2, 2, 0, 0, 1, 1, 0});
}

struct Captured {
  std::shared_ptr<LogCapture> capture = std::make_shared<LogCapture>();
  FusionLog log = FusionLog::to_capture(LogLevel::Full, capture);
};

const FusedOptimization& as_fused(const OptimizationPtr& opt) {
  const auto* f = dynamic_cast<const FusedOptimization*>(opt.get());
  EXPECT_NE(f, nullptr);
  return *f;
}

std::vector<Operation> seed_630() {
  const Shape s{1, 1};
  return {mul(T(0, s, RO), T(1, s, RO), T(2, s, NI)), mul_scalar(T(3, s, RO), 0, T(4, s, NI)),
          add(T(2, s, RW), T(4, s, RW), T(5, s, NI)), exp_op(T(5, s, RW), T(6, s, NI))};
}

// ---- Registry.

TEST(DefaultFusers, RegistryOrder) {
  const FuserList with_rows = default_fusers(FusionLog{}, FuserOptions{.row_fuser = true});
  ASSERT_EQ(with_rows.size(), 6u);
  EXPECT_NE(dynamic_cast<const RowFuser*>(with_rows[5].get()), nullptr);  // after Burn's: ties go to them
  const FuserList list = default_fusers(FusionLog{}, FuserOptions{});
  ASSERT_EQ(list.size(), 5u);
  EXPECT_NE(dynamic_cast<const ElementWiseFuser*>(list[0].get()), nullptr);
  EXPECT_NE(dynamic_cast<const MatmulFuser*>(list[1].get()), nullptr);
  EXPECT_NE(dynamic_cast<const ReduceFuser*>(list[2].get()), nullptr);
  EXPECT_NE(dynamic_cast<const ReduceBroadcastedFuser*>(list[3].get()), nullptr);
  EXPECT_NE(dynamic_cast<const NhwcRelayoutFuser*>(list[4].get()), nullptr);
  for (const auto& f : list) {
    EXPECT_EQ(f->status(), FuserStatus::Open);
    EXPECT_TRUE(f->is_empty());
    EXPECT_FALSE(f->properties().ready);
  }
  EXPECT_EQ(FuserOptions{}.max_bindings, 64u);
}

TEST(DefaultFusers, Seed630OnlyElementWiseIsReady) {
  FuserList list = default_fusers(FusionLog{}, FuserOptions{});
  for (const Operation& op : seed_630())
    for (auto& f : list) f->fuse(op);
  EXPECT_EQ(list[0]->properties(), (FuserProperties{true, 630}));
  EXPECT_EQ(list[0]->len(), 4u);
  EXPECT_EQ(list[1]->status(), FuserStatus::Closed);  // Matmul: not a matmul head
  EXPECT_FALSE(list[1]->properties().ready);
  EXPECT_EQ(list[2]->status(), FuserStatus::Open);  // Reduce: still fusing on read
  EXPECT_FALSE(list[2]->properties().ready);
  EXPECT_FALSE(list[3]->properties().ready);
  EXPECT_FALSE(list[4]->properties().ready);

  const OptimizationPtr opt = list[0]->finish();
  EXPECT_EQ(opt->name(), "ElementWise");
  EXPECT_EQ(opt->len(), 4u);
  EXPECT_EQ(opt->max_relative_shape_id(), 1u);
  EXPECT_EQ(opt->describe(), as_fused(opt).program().to_string());
  EXPECT_EQ(as_fused(opt).program().len, 4u);
}

TEST(DefaultFusers, ClonesAreIndependent) {
  FuserList list = default_fusers(FusionLog{}, FuserOptions{});
  const std::vector<Operation> ops = seed_630();
  for (auto& f : list) f->fuse(ops[0]);
  FuserList copies = clone_fusers(list);
  for (std::size_t i = 1; i < ops.size(); ++i)
    for (auto& f : copies) f->fuse(ops[i]);
  EXPECT_EQ(list[0]->len(), 1u);
  EXPECT_EQ(copies[0]->len(), 4u);
  EXPECT_EQ(list[2]->len(), 1u);
  EXPECT_EQ(copies[2]->len(), 4u);
  EXPECT_EQ(list[0]->properties().score, 0u);
  EXPECT_EQ(copies[0]->properties().score, 630u);
}

TEST(DefaultFusers, ResetRestoresTheFreshState) {
  FuserList list = default_fusers(FusionLog{}, FuserOptions{});
  const Shape s{1, 2};
  const std::vector<Operation> ops = {exp_op(T(0, s, RO), T(1, s, NI)), sum_dim(T(1, s, RW), T(2, {1, 0}, NI), 1),
                                      mul_scalar(T(2, {1, 0}, RW), 0, T(3, {1, 0}, NI))};
  for (const Operation& op : ops)
    for (auto& f : list) f->fuse(op);
  EXPECT_TRUE(list[2]->properties().ready);
  for (auto& f : list) {
    f->reset();
    EXPECT_EQ(f->status(), FuserStatus::Open);
    EXPECT_TRUE(f->is_empty());
    EXPECT_FALSE(f->properties().ready);
  }
  for (const Operation& op : ops)
    for (auto& f : list) f->fuse(op);
  EXPECT_EQ(list[2]->properties(), (FuserProperties{true, 210}));
}

// ---- ElementWise view rule (§19.13 item 6).

TEST(ElementWise, SwapAsFirstUseClosesEveryFuser) {
  Captured c;
  FuserList list = default_fusers(c.log, FuserOptions{});
  const Shape s{1, 1};
  for (auto& f : list) f->fuse(swap_dims(T(0, s, RW), T(1, s, NI), 0, 1));
  for (const auto& f : list) {
    EXPECT_EQ(f->status(), FuserStatus::Closed);
    EXPECT_FALSE(f->properties().ready);
  }
  // The rest of (a.swap_dims(0,1) + b).exp(), after the swap ran alone, fuses.
  ElementWiseFuser e(kBindings);
  e.fuse(add(T(0, s, RW), T(1, s, RO), T(2, s, NI)));
  e.fuse(exp_op(T(2, s, RW), T(3, s, NI)));
  EXPECT_EQ(e.properties(), (FuserProperties{true, 210}));
  // Closing lines come from the trace fusers that rejected the view (ElementWise, Reduce's main,
  // ReduceBroadcasted's first block, NHWC's inner); Matmul closes silently (not a matmul head).
  const std::vector<std::string> lines = c.capture->lines();
  ASSERT_EQ(lines.size(), 4u);
  for (const std::string& l : lines)
    EXPECT_EQ(l, "[fuser] closed on BaseFloat (base fuse rejected); had 0 ops, est_bindings=1/64");
}

// ---- Matmul (§14.5, §19.13 item 4).

TEST(Matmul, LoneMatmulIsNeverReady) {
  MatmulFuser f(kBindings);
  f.fuse(matmul(T(0, {1, 2}, RO), T(1, {2, 3}, RO), T(2, {1, 3}, NI)));
  EXPECT_EQ(f.status(), FuserStatus::Open);
  EXPECT_EQ(f.len(), 1u);
  EXPECT_FALSE(f.properties().ready);
}

TEST(Matmul, EpilogueAddBias100) {
  MatmulFuser f(kBindings);
  f.fuse(matmul(T(0, {1, 2}, RO), T(1, {2, 3}, RO), T(2, {1, 3}, NI)));
  f.fuse(add(T(2, {1, 3}, RW), T(3, {1, 3}, RO), T(4, {1, 3}, NI)));
  EXPECT_EQ(f.status(), FuserStatus::Open);
  EXPECT_EQ(f.len(), 2u);
  EXPECT_EQ(f.properties(), (FuserProperties{true, 100}));
  EXPECT_EQ(f.epilogue().fused_io(), (FusedIo{1, 1, 0}));

  const OptimizationPtr opt = f.finish();
  EXPECT_EQ(opt->name(), "Matmul");
  EXPECT_EQ(opt->len(), 2u);
  EXPECT_EQ(opt->max_relative_shape_id(), 3u);
  const FusedProgram& p = as_fused(opt).program();
  EXPECT_EQ(p.kind, ProgramKind::Matmul);
  EXPECT_EQ(p.len, 2u);
  EXPECT_EQ(p.captured_op_position, 0u);
  ASSERT_TRUE(p.matmul.has_value());
  ASSERT_EQ(p.inputs.size(), 3u);
  EXPECT_EQ(p.inputs[p.matmul->lhs].tensor, 0u);
  EXPECT_EQ(p.inputs[p.matmul->rhs].tensor, 1u);
  ASSERT_EQ(p.blocks.size(), 1u);
  EXPECT_EQ(p.blocks[0].reference_shape, (Shape{1, 3}));
  ASSERT_EQ(p.blocks[0].loads.size(), 1u);  // only the bias; the matmul result is a register
  ASSERT_EQ(p.blocks[0].instructions.size(), 1u);
  EXPECT_EQ(p.blocks[0].instructions[0].operands[0], Operand::local(p.matmul->out));
  ASSERT_EQ(p.outputs.size(), 2u);
  EXPECT_FALSE(p.outputs[0].written);  // c consumed by the epilogue
  EXPECT_TRUE(p.outputs[1].written);
  ASSERT_EQ(p.fallbacks.size(), 1u);  // the epilogue alone, reading c from memory
  EXPECT_EQ(p.fallbacks[0].len, 1u);
  ASSERT_EQ(p.fallbacks[0].inputs.size(), 2u);
  EXPECT_EQ(p.fallbacks[0].inputs[0].tensor, 2u);
  EXPECT_EQ(p.fallbacks[0].inputs[0].status, RW);
}

TEST(Matmul, AnythingElseFirstCloses) {
  MatmulFuser f(kBindings);
  f.fuse(add(T(0, {1, 1}, RO), T(1, {1, 1}, RO), T(2, {1, 1}, NI)));
  EXPECT_EQ(f.status(), FuserStatus::Closed);
  EXPECT_EQ(f.len(), 0u);
  f.fuse(matmul(T(2, {1, 1}, RO), T(3, {1, 1}, RO), T(4, {1, 1}, NI)));  // ignored
  EXPECT_EQ(f.len(), 0u);
  MatmulFuser g(kBindings);
  g.fuse(make(OpKind::Int_Matmul, Family::Int, {T(0, {1, 1}, RO, ir::dtypes::i32), T(1, {1, 1}, RO, ir::dtypes::i32)},
              {T(2, {1, 1}, NI, ir::dtypes::i32)}));
  EXPECT_EQ(g.status(), FuserStatus::Closed);
}

TEST(Matmul, EpilogueHasNoOutputShapeUpdates) {
  Captured c;
  MatmulFuser f(kBindings, c.log);
  // [M, 1] result: growing it to [M, N] is an update, off in the epilogue (the fallback would take it).
  f.fuse(matmul(T(0, {1, 2}, RO), T(1, {2, 0}, RO), T(2, {1, 0}, NI)));
  f.fuse(add(T(2, {1, 0}, RW), T(3, {1, 3}, RO), T(4, {1, 3}, NI)));
  EXPECT_EQ(f.status(), FuserStatus::Closed);
  EXPECT_EQ(f.len(), 1u);
  EXPECT_FALSE(f.properties().ready);
  EXPECT_EQ(f.fallback().status(), FuserStatus::Closed);
  ASSERT_EQ(c.capture->lines().size(), 1u);
  EXPECT_EQ(c.capture->lines()[0],
            "[fuser] closed on NumericFloat (numeric fuse rejected); had 0 ops, est_bindings=4/64");
  // A broadcast epilogue output is fine.
  MatmulFuser g(kBindings);
  g.fuse(matmul(T(0, {1, 2}, RO), T(1, {2, 3}, RO), T(2, {1, 3}, NI)));
  g.fuse(add(T(2, {1, 3}, RW), T(3, {0, 3}, RO), T(4, {1, 3}, NI)));
  EXPECT_EQ(g.len(), 2u);
  EXPECT_TRUE(g.properties().ready);
}

TEST(Matmul, FirstEpilogueOpSkipsTheBindingsCheck) {
  // The matmul's operands and output are registered directly: the first epilogue op is the
  // trace's first op and skips the bindings check (needs 1 + 3 + 1 = 5 > 2); the next does not.
  MatmulFuser f(2);
  f.fuse(matmul(T(0, {1, 2}, RO), T(1, {2, 3}, RO), T(2, {1, 3}, NI)));
  f.fuse(add(T(2, {1, 3}, RW), T(3, {1, 3}, RO), T(4, {1, 3}, NI)));
  EXPECT_EQ(f.len(), 2u);
  EXPECT_TRUE(f.properties().ready);
  EXPECT_EQ(f.epilogue().estimate_bindings(), 5u);
  f.fuse(exp_op(T(4, {1, 3}, RW), T(5, {1, 3}, NI)));
  EXPECT_EQ(f.status(), FuserStatus::Closed);
  EXPECT_EQ(f.len(), 2u);
}

TEST(Matmul, DropAsFirstEpilogueOpCloses) {
  MatmulFuser f(kBindings);
  f.fuse(matmul(T(0, {1, 2}, RO), T(1, {2, 3}, RO), T(2, {1, 3}, NI)));
  f.fuse(drop(T(0, {1, 2}, RW)));
  EXPECT_EQ(f.status(), FuserStatus::Closed);
  EXPECT_EQ(f.len(), 1u);
  EXPECT_FALSE(f.properties().ready);
}

// ---- Reduce (§14.7, §19.13 item 3).

TEST(Reduce, ReductionFirstClosesAndIsNeverReady) {
  ReduceFuser f(kBindings);
  f.fuse(sum_dim(T(0, {1, 2}, RO), T(1, {1, 0}, NI), 1));
  EXPECT_EQ(f.status(), FuserStatus::Closed);
  EXPECT_FALSE(f.properties().ready);
  EXPECT_EQ(f.len(), 0u);
  f.fuse(exp_op(T(1, {1, 0}, RW), T(2, {1, 0}, NI)));
  EXPECT_EQ(f.len(), 0u);
  EXPECT_FALSE(f.properties().ready);
}

TEST(Reduce, ExpSumDimScoresZeroThenMulScalar210) {
  ReduceFuser f(kBindings);
  f.fuse(exp_op(T(0, {1, 2}, RO), T(1, {1, 2}, NI)));
  EXPECT_FALSE(f.properties().ready);
  f.fuse(sum_dim(T(1, {1, 2}, RW), T(2, {1, 0}, NI), 1));
  EXPECT_EQ(f.status(), FuserStatus::Open);
  EXPECT_EQ(f.len(), 2u);
  EXPECT_EQ(f.properties(), (FuserProperties{true, 0}));
  f.fuse(mul_scalar(T(2, {1, 0}, RW), 0, T(3, {1, 0}, NI)));
  EXPECT_EQ(f.len(), 3u);
  EXPECT_EQ(f.properties(), (FuserProperties{true, 210}));

  const OptimizationPtr opt = f.finish();
  EXPECT_EQ(opt->name(), "Reduce");
  EXPECT_EQ(opt->len(), 3u);
  EXPECT_EQ(opt->max_relative_shape_id(), 2u);
  const FusedProgram& p = as_fused(opt).program();
  EXPECT_EQ(p.kind, ProgramKind::Reduce);
  EXPECT_EQ(p.captured_op_position, 1u);
  ASSERT_EQ(p.blocks.size(), 2u);
  EXPECT_EQ(p.blocks[0].reference_shape, (Shape{1, 2}));
  EXPECT_EQ(p.blocks[1].reference_shape, (Shape{1, 0}));
  EXPECT_EQ(p.blocks[0].settings, FuseSettings::reduce_read());
  EXPECT_EQ(p.blocks[1].settings, FuseSettings::reduce_write());
  ASSERT_TRUE(p.blocks[1].reduction.has_value());
  const Reduction& r = *p.blocks[1].reduction;
  EXPECT_EQ(r.op, OpKind::Numeric_SumDim);
  EXPECT_EQ(r.axis, 1);
  EXPECT_EQ(r.accumulator, ir::dtypes::f32);
  ASSERT_EQ(p.blocks[0].instructions.size(), 1u);
  EXPECT_EQ(r.input, p.blocks[0].instructions[0].out);  // exp(x) handed over in registers
  ASSERT_EQ(p.blocks[1].instructions.size(), 1u);
  EXPECT_EQ(p.blocks[1].instructions[0].operands[0], Operand::local(r.out));
  // Only t3 reaches memory: t1 and t2 stay in registers.
  ASSERT_EQ(p.outputs.size(), 3u);
  EXPECT_FALSE(p.outputs[0].written);
  EXPECT_FALSE(p.outputs[1].written);
  EXPECT_TRUE(p.outputs[2].written);
  EXPECT_EQ(p.blocks[1].stores.size(), 1u);
  ASSERT_EQ(p.fallbacks.size(), 2u);
  EXPECT_EQ(p.fallbacks[0].len, 1u);  // exp alone
  EXPECT_EQ(p.fallbacks[1].len, 1u);  // mul_scalar alone
}

TEST(Reduce, ReductionOfAnotherShapeCloses) {
  ReduceFuser f(kBindings);
  f.fuse(exp_op(T(0, {1, 2}, RO), T(1, {1, 2}, NI)));
  f.fuse(sum_dim(T(2, {1, 3}, RW), T(3, {1, 0}, NI), 1));
  EXPECT_EQ(f.status(), FuserStatus::Closed);
  EXPECT_FALSE(f.properties().ready);
  EXPECT_EQ(f.len(), 1u);
}

TEST(Reduce, ReadPhaseHasNoBroadcast) {
  ReduceFuser f(kBindings);
  f.fuse(exp_op(T(0, {1, 2}, RO), T(1, {1, 2}, NI)));
  f.fuse(exp_op(T(2, {1, 0}, RO), T(3, {1, 0}, NI)));
  EXPECT_EQ(f.status(), FuserStatus::Closed);
  EXPECT_EQ(f.read_fallback().status(), FuserStatus::Closed);
  EXPECT_EQ(f.len(), 1u);
}

TEST(Reduce, SecondReductionClosesButStaysReady) {
  ReduceFuser f(kBindings);
  f.fuse(exp_op(T(0, {1, 2}, RO), T(1, {1, 2}, NI)));
  f.fuse(sum_dim(T(1, {1, 2}, RW), T(2, {1, 0}, NI), 1));
  f.fuse(sum_dim(T(2, {1, 0}, RW), T(3, {0, 0}, NI), 0));
  EXPECT_EQ(f.status(), FuserStatus::Closed);
  EXPECT_EQ(f.len(), 2u);
  EXPECT_TRUE(f.properties().ready);
}

TEST(Reduce, ReduceInputStillNeededIsWritten) {
  ReduceFuser f(kBindings);
  f.fuse(exp_op(T(0, {1, 2}, RO), T(1, {1, 2}, NI)));
  f.fuse(sum_dim(T(1, {1, 2}, RO), T(2, {1, 0}, NI), 1));  // t1 used again later
  EXPECT_EQ(f.main().fused_io(), (FusedIo{1, 2, 0}));
}

TEST(Reduce, HalfPrecisionSumAccumulatesInF32) {
  ReduceFuser f(kBindings);
  f.fuse(make(OpKind::Float_Exp, Family::Float, {T(0, {1, 2}, RO, ir::dtypes::f16)},
              {T(1, {1, 2}, NI, ir::dtypes::f16)}, {}, {}, ir::dtypes::f16));
  f.fuse(reduce_dim(OpKind::Numeric_SumDim, T(1, {1, 2}, RW, ir::dtypes::f16), T(2, {1, 0}, NI, ir::dtypes::f16), 1));
  ASSERT_TRUE(f.properties().ready);
  const FusedProgram p = f.program();
  ASSERT_TRUE(p.blocks[1].reduction.has_value());
  EXPECT_EQ(p.blocks[1].reduction->input_dtype, ir::dtypes::f16);
  EXPECT_EQ(p.blocks[1].reduction->accumulator, ir::dtypes::f32);
  EXPECT_EQ(p.blocks[1].reduction->out_dtype, ir::dtypes::f16);
}

TEST(Reduce, ProgramsHashByStructure) {
  auto run = [](Shape full, Shape reduced) {
    ReduceFuser f(kBindings);
    f.fuse(exp_op(T(0, full, RO), T(1, full, NI)));
    f.fuse(sum_dim(T(1, full, RW), T(2, reduced, NI), 1));
    f.fuse(mul_scalar(T(2, reduced, RW), 0, T(3, reduced, NI)));
    return f.program();
  };
  const FusedProgram a = run({1, 2}, {1, 0});
  const FusedProgram b = run({1, 2}, {1, 0});
  const FusedProgram c = run({1, 3}, {1, 0});
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.structural_hash(), b.structural_hash());
  EXPECT_NE(a, c);
  EXPECT_NE(a.structural_hash(), c.structural_hash());
}

// ---- ReduceBroadcasted (§14.8, §19.13 items 1 and 2).

TEST(ReduceBroadcasted, Workflow1) {
  ReduceBroadcastedFuser f(kBindings);
  f.fuse(ones(T(0, {1, 2}, NI)));
  EXPECT_EQ(f.state(), ReduceBroadcastedFuser::State::Starting);
  EXPECT_FALSE(f.properties().ready);
  f.fuse(sum_dim(T(0, {1, 2}, RW), T(1, {1, 0}, NI), 1));
  EXPECT_EQ(f.len(), 2u);
  EXPECT_EQ(f.status(), FuserStatus::Open);
  EXPECT_TRUE(f.properties().ready);
  f.fuse(add(T(1, {1, 0}, RW), T(2, {1, 0}, RW), T(3, {1, 0}, NI)));
  EXPECT_EQ(f.len(), 3u);
  EXPECT_EQ(f.status(), FuserStatus::Open);
  EXPECT_TRUE(f.properties().ready);
  f.fuse(add(T(3, {1, 0}, RW), T(4, {1, 2}, RW), T(5, {1, 2}, NI)));
  EXPECT_EQ(f.len(), 4u);
  EXPECT_EQ(f.status(), FuserStatus::Open);
  EXPECT_TRUE(f.properties().ready);
  EXPECT_EQ(f.blocks().size(), 2u);
  f.fuse(sum_dim(T(5, {1, 2}, RW), T(6, {1, 0}, NI), 1));
  EXPECT_EQ(f.len(), 5u);
  EXPECT_TRUE(f.properties().ready);
  EXPECT_EQ(f.state(), ReduceBroadcastedFuser::State::Init);

  std::uint64_t sum = 0;
  for (const ReduceFuser& b : f.blocks()) sum += b.properties().score;
  EXPECT_EQ(f.properties().score, sum);

  const OptimizationPtr opt = f.finish();
  EXPECT_EQ(opt->name(), "ReduceBroadcasted");
  EXPECT_EQ(opt->len(), 5u);
  EXPECT_EQ(opt->max_relative_shape_id(), 2u);
  const FusedProgram& p = as_fused(opt).program();
  ASSERT_EQ(p.stages.size(), 2u);
  EXPECT_EQ(p.stages[0].kind, ProgramKind::Reduce);
  EXPECT_EQ(p.stages[0].len, 3u);
  EXPECT_EQ(p.stages[1].kind, ProgramKind::Reduce);
  EXPECT_EQ(p.stages[1].len, 2u);
  // t3 passes from stage 0 to stage 1 through memory.
  EXPECT_TRUE(p.stages[0].outputs.back().written);
  EXPECT_EQ(p.stages[0].outputs.back().tensor, 3u);
  EXPECT_EQ(p.stages[1].inputs[0].tensor, 3u);
  EXPECT_EQ(p.stages[1].inputs[0].role, InputRole::Broadcast);
  EXPECT_NE(p.to_string().find("stage 1:"), std::string::npos);
}

TEST(ReduceBroadcasted, Workflow2) {
  ReduceBroadcastedFuser f(kBindings);
  f.fuse(ones(T(0, {1, 2}, NI)));
  f.fuse(add(T(0, {1, 2}, RW), T(2, {1, 2}, RO), T(3, {1, 2}, NI)));
  f.fuse(sum_dim(T(3, {1, 2}, RW), T(1, {1, 0}, NI), 1));
  EXPECT_EQ(f.len(), 3u);
  EXPECT_EQ(f.status(), FuserStatus::Open);
  EXPECT_TRUE(f.properties().ready);
  f.fuse(add(T(1, {1, 0}, RW), T(2, {1, 2}, RW), T(5, {1, 2}, NI)));
  EXPECT_EQ(f.len(), 4u);
  EXPECT_EQ(f.status(), FuserStatus::Open);
  EXPECT_TRUE(f.properties().ready);
  const FusedProgram p = f.program();
  ASSERT_EQ(p.stages.size(), 2u);
  EXPECT_EQ(p.stages[0].kind, ProgramKind::Reduce);
  EXPECT_EQ(p.stages[1].kind, ProgramKind::Elementwise);  // the broadcast-back block
}

TEST(ReduceBroadcasted, NonLastAxisAborts) {
  ReduceBroadcastedFuser f(kBindings);
  f.fuse(exp_op(T(0, {1, 2}, RO), T(1, {1, 2}, NI)));
  f.fuse(sum_dim(T(1, {1, 2}, RW), T(2, {0, 2}, NI), 0));
  EXPECT_EQ(f.state(), ReduceBroadcastedFuser::State::Abort);
  EXPECT_EQ(f.status(), FuserStatus::Closed);
  EXPECT_FALSE(f.properties().ready);
  // The plain Reduce fuser takes it.
  ReduceFuser r(kBindings);
  r.fuse(exp_op(T(0, {1, 2}, RO), T(1, {1, 2}, NI)));
  r.fuse(sum_dim(T(1, {1, 2}, RW), T(2, {0, 2}, NI), 0));
  EXPECT_TRUE(r.properties().ready);
}

TEST(ReduceBroadcasted, ElementwiseOnlyIsNotReady) {
  ReduceBroadcastedFuser f(kBindings);
  f.fuse(exp_op(T(0, {1, 2}, RO), T(1, {1, 2}, NI)));
  EXPECT_EQ(f.status(), FuserStatus::Open);
  EXPECT_FALSE(f.properties().ready);
  f.fuse(make(OpKind::Numeric_Neg, Family::NumericFloat, {T(1, {1, 2}, RW)}, {T(2, {1, 2}, NI)}));
  EXPECT_EQ(f.state(), ReduceBroadcastedFuser::State::Closed);
  EXPECT_FALSE(f.properties().ready);
  EXPECT_EQ(f.len(), 1u);
}

TEST(ReduceBroadcasted, ClosedAfterAReductionStaysReady) {
  ReduceBroadcastedFuser f(kBindings);
  f.fuse(exp_op(T(0, {1, 2}, RO), T(1, {1, 2}, NI)));
  f.fuse(sum_dim(T(1, {1, 2}, RW), T(2, {1, 0}, NI), 1));
  // Neither the reduce block nor a new broadcast-back block takes an op of another shape.
  f.fuse(exp_op(T(3, {1, 3}, RO), T(4, {1, 3}, NI)));
  EXPECT_EQ(f.state(), ReduceBroadcastedFuser::State::Closed);
  EXPECT_EQ(f.status(), FuserStatus::Closed);
  EXPECT_EQ(f.len(), 2u);
  EXPECT_TRUE(f.properties().ready);
  f.fuse(exp_op(T(2, {1, 0}, RW), T(5, {1, 0}, NI)));  // ignored
  EXPECT_EQ(f.len(), 2u);
}

TEST(ReduceBroadcasted, SoftmaxLikeChain) {
  // max_dim, x - max, exp, sum_dim, e / sum on [1,2] reduced along the last axis.
  ReduceBroadcastedFuser f(kBindings);
  const Shape full{1, 2}, red{1, 0};
  f.fuse(exp_op(T(0, full, RO), T(1, full, NI)));  // some prologue
  f.fuse(reduce_dim(OpKind::Numeric_MaxDim, T(1, full, RO), T(2, red, NI), 1));
  f.fuse(make(OpKind::Numeric_Sub, Family::NumericFloat, {T(1, full, RW), T(2, red, RW)}, {T(3, full, NI)}));
  f.fuse(exp_op(T(3, full, RW), T(4, full, NI)));
  f.fuse(sum_dim(T(4, full, RO), T(5, red, NI), 1));
  f.fuse(make(OpKind::Numeric_Div, Family::NumericFloat, {T(4, full, RW), T(5, red, RW)}, {T(6, full, NI)}));
  EXPECT_EQ(f.len(), 6u);
  EXPECT_EQ(f.status(), FuserStatus::Open);
  EXPECT_TRUE(f.properties().ready);
  ASSERT_EQ(f.blocks().size(), 3u);
  EXPECT_TRUE(f.blocks()[0].captured());
  EXPECT_TRUE(f.blocks()[1].captured());
  EXPECT_FALSE(f.blocks()[2].captured());
}

// ---- Row (kiln's row fuser, beyond Burn).

Operation sub_op(TensorIr l, TensorIr r, TensorIr o) {
  return make(OpKind::Numeric_Sub, Family::NumericFloat, {l, r}, {o});
}
Operation div_op(TensorIr l, TensorIr r, TensorIr o) {
  return make(OpKind::Numeric_Div, Family::NumericFloat, {l, r}, {o});
}

// softmax over the last axis of x (t0), as a client lowers it: max, sub, exp, sum, div.
std::vector<Operation> softmax_ops() {
  const Shape rows{1, 2}, reduced{1, 0};
  return {reduce_dim(OpKind::Numeric_MaxDim, T(0, rows, RO), T(1, reduced, NI), 1),
          sub_op(T(0, rows, RW), T(1, reduced, RW), T(2, rows, NI)), exp_op(T(2, rows, RW), T(3, rows, NI)),
          sum_dim(T(3, rows, RO), T(4, reduced, NI), 1), div_op(T(3, rows, RW), T(4, reduced, RW), T(5, rows, NI))};
}

TEST(Row, SoftmaxOpensWithItsMaxAndIsOneProgram) {
  RowFuser f(kBindings);
  for (const Operation& op : softmax_ops()) f.fuse(op);
  EXPECT_EQ(f.len(), 5u);
  EXPECT_EQ(f.status(), FuserStatus::Open);
  ASSERT_EQ(f.blocks().size(), 3u);  // [max], [sub, exp, sum], [div]
  std::uint64_t sum = 0;
  for (const ReduceFuser& b : f.blocks()) sum += b.properties().score;
  EXPECT_EQ(f.properties(), (FuserProperties{true, sum + 3 * RowFuser::kBlockBonus}));

  const OptimizationPtr opt = f.finish();
  EXPECT_EQ(opt->name(), "Row");
  EXPECT_EQ(opt->len(), 5u);
  const FusedProgram& p = as_fused(opt).program();
  EXPECT_EQ(p.kind, ProgramKind::Row);
  ASSERT_EQ(p.stages.size(), 3u);
  EXPECT_EQ(p.stages[0].kind, ProgramKind::Reduce);
  EXPECT_EQ(p.stages[0].len, 1u);
  EXPECT_EQ(p.stages[0].captured_op_position, 0u);  // an empty prologue: it only loads x
  EXPECT_TRUE(p.stages[0].blocks[0].instructions.empty());
  EXPECT_EQ(p.stages[0].blocks[0].loads.size(), 1u);
  EXPECT_EQ(p.stages[1].kind, ProgramKind::Reduce);
  EXPECT_EQ(p.stages[1].len, 3u);
  EXPECT_EQ(p.stages[2].kind, ProgramKind::Elementwise);
  EXPECT_EQ(p.stages[2].len, 1u);
  EXPECT_NE(p.to_string().find("Row program (5 ops)"), std::string::npos) << p.to_string();

  // Burn's fusers cannot take it: a reduction never opens one of their blocks.
  FuserList list = default_fusers(FusionLog{}, FuserOptions{.row_fuser = true});
  for (const Operation& op : softmax_ops())
    for (auto& g : list) g->fuse(op);
  for (std::size_t i = 0; i < 5; ++i) EXPECT_FALSE(list[i]->properties().ready) << i;
  EXPECT_TRUE(list[5]->properties().ready);
}

TEST(Row, BeatsReduceBroadcastedOnTheSameOps) {
  // §19.13 ReduceBroadcasted workflow 1: both take all five ops, the row fuser scores more.
  const std::vector<Operation> ops = {ones(T(0, {1, 2}, NI)), sum_dim(T(0, {1, 2}, RW), T(1, {1, 0}, NI), 1),
                                      add(T(1, {1, 0}, RW), T(2, {1, 0}, RW), T(3, {1, 0}, NI)),
                                      add(T(3, {1, 0}, RW), T(4, {1, 2}, RW), T(5, {1, 2}, NI)),
                                      sum_dim(T(5, {1, 2}, RW), T(6, {1, 0}, NI), 1)};
  ReduceBroadcastedFuser rb(kBindings);
  RowFuser row(kBindings);
  for (const Operation& op : ops) {
    rb.fuse(op);
    row.fuse(op);
  }
  EXPECT_EQ(row.len(), rb.len());
  EXPECT_TRUE(row.properties().ready);
  EXPECT_EQ(row.properties().score, rb.properties().score + 2 * RowFuser::kBlockBonus);
}

TEST(Row, NeverReadyWhereOneReduceProgramFits) {
  const Shape rows{1, 2}, reduced{1, 0};
  // exp, sum, * k: Reduce's program (§14.7's 210); the row fuser stays out of it.
  {
    RowFuser f(kBindings);
    f.fuse(exp_op(T(0, rows, RO), T(1, rows, NI)));
    f.fuse(sum_dim(T(1, rows, RW), T(2, reduced, NI), 1));
    f.fuse(mul_scalar(T(2, reduced, RW), 0, T(3, reduced, NI)));
    EXPECT_EQ(f.len(), 3u);
    EXPECT_FALSE(f.properties().ready);
  }
  // A lone reduction is one op either way.
  {
    RowFuser f(kBindings);
    f.fuse(sum_dim(T(0, rows, RO), T(1, reduced, NI), 1));
    EXPECT_EQ(f.len(), 1u);
    EXPECT_FALSE(f.properties().ready);
    // ... but with work after it, it is a kernel no Burn fuser builds.
    f.fuse(mul_scalar(T(1, reduced, RW), 0, T(2, reduced, NI)));
    EXPECT_EQ(f.len(), 2u);
    EXPECT_TRUE(f.properties().ready);
  }
  // Elementwise work alone never makes it ready.
  {
    RowFuser f(kBindings);
    f.fuse(exp_op(T(0, rows, RO), T(1, rows, NI)));
    EXPECT_FALSE(f.properties().ready);
  }
}

TEST(Row, AReductionOffTheRowsClosesTheChainAndKeepsIt) {
  const Shape rows{1, 2};
  for (const std::int64_t axis : {0, 1}) {
    RowFuser f(kBindings);
    for (const Operation& op : softmax_ops()) f.fuse(op);
    // Axis 0 is not the last one; axis 1 of another shape is not these rows.
    const Shape other = axis == 0 ? rows : Shape{1, 3};
    const Shape reduced = axis == 0 ? Shape{0, 2} : Shape{1, 0};
    f.fuse(reduce_dim(OpKind::Numeric_SumDim, T(axis == 0 ? 5 : 7, other, RO), T(6, reduced, NI), axis));
    EXPECT_EQ(f.status(), FuserStatus::Closed) << axis;
    EXPECT_EQ(f.len(), 5u) << axis;
    EXPECT_TRUE(f.properties().ready) << axis;
  }
  // Opening on a reduction off the last axis: nothing taken.
  RowFuser f(kBindings);
  f.fuse(reduce_dim(OpKind::Numeric_SumDim, T(0, rows, RO), T(1, {0, 2}, NI), 0));
  EXPECT_EQ(f.status(), FuserStatus::Closed);
  EXPECT_EQ(f.len(), 0u);
  EXPECT_FALSE(f.properties().ready);
}

TEST(Row, ResetAndClone) {
  RowFuser f(kBindings);
  const std::vector<Operation> ops = softmax_ops();
  f.fuse(ops[0]);
  const std::unique_ptr<OperationFuser> copy = f.clone();
  for (std::size_t i = 1; i < ops.size(); ++i) copy->fuse(ops[i]);
  EXPECT_EQ(f.len(), 1u);
  EXPECT_EQ(copy->len(), 5u);
  f.reset();
  EXPECT_TRUE(f.is_empty());
  EXPECT_EQ(f.status(), FuserStatus::Open);
  for (const Operation& op : ops) f.fuse(op);
  EXPECT_EQ(f.properties(), copy->properties());
}

// ---- NHWC relayout (§14.6, §19.13 item 5).

TEST(NhwcRelayout, PoolConsumingTheResultIsCaptured) {
  NhwcRelayoutFuser f(kBindings);
  const Shape s{1, 2, 3, 3};
  f.fuse(add(T(0, s, RO), T(1, s, RO), T(2, s, NI)));
  f.fuse(max_pool2d(T(2, s, RW), T(3, {1, 2, 4, 4}, NI)));
  EXPECT_EQ(f.status(), FuserStatus::Closed);
  EXPECT_TRUE(f.captured());
  EXPECT_EQ(f.properties(), (FuserProperties{true, 100}));
  EXPECT_EQ(f.len(), 2u);
  const OptimizationPtr opt = f.finish();
  EXPECT_EQ(opt->name(), "NHWCRelayout");
  EXPECT_EQ(opt->len(), 2u);
  const FusedProgram& p = as_fused(opt).program();
  EXPECT_EQ(p.captured_op_position, 1u);
  ASSERT_EQ(p.outputs.size(), 1u);
  EXPECT_TRUE(p.outputs[0].written);  // the pool reads it from memory
  ASSERT_TRUE(p.outputs[0].layout.has_value());
  EXPECT_EQ(*p.outputs[0].layout, (Permutation{0, 3, 1, 2}));
}

TEST(NhwcRelayout, PoolOfATensorStillNeededIsNotCaptured) {
  NhwcRelayoutFuser f(kBindings);
  const Shape s{1, 2, 3, 3};
  f.fuse(add(T(0, s, RO), T(1, s, RO), T(2, s, NI)));
  f.fuse(max_pool2d(T(2, s, RO), T(3, {1, 2, 4, 4}, NI)));
  EXPECT_EQ(f.status(), FuserStatus::Closed);  // the inner fuser rejects the module op
  EXPECT_FALSE(f.captured());
  EXPECT_FALSE(f.properties().ready);
  EXPECT_EQ(f.len(), 1u);
}

// The N pools of docs/spec/ir.md §5.3 beyond MaxPool2d / AvgPool2d are captured alike, a two-output
// MaxPool1dWithIndices included (x [N, C, L]: NHWC is [0, 2, 1]); AdaptiveAvgPool3d (Mod, not N)
// is fed to the inner fuser, which rejects it.
TEST(NhwcRelayout, TheOtherNPoolsAreCapturedAdaptiveAvgPool3dIsNot) {
  const Shape s{1, 2, 4};
  {
    NhwcRelayoutFuser f(kBindings);
    f.fuse(add(T(0, s, RO), T(1, s, RO), T(2, s, NI)));
    f.fuse(make(OpKind::Module_MaxPool1dWithIndices, Family::Module, {T(2, s, RW)},
                {T(3, {1, 2, 2}, NI), T(4, {1, 2, 2}, NI, ir::dtypes::i64)}, {}, {2, 2, 0, 1, 0}));
    EXPECT_EQ(f.status(), FuserStatus::Closed);
    EXPECT_TRUE(f.captured());
    EXPECT_EQ(f.properties(), (FuserProperties{true, 100}));
    const OptimizationPtr opt = f.finish();
    const FusedProgram& p = as_fused(opt).program();
    EXPECT_EQ(p.captured_op_position, 1u);
    ASSERT_EQ(p.outputs.size(), 1u);
    ASSERT_TRUE(p.outputs[0].layout.has_value());
    EXPECT_EQ(*p.outputs[0].layout, (Permutation{0, 2, 1}));
  }
  {
    NhwcRelayoutFuser f(kBindings);
    const Shape s4{1, 2, 3, 3};
    f.fuse(add(T(0, s4, RO), T(1, s4, RO), T(2, s4, NI)));
    f.fuse(
        make(OpKind::Module_AdaptiveAvgPool2d, Family::Module, {T(2, s4, RW)}, {T(3, {1, 2, 2, 2}, NI)}, {}, {2, 2}));
    EXPECT_TRUE(f.captured());
    EXPECT_EQ(f.len(), 2u);
  }
  NhwcRelayoutFuser f(kBindings);
  const Shape s5{1, 1, 2, 2, 2};
  f.fuse(add(T(0, s5, RO), T(1, s5, RO), T(2, s5, NI)));
  f.fuse(make(OpKind::Module_AdaptiveAvgPool3d, Family::Module, {T(2, s5, RW)}, {T(3, {1, 1, 1, 1, 1}, NI)}, {},
              {1, 1, 1}));
  EXPECT_EQ(f.status(), FuserStatus::Closed);
  EXPECT_FALSE(f.captured());
  EXPECT_FALSE(f.properties().ready);
  EXPECT_EQ(f.len(), 1u);
}

// Interpolate is an N kind like the pools (docs/spec/ir.md §5.8): captured the same way, x written
// channels-last; InterpolateBackward (Mod) is no relayout target.
TEST(NhwcRelayout, InterpolateIsCapturedItsBackwardIsNot) {
  const Shape s{1, 2, 3, 3}, up{1, 2, 6, 6};
  NhwcRelayoutFuser f(kBindings);
  f.fuse(add(T(0, s, RO), T(1, s, RO), T(2, s, NI)));
  f.fuse(make(OpKind::Module_Interpolate, Family::Module, {T(2, s, RW)}, {T(3, up, NI)}, {}, {6, 6, 2, 0}));
  EXPECT_EQ(f.status(), FuserStatus::Closed);
  EXPECT_TRUE(f.captured());
  EXPECT_EQ(f.len(), 2u);
  const OptimizationPtr opt = f.finish();
  const FusedProgram& p = as_fused(opt).program();
  EXPECT_EQ(p.captured_op_position, 1u);
  ASSERT_EQ(p.outputs.size(), 1u);
  ASSERT_TRUE(p.outputs[0].layout.has_value());
  EXPECT_EQ(*p.outputs[0].layout, (Permutation{0, 3, 1, 2}));
  NhwcRelayoutFuser g(kBindings);
  g.fuse(add(T(0, s, RO), T(1, s, RO), T(2, s, NI)));
  g.fuse(make(OpKind::Module_InterpolateBackward, Family::Module, {T(2, s, RW), T(4, up, RO)}, {T(5, s, NI)}, {},
              {6, 6, 2, 0}));
  EXPECT_FALSE(g.captured());
  EXPECT_FALSE(g.properties().ready);
}

}  // namespace
}  // namespace kiln::fusion
