// Host side of launches, without a GPU: accessors over broadcasting, views, NHWC outputs and
// merged dims; reduction and matmul shapes; scalar conversion; vector eligibility; argument
// packing against the generated parameter lists; single-op programs.
#include <gtest/gtest.h>

#include <cstring>

#include "kiln/cuda/launch.h"
#include "kiln/cuda/single_op.h"
#include "kiln/testing/status.h"
#include "programs.h"

namespace kiln::cuda {
namespace {

using namespace testing;

SingleOpProgram single(Result<Operation> op) {
  KILN_EXPECT_OK(op);
  std::optional<SingleOpProgram> s = single_op_program(*op);
  EXPECT_TRUE(s.has_value());
  return std::move(*s);
}

ir::Shape ref_of(const SingleOpProgram& s, std::uint32_t block = 0) {
  Result<ir::Shape> r = concrete_shape(s.program.blocks[block].reference_shape, s.binding());
  KILN_EXPECT_OK(r);
  return *r;
}

TEST(Launch, ContiguousElementwiseMergesIntoOneDim) {
  const SingleOpProgram s = single(b::binary(
      Family::NumericFloat, OpKind::Numeric_Add, TensorIr{TensorId{1}, {4, 5, 6}, TensorStatus::ReadOnly, dt::f32},
      TensorIr{TensorId{2}, {4, 5, 6}, TensorStatus::ReadOnly, dt::f32}, TensorId{3}));
  Result<BlockLayout> l = block_layout(s.program, 0, s.binding(), ref_of(s), /*merge=*/true);
  ASSERT_TRUE(l.ok()) << l.error().message;
  EXPECT_EQ(l->iter.rank, 1);
  EXPECT_EQ(l->iter.dims[0], 120);
  EXPECT_EQ(l->iter.numel, 120);
  EXPECT_EQ(l->iter.contiguous, 1);
  EXPECT_TRUE(l->vectorizable);
  ASSERT_EQ(l->loads.size(), 2u);
  EXPECT_EQ(l->loads[0].strides[0], 1);
  EXPECT_EQ(l->stores[0].contiguous, 1);
  // Unmerged: row-major strides of [4,5,6].
  l = block_layout(s.program, 0, s.binding(), ref_of(s), /*merge=*/false);
  KILN_ASSERT_OK(l);
  EXPECT_EQ(l->iter.rank, 3);
  EXPECT_EQ(l->loads[1].strides[0], 30);
  EXPECT_EQ(l->loads[1].strides[1], 6);
  EXPECT_EQ(l->loads[1].strides[2], 1);
}

TEST(Launch, BroadcastInputsGetZeroStrides) {
  const SingleOpProgram s = single(b::binary(
      Family::NumericFloat, OpKind::Numeric_Add, TensorIr{TensorId{1}, {4, 1}, TensorStatus::ReadOnly, dt::f32},
      TensorIr{TensorId{2}, {1, 5}, TensorStatus::ReadOnly, dt::f32}, TensorId{3}));
  Result<BlockLayout> l = block_layout(s.program, 0, s.binding(), ref_of(s), true);
  ASSERT_TRUE(l.ok()) << l.error().message;
  EXPECT_EQ(l->iter.rank, 2);
  EXPECT_EQ(l->iter.contiguous, 0);
  EXPECT_FALSE(l->vectorizable);
  EXPECT_EQ(l->loads[0].strides[0], 1);
  EXPECT_EQ(l->loads[0].strides[1], 0);
  EXPECT_EQ(l->loads[1].strides[0], 0);
  EXPECT_EQ(l->loads[1].strides[1], 1);
  EXPECT_EQ(l->loads[0].contiguous, 0);
  EXPECT_EQ(l->stores[0].contiguous, 1);

  // A one-element broadcast keeps the vector kernel.
  const SingleOpProgram t = single(b::binary(
      Family::NumericFloat, OpKind::Numeric_Mul, TensorIr{TensorId{1}, {8, 16}, TensorStatus::ReadOnly, dt::f32},
      TensorIr{TensorId{2}, {1, 1}, TensorStatus::ReadOnly, dt::f32}, TensorId{3}));
  l = block_layout(t.program, 0, t.binding(), ref_of(t), true);
  KILN_ASSERT_OK(l);
  EXPECT_TRUE(l->vectorizable);
  EXPECT_EQ(l->iter.rank, 1);
  EXPECT_EQ(l->loads[1].strides[0], 0);
}

TEST(Launch, SwapDimsAndPermuteViews) {
  const SingleOpProgram s =
      single(b::swap_dims(Family::BaseFloat, OpKind::Base_SwapDims,
                          TensorIr{TensorId{1}, {3, 4, 5}, TensorStatus::ReadOnly, dt::f32}, 0, 2, TensorId{2}));
  Result<BlockLayout> l = block_layout(s.program, 0, s.binding(), ref_of(s), false);
  ASSERT_TRUE(l.ok()) << l.error().message;
  ASSERT_EQ(l->iter.rank, 3);
  EXPECT_EQ(l->iter.dims[0], 5);
  // Source [3,4,5] strides [20,5,1], swapped to [1,5,20].
  EXPECT_EQ(l->loads[0].strides[0], 1);
  EXPECT_EQ(l->loads[0].strides[1], 5);
  EXPECT_EQ(l->loads[0].strides[2], 20);
  EXPECT_EQ(l->loads[0].contiguous, 0);

  const std::uint64_t axes[] = {2, 0, 1};
  const SingleOpProgram p =
      single(b::permute(Family::BaseFloat, OpKind::Base_Permute,
                        TensorIr{TensorId{1}, {3, 4, 5}, TensorStatus::ReadOnly, dt::f32}, axes, TensorId{2}));
  ASSERT_TRUE(p.permute_axes.has_value());
  EXPECT_EQ(*p.permute_axes, (std::vector<std::uint64_t>{2, 0, 1}));
  EXPECT_EQ(p.program.kind, fusion::ProgramKind::Elementwise);
}

TEST(Launch, NhwcOutputsAndMaskedBroadcastStores) {
  // A program with an NHWC-laid-out output: strides follow the permutation.
  SingleOpProgram s =
      single(b::unary(Family::Float, OpKind::Float_Exp,
                      TensorIr{TensorId{1}, {2, 3, 4, 5}, TensorStatus::ReadOnly, dt::f32}, TensorId{2}));
  s.program.outputs[0].layout = fusion::Permutation{0, 3, 1, 2};
  Result<BlockLayout> l = block_layout(s.program, 0, s.binding(), ref_of(s), false);
  ASSERT_TRUE(l.ok()) << l.error().message;
  // NHWC of [N=2,C=3,H=4,W=5]: strides N 60, C 1, H 15, W 3.
  EXPECT_EQ(l->stores[0].strides[0], 60);
  EXPECT_EQ(l->stores[0].strides[1], 1);
  EXPECT_EQ(l->stores[0].strides[2], 15);
  EXPECT_EQ(l->stores[0].strides[3], 3);
  EXPECT_EQ(l->stores[0].contiguous, 0);
  EXPECT_EQ(l->iter.contiguous, 0);

  // A broadcast output (the program keeps a [4,1] value over a [4,5] reference): masked.
  SingleOpProgram m = single(b::binary(Family::NumericFloat, OpKind::Numeric_Add,
                                       TensorIr{TensorId{1}, {4, 5}, TensorStatus::ReadOnly, dt::f32},
                                       TensorIr{TensorId{2}, {4, 1}, TensorStatus::ReadOnly, dt::f32}, TensorId{3}));
  m.tensors[m.program.outputs[0].tensor].shape = {4, 1};
  l = block_layout(m.program, 0, m.binding(), ref_of(m), true);
  ASSERT_TRUE(l.ok()) << l.error().message;
  EXPECT_EQ(l->stores[0].masked, 1);
  EXPECT_EQ(l->stores[0].contiguous, 0);
  EXPECT_FALSE(l->vectorizable);
}

TEST(Launch, ShapesThatDoNotBroadcastAreErrors) {
  SingleOpProgram s = single(b::binary(Family::NumericFloat, OpKind::Numeric_Add,
                                       TensorIr{TensorId{1}, {4, 5}, TensorStatus::ReadOnly, dt::f32},
                                       TensorIr{TensorId{2}, {4, 5}, TensorStatus::ReadOnly, dt::f32}, TensorId{3}));
  s.tensors[s.program.inputs[1].tensor].shape = {3, 5};
  Result<BlockLayout> l = block_layout(s.program, 0, s.binding(), ref_of(s), true);
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.error().code, ErrorCode::IncompatibleShapes);
}

TEST(Launch, ReduceShapes) {
  const SingleOpProgram s =
      single(b::reduce_dim(Family::NumericFloat, OpKind::Numeric_SumDim,
                           TensorIr{TensorId{1}, {6, 7, 8}, TensorStatus::ReadOnly, dt::f32}, 1, 1, TensorId{2}));
  Result<KilnReduceShape> r = reduce_shape(s.program, s.binding());
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->outer, 6);
  EXPECT_EQ(r->n, 7);
  EXPECT_EQ(r->inner, 8);
  EXPECT_EQ(r->outputs, 48);
  // A whole-tensor reduction reads a [n] view.
  const SingleOpProgram f =
      single(b::reduce(Family::NumericFloat, OpKind::Numeric_Sum,
                       TensorIr{TensorId{1}, {6, 7}, TensorStatus::ReadOnly, dt::f32}, TensorId{2}));
  r = reduce_shape(f.program, f.binding());
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->outer, 1);
  EXPECT_EQ(r->n, 42);
  EXPECT_EQ(r->inner, 1);
}

