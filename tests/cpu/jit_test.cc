// The CPU JIT (cpu/src/jit.h): compiled kernels against the reference executor on random fused
// programs (the differential generator, several sizes and scalars per structure), directed
// programs (broadcast / strided inputs, every float dtype, integers and bools, a kernel fault,
// a declined indexed program), one kernel per structure across sizes and scalars, and the disk
// cache (a new device loads without compiling; a corrupt entry is rebuilt); and the checked
// pass of f32 exp / log / tanh blocks against the interpreter, bit for bit, with NaN / Inf /
// domain-edge values sprinkled through the blocks and the tail, sliced (unaligned) inputs, and
// streaming launches (non-temporal stores for fresh outputs, blocked and plain loops); programs
// of independent parts run part by part, and in one pass when one part writes what another reads.
//
// Each new structure costs one compiler run (~0.3-1 s), so the random part is small; run more
// with KILN_JIT_TEST_STRUCTURES=<n>. Skipped when no C++ compiler is on PATH or KILN_CPU_JIT=0.
#include <gtest/gtest.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <random>
#include <set>

#include "../../cpu/src/jit.h"
#include "differential_util.h"
#include "jit_target.h"
#include "kiln/testing/status.h"

namespace kiln::cpu {
namespace {

using difftest::DiffProgram;
using difftest::FusedSide;
using difftest::Generator;
using difftest::ReferenceSide;
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
namespace fs = std::filesystem;

// The compiler the JIT runs (jit.h: the first `c++`, then `g++`, on PATH); empty when none.
std::string compiler_on_path() {
  const char* path = std::getenv("PATH");
  const std::string p = path != nullptr ? path : "";
  for (const char* name : {"c++", "g++"})
    for (std::size_t from = 0; from <= p.size();) {
      const std::size_t to = std::min(p.find(':', from), p.size());
      const std::string dir = p.substr(from, to - from);
      if (!dir.empty() && ::access((dir + "/" + name).c_str(), X_OK) == 0) return dir + "/" + name;
      from = to + 1;
    }
  return {};
}

bool compiler_available() {
  const char* env = std::getenv("KILN_CPU_JIT");
  if (env != nullptr && env[0] == '0') return false;
  return !compiler_on_path().empty();
}

// A private cache directory per test, removed afterwards.
class JitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!compiler_available()) GTEST_SKIP() << "no C++ compiler on PATH (or KILN_CPU_JIT=0)";
    std::string templ = (fs::temp_directory_path() / "kiln-jit-test-XXXXXX").string();
    ASSERT_NE(::mkdtemp(templ.data()), nullptr);
    dir_ = templ;
  }
  void TearDown() override {
    if (!dir_.empty()) {
      std::error_code ec;
      fs::remove_all(dir_, ec);
    }
  }
  CpuDeviceOptions options(int threads = 2) const {
    return CpuDeviceOptions{.threads = threads, .jit = CpuJitMode::On, .jit_cache_dir = dir_ + "/cache"};
  }
  std::string dir_;
};

TensorIr use(TensorIr t, TensorStatus s) {
  t.status = s;
  return t;
}
using ::kiln::testing::ok;

