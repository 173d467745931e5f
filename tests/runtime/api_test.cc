// The client API (session.h): every front-end op against values computed here in double
// precision, the lowering's op counts (docs/spec/ir.md §5.11), composites against their formulas, builder
// errors reaching the caller, per-thread streams, and the [runtime] configuration.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <span>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "api_fixture.h"
#include "kiln/cpu/cpu_backend.h"
#include "kiln/runtime/config.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/session.h"
#include "kiln/testing/status.h"

namespace kiln::runtime {
namespace {

using ir::Shape;

using api_testing::expect_near;
using api_testing::make_backend;
using api_testing::make_device;
using ::kiln::testing::ok;

class Api : public api_testing::SessionFixture {
 protected:
  Api() { s = std::make_unique<Session>(direct_target()); }

  // Ops a call registers on a fresh explicit stream (the lowering's length): f(keep) keeps its
  // tensors in `keep` so that no Drop is counted.
  template <class F>
  std::uint64_t ops_registered(F&& f) {
    const StreamId id = s->stream_ids().fresh();
    std::vector<Tensor> keep;
    return s->executes(id, [&] {
#if KILN_TEST_IPC
      const std::uint64_t before = ipc.target().ops_sent();
      f(keep);
      return ipc.target().ops_sent() - before;
#else
      f(keep);
      return dev->stream_stats(id) ? dev->stream_stats(id)->enqueued : 0;
#endif
    });
  }
};

std::vector<double> map(const std::vector<float>& x, double (*f)(double)) {
  std::vector<double> r;
  for (float v : x) r.push_back(f(v));
  return r;
}

const std::vector<float> kA{1.5f, -2, 0.25f, 3, -0.5f, 4};  // [2, 3]
const std::vector<float> kB{0.5f, 2, -1.25f};               // [1, 3]

TEST_F(Api, HostTransfersForEveryDtype) {
  EXPECT_EQ(ok(s->to_host<float>(f32({1, 2}, {2}))), (std::vector<float>{1, 2}));
  EXPECT_EQ(ok(s->to_host<double>(ok(s->from_host(std::vector<double>{1e300, -2}, {2, 1})))),
            (std::vector<double>{1e300, -2}));
  EXPECT_EQ(ok(s->to_host<std::int32_t>(ok(s->from_host(std::vector<std::int32_t>{7, -8, 9}, {3})))),
            (std::vector<std::int32_t>{7, -8, 9}));
  EXPECT_EQ(ok(s->to_host<std::int64_t>(i64({1LL << 40, -3}, {2}))), (std::vector<std::int64_t>{1LL << 40, -3}));
  EXPECT_EQ(ok(s->to_host<bool>(ok(s->from_host(std::vector<bool>{true, false, true}, {3})))),
            (std::vector<bool>{true, false, true}));
  // Errors: element count, wrong host type.
  Result<Tensor> bad = s->from_host(std::vector<float>{1, 2, 3}, {2, 2});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().to_string().find("3 values for shape [2,2]"), std::string::npos) << bad.error().to_string();
  Result<std::vector<float>> wrong = s->to_host<float>(i64({1}, {1}));
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.error().code, ErrorCode::DTypeMismatch);
}

