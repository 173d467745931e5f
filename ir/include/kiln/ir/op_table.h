// The operation table (op_table.def) turned into enums and lookups: families, kinds,
// signatures and tags. Everything that needs to know about an operation kind asks here.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "kiln/ir/dtype.h"

namespace kiln::ir {

// The outer variant of an operation (docs/spec/fusion.md §17.4). Base* and Numeric* say which tensor kind
// the op is applied to; NumericFloat, NumericInt and Float also carry a DType.
enum class Family : std::uint8_t {
  BaseFloat,
  BaseInt,
  BaseBool,
  NumericFloat,
  NumericInt,
  Bool,
  Int,
  Float,
  Module,
  Init,
  Custom,
  Drop,
  Distributed,
  Activation,
};
inline constexpr int kNumFamilies = 14;
std::string_view family_name(Family f);
std::optional<Family> parse_family(std::string_view name);
// Whether the family carries a DType (NumericFloat, NumericInt, Float).
constexpr bool family_carries_dtype(Family f) {
  return f == Family::NumericFloat || f == Family::NumericInt || f == Family::Float;
}

// The group a table row belongs to; a group admits one or more families.
enum class OpGroup : std::uint8_t {
  Base,
  Numeric,
  Float,
  Int,
  Bool,
  Module,
  Init,
  Custom,
  Drop,
  Distributed,
  Activation,
};
bool group_admits(OpGroup g, Family f);

// Argument structs (docs/spec/ir.md §5.2). Attribute layouts (all attributes are i64, compared verbatim):
//   ReduceDim [axis, accumulator_len]        Dim [axis]            SwapDims [dim1, dim2]
//     (TopK / ArgTopK: accumulator_len = k, 1 <= k <= the axis' size)
//   Permute, Flip [axes...]                  Gather, Select [dim]  Scatter, SelectAssign [dim, update]
//   RepeatDim [dim, times]                   Cat [dim]             ReduceDimWithIndices [dim]
//   TopKWithIndices [dim, k]                 Random [distribution, bits(param0), bits(param1)]
//   Sort, SortWithIndices [dim, descending (0 or 1)]
//   Unfold [dim, size, step]                 ScatterNd [reduction (an IndexingUpdate)]
//   Cross [dim]                              HardSigmoid: no attributes (scalars alpha, beta)
//   Conv, ConvBackward (n = 1..3 spatial dims, the kind's: Conv1d ... Conv3dWeightBackward)
//     [stride_0..n-1, padding_0..n-1, dilation_0..n-1, groups] (3n + 1; Conv2d: [s0, s1, p0, p1,
//     d0, d1, groups])
//   ConvTranspose, ConvTransposeBackward
//     [stride_0..n-1, padding_0..n-1, padding_out_0..n-1, dilation_0..n-1, groups] (4n + 1;
//     ConvTranspose1d: [stride, padding, padding_out, dilation, groups])
//   ConvBiasBackward: no attributes (all six conv / transposed conv bias gradients)
//   MaxPool2d [k0, k1, stride0, stride1, pad0, pad1, dilation0, dilation1, ceil_mode]
//   AvgPool2d [k0, k1, stride0, stride1, pad0, pad1, count_include_pad, ceil_mode]
//   Pad [mode, before0, after0, before1, after1, ...]  (scalar: the constant, mode Constant only)
//   AllReduce [reduce_op, device ids packed as (type << 16 | index)...]
//   Broadcast [root, device ids...]  (root: a rank, below the number of ids when they are named)
//   AllGather [dim, device ids...]  (at least one id: the world, whose size scales dim)
//   ReduceScatter [reduce_op, dim, device ids...]  (at least one id; dim's size divisible by them)
//   LayerNorm [bits(epsilon)]  (the f64 bit pattern: LayerNorm's epsilon is kept verbatim, never
//     relativized, docs/spec/fusion.md §3.6; BatchNorm's is its one scalar, which is)
//   Linear, LayerNorm: the optional bias / beta is present when the op has 3 inputs.
//   Pools of n spatial dims (n = 1, 2 or 3, implied by the kind: build::pool_spatial_dims):
//     MaxPool, MaxPoolWithIndices, MaxPoolWithIndicesBackward
//       [k0.., stride0.., pad0.., dilation0.., ceil_mode]  (4n + 1; MaxPool2d's layout for n = 2)
//     AvgPool, AvgPoolBackward [k0.., stride0.., pad0.., count_include_pad, ceil_mode]  (3n + 2)
//     AdaptiveAvgPool [output_size0..] (n); AdaptiveAvgPoolBackward: none (the grad's shape says)
//   GridSample2d [mode (an InterpolateMode), padding_mode (a GridSamplePaddingMode), align_corners]
//   Interpolate, InterpolateBackward [out_h, out_w, mode (an InterpolateMode), align_corners]
//   Unfold4d [k0, k1, stride0, stride1, pad0, pad1, dilation0, dilation1]
//   Rfft, IRfft [dim, n]  (n = 0: none given, the dim's length decides; a given n is at least 1)
//   Attention [present, is_causal, bits(scale), bits(softcap)]  (present: kPresentMask |
//     kPresentBias for the optional inputs mask?, attn_bias?, in that order after query, key, value;
//     kPresentScale / kPresentSoftcap when the f64 in attribute 2 / 3 is given, else it is 0)
//   CtcLoss, CtcLossBackward [blank]
//   Quantize: no attributes (inputs tensor, scales, global?: the optional one told by the count;
//     the scheme is the output's QFloat dtype). Dequantize has the Cast signature.
//   DeformableConv2d, DeformableConv2dBackward [present, stride0, stride1, pad0, pad1, dilation0,
//     dilation1, weight_groups, offset_groups]  (present: kPresentMask | kPresentBias for mask?,
//     bias? after x, offset, weight; the backward's out_grad follows them, and its outputs are
//     input_grad, offset_grad, weight_grad, then mask_grad? and bias_grad? as present)
enum class Signature : std::uint8_t {
  Unary,
  Binary,
  Scalar,
  Matmul,
  Cast,
  Reduce,
  ReduceDim,
  Dim,
  ShapeOp,
  SwapDims,
  Permute,
  Flip,
  Creation,
  Full,
  Random,
  Init,
  Gather,
  Scatter,
  Select,
  SelectAssign,
  Slice,
  SliceAssign,
  MaskWhere,
  MaskFill,
  Clamp,
  RepeatDim,
  Cat,
  ReduceDimWithIndices,
  TopKWithIndices,
  Sort,
  SortWithIndices,
  Unfold,
  ScatterNd,
  Cross,
  HardSigmoid,
  GatherNd,
  Conv,
  ConvTranspose,
  MaxPool2d,
  AvgPool2d,
  Embedding,
  Pad,
  AllReduce,
  SyncCollective,
  Custom,
  Linear,
  LinearBackward,
  LinearBiasBackward,
  LayerNorm,
  BatchNorm,
  EmbeddingBackward,
  ConvBackward,
  ConvTransposeBackward,
  ConvBiasBackward,
  MaxPool,
  MaxPoolWithIndices,
  MaxPoolWithIndicesBackward,
  AvgPool,
  AvgPoolBackward,
  AdaptiveAvgPool,
  AdaptiveAvgPoolBackward,
  GridSample2d,
  Interpolate,
  InterpolateBackward,
  Unfold4d,
  Rfft,
  IRfft,
  Attention,
  CtcLoss,
  CtcLossBackward,
  DeformableConv2d,
  DeformableConv2dBackward,
  Quantize,
  Broadcast,
  AllGather,
  ReduceScatter,
  Drop,
};

// How many of each argument a signature carries; kVariadic = any number.
inline constexpr int kVariadic = -1;
struct SignatureInfo {
  std::string_view name;
  int min_inputs, max_inputs;    // max_inputs may be kVariadic
  int min_outputs, max_outputs;  // max_outputs may be kVariadic (Custom); a range where optional
                                 // outputs exist (DeformableConv2dBackward's mask_grad?, bias_grad?)
  int min_scalars, max_scalars;  // max may be kVariadic
  int min_attrs, max_attrs;      // max may be kVariadic
  bool ranges;                   // carries slice ranges (one per leading dim, at most rank)
};
const SignatureInfo& signature_info(Signature s);

// Tags (docs/spec/ir.md §5.3) plus facts asked by fusers and executors.
using OpTags = std::uint32_t;
inline constexpr OpTags kNone = 0;
inline constexpr OpTags kElementwise = 1u << 0;    // E: fusable by the elementwise trace fuser
inline constexpr OpTags kFusableView = 1u << 1;    // E°: fusable only as a view read
inline constexpr OpTags kReduceDim = 1u << 2;      // R: dim reduction, Reduce fusers
inline constexpr OpTags kFullReduce = 1u << 3;     // r: whole-tensor reduction, never fused
inline constexpr OpTags kMatmul = 1u << 4;         // M: head of a Matmul fusion
inline constexpr OpTags kView = 1u << 5;           // V: layout / view op
inline constexpr OpTags kInit = 1u << 6;           // I: creation
inline constexpr OpTags kNhwc = 1u << 7;           // N: NHWC relayout target
inline constexpr OpTags kModule = 1u << 8;         // Mod
inline constexpr OpTags kDrop = 1u << 9;           // D
inline constexpr OpTags kCustom = 1u << 10;        // C
inline constexpr OpTags kDistributed = 1u << 11;   // X
inline constexpr OpTags kComparison = 1u << 12;    // output dtype is the bool dtype
inline constexpr OpTags kIndexed = 1u << 13;       // reads tensor inputs through indexed reads
inline constexpr OpTags kIndexOutput = 1u << 14;   // output dtype is the index (int) dtype
inline constexpr OpTags kQuantization = 1u << 15;  // Q: reads or writes QFloat tensors (Quantize, Dequantize)

enum class OpKind : std::uint16_t {
#define KILN_OP(group, variant, sig, tags) group##_##variant,
#include "kiln/ir/op_table.def"
#undef KILN_OP
};
// NOLINTBEGIN(bugprone-macro-parentheses): a term of the sum, not an expression of its own
inline constexpr int kNumOpKinds = 0
#define KILN_OP(group, variant, sig, tags) +1
#include "kiln/ir/op_table.def"
#undef KILN_OP
    // NOLINTEND(bugprone-macro-parentheses)
    ;

struct OpInfo {
  OpKind kind;
  OpGroup group;
  std::string_view variant;  // "Add", "MulScalar", ...
  Signature signature;
  OpTags tags;
  constexpr bool has(OpTags t) const { return (tags & t) == t; }
};
const OpInfo& op_info(OpKind k);

// Looks a kind up by group and variant name ("Numeric", "Add").
std::optional<OpKind> find_op_kind(OpGroup group, std::string_view variant);
// The group a family belongs to for table look-ups (BaseFloat -> Base, NumericInt -> Numeric ...).
std::optional<OpGroup> group_of_family(Family f);

// The Base* / Numeric* family that applies an op to tensors of this dtype.
Family base_family_for(DType d);
std::optional<Family> numeric_family_for(DType d);

}  // namespace kiln::ir
