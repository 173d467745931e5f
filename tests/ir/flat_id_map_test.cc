// FlatIdMap: random inserts, overwrites and erases against std::unordered_map (dense key spaces
// force long probe runs and the backward shift of deletions), iteration, at() and the op path's
// pattern of consecutive ids inserted and erased a little later.
#include <cstdint>
#include <map>
#include <random>
#include <stdexcept>
#include <unordered_map>

#include <gtest/gtest.h>

#include "kiln/base/flat_id_map.h"
#include "kiln/ir/tensor.h"

namespace kiln::ir {
namespace {

void expect_same(const FlatIdMap<TensorId, std::uint64_t>& m,
                 const std::unordered_map<std::uint64_t, std::uint64_t>& model, std::uint64_t key_space) {
  ASSERT_EQ(m.size(), model.size());
  ASSERT_EQ(m.empty(), model.empty());
  for (std::uint64_t k = 0; k < key_space; ++k) {
    const std::uint64_t* got = m.find(TensorId(k));
    const auto it = model.find(k);
    if (it == model.end()) {
      EXPECT_EQ(got, nullptr) << "key " << k << " should be absent";
      EXPECT_EQ(m.count(TensorId(k)), 0u);
    } else {
      ASSERT_NE(got, nullptr) << "key " << k << " lost";
      EXPECT_EQ(*got, it->second) << "key " << k;
      EXPECT_EQ(m.at(TensorId(k)), it->second);
    }
  }
  // Iteration visits every entry exactly once.
  std::map<std::uint64_t, std::uint64_t> seen;
  for (const auto& [id, value] : m)
    EXPECT_TRUE(seen.emplace(id.value(), value).second) << "visited twice: " << id.value();
  EXPECT_EQ(seen.size(), model.size());
  for (const auto& [k, v] : seen) EXPECT_EQ(model.at(k), v);
}

TEST(FlatIdMap, MatchesAnUnorderedMapUnderRandomInsertsAndErases) {
  for (std::uint64_t key_space : {7ull, 40ull, 1000ull, 30000ull}) {
    std::mt19937_64 rng(key_space);
    FlatIdMap<TensorId, std::uint64_t> m;
    std::unordered_map<std::uint64_t, std::uint64_t> model;
    for (int step = 0; step < 60000; ++step) {
      const std::uint64_t k = rng() % key_space;
      switch (rng() % 4) {
        case 0: EXPECT_EQ(m.erase(TensorId(k)), model.erase(k) == 1) << k; break;
        case 1: {
          const std::uint64_t v = rng() % 100;
          m.insert_or_assign(TensorId(k), v);
          model[k] = v;
          break;
        }
        default: {
          const std::uint64_t v = rng() % 100;
          m[TensorId(k)] = v;
          model[k] = v;
        }
      }
      if (step % 20000 == 0) expect_same(m, model, key_space);
    }
    expect_same(m, model, key_space);
  }
}

TEST(FlatIdMap, ValueInitialisesAndThrowsOnAbsentAt) {
  FlatIdMap<TensorId, TensorStatus> m;
  EXPECT_TRUE(m.empty());
  EXPECT_EQ(m.begin(), m.end());
  EXPECT_THROW((void)m.at(TensorId(3)), std::out_of_range);
  EXPECT_FALSE(m.erase(TensorId(3)));
  EXPECT_EQ(m[TensorId(3)], TensorStatus{});  // value-initialised on first use
  m[TensorId(3)] = TensorStatus::ReadWrite;
  EXPECT_EQ(m.at(TensorId(3)), TensorStatus::ReadWrite);
  m.clear();
  EXPECT_TRUE(m.empty());
  EXPECT_EQ(m.find(TensorId(3)), nullptr);
}

TEST(FlatIdMap, OpPathPatternStaysSmallAndExact) {
  // Consecutive output ids inserted, each erased 300 ids later (its last use).
  FlatIdMap<TensorId, std::uint64_t> m;
  std::unordered_map<std::uint64_t, std::uint64_t> model;
  for (std::uint64_t id = 0; id < 50000; ++id) {
    m[TensorId(id)] = id % 5;
    model[id] = id % 5;
    if (id >= 300) {
      EXPECT_TRUE(m.erase(TensorId(id - 300)));
      model.erase(id - 300);
    }
  }
  expect_same(m, model, 50000);
  for (std::uint64_t id = 0; id < 50000; ++id) m.erase(TensorId(id));
  EXPECT_TRUE(m.empty());
}

}  // namespace
}  // namespace kiln::ir
