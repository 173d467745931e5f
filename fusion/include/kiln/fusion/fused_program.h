// FusedProgram: the backend-neutral program a fuser finishes (what the CPU backend and the
// NVRTC code generator execute), and FusedOptimization, the Optimization that carries it.
//
// A program is independent of concrete sizes and scalar values, so one compiled kernel serves
// every size and every scalar value of the same structure:
//   * tensors are RELATIVE ids; at run time the execution context's converter maps each one to
//     its latest global TensorIr (global id and concrete shape, docs/spec/fusion.md §3.10), but the
//     status used to fetch the handle is the one recorded here (a ReadWrite input may be
//     consumed / its buffer reused);
//   * shapes are relative dim ids (0 means size 1; equal ids mean equal sizes), resolved through
//     the converter's shapes_rel2glob;
//   * scalars are placeholder indices k into the context's scalars.
//
// Structure. A program is a list of blocks run in order; each block iterates over its reference
// shape, element by element (numexpr-style: a CPU backend runs it chunk by chunk, vectorised):
//
//   block:  [reduction]     only in the second block of a Reduce program: reduces a register of
//                           the previous block along `axis` into a register of this block;
//           loads           global reads into registers (from an input buffer, or from an output
//                           buffer written by an earlier block), possibly broadcast;
//           instructions    SSA over the block's registers; operands are registers, program
//                           inputs (views and indexed inputs, read with their own indexing) or
//                           scalar placeholders;
//           stores          registers written to global output buffers. An output whose
//                           relative shape has dim 0 where the reference has not (a broadcast
//                           output) is stored at the broadcast position: every element mapping
//                           there stores the same value.
// Operand kinds: a register (`Local`) of the same block; a program `Input` (only View and
// Indexed inputs are read this way, plain ones are loaded first); a `Scalar` placeholder k,
// converted to the instruction's compute dtype.
//
// Kinds:
//   Elementwise        one block.
//   Matmul             `matmul` (lhs, rhs inputs) produces a register of block 0; block 0 is the
//                      epilogue reading that register. fallbacks[0] = the epilogue alone (an
//                      Elementwise program) to run after the matmul executed unfused.
//   Reduce             block 0 = prologue (fuse-on-read), block 1 = reduction + epilogue
//                      (fuse-on-write). fallbacks[0] = prologue alone, fallbacks[1] = epilogue
//                      alone, for running the reduction unfused in between.
//   ReduceBroadcasted  `stages`: Reduce / Elementwise programs run in order; values pass between
//                      stages through global memory (a stage's output is a later stage's input).
//   NhwcRelayout       one elementwise block; then the captured module op runs unfused; the
//                      output it reads is written with NHWC strides (`ProgramOutput::layout`).
//   Row                `stages` as ReduceBroadcasted (kiln's row fuser, beyond Burn): every stage
//                      iterates the same [rows, n] space (reductions over the last axis); the
//                      first stage's prologue may be empty (a chain that opens with a reduction).
//                      A backend runs the stages row group by row group, so what one stage
//                      hands to the next stays in cache (docs/fusion.md, "The row fuser").
// `captured_op_position` is the position, among the ops the optimization covers, of the op a
// composite fuser captured (the matmul, the reduction, the pool), for fallbacks; `len` the number
// of ops a program covers (stages cover consecutive ranges, in order).
//
// Thread-safety: immutable values once built; share freely.
#pragma once

#include <atomic>
#include <boost/container/small_vector.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/fusion/fuser.h"
#include "kiln/ir/operation.h"

namespace kiln::fusion {

// ---- Trace settings (docs/spec/fusion.md §14.9). Only `broadcast` and `output_shape_updates` change what
// a fuser accepts; the rest are code-generation hints carried by every block.
enum class Vectorization : std::uint8_t { Activated, Deactivated, SmallerOrEqualThanPreviousBlock };
enum class RefLayout : std::uint8_t {
  Any,             // any reference layout; the kernel may choose its output layout
  AnyKeepOutput,   // any reference layout, but outputs keep the layout they are given (NHWC)
  OnlyContiguous,  // contiguous reference only (Reduce)
};

struct FuseSettings {
  bool broadcast = true;
  bool output_shape_updates = true;
  bool inplace = true;
  Vectorization vectorization = Vectorization::Activated;
  RefLayout ref_layout = RefLayout::Any;

