#include "kiln/fusion/scoring.h"

#include <algorithm>

namespace kiln::fusion {

std::uint64_t fusion_score(std::uint64_t unfused_reads, std::uint64_t unfused_writes, std::uint64_t num_ops,
                           const FusedIo& fused) {
  const auto unfused = static_cast<std::int64_t>(unfused_reads + unfused_writes);
  const auto fused_io = static_cast<std::int64_t>(fused.reads + fused.writes);
  const std::int64_t score_io = fused_io >= unfused ? 0 : (unfused - fused_io) * kScoreIoWeight;
  const std::int64_t score_launch =
      std::max<std::int64_t>(static_cast<std::int64_t>(num_ops) - 1, 0) * kScoreLaunchWeight;
  const std::int64_t score = score_io + score_launch - static_cast<std::int64_t>(fused.penalty) * kScoreViewPenalty;
  return static_cast<std::uint64_t>(std::max<std::int64_t>(score, 0));
}

void Scoring::register_op(const ir::Operation& op) {
  reads_ += op.inputs().size();
  writes_ += op.outputs().size();
  ops_ += 1;
}

}  // namespace kiln::fusion
