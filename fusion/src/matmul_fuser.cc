// Matmul (docs/spec/fusion.md §14.5): a Float::Matmul head, then an elementwise epilogue that reads the
// matmul result as a local value; a fallback trace (the epilogue alone) runs after an unfused
// matmul when the fused kernel cannot be used.
#include <memory>

#include "kiln/fusion/fusers.h"

namespace kiln::fusion {

MatmulFuser::MatmulFuser(std::uint32_t max_bindings, FusionLog log)
    : epilogue_(FuseSettings::matmul_epilogue(), max_bindings, log),
      fallback_(FuseSettings::elementwise(), max_bindings, std::move(log)) {}

void MatmulFuser::fuse(const ir::Operation& op) {
  if (epilogue_.status() == FuserStatus::Closed) return;
  if (!matmul_) {
    // Quantized operands would need a supported scheme: kiln's backends have none yet.
    const bool head = op.kind == ir::OpKind::Float_Matmul && op.family == ir::Family::Float &&
                      op.inputs().size() == 2 && !op.inputs()[0].dtype.is_quantized() &&
                      !op.inputs()[1].dtype.is_quantized();
    // The matmul is not scored and does not use up the epilogue's first-op flag.
    if (head && epilogue_.register_matmul(op)) {
      matmul_ = op;
      return;
    }
    epilogue_.close();
    fallback_.close();
    return;
  }
  fuse_both(epilogue_, fallback_, op);
}

FusedProgram MatmulFuser::program() const {
  FusedProgram p = epilogue_.finish(ProgramKind::Matmul);
  p.captured_op_position = 0;
  p.len = len();
  FusedProgram fb = fallback_.finish(ProgramKind::Elementwise);
  fb.len = fallback_.num_ops();
  p.fallbacks.push_back(std::move(fb));
  return p;
}

OptimizationPtr MatmulFuser::finish() { return std::make_shared<FusedOptimization>(program(), len()); }

void MatmulFuser::reset() {
  epilogue_.reset();
  fallback_.reset();
  matmul_.reset();
}

}  // namespace kiln::fusion
