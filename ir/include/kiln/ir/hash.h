// StructuralHasher: the one mixing recipe kiln uses for structural hashes (operations, fused
// programs): FNV-style accumulation of 64-bit words with a splitmix64 finaliser. Not a
// cryptographic hash; only consistency with equality matters.
#pragma once

#include <cstdint>

#include "kiln/ir/dtype.h"
#include "kiln/ir/shape.h"

namespace kiln::ir {

class StructuralHasher {
 public:
  void add(std::uint64_t v) {
    h_ ^= v + 0x9E3779B97F4A7C15ull + (h_ << 6) + (h_ >> 2);
    h_ *= 0x100000001b3ull;
  }
  void add_bool(bool b) { add(b ? 1 : 0); }
  template <class E>
  void add_enum(E e) {
    add(static_cast<std::uint64_t>(e));
  }
  void add_dtype(const DType& d) {
    add_enum(d.kind());
    if (d.is_bool()) add_enum(d.bool_store());
    if (d.is_quantized()) {
      const QuantScheme& s = d.scheme();
      add(static_cast<std::uint64_t>(s.value) | static_cast<std::uint64_t>(s.store) << 8 |
          static_cast<std::uint64_t>(s.packed_dim) << 16 | static_cast<std::uint64_t>(s.block_rank) << 24 |
          static_cast<std::uint64_t>(s.param) << 32);
      for (int i = 0; i < s.block_rank; ++i) add(s.block[i]);
    }
  }
  void add_shape(const Shape& s) {
    add(s.size());
    for (auto d : s) add(d);
  }
  std::uint64_t finish() const {
    std::uint64_t x = h_;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
  }

 private:
  std::uint64_t h_ = 0xcbf29ce484222325ull;
};

}  // namespace kiln::ir
