// Lab: one device with one stream, the harness kiln-lab and the fusion scenario tests share.
#pragma once

#include <cstdint>
#include <vector>

#include "kiln/fusion/fusers.h"
#include "kiln/fusion/recording_executor.h"
#include "kiln/fusion/stream.h"

namespace kiln::lab {

using ir::Family;
using ir::Operation;
using ir::OpKind;
using ir::ScalarIr;
using ir::Shape;
using ir::TensorId;
using ir::TensorIr;
using ir::TensorStatus;

// One device with one stream: a plan store, a recording executor and the stream's processor.
// Programs are written with explicit tensor statuses, as a client derives them (docs/spec/fusion.md §16.7):
// an op output is NotInit, later uses ReadOnly, the last use ReadWrite (or a Drop).
class Lab {
 public:
  explicit Lab(const fusion::FusionLog& log, fusion::ProcessorOptions options = {}, bool keep_records = true,
               fusion::FuserOptions fusers = {})
      : log_(log), executor_(keep_records), stream_(fusion::default_fusers(log_, fusers), options, log_) {}

  // A tensor uploaded out of band (materialized before the program runs).
  TensorIr input(Shape shape) {
    TensorIr t{TensorId(next_id_++), std::move(shape), TensorStatus::ReadOnly, ir::dtypes::f32};
    executor_.materialize(t.id);
    return t;
  }
  TensorIr fresh(const Shape& shape) { return TensorIr::uninit(TensorId(next_id_++), shape, ir::dtypes::f32); }
  static TensorIr use(TensorIr t, TensorStatus s) {
    t.status = s;
    return t;
  }

  TensorIr binary(OpKind kind, const TensorIr& lhs, TensorStatus ls, const TensorIr& rhs, TensorStatus rs) {
    TensorIr out = fresh(lhs.shape);
    submit(
        Operation{kind, Family::NumericFloat, ir::dtypes::f32, 2, {use(lhs, ls), use(rhs, rs), out}, {}, {}, {}, {}});
    return out;
  }
  TensorIr scalar(OpKind kind, const TensorIr& lhs, TensorStatus ls, double value) {
    TensorIr out = fresh(lhs.shape);
    submit(Operation{
        kind, Family::NumericFloat, ir::dtypes::f32, 1, {use(lhs, ls), out}, {ScalarIr::Float(value)}, {}, {}, {}});
    return out;
  }
  TensorIr unary(OpKind kind, Family family, const TensorIr& in, TensorStatus s) {
    TensorIr out = fresh(in.shape);
    submit(Operation{kind, family, ir::dtypes::f32, 1, {use(in, s), out}, {}, {}, {}, {}});
    return out;
  }
  // Dim reduction keeping the axis (size 1), accumulator 1 (docs/spec/ir.md §5.11).
  TensorIr reduce_dim(OpKind kind, const TensorIr& in, TensorStatus s, std::int64_t axis) {
    Shape shape = in.shape;
    shape[static_cast<std::size_t>(axis)] = 1;
    TensorIr out = fresh(shape);
    submit(Operation{kind, Family::NumericFloat, ir::dtypes::f32, 1, {use(in, s), out}, {}, {}, {axis, 1}, {}});
    return out;
  }
  TensorIr swap_dims(const TensorIr& in, TensorStatus s, std::int64_t d1, std::int64_t d2) {
    Shape shape = in.shape;
    std::swap(shape[static_cast<std::size_t>(d1)], shape[static_cast<std::size_t>(d2)]);
    TensorIr out = fresh(shape);
    submit(Operation{
        OpKind::Base_SwapDims, Family::BaseFloat, ir::dtypes::f32, 1, {use(in, s), out}, {}, {}, {d1, d2}, {}});
    return out;
  }
  TensorIr matmul(const TensorIr& lhs, TensorStatus ls, const TensorIr& rhs, TensorStatus rs) {
    Shape shape = lhs.shape;
    shape.back() = rhs.shape.back();
    TensorIr out = fresh(shape);
    submit(Operation{
        OpKind::Float_Matmul, Family::Float, ir::dtypes::f32, 2, {use(lhs, ls), use(rhs, rs), out}, {}, {}, {}, {}});
    return out;
  }
  TensorIr ones(const Shape& shape) {
    TensorIr out = fresh(shape);
    submit(Operation{OpKind::Base_Ones, Family::BaseFloat, ir::dtypes::f32, 0, {out}, {}, {}, {}, {}});
    return out;
  }
  void drop(const TensorIr& t) {
    submit(Operation{
        OpKind::Drop_Drop, Family::Drop, ir::dtypes::f32, 1, {use(t, TensorStatus::ReadWrite)}, {}, {}, {}, {}});
  }
  // A read drains the stream only when the tensor is not produced yet (docs/spec/fusion.md §16.4).
  void read(const TensorIr& t) {
    if (!executor_.has_handle(t.id)) stream_.drain(store_, executor_);
  }
  void sync() { stream_.drain(store_, executor_); }

