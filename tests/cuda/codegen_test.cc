// The CUDA generator without NVRTC: determinism, independence from sizes and scalar values,
// the kernels each program kind gets, parameter lists, and what it refuses.
// KILN_CUDA_DUMP=1 prints every generated source of the fused catalog.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <set>

#include "kiln/cuda/codegen.h"
#include "kiln/cuda/launch_abi.h"
#include "kiln/testing/status.h"
#include "programs.h"

namespace kiln::cuda {
namespace {

using testing::NamedProgram;

bool dump() {
  const char* d = std::getenv("KILN_CUDA_DUMP");
  return d != nullptr && std::string(d) == "1";
}

TEST(Codegen, EveryCatalogProgramGeneratesDeterministically) {
  std::vector<NamedProgram> all = testing::fused_catalog();
  std::vector<NamedProgram> singles = testing::single_op_catalog();
  for (NamedProgram& p : singles) all.push_back(std::move(p));
  for (const NamedProgram& p : all) {
    Result<GeneratedProgram> a = generate(p.program);
    ASSERT_TRUE(a.ok()) << p.name << ": " << a.error().message;
    Result<GeneratedProgram> b = generate(p.program);
    KILN_ASSERT_OK(b);
    EXPECT_EQ(a->body, b->body) << p.name;
    EXPECT_FALSE(a->kernels.empty()) << p.name;
    EXPECT_EQ(a->source().rfind(std::string(prelude()), 0), 0u);
    for (const KernelSpec& k : a->kernels) {
      EXPECT_NE(a->body.find("void __launch_bounds__(256) " + k.name + "("), std::string::npos) << k.name;
      ASSERT_FALSE(k.params.empty());
      const bool row = k.role == KernelRole::RowFused || k.role == KernelRole::RowFusedWarp;
      EXPECT_EQ(k.params.back().kind, row ? ParamKind::RowLength : ParamKind::Fault);
    }
    if (dump() && !p.single)
      std::printf("==== %s\n%s\n%s\n", p.name.c_str(), p.program.to_string().c_str(), a->body.c_str());
  }
}

// Sizes and scalar values are parameters: the program of another size or scalar has the same
// structure, hence the same source (and kernel cache entry).
TEST(Codegen, SourceDoesNotDependOnSizesOrScalars) {
  auto w1 = [](ir::Shape s, double scalar) {
    using namespace testing;
    Recorder r;
    std::vector<NamedProgram> out;
    const ir::DType d = dt::f32;
    TensorIr a = r.input(s, d), bb = r.input(s, d), c = r.input(s, d);
    TensorIr t1 = r.add(ok(b::binary(Family::NumericFloat, OpKind::Numeric_Mul, a, bb, r.id())));
    TensorIr t2 =
        r.add(ok(b::scalar(Family::NumericFloat, OpKind::Numeric_MulScalar, c, ScalarIr::Float(scalar), r.id())));
    TensorIr t3 = r.add(ok(b::binary(Family::NumericFloat, OpKind::Numeric_Add, use(t1, TensorStatus::ReadWrite),
                                     use(t2, TensorStatus::ReadWrite), r.id())));
    (void)r.add(ok(b::unary(Family::Float, OpKind::Float_Exp, use(t3, TensorStatus::ReadWrite), r.id())));
    r.finish("w1", out);
    EXPECT_EQ(out.size(), 1u);
    return out.empty() ? fusion::FusedProgram{} : out[0].program;
  };
  const fusion::FusedProgram p1 = w1({64, 32}, 2.0), p2 = w1({1000, 7}, -3.5);
  EXPECT_EQ(p1.structural_hash(), p2.structural_hash());
  Result<GeneratedProgram> g1 = generate(p1), g2 = generate(p2);
  ASSERT_TRUE(g1.ok() && g2.ok());
  EXPECT_EQ(g1->body, g2->body);
  ASSERT_EQ(g1->scalars.size(), 1u);
  EXPECT_EQ(g1->scalars[0].cls, ScalarClass::F32);
  // W1: a strided and a vector kernel, 16-byte vectors of 4 floats, exp in f32.
  ASSERT_EQ(g1->kernels.size(), 2u);
  EXPECT_EQ(g1->kernels[0].role, KernelRole::ElementwiseStrided);
  EXPECT_EQ(g1->kernels[1].role, KernelRole::ElementwiseVector);
  EXPECT_EQ(g1->kernels[1].vector_width, 4u);
  EXPECT_NE(g1->body.find("expf("), std::string::npos);
  EXPECT_NE(g1->body.find("KilnVec<float, 4>"), std::string::npos);
  EXPECT_FALSE(g1->may_fault);
  ASSERT_EQ(g1->stages.size(), 1u);
  EXPECT_EQ(g1->stages[0].vector_width, 4u);
}

// fast_math swaps the f32 exp and log for the hardware approximations and nothing else: f64
// keeps the library functions, the other instructions are the same text.
TEST(Codegen, FastMathSwapsOnlyF32ExpAndLog) {
  int f32_seen = 0, f64_seen = 0;
  for (const NamedProgram& p : testing::single_op_catalog()) {
    std::string name = p.name;
    for (char& ch : name) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    const bool f32 = name.rfind("f32 ", 0) == 0, f64 = name.rfind("f64 ", 0) == 0;
    const bool exp = name.substr(4) == "exp", log = name.substr(4) == "log";
    if (!(f32 || f64) || !(exp || log)) continue;
    Result<GeneratedProgram> accurate = generate(p.program), fast = generate(p.program, {.fast_math = true});
    ASSERT_TRUE(accurate.ok() && fast.ok()) << p.name;
    const std::string lib = exp ? "expf(" : "logf(", approx = exp ? "__expf(" : "__logf(";
    if (f32) {
      ++f32_seen;
      EXPECT_NE(accurate->body.find("(" + lib), std::string::npos) << p.name;
      EXPECT_EQ(accurate->body.find(approx), std::string::npos) << p.name;
      EXPECT_NE(fast->body.find(approx), std::string::npos) << p.name;
      EXPECT_EQ(fast->body.find("(" + lib), std::string::npos) << p.name;
      std::string undo = fast->body;
      for (std::size_t at; (at = undo.find(approx)) != std::string::npos;) undo.replace(at, approx.size(), lib);
      EXPECT_EQ(undo, accurate->body) << p.name << ": only the function names differ";
    } else {
      ++f64_seen;
      EXPECT_EQ(fast->body, accurate->body) << p.name;
    }
  }
  EXPECT_GE(f32_seen, 2);
  EXPECT_GE(f64_seen, 2);
}

// Elementwise blocks with broadcast loads get the row-vector kernel (every load a vector or a
// repeated element, chosen by its innermost stride at run time); blocks without get none.
TEST(Codegen, BroadcastBlocksGetTheRowVectorKernel) {
  int with = 0, without = 0;
  for (const NamedProgram& p : testing::fused_catalog()) {
    if (p.program.kind != fusion::ProgramKind::Elementwise) continue;
    bool broadcast = false;
    for (const fusion::Load& l : p.program.blocks[0].loads) broadcast = broadcast || l.broadcast;
    Result<GeneratedProgram> g = generate(p.program);
    ASSERT_TRUE(g.ok()) << p.name;
    const auto row = std::find_if(g->kernels.begin(), g->kernels.end(),
                                  [](const KernelSpec& k) { return k.role == KernelRole::ElementwiseRowVector; });
    const bool has_vector = g->stages[0].vector_width > 0;
    if (broadcast && has_vector) {
      ++with;
      ASSERT_NE(row, g->kernels.end()) << p.name;
      EXPECT_EQ(row->vector_width, g->stages[0].row_vector_width) << p.name;
      EXPECT_GT(row->vector_width, 0u);
      EXPECT_NE(g->body.find("kiln_s0_rowvec("), std::string::npos);
      EXPECT_NE(g->body.find("const bool whole0 = la0_0.strides[last] != 0;"), std::string::npos)
          << "the per-load stride test";
    } else if (!broadcast) {
      ++without;
      EXPECT_EQ(row, g->kernels.end()) << p.name;
      EXPECT_EQ(g->stages[0].row_vector_width, 0u) << p.name;
    }
  }
  EXPECT_GE(with, 1);
  EXPECT_GE(without, 1);
}

TEST(Codegen, KernelsPerProgramKind) {
  std::set<std::string> seen;
  for (const NamedProgram& p : testing::fused_catalog()) {
    Result<GeneratedProgram> g = generate(p.program);
    ASSERT_TRUE(g.ok()) << p.name;
    std::vector<KernelRole> roles;
    for (const KernelSpec& k : g->kernels) roles.push_back(k.role);
    switch (p.program.kind) {
      case fusion::ProgramKind::Reduce:
        EXPECT_EQ(roles, (std::vector<KernelRole>{KernelRole::ReduceRows, KernelRole::ReduceCols})) << p.name;
        EXPECT_FALSE(g->may_fault) << p.name
                                   << ": a reduction never faults in its kernel (the host leaves "
                                      "empty ones without an identity to the reference), so it needs no sync";
        break;
      case fusion::ProgramKind::Matmul:
        EXPECT_EQ(roles, (std::vector<KernelRole>{KernelRole::Matmul})) << p.name;
        break;
      case fusion::ProgramKind::ReduceBroadcasted:
        EXPECT_EQ(g->stages.size(), p.program.stages.size());
        EXPECT_FALSE(g->row_kernel.has_value() || g->row_warp_kernel.has_value()) << p.name;
        break;
      case fusion::ProgramKind::Row:
        EXPECT_EQ(g->stages.size(), p.program.stages.size());
        ASSERT_TRUE(g->row_kernel.has_value()) << p.name << ": " << g->row_kernel_refused;
        ASSERT_TRUE(g->row_warp_kernel.has_value()) << p.name;
        EXPECT_EQ(g->kernels[*g->row_kernel].role, KernelRole::RowFused) << p.name;
        EXPECT_EQ(g->kernels[*g->row_warp_kernel].role, KernelRole::RowFusedWarp) << p.name;
        break;
      default: break;
    }
    seen.insert(std::string(fusion::program_kind_name(p.program.kind)));
  }
  EXPECT_TRUE(seen.count("Reduce") && seen.count("Matmul") && seen.count("ElementWise"));
  EXPECT_TRUE(seen.count("Row")) << "the softmax programs, with the row fuser's leading reduction";
}

// A Row program's one kernel: each stage a __device__ part over one row, called in stage order
// with a barrier between stages; its parameters are every stage's own list (tagged with the
// stage, in the stages' order, each ending with its fault word), then the row space.
TEST(Codegen, RowProgramsGetOneKernelCallingTheirStagesInOrder) {
  std::set<std::string> covered;
  for (const NamedProgram& p : testing::fused_catalog()) {
    if (p.program.kind != fusion::ProgramKind::Row) continue;
    Result<GeneratedProgram> g = generate(p.program);
    KILN_ASSERT_OK(g);
    ASSERT_TRUE(g->row_kernel.has_value()) << p.name << ": " << g->row_kernel_refused;
    ASSERT_TRUE(g->row_warp_kernel.has_value()) << p.name;
    const std::size_t ns = p.program.stages.size();
    ASSERT_GE(ns, 2u) << p.name;
    for (const bool by_warp : {false, true}) {
      const KernelSpec& k = g->kernels[by_warp ? *g->row_warp_kernel : *g->row_kernel];
      EXPECT_EQ(k.name, by_warp ? "kiln_rowwarp" : "kiln_row");
      const std::string part_suffix = by_warp ? "_rowwarppart" : "_rowpart";
      const std::string barrier = by_warp ? "__syncwarp();" : "__syncthreads();";
      // Parameters: stage 0's list, stage 1's, ..., then the window's bytes, rows and n.
      ASSERT_GE(k.params.size(), 3u);
      EXPECT_EQ(k.params[k.params.size() - 3].kind, ParamKind::RowWindowBytes);
      EXPECT_EQ(k.params[k.params.size() - 2].kind, ParamKind::Rows);
      EXPECT_EQ(k.params.back().kind, ParamKind::RowLength);
      std::uint32_t stage = 0;
      std::size_t faults = 0;
      for (std::size_t i = 0; i + 3 < k.params.size(); ++i) {
        EXPECT_GE(k.params[i].stage, stage) << p.name << " parameter " << i;
        stage = k.params[i].stage;
        if (k.params[i].kind == ParamKind::Fault) {
          EXPECT_EQ(faults, k.params[i].stage) << "each stage's list ends with its fault word";
          ++faults;
        }
        EXPECT_NE(k.params[i].kind, ParamKind::Rows);
      }
      EXPECT_EQ(faults, ns) << p.name;
      // The body: the parts in order, a barrier between consecutive calls and none after the last.
      std::size_t at = g->body.find("void __launch_bounds__(256) " + k.name + "(");
      ASSERT_NE(at, std::string::npos);
      for (std::size_t st = 0; st < ns; ++st) {
        const std::string part = "kiln_s" + std::to_string(st) + part_suffix;
        EXPECT_NE(g->body.find("__device__ __forceinline__ void " + part + "("), std::string::npos) << p.name;
        const std::size_t call = g->body.find(part + "(k" + std::to_string(st) + "_", at);
        ASSERT_NE(call, std::string::npos) << p.name << ": no call of " << part << " after the previous one";
        const std::size_t next = g->body.find(part_suffix + "(k", call + part.size());
        const std::size_t end_of_kernel = g->body.find("\n}\n", call);
        if (st + 1 < ns)
          EXPECT_LT(g->body.find(barrier, call), next) << p.name << ": no barrier between stages " << st;
        else
          EXPECT_GT(next, end_of_kernel) << p.name << ": a call after the last stage";
        at = call;
      }
    }
    // A pointer to what one stage writes and a later one reads is never __restrict__ there.
    for (std::size_t st = 1; st < ns; ++st)
      for (std::size_t j = 0; j < st; ++j)
        for (const fusion::ProgramOutput& o : p.program.stages[j].outputs)
          for (std::uint32_t i = 0; i < p.program.stages[st].inputs.size(); ++i)
            if (o.written && o.tensor == p.program.stages[st].inputs[i].tensor) {
              const std::string ptr = "* k" + std::to_string(st) + "_in" + std::to_string(i) + ",";
              EXPECT_NE(g->body.find(ptr), std::string::npos) << p.name << ": " << ptr << " is declared __restrict__";
            }
    EXPECT_NE(g->body.find("* __restrict__ k0_in0"), std::string::npos) << "outside inputs keep __restrict__";
    covered.insert(p.name.substr(p.name.find(' ') + 1));
  }
  for (const char* w : {"softmax", "log-softmax", "layer-norm", "rms-norm", "cross-entropy"})
    EXPECT_TRUE(covered.count(w)) << w << " is not a Row program of the catalog";
}

// Temporaries consumed inside a Row kernel (softmax's exp(x - max): written by the sum's
// prologue, read and consumed by the division), and inputs several stages read (softmax's x), may
// live in the row's shared-memory window: their stores and loads go there when the launch has
// one, to global memory otherwise; an input's first reader fills its window.
TEST(Codegen, RowTemporariesConsumedInTheLaunchGetAWindow) {
  int softmaxes = 0;
  for (const NamedProgram& p : testing::fused_catalog()) {
    if (p.program.kind != fusion::ProgramKind::Row) continue;
    Result<GeneratedProgram> g = generate(p.program);
    KILN_ASSERT_OK(g);
    const ir::DType d = p.program.stages[0].inputs[0].dtype;
    for (const ir::DType& w : g->row_windows) EXPECT_EQ(w, d) << p.name;
    if (g->row_windows.empty()) continue;
    EXPECT_NE(g->body.find("[pos - kiln_row0] = "), std::string::npos) << p.name << ": no window store";
    EXPECT_NE(g->body.find("(kiln_window ? kiln_w"), std::string::npos) << p.name << ": no window load";
    EXPECT_NE(g->body.find("if (kiln_window) __syncthreads();"), std::string::npos)
        << p.name << ": the next row's stages must wait for this row's last reads";
    EXPECT_NE(g->body.find("if (kiln_window) __syncwarp();"), std::string::npos) << p.name;
    if (p.name.size() > 8 && p.name.compare(p.name.size() - 8, 8, " softmax") == 0) {
      ++softmaxes;
      EXPECT_EQ(g->row_windows.size(), 2u) << p.name << ": x (read by the max and the sum) and exp(x - max)";
      // x: the max's loads fill the window, the sum's prologue reads it.
      EXPECT_NE(g->body.find("] = raw"), std::string::npos) << p.name << ": no window filled by a load";
    }
  }
  EXPECT_EQ(softmaxes, 4) << "softmax in four dtypes";
}

// A window holds a tensor as its plain reads walk the row: a view of it (x's transpose) or a
// broadcast read goes to global memory, never to the window (which would read x for x^T, or, in
// the filling stage, write x^T over x).
TEST(Codegen, ViewsOfAWindowedInputReadGlobalMemory) {
  for (const NamedProgram& p : testing::fused_catalog()) {
    if (p.name.rfind("f32 log-softmax-transpose", 0) != 0 || p.program.kind != fusion::ProgramKind::Row) continue;
    Result<GeneratedProgram> g = generate(p.program);
    KILN_ASSERT_OK(g);
    ASSERT_FALSE(g->row_windows.empty()) << p.name;
    int views = 0;
    for (std::size_t k = 0; k < p.program.stages.size(); ++k) {
      const fusion::FusedProgram& st = p.program.stages[k];
      for (const char* part : {"_rowpart(", "_rowwarppart("}) {
        const std::size_t begin = g->body.find("void kiln_s" + std::to_string(k) + part);
        ASSERT_NE(begin, std::string::npos);
        const std::string fn = g->body.substr(begin, g->body.find("\n}\n", begin) - begin);
        for (std::uint32_t l = 0; l < st.blocks[0].loads.size(); ++l) {
          const fusion::Load& ld = st.blocks[0].loads[l];
          if (ld.source != fusion::LoadSource::Input || st.inputs[ld.index].role != fusion::InputRole::View) continue;
          const std::string read = fmt::format("in{}[KILN_OFF(la0_{}, pos, idx, it0)]", ld.index, l);
          const std::size_t at = fn.find(read);
          ASSERT_NE(at, std::string::npos) << read << " in\n" << fn;
          const std::size_t line = fn.rfind('\n', at) + 1;
          EXPECT_EQ(fn.substr(line, fn.find('\n', at) - line).find("kiln_w"), std::string::npos)
              << "a view read through a window: " << fn.substr(line, fn.find('\n', at) - line);
          ++views;
        }
      }
    }
    EXPECT_GT(views, 0) << p.name << ": the transpose is not a fused view of x:\n" << p.program.to_string();
    EXPECT_NE(g->body.find("(kiln_window ? kiln_w"), std::string::npos) << "x's plain reads use its window";
    return;
  }
  FAIL() << "no f32 log-softmax-transpose Row program in the catalog";
}

TEST(Codegen, HalfPrecisionComputesInF32AndRoundsBack) {
  for (const NamedProgram& p : testing::fused_catalog()) {
    if (p.name != "f16 W1") continue;
    Result<GeneratedProgram> g = generate(p.program);
    KILN_ASSERT_OK(g);
    EXPECT_NE(g->body.find("__half2float("), std::string::npos);
    EXPECT_NE(g->body.find("kiln_f16("), std::string::npos) << "each f16 result is rounded to f16";
    EXPECT_NE(g->body.find("__float2half_rn("), std::string::npos);
    EXPECT_NE(g->body.find("KilnVec<__half, 8>"), std::string::npos) << "8 halves per 16-byte vector";
    return;
  }
  FAIL() << "no f16 W1 in the catalog";
}

TEST(Codegen, IntegerDivisionAndIndexedReadsMayFault) {
  bool div = false, gather = false;
  for (const NamedProgram& p : testing::fused_catalog()) {
    Result<GeneratedProgram> g = generate(p.program);
    KILN_ASSERT_OK(g);
    if (p.name == "i32 div-shift-compare") {
      div = true;
      EXPECT_TRUE(g->may_fault);
      EXPECT_NE(g->body.find("kiln_div("), std::string::npos);
    }
    if (p.name.rfind("f32 gather-exp", 0) == 0 && p.program.kind == fusion::ProgramKind::Elementwise) {
      gather = true;
      EXPECT_TRUE(g->may_fault);
      ASSERT_FALSE(g->stages.empty());
      EXPECT_TRUE(g->stages[0].indexed_blocks[0]);
      EXPECT_EQ(g->stages[0].vector_width, 0u) << "indexed blocks have no vector kernel";
    }
  }
  EXPECT_TRUE(div && gather);
}

TEST(Codegen, RefusesWhatItCannotGenerate) {
  fusion::FusedProgram p;
  p.kind = fusion::ProgramKind::Elementwise;
  Result<GeneratedProgram> g = generate(p);  // no block
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.error().code, ErrorCode::Unsupported);

