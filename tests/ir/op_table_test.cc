// The op table (op_table.def / op_table.h) and Operation: kind names, tensor formatting,
// validate(), equality and hashing (docs/spec/fusion.md §3.8, §17.4-§17.5), mark_read_only (docs/spec/ir.md §5.1).
#include "kiln/ir/op_table.h"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "kiln/ir/builders.h"
#include "kiln/ir/operation.h"
#include "kiln/testing/status.h"

namespace kiln {
inline void PrintTo(ErrorCode c, std::ostream* os) { *os << error_code_name(c); }
}  // namespace kiln

namespace kiln::ir {
inline void PrintTo(const TensorIr& t, std::ostream* os) { *os << t.to_string() << "/" << status_name(t.status); }

namespace {

TensorIr t(std::uint64_t id, Shape shape, DType dtype = dtypes::f32, TensorStatus status = TensorStatus::ReadOnly) {
  return TensorIr{TensorId{id}, std::move(shape), status, dtype};
}

Operation built(Result<Operation> r) {
  EXPECT_TRUE(r.ok()) << r.error().to_string();
  return r.ok() ? std::move(r).value() : Operation{};
}

Operation add_op(std::uint64_t lhs = 1, std::uint64_t rhs = 2, std::uint64_t out = 3,
                 TensorStatus status = TensorStatus::ReadOnly) {
  return built(build::binary(Family::NumericFloat, OpKind::Numeric_Add, t(lhs, {2, 3}, dtypes::f32, status),
                             t(rhs, {2, 3}, dtypes::f32, status), TensorId{out}));
}

Operation mul_scalar_op(ScalarIr s) {
  return built(build::scalar(Family::NumericFloat, OpKind::Numeric_MulScalar, t(1, {4}), s, TensorId{2}));
}

Operation random_op(build::DistributionIr d) {
  return built(build::random(Family::Float, OpKind::Float_Random, {2, 2}, dtypes::f32, d, TensorId{9}));
}

// Every kind, in table order.
std::vector<OpKind> all_kinds() {
  std::vector<OpKind> kinds;
  for (int i = 0; i < kNumOpKinds; ++i) kinds.push_back(static_cast<OpKind>(i));
  return kinds;
}

// Expects validate() to fail; returns the error code (Internal when it passed).
ErrorCode expect_invalid(const Operation& op) {
  Status st = op.validate();
  EXPECT_FALSE(st.ok()) << op.to_string() << " passed validate()";
  return st.ok() ? ErrorCode::Internal : st.error().code;
}

// ---- The table

TEST(OpTable, EveryKindHasAValidSignatureAndUniqueName) {
  std::set<std::pair<OpGroup, std::string_view>> seen;
  for (OpKind k : all_kinds()) {
    const OpInfo& info = op_info(k);
    EXPECT_EQ(info.kind, k);
    EXPECT_FALSE(info.variant.empty());
    EXPECT_LE(static_cast<int>(info.signature), static_cast<int>(Signature::Drop)) << info.variant;
    const SignatureInfo& sig = signature_info(info.signature);
    EXPECT_FALSE(sig.name.empty());
    EXPECT_GE(sig.min_inputs, 0) << sig.name;
    if (sig.max_inputs != kVariadic) {
      EXPECT_LE(sig.min_inputs, sig.max_inputs) << sig.name;
    }
    if (sig.max_scalars != kVariadic) {
      EXPECT_LE(sig.min_scalars, sig.max_scalars) << sig.name;
    }
    if (sig.max_attrs != kVariadic) {
      EXPECT_LE(sig.min_attrs, sig.max_attrs) << sig.name;
    }
    EXPECT_GE(sig.min_outputs, 0) << sig.name;
    if (sig.max_outputs != kVariadic) {
      EXPECT_LE(sig.min_outputs, sig.max_outputs) << sig.name;
    }
    EXPECT_TRUE(seen.insert({info.group, info.variant}).second) << "duplicate " << info.variant;
    // find_op_kind is the inverse of the table.
    auto found = find_op_kind(info.group, info.variant);
    ASSERT_TRUE(found.has_value()) << info.variant;
    EXPECT_EQ(*found, k);
  }
  EXPECT_EQ(seen.size(), static_cast<std::size_t>(kNumOpKinds));
  EXPECT_FALSE(find_op_kind(OpGroup::Float, "Add").has_value());
}

TEST(OpTable, SignatureNamesMatchTheEnum) {
  EXPECT_EQ(signature_info(Signature::Unary).name, "Unary");
  EXPECT_EQ(signature_info(Signature::Conv).name, "Conv");
  EXPECT_EQ(signature_info(Signature::Drop).name, "Drop");
  EXPECT_EQ(signature_info(Signature::Sort).name, "Sort");
  EXPECT_EQ(signature_info(Signature::SortWithIndices).name, "SortWithIndices");
  EXPECT_EQ(signature_info(Signature::SortWithIndices).min_outputs, 2);
  EXPECT_EQ(signature_info(Signature::SortWithIndices).max_outputs, 2);
  EXPECT_EQ(signature_info(Signature::Sort).max_attrs, 2);
  EXPECT_EQ(signature_info(Signature::Unfold).name, "Unfold");
  EXPECT_EQ(signature_info(Signature::Unfold).min_attrs, 3);
  EXPECT_EQ(signature_info(Signature::Unfold).max_attrs, 3);
  EXPECT_EQ(signature_info(Signature::ScatterNd).name, "ScatterNd");
  EXPECT_EQ(signature_info(Signature::ScatterNd).min_inputs, 3);
  EXPECT_EQ(signature_info(Signature::ScatterNd).max_attrs, 1);
  EXPECT_EQ(signature_info(Signature::Cross).name, "Cross");
  EXPECT_EQ(signature_info(Signature::Cross).max_inputs, 2);
  EXPECT_EQ(signature_info(Signature::Cross).max_outputs, 1);
  EXPECT_EQ(signature_info(Signature::Cross).max_attrs, 1);
  EXPECT_EQ(signature_info(Signature::HardSigmoid).name, "HardSigmoid");
  EXPECT_EQ(signature_info(Signature::HardSigmoid).min_scalars, 2);
  EXPECT_EQ(signature_info(Signature::HardSigmoid).max_scalars, 2);
  EXPECT_EQ(signature_info(Signature::HardSigmoid).max_attrs, 0);
  EXPECT_TRUE(signature_info(Signature::Slice).ranges);
  EXPECT_TRUE(signature_info(Signature::SliceAssign).ranges);
  EXPECT_FALSE(signature_info(Signature::Binary).ranges);
}

TEST(OpTable, FamiliesAndGroups) {
  for (int i = 0; i < kNumFamilies; ++i) {
    const auto f = static_cast<Family>(i);
    EXPECT_EQ(parse_family(family_name(f)), f);
    const auto g = group_of_family(f);
    ASSERT_TRUE(g.has_value()) << family_name(f);
    EXPECT_TRUE(group_admits(*g, f)) << family_name(f);
  }
  // docs/spec/ir.md §5.9: the Activation family has its own group, which admits nothing else.
  EXPECT_EQ(group_of_family(Family::Activation), OpGroup::Activation);
  EXPECT_FALSE(group_admits(OpGroup::Activation, Family::Float));
  EXPECT_FALSE(group_admits(OpGroup::Float, Family::Activation));
  EXPECT_FALSE(family_carries_dtype(Family::Activation));
  EXPECT_FALSE(parse_family("Nope").has_value());
  EXPECT_TRUE(family_carries_dtype(Family::NumericInt));
  EXPECT_TRUE(family_carries_dtype(Family::Float));
  EXPECT_FALSE(family_carries_dtype(Family::BaseFloat));
  EXPECT_FALSE(family_carries_dtype(Family::Int));
  EXPECT_FALSE(group_admits(OpGroup::Numeric, Family::Float));
  EXPECT_EQ(base_family_for(dtypes::i8), Family::BaseInt);
  EXPECT_EQ(base_family_for(dtypes::boolean), Family::BaseBool);
  EXPECT_EQ(base_family_for(dtypes::bf16), Family::BaseFloat);
  EXPECT_EQ(numeric_family_for(dtypes::u16), Family::NumericInt);
  EXPECT_FALSE(numeric_family_for(dtypes::boolean).has_value());
}

TEST(OpTable, Tags) {
  EXPECT_TRUE(op_info(OpKind::Numeric_Add).has(kElementwise));
  EXPECT_TRUE(op_info(OpKind::Base_Reshape).has(kView | kFusableView));
  EXPECT_TRUE(op_info(OpKind::Numeric_ArgMax).has(kReduceDim | kIndexOutput));
  EXPECT_TRUE(op_info(OpKind::Float_Matmul).has(kMatmul));
  EXPECT_FALSE(op_info(OpKind::Int_Matmul).has(kMatmul));
  EXPECT_TRUE(op_info(OpKind::Module_MaxPool2d).has(kNhwc));
  EXPECT_TRUE(op_info(OpKind::Base_Cat).has(kIndexed));
  // docs/spec/ir.md §5.6: the trigonometric kinds, ArcTan2 and Hypot are · (not fused).
  EXPECT_EQ(op_info(OpKind::Float_ArcCosh).tags, kNone);
  EXPECT_EQ(op_info(OpKind::Float_ArcCosh).signature, Signature::Unary);
  EXPECT_EQ(op_info(OpKind::Float_Hypot).tags, kNone);
  EXPECT_EQ(op_info(OpKind::Float_ArcTan2).signature, Signature::Binary);
  EXPECT_EQ(find_op_kind(OpGroup::Float, "ArcTan2"), OpKind::Float_ArcTan2);
  // docs/spec/ir.md §5.5: TopK / ArgTopK are ReduceDim kinds tagged · (ArgTopK outputs indices);
  // Sort / ArgSort share the Sort signature, SortWithIndices has two outputs.
  EXPECT_EQ(op_info(OpKind::Numeric_TopK).signature, Signature::ReduceDim);
  EXPECT_EQ(op_info(OpKind::Numeric_TopK).tags, kNone);
  EXPECT_EQ(op_info(OpKind::Numeric_ArgTopK).tags, kIndexOutput);
  EXPECT_EQ(op_info(OpKind::Numeric_Sort).signature, Signature::Sort);
  EXPECT_EQ(op_info(OpKind::Numeric_ArgSort).signature, Signature::Sort);
  EXPECT_EQ(op_info(OpKind::Numeric_ArgSort).tags, kIndexOutput);
  EXPECT_EQ(op_info(OpKind::Numeric_SortWithIndices).signature, Signature::SortWithIndices);
  // docs/spec/ir.md §5.4, §5.6: Unfold is a view op (V), ScatterNd and Cross are ·.
  EXPECT_EQ(op_info(OpKind::Base_Unfold).tags, kView);
  EXPECT_EQ(op_info(OpKind::Base_Unfold).signature, Signature::Unfold);
  EXPECT_EQ(op_info(OpKind::Base_ScatterNd).tags, kNone);
  EXPECT_EQ(op_info(OpKind::Base_ScatterNd).signature, Signature::ScatterNd);
  EXPECT_EQ(op_info(OpKind::Float_Cross).tags, kNone);
  EXPECT_EQ(op_info(OpKind::Float_Cross).signature, Signature::Cross);
  EXPECT_EQ(find_op_kind(OpGroup::Base, "ScatterNd"), OpKind::Base_ScatterNd);
  EXPECT_EQ(find_op_kind(OpGroup::Float, "Cross"), OpKind::Float_Cross);
  EXPECT_FALSE(find_op_kind(OpGroup::Float, "Unfold").has_value());
}

// docs/spec/ir.md §5.9: fourteen Activation kinds on the Unary, Binary, Scalar, HardSigmoid and Dim
// signatures, every one tagged · (the fusion client decomposes activations; none fuses).
TEST(OpTable, ActivationKinds) {
  const std::pair<OpKind, Signature> kinds[] = {
      {OpKind::Activation_Relu, Signature::Unary},
      {OpKind::Activation_Gelu, Signature::Unary},
      {OpKind::Activation_Sigmoid, Signature::Unary},
      {OpKind::Activation_LogSigmoid, Signature::Unary},
      {OpKind::Activation_ReluBackward, Signature::Binary},
      {OpKind::Activation_GeluBackward, Signature::Binary},
      {OpKind::Activation_SigmoidBackward, Signature::Binary},
      {OpKind::Activation_LogSigmoidBackward, Signature::Binary},
      {OpKind::Activation_PRelu, Signature::Binary},
      {OpKind::Activation_LeakyRelu, Signature::Scalar},
      {OpKind::Activation_HardSigmoid, Signature::HardSigmoid},
      {OpKind::Activation_Softmax, Signature::Dim},
      {OpKind::Activation_LogSoftmax, Signature::Dim},
      {OpKind::Activation_Softmin, Signature::Dim},
  };
  int in_group = 0;
  for (OpKind k : all_kinds()) in_group += op_info(k).group == OpGroup::Activation ? 1 : 0;
  EXPECT_EQ(in_group, 14);
  for (const auto& [k, sig] : kinds) {
    const OpInfo& info = op_info(k);
    EXPECT_EQ(info.group, OpGroup::Activation) << info.variant;
    EXPECT_EQ(info.signature, sig) << info.variant;
    EXPECT_EQ(info.tags, kNone) << info.variant;
    EXPECT_EQ(find_op_kind(OpGroup::Activation, info.variant), k);
  }
  // Names: "Activation::Relu"; Relu is no Float kind.
  Operation relu;
  relu.kind = OpKind::Activation_Relu;
  relu.family = Family::Activation;
  EXPECT_EQ(relu.kind_name(), "Activation::Relu");
  EXPECT_FALSE(find_op_kind(OpGroup::Float, "Relu").has_value());
}

// docs/spec/ir.md §5.8: the dense layers, norms and EmbeddingBackward are Module kinds tagged Mod;
// the optional bias / beta is told by the input count, LayerNorm's epsilon is an attribute (kept
// verbatim) and BatchNorm's a scalar (relativized), docs/spec/fusion.md §3.6.
TEST(OpTable, DenseLayersNormsAndEmbeddingBackward) {
  for (OpKind k : {OpKind::Module_Linear, OpKind::Module_LinearXBackward, OpKind::Module_LinearWeightBackward,
                   OpKind::Module_LinearBiasBackward, OpKind::Module_LayerNorm, OpKind::Module_BatchNorm,
                   OpKind::Module_EmbeddingBackward}) {
    EXPECT_EQ(op_info(k).group, OpGroup::Module);
    EXPECT_EQ(op_info(k).tags, kModule) << op_info(k).variant;
  }
  EXPECT_EQ(op_info(OpKind::Module_LinearXBackward).signature, Signature::LinearBackward);
  EXPECT_EQ(op_info(OpKind::Module_LinearWeightBackward).signature, Signature::LinearBackward);
  EXPECT_EQ(find_op_kind(OpGroup::Module, "LinearBiasBackward"), OpKind::Module_LinearBiasBackward);
  EXPECT_EQ(signature_info(Signature::Linear).name, "Linear");
  EXPECT_EQ(signature_info(Signature::Linear).min_inputs, 2);
  EXPECT_EQ(signature_info(Signature::Linear).max_inputs, 3);
  EXPECT_EQ(signature_info(Signature::LayerNorm).max_inputs, 3);
  EXPECT_EQ(signature_info(Signature::LayerNorm).max_attrs, 1);
  EXPECT_EQ(signature_info(Signature::LayerNorm).max_scalars, 0);
  EXPECT_EQ(signature_info(Signature::BatchNorm).min_inputs, 5);
  EXPECT_EQ(signature_info(Signature::BatchNorm).min_scalars, 1);
  EXPECT_EQ(signature_info(Signature::EmbeddingBackward).min_inputs, 3);
  EXPECT_EQ(signature_info(Signature::LinearBiasBackward).max_inputs, 1);
  // The counts are enforced by validate(): a Linear without its weight, a LayerNorm without its
  // epsilon, a BatchNorm whose epsilon is missing.
  Operation linear = built(build::linear(t(1, {2, 3}), t(2, {3, 4}), t(3, {4}), TensorId{4}));
  KILN_EXPECT_OK(linear.validate());
  linear.tensors.erase(linear.tensors.begin() + 1, linear.tensors.begin() + 3);
  linear.num_inputs = 1;
  EXPECT_EQ(expect_invalid(linear), ErrorCode::Invalid);
  Operation ln = built(build::layer_norm(t(1, {2, 3}), t(2, {3}), std::nullopt, 1e-5, TensorId{4}));
  ln.attrs.clear();
  EXPECT_EQ(expect_invalid(ln), ErrorCode::Invalid);
  Operation bn = built(build::batch_norm(t(1, {2, 3}), t(2, {3}), t(3, {3}), t(4, {3}), t(5, {3}), 1e-5, TensorId{6}));
  bn.scalars.clear();
  EXPECT_EQ(expect_invalid(bn), ErrorCode::Invalid);
}

// docs/spec/ir.md §5.8: the convolutions of 1..3 spatial dims and their gradients are Module
// kinds tagged Mod, on five rank-generic signatures (3n + 1 or 4n + 1 attributes); there is no
// transposed X gradient. conv_kind_info tells each kind's rank, transposition and role.
TEST(OpTable, ConvolutionKindsAndSignatures) {
  using build::ConvRole;
  struct Row {
    const char* variant;
    Signature sig;
    std::size_t rank;
    bool transposed;
    ConvRole role;
  };
  const Row rows[] = {
      {"Conv1d", Signature::Conv, 1, false, ConvRole::Forward},
      {"Conv2d", Signature::Conv, 2, false, ConvRole::Forward},
      {"Conv3d", Signature::Conv, 3, false, ConvRole::Forward},
      {"Conv1dXBackward", Signature::ConvBackward, 1, false, ConvRole::XBackward},
      {"Conv2dXBackward", Signature::ConvBackward, 2, false, ConvRole::XBackward},
      {"Conv3dXBackward", Signature::ConvBackward, 3, false, ConvRole::XBackward},
      {"Conv1dWeightBackward", Signature::ConvBackward, 1, false, ConvRole::WeightBackward},
      {"Conv2dWeightBackward", Signature::ConvBackward, 2, false, ConvRole::WeightBackward},
      {"Conv3dWeightBackward", Signature::ConvBackward, 3, false, ConvRole::WeightBackward},
      {"Conv1dBiasBackward", Signature::ConvBiasBackward, 1, false, ConvRole::BiasBackward},
      {"Conv2dBiasBackward", Signature::ConvBiasBackward, 2, false, ConvRole::BiasBackward},
      {"Conv3dBiasBackward", Signature::ConvBiasBackward, 3, false, ConvRole::BiasBackward},
      {"ConvTranspose1d", Signature::ConvTranspose, 1, true, ConvRole::Forward},
      {"ConvTranspose2d", Signature::ConvTranspose, 2, true, ConvRole::Forward},
      {"ConvTranspose3d", Signature::ConvTranspose, 3, true, ConvRole::Forward},
      {"ConvTranspose1dWeightBackward", Signature::ConvTransposeBackward, 1, true, ConvRole::WeightBackward},
      {"ConvTranspose2dWeightBackward", Signature::ConvTransposeBackward, 2, true, ConvRole::WeightBackward},
      {"ConvTranspose3dWeightBackward", Signature::ConvTransposeBackward, 3, true, ConvRole::WeightBackward},
      {"ConvTranspose1dBiasBackward", Signature::ConvBiasBackward, 1, true, ConvRole::BiasBackward},
      {"ConvTranspose2dBiasBackward", Signature::ConvBiasBackward, 2, true, ConvRole::BiasBackward},
      {"ConvTranspose3dBiasBackward", Signature::ConvBiasBackward, 3, true, ConvRole::BiasBackward},
  };
  int conv_kinds = 0;
  for (OpKind k : all_kinds()) conv_kinds += build::conv_kind_info(k).has_value() ? 1 : 0;
  EXPECT_EQ(conv_kinds, 21);
  for (const Row& r : rows) {
    const std::optional<OpKind> k = find_op_kind(OpGroup::Module, r.variant);
    ASSERT_TRUE(k.has_value()) << r.variant;
    EXPECT_EQ(op_info(*k).signature, r.sig) << r.variant;
    EXPECT_EQ(op_info(*k).tags, kModule) << r.variant;
    const std::optional<build::ConvKindInfo> info = build::conv_kind_info(*k);
    ASSERT_TRUE(info.has_value()) << r.variant;
    EXPECT_EQ(info->rank, r.rank) << r.variant;
    EXPECT_EQ(info->transposed, r.transposed) << r.variant;
    EXPECT_EQ(info->role, r.role) << r.variant;
  }
  EXPECT_FALSE(find_op_kind(OpGroup::Module, "ConvTranspose1dXBackward").has_value());
  EXPECT_FALSE(build::conv_kind_info(OpKind::Module_Linear).has_value());
  EXPECT_FALSE(build::conv_kind_info(OpKind::Module_MaxPool2d).has_value());
  // Inputs and attribute counts: 3n + 1 for n = 1..3, 4n + 1 transposed; the bias gradients none.
  const std::pair<Signature, std::array<int, 4>> counts[] = {
      {Signature::Conv, {2, 3, 4, 10}},
      {Signature::ConvTranspose, {2, 3, 5, 13}},
      {Signature::ConvBackward, {3, 3, 4, 10}},
      {Signature::ConvTransposeBackward, {3, 3, 5, 13}},
      {Signature::ConvBiasBackward, {3, 3, 0, 0}},
  };
  for (const auto& [sig, c] : counts) {
    const SignatureInfo& info = signature_info(sig);
    EXPECT_EQ(info.min_inputs, c[0]) << info.name;
    EXPECT_EQ(info.max_inputs, c[1]) << info.name;
    EXPECT_EQ(info.min_attrs, c[2]) << info.name;
    EXPECT_EQ(info.max_attrs, c[3]) << info.name;
    EXPECT_EQ(info.min_outputs, 1) << info.name;
    EXPECT_EQ(info.max_outputs, 1) << info.name;
    EXPECT_EQ(info.max_scalars, 0) << info.name;
  }
  EXPECT_EQ(signature_info(Signature::ConvTransposeBackward).name, "ConvTransposeBackward");
  // validate() holds the counts: a bias gradient with an attribute, a weight gradient without
  // its output_grad.
  Operation bias = built(build::conv_bias_backward(OpKind::Module_Conv1dBiasBackward, t(1, {2, 3, 5}), t(2, {4}),
                                                   t(3, {2, 4, 3}), TensorId{4}));
  KILN_EXPECT_OK(bias.validate());
  bias.attrs.push_back(1);
  EXPECT_EQ(expect_invalid(bias), ErrorCode::Invalid);
  Operation grad =
      built(build::conv_backward(OpKind::Module_Conv1dWeightBackward, t(1, {2, 3, 5}), t(2, {4, 3, 3}), t(3, {2, 4, 3}),
                                 build::conv_options(build::Conv1dOptions{}), TensorId{4}));
  KILN_EXPECT_OK(grad.validate());
  grad.tensors.erase(grad.tensors.begin() + 2);
  grad.num_inputs = 2;
  EXPECT_EQ(expect_invalid(grad), ErrorCode::Invalid);
}

// docs/spec/ir.md §5.8 / §5.3: the forward 1d / 2d pools and adaptive 1d / 2d pools are NHWC
// relayout targets (N), AdaptiveAvgPool3d and every backward plain Mod. Seven rank-generic
// signatures; the kind implies the spatial rank, the builders and executors the exact counts.
TEST(OpTable, Pools) {
  using K = OpKind;
  for (K k : {K::Module_MaxPool1d, K::Module_MaxPool1dWithIndices, K::Module_MaxPool2dWithIndices, K::Module_AvgPool1d,
              K::Module_AdaptiveAvgPool1d, K::Module_AdaptiveAvgPool2d, K::Module_MaxPool2d, K::Module_AvgPool2d})
    EXPECT_EQ(op_info(k).tags, kModule | kNhwc) << op_info(k).variant;
  for (K k :
       {K::Module_AdaptiveAvgPool3d, K::Module_MaxPool1dWithIndicesBackward, K::Module_MaxPool2dWithIndicesBackward,
        K::Module_AvgPool1dBackward, K::Module_AvgPool2dBackward, K::Module_AdaptiveAvgPool1dBackward,
        K::Module_AdaptiveAvgPool2dBackward, K::Module_AdaptiveAvgPool3dBackward})
    EXPECT_EQ(op_info(k).tags, kModule) << op_info(k).variant;
  EXPECT_EQ(op_info(K::Module_MaxPool1d).signature, Signature::MaxPool);
  EXPECT_EQ(op_info(K::Module_MaxPool2dWithIndices).signature, Signature::MaxPoolWithIndices);
  EXPECT_EQ(op_info(K::Module_MaxPool1dWithIndicesBackward).signature, Signature::MaxPoolWithIndicesBackward);
  EXPECT_EQ(op_info(K::Module_AvgPool1d).signature, Signature::AvgPool);
  EXPECT_EQ(op_info(K::Module_AvgPool2dBackward).signature, Signature::AvgPoolBackward);
  EXPECT_EQ(op_info(K::Module_AdaptiveAvgPool3d).signature, Signature::AdaptiveAvgPool);
  EXPECT_EQ(op_info(K::Module_AdaptiveAvgPool2dBackward).signature, Signature::AdaptiveAvgPoolBackward);
  EXPECT_EQ(find_op_kind(OpGroup::Module, "MaxPool2dWithIndices"), K::Module_MaxPool2dWithIndices);
  EXPECT_EQ(signature_info(Signature::MaxPoolWithIndices).max_outputs, 2);
  EXPECT_EQ(signature_info(Signature::MaxPoolWithIndices).min_attrs, 5);
  EXPECT_EQ(signature_info(Signature::MaxPoolWithIndices).max_attrs, 9);
  EXPECT_EQ(signature_info(Signature::MaxPoolWithIndicesBackward).min_inputs, 3);
  EXPECT_EQ(signature_info(Signature::AvgPoolBackward).max_attrs, 8);
  EXPECT_EQ(signature_info(Signature::AdaptiveAvgPool).max_attrs, 3);
  EXPECT_EQ(signature_info(Signature::AdaptiveAvgPoolBackward).max_attrs, 0);
  EXPECT_EQ(build::pool_spatial_dims(K::Module_MaxPool1dWithIndices), 1u);
  EXPECT_EQ(build::pool_spatial_dims(K::Module_AvgPool2d), 2u);
  EXPECT_EQ(build::pool_spatial_dims(K::Module_AdaptiveAvgPool3dBackward), 3u);
  EXPECT_EQ(build::pool_spatial_dims(K::Module_Conv2d), 0u);
  // validate() holds the counts: one output for a with-indices pool, four output sizes, an
  // attribute on an adaptive backward.
  Operation wi = built(
      build::max_pool1d_with_indices(t(1, {1, 1, 4}), {2, 2, 0, 1, false}, dtypes::i64, TensorId{2}, TensorId{3}));
  KILN_EXPECT_OK(wi.validate());
  wi.tensors.pop_back();
  EXPECT_EQ(expect_invalid(wi), ErrorCode::Invalid);
  Operation a = built(build::adaptive_avg_pool3d(t(1, {1, 1, 2, 2, 2}), {1, 1, 1}, TensorId{2}));
  a.attrs.push_back(1);
  EXPECT_EQ(expect_invalid(a), ErrorCode::Invalid);
  Operation ab = built(build::adaptive_avg_pool1d_backward(t(1, {1, 1, 4}), t(2, {1, 1, 2}), TensorId{3}));
  ab.attrs.push_back(2);
  EXPECT_EQ(expect_invalid(ab), ErrorCode::Invalid);
}

// docs/spec/ir.md §5.6 / §5.8: GridSample2d is a Float kind tagged ·, carrying its dtype;
// Interpolate is an NHWC-relayout target (N, like the pools), its backward and Unfold4d are Mod.
TEST(OpTable, ResamplingKinds) {
  EXPECT_EQ(op_info(OpKind::Float_GridSample2d).group, OpGroup::Float);
  EXPECT_EQ(op_info(OpKind::Float_GridSample2d).tags, kNone);
  EXPECT_EQ(op_info(OpKind::Module_Interpolate).tags, kModule | kNhwc);
  EXPECT_EQ(op_info(OpKind::Module_InterpolateBackward).tags, kModule);
  EXPECT_EQ(op_info(OpKind::Module_Unfold4d).tags, kModule);
  EXPECT_EQ(find_op_kind(OpGroup::Module, "Unfold4d"), OpKind::Module_Unfold4d);
  EXPECT_EQ(find_op_kind(OpGroup::Float, "GridSample2d"), OpKind::Float_GridSample2d);
  EXPECT_FALSE(find_op_kind(OpGroup::Module, "GridSample2d").has_value());
  struct Counts {
    Signature sig;
    int inputs, attrs;
  };
  for (const Counts& e : {Counts{Signature::GridSample2d, 2, 3}, Counts{Signature::Interpolate, 1, 4},
                          Counts{Signature::InterpolateBackward, 2, 4}, Counts{Signature::Unfold4d, 1, 8}}) {
    const SignatureInfo& info = signature_info(e.sig);
    EXPECT_EQ(info.min_inputs, e.inputs) << info.name;
    EXPECT_EQ(info.max_inputs, e.inputs) << info.name;
    EXPECT_EQ(info.min_attrs, e.attrs) << info.name;
    EXPECT_EQ(info.max_attrs, e.attrs) << info.name;
    EXPECT_EQ(info.min_outputs, 1) << info.name;
    EXPECT_EQ(info.max_outputs, 1) << info.name;
    EXPECT_EQ(info.max_scalars, 0) << info.name;
  }
  EXPECT_EQ(signature_info(Signature::InterpolateBackward).name, "InterpolateBackward");
  // validate() holds the counts: an interpolate without its mode, a grid sample without its grid.
  Operation up = built(build::interpolate(t(1, {1, 1, 2, 2}), {4, 4}, {}, TensorId{2}));
  KILN_EXPECT_OK(up.validate());
  EXPECT_EQ(up.kind_name(), "Module::Interpolate");
  up.attrs.pop_back();
  EXPECT_EQ(expect_invalid(up), ErrorCode::Invalid);
  Operation gs = built(build::grid_sample_2d(t(1, {1, 1, 2, 2}), t(2, {1, 3, 3, 2}), {}, TensorId{3}));
  EXPECT_EQ(gs.kind_name(), "Float::GridSample2d");
  EXPECT_EQ(gs.dtype, dtypes::f32);
  gs.tensors.erase(gs.tensors.begin() + 1);
  gs.num_inputs = 1;
  EXPECT_EQ(expect_invalid(gs), ErrorCode::Invalid);
  Operation uf = built(build::unfold4d(t(1, {1, 1, 2, 2}), {2, 2}, {}, TensorId{2}));
  uf.attrs.push_back(1);
  EXPECT_EQ(expect_invalid(uf), ErrorCode::Invalid);
}

// docs/spec/ir.md §5.8: Rfft (two outputs, re and im) and IRfft are Module kinds tagged Mod,
// attributes [dim, n] (n = 0: none given).
TEST(OpTable, SignalKinds) {
  EXPECT_EQ(op_info(OpKind::Module_Rfft).tags, kModule);
  EXPECT_EQ(op_info(OpKind::Module_IRfft).tags, kModule);
  EXPECT_EQ(op_info(OpKind::Module_Rfft).signature, Signature::Rfft);
  EXPECT_EQ(op_info(OpKind::Module_IRfft).signature, Signature::IRfft);
  EXPECT_EQ(find_op_kind(OpGroup::Module, "IRfft"), OpKind::Module_IRfft);
  EXPECT_FALSE(find_op_kind(OpGroup::Float, "Rfft").has_value());
  EXPECT_EQ(signature_info(Signature::Rfft).name, "Rfft");
  EXPECT_EQ(signature_info(Signature::Rfft).min_inputs, 1);
  EXPECT_EQ(signature_info(Signature::Rfft).max_inputs, 1);
  EXPECT_EQ(signature_info(Signature::Rfft).min_outputs, 2);
  EXPECT_EQ(signature_info(Signature::Rfft).max_outputs, 2);
  EXPECT_EQ(signature_info(Signature::Rfft).max_attrs, 2);
  EXPECT_EQ(signature_info(Signature::IRfft).min_inputs, 2);
  EXPECT_EQ(signature_info(Signature::IRfft).max_outputs, 1);
  EXPECT_EQ(signature_info(Signature::IRfft).min_attrs, 2);
  EXPECT_EQ(signature_info(Signature::IRfft).max_scalars, 0);
  // validate() holds the counts: an rfft without its imaginary part, an irfft without n.
  Operation f = built(build::rfft(t(1, {2, 8}), 1, std::nullopt, TensorId{2}, TensorId{3}));
  KILN_EXPECT_OK(f.validate());
  EXPECT_EQ(f.kind_name(), "Module::Rfft");
  f.tensors.pop_back();
  EXPECT_EQ(expect_invalid(f), ErrorCode::Invalid);
  Operation inv = built(build::irfft(t(1, {2, 5}), t(2, {2, 5}), 1, 8, TensorId{3}));
  inv.attrs.pop_back();
  EXPECT_EQ(expect_invalid(inv), ErrorCode::Invalid);
}

// docs/spec/ir.md §5.8: Attention (3..5 inputs, the optional ones told by presence bits) and the
// CTC loss with its gradient are Module kinds tagged Mod.
TEST(OpTable, AttentionAndCtcKinds) {
  for (OpKind k : {OpKind::Module_Attention, OpKind::Module_CtcLoss, OpKind::Module_CtcLossBackward})
    EXPECT_EQ(op_info(k).tags, kModule) << op_info(k).variant;
  EXPECT_EQ(find_op_kind(OpGroup::Module, "CtcLossBackward"), OpKind::Module_CtcLossBackward);
  EXPECT_EQ(signature_info(Signature::Attention).name, "Attention");
  EXPECT_EQ(signature_info(Signature::Attention).min_inputs, 3);
  EXPECT_EQ(signature_info(Signature::Attention).max_inputs, 5);
  EXPECT_EQ(signature_info(Signature::Attention).min_attrs, 4);
  EXPECT_EQ(signature_info(Signature::Attention).max_attrs, 4);
  EXPECT_EQ(signature_info(Signature::CtcLoss).min_inputs, 4);
  EXPECT_EQ(signature_info(Signature::CtcLoss).max_attrs, 1);
  EXPECT_EQ(signature_info(Signature::CtcLossBackward).max_inputs, 5);
  EXPECT_EQ(signature_info(Signature::CtcLossBackward).max_scalars, 0);
  // The presence bits are distinct single bits.
  EXPECT_EQ(kPresentMask | kPresentBias | kPresentScale | kPresentSoftcap, 15);
  // validate() holds the counts: an attention with six inputs, a CTC loss without its blank.
  const TensorIr q = t(1, {1, 1, 2, 3});
  Operation a = built(build::attention(q, t(2, {1, 1, 2, 3}), t(3, {1, 1, 2, 3}), t(4, {1, 1, 2, 2}, dtypes::boolean),
                                       t(5, {1, 1, 2, 2}), {}, TensorId{6}));
  KILN_EXPECT_OK(a.validate());
  a.tensors.insert(a.tensors.begin() + 5, t(7, {1}));
  a.num_inputs = 6;
  EXPECT_EQ(expect_invalid(a), ErrorCode::Invalid);
  Operation l = built(build::ctc_loss(t(1, {3, 1, 2}), t(2, {1, 1}, dtypes::i64), t(3, {1}, dtypes::i64),
                                      t(4, {1}, dtypes::i64), 0, TensorId{5}));
  l.attrs.clear();
  EXPECT_EQ(expect_invalid(l), ErrorCode::Invalid);
}

// docs/spec/ir.md §5.8: DeformableConv2d (3..5 inputs) and its backward (4..6 inputs, 3..5 outputs:
// the one signature with an output range) are Module kinds tagged Mod.
TEST(OpTable, DeformableConvolutionKindsAndTheOutputRange) {
  EXPECT_EQ(op_info(OpKind::Module_DeformableConv2d).tags, kModule);
  EXPECT_EQ(op_info(OpKind::Module_DeformableConv2dBackward).tags, kModule);
  EXPECT_EQ(find_op_kind(OpGroup::Module, "DeformableConv2dBackward"), OpKind::Module_DeformableConv2dBackward);
  const SignatureInfo& fwd = signature_info(Signature::DeformableConv2d);
  EXPECT_EQ(fwd.name, "DeformableConv2d");
  EXPECT_EQ(fwd.min_inputs, 3);
  EXPECT_EQ(fwd.max_inputs, 5);
  EXPECT_EQ(fwd.min_outputs, 1);
  EXPECT_EQ(fwd.max_outputs, 1);
  EXPECT_EQ(fwd.min_attrs, 9);
  EXPECT_EQ(fwd.max_attrs, 9);
  const SignatureInfo& back = signature_info(Signature::DeformableConv2dBackward);
  EXPECT_EQ(back.min_inputs, 4);
  EXPECT_EQ(back.max_inputs, 6);
  EXPECT_EQ(back.min_outputs, 3);
  EXPECT_EQ(back.max_outputs, 5);
  // LayerNorm: 1 output, or 3 with the row statistics (K).
  EXPECT_EQ(signature_info(Signature::LayerNorm).min_outputs, 1);
  EXPECT_EQ(signature_info(Signature::LayerNorm).max_outputs, 3);
  // Every other signature has one output count (Custom any); Drop none.
  for (int i = 0; i <= static_cast<int>(Signature::Drop); ++i) {
    const auto sig = static_cast<Signature>(i);
    if (sig == Signature::DeformableConv2dBackward || sig == Signature::Custom || sig == Signature::LayerNorm) continue;
    EXPECT_EQ(signature_info(sig).min_outputs, signature_info(sig).max_outputs) << signature_info(sig).name;
  }
  EXPECT_EQ(signature_info(Signature::Custom).min_outputs, 0);
  EXPECT_EQ(signature_info(Signature::Custom).max_outputs, kVariadic);
  EXPECT_EQ(signature_info(Signature::Drop).max_outputs, 0);
  // validate() admits 3..5 outputs, not 2 or 6.
  Operation op = built(build::deformable_conv2d_backward(
      t(1, {1, 1, 3, 3}), t(2, {1, 2, 3, 3}), t(3, {1, 1, 1, 1}), t(4, {1, 1, 3, 3}), t(5, {1}), t(6, {1, 1, 3, 3}), {},
      {TensorId{7}, TensorId{8}, TensorId{9}, TensorId{10}, TensorId{11}}));
  KILN_EXPECT_OK(op.validate());
  op.tensors.push_back(TensorIr::uninit(TensorId{12}, {1}, dtypes::f32));
  EXPECT_EQ(expect_invalid(op), ErrorCode::Invalid);
  op.tensors.resize(op.tensors.size() - 2);  // 4 outputs
  KILN_EXPECT_OK(op.validate());
  op.tensors.resize(op.tensors.size() - 1);  // 3
  KILN_EXPECT_OK(op.validate());
  op.tensors.pop_back();  // 2
  EXPECT_EQ(expect_invalid(op), ErrorCode::Invalid);
}

// docs/spec/ir.md §5.6, §5.3: Quantize (tag Q) and Dequantize (Q, E) are Float kinds; Quantize has
// its own signature (2..3 inputs, no attribute: the scheme is the output dtype), Dequantize Cast's.
TEST(OpTable, QuantizationKinds) {
  EXPECT_EQ(op_info(OpKind::Float_Quantize).tags, kQuantization);
  EXPECT_EQ(op_info(OpKind::Float_Dequantize).tags, kQuantization | kElementwise);
  EXPECT_EQ(op_info(OpKind::Float_Quantize).signature, Signature::Quantize);
  EXPECT_EQ(op_info(OpKind::Float_Dequantize).signature, Signature::Cast);
  EXPECT_EQ(find_op_kind(OpGroup::Float, "Dequantize"), OpKind::Float_Dequantize);
  int tagged = 0;
  for (OpKind k : all_kinds()) tagged += op_info(k).has(kQuantization) ? 1 : 0;
  EXPECT_EQ(tagged, 2);
  const SignatureInfo& q = signature_info(Signature::Quantize);
  EXPECT_EQ(q.name, "Quantize");
  EXPECT_EQ(q.min_inputs, 2);
  EXPECT_EQ(q.max_inputs, 3);
  EXPECT_EQ(q.max_outputs, 1);
  EXPECT_EQ(q.max_attrs, 0);
  EXPECT_EQ(q.max_scalars, 0);
  // The value types' bits and ranges (Burn's QuantValue).
  EXPECT_EQ(quant_value_bits(QuantValue::Q8F), 8);
  EXPECT_EQ(quant_value_bits(QuantValue::Q2S), 2);
  EXPECT_EQ(quant_value_range(QuantValue::Q8F), (std::pair<std::int64_t, std::int64_t>{-128, 127}));
  EXPECT_EQ(quant_value_range(QuantValue::Q8S), (std::pair<std::int64_t, std::int64_t>{-127, 127}));
  EXPECT_EQ(quant_value_range(QuantValue::Q4F), (std::pair<std::int64_t, std::int64_t>{-8, 7}));
  EXPECT_EQ(quant_value_range(QuantValue::Q4S), (std::pair<std::int64_t, std::int64_t>{-7, 7}));
  EXPECT_EQ(quant_value_range(QuantValue::Q2F), (std::pair<std::int64_t, std::int64_t>{-2, 1}));
  EXPECT_EQ(quant_value_range(QuantValue::Q2S), (std::pair<std::int64_t, std::int64_t>{-1, 1}));
  EXPECT_EQ(quant_value_bits(static_cast<QuantValue>(9)), 0);
  // validate() holds the counts; Float may carry a QFloat (Dequantize carries its input's).
  Operation quant = built(build::quantize(t(1, {2, 4}), t(2, {1}), std::nullopt, QuantScheme{}, TensorId{3}));
  KILN_EXPECT_OK(quant.validate());
  EXPECT_EQ(quant.kind_name(), "Float::Quantize");
  EXPECT_EQ(quant.dtype, dtypes::f32);
  Operation de = built(build::dequantize(t(1, {2, 4}, DType::qfloat({})), dtypes::f16, TensorId{2}));
  KILN_EXPECT_OK(de.validate());
  EXPECT_EQ(de.dtype, DType::qfloat({}));
  quant.tensors.erase(quant.tensors.begin() + 1);
  quant.num_inputs = 1;
  EXPECT_EQ(expect_invalid(quant), ErrorCode::Invalid);
}

// ---- Names and formatting (docs/spec/fusion.md §17.4-§17.5)

TEST(KindName, FamilyColonVariantAndSpecialCases) {
  Operation op;
  op.kind = OpKind::Drop_Drop;
  op.family = Family::Drop;
  EXPECT_EQ(op.kind_name(), "Drop");
  op.kind = OpKind::Custom_Custom;
  op.family = Family::Custom;
  EXPECT_EQ(op.kind_name(), "Custom");
  op.kind = OpKind::Init_Init;
  op.family = Family::Init;
  EXPECT_EQ(op.kind_name(), "Init::InitOperationIr");
  op.kind = OpKind::Base_Permute;
  op.family = Family::BaseFloat;
  EXPECT_EQ(op.kind_name(), "BaseFloat::Permute");
  op.kind = OpKind::Float_Exp;
  op.family = Family::Float;
  EXPECT_EQ(op.kind_name(), "Float::Exp");
  op.kind = OpKind::Numeric_MulScalar;
  op.family = Family::NumericInt;
  EXPECT_EQ(op.kind_name(), "NumericInt::MulScalar");
  op.kind = OpKind::Distributed_SyncCollective;
  op.family = Family::Distributed;
  EXPECT_EQ(op.kind_name(), "Distributed::SyncCollective");
}

TEST(TensorFormatting, ToStringAndLists) {
  EXPECT_EQ(t(42, {2, 3, 4}).to_string(), "t42:f32[2,3,4]");
  EXPECT_EQ(t(2, {}).to_string(), "t2:f32[]");
  EXPECT_EQ(t(7, {5}, DType::boolean(BoolStore::U8)).to_string(), "t7:bool(U8)[5]");
  EXPECT_EQ(t(8, {1}, dtypes::bf16).to_string(), "t8:bf16[1]");
  const TensorIr ts[] = {t(1, {64, 64}), t(2, {64, 64})};
  EXPECT_EQ(format_tensors(ts), "t1:f32[64,64], t2:f32[64,64]");
  EXPECT_EQ(format_tensors({}), "");
  EXPECT_EQ(TensorId{5}.to_string(), "TensorId(5)");
}

// ---- validate()

TEST(Validate, BuiltOpsAreValid) {
  KILN_EXPECT_OK(add_op().validate());
  KILN_EXPECT_OK(mul_scalar_op(ScalarIr::Float(2)).validate());
  KILN_EXPECT_OK(random_op({}).validate());
}

TEST(Validate, CatchesWrongCounts) {
  {
    Operation op = mul_scalar_op(ScalarIr::Float(2));
    op.scalars.clear();
    expect_invalid(op);
  }
  {
    Operation op = add_op();
    op.attrs.push_back(1);
    expect_invalid(op);
  }
  {
    Operation op = add_op();
    op.tensors.push_back(TensorIr::uninit(TensorId{4}, {2, 3}, dtypes::f32));  // a second output
    expect_invalid(op);
  }
  {
    Operation op = add_op();
    op.num_inputs = 1;  // lhs only: the rhs becomes an output
    expect_invalid(op);
  }
  {
    Operation op = add_op();
    op.num_inputs = 9;  // more inputs than tensors
    expect_invalid(op);
  }
  {
    Operation op = random_op({});
    op.attrs.pop_back();
    expect_invalid(op);
  }
}

TEST(Validate, CatchesStatusFamilyAndRangeErrors) {
  {
    Operation op = add_op();
    op.tensors[2].status = TensorStatus::ReadOnly;  // output must be NotInit
    expect_invalid(op);
  }
  {
    Operation op = add_op();
    op.tensors[0].status = TensorStatus::NotInit;  // input must not be
    expect_invalid(op);
  }
  {
    Operation op = add_op();
    op.family = Family::Float;  // Numeric group does not admit Float
    expect_invalid(op);
  }
  {
    Operation op = add_op();
    op.family = Family::NumericInt;  // carries f32
    EXPECT_EQ(expect_invalid(op), ErrorCode::DTypeMismatch);
  }
  {
    Operation op = add_op();
    op.ranges.push_back(Slice{0, 1, 1});  // only Slice / SliceAssign carry ranges
    expect_invalid(op);
  }
  {
    Operation op = add_op();
    op.custom_id = "x";
    expect_invalid(op);
  }
  const Slice one[] = {Slice{0, 2, 1}};
  Operation sl = built(build::slice(Family::BaseFloat, OpKind::Base_Slice, t(1, {4, 4}), one, TensorId{2}));
  {
    Operation op = sl;
    op.ranges[0].step = 0;
    expect_invalid(op);
  }
  {
    Operation op = sl;
    op.ranges.assign(3, Slice{0, 1, 1});
    EXPECT_EQ(expect_invalid(op), ErrorCode::RankMismatch);
  }
  {
    Operation op = built(build::drop(t(5, {2}, dtypes::f32, TensorStatus::ReadWrite)));
    op.tensors[0].status = TensorStatus::ReadOnly;
    expect_invalid(op);
  }
}

// ---- Equality and hashing (docs/spec/fusion.md §3.8)

TEST(OperationHash, EqualOpsHashEqual) {
  const Operation a = add_op();
  const Operation b = add_op();
  EXPECT_EQ(a, b);
  EXPECT_EQ(hash_operation(a), hash_operation(b));
  EXPECT_EQ(OperationHash{}(a), OperationHash{}(b));
  const Operation c = add_op(1, 2, 4);
  EXPECT_FALSE(a == c);
  EXPECT_NE(hash_operation(a), hash_operation(c));
  EXPECT_EQ(hash_tensor(t(1, {2})), hash_tensor(t(1, {2})));
  EXPECT_NE(hash_tensor(t(1, {2})), hash_tensor(t(1, {3})));
}

TEST(OperationHash, EqualityCoversEveryField) {
  const Operation base = add_op();
  Operation status_differs = add_op(1, 2, 3, TensorStatus::ReadWrite);
  EXPECT_FALSE(base == status_differs);
  Operation kind_differs = base;
  kind_differs.kind = OpKind::Numeric_Sub;
  EXPECT_FALSE(base == kind_differs);
  Operation dtype_differs = built(build::binary(Family::NumericFloat, OpKind::Numeric_Add, t(1, {2, 3}, dtypes::f16),
                                                t(2, {2, 3}, dtypes::f16), TensorId{3}));
  EXPECT_FALSE(base == dtype_differs);
  EXPECT_FALSE(mul_scalar_op(ScalarIr::Float(2)) == mul_scalar_op(ScalarIr::Int(2)));
  // Families without a dtype ignore Operation::dtype.
  Operation a = built(build::unary(Family::Int, OpKind::Int_BitwiseNot, t(1, {2}, dtypes::i32), TensorId{2}));
  Operation b = a;
  b.dtype = dtypes::f64;
  EXPECT_EQ(a, b);
  EXPECT_EQ(hash_operation(a), hash_operation(b));
}

TEST(OperationHash, FloatScalarsHashByBitPattern) {
  EXPECT_EQ(mul_scalar_op(ScalarIr::Float(2.5)), mul_scalar_op(ScalarIr::Float(2.5)));
  EXPECT_EQ(hash_operation(mul_scalar_op(ScalarIr::Float(2.5))), hash_operation(mul_scalar_op(ScalarIr::Float(2.5))));
  EXPECT_NE(hash_operation(mul_scalar_op(ScalarIr::Float(2.5))), hash_operation(mul_scalar_op(ScalarIr::Float(3.5))));
  EXPECT_EQ(ScalarIr::Float(2.5).hash_bits(), 0x4004000000000000ull);
  // Same bits, different kinds: the kind is hashed too.
  EXPECT_NE(hash_operation(mul_scalar_op(ScalarIr::Float(0))), hash_operation(mul_scalar_op(ScalarIr::Int(0))));
}

TEST(OperationHash, NanScalarOpIsNotEqualToItself) {
  const Operation nan = mul_scalar_op(ScalarIr::Float(std::numeric_limits<double>::quiet_NaN()));
  EXPECT_FALSE(nan == nan);
  // The hash is still deterministic (bit pattern), so bucketing stays stable.
  EXPECT_EQ(hash_operation(nan), hash_operation(nan));
}

TEST(OperationHash, RandomHashesOnlyOutputAndDistributionKind) {
  const Operation u01 = random_op(build::DistributionIr::uniform(0, 1));
  const Operation u23 = random_op(build::DistributionIr::uniform(2, 3));
  EXPECT_FALSE(u01 == u23);                             // parameters are compared
  EXPECT_EQ(hash_operation(u01), hash_operation(u23));  // but not hashed
  const Operation n01 = random_op(build::DistributionIr::normal(0, 1));
  EXPECT_NE(hash_operation(u01), hash_operation(n01));
  const Operation other_out = built(build::random(Family::Float, OpKind::Float_Random, {2, 3}, dtypes::f32,
                                                  build::DistributionIr::uniform(0, 1), TensorId{9}));
  EXPECT_NE(hash_operation(u01), hash_operation(other_out));
}

// ---- mark_read_only (docs/spec/ir.md §5.1)

TEST(MarkReadOnly, OnlyListedReadWriteInputsChange) {
  Operation op = add_op(1, 2, 3, TensorStatus::ReadWrite);
  const TensorId ids[] = {TensorId{2}, TensorId{3}, TensorId{77}};
  const std::vector<TensorIr> changed = op.mark_read_only(ids);
  ASSERT_EQ(changed.size(), 1u);
  EXPECT_EQ(changed[0], t(2, {2, 3}, dtypes::f32, TensorStatus::ReadWrite));  // the original occurrence
  EXPECT_EQ(op.inputs()[0].status, TensorStatus::ReadWrite);                  // not listed
  EXPECT_EQ(op.inputs()[1].status, TensorStatus::ReadOnly);
  EXPECT_EQ(op.outputs()[0].status, TensorStatus::NotInit);  // outputs never change
  EXPECT_TRUE(op.mark_read_only(ids).empty());               // already ReadOnly
}

TEST(MarkReadOnly, RepeatedInputsAndInit) {
  Operation op =
      built(build::binary(Family::NumericFloat, OpKind::Numeric_Mul, t(1, {2}, dtypes::f32, TensorStatus::ReadWrite),
                          t(1, {2}, dtypes::f32, TensorStatus::ReadWrite), TensorId{2}));
  const TensorId ids[] = {TensorId{1}};
  EXPECT_EQ(op.mark_read_only(ids).size(), 2u);
  Operation init = built(build::init({2}, dtypes::f32, TensorId{1}));
  EXPECT_TRUE(init.mark_read_only(ids).empty());
  EXPECT_EQ(init.outputs()[0].status, TensorStatus::NotInit);
  // Custom: only inputs are considered.
  const std::vector<TensorIr> ins{t(1, {2}, dtypes::f32, TensorStatus::ReadWrite)};
  const std::vector<TensorIr> outs{TensorIr::uninit(TensorId{5}, {2}, dtypes::f32)};
  Operation custom = built(build::custom("k", ins, outs, {}));
  const TensorId both[] = {TensorId{1}, TensorId{5}};
  EXPECT_EQ(custom.mark_read_only(both).size(), 1u);
  EXPECT_EQ(custom.inputs()[0].status, TensorStatus::ReadOnly);
}

TEST(OperationToString, OneLine) {
  EXPECT_EQ(add_op().to_string(), "NumericFloat::Add<f32>(t1:f32[2,3], t2:f32[2,3]) -> (t3:f32[2,3])");
  EXPECT_EQ(mul_scalar_op(ScalarIr::Float(2)).to_string(),
            "NumericFloat::MulScalar<f32>(t1:f32[4]) -> (t2:f32[4]) scalars[Float(2)]");
}

}  // namespace
}  // namespace kiln::ir
