#include "kiln/fusion/dag.h"

#include <algorithm>
#include <bit>
#include <functional>
#include <queue>
#include <unordered_map>
#include <unordered_set>
#include <utility>

namespace kiln::fusion {

// ---------------------------------------------------------------------------------------------
// DagNode
// ---------------------------------------------------------------------------------------------

// Id vectors are small (an op has a handful of tensors, a block a few dozen), so a linear scan
// beats hashing here.
bool DagNode::produces(ir::TensorId id) const {
  return std::find(produced.begin(), produced.end(), id) != produced.end();
}

bool DagNode::reads(ir::TensorId id) const { return std::find(read.begin(), read.end(), id) != read.end(); }

// ---------------------------------------------------------------------------------------------
// SubGraph
// ---------------------------------------------------------------------------------------------

namespace {

constexpr std::size_t kWordBits = 64;

// Index i >= 64 lives in words_[i / 64 - 1], bit i % 64.
std::size_t word_of(std::size_t i) { return i / kWordBits - 1; }
std::uint64_t bit_of(std::size_t i) { return std::uint64_t{1} << (i % kWordBits); }

}  // namespace

SubGraph SubGraph::single(std::size_t i) {
  SubGraph s;
  s.insert(i);
  return s;
}

void SubGraph::insert(std::size_t i) {
  if (i < kWordBits) {
    inline_ |= bit_of(i);
    return;
  }
  const std::size_t k = word_of(i);
  if (words_.size() <= k) words_.resize(k + 1, 0);
  words_[k] |= bit_of(i);
}

bool SubGraph::contains(std::size_t i) const {
  if (i < kWordBits) return (inline_ & bit_of(i)) != 0;
  const std::size_t k = word_of(i);
  return k < words_.size() && (words_[k] & bit_of(i)) != 0;
}

std::size_t SubGraph::size() const {
  std::size_t n = static_cast<std::size_t>(std::popcount(inline_));
  for (std::uint64_t w : words_) n += static_cast<std::size_t>(std::popcount(w));
  return n;
}

bool SubGraph::empty() const { return inline_ == 0 && words_.empty(); }

void SubGraph::union_with(const SubGraph& o) {
  inline_ |= o.inline_;
  if (words_.size() < o.words_.size()) words_.resize(o.words_.size(), 0);
  for (std::size_t k = 0; k < o.words_.size(); ++k) words_[k] |= o.words_[k];
  // Both sides canonical → the longer one's last word is non-zero → result canonical.
}

void SubGraph::intersect_with(const SubGraph& o) {
  inline_ &= o.inline_;
  if (words_.size() > o.words_.size()) words_.resize(o.words_.size());
  for (std::size_t k = 0; k < words_.size(); ++k) words_[k] &= o.words_[k];
  canonicalize();
}

void SubGraph::subtract(const SubGraph& o) {
  inline_ &= ~o.inline_;
  const std::size_t common = std::min(words_.size(), o.words_.size());
  for (std::size_t k = 0; k < common; ++k) words_[k] &= ~o.words_[k];
  canonicalize();
}

bool SubGraph::intersects(const SubGraph& o) const {
  if ((inline_ & o.inline_) != 0) return true;
  const std::size_t common = std::min(words_.size(), o.words_.size());
  for (std::size_t k = 0; k < common; ++k) {
    if ((words_[k] & o.words_[k]) != 0) return true;
  }
  return false;
}

std::vector<std::size_t> SubGraph::to_vector() const {
  std::vector<std::size_t> out;
  out.reserve(size());
  auto emit = [&out](std::uint64_t w, std::size_t base) {
    while (w != 0) {
      out.push_back(base + static_cast<std::size_t>(std::countr_zero(w)));
      w &= w - 1;  // clear the lowest set bit
    }
  };
  emit(inline_, 0);
  for (std::size_t k = 0; k < words_.size(); ++k) emit(words_[k], kWordBits * (k + 1));
  return out;
}

void SubGraph::canonicalize() {
  while (!words_.empty() && words_.back() == 0) words_.pop_back();
}

// ---------------------------------------------------------------------------------------------
// Reachability
// ---------------------------------------------------------------------------------------------

bool Reachability::can_contract(const SubGraph& a, const SubGraph& b) const {
  if (a.empty() || b.empty()) return false;
  SubGraph u = a;
  u.union_with(b);
  SubGraph anc;
  SubGraph desc;
  for (std::size_t x : u.to_vector()) {
    // An index the graph does not know (past its node count) has no edges: it is an isolated
    // node and contributes nothing to A or D.
    if (x >= ancestors_.size()) continue;
    anc.union_with(ancestors_[x]);
    desc.union_with(descendants_[x]);
  }
  anc.intersect_with(desc);
  anc.subtract(u);
  return anc.empty();
}

// ---------------------------------------------------------------------------------------------
// Dag
// ---------------------------------------------------------------------------------------------

Dag::Dag(std::span<const DagNode> nodes) {
  const std::size_t n = nodes.size();
  positions_.reserve(n);
  deps_.assign(n, {});

  // id → nodes producing it / reading it; one pass over every id list instead of comparing
  // every pair of nodes id by id.
  std::unordered_map<ir::TensorId, std::vector<std::size_t>> producers;
  std::unordered_map<ir::TensorId, std::vector<std::size_t>> readers;
  for (std::size_t j = 0; j < n; ++j) {
    positions_.push_back(nodes[j].position);
    for (ir::TensorId id : nodes[j].produced) producers[id].push_back(j);
    for (ir::TensorId id : nodes[j].read) readers[id].push_back(j);
  }

  for (std::size_t i = 0; i < n; ++i) {
    std::vector<std::size_t>& deps = deps_[i];
    // Read-after-write: i reads an id that j produces.
    for (ir::TensorId id : nodes[i].read) {
      auto it = producers.find(id);
      if (it == producers.end()) continue;
      for (std::size_t j : it->second) {
        if (j != i) deps.push_back(j);
      }
    }
    // Write-after-read: i frees an id that j reads.
    for (ir::TensorId id : nodes[i].freed) {
      auto it = readers.find(id);
      if (it == readers.end()) continue;
      for (std::size_t j : it->second) {
        if (j != i) deps.push_back(j);
      }
    }
    std::sort(deps.begin(), deps.end());
    deps.erase(std::unique(deps.begin(), deps.end()), deps.end());
  }
}

std::optional<std::vector<std::size_t>> Dag::topological_order() const {
  const std::size_t n = deps_.size();
  std::vector<std::size_t> in_degree(n, 0);
  std::vector<std::vector<std::size_t>> dependents(n);
  for (std::size_t i = 0; i < n; ++i) {
    in_degree[i] = deps_[i].size();  // deps_ is deduplicated
    for (std::size_t j : deps_[i]) dependents[j].push_back(i);
  }

  using Key = std::pair<std::uint64_t, std::size_t>;  // (position, index)
  std::priority_queue<Key, std::vector<Key>, std::greater<>> ready;
  for (std::size_t i = 0; i < n; ++i) {
    if (in_degree[i] == 0) ready.emplace(positions_[i], i);
  }

  std::vector<std::size_t> order;
  order.reserve(n);
  while (!ready.empty()) {
    const std::size_t j = ready.top().second;
    ready.pop();
    order.push_back(j);
    for (std::size_t i : dependents[j]) {
      if (--in_degree[i] == 0) ready.emplace(positions_[i], i);
    }
  }
  if (order.size() != n) return std::nullopt;  // the rest lies on or behind a cycle
  return order;
}

Reachability Dag::reachability() const {
  const std::size_t n = deps_.size();
  Reachability r;
  r.ancestors_.assign(n, {});
  r.descendants_.assign(n, {});

  // ancestors[i] ∪= deps[i] ∪ ancestors[d] for every direct dependency d.
  auto absorb = [&](std::size_t i) {
    for (std::size_t d : deps_[i]) {
      r.ancestors_[i].insert(d);  // d != i: the constructor never adds self edges
      r.ancestors_[i].union_with(r.ancestors_[d]);
    }
  };

  if (auto order = topological_order()) {
    // Dependencies come first, so their sets are final when read: one pass suffices.
    for (std::size_t i : *order) absorb(i);
  } else {
    // Defensive path for cyclic graphs: iterate to a fixpoint. Nodes on a cycle end up in their
    // own ancestor set, which can_contract tolerates (members of the union are subtracted).
    bool grew = true;
    while (grew) {
      grew = false;
      for (std::size_t i = 0; i < n; ++i) {
        const std::size_t before = r.ancestors_[i].size();
        absorb(i);
        if (r.ancestors_[i].size() != before) grew = true;
      }
    }
  }

  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t a : r.ancestors_[i].to_vector()) r.descendants_[a].insert(i);
  }
  return r;
}

