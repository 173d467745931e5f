// Row programs (kiln's row fuser, docs/fusion.md "The row fuser") through the client API on the
// fast CPU backend: softmax, log-softmax, cross-entropy (probabilities and class indices), and a
// layer norm and an RMS norm written out op by op, as the front end lowers them. Each runs on a
// device with the row fuser and on one with Burn's search only, with extreme rows (±inf, NaN,
// ±1e38, a row of one element, rows longer than a row group of the staged runner), and both are
// checked against a float64 host computation; the first must actually run Row programs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "jit_target.h"
#include "kiln/cpu/cpu_backend.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/session.h"
#include "kiln/testing/status.h"

namespace kiln::cpu {
namespace {

using ::kiln::testing::ok;
using runtime::Session;
using runtime::Tensor;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// One device over the fast CPU backend, with or without the row fuser.
struct Rig {
  CpuBackend* backend = nullptr;
  std::unique_ptr<runtime::Device> device;
  std::unique_ptr<Session> s;

  explicit Rig(bool row_fuser, CpuJitMode jit = CpuJitMode::Auto) {
    auto b = std::make_unique<CpuBackend>(CpuBackendOptions{.threads = 2, .jit = jit});
    backend = b.get();
    runtime::RuntimeOptions o;
    o.threads = 2;
    o.fusion = fusion::FusionConfig{};
    o.fusion->row_fuser = row_fuser;
    o.config_path = "";
    Result<std::unique_ptr<runtime::Device>> d = runtime::Device::create(std::move(b), std::move(o));
    KILN_EXPECT_OK(d);
    device = std::move(d).value();
    s = std::make_unique<Session>(*device);
  }
  ~Rig() { s.reset(); }
  std::uint64_t row_programs() const {
    return backend->stats().launches_by_kind[static_cast<std::size_t>(fusion::ProgramKind::Row)];
  }
};

// Rows of `n` f32 values: mostly random in [-8, 8), with the special rows a client can send
// (`huge`: also rows of ±1e38, whose squares overflow f32 where float64 does not).
std::vector<float> rows_of(std::size_t rows, std::size_t n, std::uint64_t seed, bool huge = true) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-8, 8);
  std::vector<float> v(rows * n);
  for (float& x : v) x = u(rng);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  auto row = [&](std::size_t r) { return v.begin() + static_cast<std::ptrdiff_t>(r * n); };
  if (rows > 1) row(1)[0] = inf;                                                             // +inf: NaN row
  if (rows > 2) row(2)[n / 2] = -inf;                                                        // -inf: a zero
  if (rows > 3) row(3)[n - 1] = nan;                                                         // NaN: NaN row
  if (rows > 4 && huge) std::fill(row(4), row(4) + static_cast<std::ptrdiff_t>(n), -1e38f);  // all equal
  if (rows > 5 && huge) row(5)[0] = 1e38f, row(5)[n - 1] = -1e38f;                           // a difference beyond f32
  if (rows > 6) std::fill(row(6), row(6) + static_cast<std::ptrdiff_t>(n), -inf);            // all -inf: NaN
  return v;
}

// The float64 computation a row program stands for, row by row over [rows, n].
using RowFn = std::function<void(const double* x, double* y, std::size_t n)>;
std::vector<double> host_rows(const std::vector<float>& x, std::size_t n, const RowFn& f) {
  std::vector<double> in(x.begin(), x.end()), out(x.size());
  for (std::size_t r = 0; r * n < x.size(); ++r) f(in.data() + r * n, out.data() + r * n, n);
  return out;
}

void softmax_row(const double* x, double* y, std::size_t n) {
  double m = -kInf, z = 0;
  for (std::size_t j = 0; j < n; ++j) m = std::isnan(x[j]) || std::isnan(m) ? kNaN : std::max(m, x[j]);
  for (std::size_t j = 0; j < n; ++j) z += std::exp(x[j] - m);
  for (std::size_t j = 0; j < n; ++j) y[j] = std::exp(x[j] - m) / z;
}
void log_softmax_row(const double* x, double* y, std::size_t n) {
  double m = -kInf, z = 0;
  for (std::size_t j = 0; j < n; ++j) m = std::isnan(x[j]) || std::isnan(m) ? kNaN : std::max(m, x[j]);
  for (std::size_t j = 0; j < n; ++j) z += std::exp(x[j] - m);
  for (std::size_t j = 0; j < n; ++j) y[j] = x[j] - m - std::log(z);
}

