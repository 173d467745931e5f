// Targeted tests of the fast CPU executor: each program kind, in-place reuse, errored inputs and
// kernel faults (op-by-op replay), the compiled-form cache across sizes and scalars, single ops,
// and the math approximations' error bounds.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <memory>
#include <optional>
#include <random>
#include <sstream>

#include "../../cpu/src/fast_math.h"
#include "differential_util.h"
#include "kiln/testing/status.h"

namespace kiln::cpu {
namespace {

using difftest::FusedSide;
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

TensorIr use(TensorIr t, TensorStatus s) {
  t.status = s;
  return t;
}
using ::kiln::testing::ok;

// A session: one fused side, an id counter, host helpers.
struct Session : FusedSide {
  std::uint64_t next = 1;
  explicit Session(int threads = 2, fusion::FuserOptions fusers = {}) : FusedSide(threads, fusers) {}
  TensorId id() { return TensorId{next++}; }
  TensorIr input(Shape shape, const std::vector<double>& values, DType d = dt::f32) {
    TensorIr t{id(), std::move(shape), TensorStatus::ReadOnly, d};
    KILN_EXPECT_OK(device.upload_f64(t.id, t.shape, d, values));
    return t;
  }
  TensorIr out(const Operation& op) { return op.outputs()[0]; }
  TensorIr submit(Operation op) {
    TensorIr o = op.outputs()[0];
    o.status = TensorStatus::ReadOnly;  // later uses read it
    stream.register_op(std::move(op), store, exec);
    return o;
  }
  void sync() { stream.drain(store, exec); }
  std::vector<double> read(const TensorIr& t) {
    sync();
    auto v = device.download_f64(t.id);
    EXPECT_TRUE(v.ok()) << t.to_string() << ": " << (v.ok() ? "" : v.error().to_string());
    return v.ok() ? *v : std::vector<double>{};
  }
};

std::vector<double> iota(std::size_t n, double scale = 1.0, double offset = 0.0) {
  std::vector<double> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = offset + scale * static_cast<double>((i * 37) % 101) / 101.0;
  return v;
}

// One rounding per operation, as the kernels do (the compiler may not fuse them into an fma).
[[gnu::noinline]] float mul_f32(float a, float b) { return a * b; }
[[gnu::noinline]] float add_f32(float a, float b) { return a + b; }

double rel_err(double a, double b) { return std::fabs(a - b) / std::max(std::fabs(b), 1e-30); }

// W1: y = exp(a*b + c*s), fused into one Elementwise program.
TensorIr register_w1(Session& s, const Shape& shape, double scalar, TensorIr* a_out = nullptr) {
  const std::size_t n = ir::num_elements(shape);
  const TensorIr a = s.input(shape, iota(n, 2, -1)), bb = s.input(shape, iota(n, 1.5, -0.5)),
                 c = s.input(shape, iota(n, 1, -0.7));
  if (a_out) *a_out = a;
  const TensorIr t1 = s.submit(ok(b::binary(Family::NumericFloat, OpKind::Numeric_Mul, a, bb, s.id())));
  const TensorIr t2 =
      s.submit(ok(b::scalar(Family::NumericFloat, OpKind::Numeric_MulScalar, c, ScalarIr::Float(scalar), s.id())));
  const TensorIr t3 = s.submit(ok(b::binary(Family::NumericFloat, OpKind::Numeric_Add, use(t1, TensorStatus::ReadWrite),
                                            use(t2, TensorStatus::ReadWrite), s.id())));
  return s.submit(ok(b::unary(Family::Float, OpKind::Float_Exp, use(t3, TensorStatus::ReadWrite), s.id())));
}

std::vector<double> w1_expected(const Shape& shape, double scalar) {
  const std::size_t n = ir::num_elements(shape);
  auto a = iota(n, 2, -1), bb = iota(n, 1.5, -0.5), c = iota(n, 1, -0.7);
  std::vector<double> y(n);
  for (std::size_t i = 0; i < n; ++i) {
    const float t = static_cast<float>(static_cast<float>(a[i]) * static_cast<float>(bb[i])) +
                    static_cast<float>(static_cast<float>(c[i]) * static_cast<float>(scalar));
    y[i] = std::exp(static_cast<double>(t));
  }
  return y;
}

TEST(FastExecutor, W1RunsAsOneFusedElementwiseProgram) {
  Session s;
  const TensorIr y = register_w1(s, {64, 64}, 2.0);
  const std::vector<double> got = s.read(y);
  const std::vector<double> want = w1_expected({64, 64}, 2.0);
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) ASSERT_LE(rel_err(got[i], want[i]), 3e-7) << i;
  const CpuDeviceStats st = s.device.stats();
  EXPECT_EQ(st.fused_launches, 1u);
  EXPECT_EQ(st.launches_by_kind[0], 1u);
  EXPECT_EQ(st.fused_replays, 0u);
  EXPECT_EQ(st.reference_ops, 0u);
}

// One compiled form for every size and scalar of one structure: the cache hits, and each run's
// placeholders (sizes, the scalar) are bound anew.
TEST(FastExecutor, CompiledFormIsReusedAcrossSizesAndScalars) {
  Session s;
  const std::vector<std::pair<Shape, double>> runs = {
      {{64, 48}, 2.0},
      {{32, 48}, 3.0},
      {{100, 7}, -1.5},
      {{3, 5}, 0.25},
      {{300, 301}, 1.0},
      // > 24 MiB of streams: short chunks, prefetch, non-temporal stores
      {{2048, 1100}, 0.5}};
  for (const auto& [shape, scalar] : runs) {
    const TensorIr y = register_w1(s, shape, scalar);
    const std::vector<double> got = s.read(y);
    const std::vector<double> want = w1_expected(shape, scalar);
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t i = 0; i < got.size(); ++i)
      ASSERT_LE(rel_err(got[i], want[i]), 3e-7) << ir::shape_to_string(shape) << " s=" << scalar << " element " << i;
  }
  const CpuDeviceStats st = s.device.stats();
  EXPECT_EQ(st.fused_launches, runs.size());
  EXPECT_EQ(st.kernel_cache_misses, 1u) << "one structure, one compile";
  EXPECT_EQ(st.kernel_cache_hits, runs.size() - 1);
  EXPECT_EQ(s.device.kernel_cache_size(), 1u);
  EXPECT_GE(s.stream.processor().stats().cache_hits, runs.size() - 1) << "the plan itself is cached too";
}

