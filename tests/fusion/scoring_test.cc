// Tests for Scoring (docs/spec/fusion.md §14.3, vectors §19.2).
#include "kiln/fusion/scoring.h"

#include <gtest/gtest.h>

namespace kiln::fusion {
namespace {

using ir::Operation;

ir::TensorIr T(std::uint64_t id, ir::TensorStatus s) {
  return ir::TensorIr{ir::TensorId(id), ir::Shape{1, 1}, s, ir::dtypes::f32};
}

Operation make(ir::OpKind kind, ir::Family family, std::vector<ir::TensorIr> inputs,
               std::vector<ir::TensorIr> outputs) {
  Operation op;
  op.kind = kind;
  op.family = family;
  op.num_inputs = static_cast<std::uint8_t>(inputs.size());
  for (auto& t : inputs) op.tensors.push_back(t);
  for (auto& t : outputs) op.tensors.push_back(t);
  return op;
}

struct Row {
  std::uint64_t ur, uw, n, fr, fw, p, score;
};

TEST(Scoring, Section19_2Table) {
  const Row rows[] = {
      {2, 2, 2, 1, 1, 0, 210},
      {2, 2, 2, 1, 1, 1, 160},
      {1, 1, 2, 1, 1, 1, 0},  // the view penalty exceeds the benefit
      {0, 0, 0, 0, 0, 0, 0},
  };
  for (const Row& r : rows) {
    Scoring s(r.ur, r.uw, r.n);
    EXPECT_EQ(s.evaluate(r.fr, r.fw, r.p), r.score)
        << r.ur << "," << r.uw << "," << r.n << " | " << r.fr << "," << r.fw << "," << r.p;
    EXPECT_EQ(fusion_score(r.ur, r.uw, r.n, FusedIo{r.fr, r.fw, r.p}), r.score);
  }
}

TEST(Scoring, ResetClearsUnfusedCounters) {
  Scoring s(5, 4, 3);
  s.reset();
  EXPECT_EQ(s.unfused_reads(), 0u);
  EXPECT_EQ(s.unfused_writes(), 0u);
  EXPECT_EQ(s.num_ops(), 0u);
  EXPECT_EQ(s.evaluate(0, 0, 0), 0u);
}

TEST(Scoring, RegisterCountsInputsWithDuplicatesOutputsAndOps) {
  Scoring s;
  // x * x: two reads of x, one write.
  s.register_op(make(ir::OpKind::Numeric_Mul, ir::Family::NumericFloat,
                     {T(0, ir::TensorStatus::ReadOnly), T(0, ir::TensorStatus::ReadOnly)},
                     {T(1, ir::TensorStatus::NotInit)}));
  EXPECT_EQ(s.unfused_reads(), 2u);
  EXPECT_EQ(s.unfused_writes(), 1u);
  EXPECT_EQ(s.num_ops(), 1u);
  // Drop counts one read and no write.
  s.register_op(make(ir::OpKind::Drop_Drop, ir::Family::Drop, {T(0, ir::TensorStatus::ReadWrite)}, {}));
  EXPECT_EQ(s.unfused_reads(), 3u);
  EXPECT_EQ(s.unfused_writes(), 1u);
  EXPECT_EQ(s.num_ops(), 2u);
}

TEST(Scoring, FormulaEdges) {
  // Fused traffic equal to unfused: no I/O benefit, only the launch term.
  EXPECT_EQ(Scoring(2, 2, 3).evaluate(2, 2, 0), 20u);
  // Fused traffic larger than unfused never goes negative.
  EXPECT_EQ(Scoring(1, 1, 1).evaluate(5, 5, 0), 0u);
  // A single op has no launch benefit.
  EXPECT_EQ(Scoring(1, 1, 1).evaluate(1, 1, 0), 0u);
  // The worked examples of §14.3 as counts.
  EXPECT_EQ(Scoring(6, 4, 4).evaluate(3, 1, 0), 630u);
  EXPECT_EQ(Scoring(3, 2, 2).evaluate(2, 1, 0), 210u);
  EXPECT_EQ(Scoring(40, 40, 40).evaluate(5, 5, 0), 7390u);
  EXPECT_EQ(Scoring(48, 48, 48).evaluate(6, 6, 0), 8870u);
}

}  // namespace
}  // namespace kiln::fusion