TEST_F(Api, HostBytesForAnyDtype) {
  using ::kiln::testing::StatusIs;
  // i8 and f16 have no typed transfer: their bytes go in and come out unchanged.
  const std::vector<std::int8_t> i8{-128, 0, 5, 127};
  ASSERT_OK_AND_ASSIGN(Tensor t, s->from_host_bytes(ir::dtypes::i8, std::as_bytes(std::span(i8)), {2, 2}));
  EXPECT_EQ(t.dtype(), ir::dtypes::i8);
  std::vector<std::int8_t> back(4);
  KILN_EXPECT_OK(s->to_host_bytes(t, std::as_writable_bytes(std::span(back))));
  EXPECT_EQ(back, i8);
  EXPECT_EQ(ok(s->to_host<std::int32_t>(ok(s->cast(t, ir::dtypes::i32)))),
            (std::vector<std::int32_t>{-128, 0, 5, 127}));
  const std::vector<std::uint16_t> f16{0x3C00, 0xC000};  // 1.0, -2.0
  ASSERT_OK_AND_ASSIGN(Tensor h, s->from_host_bytes(ir::dtypes::f16, std::as_bytes(std::span(f16)), {2}));
  EXPECT_EQ(ok(s->to_host<float>(ok(s->cast(h, ir::dtypes::f32)))), (std::vector<float>{1, -2}));
  // Errors: a byte count that is not the shape's, a part of an element, a QFloat byte count that
  // is not its layout's (4 values, the f32 scale, the global scale), a destination of another size.
  EXPECT_THAT(s->from_host_bytes(ir::dtypes::i8, std::as_bytes(std::span(i8)), {3}),
              StatusIs(ErrorCode::IncompatibleShapes, "4 values for shape [3]"));
  EXPECT_THAT(s->from_host_bytes(ir::dtypes::f32, std::as_bytes(std::span(i8)).first(3), {1}),
              StatusIs(ErrorCode::IncompatibleShapes, "not a whole number of f32"));
  EXPECT_THAT(
      s->from_host_bytes(ir::DType::qfloat({}), std::as_bytes(std::span(i8)), {4}),
      StatusIs(ErrorCode::IncompatibleShapes, "4 bytes for a qfloat(q8s,native,tensor)[4] tensor, which holds 12"));
  std::vector<std::int8_t> small(3);
  EXPECT_FALSE(s->to_host_bytes(t, std::as_writable_bytes(std::span(small))).ok());
}

TEST_F(Api, ArithmeticTensorAndScalar) {
  Tensor a = f32(kA, {2, 3}), b = f32(kB, {1, 3});
  std::vector<double> add, sub, mul, div;
  for (int i = 0; i < 6; ++i) {
    const double x = kA[i], y = kB[i % 3];
    add.push_back(x + y), sub.push_back(x - y), mul.push_back(x * y), div.push_back(x / y);
  }
  expect_near(get(s->add(a, b), {2, 3}), add);
  expect_near(get(s->sub(a, b), {2, 3}), sub);
  expect_near(get(s->mul(a, b), {2, 3}), mul);
  expect_near(get(s->div(a, b), {2, 3}), div);
  std::vector<double> adds, subs, muls, divs, rems;
  for (float x : kA) adds.push_back(x + 2.5), subs.push_back(x - 2.5), muls.push_back(x * 2.5), divs.push_back(x / 2.5);
  expect_near(get(s->add(a, 2.5), {2, 3}), adds);
  expect_near(get(s->sub(a, 2.5), {2, 3}), subs);
  expect_near(get(s->mul(a, 2.5), {2, 3}), muls);
  expect_near(get(s->div(a, 2.5), {2, 3}), divs);
  // rem on positive floats, and floored on ints (sign of the divisor).
  Tensor p = f32({5.5f, 7, 2.25f}, {3});
  expect_near(get(s->rem(p, 2.0), {3}), {1.5, 1, 0.25});
  expect_near(get(s->rem(p, f32({2, 3, 1}, {3})), {3}), {1.5, 1, 0.25});
  EXPECT_EQ(get_i64(s->rem(i64({-7, 7, 6}, {3}), 3.0), {3}), (std::vector<std::int64_t>{2, 1, 0}));
  EXPECT_EQ(get_i64(s->add(i64({1, 2}, {2}), i64({10, 20}, {2})), {2}), (std::vector<std::int64_t>{11, 22}));
  EXPECT_EQ(get_i64(s->mul(i64({1, -2}, {2}), 3.0), {2}), (std::vector<std::int64_t>{3, -6}));
}