// A consumed input's buffer becomes the output's when nothing else holds it.
TEST(FastExecutor, ReusesAConsumedInputBufferInPlace) {
  Session s;
  const TensorIr x = s.input({40, 50}, iota(2000));
  const std::byte* x_data = s.device.handles().get_handle_ref(x.id)->data();
  const TensorIr t = s.submit(ok(b::scalar(Family::NumericFloat, OpKind::Numeric_MulScalar,
                                           use(x, TensorStatus::ReadWrite), ScalarIr::Float(2.0), s.id())));
  const TensorIr y = s.submit(ok(b::scalar(Family::NumericFloat, OpKind::Numeric_AddScalar,
                                           use(t, TensorStatus::ReadWrite), ScalarIr::Float(1.0), s.id())));
  const std::vector<double> got = s.read(y);
  const std::vector<double> xs = iota(2000);
  for (std::size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(got[i], static_cast<float>(static_cast<float>(xs[i]) * 2.0f) + 1.0f);
  EXPECT_EQ(s.device.stats().inplace_reuses, 1u);
  EXPECT_EQ(s.device.handles().get_handle_ref(y.id)->data(), x_data);
  EXPECT_FALSE(s.device.handles().has_handle(x.id));
}

// The same at a size that streams from DRAM (32 MiB): short chunks, prefetching, and the output
// written in place into the input's buffer by the last instruction.
TEST(FastExecutor, ReusesAConsumedInputBufferInPlaceWhileStreaming) {
  Session s;
  const std::size_t n = std::size_t{1} << 22;
  const TensorIr x = s.input({n}, iota(n));
  const std::byte* x_data = s.device.handles().get_handle_ref(x.id)->data();
  const TensorIr t = s.submit(ok(b::scalar(Family::NumericFloat, OpKind::Numeric_MulScalar,
                                           use(x, TensorStatus::ReadWrite), ScalarIr::Float(2.0), s.id())));
  const TensorIr y = s.submit(ok(b::scalar(Family::NumericFloat, OpKind::Numeric_AddScalar,
                                           use(t, TensorStatus::ReadWrite), ScalarIr::Float(1.0), s.id())));
  const std::vector<double> got = s.read(y);
  const std::vector<double> xs = iota(n);
  for (std::size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(got[i], static_cast<float>(static_cast<float>(xs[i]) * 2.0f) + 1.0f) << i;
  EXPECT_EQ(s.device.stats().inplace_reuses, 1u);
  EXPECT_EQ(s.device.handles().get_handle_ref(y.id)->data(), x_data);
}

TEST(FastExecutor, NoInPlaceReuseWhileAnotherHandleSharesTheBuffer) {
  Session s;
  const TensorIr x = s.input({40, 50}, iota(2000));
  const HostTensor held = *s.device.tensor(x.id);  // e.g. a client still reading it
  const TensorIr t = s.submit(ok(b::scalar(Family::NumericFloat, OpKind::Numeric_MulScalar,
                                           use(x, TensorStatus::ReadWrite), ScalarIr::Float(2.0), s.id())));
  const TensorIr y = s.submit(ok(b::unary(Family::Float, OpKind::Float_Exp, use(t, TensorStatus::ReadWrite), s.id())));
  (void)s.read(y);
  EXPECT_EQ(s.device.stats().inplace_reuses, 0u);
  EXPECT_NE(s.device.handles().get_handle_ref(y.id)->data(), held.data());
  EXPECT_EQ(held.to_f64()[7], static_cast<float>(iota(2000)[7]));  // untouched
}

// An errored input: the fused program is replayed op by op, each op skipping as unfused.
TEST(FastExecutor, ErroredInputReplaysTheProgramOpByOp) {
  Session s;
  TensorIr a;
  const TensorIr y = [&] {
    // W1 with `a` errored before the program runs.
    const Shape shape{16, 8};
    TensorIr r = register_w1(s, shape, 2.0, &a);
    s.device.handles().claim(a.id, ir::TensorError::make_root(ErrorCode::Execution, "upstream kernel failed"));
    return r;
  }();
  s.sync();
  const ir::TensorError root = *s.device.handles().entry(a.id)->error();
  auto got = s.device.download_f64(y.id);
  ASSERT_TRUE(got.is_errored());
  EXPECT_TRUE(got.tensor_error()->same_root(root));
  EXPECT_EQ(got.tensor_error()->depth, 3u);  // mul, add, exp skipped
  EXPECT_EQ(s.device.stats().fused_replays, 1u);
  EXPECT_EQ(s.device.stats().fallbacks_by_reason[static_cast<std::size_t>(runtime::FallbackReason::InputErrored)], 1u);
  EXPECT_EQ(s.device.stats().fused_launches, 0u);
}

// A kernel fault (integer division by zero) inside a fused program: nothing was consumed, the ops
// replay, and the failing op's output carries a new root (depth 0), its consumer depth 1.
TEST(FastExecutor, KernelFaultReplaysAndFailsTheFaultingOp) {
  Session s;
  const Shape shape{4, 5};
  std::vector<double> num(20, 7), den(20, 2);
  den[13] = 0;
  const TensorIr n = s.input(shape, num, dt::i32);
  const TensorIr d = s.input(shape, den, dt::i32);
  const TensorIr q = s.submit(ok(b::binary(Family::NumericInt, OpKind::Numeric_Div, n, d, s.id())));
  const TensorIr y = s.submit(ok(b::scalar(Family::NumericInt, OpKind::Numeric_AddScalar,
                                           use(q, TensorStatus::ReadWrite), ScalarIr::Int(1), s.id())));
  const TensorIr z =
      s.submit(ok(b::scalar(Family::NumericInt, OpKind::Numeric_MulScalar, n, ScalarIr::Int(3), s.id())));
  s.sync();
  auto yv = s.device.download_i64(y.id);
  ASSERT_TRUE(yv.is_errored()) << (yv.ok() ? "no error" : yv.error().to_string());
  EXPECT_EQ(yv.tensor_error()->depth, 1u);
  EXPECT_THAT(yv.tensor_error()->root->message(), ::testing::HasSubstr("division by zero"));
  EXPECT_EQ(s.device.stats().fused_replays, 1u);
  EXPECT_EQ(s.device.stats().fallbacks_by_reason[static_cast<std::size_t>(runtime::FallbackReason::Fault)], 1u);
  // Inputs intact, unrelated outputs fine.
  EXPECT_EQ((*s.device.download_i64(n.id))[0], 7);
  EXPECT_EQ((*s.device.download_i64(z.id))[3], 21);
}

// Reduce: prologue (exp) -> sum over an axis -> epilogue (* 2), for the last and other axes.
// The default logger's output, at debug level, while it lives.
class LogCapture {
 public:
  LogCapture() : sink_(std::make_shared<spdlog::sinks::ostream_sink_mt>(text_)), level_(spdlog::get_level()) {
    spdlog::default_logger()->sinks().push_back(sink_);
    spdlog::set_level(spdlog::level::debug);
  }
  ~LogCapture() {
    auto& sinks = spdlog::default_logger()->sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
    spdlog::set_level(level_);
  }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;
  std::string text() const { return text_.str(); }

 private:
  std::ostringstream text_;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink_;
  spdlog::level::level_enum level_;
};

// Fallbacks are values: a program the kernels cannot take is counted by its reason, the log names
// the values involved, and the replayed ops compute the result.
TEST(FastExecutor, FallbacksAreCountedByReasonAndNameTheirValues) {
  LogCapture log;
  Session s;
  const Shape shape{2, 2, 2, 2, 2, 2, 2, 2, 2};  // rank 9: the kernels take rank 8 at most
  const TensorIr y = register_w1(s, shape, 2.0);
  const std::vector<double> got = s.read(y);
  ASSERT_EQ(got.size(), 512u);
  const std::vector<double> want = w1_expected(shape, 2.0);
  for (std::size_t i = 0; i < got.size(); ++i) ASSERT_LE(rel_err(got[i], want[i]), 1e-6) << i;
  const CpuDeviceStats st = s.device.stats();
  EXPECT_EQ(st.fused_replays, 1u);
  EXPECT_EQ(st.fallbacks_by_reason[static_cast<std::size_t>(runtime::FallbackReason::ShapeLimits)], 1u);
  std::uint64_t total = 0;
  for (std::uint64_t n : st.fallbacks_by_reason) total += n;
  EXPECT_EQ(total, st.fused_replays);
  EXPECT_THAT(log.text(), ::testing::HasSubstr("replayed op by op: shape_limits: block 0: reference "));
  EXPECT_THAT(log.text(), ::testing::HasSubstr("of rank 9 above 8"));
}

TEST(FastExecutor, ReduceProgramWithPrologueAndEpilogue) {
  for (std::uint64_t axis : {2u, 1u, 0u}) {
    Session s;
    const Shape shape{6, 40, 33};
    const std::vector<double> xs = iota(6 * 40 * 33, 2, -1);
    const TensorIr x = s.input(shape, xs);
    const TensorIr e = s.submit(ok(b::unary(Family::Float, OpKind::Float_Exp, x, s.id())));
    const TensorIr r = s.submit(ok(
        b::reduce_dim(Family::NumericFloat, OpKind::Numeric_SumDim, use(e, TensorStatus::ReadWrite), axis, 1, s.id())));
    const TensorIr y = s.submit(ok(b::scalar(Family::NumericFloat, OpKind::Numeric_MulScalar,
                                             use(r, TensorStatus::ReadWrite), ScalarIr::Float(2.0), s.id())));
    const std::vector<double> got = s.read(y);
    const std::uint64_t outer = axis == 0 ? 1 : (axis == 1 ? 6 : 6 * 40), n = shape[axis],
                        inner = axis == 2 ? 1 : (axis == 1 ? 33 : 40 * 33);
    ASSERT_EQ(got.size(), outer * inner);
    for (std::uint64_t o = 0; o < outer; ++o)
      for (std::uint64_t i = 0; i < inner; ++i) {
        double acc = 0;
        for (std::uint64_t j = 0; j < n; ++j)
          acc += std::exp(static_cast<double>(static_cast<float>(xs[(o * n + j) * inner + i])));
        ASSERT_LE(rel_err(got[o * inner + i], 2 * acc), 5e-7) << "axis " << axis;
      }
    EXPECT_EQ(s.device.stats().launches_by_kind[2], 1u) << "axis " << axis;
  }
}

// softmax(x / 2) over the last axis: one ReduceBroadcasted program (max, then sum with the
// exp prologue, then the division), its stages interleaved row group by row group.
// Burn's search fuses it as ReduceBroadcasted, kiln's row fuser as one Row program: the same
// stages, run row group by row group, x * 0.5 and exp(x * 0.5 - max) kept in each task's row window. 2048 rows of
// 1024 on two threads run many groups at once (the reductions' row ranges were once shared by
// the tasks: a race).
TEST(FastExecutor, SoftmaxRunsRowGroupByRowGroup) {
  for (const bool row_fuser : {false, true})
    for (const auto& [rows_, cols_] : {std::pair<std::size_t, std::size_t>{37, 129}, {300, 1024}, {2048, 1024}}) {
      const std::size_t R = rows_, C = cols_;
      SCOPED_TRACE(::testing::Message() << "row fuser " << row_fuser << ", " << R << "x" << C);
      Session s(2, fusion::FuserOptions{.row_fuser = row_fuser});
      const Shape shape{R, C};
      const std::vector<double> xs = iota(R * C, 8, -4);
      const TensorIr x = s.input(shape, xs);
      const TensorIr h =
          s.submit(ok(b::scalar(Family::NumericFloat, OpKind::Numeric_MulScalar, x, ScalarIr::Float(0.5), s.id())));
      const TensorIr m = s.submit(ok(b::reduce_dim(Family::NumericFloat, OpKind::Numeric_MaxDim, h, 1, 1, s.id())));
      const TensorIr d =
          s.submit(ok(b::binary(Family::NumericFloat, OpKind::Numeric_Sub, use(h, TensorStatus::ReadWrite),
                                use(m, TensorStatus::ReadWrite), s.id())));
      const TensorIr e =
          s.submit(ok(b::unary(Family::Float, OpKind::Float_Exp, use(d, TensorStatus::ReadWrite), s.id())));
      const TensorIr sum = s.submit(ok(b::reduce_dim(Family::NumericFloat, OpKind::Numeric_SumDim, e, 1, 1, s.id())));
      const TensorIr y =
          s.submit(ok(b::binary(Family::NumericFloat, OpKind::Numeric_Div, use(e, TensorStatus::ReadWrite),
                                use(sum, TensorStatus::ReadWrite), s.id())));
      const std::vector<double> got = s.read(y);
      for (std::size_t r = 0; r < R; ++r) {
        double mx = -1e30, acc = 0;
        auto hv = [&](std::size_t c) { return static_cast<double>(static_cast<float>(xs[r * C + c]) * 0.5f); };
        for (std::size_t c = 0; c < C; ++c) mx = std::max(mx, hv(c));
        for (std::size_t c = 0; c < C; ++c) acc += std::exp(hv(c) - mx);
        for (std::size_t c = 0; c < C; ++c) ASSERT_LE(rel_err(got[r * C + c], std::exp(hv(c) - mx) / acc), 1e-6);
      }
      const CpuDeviceStats st = s.device.stats();
      EXPECT_EQ(st.launches_by_kind[static_cast<std::size_t>(fusion::ProgramKind::ReduceBroadcasted)],
                row_fuser ? 0u : 1u);
      EXPECT_EQ(st.launches_by_kind[static_cast<std::size_t>(fusion::ProgramKind::Row)], row_fuser ? 1u : 0u);
      EXPECT_EQ(st.launches_by_kind[2], 2u);  // its two Reduce stages
      EXPECT_EQ(st.row_interleaved, 1u);
      EXPECT_EQ(st.row_window_temporaries, 2u);  // x * 0.5 and exp(x * 0.5 - max)
      EXPECT_EQ(st.fused_replays, 0u);
      EXPECT_EQ(st.fast_ops + st.reference_ops, 0u);
    }
}

std::vector<double> host_matmul(const std::vector<double>& a, const std::vector<double>& w, std::size_t m,
                                std::size_t k, std::size_t n) {
  std::vector<double> c(m * n, 0.0);
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t p = 0; p < k; ++p)
      for (std::size_t j = 0; j < n; ++j) c[i * n + j] += a[i * k + p] * w[p * n + j];
  return c;
}

std::vector<double> rounded(std::vector<double> v, DType d) {
  for (double& x : v) x = d == dt::f64 ? x : static_cast<double>(static_cast<float>(x));
  return v;
}

// (a @ w + bias) * 2: a Matmul program with its epilogue, f32 and f64, edge tiles included.
TEST(FastExecutor, MatmulWithEpilogue) {
  for (DType d : {dt::f32, dt::f64}) {
    Session s;
    const std::size_t m = 67, k = 45, n = 33;
    const auto av = rounded(iota(m * k, 2, -1), d), wv = rounded(iota(k * n, 1, -0.5), d),
               bv = rounded(iota(n, 1, 0.25), d);
    const TensorIr a = s.input({m, k}, av, d), w = s.input({k, n}, wv, d), bias = s.input({1, n}, bv, d);
    const TensorIr c = s.submit(ok(b::matmul(Family::Float, OpKind::Float_Matmul, a, w, s.id())));
    const TensorIr t = s.submit(
        ok(b::binary(Family::NumericFloat, OpKind::Numeric_Add, use(c, TensorStatus::ReadWrite), bias, s.id())));
    const TensorIr y = s.submit(ok(b::scalar(Family::NumericFloat, OpKind::Numeric_MulScalar,
                                             use(t, TensorStatus::ReadWrite), ScalarIr::Float(2.0), s.id())));
    const std::vector<double> got = s.read(y);
    const std::vector<double> ref = host_matmul(av, wv, m, k, n);
    const double tol = d == dt::f64 ? 1e-13 : 2e-5;
    for (std::size_t i = 0; i < m; ++i)
      for (std::size_t j = 0; j < n; ++j)
        ASSERT_NEAR(got[i * n + j], 2 * (ref[i * n + j] + bv[j]), tol * (1 + std::fabs(ref[i * n + j])))
            << d.name() << " " << i << "," << j;
    EXPECT_EQ(s.device.stats().launches_by_kind[1], 1u) << d.name();
  }
}

// A [m, k] x [k, n] f32 product, scaled by an epilogue when `scale` is given, against the host's.
void expect_f32_matmul(Session& s, std::size_t m, std::size_t k, std::size_t n, std::optional<double> scale) {
  const auto av = rounded(iota(m * k, 2, -1), dt::f32), wv = rounded(iota(k * n, 1, -0.5), dt::f32);
  const TensorIr a = s.input({m, k}, av), w = s.input({k, n}, wv);
  TensorIr y = s.submit(ok(b::matmul(Family::Float, OpKind::Float_Matmul, a, w, s.id())));
  if (scale)
    y = s.submit(ok(b::scalar(Family::NumericFloat, OpKind::Numeric_MulScalar, use(y, TensorStatus::ReadWrite),
                              ScalarIr::Float(*scale), s.id())));
  const std::vector<double> got = s.read(y);
  const std::vector<double> ref = host_matmul(av, wv, m, k, n);
  const double factor = scale.value_or(1.0);
  for (std::size_t i = 0; i < m * n; ++i) ASSERT_NEAR(got[i], factor * ref[i], 1e-4 * (1 + std::fabs(ref[i]))) << i;
}

// A single large matmul: full register tiles, several K blocks, row blocks in parallel.
TEST(FastExecutor, LargeSingleMatmul) {
  Session s;
  expect_f32_matmul(s, 301, 517, 263, std::nullopt);
  EXPECT_EQ(s.device.stats().fast_ops, 1u);
}

// A batch of small matmuls (attention's shape): each task of the kernel runs several matrices with
// the same packing buffers, so a matrix that read a stale packed A or B from the one before it
// would show here. A is broadcast over the first batch dim; K spans two KC blocks (f32: 256) in
// one case; an epilogue follows. Reading a buffer before writing it would also show under ASan.
TEST(FastExecutor, BatchedSmallMatmulsReuseTheirBuffers) {
  struct Case {
    std::size_t m, k, n;
  };
  for (DType d : {dt::f32, dt::f64})
    for (const Case c : {Case{13, 37, 19}, Case{5, 300, 9}, Case{16, 8, 16}}) {
      Session s;
      const std::size_t b0 = 3, b1 = 4;
      const auto av = rounded(iota(b1 * c.m * c.k, 2, -1), d), wv = rounded(iota(b0 * b1 * c.k * c.n, 1, -0.5), d);
      const TensorIr a = s.input({1, b1, c.m, c.k}, av, d), w = s.input({b0, b1, c.k, c.n}, wv, d);
      const TensorIr prod = s.submit(ok(b::matmul(Family::Float, OpKind::Float_Matmul, a, w, s.id())));
      const TensorIr y = s.submit(ok(b::scalar(Family::NumericFloat, OpKind::Numeric_AddScalar,
                                               use(prod, TensorStatus::ReadWrite), ScalarIr::Float(1.5), s.id())));
      const std::vector<double> got = s.read(y);
      const double tol = d == dt::f64 ? 1e-13 : 2e-5;
      for (std::size_t i = 0; i < b0; ++i)
        for (std::size_t j = 0; j < b1; ++j) {
          const std::vector<double> am(av.begin() + static_cast<std::ptrdiff_t>(j * c.m * c.k),
                                       av.begin() + static_cast<std::ptrdiff_t>((j + 1) * c.m * c.k));
          const std::size_t wb = (i * b1 + j) * c.k * c.n;
          const std::vector<double> wm(wv.begin() + static_cast<std::ptrdiff_t>(wb),
                                       wv.begin() + static_cast<std::ptrdiff_t>(wb + c.k * c.n));
          const std::vector<double> ref = host_matmul(am, wm, c.m, c.k, c.n);
          const std::size_t ob = (i * b1 + j) * c.m * c.n;
          for (std::size_t e = 0; e < c.m * c.n; ++e)
            ASSERT_NEAR(got[ob + e], ref[e] + 1.5, tol * (1 + std::fabs(ref[e])))
                << d.name() << " " << c.m << "x" << c.k << "x" << c.n << " batch " << i << "," << j << " element " << e;
        }
      EXPECT_EQ(s.device.stats().launches_by_kind[1], 1u) << d.name();
    }
}

// B wider than the packed-B budget (8 MiB: K x N x 4 bytes above it): N in several column
// blocks, the epilogue in a pass of its own after the product.
TEST(FastExecutor, WideMatmulRunsItsEpilogueAfterTheProduct) {
  Session s;
  expect_f32_matmul(s, 5, 2100, 1000, 0.5);
  EXPECT_EQ(s.device.stats().launches_by_kind[1], 1u);
}

// An intermediate with a broadcast shape kept after the kernel: stored once per element.
TEST(FastExecutor, KeptBroadcastOutputOfAFusedBlock) {
  Session s;
  const std::size_t m = 70, n = 90;
  const auto rv = iota(n, 1, 0.5), xv = iota(m * n, 2, -1);
  const TensorIr row = s.input({1, n}, rv), x = s.input({m, n}, xv);
  const TensorIr a = s.submit(ok(b::binary(Family::NumericFloat, OpKind::Numeric_Add, x, row, s.id())));
  const TensorIr r2 =
      s.submit(ok(b::scalar(Family::NumericFloat, OpKind::Numeric_MulScalar, row, ScalarIr::Float(3.0), s.id())));
  const TensorIr y = s.submit(ok(b::binary(Family::NumericFloat, OpKind::Numeric_Mul, use(a, TensorStatus::ReadWrite),
                                           r2, s.id())));  // r2 stays alive: a kept [1, n] output
  const std::vector<double> yv = s.read(y);
  const std::vector<double> r2v = s.read(r2);
  for (std::size_t j = 0; j < n; ++j) ASSERT_EQ(r2v[j], static_cast<float>(rv[j]) * 3.0f);
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = 0; j < n; ++j)
      ASSERT_EQ(yv[i * n + j],
                (static_cast<float>(xv[i * n + j]) + static_cast<float>(rv[j])) * (static_cast<float>(rv[j]) * 3.0f));
  EXPECT_EQ(s.device.stats().fused_launches, 1u);
}

