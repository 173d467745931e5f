// The kernel parameter structs shared by the host and the generated CUDA code: the host fills
// them and passes each one by value to cudaLaunchKernel; the generated source declares the same
// structs (codegen.cc's prelude, kept in sync by the static_asserts below and by
// tests/cuda/codegen_test.cc, which checks that the prelude spells these exact layouts).
//
// Every member is a 64-bit or 32-bit integer laid out without padding surprises, so the host
// (GCC, x86-64 / aarch64) and the device (NVRTC) agree on size and offsets.
//
// Thread-safety: plain values.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kiln::cuda {

// Highest rank a generated kernel iterates natively (as the CPU fast path: higher ranks run on
// the host reference fallback).
inline constexpr int kMaxRank = 8;

// A block's iteration space: `numel` positions of the row-major shape `dims[0..rank)`.
// `contiguous` = every accessor of the launch walks it row-major contiguously (no div / mod per
// element: the position is the offset).
struct KilnIter {
  std::int64_t numel = 0;
  std::int64_t dims[kMaxRank] = {};
  std::int32_t rank = 0;
  std::int32_t contiguous = 0;
};

// A tensor read or written over an iteration space: element offset = sum idx[d] * strides[d]
// (0 on broadcast dims). `contiguous`: the strides are the iteration space's row-major ones.
// `masked` (stores only): a broadcast output, written only where every stride-0 index is 0.
struct KilnAccess {
  std::int64_t strides[kMaxRank] = {};
  std::int32_t contiguous = 0;
  std::int32_t masked = 0;
};

// A reduction's input viewed as [outer, n, inner]; `outputs` = outer * inner.
struct KilnReduceShape {
  std::int64_t outer = 0;
  std::int64_t n = 0;
  std::int64_t inner = 0;
  std::int64_t outputs = 0;
};

// A batched matmul [batch..., m, k] x [batch..., k, n]; the operands' batch strides (elements,
// 0 on broadcast batch dims) over the output's batch dims.
struct KilnMatmulShape {
  std::int64_t m = 0, n = 0, k = 0;
  std::int64_t batch = 1;
  std::int64_t batch_dims[kMaxRank] = {};
  std::int64_t lhs_batch[kMaxRank] = {};
  std::int64_t rhs_batch[kMaxRank] = {};
  std::int32_t batch_rank = 0;
  std::int32_t pad = 0;
};

// An input read at computed positions (Gather / Select / Cat): its shape and row-major strides.
struct KilnIndexed {
  std::int64_t dims[kMaxRank] = {};
  std::int64_t strides[kMaxRank] = {};
  std::int32_t rank = 0;
  std::int32_t pad = 0;
};

static_assert(sizeof(KilnIter) == 80 && offsetof(KilnIter, rank) == 72);
static_assert(sizeof(KilnAccess) == 72 && offsetof(KilnAccess, contiguous) == 64);
static_assert(sizeof(KilnReduceShape) == 32);
static_assert(sizeof(KilnMatmulShape) == 232 && offsetof(KilnMatmulShape, batch_rank) == 224);
static_assert(sizeof(KilnIndexed) == 136);

}  // namespace kiln::cuda