TEST_F(Api, PowLowering) {
  const std::vector<float> x{0.5f, 2, 3};
  Tensor t = f32(x, {3});
  for (double e : {0.0, 1.0, 2.0, -1.0, -2.0, 0.5, 3.0}) {
    std::vector<double> want;
    for (float v : x) want.push_back(std::pow(double(v), e));
    expect_near(get(s->pow(t, e), {3}), want);
  }
  expect_near(get(s->pow(t, f32({2, 0.5f, -1}, {3})), {3}), {0.25, std::sqrt(2.0), 1.0 / 3});
  EXPECT_EQ(get_i64(s->pow(i64({2, -3}, {2}), 3.0), {2}), (std::vector<std::int64_t>{8, -27}));
  // docs/spec/ir.md §5.11: 0 → Ones, 1 → nothing, 2 → Mul, −1 → Recip, −2 → Mul + Recip, else PowfScalar.
  std::map<double, std::uint64_t> want_ops{{0, 1}, {1, 0}, {2, 1}, {-1, 1}, {-2, 2}, {0.5, 1}};
  for (const auto& [exponent, n] : want_ops) {
    const double e = exponent;  // a lambda captures a variable, not a structured binding (clang 14)
    EXPECT_EQ(ops_registered([&](std::vector<Tensor>& keep) {
                keep.push_back(f32(x, {3}));
                keep.push_back(ok(s->pow(keep[0], e)));
              }),
              n)
        << e;
  }
}

TEST_F(Api, UnaryOps) {
  const std::vector<float> pos{0.25f, 1, 2.5f, 4};
  const std::vector<float> any{-1.5f, -0.25f, 0, 2};
  Tensor p = f32(pos, {2, 2}), a = f32(any, {4});
  expect_near(get(s->neg(a), {4}), {1.5, 0.25, 0, -2});
  expect_near(get(s->abs(a), {4}), {1.5, 0.25, 0, 2});
  EXPECT_EQ(get_i64(s->neg(i64({3, -4}, {2})), {2}), (std::vector<std::int64_t>{-3, 4}));
  EXPECT_EQ(get_i64(s->abs(i64({3, -4}, {2})), {2}), (std::vector<std::int64_t>{3, 4}));
  expect_near(get(s->exp(a), {4}), map(any, [](double v) { return std::exp(v); }));
  expect_near(get(s->log(p), {2, 2}), map(pos, [](double v) { return std::log(v); }));
  expect_near(get(s->log1p(p), {2, 2}), map(pos, [](double v) { return std::log1p(v); }));
  expect_near(get(s->sqrt(p), {2, 2}), map(pos, [](double v) { return std::sqrt(v); }));
  expect_near(get(s->rsqrt(p), {2, 2}), map(pos, [](double v) { return 1 / std::sqrt(v); }));
  expect_near(get(s->sin(a), {4}), map(any, [](double v) { return std::sin(v); }));
  expect_near(get(s->cos(a), {4}), map(any, [](double v) { return std::cos(v); }));
  expect_near(get(s->tanh(a), {4}), map(any, [](double v) { return std::tanh(v); }));
  expect_near(get(s->erf(a), {4}), map(any, [](double v) { return std::erf(v); }));
  expect_near(get(s->recip(p), {2, 2}), map(pos, [](double v) { return 1 / v; }));
  expect_near(get(s->sigmoid(a), {4}), map(any, [](double v) { return 1 / (1 + std::exp(-v)); }));
  expect_near(get(s->relu(a), {4}), {0, 0, 0, 2});
  expect_near(get(s->gelu(a), {4}), map(any, [](double v) { return v * (1 + std::erf(v / std::sqrt(2.0))) / 2; }));
  expect_near(get(s->silu(a), {4}), map(any, [](double v) { return v / (1 + std::exp(-v)); }));
  // sigmoid on f64 goes through f32 and back.
  Tensor d = ok(s->sigmoid(ok(s->from_host(std::vector<double>{0.5}, {1}))));
  EXPECT_EQ(d.dtype(), ir::dtypes::f64);
  EXPECT_NEAR(ok(s->to_host<double>(std::move(d)))[0], 1 / (1 + std::exp(-0.5)), 1e-6);
  // Lowering lengths (docs/spec/ir.md §5.11).
  auto count = [&](Result<Tensor> (Session::*op)(Tensor)) {
    return ops_registered([&](std::vector<Tensor>& keep) {
      keep.push_back(f32(any, {4}));
      keep.push_back(ok((s.get()->*op)(keep[0])));
    });
  };
  EXPECT_EQ(count(&Session::neg), 1u);
  EXPECT_EQ(count(&Session::rsqrt), 2u);
  EXPECT_EQ(count(&Session::sigmoid), 8u);
  EXPECT_EQ(count(&Session::relu), 2u);
  EXPECT_EQ(count(&Session::gelu), 5u);
  EXPECT_EQ(count(&Session::silu), 9u);
}

