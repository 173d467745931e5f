#include "kiln/fusion/strategy.h"

#include <algorithm>
#include <cassert>
#include <utility>

namespace kiln::fusion {
namespace {

std::string ordering_to_string(const Ordering& o) {
  std::string s = "[";
  for (std::size_t i = 0; i < o.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(o[i]);
  }
  s += ']';
  return s;
}

void flatten_into(const ExecutionStrategy& s, Ordering& out) {
  if (s.kind() == ExecutionStrategy::Kind::Composed) {
    for (const ExecutionStrategy& c : s.children()) flatten_into(c, out);
  } else {
    out.insert(out.end(), s.ordering().begin(), s.ordering().end());
  }
}

// Optimizations compare by what they show: two finished fusers are "the same" for plans and
// tests when they have the same name, cover the same number of ops and describe the same program.
bool same_optimization(const OptimizationPtr& a, const OptimizationPtr& b) {
  if (!a || !b) return !a && !b;
  if (a == b) return true;
  return a->name() == b->name() && a->len() == b->len() && a->describe() == b->describe();
}

}  // namespace

ExecutionStrategy ExecutionStrategy::optimization(OptimizationPtr opt, Ordering ordering, std::uint64_t score) {
  ExecutionStrategy s;
  s.kind_ = Kind::Optimization;
  s.opt_ = std::move(opt);
  s.ordering_ = std::move(ordering);
  s.score_ = score;
  return s;
}

ExecutionStrategy ExecutionStrategy::operations(Ordering ordering) {
  ExecutionStrategy s;
  s.kind_ = Kind::Operations;
  s.ordering_ = std::move(ordering);
  return s;
}

ExecutionStrategy ExecutionStrategy::composed(std::vector<ExecutionStrategy> children) {
  ExecutionStrategy s;
  s.kind_ = Kind::Composed;
  s.children_ = std::move(children);
  return s;
}

std::optional<std::uint64_t> ExecutionStrategy::max_relative_shape_id() const {
  switch (kind_) {
    case Kind::Optimization: return opt_ ? opt_->max_relative_shape_id() : std::nullopt;
    case Kind::Operations: return std::nullopt;
    case Kind::Composed: {
      std::optional<std::uint64_t> best;
      for (const ExecutionStrategy& c : children_) {
        if (auto m = c.max_relative_shape_id(); m && (!best || *m > *best)) best = m;
      }
      return best;
    }
  }
  return std::nullopt;
}

void ExecutionStrategy::map_ordering(std::span<const std::size_t> mapping) {
  if (kind_ == Kind::Composed) {
    for (ExecutionStrategy& c : children_) c.map_ordering(mapping);
    return;
  }
  for (std::size_t& p : ordering_) {
    assert(p < mapping.size());
    p = mapping[p];
  }
}

Ordering ExecutionStrategy::flatten() const {
  Ordering out;
  flatten_into(*this, out);
  return out;
}

std::string ExecutionStrategy::to_string() const {
  switch (kind_) {
    case Kind::Optimization:
      return "O(" + std::string(opt_ ? opt_->name() : std::string_view("null")) + "," + ordering_to_string(ordering_) +
             "," + std::to_string(score_) + ")";
    case Kind::Operations: return "U(" + ordering_to_string(ordering_) + ")";
    case Kind::Composed: {
      std::string s = "C([";
      for (std::size_t i = 0; i < children_.size(); ++i) {
        if (i) s += ", ";
        s += children_[i].to_string();
      }
      return s + "])";
    }
  }
  return "?";
}

bool operator==(const ExecutionStrategy& a, const ExecutionStrategy& b) {
  return a.kind_ == b.kind_ && a.ordering_ == b.ordering_ && a.score_ == b.score_ && a.children_ == b.children_ &&
         same_optimization(a.opt_, b.opt_);
}

void BlockOptimization::include_trailing(std::size_t n) {
  const std::size_t covered = ordering.size();
  if (covered >= n) return;
#ifndef NDEBUG
  {
    // Precondition (§5.2): the covered positions are exactly 0..covered-1, so the uncovered
    // ones form a trailing run.
    Ordering sorted = ordering;
    std::sort(sorted.begin(), sorted.end());
    for (std::size_t i = 0; i < sorted.size(); ++i) assert(sorted[i] == i && "include_trailing: holes before the tail");
  }
#endif
  Ordering trailing;
  trailing.reserve(n - covered);
  for (std::size_t p = covered; p < n; ++p) trailing.push_back(p);
  ordering.insert(ordering.end(), trailing.begin(), trailing.end());
  if (strategy.kind() == ExecutionStrategy::Kind::Composed) {
    strategy.children().push_back(ExecutionStrategy::operations(std::move(trailing)));
  } else {
    std::vector<ExecutionStrategy> children;
    children.reserve(2);
    children.push_back(std::move(strategy));
    children.push_back(ExecutionStrategy::operations(std::move(trailing)));
    strategy = ExecutionStrategy::composed(std::move(children));
  }
}

BlockOptimization BlockOptimization::unfused(std::size_t n) {
  Ordering o(n);
  for (std::size_t i = 0; i < n; ++i) o[i] = i;
  return BlockOptimization(ExecutionStrategy::operations(o), o);
}

}  // namespace kiln::fusion
