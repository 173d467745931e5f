// Execution table formatting (docs/spec/fusion.md §17.3, §17.5, §19.12).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sstream>

#include "kiln/fusion/execution_table.h"
#include "pattern_fuser.h"

namespace kiln::fusion::testing {
namespace {

using ::testing::HasSubstr;

ir::Operation exp_op(std::uint64_t in, std::uint64_t out) {
  ir::Operation op;
  op.kind = ir::OpKind::Float_Exp;
  op.family = ir::Family::Float;
  op.num_inputs = 1;
  op.tensors = {T(in, {8}), T(out, {8}, ir::TensorStatus::NotInit)};
  return op;
}

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string l; std::getline(ss, l);) out.push_back(l);
  return out;
}

std::size_t count(const std::string& s, const std::string& needle) {
  std::size_t n = 0;
  for (std::size_t p = s.find(needle); p != std::string::npos; p = s.find(needle, p + 1)) ++n;
  return n;
}

TEST(ExecutionTable, TensorFormatting) {
  EXPECT_EQ(T(42, {2, 3, 4}).to_string(), "t42:f32[2,3,4]");
  std::vector<ir::TensorIr> ts = {T(1, {8}), T(2, ir::Shape{})};
  EXPECT_EQ(ir::format_tensors(ts), "t1:f32[8], t2:f32[]");
}

TEST(ExecutionTable, KindNames) {
  ir::Operation permute;
  permute.kind = ir::OpKind::Base_Permute;
  permute.family = ir::Family::BaseFloat;
  EXPECT_EQ(permute.kind_name(), "BaseFloat::Permute");
  EXPECT_EQ(exp_op(0, 1).kind_name(), "Float::Exp");
}

TEST(ExecutionTable, FusedAndUnfusedBlocks) {
  std::vector<ir::Operation> global = {exp_op(0, 1), exp_op(1, 2), exp_op(2, 3)};
  auto opt = std::make_shared<TestOptimization>(0, 2);
  struct Named : Optimization {
    std::size_t len() const override { return 2; }
    std::string_view name() const override { return "FusedKernel"; }
  };
  auto strategy = C({ExecutionStrategy::optimization(std::make_shared<Named>(), {0, 1}, 42), U({2})});
  const std::string table = format_execution_table(trace_blocks(strategy, global));
  auto lines = split_lines(table);
  ASSERT_GE(lines.size(), 7u);
  EXPECT_EQ(lines[0].find_first_not_of("═"), std::string::npos) << "first line is only ═";
  EXPECT_EQ(lines[1], "fusion trace (3 ops, 2 blocks)");
  EXPECT_THAT(table, HasSubstr("▸ fused FusedKernel (score=42, 2 ops)"));
  EXPECT_THAT(table, HasSubstr("▸ un-fused (1 op)"));
  EXPECT_EQ(count(table, "FusedKernel"), 1u);
  EXPECT_EQ(count(table, "score=42"), 1u);
  EXPECT_EQ(lines[4].rfind("0  ", 0), 0u);
  EXPECT_EQ(lines[5].rfind("1  ", 0), 0u);
  EXPECT_EQ(lines[6].rfind("2  ", 0), 0u);
  EXPECT_NE(table.back(), '\n') << "no trailing newline";
  // Columns are aligned: every row is as wide as the header (cells padded to the column width).
  auto width = [](const std::string& s) {
    std::size_t w = 0;
    for (unsigned char c : s) w += (c & 0xC0) != 0x80;
    return w;
  };
  for (std::size_t i = 2; i < lines.size(); ++i) EXPECT_EQ(width(lines[i]), width(lines[2])) << lines[i];
  EXPECT_EQ(width(lines[0]), width(lines[2]) + 0u) << "rule = sum of widths + 2 x 4";
}

TEST(ExecutionTable, Empty) {
  std::vector<ir::Operation> global;
  EXPECT_EQ(format_execution_table(trace_blocks(U({}), global)), "fusion block: <empty>");
}

}  // namespace
}  // namespace kiln::fusion::testing
