// Execution strategies and block optimizations (docs/spec/fusion.md §5.1, §5.2).
//
// An ordering lists queue positions in EXECUTION order (not necessarily ascending).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kiln/fusion/fuser.h"

namespace kiln::fusion {

using Ordering = std::vector<std::size_t>;

class ExecutionStrategy {
 public:
  enum class Kind : std::uint8_t { Optimization, Operations, Composed };

  static ExecutionStrategy optimization(OptimizationPtr opt, Ordering ordering, std::uint64_t score);
  static ExecutionStrategy operations(Ordering ordering);
  static ExecutionStrategy composed(std::vector<ExecutionStrategy> children);

  Kind kind() const { return kind_; }
  const OptimizationPtr& opt() const { return opt_; }
  const Ordering& ordering() const { return ordering_; }  // Optimization / Operations
  std::uint64_t score() const { return score_; }
  const std::vector<ExecutionStrategy>& children() const { return children_; }
  std::vector<ExecutionStrategy>& children() { return children_; }

  // Optimization -> its opt's value; Operations -> none; Composed -> max over children.
  std::optional<std::uint64_t> max_relative_shape_id() const;
  // Replace every position p by mapping[p] (lifting a sub-search's local positions).
  void map_ordering(std::span<const std::size_t> mapping);
  // All leaf positions in execution order.
  Ordering flatten() const;
  // Compact form for tests and logs: O(name,[0,1],630) U([2]) C([...]).
  std::string to_string() const;

  friend bool operator==(const ExecutionStrategy& a, const ExecutionStrategy& b);

 private:
  Kind kind_ = Kind::Operations;
  OptimizationPtr opt_;
  Ordering ordering_;
  std::uint64_t score_ = 0;
  std::vector<ExecutionStrategy> children_;
};

struct BlockOptimization {
  ExecutionStrategy strategy;
  Ordering ordering;  // concatenation of all leaf orderings in execution order

  BlockOptimization() = default;
  BlockOptimization(ExecutionStrategy s, Ordering o) : strategy(std::move(s)), ordering(std::move(o)) {}
  // Append positions ordering.size() .. n-1 as a trailing Operations leaf (§5.2).
  void include_trailing(std::size_t n);
  // Executed fully unfused, in submission order 0..n-1.
  static BlockOptimization unfused(std::size_t n);
  friend bool operator==(const BlockOptimization&, const BlockOptimization&) = default;
};

}  // namespace kiln::fusion
