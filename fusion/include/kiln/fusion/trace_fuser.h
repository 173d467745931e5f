// The trace fuser (docs/spec/fusion.md §14.2): the incremental engine every cubecl-style fuser is built
// on. It records a kernel trace (one or more trace blocks over relative tensors), decides which
// relative ops the trace can take (output-shape compatibility, trace limits, read / view /
// indexed-input rules), counts the fused trace's global traffic for the score (§14.3) and turns
// the accepted ops into a FusedProgram.
//
// Search, cost and codegen stay apart: the trace records structure only; Scoring turns counts
// into a score; FusedProgram is what a backend compiles.
//
// Example (what the ElementWise fuser does):
//   TraceFuser f(FuseSettings::elementwise(), /*max_bindings=*/64, log);
//   for (const ir::Operation& op : relative_ops) f.fuse(op);   // stops growing on a rejection
//   if (f.properties().ready) FusedProgram p = f.finish(ProgramKind::Elementwise);
//
// Thread-safety: a plain value (copyable); one owner.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/fusion/fused_program.h"
#include "kiln/fusion/fuser.h"
#include "kiln/fusion/fusion_log.h"
#include "kiln/fusion/scoring.h"
#include "kiln/ir/operation.h"

namespace kiln::fusion {

// A tensor the trace reads from an input buffer (a binding).
struct TraceInput {
  ir::TensorIr tensor;     // relative; status = its latest use in the trace
  bool indexed = false;    // read only through Gather / Select / Cat (not a block read)
  bool unhandled = false;  // registered by a composite fuser (matmul operand; not a block read)
};

// A tensor some op of the trace produced.
struct TraceOutput {
  ir::TensorIr tensor;      // status = its latest use (NotInit until used again)
  std::uint32_t block = 0;  // producing block
  std::uint32_t local = 0;  // its register there
  std::optional<Permutation> layout;
};

enum class TraceReadKind : std::uint8_t {
  Input,   // from an input buffer (trace input `index`)
  Output,  // from the global buffer of trace output `index`, written by an earlier block
  View,    // through a view of trace input `index` (the source, already read by this block)
};

struct TraceRead {
  TraceReadKind kind = TraceReadKind::Input;
  std::uint32_t index = 0;
  std::uint64_t tensor = 0;  // the tensor read (the view's source for View)
  std::uint32_t local = 0;
  std::optional<ViewSpec> view;  // View (spec.source filled in by the program builder)
};

struct TraceBlock {
  FuseSettings settings;
  ir::Shape reference_shape;  // set when the block ends (next block) or at finish
  std::vector<ir::DType> registers;
  std::vector<std::pair<std::uint64_t, std::uint32_t>> locals;  // tensor -> register of its latest value
  std::vector<TraceRead> reads;
  std::vector<Instruction> instructions;  // Operand::input(i) names trace input i (indexed)
  std::optional<Reduction> reduction;

  std::optional<std::uint32_t> local_of(std::uint64_t tensor) const;
  bool read_from_input(std::uint64_t tensor) const;  // a TraceReadKind::Input read of it here
};

// The recorded kernel trace. Every method works on the current (last) block.
class Trace {
 public:
  explicit Trace(FuseSettings first_block = {});

  // Plain read: a register of the current block (no new read when the tensor already is a
  // local value there). Fails on indexed or quantized tensors.
  std::optional<std::uint32_t> read(const ir::TensorIr& t);
  // Indexed read (Gather / Select / Cat): the trace input index. Fails when the tensor already
  // is a plain input or an output of the trace.
  std::optional<std::uint32_t> read_indexed(const ir::TensorIr& t);
  // Whether `source` can be read through a view: read from an input buffer by the current block
  // and not produced inside the trace.
  bool can_view(const ir::TensorIr& source) const;
  // Reads `source` through `spec` into a new register that becomes `out`'s value; registers
  // `out` as a trace output. Requires can_view(source).
  std::optional<std::uint32_t> read_view(const ir::TensorIr& source, const ir::TensorIr& out, ViewSpec spec);
  // Writes `t`: a new register of the current block, registered as a trace output.
  std::optional<std::uint32_t> write(const ir::TensorIr& t);
  // Registers scalar placeholder k.
  void use_scalar(std::uint32_t k);
  // Records `t`'s status as its latest use in the input and output registries.
  void use(const ir::TensorIr& t);
  void add_instruction(Instruction ins) { current().instructions.push_back(std::move(ins)); }
  void count_element_op() { ++num_element_ops_; }

  // Composite fusers. A matmul operand: a binding, not a block read.
  std::optional<std::uint32_t> register_unhandled_input(const ir::TensorIr& t);
  void set_matmul(MatmulSpec m) { matmul_ = m; }
  // Ends the current block with `reference` as its reference shape and starts a new one with
  // `settings`; `handover` is read in the ending block (its register is returned) and passes to
  // the new block in registers.
  std::optional<std::uint32_t> next_block(const ir::TensorIr& handover, const ir::Shape& reference,
                                          FuseSettings settings);
  void set_reduction(Reduction r) { current().reduction = r; }
  // The stride order `tensor` is written with (NHWC); false when it is not a trace output.
  bool set_output_layout(std::uint64_t tensor, Permutation layout);

  // 1 (metadata) + input registrations + tensors written to global memory (§14.2).
  std::uint32_t estimate_bindings() const;
  // F_r, F_w, P of §14.3.
  FusedIo fused_io() const;
  // Whether trace output `i` is written to global memory: its latest status is not ReadWrite,
  // or a later block reads it back.
  bool is_written(std::size_t output) const;

