// Operation: one IR operation as plain data (docs/spec/ir.md §5), with equality and hashing fit for the
// plan index (docs/spec/fusion.md §3.8).
//
// Every operation has the same flat layout, whatever its kind:
//   tensors  inputs then outputs, in the argument struct's field order (docs/spec/ir.md §5.2), so that
//            nodes(op) == tensors and relativization visits them in the normative order;
//   scalars  every ScalarIr field in field order (relativized into placeholders);
//   ranges   the slice ranges of Slice / SliceAssign (relativized into placeholders);
//   attrs    every other field, as i64, compared verbatim (layouts in op_table.h).
// The op table decides how many of each a kind carries; Operation::validate checks it.
#pragma once

#include <boost/container/small_vector.hpp>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kiln/base/result.h"
#include "kiln/ir/op_table.h"
#include "kiln/ir/scalar.h"
#include "kiln/ir/tensor.h"

namespace kiln::ir {

using TensorList = boost::container::small_vector<TensorIr, 3>;
using ScalarList = boost::container::small_vector<ScalarIr, 2>;
using RangeList = boost::container::small_vector<Slice, 2>;
using AttrList = boost::container::small_vector<std::int64_t, 2>;

// Random distributions (attribute 0 of a Random op).
enum class Distribution : std::int64_t { Default = 0, Bernoulli = 1, Uniform = 2, Normal = 3 };
// Update rule of Scatter / SelectAssign (attribute 1).
enum class IndexingUpdate : std::int64_t { Assign = 0, Add = 1, Mul = 2, Min = 3, Max = 4 };
// AllReduce operation (attribute 0).
// Sum and Mean are the IR's (docs/spec/ir.md §5.2); Min, Max and Prod are a kiln extension
// (docs/decisions.md, collectives between daemons).
enum class ReduceOperation : std::int64_t { Sum = 0, Mean = 1, Min = 2, Max = 3, Prod = 4 };
const char* reduce_operation_name(ReduceOperation op);
// The operation an attribute names, or nothing for a value past the enum (an untrusted op's).
std::optional<ReduceOperation> reduce_operation_of(std::int64_t attr);
// Pad mode (attribute 0).
enum class PadMode : std::int64_t { Constant = 0, Reflect = 1, Edge = 2 };
// Interpolation mode of Interpolate / InterpolateBackward (attribute 2) and GridSample2d
// (attribute 0), in docs/spec/ir.md §5.8's order; GridSample2d takes Nearest, Bilinear, Bicubic.
enum class InterpolateMode : std::int64_t { Nearest = 0, NearestExact = 1, Bilinear = 2, Bicubic = 3, Lanczos3 = 4 };
// What GridSample2d reads outside the input (attribute 1): Burn's GridSamplePaddingMode.
enum class GridSamplePaddingMode : std::int64_t { Zeros = 0, Border = 1, Reflection = 2 };
// Presence bits: which optional arguments an op carries where its input count cannot tell (two
// optional tensors; optional f64 options, whose attribute is 0 when absent). Attribute 0 of
// Attention, DeformableConv2d and DeformableConv2dBackward (op_table.h).
inline constexpr std::int64_t kPresentMask = 1;     // mask? is an input (and mask_grad? an output)
inline constexpr std::int64_t kPresentBias = 2;     // attn_bias? / bias? is an input, after mask?
inline constexpr std::int64_t kPresentScale = 4;    // an f64 scale is given
inline constexpr std::int64_t kPresentSoftcap = 8;  // an f64 softcap is given

struct Operation {
  OpKind kind = OpKind::Drop_Drop;
  Family family = Family::Drop;
  DType dtype;                  // carried dtype (NumericFloat / NumericInt / Float); f32 otherwise
  std::uint8_t num_inputs = 0;  // tensors[0 .. num_inputs) are inputs, the rest outputs
  TensorList tensors;
  ScalarList scalars;
  RangeList ranges;
  AttrList attrs;
  std::string custom_id;  // Custom only

  const OpInfo& info() const { return op_info(kind); }
  std::span<const TensorIr> inputs() const { return {tensors.data(), num_inputs}; }
  std::span<TensorIr> inputs() { return {tensors.data(), num_inputs}; }
  std::span<const TensorIr> outputs() const { return {tensors.data() + num_inputs, tensors.size() - num_inputs}; }
  std::span<TensorIr> outputs() { return {tensors.data() + num_inputs, tensors.size() - num_inputs}; }
  // nodes(op) = inputs then outputs.
  std::span<const TensorIr> nodes() const { return {tensors.data(), tensors.size()}; }

  bool is_drop() const { return kind == OpKind::Drop_Drop; }
  bool is_init() const { return kind == OpKind::Init_Init; }

  // "NumericFloat::MulScalar", "Drop", "Custom", "Init::InitOperationIr" (docs/spec/fusion.md §17.4).
  std::string kind_name() const;
  // One line: kind, inputs -> outputs, scalars, attributes.
  std::string to_string() const;

  // Structural check against the op table: family admitted by the kind's group, argument
  // counts, carried dtype. Returns an error naming the op and what is wrong.
  Status validate() const;

  // mark_read_only(ids) (docs/spec/ir.md §5.1): inputs whose id is listed and whose status is ReadWrite
  // become ReadOnly; returns the original occurrences changed. Init never changes.
  std::vector<TensorIr> mark_read_only(std::span<const TensorId> ids);

  friend bool operator==(const Operation&, const Operation&);
};

// Hash consistent with operator== (floats by bit pattern; Random hashes only its output tensor
// and the kind of distribution, docs/spec/fusion.md §3.8).
std::uint64_t hash_operation(const Operation& op);
std::uint64_t hash_tensor(const TensorIr& t);

struct OperationHash {
  std::size_t operator()(const Operation& op) const noexcept { return static_cast<std::size_t>(hash_operation(op)); }
};

// Tensor lists as the logs print them: "t1:f32[64,64], t2:f32[64,64]".
std::string format_tensors(std::span<const TensorIr> ts);

}  // namespace kiln::ir