// ---------------------------------------------------------------------------------------------
// Execution-order validity (docs/spec/fusion.md §12.5)
// ---------------------------------------------------------------------------------------------

namespace {

const DagNode& deref(const DagNode& n) { return n; }
const DagNode& deref(const DagNode* n) { return *n; }

template <typename Range>
bool valid_order(const Range& order) {
  std::unordered_set<ir::TensorId> produced_anywhere;
  for (const auto& n : order) {
    for (ir::TensorId id : deref(n).produced) produced_anywhere.insert(id);
  }
  std::unordered_set<ir::TensorId> alive;
  std::unordered_set<ir::TensorId> dead;
  for (const auto& entry : order) {
    const DagNode& n = deref(entry);
    for (ir::TensorId r : n.read) {
      if (dead.contains(r)) return false;  // read after free
      if (!alive.contains(r)) {
        // Not yet produced but produced later (or by this very node, the in-place case):
        // read before its producer.
        if (produced_anywhere.contains(r)) return false;
        alive.insert(r);  // external input, assumed live
      }
    }
    for (ir::TensorId r : n.freed) {
      alive.erase(r);
      dead.insert(r);
    }
    for (ir::TensorId r : n.produced) {
      dead.erase(r);
      alive.insert(r);
    }
  }
  return true;
}

}  // namespace

bool is_valid_execution_order(std::span<const DagNode* const> order) { return valid_order(order); }

bool is_valid_execution_order(std::span<const DagNode> order) { return valid_order(order); }

}  // namespace kiln::fusion