TEST_F(Api, Comparisons) {
  Tensor a = f32({1, 2, 3}, {3}), b = f32({3, 2, 1}, {3});
  EXPECT_EQ(get_bool(s->eq(a, b), {3}), (std::vector<bool>{false, true, false}));
  EXPECT_EQ(get_bool(s->ne(a, b), {3}), (std::vector<bool>{true, false, true}));
  EXPECT_EQ(get_bool(s->lt(a, b), {3}), (std::vector<bool>{true, false, false}));
  EXPECT_EQ(get_bool(s->le(a, b), {3}), (std::vector<bool>{true, true, false}));
  EXPECT_EQ(get_bool(s->gt(a, b), {3}), (std::vector<bool>{false, false, true}));
  EXPECT_EQ(get_bool(s->ge(a, b), {3}), (std::vector<bool>{false, true, true}));
  EXPECT_EQ(get_bool(s->eq(a, 2.0), {3}), (std::vector<bool>{false, true, false}));
  EXPECT_EQ(get_bool(s->ne(a, 2.0), {3}), (std::vector<bool>{true, false, true}));
  EXPECT_EQ(get_bool(s->lt(a, 2.0), {3}), (std::vector<bool>{true, false, false}));
  EXPECT_EQ(get_bool(s->le(a, 2.0), {3}), (std::vector<bool>{true, true, false}));
  EXPECT_EQ(get_bool(s->gt(a, 2.0), {3}), (std::vector<bool>{false, false, true}));
  EXPECT_EQ(get_bool(s->ge(a, 2.0), {3}), (std::vector<bool>{false, true, true}));
  EXPECT_EQ(get_bool(s->gt(i64({5, -5}, {2}), 0.0), {2}), (std::vector<bool>{true, false}));
  Tensor m = ok(s->from_host(std::vector<bool>{true, false}, {2}));
  EXPECT_EQ(get_bool(s->eq(m, ok(s->from_host(std::vector<bool>{true, true}, {2}))), {2}),
            (std::vector<bool>{true, false}));
}

TEST_F(Api, SelectionClampCast) {
  Tensor t = f32({1, 2, 3, 4}, {2, 2}), v = f32({10, 20, 30, 40}, {2, 2});
  Tensor m = ok(s->from_host(std::vector<bool>{true, false}, {1, 2}));
  expect_near(get(s->mask_where(t, m, v), {2, 2}), {10, 2, 30, 4});
  expect_near(get(s->mask_fill(t, m, -1.0), {2, 2}), {-1, 2, -1, 4});
  expect_near(get(s->clamp(t, 1.5, 3.5), {2, 2}), {1.5, 2, 3, 3.5});
  EXPECT_EQ(get_i64(s->clamp(i64({-5, 0, 5}, {3}), -1.0, 1.0), {3}), (std::vector<std::int64_t>{-1, 0, 1}));
  // Casts.
  Tensor f = f32({1.75f, -2.5f}, {2});
  EXPECT_EQ(ok(s->to_host<double>(ok(s->cast(f, ir::dtypes::f64)))), (std::vector<double>{1.75, -2.5}));
  EXPECT_EQ(ok(s->to_host<std::int32_t>(ok(s->cast(f, ir::dtypes::i32)))), (std::vector<std::int32_t>{1, -2}));
  EXPECT_EQ(ok(s->to_host<float>(ok(s->cast(i64({3, -4}, {2}), ir::dtypes::f32)))), (std::vector<float>{3, -4}));
  EXPECT_EQ(ok(s->to_host<std::int32_t>(ok(s->cast(i64({3, -4}, {2}), ir::dtypes::i32)))),
            (std::vector<std::int32_t>{3, -4}));
  Tensor b = ok(s->from_host(std::vector<bool>{true, false}, {2}));
  EXPECT_EQ(ok(s->to_host<float>(ok(s->cast(b, ir::dtypes::f32)))), (std::vector<float>{1, 0}));
  EXPECT_EQ(ok(s->to_host<std::int64_t>(ok(s->cast(b, ir::dtypes::i64)))), (std::vector<std::int64_t>{1, 0}));
  Result<Tensor> to_bool = s->cast(f, Session::kBoolDType);
  ASSERT_FALSE(to_bool.ok());
  EXPECT_NE(to_bool.error().to_string().find("cast"), std::string::npos);
}

