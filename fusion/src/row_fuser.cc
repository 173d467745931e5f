// The row fuser (kiln, beyond Burn; docs/fusion.md "The row fuser"): chains of Reduce blocks over
// one [rows, n] space, the reductions along the last axis, elementwise blocks broadcasting the
// reduced values back. ReduceBroadcasted's chain rule (docs/spec/fusion.md §14.8), with three
// differences: the chain and any block may open with a reduction, and a reduction that does not
// fit the rows closes the chain (keeping what it holds) rather than aborting it.
#include <memory>

#include "kiln/fusion/fusers.h"
#include "staged_program.h"

namespace kiln::fusion {

RowFuser::RowFuser(std::uint32_t max_bindings, FusionLog log) : max_bindings_(max_bindings), log_(std::move(log)) {
  blocks_.emplace_back(max_bindings_, log_, /*leading_reduction=*/true);
}

FuserStatus RowFuser::status() const { return closed_ ? FuserStatus::Closed : blocks_.back().status(); }

bool RowFuser::fits_rows(const ir::Operation& r) const {
  if (r.inputs().size() != 1 || r.attrs.empty()) return false;
  const ir::Shape& input = r.inputs()[0].shape;
  if (input.empty() || r.attrs[0] != static_cast<std::int64_t>(input.size()) - 1) return false;
  return rows_.empty() || input == rows_;
}

bool RowFuser::leads_with_reduction() const {
  return blocks_.front().captured() && blocks_.front().prologue_len() == 0;
}

void RowFuser::fuse(const ir::Operation& op) {
  if (closed_) return;
  if (ReduceFuser::is_dim_reduction(op) && !fits_rows(op)) {
    closed_ = true;
    return;
  }
  ReduceFuser& current = blocks_.back();
  ReduceFuser trial = current;
  trial.fuse(op);
  if (trial.len() > current.len()) {
    current = std::move(trial);
    ++num_ops_;
    if (current.captured() && rows_.empty()) rows_ = current.reduction()->inputs()[0].shape;
    return;
  }
  if (!current.captured()) {
    closed_ = true;
    return;
  }
  // A new block: the next reduction of the rows, or elementwise work producing the rows' shape
  // (the reduced values broadcast back).
  ReduceFuser fresh(max_bindings_, log_, /*leading_reduction=*/true);
  fresh.fuse(op);
  const bool starts =
      fresh.len() > 0 && (fresh.captured() || (op.outputs().size() == 1 && op.outputs()[0].shape == rows_));
  if (!starts) {
    closed_ = true;
    return;
  }
  blocks_.push_back(std::move(fresh));
  ++num_ops_;
}

FuserProperties RowFuser::properties() const {
  bool captured = false;
  std::uint64_t score = 0;
  for (const ReduceFuser& b : blocks_) {
    captured = captured || b.captured();
    score += b.properties().score + kBlockBonus;
  }
  // What no Burn fuser covers alone: a chain of blocks, or a reduction opening one with work after it.
  const bool beyond_reduce = blocks_.size() >= 2 || (leads_with_reduction() && blocks_.front().main().num_ops() > 0);
  return FuserProperties{captured && beyond_reduce, score};
}

FusedProgram RowFuser::program() const { return staged_program(ProgramKind::Row, blocks_, num_ops_); }

OptimizationPtr RowFuser::finish() { return std::make_shared<FusedOptimization>(program(), len()); }

void RowFuser::reset() {
  blocks_.clear();
  blocks_.emplace_back(max_bindings_, log_, /*leading_reduction=*/true);
  closed_ = false;
  rows_.clear();
  num_ops_ = 0;
}

}  // namespace kiln::fusion
