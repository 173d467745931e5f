// The built-in fusers (docs/spec/fusion.md §14.4–§14.8), all built on the trace fuser engine, and the
// registry list a new stream starts with.
//
//   ElementWise        the trace fuser alone (§14.4).
//   Matmul             Float::Matmul head + elementwise epilogue, with an epilogue-only fallback
//                      (§14.5). len = epilogue ops + 1; a lone matmul is never ready.
//   Reduce             fuse-on-read prologue, one dim reduction, fuse-on-write epilogue, with
//                      read / write fallbacks (§14.7).
//   ReduceBroadcasted  chains of Reduce blocks sharing the reduced input shape and (last) axis,
//                      with elementwise blocks broadcasting the reduced values back (§14.8).
//   NHWCRelayout       elementwise work whose result a pool / interpolate consumes: written
//                      with NHWC strides, then the module op runs unfused (§14.6).
//   Row                kiln's row fuser (beyond Burn, `[fusion] row_fuser`): ReduceBroadcasted's
//                      chains, also opening with a reduction (softmax's MaxDim), run row group by
//                      row group (docs/fusion.md, "The row fuser").
//
// Example:
//   FuserList fusers = default_fusers(log, FuserOptions{});   // registry order, see below
//   for (const ir::Operation& op : relative_ops) for (auto& f : fusers) f->fuse(op);
//   // pick the ready fuser with the highest score > 0 (ties: earlier entry), then f->finish().
//
// Thread-safety: fusers are plain values owned by one block of one stream's search.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "kiln/fusion/fused_program.h"
#include "kiln/fusion/fuser.h"
#include "kiln/fusion/fusion_log.h"
#include "kiln/fusion/plan_store.h"
#include "kiln/fusion/trace_fuser.h"
#include "kiln/ir/operation.h"

namespace kiln::fusion {

struct FuserOptions {
  // Most kernel buffer bindings one fused kernel may use (inputs + written outputs + 1 for
  // metadata). The CPU backend passes plain pointers and has no device limit, and CUDA kernel
  // parameters allow thousands of pointers; 64 is generous so that the 64-op trace limit, not the
  // bindings, bounds a kernel in practice, while still meeting the seed's needs (§19.1.4: 11
  // bindings for five chains, 13 for six). Tests lower it to exercise the check.
  std::uint32_t max_bindings = 64;
  // Registers the row fuser after the built-ins (`[fusion] row_fuser`). Off: exactly Burn's
  // search (docs/spec/fusion.md §14). Off by default until its programs beat Burn's split on
  // every backend (docs/decisions.md, fusion).
  bool row_fuser = false;
};

class ElementWiseFuser final : public OperationFuser {
 public:
  explicit ElementWiseFuser(std::uint32_t max_bindings, FusionLog log = {});
  void fuse(const ir::Operation& op) override { fuser_.fuse(op); }
  FuserStatus status() const override { return fuser_.status(); }
  FuserProperties properties() const override { return fuser_.properties(); }
  std::size_t len() const override { return fuser_.num_ops(); }
  OptimizationPtr finish() override;
  void reset() override { fuser_.reset(); }
  std::unique_ptr<OperationFuser> clone() const override { return std::make_unique<ElementWiseFuser>(*this); }

  FusedProgram program() const;
  const TraceFuser& trace_fuser() const { return fuser_; }

 private:
  TraceFuser fuser_;
};

class MatmulFuser final : public OperationFuser {
 public:
  explicit MatmulFuser(std::uint32_t max_bindings, FusionLog log = {});
  void fuse(const ir::Operation& op) override;
  FuserStatus status() const override { return epilogue_.status(); }
  FuserProperties properties() const override { return epilogue_.properties(); }
  std::size_t len() const override { return matmul_ ? epilogue_.num_ops() + 1 : 0; }
  OptimizationPtr finish() override;
  void reset() override;
  std::unique_ptr<OperationFuser> clone() const override { return std::make_unique<MatmulFuser>(*this); }

  FusedProgram program() const;
  const TraceFuser& epilogue() const { return epilogue_; }
  const TraceFuser& fallback() const { return fallback_; }

 private:
  TraceFuser epilogue_;
  TraceFuser fallback_;
  std::optional<ir::Operation> matmul_;
};

class ReduceFuser final : public OperationFuser {
 public:
  // `leading_reduction` (the row fuser's blocks only, beyond §14.7): a reduction as the first op
  // is captured with an empty prologue that loads its input, instead of closing the fuser.
  explicit ReduceFuser(std::uint32_t max_bindings, FusionLog log = {}, bool leading_reduction = false);
  void fuse(const ir::Operation& op) override;
  FuserStatus status() const override { return main_.status(); }
  // Main properties with ready = a reduction was captured.
  FuserProperties properties() const override;
  std::size_t len() const override { return main_.num_ops() + (reduce_ ? 1 : 0); }
  OptimizationPtr finish() override;
  void reset() override;
  std::unique_ptr<OperationFuser> clone() const override { return std::make_unique<ReduceFuser>(*this); }

  // A Reduce program when a reduction was captured, else the elementwise program of the ops
  // accepted so far (a ReduceBroadcasted broadcast-back block).
  FusedProgram program() const;
  bool captured() const { return reduce_.has_value(); }
  const std::optional<ir::Operation>& reduction() const { return reduce_; }
  std::size_t prologue_len() const { return read_ops_; }  // ops accepted before the reduction
  const TraceFuser& main() const { return main_; }
  const TraceFuser& read_fallback() const { return read_fallback_; }
  const TraceFuser& write_fallback() const { return write_fallback_; }

