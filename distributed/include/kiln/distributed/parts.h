// Where each rank's data goes in AllGather's and ReduceScatter's outputs, along any dim. Gloo
// moves whole buffers in rank order; kiln's ops concatenate and cut along a dim of the tensor
// (docs/distributed.md), which for dim 0 is the same layout and otherwise interleaves.
//
// Usage:
//   std::vector<std::byte> out = concat_along(gathered, {4, 5}, 4, /*dim=*/1, /*world=*/2);  // [4, 10]
//   std::vector<std::byte> mine = part_along(reduced, {4, 10}, 4, 1, 2, /*rank=*/1);         // [4, 5]
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kiln/ir/shape.h"

namespace kiln::distributed {

// `ranks` holds `world` row-major tensors of `shape` (elements of `esize` bytes), rank 0 first;
// returns their concatenation along `dim` (shape[dim] × world there). dim < shape.size().
std::vector<std::byte> concat_along(std::span<const std::byte> ranks, const ir::Shape& shape, std::size_t esize,
                                    std::size_t dim, std::uint32_t world);

// Part `rank` of `whole` (row-major, of `shape`) cut along `dim` into `world` equal parts
// (shape[dim] divisible by world, dim < shape.size()).
std::vector<std::byte> part_along(std::span<const std::byte> whole, const ir::Shape& shape, std::size_t esize,
                                  std::size_t dim, std::uint32_t world, std::uint32_t rank);

}  // namespace kiln::distributed