// NaN where the host has NaN, ±inf where it has them, else within `tol` of it (relative to
// max(1, |want|)): f32 arithmetic against float64.
void expect_rows_near(const std::vector<float>& got, const std::vector<double>& want, double tol,
                      const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  for (std::size_t i = 0; i < got.size() && bad < 5; ++i) {
    const double g = got[i], w = want[i];
    const bool same = std::isnan(w)   ? std::isnan(g)
                      : std::isinf(w) ? g == w
                                      : std::abs(g - w) <= tol * std::max(1.0, std::abs(w));
    if (!same) {
      ADD_FAILURE() << what << ": at " << i << " got " << g << ", want " << w;
      ++bad;
    }
  }
}

struct Case {
  std::size_t rows, n;
};
// A row of one, odd lengths, W4's rows, and rows longer than the staged runner's ~16K-element
// group (one row per group).
const Case kCases[] = {{1, 1}, {7, 1}, {9, 37}, {64, 1024}, {300, 129}, {3, 20000}};

TEST(RowPrograms, SoftmaxAndLogSoftmaxAtExtremeRows) {
  for (const bool row_fuser : {false, true}) {
    Rig rig(row_fuser);
    for (const Case& c : kCases) {
      SCOPED_TRACE(::testing::Message() << "row fuser " << row_fuser << ", " << c.rows << "x" << c.n);
      const std::vector<float> x = rows_of(c.rows, c.n, c.rows * 131 + c.n);
      const Tensor t = ok(rig.s->from_host(x, {c.rows, c.n}));
      const std::vector<float> sm = ok(rig.s->to_host<float>(ok(rig.s->softmax(t, 1))));
      expect_rows_near(sm, host_rows(x, c.n, softmax_row), 1e-5, "softmax");
      const std::vector<float> lsm = ok(rig.s->to_host<float>(ok(rig.s->log_softmax(t, 1))));
      expect_rows_near(lsm, host_rows(x, c.n, log_softmax_row), 1e-5, "log_softmax");
    }
    EXPECT_EQ(rig.row_programs() > 0, row_fuser);
  }
}

TEST(RowPrograms, NormsWrittenOutOpByOp) {
  constexpr double kEps = 1e-5;
  for (const bool row_fuser : {false, true}) {
    Rig rig(row_fuser);
    Session& s = *rig.s;
    for (const Case& c : kCases) {
      SCOPED_TRACE(::testing::Message() << "row fuser " << row_fuser << ", " << c.rows << "x" << c.n);
      std::vector<float> x = rows_of(c.rows, c.n, c.n * 7 + c.rows, /*huge=*/false);
      std::vector<float> g(c.n);
      for (std::size_t j = 0; j < c.n; ++j) g[j] = 0.5f + static_cast<float>(j % 5) * 0.25f;
      const Tensor xt = ok(s.from_host(x, {c.rows, c.n}));
      const Tensor gt = ok(s.from_host(g, {1, c.n}));
      // Layer norm: (x - mean) / sqrt(var + eps) * g.
      const Tensor centred = ok(s.sub(xt, ok(s.mean_dim(xt, 1))));
      const Tensor var = ok(s.mean_dim(ok(s.mul(centred, centred)), 1));
      const Tensor ln = ok(s.mul(ok(s.div(centred, ok(s.sqrt(ok(s.add(var, kEps)))))), gt));
      // RMS norm: x / sqrt(mean(x²) + eps) * g.
      const Tensor ms = ok(s.mean_dim(ok(s.mul(xt, xt)), 1));
      const Tensor rms = ok(s.mul(ok(s.div(xt, ok(s.sqrt(ok(s.add(ms, kEps)))))), gt));
      const std::vector<float> ln_got = ok(s.to_host<float>(ln));
      const std::vector<float> rms_got = ok(s.to_host<float>(rms));
      expect_rows_near(ln_got,
                       host_rows(x, c.n,
                                 [&](const double* r, double* y, std::size_t n) {
                                   double mean = 0, v = 0;
                                   for (std::size_t j = 0; j < n; ++j) mean += r[j];
                                   mean /= static_cast<double>(n);
                                   for (std::size_t j = 0; j < n; ++j) v += (r[j] - mean) * (r[j] - mean);
                                   v /= static_cast<double>(n);
                                   for (std::size_t j = 0; j < n; ++j)
                                     y[j] = (r[j] - mean) / std::sqrt(v + kEps) * g[j];
                                 }),
                       2e-4, "layer norm");
      expect_rows_near(rms_got,
                       host_rows(x, c.n,
                                 [&](const double* r, double* y, std::size_t n) {
                                   double m = 0;
                                   for (std::size_t j = 0; j < n; ++j) m += r[j] * r[j];
                                   m /= static_cast<double>(n);
                                   for (std::size_t j = 0; j < n; ++j) y[j] = r[j] / std::sqrt(m + kEps) * g[j];
                                 }),
                       2e-4, "rms norm");
    }
    EXPECT_EQ(rig.row_programs() > 0, row_fuser);
  }
}

