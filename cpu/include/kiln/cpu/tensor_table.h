// ShardedTensorTable: a CPU device's tensor table shared by every stream, executor and client
// thread: HandleContainer<HostTensor> semantics (docs/spec/ir.md §10–11) behind 64 mutex-protected shards.
//
// Backends copy entries out to a stream-private container before running kernels and publish
// results after, so a shard lock is held only for a hash-map operation and a shared_ptr copy —
// kernels never run under a lock, and streams execute in parallel.
//
// Thread-safety: every method may be called from any thread.
//
// Usage:
//   ShardedTensorTable table;
//   table.put(id, Entry::existing(tensor));
//   std::optional<Entry> e = table.copy_entry(id);   // a handle sharing the buffer, or the error
//   std::optional<Entry> owned = table.take(id);     // removes it (a consuming use)
#pragma once

#include <array>
#include <mutex>
#include <optional>

#include "kiln/base/function_ref.h"
#include "kiln/base/mutex.h"
#include "kiln/cpu/host.h"
#include "kiln/ir/handle_container.h"
#include "kiln/runtime/backend.h"

namespace kiln::cpu {

class ShardedTensorTable {
 public:
  using Container = ir::HandleContainer<HostTensor>;
  using Entry = Container::Entry;

  // A power of two several times the largest pool's thread count (16 on the largest CI
  // machine), so two streams touching the table at once rarely meet on one shard lock; 64
  // mutexes padded to a cache line each cost 4 KiB.
  static constexpr std::size_t kShards = 64;

  // Inserts or overwrites: Existing(h) for a handle, Errored(e) for an error (a NotInit entry
  // inserts nothing).
  void put(ir::TensorId id, Entry entry);
  void register_handle(ir::TensorId id, HostTensor tensor);
  // A copy of the entry (the handle shares its buffer; the error shares its root); nullopt when
  // absent.
  std::optional<Entry> copy_entry(ir::TensorId id) const;
  // Removes and returns the entry.
  std::optional<Entry> take(ir::TensorId id);

  // DeviceBackend's table operations (runtime/backend.h), shared by the CPU backends.
  Status upload(HostAllocator& allocator, ir::TensorId id, ir::DType dtype, ir::Shape shape,
                std::span<const std::byte> bytes);
  Result<runtime::HostData> download(const ir::TensorIr& t);
  // DeviceBackend::claim_error: `id` becomes Errored; InvalidHandle if it has an entry already.
  Status claim_error(ir::TensorId id, const ir::TensorError& error);
  // DeviceBackend::update_in_place on the entry's own buffer; the shard is not locked while
  // `update` runs (it may wait on a collective for seconds).
  Status update_in_place(ir::TensorId id, FunctionRef<Status(std::span<std::byte>)> update);
  bool is_materialized(ir::TensorId id) const;
  std::optional<ir::TensorError> error_of(ir::TensorId id) const;
  void free(const ir::TensorIr& t);
  Status alias(ir::TensorId src, ir::TensorId dst);
  // Entries (any state) and Errored entries, summed over the shards.
  runtime::MemoryStats counts() const;

 private:
  struct alignas(64) Shard {
    mutable Mutex mu;
    Container table KILN_GUARDED_BY(mu);
  };
  Shard& shard(ir::TensorId id) { return shards_[std::hash<ir::TensorId>{}(id) % kShards]; }
  const Shard& shard(ir::TensorId id) const { return shards_[std::hash<ir::TensorId>{}(id) % kShards]; }

  std::array<Shard, kShards> shards_;
};

}  // namespace kiln::cpu