TEST(Launch, MatmulShapesWithBroadcastBatches) {
  Result<KilnMatmulShape> m = matmul_shape({2, 3, 8, 16}, {1, 3, 16, 4}, {2, 3, 8, 4});
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_EQ(m->m, 8);
  EXPECT_EQ(m->n, 4);
  EXPECT_EQ(m->k, 16);
  EXPECT_EQ(m->batch, 6);
  EXPECT_EQ(m->batch_rank, 2);
  EXPECT_EQ(m->lhs_batch[0], 3 * 128);
  EXPECT_EQ(m->lhs_batch[1], 128);
  EXPECT_EQ(m->rhs_batch[0], 0);
  EXPECT_EQ(m->rhs_batch[1], 64);
  EXPECT_FALSE(matmul_shape({8, 16}, {15, 4}, {8, 4}).ok());
}

TEST(Launch, ScalarsConvertLikeTheReference) {
  auto f32 = [](const ScalarArg& a) {
    float v;
    std::memcpy(&v, a.bytes.data(), 4);
    return v;
  };
  auto i64 = [](const ScalarArg& a) {
    std::int64_t v;
    std::memcpy(&v, a.bytes.data(), 8);
    return v;
  };
  // 0.1 rounded to f16 (0.0999755859375), passed as a float.
  ScalarArg a = scalar_arg(ScalarIr::Float(0.1), ScalarSlot{0, dt::f16, ScalarClass::F32});
  EXPECT_EQ(a.size, 4u);
  EXPECT_EQ(f32(a), 0.0999755859375f);
  // Float to i8: truncated and saturated.
  a = scalar_arg(ScalarIr::Float(300.7), ScalarSlot{0, dt::i8, ScalarClass::I64});
  EXPECT_EQ(a.size, 8u);
  EXPECT_EQ(i64(a), 127);
  a = scalar_arg(ScalarIr::Float(-2.9), ScalarSlot{0, dt::i32, ScalarClass::I64});
  EXPECT_EQ(i64(a), -2);
  a = scalar_arg(ScalarIr::Bool(true), ScalarSlot{0, dt::boolean, ScalarClass::Bool});
  EXPECT_EQ(a.size, 4u);
  EXPECT_EQ(a.bytes[0], std::byte{1});
}