// Both searches compute in f32 with the same kernels: the same values (NaN where the other has
// NaN), also where f32 overflows (squares of ±1e38 rows). 8192 rows of 1024 write more than the
// streaming threshold: the row device's final outputs go out with non-temporal stores.
TEST(RowPrograms, RowAndBurnSearchesAgree) {
  Rig rows(true), burn(false);
  std::vector<Case> cases(std::begin(kCases), std::end(kCases));
  cases.push_back({8192, 1024});
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << c.rows << "x" << c.n);
    const std::vector<float> x = rows_of(c.rows, c.n, c.rows * 17 + c.n);
    auto run = [&](Rig& rig) {
      Session& s = *rig.s;
      const Tensor t = ok(s.from_host(x, {c.rows, c.n}));
      const Tensor centred = ok(s.sub(t, ok(s.mean_dim(t, 1))));
      const Tensor var = ok(s.mean_dim(ok(s.mul(centred, centred)), 1));
      const Tensor ln = ok(s.div(centred, ok(s.sqrt(ok(s.add(var, 1e-5))))));
      std::vector<float> out = ok(s.to_host<float>(ok(s.softmax(t, 1))));
      for (const Tensor& y : {ok(s.log_softmax(t, 1)), ln}) {
        const std::vector<float> v = ok(s.to_host<float>(y));
        out.insert(out.end(), v.begin(), v.end());
      }
      return out;
    };
    const std::vector<float> got = run(rows);
    const std::vector<float> want = run(burn);
    expect_rows_near(got, std::vector<double>(want.begin(), want.end()), 1e-6, "row fuser vs Burn's search");
  }
  EXPECT_GT(rows.row_programs(), 0u);
  EXPECT_EQ(burn.row_programs(), 0u);
#if defined(__AVX__)  // non-temporal stores exist only in builds for AVX (the release preset)
  EXPECT_GT(rows.backend->stats().nontemporal_outputs, 0u) << "the 8192x1024 rows stream their outputs";
#else
  EXPECT_EQ(rows.backend->stats().nontemporal_outputs, 0u);
#endif
}

TEST(RowPrograms, CrossEntropyFromLogits) {
  for (const bool row_fuser : {false, true}) {
    Rig rig(row_fuser);
    Session& s = *rig.s;
    for (const Case& c : {Case{5, 3}, Case{64, 1000}, Case{2, 20000}}) {
      SCOPED_TRACE(::testing::Message() << "row fuser " << row_fuser << ", " << c.rows << "x" << c.n);
      std::mt19937_64 rng(c.rows + c.n);
      std::uniform_real_distribution<float> u(-6, 6);
      std::vector<float> logits(c.rows * c.n), target(c.rows * c.n, 0.0f);
      for (float& v : logits) v = u(rng);
      std::vector<std::int64_t> classes(c.rows);
      for (std::size_t r = 0; r < c.rows; ++r) {
        classes[r] = static_cast<std::int64_t>(rng() % c.n);
        target[r * c.n + static_cast<std::size_t>(classes[r])] = 1.0f;
      }
      const std::vector<double> lsm = host_rows(logits, c.n, log_softmax_row);
      double want = 0;
      for (std::size_t r = 0; r < c.rows; ++r) want -= lsm[r * c.n + static_cast<std::size_t>(classes[r])];
      want /= static_cast<double>(c.rows);
      const Tensor lt = ok(s.from_host(logits, {c.rows, c.n}));
      const std::vector<float> probs =
          ok(s.to_host<float>(ok(s.cross_entropy(lt, ok(s.from_host(target, {c.rows, c.n}))))));
      const std::vector<float> idx =
          ok(s.to_host<float>(ok(s.cross_entropy_indices(lt, ok(s.from_host(classes, {c.rows}))))));
      ASSERT_EQ(probs.size(), 1u);
      ASSERT_EQ(idx.size(), 1u);
      EXPECT_NEAR(probs[0], want, 1e-4 * std::max(1.0, std::abs(want)));
      EXPECT_NEAR(idx[0], want, 1e-4 * std::max(1.0, std::abs(want)));
    }
  }
}

