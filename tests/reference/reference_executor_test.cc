// Reference executor: the error model (skips, claims, recovery of the daemon), handle traffic
// (ReadWrite consumption), lifecycle and collective ops, every op kind on every dtype it admits,
// and a mutation fuzz: no op that passes Operation::validate() crashes the executor.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <set>
#include <thread>

#include "kiln/testing/status.h"
#include "reference_test_util.h"

namespace kiln::reference::testing {
namespace {

using F = Family;
using K = OpKind;

// ---- A valid sample of every op kind for an operand dtype (nullopt: the kind does not apply).

std::vector<double> ramp(std::uint64_t n, DType t) {
  std::vector<double> v(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = t.is_bool() ? static_cast<double>(i % 2) : 1.0 + static_cast<double>(i % 4);
  if (t.is_float())
    for (double& x : v) x *= 0.5;
  return v;
}

TensorIr data(Device& d, Shape s, DType t, TensorStatus st = TensorStatus::ReadOnly) {
  return d.f64(s, t, ramp(num_elements(s), t), st);
}

ScalarIr scalar_for(DType t) {
  if (t.is_bool()) return ScalarIr::Bool(true);
  if (t.is_float()) return ScalarIr::Float(1.5);
  if (t.is_int()) return ScalarIr::Int(2);
  return ScalarIr::UInt(2);
}

bool applies(OpGroup g, DType t) {
  switch (g) {
    case OpGroup::Base: return true;
    case OpGroup::Numeric: return !t.is_bool();
    case OpGroup::Float:
    case OpGroup::Module:
    case OpGroup::Activation: return t.is_float();
    case OpGroup::Int: return t.is_integral();
    case OpGroup::Bool: return t.is_bool();
    default: return true;
  }
}

Family family_for(OpGroup g, DType t) {
  switch (g) {
    case OpGroup::Base: return base_family_for(t);
    case OpGroup::Numeric: return *numeric_family_for(t);
    case OpGroup::Float: return F::Float;
    case OpGroup::Int: return F::Int;
    case OpGroup::Bool: return F::Bool;
    case OpGroup::Module: return F::Module;
    case OpGroup::Init: return F::Init;
    case OpGroup::Custom: return F::Custom;
    case OpGroup::Drop: return F::Drop;
    case OpGroup::Distributed: return F::Distributed;
    case OpGroup::Activation: return F::Activation;
  }
  return F::Custom;
}

// Any convolution kind on dtype t: x [1, 4, 3...], 2 groups, kernel 2; padding 1 (conv: outputs of
// 4), stride 2, padding 1, padding_out 1 (transposed: outputs of 5); bias [6]; the gradients'
// output_grad of the forward's output shape.
Result<Operation> conv_sample(Device& d, K k, DType t, TensorId o) {
  const b::ConvKindInfo info = b::conv_kind_info(k).value();
  Shape xs{1, 4}, ws{info.transposed ? 4u : 6u, info.transposed ? 3u : 2u}, gs{1, 6};
  b::ConvOptions opts{{}, {}, {}, {}, 2};
  for (std::size_t i = 0; i < info.rank; ++i) {
    xs.push_back(3);
    ws.push_back(2);
    gs.push_back(info.transposed ? 5 : 4);
    opts.stride.push_back(info.transposed ? 2 : 1);
    opts.padding.push_back(1);
    opts.dilation.push_back(1);
    if (info.transposed) opts.padding_out.push_back(1);
  }
  const TensorIr x = data(d, xs, t);
  switch (info.role) {
    case b::ConvRole::Forward:
      return info.transposed ? b::conv_transpose(k, x, data(d, ws, t), data(d, {6}, t), opts, o)
                             : b::conv(k, x, data(d, ws, t), data(d, {6}, t), opts, o);
    case b::ConvRole::XBackward:
    case b::ConvRole::WeightBackward:
      return info.transposed ? b::conv_transpose_backward(k, x, data(d, ws, t), data(d, gs, t), opts, o)
                             : b::conv_backward(k, x, data(d, ws, t), data(d, gs, t), opts, o);
    case b::ConvRole::BiasBackward: return b::conv_bias_backward(k, x, data(d, {6}, t), data(d, gs, t), o);
  }
  return make_error(ErrorCode::Internal, "unreachable");
}

// A pool of docs/spec/ir.md §5.8 beyond MaxPool2d / AvgPool2d, by kind (the kind says the rank).
Result<Operation> pool_sample(Device& d, K k, DType t, TensorId o) {
  const DType index = dtypes::i64;
  const b::MaxPool1dOptions m1{2, 2, 1, 1, false};  // [.., 5] → [.., 3]: [−1, 0], [1, 2], [3, 4]
  b::MaxPool2dOptions m2;                           // [.., 4, 4] → [.., 2, 2]
  m2.kernel = {2, 2};
  m2.stride = {2, 2};
  const b::AvgPool1dOptions a1{3, 1, 1, false, false};  // [.., 5] → [.., 5]
  b::AvgPool2dOptions a2;                               // [.., 4, 4] → [.., 4, 4]
  a2.kernel = {3, 3};
  a2.padding = {1, 1};
  auto x = [&](Shape s) { return data(d, std::move(s), t); };
  switch (k) {
    case K::Module_MaxPool1d: return b::max_pool1d(x({1, 2, 5}), m1, o);
    case K::Module_MaxPool1dWithIndices: return b::max_pool1d_with_indices(x({1, 2, 5}), m1, index, o, d.fresh());
    case K::Module_MaxPool2dWithIndices: return b::max_pool2d_with_indices(x({1, 2, 4, 4}), m2, index, o, d.fresh());
    case K::Module_MaxPool1dWithIndicesBackward:
      return b::max_pool1d_with_indices_backward(x({1, 2, 5}), x({1, 2, 3}),
                                                 d.i64({1, 2, 3}, index, {0, 2, 4, 0, 1, -1}), m1, o);
    case K::Module_MaxPool2dWithIndicesBackward:
      return b::max_pool2d_with_indices_backward(x({1, 2, 4, 4}), x({1, 2, 2, 2}),
                                                 d.i64({1, 2, 2, 2}, index, {0, 3, 9, 15, 5, 6, 12, 10}), m2, o);
    case K::Module_AvgPool1d: return b::avg_pool1d(x({1, 2, 5}), a1, o);
    case K::Module_AvgPool1dBackward: return b::avg_pool1d_backward(x({1, 2, 5}), x({1, 2, 5}), a1, o);
    case K::Module_AvgPool2dBackward: return b::avg_pool2d_backward(x({1, 2, 4, 4}), x({1, 2, 4, 4}), a2, o);
    case K::Module_AdaptiveAvgPool1d: return b::adaptive_avg_pool1d(x({1, 2, 5}), 3, o);
    case K::Module_AdaptiveAvgPool2d: return b::adaptive_avg_pool2d(x({1, 2, 5, 4}), {3, 2}, o);
    case K::Module_AdaptiveAvgPool3d: return b::adaptive_avg_pool3d(x({1, 1, 3, 4, 5}), {2, 3, 2}, o);
    case K::Module_AdaptiveAvgPool1dBackward: return b::adaptive_avg_pool1d_backward(x({1, 2, 5}), x({1, 2, 3}), o);
    case K::Module_AdaptiveAvgPool2dBackward:
      return b::adaptive_avg_pool2d_backward(x({1, 2, 5, 4}), x({1, 2, 3, 2}), o);
    case K::Module_AdaptiveAvgPool3dBackward:
      return b::adaptive_avg_pool3d_backward(x({1, 1, 3, 4, 5}), x({1, 1, 2, 3, 2}), o);
    default: return make_error(ErrorCode::Internal, "not a pool");
  }
}

// Either deformable kind on dtype t: x [1, 2, 4, 4], weight [2, 1, 2, 2] (2 weight groups), 2
// offset groups, padding 1 (output [1, 2, 5, 5]), fractional offsets, a mask and a bias.
Result<Operation> deformable_sample(Device& d, K k, DType t, TensorId o) {
  b::DeformableConv2dOptions opts;
  opts.padding = {1, 1};
  opts.weight_groups = opts.offset_groups = 2;
  const TensorIr x = data(d, {1, 2, 4, 4}, t), w = data(d, {2, 1, 2, 2}, t), bias = data(d, {2}, t);
  std::vector<double> offsets(16 * 25);
  for (std::size_t i = 0; i < offsets.size(); ++i) offsets[i] = 0.375 * static_cast<double>(i % 7) - 1.125;
  const TensorIr offset = d.f64({1, 16, 5, 5}, t, offsets), mask = data(d, {1, 8, 5, 5}, t);
  if (k == K::Module_DeformableConv2d) return b::deformable_conv2d(x, offset, w, mask, bias, opts, o);
  return b::deformable_conv2d_backward(x, offset, w, mask, bias, data(d, {1, 2, 5, 5}, t), opts,
                                       {o, d.fresh(), d.fresh(), d.fresh(), d.fresh()});
}

// The samples' quantization scheme: Q4S, native, f16 scales over [1, 3] blocks of their [2, 3] data.
QuantScheme quant_scheme() {
  QuantScheme q;
  q.value = QuantValue::Q4S;
  q.block_rank = 2;
  q.block = {1, 3, 0, 0};
  q.param = QuantParam::F16;
  return q;
}

// Dequantize reads a QFloat tensor: one made by a Quantize of the [2, 3] sample data (scales 0.5
// and 1, global 0.25) into dtype t.
Result<Operation> dequantize_sample(Device& d, DType t, TensorId o) {
  const TensorIr x = data(d, {2, 3}, dtypes::f32);
  const TensorId q = d.ok(
      b::quantize(x, d.f64({2, 1}, dtypes::f32, {0.5, 1}), d.f64({1}, dtypes::f32, {0.25}), quant_scheme(), d.fresh()));
  return b::dequantize(TensorIr{q, {2, 3}, TensorStatus::ReadOnly, DType::qfloat(quant_scheme())}, t, o);
}

std::optional<Result<Operation>> sample(Device& d, K k, DType t) {
  const OpInfo& info = op_info(k);
  if (!applies(info.group, t)) return std::nullopt;
  const Family f = family_for(info.group, t);
  const DType boolean = dtypes::boolean;
  const DType index = dtypes::i64;
  const bool cmp = info.has(kComparison);
  const TensorId o = d.fresh();
  const Shape s{2, 3};
  auto x = [&] { return data(d, s, t); };
  switch (info.signature) {
    case Signature::Unary: return cmp ? b::unary_comparison(f, k, x(), boolean, o) : b::unary(f, k, x(), o);
    case Signature::Binary: {
      const TensorIr rhs = data(d, {1, 3}, t);
      return cmp ? b::binary_comparison(f, k, x(), rhs, boolean, o) : b::binary(f, k, x(), rhs, o);
    }
    case Signature::Scalar:
      return cmp ? b::scalar_comparison(f, k, x(), scalar_for(t), boolean, o) : b::scalar(f, k, x(), scalar_for(t), o);
    case Signature::Cast: {
      if (k == K::Float_Dequantize) return dequantize_sample(d, t, o);
      DType target = dtypes::f32;
      if (k == K::Base_Cast)
        target = t.is_bool()    ? DType::boolean(t.bool_store() == BoolStore::U32 ? BoolStore::Native : BoolStore::U32)
                 : t.is_float() ? (t == dtypes::f16 ? dtypes::bf16 : dtypes::f16)
                                : (t == dtypes::i8 ? dtypes::u64 : dtypes::i8);
      if (k == K::Float_IntoInt || k == K::Bool_IntoInt) target = dtypes::i32;
      return b::cast(f, k, x(), target, o);
    }
    case Signature::Reduce: return cmp ? b::reduce_bool(f, k, x(), boolean, o) : b::reduce(f, k, x(), o);
    case Signature::ReduceDim:
      if (cmp) return b::reduce_dim_bool(f, k, x(), 1, 1, boolean, o);
      if (info.has(kIndexOutput)) return b::reduce_dim_arg(f, k, x(), 1, 1, index, o);
      return b::reduce_dim(f, k, x(), 1, 1, o);
    case Signature::Dim: return b::dim(f, k, x(), 1, o);
    case Signature::ShapeOp: {
      if (k == K::Base_Reshape) {
        const std::int64_t args[] = {3, -1};
        return b::shape_op(f, k, x(), args, o);
      }
      const std::int64_t target[] = {2, 3, 4};
      return b::shape_op(f, k, data(d, {3, 1}, t), target, o);
    }
    case Signature::SwapDims: return b::swap_dims(f, k, x(), 0, 1, o);
    case Signature::Permute: {
      const std::uint64_t axes[] = {1, 0};
      return b::permute(f, k, x(), axes, o);
    }
    case Signature::Flip: {
      const std::uint64_t axes[] = {1};
      return b::flip(f, k, x(), axes, o);
    }
    case Signature::Creation: return b::creation(f, k, s, t, o);
    case Signature::Full: return b::full(f, k, s, t, scalar_for(t), o);
    case Signature::Random: return b::random(f, k, s, t, b::DistributionIr::uniform(0, 3), o);
    case Signature::Init: {
      d.handles.register_handle(o, *HostTensor::zeros(d.alloc, s, t));
      return b::init(s, t, o);
    }
    case Signature::Gather: return b::gather(f, k, x(), 1, d.i64({2, 2}, index, {2, 0, 1, 1}), o);
    case Signature::Scatter:
      return b::scatter(f, k, x(), 1, d.i64({2, 2}, index, {2, 0, 1, 1}), data(d, {2, 2}, t), IndexingUpdate::Add, o);
    case Signature::Select: return b::select(f, k, x(), 1, d.i64({2}, dtypes::u8, {2, 0}), o);
    case Signature::SelectAssign:
      return b::select_assign(f, k, x(), 1, d.i64({2}, dtypes::i16, {2, 2}), data(d, {2, 2}, t), IndexingUpdate::Max,
                              o);
    case Signature::Slice: {
      const Slice r[] = {Slice{0, 2, 1}, Slice{0, std::nullopt, -1}};
      return b::slice(f, k, x(), r, o);
    }
    case Signature::SliceAssign: {
      const Slice r[] = {Slice{1, 2, 1}};
      return b::slice_assign(f, k, x(), r, data(d, {1, 3}, t), o);
    }
    case Signature::MaskWhere:
      return b::mask_where(f, k, x(), d.boolean({2, 3}, {true, false, true, false, false, true}), data(d, {2, 1}, t),
                           o);
    case Signature::MaskFill: return b::mask_fill(f, k, x(), d.boolean({1, 3}, {true, false, true}), scalar_for(t), o);
    case Signature::Clamp:
      return b::clamp(f, k, x(), t.is_float() ? ScalarIr::Float(0.7) : ScalarIr::Int(2),
                      t.is_float() ? ScalarIr::Float(1.2) : ScalarIr::Int(3), o);
    case Signature::RepeatDim: return b::repeat_dim(f, k, x(), 0, 2, o);
    case Signature::Cat: {
      const TensorIr parts[] = {x(), data(d, {1, 3}, t)};
      return b::cat(f, k, parts, 0, o);
    }
    case Signature::ReduceDimWithIndices: return b::reduce_dim_with_indices(f, k, x(), 1, index, o, d.fresh());
    case Signature::TopKWithIndices: return b::topk_with_indices(f, k, x(), 1, 2, index, o, d.fresh());
    case Signature::Sort:
      return info.has(kIndexOutput) ? b::sort_arg(f, k, x(), 1, true, index, o) : b::sort(f, k, x(), 0, false, o);
    case Signature::SortWithIndices: return b::sort_with_indices(f, k, x(), 1, false, index, o, d.fresh());
    case Signature::GatherNd: return b::gather_nd(f, k, x(), d.i64({2, 1}, index, {1, 0}), o);
    case Signature::ScatterNd:
      return b::scatter_nd(f, k, x(), d.i64({2, 1}, index, {1, 0}), data(d, {2, 3}, t), IndexingUpdate::Add, o);
    case Signature::Unfold: return b::unfold(f, k, x(), 1, 2, 1, o);
    case Signature::Cross: return b::cross(f, k, x(), data(d, {1, 3}, t), 1, o);
    case Signature::HardSigmoid: return b::hard_sigmoid(x(), ScalarIr::Float(0.2), ScalarIr::Float(0.5), o);
    case Signature::Matmul: return b::matmul(f, k, x(), data(d, {3, 2}, t), o);
    case Signature::Conv:
    case Signature::ConvTranspose: return conv_sample(d, k, t, o);
    case Signature::MaxPool2d: {
      b::MaxPool2dOptions opt;
      opt.kernel = {2, 2};
      opt.stride = {2, 2};
      opt.padding = {1, 1};
      opt.ceil_mode = true;
      return b::max_pool2d(data(d, {1, 2, 4, 4}, t), opt, o);
    }
    case Signature::AvgPool2d: {
      b::AvgPool2dOptions opt;
      opt.kernel = {3, 3};
      opt.padding = {1, 1};
      opt.count_include_pad = false;
      return b::avg_pool2d(data(d, {1, 2, 4, 4}, t), opt, o);
    }
    case Signature::Embedding: return b::embedding(data(d, {4, 3}, t), d.i64({2, 2}, index, {3, 0, 1, 3}), o);
    case Signature::Pad: {
      const b::PadPair p[] = {{1, 2}};
      return b::pad(f, k, x(), p, PadMode::Constant, scalar_for(t), o);
    }
    case Signature::AllReduce: return b::all_reduce(x(), ReduceOperation::Mean, {}, o);
    case Signature::SyncCollective: return b::sync_collective();
    case Signature::Custom: {
      const TensorIr ins[] = {x()};
      const TensorIr outs[] = {TensorIr::uninit(o, s, t)};
      return b::custom("user::op", ins, outs, {});
    }
    case Signature::Linear: return b::linear(x(), data(d, {3, 2}, t), data(d, {2}, t), o);
    case Signature::LinearBackward:
      return k == K::Module_LinearXBackward ? b::linear_x_backward(data(d, {4, 3}, t), x(), o)
                                            : b::linear_weight_backward(data(d, {2, 4}, t), x(), o);
    case Signature::LinearBiasBackward: return b::linear_bias_backward(x(), o);
    case Signature::LayerNorm: return b::layer_norm(x(), data(d, {3}, t), data(d, {3}, t), 1e-5, o);
    case Signature::BatchNorm:
      return b::batch_norm(data(d, {2, 3, 2}, t), data(d, {3}, t), data(d, {3}, t), data(d, {3}, t), data(d, {3}, t),
                           1e-5, o);
    case Signature::EmbeddingBackward:
      return b::embedding_backward(data(d, {4, 3}, t), data(d, {2, 2, 3}, t), d.i64({2, 2}, index, {3, 0, 3, 1}), o);
    case Signature::MaxPool:
    case Signature::MaxPoolWithIndices:
    case Signature::MaxPoolWithIndicesBackward:
    case Signature::AvgPool:
    case Signature::AvgPoolBackward:
    case Signature::AdaptiveAvgPool:
    case Signature::AdaptiveAvgPoolBackward: return pool_sample(d, k, t, o);
    case Signature::Drop: return b::drop(data(d, s, t, TensorStatus::ReadWrite));
    case Signature::ConvBackward:
    case Signature::ConvTransposeBackward:
    case Signature::ConvBiasBackward: return conv_sample(d, k, t, o);
    case Signature::GridSample2d: {
      const std::vector<double> g{-1, -1, 0.25, 0.5, 1.5, -0.75, 0, 0, 1, 1, -2, 0.1};
      return b::grid_sample_2d(data(d, {1, 2, 3, 4}, t), d.f64({1, 2, 3, 2}, t, g),
                               {InterpolateMode::Bicubic, GridSamplePaddingMode::Reflection, false}, o);
    }
    case Signature::Interpolate:
      return b::interpolate(data(d, {1, 2, 3, 4}, t), {5, 3}, {InterpolateMode::Lanczos3, false}, o);
    case Signature::InterpolateBackward:
      return b::interpolate_backward(data(d, {1, 2, 3, 4}, t), data(d, {1, 2, 5, 3}, t), {5, 3},
                                     {InterpolateMode::Bicubic, true}, o);
    case Signature::Unfold4d: {
      b::Unfold4dOptions opt;
      opt.padding = {1, 0};
      opt.stride = {2, 1};
      return b::unfold4d(data(d, {1, 2, 3, 4}, t), {2, 3}, opt, o);
    }
    case Signature::Rfft: return b::rfft(x(), 1, 4, o, d.fresh());
    case Signature::IRfft: return b::irfft(x(), data(d, s, t), 1, std::nullopt, o);
    case Signature::Attention:
      return b::attention(data(d, {1, 2, 3, 4}, t), data(d, {1, 2, 5, 4}, t), data(d, {1, 2, 5, 2}, t),
                          d.boolean({1, 1, 3, 5}, std::vector<bool>(15, false)), data(d, {1, 2, 1, 5}, t),
                          {0.5, 3.0, true}, o);
    case Signature::CtcLoss:
    case Signature::CtcLossBackward: {
      const TensorIr lp = data(d, {4, 2, 3}, t), targets = d.i64({2, 2}, index, {1, 2, 2, 1});
      const TensorIr il = d.i64({2}, dtypes::i32, {4, 3}), tl = d.i64({2}, index, {2, 1});
      if (k == K::Module_CtcLoss) return b::ctc_loss(lp, targets, il, tl, 0, o);
      return b::ctc_loss_backward(lp, targets, il, tl, data(d, {2}, t), 0, o);
    }
    case Signature::DeformableConv2d:
    case Signature::DeformableConv2dBackward: return deformable_sample(d, k, t, o);
    case Signature::Quantize: return b::quantize(x(), data(d, {2, 1}, t), data(d, {1}, t), quant_scheme(), o);
  }
  return std::nullopt;
}

const DType kAllDtypes[] = {dtypes::f64, dtypes::f32, dtypes::flex32, dtypes::f16,     dtypes::bf16,
                            dtypes::i64, dtypes::i32, dtypes::i16,    dtypes::i8,      dtypes::u64,
                            dtypes::u32, dtypes::u16, dtypes::u8,     dtypes::boolean, DType::boolean(BoolStore::U32)};

TEST(ReferenceExecutorTest, EveryOpKindRunsOnEveryDtypeItAdmits) {
  std::set<int> covered;
  int runs = 0;
  for (int i = 0; i < kNumOpKinds; ++i) {
    const auto k = static_cast<K>(i);
    for (DType t : kAllDtypes) {
      Device d;
      std::optional<Result<Operation>> op = sample(d, k, t);
      if (!op) continue;
      ASSERT_TRUE(op->ok()) << op_info(k).variant << " " << t.name() << ": " << op->error().to_string();
      Status st = d.exec.execute(op->value(), d.handles);
      ++runs;
      if (k == K::Custom_Custom) {
        EXPECT_EQ(st.error().code, ErrorCode::Unsupported);
        continue;
      }
      EXPECT_TRUE(st.ok()) << op->value().to_string() << ": " << st.error().to_string();
      EXPECT_FALSE(d.handles.has_errors()) << op->value().to_string();
      for (const TensorIr& out : op->value().outputs()) {
        const HostTensor* h = d.handles.get_handle_ref(out.id);
        ASSERT_NE(h, nullptr) << op->value().to_string();
        EXPECT_EQ(h->shape(), out.shape);
        EXPECT_EQ(h->dtype(), out.dtype);
      }
      covered.insert(i);
    }
  }
  EXPECT_EQ(covered.size(), static_cast<std::size_t>(kNumOpKinds - 1)) << "every kind but Custom succeeds";
  EXPECT_GT(runs, 700);
}

// ---- Handle traffic

TEST(ReferenceExecutorTest, ReadWriteInputsAreConsumedReadOnlyKept) {
  Device d;
  const TensorIr a = d.f64({2}, dtypes::f32, {1, 2}, TensorStatus::ReadWrite);
  const TensorIr c = d.f64({2}, dtypes::f32, {3, 4}, TensorStatus::ReadOnly);
  const TensorId out = d.ok(b::binary(F::NumericFloat, K::Numeric_Add, a, c, d.fresh()));
  EXPECT_FALSE(d.handles.has_handle(a.id));
  EXPECT_TRUE(d.handles.has_handle(c.id));
  EXPECT_EQ(d.f64_of(out), (std::vector<double>{4, 6}));
  EXPECT_EQ(d.handles.num_handles(), 2u);
}

TEST(ReferenceExecutorTest, OneTensorUsedTwiceInEitherStatusOrder) {
  Device d;
  const TensorIr x = d.f64({2}, dtypes::f64, {3, 4});
  TensorIr ro = x;
  TensorIr rwv = rw(x);
  const TensorId p = d.ok(b::binary(F::NumericFloat, K::Numeric_Mul, rwv, ro, d.fresh()));  // ReadWrite first
  EXPECT_EQ(d.f64_of(p), (std::vector<double>{9, 16}));
  EXPECT_FALSE(d.handles.has_handle(x.id));
}

TEST(ReferenceExecutorTest, InputsAreNeverModifiedAndOutputsNeverAlias) {
  Device d;
  const TensorIr x = d.f64({3}, dtypes::f32, {1, 2, 3});
  const HostTensor before = d.tensor(x.id);
  const TensorId y = d.ok(b::scalar(F::NumericFloat, K::Numeric_MulScalar, x, ScalarIr::Float(2), d.fresh()));
  EXPECT_EQ(d.f64_of(x.id), (std::vector<double>{1, 2, 3}));
  EXPECT_FALSE(d.tensor(y).shares_buffer_with(before));
}

// ---- Error model (docs/spec/ir.md §11)

TEST(ReferenceExecutorTest, FailureClaimsSkipsPropagateAndTheStreamKeepsRunning) {
  Device d;
  const TensorIr a = d.i64({2}, dtypes::i32, {1, 2});
  const TensorIr z = d.i64({2}, dtypes::i32, {0, 0});
  auto div = b::binary(F::NumericInt, K::Numeric_Div, a, z, d.fresh());
  ASSERT_FALSE(d.run(div).ok());
  const TensorIr bad{div->outputs()[0].id, {2}, TensorStatus::ReadWrite, dtypes::i32};
  const ir::TensorError* root = d.handles.error_of(bad.id);
  ASSERT_NE(root, nullptr);
  EXPECT_EQ(root->depth, 0u);
  const ir::TensorError root_copy = *root;

  // Downstream op: skipped, its output carries the same root one level deeper, its ReadWrite
  // input is released.
  auto next = b::scalar(F::NumericInt, K::Numeric_AddScalar, bad, ScalarIr::Int(1), d.fresh());
  Status st = d.run(next);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("1 operation skipped"), std::string::npos) << st.error().message;
  EXPECT_FALSE(d.handles.has_handle(bad.id));
  const ir::TensorError* e1 = d.handles.error_of(next->outputs()[0].id);
  ASSERT_NE(e1, nullptr);
  EXPECT_TRUE(e1->same_root(root_copy));
  EXPECT_EQ(e1->depth, 1u);
  EXPECT_EQ(d.handles.errored(), 1u);

  // An unrelated op still runs.
  const TensorId ok = d.ok(b::scalar(F::NumericInt, K::Numeric_AddScalar, a, ScalarIr::Int(1), d.fresh()));
  EXPECT_EQ(d.i64_of(ok), (std::vector<std::int64_t>{2, 3}));
  // Dropping the errored tensor clears the error count.
  const TensorIr e1_ir{next->outputs()[0].id, {2}, TensorStatus::ReadWrite, dtypes::i32};
  KILN_EXPECT_OK(d.run(b::drop(e1_ir)));
  EXPECT_FALSE(d.handles.has_errors());
}

TEST(ReferenceExecutorTest, MissingOrMismatchedInputHandlesAreErrors) {
  Device d;
  const TensorIr ghost{d.fresh(), {2}, TensorStatus::ReadOnly, dtypes::f32};
  auto op = b::unary(F::Float, K::Float_Exp, ghost, d.fresh());
  Status st = d.run(op);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ErrorCode::InvalidHandle);
  EXPECT_TRUE(d.handles.entry(op->outputs()[0].id)->is_errored());

