// The CPU JIT (cpu/src/jit.h): compiled kernels against the reference executor on random fused
// programs (the differential generator, several sizes and scalars per structure), directed
// programs (broadcast / strided inputs, every float dtype, integers and bools, a kernel fault,
// a declined indexed program), one kernel per structure across sizes and scalars, and the disk
// cache (a new device loads without compiling; a corrupt entry is rebuilt).
//
// Each new structure costs one compiler run (~0.3-1 s), so the random part is small; run more
// with KILN_JIT_TEST_STRUCTURES=<n>. Skipped when no C++ compiler is on PATH or KILN_CPU_JIT=0.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "differential_util.h"

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

bool compiler_available() {
  const char* env = std::getenv("KILN_CPU_JIT");
  if (env != nullptr && env[0] == '0') return false;
  const char* path = std::getenv("PATH");
  std::string p = path != nullptr ? path : "";
  std::size_t from = 0;
  while (from <= p.size()) {
    const std::size_t to = std::min(p.find(':', from), p.size());
    const std::string dir = p.substr(from, to - from);
    for (const char* name : {"c++", "g++"})
      if (!dir.empty() && ::access((dir + "/" + name).c_str(), X_OK) == 0) return true;
    from = to + 1;
  }
  return false;
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
Operation ok(Result<Operation> r) {
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().to_string());
  return std::move(r).value();
}

