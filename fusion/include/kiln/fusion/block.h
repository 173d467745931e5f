// Block: a group of queued operations tied together by shared tensors, each block owning its own
// clones of every fuser (docs/spec/fusion.md §10.1-§10.4).
//
// A block keeps its ops in REGISTRATION order with their queue positions (0-based), the tensor
// bookkeeping the dependency graph needs (produced / external reads / freed), and the set of
// original block indices it stands for (the merge guard, §11). Merges append the other block's
// ops to this block's fusers; a merge attempt mutates the block, so callers merge clones.
//
// Usage:
//   Block b(prototypes);                       // clones the prototypes
//   b.register_op(op, /*pos=*/0, /*force=*/true);
//   BlockOptimization bo = b.optimize(prototypes);
//
// Thread-safety: a plain value owned by one stream's search; copying deep-clones the fusers.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <set>
#include <span>
#include <vector>

#include "kiln/fusion/dag.h"
#include "kiln/fusion/fuser.h"
#include "kiln/fusion/strategy.h"
#include "kiln/ir/operation.h"

namespace kiln::fusion {

enum class RegistrationResult : std::uint8_t { Accepted, NotPartOfTheGraph };

// The DAG view of one op (docs/spec/fusion.md §12.1): read = all input ids, freed = ReadWrite inputs,
// produced = output ids, position = its queue position.
DagNode operation_node(const ir::Operation& op, std::size_t position);

// is_valid_execution_order (§12.5) over the ops at `positions` (in that execution order).
bool ordering_is_valid(std::span<const std::size_t> positions, std::span<const ir::Operation> ops);

class Block {
 public:
  static constexpr std::size_t kNoPosition = std::numeric_limits<std::size_t>::max();

  // A fresh block with one clone of every prototype fuser.
  explicit Block(const FuserList& prototypes);
  Block(const Block& other);
  Block& operator=(const Block& other);
  Block(Block&&) noexcept = default;
  Block& operator=(Block&&) noexcept = default;
  ~Block() = default;

  // §10.2: the first op is always accepted; later ones iff they share a tensor id with the block
  // or `force` is set.
  RegistrationResult register_op(const ir::Operation& op, std::size_t pos, bool force);

  // §10.3: is_valid_execution_order(this block's ops, then other's ops), per-op nodes.
  bool can_append(const Block& other) const;
  // §10.3. Mutates *this even when it returns false (callers merge clones).
  bool merge(const Block& other);

  // Some fuser is still Open (false for a block without fusers).
  bool still_optimizing() const;
  // Some fuser reports ready.
  bool has_ready_optimization() const;
  // By tensor id.
  bool contains_any_tensor(std::span<const ir::TensorIr> tensors) const;

  // constituents = {i} (the block's index in the list the merge guard is built over).
  void seed_constituent(std::size_t i) { constituents_ = SubGraph::single(i); }
  const SubGraph& constituents() const { return constituents_; }

  // §10.4 head settlement (0.22.1): how many of the first registered ops are settled when no
  // fuser is selected. `prototypes` are the optimizer's pristine fusers (the "would start" probe).
  std::size_t head_length(const FuserList& prototypes) const;

  // §10.4: commit this block. Finishes the chosen fuser (hence non-const); the block should not
  // be used for further registration afterwards.
  BlockOptimization optimize(const FuserList& prototypes);

  // The block as a dependency-graph node: produced, external reads, freed, position = start_pos.
  DagNode dag_node() const;

  const std::vector<ir::Operation>& operations() const { return operations_; }
  // Queue position of each op, parallel to operations() (registration order).
  const Ordering& ordering() const { return ordering_; }
  std::size_t start_pos() const { return start_pos_; }  // kNoPosition while empty
  std::size_t end_pos() const { return end_pos_; }      // 0 while empty
  std::size_t size() const { return operations_.size(); }
  const FuserList& fusers() const { return fusers_; }
  // Per fuser: the registration index of the op during which it closed; -1 if it was already
  // closed when the block was created; nullopt while Open.
  const std::vector<std::optional<std::ptrdiff_t>>& closed_at() const { return closed_at_; }
  const std::set<ir::TensorId>& produced() const { return produced_; }
  const std::set<ir::TensorId>& external_reads() const { return read_; }
  const std::set<ir::TensorId>& freed() const { return freed_; }

  // Stable sort by start_pos (§9.3 "sort by start_pos").
  static void sort_by_start_pos(std::vector<Block>& blocks);

 private:
  void register_inner(const ir::Operation& op, std::size_t pos);

  FuserList fusers_;
  std::vector<std::optional<std::ptrdiff_t>> closed_at_;
  std::vector<ir::Operation> operations_;
  Ordering ordering_;
  std::set<ir::TensorId> ids_;
  std::set<ir::TensorId> produced_;
  std::set<ir::TensorId> read_;
  std::set<ir::TensorId> freed_;
  SubGraph constituents_;
  std::size_t start_pos_ = kNoPosition;
  std::size_t end_pos_ = 0;
};

}  // namespace kiln::fusion