  const TensorIr real = d.f64({2}, dtypes::f32, {1, 2}, TensorStatus::ReadWrite);
  TensorIr lying = real;
  lying.shape = {3};
  auto op2 = b::unary(F::Float, K::Float_Exp, lying, d.fresh());
  st = d.run(op2);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ErrorCode::IncompatibleShapes);
  EXPECT_TRUE(d.handles.entry(op2->outputs()[0].id)->is_errored());
  EXPECT_FALSE(d.handles.has_handle(real.id));  // a failed op still consumes its ReadWrite inputs

  const TensorIr other = d.f64({2}, dtypes::f32, {1, 2});
  TensorIr wrong_dtype = other;
  wrong_dtype.dtype = dtypes::f64;
  EXPECT_FALSE(d.run(b::unary(F::Float, K::Float_Exp, wrong_dtype, d.fresh())).ok());
}

TEST(ReferenceExecutorTest, QuantizedTensorsAreRejected) {
  Device d;
  const TensorIr q{d.fresh(), {2}, TensorStatus::ReadOnly, DType::qfloat({})};
  auto op = b::unary(F::NumericFloat, K::Numeric_Abs, q, d.fresh());
  KILN_ASSERT_OK(op);
  Status st = d.run(op);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ErrorCode::Unsupported);
  EXPECT_TRUE(d.handles.entry(op->outputs()[0].id)->is_errored());
}