struct Session : FusedSide {
  std::uint64_t next = 1;
  explicit Session(CpuDeviceOptions o) : FusedSide(std::move(o)) {}
  TensorId id() { return TensorId{next++}; }
  TensorIr input(Shape shape, const std::vector<double>& values, DType d = dt::f32) {
    TensorIr t{id(), std::move(shape), TensorStatus::ReadOnly, d};
    EXPECT_TRUE(device.upload_f64(t.id, t.shape, d, values).ok());
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
  std::printf("[jit] %llu structures x %llu instances: %llu JIT launches, %llu kernels, %llu declined, %llu "
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
// broadcast output: the kernel's general path.
TEST_F(JitTest, BroadcastAndStridedInputs) {
  Session s(options());
  const std::size_t m = 70, n = 90;
  const auto rv = iota(n, 1, 0.5), cv = iota(m, 1, -0.25), xv = iota(m * n, 2, -1), wv = iota(n * m, 1.5, -0.5);
  const TensorIr row = s.input({1, n}, rv), col = s.input({m, 1}, cv), x = s.input({m, n}, xv),
                 w = s.input({n, m}, wv);
  const TensorIr a = s.submit(ok(b::binary(Family::NumericFloat, OpKind::Numeric_Add, x, row, s.id())));
  const TensorIr wt = s.submit(ok(b::swap_dims(Family::BaseFloat, OpKind::Base_SwapDims, w, 0, 1, s.id())));
  const TensorIr c = s.submit(ok(b::binary(Family::NumericFloat, OpKind::Numeric_Mul, use(a, TensorStatus::ReadWrite),
                                           use(wt, TensorStatus::ReadWrite), s.id())));
  const TensorIr r2 =
      s.submit(ok(b::scalar(Family::NumericFloat, OpKind::Numeric_MulScalar, row, ScalarIr::Float(3.0), s.id())));
  const TensorIr d = s.submit(ok(b::binary(Family::NumericFloat, OpKind::Numeric_Sub, use(c, TensorStatus::ReadWrite),
                                           col, s.id())));
  const TensorIr y = s.submit(ok(b::binary(Family::NumericFloat, OpKind::Numeric_Mul, use(d, TensorStatus::ReadWrite),
                                           r2, s.id())));
  const std::vector<double> yv = s.read(y);
  const std::vector<double> r2v = s.read(r2);
  for (std::size_t j = 0; j < n; ++j) ASSERT_EQ(r2v[j], static_cast<float>(rv[j]) * 3.0f);
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = 0; j < n; ++j) {
      const float av = static_cast<float>(xv[i * n + j]) + static_cast<float>(rv[j]);
      const float cvv = av * static_cast<float>(wv[j * m + i]);
      const float dv = cvv - static_cast<float>(cv[i]);
      ASSERT_EQ(yv[i * n + j], dv * (static_cast<float>(rv[j]) * 3.0f)) << i << "," << j;
    }
  EXPECT_GE(s.device.stats().jit_launches, 1u);
  EXPECT_EQ(s.device.stats().fused_replays, 0u);
}

// f16 / bf16 / f64 (rounding after each instruction, libm functions rounded once), integers
// (wrapping i8 arithmetic) and bools: bit-identical to the reference.
TEST_F(JitTest, EveryDtypeMatchesTheReference) {
  for (DType d : {dt::f16, dt::bf16, dt::f64, dt::flex32}) {
    Session s(options(1));
    const std::size_t n = 3000;
    const TensorIr x = s.input({n}, iota(n, 4, -2), d), z = s.input({n}, iota(n, 3, -1), d);
    const TensorIr t = s.submit(ok(b::binary(Family::NumericFloat, OpKind::Numeric_Mul, x, z, s.id())));
    const TensorIr u = s.submit(ok(b::unary(Family::Float, OpKind::Float_Sin, use(t, TensorStatus::ReadWrite), s.id())));
    const TensorIr v = s.submit(ok(b::scalar(Family::NumericFloat, OpKind::Numeric_AddScalar,
                                             use(u, TensorStatus::ReadWrite), ScalarIr::Float(0.1), s.id())));
    const TensorIr y = s.submit(ok(b::binary(Family::NumericFloat, OpKind::Numeric_Div, use(v, TensorStatus::ReadWrite),
                                             x, s.id())));
    const std::vector<double> got = s.read(y);
    // The same ops on the reference executor.
    CpuDevice ref(CpuDeviceOptions{.threads = 1});
    const std::vector<Operation> ops = {
        ok(b::binary(Family::NumericFloat, OpKind::Numeric_Mul, x, z, t.id)),
        ok(b::unary(Family::Float, OpKind::Float_Sin, use(t, TensorStatus::ReadWrite), u.id)),
        ok(b::scalar(Family::NumericFloat, OpKind::Numeric_AddScalar, use(u, TensorStatus::ReadWrite),
                     ScalarIr::Float(0.1), v.id)),
        ok(b::binary(Family::NumericFloat, OpKind::Numeric_Div, use(v, TensorStatus::ReadWrite), x, y.id))};
    ASSERT_TRUE(ref.upload_f64(x.id, x.shape, d, iota(n, 4, -2)).ok());
    ASSERT_TRUE(ref.upload_f64(z.id, z.shape, d, iota(n, 3, -1)).ok());
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
  const TensorIr g = s.submit(ok(b::binary_comparison(Family::NumericInt, OpKind::Numeric_Greater, q, a,
                                                      dt::boolean, s.id())));
  const TensorIr y = s.submit(ok(b::mask_fill(Family::BaseInt, OpKind::Base_MaskFill, use(q, TensorStatus::ReadWrite),
                                              g, ScalarIr::Int(-7), s.id())));
  s.sync();
  const std::vector<std::int64_t> yv = *s.device.download_i64(y.id);
  const std::vector<bool> gv = *s.device.download_bool(g.id);
  for (std::size_t i = 0; i < n; ++i) {
    const auto qv = static_cast<std::int8_t>(static_cast<std::int8_t>(static_cast<int>(av[i]) * static_cast<int>(cv[i])) + 100);
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
    const float want = (static_cast<float>(xv[i]) * 2.0f) *
                       static_cast<float>(tv[(i / n) * 3 + static_cast<std::size_t>(iv[i])]);
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
  {
    std::ofstream(libs[0], std::ios::binary | std::ios::trunc) << "not a shared library";
  }
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

// Off unless asked for: the default device options never run a compiler.
TEST(JitDefaults, OffByDefault) {
  if (std::getenv("KILN_CPU_JIT") != nullptr) GTEST_SKIP() << "KILN_CPU_JIT overrides the option";
  CpuDevice device;
  EXPECT_FALSE(device.jit_enabled());
  EXPECT_TRUE(CpuDevice(CpuDeviceOptions{.jit = CpuJitMode::Auto}).jit_enabled());
}

}  // namespace
}  // namespace kiln::cpu
