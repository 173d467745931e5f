// Reduce (docs/spec/fusion.md §14.7): elementwise ops fused on read, one dim reduction, elementwise ops
// fused on write; a read fallback and a write fallback (each the elementwise ops alone) let the
// reduction run unfused in between.
#include <memory>

#include "kiln/fusion/fusers.h"

namespace kiln::fusion {

ReduceFuser::ReduceFuser(std::uint32_t max_bindings, FusionLog log, bool leading_reduction)
    : main_(FuseSettings::reduce_read(), max_bindings, log),
      read_fallback_(FuseSettings::elementwise(), max_bindings, log),
      write_fallback_(FuseSettings::elementwise(), max_bindings, std::move(log)),
      leading_reduction_(leading_reduction) {}

bool ReduceFuser::is_dim_reduction(const ir::Operation& op) {
  if (!op.info().has(ir::kReduceDim)) return false;
  return ir::group_admits(op.info().group, op.family);
}

void ReduceFuser::fuse(const ir::Operation& op) {
  if (main_.status() == FuserStatus::Closed) return;
  if (reduce_) {
    fuse_both(main_, write_fallback_, op);  // fuse-on-write
    return;
  }
  if (is_dim_reduction(op)) {
    on_reduce(op);
    return;
  }
  fuse_both(main_, read_fallback_, op);  // fuse-on-read
}

void ReduceFuser::on_reduce(const ir::Operation& op) {
  const bool well_formed = op.inputs().size() == 1 && op.outputs().size() == 1 && !op.attrs.empty();
  // The reduction must read exactly the shape the prologue produces; in particular a reduction
  // as the first op always closes (the shape is still empty), unless this block may lead with
  // one (its prologue then only loads the input).
  const bool leading = leading_reduction_ && main_.num_ops() == 0;
  const bool reads_prologue =
      !main_.current_output_shape().empty() && main_.current_output_shape() == op.inputs()[0].shape;
  if (!well_formed || !(leading || reads_prologue)) {
    main_.close();
    read_fallback_.close();
    return;
  }
  const ir::DType acc = reduce_accumulator(op.kind, op.inputs()[0].dtype);
  if (!main_.register_reduce(op, acc, FuseSettings::reduce_write())) {
    main_.close();
    read_fallback_.close();
    return;
  }
  reduce_ = op;
  read_ops_ = main_.num_ops();
  read_fallback_.close();
}

FuserProperties ReduceFuser::properties() const {
  FuserProperties p = main_.properties();
  p.ready = reduce_.has_value();
  return p;
}

FusedProgram ReduceFuser::program() const {
  if (!reduce_) {
    FusedProgram p = main_.finish(ProgramKind::Elementwise);
    p.len = len();
    return p;
  }
  FusedProgram p = main_.finish(ProgramKind::Reduce);
  p.captured_op_position = read_ops_;
  p.len = len();
  FusedProgram read = read_fallback_.finish(ProgramKind::Elementwise);
  read.len = read_fallback_.num_ops();
  FusedProgram write = write_fallback_.finish(ProgramKind::Elementwise);
  write.len = write_fallback_.num_ops();
  p.fallbacks.push_back(std::move(read));
  p.fallbacks.push_back(std::move(write));
  return p;
}

OptimizationPtr ReduceFuser::finish() { return std::make_shared<FusedOptimization>(program(), len()); }

void ReduceFuser::reset() {
  main_.reset();
  read_fallback_.reset();
  write_fallback_.reset();
  reduce_.reset();
  read_ops_ = 0;
}

}  // namespace kiln::fusion
