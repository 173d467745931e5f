// ReferenceCpuBackend: a runtime::DeviceBackend that runs every operation with the reference
// executor over a sharded, thread-safe tensor table.
//
// Thread-safety: every method may be called from any thread (runtime/backend.h).
#pragma once

#include <array>
#include <mutex>

#include "kiln/cpu/memory.h"
#include "kiln/cpu/reference_executor.h"
#include "kiln/cpu/tensor.h"
#include "kiln/ir/handle_container.h"
#include "kiln/runtime/backend.h"

namespace kiln::cpu {

using runtime::DeviceBackend;
using runtime::HostData;
using runtime::MemoryStats;

// The CPU reference backend: every op (fused or not) runs through ReferenceExecutor, one op
// at a time (a fused optimization replays the operations it covers). The tensor table is sharded
// by id; each shard is a mutex-protected HandleContainer<CpuTensor>, locked only to copy handles
// in and results out: kernels run outside every lock, so streams execute in parallel.
class ReferenceCpuBackend final : public DeviceBackend {
 public:
  // Shards of the tensor table: a power of two several times the pool's thread count (16 on the
  // largest CI machine), so two streams touching the table at the same instant rarely hit the
  // same shard lock; 64 mutexes padded to a cache line each cost 4 KiB.
  static constexpr std::size_t kShards = 64;

  explicit ReferenceCpuBackend(CpuAllocatorOptions alloc_options = {});
  ~ReferenceCpuBackend() override;

  std::string_view name() const override { return "cpu-reference"; }
  std::unique_ptr<fusion::Executor> make_executor() override;
  fusion::FuserList fusers(const fusion::FusionLog& log) const override;
  Status upload(ir::TensorId id, ir::DType dtype, ir::Shape shape, std::span<const std::byte> bytes) override;
  Result<HostData> download(const ir::TensorIr& t) override;
  bool is_materialized(ir::TensorId id) const override;
  std::optional<ir::TensorError> error_of(ir::TensorId id) const override;
  void free(const ir::TensorIr& t) override;
  Status alias(ir::TensorId src, ir::TensorId dst) override;
  MemoryStats memory_stats() const override;

  // Runs one global operation against the shared table (used by this backend's executors).
  // Returns the executor's status (a failure has already been recorded as Errored outputs).
  Status run_operation(const ir::Operation& op, ReferenceExecutor& exec);

  CpuAllocator& allocator() { return allocator_; }

 private:
  using Container = ir::HandleContainer<CpuTensor>;
  // One cache line (or more) per shard so that two shards' mutexes never share a line.
  struct alignas(64) Shard {
    mutable std::mutex mu;
    Container table;  // guarded by mu
  };
  Shard& shard(ir::TensorId id) { return shards_[std::hash<ir::TensorId>{}(id) % kShards]; }
  const Shard& shard(ir::TensorId id) const { return shards_[std::hash<ir::TensorId>{}(id) % kShards]; }

  CpuAllocator allocator_;
  std::array<Shard, kShards> shards_;
};

}  // namespace kiln::cpu
