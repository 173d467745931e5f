// Test helpers for the fusion search (docs/spec/fusion.md §19 "Conventions"): Burn's test PatternFuser,
// the TestOptimization it finishes, tensor/op builders (T, add, add_rw, op1, op2, op3) and the
// strategy builders O / U / C. Header-only and self-contained so processor and stream tests can
// share it.
//
//   PatternFuser P(id, pattern):
//     fuse(op)      appends op to `actual`, even when closed;
//     status()      Open iff len(actual) < len(pattern) and actual is a prefix of pattern;
//     properties()  (ready, score = len(pattern)) iff actual's first len(pattern) ops equal
//                   pattern, else (false, 0);
//     len()         len(pattern);
//     finish()      TestOptimization(id, len(pattern));
//     reset()       clears `actual`.
//
//   TestOptimization(id, len): name() = "TestOpt<id>" and describe() = "TestOptimization(id=<id>,
//   len=<len>)", so strategies compare by builder id and size (ExecutionStrategy::operator==).
//
// Example:
//   auto a1 = add(100, 101, 102), a2 = add(102, 103, 104);
//   FuserList fusers = fuser_list(P(0, {a1, a2}));
//   EXPECT_EQ(strategy, O(0, 2, {0, 1}, 2));
#pragma once

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/fusion/fuser.h"
#include "kiln/fusion/strategy.h"
#include "kiln/ir/operation.h"

namespace kiln::fusion::testing {

// ---------------------------------------------------------------------------------------------
// Optimization and fuser
// ---------------------------------------------------------------------------------------------

class TestOptimization final : public Optimization {
 public:
  TestOptimization(std::size_t id, std::size_t size) : id_(id), size_(size), name_("TestOpt" + std::to_string(id)) {}
  std::size_t id() const { return id_; }
  std::size_t len() const override { return size_; }
  std::string_view name() const override { return name_; }
  std::string describe() const override {
    return "TestOptimization(id=" + std::to_string(id_) + ", len=" + std::to_string(size_) + ")";
  }

 private:
  std::size_t id_;
  std::size_t size_;
  std::string name_;
};

class PatternFuser final : public OperationFuser {
 public:
  PatternFuser(std::size_t id, std::vector<ir::Operation> pattern) : id_(id), pattern_(std::move(pattern)) {}

  void fuse(const ir::Operation& op) override { actual_.push_back(op); }

  FuserStatus status() const override {
    if (actual_.size() >= pattern_.size()) return FuserStatus::Closed;
    for (std::size_t i = 0; i < actual_.size(); ++i)
      if (!(actual_[i] == pattern_[i])) return FuserStatus::Closed;
    return FuserStatus::Open;
  }

  FuserProperties properties() const override {
    if (actual_.size() < pattern_.size()) return {false, 0};
    for (std::size_t i = 0; i < pattern_.size(); ++i)
      if (!(actual_[i] == pattern_[i])) return {false, 0};
    return {true, static_cast<std::uint64_t>(pattern_.size())};
  }

  std::size_t len() const override { return pattern_.size(); }
  OptimizationPtr finish() override { return std::make_shared<TestOptimization>(id_, pattern_.size()); }
  void reset() override { actual_.clear(); }
  std::unique_ptr<OperationFuser> clone() const override { return std::make_unique<PatternFuser>(*this); }

  std::size_t id() const { return id_; }
  const std::vector<ir::Operation>& actual() const { return actual_; }