// A view (swap_dims) and an indexed read (gather) inside one elementwise program.
TEST(FastExecutor, ViewsAndIndexedReadsFuse) {
  Session s;
  const std::size_t n = 6;
  const auto xv = iota(n * n, 2, -1), tv = iota(n * 3, 1, 0);
  std::vector<double> iv(n * n);
  for (std::size_t i = 0; i < n * n; ++i) iv[i] = static_cast<double>((i * 7) % 3);
  const TensorIr x = s.input({n, n}, xv), table = s.input({n, 3}, tv), idx = s.input({n, n}, iv, dt::i64);
  const TensorIr t =
      s.submit(ok(b::scalar(Family::NumericFloat, OpKind::Numeric_MulScalar, x, ScalarIr::Float(2.0), s.id())));
  const TensorIr v = s.submit(ok(b::swap_dims(Family::BaseFloat, OpKind::Base_SwapDims, x, 0, 1, s.id())));
  const TensorIr u = s.submit(ok(b::binary(Family::NumericFloat, OpKind::Numeric_Add, use(t, TensorStatus::ReadWrite),
                                           use(v, TensorStatus::ReadWrite), s.id())));
  const TensorIr g = s.submit(ok(b::gather(Family::BaseFloat, OpKind::Base_Gather, table, 1, idx, s.id())));
  const TensorIr y = s.submit(ok(b::binary(Family::NumericFloat, OpKind::Numeric_Mul, use(u, TensorStatus::ReadWrite),
                                           use(g, TensorStatus::ReadWrite), s.id())));
  const std::vector<double> got = s.read(y);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < n; ++j) {
      const float a = add_f32(mul_f32(static_cast<float>(xv[i * n + j]), 2.0f), static_cast<float>(xv[j * n + i]));
      const float want = a * static_cast<float>(tv[i * 3 + static_cast<std::size_t>(iv[i * n + j])]);
      ASSERT_EQ(got[i * n + j], want) << i << "," << j;
    }
  EXPECT_GE(s.device.stats().fused_launches, 1u);
  EXPECT_EQ(s.device.stats().fused_replays, 0u);
}

// Elementwise work feeding a pool: an NhwcRelayout program (written row-major on the CPU), then
// the pool itself on the reference executor.
TEST(FastExecutor, NhwcRelayoutRunsItsElementwisePartThenThePool) {
  Session s;
  const auto xv = iota(2 * 3 * 5 * 5, 4, -2);
  const TensorIr x = s.input({2, 3, 5, 5}, xv);
  const TensorIr y =
      s.submit(ok(b::scalar(Family::NumericFloat, OpKind::Numeric_MulScalar, x, ScalarIr::Float(-3.0), s.id())));
  const TensorIr z = s.submit(ok(b::scalar(Family::NumericFloat, OpKind::Numeric_AddScalar,
                                           use(y, TensorStatus::ReadWrite), ScalarIr::Float(1.0), s.id())));
  b::MaxPool2dOptions opts;
  opts.kernel = {2, 2};
  const TensorIr p = s.submit(ok(b::max_pool2d(use(z, TensorStatus::ReadWrite), opts, s.id())));
  const std::vector<double> got = s.read(p);
  ASSERT_EQ(got.size(), 2u * 3 * 4 * 4);
  for (std::size_t c = 0; c < 6; ++c)
    for (std::size_t i = 0; i < 4; ++i)
      for (std::size_t j = 0; j < 4; ++j) {
        float mx = -1e30f;
        for (std::size_t di = 0; di < 2; ++di)
          for (std::size_t dj = 0; dj < 2; ++dj)
            mx = std::max(mx, add_f32(mul_f32(static_cast<float>(xv[c * 25 + (i + di) * 5 + j + dj]), -3.0f), 1.0f));
        ASSERT_EQ(got[c * 16 + i * 4 + j], mx) << c << " " << i << " " << j << " diff " << got[c * 16 + i * 4 + j] - mx;
      }
  EXPECT_EQ(s.device.stats().launches_by_kind[4], 1u);
  EXPECT_EQ(s.device.stats().fast_ops, 1u);  // the pool, on the fast pool kernels
  EXPECT_EQ(s.device.stats().reference_ops, 0u);
}