TEST(Launch, PackedArgumentsFollowTheParameterLists) {
  for (const NamedProgram& p : single_op_catalog()) {
    if (fusion::is_staged(p.program.kind)) continue;
    Result<GeneratedProgram> g = generate(p.program);
    ASSERT_TRUE(g.ok()) << p.name;
    StageArgs args;
    args.blocks.resize(p.program.blocks.size());
    for (std::uint32_t b = 0; b < p.program.blocks.size(); ++b) {
      args.blocks[b].loads.resize(p.program.blocks[b].loads.size());
      args.blocks[b].stores.resize(p.program.blocks[b].stores.size());
    }
    args.inputs.assign(p.program.inputs.size(), 0x1000);
    args.outputs.assign(p.program.outputs.size(), 0x2000);
    args.indexed.resize(p.program.inputs.size());
    for (const ScalarSlot& s : g->scalars) args.scalars.push_back(scalar_arg(ScalarIr::Float(1), s));
    for (const KernelSpec& k : g->kernels) {
      Result<ArgPack> pack = pack_args(k, args);
      ASSERT_TRUE(pack.ok()) << p.name << " " << k.name << ": " << pack.error().message;
      ASSERT_EQ(pack->size(), k.params.size());
      for (std::size_t i = 0; i < k.params.size(); ++i) {
        std::size_t want = 0;
        switch (k.params[i].kind) {
          case ParamKind::Iter: want = sizeof(KilnIter); break;
          case ParamKind::LoadAccess:
          case ParamKind::StoreAccess: want = sizeof(KilnAccess); break;
          case ParamKind::InputPtr:
          case ParamKind::OutputPtr:
          case ParamKind::Fault: want = sizeof(void*); break;
          case ParamKind::Indexed: want = sizeof(KilnIndexed); break;
          case ParamKind::Scalar: want = scalar_class_size(g->scalars[k.params[i].index].cls); break;
          case ParamKind::ReduceShape: want = sizeof(KilnReduceShape); break;
          case ParamKind::MatmulShape: want = sizeof(KilnMatmulShape); break;
          case ParamKind::RowWindowBytes:
          case ParamKind::Rows:
          case ParamKind::RowLength: want = sizeof(std::int64_t); break;
        }
        EXPECT_EQ(pack->bytes(i), want) << p.name << " param " << i;
      }
    }
  }
  StageArgs empty;
  KernelSpec k;
  k.params.push_back(KernelParam{ParamKind::InputPtr, 0, 3});
  EXPECT_FALSE(pack_args(k, empty).ok());
}

