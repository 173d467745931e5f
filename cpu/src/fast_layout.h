// Layout ops on the fast path (fast_layout.cc): slice, slice-assign, permute, expand and flip as
// strided copies.
#pragma once

#include "kiln/cpu/device.h"
#include "kiln/ir/operation.h"

namespace kiln::cpu::fast {

// Runs `op` (Slice, SliceAssign, Permute, Expand or Flip of any dtype but QFloat) when its
// operands are what the builders accept: the output is registered and the ReadWrite inputs
// freed. Returns false, having changed nothing, for anything else: the reference then runs the op
// and reports errors.
bool run_layout(const ir::Operation& op, CpuDevice& device, CpuDevice::Handles& handles);

}  // namespace kiln::cpu::fast
