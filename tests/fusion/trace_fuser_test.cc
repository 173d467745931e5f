// Tests for the trace fuser engine (docs/spec/fusion.md §14.2, §14.3) and the FusedProgram it finishes.
// Ops are RELATIVE ops built by hand, with statuses as a real program produces them
// (intermediates consumed with ReadWrite).
#include "kiln/fusion/trace_fuser.h"

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

TensorIr T(std::uint64_t id, Shape shape, TensorStatus s, ir::DType d = ir::dtypes::f32) {
  return TensorIr{ir::TensorId(id), std::move(shape), s, d};
}

Operation make(OpKind kind, Family family, std::vector<TensorIr> inputs, std::vector<TensorIr> outputs,
               std::vector<ir::ScalarIr> scalars = {}, std::vector<std::int64_t> attrs = {}) {
  Operation op;
  op.kind = kind;
  op.family = family;
  op.dtype = ir::dtypes::f32;
  op.num_inputs = static_cast<std::uint8_t>(inputs.size());
  for (auto& t : inputs) op.tensors.push_back(t);
  for (auto& t : outputs) op.tensors.push_back(t);
  for (auto& s : scalars) op.scalars.push_back(s);
  for (auto a : attrs) op.attrs.push_back(a);
  const Status st = op.validate();
  EXPECT_TRUE(st.ok()) << (st.ok() ? "" : st.error().to_string());
  return op;
}

Operation binary(OpKind k, TensorIr l, TensorIr r, TensorIr o) { return make(k, Family::NumericFloat, {l, r}, {o}); }
Operation add(TensorIr l, TensorIr r, TensorIr o) { return binary(OpKind::Numeric_Add, l, r, o); }
Operation mul(TensorIr l, TensorIr r, TensorIr o) { return binary(OpKind::Numeric_Mul, l, r, o); }
Operation scalar_op(OpKind k, TensorIr l, std::uint64_t placeholder, TensorIr o) {
  return make(k, Family::NumericFloat, {l}, {o}, {ir::ScalarIr::UInt(placeholder)});
}
Operation mul_scalar(TensorIr l, std::uint64_t k, TensorIr o) { return scalar_op(OpKind::Numeric_MulScalar, l, k, o); }
Operation add_scalar(TensorIr l, std::uint64_t k, TensorIr o) { return scalar_op(OpKind::Numeric_AddScalar, l, k, o); }
Operation float_unary(OpKind k, TensorIr in, TensorIr out) { return make(k, Family::Float, {in}, {out}); }
Operation exp_op(TensorIr in, TensorIr out) { return float_unary(OpKind::Float_Exp, in, out); }
Operation drop(TensorIr t) { return make(OpKind::Drop_Drop, Family::Drop, {t}, {}); }
Operation swap_dims(TensorIr in, TensorIr out, std::int64_t d1, std::int64_t d2) {
  return make(OpKind::Base_SwapDims, Family::BaseFloat, {in}, {out}, {}, {d1, d2});
}
Operation reshape(TensorIr in, TensorIr out) { return make(OpKind::Base_Reshape, Family::BaseFloat, {in}, {out}); }
Operation gather(TensorIr tensor, TensorIr indices, TensorIr out, std::int64_t dim) {
  return make(OpKind::Base_Gather, Family::BaseFloat, {tensor, indices}, {out}, {}, {dim});
}

struct Captured {
  std::shared_ptr<LogCapture> capture = std::make_shared<LogCapture>();
  FusionLog log = FusionLog::to_capture(LogLevel::Full, capture);
};

TraceFuser elementwise(std::uint32_t max_bindings = 64, FusionLog log = {}) {
  return TraceFuser(FuseSettings::elementwise(), max_bindings, std::move(log));
}

// The seed program (a*b + c*2.0).exp() in relative form (docs/spec/fusion.md §3.11).
std::vector<Operation> seed_630() {
  const Shape s{1, 1};
  return {mul(T(0, s, RO), T(1, s, RO), T(2, s, NI)), mul_scalar(T(3, s, RO), 0, T(4, s, NI)),
          add(T(2, s, RW), T(4, s, RW), T(5, s, NI)), exp_op(T(5, s, RW), T(6, s, NI))};
}

// n chains of 8 single-input ops, fed chain after chain (§19.1.4's stand-in chain:
// MulScalar, AddScalar, Exp, Tanh, Sqrt, DivScalar, SubScalar, Abs).
std::vector<Operation> chains(std::size_t n) {
  const Shape s{1, 1};
  std::vector<Operation> ops;
  std::uint64_t id = 0;
  std::uint64_t k = 0;
  for (std::size_t c = 0; c < n; ++c) {
    std::uint64_t prev = id++;
    TensorStatus st = RO;  // the chain input is materialized and read once
    auto step = [&](auto build) {
      const std::uint64_t out = id++;
      ops.push_back(build(T(prev, s, st), T(out, s, NI)));
      prev = out;
      st = RW;  // each intermediate is consumed by the next op
    };
    step([&](TensorIr i, TensorIr o) { return mul_scalar(i, k++, o); });
    step([&](TensorIr i, TensorIr o) { return add_scalar(i, k++, o); });
    step([&](TensorIr i, TensorIr o) { return exp_op(i, o); });
    step([&](TensorIr i, TensorIr o) { return float_unary(OpKind::Float_Tanh, i, o); });
    step([&](TensorIr i, TensorIr o) { return float_unary(OpKind::Float_Sqrt, i, o); });
    step([&](TensorIr i, TensorIr o) { return scalar_op(OpKind::Numeric_DivScalar, i, k++, o); });
    step([&](TensorIr i, TensorIr o) { return scalar_op(OpKind::Numeric_SubScalar, i, k++, o); });
    step([&](TensorIr i, TensorIr o) { return make(OpKind::Numeric_Abs, Family::NumericFloat, {i}, {o}); });
  }
  return ops;
}

