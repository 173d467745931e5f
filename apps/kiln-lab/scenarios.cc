#include "scenarios.h"

#include <fmt/format.h>

#include <cstdint>

#include "lab.h"

namespace kiln::lab {
namespace {

using ir::Family;
using ir::OpKind;
using ir::Shape;
using ir::TensorIr;
using ir::TensorStatus;

// The spec's (a*b + c*s).exp(): Mul, MulScalar, Add, Exp; then read, then drop everything.
void run_w1(Lab& lab, const Shape& shape, double s) {
  TensorIr a = lab.input(shape), b = lab.input(shape), c = lab.input(shape);
  TensorIr t4 = lab.binary(OpKind::Numeric_Mul, a, TensorStatus::ReadOnly, b, TensorStatus::ReadOnly);
  TensorIr t5 = lab.scalar(OpKind::Numeric_MulScalar, c, TensorStatus::ReadOnly, s);
  TensorIr t6 = lab.binary(OpKind::Numeric_Add, t4, TensorStatus::ReadWrite, t5, TensorStatus::ReadWrite);
  TensorIr t7 = lab.unary(OpKind::Float_Exp, Family::Float, t6, TensorStatus::ReadWrite);
  lab.read(t7);
  for (const TensorIr& t : {a, b, c, t7}) lab.drop(t);
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

ScenarioResult reuse(const fusion::FusionLog& log) {
  Lab lab(log);
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
  return result;
}

ScenarioResult chains(const fusion::FusionLog& log) {
  Lab lab(log);
  const Shape shape{256, 256};
  std::vector<TensorIr> outs;
  for (int chain = 0; chain < 5; ++chain) {
    TensorIr x = lab.input(shape);
    TensorIr t = lab.scalar(OpKind::Numeric_MulScalar, x, TensorStatus::ReadOnly, 1.5);
    t = lab.scalar(OpKind::Numeric_AddScalar, t, TensorStatus::ReadWrite, 0.5);
    t = lab.unary(OpKind::Float_Exp, Family::Float, t, TensorStatus::ReadWrite);
    t = lab.unary(OpKind::Float_Tanh, Family::Float, t, TensorStatus::ReadWrite);
    t = lab.unary(OpKind::Float_Sqrt, Family::Float, t, TensorStatus::ReadWrite);
    t = lab.scalar(OpKind::Numeric_DivScalar, t, TensorStatus::ReadWrite, 3.0);
    t = lab.scalar(OpKind::Numeric_SubScalar, t, TensorStatus::ReadWrite, 0.25);
    t = lab.unary(OpKind::Numeric_Abs, Family::NumericFloat, t, TensorStatus::ReadWrite);
    outs.push_back(t);
  }
  const bool nothing_ran_before_sync = lab.executor().records().empty();
  lab.sync();
  ScenarioResult result;
  const auto& records = lab.executor().records();
  result.ok = nothing_ran_before_sync && records.size() == 1 && records[0].fused && records[0].operations.size() == 40;
  std::uint64_t score = 0;
  if (lab.store().size() > 0) score = lab.store().plan(0).optimization.strategy.score();
  result.ok = result.ok && score == 7390;
  result.summary = fmt::format("chains: {} execution(s) after the sync: {} (score {})", records.size(),
                               describe_fused(lab.executor(), 0), score);
  return result;
}

}  // namespace

const std::vector<Scenario>& scenarios() {
  static const std::vector<Scenario> kScenarios = {
      {"reuse",
       "(a*b + c*s).exp() on 64x64 three times, then s=3.0, then 32x32, then 64x32: one plan reused, 64x32 explores again",
       reuse},
      {"chains", "five independent 8-op elementwise chains on 256x256 before one sync: one fused 40-op kernel (score 7390)",
       chains},
  };
  return kScenarios;
}

}  // namespace kiln::lab