 private:
  std::size_t id_;
  std::vector<ir::Operation> pattern_;
  std::vector<ir::Operation> actual_;
};

inline std::unique_ptr<OperationFuser> P(std::size_t id, std::vector<ir::Operation> pattern) {
  return std::make_unique<PatternFuser>(id, std::move(pattern));
}

// FuserList from unique_ptrs (an initializer_list cannot hold move-only values).
template <class... F>
FuserList fuser_list(F&&... fusers) {
  FuserList list;
  list.reserve(sizeof...(fusers));
  (list.push_back(std::forward<F>(fusers)), ...);
  return list;
}

// ---------------------------------------------------------------------------------------------
// Tensors and ops
// ---------------------------------------------------------------------------------------------

inline ir::TensorIr T(std::uint64_t id, ir::Shape shape = {32, 32},
                      ir::TensorStatus status = ir::TensorStatus::ReadOnly, ir::DType dtype = ir::dtypes::f32) {
  return ir::TensorIr{ir::TensorId(id), std::move(shape), status, dtype};
}
inline ir::TensorIr T(std::uint64_t id, ir::TensorStatus status) { return T(id, {32, 32}, status); }

// NumericFloat(f32, Add{lhs, rhs, out}).
inline ir::Operation numeric_add(ir::TensorIr lhs, ir::TensorIr rhs, ir::TensorIr out) {
  ir::Operation op;
  op.kind = ir::OpKind::Numeric_Add;
  op.family = ir::Family::NumericFloat;
  op.dtype = ir::dtypes::f32;
  op.num_inputs = 2;
  op.tensors = {std::move(lhs), std::move(rhs), std::move(out)};
  return op;
}

// add(l, r, o): all three statuses ReadOnly (as in Burn's search tests).
inline ir::Operation add(std::uint64_t l, std::uint64_t r, std::uint64_t o) { return numeric_add(T(l), T(r), T(o)); }
// add_rw(l, r, o): lhs ReadWrite (its last use).
inline ir::Operation add_rw(std::uint64_t l, std::uint64_t r, std::uint64_t o) {
  return numeric_add(T(l, ir::TensorStatus::ReadWrite), T(r), T(o));
}

// op1 = NumericFloat(f32, Add{T(0), T(1), out T(2, NotInit)}).
inline ir::Operation op1() { return numeric_add(T(0), T(1), T(2, ir::TensorStatus::NotInit)); }

// op2 = NumericFloat(f32, AddScalar{lhs T(0), rhs Float(5.0), out T(2, NotInit)}).
inline ir::Operation op2() {
  ir::Operation op;
  op.kind = ir::OpKind::Numeric_AddScalar;
  op.family = ir::Family::NumericFloat;
  op.dtype = ir::dtypes::f32;
  op.num_inputs = 1;
  op.tensors = {T(0), T(2, ir::TensorStatus::NotInit)};
  op.scalars = {ir::ScalarIr::Float(5.0)};
  return op;
}

// op3 = Float(f32, Log{input T(0), out T(0, NotInit)}) (in place on id 0).
inline ir::Operation op3() {
  ir::Operation op;
  op.kind = ir::OpKind::Float_Log;
  op.family = ir::Family::Float;
  op.dtype = ir::dtypes::f32;
  op.num_inputs = 1;
  op.tensors = {T(0), T(0, ir::TensorStatus::NotInit)};
  return op;
}

// ---------------------------------------------------------------------------------------------
// Strategies
// ---------------------------------------------------------------------------------------------

// O(b, n, ordering, score) = Optimization{TestOptimization(b, n), ordering, score}.
inline ExecutionStrategy O(std::size_t b, std::size_t n, Ordering ordering, std::uint64_t score) {
  return ExecutionStrategy::optimization(std::make_shared<TestOptimization>(b, n), std::move(ordering), score);
}
// O(ordering): builder 0, n = len(ordering), score 0 (the §19.8 shorthand).
inline ExecutionStrategy O(Ordering ordering) {
  const std::size_t n = ordering.size();
  return O(0, n, std::move(ordering), 0);
}
// U(ordering) = Operations{ordering}.
inline ExecutionStrategy U(Ordering ordering) { return ExecutionStrategy::operations(std::move(ordering)); }
// C([...]) = Composed.
inline ExecutionStrategy C(std::vector<ExecutionStrategy> children) {
  return ExecutionStrategy::composed(std::move(children));
}

}  // namespace kiln::fusion::testing

namespace kiln::fusion {
// GoogleTest printers (found by ADL) so failing expectations show O(...)/U(...)/C(...).
inline void PrintTo(const ExecutionStrategy& s, std::ostream* os) { *os << s.to_string(); }
inline void PrintTo(const BlockOptimization& bo, std::ostream* os) {
  *os << "{" << bo.strategy.to_string() << ", ordering [";
  for (std::size_t i = 0; i < bo.ordering.size(); ++i) *os << (i ? "," : "") << bo.ordering[i];
  *os << "]}";
}
}  // namespace kiln::fusion