std::uint64_t score_of(const std::vector<Operation>& ops, std::uint32_t max_bindings = 64) {
  TraceFuser f = elementwise(max_bindings);
  for (const Operation& op : ops) f.fuse(op);
  EXPECT_EQ(f.num_ops(), ops.size());
  EXPECT_EQ(f.status(), FuserStatus::Open);
  return f.properties().score;
}

// ---- §14.3 worked examples.

TEST(TraceFuserScore, Seed630) {
  TraceFuser f = elementwise();
  for (const Operation& op : seed_630()) f.fuse(op);
  EXPECT_EQ(f.num_ops(), 4u);
  EXPECT_EQ(f.scoring().unfused_reads(), 6u);
  EXPECT_EQ(f.scoring().unfused_writes(), 4u);
  EXPECT_EQ(f.fused_io(), (FusedIo{3, 1, 0}));
  EXPECT_EQ(f.properties(), (FuserProperties{true, 630}));
  EXPECT_EQ(f.estimate_bindings(), 1u + 3u + 1u);
}

TEST(TraceFuserScore, AddThenExp210) {
  const Shape s{1, 1};
  EXPECT_EQ(score_of({add(T(0, s, RO), T(1, s, RO), T(2, s, NI)), exp_op(T(2, s, RW), T(3, s, NI))}), 210u);
}

TEST(TraceFuserScore, LoneExpIsReadyButScoresZero) {
  TraceFuser f = elementwise();
  f.fuse(exp_op(T(0, {1, 1}, RO), T(1, {1, 1}, NI)));
  EXPECT_EQ(f.properties(), (FuserProperties{true, 0}));
}

TEST(TraceFuserScore, FiveChainsInOneTrace7390) {
  const std::vector<Operation> ops = chains(5);
  ASSERT_EQ(ops.size(), 40u);
  TraceFuser f = elementwise();
  for (const Operation& op : ops) f.fuse(op);
  EXPECT_EQ(f.num_ops(), 40u);
  EXPECT_EQ(f.fused_io(), (FusedIo{5, 5, 0}));
  EXPECT_EQ(f.properties().score, 7390u);
  EXPECT_EQ(f.estimate_bindings(), 11u);  // 1 + 5 inputs + 5 outputs
}

TEST(TraceFuserScore, SixChains8870) { EXPECT_EQ(score_of(chains(6)), 8870u); }

TEST(TraceFuserScore, XTimesX100) {
  const Shape s{1, 1};
  EXPECT_EQ(score_of({mul(T(0, s, RO), T(0, s, RO), T(1, s, NI))}), 100u);
}

TEST(TraceFuserScore, LoneGather200) {
  TraceFuser f = elementwise();
  f.fuse(gather(T(0, {1, 2}, RO), T(1, {1, 2}, RO, ir::dtypes::i64), T(2, {1, 2}, NI), 1));
  EXPECT_EQ(f.num_ops(), 1u);
  EXPECT_EQ(f.fused_io(), (FusedIo{0, 1, 0}));
  EXPECT_EQ(f.properties().score, 200u);
  const FusedProgram p = f.finish(ProgramKind::Elementwise);
  ASSERT_EQ(p.inputs.size(), 2u);
  EXPECT_EQ(p.inputs[0].role, InputRole::Indexed);
  EXPECT_EQ(p.inputs[1].role, InputRole::Indexed);
  ASSERT_EQ(p.blocks[0].instructions.size(), 1u);
  EXPECT_EQ(p.blocks[0].instructions[0].operands[0], Operand::input(0));
  EXPECT_EQ(p.blocks[0].instructions[0].attrs[0], 1);
  EXPECT_TRUE(p.blocks[0].loads.empty());
}

TEST(TraceFuserScore, ExpThenDrop110) {
  const Shape s{1, 1};
  EXPECT_EQ(score_of({exp_op(T(0, s, RO), T(1, s, NI)), drop(T(0, s, RW))}), 110u);
}

// ---- Output compatibility (§14.2).

TEST(OutputCompatibility, FirstOutputSetsTheShape) {
  TraceFuser f = elementwise();
  EXPECT_TRUE(f.output_is_compatible(T(0, {1, 2}, NI)));
  EXPECT_EQ(f.current_output_shape(), (Shape{1, 2}));
  EXPECT_TRUE(f.output_is_compatible(T(1, {1, 2}, NI)));
  EXPECT_FALSE(f.output_is_compatible(T(2, {1, 2, 3}, NI)));  // rank differs
  EXPECT_FALSE(f.output_is_compatible(T(3, {1, 3}, NI)));     // different real sizes
  EXPECT_EQ(f.current_output_shape(), (Shape{1, 2}));
}