// The Row kernel's [rows, n] space: every Row program of the catalog runs as one kernel at its
// capture's sizes; a later stage reading an earlier stage's output other than element by element
// in its own row (an indexed read, a shape that spans rows) keeps the stages apart.
TEST(Launch, RowSpaceOfTheCatalogsRowPrograms) {
  int seen = 0;
  for (const NamedProgram& p : fused_catalog()) {
    if (p.program.kind != fusion::ProgramKind::Row) continue;
    ++seen;
    Result<RowSpace> space = row_space(p.program, p.binding());
    ASSERT_TRUE(space.ok()) << p.name << ": " << space.error().message;
    Result<ir::Shape> full = concrete_shape(p.program.stages[0].blocks[0].reference_shape, p.binding());
    KILN_ASSERT_OK(full);
    EXPECT_EQ(space->n, static_cast<std::int64_t>(full->back())) << p.name;
    EXPECT_EQ(space->rows * space->n, static_cast<std::int64_t>(ir::num_elements(*full))) << p.name;
    if (p.name == "f32 layer-norm") {
      EXPECT_EQ(space->rows, 32);  // [4, 8, 64]: rows are the leading dims
      EXPECT_EQ(space->n, 64);
    }

    // The first input of a later stage that an earlier stage wrote.
    std::size_t stage = 0, input = 0;
    for (std::size_t k = 1; k < p.program.stages.size() && stage == 0; ++k)
      for (std::size_t i = 0; i < p.program.stages[k].inputs.size() && stage == 0; ++i)
        for (const fusion::ProgramOutput& o : p.program.stages[0].outputs)
          if (o.written && o.tensor == p.program.stages[k].inputs[i].tensor) {
            stage = k;
            input = i;
          }
    ASSERT_NE(stage, 0u) << p.name << ": no stage reads what stage 0 wrote";
    fusion::FusedProgram indexed = p.program;
    indexed.stages[stage].inputs[input].role = fusion::InputRole::Indexed;
    Result<RowSpace> refused = row_space(indexed, p.binding());
    ASSERT_FALSE(refused.ok()) << p.name;
    EXPECT_EQ(refused.error().code, ErrorCode::Unsupported);
    EXPECT_NE(refused.error().message.find("as indexed"), std::string::npos) << refused.error().message;
    NamedProgram across = p;
    across.tensors[p.program.stages[stage].inputs[input].tensor].shape = ir::Shape(full->size(), 1);
    across.tensors[p.program.stages[stage].inputs[input].tensor].shape.back() = full->back();
    refused = row_space(p.program, across.binding());
    ASSERT_FALSE(refused.ok()) << p.name;
    EXPECT_NE(refused.error().message.find("across rows"), std::string::npos) << refused.error().message;
  }
  EXPECT_GE(seen, 4 * 5) << "softmax, log-softmax, layer norm, RMS norm, cross-entropy in four dtypes";
  for (const NamedProgram& p : fused_catalog()) {
    if (p.program.kind != fusion::ProgramKind::Row) {
      EXPECT_FALSE(row_space(p.program, p.binding()).ok()) << p.name;
    }
  }
}

