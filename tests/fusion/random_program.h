// Random operation programs for the fusion property and concurrency tests: sequences with
// client-side status semantics (docs/spec/fusion.md §16.7: outputs NotInit, uses ReadOnly, the last use
// ReadWrite or a Drop), reads that drain, and explicit syncs; plus the checks that every
// registered operation executed exactly once, in an order that respects every data dependency
// and every drop.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kiln/fusion/recording_executor.h"
#include "kiln/fusion/stream.h"

namespace kiln::fusion::testing {

using ir::Family;
using ir::Operation;
using ir::OpKind;
using ir::Shape;
using ir::TensorId;
using ir::TensorIr;
using ir::TensorStatus;

// One step of a program template, independent of concrete ids.
struct Step {
  enum class Kind { Unary, Binary, Scalar, SumDim, Matmul, SwapDims, Drop, Read, Sync } kind;
  OpKind op = OpKind::Float_Exp;
  int a = 0, b = 0;  // indices into the template's value list
  bool last_a = false, last_b = false;
  double scalar = 1.0;
  bool broadcast_b = false;  // b has shape [1, n] (a broadcast row)
};

struct Template {
  int num_inputs = 0;
  std::vector<Step> steps;
};

// Generates a random template over square matrices (so matmul and swap_dims keep shapes).
inline Template random_template(std::mt19937_64& rng, int num_steps) {
  Template t;
  t.num_inputs = 2 + static_cast<int>(rng() % 3);
  struct Value {
    bool alive = true;
    bool row = false;  // shape [1, n]
  };
  std::vector<Value> values(static_cast<std::size_t>(t.num_inputs));
  values.back().row = true;  // one broadcast input
  auto pick = [&](bool want_full) -> int {
    std::vector<int> alive;
    for (int i = 0; i < static_cast<int>(values.size()); ++i)
      if (values[static_cast<std::size_t>(i)].alive && (!want_full || !values[static_cast<std::size_t>(i)].row))
        alive.push_back(i);
    if (alive.empty()) return -1;
    return alive[rng() % alive.size()];
  };
  static const OpKind kUnary[] = {OpKind::Float_Exp, OpKind::Float_Tanh, OpKind::Float_Sin, OpKind::Numeric_Abs,
                                  OpKind::Float_Cos};
  static const OpKind kBinary[] = {OpKind::Numeric_Add, OpKind::Numeric_Mul, OpKind::Numeric_Sub};
  static const OpKind kScalar[] = {OpKind::Numeric_AddScalar, OpKind::Numeric_MulScalar, OpKind::Numeric_DivScalar};
  for (int s = 0; s < num_steps; ++s) {
    Step st{};
    const int r = static_cast<int>(rng() % 100);
    const int a = pick(true);
    if (a < 0) {
      // Everything consumed: add a fresh input-like value through a scalar op is impossible;
      // stop the template here.
      break;
    }
    st.a = a;
    st.last_a = rng() % 3 == 0;
    if (r < 25) {
      st.kind = Step::Kind::Unary;
      st.op = kUnary[rng() % 5];
    } else if (r < 50) {
      st.kind = Step::Kind::Binary;
      st.op = kBinary[rng() % 3];
      int b = pick(false);
      st.b = b;
      st.broadcast_b = values[static_cast<std::size_t>(b)].row;
      st.last_b = b != a && rng() % 3 == 0;
    } else if (r < 65) {
      st.kind = Step::Kind::Scalar;
      st.op = kScalar[rng() % 3];
      st.scalar = 0.5 + static_cast<double>(rng() % 8);
    } else if (r < 72) {
      st.kind = Step::Kind::SumDim;
    } else if (r < 77) {
      st.kind = Step::Kind::Matmul;
      st.b = pick(true);
      st.last_b = st.b != a && rng() % 3 == 0;
    } else if (r < 82) {
      st.kind = Step::Kind::SwapDims;
    } else if (r < 88) {
      st.kind = Step::Kind::Drop;
      st.last_a = true;
    } else if (r < 94) {
      st.kind = Step::Kind::Read;
      st.last_a = false;
    } else {
      st.kind = Step::Kind::Sync;
      st.last_a = false;
    }
    if (st.last_a) values[static_cast<std::size_t>(a)].alive = false;
    if ((st.kind == Step::Kind::Binary || st.kind == Step::Kind::Matmul) && st.last_b)
      values[static_cast<std::size_t>(st.b)].alive = false;
    const bool produces = st.kind != Step::Kind::Drop && st.kind != Step::Kind::Read && st.kind != Step::Kind::Sync;
    if (produces) values.push_back(Value{true, st.kind == Step::Kind::SumDim});
    t.steps.push_back(st);
  }
  return t;
}

// Runs a template on one stream with fresh tensor ids starting at `first_id`, size n x n.
// Records every registered op (global form) in `registered`.
class ProgramRunner {
 public:
  ProgramRunner(FusionStream& stream, ExecutionPlanStore& store, RecordingExecutor& executor)
      : stream_(stream), store_(store), executor_(executor) {}

