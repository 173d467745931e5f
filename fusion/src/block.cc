#include "kiln/fusion/block.h"

#include <algorithm>
#include <cassert>

namespace kiln::fusion {

DagNode operation_node(const ir::Operation& op, std::size_t position) {
  DagNode n;
  n.position = position;
  for (const ir::TensorIr& t : op.inputs()) {
    n.read.push_back(t.id);
    if (t.status == ir::TensorStatus::ReadWrite) n.freed.push_back(t.id);
  }
  for (const ir::TensorIr& t : op.outputs()) n.produced.push_back(t.id);
  return n;
}

bool ordering_is_valid(std::span<const std::size_t> positions, std::span<const ir::Operation> ops) {
  std::vector<DagNode> nodes;
  nodes.reserve(positions.size());
  for (std::size_t p : positions) {
    assert(p < ops.size());
    nodes.push_back(operation_node(ops[p], p));
  }
  return is_valid_execution_order(std::span<const DagNode>(nodes));
}

Block::Block(const FuserList& prototypes) : fusers_(clone_fusers(prototypes)) {
  closed_at_.reserve(fusers_.size());
  for (const auto& f : fusers_) {
    // (K) a fuser already Closed at creation counts as closed at index -1: it adds nothing to
    // the settled head.
    closed_at_.push_back(f->status() == FuserStatus::Closed ? std::optional<std::ptrdiff_t>(-1) : std::nullopt);
  }
}

Block::Block(const Block& other)
    : fusers_(clone_fusers(other.fusers_)),
      closed_at_(other.closed_at_),
      operations_(other.operations_),
      ordering_(other.ordering_),
      ids_(other.ids_),
      produced_(other.produced_),
      read_(other.read_),
      freed_(other.freed_),
      constituents_(other.constituents_),
      start_pos_(other.start_pos_),
      end_pos_(other.end_pos_) {}

Block& Block::operator=(const Block& other) {
  if (this != &other) {
    Block copy(other);
    *this = std::move(copy);
  }
  return *this;
}

RegistrationResult Block::register_op(const ir::Operation& op, std::size_t pos, bool force) {
  if (ids_.empty()) {
    register_inner(op, pos);
    return RegistrationResult::Accepted;
  }
  if (force || contains_any_tensor(op.nodes())) {
    register_inner(op, pos);
    return RegistrationResult::Accepted;
  }
  return RegistrationResult::NotPartOfTheGraph;
}

void Block::register_inner(const ir::Operation& op, std::size_t pos) {
  operations_.push_back(op);
  ordering_.push_back(pos);
  start_pos_ = std::min(start_pos_, pos);
  end_pos_ = std::max(end_pos_, pos + 1);
  const auto index = static_cast<std::ptrdiff_t>(operations_.size()) - 1;
  for (std::size_t i = 0; i < fusers_.size(); ++i) {
    OperationFuser& f = *fusers_[i];
    const bool was_open = f.status() == FuserStatus::Open;
    f.fuse(op);
    if (was_open && f.status() == FuserStatus::Closed) closed_at_[i] = index;
  }
  for (const ir::TensorIr& t : op.nodes()) ids_.insert(t.id);
  // Order-independent bookkeeping: stays right when merges append ops out of stream order.
  for (const ir::TensorIr& t : op.inputs()) {
    if (!produced_.contains(t.id)) read_.insert(t.id);
    if (t.status == ir::TensorStatus::ReadWrite) freed_.insert(t.id);
  }
  for (const ir::TensorIr& t : op.outputs()) {
    produced_.insert(t.id);
    read_.erase(t.id);
  }
}

bool Block::can_append(const Block& other) const {
  std::vector<DagNode> nodes;
  nodes.reserve(operations_.size() + other.operations_.size());
  for (std::size_t i = 0; i < operations_.size(); ++i) nodes.push_back(operation_node(operations_[i], ordering_[i]));
  for (std::size_t i = 0; i < other.operations_.size(); ++i)
    nodes.push_back(operation_node(other.operations_[i], other.ordering_[i]));
  return is_valid_execution_order(std::span<const DagNode>(nodes));
}

bool Block::merge(const Block& other) {
  if (!can_append(other)) return false;
  const bool self_ready = has_ready_optimization();
  const bool other_ready = other.has_ready_optimization();
  constituents_.union_with(other.constituents_);
  for (std::size_t i = 0; i < other.operations_.size(); ++i)
    register_op(other.operations_[i], other.ordering_[i], true);
  // Keep the merge while the merged block can still grow; otherwise only when it creates a
  // ready fusion that neither side had (merging two ready blocks would hide one of them).
  if (still_optimizing()) return true;
  return !self_ready && !other_ready && has_ready_optimization();
}

bool Block::still_optimizing() const {
  return std::any_of(fusers_.begin(), fusers_.end(), [](const auto& f) { return f->status() == FuserStatus::Open; });
}

bool Block::has_ready_optimization() const {
  return std::any_of(fusers_.begin(), fusers_.end(), [](const auto& f) { return f->properties().ready; });
}

bool Block::contains_any_tensor(std::span<const ir::TensorIr> tensors) const {
  return std::any_of(tensors.begin(), tensors.end(), [&](const ir::TensorIr& t) { return ids_.contains(t.id); });
}

std::size_t Block::head_length(const FuserList& prototypes) const {
  const std::size_t n = operations_.size();
  // (K) some fuser still Open (or no fuser at all): settle the whole block, as the snapshot did.
  if (fusers_.empty()) return n;
  std::ptrdiff_t last_closed = -1;
  for (const auto& c : closed_at_) {
    if (!c) return n;
    last_closed = std::max(last_closed, *c);
  }
  // operations_settled_once_every_builder_closed: up to and including the op that closed the
  // last fuser; never 0.
  std::size_t h = std::max<std::size_t>(1, static_cast<std::size_t>(last_closed + 1));
  // operations_settled_while_no_builder_would_start: extend over ops on which no freshly reset
  // fuser would stay Open.
  while (h < n) {
    const ir::Operation& op = operations_[h];
    const bool would_start = std::any_of(prototypes.begin(), prototypes.end(), [&](const auto& p) {
      auto q = p->clone();
      q->reset();
      q->fuse(op);
      return q->status() == FuserStatus::Open;
    });
    if (would_start) break;
    ++h;
  }
  return std::min(h, n);
}

BlockOptimization Block::optimize(const FuserList& prototypes) {
  std::optional<std::size_t> best;
  std::uint64_t best_score = 0;
  for (std::size_t i = 0; i < fusers_.size(); ++i) {
    const FuserProperties p = fusers_[i]->properties();
    // Strictly above: a score of 0 never wins, and ties keep the earlier registry entry.
    if (p.ready && p.score > best_score) {
      best = i;
      best_score = p.score;
    }
  }
  Ordering ordering = ordering_;
  if (best) {
    OptimizationPtr opt = fusers_[*best]->finish();
    const std::size_t n = opt ? opt->len() : 0;
    // The fuser covered only its accepted prefix of the registered ops.
    if (n < ordering.size()) ordering.resize(n);
    auto strategy = ExecutionStrategy::optimization(std::move(opt), ordering, best_score);
    return BlockOptimization(std::move(strategy), std::move(ordering));
  }
  ordering.resize(head_length(prototypes));
  auto strategy = ExecutionStrategy::operations(ordering);
  return BlockOptimization(std::move(strategy), std::move(ordering));
}

DagNode Block::dag_node() const {
  DagNode n;
  n.produced.assign(produced_.begin(), produced_.end());
  n.read.assign(read_.begin(), read_.end());
  n.freed.assign(freed_.begin(), freed_.end());
  n.position = start_pos_;
  return n;
}

void Block::sort_by_start_pos(std::vector<Block>& blocks) {
  std::stable_sort(blocks.begin(), blocks.end(),
                   [](const Block& a, const Block& b) { return a.start_pos() < b.start_pos(); });
}

}  // namespace kiln::fusion