TEST(OutputCompatibility, BroadcastOutputKeepsTheShape) {
  TraceFuser f = elementwise();
  ASSERT_TRUE(f.output_is_compatible(T(0, {1, 2}, NI)));
  EXPECT_TRUE(f.output_is_compatible(T(1, {1, 0}, NI)));
  EXPECT_EQ(f.current_output_shape(), (Shape{1, 2}));
}

TEST(OutputCompatibility, SizeOneGrowsWithShapeUpdates) {
  TraceFuser f = elementwise();
  ASSERT_TRUE(f.output_is_compatible(T(0, {1, 0}, NI)));
  EXPECT_TRUE(f.output_is_compatible(T(1, {1, 2}, NI)));
  EXPECT_EQ(f.current_output_shape(), (Shape{1, 2}));
  // An update must produce exactly the new shape: growing dim 0 while dim 1 broadcasts fails.
  TraceFuser g = elementwise();
  ASSERT_TRUE(g.output_is_compatible(T(0, {0, 2}, NI)));
  EXPECT_FALSE(g.output_is_compatible(T(1, {1, 0}, NI)));
  EXPECT_EQ(g.current_output_shape(), (Shape{0, 2}));
}

TEST(OutputCompatibility, NoShapeUpdates) {
  TraceFuser f(FuseSettings::matmul_epilogue(), 64);
  ASSERT_TRUE(f.output_is_compatible(T(0, {1, 0}, NI)));
  EXPECT_FALSE(f.output_is_compatible(T(1, {1, 2}, NI)));
  EXPECT_TRUE(f.output_is_compatible(T(1, {1, 0}, NI)));
  EXPECT_TRUE(f.output_is_compatible(T(2, {0, 0}, NI)));  // broadcast is still on
}

TEST(OutputCompatibility, NoBroadcast) {
  TraceFuser f(FuseSettings::reduce_read(), 64);
  ASSERT_TRUE(f.output_is_compatible(T(0, {1, 2}, NI)));
  EXPECT_FALSE(f.output_is_compatible(T(1, {1, 0}, NI)));
  TraceFuser g(FuseSettings::reduce_read(), 64);
  ASSERT_TRUE(g.output_is_compatible(T(0, {1, 0}, NI)));
  EXPECT_FALSE(g.output_is_compatible(T(1, {1, 2}, NI)));  // updates need broadcast on
}

TEST(OutputCompatibility, RejectedOpLeavesTheShapeAlone) {
  Captured c;
  TraceFuser f = elementwise(64, c.log);
  f.fuse(add(T(0, {1, 0}, RO), T(1, {1, 0}, RO), T(2, {1, 0}, NI)));
  // Compatible output ([1,0] grows to [1,2]) but a quantized input cannot be read.
  const ir::DType q = ir::DType::qfloat(ir::QuantScheme{});
  Operation bad = add(T(2, {1, 0}, RW), T(3, {1, 2}, RO), T(4, {1, 2}, NI));
  bad.tensors[1].dtype = q;
  f.fuse(bad);
  EXPECT_EQ(f.status(), FuserStatus::Closed);
  EXPECT_EQ(f.current_output_shape(), (Shape{1, 0}));
  EXPECT_EQ(f.finish(ProgramKind::Elementwise).blocks[0].reference_shape, (Shape{1, 0}));
}

TEST(OutputCompatibility, IncompatibleOutputClosesTheFuser) {
  TraceFuser f = elementwise();
  f.fuse(exp_op(T(0, {1, 2}, RO), T(1, {1, 2}, NI)));
  f.fuse(exp_op(T(2, {3, 2}, RO), T(3, {3, 2}, NI)));
  EXPECT_EQ(f.status(), FuserStatus::Closed);
  EXPECT_EQ(f.num_ops(), 1u);
}

// ---- Broadcast inputs.

TEST(TraceFuserProgram, BroadcastInputIsMarked) {
  TraceFuser f = elementwise();
  f.fuse(add(T(0, {1, 2}, RO), T(1, {1, 0}, RO), T(2, {1, 2}, NI)));
  const FusedProgram p = f.finish(ProgramKind::Elementwise);
  ASSERT_EQ(p.inputs.size(), 2u);
  EXPECT_EQ(p.inputs[0].role, InputRole::Plain);
  EXPECT_EQ(p.inputs[1].role, InputRole::Broadcast);
  ASSERT_EQ(p.blocks[0].loads.size(), 2u);
  EXPECT_FALSE(p.blocks[0].loads[0].broadcast);
  EXPECT_TRUE(p.blocks[0].loads[1].broadcast);
  EXPECT_EQ(p.blocks[0].reference_shape, (Shape{1, 2}));
}

// ---- Trace limits.

