// Reference kernels of the deformable convolution and its gradients (docs/spec/ir.md §5.8;
// torchvision's deform_conv2d, which Burn's follows). Tap (i, j) of output position (h, w) reads
// input channel c at (h·s0 − p0 + i·d0 + dy, w·s1 − p1 + j·d1 + dx), the offset (dy, dx) and the
// mask m of c's offset group, by torchvision's bilinear_interpolate: nothing when the point lies at
// or beyond one pixel outside the plane, corners outside it read zero. Per sample, the masked
// samples form columns (deformable im2col); the forward is the grouped matrix product of the
// weight with them plus the bias, and the backward differentiates every step: the weight and bias
// gradients from the columns, the column gradients from the weight, scattered to the input with
// the same bilinear weights, to the offsets through the weights' derivatives, and to the mask as
// the unmasked samples. f64 throughout, one rounding per output.
#include <array>
#include <cmath>
#include <vector>

#include "reference_internal.h"

namespace kiln::reference::kernels {
namespace {

using ir::kPresentBias;
using ir::kPresentMask;

// The op's geometry, checked: x [N, Cin, H, W], weight [Cout, Cin / wg, kh, kw], output plane
// [ho, wo]; the optional inputs when present.
struct Deform {
  std::uint64_t n = 0, cin = 0, h = 0, w = 0, cout = 0, kh = 0, kw = 0, ho = 0, wo = 0;
  std::array<std::uint64_t, 2> stride{}, pad{}, dil{};
  std::uint64_t wg = 1, og = 1;
  const HostTensor* mask = nullptr;
  const HostTensor* bias = nullptr;