// A window per temporary, n elements each, rounded up to 16 bytes.
TEST(Launch, RowWindowBytes) {
  const std::vector<ir::DType> none, two = {dt::f32, dt::f16};
  EXPECT_EQ(row_window_bytes(none, 1000), 0);
  EXPECT_EQ(row_window_bytes(two, 1000), 4000 + 2000);
  EXPECT_EQ(row_window_bytes(two, 3), 16 + 16);
}

// The Row kernel's launch: a warp per row up to 1024 elements, windows in shared memory when the
// block's fit (the warp kernel with fewer warps if need be), global memory otherwise.
TEST(Launch, RowLaunchShapes) {
  const std::vector<ir::DType> none, one = {dt::f32}, two = {dt::f32, dt::f32}, f64 = {dt::f64, dt::f64};
  const std::uint64_t max = 44 * 1024;
  RowLaunch l = row_launch(none, 1024, 256, max);
  EXPECT_TRUE(l.by_warp);
  EXPECT_EQ(l.threads, 256u);
  EXPECT_EQ(l.rows_per_block, 8u);
  EXPECT_EQ(l.window_bytes, 0);
  EXPECT_EQ(l.shared, 0u);
  l = row_launch(one, 1024, 256, max);  // 8 warps x 4 KiB
  EXPECT_EQ(l.threads, 256u);
  EXPECT_EQ(l.window_bytes, 4096);
  EXPECT_EQ(l.shared, 8u * 4096);
  l = row_launch(two, 1024, 256, max);  // 8 KiB per row: 4 warps
  EXPECT_EQ(l.threads, 128u);
  EXPECT_EQ(l.rows_per_block, 4u);
  EXPECT_EQ(l.shared, 4u * 8192);
  l = row_launch(two, 1025, 256, max);  // a block per row
  EXPECT_FALSE(l.by_warp);
  EXPECT_EQ(l.threads, 256u);
  EXPECT_EQ(l.rows_per_block, 1u);
  EXPECT_EQ(l.shared, 8224u);           // 4100 bytes rounded to 4112, twice
  l = row_launch(f64, 4000, 256, max);  // 64000 bytes: global memory
  EXPECT_EQ(l.window_bytes, 0);
  EXPECT_EQ(l.shared, 0u);
  EXPECT_EQ(l.threads, 256u);
}

