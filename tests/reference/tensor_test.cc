// HostTensor, the element codec and the f16 / bf16 conversions.
#include "kiln/reference/tensor.h"
#include "kiln/testing/status.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace kiln::reference {
namespace {

using namespace kiln::ir;  // NOLINT

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

bool is_nan16(std::uint16_t b, bool bf) {
  return bf ? ((b & 0x7F80) == 0x7F80 && (b & 0x7F) != 0) : ((b & 0x7C00) == 0x7C00 && (b & 0x3FF) != 0);
}

// ---- f16

TEST(HalfTest, F16KnownValues) {
  EXPECT_EQ(f16_from_f64(0.0), 0x0000);
  EXPECT_EQ(f16_from_f64(-0.0), 0x8000);
  EXPECT_EQ(f16_from_f64(1.0), 0x3C00);
  EXPECT_EQ(f16_from_f64(-2.0), 0xC000);
  EXPECT_EQ(f16_from_f64(65504.0), 0x7BFF);   // largest finite
  EXPECT_EQ(f16_from_f64(65519.99), 0x7BFF);  // below the midpoint to 2^16
  EXPECT_EQ(f16_from_f64(65520.0), 0x7C00);   // the midpoint rounds to even = infinity
  EXPECT_EQ(f16_from_f64(1e10), 0x7C00);
  EXPECT_EQ(f16_from_f64(-1e300), 0xFC00);
  EXPECT_EQ(f16_from_f64(kInf), 0x7C00);
  EXPECT_EQ(f16_from_f64(-kInf), 0xFC00);
  EXPECT_EQ(f16_from_f64(std::ldexp(1.0, -14)), 0x0400);  // smallest normal
  EXPECT_EQ(f16_from_f64(std::ldexp(1.0, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(f16_from_f64(std::ldexp(1.0, -25)), 0x0000);  // half of it: tie to even (0)
  EXPECT_EQ(f16_from_f64(std::ldexp(1.5, -25)), 0x0001);  // above half: rounds up
  EXPECT_EQ(f16_from_f64(std::ldexp(3.0, -25)), 0x0002);  // 1.5 ulp: tie to even (2)
  EXPECT_EQ(f16_from_f64(1e-300), 0x0000);
  EXPECT_EQ(f16_from_f64(-1e-300), 0x8000);
  EXPECT_EQ(f16_from_f64(std::ldexp(1023.0, -24) + std::ldexp(1.0, -25)), 0x0400);  // subnormal carries to normal
  EXPECT_EQ(f16_from_f64(1.0 + std::ldexp(1.0, -11)), 0x3C00);                      // tie between 1 and 1+2^-10: even
  EXPECT_EQ(f16_from_f64(1.0 + 3 * std::ldexp(1.0, -11)), 0x3C02);
  EXPECT_EQ(f16_from_f64(0.1), 0x2E66);
  EXPECT_TRUE(is_nan16(f16_from_f64(kNaN), false));
  EXPECT_EQ(f16_from_f64(-kNaN) & 0x8000, 0x8000);  // sign kept
  EXPECT_EQ(f16_to_f64(0x7BFF), 65504.0);
  EXPECT_EQ(f16_to_f64(0x0001), std::ldexp(1.0, -24));
  EXPECT_EQ(f16_to_f64(0x8000), 0.0);
  EXPECT_TRUE(std::signbit(f16_to_f64(0x8000)));
  EXPECT_EQ(f16_to_f64(0xFC00), -kInf);
  EXPECT_TRUE(std::isnan(f16_to_f64(0x7E00)));
  EXPECT_EQ(f16_to_f32(0x3555), 0.333251953125f);
}

TEST(HalfTest, F16EveryPatternRoundTripsAndMidpointsTieToEven) {
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const double v = f16_to_f64(bits);
    if (std::isnan(v)) {
      EXPECT_TRUE(is_nan16(f16_from_f64(v), false));
      continue;
    }
    ASSERT_EQ(f16_from_f64(v), bits) << std::hex << b;
    ASSERT_EQ(f16_from_f32(static_cast<float>(v)), bits) << std::hex << b;
    // The midpoint with the next pattern up (same sign, finite): ties to the even pattern, and
    // anything above / below it goes to the nearer neighbour.
    if ((b & 0x7FFF) < 0x7BFF) {
      const auto next = static_cast<std::uint16_t>(b + 1);
      const double w = f16_to_f64(next);
      const double mid = (v + w) / 2;  // exact in f64
      const std::uint16_t even = (bits & 1) == 0 ? bits : next;
      ASSERT_EQ(f16_from_f64(mid), even) << std::hex << b;
      ASSERT_EQ(f16_from_f64(std::nextafter(mid, v)), bits) << std::hex << b;
      ASSERT_EQ(f16_from_f64(std::nextafter(mid, w)), next) << std::hex << b;
    }
  }
}

#if defined(__FLT16_MAX__)
// GCC's own double -> _Float16 conversion (libgcc, correctly rounded) as a second oracle.
TEST(HalfTest, F16MatchesTheCompilersConversion) {
  std::mt19937_64 rng(42);
  for (int i = 0; i < 200000; ++i) {
    double v;
    switch (i % 3) {
      case 0: v = std::bit_cast<double>(rng()); break;  // any pattern
      case 1:
        v = std::ldexp(std::uniform_real_distribution<double>(-1, 1)(rng), static_cast<int>(rng() % 50) - 30);
        break;
      default: v = std::ldexp(static_cast<double>(rng() % 4096), static_cast<int>(rng() % 60) - 40); break;
    }
    const _Float16 h = static_cast<_Float16>(v);
    std::uint16_t expected;
    std::memcpy(&expected, &h, 2);
    if (std::isnan(v)) {
      EXPECT_TRUE(is_nan16(f16_from_f64(v), false));
    } else {
      ASSERT_EQ(f16_from_f64(v), expected) << v;
    }
  }
}
#endif

// ---- bf16

TEST(HalfTest, Bf16KnownValues) {
  EXPECT_EQ(bf16_from_f64(1.0), 0x3F80);
  EXPECT_EQ(bf16_from_f64(-2.0), 0xC000);
  EXPECT_EQ(bf16_from_f64(0.1), 0x3DCD);
  EXPECT_EQ(bf16_from_f64(3.0e38), 0x7F62);
  EXPECT_EQ(bf16_from_f64(3.4e38), 0x7F80);  // rounds past the largest finite (3.3895e38)
  EXPECT_EQ(bf16_from_f64(1e39), 0x7F80);
  EXPECT_EQ(bf16_from_f64(-kInf), 0xFF80);
  EXPECT_EQ(bf16_from_f64(std::ldexp(1.0, -133)), 0x0001);      // smallest subnormal
  EXPECT_EQ(bf16_from_f64(std::ldexp(1.0, -134)), 0x0000);      // tie to even
  EXPECT_EQ(bf16_from_f64(1.0 + std::ldexp(1.0, -8)), 0x3F80);  // tie: even
  EXPECT_EQ(bf16_from_f64(1.0 + 3 * std::ldexp(1.0, -8)), 0x3F82);
  EXPECT_TRUE(is_nan16(bf16_from_f64(kNaN), true));
  EXPECT_EQ(bf16_to_f32(0x3F80), 1.0f);
  EXPECT_EQ(bf16_to_f64(0x0001), std::ldexp(1.0, -133));
}

TEST(HalfTest, Bf16EveryPatternRoundTripsAndMidpointsTieToEven) {
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const double v = bf16_to_f64(bits);
    if (std::isnan(v)) {
      EXPECT_TRUE(is_nan16(bf16_from_f64(v), true));
      continue;
    }
    ASSERT_EQ(bf16_from_f64(v), bits) << std::hex << b;
    if ((b & 0x7FFF) < 0x7F7F) {
      const auto next = static_cast<std::uint16_t>(b + 1);
      const double w = bf16_to_f64(next);
      const double mid = (v + w) / 2;
      const std::uint16_t even = (bits & 1) == 0 ? bits : next;
      ASSERT_EQ(bf16_from_f64(mid), even) << std::hex << b;
      ASSERT_EQ(bf16_from_f64(std::nextafter(mid, v)), bits) << std::hex << b;
      ASSERT_EQ(bf16_from_f64(std::nextafter(mid, w)), next) << std::hex << b;
    }
  }
}

TEST(HalfTest, NarrowingFromF64RoundsOnceNotTwice) {
  // 1 + 2^-8 + 2^-30: rounding to f32 first gives 1 + 2^-8 exactly (a tie for bf16, which would
  // then go to 1); the correct single rounding goes up.
  const double v = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -30);
  EXPECT_EQ(bf16_from_f64(v), 0x3F81);
  // Same for f16: 1 + 2^-11 + 2^-40.
  EXPECT_EQ(f16_from_f64(1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40)), 0x3C01);
}

