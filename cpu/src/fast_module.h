// Row-wise module ops on the fast path (fast_module.cc): layer norm, the embedding and its
// gradient, with the reference's numbers.
#pragma once

#include "kiln/cpu/device.h"
#include "kiln/ir/operation.h"

namespace kiln::cpu::fast {

// Runs `op` (LayerNorm of f32/f64 operands; Embedding of f32/f64/f16/bf16 weights;
// EmbeddingBackward of f32/f64 operands; indices i32 or i64) when its operands are what the
// builders accept: the output is registered and the ReadWrite inputs freed. Returns false, having
// changed nothing, for anything else (an index out of range included): the reference then runs
// the op and reports errors.
bool run_module(const ir::Operation& op, CpuDevice& device, CpuDevice::Handles& handles);

}  // namespace kiln::cpu::fast
