// Single operations as one-op fused programs, so that the generated kernels serve unfused
// operations too (the CPU fast path's approach, cpu/src/fast_executor.cc): elementwise, scalar,
// unary, comparison, cast, clamp and mask ops, ones / zeros / full, gather / select / cat,
// swap_dims and permute copies, dim and whole-tensor reductions, float matmul.
//
// Usage:
//   std::optional<SingleOpProgram> s = single_op_program(op);
//   if (s) { generate(s->program); bind with s->binding(); }   // else: the host fallback
//
// Thread-safety: pure functions and plain values.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "kiln/cuda/launch.h"
#include "kiln/fusion/fused_program.h"
#include "kiln/ir/operation.h"

namespace kiln::cuda {

struct SingleOpProgram {
  fusion::FusedProgram program;
  // Relative tables, numbered as the relative converter would number them.
  std::vector<ir::TensorIr> tensors;
  std::vector<std::uint64_t> dims{1};
  std::vector<ir::ScalarIr> scalars;
  // Permute: program input 0 is read through this axis order (the host overrides its access
  // strides; the program itself is a plain copy, one kernel for every permutation).
  std::optional<std::vector<std::uint64_t>> permute_axes;

  Binding binding() const { return Binding{tensors, dims, scalars}; }
};

// The one-op program of `op`, or nullopt when no generated kernel covers it (the backend runs
// it on the host reference executor). Only ops the reference would accept are taken, so errors
// always come from the reference.
std::optional<SingleOpProgram> single_op_program(const ir::Operation& op);

}  // namespace kiln::cuda