TEST(TraceLimits, MoreThan64FusedOpsRejected) {
  Captured c;
  TraceFuser f = elementwise(64, c.log);
  const Shape s{1, 1};
  f.fuse(add_scalar(T(0, s, RO), 0, T(1, s, NI)));
  for (std::uint64_t i = 1; i < 65; ++i) f.fuse(add_scalar(T(i, s, RW), i, T(i + 1, s, NI)));
  EXPECT_EQ(f.num_ops(), 65u);  // rejected only when the trace already holds more than 64
  EXPECT_EQ(f.status(), FuserStatus::Open);
  // A Drop bypasses the limits.
  f.fuse(drop(T(1000, s, RW)));
  EXPECT_EQ(f.num_ops(), 66u);
  f.fuse(add_scalar(T(65, s, RW), 65, T(66, s, NI)));
  EXPECT_EQ(f.status(), FuserStatus::Closed);
  EXPECT_EQ(f.num_ops(), 66u);
  ASSERT_EQ(c.capture->lines().size(), 1u);
  EXPECT_EQ(c.capture->lines()[0],
            "[fuser] closed on NumericFloat (numeric fuse rejected); had 66 ops, est_bindings=3/64");
}

TEST(TraceLimits, BindingsLimit) {
  Captured c;
  TraceFuser f = elementwise(4, c.log);
  const Shape s{1, 1};
  f.fuse(add(T(0, s, RO), T(1, s, RO), T(2, s, NI)));  // 1 + 2 inputs + 1 output = 4
  EXPECT_EQ(f.estimate_bindings(), 4u);
  f.fuse(exp_op(T(2, s, RW), T(3, s, NI)));  // still 4: t2 is consumed
  EXPECT_EQ(f.num_ops(), 2u);
  f.fuse(add(T(3, s, RW), T(4, s, RO), T(5, s, NI)));  // a third input: 5 > 4
  EXPECT_EQ(f.status(), FuserStatus::Closed);
  EXPECT_EQ(f.num_ops(), 2u);
  ASSERT_EQ(c.capture->lines().size(), 1u);
  EXPECT_EQ(c.capture->lines()[0],
            "[fuser] closed on NumericFloat (numeric fuse rejected); had 2 ops, est_bindings=4/4");
}

TEST(TraceLimits, FirstOpSkipsTheBindingsCheck) {
  TraceFuser f = elementwise(2);
  const Shape s{1, 1};
  f.fuse(add(T(0, s, RO), T(1, s, RO), T(2, s, NI)));  // needs 4 > 2, accepted anyway
  EXPECT_EQ(f.num_ops(), 1u);
  EXPECT_EQ(f.estimate_bindings(), 4u);
  f.fuse(exp_op(T(2, s, RW), T(3, s, NI)));  // checked from now on
  EXPECT_EQ(f.status(), FuserStatus::Closed);
  EXPECT_EQ(f.num_ops(), 1u);
}

TEST(TraceLimits, ResetRestoresTheFirstOpFlag) {
  TraceFuser f = elementwise(2);
  const Shape s{1, 1};
  f.fuse(add(T(0, s, RO), T(1, s, RO), T(2, s, NI)));
  f.reset();
  EXPECT_EQ(f.num_ops(), 0u);
  EXPECT_EQ(f.status(), FuserStatus::Open);
  f.fuse(add(T(0, s, RO), T(1, s, RO), T(2, s, NI)));
  EXPECT_EQ(f.num_ops(), 1u);
}

// ---- Views.

TEST(TraceFuserViews, ViewOfATensorSeenFirstIsRejected) {
  Captured c;
  TraceFuser f = elementwise(64, c.log);
  f.fuse(swap_dims(T(0, {1, 1}, RW), T(1, {1, 1}, NI), 0, 1));
  EXPECT_EQ(f.status(), FuserStatus::Closed);
  EXPECT_FALSE(f.properties().ready);
  ASSERT_EQ(c.capture->lines().size(), 1u);
  EXPECT_EQ(c.capture->lines()[0], "[fuser] closed on BaseFloat (base fuse rejected); had 0 ops, est_bindings=1/64");
}

TEST(TraceFuserViews, ViewOfAnInputAlreadyReadIsFused) {
  TraceFuser f = elementwise();
  const Shape s{1, 1};
  f.fuse(exp_op(T(0, s, RO), T(1, s, NI)));
  f.fuse(swap_dims(T(0, s, RW), T(2, s, NI), 0, 1));
  EXPECT_EQ(f.status(), FuserStatus::Open);
  EXPECT_EQ(f.num_ops(), 2u);
  EXPECT_EQ(f.num_views(), 1u);
  EXPECT_EQ(f.trace().num_element_ops(), 1u);  // a view is not an element op
  // Reads: t0 plainly and through the view; writes t1 and t2 (both still NotInit).
  EXPECT_EQ(f.fused_io(), (FusedIo{2, 2, 1}));
  EXPECT_EQ(f.properties().score, 0u);  // (4 - 4) * 100 + 10 - 50, floored
  f.fuse(add(T(1, s, RW), T(2, s, RW), T(3, s, NI)));
  EXPECT_EQ(f.fused_io(), (FusedIo{2, 1, 1}));
  EXPECT_EQ(f.properties().score, 370u);  // (7 - 3) * 100 + 20 - 50

  const FusedProgram p = f.finish(ProgramKind::Elementwise);
  ASSERT_EQ(p.inputs.size(), 2u);
  EXPECT_EQ(p.inputs[0].role, InputRole::Plain);
  EXPECT_EQ(p.inputs[0].status, RW);  // the view was the last use
  EXPECT_EQ(p.inputs[1].role, InputRole::View);
  EXPECT_EQ(p.inputs[1].tensor, 0u);
  ASSERT_TRUE(p.inputs[1].view.has_value());
  EXPECT_EQ(p.inputs[1].view->op, OpKind::Base_SwapDims);
  EXPECT_EQ(p.inputs[1].view->source, 0u);
  EXPECT_EQ(p.inputs[1].view->dim1, 0);
  EXPECT_EQ(p.inputs[1].view->dim2, 1);
  EXPECT_EQ(p.num_bindings(), 2u);  // t0 and the output t3
}

