// kiln's one hash family. Not cryptographic; only consistency with equality matters.
//
//   fnv1a64 / fnv1a32: FNV-1a over bytes, for file checksums, cache keys and the op table
//   fingerprint. Any single changed byte always changes the result (each step is a bijection of
//   the state for a fixed input byte). `seed` chains several pieces or starts a second lane.
//   WordHasher: FNV-style accumulation of 64-bit words with a splitmix64 finaliser, for
//   structural hashes (operations, fused programs); ir's StructuralHasher adds dtypes and shapes.
//   splitmix64_mix: the finaliser alone, to spread sequential ids over buckets or shards.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

namespace kiln {

inline constexpr std::uint64_t kFnv64Offset = 0xcbf29ce484222325ull;
inline constexpr std::uint64_t kFnv64Prime = 0x100000001b3ull;
inline constexpr std::uint32_t kFnv32Offset = 2166136261u;
inline constexpr std::uint32_t kFnv32Prime = 16777619u;

namespace detail {
// One FNV-1a loop for both widths and every byte range (bytes, chars); the element is read as
// an unsigned byte so a char and the same uint8_t value hash alike.
template <class Word, Word kPrime, class Bytes>
constexpr Word fnv1a(const Bytes& bytes, Word seed) {
  Word h = seed;
  for (auto b : bytes) {
    h ^= static_cast<unsigned char>(b);
    h *= kPrime;
  }
  return h;
}
}  // namespace detail

constexpr std::uint64_t fnv1a64(std::span<const std::uint8_t> bytes, std::uint64_t seed = kFnv64Offset) {
  return detail::fnv1a<std::uint64_t, kFnv64Prime>(bytes, seed);
}

constexpr std::uint64_t fnv1a64(std::string_view text, std::uint64_t seed = kFnv64Offset) {
  return detail::fnv1a<std::uint64_t, kFnv64Prime>(text, seed);
}

constexpr std::uint32_t fnv1a32(std::string_view text, std::uint32_t seed = kFnv32Offset) {
  return detail::fnv1a<std::uint32_t, kFnv32Prime>(text, seed);
}

constexpr std::uint64_t splitmix64_mix(std::uint64_t x) {
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

class WordHasher {
 public:
  void add(std::uint64_t v) {
    h_ ^= v + 0x9E3779B97F4A7C15ull + (h_ << 6) + (h_ >> 2);
    h_ *= kFnv64Prime;
  }
  void add_bool(bool b) { add(b ? 1 : 0); }
  template <class E>
  void add_enum(E e) {
    add(static_cast<std::uint64_t>(e));
  }
  std::uint64_t finish() const { return splitmix64_mix(h_); }

 private:
  std::uint64_t h_ = kFnv64Offset;
};

}  // namespace kiln