struct Session : FusedSide {
  std::uint64_t next = 1;
  explicit Session(CpuDeviceOptions o) : FusedSide(std::move(o)) {}
  TensorId id() { return TensorId{next++}; }
  TensorIr input(Shape shape, const std::vector<double>& values, DType d = dt::f32) {
    TensorIr t{id(), std::move(shape), TensorStatus::ReadOnly, d};
    KILN_EXPECT_OK(device.upload_f64(t.id, t.shape, d, values));
    return t;
  }
  TensorIr submit(Operation op) {
    TensorIr o = op.outputs()[0];
    o.status = TensorStatus::ReadOnly;
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

// One rounding per operation, as the kernels do: out of line, so that the compiler cannot
// contract a product and a following sum into one fma (GCC does at -O3 -march=native).
[[gnu::noinline]] float mul_f32(float a, float c) { return a * c; }

double rel_err(double a, double c) { return std::fabs(a - c) / std::max(std::fabs(c), 1e-30); }

// W1: y = exp(a*b + c*s).
TensorIr register_w1(Session& s, const Shape& shape, double scalar) {
  const std::size_t n = ir::num_elements(shape);
  const TensorIr a = s.input(shape, iota(n, 2, -1)), bb = s.input(shape, iota(n, 1.5, -0.5)),
                 c = s.input(shape, iota(n, 1, -0.7));
  const TensorIr t1 = s.submit(ok(b::binary(Family::NumericFloat, OpKind::Numeric_Mul, a, bb, s.id())));
  const TensorIr t2 =
      s.submit(ok(b::scalar(Family::NumericFloat, OpKind::Numeric_MulScalar, c, ScalarIr::Float(scalar), s.id())));
  const TensorIr t3 = s.submit(ok(b::binary(Family::NumericFloat, OpKind::Numeric_Add, use(t1, TensorStatus::ReadWrite),
                                            use(t2, TensorStatus::ReadWrite), s.id())));
  return s.submit(ok(b::unary(Family::Float, OpKind::Float_Exp, use(t3, TensorStatus::ReadWrite), s.id())));
}

void check_w1(const std::vector<double>& got, const Shape& shape, double scalar) {
  const std::size_t n = ir::num_elements(shape);
  auto a = iota(n, 2, -1), bb = iota(n, 1.5, -0.5), c = iota(n, 1, -0.7);
  ASSERT_EQ(got.size(), n);
  for (std::size_t i = 0; i < n; ++i) {
    const float t = static_cast<float>(static_cast<float>(a[i]) * static_cast<float>(bb[i])) +
                    static_cast<float>(static_cast<float>(c[i]) * static_cast<float>(scalar));
    ASSERT_LE(rel_err(got[i], std::exp(static_cast<double>(t))), 3e-7) << i;  // exp_f32: <= 1.02 ulp
  }
}

// Random fused programs: each structure with several instances (new sizes, scalars and data)
// on one device, so that compiled kernels are rerun with new runtime parameters; every instance
// is compared with the reference under the differential test's bounds.
TEST_F(JitTest, RandomProgramsMatchTheReference) {
  const char* env = std::getenv("KILN_JIT_TEST_STRUCTURES");
  const std::uint64_t structures = env != nullptr ? std::strtoull(env, nullptr, 10) : 10;
  const std::uint64_t instances = 4;
  std::uint64_t launches = 0, compiles = 0, declined = 0, interp = 0;
  int failures = 0;
  for (std::uint64_t t = 0; t < structures && failures < 5; ++t) {
    const std::uint64_t seed = 700000 + t;
    FusedSide side(options());
    std::uint64_t next_id = 1;
    for (std::uint64_t i = 0; i < instances; ++i) {
      const DiffProgram p = Generator(seed, seed * 16 + i, next_id, /*allow_large=*/i == 3).generate();
      next_id = p.end_id;
      ReferenceSide ref;
      side.run(p);
      ref.run(p);
      const std::string diff = difftest::compare(p, side.device, ref.device);
      if (!diff.empty()) {
        ADD_FAILURE() << "instance " << i << " of structure seed " << seed << " differs\n" << p.to_string() << diff;
        ++failures;
      }
      difftest::release(p, side.device);
    }
    const CpuDeviceStats st = side.device.stats();
    EXPECT_EQ(st.jit_failures, 0u) << "seed " << seed;
    launches += st.jit_launches;
    compiles += st.jit_compiles + st.jit_disk_loads;
    declined += st.jit_declined;
    interp += st.launches_by_kind[0] - std::min(st.launches_by_kind[0], st.jit_launches);
  }
  std::printf(
      "[jit] %llu structures x %llu instances: %llu JIT launches, %llu kernels, %llu declined, %llu "
      "interpreted elementwise launches\n",
      static_cast<unsigned long long>(structures), static_cast<unsigned long long>(instances),
      static_cast<unsigned long long>(launches), static_cast<unsigned long long>(compiles),
      static_cast<unsigned long long>(declined), static_cast<unsigned long long>(interp));
  EXPECT_GT(launches, compiles);  // kernels were rerun with new sizes and scalars
  EXPECT_GT(compiles, 0u);
}

// One structure, many sizes (flat and tiny) and scalar values: one compiled kernel.
TEST_F(JitTest, OneKernelServesEverySizeAndScalar) {
  Session s(options());
  const std::vector<std::pair<Shape, double>> runs = {
      {{64, 64}, 2.0}, {{3, 1000}, -0.5}, {{1}, 1.25}, {{17}, 0.0}, {{200000}, 3.0}};
  for (const auto& [shape, scalar] : runs) {
    const TensorIr y = register_w1(s, shape, scalar);
    check_w1(s.read(y), shape, scalar);
  }
  const CpuDeviceStats st = s.device.stats();
  EXPECT_EQ(st.jit_compiles, 1u);
  EXPECT_EQ(st.jit_launches, runs.size());
  EXPECT_EQ(st.fused_replays, 0u);
}

// Broadcast (a [1, n] row, a [m, 1] column) and strided (swap_dims view) inputs, a kept
// broadcast output: a launch the kernel has no path for (it declines at run time, the
// interpreter runs it, and it does not count as a JIT launch: it once did).
TEST_F(JitTest, BroadcastAndStridedInputs) {
  Session s(options());
  const std::size_t m = 70, n = 90;
  const auto rv = iota(n, 1, 0.5), cv = iota(m, 1, -0.25), xv = iota(m * n, 2, -1), wv = iota(n * m, 1.5, -0.5);
  const TensorIr row = s.input({1, n}, rv), col = s.input({m, 1}, cv), x = s.input({m, n}, xv), w = s.input({n, m}, wv);
  const TensorIr a = s.submit(ok(b::binary(Family::NumericFloat, OpKind::Numeric_Add, x, row, s.id())));
  const TensorIr wt = s.submit(ok(b::swap_dims(Family::BaseFloat, OpKind::Base_SwapDims, w, 0, 1, s.id())));
  const TensorIr c = s.submit(ok(b::binary(Family::NumericFloat, OpKind::Numeric_Mul, use(a, TensorStatus::ReadWrite),
                                           use(wt, TensorStatus::ReadWrite), s.id())));
  const TensorIr r2 =
      s.submit(ok(b::scalar(Family::NumericFloat, OpKind::Numeric_MulScalar, row, ScalarIr::Float(3.0), s.id())));
  const TensorIr d =
      s.submit(ok(b::binary(Family::NumericFloat, OpKind::Numeric_Sub, use(c, TensorStatus::ReadWrite), col, s.id())));
  const TensorIr y =
      s.submit(ok(b::binary(Family::NumericFloat, OpKind::Numeric_Mul, use(d, TensorStatus::ReadWrite), r2, s.id())));
  const std::vector<double> yv = s.read(y);
  const std::vector<double> r2v = s.read(r2);
  for (std::size_t j = 0; j < n; ++j) ASSERT_EQ(r2v[j], static_cast<float>(rv[j]) * 3.0f);
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = 0; j < n; ++j) {
      // Each product through mul_f32: the kernel rounds the product before the subtraction, and
      // an inline `av * w - c` is contracted into one fma at -O3 -march=native.
      const float av = static_cast<float>(xv[i * n + j]) + static_cast<float>(rv[j]);
      const float cvv = mul_f32(av, static_cast<float>(wv[j * m + i]));
      const float dv = cvv - static_cast<float>(cv[i]);
      ASSERT_EQ(yv[i * n + j], mul_f32(dv, mul_f32(static_cast<float>(rv[j]), 3.0f))) << i << "," << j;
    }
  EXPECT_EQ(s.device.stats().jit_launches, 0u);
  EXPECT_GE(s.device.stats().jit_compiles, 1u);
  EXPECT_EQ(s.device.stats().fused_replays, 0u);
}

// A broadcast along rows (softmax's x - max: a [m, 1] column) runs the kernel's flat path once
// per row of 128 or more, each call based at its row (the value of the column one element), and
// computes what the interpreter computes (bit for bit in a build for the JIT's target,
// jit_target.h). A [1, n] row broadcast (layer norm's gain) is read contiguously from each row's
// start the same way. Shorter rows stay on the interpreter.
TEST_F(JitTest, RowBroadcastsRunTheKernelRowByRow) {
  struct Case {
    std::size_t m, n;
    bool column;  // x - [m, 1] column, else x - [1, n] row
    bool by_rows;
  };
  for (const Case c : {Case{40, 256, true, true}, Case{3, 1000, true, true}, Case{40, 100, true, false},
                       Case{40, 256, false, true}, Case{3, 1000, false, true}, Case{40, 100, false, false}}) {
    SCOPED_TRACE(::testing::Message() << c.m << "x" << c.n << (c.column ? " column" : " row"));
    const auto xv = iota(c.m * c.n, 0.01, -3), bv = iota(c.column ? c.m : c.n, 0.5, -2);
    auto run = [&](CpuJitMode mode) {
      CpuDeviceOptions o = options();
      o.jit = mode;
      Session s(o);
      const TensorIr x = s.input({c.m, c.n}, xv);
      const TensorIr bias = c.column ? s.input({c.m, 1}, bv) : s.input({1, c.n}, bv);
      const TensorIr d = s.submit(ok(b::binary(Family::NumericFloat, OpKind::Numeric_Sub, x, bias, s.id())));
      const TensorIr e =
          s.submit(ok(b::unary(Family::Float, OpKind::Float_Exp, use(d, TensorStatus::ReadWrite), s.id())));
      const TensorIr y = s.submit(ok(b::scalar(Family::NumericFloat, OpKind::Numeric_MulScalar,
                                               use(e, TensorStatus::ReadWrite), ScalarIr::Float(0.5), s.id())));
      std::vector<double> out = s.read(y);
      EXPECT_EQ(s.device.stats().fused_replays, 0u);
      return std::make_pair(out, s.device.stats().jit_launches);
    };
    const auto [got, jit_runs] = run(CpuJitMode::On);
    const auto [want, interpreter_runs] = run(CpuJitMode::Off);
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t i = 0; i < got.size(); ++i)
      ASSERT_TRUE(testing::agrees_with_the_interpreter(static_cast<float>(got[i]), static_cast<float>(want[i])))
          << i << ": JIT " << got[i] << ", interpreter " << want[i];
    EXPECT_EQ(jit_runs, c.by_rows ? 1u : 0u);
    EXPECT_EQ(interpreter_runs, 0u);
  }
}

