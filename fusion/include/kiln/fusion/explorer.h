// Explorer: feeds a stream's deferred operations to its StreamOptimizer and commits an
// optimization when nothing can grow any more (Lazy) or at a drain (Sync) (docs/spec/fusion.md §8).
//
// Thread-safety: owned by one stream actor.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>

#include "kiln/fusion/fusion_log.h"
#include "kiln/fusion/policy.h"
#include "kiln/fusion/stream_optimizer.h"

namespace kiln::fusion {

struct ExplorationResult {
  enum class Kind : std::uint8_t { Completed, Continue, Unfused };
  Kind kind = Kind::Continue;
  BlockOptimization optimization;  // Completed / Unfused
};

class Explorer {
 public:
  Explorer(FuserList prototypes, std::size_t max_blocks, std::optional<std::size_t> max_explorations,
           const FusionLog& log);

  ExplorationResult explore(std::span<const ir::Operation> ops, ExecutionMode mode);
  // All remaining ops become deferred again; num_explorations is kept.
  void reset(std::span<const ir::Operation> remaining);

  void add_deferred(std::size_t n = 1) { num_deferred_ += n; }
  bool is_up_to_date() const { return num_deferred_ == 0; }
  std::size_t num_deferred() const { return num_deferred_; }
  std::size_t num_explorations() const { return num_explorations_; }
  std::size_t num_explored() const { return num_explored_; }

 private:
  void update(std::span<const ir::Operation> ops);

  const FusionLog& log_;
  StreamOptimizer optimizer_;
  std::size_t num_deferred_ = 0;
  std::size_t num_explored_ = 0;
  bool is_still_optimizing_ = true;
  std::size_t num_explorations_ = 0;
  std::optional<std::size_t> max_explorations_;
};

}  // namespace kiln::fusion
