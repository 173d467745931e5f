// The reference module's host memory, host tensors, element codec and reference executor, under
// the names the CPU backend uses for them: its device memory is host memory, so the CPU backend
// keeps its tensors in reference::HostTensor and allocates them from reference::HostAllocator.
#pragma once

#include "kiln/reference/memory.h"
#include "kiln/reference/reference_executor.h"
#include "kiln/reference/tensor.h"

namespace kiln::cpu {

using reference::bf16_from_f32;
using reference::bf16_from_f64;
using reference::bf16_to_f32;
using reference::bf16_to_f64;
using reference::checked_num_elements;
using reference::f16_from_f32;
using reference::f16_from_f64;
using reference::f16_to_f32;
using reference::f16_to_f64;
using reference::HostAllocator;
using reference::HostAllocatorOptions;
using reference::HostAllocatorStats;
using reference::HostBuffer;
using reference::HostTensor;
using reference::kHostAlignment;
using reference::native_dtype;
using reference::ReferenceExecutor;
namespace element = reference::element;

}  // namespace kiln::cpu
