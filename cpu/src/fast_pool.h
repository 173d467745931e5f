// The pool kinds on the fast path (fast_pool.cc): f32 and f64, the reference's numbers.
#pragma once

#include "kiln/cpu/device.h"
#include "kiln/ir/operation.h"

namespace kiln::cpu::fast {

// Runs `op` (a max, average or adaptive average pool of any rank, with or without indices, or
// the backward of one) when x, grad and the output are all f32 or all f64, indices are i32 or
// i64, and its attributes and shapes are what the builders accept: the outputs are registered
// and the ReadWrite inputs freed. Returns false, having changed nothing, for anything else (an
// index out of range included): the reference then runs the op and reports errors.
bool run_pool(const ir::Operation& op, CpuDevice& device, CpuDevice::Handles& handles);

}  // namespace kiln::cpu::fast
