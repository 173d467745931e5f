// ProducerTable: which stream registered the operation that produces a tensor, for the
// cross-stream rule of Device::register_op (an input pending on another stream drains it first).
//
// On the op path every registration does a find per input, an insert per output and an erase per
// consumed input. tbb::concurrent_hash_map allocated and freed a node for each insert/erase (two
// malloc-family calls per op); here each of 64 shards is a linear-probing array of plain
// (id, stream) slots under its own mutex, held for a few probes. Deletion shifts the following
// run back (no tombstones), so a table whose tensors come and go never degrades.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <vector>

#include "kiln/fusion/multi_stream.h"
#include "kiln/ir/tensor.h"

namespace kiln::runtime {

class ProducerTable {
 public:
  std::optional<fusion::StreamId> find(ir::TensorId id) const {
    const std::uint64_t key = id.value();
    const Shard& s = shard_of(key);
    std::lock_guard lock(s.mu);
    const std::size_t i = s.index_of(key);
    if (i == kNotFound) return std::nullopt;
    return fusion::StreamId(s.slots[i].stream);
  }

  // Inserts, or overwrites the stream of an id already present.
  void insert(ir::TensorId id, fusion::StreamId stream) {
    const std::uint64_t key = id.value();
    Shard& s = shard_of(key);
    std::lock_guard lock(s.mu);
    s.insert(key, stream.value());
  }

  void erase(ir::TensorId id) {
    const std::uint64_t key = id.value();
    Shard& s = shard_of(key);
    std::lock_guard lock(s.mu);
    s.erase(key);
  }

  // Entries present (a snapshot: shards are counted one after the other).
  std::size_t size() const {
    std::size_t n = 0;
    for (const Shard& s : shards_) {
      std::lock_guard lock(s.mu);
      n += s.used;
    }
    return n;
  }

 private:
  static constexpr std::uint64_t kEmpty = ~std::uint64_t{0};  // never an id: ids count up from 0
  static constexpr std::size_t kNotFound = ~std::size_t{0};
  static constexpr std::size_t kShards = 64;
  static constexpr std::size_t kInitialSlots = 16;

  // Ids are consecutive integers: a multiplicative mix spreads them over shards and slots.
  static std::uint64_t mix(std::uint64_t key) { return key * 0x9E3779B97F4A7C15ull; }

  struct Slot {
    std::uint64_t key = kEmpty;
    std::uint64_t stream = 0;
  };

  struct alignas(64) Shard {
    mutable std::mutex mu;
    std::vector<Slot> slots = std::vector<Slot>(kInitialSlots);  // size: a power of two
    std::size_t used = 0;

    std::size_t mask() const { return slots.size() - 1; }
    // The top bits pick the shard (shard_of), the next ones the home slot.
    std::size_t home(std::uint64_t key) const { return static_cast<std::size_t>(mix(key) >> 20) & mask(); }

    std::size_t index_of(std::uint64_t key) const {
      for (std::size_t i = home(key);; i = (i + 1) & mask()) {
        if (slots[i].key == key) return i;
        if (slots[i].key == kEmpty) return kNotFound;
      }
    }

    void insert(std::uint64_t key, std::uint64_t stream) {
      if (2 * (used + 1) > slots.size()) grow();  // load <= 1/2: short probe runs
      std::size_t i = home(key);
      while (slots[i].key != kEmpty && slots[i].key != key) i = (i + 1) & mask();
      if (slots[i].key == kEmpty) ++used;
      slots[i] = Slot{key, stream};
    }

    void erase(std::uint64_t key) {
      std::size_t hole = index_of(key);
      if (hole == kNotFound) return;
      // Backward shift: move each later entry of the run whose home does not lie cyclically in
      // (hole, j] into the hole, so that every entry stays reachable from its home.
      for (std::size_t j = (hole + 1) & mask(); slots[j].key != kEmpty; j = (j + 1) & mask()) {
        const std::size_t h = home(slots[j].key);
        const bool stays = hole <= j ? (hole < h && h <= j) : (hole < h || h <= j);
        if (stays) continue;
        slots[hole] = slots[j];
        hole = j;
      }
      slots[hole].key = kEmpty;
      --used;
    }

    void grow() {
      std::vector<Slot> old = std::move(slots);
      slots.assign(old.size() * 2, Slot{});
      used = 0;
      for (const Slot& e : old)
        if (e.key != kEmpty) insert(e.key, e.stream);
    }
  };

  const Shard& shard_of(std::uint64_t key) const { return shards_[mix(key) >> (64 - 6)]; }
  Shard& shard_of(std::uint64_t key) { return shards_[mix(key) >> (64 - 6)]; }
  static_assert(kShards == 64, "shard_of takes the top 6 bits");

  std::array<Shard, kShards> shards_;
};

}  // namespace kiln::runtime
