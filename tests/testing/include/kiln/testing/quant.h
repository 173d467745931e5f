// Quantization schemes the tests share.
#pragma once

#include "kiln/ir/dtype.h"

namespace kiln::testing {

// Q4S values packed eight to a u32 word, [1, 4] blocks with f16 scales: a [2, 8] tensor is 2
// words of 4 bytes, 4 scales of 2 bytes and the f32 global scale (20 bytes).
inline ir::QuantScheme packed_q4_blocks() {
  ir::QuantScheme q;
  q.value = ir::QuantValue::Q4S;
  q.store = ir::QuantStoreKind::PackedU32;
  q.block_rank = 2;
  q.block = {1, 4, 0, 0};
  q.param = ir::QuantParam::F16;
  return q;
}

}  // namespace kiln::testing
