// A plan for people (kilnctl plans show, kiln-lab --dot): summary, text and Graphviz DOT.
#include "kiln/fusion/plan_graph.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace kiln::fusion {
namespace {

using ir::Operation;
using ir::TensorStatus;

class Named final : public Optimization {
 public:
  Named(std::string name, std::size_t len) : name_(std::move(name)), len_(len) {}
  std::size_t len() const override { return len_; }
  std::string_view name() const override { return name_; }

 private:
  std::string name_;
  std::size_t len_;
};

ir::TensorIr T(std::uint64_t id, TensorStatus status = TensorStatus::ReadOnly) {
  return ir::TensorIr{ir::TensorId(id), ir::Shape{4, 8}, status, ir::dtypes::f32};
}

Operation unary(ir::OpKind kind, std::uint64_t in, std::uint64_t out) {
  Operation op;
  op.kind = kind;
  op.family = ir::Family::Float;
  op.dtype = ir::dtypes::f32;
  op.num_inputs = 1;
  op.tensors = {T(in, TensorStatus::ReadWrite), T(out, TensorStatus::NotInit)};
  return op;
}

// exp(t0) -> t1, log(t1) -> t2 fused (score 630); tanh(t2) -> t3 unfused.
ExecutionPlan three_op_plan() {
  ExecutionPlan plan;
  plan.operations = {unary(ir::OpKind::Float_Exp, 0, 1), unary(ir::OpKind::Float_Log, 1, 2),
                     unary(ir::OpKind::Float_Tanh, 2, 3)};
  std::vector<ExecutionStrategy> children;
  children.push_back(ExecutionStrategy::optimization(std::make_shared<Named>("ElementWise", 2), {0, 1}, 630));
  children.push_back(ExecutionStrategy::operations({2}));
  plan.optimization = BlockOptimization(ExecutionStrategy::composed(std::move(children)), {0, 1, 2});
  return plan;
}

TEST(PlanGraph, SummaryNamesTheBlocksAndTheScore) {
  const ExecutionPlan plan = three_op_plan();
  EXPECT_EQ(plan_fusers(plan), "ElementWise(630) + unfused(1)");
  EXPECT_EQ(plan_score(plan), 630u);
  const std::string text = plan_to_text(12, plan);
  EXPECT_EQ(text.rfind("plan #12: 3 ops, score 630, ElementWise(630) + unfused(1)\n", 0), 0u) << text;
  EXPECT_NE(text.find("  block ElementWise (score 630):\n      0: "), std::string::npos) << text;
  EXPECT_NE(text.find("  unfused:\n      2: "), std::string::npos) << text;
}

TEST(PlanGraph, DotHasBlocksAsClustersOpsAsNodesAndMarkedInputsAndOutputs) {
  PlanUsage usage;
  usage.hits = 41;
  const std::string dot = plan_to_dot(12, three_op_plan(), &usage);
  EXPECT_EQ(dot.rfind("digraph plan_12 {\n  label=\"plan #12: 3 ops, score 630\\n41 cache hits\";", 0), 0u) << dot;
  EXPECT_NE(
      dot.find("subgraph cluster_0 {\n    label=\"ElementWise, score 630\";\n    style=rounded;\n    op0 [label=\"0: "),
      std::string::npos)
      << dot;
  EXPECT_NE(dot.find("subgraph cluster_1 {\n    label=\"unfused\";\n    style=dashed;\n    op2 [label=\"2: "),
            std::string::npos)
      << dot;
  EXPECT_NE(dot.find("  t0 [shape=ellipse, label=\"input t0\"];\n"), std::string::npos) << dot;
  EXPECT_NE(dot.find("  t3 [shape=ellipse, style=bold, label=\"output t3\"];\n"), std::string::npos) << dot;
  EXPECT_NE(dot.find("  t0 -> op0;\n"), std::string::npos);
  EXPECT_NE(dot.find("  op0 -> op1 [label=\"t1\"];\n"), std::string::npos);
  EXPECT_NE(dot.find("  op1 -> op2 [label=\"t2\"];\n"), std::string::npos);
  EXPECT_NE(dot.find("  op2 -> t3;\n"), std::string::npos);
  EXPECT_EQ(dot.find("output t1"), std::string::npos) << "t1 is read inside the plan";
  EXPECT_EQ(dot.substr(dot.size() - 2), "}\n");
  // Balanced braces and quotes: a file `dot` accepts.
  EXPECT_EQ(std::count(dot.begin(), dot.end(), '{'), std::count(dot.begin(), dot.end(), '}'));
  std::size_t quotes = 0;
  for (std::size_t i = 0; i < dot.size(); ++i)
    if (dot[i] == '"' && (i == 0 || dot[i - 1] != '\\')) ++quotes;
  EXPECT_EQ(quotes % 2, 0u);
}

}  // namespace
}  // namespace kiln::fusion