  void run(const Template& t, std::uint64_t& next_id, std::uint64_t n) {
    std::vector<TensorIr> values;
    for (int i = 0; i < t.num_inputs; ++i) {
      const bool row = i == t.num_inputs - 1;
      TensorIr in{TensorId(next_id++), row ? Shape{1, n} : Shape{n, n}, TensorStatus::ReadOnly, ir::dtypes::f32};
      executor_.materialize(in.id);
      values.push_back(in);
    }
    auto use = [&](int i, bool last) {
      TensorIr occurrence = values[static_cast<std::size_t>(i)];
      occurrence.status = last ? TensorStatus::ReadWrite : TensorStatus::ReadOnly;
      return occurrence;
    };
    auto out = [&](Shape s) { return TensorIr::uninit(TensorId(next_id++), std::move(s), ir::dtypes::f32); };
    for (const Step& st : t.steps) {
      const TensorIr& va = values[static_cast<std::size_t>(st.a)];
      Operation op;
      op.dtype = ir::dtypes::f32;
      switch (st.kind) {
        case Step::Kind::Unary:
          op.kind = st.op;
          op.family = st.op == OpKind::Numeric_Abs ? Family::NumericFloat : Family::Float;
          op.num_inputs = 1;
          op.tensors = {use(st.a, st.last_a), out(va.shape)};
          break;
        case Step::Kind::Binary: {
          op.kind = st.op;
          op.family = Family::NumericFloat;
          op.num_inputs = 2;
          const bool same = st.a == st.b;
          op.tensors = {use(st.a, st.last_a && !same), use(st.b, st.last_b || (same && st.last_a)), out(va.shape)};
          break;
        }
        case Step::Kind::Scalar:
          op.kind = st.op;
          op.family = Family::NumericFloat;
          op.num_inputs = 1;
          op.tensors = {use(st.a, st.last_a), out(va.shape)};
          op.scalars = {ir::ScalarIr::Float(st.scalar)};
          break;
        case Step::Kind::SumDim:
          op.kind = OpKind::Numeric_SumDim;
          op.family = Family::NumericFloat;
          op.num_inputs = 1;
          op.tensors = {use(st.a, st.last_a), out(Shape{1, n})};
          op.attrs = {0, 1};
          break;
        case Step::Kind::Matmul: {
          op.kind = OpKind::Float_Matmul;
          op.family = Family::Float;
          op.num_inputs = 2;
          const bool same = st.a == st.b;
          op.tensors = {use(st.a, st.last_a && !same), use(st.b, st.last_b || (same && st.last_a)), out(va.shape)};
          break;
        }
        case Step::Kind::SwapDims:
          op.kind = OpKind::Base_SwapDims;
          op.family = Family::BaseFloat;
          op.dtype = {};
          op.num_inputs = 1;
          op.tensors = {use(st.a, st.last_a), out(Shape{va.shape[1], va.shape[0]})};
          op.attrs = {0, 1};
          break;
        case Step::Kind::Drop:
          op.kind = OpKind::Drop_Drop;
          op.family = Family::Drop;
          op.dtype = {};
          op.num_inputs = 1;
          op.tensors = {use(st.a, true)};
          break;
        case Step::Kind::Read:
          if (!executor_.has_handle(va.id)) stream_.drain(store_, executor_);
          EXPECT_TRUE(executor_.has_handle(va.id)) << "a read finds its tensor materialized after the drain";
          continue;
        case Step::Kind::Sync: stream_.drain(store_, executor_); continue;
      }
      if (op.kind != OpKind::Drop_Drop) values.push_back(op.outputs()[0]);
      registered.push_back(op);
      stream_.register_op(std::move(op), store_, executor_);
    }
  }

  std::vector<Operation> registered;

 private:
  FusionStream& stream_;
  ExecutionPlanStore& store_;
  RecordingExecutor& executor_;
};

// Every registered op executed exactly once; inputs produced (or external) and alive when read.
inline ::testing::AssertionResult check_execution(const std::vector<Operation>& registered,
                                                  const std::vector<Operation>& executed) {
  if (registered.size() != executed.size())
    return ::testing::AssertionFailure() << registered.size() << " registered but " << executed.size() << " executed";
  std::unordered_map<std::uint64_t, int> count;  // by hash of the op
  std::unordered_set<std::uint64_t> produced_anywhere;
  for (const auto& op : registered) {
    count[ir::hash_operation(op)] += 1;
    for (const auto& t : op.outputs()) produced_anywhere.insert(t.id.value());
  }
  for (const auto& op : executed)
    if (--count[ir::hash_operation(op)] < 0)
      return ::testing::AssertionFailure() << "executed twice or never registered: " << op.to_string();
  std::unordered_set<std::uint64_t> alive, dead;
  for (std::size_t i = 0; i < executed.size(); ++i) {
    const auto& op = executed[i];
    for (const auto& t : op.inputs()) {
      const auto id = t.id.value();
      if (dead.count(id))
        return ::testing::AssertionFailure()
               << "op " << i << " reads t" << id << " after its last use: " << op.to_string();
      if (!alive.count(id) && produced_anywhere.count(id))
        return ::testing::AssertionFailure()
               << "op " << i << " reads t" << id << " before its producer: " << op.to_string();
    }
    for (const auto& t : op.inputs())
      if (t.status == TensorStatus::ReadWrite) {
        alive.erase(t.id.value());
        dead.insert(t.id.value());
      }
    for (const auto& t : op.outputs()) alive.insert(t.id.value());
  }
  return ::testing::AssertionSuccess();
}

}  // namespace kiln::fusion::testing