TEST(ReferenceExecutorTest, FamilyAndCarriedDtypeMustFitTheOperand) {
  Device d;
  const TensorIr x = d.f64({2}, dtypes::f32, {1, 2});
  auto op = b::unary(F::NumericFloat, K::Numeric_Abs, x, d.fresh());
  KILN_ASSERT_OK(op);
  Operation bad = *op;
  bad.family = F::NumericInt;
  bad.dtype = dtypes::i32;
  EXPECT_EQ(d.exec.execute(bad, d.handles).error().code, ErrorCode::DTypeMismatch);
  bad = *op;
  bad.dtype = dtypes::f64;  // carried dtype differs from the operand's
  bad.tensors.back().id = d.fresh();
  EXPECT_EQ(d.exec.execute(bad, d.handles).error().code, ErrorCode::DTypeMismatch);
  bad = *op;
  bad.tensors.back().dtype = dtypes::f16;  // output dtype the op does not produce
  bad.tensors.back().id = d.fresh();
  EXPECT_EQ(d.exec.execute(bad, d.handles).error().code, ErrorCode::DTypeMismatch);
}

TEST(ReferenceExecutorTest, InvalidOperationsAreErrors) {
  Device d;
  const TensorIr x = d.f64({2}, dtypes::f32, {1, 2});
  auto op = b::unary(F::Float, K::Float_Exp, x, d.fresh());
  KILN_ASSERT_OK(op);
  Operation bad = *op;
  bad.scalars.push_back(ScalarIr::Float(1));  // Unary carries no scalar: validate() fails
  EXPECT_EQ(d.exec.execute(bad, d.handles).error().code, ErrorCode::Invalid);
  EXPECT_TRUE(d.handles.entry(bad.outputs()[0].id)->is_errored());
  // Structurally broken ops (as a decoder might hand over): errors, the container untouched.
  const std::size_t before = d.handles.num_handles();
  bad = *op;
  bad.num_inputs = 5;
  EXPECT_EQ(d.exec.execute(bad, d.handles).error().code, ErrorCode::Invalid);
  bad = *op;
  bad.kind = static_cast<K>(kNumOpKinds + 3);
  EXPECT_EQ(d.exec.execute(bad, d.handles).error().code, ErrorCode::Invalid);
  bad = *op;
  bad.family = static_cast<F>(200);
  EXPECT_EQ(d.exec.execute(bad, d.handles).error().code, ErrorCode::Invalid);
  EXPECT_EQ(d.handles.num_handles(), before);
  // An output id that is also an input: rejected, and the input survives.
  bad = *op;
  bad.tensors.back().id = x.id;
  EXPECT_FALSE(d.exec.execute(bad, d.handles).ok());
  ASSERT_NE(d.handles.get_handle_ref(x.id), nullptr);
  EXPECT_EQ(d.f64_of(x.id), (std::vector<double>{1, 2}));
}