// ---- Element codec

TEST(ElementCodecTest, FloatToIntegerTruncatesSaturatesAndMapsNanToZero) {
  std::byte buf[8];
  auto i8 = [&](double v) {
    element::store_f64(buf, dtypes::i8, 0, v);
    return element::load_i64(buf, dtypes::i8, 0);
  };
  EXPECT_EQ(i8(2.9), 2);
  EXPECT_EQ(i8(-2.9), -2);
  EXPECT_EQ(i8(127.5), 127);
  EXPECT_EQ(i8(300), 127);
  EXPECT_EQ(i8(-129), -128);
  EXPECT_EQ(i8(-kInf), -128);
  EXPECT_EQ(i8(kNaN), 0);
  auto u64 = [&](double v) {
    element::store_f64(buf, dtypes::u64, 0, v);
    return element::load_u64(buf, dtypes::u64, 0);
  };
  EXPECT_EQ(u64(-5), 0u);
  EXPECT_EQ(u64(1e30), ~std::uint64_t{0});
  EXPECT_EQ(u64(18446744073709549568.0), 18446744073709549568ull);  // largest f64 below 2^64
  auto i64 = [&](double v) {
    element::store_f64(buf, dtypes::i64, 0, v);
    return element::load_i64(buf, dtypes::i64, 0);
  };
  EXPECT_EQ(i64(9.3e18), std::numeric_limits<std::int64_t>::max());
  EXPECT_EQ(i64(-9223372036854775808.0), std::numeric_limits<std::int64_t>::min());
}