// The Row kernel's arguments: each parameter from its own stage's StageArgs, the row space last.
TEST(Launch, RowKernelArgumentsComeFromEachStage) {
  for (const NamedProgram& p : fused_catalog()) {
    if (p.name != "f32 layer-norm") continue;
    Result<GeneratedProgram> g = generate(p.program);
    KILN_ASSERT_OK(g);
    ASSERT_TRUE(g->row_kernel.has_value());
    const KernelSpec& k = g->kernels[*g->row_kernel];
    std::vector<StageArgs> args(p.program.stages.size());
    for (std::size_t st = 0; st < args.size(); ++st) {
      const fusion::FusedProgram& sp = p.program.stages[st];
      for (std::uint32_t blk = 0; blk < sp.blocks.size(); ++blk) {
        Result<ir::Shape> ref = concrete_shape(sp.blocks[blk].reference_shape, p.binding());
        KILN_ASSERT_OK(ref);
        Result<BlockLayout> l = block_layout(sp, blk, p.binding(), *ref, true);
        ASSERT_TRUE(l.ok()) << l.error().message;
        args[st].blocks.push_back(*l);
      }
      args[st].inputs.assign(sp.inputs.size(), 0x1000 * (st + 1));
      args[st].outputs.assign(sp.outputs.size(), 0x2000 * (st + 1));
      args[st].indexed.resize(sp.inputs.size());
      for (const ScalarSlot& s : g->scalars) args[st].scalars.push_back(scalar_arg(ScalarIr::Float(1e-5), s));
      args[st].fault = 0x10 + st;
    }
    args[0].rows = 32;
    args[0].row_length = 64;
    args[0].row_window_bytes = row_window_bytes(g->row_windows, 64);
    Result<ArgPack> pack = pack_args(k, args);
    KILN_ASSERT_OK(pack);
    ASSERT_EQ(pack->size(), k.params.size());
    for (std::size_t i = 0; i < k.params.size(); ++i) {
      const void* at = pack->args()[i];
      std::uint64_t word = 0;
      std::memcpy(&word, at, std::min<std::size_t>(8, pack->bytes(i)));
      switch (k.params[i].kind) {
        case ParamKind::Fault: EXPECT_EQ(word, 0x10u + k.params[i].stage); break;
        case ParamKind::InputPtr: EXPECT_EQ(word, 0x1000u * (k.params[i].stage + 1)); break;
        case ParamKind::OutputPtr: EXPECT_EQ(word, 0x2000u * (k.params[i].stage + 1)); break;
        case ParamKind::Rows: EXPECT_EQ(word, 32u); break;
        case ParamKind::RowLength: EXPECT_EQ(word, 64u); break;
        case ParamKind::RowWindowBytes: EXPECT_EQ(word, static_cast<std::uint64_t>(args[0].row_window_bytes)); break;
        default: break;
      }
    }
    args.pop_back();  // a parameter of a stage without arguments
    EXPECT_FALSE(pack_args(k, args).ok());
    return;
  }
  FAIL() << "no f32 layer-norm in the catalog";
}

TEST(Launch, VectorKernelNeedsAlignment) {
  const SingleOpProgram s = single(
      b::binary(Family::NumericFloat, OpKind::Numeric_Add, TensorIr{TensorId{1}, {64}, TensorStatus::ReadOnly, dt::f32},
                TensorIr{TensorId{2}, {64}, TensorStatus::ReadOnly, dt::f32}, TensorId{3}));
  Result<BlockLayout> l = block_layout(s.program, 0, s.binding(), ref_of(s), true);
  KILN_ASSERT_OK(l);
  const std::uintptr_t in_ok[] = {256, 512}, in_bad[] = {256, 516}, out_ok[] = {1024};
  EXPECT_TRUE(vector_aligned(s.program, *l, 4, in_ok, out_ok));
  EXPECT_FALSE(vector_aligned(s.program, *l, 4, in_bad, out_ok));
}