// f16 / bf16 / f64 (rounding after each instruction, libm functions rounded once), integers
// (wrapping i8 arithmetic) and bools: bit-identical to the reference.
TEST_F(JitTest, EveryDtypeMatchesTheReference) {
  for (DType d : {dt::f16, dt::bf16, dt::f64, dt::flex32}) {
    Session s(options(1));
    const std::size_t n = 3000;
    const TensorIr x = s.input({n}, iota(n, 4, -2), d), z = s.input({n}, iota(n, 3, -1), d);
    const TensorIr t = s.submit(ok(b::binary(Family::NumericFloat, OpKind::Numeric_Mul, x, z, s.id())));
    const TensorIr u =
        s.submit(ok(b::unary(Family::Float, OpKind::Float_Sin, use(t, TensorStatus::ReadWrite), s.id())));
    const TensorIr v = s.submit(ok(b::scalar(Family::NumericFloat, OpKind::Numeric_AddScalar,
                                             use(u, TensorStatus::ReadWrite), ScalarIr::Float(0.1), s.id())));
    const TensorIr y =
        s.submit(ok(b::binary(Family::NumericFloat, OpKind::Numeric_Div, use(v, TensorStatus::ReadWrite), x, s.id())));
    const std::vector<double> got = s.read(y);
    // The same ops on the reference executor.
    CpuDevice ref(CpuDeviceOptions{.threads = 1});
    const std::vector<Operation> ops = {
        ok(b::binary(Family::NumericFloat, OpKind::Numeric_Mul, x, z, t.id)),
        ok(b::unary(Family::Float, OpKind::Float_Sin, use(t, TensorStatus::ReadWrite), u.id)),
        ok(b::scalar(Family::NumericFloat, OpKind::Numeric_AddScalar, use(u, TensorStatus::ReadWrite),
                     ScalarIr::Float(0.1), v.id)),
        ok(b::binary(Family::NumericFloat, OpKind::Numeric_Div, use(v, TensorStatus::ReadWrite), x, y.id))};
    KILN_ASSERT_OK(ref.upload_f64(x.id, x.shape, d, iota(n, 4, -2)));
    KILN_ASSERT_OK(ref.upload_f64(z.id, z.shape, d, iota(n, 3, -1)));
    for (const Operation& op : ops) (void)ref.reference().execute(op, ref.handles());
    const std::vector<double> want = *ref.download_f64(y.id);
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t i = 0; i < n; ++i)
      ASSERT_TRUE(got[i] == want[i] || (std::isnan(got[i]) && std::isnan(want[i])))
          << d.name() << " element " << i << ": " << got[i] << " vs " << want[i];
    EXPECT_EQ(s.device.stats().jit_launches, 1u) << d.name();
  }
  // i8: wrapping multiply-add, a comparison, a mask; bool output.
  Session s(options(1));
  const std::size_t n = 500;
  std::vector<double> av(n), cv(n);
  for (std::size_t i = 0; i < n; ++i) {
    av[i] = static_cast<double>(static_cast<int>(i * 7 % 250) - 125);
    cv[i] = static_cast<double>(static_cast<int>(i * 13 % 200) - 100);
  }
  const TensorIr a = s.input({n}, av, dt::i8), c = s.input({n}, cv, dt::i8);
  const TensorIr p = s.submit(ok(b::binary(Family::NumericInt, OpKind::Numeric_Mul, a, c, s.id())));
  const TensorIr q = s.submit(ok(b::scalar(Family::NumericInt, OpKind::Numeric_AddScalar,
                                           use(p, TensorStatus::ReadWrite), ScalarIr::Int(100), s.id())));
  const TensorIr g =
      s.submit(ok(b::binary_comparison(Family::NumericInt, OpKind::Numeric_Greater, q, a, dt::boolean, s.id())));
  const TensorIr y = s.submit(ok(b::mask_fill(Family::BaseInt, OpKind::Base_MaskFill, use(q, TensorStatus::ReadWrite),
                                              g, ScalarIr::Int(-7), s.id())));
  s.sync();
  const std::vector<std::int64_t> yv = *s.device.download_i64(y.id);
  const std::vector<bool> gv = *s.device.download_bool(g.id);
  for (std::size_t i = 0; i < n; ++i) {
    const auto qv =
        static_cast<std::int8_t>(static_cast<std::int8_t>(static_cast<int>(av[i]) * static_cast<int>(cv[i])) + 100);
    const bool gt = qv > static_cast<int>(av[i]);
    ASSERT_EQ(gv[i], gt) << i;
    ASSERT_EQ(yv[i], gt ? -7 : qv) << i;
  }
  EXPECT_GE(s.device.stats().jit_launches, 1u);
}

// An integer division by zero inside a JIT kernel: the program is replayed op by op and the
// faulting op's output is errored, exactly as with the interpreter.
TEST_F(JitTest, KernelFaultReplaysTheOps) {
  Session s(options());
  const Shape shape{4, 5};
  std::vector<double> num(20, 7), den(20, 2);
  den[13] = 0;
  const TensorIr n = s.input(shape, num, dt::i32);
  const TensorIr d = s.input(shape, den, dt::i32);
  const TensorIr q = s.submit(ok(b::binary(Family::NumericInt, OpKind::Numeric_Div, n, d, s.id())));
  const TensorIr y = s.submit(ok(b::scalar(Family::NumericInt, OpKind::Numeric_AddScalar,
                                           use(q, TensorStatus::ReadWrite), ScalarIr::Int(1), s.id())));
  s.sync();
  auto yv = s.device.download_i64(y.id);
  ASSERT_TRUE(yv.is_errored());
  EXPECT_EQ(s.device.stats().fused_replays, 1u);
  EXPECT_EQ(s.device.stats().jit_launches, 0u);
  EXPECT_EQ(s.device.stats().jit_compiles, 1u);
  EXPECT_EQ((*s.device.download_i64(n.id))[0], 7);
}

// A program with an indexed read (gather): the JIT declines it, the interpreter runs it.
TEST_F(JitTest, DeclinedProgramsRunOnTheInterpreter) {
  Session s(options());
  const std::size_t n = 6;
  const auto xv = iota(n * n, 2, -1), tv = iota(n * 3, 1, 0);
  std::vector<double> iv(n * n);
  for (std::size_t i = 0; i < n * n; ++i) iv[i] = static_cast<double>((i * 7) % 3);
  const TensorIr x = s.input({n, n}, xv), table = s.input({n, 3}, tv), idx = s.input({n, n}, iv, dt::i64);
  const TensorIr t =
      s.submit(ok(b::scalar(Family::NumericFloat, OpKind::Numeric_MulScalar, x, ScalarIr::Float(2.0), s.id())));
  const TensorIr g = s.submit(ok(b::gather(Family::BaseFloat, OpKind::Base_Gather, table, 1, idx, s.id())));
  const TensorIr y = s.submit(ok(b::binary(Family::NumericFloat, OpKind::Numeric_Mul, use(t, TensorStatus::ReadWrite),
                                           use(g, TensorStatus::ReadWrite), s.id())));
  const std::vector<double> got = s.read(y);
  for (std::size_t i = 0; i < n * n; ++i) {
    const float want =
        (static_cast<float>(xv[i]) * 2.0f) * static_cast<float>(tv[(i / n) * 3 + static_cast<std::size_t>(iv[i])]);
    ASSERT_EQ(got[i], want) << i;
  }
  const CpuDeviceStats st = s.device.stats();
  EXPECT_GE(st.jit_declined, 1u);
  EXPECT_EQ(st.jit_launches, 0u);
  EXPECT_EQ(st.jit_compiles, 0u);
  EXPECT_EQ(st.fused_replays, 0u);
}

// A second device (a new process, in effect) loads the kernel from disk without compiling; a
// corrupt cache file is ignored, rebuilt and replaced.
TEST_F(JitTest, DiskCacheIsReusedAndCorruptEntriesAreRebuilt) {
  const Shape shape{1000};
  {
    Session s(options());
    check_w1(s.read(register_w1(s, shape, 2.0)), shape, 2.0);
    EXPECT_EQ(s.device.stats().jit_compiles, 1u);
    EXPECT_EQ(s.device.stats().jit_disk_loads, 0u);
  }
  std::vector<fs::path> libs;
  for (const auto& e : fs::directory_iterator(dir_ + "/cache")) {
    const std::string name = e.path().filename().string();
    EXPECT_EQ(name.find('-'), std::string::npos) << "temporary left behind: " << e.path();
    if (e.path().extension() == ".so") libs.push_back(e.path());
  }
  ASSERT_EQ(libs.size(), 1u);
  EXPECT_EQ(fs::status(dir_ + "/cache").permissions() & fs::perms::all, fs::perms::owner_all);
  {
    Session s(options());
    check_w1(s.read(register_w1(s, shape, -1.0)), shape, -1.0);
    EXPECT_EQ(s.device.stats().jit_compiles, 0u);
    EXPECT_EQ(s.device.stats().jit_disk_loads, 1u);
    EXPECT_EQ(s.device.stats().jit_launches, 1u);
  }
  { std::ofstream(libs[0], std::ios::binary | std::ios::trunc) << "not a shared library"; }
  {
    Session s(options());
    check_w1(s.read(register_w1(s, shape, 0.5)), shape, 0.5);
    const CpuDeviceStats st = s.device.stats();
    EXPECT_EQ(st.jit_corrupt, 1u);
    EXPECT_EQ(st.jit_compiles, 1u);
    EXPECT_EQ(st.jit_launches, 1u);
  }
  {
    Session s(options());
    check_w1(s.read(register_w1(s, shape, 0.25)), shape, 0.25);
    EXPECT_EQ(s.device.stats().jit_disk_loads, 1u);  // the rebuilt entry
  }
}