TEST(ElementCodecTest, IntegersWrapToTheTargetWidth) {
  std::byte buf[8];
  element::store_i64(buf, dtypes::i8, 0, 200);
  EXPECT_EQ(element::load_i64(buf, dtypes::i8, 0), -56);
  element::store_i64(buf, dtypes::u8, 0, -1);
  EXPECT_EQ(element::load_u64(buf, dtypes::u8, 0), 255u);
  element::store_u64(buf, dtypes::i32, 0, 0x1'0000'0005ull);
  EXPECT_EQ(element::load_i64(buf, dtypes::i32, 0), 5);
  element::store_u64(buf, dtypes::u64, 0, ~std::uint64_t{0});
  EXPECT_EQ(element::load_i64(buf, dtypes::u64, 0), -1);  // reinterpreted, wraps
  EXPECT_EQ(element::load_f64(buf, dtypes::u64, 0), 18446744073709551616.0);
}

TEST(ElementCodecTest, LargeIntegersRoundOnceToNarrowFloats) {
  std::byte buf[8];
  // 2^60 + 2^52 + 1: halfway between two bf16 values would need rounding to odd to be seen.
  const std::int64_t v = (std::int64_t{1} << 60) + (std::int64_t{1} << 52) + 1;
  element::store_i64(buf, dtypes::bf16, 0, v);
  EXPECT_EQ(element::load_f64(buf, dtypes::bf16, 0), std::ldexp(1.0, 60) + std::ldexp(1.0, 53));
  element::store_i64(buf, dtypes::f32, 0, 16777217);  // 2^24 + 1: tie, even
  EXPECT_EQ(element::load_f64(buf, dtypes::f32, 0), 16777216.0);
  element::store_u64(buf, dtypes::f16, 0, 70000);
  EXPECT_EQ(element::load_f64(buf, dtypes::f16, 0), kInf);
  element::store_i64(buf, dtypes::f16, 0, -2049);  // tie between -2048 and -2050: even mantissa
  EXPECT_EQ(element::load_f64(buf, dtypes::f16, 0), -2048.0);
}

TEST(ElementCodecTest, BoolStoresAndTruthiness) {
  std::byte buf[8]{};
  element::store_bool(buf, DType::boolean(BoolStore::U32), 1, true);
  std::uint32_t raw;
  std::memcpy(&raw, buf + 4, 4);
  EXPECT_EQ(raw, 1u);
  EXPECT_TRUE(element::load_bool(buf, DType::boolean(BoolStore::U32), 1));
  EXPECT_FALSE(element::load_bool(buf, DType::boolean(BoolStore::U32), 0));
  element::store_f64(buf, dtypes::boolean, 0, kNaN);  // NaN is truthy
  EXPECT_TRUE(element::load_bool(buf, dtypes::boolean, 0));
  element::store_f64(buf, dtypes::f32, 0, -0.0);
  EXPECT_FALSE(element::load_bool(buf, dtypes::f32, 0));
  element::store_bool(buf, dtypes::bf16, 0, true);
  EXPECT_EQ(element::load_f64(buf, dtypes::bf16, 0), 1.0);
}

