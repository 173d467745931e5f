// Shared by both spike variants: device guard, PrivateUse1 hooks, the counted boxed CPU
// fallback and the kiln_spike::* custom ops that Python uses to read the counts.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace kiln_spike {

// The boxed fallback registered for every aten op the variant does not implement: counts the
// call under the operator's name, warns once per name, then runs at::native::cpu_fallback.
void counted_cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// Which variant this library is ("strided" or "lazy"), reported by torch.ops.kiln_spike.variant().
extern const char* const kVariant;

}  // namespace kiln_spike
