// Dependency-graph toolkit of the search (docs/spec/fusion.md §12): node sets, the DAG over blocks or
// strategy chunks, reachability, contraction checks and execution-order validity.
//
// Thread-safety: plain values; no shared state.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "kiln/ir/tensor.h"

namespace kiln::fusion {

// What the graph algorithms need to know about a node (a single op, a block, a chunk).
// read: external reads (for blocks/chunks) or all input ids (a single op); freed: ids read
// with status ReadWrite; produced: output ids; position: tie-break key.
struct DagNode {
  std::vector<ir::TensorId> produced;
  std::vector<ir::TensorId> read;
  std::vector<ir::TensorId> freed;
  std::uint64_t position = 0;

  bool produces(ir::TensorId id) const;
  bool reads(ir::TensorId id) const;
};

// A set of node indices: one inline 64-bit word for 0..63, a growable vector beyond, kept
// canonical (no trailing zero words) so that == is structural (docs/spec/fusion.md §12.4).
class SubGraph {
 public:
  SubGraph() = default;
  static SubGraph single(std::size_t i);
  void insert(std::size_t i);
  bool contains(std::size_t i) const;
  std::size_t size() const;
  bool empty() const;
  void union_with(const SubGraph& o);
  void intersect_with(const SubGraph& o);
  void subtract(const SubGraph& o);
  bool intersects(const SubGraph& o) const;
  std::vector<std::size_t> to_vector() const;  // ascending
  friend bool operator==(const SubGraph&, const SubGraph&) = default;

 private:
  void canonicalize();
  std::uint64_t inline_ = 0;
  std::vector<std::uint64_t> words_;  // words_[k] holds indices 64*(k+1) .. 64*(k+2)-1
};

class Reachability {
 public:
  // can_contract(a, b): false if either is empty; else no node outside a ∪ b is both an
  // ancestor and a descendant of the union.
  bool can_contract(const SubGraph& a, const SubGraph& b) const;
  const SubGraph& ancestors(std::size_t i) const { return ancestors_[i]; }
  const SubGraph& descendants(std::size_t i) const { return descendants_[i]; }

 private:
  friend class Dag;
  std::vector<SubGraph> ancestors_;
  std::vector<SubGraph> descendants_;
};

class Dag {
 public:
  explicit Dag(std::span<const DagNode> nodes);
  // Node i depends on node j (j first) iff i reads what j produces, or i frees what j reads.
  const std::vector<std::vector<std::size_t>>& dependencies() const { return deps_; }
  // Kahn with a min-priority queue keyed by (position, index); nullopt on a cycle.
  std::optional<std::vector<std::size_t>> topological_order() const;
  bool is_acyclic() const { return topological_order().has_value(); }
  Reachability reachability() const;

 private:
  std::vector<std::uint64_t> positions_;
  std::vector<std::vector<std::size_t>> deps_;  // deps_[i] = nodes i depends on
};

// is_valid_execution_order (docs/spec/fusion.md §12.5): nodes in execution order.
bool is_valid_execution_order(std::span<const DagNode* const> order);
bool is_valid_execution_order(std::span<const DagNode> order);

}  // namespace kiln::fusion