TEST(TraceFuserViews, ViewOfAnInTraceResultIsRejected) {
  TraceFuser f = elementwise();
  const Shape s{1, 1};
  f.fuse(exp_op(T(0, s, RO), T(1, s, NI)));
  f.fuse(swap_dims(T(1, s, RW), T(2, s, NI), 0, 1));
  EXPECT_EQ(f.status(), FuserStatus::Closed);
  EXPECT_EQ(f.num_ops(), 1u);
}

TEST(TraceFuserViews, ReshapeWithTheSameRelativeShapeIsACopy) {
  TraceFuser f = elementwise();
  f.fuse(reshape(T(0, {1, 2}, RO), T(1, {1, 2}, NI)));  // first op: not a view
  EXPECT_EQ(f.num_ops(), 1u);
  EXPECT_EQ(f.num_views(), 0u);
  EXPECT_EQ(f.trace().num_element_ops(), 1u);
  const FusedProgram p = f.finish(ProgramKind::Elementwise);
  ASSERT_EQ(p.blocks[0].instructions.size(), 1u);
  EXPECT_EQ(p.blocks[0].instructions[0].op, OpKind::Base_Reshape);
  EXPECT_EQ(p.blocks[0].instructions[0].operands[0], Operand::local(0));
}

TEST(TraceFuserViews, ReshapeViewOfAnInputAlreadyRead) {
  // a is [1, N] (relative [0,1]); a + b broadcasts to [1,1]; a.reshape([N, 1]) is [1,0].
  TraceFuser f = elementwise();
  f.fuse(add(T(0, {0, 1}, RO), T(1, {1, 1}, RO), T(2, {1, 1}, NI)));
  f.fuse(reshape(T(0, {0, 1}, RW), T(3, {1, 0}, NI)));
  EXPECT_EQ(f.num_ops(), 2u);
  EXPECT_EQ(f.num_views(), 1u);
  f.fuse(add(T(2, {1, 1}, RW), T(3, {1, 0}, RW), T(4, {1, 1}, NI)));
  EXPECT_EQ(f.num_ops(), 3u);
  EXPECT_EQ(f.fused_io(), (FusedIo{3, 1, 1}));
  EXPECT_EQ(f.properties().score, 370u);  // (8 - 4) * 100 + 20 - 50
  const FusedProgram p = f.finish(ProgramKind::Elementwise);
  ASSERT_EQ(p.inputs.size(), 3u);
  EXPECT_EQ(p.inputs[0].role, InputRole::Broadcast);
  EXPECT_EQ(p.inputs[2].role, InputRole::View);
  EXPECT_EQ(p.inputs[2].view->op, OpKind::Base_Reshape);
  EXPECT_EQ(p.inputs[2].view->shape, (Shape{1, 0}));
}

TEST(TraceFuserViews, ReshapeToASmallerRankIsRejected) {
  TraceFuser f = elementwise();
  f.fuse(exp_op(T(0, {1, 1, 2}, RO), T(1, {1, 1, 2}, NI)));
  f.fuse(reshape(T(0, {1, 1, 2}, RW), T(2, {1, 3}, NI)));
  EXPECT_EQ(f.status(), FuserStatus::Closed);
  EXPECT_EQ(f.num_ops(), 1u);
}

// ---- Indexed inputs.

TEST(TraceFuserIndexed, IndexedTensorCannotBeReadPlainlyLater) {
  TraceFuser f = elementwise();
  const Shape s{1, 2};
  f.fuse(gather(T(0, s, RO), T(1, s, RO, ir::dtypes::i64), T(2, s, NI), 1));
  f.fuse(add(T(0, s, RO), T(2, s, RW), T(3, s, NI)));
  EXPECT_EQ(f.status(), FuserStatus::Closed);
  EXPECT_EQ(f.num_ops(), 1u);
}

TEST(TraceFuserIndexed, PlainInputCannotBeIndexed) {
  TraceFuser f = elementwise();
  const Shape s{1, 2};
  f.fuse(exp_op(T(0, s, RO), T(1, s, NI)));
  f.fuse(gather(T(0, s, RO), T(2, s, RO, ir::dtypes::i64), T(3, s, NI), 1));
  EXPECT_EQ(f.status(), FuserStatus::Closed);
  EXPECT_EQ(f.num_ops(), 1u);
}

TEST(TraceFuserIndexed, TraceOutputCannotBeIndexed) {
  TraceFuser f = elementwise();
  const Shape s{1, 2};
  f.fuse(exp_op(T(0, s, RO), T(1, s, NI)));
  f.fuse(gather(T(1, s, RW), T(2, s, RO, ir::dtypes::i64), T(3, s, NI), 1));
  EXPECT_EQ(f.status(), FuserStatus::Closed);
}

