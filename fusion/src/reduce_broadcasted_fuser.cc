// ReduceBroadcasted (docs/spec/fusion.md §14.8): chains Reduce blocks that reduce the same relative input
// shape along the same (last) axis, with elementwise blocks broadcasting the reduced values back
// (softmax-like patterns). Each block is a Reduce fuser of its own; the program runs the blocks'
// programs as stages, passing values between them through global memory.
#include <cassert>
#include <memory>
#include <numeric>

#include "kiln/fusion/fusers.h"
#include "staged_program.h"

namespace kiln::fusion {

ReduceBroadcastedFuser::ReduceBroadcastedFuser(std::uint32_t max_bindings, FusionLog log)
    : max_bindings_(max_bindings), log_(std::move(log)) {
  blocks_.emplace_back(max_bindings_, log_);
}

FuserStatus ReduceBroadcastedFuser::status() const {
  if (state_ == State::Closed || state_ == State::Abort) return FuserStatus::Closed;
  return blocks_.back().status();
}

void ReduceBroadcastedFuser::check_reduction(const ReduceFuser& block) {
  const ir::Operation& r = *block.reduction();
  const ir::Shape& input = r.inputs()[0].shape;
  const std::int64_t axis = r.attrs[0];
  // Only last-axis reductions are supported by the broadcasted kernel.
  if (input.empty() || axis != static_cast<std::int64_t>(input.size()) - 1) {
    state_ = State::Abort;
    return;
  }
  state_ = State::Init;
  shape_ = input;
  axis_ = axis;
}

void ReduceBroadcastedFuser::fuse(const ir::Operation& op) {
  if (status() == FuserStatus::Closed) return;
  // Burn simulates every op on a clone and closes when the simulation is ready but the combined
  // kernel or the per-block fallbacks would not cover every accepted op. Here the blocks' lengths
  // add up to the accepted ops by construction (each block grows only by accepting), so the
  // dry run reduces to the assertion below.
  ReduceFuser& current = blocks_.back();
  ReduceFuser trial = current;
  trial.fuse(op);
  if (trial.len() > current.len()) {
    current = std::move(trial);
    ++num_ops_;
    if (current.captured()) check_reduction(current);
  } else if (!current.captured()) {
    state_ = State::Closed;
    return;
  } else {
    ReduceFuser fresh(max_bindings_, log_);
    fresh.fuse(op);
    bool start = false;
    if (fresh.len() > 0 && state_ == State::Init) {
      if (fresh.captured()) {
        // (a) the same reduction again. Unreachable with §14.7's Reduce fuser (a reduction as
        // its first op always closes it); kept as the spec states it.
        const ir::Operation& r = *fresh.reduction();
        start = r.inputs()[0].shape == shape_ && r.attrs[0] == axis_;
      } else {
        // (b) an elementwise op producing the reduced input's shape: broadcasting back.
        start = op.outputs().size() == 1 && op.outputs()[0].shape == shape_;
      }
    }
    // (A block made only of a view is refused too: a fresh fuser never accepts a view first.)
    if (!start) {
      state_ = State::Closed;
      return;
    }
    blocks_.push_back(std::move(fresh));
    ++num_ops_;
    const ReduceFuser& taker = blocks_.back();
    check_reduction(taker.captured() ? taker : blocks_[blocks_.size() - 2]);
  }
  assert(std::accumulate(blocks_.begin(), blocks_.end(), std::size_t{0},
                         [](std::size_t n, const ReduceFuser& b) { return n + b.len(); }) == num_ops_);
}

FuserProperties ReduceBroadcastedFuser::properties() const {
  bool ready = false;
  switch (state_) {
    case State::Starting:
    case State::Abort: ready = false; break;
    case State::Closed: ready = blocks_.size() > 1 || blocks_.front().captured(); break;
    case State::Init: ready = true; break;
  }
  // Every block is ready: an elementwise block always, a reduce block once it captured its
  // reduction (a block is a "reduce block" exactly when it captured one).
  std::uint64_t score = 0;
  for (const ReduceFuser& b : blocks_) score += b.properties().score;
  return FuserProperties{ready, score};
}

FusedProgram staged_program(ProgramKind kind, const std::vector<ReduceFuser>& blocks, std::size_t len) {
  FusedProgram p;
  p.kind = kind;
  p.len = len;
  p.stages.reserve(blocks.size());
  for (const ReduceFuser& b : blocks) p.stages.push_back(b.program());
  return p;
}

FusedProgram ReduceBroadcastedFuser::program() const {
  return staged_program(ProgramKind::ReduceBroadcasted, blocks_, num_ops_);
}

OptimizationPtr ReduceBroadcastedFuser::finish() { return std::make_shared<FusedOptimization>(program(), len()); }

void ReduceBroadcastedFuser::reset() {
  blocks_.clear();
  blocks_.emplace_back(max_bindings_, log_);
  state_ = State::Starting;
  shape_.clear();
  axis_ = 0;
  num_ops_ = 0;
}

}  // namespace kiln::fusion
