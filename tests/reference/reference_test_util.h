// Shared by the reference executor tests: a device in a box (allocator, executor, handle
// container) with helpers to register host data, build ops and read results back.
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kiln/ir/builders.h"
#include "kiln/ir/handle_container.h"
#include "kiln/ir/operation.h"
#include "kiln/reference/memory.h"
#include "kiln/reference/reference_executor.h"
#include "kiln/reference/tensor.h"

namespace kiln::reference::testing {

using namespace kiln::ir;  // NOLINT: test brevity
namespace b = kiln::ir::build;

inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
inline constexpr double kInf = std::numeric_limits<double>::infinity();

class Device {
 public:
  HostAllocator alloc;
  ReferenceExecutor exec{alloc};
  ReferenceExecutor::Handles handles;

  TensorId fresh() { return TensorId{next_++}; }

  // Registers host data and returns an occurrence of it with the given status.
  TensorIr f64(Shape shape, DType dtype, const std::vector<double>& values,
               TensorStatus status = TensorStatus::ReadOnly) {
    auto t = HostTensor::from_f64(alloc, shape, dtype, values);
    EXPECT_TRUE(t.ok()) << (t.ok() ? "" : t.error().to_string());
    return put(std::move(t).value(), status);
  }
  TensorIr i64(Shape shape, DType dtype, const std::vector<std::int64_t>& values,
               TensorStatus status = TensorStatus::ReadOnly) {
    auto t = HostTensor::from_i64(alloc, shape, dtype, values);
    EXPECT_TRUE(t.ok()) << (t.ok() ? "" : t.error().to_string());
    return put(std::move(t).value(), status);
  }
  TensorIr u64(Shape shape, DType dtype, const std::vector<std::uint64_t>& values,
               TensorStatus status = TensorStatus::ReadOnly) {
    auto t = HostTensor::from_u64(alloc, shape, dtype, values);
    EXPECT_TRUE(t.ok()) << (t.ok() ? "" : t.error().to_string());
    return put(std::move(t).value(), status);
  }
  TensorIr boolean(Shape shape, const std::vector<bool>& values, DType dtype = dtypes::boolean,
                   TensorStatus status = TensorStatus::ReadOnly) {
    auto t = HostTensor::from_bool(alloc, shape, dtype, values);
    EXPECT_TRUE(t.ok()) << (t.ok() ? "" : t.error().to_string());
    return put(std::move(t).value(), status);
  }
  TensorIr put(HostTensor t, TensorStatus status = TensorStatus::ReadOnly) {
    const TensorId id = fresh();
    TensorIr ir{id, t.shape(), status, t.dtype()};
    handles.register_handle(id, std::move(t));
    return ir;
  }

  // Runs a built op; the build must have succeeded.
  Status run(const Result<Operation>& op) {
    EXPECT_TRUE(op.ok()) << (op.ok() ? "" : op.error().to_string());
    if (!op.ok()) return op.error();
    return exec.execute(op.value(), handles);
  }
  // Runs and expects success; returns the first output's id.
  TensorId ok(const Result<Operation>& op) {
    Status st = run(op);
    EXPECT_TRUE(st.ok()) << (st.ok() ? "" : st.error().to_string())
                         << "\n  op: " << (op.ok() ? op->to_string() : std::string("(not built)"));
    return op.ok() && !op->outputs().empty() ? op->outputs()[0].id : TensorId{0};
  }

  // Runs an op that must fail with `code` and `what` in its message; its one output is then errored.
  void expect_error(const Operation& op, ErrorCode code, const std::string& what) {
    ASSERT_EQ(op.outputs().size(), 1u);
    const Status st = exec.execute(op, handles);
    ASSERT_FALSE(st.ok()) << op.to_string();
    EXPECT_EQ(st.error().code, code) << st.error().to_string();
    EXPECT_NE(st.error().message.find(what), std::string::npos) << st.error().message;
    EXPECT_TRUE(handles.entry(op.outputs()[0].id)->is_errored());
  }

  // The tensor registered under id (an empty one, and a test failure, if there is none).
  HostTensor tensor(TensorId id) {
    if (const HostTensor* t = handles.get_handle_ref(id)) return *t;
    ADD_FAILURE() << id.to_string() << " has no handle";
    return *HostTensor::zeros(alloc, Shape{0}, dtypes::f32);
  }
  std::vector<double> f64_of(TensorId id) { return tensor(id).to_f64(); }
  std::vector<std::int64_t> i64_of(TensorId id) { return tensor(id).to_i64(); }
  std::vector<std::uint64_t> u64_of(TensorId id) { return tensor(id).to_u64(); }
  std::vector<bool> bool_of(TensorId id) { return tensor(id).to_bool(); }
  Shape shape_of(TensorId id) { return tensor(id).shape(); }

 private:
  std::uint64_t next_ = 1;
};

// Element-wise equality where NaN equals NaN.
MATCHER_P(NanEq, expected, "") {
  const std::vector<double>& a = arg;
  const std::vector<double>& e = expected;
  if (a.size() != e.size()) {
    *result_listener << "size " << a.size() << " vs " << e.size();
    return false;
  }
  for (std::size_t i = 0; i < a.size(); ++i) {
    const bool same = (std::isnan(a[i]) && std::isnan(e[i])) || a[i] == e[i];
    if (!same) {
      *result_listener << "element " << i << ": " << a[i] << " vs " << e[i];
      return false;
    }
  }
  return true;
}

// Element-wise closeness (relative tolerance), NaN equals NaN.
MATCHER_P2(Near, expected, tol, "") {
  const std::vector<double>& a = arg;
  const std::vector<double>& e = expected;
  if (a.size() != e.size()) {
    *result_listener << "size " << a.size() << " vs " << e.size();
    return false;
  }
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) && std::isnan(e[i])) continue;
    if (a[i] == e[i]) continue;
    if (!(std::fabs(a[i] - e[i]) <= tol * std::max(1.0, std::fabs(e[i])))) {
      *result_listener << "element " << i << ": " << a[i] << " vs " << e[i];
      return false;
    }
  }
  return true;
}

inline TensorIr rw(TensorIr t) {
  t.status = TensorStatus::ReadWrite;
  return t;
}

// 1, 2, ..., n: distinct, exact values for hand-checked cases.
inline std::vector<double> iota1(std::size_t n) {
  std::vector<double> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<double>(i + 1);
  return v;
}

// n values in (lo, hi), by default (−1, 1), reproducible from the seed.
inline std::vector<double> random_values(std::size_t n, std::uint64_t seed, double lo = -1, double hi = 1) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<double> v(n);
  for (double& x : v) x = u(rng);
  return v;
}

inline double dot(const std::vector<double>& a, const std::vector<double>& c) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * c[i];
  return s;
}

// (f(v[k] + h) − f(v[k] − h)) / 2h with v restored: the gradient checks of the backward kinds.
template <class F>
double central_difference(std::vector<double>& v, std::size_t k, F&& f) {
  constexpr double h = 1e-3;
  const double keep = v[k];
  v[k] = keep + h;
  const double up = f();
  v[k] = keep - h;
  const double down = f();
  v[k] = keep;
  return (up - down) / (2 * h);
}

}  // namespace kiln::reference::testing
