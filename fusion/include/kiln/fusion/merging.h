// Merging a list of blocks (docs/spec/fusion.md §11): a two-step heuristic (recursive halves, then
// accumulation) because an exhaustive search is exponential.
//
// Every block passed in is read-only; results are new blocks (clones). The guard is the
// reachability of the DAG over ALL blocks of the caller, whose indices the blocks' constituents
// name (Block::seed_constituent); merging two blocks is refused when some outside block would have
// to run both before and after the merged one.
//
// Usage:
//   for (std::size_t i = 0; i < blocks.size(); ++i) blocks[i].seed_constituent(i);
//   Reachability guard = Dag(nodes_of(blocks)).reachability();
//   MergeResult r = merge_block_list(blocks, /*sorted=*/false, guard);
//
// Thread-safety: pure functions over values.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "kiln/fusion/block.h"
#include "kiln/fusion/dag.h"

namespace kiln::fusion {

struct MergeResult {
  enum class Kind : std::uint8_t { Full, Partial, Fail };
  Kind kind = Kind::Fail;
  // Full: exactly one block. Partial: the merged blocks (possibly several).
  std::vector<Block> merged;
  // Partial only: the blocks that could not be merged into anything.
  std::vector<Block> failed;

  static MergeResult full(Block b);
  static MergeResult partial(std::vector<Block> merged, std::vector<Block> failed);
  static MergeResult fail() { return {}; }

  bool is_full() const { return kind == Kind::Full; }
  bool is_partial() const { return kind == Kind::Partial; }
  bool is_fail() const { return kind == Kind::Fail; }
};

// §11 merge_block_list. `sorted`: sort the merged and failed lists of a Partial by start_pos.
MergeResult merge_block_list(std::span<const Block* const> blocks, bool sorted, const Reachability& guard);
MergeResult merge_block_list(std::span<const Block> blocks, bool sorted, const Reachability& guard);

// §11 merge_accumulator: fold every block of `rest` into a clone of `base` (merge_two each);
// Fail when none merged, Full when all merged, else Partial([acc], the ones that failed).
MergeResult merge_accumulator(const Block& base, std::span<const Block> rest, const Reachability& guard);

// §11 merge_two: guard first, then a in front of b, then b in front of a (on clones).
std::optional<Block> merge_two(const Block& a, const Block& b, const Reachability& guard);

// DAG nodes (Block::dag_node) of a list of blocks, in list order.
std::vector<DagNode> block_nodes(std::span<const Block> blocks);

}  // namespace kiln::fusion