TEST_F(Api, Reductions) {
  Tensor a = f32(kA, {2, 3});  // [[1.5, -2, 0.25], [3, -0.5, 4]]
  expect_near(get(s->sum_dim(a, 0), {1, 3}), {4.5, -2.5, 4.25});
  expect_near(get(s->sum_dim(a, 1, false), {2}), {-0.25, 6.5});
  expect_near(get(s->mean_dim(a, 1), {2, 1}), {-0.25 / 3, 6.5 / 3});
  expect_near(get(s->max_dim(a, 1), {2, 1}), {1.5, 4});
  expect_near(get(s->min_dim(a, 0, false), {3}), {1.5, -2, 0.25});
  EXPECT_EQ(get_i64(s->argmax(a, 1), {2, 1}), (std::vector<std::int64_t>{0, 2}));
  EXPECT_EQ(get_i64(s->argmax(a, 0, false), {3}), (std::vector<std::int64_t>{1, 1, 1}));
  expect_near(get(s->sum(a), {1}), {6.25});
  expect_near(get(s->mean(a), {1}), {6.25 / 6});
  expect_near(get(s->sum(a, true), {1, 1}), {6.25});
  EXPECT_EQ(get_i64(s->sum_dim(i64({1, 2, 3, 4}, {2, 2}), 1), {2, 1}), (std::vector<std::int64_t>{3, 7}));
  Result<Tensor> rank0 = s->sum_dim(f32({1, 2}, {2}), 0, false);
  ASSERT_FALSE(rank0.ok());
  EXPECT_NE(rank0.error().to_string().find("rank-0"), std::string::npos);
}

TEST_F(Api, MatmulAndLayout) {
  Tensor a = f32(kA, {2, 3}), b = f32({1, 2, 3, 4, 5, 6}, {3, 2});
  std::vector<double> mm(4, 0.0);
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j)
      for (int k = 0; k < 3; ++k) mm[i * 2 + j] += double(kA[i * 3 + k]) * (k * 2 + j + 1);
  expect_near(get(s->matmul(a, b), {2, 2}), mm);
  std::vector<double> ad(kA.begin(), kA.end());
  expect_near(get(s->reshape(a, {3, -1}), {3, 2}), ad);
  expect_near(get(s->swap_dims(a, 0, 1), {3, 2}), {1.5, 3, -2, -0.5, 0.25, 4});
  expect_near(get(s->permute(a, {1, 0}), {3, 2}), {1.5, 3, -2, -0.5, 0.25, 4});
  expect_near(get(s->expand(f32({1, 2}, {2, 1}), {2, 3}), {2, 3}), {1, 1, 1, 2, 2, 2});
  expect_near(get(s->slice(a, {ir::Slice{0, 2, 1}, ir::Slice{1, std::nullopt, 1}}), {2, 2}), {-2, 0.25, -0.5, 4});
  expect_near(get(s->cat({a, f32({7, 8, 9}, {1, 3})}, 0), {3, 3}), {1.5, -2, 0.25, 3, -0.5, 4, 7, 8, 9});
  expect_near(get(s->cat({f32({1, 2}, {2, 1}), f32({3, 4}, {2, 1})}, 1), {2, 2}), {1, 3, 2, 4});
}

