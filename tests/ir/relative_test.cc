// RelativeConverter: docs/spec/fusion.md §3 (relative form), §3.11 worked example and §19.3 items 1–4.
#include "kiln/ir/relative.h"

#include <gtest/gtest.h>

#include <vector>

#include "kiln/ir/builders.h"

namespace kiln::ir {
namespace {

using dtypes::f32;

constexpr auto RO = TensorStatus::ReadOnly;
constexpr auto RW = TensorStatus::ReadWrite;
constexpr auto NI = TensorStatus::NotInit;

TensorIr T(std::uint64_t id, Shape shape, TensorStatus status = NI, DType dtype = f32) {
  return TensorIr{TensorId(id), std::move(shape), status, dtype};
}

Operation make(OpKind kind, Family family, std::vector<TensorIr> ins, std::vector<TensorIr> outs,
               std::vector<ScalarIr> scalars = {}, DType dtype = f32) {
  Operation op;
  op.kind = kind;
  op.family = family;
  op.dtype = dtype;
  op.num_inputs = static_cast<std::uint8_t>(ins.size());
  for (auto& t : ins) op.tensors.push_back(std::move(t));
  for (auto& t : outs) op.tensors.push_back(std::move(t));
  for (const auto& s : scalars) op.scalars.push_back(s);
  return op;
}

Operation mul(TensorIr a, TensorIr b, TensorIr out) {
  return make(OpKind::Numeric_Mul, Family::NumericFloat, {std::move(a), std::move(b)}, {std::move(out)});
}
Operation add(TensorIr a, TensorIr b, TensorIr out) {
  return make(OpKind::Numeric_Add, Family::NumericFloat, {std::move(a), std::move(b)}, {std::move(out)});
}
Operation mul_scalar(TensorIr a, ScalarIr s, TensorIr out) {
  return make(OpKind::Numeric_MulScalar, Family::NumericFloat, {std::move(a)}, {std::move(out)}, {s});
}
Operation exp(TensorIr in, TensorIr out) {
  return make(OpKind::Float_Exp, Family::Float, {std::move(in)}, {std::move(out)});
}

// The segment of docs/spec/fusion.md §3.11 on an n×m shape, with global ids starting at `base` and the
// scalar `s`: Mul(t1, t2 -> t4), MulScalar(t3, s -> t5), Add(t4 RW, t5 RW -> t6), Exp(t6 RW -> t7).
std::vector<Operation> worked_segment(std::uint64_t base, std::uint64_t n, std::uint64_t m, double s) {
  const Shape sh{n, m};
  auto id = [&](std::uint64_t k) { return base + k; };
  return {
      mul(T(id(1), sh, RO), T(id(2), sh, RO), T(id(4), sh, NI)),
      mul_scalar(T(id(3), sh, RO), ScalarIr::Float(s), T(id(5), sh, NI)),
      add(T(id(4), sh, RW), T(id(5), sh, RW), T(id(6), sh, NI)),
      exp(T(id(6), sh, RW), T(id(7), sh, NI)),
  };
}

std::vector<Operation> relativize_all(RelativeConverter& conv, const std::vector<Operation>& ops) {
  std::vector<Operation> out;
  for (const auto& op : ops) out.push_back(conv.relativize(op));
  return out;
}

// ---- docs/spec/fusion.md §3.11

TEST(RelativeWorkedExample, MulMulScalarAddExp) {
  RelativeConverter conv;
  const auto rel = relativize_all(conv, worked_segment(0, 64, 64, 2.0));
  const Shape r{1, 1};
  const std::vector<Operation> expected = {
      mul(T(0, r, RO), T(1, r, RO), T(2, r, NI)),
      mul_scalar(T(3, r, RO), ScalarIr::UInt(0), T(4, r, NI)),
      add(T(2, r, RW), T(4, r, RW), T(5, r, NI)),
      exp(T(5, r, RW), T(6, r, NI)),
  };
  ASSERT_EQ(rel.size(), expected.size());
  for (std::size_t i = 0; i < rel.size(); ++i) EXPECT_EQ(rel[i], expected[i]) << i << ": " << rel[i].to_string();
  // Kind, family and carried dtype unchanged.
  EXPECT_EQ(rel[1].kind, OpKind::Numeric_MulScalar);
  EXPECT_EQ(rel[1].family, Family::NumericFloat);
  EXPECT_EQ(rel[3].family, Family::Float);
  EXPECT_EQ(rel[3].dtype, f32);
  // The context.
  ASSERT_EQ(conv.scalars().size(), 1u);
  EXPECT_EQ(conv.scalars()[0], ScalarIr::Float(2.0));
  EXPECT_EQ(conv.num_relative_tensors(), 7u);
  EXPECT_EQ(std::vector<std::uint64_t>(conv.shapes_rel2glob().begin(), conv.shapes_rel2glob().end()),
            (std::vector<std::uint64_t>{1, 64}));
  // rel2glob holds the latest occurrence: t4 was last seen ReadWrite by Add.
  ASSERT_NE(conv.global_tensor(2), nullptr);
  EXPECT_EQ(*conv.global_tensor(2), T(4, {64, 64}, RW));
  EXPECT_EQ(conv.global_tensor(7), nullptr);
}

TEST(RelativeWorkedExample, SameFormForOtherScalarAndSquareShape) {
  RelativeConverter a, b, c;
  const auto base = relativize_all(a, worked_segment(0, 64, 64, 2.0));
  const auto other_scalar = relativize_all(b, worked_segment(100, 64, 64, 3.0));
  const auto other_shape = relativize_all(c, worked_segment(200, 32, 32, 2.0));
  EXPECT_EQ(base, other_scalar);
  EXPECT_EQ(base, other_shape);
  for (std::size_t i = 0; i < base.size(); ++i) {
    EXPECT_EQ(hash_operation(base[i]), hash_operation(other_scalar[i]));
    EXPECT_EQ(hash_operation(base[i]), hash_operation(other_shape[i]));
  }
  EXPECT_EQ(b.scalars()[0], ScalarIr::Float(3.0));
  EXPECT_EQ(c.shapes_rel2glob()[1], 32u);
}

TEST(RelativeWorkedExample, NonSquareShapeBecomesOneTwo) {
  RelativeConverter a, b;
  const auto square = relativize_all(a, worked_segment(0, 64, 64, 2.0));
  const auto rect = relativize_all(b, worked_segment(0, 64, 32, 2.0));
  EXPECT_NE(square, rect);
  for (const Operation& op : rect)
    for (const TensorIr& t : op.tensors) EXPECT_EQ(t.shape, (Shape{1, 2})) << op.to_string();
  // Same ids, statuses and scalars: only the shapes differ.
  for (std::size_t i = 0; i < rect.size(); ++i) {
    Operation fixed = rect[i];
    for (TensorIr& t : fixed.tensors) t.shape = Shape{1, 1};
    EXPECT_EQ(fixed, square[i]);
  }
}

// ---- docs/spec/fusion.md §19.3

TEST(RelativeVectors, Item1SharedDimIdsAcrossTensors) {
  RelativeConverter conv;
  const TensorIr a = conv.relativize_tensor(T(500, {512, 32, 2048}, RO, dtypes::f16));
  const TensorIr b = conv.relativize_tensor(T(501, {512, 128, 2048}, RW, dtypes::i32));
  EXPECT_EQ(a, T(0, {1, 2, 3}, RO, dtypes::f16));
  EXPECT_EQ(b, T(1, {1, 4, 3}, RW, dtypes::i32));
  EXPECT_EQ(conv.num_relative_shapes(), 5u);
}

TEST(RelativeVectors, Item2ScalarsBecomePositionalUInt) {
  RelativeConverter conv;
  EXPECT_EQ(conv.relativize_scalar(ScalarIr::Float(1.0)), ScalarIr::UInt(0));
  EXPECT_EQ(conv.relativize_scalar(ScalarIr::UInt(1)), ScalarIr::UInt(1));
  ASSERT_EQ(conv.scalars().size(), 2u);
  EXPECT_EQ(conv.scalars()[0], ScalarIr::Float(1.0));
  EXPECT_EQ(conv.scalars()[1], ScalarIr::UInt(1));
}

TEST(RelativeVectors, Item3BoolScalar) {
  RelativeConverter conv;
  EXPECT_EQ(conv.relativize_scalar(ScalarIr::Bool(true)), ScalarIr::UInt(0));
  ASSERT_EQ(conv.scalars().size(), 1u);
  EXPECT_EQ(conv.scalars()[0], ScalarIr::Bool(true));
}

TEST(RelativeVectors, Item4Shapes) {
  auto rel_shape = [](Shape s) {
    RelativeConverter conv;  // fresh converter for each shape
    return conv.relativize_tensor(T(1, std::move(s))).shape;
  };
  EXPECT_EQ(rel_shape({64, 64}), (Shape{1, 1}));
  EXPECT_EQ(rel_shape({32, 32}), (Shape{1, 1}));
  EXPECT_EQ(rel_shape({64, 32}), (Shape{1, 2}));
  EXPECT_EQ(rel_shape({1, 64}), (Shape{0, 1}));
  EXPECT_EQ(rel_shape({64, 1}), (Shape{1, 0}));
  EXPECT_EQ(rel_shape({}), Shape{});
}

// ---- further rules

TEST(RelativeConverter, SeededWithOneAsDimZero) {
  RelativeConverter conv;
  EXPECT_EQ(conv.num_relative_shapes(), 1u);
  EXPECT_EQ(conv.shapes_rel2glob()[0], 1u);
  EXPECT_EQ(conv.relativize_dim(1), 0u);
  EXPECT_EQ(conv.relativize_dim(7), 1u);
  EXPECT_EQ(conv.relativize_dim(1), 0u);
  EXPECT_EQ(conv.relativize_dim(7), 1u);
  EXPECT_EQ(conv.num_relative_shapes(), 2u);
}

TEST(RelativeConverter, ClearReseeds) {
  RelativeConverter conv;
  (void)conv.relativize(worked_segment(0, 64, 32, 2.0)[1]);
  EXPECT_EQ(conv.num_relative_shapes(), 3u);
  EXPECT_EQ(conv.num_relative_tensors(), 2u);
  conv.clear();
  EXPECT_EQ(conv.num_relative_shapes(), 1u);
  EXPECT_EQ(conv.shapes_rel2glob()[0], 1u);
  EXPECT_EQ(conv.num_relative_tensors(), 0u);
  EXPECT_TRUE(conv.scalars().empty());
  EXPECT_TRUE(conv.ranges().empty());
  // Numbering starts again: tensor 0, dim value 1 is id 0, the next value id 1.
  EXPECT_EQ(conv.relativize_tensor(T(42, {1, 32})), T(0, {0, 1}));
  EXPECT_EQ(conv.relativize_scalar(ScalarIr::Int(-3)), ScalarIr::UInt(0));
}

TEST(RelativeConverter, ClearedConverterMatchesFreshOne) {
  RelativeConverter used, fresh;
  (void)relativize_all(used, worked_segment(0, 17, 3, 9.0));
  used.clear();
  EXPECT_EQ(relativize_all(used, worked_segment(50, 64, 32, 2.0)),
            relativize_all(fresh, worked_segment(50, 64, 32, 2.0)));
}

TEST(RelativeConverter, ScalarsAreNotDeduplicated) {
  RelativeConverter conv;
  Operation clamp = make(OpKind::Numeric_Clamp, Family::NumericFloat, {T(3, {4}, RO)}, {T(4, {4})},
                         {ScalarIr::Float(2.0), ScalarIr::Float(2.0)});
  const Operation rel = conv.relativize(clamp);
  EXPECT_EQ(rel.scalars[0], ScalarIr::UInt(0));
  EXPECT_EQ(rel.scalars[1], ScalarIr::UInt(1));
  // The same op again gets new placeholders: the numbering runs over the whole segment.
  const Operation again = conv.relativize(clamp);
  EXPECT_EQ(again.scalars[0], ScalarIr::UInt(2));
  EXPECT_EQ(again.scalars[1], ScalarIr::UInt(3));
  ASSERT_EQ(conv.scalars().size(), 4u);
  for (const ScalarIr& s : conv.scalars()) EXPECT_EQ(s, ScalarIr::Float(2.0));
}

TEST(RelativeConverter, SliceRangesBecomePlaceholders) {
  Operation slice = make(OpKind::Base_Slice, Family::BaseFloat, {T(10, {16, 9}, RO)}, {T(11, {3, 9})});
  slice.ranges.push_back(Slice{2, 8, 2});
  slice.ranges.push_back(Slice{-1, std::nullopt, 1});
  RelativeConverter conv;
  const Operation rel = conv.relativize(slice);
  ASSERT_EQ(rel.ranges.size(), 2u);
  EXPECT_EQ(rel.ranges[0], (Slice{0, std::nullopt, 1}));
  EXPECT_EQ(rel.ranges[1], (Slice{1, std::nullopt, 1}));
  ASSERT_EQ(conv.ranges().size(), 2u);
  EXPECT_EQ(conv.ranges()[0], (Slice{2, 8, 2}));
  EXPECT_EQ(conv.ranges()[1], (Slice{-1, std::nullopt, 1}));
  // Bounds and steps do not matter for the relative form.
  Operation other = slice;
  other.ranges[0] = Slice{0, 4, 1};
  other.ranges[1] = Slice{3, 5, 1};
  RelativeConverter conv2;
  EXPECT_EQ(conv2.relativize(other), rel);
}

TEST(RelativeConverter, OtherFieldsKeptVerbatim) {
  RelativeConverter conv;
  Operation sum = make(OpKind::Numeric_SumDim, Family::NumericInt, {T(7, {5, 6}, RO, dtypes::i32)},
                       {T(8, {5, 1}, NI, dtypes::i32)}, {}, dtypes::i32);
  sum.attrs = {1, 6};
  const Operation rel = conv.relativize(sum);
  EXPECT_EQ(rel.kind, OpKind::Numeric_SumDim);
  EXPECT_EQ(rel.family, Family::NumericInt);
  EXPECT_EQ(rel.dtype, dtypes::i32);
  EXPECT_EQ(rel.attrs, (AttrList{1, 6}));
  EXPECT_EQ(rel.tensors[0], T(0, {1, 2}, RO, dtypes::i32));
  EXPECT_EQ(rel.tensors[1], T(1, {1, 0}, NI, dtypes::i32));

  Operation custom =
      make(OpKind::Custom_Custom, Family::Custom, {T(9, {3}, RO)}, {T(10, {3}), T(11, {3})}, {ScalarIr::Int(5)});
  custom.custom_id = "my_kernel";
  const Operation crel = conv.relativize(custom);
  EXPECT_EQ(crel.custom_id, "my_kernel");
  EXPECT_EQ(crel.num_inputs, 1);
  EXPECT_EQ(crel.tensors[0].id, TensorId(2));
  EXPECT_EQ(crel.tensors[2].id, TensorId(4));
  EXPECT_EQ(crel.scalars[0], ScalarIr::UInt(0));
}

TEST(RelativeConverter, DifferentDtypeOrStatusIsADifferentForm) {
  RelativeConverter a, b;
  const Operation x = a.relativize(exp(T(1, {4}, RO), T(2, {4})));
  const Operation y = b.relativize(exp(T(1, {4}, RW), T(2, {4})));
  EXPECT_NE(x, y);
  RelativeConverter c;
  Operation f16_exp = exp(T(1, {4}, RO, dtypes::f16), T(2, {4}, NI, dtypes::f16));
  f16_exp.dtype = dtypes::f16;
  const Operation z = c.relativize(f16_exp);
  EXPECT_NE(x, z);
  EXPECT_EQ(z.dtype, dtypes::f16);
}

TEST(RelativeConverter, RepeatedTensorKeepsItsIdAndLatestOccurrence) {
  RelativeConverter conv;
  // x * x: inputs [x, x] keep the duplicate.
  const Operation rel = conv.relativize(mul(T(5, {8}, RO), T(5, {8}, RO), T(6, {8})));
  EXPECT_EQ(rel.tensors[0].id, TensorId(0));
  EXPECT_EQ(rel.tensors[1].id, TensorId(0));
  EXPECT_EQ(rel.tensors[2].id, TensorId(1));
  (void)conv.relativize(exp(T(5, {8}, RW), T(5, {8}, NI)));  // in place: t5 as input and output
  EXPECT_EQ(conv.num_relative_tensors(), 2u);
  EXPECT_EQ(conv.global_tensor(0)->status, NI);  // the latest occurrence is the output
}

TEST(RelativeConverter, RelativizeIntoReusesAndOverwritesOut) {
  RelativeConverter a, b;
  Operation out;
  const auto segment = worked_segment(0, 64, 32, 2.0);
  Operation slice =
      make(OpKind::Base_Slice, Family::BaseFloat, {T(10, {16, 9, 4, 3, 2, 7, 5}, RO)}, {T(11, {3, 9, 4, 3, 2, 7, 5})});
  slice.ranges.push_back(Slice{2, 8, 2});
  Operation custom = make(OpKind::Custom_Custom, Family::Custom, {T(1, {64, 32}, RO)}, {}, {});
  custom.custom_id = "a_rather_long_custom_identifier_beyond_sso";
  // Alternate larger and smaller ops through the same `out`.
  std::vector<Operation> ops = {slice, segment[0], custom, segment[1], segment[2], slice, segment[3]};
  for (const Operation& op : ops) {
    a.relativize_into(op, out);
    EXPECT_EQ(out, b.relativize(op)) << op.to_string();
    EXPECT_EQ(out.custom_id, op.custom_id);
    EXPECT_EQ(out.ranges.size(), op.ranges.size());
  }
  EXPECT_EQ(a.scalars().size(), b.scalars().size());
  EXPECT_EQ(a.ranges().size(), b.ranges().size());
}

TEST(RelativeConverter, DropAndInit) {
  RelativeConverter conv;
  Operation init = make(OpKind::Init_Init, Family::Init, {}, {T(30, {2, 2})});
  Operation drop = make(OpKind::Drop_Drop, Family::Drop, {T(30, {2, 2}, RW)}, {});
  EXPECT_EQ(conv.relativize(init).tensors[0], T(0, {1, 1}));
  const Operation d = conv.relativize(drop);
  EXPECT_EQ(d.kind, OpKind::Drop_Drop);
  EXPECT_EQ(d.tensors[0], T(0, {1, 1}, RW));
}

// docs/spec/fusion.md §3.6: LayerNorm's epsilon is kept verbatim (an attribute, so two epsilons are
// two forms), BatchNorm's is relativized like any scalar (one form, the value bound at execution).
TEST(RelativeConverter, LayerNormEpsilonIsVerbatimBatchNormEpsilonIsAPlaceholder) {
  auto layer_norm = [](double eps) {
    return build::layer_norm(T(1, {2, 3}, RO), T(2, {3}, RO), std::nullopt, eps, TensorId(3)).value();
  };
  auto batch_norm = [](double eps) {
    return build::batch_norm(T(1, {2, 3}, RO), T(2, {3}, RO), T(3, {3}, RO), T(4, {3}, RO), T(5, {3}, RO), eps,
                             TensorId(6))
        .value();
  };
  RelativeConverter a, b;
  const Operation ln1 = a.relativize(layer_norm(1e-5));
  const Operation ln2 = b.relativize(layer_norm(1e-6));
  EXPECT_TRUE(ln1.scalars.empty());
  EXPECT_EQ(ln1.attrs, layer_norm(1e-5).attrs);
  EXPECT_FALSE(ln1 == ln2);
  a.clear(), b.clear();
  const Operation bn1 = a.relativize(batch_norm(1e-5));
  const Operation bn2 = b.relativize(batch_norm(1e-3));
  ASSERT_EQ(bn1.scalars.size(), 1u);
  EXPECT_EQ(bn1.scalars[0], ScalarIr::UInt(0));
  EXPECT_TRUE(bn1 == bn2);
  ASSERT_EQ(a.scalars().size(), 1u);
  EXPECT_EQ(a.scalars()[0], ScalarIr::Float(1e-5));
  EXPECT_EQ(b.scalars()[0], ScalarIr::Float(1e-3));
}

}  // namespace
}  // namespace kiln::ir
