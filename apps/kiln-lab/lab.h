// Lab: one device with one stream, the harness kiln-lab and the fusion scenario tests share.
#pragma once

#include <cstdint>

#include "kiln/fusion/fusers.h"
#include "kiln/fusion/recording_executor.h"
#include "kiln/fusion/stream.h"

namespace kiln::lab {

using ir::Family;
using ir::OpKind;
using ir::Operation;
using ir::ScalarIr;
using ir::Shape;
using ir::TensorId;
using ir::TensorIr;
using ir::TensorStatus;

// One device with one stream: a plan store, a recording executor and the stream's processor.
// Programs are written with explicit tensor statuses, as a client derives them (fusion.md §16.7):
// an op output is NotInit, later uses ReadOnly, the last use ReadWrite (or a Drop).
class Lab {
 public:
  explicit Lab(const fusion::FusionLog& log, fusion::ProcessorOptions options = {}, bool keep_records = true)
      : log_(log), executor_(keep_records), stream_(fusion::default_fusers(log, fusion::FuserOptions{}), options, log) {}

  // A tensor uploaded out of band (materialized before the program runs).
  TensorIr input(Shape shape) {
    TensorIr t{TensorId(next_id_++), std::move(shape), TensorStatus::ReadOnly, ir::dtypes::f32};
    executor_.materialize(t.id);
    return t;
  }
  TensorIr fresh(const Shape& shape) {
    return TensorIr::uninit(TensorId(next_id_++), shape, ir::dtypes::f32);
  }
  static TensorIr use(TensorIr t, TensorStatus s) {
    t.status = s;
    return t;
  }

  TensorIr binary(OpKind kind, const TensorIr& lhs, TensorStatus ls, const TensorIr& rhs, TensorStatus rs) {
    TensorIr out = fresh(lhs.shape);
    submit(Operation{kind, Family::NumericFloat, ir::dtypes::f32, 2, {use(lhs, ls), use(rhs, rs), out}, {}, {}, {}, {}});
    return out;
  }
  TensorIr scalar(OpKind kind, const TensorIr& lhs, TensorStatus ls, double value) {
    TensorIr out = fresh(lhs.shape);
    submit(Operation{kind, Family::NumericFloat, ir::dtypes::f32, 1, {use(lhs, ls), out}, {ScalarIr::Float(value)}, {}, {}, {}});
    return out;
  }
  TensorIr unary(OpKind kind, Family family, const TensorIr& in, TensorStatus s) {
    TensorIr out = fresh(in.shape);
    submit(Operation{kind, family, ir::dtypes::f32, 1, {use(in, s), out}, {}, {}, {}, {}});
    return out;
  }
  void drop(const TensorIr& t) {
    submit(Operation{OpKind::Drop_Drop, Family::Drop, ir::dtypes::f32, 1, {use(t, TensorStatus::ReadWrite)}, {}, {}, {}, {}});
  }
  // A read drains the stream only when the tensor is not produced yet (fusion.md §16.4).
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
  const fusion::FusionLog& log_;
  fusion::ExecutionPlanStore store_;
  fusion::RecordingExecutor executor_;
  fusion::FusionStream stream_;
  std::uint64_t next_id_ = 1;
};

}  // namespace kiln::lab
