// IR builders (docs/spec/ir.md §6): build one Operation from its input tensors and attributes, inferring
// the output shape and dtype and validating everything a kernel would otherwise trip over.
// Building the IR is where shape and dtype errors surface: an executor never re-checks them.
//
// Pure functions, no state: safe from any thread.
//
// Conventions shared by every builder:
//   * One builder per argument signature (op_table.h); ops of groups Base, Numeric, Float, Int,
//     Bool and Activation take `(Family, OpKind, ...)` first and check that the kind has the
//     builder's signature, that its group admits the family, and that the family fits the operand
//     dtype (BaseFloat or NumericFloat for float and QFloat operands, BaseInt / NumericInt for
//     integers, BaseBool for bool; Float and Activation need a float or QFloat operand, Int an
//     integer one, Bool a bool one). Module, Init, Custom, Drop and Distributed builders, and
//     hard_sigmoid and grid_sample_2d, are named after their one kind.
//   * Inputs are tensor occurrences already in use (status ReadOnly or ReadWrite, never NotInit);
//     outputs are created as `TensorIr::uninit(id, shape, dtype)` from the ids the caller passes,
//     one per output in field order (`out` before `out_indices`), and must differ from the
//     input ids.
//   * NumericFloat / NumericInt / Float carry the dtype of the numeric operand in
//     Operation::dtype: the input dtype for arithmetic, comparisons, ArgMax/ArgMin and IntoInt;
//     the created dtype for Full and Random (docs/spec/ir.md §5.11). Other families leave it default.
//   * Kinds whose output is the bool dtype (tag kComparison) are built with the `*_comparison`
//     / `*_bool` builders, which take that dtype; ArgMax/ArgMin/ArgTopK with `reduce_dim_arg`
//     and ArgSort with `sort_arg` (index dtype). The plain builders reject them, so the output dtype is never guessed.
//   * Errors are values whose message starts with the op's kind name and names the offending
//     shapes or dtypes: "NumericFloat::Add: broadcast: incompatible dims 2 and 4 at dim 1
//     ([2,2] vs [2,4])". Codes: the shape codes of docs/spec/ir.md §4, DTypeMismatch, Invalid.
//   * The result always passes Operation::validate().
//
// Example:
//   using namespace kiln::ir;
//   TensorIr x{TensorId{1}, {2, 3}, TensorStatus::ReadOnly, dtypes::f32};
//   TensorIr y{TensorId{2}, {1, 3}, TensorStatus::ReadWrite, dtypes::f32};
//   Result<Operation> add = build::binary(Family::NumericFloat, OpKind::Numeric_Add, x, y, TensorId{3});
//   // add->outputs()[0] is t3:f32[2,3], status NotInit; add->dtype == f32
//   Result<Operation> gt = build::binary_comparison(Family::NumericFloat, OpKind::Numeric_Greater, x, y,
//                                                   dtypes::boolean, TensorId{4});
//   if (!gt.ok()) log(gt.error().to_string());
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kiln/ir/operation.h"

