// Reference executor: Quantize and Dequantize (docs/spec/ir.md §5.6) and the QFloat HostTensor they
// read and write. By hand: rounding half away from zero, clamping to each value type's range, NaN
// and infinities; per-tensor and block scales, the global scale, f16 / bf16 scale precision; the
// bytes of the native and both packed stores along either axis; round trips within half a scale;
// scales that are not finite and positive; forced bad ops; every other kind refusing QFloat.
#include <cmath>
#include <cstring>
#include <optional>
#include <random>
#include <vector>

#include "kiln/testing/status.h"
#include "reference_test_util.h"

namespace kiln::reference::testing {
namespace {

QuantScheme scheme(QuantValue value, QuantStoreKind store = QuantStoreKind::Native, std::uint8_t packed_dim = 0,
                   std::vector<std::uint16_t> block = {}, QuantParam param = QuantParam::F32) {
  QuantScheme q;
  q.value = value;
  q.store = store;
  q.packed_dim = packed_dim;
  q.block_rank = static_cast<std::uint8_t>(block.size());
  for (std::size_t i = 0; i < block.size(); ++i) q.block[i] = block[i];
  q.param = param;
  return q;
}

// Quantizes f64 values under `q` with the given scales (and global) and returns the QFloat tensor.
TensorIr quantized(Device& d, const Shape& shape, const std::vector<double>& x, const QuantScheme& q,
                   const Shape& scales_shape, const std::vector<double>& scales,
                   std::optional<double> global = std::nullopt) {
  const TensorIr xt = d.f64(shape, dtypes::f64, x);
  const TensorIr st = d.f64(scales_shape, dtypes::f64, scales);
  std::optional<TensorIr> gt;
  if (global) gt = d.f64({1}, dtypes::f64, {*global});
  return TensorIr{d.ok(b::quantize(xt, st, gt, q, d.fresh())), shape, TensorStatus::ReadOnly, DType::qfloat(q)};
}

std::vector<double> dequantized(Device& d, const TensorIr& q, DType dtype = dtypes::f64) {
  return d.f64_of(d.ok(b::dequantize(q, dtype, d.fresh())));
}

// The first n bytes of a tensor's storage.
std::vector<std::uint8_t> bytes_of(Device& d, const TensorIr& t, std::size_t n) {
  const HostTensor h = d.tensor(t.id);
  std::vector<std::uint8_t> v(n);
  std::memcpy(v.data(), h.data(), n);
  return v;
}

// With scale 1, Dequantize returns the stored integers themselves.
std::vector<double> stored(Device& d, QuantValue value, const std::vector<double>& x) {
  const Shape s{x.size()};
  return dequantized(d, quantized(d, s, x, scheme(value), {1}, {1}));
}

// ---- Values

TEST(ReferenceQuantizeTest, RoundsHalfAwayFromZeroAndClampsToTheRange) {
  Device d;
  EXPECT_EQ(stored(d, QuantValue::Q8S, {0.5, -0.5, 2.5, -2.5, 1.4999, 0.49}),
            (std::vector<double>{1, -1, 3, -3, 1, 0}));
  EXPECT_EQ(stored(d, QuantValue::Q8S, {300, -300, kInf, -kInf, kNaN}), (std::vector<double>{127, -127, 127, -127, 0}));
  EXPECT_EQ(stored(d, QuantValue::Q8F, {300, -300}), (std::vector<double>{127, -128}));
  EXPECT_EQ(stored(d, QuantValue::Q4F, {9, -9, -7.6}), (std::vector<double>{7, -8, -8}));
  EXPECT_EQ(stored(d, QuantValue::Q4S, {9, -9}), (std::vector<double>{7, -7}));
  EXPECT_EQ(stored(d, QuantValue::Q2F, {5, -5, 0.6}), (std::vector<double>{1, -2, 1}));
  EXPECT_EQ(stored(d, QuantValue::Q2S, {5, -5}), (std::vector<double>{1, -1}));
}

// x / s rounded, then q · s, with s the scale as stored (f32 here): 0.02 is not exact in f32.
TEST(ReferenceQuantizeTest, PerTensorScaleByHand) {
  Device d;
  const TensorIr q = quantized(d, {4}, {0.1, -0.5, 1.0, 2.54}, scheme(QuantValue::Q8S), {1}, {0.02});
  const double s = static_cast<double>(0.02f);
  EXPECT_EQ(dequantized(d, q), (std::vector<double>{5 * s, -25 * s, 50 * s, 127 * s}));
  // The bytes: the four signed values, the f32 scale, the f32 global 1.
  const std::vector<std::uint8_t> raw = bytes_of(d, q, 12);
  EXPECT_EQ((std::vector<std::uint8_t>(raw.begin(), raw.begin() + 4)), (std::vector<std::uint8_t>{5, 231, 50, 127}));
  float scale = 0, global = 0;
  std::memcpy(&scale, raw.data() + 4, 4);
  std::memcpy(&global, raw.data() + 8, 4);
  EXPECT_EQ(scale, 0.02f);
  EXPECT_EQ(global, 1.0f);
  EXPECT_EQ(d.tensor(q.id).size_bytes(), 12u);
  // f32 output: each value rounded once.
  const std::vector<double> f32 = dequantized(d, q, dtypes::f32);
  EXPECT_EQ(f32[1], static_cast<double>(static_cast<float>(-25 * s)));
}

// Blocks [1, 2] of a [2, 4] tensor: four scales, each applied to its block; a global scale
// multiplies them all.
TEST(ReferenceQuantizeTest, BlockAndGlobalScales) {
  Device d;
  const QuantScheme q = scheme(QuantValue::Q8S, QuantStoreKind::Native, 0, {1, 2});
  const std::vector<double> x{1, 2, 30, 40, 0.5, 0.25, -8, 8};
  const std::vector<double> scales{1, 10, 0.25, 4};  // blocks (0, 0), (0, 1), (1, 0), (1, 1)
  EXPECT_EQ(dequantized(d, quantized(d, {2, 4}, x, q, {2, 2}, scales)), x);
  // With global 0.5 the effective scales halve: the same values quantize to twice the integers.
  const TensorIr g = quantized(d, {2, 4}, x, q, {2, 2}, scales, 0.5);
  EXPECT_EQ(dequantized(d, g), x);
  const std::vector<std::uint8_t> raw = bytes_of(d, g, 8);
  EXPECT_EQ(raw, (std::vector<std::uint8_t>{2, 4, 6, 8, 4, 2, 252, 4}));
  // Blocks along the first dim only ([2, 1] of a [4, 3] tensor): rows 0-1 and 2-3.
  const QuantScheme rows = scheme(QuantValue::Q8F, QuantStoreKind::Native, 0, {2, 1});
  const std::vector<double> y{1, 2, 3, 4, 5, 6, 10, 20, 30, 40, 50, 60};
  EXPECT_EQ(dequantized(d, quantized(d, {4, 3}, y, rows, {2, 3}, {1, 1, 1, 10, 10, 10})), y);
}

// The scheme's precision: the scale is stored as f16 / bf16 and quantization uses it as stored.
TEST(ReferenceQuantizeTest, ScalePrecision) {
  Device d;
  const double f16_tenth = f16_to_f64(f16_from_f64(0.1)), bf16_tenth = bf16_to_f64(bf16_from_f64(0.1));
  const TensorIr h = quantized(d, {2}, {0.1, 1.0},
                               scheme(QuantValue::Q8S, QuantStoreKind::Native, 0, {}, QuantParam::F16), {1}, {0.1});
  EXPECT_EQ(dequantized(d, h), (std::vector<double>{f16_tenth, std::round(1.0 / f16_tenth) * f16_tenth}));
  EXPECT_EQ(d.tensor(h.id).size_bytes(), 2u + 2 + 4);
  const TensorIr bf =
      quantized(d, {1}, {0.1}, scheme(QuantValue::Q8S, QuantStoreKind::Native, 0, {}, QuantParam::BF16), {1}, {0.1});
  EXPECT_EQ(dequantized(d, bf), (std::vector<double>{bf16_tenth}));
}

// ---- The stores' bytes

// Q4S in u32 words along the last axis: eight 4-bit fields per little-endian word, value i at bits
// 4i; a Q4 native store keeps one sign-extended byte per value.
TEST(ReferenceQuantizeTest, PackedU32AlongTheLastAxis) {
  Device d;
  const std::vector<double> x{1, -1, 7, -7, 0, 3, -4, 2, 5, 5, 5, 5, 5, 5, 5, -5};
  const QuantScheme q = scheme(QuantValue::Q4S, QuantStoreKind::PackedU32, 0);
  const TensorIr t = quantized(d, {2, 8}, x, q, {1}, {1});
  EXPECT_EQ(dequantized(d, t), x);
  const std::vector<std::uint8_t> raw = bytes_of(d, t, 8);
  // Word 0: fields 1, F, 7, 9, 0, 3, C, 2 from bit 0 up = 0x2C3097F1.
  EXPECT_EQ(raw, (std::vector<std::uint8_t>{0xF1, 0x97, 0x30, 0x2C, 0x55, 0x55, 0x55, 0xB5}));
  EXPECT_EQ(d.tensor(t.id).size_bytes(), 8u + 4 + 4);
  const TensorIr native = quantized(d, {2}, {-3, 7}, scheme(QuantValue::Q4S), {1}, {1});
  EXPECT_EQ(bytes_of(d, native, 2), (std::vector<std::uint8_t>{0xFD, 0x07}));
}

// Q2F in bytes along axis 0 (packed_dim 1): four 2-bit fields per byte, rows 0..3 of a column.
TEST(ReferenceQuantizeTest, PackedNativeAlongTheFirstAxis) {
  Device d;
  const std::vector<double> x{1, -2, 0, 1, -1, -1, -2, 0};  // [4, 2]: columns (1, 0, -1, -2), (-2, 1, -1, 0)
  const TensorIr t = quantized(d, {4, 2}, x, scheme(QuantValue::Q2F, QuantStoreKind::PackedNative, 1), {1}, {1});
  EXPECT_EQ(dequantized(d, t), x);
  // Column 0: fields 01, 00, 11, 10 = 0b10110001; column 1: 10, 01, 11, 00 = 0b00110110.
  EXPECT_EQ(bytes_of(d, t, 2), (std::vector<std::uint8_t>{0xB1, 0x36}));
  // 8-bit values in PackedU32 words: four bytes per word, the word the values' bytes in order.
  const TensorIr w = quantized(d, {4}, {1, -1, 2, -2}, scheme(QuantValue::Q8S, QuantStoreKind::PackedU32), {1}, {1});
  EXPECT_EQ(bytes_of(d, w, 4), (std::vector<std::uint8_t>{0x01, 0xFF, 0x02, 0xFE}));
}

// Random values under a per-tensor scale max|x| / 127: every value back within half a scale.
TEST(ReferenceQuantizeTest, RoundTripWithinHalfAScale) {
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> u(-4, 4);
  std::vector<double> x(64);
  double max = 0;
  for (double& v : x) max = std::max(max, std::fabs(v = u(rng)));
  Device d;
  const double s = static_cast<double>(static_cast<float>(max / 127));
  const std::vector<double> back = dequantized(d, quantized(d, {8, 8}, x, scheme(QuantValue::Q8S), {1}, {max / 127}));
  for (std::size_t i = 0; i < x.size(); ++i) EXPECT_LE(std::fabs(back[i] - x[i]), s / 2 + 1e-12) << i;
}

// ---- Errors

TEST(ReferenceQuantizeTest, ScalesMustBeFiniteAndPositive) {
  for (double bad : {0.0, -1.0, kNaN, kInf}) {
    Device d;
    const Status st = d.run(b::quantize(d.f64({2}, dtypes::f32, {1, 2}), d.f64({1}, dtypes::f32, {bad}), std::nullopt,
                                        QuantScheme{}, d.fresh()));
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.error().message.find("must be finite and positive"), std::string::npos) << st.error().message;
  }
  Device d;  // a global scale of 0 makes every effective scale 0
  const Status st = d.run(b::quantize(d.f64({2}, dtypes::f32, {1, 2}), d.f64({1}, dtypes::f32, {1}),
                                      d.f64({1}, dtypes::f32, {0}), QuantScheme{}, d.fresh()));
  EXPECT_FALSE(st.ok());
}

TEST(ReferenceQuantizeTest, HandMadeOpsAreCheckedAgain) {
  Device d;
  const TensorIr x = d.f64({2, 4}, dtypes::f32, {1, 2, 3, 4, 5, 6, 7, 8});
  const Operation quant = *b::quantize(x, d.f64({1}, dtypes::f32, {1}), std::nullopt, QuantScheme{}, d.fresh());
  auto expect_error = [&](Operation op, const char* what) {
    op.outputs()[0].id = d.fresh();
    const Status st = d.exec.execute(op, d.handles);
    ASSERT_FALSE(st.ok()) << op.to_string();
    EXPECT_NE(st.error().message.find(what), std::string::npos) << st.error().message;
  };
  Operation bad = quant;
  bad.outputs()[0].dtype = dtypes::f32;
  expect_error(bad, "must have a QFloat dtype");
  bad = quant;
  bad.outputs()[0].dtype = DType::qfloat(scheme(QuantValue::Q8S, QuantStoreKind::Native, 0, {1, 2}));
  expect_error(bad, "scales");  // [1] where the blocks need [2, 2]
  bad = quant;
  bad.outputs()[0].dtype = DType::qfloat(scheme(QuantValue::Q8S, QuantStoreKind::Native, 0, {1, 3}));
  expect_error(bad, "not divisible by the block's 3");
  bad = quant;
  bad.outputs()[0].shape = {8};
  expect_error(bad, "does not have the shape");
  const TensorIr q = TensorIr{d.ok(quant), {2, 4}, TensorStatus::ReadOnly, DType::qfloat({})};
  const Operation de = *b::dequantize(q, dtypes::f32, d.fresh());
  bad = de;
  bad.outputs()[0].dtype = dtypes::i32;
  expect_error(bad, "must have a float dtype");
  bad = de;
  bad.tensors[0] = x;  // a float input relabelled
  bad.dtype = x.dtype;
  expect_error(bad, "must be quantized");
  // Every other kind refuses the QFloat tensor (its kernel has no element codec for it).
  const Status exp = d.run(b::unary(Family::Float, OpKind::Float_Exp, q, d.fresh()));
  ASSERT_FALSE(exp.ok());
  EXPECT_EQ(exp.error().code, ErrorCode::Unsupported);
  Operation cast = *b::cast(Family::BaseFloat, OpKind::Base_Cast, x, dtypes::f16, d.fresh());
  cast.tensors[0] = q;
  cast.outputs()[0].id = d.fresh();
  EXPECT_EQ(d.exec.execute(cast, d.handles).error().code, ErrorCode::Unsupported);
}

}  // namespace
}  // namespace kiln::reference::testing
