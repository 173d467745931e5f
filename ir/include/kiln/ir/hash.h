// StructuralHasher: the one mixing recipe kiln uses for structural hashes (operations, fused
// programs): base's WordHasher, plus the IR's dtypes and shapes. Not a cryptographic hash; only
// consistency with equality matters.
#pragma once

#include <cstdint>

#include "kiln/base/hash.h"
#include "kiln/ir/dtype.h"
#include "kiln/ir/shape.h"

namespace kiln::ir {

class StructuralHasher : public WordHasher {
 public:
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
};

}  // namespace kiln::ir