TEST(ReferenceExecutorTest, ExhaustionIsAnErrorAndTheNextOpRuns) {
  HostAllocator small({.byte_limit = 4096});
  ReferenceExecutor exec(small);
  ReferenceExecutor::Handles handles;
  auto big = b::creation(F::BaseFloat, K::Base_Zeros, {2048}, dtypes::f32, TensorId{1});
  Status st = exec.execute(*big, handles);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ErrorCode::ResourceExhausted);
  EXPECT_NE(st.error().message.find("8192 bytes"), std::string::npos) << st.error().message;
  EXPECT_TRUE(handles.entry(TensorId{1})->is_errored());
  auto small_op = b::creation(F::BaseFloat, K::Base_Ones, {16}, dtypes::f32, TensorId{2});
  KILN_EXPECT_OK(exec.execute(*small_op, handles));
  EXPECT_EQ(handles.get_handle_ref(TensorId{2})->to_f64()[15], 1.0);
}

// ---- Lifecycle and collectives

TEST(ReferenceExecutorTest, InitChecksTheOutOfBandHandle) {
  Device d;
  const TensorId id = d.fresh();
  d.handles.register_handle(id, *HostTensor::from_f64(d.alloc, {2}, dtypes::f32, std::vector<double>{1, 2}));
  KILN_EXPECT_OK(d.run(b::init({2}, dtypes::f32, id)));
  EXPECT_EQ(d.f64_of(id), (std::vector<double>{1, 2}));
  // Missing: error, claimed.
  const TensorId missing = d.fresh();
  EXPECT_EQ(d.run(b::init({2}, dtypes::f32, missing)).error().code, ErrorCode::InvalidHandle);
  EXPECT_TRUE(d.handles.entry(missing)->is_errored());
  // Registered with another shape: error, and the entry becomes Errored (readers see why).
  const TensorId wrong = d.fresh();
  d.handles.register_handle(wrong, *HostTensor::zeros(d.alloc, {3}, dtypes::f32));
  EXPECT_FALSE(d.run(b::init({2}, dtypes::f32, wrong)).ok());
  EXPECT_TRUE(d.handles.entry(wrong)->is_errored());
  // Already claimed out of band (a failed upload): nothing more to say.
  const TensorId claimed = d.fresh();
  d.handles.claim(claimed, ir::TensorError::make_root(ErrorCode::Execution, "upload failed"));
  KILN_EXPECT_OK(d.run(b::init({2}, dtypes::f32, claimed)));
}

