#include "kiln/distributed/parts.h"

#include <cassert>
#include <cstring>

namespace kiln::distributed {
namespace {

// Elements before `dim` (the outer index) and bytes from `dim` on (one slab per outer index).
std::size_t outer_of(const ir::Shape& shape, std::size_t dim) {
  std::size_t outer = 1;
  for (std::size_t d = 0; d < dim; ++d) outer *= static_cast<std::size_t>(shape[d]);
  return outer;
}
std::size_t bytes_from(const ir::Shape& shape, std::size_t dim, std::size_t esize) {
  std::size_t bytes = esize;
  for (std::size_t d = dim; d < shape.size(); ++d) bytes *= static_cast<std::size_t>(shape[d]);
  return bytes;
}

}  // namespace

std::vector<std::byte> concat_along(std::span<const std::byte> ranks, const ir::Shape& shape, std::size_t esize,
                                    std::size_t dim, std::uint32_t world) {
  assert(dim < shape.size());
  const std::size_t outer = outer_of(shape, dim), slab = bytes_from(shape, dim, esize);
  assert(ranks.size() == outer * slab * world);
  std::vector<std::byte> out(ranks.size());
  for (std::uint32_t r = 0; r < world; ++r)
    for (std::size_t o = 0; o < outer; ++o)
      std::memcpy(out.data() + (o * world + r) * slab, ranks.data() + (r * outer + o) * slab, slab);
  return out;
}

std::vector<std::byte> part_along(std::span<const std::byte> whole, const ir::Shape& shape, std::size_t esize,
                                  std::size_t dim, std::uint32_t world, std::uint32_t rank) {
  assert(dim < shape.size() && shape[dim] % world == 0 && rank < world);
  const std::size_t outer = outer_of(shape, dim), part = bytes_from(shape, dim, esize) / world;
  assert(whole.size() == outer * part * world);
  std::vector<std::byte> out(outer * part);
  for (std::size_t o = 0; o < outer; ++o)
    std::memcpy(out.data() + o * part, whole.data() + (o * world + rank) * part, part);
  return out;
}

}  // namespace kiln::distributed