// ---- HostTensor

TEST(HostTensorTest, FromAndToHostData) {
  HostAllocator alloc;
  auto t = HostTensor::from_f64(alloc, {2, 2}, dtypes::bf16, std::vector<double>{1, 2.5, -0.1, 3});
  KILN_ASSERT_OK(t);
  EXPECT_EQ(t->to_string(), "bf16[2,2]");
  EXPECT_EQ(t->size_bytes(), 8u);
  EXPECT_EQ(t->to_f64(), (std::vector<double>{1, 2.5, -0.10009765625, 3}));
  EXPECT_EQ(t->to_values<std::uint16_t>()[0], 0x3F80);
  EXPECT_TRUE(t->to_values<float>().empty());  // bf16 is not stored as float

  const std::vector<std::int32_t> v{1, -2, 3};
  auto u = HostTensor::from_values<std::int32_t>(alloc, {3}, v);
  KILN_ASSERT_OK(u);
  EXPECT_EQ(u->dtype(), dtypes::i32);
  EXPECT_EQ(u->to_values<std::int32_t>(), v);
  EXPECT_EQ(u->to_i64(), (std::vector<std::int64_t>{1, -2, 3}));
  EXPECT_EQ(u->to_u64()[1], static_cast<std::uint64_t>(-2));

  auto f = HostTensor::from_values<float>(alloc, {2}, dtypes::flex32, std::vector<float>{0.5f, 2.f});
  KILN_ASSERT_OK(f);
  EXPECT_EQ(f->to_f64(), (std::vector<double>{0.5, 2}));
  EXPECT_FALSE(HostTensor::from_values<float>(alloc, {2}, dtypes::f64, std::vector<float>{0.5f, 2.f}).ok());

  auto bl = HostTensor::from_bool(alloc, {3}, DType::boolean(BoolStore::U32), {true, false, true});
  KILN_ASSERT_OK(bl);
  EXPECT_EQ(bl->size_bytes(), 12u);
  EXPECT_EQ(bl->to_bool(), (std::vector<bool>{true, false, true}));
  EXPECT_EQ(bl->to_values<std::uint32_t>(), (std::vector<std::uint32_t>{1, 0, 1}));
  EXPECT_EQ(bl->to_values<bool>(), (std::vector<bool>{true, false, true}));

  auto scalar = HostTensor::from_f64(alloc, {}, dtypes::f64, std::vector<double>{7});
  KILN_ASSERT_OK(scalar);
  EXPECT_EQ(scalar->num_elements(), 1u);
  auto empty = HostTensor::zeros(alloc, {0, 3}, dtypes::i16);
  KILN_ASSERT_OK(empty);
  EXPECT_EQ(empty->num_elements(), 0u);
  EXPECT_TRUE(empty->to_i64().empty());
}

TEST(HostTensorTest, BadInputsAreErrors) {
  HostAllocator alloc;
  EXPECT_FALSE(HostTensor::from_f64(alloc, {3}, dtypes::f32, std::vector<double>{1, 2}).ok());
  std::vector<std::byte> bytes(7);
  EXPECT_FALSE(HostTensor::from_bytes(alloc, {2}, dtypes::f32, bytes).ok());
  // QFloat has no element codec (only Quantize writes one) and needs a scheme that fits the shape.
  EXPECT_EQ(HostTensor::from_f64(alloc, {2}, DType::qfloat({}), std::vector<double>{1, 2}).error().code,
            ErrorCode::Unsupported);
  QuantScheme packed;
  packed.value = QuantValue::Q4S;
  packed.store = QuantStoreKind::PackedU32;
  EXPECT_EQ(HostTensor::allocate(alloc, {2, 6}, DType::qfloat(packed)).error().code, ErrorCode::Invalid);
  EXPECT_FALSE(HostTensor::allocate(alloc, {1ull << 40, 1ull << 40}, dtypes::f32).ok());  // overflows
  auto buf = alloc.allocate_shared(8);
  KILN_ASSERT_OK(buf);
  EXPECT_FALSE(HostTensor::wrap(*buf, {4}, dtypes::f32).ok());  // 16 bytes needed
  EXPECT_FALSE(HostTensor::wrap(nullptr, {1}, dtypes::f32).ok());
  auto w = HostTensor::wrap(*buf, {2}, dtypes::f32);
  KILN_ASSERT_OK(w);
  auto alias = HostTensor::wrap(*buf, {8}, dtypes::u8);
  KILN_ASSERT_OK(alias);
  EXPECT_TRUE(w->shares_buffer_with(*alias));
}