  std::uint64_t taps() const { return kh * kw; }
  std::uint64_t plane() const { return ho * wo; }
  std::uint64_t cin_per_wg() const { return cin / wg; }
  std::uint64_t cout_per_wg() const { return cout / wg; }
  std::uint64_t cin_per_og() const { return cin / og; }
};

// Attributes [present, s0, s1, p0, p1, d0, d1, wg, og] and the optional inputs they announce
// (after x, offset, weight; `extra` inputs follow them: the backward's out_grad).
Status read_attrs(const Ctx& c, Deform& a, std::size_t extra) {
  const std::int64_t present = c.op.attrs[0];
  if (present < 0 || (present & ~(kPresentMask | kPresentBias)) != 0)
    return c.error(ErrorCode::Invalid, fmt::format("unknown presence bits {}", present));
  const std::size_t wanted = 3 + ((present & kPresentMask) ? 1 : 0) + ((present & kPresentBias) ? 1 : 0) + extra;
  if (c.in.size() != wanted)
    return c.error(ErrorCode::Invalid,
                   fmt::format("{} inputs, the presence bits {} announce {}", c.in.size(), present, wanted));
  if (present & kPresentMask) a.mask = &c.in[3];
  if (present & kPresentBias) a.bias = &c.in[a.mask ? 4 : 3];
  std::array<std::uint64_t, 8> v{};
  for (std::size_t i = 0; i < v.size(); ++i) {
    KILN_ASSIGN_OR_RETURN(v[i], count_attr(c, i + 1, "an option"));
  }
  a.stride = {v[0], v[1]};
  a.pad = {v[2], v[3]};
  a.dil = {v[4], v[5]};
  a.wg = v[6];
  a.og = v[7];
  if (v[0] == 0 || v[1] == 0 || v[4] == 0 || v[5] == 0 || a.wg == 0 || a.og == 0)
    return c.error(ErrorCode::Invalid, "stride, dilation, weight_groups and offset_groups must be at least 1");
  return Status::Ok();
}

// x, weight (float, rank 4, channels fitting the groups) and the output plane by the conv formula.
Status read_geometry(const Ctx& c, Deform& a) {
  const HostTensor &x = c.in[0], &weight = c.in[2];
  if (!x.dtype().is_float() || x.shape().size() != 4 || weight.shape().size() != 4)
    return c.error(ErrorCode::IncompatibleShapes,
                   fmt::format("x {} and weight {} must be float [N, C, H, W] and [C_out, C_in / wg, kh, kw]",
                               x.to_string(), weight.to_string()));
  KILN_RETURN_IF_ERROR(expect_same_dtype(c, 0, 2));
  a.n = x.shape()[0], a.cin = x.shape()[1], a.h = x.shape()[2], a.w = x.shape()[3];
  a.cout = weight.shape()[0], a.kh = weight.shape()[2], a.kw = weight.shape()[3];
  std::uint64_t taps = 0;  // an empty weight may claim any kernel
  if (__builtin_mul_overflow(a.kh, a.kw, &taps))
    return c.error(ErrorCode::Invalid, fmt::format("weight {}: kh · kw overflows", weight.to_string()));
  if (a.cin % a.wg != 0 || a.cout % a.wg != 0 || weight.shape()[1] != a.cin / a.wg || a.cin % a.og != 0)
    return c.error(ErrorCode::IncompatibleShapes,
                   fmt::format("x {} and weight {} do not fit {} weight groups and {} offset groups", x.to_string(),
                               weight.to_string(), a.wg, a.og));
  const Result<std::uint64_t> ho = ir::shape::conv_output(a.h, a.kh, a.stride[0], a.pad[0], a.dil[0]);
  const Result<std::uint64_t> wo = ir::shape::conv_output(a.w, a.kw, a.stride[1], a.pad[1], a.dil[1]);
  if (!ho.ok()) return c.error(ho.error().code, ho.error().message);
  if (!wo.ok()) return c.error(wo.error().code, wo.error().message);
  a.ho = *ho, a.wo = *wo;
  return Status::Ok();
}

// offset [N, 2·og·taps, ho, wo] (float), mask? [N, og·taps, ho, wo] and bias? [Cout] of x's dtype.
Status check_operands(const Ctx& c, const Deform& a, bool forward) {
  const HostTensor& offset = c.in[1];
  std::uint64_t per_group = 0, offsets = 0;  // og may be any divisor of a zero channel count
  if (__builtin_mul_overflow(a.og, a.taps(), &per_group) || __builtin_mul_overflow(per_group, 2, &offsets))
    return c.error(ErrorCode::Invalid, fmt::format("{} offset groups of {} taps overflow", a.og, a.taps()));
  const ir::Shape want{a.n, offsets, a.ho, a.wo};
  if (!offset.dtype().is_float() || offset.shape() != want || (forward && !(offset.dtype() == c.in[0].dtype())))
    return c.error(ErrorCode::IncompatibleShapes,
                   fmt::format("offset {} must be a float {}", offset.to_string(), ir::shape_to_string(want)));
  const ir::DType dtype = c.in[0].dtype();
  const ir::Shape want_mask{a.n, per_group, a.ho, a.wo};
  if (a.mask && (a.mask->shape() != want_mask || !(a.mask->dtype() == dtype)))
    return c.error(ErrorCode::IncompatibleShapes,
                   fmt::format("mask {} must be {} of x's dtype", a.mask->to_string(), ir::shape_to_string(want_mask)));
  if (a.bias && (a.bias->shape() != ir::Shape{a.cout} || !(a.bias->dtype() == dtype)))
    return c.error(ErrorCode::IncompatibleShapes,
                   fmt::format("bias {} must be [{}] of x's dtype", a.bias->to_string(), a.cout));
  return Status::Ok();
}

Result<Deform> deform_of(const Ctx& c, bool forward) {
  Deform a;
  KILN_RETURN_IF_ERROR(read_attrs(c, a, forward ? 0 : 1));
  KILN_RETURN_IF_ERROR(read_geometry(c, a));
  // Products of the channel counts stay within the tensors' element counts once these hold.
  KILN_RETURN_IF_ERROR(check_operands(c, a, forward));
  return a;
}

// Where tap t = (i, j) of offset group g reads for output position p, and its mask value.
struct Point {
  double y = 0, x = 0, m = 1;
};

Point point_of(const Ctx& c, const Deform& a, std::uint64_t n, std::uint64_t g, std::uint64_t t, std::uint64_t p) {
  const HostTensor& offset = c.in[1];
  const std::uint64_t i = t / a.kw, j = t % a.kw, tap = g * a.taps() + t;
  const std::uint64_t dy_at = (n * 2 * a.og * a.taps() + 2 * tap) * a.plane() + p;
  const double base_y = static_cast<double>(p / a.wo) * static_cast<double>(a.stride[0]) -
                        static_cast<double>(a.pad[0]) + static_cast<double>(i) * static_cast<double>(a.dil[0]);
  const double base_x = static_cast<double>(p % a.wo) * static_cast<double>(a.stride[1]) -
                        static_cast<double>(a.pad[1]) + static_cast<double>(j) * static_cast<double>(a.dil[1]);
  Point pt{base_y + offset.get_f64(dy_at), base_x + offset.get_f64(dy_at + a.plane()), 1.0};
  if (a.mask) pt.m = a.mask->get_f64((n * a.og * a.taps() + tap) * a.plane() + p);
  return pt;
}

// The corners of (y, x) inside an h × w plane with their bilinear weights and the weights'
// derivatives in y and x (torchvision's bilinear_interpolate and get_coordinate_weight).
struct Bilinear {
  std::array<std::uint64_t, 4> at{};
  std::array<double, 4> weight{}, dy{}, dx{};
  std::size_t n = 0;
};

Bilinear bilinear(double y, double x, std::uint64_t h, std::uint64_t w) {
  Bilinear b;
  // Also false for NaN: no integer conversion of an unchecked coordinate.
  if (!(y > -1 && y < static_cast<double>(h) && x > -1 && x < static_cast<double>(w))) return b;
  const double fy = std::floor(y), fx = std::floor(x);
  const double ly = y - fy, lx = x - fx, hy = 1 - ly, hx = 1 - lx;
  const auto y0 = static_cast<std::int64_t>(fy), x0 = static_cast<std::int64_t>(fx);
  struct Corner {
    std::int64_t r, c;
    double weight, dy, dx;
  };
  const Corner corners[] = {{y0, x0, hy * hx, -hx, -hy},
                            {y0, x0 + 1, hy * lx, -lx, hy},
                            {y0 + 1, x0, ly * hx, hx, -ly},
                            {y0 + 1, x0 + 1, ly * lx, lx, ly}};
  for (const Corner& k : corners) {
    if (k.r < 0 || k.c < 0 || k.r >= static_cast<std::int64_t>(h) || k.c >= static_cast<std::int64_t>(w)) continue;
    b.at[b.n] = static_cast<std::uint64_t>(k.r) * w + static_cast<std::uint64_t>(k.c);
    b.weight[b.n] = k.weight, b.dy[b.n] = k.dy, b.dx[b.n] = k.dx;
    ++b.n;
  }
  return b;
}

// Sample n's columns: col[(ci·taps + t)·plane + p] = m · x̃ (the masked bilinear sample).
std::vector<double> columns(const Ctx& c, const Deform& a, std::uint64_t n) {
  const HostTensor& x = c.in[0];
  std::vector<double> col(static_cast<std::size_t>(a.cin * a.taps() * a.plane()));
  for (std::uint64_t ci = 0; ci < a.cin; ++ci) {
    const std::uint64_t base = (n * a.cin + ci) * a.h * a.w, g = ci / a.cin_per_og();
    for (std::uint64_t t = 0; t < a.taps(); ++t)
      for (std::uint64_t p = 0; p < a.plane(); ++p) {
        const Point pt = point_of(c, a, n, g, t, p);
        const Bilinear b = bilinear(pt.y, pt.x, a.h, a.w);
        double v = 0;
        for (std::size_t k = 0; k < b.n; ++k) v += b.weight[k] * x.get_f64(base + b.at[k]);
        col[static_cast<std::size_t>((ci * a.taps() + t) * a.plane() + p)] = pt.m * v;
      }
  }
  return col;
}

// Weight element of output channel o, its group's input channel ci (absolute) and tap t.
std::uint64_t weight_at(const Deform& a, std::uint64_t o, std::uint64_t ci, std::uint64_t t) {
  return (o * a.cin_per_wg() + ci % a.cin_per_wg()) * a.taps() + t;
}

// Sample n's column gradients: Σ over the output channels of ci's weight group of weight · out_grad.
std::vector<double> column_grads(const Ctx& c, const Deform& a, const HostTensor& out_grad, std::uint64_t n) {
  const HostTensor& weight = c.in[2];
  std::vector<double> gcol(static_cast<std::size_t>(a.cin * a.taps() * a.plane()), 0.0);
  for (std::uint64_t ci = 0; ci < a.cin; ++ci) {
    const std::uint64_t group = ci / a.cin_per_wg();
    for (std::uint64_t ol = 0; ol < a.cout_per_wg(); ++ol) {
      const std::uint64_t o = group * a.cout_per_wg() + ol;
      for (std::uint64_t t = 0; t < a.taps(); ++t) {
        const double wv = weight.get_f64(weight_at(a, o, ci, t));
        for (std::uint64_t p = 0; p < a.plane(); ++p)
          gcol[static_cast<std::size_t>((ci * a.taps() + t) * a.plane() + p)] +=
              wv * out_grad.get_f64((n * a.cout + o) * a.plane() + p);
      }
    }
  }
  return gcol;
}

// The gradients' accumulators, one per output (mask and bias ones empty when absent).
struct Grads {
  std::vector<double> x, offset, weight, mask, bias;
};

// From the columns of sample n: weight_grad += out_grad · col over the plane, bias_grad += out_grad.
void accumulate_weight_bias(const Deform& a, const HostTensor& out_grad, std::uint64_t n,
                            const std::vector<double>& col, Grads& g) {
  for (std::uint64_t o = 0; o < a.cout; ++o) {
    const std::uint64_t group = o / a.cout_per_wg();
    for (std::uint64_t p = 0; p < a.plane(); ++p) {
      const double go = out_grad.get_f64((n * a.cout + o) * a.plane() + p);
      if (a.bias) g.bias[static_cast<std::size_t>(o)] += go;
      for (std::uint64_t cl = 0; cl < a.cin_per_wg(); ++cl) {
        const std::uint64_t ci = group * a.cin_per_wg() + cl;
        for (std::uint64_t t = 0; t < a.taps(); ++t)
          g.weight[static_cast<std::size_t>(weight_at(a, o, ci, t))] +=
              go * col[static_cast<std::size_t>((ci * a.taps() + t) * a.plane() + p)];
      }
    }
  }
}

// From the column gradients of sample n: the input (scattered with the bilinear weights), the
// offsets (through the weights' derivatives) and the mask (the unmasked sample).
void accumulate_sampled(const Ctx& c, const Deform& a, std::uint64_t n, const std::vector<double>& gcol, Grads& g) {
  const HostTensor& x = c.in[0];
  for (std::uint64_t ci = 0; ci < a.cin; ++ci) {
    const std::uint64_t base = (n * a.cin + ci) * a.h * a.w, group = ci / a.cin_per_og();
    for (std::uint64_t t = 0; t < a.taps(); ++t) {
      const std::uint64_t tap = group * a.taps() + t;
      for (std::uint64_t p = 0; p < a.plane(); ++p) {
        const double gc = gcol[static_cast<std::size_t>((ci * a.taps() + t) * a.plane() + p)];
        const Point pt = point_of(c, a, n, group, t, p);
        const Bilinear b = bilinear(pt.y, pt.x, a.h, a.w);
        double v = 0, vy = 0, vx = 0;
        for (std::size_t k = 0; k < b.n; ++k) {
          const double xv = x.get_f64(base + b.at[k]);
          v += b.weight[k] * xv, vy += b.dy[k] * xv, vx += b.dx[k] * xv;
          g.x[static_cast<std::size_t>(base + b.at[k])] += gc * pt.m * b.weight[k];
        }
        const std::uint64_t dy_at = (n * 2 * a.og * a.taps() + 2 * tap) * a.plane() + p;
        g.offset[static_cast<std::size_t>(dy_at)] += gc * pt.m * vy;
        g.offset[static_cast<std::size_t>(dy_at + a.plane())] += gc * pt.m * vx;
        if (a.mask) g.mask[static_cast<std::size_t>((n * a.og * a.taps() + tap) * a.plane() + p)] += gc * v;
      }
    }
  }
}

// Each accumulator of an output the op has into it, rounded once.
Result<Outputs> store_grads(const Ctx& c, const Deform& a, const Grads& g) {
  Outputs outs;
  const std::vector<double>* parts[] = {&g.x, &g.offset, &g.weight, a.mask ? &g.mask : nullptr,
                                        a.bias ? &g.bias : nullptr};
  for (const std::vector<double>* part : parts) {
    if (part == nullptr) continue;
    KILN_ASSIGN_OR_RETURN(HostTensor t, c.new_output(outs.size()));
    for (std::size_t i = 0; i < part->size(); ++i) element::store_f64(t.mutable_data(), t.dtype(), i, (*part)[i]);
    outs.push_back(std::move(t));
  }
  return outs;
}

// The backward's outputs: input_grad, offset_grad, weight_grad, mask_grad?, bias_grad?, x's dtype.
Status check_grad_outputs(const Ctx& c, const Deform& a) {
  const std::size_t wanted = 3 + (a.mask ? 1 : 0) + (a.bias ? 1 : 0);
  if (c.op.outputs().size() != wanted)
    return c.error(ErrorCode::Invalid,
                   fmt::format("{} outputs, the inputs give {} gradients", c.op.outputs().size(), wanted));
  const ir::Shape* shapes[] = {&c.in[0].shape(), &c.in[1].shape(), &c.in[2].shape(),
                               a.mask ? &a.mask->shape() : nullptr, a.bias ? &a.bias->shape() : nullptr};
  std::size_t out = 0;
  for (const ir::Shape* shape : shapes) {
    if (shape == nullptr) continue;
    KILN_RETURN_IF_ERROR(expect_out_shape(c, out, *shape));
    KILN_RETURN_IF_ERROR(expect_out_dtype(c, out, c.in[0].dtype()));
    ++out;
  }
  return Status::Ok();
}

}  // namespace

// DeformableConv2d{x, offset, weight, mask?, bias?} → [N, Cout, ho, wo], x's dtype.
Result<Outputs> run_deformable_conv2d(const Ctx& c) {
  KILN_ASSIGN_OR_RETURN(Deform a, deform_of(c, true));
  KILN_RETURN_IF_ERROR(expect_out_shape(c, 0, ir::Shape{a.n, a.cout, a.ho, a.wo}));
  KILN_RETURN_IF_ERROR(expect_out_dtype(c, 0, c.in[0].dtype()));
  KILN_ASSIGN_OR_RETURN(HostTensor out, c.new_output());
  const HostTensor& weight = c.in[2];
  for (std::uint64_t n = 0; n < a.n; ++n) {
    const std::vector<double> col = columns(c, a, n);
    for (std::uint64_t o = 0; o < a.cout; ++o) {
      const std::uint64_t group = o / a.cout_per_wg();
      for (std::uint64_t p = 0; p < a.plane(); ++p) {
        double acc = a.bias ? a.bias->get_f64(o) : 0.0;
        for (std::uint64_t cl = 0; cl < a.cin_per_wg(); ++cl) {
          const std::uint64_t ci = group * a.cin_per_wg() + cl;
          for (std::uint64_t t = 0; t < a.taps(); ++t)
            acc += weight.get_f64(weight_at(a, o, ci, t)) *
                   col[static_cast<std::size_t>((ci * a.taps() + t) * a.plane() + p)];
        }
        element::store_f64(out.mutable_data(), out.dtype(), (n * a.cout + o) * a.plane() + p, acc);
      }
    }
  }
  return single(std::move(out));
}

// DeformableConv2dBackward{x, offset, weight, mask?, bias?, out_grad} → input_grad, offset_grad,
// weight_grad, mask_grad?, bias_grad?.
Result<Outputs> run_deformable_conv2d_backward(const Ctx& c) {
  KILN_ASSIGN_OR_RETURN(Deform a, deform_of(c, false));
  const HostTensor& out_grad = c.in.back();
  if (!out_grad.dtype().is_float() || out_grad.shape() != ir::Shape{a.n, a.cout, a.ho, a.wo})
    return c.error(ErrorCode::IncompatibleShapes, fmt::format("out_grad {} must be a float [{}, {}, {}, {}]",
                                                              out_grad.to_string(), a.n, a.cout, a.ho, a.wo));
  KILN_RETURN_IF_ERROR(check_grad_outputs(c, a));
  Grads g;
  g.x.assign(static_cast<std::size_t>(c.in[0].num_elements()), 0.0);
  g.offset.assign(static_cast<std::size_t>(c.in[1].num_elements()), 0.0);
  g.weight.assign(static_cast<std::size_t>(c.in[2].num_elements()), 0.0);
  if (a.mask) g.mask.assign(static_cast<std::size_t>(a.mask->num_elements()), 0.0);
  if (a.bias) g.bias.assign(static_cast<std::size_t>(a.cout), 0.0);
  for (std::uint64_t n = 0; n < a.n; ++n) {
    accumulate_weight_bias(a, out_grad, n, columns(c, a, n), g);
    accumulate_sampled(c, a, n, column_grads(c, a, out_grad, n), g);
  }
  return store_grads(c, a, g);
}

}  // namespace kiln::reference::kernels
