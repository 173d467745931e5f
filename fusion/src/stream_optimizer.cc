#include "kiln/fusion/stream_optimizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>
#include <numeric>
#include <set>
#include <utility>

#include "kiln/fusion/dag.h"
#include "kiln/fusion/merging.h"

namespace kiln::fusion {
namespace {

// ---------------------------------------------------------------------------------------------
// repair_order helpers (§10.6)
// ---------------------------------------------------------------------------------------------

// Number of positions a strategy covers (its share of the concatenated ordering).
std::size_t covered_len(const ExecutionStrategy& s) {
  if (s.kind() != ExecutionStrategy::Kind::Composed) return s.ordering().size();
  std::size_t n = 0;
  for (const ExecutionStrategy& c : s.children()) n += covered_len(c);
  return n;
}

// One top-level strategy of a composed optimization, viewed as an atomic graph node.
struct Chunk {
  Ordering positions;
  DagNode node;
};

Chunk make_chunk(Ordering positions, std::span<const ir::Operation> ops) {
  std::set<ir::TensorId> produced, read, freed;
  for (std::size_t p : positions)
    for (const ir::TensorIr& t : ops[p].outputs()) produced.insert(t.id);
  for (std::size_t p : positions) {
    for (const ir::TensorIr& t : ops[p].inputs()) {
      // A ReadWrite read frees the tensor even when this chunk also produced it: the
      // write-after-read hazard against readers in other chunks still applies.
      if (t.status == ir::TensorStatus::ReadWrite) freed.insert(t.id);
      if (!produced.contains(t.id)) read.insert(t.id);
    }
  }
  Chunk c;
  c.node.produced.assign(produced.begin(), produced.end());
  c.node.read.assign(read.begin(), read.end());
  c.node.freed.assign(freed.begin(), freed.end());
  c.node.position = positions.empty() ? 0 : *std::min_element(positions.begin(), positions.end());
  c.positions = std::move(positions);
  return c;
}

std::optional<std::vector<std::size_t>> chunk_order(const std::vector<Chunk>& chunks) {
  std::vector<DagNode> nodes;
  nodes.reserve(chunks.size());
  for (const Chunk& c : chunks) nodes.push_back(c.node);
  return Dag(std::span<const DagNode>(nodes)).topological_order();
}

BlockOptimization unfused_stream_order(Ordering positions, const FusionLog& log) {
  log.log(LogLevel::Medium,
          [&] { return fmt::format("[repair] falling back to unfused stream order ({} ops)", positions.size()); });
  std::sort(positions.begin(), positions.end());
  auto strategy = ExecutionStrategy::operations(positions);
  return BlockOptimization(std::move(strategy), std::move(positions));
}

// Emit the children in chunk order; always Composed, even with one child.
BlockOptimization assemble(std::vector<ExecutionStrategy> children, const std::vector<Chunk>& chunks,
                           const std::vector<std::size_t>& order, std::span<const ir::Operation> ops,
                           const FusionLog& log) {
  std::vector<ExecutionStrategy> strategies;
  strategies.reserve(order.size());
  Ordering ordering;
  for (std::size_t k : order) {
    strategies.push_back(std::move(children[k]));
    ordering.insert(ordering.end(), chunks[k].positions.begin(), chunks[k].positions.end());
  }
  // A chunk that is internally mis-ordered can still break a lifetime after the chunk sort.
  if (!ordering_is_valid(ordering, ops)) return unfused_stream_order(std::move(ordering), log);
  return BlockOptimization(ExecutionStrategy::composed(std::move(strategies)), std::move(ordering));
}

// Every Operations child split into single-position children; fused (and nested composed)
// children stay whole.
BlockOptimization repair_order_split(std::vector<ExecutionStrategy> children, std::vector<Chunk> chunks,
                                     std::span<const ir::Operation> ops, const FusionLog& log) {
  std::vector<ExecutionStrategy> split_children;
  std::vector<Chunk> split_chunks;
  for (std::size_t i = 0; i < children.size(); ++i) {
    if (children[i].kind() == ExecutionStrategy::Kind::Operations) {
      for (std::size_t p : chunks[i].positions) {
        split_children.push_back(ExecutionStrategy::operations({p}));
        split_chunks.push_back(make_chunk({p}, ops));
      }
    } else {
      split_children.push_back(std::move(children[i]));
      split_chunks.push_back(std::move(chunks[i]));
    }
  }
  if (auto order = chunk_order(split_chunks))
    return assemble(std::move(split_children), split_chunks, *order, ops, log);
  Ordering all;
  for (const Chunk& c : split_chunks) all.insert(all.end(), c.positions.begin(), c.positions.end());
  return unfused_stream_order(std::move(all), log);
}

}  // namespace

BlockOptimization repair_order(BlockOptimization bo, std::span<const ir::Operation> ops, const FusionLog& log) {
  if (bo.strategy.kind() != ExecutionStrategy::Kind::Composed) {
    // Nothing to reorder across, but a merge can leave the ops internally out of order.
    if (ordering_is_valid(bo.ordering, ops)) return bo;
    return unfused_stream_order(std::move(bo.ordering), log);
  }
  std::vector<ExecutionStrategy> children = std::move(bo.strategy.children());
  std::vector<Chunk> chunks;
  chunks.reserve(children.size());
  std::size_t offset = 0;
  for (const ExecutionStrategy& c : children) {
    const std::size_t len = covered_len(c);
    assert(offset + len <= bo.ordering.size());
    chunks.push_back(make_chunk(Ordering(bo.ordering.begin() + static_cast<std::ptrdiff_t>(offset),
                                         bo.ordering.begin() + static_cast<std::ptrdiff_t>(offset + len)),
                                ops));
    offset += len;
  }
  auto order = chunk_order(chunks);
  if (!order) return repair_order_split(std::move(children), std::move(chunks), ops, log);
  return assemble(std::move(children), chunks, *order, ops, log);
}

// ---------------------------------------------------------------------------------------------
// BlocksOptimizer (§10.5)
// ---------------------------------------------------------------------------------------------

std::vector<Block> BlocksOptimizer::merging_pass(std::vector<Block> blocks) {
  if (blocks.size() <= 1) return blocks;
  Block::sort_by_start_pos(blocks);
  for (std::size_t i = 0; i < blocks.size(); ++i) blocks[i].seed_constituent(i);
  const std::vector<DagNode> nodes = block_nodes(blocks);
  const Reachability guard = Dag(std::span<const DagNode>(nodes)).reachability();
  MergeResult r = merge_block_list(std::span<const Block>(blocks), false, guard);
  switch (r.kind) {
    case MergeResult::Kind::Full: return std::move(r.merged);
    case MergeResult::Kind::Partial: {
      std::vector<Block> out = std::move(r.merged);
      for (Block& b : r.failed) out.push_back(std::move(b));
      Block::sort_by_start_pos(out);
      return out;
    }
    case MergeResult::Kind::Fail: break;
  }
  return blocks;
}

BlocksOptimizer::Result BlocksOptimizer::optimize() && {
  std::size_t num_ops = 0;
  for (const Block& b : blocks_) num_ops = std::max(num_ops, b.end_pos());
  std::vector<Block> blocks = merging_pass(std::move(blocks_));

  const std::vector<DagNode> nodes = block_nodes(blocks);
  std::vector<std::size_t> order;
  if (auto topo = Dag(std::span<const DagNode>(nodes)).topological_order()) {
    order = std::move(*topo);
  } else {
    order.resize(blocks.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
  }

  Result result;
  std::vector<bool> resolved(num_ops, false);
  for (std::size_t b : order) {
    BlockOptimization bo = blocks[b].optimize(prototypes_);
    for (std::size_t p : bo.ordering) {
      if (p >= resolved.size()) resolved.resize(p + 1, false);
      resolved[p] = true;
    }
    result.ordering.insert(result.ordering.end(), bo.ordering.begin(), bo.ordering.end());
    result.strategies.push_back(std::move(bo.strategy));
  }
  std::size_t last = 0;
  for (std::size_t p = resolved.size(); p > 0; --p) {
    if (resolved[p - 1]) {
      last = p;
      break;
    }
  }
  for (std::size_t p = 0; p < last; ++p)
    if (!resolved[p]) result.holes.push_back(p);  // interior gaps only; the tail stays queued

  const std::size_t n = result.strategies.size();
  log_.log(LogLevel::Basic, [n] {
    return n > 1 ? fmt::format("selected composed strategy ({} sub-strategies)", n)
                 : std::string("selected single strategy");
  });

  if (!result.holes.empty()) {
    result.full = false;
    return result;
  }
  result.full = true;
  ExecutionStrategy strategy = n > 1    ? ExecutionStrategy::composed(std::move(result.strategies))
                               : n == 1 ? std::move(result.strategies[0])
                                        : ExecutionStrategy::operations({});
  result.strategies.clear();
  result.optimization = BlockOptimization(std::move(strategy), std::move(result.ordering));
  result.ordering.clear();
  return result;
}

// ---------------------------------------------------------------------------------------------
// StreamOptimizer (§9)
// ---------------------------------------------------------------------------------------------

StreamOptimizer::StreamOptimizer(FuserList prototypes, std::optional<std::size_t> max_blocks, const FusionLog& log,
                                 std::size_t configured_max_blocks)
    : prototypes_(std::move(prototypes)),
      max_blocks_(max_blocks),
      configured_max_blocks_(configured_max_blocks),
      log_(&log) {}

void StreamOptimizer::register_op(const ir::Operation& op) {
  if (stopped_) {
    log_->log(LogLevel::Full,
              [&] { return fmt::format("[stream] {} dropped (optimizer stopped at op {})", op.kind_name(), length_); });
    return;
  }
  if (blocks_.empty()) {
    on_new_block(op);
    ++length_;
    return;
  }
  switch (merge_blocks(op, false)) {
    case MergeStep::Full:
    case MergeStep::NoNeed: break;
    case MergeStep::Fail:
    case MergeStep::Partial:
      // The op ties together blocks that cannot be merged: it gets its own block that depends
      // on them (the block set is a DAG).
      on_dependent_op(op);
      if (stopped_) return;
      ++length_;
      return;
  }
  if (max_blocks_) {
    const std::size_t max = *max_blocks_;
    if (register_max_block(op, max)) {
      ++length_;
    } else {
      log_->log(LogLevel::Medium, [&] {
        return fmt::format("[stream] stopped (max_blocks={} reached) at op {} ({})", max, length_, op.kind_name());
      });
      stopped_ = true;
    }
    return;
  }
  // No limit (tests only).
  const std::size_t added = register_inner(op, false);
  if (added == 0) {
    on_new_block(op);
  } else {
    log_accepted(op, added);
  }
  ++length_;
}

bool StreamOptimizer::register_max_block(const ir::Operation& op, std::size_t max) {
  if (max == 1) {
    register_inner(op, true);  // every op goes into the single block
    return true;
  }
  std::size_t added = register_inner(op, false);
  if (added > 0) {
    log_accepted(op, added);
    return true;
  }
  if (blocks_.size() < max) {
    on_new_block(op);
    return true;
  }
  merge_blocks(op, true);  // try to free a slot
  if (blocks_.size() >= max) {
    stopped_ = true;
    return false;
  }
  added = register_inner(op, false);
  if (added == 0) {
    on_new_block(op);
  } else {
    log_accepted(op, added);
  }
  return true;
}

std::size_t StreamOptimizer::register_inner(const ir::Operation& op, bool force) {
  std::size_t added = 0;
  for (Block& b : blocks_)
    if (b.register_op(op, length_, force) == RegistrationResult::Accepted) ++added;
  return added;
}

void StreamOptimizer::on_new_block(const ir::Operation& op) {
  Block b(prototypes_);
  b.register_op(op, length_, true);
  blocks_.push_back(std::move(b));
  log_->log(LogLevel::Full, [&] {
    return fmt::format("[stream] op {} {} \u2192 new block (total: {})", length_, op.kind_name(), blocks_.size());
  });
}

void StreamOptimizer::log_accepted(const ir::Operation& op, std::size_t added) const {
  log_->log(LogLevel::Full, [&] {
    return fmt::format("[stream] op {} {} \u2192 accepted in {}/{} block(s)", length_, op.kind_name(), added,
                       blocks_.size());
  });
}

void StreamOptimizer::on_dependent_op(const ir::Operation& op) {
  // Dependent blocks count toward the cap: with no room left, try to free a slot by merging;
  // failing that, stop (the op is not registered and waits for the next round).
  if (max_blocks_ && blocks_.size() >= *max_blocks_) {
    merge_blocks(op, true);
    if (blocks_.size() >= *max_blocks_) {
      log_->log(LogLevel::Medium, [&] {
        return fmt::format("[stream] stopped (max_blocks={} reached on dependency) at op {} ({})", *max_blocks_,
                           length_, op.kind_name());
      });
      stopped_ = true;
      return;
    }
  }
  Block b(prototypes_);
  b.register_op(op, length_, true);
  blocks_.push_back(std::move(b));
  const std::vector<DagNode> nodes = block_nodes(blocks_);
  if (!Dag(std::span<const DagNode>(nodes)).is_acyclic()) {
    // Defensive: only an op that reads a tensor a block frees while also reading something that
    // block produces can get here (impossible in a valid stream).
    blocks_.pop_back();
    log_->log(LogLevel::Medium, [&] {
      return fmt::format("[stream] stopped (unresolvable dependency cycle) at op {} ({})", length_, op.kind_name());
    });
    stopped_ = true;
    return;
  }
  log_->log(LogLevel::Full, [&] {
    return fmt::format("[stream] op {} {} \u2192 new dependent block (total: {})", length_, op.kind_name(),
                       blocks_.size());
  });
}

StreamOptimizer::MergeStep StreamOptimizer::merge_blocks(const ir::Operation& op, bool all) {
  std::vector<std::size_t> idx;
  for (std::size_t i = 0; i < blocks_.size(); ++i)
    if (all || blocks_[i].contains_any_tensor(op.nodes())) idx.push_back(i);
  if (idx.size() <= 1) return MergeStep::NoNeed;

  // The guard must see the whole block DAG: a block sitting between two candidates need not be
  // a candidate itself.
  for (std::size_t i = 0; i < blocks_.size(); ++i) blocks_[i].seed_constituent(i);
  const std::vector<DagNode> nodes = block_nodes(blocks_);
  const Reachability guard = Dag(std::span<const DagNode>(nodes)).reachability();

  std::vector<const Block*> candidates;
  candidates.reserve(idx.size());
  for (std::size_t i : idx) candidates.push_back(&blocks_[i]);
  MergeResult r = merge_block_list(std::span<const Block* const>(candidates), false, guard);
  if (r.is_fail()) return MergeStep::Fail;

  for (auto it = idx.rbegin(); it != idx.rend(); ++it)
    blocks_.erase(blocks_.begin() + static_cast<std::ptrdiff_t>(*it));
  for (Block& b : r.merged) blocks_.push_back(std::move(b));
  for (Block& b : r.failed) blocks_.push_back(std::move(b));
  Block::sort_by_start_pos(blocks_);
  return r.is_full() ? MergeStep::Full : MergeStep::Partial;
}

bool StreamOptimizer::still_optimizing() const {
  if (stopped_) return false;
  if (blocks_.empty()) return true;
  return std::any_of(blocks_.begin(), blocks_.end(), [](const Block& b) { return b.still_optimizing(); });
}

BlockOptimization StreamOptimizer::optimize(std::span<const ir::Operation> ops) const {
  BlocksOptimizer::Result result = BlocksOptimizer(blocks_, prototypes_, *log_).optimize();
  BlockOptimization out;
  if (result.full) {
    out = std::move(result.optimization);
  } else {
    std::vector<ExecutionStrategy> strategies = std::move(result.strategies);
    Ordering ordering = std::move(result.ordering);
    std::vector<std::size_t> holes = std::move(result.holes);
    while (true) {
      // A fresh search over the hole ops, with the configured max_blocks (never an override of
      // this optimizer's), on reset clones of the prototypes.
      FuserList fresh = clone_fusers(prototypes_);
      for (auto& f : fresh) f->reset();
      StreamOptimizer sub(std::move(fresh), configured_max_blocks_, *log_, configured_max_blocks_);
      std::vector<ir::Operation> hole_ops;
      hole_ops.reserve(holes.size());
      for (std::size_t h : holes) hole_ops.push_back(ops[h]);
      for (const ir::Operation& op : hole_ops) sub.register_op(op);
      BlockOptimization so = sub.optimize(hole_ops);
      so.strategy.map_ordering(holes);  // local i -> holes[i]
      for (std::size_t& p : so.ordering) p = holes[p];
      const std::size_t consumed = so.ordering.size();
      if (consumed == 0) {
        // Defensive (a sub-search always covers a non-empty prefix): never loop forever.
        assert(false && "hole sub-search covered nothing");
        strategies.push_back(ExecutionStrategy::operations(holes));
        ordering.insert(ordering.end(), holes.begin(), holes.end());
        break;
      }
      strategies.push_back(std::move(so.strategy));
      ordering.insert(ordering.end(), so.ordering.begin(), so.ordering.end());
      holes.erase(holes.begin(), holes.begin() + static_cast<std::ptrdiff_t>(std::min(consumed, holes.size())));
      if (holes.empty()) break;
    }
    // The hole chunks sit at the end; repair_order puts them in a hazard-respecting place.
    out = BlockOptimization(ExecutionStrategy::composed(std::move(strategies)), std::move(ordering));
  }
  return repair_order(std::move(out), ops, *log_);
}

void StreamOptimizer::reset() {
  // Nothing registered since the last reset: the state is already pristine. This keeps the
  // cache-hit path (which resets the explorer after every plan execution) free of fuser work.
  if (length_ == 0 && blocks_.empty() && !stopped_) return;
  for (auto& f : prototypes_) f->reset();
  length_ = 0;
  blocks_.clear();
  stopped_ = false;
}

}  // namespace kiln::fusion
