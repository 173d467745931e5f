#include "scenarios.h"

#include <fmt/format.h>

#include <cstdint>

#include "kiln/fusion/plan_graph.h"
#include "lab.h"

namespace kiln::lab {
namespace {

using ir::Family;
using ir::OpKind;
using ir::Shape;
using ir::TensorIr;
using ir::TensorStatus;

// W1, then read the result, then drop everything (the drops have their own one-op plans).
void run_w1(Lab& lab, const Shape& shape, double s) {
  W1Program w = register_w1(lab, shape, s);
  lab.read(w.t7);
  for (const TensorIr& t : {w.a, w.b, w.c, w.t7}) lab.drop(t);
}

std::string describe_fused(const fusion::RecordingExecutor& ex, std::size_t from) {
  std::string s;
  for (std::size_t i = from; i < ex.records().size(); ++i) {
    const auto& r = ex.records()[i];
    if (!r.fused) continue;
    s += fmt::format("{}{} ({} ops)", s.empty() ? "" : ", ", r.name, r.operations.size());
  }
  return s.empty() ? "nothing fused" : s;
}

// The scenario's result with every plan of its store as DOT.
ScenarioResult with_graphs(Lab& lab, ScenarioResult r) {
  for (const fusion::PlanId id : lab.store().ids())
    if (const fusion::PlanPin plan = lab.store().plan(id))
      r.plan_graphs.emplace_back(id, fusion::plan_to_dot(id, *plan));
  return r;
}

ScenarioResult reuse(const fusion::FusionLog& log, const fusion::ProcessorOptions& options,
                     const fusion::FuserOptions& fusers) {
  Lab lab(log, options, true, fusers);
  struct Step {
    const char* label;
    Shape shape;
    double s;
    bool expect_explore;
  };
  const Step steps[] = {{"64x64, s=2.0 (first run)", {64, 64}, 2.0, true},
                        {"64x64, s=2.0 (repeat)", {64, 64}, 2.0, false},
                        {"64x64, s=2.0 (repeat)", {64, 64}, 2.0, false},
                        {"64x64, s=3.0", {64, 64}, 3.0, false},
                        {"32x32, s=2.0", {32, 32}, 2.0, false},
                        {"64x32, s=2.0", {64, 32}, 2.0, true}};
  ScenarioResult result;
  std::string summary;
  for (const Step& step : steps) {
    log.log(fusion::LogLevel::Basic, [&] { return fmt::format("---- reuse: {}", step.label); });
    // The program explores exactly when its relative form is new; so do the drops after the
    // read (one-op plans), so a step explores iff it is expected to.
    const std::size_t explored_before = lab.stats().explorations;
    const std::size_t records_before = lab.executor().records().size();
    run_w1(lab, step.shape, step.s);
    const std::size_t explored = lab.stats().explorations - explored_before;
    const std::string fused = describe_fused(lab.executor(), records_before);
    summary += fmt::format("  {:<26} explorations={} fused: {}\n", step.label, explored, fused);
    if ((explored > 0) != step.expect_explore) result.ok = false;
    if (fused.find("ElementWise (4 ops)") == std::string::npos) result.ok = false;
  }
  result.summary = fmt::format("reuse: {} plans cached, {} cache hits, {} explorations\n{}", lab.store().size(),
                               lab.stats().cache_hits, lab.stats().explorations, summary);
  return with_graphs(lab, std::move(result));
}

ScenarioResult chains(const fusion::FusionLog& log, const fusion::ProcessorOptions& options,
                      const fusion::FuserOptions& fusers) {
  Lab lab(log, options, true, fusers);
  register_chains(lab, 5);
  const bool nothing_ran_before_sync = lab.executor().records().empty();
  lab.sync();
  ScenarioResult result;
  const auto& records = lab.executor().records();
  result.ok = nothing_ran_before_sync && records.size() == 1 && records[0].fused && records[0].operations.size() == 40;
  std::uint64_t score = 0;
  if (lab.store().size() > 0) score = lab.store().plan(0)->optimization.strategy.score();
  result.ok = result.ok && score == 7390;
  result.summary = fmt::format("chains: {} execution(s) after the sync: {} (score {})", records.size(),
                               describe_fused(lab.executor(), 0), score);
  return with_graphs(lab, std::move(result));
}

// softmax over the last axis as a front end lowers it: max, sub, exp, sum, div.
// Softmax rows written as a client lowers them: max, sub, exp, sum, div.
TensorIr register_softmax(Lab& lab, const TensorIr& x) {
  TensorIr m = lab.reduce_dim(OpKind::Numeric_MaxDim, x, TensorStatus::ReadOnly, 1);
  TensorIr d = lab.binary(OpKind::Numeric_Sub, x, TensorStatus::ReadWrite, m, TensorStatus::ReadWrite);
  TensorIr e = lab.unary(OpKind::Float_Exp, Family::Float, d, TensorStatus::ReadWrite);
  TensorIr s = lab.reduce_dim(OpKind::Numeric_SumDim, e, TensorStatus::ReadOnly, 1);
  return lab.binary(OpKind::Numeric_Div, e, TensorStatus::ReadWrite, s, TensorStatus::ReadWrite);
}

// Burn's search (the row fuser off, whatever the configuration says).
ScenarioResult softmax(const fusion::FusionLog& log, const fusion::ProcessorOptions& options,
                       const fusion::FuserOptions& configured) {
  fusion::FuserOptions fusers = configured;
  fusers.row_fuser = false;
  Lab lab(log, options, true, fusers);
  lab.read(register_softmax(lab, lab.input({64, 1024})));
  ScenarioResult r;
  // The max runs alone (a reduction never starts a fusion); Sub+Exp fused elementwise (210)
  // outscore Sub+Exp+SumDim as a reduce prologue (110), and the rest follows unfused.
  r.summary = "softmax: " + describe_fused(lab.executor(), 0);
  r.ok = r.summary.find("ElementWise (2 ops)") != std::string::npos;
  return with_graphs(lab, std::move(r));
}

// kiln's row fuser (on, whatever the configuration says): softmax, then a layer norm written
// out (mean, centre, variance, normalise, scale and shift), each one Row program.
ScenarioResult rows(const fusion::FusionLog& log, const fusion::ProcessorOptions& options,
                    const fusion::FuserOptions& configured) {
  fusion::FuserOptions fusers = configured;
  fusers.row_fuser = true;
  Lab lab(log, options, true, fusers);
  lab.read(register_softmax(lab, lab.input({64, 1024})));
  const std::string softmax = describe_fused(lab.executor(), 0);
  const std::size_t before = lab.executor().records().size();
  TensorIr x = lab.input({64, 1024}), w = lab.input({1, 1024}), b = lab.input({1, 1024});
  TensorIr mean = lab.reduce_dim(OpKind::Numeric_MeanDim, x, TensorStatus::ReadOnly, 1);
  TensorIr c = lab.binary(OpKind::Numeric_Sub, x, TensorStatus::ReadWrite, mean, TensorStatus::ReadWrite);
  TensorIr sq = lab.binary(OpKind::Numeric_Mul, c, TensorStatus::ReadOnly, c, TensorStatus::ReadOnly);
  TensorIr var = lab.reduce_dim(OpKind::Numeric_MeanDim, sq, TensorStatus::ReadWrite, 1);
  TensorIr ve = lab.scalar(OpKind::Numeric_AddScalar, var, TensorStatus::ReadWrite, 1e-5);
  TensorIr sd = lab.unary(OpKind::Float_Sqrt, Family::Float, ve, TensorStatus::ReadWrite);
  TensorIr n = lab.binary(OpKind::Numeric_Div, c, TensorStatus::ReadWrite, sd, TensorStatus::ReadWrite);
  TensorIr scaled = lab.binary(OpKind::Numeric_Mul, n, TensorStatus::ReadWrite, w, TensorStatus::ReadOnly);
  lab.read(lab.binary(OpKind::Numeric_Add, scaled, TensorStatus::ReadWrite, b, TensorStatus::ReadOnly));
  const std::string norm = describe_fused(lab.executor(), before);
  ScenarioResult r;
  r.summary = fmt::format("rows: softmax: {}; layer norm: {}", softmax, norm);
  r.ok = softmax == "Row (5 ops)" && norm == "Row (9 ops)";
  return with_graphs(lab, std::move(r));
}

// A linear layer's matmul with its bias add and activation fused as the epilogue.
ScenarioResult matmul(const fusion::FusionLog& log, const fusion::ProcessorOptions& options,
                      const fusion::FuserOptions& fusers) {
  Lab lab(log, options, true, fusers);
  TensorIr x = lab.input({128, 256}), w = lab.input({256, 64}), bias = lab.input({1, 64});
  TensorIr y = lab.matmul(x, TensorStatus::ReadOnly, w, TensorStatus::ReadOnly);
  TensorIr z = lab.binary(OpKind::Numeric_Add, y, TensorStatus::ReadWrite, bias, TensorStatus::ReadOnly);
  TensorIr a = lab.unary(OpKind::Float_Tanh, Family::Float, z, TensorStatus::ReadWrite);
  lab.read(a);
  ScenarioResult r;
  r.summary = "matmul: " + describe_fused(lab.executor(), 0);
  r.ok = r.summary.find("Matmul (3 ops)") != std::string::npos;
  return with_graphs(lab, std::move(r));
}

// The view rule: a swap_dims of a tensor seen for the first time runs alone; the rest fuses.
ScenarioResult views(const fusion::FusionLog& log, const fusion::ProcessorOptions& options,
                     const fusion::FuserOptions& fusers) {
  Lab lab(log, options, true, fusers);
  TensorIr a = lab.input({32, 32}), b = lab.input({32, 32});
  TensorIr t = lab.swap_dims(a, TensorStatus::ReadOnly, 0, 1);
  TensorIr s = lab.binary(OpKind::Numeric_Add, t, TensorStatus::ReadWrite, b, TensorStatus::ReadOnly);
  TensorIr e = lab.unary(OpKind::Float_Exp, Family::Float, s, TensorStatus::ReadWrite);
  lab.read(e);
  ScenarioResult r;
  const auto& recs = lab.executor().records();
  r.ok = !recs.empty() && !recs[0].fused && recs[0].operations[0].kind == OpKind::Base_SwapDims;
  r.summary = fmt::format("views: swap_dims ran {}; then {}", r.ok ? "alone" : "fused (unexpected)",
                          describe_fused(lab.executor(), 0));
  return with_graphs(lab, std::move(r));
}

// max_explorations = 1: the first program is explored and cached, a different one runs unfused.
ScenarioResult cap(const fusion::FusionLog& log, const fusion::ProcessorOptions& configured,
                   const fusion::FuserOptions& fusers) {
  fusion::ProcessorOptions options = configured;
  options.max_explorations = 1;
  Lab lab(log, options, true, fusers);
  lab.read(register_w1(lab, {16, 16}, 2.0).t7);
  TensorIr x = lab.input({16, 16});
  TensorIr y = lab.unary(OpKind::Float_Log, Family::Float, x, TensorStatus::ReadOnly);
  lab.read(lab.unary(OpKind::Float_Exp, Family::Float, y, TensorStatus::ReadWrite));
  lab.read(register_w1(lab, {16, 16}, 4.0).t7);
  ScenarioResult r;
  // Capped, every Lazy exploration runs the queue unfused at once: Log, then Exp, alone.
  r.ok = lab.store().size() == 1 && lab.stats().unfused_capped == 2 && lab.stats().cache_hits == 1;
  r.summary = fmt::format("cap: {} plan(s) cached, {} segment(s) run unfused by the cap, {} cache hit(s)",
                          lab.store().size(), lab.stats().unfused_capped, lab.stats().cache_hits);
  return with_graphs(lab, std::move(r));
}

}  // namespace

const std::vector<Scenario>& scenarios() {
  static const std::vector<Scenario> kScenarios = {
      {"reuse",
       "(a*b + c*s).exp() on 64x64 three times, then s=3.0, then 32x32, then 64x32: one plan reused, 64x32 explores "
       "again",
       reuse},
      {"chains",
       "five independent 8-op elementwise chains on 256x256 before one sync: one fused 40-op kernel (score 7390)",
       chains},
      {"softmax",
       "softmax over the last axis of 64x1024 (max, sub, exp, sum, div) in Burn's search (row fuser off): how the "
       "scores split it",
       softmax},
      {"rows", "softmax and a layer norm over rows of 1024 with kiln's row fuser: one Row program each", rows},
      {"matmul", "x @ w + bias, then tanh: the matmul with its epilogue fused (Matmul fuser)", matmul},
      {"views", "(a.swap_dims(0,1) + b).exp(): a first-use view runs alone, the rest fuses", views},
      {"cap", "max_explorations = 1: one plan is explored and reused, a new program runs unfused", cap},
  };
  return kScenarios;
}

}  // namespace kiln::lab