TEST(ReferenceExecutorTest, DropFreesAndReportsMissingHandles) {
  Device d;
  const TensorIr x = d.f64({2}, dtypes::f32, {1, 2}, TensorStatus::ReadWrite);
  KILN_EXPECT_OK(d.run(b::drop(x)));
  EXPECT_FALSE(d.handles.has_handle(x.id));
  EXPECT_EQ(d.alloc.stats().bytes_in_use, 0u);  // the buffer went back to the pool
  EXPECT_EQ(d.run(b::drop(x)).error().code, ErrorCode::InvalidHandle);
}

TEST(ReferenceExecutorTest, CustomOpsAreUnknownAndClaimTheirOutputs) {
  Device d;
  const TensorIr x = d.f64({2}, dtypes::f32, {1, 2}, TensorStatus::ReadWrite);
  const TensorIr outs[] = {TensorIr::uninit(d.fresh(), {2}, dtypes::f32),
                           TensorIr::uninit(d.fresh(), {1}, dtypes::i64)};
  const TensorIr ins[] = {x};
  auto op = b::custom("flash_attention", ins, outs, {});
  Status st = d.run(op);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ErrorCode::Unsupported);
  EXPECT_NE(st.error().message.find("flash_attention"), std::string::npos);
  EXPECT_TRUE(d.handles.entry(outs[0].id)->is_errored());
  EXPECT_TRUE(d.handles.entry(outs[1].id)->is_errored());
  EXPECT_FALSE(d.handles.has_handle(x.id));
}