  // The program; `last_reference` is the reference shape of the current block.
  FusedProgram to_program(ProgramKind kind, const ir::Shape& last_reference) const;

  std::size_t num_element_ops() const { return num_element_ops_; }
  std::size_t num_blocks() const { return blocks_.size(); }
  const std::vector<TraceBlock>& blocks() const { return blocks_; }
  const std::vector<TraceInput>& inputs() const { return inputs_; }
  const std::vector<TraceOutput>& outputs() const { return outputs_; }
  const FuseSettings& settings() const { return blocks_.back().settings; }
  std::optional<std::uint32_t> find_input(std::uint64_t tensor) const;
  std::optional<std::uint32_t> find_output(std::uint64_t tensor) const;

 private:
  TraceBlock& current() { return blocks_.back(); }
  std::uint32_t new_register(ir::DType dtype);
  void set_local(std::uint64_t tensor, std::uint32_t reg);

  std::vector<TraceBlock> blocks_;
  std::vector<TraceInput> inputs_;
  std::vector<TraceOutput> outputs_;
  std::vector<std::uint32_t> scalars_;  // ascending, unique
  std::optional<MatmulSpec> matmul_;
  std::size_t num_element_ops_ = 0;
};

class TraceFuser {
 public:
  // Reject an op when the trace already holds more than this many fused element ops (Burn's
  // limit; keeps generated kernels and their register pressure bounded).
  static constexpr std::size_t kMaxFusedOps = 64;

  TraceFuser(FuseSettings settings, std::uint32_t max_bindings, FusionLog log = {});

  // Offer the next relative op (§14.2). A rejection closes the fuser and logs at Full:
  // "[fuser] closed on {Head} ({reason}); had {n} ops, est_bindings={e}/{max}".
  void fuse(const ir::Operation& op);
  FuserStatus status() const { return status_; }
  // ready = num_ops > 0; score = Scoring on the trace.
  FuserProperties properties() const;
  std::size_t num_ops() const { return num_ops_; }
  std::size_t num_views() const { return num_views_; }
  // Close without logging (composite fusers closing their parts).
  void close() { status_ = FuserStatus::Closed; }
  void reset();

  // The output-shape gate (§14.2). Updates current_output_shape when it accepts.
  bool output_is_compatible(const ir::TensorIr& out);
  const ir::Shape& current_output_shape() const { return current_output_shape_; }

  // Composite hooks; none goes through the trace limits nor uses up the first-op flag.
  // Matmul: registers the operands as inputs and the output as a local value (and output) of
  // the current block; sets current_output_shape.
  bool register_matmul(const ir::Operation& matmul);
  // Reduction: ends the current block (reference = current_output_shape, or the reduce input's
  // shape when no op came before: a block that only loads it), hands the reduce input over,
  // registers the reduce output in a new block with `settings`; current_output_shape becomes the
  // output's shape. The caller checked the input shape.
  bool register_reduce(const ir::Operation& reduce, ir::DType accumulator, FuseSettings settings);
  bool set_output_layout(std::uint64_t tensor, Permutation layout) {
    return trace_.set_output_layout(tensor, std::move(layout));
  }

  // The program of the accepted ops (current_output_shape is the last block's reference;
  // len = num_ops, composite fusers adjust it).
  FusedProgram finish(ProgramKind kind) const;

  std::uint32_t estimate_bindings() const { return trace_.estimate_bindings(); }
  std::uint32_t max_bindings() const { return max_bindings_; }
  FusedIo fused_io() const { return trace_.fused_io(); }
  const Scoring& scoring() const { return scoring_; }
  const Trace& trace() const { return trace_; }
  const FuseSettings& settings() const { return trace_.settings(); }
  const FusionLog& log() const { return log_; }

 private:
  void close_on(const ir::Operation& op, std::string_view reason);
  // Dispatch by family; true when accepted.
  bool fuse_traced(const ir::Operation& op);
  bool fuse_view(const ir::Operation& op, const ViewSpec& spec);
  // TryTraceFuser: the 64-op limit, then `apply` on a copy of the trace, then the bindings
  // check (skipped for the first op on a fresh trace).
  template <class Apply>
  bool try_trace(Apply&& apply);

  FuseSettings initial_settings_;
  std::uint32_t max_bindings_;
  FusionLog log_;
  Trace trace_;
  Scoring scoring_;
  ir::Shape current_output_shape_;
  FuserStatus status_ = FuserStatus::Open;
  std::size_t num_ops_ = 0;
  std::size_t num_views_ = 0;
  bool first_checked_ = false;  // the first op on a fresh trace skips the bindings check
};

// Offers `op` to two fusers that must agree (a composite fuser's main trace and its fallback):
// accepted iff both accept it; otherwise both end Closed, as if it had been tried on clones
// first (only the fuser that rejected it logs its close line). Returns whether it was accepted.
bool fuse_both(TraceFuser& a, TraceFuser& b, const ir::Operation& op);

// The accumulator dtype of a dim reduction (§14.7): sum/mean/prod widen f16/bf16 -> f32,
// i8/i16 -> i32, u8/u16 -> u32; everything else reduces in the input dtype.
ir::DType reduce_accumulator(ir::OpKind kind, ir::DType input);

}  // namespace kiln::fusion