// Single operations run on the fast kernels (and reshape shares its buffer).
TEST(FastExecutor, SingleOpsUseTheFastKernels) {
  Session s;
  const auto xv = iota(3 * 4 * 5, 2, -1);
  const TensorIr x = s.input({3, 4, 5}, xv);
  const TensorIr r = s.submit(ok(b::reduce_dim(Family::NumericFloat, OpKind::Numeric_MaxDim, x, 1, 1, s.id())));
  const TensorIr sw = s.submit(ok(b::swap_dims(Family::BaseFloat, OpKind::Base_SwapDims, x, 0, 2, s.id())));
  const std::int64_t args[] = {12, 5};
  const std::byte* x_data = s.device.handles().get_handle_ref(x.id)->data();
  const TensorIr rs =
      s.submit(ok(b::shape_op(Family::BaseFloat, OpKind::Base_Reshape, use(x, TensorStatus::ReadWrite), args, s.id())));
  s.sync();
  const std::vector<double> rv = s.read(r), swv = s.read(sw), rsv = s.read(rs);
  for (std::size_t i = 0; i < 3; ++i)
    for (std::size_t k = 0; k < 5; ++k) {
      double mx = -1e30;
      for (std::size_t j = 0; j < 4; ++j)
        mx = std::max(mx, static_cast<double>(static_cast<float>(xv[(i * 4 + j) * 5 + k])));
      ASSERT_EQ(rv[i * 5 + k], mx);
      for (std::size_t j = 0; j < 4; ++j) ASSERT_EQ(swv[(k * 4 + j) * 3 + i], rsv[(i * 4 + j) * 5 + k]);
    }
  EXPECT_EQ(s.device.handles().get_handle_ref(rs.id)->data(), x_data);
  EXPECT_EQ(s.device.stats().zero_copy_reshapes, 1u);
  EXPECT_EQ(s.device.stats().reference_ops, 0u);
}

// A single-device AllReduce that consumes its input hands the input's buffer to its output when
// nothing else holds it (a daemon then reduces across daemons in place on it); a kept input, or
// a buffer shared with a view, gives the output a copy, so no write reaches another tensor.
TEST(FastExecutor, AllReduceHandsOverAnUnsharedConsumedBuffer) {
  Session s;
  const auto xv = iota(64, 3, -1);
  const TensorIr kept = s.input({64}, xv);
  const TensorIr consumed = s.input({64}, xv);
  const TensorIr viewed = s.input({64}, xv);
  const std::int64_t to_8x8[] = {8, 8};
  const TensorIr view = s.submit(ok(b::shape_op(Family::BaseFloat, OpKind::Base_Reshape, viewed, to_8x8, s.id())));
  s.sync();
  const std::byte* kept_data = s.device.handles().get_handle_ref(kept.id)->data();
  const std::byte* consumed_data = s.device.handles().get_handle_ref(consumed.id)->data();
  const std::byte* viewed_data = s.device.handles().get_handle_ref(viewed.id)->data();
  ASSERT_EQ(s.device.handles().get_handle_ref(view.id)->data(), viewed_data);
  const std::uint64_t reference_before = s.device.stats().reference_ops;

  const TensorIr from_kept = s.submit(ok(b::all_reduce(kept, ir::ReduceOperation::Sum, {}, s.id())));
  const TensorIr from_consumed =
      s.submit(ok(b::all_reduce(use(consumed, TensorStatus::ReadWrite), ir::ReduceOperation::Mean, {}, s.id())));
  const TensorIr from_viewed =
      s.submit(ok(b::all_reduce(use(viewed, TensorStatus::ReadWrite), ir::ReduceOperation::Max, {}, s.id())));
  s.sync();
  EXPECT_NE(s.device.handles().get_handle_ref(from_kept.id)->data(), kept_data);
  EXPECT_EQ(s.device.handles().get_handle_ref(from_consumed.id)->data(), consumed_data);
  EXPECT_NE(s.device.handles().get_handle_ref(from_viewed.id)->data(), viewed_data);
  EXPECT_FALSE(s.device.handles().has_handle(consumed.id));
  EXPECT_FALSE(s.device.handles().has_handle(viewed.id));
  std::vector<double> expected(xv.size());
  for (std::size_t i = 0; i < xv.size(); ++i) expected[i] = static_cast<float>(xv[i]);
  for (const TensorIr& t : {from_kept, from_consumed, from_viewed, kept, view})
    EXPECT_EQ(s.read(t), expected) << t.to_string();
  EXPECT_EQ(s.device.stats().reference_ops - reference_before, 2u);  // the two copies
}

// ---- Convolutions on the fast path (cpu/src/fast_conv.cc)

// One random convolution of every role: its operands, options and kind.
struct ConvCase {
  std::size_t rank;
  bool transposed;
  b::ConvOptions options;
  Shape x, w;  // the op's x and weight
  std::string describe() const {
    std::ostringstream os;
    os << (transposed ? "conv_transpose" : "conv") << rank << "d x " << ir::shape_to_string(x) << " w "
       << ir::shape_to_string(w) << " groups " << options.groups;
    for (std::size_t i = 0; i < rank; ++i)
      os << " [s" << options.stride[i] << " p" << options.padding[i] << " d" << options.dilation[i]
         << (transposed ? " po" + std::to_string(options.padding_out[i]) : std::string()) << "]";
    return os.str();
  }
};

OpKind conv_kind(std::size_t rank, bool transposed, b::ConvRole role) {
  static constexpr OpKind kinds[2][3][4] = {
      {{OpKind::Module_Conv1d, OpKind::Module_Conv1dXBackward, OpKind::Module_Conv1dWeightBackward,
        OpKind::Module_Conv1dBiasBackward},
       {OpKind::Module_Conv2d, OpKind::Module_Conv2dXBackward, OpKind::Module_Conv2dWeightBackward,
        OpKind::Module_Conv2dBiasBackward},
       {OpKind::Module_Conv3d, OpKind::Module_Conv3dXBackward, OpKind::Module_Conv3dWeightBackward,
        OpKind::Module_Conv3dBiasBackward}},
      {{OpKind::Module_ConvTranspose1d, OpKind::Module_ConvTranspose1d, OpKind::Module_ConvTranspose1dWeightBackward,
        OpKind::Module_ConvTranspose1dBiasBackward},
       {OpKind::Module_ConvTranspose2d, OpKind::Module_ConvTranspose2d, OpKind::Module_ConvTranspose2dWeightBackward,
        OpKind::Module_ConvTranspose2dBiasBackward},
       {OpKind::Module_ConvTranspose3d, OpKind::Module_ConvTranspose3d, OpKind::Module_ConvTranspose3dWeightBackward,
        OpKind::Module_ConvTranspose3dBiasBackward}}};
  return kinds[transposed][rank - 1][static_cast<std::size_t>(role)];
}

ConvCase random_conv(std::mt19937_64& rng, std::size_t rank, bool transposed) {
  auto pick = [&](std::uint64_t lo, std::uint64_t hi) {
    return std::uniform_int_distribution<std::uint64_t>(lo, hi)(rng);
  };
  ConvCase c{rank, transposed, {}, {}, {}};
  c.options.groups = pick(1, 2);
  const std::uint64_t batch = pick(1, 2), cin = c.options.groups * pick(1, 3), cout = c.options.groups * pick(1, 3);
  c.x = {batch, transposed ? cout : cin};
  c.w = transposed ? Shape{cout, cin / c.options.groups} : Shape{cout, cin / c.options.groups};
  for (std::size_t i = 0; i < rank; ++i) {
    const std::uint64_t k = pick(1, 3), stride = pick(1, 2), dilation = pick(1, 2);
    // An input at least as large as the dilated kernel (so a convolution has outputs), up to 7 (4
    // in 3-d); a transposed convolution's padding keeps an output (2·padding below its unpadded size).
    const std::uint64_t span = (k - 1) * dilation + 1;
    const std::uint64_t in = pick(span, std::max<std::uint64_t>(span, rank == 3 ? 4 : 7));
    const std::uint64_t padding_out = transposed ? pick(0, std::max(stride, dilation) - 1) : 0;
    const std::uint64_t unpadded = (in - 1) * stride + (k - 1) * dilation + padding_out + 1;
    const std::uint64_t padding = pick(0, transposed ? std::min<std::uint64_t>(2, (unpadded - 1) / 2) : 2);
    c.options.stride.push_back(stride);
    c.options.dilation.push_back(dilation);
    c.options.padding.push_back(padding);
    if (transposed) c.options.padding_out.push_back(padding_out);
    c.w.push_back(k);
    c.x.push_back(in);
  }
  return c;
}

// Runs `op` on the fast executor (one op, no fusion around it) and on the reference, with the same
// inputs; the outputs must be equal bit for bit in f64 and within a matmul's tolerance in f32 (the
// fast side sums in f32 through the GEMM, the reference in f64), and the fast side must not have
// used the reference.
// `fast` (when given) gets the fast side's output.
void expect_conv_matches_reference(const ConvCase& c, DType d, b::ConvRole role, std::mt19937_64& rng, int threads = 2,
                                   std::vector<double>* fast = nullptr) {
  SCOPED_TRACE(c.describe() + " role " + std::to_string(static_cast<int>(role)) + " " + d.name());
  Session s(threads);
  // `magnitude` runs the op on the inputs' absolute values: each output's sum of |terms|, which
  // bounds the f32 sums' rounding error.
  CpuDevice ref(CpuDeviceOptions{.threads = 1}), magnitude(CpuDeviceOptions{.threads = 1});
  std::normal_distribution<double> normal(0.0, 1.0);
  auto input = [&](const Shape& shape) {
    std::vector<double> v(ir::num_elements(shape));
    for (double& e : v) e = normal(rng);
    const TensorIr t = s.input(shape, v, d);
    KILN_EXPECT_OK(ref.upload_f64(t.id, t.shape, d, v));
    for (double& e : v) e = std::fabs(e);
    KILN_EXPECT_OK(magnitude.upload_f64(t.id, t.shape, d, v));
    return t;
  };
  const TensorIr x = input(c.x), w = input(c.w);
  const OpKind kind = conv_kind(c.rank, c.transposed, role);
  Result<Operation> op = make_error(ErrorCode::Internal, "unset");
  if (role == b::ConvRole::Forward) {
    const TensorIr bias = input(Shape{c.transposed ? c.w[1] * c.options.groups : c.w[0]});
    op = c.transposed ? b::conv_transpose(kind, x, w, bias, c.options, s.id())
                      : b::conv(kind, x, w, bias, c.options, s.id());
  } else {
    Result<Operation> fwd = c.transposed ? b::conv_transpose(conv_kind(c.rank, true, b::ConvRole::Forward), x, w,
                                                             std::nullopt, c.options, TensorId{999999})
                                         : b::conv(conv_kind(c.rank, false, b::ConvRole::Forward), x, w, std::nullopt,
                                                   c.options, TensorId{999999});
    ASSERT_TRUE(fwd.ok()) << fwd.error().to_string();
    const TensorIr g = input(fwd->outputs()[0].shape);
    if (role == b::ConvRole::BiasBackward)
      op = b::conv_bias_backward(kind, x, input(Shape{g.shape[1]}), g, s.id());
    else if (c.transposed)
      op = b::conv_transpose_backward(kind, x, w, g, c.options, s.id());
    else
      op = b::conv_backward(kind, x, w, g, c.options, s.id());
  }
  ASSERT_TRUE(op.ok()) << op.error().to_string();
  KILN_EXPECT_OK(ref.reference().execute(*op, ref.handles()));
  KILN_EXPECT_OK(magnitude.reference().execute(*op, magnitude.handles()));
  const TensorIr out = s.submit(*op);
  const std::vector<double> got = s.read(out);
  auto want = ref.download_f64(out.id);
  auto terms = magnitude.download_f64(out.id);
  ASSERT_TRUE(want.ok() && terms.ok());
  ASSERT_EQ(got.size(), want->size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    // 1e-4 of Σ|terms|: far above f32's rounding of these sums (a few hundred terms), far below
    // one misplaced term (at least Σ|terms| / terms).
    if (d == dt::f32)
      ASSERT_NEAR(got[i], (*want)[i], 1e-4 * (*terms)[i] + 1e-30) << "element " << i;
    else
      ASSERT_EQ(std::bit_cast<std::uint64_t>(got[i]), std::bit_cast<std::uint64_t>((*want)[i]))
          << "element " << i << ": " << got[i] << " against " << (*want)[i];
  }
  EXPECT_EQ(s.device.stats().reference_ops, 0u);
  EXPECT_EQ(s.device.stats().fast_ops, 1u);
  if (fast != nullptr) *fast = got;
}