TEST_F(Api, Composites) {
  Tensor x = f32(kA, {2, 3});
  std::vector<double> sm, lsm;
  for (int r = 0; r < 2; ++r) {
    double z = 0;
    for (int c = 0; c < 3; ++c) z += std::exp(double(kA[r * 3 + c]));
    for (int c = 0; c < 3; ++c)
      sm.push_back(std::exp(double(kA[r * 3 + c])) / z), lsm.push_back(kA[r * 3 + c] - std::log(z));
  }
  expect_near(get(s->softmax(x, 1), {2, 3}), sm);
  expect_near(get(s->log_softmax(x, 1), {2, 3}), lsm);
  Tensor y = f32({1, -1, 0, 2, 2, 2}, {2, 3});
  double mse = 0;
  for (int i = 0; i < 6; ++i)
    mse += (double(kA[i]) - (std::vector<double>{1, -1, 0, 2, 2, 2})[i]) *
           (double(kA[i]) - (std::vector<double>{1, -1, 0, 2, 2, 2})[i]);
  expect_near(get(s->mse_loss(x, y), {1}), {mse / 6});
  // Classes 2 and 0.
  const double ce = -(lsm[2] + lsm[3]) / 2;
  expect_near(get(s->cross_entropy(x, f32({0, 0, 1, 1, 0, 0}, {2, 3})), {1}), {ce});
  expect_near(get(s->cross_entropy_indices(x, i64({2, 0}, {2})), {1}), {ce});
}

TEST_F(Api, BuilderErrorsReachTheCaller) {
  Tensor a = f32({1, 2, 3, 4}, {2, 2}), c = f32({1, 2, 3, 4, 5, 6, 7, 8}, {2, 4});
  auto message = [](Result<Tensor> r) { return r.ok() ? std::string("ok") : r.error().to_string(); };
  std::string m = message(s->add(a, c));
  EXPECT_NE(m.find("NumericFloat::Add"), std::string::npos) << m;
  EXPECT_NE(m.find("[2,2] vs [2,4]"), std::string::npos) << m;
  m = message(s->exp(i64({1}, {1})));
  EXPECT_NE(m.find("Exp"), std::string::npos) << m;
  m = message(s->matmul(a, f32({1, 2, 3}, {3, 1})));
  EXPECT_NE(m.find("Matmul"), std::string::npos) << m;
  m = message(s->mask_where(a, a, a));  // mask not bool
  EXPECT_NE(m.find("MaskWhere"), std::string::npos) << m;
  m = message(s->reshape(a, {3, -1}));
  EXPECT_NE(m.find("Reshape"), std::string::npos) << m;
  m = message(s->cat({a, f32({1, 2, 3}, {1, 3})}, 0));
  EXPECT_NE(m.find("Cat"), std::string::npos) << m;
  m = message(s->swap_dims(a, 0, 5));
  EXPECT_NE(m.find("SwapDims"), std::string::npos) << m;
  // A failed op leaves its inputs usable.
  expect_near(get(s->add(a, 1.0), {2, 2}), {2, 3, 4, 5});
}

