// ProducerTable: which stream registered the operation that produces a tensor, for the
// cross-stream rule of Device::register_op (an input pending on another stream drains it first).
//
// On the op path every registration does a find per input, an insert per output and an erase per
// consumed input. tbb::concurrent_hash_map allocated and freed a node for each insert/erase (two
// malloc-family calls per op); here each of 64 shards is a FlatIdMap (open addressing, no
// node per entry) under its own lock, held for a few probes: a tbb::spin_mutex, whose release is
// a plain store (a std::mutex pays a second atomic read-modify-write to unlock, 3-4 times per op).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>

#include <oneapi/tbb/spin_mutex.h>
#include <optional>

#include "kiln/base/flat_id_map.h"
#include "kiln/fusion/multi_stream.h"
#include "kiln/ir/tensor.h"

namespace kiln::runtime {

class ProducerTable {
 public:
  std::optional<fusion::StreamId> find(ir::TensorId id) const {
    const Shard& s = shard_of(id);
    std::lock_guard lock(s.mu);
    const std::uint64_t* stream = s.map.find(id);
    if (stream == nullptr) return std::nullopt;
    return fusion::StreamId(*stream);
  }

  // Inserts, or overwrites the stream of an id already present.
  void insert(ir::TensorId id, fusion::StreamId stream) {
    Shard& s = shard_of(id);
    std::lock_guard lock(s.mu);
    s.map[id] = stream.value();
  }

  void erase(ir::TensorId id) {
    Shard& s = shard_of(id);
    std::lock_guard lock(s.mu);
    s.map.erase(id);
  }

  // Entries present (a snapshot: shards are counted one after the other).
  std::size_t size() const {
    std::size_t n = 0;
    for (const Shard& s : shards_) {
      std::lock_guard lock(s.mu);
      n += s.map.size();
    }
    return n;
  }

 private:
  static constexpr std::size_t kShards = 64;

  struct alignas(64) Shard {
    mutable tbb::spin_mutex mu;
    FlatIdMap<ir::TensorId, std::uint64_t> map;  // id -> stream number
  };

  // By the id's block (ir::kTensorIdBlock): a producer's tensors share its block's shard. The
  // top bits of the block's hash pick it (the map inside mixes the id itself).
  static std::size_t shard_index(ir::TensorId id) {
    return static_cast<std::size_t>(ir::tensor_id_block_hash(id) >> (64 - 6));
  }
  const Shard& shard_of(ir::TensorId id) const { return shards_[shard_index(id)]; }
  Shard& shard_of(ir::TensorId id) { return shards_[shard_index(id)]; }
  static_assert(kShards == 64, "shard_index takes the top 6 bits");

  std::array<Shard, kShards> shards_;
};

}  // namespace kiln::runtime
