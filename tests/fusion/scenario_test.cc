// End-to-end seed scenarios (docs/spec/fusion.md §19.1) and Burn integration expectations (§19.14):
// real relativization, the default fusers, one stream, a recording executor. Every vector runs
// twice, with kiln's row fuser off (Burn's fusers only) and on (the default): none of them has a
// row reduction, so the search, its log, its plans and their scores must be the same.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "lab.h"

namespace kiln::lab {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

struct Captured {
  std::shared_ptr<fusion::LogCapture> capture = std::make_shared<fusion::LogCapture>();
  fusion::FusionLog log = fusion::FusionLog::to_capture(fusion::LogLevel::Full, capture);

  // Lines of the search itself (fuser close lines and kiln's cache-miss explanations are
  // extra lines that the seed logs do not show).
  std::vector<std::string> search_lines() const {
    std::vector<std::string> out;
    for (const auto& l : capture->lines())
      if (l.rfind("[fuser]", 0) != 0 && l.rfind("[plan] cache miss", 0) != 0) out.push_back(l);
    return out;
  }
};

using W1 = W1Program;

class SeedScenario : public ::testing::TestWithParam<bool> {
 protected:
  fusion::FuserOptions fusers() const { return fusion::FuserOptions{.row_fuser = GetParam()}; }
};
class Integration : public SeedScenario {};

std::string row_fuser_name(const ::testing::TestParamInfo<bool>& param) {
  return param.param ? "RowFuserOn" : "RowFuserOff";
}

bool starts_with(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }

TEST_P(SeedScenario, Score630) {
  Captured cap;
  Lab lab(cap.log, {}, true, fusers());
  W1 w = register_w1(lab, {64, 64}, 2.0);
  EXPECT_EQ(lab.queued(), 4u);
  lab.read(w.t7);
  auto lines = cap.search_lines();
  ASSERT_EQ(lines.size(), 12u) << ::testing::PrintToString(lines);
  EXPECT_EQ(lines[0], "[explorer] explore (lazy): 1 deferred of 1 queued");
  EXPECT_EQ(lines[1], "[stream] op 0 NumericFloat::Mul → new block (total: 1)");
  EXPECT_EQ(lines[2], "[explorer] explore (lazy): 1 deferred of 2 queued");
  EXPECT_EQ(lines[3], "[stream] op 1 NumericFloat::MulScalar → new block (total: 2)");
  EXPECT_EQ(lines[4], "[explorer] explore (lazy): 1 deferred of 3 queued");
  EXPECT_EQ(lines[5], "[stream] op 2 NumericFloat::Add → accepted in 1/1 block(s)");
  EXPECT_EQ(lines[6], "[explorer] explore (lazy): 1 deferred of 4 queued");
  EXPECT_EQ(lines[7], "[stream] op 3 Float::Exp → accepted in 1/1 block(s)");
  EXPECT_EQ(lines[8], "[explorer] explore (sync): 0 deferred of 4 queued");
  EXPECT_EQ(lines[9], "selected single strategy");
  EXPECT_EQ(lines[10], "[plan] exploration completed: sync, 4/4 ops optimized");
  EXPECT_THAT(lines[11], HasSubstr("fusion trace (4 ops, 1 block)"));
  EXPECT_THAT(lines[11], HasSubstr("▸ fused ElementWise (score=630, 4 ops)"));
  EXPECT_THAT(lines[11], HasSubstr("t1:f32[64,64], t2:f32[64,64]"));

  ASSERT_EQ(lab.store().size(), 1u);
  const fusion::PlanPin plan = lab.store().plan(0);
  ASSERT_NE(plan, nullptr);
  EXPECT_EQ(plan->operations.size(), 4u);
  EXPECT_EQ(*lab.store().triggers(0), fusion::TriggerList{fusion::ExecutionTrigger::on_sync()});
  EXPECT_EQ(plan->optimization.strategy.kind(), fusion::ExecutionStrategy::Kind::Optimization);
  EXPECT_EQ(plan->optimization.strategy.score(), 630u);
  EXPECT_EQ(plan->optimization.ordering, (fusion::Ordering{0, 1, 2, 3}));
  ASSERT_EQ(lab.executor().records().size(), 1u);
  EXPECT_TRUE(lab.executor().records()[0].fused);
  EXPECT_TRUE(lab.executor().has_handle(w.t7.id));
}

TEST_P(SeedScenario, CacheHitsForRepeatOtherScalarAndOtherSize) {
  Captured cap;
  Lab lab(cap.log, {}, true, fusers());
  W1 first = register_w1(lab, {64, 64}, 2.0);
  lab.read(first.t7);
  ASSERT_EQ(lab.store().size(), 1u);
  struct Run {
    Shape shape;
    double s;
  };
  for (const Run& run : {Run{{64, 64}, 2.0}, Run{{64, 64}, 3.0}, Run{{32, 32}, 2.0}}) {
    cap.capture->clear();
    W1 w = register_w1(lab, run.shape, run.s);
    EXPECT_EQ(lab.queued(), 4u) << "Lazy mode defers all four ops";
    lab.read(w.t7);
    auto lines = cap.search_lines();
    for (const auto& l : lines) EXPECT_FALSE(starts_with(l, "[explorer]")) << l;
    ASSERT_GE(lines.size(), 2u);
    EXPECT_EQ(lines[0], "[plan] cache hit: execute plan #0 (sync, segment has 4 ops)");
    EXPECT_THAT(lines[1], HasSubstr("▸ fused ElementWise (score=630, 4 ops)"));
    EXPECT_EQ(lab.store().size(), 1u);
  }
}

TEST_P(SeedScenario, OtherShapeExploresAgain) {
  Captured cap;
  Lab lab(cap.log, {}, true, fusers());
  W1 first = register_w1(lab, {64, 64}, 2.0);
  lab.read(first.t7);
  cap.capture->clear();
  W1 w = register_w1(lab, {64, 32}, 2.0);
  lab.read(w.t7);
  auto lines = cap.search_lines();
  ASSERT_EQ(lines.size(), 12u) << ::testing::PrintToString(lines);
  EXPECT_EQ(lines[10], "[plan] exploration completed: sync, 4/4 ops optimized");
  EXPECT_THAT(lines[11], HasSubstr("▸ fused ElementWise (score=630, 4 ops)"));
  EXPECT_THAT(lines[11], HasSubstr("[64,32]"));
  EXPECT_EQ(lab.store().size(), 2u);
}

TEST_P(SeedScenario, CacheMissExplainsItselfAtMedium) {
  auto capture = std::make_shared<fusion::LogCapture>();
  auto log = fusion::FusionLog::to_capture(fusion::LogLevel::Medium, capture);
  Lab lab(log, {}, true, fusers());
  W1 first = register_w1(lab, {64, 64}, 2.0);
  lab.read(first.t7);
  capture->clear();
  W1 w = register_w1(lab, {64, 32}, 2.0);
  lab.read(w.t7);
  auto lines = capture->lines();
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines[0],
            "[plan] cache miss: no cached plan starts with this op; closest plan #0: op 0 input 0 relative shape "
            "[1,2] vs cached [1,1]");
}

