// Reference kernels of the convolutions (docs/spec/ir.md §5.8): Conv1d/2d/3d, ConvTranspose1d/2d/3d
// and their X, Weight and Bias gradients, rank-generic. Every one walks the same loop space, that
// of a (non-transposed) convolution y = conv(x, w) with x [N, C_in, in...], w [C_out, C_in /
// groups, k...] and y [N, C_out, out...]; each product term x[xi] · w[wi] of y[yi] is a "tap". A
// forward sums the taps into y, the X gradient into x, the Weight gradient into w. A transposed
// convolution is the X gradient of the convolution whose input is its output (its weight
// [C_in, C_out / groups, k...] is that convolution's weight), so it runs the same space with its
// input on the y side. Floats accumulate in f64 in the space's order and are rounded once.
#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "kiln/ir/builders.h"
#include "reference_internal.h"

namespace kiln::reference::kernels {
namespace {

using ir::build::ConvKindInfo;
using ir::build::ConvRole;

// Spatial dims past the op's rank are unit dims (size 1, stride 1, no padding): one loop nest
// serves ranks 1 to 3.
constexpr std::size_t kMaxRank = 3;
using Dims = std::array<std::uint64_t, kMaxRank>;

// A convolution's attributes: [stride..., padding..., (padding_out...,) dilation..., groups].
struct ConvParams {
  Dims stride{1, 1, 1};
  Dims padding{0, 0, 0};
  Dims padding_out{0, 0, 0};
  Dims dilation{1, 1, 1};
  std::uint64_t groups = 1;
};

// The loop space (see the top of the file); `p` is the convolution's.
struct ConvSpace {
  std::size_t rank = 0;
  std::uint64_t batch = 0, c_in = 0, c_out = 0;
  Dims in{1, 1, 1}, out{1, 1, 1}, kernel{1, 1, 1};
  ConvParams p;

