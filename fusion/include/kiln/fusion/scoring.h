// Scoring (docs/spec/fusion.md §14.3): the cost model of the trace fusers, kept apart from the search.
//
// The unfused side is accumulated op by op (register_op, for every op a trace fuser accepted,
// Drop included); the fused side (global reads, global writes, view penalties) is counted on the
// finished trace by its owner and handed to evaluate(). The score is a plain function of the six
// counts:
//
//   score_io     = (F_r + F_w >= U_r + U_w) ? 0 : (U_r + U_w - F_r - F_w) * 100
//   score_launch = max(N - 1, 0) * 10
//   score        = max(score_io + score_launch - P * 50, 0)
//
// Example:
//   Scoring s;
//   for (const ir::Operation& op : accepted) s.register_op(op);
//   std::uint64_t score = s.evaluate(FusedIo{.reads = 3, .writes = 1, .penalty = 0});
//
// Thread-safety: a plain value; one owner.
#pragma once

#include <cstdint>

#include "kiln/ir/operation.h"

namespace kiln::fusion {

// What a finished trace costs: distinct global reads per block (view reads included), global
// writes, and view reads (each one penalised).
struct FusedIo {
  std::uint64_t reads = 0;
  std::uint64_t writes = 0;
  std::uint64_t penalty = 0;
  friend bool operator==(const FusedIo&, const FusedIo&) = default;
};

// Weights of the score (Burn's constants, engine/scoring.rs): one global access saved is worth
// 100, one launch saved 10, one fused view costs 50.
inline constexpr std::int64_t kScoreIoWeight = 100;
inline constexpr std::int64_t kScoreLaunchWeight = 10;
inline constexpr std::int64_t kScoreViewPenalty = 50;

// The §14.3 formula on explicit counts (unfused reads, writes, ops; fused reads, writes, views).
std::uint64_t fusion_score(std::uint64_t unfused_reads, std::uint64_t unfused_writes, std::uint64_t num_ops,
                           const FusedIo& fused);

class Scoring {
 public:
  Scoring() = default;
  // Counters given directly (unit tests, §19.2).
  Scoring(std::uint64_t unfused_reads, std::uint64_t unfused_writes, std::uint64_t num_ops)
      : reads_(unfused_reads), writes_(unfused_writes), ops_(num_ops) {}

  // U_r += |inputs(op)| (duplicates count), U_w += |outputs(op)|, N += 1.
  void register_op(const ir::Operation& op);
  std::uint64_t evaluate(const FusedIo& fused) const { return fusion_score(reads_, writes_, ops_, fused); }
  std::uint64_t evaluate(std::uint64_t fused_reads, std::uint64_t fused_writes, std::uint64_t penalty) const {
    return evaluate(FusedIo{fused_reads, fused_writes, penalty});
  }
  // All unfused counters back to 0.
  void reset() { *this = Scoring(); }

  std::uint64_t unfused_reads() const { return reads_; }
  std::uint64_t unfused_writes() const { return writes_; }
  std::uint64_t num_ops() const { return ops_; }

 private:
  std::uint64_t reads_ = 0;
  std::uint64_t writes_ = 0;
  std::uint64_t ops_ = 0;
};

}  // namespace kiln::fusion