TEST_P(SeedScenario, FiveChainsFuseInto40OpKernel) {
  Captured cap;
  Lab lab(cap.log, {}, true, fusers());
  register_chains(lab, 5);
  EXPECT_TRUE(lab.executor().records().empty()) << "nothing executes before the drain";
  auto reg = cap.search_lines();
  std::vector<std::string> stream_lines;
  for (const auto& l : reg)
    if (starts_with(l, "[stream]")) stream_lines.push_back(l);
  ASSERT_EQ(stream_lines.size(), 40u);
  for (int k = 0; k < 5; ++k) {
    EXPECT_EQ(stream_lines[8 * k], "[stream] op " + std::to_string(8 * k) +
                                       " NumericFloat::MulScalar → new block (total: " + std::to_string(k + 1) + ")");
    for (int i = 1; i < 8; ++i)
      EXPECT_THAT(stream_lines[8 * k + i], HasSubstr("→ accepted in 1/" + std::to_string(k + 1) + " block(s)"));
  }
  EXPECT_EQ(stream_lines[39], "[stream] op 39 NumericFloat::Abs → accepted in 1/5 block(s)");

  cap.capture->clear();
  lab.sync();
  auto lines = cap.search_lines();
  ASSERT_GE(lines.size(), 4u);
  EXPECT_EQ(lines[0], "[explorer] explore (sync): 0 deferred of 40 queued");
  EXPECT_EQ(lines[1], "selected single strategy");
  EXPECT_EQ(lines[2], "[plan] exploration completed: sync, 40/40 ops optimized");
  EXPECT_THAT(lines[3], HasSubstr("fusion trace (40 ops, 1 block)"));
  EXPECT_THAT(lines[3], HasSubstr("▸ fused ElementWise (score=7390, 40 ops)"));
  ASSERT_EQ(lab.executor().records().size(), 1u);
  // Registration order of the merged block: chain 0, chain 1, ... chain 4.
  const auto& ops = lab.executor().records()[0].operations;
  ASSERT_EQ(ops.size(), 40u);
  for (int k = 0; k < 5; ++k) EXPECT_EQ(ops[8 * k].kind, OpKind::Numeric_MulScalar);
  EXPECT_EQ(lab.store().plan(0)->optimization.strategy.score(), 7390u);
}

