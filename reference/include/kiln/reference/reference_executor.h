// ReferenceExecutor: runs any single ir::Operation on CPU tensors, written to be obviously
// correct rather than fast. It is the oracle of every differential test (the fused CPU and CUDA
// executors are compared against it), so each kernel is a direct loop over output elements in a
// wide compute type, and everything it relies on is checked first.
//
// Thread-safety: one executor per stream (it owns that stream's random generator); execute() must
// not be called concurrently on one executor or one handle container. Executors of different
// streams may share one HostAllocator.
//
// Contract of execute(op, handles):
//   * Every OpKind of op_table.def runs, for every dtype the op admits: f64, f32, flex32 (stored
//     and computed as f32 storage), f16 and bf16 (storage; see "Numerics"), i64..i8, u64..u8 and
//     bool (any store). QFloat tensors are rejected (Unsupported).
//   * The op is checked before anything runs: Operation::validate(), the family against the
//     operand dtype, every attribute, every output shape and dtype against the rule that
//     produces it (docs/spec/ir.md §4, §6), and every input handle's shape and dtype against its IR
//     occurrence. An op that passes validate() can never crash the executor or reach undefined
//     behaviour; anything else comes back as an error value.
//   * Error model (docs/spec/ir.md §11): if an input is Errored the op is skipped (skip_if_errored): its
//     outputs are claimed with the downstream error, its ReadWrite inputs released, and the
//     propagated error is returned. If the op fails (bad attribute, index out of range, integer
//     division by zero, allocation refused, unsupported dtype, unknown custom op, ...), its
//     ReadWrite inputs are released as if consumed, its outputs are claimed (fail_op) with a new
//     root carrying this error, and the error is returned. The container stays consistent and
//     the next op runs normally.
//   * On success the outputs are registered under their ids, and every ReadWrite input entry is
//     gone (consumed); ReadOnly inputs are untouched. Inputs are read in place, never modified;
//     outputs always get fresh buffers (no aliasing between a result and its inputs).
//   * Init registers nothing (the buffer arrives out of band); it checks that the handle exists
//     with the declared shape and dtype. Drop frees its tensor. SyncCollective does nothing.
//     AllReduce on a single device is the identity (sum of one, mean of one); Broadcast,
//     AllGather and ReduceScatter over a world of one too (more ranks fail: Unsupported). Custom fails: the
//     reference knows no custom operation.
//
// Numerics (each choice is Burn's or PyTorch's where they agree; the kernels' comments say more):
//   * Float ops compute in f64 and round once to the output dtype (nearest even); this is at
//     least as accurate as the f32 compute the issue asks for f16/bf16. Reductions, matmul and
//     convolutions accumulate in f64, sequentially, in index order (deterministic).
//   * Integers compute in i64 / u64 and wrap to the output width (two's complement), sums and
//     products included. Div truncates toward zero (Burn, Rust, C); Rem is the floored remainder,
//     sign of the divisor (Burn's and PyTorch's `remainder`); integer division or remainder by
//     zero is an error (PyTorch raises too). Float Rem is fmod corrected to the divisor's sign.
//   * NaN propagates: Max, Min, MaxAbs, CumMax, CumMin, MaxPool and the *WithIndices variants
//     return NaN when the reduced window holds one; ArgMax/ArgMin return the first NaN's index
//     (PyTorch). Comparisons with NaN are false (NotEqual true). Clamp keeps NaN.
//   * Scalars are first converted to the operand's element type (a Float scalar on an i32 tensor
//     truncates; 0.1 on an f16 tensor is f16's 0.1), then used.
//
// Usage:
//   HostAllocator alloc;
//   ReferenceExecutor exec(alloc);
//   ir::HandleContainer<HostTensor> handles;
//   handles.register_handle(TensorId{1}, *HostTensor::from_f64(alloc, {2}, dtypes::f32, std::vector<double>{1, 2}));
//   Status st = exec.execute(op, handles);   // op: e.g. build::unary(Family::Float, OpKind::Float_Exp, ...)
//   if (!st.ok()) log(st.error().to_string());  // outputs were claimed; keep going
#pragma once

#include <cstdint>

#include "kiln/base/result.h"
#include "kiln/ir/handle_container.h"
#include "kiln/ir/operation.h"
#include "kiln/reference/memory.h"
#include "kiln/reference/tensor.h"

namespace kiln::reference {

class ReferenceExecutor {
 public:
  using Handles = ir::HandleContainer<HostTensor>;
  // Seed of a fresh executor's random generator ("kiln" in ASCII); any value works.
  static constexpr std::uint64_t kDefaultSeed = 0x6b696c6e;

  explicit ReferenceExecutor(HostAllocator& allocator, std::uint64_t seed = kDefaultSeed);

  // Runs one operation; see the contract above.
  Status execute(const ir::Operation& op, Handles& handles);

  // Restarts the random generator: the same seed and the same ops give the same values.
  void reseed(std::uint64_t seed) { rng_state_ = seed; }
  HostAllocator& allocator() const { return allocator_; }

 private:
  Status execute_checked(const ir::Operation& op, Handles& handles);

  HostAllocator& allocator_;
  std::uint64_t rng_state_;  // SplitMix64 state, advanced by Random / IntRandom
};

}  // namespace kiln::reference