  static FuseSettings elementwise() { return {}; }
  static FuseSettings matmul_epilogue() { return {.output_shape_updates = false}; }
  static FuseSettings reduce_read() { return {.broadcast = false, .ref_layout = RefLayout::OnlyContiguous}; }
  static FuseSettings reduce_write() {
    return {.broadcast = false,
            .output_shape_updates = false,
            .inplace = false,
            .vectorization = Vectorization::SmallerOrEqualThanPreviousBlock,
            .ref_layout = RefLayout::OnlyContiguous};
  }
  static FuseSettings nhwc() { return {.ref_layout = RefLayout::AnyKeepOutput}; }
  friend bool operator==(const FuseSettings&, const FuseSettings&) = default;
};

// ---- Program parts.

enum class ProgramKind : std::uint8_t { Elementwise, Matmul, Reduce, ReduceBroadcasted, NhwcRelayout, Row };
// "ElementWise", "Matmul", "Reduce", "ReduceBroadcasted", "NHWCRelayout" (docs/spec/fusion.md §14.1), "Row".
std::string_view program_kind_name(ProgramKind k);
inline constexpr std::size_t kNumProgramKinds = static_cast<std::size_t>(ProgramKind::Row) + 1;
// Whether a program of this kind is a list of `stages` run in order (ReduceBroadcasted, Row).
constexpr bool is_staged(ProgramKind k) { return k == ProgramKind::ReduceBroadcasted || k == ProgramKind::Row; }

enum class InputRole : std::uint8_t {
  Plain,      // read element-wise at the block's position
  Broadcast,  // read element-wise, some relative dim 0 where the reading block's reference is not
  View,       // read through a SwapDims / Reshape of another input (no buffer of its own)
  Indexed,    // read at computed positions by Gather / Select / Cat
};
std::string_view input_role_name(InputRole r);

// A view read (role View): `source` is the input entry of the viewed tensor (same buffer).
struct ViewSpec {
  ir::OpKind op = ir::OpKind::Base_SwapDims;  // Base_SwapDims or Base_Reshape
  std::uint32_t source = 0;
  std::int64_t dim1 = 0, dim2 = 0;  // SwapDims
  ir::Shape shape;                  // the view's relative shape
  friend bool operator==(const ViewSpec&, const ViewSpec&) = default;
};

struct ProgramInput {
  std::uint64_t tensor = 0;  // relative id
  ir::DType dtype;
  ir::Shape shape;                                       // relative shape of the tensor
  ir::TensorStatus status = ir::TensorStatus::ReadOnly;  // latest use in the trace
  InputRole role = InputRole::Plain;
  std::optional<ViewSpec> view;  // role View
  // Several entries may name the same tensor (a plain read and view reads of it): fetch each
  // distinct tensor once. Entries with role View do not occupy a binding.
  friend bool operator==(const ProgramInput&, const ProgramInput&) = default;
};

enum class OperandKind : std::uint8_t { Local, Input, Scalar };
struct Operand {
  OperandKind kind = OperandKind::Local;
  std::uint32_t index = 0;  // register / program input / scalar placeholder k
  static Operand local(std::uint32_t r) { return {OperandKind::Local, r}; }
  static Operand input(std::uint32_t i) { return {OperandKind::Input, i}; }
  static Operand scalar(std::uint32_t k) { return {OperandKind::Scalar, k}; }
  friend bool operator==(const Operand&, const Operand&) = default;
};
using OperandList = boost::container::small_vector<Operand, 3>;

// One instruction: out = op(operands). `op` is the ir kind it computes (Base_Reshape with a
// register operand is a plain copy; Base_SwapDims / Base_Reshape with a View input read that
// view); `compute` is the dtype it computes in (the first tensor operand's, or the output's for
// creation ops), `out_dtype` the dtype it produces (bool for comparisons, the target for casts).
// attrs: the op's attributes verbatim (Gather / Select / Cat [dim], SwapDims [dim1, dim2]).
struct Instruction {
  ir::OpKind op = ir::OpKind::Numeric_Add;
  ir::Family family = ir::Family::NumericFloat;
  ir::DType compute;
  ir::DType out_dtype;
  OperandList operands;
  ir::AttrList attrs;
  std::uint32_t out = 0;  // register
  friend bool operator==(const Instruction&, const Instruction&) = default;
};

enum class LoadSource : std::uint8_t { Input, Output };
struct Load {
  LoadSource source = LoadSource::Input;
  std::uint32_t index = 0;  // program input, or program output written by an earlier block
  std::uint32_t local = 0;
  bool broadcast = false;  // the tensor has relative dim 0 where the block's reference has not
  friend bool operator==(const Load&, const Load&) = default;
};

struct Store {
  std::uint32_t output = 0;
  std::uint32_t local = 0;
  friend bool operator==(const Store&, const Store&) = default;
};

// The reduction of a Reduce program: reads register `input` of the previous block (the value is
// handed over in registers, never through memory unless that tensor is also an output), reduces
// `axis`, and defines register `out` of its own block.
struct Reduction {
  ir::OpKind op = ir::OpKind::Numeric_SumDim;
  ir::Family family = ir::Family::NumericFloat;
  std::int64_t axis = 0;
  std::uint32_t input = 0;
  std::uint32_t out = 0;
  ir::DType input_dtype;
  ir::DType accumulator;  // §14.7: sum/mean/prod widen f16/bf16 -> f32, i8/i16 -> i32, u8/u16 -> u32
  ir::DType out_dtype;
  friend bool operator==(const Reduction&, const Reduction&) = default;
};

// The matmul of a Matmul program: lhs, rhs are program inputs; it defines register `out` of
// block 0 (the epilogue).
struct MatmulSpec {
  std::uint32_t lhs = 0;
  std::uint32_t rhs = 0;
  std::uint32_t out = 0;
  ir::DType dtype;  // the op's carried dtype
  ir::DType out_dtype;
  friend bool operator==(const MatmulSpec&, const MatmulSpec&) = default;
};

struct ProgramBlock {
  ir::Shape reference_shape;  // relative; the block's iteration space
  FuseSettings settings;
  std::vector<ir::DType> registers;  // dtype of each register
  std::optional<Reduction> reduction;
  std::vector<Load> loads;
  std::vector<Instruction> instructions;
  std::vector<Store> stores;
  friend bool operator==(const ProgramBlock&, const ProgramBlock&) = default;
};

// A stride order: layout[d] = place of logical dim d in memory order (0 = outermost, largest
// stride). NHWC for rank r is [0, r-1, 1, ..., r-2]: channels (dim 1) innermost.
using Permutation = std::vector<std::uint32_t>;

struct ProgramOutput {
  std::uint64_t tensor = 0;  // relative id
  ir::DType dtype;
  ir::Shape shape;
  ir::TensorStatus status = ir::TensorStatus::NotInit;  // latest use in the trace
  std::uint32_t block = 0;                              // producing block
  std::uint32_t local = 0;                              // its register there
  bool written = false;                                 // stored to global memory
  bool kept = false;                  // still needed after the kernel (status != ReadWrite): register its
                                      // handle; written && !kept = a temporary between blocks
  std::optional<Permutation> layout;  // stride order to write it with (NHWC), default row-major
  friend bool operator==(const ProgramOutput&, const ProgramOutput&) = default;
};

// structural_hash() remembered by the object that computed it. A plan's program is launched
// over and over and its hash walks every block and instruction (a few % of the cache-hit path).
// Copies start empty and it never takes part in ==, so a program built by copying and editing
// another never carries a stale hash; a program must not be edited after it was hashed.
class StructuralHashMemo {
 public:
  StructuralHashMemo() = default;
  StructuralHashMemo(const StructuralHashMemo&) noexcept {}
  StructuralHashMemo& operator=(const StructuralHashMemo&) noexcept {
    value_.store(0, std::memory_order_relaxed);
    return *this;
  }
  // 0: not computed yet (a real hash of 0 is just recomputed each time).
  std::uint64_t get() const { return value_.load(std::memory_order_relaxed); }
  void set(std::uint64_t h) const { value_.store(h, std::memory_order_relaxed); }

