// StreamOptimizer (docs/spec/fusion.md §9), BlocksOptimizer (§10.5) and repair_order (§10.6): the search
// that assigns a stream's relative ops to blocks whose fusers compete, then commits one
// BlockOptimization.
//
// Usage (what the Explorer does):
//   StreamOptimizer so(std::move(prototypes), StreamOptimizer::kDefaultMaxBlocks, log);
//   for (const auto& op : relative_ops) { so.register_op(op); if (!so.still_optimizing()) break; }
//   BlockOptimization bo = so.optimize(relative_ops);   // positions are 0-based queue positions
//   so.reset();
//
// Every log line of §17.2 that these components emit goes to the FusionLog passed in.
//
// Thread-safety: owned by one stream's Explorer; not thread-safe. The FusionLog must outlive it.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "kiln/fusion/block.h"
#include "kiln/fusion/fuser.h"
#include "kiln/fusion/fusion_log.h"
#include "kiln/fusion/strategy.h"
#include "kiln/ir/operation.h"

namespace kiln::fusion {

// §10.6: re-order the top-level chunks of a committed optimization by their dependencies and
// validate the final order against tensor lifetimes; falls back to unfused stream order
// (logging "[repair] falling back to unfused stream order ({n} ops)" at Medium).
BlockOptimization repair_order(BlockOptimization bo, std::span<const ir::Operation> ops, const FusionLog& log);

// §10.5: merges what it can, commits every block in dependency order, reports interior holes.
class BlocksOptimizer {
 public:
  struct Result {
    // Full: `optimization` is set. WithHoles: `strategies`, `ordering` and `holes` are set.
    bool full = true;
    BlockOptimization optimization;
    std::vector<ExecutionStrategy> strategies;
    Ordering ordering;
    std::vector<std::size_t> holes;  // unresolved positions before the last resolved one
  };

  // `prototypes` (the pristine fusers, for head settlement) and `log` must outlive the call.
  BlocksOptimizer(std::vector<Block> blocks, const FuserList& prototypes, const FusionLog& log)
      : blocks_(std::move(blocks)), prototypes_(prototypes), log_(log) {}

  // Emits the Basic "selected single strategy" / "selected composed strategy ({n}
  // sub-strategies)" line.
  Result optimize() &&;

  // §10.5 merging_pass, exposed for tests.
  static std::vector<Block> merging_pass(std::vector<Block> blocks);

 private:
  std::vector<Block> blocks_;
  const FuserList& prototypes_;
  const FusionLog& log_;
};

class StreamOptimizer {
 public:
  // fusion.beam_search.max_blocks default. Chosen upstream: larger values make relative segments
  // longer and more varied (more cache misses and re-explorations) and the per-registration
  // dependency analysis grows quadratically or worse with the number of blocks.
  static constexpr std::size_t kDefaultMaxBlocks = 5;

  // `max_blocks`: nullopt = no limit (tests only). `configured_max_blocks`: the value a new
  // optimizer reads from the configuration; hole sub-searches use it (they never inherit an
  // override of the parent, §9.6). `log` must outlive the optimizer.
  StreamOptimizer(FuserList prototypes, std::optional<std::size_t> max_blocks, const FusionLog& log,
                  std::size_t configured_max_blocks = kDefaultMaxBlocks);

  StreamOptimizer(const StreamOptimizer&) = delete;
  StreamOptimizer& operator=(const StreamOptimizer&) = delete;
  StreamOptimizer(StreamOptimizer&&) = default;
  StreamOptimizer& operator=(StreamOptimizer&&) = default;

  // §9.1: offer the next relative op (its position is length()).
  void register_op(const ir::Operation& op);
  // §9.2.
  bool still_optimizing() const;
  // §9.6: commit what is registered; `ops` are the relative ops whose positions were registered
  // (the segment; extra trailing ops are allowed and ignored).
  BlockOptimization optimize(std::span<const ir::Operation> ops) const;
  // §9.7.
  void reset();

  // §9.4, exposed so tests can drive the defensive cycle check directly (§19.7 item 14).
  void on_dependent_op(const ir::Operation& op);

  std::size_t num_blocks() const { return blocks_.size(); }
  const std::vector<Block>& blocks() const { return blocks_; }
  // Ops registered so far (the position the next op gets).
  std::size_t length() const { return length_; }
  bool stopped() const { return stopped_; }
  std::optional<std::size_t> max_blocks() const { return max_blocks_; }
  const FuserList& prototypes() const { return prototypes_; }

 private:
  enum class MergeStep : std::uint8_t { Full, Partial, Fail, NoNeed };

  MergeStep merge_blocks(const ir::Operation& op, bool all);
  bool register_max_block(const ir::Operation& op, std::size_t max);
  std::size_t register_inner(const ir::Operation& op, bool force);
  void on_new_block(const ir::Operation& op);
  void log_accepted(const ir::Operation& op, std::size_t added) const;

  FuserList prototypes_;
  std::vector<Block> blocks_;
  std::size_t length_ = 0;
  bool stopped_ = false;
  std::optional<std::size_t> max_blocks_;
  std::size_t configured_max_blocks_;
  const FusionLog* log_;
};

}  // namespace kiln::fusion
