// A catalog of fused programs for the CUDA generator's tests: single operations of every kind the
// generator covers, across dtypes and broadcast patterns (one-op programs, single_op.h), and
// programs the real fusers build from op sequences (elementwise chains, reductions with prologue
// and epilogue, softmax, matmul with its epilogue, views, indexed reads).
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "kiln/cuda/single_op.h"
#include "kiln/fusion/fused_program.h"
#include "kiln/fusion/fusers.h"
#include "kiln/fusion/plan_store.h"
#include "kiln/fusion/stream.h"
#include "kiln/ir/builders.h"
#include "kiln/testing/status.h"

namespace kiln::cuda::testing {

using ir::DType;
using ir::Family;
using ir::Operation;
using ir::OpKind;
using ir::ScalarIr;
using ir::Shape;
using ir::TensorId;
using ir::TensorIr;
using ir::TensorStatus;
namespace dt = ir::dtypes;
namespace b = ir::build;

struct NamedProgram {
  std::string name;
  fusion::FusedProgram program;
  std::vector<ir::Operation> ops;         // the global ops it covers (fused captures) or the single op
  std::optional<SingleOpProgram> single;  // single-op programs: their own relative tables
  // Fused captures: the converter's relative tables at the capture (the sizes of that trace).
  std::vector<ir::TensorIr> tensors;
  std::vector<std::uint64_t> dims;
  std::vector<ir::ScalarIr> scalars;
  Binding binding() const { return Binding{tensors, dims, scalars}; }
};

// Records every fused program an executor is asked to run (nothing runs).
class CaptureExecutor final : public fusion::Executor {
 public:
  void execute_optimization(const fusion::Optimization& opt, const fusion::ExecutionContext& ctx) override {
    const auto* f = dynamic_cast<const fusion::FusedOptimization*>(&opt);
    if (f == nullptr) return;
    NamedProgram p;
    p.program = f->program();
    for (std::size_t i = 0; i < opt.len(); ++i) p.ops.push_back(ctx.operation_within_optimization(i));
    const ir::RelativeConverter& c = ctx.converter();
    p.tensors.assign(c.tensors_rel2glob().begin(), c.tensors_rel2glob().end());
    p.dims.assign(c.shapes_rel2glob().begin(), c.shapes_rel2glob().end());
    p.scalars.assign(c.scalars().begin(), c.scalars().end());
    captured.push_back(std::move(p));
  }
  void execute_operation(const ir::Operation&) override {}
  void free_tensor(const ir::TensorIr&) override {}
  std::vector<NamedProgram> captured;
};

using ::kiln::testing::ok;
inline TensorIr use(TensorIr t, TensorStatus s) {
  t.status = s;
  return t;
}

inline Family num_family(DType d) { return d.is_float() ? Family::NumericFloat : Family::NumericInt; }
inline Family base_family(DType d) {
  return d.is_float() ? Family::BaseFloat : d.is_bool() ? Family::BaseBool : Family::BaseInt;
}
inline ScalarIr scalar_for(DType d, double v) {
  if (d.is_float()) return ScalarIr::Float(v);
  if (d.is_int()) return ScalarIr::Int(static_cast<std::int64_t>(v));
  if (d.is_uint()) return ScalarIr::UInt(static_cast<std::uint64_t>(v < 0 ? -v : v));
  return ScalarIr::Bool(v != 0);
}

// Builds op sequences and records the programs the fusers make of them.
class Recorder {
 public:
  Recorder() = default;
  TensorId id() { return TensorId{next_++}; }
  TensorIr input(Shape s, DType d) { return TensorIr{id(), std::move(s), TensorStatus::ReadOnly, d}; }
  TensorIr add(Operation op) {
    TensorIr o = op.outputs()[0];
    o.status = TensorStatus::ReadOnly;
    stream_.register_op(std::move(op), store_, exec_);
    return o;
  }
  // Drains and names the programs captured since the last call.
  void finish(const std::string& name, std::vector<NamedProgram>& out) {
    stream_.drain(store_, exec_);
    for (std::size_t i = 0; i < exec_.captured.size(); ++i) {
      exec_.captured[i].name = name + (exec_.captured.size() > 1 ? "#" + std::to_string(i) : "");
      out.push_back(std::move(exec_.captured[i]));
    }
    exec_.captured.clear();
  }

