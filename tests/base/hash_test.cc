// kiln's hash family: the published FNV-1a vectors, one result for the same bytes whatever their
// element type (uint8_t span or chars, high bit included), the seed as a chaining point, and
// evaluation at compile time (the op table fingerprint relies on it).
#include <array>
#include <cstdint>
#include <span>
#include <string_view>

#include <gtest/gtest.h>

#include "kiln/base/hash.h"

namespace kiln {
namespace {

// Vectors from the FNV reference (Fowler, Noll, Vo): the empty input is the offset basis.
static_assert(fnv1a64(std::string_view{}) == kFnv64Offset);
static_assert(fnv1a64(std::string_view{"a"}) == 0xaf63dc4c8601ec8cull);
static_assert(fnv1a64(std::string_view{"foobar"}) == 0x85944171f73967e8ull);
static_assert(fnv1a32(std::string_view{}) == kFnv32Offset);
static_assert(fnv1a32(std::string_view{"a"}) == 0xe40c292cu);
static_assert(fnv1a32(std::string_view{"foobar"}) == 0xbf9cf968u);

TEST(Hash, BytesAndCharsOfTheSameValuesHashAlike) {
  const std::array<std::uint8_t, 5> bytes{0x00, 0x7f, 0x80, 0xc3, 0xff};
  const std::array<char, 5> chars{'\x00', '\x7f', '\x80', '\xc3', '\xff'};
  const std::string_view text(chars.data(), chars.size());
  EXPECT_EQ(fnv1a64(std::span<const std::uint8_t>(bytes)), fnv1a64(text));
  EXPECT_NE(fnv1a64(text), kFnv64Offset);
}

TEST(Hash, SeedChainsPieces) {
  const std::uint64_t whole = fnv1a64(std::string_view{"foobar"});
  EXPECT_EQ(fnv1a64(std::string_view{"bar"}, fnv1a64(std::string_view{"foo"})), whole);
  EXPECT_EQ(fnv1a32(std::string_view{"bar"}, fnv1a32(std::string_view{"foo"})), fnv1a32(std::string_view{"foobar"}));
}

TEST(Hash, EverySingleByteChangeChangesTheResult) {
  std::array<std::uint8_t, 16> bytes{};
  const std::uint64_t base = fnv1a64(std::span<const std::uint8_t>(bytes));
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    for (int v = 1; v < 256; ++v) {
      auto changed = bytes;
      changed[i] = static_cast<std::uint8_t>(v);
      ASSERT_NE(fnv1a64(std::span<const std::uint8_t>(changed)), base) << "byte " << i << " = " << v;
    }
  }
}

TEST(Hash, WordHasherOrderMatters) {
  WordHasher a, b;
  a.add(1);
  a.add(2);
  b.add(2);
  b.add(1);
  EXPECT_NE(a.finish(), b.finish());
  WordHasher c;
  c.add(1);
  c.add(2);
  EXPECT_EQ(a.finish(), c.finish());
}

}  // namespace
}  // namespace kiln
