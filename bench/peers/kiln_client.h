// A minimal kiln client for the peer benchmark: registers operations on one FusionStream the
// way the fusion client does (docs/spec/ir.md §5.11 lowerings, docs/spec/fusion.md §16.7 statuses: an op output is
// NotInit with a fresh id, later uses ReadOnly, the last use ReadWrite), reads by draining, and
// uploads / downloads through a Backend (the CPU device, or a recording stand-in for --dry-run).
//
// Thread-safety: one Client per stream, used by one thread.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kiln/fusion/executor.h"
#include "kiln/fusion/fusers.h"
#include "kiln/fusion/plan_store.h"
#include "kiln/fusion/stream.h"
#include "kiln/ir/builders.h"

namespace kiln::bench::peers {

using ir::Family;
using ir::Operation;
using ir::OpKind;
using ir::Shape;
using ir::TensorId;
using ir::TensorIr;
using ir::TensorStatus;

[[noreturn]] inline void die(const std::string& what) {
  std::fprintf(stderr, "kiln-bench-peers: %s\n", what.c_str());
  std::exit(2);
}

template <class T>
T unwrap(Result<T> r, const char* what) {
  if (!r.ok()) die(std::string(what) + ": " + r.error().to_string());
  return std::move(r).value();
}

// What the client needs from a device besides the fusion Executor.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual fusion::Executor& executor() = 0;
  // Registers an uploaded f32 tensor under `id` (an out-of-band input, materialized).
  virtual void upload(TensorId id, const Shape& shape, std::span<const float> data) = 0;
  // The f32 contents of a materialized tensor (a copy).
  virtual std::vector<float> download(TensorId id, const Shape& shape) = 0;
  // Device counters since the last reset, as " key=value" pairs for a result line (empty when
  // the backend has none).
  virtual void reset_counters() {}
  virtual std::string counters() { return {}; }
};

// Counts what the processor asked the backend to run (evidence for "was it fused?"), then
// forwards. The counters are plain integers: the executor is called by the stream's thread.
class CountingExecutor final : public fusion::Executor {
 public:
  explicit CountingExecutor(fusion::Executor& inner) : inner_(inner) {}

  void execute_optimization(const fusion::Optimization& opt, const fusion::ExecutionContext& ctx) override {
    ++fused_kernels;
    fused_ops += opt.len();
    inner_.execute_optimization(opt, ctx);
  }
  void execute_operation(const ir::Operation& op) override {
    if (op.is_drop())
      ++drops;
    else
      ++single_ops;
    inner_.execute_operation(op);
  }
  void free_tensor(const ir::TensorIr& t) override { inner_.free_tensor(t); }

  void clear() { fused_kernels = fused_ops = single_ops = drops = 0; }

  std::uint64_t fused_kernels = 0;  // execute_optimization calls
  std::uint64_t fused_ops = 0;      // operations those covered
  std::uint64_t single_ops = 0;     // execute_operation calls other than drops
  std::uint64_t drops = 0;          // Drop operations run alone

 private:
  fusion::Executor& inner_;
};

class Client {
 public:
  // fused = false: the same stream with an EMPTY fuser list, so the search can never group two
  // operations: every operation becomes its own single-op plan, cached and replayed exactly like
  // the fused plans are (same policy, same plan store, same executor entry for single ops). The
  // only difference between the two modes is fusion itself. (ProcessorOptions{max_explorations
  // = 0} would also run everything alone, but through the exploration cap's degraded path,
  // which skips the plan cache and runs every op at registration: a different code path, so it
  // would measure more than the absence of fusion.)
  Client(Backend& backend, bool fused, const fusion::FusionLog& log, fusion::FuserOptions fusers = {})
      : backend_(backend),
        counting_(backend.executor()),
        stream_(fused ? fusion::default_fusers(log, fusers) : fusion::FuserList{}, fusion::ProcessorOptions{}, log) {}

  TensorIr upload(const Shape& shape, std::span<const float> data) {
    TensorIr t{fresh_id(), shape, TensorStatus::ReadOnly, ir::dtypes::f32};
    backend_.upload(t.id, shape, data);
    return t;
  }
  std::vector<float> download(const TensorIr& t) { return backend_.download(t.id, t.shape); }