// ---- The checked pass (f32 exp / log / tanh blocks): bit-identical to the interpreter whatever
// the blocks hold.

// f32 values that leave the restricted domains of the checked pass (NaNs with payloads, quiet
// and signalling, both signs; infinities; the domain edges 86 and 43; huge values; zeros,
// subnormals and negatives for log) or sit just inside them.
std::vector<float> special_floats() {
  std::vector<float> v;
  for (std::uint32_t bits : {0x7fc00000u, 0x7fc00001u, 0xffc12345u, 0x7fa00000u, 0xff800001u, 0x7f800000u, 0xff800000u,
                             0x00000001u, 0x80000001u, 0x007fffffu, 0x7f7fffffu, 0xff7fffffu})
    v.push_back(std::bit_cast<float>(bits));
  for (float x : {0.0f, -0.0f, 1e30f, -1e30f, 86.0f, -86.0f, 43.0f, -43.0f, 85.99999f, -42.99999f, 88.8f, 104.5f,
                  -104.5f, 0.625f, -1.0f})
    v.push_back(x);
  return v;
}

// n values uniform in [-r, r], with special values sprinkled in: in about a third of the
// 64-element blocks (one to three each, anywhere in the block, so that both 64- and
// 128-element blocks meet them and others stay clean) and in the last 40 elements (the tail).
std::vector<float> sprinkled(std::size_t n, float r, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-r, r);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  const std::vector<float> sp = special_floats();
  auto put = [&](std::size_t at) { v[at] = sp[rng() % sp.size()]; };
  for (std::size_t b = 0; b + 64 <= n; b += 64)
    if (rng() % 3 == 0)
      for (std::uint64_t k = 1 + rng() % 3; k > 0; --k) put(b + rng() % 64);
  for (std::size_t k = 0; k < 4 && n > 0; ++k) put(n - 1 - rng() % std::min<std::size_t>(n, 40));
  return v;
}

// A program over f32 inputs: registers its ops on a session, returns the output.
using Program = TensorIr (*)(Session&, const std::vector<TensorIr>&);

// W2-like: y = sqrt(abs(tanh(sigmoid(x*1.5 + 0.5)*x - 0.25))), sigmoid lowered as the fusion
// client lowers it (cast, -x, exp, +1, log, -x, exp, cast): 15 ops, 128-element blocks.
TensorIr w2_program(Session& s, const std::vector<TensorIr>& in) {
  const TensorIr x = in[0];
  constexpr auto RW = TensorStatus::ReadWrite;
  auto sc = [&](OpKind k, const TensorIr& t, double v) {
    return s.submit(ok(b::scalar(Family::NumericFloat, k, use(t, RW), ScalarIr::Float(v), s.id())));
  };
  auto fl = [&](OpKind k, const TensorIr& t) { return s.submit(ok(b::unary(Family::Float, k, use(t, RW), s.id()))); };
  auto cast = [&](const TensorIr& t) {
    return s.submit(ok(b::cast(Family::BaseFloat, OpKind::Base_Cast, use(t, RW), dt::f32, s.id())));
  };
  TensorIr t =
      s.submit(ok(b::scalar(Family::NumericFloat, OpKind::Numeric_MulScalar, x, ScalarIr::Float(1.5), s.id())));
  t = sc(OpKind::Numeric_AddScalar, t, 0.5);
  t = cast(t);
  t = sc(OpKind::Numeric_MulScalar, t, -1.0);
  t = fl(OpKind::Float_Exp, t);
  t = sc(OpKind::Numeric_AddScalar, t, 1.0);
  t = fl(OpKind::Float_Log, t);
  t = sc(OpKind::Numeric_MulScalar, t, -1.0);
  t = fl(OpKind::Float_Exp, t);
  t = cast(t);
  t = s.submit(ok(b::binary(Family::NumericFloat, OpKind::Numeric_Mul, use(t, RW), x, s.id())));
  t = sc(OpKind::Numeric_SubScalar, t, 0.25);
  t = fl(OpKind::Float_Tanh, t);
  t = s.submit(ok(b::unary(Family::NumericFloat, OpKind::Numeric_Abs, use(t, RW), s.id())));
  return fl(OpKind::Float_Sqrt, t);
}

// exp / log / tanh of the raw input and of derived values: y = log(exp(x) + exp(-0.5x)) +
// 0.25 log(x) + tanh(x) (exp(86), tanh(43), log(0), log(-1), log(inf) ... all reach the
// kernels); 10 instructions on one stream, 128-element blocks.
TensorIr chain_program(Session& s, const std::vector<TensorIr>& in) {
  const TensorIr x = in[0];
  constexpr auto RW = TensorStatus::ReadWrite;
  auto fl = [&](OpKind k, const TensorIr& t) { return s.submit(ok(b::unary(Family::Float, k, t, s.id()))); };
  auto add = [&](const TensorIr& l, const TensorIr& r) {
    return s.submit(ok(b::binary(Family::NumericFloat, OpKind::Numeric_Add, use(l, RW), use(r, RW), s.id())));
  };
  const TensorIr ex = fl(OpKind::Float_Exp, x);
  const TensorIr lx = fl(OpKind::Float_Log, x);
  const TensorIr tx = fl(OpKind::Float_Tanh, x);
  const TensorIr m =
      s.submit(ok(b::scalar(Family::NumericFloat, OpKind::Numeric_MulScalar, x, ScalarIr::Float(-0.5), s.id())));
  const TensorIr em = fl(OpKind::Float_Exp, use(m, RW));
  const TensorIr ls = fl(OpKind::Float_Log, use(add(ex, em), RW));
  const TensorIr q = s.submit(
      ok(b::scalar(Family::NumericFloat, OpKind::Numeric_MulScalar, use(lx, RW), ScalarIr::Float(0.25), s.id())));
  return add(add(ls, q), tx);
}

// Three streams, one of each function: y = log(a) + exp(b) - tanh(c): 5 instructions on 4
// streams, memory-bound, 64-element blocks.
TensorIr three_program(Session& s, const std::vector<TensorIr>& in) {
  constexpr auto RW = TensorStatus::ReadWrite;
  auto fl = [&](OpKind k, const TensorIr& t) { return s.submit(ok(b::unary(Family::Float, k, t, s.id()))); };
  const TensorIr la = fl(OpKind::Float_Log, in[0]), eb = fl(OpKind::Float_Exp, in[1]),
                 tc = fl(OpKind::Float_Tanh, in[2]);
  const TensorIr sum =
      s.submit(ok(b::binary(Family::NumericFloat, OpKind::Numeric_Add, use(la, RW), use(eb, RW), s.id())));
  return s.submit(ok(b::binary(Family::NumericFloat, OpKind::Numeric_Sub, use(sum, RW), use(tc, RW), s.id())));
}

