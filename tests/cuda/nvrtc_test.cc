// Every kind of generated kernel compiles through NVRTC, for sm_90 and for the oldest
// architecture this NVRTC supports: single operations across dtypes and broadcast patterns, and
// the programs the real fusers build (elementwise chains, reductions with prologue and
// epilogue, softmax, matmul with epilogue, views, indexed reads). No GPU needed.
//
// NVRTC spends most of its time per translation unit, not per kernel, so programs are batched
// into a few units (distinct kernel name prefixes); a failing unit is recompiled program by
// program to name the culprit.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <set>
#include <thread>

#include "kiln/cuda/codegen.h"
#include "kiln/cuda/nvrtc.h"
#include "kiln/testing/status.h"
#include "programs.h"

namespace kiln::cuda {
namespace {

using testing::NamedProgram;

int oldest_arch() {
  const std::vector<int> archs = nvrtc_supported_archs();
  return archs.empty() ? 0 : archs.front();
}

std::vector<int> target_archs() { return {oldest_arch(), 90}; }

TEST(Nvrtc, ReportsVersionAndArchitectures) {
  EXPECT_GE(nvrtc_version(), 12000);
  const std::vector<int> archs = nvrtc_supported_archs();
  ASSERT_FALSE(archs.empty());
  EXPECT_TRUE(std::is_sorted(archs.begin(), archs.end()));
  EXPECT_NE(std::find(archs.begin(), archs.end(), 90), archs.end()) << "sm_90 must be a target";
  std::printf("NVRTC %d, oldest architecture sm_%d\n", nvrtc_version(), archs.front());
}

TEST(Nvrtc, CompileErrorsComeBackWithTheLog) {
  Result<CompiledCode> c =
      nvrtc_compile("extern \"C\" __global__ void k() { this is not cuda; }", "bad.cu", {.arch = 90});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error().code, ErrorCode::Execution);
  EXPECT_NE(c.error().message.find("bad.cu"), std::string::npos) << c.error().message;
  Result<CompiledCode> d = nvrtc_compile("", "empty.cu", {.arch = 12345});
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.error().code, ErrorCode::Unsupported);
}

// The prelude's structs have launch_abi.h's sizes and alignments on the device compiler's side
// (NVRTC has no offsetof; codegen_test checks that the members are spelled in the same order).
TEST(Nvrtc, PreludeStructsMatchTheHostAbi) {
  std::string src(prelude());
  src += R"(
static_assert(sizeof(KilnIter) == 80 && alignof(KilnIter) == 8, "KilnIter");
static_assert(sizeof(KilnAccess) == 72 && alignof(KilnAccess) == 8, "KilnAccess");
static_assert(sizeof(KilnReduceShape) == 32, "KilnReduceShape");
static_assert(sizeof(KilnMatmulShape) == 232, "KilnMatmulShape");
static_assert(sizeof(KilnIndexed) == 136, "KilnIndexed");
static_assert(sizeof(KilnVec<__half, 8>) == 16 && alignof(KilnVec<__half, 8>) == 16, "KilnVec");
extern "C" __global__ void kiln_abi_probe() {}
)";
  for (int arch : target_archs()) {
    Result<CompiledCode> c = nvrtc_compile(src, "abi.cu", {.arch = arch});
    ASSERT_TRUE(c.ok()) << c.error().message;
    EXPECT_TRUE(c->is_cubin);
    EXPECT_GT(c->bytes.size(), 0u);
  }
}

struct Unit {
  std::string source;
  std::vector<std::size_t> members;  // catalog indices
};

// A representative subset (KILN_NVRTC_FULL=1: everything): the first program of each operation
// (its name without the dtype), the first of each dtype, and every 12th program. NVRTC needs
// ~0.15 s per program and architecture on the 2-core VM; the whole catalog takes ~2.5 minutes.
std::vector<NamedProgram> sample(std::vector<NamedProgram> all) {
  const char* full = std::getenv("KILN_NVRTC_FULL");
  if (full != nullptr && std::string(full) == "1") return all;
  std::set<std::string> ops, dtypes;
  std::vector<NamedProgram> out;
  for (std::size_t i = 0; i < all.size(); ++i) {
    const std::string& n = all[i].name;
    const std::size_t sp = n.find(' ');
    const std::string dtype = n.substr(0, sp);
    const std::string op = sp == std::string::npos ? n : n.substr(sp + 1);
    const bool keep = ops.insert(op).second || dtypes.insert(dtype).second || i % 12 == 0;
    if (keep) out.push_back(std::move(all[i]));
  }
  return out;
}