// Every convolution kind of every rank, transposed or not, random shapes, strides, paddings,
// dilations and groups, in f32 and f64: the fast kernels give the reference's bits in f64 and its
// numbers within tolerance in f32.
TEST(FastConv, EveryKindMatchesTheReference) {
  std::mt19937_64 rng(20261206);
  for (int round = 0; round < 6; ++round)
    for (std::size_t rank = 1; rank <= 3; ++rank)
      for (bool transposed : {false, true})
        for (DType d : {dt::f32, dt::f64}) {
          const ConvCase c = random_conv(rng, rank, transposed);
          for (b::ConvRole role :
               {b::ConvRole::Forward, b::ConvRole::XBackward, b::ConvRole::WeightBackward, b::ConvRole::BiasBackward}) {
            if (transposed && role == b::ConvRole::XBackward) continue;  // not a kind (its gradient is a conv)
            expect_conv_matches_reference(c, d, role, rng);
          }
        }
}

// Every role of `c` in f32: the reference's numbers within the f32 bound on one thread and on two,
// and the same bits on both (inputs drawn from `seed`).
void expect_f32_conv_same_on_any_thread_count(const ConvCase& c, std::uint64_t seed) {
  for (b::ConvRole role : {b::ConvRole::Forward, b::ConvRole::XBackward, b::ConvRole::WeightBackward}) {
    std::vector<double> one, two;
    std::mt19937_64 rng_one(seed), rng_two(seed);
    expect_conv_matches_reference(c, dt::f32, role, rng_one, 1, &one);
    expect_conv_matches_reference(c, dt::f32, role, rng_two, 2, &two);
    ASSERT_FALSE(one.empty());
    ASSERT_EQ(one.size(), two.size());
    for (std::size_t i = 0; i < one.size(); ++i)
      ASSERT_EQ(std::bit_cast<std::uint64_t>(one[i]), std::bit_cast<std::uint64_t>(two[i]))
          << c.describe() << " role " << static_cast<int>(role) << " element " << i;
  }
}

// f32 shapes past the GEMM's blocks (Kc = 288 columns over its KC depth, 160 output channels per
// group over its MC rows), two groups, and a batch in several weight-gradient chunks; each role
// gives the same bits on one thread as on two.
TEST(FastConv, LargeF32ConvolutionsMatchTheReferenceOnAnyThreadCount) {
  expect_f32_conv_same_on_any_thread_count(
      ConvCase{2, false, b::ConvOptions{{1, 1}, {1, 1}, {}, {1, 1}, 2}, Shape{5, 64, 7, 7}, Shape{320, 32, 3, 3}}, 7);
}

// Enough output positions for every chunked path of the f32 kernels: the forward's GEMM packs its
// B panels from x in several L2-sized passes (900 and 1024 positions against 448 per pass for
// Kc = 288), with a partial last panel (900 = 56 x 16 + 4); the X gradient's columns and the
// weight gradient's im2col run over the positions in several passes too, with stride 2 reading
// x's rows with a gap.
TEST(FastConv, F32ConvolutionsOverManyPositionsMatchTheReference) {
  const ConvCase cases[] = {
      {2, false, b::ConvOptions{{1, 1}, {1, 1}, {}, {1, 1}, 1}, Shape{3, 32, 30, 30}, Shape{20, 32, 3, 3}},
      {2, false, b::ConvOptions{{2, 2}, {1, 1}, {}, {1, 1}, 1}, Shape{2, 32, 64, 64}, Shape{8, 32, 3, 3}},
  };
  for (const ConvCase& c : cases) expect_f32_conv_same_on_any_thread_count(c, 11);
}

// ---- Pools on the fast path (cpu/src/fast_pool.cc)

// A fast side and a reference side fed the same inputs; `check` runs one op on both and compares
// every output bit for bit (indices included), the fast side without the reference.
struct AgainstReference {
  Session s{2};
  CpuDevice ref{CpuDeviceOptions{.threads = 1}};
  std::mt19937_64 rng{20261206};
  std::uint64_t fast_before = 0;

  TensorIr upload(const Shape& shape, DType d, const std::vector<double>& v) {
    const TensorIr t = s.input(shape, v, d);
    KILN_EXPECT_OK(ref.upload_f64(t.id, t.shape, d, v));
    return t;
  }
  // Values with ties (one decimal) and, when asked, a NaN now and then.
  TensorIr values(const Shape& shape, DType d, bool nans) {
    std::normal_distribution<double> normal(0.0, 1.0);
    std::uniform_int_distribution<int> one_in(0, 40);
    std::vector<double> v(ir::num_elements(shape));
    for (double& e : v) e = nans && one_in(rng) == 0 ? std::nan("") : std::round(normal(rng) * 10) / 10;
    return upload(shape, d, v);
  }
  // Indices within each plane of x (duplicates accumulate), −1 (an empty window) now and then
  // when `with_empty`.
  TensorIr indices(const Shape& shape, DType d, std::uint64_t in_plane, bool with_empty = true) {
    std::uniform_int_distribution<std::int64_t> pick(with_empty ? -1 : 0, static_cast<std::int64_t>(in_plane) - 1);
    std::vector<double> v(ir::num_elements(shape));
    for (double& e : v) e = static_cast<double>(pick(rng));
    return upload(shape, d, v);
  }
  // `fused`: the op runs as a fused launch (the fusion search takes it, as an indexed read), not
  // as a module op's fast kernel (fast_ops); either way by one launch and never the reference.
  // `tolerance` 0: the reference's bits; otherwise |got - want| <= tolerance * (1 + |want|), and
  // NaN where the reference has NaN.
  void check(const Result<Operation>& op, const std::string& what, bool fused = false, double tolerance = 0.0) {
    SCOPED_TRACE(what);
    const std::uint64_t launches_before = s.device.stats().fused_launches;
    ASSERT_TRUE(op.ok()) << op.error().to_string();
    KILN_EXPECT_OK(ref.reference().execute(*op, ref.handles()));
    (void)s.submit(*op);
    s.sync();
    for (const TensorIr& out : op->outputs()) {
      auto got = s.device.download_f64(out.id);
      auto want = ref.download_f64(out.id);
      ASSERT_TRUE(got.ok() && want.ok()) << out.to_string();
      ASSERT_EQ(got->size(), want->size());
      for (std::size_t i = 0; i < got->size(); ++i) {
        const double g = (*got)[i], w = (*want)[i];
        const bool same_bits = std::bit_cast<std::uint64_t>(g) == std::bit_cast<std::uint64_t>(w);
        const bool close = tolerance > 0.0 && std::isfinite(w) && std::abs(g - w) <= tolerance * (1.0 + std::abs(w));
        ASSERT_TRUE((std::isnan(g) && std::isnan(w)) || same_bits || close)
            << out.to_string() << " element " << i << ": " << g << " against " << w;
      }
    }
    EXPECT_EQ(s.device.stats().reference_ops, 0u);
    if (fused)
      EXPECT_EQ(s.device.stats().fused_launches, launches_before + 1);
    else
      EXPECT_EQ(s.device.stats().fast_ops, ++fast_before);
  }
};

// A random window of n spatial dims over an input that has outputs: kernel 1..3, stride 1..2,
// dilation 1..2 (max pools), padding up to kernel / 2, ceil mode or not.
struct PoolWindowCase {
  std::vector<std::uint64_t> kernel, stride, padding, dilation;
  bool ceil_mode = false, count_include_pad = false;
  Shape x;
};
PoolWindowCase random_window(std::mt19937_64& rng, std::size_t n, bool dilated, std::uint64_t max_in) {
  auto pick = [&](std::uint64_t lo, std::uint64_t hi) {
    return std::uniform_int_distribution<std::uint64_t>(lo, hi)(rng);
  };
  PoolWindowCase c;
  c.ceil_mode = pick(0, 1) == 1;
  c.count_include_pad = pick(0, 1) == 1;
  c.x = {pick(1, 2), pick(1, 3)};
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t k = pick(1, 3), d = dilated ? pick(1, 2) : 1, pad = pick(0, k / 2);
    const std::uint64_t span = (k - 1) * d + 1;
    c.kernel.push_back(k);
    c.stride.push_back(pick(1, 2));
    c.padding.push_back(pad);
    c.dilation.push_back(d);
    c.x.push_back(pick(span > 2 * pad ? span - 2 * pad : 1, std::max<std::uint64_t>(span, max_in)));
  }
  return c;
}

