// check_client_operation: the daemon's shape and dtype check of an operation a client sent.
//
// A decoded operation is structurally valid (the ir codec and Operation::validate saw to that),
// but its output shapes and dtypes are whatever the client wrote, and the fused kernels trust
// them. So the daemon rebuilds every operation through the ir builders — from the claimed
// inputs, scalars and attributes — and accepts it only if the builder returns exactly the same
// operation. Kinds the client library never emits (module ops, custom ops, creation from
// random distributions, collectives, ...) are refused by name: a narrow surface is the point.
//
// Thread-safety: a pure function.
#pragma once

#include "kiln/ir/operation.h"
#include "kiln/ir/result.h"

namespace kiln::ipc {

// Ok, or ErrorCode::Invalid naming the kind and what differed ("NumericFloat::Add: output 0 is
// [2, 3] f32 but the builder infers [3, 3] f32"), or the builder's own error.
Status check_client_operation(const ir::Operation& op);

}  // namespace kiln::ipc