TEST_F(Api, PerThreadStreams) {
  Tensor shared = f32({1, 2, 3, 4}, {4});
  const StreamId main_stream = s->current_stream();
  constexpr int kThreads = 4;
  std::vector<std::vector<double>> results(kThreads);
  std::vector<std::uint64_t> streams(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      streams[t] = s->current_stream().value();
      EXPECT_EQ(s->current_stream().value(), streams[t])
          << "the same thread gets the same stream (docs/spec/fusion.md §19.11 item 9)";
      Tensor x = ok(s->mul(shared, double(t + 1)));  // a shared view of another stream's tensor
      for (int i = 0; i < 20; ++i) x = ok(s->add(std::move(x), 1.0));
      std::vector<float> v = ok(s->to_host(std::move(x)));
      results[t].assign(v.begin(), v.end());
    });
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_NE(streams[t], main_stream.value());
    for (int u = 0; u < t; ++u) EXPECT_NE(streams[t], streams[u]);
    expect_near(results[t], {1.0 * (t + 1) + 20, 2.0 * (t + 1) + 20, 3.0 * (t + 1) + 20, 4.0 * (t + 1) + 20});
  }
  KILN_EXPECT_OK(s->sync());
}

// ---- [runtime] configuration

TEST(RuntimeConfig, ParsesAndNamesTheKey) {
  RuntimeFileConfig c = ok(parse_runtime_config("[runtime]\nthreads = 3\ndrain_batch = 16\n"));
  EXPECT_EQ(c.threads, 3u);
  EXPECT_EQ(c.drain_batch, 16u);
  EXPECT_FALSE(ok(parse_runtime_config("[fusion]\nmax_explorations = 2\n")).threads.has_value());
  for (const char* bad : {"[runtime]\nthreads = 0\n", "[runtime]\nthreads = \"four\"\n", "[runtime]\nthreads = -1\n"}) {
    Result<RuntimeFileConfig> r = parse_runtime_config(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.error().to_string().find("runtime.threads"), std::string::npos) << r.error().to_string();
  }
  Result<RuntimeFileConfig> r = parse_runtime_config("[runtime]\ndrain_batch = 1.5\n");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().to_string().find("runtime.drain_batch"), std::string::npos);
  r = parse_runtime_config("[runtime]\nthread = 2\n");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().to_string().find("runtime.thread"), std::string::npos);
  r = parse_runtime_config("[runtime\n");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::Config);
  EXPECT_EQ(ok(parse_runtime_config("[runtime]\ninline_waits = false\n")).inline_waits, false);
  EXPECT_EQ(ok(parse_runtime_config("[runtime]\ninline_waits = true\n")).inline_waits, true);
  EXPECT_FALSE(ok(parse_runtime_config("[runtime]\nthreads = 2\n")).inline_waits.has_value());
  r = parse_runtime_config("[runtime]\ninline_waits = 1\n");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().to_string().find("runtime.inline_waits"), std::string::npos) << r.error().to_string();
  // The environment: 0/1/true/false, anything else ignored with a warning.
  // One variable set to `value` (KILN_RUNTIME_INLINE_WAITS unless named).
  auto env_of = [](std::string value, std::string variable = "KILN_RUNTIME_INLINE_WAITS") {
    return fusion::EnvLookup([value, variable](std::string_view name) -> std::optional<std::string> {
      if (name == variable) return value;
      return std::nullopt;
    });
  };
  EXPECT_EQ(apply_runtime_env({}, env_of("0")).inline_waits, false);
  EXPECT_EQ(apply_runtime_env({}, env_of("true")).inline_waits, true);
  std::string warnings;
  EXPECT_FALSE(apply_runtime_env({}, env_of("maybe"), &warnings).inline_waits.has_value());
  EXPECT_NE(warnings.find("KILN_RUNTIME_INLINE_WAITS"), std::string::npos) << warnings;
  // spin_waits: the same rules, its own key and variable.
  EXPECT_EQ(ok(parse_runtime_config("[runtime]\nspin_waits = false\n")).spin_waits, false);
  EXPECT_FALSE(ok(parse_runtime_config("[runtime]\ninline_waits = false\n")).spin_waits.has_value());
  r = parse_runtime_config("[runtime]\nspin_waits = \"no\"\n");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().to_string().find("runtime.spin_waits"), std::string::npos) << r.error().to_string();
  auto spin_env = [&](std::string value) { return env_of(std::move(value), "KILN_RUNTIME_SPIN_WAITS"); };
  EXPECT_EQ(apply_runtime_env({}, spin_env("1")).spin_waits, true);
  EXPECT_EQ(apply_runtime_env({}, spin_env("false")).spin_waits, false);
  EXPECT_FALSE(apply_runtime_env({}, spin_env("0")).inline_waits.has_value());
  warnings.clear();
  EXPECT_FALSE(apply_runtime_env({}, spin_env("often"), &warnings).spin_waits.has_value());
  EXPECT_NE(warnings.find("KILN_RUNTIME_SPIN_WAITS"), std::string::npos) << warnings;
}