// Every max pool (1-d and 2-d, with i64 or i32 indices or none) and its backward, on random
// windows with ties and NaNs, in f32 and f64: the fast kernels give the reference's bits.
TEST(FastPool, MaxPoolsAndTheirBackwardsMatchTheReference) {
  AgainstReference h;
  for (int round = 0; round < 24; ++round)
    for (std::size_t n : {std::size_t{1}, std::size_t{2}})
      for (DType d : {dt::f32, dt::f64}) {
        // Up to 9 wide: windows inside x whole (the kernel's interior path) and at its borders.
        const PoolWindowCase c = random_window(h.rng, n, true, 9);
        const DType index_dtype = round % 2 == 0 ? dt::i64 : dt::i32;
        const TensorIr x = h.values(c.x, d, true);
        std::uint64_t in_plane = 1;
        for (std::size_t i = 2; i < c.x.size(); ++i) in_plane *= c.x[i];
        const std::string what =
            fmt::format("max pool {}d x {} round {} {}", n, ir::shape_to_string(c.x), round, d.name());
        Result<Operation> plain = make_error(ErrorCode::Internal, "unset");
        Result<Operation> with = plain;
        const TensorId o1 = h.s.id(), o2 = h.s.id(), o3 = h.s.id();
        if (n == 1) {
          const b::MaxPool1dOptions o{c.kernel[0], c.stride[0], c.padding[0], c.dilation[0], c.ceil_mode};
          plain = b::max_pool1d(x, o, o1);
          with = b::max_pool1d_with_indices(x, o, index_dtype, o2, o3);
        } else {
          const b::MaxPool2dOptions o{{c.kernel[0], c.kernel[1]},
                                      {c.stride[0], c.stride[1]},
                                      {c.padding[0], c.padding[1]},
                                      {c.dilation[0], c.dilation[1]},
                                      c.ceil_mode};
          plain = b::max_pool2d(x, o, o1);
          with = b::max_pool2d_with_indices(x, o, index_dtype, o2, o3);
        }
        h.check(plain, what);
        h.check(with, what + " with indices");
        ASSERT_TRUE(with.ok());
        const Shape pooled = with->outputs()[0].shape;
        const TensorIr grad = h.values(pooled, d, false), idx = h.indices(pooled, index_dtype, in_plane);
        if (n == 1)
          h.check(b::max_pool1d_with_indices_backward(
                      x, grad, idx, {c.kernel[0], c.stride[0], c.padding[0], c.dilation[0], c.ceil_mode}, h.s.id()),
                  what + " backward");
        else
          h.check(b::max_pool2d_with_indices_backward(x, grad, idx,
                                                      {{c.kernel[0], c.kernel[1]},
                                                       {c.stride[0], c.stride[1]},
                                                       {c.padding[0], c.padding[1]},
                                                       {c.dilation[0], c.dilation[1]},
                                                       c.ceil_mode},
                                                      h.s.id()),
                  what + " backward");
      }
}

// Average pools (both divisor rules) and adaptive average pools of every rank, and their
// backwards.
TEST(FastPool, AveragePoolsAndTheirBackwardsMatchTheReference) {
  AgainstReference h;
  for (int round = 0; round < 8; ++round)
    for (std::size_t n : {std::size_t{1}, std::size_t{2}})
      for (DType d : {dt::f32, dt::f64}) {
        const PoolWindowCase c = random_window(h.rng, n, false, 7);
        const TensorIr x = h.values(c.x, d, false);
        const std::string what =
            fmt::format("avg pool {}d x {} round {} {}", n, ir::shape_to_string(c.x), round, d.name());
        Result<Operation> fwd = make_error(ErrorCode::Internal, "unset");
        if (n == 1) {
          const b::AvgPool1dOptions o{c.kernel[0], c.stride[0], c.padding[0], c.count_include_pad, c.ceil_mode};
          fwd = b::avg_pool1d(x, o, h.s.id());
          h.check(fwd, what);
          ASSERT_TRUE(fwd.ok());
          h.check(b::avg_pool1d_backward(x, h.values(fwd->outputs()[0].shape, d, false), o, h.s.id()),
                  what + " backward");
        } else {
          const b::AvgPool2dOptions o{{c.kernel[0], c.kernel[1]},
                                      {c.stride[0], c.stride[1]},
                                      {c.padding[0], c.padding[1]},
                                      c.count_include_pad,
                                      c.ceil_mode};
          fwd = b::avg_pool2d(x, o, h.s.id());
          h.check(fwd, what);
          ASSERT_TRUE(fwd.ok());
          h.check(b::avg_pool2d_backward(x, h.values(fwd->outputs()[0].shape, d, false), o, h.s.id()),
                  what + " backward");
        }
      }
  for (int round = 0; round < 4; ++round)
    for (std::size_t n = 1; n <= 3; ++n)
      for (DType d : {dt::f32, dt::f64}) {
        std::uniform_int_distribution<std::uint64_t> size(1, 6);
        Shape xs{size(h.rng) % 2 + 1, size(h.rng) % 3 + 1};
        std::array<std::uint64_t, 3> out{};
        for (std::size_t i = 0; i < n; ++i) {
          xs.push_back(size(h.rng));
          out[i] = size(h.rng);  // smaller or larger than x's dim: windows overlap or repeat
        }
        const TensorIr x = h.values(xs, d, false);
        const std::string what =
            fmt::format("adaptive {}d x {} round {} {}", n, ir::shape_to_string(xs), round, d.name());
        const Result<Operation> fwd = n == 1   ? b::adaptive_avg_pool1d(x, out[0], h.s.id())
                                      : n == 2 ? b::adaptive_avg_pool2d(x, {out[0], out[1]}, h.s.id())
                                               : b::adaptive_avg_pool3d(x, out, h.s.id());
        h.check(fwd, what);
        ASSERT_TRUE(fwd.ok());
        const TensorIr grad = h.values(fwd->outputs()[0].shape, d, false);
        h.check(n == 1   ? b::adaptive_avg_pool1d_backward(x, grad, h.s.id())
                : n == 2 ? b::adaptive_avg_pool2d_backward(x, grad, h.s.id())
                         : b::adaptive_avg_pool3d_backward(x, grad, h.s.id()),
                what + " backward");
      }
}

// Large enough to split the planes over the device's threads (a CNN's 3×3 stride-2 pool).
TEST(FastPool, ThreadedPlanesMatchTheReference) {
  AgainstReference h;
  const b::MaxPool2dOptions o{{3, 3}, {2, 2}, {1, 1}, {1, 1}, false};
  const TensorIr x = h.values({2, 16, 48, 48}, dt::f32, false);
  const Result<Operation> fwd = b::max_pool2d_with_indices(x, o, dt::i64, h.s.id(), h.s.id());
  h.check(fwd, "forward");
  ASSERT_TRUE(fwd.ok());
  const TensorIr grad = h.values(fwd->outputs()[0].shape, dt::f32, false);
  h.check(
      b::max_pool2d_with_indices_backward(x, grad, h.indices(fwd->outputs()[0].shape, dt::i64, 48 * 48), o, h.s.id()),
      "backward");
  const b::AvgPool2dOptions a{{3, 3}, {2, 2}, {1, 1}, false, true};
  h.check(b::avg_pool2d(x, a, h.s.id()), "average");
}

// Indexed reads broadcast inside a fused program: a Select and a Cat whose results have a size-1
// last dim, added to a wider tensor, read the same element along each row of the block.
TEST(FastIndexedReads, BroadcastIndexedReadsInAFusedProgram) {
  Session s;
  const std::vector<double> xv{1.5, -2, 3.25, 4}, yv = iota(2 * 5, 3, -1), cv{7, -8};
  const TensorIr x = s.input({4, 1}, xv), y = s.input({2, 5}, yv), c = s.input({1, 1}, {0.5});
  const TensorIr idx = s.input({2}, {3, 1}, dt::i64);
  const TensorIr sel = s.submit(ok(b::select(Family::BaseFloat, OpKind::Base_Select, x, 0, idx, s.id())));
  const TensorIr cat_in = s.input({1, 1}, {cv[0]});
  const std::vector<TensorIr> parts{cat_in, c};
  const TensorIr cat = s.submit(ok(b::cat(Family::BaseFloat, OpKind::Base_Cat, parts, 0, s.id())));
  const TensorIr sum =
      s.submit(ok(b::binary(Family::NumericFloat, OpKind::Numeric_Add, use(sel, TensorStatus::ReadWrite), y, s.id())));
  const TensorIr out =
      s.submit(ok(b::binary(Family::NumericFloat, OpKind::Numeric_Mul, use(sum, TensorStatus::ReadWrite),
                            use(cat, TensorStatus::ReadWrite), s.id())));
  const std::vector<double> got = s.read(out);
  ASSERT_EQ(got.size(), 10u);
  const double selected[2] = {xv[3], xv[1]}, joined[2] = {cv[0], 0.5};
  for (std::size_t i = 0; i < 2; ++i)
    for (std::size_t j = 0; j < 5; ++j)
      ASSERT_EQ(got[i * 5 + j], mul_f32(add_f32(static_cast<float>(selected[i]), static_cast<float>(yv[i * 5 + j])),
                                        static_cast<float>(joined[i])))
          << i << "," << j;
  EXPECT_EQ(s.device.stats().reference_ops, 0u);
}

// ---- Indexed reads (Cat, Select, Gather) as single ops on the elementwise kernels

// Cat of two and three inputs along the first, a middle and the last dim, Select along each dim,
// Gather along each dim, in f32 and i64; rows longer than a chunk (reads that start mid-row and
// mid-input): the reference's values exactly (copies).
TEST(FastIndexedReads, CatSelectAndGatherMatchTheReference) {
  AgainstReference h;
  std::uniform_int_distribution<int> pick(0, 1 << 20);
  for (DType d : {dt::f32, dt::i64}) {
    const Family family = d == dt::f32 ? Family::BaseFloat : Family::BaseInt;
    for (const Shape& shape : {Shape{5, 4, 3}, Shape{3, 700}, Shape{2, 3, 4, 5}}) {
      const std::size_t r = shape.size();
      for (std::size_t dim = 0; dim < r; ++dim) {
        const std::string what = fmt::format("{} {} dim {}", d.name(), ir::shape_to_string(shape), dim);
        // Cat: inputs of 1, 2 and (the shape's) sizes along `dim`.
        std::vector<TensorIr> parts;
        for (std::uint64_t size : {std::uint64_t{1}, std::uint64_t{2}, shape[dim]}) {
          Shape part = shape;
          part[dim] = size;
          parts.push_back(h.values(part, d, false));
          h.check(b::cat(family, OpKind::Base_Cat, parts, dim, h.s.id()),
                  what + " cat of " + std::to_string(parts.size()), true);
        }
        // Select: indices into `dim`, repeated and out of order.
        std::vector<double> picks(4);
        for (double& v : picks) v = static_cast<double>(pick(h.rng) % shape[dim]);
        const TensorIr sel = h.upload(Shape{picks.size()}, dt::i64, picks);
        const TensorIr x = h.values(shape, d, false);
        h.check(b::select(family, OpKind::Base_Select, x, dim, sel, h.s.id()), what + " select", true);
        // Gather: an index per output element.
        std::vector<double> gathered(ir::num_elements(shape));
        for (double& v : gathered) v = static_cast<double>(pick(h.rng) % shape[dim]);
        const TensorIr gi = h.upload(shape, dt::i64, gathered);
        h.check(b::gather(family, OpKind::Base_Gather, x, dim, gi, h.s.id()), what + " gather", true);
      }
    }
  }
}

// An index outside its plane stays on the reference executor, which reports the error; the fast
// path has changed nothing.
TEST(FastPool, BadIndicesGoToTheReference) {
  Session s;
  const b::MaxPool2dOptions o{{2, 2}, {2, 2}, {0, 0}, {1, 1}, false};
  const TensorIr x = s.input({1, 1, 4, 4}, iota(16), dt::f32);
  const TensorIr grad = s.input({1, 1, 2, 2}, {1, 2, 3, 4}, dt::f32);
  const TensorIr idx = s.input({1, 1, 2, 2}, {0, 5, 16, 3}, dt::i64);  // 16 is past the 4×4 plane
  const TensorIr out = s.submit(ok(b::max_pool2d_with_indices_backward(x, grad, idx, o, s.id())));
  s.sync();
  EXPECT_EQ(s.device.stats().reference_ops, 1u);
  EXPECT_EQ(s.device.stats().fast_ops, 0u);
  const auto* err = s.device.handles().error_of(out.id);
  ASSERT_NE(err, nullptr);
  EXPECT_THAT(err->root->to_string(), ::testing::HasSubstr("16"));
}

