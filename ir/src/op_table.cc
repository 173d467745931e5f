#include "kiln/ir/op_table.h"

#include <array>

namespace kiln::ir {
namespace {

constexpr std::array<OpInfo, kNumOpKinds> kOps = {{
#define KILN_OP(group, variant, sig, tags) \
  OpInfo{OpKind::group##_##variant, OpGroup::group, #variant, Signature::sig, tags},
#include "kiln/ir/op_table.def"
#undef KILN_OP
}};

constexpr int V = kVariadic;
// name, min_in, max_in, min_out, max_out, min_scalars, max_scalars, min_attrs, max_attrs, ranges
constexpr SignatureInfo kSignatures[] = {
    {"Unary", 1, 1, 1, 1, 0, 0, 0, 0, false},
    {"Binary", 2, 2, 1, 1, 0, 0, 0, 0, false},
    {"Scalar", 1, 1, 1, 1, 1, 1, 0, 0, false},
    {"Matmul", 2, 2, 1, 1, 0, 0, 0, 0, false},
    {"Cast", 1, 1, 1, 1, 0, 0, 0, 0, false},
    {"Reduce", 1, 1, 1, 1, 0, 0, 0, 0, false},
    {"ReduceDim", 1, 1, 1, 1, 0, 0, 2, 2, false},
    {"Dim", 1, 1, 1, 1, 0, 0, 1, 1, false},
    {"ShapeOp", 1, 1, 1, 1, 0, 0, 0, 0, false},
    {"SwapDims", 1, 1, 1, 1, 0, 0, 2, 2, false},
    {"Permute", 1, 1, 1, 1, 0, 0, 0, V, false},
    {"Flip", 1, 1, 1, 1, 0, 0, 0, V, false},
    {"Creation", 0, 0, 1, 1, 0, 0, 0, 0, false},
    {"Full", 0, 0, 1, 1, 1, 1, 0, 0, false},
    {"Random", 0, 0, 1, 1, 0, 0, 3, 3, false},
    {"Init", 0, 0, 1, 1, 0, 0, 0, 0, false},
    {"Gather", 2, 2, 1, 1, 0, 0, 1, 1, false},
    {"Scatter", 3, 3, 1, 1, 0, 0, 2, 2, false},
    {"Select", 2, 2, 1, 1, 0, 0, 1, 1, false},
    {"SelectAssign", 3, 3, 1, 1, 0, 0, 2, 2, false},
    {"Slice", 1, 1, 1, 1, 0, 0, 0, 0, true},
    {"SliceAssign", 2, 2, 1, 1, 0, 0, 0, 0, true},
    {"MaskWhere", 3, 3, 1, 1, 0, 0, 0, 0, false},
    {"MaskFill", 2, 2, 1, 1, 1, 1, 0, 0, false},
    {"Clamp", 1, 1, 1, 1, 2, 2, 0, 0, false},
    {"RepeatDim", 1, 1, 1, 1, 0, 0, 2, 2, false},
    {"Cat", 1, V, 1, 1, 0, 0, 1, 1, false},
    {"ReduceDimWithIndices", 1, 1, 2, 2, 0, 0, 1, 1, false},
    {"TopKWithIndices", 1, 1, 2, 2, 0, 0, 2, 2, false},
    {"Sort", 1, 1, 1, 1, 0, 0, 2, 2, false},
    {"SortWithIndices", 1, 1, 2, 2, 0, 0, 2, 2, false},
    {"Unfold", 1, 1, 1, 1, 0, 0, 3, 3, false},
    {"ScatterNd", 3, 3, 1, 1, 0, 0, 1, 1, false},
    {"Cross", 2, 2, 1, 1, 0, 0, 1, 1, false},
    {"HardSigmoid", 1, 1, 1, 1, 2, 2, 0, 0, false},
    {"GatherNd", 2, 2, 1, 1, 0, 0, 0, 0, false},
    {"Conv", 2, 3, 1, 1, 0, 0, 4, 10, false},
    {"ConvTranspose", 2, 3, 1, 1, 0, 0, 5, 13, false},
    {"MaxPool2d", 1, 1, 1, 1, 0, 0, 9, 9, false},
    {"AvgPool2d", 1, 1, 1, 1, 0, 0, 8, 8, false},
    {"Embedding", 2, 2, 1, 1, 0, 0, 0, 0, false},
    {"Pad", 1, 1, 1, 1, 0, 1, 1, V, false},
    {"AllReduce", 1, 1, 1, 1, 0, 0, 1, V, false},
    {"SyncCollective", 0, 0, 0, 0, 0, 0, 0, 0, false},
    {"Custom", 0, V, 0, V, 0, V, 0, 0, false},
    {"Linear", 2, 3, 1, 1, 0, 0, 0, 0, false},
    {"LinearBackward", 2, 2, 1, 1, 0, 0, 0, 0, false},
    {"LinearBiasBackward", 1, 1, 1, 1, 0, 0, 0, 0, false},
    {"LayerNorm", 2, 3, 1, 3, 0, 0, 1, 1, false},  // 1 or 3 outputs: out, or out, mean, rstd (K)
    {"BatchNorm", 5, 5, 1, 1, 1, 1, 0, 0, false},
    {"EmbeddingBackward", 3, 3, 1, 1, 0, 0, 0, 0, false},
    {"ConvBackward", 3, 3, 1, 1, 0, 0, 4, 10, false},
    {"ConvTransposeBackward", 3, 3, 1, 1, 0, 0, 5, 13, false},
    {"ConvBiasBackward", 3, 3, 1, 1, 0, 0, 0, 0, false},
    {"MaxPool", 1, 1, 1, 1, 0, 0, 5, 9, false},
    {"MaxPoolWithIndices", 1, 1, 2, 2, 0, 0, 5, 9, false},
    {"MaxPoolWithIndicesBackward", 3, 3, 1, 1, 0, 0, 5, 9, false},
    {"AvgPool", 1, 1, 1, 1, 0, 0, 5, 8, false},
    {"AvgPoolBackward", 2, 2, 1, 1, 0, 0, 5, 8, false},
    {"AdaptiveAvgPool", 1, 1, 1, 1, 0, 0, 1, 3, false},
    {"AdaptiveAvgPoolBackward", 2, 2, 1, 1, 0, 0, 0, 0, false},
    {"GridSample2d", 2, 2, 1, 1, 0, 0, 3, 3, false},
    {"Interpolate", 1, 1, 1, 1, 0, 0, 4, 4, false},
    {"InterpolateBackward", 2, 2, 1, 1, 0, 0, 4, 4, false},
    {"Unfold4d", 1, 1, 1, 1, 0, 0, 8, 8, false},
    {"Rfft", 1, 1, 2, 2, 0, 0, 2, 2, false},
    {"IRfft", 2, 2, 1, 1, 0, 0, 2, 2, false},
    {"Attention", 3, 5, 1, 1, 0, 0, 4, 4, false},
    {"CtcLoss", 4, 4, 1, 1, 0, 0, 1, 1, false},
    {"CtcLossBackward", 5, 5, 1, 1, 0, 0, 1, 1, false},
    {"DeformableConv2d", 3, 5, 1, 1, 0, 0, 9, 9, false},
    {"DeformableConv2dBackward", 4, 6, 3, 5, 0, 0, 9, 9, false},
    {"Quantize", 2, 3, 1, 1, 0, 0, 0, 0, false},
    {"Broadcast", 1, 1, 1, 1, 0, 0, 1, V, false},
    {"AllGather", 1, 1, 1, 1, 0, 0, 2, V, false},
    {"ReduceScatter", 1, 1, 1, 1, 0, 0, 3, V, false},
    {"Drop", 1, 1, 0, 0, 0, 0, 0, 0, false},
};
static_assert(std::size(kSignatures) == static_cast<std::size_t>(Signature::Drop) + 1);

constexpr std::string_view kFamilyNames[kNumFamilies] = {
    "BaseFloat", "BaseInt", "BaseBool", "NumericFloat", "NumericInt", "Bool",        "Int",
    "Float",     "Module",  "Init",     "Custom",       "Drop",       "Distributed", "Activation"};

}  // namespace

const OpInfo& op_info(OpKind k) { return kOps[static_cast<std::size_t>(k)]; }

const SignatureInfo& signature_info(Signature s) { return kSignatures[static_cast<std::size_t>(s)]; }

std::string_view family_name(Family f) { return kFamilyNames[static_cast<std::size_t>(f)]; }

std::optional<Family> parse_family(std::string_view name) {
  for (int i = 0; i < kNumFamilies; ++i)
    if (kFamilyNames[i] == name) return static_cast<Family>(i);
  return std::nullopt;
}

bool group_admits(OpGroup g, Family f) {
  switch (g) {
    case OpGroup::Base: return f == Family::BaseFloat || f == Family::BaseInt || f == Family::BaseBool;
    case OpGroup::Numeric: return f == Family::NumericFloat || f == Family::NumericInt;
    case OpGroup::Float: return f == Family::Float;
    case OpGroup::Int: return f == Family::Int;
    case OpGroup::Bool: return f == Family::Bool;
    case OpGroup::Module: return f == Family::Module;
    case OpGroup::Init: return f == Family::Init;
    case OpGroup::Custom: return f == Family::Custom;
    case OpGroup::Drop: return f == Family::Drop;
    case OpGroup::Distributed: return f == Family::Distributed;
    case OpGroup::Activation: return f == Family::Activation;
  }
  return false;
}

std::optional<OpGroup> group_of_family(Family f) {
  switch (f) {
    case Family::BaseFloat:
    case Family::BaseInt:
    case Family::BaseBool: return OpGroup::Base;
    case Family::NumericFloat:
    case Family::NumericInt: return OpGroup::Numeric;
    case Family::Float: return OpGroup::Float;
    case Family::Int: return OpGroup::Int;
    case Family::Bool: return OpGroup::Bool;
    case Family::Module: return OpGroup::Module;
    case Family::Init: return OpGroup::Init;
    case Family::Custom: return OpGroup::Custom;
    case Family::Drop: return OpGroup::Drop;
    case Family::Distributed: return OpGroup::Distributed;
    case Family::Activation: return OpGroup::Activation;
  }
  return std::nullopt;
}

std::optional<OpKind> find_op_kind(OpGroup group, std::string_view variant) {
  for (const OpInfo& info : kOps)
    if (info.group == group && info.variant == variant) return info.kind;
  return std::nullopt;
}

Family base_family_for(DType d) {
  if (d.is_bool()) return Family::BaseBool;
  if (d.is_integral()) return Family::BaseInt;
  return Family::BaseFloat;
}

std::optional<Family> numeric_family_for(DType d) {
  if (d.is_integral()) return Family::NumericInt;
  if (d.is_float() || d.is_quantized()) return Family::NumericFloat;
  return std::nullopt;
}

}  // namespace kiln::ir
