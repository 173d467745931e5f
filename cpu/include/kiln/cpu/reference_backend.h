// ReferenceCpuBackend: a runtime::DeviceBackend that runs every operation with the reference
// executor over a sharded, thread-safe tensor table.
//
// Thread-safety: every method may be called from any thread (runtime/backend.h).
#pragma once

#include <atomic>
#include <cstdint>

#include "kiln/cpu/host.h"
#include "kiln/cpu/tensor_table.h"
#include "kiln/ir/handle_container.h"
#include "kiln/runtime/backend.h"

namespace kiln::cpu {

using runtime::DeviceBackend;
using runtime::HostData;
using runtime::MemoryStats;

// The CPU reference backend: every op (fused or not) runs through ReferenceExecutor, one op
// at a time (a fused optimization replays the operations it covers), over the sharded tensor
// table (tensor_table.h): kernels run outside every lock, so streams execute in parallel.
// CpuBackend (cpu_backend.h) is the fast one; this one is the oracle the runtime tests and the
// stress programs check against.
class ReferenceCpuBackend final : public DeviceBackend {
 public:
  explicit ReferenceCpuBackend(HostAllocatorOptions alloc_options = {});
  ~ReferenceCpuBackend() override;

  std::string_view name() const override { return "cpu-reference"; }
  std::unique_ptr<fusion::Executor> make_executor() override;
  fusion::FuserList fusers(const fusion::FusionLog& log, const fusion::FuserOptions& options) const override;
  Status upload(ir::TensorId id, ir::DType dtype, ir::Shape shape, std::span<const std::byte> bytes) override;
  Status claim_error(ir::TensorId id, const ir::TensorError& error) override;
  Status update_in_place(const ir::TensorIr& t, FunctionRef<Status(std::span<std::byte>)> update) override {
    return table_.update_in_place(t.id, update);
  }
  Result<HostData> download(const ir::TensorIr& t) override;
  bool is_materialized(ir::TensorId id) const override;
  std::optional<ir::TensorError> error_of(ir::TensorId id) const override;
  void free(const ir::TensorIr& t) override;
  Status alias(ir::TensorId src, ir::TensorId dst) override;
  MemoryStats memory_stats() const override;
  std::uint64_t release_idle_memory() override;  // HostAllocator::release_idle

  // Runs one global operation against the shared table (used by this backend's executors).
  // Returns the executor's status (a failure has already been recorded as Errored outputs).
  Status run_operation(const ir::Operation& op, ReferenceExecutor& exec);

  HostAllocator& allocator() { return allocator_; }

 private:
  HostAllocator allocator_;
  ShardedTensorTable table_;  // after allocator_: its buffers go back to it first
  // The next stream's random seed: kDefaultSeed + k for the k-th executor made, as CpuBackend
  // seeds its streams (two streams' draws differ; a fresh device replays the same values).
  std::atomic<std::uint64_t> next_seed_{ReferenceExecutor::kDefaultSeed};
};

}  // namespace kiln::cpu