 private:
  std::uint64_t next_ = 1;
  fusion::FusionLog log_;
  fusion::ExecutionPlanStore store_;
  CaptureExecutor exec_;
  // With kiln's row fuser: the softmax programs are Row programs (their first stage a reduction
  // with an empty prologue), the other kinds as Burn's search makes them.
  fusion::FusionStream stream_{fusion::default_fusers(log_, fusion::FuserOptions{.row_fuser = true}),
                               fusion::ProcessorOptions{}, log_};
};

inline void add_single(std::vector<NamedProgram>& out, const std::string& name, Result<Operation> r) {
  if (!r.ok()) {
    ADD_FAILURE() << name << ": " << r.error().to_string();
    return;
  }
  Operation op = std::move(r).value();
  std::optional<SingleOpProgram> s = single_op_program(op);
  if (!s) {
    ADD_FAILURE() << name << ": no one-op program";
    return;
  }
  NamedProgram p;
  p.name = name;
  p.program = s->program;
  p.ops.push_back(op);
  p.single = std::move(s);
  out.push_back(std::move(p));
}

// Single ops: every instruction kind the generator emits, in the dtypes it admits.
inline std::vector<NamedProgram> single_op_catalog() {
  std::vector<NamedProgram> out;
  std::uint64_t next = 1000;
  auto t = [&](Shape s, DType d) { return TensorIr{TensorId{next++}, std::move(s), TensorStatus::ReadOnly, d}; };
  auto o = [&]() { return TensorId{next++}; };
  const DType floats[] = {dt::f32, dt::f64, dt::f16, dt::bf16};
  const DType ints[] = {dt::i64, dt::i32, dt::i8, dt::u8, dt::u32};
  const Shape s{4, 5};
  for (DType d : floats) {
    const std::string n = d.name();
    const Family nf = Family::NumericFloat;
    for (OpKind k :
         {OpKind::Numeric_Add, OpKind::Numeric_Sub, OpKind::Numeric_Mul, OpKind::Numeric_Div, OpKind::Numeric_Rem})
      add_single(out, n + " binary " + std::string(ir::op_info(k).variant), b::binary(nf, k, t(s, d), t(s, d), o()));
    add_single(out, n + " powf", b::binary(Family::Float, OpKind::Float_Powf, t(s, d), t(s, d), o()));
    // broadcast patterns: row, column, one element
    add_single(out, n + " add [4,1]x[1,5]", b::binary(nf, OpKind::Numeric_Add, t({4, 1}, d), t({1, 5}, d), o()));
    add_single(out, n + " mul [4,5]x[1,1]", b::binary(nf, OpKind::Numeric_Mul, t(s, d), t({1, 1}, d), o()));
    add_single(out, n + " sub [2,1,3]x[1,4,3]",
               b::binary(nf, OpKind::Numeric_Sub, t({2, 1, 3}, d), t({1, 4, 3}, d), o()));
    for (OpKind k : {OpKind::Numeric_AddScalar, OpKind::Numeric_MulScalar, OpKind::Numeric_DivScalar,
                     OpKind::Numeric_RemScalar, OpKind::Numeric_ClampMin, OpKind::Numeric_ClampMax})
      add_single(out, n + " scalar " + std::string(ir::op_info(k).variant),
                 b::scalar(nf, k, t(s, d), ScalarIr::Float(1.5), o()));
    add_single(out, n + " powf_scalar",
               b::scalar(Family::Float, OpKind::Float_PowfScalar, t(s, d), ScalarIr::Float(2.5), o()));
    for (OpKind k : {OpKind::Float_Exp, OpKind::Float_Log, OpKind::Float_Log1p, OpKind::Float_Erf, OpKind::Float_Sqrt,
                     OpKind::Float_Cos, OpKind::Float_Sin, OpKind::Float_Tanh, OpKind::Float_Recip, OpKind::Float_Round,
                     OpKind::Float_Floor, OpKind::Float_Ceil, OpKind::Float_Trunc})
      add_single(out, n + " " + std::string(ir::op_info(k).variant), b::unary(Family::Float, k, t(s, d), o()));
    for (OpKind k : {OpKind::Numeric_Abs, OpKind::Numeric_Neg, OpKind::Numeric_Sign})
      add_single(out, n + " " + std::string(ir::op_info(k).variant), b::unary(nf, k, t(s, d), o()));
    add_single(out, n + " is_nan", b::unary_comparison(Family::Float, OpKind::Float_IsNan, t(s, d), dt::boolean, o()));
    add_single(out, n + " is_inf", b::unary_comparison(Family::Float, OpKind::Float_IsInf, t(s, d), dt::boolean, o()));
    add_single(out, n + " greater",
               b::binary_comparison(nf, OpKind::Numeric_Greater, t(s, d), t({1, 5}, d), dt::boolean, o()));
    add_single(out, n + " equal",
               b::binary_comparison(Family::BaseFloat, OpKind::Base_Equal, t(s, d), t(s, d), dt::boolean, o()));
    add_single(
        out, n + " lower_equal_elem",
        b::scalar_comparison(nf, OpKind::Numeric_LowerEqualElem, t(s, d), ScalarIr::Float(0.5), dt::boolean, o()));
    add_single(out, n + " clamp",
               b::clamp(nf, OpKind::Numeric_Clamp, t(s, d), ScalarIr::Float(-1), ScalarIr::Float(1), o()));
    add_single(out, n + " mask_where",
               b::mask_where(Family::BaseFloat, OpKind::Base_MaskWhere, t(s, d), t({4, 1}, dt::boolean), t(s, d), o()));
    add_single(
        out, n + " mask_fill",
        b::mask_fill(Family::BaseFloat, OpKind::Base_MaskFill, t(s, d), t(s, dt::boolean), ScalarIr::Float(0), o()));
    for (DType to : {dt::f32, dt::f64, dt::f16, dt::bf16})
      if (!(to == d))
        add_single(out, n + " cast to " + to.name(), b::cast(Family::BaseFloat, OpKind::Base_Cast, t(s, d), to, o()));
    add_single(out, n + " into_int i32", b::cast(Family::Float, OpKind::Float_IntoInt, t(s, d), dt::i32, o()));
    add_single(out, n + " into_int u8", b::cast(Family::Float, OpKind::Float_IntoInt, t(s, d), dt::u8, o()));
    for (OpKind k : {OpKind::Numeric_SumDim, OpKind::Numeric_MeanDim, OpKind::Numeric_ProdDim, OpKind::Numeric_MaxDim,
                     OpKind::Numeric_MinDim, OpKind::Numeric_MaxAbsDim})
      add_single(out, n + " " + std::string(ir::op_info(k).variant), b::reduce_dim(nf, k, t({6, 7, 8}, d), 1, 1, o()));
    add_single(out, n + " argmax last", b::reduce_dim_arg(nf, OpKind::Numeric_ArgMax, t(s, d), 1, 1, dt::i64, o()));
    add_single(out, n + " argmin first", b::reduce_dim_arg(nf, OpKind::Numeric_ArgMin, t(s, d), 0, 1, dt::i32, o()));
    add_single(out, n + " sum all", b::reduce(nf, OpKind::Numeric_Sum, t(s, d), o()));
    add_single(out, n + " max all", b::reduce(nf, OpKind::Numeric_Max, t(s, d), o()));
    add_single(out, n + " matmul",
               b::matmul(Family::Float, OpKind::Float_Matmul, t({2, 8, 16}, d), t({2, 16, 4}, d), o()));
    add_single(out, n + " full", b::full(nf, OpKind::Numeric_Full, s, d, ScalarIr::Float(3), o()));
    add_single(out, n + " ones", b::creation(Family::BaseFloat, OpKind::Base_Ones, s, d, o()));
    add_single(out, n + " swap_dims",
               b::swap_dims(Family::BaseFloat, OpKind::Base_SwapDims, t({3, 4, 5}, d), 0, 2, o()));
    const std::uint64_t axes[] = {2, 0, 1};
    add_single(out, n + " permute", b::permute(Family::BaseFloat, OpKind::Base_Permute, t({3, 4, 5}, d), axes, o()));
    add_single(out, n + " gather",
               b::gather(Family::BaseFloat, OpKind::Base_Gather, t(s, d), 1, t({4, 3}, dt::i64), o()));
    add_single(out, n + " select", b::select(Family::BaseFloat, OpKind::Base_Select, t(s, d), 0, t({7}, dt::i32), o()));
    const TensorIr parts[] = {t({2, 5}, d), t({3, 5}, d)};
    add_single(out, n + " cat", b::cat(Family::BaseFloat, OpKind::Base_Cat, parts, 0, o()));
  }
  for (DType d : ints) {
    const std::string n = d.name();
    const Family nf = Family::NumericInt;
    for (OpKind k :
         {OpKind::Numeric_Add, OpKind::Numeric_Sub, OpKind::Numeric_Mul, OpKind::Numeric_Div, OpKind::Numeric_Rem})
      add_single(out, n + " binary " + std::string(ir::op_info(k).variant),
                 b::binary(nf, k, t(s, d), t({1, 5}, d), o()));
    for (OpKind k : {OpKind::Int_BitwiseAnd, OpKind::Int_BitwiseOr, OpKind::Int_BitwiseXor,
                     OpKind::Int_BitwiseLeftShift, OpKind::Int_BitwiseRightShift})
      add_single(out, n + " " + std::string(ir::op_info(k).variant), b::binary(Family::Int, k, t(s, d), t(s, d), o()));
    for (OpKind k :
         {OpKind::Int_BitwiseAndScalar, OpKind::Int_BitwiseLeftShiftScalar, OpKind::Int_BitwiseRightShiftScalar})
      add_single(out, n + " " + std::string(ir::op_info(k).variant),
                 b::scalar(Family::Int, k, t(s, d), scalar_for(d, 3), o()));
    add_single(out, n + " bitwise_not", b::unary(Family::Int, OpKind::Int_BitwiseNot, t(s, d), o()));
    for (OpKind k : {OpKind::Numeric_AddScalar, OpKind::Numeric_DivScalar, OpKind::Numeric_RemScalar})
      add_single(out, n + " scalar " + std::string(ir::op_info(k).variant),
                 b::scalar(nf, k, t(s, d), scalar_for(d, 3), o()));
    for (OpKind k : {OpKind::Numeric_Abs, OpKind::Numeric_Neg, OpKind::Numeric_Sign})
      add_single(out, n + " " + std::string(ir::op_info(k).variant), b::unary(nf, k, t(s, d), o()));
    add_single(out, n + " lower", b::binary_comparison(nf, OpKind::Numeric_Lower, t(s, d), t(s, d), dt::boolean, o()));
    add_single(out, n + " clamp",
               b::clamp(nf, OpKind::Numeric_Clamp, t(s, d), scalar_for(d, 1), scalar_for(d, 9), o()));
    add_single(out, n + " into_float f32", b::cast(Family::Int, OpKind::Int_IntoFloat, t(s, d), dt::f32, o()));
    add_single(out, n + " into_float f16", b::cast(Family::Int, OpKind::Int_IntoFloat, t(s, d), dt::f16, o()));
    add_single(out, n + " cast i16", b::cast(Family::BaseInt, OpKind::Base_Cast, t(s, d), dt::i16, o()));
    for (OpKind k :
         {OpKind::Numeric_SumDim, OpKind::Numeric_MeanDim, OpKind::Numeric_MaxDim, OpKind::Numeric_MaxAbsDim})
      add_single(out, n + " " + std::string(ir::op_info(k).variant), b::reduce_dim(nf, k, t({6, 7}, d), 0, 1, o()));
    add_single(out, n + " argmax", b::reduce_dim_arg(nf, OpKind::Numeric_ArgMax, t(s, d), 1, 1, dt::i64, o()));
    add_single(out, n + " prod all", b::reduce(nf, OpKind::Numeric_Prod, t(s, d), o()));
    add_single(
        out, n + " mask_fill",
        b::mask_fill(Family::BaseInt, OpKind::Base_MaskFill, t(s, d), t({1, 5}, dt::boolean), scalar_for(d, 7), o()));
    add_single(out, n + " zeros", b::creation(Family::BaseInt, OpKind::Base_Zeros, s, d, o()));
  }
  for (DType d : {dt::boolean, DType::boolean(ir::BoolStore::U32)}) {
    const std::string n = d.name();
    for (OpKind k : {OpKind::Bool_And, OpKind::Bool_Or, OpKind::Bool_Xor})
      add_single(out, n + " " + std::string(ir::op_info(k).variant),
                 b::binary(Family::Bool, k, t(s, d), t({4, 1}, d), o()));
    add_single(out, n + " not", b::unary(Family::Bool, OpKind::Bool_Not, t(s, d), o()));
    add_single(out, n + " equal", b::binary_comparison(Family::BaseBool, OpKind::Base_Equal, t(s, d), t(s, d), d, o()));
    add_single(out, n + " any_dim", b::reduce_dim_bool(Family::BaseBool, OpKind::Base_AnyDim, t(s, d), 1, 1, d, o()));
    add_single(out, n + " all", b::reduce_bool(Family::BaseBool, OpKind::Base_All, t(s, d), d, o()));
    add_single(out, n + " into_float", b::cast(Family::Bool, OpKind::Bool_IntoFloat, t(s, d), dt::f32, o()));
    add_single(out, n + " into_int", b::cast(Family::Bool, OpKind::Bool_IntoInt, t(s, d), dt::i64, o()));
    add_single(out, n + " mask_where",
               b::mask_where(Family::BaseBool, OpKind::Base_MaskWhere, t(s, d), t(s, dt::boolean), t(s, d), o()));
  }
  return out;
}

// Programs the real fusers build.
inline std::vector<NamedProgram> fused_catalog() {
  std::vector<NamedProgram> out;
  const Family nf = Family::NumericFloat;
  for (DType d : {dt::f32, dt::f16, dt::bf16, dt::f64}) {
    const std::string n = d.name();
    {  // W1: exp(a*b + c*2)
      Recorder r;
      const Shape s{64, 32};
      TensorIr a = r.input(s, d), bb = r.input(s, d), c = r.input(s, d);
      TensorIr t1 = r.add(ok(b::binary(nf, OpKind::Numeric_Mul, a, bb, r.id())));
      TensorIr t2 = r.add(ok(b::scalar(nf, OpKind::Numeric_MulScalar, c, ScalarIr::Float(2), r.id())));
      TensorIr t3 = r.add(ok(b::binary(nf, OpKind::Numeric_Add, use(t1, TensorStatus::ReadWrite),
                                       use(t2, TensorStatus::ReadWrite), r.id())));
      (void)r.add(ok(b::unary(Family::Float, OpKind::Float_Exp, use(t3, TensorStatus::ReadWrite), r.id())));
      r.finish(n + " W1", out);
    }
    {  // broadcast bias + relu-ish (lower_equal + mask_fill) with a swap_dims view
      Recorder r;
      TensorIr x = r.input({8, 16}, d), bias = r.input({1, 16}, d), y = r.input({16, 8}, d);
      TensorIr yt = r.add(
          ok(b::swap_dims(Family::BaseFloat, OpKind::Base_SwapDims, use(y, TensorStatus::ReadWrite), 0, 1, r.id())));
      TensorIr t1 = r.add(ok(b::binary(nf, OpKind::Numeric_Add, x, bias, r.id())));
      TensorIr t2 = r.add(ok(b::binary(nf, OpKind::Numeric_Mul, use(t1, TensorStatus::ReadWrite),
                                       use(yt, TensorStatus::ReadWrite), r.id())));
      TensorIr m = r.add(
          ok(b::scalar_comparison(nf, OpKind::Numeric_LowerEqualElem, t2, ScalarIr::Float(0), dt::boolean, r.id())));
      TensorIr t3 = r.add(ok(b::mask_fill(Family::BaseFloat, OpKind::Base_MaskFill, use(t2, TensorStatus::ReadWrite),
                                          use(m, TensorStatus::ReadWrite), ScalarIr::Float(0), r.id())));
      (void)r.add(ok(b::cast(Family::BaseFloat, OpKind::Base_Cast, use(t3, TensorStatus::ReadWrite), dt::f32, r.id())));
      r.finish(n + " bias-relu-view", out);
    }
    {  // reduce with prologue and epilogue: sum(exp(x), axis 1) * 0.5
      Recorder r;
      TensorIr x = r.input({32, 64}, d);
      TensorIr e = r.add(ok(b::unary(Family::Float, OpKind::Float_Exp, use(x, TensorStatus::ReadWrite), r.id())));
      TensorIr s = r.add(ok(b::reduce_dim(nf, OpKind::Numeric_SumDim, use(e, TensorStatus::ReadWrite), 1, 1, r.id())));
      (void)r.add(
          ok(b::scalar(nf, OpKind::Numeric_MulScalar, use(s, TensorStatus::ReadWrite), ScalarIr::Float(0.5), r.id())));
      r.finish(n + " reduce-prologue-epilogue", out);
    }
    {  // reduce over a middle axis, max with prologue
      Recorder r;
      TensorIr x = r.input({4, 16, 8}, d);
      TensorIr a = r.add(ok(b::unary(nf, OpKind::Numeric_Abs, use(x, TensorStatus::ReadWrite), r.id())));
      TensorIr m = r.add(ok(b::reduce_dim(nf, OpKind::Numeric_MaxDim, use(a, TensorStatus::ReadWrite), 1, 1, r.id())));
      (void)r.add(
          ok(b::scalar(nf, OpKind::Numeric_AddScalar, use(m, TensorStatus::ReadWrite), ScalarIr::Float(1), r.id())));
      r.finish(n + " max-middle-axis", out);
    }
    {  // W4 softmax over the last axis
      Recorder r;
      TensorIr x = r.input({16, 128}, d);
      TensorIr mx = r.add(ok(b::reduce_dim(nf, OpKind::Numeric_MaxDim, x, 1, 1, r.id())));
      TensorIr sh = r.add(ok(b::binary(nf, OpKind::Numeric_Sub, use(x, TensorStatus::ReadWrite),
                                       use(mx, TensorStatus::ReadWrite), r.id())));
      TensorIr ex = r.add(ok(b::unary(Family::Float, OpKind::Float_Exp, use(sh, TensorStatus::ReadWrite), r.id())));
      TensorIr sm = r.add(ok(b::reduce_dim(nf, OpKind::Numeric_SumDim, ex, 1, 1, r.id())));
      (void)r.add(ok(b::binary(nf, OpKind::Numeric_Div, use(ex, TensorStatus::ReadWrite),
                               use(sm, TensorStatus::ReadWrite), r.id())));
      r.finish(n + " softmax", out);
    }
    {  // softmax with an elementwise op first (ReduceBroadcasted in Burn's search)
      Recorder r;
      TensorIr x0 = r.input({16, 128}, d);
      TensorIr x = r.add(
          ok(b::scalar(nf, OpKind::Numeric_MulScalar, use(x0, TensorStatus::ReadWrite), ScalarIr::Float(0.5), r.id())));
      TensorIr mx = r.add(ok(b::reduce_dim(nf, OpKind::Numeric_MaxDim, x, 1, 1, r.id())));
      TensorIr sh = r.add(ok(b::binary(nf, OpKind::Numeric_Sub, use(x, TensorStatus::ReadWrite),
                                       use(mx, TensorStatus::ReadWrite), r.id())));
      TensorIr ex = r.add(ok(b::unary(Family::Float, OpKind::Float_Exp, use(sh, TensorStatus::ReadWrite), r.id())));
      TensorIr sm = r.add(ok(b::reduce_dim(nf, OpKind::Numeric_SumDim, ex, 1, 1, r.id())));
      (void)r.add(ok(b::binary(nf, OpKind::Numeric_Div, use(ex, TensorStatus::ReadWrite),
                               use(sm, TensorStatus::ReadWrite), r.id())));
      r.finish(n + " scaled-softmax", out);
    }
    {  // log-softmax: x - max - log(sum(exp(x - max)))
      Recorder r;
      TensorIr x = r.input({16, 96}, d);
      TensorIr mx = r.add(ok(b::reduce_dim(nf, OpKind::Numeric_MaxDim, x, 1, 1, r.id())));
      TensorIr sh = r.add(ok(b::binary(nf, OpKind::Numeric_Sub, use(x, TensorStatus::ReadWrite),
                                       use(mx, TensorStatus::ReadWrite), r.id())));
      TensorIr ex = r.add(ok(b::unary(Family::Float, OpKind::Float_Exp, sh, r.id())));
      TensorIr sm =
          r.add(ok(b::reduce_dim(nf, OpKind::Numeric_SumDim, use(ex, TensorStatus::ReadWrite), 1, 1, r.id())));
      TensorIr ls = r.add(ok(b::unary(Family::Float, OpKind::Float_Log, use(sm, TensorStatus::ReadWrite), r.id())));
      (void)r.add(ok(b::binary(nf, OpKind::Numeric_Sub, use(sh, TensorStatus::ReadWrite),
                               use(ls, TensorStatus::ReadWrite), r.id())));
      r.finish(n + " log-softmax", out);
    }
    {  // layer norm with weight and bias: (x - mean) / sqrt(var + eps) * w + b
      Recorder r;
      TensorIr x = r.input({4, 8, 64}, d), w = r.input({1, 1, 64}, d), bias = r.input({1, 1, 64}, d);
      TensorIr mean = r.add(ok(b::reduce_dim(nf, OpKind::Numeric_MeanDim, x, 2, 1, r.id())));
      TensorIr xc = r.add(ok(b::binary(nf, OpKind::Numeric_Sub, use(x, TensorStatus::ReadWrite),
                                       use(mean, TensorStatus::ReadWrite), r.id())));
      TensorIr sq = r.add(ok(b::binary(nf, OpKind::Numeric_Mul, xc, xc, r.id())));
      TensorIr var =
          r.add(ok(b::reduce_dim(nf, OpKind::Numeric_MeanDim, use(sq, TensorStatus::ReadWrite), 2, 1, r.id())));
      TensorIr ve = r.add(ok(
          b::scalar(nf, OpKind::Numeric_AddScalar, use(var, TensorStatus::ReadWrite), ScalarIr::Float(1e-5), r.id())));
      TensorIr sd = r.add(ok(b::unary(Family::Float, OpKind::Float_Sqrt, use(ve, TensorStatus::ReadWrite), r.id())));
      TensorIr y = r.add(ok(b::binary(nf, OpKind::Numeric_Div, use(xc, TensorStatus::ReadWrite),
                                      use(sd, TensorStatus::ReadWrite), r.id())));
      TensorIr yw = r.add(ok(b::binary(nf, OpKind::Numeric_Mul, use(y, TensorStatus::ReadWrite),
                                       use(w, TensorStatus::ReadWrite), r.id())));
      (void)r.add(ok(b::binary(nf, OpKind::Numeric_Add, use(yw, TensorStatus::ReadWrite),
                               use(bias, TensorStatus::ReadWrite), r.id())));
      r.finish(n + " layer-norm", out);
    }
    {  // RMS norm: x / sqrt(mean(x * x) + eps) * w
      Recorder r;
      TensorIr x = r.input({32, 80}, d), w = r.input({1, 80}, d);
      TensorIr sq = r.add(ok(b::binary(nf, OpKind::Numeric_Mul, x, x, r.id())));
      TensorIr ms =
          r.add(ok(b::reduce_dim(nf, OpKind::Numeric_MeanDim, use(sq, TensorStatus::ReadWrite), 1, 1, r.id())));
      TensorIr me = r.add(ok(
          b::scalar(nf, OpKind::Numeric_AddScalar, use(ms, TensorStatus::ReadWrite), ScalarIr::Float(1e-6), r.id())));
      TensorIr rs = r.add(ok(b::unary(Family::Float, OpKind::Float_Sqrt, use(me, TensorStatus::ReadWrite), r.id())));
      TensorIr y = r.add(ok(b::binary(nf, OpKind::Numeric_Div, use(x, TensorStatus::ReadWrite),
                                      use(rs, TensorStatus::ReadWrite), r.id())));
      (void)r.add(ok(b::binary(nf, OpKind::Numeric_Mul, use(y, TensorStatus::ReadWrite),
                               use(w, TensorStatus::ReadWrite), r.id())));
      r.finish(n + " rms-norm", out);
    }
    {  // cross-entropy from logits against one-hot targets: -sum(t * log_softmax(x)) per row
      Recorder r;
      TensorIr x = r.input({24, 50}, d), t = r.input({24, 50}, d);
      TensorIr mx = r.add(ok(b::reduce_dim(nf, OpKind::Numeric_MaxDim, x, 1, 1, r.id())));
      TensorIr sh = r.add(ok(b::binary(nf, OpKind::Numeric_Sub, use(x, TensorStatus::ReadWrite),
                                       use(mx, TensorStatus::ReadWrite), r.id())));
      TensorIr ex = r.add(ok(b::unary(Family::Float, OpKind::Float_Exp, sh, r.id())));
      TensorIr sm =
          r.add(ok(b::reduce_dim(nf, OpKind::Numeric_SumDim, use(ex, TensorStatus::ReadWrite), 1, 1, r.id())));
      TensorIr ls = r.add(ok(b::unary(Family::Float, OpKind::Float_Log, use(sm, TensorStatus::ReadWrite), r.id())));
      TensorIr lp = r.add(ok(b::binary(nf, OpKind::Numeric_Sub, use(sh, TensorStatus::ReadWrite),
                                       use(ls, TensorStatus::ReadWrite), r.id())));
      TensorIr tl = r.add(ok(b::binary(nf, OpKind::Numeric_Mul, use(t, TensorStatus::ReadWrite),
                                       use(lp, TensorStatus::ReadWrite), r.id())));
      TensorIr s = r.add(ok(b::reduce_dim(nf, OpKind::Numeric_SumDim, use(tl, TensorStatus::ReadWrite), 1, 1, r.id())));
      (void)r.add(
          ok(b::scalar(nf, OpKind::Numeric_MulScalar, use(s, TensorStatus::ReadWrite), ScalarIr::Float(-1), r.id())));
      r.finish(n + " cross-entropy", out);
    }
    {  // matmul + bias + tanh epilogue
      Recorder r;
      TensorIr a = r.input({2, 32, 64}, d), w = r.input({1, 64, 48}, d), bias = r.input({1, 1, 48}, d);
      TensorIr mm = r.add(ok(b::matmul(Family::Float, OpKind::Float_Matmul, use(a, TensorStatus::ReadWrite),
                                       use(w, TensorStatus::ReadWrite), r.id())));
      TensorIr t1 = r.add(ok(b::binary(nf, OpKind::Numeric_Add, use(mm, TensorStatus::ReadWrite),
                                       use(bias, TensorStatus::ReadWrite), r.id())));
      (void)r.add(ok(b::unary(Family::Float, OpKind::Float_Tanh, use(t1, TensorStatus::ReadWrite), r.id())));
      r.finish(n + " matmul-bias-tanh", out);
    }
  }
  {  // W3 Adam step (f32): m, v updated in place, p updated
    Recorder r;
    const Shape s{256};
    const DType d = dt::f32;
    TensorIr p = r.input(s, d), g = r.input(s, d), m = r.input(s, d), v = r.input(s, d);
    TensorIr m1 = r.add(
        ok(b::scalar(nf, OpKind::Numeric_MulScalar, use(m, TensorStatus::ReadWrite), ScalarIr::Float(0.9), r.id())));
    TensorIr g1 = r.add(ok(b::scalar(nf, OpKind::Numeric_MulScalar, g, ScalarIr::Float(0.1), r.id())));
    TensorIr m2 = r.add(ok(b::binary(nf, OpKind::Numeric_Add, use(m1, TensorStatus::ReadWrite),
                                     use(g1, TensorStatus::ReadWrite), r.id())));
    TensorIr v1 = r.add(
        ok(b::scalar(nf, OpKind::Numeric_MulScalar, use(v, TensorStatus::ReadWrite), ScalarIr::Float(0.999), r.id())));
    TensorIr gg = r.add(ok(b::binary(nf, OpKind::Numeric_Mul, g, use(g, TensorStatus::ReadWrite), r.id())));
    TensorIr g2 = r.add(
        ok(b::scalar(nf, OpKind::Numeric_MulScalar, use(gg, TensorStatus::ReadWrite), ScalarIr::Float(0.001), r.id())));
    TensorIr v2 = r.add(ok(b::binary(nf, OpKind::Numeric_Add, use(v1, TensorStatus::ReadWrite),
                                     use(g2, TensorStatus::ReadWrite), r.id())));
    TensorIr sq = r.add(ok(b::unary(Family::Float, OpKind::Float_Sqrt, v2, r.id())));
    TensorIr de = r.add(
        ok(b::scalar(nf, OpKind::Numeric_AddScalar, use(sq, TensorStatus::ReadWrite), ScalarIr::Float(1e-8), r.id())));
    TensorIr up = r.add(ok(b::binary(nf, OpKind::Numeric_Div, m2, use(de, TensorStatus::ReadWrite), r.id())));
    TensorIr st = r.add(
        ok(b::scalar(nf, OpKind::Numeric_MulScalar, use(up, TensorStatus::ReadWrite), ScalarIr::Float(1e-3), r.id())));
    (void)r.add(ok(
        b::binary(nf, OpKind::Numeric_Sub, use(p, TensorStatus::ReadWrite), use(st, TensorStatus::ReadWrite), r.id())));
    r.finish("f32 W3 adam", out);
  }
  {  // log-softmax plus x and x's transpose: a view of an input that several stages read whole
    Recorder r;
    const DType d = dt::f32;
    TensorIr x = r.input({4, 32, 32}, d);
    TensorIr mx = r.add(ok(b::reduce_dim(nf, OpKind::Numeric_MaxDim, x, 2, 1, r.id())));
    TensorIr sh = r.add(ok(b::binary(nf, OpKind::Numeric_Sub, x, use(mx, TensorStatus::ReadWrite), r.id())));
    TensorIr ex = r.add(ok(b::unary(Family::Float, OpKind::Float_Exp, sh, r.id())));
    TensorIr sm = r.add(ok(b::reduce_dim(nf, OpKind::Numeric_SumDim, use(ex, TensorStatus::ReadWrite), 2, 1, r.id())));
    TensorIr ls = r.add(ok(b::unary(Family::Float, OpKind::Float_Log, use(sm, TensorStatus::ReadWrite), r.id())));
    TensorIr lp = r.add(ok(b::binary(nf, OpKind::Numeric_Sub, use(sh, TensorStatus::ReadWrite),
                                     use(ls, TensorStatus::ReadWrite), r.id())));
    TensorIr z = r.add(ok(b::binary(nf, OpKind::Numeric_Add, use(lp, TensorStatus::ReadWrite), x, r.id())));
    TensorIr xt = r.add(
        ok(b::swap_dims(Family::BaseFloat, OpKind::Base_SwapDims, use(x, TensorStatus::ReadWrite), 1, 2, r.id())));
    (void)r.add(ok(
        b::binary(nf, OpKind::Numeric_Add, use(z, TensorStatus::ReadWrite), use(xt, TensorStatus::ReadWrite), r.id())));
    r.finish("f32 log-softmax-transpose", out);
  }
  {  // integer chain with division (may fault) and a comparison into a mask
    Recorder r;
    const DType d = dt::i32;
    TensorIr a = r.input({32, 8}, d), bb = r.input({1, 8}, d);
    TensorIr q = r.add(ok(b::binary(Family::NumericInt, OpKind::Numeric_Div, a, bb, r.id())));
    TensorIr s = r.add(ok(b::scalar(Family::Int, OpKind::Int_BitwiseLeftShiftScalar, use(q, TensorStatus::ReadWrite),
                                    ScalarIr::Int(2), r.id())));
    TensorIr c =
        r.add(ok(b::binary_comparison(Family::NumericInt, OpKind::Numeric_Greater, use(s, TensorStatus::ReadWrite),
                                      use(a, TensorStatus::ReadWrite), dt::boolean, r.id())));
    (void)r.add(ok(b::cast(Family::Bool, OpKind::Bool_IntoFloat, use(c, TensorStatus::ReadWrite), dt::f32, r.id())));
    r.finish("i32 div-shift-compare", out);
  }
  {  // gather inside a fused chain
    Recorder r;
    TensorIr x = r.input({8, 16}, dt::f32), ix = r.input({8, 4}, dt::i64);
    TensorIr g = r.add(ok(b::gather(Family::BaseFloat, OpKind::Base_Gather, use(x, TensorStatus::ReadWrite), 1,
                                    use(ix, TensorStatus::ReadWrite), r.id())));
    TensorIr e = r.add(ok(b::unary(Family::Float, OpKind::Float_Exp, use(g, TensorStatus::ReadWrite), r.id())));
    (void)r.add(
        ok(b::scalar(nf, OpKind::Numeric_AddScalar, use(e, TensorStatus::ReadWrite), ScalarIr::Float(1), r.id())));
    r.finish("f32 gather-exp", out);
  }
  return out;
}

}  // namespace kiln::cuda::testing
