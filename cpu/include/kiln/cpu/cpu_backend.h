// CpuBackend: the CPU device's runtime::DeviceBackend — the fast fused executor (CpuExecutor)
// for every stream, one shared compiled-kernel cache and task arena (a CpuDevice), and the
// sharded tensor table every stream and client thread shares.
//
// How a stream's call runs: the entries its operations read are staged into a private
// container (a ReadOnly use copies the entry, which shares the buffer; the tensor's last,
// ReadWrite use moves it out of the table, so the executor may reuse its buffer in place), the
// CpuExecutor runs on that container outside every lock, and what the operations produced is
// published back. Only the stream that names a tensor touches it between staging and
// publishing (docs/spec/fusion.md §16.5: a queue never holds another stream's id; cross-stream uses go
// through a drain or a shared view), so staging never races a writer.
//
// Thread-safety: every method may be called from any thread (runtime/backend.h); an executor is
// called by one stream actor at a time.
//
// Usage:
//   auto dev = runtime::Device::create(std::make_unique<cpu::CpuBackend>(cpu::CpuBackendOptions{.threads = 2}));
#pragma once

#include <memory>

#include "kiln/cpu/device.h"
#include "kiln/cpu/tensor_table.h"
#include "kiln/runtime/backend.h"

namespace kiln::cpu {

struct CpuBackendOptions {
  // Worker threads one kernel launch may use (the shared task arena's concurrency); 0 = the
  // cores the process may use (runtime::usable_cores(): affinity mask and cgroup quota).
  // Streams run their launches on the same arena, so two streams busy at once share these
  // workers instead of oversubscribing the cores.
  int threads = 0;
  HostAllocatorOptions allocator{};
  // Seed of the first stream's random generator; stream k uses seed + k.
  std::uint64_t seed = ReferenceExecutor::kDefaultSeed;
  // JIT compilation of fused elementwise programs (CpuJitMode in device.h): a long-lived backend
  // amortises one compile per program structure over many launches, so Auto by default; tests
  // that build many structures set Off.
  CpuJitMode jit = CpuJitMode::Auto;
  std::string jit_cache_dir;  // empty: the default (device.h)
};

class CpuBackend final : public runtime::DeviceBackend {
 public:
  explicit CpuBackend(const CpuBackendOptions& options = {});
  ~CpuBackend() override;

  std::string_view name() const override { return "cpu"; }
  std::unique_ptr<fusion::Executor> make_executor() override;
  fusion::FuserList fusers(const fusion::FusionLog& log, const fusion::FuserOptions& options) const override;
  Status upload(ir::TensorId id, ir::DType dtype, ir::Shape shape, std::span<const std::byte> bytes) override;
  Status claim_error(ir::TensorId id, const ir::TensorError& error) override;
  Status update_in_place(const ir::TensorIr& t, FunctionRef<Status(std::span<std::byte>)> update) override {
    return table_.update_in_place(t.id, update);
  }
  Result<runtime::HostData> download(const ir::TensorIr& t) override;
  bool is_materialized(ir::TensorId id) const override;
  std::optional<ir::TensorError> error_of(ir::TensorId id) const override;
  void free(const ir::TensorIr& t) override;
  Status alias(ir::TensorId src, ir::TensorId dst) override;
  runtime::MemoryStats memory_stats() const override;
  // The allocator's large blocks idle past options.allocator.large_block_retention
  // (HostAllocator::release_idle).
  std::uint64_t release_idle_memory() override;

  // The shared allocator, kernel cache, arena and counters (its own handle container is unused).
  CpuDevice& device() { return device_; }
  CpuDeviceStats stats() const { return device_.stats(); }
  ShardedTensorTable& table() { return table_; }

 private:
  CpuBackendOptions options_;
  CpuDevice device_;
  ShardedTensorTable table_;  // after device_: its buffers go back to the allocator first
  std::atomic<std::uint64_t> next_seed_;
};

}  // namespace kiln::cpu