void compile_catalog(const std::vector<NamedProgram>& catalog, std::size_t per_unit) {
  std::vector<std::string> bodies(catalog.size());
  std::set<KernelRole> roles;
  std::size_t kernels = 0;
  for (std::size_t i = 0; i < catalog.size(); ++i) {
    Result<GeneratedProgram> g = generate(catalog[i].program, {.name_prefix = "p" + std::to_string(i)});
    ASSERT_TRUE(g.ok()) << catalog[i].name << ": " << g.error().message << "\n" << catalog[i].program.to_string();
    bodies[i] = g->body;
    for (const KernelSpec& k : g->kernels) roles.insert(k.role);
    kernels += g->kernels.size();
  }
  std::vector<Unit> units;
  for (std::size_t i = 0; i < catalog.size(); ++i) {
    if (units.empty() || units.back().members.size() == per_unit) units.push_back(Unit{std::string(prelude()), {}});
    units.back().source += bodies[i];
    units.back().members.push_back(i);
  }
  // Units compile on two threads (NVRTC programs are independent); failures are collected and
  // reported on the test thread (gtest assertions are not made from the workers).
  struct Job {
    int arch;
    std::size_t unit;
  };
  std::vector<Job> jobs;
  for (int arch : target_archs())
    for (std::size_t u = 0; u < units.size(); ++u) jobs.push_back(Job{arch, u});
  std::vector<std::string> failures(jobs.size());
  std::atomic<std::size_t> next{0};
  const auto t0 = std::chrono::steady_clock::now();
  auto worker = [&] {
    for (std::size_t j = next.fetch_add(1); j < jobs.size(); j = next.fetch_add(1)) {
      const Job& job = jobs[j];
      Result<CompiledCode> c = nvrtc_compile(units[job.unit].source, "catalog.cu", {.arch = job.arch});
      if (c.ok()) continue;
      std::string f = "unit failed for sm_" + std::to_string(job.arch) + ": " + c.error().message.substr(0, 2000);
      for (std::size_t i : units[job.unit].members) {  // name the culprit(s)
        Result<CompiledCode> one = nvrtc_compile(std::string(prelude()) + bodies[i], "one.cu", {.arch = job.arch});
        if (!one.ok())
          f += "\n--- " + catalog[i].name + ":\n" + one.error().message + "\n" + catalog[i].program.to_string() + "\n" +
               bodies[i];
      }
      failures[j] = std::move(f);
    }
  };
  std::thread helper(worker);
  worker();
  helper.join();
  for (const std::string& f : failures) EXPECT_TRUE(f.empty()) << f;
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("sm_%d and sm_90: %zu programs, %zu kernels, %zu translation units each, %.1f s on 2 threads\n",
              oldest_arch(), catalog.size(), kernels, units.size(), secs);
  (void)roles;
}

TEST(Nvrtc, EverySingleOperationKernelCompiles) {
  const std::vector<NamedProgram> all = testing::single_op_catalog();
  ASSERT_GT(all.size(), 300u);
  const std::vector<NamedProgram> catalog = sample(all);
  compile_catalog(catalog, 48);
}

TEST(Nvrtc, EveryFusedProgramKindCompiles) {
  const std::vector<NamedProgram> catalog = testing::fused_catalog();
  std::set<fusion::ProgramKind> kinds;
  std::set<KernelRole> roles;
  for (const NamedProgram& p : catalog) {
    kinds.insert(p.program.kind);
    Result<GeneratedProgram> g = generate(p.program);
    if (g.ok())
      for (const KernelSpec& k : g->kernels) roles.insert(k.role);
  }
  EXPECT_TRUE(kinds.count(fusion::ProgramKind::Elementwise));
  EXPECT_TRUE(kinds.count(fusion::ProgramKind::Reduce));
  EXPECT_TRUE(kinds.count(fusion::ProgramKind::Matmul));
  EXPECT_EQ(roles.size(), 8u) << "every kernel role: strided, vector, row vector, rows, cols, matmul, row, row warp";
  compile_catalog(catalog, 32);
}

TEST(Nvrtc, FastMathKernelsCompile) {
  for (const NamedProgram& p : testing::fused_catalog()) {
    if (p.name != "f32 W1") continue;
    Result<GeneratedProgram> g = generate(p.program, {.fast_math = true});
    KILN_ASSERT_OK(g);
    ASSERT_NE(g->body.find("__expf("), std::string::npos);
    Result<CompiledCode> c = nvrtc_compile(g->source(), "fast.cu", {.arch = 90});
    ASSERT_TRUE(c.ok()) << c.error().message;
    EXPECT_TRUE(c->is_cubin);
    return;
  }
  FAIL() << "no f32 W1 in the catalog";
}

TEST(Nvrtc, PtxForForwardCompatibility) {
  const std::vector<NamedProgram> catalog = testing::fused_catalog();
  ASSERT_FALSE(catalog.empty());
  Result<GeneratedProgram> g = generate(catalog[0].program);
  KILN_ASSERT_OK(g);
  Result<CompiledCode> c = nvrtc_compile(g->source(), "ptx.cu", {.arch = 90, .cubin = false});
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_FALSE(c->is_cubin);
  const std::string ptx(reinterpret_cast<const char*>(c->bytes.data()));
  EXPECT_NE(ptx.find(".entry kiln_s0_ew"), std::string::npos);
}

}  // namespace
}  // namespace kiln::cuda
