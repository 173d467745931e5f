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
  explicit ReduceFuser(std::uint32_t max_bindings, FusionLog log = {});
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

// The built-ins in registry order (which breaks score ties): ElementWise, Matmul, Reduce,
// ReduceBroadcasted, NHWCRelayout.
FuserList default_fusers(const FusionLog& log, FuserOptions opts = {});

}  // namespace kiln::fusion
