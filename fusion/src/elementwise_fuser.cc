// ElementWise (docs/spec/fusion.md §14.4), NHWCRelayout (§14.6) and the default registry (§14.1).
#include <memory>

#include "kiln/fusion/fusers.h"

namespace kiln::fusion {

// ---- ElementWise: the trace fuser alone, one block.

ElementWiseFuser::ElementWiseFuser(std::uint32_t max_bindings, FusionLog log)
    : fuser_(FuseSettings::elementwise(), max_bindings, std::move(log)) {}

FusedProgram ElementWiseFuser::program() const {
  FusedProgram p = fuser_.finish(ProgramKind::Elementwise);
  p.len = fuser_.num_ops();
  return p;
}

OptimizationPtr ElementWiseFuser::finish() { return std::make_shared<FusedOptimization>(program(), len()); }

// ---- NHWCRelayout: elementwise work whose result a pool / interpolate consumes last.

NhwcRelayoutFuser::NhwcRelayoutFuser(std::uint32_t max_bindings, FusionLog log)
    : inner_(FuseSettings::nhwc(), max_bindings, std::move(log)) {}

void NhwcRelayoutFuser::fuse(const ir::Operation& op) {
  if (inner_.status() == FuserStatus::Closed) return;
  const bool relayout_target = op.family == ir::Family::Module && op.info().has(ir::kNhwc) && !op.inputs().empty() &&
                               op.inputs()[0].status == ir::TensorStatus::ReadWrite;
  if (!relayout_target) {
    inner_.fuse(op);
    return;
  }
  // The pool is x's last reader: write x channels-last (stride order [0, r-1, 1, ..., r-2]) so
  // the module op reads it contiguously, then stop.
  const ir::TensorIr& x = op.inputs()[0];
  const std::size_t rank = x.shape.size();
  Permutation perm;
  if (rank >= 2) {
    perm.push_back(0);
    perm.push_back(static_cast<std::uint32_t>(rank - 1));
    for (std::size_t i = 1; i + 1 < rank; ++i) perm.push_back(static_cast<std::uint32_t>(i));
  } else {
    for (std::size_t i = 0; i < rank; ++i) perm.push_back(static_cast<std::uint32_t>(i));
  }
  (void)inner_.set_output_layout(x.id.value(), std::move(perm));  // no-op when x is not produced here
  captured_ = op;
  inner_.close();
}

FuserProperties NhwcRelayoutFuser::properties() const {
  FuserProperties p = inner_.properties();
  if (captured_) p.score += kCaptureBonus;
  p.ready = p.ready && captured_.has_value();
  return p;
}

FusedProgram NhwcRelayoutFuser::program() const {
  FusedProgram p = inner_.finish(ProgramKind::NhwcRelayout);
  p.captured_op_position = inner_.num_ops();
  p.len = len();
  return p;
}

OptimizationPtr NhwcRelayoutFuser::finish() { return std::make_shared<FusedOptimization>(program(), len()); }

void NhwcRelayoutFuser::reset() {
  inner_.reset();
  captured_.reset();
}

// ---- Registry.

FuserList default_fusers(const FusionLog& log, FuserOptions opts) {
  FuserList list;
  list.reserve(6);
  list.push_back(std::make_unique<ElementWiseFuser>(opts.max_bindings, log));
  list.push_back(std::make_unique<MatmulFuser>(opts.max_bindings, log));
  list.push_back(std::make_unique<ReduceFuser>(opts.max_bindings, log));
  list.push_back(std::make_unique<ReduceBroadcastedFuser>(opts.max_bindings, log));
  list.push_back(std::make_unique<NhwcRelayoutFuser>(opts.max_bindings, log));
  if (opts.row_fuser) list.push_back(std::make_unique<RowFuser>(opts.max_bindings, log));
  return list;
}

}  // namespace kiln::fusion