// ---- Layer norm, batch norm and the embedding on the fast path (cpu/src/fast_module.cc)

// Layer norm with and without beta, and with its row statistics, over rows of random widths (one
// wide enough to split the rows over the device's threads, widths below, at and off the eight
// sum lanes), in f32 and f64: within 8 ulps of the reference (its row sums run in another order).
TEST(FastModule, LayerNormMatchesTheReference) {
  AgainstReference h;
  const Shape shapes[] = {{1}, {3, 1}, {5, 7}, {2, 3, 33}, {4, 64}, {512, 256}};
  for (const Shape& xs : shapes)
    for (DType d : {dt::f32, dt::f64})
      for (bool with_beta : {false, true}) {
        const TensorIr x = h.values(xs, d, false), gamma = h.values({xs.back()}, d, false);
        std::optional<TensorIr> beta;
        if (with_beta) beta = h.values({xs.back()}, d, false);
        const std::string what = fmt::format("layer norm {} {} beta {}", ir::shape_to_string(xs), d.name(), with_beta);
        // The row sums in another order than the reference's (docs/decisions.md): a few ulps.
        const double tolerance = 8 * (d == dt::f32 ? 0x1p-23 : 0x1p-52);
        h.check(b::layer_norm(x, gamma, beta, 1e-5, h.s.id()), what, false, tolerance);
        h.check(b::layer_norm_with_stats(x, gamma, beta, 1e-5, h.s.id(), h.s.id(), h.s.id()), what + " with stats",
                false, tolerance);
      }
}

// Batch norm (the inference form) over [N, C, ...] of ranks 2 to 5 (one large enough to split its
// rows over the threads), f32 and f64, positive variances (and one of zero with epsilon 0: 0 / 0
// is NaN on both sides): the reference's bits.
TEST(FastModule, BatchNormMatchesTheReference) {
  AgainstReference h;
  const Shape shapes[] = {{1, 1}, {4, 3}, {2, 3, 5}, {2, 4, 3, 7}, {1, 2, 2, 3, 3}, {8, 16, 32, 32}};
  for (const Shape& xs : shapes)
    for (DType d : {dt::f32, dt::f64})
      for (double epsilon : {1e-5, 0.0}) {
        const std::uint64_t c = xs[1];
        std::vector<double> variance(c);
        for (std::uint64_t i = 0; i < c; ++i) variance[i] = i == 0 && epsilon == 0 ? 0.0 : 0.25 + 0.5 * i;
        const TensorIr x = h.values(xs, d, true), gamma = h.values({c}, d, false), beta = h.values({c}, d, false);
        const TensorIr mean = h.values({c}, d, false), var = h.upload({c}, d, variance);
        h.check(b::batch_norm(x, gamma, beta, mean, var, epsilon, h.s.id()),
                fmt::format("batch norm {} {} epsilon {}", ir::shape_to_string(xs), d.name(), epsilon));
      }
}

// f16 and bf16 layers run on the f32 kernels (fast_widen.h), never on the reference (check()
// asserts it): within one unit in the last place of the half dtype of the reference (which
// computes in f64 and rounds once; the f32 kernels' rounding may tip a result to the
// neighbouring half), max pools exactly, their indices included.
TEST(FastHalf, HalfLayersRunThroughF32) {
  AgainstReference h;
  for (DType d : {dt::f16, dt::bf16}) {
    const double ulp = d == dt::f16 ? 0x1p-10 : 0x1p-7;
    SCOPED_TRACE(d.name());
    const TensorIr x = h.values({2, 3, 9, 9}, d, false), w = h.values({4, 3, 3, 3}, d, false);
    const TensorIr bias = h.values({4}, d, false);
    const b::ConvOptions co{{2, 2}, {1, 1}, {}, {1, 1}, 1};
    Result<Operation> conv = b::conv(OpKind::Module_Conv2d, x, w, bias, co, h.s.id());
    h.check(conv, "conv2d", false, ulp);
    ASSERT_TRUE(conv.ok());
    const TensorIr g = h.values(conv->outputs()[0].shape, d, false);
    h.check(b::conv_backward(OpKind::Module_Conv2dXBackward, x, w, g, co, h.s.id()), "conv2d x grad", false, ulp);
    h.check(b::conv_backward(OpKind::Module_Conv2dWeightBackward, x, w, g, co, h.s.id()), "conv2d weight grad", false,
            ulp);
    h.check(b::conv_bias_backward(OpKind::Module_Conv2dBiasBackward, x, bias, g, h.s.id()), "conv2d bias grad", false,
            ulp);
    const b::MaxPool2dOptions mo{{3, 3}, {2, 2}, {1, 1}, {1, 1}, false};
    h.check(b::max_pool2d_with_indices(h.values({2, 3, 9, 9}, d, true), mo, dt::i64, h.s.id(), h.s.id()), "max pool");
    const b::AvgPool2dOptions ao{{2, 2}, {2, 2}, {0, 0}, true, false};
    h.check(b::avg_pool2d(x, ao, h.s.id()), "avg pool", false, ulp);
    const TensorIr rows = h.values({6, 40}, d, false), gamma = h.values({40}, d, false),
                   beta = h.values({40}, d, false);
    h.check(b::layer_norm(rows, gamma, beta, 1e-5, h.s.id()), "layer norm", false, ulp);
    h.check(b::layer_norm_with_stats(rows, gamma, beta, 1e-5, h.s.id(), h.s.id(), h.s.id()), "layer norm with stats",
            false, ulp);
    const std::vector<double> variance{0.5, 1.25, 2.0};
    h.check(b::batch_norm(x, h.values({3}, d, false), h.values({3}, d, false), h.values({3}, d, false),
                          h.upload({3}, d, variance), 1e-5, h.s.id()),
            "batch norm", false, ulp);
    const TensorIr idx = h.indices({2, 5}, dt::i64, 7, false);
    h.check(b::embedding_backward(h.values({7, 4}, d, false), h.values({2, 5, 4}, d, false), idx, h.s.id()),
            "embedding backward", false, ulp);
  }
}

// The embedding copies rows of any float dtype; its gradient sums repeated indices in token order
// (a large vocabulary splits its rows over the threads; rows no token reads are zeros).
TEST(FastModule, EmbeddingAndItsGradientMatchTheReference) {
  AgainstReference h;
  struct Case {
    std::uint64_t vocab, width, batch, seq, rows_used;  // indices drawn from the first rows_used rows
  };
  const Case cases[] = {
      {5, 3, 2, 4, 3}, {1, 1, 1, 1, 1}, {17, 8, 3, 9, 3}, {64, 512, 4, 64, 3}, {3000, 64, 4, 256, 3000}};
  for (const Case& c : cases)
    for (DType index_dtype : {dt::i64, dt::i32}) {
      // Mostly from a few rows, so most repeat; the large vocabulary has repeats and unread rows.
      const TensorIr idx = h.indices({c.batch, c.seq}, index_dtype, c.rows_used, false);
      for (DType d : {dt::f32, dt::f64, dt::f16, dt::bf16}) {
        const std::string what = fmt::format("embedding V {} E {} [{}, {}] {} {}", c.vocab, c.width, c.batch, c.seq,
                                             d.name(), index_dtype.name());
        const TensorIr weights =
            d == dt::i64 ? h.indices({c.vocab, c.width}, d, 1000, false) : h.values({c.vocab, c.width}, d, false);
        h.check(b::embedding(weights, idx, h.s.id()), what);
        if (!(d == dt::f32) && !(d == dt::f64)) continue;
        const TensorIr grad = h.values({c.batch, c.seq, c.width}, d, false);
        h.check(b::embedding_backward(weights, grad, idx, h.s.id()), what + " backward");
      }
    }
  // An index past the vocabulary: the reference runs both and reports it.
  Session s;
  const TensorIr weights = s.input({5, 2}, iota(10), dt::f32);
  const TensorIr idx = s.input({1, 3}, {0, 5, 1}, dt::i64);
  const TensorIr grad = s.input({1, 3, 2}, iota(6), dt::f32);
  const TensorIr y = s.submit(ok(b::embedding(weights, idx, s.id())));
  const TensorIr gw = s.submit(ok(b::embedding_backward(weights, grad, idx, s.id())));
  s.sync();
  EXPECT_EQ(s.device.stats().reference_ops, 2u);
  EXPECT_EQ(s.device.stats().fast_ops, 0u);
  for (const TensorIr& t : {y, gw}) {
    const auto* err = s.device.handles().error_of(t.id);
    ASSERT_NE(err, nullptr);
    EXPECT_THAT(err->root->to_string(), ::testing::HasSubstr("5"));
  }
}

// ---- Sorting on the fast path (cpu/src/fast_sort.cc)

// Every sorting kind, along every axis, ascending and descending, k from 1 to the axis' size,
// over values with ties, ±0 and NaNs (floats) or negative numbers (integers), indices in i64 and
// i32: the reference's values and indices exactly (its stable order, NaN largest, ±0 equal).
TEST(FastSort, EveryKindMatchesTheReference) {
  AgainstReference h;
  const Shape shapes[] = {{7}, {3, 9}, {4, 5, 6}, {2, 300}};
  for (const Shape& xs : shapes)
    for (DType d : {dt::f32, dt::f64, dt::i32, dt::i64}) {
      const bool is_float = d == dt::f32 || d == dt::f64;
      const Family fam = is_float ? Family::NumericFloat : Family::NumericInt;
      const TensorIr x = is_float ? h.values(xs, d, true) : h.indices(xs, d, 5);
      for (std::uint64_t axis = 0; axis < xs.size(); ++axis) {
        const std::uint64_t n = xs[axis];
        const std::string what = fmt::format("{} {} axis {}", ir::shape_to_string(xs), d.name(), axis);
        for (bool descending : {false, true}) {
          const std::string w = what + (descending ? " descending" : " ascending");
          h.check(b::sort(fam, OpKind::Numeric_Sort, x, axis, descending, h.s.id()), w + " sort");
          for (DType index : {dt::i64, dt::i32}) {
            h.check(b::sort_arg(fam, OpKind::Numeric_ArgSort, x, axis, descending, index, h.s.id()), w + " argsort");
            h.check(b::sort_with_indices(fam, OpKind::Numeric_SortWithIndices, x, axis, descending, index, h.s.id(),
                                         h.s.id()),
                    w + " sort with indices");
          }
        }
        for (std::uint64_t k : {std::uint64_t{1}, n / 2, n}) {
          const std::string w = what + " k " + std::to_string(k);
          h.check(b::reduce_dim(fam, OpKind::Numeric_TopK, x, axis, k, h.s.id()), w + " topk");
          h.check(b::reduce_dim_arg(fam, OpKind::Numeric_ArgTopK, x, axis, k, dt::i64, h.s.id()), w + " argtopk");
          h.check(b::topk_with_indices(fam, OpKind::Numeric_TopKWithIndices, x, axis, k, dt::i32, h.s.id(), h.s.id()),
                  w + " topk with indices");
        }
      }
    }
}

