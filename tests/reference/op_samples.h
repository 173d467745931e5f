// One valid sample operation of every op kind for an operand dtype (nullopt: the kind does not
// apply), its inputs registered on a reference test Device (reference_test_util.h), and every
// dtype a sample may take. Shared by the reference executor's every-kind test and mutation fuzz
// (reference_executor_test.cc) and the CPU backend's every-kind test (tests/cpu/every_kind_test.cc).
#pragma once

#include <optional>
#include <vector>

#include "reference_test_util.h"

namespace kiln::reference::testing::samples {

using F = Family;
using K = OpKind;

inline std::vector<double> ramp(std::uint64_t n, DType t) {
  std::vector<double> v(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = t.is_bool() ? static_cast<double>(i % 2) : 1.0 + static_cast<double>(i % 4);
  if (t.is_float())
    for (double& x : v) x *= 0.5;
  return v;
}

inline TensorIr data(Device& d, Shape s, DType t, TensorStatus st = TensorStatus::ReadOnly) {
  return d.f64(s, t, ramp(num_elements(s), t), st);
}

inline ScalarIr scalar_for(DType t) {
  if (t.is_bool()) return ScalarIr::Bool(true);
  if (t.is_float()) return ScalarIr::Float(1.5);
  if (t.is_int()) return ScalarIr::Int(2);
  return ScalarIr::UInt(2);
}

inline bool applies(OpGroup g, DType t) {
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

inline Family family_for(OpGroup g, DType t) {
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
inline Result<Operation> conv_sample(Device& d, K k, DType t, TensorId o) {
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
inline Result<Operation> pool_sample(Device& d, K k, DType t, TensorId o) {
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
inline Result<Operation> deformable_sample(Device& d, K k, DType t, TensorId o) {
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
inline QuantScheme quant_scheme() {
  QuantScheme q;
  q.value = QuantValue::Q4S;
  q.block_rank = 2;
  q.block = {1, 3, 0, 0};
  q.param = QuantParam::F16;
  return q;
}

// Dequantize reads a QFloat tensor: one made by a Quantize of the [2, 3] sample data (scales 0.5
// and 1, global 0.25) into dtype t.
inline Result<Operation> dequantize_sample(Device& d, DType t, TensorId o) {
  const TensorIr x = data(d, {2, 3}, dtypes::f32);
  const TensorId q = d.ok(
      b::quantize(x, d.f64({2, 1}, dtypes::f32, {0.5, 1}), d.f64({1}, dtypes::f32, {0.25}), quant_scheme(), d.fresh()));
  return b::dequantize(TensorIr{q, {2, 3}, TensorStatus::ReadOnly, DType::qfloat(quant_scheme())}, t, o);
}

inline std::optional<Result<Operation>> sample(Device& d, K k, DType t) {
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
    case Signature::Broadcast: return b::broadcast(x(), 0, {}, o);
    case Signature::AllGather: {
      const b::DeviceId self[] = {{1, 0}};
      return b::all_gather(x(), 1, self, o);
    }
    case Signature::ReduceScatter: {
      const b::DeviceId self[] = {{1, 0}};
      return b::reduce_scatter(x(), ReduceOperation::Sum, 0, self, o);
    }
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

inline constexpr DType kAllDtypes[] = {
    dtypes::f64, dtypes::f32, dtypes::flex32, dtypes::f16,     dtypes::bf16,
    dtypes::i64, dtypes::i32, dtypes::i16,    dtypes::i8,      dtypes::u64,
    dtypes::u32, dtypes::u16, dtypes::u8,     dtypes::boolean, DType::boolean(BoolStore::U32)};

}  // namespace kiln::reference::testing::samples