TEST(TraceFuserIndexed, IndexedTensorCanBeReusedByIndexedReads) {
  TraceFuser f = elementwise();
  const Shape s{1, 2};
  f.fuse(gather(T(0, s, RO), T(1, s, RO, ir::dtypes::i64), T(2, s, NI), 1));
  f.fuse(gather(T(0, s, RW), T(3, s, RO, ir::dtypes::i64), T(4, s, NI), 1));
  EXPECT_EQ(f.num_ops(), 2u);
  EXPECT_EQ(f.status(), FuserStatus::Open);
  const FusedProgram p = f.finish(ProgramKind::Elementwise);
  ASSERT_EQ(p.inputs.size(), 3u);  // t0 once, both index tensors
  EXPECT_EQ(p.inputs[0].status, RW);
}

TEST(TraceFuserIndexed, CatReadsEveryInputIndexed) {
  TraceFuser f = elementwise();
  f.fuse(make(OpKind::Base_Cat, Family::BaseFloat, {T(0, {1, 2}, RO), T(1, {1, 3}, RO)}, {T(2, {1, 4}, NI)}, {}, {1}));
  EXPECT_EQ(f.num_ops(), 1u);
  f.fuse(exp_op(T(2, {1, 4}, RW), T(3, {1, 4}, NI)));
  EXPECT_EQ(f.num_ops(), 2u);
  EXPECT_EQ(f.fused_io(), (FusedIo{0, 1, 0}));
  const FusedProgram p = f.finish(ProgramKind::Elementwise);
  ASSERT_EQ(p.inputs.size(), 2u);
  EXPECT_EQ(p.inputs[0].role, InputRole::Indexed);
  EXPECT_EQ(p.inputs[1].role, InputRole::Indexed);
  EXPECT_EQ(p.blocks[0].instructions[0].operands.size(), 2u);
  EXPECT_EQ(p.blocks[0].reference_shape, (Shape{1, 4}));
}

TEST(TraceFuserProgram, MaskWhereAndComparisonDtypes) {
  TraceFuser f = elementwise();
  const Shape s{1, 1};
  f.fuse(make(OpKind::Numeric_Greater, Family::NumericFloat, {T(0, s, RO), T(1, s, RO)},
              {T(2, s, NI, ir::dtypes::boolean)}));
  f.fuse(make(OpKind::Base_MaskWhere, Family::BaseFloat, {T(0, s, RW), T(2, s, RW, ir::dtypes::boolean), T(1, s, RW)},
              {T(3, s, NI)}));
  EXPECT_EQ(f.num_ops(), 2u);
  const FusedProgram p = f.finish(ProgramKind::Elementwise);
  const auto& ins = p.blocks[0].instructions;
  ASSERT_EQ(ins.size(), 2u);
  EXPECT_EQ(ins[0].compute, ir::dtypes::f32);
  EXPECT_EQ(ins[0].out_dtype, ir::dtypes::boolean);
  EXPECT_EQ(ins[1].operands[1], Operand::local(ins[0].out));
  EXPECT_EQ(p.blocks[0].registers[ins[0].out], ir::dtypes::boolean);
  EXPECT_EQ(f.properties().score, 410u);  // U = 3 + 4, N = 2; F = 2 reads + 1 write
}

TEST(TraceFuserProgram, InPlaceOpReplacesTheTensor) {
  // Log(t0 -> t0) (the in-place form of §19's op3): read t0, then t0 is a new output.
  TraceFuser f = elementwise();
  f.fuse(float_unary(OpKind::Float_Log, T(0, {1, 1}, RO), T(0, {1, 1}, NI)));
  f.fuse(exp_op(T(0, {1, 1}, RW), T(1, {1, 1}, NI)));
  EXPECT_EQ(f.num_ops(), 2u);
  const FusedProgram p = f.finish(ProgramKind::Elementwise);
  ASSERT_EQ(p.inputs.size(), 1u);
  ASSERT_EQ(p.outputs.size(), 2u);
  EXPECT_EQ(p.outputs[0].tensor, 0u);
  EXPECT_FALSE(p.outputs[0].written);  // the new t0 is consumed by the exp
  EXPECT_EQ(p.blocks[0].instructions[1].operands[0], Operand::local(p.blocks[0].instructions[0].out));
}

// ---- Drop, closing, cloning.

TEST(TraceFuserDrop, DropAsFirstOpCloses) {
  Captured c;
  TraceFuser f = elementwise(64, c.log);
  f.fuse(drop(T(0, {1, 1}, RW)));
  EXPECT_EQ(f.status(), FuserStatus::Closed);
  EXPECT_EQ(f.num_ops(), 0u);
  ASSERT_EQ(c.capture->lines().size(), 1u);
  EXPECT_EQ(c.capture->lines()[0], "[fuser] closed on Drop (drop on empty fuser); had 0 ops, est_bindings=1/64");
}