  void submit(Operation op) { stream_.register_op(std::move(op), store_, executor_); }

  fusion::ExecutionPlanStore& store() { return store_; }
  fusion::RecordingExecutor& executor() { return executor_; }
  const fusion::ProcessorStats& stats() const { return stream_.processor().stats(); }
  fusion::FusionStream& stream() { return stream_; }
  std::size_t queued() const { return stream_.queue().size(); }

 private:
  fusion::FusionLog log_;  // a copy (cheap: a level and shared sinks), so a temporary log is fine
  fusion::ExecutionPlanStore store_;
  fusion::RecordingExecutor executor_;
  fusion::FusionStream stream_;
  std::uint64_t next_id_ = 1;
};

// The spec's (a*b + c*s).exp() (docs/spec/fusion.md §3.11): Mul, MulScalar, Add, Exp on fresh inputs.
struct W1Program {
  TensorIr a, b, c, t4, t5, t6, t7;
};
inline W1Program register_w1(Lab& lab, const Shape& shape, double s) {
  W1Program w;
  w.a = lab.input(shape);
  w.b = lab.input(shape);
  w.c = lab.input(shape);
  w.t4 = lab.binary(OpKind::Numeric_Mul, w.a, TensorStatus::ReadOnly, w.b, TensorStatus::ReadOnly);
  w.t5 = lab.scalar(OpKind::Numeric_MulScalar, w.c, TensorStatus::ReadOnly, s);
  w.t6 = lab.binary(OpKind::Numeric_Add, w.t4, TensorStatus::ReadWrite, w.t5, TensorStatus::ReadWrite);
  w.t7 = lab.unary(OpKind::Float_Exp, Family::Float, w.t6, TensorStatus::ReadWrite);
  return w;
}

// `n` independent 8-op single-input chains on 256x256 (docs/spec/fusion.md §19.1.4, with the stand-in
// middle ops the spec suggests); returns each chain's surviving output.
inline std::vector<TensorIr> register_chains(Lab& lab, int n) {
  std::vector<TensorIr> outs;
  for (int chain = 0; chain < n; ++chain) {
    TensorIr t = lab.scalar(OpKind::Numeric_MulScalar, lab.input({256, 256}), TensorStatus::ReadOnly, 1.5);
    t = lab.scalar(OpKind::Numeric_AddScalar, t, TensorStatus::ReadWrite, 0.5);
    t = lab.unary(OpKind::Float_Exp, Family::Float, t, TensorStatus::ReadWrite);
    t = lab.unary(OpKind::Float_Tanh, Family::Float, t, TensorStatus::ReadWrite);
    t = lab.unary(OpKind::Float_Sqrt, Family::Float, t, TensorStatus::ReadWrite);
    t = lab.scalar(OpKind::Numeric_DivScalar, t, TensorStatus::ReadWrite, 3.0);
    t = lab.scalar(OpKind::Numeric_SubScalar, t, TensorStatus::ReadWrite, 0.25);
    outs.push_back(lab.unary(OpKind::Numeric_Abs, Family::NumericFloat, t, TensorStatus::ReadWrite));
  }
  return outs;
}

}  // namespace kiln::lab