// A QFloat tensor's bytes (QuantLayout): the values as the store packs them, the block scales in the
// scheme's precision, the global f32.
TEST(HostTensorTest, QuantizedTensorsHoldTheirLayout) {
  // Per tensor, native Q8S: 2 value bytes, one f32 scale, the global.
  auto l = quant_layout({2}, QuantScheme{});
  KILN_ASSERT_OK(l);
  EXPECT_EQ(l->scales_offset, 2u);
  EXPECT_EQ(l->global_offset, 6u);
  EXPECT_EQ(l->total_bytes, 10u);
  EXPECT_EQ(l->geometry.scales, (Shape{1}));
  // [4, 8] Q4S in u32 words along the last axis (8 per word), f16 scales over [1, 4] blocks.
  QuantScheme q;
  q.value = QuantValue::Q4S;
  q.store = QuantStoreKind::PackedU32;
  q.block_rank = 2;
  q.block = {1, 4, 0, 0};
  q.param = QuantParam::F16;
  l = quant_layout({4, 8}, q);
  KILN_ASSERT_OK(l);
  EXPECT_EQ(l->geometry.values_per_word, 8u);
  EXPECT_EQ(l->geometry.packed_axis, 1u);
  EXPECT_EQ(l->geometry.scales, (Shape{4, 2}));
  EXPECT_EQ(l->scale_dtype, dtypes::f16);
  EXPECT_EQ(l->word_bytes, 4u);
  EXPECT_EQ(l->scales_offset, 16u);  // 4 words of 4 bytes
  EXPECT_EQ(l->global_offset, 32u);  // 8 f16 scales
  EXPECT_EQ(l->total_bytes, 36u);
  // Q2S bytes packed along axis 0 (packed_dim 1): 4 values per byte.
  QuantScheme q2;
  q2.value = QuantValue::Q2S;
  q2.store = QuantStoreKind::PackedNative;
  q2.packed_dim = 1;
  l = quant_layout({4, 8}, q2);
  KILN_ASSERT_OK(l);
  EXPECT_EQ(l->geometry.packed_axis, 0u);
  EXPECT_EQ(l->scales_offset, 8u);
  HostAllocator alloc;
  auto t = HostTensor::allocate(alloc, {4, 8}, DType::qfloat(q));
  KILN_ASSERT_OK(t);
  EXPECT_EQ(t->size_bytes(), 36u);
  EXPECT_EQ(t->num_elements(), 32u);
  std::vector<std::byte> raw(36);
  auto copy = HostTensor::from_bytes(alloc, {4, 8}, DType::qfloat(q), raw);
  KILN_ASSERT_OK(copy);
  EXPECT_EQ(copy->bytes().size(), 36u);
  // A block that does not divide its dim, a packed axis the words do not divide, a packed dim beyond
  // the rank: errors naming the scheme and the shape.
  q.block = {1, 3, 0, 0};
  EXPECT_EQ(quant_layout({4, 8}, q).error().code, ErrorCode::Invalid);
  q.block_rank = 0;
  EXPECT_NE(quant_layout({4, 6}, q).error().message.find("not divisible by the 8 values of a word"), std::string::npos);
  q2.packed_dim = 2;
  EXPECT_NE(quant_layout({4, 8}, q2).error().message.find("packed dim 2 out of bounds"), std::string::npos);
}

TEST(HostTensorTest, ExhaustionIsAnErrorValue) {
  HostAllocator alloc({.byte_limit = 1024});
  auto t = HostTensor::zeros(alloc, {1000}, dtypes::f32);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.error().code, ErrorCode::ResourceExhausted);
}

}  // namespace
}  // namespace kiln::reference