namespace kiln::ir::build {

// ---- Attribute structs (defaults are the usual neutral values).

// A random distribution: Default = uniform [0, 1); Bernoulli(p); Uniform(low, high);
// Normal(mean, std). Stored as attrs [kind, bits(param0), bits(param1)].
struct DistributionIr {
  Distribution kind = Distribution::Default;
  double param0 = 0;
  double param1 = 0;
  static DistributionIr bernoulli(double p) { return {Distribution::Bernoulli, p, 0}; }
  static DistributionIr uniform(double low, double high) { return {Distribution::Uniform, low, high}; }
  static DistributionIr normal(double mean, double std) { return {Distribution::Normal, mean, std}; }
};

struct Conv2dOptions {
  std::array<std::uint64_t, 2> stride{1, 1};
  std::array<std::uint64_t, 2> padding{0, 0};
  std::array<std::uint64_t, 2> dilation{1, 1};
  std::uint64_t groups = 1;
};

struct ConvTranspose1dOptions {
  std::uint64_t stride = 1;
  std::uint64_t padding = 0;
  std::uint64_t padding_out = 0;
  std::uint64_t dilation = 1;
  std::uint64_t groups = 1;
};

struct MaxPool2dOptions {
  std::array<std::uint64_t, 2> kernel{1, 1};
  std::array<std::uint64_t, 2> stride{1, 1};
  std::array<std::uint64_t, 2> padding{0, 0};
  std::array<std::uint64_t, 2> dilation{1, 1};
  bool ceil_mode = false;
};

struct AvgPool2dOptions {
  std::array<std::uint64_t, 2> kernel{1, 1};
  std::array<std::uint64_t, 2> stride{1, 1};
  std::array<std::uint64_t, 2> padding{0, 0};
  bool count_include_pad = true;
  bool ceil_mode = false;
};

// The one-dimensional pools (docs/spec/ir.md §5.8): MaxPool2dOptions / AvgPool2dOptions with one
// spatial dim.
struct MaxPool1dOptions {
  std::uint64_t kernel = 1;
  std::uint64_t stride = 1;
  std::uint64_t padding = 0;
  std::uint64_t dilation = 1;
  bool ceil_mode = false;
};

struct AvgPool1dOptions {
  std::uint64_t kernel = 1;
  std::uint64_t stride = 1;
  std::uint64_t padding = 0;
  bool count_include_pad = true;
  bool ceil_mode = false;
};

// Padding of one dimension (Pad, docs/spec/ir.md §6.4).
struct PadPair {
  std::uint64_t before = 0;
  std::uint64_t after = 0;
};

// A device taking part in an all-reduce; packed as (type << 16 | index).
struct DeviceId {
  std::uint16_t type = 0;
  std::uint16_t index = 0;
};

// ---- Elementwise

// Unary: output = input shape and dtype. Comparison kinds (IsNan, IsInf): unary_comparison.
Result<Operation> unary(Family family, OpKind kind, const TensorIr& input, TensorId out);
Result<Operation> unary_comparison(Family family, OpKind kind, const TensorIr& input, DType bool_dtype, TensorId out);
// Binary: broadcast(lhs, rhs), same(lhs, rhs). Comparisons (Equal, Greater, ...): binary_comparison.
Result<Operation> binary(Family family, OpKind kind, const TensorIr& lhs, const TensorIr& rhs, TensorId out);
Result<Operation> binary_comparison(Family family, OpKind kind, const TensorIr& lhs, const TensorIr& rhs,
                                    DType bool_dtype, TensorId out);
// Scalar right-hand side: output = lhs shape and dtype (scalar kind unchecked, as in Burn).
Result<Operation> scalar(Family family, OpKind kind, const TensorIr& lhs, ScalarIr rhs, TensorId out);
Result<Operation> scalar_comparison(Family family, OpKind kind, const TensorIr& lhs, ScalarIr rhs, DType bool_dtype,
                                    TensorId out);
// Cast (Base Cast, Float IntoInt, Int IntoFloat, Bool IntoFloat/IntoInt, Float Dequantize):
// output dtype = target, which must be of the kind the op converts to (Dequantize: a QFloat input,
// a float target; the named builder dequantize below).
Result<Operation> cast(Family family, OpKind kind, const TensorIr& input, DType target, TensorId out);
// Clamp{tensor, min, max}.
Result<Operation> clamp(Family family, OpKind kind, const TensorIr& tensor, ScalarIr min, ScalarIr max, TensorId out);
// Activation HardSigmoid{tensor, alpha, beta} (docs/spec/ir.md §5.9, §6.3): clamp(alpha x + beta,
// 0, 1) of a float tensor; output = tensor shape and dtype. The other activations reuse unary,
// binary, scalar (LeakyRelu) and dim (Softmax, LogSoftmax, Softmin) with Family::Activation.
Result<Operation> hard_sigmoid(const TensorIr& tensor, ScalarIr alpha, ScalarIr beta, TensorId out);
// MaskWhere{tensor, mask, value}: broadcast_many, same(tensor, value); mask must be bool.
Result<Operation> mask_where(Family family, OpKind kind, const TensorIr& tensor, const TensorIr& mask,
                             const TensorIr& value, TensorId out);
// MaskFill{tensor, mask, value}: broadcast(tensor, mask), tensor dtype; mask must be bool.
Result<Operation> mask_fill(Family family, OpKind kind, const TensorIr& tensor, const TensorIr& mask, ScalarIr value,
                            TensorId out);

// ---- Matmul: matmul_output(lhs, rhs); dtype mixed(lhs, rhs) = lhs's, or the given one
// (create_mixed). Carried dtype: lhs's.
Result<Operation> matmul(Family family, OpKind kind, const TensorIr& lhs, const TensorIr& rhs, TensorId out);
Result<Operation> matmul_mixed(Family family, OpKind kind, const TensorIr& lhs, const TensorIr& rhs, DType out_dtype,
                               TensorId out);
// Float Cross{lhs, rhs, dim} (docs/spec/ir.md §6.3): broadcast(lhs, rhs), same(lhs, rhs); dim < rank
// and both operands of size 3 along it (the 3-vectors; torch.linalg.cross, Burn's cross).
Result<Operation> cross(Family family, OpKind kind, const TensorIr& lhs, const TensorIr& rhs, std::uint64_t dim,
                        TensorId out);

// ---- Quantization (docs/spec/ir.md §5.6, §6.3; tags Q, and E for Dequantize)

// Float Quantize{tensor, qparams{scales, global?}, scheme} → QFloat(scheme) of tensor's shape
// (carried: tensor's dtype): q = clamp(round(x / s), the value type's range) with s the scale of
// x's block (stored in the scheme's precision) times global (f32; 1 when absent). tensor float
// (not quantized), scales float of shape::quant_geometry's scales shape, global? float [1]; the
// scheme must fit the shape (known enums, blocks dividing their dims, a packed axis the words
// divide). The optional global is told by the input count.
Result<Operation> quantize(const TensorIr& tensor, const TensorIr& scales, const std::optional<TensorIr>& global,
                           const QuantScheme& scheme, TensorId out);
// Float Dequantize{input (QFloat), out_dtype (float)} → input's shape: q · s (Cast signature,
// carried dtype the input's QFloat).
Result<Operation> dequantize(const TensorIr& input, DType out_dtype, TensorId out);

// ---- Reductions and scans

// Whole-tensor reduction: shape [1]. All/Any: reduce_bool.
Result<Operation> reduce(Family family, OpKind kind, const TensorIr& input, TensorId out);
Result<Operation> reduce_bool(Family family, OpKind kind, const TensorIr& input, DType bool_dtype, TensorId out);
// Dim reduction: input with [axis] = accumulator_len (1 for SumDim ... ArgMin; k for TopK and
// ArgTopK, which must not exceed the axis' size). AllDim/AnyDim: reduce_dim_bool; ArgMax/ArgMin/
// ArgTopK: reduce_dim_arg (integer index dtype).
Result<Operation> reduce_dim(Family family, OpKind kind, const TensorIr& input, std::uint64_t axis,
                             std::uint64_t accumulator_len, TensorId out);
Result<Operation> reduce_dim_bool(Family family, OpKind kind, const TensorIr& input, std::uint64_t axis,
                                  std::uint64_t accumulator_len, DType bool_dtype, TensorId out);
Result<Operation> reduce_dim_arg(Family family, OpKind kind, const TensorIr& input, std::uint64_t axis,
                                 std::uint64_t accumulator_len, DType index_dtype, TensorId out);
// Dim ops (CumSum ...): output = input.
Result<Operation> dim(Family family, OpKind kind, const TensorIr& input, std::uint64_t axis, TensorId out);
// MaxDimWithIndices / MinDimWithIndices: both outputs input with [dim] = 1.
Result<Operation> reduce_dim_with_indices(Family family, OpKind kind, const TensorIr& tensor, std::uint64_t dim,
                                          DType index_dtype, TensorId out, TensorId out_indices);
// TopKWithIndices: both outputs input with [dim] = k (k <= that dim).
Result<Operation> topk_with_indices(Family family, OpKind kind, const TensorIr& tensor, std::uint64_t dim,
                                    std::uint64_t k, DType index_dtype, TensorId out, TensorId out_indices);
// Sort / ArgSort{input, dim, descending} (docs/spec/ir.md §5.5, §6.3): the output has the input's
// shape; Sort keeps its dtype, ArgSort is built with sort_arg (integer index dtype). dim < rank.
Result<Operation> sort(Family family, OpKind kind, const TensorIr& input, std::uint64_t dim, bool descending,
                       TensorId out);
Result<Operation> sort_arg(Family family, OpKind kind, const TensorIr& input, std::uint64_t dim, bool descending,
                           DType index_dtype, TensorId out);
// SortWithIndices: both outputs have the input's shape; values keep its dtype.
Result<Operation> sort_with_indices(Family family, OpKind kind, const TensorIr& input, std::uint64_t dim,
                                    bool descending, DType index_dtype, TensorId out, TensorId out_indices);

// ---- Layout

// Reshape: `args` per shape::reshape (>0 literal, 0 copies, -1 inferred once).
// Expand: `args` is the target shape (non-negative), per shape::expand.
Result<Operation> shape_op(Family family, OpKind kind, const TensorIr& input, std::span<const std::int64_t> args,
                           TensorId out);
// SwapDims / Permute adjust a QFloat scheme (docs/spec/ir.md §6.2).
Result<Operation> swap_dims(Family family, OpKind kind, const TensorIr& input, std::uint64_t dim1, std::uint64_t dim2,
                            TensorId out);
Result<Operation> permute(Family family, OpKind kind, const TensorIr& input, std::span<const std::uint64_t> axes,
                          TensorId out);
// Flip: axes must be distinct and < rank (K: Burn leaves them unchecked).
Result<Operation> flip(Family family, OpKind kind, const TensorIr& input, std::span<const std::uint64_t> axes,
                       TensorId out);
Result<Operation> repeat_dim(Family family, OpKind kind, const TensorIr& tensor, std::uint64_t dim, std::uint64_t times,
                             TensorId out);
// Unfold{input, dim, size, step} (docs/spec/ir.md §6.3): [dim] becomes the number of windows of
// `size` elements every `step` (shape::unfold_windows: 0 when size > the dim), `size` is appended
// as the last dim; input dtype. dim < rank, step >= 1 (Burn asserts it); size and step fit an i64.
Result<Operation> unfold(Family family, OpKind kind, const TensorIr& input, std::uint64_t dim, std::uint64_t size,
                         std::uint64_t step, TensorId out);
Result<Operation> cat(Family family, OpKind kind, std::span<const TensorIr> tensors, std::uint64_t dim, TensorId out);
// Slice: shape::slice; at most rank ranges, steps != 0.
Result<Operation> slice(Family family, OpKind kind, const TensorIr& tensor, std::span<const Slice> ranges,
                        TensorId out);
Result<Operation> slice_assign(Family family, OpKind kind, const TensorIr& tensor, std::span<const Slice> ranges,
                               const TensorIr& value, TensorId out);
// Numeric Pad: `padding` applies to the last padding.size() dims, in dim order (docs/spec/ir.md §6.4);
// `constant` is required for PadMode::Constant and forbidden otherwise.
Result<Operation> pad(Family family, OpKind kind, const TensorIr& input, std::span<const PadPair> padding, PadMode mode,
                      std::optional<ScalarIr> constant, TensorId out);

// ---- Indexing (indices must have an integer dtype; dim < rank)

// Gather{tensor, dim, indices}: shape of indices (same rank as tensor), tensor dtype.
Result<Operation> gather(Family family, OpKind kind, const TensorIr& tensor, std::uint64_t dim, const TensorIr& indices,
                         TensorId out);
Result<Operation> scatter(Family family, OpKind kind, const TensorIr& tensor, std::uint64_t dim,
                          const TensorIr& indices, const TensorIr& value, IndexingUpdate update, TensorId out);
// Select{tensor, dim, indices}: tensor with [dim] = indices[0]; indices of rank 1.
Result<Operation> select(Family family, OpKind kind, const TensorIr& tensor, std::uint64_t dim, const TensorIr& indices,
                         TensorId out);
Result<Operation> select_assign(Family family, OpKind kind, const TensorIr& tensor, std::uint64_t dim,
                                const TensorIr& indices, const TensorIr& value, IndexingUpdate update, TensorId out);
// GatherNd{data, indices}: indices[0..m-1] ++ data[k..], m = rank(indices), k = indices[m-1].
Result<Operation> gather_nd(Family family, OpKind kind, const TensorIr& data, const TensorIr& indices, TensorId out);
// ScatterNd{data, indices, values, reduction}: data's shape, same(data, values); indices as for
// GatherNd (rank >= 1, k <= rank(data)); reduction a known IndexingUpdate. The values' shape,
// indices[0..m-1] ++ data[k..], is left to the kernel, as Scatter's value (docs/spec/ir.md §6.3).
Result<Operation> scatter_nd(Family family, OpKind kind, const TensorIr& data, const TensorIr& indices,
                             const TensorIr& values, IndexingUpdate reduction, TensorId out);

// ---- Creation (no inputs; shape and dtype given; the family must fit the dtype)

// Base Empty / Ones / Zeros.
Result<Operation> creation(Family family, OpKind kind, const Shape& shape, DType dtype, TensorId out);
// Numeric Full (scalar kind unchecked, as in Burn).
Result<Operation> full(Family family, OpKind kind, const Shape& shape, DType dtype, ScalarIr value, TensorId out);
// Float Random, Numeric IntRandom.
Result<Operation> random(Family family, OpKind kind, const Shape& shape, DType dtype, DistributionIr distribution,
                         TensorId out);

// ---- Module ops (x and weights float; x and weight of rank n + 2)

// [N, weight[0], H', W'] by the conv formula; x[1] == weight[1] * groups; bias [weight[0]]
// (conv(Module_Conv2d, ...) below, with its checks).
Result<Operation> conv2d(const TensorIr& x, const TensorIr& weight, const std::optional<TensorIr>& bias,
                         const Conv2dOptions& options, TensorId out);
// [N, weight[1] * groups, L'] by the transposed formula; x[1] == weight[0]; bias [weight[1] * groups]
// (conv_transpose(Module_ConvTranspose1d, ...) below, with its checks).
Result<Operation> conv_transpose1d(const TensorIr& x, const TensorIr& weight, const std::optional<TensorIr>& bias,
                                   const ConvTranspose1dOptions& options, TensorId out);
Result<Operation> max_pool2d(const TensorIr& x, const MaxPool2dOptions& options, TensorId out);
Result<Operation> avg_pool2d(const TensorIr& x, const AvgPool2dOptions& options, TensorId out);
// weights [V, E], indices [B, S] (integer) -> [B, S, E], weights dtype.
Result<Operation> embedding(const TensorIr& weights, const TensorIr& indices, TensorId out);

// Dense layers, norms and the embedding's gradient (docs/spec/ir.md §5.8, §6.3). Float operands;
// an optional tensor (bias, beta) is an op input only when given. Errors name the op and shapes.
// Linear{x [..., d_in], weight [d_in, d_out], bias? [d_out]}: x with the last dim d_out (the
// weight is [d_in, d_out], Burn's layout: out = x · weight + bias); same(x, weight, bias?).
Result<Operation> linear(const TensorIr& x, const TensorIr& weight, const std::optional<TensorIr>& bias, TensorId out);
// LinearXBackward{weight [d_in, d_out], output_grad [..., d_out]}: output_grad with the last dim
// d_in (output_grad · weightᵀ), output_grad's dtype.
Result<Operation> linear_x_backward(const TensorIr& weight, const TensorIr& output_grad, TensorId out);
// LinearWeightBackward{x [..., d_in], output_grad [..., d_out]} (the same leading dims):
// [d_in, d_out] (xᵀ · output_grad summed over the leading dims), output_grad's dtype.
Result<Operation> linear_weight_backward(const TensorIr& x, const TensorIr& output_grad, TensorId out);
// LinearBiasBackward{output_grad [..., d_out]}: [d_out] (summed over the leading dims).
Result<Operation> linear_bias_backward(const TensorIr& output_grad, TensorId out);
// LayerNorm{input [..., d], gamma [d], beta? [d], epsilon}: input's shape, normalised over the
// last dim with the biased variance; same(input, gamma, beta?). epsilon finite and >= 0 (K),
// stored as the attribute bits(epsilon) (kept verbatim, docs/spec/fusion.md §3.6).
Result<Operation> layer_norm(const TensorIr& input, const TensorIr& gamma, const std::optional<TensorIr>& beta,
                             double epsilon, TensorId out);
// The same op with its row statistics as two more outputs (K: beyond docs/spec/ir.md §5.8, whose
// LayerNorm has one; a training front end needs them for the backward pass): out_mean and
// out_rstd = 1 / sqrt(var + epsilon), each input's shape with the last dim 1, input's dtype.
Result<Operation> layer_norm_with_stats(const TensorIr& input, const TensorIr& gamma,
                                        const std::optional<TensorIr>& beta, double epsilon, TensorId out,
                                        TensorId out_mean, TensorId out_rstd);
// BatchNorm{x [N, C, ...], gamma, beta, mean, variance [C], epsilon}: x's shape, the inference
// form with the given running statistics over dim 1; same(x, gamma, beta, mean, variance).
// epsilon finite and >= 0 (K), stored as the scalar Float(epsilon) (relativized).
Result<Operation> batch_norm(const TensorIr& x, const TensorIr& gamma, const TensorIr& beta, const TensorIr& mean,
                             const TensorIr& variance, double epsilon, TensorId out);
// EmbeddingBackward{weights [V, E], out_grad [B, S, E], indices [B, S] (integer)}: [V, E], the
// rows of out_grad added at their indices (duplicates accumulate); same(weights, out_grad).
Result<Operation> embedding_backward(const TensorIr& weights, const TensorIr& out_grad, const TensorIr& indices,
                                     TensorId out);

// Pools (docs/spec/ir.md §5.8, shapes §6.3): x float of rank n + 2 ([N, C, spatial...]) for the
// kind's n spatial dims; errors name the op and the values. Windows: kernel, stride and dilation at
// least 1, padding at most kernel / 2 (PyTorch's limit; max_pool2d and avg_pool2d above too),
// output sizes by the pool formula (docs/spec/ir.md §4, the spec's ceil mode: a last window may lie
// in the padding). Attributes as op_table.h lists them.
// The spatial dims of a pool kind (MaxPool1d → 1, AdaptiveAvgPool3d → 3); 0 for other kinds.
std::size_t pool_spatial_dims(OpKind kind);
// A windowed pool's attributes read back from an op (max and average pools and their backwards;
// not the adaptive ones, whose attributes are output sizes), for the executors: the first
// `spatial` entries of each field are the op's, the rest kernel 1, stride 1, padding 0, dilation 1
// (average pools have no dilation). Checked as the builders check them: the attribute count the
// kind takes, no negative value, kernel, stride and dilation at least 1, padding at most kernel / 2,
// flags 0 or 1. Errors carry the message only (the caller names the op).
struct PoolAttrs {
  std::size_t spatial = 0;
  bool dilated = false;  // a max pool: a dilation field, the flags [ceil_mode]
  std::array<std::uint64_t, 3> kernel{1, 1, 1}, stride{1, 1, 1}, padding{0, 0, 0}, dilation{1, 1, 1};
  bool count_include_pad = false;  // average pools
  bool ceil_mode = false;
};
Result<PoolAttrs> pool_attrs_of(const Operation& op);
Result<Operation> max_pool1d(const TensorIr& x, const MaxPool1dOptions& options, TensorId out);
// MaxPool{1,2}dWithIndices → out (D(x)) and out_indices (index_dtype), both of the pool's shape. An
// index is flat within the input's spatial plane (PyTorch: h · W + w), the first tap of the window
// wins ties, a NaN wins (the last NaN's index) and a window with no element inside x gives −inf and
// −1, so index_dtype must be a signed integer dtype that holds the plane's last index (K).
Result<Operation> max_pool1d_with_indices(const TensorIr& x, const MaxPool1dOptions& options, DType index_dtype,
                                          TensorId out, TensorId out_indices);
Result<Operation> max_pool2d_with_indices(const TensorIr& x, const MaxPool2dOptions& options, DType index_dtype,
                                          TensorId out, TensorId out_indices);
// MaxPool{1,2}dWithIndicesBackward{x, grad, indices} → S(x), D(x): grad and indices (an integer
// dtype) have the forward's output shape; each grad element is added at its index (−1: nowhere).
Result<Operation> max_pool1d_with_indices_backward(const TensorIr& x, const TensorIr& grad, const TensorIr& indices,
                                                   const MaxPool1dOptions& options, TensorId out);
Result<Operation> max_pool2d_with_indices_backward(const TensorIr& x, const TensorIr& grad, const TensorIr& indices,
                                                   const MaxPool2dOptions& options, TensorId out);
Result<Operation> avg_pool1d(const TensorIr& x, const AvgPool1dOptions& options, TensorId out);
// AvgPool{1,2}dBackward{x, grad} → S(x), D(x); grad (float) has the forward's output shape.
Result<Operation> avg_pool1d_backward(const TensorIr& x, const TensorIr& grad, const AvgPool1dOptions& options,
                                      TensorId out);
Result<Operation> avg_pool2d_backward(const TensorIr& x, const TensorIr& grad, const AvgPool2dOptions& options,
                                      TensorId out);
// AdaptiveAvgPool{1,2,3}d{x, output_size} → [N, C, output_size...], D(x): output sizes and x's
// spatial dims at least 1 (PyTorch's windows [⌊i·in/out⌋, ⌈(i+1)·in/out⌉)).
Result<Operation> adaptive_avg_pool1d(const TensorIr& x, std::uint64_t output_size, TensorId out);
Result<Operation> adaptive_avg_pool2d(const TensorIr& x, std::array<std::uint64_t, 2> output_size, TensorId out);
Result<Operation> adaptive_avg_pool3d(const TensorIr& x, std::array<std::uint64_t, 3> output_size, TensorId out);
// AdaptiveAvgPool{1,2,3}dBackward{x, grad} → S(x), D(x): grad [N, C, output_size...] (float) of
// x's rank, N and C; its spatial dims are the forward's output size.
Result<Operation> adaptive_avg_pool1d_backward(const TensorIr& x, const TensorIr& grad, TensorId out);
Result<Operation> adaptive_avg_pool2d_backward(const TensorIr& x, const TensorIr& grad, TensorId out);
Result<Operation> adaptive_avg_pool3d_backward(const TensorIr& x, const TensorIr& grad, TensorId out);

// Resampling (docs/spec/ir.md §5.6, §5.8, §6.3): float operands, x / tensor [N, C, H, W] with
// H, W >= 1; enum attributes of a known value (errors name the op and the values).
// Interpolate's options; the defaults are Burn's InterpolateOptions::new(Nearest).
struct InterpolateOptions {
  InterpolateMode mode = InterpolateMode::Nearest;
  bool align_corners = true;
};
// GridSample2d's options; the defaults are Burn's (and PyTorch's) GridSampleOptions::default().
struct GridSampleOptions {
  InterpolateMode mode = InterpolateMode::Bilinear;  // Nearest, Bilinear or Bicubic
  GridSamplePaddingMode padding_mode = GridSamplePaddingMode::Zeros;
  bool align_corners = false;
};
// Unfold4d's options (Burn's UnfoldOptions; PyTorch's F.unfold defaults).
struct Unfold4dOptions {
  std::array<std::uint64_t, 2> stride{1, 1};
  std::array<std::uint64_t, 2> padding{0, 0};
  std::array<std::uint64_t, 2> dilation{1, 1};
};
// Interpolate{x [N, C, H, W], output_size [out_h, out_w] (each >= 1), options}: [N, C, out_h,
// out_w], x's dtype. attrs [out_h, out_w, mode, align_corners].
Result<Operation> interpolate(const TensorIr& x, std::array<std::uint64_t, 2> output_size,
                              const InterpolateOptions& options, TensorId out);
// InterpolateBackward{x, grad [N, C, out_h, out_w], output_size, options}: x's shape and dtype
// (the gradient of Interpolate with respect to x); grad float, no same() (§6.3 lists none).
Result<Operation> interpolate_backward(const TensorIr& x, const TensorIr& grad,
                                       std::array<std::uint64_t, 2> output_size, const InterpolateOptions& options,
                                       TensorId out);
// Float GridSample2d{tensor [N, C, H, W], grid [N, Ho, Wo, 2] (x, y in [-1, 1]), options}:
// [N, C, Ho, Wo], tensor's dtype (carried); grid float. attrs [mode, padding_mode, align_corners].
Result<Operation> grid_sample_2d(const TensorIr& tensor, const TensorIr& grid, const GridSampleOptions& options,
                                 TensorId out);
// Unfold4d{x [N, C, H, W], kernel_size [kh, kw], options} (im2col): [N, C·kh·kw, L], L the
// blocks of the conv formula over H and W; x's dtype. attrs [kh, kw, s0, s1, p0, p1, d0, d1].
Result<Operation> unfold4d(const TensorIr& x, std::array<std::uint64_t, 2> kernel_size, const Unfold4dOptions& options,
                           TensorId out);

// ---- Convolutions of 1, 2 or 3 spatial dims and their gradients (docs/spec/ir.md §5.8, §6.3;
// PyTorch's conv{1,2,3}d / conv_transpose{1,2,3}d where the spec is silent). x [N, C_in, in...]
// and the weight have rank n + 2; the weight is [C_out, C_in / groups, k...] for a convolution and
// [C_in, C_out / groups, k...] for a transposed one (Burn's and PyTorch's layouts). Five
// signatures serve the 21 kinds, so their builders take the kind (checked to have the signature)
// and rank-generic options; conv1d ... conv_transpose3d are the forwards by name.

struct Conv1dOptions {
  std::uint64_t stride = 1;
  std::uint64_t padding = 0;
  std::uint64_t dilation = 1;
  std::uint64_t groups = 1;
};

struct Conv3dOptions {
  std::array<std::uint64_t, 3> stride{1, 1, 1};
  std::array<std::uint64_t, 3> padding{0, 0, 0};
  std::array<std::uint64_t, 3> dilation{1, 1, 1};
  std::uint64_t groups = 1;
};

struct ConvTranspose2dOptions {
  std::array<std::uint64_t, 2> stride{1, 1};
  std::array<std::uint64_t, 2> padding{0, 0};
  std::array<std::uint64_t, 2> padding_out{0, 0};
  std::array<std::uint64_t, 2> dilation{1, 1};
  std::uint64_t groups = 1;
};

struct ConvTranspose3dOptions {
  std::array<std::uint64_t, 3> stride{1, 1, 1};
  std::array<std::uint64_t, 3> padding{0, 0, 0};
  std::array<std::uint64_t, 3> padding_out{0, 0, 0};
  std::array<std::uint64_t, 3> dilation{1, 1, 1};
  std::uint64_t groups = 1;
};

// Any convolution's options: one value per spatial dim in each list (padding_out for transposed
// convolutions only, empty otherwise). The attributes are the lists in this order, then groups
// (op_table.h). stride, dilation, groups >= 1; every value fits an i64 attribute; a transposed
// convolution's padding_out < max(stride, dilation) per dim (PyTorch's rule).
struct ConvOptions {
  std::vector<std::uint64_t> stride;
  std::vector<std::uint64_t> padding;
  std::vector<std::uint64_t> padding_out;
  std::vector<std::uint64_t> dilation;
  std::uint64_t groups = 1;
};
ConvOptions conv_options(const Conv1dOptions& o);
ConvOptions conv_options(const Conv2dOptions& o);
ConvOptions conv_options(const Conv3dOptions& o);
ConvOptions conv_options(const ConvTranspose1dOptions& o);
ConvOptions conv_options(const ConvTranspose2dOptions& o);
ConvOptions conv_options(const ConvTranspose3dOptions& o);

// What a convolution kind computes: its spatial rank, whether it is transposed, and which of the
// forward and its gradients it is (the spec has no transposed XBackward).
enum class ConvRole : std::uint8_t { Forward, XBackward, WeightBackward, BiasBackward };
struct ConvKindInfo {
  std::size_t rank = 0;  // spatial dims, 1..3
  bool transposed = false;
  ConvRole role = ConvRole::Forward;
};
// The convolution a kind is (Conv1d ... ConvTranspose3dBiasBackward, Conv2d and ConvTranspose1d
// included); nullopt for any other kind.
std::optional<ConvKindInfo> conv_kind_info(OpKind kind);
// A convolution op's options read back from its attributes (the inverse of what the builders
// store), for the executors and the daemon's check: the kind's rank and transposition say how the
// list splits. Checked as the builders check the options: the count the rank takes, stride,
// dilation and groups at least 1, padding (and padding_out) at least 0, padding_out smaller than
// max(stride, dilation). Errors carry the message only (the caller names the op). Not for the
// bias gradients (no attributes) nor for other kinds.
Result<ConvOptions> conv_options_of(const Operation& op);

// Conv{1,2,3}d{x, weight [C_out, C_in / groups, k...], bias? [C_out], options}: [N, C_out,
// out...] by the conv formula; same(x, weight, bias?); C_in and C_out divisible by groups.
Result<Operation> conv(OpKind kind, const TensorIr& x, const TensorIr& weight, const std::optional<TensorIr>& bias,
                       const ConvOptions& options, TensorId out);
// ConvTranspose{1,2,3}d{x, weight [C_in, C_out / groups, k...], bias? [C_out], options}: [N,
// weight[1] · groups, out...] by the transposed formula; same(x, weight, bias?).
Result<Operation> conv_transpose(OpKind kind, const TensorIr& x, const TensorIr& weight,
                                 const std::optional<TensorIr>& bias, const ConvOptions& options, TensorId out);
// Conv{n}dXBackward / Conv{n}dWeightBackward{x, weight, output_grad, options}: S(x) / S(weight),
// D(output_grad) (no same() check, docs/spec/ir.md §6.3). x and weight pass conv's checks and
// output_grad has the forward's output shape.
Result<Operation> conv_backward(OpKind kind, const TensorIr& x, const TensorIr& weight, const TensorIr& output_grad,
                                const ConvOptions& options, TensorId out);
// ConvTranspose{n}dWeightBackward{x, weight, output_grad, options}: S(weight), D(output_grad);
// x and weight pass conv_transpose's checks and output_grad has the forward's output shape.
Result<Operation> conv_transpose_backward(OpKind kind, const TensorIr& x, const TensorIr& weight,
                                          const TensorIr& output_grad, const ConvOptions& options, TensorId out);
// Conv{n}dBiasBackward / ConvTranspose{n}dBiasBackward{x, bias, output_grad}: S(bias), output_grad
// summed over every dim but 1, D(output_grad). x and output_grad of rank n + 2 with the same batch,
// bias [output_grad[1]].
Result<Operation> conv_bias_backward(OpKind kind, const TensorIr& x, const TensorIr& bias, const TensorIr& output_grad,
                                     TensorId out);
Result<Operation> conv1d(const TensorIr& x, const TensorIr& weight, const std::optional<TensorIr>& bias,
                         const Conv1dOptions& options, TensorId out);
Result<Operation> conv3d(const TensorIr& x, const TensorIr& weight, const std::optional<TensorIr>& bias,
                         const Conv3dOptions& options, TensorId out);
Result<Operation> conv_transpose2d(const TensorIr& x, const TensorIr& weight, const std::optional<TensorIr>& bias,
                                   const ConvTranspose2dOptions& options, TensorId out);
Result<Operation> conv_transpose3d(const TensorIr& x, const TensorIr& weight, const std::optional<TensorIr>& bias,
                                   const ConvTranspose3dOptions& options, TensorId out);

// ---- Deformable convolution (docs/spec/ir.md §5.8, §6.3; torchvision's deform_conv2d, which
// Burn's deform_conv2d follows)

// DeformableConv2d's options (Burn's DeformConvOptions).
struct DeformableConv2dOptions {
  std::array<std::uint64_t, 2> stride{1, 1};
  std::array<std::uint64_t, 2> padding{0, 0};
  std::array<std::uint64_t, 2> dilation{1, 1};
  std::uint64_t weight_groups = 1;
  std::uint64_t offset_groups = 1;
};
// DeformableConv2d{x [N, C_in, H, W], offset [N, 2·og·kh·kw, H', W'], weight [C_out, C_in / wg, kh,
// kw], mask? [N, og·kh·kw, H', W'], bias? [C_out], options} → [N, C_out, H', W'] by the conv formula,
// x's dtype: tap (i, j) of output (h, w) reads channel c bilinearly (zeros outside) at (h·s0 − p0 +
// i·d0 + dy, w·s1 − p1 + j·d1 + dx), (dy, dx) = offset channels 2·t, 2·t + 1 of c's offset group g,
// t = (g·kh + i)·kw + j, scaled by mask channel t. same(x, offset, weight, mask?, bias?); stride,
// dilation, wg, og >= 1; C_in and C_out divisible by wg, C_in by og. attrs [present, s0, s1, p0, p1,
// d0, d1, wg, og] (kPresentMask, kPresentBias).
Result<Operation> deformable_conv2d(const TensorIr& x, const TensorIr& offset, const TensorIr& weight,
                                    const std::optional<TensorIr>& mask, const std::optional<TensorIr>& bias,
                                    const DeformableConv2dOptions& options, TensorId out);
// The outputs of DeformableConv2dBackward, in field order; mask_grad and bias_grad are given iff
// the op has the mask and bias inputs.
struct DeformableConv2dGradIds {
  TensorId input_grad, offset_grad, weight_grad;
  std::optional<TensorId> mask_grad, bias_grad;
};
// DeformableConv2dBackward{x, offset, weight, mask?, bias?, out_grad, options} → input_grad (S(x)),
// offset_grad (S(offset)), weight_grad (S(weight)), mask_grad? (S(mask)), bias_grad? (S(bias)), all
// x's dtype: the gradients of DeformableConv2d's output summed against out_grad (float, of the
// forward's output shape). same(x, weight, mask?, bias?), offset float (§6.3 does not check it).
Result<Operation> deformable_conv2d_backward(const TensorIr& x, const TensorIr& offset, const TensorIr& weight,
                                             const std::optional<TensorIr>& mask, const std::optional<TensorIr>& bias,
                                             const TensorIr& out_grad, const DeformableConv2dOptions& options,
                                             const DeformableConv2dGradIds& ids);

// ---- Signals (docs/spec/ir.md §5.8, §6.3; torch.fft.rfft / irfft where the spec is silent)

// Rfft{signal, dim, n?} → out_re, out_im: the one-sided DFT X[k] = Σ_t x[t]·e^(−2πi·k·t/n) along
// dim, k = 0 .. n/2, of the signal zero-padded or trimmed to n points (n: the dim's length when
// absent); both outputs the signal with [dim] = n / 2 + 1, its float dtype. dim < rank, n >= 1
// (given, or the length) and within an i64 attribute. attrs [dim, n or 0].
Result<Operation> rfft(const TensorIr& signal, std::uint64_t dim, std::optional<std::uint64_t> n, TensorId out_re,
                       TensorId out_im);
// IRfft{input_re, input_im, dim, n?} → out_signal: the inverse of rfft for a Hermitian signal of n
// points, n = 2·(len − 1) when absent; bins beyond n / 2 are ignored, missing ones are zero, and
// the imaginary parts of bins 0 and n / 2 do not count (C2R). input_re [..., len, ...] with len
// >= 1 and input_im of its shape and dtype (K); output input_re with [dim] = n. attrs [dim, n or 0].
Result<Operation> irfft(const TensorIr& input_re, const TensorIr& input_im, std::uint64_t dim,
                        std::optional<std::uint64_t> n, TensorId out_signal);

// ---- Attention and the CTC loss (docs/spec/ir.md §5.8, §6.3; Burn's attention and ctc_loss)

// Attention's options (Burn's AttentionModuleOptions): scale defaults to 1 / sqrt(head_dim);
// softcap, when given, maps every score s to softcap · tanh(s / softcap) before any masking.
struct AttentionOptions {
  std::optional<double> scale;
  std::optional<double> softcap;
  bool is_causal = false;
};
// Attention{query [B, H, Lq, D], key [B, H, Lk, D], value [B, H, Lk, Dv], mask? (bool), attn_bias?,
// options} → [B, H, Lq, Dv], query's dtype: softmax over the keys of the scores q·kᵀ·scale, softcapped,
// with −inf where mask is true (Burn: true masks out) and, when causal, where key j > query i +
// Lk − Lq (Burn's bottom-right diagonal), plus attn_bias; a row with every key masked gives 0.
// same(query, key, value, attn_bias?); mask and attn_bias of rank 4, each dim the scores' or 1;
// scale finite, softcap finite and > 0 (Burn asserts it). attrs [present, is_causal, bits(scale),
// bits(softcap)] (kPresent* bits, operation.h).
Result<Operation> attention(const TensorIr& query, const TensorIr& key, const TensorIr& value,
                            const std::optional<TensorIr>& mask, const std::optional<TensorIr>& attn_bias,
                            const AttentionOptions& options, TensorId out);
// CtcLoss{log_probs [T, N, C], targets [N, S], input_lengths [N], target_lengths [N], blank} → [N],
// log_probs' dtype: per sample −log of the summed probability of every alignment of its first
// target_lengths[n] labels to its first input_lengths[n] steps (+inf when there is none; PyTorch's
// reduction "none", zero_infinity false). Targets and lengths of integer dtypes, blank < C; the
// values (lengths within T and S, labels in [0, C) and not blank) are checked at execution.
Result<Operation> ctc_loss(const TensorIr& log_probs, const TensorIr& targets, const TensorIr& input_lengths,
                           const TensorIr& target_lengths, std::uint64_t blank, TensorId out);
// CtcLossBackward{log_probs, targets, input_lengths, target_lengths, grad_loss [N] (float), blank}
// → log_probs' shape and dtype: Burn's (and PyTorch's) gradient grad_loss[n] · (exp(lp) − the
// alignment posterior of each class), 0 from input_lengths[n] on.
Result<Operation> ctc_loss_backward(const TensorIr& log_probs, const TensorIr& targets, const TensorIr& input_lengths,
                                    const TensorIr& target_lengths, const TensorIr& grad_loss, std::uint64_t blank,
                                    TensorId out);

// ---- Lifecycle, custom, collectives

// Init{out}: registers a tensor provided out of band.
Result<Operation> init(const Shape& shape, DType dtype, TensorId out);
// Custom{id, inputs, outputs, scalars}: no inference; outputs are given and must be NotInit.
Result<Operation> custom(std::string id, std::span<const TensorIr> inputs, std::span<const TensorIr> outputs,
                         std::span<const ScalarIr> scalars);
// Drop(t): t must have status ReadWrite.
Result<Operation> drop(const TensorIr& tensor);
// AllReduce{tensor, op, device_ids}: output = tensor shape and dtype.
Result<Operation> all_reduce(const TensorIr& tensor, ReduceOperation op, std::span<const DeviceId> device_ids,
                             TensorId out);
Result<Operation> sync_collective();
// kiln extensions (op_table.def). device_ids index the ranks of the job's world (as AllReduce's).
// Broadcast{tensor, root, device_ids}: output = the root rank's tensor (shape and dtype of
// `tensor`); with ids named, root is below their number.
Result<Operation> broadcast(const TensorIr& tensor, std::uint64_t root, std::span<const DeviceId> device_ids,
                            TensorId out);
// AllGather{tensor, dim, device_ids}: every rank's tensor concatenated along `dim` in rank
// order; at least one id (the world's size: output dim = size × ids).
Result<Operation> all_gather(const TensorIr& tensor, std::uint64_t dim, std::span<const DeviceId> device_ids,
                             TensorId out);
// ReduceScatter{tensor, op, dim, device_ids}: the ranks' tensors reduced as AllReduce does, then
// cut along `dim` into one equal part per rank; rank r keeps part r. dim's size must divide by
// the number of ids (at least one).
Result<Operation> reduce_scatter(const TensorIr& tensor, ReduceOperation op, std::uint64_t dim,
                                 std::span<const DeviceId> device_ids, TensorId out);

}  // namespace kiln::ir::build
