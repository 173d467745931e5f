// What every single-op fast kernel (fast_conv.cc, fast_pool.cc, fast_module.cc, fast_sort.cc,
// fast_layout.cc) does around its arithmetic: find its inputs held as the IR says, run its loops on
// the device's arena, and, once it ran, free the ReadWrite inputs and register the outputs.
#pragma once

#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "fast_program.h"
#include "kiln/cpu/device.h"
#include "kiln/ir/operation.h"

namespace kiln::cpu::fast {

// The launch settings a single-op kernel runs its parallel loops with: the device's arena and threads.
inline Launch launch_on(CpuDevice& device) {
  Launch launch;
  launch.arena = &device.arena();
  launch.threads = device.threads();
  return launch;
}

// Every input of `op` held with the dtype and shape its TensorIr says; nullopt otherwise (the
// kernel then declines).
inline std::optional<std::vector<const HostTensor*>> held_inputs(const ir::Operation& op,
                                                                 const CpuDevice::Handles& handles) {
  std::vector<const HostTensor*> in;
  for (const ir::TensorIr& t : op.inputs()) {
    const HostTensor* h = handles.get_handle_ref(t.id);
    if (h == nullptr || !(h->dtype() == t.dtype) || h->shape() != t.shape) return std::nullopt;
    in.push_back(h);
  }
  return in;
}

// After the kernel ran: frees the ReadWrite inputs and registers output i of `op` as outs[i].
inline void commit(const ir::Operation& op, CpuDevice::Handles& handles, std::span<HostTensor> outs) {
  for (const ir::TensorIr& t : op.inputs()) (void)handles.free(t);
  for (std::size_t i = 0; i < outs.size(); ++i) handles.register_handle(op.outputs()[i].id, std::move(outs[i]));
}

}  // namespace kiln::cpu::fast