// With nothing configured, the pool has a thread per core the process may use (its affinity
// mask and cgroup quota: usable_cores_test.cc), which the waiters' spin rule counts too.
TEST(RuntimeConfig, DefaultsFollowTheUsableCores) {
  RuntimeOptions o;
  o.config_path = "";
  o.env = [](std::string_view) -> std::optional<std::string> { return std::nullopt; };
  auto d = ok(Device::create(make_backend(), std::move(o)));
  EXPECT_EQ(d->threads(), usable_cores());
  EXPECT_EQ(d->options().spin_waits, usable_cores() >= 2);
}

TEST(RuntimeConfig, PrecedenceFileEnvironmentOptions) {
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("kiln_api_test_" + std::to_string(::getpid()) + ".toml");
  {
    std::ofstream out(path);
    out << "[runtime]\nthreads = 3\ndrain_batch = 7\n[fusion]\nmax_explorations = 4\n";
  }
  std::map<std::string, std::string> env;
  auto make = [&](std::size_t threads, std::optional<std::size_t> batch) {
    RuntimeOptions o;
    o.config_path = path.string();
    o.threads = threads;
    o.drain_batch = batch;
    o.env = [&env](std::string_view name) -> std::optional<std::string> {
      auto it = env.find(std::string(name));
      if (it == env.end()) return std::nullopt;
      return it->second;
    };
    return Device::create(make_backend(), std::move(o));
  };
  {
    auto d = ok(make(0, std::nullopt));  // the file
    EXPECT_EQ(d->threads(), 3u);
    EXPECT_EQ(d->options().drain_batch, 7u);
    EXPECT_EQ(d->config().max_explorations, 4u);
    // Not set anywhere: spin waits from 2 cores on.
    EXPECT_EQ(d->options().spin_waits, usable_cores() >= 2);
  }
  env["KILN_RUNTIME_SPIN_WAITS"] = "1";
  EXPECT_EQ(ok(make(0, std::nullopt))->options().spin_waits, true);
  env["KILN_RUNTIME_SPIN_WAITS"] = "false";
  EXPECT_EQ(ok(make(0, std::nullopt))->options().spin_waits, false);
  env.erase("KILN_RUNTIME_SPIN_WAITS");
  env["KILN_RUNTIME_THREADS"] = "2";
  env["KILN_RUNTIME_DRAIN_BATCH"] = "5";
  {
    auto d = ok(make(0, std::nullopt));  // the environment over the file
    EXPECT_EQ(d->threads(), 2u);
    EXPECT_EQ(d->options().drain_batch, 5u);
  }
  {
    auto d = ok(make(1, 9));  // explicit options over both
    EXPECT_EQ(d->threads(), 1u);
    EXPECT_EQ(d->options().drain_batch, 9u);
  }
  env["KILN_RUNTIME_THREADS"] = "lots";  // ignored (warning): the file's value
  {
    auto d = ok(make(0, std::nullopt));
    EXPECT_EQ(d->threads(), 3u);
  }
  EXPECT_FALSE(make(0, 0).ok());  // explicit 0
  {
    std::ofstream out(path);
    out << "[runtime]\ndrain_batch = 0\n";
  }
  Result<std::unique_ptr<Device>> bad = make(0, std::nullopt);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().to_string().find("runtime.drain_batch"), std::string::npos) << bad.error().to_string();
  EXPECT_NE(bad.error().to_string().find(path.string()), std::string::npos);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace kiln::runtime
