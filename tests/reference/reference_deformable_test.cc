// Reference executor: the deformable convolution (docs/spec/ir.md §5.8, torchvision's
// deform_conv2d). Zero offsets and no mask equal Conv2d (stride, padding, dilation, weight
// groups); integer offsets shift the image; fractional ones sample bilinearly by hand, with
// torchvision's boundary rule; the mask scales each tap of its offset group; the bias adds. The
// backward by central differences of the forward in f64 (every input, with and without mask and
// bias, two weight and two offset groups); forced bad ops.
#include <cmath>
#include <cstddef>
#include <optional>
#include <random>
#include <vector>

#include "kiln/testing/status.h"
#include "reference_test_util.h"

namespace kiln::reference::testing {
namespace {

// A deformable convolution's shapes (an empty mask shape: no mask) and options.
struct Case {
  Shape x, offset, weight, mask;
  bool bias = false;
  b::DeformableConv2dOptions options;
};

// Its operands' values.
struct Values {
  std::vector<double> x, offset, weight, mask, bias;
};

struct Registered {
  TensorIr x, offset, weight;
  std::optional<TensorIr> mask, bias;
};

Registered register_values(Device& d, const Case& k, const Values& v) {
  Registered r{d.f64(k.x, dtypes::f64, v.x), d.f64(k.offset, dtypes::f64, v.offset),
               d.f64(k.weight, dtypes::f64, v.weight), std::nullopt, std::nullopt};
  if (!k.mask.empty()) r.mask = d.f64(k.mask, dtypes::f64, v.mask);
  if (k.bias) r.bias = d.f64({k.weight[0]}, dtypes::f64, v.bias);
  return r;
}

std::vector<double> forward(const Case& k, const Values& v) {
  Device d;
  const Registered r = register_values(d, k, v);
  return d.f64_of(d.ok(b::deformable_conv2d(r.x, r.offset, r.weight, r.mask, r.bias, k.options, d.fresh())));
}

// The backward's outputs in order: input, offset, weight, then mask and bias when present.
std::vector<std::vector<double>> backward(const Case& k, const Values& v, const Shape& out,
                                          const std::vector<double>& grad) {
  Device d;
  const Registered r = register_values(d, k, v);
  b::DeformableConv2dGradIds ids{d.fresh(), d.fresh(), d.fresh(), std::nullopt, std::nullopt};
  if (r.mask) ids.mask_grad = d.fresh();
  if (r.bias) ids.bias_grad = d.fresh();
  const Result<Operation> op = b::deformable_conv2d_backward(r.x, r.offset, r.weight, r.mask, r.bias,
                                                             d.f64(out, dtypes::f64, grad), k.options, ids);
  d.ok(op);
  std::vector<std::vector<double>> grads;
  if (op.ok())
    for (const TensorIr& o : op->outputs()) grads.push_back(d.f64_of(o.id));
  return grads;
}

// ---- The forward by hand and against Conv2d

// Zero offsets and no mask read the kernel positions themselves: Conv2d with the same stride,
// padding, dilation and (weight) groups.
TEST(ReferenceDeformableConv2dTest, ZeroOffsetsAreConv2d) {
  for (int variant = 0; variant < 3; ++variant) {
    b::DeformableConv2dOptions o;
    b::Conv2dOptions co;
    if (variant >= 1) o.stride = co.stride = {2, 1}, o.padding = co.padding = {1, 2}, o.dilation = co.dilation = {1, 2};
    if (variant == 2) o.weight_groups = co.groups = 2, o.offset_groups = 4;
    const std::uint64_t cin_per_group = variant == 2 ? 2 : 4;
    const Shape xs{2, 4, 5, 6}, ws{6, cin_per_group, 3, 2};
    Device d;
    const TensorIr x = d.f64(xs, dtypes::f64, random_values(240, 1));
    const TensorIr w = d.f64(ws, dtypes::f64, random_values(6 * cin_per_group * 6, 2));
    const TensorIr bias = d.f64({6}, dtypes::f64, random_values(6, 3));
    const TensorId conv = d.ok(b::conv2d(x, w, bias, co, d.fresh()));
    const Shape out = d.shape_of(conv);
    const std::uint64_t offsets = 2 * o.offset_groups * 6 * out[2] * out[3] * 2;
    const TensorIr offset = d.f64({2, 2 * o.offset_groups * 6, out[2], out[3]}, dtypes::f64,
                                  std::vector<double>(static_cast<std::size_t>(offsets), 0.0));
    const TensorId deform = d.ok(b::deformable_conv2d(x, offset, w, std::nullopt, bias, o, d.fresh()));
    EXPECT_EQ(d.shape_of(deform), out);
    EXPECT_THAT(d.f64_of(deform), Near(d.f64_of(conv), 1e-13)) << "variant " << variant;
  }
}

// A 1 x 1 kernel over [[1, 2], [3, 4]]: integer offsets shift the image (zeros from outside),
// fractional ones interpolate; a point at one pixel outside reads nothing.
TEST(ReferenceDeformableConv2dTest, OffsetsSampleBilinearly) {
  Device d;
  const TensorIr x = d.f64({1, 1, 2, 2}, dtypes::f64, {1, 2, 3, 4});
  const TensorIr w = d.f64({1, 1, 1, 1}, dtypes::f64, {1});
  auto run = [&](std::vector<double> dy, std::vector<double> dx) {
    std::vector<double> offset = dy;
    offset.insert(offset.end(), dx.begin(), dx.end());  // channel 0: dy of the 4 positions, 1: dx
    return d.f64_of(d.ok(b::deformable_conv2d(x, d.f64({1, 2, 2, 2}, dtypes::f64, offset), w, std::nullopt,
                                              std::nullopt, {}, d.fresh())));
  };
  EXPECT_EQ(run({1, 1, 1, 1}, {0, 0, 0, 0}), (std::vector<double>{3, 4, 0, 0}));      // one row down
  EXPECT_EQ(run({0, 0, 0, 0}, {-1, -1, -1, -1}), (std::vector<double>{0, 1, 0, 3}));  // one column left
  // (½, ½) from each position: the mean of the four at (0, 0); at (0, 1) the corners (0, 1) and
  // (1, 1) weigh ¼ each, those beyond the last column read zero.
  EXPECT_EQ(run({0.5, 0.5, 0.5, 0.5}, {0.5, 0.5, 0.5, 0.5}), (std::vector<double>{2.5, 1.5, 1.75, 1}));
  // y = −1 exactly reads nothing; y = −½ reads half of row 0.
  EXPECT_EQ(run({-1, -0.5, 0, 0}, {0, 0, 0, 0}), (std::vector<double>{0, 1, 3, 4}));
  // A NaN or far offset reads nothing.
  EXPECT_EQ(run({kNaN, 1e300, 0, 0}, {0, 0, -kInf, 0}), (std::vector<double>{0, 0, 0, 4}));
}

// The mask scales each tap of its offset group; the bias adds to every position of its channel.
TEST(ReferenceDeformableConv2dTest, MaskScalesPerOffsetGroupAndBiasAdds) {
  Device d;
  // Two channels, two offset groups, one output channel summing both: 1 x 1 kernel, no offsets.
  const TensorIr x = d.f64({1, 2, 1, 2}, dtypes::f64, {1, 2, 10, 20});
  const TensorIr w = d.f64({1, 2, 1, 1}, dtypes::f64, {1, 1});
  const TensorIr offset = d.f64({1, 4, 1, 2}, dtypes::f64, std::vector<double>(8, 0.0));
  const TensorIr mask = d.f64({1, 2, 1, 2}, dtypes::f64, {0.5, 1, 0, 2});  // group 0, then group 1
  b::DeformableConv2dOptions o;
  o.offset_groups = 2;
  const TensorIr bias = d.f64({1}, dtypes::f64, {100});
  EXPECT_EQ(d.f64_of(d.ok(b::deformable_conv2d(x, offset, w, mask, bias, o, d.fresh()))),
            (std::vector<double>{100.5, 142}));
}

// ---- The backward by central differences

// x [1, 4, 4, 4], weight [4, 2, 2, 2] (2 weight groups), 2 offset groups, stride 2, padding 1:
// output [1, 4, 3, 3]; random offsets in (−1.5, 1.5), masks in (0, 2).
Case gradient_case(bool with_mask, bool with_bias) {
  Case k{{1, 4, 4, 4}, {1, 16, 3, 3}, {4, 2, 2, 2}, {}, with_bias, {}};
  if (with_mask) k.mask = {1, 8, 3, 3};
  k.options.stride = {2, 2}, k.options.padding = {1, 1};
  k.options.weight_groups = k.options.offset_groups = 2;
  return k;
}

Values gradient_values() {
  return {random_values(64, 4), random_values(144, 5, -1.5, 1.5), random_values(32, 6), random_values(72, 7, 0, 2),
          random_values(4, 8)};
}

double weighted(const std::vector<double>& y, const std::vector<double>& g) {
  double s = 0;
  for (std::size_t i = 0; i < y.size(); ++i) s += y[i] * g[i];
  return s;
}

void expect_gradients_match(bool with_mask, bool with_bias) {
  const Case k = gradient_case(with_mask, with_bias);
  Values v = gradient_values();
  const Shape out{1, 4, 3, 3};
  const std::vector<double> g = random_values(36, 9);
  const std::vector<std::vector<double>> grads = backward(k, v, out, g);
  std::vector<std::vector<double>*> parts{&v.x, &v.offset, &v.weight};
  if (with_mask) parts.push_back(&v.mask);
  if (with_bias) parts.push_back(&v.bias);
  ASSERT_EQ(grads.size(), parts.size());
  constexpr double h = 1e-5;
  for (std::size_t part = 0; part < parts.size(); ++part) {
    std::vector<double>& values = *parts[part];
    ASSERT_EQ(grads[part].size(), values.size());
    for (std::size_t i = 0; i < values.size(); ++i) {
      const double keep = values[i];
      values[i] = keep + h;
      const double up = weighted(forward(k, v), g);
      values[i] = keep - h;
      const double down = weighted(forward(k, v), g);
      values[i] = keep;
      EXPECT_NEAR(grads[part][i], (up - down) / (2 * h), 1e-7) << "output " << part << " element " << i;
    }
  }
}

TEST(ReferenceDeformableConv2dBackwardTest, IsTheGradientWithMaskAndBias) { expect_gradients_match(true, true); }

TEST(ReferenceDeformableConv2dBackwardTest, IsTheGradientWithoutMaskOrBias) { expect_gradients_match(false, false); }

TEST(ReferenceDeformableConv2dBackwardTest, IsTheGradientWithEitherOptionalInput) {
  expect_gradients_match(true, false);
  expect_gradients_match(false, true);
}

// ---- Forced bad ops (hand-made: every builder check is made again)

TEST(ReferenceDeformableConv2dTest, HandMadeOpsAreCheckedAgain) {
  Device d;
  const TensorIr x = d.f64({1, 2, 3, 3}, dtypes::f32, std::vector<double>(18, 1.0));
  const TensorIr offset = d.f64({1, 2, 3, 3}, dtypes::f32, std::vector<double>(18, 0.25));
  const TensorIr w = d.f64({2, 2, 1, 1}, dtypes::f32, {1, 2, 3, 4});
  const TensorIr mask = d.f64({1, 1, 3, 3}, dtypes::f32, std::vector<double>(9, 1.0));
  const Operation fwd = *b::deformable_conv2d(x, offset, w, mask, std::nullopt, {}, d.fresh());
  const Operation back = *b::deformable_conv2d_backward(x, offset, w, mask, std::nullopt,
                                                        d.f64({1, 2, 3, 3}, dtypes::f32, std::vector<double>(18, 1)),
                                                        {}, {d.fresh(), d.fresh(), d.fresh(), d.fresh(), std::nullopt});
  auto expect_error = [&](Operation op, const char* what) {
    for (TensorIr& o : op.outputs()) o.id = d.fresh();
    const Status st = d.exec.execute(op, d.handles);
    ASSERT_FALSE(st.ok()) << op.to_string();
    EXPECT_NE(st.error().message.find(what), std::string::npos) << st.error().message;
  };
  Operation bad = fwd;
  bad.attrs[0] = 4;
  expect_error(bad, "unknown presence bits 4");
  bad = fwd;
  bad.attrs[0] = ir::kPresentMask | ir::kPresentBias;
  expect_error(bad, "4 inputs, the presence bits 3 announce 5");
  bad = fwd;
  bad.attrs[1] = 0;
  expect_error(bad, "stride, dilation, weight_groups and offset_groups must be at least 1");
  bad = fwd;
  bad.attrs[8] = 3;  // 3 offset groups of 2 channels
  expect_error(bad, "do not fit");
  bad = fwd;
  bad.attrs[3] = -1;
  expect_error(bad, "must not be negative");
  bad = fwd;
  bad.tensors[1] = d.f64({1, 2, 3, 2}, dtypes::f32, std::vector<double>(12, 0.0));
  expect_error(bad, "offset");
  bad = fwd;
  bad.tensors[3] = d.f64({1, 1, 3, 3}, dtypes::f64, std::vector<double>(9, 1.0));
  expect_error(bad, "mask");
  bad = fwd;
  bad.outputs()[0].dtype = dtypes::f64;
  expect_error(bad, "must have dtype f32");
  bad = back;
  bad.tensors.pop_back();  // no mask_grad: 3 outputs where the inputs give 4 gradients
  expect_error(bad, "3 outputs, the inputs give 4 gradients");
  bad = back;
  bad.tensors.push_back(TensorIr::uninit(d.fresh(), {2}, dtypes::f32));  // a bias_grad without bias
  expect_error(bad, "5 outputs, the inputs give 4 gradients");
  bad = back;
  bad.tensors[4] = d.f64({1, 2, 3, 2}, dtypes::f32, std::vector<double>(12, 1));
  expect_error(bad, "out_grad");
  bad = back;
  bad.outputs()[1].shape = {1, 2, 3, 4};
  expect_error(bad, "does not have the shape");
}

}  // namespace
}  // namespace kiln::reference::testing