// The row-vector kernel: [rows, 1] and [1, cols] broadcasts along rows whose length is a
// multiple of the vector, rows on vector boundaries, unmasked stores.
TEST(Launch, RowVectorKernelEligibility) {
  auto layout_of = [](const SingleOpProgram& s) {
    Result<BlockLayout> l = block_layout(s.program, 0, s.binding(), ref_of(s), true);
    KILN_EXPECT_OK(l);
    return *l;
  };
  auto sub = [](Shape a, Shape b, DType d = dt::f32) {
    return single(b::binary(Family::NumericFloat, OpKind::Numeric_Sub,
                            TensorIr{TensorId{1}, std::move(a), TensorStatus::ReadOnly, d},
                            TensorIr{TensorId{2}, std::move(b), TensorStatus::ReadOnly, d}, TensorId{3}));
  };
  const std::uintptr_t in_ok[] = {256, 512}, out_ok[] = {1024};
  // softmax's x - max: [64, 1024] - [64, 1]
  const SingleOpProgram rows = sub({64, 1024}, {64, 1});
  const BlockLayout lr = layout_of(rows);
  EXPECT_FALSE(lr.vectorizable);
  EXPECT_TRUE(row_vector_eligible(rows.program, lr, 4, in_ok, out_ok));
  // a [1, cols] bias: its innermost stride is 1, its outer stride 0 (a multiple of anything)
  const SingleOpProgram bias = sub({64, 1024}, {1, 1024});
  EXPECT_TRUE(row_vector_eligible(bias.program, layout_of(bias), 4, in_ok, out_ok));
  // the pair of them: [64, 1] - [1, 1024] broadcasts both ways
  const SingleOpProgram both = sub({64, 1}, {1, 1024});
  EXPECT_TRUE(row_vector_eligible(both.program, layout_of(both), 4, in_ok, out_ok));
  // rows not a multiple of the vector
  const SingleOpProgram odd = sub({64, 1022}, {64, 1});
  EXPECT_FALSE(row_vector_eligible(odd.program, layout_of(odd), 4, in_ok, out_ok));
  EXPECT_TRUE(row_vector_eligible(odd.program, layout_of(odd), 2, in_ok, out_ok));
  // a misaligned stride-1 input or output; a misaligned stride-0 input is fine
  const std::uintptr_t in_bad[] = {260, 512}, in_bad_bcast[] = {256, 516}, out_bad[] = {1028};
  EXPECT_FALSE(row_vector_eligible(rows.program, lr, 4, in_bad, out_ok));
  EXPECT_TRUE(row_vector_eligible(rows.program, lr, 4, in_bad_bcast, out_ok));
  EXPECT_FALSE(row_vector_eligible(rows.program, lr, 4, in_ok, out_bad));
  // the broadcast dim innermost: [64, 1] against [64, 3, 1]-like layouts whose innermost stride
  // is neither 0 nor 1 (a transposed view) are refused
  BlockLayout strided = lr;
  strided.loads[0].strides[1] = 2;
  EXPECT_FALSE(row_vector_eligible(rows.program, strided, 4, in_ok, out_ok));
  // masked (broadcast) stores, or a store whose innermost stride is not 1
  BlockLayout masked = lr;
  masked.stores[0].masked = 1;
  EXPECT_FALSE(row_vector_eligible(rows.program, masked, 4, in_ok, out_ok));
  BlockLayout store0 = lr;
  store0.stores[0].strides[1] = 0;
  EXPECT_FALSE(row_vector_eligible(rows.program, store0, 4, in_ok, out_ok));
  // outer strides must keep stride-1 rows on vector boundaries
  BlockLayout outer = lr;
  outer.loads[0].strides[0] = 1026;
  EXPECT_FALSE(row_vector_eligible(rows.program, outer, 4, in_ok, out_ok));
  EXPECT_FALSE(row_vector_eligible(rows.program, lr, 0, in_ok, out_ok));
}

TEST(Launch, OpsWithoutGeneratedKernelsFallBack) {
  const TensorIr x{TensorId{1}, {4, 5}, TensorStatus::ReadOnly, dt::f32};
  Result<Operation> cum = b::dim(Family::NumericFloat, OpKind::Numeric_CumSum, x, 1, TensorId{2});
  KILN_ASSERT_OK(cum);
  EXPECT_FALSE(single_op_program(*cum).has_value());
  const TensorIr xi{TensorId{1}, {4, 5}, TensorStatus::ReadOnly, dt::i32};
  Result<Operation> imm = b::matmul(Family::Int, OpKind::Int_Matmul, xi,
                                    TensorIr{TensorId{3}, {5, 2}, TensorStatus::ReadOnly, dt::i32}, TensorId{4});
  KILN_ASSERT_OK(imm);
  EXPECT_FALSE(single_op_program(*imm).has_value()) << "integer matmul runs on the host";
}

}  // namespace
}  // namespace kiln::cuda
