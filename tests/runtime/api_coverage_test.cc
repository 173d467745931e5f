// The client API reaches the whole op table (ir/include/kiln/ir/op_table.def): every kind comes out
// of some Session call, in the fusion-client form or the router form (docs/session-ops.md), in
// process and over IPC (where the daemon rebuilds each op before accepting it). And the calls whose
// IR depends on the form: the router form emits the one kind, the fusion-client form Burn's
// sequence, and both compute the same values.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "api_fixture.h"
#include "kiln/runtime/session.h"
#include "kiln/runtime/session_conv_calls.h"
#include "kiln/testing/status.h"

#ifndef KILN_TEST_IPC
#define KILN_TEST_IPC 0
#endif

namespace kiln::runtime {
namespace {

using ir::OpKind;
using ir::Shape;
using ::kiln::testing::ok;
using Kinds = std::vector<std::string>;

using api_testing::expect_near;

// `s` in the fusion-client form, `router` in the router form, over one recording target.
class ApiCoverage : public api_testing::RecordingSessionFixture {
 protected:
  std::unique_ptr<Session> router = std::make_unique<Session>(rec, Lowering::Router);

  void TearDown() override {
    router.reset();
    RecordingSessionFixture::TearDown();
  }
};

Tensor f32s(Session& ss, std::vector<float> v, Shape shape) { return ok(ss.from_host(v, std::move(shape))); }
Tensor i64s(Session& ss, std::vector<std::int64_t> v, Shape shape) { return ok(ss.from_host(v, std::move(shape))); }
Tensor ramp(Session& ss, Shape shape) {
  std::vector<float> v(ir::num_elements(shape));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = 0.25f * static_cast<float>(i % 7) - 0.5f;
  return f32s(ss, std::move(v), std::move(shape));
}

using TensorTensorCall = Result<Tensor> (Session::*)(Tensor, Tensor);
using TensorScalarCall = Result<Tensor> (Session::*)(Tensor, double);
using UnaryCall = Result<Tensor> (Session::*)(Tensor);
using WholeReduction = Result<Tensor> (Session::*)(Tensor, bool);
using DimReduction = Result<Tensor> (Session::*)(Tensor, std::uint64_t, bool);
using Scan = Result<Tensor> (Session::*)(Tensor, std::uint64_t);

// Arithmetic, unary, activations, logic and bitwise ops, comparisons, selection and casts.
void call_the_elementwise_ops(Session& ss) {
  Tensor a = ramp(ss, {2, 3}), b = ramp(ss, {2, 3}), n = i64s(ss, {1, -2, 3, 4, -5, 6}, {2, 3});
  Tensor p = ok(ss.from_host(std::vector<bool>{true, false, true}, {3}));
  Tensor q = ok(ss.from_host(std::vector<bool>{true, true, false}, {3}));
  for (TensorTensorCall op : std::initializer_list<TensorTensorCall>{
           &Session::add, &Session::sub, &Session::mul, &Session::div, &Session::rem, &Session::pow, &Session::maximum,
           &Session::atan2, &Session::hypot, &Session::eq, &Session::ne, &Session::lt, &Session::le, &Session::gt,
           &Session::ge})
    ok((ss.*op)(a, b));
  for (TensorScalarCall op : std::initializer_list<TensorScalarCall>{
           &Session::add, &Session::sub, &Session::mul, &Session::div, &Session::rem, &Session::eq, &Session::ne,
           &Session::lt, &Session::le, &Session::gt, &Session::ge, &Session::minimum})
    ok((ss.*op)(a, 0.5));
  ok(ss.pow(a, 3.0));
  ok(ss.pow(n, n));
  ok(ss.pow(n, 3.0));
  for (UnaryCall op :
       {&Session::neg,        &Session::abs,    &Session::exp,    &Session::log,   &Session::log1p, &Session::sqrt,
        &Session::sin,        &Session::cos,    &Session::tanh,   &Session::erf,   &Session::recip, &Session::sigmoid,
        &Session::relu,       &Session::gelu,   &Session::floor,  &Session::ceil,  &Session::round, &Session::trunc,
        &Session::sign,       &Session::is_nan, &Session::is_inf, &Session::cosh,  &Session::sinh,  &Session::tan,
        &Session::acos,       &Session::acosh,  &Session::asin,   &Session::asinh, &Session::atan,  &Session::atanh,
        &Session::log_sigmoid})
    ok((ss.*op)(a));
  ok(ss.leaky_relu(a, 0.1));
  ok(ss.prelu(a, f32s(ss, {0.25f}, {1, 1})));
  ok(ss.hard_sigmoid(a, 0.2, 0.5));
  ok(ss.softmin(a, 1));
  for (TensorTensorCall op :
       {&Session::relu_backward, &Session::gelu_backward, &Session::sigmoid_backward, &Session::log_sigmoid_backward})
    ok((ss.*op)(a, b));
  for (TensorTensorCall op : std::initializer_list<TensorTensorCall>{&Session::and_, &Session::or_, &Session::xor_}) {
    ok((ss.*op)(p, q));
    ok((ss.*op)(n, n));
  }
  for (TensorScalarCall op : std::initializer_list<TensorScalarCall>{&Session::and_, &Session::or_, &Session::xor_})
    ok((ss.*op)(n, 3.0));
  ok(ss.not_(p));
  ok(ss.not_(n));
  ok(ss.bitwise_left_shift(n, i64s(ss, {1}, {1, 1})));
  ok(ss.bitwise_left_shift(n, 1.0));
  ok(ss.bitwise_right_shift(n, i64s(ss, {1}, {1, 1})));
  ok(ss.bitwise_right_shift(n, 1.0));
  ok(ss.mask_where(a, ok(ss.gt(a, 0.0)), b));
  ok(ss.mask_fill(a, ok(ss.gt(a, 0.0)), 1.0));
  ok(ss.clamp(a, -0.25, 0.25));
  ok(ss.clamp_min(a, 0.0));
  ok(ss.clamp_max(a, 0.0));
  ok(ss.cast(a, ir::dtypes::f64));
  ok(ss.cast(a, ir::dtypes::i32));
  ok(ss.cast(n, ir::dtypes::i32));
  ok(ss.cast(n, ir::dtypes::f32));
  ok(ss.cast(p, ir::dtypes::f32));
  ok(ss.cast(p, ir::dtypes::i64));
}

// Creation, reductions, scans, sorting and top-k.
void call_the_creation_ops_and_reductions(Session& ss) {
  Tensor a = ramp(ss, {2, 3});
  ok(ss.zeros({2}));
  ok(ss.ones({2}));
  ok(ss.empty({2}));
  ok(ss.full({2}, 3.0));
  ok(ss.random({2}));
  ok(ss.random({2}, {}, ir::dtypes::i32));
  for (WholeReduction op :
       std::initializer_list<WholeReduction>{&Session::sum, &Session::mean, &Session::prod, &Session::max,
                                             &Session::min, &Session::max_abs, &Session::any, &Session::all})
    ok((ss.*op)(a, false));
  for (DimReduction op :
       {&Session::sum_dim, &Session::mean_dim, &Session::prod_dim, &Session::max_dim, &Session::min_dim,
        &Session::max_abs_dim, &Session::argmax, &Session::argmin, &Session::any_dim, &Session::all_dim})
    ok((ss.*op)(a, 1, true));
  ok(ss.max_dim_with_indices(a, 1));
  ok(ss.min_dim_with_indices(a, 1));
  for (Scan op : std::initializer_list<Scan>{&Session::cumsum, &Session::cumprod, &Session::cummin, &Session::cummax})
    ok((ss.*op)(a, 1));
  ok(ss.sort(a, 1));
  ok(ss.argsort(a, 1));
  ok(ss.sort_with_indices(a, 1));
  ok(ss.topk(a, 2, 1));
  ok(ss.argtopk(a, 2, 1));
  ok(ss.topk_with_indices(a, 2, 1));
}

// Matmul, layout and indexing, the composites, the collective and a custom op.
void call_the_layout_and_indexing_ops(Session& ss) {
  Tensor a = ramp(ss, {2, 3}), b = ramp(ss, {2, 3}), n = i64s(ss, {1, -2, 3, 4, -5, 6}, {2, 3});
  ok(ss.matmul(a, ok(ss.swap_dims(b, 0, 1))));
  ok(ss.matmul(n, ok(ss.permute(n, {1, 0}))));
  ok(ss.cross(ramp(ss, {2, 3}), ramp(ss, {2, 3}), 1));
  ok(ss.reshape(a, {3, 2}));
  ok(ss.expand(f32s(ss, {1, 2}, {2, 1}), {2, 3}));
  ok(ss.slice(a, {ir::Slice{0, 1, 1}}));
  ok(ss.cat({a, b}, 0));
  ok(ss.flip(a, {1}));
  ok(ss.repeat_dim(a, 0, 2));
  Tensor rows = i64s(ss, {1, 0}, {2});
  ok(ss.gather(a, 1, i64s(ss, {0, 2, 1, 0, 0, 1}, {2, 3})));
  ok(ss.select(a, 0, rows));
  ok(ss.select_assign(a, 0, i64s(ss, {1}, {1}), ramp(ss, {1, 3}), ir::IndexingUpdate::Add));
  ok(ss.slice_assign(a, {ir::Slice{0, 1, 1}}, ramp(ss, {1, 3})));
  ok(ss.scatter(a, 1, i64s(ss, {0, 1}, {2, 1}), ramp(ss, {2, 1}), ir::IndexingUpdate::Add));
  ok(ss.gather_nd(a, i64s(ss, {1, 0}, {1, 2})));
  ok(ss.scatter_nd(a, i64s(ss, {1}, {1, 1}), ramp(ss, {1, 3}), ir::IndexingUpdate::Assign));
  ok(ss.unfold(a, 1, 2, 1));
  ok(ss.pad(a, {{1, 1}}));
  ok(ss.softmax(a, 1));
  ok(ss.log_softmax(a, 1));
  ok(ss.all_reduce(a, ir::ReduceOperation::Sum, {}));
  ok(ss.broadcast(a, 0, {}));
  ok(ss.all_gather(a, 1, {ir::build::DeviceId{0, 0}}));
  ok(ss.reduce_scatter(a, ir::ReduceOperation::Sum, 0, {ir::build::DeviceId{0, 0}}));
#if !KILN_TEST_IPC
  // No backend knows a custom op: it fails at execution, on a stream of its own. (The daemon
  // refuses Custom: it runs no client code; docs/decisions.md.)
  ss.executes(ss.stream_ids().fresh(), [&] { ok(ss.custom("coverage", {a}, {2, 3}, ir::dtypes::f32)); });
#endif
}

void call_the_tensor_ops(Session& ss) {
  call_the_elementwise_ops(ss);
  call_the_creation_ops_and_reductions(ss);
  call_the_layout_and_indexing_ops(ss);
}

// Convolutions and their gradients of one rank: x [1, 1, 3…] (rank + 2), weight [1, 1, 2…],
// grad [1, 1, 2…].
template <class Options, class TransposedOptions>
void call_the_convolutions(Session& ss, const SessionConvCalls<Options, TransposedOptions>& c) {
  auto shaped = [&c](std::uint64_t last) {
    Shape shape(c.rank + 2, 1);
    shape.back() = last;
    return shape;
  };
  Tensor x = ramp(ss, shaped(3)), w = ramp(ss, shaped(2)), g = ramp(ss, shaped(2)), b = ramp(ss, {1});
  Tensor tx = ramp(ss, shaped(2)), tg = ramp(ss, shaped(3));
  ok((ss.*c.forward)(x, w, b, {}));
  ok((ss.*c.forward_t)(tx, w, b, {}));
  ok((ss.*c.x_grad)(x, w, g, {}));
  ok((ss.*c.weight_grad)(x, w, g, {}));
  ok((ss.*c.bias_grad)(x, b, g));
  ok((ss.*c.weight_grad_t)(tx, w, tg, {}));
  ok((ss.*c.bias_grad_t)(tx, b, tg));
}

void call_the_convolutions(Session& ss) {
  call_the_convolutions(ss, kConv1dCalls);
  call_the_convolutions(ss, kConv2dCalls);
  call_the_convolutions(ss, kConv3dCalls);
  Tensor x = ramp(ss, {1, 1, 3, 3}), offset = f32s(ss, std::vector<float>(2 * 4 * 4, 0.25f), {1, 8, 2, 2});
  Tensor w = ramp(ss, {1, 1, 2, 2}), grad = ramp(ss, {1, 1, 2, 2});
  ok(ss.deformable_conv2d(x, offset, w));
  ok(ss.deformable_conv2d_backward(x, offset, w, std::nullopt, std::nullopt, grad));
}

// Pools, resampling, dense layers, norms, embeddings, attention, CTC, FFT, quantization.
void call_the_modules(Session& ss) {
  Tensor x1 = ramp(ss, {1, 1, 4}), x2 = ramp(ss, {1, 1, 4, 4}), x3 = ramp(ss, {1, 1, 2, 2, 2});
  const ir::build::MaxPool1dOptions mp1{2, 2, 0, 1, false};
  const ir::build::AvgPool1dOptions ap1{2, 2, 0, true, false};
  ir::build::MaxPool2dOptions mp2;
  mp2.kernel = {2, 2};
  mp2.stride = {2, 2};
  ir::build::AvgPool2dOptions ap2;
  ap2.kernel = {2, 2};
  ap2.stride = {2, 2};
  ok(ss.max_pool1d(x1, mp1));
  ok(ss.max_pool2d(x2, mp2));
  auto [v1, i1] = ok(ss.max_pool1d_with_indices(x1, mp1));
  auto [v2, i2] = ok(ss.max_pool2d_with_indices(x2, mp2));
  ok(ss.max_pool1d_with_indices_backward(x1, v1, i1, mp1));
  ok(ss.max_pool2d_with_indices_backward(x2, v2, i2, mp2));
  ok(ss.avg_pool1d(x1, ap1));
  ok(ss.avg_pool2d(x2, ap2));
  ok(ss.avg_pool1d_backward(x1, ramp(ss, {1, 1, 2}), ap1));
  ok(ss.avg_pool2d_backward(x2, ramp(ss, {1, 1, 2, 2}), ap2));
  ok(ss.adaptive_avg_pool1d(x1, 2));
  ok(ss.adaptive_avg_pool2d(x2, {2, 2}));
  ok(ss.adaptive_avg_pool3d(x3, {1, 1, 1}));
  ok(ss.adaptive_avg_pool1d_backward(x1, ramp(ss, {1, 1, 2})));
  ok(ss.adaptive_avg_pool2d_backward(x2, ramp(ss, {1, 1, 2, 2})));
  ok(ss.adaptive_avg_pool3d_backward(x3, ramp(ss, {1, 1, 1, 1, 1})));
  ok(ss.interpolate(x2, {2, 3}, {ir::InterpolateMode::Bilinear, false}));
  ok(ss.interpolate_backward(x2, ramp(ss, {1, 1, 2, 3}), {2, 3}, {ir::InterpolateMode::Bilinear, false}));
  ok(ss.grid_sample_2d(x2, ramp(ss, {1, 2, 2, 2})));
  ok(ss.unfold4d(x2, {2, 2}));
  Tensor x = ramp(ss, {2, 3}), w = ramp(ss, {3, 2}), g = ramp(ss, {2, 2});
  ok(ss.linear(x, w, ramp(ss, {2})));
  ok(ss.linear_x_backward(w, g));
  ok(ss.linear_weight_backward(x, g));
  ok(ss.linear_bias_backward(g));
  ok(ss.layer_norm(x, ramp(ss, {3}), ramp(ss, {3})));
  Tensor c = f32s(ss, {1, 1}, {2});
  ok(ss.batch_norm(ramp(ss, {1, 2, 2}), c, c, c, c));
  Tensor table = ramp(ss, {4, 2}), tokens = i64s(ss, {3, 0, 1}, {1, 3});
  ok(ss.embedding(table, tokens));
  ok(ss.embedding_backward(table, ramp(ss, {1, 3, 2}), tokens));
  Tensor qkv = ramp(ss, {1, 1, 2, 2});
  ok(ss.attention(qkv, qkv, qkv));
  Tensor lp = ok(ss.log_softmax(ramp(ss, {2, 1, 3}), 2)), targets = i64s(ss, {1}, {1, 1});
  Tensor il = i64s(ss, {2}, {1}), tl = i64s(ss, {1}, {1});
  ok(ss.ctc_loss(lp, targets, il, tl));
  ok(ss.ctc_loss_backward(lp, targets, il, tl, f32s(ss, {1}, {1})));
  auto [re, im] = ok(ss.rfft(ramp(ss, {2, 4}), 1));
  ok(ss.irfft(re, im, 1, 4));
  // A QFloat tensor is consumed by its dequantize (over IPC one cannot be dropped).
  ok(ss.dequantize(ok(ss.quantize(x, f32s(ss, {0.5f}, {1}), ir::QuantScheme{}))));
}

// Every kind of the table comes out of a call: the fusion-client form and the router form
// together emit all of them, and every backend (over IPC: the daemon) accepts and runs them. An upload is Init's
// out-of-band form and a dying handle's Drop is queued by the runtime (RecordingTarget::seen).
TEST_F(ApiCoverage, EveryOpKindOfTheTableComesOutOfASessionCall) {
  for (Session* ss : {s.get(), router.get()}) {
    call_the_tensor_ops(*ss);
    call_the_convolutions(*ss);
    call_the_modules(*ss);
    KILN_ASSERT_OK(ss->sync_collective());
    KILN_ASSERT_OK(ss->sync());
  }
  const std::set<OpKind> seen = rec.seen();
  int missing = 0;
  for (int i = 0; i < ir::kNumOpKinds; ++i) {
    const auto kind = static_cast<OpKind>(i);
    if (KILN_TEST_IPC && kind == OpKind::Custom_Custom) continue;  // refused by the daemon
    if (seen.count(kind) == 0) {
      ADD_FAILURE() << "op kind " << i << " (" << ir::op_info(kind).variant << ") comes out of no Session call";
      ++missing;
    }
  }
  EXPECT_EQ(missing, 0);
}

// ---- The calls whose IR depends on the form

const std::vector<float> kX{-3, -1, -0.25f, 0, 0.5f, 2};  // [2, 3]
const std::vector<float> kG{1, -2, 0.5f, 3, -1, 0.25f};   // a gradient of the same shape
const std::vector<float> kAlpha{0.25f, 0.5f, 2};          // [1, 3]

// A call made the same way in either form; bool results are read as 0 / 1.
using FormCall = std::function<Result<Tensor>(Session&)>;

std::vector<double> values_of(Session& ss, const FormCall& call) {
  Tensor t = ok(call(ss));
  if (t.dtype().is_bool()) {
    std::vector<bool> b = ok(ss.to_host<bool>(std::move(t)));
    return std::vector<double>(b.begin(), b.end());
  }
  std::vector<float> v = ok(ss.to_host<float>(std::move(t)));
  return std::vector<double>(v.begin(), v.end());
}

// Each call: the router form emits the one kind and computes the fusion-client form's values
// (within f32 rounding: the decompositions round every step, the reference kernels once).
TEST_F(ApiCoverage, TheRouterFormEmitsOneKindAndComputesWhatTheFusionClientFormDoes) {
  auto x = [](Session& ss) { return f32s(ss, kX, {2, 3}); };
  auto g = [](Session& ss) { return f32s(ss, kG, {2, 3}); };
  auto bools = [](Session& ss, std::vector<bool> v) { return ok(ss.from_host(v, {4})); };
  struct Case {
    std::string call;
    FormCall run;
    Kinds router_kinds;
  };
  const std::vector<Case> cases{
      {"neg", [&](Session& ss) { return ss.neg(x(ss)); }, {"NumericFloat::Neg"}},
      {"sign", [&](Session& ss) { return ss.sign(x(ss)); }, {"NumericFloat::Sign"}},
      {"ne", [&](Session& ss) { return ss.ne(x(ss), g(ss)); }, {"BaseFloat::NotEqual"}},
      {"ne scalar", [&](Session& ss) { return ss.ne(x(ss), 0.5); }, {"BaseFloat::NotEqualElem"}},
      {"xor_",
       [&](Session& ss) {
         return ss.xor_(bools(ss, {true, true, false, false}), bools(ss, {true, false, true, false}));
       },
       {"Bool::Xor"}},
      {"clamp_min", [&](Session& ss) { return ss.clamp_min(x(ss), -0.5); }, {"NumericFloat::ClampMin"}},
      {"clamp_max", [&](Session& ss) { return ss.clamp_max(x(ss), 0.25); }, {"NumericFloat::ClampMax"}},
      {"relu", [&](Session& ss) { return ss.relu(x(ss)); }, {"Activation::Relu"}},
      {"gelu", [&](Session& ss) { return ss.gelu(x(ss)); }, {"Activation::Gelu"}},
      {"sigmoid", [&](Session& ss) { return ss.sigmoid(x(ss)); }, {"Activation::Sigmoid"}},
      {"softmax", [&](Session& ss) { return ss.softmax(x(ss), 1); }, {"Activation::Softmax"}},
      {"log_softmax", [&](Session& ss) { return ss.log_softmax(x(ss), 1); }, {"Activation::LogSoftmax"}},
      {"leaky_relu", [&](Session& ss) { return ss.leaky_relu(x(ss), 0.1); }, {"Activation::LeakyRelu"}},
      {"prelu",
       [&](Session& ss) {
         return ss.prelu(x(ss), f32s(ss, kAlpha, {1, 3}));
       },
       {"Activation::PRelu"}},
      {"hard_sigmoid", [&](Session& ss) { return ss.hard_sigmoid(x(ss), 0.2, 0.5); }, {"Activation::HardSigmoid"}},
      {"log_sigmoid", [&](Session& ss) { return ss.log_sigmoid(x(ss)); }, {"Activation::LogSigmoid"}},
      {"softmin", [&](Session& ss) { return ss.softmin(x(ss), 1); }, {"Activation::Softmin"}},
      {"relu_backward", [&](Session& ss) { return ss.relu_backward(x(ss), g(ss)); }, {"Activation::ReluBackward"}},
      {"gelu_backward", [&](Session& ss) { return ss.gelu_backward(x(ss), g(ss)); }, {"Activation::GeluBackward"}},
      {"sigmoid_backward",
       [&](Session& ss) { return ss.sigmoid_backward(x(ss), g(ss)); },
       {"Activation::SigmoidBackward"}},
      {"log_sigmoid_backward",
       [&](Session& ss) { return ss.log_sigmoid_backward(x(ss), g(ss)); },
       {"Activation::LogSigmoidBackward"}},
      {"embedding",
       [&](Session& ss) {
         return ss.embedding(f32s(ss, kX, {3, 2}), i64s(ss, {2, 0, 2}, {1, 3}));
       },
       {"Module::Embedding"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.call);
    const std::vector<double> fusion_values = values_of(*s, c.run);
    const std::vector<double> router_values = values_of(*router, c.run);
    expect_near(router_values, fusion_values, 1e-5);
    std::optional<Tensor> kept;
    const Kinds kinds = kinds_of([&] { kept = ok(c.run(*router)); });
    // The inputs' uploads register nothing: the last kinds are the call's.
    EXPECT_EQ(kinds, c.router_kinds);
  }
  EXPECT_EQ(kinds_of([&] { KILN_EXPECT_OK(router->sync_collective()); }), (Kinds{"Distributed::SyncCollective"}));
  EXPECT_EQ(kinds_of([&] { KILN_EXPECT_OK(s->sync_collective()); }), Kinds{});
}

// The fusion-client form of the activations without a §5.11 row: Burn's default ActivationOps,
// op for op, and the values PyTorch's definitions give (computed here in double).
TEST_F(ApiCoverage, TheActivationsDecomposeAsBurnsDefaultActivationOps) {
  Tensor x = f32s(*s, kX, {2, 3}), g = f32s(*s, kG, {2, 3}), alpha = f32s(*s, kAlpha, {1, 3});
  auto each = [](auto f) {
    std::vector<double> out;
    for (std::size_t i = 0; i < kX.size(); ++i) out.push_back(f(kX[i], kG[i], kAlpha[i % 3]));
    return out;
  };
  auto sigmoid = [](double v) { return 1 / (1 + std::exp(-v)); };
  const Shape sh{2, 3};
  expect_near(get(s->leaky_relu(x, 0.1), sh), each([](double v, double, double) { return v < 0 ? 0.1 * v : v; }));
  expect_near(get(s->prelu(x, alpha), sh), each([](double v, double, double a) { return v < 0 ? a * v : v; }));
  expect_near(get(s->hard_sigmoid(x, 0.2, 0.5), sh),
              each([](double v, double, double) { return std::clamp(0.2 * v + 0.5, 0.0, 1.0); }));
  expect_near(get(s->log_sigmoid(x), sh), each([&](double v, double, double) { return std::log(sigmoid(v)); }));
  expect_near(get(s->relu_backward(x, g), sh), each([](double v, double d, double) { return v <= 0 ? 0 : d; }));
  expect_near(get(s->sigmoid_backward(x, g), sh), each([](double v, double d, double) { return d * v * (1 - v); }));
  expect_near(get(s->log_sigmoid_backward(x, g), sh),
              each([&](double v, double d, double) { return d * sigmoid(-v); }));
  // The tanh approximation's derivative (Burn's gelu_backward), not the erf form's.
  expect_near(get(s->gelu_backward(x, g), sh), each([](double v, double d, double) {
                const double u = std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v);
                const double du = std::sqrt(2 / M_PI) * (1 + 3 * 0.044715 * v * v);
                const double t = std::tanh(u);
                return d * (0.5 * (1 + t) + 0.5 * v * (1 - t * t) * du);
              }),
              1e-4);
  std::vector<double> softmin;
  for (int r = 0; r < 2; ++r) {
    double z = 0;
    for (int c = 0; c < 3; ++c) z += std::exp(-kX[r * 3 + c]);
    for (int c = 0; c < 3; ++c) softmin.push_back(std::exp(-kX[r * 3 + c]) / z);
  }
  expect_near(get(s->softmin(x, 1), sh), softmin);

  const std::string mul_scalar = "NumericFloat::MulScalar", add_scalar = "NumericFloat::AddScalar";
  const std::string mul = "NumericFloat::Mul", add = "NumericFloat::Add", sub = "NumericFloat::Sub";
  const std::string exp = "Float::Exp", lower = "NumericFloat::LowerElem", fill = "BaseFloat::MaskFill";
  EXPECT_EQ(kinds_of([&] { ok(s->leaky_relu(x, 0.1)); }), (Kinds{lower, mul_scalar, "BaseFloat::MaskWhere"}));
  EXPECT_EQ(kinds_of([&] { ok(s->prelu(x, alpha)); }), (Kinds{lower, mul, "BaseFloat::MaskWhere"}));
  EXPECT_EQ(kinds_of([&] { ok(s->hard_sigmoid(x, 0.2, 0.5)); }),
            (Kinds{"BaseFloat::Cast", mul_scalar, add_scalar, "NumericFloat::Clamp", "BaseFloat::Cast"}));
  EXPECT_EQ(kinds_of([&] { ok(s->log_sigmoid(x)); }),
            (Kinds{mul_scalar, lower, fill, mul_scalar, exp, sub, exp, add, "Float::Log", sub}));
  EXPECT_EQ(kinds_of([&] { ok(s->softmin(x, 1)); }),
            (Kinds{mul_scalar, "NumericFloat::MaxDim", sub, exp, "NumericFloat::SumDim", "NumericFloat::Div"}));
  EXPECT_EQ(kinds_of([&] { ok(s->relu_backward(x, g)); }), (Kinds{"NumericFloat::LowerEqualElem", fill}));
  EXPECT_EQ(kinds_of([&] { ok(s->sigmoid_backward(x, g)); }), (Kinds{mul_scalar, add_scalar, mul, mul}));
  EXPECT_EQ(kinds_of([&] { ok(s->gelu_backward(x, g)); }),
            (Kinds{"Float::PowfScalar", mul_scalar, mul_scalar, mul_scalar, mul_scalar, add, add, "Float::Tanh", mul,
                   mul_scalar, add_scalar, mul_scalar, mul, add_scalar, add, mul}));
  EXPECT_EQ(kinds_of([&] { ok(s->log_sigmoid_backward(x, g)); }),
            (Kinds{mul_scalar, lower, fill, mul_scalar, exp, sub, exp, add, "BaseFloat::Ones", fill, fill,
                   "Float::Recip", sub, mul, sub, mul}));
  // Float only in both forms, checked before any IR: the error names the call.
  for (Session* ss : {s.get(), router.get()}) {
    Tensor n = i64s(*ss, {1, -1}, {2});
    const Kinds none = kinds_of([&] {
      for (const Result<Tensor>& r : {ss->leaky_relu(n, 0.1), ss->log_sigmoid(n), ss->relu_backward(n, n)}) {
        ASSERT_FALSE(r.ok());
        EXPECT_EQ(r.error().code, ErrorCode::DTypeMismatch) << r.error().to_string();
      }
    });
    EXPECT_EQ(none, Kinds{});
  }
  const std::string message = s->hard_sigmoid(i64s(*s, {1}, {1}), 0.2, 0.5).error().to_string();
  EXPECT_NE(message.find("hard_sigmoid"), std::string::npos) << message;
}

// topk_with_indices: topk's values and argtopk's indices from one TopKWithIndices.
TEST_F(ApiCoverage, TopKWithIndices) {
  Tensor x = f32s(*s, kX, {2, 3});
  auto [values, indices] = ok(s->topk_with_indices(x, 2, 1));
  expect_near(get(std::move(values), {2, 2}), {-0.25, -1, 2, 0.5});
  EXPECT_EQ(get_i64(std::move(indices), {2, 2}), (std::vector<std::int64_t>{2, 1, 2, 1}));
  EXPECT_EQ(kinds_of([&] { ok(s->topk_with_indices(x, 1, 0)); }), (Kinds{"NumericFloat::TopKWithIndices"}));
  EXPECT_FALSE(s->topk_with_indices(x, 4, 1).ok());
}

}  // namespace
}  // namespace kiln::runtime
