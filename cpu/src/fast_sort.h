// Sorting along an axis on the fast path (fast_sort.cc): Sort, ArgSort, SortWithIndices, TopK,
// ArgTopK and TopKWithIndices, with the reference's order.
#pragma once

#include "kiln/cpu/device.h"
#include "kiln/ir/operation.h"

namespace kiln::cpu::fast {

// Whether `kind` is one of the sorting kinds above.
bool is_sort_kind(ir::OpKind kind);

// Runs `op` (a sorting kind over f32, f64, i32 or i64 values, indices written as i32 or i64) when
// its operands and attributes are what the builders accept: the outputs are registered and the
// ReadWrite input freed. Returns false, having changed nothing, for anything else: the reference
// then runs the op and reports errors.
bool run_sort(const ir::Operation& op, CpuDevice& device, CpuDevice::Handles& handles);

}  // namespace kiln::cpu::fast
