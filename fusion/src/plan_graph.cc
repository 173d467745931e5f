// Plans for people: summary, text and DOT (kiln/fusion/plan_graph.h).
#include "kiln/fusion/plan_graph.h"

#include <fmt/format.h>

#include <map>
#include <set>
#include <vector>

namespace kiln::fusion {

namespace {

// A block of the plan's strategy: the positions it runs and what runs them.
struct Block {
  std::string fuser;  // the Optimization's name, or "unfused"
  std::uint64_t score = 0;
  bool fused = false;
  Ordering positions;
};

void collect_blocks(const ExecutionStrategy& s, std::vector<Block>& out) {
  switch (s.kind()) {
    case ExecutionStrategy::Kind::Optimization:
      out.push_back(Block{s.opt() ? std::string(s.opt()->name()) : std::string("?"), s.score(), true, s.ordering()});
      return;
    case ExecutionStrategy::Kind::Operations:
      if (!s.ordering().empty()) out.push_back(Block{"unfused", 0, false, s.ordering()});
      return;
    case ExecutionStrategy::Kind::Composed:
      for (const ExecutionStrategy& c : s.children()) collect_blocks(c, out);
      return;
  }
}

std::vector<Block> blocks_of(const ExecutionPlan& plan) {
  std::vector<Block> out;
  collect_blocks(plan.optimization.strategy, out);
  return out;
}

// A DOT string literal's contents: quotes and backslashes escaped, newlines as \n.
std::string dot_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

// Which op writes each tensor, and which tensors the plan reads from outside / leaves behind.
struct Dataflow {
  std::map<std::uint64_t, std::size_t> writer;  // tensor -> position of the op that writes it
  std::set<std::uint64_t> inputs, outputs;
};

Dataflow dataflow(const ExecutionPlan& plan) {
  Dataflow d;
  std::set<std::uint64_t> read_later;
  for (std::size_t i = 0; i < plan.operations.size(); ++i) {
    const ir::Operation& op = plan.operations[i];
    for (const ir::TensorIr& t : op.inputs()) {
      if (d.writer.count(t.id.value()) == 0) d.inputs.insert(t.id.value());
      read_later.insert(t.id.value());
    }
    for (const ir::TensorIr& t : op.outputs()) {
      d.writer[t.id.value()] = i;
      read_later.erase(t.id.value());  // a read after this write is a later read
    }
  }
  // Outputs: written, and not read by an op after the write.
  for (const auto& [tensor, at] : d.writer) {
    bool read_after = false;
    for (std::size_t j = at + 1; j < plan.operations.size() && !read_after; ++j)
      for (const ir::TensorIr& t : plan.operations[j].inputs()) read_after = read_after || t.id.value() == tensor;
    if (!read_after) d.outputs.insert(tensor);
  }
  return d;
}

}  // namespace

std::string plan_fusers(const ExecutionPlan& plan) {
  std::string out;
  for (const Block& b : blocks_of(plan))
    out += fmt::format("{}{}({})", out.empty() ? "" : " + ", b.fuser, b.fused ? b.score : b.positions.size());
  return out.empty() ? "empty" : out;
}

std::uint64_t plan_score(const ExecutionPlan& plan) {
  std::uint64_t score = 0;
  for (const Block& b : blocks_of(plan)) score += b.score;
  return score;
}

std::string plan_to_text(PlanId id, const ExecutionPlan& plan) {
  std::string out =
      fmt::format("plan #{}: {} ops, score {}, {}\n", id, plan.operations.size(), plan_score(plan), plan_fusers(plan));
  for (const Block& b : blocks_of(plan)) {
    out += b.fused ? fmt::format("  block {} (score {}):\n", b.fuser, b.score) : std::string("  unfused:\n");
    for (std::size_t p : b.positions)
      out += fmt::format("    {:>3}: {}\n", p, p < plan.operations.size() ? plan.operations[p].to_string() : "?");
  }
  return out;
}

std::string plan_to_dot(PlanId id, const ExecutionPlan& plan, const PlanUsage* usage) {
  const std::vector<Block> blocks = blocks_of(plan);
  const Dataflow flow = dataflow(plan);
  std::string label = fmt::format("plan #{}: {} ops, score {}", id, plan.operations.size(), plan_score(plan));
  if (usage != nullptr) label += fmt::format("\\n{} cache hits", usage->hits);
  std::string out = fmt::format("digraph plan_{} {{\n  label=\"{}\";\n  labelloc=t;\n  rankdir=TB;\n", id, label);
  out += "  node [shape=box, fontname=\"monospace\", fontsize=10];\n";
  for (std::size_t b = 0; b < blocks.size(); ++b) {
    const Block& blk = blocks[b];
    out += fmt::format("  subgraph cluster_{} {{\n    label=\"{}\";\n    style={};\n", b,
                       blk.fused ? fmt::format("{}, score {}", blk.fuser, blk.score) : std::string("unfused"),
                       blk.fused ? "rounded" : "dashed");
    for (std::size_t p : blk.positions) {
      if (p >= plan.operations.size()) continue;
      out += fmt::format("    op{} [label=\"{}: {}\"];\n", p, p, dot_escape(plan.operations[p].to_string()));
    }
    out += "  }\n";
  }
  for (std::uint64_t t : flow.inputs) out += fmt::format("  t{} [shape=ellipse, label=\"input t{}\"];\n", t, t);
  for (std::uint64_t t : flow.outputs)
    out += fmt::format("  t{} [shape=ellipse, style=bold, label=\"output t{}\"];\n", t, t);
  std::map<std::uint64_t, std::size_t> written;  // tensor -> the latest op before this one that wrote it
  for (std::size_t i = 0; i < plan.operations.size(); ++i) {
    const ir::Operation& op = plan.operations[i];
    for (const ir::TensorIr& t : op.inputs()) {
      if (auto from = written.find(t.id.value()); from != written.end())
        out += fmt::format("  op{} -> op{} [label=\"t{}\"];\n", from->second, i, t.id.value());
      else
        out += fmt::format("  t{} -> op{};\n", t.id.value(), i);  // the plan's input node
    }
    for (const ir::TensorIr& t : op.outputs()) {
      written[t.id.value()] = i;
      if (flow.outputs.count(t.id.value()) != 0 && flow.writer.at(t.id.value()) == i)
        out += fmt::format("  op{} -> t{};\n", i, t.id.value());
    }
  }
  out += "}\n";
  return out;
}

}  // namespace kiln::fusion