TEST_P(SeedScenario, SixthChainMergesAtMaxBlocks) {
  Captured cap;
  Lab lab(cap.log, {}, true, fusers());
  register_chains(lab, 6);
  bool saw = false;
  for (const auto& l : cap.search_lines())
    if (l == "[stream] op 40 NumericFloat::MulScalar → new block (total: 2)") saw = true;
  EXPECT_TRUE(saw);
  lab.sync();
  ASSERT_EQ(lab.executor().records().size(), 1u);
  EXPECT_EQ(lab.executor().records()[0].operations.size(), 48u);
  EXPECT_EQ(lab.store().plan(0)->optimization.strategy.score(), 8870u);
}

// ---- §19.14 integration expectations

TEST_P(Integration, AddExpFusesTwoOps) {
  Lab lab(fusion::FusionLog{}, {}, true, fusers());
  TensorIr a = lab.input({8, 8}), b = lab.input({8, 8});
  TensorIr s = lab.binary(OpKind::Numeric_Add, a, TensorStatus::ReadOnly, b, TensorStatus::ReadOnly);
  TensorIr e = lab.unary(OpKind::Float_Exp, Family::Float, s, TensorStatus::ReadWrite);
  lab.read(e);
  ASSERT_EQ(lab.executor().records().size(), 1u);
  EXPECT_TRUE(lab.executor().records()[0].fused);
  EXPECT_EQ(lab.executor().records()[0].name, "ElementWise");
  EXPECT_EQ(lab.executor().records()[0].operations.size(), 2u);
}

TEST_P(Integration, SyncBetweenAddAndExpSeparatesThem) {
  Lab lab(fusion::FusionLog{}, {}, true, fusers());
  TensorIr a = lab.input({8, 8}), b = lab.input({8, 8});
  TensorIr s = lab.binary(OpKind::Numeric_Add, a, TensorStatus::ReadOnly, b, TensorStatus::ReadOnly);
  lab.sync();
  TensorIr e = lab.unary(OpKind::Float_Exp, Family::Float, s, TensorStatus::ReadWrite);
  lab.read(e);
  for (const auto& r : lab.executor().records()) EXPECT_EQ(r.operations.size(), 1u);
  EXPECT_EQ(lab.executor().executed().size(), 2u);
}

TEST_P(Integration, ThreeOpChainFuses) {
  Lab lab(fusion::FusionLog{}, {}, true, fusers());
  TensorIr a = lab.input({8, 8}), b = lab.input({8, 8}), c = lab.input({8, 8});
  TensorIr s = lab.binary(OpKind::Numeric_Add, a, TensorStatus::ReadOnly, b, TensorStatus::ReadOnly);
  TensorIr m = lab.binary(OpKind::Numeric_Mul, s, TensorStatus::ReadWrite, c, TensorStatus::ReadOnly);
  TensorIr e = lab.unary(OpKind::Float_Exp, Family::Float, m, TensorStatus::ReadWrite);
  lab.read(e);
  ASSERT_EQ(lab.executor().records().size(), 1u);
  EXPECT_EQ(lab.executor().records()[0].operations.size(), 3u);
}

TEST_P(Integration, LoneScalarAddIsNotFused) {
  Lab lab(fusion::FusionLog{}, {}, true, fusers());
  TensorIr x = lab.input({8, 8});
  TensorIr y = lab.scalar(OpKind::Numeric_AddScalar, x, TensorStatus::ReadOnly, 1.0);
  lab.read(y);
  ASSERT_EQ(lab.executor().records().size(), 1u);
  EXPECT_FALSE(lab.executor().records()[0].fused);
}

