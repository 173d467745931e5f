#include "kiln/fusion/explorer.h"

#include <fmt/format.h>

namespace kiln::fusion {

Explorer::Explorer(FuserList prototypes, std::size_t max_blocks, std::optional<std::size_t> max_explorations,
                   const FusionLog& log)
    : log_(log),
      optimizer_(std::move(prototypes), max_blocks, log, /*configured_max_blocks=*/max_blocks),
      max_explorations_(max_explorations) {}

ExplorationResult Explorer::explore(std::span<const ir::Operation> ops, ExecutionMode mode) {
  log_.log(LogLevel::Full, [&] {
    return fmt::format("[explorer] explore ({}): {} deferred of {} queued", mode_name(mode), num_deferred_, ops.size());
  });
  if (max_explorations_ && num_explorations_ >= *max_explorations_) {
    // Exploration cap (§8.3): everything queued runs one by one; nothing is cached.
    num_deferred_ = 0;
    is_still_optimizing_ = false;
    return {ExplorationResult::Kind::Unfused, BlockOptimization::unfused(ops.size())};
  }
  update(ops);
  if (mode == ExecutionMode::Lazy && is_still_optimizing_) return {ExplorationResult::Kind::Continue, {}};
  BlockOptimization opt = optimizer_.optimize(ops);
  ++num_explorations_;
  if (mode == ExecutionMode::Sync) opt.include_trailing(ops.size());
  return {ExplorationResult::Kind::Completed, std::move(opt)};
}

void Explorer::update(std::span<const ir::Operation> ops) {
  const std::size_t start = num_explored_;
  for (std::size_t i = num_deferred_; i-- > 0;) {  // oldest deferred op first
    if (!is_still_optimizing_) {
      log_.log(LogLevel::Full, [&] {
        return fmt::format("[explorer] stopped optimizing after {} new op(s); {} deferred op(s) left unprocessed",
                           num_explored_ - start, i + 1);
      });
      break;
    }
    const ir::Operation& op = ops[ops.size() - 1 - i];
    optimizer_.register_op(op);
    ++num_explored_;
    const bool was = is_still_optimizing_;
    is_still_optimizing_ = optimizer_.still_optimizing();
    if (was && !is_still_optimizing_) {
      log_.log(LogLevel::Full, [&] {
        return fmt::format("[explorer] still_optimizing → false after op {} (explored {} ops)", op.kind_name(),
                           num_explored_);
      });
    }
  }
  num_deferred_ = 0;
}

void Explorer::reset(std::span<const ir::Operation> remaining) {
  optimizer_.reset();
  num_explored_ = 0;
  num_deferred_ = remaining.size();
  is_still_optimizing_ = true;
}

}  // namespace kiln::fusion