  static std::uint64_t product(const Dims& d) { return d[0] * d[1] * d[2]; }
  // [N, C_in, in...] and [N, C_out, out...]: the shapes on the x and the y side.
  ir::Shape x_shape() const { return with_spatial(c_in, in); }
  ir::Shape y_shape() const { return with_spatial(c_out, out); }
  ir::Shape with_spatial(std::uint64_t channels, const Dims& d) const {
    ir::Shape s{batch, channels};
    for (std::size_t i = 0; i < rank; ++i) s.push_back(d[i]);
    return s;
  }
};

// The kind's rank and role (the executor dispatched on its signature, so it is a convolution).
Result<ConvKindInfo> kind_info(const Ctx& c) {
  const std::optional<ConvKindInfo> k = ir::build::conv_kind_info(c.op.kind);
  if (!k) return c.error(ErrorCode::Internal, "not a convolution kind");
  return *k;
}

// The attributes (ir::build::conv_options_of, which checks them as the builders check the
// options), left-aligned in three dims.
Result<ConvParams> conv_params(const Ctx& c) {
  Result<ir::build::ConvOptions> o = ir::build::conv_options_of(c.op);
  if (!o.ok()) return c.error(o.error().code, o.error().message);
  ConvParams p;
  for (std::size_t i = 0; i < o->stride.size(); ++i) {
    p.stride[i] = o->stride[i];
    p.padding[i] = o->padding[i];
    p.dilation[i] = o->dilation[i];
    if (!o->padding_out.empty()) p.padding_out[i] = o->padding_out[i];
  }
  p.groups = o->groups;
  return p;
}

// A shape rule's result with its error named after the op.
Result<std::uint64_t> named(const Ctx& c, Result<std::uint64_t> r) {
  if (!r.ok()) return c.error(r.error().code, r.error().message);
  return r;
}

Status expect_conv_rank(const Ctx& c, const HostTensor& t, std::size_t rank, const char* what) {
  if (t.shape().size() != rank)
    return c.error(ErrorCode::RankMismatch, fmt::format("{} {} must have rank {}", what, t.to_string(), rank));
  return Status::Ok();
}

Status expect_float_operand(const Ctx& c, const HostTensor& t, const char* what) {
  if (!t.dtype().is_float())
    return c.error(ErrorCode::DTypeMismatch, fmt::format("{} {} must have a float dtype", what, t.to_string()));
  return Status::Ok();
}

// A convolution's space from x and the weight: the channels fit the groups, the output sizes come
// from the conv formula.
Result<ConvSpace> conv_space(const Ctx& c, ConvSpace s, const HostTensor& x, const HostTensor& w) {
  const ir::Shape& xs = x.shape();
  const ir::Shape& ws = w.shape();
  if (xs[1] % s.p.groups != 0 || ws[0] % s.p.groups != 0 || ws[1] != xs[1] / s.p.groups)
    return c.error(ErrorCode::IncompatibleShapes, fmt::format("x {} and weight {} ([C_out, C_in / groups, k...]) do "
                                                              "not fit {} groups",
                                                              x.to_string(), w.to_string(), s.p.groups));
  s.batch = xs[0];
  s.c_in = xs[1];
  s.c_out = ws[0];
  for (std::size_t i = 0; i < s.rank; ++i) {
    s.in[i] = xs[2 + i];
    s.kernel[i] = ws[2 + i];
    KILN_ASSIGN_OR_RETURN(s.out[i], named(c, ir::shape::conv_output(s.in[i], s.kernel[i], s.p.stride[i], s.p.padding[i],
                                                                    s.p.dilation[i])));
  }
  return s;
}

// A transposed convolution's space from its x and weight: its x is the y side, its output (sizes
// by the transposed formula) the x side, its weight's C_out / groups the convolution's C_in / groups.
Result<ConvSpace> transposed_space(const Ctx& c, ConvSpace s, const HostTensor& x, const HostTensor& w) {
  const ir::Shape& xs = x.shape();
  const ir::Shape& ws = w.shape();
  if (xs[1] != ws[0] || ws[0] % s.p.groups != 0)
    return c.error(ErrorCode::IncompatibleShapes, fmt::format("x {} and weight {} ([C_in, C_out / groups, k...]) do "
                                                              "not fit {} groups",
                                                              x.to_string(), w.to_string(), s.p.groups));
  s.batch = xs[0];
  s.c_out = xs[1];
  if (__builtin_mul_overflow(ws[1], s.p.groups, &s.c_in)) return c.error(ErrorCode::Invalid, "channel count overflows");
  for (std::size_t i = 0; i < s.rank; ++i) {
    s.out[i] = xs[2 + i];
    s.kernel[i] = ws[2 + i];
    KILN_ASSIGN_OR_RETURN(
        s.in[i], named(c, ir::shape::conv_transpose_output(s.out[i], s.kernel[i], s.p.stride[i], s.p.padding[i],
                                                           s.p.padding_out[i], s.p.dilation[i])));
  }
  return s;
}

// The op's space from its first two inputs (x, weight), after the attribute and rank checks.
Result<ConvSpace> op_space(const Ctx& c, const ConvKindInfo& k) {
  KILN_ASSIGN_OR_RETURN(ConvParams p, conv_params(c));
  KILN_RETURN_IF_ERROR(expect_conv_rank(c, c.in[0], k.rank + 2, "x"));
  KILN_RETURN_IF_ERROR(expect_conv_rank(c, c.in[1], k.rank + 2, "weight"));
  ConvSpace s;
  s.rank = k.rank;
  s.p = p;
  return k.transposed ? transposed_space(c, s, c.in[0], c.in[1]) : conv_space(c, s, c.in[0], c.in[1]);
}

// Input position o · stride − padding + k · dilation of dim d, when it falls inside [0, in).
bool tap_position(const ConvSpace& s, std::size_t d, std::uint64_t o, std::uint64_t k, std::uint64_t& i) {
  const std::uint64_t p = o * s.p.stride[d] + k * s.p.dilation[d];
  if (p < s.p.padding[d] || p - s.p.padding[d] >= s.in[d]) return false;
  i = p - s.p.padding[d];
  return true;
}

// The taps of one output position o (y index yi) and one pair of channels (x_base, w_base), in
// kernel order.
template <class F>
void kernel_taps(const ConvSpace& s, const Dims& o, std::uint64_t x_base, std::uint64_t w_base, std::uint64_t yi,
                 F& tap) {
  for (std::uint64_t k0 = 0; k0 < s.kernel[0]; ++k0) {
    std::uint64_t i0 = 0, i1 = 0, i2 = 0;
    if (!tap_position(s, 0, o[0], k0, i0)) continue;
    for (std::uint64_t k1 = 0; k1 < s.kernel[1]; ++k1) {
      if (!tap_position(s, 1, o[1], k1, i1)) continue;
      for (std::uint64_t k2 = 0; k2 < s.kernel[2]; ++k2) {
        if (!tap_position(s, 2, o[2], k2, i2)) continue;
        tap(x_base + (i0 * s.in[1] + i1) * s.in[2] + i2, w_base + (k0 * s.kernel[1] + k1) * s.kernel[2] + k2, yi);
      }
    }
  }
}

// Calls tap(xi, wi, yi) for every tap, in the order batch, output channel, output position, input
// channel of the group, kernel position: each y element sees its terms in the order conv2d summed
// them, each x element in the order conv_transpose1d scattered them.
template <class F>
void for_each_tap(const ConvSpace& s, F&& tap) {
  const std::uint64_t groups = s.p.groups, cin_g = s.c_in / groups, cout_g = s.c_out / groups;
  const std::uint64_t in_size = ConvSpace::product(s.in), out_size = ConvSpace::product(s.out);
  const std::uint64_t k_size = ConvSpace::product(s.kernel);
  for (std::uint64_t nb = 0; nb < s.batch; ++nb)
    for (std::uint64_t co = 0; co < s.c_out; ++co) {
      const std::uint64_t g = co / cout_g;  // c_out > 0 here, a multiple of groups: cout_g >= 1
      for (std::uint64_t o = 0; o < out_size; ++o) {
        const Dims pos{o / (s.out[1] * s.out[2]), (o / s.out[2]) % s.out[1], o % s.out[2]};
        const std::uint64_t yi = (nb * s.c_out + co) * out_size + o;
        for (std::uint64_t ci = 0; ci < cin_g; ++ci)
          kernel_taps(s, pos, (nb * s.c_in + g * cin_g + ci) * in_size, (co * cin_g + ci) * k_size, yi, tap);
      }
    }
}

// Which side the taps are summed into: y (forward), x (the X gradient, a transposed forward) or w.
enum class Into { Y, X, W };

// acc (the sums' initial values) += Σ taps: into y, a = x and b = w; into x, a = y and b = w;
// into w, a = x and b = y.
void accumulate(const ConvSpace& s, Into into, const std::vector<double>& a, const std::vector<double>& b,
                std::vector<double>& acc) {
  switch (into) {
    case Into::Y:
      for_each_tap(s, [&](std::uint64_t xi, std::uint64_t wi, std::uint64_t yi) { acc[yi] += a[xi] * b[wi]; });
      break;
    case Into::X:
      for_each_tap(s, [&](std::uint64_t xi, std::uint64_t wi, std::uint64_t yi) { acc[xi] += a[yi] * b[wi]; });
      break;
    case Into::W:
      for_each_tap(s, [&](std::uint64_t xi, std::uint64_t wi, std::uint64_t yi) { acc[wi] += a[xi] * b[yi]; });
      break;
  }
}

// The output, each sum rounded once to the output dtype.
Result<Outputs> store_sums(const Ctx& c, const std::vector<double>& acc) {
  KILN_ASSIGN_OR_RETURN(HostTensor out, c.new_output());
  for (std::uint64_t i = 0; i < acc.size(); ++i) element::store_f64(out.mutable_data(), out.dtype(), i, acc[i]);
  return single(std::move(out));
}

// The forwards' dtypes and bias: same(x, weight, bias?), a bias of the output's channels.
Status expect_forward_operands(const Ctx& c, std::uint64_t channels) {
  KILN_RETURN_IF_ERROR(expect_same_dtype(c, 0, 1));
  KILN_RETURN_IF_ERROR(expect_out_dtype(c, 0, c.in[0].dtype()));
  if (c.in.size() < 3) return Status::Ok();
  KILN_RETURN_IF_ERROR(expect_same_dtype(c, 0, 2));
  if (c.in[2].shape() != ir::Shape{channels})
    return c.error(ErrorCode::IncompatibleShapes,
                   fmt::format("bias {} must have shape [{}]", c.in[2].to_string(), channels));
  return Status::Ok();
}

}  // namespace

// Conv{1,2,3}d: y = bias + Σ taps (the bias first, as conv2d always summed). ConvTranspose{1,2,3}d:
// its output is the x side, Σ taps then + bias[channel] (as conv_transpose1d always added it).
Result<Outputs> run_conv(const Ctx& c) {
  KILN_ASSIGN_OR_RETURN(ConvKindInfo k, kind_info(c));
  KILN_ASSIGN_OR_RETURN(ConvSpace s, op_space(c, k));
  const ir::Shape shape = k.transposed ? s.x_shape() : s.y_shape();
  KILN_RETURN_IF_ERROR(expect_forward_operands(c, shape[1]));
  KILN_RETURN_IF_ERROR(expect_out_shape(c, 0, shape));
  const std::uint64_t inner = dims_product(shape, 2, shape.size());
  const std::vector<double> bias = c.in.size() > 2 ? c.in[2].to_f64() : std::vector<double>(shape[1], 0.0);
  std::vector<double> acc(static_cast<std::size_t>(ir::num_elements(shape)), 0.0);
  if (!k.transposed)  // conv2d summed into the bias
    for (std::uint64_t i = 0; i < acc.size(); ++i) acc[i] = bias[(i / inner) % shape[1]];
  accumulate(s, k.transposed ? Into::X : Into::Y, c.in[0].to_f64(), c.in[1].to_f64(), acc);
  if (k.transposed)  // conv_transpose1d added the bias to the sum
    for (std::uint64_t i = 0; i < acc.size(); ++i) acc[i] += bias[(i / inner) % shape[1]];
  return store_sums(c, acc);
}

// Conv{n}dXBackward{x, weight, output_grad} sums output_grad's taps into x's shape,
// Conv{n}dWeightBackward into the weight's; ConvTranspose{n}dWeightBackward{x, weight,
// output_grad} has its x on the y side and output_grad (shaped as its output) on the x side.
Result<Outputs> run_conv_backward(const Ctx& c) {
  KILN_ASSIGN_OR_RETURN(ConvKindInfo k, kind_info(c));
  KILN_ASSIGN_OR_RETURN(ConvSpace s, op_space(c, k));
  const HostTensor& g = c.in[2];
  static constexpr const char* kNames[] = {"x", "weight", "output_grad"};
  for (std::size_t i = 0; i < 3; ++i) KILN_RETURN_IF_ERROR(expect_float_operand(c, c.in[i], kNames[i]));
  const ir::Shape forward = k.transposed ? s.x_shape() : s.y_shape();
  if (g.shape() != forward)
    return c.error(ErrorCode::IncompatibleShapes, fmt::format("output_grad {} must have the forward's output shape {}",
                                                              g.to_string(), ir::shape_to_string(forward)));
  KILN_RETURN_IF_ERROR(expect_out_dtype(c, 0, g.dtype()));
  const bool x_grad = k.role == ConvRole::XBackward;
  KILN_RETURN_IF_ERROR(expect_out_shape(c, 0, x_grad ? c.in[0].shape() : c.in[1].shape()));
  std::vector<double> acc(static_cast<std::size_t>(ir::num_elements(c.out_ir().shape)), 0.0);
  if (x_grad)
    accumulate(s, Into::X, g.to_f64(), c.in[1].to_f64(), acc);
  else if (!k.transposed)
    accumulate(s, Into::W, c.in[0].to_f64(), g.to_f64(), acc);
  else
    accumulate(s, Into::W, g.to_f64(), c.in[0].to_f64(), acc);
  return store_sums(c, acc);
}

// Conv{n}dBiasBackward / ConvTranspose{n}dBiasBackward{x, bias, output_grad}: out[ch] = Σ
// output_grad[n, ch, ...] over the batch and every position, in index order.
Result<Outputs> run_conv_bias_backward(const Ctx& c) {
  KILN_ASSIGN_OR_RETURN(ConvKindInfo k, kind_info(c));
  const HostTensor& x = c.in[0];
  const HostTensor& bias = c.in[1];
  const HostTensor& g = c.in[2];
  static constexpr const char* kNames[] = {"x", "bias", "output_grad"};
  for (std::size_t i = 0; i < 3; ++i) KILN_RETURN_IF_ERROR(expect_float_operand(c, c.in[i], kNames[i]));
  KILN_RETURN_IF_ERROR(expect_conv_rank(c, x, k.rank + 2, "x"));
  KILN_RETURN_IF_ERROR(expect_conv_rank(c, g, k.rank + 2, "output_grad"));
  const std::uint64_t channels = g.shape()[1];
  if (g.shape()[0] != x.shape()[0] || bias.shape() != ir::Shape{channels})
    return c.error(ErrorCode::IncompatibleShapes, fmt::format("x {}, bias {} and output_grad {} do not fit",
                                                              x.to_string(), bias.to_string(), g.to_string()));
  KILN_RETURN_IF_ERROR(expect_out_dtype(c, 0, g.dtype()));
  KILN_RETURN_IF_ERROR(expect_out_shape(c, 0, bias.shape()));
  const std::uint64_t batch = g.shape()[0], inner = dims_product(g.shape(), 2, g.shape().size());
  std::vector<double> acc(static_cast<std::size_t>(channels), 0.0);
  for (std::uint64_t ch = 0; ch < channels; ++ch)
    for (std::uint64_t nb = 0; nb < batch; ++nb)
      for (std::uint64_t i = 0; i < inner; ++i) acc[ch] += g.get_f64((nb * channels + ch) * inner + i);
  return store_sums(c, acc);
}

}  // namespace kiln::reference::kernels
