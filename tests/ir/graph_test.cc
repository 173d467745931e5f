// GraphIr classification (docs/spec/ir.md §7, vectors §12.1) and cached-graph bindings (docs/spec/ir.md §8, §12.2).
#include "kiln/ir/graph.h"
#include "kiln/testing/status.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

namespace kiln::ir {
namespace {

using dtypes::f32;

constexpr auto RO = TensorStatus::ReadOnly;
constexpr auto RW = TensorStatus::ReadWrite;
constexpr auto NI = TensorStatus::NotInit;

// docs/spec/ir.md §12.1: t(id) = TensorIr::uninit(id, [1], f32).
TensorIr t(std::uint64_t id) { return TensorIr::uninit(TensorId(id), Shape{1}, f32); }
TensorIr T(std::uint64_t id, Shape shape, TensorStatus status = NI, DType dtype = f32) {
  return TensorIr{TensorId(id), std::move(shape), status, dtype};
}

Operation make(OpKind kind, Family family, std::vector<TensorIr> ins, std::vector<TensorIr> outs,
               std::vector<ScalarIr> scalars = {}) {
  Operation op;
  op.kind = kind;
  op.family = family;
  op.num_inputs = static_cast<std::uint8_t>(ins.size());
  for (auto& x : ins) op.tensors.push_back(std::move(x));
  for (auto& x : outs) op.tensors.push_back(std::move(x));
  for (const auto& s : scalars) op.scalars.push_back(s);
  return op;
}
Operation custom(std::string name, std::vector<TensorIr> ins, std::vector<TensorIr> outs,
                 std::vector<ScalarIr> scalars = {}) {
  Operation op = make(OpKind::Custom_Custom, Family::Custom, std::move(ins), std::move(outs), std::move(scalars));
  op.custom_id = std::move(name);
  return op;
}
Operation drop(TensorIr x) {
  x.status = RW;
  return make(OpKind::Drop_Drop, Family::Drop, {std::move(x)}, {});
}
Operation init(TensorIr out) { return make(OpKind::Init_Init, Family::Init, {}, {std::move(out)}); }
Operation unary(OpKind kind, TensorIr in, TensorIr out) {
  return make(kind, Family::Float, {std::move(in)}, {std::move(out)});
}
TensorIr with(TensorIr x, TensorStatus s) {
  x.status = s;
  return x;
}

std::vector<TensorId> ids(std::initializer_list<std::uint64_t> v) {
  std::vector<TensorId> out;
  for (auto x : v) out.emplace_back(x);
  return out;
}

// ---- docs/spec/ir.md §12.1

TEST(GraphIrVectors, Item1FirstUseOrder) {
  GraphIr g({custom("first", {t(9), t(3)}, {t(5)}), custom("second", {t(5)}, {t(7)}), drop(t(5))});
  EXPECT_EQ(g.inputs, ids({9, 3}));
  EXPECT_EQ(g.outputs, ids({7}));
  EXPECT_EQ(g.size(), 3u);
  EXPECT_FALSE(g.empty());
}

TEST(GraphIrVectors, Item2Deterministic) {
  GraphIr a({custom("op", {t(4), t(2), t(4)}, {t(8)})});
  GraphIr b({custom("op", {t(4), t(2), t(4)}, {t(8)})});
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.inputs, ids({4, 2}));
  EXPECT_EQ(a.outputs, ids({8}));
}

TEST(GraphIrVectors, Item3ClassifyEqualsNew) {
  std::vector<Operation> ops = {custom("first", {t(4), t(2)}, {t(8)}), custom("second", {t(8)}, {t(9)})};
  const GraphBoundary b = classify(ops);
  GraphIr g(ops);
  EXPECT_EQ(b.inputs, ids({4, 2}));
  EXPECT_EQ(b.outputs, ids({8, 9}));
  EXPECT_EQ(g.inputs, b.inputs);
  EXPECT_EQ(g.outputs, b.outputs);
}

TEST(GraphIrVectors, Item4InitDoesNotProduce) {
  GraphIr g({init(t(1)), unary(OpKind::Float_Exp, with(t(1), RW), t(2))});
  EXPECT_EQ(g.inputs, ids({1}));
  EXPECT_EQ(g.outputs, ids({2}));
}

TEST(GraphIrVectors, Item5ReadWriteConsumes) {
  GraphIr g({unary(OpKind::Float_Exp, with(t(1), RO), t(2)), unary(OpKind::Float_Log, with(t(2), RW), t(3))});
  EXPECT_EQ(g.inputs, ids({1}));
  EXPECT_EQ(g.outputs, ids({3}));
}

TEST(GraphIrVectors, Item6DropOfUnproducedTensor) {
  GraphIr g({drop(t(4))});
  EXPECT_EQ(g.inputs, ids({4}));
  EXPECT_TRUE(g.outputs.empty());
}

TEST(GraphIr, EmptyGraph) {
  GraphIr g(std::vector<Operation>{});
  EXPECT_TRUE(g.empty());
  EXPECT_TRUE(g.inputs.empty());
  EXPECT_TRUE(g.outputs.empty());
  EXPECT_EQ(classify({}), GraphBoundary{});
}

TEST(GraphIr, InPlaceOpConsumesAndProduces) {
  // Log(t0 RW -> t0): t0 is read (so it is an input) and produced again; the later read keeps it.
  GraphIr g({unary(OpKind::Float_Log, with(t(0), RW), t(0))});
  EXPECT_TRUE(g.inputs.empty());   // produced by a compute op
  EXPECT_TRUE(g.outputs.empty());  // consumed by its ReadWrite use
}

TEST(GraphIr, MalformedOpDoesNotCrashClassify) {
  Operation bad = custom("bad", {t(1)}, {t(2)});
  bad.num_inputs = 9;  // more inputs than tensors
  GraphIr g({bad});
  EXPECT_EQ(g.inputs, ids({1, 2}));
  EXPECT_TRUE(g.outputs.empty());
}

// ---- IntermediateIdSource

TEST(IntermediateIdSource, Bit63AndUnique) {
  IntermediateIdSource src;
  std::set<std::uint64_t> seen;
  for (int i = 0; i < 100; ++i) {
    const TensorId id = src.next();
    EXPECT_TRUE(IntermediateIdSource::is_intermediate(id));
    EXPECT_TRUE(seen.insert(id.value()).second);
  }
  EXPECT_EQ(src.issued(), 100u);
  EXPECT_FALSE(IntermediateIdSource::is_intermediate(TensorId(42)));
  // Sources are objects: a new one starts fresh.
  IntermediateIdSource other;
  EXPECT_EQ(other.next(), TensorId(IntermediateIdSource::kIntermediateBit));
}

// ---- docs/spec/ir.md §12.2

// Slice(t0[0,1] -> t1[0,1], ranges [Slice(0, none, 1)]), custom("bound", [t1], [t2], [UInt(0)]).
GraphIr slice_then_custom() {
  Operation slice = make(OpKind::Base_Slice, Family::BaseFloat, {T(0, {0, 1}, RO)}, {T(1, {0, 1})});
  slice.ranges.push_back(Slice{0, std::nullopt, 1});
  return GraphIr({slice, custom("bound", {T(1, {0, 1}, RW)}, {T(2, {0, 1})}, {ScalarIr::UInt(0)})});
}

TEST(GraphBindingVectors, Item1BindSliceAndCustom) {
  const GraphIr graph = slice_then_custom();
  GraphBindings b;
  b.tensors = {{TensorId(0), TensorId(100)}, {TensorId(2), TensorId(102)}};
  b.shapes = {4, 8};
  b.scalars = {ScalarIr::Int(12)};
  b.ranges = {Slice{2, 8, 2}};
  IntermediateIdSource src;
  auto bound = bind(graph, b, src);
  ASSERT_TRUE(bound.ok()) << bound.error().to_string();
  const Operation& s = bound->operations[0];
  const Operation& c = bound->operations[1];
  EXPECT_EQ(s.tensors[0].id, TensorId(100));
  EXPECT_EQ(s.tensors[0].shape, (Shape{4, 8}));
  ASSERT_EQ(s.ranges.size(), 1u);
  EXPECT_EQ(s.ranges[0], (Slice{2, 8, 2}));
  EXPECT_EQ(s.tensors[1].id, c.tensors[0].id);
  EXPECT_NE(s.tensors[1].id, TensorId(1));
  EXPECT_TRUE(IntermediateIdSource::is_intermediate(s.tensors[1].id));
  EXPECT_EQ(c.tensors[1].id, TensorId(102));
  ASSERT_EQ(c.scalars.size(), 1u);
  EXPECT_EQ(c.scalars[0], ScalarIr::Int(12));
  EXPECT_EQ(c.custom_id, "bound");
  EXPECT_EQ(bound->inputs, ids({100}));
  EXPECT_NE(std::find(bound->outputs.begin(), bound->outputs.end(), TensorId(102)), bound->outputs.end());
  // The relative graph itself is untouched.
  EXPECT_EQ(graph, slice_then_custom());
}

TEST(GraphBindingVectors, Item2IntermediatesFreshPerBinding) {
  const GraphIr graph({custom("first", {T(0, {0}, RO)}, {T(1, {0})}), custom("second", {T(1, {0}, RW)}, {T(2, {0})})});
  IntermediateIdSource src;
  GraphBindings b1{{{TensorId(0), TensorId(10)}, {TensorId(2), TensorId(12)}}, {2}, {}, {}};
  GraphBindings b2{{{TensorId(0), TensorId(20)}, {TensorId(2), TensorId(22)}}, {2}, {}, {}};
  auto g1 = bind(graph, b1, src);
  auto g2 = bind(graph, b2, src);
  KILN_ASSERT_OK(g1);
  KILN_ASSERT_OK(g2);
  const TensorId i1 = g1->operations[0].tensors[1].id;
  const TensorId i2 = g2->operations[0].tensors[1].id;
  EXPECT_EQ(i1, g1->operations[1].tensors[0].id);
  EXPECT_EQ(i2, g2->operations[1].tensors[0].id);
  EXPECT_NE(i1, i2);
  EXPECT_EQ(g1->operations[0].tensors[0].id, TensorId(10));
  EXPECT_EQ(g2->operations[1].tensors[1].id, TensorId(22));
  EXPECT_EQ(g1->operations[0].tensors[0].shape, (Shape{2}));
  EXPECT_EQ(g1->inputs, ids({10}));
  EXPECT_EQ(g1->outputs, ids({12}));
}

// ---- bind: out-of-range tables and malformed bindings

TEST(GraphBind, OutOfRangePlaceholdersStayAsTheyAre) {
  Operation slice = make(OpKind::Base_Slice, Family::BaseFloat, {T(0, {0, 5}, RO)}, {T(1, {0, 7})});
  slice.ranges.push_back(Slice{0, std::nullopt, 1});
  slice.ranges.push_back(Slice{3, std::nullopt, 1});   // beyond the ranges table
  slice.ranges.push_back(Slice{-1, std::nullopt, 1});  // not an index
  Operation clamp = make(OpKind::Numeric_Clamp, Family::NumericFloat, {T(1, {0, 7}, RW)}, {T(2, {0, 7})},
                         {ScalarIr::UInt(0), ScalarIr::UInt(9)});
  Operation scalar_kept = custom("k", {T(2, {0, 7}, RW)}, {T(3, {1})}, {ScalarIr::Float(0.5)});
  const GraphIr graph({slice, clamp, scalar_kept});
  GraphBindings b;
  b.shapes = {16};
  b.scalars = {ScalarIr::Float(-1.0)};
  b.ranges = {Slice{1, 3, 1}};
  IntermediateIdSource src;
  auto bound = bind(graph, b, src);
  ASSERT_TRUE(bound.ok()) << bound.error().to_string();
  const auto& ops = bound->operations;
  EXPECT_EQ(ops[0].tensors[0].shape, (Shape{16, 5}));
  EXPECT_EQ(ops[0].tensors[1].shape, (Shape{16, 7}));
  EXPECT_EQ(ops[0].ranges[0], (Slice{1, 3, 1}));
  EXPECT_EQ(ops[0].ranges[1], (Slice{3, std::nullopt, 1}));
  EXPECT_EQ(ops[0].ranges[2], (Slice{-1, std::nullopt, 1}));
  EXPECT_EQ(ops[1].scalars[0], ScalarIr::Float(-1.0));
  EXPECT_EQ(ops[1].scalars[1], ScalarIr::UInt(9));
  EXPECT_EQ(ops[2].scalars[0], ScalarIr::Float(0.5));  // not a placeholder
  EXPECT_EQ(ops[2].tensors[1].shape, (Shape{1}));      // dim id 1 >= len(shapes): kept
  // Every tensor was unbound: all fresh intermediate ids.
  for (const Operation& op : ops)
    for (const TensorIr& x : op.tensors) EXPECT_TRUE(IntermediateIdSource::is_intermediate(x.id));
}

TEST(GraphBind, EmptyBindingsAndEmptyGraph) {
  IntermediateIdSource src;
  auto g = bind(GraphIr{}, GraphBindings{}, src);
  KILN_ASSERT_OK(g);
  EXPECT_TRUE(g->empty());
  auto h = bind(slice_then_custom(), GraphBindings{}, src);
  KILN_ASSERT_OK(h);
  EXPECT_EQ(h->operations[0].tensors[0].shape, (Shape{0, 1}));  // no shapes table: dims as they are
}

TEST(GraphBind, MalformedBindingsAreErrors) {
  const GraphIr graph = slice_then_custom();
  IntermediateIdSource src;
  GraphBindings twice{{{TensorId(0), TensorId(100)}, {TensorId(0), TensorId(101)}}, {4, 8}, {}, {}};
  auto r1 = bind(graph, twice, src);
  ASSERT_FALSE(r1.ok());
  EXPECT_EQ(r1.error().code, ErrorCode::Invalid);

  GraphBindings reserved{{{TensorId(0), TensorId(IntermediateIdSource::kIntermediateBit | 5)}}, {}, {}, {}};
  auto r2 = bind(graph, reserved, src);
  ASSERT_FALSE(r2.ok());
  EXPECT_EQ(r2.error().code, ErrorCode::Invalid);

  GraphBindings aliased{{{TensorId(0), TensorId(100)}, {TensorId(2), TensorId(100)}}, {}, {}, {}};
  auto r3 = bind(graph, aliased, src);
  ASSERT_FALSE(r3.ok());
  EXPECT_EQ(r3.error().code, ErrorCode::Invalid);
  EXPECT_EQ(src.issued(), 0u);  // rejected before anything was bound
}

TEST(GraphBind, MalformedGraphIsAnError) {
  IntermediateIdSource src;
  Operation bad = custom("bad", {t(1)}, {t(2)});
  bad.num_inputs = 200;
  GraphIr g1;
  g1.operations = {bad};
  auto r1 = bind(g1, GraphBindings{}, src);
  ASSERT_FALSE(r1.ok());
  EXPECT_EQ(r1.error().code, ErrorCode::Invalid);

  Operation unknown = custom("x", {t(1)}, {t(2)});
  unknown.kind = static_cast<OpKind>(60000);
  unknown.custom_id.clear();
  GraphIr g2;
  g2.operations = {unknown};
  auto r2 = bind(g2, GraphBindings{}, src);
  ASSERT_FALSE(r2.ok());
  EXPECT_EQ(r2.error().code, ErrorCode::Invalid);
}

TEST(GraphBind, NonPlaceholderScalarKindsStay) {
  const GraphIr graph({custom("s", {T(0, {0}, RO)}, {T(1, {0})}, {ScalarIr::Int(0), ScalarIr::Bool(false)})});
  GraphBindings b;
  b.scalars = {ScalarIr::Float(7.0)};
  IntermediateIdSource src;
  auto g = bind(graph, b, src);
  KILN_ASSERT_OK(g);
  EXPECT_EQ(g->operations[0].scalars[0], ScalarIr::Int(0));
  EXPECT_EQ(g->operations[0].scalars[1], ScalarIr::Bool(false));
}

// ---- replay

TEST(GraphReplay, VisitsBoundOpsInOrder) {
  const GraphIr graph = slice_then_custom();
  GraphBindings b{
      {{TensorId(0), TensorId(100)}, {TensorId(2), TensorId(102)}}, {4, 8}, {ScalarIr::Int(12)}, {Slice{2, 8, 2}}};
  IntermediateIdSource s1, s2;  // two fresh sources hand out the same ids
  auto bound = bind(graph, b, s1);
  KILN_ASSERT_OK(bound);
  std::vector<Operation> seen;
  Status st = replay(graph, b, s2, [&](const Operation& op) {
    seen.push_back(op);
    return Status::Ok();
  });
  KILN_ASSERT_OK(st);
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].kind, OpKind::Base_Slice);
  EXPECT_EQ(seen[1].custom_id, "bound");
  EXPECT_EQ(seen, bound->operations);
}