TEST_P(Integration, LoopOfFourIterationsFusesSixteenOps) {
  Lab lab(fusion::FusionLog{}, {}, true, fusers());
  TensorIr original = lab.input({8, 8});
  TensorIr tmp = original;
  for (int i = 0; i < 4; ++i) {
    // tmp = tmp * original + ones([8,8]) * i; the first tmp is original itself (still alive).
    TensorIr prod = lab.binary(OpKind::Numeric_Mul, tmp, i == 0 ? TensorStatus::ReadOnly : TensorStatus::ReadWrite,
                               original, TensorStatus::ReadOnly);
    TensorIr ones = lab.ones({8, 8});
    TensorIr scaled = lab.scalar(OpKind::Numeric_MulScalar, ones, TensorStatus::ReadWrite, i);
    tmp = lab.binary(OpKind::Numeric_Add, prod, TensorStatus::ReadWrite, scaled, TensorStatus::ReadWrite);
  }
  EXPECT_TRUE(lab.executor().records().empty());
  lab.read(tmp);
  ASSERT_EQ(lab.executor().records().size(), 1u);
  const auto& rec = lab.executor().records()[0];
  EXPECT_TRUE(rec.fused);
  EXPECT_EQ(rec.name, "ElementWise");
  std::size_t non_drop = 0;
  for (const auto& op : rec.operations) non_drop += op.is_drop() ? 0 : 1;
  EXPECT_EQ(non_drop, 16u);
}

TEST_P(Integration, FirstUseSwapDimsRunsOnlyUnfused) {
  Lab lab(fusion::FusionLog{}, {}, true, fusers());
  TensorIr a = lab.input({16, 16}), b = lab.input({16, 16});
  TensorIr t = lab.swap_dims(a, TensorStatus::ReadWrite, 0, 1);
  TensorIr s = lab.binary(OpKind::Numeric_Add, t, TensorStatus::ReadWrite, b, TensorStatus::ReadOnly);
  TensorIr e = lab.unary(OpKind::Float_Exp, Family::Float, s, TensorStatus::ReadWrite);
  lab.read(e);
  for (const auto& rec : lab.executor().records())
    for (const auto& op : rec.operations)
      if (op.kind == OpKind::Base_SwapDims) {
        EXPECT_FALSE(rec.fused) << "the swap appears only in un-fused blocks";
      }
  EXPECT_EQ(lab.executor().executed().size(), 3u);
}

TEST_P(Integration, ExplorationCap) {
  auto capture = std::make_shared<fusion::LogCapture>();
  auto log = fusion::FusionLog::to_capture(fusion::LogLevel::Full, capture);
  fusion::ProcessorOptions options;
  options.max_explorations = 1;
  Lab lab(log, options, true, fusers());
  W1 w = register_w1(lab, {16, 16}, 2.0);
  lab.read(w.t7);
  ASSERT_EQ(lab.store().size(), 1u);
  capture->clear();
  // A different segment: runs unfused, adds no plan, logs explore but no completion.
  TensorIr x = lab.input({16, 16});
  TensorIr y = lab.unary(OpKind::Float_Log, Family::Float, x, TensorStatus::ReadOnly);
  lab.read(y);
  EXPECT_EQ(lab.store().size(), 1u);
  bool explore_line = false, completed = false;
  for (const auto& l : capture->lines()) {
    explore_line |= starts_with(l, "[explorer] explore");
    completed |= starts_with(l, "[plan] exploration completed");
  }
  EXPECT_TRUE(explore_line);
  EXPECT_FALSE(completed);
  // The first segment still hits its plan.
  capture->clear();
  W1 again = register_w1(lab, {16, 16}, 5.0);
  lab.read(again.t7);
  bool hit = false;
  for (const auto& l : capture->lines()) hit |= starts_with(l, "[plan] cache hit: execute plan #0");
  EXPECT_TRUE(hit);
}

INSTANTIATE_TEST_SUITE_P(RowFuser, SeedScenario, ::testing::Bool(), row_fuser_name);
INSTANTIATE_TEST_SUITE_P(RowFuser, Integration, ::testing::Bool(), row_fuser_name);

}  // namespace
}  // namespace kiln::lab