 private:
  // Relaxed: concurrent first calls compute the same value; the program itself is published to
  // the launching threads by the plan store.
  mutable std::atomic<std::uint64_t> value_{0};
};

struct FusedProgram {
  ProgramKind kind = ProgramKind::Elementwise;
  std::vector<ProgramInput> inputs;
  std::vector<std::uint32_t> scalars;  // placeholder indices used, ascending
  std::vector<ProgramBlock> blocks;
  std::vector<ProgramOutput> outputs;
  std::optional<MatmulSpec> matmul;
  std::vector<FusedProgram> stages;     // ReduceBroadcasted, Row
  std::vector<FusedProgram> fallbacks;  // Matmul, Reduce (see above)
  std::size_t captured_op_position = 0;
  std::size_t len = 0;  // number of ops the program covers (a stage: its share of the ops, in order)
  StructuralHashMemo hash_memo;

  // Hash for kernel caches: covers the whole structure, nothing concrete; consistent with ==.
  // Computed once per object (see StructuralHashMemo).
  std::uint64_t structural_hash() const;
  friend bool operator==(const FusedProgram&, const FusedProgram&);
  // Readable, multi-line (fusion log, kiln-lab).
  std::string to_string() const;
  // Largest relative dim id in any block's reference shape, over stages and fallbacks too
  // (docs/spec/fusion.md §14.2); none when every reference shape is empty.
  std::optional<std::uint64_t> max_relative_shape_id() const;
  // Number of buffers bound: inputs that are not views, plus written outputs.
  std::size_t num_bindings() const;
};

struct FusedProgramHash {
  std::size_t operator()(const FusedProgram& p) const noexcept { return static_cast<std::size_t>(p.structural_hash()); }
};

// The optimization a cubecl-style fuser finishes.
class FusedOptimization final : public Optimization {
 public:
  FusedOptimization(FusedProgram program, std::size_t len) : program_(std::move(program)), len_(len) {}

  std::size_t len() const override { return len_; }
  std::string_view name() const override { return program_kind_name(program_.kind); }
  std::optional<std::uint64_t> max_relative_shape_id() const override { return program_.max_relative_shape_id(); }
  std::string describe() const override { return program_.to_string(); }
  const FusedProgram& program() const { return program_; }

 private:
  FusedProgram program_;
  std::size_t len_;
};

}  // namespace kiln::fusion