TEST(ReferenceExecutorTest, AllReduceOnOneDeviceIsTheIdentity) {
  Device d;
  const TensorIr x = d.f64({3}, dtypes::f32, {1, 2, 3});
  EXPECT_EQ(d.f64_of(d.ok(b::all_reduce(x, ReduceOperation::Sum, {}, d.fresh()))), (std::vector<double>{1, 2, 3}));
  const b::DeviceId self[] = {{0, 0}};
  EXPECT_EQ(d.f64_of(d.ok(b::all_reduce(x, ReduceOperation::Mean, self, d.fresh()))), (std::vector<double>{1, 2, 3}));
  const TensorIr xi = d.i64({2}, dtypes::i32, {5, 7});
  EXPECT_EQ(d.i64_of(d.ok(b::all_reduce(xi, ReduceOperation::Mean, {}, d.fresh()))), (std::vector<std::int64_t>{5, 7}));
  const b::DeviceId two[] = {{0, 0}, {0, 1}};
  EXPECT_EQ(d.run(b::all_reduce(x, ReduceOperation::Sum, two, d.fresh())).error().code, ErrorCode::Unsupported);
  KILN_EXPECT_OK(d.run(b::sync_collective()));
}

// Streams of one device: one executor and container each, one shared allocator.
TEST(ReferenceExecutorTest, StreamsShareOneAllocator) {
  HostAllocator alloc;
  std::vector<std::thread> streams;
  std::atomic<int> failures{0};
  for (int s = 0; s < 4; ++s) {
    streams.emplace_back([&, s] {
      ReferenceExecutor exec(alloc, static_cast<std::uint64_t>(s));
      ReferenceExecutor::Handles handles;
      std::uint64_t next = 1;
      auto t = [&](std::uint64_t id) { return TensorIr{TensorId{id}, {64}, TensorStatus::ReadWrite, dtypes::f32}; };
      TensorId prev{next};
      if (!exec.execute(*b::creation(F::BaseFloat, K::Base_Ones, {64}, dtypes::f32, TensorId{next++}), handles).ok())
        failures.fetch_add(1);
      for (int i = 0; i < 500; ++i) {
        const TensorId out{next++};
        if (!exec.execute(*b::scalar(F::NumericFloat, K::Numeric_AddScalar, t(prev.value()), ScalarIr::Float(1), out),
                          handles)
                 .ok())
          failures.fetch_add(1);
        prev = out;
      }
      const HostTensor* last = handles.get_handle_ref(prev);
      if (last == nullptr || last->get_f64(63) != 501 || handles.num_handles() != 1) failures.fetch_add(1);
    });
  }
  for (auto& th : streams) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(alloc.stats().bytes_in_use, 0u);
  EXPECT_GT(alloc.stats().pool_hits, 1000u);
}