  // SumDim, MeanDim, ProdDim, ArgMax, ArgMin, MinDim, MaxDim, MaxAbsDim (numeric float or int),
  // AnyDim, AllDim (base).
  static bool is_dim_reduction(const ir::Operation& op);

 private:
  void on_reduce(const ir::Operation& op);

  TraceFuser main_;
  TraceFuser read_fallback_;
  TraceFuser write_fallback_;
  std::optional<ir::Operation> reduce_;
  std::size_t read_ops_ = 0;  // ops accepted before the reduction
  bool leading_reduction_ = false;
};

class ReduceBroadcastedFuser final : public OperationFuser {
 public:
  enum class State : std::uint8_t { Starting, Init, Closed, Abort };

  explicit ReduceBroadcastedFuser(std::uint32_t max_bindings, FusionLog log = {});
  void fuse(const ir::Operation& op) override;
  FuserStatus status() const override;
  FuserProperties properties() const override;
  std::size_t len() const override { return num_ops_; }
  OptimizationPtr finish() override;
  void reset() override;
  std::unique_ptr<OperationFuser> clone() const override { return std::make_unique<ReduceBroadcastedFuser>(*this); }

  FusedProgram program() const;
  State state() const { return state_; }
  const std::vector<ReduceFuser>& blocks() const { return blocks_; }

 private:
  // After an accepted op: the last-axis check on a block holding a captured reduction.
  void check_reduction(const ReduceFuser& block);

  std::uint32_t max_bindings_;
  FusionLog log_;
  std::vector<ReduceFuser> blocks_;
  State state_ = State::Starting;
  ir::Shape shape_;        // Init: the reduction input's relative shape
  std::int64_t axis_ = 0;  // Init: the reduced axis
  std::size_t num_ops_ = 0;
};

class NhwcRelayoutFuser final : public OperationFuser {
 public:
  // Score bonus when a module op was captured (Burn's constant).
  static constexpr std::uint64_t kCaptureBonus = 100;

  explicit NhwcRelayoutFuser(std::uint32_t max_bindings, FusionLog log = {});
  void fuse(const ir::Operation& op) override;
  FuserStatus status() const override { return inner_.status(); }
  FuserProperties properties() const override;
  std::size_t len() const override { return inner_.num_ops() + (captured_ ? 1 : 0); }
  OptimizationPtr finish() override;
  void reset() override;
  std::unique_ptr<OperationFuser> clone() const override { return std::make_unique<NhwcRelayoutFuser>(*this); }

  FusedProgram program() const;
  bool captured() const { return captured_.has_value(); }

 private:
  TraceFuser inner_;
  std::optional<ir::Operation> captured_;
};

// The row fuser (kiln, beyond Burn): a chain of blocks like ReduceBroadcasted's, each a Reduce
// fuser, over one [rows, n] space: every reduction reduces the last axis of the same relative
// input shape, and every elementwise block after a reduction produces that shape (the reduced
// values broadcast back). Unlike ReduceBroadcasted it may open with a reduction, a block may too
// (layer norm's second MeanDim), and an op that would break the chain (another axis or shape)
// closes it with the ops accepted so far instead of aborting.
//
// Ready when it captured a reduction and holds what no Burn fuser covers alone: two blocks or
// more, or a leading reduction. Score = Σ block scores + kBlockBonus per block: each block
// boundary that stays in cache saves a launch and a global round trip of the values handed
// over, so on the same ops it beats ReduceBroadcasted (the same stages run from memory), and it
// is never ready where only a single Reduce program fits (Reduce keeps those).
class RowFuser final : public OperationFuser {
 public:
  static constexpr std::uint64_t kBlockBonus = 100;

  explicit RowFuser(std::uint32_t max_bindings, FusionLog log = {});
  void fuse(const ir::Operation& op) override;
  FuserStatus status() const override;
  FuserProperties properties() const override;
  std::size_t len() const override { return num_ops_; }
  OptimizationPtr finish() override;
  void reset() override;
  std::unique_ptr<OperationFuser> clone() const override { return std::make_unique<RowFuser>(*this); }

  FusedProgram program() const;
  const std::vector<ReduceFuser>& blocks() const { return blocks_; }

 private:
  // Whether reduction `r` reduces the last axis of the row space (the first one sets it).
  bool fits_rows(const ir::Operation& r) const;
  bool leads_with_reduction() const;

  std::uint32_t max_bindings_;
  FusionLog log_;
  std::vector<ReduceFuser> blocks_;
  bool closed_ = false;
  ir::Shape rows_;  // the reductions' input shape, once one was captured
  std::size_t num_ops_ = 0;
};

// PlanStoreOptions::search_options of a search with these fusers.
constexpr std::uint16_t search_options_of(const FuserOptions& options) {
  return options.row_fuser ? kSearchRowFuser : std::uint16_t{0};
}

// The built-ins in registry order (which breaks score ties): ElementWise, Matmul, Reduce,
// ReduceBroadcasted, NHWCRelayout, then Row when FuserOptions::row_fuser.
FuserList default_fusers(const FusionLog& log, FuserOptions opts = {});

}  // namespace kiln::fusion
