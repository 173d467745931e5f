// The convolution kinds on the fast path (fast_conv.cc): f32 and f64, the reference's numbers.
#pragma once

#include "kiln/cpu/device.h"
#include "kiln/ir/operation.h"

namespace kiln::cpu::fast {

// Runs `op` (any convolution kind: forward, X, Weight or Bias gradient, transposed or not) when
// its operands are f32 or f64, all of the output's dtype, and its attributes and shapes are what
// the builders accept: the output is registered and the ReadWrite inputs freed. Returns false,
// having changed nothing, for anything else (the reference then runs the op and reports errors).
bool run_conv(const ir::Operation& op, CpuDevice& device, CpuDevice::Handles& handles);

}  // namespace kiln::cpu::fast