// The elementwise stages of Row programs run by JIT kernels, one call per row (rows of at least
// 128), compute what the interpreter computes (bit for bit in a build for the JIT's target,
// jit_target.h): softmax, log-softmax, a layer norm whose gain is a [1, n] row and an RMS norm
// over [2, 3, n] rows. Rows shorter than 128 never take a kernel.
TEST(RowPrograms, JitRowStagesMatchTheInterpreter) {
  struct Shaped {
    ir::Shape shape;
    bool jit_expected;
  };
  const Shaped cases[] = {{{64, 1024}, true},  {{300, 129}, true}, {{3, 20000}, true},
                          {{2, 3, 256}, true}, {{40, 100}, false}, {{9, 37}, false}};
  for (const Shaped& c : cases) {
    const std::size_t n = c.shape.back(), total = ir::num_elements(c.shape), axis = c.shape.size() - 1;
    SCOPED_TRACE(::testing::Message() << total / n << " rows of " << n);
    const std::vector<float> x = rows_of(total / n, n, total + n, /*huge=*/false);
    std::vector<float> g(n);
    for (std::size_t j = 0; j < n; ++j) g[j] = 0.5f + static_cast<float>(j % 7) * 0.125f;
    auto run = [&](Rig& rig) {
      Session& s = *rig.s;
      const Tensor t = ok(s.from_host(x, c.shape));
      ir::Shape gs(c.shape.size(), 1);
      gs.back() = n;
      const Tensor gt = ok(s.from_host(g, gs));
      const Tensor centred = ok(s.sub(t, ok(s.mean_dim(t, axis))));
      const Tensor var = ok(s.mean_dim(ok(s.mul(centred, centred)), axis));
      const Tensor ln = ok(s.mul(ok(s.div(centred, ok(s.sqrt(ok(s.add(var, 1e-5)))))), gt));
      const Tensor ms = ok(s.mean_dim(ok(s.mul(t, t)), axis));
      const Tensor rms = ok(s.mul(ok(s.div(t, ok(s.sqrt(ok(s.add(ms, 1e-5)))))), 2.0));
      std::vector<float> out = ok(s.to_host<float>(ok(s.softmax(t, axis))));
      for (const Tensor& y : {ok(s.log_softmax(t, axis)), ln, rms}) {
        const std::vector<float> v = ok(s.to_host<float>(y));
        out.insert(out.end(), v.begin(), v.end());
      }
      return out;
    };
    Rig jit(true, CpuJitMode::On), interpreter(true, CpuJitMode::Off);
    const std::vector<float> got = run(jit), want = run(interpreter);
    ASSERT_EQ(got.size(), want.size());
    int bad = 0;
    for (std::size_t i = 0; i < got.size() && bad < 5; ++i)
      if (!testing::agrees_with_the_interpreter(got[i], want[i])) {
        ADD_FAILURE() << "at " << i << ": the JIT row stage gave " << got[i] << ", the interpreter " << want[i];
        ++bad;
      }
    EXPECT_GT(jit.row_programs(), 0u);
    EXPECT_EQ(jit.backend->stats().row_jit_stages > 0, c.jit_expected);
    EXPECT_EQ(interpreter.backend->stats().row_jit_stages, 0u);
  }
}

// A layer norm's last stage reads its gain and shift as [1, n] rows (varying along the row, the
// same for every row) besides the row's [m, 1] deviation: the kernel reads them contiguously
// from each row's start, so that stage runs by the JIT too (until 2026-12-08 such a load kept
// the stage on the interpreter: LN at 2^20, 1 thread, 0.90 -> 0.63 ns per element).
TEST(RowPrograms, LayerNormGainAndShiftRowsRunTheirStageThroughTheKernel) {
  const std::size_t m = 48, n = 512;
  const std::vector<float> x = rows_of(m, n, m * n + n, /*huge=*/false);
  std::vector<float> g(n), h(n);
  for (std::size_t j = 0; j < n; ++j) {
    g[j] = 0.5f + static_cast<float>(j % 7) * 0.125f;
    h[j] = -0.25f + static_cast<float>(j % 5) * 0.0625f;
  }
  auto run = [&](Rig& rig) {
    Session& s = *rig.s;
    const Tensor t = ok(s.from_host(x, {m, n}));
    const Tensor gt = ok(s.from_host(g, {1, n})), ht = ok(s.from_host(h, {1, n}));
    const Tensor centred = ok(s.sub(t, ok(s.mean_dim(t, 1))));
    const Tensor var = ok(s.mean_dim(ok(s.mul(centred, centred)), 1));
    const Tensor ln = ok(s.add(ok(s.mul(ok(s.div(centred, ok(s.sqrt(ok(s.add(var, 1e-5)))))), gt)), ht));
    return ok(s.to_host<float>(ln));
  };
  Rig jit(true, CpuJitMode::On), interpreter(true, CpuJitMode::Off);
  const std::vector<float> got = run(jit), want = run(interpreter);
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    ASSERT_TRUE(testing::agrees_with_the_interpreter(got[i], want[i]))
        << "at " << i << ": the JIT row stage gave " << got[i] << ", the interpreter " << want[i];
  EXPECT_EQ(jit.row_programs(), 1u);
  EXPECT_GE(jit.backend->stats().row_jit_stages, 1u);
}

}  // namespace
}  // namespace kiln::cpu