TEST(TraceFuserDrop, DropOfAnOutputMakesItConsumed) {
  TraceFuser f = elementwise();
  const Shape s{1, 1};
  f.fuse(exp_op(T(0, s, RO), T(1, s, NI)));
  f.fuse(exp_op(T(1, s, RO), T(2, s, NI)));
  EXPECT_EQ(f.fused_io().writes, 2u);
  f.fuse(drop(T(1, s, RW)));
  EXPECT_EQ(f.fused_io().writes, 1u);
  const FusedProgram p = f.finish(ProgramKind::Elementwise);
  EXPECT_FALSE(p.outputs[0].written);
  EXPECT_TRUE(p.outputs[1].written);
  EXPECT_TRUE(p.outputs[1].kept);
}

TEST(TraceFuserClose, UnsupportedVariantClosesAndLaterOpsAreIgnored) {
  Captured c;
  TraceFuser f = elementwise(64, c.log);
  const Shape s{1, 1};
  f.fuse(exp_op(T(0, s, RO), T(1, s, NI)));
  f.fuse(make(OpKind::Bool_Not, Family::Bool, {T(1, s, RW, ir::dtypes::boolean)}, {T(2, s, NI, ir::dtypes::boolean)}));
  EXPECT_EQ(f.status(), FuserStatus::Closed);
  f.fuse(exp_op(T(1, s, RW), T(3, s, NI)));
  EXPECT_EQ(f.num_ops(), 1u);
  EXPECT_EQ(f.status(), FuserStatus::Closed);
  ASSERT_EQ(c.capture->lines().size(), 1u);
  EXPECT_EQ(c.capture->lines()[0], "[fuser] closed on Bool (unsupported op variant); had 1 ops, est_bindings=3/64");
}

TEST(TraceFuserClose, RejectedKindsOfAcceptedFamilies) {
  const Shape s{1, 1};
  const std::vector<Operation> rejected = {
      make(OpKind::Numeric_Neg, Family::NumericFloat, {T(1, s, RW)}, {T(2, s, NI)}),
      make(OpKind::Numeric_SumDim, Family::NumericFloat, {T(1, s, RW)}, {T(2, {1, 0}, NI)}, {}, {1, 1}),
      make(OpKind::Base_Permute, Family::BaseFloat, {T(1, s, RW)}, {T(2, s, NI)}, {}, {1, 0}),
      make(OpKind::Float_Round, Family::Float, {T(1, s, RW)}, {T(2, s, NI)}),
      make(OpKind::Float_Matmul, Family::Float, {T(1, s, RW), T(3, s, RO)}, {T(2, s, NI)}),
  };
  for (const Operation& op : rejected) {
    TraceFuser f = elementwise();
    f.fuse(exp_op(T(0, s, RO), T(1, s, NI)));
    f.fuse(op);
    EXPECT_EQ(f.status(), FuserStatus::Closed) << op.to_string();
    EXPECT_EQ(f.num_ops(), 1u) << op.to_string();
  }
}

TEST(TraceFuserClose, NonPlaceholderScalarIsRejected) {
  TraceFuser f = elementwise();
  Operation op = mul_scalar(T(0, {1, 1}, RO), 0, T(1, {1, 1}, NI));
  op.scalars[0] = ir::ScalarIr::Float(2.0);
  f.fuse(op);
  EXPECT_EQ(f.status(), FuserStatus::Closed);
}

TEST(TraceFuserClone, CopiesAreIndependent) {
  TraceFuser a = elementwise();
  const std::vector<Operation> ops = seed_630();
  a.fuse(ops[0]);
  a.fuse(ops[1]);
  TraceFuser b = a;
  b.fuse(ops[2]);
  b.fuse(ops[3]);
  EXPECT_EQ(a.num_ops(), 2u);
  EXPECT_EQ(b.num_ops(), 4u);
  EXPECT_EQ(b.properties().score, 630u);
  a.fuse(ops[2]);
  a.fuse(ops[3]);
  EXPECT_EQ(a.finish(ProgramKind::Elementwise), b.finish(ProgramKind::Elementwise));
}

// ---- Finished programs.

FusedProgram finish_all(const std::vector<Operation>& ops) {
  TraceFuser f = elementwise();
  for (const Operation& op : ops) f.fuse(op);
  EXPECT_EQ(f.num_ops(), ops.size());
  return f.finish(ProgramKind::Elementwise);
}

TEST(FusedProgramTest, Seed630Structure) {
  const FusedProgram p = finish_all(seed_630());
  EXPECT_EQ(p.kind, ProgramKind::Elementwise);
  ASSERT_EQ(p.inputs.size(), 3u);
  EXPECT_EQ(p.inputs[0].tensor, 0u);
  EXPECT_EQ(p.inputs[1].tensor, 1u);
  EXPECT_EQ(p.inputs[2].tensor, 3u);
  EXPECT_EQ(p.scalars, (std::vector<std::uint32_t>{0}));
  ASSERT_EQ(p.blocks.size(), 1u);
  const ProgramBlock& b = p.blocks[0];
  EXPECT_EQ(b.reference_shape, (Shape{1, 1}));
  EXPECT_EQ(b.loads.size(), 3u);
  ASSERT_EQ(b.instructions.size(), 4u);
  EXPECT_EQ(b.instructions[1].op, OpKind::Numeric_MulScalar);
  EXPECT_EQ(b.instructions[1].operands[1], Operand::scalar(0));
  ASSERT_EQ(p.outputs.size(), 4u);
  EXPECT_FALSE(p.outputs[0].written);  // t2, t4, t5 consumed inside
  EXPECT_FALSE(p.outputs[1].written);
  EXPECT_FALSE(p.outputs[2].written);
  EXPECT_TRUE(p.outputs[3].written);
  EXPECT_EQ(p.outputs[3].tensor, 6u);
  ASSERT_EQ(b.stores.size(), 1u);
  EXPECT_EQ(b.stores[0].output, 3u);
  EXPECT_EQ(p.max_relative_shape_id(), 1u);
  EXPECT_EQ(p.num_bindings(), 4u);
}