  static TensorIr use(TensorIr t, TensorStatus s) {
    t.status = s;
    return t;
  }

  TensorIr binary(OpKind kind, const TensorIr& lhs, TensorStatus ls, const TensorIr& rhs, TensorStatus rs) {
    return submit(ir::build::binary(Family::NumericFloat, kind, use(lhs, ls), use(rhs, rs), fresh_id()), "binary");
  }
  TensorIr scalar(OpKind kind, const TensorIr& lhs, TensorStatus ls, double value) {
    return submit(ir::build::scalar(Family::NumericFloat, kind, use(lhs, ls), ir::ScalarIr::Float(value), fresh_id()),
                  "scalar");
  }
  // Float-family unary (Exp, Log, Sqrt, Tanh, ...).
  TensorIr fl(OpKind kind, const TensorIr& in, TensorStatus s) {
    return submit(ir::build::unary(Family::Float, kind, use(in, s), fresh_id()), "unary");
  }
  TensorIr abs(const TensorIr& in, TensorStatus s) {
    return submit(ir::build::unary(Family::NumericFloat, OpKind::Numeric_Abs, use(in, s), fresh_id()), "abs");
  }
  TensorIr cast_f32(const TensorIr& in, TensorStatus s) {
    return submit(ir::build::cast(Family::BaseFloat, OpKind::Base_Cast, use(in, s), ir::dtypes::f32, fresh_id()),
                  "cast");
  }
  TensorIr reduce_dim(OpKind kind, const TensorIr& in, TensorStatus s, std::uint64_t axis) {
    return submit(ir::build::reduce_dim(Family::NumericFloat, kind, use(in, s), axis, 1, fresh_id()), "reduce_dim");
  }
  TensorIr matmul(const TensorIr& lhs, TensorStatus ls, const TensorIr& rhs, TensorStatus rs) {
    return submit(ir::build::matmul(Family::Float, OpKind::Float_Matmul, use(lhs, ls), use(rhs, rs), fresh_id()),
                  "matmul");
  }
  // sigmoid as the fusion client lowers it (docs/spec/ir.md §5.11): Cast(f32), MulScalar(-1), Exp,
  // AddScalar(1), Log, MulScalar(-1), Exp, Cast(f32) — both casts emitted even for f32.
  TensorIr sigmoid(const TensorIr& x, TensorStatus s) {
    TensorIr t = cast_f32(x, s);
    t = scalar(OpKind::Numeric_MulScalar, t, TensorStatus::ReadWrite, -1.0);
    t = fl(OpKind::Float_Exp, t, TensorStatus::ReadWrite);
    t = scalar(OpKind::Numeric_AddScalar, t, TensorStatus::ReadWrite, 1.0);
    t = fl(OpKind::Float_Log, t, TensorStatus::ReadWrite);
    t = scalar(OpKind::Numeric_MulScalar, t, TensorStatus::ReadWrite, -1.0);
    t = fl(OpKind::Float_Exp, t, TensorStatus::ReadWrite);
    return cast_f32(t, TensorStatus::ReadWrite);
  }
  // End of life of a tensor no op consumed (docs/spec/fusion.md §16.7).
  void drop(const TensorIr& t) { register_op(unwrap(ir::build::drop(use(t, TensorStatus::ReadWrite)), "drop")); }
  // A read of a tensor not produced yet drains the stream (docs/spec/fusion.md §16.4).
  void drain() { stream_.drain(store_, counting_); }

  const fusion::ProcessorStats& stats() const { return stream_.processor().stats(); }
  CountingExecutor& counters() { return counting_; }
  Backend& backend() { return backend_; }
  std::size_t num_plans() const { return store_.size(); }

 private:
  TensorId fresh_id() { return TensorId(next_id_++); }
  TensorIr submit(Result<Operation> op, const char* what) {
    Operation o = unwrap(std::move(op), what);
    TensorIr out = o.outputs()[0];
    register_op(std::move(o));
    return out;
  }
  void register_op(Operation op) { stream_.register_op(std::move(op), store_, counting_); }

  Backend& backend_;
  CountingExecutor counting_;
  fusion::ExecutionPlanStore store_;
  fusion::FusionStream stream_;
  std::uint64_t next_id_ = 1;
};

}  // namespace kiln::bench::peers