  // QFloat input
  fusion::ProgramBlock b;
  b.reference_shape = {1};
  b.registers.push_back(ir::DType::qfloat({}));
  b.loads.push_back(fusion::Load{fusion::LoadSource::Input, 0, 0, false});
  p.blocks.push_back(b);
  p.inputs.push_back(fusion::ProgramInput{
      0, ir::DType::qfloat({}), {1}, ir::TensorStatus::ReadOnly, fusion::InputRole::Plain, std::nullopt});
  g = generate(p);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.error().message.find("qfloat"), std::string::npos) << g.error().message;

  // rank 9
  fusion::FusedProgram q;
  q.kind = fusion::ProgramKind::Elementwise;
  fusion::ProgramBlock c;
  c.reference_shape = ir::Shape(9, 1);
  q.blocks.push_back(c);
  g = generate(q);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.error().message.find("rank"), std::string::npos);

  EXPECT_FALSE(generate(testing::fused_catalog()[0].program, {.name_prefix = ""}).ok());
  EXPECT_FALSE(generate(testing::fused_catalog()[0].program, {.name_prefix = "k", .threads = 128}).ok());
}

// The prelude spells launch_abi.h's structs member for member.
TEST(Codegen, PreludeSpellsTheHostAbi) {
  const std::string_view pre = prelude();
  EXPECT_NE(pre.find("struct KilnIter { long long numel; long long dims[KILN_MAX_RANK]; int rank; int contiguous; };"),
            std::string::npos);
  EXPECT_NE(pre.find("struct KilnAccess { long long strides[KILN_MAX_RANK]; int contiguous; int masked; };"),
            std::string::npos);
  EXPECT_NE(pre.find("struct KilnReduceShape { long long outer; long long n; long long inner; long long outputs; };"),
            std::string::npos);
  EXPECT_NE(pre.find("struct KilnIndexed { long long dims[KILN_MAX_RANK]; long long strides[KILN_MAX_RANK]; int rank; "
                     "int pad; };"),
            std::string::npos);
  EXPECT_NE(pre.find("#define KILN_MAX_RANK 8"), std::string::npos);
  static_assert(kMaxRank == 8);
}

}  // namespace
}  // namespace kiln::cuda