// Lines split over the device's threads (64 lines of 2048: 4 per task).
TEST(FastSort, LinesOverThreadsMatchTheReference) {
  AgainstReference h;
  const TensorIr x = h.values({64, 2048}, dt::f32, true);
  h.check(b::sort_with_indices(Family::NumericFloat, OpKind::Numeric_SortWithIndices, x, 1, true, dt::i64, h.s.id(),
                               h.s.id()),
          "sort with indices");
  h.check(b::topk_with_indices(Family::NumericFloat, OpKind::Numeric_TopKWithIndices, x, 1, 10, dt::i64, h.s.id(),
                               h.s.id()),
          "topk with indices");
}

// Index dtypes other than i32 / i64 (an i16 that holds the axis) and bool values stay on the reference.
TEST(FastSort, OtherDtypesGoToTheReference) {
  Session s;
  const TensorIr x = s.input({2, 5}, {3, 1, 2, 2, 0, 9, 8, 7, 7, 6}, dt::f32);
  const TensorIr idx =
      s.submit(ok(b::sort_arg(Family::NumericFloat, OpKind::Numeric_ArgSort, x, 1, false, dt::i16, s.id())));
  EXPECT_EQ(s.read(idx), (std::vector<double>{4, 1, 2, 3, 0, 4, 2, 3, 1, 0}));  // stable: equal 2s and 7s in order
  EXPECT_EQ(s.device.stats().reference_ops, 1u);
  EXPECT_EQ(s.device.stats().fast_ops, 0u);
}

// ---- Layout ops on the fast path (cpu/src/fast_layout.cc)

Family base_family(DType d) {
  return d.is_float() ? Family::BaseFloat : d.is_bool() ? Family::BaseBool : Family::BaseInt;
}

// Random slices (clamped and negative bounds, steps of either sign, empty ranges), slice-assigns,
// permutations, expansions and flips of every element size, against the reference.
TEST(FastLayout, StridedCopiesMatchTheReference) {
  AgainstReference h;
  auto pick = [&](std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(h.rng);
  };
  auto tensor = [&](const Shape& shape, DType d) {
    std::vector<double> v(ir::num_elements(shape));
    for (double& e : v)
      e = d.is_bool() ? static_cast<double>(pick(0, 1)) : static_cast<double>(pick(d.is_uint() ? 0 : -50, 50));
    return h.upload(shape, d, v);
  };
  for (int round = 0; round < 12; ++round)
    for (DType d : {dt::f32, dt::f64, dt::f16, dt::i64, dt::i32, dt::u8, dt::boolean}) {
      Shape xs;
      const auto rank = static_cast<std::size_t>(pick(0, 4));
      for (std::size_t i = 0; i < rank; ++i) xs.push_back(static_cast<std::uint64_t>(pick(1, 5)));
      const TensorIr x = tensor(xs, d);
      const std::string what = fmt::format("round {} {} x {}", round, d.name(), ir::shape_to_string(xs));
      const Family f = base_family(d);
      if (rank > 0) {
        std::vector<ir::Slice> ranges;
        for (std::size_t i = 0; i < static_cast<std::size_t>(pick(1, static_cast<std::int64_t>(rank))); ++i) {
          ir::Slice s;
          s.start = pick(-6, 6);
          if (pick(0, 3) != 0) s.end = pick(-6, 6);
          s.step = pick(1, 3) * (pick(0, 2) == 0 ? -1 : 1);
          ranges.push_back(s);
        }
        const Result<Operation> sl = b::slice(f, OpKind::Base_Slice, x, ranges, h.s.id());
        h.check(sl, what + " slice");
        ASSERT_TRUE(sl.ok());
        const TensorIr value = tensor(sl->outputs()[0].shape, d);
        h.check(b::slice_assign(f, OpKind::Base_SliceAssign, x, ranges, value, h.s.id()), what + " slice_assign");
      }
      std::vector<std::uint64_t> axes(rank);
      for (std::size_t i = 0; i < rank; ++i) axes[i] = i;
      std::shuffle(axes.begin(), axes.end(), h.rng);
      h.check(b::permute(f, OpKind::Base_Permute, x, axes, h.s.id()), what + " permute");
      std::vector<std::uint64_t> flips;
      for (std::size_t i = 0; i < rank; ++i)
        if (pick(0, 1) == 1) flips.push_back(i);
      h.check(b::flip(f, OpKind::Base_Flip, x, flips, h.s.id()), what + " flip");
      // Expand: size-1 dims of x grow, one or two new leading dims.
      const Shape ones = [&] {
        Shape s;
        for (std::uint64_t n : xs) s.push_back(pick(0, 1) == 1 ? 1 : n);
        return s;
      }();
      const TensorIr small = tensor(ones, d);
      std::vector<std::int64_t> target;
      for (std::int64_t i = 0, lead = pick(0, 2); i < lead; ++i) target.push_back(pick(1, 3));
      for (std::size_t i = 0; i < rank; ++i)
        target.push_back(ones[i] == 1 ? pick(1, 4) : static_cast<std::int64_t>(ones[i]));
      h.check(b::shape_op(f, OpKind::Base_Expand, small, target, h.s.id()), what + " expand");
    }
}

// The approximations' documented bounds, sampled densely (the exhaustive sweep over every float
// is in docs/cpu-backend.md), and their special values.
double ulp_error(float got, double want) {
  if (std::isnan(want)) return std::isnan(got) ? 0 : 1e9;
  if (std::isinf(want)) return static_cast<double>(got) == want ? 0 : 1e9;
  const float w = static_cast<float>(want);
  const double ulp = std::fabs(static_cast<double>(std::nextafter(std::fabs(w), INFINITY)) - std::fabs(w));
  return std::fabs(static_cast<double>(got) - want) / (w == 0 ? std::ldexp(1.0, -149) : ulp);
}

TEST(FastMath, ApproximationsStayWithinTheirBounds) {
  struct Case {
    const char* name;
    float (*fast)(float);
    double (*exact)(double);
    float lo, hi, max_ulp;
  };
  const Case cases[] = {
      {"exp", fast::exp_f32, [](double v) { return std::exp(v); }, -104.f, 88.7f, 1.02f},
      {"log", fast::log_f32, [](double v) { return std::log(v); }, 0.f, 3.4e38f, 0.83f},
      {"log1p", fast::log1p_f32, [](double v) { return std::log1p(v); }, -0.99999f, 3.4e38f, 1.44f},
      {"tanh", fast::tanh_f32, [](double v) { return std::tanh(v); }, -20.f, 20.f, 1.34f},
  };
  for (const Case& c : cases) {
    double worst = 0;
    float at = 0;
    // Every 61st float bit pattern in [lo, hi] (both signs where the range has them).
    const std::uint32_t step = 997;
    for (int sign = 0; sign < 2; ++sign) {
      for (std::uint32_t bits = 0; bits < 0x7f800000u; bits += step) {
        float x = std::bit_cast<float>(bits | (sign ? 0x80000000u : 0u));
        if (!(x >= c.lo && x <= c.hi)) continue;
        const double e = ulp_error(c.fast(x), c.exact(static_cast<double>(x)));
        if (e > worst) worst = e, at = x;
      }
    }
    EXPECT_LE(worst, c.max_ulp) << c.name << " worst at " << at << " (" << worst << " ulp)";
  }
  EXPECT_EQ(fast::exp_f32(INFINITY), INFINITY);
  EXPECT_EQ(fast::exp_f32(-INFINITY), 0.0f);
  EXPECT_EQ(fast::exp_f32(89.0f), INFINITY);
  EXPECT_TRUE(std::isnan(fast::exp_f32(NAN)));
  EXPECT_EQ(fast::log_f32(0.0f), -INFINITY);
  EXPECT_EQ(fast::log_f32(-0.0f), -INFINITY);
  EXPECT_TRUE(std::isnan(fast::log_f32(-1.0f)));
  EXPECT_EQ(fast::log_f32(INFINITY), INFINITY);
  EXPECT_EQ(fast::log1p_f32(-1.0f), -INFINITY);
  EXPECT_TRUE(std::isnan(fast::log1p_f32(-2.0f)));
  EXPECT_EQ(fast::log1p_f32(INFINITY), INFINITY);
  EXPECT_EQ(fast::tanh_f32(INFINITY), 1.0f);
  EXPECT_EQ(fast::tanh_f32(-INFINITY), -1.0f);
  EXPECT_TRUE(std::signbit(fast::tanh_f32(-0.0f)));
  EXPECT_TRUE(std::isnan(fast::tanh_f32(NAN)));
}

#if defined(__AVX512F__)
// The 16-lane kernels are bit-identical to the scalar functions (exhaustively checked once,
// sampled here).
TEST(FastMath, Avx512FormsMatchTheScalarFunctions) {
  alignas(64) float in[16], e[16], t[16];
  for (std::uint64_t b = 0; b < 0x100000000ull; b += 16 * 4099) {
    for (int k = 0; k < 16; ++k)
      in[k] = std::bit_cast<float>(static_cast<std::uint32_t>(b + static_cast<std::uint64_t>(k) * 257));
    _mm512_store_ps(e, fast::exp16(_mm512_load_ps(in)));
    _mm512_store_ps(t, fast::tanh16(_mm512_load_ps(in)));
    for (int k = 0; k < 16; ++k) {
      const float x = in[k], ex = fast::exp_f32(x), tx = fast::tanh_f32(x);
      if (std::isnan(x)) continue;
      ASSERT_EQ(std::bit_cast<std::uint32_t>(e[k]), std::bit_cast<std::uint32_t>(ex)) << x;
      ASSERT_EQ(std::bit_cast<std::uint32_t>(t[k]), std::bit_cast<std::uint32_t>(tx)) << x;
    }
  }
}
#endif

TEST(FastMath, HalfConversionsMatchTheCodec) {
  for (std::uint32_t bits = 0; bits < 0xffffffffu - 9973; bits += 9973) {
    const float x = std::bit_cast<float>(bits);
    const std::uint16_t h = fast::f32_to_f16_bits(x), bh = fast::f32_to_bf16_bits(x);
    if (std::isnan(x)) {
      EXPECT_TRUE(std::isnan(f16_to_f32(h)));
      EXPECT_TRUE(std::isnan(bf16_to_f32(bh)));
      continue;
    }
    ASSERT_EQ(h, f16_from_f32(x)) << x;
    ASSERT_EQ(bh, bf16_from_f32(x)) << x;
  }
  for (std::uint32_t h = 0; h < 0x10000u; ++h) {
    const float a = fast::f16_bits_to_f32(static_cast<std::uint16_t>(h)),
                b16 = f16_to_f32(static_cast<std::uint16_t>(h));
    if (std::isnan(b16))
      ASSERT_TRUE(std::isnan(a));
    else
      ASSERT_EQ(std::bit_cast<std::uint32_t>(a), std::bit_cast<std::uint32_t>(b16)) << h;
  }
}

}  // namespace
}  // namespace kiln::cpu
