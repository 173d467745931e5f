// f16 and bf16 on the fast single-op kernels (convolutions, pools, norms, embeddings): the half
// operands are widened to f32 (exact), the op runs on the f32 kernel, and its float outputs are
// rounded once to the half dtype. PyTorch's CPU kernels compute these layers in f32 for
// half inputs too; the reference executor computes in f64 and rounds once, so the fast result
// may differ from it by the f32 kernel's own rounding (docs/decisions.md, "Half layers on the
// fast CPU path").
#pragma once

#include "kiln/cpu/device.h"
#include "kiln/ir/operation.h"

namespace kiln::cpu::fast {

using SingleOpKernel = bool (*)(const ir::Operation& op, CpuDevice& device, CpuDevice::Handles& handles);

// Runs `kernel` on `op` through f32 when the op's float tensors (inputs and outputs) are all one
// half dtype (f16 or bf16); its other tensors (indices) pass as they are. Returns false, having
// changed nothing, when the op has no half tensor, mixes float dtypes, or the kernel declines:
// the reference then runs it. On success the outputs are registered (half outputs rounded once
// from the kernel's f32) and the ReadWrite inputs freed, as the kernel itself would.
bool run_through_f32(const ir::Operation& op, CpuDevice& device, CpuDevice::Handles& handles, SingleOpKernel kernel);

}  // namespace kiln::cpu::fast