// ---- Mutation fuzz: take every valid sample, break one thing at a time so that validate() still
// passes (attributes, output shapes and dtypes, input shapes and dtypes with matching handles,
// scalars, slice ranges), and execute. The executor must return (ASan / UBSan watch), and leave
// every output either registered or claimed.

std::int64_t wild_int(std::mt19937_64& rng) {
  static const std::int64_t kValues[] = {-1,
                                         0,
                                         1,
                                         2,
                                         3,
                                         4,
                                         5,
                                         7,
                                         64,
                                         1 << 20,
                                         std::int64_t{1} << 40,
                                         std::numeric_limits<std::int64_t>::max(),
                                         std::numeric_limits<std::int64_t>::min()};
  return kValues[rng() % std::size(kValues)];
}

Shape wild_shape(std::mt19937_64& rng, const Shape& like) {
  Shape s = like;
  switch (rng() % 4) {
    case 0:
      if (!s.empty()) s[rng() % s.size()] = rng() % 5;
      break;
    case 1: s.push_back(1 + rng() % 3); break;
    case 2:
      if (!s.empty()) s.pop_back();
      break;
    default:
      s.clear();
      for (std::uint64_t i = 0, r = rng() % 5; i < r; ++i) s.push_back(rng() % 5);
      break;
  }
  return s;
}