// How many kernel sources in a cache directory contain `text`.
std::size_t kernel_sources_with(const std::string& dir, const std::string& text) {
  std::size_t n = 0;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".cc") {
      std::ifstream f(e.path());
      const std::string src((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
      n += src.find(text) != std::string::npos ? 1 : 0;
    }
  return n;
}

struct BothRuns {
  std::vector<float> jit, interp;
  CpuDeviceStats jit_stats;
};

// A program with any number of results, run on the JIT device and on the interpreter (same ops,
// same ids, raw f32 uploads so that NaN payloads survive): every result per side, and each
// side's stats. offset > 0: every input is uploaded with `offset` extra leading elements and
// sliced off by a view, so that the kernel's loads start off any alignment.
struct PartsRun {
  std::vector<std::vector<float>> jit, interp;
  CpuDeviceStats jit_stats, interp_stats;
};
using OutputsProgram = std::function<std::vector<TensorIr>(Session&, const std::vector<TensorIr>&)>;
PartsRun run_parts(const CpuDeviceOptions& jit_options, const OutputsProgram& program,
                   const std::vector<std::vector<float>>& inputs, std::size_t offset = 0) {
  PartsRun r;
  for (int side = 0; side < 2; ++side) {
    CpuDeviceOptions o = jit_options;
    if (side == 1) o.jit = CpuJitMode::Off;
    Session s(o);
    std::vector<TensorIr> in;
    for (const std::vector<float>& v : inputs) {
      std::vector<float> padded(offset, 1.0f);
      padded.insert(padded.end(), v.begin(), v.end());
      TensorIr t{s.id(), Shape{padded.size()}, TensorStatus::ReadOnly, dt::f32};
      KILN_EXPECT_OK(s.device.upload<float>(t.id, t.shape, std::span<const float>(padded)));
      if (offset > 0) {
        const ir::Slice range{static_cast<std::int64_t>(offset), std::nullopt, 1};
        t = s.submit(
            ok(b::slice(Family::BaseFloat, OpKind::Base_Slice, t, std::span<const ir::Slice>(&range, 1), s.id())));
      }
      in.push_back(t);
    }
    const std::vector<TensorIr> outs = program(s, in);
    s.sync();
    for (const TensorIr& y : outs) {
      auto got = s.device.download<float>(y.id);
      KILN_EXPECT_OK(got);
      (side == 0 ? r.jit : r.interp).push_back(got.ok() ? *got : std::vector<float>{});
    }
    (side == 0 ? r.jit_stats : r.interp_stats) = s.device.stats();
    EXPECT_EQ(s.device.stats().fused_replays, 0u);
  }
  return r;
}

// The same for a program with one result.
BothRuns run_both(const CpuDeviceOptions& jit_options, Program program, const std::vector<std::vector<float>>& inputs,
                  std::size_t offset = 0) {
  PartsRun r = run_parts(
      jit_options, [&](Session& s, const std::vector<TensorIr>& in) { return std::vector<TensorIr>{program(s, in)}; },
      inputs, offset);
  return BothRuns{std::move(r.jit.at(0)), std::move(r.interp.at(0)), r.jit_stats};
}

// The kernel and the interpreter agree bit for bit (NaN payloads included) when they were
// compiled for the same target (jit_target.h). Elsewhere the test still requires the same NaN /
// infinity / zero results, bit for bit, and finite values within `tol` (absolute, plus 1e-5
// relative).
using testing::kSameTargetAsTheJit;

void expect_same_bits(const BothRuns& r, const std::string& what, double tol, bool nan_payloads_exact) {
  ASSERT_EQ(r.jit.size(), r.interp.size()) << what;
  std::size_t bad = 0, inexact = 0, nan_payloads = 0;
  double worst = 0;
  for (std::size_t i = 0; i < r.jit.size(); ++i) {
    const float a = r.jit[i], c = r.interp[i];
    const auto ab = std::bit_cast<std::uint32_t>(a), cb = std::bit_cast<std::uint32_t>(c);
    if (ab == cb) continue;
    // NaN == NaN for programs where one operation can meet two NaNs with different payloads
    // (several inputs): which one it keeps depends on the operand order the compiler picked
    // (x86 keeps the first's; IEEE 754 leaves it open). With one input every NaN descends from
    // one payload, and the bits must match.
    if (!nan_payloads_exact && std::isnan(a) && std::isnan(c)) {
      ++nan_payloads;
      continue;
    }
    if (!kSameTargetAsTheJit && std::isfinite(a) && std::isfinite(c) && a != 0.0f && c != 0.0f) {
      const double d = std::fabs(static_cast<double>(a) - static_cast<double>(c));
      worst = std::max(worst, d);
      ++inexact;
      if (d <= tol + 1e-5 * std::fabs(static_cast<double>(c))) continue;
    }
    if (++bad <= 5)
      ADD_FAILURE() << what << ": element " << i << " (block " << i / 128 << ", lane " << i % 128 << "): JIT 0x"
                    << std::hex << ab << " (" << a << "), interpreter 0x" << cb << " (" << c << ")";
  }
  EXPECT_EQ(bad, 0u) << what;
  if (nan_payloads > 0) std::printf("[jit] %s: %zu NaNs with other payloads\n", what.c_str(), nan_payloads);
  if (!kSameTargetAsTheJit && inexact > 0)
    std::printf(
        "[jit] %s: %zu of %zu elements differ in the last bits (this build has no FMA, the JIT does), "
        "largest difference %g\n",
        what.c_str(), inexact, r.jit.size(), worst);
}

TEST_F(JitTest, CheckedBlocksMatchTheInterpreterWithSpecialValues) {
  const CpuDeviceOptions o = options();
  struct Case {
    const char* name;
    Program program;
    std::size_t inputs;
    float range;
    double tol;  // without FMA in this build only (see expect_same_bits)
  };
  const Case cases[] = {{"w2", w2_program, 1, 3.0f, 1e-4},
                        {"chain", chain_program, 1, 30.0f, 1e-4},
                        {"three", three_program, 3, 30.0f, 1e-4}};
  std::uint64_t seed = 1;
  for (const Case& c : cases) {
    for (const std::size_t n : {std::size_t{1000}, std::size_t{4096 + 37}, std::size_t{256}, std::size_t{100}}) {
      for (const std::size_t offset : {std::size_t{0}, std::size_t{3}}) {
        std::vector<std::vector<float>> in;
        for (std::size_t k = 0; k < c.inputs; ++k) in.push_back(sprinkled(n, c.range, seed++));
        const BothRuns r = run_both(o, c.program, in, offset);
        const std::string what = std::string(c.name) + " n=" + std::to_string(n) + " offset=" + std::to_string(offset);
        expect_same_bits(r, what, c.tol, c.inputs == 1);
        EXPECT_GE(r.jit_stats.jit_launches, 1u) << what;
        EXPECT_EQ(r.jit_stats.jit_failures, 0u) << what;
        // The kernel ran, not the interpreter (sliced inputs too: a contiguous view from an
        // offset is a flat load, unaligned).
        EXPECT_EQ(r.jit_stats.jit_declined, 0u) << what;
      }
    }
  }
  // Three kernels, each with the checked pass; w2 and chain in 128-element blocks, three in 64.
  EXPECT_EQ(kernel_sources_with(dir_ + "/cache", "fast::BlockCheck chk;"), 3u);
  EXPECT_EQ(kernel_sources_with(dir_ + "/cache", "constexpr int kLanes = 128;"), 2u);
  EXPECT_EQ(kernel_sources_with(dir_ + "/cache", "constexpr int kLanes = 64;"), 1u);
  // All clean (every block takes the checked pass's fast exit) and all special (every block is
  // recomputed).
  for (const Case& c : cases) {
    std::vector<std::vector<float>> clean, dirty;
    std::mt19937_64 rng(seed++);
    const std::vector<float> sp = special_floats();
    for (std::size_t k = 0; k < c.inputs; ++k) {
      std::vector<float> v(2048), w(2048);
      std::uniform_real_distribution<float> u(-c.range, c.range);
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = u(rng), w[i] = sp[rng() % sp.size()];
      clean.push_back(v);
      dirty.push_back(w);
    }
    expect_same_bits(run_both(o, c.program, clean), std::string(c.name) + " clean", c.tol, c.inputs == 1);
    expect_same_bits(run_both(o, c.program, dirty), std::string(c.name) + " all special", c.tol, c.inputs == 1);
  }
}

// One memory-bound launch of the blocked loop above kStreamingBytes (3 inputs and 1 output of
// 2^22 f32: 64 MiB), split between two threads: its fresh output is written with non-temporal
// stores (where the CPU has AVX-512), and matches the interpreter.
TEST_F(JitTest, StreamingLaunchWithNonTemporalStoresMatchesTheInterpreter) {
  const std::size_t n = std::size_t{1} << 22;
  const BothRuns r = run_both(options(2), three_program,
                              {sprinkled(n, 30.0f, 4242), sprinkled(n, 30.0f, 4243), sprinkled(n, 30.0f, 4244)});
  expect_same_bits(r, "three n=2^22", 1e-4, false);
  EXPECT_EQ(r.jit_stats.jit_launches, 1u);
  EXPECT_EQ(r.jit_stats.jit_declined, 0u);
  EXPECT_EQ(r.jit_stats.nontemporal_outputs, __builtin_cpu_supports("avx512f") ? 1u : 0u);
  EXPECT_EQ(kernel_sources_with(dir_ + "/cache", "_mm512_stream_ps(q0"), 1u);
}

// A memory-bound streaming launch (no exp / log / tanh: the plain loop, not blocks) with an
// output written in place over a consumed input, a fresh f32 output, a fresh bool output and a
// broadcast load. Only the fresh f32 output is flagged for non-temporal stores, and the kernel
// reports (Frame::streamed) that it streamed exactly one output, where it has the AVX-512 path;
// every output matches the interpreter bit for bit (NaN payloads aside where two NaNs meet),
// including the 100 positions past the last 256-position chunk. (What reaches memory is the same either way: the count
// is what tells a kernel that streams, or streams the wrong output, from one that ignores the flags.)
TEST_F(JitTest, StreamingPlainLoopWritesOnlyFreshOutputsNonTemporally) {
  const std::size_t n = (std::size_t{1} << 22) + 100;  // 2 inputs + 3 outputs of ~16 MiB: streaming
  const std::vector<float> xs = sprinkled(n, 4.0f, 77), ys = sprinkled(n, 4.0f, 78);
  const std::vector<float> cs = {0.75f};
  std::vector<float> got[2][2];
  std::vector<std::uint8_t> positive[2];
  CpuDeviceStats stats[2];
  for (int side = 0; side < 2; ++side) {
    CpuDeviceOptions o = options(2);
    if (side == 1) o.jit = CpuJitMode::Off;
    Session s(o);
    TensorIr x{s.id(), Shape{n}, TensorStatus::ReadOnly, dt::f32}, y{s.id(), Shape{n}, TensorStatus::ReadOnly, dt::f32};
    TensorIr c{s.id(), Shape{1}, TensorStatus::ReadOnly, dt::f32};
    KILN_ASSERT_OK(s.device.upload<float>(x.id, x.shape, std::span<const float>(xs)));
    KILN_ASSERT_OK(s.device.upload<float>(y.id, y.shape, std::span<const float>(ys)));
    KILN_ASSERT_OK(s.device.upload<float>(c.id, c.shape, std::span<const float>(cs)));
    constexpr auto RW = TensorStatus::ReadWrite;
    const TensorIr a = s.submit(ok(b::binary(Family::NumericFloat, OpKind::Numeric_Mul, x, c, s.id())));
    const TensorIr u =
        s.submit(ok(b::binary(Family::NumericFloat, OpKind::Numeric_Add, use(a, RW), use(y, RW), s.id())));
    const TensorIr sq = s.submit(ok(b::binary(Family::NumericFloat, OpKind::Numeric_Mul, x, x, s.id())));
    const TensorIr w = s.submit(
        ok(b::scalar(Family::NumericFloat, OpKind::Numeric_SubScalar, use(sq, RW), ScalarIr::Float(0.25), s.id())));
    const TensorIr gt = s.submit(ok(b::scalar_comparison(Family::NumericFloat, OpKind::Numeric_GreaterElem, x,
                                                         ScalarIr::Float(0.0), dt::boolean, s.id())));
    s.sync();
    for (int k = 0; k < 2; ++k) {
      auto v = s.device.download<float>((k == 0 ? u : w).id);
      KILN_ASSERT_OK(v);
      got[side][k] = *v;
    }
    auto bools = s.device.download_bool(gt.id);
    KILN_ASSERT_OK(bools);
    for (bool v : *bools) positive[side].push_back(v ? 1 : 0);
    stats[side] = s.device.stats();
    EXPECT_EQ(stats[side].fused_replays, 0u);
  }
  for (int k = 0; k < 2; ++k) {
    ASSERT_EQ(got[0][k].size(), n);
    // u = x*c + y meets two NaNs at some positions (the payload kept is the compiler's operand
    // order); w descends from x alone, so its NaN payloads must match too.
    expect_same_bits(BothRuns{got[0][k], got[1][k], stats[0]}, k == 0 ? "u" : "w", 0.0, k == 1);
  }
  EXPECT_EQ(positive[0], positive[1]);
  EXPECT_EQ(stats[0].jit_launches, 1u);
  EXPECT_EQ(stats[0].inplace_reuses, 1u);
  EXPECT_EQ(stats[1].inplace_reuses, 1u);
  // The kernel is compiled for this machine (-march=native): it streams where the CPU has AVX-512.
  EXPECT_EQ(stats[0].nontemporal_outputs, __builtin_cpu_supports("avx512f") ? 1u : 0u);
  EXPECT_EQ(kernel_sources_with(dir_ + "/cache", "constexpr std::uint64_t kChunk = 256;"), 1u);
}

// A program of three independent parts (an Adam-like update per "parameter": each reads its
// own p, g, m and writes p', m' in place over p and m), which also share one broadcast input
// (c, one element: it joins no parts). Large enough to run part by part: one launch, one
// kernel with three parts, each output bit-identical to the interpreter's and written over a
// consumed input of its own part.
TEST_F(JitTest, IndependentPartsRunOneAfterAnother) {
  constexpr std::size_t n = (std::size_t{1} << 16) + 37;
  std::vector<std::vector<float>> in;
  for (std::size_t k = 0; k < 9; ++k) in.push_back(sprinkled(n, 2.0f, 900 + k));
  in.push_back({0.125f});  // c
  const OutputsProgram parts = [](Session& s, const std::vector<TensorIr>& t) {
    constexpr auto RW = TensorStatus::ReadWrite;
    auto bin = [&](OpKind k, const TensorIr& x, const TensorIr& y) {
      return s.submit(ok(b::binary(Family::NumericFloat, k, x, y, s.id())));
    };
    auto sc = [&](OpKind k, const TensorIr& x, double v) {
      return s.submit(ok(b::scalar(Family::NumericFloat, k, x, ScalarIr::Float(v), s.id())));
    };
    const TensorIr& c = t[9];
    std::vector<TensorIr> outs;
    for (std::size_t k = 0; k < 3; ++k) {
      const TensorIr &p = t[3 * k], &g = t[3 * k + 1], &m = t[3 * k + 2];
      // Intermediates are consumed by their last use (as the API's drops do), so that each part
      // has as many consumed inputs (p, m) as outputs (p', m'); g stays the caller's.
      const TensorIr m2 = bin(OpKind::Numeric_Add, use(sc(OpKind::Numeric_MulScalar, use(m, RW), 0.9), RW),
                              use(bin(OpKind::Numeric_Mul, g, c), RW));
      const TensorIr g2 = sc(OpKind::Numeric_AddScalar, use(bin(OpKind::Numeric_Mul, g, g), RW), 1.0);
      const TensorIr step = bin(OpKind::Numeric_Div, m2, use(g2, RW));
      outs.push_back(bin(OpKind::Numeric_Sub, use(p, RW), use(step, RW)));
      outs.push_back(m2);
    }
    return outs;
  };
  const PartsRun r = run_parts(options(2), parts, in);
  ASSERT_EQ(r.jit.size(), 6u);
  for (std::size_t k = 0; k < r.jit.size(); ++k)
    expect_same_bits(BothRuns{r.jit[k], r.interp[k], r.jit_stats}, "output " + std::to_string(k), 0.0, false);
  EXPECT_EQ(r.jit_stats.jit_launches, 1u);
  EXPECT_EQ(r.jit_stats.part_by_part, 1u);
  EXPECT_EQ(r.jit_stats.inplace_reuses, 6u);
  EXPECT_EQ(kernel_sources_with(dir_ + "/cache", "if (F->by_component)"), 1u);

  // The same structure at a small size (cache-resident: the streams interleave for free) runs
  // as one pass.
  std::vector<std::vector<float>> small;
  for (std::size_t k = 0; k < 9; ++k) small.push_back(sprinkled(1000, 2.0f, 950 + k));
  small.push_back({0.125f});
  const PartsRun q = run_parts(options(2), parts, small);
  for (std::size_t k = 0; k < q.jit.size(); ++k)
    expect_same_bits(BothRuns{q.jit[k], q.interp[k], q.jit_stats}, "small output " + std::to_string(k), 0.0, false);
  EXPECT_EQ(q.jit_stats.jit_launches, 1u);
  EXPECT_EQ(q.jit_stats.part_by_part, 0u);
}

// Adam over 8 parameters, op for op as a training step sends it (the runtime benchmark's step):
// the trace limit splits it into two kernels, the second of which starts with half a parameter
// whose moments come back in from the first. Every output takes over a consumed input of its own
// part (first fit would write one part's output over another part's input there), so both
// launches run part by part, on the JIT and on the interpreter alike, and p, m and v match a
// plain computation on the host. Not a JitTest: without a compiler both sides are the
// interpreter, whose split is what a machine without one relies on.
TEST(Parts, AdamOverEightParametersRunsPartByPart) {
  constexpr std::size_t kParams = 8;
  constexpr std::size_t n = (std::size_t{1} << 14) + 11;
  constexpr double lr = 1e-3, b1 = 0.9, b2 = 0.999, eps = 1e-8, c1 = 0.1, c2 = 0.001;
  std::vector<std::vector<float>> in;  // per parameter: p, g, m, v
  std::mt19937_64 rng(300);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (std::size_t k = 0; k < 4 * kParams; ++k) {
    std::vector<float> v(n);
    for (float& x : v) x = k % 4 == 3 ? std::fabs(u(rng)) : u(rng);  // v >= 0
    in.push_back(std::move(v));
  }
  const OutputsProgram adam = [&](Session& s, const std::vector<TensorIr>& t) {
    constexpr auto RW = TensorStatus::ReadWrite;
    auto sc = [&](OpKind k, const TensorIr& x, double v) {
      return use(s.submit(ok(b::scalar(Family::NumericFloat, k, x, ScalarIr::Float(v), s.id()))), RW);
    };
    auto bin = [&](OpKind k, const TensorIr& x, const TensorIr& y) {
      return use(s.submit(ok(b::binary(Family::NumericFloat, k, x, y, s.id()))), RW);
    };
    auto ro = [](TensorIr x) { return use(std::move(x), TensorStatus::ReadOnly); };
    std::vector<TensorIr> outs;
    for (std::size_t k = 0; k < kParams; ++k) {
      const TensorIr &p = t[4 * k], &g = t[4 * k + 1], &m = t[4 * k + 2], &v = t[4 * k + 3];
      const TensorIr m2 = bin(OpKind::Numeric_Add, sc(OpKind::Numeric_MulScalar, use(m, RW), b1),
                              sc(OpKind::Numeric_MulScalar, g, 1 - b1));
      const TensorIr v2 = bin(OpKind::Numeric_Add, sc(OpKind::Numeric_MulScalar, use(v, RW), b2),
                              sc(OpKind::Numeric_MulScalar, bin(OpKind::Numeric_Mul, g, g), 1 - b2));
      const TensorIr mhat = sc(OpKind::Numeric_DivScalar, ro(m2), c1);
      const TensorIr vhat = sc(OpKind::Numeric_DivScalar, ro(v2), c2);
      const TensorIr sq = use(s.submit(ok(b::unary(Family::Float, OpKind::Float_Sqrt, vhat, s.id()))), RW);
      const TensorIr upd = bin(OpKind::Numeric_Div, mhat, sc(OpKind::Numeric_AddScalar, sq, eps));
      outs.push_back(ro(bin(OpKind::Numeric_Sub, use(p, RW), sc(OpKind::Numeric_MulScalar, upd, lr))));
      outs.push_back(ro(m2));
      outs.push_back(ro(v2));
    }
    return outs;
  };
  const bool jit = compiler_available();
  std::string dir = (fs::temp_directory_path() / "kiln-parts-test-XXXXXX").string();
  ASSERT_NE(::mkdtemp(dir.data()), nullptr);
  const PartsRun r = run_parts(
      CpuDeviceOptions{.threads = 1, .jit = jit ? CpuJitMode::On : CpuJitMode::Off, .jit_cache_dir = dir + "/cache"},
      adam, in);
  std::error_code ec;
  fs::remove_all(dir, ec);
  ASSERT_EQ(r.jit.size(), 3 * kParams);
  for (std::size_t k = 0; k < kParams; ++k) {
    std::size_t bad = 0;
    for (std::size_t i = 0; i < n && bad < 5; ++i) {
      const double g = in[4 * k + 1][i];
      const double m = b1 * in[4 * k + 2][i] + (1 - b1) * g;
      const double v = b2 * in[4 * k + 3][i] + (1 - b2) * g * g;
      const double p = in[4 * k][i] - lr * ((m / c1) / (std::sqrt(v / c2) + eps));
      const double want[3] = {p, m, v};
      for (std::size_t o = 0; o < 3; ++o)
        for (const std::vector<float>* side : {&r.jit[3 * k + o], &r.interp[3 * k + o]})
          if (std::fabs((*side)[i] - want[o]) > 1e-5 * (1 + std::fabs(want[o])) && ++bad <= 5)
            ADD_FAILURE() << "parameter " << k << " output " << o << " element " << i << ": " << (*side)[i] << ", want "
                          << want[o];
    }
  }
  for (const CpuDeviceStats& st : {r.jit_stats, r.interp_stats}) {
    EXPECT_EQ(st.fused_launches, 2u);
    EXPECT_EQ(st.part_by_part, 2u);
    EXPECT_EQ(st.inplace_reuses, 3 * kParams);  // p, m, v over their old buffers
  }
  if (jit) {
    EXPECT_EQ(r.jit_stats.jit_launches, 2u);
  }
}

// Parts with different loops, at a streaming size, on two threads: one part with exp (the
// blocked loop and its checked pass), one plain (the 256-position chunks), each with a fresh
// output written non-temporally, each pass with its own flags, fence and report.
TEST_F(JitTest, BlockedAndPlainPartsStreamTheirOwnOutputs) {
  const std::size_t n = (std::size_t{1} << 22) + 100;
  const OutputsProgram two = [](Session& s, const std::vector<TensorIr>& in) {
    constexpr auto RW = TensorStatus::ReadWrite;
    const TensorIr u = s.submit(ok(b::unary(Family::Float, OpKind::Float_Exp, in[0], s.id())));
    const TensorIr h =
        s.submit(ok(b::scalar(Family::NumericFloat, OpKind::Numeric_MulScalar, in[1], ScalarIr::Float(0.5), s.id())));
    const TensorIr w = s.submit(ok(b::binary(Family::NumericFloat, OpKind::Numeric_Sub, use(h, RW), in[2], s.id())));
    return std::vector<TensorIr>{u, w};
  };
  const PartsRun r =
      run_parts(options(2), two, {sprinkled(n, 30.0f, 61), sprinkled(n, 4.0f, 62), sprinkled(n, 4.0f, 63)});
  ASSERT_EQ(r.jit.size(), 2u);
  // NaN == NaN for exp: its AVX-512 form (the JIT's, -march=native) quiets a signalling NaN,
  // the scalar form of a build without AVX-512 (this test's interpreter in Debug) passes it on.
  expect_same_bits(BothRuns{r.jit[0], r.interp[0], r.jit_stats}, "exp part", 1e-4, false);
  expect_same_bits(BothRuns{r.jit[1], r.interp[1], r.jit_stats}, "plain part", 0.0, false);
  EXPECT_EQ(r.jit_stats.jit_launches, 1u);
  EXPECT_EQ(r.jit_stats.part_by_part, 1u);
  EXPECT_EQ(r.jit_stats.nontemporal_outputs, __builtin_cpu_supports("avx512f") ? 2u : 0u);
  EXPECT_EQ(kernel_sources_with(dir_ + "/cache", "fast::BlockCheck chk;"), 1u);
}

// Every output first takes a consumed input of its own part, before any takes another part's:
// a1 = x + 1 and a2 = x * 2 (x consumed) have one input between them, b = y + 3 (y consumed)
// its own. Output by output, a2 would take y and leave b a fresh buffer, and the launch could
// not split; with the own-part round first for all outputs, b takes y and a2 gets a fresh one.
TEST_F(JitTest, OwnPartsInputsAreTakenBeforeAnyOutputTakesAnotherPartsInput) {
  constexpr std::size_t n = (std::size_t{1} << 15) + 3;
  const OutputsProgram prog = [](Session& s, const std::vector<TensorIr>& in) {
    constexpr auto RW = TensorStatus::ReadWrite;
    auto sc = [&](OpKind k, const TensorIr& x, double v) {
      return s.submit(ok(b::scalar(Family::NumericFloat, k, x, ScalarIr::Float(v), s.id())));
    };
    const TensorIr a1 = sc(OpKind::Numeric_AddScalar, in[0], 1.0);
    const TensorIr a2 = sc(OpKind::Numeric_MulScalar, use(in[0], RW), 2.0);
    const TensorIr bb = sc(OpKind::Numeric_AddScalar, use(in[1], RW), 3.0);
    return std::vector<TensorIr>{a1, a2, bb};
  };
  const PartsRun r = run_parts(options(1), prog, {sprinkled(n, 2.0f, 71), sprinkled(n, 2.0f, 72)});
  ASSERT_EQ(r.jit.size(), 3u);
  for (std::size_t k = 0; k < 3; ++k)
    expect_same_bits(BothRuns{r.jit[k], r.interp[k], r.jit_stats}, "output " + std::to_string(k), 0.0, true);
  for (const CpuDeviceStats& st : {r.jit_stats, r.interp_stats}) {
    EXPECT_EQ(st.inplace_reuses, 2u);
    EXPECT_EQ(st.part_by_part, 1u);
  }
}

// Two parts where one part's output takes over the buffer of an input that only the other part
// reads: w = y + z consumes y and z and is written over y (its own part's input), u = x * 3 - 0.5
// (x kept) has no input of its own and takes z. One pass reads z[i] before writing u[i]; part by
// part, u would overwrite all of z before w reads it. The launch sees the overlap and runs the
// kernel in one pass, on the JIT and on the interpreter.
TEST_F(JitTest, PartsRunTogetherWhenOneWritesWhatAnotherReads) {
  constexpr std::size_t n = (std::size_t{1} << 16) + 5;
  const OutputsProgram crossed = [](Session& s, const std::vector<TensorIr>& in) {
    constexpr auto RW = TensorStatus::ReadWrite;
    const TensorIr u =
        s.submit(ok(b::scalar(Family::NumericFloat, OpKind::Numeric_MulScalar, in[0], ScalarIr::Float(3.0), s.id())));
    const TensorIr w =
        s.submit(ok(b::binary(Family::NumericFloat, OpKind::Numeric_Add, use(in[1], RW), use(in[2], RW), s.id())));
    const TensorIr u2 = s.submit(
        ok(b::scalar(Family::NumericFloat, OpKind::Numeric_SubScalar, use(u, RW), ScalarIr::Float(0.5), s.id())));
    return std::vector<TensorIr>{u2, w};
  };
  const PartsRun r =
      run_parts(options(1), crossed, {sprinkled(n, 2.0f, 31), sprinkled(n, 2.0f, 32), sprinkled(n, 2.0f, 33)});
  ASSERT_EQ(r.jit.size(), 2u);
  expect_same_bits(BothRuns{r.jit[0], r.interp[0], r.jit_stats}, "u", 0.0, true);
  expect_same_bits(BothRuns{r.jit[1], r.interp[1], r.jit_stats}, "w", 0.0, false);
  // w = y + z, checked on the host too: both sides would agree on a z overwritten by u.
  const std::vector<float> ys = sprinkled(n, 2.0f, 32), zs = sprinkled(n, 2.0f, 33);
  for (std::size_t i = 0; i < n; ++i) {
    const float want = ys[i] + zs[i];
    if (!(r.jit[1][i] == want || (std::isnan(want) && std::isnan(r.jit[1][i])))) {
      ADD_FAILURE() << "w[" << i << "] = " << r.jit[1][i] << ", want " << want;
      break;
    }
  }
  for (const CpuDeviceStats& st : {r.jit_stats, r.interp_stats}) {
    EXPECT_EQ(st.inplace_reuses, 2u);  // w over y, u over z
    EXPECT_EQ(st.part_by_part, 0u);
  }
  EXPECT_EQ(r.jit_stats.jit_launches, 1u);
  EXPECT_EQ(kernel_sources_with(dir_ + "/cache", "if (F->by_component)"), 1u);
}

// The kernels' element loops over fast_math.h's functions vectorise under the kernels' own flags
// (jit::compile_flags()). Without -fno-trapping-math GCC kept the functions' selects as branches
// on AVX2 (no masked vectors): exp / log / log1p / tanh ran one element at a time, W1 at 5-7 ns
// per element instead of ~1. GCC's -fopt-info reports each loop; other compilers skip.
TEST_F(JitTest, TheMathFunctionsLoopsVectoriseUnderTheKernelFlags) {
  const fs::path source = fs::path(dir_) / "vectorise.cc";
  const fs::path report = fs::path(dir_) / "vectorise.txt";
  {
    std::ofstream out(source);
    for (const char* part : jit::kPreludeParts) out << part << "\n";
    out << "namespace probe {\n";
    for (const char* fn : {"exp_f32", "log_f32", "log1p_f32", "tanh_f32"})
      out << "void " << fn << "_loop(const float* __restrict a, float* __restrict b, int n) {\n"
          << "  for (int i = 0; i < n; ++i) b[i] = kiln::cpu::fast::" << fn << "(a[i]);  // probe:" << fn << "\n}\n";
    out << "}  // namespace probe\n";
  }
  const std::string compiler = compiler_on_path();
  std::string command = compiler;
  for (const std::string& flag : jit::compile_flags())
    if (flag != "-shared" && flag != "-w") command += " " + flag;
  command += " -c -o " + (fs::path(dir_) / "vectorise.o").string() + " -fopt-info-vec-optimized=" + report.string() +
             " " + source.string() + " 2>/dev/null";
  const std::string version_file = (fs::path(dir_) / "version.txt").string();
  ASSERT_EQ(std::system((compiler + " --version > " + version_file + " 2>&1").c_str()), 0);
  std::ifstream version_in(version_file);
  const std::string version((std::istreambuf_iterator<char>(version_in)), std::istreambuf_iterator<char>());
  if (version.find("Free Software Foundation") == std::string::npos)
    GTEST_SKIP() << compiler << " is not GCC: -fopt-info is GCC's";
  ASSERT_EQ(std::system(command.c_str()), 0) << command;

  // Map each probe's line number to its function, then find a "loop vectorized" report on it.
  std::ifstream src_in(source);
  std::map<int, std::string> probe_lines;
  std::string line;
  for (int number = 1; std::getline(src_in, line); ++number)
    if (auto at = line.find("// probe:"); at != std::string::npos) probe_lines[number] = line.substr(at + 9);
  ASSERT_EQ(probe_lines.size(), 4u);
  std::ifstream report_in(report);
  std::set<std::string> vectorised;
  while (std::getline(report_in, line)) {
    if (line.find("loop vectorized") == std::string::npos) continue;
    for (const auto& [number, fn] : probe_lines)
      if (line.find("vectorise.cc:" + std::to_string(number) + ":") != std::string::npos) vectorised.insert(fn);
  }
  for (const auto& [number, fn] : probe_lines)
    EXPECT_TRUE(vectorised.contains(fn)) << fn << " stays scalar in a kernel";
}

// Off unless asked for: the default device options never run a compiler.
TEST(JitDefaults, OffByDefault) {
  if (std::getenv("KILN_CPU_JIT") != nullptr) GTEST_SKIP() << "KILN_CPU_JIT overrides the option";
  CpuDevice device;
  EXPECT_FALSE(device.jit_enabled());
  EXPECT_TRUE(CpuDevice(CpuDeviceOptions{.jit = CpuJitMode::Auto}).jit_enabled());
}

}  // namespace
}  // namespace kiln::cpu
