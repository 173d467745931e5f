// check_client_operation: the daemon's shape and dtype check of an operation a client sent.
//
// A decoded operation is structurally valid (the ir codec and Operation::validate saw to that),
// but its output shapes and dtypes are whatever the client wrote, and the fused kernels trust
// them. So the daemon rebuilds every operation through the ir builders — from the claimed
// inputs, scalars and attributes — and accepts it only if the builder returns exactly the same
// operation. Kinds the client library never emits (custom ops, Init, SyncCollective, ...) are
// refused by name: a narrow surface is the point.
// Accepted: every kind a runtime::Session call emits — elementwise, matmul, reductions and scans
// (MaxDimWithIndices / MinDimWithIndices with their two outputs), top-k (TopK, ArgTopK) and
// sorting (Sort, ArgSort, SortWithIndices with its two outputs), layout (with Unfold), indexing
// and assignment (with ScatterNd), the cross product, pad, creation (with Float Random and
// NumericInt IntRandom: their parameters are the executor's to check), Conv1d/2d/3d and
// ConvTranspose1d/2d/3d with their X / Weight / Bias gradients, DeformableConv2d with its backward
// (three to five outputs, its presence bits checked), MaxPool2d, AvgPool2d, the other
// pools (MaxPool1d, MaxPool1d/2dWithIndices with their two outputs, AvgPool1d,
// AdaptiveAvgPool1d/2d/3d) with their backwards, Linear with its three backwards, LayerNorm,
// BatchNorm, EmbeddingBackward, Interpolate with its backward, GridSample2d, Unfold4d, Rfft (two
// outputs), IRfft, Attention (its presence bits checked), CtcLoss with its backward, Quantize (the
// scheme its output's QFloat dtype), Dequantize, AllReduce, Broadcast, AllGather and ReduceScatter — and, for
// router-style clients, Module Embedding, TopKWithIndices (two outputs) and the Activation kinds (the fusion client
// decomposes them): they reuse the elementwise and dim signatures, plus HardSigmoid's, rebuilt
// like the rest.
//
// Thread-safety: a pure function.
#pragma once

#include <array>
#include <cstddef>

#include "kiln/base/result.h"
#include "kiln/ir/operation.h"

namespace kiln::ipc {

// `op` must have passed Operation::validate (ir::codec's decode does; rebuild indexes the op
// table by its kind). Ok, or ErrorCode::Invalid naming the kind and what differed ("NumericFloat::Add: output 0 is
// [2, 3] f32 but the builder infers [3, 3] f32"), or the builder's own error.
Status check_client_operation(const ir::Operation& op);

// check_client_operation with a memory of what it accepted. The builders look at an operation's
// tensor ids only to see that its output is not one of its inputs; everything else they infer
// is a function of kinds, dtypes, shapes, statuses, scalars and attributes. A worker's training
// step sends the same few dozen of those over and over, so an operation equal to an accepted one
// in all but its ids (compared field by field, not trusted to a hash) passes after that id
// test, without the rebuild (a third of the daemon's per-op check and decode time).
//
// One per client session; not thread-safe. 64 sets of 4 ways, least recently used out (~150
// KiB): direct-mapped, a step's few dozen shapes met in a slot often enough that a pair of them
// evicted each other on every step, each paying a rebuild.
class OperationCheckMemo {
 public:
  Status check(const ir::Operation& op);

  std::uint64_t hits() const { return hits_; }
  // The set `op` is remembered in (its shape, not its ids, decides): for tests of the eviction.
  static std::size_t set_of(const ir::Operation& op);
  static constexpr std::size_t ways() { return kWays; }

 private:
  static constexpr std::size_t kSets = 64;
  static constexpr std::size_t kWays = 4;
  struct Slot {
    bool used = false;
    std::uint64_t hash = 0;      // of the op as remembered (a quick mismatch; equality decides)
    std::uint64_t last_use = 0;  // tick of the last hit or fill
    ir::Operation op;            // tensor ids zeroed
  };
  std::array<std::array<Slot, kWays>, kSets> sets_{};
  std::uint64_t tick_ = 0;
  std::uint64_t hits_ = 0;
};

}  // namespace kiln::ipc