TEST(GraphReplay, VisitorErrorStops) {
  const GraphIr graph = slice_then_custom();
  IntermediateIdSource src;
  int calls = 0;
  Status st = replay(graph, GraphBindings{}, src, [&](const Operation&) -> Status {
    ++calls;
    return make_error(ErrorCode::Execution, "kernel failed");
  });
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ErrorCode::Execution);
  EXPECT_EQ(calls, 1);
}

TEST(GraphReplay, BadBindingsVisitNothing) {
  IntermediateIdSource src;
  int calls = 0;
  GraphBindings twice{{{TensorId(0), TensorId(1)}, {TensorId(0), TensorId(2)}}, {}, {}, {}};
  Status st = replay(slice_then_custom(), twice, src, [&](const Operation&) {
    ++calls;
    return Status::Ok();
  });
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(calls, 0);
}

// ---- client side: bindings from a converter, then bound on the server (docs/spec/fusion.md §3.11 segment)

TEST(GraphClientBindings, RoundTripThroughConverter) {
  const Shape sh{64, 32};
  auto mul = [](TensorIr a, TensorIr b2, TensorIr out) {
    return make(OpKind::Numeric_Mul, Family::NumericFloat, {std::move(a), std::move(b2)}, {std::move(out)});
  };
  std::vector<Operation> global = {
      mul(T(1, sh, RO), T(2, sh, RO), T(4, sh)),
      make(OpKind::Numeric_MulScalar, Family::NumericFloat, {T(3, sh, RO)}, {T(5, sh)}, {ScalarIr::Float(2.0)}),
      make(OpKind::Numeric_Add, Family::NumericFloat, {T(4, sh, RW), T(5, sh, RW)}, {T(6, sh)}),
      unary(OpKind::Float_Exp, T(6, sh, RW), T(7, sh)),
  };
  RelativeConverter conv;
  std::vector<Operation> rel;
  for (const Operation& op : global) rel.push_back(conv.relativize(op));
  const GraphIr graph(rel);
  EXPECT_EQ(graph.inputs, ids({0, 1, 3}));
  EXPECT_EQ(graph.outputs, ids({6}));

  // Global tensors 1 and 3 have server handles 901 and 903; tensor 2 has none yet.
  const std::map<std::uint64_t, std::uint64_t> handles = {{1, 901}, {3, 903}};
  std::uint64_t next_concrete = 5000;
  ClientBindings cb = make_bindings(
      graph, conv,
      [&](const TensorIr& g) -> std::optional<TensorId> {
        auto it = handles.find(g.id.value());
        if (it == handles.end()) return std::nullopt;
        return TensorId(it->second);
      },
      [&] { return TensorId(next_concrete++); });
  const std::vector<TensorBinding> expected_tensors = {
      {TensorId(0), TensorId(901)}, {TensorId(3), TensorId(903)}, {TensorId(6), TensorId(5000)}};
  EXPECT_EQ(cb.bindings.tensors, expected_tensors);
  EXPECT_EQ(cb.bindings.shapes, (std::vector<std::uint64_t>{1, 64, 32}));
  EXPECT_EQ(cb.bindings.scalars, (std::vector<ScalarIr>{ScalarIr::Float(2.0)}));
  EXPECT_TRUE(cb.bindings.ranges.empty());
  ASSERT_EQ(cb.outputs.size(), 1u);
  EXPECT_EQ(cb.outputs[0].relative, TensorId(6));
  EXPECT_EQ(cb.outputs[0].global, T(7, sh));
  EXPECT_EQ(cb.outputs[0].concrete, TensorId(5000));

  IntermediateIdSource src;
  auto bound = bind(graph, cb.bindings, src);
  ASSERT_TRUE(bound.ok()) << bound.error().to_string();
  const auto& ops = bound->operations;
  EXPECT_EQ(ops[0].tensors[0], T(901, sh, RO));
  EXPECT_TRUE(IntermediateIdSource::is_intermediate(ops[0].tensors[1].id));  // relative 1: no handle
  EXPECT_EQ(ops[1].tensors[0], T(903, sh, RO));
  EXPECT_EQ(ops[1].scalars[0], ScalarIr::Float(2.0));
  EXPECT_EQ(ops[2].tensors[0].id, ops[0].tensors[2].id);
  EXPECT_EQ(ops[2].tensors[1].id, ops[1].tensors[1].id);
  EXPECT_EQ(ops[3].tensors[1], T(5000, sh));
  for (std::size_t i = 0; i < ops.size(); ++i) {
    EXPECT_EQ(ops[i].kind, global[i].kind);
    for (std::size_t k = 0; k < ops[i].tensors.size(); ++k) {
      EXPECT_EQ(ops[i].tensors[k].shape, global[i].tensors[k].shape);
      EXPECT_EQ(ops[i].tensors[k].status, global[i].tensors[k].status);
    }
  }
  EXPECT_EQ(bound->outputs, ids({5000}));
}

TEST(GraphClientBindings, UnknownRelativeIdsSkipped) {
  RelativeConverter conv;  // knows no tensors
  const GraphIr graph({custom("c", {T(0, {0}, RO)}, {T(1, {0})})});
  int new_ids = 0;
  ClientBindings cb = make_bindings(
      graph, conv, [](const TensorIr&) { return std::optional<TensorId>(TensorId(1)); },
      [&] {
        ++new_ids;
        return TensorId(7);
      });
  EXPECT_TRUE(cb.bindings.tensors.empty());
  EXPECT_TRUE(cb.outputs.empty());
  EXPECT_EQ(new_ids, 0);
  EXPECT_EQ(cb.bindings.shapes, (std::vector<std::uint64_t>{1}));
}

}  // namespace
}  // namespace kiln::ir