TEST(FusedProgramTest, Seed630Text) {
  EXPECT_EQ(finish_all(seed_630()).to_string(),
            "ElementWise program (4 ops): 3 input(s), 4 output(s), 1 block(s), scalars [s0]\n"
            "  in0 t0:f32[1,1] ReadOnly plain\n"
            "  in1 t1:f32[1,1] ReadOnly plain\n"
            "  in2 t3:f32[1,1] ReadOnly plain\n"
            "  block 0 ref [1,1] (broadcast=on shape_updates=on inplace=on vectorization=on layout=any)\n"
            "    r0:f32 = load in0\n"
            "    r1:f32 = load in1\n"
            "    r3:f32 = load in2\n"
            "    r2:f32 = NumericFloat::Mul<f32>(r0, r1)\n"
            "    r4:f32 = NumericFloat::MulScalar<f32>(r3, s0)\n"
            "    r5:f32 = NumericFloat::Add<f32>(r2, r4)\n"
            "    r6:f32 = Float::Exp<f32>(r5)\n"
            "    store out3 <- r6\n"
            "  out0 t2:f32[1,1] ReadWrite b0.r2 local\n"
            "  out1 t4:f32[1,1] ReadWrite b0.r4 local\n"
            "  out2 t5:f32[1,1] ReadWrite b0.r5 local\n"
            "  out3 t6:f32[1,1] NotInit b0.r6 written");
}

TEST(FusedProgramTest, HashAndEqualityFollowTheStructure) {
  const FusedProgram a = finish_all(seed_630());
  const FusedProgram b = finish_all(seed_630());
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.structural_hash(), b.structural_hash());

  // Same program on [1,2] (e.g. 64x32): other relative shapes, another kernel.
  std::vector<Operation> other = seed_630();
  for (Operation& op : other)
    for (TensorIr& t : op.tensors) t.shape = Shape{1, 2};
  const FusedProgram c = finish_all(other);
  EXPECT_NE(a, c);
  EXPECT_NE(a.structural_hash(), c.structural_hash());
  EXPECT_EQ(c.max_relative_shape_id(), 2u);

  // Another op.
  std::vector<Operation> third = seed_630();
  third[3] = float_unary(OpKind::Float_Log, T(5, {1, 1}, RW), T(6, {1, 1}, NI));
  const FusedProgram d = finish_all(third);
  EXPECT_NE(a, d);
  EXPECT_NE(a.structural_hash(), d.structural_hash());

  // Another status (the output t6 consumed by a later Drop changes what is written).
  std::vector<Operation> fourth = seed_630();
  fourth.push_back(drop(T(6, {1, 1}, RW)));
  const FusedProgram e = finish_all(fourth);
  EXPECT_NE(a, e);
  EXPECT_NE(a.structural_hash(), e.structural_hash());
}

TEST(FusedProgramTest, EmptyProgramHasNoShapeId) {
  TraceFuser f = elementwise();
  const FusedProgram p = f.finish(ProgramKind::Elementwise);
  EXPECT_EQ(p.max_relative_shape_id(), std::nullopt);
  EXPECT_TRUE(p.outputs.empty());
}

TEST(FusedOptimizationTest, WrapsTheProgram) {
  FusedProgram p = finish_all(seed_630());
  p.len = 4;
  const FusedOptimization opt(p, 4);
  EXPECT_EQ(opt.name(), "ElementWise");
  EXPECT_EQ(opt.len(), 4u);
  EXPECT_EQ(opt.max_relative_shape_id(), 1u);
  EXPECT_EQ(opt.describe(), p.to_string());
  EXPECT_EQ(opt.program(), p);
}

TEST(ReduceAccumulator, Widening) {
  EXPECT_EQ(reduce_accumulator(OpKind::Numeric_SumDim, ir::dtypes::f16), ir::dtypes::f32);
  EXPECT_EQ(reduce_accumulator(OpKind::Numeric_MeanDim, ir::dtypes::bf16), ir::dtypes::f32);
  EXPECT_EQ(reduce_accumulator(OpKind::Numeric_ProdDim, ir::dtypes::i8), ir::dtypes::i32);
  EXPECT_EQ(reduce_accumulator(OpKind::Numeric_SumDim, ir::dtypes::u16), ir::dtypes::u32);
  EXPECT_EQ(reduce_accumulator(OpKind::Numeric_SumDim, ir::dtypes::f32), ir::dtypes::f32);
  EXPECT_EQ(reduce_accumulator(OpKind::Numeric_MaxDim, ir::dtypes::f16), ir::dtypes::f16);
  EXPECT_EQ(reduce_accumulator(OpKind::Numeric_ArgMax, ir::dtypes::i8), ir::dtypes::i8);
}

}  // namespace
}  // namespace kiln::fusion
