// ProducerTable (the device's tensor -> producing stream table): random inserts, overwrites and
// erases against std::unordered_map, including dense runs that force long probe chains and the
// backward shift of deletions, and concurrent writers on overlapping shards.
#include <cstdint>
#include <random>
#include <thread>
#include <unordered_map>
#include <vector>

#include <gtest/gtest.h>

#include "kiln/runtime/producer_table.h"

namespace kiln::runtime {
namespace {

using fusion::StreamId;
using ir::TensorId;

void expect_same(const ProducerTable& table, const std::unordered_map<std::uint64_t, std::uint64_t>& model,
                 std::uint64_t key_space) {
  ASSERT_EQ(table.size(), model.size());
  for (std::uint64_t k = 0; k < key_space; ++k) {
    const std::optional<StreamId> got = table.find(TensorId(k));
    const auto it = model.find(k);
    if (it == model.end()) {
      EXPECT_FALSE(got.has_value()) << "key " << k << " should be absent";
    } else {
      ASSERT_TRUE(got.has_value()) << "key " << k << " lost";
      EXPECT_EQ(got->value(), it->second) << "key " << k;
    }
  }
}

TEST(ProducerTable, MatchesAMapUnderRandomInsertsAndErases) {
  for (std::uint64_t key_space : {40ull, 1000ull, 20000ull}) {
    std::mt19937_64 rng(key_space);
    ProducerTable table;
    std::unordered_map<std::uint64_t, std::uint64_t> model;
    for (int step = 0; step < 60000; ++step) {
      const std::uint64_t k = rng() % key_space;
      if (rng() % 3 == 0) {
        table.erase(TensorId(k));
        model.erase(k);
      } else {
        const std::uint64_t s = rng() % 7;
        table.insert(TensorId(k), StreamId(s));
        model[k] = s;
      }
      if (step % 15000 == 0) expect_same(table, model, key_space);
    }
    expect_same(table, model, key_space);
  }
}

TEST(ProducerTable, GrowsAndEmptiesLikeTheOpPath) {
  // The op path: consecutive output ids inserted, each erased a little later (its last use).
  ProducerTable table;
  std::unordered_map<std::uint64_t, std::uint64_t> model;
  for (std::uint64_t id = 0; id < 50000; ++id) {
    table.insert(TensorId(id), StreamId(id % 3));
    model[id] = id % 3;
    if (id >= 300) {
      table.erase(TensorId(id - 300));
      model.erase(id - 300);
    }
  }
  expect_same(table, model, 50000);
  for (std::uint64_t id = 0; id < 50000; ++id) table.erase(TensorId(id));
  EXPECT_EQ(table.size(), 0u);
  EXPECT_FALSE(table.find(TensorId(49999)).has_value());
}

TEST(ProducerTable, ConcurrentWritersKeepEveryEntry) {
  ProducerTable table;
  constexpr int kThreads = 4;
  constexpr std::uint64_t kPerThread = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&table, t] {
      // Interleaved ids: every thread writes into every shard.
      for (std::uint64_t i = 0; i < kPerThread; ++i) {
        const std::uint64_t id = i * kThreads + static_cast<std::uint64_t>(t);
        table.insert(TensorId(id), StreamId(static_cast<std::uint64_t>(t)));
        if (i % 2 == 1) table.erase(TensorId(id - kThreads));  // drop the previous (even) one
      }
    });
  }
  for (std::thread& th : threads) th.join();
  std::unordered_map<std::uint64_t, std::uint64_t> model;
  for (int t = 0; t < kThreads; ++t)
    for (std::uint64_t i = 1; i < kPerThread; i += 2)
      model[i * kThreads + static_cast<std::uint64_t>(t)] = static_cast<std::uint64_t>(t);
  expect_same(table, model, kPerThread * kThreads);
}

}  // namespace
}  // namespace kiln::runtime