// KILN_REFERENCE_FUZZ_TRIALS=N (default 60 per kind and dtype) runs a longer campaign by hand.
TEST(ReferenceExecutorFuzzTest, MutatedOperationsNeverCrash) {
  const char* env = std::getenv("KILN_REFERENCE_FUZZ_TRIALS");
  const int trials = env != nullptr ? std::max(1, std::atoi(env)) : 60;
  const char* seed_env = std::getenv("KILN_REFERENCE_FUZZ_SEED");
  std::mt19937_64 rng(seed_env != nullptr ? std::strtoull(seed_env, nullptr, 10) : 20240611);
  const DType fuzz_dtypes[] = {dtypes::f32, dtypes::f16, dtypes::i32, dtypes::u8, dtypes::boolean};
  int executed = 0, failed = 0;
  for (int i = 0; i < kNumOpKinds; ++i) {
    const auto k = static_cast<K>(i);
    for (DType t : fuzz_dtypes) {
      Device d;
      std::optional<Result<Operation>> base = sample(d, k, t);
      if (!base || !base->ok()) continue;
      for (int trial = 0; trial < trials; ++trial) {
        Operation op = base->value();
        for (TensorIr& in : op.inputs()) in.status = TensorStatus::ReadOnly;  // keep inputs for the next trial
        if (op.kind == K::Drop_Drop) continue;
        const int mutations = 1 + static_cast<int>(rng() % 2);
        for (int m = 0; m < mutations; ++m) {
          switch (rng() % 8) {
            case 7:
              if (op.num_inputs > 0) {  // same shape and dtype, extreme values (indices out of range...)
                TensorIr& in = op.inputs()[rng() % op.num_inputs];
                if (in.dtype.is_quantized()) break;  // no element codec: only Quantize makes one
                std::vector<std::int64_t> vals(static_cast<std::size_t>(num_elements(in.shape)));
                for (auto& v : vals) v = rng() % 4 == 0 ? wild_int(rng) : static_cast<std::int64_t>(rng() % 5);
                in = d.i64(in.shape, in.dtype, vals);
              }
              break;
            case 0:
              if (!op.attrs.empty()) op.attrs[rng() % op.attrs.size()] = wild_int(rng);
              break;
            case 1:
              if (!op.outputs().empty()) {
                TensorIr& out = op.outputs()[rng() % op.outputs().size()];
                out.shape = wild_shape(rng, out.shape);
              }
              break;
            case 2:
              if (!op.outputs().empty()) op.outputs()[rng() % op.outputs().size()].dtype = kAllDtypes[rng() % 15];
              break;
            case 3:
            case 4:
              if (op.num_inputs > 0) {  // a new input tensor with a consistent handle
                TensorIr& in = op.inputs()[rng() % op.num_inputs];
                if (in.dtype.is_quantized()) break;
                const DType nt = rng() % 3 == 0 ? kAllDtypes[rng() % 15] : in.dtype;
                const Shape ns = wild_shape(rng, in.shape);
                std::vector<std::int64_t> vals(static_cast<std::size_t>(num_elements(ns)));
                for (auto& v : vals) v = static_cast<std::int64_t>(rng() % 7) - 2;
                in = d.i64(ns, nt, vals);
              }
              break;
            case 5:
              if (!op.scalars.empty()) {
                ScalarIr& s = op.scalars[rng() % op.scalars.size()];
                switch (rng() % 4) {
                  case 0: s = ScalarIr::Float(rng() % 2 ? kNaN : -kInf); break;
                  case 1: s = ScalarIr::Int(wild_int(rng)); break;
                  case 2: s = ScalarIr::UInt(~std::uint64_t{0}); break;
                  default: s = ScalarIr::Bool(true); break;
                }
              }
              break;
            default:
              if (!op.ranges.empty()) {
                Slice& r = op.ranges[rng() % op.ranges.size()];
                r.start = wild_int(rng);
                r.end = rng() % 3 == 0 ? std::nullopt : std::optional<std::int64_t>(wild_int(rng));
                r.step = wild_int(rng);
              }
              break;
          }
        }
        for (TensorIr& out : op.outputs()) out.id = d.fresh();
        if (!op.validate().ok()) continue;
        Status st = d.exec.execute(op, d.handles);
        ++executed;
        if (!st.ok()) ++failed;
        for (const TensorIr& out : op.outputs()) {
          const auto* e = d.handles.entry(out.id);
          ASSERT_NE(e, nullptr) << op.to_string();
          EXPECT_EQ(e->is_errored(), !st.ok()) << op.to_string();
          if (st.ok()) {
            EXPECT_EQ(d.handles.get_handle_ref(out.id)->shape(), out.shape);
            EXPECT_EQ(d.handles.get_handle_ref(out.id)->dtype(), out.dtype);
          }
        }
      }
    }
  }
  std::printf("fuzz: %d executed, %d failed cleanly\n", executed, failed);
  EXPECT_GT(executed, 5000);
  EXPECT_GT(failed, 1000);
  EXPECT_LT(failed, executed);
}

}  // namespace
}  // namespace kiln::reference::testing
