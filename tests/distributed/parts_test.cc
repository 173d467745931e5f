// AllGather's concatenation and ReduceScatter's part along a dim, against the definition
// element by element (each element's bytes name its rank and coordinates).
#include "kiln/distributed/parts.h"

#include <cstring>

#include <gtest/gtest.h>

namespace kiln::distributed {
namespace {

// Element `i` of rank `r`'s tensor: a u32 of the two, so where it lands says where it came from.
std::uint32_t tag(std::uint32_t r, std::size_t i) { return r << 24 | static_cast<std::uint32_t>(i); }

std::uint32_t at(const std::vector<std::byte>& b, std::size_t i) {
  std::uint32_t v;
  std::memcpy(&v, b.data() + i * 4, 4);
  return v;
}

TEST(Parts, ConcatAlongEachDimMatchesTheDefinition) {
  const ir::Shape shape{2, 3, 4};
  constexpr std::uint32_t kWorld = 3;
  const std::size_t n = 24;
  std::vector<std::byte> ranks(n * kWorld * 4);
  for (std::uint32_t r = 0; r < kWorld; ++r)
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint32_t v = tag(r, i);
      std::memcpy(ranks.data() + (r * n + i) * 4, &v, 4);
    }
  for (std::size_t dim = 0; dim < 3; ++dim) {
    const std::vector<std::byte> out = concat_along(ranks, shape, 4, dim, kWorld);
    ir::Shape os = shape;
    os[dim] *= kWorld;
    std::size_t k = 0;
    for (std::size_t a = 0; a < os[0]; ++a)
      for (std::size_t b = 0; b < os[1]; ++b)
        for (std::size_t c = 0; c < os[2]; ++c, ++k) {
          std::size_t idx[3] = {a, b, c};
          const std::uint32_t r = static_cast<std::uint32_t>(idx[dim] / shape[dim]);
          idx[dim] %= shape[dim];
          ASSERT_EQ(at(out, k), tag(r, (idx[0] * 3 + idx[1]) * 4 + idx[2])) << "dim " << dim << " at " << k;
        }
  }
}

TEST(Parts, PartAlongEachDimIsTheRanksSlice) {
  const ir::Shape shape{6, 3, 6};
  const std::size_t n = 108;
  std::vector<std::byte> whole(n * 4);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t v = tag(0, i);
    std::memcpy(whole.data() + i * 4, &v, 4);
  }
  for (std::size_t dim : {std::size_t{0}, std::size_t{2}})
    for (std::uint32_t rank = 0; rank < 3; ++rank) {
      const std::vector<std::byte> out = part_along(whole, shape, 4, dim, 3, rank);
      ir::Shape ps = shape;
      ps[dim] /= 3;
      ASSERT_EQ(out.size(), ps[0] * ps[1] * ps[2] * 4);
      std::size_t k = 0;
      for (std::size_t a = 0; a < ps[0]; ++a)
        for (std::size_t b = 0; b < ps[1]; ++b)
          for (std::size_t c = 0; c < ps[2]; ++c, ++k) {
            std::size_t idx[3] = {a, b, c};
            idx[dim] += rank * ps[dim];
            ASSERT_EQ(at(out, k), tag(0, (idx[0] * 3 + idx[1]) * 6 + idx[2])) << "dim " << dim << " rank " << rank;
          }
    }
}

}  // namespace
}  // namespace kiln::distributed
